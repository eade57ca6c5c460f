"""Lesson 07 in a real browser: run the notebook, change the KL placement of the lab panel, see a new
run train (readout and curves change)."""
from __future__ import annotations

import pytest
from playwright.sync_api import expect

from .helpers import changed_screenshot, figure_of, move_slider, open_and_run, settled_screenshot, settled_text

pytestmark = pytest.mark.browser


def test_rlhf_lab_panel_responds(page, lab_server, artifacts):
    open_and_run(page, lab_server, "07_mini_rlhf_lab.ipynb", timeout_ms=300_000)
    panel = page.locator(".klviz-rlhf-lab").first
    panel.scroll_into_view_if_needed()
    final_kl = panel.locator(".klviz-final-kl")
    expect(final_kl).to_be_visible(timeout=20_000)
    before_text = settled_text(page, panel.locator(".klviz-readout"))
    before_kl = final_kl.inner_text()
    before_png = settled_screenshot(page, figure_of(panel))
    # beta 0.2 -> 0.0: a new 40-step run without any penalty trains in the background (a few seconds):
    # the panel answers at once, then shows the finished run, whose KL has grown
    move_slider(page, panel, "beta", "Home")
    expect(panel.locator(".klviz-readout")).to_contain_text("β = 0,", timeout=30_000)
    expect(panel.locator(".klviz-readout .klviz-final-kl")).to_be_visible(timeout=90_000)
    expect(final_kl).not_to_have_text(before_kl, timeout=30_000)
    assert panel.locator(".klviz-readout").inner_text() != before_text
    changed_screenshot(page, figure_of(panel), before_png)
    panel.screenshot(path=str(artifacts / "lesson07_lab_panel.png"))
