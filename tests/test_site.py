"""The static site builder on two tiny notebooks (fast), and the panels' precomputed sliders."""

from __future__ import annotations

import json
import os
import re

import matplotlib

matplotlib.use("agg")

import nbformat
import pytest

from klviz import fonts, site
from klviz.widgets import static


def _notebook(cells) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells = cells
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


# A panel small enough for a test: one slider (the site sweeps it, as the class attribute says)
# and a toggle (at the lesson's value), a one-line figure, a readout that names the setting.
TINY_PANEL = """
import ipywidgets as widgets
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from klviz.widgets.base import Panel

class TinyPanel(Panel):
    title = "tiny panel"
    static_controls = {"slope": 4, "sign": 2}

    def make_controls(self):
        return {"slope": widgets.FloatSlider(value=1.0, min=0.0, max=3.0, step=0.5, description="slope"),
                "sign": widgets.ToggleButtons(options=[("up", 1), ("down", -1)], value=1, description="sign"),
                "width": widgets.IntSlider(value=2, min=1, max=5, description="width")}

    def make_figure(self):
        fig = Figure(figsize=(3, 2), dpi=60)
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        ax.set_ylim(-3.5, 3.5)
        (self.line,) = ax.plot([0, 1], [0, 1])
        return fig

    def compute(self, slope, sign, width):
        return {"y": sign * slope}

    def draw(self, data):
        self.line.set_data([0, 1], [0, data["y"]])
        self.readout.value = f"<span class='tiny'>end height {data['y']:.1f}</span>"

tiny = TinyPanel(device="cpu")
tiny
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    M, C = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell
    src = tmp_path_factory.mktemp("nbs")
    solution = C("answer = 42\nprint('solution ran')")
    solution.metadata["jupyter"] = {"source_hidden": True}
    first = _notebook(
        [
            M(
                "# 00 · First lesson\n\nWhat you will learn: $k_3 = (r-1) - \\log r$.\n\n"
                "Go on to [the second](01_second.ipynb#Part-two) or [elsewhere](https://example.org/x.ipynb)."
            ),
            C("import os\nprint('static', os.environ.get('KLVIZ_STATIC'))"),
            C(
                "import matplotlib.pyplot as plt\n%matplotlib inline\n"
                "plt.plot([0, 1], [1, 0]); plt.title('a line'); plt.show()"
            ),
            C(TINY_PANEL),
            C(
                "# the panel is back at the lesson's setting after the site swept it\n"
                "assert tiny.values() == {'slope': 1.0, 'sign': 1, 'width': 2}, tiny.values()\n"
                "assert (tiny.last['y'] ==\n        1.0)"
            ),
            M("## Exercises"),
            solution,
            M(
                "Hostile prose: <script>alert('md')</script><img src=x onerror=\"alert('img')\"> "
                "[a link](javascript:alert('link')) <a href=\"data:text/html,<script>alert(1)</script>\">data</a>"
            ),
            C(
                "from IPython.display import HTML, display\n"
                "display(HTML(\"<b onclick='alert(1)'>out</b><script>alert('out')</script>"
                "<img src='data:image/png;base64,iVBORw0KGgo=' onerror='alert(2)'>\"))\n"
                "display({'application/vnd.klviz.static-panel+json': {'title': '<script>alert(3)</script>', "
                "'axes': [{'name': 'a', 'description': 'a', 'labels': ['x'], 'kind': 'slider', 'index': 0}], "
                "'others': [], 'start': 0, 'frames': [{'src': 'javascript:alert(4)', "
                "'readout': '<img src=x onerror=alert(5)>spoofed'}]}, 'text/html': '<p>spoofed panel</p>'}, raw=True)"
            ),
        ]
    )
    second = _notebook(
        [
            M(
                "# 01 · Second lesson: `code` in the title\n\n**What you will learn**\n\n"
                "- one thing;\n  - a nested detail;\n- another thing.\n\n**Time:** 1 minute.\n\n"
                "Back to [the first](00_first.ipynb).\n\n## Part two"
            ),
            C("print(1 + 1)"),
        ]
    )
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
    assert [p.title for p in pages] == ["00 · First lesson", "01 · Second lesson: `code` in the title"]
    index = (out / "index.html").read_text()
    assert re.findall(r'class="klviz-lesson" href="([^"]+)"', index) == ["00_first.html", "01_second.html"]
    assert "_static/mathjax/MathJax.js" in index or "cdnjs" in index
    # cards: inline code in a title, the "What you will learn" list with its nested item, as lists
    assert "Second lesson: <code>code</code> in the title</a>" in index and "`code`" not in index
    card = index.split('href="01_second.html"', 1)[1].split("</li>\n", 1)[0]
    assert re.search(r"<ul>\s*<li>one thing;\s*<ul>\s*<li>a nested detail;</li>", index), card
    assert "ol.lessons > li" in index and "ol.lessons li {" not in index  # cards are boxes, their items not
    assert "1 minute" not in index  # the card is the list, not the rest of the cell
    # the footer says how to install without a package index
    assert "pip install .</code>" in index and "pip wheel --no-deps .</code>" in index
    assert "<code>pip install klviz</code>" not in index
    assert 'webFont: "STIX-Web"' in index


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
    assert 'webFont: "STIX-Web"' in page  # the fonts jupyter-server-mathjax ships, not MathJax's TeX fonts
    assert "precomputed" in page and "klviz lab" in page and "make lab" in page
    second = (out / "01_second.html").read_text()
    assert 'href="00_first.html"' in second and 'class="klviz-prev" href="00_first.html"' in second
    assert "klviz-next" not in second


def test_panel_slider_is_precomputed_with_files(built):
    out, _ = built
    page = (out / "00_first.html").read_text()
    assert page.count('class="klviz-live"') == 2  # the panel, and a notebook's own imitation (sanitised below)
    assert "VBox(" not in page
    data = json.loads(re.search(r"<script[^>]*class=\"klviz-live-data\"[^>]*>(.*?)</script>", page, re.S).group(1))
    assert data["axes"][0]["name"] == "slope"
    assert [a["name"] for a in data["axes"]] == ["slope", "sign"]
    assert [a["labels"] for a in data["axes"]] == [["0", "1", "2", "3"], ["up", "down"]]
    assert len(data["frames"]) == 8
    # the numbers on a slider, the named options (up, down) in a select
    panel = page.split('class="klviz-live"', 2)[1]
    assert len(re.findall(r'class="klviz-live-control klviz-live-slider"', panel)) == 1
    select = re.search(
        r'<select class="klviz-live-control klviz-live-select" data-control="sign"[^>]*>(.*?)</select>', page
    )
    assert select and re.findall(r">(\w+)</option>", select.group(1)) == ["up", "down"], page[-3000:]
    # the page opens on the lesson's setting: slope 1 (index 1), up (index 0) -> frame 2
    assert 'data-frame="2"' in page and "end height 1.0" in data["frames"][2]["readout"]
    assert [f["readout"].split("end height ")[1][:4] for f in data["frames"]] == [
        "0.0<",
        "-0.0",
        "1.0<",
        "-1.0",
        "2.0<",
        "-2.0",
        "3.0<",
        "-3.0",
    ]
    # frames are files beside the pages (one per distinct image), none embedded in the page
    srcs = {f["src"] for f in data["frames"]}
    assert all(s.startswith("_static/frames/") and (out / s).is_file() for s in srcs), srcs
    assert len(srcs) >= 7  # slope 0 up and down are the same picture
    assert "data:image/png;base64" not in page.split('class="klviz-live"', 1)[1].split("</div></div>", 1)[0]
    assert "width = 2" in page  # the control that is not swept is named at its value
    # bounded size: a handful of small PNGs, a page of the usual size
    frames = sum(p.stat().st_size for p in (out / "_static" / "frames").iterdir())
    assert frames < 8 * 30_000 and len(page) < 1_500_000
    assert "<script src=" not in page.split("</head>", 1)[1]  # the slider needs no external script


def test_assert_cells_are_collapsed(built):
    out, _ = built
    page = (out / "00_first.html").read_text()
    visible = re.sub(r"<details.*?</details>", "", page, flags=re.S)
    keyword = '<span class="k">assert</span>'  # how the highlighted source shows the statement
    assert keyword not in visible and "the panel is back" not in visible
    checks = re.search(
        r'<details class="klviz-checks"><summary>Checks: 2 asserts[^<]*</summary>(.*?)</details>', page, re.S
    )
    assert checks and checks.group(1).count(keyword) == 2 and "the panel is back" in checks.group(1)
    assert '<details class="klviz-checks" open' not in page
    assert '<details class="klviz-checks">' not in (out / "01_second.html").read_text()


def test_assert_only():
    assert site.assert_only("# a check\nassert x == 1, 'x'\n\nassert (y >\n        2)") == 2
    assert site.assert_only("x = 1\nassert x") == 0
    assert site.assert_only("%timeit assert x") == 0
    assert site.assert_only("# only a comment") == 0


def test_control_positions():
    import ipywidgets as widgets

    slider = widgets.FloatSlider(value=0.35, min=0.0, max=1.0, step=0.05)
    values, labels = static.control_positions(slider, 5)
    assert values == [0.0, 0.25, 0.35, 0.5, 0.75, 1.0] and labels[2] == "0.35"  # the lesson's value added
    log = widgets.FloatLogSlider(value=2.5, min=-1, max=1, step=0.01)
    assert static.control_positions(log, 3)[0] == [0.1, 1.0, 2.5, 10.0]
    choice = widgets.Dropdown(options=[("a", 1), ("b", 2), ("c", 3), ("d", 4), ("e", 5)], value=2)
    assert static.control_positions(choice, 2) == ([1, 2, 5], ["a", "b", "e"])
    assert static.control_positions(choice, [5, 4]) == ([2, 4, 5], ["b", "d", "e"])
    ints = widgets.IntSlider(value=4, min=0, max=10)
    assert static.control_positions(ints, 11)[0] == list(range(11))


def test_static_controls_table_names_real_controls():
    from klviz.widgets import PANELS

    assert set(static.STATIC_CONTROLS) <= set(PANELS)
    for name, spec in static.STATIC_CONTROLS.items():
        count = 1
        for positions in spec.values():
            count *= (positions if isinstance(positions, int) else len(positions)) + 1
        assert spec and count <= static.MAX_FRAMES * 2, name


def test_rewrite_links_only_touches_relative_notebooks():
    html = (
        '<a href="02_x.ipynb">a</a><a href="sub/03_y.ipynb#S-1">b</a><a href="http://h/z.ipynb">c</a>'
        '<a href="#top">d</a><a href="/abs.ipynb">e</a>'
    )
    assert site.rewrite_links(html) == (
        '<a href="02_x.html">a</a><a href="sub/03_y.html#S-1">b</a><a href="http://h/z.ipynb">c</a>'
        '<a href="#top">d</a><a href="/abs.ipynb">e</a>'
    )


def test_bad_inputs_name_the_argument(tmp_path):
    with pytest.raises(ValueError, match="notebooks"):
        site.build_site([], tmp_path)
    with pytest.raises(ValueError, match="notebooks"):
        site.build_site([tmp_path / "missing.ipynb"], tmp_path)


def test_failing_lesson_stops_the_build_with_its_name(tmp_path):
    nbformat.write(
        _notebook([nbformat.v4.new_code_cell("raise RuntimeError('boom in lesson')")]), tmp_path / "09_bad.ipynb"
    )
    with pytest.raises(RuntimeError, match="09_bad.ipynb failed(.|\n)*boom in lesson"):
        site.build_site([tmp_path / "09_bad.ipynb"], tmp_path / "out", timeout=60, log=lambda *_: None)


def test_keep_going_writes_the_other_lessons_and_raises_the_failures_at_the_end(tmp_path):
    bad, good = tmp_path / "08_bad.ipynb", tmp_path / "09_good.ipynb"
    nbformat.write(_notebook([nbformat.v4.new_code_cell("raise RuntimeError('boom in lesson')")]), bad)
    nbformat.write(_notebook([nbformat.v4.new_markdown_cell("# 09 · Good"), nbformat.v4.new_code_cell("1 + 1")]), good)
    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match="08_bad.ipynb failed(.|\n)*boom in lesson"):
        site.build_site([bad, good], out, timeout=60, keep_going=True, log=lambda *_: None)
    assert (out / "09_good.html").is_file() and not (out / "08_bad.html").exists()
    assert (out / "index.html").is_file()


def test_panel_shows_precomputed_slider_in_static_mode(monkeypatch):
    import IPython.display

    from klviz.widgets.lesson03 import BregmanPanel

    shown = []
    monkeypatch.setattr(IPython.display, "display", lambda *objs, **kw: shown.extend(objs))
    monkeypatch.setitem(static.STATIC_CONTROLS, "BregmanPanel", {"r": 3, "f": ["-log t", "k2"]})  # f: a select
    panel = BregmanPanel(device="cpu")
    before, readout = panel.values(), panel.readout.value
    monkeypatch.delenv("KLVIZ_STATIC", raising=False)
    panel._ipython_display_()
    assert shown == [panel.widget]
    shown.clear()
    monkeypatch.setenv("KLVIZ_STATIC", "1")
    panel._ipython_display_()
    assert shown[0] is panel.widget and len(shown) == 2
    assert set(shown[1]) == {static.STATIC_PANEL_MIME, "text/html"}  # the HTML, and the same as data for the site
    data, page = shown[1][static.STATIC_PANEL_MIME], shown[1]["text/html"]
    assert 'class="klviz-live"' in page
    assert page.count("data:image/png;base64,") == 1 + 4 * 2  # the first frame shown, 4 r positions x 2 f
    assert len(data["frames"]) == 8 and [a["kind"] for a in data["axes"]] == ["slider", "select"]
    assert readout in page and "klviz lab" in page
    assert panel.values() == before and panel.readout.value == readout  # back at the lesson's setting


def test_panel_falls_back_to_one_snapshot(monkeypatch):
    import IPython.display

    from klviz.widgets.lesson03 import BregmanPanel

    shown = []
    monkeypatch.setattr(IPython.display, "display", lambda *objs, **kw: shown.extend(objs))
    monkeypatch.setitem(static.STATIC_CONTROLS, "BregmanPanel", {"no_such_control": 3})
    monkeypatch.setenv("KLVIZ_STATIC", "1")
    panel = BregmanPanel(device="cpu")
    panel._ipython_display_()
    assert isinstance(shown[1], IPython.display.HTML) and "Snapshot at" in shown[1].data
    assert "no_such_control" in shown[1].data
    assert isinstance(shown[2], IPython.display.Image) and shown[2].data[:8] == b"\x89PNG\r\n\x1a\n"


def _tags(page_html: str) -> list[tuple[str, dict[str, str]]]:
    """Every element of the page's body with its attributes, as a browser's parser sees them."""
    from html.parser import HTMLParser

    found: list[tuple[str, dict[str, str]]] = []

    class Tags(HTMLParser):
        def handle_starttag(self, tag, attrs):
            found.append((tag, {k: v or "" for k, v in attrs}))

    Tags().feed(page_html.split("</head>", 1)[1])
    return found


def test_nothing_from_a_notebook_runs_on_the_page(built):
    """Markdown and outputs are sanitised: no script, event handler or javascript:/data: link survives;
    an output imitating a panel is shown through the builder's own rendering, its data escaped."""
    out, _ = built
    page = (out / "00_first.html").read_text()
    tags = _tags(page)
    handlers = [(t, a) for t, a in tags if any(k.startswith("on") for k in a)]
    assert not handlers, handlers
    links = [a.get("href", "") + a.get("src", "") for _t, a in tags]
    assert not [x for x in links if x.strip().lower().startswith("javascript:")], links
    data_links = [a for t, a in tags if t == "a" and a.get("href", "").startswith("data:")]
    assert [a.get("class") for a in data_links] == ["klviz-download-lesson"], data_links  # the builder's own only
    body = page.split("</head>", 1)[1]
    scripts = re.findall(r"<script(?: [^>]*)?>(.*?)</script>", body, re.S)
    assert all("alert(" not in script for script in scripts), [s for s in scripts if "alert(" in s]
    assert "Hostile prose:" in body and ">out</b>" in body and "<p>spoofed panel</p>" not in body
    spoof = body.rsplit('class="klviz-live"', 1)[1].split("</script></div>", 1)[0]  # the imitation, as rendered
    assert 'src=""' in spoof and "&lt;script&gt;alert(3)" in spoof  # its title escaped, its frame dropped
    assert "spoofed" in spoof and "onerror" not in spoof.split("klviz-live-data", 1)[0]


