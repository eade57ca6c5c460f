"""``.pt``/``.pth`` files (the zip format ``torch.save`` writes), read without ``torch.load``.

``data.pkl`` is unpickled by :class:`SafeUnpickler`, which knows only tensors, dicts, lists, strings and
numbers. It builds *descriptions* of tensors (storage, offset, shape, stride) that :func:`~.core.judge`
then judges like any other header; storage bytes are read straight from the archive. A pickle that asks
for any other global (``os.system``) is refused before any of it runs.

Every file gets a fresh unpickler with a fresh table of allowed globals, and every object in that table
is immutable: a pickle's ``BUILD`` on an allowed global (say ``torch.HalfStorage``, to make it read
bfloat16) is refused, so one file can never change how the next one is read.
"""

from __future__ import annotations

import io
import math
import pickle
import zipfile
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import IO, Any, NoReturn

import numpy as np

from .core import MAX_TOKEN_CHARS, ArraySpec, Limits, RolloutFileError, digits, escape_text, judge, quoted
from .sources import MAX_MEMBERS, member_source, open_zip

__all__ = ["open_pt", "SafeUnpickler", "TokenRows"]

_MAX_PICKLE = 64 << 20  # bytes of a .pt's data.pkl (tensors are outside it)
_FAST_PICKLE = 1 << 20  # up to this size data.pkl is read by the C unpickler (at most ~64 MiB of objects)
_MAX_OBJECTS = 1 << 21  # objects a larger data.pkl may create (about 160 MiB): 2M token strings
#: Opcodes that create a new object (a string, number, container, or the result of a call).
_CREATING_OPCODES = (
    pickle.EMPTY_DICT,
    pickle.EMPTY_LIST,
    pickle.EMPTY_SET,
    pickle.FROZENSET,
    pickle.LIST,
    pickle.DICT,
    pickle.TUPLE,
    pickle.TUPLE1,
    pickle.TUPLE2,
    pickle.TUPLE3,
    pickle.BINUNICODE,
    pickle.SHORT_BINUNICODE,
    pickle.BINUNICODE8,
    pickle.UNICODE,
    pickle.STRING,
    pickle.BINSTRING,
    pickle.SHORT_BINSTRING,
    pickle.BINBYTES,
    pickle.SHORT_BINBYTES,
    pickle.BINBYTES8,
    pickle.BYTEARRAY8,
    pickle.INT,
    pickle.BININT,
    pickle.BININT1,
    pickle.BININT2,
    pickle.LONG,
    pickle.LONG1,
    pickle.LONG4,
    pickle.FLOAT,
    pickle.BINFLOAT,
    pickle.REDUCE,
    pickle.NEWOBJ,
    pickle.NEWOBJ_EX,
    pickle.INST,
    pickle.OBJ,
)
_STORAGES = MappingProxyType(
    {
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
)
_DISK = MappingProxyType(
    {
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
)
_TORCH_DTYPES = MappingProxyType(
    {
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
)
_INT64 = 1 << 63


class _Refused(Exception):
    pass


class _Frozen:
    """Objects the unpickler hands to a pickle: no attribute can be set, and ``BUILD`` is refused."""

    __slots__ = ()

    def __setattr__(self, name: str, value: Any) -> NoReturn:
        raise _Refused(f"a change to {self!r}")

    def __delattr__(self, name: str) -> NoReturn:
        raise _Refused(f"a change to {self!r}")

    def __setstate__(self, state: Any) -> NoReturn:
        raise _Refused(f"a change to {self!r} (pickle BUILD)")

    def __reduce__(self) -> NoReturn:
        raise TypeError("not picklable")


class _StorageType(_Frozen):
    __slots__ = ("name", "dtype")
    name: str
    dtype: str

    def __init__(self, name: str, dtype: str) -> None:
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "dtype", dtype)

    def __repr__(self) -> str:
        return f"torch.{self.name}"


class _DType(_StorageType):
    __slots__ = ()


class _Global(_Frozen):
    """An allowed callable global, e.g. ``torch._utils._rebuild_tensor_v2``."""

    __slots__ = ("name", "fn")
    name: str
    fn: Callable[..., Any]

    def __init__(self, name: str, fn: Callable[..., Any]) -> None:
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "fn", fn)

    def __call__(self, *args: Any) -> Any:
        return self.fn(*args)

    def __repr__(self) -> str:
        return self.name


class _StorageRef(_Frozen):
    __slots__ = ("dtype", "key", "numel")
    dtype: str
    key: str
    numel: int

    def __init__(self, dtype: str, key: str, numel: int) -> None:
        object.__setattr__(self, "dtype", dtype)
        object.__setattr__(self, "key", key)
        object.__setattr__(self, "numel", numel)

    def __repr__(self) -> str:
        return "a storage"


class _TensorRef(_Frozen):
    """A tensor as its pickle describes it; ``size`` and ``stride`` exactly as given (judged later)."""

    __slots__ = ("storage", "offset", "size", "stride")
    storage: _StorageRef
    offset: Any
    size: Any
    stride: Any

    def __init__(self, storage: _StorageRef, offset: Any, size: Any, stride: Any) -> None:
        for name, value in (("storage", storage), ("offset", offset), ("size", size), ("stride", stride)):
            object.__setattr__(self, name, value)

    def __repr__(self) -> str:
        return "a tensor"


def _rebuild_tensor(storage: Any, offset: Any, size: Any, stride: Any, *_rest: Any) -> _TensorRef:
    if not isinstance(storage, _StorageRef):
        raise _Refused("a tensor without a plain storage")
    return _TensorRef(storage, offset, size, stride)


def _refuse(what: str) -> Callable[..., Any]:
    def fn(*_args: Any) -> NoReturn:
        raise _Refused(what)

    return fn


def _first(data: Any, *_rest: Any) -> Any:
    return data


def _from_type(func: Any, _type: Any, args: Any, _state: Any) -> Any:
    if not isinstance(func, _Global) or not isinstance(args, tuple):
        raise _Refused("a tensor rebuilt by an unknown function")
    return func(*args)


def _allowed_globals() -> dict[str, Any]:
    """A fresh table of what a pickle may name (one per file)."""
    fns: dict[str, Callable[..., Any]] = {
        "torch._utils._rebuild_tensor_v2": _rebuild_tensor,
        "torch._utils._rebuild_tensor": _rebuild_tensor,
        "torch._utils._rebuild_parameter": _first,
        "torch._utils._rebuild_parameter_with_state": _first,
        "collections.OrderedDict": lambda *a: dict(*a),
        "torch.Size": lambda *a: tuple(*a),
        "torch._utils._rebuild_meta_tensor_no_storage": _refuse("META"),
        "torch._utils._rebuild_sparse_tensor": _refuse("SPARSE"),
        "torch._utils._rebuild_sparse_csr": _refuse("SPARSE"),
        "torch.serialization._get_layout": lambda name: str(name),
        "torch._utils._rebuild_qtensor": _refuse("a quantized tensor"),
        "torch._utils._rebuild_nested_tensor": _refuse("a nested tensor"),
        "torch._utils._rebuild_wrapper_subclass": _refuse("a tensor subclass"),
        "torch._utils._rebuild_device_tensor_from_numpy": _refuse("a tensor rebuilt from a NumPy pickle"),
        "torch._tensor._rebuild_from_type_v2": _from_type,
    }
    allowed: dict[str, Any] = {name: _Global(name, fn) for name, fn in fns.items()}
    for name, dt in _STORAGES.items():
        allowed[f"torch.{name}"] = _StorageType(name, dt)
    for name, dt in _TORCH_DTYPES.items():
        allowed[f"torch.{name}"] = _DType(name, dt)
    return allowed


class _Restricted:
    """What both unpicklers below share: the allowed globals (a fresh, immutable table) and storages."""

    _allowed: dict[str, Any]

    def find_class(self, module: str, name: str) -> Any:
        full = f"{module}.{name}"
        if full in self._allowed:
            return self._allowed[full]
        raise _Refused(full)

    def persistent_load(self, pid: Any) -> Any:
        if isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage":
            _tag, stype, key, location, numel = pid
            if not isinstance(stype, _StorageType):
                raise _Refused("a storage of unknown type")
            if str(location).startswith("meta"):
                raise _Refused("META")
            if isinstance(numel, bool) or not isinstance(numel, int) or not isinstance(key, (str, int)):
                raise _Refused("a malformed storage")
            return _StorageRef(stype.dtype, str(key), numel)
        raise _Refused("an unknown persistent object")


class SafeUnpickler(_Restricted, pickle.Unpickler):
    """Knows tensors, dicts, lists, strings and numbers; refuses every other global before calling it.

    Python's fast (C) unpickler: used for pickles up to ``_FAST_PICKLE`` bytes, which cannot build more
    than about 64 bytes of objects per byte (an empty list is one opcode)."""

    def __init__(self, file: IO[bytes]) -> None:
        super().__init__(file)
        self._allowed = _allowed_globals()


class CountingUnpickler(_Restricted, pickle._Unpickler):
    """The same rules, in Python's own unpickler, counting every object a pickle creates: a larger pickle
    (token strings in lists) may create at most ``_MAX_OBJECTS``, however few bytes each one costs it."""

    dispatch = dict(pickle._Unpickler.dispatch)

    def __init__(self, file: IO[bytes], max_objects: int) -> None:
        super().__init__(file)
        self._allowed = _allowed_globals()
        self._objects_left = max_objects

    def _count(self) -> None:
        self._objects_left -= 1
        if self._objects_left < 0:
            raise _Refused("OBJECTS")


def _counted(original: Callable[[Any], None]) -> Callable[[Any], None]:
    def load(self: Any) -> None:  # self is a CountingUnpickler
        self._count()
        original(self)

    return load


for _op in _CREATING_OPCODES:
    CountingUnpickler.dispatch[_op[0]] = _counted(pickle._Unpickler.dispatch[_op[0]])


def _refused_message(what: str) -> str:
    if what == "OBJECTS":
        return (
            f"refused: the file's pickle creates more than {_MAX_OBJECTS:,} objects (more token strings than klviz "
            "reads from a .pt, or a memory bomb); save token ids as a tensor and use --vocab"
        )
    if what == "META":
        return "refused: the file holds a meta tensor (shape without data); save real values"
    if what == "SPARSE":
        return "refused: the file holds a sparse tensor; save dense [batch, tokens] tensors (tensor.to_dense())"
    return (
        f"refused: the file's pickle wants more than tensors (it asks for {escape_text(what)}); klviz reads .pt "
        "files with its own restricted unpickler, so nothing in it was executed. Save a plain dict of tensors"
    )


def _unpickle(data: bytes) -> Any:
    try:
        if len(data) <= _FAST_PICKLE:
            return SafeUnpickler(io.BytesIO(data)).load()
        return CountingUnpickler(io.BytesIO(data), _MAX_OBJECTS).load()
    except _Refused as err:
        raise RolloutFileError(_refused_message(str(err))) from None
    except RolloutFileError:
        raise
    except RecursionError:
        raise RolloutFileError("refused: the pickle nests too deeply") from None
    except MemoryError:
        raise
    except Exception as err:  # noqa: BLE001 - every failure of a hostile pickle becomes one line
        raise RolloutFileError(f"not a readable PyTorch file ({type(err).__name__}: {escape_text(err, 120)})") from None


def _key_text(key: Any) -> str:
    """A dict key as text; an int too long to print (Python refuses 4,300+ digits) is described instead."""
    if isinstance(key, int) and abs(key) >= 10**30:
        return f"<an integer of about {digits(key):,} digits>"
    try:
        return str(key)
    except ValueError:
        return f"<a {type(key).__name__} key>"


def _flatten(obj: Mapping, prefix: str = "", out: dict[str, Any] | None = None, depth: int = 0) -> dict[str, Any]:
    """Flatten nested mappings into ``a.b`` keys (a verl-style ``{"batch": {...}}`` dict works)."""
    out = {} if out is None else out
    if depth > 4:
        return out
    for k, v in obj.items():
        name = f"{prefix}{_key_text(k)}"
        if isinstance(v, Mapping):
            _flatten(v, name + ".", out, depth + 1)
        else:
            out[name] = v
        if len(out) > MAX_MEMBERS:
            raise RolloutFileError("the file holds more than 10,000 entries: refused")
    return out


class TokenRows:
    """Token strings held as the pickle's lists of lists, checked once; rows come out as object arrays."""

    def __init__(self, rows: list | tuple, width: int) -> None:
        self.data, self.width = rows, width

    def __getitem__(self, s: slice) -> np.ndarray:
        part = self.data[s]
        out = np.empty((len(part), self.width), dtype=object)
        for i, row in enumerate(part):
            out[i, :] = list(row)
        return out


def _token_spec(key: str, v: list | tuple, limits: Limits) -> ArraySpec:
    """A list of lists of strings: rectangular, each string at most ``MAX_TOKEN_CHARS``, all of them
    (every occurrence of a shared string counted) within the byte budget."""
    width = len(v[0])
    judge(key, (len(v), width), np.dtype(np.intp), limits)  # the element cap; the strings are budgeted below
    per_row: dict[int, int] = {}
    chars = 0
    for i, row in enumerate(v):
        if not isinstance(row, (list, tuple)) or len(row) != width:
            n = len(row) if isinstance(row, (list, tuple)) else type(row).__name__
            raise RolloutFileError(
                f"{quoted(key)} row {i} has {n} tokens but row 0 has {width}: token rows must be [batch, tokens]"
            )
        if id(row) not in per_row:
            count = 0
            for tok in row:
                if not isinstance(tok, str):
                    raise RolloutFileError(
                        f"{quoted(key)} row {i} holds a {type(tok).__name__}; expected strings (token ids go in "
                        "'token_ids')"
                    )
                if len(tok) > MAX_TOKEN_CHARS:
                    raise RolloutFileError(
                        f"{quoted(key)} row {i} holds a string of {len(tok):,} characters; a token is at most "
                        f"{MAX_TOKEN_CHARS}: refused"
                    )
                count += len(tok)
            per_row[id(row)] = count
        chars += per_row[id(row)]
        if 4 * chars > limits.max_bytes:
            raise RolloutFileError(
                f"{quoted(key)} holds more than {limits.max_bytes // 4:,} characters of token strings (counting "
                "each occurrence), beyond the byte budget (--max-tokens): refused"
            )
    return ArraySpec(key, "object", value=TokenRows(v, width), shape=(len(v), width))


def _value_spec(key: str, v: Any, limits: Limits) -> ArraySpec:
    """A value that is not a tensor: token lists, a number (a step), or something reported by type."""
    if isinstance(v, (list, tuple)) and v and isinstance(v[0], (list, tuple)):
        return _token_spec(key, v, limits)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return ArraySpec(key, type(v).__name__, shape=())
    if isinstance(v, int) and not -_INT64 <= v < _INT64:
        raise RolloutFileError(f"{quoted(key)} holds an integer of about {digits(v):,} digits, beyond int64")
    if isinstance(v, float) and not math.isfinite(v):
        raise RolloutFileError(f"{quoted(key)} holds {v}; expected a finite number")
    return ArraySpec(key, "int64" if isinstance(v, int) else "float64", value=np.asarray(v), shape=())


def _tensor_spec(
    fh: IO[bytes], zf: zipfile.ZipFile, members: dict, prefix: str, order: str, key: str, t: _TensorRef, limits: Limits
) -> ArraySpec:
    st = t.storage
    disk = np.dtype(order + _DISK[st.dtype]) if st.dtype not in ("bool", "int8", "uint8") else np.dtype(_DISK[st.dtype])
    header = judge(key, t.size, disk, limits, strides=t.stride, offset=t.offset, storage=st.numel)
    info = members.get(prefix + "data/" + st.key)
    if info is None:
        raise RolloutFileError(f"tensor {quoted(key)}: its storage is missing from the archive")
    if info.file_size != st.numel * disk.itemsize:
        raise RolloutFileError(
            f"tensor {quoted(key)}: its storage declares {st.numel:,} elements but the archive holds "
            f"{info.file_size:,} bytes: refused (corrupt or forged)"
        )
    return ArraySpec(key, st.dtype, disk, header, member_source(fh, zf, info), 0)


def _legacy(fh: IO[bytes]) -> NoReturn:
    """The pre-1.6 format (a pickle first): look at it with the restricted unpickler only, then refuse."""
    try:
        SafeUnpickler(io.BytesIO(fh.read(_FAST_PICKLE))).load()  # only to say what it asks for
    except _Refused as err:
        raise RolloutFileError(_refused_message(str(err))) from None
    except Exception:  # noqa: BLE001 - a legacy file is refused whatever its pickle holds
        pass
    raise RolloutFileError(
        "a legacy (non-zip) torch.save file or a bare pickle: klviz reads only the zip format "
        "torch.save writes since PyTorch 1.6 (nothing in it was executed); re-save it with torch.save"
    )


def open_pt(fh: IO[bytes], limits: Limits) -> tuple[dict[str, ArraySpec], zipfile.ZipFile]:
    """Every entry of a ``torch.save`` dict judged; the specs and the open archive."""
    head = fh.read(8)
    fh.seek(0)
    if head[:1] == b"\x80":
        _legacy(fh)
    if not head.startswith(b"PK"):
        raise RolloutFileError(
            "refused: not a torch.save file (neither a zip archive nor a binary pickle); nothing in it was executed"
        )
    zf = open_zip(fh, "PyTorch file")
    infos = zf.infolist()
    pkl = [i for i in infos if i.filename.endswith("data.pkl") and i.filename.count("/") == 1]
    if not pkl:
        raise RolloutFileError("not a torch.save archive (no data.pkl)")
    prefix = pkl[0].filename[: -len("data.pkl")]
    if pkl[0].file_size > _MAX_PICKLE:
        raise RolloutFileError(f"the archive's data.pkl declares {pkl[0].file_size:,} bytes: refused")
    members = {i.filename: i for i in infos}
    order = "<"
    bo = members.get(prefix + "byteorder")
    if bo is not None and bo.file_size <= 16:
        text = member_source(fh, zf, bo).read(0, bo.file_size).decode("ascii", "replace").strip()
        order = ">" if text == "big" else "<"
    obj = _unpickle(member_source(fh, zf, pkl[0]).read(0, pkl[0].file_size))
    if not isinstance(obj, Mapping):
        raise RolloutFileError(
            f"the file holds {'a tensor' if isinstance(obj, _TensorRef) else 'a ' + type(obj).__name__}, "
            "expected a dict of tensors keyed by name"
        )
    specs: dict[str, ArraySpec] = {}
    for name, v in _flatten(obj).items():
        key = str(name)
        try:
            if isinstance(v, _TensorRef):
                specs[key] = _tensor_spec(fh, zf, members, prefix, order, key, v, limits)
            else:
                specs[key] = _value_spec(key, v, limits)
        except RolloutFileError as err:
            specs[key] = ArraySpec.refusal(key, str(err))
    return specs, zf
