"""Claims first stated in lesson 05 (Gradients: a correct value is not a correct gradient)."""

from __future__ import annotations

import math

import numpy as np
import torch

import klviz
from klviz import frameworks as fw
from klviz.bandit import offpolicy_expected_gradient
from klviz.simplex import CHOICES
from klviz.usage import EstimatorUse

from .batches import one_thread
from .families import sequence_policies, token_pairs
from .registry import Evidence, claim

EPS = float(torch.finfo(torch.float64).eps)

#: what each on-policy use follows in expectation (lesson 05 §1's table)
TABLE = {
    "k1 in loss": "zero",
    "k2 in loss": "reverse",
    "k3 in loss": "forward",
    "k1 in reward": "reverse",
    "k3·ρ in loss": "reverse",
    "k3+ in loss": "reverse",
    "k3 in reward": "reverse - forward",
}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / max(float(b.norm()), 1e-300))


@claim(
    "on-policy-gradient-table",
    wording="On-policy, for one token: k1 in the loss has expected gradient 0; k2 in the loss, k1 in the reward, k3·ρ "
    "and "
    "k3+ have the reverse-KL gradient ∇KL(π‖π_ref); k3 in the loss has the forward-KL gradient ∇KL(π_ref‖π); k3 in the "
    "reward has their difference; k2 in the reward has neither.",
    domain="random token pairs (families.token_pairs, vocabularies 2 to 50,257, all five kinds) as (π, π_ref), exact "
    "sums "
    "over the vocabulary (klviz.expected_kl_gradient) in float64, to 1e-9 of the target's norm plus 4·V·ε (ε = "
    "2.2e-16: "
    "the rounding of a sum over V tokens)",
    unit="random token pairs",
)
@one_thread
def on_policy_gradient_table() -> Evidence:
    cases = token_pairs(1000, seed=51)
    worst, where = 0.0, ""
    k2r_min = math.inf
    for c in cases:
        th, ref = c.q_logp, c.p_logp
        rev, fwd = klviz.reverse_kl_gradient(th, ref), klviz.forward_kl_gradient(th, ref)
        scale = max(float(rev.norm()), float(fwd.norm()), 1e-300)
        rounding = 4 * c.vocab * EPS  # a sum over V terms in float64 can be off by about V·ε
        targets = {"zero": torch.zeros_like(rev), "reverse": rev, "forward": fwd, "reverse - forward": rev - fwd}
        for name, follows in TABLE.items():
            g = klviz.expected_kl_gradient(th, ref, CHOICES[name])
            err = float((g - targets[follows]).norm()) / (1e-9 * scale + rounding)
            assert err < 1, f"{name}: {err:.3g} of the tolerance from {follows} on {c.describe()}"
            if err > worst:
                worst, where = err, f"{name} on {c.describe()}"
        g2 = klviz.expected_kl_gradient(th, ref, CHOICES["k2 in reward"])
        k2r_min = min(k2r_min, min(_rel(g2, rev), _rel(g2, fwd)))
    return Evidence(
        len(cases),
        f"largest distance from the table's target: {worst:.2g} of the tolerance ({where}); k2 in the "
        f"reward came no closer to either target than {k2r_min:.2g} of its norm",
    )


@claim(
    "k2-loss-equals-k1-reward-per-sample",
    wording="For every sampled token, k2 in the loss, k3·ρ and k3+ have the same gradient as k1 in the reward, "
    "k1(x)·∇log π(x); only k3 in the loss differs, with coefficient 1 − r.",
    domain="random token pairs (families.token_pairs, vocabularies 2 to 50,257) as (π, π_ref), every token of every "
    "vocabulary, the per-token coefficients of klviz.gradient_coefficient in float64",
    unit="random token pairs",
)
@one_thread
def per_sample_equality() -> Evidence:
    cases = token_pairs(1000, seed=52)
    worst = 0.0
    for c in cases:
        log_r = c.p_logp - c.q_logp
        base = klviz.gradient_coefficient(log_r, EstimatorUse("k1", "reward"))
        for name in ("k2 in loss", "k3·ρ in loss", "k3+ in loss"):
            got = klviz.gradient_coefficient(log_r, CHOICES[name])
            err = float((got - base).abs().max())
            assert err <= 1e-9 * max(1.0, float(base.abs().max())), f"{name} on {c.describe()}"
            worst = max(worst, err)
        k3 = klviz.gradient_coefficient(log_r, CHOICES["k3 in loss"])
        assert torch.allclose(k3, -torch.expm1(log_r), rtol=1e-12, atol=1e-15)
    return Evidence(len(cases), f"largest difference of coefficients: {worst:.2g}")


