"""Lesson 03 (f-divergences and Bregman): klviz.fdiv, the BregmanPanel and the exercise checks."""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("agg")

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import klviz
from klviz.check import lesson03 as check
from klviz.fdiv import (
    GENERATORS,
    bregman_gap,
    expected_ratio,
    f_divergence,
    f_prime,
    f_second,
    f_value,
    generator,
    tangent_at_one,
)
from klviz.widgets.lesson03 import F_CHOICES, BregmanPanel

F64 = torch.float64


def _pair(seed: int, vocab: int = 20) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    q = torch.softmax(torch.randn(vocab, generator=gen, dtype=F64), -1)
    p = torch.softmax(torch.randn(vocab, generator=gen, dtype=F64) * 1.5, -1)
    return q, p


# -- generators: values and derivatives against autograd ---------------------------------------------


@pytest.mark.parametrize("name", list(GENERATORS))
def test_generator_derivatives_match_autograd(name):
    g = GENERATORS[name]
    t = torch.linspace(0.05, 12.0, 200, dtype=F64, requires_grad=True)
    f = g.f(torch.log(t))
    (d1,) = torch.autograd.grad(f.sum(), t, create_graph=True)
    (d2,) = torch.autograd.grad(d1.sum(), t)
    lt = torch.log(t.detach())
    assert torch.allclose(d1, f_prime(name, lt), rtol=1e-9, atol=1e-12)
    assert torch.allclose(d2, f_second(name, lt), rtol=1e-9, atol=1e-12)
    one = torch.zeros((), dtype=F64)
    assert float(f_value(name, one)) == pytest.approx(0.0, abs=1e-15)  # f(1) = 0
    assert float(f_prime(name, one)) == pytest.approx(g.df1, abs=1e-15)  # df1 is f'(1)
    assert g.convex == bool((f_second(name, torch.linspace(-8, 8, 801, dtype=F64)) >= 0).all())


def test_generator_closed_forms():
    t = torch.tensor([0.1, 0.5, 2.0, 7.0], dtype=F64)
    lt = torch.log(t)
    assert torch.allclose(f_value("-log t", lt), -torch.log(t))
    assert torch.allclose(f_value("t log t", lt), t * torch.log(t))
    assert torch.allclose(f_value("k2", lt), 0.5 * torch.log(t) ** 2)
    assert torch.allclose(f_value("chi2", lt), (t - 1) ** 2)
    assert torch.allclose(f_value("hellinger", lt), (t.sqrt() - 1) ** 2)
    assert torch.allclose(f_second("k2", lt), (1 - torch.log(t)) / t**2)
    # k2's curvature: negative exactly beyond e
    assert float(f_second("k2", torch.tensor(1.0, dtype=F64))) == pytest.approx(0.0, abs=1e-15)
    assert torch.allclose(tangent_at_one("-log t", lt), -(t - 1))
    assert torch.allclose(tangent_at_one("t log t", lt), t - 1)


def test_generator_lookup_and_bad_names():
    assert generator("k2") is GENERATORS["k2"]
    assert generator(GENERATORS["chi2"]) is GENERATORS["chi2"]
    assert "KL(p‖q)" in repr(GENERATORS["t log t"])
    with pytest.raises(ValueError, match="f must be one of"):
        generator("log t")
    with pytest.raises(ValueError, match="log_t"):
        f_value("k2", torch.tensor([float("nan")]))
    with pytest.raises(ValueError, match="log_r"):
        bregman_gap("k2", torch.tensor([1, 2]))  # integer tensor: token ids, not log-ratios


# -- the Bregman construction -----------------------------------------------------------------------


def test_bregman_gap_is_k3_and_the_other_direction():
    lr = torch.linspace(-20, 20, 401, dtype=F64)
    assert torch.allclose(bregman_gap("-log t", lr), klviz.k3(lr), rtol=1e-12, atol=1e-15)
    r = lr.exp()
    assert torch.allclose(bregman_gap("t log t", lr), r * lr - (r - 1), rtol=1e-12, atol=1e-12)
    assert torch.allclose(bregman_gap("k2", lr), klviz.k2(lr))


