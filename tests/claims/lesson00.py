"""Claims first stated in lesson 00 (Start here)."""

from __future__ import annotations

import numpy as np
import torch

import klviz
from klviz import kernel
from klviz.divergences import target_favours

from .exact import kl_pq, mean, rel_gap, std
from .families import _log_uniform, token_pairs
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


@claim(
    "direction-rule-scope",
    wording="With tokens drawn from the sampler q and log r = log p(x) − log q(x) (the other policy minus the "
    "sampler), k1 and k3 average exactly to KL(q‖p), the divergence from the sampler. The rule is about k1, k2 and "
    "k3 with this log r: from the same samples, r log r − (r − 1) averages to the other direction, KL(p‖q), and k3 "
    "fed the inverted ratio (log q − log p) averages to χ²(q‖p) − KL(q‖p).",
    domain="random token pairs (families.token_pairs: vocabularies 2 to 50,257, all five kinds), exact sums over the "
    "vocabulary in float64; equal within 1e-9 relative",
    unit="random token pairs",
)
def direction_rule_scope() -> Evidence:
    cases = token_pairs(2000, seed=0)
    worst, where = 0.0, ""
    for case in cases:
        q, u = case.q, case.log_r
        p = case.p_logp.exp()
        kl_qp = float((q * (case.q_logp - case.p_logp)).sum())
        kl_pq_direct = float((p * (case.p_logp - case.q_logp)).sum())
        chi2_qp = float((q * q / p).sum()) - 1.0  # χ²(q‖p) = Σ q²/p − 1
        checks = (
            ("E_q[k1]", mean(q, kernel.k1(u)), kl_qp),
            ("E_q[k3]", mean(q, kernel.k3(u)), kl_qp),
            ("E_q[r log r − (r − 1)]", kl_pq(q, u), kl_pq_direct),
            ("E_q[k3(inverted)]", mean(q, kernel.k3(-u)), chi2_qp - kl_qp),
        )
        for name, got, want in checks:
            gap = rel_gap(got, want, 1e-9, 1e-13)
            assert gap <= 1, f"{name} = {got} against {want} on {case.describe()}"
            if gap >= worst:
                worst, where = gap, f"{name}: {got:.6g} against {want:.6g} on {case.describe()}"
    return Evidence(len(cases), f"largest gap, {worst:.2f} of the tolerance: {where}")


