"""The values a framework logged: parsed from the command line or a log history, and identified on the dump.

``klviz diagnose FILE --logged kl=0.0123`` names a metric the way the framework logs it;
:func:`match_logged` recomputes every formula the frameworks log under that name on the dump's own tensors
(:mod:`.identify`) and says which one the value *is*, within the framework's floating-point rounding.

``--logged HISTORY`` takes a log history instead: :func:`read_history` reads a JSON file (a list of
``{"step": K, name: value, ...}`` records, a HuggingFace ``trainer_state.json`` with its ``log_history``,
a ``{step: {name: value}}`` mapping, or JSON lines) or a CSV file with a ``step`` column (``_step``,
``Step``, ``global_step`` and ``train/global_step`` are read as ``step``, as wandb exports write them).
:func:`pair_steps` pairs each logged step with the dumps that make its value.
"""

from __future__ import annotations

import csv
import json
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .analysis import Diagnosis
from .identify import METRICS, RowTerms, identify, known_names
from .reading import RolloutFileError, escape_text

__all__ = [
    "LOGGED_NAMES",
    "match_logged",
    "parse_logged",
    "parse_logged_text",
    "read_history",
    "is_history",
    "HISTORY_FILES",
]

#: Logged name -> (framework and default, [every formula it can be, the default first]), from
#: :data:`klviz.diagnose.identify.METRICS`.
LOGGED_NAMES: dict[str, tuple[str, list[str]]] = {
    name: (
        "; ".join(f"{m.framework}: {m.formula}, {m.aggregation}" for m in METRICS if m.name == name and m.default),
        [m.label for m in sorted((m for m in METRICS if m.name == name), key=lambda m: not m.default)],
    )
    for name in known_names()
}
#: Log-history files ``klviz diagnose DIR`` picks up by itself (the TRL integration writes the first).
HISTORY_FILES = ("log_history.jsonl", "trainer_state.json")
_STEP_COLUMNS = ("step", "_step", "Step", "global_step", "train/global_step")
_MAX_HISTORY_BYTES = 64 << 20


def parse_logged_text(text: str) -> tuple[str, float, str]:
    """``"NAME=VALUE"`` -> ``(name, value, value as typed)``; ValueError naming the problem otherwise."""
    if "=" not in text:
        raise ValueError(
            f"--logged expects NAME=VALUE (e.g. kl=0.0123) or a log history file (.json, .jsonl, .csv), "
            f"got {escape_text(text)!r}"
        )
    name, value = text.rsplit("=", 1)
    name = name.strip()
    try:
        v = float(value)
    except ValueError:
        raise ValueError(f"--logged {escape_text(name)}: {escape_text(value)!r} is not a number") from None
    if not name or not math.isfinite(v):
        raise ValueError(f"--logged expects NAME=VALUE with a finite number, got {escape_text(text)!r}")
    return name, v, value.strip()


def parse_logged(text: str) -> tuple[str, float]:
    """``"NAME=VALUE"`` -> ``(name, value)``; ValueError naming the problem otherwise."""
    name, v, _ = parse_logged_text(text)
    return name, v


def is_history(text: str) -> bool:
    """Whether a ``--logged`` argument names a log-history file rather than ``NAME=VALUE``."""
    p = Path(text)
    return p.suffix.lower() in (".json", ".jsonl", ".csv") and ("=" not in text or p.is_file())


def match_logged(d: Diagnosis, logged: Sequence[tuple], rows: RowTerms | None = None) -> list[dict[str, Any]]:
    """One item per logged value: ``{name, value, consistent, matches, closest, candidates, ...}``
    (:func:`klviz.diagnose.identify.identify`). ``logged`` holds ``(name, value)`` or ``(name, value, text)``;
    ``rows`` replaces the diagnosis' own per-row sums (several dumps of one step)."""
    rt = rows if rows is not None else d.row_terms
    if rt is None:
        raise ValueError(
            "this diagnosis kept no per-row sums to identify logged values with: run "
            "diagnose(..., logged=[(name, value)]) or diagnose(..., identify=[names])"
        )
    out = []
    for item in logged:
        name, value = str(item[0]), float(item[1])
        text = str(item[2]) if len(item) > 2 else None
        out.append(identify(name, value, rt, text=text))
    return out


