"""Claims first stated in lesson 01 (Sampling as weighting)."""

from __future__ import annotations

import math

import numpy as np
import torch

import klviz
from klviz import kernel
from klviz.divergences import exact_kl_error_bound

from .exact import mean, rel_gap, sequence_terms
from .families import sequence_policies, token_pairs
from .registry import Evidence, claim


def _longdouble_kl(q_logits: np.ndarray, p_logits: np.ndarray) -> float:
    """KL(softmax(q) || softmax(p)) in 80-bit extended precision (NumPy's longdouble), as log E_q[e^s]
    with s the logit differences centred under q: an independent reference for ``klviz.exact_kl``."""
    q, p = q_logits.astype(np.longdouble), p_logits.astype(np.longdouble)
    lq = q - q.max()
    lq = lq - np.log(np.exp(lq).sum())
    w = np.exp(lq)
    d = p - q
    s = d - (w * d).sum()
    return float(np.log1p((w * (np.expm1(s) - s)).sum()))


@claim(
    "exact-kl-accurate",
    wording="klviz.exact_kl stays accurate in every dtype, also for a tiny KL between nearly equal policies, and is "
    "never negative: from float64 logits its error is at most 1e-12 · KL + 1e-15 · √KL (a relative error of 1e-9 at "
    "a KL of 1e-12); from float32 logits at most 1e-4 relative (rows its float32 arithmetic cannot vouch for are "
    "computed in float64).",
    domain="random token pairs (families.token_pairs: vocabularies 2 to 50,257, all five kinds, logit noise from "
    "1e-8 to 1), the logits given in float32 and in float64; against the same KL in 80-bit arithmetic (NumPy "
    "longdouble)",
    unit="random token pairs",
)
def exact_kl_accurate() -> Evidence:
    cases = token_pairs(1000, seed=7, noise=(1e-8, 1.0))
    worst, where, smallest, worst32 = 0.0, "", math.inf, 0.0
    for case in cases:
        for dtype in (torch.float32, torch.float64):
            ql, pl = case.q_logp.to(dtype), case.p_logp.to(dtype)
            ref = _longdouble_kl(ql.double().numpy(), pl.double().numpy())
            got = float(klviz.exact_kl(ql, pl))
            assert got >= 0, f"exact_kl = {got} < 0 on {case.describe()} ({dtype})"
            tol = exact_kl_error_bound(ref, dtype) + 1e-300
            gap = abs(got - ref) / tol
            assert gap <= 1, f"exact_kl = {got!r} against {ref!r} on {case.describe()} ({dtype})"
            smallest = min(smallest, ref)
            if dtype == torch.float32 and ref > 0:
                worst32 = max(worst32, abs(got - ref) / ref)
            if gap >= worst:
                worst, where = gap, f"{got:.10g} against {ref:.10g} ({dtype}) on {case.describe()}"
    return Evidence(
        2 * len(cases),
        f"largest error {worst:.2f} of the bound: {where}; largest relative error from float32 logits "
        f"{worst32:.2g}; smallest KL checked {smallest:.2g}",
    )


@claim(
    "coverage-2se-tokens",
    wording="A sample mean ± 2 SE covers the exact value in about 95 % of runs only once N is large enough for the "
    "mean to be nearly normal. With k1 on tokens, where a rare token can carry a large log r, N = 4,096 draws is "
    "not enough: the ± 2 SE interval covered the exact KL for only 84 % of random token pairs.",
    domain="random token pairs (families.token_pairs: vocabularies 2 to 50,257, all five kinds), one run of N = 4,096 "
    "draws from q each (seeded), k1 = −log r, the interval mean ± 2 s/√N against the exact KL(q‖p); pairs whose "
    "draws all fell on one token (an SE of 0) left out",
    unit="random token pairs",
)
def coverage_2se_tokens() -> Evidence:
    cases = token_pairs(2000, seed=0)
    gen = torch.Generator().manual_seed(4096)
    n, covered, misses = 0, 0, []
    for case in cases:
        draws = torch.multinomial(case.q, 4096, replacement=True, generator=gen)
        k1 = kernel.k1(case.log_r[draws])
        m, se = float(k1.mean()), float(k1.std()) / math.sqrt(4096)
        if se == 0:  # every draw the same token: no interval
            continue
        n += 1
        hit = abs(m - case.kl()) <= 2 * se
        covered += hit
        if not hit:
            misses.append((abs(m - case.kl()), m, case))
    rate = covered / n
    assert n >= 1000 and round(rate, 2) == 0.84, rate
    _, m, case = max(misses, key=lambda t: t[0])
    return Evidence(
        n,
        f"covered {100 * rate:.1f} %; the farthest miss, a mean of {m:.4g} against KL {case.kl():.4g}, "
        f"on {case.describe()}",
    )