@claim(
    "rho-times-clamped-k3-flips-the-push",
    wording="Where verl's clamp at 10 binds on a token the policy crushed (π_ref/π > 13.6), ρ times the clamped k3 "
    "has the "
    "per-token coefficient +10 where the reverse-KL gradient has k1 = −log r < −2.6: it pushes that token down "
    "instead of "
    "up; NeMo-RL's clamp of the product instead gives that token no gradient.",
    domain="log-ratios log r = log π_ref − log π from 2.62 to 60 (2,000 points, log-spaced), per-token autograd in "
    "float64 of "
    "ρ·clamp(k3) (ρ = π/sg(π)) and of fw.nemo_rl_calculate_kl with the same weight",
    unit="log-ratios",
)
@one_thread
def rho_times_clamped_k3() -> Evidence:
    lr = torch.cat([torch.tensor([2.6111]), torch.from_numpy(np.geomspace(2.62, 60.0, 1999))]).double()
    logp = torch.full_like(lr, -25.0).requires_grad_(True)
    ref = logp.detach() + lr
    rho = torch.exp(logp - logp.detach())
    (g_verl,) = torch.autograd.grad((rho * klviz.kl_penalty(logp, ref, "low_var_kl")).sum(), logp)
    logp2 = logp.detach().clone().requires_grad_(True)
    w = torch.exp(logp2 - logp2.detach())
    (g_nemo,) = torch.autograd.grad(
        fw.nemo_rl_calculate_kl(logp2, ref, "k3", importance_sampling_weights=w).sum(), logp2
    )
    k1 = -lr
    assert torch.allclose(g_verl, torch.full_like(g_verl, 10.0)), "coefficient of ρ · clamped k3 is not 10"
    assert bool((k1 < -2.6).all())
    assert bool((g_nemo == 0).all()), "NeMo-RL's clamp of the product left a gradient"
    return Evidence(
        lr.numel(), f"coefficient exactly 10 against k1 from {float(k1.max()):.3f} to {float(k1.min()):.1f}"
    )


@claim(
    "forward-and-reverse-kl-agree-to-second-order",
    wording="KL(π‖π_ref) and KL(π_ref‖π) agree to second order: their relative difference is at most the largest |log "
    "r| "
    "once that is below 0.3, so near π_ref a biased forward-KL term is hard to tell from the reverse one.",
    domain="random token pairs (families.token_pairs, vocabularies 2 to 50,257), p moved towards q along its log-ratio "
    "until the largest |log r| is 0.3 and 0.03; exact sums in float64",
    unit="random token pairs",
)
@one_thread
def forward_reverse_second_order() -> Evidence:
    cases = token_pairs(1000, seed=53)
    worst, where = 0.0, ""
    for c in cases:
        u0 = c.log_r
        if float(u0.abs().max()) == 0:
            continue
        for top in (0.3, 0.03):
            lp = torch.log_softmax(c.q_logp + (top / float(u0.abs().max())) * u0, -1)
            q, p = c.q, lp.exp()
            rev, fwd = float((q * (c.q_logp - lp)).sum()), float((p * (lp - c.q_logp)).sum())
            m = float((lp - c.q_logp).abs().max())
            rel = abs(rev - fwd) / max(rev, 1e-300) / m
            assert rel <= 1.0, f"{rel:.3g} at {top} on {c.describe()}"
            if rel > worst:
                worst, where = rel, f"{top} on {c.describe()}"
    return Evidence(
        len(cases), f"largest |KL − reverse KL| / (KL · max|log r|): {worst:.3f} at largest |log r| {where}"
    )


@claim(
    "token-level-losses-give-the-partial-gradient",
    wording="For sequences, a per-token KL term with the reverse-KL gradient (k2 in the loss, k3+, k1 in the reward "
    "of the "
    "token itself) has the partial gradient Σ_t E[∇KL(π(·|y<t)‖π_ref(·|y<t))] with the prefixes held fixed; k1 in the "
    "reward summed to go, or over the whole sequence, has the full gradient of the sequence KL.",
    domain="tabular sequence policies (families.sequence_policies: vocabulary 2-4, length 2-4), exact sums over every "
    "sequence in float64",
    unit="tabular sequence policies",
)
@one_thread
def token_level_partial() -> Evidence:
    cases = sequence_policies(1000, seed=54)
    worst, gap_min = 0.0, math.inf
    for c in cases:
        toy, th, ref = c.toy, c.theta, c.ref
        partial, full = toy.partial_gradient(th, ref), toy.true_gradient(th, ref)
        scale = float(full.norm())
        for m in ("k2 in loss", "k3+ in loss", "k1 in reward, same token"):
            err = _rel(toy.expected_gradient(th, ref, m), partial)
            assert err < 1e-9, f"{m} on {c.describe()}"
            worst = max(worst, err)
        for m in ("k1 in reward, reward-to-go", "k1 in reward, whole sequence"):
            err = float((toy.expected_gradient(th, ref, m) - full).norm()) / scale
            assert err < 1e-9, f"{m} on {c.describe()}"
            worst = max(worst, err)
        gap_min = min(gap_min, float((partial - full).norm()) / scale)
    return Evidence(
        len(cases), f"largest error {worst:.2g}; the partial gradient never closer than {gap_min:.2g} of the full"
    )


