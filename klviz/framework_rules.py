"""Which framework clamps which KL estimate, and how: one table, used everywhere.

Each :class:`ClampRule` says, as data, what a framework does to a per-token estimate of KL(q || p)
(``log_r = log p(x) - log q(x)``, tokens from the sampler q):

- ``estimators``: the estimators the rule acts on (the others pass through unchanged);
- ``input_clamp``: ``log r`` is clamped to ``[-c, c]`` *before* the estimator. It sets the gradient of
  every token beyond ``c`` to 0, and changes its value only where the output clamp has not already
  bound: with verl's and NeMo-RL's rules (input 20, output 10) the output clamp binds first for every
  estimator (k3 passes 10 at log r = 2.61 and -11.0, k2 at |log r| = 4.47, k1 at 10), so there the
  input clamp changes no value and only keeps the backward pass finite (no ``inf · 0``); open-instruct's
  (input 40, no output clamp) changes values;
- ``output_clamp``: the estimator's *value* is clamped to ``[lo, hi]``; where it binds the value is
  the bound and the gradient is 0 (for k3 and k2, which are never negative, only ``hi`` can bind).

:func:`klviz.kl_penalty`, :mod:`klviz.frameworks`, :mod:`klviz.pitfalls`, :mod:`klviz.tokens`
and ``klviz diagnose`` all read their clamps from :data:`CLAMP_RULES` (the clamps on a reference
penalty); verl's clamp on PPO's old-vs-current log-ratio is :data:`VERL_PPO_KL`. Each rule's
``source`` names the repository, commit and file it was read from.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import kernel

Tensor = torch.Tensor

__all__ = [
    "ClampRule",
    "CLAMP_RULES",
    "VERL_LOW_VAR_KL",
    "NEMO_RL",
    "OPENRLHF",
    "OPEN_INSTRUCT",
    "NO_CLAMP",
    "VERL_PPO_KL",
    "VERL_COMMIT",
    "NEMO_RL_COMMIT",
    "OPENRLHF_COMMIT",
]


@dataclass(frozen=True)
class ClampRule:
    """How one framework limits a per-token KL estimate (see the module docstring)."""

    name: str
    estimators: tuple[str, ...]
    input_clamp: float | None
    output_clamp: tuple[float, float] | None
    source: str
    note: str = ""

    @property
    def upper_bound(self) -> float:
        """The output clamp's upper bound (``inf`` without an output clamp)."""
        return float("inf") if self.output_clamp is None else self.output_clamp[1]

    def acts_on(self, estimator: str) -> bool:
        """Whether this rule changes ``estimator`` at all."""
        return estimator in self.estimators and (self.input_clamp is not None or self.output_clamp is not None)

    def clamp_input(self, log_r: Tensor, estimator: str) -> Tensor:
        """``log_r`` after the input clamp (unchanged when the rule has none or skips ``estimator``)."""
        if self.input_clamp is None or estimator not in self.estimators:
            return log_r
        return log_r.clamp(-self.input_clamp, self.input_clamp)

    def clamp_output(self, values: Tensor, estimator: str) -> Tensor:
        """``values`` after the output clamp (unchanged when the rule has none or skips ``estimator``)."""
        if self.output_clamp is None or estimator not in self.estimators:
            return values
        return values.clamp(*self.output_clamp)

    def apply(self, log_r: Tensor, estimator: str) -> Tensor:
        """Per-token ``estimator`` of ``log_r`` with this rule's clamps (no input checks)."""
        return self.clamp_output(kernel.estimate(estimator, self.clamp_input(log_r, estimator)), estimator)

    def input_binds(self, log_r: Tensor, estimator: str) -> Tensor:
        """Boolean mask of the tokens whose ``log r`` the input clamp changes."""
        if self.input_clamp is None or estimator not in self.estimators:
            return torch.zeros_like(log_r, dtype=torch.bool)
        return log_r.abs() > self.input_clamp

    def output_binds(self, log_r: Tensor, estimator: str) -> Tensor:
        """Boolean mask of the tokens whose value the output clamp replaces by a bound."""
        if self.output_clamp is None or estimator not in self.estimators:
            return torch.zeros_like(log_r, dtype=torch.bool)
        v = kernel.estimate(estimator, self.clamp_input(log_r, estimator))
        lo, hi = self.output_clamp
        return (v < lo) | (v > hi)


