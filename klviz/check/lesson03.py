"""Exercise checks for lesson 03, f-divergences and the Bregman view.

The checks name the usual mistakes: the estimator of the other direction (k3 instead of
r log r - (r - 1)), the plain r log r that can go negative, a ratio upside down, a sign error in a
curvature, a tangent taken at the sample instead of at r = 1.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from .. import kernel
from ..messages import tr
from . import (
    CheckResult,
    WrongAnswer,
    as_answer_number,
    clamp_hint,
    failed,
    learner_tensor,
    never_raises,
    not_attempted,
    passed,
)

__all__ = ["kl_pq_estimator", "k2_curvature", "concave_from", "bregman_estimator"]

_LOG_R = torch.tensor([-6.0, -2.5, -1.0, -0.3, -1e-3, 0.0, 2e-3, 0.4, 1.0, 2.2, 5.0], dtype=torch.float64)


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(torch.isfinite(a).all()) and torch.allclose(a, b, rtol=1e-5, atol=1e-9)


@never_raises
def kl_pq_estimator(fn: Callable[[torch.Tensor], Any]) -> CheckResult:
    """Exercise 1: ``fn(log_r)`` (log_r = log p - log q, x ~ q) must return r log r - (r - 1),
    the non-negative unbiased per-sample estimator of KL(p || q)."""
    got = learner_tensor(fn, (_LOG_R.clone(),), _LOG_R.shape, tr("the estimate"))
    if isinstance(got, CheckResult):
        return got
    lr = _LOG_R
    r = torch.exp(lr)
    right = kernel.kl_to_target(lr)
    if _close(got, right):
        return passed(
            tr(
                "r log r − (r − 1): the gap between t log t and its tangent at 1, never negative, and its "
                "mean under q is KL(p‖q)."
            )
        )
    wrong = {
        "k3": (
            kernel.k3(lr),
            tr(
                "That is k3 = (r − 1) − log r, which estimates KL(q‖p), the other direction; "
                "for KL(p‖q) start from f(t) = t log t."
            ),
        ),
        "naive": (
            r * lr,
            tr(
                "r log r alone is unbiased for KL(p‖q) but negative whenever r < 1; subtract the tangent "
                "f′(1)(r − 1) = r − 1, whose mean under q is zero."
            ),
        ),
        "sign": (
            -right,
            tr("The sign is flipped: the gap f(r) − f′(1)(r − 1) is curve minus tangent, never negative."),
        ),
        "inverted": (
            torch.exp(-lr) * (-lr) - torch.expm1(-lr),
            tr("The ratio is upside down: r = p(x)/q(x) = exp(log_r), target over sampler."),
        ),
        "plus": (
            r * lr + torch.expm1(lr),
            tr(
                "You added r − 1; subtract it: the tangent of t log t at 1 is t − 1, "
                "and the estimator is the curve minus the tangent."
            ),
        ),
    }
    for value, message in wrong.values():
        if _close(got, value):
            return failed(message)
    hint = clamp_hint(got, right, kernel.kl_to_target, lr)
    if hint:
        return failed(hint)
    if bool((got < -1e-12).any()):
        return failed(tr("Some estimates are negative; r log r − (r − 1) never is."))
    return failed(
        tr(
            "Not r log r − (r − 1) (at log r = 1 expected {right_8:.6f}, got {got_8:.6f}).",
            right_8=float(right[8]),
            got_8=float(got[8]),
        )
    )


_T = torch.tensor([0.05, 0.3, 1.0, 2.0, math.e, 4.0, 10.0, 50.0], dtype=torch.float64)


@never_raises
def k2_curvature(fn: Callable[[torch.Tensor], Any]) -> CheckResult:
    """Exercise 2a: ``fn(t)`` must return f''(t) for k2's generator f(t) = ½ (log t)²."""
    got = learner_tensor(fn, (_T.clone(),), _T.shape, tr("the curvature"))
    if isinstance(got, CheckResult):
        # two checks share the exercise's cell: say which part is still a skeleton
        return (
            got
            if got.attempted
            else not_attempted(tr("(a) Replace the `...` in k2_curvature with f″(t) and run the cell again."))
        )
    lt = torch.log(_T)
    right = (1 - lt) / _T**2
    if _close(got, right):
        return passed(tr("f″(t) = (1 − log t)/t²: positive up to t = e, negative beyond, so ½(log t)² is not convex."))
    wrong = {
        "sign": (-right, tr("The sign is flipped: f″(1) must be +1, like the curvature of −log t and t log t at 1.")),
        "one_t": (
            (1 - lt) / _T,
            tr("Missing a factor 1/t: f′(t) = log t / t, and differentiating it gives (1 − log t)/t²."),
        ),
        "first": (lt / _T, tr("That is the first derivative f′(t) = log t / t; differentiate once more.")),
        "minus_log": (
            1 / _T**2,
            tr("That is the curvature of −log t (1/t²), which is never negative; ½(log t)² has (1 − log t)/t²."),
        ),
    }
    for value, message in wrong.values():
        if _close(got, value):
            return failed(message)
    return failed(
        tr(
            "Not f″ of ½(log t)² (at t = 4 expected {right_5:.6f}, got {got_5:.6f}).",
            right_5=float(right[5]),
            got_5=float(got[5]),
        )
    )


