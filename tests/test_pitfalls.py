"""Tests of klviz.pitfalls against closed forms, brute-force sums, autograd and Monte Carlo."""

from __future__ import annotations

import math

import pytest
import torch

import klviz
from klviz import pitfalls as pf


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


# -- inverted ratio --------------------------------------------------------------------------


@pytest.mark.parametrize("mu", [0.1, 0.5, 1.0])
def test_inverted_ratio_closed_form_matches_mc(mu):
    ex = pf.inverted_k3_exact(mu)
    assert ex["kl"] == pytest.approx(mu * mu / 2)
    assert ex["inverted"] == pytest.approx(math.exp(mu * mu) - 1 - mu * mu / 2)
    mc = pf.inverted_k3_mc(mu, 100_000, generator=gen(1))
    assert abs(mc["correct"] - ex["kl"]) < 4 * mc["correct_se"]
    assert abs(mc["inverted"] - ex["inverted"]) < 4 * mc["inverted_se"]


def test_inverted_ratio_reference_numbers():
    assert pf.inverted_k3_exact(1.0)["rel_error"] == pytest.approx(1.4366, abs=1e-4)  # "144% too high"
    assert pf.inverted_k3_exact(0.1)["rel_error"] == pytest.approx(0.01, abs=1e-3)  # invisible


def test_inverted_ratio_chi2_minus_kl_on_categoricals():
    # E_q[k3(log q/p)] = chi2(q||p) - KL(q||p), by brute force over a vocabulary
    q = torch.softmax(torch.randn(30, generator=gen(2), dtype=torch.float64), 0)
    p = torch.softmax(torch.randn(30, generator=gen(3), dtype=torch.float64), 0)
    lhs = float((q * klviz.k3(torch.log(q / p))).sum())
    chi2 = float((q * q / p).sum() - 1)
    kl = float((q * torch.log(q / p)).sum())
    assert lhs == pytest.approx(chi2 - kl, rel=1e-10)


def test_inverted_compute_kl_is_k3_of_inverted_ratio():
    new, old = torch.tensor([-1.8, -0.5]), torch.tensor([-2.0, -2.0])
    seed = pf.inverted_compute_kl(new, old)
    right = pf.correct_compute_kl(new, old)
    assert torch.allclose(seed, klviz.k3(old - new))
    assert torch.allclose(right, klviz.k3(new - old))
    assert float(right[1]) == pytest.approx(math.exp(1.5) - 1 - 1.5, rel=1e-6)


def test_cov_sign_is_positive():
    mu = 0.7
    x = torch.randn(400_000, generator=gen(4), dtype=torch.float64)
    lr = mu * x - mu * mu / 2
    cov = float(((lr - lr.mean()) * (lr.exp() - 1 - (lr.exp() - 1).mean())).mean())
    exact = pf.gaussian_cov_logr_r(mu)
    assert exact["cov"] == exact["var_log_r"] == pytest.approx(mu * mu)
    assert cov > 0 and abs(cov - exact["cov"]) < 0.02


# -- clamps ----------------------------------------------------------------------------------


def test_apply_clamp_matches_kl_penalty_for_verl():
    lp = torch.linspace(-30, 0, 61, dtype=torch.float64)
    ref = torch.zeros_like(lp) - 3.0
    ours = pf.apply_clamp(ref - lp, "k3", "verl low_var_kl")
    verl = klviz.kl_penalty(lp, ref, "low_var_kl")
    assert torch.allclose(ours, verl)


def test_openrlhf_clips_k1():
    lr = torch.tensor([-15.0, -3.0, 12.0])
    assert pf.apply_clamp(lr, "k1", "OpenRLHF ±10").tolist() == [10.0, 3.0, -10.0]
    assert pf.apply_clamp(lr, "k1", "verl low_var_kl").tolist() == [15.0, 3.0, -12.0]  # verl clamps only k3


@pytest.mark.parametrize("mu", [0.5, 3.0, 5.0])
def test_clamped_expectation_quadrature_vs_mc(mu):
    x = torch.randn(100_000, generator=gen(5), dtype=torch.float64)
    lr = mu * x - mu * mu / 2
    for est, rule in (("k3", "verl low_var_kl"), ("k1", "OpenRLHF ±10"), ("k2", "OpenRLHF ±10")):
        v = pf.apply_clamp(lr, est, rule)
        mc, se = float(v.mean()), float(v.std()) / math.sqrt(v.numel())
        assert abs(pf.gaussian_clamped_expectation(mu, est, rule) - mc) < 4 * se + 1e-12
        hit = float((v != pf.apply_clamp(lr, est, "none")).double().mean())
        p = pf.gaussian_clamp_hit_rate(mu, est, rule)
        assert abs(hit - p) < 4 * math.sqrt(max(p * (1 - p), 1e-9) / v.numel()) + 1e-6
    assert pf.gaussian_clamped_expectation(mu, "k3", "none") == pytest.approx(mu * mu / 2, rel=1e-7)


