"""The core every format shares: one judge of what a header declares, and one way to read rows.

A format module (:mod:`.npz`, :mod:`.pt`, :mod:`.safetensors`) only finds, in its own bytes, what each
array *declares*: a dtype, a shape, and for views of a storage the strides and offset. :func:`judge`
decides from that alone, before any data is read, whether the array may be read, in this order:

1. the dtype: numbers, booleans or fixed-width strings (never objects, which would be pickles);
2. the number of dimensions (at most :data:`MAX_DIMS`), before any arithmetic on the shape, so a
   header declaring a million dimensions costs microseconds;
3. each dimension a non-negative integer, and the element count within the cap (``--max-tokens``);
4. a token string's declared width within :data:`MAX_TOKEN_CHARS`, and the bytes the array holds
   (elements × item size; a string of n characters is 4n bytes) within the byte budget;
5. for a view of a storage: strides and offset inside the storage, no two elements at one place, and a
   layout klviz can stream (rows, or columns; any other layout only when small).

:class:`ArraySpec` then reads ``[rows, tokens]`` slices of an accepted 2-D array with memory that does
not grow with the array, whatever its layout: row-major arrays a block of rows at a time; column-major
ones (NumPy ``fortran_order``, a transposed tensor) are first rewritten, one band of columns at a time,
into a temporary file of column blocks, from which each block of rows is gathered.
"""

from __future__ import annotations

import math
import tempfile
import unicodedata
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

__all__ = [
    "RolloutFileError",
    "escape_text",
    "one_line",
    "quoted",
    "Limits",
    "Header",
    "judge",
    "ArraySpec",
    "ByteSource",
    "DEFAULT_MAX_TOKENS",
    "MAX_DIMS",
    "MAX_TOKEN_CHARS",
    "BYTES_PER_TOKEN",
    "BLOCK_BYTES",
    "FLOAT_DTYPES",
    "digits",
]

#: Largest number of elements (tokens) one array may declare: 2**27 = 134,217,728, e.g. 16,384
#: responses of 8,192 tokens. A real batch fits under it; a declared size beyond it is refused before
#: anything is allocated (raise it with ``--max-tokens``).
DEFAULT_MAX_TOKENS = 2**27
#: A rollout array is [batch, tokens]; a step may be a scalar or one element. Three leaves room for a
#: [batch, tokens, 1] array and refuses forged headers before any arithmetic on their shape.
MAX_DIMS = 3
#: The byte budget of one array is this many bytes per token of the cap (a float64 per token): 1 GiB
#: at the default cap. Numbers never exceed it within the element cap; strings count 4 bytes a character.
BYTES_PER_TOKEN = 8
#: Longest token string accepted (characters). Real vocabularies stay far below it (byte-level BPE
#: tokens are at most a few dozen bytes); a longer declared width or string is refused.
MAX_TOKEN_CHARS = 256
#: Largest block read at once (bytes) where a layout does not allow reading row blocks directly.
BLOCK_BYTES = 16 << 20
FLOAT_DTYPES = frozenset({"float64", "float32", "float16", "bfloat16"})
_MAX_MESSAGE = 300  # characters of one error message


class RolloutFileError(ValueError):
    """A rollout dump that cannot be used; the message is one line that says why."""

    def __init__(self, message: str) -> None:
        super().__init__(one_line(message, _MAX_MESSAGE))


# -- text echoed from a file ------------------------------------------------------------------


def escape_text(text: Any, limit: int = 80) -> str:
    """``text`` with every control, format or unpaired-surrogate character shown as an escape
    (``\\x1b``, ``\\u202e``, ``\\udcff``), at most ``limit`` characters (``...`` marks a cut): safe to print
    whatever a file put in a key name, and always encodable as UTF-8."""
    out = []
    for ch in str(text):
        cat = unicodedata.category(ch)
        if cat[0] == "C" or cat in ("Zl", "Zp"):
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
        else:
            out.append(ch)
        if len(out) > limit:
            break
    s = "".join(out)
    return s if len(s) <= limit else s[: max(limit - 3, 1)] + "..."


