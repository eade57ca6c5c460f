"""Self-checks for the exercises: each takes a learner's function or answer and says what is wrong.

Usage in a lesson: ``klviz.check.lesson02.k3_estimator(my_k3)``. A result is truthy when correct and
displays as one sentence.
"""

from __future__ import annotations

import functools
import html
import importlib
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from ..messages import N_, tr

__all__ = [
    "CheckResult",
    "passed",
    "failed",
    "not_attempted",
    "call_learner",
    "WrongAnswer",
    "as_answer_tensor",
    "as_answer_number",
    "learner_answer",
    "learner_tensor",
    "never_raises",
    "raised_message",
    "clamp_hint",
]


@dataclass(frozen=True)
class CheckResult:
    """Outcome of a check: ``ok`` and one sentence for the learner."""

    ok: bool
    message: str
    attempted: bool = True

    def __bool__(self) -> bool:
        return self.ok

    def __repr__(self) -> str:
        mark = tr("correct") if self.ok else (tr("not attempted yet") if not self.attempted else tr("not yet"))
        return f"[{mark}] {_CODE.sub(_plain, self._shown())}"

    def _repr_html_(self) -> str:
        from ..palette import PAGE_CSS, css

        colour = css("good") if self.ok else (css("muted") if not self.attempted else css("bad"))
        mark = tr("✔ correct") if self.ok else (tr("… not attempted yet") if not self.attempted else tr("✘ not yet"))
        if self._static():
            mark = tr("… not run on this page")
        message = _CODE.sub(_code, html.escape(self._shown()))  # `x` in a message is code
        head = tr("{mark}:", mark=mark)
        return f"{PAGE_CSS}<div class='klviz-check' style='color:{colour}'><b>{head}</b> {message}</div>"

    def _static(self) -> bool:
        """Whether this is an exercise not attempted on a page that cannot run code (the static site)."""
        return not self.attempted and os.environ.get("KLVIZ_STATIC", "").strip().lower() in ("1", "true", "yes")

    def _shown(self) -> str:
        """The message, or for an exercise not attempted on a page that cannot run (the static site,
        ``KLVIZ_STATIC=1``), how to run it."""
        return tr(STATIC_NOT_ATTEMPTED) if self._static() else self.message


#: What a check that was not attempted says on a page that cannot run code (the static site).
STATIC_NOT_ATTEMPTED = N_(
    "this page is a copy that cannot run code. To try the exercise, download the lesson (link at the top of the "
    "page) and open it with `klviz lab`, or run `make lab` in a checkout; complete the function and run its cell."
)

_CODE = re.compile(r"`([^`]+)`")


def _plain(m: re.Match[str]) -> str:
    return m.group(1)


def _code(m: re.Match[str]) -> str:
    return f"<code>{m.group(1)}</code>"


def passed(message: str) -> CheckResult:
    return CheckResult(True, message)


def failed(message: str) -> CheckResult:
    return CheckResult(False, message)


def not_attempted(what: str | None = None) -> CheckResult:
    """An exercise not attempted yet: ``what`` to do (by default: replace the ``...`` and run the cell)."""
    if what is None:
        what = tr("Replace the `...` with your answer and run the cell again.")
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

    if isinstance(value, (str, bytes, dict)) or callable(value):
        raise WrongAnswer(tr("{what} should be a tensor of numbers, got {name}", what=what, name=type(value).__name__))
    if not isinstance(value, torch.Tensor):
        try:
            value = torch.as_tensor(value, dtype=torch.float64)
        except (TypeError, ValueError, RuntimeError):
            raise WrongAnswer(
                tr("{what} should be a tensor of numbers, got {name}", what=what, name=type(value).__name__)
            ) from None
    if value.is_complex() or value.dtype == torch.bool:
        raise WrongAnswer(tr("{what} should be real numbers, got a tensor of {dtype}", what=what, dtype=value.dtype))
    if value.shape != shape:
        raise WrongAnswer(
            tr(
                "{what} should have shape {tuple} (one value per input), got {tuple2}",
                what=what,
                tuple=tuple(shape),
                tuple2=tuple(value.shape),
            )
        )
    value = value.detach().to(torch.float64)
    if finite and not bool(torch.isfinite(value).all()):
        raise WrongAnswer(tr("{what} returned NaN or inf values", what=what))
    return value


def as_answer_number(value: Any, what: str, *, finite: bool = False) -> float:
    """``value`` (a number, NumPy scalar or one-element tensor) as a float, or :class:`WrongAnswer`."""
    import math

    import torch

    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise WrongAnswer(
                tr("{what} should be one number, got a tensor of shape {tuple}", what=what, tuple=tuple(value.shape))
            )
        if value.is_complex():
            raise WrongAnswer(tr("{what} should be a real number, got a complex tensor", what=what))
        value = value.detach().double().item()
    if isinstance(value, (str, bytes, bool)):
        raise WrongAnswer(
            tr("{what} should be a number, got {name} {value!r}", what=what, name=type(value).__name__, value=value)
        )
    try:
        number = float(value)
    except (TypeError, ValueError, RuntimeError):
        raise WrongAnswer(tr("{what} should be a number, got {name}", what=what, name=type(value).__name__)) from None
    if finite and not math.isfinite(number):
        raise WrongAnswer(tr("{what} is {number}; it should be a finite number", what=what, number=number))
    return number


