"""Checks for lesson 04's exercises: MiniMind's approx_kl, its response mask, verl's low_var_kl.

Each check calls the learner's function on cases it was not shown and says, in one sentence,
what is wrong (padding counted, EOS dropped, ratio inverted, clamp missing, ...).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from .. import kernel
from ..framework_rules import VERL_LOW_VAR_KL
from ..messages import tr
from . import CheckResult, WrongAnswer, failed, learner_answer, passed

__all__ = ["approx_kl", "response_mask", "low_var_kl"]


def _as_tensor(out: object, what: str) -> torch.Tensor:
    if not isinstance(out, torch.Tensor):
        raise WrongAnswer(tr("{what} should return a torch tensor, got {name}", what=what, name=type(out).__name__))
    return out


def approx_kl(fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]) -> CheckResult:
    """``fn(new_logp, old_logp, mask) -> scalar``: MiniMind's masked mean of ½ (new - old)²."""
    gen = torch.Generator().manual_seed(404)
    old = -torch.rand(4, 9, generator=gen, dtype=torch.float64) * 4
    new = old + 0.6 * torch.randn(4, 9, generator=gen, dtype=torch.float64)
    mask = torch.ones(4, 9, dtype=torch.float64)
    mask[0, 6:] = 0
    mask[2, 3:] = 0
    new_padded = new.clone()
    new_padded[mask == 0] = old[mask == 0] + 5.0  # garbage where the mask is 0
    right = (0.5 * (new_padded - old) ** 2 * mask).sum() / mask.sum().clamp(min=1)
    got = learner_answer(fn, new_padded, old, mask, convert=lambda out: _as_tensor(out, "approx_kl"))
    if isinstance(got, CheckResult):
        return got
    empty = learner_answer(
        fn, new_padded, old, torch.zeros_like(mask), convert=lambda out: _as_tensor(out, "approx_kl")
    )
    if isinstance(empty, CheckResult):
        return empty
    if got.numel() != 1:
        return failed(
            tr("approx_kl should be one number for the whole batch, got shape {tuple}.", tuple=tuple(got.shape))
        )
    g = float(got)
    if math.isclose(g, float(right), rel_tol=1e-5):
        if not math.isfinite(float(empty)) or float(empty) != 0.0:
            return failed(
                tr("An all-zero mask gives NaN (0/0): clamp the denominator to at least 1, as MiniMind does.")
            )
        return passed(tr("approx_kl matches MiniMind: ½Δ² averaged over the response tokens only."))
    d = new_padded - old
    if math.isclose(g, float((0.5 * d**2).mean()), rel_tol=1e-5):
        return failed(tr("You averaged over every position: padding and tokens after EOS must be masked out."))
    if math.isclose(g, float((0.5 * d**2 * mask).sum() / mask.numel()), rel_tol=1e-5):
        return failed(tr("You masked the numerator but divided by all positions: divide by mask.sum() instead."))
    if math.isclose(g, float((d**2 * mask).sum() / mask.sum()), rel_tol=1e-5):
        return failed(tr("The ½ is missing: approx_kl is ½(log r)², the k2 estimator."))
    if math.isclose(g, float((-d * mask).sum() / mask.sum()), rel_tol=1e-5):
        return failed(tr("That is k1 (verl's ppo_kl), not MiniMind's ½(log r)²."))
    if math.isclose(g, float((0.5 * d**2 * mask).sum()), rel_tol=1e-5):
        return failed(tr("You summed over tokens; approx_kl is a mean over the response tokens."))
    return failed(tr("Expected {right:.6f} on a test batch, got {g:.6f}.", right=float(right), g=g))