@settings(max_examples=200, deadline=None)
@given(
    st.floats(min_value=-30, max_value=30, allow_nan=False),
    st.sampled_from(["-log t", "t log t", "chi2", "hellinger", "k2"]),
)
def test_bregman_gap_never_negative(log_r, name):
    # non-negative for every convex generator (and for k2, whose tangent at 1 is flat)
    assert float(bregman_gap(name, torch.tensor(log_r, dtype=F64))) >= 0.0


def test_bregman_gap_is_accurate_for_tiny_log_ratios():
    # the gap is ~ ½ f''(1) (log r)^2 = ½ (log r)^2 for KL's generators: no catastrophic cancellation
    for name in ("-log t", "t log t"):
        v = float(bregman_gap(name, torch.tensor(1e-6, dtype=F64)))
        assert v == pytest.approx(0.5e-12, rel=1e-3)
        v32 = float(bregman_gap(name, torch.tensor(1e-3, dtype=torch.float32)))
        assert v32 == pytest.approx(0.5e-6, rel=2e-2)


def test_bregman_mean_equals_the_f_divergence_by_enumeration():
    q, p = _pair(0)
    lr = torch.log(p) - torch.log(q)
    for name in GENERATORS:
        assert float((q * bregman_gap(name, lr)).sum()) == pytest.approx(float(f_divergence(name, q, p)), abs=1e-12)


def test_estimator_of_kl_pq_on_gaussian_samples_is_unbiased():
    gq, gp = torch.distributions.Normal(0.0, 1.0), torch.distributions.Normal(0.5, 0.8)
    x = torch.randn(200_000, generator=torch.Generator().manual_seed(3), dtype=F64)
    v = bregman_gap("t log t", gp.log_prob(x) - gq.log_prob(x))
    se = float(v.std() / math.sqrt(v.numel()))
    assert abs(float(v.mean()) - float(klviz.gaussian_kl(0.5, 0.8, 0.0, 1.0))) < 4 * se


# -- f_divergence and expected_ratio -----------------------------------------------------------------


def test_f_divergence_gives_both_kls_chi2_and_hellinger():
    q, p = _pair(1)
    assert float(f_divergence("-log t", q, p)) == pytest.approx(float(klviz.categorical_kl(q, p)), abs=1e-12)
    assert float(f_divergence("t log t", q, p)) == pytest.approx(float(klviz.categorical_kl(p, q)), abs=1e-12)
    assert float(f_divergence("chi2", q, p)) == pytest.approx(float(((p - q) ** 2 / q).sum()), abs=1e-12)
    assert float(f_divergence("hellinger", q, p)) == pytest.approx(float(((p.sqrt() - q.sqrt()) ** 2).sum()), abs=1e-12)
    assert float(f_divergence("k2", q, p)) == pytest.approx(float((q * 0.5 * torch.log(p / q) ** 2).sum()), abs=1e-12)
    # batched along dim
    qs, ps = torch.stack([q, p]), torch.stack([p, q])
    assert torch.allclose(f_divergence("-log t", qs, ps), klviz.categorical_kl(qs, ps))
    assert torch.allclose(f_divergence("-log t", qs.T, ps.T, dim=0), klviz.categorical_kl(qs, ps))


def test_f_divergence_zero_probabilities():
    q = torch.tensor([0.2, 0.3, 0.5], dtype=F64)
    p = torch.tensor([0.5, 0.0, 0.5], dtype=F64)
    assert math.isinf(float(f_divergence("-log t", q, p)))  # KL(q||p): q samples what p never does
    assert float(f_divergence("t log t", q, p)) == pytest.approx(float(klviz.categorical_kl(p, q)))
    assert math.isinf(float(f_divergence("t log t", p, q)))  # KL(q||p) seen from the other side
    assert float(f_divergence("-log t", p, q)) == pytest.approx(float(klviz.categorical_kl(p, q)))
    # Hellinger is symmetric even with zeros: the unseen mass counts via lim f(t)/t = 1
    assert float(f_divergence("hellinger", q, p)) == pytest.approx(float(f_divergence("hellinger", p, q)))
    assert float(expected_ratio(p, q)) == pytest.approx(0.7)  # q's mass on p's support