def _triples(n: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, str]]:
    """(π_θ, π_old, π_ref) logits: π_θ and π_ref from a token pair, π_old = π_θ's logits plus noise of scale 0.05-1."""
    rng = np.random.default_rng(seed)
    out = []
    for c in token_pairs(n, seed=seed):
        s = math.exp(rng.uniform(math.log(0.05), math.log(1.0)))
        old = c.q_logp + s * torch.from_numpy(rng.standard_normal(c.vocab))
        out.append((c.q_logp, old, c.p_logp, f"{c.describe()}, π_old = π_θ + noise {s:.2g}"))
    return out


@claim(
    "importance-weights-repair-one-token-offpolicy",
    wording="Off-policy (a token drawn by π_old), k2 and k3+ in the loss with the detached weight π_θ/π_old, k3 and k1 "
    "times ρ = π_θ/sg(π_old), and k1 in the reward recomputed at π_θ with a detached weight have the reverse-KL "
    "gradient "
    "exactly; the KL reward frozen at rollout with the advantage times ρ (PPO) is off by −∇KL(π_θ‖π_old); k1 as a "
    "loss has "
    "π_old − π_θ = −∇KL(π_old‖π_θ), gradient ascent on KL(π_old‖π_θ).",
    domain="random token triples (π_θ and π_ref from families.token_pairs, vocabularies 2 to 50,257; π_old = π_θ's "
    "logits "
    "plus noise of scale 0.05-1), exact sums over the vocabulary (klviz.bandit.offpolicy_expected_gradient) in "
    "float64, "
    "to 1e-9 of the target's norm plus 4·V·ε of rounding",
    unit="random token triples",
)
@one_thread
def offpolicy_one_token() -> Evidence:
    cases = _triples(1000, seed=55)
    worst = 0.0
    for th, old, ref, what in cases:
        target = klviz.reverse_kl_gradient(th, ref)
        scale = float(target.norm()) + 4e9 * th.numel() * EPS  # 1e-9 of the norm, and 4·V·ε of rounding
        exact = (
            ("k2 in loss", "detached"),
            ("k3+ in loss", "detached"),
            (EstimatorUse("k3", "loss", "rho"), "none"),
            (EstimatorUse("k1", "loss", "rho"), "none"),
            ("k1 in reward", "detached"),
        )
        for use, imp in exact:
            err = float((offpolicy_expected_gradient(th, old, ref, use, imp) - target).norm()) / scale
            assert err < 1e-9, f"{use}, {imp}: {err:.3g} on {what}"
            worst = max(worst, err)
        frozen = offpolicy_expected_gradient(th, old, ref, "k1·ρ in reward", reward_values="rollout")
        err = float((frozen - (target - klviz.reverse_kl_gradient(th, old))).norm()) / scale
        assert err < 1e-9, f"frozen reward on {what}"
        k1 = offpolicy_expected_gradient(th, old, ref, "k1 in loss")
        diff = torch.softmax(old, -1) - torch.softmax(th, -1)
        assert float((k1 - diff).abs().max()) < 1e-12 and torch.allclose(
            k1, -klviz.forward_kl_gradient(th, old), atol=1e-12
        ), f"k1 as a loss on {what}"
    return Evidence(len(cases), f"largest error {worst:.2g} of the gradient's norm")


