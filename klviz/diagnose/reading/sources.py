"""Where an array's bytes come from: a range of an open file, or a member of a zip archive.

Every failure of the bytes themselves (a file truncated or rewritten while it is read, a bad CRC,
corrupt deflate data, an unsupported compression method) becomes a :class:`RolloutFileError`: bad
input, never a crash.
"""

from __future__ import annotations

import lzma
import os
import stat
import struct
import zipfile
import zlib
from pathlib import Path
from typing import IO, Any

from .core import RolloutFileError, escape_text

__all__ = ["FileBytes", "ZipMemberBytes", "open_regular", "open_zip", "member_source", "MAX_MEMBERS"]

MAX_MEMBERS = 10_000  # members of a zip archive
_SUPPORTED = {
    zipfile.ZIP_STORED: "stored",
    zipfile.ZIP_DEFLATED: "deflate",
    zipfile.ZIP_BZIP2: "bzip2",
    zipfile.ZIP_LZMA: "lzma",
}
#: What reading an archive member raises when its bytes are corrupt, cut short or changed underneath.
_BROKEN = (zipfile.BadZipFile, zlib.error, lzma.LZMAError, EOFError, OSError, NotImplementedError, RuntimeError)


class FileBytes:
    """Random access to ``size`` bytes of an open file starting at ``base``."""

    def __init__(self, fh: IO[bytes], base: int, size: int) -> None:
        self.fh, self.base, self.size = fh, base, size

    def read(self, start: int, nbytes: int) -> bytes:
        if start < 0 or start + nbytes > self.size:
            raise RolloutFileError("the file is shorter than its header says (truncated?)")
        try:
            self.fh.seek(self.base + start)
            data = self.fh.read(nbytes)
        except OSError as err:
            raise RolloutFileError(f"the file could not be read ({escape_text(err, 100)})") from None
        if len(data) != nbytes:
            raise RolloutFileError("the file is shorter than its header says (truncated or changed while read?)")
        return data


class ZipMemberBytes:
    """Forward reading of one compressed zip member (re-opened to go back); never past its declared size."""

    def __init__(self, zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> None:
        self.zf, self.info, self.size = zf, info, info.file_size
        self.fh: Any = None
        self.pos = 0

    def _broken(self, err: BaseException) -> RolloutFileError:
        return RolloutFileError(
            f"archive member '{escape_text(self.info.filename)}' is corrupt, truncated or changed while read "
            f"({type(err).__name__}: {escape_text(err, 100)})"
        )

    def read(self, start: int, nbytes: int) -> bytes:
        if start < 0 or start + nbytes > self.size:
            raise RolloutFileError("an archive member is shorter than its header says")
        try:
            if self.fh is None or start < self.pos:
                self.fh = self.zf.open(self.info)
                self.pos = 0
            while self.pos < start:
                skipped = len(self.fh.read(min(start - self.pos, 1 << 22)))
                if skipped == 0:
                    raise RolloutFileError("an archive member is shorter than its header says")
                self.pos += skipped
            data = self.fh.read(nbytes)
        except _BROKEN as err:
            self.fh = None
            raise self._broken(err) from None
        self.pos += len(data)
        if len(data) != nbytes:
            raise RolloutFileError("an archive member is shorter than its header says")
        return data


def open_regular(path: Path) -> IO[bytes]:
    """Open ``path`` for reading if it is a regular, non-empty file (a FIFO is never waited on)."""
    name = escape_text(path.name)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise RolloutFileError(f"no such file: {name}") from None
    except OSError as err:
        raise RolloutFileError(f"cannot read {name}: {err.strerror or err}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise RolloutFileError(f"{name} is not a regular file ({file_kind(st.st_mode)}); expected a rollout dump")
        if st.st_size == 0:
            raise RolloutFileError(f"{name} is empty")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def file_kind(mode: int) -> str:
    """What a non-regular file is, in words."""
    for test, word in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return word
    return "not a regular file"


def open_zip(fh: IO[bytes], what: str) -> zipfile.ZipFile:
    """The archive in ``fh``, its member count and compression methods checked before any member is read."""
    try:
        zf = zipfile.ZipFile(fh)
    except Exception as err:  # noqa: BLE001 - a forged directory can raise many things: all are bad input
        raise RolloutFileError(f"not a readable {what} ({type(err).__name__}: {escape_text(err, 120)})") from None
    infos = zf.infolist()
    if len(infos) > MAX_MEMBERS:
        raise RolloutFileError(f"the archive has {len(infos):,} members: refused")
    return zf


def member_source(fh: IO[bytes], zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> FileBytes | ZipMemberBytes:
    """The bytes of one member: read in place when stored, through the decompressor otherwise."""
    name = escape_text(info.filename)
    if info.flag_bits & 0x1:
        raise RolloutFileError(f"archive member '{name}' is encrypted: refused")
    if info.compress_type not in _SUPPORTED:
        raise RolloutFileError(
            f"archive member '{name}' uses compression method {info.compress_type}, which klviz does not read "
            "(stored, deflate, bzip2 or lzma): refused"
        )
    if info.compress_type == zipfile.ZIP_STORED:
        try:
            fh.seek(info.header_offset)
            local = fh.read(30)
        except (OSError, ValueError, OverflowError) as err:
            raise RolloutFileError(f"not a readable zip archive ({escape_text(err, 100)})") from None
        if len(local) != 30 or local[:4] != b"PK\x03\x04":
            raise RolloutFileError("not a readable zip archive (bad local header)")
        name_len, extra_len = struct.unpack("<HH", local[26:30])
        return FileBytes(fh, info.header_offset + 30 + name_len + extra_len, info.file_size)
    return ZipMemberBytes(zf, info)
