"""Input checking shared by every public function.

Every public function of klviz turns bad input into a ``ValueError`` that names the argument
and says what is wrong with it, instead of letting a NaN travel silently into a plot or a log.
"""

from __future__ import annotations

from collections.abc import Sequence
from numbers import Real
from typing import Any

import numpy as np
import torch

Tensor = torch.Tensor


class ArgumentTypeError(TypeError, ValueError):
    """An argument of the wrong kind (a string, None, booleans where numbers belong).

    Both a ``TypeError`` (what it is) and a ``ValueError`` (what klviz's API promises for any bad
    input), so ``except ValueError`` and ``except TypeError`` both catch it.
    """


_LOW_PRECISION = (torch.float16, torch.bfloat16)


def _describe(x: Any) -> str:
    return type(x).__name__


def _from_sequence(x: Sequence[Any], name: str) -> Tensor:
    """A float tensor from nested Python numbers; booleans and strings are refused, not converted."""
    for item in _flatten(x):
        if isinstance(item, (bool, np.bool_)):
            raise ArgumentTypeError(
                f"{name} holds booleans ({item!r}); pass numbers (a mask of 0/1 goes in a mask argument)"
            )
        if not isinstance(item, (Real, np.number)):
            raise ArgumentTypeError(
                f"{name} must hold numbers, got an element of type {_describe(item)} ({item!r:.40})"
            )
    try:
        return torch.as_tensor(x, dtype=torch.get_default_dtype())
    except (TypeError, ValueError, RuntimeError) as err:
        raise ValueError(f"{name} could not be read as a tensor of numbers: {err}") from None


def _from_numpy(x: np.ndarray, name: str) -> Tensor:
    """A tensor sharing or copying a NumPy array: any byte order and stride; long double as float64."""
    if x.dtype == np.bool_ or not (np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.integer)):
        raise ArgumentTypeError(f"{name} must hold floating-point numbers, got a NumPy array of dtype {x.dtype}")
    if np.issubdtype(x.dtype, np.floating) and x.dtype.itemsize > 8:
        x = x.astype(np.float64)  # long double: klviz computes in at most float64
    if not x.dtype.isnative:
        x = x.astype(x.dtype.newbyteorder("="))  # big-endian data read by value, not by bytes
    if not x.flags.c_contiguous:  # np.ascontiguousarray would also turn a 0-d array into shape (1,)
        x = x.copy(order="C")
    return torch.from_numpy(x)


def as_float_tensor(
    x: Any,
    name: str,
    *,
    allow_empty: bool = False,
    check_finite: bool = True,
    allow_neg_inf: bool = False,
) -> Tensor:
    """Return ``x`` as a floating tensor of at least float32 precision, or raise naming ``name``.

    Python numbers, (nested) lists of numbers and float NumPy arrays (any byte order or stride; long
    double becomes float64) are converted. Refused with ``TypeError``: booleans, strings, ``None``
    and other objects; with ``ValueError``: integer, boolean and complex tensors (a log-probability
    is never an integer, so an integer tensor is almost always a mix-up with token ids), tensors on
    the ``meta`` device (they hold no numbers), empty input and, unless allowed, NaN or inf.
    float16 and bfloat16 are upcast to float32, float64 is kept.
    """
    if isinstance(x, Tensor):
        t = x
    elif isinstance(x, np.ndarray):
        t = _from_numpy(x, name)
    elif isinstance(x, np.generic) and not isinstance(x, np.bool_):
        t = _from_numpy(np.asarray(x), name)
    elif isinstance(x, (bool, np.bool_)):
        raise ArgumentTypeError(f"{name} must be a number or a tensor of numbers, got the boolean {x!r}")
    elif isinstance(x, Real):
        t = torch.as_tensor(float(x), dtype=torch.get_default_dtype())
    elif isinstance(x, (list, tuple)):
        t = _from_sequence(x, name)
    else:
        raise ArgumentTypeError(f"{name} must be a torch tensor (or numbers), got {_describe(x)}")
    if t.device.type == "meta":
        raise ValueError(f"{name} is a tensor on the 'meta' device: it has a shape but no numbers to compute with")
    if t.is_sparse or t.layout != torch.strided:
        raise ValueError(f"{name} must be a dense tensor, got layout {t.layout}")
    if not t.is_floating_point():
        raise ValueError(
            f"{name} must be a floating-point tensor, got dtype {t.dtype} "
            "(log-probabilities and logits are real floats; did you pass token ids?)"
        )
    if t.numel() == 0 and not allow_empty:
        raise ValueError(f"{name} is empty (shape {tuple(t.shape)}); there is nothing to estimate from")
    if t.dtype in _LOW_PRECISION:
        t = t.float()
    if check_finite and t.numel() > 0:
        check_finite_values(t, name, allow_neg_inf=allow_neg_inf)
    return t


