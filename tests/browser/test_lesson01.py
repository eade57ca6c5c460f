"""Lesson 01 in a real browser: run the notebook, move the sampling panel, see numbers and figure change."""
from __future__ import annotations

import pytest

from .helpers import figure_of, move_slider, open_and_run

pytestmark = pytest.mark.browser


def test_sampling_panel_responds(page, lab_server, artifacts):
    open_and_run(page, lab_server, "01_sampling_as_weighting.ipynb")
    panel = page.locator(".klviz-sampling").first
    panel.scroll_into_view_if_needed()
    readout = panel.locator(".klviz-readout")
    exact = panel.locator(".klviz-exact")
    before_text, before_exact = readout.inner_text(), exact.inner_text()
    before_png = figure_of(panel).screenshot()

    # push q's " sofa" further: the exact KL(q||p) and the estimate change
    move_slider(page, panel, "q-push", "ArrowRight", times=5)
    page.wait_for_timeout(3000)
    panel.screenshot(path=str(artifacts / "debug01.png"))
    print("DEBUG", before_exact, "|", exact.inner_text(), "|", panel.locator(".klviz-q-push").inner_text(), "|", panel.locator(".klviz-error").inner_text())
    page.wait_for_function("([el, old]) => el.innerText !== old", arg=[exact.element_handle(), before_exact],
                           timeout=20_000)
    assert readout.inner_text() != before_text

    # switch to tokens from mu with importance weights: the readout reports an effective sample size
    panel.locator(".klviz-mode button", has_text="with importance weights").click()
    page.wait_for_function("(el) => el.querySelector('.klviz-ess') !== null", arg=readout.element_handle(),
                           timeout=20_000)
    page.wait_for_timeout(1_000)     # let the canvas repaint
    after_png = figure_of(panel).screenshot()
    assert after_png != before_png
    panel.screenshot(path=str(artifacts / "lesson01_sampling_panel.png"))
