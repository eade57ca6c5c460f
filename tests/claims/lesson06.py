"""Claims first stated in lesson 06 (Pitfalls, and the KL of your own rollouts)."""

from __future__ import annotations

import math
import string

import numpy as np
import torch

import klviz
from klviz import pitfalls as pf

from .batches import one_thread, random_batches
from .families import token_pairs
from .registry import Evidence, claim


@claim(
    "inverted-ratio-measures-chi2-minus-kl",
    wording="With tokens from q and the ratio written the wrong way up, r' = q/p, the mean of k3 = (r' − 1) − log r' "
    "is "
    "χ²(q‖p) − KL(q‖p), not KL(q‖p), for every pair of token distributions.",
    domain="random token pairs (families.token_pairs, vocabularies 2 to 50,257, all five kinds), exact sums over the "
    "vocabulary in float64, to 1e-9 of the larger side plus 1e-13",
    unit="random token pairs",
)
@one_thread
def inverted_ratio() -> Evidence:
    cases = token_pairs(1000, seed=61)
    worst, where = 0.0, ""
    for c in cases:
        q, lr = c.q, c.log_r  # log r = log p - log q
        inverted = float((q * klviz.k3(-lr)).sum())  # k3 of log(q/p)
        chi2 = float((q * torch.expm1(-lr)).sum())  # E_q[q/p] - 1
        kl = float((q * -lr).sum())
        tol = 1e-9 * max(abs(inverted), abs(chi2 - kl)) + 1e-13
        gap = abs(inverted - (chi2 - kl))
        assert gap <= tol, f"{inverted} vs {chi2 - kl} on {c.describe()}"
        if gap / tol > worst:
            worst, where = gap / tol, c.describe()
    return Evidence(len(cases), f"largest gap {worst:.2f} of the tolerance, on {where}")


@claim(
    "cov-log-r-and-r-is-positive",
    wording="Cov_q[log r, r − 1] is never negative (log r and r − 1 both increase with r); what is negatively "
    "correlated is "
    "r − 1 and −log r, the two terms k3 adds.",
    domain="random token pairs (families.token_pairs, vocabularies 2 to 50,257, all five kinds), exact moments over "
    "the "
    "vocabulary in float64",
    unit="random token pairs",
)
@one_thread
def cov_positive() -> Evidence:
    cases = token_pairs(1000, seed=62)
    smallest, where = math.inf, ""
    for c in cases:
        q, lr = c.q, c.log_r
        a, b = lr - (q * lr).sum(), torch.expm1(lr) - (q * torch.expm1(lr)).sum()
        cov = float((q * a * b).sum())
        scale = float((q * a * a).sum()) ** 0.5 * float((q * b * b).sum()) ** 0.5
        assert cov >= -1e-12 * scale, f"Cov = {cov} on {c.describe()}"
        if cov / max(scale, 1e-300) < smallest:
            smallest, where = cov / max(scale, 1e-300), c.describe()
    return Evidence(len(cases), f"smallest correlation found: {smallest:.4f} on {where}")


@claim(
    "clamps-only-lower-k3",
    wording="An output clamp at 10 can only lower k3, so a clamped k3 (verl's low_var_kl, OpenRLHF, NeMo-RL) never "
    "averages "
    "above the KL: it is biased downwards, by exactly the mass its clamped tokens carry beyond 10.",
    domain="random token pairs (families.token_pairs, vocabularies 2 to 50,257, all five kinds) plus the same pairs "
    "with p "
    "sharpened 3×, exact sums in float64 of klviz.kl_penalty(..., 'low_var_kl')",
    unit="random token pairs",
)
@one_thread
def clamps_lower_k3() -> Evidence:
    cases = token_pairs(1000, seed=63)
    hit = 0
    for c in cases:
        for p_logp in (c.p_logp, torch.log_softmax(3 * c.p_logp, -1)):
            lr = p_logp - c.q_logp
            kl = float((c.q * -lr).sum())
            clamped = float((c.q * klviz.kl_penalty(c.q_logp, p_logp, "low_var_kl")).sum())
            excess = float((c.q * (klviz.k3(lr) - 10).clamp_min(0)).sum())
            assert clamped <= kl + 1e-12 * max(1.0, kl), c.describe()
            assert abs((kl - clamped) - excess) <= 1e-9 * max(1.0, kl), c.describe()
            hit += excess > 0
    assert hit > 0, "no pair in the domain reaches the clamp"
    return Evidence(len(cases), f"{hit} of {2 * len(cases)} pairs reach the clamp; none averages above the KL")


