"""Lesson 02: exact moments of k1, k2, k3 against independent computations, the reproduced table,
the three panels (defaults and extreme controls), and the exercise checks."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.distributions import Categorical, Normal

import klviz
from klviz.check import lesson02 as chk
from klviz.statistics import mean_std_with_se
from klviz.tables import (
    categorical_moments,
    control_variate_samples,
    exact_moments,
    gaussian_closed_forms,
    gaussian_moments,
    k1_negative_probability,
    monte_carlo_row,
    sample_log_ratio,
    schulman_table,
    table_html,
    variance_crossing_mu,
)
from klviz.widgets.lesson02 import ControlVariatePanel, GaussianEstimatorsPanel, TokenEstimatorsPanel


def normal(mu, sigma=1.0):
    return Normal(torch.tensor(float(mu), dtype=torch.float64), torch.tensor(float(sigma), dtype=torch.float64))


# ------------------------------------------------------------------ exact moments, independently


def _quadrature_moments(mq, sq, mp, sp, order=200):
    """Moments of k1, k2, k3 and r by Gauss-Hermite quadrature in x = mq + sq z (an independent route)."""
    z, w = np.polynomial.hermite_e.hermegauss(order)
    w = w / w.sum()
    x = mq + sq * z
    log_r = (-0.5 * ((x - mp) / sp) ** 2 - math.log(sp)) - (-0.5 * ((x - mq) / sq) ** 2 - math.log(sq))
    vals = {"k1": -log_r, "k2": 0.5 * log_r**2, "k3": np.expm1(log_r) - log_r}
    out = {}
    for name, v in vals.items():
        m = float(w @ v)
        out[name] = (m, float(w @ (v - m) ** 2))
    r = np.exp(log_r)
    out["var_r"] = float(w @ (r - 1) ** 2)
    out["cov_k1_r"] = float(w @ ((-log_r - out["k1"][0]) * (r - 1)))
    return out


@pytest.mark.parametrize(
    "pair",
    [
        (0.0, 1.0, 0.1, 1.0),
        (0.0, 1.0, 1.0, 1.0),
        (0.3, 1.2, -0.5, 0.9),
        (0.0, 1.0, 0.5, 0.5),
        (-1.0, 2.0, 0.5, 2.5),
        (0.0, 1.0, 0.7, 1.3),
    ],
)
def test_gaussian_moments_match_quadrature(pair):
    exact = gaussian_moments(*pair)
    quad = _quadrature_moments(*pair)
    for name in ("k1", "k2", "k3"):
        assert exact.mean[name] == pytest.approx(quad[name][0], rel=1e-9, abs=1e-12)
        assert exact.var[name] == pytest.approx(quad[name][1], rel=1e-7, abs=1e-12)
    assert exact.var_r == pytest.approx(quad["var_r"], rel=1e-7)
    assert exact.cov_k1_r == pytest.approx(quad["cov_k1_r"], rel=1e-7)
    assert exact.true_kl == pytest.approx(float(klviz.gaussian_kl(pair[0], pair[1], pair[2], pair[3])), rel=1e-6)


@pytest.mark.parametrize("mu", [0.05, 0.1, 0.5, 1.0, 1.7, 2.5])
def test_reference_closed_forms_equal_the_general_moments(mu):
    closed, general = gaussian_closed_forms(mu), gaussian_moments(0.0, 1.0, mu, 1.0)
    assert closed["true_kl"] == pytest.approx(mu**2 / 2)
    for name in ("k1", "k2", "k3"):
        assert closed[f"var_{name}"] == pytest.approx(general.var[name], rel=1e-9)
        assert closed[f"mean_{name}"] == pytest.approx(general.mean[name], rel=1e-12)
        assert closed[f"std_rel_{name}"] == pytest.approx(general.std_rel(name), rel=1e-9)
    assert closed["bias_rel_k2"] == pytest.approx(general.bias_rel("k2"), rel=1e-9)
    assert closed["lambda_star"] == pytest.approx(general.lambda_star, rel=1e-9)


def test_reference_numbers():
    # REFERENCE section 2: std/true 1.4177 / 1.7321 (k2), 1.4166 / 1.6950 (k3); lambda* 0.995 / 0.582
    a, b = gaussian_closed_forms(0.1), gaussian_closed_forms(1.0)
    assert round(a["std_rel_k2"], 4) == 1.4177 and round(b["std_rel_k2"], 4) == 1.7321
    assert round(a["std_rel_k3"], 4) == 1.4166 and round(b["std_rel_k3"], 4) == 1.6950
    assert round(a["lambda_star"], 3) == 0.995 and round(b["lambda_star"], 3) == 0.582
    assert a["bias_rel_k2"] == pytest.approx(0.0025, rel=1e-12)
    assert a["std_rel_k1"] == pytest.approx(20.0) and b["std_rel_k1"] == pytest.approx(2.0)


def test_var_k3_is_infinite_when_p_is_too_wide():
    edge = gaussian_moments(0.0, 1.0, 0.3, math.sqrt(2.0))  # sigma_p² = 2 sigma_q²: diverges
    assert math.isinf(edge.var["k3"]) and math.isinf(edge.var_r) and "diverges" in edge.notes["k3"]
    assert math.isfinite(edge.var["k1"]) and math.isfinite(edge.var["k2"])
    inside = gaussian_moments(0.0, 1.0, 0.3, 1.4)
    assert math.isfinite(inside.var["k3"]) and not inside.notes
    assert edge.lambda_star == 0.0
    assert edge.cv_variance(0.0) == pytest.approx(edge.var["k1"]) and math.isinf(edge.cv_variance(0.5))
    assert math.isinf(edge.std_rel("k3"))


def test_categorical_moments_match_brute_force():
    gen = klviz.make_generator(5)
    q = torch.softmax(torch.randn(40, generator=gen, dtype=torch.float64), 0)
    p = torch.softmax(torch.randn(40, generator=gen, dtype=torch.float64), 0)
    exact = categorical_moments(q, p)
    qs, ps = q.tolist(), p.tolist()
    for name, f in (("k1", lambda t: -t), ("k2", lambda t: 0.5 * t * t), ("k3", lambda t: math.expm1(t) - t)):
        vals = [f(math.log(pi / qi)) for qi, pi in zip(qs, ps)]
        mean = sum(qi * v for qi, v in zip(qs, vals))
        var = sum(qi * (v - mean) ** 2 for qi, v in zip(qs, vals))
        assert exact.mean[name] == pytest.approx(mean, rel=1e-12)
        assert exact.var[name] == pytest.approx(var, rel=1e-10)
    kl_qp = sum(qi * math.log(qi / pi) for qi, pi in zip(qs, ps))
    kl_pq = sum(pi * math.log(pi / qi) for qi, pi in zip(qs, ps))
    assert exact.true_kl == pytest.approx(kl_qp, rel=1e-12)
    assert exact.cov_k1_r == pytest.approx(-(kl_qp + kl_pq), rel=1e-10)  # Cov(log r, r) = Jeffreys
    assert exact.var_r == pytest.approx(sum(pi * pi / qi for qi, pi in zip(qs, ps)) - 1, rel=1e-10)


def test_k3_is_biased_when_p_has_mass_outside_q():
    q = torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64)
    p = torch.tensor([0.4, 0.4, 0.2], dtype=torch.float64)
    exact = categorical_moments(q, p)
    assert exact.bias("k1") == pytest.approx(0.0, abs=1e-15)
    assert exact.bias("k3") == pytest.approx(-0.2, rel=1e-12)  # E_q[r] = 0.8, not 1


def test_lambda_star_minimises_the_variance():
    for m in (
        gaussian_moments(0.0, 1.0, 0.8, 1.1),
        categorical_moments(torch.tensor([0.6, 0.3, 0.1]), torch.tensor([0.2, 0.3, 0.5])),
    ):
        grid = np.linspace(-1, 2, 3001)
        v = m.cv_variance(grid)
        assert grid[np.argmin(v)] == pytest.approx(m.lambda_star, abs=1e-3)
        assert m.cv_variance(1.0) == pytest.approx(m.var["k3"], rel=1e-6)
        assert m.cv_variance(0.0) == pytest.approx(m.var["k1"], rel=1e-12)


def test_exact_moments_dispatch():
    assert exact_moments(normal(0), normal(1)).true_kl == pytest.approx(0.5)
    with pytest.raises(ValueError, match="q is a Normal"):
        exact_moments(normal(0), Categorical(probs=torch.tensor([0.5, 0.5])))


# ------------------------------------------------------------------ Monte Carlo against exact


def test_monte_carlo_row_within_four_standard_errors():
    gen = klviz.make_generator(11)
    for q, p in (
        (normal(0.0), normal(0.6)),
        (normal(0.2, 1.1), normal(-0.3, 0.9)),
        (
            Categorical(probs=torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)),
            Categorical(probs=torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)),
        ),
    ):
        row = monte_carlo_row(q, p, 200_000, num_batches=20, generator=gen)
        exact = exact_moments(q, p)
        for name in ("k1", "k2", "k3"):
            m = row[name]
            assert abs(m["mean"] - exact.mean[name]) < 4 * m["se"]
            assert abs(m["std"] - exact.std(name)) < 4 * m["se_std"]
            assert m["bias_rel"] == pytest.approx((m["mean"] - exact.true_kl) / exact.true_kl)


def test_schulman_table_rows_and_html():
    rows = schulman_table(mus=(0.1, 1.0), num_samples=100_000, num_batches=10, generator=klviz.make_generator(0))
    assert [r["mu"] for r in rows] == [0.1, 1.0]
    assert rows[0]["published"]["k2"] == (0.002, 1.42)
    text = table_html(rows)
    assert text.count("<tr>") == 2 + 6 and "1.4166" in text and "0.0025" in text and "-0.0000" not in text
    for row in rows:
        for name in ("k1", "k2", "k3"):
            m = row["mc"][name]
            assert abs(m["std_rel"] - row["exact"].std_rel(name)) < 4 * m["se_std_rel"]


def test_control_variate_samples():
    m = control_variate_samples(normal(0.0), normal(0.7), 400_000, generator=klviz.make_generator(4))
    exact = gaussian_closed_forms(0.7)
    assert abs(m["lambda_star"] - exact["lambda_star"]) < 4 * m["se"]
    assert m["var_k1"] == pytest.approx(exact["var_k1"], rel=0.02)
    assert m["cov_k1_r"] == pytest.approx(exact["cov_k1_r"], rel=0.05)


def test_sample_log_ratio_equals_log_prob_difference():
    q, p = normal(0.3, 1.2), normal(-0.5, 0.8)
    lr = sample_log_ratio(q, p, 1000, generator=klviz.make_generator(0))
    z = torch.randn(1000, generator=klviz.make_generator(0), dtype=torch.float64)
    x = 0.3 + 1.2 * z
    torch.testing.assert_close(lr, p.log_prob(x) - q.log_prob(x), rtol=1e-12, atol=1e-12)
    # the standard normal draws can be given (the Gaussian panel keeps those of its seed): the same numbers
    assert torch.equal(sample_log_ratio(q, p, 1000, z=z), lr)
    with pytest.raises(ValueError, match="float64 tensor of 10 values"):
        sample_log_ratio(q, p, 10, z=z)


def test_gaussian_panel_keeps_its_draws_and_matches_a_fresh_sample():
    panel = GaussianEstimatorsPanel(device="cpu")
    first = panel.set(mu=0.5, num_samples=1_000)
    z = panel._kept_z[1]
    again = panel.set(mu=0.7)  # p moved: the kept draws are reused
    assert panel._kept_z[1] is z
    fresh = GaussianEstimatorsPanel(device="cpu").set(mu=0.7, num_samples=1_000)
    assert again["mc"]["k3"] == fresh["mc"]["k3"] and first["mc"]["k1"] != again["mc"]["k1"]
    panel.set(seed=1)  # a new seed draws again
    assert panel._kept_z[1] is not z


@pytest.mark.parametrize(
    "pair",
    [
        (0.0, 1.0, 0.1, 1.0),
        (0.0, 1.0, -2.0, 1.0),
        (0.0, 1.0, 0.3, 0.7),
        (0.0, 1.0, 0.5, 2.0),
        (0.0, 1.0, 0.0, 1.0),
        (0.0, 1.0, 0.0, 3.0),
    ],
)
def test_k1_negative_probability_against_samples(pair):
    exact = k1_negative_probability(*pair)
    lr = sample_log_ratio(
        normal(pair[0], pair[1]), normal(pair[2], pair[3]), 200_000, generator=klviz.make_generator(1)
    )
    frac = float((lr > 0).double().mean())
    se = math.sqrt(max(exact * (1 - exact), 1e-12) / 200_000)
    assert abs(frac - exact) < 4 * se + 1e-12


def test_k1_negative_probability_equal_scales_formula():
    mu = 0.1
    expected = 0.5 * math.erfc(mu / 2 / math.sqrt(2))
    assert k1_negative_probability(0.0, 1.0, mu, 1.0) == pytest.approx(expected, rel=1e-14)


def test_variance_crossing():
    mu = variance_crossing_mu()
    assert math.expm1(mu**2) - mu**2 == pytest.approx(mu**2, rel=1e-13)
    assert round(mu, 4) == 1.1209
    below, above = gaussian_closed_forms(mu - 1e-3), gaussian_closed_forms(mu + 1e-3)
    assert below["var_k3"] < below["var_k1"] and above["var_k3"] > above["var_k1"]


def test_mean_std_with_se_for_normal_samples():
    x = torch.randn(400_000, generator=klviz.make_generator(2), dtype=torch.float64) * 3.0 + 1.0
    s = mean_std_with_se(x)
    assert s["se"] == pytest.approx(3.0 / math.sqrt(400_000), rel=0.01)
    assert s["se_std"] == pytest.approx(3.0 / math.sqrt(2 * 400_000), rel=0.05)  # sigma / sqrt(2n) for a normal
    assert abs(s["std"] - 3.0) < 4 * s["se_std"]


# ------------------------------------------------------------------ bad input


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: gaussian_moments(0.0, 0.0, 1.0, 1.0), "sigma_q"),
        (lambda: gaussian_moments(0.0, 1.0, 1.0, -1.0), "sigma_p"),
        (lambda: gaussian_moments(float("nan"), 1.0, 1.0, 1.0), "mu_q"),
        (lambda: gaussian_moments(0.0, 1.0, float("inf"), 1.0), "mu_p"),
        (lambda: gaussian_closed_forms(float("nan")), "mu"),
        (lambda: gaussian_closed_forms(30.0), "mu"),
        (lambda: categorical_moments(torch.tensor([0.5, 0.5]), torch.tensor([1.0, 0.0])), "p_probs"),
        (lambda: categorical_moments(torch.tensor([0.5, 0.6]), torch.tensor([0.5, 0.5])), "q_probs"),
        (lambda: categorical_moments(torch.tensor([1, 0]), torch.tensor([0.5, 0.5])), "q_probs"),
        (lambda: monte_carlo_row(normal(0), normal(1), 1000, num_batches=1), "num_batches"),
        (lambda: monte_carlo_row(normal(0), normal(1), 10, num_batches=20), "num_samples"),
        (lambda: monte_carlo_row(normal(0), normal(1), 0), "num_samples"),
        (lambda: monte_carlo_row("q", normal(1), 100), "q"),
        (lambda: schulman_table(mus=(0.0,), num_samples=100), "mus"),
        (lambda: gaussian_moments(0.0, 1.0, 1.0, 1.0).cv_variance(float("nan")), "lam"),
        (lambda: mean_std_with_se(torch.tensor([1.0])), "values"),
        (lambda: sample_log_ratio(Categorical(probs=torch.tensor([0.5, 0.5])), normal(0), 10), "q"),
        (lambda: sample_log_ratio(normal(0), normal(1), -3), "num_samples"),
        (lambda: control_variate_samples(normal(0), normal(1), 10, num_batches=20), "num_batches"),
        (lambda: k1_negative_probability(0.0, -1.0, 0.0, 1.0), "sigma_q"),
    ],
)
def test_bad_input_raises_value_error_naming_the_argument(call, name):
    with pytest.raises(ValueError, match=name):
        call()


# ------------------------------------------------------------------ panels


def _skip_rasterising(panel, monkeypatch):
    """Extreme settings go through panel.set (compute, draw, readout) without rendering a PNG each time:
    rasterising is matplotlib's job and costs most of a second on a busy 2-core machine."""
    monkeypatch.setattr(panel, "_redraw", lambda: None)