# -- log histories ------------------------------------------------------------------------------------------------


def _number(x: Any) -> float | None:
    if isinstance(x, bool) or x is None:
        return None
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _records_from_json(obj: Any) -> list[dict[str, Any]]:
    if isinstance(obj, dict) and isinstance(obj.get("log_history"), list):
        return [r for r in obj["log_history"] if isinstance(r, dict)]
    if isinstance(obj, list):
        return [r for r in obj if isinstance(r, dict)]
    if isinstance(obj, dict):
        out = []
        for k, v in obj.items():
            step = _number(k)
            if step is not None and isinstance(v, dict):
                out.append({"step": step, **v})
        if out:
            return out
    raise ValueError("expected a list of {step, metric: value} records, a trainer_state.json or {step: {...}}")


def read_history(path: str | Path) -> dict[float, dict[str, float]]:
    """A log history as ``{step: {name: value}}`` (numbers only; later records of a step update earlier ones).

    Reads JSON, JSON lines and CSV (see the module docstring). Raises :class:`RolloutFileError` (a
    ``ValueError``) naming the file on anything it cannot read.
    """
    p = Path(path)
    name = escape_text(p.name)
    try:
        size = p.stat().st_size
        if size > _MAX_HISTORY_BYTES:
            raise RolloutFileError(f"--logged {name}: {size:,} bytes is more than a log history needs (64 MiB)")
        text = p.read_text(encoding="utf-8")
    except OSError as err:
        raise RolloutFileError(f"--logged {name}: cannot read it ({err.strerror or err})") from None
    except UnicodeDecodeError:
        raise RolloutFileError(f"--logged {name}: not UTF-8 text") from None
    records: list[dict[str, Any]]
    try:
        if p.suffix.lower() == ".csv":
            records = list(csv.DictReader(text.splitlines()))
        elif p.suffix.lower() == ".jsonl":
            records = [json.loads(line) for line in text.splitlines() if line.strip()]
            records = [r for r in records if isinstance(r, dict)]
        else:
            records = _records_from_json(json.loads(text))
    except (ValueError, RecursionError, csv.Error) as err:
        raise RolloutFileError(f"--logged {name}: not a log history ({escape_text(str(err), 120)})") from None
    out: dict[float, dict[str, float]] = {}
    for r in records:
        step = next((_number(r[c]) for c in _STEP_COLUMNS if c in r and _number(r[c]) is not None), None)
        if step is None:
            continue
        vals = {str(k): v for k, v in ((k, _number(v)) for k, v in r.items()) if v is not None}
        for c in _STEP_COLUMNS:
            vals.pop(c, None)
        out.setdefault(step, {}).update(vals)
    if not out:
        raise RolloutFileError(f"--logged {name}: no record with a step ({', '.join(_STEP_COLUMNS)})")
    return out


def history_names(history: dict[float, dict[str, float]]) -> list[str]:
    """The names in a history that klviz knows formulas for (a ``train/`` prefix is read as none)."""
    known = set(known_names())
    names = {n for rec in history.values() for n in rec}
    return sorted(n for n in names if re.sub(r"^(train/|train_)", "", n) in known)


# -- a run against its log history -------------------------------------------------------------------------------


def _window(steps: list[float], logged_steps: list[float], target: float) -> list[float]:
    """The dump steps whose micro-batches make the value logged at ``target``: those in (previous logged
    step, target] (a framework that logs every k steps averages its metric over those steps)."""
    before = [s for s in logged_steps if s < target]
    lo = max(before) if before else -math.inf
    return [s for s in steps if lo < s <= target]


def _missing_steps(window: list[float], logged_steps: list[float], target: float) -> list[float]:
    """Integer steps the value logged at ``target`` averages but no dump holds."""
    before = [s for s in logged_steps if s < target]
    lo = max(before) if before else min(window)
    if not all(float(s).is_integer() for s in [*window, lo, target]):
        return []
    first = int(lo) + 1 if before else int(lo)
    return [float(k) for k in range(first, int(target) + 1) if float(k) not in window]


