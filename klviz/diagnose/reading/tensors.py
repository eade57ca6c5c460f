"""Whole dumps in memory (lessons and panels): :func:`load_rollouts` reads a file into a
:class:`RolloutDump`, :func:`rollouts_from_tensors` validates tensors the same way, :func:`save_rollouts`
writes a dump ``klviz diagnose`` reads."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .core import DEFAULT_MAX_TOKENS, RolloutFileError, quoted
from .dump import DEFAULT_KEYS, SUFFIXES, label, open_dump
from .npz import numpy_dtype_name
from .safetensors import write_safetensors

__all__ = ["RolloutDump", "load_rollouts", "rollouts_from_tensors", "save_rollouts", "sample_rollouts_path"]


@dataclass
class RolloutDump:
    """One batch read from a rollout dump: validated log-probabilities as float64 ``[batch, tokens]``
    tensors (not to be confused with :class:`klviz.lm.Rollouts`, responses the tiny LM sampled)."""

    logprob: torch.Tensor
    ref_logprob: torch.Tensor
    mask: torch.Tensor  # bool [batch, tokens]
    old_logprob: torch.Tensor | None = None
    source: str = "tensors"
    keys: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_KEYS))
    dtypes: dict[str, str] = field(default_factory=dict)
    rollout_logprob: torch.Tensor | None = None
    tokens: np.ndarray | None = None  # strings [batch, tokens], or None
    token_ids: np.ndarray | None = None  # integers [batch, tokens], or None
    step: float | None = None

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.logprob.shape)  # type: ignore[return-value]


def sample_rollouts_path() -> Path:
    """Path of the sample dump shipped with klviz (made with the tiny language model)."""
    return Path(__file__).resolve().parents[2] / "data" / "sample_rollouts.npz"


def _mask_bool(m: np.ndarray, name: str) -> np.ndarray:
    if m.dtype == np.bool_:
        return m
    mf = m.astype(np.float64, copy=False)
    ok = (mf == 0) | (mf == 1)
    if not ok.all():
        bad = mf[~ok]
        raise RolloutFileError(
            f"{name} must hold only 0 and 1; found {bad.size} other value(s), e.g. {float(bad[0]):g}"
        )
    return mf == 1


def load_rollouts(
    path: str | Path,
    *,
    logprob_key: str = "logprob",
    ref_key: str = "ref_logprob",
    mask_key: str = "response_mask",
    old_key: str | None = "old_logprob",
    require_old: bool = False,
    rollout_key: str | None = "rollout_logprob",
    max_tokens: int = DEFAULT_MAX_TOKENS,
) -> RolloutDump:
    """Read and validate a whole rollout dump (see :func:`open_dump`) into a :class:`RolloutDump`.

    For the command line's streaming analysis use :func:`open_dump` and :func:`klviz.diagnose.diagnose`
    on the path; this reads everything into float64 tensors (for lessons and panels).
    """
    with open_dump(
        path,
        logprob_key=logprob_key,
        ref_key=ref_key,
        mask_key=mask_key,
        old_key=old_key,
        require_old=require_old,
        rollout_key=rollout_key,
        max_tokens=max_tokens,
    ) as f:
        b = f.shape[0]
        arrays = {role: f.rows(role, 0, b) for role in f.keys if role not in ("step",)}
        mask = _mask_bool(arrays["response_mask"], label(f.keys["response_mask"], "response_mask"))
        if not mask.any():
            raise RolloutFileError(
                f"{label(f.keys['response_mask'], 'response_mask')} selects no token: nothing to diagnose"
            )
        t = {
            role: torch.from_numpy(np.ascontiguousarray(arrays[role], dtype=np.float64))
            for role in ("logprob", "ref_logprob", "old_logprob", "rollout_logprob")
            if role in arrays
        }
        return RolloutDump(
            t["logprob"],
            t["ref_logprob"],
            torch.from_numpy(mask),
            t.get("old_logprob"),
            source=str(path),
            keys={k: v for k, v in f.keys.items()},
            dtypes=f.dtypes,
            rollout_logprob=t.get("rollout_logprob"),
            tokens=arrays.get("tokens"),
            token_ids=arrays.get("token_ids"),
            step=f.step(),
        )


def _to_array(value: Any, key: str) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu()
        if t.layout != torch.strided:
            raise RolloutFileError(f"{quoted(key)} is a {t.layout} tensor; pass a dense tensor")
        if t.dtype == torch.bfloat16:
            return t.float().numpy()
        return t.contiguous().numpy()
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "biuf":
            raise RolloutFileError(f"key {quoted(key)} has dtype {value.dtype}; expected numbers")
        return np.ascontiguousarray(value.astype(value.dtype.newbyteorder("="), copy=False))
    arr = _rectangular(value, key)
    if arr.dtype.kind not in "biuf":
        raise RolloutFileError(f"key {quoted(key)} holds a {type(value).__name__}, expected a tensor or array")
    return arr


def _rectangular(value: Any, key: str, dtype: Any = None) -> np.ndarray:
    """``np.asarray(value)`` with NumPy's own complaint about ragged lists replaced by one naming ``key``."""
    try:
        return np.asarray(value, dtype=dtype)
    except (ValueError, TypeError):
        raise RolloutFileError(
            f"{quoted(key)} is not a [batch, tokens] array (rows of different lengths, or mixed types?)"
        ) from None