def test_index_escapes_a_heading_and_sanitises_summaries():
    page = site.LessonPage(
        source=None,  # type: ignore[arg-type]
        page="09_x.html",
        title="09 · Evil <script>alert('t')</script> `code`",
        summary="**What you will learn**\n\n- <img src=x onerror=alert(1)> one\n- [two](javascript:alert(2))",
    )
    index = site.render_index([page])
    body = index.split("</head>", 1)[1]
    assert "<script>alert" not in body and "onerror" not in body and "javascript:" not in body
    assert "<code>code</code>" in body and "one" in body and "two" in body
    assert "alert(" not in site.clean_html("<p onmouseover=alert(1)>x</p><script>alert(2)</script>")
    assert site.clean_html("<style>.a{color:red}</style><b style='color:red;position:fixed'>x</b>") == (
        '<style>.a{color:red}</style><b style="color:red">x</b>'
    )
    assert "<style>" not in site.clean_html("<style>@import url(http://evil/x.css)</style>")
    assert "background" not in site.clean_html("<b style='background:url(http://evil/x.png)'>x</b>")


def test_downloads_each_lesson_the_zip_and_the_wheel(tmp_path):
    import zipfile

    lesson = tmp_path / "00_only.ipynb"
    nb = _notebook([nbformat.v4.new_markdown_cell("# 00 · Only"), nbformat.v4.new_code_cell("1 + 1")])
    nb.cells[1].outputs = [nbformat.v4.new_output("execute_result", {"text/plain": "2"}, execution_count=1)]
    nbformat.write(nb, lesson)
    (tmp_path / "claims.md").write_text("# Claims\n")
    wheel = tmp_path / "klviz-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"PK wheel")
    out = tmp_path / "site"
    found = site.write_downloads([lesson], out, wheel=wheel, log=lambda *_: None)
    assert found == {"wheel": f"downloads/{wheel.name}", "zip": "downloads/klviz-lessons-0.1.0.zip"}
    with zipfile.ZipFile(out / found["zip"]) as z:
        names = set(z.namelist())
        readme = z.read("klviz-lessons/README.txt").decode()
        stored = json.loads(z.read("klviz-lessons/00_only.ipynb"))
    assert stored["cells"][1]["outputs"] == []  # the lesson in its stored form
    assert names == {
        "klviz-lessons/README.txt",
        "klviz-lessons/00_only.ipynb",
        "klviz-lessons/claims.md",
        f"klviz-lessons/{wheel.name}",
    }
    assert (
        f"pip install {wheel.name}" in readme and "klviz lab ." in readme and "download.pytorch.org/whl/cpu" in readme
    )
    index = site.render_index([site.LessonPage(lesson, "00_only.html", "00 · Only", "")], downloads=found)
    for href in re.findall(r'href="(downloads/[^"]+)"', index):
        assert (out / href).is_file(), href
    assert 'id="downloads"' in index and "klviz-download-zip" in index and "klviz-download-wheel" in index