def _finite_numbers(data):
    for key in ("frac_neg_mc", "frac_neg_exact"):
        if key in data:
            assert 0.0 <= data[key] <= 1.0
    for stats in data.get("mc", {}).values():
        assert all(math.isfinite(v) for v in stats.values())


def test_gaussian_panel_defaults_and_extremes(monkeypatch):
    panel = GaussianEstimatorsPanel()
    _skip_rasterising(panel, monkeypatch)
    assert panel.last_error is None and "k3" in panel.readout.value
    stairs = dict(panel.hist)
    n_artists = [len(ax.get_children()) for ax in panel.fig.axes]
    before = panel.readout.value
    panel.set(mu=0.1)
    assert panel.readout.value != before
    for values in (
        dict(mu=-3.0, sigma=0.3, num_samples=1_000),
        dict(mu=3.0, sigma=3.0, num_samples=1_000_000),
        dict(mu=3.0, sigma=0.3, num_samples=1_000, seed=2**31 - 1),
        dict(mu=0.05, sigma=1.45),
    ):
        data = panel.set(**values)
        assert panel.last_error is None, panel.error.value
        _finite_numbers(data)
        for name in ("k1", "k2", "k3"):
            dens, edges = data["hists"][name]
            assert np.all(np.isfinite(dens)) and np.all(np.diff(edges) > 0)
    # mu = 0.05, sigma = 1.45: Var k3 is infinite and the readout says why, instead of a NaN
    readout = panel.readout.value
    assert "inf" in readout and "diverges" in readout and "nan" not in readout.lower()
    monkeypatch.undo()  # the last update renders the figure for real
    panel.set(mu=0.0, sigma=1.0)
    assert "undefined" in panel.readout.value and "nan" not in panel.readout.value.lower()
    assert panel.last_error is None and panel.png()[:4] == b"\x89PNG"
    # artists are updated in place, never re-created
    assert all(panel.hist[k] is stairs[k] for k in stairs)
    assert [len(ax.get_children()) for ax in panel.fig.axes] == n_artists


