"""Checks for lesson 05's exercises: the gradient coefficient of k3 as a loss, the bandit optimum,
and reward-to-go.

Each check tests the learner's answer on cases the lesson did not show and says in one sentence
what is wrong (a sign, an inverted ratio, beta on the wrong side, the past instead of the future).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .. import kernel
from ..bandit import reverse_kl_optimum
from ..messages import tr
from . import CheckResult, failed, learner_tensor, passed

__all__ = ["k3_loss_coefficient", "bandit_optimum", "reward_to_go"]


def _close(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-8) -> bool:
    return bool(torch.allclose(a, b.to(a.dtype), rtol=1e-6, atol=tol))


def k3_loss_coefficient(fn: Callable[[torch.Tensor], Any]) -> CheckResult:
    """Check ``fn(log_r) -> c`` with grad k3(x) = c(x) · grad log pi(x) (token fixed, differentiated
    through log pi; ``log_r = log pi_ref(x) - log pi(x)``)."""
    log_r = torch.tensor([-2.5, -1.0, -0.3, 0.0, 0.2, 0.9, 1.7, 3.0], dtype=torch.float64)
    out = learner_tensor(fn, (log_r.clone(),), log_r.shape, tr("your coefficient"), finite=True)
    if isinstance(out, CheckResult):
        return out
    r = log_r.exp()
    right = 1 - r
    if _close(out, right):
        return passed(
            tr(
                "Right: d k3 / d log pi = 1 - r, so k3 as a loss has expected gradient "
                "E_pi[(1 - r) s] = -E_pi_ref[s] = grad KL(pi_ref || pi), the forward KL."
            )
        )
    if _close(out, r - 1):
        return failed(
            tr(
                "Sign: k3 = r - 1 - log r and r = pi_ref/pi falls as log pi rises, so d k3/d log pi "
                "= -r + 1, not r - 1."
            )
        )
    if _close(out, -log_r):
        return failed(
            tr(
                "That is k1 = -log r, the coefficient of k2 as a loss (and of k1 in the reward); "
                "differentiate k3 = r - 1 - log r through log pi instead."
            )
        )
    if _close(out, 1 - 1 / r):
        return failed(tr("You inverted the ratio: r = pi_ref(x)/pi(x) = exp(log_r), not pi/pi_ref."))
    if _close(out, kernel.k3(log_r)):
        return failed(
            tr(
                "That is the value of k3 (its coefficient in the *reward*); as a loss you need its "
                "derivative with respect to log pi."
            )
        )
    if _close(out, torch.ones_like(out)):
        return failed(tr("A coefficient of 1 is k1 as a loss (zero on average); k3's derivative depends on r."))
    return failed(
        tr(
            "At log_r = {tolist} the coefficient should be {v}.",
            tolist=log_r.tolist(),
            v=[round(v, 5) for v in right.tolist()],
        )
    )


def bandit_optimum(fn: Callable[[torch.Tensor, torch.Tensor, float], Any]) -> CheckResult:
    """Check ``fn(ref_probs, rewards, beta) -> pi*`` for max E_pi[R] - beta · KL(pi || pi_ref)."""
    cases = [
        (
            torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64),
            torch.tensor([1.0, -0.5, 0.25, 0.0], dtype=torch.float64),
            0.7,
        ),
        (torch.tensor([0.6, 0.3, 0.1], dtype=torch.float64), torch.tensor([0.0, 2.0, 3.0], dtype=torch.float64), 2.5),
    ]
    for ref, rw, beta in cases:
        out = learner_tensor(fn, (ref.clone(), rw.clone(), beta), ref.shape, tr("your optimum"), finite=True)
        if isinstance(out, CheckResult):
            return out
        right = reverse_kl_optimum(ref, rw, beta)
        if _close(out, right):
            continue
        if abs(float(out.sum()) - 1) > 1e-6:
            return failed(
                tr(
                    "Your policy sums to {sum:.4f}: normalise pi_ref · exp(R/beta) over the tokens.",
                    sum=float(out.sum()),
                )
            )
        if _close(out, torch.softmax(ref.log() - rw / beta, -1)):
            return failed(tr("Sign: the reward is maximised, so pi* ∝ pi_ref · exp(+R/beta)."))
        if _close(out, torch.softmax(ref.log() + rw * beta, -1)):
            return failed(
                tr("beta is on the wrong side: a larger beta must keep pi* closer to pi_ref, so divide R by beta.")
            )
        if _close(out, torch.softmax(rw / beta, -1)):
            return failed(tr("You dropped pi_ref: the optimum tilts the reference, pi* ∝ pi_ref · exp(R/beta)."))
        return failed(
            tr(
                "For pi_ref = {tolist}, R = {tolist2}, beta = {beta} the optimum is {v}.",
                tolist=ref.tolist(),
                tolist2=rw.tolist(),
                beta=beta,
                v=[round(v, 5) for v in right.tolist()],
            )
        )
    return passed(
        tr(
            "Right: pi* ∝ pi_ref · exp(R/beta), the fixed point of every choice whose expected gradient is "
            "the reverse-KL gradient."
        )
    )


def reward_to_go(fn: Callable[[torch.Tensor], Any]) -> CheckResult:
    """Check ``fn(k1) -> G`` with G[..., t] = sum_{u >= t} k1[..., u] (per sequence, along the last axis)."""
    k1 = torch.tensor([[0.3, -0.2, 0.5, 0.1], [-0.4, 0.0, 0.25, -0.1], [1.0, 2.0, -1.0, 0.5]], dtype=torch.float64)
    out = learner_tensor(fn, (k1.clone(),), k1.shape, tr("your reward-to-go"), finite=True)
    if isinstance(out, CheckResult):
        return out
    right = k1.flip(-1).cumsum(-1).flip(-1)
    if _close(out, right):
        return passed(
            tr(
                "Right: each token's score is multiplied by the KL of itself and every later token, which "
                "keeps the future terms that token-level losses drop (the full sequence gradient)."
            )
        )
    if _close(out, k1.cumsum(-1)):
        return failed(tr("That sums the past (u ≤ t); a token can only change the tokens after it: sum over u ≥ t."))
    if _close(out, k1):
        return failed(
            tr("That is the per-token k1 alone, which gives only the partial gradient; add all later tokens.")
        )
    if _close(out, k1.sum(-1, keepdim=True).expand_as(k1)):
        return failed(
            tr(
                "The whole-sequence sum is unbiased too, but it is not reward-to-go: drop the terms "
                "before t (they add variance and no signal)."
            )
        )
    if _close(out, k1.flip(0).cumsum(0).flip(0)) or _close(out, k1.cumsum(0)):
        return failed(tr("Sum along the last axis (tokens), separately for each sequence (row)."))
    return failed(
        tr(
            "For k1 = {tolist} the reward-to-go is {v}.",
            tolist=k1[0].tolist(),
            v=[round(v, 4) for v in right[0].tolist()],
        )
    )