def test_the_lesson_page_links_its_download(built):
    out, _ = built
    page = (out / "00_first.html").read_text()
    import base64

    link = re.search(r'<a [^>]*class="klviz-download-lesson"[^>]*>', page).group(0)
    href = re.search(r'href="([^"]+)"', link).group(1)
    assert 'download="00_first.ipynb"' in link and href.startswith("data:application/x-ipynb+json;base64,")
    stored = json.loads(base64.b64decode(href.split(",", 1)[1]))  # the lesson in its stored form
    assert "".join(stored["cells"][0]["source"]).startswith("# 00 · First lesson")
    assert not stored["cells"][1]["outputs"]
    assert 'href="index.html#downloads"' in page


def test_checks_on_a_static_page_say_how_to_run_the_lesson(monkeypatch):
    from klviz.check import not_attempted

    monkeypatch.setenv("KLVIZ_STATIC", "1")
    shown = not_attempted()._repr_html_()
    assert "run the cell again" not in shown and "download the lesson" in shown and "<code>klviz lab</code>" in shown


# -- both editions: English at the root, Chinese in zh/ ------------------------------------------------
@pytest.fixture(scope="module")
def both(tmp_path_factory):
    """Two tiny lessons with Chinese catalogues beside them, built in both editions (four small kernels)."""
    from klviz import i18n

    M, C = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell
    src = tmp_path_factory.mktemp("nbs-both")
    first = _notebook(
        [
            M(
                "# 00 · First lesson: start\n\n**What you will learn**\n\n- one thing.\n\n"
                "See [the second](01_second.ipynb) and [a claim](claims.md#tiny-claim)."
            ),
            C("import os\nprint('lang', os.environ.get('KLVIZ_LANG'))"),
            M("Hostile prose: <script>alert('en')</script>"),
        ]
    )
    second = _notebook([M("# 01 · Second lesson\n\nBack to [the first](00_first.ipynb)."), C("print(1 + 1)")])
    chinese = {
        "00_first": [
            "# 00 · 第一课：开始\n\n**你将学到**\n\n- 一件事。\n\n"
            "见[第二课](01_second.ipynb)和[一条声明](claims.md#tiny-claim)。",
            "中文的恶意内容：<script>alert('zh')</script><img src=https://example.org/x.png onerror=\"alert('img')\">",
        ],
        "01_second": ["# 01 · 第二课\n\n回到[第一课](00_first.ipynb)。"],
    }
    for stem, nb in (("00_first", first), ("01_second", second)):
        nbformat.write(nb, src / f"{stem}.ipynb")
        catalog, _ = i18n.update_catalogue(json.loads((src / f"{stem}.ipynb").read_text()), None, stem)
        for message, text in zip([m for m in catalog if m.id], chinese[stem]):
            message.string = text
        i18n.write_catalogue(catalog, i18n.catalogue_path(stem, "zh", src))
    (src / "claims.md").write_text(
        "# Claims\n\n## tiny-claim\n\n> Two plus two is four.\n\n- **Stated in:** [00 First](00_first.ipynb)\n"
    )
    wheel = src / "klviz-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"PK wheel")
    out = tmp_path_factory.mktemp("site-both")
    before = os.environ.get("KLVIZ_LANG")
    pages = site.build_site(
        [src / "00_first.ipynb", src / "01_second.ipynb"], out, timeout=120, wheel=wheel, log=lambda *_: None
    )
    assert os.environ.get("KLVIZ_LANG") == before  # restored after the build
    return out, pages


