"""The public API contract of DESIGN.md, each function against an independent computation."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.distributions import Categorical, Normal

import klviz

# ---------------------------------------------------------------------------- k1, k2, k3


def test_estimators_match_their_definitions_in_float64():
    log_r = torch.linspace(-5, 5, 101, dtype=torch.float64)
    r = np.exp(log_r.numpy())
    np.testing.assert_allclose(klviz.k1(log_r).numpy(), -log_r.numpy(), rtol=0, atol=0)
    np.testing.assert_allclose(klviz.k2(log_r).numpy(), 0.5 * log_r.numpy() ** 2, rtol=1e-15)
    np.testing.assert_allclose(klviz.k3(log_r).numpy(), (r - 1) - log_r.numpy(), rtol=1e-12, atol=1e-15)


def test_seed_004_worked_numbers():
    # MiniMind's approx_kl on two tokens: old log-prob -2.0, new -1.8 and -0.5
    old = torch.tensor([-2.0, -2.0])
    new = torch.tensor([-1.8, -0.5])
    delta = new - old
    ratio = torch.exp(delta)
    assert torch.allclose(delta, torch.tensor([0.2, 1.5]), atol=1e-6)
    assert round(ratio[0].item(), 4) == 1.2214 and round(ratio[1].item(), 4) == 4.4817
    half_sq = klviz.kl_penalty(new, old, "mse")
    assert torch.allclose(half_sq, torch.tensor([0.02, 1.125]), atol=1e-6)
    # k2 of log r is the same number whichever sign log r has
    assert torch.allclose(klviz.k2(old - new), half_sq, atol=0)


def test_k3_is_accurate_for_tiny_log_r():
    # (r - 1) - log r ≈ log_r²/2 for tiny log_r: expm1 keeps the digits that exp(x) - 1 loses
    x = torch.tensor([1e-4, -1e-4, 1e-6], dtype=torch.float32)
    expected = 0.5 * x.double() ** 2 + x.double() ** 3 / 6
    np.testing.assert_allclose(klviz.k3(x).double().numpy(), expected.numpy(), rtol=1e-3)


def test_k3_finite_and_nonnegative_up_to_80_in_float32():
    x = torch.linspace(-80, 80, 16001, dtype=torch.float32)
    v = klviz.k3(x)
    assert v.dtype == torch.float32
    assert torch.isfinite(v).all() and (v >= 0).all()
    ref = torch.expm1(x.double()) - x.double()
    np.testing.assert_allclose(v.double().numpy(), ref.numpy(), rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_inputs_are_computed_in_float32(dtype):
    x = torch.tensor([-3.0, -0.1, 0.0, 0.1, 3.0], dtype=dtype)
    for fn in (klviz.k1, klviz.k2, klviz.k3):
        out = fn(x)
        assert out.dtype == torch.float32
        ref = fn(x.float())
        assert torch.equal(out, ref)
    lp = torch.tensor([-1.0, -2.0], dtype=dtype)
    assert klviz.kl_penalty(lp, lp - 0.5, "k3").dtype == torch.float32


@pytest.mark.parametrize("fn", [klviz.k1, klviz.k2, klviz.k3])
@pytest.mark.parametrize(
    "bad,msg",
    [
        (torch.tensor([0.0, float("nan")]), "NaN"),
        (torch.tensor([0.0, float("inf")]), "inf"),
        (torch.tensor([1, 2]), "floating-point"),
        (torch.tensor([True]), "floating-point"),
        (torch.empty(0), "empty"),
        ("0.5", "torch tensor"),
    ],
)
def test_estimators_reject_bad_input_naming_the_argument(fn, bad, msg):
    with pytest.raises(ValueError, match=msg) as err:
        fn(bad)
    assert "log_r" in str(err.value)


# ---------------------------------------------------------------------------- kl_penalty (verl)


def _verl_reference(logprob, ref_logprob, kind):
    """verl's formulas, written out independently of klviz (float64)."""
    lp, ref = logprob.double(), ref_logprob.double()
    if kind in ("kl", "k1"):
        return lp - ref
    if kind == "abs":
        return (lp - ref).abs()
    if kind in ("mse", "k2"):
        return 0.5 * (lp - ref) ** 2
    kl = torch.clamp(ref - lp, min=-20, max=20)
    return torch.clamp(torch.exp(kl) - kl - 1, min=-10, max=10)