def concave_from(answer: Any) -> CheckResult:
    """Exercise 2b: the ratio t beyond which ½ (log t)² bends the wrong way (f'' < 0): e, to two decimals at least."""
    if answer is Ellipsis or answer is None:
        # two checks share the exercise's cell: say which part is still a skeleton
        return not_attempted(tr("(b) Set CONCAVE_FROM to the ratio t beyond which f″ < 0 and run the cell again."))
    return _concave_from(answer)


@never_raises
def _concave_from(answer: Any) -> CheckResult:
    try:
        value = as_answer_number(answer, "CONCAVE_FROM", finite=True)
    except WrongAnswer as err:
        return failed(str(err) + ".")
    if abs(value - math.e) <= 0.005:  # the exercise asks for two decimals at least: 2.72 is e to two decimals
        exact = (
            ""
            if abs(value - math.e) < 1e-9
            else tr(" (you gave {value:g}; exactly, it is e = {e:.6f}…)", value=value, e=math.e)
        )
        return passed(
            tr("t = e ≈ 2.718{exact}: a sample with p(x)/q(x) > e lands where k2's generator is concave.", exact=exact)
        )
    if abs(value - math.e) < 0.05:
        return failed(tr("Close ({value:g}), but not to two decimals: solve (1 − log t)/t² = 0 exactly.", value=value))
    if abs(value - 1.0) < 1e-3:
        return failed(tr("At t = 1 the curvature is +1 (the second-order match with KL); it turns negative later."))
    if abs(value - math.exp(2)) < 1e-2 or abs(value - 2.0) < 1e-3:
        return failed(tr("Solve f″(t) = (1 − log t)/t² = 0: log t = 1."))
    return failed(tr("Not where (1 − log t)/t² changes sign (got {value:.4g}).", value=value))


def _generators() -> list[tuple[Callable, Callable]]:
    """Generators as (f, f') in t, including ones the lesson never showed."""
    return [
        (lambda t: -torch.log(t), lambda t: -1 / t),
        (lambda t: t * torch.log(t), lambda t: torch.log(t) + 1),
        # Jensen-Shannon (times 2): f(t) = t log t - (t + 1) log((t + 1)/2)
        (
            lambda t: t * torch.log(t) - (t + 1) * torch.log((t + 1) / 2),
            lambda t: torch.log(t) - torch.log((t + 1) / 2),
        ),
        # a power generator, (t^3 - 1)/6, convex for t > 0, with f'(1) = 1/2
        (lambda t: (t**3 - 1) / 6, lambda t: t**2 / 2),
    ]


@never_raises
def bregman_estimator(fn: Callable[[Callable, Callable, torch.Tensor], Any]) -> CheckResult:
    """Exercise 3: ``fn(f, df, log_r)`` must return f(r) - f'(1)(r - 1) with r = exp(log_r), for any
    generator f with derivative df (both functions of a tensor t)."""
    lr = _LOG_R[1:-1]  # |log r| <= 2.5 keeps every generator finite
    r = torch.exp(lr)
    one = torch.ones((), dtype=torch.float64)
    results = []
    for f, df in _generators():
        got = learner_tensor(fn, (f, df, lr.clone()), lr.shape, tr("the estimate"))
        if isinstance(got, CheckResult):
            return got
        results.append((got, f, df))
    if all(_close(got, f(r) - df(one) * (r - 1)) for got, f, df in results):
        return passed(
            tr(
                "f(r) − f′(1)(r − 1): unbiased for D_f because E_q[r − 1] = 0, and never negative when f is "
                "convex, for every generator, including the Jensen–Shannon and power ones you had not seen."
            )
        )
    checks = [
        (
            lambda f, df: f(r) - df(r) * (r - 1),
            tr(
                "The tangent is taken at the sample (f′(r)); take it at r = 1, where E_q[r − 1] = 0 "
                "makes the correction "
                "vanish on average."
            ),
        ),
        (lambda f, df: f(r) + df(one) * (r - 1), tr("Sign: subtract f′(1)(r − 1), the tangent, from f(r).")),
        (lambda f, df: f(lr) - df(one) * (lr - 1), tr("You evaluated f at log r; r = exp(log_r).")),
        (lambda f, df: f(r), tr("You returned f(r) alone: unbiased, but not the Bregman gap; subtract f′(1)(r − 1).")),
        (
            lambda f, df: f(r) - (r - 1),
            tr(
                "You subtracted (r − 1) with slope 1 for every f; the slope is f′(1), "
                "which depends on f (−1 for −log t, +1 for t log t)."
            ),
        ),
    ]
    for formula, message in checks:
        if all(_close(got, formula(f, df)) for got, f, df in results):
            return failed(message)
    return failed(tr("Not f(r) − f′(1)(r − 1) for every generator (the Jensen–Shannon case may help you debug)."))