def _read(path) -> str:
    return path.read_text(encoding="utf-8")


def test_both_editions_are_built_the_chinese_under_zh(both):
    out, pages = both
    assert [(p.lang, p.page) for p in pages] == [
        ("en", "00_first.html"),
        ("en", "01_second.html"),
        ("zh", "00_first.html"),
        ("zh", "01_second.html"),
    ]
    for folder, lang in (("", "en"), ("zh/", "zh-Hans")):
        for name in ("index.html", "00_first.html", "01_second.html", "claims.html"):
            assert re.search(r'<html lang="([^"]*)"', _read(out / f"{folder}{name}")).group(1) == lang, folder + name
    zh = _read(out / "zh" / "00_first.html")
    assert "第一课" in zh and "全部课程" in zh and "预先算好" in zh and "First lesson" not in zh
    assert (
        '<a class="klviz-index" href="index.html">全部课程</a>' in zh
        and 'class="klviz-next" href="01_second.html"' in zh
    )
    prev = [a for t, a, text in _elements(_read(out / "zh" / "01_second.html")) if a.get("class") == "klviz-prev"]
    assert prev and prev[0]["text"].strip() == "← 00 · 第一课"  # the short title ends at the full-width colon
    assert 'href="01_second.html"' in zh and 'href="claims.html#tiny-claim"' in zh  # within the Chinese edition
    # each kernel ran in its edition's language
    assert "lang zh" in zh and "lang None" in _read(out / "00_first.html")
    index = _read(out / "zh" / "index.html")
    assert re.findall(r'class="klviz-lesson" href="([^"]+)"', index) == ["00_first.html", "01_second.html"]
    assert "00 · 第一课：开始</a>" in index and "<li>一件事。</li>" in index and "你将学到" in index
    assert "各条声明以及检验它们的性质测试" in index and "klviz lab --lang zh" in index