def test_gaussian_panel_table_matches_exact_values():
    panel = GaussianEstimatorsPanel()
    data = panel.compute(mu=0.5, sigma=1.0, num_samples=300_000, seed=3)  # the pure function behind set()
    exact = gaussian_moments(0.0, 1.0, 0.5, 1.0)
    for name in ("k1", "k2", "k3"):
        m = data["mc"][name]
        assert abs(m["mean"] - exact.mean[name]) < 4 * m["se"]
        assert abs(m["std"] - exact.std(name)) < 4 * m["se_std"]
    assert data["exact"].true_kl == pytest.approx(0.125)


def test_token_panel_defaults_and_extremes(monkeypatch):
    panel = TokenEstimatorsPanel()
    _skip_rasterising(panel, monkeypatch)
    assert panel.last_error is None
    before = panel.readout.value
    panel.set(push=-2.0)
    assert panel.readout.value != before
    for values in (
        dict(temperature=0.25, push=6.0, push_token=11),
        dict(temperature=4.0, push=-6.0, push_token=0),
        dict(temperature=1.0, push=0.0, num_samples=1_000_000, seed=7),
    ):
        data = panel.set(**values)
        assert panel.last_error is None, panel.error.value
        _finite_numbers(data)
        exact = data["exact"]
        assert exact.true_kl == pytest.approx(data["exact_kl_check"], rel=1e-9, abs=1e-15)
        assert abs(exact.bias("k3")) < 1e-9 and abs(exact.bias("k1")) < 1e-9
    monkeypatch.undo()
    panel.set(push_token=3)
    assert panel.last_error is None and "nan" not in panel.readout.value.lower()