def test_clamp_curve_matches_scalar_quadrature():
    mus = [0.3, 2.0, 4.5]
    for est, rule in (("k3", "verl low_var_kl"), ("k1", "OpenRLHF ±10")):
        means, hits = pf.gaussian_clamp_curve(mus, est, rule)
        for m, e, h in zip(mus, means, hits):
            assert e == pytest.approx(pf.gaussian_clamped_expectation(m, est, rule), rel=1e-4, abs=1e-9)
            assert h == pytest.approx(pf.gaussian_clamp_hit_rate(m, est, rule), abs=1e-3)
    with pytest.raises(ValueError, match="mus"):
        pf.gaussian_clamp_curve([7.0], "k1", "none")


def test_clamp_bad_inputs():
    with pytest.raises(ValueError, match="rule"):
        pf.apply_clamp(torch.zeros(2), "k1", "trl")
    with pytest.raises(ValueError, match="estimator"):
        pf.apply_clamp(torch.zeros(2), "k4", "none")
    with pytest.raises(ValueError, match="mu"):
        pf.gaussian_clamped_expectation(float("nan"), "k1", "none")
    with pytest.raises(ValueError, match="mu"):
        pf.gaussian_clamp_hit_rate(9.0, "k1", "none")


# -- precision -------------------------------------------------------------------------------


def test_precision_errors_shapes_and_float32_is_exact():
    logits = torch.randn(64, 500, generator=gen(6)) * 3
    ref = logits + 0.1 * torch.randn(64, 500, generator=gen(7))
    tok = torch.multinomial(torch.softmax(logits, -1), 1, generator=gen(8))[:, 0]
    same = pf.precision_errors(logits, ref, tok, "float32")
    assert same["k3"]["per_token_abs"] == 0.0
    low = pf.precision_errors(logits, ref, tok, "bfloat16")
    assert low["k1"]["per_token_abs"] > 1e-4
    # bf16 rounding of log-probs: error bounded by a few ulps of |log p| (bf16 has 8 significant bits)
    lp32 = pf.logprobs_in_precision(logits, tok, "float32")
    assert float((low["logprob_error"].abs() / (lp32.abs() + 1)).max()) < 2**-6
    assert low["k1"]["errors"].shape == (64,)


def test_precision_bad_inputs():
    with pytest.raises(ValueError, match="precision"):
        pf.logprobs_in_precision(torch.zeros(2, 3), torch.zeros(2, dtype=torch.long), "fp8")
    with pytest.raises(ValueError, match="tokens"):
        pf.logprobs_in_precision(torch.zeros(2, 3), torch.zeros(2), "float32")
    with pytest.raises(ValueError, match="tokens"):
        pf.logprobs_in_precision(torch.zeros(2, 3), torch.zeros(3, dtype=torch.long), "float32")


# -- off-policy ------------------------------------------------------------------------------


def test_off_policy_expectations_identities():
    old = torch.randn(5, 20, generator=gen(9), dtype=torch.float64)
    th = old + 0.5 * torch.randn(5, 20, generator=gen(10), dtype=torch.float64)
    ref = old + 0.7 * torch.randn(5, 20, generator=gen(11), dtype=torch.float64)
    e = pf.off_policy_expectations(old, th, ref)
    assert e["rho*k1"] == pytest.approx(e["KL(theta||ref)"], rel=1e-10)
    assert e["rho*k3"] == pytest.approx(e["KL(theta||ref)"], rel=1e-10)
    assert e["k1"] == pytest.approx(e["KL(old||ref)"] - e["KL(old||theta)"], rel=1e-10)
    assert e["ppo_kl"] == pytest.approx(e["KL(old||theta)"], rel=1e-10)
    assert e["KL(old||theta)"] == pytest.approx(float(klviz.exact_kl(old, th).double().mean()), rel=1e-5)
    on = pf.off_policy_expectations(old, old, ref)
    assert on["k1"] == pytest.approx(on["k3"]) and on["k3"] == pytest.approx(on["KL(theta||ref)"])


def test_off_policy_mc_agrees():
    old = torch.randn(12, generator=gen(12), dtype=torch.float64)
    th, ref = old + 0.8 * torch.randn(12, generator=gen(13), dtype=torch.float64), torch.zeros(12, dtype=torch.float64)
    e = pf.off_policy_expectations(old, th, ref)
    po = torch.softmax(old, 0)
    x = torch.multinomial(po, 200_000, replacement=True, generator=gen(14))
    lr = (torch.log_softmax(ref, 0) - torch.log_softmax(th, 0))[x]
    v = klviz.k3(lr)
    assert abs(float(v.mean()) - e["k3"]) < 4 * float(v.std()) / math.sqrt(v.numel())


