"""Diagnose the KL estimates of your own training run from a dump of its per-token log-probabilities.

A *rollout dump* is a file holding, for one batch of responses, ``[batch, tokens]`` tensors:

- ``logprob``: the policy's log-probability of each response token (verl ``old_log_probs``,
  TRL ``old_per_token_logps`` or the per-token log-probs of the current policy);
- ``ref_logprob``: the reference model's log-probability of the same tokens;
- ``response_mask``: 1 for response tokens that count, 0 for prompt, padding and tokens after EOS;
- ``old_logprob`` (optional): the log-probs of the policy that *sampled* the tokens when it is not
  the one in ``logprob`` (pi_old on a second PPO epoch);
- ``rollout_logprob`` (optional): the rollout engine's own log-probs of the sampled tokens;
- ``tokens`` (strings) or ``token_ids`` (with ``--vocab``), and ``step`` (optional).

Files are read from their headers first and never unpickled by torch (:mod:`.reading`): declared
sizes beyond a cap, storage smaller than a shape claims, sparse and meta tensors and pickles that ask
to run code are refused before anything is allocated or run. The format guide ships with the package
(:func:`format_guide_path`, ``klviz/docs/rollout_format.md``).

:func:`open_dump` reads headers, :func:`diagnose` streams over the rows (:mod:`.analysis`),
:func:`format_report` and :func:`report_json` write the reports (:mod:`.report`), :func:`match_logged`
says which formula a logged metric is, recomputed exactly on the dump (:mod:`.logged`, :mod:`.identify`),
the trouble signs are a registry of named rules (:mod:`.rules`), :func:`diagnose_series` follows a run
(:mod:`.series`), :func:`plot_report` and :func:`plot_series` draw (:mod:`.plot`, the only part that
needs matplotlib). ``klviz diagnose FILE...`` runs all of it from the command line.
"""

from __future__ import annotations

from pathlib import Path

from .analysis import LARGE_LOG_RATIO as LARGE_LOG_RATIO  # the report's threshold, not in __all__
from .analysis import SEVERITIES, Diagnosis, Trouble, diagnose
from .analysis import clamp_rows as clamp_rows  # the clamp table's rows, from CLAMP_RULES
from .identify import METRICS
from .logged import (
    HISTORY_FILES,
    LOGGED_NAMES,
    check_history,
    history_names,
    is_history,
    match_logged,
    parse_logged,
    parse_logged_text,
    read_history,
)
from .plot import plot_report, plot_series
from .reading import (
    DEFAULT_KEYS,
    DEFAULT_MAX_TOKENS,
    DumpFile,
    RolloutDump,
    RolloutFileError,
    escape_text,
    load_rollouts,
    open_dump,
    read_vocab,
    rollouts_from_tensors,
    sample_rollouts_path,
    save_rollouts,
)
from .report import SCHEMA, SCHEMA_VERSION, format_report, format_series, report_json, series_json
from .rules import RULES
from .series import collect_dumps, diagnose_series

__all__ = [
    "RolloutFileError",
    "RolloutDump",
    "DumpFile",
    "Diagnosis",
    "Trouble",
    "SEVERITIES",
    "DEFAULT_KEYS",
    "DEFAULT_MAX_TOKENS",
    "load_rollouts",
    "open_dump",
    "rollouts_from_tensors",
    "save_rollouts",
    "diagnose",
    "format_report",
    "report_json",
    "plot_report",
    "plot_series",
    "sample_rollouts_path",
    "match_logged",
    "parse_logged",
    "parse_logged_text",
    "LOGGED_NAMES",
    "METRICS",
    "read_history",
    "is_history",
    "history_names",
    "check_history",
    "HISTORY_FILES",
    "RULES",
    "diagnose_series",
    "collect_dumps",
    "format_series",
    "series_json",
    "SCHEMA",
    "SCHEMA_VERSION",
    "escape_text",
    "read_vocab",
    "format_guide_path",
]


def format_guide_path() -> Path:
    """Path of the rollout-format guide shipped with klviz (what ``klviz diagnose --help`` points to)."""
    return Path(__file__).resolve().parent.parent / "docs" / "rollout_format.md"