@pytest.mark.parametrize("kind", klviz.KL_PENALTY_KINDS)
def test_kl_penalty_values_match_verl(kind):
    g = torch.Generator().manual_seed(1)
    lp = torch.randn(64, 33, generator=g, dtype=torch.float64) * 4 - 3
    ref = torch.randn(64, 33, generator=g, dtype=torch.float64) * 4 - 3
    ref[0, :4] = lp[0, :4] + torch.tensor([30.0, -30.0, 25.0, -25.0], dtype=torch.float64)  # hit both clamps
    for k in (kind, kind + "+"):
        out = klviz.kl_penalty(lp, ref, k)
        np.testing.assert_allclose(out.numpy(), _verl_reference(lp, ref, kind).numpy(), rtol=1e-10, atol=1e-12)


def test_low_var_kl_output_clamp_binds_only_above():
    lp = torch.tensor([-1.0, -1.0, -1.0, -1.0], dtype=torch.float64)
    ref = lp + torch.tensor([15.0, -15.0, 2.0, -2.0], dtype=torch.float64)  # log r = ref - logprob
    out = klviz.kl_penalty(lp, ref, "low_var_kl")
    assert out[0] == 10.0  # e^15 - 16 is clamped to 10
    assert out[1] == 10.0  # e^-15 + 14 is clamped to 10 too
    assert out[2].item() == pytest.approx(math.exp(2) - 3)  # untouched
    assert out[3].item() == pytest.approx(math.exp(-2) + 1)
    # k3 >= 0 everywhere, so the lower clamp at -10 can never act
    d = torch.linspace(-40, 40, 10001, dtype=torch.float64)
    assert (klviz.kl_penalty(torch.zeros_like(d), d, "low_var_kl") >= 0).all()


def test_kl_penalty_estimates_reverse_kl_from_policy_samples():
    # tokens sampled from the policy pi: the mean of each unbiased kind is KL(pi || ref), not KL(ref || pi)
    pi = torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64)
    ref = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    n = 400_000
    x = torch.multinomial(pi, n, replacement=True, generator=torch.Generator().manual_seed(0))
    lp, rp = pi.log()[x], ref.log()[x]
    reverse = float((pi * (pi / ref).log()).sum())
    forward = float((ref * (ref / pi).log()).sum())
    for kind in ("k1", "k3"):
        v = klviz.kl_penalty(lp, rp, kind)
        se = float(v.std() / math.sqrt(n))
        assert abs(float(v.mean()) - reverse) < 4 * se
        assert abs(float(v.mean()) - forward) > 20 * se


