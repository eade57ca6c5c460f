"""Reading rollout dumps safely: ``.pt`` only with ``weights_only``, ``.npz`` without pickles, ``.safetensors``.

:func:`load_rollouts` reads and validates a file into a :class:`RolloutDump`; :func:`rollouts_from_tensors`
validates in-memory tensors the same way; :func:`save_rollouts` writes a dump that ``klviz diagnose``
reads. Every problem with a file is a :class:`RolloutFileError` whose message is one line.
"""
from __future__ import annotations

import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = ["RolloutFileError", "RolloutDump", "DEFAULT_KEYS", "load_rollouts", "rollouts_from_tensors",
           "save_rollouts", "sample_rollouts_path"]

#: The key each role is read from unless renamed (``--logprob-key`` ... on the command line).
DEFAULT_KEYS: dict[str, str] = {
    "logprob": "logprob", "ref_logprob": "ref_logprob", "response_mask": "response_mask", "old_logprob": "old_logprob",
}
_SUFFIXES = (".pt", ".pth", ".npz", ".safetensors")


class RolloutFileError(ValueError):
    """A rollout dump that cannot be used; the message is one line that says why."""


@dataclass
class RolloutDump:
    """One batch read from a rollout dump: validated log-probabilities as float64 ``[batch, tokens]``
    tensors (not to be confused with :class:`klviz.lm.Rollouts`, responses the tiny LM sampled)."""

    logprob: torch.Tensor
    ref_logprob: torch.Tensor
    mask: torch.Tensor                      # bool [batch, tokens]
    old_logprob: torch.Tensor | None = None
    source: str = "tensors"
    keys: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_KEYS))
    dtypes: dict[str, str] = field(default_factory=dict)

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.logprob.shape)  # type: ignore[return-value]


def sample_rollouts_path() -> Path:
    """Path of the sample dump shipped with klviz (made with the tiny language model)."""
    return Path(__file__).resolve().parent.parent / "data" / "sample_rollouts.npz"


def _one_line(text: str, limit: int = 200) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _flatten(obj: Any, prefix: str = "", out: dict[str, Any] | None = None, depth: int = 0) -> dict[str, Any]:
    """Flatten nested mappings into ``a.b`` keys (a verl-style ``{"batch": {...}}`` dict works)."""
    out = {} if out is None else out
    if depth > 4:
        return out
    for k, v in obj.items():
        name = f"{prefix}{k}"
        if isinstance(v, Mapping):
            _flatten(v, name + ".", out, depth + 1)
        else:
            out[name] = v
    return out