@pytest.mark.parametrize(
    "q, p, name",
    [
        (torch.tensor([0.5, 0.6]), torch.tensor([0.5, 0.5]), "q_probs"),
        (torch.tensor([0.5, 0.5]), torch.tensor([1.5, -0.5]), "p_probs"),
        (torch.tensor([0.5, 0.5]), torch.tensor([1.0, 0.0, 0.0]), "q_probs|p_probs"),
        (torch.tensor([0.5, float("nan")]), torch.tensor([0.5, 0.5]), "q_probs"),
    ],
)
def test_f_divergence_bad_input(q, p, name):
    with pytest.raises(ValueError, match=name):
        f_divergence("-log t", q, p)


def test_expected_ratio_is_one_and_adding_c_changes_nothing():
    q, p = _pair(2)
    assert float(expected_ratio(q, p)) == pytest.approx(1.0, abs=1e-12)
    lr = torch.log(p) - torch.log(q)
    for c in (-3.0, 0.5, 2.0):
        shifted = float((q * (-lr + c * torch.expm1(lr))).sum())
        assert shifted == pytest.approx(float(klviz.categorical_kl(q, p)), abs=1e-12)


def test_k2_breaks_the_data_processing_inequality_but_kl_does_not():
    q = torch.tensor([0.04, 0.04, 0.92], dtype=F64)
    p = torch.tensor([0.12, 0.40, 0.48], dtype=F64)

    def merge(v):
        return torch.stack([v[0] + v[1], v[2]])

    assert float(f_divergence("k2", merge(q), merge(p))) > float(f_divergence("k2", q, p))
    for name in ("-log t", "t log t", "chi2", "hellinger"):
        assert float(f_divergence(name, merge(q), merge(p))) <= float(f_divergence(name, q, p)) + 1e-15


# -- the panel --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def panel():
    return BregmanPanel("cpu")


def test_panel_default(panel):
    d = panel.set(f="-log t", r=2.5)
    assert panel.last_error is None
    assert d["gap"] == pytest.approx((2.5 - 1) - math.log(2.5), rel=1e-12)
    assert d["gap"] == pytest.approx(d["k3"], rel=1e-12)
    assert d["f_r"] - d["tangent_r"] == pytest.approx(d["gap"], rel=1e-12)
    assert "klviz-gap" in panel.readout.value and "KL(q‖p)" in panel.readout.value


def test_panel_all_generators_and_extreme_r(panel):
    lo, hi = 10 ** panel.controls["r"].min, 10 ** panel.controls["r"].max
    for _, name in F_CHOICES:
        for r in (lo, 0.5, 1.0, math.e, hi):
            # compute + draw (the artists) for every pair; a full rendered update at the extremes
            if r in (lo, hi):
                d = panel.set(f=name, r=r)
                assert panel.last_error is None, (name, r, panel.error.value)
            else:
                d = panel.compute(f=name, r=r)
                panel.draw(d)
            assert d["gap"] >= 0
            for key in ("gap", "f_r", "tangent_r", "curvature"):
                assert math.isfinite(d[key]), (name, r, key)
            assert np.all(np.isfinite(d["curve"])) and np.all(np.isfinite(d["estimator"]))
    d = panel.set(f="k2", r=8.0)
    assert d["curvature"] < 0 and "not an f-divergence" in panel.readout.value
    d = panel.set(f="t log t", r=0.2)
    assert d["gap"] == pytest.approx(0.2 * math.log(0.2) + 0.8, rel=1e-12)
    panel.set(f="-log t", r=2.5)