@pytest.mark.parametrize("kind", ["k1", "abs", "k2", "low_var_kl", "k3"])
def test_straight_through_variants_have_k2_gradient(kind):
    lp = torch.tensor([-2.0, -1.0, -0.3, -5.0], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([-1.0, -1.5, -0.3, -0.1], dtype=torch.float64)
    klviz.kl_penalty(lp, ref, kind + "+").sum().backward()
    assert torch.allclose(lp.grad, (lp - ref).detach())  # d/dlp ½(lp - ref)²


def test_low_var_kl_gradient_finite_for_any_finite_input():
    lp = torch.tensor([-1e4, -500.0, -100.0, -1.0, 0.0], requires_grad=True)
    ref = torch.tensor([0.0, -1.0, -1e4, -1.0, -300.0])
    out = klviz.kl_penalty(lp, ref, "low_var_kl")
    out.sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(lp.grad).all()
    # without the input clamp the same computation overflows: what verl's clamp protects
    raw = torch.exp(ref - lp.detach())
    assert not torch.isfinite(raw).all()


def test_kl_penalty_bad_input():
    lp = torch.zeros(3)
    with pytest.raises(ValueError, match="kind"):
        klviz.kl_penalty(lp, lp, "full")
    with pytest.raises(ValueError, match="kind"):
        klviz.kl_penalty(lp, lp, "K3")
    with pytest.raises(ValueError, match="ref_logprob"):
        klviz.kl_penalty(lp, torch.zeros(4), "k1")
    with pytest.raises(ValueError, match="logprob"):
        klviz.kl_penalty(torch.tensor([float("nan"), 0.0, 0.0]), lp, "k3")
    with pytest.raises(ValueError, match="ref_logprob"):
        klviz.kl_penalty(lp, torch.zeros(3, dtype=torch.int64), "k3")


# ---------------------------------------------------------------------------- masked_mean, agg_loss


def test_masked_mean_against_a_loop_and_with_garbage_in_padding():
    v = torch.tensor([[1.0, 2.0, 3.0, float("nan")], [4.0, 5.0, float("inf"), 0.0]])
    m = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    assert klviz.masked_mean(v, m).item() == pytest.approx((1 + 2 + 3 + 4 + 5) / 5)
    per_row = klviz.masked_mean(v, m.bool(), dim=-1)
    assert torch.allclose(per_row, torch.tensor([2.0, 4.5]))


def test_masked_mean_all_zero_mask_is_zero_not_nan():
    v = torch.randn(3, 5)
    assert klviz.masked_mean(v, torch.zeros(3, 5)).item() == 0.0
    rows = klviz.masked_mean(v, torch.tensor([[1.0] * 5, [0.0] * 5, [0.0] * 5]), dim=1)
    assert torch.isfinite(rows).all() and rows[1] == 0 and rows[2] == 0


def test_masked_mean_bad_input():
    with pytest.raises(ValueError, match="mask"):
        klviz.masked_mean(torch.zeros(2, 3), torch.ones(3, 2))
    with pytest.raises(ValueError, match="values"):
        klviz.masked_mean(torch.tensor([1.0, float("nan")]), torch.ones(2))
    with pytest.raises(ValueError, match="mask"):
        klviz.masked_mean(torch.zeros(2), torch.tensor([1.0, -1.0]))


def _agg_reference(v, m, mode, legacy_norm=False):
    """verl's agg_loss (verl-project/verl @ 1dda039, one rank) in plain Python."""
    rows = []
    for vi, mi in zip(v.tolist(), m.tolist()):
        toks = [a for a, b in zip(vi, mi) if b]
        rows.append(toks)
    if mode == "token-mean":
        flat = [t for r in rows for t in r]
        return sum(flat) / len(flat)
    if mode == "token-sum":
        return sum(t for r in rows for t in r)
    nonempty = [r for r in rows if r]
    if mode == "seq-mean-token-sum":
        return sum(sum(r) for r in nonempty) / len(nonempty)
    if mode == "seq-mean-token-mean":
        return sum(sum(r) / len(r) for r in nonempty) / len(nonempty)
    if legacy_norm:  # seq-mean-token-sum-norm before verl PR #5366: no mean over sequences
        return sum(sum(r) for r in rows) / v.shape[1]
    return sum(sum(r) for r in nonempty) / len(nonempty) / v.shape[1]


@pytest.mark.parametrize("mode", klviz.AGG_MODES)
def test_agg_loss_modes_against_plain_python(mode):
    g = torch.Generator().manual_seed(3)
    v = torch.randn(5, 7, generator=g, dtype=torch.float64)
    lengths = [7, 3, 0, 1, 5]
    m = torch.tensor([[1] * n + [0] * (7 - n) for n in lengths])
    assert klviz.agg_loss(v, m, mode).item() == pytest.approx(_agg_reference(v, m, mode), rel=1e-12)


def test_agg_loss_seq_mean_token_sum_norm_legacy_option_and_scale():
    g = torch.Generator().manual_seed(4)
    v = torch.randn(5, 7, generator=g, dtype=torch.float64)
    m = torch.tensor([[1] * n + [0] * (7 - n) for n in [7, 3, 0, 1, 5]])
    mode = "seq-mean-token-sum-norm"
    new = klviz.agg_loss(v, m, mode).item()
    old = klviz.agg_loss(v, m, mode, legacy_norm=True).item()
    assert old == pytest.approx(_agg_reference(v, m, mode, legacy_norm=True), rel=1e-12)
    assert old == pytest.approx(4 * new, rel=1e-12)  # four non-empty sequences
    # the new value is seq-mean-token-sum over the scale; an explicit loss_scale_factor replaces the width
    assert new == pytest.approx(klviz.agg_loss(v, m, "seq-mean-token-sum").item() / 7, rel=1e-12)
    assert klviz.agg_loss(v, m, mode, 3.0).item() == pytest.approx(new * 7 / 3, rel=1e-12)
    assert klviz.agg_loss(v, m, mode, 3.0, legacy_norm=True).item() == pytest.approx(old * 7 / 3, rel=1e-12)
    with pytest.raises(ValueError, match="loss_scale_factor"):
        klviz.agg_loss(v, m, mode, 0.0)


def test_agg_loss_all_zero_mask_and_bad_mode():
    for mode in klviz.AGG_MODES:
        assert klviz.agg_loss(torch.randn(2, 3), torch.zeros(2, 3), mode).item() == 0.0
    with pytest.raises(ValueError, match="mode"):
        klviz.agg_loss(torch.zeros(2, 3), torch.ones(2, 3), "seq-mean")
    with pytest.raises(ValueError, match="values"):
        klviz.agg_loss(torch.zeros(3), torch.ones(3), "token-mean")


# ---------------------------------------------------------------------------- exact_kl, gaussian_kl


def test_exact_kl_against_brute_force_sum():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(3, 4, 11, generator=g, dtype=torch.float64) * 2
    p = torch.randn(3, 4, 11, generator=g, dtype=torch.float64) * 2
    pq, pp = q.softmax(-1), p.softmax(-1)
    brute = (pq * (pq.log() - pp.log())).sum(-1)
    assert torch.allclose(klviz.exact_kl(q, p), brute, rtol=1e-12, atol=1e-14)
    # along another axis, and with chunks of a single row
    assert torch.allclose(klviz.exact_kl(q.transpose(1, 2), p.transpose(1, 2), dim=1), brute, rtol=1e-12)
    assert torch.allclose(klviz.exact_kl(q, p, chunk_elements=1), brute, rtol=1e-12)
    # it is KL(softmax(q) || softmax(p)), not the other direction
    assert not torch.allclose(klviz.exact_kl(p, q), brute, rtol=1e-3)


def test_exact_kl_zero_probabilities():
    q = torch.tensor([[0.0, 0.0, -float("inf")], [0.0, 1.0, 2.0]])
    p = torch.tensor([[0.0, 1.0, 0.0], [0.0, 1.0, -float("inf")]])
    out = klviz.exact_kl(q, p)
    pq = torch.tensor([0.5, 0.5, 0.0])
    pp = torch.softmax(torch.tensor([0.0, 1.0, 0.0]), 0)
    assert out[0].item() == pytest.approx(float((pq[:2] * (pq[:2] / pp[:2]).log()).sum()), rel=1e-5)
    assert out[1].item() == math.inf  # q can emit a token p never does


def test_exact_kl_bad_input_and_half_precision():
    with pytest.raises(ValueError, match="p_logits"):
        klviz.exact_kl(torch.zeros(2, 3), torch.zeros(2, 4))
    with pytest.raises(ValueError, match="q_logits"):
        klviz.exact_kl(torch.tensor([[0.0, float("nan")]]), torch.zeros(1, 2))
    with pytest.raises(ValueError, match="p_logits"):
        klviz.exact_kl(torch.zeros(1, 2), torch.tensor([[0.0, float("inf")]]))
    with pytest.raises(ValueError, match="q_logits"):
        klviz.exact_kl(torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 3))
    q = torch.randn(4, 100).to(torch.bfloat16)
    p = torch.randn(4, 100).to(torch.bfloat16)
    out = klviz.exact_kl(q, p)
    assert out.dtype == torch.float32
    assert torch.allclose(out, klviz.exact_kl(q.float(), p.float()))


