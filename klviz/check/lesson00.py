"""Checks for the exercises of lesson 00 (start here)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..messages import tr
from . import CheckResult, failed, learner_tensor, never_raises, not_attempted, passed


@never_raises
def direction(answer: Any) -> CheckResult:
    """Exercise 1: PPO's ``approx_kl`` compares pi_old and pi_theta on tokens sampled by pi_old.

    Which KL does it estimate? Answer with the string ``"KL(old||new)"`` or ``"KL(new||old)"``.
    """
    if answer is Ellipsis or answer is None:
        return not_attempted()
    if not isinstance(answer, str):
        return failed(
            tr("Answer with a string, 'KL(old||new)' or 'KL(new||old)'; got a {name}.", name=type(answer).__name__)
        )
    text = str(answer).replace(" ", "").replace("‖", "||").lower()
    if text in ("kl(old||new)", "kl(pi_old||pi_theta)", "kl(π_old||π_θ)"):
        return passed(
            tr("The tokens came from pi_old, so every estimate is a KL *from* pi_old: KL(pi_old || pi_theta).")
        )
    if text in ("kl(new||old)", "kl(pi_theta||pi_old)", "kl(π_θ||π_old)"):
        return failed(
            tr(
                "Direction swapped: the sampler is pi_old (the rollout policy), and estimates from its "
                "tokens measure KL(sampler || other) = KL(old || new)."
            )
        )
    return failed(tr("Answer with the string 'KL(old||new)' or 'KL(new||old)'."))


@never_raises
def k1_from_logprobs(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> CheckResult:
    """Exercise 2: ``fn(logp_sampler, logp_target)`` must return per-token k1 estimates of KL(sampler || target)."""
    g = torch.Generator().manual_seed(1234)
    logp_q = -torch.rand(50, generator=g) * 5
    logp_p = logp_q + torch.randn(50, generator=g)
    expected = logp_q - logp_p
    out = learner_tensor(fn, (logp_q.clone(), logp_p.clone()), tuple(expected.shape), tr("your k1"))
    if isinstance(out, CheckResult):
        return out
    if torch.allclose(out, expected.double(), atol=1e-5):
        return passed(tr("k1 = log q(x) - log p(x) = -log r: sampler minus target, for tokens drawn from the sampler."))
    if torch.allclose(out, -expected.double(), atol=1e-5):
        return failed(tr("Sign swapped: that is log r = log p - log q; k1 is its negative, log q(x) - log p(x)."))
    if torch.allclose(out, 0.5 * expected.double() ** 2, atol=1e-5):
        return failed(tr("That is k2 = ½(log r)²; k1 is the plain log-ratio log q(x) - log p(x)."))
    return failed(tr("Not k1: for each token return log q(x) - log p(x) (sampler's log-prob minus target's)."))
