"""``.npz`` archives: each member's ``.npy`` header parsed by klviz (never ``numpy.load``), then judged.

A ``.npy`` header is a short Python dict literal (``{'descr': '<f4', 'fortran_order': False, 'shape':
(512, 4096), }``). It is read with a strict pattern, not evaluated: the shape's length is known before a
single dimension is converted. Object arrays (pickles) are refused; byte order is honoured; Fortran-order
arrays are read as column-major views (streamed by :class:`~.core.ArraySpec`).
"""

from __future__ import annotations

import math
import re
import struct
import zipfile
from typing import IO, Any

import numpy as np

from .core import MAX_DIMS, ArraySpec, ByteSource, Limits, RolloutFileError, escape_text, judge, quoted
from .sources import member_source, open_zip

__all__ = ["open_npz", "numpy_dtype_name"]

_MAX_NPY_HEADER = 1 << 16  # bytes of one .npy header
_NUMPY_NAMES = {
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
_STRING = r"""(?:'([^'\\]*)'|"([^"\\]*)")"""
_FIELDS = {
    "descr": re.compile(r"""['"]descr['"]\s*:\s*""" + _STRING),
    "fortran_order": re.compile(r"""['"]fortran_order['"]\s*:\s*(True|False)\b"""),
    "shape": re.compile(r"""['"]shape['"]\s*:\s*\(([^()]*)\)"""),
}
_DIM = re.compile(r"^\s*(\d{1,30})L?\s*$")


def numpy_dtype_name(dt: np.dtype) -> str:
    """``float32``, ``bool``, ``str`` ...: the name reports and checks use for a NumPy dtype."""
    return _NUMPY_NAMES.get(f"{dt.kind}{dt.itemsize}", "str" if dt.kind in "US" else str(dt))


def _parse_header(text: str, key: str) -> tuple[str, bool, list[str]]:
    """``descr``, ``fortran_order`` and the shape's items as text (not yet numbers)."""
    found = {name: pattern.search(text) for name, pattern in _FIELDS.items()}
    if not text.lstrip().startswith("{") or any(m is None for m in found.values()):
        if re.search(r"""['"]descr['"]\s*:\s*\[""", text):
            raise RolloutFileError(f"array {quoted(key)} has a structured dtype; expected numbers")
        raise RolloutFileError(f"array {quoted(key)} has an unreadable .npy header")
    d, f, s = found["descr"], found["fortran_order"], found["shape"]
    assert d is not None and f is not None and s is not None
    items = s.group(1).split(",")
    if items and not items[-1].strip():
        items = items[:-1]  # the trailing comma of (3,)
    return d.group(1) or d.group(2) or "", f.group(1) == "True", items


def _dim(item: str, key: str) -> int:
    m = _DIM.match(item)
    if m is None:
        raise RolloutFileError(f"array {quoted(key)} has an unreadable shape in its .npy header")
    return int(m.group(1))


def _npy_header(src: ByteSource, key: str) -> tuple[np.dtype, bool, list[Any], int]:
    read, size = src.read, src.size
    head = read(0, min(10, size))
    if len(head) < 10 or head[:6] != b"\x93NUMPY":
        raise RolloutFileError(f"array {quoted(key)} is not a .npy member (bad magic)")
    major = head[6]
    if major == 1:
        hlen, start = struct.unpack("<H", head[8:10])[0], 10
    elif major in (2, 3):
        if size < 12:
            raise RolloutFileError(f"array {quoted(key)} has a truncated .npy header")
        hlen, start = struct.unpack("<I", read(8, 4))[0], 12
    else:
        raise RolloutFileError(f"array {quoted(key)} has an unknown .npy version {major}")
    if hlen > _MAX_NPY_HEADER or start + hlen > size:
        raise RolloutFileError(f"array {quoted(key)} declares a {hlen:,}-byte header: refused")
    descr, fortran, items = _parse_header(read(start, hlen).decode("latin1"), key)
    try:
        dt = np.dtype(descr)
    except Exception:  # noqa: BLE001 - any descr NumPy cannot make is an unknown dtype
        raise RolloutFileError(f"array {quoted(key)} has an unknown dtype {escape_text(descr)}") from None
    # the items of a forged shape stay text: the judge counts them before converting any
    dims: list[Any] = items if len(items) > MAX_DIMS else [_dim(item, key) for item in items]
    return dt, fortran, dims, start + hlen


def _spec(fh: IO[bytes], zf: zipfile.ZipFile, info: zipfile.ZipInfo, key: str, limits: Limits) -> ArraySpec:
    src = member_source(fh, zf, info)
    dt, fortran, dims, data_start = _npy_header(src, key)
    if fortran and 1 < len(dims) <= MAX_DIMS:  # column-major: the first index varies fastest
        strides = [math.prod(dims[:i]) for i in range(len(dims))]
        header = judge(key, dims, dt, limits, strides=strides, storage=math.prod(dims))
    else:
        header = judge(key, dims, dt, limits)
    nbytes, held = header.numel * dt.itemsize, src.size - data_start
    if held != nbytes:
        raise RolloutFileError(
            f"array {quoted(key)} declares shape {header.shape} ({nbytes:,} bytes) but its member "
            f"holds {max(held, 0):,}: refused (corrupt or forged)"
        )
    return ArraySpec(key, numpy_dtype_name(dt), dt, header, src, data_start)


def open_npz(fh: IO[bytes], limits: Limits) -> tuple[dict[str, ArraySpec], zipfile.ZipFile]:
    """Every ``.npy`` member judged from its header; a member that fails keeps its reason (see
    :class:`~.core.ArraySpec`). Returns the specs and the open archive (kept open while they are read)."""
    zf = open_zip(fh, ".npz archive")
    specs: dict[str, ArraySpec] = {}
    for info in zf.infolist():
        if not info.filename.endswith(".npy"):
            continue
        key = info.filename[:-4]
        try:
            specs[key] = _spec(fh, zf, info, key, limits)
        except RolloutFileError as err:
            specs[key] = ArraySpec.refusal(key, str(err))
    return specs, zf