def test_exact_kl_large_vocabulary_in_bounded_chunks():
    # 64 positions x 50257 vocabulary: chunks of about 1M numbers, result equal to the direct formula
    g = torch.Generator().manual_seed(5)
    q = torch.randn(64, 50257, generator=g) * 3
    p = q + 0.3 * torch.randn(64, 50257, generator=g)
    direct = torch.nn.functional.kl_div(p.log_softmax(-1), q.log_softmax(-1), log_target=True, reduction="none").sum(-1)
    np.testing.assert_allclose(klviz.exact_kl(q, p).numpy(), direct.numpy(), rtol=1e-4)


def test_gaussian_kl_closed_form_against_numerical_integral():
    x = torch.linspace(-30, 30, 600_001, dtype=torch.float64)
    for mq, sq, mp, sp in [(0, 1, 0.1, 1), (0, 1, 1, 1), (0.3, 0.5, -1, 2.0), (2, 3, 0, 1)]:
        lq = Normal(float(mq), float(sq)).log_prob(x)
        lp = Normal(float(mp), float(sp)).log_prob(x)
        integral = torch.trapezoid(lq.exp() * (lq - lp), x).item()
        assert klviz.gaussian_kl(mq, sq, mp, sp).item() == pytest.approx(integral, rel=1e-6)
    assert klviz.gaussian_kl(0.0, 1.0, 0.1, 1.0).item() == pytest.approx(0.005, rel=1e-6)
    with pytest.raises(ValueError, match="sigma_p"):
        klviz.gaussian_kl(0.0, 1.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="mu_q"):
        klviz.gaussian_kl(float("nan"), 1.0, 0.0, 1.0)


