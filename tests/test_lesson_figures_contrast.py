"""Every lesson's own figures read on a light and on a dark page (text and lines at 4.5:1 or more).

Each lesson runs top to bottom in a fresh kernel with ``KLVIZ_THEME`` set, as presenter mode runs it;
a last cell, added here, checks every figure the lesson made (pyplot keeps them: the lessons close
none) and every panel's current figure with :func:`klviz.plotting.contrast_problems`. The HTML the
lesson printed (tables, check results) is checked on the page of that theme. The panels at all their
settings are checked in ``test_theme_contrast.py``.

``make test`` runs the dark page (each lesson once more, as nbval runs it on the light one); ``make
test-themes`` (CI runs it) runs both. On the light page the same code draws with the palette's light
values, which ``test_theme_contrast.py`` checks, and the lessons name no colour of their own (below).
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path

import nbformat
import pytest

from klviz import palette
from klviz.labcmd import lesson_paths

ROOT = Path(__file__).resolve().parents[1]
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


#: the themes run here: the dark page, or both with KLVIZ_ALL_THEMES=1 (make test-themes)
RUN_THEMES = palette.THEMES if os.environ.get("KLVIZ_ALL_THEMES", "") not in ("", "0") else ("dark",)

#: a colour written out in a lesson or a figure of the package, instead of a palette name (COLORS[...],
#: CHOICE_COLORS[...]): it would be the same on both pages
_LITERAL_COLOUR = re.compile(
    r"""(?:color|colors|mfc|mec|ecolor|facecolor|edgecolor|markerfacecolor|markeredgecolor)\s*=\s*["'](?!none["'])"""
    r"""[^"']+["']|["']#[0-9a-fA-F]{3,8}["']|["'](?:black|white|k|gray|grey)["']"""
)


def _literal_colours(source: str) -> list[tuple[int, str]]:
    """(line number, line) of each code line (comments left out) that writes a colour out."""
    import io
    import tokenize

    lines = source.splitlines()
    code = list(lines)
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            row, col = tok.start
            code[row - 1] = code[row - 1][:col]
    return [(n, lines[n - 1]) for n, text in enumerate(code, 1) if _LITERAL_COLOUR.search(text)]


def test_lessons_and_figures_name_no_colour_of_their_own():
    sources = [*(ROOT / "notebooks" / "scripts").glob("*.py"), *(ROOT / "klviz" / "widgets").glob("*.py")]
    sources.append(ROOT / "klviz" / "diagnose" / "plot.py")
    found = []
    for path in sources:
        found += [f"{path.relative_to(ROOT)}:{n}: {line.strip()}" for n, line in _literal_colours(path.read_text())]
    assert not found, "colours that ignore the page's theme (use klviz.plotting.COLORS):\n" + "\n".join(found)
    planted = (
        'ax.plot(x, y, color="black")  # a comment\nax.axhline(0, color="#222222")\nok = COLORS["ink"]  # "#fff"\n'
    )
    assert [n for n, _ in _literal_colours(planted)] == [1, 2]  # the check finds what it should


@pytest.mark.slow
@pytest.mark.parametrize("theme", RUN_THEMES)
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
