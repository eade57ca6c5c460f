"""Every panel reads on a light and on a dark page: text and lines at 4.5:1 or more (WCAG AA).

Each panel is built in both themes (``KLVIZ_THEME``, what presenter mode sets) and checked at its
first setting and at every option of its selections (some colours follow the selection): the
figure from the colours its artists use (:func:`klviz.plotting.contrast_problems`), and the HTML
under it (readout, status line, title) on the page of that theme, where the colours that
:func:`klviz.palette.css` names take that theme's values (:func:`klviz.palette.html_contrast_problems`).
The lessons' own figures are checked by running each lesson in both themes (``tests/themes``, ``make
test-themes``); here, that no lesson or figure writes out a colour the theme cannot change.
"""

from __future__ import annotations

import re
from pathlib import Path

import ipywidgets as widgets
import pytest

import klviz.widgets as W
from klviz import palette
from klviz.check import failed, not_attempted, passed
from klviz.plotting import COLORS, apply_style, contrast_problems, new_figure

THEMES = palette.THEMES
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def theme(request, monkeypatch):
    monkeypatch.setenv("KLVIZ_THEME", request.param)
    apply_style()
    yield request.param
    monkeypatch.delenv("KLVIZ_THEME")
    apply_style()


def _html_of(widget) -> list[str]:
    found = []
    if isinstance(widget, (widgets.HTML, widgets.HTMLMath)):
        found.append(widget.value)
    for child in getattr(widget, "children", ()):
        found.extend(_html_of(child))
    return found


def _problems(panel, which: str, where: str) -> list[str]:
    found = [f"{where}: figure: {p}" for p in contrast_problems(panel.fig)]
    for text in _html_of(panel.widget):
        found.extend(f"{where}: HTML: {p}" for p in palette.html_contrast_problems(text, which))
    return found


def _selections(panel) -> list[tuple[str, list]]:
    """(control, values) for each control that chooses among named options (colours may follow them;
    a selection slider steps through numbers)."""
    return [
        (name, list(w._options_values))
        for name, w in panel.controls.items()
        if hasattr(w, "_options_values") and not isinstance(w, widgets.SelectionSlider)
    ]


@pytest.fixture
def untrained():
    """The training runs a panel caches (the RLHF lab's, lesson 08's live seeds) are forgotten after the
    test: a later test in this process that expects a setting to train in the background still sees it do so."""
    import klviz.rlhf as rlhf

    runs, resumable = dict(rlhf._RUNS), dict(rlhf._RESUMABLE)
    yield
    rlhf._RUNS.clear()
    rlhf._RUNS.update(runs)
    rlhf._RESUMABLE.clear()
    rlhf._RESUMABLE.update(resumable)


@pytest.mark.parametrize("theme", THEMES, indirect=True)
@pytest.mark.parametrize("name", list(W.PANELS))
def test_every_panel_reads_in_both_themes(name, theme, untrained):
    panel = getattr(W, name)()
    assert panel.last_error is None, panel.error.value
    problems = _problems(panel, theme, "as built")
    first = panel.values()
    for control, options in _selections(panel):
        for value in options:
            panel.set(**{control: value})
            assert panel.last_error is None, (control, value, panel.error.value)
            problems += _problems(panel, theme, f"{control}={value!r}")
        panel.set(**{control: first[control]})
    assert not problems, f"{name} on a {theme} page:\n" + "\n".join(sorted(set(problems)))


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


@pytest.mark.parametrize("which", THEMES)
def test_check_results_read_in_both_themes(which):
    for result in (passed("right"), failed("the ratio is inverted: use `log p - log q`"), not_attempted()):
        html = result._repr_html_()
        assert "`" not in html, html  # backticks become code
        assert not palette.html_contrast_problems(html, which), (result, which)


@pytest.mark.parametrize("which", THEMES)
def test_every_named_colour_reads_on_its_page_and_figure(which):
    """The palette itself: each colour that text or a line uses keeps 4.5:1 on the page and on the
    figure of its theme (the backgrounds and rules it also names are not text)."""
    for name in palette.NAMED:
        if name in ("rule", "note-background"):
            continue
        value = palette.colour(name, which)
        # Voila's dark page puts cells on --jp-layout-color1 (#212121) around the #111 of the notebook
        extra = ("#212121",) if which == "dark" else ()
        for background in (palette.PAGE[which]["background"], palette.FIGURE_BACKGROUND[which], *extra):
            ratio = palette.contrast_ratio(value, background)
            assert ratio >= palette.MIN_CONTRAST, f"{name} {value} on {background}: {ratio:.2f}:1"
    note = palette.colour("note-background", which)
    assert palette.contrast_ratio(palette.colour("muted", which), note) >= palette.MIN_CONTRAST


def test_page_css_gives_every_colour_both_values():
    for name, (light, dark) in palette.NAMED.items():
        assert f"--klviz-{name}: {light}" in palette.PAGE_CSS
        assert f"--klviz-{name}: {dark}" in palette.PAGE_CSS
        assert palette.css(name) == f"var(--klviz-{name}, {light})"
    assert 'body[data-jp-theme-light="false"]' in palette.PAGE_CSS  # how JupyterLab, Voila and nbconvert mark dark


def test_the_checkers_find_what_cannot_be_read():
    """The checks can fail: black on the dark figure, pale grey on white, a dark colour on a dark page."""
    import os

    os.environ["KLVIZ_THEME"] = "dark"
    try:
        apply_style()
        fig, ax = new_figure(4, 3)
        ax.plot([0, 1], [0, 1], color="black", label="invisible")
        ax.plot([0, 1], [1, 0], color=COLORS["ink"], label="fine")
        ax.set_title("a title")
        found = contrast_problems(fig)
        assert any("'invisible'" in p for p in found) and not any("'fine'" in p for p in found), found
    finally:
        del os.environ["KLVIZ_THEME"]
        apply_style()
    fig, ax = new_figure(4, 3)
    ax.text(0.5, 0.5, "pale", color="#dddddd")
    assert any("pale" in p or "Text" in p for p in contrast_problems(fig))
    assert palette.html_contrast_problems("<span style='color:#222'>dark</span>", "dark")
    assert not palette.html_contrast_problems(f"<span style='color:{palette.css('ink')}'>ink</span>", "dark")
    assert palette.html_contrast_problems("<span style='color:nonsense'>x</span>", "light")  # unreadable colour
    # a colour map's box with text chosen for it, as the worked-token strip does
    for box in ("#ffffcc", "#800026", "#2166ac", "#f7f7f7"):
        strip = f"<span style='background:{box};color:{palette.text_on(box)}'>tok</span>"
        assert not palette.html_contrast_problems(strip, "dark") and not palette.html_contrast_problems(strip, "light")
