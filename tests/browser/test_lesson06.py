"""Lesson 06 in a real browser: run the notebook, move the rollout panel's batch size and estimator,
see the spread of the logged KL and the figure change."""
from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from .helpers import (changed_number, changed_screenshot, figure_of, move_slider, open_and_run, settled_screenshot,
                      settled_text)

pytestmark = pytest.mark.browser


def test_rollout_panel_responds(page, lab_server, artifacts):
    open_and_run(page, lab_server, "06_pitfalls_and_your_rollouts.ipynb")
    panel = page.locator(".klviz-rollouts").first
    panel.scroll_into_view_if_needed()
    spread = panel.locator(".klviz-spread-k1")
    expect(spread).to_be_visible(timeout=20_000)
    expect(spread).to_have_text(re.compile(r"\d"), timeout=20_000)      # the first readout has landed
    before_spread = settled_text(page, spread)
    before_png = settled_screenshot(page, figure_of(panel))

    # larger batches: the spread of the logged k1 shrinks (about 1/sqrt(B))
    move_slider(page, panel, "batch-sequences", "ArrowRight", times=2)
    assert changed_number(page, spread, before_spread) < float(before_spread)

    # switch the left histogram to k1's tokens
    panel.locator(".klviz-estimator button", has_text="k1").click()
    after_png = changed_screenshot(page, figure_of(panel), before_png)
    assert after_png != before_png
    assert not panel.locator(".klviz-error").inner_text().strip()
    panel.screenshot(path=str(artifacts / "lesson06_rollout_panel.png"))