# ---------------------------------------------------------------------------- estimator_stats


def _closed_forms(mu):
    """q = N(0,1), p = N(mu,1): REFERENCE section 2."""
    kl = mu**2 / 2
    return {
        "true": kl,
        "k1_mean": kl,
        "k2_mean": kl + mu**4 / 8,
        "k3_mean": kl,
        "k1_var": mu**2,
        "k2_var": mu**4 / 2 + mu**6 / 4,
        "k3_var": math.exp(mu**2) - 1 - mu**2,
    }


@pytest.mark.parametrize("mu", [0.1, 1.0])
def test_estimator_stats_gaussian_against_closed_forms(mu):
    n = 2_000_000
    s = klviz.estimator_stats(Normal(0.0, 1.0), Normal(mu, 1.0), n, generator=klviz.make_generator(7))
    cf = _closed_forms(mu)
    assert s["true_kl"] == pytest.approx(cf["true"], rel=1e-6)  # parameters are float32
    for k in ("k1", "k2", "k3"):
        se_mean = math.sqrt(cf[f"{k}_var"] / n)
        assert abs(s[k]["mean"] - cf[f"{k}_mean"]) < 5 * se_mean, k
        assert s[k]["se"] == pytest.approx(s[k]["std"] / math.sqrt(n))
        assert s[k]["bias"] == pytest.approx(s[k]["mean"] - s["true_kl"])
        assert s[k]["bias_rel"] == pytest.approx(s[k]["bias"] / s["true_kl"])
        assert s[k]["std_rel"] == pytest.approx(s[k]["std"] / s["true_kl"])
        # the std of a std estimate is roughly std * sqrt((kurtosis - 1) / (4n)); 5% covers it at n = 2e6
        assert s[k]["std"] == pytest.approx(math.sqrt(cf[f"{k}_var"]), rel=0.05), k
    # Schulman's table: k2's bias/true is mu²/4 (0.0025 at mu = 0.1; the blog's 0.002 is rounding/noise)
    assert s["k2"]["bias_rel"] == pytest.approx(mu**2 / 4, abs=5 * math.sqrt(cf["k2_var"] / n) / cf["true"])


def test_estimator_stats_categorical_against_enumeration():
    q = Categorical(probs=torch.tensor([0.5, 0.25, 0.125, 0.125]))
    p = Categorical(probs=torch.tensor([0.1, 0.2, 0.3, 0.4]))
    n = 200_000
    s = klviz.estimator_stats(q, p, n, generator=klviz.make_generator(3))
    qp, pp = q.probs.double(), p.probs.double()
    log_r = (pp / qp).log()
    exact = {"k1": -log_r, "k2": 0.5 * log_r**2, "k3": log_r.exp() - 1 - log_r}
    assert s["true_kl"] == pytest.approx(float((qp * (qp / pp).log()).sum()), rel=1e-6)
    for k, vals in exact.items():
        mean = float((qp * vals).sum())
        std = math.sqrt(float((qp * (vals - mean) ** 2).sum()))
        assert abs(s[k]["mean"] - mean) < 5 * std / math.sqrt(n), k
        assert s[k]["std"] == pytest.approx(std, rel=0.02)


def test_estimator_stats_reproducible_and_seed_dependent():
    q, p = Normal(0.0, 1.0), Normal(0.5, 1.2)
    a = klviz.estimator_stats(q, p, 10_000, generator=klviz.make_generator(11))
    b = klviz.estimator_stats(q, p, 10_000, generator=klviz.make_generator(11))
    c = klviz.estimator_stats(q, p, 10_000, generator=klviz.make_generator(12))
    assert a == b and a["k1"]["mean"] != c["k1"]["mean"]