def one_line(text: str, limit: int = 200) -> str:
    """``text`` escaped, its whitespace runs made single spaces, cut to ``limit`` characters."""
    line = " ".join(escape_text(text, 10 * limit).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def quoted(key: str) -> str:
    """A key name as messages show it: escaped, cut, in single quotes."""
    return f"'{escape_text(key)}'"


# -- the judge --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Limits:
    """What one array may declare: ``max_tokens`` elements and ``BYTES_PER_TOKEN`` bytes per token."""

    max_tokens: int = DEFAULT_MAX_TOKENS

    @property
    def max_bytes(self) -> int:
        return BYTES_PER_TOKEN * self.max_tokens


@dataclass(frozen=True)
class Header:
    """One array as judged: ``shape``; ``strides`` in elements and ``offset`` within the bytes read;
    ``layout`` is ``"rows"`` (a row's elements adjacent), ``"columns"`` (a column's elements adjacent) or
    ``"small"`` (any other layout, read whole because it is small)."""

    key: str
    shape: tuple[int, ...]
    itemsize: int
    strides: tuple[int, ...]
    offset: int
    layout: str

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def extent(self) -> int:
        """Elements from ``offset`` to the last one (0 for an empty array)."""
        if self.numel == 0:
            return 0
        return sum((d - 1) * s for d, s in zip(self.shape, self.strides)) + 1


def _int_dim(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        return None
    return int(value)


def judge(
    key: str,
    shape: Any,
    dtype: np.dtype,
    limits: Limits,
    *,
    strides: Any = None,
    offset: Any = 0,
    storage: int | None = None,
) -> Header:
    """Judge an array from its header alone; raise :class:`RolloutFileError` saying why it is refused.

    ``dtype`` is the NumPy dtype of the stored bytes: numbers, booleans or fixed-width strings only.
    ``shape`` and ``strides`` are taken as the file gave them (any Python object): their length is
    checked before anything else. ``storage`` is the number of elements the file holds for a view
    (``strides``/``offset`` index into it); without ``strides`` the array is C order.
    """
    what = f"array {quoted(key)}"
    if dtype.hasobject:
        raise RolloutFileError(
            f"refused: {what} holds pickled Python objects; klviz never unpickles an array, so nothing in it "
            "was executed. Save numeric arrays only"
        )
    if dtype.fields is not None or dtype.subdtype is not None or dtype.kind not in "biufUS":
        raise RolloutFileError(f"{what} has dtype {escape_text(dtype)}; expected numbers or strings")
    if dtype.itemsize == 0:
        raise RolloutFileError(f"{what} has an empty dtype {escape_text(dtype)}")
    itemsize = dtype.itemsize
    chars = itemsize // 4 if dtype.kind == "U" else itemsize if dtype.kind == "S" else None
    if not isinstance(shape, (tuple, list)):
        raise RolloutFileError(f"{what} declares a shape that is not a list of dimensions")
    if len(shape) > MAX_DIMS:
        raise RolloutFileError(
            f"{what} declares {len(shape):,} dimensions; a rollout array has at most {MAX_DIMS} ([batch, tokens]): "
            "refused before reading"
        )
    dims = [_int_dim(s) for s in shape]
    if any(d is None for d in dims):
        raise RolloutFileError(f"{what} declares a dimension that is not an integer")
    shp = tuple(d for d in dims if d is not None)
    if any(d < 0 for d in shp):
        raise RolloutFileError(f"{what} declares a negative dimension")
    if any(d > limits.max_tokens for d in shp) or math.prod(shp) > limits.max_tokens:
        n = math.prod(shp) if all(d <= 1 << 64 for d in shp) else None
        size = f" = {n:,} elements" if n is not None else ""
        raise RolloutFileError(
            f"{what} declares shape {_shape_text(shp)}{size}, beyond the cap of {limits.max_tokens:,} "
            "(--max-tokens): refused before reading"
        )
    n = math.prod(shp)
    if chars is not None and chars > MAX_TOKEN_CHARS:
        raise RolloutFileError(
            f"{what} declares strings of up to {chars:,} characters; a token is at most {MAX_TOKEN_CHARS} "
            "(save the token ids instead): refused before reading"
        )
    if n * itemsize > limits.max_bytes:
        raise RolloutFileError(
            f"{what} declares {n:,} elements of {itemsize:,} bytes = {n * itemsize:,} bytes, beyond the budget "
            f"of {limits.max_bytes:,} bytes ({BYTES_PER_TOKEN} per token of --max-tokens): refused before reading"
        )
    if strides is None:
        if storage is not None and n > storage:
            raise RolloutFileError(f"{what} declares {n:,} elements but the file holds {storage:,}")
        st = tuple(math.prod(shp[i + 1 :]) for i in range(len(shp)))
        return Header(str(key), shp, itemsize, st, 0, _layout(shp, st, itemsize))
    return _judge_view(str(key), shp, itemsize, strides, offset, storage, limits)


def _judge_view(
    key: str, shape: tuple[int, ...], itemsize: int, strides: Any, offset: Any, storage: int | None, limits: Limits
) -> Header:
    what = f"tensor {quoted(key)}"
    if not isinstance(strides, (tuple, list)) or len(strides) != len(shape):
        raise RolloutFileError(f"{what} has a malformed layout (its strides do not match its {len(shape)} dimensions)")
    st = tuple(_int_dim(s) for s in strides)
    off = _int_dim(offset)
    if off is None or any(s is None for s in st):
        raise RolloutFileError(f"{what} has a malformed layout (a stride or offset that is not an integer)")
    stv = tuple(s for s in st if s is not None)
    if off < 0 or any(s < 0 for s in stv):
        raise RolloutFileError(f"{what} has a malformed layout (shape {shape}, stride {stv}, offset {off})")
    numel = storage if storage is not None else 0
    if numel < 0 or numel * itemsize > limits.max_bytes:
        raise RolloutFileError(
            f"{what}: its storage declares {numel:,} elements, beyond the budget of {limits.max_bytes:,} bytes "
            "(--max-tokens): refused before reading; save tensor.clone() of the part you need"
        )
    n = math.prod(shape)
    if n == 0:
        return Header(key, shape, itemsize, stv, off, "rows")
    extent = off + sum((d - 1) * s for d, s in zip(shape, stv)) + 1
    if n > numel - off or extent > numel:
        raise RolloutFileError(
            f"refused: {what} claims shape {shape} ({n:,} elements) but its storage holds {numel:,} "
            f"from offset {off} (stride {stv}: a stride-0 or overlapping view); save tensor.contiguous()"
        )
    reach = 1
    for s, d in sorted((s, d) for d, s in zip(shape, stv) if d > 1):
        if s < reach:
            raise RolloutFileError(
                f"refused: {what} is an overlapping view (shape {shape}, stride {stv}); save tensor.contiguous()"
            )
        reach = s * d
    layout = _layout(shape, stv, itemsize)
    if layout == "other":
        raise RolloutFileError(
            f"{what} is a strided view (shape {shape}, stride {stv}) of {(extent - off) * itemsize:,} bytes; klviz "
            f"streams such views only up to {BLOCK_BYTES >> 20} MiB: save tensor.contiguous()"
        )
    return Header(key, shape, itemsize, stv, off, layout)


def _layout(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> str:
    """``rows``, ``columns``, ``small`` or ``other`` (refused) for an array already known not to overlap."""
    if len(shape) != 2:
        contiguous = all(s == math.prod(shape[i + 1 :]) for i, s in enumerate(strides) if shape[i] > 1)
        extent = sum((d - 1) * s for d, s in zip(shape, strides)) + 1 if math.prod(shape) else 0
        return "rows" if contiguous or extent * itemsize <= BLOCK_BYTES else "other"
    (r, c), (s0, s1) = shape, strides
    if c <= 1 or s1 == 1:
        return "rows"
    if r <= 1 or s0 == 1:
        return "columns"
    extent = (r - 1) * s0 + (c - 1) * s1 + 1
    return "small" if extent * itemsize <= BLOCK_BYTES else "other"


def digits(n: int) -> int:
    """About how many decimal digits ``n`` has, without converting it (a 5,000-digit int cannot be)."""
    return int(abs(n).bit_length() * 0.30103) + 1


def _shape_text(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(f"{d:,}" if d < 10**30 else f"~1e{digits(d) - 1}" for d in shape) + ")"


# -- reading --------------------------------------------------------------------------------------


class ByteSource(Protocol):
    """Random access to ``size`` bytes (a file range, a zip member)."""

    size: int

    def read(self, start: int, nbytes: int) -> bytes: ...


class _Transposed:
    """A column-major 2-D array rewritten as column blocks, each a C-order [rows, k] matrix, in a
    temporary file: written once, a band of columns at a time; read a block of rows at a time."""

    def __init__(self, spec: ArraySpec) -> None:
        h = spec.header
        assert h is not None and spec.disk is not None
        self.r, self.c = h.shape
        s1 = h.strides[1]
        self.dtype: np.dtype = spec.disk
        item = h.itemsize
        self.k = max(1, min(self.c, BLOCK_BYTES // max(self.r * item, 1)))
        self.file = tempfile.TemporaryFile(prefix="klviz-columns-")
        try:
            for c0 in range(0, self.c, self.k):
                kb = min(self.k, self.c - c0)
                if self.r * item > BLOCK_BYTES:  # one column larger than a block: copied in pieces
                    step = BLOCK_BYTES // item
                    for a in range(0, self.r, step):
                        self.file.write(spec.read_elements(h.offset + c0 * s1 + a, min(step, self.r - a)).data)
                    continue
                block = np.empty((self.r, kb), dtype=self.dtype)
                per = max(1, (BLOCK_BYTES // item - self.r) // max(s1, 1) + 1)  # columns one block-sized read spans
                for a in range(0, kb, per):
                    b = min(kb, a + per)
                    flat = spec.read_elements(h.offset + (c0 + a) * s1, (b - a - 1) * s1 + self.r)
                    block[:, a:b] = np.lib.stride_tricks.as_strided(flat, (self.r, b - a), (item, s1 * item))
                self.file.write(block.data)
        except BaseException:
            self.file.close()
            raise

    def rows(self, r0: int, r1: int) -> np.ndarray:
        n, item = r1 - r0, self.dtype.itemsize
        out = np.empty((n, self.c), dtype=self.dtype)
        for c0 in range(0, self.c, self.k):
            kb = min(self.k, self.c - c0)
            self.file.seek((self.r * c0 + r0 * kb) * item)
            data = self.file.read(n * kb * item)
            if len(data) != n * kb * item:
                raise RolloutFileError("the temporary copy of a column-major array is short (disk full?)")
            out[:, c0 : c0 + kb] = np.frombuffer(data, dtype=self.dtype).reshape(n, kb)
        return out

    def close(self) -> None:
        self.file.close()


class ArraySpec:
    """One array as its header declares it, and how to read its bytes without loading the rest.

    ``dtype`` is the stored dtype's name (``"bfloat16"`` and ``"str"`` included); ``disk`` the NumPy dtype
    of the bytes (byte order included; bfloat16 is read as ``uint16`` and widened to float32). An array
    held in memory (a ``.pt``'s token strings, a number) has ``value`` instead of a byte source. An
    array refused by :func:`judge` keeps the reason in ``refused``: a dump fails with it only if one of
    its roles uses that array.
    """

    def __init__(
        self,
        key: str,
        dtype: str,
        disk: np.dtype | None = None,
        header: Header | None = None,
        source: ByteSource | None = None,
        base: int = 0,
        *,
        value: Any = None,
        shape: tuple[int, ...] = (),
        refused: str | None = None,
    ) -> None:
        self.key, self.dtype, self.disk, self.header = key, dtype, disk, header
        self.source, self.base, self.value, self.refused = source, base, value, refused
        self.shape: tuple[int, ...] = header.shape if header is not None else shape
        self._whole: np.ndarray | None = None
        self._columns: _Transposed | None = None

    @classmethod
    def refusal(cls, key: str, message: str) -> ArraySpec:
        return cls(key, "refused", refused=message)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def is_float(self) -> bool:
        return self.dtype in FLOAT_DTYPES

    def read_elements(self, first: int, count: int) -> np.ndarray:
        """``count`` elements from element ``first`` of the bytes, as stored (a 1-D array of ``disk``)."""
        assert self.source is not None and self.disk is not None
        item = self.disk.itemsize
        return np.frombuffer(self.source.read(self.base + first * item, count * item), dtype=self.disk)

    def _decode(self, raw: np.ndarray) -> np.ndarray:
        if self.dtype == "bfloat16":
            return (raw.astype(np.uint32) << 16).view(np.float32)
        if self.disk is not None and not self.disk.isnative:
            return raw.astype(self.disk.newbyteorder("="))
        return raw

    def rows(self, r0: int, r1: int) -> np.ndarray:
        """Rows ``r0:r1`` of a 2-D array as a C-contiguous native array (bfloat16 widened to float32)."""
        if self.value is not None:
            return np.asarray(self.value[r0:r1])
        assert self.header is not None and self.disk is not None
        r, c = self.shape
        r0, r1 = max(0, r0), min(r, r1)
        n = r1 - r0
        if n <= 0 or c == 0:
            return self._decode(np.zeros((max(n, 0), c), dtype=self.disk))
        layout = self.header.layout
        if layout == "rows":
            return np.ascontiguousarray(self._decode(self._row_block(r0, n)))
        if layout == "columns" and self.header.extent * self.header.itemsize > BLOCK_BYTES:
            if self._columns is None:
                self._columns = _Transposed(self)
            return self._decode(self._columns.rows(r0, r1))
        return np.ascontiguousarray(self._decode(self._small()[r0:r1]))

    def _row_block(self, r0: int, n: int) -> np.ndarray:
        h = self.header
        assert h is not None
        c = h.shape[1]
        s0 = h.strides[0] if h.shape[0] > 1 else c
        first, span = h.offset + r0 * s0, (n - 1) * s0 + c
        if s0 == c:
            return self.read_elements(first, n * c).reshape(n, c)
        if span <= 2 * n * c or span * h.itemsize <= BLOCK_BYTES:  # rows with small gaps: one read
            flat = self.read_elements(first, span)
            return np.lib.stride_tricks.as_strided(flat, (n, c), (s0 * h.itemsize, h.itemsize))
        return np.stack([self.read_elements(first + i * s0, c) for i in range(n)])

    def _small(self) -> np.ndarray:
        """The whole array (within ``BLOCK_BYTES`` or a fully streamable layout), held once read."""
        if self._whole is None:
            h = self.header
            assert h is not None
            flat = self.read_elements(h.offset, h.extent)
            self._whole = np.lib.stride_tricks.as_strided(
                flat, h.shape, tuple(s * h.itemsize for s in h.strides), writeable=False
            )
        return self._whole

    def whole(self) -> np.ndarray:
        """The whole array (any number of dimensions), native dtype: for small arrays such as ``step``."""
        if self.value is not None:
            return np.asarray(self.value)
        if len(self.shape) == 2:
            return self.rows(0, self.shape[0])
        assert self.header is not None and self.disk is not None
        if self.numel == 0:
            return self._decode(np.zeros(self.shape, self.disk))
        if self.header.extent * self.header.itemsize > BLOCK_BYTES:
            raise RolloutFileError(f"array {quoted(self.key)} is too large to read whole")
        return np.ascontiguousarray(self._decode(self._small()))

    def close(self) -> None:
        if self._columns is not None:
            self._columns.close()
            self._columns = None
        self._whole = None
