"""Checks for lesson 07's exercises: per-token returns with the KL in the reward, and PPO's
``approx_kl`` early-stopping test.

Each check tests the learner's function on cases the lesson did not show and says in one sentence
what is wrong (no reward-to-go, a sign, the mask forgotten, the ½ dropped, the wrong direction).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..messages import tr
from . import CheckResult, as_answer_number, as_answer_tensor, failed, learner_answer, never_raises, passed

__all__ = ["kl_returns", "approx_kl_stop"]


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and bool(torch.allclose(a.to(torch.float64), b.to(torch.float64), rtol=1e-6, atol=1e-9))


@never_raises
def kl_returns(fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float], Any]) -> CheckResult:
    """Check ``fn(rewards [B], k1 [B, T], mask [B, T], beta) -> returns [B, T]``:
    ``R_b - beta · sum_{u >= t} k1[b, u] · mask[b, u]`` on response tokens, 0 elsewhere."""
    rewards = torch.tensor([1.0, -0.5, 2.0], dtype=torch.float64)
    k1 = torch.tensor(
        [[0.0, 0.2, -0.1, 0.4, 0.3], [0.0, 0.5, 0.1, 9.0, 9.0], [0.0, 0.0, -0.3, 0.2, 0.6]], dtype=torch.float64
    )
    mask = torch.tensor([[0, 1, 1, 1, 1], [0, 1, 1, 0, 0], [0, 0, 1, 1, 1]], dtype=torch.float64)
    beta = 0.3
    out = learner_answer(
        fn,
        rewards.clone(),
        k1.clone(),
        mask.clone(),
        beta,
        convert=lambda v: as_answer_tensor(v, tuple(k1.shape), tr("your returns (one value per token)")),
    )
    if isinstance(out, CheckResult):
        return out
    km = k1 * mask
    togo = km.flip(-1).cumsum(-1).flip(-1)
    right = (rewards[:, None] - beta * togo) * mask
    if _close(out, right):
        return passed(
            tr(
                "Right: each token's return is the reward minus beta times the KL of itself and every later "
                "response token, which gives the full sequence-KL gradient."
            )
        )
    if _close(out, (rewards[:, None] + beta * togo) * mask):
        return failed(tr("Sign: the KL is a penalty, so subtract beta · (k1 to go) from the reward."))
    if _close(out, (rewards[:, None] - beta * km) * mask):
        return failed(
            tr("That uses only the token's own k1 (the partial gradient); sum k1 over this and all later tokens.")
        )
    if _close(out, (rewards[:, None] - beta * km.cumsum(-1)) * mask):
        return failed(tr("That sums the past tokens; a token can only affect the ones after it: sum over u ≥ t."))
    if _close(out, (rewards[:, None] - beta * k1.flip(-1).cumsum(-1).flip(-1)) * mask) or _close(
        out, rewards[:, None] - beta * togo
    ):
        return failed(
            tr(
                "Use the mask: k1 of padding and prompt positions must not count, and returns "
                "outside the response are 0."
            )
        )
    if _close(out, (rewards[:, None] - beta * km.sum(-1, keepdim=True)) * mask):
        return failed(
            tr("The whole-sequence KL on every token is unbiased but not reward-to-go; drop the earlier tokens.")
        )
    return failed(
        tr(
            "For row 0 the returns should be {v}, yours are {v2}.",
            v=[round(v, 4) for v in right[0].tolist()],
            v2=[round(v, 4) for v in out[0].tolist()],
        )
    )


@never_raises
def approx_kl_stop(fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float], Any]) -> CheckResult:
    """Check ``fn(new_logp, old_logp, mask, threshold) -> (approx_kl, stop)`` with MiniMind's
    ``approx_kl`` = masked mean of ½ (new - old)² and ``stop`` = approx_kl > threshold."""
    old = torch.tensor([[-2.0, -1.0, -0.5, -3.0], [-2.0, -0.7, -4.0, -1.0]], dtype=torch.float64)
    new = torch.tensor([[-1.8, -1.2, -0.5, -1.0], [-0.5, -0.7, -2.0, -9.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 0]], dtype=torch.float64)
    d = new - old
    right = float((0.5 * d * d * mask).sum() / mask.sum())
    for threshold, expect in ((right * 0.9, True), (right * 1.1, False)):
        out = learner_answer(fn, new.clone(), old.clone(), mask.clone(), threshold)
        if isinstance(out, CheckResult):
            return out
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
            return failed(tr("Return a pair (approx_kl, stop)."))
        value = as_answer_number(out[0], tr("approx_kl (the first item of the pair)"), finite=True)
        if isinstance(out[1], torch.Tensor) and out[1].numel() != 1:
            return failed(tr("stop (the second item of the pair) should be one True/False, not a tensor of several."))
        if isinstance(out[1], (str, bytes, dict, list, tuple)):
            return failed(
                tr(
                    "stop (the second item of the pair) should be True or False, got {name}.",
                    name=type(out[1]).__name__,
                )
            )
        stop = bool(out[1])
        if abs(value - right) > 1e-9:
            if abs(value - float((0.5 * d * d).mean())) < 1e-9:
                return failed(tr("Use the mask: positions outside the response (here the last column) must not count."))
            if abs(value - float((d * d * mask).sum() / mask.sum())) < 1e-9:
                return failed(tr("MiniMind's approx_kl is ½ (Δ)²: you dropped the ½."))
            if (
                abs(value - float((-d * mask).sum() / mask.sum())) < 1e-9
                or abs(value - float((d * mask).sum() / mask.sum())) < 1e-9
            ):
                return failed(
                    tr(
                        "That is k1 (the plain log-ratio mean); this exercise asks for ½ (new - old)², "
                        "which is never negative."
                    )
                )
            if abs(value - float((0.5 * d * d * mask).sum() / mask.numel())) < 1e-9:
                return failed(tr("Divide by the number of response tokens (mask.sum()), not by every position."))
            return failed(tr("approx_kl should be {right:.6f} here, yours is {value:.6f}.", right=right, value=value))
        if stop != expect:
            return failed(
                tr("Stop when approx_kl is *greater* than the threshold (the policy moved too far from pi_old).")
            )
    return passed(
        tr(
            "Right: ½ (log pi - log pi_old)² averaged over response tokens estimates KL(pi_old || pi) to second "
            "order; once it exceeds the threshold the remaining epochs on this batch are skipped."
        )
    )
