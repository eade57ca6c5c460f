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

JupyterLab then starts in DIR on 127.0.0.1 with a random token, locked as :mod:`klviz.servers`
describes, and the URL, token included, is printed once the server answers.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import webbrowser
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from .servers import Server, run_until_interrupted, start_lab_server

__all__ = [
    "shipped_notebooks_dir",
    "lesson_paths",
    "resolve_lesson",
    "sync_lessons",
    "SyncReport",
    "lesson_fingerprint",
    "start_lab",
    "main",
]

DEFAULT_DIR = "klviz-lessons"
MANIFEST = ".klviz-lessons.json"
BACKUPS = "backups"


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


# -- copying without destroying a learner's work ------------------------------------------------
def lesson_fingerprint(path: Path) -> str | None:
    """SHA-256 of a notebook's cell types and sources (``None`` if it is not a readable notebook).

    Outputs, execution counts, ids and metadata do not count: a lesson that was only run keeps
    its fingerprint.
    """
    try:
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        content = [
            (c["cell_type"], "".join(c["source"]) if isinstance(c["source"], list) else c["source"]) for c in cells
        ]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return hashlib.sha256(json.dumps(content, ensure_ascii=False).encode()).hexdigest()


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
    """
    src_dir = Path(source) if source is not None else shipped_notebooks_dir()
    dest = Path(dest).expanduser()
    if dest.exists() and not dest.is_dir():
        raise ValueError(f"dest {str(dest)!r} exists and is not a folder")
    dest.mkdir(parents=True, exist_ok=True)
    dest = dest.resolve()
    report = SyncReport(dest)
    if dest == src_dir.resolve():  # working directly in the shipped folder: nothing to copy
        report.unchanged = [p.name for p in lesson_paths(src_dir)]
        return report
    manifest_path = dest / MANIFEST
    try:
        manifest = json.loads(manifest_path.read_text())
        if not isinstance(manifest, dict):
            manifest = {}
    except (OSError, ValueError):
        manifest = {}

    def backup(target: Path) -> None:
        if report.backup_dir is None:
            report.backup_dir = dest / BACKUPS / datetime.now().strftime("%Y%m%d-%H%M%S")
            report.backup_dir.mkdir(parents=True, exist_ok=True)
        shutil.copy2(target, report.backup_dir / target.name)

    for src in lesson_paths(src_dir):
        target = dest / src.name
        shipped = lesson_fingerprint(src)
        if not target.exists():
            shutil.copyfile(src, target)
            report.copied.append(src.name)
        else:
            current = lesson_fingerprint(target)
            if current is not None and current == shipped:
                report.unchanged.append(src.name)
            elif current is not None and current == manifest.get(src.name):
                shutil.copyfile(src, target)
                report.updated.append(src.name)
            elif force or (ask is not None and ask(src.name)):
                backup(target)
                shutil.copyfile(src, target)
                report.overwritten.append(src.name)
            else:
                report.kept.append(src.name)
                continue  # the manifest keeps the hash of what klviz last copied there
        manifest[src.name] = shipped
    manifest_path.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return report


def _ask_on_terminal(name: str) -> bool:
    answer = input(
        f"{name} differs from the shipped version (you edited or ran it). "
        "Overwrite it? Your copy is saved under backups/ first. [y/N] "
    )
    return answer.strip().lower() in ("y", "yes")


# -- JupyterLab ----------------------------------------------------------------------------------
def start_lab(
    folder: Path, *, port: int | None = None, first: str | None = None, strip_on_save: bool = False
) -> Server:
    """JupyterLab in ``folder`` on 127.0.0.1 with a random token, locked against a user's own
    configuration and against imports from ``folder`` (see :mod:`klviz.servers`); with
    ``strip_on_save`` a saved notebook keeps no outputs (for the repository's own lessons)."""
    env = {k: v for k, v in os.environ.items() if k != "KLVIZ_STATIC"}
    return start_lab_server(folder, first=first, port=port, env=env, strip_on_save=strip_on_save)


def main(argv: list[str] | None = None) -> int:
    """``klviz lab [DIR] [--force] [--no-browser] [--port N] [--copy-only]``."""
    parser = argparse.ArgumentParser(
        prog="klviz lab",
        description="Copy the klviz lessons into DIR (never overwriting your edited copies without asking) "
        "and open JupyterLab there, on 127.0.0.1 with a token.",
    )
    parser.add_argument("dir", nargs="?", default=DEFAULT_DIR, help=f"working folder (default ./{DEFAULT_DIR})")
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

    if args.in_place:
        folder = Path(args.dir).resolve()
        if not folder.is_dir():
            print(f"klviz lab: {folder} is not a folder", file=sys.stderr)
            return 2
    else:
        ask = _ask_on_terminal if (sys.stdin is not None and sys.stdin.isatty() and not args.force) else None
        try:
            report = sync_lessons(args.dir, force=args.force, ask=ask)
        except (ValueError, FileNotFoundError) as err:
            print(f"klviz lab: {err}", file=sys.stderr)
            return 2
        for line in report.lines():
            print(f"klviz lab: {line}", flush=True)
        if args.copy_only:
            return 0
        folder = report.dest
    lessons = lesson_paths(folder)
    first = lessons[0].name if lessons else None
    try:
        server = start_lab(folder, port=args.port, first=first, strip_on_save=args.in_place)
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
