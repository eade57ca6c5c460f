"""Blitted panel frames look like full renders.

Panels redraw only the artists that changed over a cached background (klviz.widgets.base). For every
panel in the suite, each control is moved in turn; after every update the composed frame is compared
with a full Agg render of the same figure, pixel by pixel.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

import klviz.widgets as W

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from panels import change_plan  # noqa: E402  (the benchmark's own plan: each control one step and back)

SKIP_SLOW_CONTROLS = {"RLHFLabPanel": {"steps", "epochs", "prompts", "group_size"}}   # each retrains (~1 s)


@pytest.mark.parametrize("name", list(W.PANELS))
def test_blitted_frames_match_full_renders(name):
    panel = getattr(W, name)()
    assert panel.last_error is None
    blitted = 0
    for control, value in change_plan(panel, 12):
        if control in SKIP_SLOW_CONTROLS.get(name, ()):
            continue
        panel.set(**{control: value})
        assert panel.last_error is None, (control, value, panel.error.value)
        blitted += panel._frames.last_was_blit
        composed = np.asarray(panel.fig.canvas.buffer_rgba()).astype(np.int16).copy()
        FigureCanvasAgg.draw(panel.fig.canvas)
        full = np.asarray(panel.fig.canvas.buffer_rgba()).astype(np.int16)
        differing = float((np.abs(composed - full).max(-1) > 40).mean())
        # only stacking order may differ (a changed line drawn above an unchanged text): a few pixels
        assert differing < 0.005, f"{name} after {control}={value!r}: {100 * differing:.2f}% of pixels differ"
    assert blitted > 0, f"{name}: no update was blitted"


def test_changed_axis_limits_force_a_full_render():
    panel = W.StartHerePanel()
    panel.set(seed=1)
    panel.set(seed=2)                         # new tokens, same policies: only bars and error bars move
    assert panel._frames.last_was_blit and "(blitted)" in panel.status.value
    panel.set(push=4.0)                       # the KL jumps: the estimate axis must grow
    assert not panel._frames.last_was_blit
    assert "(blitted)" not in panel.status.value


def test_blitting_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("KLVIZ_NO_BLIT", "1")
    panel = W.StartHerePanel()
    panel.set(seed=1)
    panel.set(seed=2)
    assert not panel._frames.last_was_blit
