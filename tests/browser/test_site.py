"""The static site opened from disk in headless Chromium with every network request refused.

Builds the site from lesson 00 (the whole site is ``make site``), opens ``index.html`` through
``file://``, follows the link to the lesson, and finds real figures: ``<img>`` elements whose
images decoded to a nonzero size, including the PNG snapshot of the lesson's first panel.
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
    proc = subprocess.run([sys.executable, "-m", "klviz.site", str(lessons[0]), "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"site build failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return out


def test_site_opens_from_disk_and_shows_figures(page, site, artifacts):
    requested: list[str] = []

    def offline(route):
        if route.request.url.startswith("file:"):
            route.continue_()
        else:
            requested.append(route.request.url)
            route.abort()

    page.route("**/*", offline)
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
    snapshot = page.locator(".klviz-snapshot")
    assert snapshot.count() >= 1, "no panel snapshot on the page (KLVIZ_STATIC not honoured?)"
    assert "VBox(" not in page.inner_text("body"), "a widget's text fallback leaked into the page"

    # The navigation back to the index is a relative link that works from disk.
    page.locator("nav.klviz-nav.top a.klviz-index").click()
    page.wait_for_load_state("load")
    assert page.url.endswith("/index.html")
    if (site / "_static" / "mathjax").is_dir():
        assert not requested, f"the site asked the network for {requested}"
    else:  # jupyter-server-mathjax missing: only MathJax may come from its CDN
        assert all("mathjax" in url.lower() for url in requested), requested
    page.goto((site / target).as_uri())
    page.wait_for_timeout(500)
    page.screenshot(path=str(artifacts / "site_lesson00.png"), full_page=True)
