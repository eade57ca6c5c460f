"""The static site opened from disk in headless Chromium with every network request refused.

Builds the site from lesson 00 (the whole site is ``make site``), opens ``index.html`` through
``file://``, follows the link to the lesson, and finds real figures: ``<img>`` elements whose
images decoded to a nonzero size. Then moves the panel's precomputed slider with the keyboard, as a
reader would, and sees the figure (its ``src``) and the readout change with no kernel. No request may
fail and the console stays free of errors: MathJax and its fonts come from the site's ``_static/``
folder. The downloads (a lesson, the zip of all lessons, the wheel) are fetched as a reader would,
and the zip opens. The site has both editions (``klviz site`` builds the Chinese one in ``zh/``): the
language switch leads from lesson 00 in English to lesson 00 in Chinese and back, and the Chinese page
draws its CJK characters with the font the site ships, as distinct shapes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from klviz import fonts

from .test_cjk_glyphs import CHARACTERS, SHAPES, _platform_fonts

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = Path(os.environ.get("KLVIZ_TEST_NOTEBOOKS", ROOT / "notebooks"))

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    lessons = sorted(NOTEBOOKS.glob("00_*.ipynb"))
    assert lessons, f"no lesson 00 in {NOTEBOOKS}"
    out = tmp_path_factory.mktemp("site")
    home = tmp_path_factory.mktemp("site-home")
    env = dict(os.environ, HOME=str(home))
    env.pop("MPLBACKEND", None)
    proc = subprocess.run(
        [sys.executable, "-m", "klviz.site", str(lessons[0]), "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"site build failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return out


def _watch(page) -> tuple[list[str], list[str]]:
    """Refuse every request that leaves the disk; collect those, every request that failed, and every
    error the page logs (console errors and uncaught exceptions) into ``failed``."""
    requested: list[str] = []
    failed: list[str] = []
    page.on("console", lambda m: failed.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: failed.append(f"page error: {e}"))

    def offline(route):
        if route.request.url.startswith("file:"):
            route.continue_()
        else:
            requested.append(route.request.url)
            route.abort()

    page.route("**/*", offline)
    page.on("requestfailed", lambda r: failed.append(f"{r.url} ({r.failure})"))
    return requested, failed


def test_site_opens_from_disk_and_shows_figures(page, site, artifacts):
    requested, failed = _watch(page)
    page.goto((site / "index.html").as_uri())
    links = page.locator("a.klviz-lesson")
    assert links.count() >= 1
    first = links.first
    target = first.get_attribute("href")
    assert target and not target.startswith(("http", "/")) and target.endswith(".html"), target
    first.click()
    page.wait_for_load_state("load")
    assert page.url.endswith("/" + target)

    images = page.locator(".jp-OutputArea-output img")
    images.first.wait_for(state="visible", timeout=20_000)
    sizes = page.evaluate("""() => Array.from(document.querySelectorAll('.jp-OutputArea-output img'))
                                   .map(i => [i.complete, i.naturalWidth, i.naturalHeight])""")
    assert sizes and all(ok and w > 50 and h > 50 for ok, w, h in sizes), sizes
    assert page.locator(".klviz-live").count() >= 1, "no precomputed panel on the page (KLVIZ_STATIC not honoured?)"
    assert "VBox(" not in page.inner_text("body"), "a widget's text fallback leaked into the page"
    assert "precomputed" in page.inner_text("p.klviz-precomputed-note")

    # The navigation back to the index is a relative link that works from disk.
    page.locator("nav.klviz-nav.top a.klviz-index").click()
    page.wait_for_load_state("load")
    assert page.url.endswith("/index.html")
    if (site / "_static" / "mathjax").is_dir():
        assert not requested, f"the site asked the network for {requested}"
    else:  # jupyter-server-mathjax missing: only MathJax may come from its CDN
        assert all("mathjax" in url.lower() for url in requested), requested
    # ERR_ABORTED is a load the next navigation cancelled; anything else (a missing file, a console error) fails
    problems = [f for f in failed if "ERR_ABORTED" not in f]
    assert not problems, f"the site logged errors or lacks files: {problems}"


def test_site_slider_moves_figure_and_readout_from_disk(page, site, artifacts):
    requested, failed = _watch(page)
    page.goto(
        (site / "00_start_here.html").as_uri()
        if (site / "00_start_here.html").exists()
        else next(site.glob("0*.html")).as_uri()
    )
    panel = page.locator(".klviz-live").first
    panel.scroll_into_view_if_needed()
    figure, readout = panel.locator("img.klviz-live-figure"), panel.locator(".klviz-live-readout")
    slider = panel.locator("input.klviz-live-slider").first
    label = panel.locator("output[data-axis='0']")
    src0, text0, label0 = figure.get_attribute("src"), readout.inner_text(), label.inner_text()
    assert src0 and not src0.startswith("data:") and text0.strip()
    slider.focus()
    for key in ("Home", "ArrowRight"):  # to the first position, then one step: never the lesson's own
        page.keyboard.press(key)
        if figure.get_attribute("src") != src0:
            break
    src1, text1, label1 = figure.get_attribute("src"), readout.inner_text(), label.inner_text()
    assert src1 != src0, "the figure did not change with the slider"
    assert text1 != text0, "the readout did not change with the slider"
    assert label1 != label0, "the slider's value label did not change"
    page.wait_for_function("img => img.complete && img.naturalWidth > 50", arg=figure.element_handle())
    # MathJax typeset the page with the fonts it ships (no 404s), with no network at all
    page.wait_for_function(
        "() => document.querySelectorAll('.MathJax, .MathJax_CHTML, .MathJax_SVG').length > 0", timeout=20_000
    )
    # MathJax has nothing left to typeset, and every font the page asked for has loaded or failed
    page.wait_for_function(
        "() => MathJax.Hub.queue.pending === 0 && !MathJax.Hub.queue.running && document.fonts.status === 'loaded'",
        timeout=20_000,
    )
    assert not requested, f"the page asked the network for {requested}"
    problems = [f for f in failed if "ERR_ABORTED" not in f]
    assert not problems, f"the page logged errors or lacks files: {problems}"
    fonts = page.evaluate("() => Array.from(document.fonts).filter(f => f.status == 'loaded').map(f => f.family)")
    if (site / "_static" / "mathjax").is_dir():
        assert any("STIX" in f for f in fonts), f"MathJax's fonts did not load: {fonts}"
    panel.screenshot(path=str(artifacts / "site_slider_moved.png"))
    page.screenshot(path=str(artifacts / "site_lesson00.png"), full_page=True)


def test_site_downloads_work_offline(page, site, tmp_path):
    """The index offers the zip of all lessons and the wheel, a lesson page its notebook; each link
    downloads from disk, and the zip opens with the lessons and how to run them."""
    requested, failed = _watch(page)
    page.goto((site / "index.html").as_uri())
    with page.expect_download() as zipped:
        page.locator("a.klviz-download-zip").click()
    path = tmp_path / "lessons.zip"
    zipped.value.save_as(path)
    with zipfile.ZipFile(path) as z:
        names = z.namelist()
        assert z.testzip() is None
        readme = z.read("klviz-lessons/README.txt").decode()
    assert any(n.endswith("00_start_here.ipynb") for n in names) and "klviz lab" in readme, names
    if page.locator("a.klviz-download-wheel").count():  # built from a checkout: the wheel is offered too
        assert any(n.endswith(".whl") for n in names), names
        with page.expect_download() as wheel:
            page.locator("a.klviz-download-wheel").click()
        assert wheel.value.suggested_filename.endswith("-py3-none-any.whl")
    page.goto(next(site.glob("00_*.html")).as_uri())
    with page.expect_download() as lesson:
        page.locator("a.klviz-download-lesson").click()
    assert lesson.value.suggested_filename.startswith("00_") and lesson.value.suggested_filename.endswith(".ipynb")
    saved = tmp_path / "lesson.ipynb"
    lesson.value.save_as(saved)
    assert json.loads(saved.read_text())["cells"], "the downloaded lesson is not a notebook"
    assert not requested, requested
    assert not [f for f in failed if "ERR_ABORTED" not in f], failed


def test_a_named_control_is_a_select_on_the_site(page, tmp_path):
    """A panel's categorical control (lesson 07's KL placement, a flow, a mode) is a select on the
    page, not a range slider: choosing an option shows its frame and readout."""
    from klviz.widgets.static import render_static_panel

    pixel = (  # one pixel
        "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
    )
    frames = [{"src": pixel, "readout": f"<b>{name}</b>"} for name in ("k1 in reward", "k3 in loss", "none")]
    panel = render_static_panel(
        {
            "title": "placements",
            "axes": [
                {
                    "name": "placement",
                    "description": "KL placement",
                    "kind": "select",
                    "index": 0,
                    "labels": ["k1 in reward", "k3 in loss", "none"],
                }
            ],
            "others": [],
            "frames": frames,
            "start": 0,
        }
    )
    (tmp_path / "panel.html").write_text(f"<!DOCTYPE html><html><body>{panel}</body></html>")
    requested, failed = _watch(page)
    page.goto((tmp_path / "panel.html").as_uri())
    select = page.locator("select.klviz-live-select")
    assert select.count() == 1 and page.locator("input.klviz-live-slider").count() == 0
    assert page.locator(".klviz-live-readout").inner_text() == "k1 in reward"
    select.select_option(label="k3 in loss")
    assert page.locator(".klviz-live-readout").inner_text() == "k3 in loss"
    assert page.locator(".klviz-live").get_attribute("data-frame") == "1"
    assert not requested and not failed, (requested, failed)


def test_the_language_switch_leads_to_the_same_lesson_and_chinese_renders(page, site, artifacts):
    """Lesson 00 in English -> its switch -> lesson 00 in Chinese (``lang="zh-Hans"``, CJK characters drawn
    with the font the site ships from its own folder, distinct characters as distinct shapes) -> back."""
    requested, failed = _watch(page)
    english = next(site.glob("00_*.html"))
    page.goto(english.as_uri(), wait_until="domcontentloaded")
    assert page.evaluate("document.documentElement.lang") == "en"
    switch = page.locator("nav.klviz-nav.top a.klviz-lang-switch")
    assert switch.inner_text() == "中文"
    switch.click()
    page.wait_for_url((site / "zh" / english.name).as_uri(), wait_until="domcontentloaded")
    assert page.evaluate("document.documentElement.lang") == "zh-Hans"
    note = "p.klviz-precomputed-note"  # the site's own Chinese words: there whatever the catalogues hold
    text = page.locator(note).inner_text()
    page.wait_for_function("() => document.fonts.status === 'loaded'")
    used = _platform_fonts(page, note)
    assert used.get(fonts.FAMILY, 0) >= sum(map(fonts.is_cjk, text)) > 20, used
    stack = page.evaluate(f"getComputedStyle(document.querySelector('{note}')).fontFamily")
    shapes = page.evaluate(SHAPES, [CHARACTERS, f"40px {stack}"])
    assert len(set(shapes)) == len(CHARACTERS), "distinct characters rendered with the same shape"
    assert all(s.count("1") > 40 for s in shapes), "a character drew (almost) no ink"
    page.screenshot(path=str(artifacts / "site_lesson00_zh.png"))
    back = page.locator("nav.klviz-nav.top a.klviz-lang-switch")
    assert back.inner_text() == "English"
    back.click()
    page.wait_for_url(english.as_uri(), wait_until="domcontentloaded")
    assert page.evaluate("document.documentElement.lang") == "en"
    assert not requested, requested
    assert not [f for f in failed if "ERR_ABORTED" not in f], failed