def test_control_variate_panel_defaults_and_extremes(monkeypatch):
    panel = ControlVariatePanel()
    _skip_rasterising(panel, monkeypatch)
    assert panel.last_error is None
    data = panel.compute(mu=1.0, sigma=1.0, num_samples=300_000, seed=0)
    assert data["exact"].lambda_star == pytest.approx(gaussian_closed_forms(1.0)["lambda_star"])
    assert abs(data["lambda_mc"] - data["exact"].lambda_star) < 0.05
    assert data["frac_neg"][np.argmin(np.abs(np.linspace(-0.5, 1.5, 41) - 1.0))] == 0.0  # lambda = 1 never negative
    before = panel.readout.value
    for values in (
        dict(mu=-3.0, sigma=0.3, num_samples=1_000),
        dict(mu=3.0, sigma=3.0, num_samples=1_000_000),
        dict(mu=0.0, sigma=1.0, num_samples=1_000),
    ):
        data = panel.set(**values)
        assert panel.last_error is None, panel.error.value
        assert np.all(np.isfinite(data["mc_var"])) and np.all((data["frac_neg"] >= 0) & (data["frac_neg"] <= 1))
    monkeypatch.undo()
    panel.set(mu=0.5, sigma=1.5, num_samples=100_000)
    assert panel.last_error is None and panel.readout.value != before
    assert "inf" in panel.readout.value and "nan" not in panel.readout.value.lower()


