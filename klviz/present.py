"""Presenter mode: serve one lesson as a clean app with Voila (prose and live panels, no code cells).

    python -m klviz.present 02            # or: make present LESSON=02
    python -m klviz.present notebooks/02_three_estimators.ipynb --port 8866 --no-browser

Voila renders the lesson in a fresh kernel and shows its Markdown and outputs; code cells are
hidden. The collapsed solution cells of the exercises are left out (``--with-solutions`` keeps
them), so a class sees the exercises, not their answers. Voila runs as an extension of a Jupyter
server started by :mod:`klviz.servers`: on 127.0.0.1 only, with a random token that a user's Jupyter
configuration cannot switch off, the server's Host check against DNS rebinding, no tracebacks
shown to viewers, and a private working folder (token file included) that is removed when the
server stops or fails to start. Needs Voila: ``pip install "klviz[present]"``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import webbrowser
from pathlib import Path

import nbformat

from .labcmd import resolve_lesson
from .notebook_format import CHECK_TAG
from .servers import LOCKED_SERVER_SETTINGS, Server, private_folder, run_until_interrupted, start_server

__all__ = ["presenter_notebook", "presenter_config", "start_presenter", "main"]


def _is_check(cell: nbformat.NotebookNode) -> bool:
    """A lesson's regression checks (tag ``klviz-check``): asserts on its numbers, nothing a class sees."""
    return CHECK_TAG in cell.get("metadata", {}).get("tags", [])


def _is_solution(cell: nbformat.NotebookNode) -> bool:
    return bool(cell.get("metadata", {}).get("jupyter", {}).get("source_hidden"))


def _is_skeleton(cell: nbformat.NotebookNode) -> bool:
    """An exercise cell: code for the learner to complete (a ``...`` to replace), checked by ``klviz.check``."""
    return "klviz.check." in cell.source


def _code_block(source: str, heading: str) -> nbformat.NotebookNode:
    """``source`` shown as code on the slide (Voila hides code cells), without its check lines."""
    kept = [
        line
        for line in source.splitlines()
        if "klviz.check" not in line and not line.lstrip().startswith(("assert check", "# Solution"))
    ]
    body = "\n".join(kept).strip("\n")
    return nbformat.v4.new_markdown_cell(f"{heading}\n\n```python\n{body}\n```")


def presenter_notebook(path: str | os.PathLike[str], *, with_solutions: bool = False) -> nbformat.NotebookNode:
    """The lesson as Voila should show it to a class: prose, figures and panels, outputs cleared.

    Exercises appear as their statement and the code to complete (a code block: Voila shows no
    code cells), not as a check's "not attempted yet"; their collapsed solutions are left out, or
    shown as code after the exercise with ``with_solutions``. Nothing of an exercise is run. Cells
    tagged ``klviz-check`` (the lesson's regression asserts) are always left out.
    """
    nb = nbformat.read(path, as_version=4)
    cells = []
    for cell in nb.cells:
        if cell.cell_type == "code" and _is_check(cell):
            continue  # left out, solutions or not: the checks are for CI, not for a class
        if cell.cell_type == "code" and _is_solution(cell):
            if with_solutions:
                cells.append(_code_block(cell.source, "**Solution**"))
            continue
        if cell.cell_type == "code" and _is_skeleton(cell):
            cells.append(
                _code_block(
                    cell.source, "**Your turn:** complete the function and check it in the lesson (`klviz lab`)."
                )
            )
            continue
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
        cells.append(cell)
    nb.cells = cells
    return nb


def presenter_config(root: Path, *, theme: str = "light") -> dict:
    """The Jupyter server settings of presenter mode (address, port and token are added by
    :func:`klviz.servers.start_server`): Voila serving ``root``, sources stripped, no tracebacks."""
    return {
        "ServerApp": {"root_dir": str(root), "jpserver_extensions": {"voila": True}, **LOCKED_SERVER_SETTINGS},
        "VoilaConfiguration": {"strip_sources": True, "show_tracebacks": False, "theme": theme},
    }


def start_presenter(
    lesson: Path, *, port: int | None = None, with_solutions: bool = False, theme: str = "light"
) -> Server:
    """Start Voila on ``lesson``; returns the running :class:`~klviz.servers.Server` (its URL opens
    the lesson, token included; ``stop()`` ends it and removes its private folder)."""
    try:
        import voila  # noqa: F401
    except ImportError:
        raise RuntimeError('presenter mode needs Voila: pip install "klviz[present]" (or: pip install voila)') from None
    lesson = Path(lesson).resolve()
    folder = private_folder("klviz-present-")
    try:
        root = folder / "lesson"  # what Voila serves; the config and the log stay outside it
        root.mkdir()
        nbformat.write(presenter_notebook(lesson, with_solutions=with_solutions), root / lesson.name)
        # Siblings (data files a lesson may open by a relative path) stay reachable from the copy;
        # a link is only ever made to a name that does not exist yet, so nothing is written through one.
        for sibling in lesson.parent.iterdir():
            target = root / sibling.name
            if not sibling.name.startswith(".") and not target.exists():
                try:
                    target.symlink_to(sibling)
                except OSError:
                    pass
        env = dict(os.environ, KLVIZ_PRESENTER="1", KLVIZ_THEME=theme)  # quiet setup, figures for the page
        env.pop("KLVIZ_STATIC", None)  # live panels, interactive figures
        env.pop("MPLBACKEND", None)
        return start_server(
            ["jupyter_server"],
            presenter_config(root, theme=theme),
            ready_path="/api/status",
            probe_path="/api/contents",
            url_path=f"/voila/render/{lesson.name}",
            port=port,
            folder=folder,
            env=env,
            timeout=90,
        )
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise


def main(argv: list[str] | None = None) -> int:
    """``python -m klviz.present LESSON [--port N] [--no-browser] [--with-solutions] [--theme dark]``."""
    parser = argparse.ArgumentParser(
        prog="klviz present",
        description="Serve one lesson's prose and live panels as a clean app (Voila, no code cells) on 127.0.0.1.",
    )
    parser.add_argument("lesson", help="lesson number (02), name prefix (02_three) or path to a notebook")
    parser.add_argument("--port", type=int, default=None, help="port (default: a free one)")
    parser.add_argument("--no-browser", action="store_true", help="only print the URL")
    parser.add_argument("--with-solutions", action="store_true", help="also run and show the exercise solutions")
    parser.add_argument("--theme", choices=("light", "dark"), default="light")
    parser.add_argument("--notebooks", default=None, help="folder of lessons (default: the klviz lessons)")
    args = parser.parse_args(argv)
    if args.port is not None and not 0 < args.port < 65536:
        parser.error(f"--port must be between 1 and 65535, got {args.port}")
    try:
        lesson = resolve_lesson(args.lesson, args.notebooks)
        server = start_presenter(lesson, port=args.port, with_solutions=args.with_solutions, theme=args.theme)
    except (ValueError, FileNotFoundError, RuntimeError) as err:
        print(f"klviz present: {err}", file=sys.stderr)
        return 2
    if not args.no_browser:
        webbrowser.open(server.url)
    return run_until_interrupted(
        server,
        [
            f"klviz present: {lesson.stem} is served at",
            f"klviz present: {server.url}",
            "klviz present: press Ctrl+C to stop.",
        ],
    )


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
