"""An opened dump: the path checked, the format's headers judged, the roles (``logprob``, ...) found.

:func:`open_dump` opens one file with a fresh reader (no state survives from one file to the next)
and reads nothing but headers; :class:`DumpFile` then serves ``[rows, tokens]`` slices of each role.
"""

from __future__ import annotations

import math
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

from .core import DEFAULT_MAX_TOKENS, ArraySpec, Limits, RolloutFileError, escape_text, quoted
from .npz import open_npz
from .pt import open_pt
from .safetensors import open_safetensors
from .sources import file_kind, open_regular

__all__ = ["DumpFile", "open_dump", "DEFAULT_KEYS", "OPTIONAL_KEYS", "SUFFIXES", "label", "check_path"]

#: The key each role is read from unless renamed (``--logprob-key`` ... on the command line).
DEFAULT_KEYS: dict[str, str] = {
    "logprob": "logprob",
    "ref_logprob": "ref_logprob",
    "response_mask": "response_mask",
    "old_logprob": "old_logprob",
}
#: Optional keys read when present: the engine's log-probs, token identities, the training step.
OPTIONAL_KEYS: dict[str, str] = {
    "rollout_logprob": "rollout_logprob",
    "tokens": "tokens",
    "token_ids": "token_ids",
    "step": "step",
}
SUFFIXES = (".pt", ".pth", ".npz", ".safetensors")
_LOGPROB_ROLES = ("logprob", "ref_logprob", "old_logprob", "rollout_logprob")
_TABLE_ROLES = ("logprob", "ref_logprob", "response_mask", "old_logprob", "rollout_logprob", "tokens", "token_ids")
_MASK_DTYPES = ("bool", "int8", "uint8", "int16", "int32", "int64")
_ID_DTYPES = ("int64", "int32", "int16", "int8", "uint8", "uint16", "uint32")
_MAX_STEP = 2**53  # a step is an integer a float64 holds exactly


@dataclass
class DumpFile:
    """An opened dump: its arrays as declared (:class:`~.core.ArraySpec`), the roles found, read row by row."""

    path: Path
    specs: dict[str, ArraySpec]
    keys: dict[str, str]  # role -> key
    shape: tuple[int, int]
    _fh: Any = None
    _archive: Any = field(default=None, repr=False)

    @property
    def source(self) -> str:
        return str(self.path)

    @property
    def dtypes(self) -> dict[str, str]:
        return {role: self.specs[key].dtype for role, key in self.keys.items() if role not in ("step",)}

    def rows(self, role: str, r0: int, r1: int) -> np.ndarray:
        return self.specs[self.keys[role]].rows(r0, r1)

    def step(self) -> float | None:
        key = self.keys.get("step")
        return None if key is None else _step(self.specs[key])

    def close(self) -> None:
        for spec in self.specs.values():
            spec.close()
        if self._archive is not None:
            self._archive.close()
            self._archive = None
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def __enter__(self) -> DumpFile:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _step(spec: ArraySpec) -> float:
    """The training step a dump declares: one finite number, an integer within 2**53."""
    if spec.numel != 1 or not (spec.is_float or spec.dtype in _ID_DTYPES):
        raise RolloutFileError(
            f"{quoted(spec.key)} holds {spec.dtype} of shape {spec.shape}; expected one number (the training step)"
        )
    value = float(np.asarray(spec.whole(), dtype=np.float64).reshape(-1)[0])
    if not math.isfinite(value) or abs(value) > _MAX_STEP:
        raise RolloutFileError(f"{quoted(spec.key)} holds {value:.6g}; expected a training step (a finite integer)")
    return value


def label(key: str, role: str) -> str:
    """A key as messages name it, with its role when renamed: ``'lp' (logprob)``."""
    return quoted(key) if key == role else f"{quoted(key)} ({role})"


def _option(role: str) -> str:
    return {
        "logprob": "logprob-key",
        "ref_logprob": "ref-key",
        "response_mask": "mask-key",
        "old_logprob": "old-key",
        "rollout_logprob": "rollout-key",
    }.get(role, role)


def check_path(p: Path) -> str:
    """The suffix of a path that names a dump file; a :class:`RolloutFileError` saying what it is otherwise."""
    try:
        mode = os.stat(p).st_mode
    except FileNotFoundError:
        raise RolloutFileError(f"no such file: {escape_text(p, 200)}") from None
    except OSError as err:
        raise RolloutFileError(f"cannot read {escape_text(p, 200)}: {err.strerror or err}") from None
    if stat.S_ISDIR(mode):
        raise RolloutFileError(f"{escape_text(p, 200)} is a directory, expected a rollout dump file")
    suffix = p.suffix.lower()
    if suffix not in SUFFIXES:
        raise RolloutFileError(
            f"not a recognised rollout dump: '{escape_text(p.name)}' should end in "
            f"{', '.join(SUFFIXES)} (other files are not opened, pickles never)"
        )
    if not stat.S_ISREG(mode):
        raise RolloutFileError(f"{escape_text(p.name)} is not a regular file ({file_kind(mode)}); expected a dump")
    return suffix


def _open_format(suffix: str, fh: IO[bytes], limits: Limits) -> tuple[dict[str, ArraySpec], Any]:
    if suffix in (".pt", ".pth"):
        return open_pt(fh, limits)
    if suffix == ".safetensors":
        return open_safetensors(fh, limits), None
    head = fh.read(8)
    fh.seek(0)
    if head[:1] == b"\x80":
        raise RolloutFileError(
            "refused: the file is a Python pickle, not an .npz archive; klviz reads .npz "
            "with allow_pickle=False, so nothing in it was executed"
        )
    if not head.startswith(b"PK"):
        raise RolloutFileError(
            "not an .npz archive (no zip signature), so it was not opened; save with "
            "numpy.savez or klviz.diagnose.save_rollouts"
        )
    return open_npz(fh, limits)


