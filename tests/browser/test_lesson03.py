"""Lesson 03 in a real browser: run the notebook, drag r along the curve, switch f, see the gap change."""
from __future__ import annotations

import pytest
from playwright.sync_api import expect

from .helpers import changed_number, changed_screenshot, figure_of, move_slider, open_and_run, settled_screenshot, settled_text

pytestmark = pytest.mark.browser


def test_bregman_panel_responds(page, lab_server, artifacts):
    open_and_run(page, lab_server, "03_f_divergence_bregman.ipynb")
    panel = page.locator(".klviz-bregman").first
    panel.scroll_into_view_if_needed()
    gap = panel.locator(".klviz-readout .klviz-gap")
    k3 = panel.locator(".klviz-readout .klviz-k3")
    settled_text(page, panel.locator(".klviz-readout"))
    before_gap = gap.inner_text()
    before_png = settled_screenshot(page, figure_of(panel))

    # drag r to the right: the gap (k3 for f = -log t) changes and still agrees with klviz.k3
    move_slider(page, panel, "r", "ArrowRight", times=20)
    # the readout's HTML is replaced on every update: poll through locators, not element handles
    changed_number(page, gap, before_gap)
    settled_text(page, panel.locator(".klviz-readout"))       # all twenty key presses have landed
    assert float(gap.inner_text()) == pytest.approx(float(k3.inner_text()), rel=1e-5)

    # switch f to t log t: the readout names the other direction
    panel.locator(".klviz-f button", has_text="t log t").first.click()
    expect(panel.locator(".klviz-readout")).to_contain_text("KL(p‖q)", timeout=20_000)
    changed_screenshot(page, figure_of(panel), before_png)
    panel.screenshot(path=str(artifacts / "lesson03_bregman_panel.png"))