@claim(
    "rounding-noise-biases-k2-and-k3-upwards",
    wording="Scored twice, in float32 and from bf16-rounded logits, identical weights give k2 = ½e² per token (e the "
    "log-prob error) and a k3 that is never negative: their batch means are positive where the true KL is 0.",
    domain="random logits (1,000 cases: vocabularies 2 to 32,000, 1-64 positions, Zipf or Gaussian logits of scale "
    "0.3-3 "
    "plus an offset up to 20), the sampled token's log-prob through klviz.pitfalls.logprobs_in_precision",
    unit="random logit batches",
)
@one_thread
def rounding_noise() -> Evidence:
    rng = np.random.default_rng(64)
    smallest = math.inf
    for i in range(1000):
        v = int(round(math.exp(rng.uniform(math.log(2), math.log(32_000)))))
        n = int(rng.integers(1, 65))
        logits = torch.from_numpy(rng.uniform(0.3, 3.0) * rng.standard_normal((n, v)) + rng.uniform(0, 20))
        toks = torch.from_numpy(rng.integers(0, v, size=n))
        lp32 = pf.logprobs_in_precision(logits, toks, "float32")
        lp16 = pf.logprobs_in_precision(logits, toks, "bfloat16 logits")
        e = lp16 - lp32
        assert torch.allclose(klviz.k2(e), 0.5 * e**2, rtol=1e-12, atol=0)
        k3 = klviz.k3(e)
        assert float(k3.min()) >= 0
        if bool((e != 0).any()):
            assert float(k3.mean()) > 0 and float(klviz.k2(e).mean()) > 0, f"case {i}"
            smallest = min(smallest, float(k3.mean()))
    return Evidence(1000, f"smallest positive k3 batch mean between identical models: {smallest:.2g}")


@claim(
    "k1-on-old-tokens-is-a-difference-of-kls",
    wording="On tokens drawn by π_old, the mean of log π_θ − log π_ref is KL(π_old‖π_ref) − KL(π_old‖π_θ): no KL of "
    "π_θ, "
    "and negative once π_θ has moved further from π_old than π_old is from π_ref; with ρ = π_θ/π_old, ρ·k1 and ρ·k3 "
    "average "
    "to KL(π_θ‖π_ref).",
    domain="random token triples (π_θ, π_ref from families.token_pairs, vocabularies 2 to 50,257; π_old = π_θ's logits "
    "plus noise of scale 0.05-1), exact sums through klviz.pitfalls.off_policy_expectations in float64",
    unit="random token triples",
)
@one_thread
def k1_off_policy() -> Evidence:
    from .lesson05 import _triples

    cases = _triples(1000, seed=65)
    negative = 0
    for th, old, ref, what in cases:
        e = pf.off_policy_expectations(old, th, ref)
        tol = 1e-9 * max(1.0, e["KL(old||ref)"], e["KL(old||theta)"], e["KL(theta||ref)"])
        assert abs(e["k1"] - (e["KL(old||ref)"] - e["KL(old||theta)"])) <= tol, what
        assert abs(e["rho*k1"] - e["KL(theta||ref)"]) <= tol and abs(e["rho*k3"] - e["KL(theta||ref)"]) <= tol, what
        negative += e["k1"] < 0
        if e["KL(old||theta)"] > e["KL(old||ref)"]:
            assert e["k1"] < 0
    return Evidence(len(cases), f"the naive k1 mean was negative in {negative} of {len(cases)} triples")