def test_panel_bad_r_is_shown_not_raised(panel):
    data = panel.compute(f="-log t", r=2.0)
    assert data["gap"] > 0
    with pytest.raises(ValueError, match="r must be"):
        panel.compute(f="-log t", r=0.0)
    with pytest.raises(ValueError, match="f must be one of"):
        panel.compute(f="x log x", r=1.0)


def test_panel_speed_and_png(panel):
    times = []
    for r in (1.5, 2.0, 3.0):
        panel.set(r=r)
        times.append(panel.last_compute_ms)
    assert float(np.median(times)) < 500  # generous for a shared machine; measured ~3 ms compute
    assert panel.png()[:8] == b"\x89PNG\r\n\x1a\n"
    panel.set(r=2.5)


# -- exercise checks --------------------------------------------------------------------------------


def test_check_kl_pq_estimator():
    assert check.kl_pq_estimator(lambda lr: torch.exp(lr) * lr - torch.expm1(lr))
    assert check.kl_pq_estimator(lambda lr: bregman_gap("t log t", lr))
    assert not check.kl_pq_estimator(lambda lr: ...).attempted
    assert "other direction" in check.kl_pq_estimator(lambda lr: torch.expm1(lr) - lr).message
    assert "negative" in check.kl_pq_estimator(lambda lr: torch.exp(lr) * lr).message
    assert "sign" in check.kl_pq_estimator(lambda lr: -(torch.exp(lr) * lr - torch.expm1(lr))).message
    assert "upside down" in check.kl_pq_estimator(lambda lr: torch.exp(-lr) * (-lr) - torch.expm1(-lr)).message
    assert "subtract" in check.kl_pq_estimator(lambda lr: torch.exp(lr) * lr + torch.expm1(lr)).message
    assert "shape" in check.kl_pq_estimator(lambda lr: lr.sum()).message
    assert "raised" in check.kl_pq_estimator(lambda lr: lr.nope).message


def test_check_k2_curvature_and_concave_from():
    assert check.k2_curvature(lambda t: (1 - torch.log(t)) / t**2)
    assert check.k2_curvature(lambda t: f_second("k2", torch.log(t)))
    assert not check.k2_curvature(lambda t: ...).attempted
    assert "sign" in check.k2_curvature(lambda t: (torch.log(t) - 1) / t**2).message
    assert "1/t" in check.k2_curvature(lambda t: (1 - torch.log(t)) / t).message
    assert "first derivative" in check.k2_curvature(lambda t: torch.log(t) / t).message
    assert "−log t" in check.k2_curvature(lambda t: 1 / t**2).message
    assert check.concave_from(math.e)
    assert check.concave_from(torch.tensor(math.e))
    assert not check.concave_from(...).attempted
    # the exercise's cell runs both checks: each not-attempted message names its part
    assert check.k2_curvature(lambda t: ...).message.startswith("(a)")
    assert check.concave_from(...).message.startswith("(b)") and not check.concave_from(None).attempted
    assert "+1" in check.concave_from(1.0).message
    assert "log t = 1" in check.concave_from(math.exp(2)).message
    assert not check.concave_from("e")


def test_check_bregman_estimator():
    def right(f, df, lr):
        r = torch.exp(lr)
        return f(r) - df(torch.ones_like(r)) * (r - 1)

    assert check.bregman_estimator(right)
    assert not check.bregman_estimator(lambda f, df, lr: ...).attempted

    def at_r(f, df, lr):
        return f(lr.exp()) - df(lr.exp()) * (lr.exp() - 1)

    assert "at the sample" in check.bregman_estimator(at_r).message

    def plus(f, df, lr):
        return f(lr.exp()) + df(torch.ones_like(lr)) * (lr.exp() - 1)

    assert "Sign" in check.bregman_estimator(plus).message
    assert "f(r) alone" in check.bregman_estimator(lambda f, df, lr: f(lr.exp())).message
    assert "depends on f" in check.bregman_estimator(lambda f, df, lr: f(lr.exp()) - (lr.exp() - 1)).message
