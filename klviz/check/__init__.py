"""Self-checks for the exercises: each takes a learner's function or answer and says what is wrong.

Usage in a lesson: ``klviz.check.lesson02.k3_estimator(my_k3)``. A result is truthy when correct and
displays as one sentence.
"""
from __future__ import annotations

import html
import importlib
from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["CheckResult", "passed", "failed", "not_attempted", "call_learner", "WrongAnswer", "as_answer_tensor",
           "as_answer_number", "learner_answer", "learner_tensor"]


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


class WrongAnswer(Exception):
    """A learner's answer of the wrong kind (type, shape, non-finite); its message is the sentence shown."""


def as_answer_tensor(value: Any, shape: tuple[int, ...], what: str, *, finite: bool = False) -> Any:
    """``value`` as a float64 tensor of ``shape``, or :class:`WrongAnswer` saying what is off."""
    import torch

    if not isinstance(value, torch.Tensor):
        try:
            value = torch.as_tensor(value, dtype=torch.float64)
        except (TypeError, ValueError, RuntimeError):
            raise WrongAnswer(f"{what} should be a tensor of numbers, got {type(value).__name__}") from None
    if value.shape != shape:
        raise WrongAnswer(f"{what} should have shape {tuple(shape)} (one value per input), got {tuple(value.shape)}")
    value = value.detach().to(torch.float64)
    if finite and not bool(torch.isfinite(value).all()):
        raise WrongAnswer(f"{what} returned NaN or inf values")
    return value


def as_answer_number(value: Any, what: str, *, finite: bool = False) -> float:
    """``value`` (a number, NumPy scalar or one-element tensor) as a float, or :class:`WrongAnswer`."""
    import math

    import torch

    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise WrongAnswer(f"{what} should be one number, got a tensor of shape {tuple(value.shape)}")
        value = value.detach().double().item()
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise WrongAnswer(f"{what} should be a number, got {type(value).__name__}") from None
    if finite and not math.isfinite(number):
        raise WrongAnswer(f"{what} is {number}; it should be a finite number")
    return number


def learner_answer(fn: Callable[..., Any], *args: Any, convert: Callable[[Any], Any] | None = None) -> Any:
    """Call a learner's function and return its answer, through ``convert`` if given (which raises
    :class:`WrongAnswer` for an answer of the wrong kind); or, instead, the :class:`CheckResult` to
    show: "not attempted" for a skeleton, one sentence for a wrong kind of answer or an exception.
    A check returns the result as soon as it gets one: ``if isinstance(out, CheckResult): return out``."""
    try:
        out = call_learner(fn, *args)
        return out if convert is None else convert(out)
    except _NotAttempted:
        return not_attempted()
    except WrongAnswer as err:
        return failed(str(err))
    except Exception as err:  # noqa: BLE001 - the learner's code may raise anything; say what
        return failed(f"your function raised {type(err).__name__}: {err}")


def learner_tensor(fn: Callable[..., Any], args: tuple, shape: tuple[int, ...], what: str, *,
                   finite: bool = False) -> Any:
    """:func:`learner_answer` for an answer that must be a float64 tensor of ``shape``."""
    return learner_answer(fn, *args, convert=lambda out: as_answer_tensor(out, shape, what, finite=finite))


def __getattr__(name: str) -> Any:  # lazy: klviz.check.lesson02 imports klviz.check.lesson02
    if name.startswith("lesson"):
        try:
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError:
            raise AttributeError(name) from None
    raise AttributeError(name)
