"""The static site builder on two tiny notebooks (fast), and the panels' static snapshot."""
from __future__ import annotations

import os
import re

import matplotlib

matplotlib.use("agg")

import nbformat
import pytest

from klviz import site


def _notebook(cells) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells = cells
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    M, C = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell
    src = tmp_path_factory.mktemp("nbs")
    solution = C("answer = 42\nprint('solution ran')")
    solution.metadata["jupyter"] = {"source_hidden": True}
    first = _notebook([
        M("# 00 · First lesson\n\nWhat you will learn: $k_3 = (r-1) - \\log r$.\n\n"
          "Go on to [the second](01_second.ipynb#Part-two) or [elsewhere](https://example.org/x.ipynb)."),
        C("import os\nprint('static', os.environ.get('KLVIZ_STATIC'))"),
        C("import matplotlib.pyplot as plt\n%matplotlib inline\nplt.plot([0, 1], [1, 0]); plt.title('a line'); plt.show()"),
        M("## Exercises"),
        solution,
    ])
    second = _notebook([M("# 01 · Second lesson\n\nBack to [the first](00_first.ipynb).\n\n## Part two"),
                        C("print(1 + 1)")])
    nbformat.write(first, src / "00_first.ipynb")
    nbformat.write(second, src / "01_second.ipynb")
    out = tmp_path_factory.mktemp("site")
    before = os.environ.get("KLVIZ_STATIC")
    pages = site.build_site([src / "00_first.ipynb", src / "01_second.ipynb"], out, timeout=120, log=lambda *_: None)
    assert os.environ.get("KLVIZ_STATIC") == before  # restored after the build
    return out, pages


def test_pages_and_index(built):
    out, pages = built
    assert [p.page for p in pages] == ["00_first.html", "01_second.html"]
    assert [p.title for p in pages] == ["00 · First lesson", "01 · Second lesson"]
    index = (out / "index.html").read_text()
    assert re.findall(r'class="klviz-lesson" href="([^"]+)"', index) == ["00_first.html", "01_second.html"]
    assert "_static/mathjax/MathJax.js" in index or "cdnjs" in index


def test_lesson_page_is_static_and_linked(built):
    out, _ = built
    page = (out / "00_first.html").read_text()
    assert "static 1" in page  # the kernel ran with KLVIZ_STATIC=1
    assert re.search(r'<img[^>]+src="data:image/png;base64,', page), "no PNG figure in the page"
    assert 'href="01_second.html#Part-two"' in page  # lesson links point at pages, fragment kept
    assert 'href="https://example.org/x.ipynb"' in page  # outside links untouched
    assert not re.search(r'href="(?!https?:)[^"]*\.ipynb', page)
    assert 'class="klviz-next" href="01_second.html"' in page and 'class="klviz-index" href="index.html"' in page
    assert re.search(r'<details class="klviz-solution">.*solution ran', page, re.S), "solution not collapsed"
    assert "require.min.js" not in page
    second = (out / "01_second.html").read_text()
    assert 'href="00_first.html"' in second and 'class="klviz-prev" href="00_first.html"' in second
    assert "klviz-next" not in second


def test_rewrite_links_only_touches_relative_notebooks():
    html = ('<a href="02_x.ipynb">a</a><a href="sub/03_y.ipynb#S-1">b</a><a href="http://h/z.ipynb">c</a>'
            '<a href="#top">d</a><a href="/abs.ipynb">e</a>')
    assert site.rewrite_links(html) == (
        '<a href="02_x.html">a</a><a href="sub/03_y.html#S-1">b</a><a href="http://h/z.ipynb">c</a>'
        '<a href="#top">d</a><a href="/abs.ipynb">e</a>')


def test_bad_inputs_name_the_argument(tmp_path):
    with pytest.raises(ValueError, match="notebooks"):
        site.build_site([], tmp_path)
    with pytest.raises(ValueError, match="notebooks"):
        site.build_site([tmp_path / "missing.ipynb"], tmp_path)


def test_failing_lesson_stops_the_build_with_its_name(tmp_path):
    nbformat.write(_notebook([nbformat.v4.new_code_cell("raise RuntimeError('boom in lesson')")]), tmp_path / "09_bad.ipynb")
    with pytest.raises(RuntimeError, match="09_bad.ipynb failed(.|\n)*boom in lesson"):
        site.build_site([tmp_path / "09_bad.ipynb"], tmp_path / "out", timeout=60, log=lambda *_: None)


def test_panel_leaves_a_png_snapshot_in_static_mode(monkeypatch):
    import IPython.display

    from klviz.widgets.start_here import StartHerePanel

    shown = []
    monkeypatch.setattr(IPython.display, "display", lambda *objs, **kw: shown.extend(objs))
    panel = StartHerePanel()
    monkeypatch.delenv("KLVIZ_STATIC", raising=False)
    panel._ipython_display_()
    assert shown == [panel.widget]
    shown.clear()
    monkeypatch.setenv("KLVIZ_STATIC", "1")
    panel._ipython_display_()
    assert shown[0] is panel.widget
    assert isinstance(shown[1], IPython.display.HTML) and "Snapshot at" in shown[1].data
    assert panel.readout.value in shown[1].data
    assert isinstance(shown[2], IPython.display.Image) and shown[2].data[:8] == b"\x89PNG\r\n\x1a\n"
