"""Lesson 05 in a real browser: run the notebook, move beta in the bandit panel and the start of the
simplex panel, see the readouts and the figures change."""
from __future__ import annotations

import pytest
from playwright.sync_api import expect

from .helpers import changed_screenshot, figure_of, move_slider, open_and_run, settled_screenshot, settled_text

pytestmark = pytest.mark.browser


def test_bandit_and_simplex_panels_respond(page, lab_server, artifacts):
    open_and_run(page, lab_server, "05_gradients.ipynb")

    bandit = page.locator(".klviz-bandit").first
    bandit.scroll_into_view_if_needed()
    beta = bandit.locator(".klviz-beta-value")
    expect(beta).to_be_visible(timeout=20_000)
    before_text = settled_text(page, bandit.locator(".klviz-readout"))   # cells after the panel may still move it
    before_beta = beta.inner_text()
    before_png = settled_screenshot(page, figure_of(bandit))
    move_slider(page, bandit, "beta", "ArrowRight", times=3)
    expect(beta).not_to_have_text(before_beta, timeout=20_000)
    expect(bandit.locator(".klviz-readout")).not_to_have_text(before_text, timeout=20_000)
    changed_screenshot(page, figure_of(bandit), before_png)
    bandit.screenshot(path=str(artifacts / "lesson05_bandit_panel.png"))

    flow = page.locator(".klviz-simplex-flow").first
    flow.scroll_into_view_if_needed()
    end = flow.locator(".klviz-start")
    expect(end).to_be_visible(timeout=20_000)
    settled_text(page, flow.locator(".klviz-readout"))
    before_end = end.inner_text()
    before_png = settled_screenshot(page, figure_of(flow))
    move_slider(page, flow, "start-mat", "ArrowRight", times=20)   # continuous_update=False: one update on release
    expect(end).not_to_have_text(before_end, timeout=20_000)
    changed_screenshot(page, figure_of(flow), before_png)
    flow.screenshot(path=str(artifacts / "lesson05_simplex_panel.png"))
