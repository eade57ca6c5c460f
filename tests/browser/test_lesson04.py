"""Lesson 04 in a real browser: run the notebook, move the update-step slider, hover a token."""
from __future__ import annotations

import pytest
from playwright.sync_api import expect

from .helpers import changed_number, changed_screenshot, figure_of, move_slider, open_and_run, settled_screenshot, settled_text

pytestmark = pytest.mark.browser


def test_worked_tokens_panel_responds(page, lab_server, artifacts):
    open_and_run(page, lab_server, "04_worked_tokens.ipynb")
    panel = page.locator(".klviz-lesson04").first
    panel.scroll_into_view_if_needed()
    readout = panel.locator(".klviz-readout")
    approx = panel.locator(".klviz-approx-kl")
    before_text = settled_text(page, readout)
    before_value = approx.inner_text()
    before_png = settled_screenshot(page, figure_of(panel))

    # four more update steps: approx_kl grows past MiniMind's threshold and the panel says it stopped
    move_slider(page, panel, "step", "ArrowRight", times=4)
    assert changed_number(page, approx, before_value) > float(before_value)
    expect(readout).to_contain_text("stopped", timeout=20_000)
    assert readout.inner_text() != before_text

    # colour the tokens by the exact KL; every token carries its numbers in a tooltip
    panel.locator(".klviz-color-by button", has_text="exact").click()
    expect(readout).to_contain_text("exact KL(π_old‖π_θ) at this position", timeout=20_000)
    token = panel.locator(".klviz-token").nth(3)
    assert "k3" in token.get_attribute("title") and "exact" in token.get_attribute("title")
    token.hover()
    after_png = changed_screenshot(page, figure_of(panel), before_png)
    assert after_png != before_png
    panel.screenshot(path=str(artifacts / "lesson04_worked_tokens_panel.png"))