def _magic(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read(8)


def _read_pt(path: Path) -> dict[str, Any]:
    head = _magic(path)
    if not (head.startswith(b"PK") or head[:1] == b"\x80"):
        raise RolloutFileError("refused: not a torch.save file (neither a zip archive nor a binary pickle); "
                               "nothing in it was executed")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - every failure becomes one line
        msg = str(err)
        found = re.search(r"GLOBAL\s+([\w.]+)", msg)
        if "weights_only" in msg or "WeightsUnpickler" in msg or found:
            what = f" (it asks for {found.group(1)})" if found else ""
            raise RolloutFileError(
                f"refused: the file's pickle wants more than tensors{what}; klviz loads .pt only with "
                "torch.load(weights_only=True), so nothing in it was executed. Save a plain dict of tensors") from None
        raise RolloutFileError(f"not a readable PyTorch file ({type(err).__name__}: {_one_line(msg, 120)})") from None
    if not isinstance(obj, Mapping):
        raise RolloutFileError(f"the file holds a {type(obj).__name__}, expected a dict of tensors keyed by name")
    return _flatten(obj)


def _read_npz(path: Path) -> dict[str, Any]:
    head = _magic(path)
    if head[:1] == b"\x80":
        raise RolloutFileError("refused: the file is a Python pickle, not an .npz archive; klviz reads .npz with "
                               "allow_pickle=False, so nothing in it was executed")
    if not head.startswith(b"PK"):
        raise RolloutFileError("not an .npz archive (no zip signature), so it was not opened; save with numpy.savez or "
                               "klviz.diagnose.save_rollouts")
    try:
        with np.load(path, allow_pickle=False) as data:
            return {name: np.array(data[name]) for name in data.files}
    except ValueError as err:
        if "pickle" in str(err).lower():
            raise RolloutFileError("refused: an array in the archive holds pickled Python objects; klviz reads .npz "
                                   "with allow_pickle=False, so nothing in it was executed. Save numeric arrays only") from None
        raise RolloutFileError(f"not a readable .npz archive ({_one_line(str(err), 120)})") from None
    except Exception as err:  # noqa: BLE001
        raise RolloutFileError(f"not a readable .npz archive ({type(err).__name__}: {_one_line(str(err), 120)})") from None


def _read_safetensors(path: Path) -> dict[str, Any]:
    try:
        from safetensors.torch import load_file
    except ImportError:
        raise RolloutFileError("reading .safetensors needs the 'safetensors' package (pip install safetensors); "
                               "or save the dump as .npz or .pt") from None
    try:
        return dict(load_file(str(path), device="cpu"))
    except Exception as err:  # noqa: BLE001
        raise RolloutFileError(f"not a readable .safetensors file ({type(err).__name__}: {_one_line(str(err), 120)})") from None


def _to_tensor(value: Any, key: str) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "biuf":
            raise RolloutFileError(f"key '{key}' has dtype {value.dtype}; expected numbers")
        return torch.from_numpy(np.ascontiguousarray(value))
    raise RolloutFileError(f"key '{key}' holds a {type(value).__name__}, expected a tensor or array")


def load_rollouts(path: str | Path, *, logprob_key: str = "logprob", ref_key: str = "ref_logprob",
                  mask_key: str = "response_mask", old_key: str | None = "old_logprob",
                  require_old: bool = False) -> RolloutDump:
    """Read and validate a rollout dump; raise :class:`RolloutFileError` (a ``ValueError``) with one line.

    ``old_key`` is optional: when the file has no such key the tokens are taken to be sampled by the
    policy in ``logprob`` (on-policy), unless ``require_old`` is true (the user named the key).
    """
    p = Path(path)
    if not p.exists():
        raise RolloutFileError(f"no such file: {p}")
    if p.is_dir():
        raise RolloutFileError(f"{p} is a directory, expected a rollout dump file")
    suffix = p.suffix.lower()
    if suffix not in _SUFFIXES:
        raise RolloutFileError(f"not a recognised rollout dump: '{p.name}' should end in "
                               f"{', '.join(_SUFFIXES)} (other files are not opened, pickles never)")
    try:
        if p.stat().st_size == 0:
            raise RolloutFileError(f"{p.name} is empty")
        if suffix in (".pt", ".pth"):
            raw = _read_pt(p)
        elif suffix == ".npz":
            raw = _read_npz(p)
        else:
            raw = _read_safetensors(p)
    except OSError as err:
        raise RolloutFileError(f"cannot read {p.name}: {err.strerror or err}") from None

    keys = {"logprob": logprob_key, "ref_logprob": ref_key, "response_mask": mask_key}
    for role, key in keys.items():
        if key not in raw:
            available = ", ".join(sorted(raw)[:12]) or "none"
            raise RolloutFileError(f"missing key {_label(key, role)}; the file has: {available}. "
                                   f"Rename with --{_option(role)}")
    if old_key is not None and old_key in raw:
        keys["old_logprob"] = old_key
    elif require_old:
        raise RolloutFileError(f"missing key {_label(old_key, 'old_logprob')}; the file has: {', '.join(sorted(raw)[:12])}")
    tensors = {role: _to_tensor(raw[key], key) for role, key in keys.items()}
    return _validate(tensors["logprob"], tensors["ref_logprob"], tensors["response_mask"],
                     tensors.get("old_logprob"), source=str(p), keys=keys)


def _label(key: str, role: str) -> str:
    return f"'{key}'" if key == role else f"'{key}' ({role})"


def _option(role: str) -> str:
    return {"logprob": "logprob-key", "ref_logprob": "ref-key", "response_mask": "mask-key",
            "old_logprob": "old-key"}[role]


def rollouts_from_tensors(logprob: Any, ref_logprob: Any, response_mask: Any, old_logprob: Any = None) -> RolloutDump:
    """Validate in-memory tensors (or arrays) the same way a file is validated."""
    ts = {}
    for name, v in (("logprob", logprob), ("ref_logprob", ref_logprob), ("response_mask", response_mask),
                    ("old_logprob", old_logprob)):
        if v is None:
            continue
        ts[name] = _to_tensor(v if isinstance(v, (torch.Tensor, np.ndarray)) else np.asarray(v), name)
    return _validate(ts["logprob"], ts["ref_logprob"], ts["response_mask"], ts.get("old_logprob"),
                     source="tensors", keys={k: k for k in ts})


def _validate(lp: torch.Tensor, ref: torch.Tensor, mask: torch.Tensor, old: torch.Tensor | None, *,
              source: str, keys: dict[str, str]) -> RolloutDump:
    named = [("logprob", lp), ("ref_logprob", ref)] + ([("old_logprob", old)] if old is not None else [])
    for role, t in named:
        if not t.is_floating_point():
            raise RolloutFileError(f"{_label(keys[role], role)} has dtype {str(t.dtype).replace('torch.', '')}; "
                                   "log-probabilities must be floating point (token ids by mistake?)")
    if mask.is_complex():
        raise RolloutFileError(f"{_label(keys['response_mask'], 'response_mask')} has dtype {mask.dtype}; expected bool, int or 0/1 floats")
    for role, t in named + [("response_mask", mask)]:
        if t.dim() != 2:
            raise RolloutFileError(f"{_label(keys[role], role)} has shape {tuple(t.shape)}; every key must be "
                                   "[batch, tokens] (2-D)")
    for role, t in named[1:] + [("response_mask", mask)]:
        if t.shape != lp.shape:
            raise RolloutFileError(f"shape mismatch: '{keys[role]}' is {tuple(t.shape)} but '{keys['logprob']}' is "
                                   f"{tuple(lp.shape)}; they must match token by token")
    if lp.numel() == 0:
        raise RolloutFileError(f"the batch is empty (shape {tuple(lp.shape)})")
    m = mask
    if m.dtype != torch.bool:
        mf = m.double()
        if not bool(torch.isfinite(mf).all()) or not bool(((mf == 0) | (mf == 1)).all()):
            bad = mf[~((mf == 0) | (mf == 1))]
            raise RolloutFileError(f"{_label(keys['response_mask'], 'response_mask')} must hold only 0 and 1; found "
                                   f"{bad.numel()} other value(s), e.g. {float(bad[0]):g}")
        m = mf == 1
    if not bool(m.any()):
        raise RolloutFileError(f"{_label(keys['response_mask'], 'response_mask')} selects no token: nothing to diagnose")
    dtypes = {role: str(t.dtype).replace("torch.", "") for role, t in named + [("response_mask", mask)]}
    return RolloutDump(logprob=lp.double(), ref_logprob=ref.double(), mask=m,
                    old_logprob=None if old is None else old.double(), source=source, keys=dict(keys), dtypes=dtypes)


def save_rollouts(path: str | Path, logprob: Any, ref_logprob: Any, response_mask: Any, old_logprob: Any = None) -> Path:
    """Write a rollout dump that ``klviz diagnose`` reads: ``.npz``, ``.pt`` or ``.safetensors`` by suffix.

    Inputs are ``[batch, tokens]`` tensors or arrays; log-probs are stored as float32 (pass float64
    arrays to an ``.npz`` yourself if you need more), the mask as int8 0/1.
    """
    p = Path(path)
    r = rollouts_from_tensors(logprob, ref_logprob, response_mask, old_logprob)
    data = {"logprob": r.logprob.float(), "ref_logprob": r.ref_logprob.float(), "response_mask": r.mask.to(torch.int8)}
    if r.old_logprob is not None:
        data["old_logprob"] = r.old_logprob.float()
    suffix = p.suffix.lower()
    if suffix == ".npz":
        np.savez_compressed(p, **{k: v.numpy() for k, v in data.items()})
    elif suffix in (".pt", ".pth"):
        torch.save(data, p)
    elif suffix == ".safetensors":
        try:
            from safetensors.torch import save_file
        except ImportError:
            raise ValueError("writing .safetensors needs the 'safetensors' package; use .npz or .pt instead") from None
        save_file({k: v.contiguous() for k, v in data.items()}, str(p))
    else:
        raise ValueError(f"path must end in one of {', '.join(_SUFFIXES)}, got {p.name!r}")
    return p