#: Upstream commits the rules were read from (re-read before relying on them).
VERL_COMMIT = "verl-project/verl @ 1dda039 (2026-08-22)"
NEMO_RL_COMMIT = "NVIDIA-NeMo/RL @ 7ea279a (2026-08-22)"
OPENRLHF_COMMIT = "OpenRLHF/OpenRLHF @ 3c3be62 (2026-08-13)"

NO_CLAMP = ClampRule("none", (), None, None, source="", note="the estimator as written, nothing clamped")
VERL_LOW_VAR_KL = ClampRule(
    "verl low_var_kl",
    ("k3",),
    20.0,
    (-10.0, 10.0),
    source=f"{VERL_COMMIT}: verl/trainer/ppo/core_algos.py (kl_penalty_forward)",
    note="only low_var_kl / k3 is clamped; kl (k1), abs and mse (k2) are left alone; "
    "k3 >= 0, so the lower bound -10 can never bind; the upper bound binds at log r > 2.61 and < -11.0, "
    "inside the input clamp's ±20, so the input clamp changes no value: it keeps the gradient finite",
)
NEMO_RL = ClampRule(
    "NeMo-RL",
    ("k1", "k2", "k3"),
    20.0,
    (-10.0, 10.0),
    source=f"{NEMO_RL_COMMIT}: nemo_rl/algorithms/utils.py (calculate_kl), "
    "nemo_rl/algorithms/loss/loss_functions.py (ClippedPGLossFn)",
    note="both clamps are configurable (kl_input_clamp_value, kl_output_clamp_value; None switches one off); "
    "since PR #2958 (2026-06-27) the importance weight multiplies the estimate before the output clamp "
    "and is detached on the tokens where the input clamp acts (before: weight times the clamped estimate)",
)
OPENRLHF = ClampRule(
    "OpenRLHF ±10",
    ("k1", "k2", "k3"),
    None,
    (-10.0, 10.0),
    source=f"{OPENRLHF_COMMIT}: openrlhf/models/utils.py (compute_approx_kl)",
    note="every estimator's output is clamped, so k1 can be clipped on both sides; computed in float32",
)
OPEN_INSTRUCT = ClampRule(
    "open-instruct ±40",
    ("k1", "k2", "k3"),
    40.0,
    None,
    source="allenai/open-instruct: open_instruct/grpo_fast.py",
    note="the log-ratio is clamped to ±40 before the estimator; no output clamp",
)

#: verl's clamp on PPO's old-vs-current log-ratio (``compute_policy_loss_vanilla``, since PR #1779,
#: 2025-06): ``log_prob - old_log_prob`` is clamped to ±20 before the ratio and before ``ppo_kl``, the
#: k1 of KL(pi_old || pi_theta). It limits a monitoring KL, not a reference penalty, so it is *not* in
#: :data:`CLAMP_RULES` (whose rules the rollout diagnosis and lesson 06 apply to reference log-ratios).
VERL_PPO_KL = ClampRule(
    "verl ppo_kl",
    ("k1",),
    20.0,
    None,
    source=f"{VERL_COMMIT}: verl/trainer/ppo/core_algos.py (compute_policy_loss_vanilla)",
    note="the default policy loss clamps log_prob - old_log_prob to ±20; gspo, clip_cov, geo_mean and dro do not",
)

#: Every clamp rule on a reference-KL estimate, by name (the names lessons and reports show).
CLAMP_RULES: dict[str, ClampRule] = {r.name: r for r in (NO_CLAMP, VERL_LOW_VAR_KL, NEMO_RL, OPENRLHF, OPEN_INSTRUCT)}
