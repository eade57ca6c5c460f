"""Reading rollout dumps safely, from their headers first, then row by row.

Every format is opened by klviz's own header parser, which decides from what the file *declares*
(names, dtypes, shapes, storage sizes) whether to read it, before anything is allocated:

- ``.npz``: each member's ``.npy`` header (dtype, order, shape) is checked against the archive's
  directory (the member's uncompressed size) and against the ``max_tokens`` cap; object arrays
  (pickles) are refused; data is read with the declared byte order (big-endian works).
- ``.pt``/``.pth`` (``torch.save``'s zip format): ``data.pkl`` is unpickled by a restricted
  unpickler that knows only tensors, dicts, lists and numbers and builds *descriptions* of tensors
  (storage, offset, shape, stride): a pickle that asks for anything else (``os.system``) is refused
  before any of it runs, and torch's own unpickler is never called. Tensors whose storage is smaller
  than their shape claims (stride 0, overlapping views), sparse, meta and quantized tensors are
  refused; storage bytes are read straight from the archive.
- ``.safetensors``: the JSON header (its length capped) and each tensor's byte range are checked;
  no ``safetensors`` package is needed.

:func:`open_dump` returns a :class:`DumpFile` whose :meth:`~DumpFile.rows` reads ``[rows, tokens]``
slices one chunk at a time (the analysis streams over them); :func:`load_rollouts` reads a whole
dump into a :class:`RolloutDump` (for lessons and panels); :func:`rollouts_from_tensors` validates
in-memory tensors; :func:`save_rollouts` writes a dump. Every problem is a :class:`RolloutFileError`
whose message is one line with control characters escaped.
"""

from __future__ import annotations

import ast
import io
import json
import math
import os
import pickle
import struct
import unicodedata
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = [
    "RolloutFileError",
    "RolloutDump",
    "DumpFile",
    "ArraySpec",
    "DEFAULT_KEYS",
    "OPTIONAL_KEYS",
    "DEFAULT_MAX_TOKENS",
    "load_rollouts",
    "open_dump",
    "rollouts_from_tensors",
    "save_rollouts",
    "sample_rollouts_path",
    "escape_text",
    "read_vocab",
]

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
#: Largest number of elements (tokens) one array may declare: 2**27 = 134,217,728, e.g. 16,384
#: responses of 8,192 tokens. A real batch fits under it; a declared size beyond it is refused before
#: anything is allocated (raise it with ``--max-tokens``).
DEFAULT_MAX_TOKENS = 2**27
_SUFFIXES = (".pt", ".pth", ".npz", ".safetensors")
_MAX_NPY_HEADER = 1 << 16  # bytes of one .npy header
_MAX_PICKLE = 64 << 20  # bytes of a .pt's data.pkl (tensors are outside it)
_MAX_ST_HEADER = 16 << 20  # bytes of a .safetensors JSON header
_MAX_MEMBERS = 10_000  # members of a zip archive
_MAX_MESSAGE = 300  # characters of one error message


class RolloutFileError(ValueError):
    """A rollout dump that cannot be used; the message is one line that says why."""

    def __init__(self, message: str) -> None:
        super().__init__(_one_line(message, _MAX_MESSAGE))


# -- text echoed from a file ------------------------------------------------------------------


def escape_text(text: Any, limit: int = 80) -> str:
    """``text`` with every control or format character shown as an escape (``\\x1b``), at most ``limit``
    characters (``...`` marks a cut): safe to print whatever a file put in a key name."""
    out = []
    for ch in str(text):
        cat = unicodedata.category(ch)
        if cat[0] == "C" or cat in ("Zl", "Zp"):
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
        else:
            out.append(ch)
    s = "".join(out)
    return s if len(s) <= limit else s[: max(limit - 3, 1)] + "..."