def test_every_page_switches_to_the_same_page_in_the_other_language(both):
    out, _ = both
    for name in ("index.html", "00_first.html", "01_second.html", "claims.html"):
        en, zh = _read(out / name), _read(out / "zh" / name)
        for page, target, lang, label in ((en, f"zh/{name}", "zh-Hans", "中文"), (zh, f"../{name}", "en", "English")):
            switches = [a for t, a, _ in _elements(page) if t == "a" and a.get("class") == "klviz-lang-switch"]
            assert switches, name
            assert all(
                (a["href"], a["hreflang"], a["lang"], a["text"]) == (target, lang, lang, label) for a in switches
            ), (name, switches)
            alternate = [a for t, a, _ in _elements(page) if t == "link" and a.get("rel") == "alternate"]
            assert [(a["href"], a["hreflang"]) for a in alternate] == [(target, lang)], (name, alternate)


def _elements(page_html: str) -> list[tuple[str, dict[str, str], str]]:
    """Every element of a page with its attributes (and, for links, ``"text"``: the text inside)."""
    from html.parser import HTMLParser

    found: list[tuple[str, dict[str, str], str]] = []
    open_links: list[dict[str, str]] = []

    class Elements(HTMLParser):
        def handle_starttag(self, tag, attrs):
            attributes = {k: v or "" for k, v in attrs}
            found.append((tag, attributes, ""))
            if tag == "a":
                attributes["text"] = ""
                open_links.append(attributes)

        def handle_data(self, data):
            for link in open_links:
                link["text"] += data

        def handle_endtag(self, tag):
            if tag == "a" and open_links:
                open_links.pop()

    Elements().feed(page_html)
    return found