@claim(
    "ess-sharper-costs-more",
    wording="Among samplers that are tempered copies of q itself, a sampler sharper than q by a temperature factor c "
    "always leaves fewer effective samples (Kish's ESS/N = 1/(1 + χ²(q‖μ))) than one flatter by the same factor.",
    domain="q from random token pairs (families.token_pairs: vocabularies 2 to 50,257, every shape of q), factors c "
    "from 1.05 to 4; exact χ²(q‖μ) by summing over the vocabulary in float64",
    unit="random token distributions",
)
def ess_sharper_costs_more() -> Evidence:
    cases = token_pairs(2000, seed=0)
    rng = np.random.default_rng(17)
    worst, where = math.inf, ""
    for case in cases:
        c = float(rng.uniform(1.05, 4.0))
        q_logp = case.q_logp
        ess = {}
        for label, t in (("flatter", c), ("sharper", 1 / c)):
            mu = torch.log_softmax(q_logp / t, -1)
            log_ratio = q_logp - mu  # log q/mu
            ess[label] = 1.0 / float((case.q * log_ratio.exp()).sum())  # 1 / (1 + chi²(q||mu))
        margin = ess["flatter"] - ess["sharper"]
        if case.q.max() > 1 - 1e-12:  # q is (nearly) one token: every tempering is q, nothing to compare
            continue
        assert margin >= -1e-12, (
            f"ESS/N flatter {ess['flatter']} < sharper {ess['sharper']} at c = {c} on {case.describe()}"
        )
        if margin <= worst:
            worst, where = (
                margin,
                f"c = {c:.2f}: {ess['flatter']:.6f} against {ess['sharper']:.6f} on {case.describe()}",
            )
    return Evidence(len(cases), f"smallest advantage of the flatter sampler {worst:.2g} ({where})")


@claim(
    "rao-blackwell-never-worse",
    wording="Summing the exact next-token KL at each sampled prefix (the Rao-Blackwellized estimator) is unbiased for "
    "the sequence KL and never has more variance than summing the sampled tokens' k1.",
    domain="random tabular sequence policies (families.sequence_policies: vocabularies 2 to 4, lengths 2 to 4, every "
    "sequence enumerated), exact means and variances in float64",
    unit="random sequence policies",
)
def rao_blackwell_never_worse() -> Evidence:
    cases = sequence_policies(1000, seed=0)
    worst, where = 0.0, ""
    for case in cases:
        t = sequence_terms(case, case.theta, case.ref)
        w, mc, rb = t["prob"], t["k1"].sum(-1), t["kl_at_prefix"].sum(-1)
        kl = float(case.toy.sequence_kl(case.theta, case.ref))
        for name, est in (("sampled k1", mc), ("Rao-Blackwellized", rb)):
            assert rel_gap(mean(w, est), kl, 1e-9, 1e-13) <= 1, f"{name} is biased on {case.describe()}"
        var_mc = float((w * (mc - kl).square()).sum())
        var_rb = float((w * (rb - kl).square()).sum())
        ratio = var_rb / var_mc if var_mc > 0 else 0.0
        assert var_rb <= var_mc * (1 + 1e-9), f"Var RB {var_rb} > Var MC {var_mc} on {case.describe()}"
        if ratio >= worst:
            worst, where = ratio, case.describe()
    return Evidence(len(cases), f"largest variance ratio Var(RB)/Var(k1 sum) {worst:.3f} ({where})")


