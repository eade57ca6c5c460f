"""Claims first stated in lesson 03 (f-divergences and Bregman)."""

from __future__ import annotations

import math

import numpy as np
import torch

from klviz import kernel
from klviz.fdiv import GENERATORS, bregman_gap, f_divergence

from .exact import chi2_pq, kl_pq, mean, rel_gap
from .families import token_pairs
from .registry import Evidence, claim

CONVEX = tuple(name for name, g in GENERATORS.items() if g.convex)  # -log t, t log t, chi2, hellinger


@claim(
    "truncated-sampler",
    wording="E_q[r] is the target's mass on the sampler's support, p(S): 1 when q covers p. When it does not (top-k "
    "or top-p sampling scored against the full reference), E_q[k3] = KL(q‖p) + p(S) − 1, biased low by the "
    "reference's mass outside S, while E_q[k1] is still exactly KL(q‖p).",
    domain="random token pairs (families.token_pairs, all five kinds, vocabularies 2 to 50,257) with q truncated to "
    "its top k tokens (k from 1 to the whole vocabulary) or to a top-p nucleus (p from 0.5 to 1) and renormalised; "
    "exact sums in float64, within 1e-9 relative",
    unit="random token pairs",
)
def truncated_sampler() -> Evidence:
    cases = token_pairs(2000, seed=6)
    rng = np.random.default_rng(31)
    worst, where = 0.0, ""
    for i, case in enumerate(cases):
        order = torch.argsort(case.q, descending=True)
        if i % 2 == 0:
            k = int(rng.integers(1, case.vocab + 1))
        else:
            top_p = float(rng.uniform(0.5, 1.0))
            k = int((torch.cumsum(case.q[order], 0) < top_p).sum()) + 1
        keep = order[: min(k, case.vocab)]
        q_top = torch.zeros_like(case.q)
        q_top[keep] = case.q[keep] / case.q[keep].sum()
        s = q_top > 0
        p = case.p_logp.exp()
        u = case.p_logp[s] - q_top[s].log()
        w = q_top[s]
        mass = float(p[s].sum())
        kl = float((w * (w.log() - case.p_logp[s])).sum())
        for name, got, want in (
            ("E_q[r]", mean(w, u.exp()), mass),
            ("E_q[k3]", mean(w, kernel.k3(u)), kl + mass - 1),
            ("E_q[k1]", mean(w, kernel.k1(u)), kl),
        ):
            gap = rel_gap(got, want, 1e-9, 1e-13)
            assert gap <= 1, f"{name} = {got} against {want} (top {k}) on {case.describe()}"
            if gap >= worst:
                worst, where = gap, f"{name}, top {k} of {case.vocab:,}, on {case.describe()}"
    return Evidence(len(cases), f"largest gap {worst:.2f} of the tolerance: {where}")


@claim(
    "lambda-star-near-one",
    wording="For close policies the best control-variate coefficient λ* is near 1 (k3): if |log r| ≤ δ on every token "
    "q can draw, λ* = E_q[(r − 1) log r]/E_q[(r − 1)²] lies between δ/(e^δ − 1) and δ/(1 − e^−δ) (0.95 to 1.05 at "
    "δ = 0.1).",
    domain="random token pairs (families.token_pairs, all five kinds, vocabularies 2 to 50,257), δ their largest "
    "|log r| on q's support (every δ found, up to 33), exact sums in float64",
    unit="random token pairs",
)
def lambda_star_near_one() -> Evidence:
    cases = token_pairs(2000, seed=0)
    tightest, where = math.inf, ""
    n = 0
    for case in cases:
        u = case.log_r
        delta = float(u.abs().max())
        if delta == 0 or delta > 700:
            continue
        n += 1
        q = case.q
        lam = mean(q, torch.expm1(u) * u) / chi2_pq(q, u)
        lo, hi = delta / math.expm1(delta), delta / -math.expm1(-delta)
        assert lo * (1 - 1e-9) <= lam <= hi * (1 + 1e-9), f"λ* = {lam} outside [{lo}, {hi}] on {case.describe()}"
        room = min(lam - lo, hi - lam) / (hi - lo)
        if room < tightest:
            tightest, where = room, f"λ* = {lam:.6g} in [{lo:.6g}, {hi:.6g}] on {case.describe()}"
    return Evidence(n, f"closest to an end of its interval ({100 * tightest:.2g} % of its width from it): {where}")


