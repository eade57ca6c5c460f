"""Claims first stated in lesson 07 (Mini RLHF lab)."""

from __future__ import annotations

import numpy as np
import torch

import klviz

from .batches import one_thread
from .families import sequence_policies
from .registry import Evidence, claim


@claim(
    "ppo-clip-zeroes-only-the-pessimistic-branch",
    wording="PPO's clipped term −min(ρA, clip(ρ, 1 − ε, 1 + ε)A) takes a token's reward gradient away only on the "
    "pessimistic "
    "branch, A > 0 with ρ > 1 + ε or A < 0 with ρ < 1 − ε; everywhere else the token keeps the gradient −ρA of the "
    "unclipped term.",
    domain="10,000 random tokens: log ρ uniform on [−1, 1], advantages of either sign (log-uniform magnitude 1e-3 to "
    "10), "
    "ε in {0.1, 0.2, 0.3}; autograd with respect to log π in float64",
    unit="random tokens",
)
@one_thread
def clip_pessimistic_branch() -> Evidence:
    rng = np.random.default_rng(71)
    n = 10_000
    log_rho = torch.from_numpy(rng.uniform(-1, 1, n))
    adv = torch.from_numpy(rng.choice([-1.0, 1.0], n) * np.exp(rng.uniform(np.log(1e-3), np.log(10), n)))
    eps = torch.from_numpy(rng.choice([0.1, 0.2, 0.3], n))
    lp = log_rho.clone().requires_grad_(True)  # log pi - log pi_old, pi_old fixed
    ratio = torch.exp(lp)
    pg = -torch.minimum(ratio * adv, torch.clamp(ratio, 1 - eps, 1 + eps) * adv)
    (g,) = torch.autograd.grad(pg.sum(), lp)
    rho = ratio.detach()
    pessimistic = ((adv > 0) & (rho > 1 + eps)) | ((adv < 0) & (rho < 1 - eps))
    assert bool((g[pessimistic] == 0).all()), "a token on the pessimistic branch kept a gradient"
    assert torch.allclose(g[~pessimistic], (-rho * adv)[~pessimistic], rtol=1e-12, atol=0), "a gradient went missing"
    outside = (rho > 1 + eps) | (rho < 1 - eps)
    kept = int((outside & ~pessimistic).sum())
    return Evidence(
        n, f"{int(pessimistic.sum())} tokens on the pessimistic branch, {kept} outside the range that kept it"
    )


@claim(
    "exact-next-token-kl-along-samples-is-unbiased",
    wording="The exact next-token KL(π(·|y<t)‖π_ref(·|y<t)), summed along a response y sampled from π and averaged, "
    "is an "
    "unbiased estimate of the sequence KL(π‖π_ref) (the chain rule, Rao-Blackwellised).",
    domain="tabular sequence policies (families.sequence_policies: vocabulary 2-4, length 2-4), the expectation over "
    "y ~ π "
    "by exact enumeration in float64",
    unit="tabular sequence policies",
)
@one_thread
def rao_blackwell() -> Evidence:
    cases = sequence_policies(1000, seed=72)
    worst = 0.0
    for c in cases:
        toy, th, ref = c.toy, c.theta, c.ref
        probs = toy.sequence_probs(th)
        logp, logq = torch.log_softmax(th, -1), torch.log_softmax(ref, -1)
        per_prefix = (logp.exp() * (logp - logq)).sum(-1)
        along = per_prefix[toy.prefix_index].sum(-1)  # Σ_t KL at each prefix of each sequence
        mean = float((probs * along).sum())
        kl = float(toy.sequence_kl(th, ref))
        err = abs(mean - kl) / max(kl, 1e-300)
        assert err < 1e-10, f"{mean} vs {kl} on {c.describe()}"
        worst = max(worst, err)
    return Evidence(len(cases), f"largest relative difference {worst:.2g}")


@claim(
    "only-reverse-kl-placements-climb-the-score",
    wording="The gradient of the score J = E[R] − β·KL(π‖π_ref) is the reward's gradient minus β times the "
    "reverse-KL gradient: "
    "of the placements, k1 in the reward (reward-to-go), k2 in the loss on one token, k3·ρ and k3+ give it; k3 in the "
    "loss "
    "gives the forward KL's instead.",
    domain="random token pairs as (π, π_ref) with random rewards (families.token_pairs, vocabularies 2 to 50,257), one "
    "token: ∇J by autograd of the exact sum against E[∇(pg + β·term)] of each placement, β = 0.2, float64",
    unit="random token pairs",
)
@one_thread
def score_gradient() -> Evidence:
    from klviz.simplex import CHOICES

    from .families import token_pairs

    cases = token_pairs(1000, seed=73)
    rng = np.random.default_rng(73)
    beta = 0.2
    far = 0.0
    for c in cases:
        th = c.q_logp.clone().requires_grad_(True)
        rw = torch.from_numpy(rng.standard_normal(c.vocab))
        logpi = torch.log_softmax(th, -1)
        j = (logpi.exp() * rw).sum() - beta * (logpi.exp() * (logpi - c.p_logp)).sum()
        (gj,) = torch.autograd.grad(j, th)
        pg = torch.softmax(c.q_logp, -1) * (rw - (torch.softmax(c.q_logp, -1) * rw).sum())  # ∇E[R]
        for name in ("k1 in reward", "k2 in loss", "k3·ρ in loss", "k3+ in loss"):
            g = pg - beta * klviz.expected_kl_gradient(c.q_logp, c.p_logp, CHOICES[name])
            assert torch.allclose(g, gj, rtol=1e-9, atol=4 * c.vocab * 2.2e-16), (name, c.describe())
        g3 = pg - beta * klviz.expected_kl_gradient(c.q_logp, c.p_logp, CHOICES["k3 in loss"])
        fwd = pg - beta * klviz.forward_kl_gradient(c.q_logp, c.p_logp)
        assert torch.allclose(g3, fwd, rtol=1e-9, atol=4 * c.vocab * 2.2e-16), c.describe()  # the forward KL's
        scale = float(gj.norm())
        if scale > 0:
            far = max(far, float((g3 - gj).norm()) / scale)
    return Evidence(len(cases), f"the k3-in-loss step was up to {far:.2g} of ∇J's norm away from it (the forward KL's)")