def _local_links(page_html: str) -> list[str]:
    """Every relative URL of a page (links, images, scripts, and the fonts and frames of its styles and data)."""
    urls = re.findall(r'(?:href|src)="([^"]+)"', page_html) + re.findall(r'url\("([^"]+)"\)', page_html)
    urls += re.findall(r'"src": "([^"]+)"', page_html)
    return [u for u in urls if not re.match(r"[a-z][a-z0-9+.-]*:|#|//", u)]


def test_every_relative_link_of_both_editions_leads_to_a_file(both):
    out, _ = both
    checked = 0
    for page in [*out.glob("*.html"), *(out / "zh").glob("*.html")]:
        for url in _local_links(_read(page)):
            target = (page.parent / url.split("#")[0].split("?")[0]).resolve()
            assert target.is_file(), f"{page.relative_to(out)}: {url}"
            checked += 1
    assert checked > 20
    # the CJK font by @font-face from each edition's own folder (a relative URL), with its licence
    for folder in (out, out / "zh"):
        assert (folder / "_static" / "fonts" / "klviz-cjk-sc.ttf").read_bytes() == fonts.FONT_FILE.read_bytes()
        assert (folder / "_static" / "fonts" / "OFL.txt").is_file()
        for name in ("index.html", "00_first.html", "claims.html"):
            text = _read(folder / name)
            assert 'src: url("_static/fonts/klviz-cjk-sc.ttf") format("truetype")' in text, name
            assert f'"{fonts.FAMILY}"' in text.split("</style>", 1)[0] + text.split("</head>", 1)[0]


