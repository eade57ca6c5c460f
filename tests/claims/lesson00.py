"""Claims first stated in lesson 00 (Start here)."""

from __future__ import annotations

import torch

import klviz

from .families import token_pairs
from .registry import Evidence, claim


@claim(
    "k2-k3-never-negative",
    wording="k2 = ½(log r)² and k3 = (r − 1) − log r are never negative, for every token and every pair of "
    "distributions, in float64 and in float32.",
    domain="random token pairs (families.token_pairs: vocabularies 2 to 50,257; logit noise, one token pushed up or "
    "down, sharpened or flattened p, p mixed with uniform), every token of each vocabulary, float64 and float32",
    unit="random token pairs",
)
def k2_k3_never_negative() -> Evidence:
    cases = token_pairs(2000, seed=0)
    worst, where = float("inf"), ""
    for case in cases:
        for dtype in (torch.float64, torch.float32):
            log_r = case.log_r.to(dtype)
            for name, fn in (("k2", klviz.k2), ("k3", klviz.k3)):
                values = fn(log_r)
                low = float(values.min())
                assert low >= 0, f"{name} = {low} < 0 on {case.describe()} ({dtype})"
                if low < worst:
                    worst, where = low, f"{name} = {low:.3g} ({dtype}) on {case.describe()}"
    return Evidence(len(cases), f"smallest value found: {where}")


@claim(
    "k1-k3-unbiased-on-tokens",
    wording="k1 and k3 are unbiased: their exact means over tokens drawn from q equal KL(q‖p).",
    domain="random token pairs (families.token_pairs, vocabularies 2 to 50,257, all five kinds), exact sums over "
    "the vocabulary in float64; equal to float64 rounding: within 1e-9 of the KL plus 1e-13",
    unit="random token pairs",
)
def k1_k3_unbiased_on_tokens() -> Evidence:
    cases = token_pairs(2000, seed=1)
    worst, where = 0.0, ""
    for case in cases:
        q, log_r = case.q, case.log_r
        kl = float((q * -log_r).sum())
        for name, fn in (("k1", klviz.k1), ("k3", klviz.k3)):
            mean = float((q * fn(log_r)).sum())
            gap = abs(mean - kl)
            assert gap <= 1e-9 * kl + 1e-13, f"E_q[{name}] = {mean} against KL {kl} on {case.describe()}"
            if gap / (1e-9 * kl + 1e-13) >= worst:
                worst = gap / (1e-9 * kl + 1e-13)
                where = f"|E_q[{name}] − KL| = {gap:.2g} at KL {kl:.3g} on {case.describe()}"
    return Evidence(len(cases), f"largest gap relative to the tolerance ({worst:.2f} of it): {where}")
