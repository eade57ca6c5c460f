"""Lesson 01 in a real browser: run the notebook, move the sampling panel, see numbers and figure change."""
from __future__ import annotations

import pytest
from playwright.sync_api import expect

from .helpers import changed_screenshot, figure_of, move_slider, open_and_run, settled_screenshot, settled_text

pytestmark = pytest.mark.browser


def test_sampling_panel_responds(page, lab_server, artifacts):
    open_and_run(page, lab_server, "01_sampling_as_weighting.ipynb")
    panel = page.locator(".klviz-sampling").first
    panel.scroll_into_view_if_needed()
    readout = panel.locator(".klviz-readout")
    exact = panel.locator(".klviz-exact")
    before_text = settled_text(page, readout)
    before_exact = exact.inner_text()
    before_png = settled_screenshot(page, figure_of(panel))

    # push q's " sofa" further: the exact KL(q||p) and the estimate change
    move_slider(page, panel, "q-push", "ArrowRight", times=5)
    # the readout's HTML is replaced on every update: poll through locators, not element handles
    expect(exact).not_to_have_text(before_exact, timeout=20_000)
    assert readout.inner_text() != before_text

    # switch to tokens from mu with importance weights: the readout reports an effective sample size
    panel.locator(".klviz-mode button", has_text="with importance weights").click()
    expect(readout.locator(".klviz-ess")).to_be_visible(timeout=20_000)
    after_png = changed_screenshot(page, figure_of(panel), before_png)
    assert after_png != before_png
    panel.screenshot(path=str(artifacts / "lesson01_sampling_panel.png"))
