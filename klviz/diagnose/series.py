"""A run: several dumps (files, or the dumps in a folder), each analysed in turn with constant memory.

:func:`collect_dumps` expands folders and orders the dumps by their ``step`` key (read from the
header, a one-element array) or, without one, by name in natural order (``step_9`` before
``step_10``); :func:`diagnose_series` analyses them one at a time, keeping only each dump's
:class:`~klviz.diagnose.analysis.Diagnosis` summary (no per-token data).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .analysis import Diagnosis, diagnose
from .reading import RolloutFileError, open_dump

__all__ = ["collect_dumps", "diagnose_series"]

_SUFFIXES = (".pt", ".pth", ".npz", ".safetensors")


def _natural(name: str) -> list[Any]:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def collect_dumps(paths: list[str | Path]) -> list[Path]:
    """Every dump named: files as given, folders expanded to the dump files directly inside them."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(
                (q for q in p.iterdir() if q.is_file() and q.suffix.lower() in _SUFFIXES),
                key=lambda q: _natural(q.name),
            )
            if not found:
                raise RolloutFileError(f"the directory {p} holds no dump (.npz, .pt, .pth, .safetensors)")
            out += found
        else:
            out.append(p)
    return out


def diagnose_series(
    paths: list[Path],
    open_kwargs: dict[str, Any],
    *,
    clip: float = 0.2,
    vocab: Callable | None = None,
    on_each: Callable[[Path, Diagnosis], None] | None = None,
    identify: list[str] | None = None,
) -> list[tuple[str, float | None, Diagnosis | str]]:
    """``[(name, step, Diagnosis or error message)]`` ordered by step (dumps without one by name, after).
    ``identify``: logged names whose formulas each dump accumulates (:func:`klviz.diagnose.diagnose`)."""
    items: list[tuple[int, str, float | None, Diagnosis | str]] = []
    for i, p in enumerate(paths):
        try:
            with open_dump(p, **open_kwargs) as f:
                d = diagnose(f, clip=clip, vocab=vocab, identify=identify)
            d.log_r_sample = None  # keep the summary only: constant memory per dump
            d.seq_sums = {}
            d.seq_lengths = None
            if on_each is not None:
                on_each(p, d)
            items.append((i, p.name, d.step, d))
        except (RolloutFileError, ValueError, MemoryError) as err:
            items.append(
                (i, p.name, None, f"{type(err).__name__}: {err}" if isinstance(err, MemoryError) else str(err))
            )
    items.sort(key=lambda t: (t[2] is None, t[2] if t[2] is not None else 0, t[0]))
    return [(name, step, d) for _i, name, step, d in items]
