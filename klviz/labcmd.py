"""``klviz lab [DIR]``: copy the lessons shipped inside the package into a working folder and open
JupyterLab there.

The copies are the learner's: a lesson whose cells a learner edited is never overwritten without
asking. Each file is compared by its :func:`lesson_fingerprint`, a SHA-256 of its cells' types and
sources only, so running a lesson (outputs, execution counts, widget state) is not editing it:

* missing in DIR                              -> copied;
* the same cells as the shipped version       -> left alone (with the learner's outputs);
* the same cells as the version klviz copied there
  earlier (recorded in ``DIR/.klviz-lessons.json``) but the package now ships a newer one
                                              -> updated (nobody edited it; outputs are rerun);
* anything else (the learner edited a cell)   -> kept. On a terminal klviz asks whether to
  overwrite it; without a terminal (a script, CI) it keeps the copy and says so; ``--force``
  overwrites after saving the old copy under ``DIR/backups/<time>/``.

The claims page, ``claims.md``, is copied beside the lessons too (their "checked on ..." links open it)
and always follows the installed version: it is generated from the property tests, not a learner's file.

DIR must be a folder this user owns and no other user can write (:func:`check_own_folder`): one
created by someone else (in a shared ``/tmp``) is refused in one line, since its owner could have
planted links or modules in it. Nothing is written through a link: files are created with
``O_EXCL``/``O_NOFOLLOW`` under a fresh name and renamed over their target.

JupyterLab then starts in DIR on 127.0.0.1 with a random token, locked as :mod:`klviz.servers`
describes, and the URL, token included, is printed once the server answers.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import secrets
import stat
import sys
import tempfile
import webbrowser
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from .servers import Server, edition_env, run_until_interrupted, start_lab_server

__all__ = [
    "shipped_notebooks_dir",
    "lesson_paths",
    "resolve_lesson",
    "sync_lessons",
    "SyncReport",
    "lesson_fingerprint",
    "check_own_folder",
    "UnsafeFolderError",
    "start_lab",
    "main",
]

DEFAULT_DIR = "klviz-lessons"
MANIFEST = ".klviz-lessons.json"
BACKUPS = "backups"
#: The claims page the lessons link to (``claims.md#claim-id``): generated, never a learner's file, so the
#: copy beside the lessons always follows the installed one.
CLAIMS_PAGE = "claims.md"


# -- where the lessons are ----------------------------------------------------------------------
def shipped_notebooks_dir() -> Path:
    """The folder of lesson notebooks: ``klviz/notebooks`` inside an installed package (in a source
    checkout that is a link to the repository's ``notebooks/``), else ``notebooks/`` beside the package."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "notebooks", here.parent / "notebooks"):
        if candidate.is_dir() and any(candidate.glob("*.ipynb")):
            return candidate
    raise FileNotFoundError(
        f"no lesson notebooks found in {here / 'notebooks'} or {here.parent / 'notebooks'}; "
        "reinstall klviz (`pip install --force-reinstall klviz`) or run from a source checkout"
    )


def lesson_paths(directory: str | os.PathLike[str] | None = None) -> list[Path]:
    """The lesson notebooks ``NN_topic.ipynb`` of ``directory`` (default: the shipped ones), in order."""
    folder = Path(directory) if directory is not None else shipped_notebooks_dir()
    if not folder.is_dir():
        raise ValueError(f"directory {str(folder)!r} is not a folder")
    return sorted(p for p in folder.glob("*.ipynb") if p.name[:2].isdigit() and not p.name.startswith("."))


def resolve_lesson(lesson: str, directory: str | os.PathLike[str] | None = None) -> Path:
    """A lesson given as a path (``notebooks/02_x.ipynb``), a number (``2``, ``02``) or a name
    prefix (``02_three``) -> the notebook path. Raises ValueError naming ``lesson`` otherwise."""
    as_path = Path(lesson)
    if as_path.suffix == ".ipynb":
        if not as_path.is_file():
            raise ValueError(f"lesson {lesson!r}: no such notebook")
        return as_path.resolve()
    lessons = lesson_paths(directory)
    key = lesson.strip()
    if key.isdigit():
        key = f"{int(key):02d}_"
    matches = [p for p in lessons if p.name.startswith(key) or p.stem == lesson]
    if len(matches) != 1:
        names = ", ".join(p.stem for p in lessons) or "none"
        what = "matches no lesson" if not matches else f"is ambiguous ({len(matches)} lessons match)"
        raise ValueError(f"lesson {lesson!r} {what}; the lessons are: {names}")
    return matches[0]


# -- a folder only this user controls ------------------------------------------------------------
class UnsafeFolderError(ValueError):
    """DIR is not a folder that only this user controls, or holds a link where klviz would write.

    The message is one line that names the path and says why."""


def _others_share_group(gid: int) -> bool:
    """Whether a user other than this one belongs to group ``gid`` (by membership or as primary group)."""
    import grp
    import pwd

    uid = os.geteuid()
    me = pwd.getpwuid(uid).pw_name if uid in {p.pw_uid for p in pwd.getpwall()} else None
    try:
        members = set(grp.getgrgid(gid).gr_mem) - {me}
    except KeyError:
        return True  # a group nobody can name: assume the worst
    return bool(members) or any(p.pw_gid == gid and p.pw_uid != uid for p in pwd.getpwall())


def check_own_folder(path: str | os.PathLike[str], *, what: str = "DIR") -> Path:
    """``path`` resolved, if it is a folder this user owns and no other user can write; else raise
    :class:`UnsafeFolderError` with one line saying why.

    Another local user who created the folder (in a shared ``/tmp``, say), or who may write in it,
    could have planted links that klviz would write through, or a ``klviz.py`` that a kernel started
    there would import. A symbolic link given as ``path`` must itself belong to this user. A folder
    writable by its group is accepted only when no other user is in that group (a private group).
    """
    given = Path(path).expanduser()
    if not hasattr(os, "geteuid"):  # no POSIX owners to check (Windows): only the kind of file
        if not given.is_dir():
            raise UnsafeFolderError(f"{what} {given} is not a folder")
        return given.resolve()
    uid = os.geteuid()
    link = os.lstat(given)
    if stat.S_ISLNK(link.st_mode) and link.st_uid != uid:
        raise UnsafeFolderError(
            f"{what} {given} is a link made by another user (uid {link.st_uid}); choose another folder"
        )
    folder = given.resolve()
    info = os.stat(folder)
    if not stat.S_ISDIR(info.st_mode):
        raise UnsafeFolderError(f"{what} {folder} exists and is not a folder")
    if info.st_uid != uid:
        raise UnsafeFolderError(
            f"{what} {folder} belongs to another user (uid {info.st_uid}), who could plant files in it; "
            "choose a folder of your own"
        )
    if info.st_mode & stat.S_IWOTH or (info.st_mode & stat.S_IWGRP and _others_share_group(info.st_gid)):
        raise UnsafeFolderError(
            f"{what} {folder} can be written by other users (mode {stat.S_IMODE(info.st_mode):o}); "
            f"run `chmod go-w {folder}` or choose another folder"
        )
    return folder


class _Folder:
    """A folder opened once; every file in it is read and written through this handle, and never
    through a symbolic link (``O_NOFOLLOW``; a new file is made with ``O_EXCL`` under a fresh name,
    then renamed over its target, which replaces a link instead of following it)."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self.fd = fd

    @classmethod
    def open(cls, path: Path) -> _Folder:
        return cls(path, os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW))

    def close(self) -> None:
        os.close(self.fd)

    def kind(self, name: str) -> str | None:
        """``"link"``, ``"folder"``, ``"file"``, ``"other"``, or None where nothing has that name."""
        try:
            mode = os.lstat(name, dir_fd=self.fd).st_mode
        except FileNotFoundError:
            return None
        if stat.S_ISLNK(mode):
            return "link"
        return "folder" if stat.S_ISDIR(mode) else "file" if stat.S_ISREG(mode) else "other"

    def refuse_link(self, name: str) -> None:
        """Raise :class:`UnsafeFolderError` if ``name`` is a link or not a plain file."""
        kind = self.kind(name)
        if kind == "link":
            raise UnsafeFolderError(
                f"{self.path / name} is a symbolic link; klviz lab writes no file through a link: remove it"
            )
        if kind not in (None, "file"):
            raise UnsafeFolderError(f"{self.path / name} is not a plain file; remove it or choose another folder")

    def read_bytes(self, name: str) -> bytes:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=self.fd)
        with os.fdopen(fd, "rb") as f:
            return f.read()

    def write_bytes(self, name: str, data: bytes) -> None:
        """Write ``name`` atomically: a new file under a fresh name, then renamed over ``name``."""
        tmp = f".{name}.{secrets.token_hex(6)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=self.fd)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=self.fd)
            raise

    def subfolder(self, name: str) -> _Folder:
        """The folder ``name`` inside this one, made if missing; a link there is refused."""
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o755, dir_fd=self.fd)
        if self.kind(name) != "folder":
            raise UnsafeFolderError(f"{self.path / name} is not a folder (a link?); remove it or choose another DIR")
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=self.fd)
        return _Folder(self.path / name, fd)


# -- copying without destroying a learner's work ------------------------------------------------
def _fingerprint(data: bytes) -> str | None:
    try:
        cells = json.loads(data.decode("utf-8"))["cells"]
        content = [
            (c["cell_type"], "".join(c["source"]) if isinstance(c["source"], list) else c["source"]) for c in cells
        ]
    except (ValueError, KeyError, TypeError):
        return None
    return hashlib.sha256(json.dumps(content, ensure_ascii=False).encode()).hexdigest()


def lesson_fingerprint(path: Path) -> str | None:
    """SHA-256 of a notebook's cell types and sources (``None`` if it is not a readable notebook).

    Outputs, execution counts, ids and metadata do not count: a lesson that was only run keeps
    its fingerprint.
    """
    try:
        return _fingerprint(Path(path).read_bytes())
    except OSError:
        return None


@dataclass
class SyncReport:
    """What :func:`sync_lessons` did, by file name."""

    dest: Path
    copied: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    overwritten: list[str] = field(default_factory=list)
    backup_dir: Path | None = None
    #: reference pages beside the lessons (the claims page) that were written because missing or out of date
    pages: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = []
        if self.copied:
            out.append(f"copied {len(self.copied)} lesson(s) into {self.dest}")
        if self.updated:
            out.append(
                f"updated {len(self.updated)} unedited lesson(s) to the installed version: " + ", ".join(self.updated)
            )
        if self.overwritten:
            out.append(f"overwrote {', '.join(self.overwritten)}; your previous copies are in {self.backup_dir}")
        for name in self.kept:
            out.append(
                f"kept your edited {name} (it differs from the shipped version; "
                "run `klviz lab --force` to replace it, after a backup)"
            )
        if not out:
            out.append(f"{len(self.unchanged)} lesson(s) in {self.dest} are up to date")
        if self.pages:
            out.append(f"wrote {', '.join(self.pages)} (the claims the lessons link to) into {self.dest}")
        return out


def sync_lessons(
    dest: str | os.PathLike[str],
    *,
    source: str | os.PathLike[str] | None = None,
    force: bool = False,
    ask: Callable[[str], bool] | None = None,
) -> SyncReport:
    """Copy the shipped lessons into ``dest`` without losing a learner's edits (see the module doc).

    ``ask(name)`` is called for each edited copy when given (a terminal); it returns True to
    overwrite. Without it an edited copy is kept, unless ``force``.

    ``dest`` must be a folder this user controls (:func:`check_own_folder`; a missing one is made),
    and nothing is written through a link in it: a lesson, the manifest or ``backups`` that is a
    link raises :class:`UnsafeFolderError` before anything is written.
    """
    src_dir = Path(source) if source is not None else shipped_notebooks_dir()
    given = Path(dest).expanduser()
    if not given.exists() and not given.is_symlink():
        given.mkdir(parents=True)
    folder_path = check_own_folder(given)
    report = SyncReport(folder_path)
    if folder_path == src_dir.resolve():  # working directly in the shipped folder: nothing to copy
        report.unchanged = [p.name for p in lesson_paths(src_dir)]
        return report
    lessons = lesson_paths(src_dir)
    claims = src_dir / CLAIMS_PAGE
    folder = _Folder.open(folder_path)
    try:
        for name in [MANIFEST, CLAIMS_PAGE] + [p.name for p in lessons]:
            folder.refuse_link(name)  # all refusals before the first write
        if folder.kind(BACKUPS) not in (None, "folder"):
            raise UnsafeFolderError(f"{folder_path / BACKUPS} is not a folder (a link?); remove it")
        try:
            manifest = json.loads(folder.read_bytes(MANIFEST))
            if not isinstance(manifest, dict):
                manifest = {}
        except (OSError, ValueError):
            manifest = {}
        backups: _Folder | None = None

        def backup(name: str) -> None:
            nonlocal backups
            if backups is None:
                stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
                parent = folder.subfolder(BACKUPS)
                try:
                    backups = parent.subfolder(stamp)
                finally:
                    parent.close()
                report.backup_dir = folder_path / BACKUPS / stamp
            backups.write_bytes(name, folder.read_bytes(name))

        for src in lessons:
            data = src.read_bytes()
            shipped = _fingerprint(data)
            if folder.kind(src.name) is None:
                folder.write_bytes(src.name, data)
                report.copied.append(src.name)
            else:
                current = _fingerprint(folder.read_bytes(src.name))
                if current is not None and current == shipped:
                    report.unchanged.append(src.name)
                elif current is not None and current == manifest.get(src.name):
                    folder.write_bytes(src.name, data)
                    report.updated.append(src.name)
                elif force or (ask is not None and ask(src.name)):
                    backup(src.name)
                    folder.write_bytes(src.name, data)
                    report.overwritten.append(src.name)
                else:
                    report.kept.append(src.name)
                    continue  # the manifest keeps the hash of what klviz last copied there
            manifest[src.name] = shipped
        if claims.is_file():  # the page the lessons' claim links open: copied, or brought up to date
            data = claims.read_bytes()
            if folder.kind(CLAIMS_PAGE) is None or folder.read_bytes(CLAIMS_PAGE) != data:
                folder.write_bytes(CLAIMS_PAGE, data)
                report.pages.append(CLAIMS_PAGE)
        folder.write_bytes(MANIFEST, (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode())
        if backups is not None:
            backups.close()
    finally:
        folder.close()
    return report


def _ask_on_terminal(name: str) -> bool:
    answer = input(
        f"{name} differs from the shipped version (you edited or ran it). "
        "Overwrite it? Your copy is saved under backups/ first. [y/N] "
    )
    return answer.strip().lower() in ("y", "yes")


# -- JupyterLab ----------------------------------------------------------------------------------
def start_lab(
    folder: Path,
    *,
    port: int | None = None,
    first: str | None = None,
    strip_on_save: bool = False,
    lang: str = "en",
) -> Server:
    """JupyterLab in ``folder`` on 127.0.0.1 with a random token, locked against a user's own
    configuration and against imports from ``folder`` (see :mod:`klviz.servers`); with
    ``strip_on_save`` a saved notebook keeps no outputs (for the repository's own lessons). Its kernels
    speak edition ``lang`` (``KLVIZ_LANG``, :func:`klviz.servers.edition_env`)."""
    env = {k: v for k, v in edition_env(lang).items() if k != "KLVIZ_STATIC"}
    return start_lab_server(folder, first=first, port=port, env=env, strip_on_save=strip_on_save)


def main(argv: list[str] | None = None) -> int:
    """``klviz lab [DIR] [--lang en|zh] [--force] [--no-browser] [--port N] [--copy-only]``."""
    parser = argparse.ArgumentParser(
        prog="klviz lab",
        description="Copy the klviz lessons into DIR (never overwriting your edited copies without asking) "
        "and open JupyterLab there, on 127.0.0.1 with a token.",
    )
    parser.add_argument(
        "dir",
        nargs="?",
        default=None,
        help=f"working folder (default ./{DEFAULT_DIR}, ./{DEFAULT_DIR}-zh for --lang zh)",
    )
    parser.add_argument(
        "--lang", default="en", help="the edition: en (default) or zh, the Simplified Chinese lessons (简体中文版)"
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="overwrite lessons you edited with the shipped version (your copies go to DIR/backups/)",
    )
    parser.add_argument("--no-browser", action="store_true", help="do not open a browser; just print the URL")
    parser.add_argument("--port", type=int, default=None, help="port for JupyterLab (default: a free one)")
    parser.add_argument(
        "--copy-only", action="store_true", help="copy the lessons and exit without starting JupyterLab"
    )
    parser.add_argument(
        "--in-place",
        action="store_true",
        help="serve DIR as it is, copying nothing, and save notebooks without their outputs "
        "(what `make lab` does with the repository's notebooks/: git status stays clean)",
    )
    args = parser.parse_args(argv)
    if args.port is not None and not 0 < args.port < 65536:
        parser.error(f"--port must be between 1 and 65535, got {args.port}")
    from .i18n import build_edition, edition

    try:
        lang = edition(args.lang)
    except ValueError as err:
        parser.error(f"--lang: {err}")
    if lang != "en" and args.in_place:
        parser.error("--in-place serves the English sources; the other editions are built: leave out --in-place")
    if args.dir is None:
        args.dir = DEFAULT_DIR if lang == "en" else f"{DEFAULT_DIR}-{lang}"

    try:
        if args.in_place:
            folder = check_own_folder(args.dir)
        else:
            ask = _ask_on_terminal if (sys.stdin is not None and sys.stdin.isatty() and not args.force) else None
            with tempfile.TemporaryDirectory(prefix="klviz-edition-") as built:
                # another edition: its lessons are built from the English ones and the catalogues, then
                # copied like the English ones (the same rules: a learner's edited copy is never lost)
                source = None
                if lang != "en":
                    build_edition(lang, built)
                    source = built
                report = sync_lessons(args.dir, source=source, force=args.force, ask=ask)
    except FileNotFoundError as err:
        print(f"klviz lab: {f'{err.filename}: no such folder' if err.filename else err}", file=sys.stderr)
        return 2
    except (ValueError, OSError) as err:
        print(f"klviz lab: {err}", file=sys.stderr)
        return 2
    if not args.in_place:
        for line in report.lines():
            print(f"klviz lab: {line}", flush=True)
        if args.copy_only:
            return 0
        folder = report.dest
    lessons = lesson_paths(folder)
    first = lessons[0].name if lessons else None
    try:
        server = start_lab(folder, port=args.port, first=first, strip_on_save=args.in_place, lang=lang)
    except RuntimeError as err:
        print(f"klviz lab: JupyterLab did not start: {err}", file=sys.stderr)
        return 1
    if not args.no_browser:
        webbrowser.open(server.url)
    return run_until_interrupted(
        server,
        [
            f"klviz lab: JupyterLab is running in {folder}",
            f"klviz lab: open {server.url}",
            "klviz lab: press Ctrl+C to stop it.",
        ],
    )


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