def learner_answer(
    fn: Callable[..., Any], *args: Any, convert: Callable[[Any], Any] | None = None, when: str = ""
) -> Any:
    """Call a learner's function and return its answer, through ``convert`` if given (which raises
    :class:`WrongAnswer` for an answer of the wrong kind); or, instead, the :class:`CheckResult` to
    show: "not attempted" for a skeleton, one sentence for a wrong kind of answer or an exception.
    A check returns the result as soon as it gets one: ``if isinstance(out, CheckResult): return out``.

    ``when`` (e.g. ``"on float32 input"``) marks a later call of a function that already answered
    once: a ``None`` or ``...`` there is a missing answer for those inputs, not an unstarted exercise,
    and the sentence says where it happened."""
    try:
        out = call_learner(fn, *args)
        return out if convert is None else convert(out)
    except _NotAttempted:
        if when:
            return failed(
                tr("Your function returned no value {when} (None or ...): it must return one there too.", when=when)
            )
        return not_attempted()
    except WrongAnswer as err:
        return failed(f"{err} ({when})" if when else str(err))
    except Exception as err:  # noqa: BLE001 - the learner's code may raise anything; say what
        return failed(raised_message(err, when))


def raised_message(err: BaseException, when: str = "") -> str:
    """One sentence for an exception raised by a learner's function, with a hint when the cause is
    mixing torch and plain numbers (``torch.exp`` on a float, ``math.exp`` on a tensor)."""
    text = str(err).splitlines()[0] if str(err) else ""
    where = f" {when}" if when else ""
    hint = ""
    if isinstance(err, TypeError) and "must be Tensor" in text:
        hint = tr(
            " (a torch function got a plain Python number: use math.exp/math.log/math.expm1 on numbers, "
            "or wrap the number with torch.tensor(...))"
        )
    elif isinstance(err, (TypeError, RuntimeError, ValueError)) and (
        "only one element tensors" in text
        or "converted to Python scalars" in text
        or "must be real number, not Tensor" in text
    ):
        hint = tr(
            " (a math-module function got a tensor: your function receives tensors here, so use "
            "torch.exp, torch.log, torch.expm1, which work elementwise)"
        )
    return tr(
        "Your function raised {name}{where}: {text_}{hint}.",
        name=type(err).__name__,
        where=where,
        text_=text,
        hint=hint,
    )


def clamp_hint(got: Any, right: Any, formula: Callable[[Any], Any], log_r: Any) -> str | None:
    """Say so when a learner's values are the right formula with a clamp, as frameworks apply one.

    ``got`` and ``right`` are float64 tensors of the learner's and the exact values at ``log_r``;
    ``formula(log_r)`` computes the exact values. Detects a clamp of the input log r to ±b (b in
    5, 10, 20, 40) and a clamp of the result to at most the value where the two first differ.
    Returns the sentence, or None.
    """
    import torch

    close = torch.isclose(got, right, rtol=1e-6, atol=1e-9)
    if bool(close.all()) or not bool(torch.isfinite(got).all()):
        return None
    for bound in (5.0, 10.0, 20.0, 40.0):
        clamped = formula(log_r.clamp(-bound, bound))
        if bool(torch.allclose(got, clamped, rtol=1e-6, atol=1e-9)):
            return tr(
                "Your function clamps log r to [-{bound:g}, {bound:g}] (as verl's low_var_kl clamps to "
                "±20): right formula, but the exercise asks for the unclamped value, and a clamp changes "
                "the estimate for large |log r|.",
                bound=bound,
            )
    wrong = ~close
    cap_hi, cap_lo = float(got[wrong].max()), float(got[wrong].min())
    for cap in {cap_hi, cap_lo}:
        below = cap == cap_hi and bool((got[wrong] <= right[wrong]).all())
        capped = right.clamp(max=cap) if below else right.clamp(min=cap)
        if bool(torch.allclose(got, capped, rtol=1e-6, atol=1e-9)):
            return tr(
                "Your function clamps its result at {cap:g} (verl clamps low_var_kl to [-10, 10], "
                "OpenRLHF every estimator): right formula, but the exercise asks for the unclamped value.",
                cap=cap,
            )
    return None


_Check = TypeVar("_Check", bound=Callable[..., CheckResult])


def never_raises(check: _Check) -> _Check:
    """Wrap a check so that nothing a learner passes (None, a string, a dict, a tensor with grad, a
    tuple, a function that raises) escapes as an exception: each gets a one-sentence verdict."""

    @functools.wraps(check)
    def wrapper(*args: Any, **kwargs: Any) -> CheckResult:
        if args and (args[0] is Ellipsis or args[0] is None):
            return not_attempted()
        try:
            return check(*args, **kwargs)
        except _NotAttempted:
            return not_attempted()
        except WrongAnswer as err:
            return failed(str(err))
        except Exception as err:  # noqa: BLE001 - a check must answer, whatever it was given
            kind = type(args[0]).__name__ if args else "nothing"
            return failed(
                tr(
                    "The check could not use your answer (a {kind}): {name}: {v}. See the exercise for what to return.",
                    kind=kind,
                    name=type(err).__name__,
                    v=str(err).splitlines()[0] if str(err) else "",
                )
            )

    return wrapper  # type: ignore[return-value]


def learner_tensor(
    fn: Callable[..., Any], args: tuple, shape: tuple[int, ...], what: str, *, finite: bool = False, when: str = ""
) -> Any:
    """:func:`learner_answer` for an answer that must be a float64 tensor of ``shape``."""
    return learner_answer(fn, *args, convert=lambda out: as_answer_tensor(out, shape, what, finite=finite), when=when)


def __getattr__(name: str) -> Any:  # lazy: klviz.check.lesson02 imports klviz.check.lesson02
    if name.startswith("lesson"):
        try:
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError:
            raise AttributeError(name) from None
    raise AttributeError(name)
