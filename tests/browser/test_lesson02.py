"""Lesson 02 in a real browser: run the notebook, move p's mean in the Gaussian panel, see the table,
the exact KL and the histograms change."""
from __future__ import annotations

import pytest
from playwright.sync_api import expect

from .helpers import changed_screenshot, figure_of, move_slider, open_and_run, settled_screenshot, settled_text

pytestmark = pytest.mark.browser


def test_gaussian_panel_responds(page, lab_server, artifacts):
    open_and_run(page, lab_server, "02_three_estimators.ipynb")
    panel = page.locator(".klviz-lesson02-gaussian").first
    panel.scroll_into_view_if_needed()
    readout = panel.locator(".klviz-readout")
    exact = panel.locator(".klviz-exact")
    expect(exact).to_have_text("0.5", timeout=20_000)          # default mu = 1: KL(q||p) = mu²/2
    before_text = settled_text(page, readout)
    before_png = settled_screenshot(page, figure_of(panel))

    # move p's mean from 1.0 to 1.25 (five steps of 0.05): KL = 1.25²/2 = 0.78125
    move_slider(page, panel, "mu", "ArrowRight", times=5)
    expect(exact).to_have_text("0.78125", timeout=20_000)
    assert readout.inner_text() != before_text
    assert "k3" in readout.inner_text() and "nan" not in readout.inner_text().lower()
    after_png = changed_screenshot(page, figure_of(panel), before_png)
    assert after_png != before_png

    # widen p beyond sqrt(2): the exact variance of k3 is infinite and the panel says why
    move_slider(page, panel, "sigma", "ArrowRight", times=10)
    expect(readout).to_contain_text("diverges", timeout=20_000)
    expect(panel.locator(".klviz-error")).to_have_text("")
    panel.screenshot(path=str(artifacts / "lesson02_gaussian_panel.png"))