# ------------------------------------------------------------------ exercise checks


def test_k3_check():
    assert chk.k3_estimator(lambda lr: torch.expm1(lr) - lr)
    assert chk.k3_estimator(klviz.k3)
    assert not chk.k3_estimator(lambda lr: ...).attempted
    assert "inverted the ratio" in chk.k3_estimator(lambda lr: torch.expm1(-lr) + lr).message
    assert "loses its digits" in chk.k3_estimator(lambda lr: torch.exp(lr) - 1 - lr).message
    assert "That is k1" in chk.k3_estimator(lambda lr: -lr).message
    assert "That is k2" in chk.k3_estimator(lambda lr: 0.5 * lr**2).message
    assert "Sign of the log term" in chk.k3_estimator(lambda lr: torch.expm1(lr) + lr).message
    assert "shape" in chk.k3_estimator(lambda lr: lr.sum()).message
    assert "raised ZeroDivisionError" in chk.k3_estimator(lambda lr: 1 / 0).message


def test_direction_check():
    assert chk.k3_direction(lambda lp, ref: torch.expm1(ref - lp) - (ref - lp))
    assert chk.k3_direction(lambda lp, ref: klviz.kl_penalty(lp, ref, "low_var_kl"))
    assert not chk.k3_direction(lambda lp, ref: ...).attempted
    assert "Ratio inverted" in chk.k3_direction(lambda lp, ref: torch.expm1(lp - ref) - (lp - ref)).message
    assert "that is k1" in chk.k3_direction(lambda lp, ref: lp - ref).message
    assert "averages to" in chk.k3_direction(lambda lp, ref: 0.5 * (lp - ref) ** 2).message


