"""Diagnose the KL estimates of your own training run from a dump of its per-token log-probabilities.

A *rollout dump* is a file holding, for one batch of responses, ``[batch, tokens]`` tensors:

- ``logprob``: the policy's log-probability of each response token (verl ``old_log_probs``,
  TRL ``old_per_token_logps`` or the per-token log-probs of the current policy);
- ``ref_logprob``: the reference model's log-probability of the same tokens;
- ``response_mask``: 1 for response tokens that count, 0 for prompt, padding and tokens after EOS;
- ``old_logprob`` (optional): the log-probs of the policy that *sampled* the tokens when it is not
  the one in ``logprob`` (the rollout engine, or pi_old on a second PPO epoch).

Files are read safely: ``.pt``/``.pth`` only with ``torch.load(..., weights_only=True)`` (a pickle
that asks to run code is refused before anything runs), ``.npz`` with ``allow_pickle=False`` and
``.safetensors`` when the ``safetensors`` package is installed. See ``docs/rollout_format.md``.

:func:`load_rollouts` reads and validates a file (:mod:`.reading`), :func:`diagnose` analyses it
(:mod:`.analysis`), :func:`format_report` writes the plain-text report (:mod:`.report`),
:func:`plot_report` the optional PNG (:mod:`.plot`, the only part that needs matplotlib).
``klviz diagnose FILE`` runs all of it from the command line. The estimates come from
:mod:`klviz.kernel`, their standard errors from :mod:`klviz.statistics` and the frameworks' clamps
from :data:`klviz.framework_rules.CLAMP_RULES`.
"""
from __future__ import annotations

from .analysis import LARGE_LOG_RATIO as LARGE_LOG_RATIO  # the report's threshold, not in __all__
from .analysis import Diagnosis, diagnose
from .analysis import clamp_rows as clamp_rows  # the clamp table's rows, from CLAMP_RULES
from .plot import plot_report
from .reading import (
    DEFAULT_KEYS,
    RolloutFileError,
    RolloutDump,
    load_rollouts,
    rollouts_from_tensors,
    sample_rollouts_path,
    save_rollouts,
)
from .report import format_report

__all__ = [
    "RolloutFileError", "RolloutDump", "Diagnosis", "DEFAULT_KEYS", "load_rollouts", "rollouts_from_tensors",
    "save_rollouts", "diagnose", "format_report", "plot_report", "sample_rollouts_path",
]