def open_dump(
    path: str | Path,
    *,
    logprob_key: str = "logprob",
    ref_key: str = "ref_logprob",
    mask_key: str = "response_mask",
    old_key: str | None = "old_logprob",
    require_old: bool = False,
    rollout_key: str | None = "rollout_logprob",
    require_rollout: bool = False,
    max_tokens: int = DEFAULT_MAX_TOKENS,
) -> DumpFile:
    """Open a dump and check its headers (nothing but headers is read); raise :class:`RolloutFileError`.

    ``old_key``/``rollout_key`` are optional roles: used when present, an error when missing only if
    ``require_old``/``require_rollout`` (the user named the key). ``tokens``, ``token_ids`` and ``step``
    are picked up when present. ``max_tokens`` caps the elements of every array (and, at 8 bytes per
    element, its bytes).
    """
    p = Path(path)
    suffix = check_path(p)
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens <= 0:
        raise RolloutFileError(f"max_tokens must be a positive integer, got {escape_text(repr(max_tokens))}")
    fh = open_regular(p)
    archive = None
    try:
        specs, archive = _open_format(suffix, fh, Limits(max_tokens))
        keys = _roles(specs, logprob_key, ref_key, mask_key, old_key, require_old, rollout_key, require_rollout)
        shape = _check_roles(specs, keys)
        if "step" in keys:
            _step(specs[keys["step"]])
    except BaseException:
        if archive is not None:
            archive.close()
        fh.close()
        raise
    return DumpFile(p, specs, keys, shape, fh, archive)


def _available(specs: Mapping[str, Any]) -> str:
    names = sorted(specs)
    shown = ", ".join(quoted(k) for k in names[:12])
    return (shown + (f" and {len(names) - 12} more" if len(names) > 12 else "")) or "none"


def _roles(
    specs: Mapping[str, ArraySpec],
    logprob_key: str,
    ref_key: str,
    mask_key: str,
    old_key: str | None,
    require_old: bool,
    rollout_key: str | None,
    require_rollout: bool,
) -> dict[str, str]:
    keys = {"logprob": logprob_key, "ref_logprob": ref_key, "response_mask": mask_key}
    wanted = [*keys.values(), old_key, rollout_key, "tokens", "token_ids", "step"]
    for key in wanted:  # an array a role would use, refused from its header: say why first
        refused = specs[key].refused if key is not None and key in specs else None
        if refused is not None:
            raise RolloutFileError(refused)
    for role, key in keys.items():
        if key not in specs:
            raise RolloutFileError(
                f"missing key {label(key, role)}; the file has: {_available(specs)}. Rename with --{_option(role)}"
            )
    for role, key, required in (
        ("old_logprob", old_key, require_old),
        ("rollout_logprob", rollout_key, require_rollout),
    ):
        if key is not None and key in specs:
            keys[role] = key
        elif required:
            raise RolloutFileError(f"missing key {label(str(key), role)}; the file has: {_available(specs)}")
    for role in ("tokens", "token_ids", "step"):
        if role in specs:
            keys[role] = role
    return keys


def _check_roles(specs: Mapping[str, ArraySpec], keys: dict[str, str]) -> tuple[int, int]:
    lp = specs[keys["logprob"]]
    for role in _LOGPROB_ROLES:
        if role not in keys:
            continue
        s = specs[keys[role]]
        if s.dtype in ("str", "object") or s.disk is None and not s.is_float:
            raise RolloutFileError(
                f"key {label(keys[role], role)} has dtype {escape_text(s.dtype)}; expected numbers "
                "(floating-point log-probabilities)"
            )
        if not s.is_float:
            raise RolloutFileError(
                f"{label(keys[role], role)} has dtype {escape_text(s.dtype)}; log-probabilities must be "
                "floating point (token ids by mistake?)"
            )
    m = specs[keys["response_mask"]]
    if not (m.is_float or m.dtype in _MASK_DTYPES):
        raise RolloutFileError(
            f"{label(keys['response_mask'], 'response_mask')} has dtype {escape_text(m.dtype)}; expected bool, "
            "int or 0/1 floats"
        )
    for role in _TABLE_ROLES:
        if role not in keys:
            continue
        s = specs[keys[role]]
        if len(s.shape) != 2:
            raise RolloutFileError(
                f"{label(keys[role], role)} has shape {s.shape}; every key must be [batch, tokens] (2-D)"
            )
        if s.shape != lp.shape:
            raise RolloutFileError(
                f"shape mismatch: {quoted(keys[role])} is {s.shape} but {quoted(keys['logprob'])} is "
                f"{lp.shape}; they must match token by token"
            )
    if "token_ids" in keys and specs[keys["token_ids"]].dtype not in _ID_DTYPES:
        raise RolloutFileError(
            f"'token_ids' has dtype {escape_text(specs[keys['token_ids']].dtype)}; expected integers"
        )
    if "tokens" in keys and specs[keys["tokens"]].dtype not in ("str", "object"):
        raise RolloutFileError(f"'tokens' has dtype {escape_text(specs[keys['tokens']].dtype)}; expected strings")
    if lp.numel == 0:
        raise RolloutFileError(f"the batch is empty (shape {lp.shape})")
    return lp.shape[0], lp.shape[1]
