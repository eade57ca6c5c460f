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

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

Tensor = torch.Tensor

__all__ = [
    "ESTIMATORS",
    "k1",
    "k2",
    "k3",
    "kl_to_target",
    "estimate",
    "estimates",
    "k3_series_threshold",
    "k3_series",
    "k3_into",
]

#: The three estimators of KL(q || p) from samples of q, in the order lessons show them.
ESTIMATORS: tuple[str, str, str] = ("k1", "k2", "k3")


def k1(log_r: Tensor) -> Tensor:
    """``-log r``: unbiased for KL(q || p) with x ~ q; negative wherever p(x) > q(x).

    Arithmetic operators only, like :func:`k2` and :func:`k3_series`: a NumPy array works too.
    """
    return -log_r


def k2(log_r: Tensor) -> Tensor:
    """``½ (log r)²``: never negative; its mean matches KL(q || p) to second order in log r only."""
    return 0.5 * log_r * log_r


def k3_series_threshold(dtype: torch.dtype | np.dtype | type) -> float:
    """Below this |log r| the Taylor series of k3 is more accurate than ``expm1(t) - t`` in ``dtype``.

    ``dtype`` is a torch dtype or a NumPy one (the streaming loop of :func:`klviz.estimator_stats`
    computes k3 in NumPy buffers with :func:`k3_into`): 1e-3 for float64, 0.1 otherwise.
    """
    wide = dtype == torch.float64 if isinstance(dtype, torch.dtype) else np.dtype(dtype) == np.float64
    return 1e-3 if wide else 0.1


def k3_series(t: Any, out: Any = None, scratch: Any = None) -> Any:
    """k3's Taylor series at r = 1, ``t²/2 + t³/6 + t⁴/24 + t⁵/120 + t⁶/720`` with ``t = log r``.

    The one home of the series that :func:`k3` and :func:`k3_into` use. Without ``out`` it is an
    expression in arithmetic operators, so it evaluates a torch tensor (autograd included) and a
    NumPy array alike, in the input's dtype. With ``out`` and ``scratch`` (buffers like ``t``, NumPy
    arrays or torch tensors) the same operations in the same order run in place, so the result,
    returned in ``out``, is bitwise the same and nothing is allocated; no gradients then. Its
    truncation error, about t⁵/2520 relative, is below float32's rounding for |t| < 0.1.
    """
    if out is None:
        return t * t * (0.5 + t * (1 / 6 + t * (1 / 24 + t * (1 / 120 + t / 720))))
    xp = np if isinstance(t, np.ndarray) else torch
    s = xp.divide(t, 720, out=out)  # the expression above, innermost step first
    for coefficient in (1 / 120, 1 / 24, 1 / 6):
        s += coefficient
        s *= t
    s += 0.5
    s *= xp.multiply(t, t, out=scratch)
    return s


_HALF = (torch.float16, torch.bfloat16)


def k3(log_r: Tensor) -> Tensor:
    """``(r - 1) - log r``: unbiased for KL(q || p) with x ~ q, and never negative.

    ``expm1(t) - t`` loses the leading digits of its result to cancellation when t is small (the
    answer is t²/2, the two terms are of size t), so for ``|t|`` below
    :func:`k3_series_threshold` the Taylor series :func:`k3_series`
    (``t²/2 + t³/6 + t⁴/24 + t⁵/120 + t⁶/720``) is used instead: full relative precision near
    r = 1, and finite up to |log r| ≈ 88 in float32. Half-precision input is computed in float32
    and rounded once at the end. :func:`k3_into` is the same formula written into preallocated buffers.
    """
    t = log_r
    if t.dtype in _HALF:
        return k3(t.float()).to(t.dtype)
    return torch.where(t.abs() < k3_series_threshold(t.dtype), k3_series(t), torch.expm1(t) - t)


def _numpy_expm1_is_simd() -> bool:
    """Whether NumPy's expm1 has its AVX-512 (SVML) loop on this CPU. Elsewhere (an AMD EPYC without
    AVX-512, ARM) it calls libm's scalar expm1 per element: 500-970 µs per 65,536 float32 values
    (more for larger |t|), against about 20 µs with AVX-512 and about 100 µs for torch's expm1."""
    import importlib

    for name in ("numpy._core._multiarray_umath", "numpy.core._multiarray_umath"):  # NumPy 2, NumPy 1
        try:
            features = importlib.import_module(name).__cpu_features__
        except (ImportError, AttributeError):
            continue
        return bool(features.get("AVX512_SKX", False))
    return True


_NUMPY_EXPM1_IS_SIMD = _numpy_expm1_is_simd()