# -- aggregation -----------------------------------------------------------------------------


def test_aggregation_weights_reproduce_agg_loss():
    lengths = [3, 10, 1, 6]
    T = 10
    g = gen(15)
    values = torch.randn(4, T, generator=g, dtype=torch.float64)
    mask = (torch.arange(T)[None] < torch.tensor(lengths)[:, None]).double()
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"):
        w = pf.aggregation_weights(lengths, mode)
        ours = float((values * mask * w[:, None]).sum())
        assert ours == pytest.approx(float(klviz.agg_loss(values, mask, mode)), rel=1e-10)
    with pytest.raises(ValueError, match="lengths"):
        pf.aggregation_weights([3, 0], "token-mean")
    with pytest.raises(ValueError, match="mode"):
        pf.aggregation_weights([3], "sum")


# -- negative k1 -----------------------------------------------------------------------------


@pytest.mark.parametrize("mu,n", [(0.1, 100), (0.3, 50), (1.0, 4)])
def test_negative_k1_probability(mu, n):
    p = pf.prob_negative_k1_mean(mu, n)
    mc = pf.negative_k1_mc(mu, n, 20_000, generator=gen(16))
    assert abs(mc["fraction"] - p) < 4 * math.sqrt(p * (1 - p) / 20_000)
    assert pf.prob_negative_k1_mean(0.0, 10) == 0.0
    with pytest.raises(ValueError, match="batch_tokens"):
        pf.prob_negative_k1_mean(0.1, 0)


# -- no_grad ---------------------------------------------------------------------------------


def test_no_grad_kl_has_no_gradient():
    g = gen(17)
    logits = torch.randn(8, 6, generator=g)
    ref = logits + torch.randn(8, 6, generator=g)
    tok = torch.randint(0, 6, (8,), generator=g)
    adv = torch.randn(8, generator=g)
    d = pf.no_grad_kl_demo(logits, ref, tok, adv, beta=0.5)
    assert not d["kl under no_grad"]["kl_requires_grad"] and d["kl with grad"]["kl_requires_grad"]
    assert torch.equal(d["kl under no_grad"]["grad"], d["pg only"]["grad"])
    assert not torch.allclose(d["kl with grad"]["grad"], d["pg only"]["grad"])
    assert d["kl under no_grad"]["loss"] != d["pg only"]["loss"]  # the value changes, the gradient not
    # the KL part of the gradient equals beta * d(mean k3)/d logits, by an independent autograd pass
    lg = logits.double().clone().requires_grad_(True)
    lp = torch.log_softmax(lg, -1).gather(-1, tok[:, None])[:, 0]
    rl = torch.log_softmax(ref.double(), -1).gather(-1, tok[:, None])[:, 0]
    (gk,) = torch.autograd.grad(0.5 * klviz.k3(rl - lp).mean(), lg)
    assert torch.allclose(d["kl with grad"]["grad"] - d["pg only"]["grad"], gk, atol=1e-12)


# -- mixing samples ----------------------------------------------------------------------------


@pytest.mark.parametrize("alpha", [0.0, 0.2, 0.5])
def test_mixture_needs_importance_weights(alpha):
    ex = pf.mixture_k3_exact(1.0, alpha)
    mc = pf.mixture_k3_mc(1.0, alpha, 100_000, generator=gen(18))
    assert abs(mc["naive"] - ex["naive"]) < 4 * mc["naive_se"]
    assert abs(mc["weighted"] - 0.5) < 4 * mc["weighted_se"]
    with pytest.raises(ValueError, match="alpha"):
        pf.mixture_k3_exact(1.0, 1.5)


# -- variance table ----------------------------------------------------------------------------


def test_relative_variance_table_gaussian():
    mu = 1.0
    x = torch.randn(300_000, generator=gen(19), dtype=torch.float64)
    t = pf.relative_variance_table(mu * x - mu * mu / 2, mu * mu / 2)
    # closed forms: Var k1 = mu², Var k2 = mu⁴/2 + mu⁶/4, Var k3 = e^{mu²} - 1 - mu²; E k2 bias = mu²/4 relative
    assert t["k1"]["var_rel_k1"] == 1.0
    assert t["k2"]["var_rel_k1"] == pytest.approx(0.75, rel=0.03)
    assert t["k3"]["var_rel_k1"] == pytest.approx(math.e - 2, rel=0.05)
    assert t["k2"]["bias_pct"] == pytest.approx(25.0, abs=1.5)
    with pytest.raises(ValueError, match="exact_kl"):
        pf.relative_variance_table(x, 0.0)
    with pytest.raises(ValueError, match="weights"):
        pf.relative_variance_table(x[:5], 1.0, weights=torch.ones(4))
