"""Every lesson's own figures read on a light and on a dark page (text and lines at 4.5:1 or more).

Each lesson runs top to bottom in a fresh kernel with ``KLVIZ_THEME`` set, as presenter mode runs it;
a last cell, added here, checks every figure the lesson made (pyplot keeps them: the lessons close
none) and every panel's current figure with :func:`klviz.plotting.contrast_problems`. The HTML the
lesson printed (tables, check results) is checked on the page of that theme. The panels at all their
settings are checked in ``test_theme_contrast.py``.

Each lesson runs twice more here, so this is ``make test-themes`` (CI runs it), not part of ``make test``;
``make test`` checks every panel in both themes, every colour of the palette on both pages, and that no
lesson or figure writes a colour of its own (``test_theme_contrast.py``).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import nbformat
import pytest

from klviz import palette
from klviz.labcmd import lesson_paths

ROOT = Path(__file__).resolve().parents[2]
LESSONS = lesson_paths(ROOT / "notebooks")

_CHECK = """
import gc, json
import matplotlib.pyplot as plt
from klviz.plotting import contrast_problems
from klviz.widgets.base import Panel
_found = {}
for _num in plt.get_fignums():
    _fig = plt.figure(_num)
    _titles = "; ".join(ax.get_title() for ax in _fig.axes if ax.get_title())[:80]
    _problems = contrast_problems(_fig)
    if _problems:
        _found[f"figure {_num} ({_titles})"] = _problems
for _panel in [o for o in gc.get_objects() if isinstance(o, Panel)]:
    _problems = contrast_problems(_panel.fig)
    if _problems:
        _found[f"panel {type(_panel).__name__}"] = _problems
print("KLVIZ-CONTRAST " + json.dumps({"figures": len(plt.get_fignums()), "problems": _found}))
"""


def _run(path: Path, theme: str) -> nbformat.NotebookNode:
    from nbclient import NotebookClient
    from traitlets.config import Config

    nb = nbformat.read(path, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(_CHECK))
    saved = {k: os.environ.get(k) for k in ("KLVIZ_THEME", "KLVIZ_STATIC", "MPLBACKEND")}
    os.environ["KLVIZ_THEME"] = theme
    os.environ.pop("KLVIZ_STATIC", None)
    os.environ.pop("MPLBACKEND", None)
    try:
        with tempfile.TemporaryDirectory(prefix="klviz-kernel-") as sockets:
            ipc = Config({"KernelManager": {"transport": "ipc", "ip": str(Path(sockets) / "kernel")}})
            NotebookClient(
                nb, config=ipc, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
            ).execute()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return nb


@pytest.mark.themes
@pytest.mark.parametrize("theme", palette.THEMES)
@pytest.mark.parametrize("lesson", LESSONS, ids=lambda p: p.name.split("_")[0])
def test_every_lesson_figure_reads_in_both_themes(lesson: Path, theme: str):
    nb = _run(lesson, theme)
    report = None
    html_problems = []
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            text = output.get("text", "")
            if output.get("output_type") == "stream" and "KLVIZ-CONTRAST " in text:
                report = json.loads(text.split("KLVIZ-CONTRAST ", 1)[1])
            shown = output.get("data", {}).get("text/html")
            if shown:
                html_problems += palette.html_contrast_problems("".join(shown), theme)
    assert report is not None, "the check cell printed nothing"
    assert report["figures"] > 0 or not any("new_figure" in c.source for c in nb.cells if c.cell_type == "code")
    problems = [f"{where}: {p}" for where, found in report["problems"].items() for p in found]
    assert not problems and not html_problems, f"{lesson.name} on a {theme} page:\n" + "\n".join(
        sorted(set(problems + html_problems))
    )