@claim(
    "aggregation-weights",
    wording="token-mean gives every counted token the weight 1/ΣL, seq-mean-token-mean gives a token of a response of "
    "length L the weight 1/(B·L) (short responses weigh more per token), seq-mean-token-sum 1/B (a sequence KL, nats "
    "per "
    "response).",
    domain="random batches (batches.random_batches, no empty row, batch 1-8, length 1-24), k3 of each, klviz.agg_loss "
    "against klviz.pitfalls.aggregation_weights in float64",
    unit="random batches",
)
@one_thread
def aggregation_weights() -> Evidence:
    cases = random_batches(1000, seed=66, empty_rows=False)
    for c in cases:
        vals = klviz.k3(c.ref - c.logprob) * c.mask
        for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"):
            w = pf.aggregation_weights(c.mask.sum(-1), mode)
            by_weights = float((vals * w[:, None]).sum())
            got = float(klviz.agg_loss(vals, c.mask, mode))
            assert abs(by_weights - got) <= 1e-9 * max(1.0, abs(got)), (mode, c.describe())
    return Evidence(len(cases), "all three modes equal to the weighted sums on every batch")


@claim(
    "mixture-sampling-needs-weights",
    wording="If a fraction α of the tokens is drawn from p instead of q, the plain mean of k3 is (1 − α)·KL(q‖p) + "
    "α·(χ²(p‖q) − KL(p‖q)); weighting every token by q/m, m = (1 − α)q + αp, restores KL(q‖p) exactly.",
    domain="random token pairs (families.token_pairs, vocabularies 2 to 50,257, all five kinds) × α in {0.05, 0.25, "
    "0.5, "
    "0.9}, exact sums over the vocabulary in float64",
    unit="random token pairs",
)
@one_thread
def mixture_needs_weights() -> Evidence:
    cases = token_pairs(1000, seed=67)
    worst = 0.0
    for c in cases:
        q, p, lr = c.q, c.p_logp.exp(), c.log_r
        k3 = klviz.k3(lr)  # k3 of log p/q, the estimator as written for tokens from q
        kl_qp, kl_pq = float((q * -lr).sum()), float((p * lr).sum())
        chi2_pq = float((p * torch.expm1(lr)).sum())
        for a in (0.05, 0.25, 0.5, 0.9):
            m = (1 - a) * q + a * p
            naive = float((m * k3).sum())
            want = (1 - a) * kl_qp + a * (chi2_pq - kl_pq)
            weighted = float((m * (q / m) * k3).sum())
            tol = 1e-9 * max(1.0, abs(want)) + 1e-12
            assert abs(naive - want) <= tol and abs(weighted - kl_qp) <= 1e-9 * max(1.0, kl_qp) + 1e-12, c.describe()
            worst = max(worst, abs(naive - want) / tol)
    return Evidence(len(cases), f"largest gap {worst:.2f} of the tolerance")


@claim(
    "unknown-estimator-names-raise",
    wording="klviz refuses an estimator name it does not know, naming the argument, instead of falling through to a "
    "default.",
    domain="1,000 names: misspellings of every kind of klviz.kl_penalty (a letter dropped, doubled, swapped or "
    "changed, "
    "a '-' for a '_', another case) and random strings",
    unit="names",
)
def unknown_names_raise() -> Evidence:
    from klviz.estimators import KL_PENALTY_KINDS

    kinds = tuple(KL_PENALTY_KINDS) + tuple(k + "+" for k in KL_PENALTY_KINDS)
    rng = np.random.default_rng(68)
    names: set[str] = set()
    while len(names) < 1000:
        k = str(rng.choice(kinds))
        op = int(rng.integers(6))
        i = int(rng.integers(len(k)))
        if op == 0:
            n = k[:i] + k[i + 1 :]
        elif op == 1:
            n = k[:i] + k[i] + k[i:]
        elif op == 2 and len(k) > 1:
            j = min(i + 1, len(k) - 1)
            n = k[:i] + k[j] + k[i] + k[j + 1 :] if j > i else k[::-1]
        elif op == 3:
            n = k[:i] + str(rng.choice(list(string.ascii_lowercase))) + k[i + 1 :]
        elif op == 4:
            n = k.replace("_", "-").upper() if "_" not in k else k.replace("_", "-")
        else:
            n = "".join(rng.choice(list(string.ascii_letters + "_+-"), size=int(rng.integers(1, 12))))
        if n not in kinds:
            names.add(n)
    x, y = torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -1.0])
    for n in sorted(names):
        try:
            klviz.kl_penalty(x, y, n)
        except ValueError as err:
            assert "kind" in str(err), f"{n!r}: {err}"
        else:
            raise AssertionError(f"{n!r} was accepted")
    return Evidence(len(names), "every name refused with a ValueError naming 'kind'")