@claim(
    "per-token-rho-is-the-partial-gradient-at-old-prefixes",
    wording="For whole responses drawn by π_old, k3 times the per-token ratio ρ_t = π_θ/π_old (TRL's "
    "use_bias_correction_kl) has the expected gradient Σ_t E_{y<t~π_old}[∇KL(π_θ(·|y<t)‖π_ref(·|y<t))] and the mean "
    "value "
    "Σ_t E_{y<t~π_old}[KL(π_θ(·|y<t)‖π_ref(·|y<t))]: the per-position KLs at π_old's prefixes, not the sequence KL; "
    "detaching the product of the earlier ratios gives the same at π_θ's prefixes.",
    domain="tabular sequence policies (families.sequence_policies: vocabulary 2-4, length 2-4, π_old = π_θ plus "
    "noise), "
    "exact sums over every sequence in float64",
    unit="tabular sequence policies",
)
@one_thread
def per_token_rho_partial() -> Evidence:
    cases = sequence_policies(1000, seed=56)
    worst, far = 0.0, math.inf
    for c in cases:
        toy, th, ref, old = c.toy, c.theta, c.ref, c.old
        p_old = toy.partial_gradient(th, ref, prefix_logits=old)
        g = toy.offpolicy_gradient(th, ref, old, "k3", "per-token ρ")
        err = _rel(g, p_old)
        assert err < 1e-9, f"per-token ρ on {c.describe()}"
        # the mean value: per-position KLs at the old prefixes
        seq_p = toy.sequence_probs(old)
        logp, logq = torch.log_softmax(th, -1), torch.log_softmax(ref, -1)
        per_prefix = (logp.exp() * (logp - logq)).sum(-1)
        want = float((seq_p[:, None] * per_prefix[toy.prefix_index]).sum())
        got = toy.offpolicy_value(th, ref, old, "k3", "per-token ρ")
        assert abs(got - want) <= 1e-10 * max(1.0, want), f"value on {c.describe()}"
        g2 = toy.offpolicy_gradient(th, ref, old, "k3", "prefix product, prefix detached")
        assert _rel(g2, toy.partial_gradient(th, ref)) < 1e-9, f"detached prefix on {c.describe()}"
        worst = max(worst, err)
        far = min(far, _rel(g, toy.true_gradient(th, ref)))
    return Evidence(
        len(cases),
        f"largest error {worst:.2g}; per-token ρ never came closer to the sequence gradient than {far:.2g} of its norm",
    )


@claim(
    "prefix-product-weights-are-exact",
    wording="For whole responses drawn by π_old, weighting token t's k3 (or k1) by the prefix product Π_{u≤t} ρ_u, "
    "differentiated through every ratio, gives exactly the sequence KL(π_θ‖π_ref) in mean value and its gradient, "
    "off-policy and on-policy alike.",
    domain="tabular sequence policies (families.sequence_policies: vocabulary 2-4, length 2-4; π_old = π_θ plus "
    "noise, and "
    "π_old = π_θ), k1 and k3, exact sums over every sequence in float64",
    unit="tabular sequence policies",
)
@one_thread
def prefix_product_exact() -> Evidence:
    cases = sequence_policies(1000, seed=57)
    worst = 0.0
    for c in cases:
        toy, th, ref = c.toy, c.theta, c.ref
        kl, grad = float(toy.sequence_kl(th, ref)), toy.true_gradient(th, ref)
        for old in (c.old, th):
            for est in ("k3", "k1"):
                v = toy.offpolicy_value(th, ref, old, est, "prefix product")
                g = toy.offpolicy_gradient(th, ref, old, est, "prefix product")
                err = max(abs(v - kl) / max(kl, 1e-300), _rel(g, grad))
                assert err < 1e-9, f"{est} on {c.describe()}"
                worst = max(worst, err)
    return Evidence(len(cases), f"largest relative error in value or gradient: {worst:.2g}")


@claim(
    "k1-loss-offpolicy-usually-raises-the-kl",
    wording="Off-policy, a descent step on k1 as a loss increases KL(π_θ‖π_ref) in most cases: more than half of "
    "random "
    "triples, by more than 4 standard errors.",
    domain="random triples over 12 tokens as in lesson 05 §6: π_ref with standard-normal logits, π_old = π_ref's "
    "logits plus "
    "N(0, 0.5²) noise, π_θ = π_old after 4 reward-gradient steps (lr 1) with standard-normal rewards; the directional "
    "derivative of KL(π_θ‖π_ref) along the exact descent direction",
    unit="random triples",
)
@one_thread
def k1_loss_raises_kl() -> Evidence:
    from klviz.bandit import reward_updates

    gen = torch.Generator().manual_seed(571)
    n, up = 2000, 0
    for _ in range(n):
        r = torch.randn(12, generator=gen, dtype=torch.float64)
        o = r + 0.5 * torch.randn(12, generator=gen, dtype=torch.float64)
        t = reward_updates(o, torch.randn(12, generator=gen, dtype=torch.float64), steps=4, lr=1.0)
        g = offpolicy_expected_gradient(t, o, r, "k1 in loss")
        up += float(-(g @ klviz.reverse_kl_gradient(t, r))) > 0
    frac = up / n
    se = math.sqrt(frac * (1 - frac) / n)
    assert frac - 4 * se > 0.5, f"{frac:.3f} ± {se:.3f}"
    return Evidence(n, f"the KL rose in {up} of {n} triples ({100 * frac:.1f}%, 4 SE = {400 * se:.1f} points)")