def _dtype_name(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return str(value.dtype).replace("torch.", "")
    return numpy_dtype_name(np.asarray(value).dtype)


def rollouts_from_tensors(
    logprob: Any,
    ref_logprob: Any,
    response_mask: Any,
    old_logprob: Any = None,
    *,
    rollout_logprob: Any = None,
    tokens: Any = None,
    token_ids: Any = None,
    step: float | None = None,
) -> RolloutDump:
    """Validate in-memory tensors (or arrays) the same way a file is validated."""
    given = {
        "logprob": logprob,
        "ref_logprob": ref_logprob,
        "response_mask": response_mask,
        "old_logprob": old_logprob,
        "rollout_logprob": rollout_logprob,
    }
    arrays = {role: _to_array(v, role) for role, v in given.items() if v is not None}
    dtypes = {role: _dtype_name(given[role]) for role in arrays}
    lp = arrays["logprob"]
    for role, a in arrays.items():
        if role != "response_mask" and a.dtype.kind != "f":
            raise RolloutFileError(
                f"{label(role, role)} has dtype {dtypes[role]}; log-probabilities must be floating "
                "point (token ids by mistake?)"
            )
        if a.ndim != 2:
            raise RolloutFileError(
                f"{label(role, role)} has shape {tuple(a.shape)}; every key must be [batch, tokens] (2-D)"
            )
        if a.shape != lp.shape:
            raise RolloutFileError(
                f"shape mismatch: '{role}' is {tuple(a.shape)} but 'logprob' is {tuple(lp.shape)}; "
                "they must match token by token"
            )
    if lp.size == 0:
        raise RolloutFileError(f"the batch is empty (shape {tuple(lp.shape)})")
    mask = _mask_bool(arrays["response_mask"], "'response_mask'")
    if not mask.any():
        raise RolloutFileError("'response_mask' selects no token: nothing to diagnose")
    t = {
        role: torch.from_numpy(np.ascontiguousarray(a, dtype=np.float64))
        for role, a in arrays.items()
        if role != "response_mask"
    }
    tok = None if tokens is None else _rectangular(tokens, "tokens", dtype=object)
    ids = None if token_ids is None else _rectangular(token_ids, "token_ids")
    for name, extra in (("tokens", tok), ("token_ids", ids)):
        if extra is not None and extra.shape != lp.shape:
            raise RolloutFileError(
                f"shape mismatch: '{name}' is {tuple(extra.shape)} but 'logprob' is {tuple(lp.shape)}"
            )
    keys = {k: k for k in arrays}
    return RolloutDump(
        t["logprob"],
        t["ref_logprob"],
        torch.from_numpy(mask),
        t.get("old_logprob"),
        source="tensors",
        keys=keys,
        dtypes=dtypes,
        rollout_logprob=t.get("rollout_logprob"),
        tokens=tok,
        token_ids=ids,
        step=step,
    )


def save_rollouts(
    path: str | Path,
    logprob: Any,
    ref_logprob: Any,
    response_mask: Any,
    old_logprob: Any = None,
    *,
    rollout_logprob: Any = None,
    token_ids: Any = None,
    step: int | None = None,
) -> Path:
    """Write a rollout dump that ``klviz diagnose`` reads: ``.npz``, ``.pt`` or ``.safetensors`` by suffix.

    Inputs are ``[batch, tokens]`` tensors or arrays; log-probs are stored as float32 (pass float64
    arrays to an ``.npz`` yourself if you need more), the mask as int8 0/1, ``token_ids`` as int64,
    ``step`` as a one-element int64 array.
    """
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix not in SUFFIXES:
        raise ValueError(f"path must end in one of {', '.join(SUFFIXES)}, got '{p.name}'")
    r = rollouts_from_tensors(
        logprob, ref_logprob, response_mask, old_logprob, rollout_logprob=rollout_logprob, token_ids=token_ids
    )
    data: dict[str, np.ndarray] = {
        "logprob": r.logprob.float().numpy(),
        "ref_logprob": r.ref_logprob.float().numpy(),
        "response_mask": r.mask.numpy().astype(np.int8),
    }
    for role in ("old_logprob", "rollout_logprob"):
        v = getattr(r, role)
        if v is not None:
            data[role] = v.float().numpy()
    if token_ids is not None:
        data["token_ids"] = np.asarray(token_ids).astype(np.int64)
    if step is not None:
        data["step"] = np.asarray([int(step)], dtype=np.int64)
    if suffix == ".npz":
        np.savez_compressed(p, **data)  # type: ignore[arg-type]  # the stubs type every keyword as allow_pickle
    elif suffix in (".pt", ".pth"):
        torch.save({k: torch.from_numpy(v) for k, v in data.items()}, p)
    else:
        write_safetensors(p, data)
    return p
