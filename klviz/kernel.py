"""The one home of the per-sample KL estimator formulas, without input checks.

Every k1, k2 or k3 value klviz computes (the public :func:`klviz.k1`, :func:`klviz.k2`,
:func:`klviz.k3`, Monte Carlo tables, gradients, the bandit, the f-divergence demo, ``diagnose``,
pitfalls, worked tokens) comes from the functions here. They take a floating tensor ``log_r`` that
the caller has already checked, and do no validation of their own: use the public functions in
:mod:`klviz.estimators` on anything a user passed in.

Direction rule: the tokens x were drawn from the **sampler** q, ``log_r = log p(x) - log q(x)``
(target minus sampler), and k1, k2, k3 estimate **KL(q || p)**; :func:`kl_to_target` estimates the
other direction, **KL(p || q)**, from the same samples.

The only code elsewhere that writes an estimator out again is in :mod:`klviz.frameworks` (and the
worked clamp demo in :mod:`klviz.tokens`), where a framework's own formula differs from these, for
instance verl's ``exp(d) - d - 1`` whose float32 rounding near ``d = 0`` is itself a lesson; each
such place says so in a comment.
"""
from __future__ import annotations

from typing import Callable

import torch

Tensor = torch.Tensor

__all__ = ["ESTIMATORS", "k1", "k2", "k3", "kl_to_target", "estimate", "estimates", "k3_series_threshold"]

#: The three estimators of KL(q || p) from samples of q, in the order lessons show them.
ESTIMATORS: tuple[str, str, str] = ("k1", "k2", "k3")


def k1(log_r: Tensor) -> Tensor:
    """``-log r``: unbiased for KL(q || p) with x ~ q; negative wherever p(x) > q(x)."""
    return -log_r


def k2(log_r: Tensor) -> Tensor:
    """``½ (log r)²``: never negative; its mean matches KL(q || p) to second order in log r only."""
    return 0.5 * log_r * log_r


def k3_series_threshold(dtype: torch.dtype) -> float:
    """Below this |log r| the Taylor series of k3 is more accurate than ``expm1(t) - t`` in ``dtype``."""
    return 1e-3 if dtype == torch.float64 else 0.1


def k3(log_r: Tensor) -> Tensor:
    """``(r - 1) - log r``: unbiased for KL(q || p) with x ~ q, and never negative.

    ``expm1(t) - t`` loses the leading digits of its result to cancellation when t is small (the
    answer is t²/2, the two terms are of size t), so for ``|t|`` below
    :func:`k3_series_threshold` the Taylor series ``t²/2 + t³/6 + t⁴/24 + t⁵/120 + t⁶/720`` is used
    instead: full relative precision near r = 1, and finite up to |log r| ≈ 88 in float32.
    """
    t = log_r
    series = t * t * (0.5 + t * (1 / 6 + t * (1 / 24 + t * (1 / 120 + t / 720))))
    return torch.where(t.abs() < k3_series_threshold(t.dtype), series, torch.expm1(t) - t)


def kl_to_target(log_r: Tensor) -> Tensor:
    """``r log r - (r - 1)``: unbiased for the *other* direction, **KL(p || q)**, from x ~ q; never negative.

    The Bregman gap of ``t log t`` at ``t = r``. With ``u = log r`` it is ``u e^u - (e^u - 1)``,
    which cancels near ``u = 0`` like k3 does; there its series ``u²/2 + u³/3 + u⁴/8 + u⁵/30 + u⁶/144``
    is used instead.
    """
    t = log_r
    em1 = torch.expm1(t)
    series = t * t * (0.5 + t * (1 / 3 + t * (1 / 8 + t * (1 / 30 + t / 144))))
    return torch.where(t.abs() < k3_series_threshold(t.dtype), series, em1 * t + t - em1)


_FORMULAS: dict[str, Callable[[Tensor], Tensor]] = {"k1": k1, "k2": k2, "k3": k3}


def estimate(name: str, log_r: Tensor) -> Tensor:
    """The per-sample values of estimator ``name`` (``"k1"``, ``"k2"`` or ``"k3"``)."""
    return _FORMULAS[name](log_r)


def estimates(log_r: Tensor, names: tuple[str, ...] = ESTIMATORS) -> dict[str, Tensor]:
    """``{name: per-sample values}`` for each estimator in ``names`` (all three by default)."""
    return {name: _FORMULAS[name](log_r) for name in names}
