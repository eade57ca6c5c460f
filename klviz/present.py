"""Presenter mode: serve one lesson as a clean app with Voila (prose and live panels, no code cells).

    python -m klviz.present 02            # or: make present LESSON=02
    python -m klviz.present notebooks/02_three_estimators.ipynb --port 8866 --no-browser

Voila runs the lesson in a fresh kernel and shows its Markdown and outputs; code cells are hidden.
The collapsed solution cells of the exercises are left out (``--with-solutions`` keeps them), so a
class sees the exercises, not their answers. The server listens on 127.0.0.1 only and requires a
random token, which is printed in the URL; the token travels in a config file written to a private
temporary folder, never on the command line. Needs Voila: ``pip install "klviz[present]"``.
"""
from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import webbrowser
from pathlib import Path

import nbformat

from .labcmd import _free_port, resolve_lesson, run_until_interrupted, wait_for_http

__all__ = ["presenter_notebook", "voila_command", "start_presenter", "main"]


def _is_solution(cell: nbformat.NotebookNode) -> bool:
    return bool(cell.get("metadata", {}).get("jupyter", {}).get("source_hidden"))


def presenter_notebook(path: str | os.PathLike[str], *, with_solutions: bool = False) -> nbformat.NotebookNode:
    """The lesson as Voila should run it: outputs cleared and, unless ``with_solutions``, the
    collapsed solution cells removed."""
    nb = nbformat.read(path, as_version=4)
    if not with_solutions:
        nb.cells = [c for c in nb.cells if not (c.cell_type == "code" and _is_solution(c))]
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    return nb


def voila_command(notebook: Path, *, theme: str = "light") -> list[str]:
    """The Voila command line (address, port and token come from ``voila.json`` in its cwd)."""
    return [sys.executable, "-m", "voila", notebook.name, f"--theme={theme}"]


def _voila_config(port: int, token: str) -> dict:
    return {
        "Voila": {"ip": "127.0.0.1", "port": port, "port_retries": 0, "token": token, "open_browser": False},
        "VoilaConfiguration": {"strip_sources": True, "show_tracebacks": True},
    }


def start_presenter(lesson: Path, *, port: int | None = None, with_solutions: bool = False,
                    theme: str = "light", workdir: Path | None = None) -> tuple[subprocess.Popen, str, Path]:
    """Start Voila on ``lesson``; returns the process, the URL with its token and the private
    working folder (delete it after the process ends)."""
    try:
        import voila  # noqa: F401
    except ImportError:
        raise RuntimeError('presenter mode needs Voila: pip install "klviz[present]" (or: pip install voila)') from None
    lesson = Path(lesson).resolve()
    work = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="klviz-present-"))
    work.chmod(0o700)
    # Siblings (data files a lesson may open by a relative path) stay reachable from the copy.
    for sibling in lesson.parent.iterdir():
        if sibling.name != lesson.name and not sibling.name.startswith("."):
            try:
                (work / sibling.name).symlink_to(sibling)
            except OSError:
                pass
    nbformat.write(presenter_notebook(lesson, with_solutions=with_solutions), work / lesson.name)
    port = port or _free_port()
    token = secrets.token_urlsafe(24)
    config = work / "voila.json"
    config.write_text(json.dumps(_voila_config(port, token), indent=1))
    config.chmod(0o600)
    env = dict(os.environ)
    env.pop("KLVIZ_STATIC", None)  # live panels, interactive figures
    env.pop("MPLBACKEND", None)
    proc = subprocess.Popen(voila_command(work / lesson.name, theme=theme), cwd=work, env=env,
                            start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        # /voila/static needs no kernel: polling it does not execute the lesson.
        wait_for_http(f"{base}/voila/static/voila.js?token={token}", proc, timeout=90)
    except BaseException:
        proc.terminate()
        proc.wait()
        raise
    return proc, f"{base}/?token={token}", work


def main(argv: list[str] | None = None) -> int:
    """``python -m klviz.present LESSON [--port N] [--no-browser] [--with-solutions] [--theme dark]``."""
    parser = argparse.ArgumentParser(
        prog="klviz present",
        description="Serve one lesson's prose and live panels as a clean app (Voila, no code cells) on 127.0.0.1.")
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
        proc, url, work = start_presenter(lesson, port=args.port, with_solutions=args.with_solutions,
                                          theme=args.theme)
    except (ValueError, FileNotFoundError, RuntimeError) as err:
        print(f"klviz present: {err}", file=sys.stderr)
        return 2
    try:
        print(f"klviz present: {lesson.stem} is served at\nklviz present: {url}\n"
              "klviz present: press Ctrl+C to stop.", flush=True)
        if not args.no_browser:
            webbrowser.open(url)
        return run_until_interrupted(proc)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