@claim(
    "sequence-token-mean",
    wording="Over responses of T tokens, the token mean of k1 estimates the next-token KL averaged over the positions "
    "and over the prefixes the sampler visits, that is the sequence KL divided by T; the per-response sum of k1 "
    "estimates the sequence KL itself.",
    domain="random tabular sequence policies (families.sequence_policies: vocabularies 2 to 4, lengths 2 to 4, every "
    "sequence enumerated), exact means in float64",
    unit="random sequence policies",
)
def sequence_token_mean() -> Evidence:
    cases = sequence_policies(1000, seed=1)
    worst, where = 0.0, ""
    for case in cases:
        t = sequence_terms(case, case.theta, case.ref)
        w, length = t["prob"], case.toy.length
        kl = float(case.toy.sequence_kl(case.theta, case.ref))
        per_position = [mean(w, t["kl_at_prefix"][:, i]) for i in range(length)]
        for name, got, want in (
            ("token mean of k1", mean(w, t["k1"].mean(-1)), kl / length),
            ("average over positions", sum(per_position) / length, kl / length),
            ("sum of k1", mean(w, t["k1"].sum(-1)), kl),
        ):
            gap = rel_gap(got, want, 1e-9, 1e-13)
            assert gap <= 1, f"{name}: {got} against {want} on {case.describe()}"
            if gap >= worst:
                worst, where = gap, f"{name} on {case.describe()}"
    return Evidence(len(cases), f"largest gap {worst:.2f} of the tolerance (1e-9 relative): {where}")


@claim(
    "ratio-corrected-k3",
    wording="Multiplying k3 by the ratio π/π_old (TRL's default use_bias_correction_kl, DeepSeek-V3.2's correction) "
    "makes its average over π_old's tokens equal to KL(π‖π_ref) again, on every minibatch; without the ratio it is "
    "not.",
    domain="random token pairs (π = q, π_ref = p of families.token_pairs, vocabularies 2 to 50,257) with π_old = π "
    "moved by logit noise of scale 0.05 to 1; klviz.frameworks.trl_grpo_kl in float64, every token of the vocabulary",
    unit="random token pairs",
)
def ratio_corrected_k3() -> Evidence:
    from klviz.frameworks import trl_grpo_kl

    cases = token_pairs(2000, seed=2)
    rng = np.random.default_rng(41)
    worst, where, off = 0.0, "", 0
    for case in cases:
        old = torch.log_softmax(
            case.q_logp + float(rng.uniform(0.05, 1.0)) * torch.from_numpy(rng.standard_normal(case.vocab)), -1
        )
        lp, ref = case.q_logp[None], case.p_logp[None]
        ones = torch.ones_like(lp)
        corrected = trl_grpo_kl(lp, ref, ones, old_per_token_logps=old[None])["per_token"][0]
        plain = trl_grpo_kl(lp, ref, ones, use_bias_correction_kl=False)["per_token"][0]
        w_old = old.exp()
        kl = float((case.q * (case.q_logp - case.p_logp)).sum())
        if not bool(((ref - lp).abs() < 700).all()):  # exp(d) would overflow float64: TRL's own k3 is inf there
            continue
        gap = rel_gap(mean(w_old, corrected), kl, 1e-9, 1e-13)
        assert gap <= 1, f"E_old[rho k3] = {mean(w_old, corrected)} against {kl} on {case.describe()}"
        off += rel_gap(mean(w_old, plain), kl, 1e-6, 1e-12) > 1
        if gap >= worst:
            worst, where = gap, case.describe()
    assert off > 0.9 * len(cases)
    return Evidence(
        len(cases),
        f"largest gap {worst:.2f} of the tolerance (1e-9 relative) on {where}; without the ratio the average "
        f"missed KL(π‖π_ref) on {off:,} of {len(cases):,} pairs",
    )