def test_best_lambda_check():
    assert chk.best_lambda(lambda mu: mu**2 / math.expm1(mu**2))
    assert chk.best_lambda(lambda mu: torch.tensor(mu**2 / math.expm1(mu**2)))
    assert not chk.best_lambda(lambda mu: ...).attempted
    assert "lambda = 1 is k3" in chk.best_lambda(lambda mu: 1.0).message
    assert "dropped the - 1" in chk.best_lambda(lambda mu: mu**2 / math.exp(mu**2)).message
    assert "Upside down" in chk.best_lambda(lambda mu: math.expm1(mu**2) / mu**2).message
    assert "Use mu²" in chk.best_lambda(lambda mu: mu / math.expm1(mu)).message
    assert "Sign" in chk.best_lambda(lambda mu: -(mu**2) / math.expm1(mu**2)).message
    assert "finite" in chk.best_lambda(lambda mu: float("nan")).message


def test_crossing_check():
    assert chk.variance_crossing(variance_crossing_mu())
    assert chk.variance_crossing(1.1209)
    assert not chk.variance_crossing(...).attempted
    assert "square root" in chk.variance_crossing(variance_crossing_mu() ** 2).message
    assert "Var k2" in chk.variance_crossing(math.sqrt(math.sqrt(5) - 1)).message
    assert "k3 still has the smaller variance" in chk.variance_crossing(1.0).message
    assert "k1 already wins" in chk.variance_crossing(1.5).message
    assert "should be a number" in chk.variance_crossing("one").message


