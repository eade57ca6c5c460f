"""Presenter mode: serve one lesson as a clean app with Voila (prose and live panels, no code cells).

    python -m klviz.present 02            # or: make present LESSON=02
    python -m klviz.present --lang zh 02  # the Chinese lesson (make present LESSON=02 LANG=zh)
    python -m klviz.present notebooks/02_three_estimators.ipynb --port 8866 --no-browser

Voila renders the lesson in a fresh kernel and shows its Markdown and outputs; code cells are
hidden. The collapsed solution cells of the exercises are left out (``--with-solutions`` keeps
them), so a class sees the exercises, not their answers. Voila runs as an extension of a Jupyter
server started by :mod:`klviz.servers`: on 127.0.0.1 only, with a random token that a user's Jupyter
configuration cannot switch off, the server's Host check against DNS rebinding, no tracebacks
shown to viewers, and a private working folder (token file included) that is removed when the
server stops or fails to start. Needs Voila: ``pip install "klviz[present]"``.

``--lang zh`` presents the Chinese lesson: the English notebook with its markdown cells translated
from the lesson's catalogue (:mod:`klviz.i18n`), its kernel started with ``KLVIZ_LANG=zh`` (the
library's own words in Chinese), and the page served with ``lang="zh"``. Every presented page, in
either language, draws Chinese with the CJK font klviz ships (:mod:`klviz.fonts`), served from the
presenter's template: a projector's machine needs no CJK font of its own.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import webbrowser
from pathlib import Path
from typing import Any

import nbformat

from .fonts import FONT_FILE, LICENSE_FILE, font_path, jupyterlab_css
from .labcmd import resolve_lesson
from .notebook_format import CHECK_TAG
from .servers import (
    LOCKED_SERVER_SETTINGS,
    Server,
    edition_env,
    private_folder,
    run_until_interrupted,
    start_server,
)

__all__ = [
    "presenter_notebook",
    "edition_notebook",
    "presenter_cells",
    "presenter_config",
    "write_presenter_template",
    "voila_prelaunch_hook",
    "configure_voila",
    "start_presenter",
    "main",
]

#: The labextensions a presented lesson needs: the widgets (Voila's own managers, for ipywidgets 8 and 7)
#: and ipympl for its static figures. Voila loads every installed one otherwise, and some (jupytext's)
#: fail in Voila with an error in the console.
PRESENTER_EXTENSIONS = [
    "@voila-dashboards/widgets-manager8",
    "@voila-dashboards/widgets-manager7",
    "@jupyter-widgets/jupyterlab-manager",
    "jupyter-matplotlib",
]

#: Voila's ``lab`` template, less the two style sheets it asks a CDN for (Font Awesome; no template or
#: widget of the lessons uses its icons): a classroom is often offline, and each miss is a console error.
_TEMPLATE_CONF = '{"base_template": "lab", "mimetypes": {"text/html": true}}\n'
_FONT_AWESOME = (
    '<link rel="stylesheet" href="https://cdn.jsdelivr.net/npm/@fortawesome/fontawesome-free@^5/css/{}" '
    'type="text/css" />'
)
PRESENTER_TEMPLATE = "klviz"
#: Where Voila serves the template's ``static/`` folder (the CJK font), below the server's base URL.
_FONT_URL = "{{ resources.base_url }}voila/templates/" + PRESENTER_TEMPLATE + "/static/" + FONT_FILE.name
_TEMPLATE_INDEX = (
    "{%- extends 'lab/index.html.j2' -%}\n"
    "{%- block notebook_css -%}\n"
    "{{ super()"
    + "".join(f" | replace('{_FONT_AWESOME.format(sheet)}', '')" for sheet in ("all.min.css", "v4-shims.min.css"))
    + " }}\n"
    "{%- endblock notebook_css -%}\n"
    "{%- block extra_css -%}\n<style>\n" + jupyterlab_css(_FONT_URL) + "</style>\n{%- endblock extra_css -%}\n"
)

#: The words presenter mode adds to a lesson, per edition.
_WORDS = {
    "en": {
        "solution": "**Solution**",
        "your_turn": "**Your turn:** complete the function and check it in the lesson (`klviz lab`).",
    },
    "zh": {
        "solution": "**参考答案**",
        "your_turn": "**轮到你了**：补全这个函数，然后在课程中检查它（`klviz lab --lang zh`）。",
    },
}


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


def edition_notebook(path: str | os.PathLike[str], lang: str = "en") -> nbformat.NotebookNode:
    """Lesson ``path`` (an English notebook) in edition ``lang``: for ``"zh"``, its markdown cells and the
    words its code cells show translated from the catalogues beside it
    (``locale/zh_CN/LC_MESSAGES/<lesson>.po`` and ``<lesson>.code.po``), as :func:`klviz.i18n.build_edition`
    builds it. FileNotFoundError names a missing catalogue."""
    from .i18n import catalogue_path, edition, translate_lesson

    path = Path(path)
    code = edition(lang)
    nb = nbformat.read(path, as_version=4)
    if code == "en":
        return nb
    po = catalogue_path(path.stem, code, path.parent)
    if not po.is_file():
        raise FileNotFoundError(f"lesson {path.stem} has no {code} translation: {po} is missing")
    translated = nbformat.from_dict(translate_lesson(nb, path.stem, code, path.parent))
    for cell in translated.cells:
        if isinstance(cell.source, list):
            cell.source = "".join(cell.source)
    return translated


def presenter_notebook(
    path: str | os.PathLike[str], *, with_solutions: bool = False, lang: str = "en"
) -> nbformat.NotebookNode:
    """The lesson as Voila should show it to a class, in edition ``lang``: prose, figures and panels,
    outputs cleared.

    Exercises appear as their statement and the code to complete (a code block: Voila shows no
    code cells), not as a check's "not attempted yet"; their collapsed solutions are left out, or
    shown as code after the exercise with ``with_solutions``. Nothing of an exercise is run. Cells
    tagged ``klviz-check`` (the lesson's regression asserts) are always left out.
    """
    return presenter_cells(edition_notebook(path, lang), with_solutions=with_solutions, lang=lang)


def presenter_cells(
    nb: nbformat.NotebookNode, *, with_solutions: bool = False, lang: str = "en"
) -> nbformat.NotebookNode:
    """:func:`presenter_notebook` for a notebook already read (changed in place and returned)."""
    from .i18n import edition

    words = _WORDS[edition(lang)]
    cells = []
    for cell in nb.cells:
        if cell.cell_type == "code" and _is_check(cell):
            continue  # left out, solutions or not: the checks are for CI, not for a class
        if cell.cell_type == "code" and _is_solution(cell):
            if with_solutions:
                cells.append(_code_block(cell.source, words["solution"]))
            continue
        if cell.cell_type == "code" and _is_skeleton(cell):
            cells.append(_code_block(cell.source, words["your_turn"]))
            continue
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
        cells.append(cell)
    nb.cells = cells
    return nb


def presenter_config(root: Path, *, theme: str = "light", lang: str = "en") -> dict:
    """The Jupyter server settings of presenter mode (address, port and token are added by
    :func:`klviz.servers.start_server`): Voila serving ``root``, sources stripped, no tracebacks, with
    nothing from the network: the template of :func:`write_presenter_template`, only the labextensions
    the lessons need, and the MathJax that Voila bundles (``"null"`` for its URL and configuration makes
    Voila's page use it; jupyter-server-mathjax's MathJax 2 would ask for TeX fonts it does not ship).
    The page's ``lang`` attribute is the edition's (``zh`` for the Chinese lessons)."""
    from .i18n import edition

    return {
        "ServerApp": {
            "root_dir": str(root),
            "jpserver_extensions": {"voila": True, "jupyter_server_mathjax": False},
            "tornado_settings": {"mathjax_url": "null", "mathjax_config": "null"},
            **LOCKED_SERVER_SETTINGS,
        },
        "VoilaConfiguration": {
            "strip_sources": True,
            "show_tracebacks": False,
            "theme": theme,
            "template": PRESENTER_TEMPLATE,
            "extension_allowlist": PRESENTER_EXTENSIONS,
        },
        "HTMLExporter": {"language_code": edition(lang)},
    }


def write_presenter_template(data_dir: Path) -> Path:
    """Write presenter mode's Voila template under ``data_dir`` (a Jupyter data folder: give it to the
    server in ``JUPYTER_PATH``); returns the template's folder. Its ``static/`` folder holds the CJK
    font (with its licence), which every presented page loads for its Chinese characters only."""
    folder = Path(data_dir) / "voila" / "templates" / PRESENTER_TEMPLATE
    (folder / "static").mkdir(parents=True, exist_ok=True)
    (folder / "conf.json").write_text(_TEMPLATE_CONF, encoding="utf-8")
    (folder / "index.html.j2").write_text(_TEMPLATE_INDEX, encoding="utf-8")
    shutil.copyfile(font_path(), folder / "static" / FONT_FILE.name)
    if LICENSE_FILE.is_file():
        shutil.copyfile(LICENSE_FILE, folder / "static" / LICENSE_FILE.name)
    return folder


def voila_prelaunch_hook(request: Any, notebook: nbformat.NotebookNode, cwd: str) -> nbformat.NotebookNode:
    """Voila's ``prelaunch_hook`` for presenter mode on a server klviz did not start (Binder).

    The lesson becomes what ``klviz present`` serves (:func:`presenter_cells`), and a first, hidden
    cell gives its kernel what ``klviz present`` puts in the environment: presenter mode (no line about
    the machine) and the page's theme, read from the URL's ``theme`` argument as Voila reads it
    (``...voila/render/02_three_estimators.ipynb?theme=dark``). ``lang=zh`` in the URL presents the
    Chinese lesson: the prose and the words its code shows from the lesson's catalogues beside it in
    ``cwd`` (English where there is none, as gettext shows an untranslated message) and ``KLVIZ_LANG=zh``
    in the kernel.
    """
    from .i18n import catalogue_path, edition, translate_lesson

    def argument(name: str, default: str) -> str:
        try:
            return str(request.get_argument(name, default)).strip().lower()
        except Exception:  # noqa: BLE001 - no request (a test, a script): the default
            return default

    theme = "dark" if argument("theme", "light") in ("dark", "jupyterlab dark") else "light"
    try:
        lang = edition(argument("lang", "en"))
    except ValueError:
        lang = "en"
    environment = {"KLVIZ_PRESENTER": "1", "KLVIZ_THEME": theme}
    if lang != "en":
        environment["KLVIZ_LANG"] = lang
        path = str(getattr(getattr(request, "request", None), "path", "") or "")
        po = catalogue_path(Path(path).stem, lang, cwd) if path.endswith(".ipynb") else None
        if po is not None and po.is_file():
            notebook = nbformat.from_dict(translate_lesson(notebook, Path(path).stem, lang, cwd))
            for cell in notebook.cells:
                if isinstance(cell.source, list):
                    cell.source = "".join(cell.source)
    nb = presenter_cells(notebook, lang=lang)
    settings = ", ".join(f"{key}={value!r}" for key, value in environment.items())
    nb.cells.insert(0, nbformat.v4.new_code_cell(f"import os\nos.environ.update({settings})"))
    return nb


def configure_voila(c: Any, data_dir: str | os.PathLike[str] | None = None) -> None:
    """Make the Voila of a Jupyter server present lessons as ``klviz present`` does: call it from a
    ``jupyter_server_config.py`` (``postBuild`` writes one on Binder). ``c`` is that file's config;
    the template is written to ``data_dir`` (default: the user's Jupyter data folder)."""
    from jupyter_core.paths import jupyter_data_dir

    write_presenter_template(Path(data_dir) if data_dir is not None else Path(jupyter_data_dir()))
    c.VoilaConfiguration.prelaunch_hook = voila_prelaunch_hook
    c.VoilaConfiguration.template = PRESENTER_TEMPLATE
    c.VoilaConfiguration.extension_allowlist = list(PRESENTER_EXTENSIONS)
    c.VoilaConfiguration.strip_sources = True
    c.VoilaConfiguration.show_tracebacks = False


def start_presenter(
    lesson: Path, *, port: int | None = None, with_solutions: bool = False, theme: str = "light", lang: str = "en"
) -> Server:
    """Start Voila on ``lesson`` (an English notebook) in edition ``lang``; returns the running
    :class:`~klviz.servers.Server` (its URL opens the lesson, token included; ``stop()`` ends it and
    removes its private folder). The kernel gets ``KLVIZ_LANG`` (:func:`klviz.servers.edition_env`)."""
    try:
        import voila  # noqa: F401
    except ImportError:
        raise RuntimeError('presenter mode needs Voila: pip install "klviz[present]" (or: pip install voila)') from None
    lesson = Path(lesson).resolve()
    folder = private_folder("klviz-present-")
    try:
        root = folder / "lesson"  # what Voila serves; the config and the log stay outside it
        root.mkdir()
        nbformat.write(presenter_notebook(lesson, with_solutions=with_solutions, lang=lang), root / lesson.name)
        # Siblings (data files a lesson may open by a relative path) stay reachable from the copy;
        # a link is only ever made to a name that does not exist yet, so nothing is written through one.
        for sibling in lesson.parent.iterdir():
            target = root / sibling.name
            if not sibling.name.startswith(".") and not target.exists():
                try:
                    target.symlink_to(sibling)
                except OSError:
                    pass
        data_dir = folder / "jupyter-data"  # the template, found by the server through JUPYTER_PATH
        write_presenter_template(data_dir)
        jupyter_path = os.pathsep.join(p for p in (str(data_dir), os.environ.get("JUPYTER_PATH", "")) if p)
        env = dict(
            edition_env(lang), KLVIZ_PRESENTER="1", KLVIZ_THEME=theme, JUPYTER_PATH=jupyter_path
        )  # quiet, themed
        env.pop("KLVIZ_STATIC", None)  # live panels, interactive figures
        env.pop("MPLBACKEND", None)
        return start_server(
            ["jupyter_server"],
            presenter_config(root, theme=theme, lang=lang),
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
    """``python -m klviz.present LESSON [--lang zh] [--port N] [--no-browser] [--with-solutions] [--theme dark]``."""
    parser = argparse.ArgumentParser(
        prog="klviz present",
        description="Serve one lesson's prose and live panels as a clean app (Voila, no code cells) on 127.0.0.1.",
    )
    parser.add_argument("lesson", help="lesson number (02), name prefix (02_three) or path to a notebook")
    parser.add_argument("--port", type=int, default=None, help="port (default: a free one)")
    parser.add_argument("--no-browser", action="store_true", help="only print the URL")
    parser.add_argument("--with-solutions", action="store_true", help="also run and show the exercise solutions")
    parser.add_argument("--theme", choices=("light", "dark"), default="light")
    parser.add_argument(
        "--lang", default="en", help="the edition: en (default) or zh, the Simplified Chinese lesson (简体中文版)"
    )
    parser.add_argument("--notebooks", default=None, help="folder of lessons (default: the klviz lessons)")
    args = parser.parse_args(argv)
    if args.port is not None and not 0 < args.port < 65536:
        parser.error(f"--port must be between 1 and 65535, got {args.port}")
    from .i18n import edition

    try:
        lang = edition(args.lang)
    except ValueError as err:
        parser.error(f"--lang: {err}")
    try:
        lesson = resolve_lesson(args.lesson, args.notebooks)
        server = start_presenter(
            lesson, port=args.port, with_solutions=args.with_solutions, theme=args.theme, lang=lang
        )
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