def test_the_chinese_pages_are_sanitised_and_offer_the_chinese_notebooks(both):
    import base64
    import zipfile

    out, _ = both
    page = _read(out / "zh" / "00_first.html")
    body = page.split("</head>", 1)[1]
    assert "中文的恶意内容" in body and "alert(" not in body and "onerror" not in body
    link = [a for t, a, _ in _elements(page) if a.get("class") == "klviz-download-lesson"]
    assert len(link) == 1 and link[0]["download"] == "00_first.ipynb"
    stored = json.loads(base64.b64decode(link[0]["href"].split(",", 1)[1]))
    assert "".join(stored["cells"][0]["source"]).startswith("# 00 · 第一课")
    index = _read(out / "zh" / "index.html")
    zipped = re.search(r'class="klviz-download-zip" href="([^"]+)"', index).group(1)
    assert zipped == "downloads/klviz-lessons-zh-0.1.0.zip"
    with zipfile.ZipFile(out / "zh" / zipped) as z:
        names = set(z.namelist())
        readme = z.read("klviz-lessons-zh/README.txt").decode()
        lesson = json.loads(z.read("klviz-lessons-zh/01_second.ipynb"))
    assert "klviz-lessons-zh/klviz-0.1.0-py3-none-any.whl" in names and "klviz-lessons-zh/claims.md" in names
    assert "klviz lab --lang zh ." in readme and "".join(lesson["cells"][0]["source"]).startswith("# 01 · 第二课")
    # one copy of the wheel, at the root's downloads, which the Chinese index links to
    assert 'class="klviz-download-wheel" href="../downloads/klviz-0.1.0-py3-none-any.whl"' in index
    assert not list((out / "zh" / "downloads").glob("*.whl"))


def test_the_chinese_claims_page_is_chinese_but_for_the_tests_outputs(both):
    out, _ = both
    page = _read(out / "zh" / "claims.html")
    assert "测试程序的输出，保留英文" in page and '<div lang="en">' not in page
    # the entry's labels in the edition's words, and the lesson named by its translated title
    assert "出现在：" in page and 'href="00_first.html">00 · 第一课' in page and "Stated in" not in page
    assert '<h2 id="tiny-claim">' in page and 'href="00_first.html"' in page and "全部课程" in page


def test_the_sites_chinese_words_have_glyphs_in_the_shipped_font():
    from klviz import present

    words = [*site.WORDS["zh"].values(), *site._INDEX_WORDS["zh"].values(), *site._DOWNLOADS["zh"].values()]
    words += [*site._CLAIMS_WORDS["zh"].values(), site._CLAIMS_LINK["zh"], *present._WORDS["zh"].values()]
    text = "".join(words)
    assert sum(map(fonts.is_cjk, text)) > 200
    assert fonts.missing_glyphs(text) == []