def as_mask(mask: Any, like: Tensor, name: str = "mask") -> Tensor:
    """``mask`` as a tensor of ``like``'s dtype and device: 0 leaves a position out, any other weight counts.

    Booleans, integers and floats are accepted (lists and NumPy arrays too); ``None``, strings and
    other objects raise ``TypeError`` naming ``name``; NaN, inf or negative weights ``ValueError``.
    """
    if mask is None or isinstance(mask, (str, bytes, dict)):
        raise ArgumentTypeError(
            f"{name} must be a tensor of 0/1 (or weights) with the values' shape, got {_describe(mask)}"
        )
    if isinstance(mask, Tensor):
        m = mask
    elif isinstance(mask, np.ndarray) and mask.dtype == np.bool_:
        m = torch.from_numpy(mask.copy())
    elif isinstance(mask, (list, tuple)) and all(isinstance(v, (bool, np.bool_)) for v in _flatten(mask)):
        m = torch.as_tensor(mask, dtype=torch.bool)
    elif isinstance(mask, (list, tuple)):
        for v in _flatten(mask):
            if not isinstance(v, (Real, np.number)):
                raise ArgumentTypeError(f"{name} must hold 0/1 or weights, got an element of type {_describe(v)}")
        m = torch.as_tensor(mask, dtype=torch.float64)
    elif isinstance(mask, np.ndarray):
        m = _from_numpy(mask, name)
    else:
        raise ArgumentTypeError(f"{name} must be a tensor of 0/1 (or weights), got {_describe(mask)}")
    if m.device.type == "meta":
        raise ValueError(f"{name} is a tensor on the 'meta' device: it holds no values")
    if m.is_complex():
        raise ValueError(f"{name} must be real, got dtype {m.dtype}")
    if m.is_floating_point():
        check_finite_values(m, name)
    m = m.to(dtype=like.dtype, device=like.device)
    if m.is_floating_point() and not bool(torch.isfinite(m).all()):
        raise ValueError(
            f"{name} has weights too large for {like.dtype} (they overflow to inf); use weights of a sensible size"
        )
    if bool((m < 0).any()):
        raise ValueError(f"{name} has negative entries; a mask weights tokens by 0 (out) or 1 (in)")
    return m


def _flatten(x: Any) -> list[Any]:
    out: list[Any] = []
    stack = [x]
    while stack:
        item = stack.pop()
        if isinstance(item, (list, tuple)):
            stack.extend(item)
        else:
            out.append(item)
    return out


def check_dim(dim: Any, ndim: int, name: str = "dim") -> int:
    """``dim`` as a non-negative axis of an ``ndim``-dimensional tensor (NumPy integers accepted)."""
    if isinstance(dim, (bool, np.bool_)) or not isinstance(dim, (int, np.integer)):
        raise ArgumentTypeError(f"{name} must be an integer axis, got {_describe(dim)} {dim!r}")
    d = int(dim)
    if not -ndim <= d < ndim:
        raise ValueError(f"{name}={d} is out of range for a tensor with {ndim} dimension(s)")
    return d % ndim


def check_finite_values(t: Tensor, name: str, *, allow_neg_inf: bool = False, where: Tensor | None = None) -> None:
    """Raise ``ValueError`` if ``t`` holds NaN or infinite values (optionally only where ``where`` is true)."""
    bad = torch.isnan(t) | (torch.isposinf(t) if allow_neg_inf else torch.isinf(t))
    if where is not None:
        bad = bad & where
    n_bad = int(bad.sum())
    if n_bad:
        n_nan = int((torch.isnan(t) & bad).sum())
        what = "NaN" if n_nan == n_bad else ("inf" if n_nan == 0 else "NaN or inf")
        raise ValueError(
            f"{name} contains {n_bad} {what} value(s) out of {t.numel()}; clean or mask them before estimating a KL"
        )


def check_same_shape(a: Tensor, b: Tensor, name_a: str, name_b: str) -> None:
    """Raise ``ValueError`` unless ``a`` and ``b`` have exactly the same shape."""
    if a.shape != b.shape:
        raise ValueError(
            f"{name_a} has shape {tuple(a.shape)} but {name_b} has shape {tuple(b.shape)}; "
            "they must match position by position"
        )


def common_dtype(*ts: Tensor) -> torch.dtype:
    """float64 if any input is float64, else float32."""
    return torch.float64 if any(t.dtype == torch.float64 for t in ts) else torch.float32


def check_choice(value: Any, name: str, choices: tuple[str, ...]) -> str:
    """Return ``value`` if it is one of ``choices``, else raise ``ValueError`` listing them."""
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(repr(c) for c in choices)}; got {value!r}")
    return value


def check_positive_number(value: Any, name: str, *, allow_inf: bool = False) -> float:
    """Return ``value`` as a float if it is a positive real number (``inf`` only with ``allow_inf``), else raise
    ``ValueError`` naming ``name`` (strings, booleans, None, NaN, zero and negative numbers are refused)."""
    if isinstance(value, (bool, np.bool_, complex, np.complexfloating)) or not isinstance(value, (Real, np.number)):
        raise ArgumentTypeError(f"{name} must be a positive number, got {_describe(value)} {value!r:.40}")
    v = float(value)
    if not (v > 0 and (allow_inf or v != float("inf"))):
        what = "a positive number" if allow_inf else "a positive, finite number"
        raise ValueError(f"{name} must be {what}, got {value!r}")
    return v


def check_positive_int(value: Any, name: str, *, maximum: int | None = None) -> int:
    """Return ``value`` as an int if it is a positive integer (at most ``maximum``), else raise ``ValueError``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if maximum is not None and value > maximum:
        raise ValueError(
            f"{name}={value:,} is more than {maximum:,}, the most klviz will draw in one call "
            "(it would run for hours); use fewer samples or several calls"
        )
    return int(value)