def test_gaussian_panels_sample_more_on_a_gpu():
    from klviz.devices import panel_sample_count
    from klviz.widgets.lesson02 import _gaussian_controls

    assert panel_sample_count("cpu", cpu=100, cuda=10_000) == 100
    assert panel_sample_count(torch.device("cuda"), cpu=100, cuda=10_000) == 10_000
    with pytest.raises(ValueError, match="cuda"):
        panel_sample_count("cpu", cpu=100, cuda=0)
    cpu = _gaussian_controls(0, torch.device("cpu"))["num_samples"]
    gpu = _gaussian_controls(0, torch.device("cuda"))["num_samples"]
    assert cpu.value == 100_000 and max(cpu.options) == 1_000_000
    assert gpu.value == 1_000_000 and max(gpu.options) == 10_000_000
    for cls in (GaussianEstimatorsPanel, ControlVariatePanel):
        panel = cls(device="cpu")
        assert panel.device.type == "cpu" and panel.values()["num_samples"] == 100_000
        assert panel.last_error is None


@pytest.mark.parametrize("chunk", [1_000, 65_536, 200_000])
def test_paired_moments_in_chunks_equal_the_whole_sample(chunk):
    """The control-variate panel's moments, taken a chunk at a time, are sample_moments of the whole."""
    from klviz.statistics import PairedMoments, sample_moments

    z = torch.randn(200_000, generator=klviz.make_generator(5), dtype=torch.float64)
    a, c = 3.0 + 0.1 * z, torch.expm1(0.8 * z)  # a mean far from 0 next to its spread; c heavy-tailed
    acc = PairedMoments()
    for start in range(0, z.numel(), chunk):
        acc.add(a[start : start + chunk], c[start : start + chunk])
    got, want = acc.result(), sample_moments(a, c)
    for key in ("var_a", "var_c", "cov"):
        assert got[key] == pytest.approx(want[key], rel=1e-10), key
    with pytest.raises(ValueError, match="no values"):
        PairedMoments().result()


@pytest.mark.parametrize("chunk", [1_000, 65_536, 1 << 17, 400_000])
def test_streamed_mean_std_matches_the_whole_sample(chunk):
    """The Gaussian panel's statistics taken a chunk at a time equal those of the whole sample."""
    from klviz.statistics import StreamedMeanStd, mean_std_with_se

    z = torch.randn(300_000, generator=klviz.make_generator(6), dtype=torch.float64)
    for values in (3.0 + 0.1 * z, torch.expm1(1.2 * z), klviz.k3(0.9 * z - 0.405)):  # offset, heavy tail, k3
        acc = StreamedMeanStd()
        for part in values.split(chunk):
            acc.add(part)
        got, want = acc.result(), mean_std_with_se(values)
        assert got["n"] == want["n"]
        for key in ("mean", "se", "std", "se_std"):
            assert got[key] == pytest.approx(want[key], rel=1e-9), key
    with pytest.raises(ValueError, match="at least 2"):
        StreamedMeanStd().result()
