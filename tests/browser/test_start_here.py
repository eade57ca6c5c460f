"""Lesson 00 in a real browser: run every cell, move a slider, see the numbers and the figure change."""
from __future__ import annotations

import re
import urllib.error
import urllib.request

from playwright.sync_api import Page, expect

from .helpers import changed_number, changed_screenshot, figure_of, move_slider, open_and_run, settled_screenshot, settled_text


def test_lab_refuses_requests_without_the_token(lab_server):
    try:
        urllib.request.urlopen(f"{lab_server['base']}/api/contents", timeout=5)
    except urllib.error.HTTPError as err:
        assert err.code in (401, 403)
    else:
        raise AssertionError("JupyterLab answered without a token")


def test_start_here_panel_reacts_to_a_slider(page: Page, lab_server, artifacts):
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    open_and_run(page, lab_server, "00_start_here.ipynb")
    panel = page.locator(".klviz-start-here").first
    expect(panel).to_be_visible(timeout=30_000)
    exact = panel.locator(".klviz-exact")
    expect(exact).to_have_text(re.compile(r"^\d+\.\d{4}$"), timeout=10_000)
    fig = figure_of(panel)
    expect(fig).to_be_visible(timeout=30_000)
    fig.scroll_into_view_if_needed()
    settled_text(page, panel.locator(".klviz-readout"))
    before_text, before_png = exact.inner_text(), settled_screenshot(page, fig)
    move_slider(page, panel, "push", "ArrowRight", times=5)   # push p harder toward "sofa"
    after_exact = changed_number(page, exact, before_text)
    after_png = changed_screenshot(page, figure_of(panel), before_png)
    assert after_png != before_png, "the figure did not redraw after the slider moved"
    assert after_exact > float(before_text)                     # a harder push means a larger KL
    status = panel.locator(".klviz-status").inner_text()
    assert "device cpu" in status and "ms" in status
    panel.screenshot(path=str(artifacts / "00_start_here_panel.png"))
    assert not errors, errors