def response_mask(fn: Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]) -> CheckResult:
    """``fn(completion_ids, completion_mask, eos_id) -> [B, R] mask`` up to and including the first EOS."""
    eos = 2
    ids = torch.tensor(
        [
            [5, 6, 7, eos, 0, 0, 0],  # finished, padded
            [5, eos, 9, 9, eos, 9, 9],  # the engine kept sampling after EOS
            [5, 6, 7, 8, 9, 10, 11],  # truncated: no EOS
            [eos, 0, 0, 0, 0, 0, 0],  # EOS right away
            [5, 6, 0, 0, 0, 0, 0],  # padded without EOS (ran out of budget elsewhere)
        ]
    )
    cmask = torch.tensor(
        [
            [1, 1, 1, 1, 0, 0, 0],
            [1, 1, 1, 1, 1, 1, 1],
            [1, 1, 1, 1, 1, 1, 1],
            [1, 0, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0, 0],
        ]
    )
    right = torch.tensor(
        [
            [1, 1, 1, 1, 0, 0, 0],
            [1, 1, 0, 0, 0, 0, 0],
            [1, 1, 1, 1, 1, 1, 1],
            [1, 0, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0, 0],
        ],
        dtype=torch.float32,
    )
    got = learner_answer(fn, ids.clone(), cmask.clone(), eos, convert=lambda out: _as_tensor(out, "response_mask"))
    if isinstance(got, CheckResult):
        return got
    if got.shape != right.shape:
        return failed(
            tr(
                "The mask should have the shape of completion_ids {tuple}, got {tuple2}.",
                tuple=tuple(right.shape),
                tuple2=tuple(got.shape),
            )
        )
    g = got.float()
    if torch.equal(g, right):
        return passed(tr("The mask keeps each response up to and including its first EOS and drops padding."))
    if torch.equal(g, cmask.float()):
        return failed(
            tr("Tokens generated after the first EOS are still counted (row 2): cut each row at its first EOS.")
        )
    if g[0, 3] == 0 and g[3, 0] == 0:
        return failed(
            tr("The EOS token itself is dropped: keep it, since choosing to stop is an action the policy took.")
        )
    if g[2].sum() < 7:
        return failed(tr("A row without any EOS (truncated) must keep all its generated tokens."))
    if g[0, 4:].sum() > 0 or g[4, 2:].sum() > 0:
        return failed(tr("Padding positions are counted: multiply by completion_mask."))
    return failed(tr("Expected {tolist}, got {tolist2}.", tolist=right.int().tolist(), tolist2=g.int().tolist()))


def low_var_kl(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> CheckResult:
    """``fn(logprob, ref_logprob) -> per-token k3`` with verl's clamps (log r to ±20, result to ±10)."""
    logprob = torch.tensor([-1.0, -2.0, -0.3, -5.0, -120.0, -0.01, -3.0], requires_grad=True)
    ref = torch.tensor([-1.2, -1.0, -3.0, -0.5, -0.1, -0.01, -3.5])
    right = VERL_LOW_VAR_KL.apply(ref - logprob.detach(), "k3")
    got = learner_answer(fn, logprob, ref, convert=lambda out: _as_tensor(out, "low_var_kl"))
    if isinstance(got, CheckResult):
        return got
    if got.shape != right.shape:
        return failed(
            tr(
                "low_var_kl is per token: expected shape {tuple}, got {tuple2}.",
                tuple=tuple(right.shape),
                tuple2=tuple(got.shape),
            )
        )
    finite = torch.isfinite(got.detach())
    inverted = VERL_LOW_VAR_KL.apply(logprob.detach() - ref, "k3")  # the log-ratio upside down
    if (
        bool(finite.all())
        and torch.allclose(got.detach(), inverted, rtol=1e-4, atol=1e-6)
        and not torch.allclose(got.detach(), right, rtol=1e-4, atol=1e-6)
    ):
        return failed(
            tr("The log-ratio is inverted: verl uses log r = ref_logprob - logprob (tokens come from the policy).")
        )
    unclamped = kernel.k3(ref - logprob.detach())
    if (
        bool(torch.isinf(got.detach()).any())
        or torch.allclose(got.detach()[:4], unclamped[:4], rtol=1e-4)
        and float(got.detach()[3]) > 10
    ):
        return failed(
            tr("The result is not clamped to [-10, 10]: one token with a huge ratio then dominates the mean.")
        )
    if not torch.allclose(got.detach(), right, rtol=1e-4, atol=1e-6):
        return failed(
            tr(
                "Expected {v}, got {v2}.",
                v=[round(v, 4) for v in right.tolist()],
                v2=[round(v, 4) for v in got.detach().tolist()],
            )
        )
    if got.requires_grad:
        (grad,) = torch.autograd.grad(got.sum(), logprob)
        if not bool(torch.isfinite(grad).all()):
            return failed(
                tr(
                    "The values are right but the gradient is NaN at log r = 119.9: clamp log r to [-20, 20] "
                    "before exp, so the output clamp never multiplies 0 by inf."
                )
            )
    return passed(
        tr("low_var_kl matches verl: k3 with log r = ref - logprob, clamped inside to ±20 and outside to ±10.")
    )