def test_estimator_stats_streaming_variance_is_sound():
    # huge mean, tiny spread: the textbook E[x²] - E[x]² formula loses every digit here
    from klviz.statistics import RunningMoments

    rm = RunningMoments()
    x = 1e8 + torch.randn(100_000, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    for chunk in x.split(7_777):
        rm.add_chunk(chunk)
    assert rm.mean == pytest.approx(float(x.mean()), rel=1e-15)
    assert rm.variance == pytest.approx(float(x.var()), rel=1e-9)


def _same_draws_in_float64(q, p, n, seed, chunk):
    """k1, k2, k3 (klviz.kernel, float64) on the z ~ N(0, 1) that estimator_stats draws in chunks."""
    gen = klviz.make_generator(seed)
    z = torch.cat([torch.empty(min(chunk, n - i)).normal_(generator=gen) for i in range(0, n, chunk)]).double()
    q64, p64 = (Normal(d.loc.double(), d.scale.double()) for d in (q, p))
    x = q64.loc + q64.scale * z
    return klviz.kernel.estimates(p64.log_prob(x) - q64.log_prob(x))


@pytest.mark.parametrize(
    "q, p",
    [
        (Normal(0.0, 1.0), Normal(1.0, 1.0)),  # log r = a + b z (b > 0)
        (Normal(0.0, 1.0), Normal(1e-7, 1.0)),  # r within 1e-6 of 1
        (Normal(0.2, 0.9), Normal(0.5, 1.3)),
    ],
)  # log r quadratic in z
def test_estimator_stats_streams_the_kernels_estimators(q, p):
    # the streamed k1, k2, k3 are klviz.kernel's on the very draws (chunk by chunk from the same
    # generator), up to float32 rounding; the plain expm1(t) - t would put the k3 mean 3% off at mu = 1e-7
    n, chunk = 20_000, 4096
    s = klviz.estimator_stats(q, p, n, generator=klviz.make_generator(5), chunk_size=chunk)
    ref = _same_draws_in_float64(q, p, n, 5, chunk)
    for k in ("k1", "k2", "k3"):
        assert s[k]["mean"] == pytest.approx(float(ref[k].mean()), rel=1e-5, abs=1e-9 * float(ref[k].std())), k
        assert s[k]["std"] == pytest.approx(float(ref[k].std()), rel=1e-5), k


def test_estimator_stats_k3_precise_near_r_equal_1():
    # p = N(1e-7, 1): |log r| ~ 1e-7, where float32 expm1(t) - t keeps about one digit. Measured at
    # n = 2e6: the plain formula's k3 mean sat 30 SE above mu²/2 and its std 11% high; the kernel's
    # series is within 0.4 SE. (At mu = 1e-3, NumPy's correctly rounded expm1 leaves the plain mean
    # within 0.3 SE: cancellation costs per-sample digits there, not the mean.)
    mu, n = 1e-7, 1_000_000
    s = klviz.estimator_stats(Normal(0.0, 1.0), Normal(mu, 1.0), n, generator=klviz.make_generator(0))
    mu32 = float(torch.tensor(mu))
    std = mu32**2 * math.sqrt(0.5 + mu32**2 / 6)  # sqrt(e^{mu²} - 1 - mu²), without cancellation
    assert abs(s["k3"]["mean"] - mu32**2 / 2) < 4 * std / math.sqrt(n)
    assert s["k3"]["std"] == pytest.approx(std, rel=0.01)


def test_estimator_stats_k3_into_is_kernel_k3():
    # the buffered k3 of the streaming loop is kernel.k3: same series bit for bit, same threshold
    from klviz import kernel

    t64 = torch.cat(
        [
            torch.randn(20_000, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * s
            for s in (1e-5, 1e-2, 0.1, 1.0, 30.0)
        ]
    )
    for dtype in (torch.float32, torch.float64):
        thr = kernel.k3_series_threshold(dtype)
        t = torch.cat([t64.to(dtype), torch.tensor([thr, -thr, 0.0, math.inf, -math.inf, 1e30], dtype=dtype)])
        t = torch.cat([t, torch.nextafter(t[-6:-4], torch.zeros(2, dtype=dtype))])  # just below thr
        arr = t.numpy().copy()
        out = kernel.k3_into(arr, *(np.empty_like(arr) for _ in range(3)))
        assert np.array_equal(arr, t.numpy()), "k3_into changed its input"
        ref = kernel.k3(t).numpy()
        small = np.abs(arr) < thr
        assert np.array_equal(out[small], ref[small])
        assert np.array_equal(np.isnan(out), np.isnan(ref))
        big = ~small & np.isfinite(ref)
        assert np.allclose(out[big], ref[big], rtol=3e-6 if dtype == torch.float32 else 1e-12, atol=0)
        torch_out = kernel.k3_into(t, *(torch.empty_like(t) for _ in range(3)))
        assert torch.equal(torch_out.nan_to_num(-1.0), kernel.k3(t).nan_to_num(-1.0))
        with np.errstate(over="ignore"):  # the series overflows at |t| = 1e30
            assert np.array_equal(
                kernel.k3_series(arr, np.empty_like(arr), np.empty_like(arr))[small], kernel.k3_series(arr)[small]
            )
    assert kernel.k3_series_threshold(np.float64) == kernel.k3_series_threshold(torch.float64) == 1e-3
    assert kernel.k3_series_threshold(np.float32) == kernel.k3_series_threshold(torch.float32) == 0.1


def test_estimator_stats_equal_policies_and_bad_input():
    s = klviz.estimator_stats(Normal(0.0, 1.0), Normal(0.0, 1.0), 1000, generator=klviz.make_generator(0))
    assert s["true_kl"] == 0 and s["k3"]["mean"] == 0 and s["k3"]["bias_rel"] == 0.0
    q = Normal(0.0, 1.0)
    with pytest.raises(ValueError, match="num_samples"):
        klviz.estimator_stats(q, q, 0)
    with pytest.raises(ValueError, match="num_samples"):
        klviz.estimator_stats(q, q, 10.5)
    with pytest.raises(ValueError, match="p must be"):
        klviz.estimator_stats(q, torch.distributions.Laplace(0.0, 1.0), 10)
    with pytest.raises(ValueError, match="q is a Normal"):
        klviz.estimator_stats(q, Categorical(probs=torch.tensor([0.5, 0.5])), 10)
    with pytest.raises(ValueError, match="batch_shape"):
        klviz.estimator_stats(Normal(torch.zeros(2), torch.ones(2)), Normal(torch.zeros(2), torch.ones(2)), 10)
    with pytest.raises(ValueError, match="categories"):
        klviz.estimator_stats(Categorical(probs=torch.ones(3) / 3), Categorical(probs=torch.ones(4) / 4), 10)
    with pytest.raises(ValueError, match="infinite"):
        klviz.estimator_stats(
            Categorical(probs=torch.tensor([0.5, 0.5])), Categorical(probs=torch.tensor([1.0, 0.0])), 10
        )
    with pytest.raises(ValueError, match="device"):
        klviz.estimator_stats(q, q, 10, device="nonsense")


def test_device_helpers():
    assert klviz.default_device().type == ("cuda" if torch.cuda.is_available() else "cpu")
    g1, g2 = klviz.make_generator(5), klviz.make_generator(5)
    assert torch.equal(torch.rand(3, generator=g1), torch.rand(3, generator=g2))
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA"):
            klviz.resolve_device("cuda")


# ---------------------------------------------------------------------------- gradients


def _autograd_expected(theta, ref, estimator, placement):
    """Brute force: for each token x build the surrogate whose gradient is the per-sample gradient,
    differentiate it with autograd, and average with weights pi(x) (independent of klviz)."""
    theta = theta.detach().double()
    total = torch.zeros_like(theta)
    pi = theta.softmax(-1).detach()
    for x in range(theta.numel()):
        th = theta.clone().requires_grad_(True)
        log_pi = th.log_softmax(-1)[x]
        log_ref = ref.double().log_softmax(-1)[x]
        log_r = log_ref - log_pi
        k = {"k1": -log_r, "k2": 0.5 * log_r**2, "k3": torch.exp(log_r) - 1 - log_r}
        if placement == "reward":
            surrogate = k[estimator].detach() * log_pi
        elif estimator == "k3_ratio":
            surrogate = torch.exp(log_pi - log_pi.detach()) * k["k3"]
        elif estimator == "k3+":
            surrogate = k["k2"] - k["k2"].detach() + k["k3"].detach()
        else:
            surrogate = k[estimator]
        (g,) = torch.autograd.grad(surrogate, th)
        total += pi[x] * g
    return total


# the library's (estimator, weighting) for each brute-force case written out above
_AS_USE = {"k3_ratio": ("k3", "rho"), "k3+": ("k3", "straight-through")}


@pytest.mark.parametrize(
    "estimator,placement",
    [
        ("k1", "loss"),
        ("k2", "loss"),
        ("k3", "loss"),
        ("k3_ratio", "loss"),
        ("k3+", "loss"),
        ("k1", "reward"),
        ("k2", "reward"),
        ("k3", "reward"),
    ],
)
def test_expected_gradient_matches_autograd_brute_force(estimator, placement):
    g = torch.Generator().manual_seed(2)
    theta, ref = torch.randn(6, generator=g, dtype=torch.float64), torch.randn(6, generator=g, dtype=torch.float64)
    est, weighting = _AS_USE.get(estimator, (estimator, "none"))
    ours = klviz.expected_kl_gradient(theta, ref, est, placement, weighting)
    assert torch.allclose(ours, _autograd_expected(theta, ref, estimator, placement), atol=1e-12)


def test_gradient_identities():
    g = torch.Generator().manual_seed(4)
    theta, ref = torch.randn(8, generator=g, dtype=torch.float64), torch.randn(8, generator=g, dtype=torch.float64)
    rev = klviz.reverse_kl_gradient(theta, ref)
    fwd = klviz.forward_kl_gradient(theta, ref)
    assert torch.allclose(fwd, theta.softmax(-1) - ref.softmax(-1), atol=1e-12)
    e = lambda est, pl: klviz.expected_kl_gradient(theta, ref, est, pl)  # noqa: E731
    assert torch.allclose(e("k1", "loss"), torch.zeros(8, dtype=torch.float64), atol=1e-12)  # does nothing
    assert torch.allclose(e("k2", "loss"), rev, atol=1e-12)  # = k1 in reward
    assert torch.allclose(e("k1", "reward"), rev, atol=1e-12)
    assert torch.allclose(e("k3", "loss"), fwd, atol=1e-12)  # forward KL
    assert torch.allclose(e("k3", "reward"), rev - fwd, atol=1e-12)  # biased
    assert torch.allclose(klviz.expected_kl_gradient(theta, ref, "k3", "loss", "rho"), rev, atol=1e-12)
    assert torch.allclose(klviz.expected_kl_gradient(theta, ref, "k3", "loss", "straight-through"), rev, atol=1e-12)
    assert not torch.allclose(e("k2", "reward"), rev, atol=1e-3)


def test_sampled_gradients_average_to_expected():
    g = torch.Generator().manual_seed(6)
    theta, ref = torch.randn(5, generator=g), torch.randn(5, generator=g)
    for est, pl in [("k2", "loss"), ("k3", "loss"), ("k3", "reward")]:
        grads = klviz.sampled_kl_gradients(theta, ref, est, pl, 200_000, generator=klviz.make_generator(1))
        se = grads.std(0) / math.sqrt(grads.shape[0])
        assert ((grads.mean(0) - klviz.expected_kl_gradient(theta, ref, est, pl)).abs() < 5 * se + 1e-7).all()
    # k2 as a loss equals k1 in the reward sample by sample
    a = klviz.sampled_kl_gradients(theta, ref, "k2", "loss", 50, generator=klviz.make_generator(9))
    b = klviz.sampled_kl_gradients(theta, ref, "k1", "reward", 50, generator=klviz.make_generator(9))
    assert torch.equal(a, b)


def test_gradient_bad_input():
    with pytest.raises(ValueError, match="estimator"):
        klviz.expected_kl_gradient(torch.zeros(3), torch.zeros(3), "k4", "loss")
    with pytest.raises(ValueError, match="placement"):
        klviz.expected_kl_gradient(torch.zeros(3), torch.zeros(3), "k1", "advantage")
    with pytest.raises(ValueError, match="policy_logits"):
        klviz.reverse_kl_gradient(torch.zeros(2, 3), torch.zeros(2, 3))
    with pytest.raises(ValueError, match="ref_logits"):
        klviz.forward_kl_gradient(torch.zeros(3), torch.zeros(4))
    with pytest.raises(ValueError, match="loss-side"):
        klviz.expected_kl_gradient(torch.zeros(3), torch.zeros(3), "k3", "reward", "straight-through")
    with pytest.raises(ValueError, match="estimator"):
        klviz.expected_kl_gradient(torch.zeros(3), torch.zeros(3), "k3_ratio", "loss")


def test_gradients_work_under_no_grad():
    with torch.no_grad():
        assert torch.isfinite(klviz.reverse_kl_gradient(torch.randn(4), torch.randn(4))).all()
