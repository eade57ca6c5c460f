"""How an estimator is *used* in training: which estimator, where it goes, how it is weighted.

One vocabulary for lessons 05 and 07, the gradient functions, the bandit and the RLHF lab. An
:class:`EstimatorUse` has three parts:

- ``estimator``: ``"k1"``, ``"k2"`` or ``"k3"`` (each a per-token estimate of KL(pi || pi_ref) with
  ``log r = log pi_ref(x) - log pi(x)``, tokens from the policy);
- ``placement``: ``"loss"`` (the estimate is differentiated through log pi with the token fixed) or
  ``"reward"`` (its value is detached and multiplies the score, as a negative reward);
- ``weighting``: ``"none"``; ``"rho"`` (the term times rho = pi / sg(pi_sampler), differentiated
  through rho: as a loss DeepSeek-V3.2's and TRL's ``use_bias_correction_kl`` k3 · rho; in the
  reward PPO's importance-weighted surrogate rho · A); or ``"straight-through"`` (loss only: the
  value of the estimator with the gradient of k2, verl's ``"+"`` kinds).

Its :attr:`~EstimatorUse.label` is derived, never stored: ``"k3 in loss"``, ``"k3·ρ in loss"``,
``"k3+ in loss"``, ``"k1 in reward"``. :func:`per_token_surrogate` turns a use into the per-token
term whose gradient a training step follows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import kernel

Tensor = torch.Tensor

__all__ = ["EstimatorUse", "PLACEMENTS", "WEIGHTINGS", "LESSON_USES", "parse_use", "per_token_surrogate"]

PLACEMENTS: tuple[str, str] = ("loss", "reward")
WEIGHTINGS: tuple[str, str, str] = ("none", "rho", "straight-through")
_MARK = {"none": "", "rho": "·ρ", "straight-through": "+"}


@dataclass(frozen=True)
class EstimatorUse:
    """One way of putting a KL estimator into training (see the module docstring)."""

    estimator: str
    placement: str = "loss"
    weighting: str = "none"

    def __post_init__(self) -> None:
        for value, name, choices in (
            (self.estimator, "estimator", kernel.ESTIMATORS),
            (self.placement, "placement", PLACEMENTS),
            (self.weighting, "weighting", WEIGHTINGS),
        ):
            if not isinstance(value, str) or value not in choices:
                raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}; got {value!r}")
        if self.placement == "reward" and self.weighting == "straight-through":
            raise ValueError(
                "weighting 'straight-through' is a loss-side fix (it changes the gradient of the value); "
                "in the reward the value is detached, so use weighting 'none' or 'rho'"
            )

    @property
    def label(self) -> str:
        """The name lessons show: ``"k3·ρ in loss"``, ``"k3+ in loss"``, ``"k1 in reward"``, ..."""
        return f"{self.estimator}{_MARK[self.weighting]} in {self.placement}"

    def __str__(self) -> str:
        return self.label


def parse_use(label: str | EstimatorUse) -> EstimatorUse:
    """The :class:`EstimatorUse` whose label is ``label`` (an ``EstimatorUse`` is returned as is)."""
    if isinstance(label, EstimatorUse):
        return label
    if isinstance(label, str) and " in " in label:
        head, placement = label.rsplit(" in ", 1)
        for weighting, mark in _MARK.items():
            if mark and head.endswith(mark):
                return EstimatorUse(head[: -len(mark)], placement, weighting)
        if head in kernel.ESTIMATORS:
            return EstimatorUse(head, placement)
    raise ValueError(
        f"use must be a label like 'k3 in loss', 'k3·ρ in loss', 'k3+ in loss' or 'k1 in reward'; got {label!r}"
    )


#: The eight uses lessons 05 and 07 compare, in the order they are shown.
LESSON_USES: tuple[EstimatorUse, ...] = (
    EstimatorUse("k1", "loss"),
    EstimatorUse("k2", "loss"),
    EstimatorUse("k3", "loss"),
    EstimatorUse("k1", "reward"),
    EstimatorUse("k2", "reward"),
    EstimatorUse("k3", "reward"),
    EstimatorUse("k3", "loss", "rho"),
    EstimatorUse("k3", "loss", "straight-through"),
)


def per_token_surrogate(
    use: EstimatorUse, logprob: Tensor, ref_logprob: Tensor, sampler_logprob: Tensor | None = None
) -> Tensor:
    """The per-token term whose gradient (through ``logprob``) a training step with ``use`` follows.

    ``logprob``: the policy's log-probabilities of the sampled tokens (carrying the gradient);
    ``ref_logprob``: the reference's (detached here); ``sampler_logprob``: the policy that sampled
    the tokens, for ``weighting="rho"`` (default: ``logprob`` itself, detached, so rho = 1 in value).
    In the reward the value is detached and multiplies ``logprob`` (REINFORCE's score term), or rho
    with ``weighting="rho"``; summing per-token values to go is the caller's choice.
    """
    log_r = ref_logprob.detach() - logprob
    value = kernel.estimate(use.estimator, log_r)
    if use.weighting == "straight-through":
        k2 = kernel.k2(log_r)
        return value.detach() + k2 - k2.detach()
    rho = None
    if use.weighting == "rho":
        sampler = logprob if sampler_logprob is None else sampler_logprob
        rho = torch.exp(logprob - sampler.detach())
    if use.placement == "reward":
        return value.detach() * (logprob if rho is None else rho)
    return value if rho is None else rho * value