def k3_into(log_r: Any, out: Any, scratch: Any, scratch2: Any) -> Any:
    """:func:`k3` of ``log_r`` written into ``out``: for loops that stream chunks through buffers.

    ``log_r``, ``out`` and the two scratch buffers are NumPy arrays, or torch tensors, of one shape
    and floating dtype; ``log_r`` is left as it was, ``out`` is returned, nothing is allocated (on
    NumPy arrays). The values are those of :func:`k3`: the same :func:`k3_series`, the same
    :func:`k3_series_threshold` and the same choice at it. On NumPy arrays ``expm1`` is NumPy's
    where it is vectorised (AVX-512), which may differ from torch's in the last bit (amplified
    about 20-fold by the cancellation in ``expm1(t) - t`` just above the threshold), and torch's
    elsewhere (call it under :func:`klviz.devices.single_thread` then: one chunk is too small for
    a thread pool). No gradients.

    On NumPy arrays (the CPU path of :func:`klviz.estimator_stats`) the choice between the two
    branches takes no branch per element: NumPy's masked copies (``np.where``,
    ``np.copyto(where=...)``) mispredict a branch for about every other element when both kinds
    are common, and cost more than the rest of k3 together. Instead the sign bit of
    ``|t| - threshold``, set exactly where ``|t| < threshold``, is spread over the word by an
    arithmetic shift and picks the series' bits: ``out ^= (out ^ series) & mask``, an exact
    select. The series is evaluated everywhere; where ``|t|`` is large it may overflow, and those
    values are discarded unseen (no overflow or inf - inf warnings, as in torch).
    """
    t = log_r
    threshold = k3_series_threshold(t.dtype)
    if not isinstance(t, np.ndarray):
        series = k3_series(t, scratch, scratch2)
        torch.sub(torch.expm1(t, out=out), t, out=out)
        return torch.where(torch.abs(t, out=scratch2) < threshold, series, out, out=out)
    with np.errstate(over="ignore", invalid="ignore"):
        series = k3_series(t, scratch, scratch2)
        if _NUMPY_EXPM1_IS_SIMD:
            np.expm1(t, out=out)
        else:  # torch's vectorised expm1, on the same memory
            torch.expm1(torch.from_numpy(t), out=torch.from_numpy(out))
        out -= t
    ints = np.dtype(f"i{t.itemsize}")
    mask = np.subtract(np.abs(t, out=scratch2), threshold, out=scratch2).view(ints)
    np.right_shift(mask, 8 * t.itemsize - 1, out=mask)  # all ones where |t| < threshold, else 0
    bits, series_bits = out.view(ints), series.view(ints)
    series_bits ^= bits
    series_bits &= mask
    bits ^= series_bits
    return out


def kl_to_target(log_r: Tensor) -> Tensor:
    """``r log r - (r - 1)``: unbiased for the *other* direction, **KL(p || q)**, from x ~ q; never negative.

    The Bregman gap of ``t log t`` at ``t = r``. With ``u = log r`` it is ``e^u (u - 1) + 1``, which
    cancels near ``u = 0`` like k3 does; there its series ``u²/2 + u³/3 + u⁴/8 + u⁵/30 + u⁶/144``
    is used instead. The limits are kept in every dtype: ``+inf`` where ``e^u`` overflows (``u``
    above about 88.7 in float32, 709.8 in float64: the true value is beyond the dtype), and **1** at
    ``u = -inf`` (r = 0: the target gives the token no probability, ``r log r -> 0``).
    """
    t = log_r
    if t.dtype in _HALF:
        return kl_to_target(t.float()).to(t.dtype)
    series = t * t * (0.5 + t * (1 / 3 + t * (1 / 8 + t * (1 / 30 + t / 144))))
    # Above u = -1: (e^u - 1)(u - 1) + u, whose terms are of size u (no loss to cancellation beyond
    # the series' range); where e^u overflows it stays inf (inf times u - 1 > 0), where the textbook
    # e^u u + u - e^u gives inf - inf = NaN. Below: e^u (u - 1) + 1, which tends to 1 with nothing
    # left to cancel (the first form cancels two terms of size |u| there); u = -inf is its limit, 1.
    em1 = torch.expm1(t)
    above = em1 * (t - 1) + t
    below = torch.where(torch.isneginf(t), torch.ones_like(t), torch.exp(t) * (t - 1) + 1)
    gap = torch.where(t > -1, above, below)
    return torch.where(t.abs() < k3_series_threshold(t.dtype), series, gap)


_FORMULAS: dict[str, Callable[[Tensor], Tensor]] = {"k1": k1, "k2": k2, "k3": k3}


def estimate(name: str, log_r: Tensor) -> Tensor:
    """The per-sample values of estimator ``name`` (``"k1"``, ``"k2"`` or ``"k3"``)."""
    return _FORMULAS[name](log_r)


def estimates(log_r: Tensor, names: tuple[str, ...] = ESTIMATORS) -> dict[str, Tensor]:
    """``{name: per-sample values}`` for each estimator in ``names`` (all three by default)."""
    return {name: _FORMULAS[name](log_r) for name in names}
