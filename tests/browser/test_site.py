"""The static site opened from disk in headless Chromium with every network request refused.

Builds the site from lesson 00 (the whole site is ``make site``), opens ``index.html`` through
``file://``, follows the link to the lesson, and finds real figures: ``<img>`` elements whose
images decoded to a nonzero size. Then moves the panel's precomputed slider with the keyboard, as a
reader would, and sees the figure (its ``src``) and the readout change with no kernel. No request may
fail: MathJax and its fonts come from the site's ``_static/`` folder.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

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
    """Refuse every request that leaves the disk; collect those and every request that failed."""
    requested: list[str] = []
    failed: list[str] = []

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
    # a missing file fails with ERR_FILE_NOT_FOUND; ERR_ABORTED is a load the next navigation cancelled
    lacking = [f for f in failed if f.startswith("file:") and "ERR_ABORTED" not in f]
    assert not lacking, f"files the site lacks: {lacking}"


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
    page.wait_for_timeout(1000)
    assert not requested, f"the page asked the network for {requested}"
    # MathJax 2 declares a blank fallback font at about:blank on purpose; every other request must work
    missing = [f for f in failed if not f.startswith("about:blank") and "ERR_ABORTED" not in f]
    assert not missing, f"requests failed (missing files?): {missing}"
    fonts = page.evaluate("() => Array.from(document.fonts).filter(f => f.status == 'loaded').map(f => f.family)")
    if (site / "_static" / "mathjax").is_dir():
        assert any("STIX" in f for f in fonts), f"MathJax's fonts did not load: {fonts}"
    panel.screenshot(path=str(artifacts / "site_slider_moved.png"))
    page.screenshot(path=str(artifacts / "site_lesson00.png"), full_page=True)