@claim(
    "framework-k3-first-minibatch",
    wording="verl's low_var_kl, TRL's GRPO per_token_kl (ratio correction off), OpenRLHF's k3 and NeMo-RL's k3 all "
    "compute k3 = (r − 1) − log r with log r = ref_logprob − logprob, up to their clamps: averaged over tokens the "
    "current policy π sampled, they equal KL(π‖π_ref). That holds on the first minibatch of a PPO/GRPO step only: "
    "later minibatches score π_old's tokens, where a penalty of logprob − ref_logprob (k1) averages to "
    "KL(π_old‖π_ref) − KL(π_old‖π), not KL(π‖π_ref).",
    domain="random token pairs (π = q, π_ref = p of families.token_pairs, vocabularies 2 to 50,257) with π_old = π "
    "moved by logit noise of scale 0.05 to 1; the framework models of klviz.frameworks in float64 (each checked "
    "against its upstream code in tests/test_frameworks.py); every token of the vocabulary",
    unit="random token pairs",
)
def framework_k3_first_minibatch() -> Evidence:
    from klviz import frameworks as fw

    cases = token_pairs(2000, seed=0)
    rng = np.random.default_rng(40)
    worst, where, clamped = 0.0, "", 0
    for case in cases:
        lp, ref = case.q_logp[None], case.p_logp[None]  # one row: every token of the vocabulary
        ones = torch.ones_like(lp)
        k3 = kernel.k3(ref - lp)
        models = {
            "verl low_var_kl": fw.verl_kl_penalty(lp, ref, "low_var_kl"),
            "TRL GRPO": fw.trl_grpo_kl(lp, ref, ones, use_bias_correction_kl=False)["per_token"],
            "OpenRLHF k3": fw.openrlhf_compute_approx_kl(lp, ref, "k3", float32=False),
            "NeMo-RL k3": fw.nemo_rl_calculate_kl(lp, ref, "k3"),
        }
        free = ((ref - lp).abs() <= 20) & (k3 <= 10)  # no framework's clamp acts there
        for name, values in models.items():
            tol = 4e-16 * (1 + (ref - lp).exp() + (ref - lp).abs())  # exp(d) - d - 1 in float64
            off = float(((values - k3).abs() / tol)[free].max())
            assert off <= 1, f"{name} differs from k3 on {case.describe()}"
        pi = case.q
        if bool(free.all()):
            kl = float((pi * (case.q_logp - case.p_logp)).sum())
            for name, values in models.items():
                gap = rel_gap(mean(pi, values[0]), kl, 1e-9, 1e-13)
                assert gap <= 1, f"E_pi[{name}] = {mean(pi, values[0])} against KL(pi||ref) = {kl} on {case.describe()}"
                if gap >= worst:
                    worst, where = gap, f"E_pi[{name}] on {case.describe()}"
        else:
            clamped += 1
        # a later minibatch: the tokens come from pi_old
        noise = _log_uniform(rng, 0.05, 1.0) * torch.from_numpy(rng.standard_normal(case.vocab))
        old = torch.log_softmax(case.q_logp + noise, -1)
        w_old = old.exp()
        k1_old = mean(w_old, fw.verl_kl_penalty(lp, ref, "k1")[0])
        want = float((w_old * (old - case.p_logp)).sum() - (w_old * (old - case.q_logp)).sum())
        assert rel_gap(k1_old, want, 1e-9, 1e-12) <= 1, f"E_old[k1 penalty] on {case.describe()}"
    return Evidence(
        len(cases),
        f"per-token values equal k3 wherever no clamp acts ({clamped} pairs have a token a clamp changes, "
        f"their mean is not compared); largest gap of a mean, {worst:.2f} of the tolerance: {where}",
    )


@claim(
    "k1-negative-one-push",
    wording="k1 is negative exactly on the tokens p likes more than q, so the fraction of draws with k1 < 0 is "
    "P_q(p > q). A change concentrated on one token makes it that token's q when the token is pushed up, and "
    "1 − q(token) when it is pushed down (every other token then gains).",
    domain="random token pairs of the push-up and push-down kinds (families.token_pairs: vocabularies 2 to 50,257, "
    "pushes 0.01 to 3 in either direction), float64; log-ratios within rounding of 0 "
    "(klviz.divergences.log_ratio_tolerance) count as 0",
    unit="random token pairs",
)
def k1_negative_one_push() -> Evidence:
    cases = token_pairs(2000, seed=5, kinds=("push-up", "push-down"))
    worst, where = 0.0, ""
    for case in cases:
        q, p = case.q, case.p_logp.exp()
        favoured = target_favours(q, p)
        frac = float(q[favoured].sum())
        # the pushed token gains the most log-ratio when pushed up, loses the most when pushed down
        moved = int(case.log_r.argmax()) if case.kind == "push-up" else int(case.log_r.argmin())
        want = float(q[moved]) if case.kind == "push-up" else 1.0 - float(q[moved])
        assert bool((kernel.k1(case.log_r)[favoured] < 0).all()), f"k1 >= 0 where p > q on {case.describe()}"
        gap = abs(frac - want)
        assert gap <= 1e-12, f"P_q(p > q) = {frac} against {want} on {case.describe()}"
        if gap >= worst:
            worst, where = gap, f"P_q(p > q) = {frac:.6g} against {want:.6g} on {case.describe()}"
    return Evidence(len(cases), f"largest difference {worst:.2g}: {where}")


