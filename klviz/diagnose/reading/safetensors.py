"""``.safetensors`` files: the JSON header (its length capped) judged entry by entry, no package needed.

A ``.safetensors`` file is an 8-byte little-endian header length, a JSON object ``{name: {"dtype",
"shape", "data_offsets"}}`` and the data, each tensor a C-order byte range. :func:`write_safetensors`
writes one (``save_rollouts``).
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import IO, Any

import numpy as np

from .core import ArraySpec, Limits, RolloutFileError, escape_text, judge, quoted
from .sources import MAX_MEMBERS, FileBytes

__all__ = ["open_safetensors", "write_safetensors", "parse_json"]

_MAX_HEADER = 16 << 20  # bytes of a .safetensors JSON header
_DTYPES = {
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
_DISK = {
    "float64": "<f8",
    "float32": "<f4",
    "float16": "<f2",
    "bfloat16": "<u2",
    "int64": "<i8",
    "int32": "<i4",
    "int16": "<i2",
    "int8": "i1",
    "uint8": "u1",
    "bool": "b1",
}


def parse_json(text: str | bytes, what: str) -> Any:
    """JSON from a file, every failure (bad syntax, nesting too deep, a number too long) one line."""
    try:
        return json.loads(text)
    except RecursionError:
        raise RolloutFileError(f"{what}: the JSON nests too deeply: refused") from None
    except (ValueError, TypeError) as err:  # UnicodeDecodeError and int-digit limits are ValueErrors
        raise RolloutFileError(f"{what}: not valid JSON ({escape_text(err, 80)})") from None


def _entry(key: str, meta: Any, data: FileBytes, limits: Limits) -> ArraySpec:
    if not isinstance(meta, dict) or meta.get("dtype") not in _DTYPES:
        raise RolloutFileError(f"tensor {quoted(key)} is malformed or has an unsupported dtype")
    dtype = _DTYPES[meta["dtype"]]
    disk = np.dtype(_DISK[dtype])
    header = judge(key, meta.get("shape"), disk, limits)
    offsets = meta.get("data_offsets")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(x, int) and not isinstance(x, bool) for x in offsets)
    ):
        raise RolloutFileError(f"tensor {quoted(key)} has malformed data_offsets")
    begin, end = offsets
    if begin < 0 or end > data.size or end - begin != header.numel * disk.itemsize:
        raise RolloutFileError(
            f"tensor {quoted(key)} declares shape {header.shape} but bytes [{begin}, {end}) of a "
            f"{data.size:,}-byte data section: refused (corrupt or forged)"
        )
    return ArraySpec(key, dtype, disk, header, data, begin)


def open_safetensors(fh: IO[bytes], limits: Limits) -> dict[str, ArraySpec]:
    """Every tensor of the header judged; an entry that fails keeps its reason."""
    size = os.fstat(fh.fileno()).st_size
    head = fh.read(8)
    if len(head) < 8:
        raise RolloutFileError("not a readable .safetensors file (shorter than its 8-byte header length)")
    hlen = struct.unpack("<Q", head)[0]
    if hlen > _MAX_HEADER or 8 + hlen > size:
        raise RolloutFileError(f"not a readable .safetensors file (it declares a {hlen:,}-byte header)")
    raw = fh.read(hlen)
    if len(raw) != hlen:
        raise RolloutFileError("not a readable .safetensors file (shorter than its header says)")
    header = parse_json(raw, "not a readable .safetensors file (header)")
    if not isinstance(header, dict):
        raise RolloutFileError("not a readable .safetensors file (the header is not a JSON object)")
    if len(header) > MAX_MEMBERS:
        raise RolloutFileError(f"the .safetensors header lists {len(header):,} tensors: refused")
    data = FileBytes(fh, 8 + hlen, size - 8 - hlen)
    specs: dict[str, ArraySpec] = {}
    for key, meta in header.items():
        if key == "__metadata__":
            continue
        try:
            specs[key] = _entry(key, meta, data, limits)
        except RolloutFileError as err:
            specs[key] = ArraySpec.refusal(key, str(err))
    return specs


def write_safetensors(path: Path, data: dict[str, np.ndarray]) -> None:
    """Write ``data`` (C-order arrays of the dtypes above) as a ``.safetensors`` file."""
    codes = {np.dtype(_DISK[name]).name: code for code, name in _DTYPES.items() if name != "bfloat16"}
    header, offset, blobs = {}, 0, []
    for key, a in data.items():
        a = np.ascontiguousarray(a.astype(a.dtype.newbyteorder("<"), copy=False))
        header[key] = {
            "dtype": codes[a.dtype.name],
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