def _span(missing: list[float], window: list[float]) -> str:
    steps = sorted({*missing, *window})
    return f"{steps[0]:g}–{steps[-1]:g}" if len(steps) > 1 else f"{steps[0]:g}"


def _combined(items: list[tuple[str, float, Diagnosis]]) -> RowTerms | None:
    """The per-row sums of several dumps as one batch: the ranks of one step share micro-batch indices,
    different steps never do."""
    import numpy as np

    parts = []
    for i, (_name, step, d) in enumerate(sorted(items, key=lambda t: t[1])):
        rt = d.row_terms
        if rt is None:
            return None
        groups = rt.groups if rt.groups is not None else np.zeros(len(rt.counts), dtype=np.int64)
        parts.append((step, rt, groups, i))
    steps = sorted({p[0] for p in parts})
    out = []
    for step, rt, groups, _i in parts:
        g = groups.astype(np.int64) + (1 << 20) * steps.index(step)
        out.append(RowTerms(rt.counts, rt.width, rt.dtypes, rt.roles, rt.terms, g))
    return RowTerms.concat(out) if len(out) > 1 else out[0]


def check_history(
    items: Sequence[tuple[str, float | None, Any]], history: dict[float, dict[str, float]]
) -> dict[str, Any]:
    """Each logged step's known metrics identified on the dumps that made them.

    ``items`` are ``(file name, step, Diagnosis or error)`` (:func:`klviz.diagnose.diagnose_series`). Dump step
    K is paired with logged step K + offset for the offset in (0, +1, −1) under which most logged values are
    exact (0 on a tie): the TRL integration labels dumps with the step TRL logs (offset 0); a dump written in
    TRL's ``_generate_and_score_completions`` carries ``global_step`` before the update, so ``kl_dump_stepK``
    pairs with logged step K + 1. Returns ``{"offset", "offsets": {offset: exact matches}, "steps": [{step,
    dumps, logged: [items]}], "note"}``.
    """
    good = [(n, float(s), d) for n, s, d in items if isinstance(d, Diagnosis) and s is not None]
    known = set(history_names(history))
    logged_steps = sorted(s for s, rec in history.items() if known & set(rec))
    by_offset: dict[int, list[dict[str, Any]]] = {}
    for offset in (0, 1, -1):
        rows = []
        dump_steps = sorted({s + offset for _n, s, _d in good})
        for target in logged_steps:
            window = _window(dump_steps, logged_steps, target)
            members = [(n, s + offset, d) for n, s, d in good if s + offset in window]
            if not members:
                continue
            rt = _combined(members)
            rec = history[target]
            logged = [(name, value) for name, value in sorted(rec.items()) if name in known]
            entry: dict[str, Any] = {"step": target, "dumps": [n for n, _s, _d in members], "logged": []}
            missing = _missing_steps(window, logged_steps, target)
            if missing:
                entry["incomplete"] = missing
                entry["logged"] = [
                    {
                        "name": name,
                        "value": value,
                        "consistent": None,
                        "matches": [],
                        "closest": None,
                        "note": f"the value logged at step {target:g} averages steps {_span(missing, window)}; "
                        f"no dump of step(s) {', '.join(f'{m:g}' for m in missing[:5])}"
                        + ("…" if len(missing) > 5 else ""),
                    }
                    for name, value in logged
                ]
            elif rt is not None:
                entry["logged"] = [identify(name, value, rt) for name, value in logged]
            rows.append(entry)
        by_offset[offset] = rows
    exact = {o: sum(bool(it["consistent"]) for e in rows for it in e["logged"]) for o, rows in by_offset.items()}
    best = max((0, 1, -1), key=lambda o: (exact[o], o == 0))
    note = ""
    if best != 0:
        note = (
            f"the dumps look off by {best:+d} against the log: {exact[best]} logged value(s) are exact when dump "
            f"step K is paired with logged step K{best:+d}, {exact[0]} with K. A dump written in TRL's "
            "_generate_and_score_completions carries global_step before the update (kl_dump_stepK pairs with "
            "logged step K + 1); the pairing above uses K" + f"{best:+d}."
        )
    elif not by_offset[0]:
        note = "no dump step matches a logged step"
    return {"offset": best, "offsets": exact, "steps": by_offset[best], "note": note}