def _one_line(text: str, limit: int = 200) -> str:
    line = " ".join(escape_text(text, 10 * limit).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _q(key: str) -> str:
    return f"'{escape_text(key)}'"


# -- what a header declares ---------------------------------------------------------------------

_NP_NAMES = {
    "f8": "float64",
    "f4": "float32",
    "f2": "float16",
    "i8": "int64",
    "i4": "int32",
    "i2": "int16",
    "i1": "int8",
    "u8": "uint64",
    "u4": "uint32",
    "u2": "uint16",
    "u1": "uint8",
    "b1": "bool",
}


@dataclass
class ArraySpec:
    """One array as its header declares it, and how to read its bytes without loading the rest.

    ``dtype`` is the stored dtype's name (``"bfloat16"`` included); ``disk`` the NumPy dtype of the bytes
    on disk (byte order included; bfloat16 is read as ``uint16`` and widened); ``strides`` in elements
    from ``offset``. ``read(first, count)`` returns ``count`` elements from element ``first`` of the
    storage as a 1-D array of ``disk``.
    """

    key: str
    shape: tuple[int, ...]
    dtype: str
    disk: np.dtype | None
    read: Callable[[int, int], np.ndarray] | None = None
    strides: tuple[int, ...] | None = None
    offset: int = 0
    value: Any = None  # arrays held in memory (strings of a .pt, small objects)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def is_float(self) -> bool:
        return self.dtype in ("float64", "float32", "float16", "bfloat16")

    def _decode(self, raw: np.ndarray) -> np.ndarray:
        if self.dtype == "bfloat16":
            return (raw.astype(np.uint32) << 16).view(np.float32)
        if self.disk is not None and not self.disk.isnative:
            return raw.astype(self.disk.newbyteorder("="))
        return raw

    def rows(self, r0: int, r1: int) -> np.ndarray:
        """Rows ``r0:r1`` of a 2-D array as a C-contiguous native array (bfloat16 widened to float32)."""
        if self.value is not None:
            return np.ascontiguousarray(self.value[r0:r1])
        n_cols = self.shape[1]
        s0, s1 = self.strides if self.strides is not None else (n_cols, 1)
        n = r1 - r0
        if n <= 0 or n_cols == 0:
            return np.zeros((max(n, 0), n_cols), dtype=self._decode(np.zeros(0, self.disk)).dtype)
        if s1 == 1 and s0 >= n_cols:
            first = self.offset + r0 * s0
            span = (n - 1) * s0 + n_cols
            flat = self.read(first, span)
            if s0 == n_cols:
                block = flat.reshape(n, n_cols)
            else:
                block = np.lib.stride_tricks.as_strided(flat, (n, n_cols), (s0 * flat.itemsize, flat.itemsize))
            return np.ascontiguousarray(self._decode(block))
        # any other layout (a transposed view): read the whole extent once
        if getattr(self, "_whole", None) is None:
            extent = self.offset + sum((d - 1) * s for d, s in zip(self.shape, (s0, s1))) + 1
            flat = self.read(0, extent)
            self._whole = np.lib.stride_tricks.as_strided(
                flat[self.offset :], self.shape, (s0 * flat.itemsize, s1 * flat.itemsize)
            )
        return np.ascontiguousarray(self._decode(self._whole[r0:r1]))

    def whole(self) -> np.ndarray:
        """The whole array (any number of dimensions), native dtype."""
        if self.value is not None:
            return np.asarray(self.value)
        if len(self.shape) == 2:
            return self.rows(0, self.shape[0])
        n = self.numel
        strides = self.strides or ()
        if n == 0:
            return self._decode(np.zeros(self.shape, self.disk))
        extent = self.offset + sum((d - 1) * s for d, s in zip(self.shape, strides)) + 1
        flat = self.read(0, extent)[self.offset :]
        if self.strides is not None:
            arr = np.lib.stride_tricks.as_strided(flat, self.shape, tuple(s * flat.itemsize for s in strides))
        else:
            arr = flat[:n].reshape(self.shape)
        return np.ascontiguousarray(self._decode(arr))


# -- byte sources -----------------------------------------------------------------------------


class _FileBytes:
    """Random access to ``size`` bytes of an open file starting at ``base``."""

    def __init__(self, fh: Any, base: int, size: int) -> None:
        self.fh, self.base, self.size = fh, base, size

    def read(self, start: int, nbytes: int) -> bytes:
        if start < 0 or start + nbytes > self.size:
            raise RolloutFileError("the file is shorter than its header says (truncated?)")
        self.fh.seek(self.base + start)
        data = self.fh.read(nbytes)
        if len(data) != nbytes:
            raise RolloutFileError("the file is shorter than its header says (truncated?)")
        return data


class _ZipMemberBytes:
    """Forward reading of one compressed zip member (re-opened to go back); never past its declared size."""

    def __init__(self, zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> None:
        self.zf, self.info, self.size = zf, info, info.file_size
        self.fh: Any = None
        self.pos = 0

    def read(self, start: int, nbytes: int) -> bytes:
        if start < 0 or start + nbytes > self.size:
            raise RolloutFileError("an archive member is shorter than its header says")
        if self.fh is None or start < self.pos:
            self.fh = self.zf.open(self.info)
            self.pos = 0
        while self.pos < start:
            skipped = len(self.fh.read(min(start - self.pos, 1 << 22)))
            if skipped == 0:
                raise RolloutFileError("an archive member is shorter than its header says")
            self.pos += skipped
        data = self.fh.read(nbytes)
        self.pos += len(data)
        if len(data) != nbytes:
            raise RolloutFileError("an archive member is shorter than its header says")
        return data


def _member_bytes(fh: Any, zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> _FileBytes | _ZipMemberBytes:
    if info.compress_type == zipfile.ZIP_STORED and not info.flag_bits & 0x1:
        fh.seek(info.header_offset)
        local = fh.read(30)
        if len(local) != 30 or local[:4] != b"PK\x03\x04":
            raise RolloutFileError("not a readable zip archive (bad local header)")
        name_len, extra_len = struct.unpack("<HH", local[26:30])
        return _FileBytes(fh, info.header_offset + 30 + name_len + extra_len, info.file_size)
    return _ZipMemberBytes(zf, info)


def _reader(src: Any, base: int, itemsize: int, disk: np.dtype) -> Callable[[int, int], np.ndarray]:
    def read(first: int, count: int) -> np.ndarray:
        return np.frombuffer(src.read(base + first * itemsize, count * itemsize), dtype=disk)

    return read


# -- .npz -------------------------------------------------------------------------------------


def _npy_header(src: Any, key: str) -> tuple[np.dtype, bool, tuple[int, ...], int]:
    head = src.read(0, min(10, src.size))
    if len(head) < 10 or head[:6] != b"\x93NUMPY":
        raise RolloutFileError(f"array {_q(key)} is not a .npy member (bad magic)")
    major = head[6]
    if major == 1:
        hlen, start = struct.unpack("<H", head[8:10])[0], 10
    elif major in (2, 3):
        hlen, start = struct.unpack("<I", src.read(8, 4))[0], 12
    else:
        raise RolloutFileError(f"array {_q(key)} has an unknown .npy version {major}")
    if hlen > _MAX_NPY_HEADER or start + hlen > src.size:
        raise RolloutFileError(f"array {_q(key)} declares a {hlen}-byte header: refused")
    text = src.read(start, hlen).decode("latin1")
    try:
        d = ast.literal_eval(text)
        descr, fortran, shape = d["descr"], bool(d["fortran_order"]), tuple(int(s) for s in d["shape"])
    except Exception:  # noqa: BLE001
        raise RolloutFileError(f"array {_q(key)} has an unreadable .npy header") from None
    if not isinstance(descr, str):
        raise RolloutFileError(f"array {_q(key)} has a structured dtype; expected numbers")
    try:
        dt = np.dtype(descr)
    except TypeError:
        raise RolloutFileError(f"array {_q(key)} has an unknown dtype {escape_text(descr)}") from None
    if dt.hasobject:
        raise RolloutFileError(
            f"refused: array {_q(key)} holds pickled Python objects; klviz reads .npz with "
            "allow_pickle=False, so nothing in it was executed. Save numeric arrays only"
        )
    if any(s < 0 for s in shape):
        raise RolloutFileError(f"array {_q(key)} declares a negative dimension")
    return dt, fortran, shape, start + hlen


def _open_npz(path: Path, fh: Any, max_tokens: int) -> dict[str, ArraySpec]:
    try:
        zf = zipfile.ZipFile(fh)
    except (zipfile.BadZipFile, OSError, ValueError) as err:
        raise RolloutFileError(f"not a readable .npz archive ({escape_text(err, 120)})") from None
    infos = zf.infolist()
    if len(infos) > _MAX_MEMBERS:
        raise RolloutFileError(f"the archive has {len(infos)} members: refused")
    specs: dict[str, ArraySpec] = {}
    for info in infos:
        if not info.filename.endswith(".npy"):
            continue
        key = info.filename[:-4]
        src = _member_bytes(fh, zf, info)
        dt, fortran, shape, data_start = _npy_header(src, key)
        n = math.prod(shape)
        _check_cap(key, shape, max_tokens, dt.kind in "US")
        if info.file_size != data_start + n * dt.itemsize:
            raise RolloutFileError(
                f"array {_q(key)} declares shape {shape} ({n * dt.itemsize:,} bytes) but its member "
                f"holds {max(info.file_size - data_start, 0):,}: refused (corrupt or forged)"
            )
        name = _NP_NAMES.get(f"{dt.kind}{dt.itemsize}", "str" if dt.kind in "US" else str(dt))
        strides = None
        if fortran and len(shape) > 1:
            strides = tuple(int(math.prod(shape[:i])) for i in range(len(shape)))
        elif len(shape) > 1:
            strides = tuple(int(math.prod(shape[i + 1 :])) for i in range(len(shape)))
        specs[key] = ArraySpec(key, shape, name, dt, _reader(src, data_start, dt.itemsize, dt), strides)
        specs[key]._zip = zf  # keep the archive open as long as the spec lives
    return specs


def _check_cap(key: str, shape: tuple[int, ...], max_tokens: int, strings: bool = False) -> None:
    n = math.prod(shape)
    if n > max_tokens:
        raise RolloutFileError(
            f"array {_q(key)} declares shape {shape} = {n:,} elements, beyond the cap of "
            f"{max_tokens:,} (--max-tokens): refused before reading"
        )


# -- .pt (torch.save zip format), read without torch.load ---------------------------------------

_STORAGES = {
    "DoubleStorage": "float64",
    "FloatStorage": "float32",
    "HalfStorage": "float16",
    "BFloat16Storage": "bfloat16",
    "LongStorage": "int64",
    "IntStorage": "int32",
    "ShortStorage": "int16",
    "CharStorage": "int8",
    "ByteStorage": "uint8",
    "BoolStorage": "bool",
}
_DISK = {
    "float64": "f8",
    "float32": "f4",
    "float16": "f2",
    "bfloat16": "u2",
    "int64": "i8",
    "int32": "i4",
    "int16": "i2",
    "int8": "i1",
    "uint8": "u1",
    "bool": "b1",
}
_TORCH_DTYPES = {
    "float64": "float64",
    "double": "float64",
    "float32": "float32",
    "float": "float32",
    "float16": "float16",
    "half": "float16",
    "bfloat16": "bfloat16",
    "int64": "int64",
    "long": "int64",
    "int32": "int32",
    "int": "int32",
    "int16": "int16",
    "int8": "int8",
    "uint8": "uint8",
    "bool": "bool",
}


class _Refused(Exception):
    pass


@dataclass
class _StorageRef:
    dtype: str
    key: str
    location: str
    numel: int


@dataclass
class _TensorRef:
    storage: _StorageRef
    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]


class _StorageType:
    def __init__(self, dtype: str) -> None:
        self.dtype = dtype


class _DType:
    def __init__(self, name: str) -> None:
        self.name = name


def _rebuild_tensor(storage: Any, offset: Any, size: Any, stride: Any, *_rest: Any) -> _TensorRef:
    if not isinstance(storage, _StorageRef):
        raise _Refused("a tensor without a plain storage")
    try:
        shape = tuple(int(s) for s in size)
        strides = tuple(int(s) for s in stride)
        off = int(offset)
    except (TypeError, ValueError):
        raise _Refused("a tensor with a malformed shape") from None
    return _TensorRef(storage, off, shape, strides)


def _refuse(what: str) -> Callable[..., Any]:
    def fn(*_args: Any, **_kw: Any) -> Any:
        raise _Refused(what)

    return fn


def _allowed_globals() -> dict[str, Any]:
    allowed: dict[str, Any] = {
        "torch._utils._rebuild_tensor_v2": _rebuild_tensor,
        "torch._utils._rebuild_tensor": _rebuild_tensor,
        "torch._utils._rebuild_parameter": lambda data, *_a: data,
        "torch._utils._rebuild_parameter_with_state": lambda data, *_a: data,
        "collections.OrderedDict": dict,
        "torch.Size": tuple,
        "torch._utils._rebuild_meta_tensor_no_storage": _refuse("META"),
        "torch._utils._rebuild_sparse_tensor": _refuse("SPARSE"),
        "torch._utils._rebuild_sparse_csr": _refuse("SPARSE"),
        "torch.serialization._get_layout": lambda name: name,
        "torch._utils._rebuild_qtensor": _refuse("a quantized tensor"),
        "torch._utils._rebuild_nested_tensor": _refuse("a nested tensor"),
        "torch._utils._rebuild_wrapper_subclass": _refuse("a tensor subclass"),
        "torch._utils._rebuild_device_tensor_from_numpy": _refuse("a tensor rebuilt from a NumPy pickle"),
        "torch._tensor._rebuild_from_type_v2": lambda func, _t, args, _state: func(*args),
    }
    for name, dt in _STORAGES.items():
        allowed[f"torch.{name}"] = _StorageType(dt)
    for name, dt in _TORCH_DTYPES.items():
        allowed[f"torch.{name}"] = _DType(dt)
    return allowed


_ALLOWED = _allowed_globals()


class _SafeUnpickler(pickle.Unpickler):
    """Knows tensors, dicts, lists, strings and numbers; refuses every other global before calling it."""

    def find_class(self, module: str, name: str) -> Any:
        full = f"{module}.{name}"
        if full in _ALLOWED:
            return _ALLOWED[full]
        raise _Refused(full)

    def persistent_load(self, pid: Any) -> Any:
        if isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage":
            _tag, stype, key, location, numel = pid
            dtype = (
                stype.dtype if isinstance(stype, _StorageType) else (stype.name if isinstance(stype, _DType) else None)
            )
            if dtype is None:
                raise _Refused("a storage of unknown type")
            if str(location).startswith("meta"):
                raise _Refused("META")
            try:
                return _StorageRef(dtype, str(key), str(location), int(numel))
            except (TypeError, ValueError):
                raise _Refused("a malformed storage") from None
        raise _Refused("an unknown persistent object")


def _unpickle(data: bytes) -> Any:
    try:
        return _SafeUnpickler(io.BytesIO(data)).load()
    except _Refused as err:
        what = str(err)
        if what == "META":
            raise RolloutFileError(
                "refused: the file holds a meta tensor (shape without data); save real values"
            ) from None
        if what == "SPARSE":
            raise RolloutFileError(
                "refused: the file holds a sparse tensor; save dense [batch, tokens] tensors (tensor.to_dense())"
            ) from None
        raise RolloutFileError(
            f"refused: the file's pickle wants more than tensors (it asks for {escape_text(what)}); klviz reads .pt "
            "files with its own restricted unpickler, so nothing in it was executed. Save a plain dict of tensors"
        ) from None
    except RolloutFileError:
        raise
    except RecursionError:
        raise RolloutFileError("refused: the pickle nests too deeply") from None
    except Exception as err:  # noqa: BLE001 - every failure becomes one line
        raise RolloutFileError(f"not a readable PyTorch file ({type(err).__name__}: {escape_text(err, 120)})") from None


def _check_layout(key: str, t: _TensorRef) -> None:
    shape, stride, off, numel = t.shape, t.stride, t.offset, t.storage.numel
    if len(shape) != len(stride) or any(s < 0 for s in shape) or any(s < 0 for s in stride) or off < 0:
        raise RolloutFileError(f"tensor {_q(key)} has a malformed layout (shape {shape}, stride {stride})")
    n = math.prod(shape)
    if n == 0:
        return
    extent = off + sum((d - 1) * s for d, s in zip(shape, stride)) + 1
    if n > numel - off or extent > numel:
        raise RolloutFileError(
            f"refused: tensor {_q(key)} claims shape {shape} ({n:,} elements) but its storage holds {numel:,} "
            f"from offset {off} (stride {stride}: a stride-0 or overlapping view); save tensor.contiguous()"
        )
    dims = sorted((s, d) for d, s in zip(shape, stride) if d > 1)
    reach = 1
    for s, d in dims:
        if s < reach:
            raise RolloutFileError(
                f"refused: tensor {_q(key)} is an overlapping view (shape {shape}, stride {stride}); "
                "save tensor.contiguous()"
            )
        reach = s * d


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
        if len(out) > _MAX_MEMBERS:
            raise RolloutFileError("the file holds more than 10,000 entries: refused")
    return out


def _open_pt(path: Path, fh: Any, max_tokens: int) -> dict[str, ArraySpec]:
    head = fh.read(8)
    fh.seek(0)
    if head[:1] == b"\x80":
        # the legacy (pre-1.6) format: a pickle first; look at it with the restricted unpickler only
        first = fh.read(_MAX_PICKLE)
        try:
            _SafeUnpickler(io.BytesIO(first)).load()
        except _Refused as err:
            what = str(err)
            raise RolloutFileError(
                f"refused: the file's pickle wants more than tensors (it asks for {escape_text(what)}); klviz reads "
                ".pt files with its own restricted unpickler, so nothing in it was executed. Save a plain dict of "
                "tensors"
            ) from None
        except Exception:  # noqa: BLE001
            pass
        raise RolloutFileError(
            "a legacy (non-zip) torch.save file or a bare pickle: klviz reads only the zip format "
            "torch.save writes since PyTorch 1.6 (nothing in it was executed); re-save it with torch.save"
        )
    if not head.startswith(b"PK"):
        raise RolloutFileError(
            "refused: not a torch.save file (neither a zip archive nor a binary pickle); nothing in it was executed"
        )
    try:
        zf = zipfile.ZipFile(fh)
    except (zipfile.BadZipFile, OSError, ValueError) as err:
        raise RolloutFileError(f"not a readable PyTorch file ({escape_text(err, 120)})") from None
    infos = zf.infolist()
    if len(infos) > _MAX_MEMBERS:
        raise RolloutFileError(f"the archive has {len(infos)} members: refused")
    pkl = [i for i in infos if i.filename.endswith("data.pkl") and i.filename.count("/") == 1]
    if not pkl:
        raise RolloutFileError("not a torch.save archive (no data.pkl)")
    prefix = pkl[0].filename[: -len("data.pkl")]
    if pkl[0].file_size > _MAX_PICKLE:
        raise RolloutFileError(f"the archive's data.pkl declares {pkl[0].file_size:,} bytes: refused")
    members = {i.filename: i for i in infos}
    byteorder = "little"
    if prefix + "byteorder" in members and members[prefix + "byteorder"].file_size <= 16:
        byteorder = zf.read(prefix + "byteorder").decode("ascii", "replace").strip() or "little"
    order = "<" if byteorder == "little" else ">"
    obj = _unpickle(_member_bytes(fh, zf, pkl[0]).read(0, pkl[0].file_size))
    if isinstance(obj, _TensorRef) or not isinstance(obj, Mapping):
        raise RolloutFileError(
            f"the file holds a {'tensor' if isinstance(obj, _TensorRef) else type(obj).__name__}, "
            "expected a dict of tensors keyed by name"
        )
    specs: dict[str, ArraySpec] = {}
    for key, v in _flatten(obj).items():
        key = str(key)
        if isinstance(v, _TensorRef):
            st = v.storage
            _check_cap(key, v.shape, max_tokens)
            disk = (
                np.dtype(order + _DISK[st.dtype])
                if st.dtype not in ("bool", "int8", "uint8")
                else np.dtype(_DISK[st.dtype])
            )
            name = prefix + "data/" + st.key
            info = members.get(name)
            if info is None:
                raise RolloutFileError(f"tensor {_q(key)}: its storage is missing from the archive")
            if st.numel < 0 or info.file_size != st.numel * disk.itemsize:
                raise RolloutFileError(
                    f"tensor {_q(key)}: its storage declares {st.numel:,} elements but the archive holds "
                    f"{info.file_size:,} bytes: refused (corrupt or forged)"
                )
            _check_layout(key, v)
            src = _member_bytes(fh, zf, info)
            specs[key] = ArraySpec(
                key, v.shape, st.dtype, disk, _reader(src, 0, disk.itemsize, disk), v.stride, v.offset
            )
        elif isinstance(v, (list, tuple)) and v and all(isinstance(x, (list, tuple)) for x in v[:1]):
            specs[key] = ArraySpec(key, (len(v), len(v[0])), "object", None, value=v)
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            specs[key] = ArraySpec(key, (), "float64" if isinstance(v, float) else "int64", None, value=np.asarray(v))
        else:
            specs[key] = ArraySpec(key, (), type(v).__name__, None, value=None)
    return specs


# -- .safetensors -------------------------------------------------------------------------------

_ST_DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
}


def _open_safetensors(path: Path, fh: Any, max_tokens: int) -> dict[str, ArraySpec]:
    size = os.fstat(fh.fileno()).st_size
    head = fh.read(8)
    if len(head) < 8:
        raise RolloutFileError("not a readable .safetensors file (shorter than its 8-byte header length)")
    hlen = struct.unpack("<Q", head)[0]
    if hlen > _MAX_ST_HEADER or 8 + hlen > size:
        raise RolloutFileError(f"not a readable .safetensors file (it declares a {hlen:,}-byte header)")
    try:
        header = json.loads(fh.read(hlen).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        raise RolloutFileError(f"not a readable .safetensors file (header: {escape_text(err, 80)})") from None
    if not isinstance(header, dict):
        raise RolloutFileError("not a readable .safetensors file (the header is not a JSON object)")
    data = _FileBytes(fh, 8 + hlen, size - 8 - hlen)
    specs: dict[str, ArraySpec] = {}
    for key, meta in header.items():
        if key == "__metadata__":
            continue
        try:
            dtype = _ST_DTYPES[meta["dtype"]]
            shape = tuple(int(s) for s in meta["shape"])
            begin, end = (int(x) for x in meta["data_offsets"])
        except Exception:  # noqa: BLE001
            raise RolloutFileError(
                f"not a readable .safetensors file (entry {_q(key)} is malformed or has an unsupported dtype)"
            ) from None
        if any(s < 0 for s in shape):
            raise RolloutFileError(f"tensor {_q(key)} declares a negative dimension")
        _check_cap(key, shape, max_tokens)
        disk = np.dtype("<" + _DISK[dtype]) if dtype not in ("bool", "int8", "uint8") else np.dtype(_DISK[dtype])
        if begin < 0 or end > data.size or end - begin != math.prod(shape) * disk.itemsize:
            raise RolloutFileError(
                f"tensor {_q(key)} declares shape {shape} but bytes [{begin}, {end}) of a "
                f"{data.size:,}-byte data section: refused (corrupt or forged)"
            )
        strides = tuple(int(math.prod(shape[i + 1 :])) for i in range(len(shape))) if len(shape) > 1 else None
        specs[str(key)] = ArraySpec(str(key), shape, dtype, disk, _reader(data, begin, disk.itemsize, disk), strides)
    return specs


# -- the dump ---------------------------------------------------------------------------------


@dataclass
class DumpFile:
    """An opened dump: its arrays as declared (:class:`ArraySpec`), the roles found, read row by row."""

    path: Path
    specs: dict[str, ArraySpec]
    keys: dict[str, str]  # role -> key
    shape: tuple[int, int]
    _fh: Any = None

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
        if key is None:
            return None
        spec = self.specs[key]
        if spec.numel != 1:
            return None
        return float(np.asarray(spec.whole()).reshape(-1)[0])

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def __enter__(self) -> DumpFile:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _label(key: str, role: str) -> str:
    return _q(key) if key == role else f"{_q(key)} ({role})"


def _option(role: str) -> str:
    return {
        "logprob": "logprob-key",
        "ref_logprob": "ref-key",
        "response_mask": "mask-key",
        "old_logprob": "old-key",
        "rollout_logprob": "rollout-key",
    }.get(role, role)


def _check_path(p: Path) -> str:
    if not p.exists():
        raise RolloutFileError(f"no such file: {p}")
    if p.is_dir():
        raise RolloutFileError(f"{p} is a directory, expected a rollout dump file")
    suffix = p.suffix.lower()
    if suffix not in _SUFFIXES:
        raise RolloutFileError(
            f"not a recognised rollout dump: '{escape_text(p.name)}' should end in "
            f"{', '.join(_SUFFIXES)} (other files are not opened, pickles never)"
        )
    return suffix


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
    are picked up when present.
    """
    p = Path(path)
    suffix = _check_path(p)
    if not isinstance(max_tokens, int) or max_tokens <= 0:
        raise RolloutFileError(f"max_tokens must be a positive integer, got {max_tokens!r}")
    try:
        if p.stat().st_size == 0:
            raise RolloutFileError(f"{escape_text(p.name)} is empty")
        fh = open(p, "rb")
    except OSError as err:
        raise RolloutFileError(f"cannot read {escape_text(p.name)}: {err.strerror or err}") from None
    try:
        head = fh.read(8)
        fh.seek(0)
        if suffix in (".pt", ".pth"):
            specs = _open_pt(p, fh, max_tokens)
        elif suffix == ".npz":
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
            specs = _open_npz(p, fh, max_tokens)
        else:
            specs = _open_safetensors(p, fh, max_tokens)
        keys = _roles(specs, logprob_key, ref_key, mask_key, old_key, require_old, rollout_key, require_rollout)
        shape = _check_roles(specs, keys)
    except BaseException:
        fh.close()
        raise
    return DumpFile(p, specs, keys, shape, fh)


def _available(specs: Mapping[str, Any]) -> str:
    names = sorted(specs)
    shown = ", ".join(_q(k) for k in names[:12])
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
    for role, key in keys.items():
        if key not in specs:
            raise RolloutFileError(
                f"missing key {_label(key, role)}; the file has: {_available(specs)}. Rename with --{_option(role)}"
            )
    for role, key, required in (
        ("old_logprob", old_key, require_old),
        ("rollout_logprob", rollout_key, require_rollout),
    ):
        if key is not None and key in specs:
            keys[role] = key
        elif required:
            raise RolloutFileError(f"missing key {_label(str(key), role)}; the file has: {_available(specs)}")
    for role in ("tokens", "token_ids", "step"):
        if role in specs:
            keys[role] = role
    return keys


def _check_roles(specs: Mapping[str, ArraySpec], keys: dict[str, str]) -> tuple[int, int]:
    lp = specs[keys["logprob"]]
    for role in ("logprob", "ref_logprob", "old_logprob", "rollout_logprob"):
        if role not in keys:
            continue
        s = specs[keys[role]]
        if s.dtype in ("str", "object") or s.disk is None and not s.is_float:
            raise RolloutFileError(
                f"key {_label(keys[role], role)} has dtype {s.dtype}; expected numbers "
                "(floating-point log-probabilities)"
            )
        if not s.is_float:
            raise RolloutFileError(
                f"{_label(keys[role], role)} has dtype {s.dtype}; log-probabilities must be "
                "floating point (token ids by mistake?)"
            )
    m = specs[keys["response_mask"]]
    if not (m.is_float or m.dtype in ("bool", "int8", "uint8", "int16", "int32", "int64")):
        raise RolloutFileError(
            f"{_label(keys['response_mask'], 'response_mask')} has dtype {m.dtype}; expected bool, int or 0/1 floats"
        )
    for role in ("logprob", "ref_logprob", "response_mask", "old_logprob", "rollout_logprob", "tokens", "token_ids"):
        if role not in keys:
            continue
        s = specs[keys[role]]
        if len(s.shape) != 2:
            raise RolloutFileError(
                f"{_label(keys[role], role)} has shape {s.shape}; every key must be [batch, tokens] (2-D)"
            )
        if s.shape != lp.shape:
            raise RolloutFileError(
                f"shape mismatch: {_q(keys[role])} is {s.shape} but {_q(keys['logprob'])} is "
                f"{lp.shape}; they must match token by token"
            )
    if "token_ids" in keys and specs[keys["token_ids"]].dtype not in ("int64", "int32", "int16", "int8", "uint8"):
        raise RolloutFileError(f"'token_ids' has dtype {specs[keys['token_ids']].dtype}; expected integers")
    if "tokens" in keys and specs[keys["tokens"]].dtype not in ("str", "object"):
        raise RolloutFileError(f"'tokens' has dtype {specs[keys['tokens']].dtype}; expected strings")
    if lp.numel == 0:
        raise RolloutFileError(f"the batch is empty (shape {lp.shape})")
    return lp.shape  # type: ignore[return-value]


# -- whole dumps in memory (lessons, panels) -------------------------------------------------------


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
    return Path(__file__).resolve().parent.parent / "data" / "sample_rollouts.npz"


def _mask_bool(m: np.ndarray, label: str) -> np.ndarray:
    if m.dtype == np.bool_:
        return m
    mf = m.astype(np.float64, copy=False)
    ok = (mf == 0) | (mf == 1)
    if not ok.all():
        bad = mf[~ok]
        raise RolloutFileError(
            f"{label} must hold only 0 and 1; found {bad.size} other value(s), e.g. {float(bad[0]):g}"
        )
    return mf == 1


def _strings(spec_value: Any) -> np.ndarray:
    return np.asarray([[str(x) for x in row] for row in spec_value], dtype=object)


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
        mask = _mask_bool(arrays["response_mask"], _label(f.keys["response_mask"], "response_mask"))
        if not mask.any():
            raise RolloutFileError(
                f"{_label(f.keys['response_mask'], 'response_mask')} selects no token: nothing to diagnose"
            )
        t = {
            role: torch.from_numpy(np.ascontiguousarray(arrays[role], dtype=np.float64))
            for role in ("logprob", "ref_logprob", "old_logprob", "rollout_logprob")
            if role in arrays
        }
        tokens = None
        if "tokens" in arrays:
            tokens = arrays["tokens"] if arrays["tokens"].dtype != object else _strings(arrays["tokens"])
        return RolloutDump(
            t["logprob"],
            t["ref_logprob"],
            torch.from_numpy(mask),
            t.get("old_logprob"),
            source=str(path),
            keys={k: v for k, v in f.keys.items()},
            dtypes=f.dtypes,
            rollout_logprob=t.get("rollout_logprob"),
            tokens=tokens,
            token_ids=arrays.get("token_ids"),
            step=f.step(),
        )


def _to_array(value: Any, key: str) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu()
        if t.layout != torch.strided:
            raise RolloutFileError(f"{_q(key)} is a {t.layout} tensor; pass a dense tensor")
        if t.dtype == torch.bfloat16:
            return t.float().numpy()
        return t.contiguous().numpy()
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "biuf":
            raise RolloutFileError(f"key {_q(key)} has dtype {value.dtype}; expected numbers")
        return np.ascontiguousarray(value.astype(value.dtype.newbyteorder("="), copy=False))
    arr = np.asarray(value)
    if arr.dtype.kind not in "biuf":
        raise RolloutFileError(f"key {_q(key)} holds a {type(value).__name__}, expected a tensor or array")
    return arr


def _dtype_name(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return str(value.dtype).replace("torch.", "")
    return _NP_NAMES.get(
        f"{np.asarray(value).dtype.kind}{np.asarray(value).dtype.itemsize}", str(np.asarray(value).dtype)
    )


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
                f"{_label(role, role)} has dtype {dtypes[role]}; log-probabilities must be floating "
                "point (token ids by mistake?)"
            )
        if a.ndim != 2:
            raise RolloutFileError(
                f"{_label(role, role)} has shape {tuple(a.shape)}; every key must be [batch, tokens] (2-D)"
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
    tok = None if tokens is None else np.asarray(tokens, dtype=object)
    ids = None if token_ids is None else np.asarray(token_ids)
    for name, a in (("tokens", tok), ("token_ids", ids)):
        if a is not None and a.shape != lp.shape:
            raise RolloutFileError(f"shape mismatch: '{name}' is {tuple(a.shape)} but 'logprob' is {tuple(lp.shape)}")
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


def _write_safetensors(path: Path, data: dict[str, np.ndarray]) -> None:
    names = {
        np.dtype("float32"): "F32",
        np.dtype("float64"): "F64",
        np.dtype("int8"): "I8",
        np.dtype("int64"): "I64",
        np.dtype("float16"): "F16",
        np.dtype("int32"): "I32",
    }
    header, offset, blobs = {}, 0, []
    for key, a in data.items():
        a = np.ascontiguousarray(a.astype(a.dtype.newbyteorder("<"), copy=False))
        header[key] = {
            "dtype": names[np.dtype(a.dtype.newbyteorder("="))],
            "shape": list(a.shape),
            "data_offsets": [offset, offset + a.nbytes],
        }
        offset += a.nbytes
        blobs.append(a.tobytes())
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


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
    if suffix not in _SUFFIXES:
        raise ValueError(f"path must end in one of {', '.join(_SUFFIXES)}, got '{p.name}'")
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
        np.savez_compressed(p, **data)
    elif suffix in (".pt", ".pth"):
        torch.save({k: torch.from_numpy(v) for k, v in data.items()}, p)
    else:
        _write_safetensors(p, data)
    return p


def read_vocab(path: str | Path) -> Callable[[np.ndarray], list[str]]:
    """A function from token ids to strings, from ``--vocab FILE``: a JSON list (id -> token), a JSON
    object ``{token: id}`` (``vocab.json``) or a ``tokenizer.json`` (its ``model.vocab``), or a text file
    with one token per line (line number = id)."""
    p = Path(path)
    if not p.is_file():
        raise RolloutFileError(f"--vocab: no such file: {p}")
    if p.stat().st_size > 256 << 20:
        raise RolloutFileError("--vocab: the file is larger than 256 MiB: refused")
    text = p.read_text(encoding="utf-8", errors="replace")
    table: dict[int, str] = {}
    if p.suffix.lower() == ".json":
        try:
            obj = json.loads(text)
        except ValueError as err:
            raise RolloutFileError(f"--vocab: not valid JSON ({escape_text(err, 80)})") from None
        if isinstance(obj, dict) and isinstance(obj.get("model"), dict) and "vocab" in obj["model"]:
            obj = obj["model"]["vocab"]
        if isinstance(obj, list):
            table = {i: str(t) for i, t in enumerate(obj)}
        elif isinstance(obj, dict):
            for k, v in obj.items():
                if isinstance(v, int):
                    table[v] = str(k)
                elif str(k).lstrip("-").isdigit():
                    table[int(k)] = str(v)
        else:
            raise RolloutFileError("--vocab: expected a JSON list or object")
    else:
        table = dict(enumerate(text.split("\n")))

    def lookup(ids: np.ndarray) -> list[str]:
        return [table.get(int(i), f"<id {int(i)}>") for i in np.asarray(ids).reshape(-1)]

    return lookup