@claim(
    "second-order-match",
    wording="E_q[k2], KL(q‖p) and KL(p‖q) all equal ½χ²(p‖q) to second order: if |log r| ≤ δ ≤ 1 on every token q "
    "can draw, each lies within a factor 1 ± 1.5δ of ½χ²(p‖q). They part at third order.",
    domain="random token pairs (families.token_pairs, all five kinds, vocabularies 2 to 50,257) whose |log r| ≤ 1 on "
    "q's support, δ their largest |log r|; exact sums in float64",
    unit="random token pairs",
)
def second_order_match() -> Evidence:
    cases = [c for c in token_pairs(2000, seed=0) if 0 < float(c.log_r.abs().max()) <= 1.0]
    worst, where = 0.0, ""
    for case in cases:
        q, u = case.q, case.log_r
        delta = float(u.abs().max())
        half_chi2 = chi2_pq(q, u) / 2
        for name, value in (
            ("E_q[k2]", mean(q, kernel.k2(u))),
            ("KL(q‖p)", mean(q, kernel.k3(u))),
            ("KL(p‖q)", kl_pq(q, u)),
        ):
            ratio = abs(value / half_chi2 - 1) / delta
            assert ratio <= 1.5 + 1e-6, f"{name}/(χ²/2) - 1 = {ratio * delta} at δ = {delta} on {case.describe()}"
            if ratio >= worst:
                worst, where = ratio, f"{name}, δ = {delta:.3g}, on {case.describe()}"
    assert len(cases) >= 1000
    return Evidence(len(cases), f"largest |ratio − 1|/δ {worst:.3f} ({where})")


def _merge(v: torch.Tensor, i: int, j: int) -> torch.Tensor:
    keep = [k for k in range(v.numel()) if k not in (i, j)]
    return torch.cat([v[keep], (v[i] + v[j]).reshape(1)])


@claim(
    "merging-cannot-grow-f-divergence",
    wording="A true f-divergence (convex f) cannot grow when two outcomes are merged (the data-processing inequality): "
    "both KLs, χ² and the squared Hellinger distance only stay or shrink. E_q[k2], whose ½(log t)² is concave "
    "beyond t = e, is not bound by it and can grow.",
    domain="random token pairs (families.token_pairs, all five kinds, vocabularies 2 to 2,000) with two random tokens "
    "merged; f = −log t, t log t, (t − 1)², (√t − 1)²; exact sums in float64, equal allowed within the rounding of "
    "the merged probabilities",
    unit="random token pairs",
)
def merging_cannot_grow_f_divergence() -> Evidence:
    cases = token_pairs(2000, seed=8, vocab=(3, 2000))
    rng = np.random.default_rng(37)
    worst, where, k2_grew = -math.inf, "", 0
    for case in cases:
        i, j = (int(x) for x in rng.choice(case.vocab, 2, replace=False))
        q, p = case.q, case.p_logp.exp()
        qm, pm = _merge(q, i, j), _merge(p, i, j)
        # adding two probabilities rounds the merged ones by an ulp: D_f may move by that much, no more
        rounding = 4 * torch.finfo(torch.float64).eps * float(q[i] + q[j] + p[i] + p[j])
        for name in CONVEX:
            before, after = float(f_divergence(name, q, p)), float(f_divergence(name, qm, pm))
            growth = (after - before) / max(before, 1e-300)
            assert after <= before * (1 + 1e-12) + rounding, (
                f"{name} grew from {before} to {after} on {case.describe()}"
            )
            if growth >= worst:
                worst, where = growth, f"{name} on {case.describe()}"
        k2_grew += float(f_divergence("k2", qm, pm)) > float(f_divergence("k2", q, p)) * (1 + 1e-9)
    return Evidence(
        len(cases),
        f"closest to growing: a change of {worst:.2g} relative ({where}); E_q[k2] grew on {k2_grew} of the merges",
    )


@claim(
    "bregman-gap-nonnegative-unbiased",
    wording="For any convex f with f(1) = 0, the Bregman gap f(r) − f′(1)(r − 1) is never negative and averages over "
    "q's samples to D_f(p‖q) = E_q[f(r)]: −log t gives k3 for KL(q‖p), t log t gives r log r − (r − 1) for KL(p‖q).",
    domain="random token pairs (families.token_pairs, all five kinds, vocabularies 2 to 50,257), every token, f = −log "
    "t, t log t, (t − 1)², (√t − 1)² (klviz.fdiv.bregman_gap), exact sums in float64 within 1e-9 relative",
    unit="random token pairs",
)
def bregman_gap_nonnegative_unbiased() -> Evidence:
    cases = token_pairs(2000, seed=1)
    worst, where, lowest = 0.0, "", math.inf
    for case in cases:
        q, u = case.q, case.log_r
        p = case.p_logp.exp()
        for name in CONVEX:
            gap = bregman_gap(name, u)
            low = float(gap.min())
            assert low >= 0, f"{name}: gap {low} < 0 on {case.describe()}"
            lowest = min(lowest, low)
            d_f = float(f_divergence(name, q, p))
            g = rel_gap(mean(q, gap), d_f, 1e-9, 1e-13)
            assert g <= 1, f"{name}: E_q[gap] = {mean(q, gap)} against D_f = {d_f} on {case.describe()}"
            if g >= worst:
                worst, where = g, f"{name} on {case.describe()}"
    return Evidence(
        len(cases), f"largest gap of a mean {worst:.2f} of the tolerance ({where}); smallest value {lowest:.2g}"
    )