@claim(
    "k1-negative-diffuse",
    wording="For a diffuse change (a little noise on every logit) P_q(p > q), the fraction of draws with k1 < 0, "
    "is typically near one half: median 0.48 over random token pairs, with the middle 90 % between 0.27 and 0.68; "
    "for a single pair it can be anywhere between 0 and 1.",
    domain="random token pairs of the logit-noise kind (families.token_pairs: vocabularies 2 to 50,257, noise "
    "0.001 to 1 on every logit), float64",
    unit="random token pairs",
)
def k1_negative_diffuse() -> Evidence:
    cases = token_pairs(2000, seed=3, kinds=("logit-noise",))
    fractions = np.array([float(c.q[target_favours(c.q, c.p_logp.exp())].sum()) for c in cases])
    lo, med, hi = np.percentile(fractions, [5, 50, 95])
    assert round(float(med), 2) == 0.48 and round(float(lo), 2) == 0.27 and round(float(hi), 2) == 0.68, (lo, med, hi)
    i, j = int(fractions.argmin()), int(fractions.argmax())
    return Evidence(
        len(cases),
        f"median {med:.3f}, 5th and 95th percentiles {lo:.3f} and {hi:.3f}; extremes {fractions[i]:.3f} "
        f"({cases[i].describe()}) and {fractions[j]:.3f} ({cases[j].describe()})",
    )


@claim(
    "gap-less-spread-near-one",
    wording="While |log r| ≤ 1 on every token q can draw, k3 = (r − 1) − log r has a smaller spread than k1 = −log r "
    "(at most 0.72 of it), and likewise r log r − (r − 1) than r log r for KL(p‖q). Closeness must hold on every "
    "token, rare ones included: one rare token with a larger |log r| can reverse the order at a tiny KL.",
    domain="random token pairs (families.token_pairs, all five kinds, vocabularies 2 to 50,257) whose |log r| ≤ 1 on "
    "every token with q > 0, plus 3,000 random pairs of 2 to 8 tokens drawn to sit near the bound (Dirichlet q, "
    "log-ratios scaled up to 1); exact standard deviations in float64",
    unit="random token pairs",
)
def gap_less_spread_near_one() -> Evidence:
    cases = [c for c in token_pairs(2000, seed=0) if float(c.log_r.abs().max()) <= 1.0]
    rng = np.random.default_rng(11)
    small = []
    for _ in range(3000):  # small vocabularies pushed toward the edge of the domain, where the bound is tight
        v = int(rng.integers(2, 9))
        q = torch.from_numpy(rng.dirichlet(np.full(v, rng.choice([0.05, 0.3, 1.0, 5.0])))).clamp_min(1e-300)
        q = q / q.sum()
        d = torch.from_numpy(rng.uniform(-1, 1, v))
        u = d - torch.log((q * d.exp()).sum())
        u = u / float(u.abs().max()) * float(rng.uniform(0.5, 1.0))  # |log r| up to 1 ...
        u = u - torch.log((q * u.exp()).sum())  # ... renormalised (p sums to 1)
        if float(u.abs().max()) <= 1.0:
            small.append((q, u, f"V = {v}, q = {np.round(q.numpy(), 3).tolist()}"))
    pairs = [(c.q, c.log_r, c.describe()) for c in cases] + small
    worst, where = 0.0, ""
    for q, u, what in pairs:
        for name, plain, gap in (
            ("k3 vs k1", kernel.k1(u), kernel.k3(u)),
            ("r log r - (r - 1) vs r log r", u.exp() * u, kernel.kl_to_target(u)),
        ):
            s_plain, s_gap = std(q, plain), std(q, gap)
            if s_plain == 0:
                continue
            ratio = s_gap / s_plain
            assert ratio < 1, f"{name}: spread ratio {ratio} on {what}"
            if ratio >= worst:
                worst, where = ratio, f"{name}, max |log r| {float(u.abs().max()):.3f}, on {what}"
    assert len(pairs) >= 1000
    return Evidence(len(pairs), f"largest spread ratio {worst:.3f} ({where})")
