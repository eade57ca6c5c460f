"""Self-checks for the exercises: each takes a learner's function or answer and says what is wrong.

Usage in a lesson: ``klviz.check.lesson02.k3_estimator(my_k3)``. A result is truthy when correct and
displays as one sentence.
"""
from __future__ import annotations

import html
import importlib
from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["CheckResult", "passed", "failed", "not_attempted", "call_learner"]


@dataclass(frozen=True)
class CheckResult:
    """Outcome of a check: ``ok`` and one sentence for the learner."""

    ok: bool
    message: str
    attempted: bool = True

    def __bool__(self) -> bool:
        return self.ok

    def __repr__(self) -> str:
        mark = "correct" if self.ok else ("not attempted yet" if not self.attempted else "not yet")
        return f"[{mark}] {self.message}"

    def _repr_html_(self) -> str:
        colour = "#1b7f3b" if self.ok else ("#666" if not self.attempted else "#b00020")
        mark = "✔ correct" if self.ok else ("… not attempted yet" if not self.attempted else "✘ not yet")
        return f"<div style='color:{colour}'><b>{mark}:</b> {html.escape(self.message)}</div>"


def passed(message: str) -> CheckResult:
    return CheckResult(True, message)


def failed(message: str) -> CheckResult:
    return CheckResult(False, message)


def not_attempted(what: str = "Replace the `...` with your answer and run the cell again.") -> CheckResult:
    return CheckResult(False, what, attempted=False)


class _NotAttempted(Exception):
    pass


def call_learner(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call a learner's function; an unfinished skeleton (returns ``...`` or raises
    ``NotImplementedError``) raises :class:`_NotAttempted`, which the checks turn into "not attempted"."""
    try:
        out = fn(*args, **kwargs)
    except NotImplementedError:
        raise _NotAttempted from None
    if out is Ellipsis or out is None:
        raise _NotAttempted
    return out


def __getattr__(name: str) -> Any:  # lazy: klviz.check.lesson02 imports klviz.check.lesson02
    if name.startswith("lesson"):
        try:
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError:
            raise AttributeError(name) from None
    raise AttributeError(name)
