"""Presenter mode in headless Chromium, in both themes: lesson 00 served by Voila shows prose, typeset
math and a live panel, no code; a slider moved in the browser changes the readout; the server wants its
token; and with every request that leaves the machine refused, the page logs no error (no CDN, no
missing font, no labextension that fails in Voila). The dark run presents the Chinese lesson
(``--lang zh``): its page is marked ``lang="zh"`` and draws Chinese with the font presenter mode serves.
"""

from __future__ import annotations

import http.client
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from klviz import fonts

from .helpers import changed_screenshot, figure_of, settled_screenshot, settled_text, stop_process_group
from .test_cjk_glyphs import _platform_fonts

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = Path(os.environ.get("KLVIZ_TEST_NOTEBOOKS", ROOT / "notebooks"))

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module", params=[("light", "en"), ("dark", "zh")], ids=["light-en", "dark-zh"])
def presenter(request, tmp_path_factory):
    import voila  # noqa: F401  (the test extra installs it)

    assert sorted(NOTEBOOKS.glob("00_*.ipynb")), f"no lesson 00 in {NOTEBOOKS}"
    home = tmp_path_factory.mktemp("present-home")
    env = dict(os.environ, HOME=str(home), JUPYTER_CONFIG_DIR=str(home / ".jupyter"), PYTHONUNBUFFERED="1")
    env.pop("MPLBACKEND", None)
    log_path = home / "present.log"
    log = open(log_path, "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "klviz.present", "00", "--no-browser", "--notebooks", str(NOTEBOOKS)]
        + ["--theme", request.param[0], "--lang", request.param[1]],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.time() + 120
        url = None
        while url is None:
            match = re.search(
                r"klviz present: (http://127\.0\.0\.1:\d+/voila/render/\S+\?token=\S+)", log_path.read_text()
            )
            if match:
                url = match.group(1)
            elif proc.poll() is not None or time.time() > deadline:
                pytest.fail("presenter mode did not start:\n" + log_path.read_text()[-3000:])
            else:
                time.sleep(0.25)
        yield {"url": url, "log": log_path, "theme": request.param[0], "lang": request.param[1]}
    finally:
        stop_process_group(proc)
        log.close()


def test_presenter_requires_token_and_binds_localhost(presenter):
    parts = urlsplit(presenter["url"])
    assert parts.hostname == "127.0.0.1"
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    conn.request("GET", parts.path)  # the lesson without its token: sent to the login page, not run
    response = conn.getresponse()
    assert response.status in (302, 401, 403), response.status
    assert "login" in (response.getheader("Location") or "login")


def test_presenter_shows_panel_without_code_and_slider_moves(page, presenter, artifacts):
    errors: list[str] = []
    page.on("console", lambda m: errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    page.on("response", lambda r: errors.append(f"HTTP {r.status}: {r.url}") if r.status >= 400 else None)
    outside: list[str] = []

    def offline(route):  # a classroom without the network: only the presenter's own server answers
        if route.request.url.startswith(("http://127.0.0.1:", "data:", "blob:")):
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()

    page.route("**/*", offline)
    page.goto(presenter["url"], timeout=120_000)
    panel = page.locator(".klviz-panel").first
    panel.wait_for(state="visible", timeout=120_000)
    readout = panel.locator(".klviz-readout")
    page.wait_for_function("el => el.innerText.trim().length > 0", arg=readout.element_handle(), timeout=30_000)

    # Prose yes, code no.
    assert page.locator("h1").count() >= 1
    assert page.locator(".jp-InputArea-editor, .jp-CodeMirrorEditor, .cm-editor").count() == 0
    assert "setup_notebook(" not in page.inner_text("body")

    figure = figure_of(panel)
    figure.wait_for(state="visible", timeout=30_000)
    before_text = settled_text(page, readout)
    before_png = settled_screenshot(page, figure)
    handle = panel.locator(".noUi-handle").first
    handle.scroll_into_view_if_needed()
    handle.focus()
    for _ in range(8):
        page.keyboard.press("ArrowRight")
    page.wait_for_function(
        "([el, old]) => el.innerText !== old", arg=[readout.element_handle(), before_text], timeout=30_000
    )
    assert readout.inner_text() != before_text
    changed_screenshot(page, figure, before_png)  # fails if the figure never changes
    assert panel.locator(".klviz-error").inner_text().strip() == ""
    # the lesson's math typeset with the MathJax Voila bundles, from the presenter's server
    page.wait_for_function("() => document.querySelectorAll('mjx-container').length > 0", timeout=30_000)
    dark = page.evaluate("document.body.dataset.jpThemeLight") == "false"
    assert dark == (presenter["theme"] == "dark")
    assert page.evaluate("document.documentElement.lang") == presenter["lang"]
    if presenter["lang"] == "zh":  # presenter mode's own Chinese words, drawn with the font it serves
        turn = page.locator("strong", has_text="轮到你了").first
        turn.evaluate("el => el.setAttribute('data-klviz-test', 'your-turn')")
        page.wait_for_function("() => document.fonts.status === 'loaded'")
        used = _platform_fonts(page, "[data-klviz-test=your-turn]")
        assert used.get(fonts.FAMILY, 0) >= 4, used
    page.screenshot(path=str(artifacts / f"present_00_{presenter['theme']}_{presenter['lang']}.png"), full_page=True)
    assert not outside, f"presenter mode asked the network for {outside}"
    assert not errors, f"presenter mode logged errors: {errors}"
