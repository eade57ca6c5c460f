"""Input checking shared by every public function.

Every public function of klviz turns bad input into a ``ValueError`` that names the argument
and says what is wrong with it, instead of letting a NaN travel silently into a plot or a log.
"""
from __future__ import annotations

from numbers import Real
from typing import Any

import numpy as np
import torch

Tensor = torch.Tensor

_LOW_PRECISION = (torch.float16, torch.bfloat16)


def as_float_tensor(
    x: Any,
    name: str,
    *,
    allow_empty: bool = False,
    check_finite: bool = True,
    allow_neg_inf: bool = False,
) -> Tensor:
    """Return ``x`` as a floating tensor of at least float32 precision, or raise ``ValueError``.

    Python numbers, lists and float NumPy arrays are converted; integer and boolean tensors are
    refused (a log-probability is never an integer, so an integer tensor is almost always a mix-up
    with token ids). float16 and bfloat16 are upcast to float32, float64 is kept.
    """
    if isinstance(x, Tensor):
        t = x
    elif isinstance(x, np.ndarray):
        if not np.issubdtype(x.dtype, np.floating):
            raise ValueError(f"{name} must hold floating-point numbers, got a NumPy array of dtype {x.dtype}")
        t = torch.from_numpy(np.ascontiguousarray(x))
    elif isinstance(x, (Real, list, tuple)) and not isinstance(x, bool):
        try:
            t = torch.as_tensor(x, dtype=torch.get_default_dtype())
        except (TypeError, ValueError) as err:
            raise ValueError(f"{name} could not be read as a tensor of numbers: {err}") from None
    else:
        raise ValueError(f"{name} must be a torch tensor (or numbers), got {type(x).__name__}")
    if not t.is_floating_point():
        raise ValueError(
            f"{name} must be a floating-point tensor, got dtype {t.dtype} "
            "(log-probabilities and logits are floats; did you pass token ids?)"
        )
    if t.numel() == 0 and not allow_empty:
        raise ValueError(f"{name} is empty (shape {tuple(t.shape)}); there is nothing to estimate from")
    if t.dtype in _LOW_PRECISION:
        t = t.float()
    if check_finite and t.numel() > 0:
        check_finite_values(t, name, allow_neg_inf=allow_neg_inf)
    return t


def check_finite_values(t: Tensor, name: str, *, allow_neg_inf: bool = False, where: Tensor | None = None) -> None:
    """Raise ``ValueError`` if ``t`` holds NaN or infinite values (optionally only where ``where`` is true)."""
    bad = torch.isnan(t) | (torch.isposinf(t) if allow_neg_inf else torch.isinf(t))
    if where is not None:
        bad = bad & where
    n_bad = int(bad.sum())
    if n_bad:
        n_nan = int((torch.isnan(t) & bad).sum())
        what = "NaN" if n_nan == n_bad else ("inf" if n_nan == 0 else "NaN or inf")
        raise ValueError(f"{name} contains {n_bad} {what} value(s) out of {t.numel()}; "
                         "clean or mask them before estimating a KL")


def check_same_shape(a: Tensor, b: Tensor, name_a: str, name_b: str) -> None:
    """Raise ``ValueError`` unless ``a`` and ``b`` have exactly the same shape."""
    if a.shape != b.shape:
        raise ValueError(f"{name_a} has shape {tuple(a.shape)} but {name_b} has shape {tuple(b.shape)}; "
                         "they must match position by position")


def common_dtype(*ts: Tensor) -> torch.dtype:
    """float64 if any input is float64, else float32."""
    return torch.float64 if any(t.dtype == torch.float64 for t in ts) else torch.float32


def check_choice(value: Any, name: str, choices: tuple[str, ...]) -> str:
    """Return ``value`` if it is one of ``choices``, else raise ``ValueError`` listing them."""
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(repr(c) for c in choices)}; got {value!r}")
    return value


def check_positive_int(value: Any, name: str) -> int:
    """Return ``value`` as an int if it is a positive integer, else raise ``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)
