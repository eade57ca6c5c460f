"""A panel's figure in a real browser: the frame seen is the image on top of its stack, at its own aspect.

Frames drawn ahead are sent to images beneath the one seen, and a step there raises one
(``klviz.widgets.stack``). What the reader sees must then be exactly that frame: these tests step a
panel whose next frames were loaded beneath, then compare the screenshot of the figure with the
frame the top image holds, pixel for pixel, and check which image the page hit-tests (its paint
order) and that a narrow page shrinks the figure without distorting it.
"""

from __future__ import annotations

import base64
import io
import json

import numpy as np
import pytest
from PIL import Image
from playwright.sync_api import expect

from klviz.widgets.stack import SETTLE_S

from .helpers import open_and_run

pytestmark = pytest.mark.browser

CELL = "import klviz\nimport klviz.widgets as W\nklviz.setup_notebook()\npanel = W.TokenEstimatorsPanel()\npanel"

# The images of the panel's figure, the one with the highest CSS order (the one painted on top), and
# which image the page finds at a few points inside the figure (hit testing follows paint order).
STACK = """panel => {
  const box = panel.querySelector('.klviz-figure');
  const imgs = Array.from(box.querySelectorAll('img'));
  const order = el => parseInt(el.style.order || '0', 10);
  const top = imgs.reduce((a, b) => (order(b) > order(a) ? b : a));
  const r = box.getBoundingClientRect();
  const hits = [[0.2, 0.3], [0.5, 0.5], [0.8, 0.7]].map(([fx, fy]) =>
    document.elementFromPoint(r.left + fx * r.width, r.top + fy * r.height) === top);
  const t = top.getBoundingClientRect();
  return {n: imgs.length, orders: imgs.map(order), src: top.src, hits, complete: top.complete,
          natural: [top.naturalWidth, top.naturalHeight], shown: [t.width, t.height], box: [r.width, r.height],
          at: {x: t.left + window.scrollX, y: t.top + window.scrollY, width: t.width, height: t.height},
          panel: panel.getBoundingClientRect().width};
}"""


def _decode(url: str) -> np.ndarray:
    head, _, body = url.partition(",")
    assert head in ("data:image/webp;base64", "data:image/png;base64"), head[:40]
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(body))).convert("RGB")).astype(np.int16)


# A frame drawn ahead has arrived beneath the one seen: an image other than the top holds a frame drawn
# ahead (only those go beneath) that it did not hold when the last step was taken, and has
# loaded it. Then, SETTLE_S after the page saw it loaded (so at least as long after the kernel sent it),
# a step there raises it (FrameStack.bring_up). The direction of travel is drawn first.
NEW_FRAME_SETTLED = """([panel, old, settleMs]) => {
  const imgs = Array.from(panel.querySelectorAll('.klviz-figure img'));
  const order = el => parseInt(el.style.order || '0', 10);
  const top = imgs.reduce((a, b) => (order(b) > order(a) ? b : a));
  const ready = imgs.some(i => i !== top && i.src.startsWith('data:image/') && !old.includes(i.src) &&
                               i.complete && i.naturalWidth > 0);
  if (!ready) { panel.klvizLoadedAt = undefined; return false; }
  if (panel.klvizLoadedAt === undefined) panel.klvizLoadedAt = performance.now();
  return performance.now() - panel.klvizLoadedAt >= settleMs;
}"""


def _sources(panel) -> list[str]:
    return panel.evaluate("p => Array.from(p.querySelectorAll('.klviz-figure img')).map(i => i.src)")


def _step(page, panel) -> None:
    """Press the right arrow on the panel's first slider and wait for the readout to change."""
    readout = panel.locator(".klviz-readout").first
    before = readout.inner_text()
    handle = panel.locator(".noUi-handle").first
    handle.focus()
    page.keyboard.press("ArrowRight")
    expect(readout).not_to_have_text(before, timeout=60_000)


def test_a_step_to_a_frame_loaded_beneath_paints_exactly_that_frame(page, lab_server, artifacts):
    notebook = "frame_stack_check.ipynb"
    cells = [{"cell_type": "code", "id": "c0", "metadata": {}, "execution_count": None, "outputs": [], "source": CELL}]
    nb = {
        "nbformat": 4,
        "nbformat_minor": 5,
        "metadata": {"kernelspec": {"name": "python3", "language": "python", "display_name": "Python 3"}},
        "cells": cells,
    }
    (lab_server["root"] / notebook).write_text(json.dumps(nb))
    page.set_viewport_size({"width": 1700, "height": 1100})  # the figure at its own size: pixels compare exactly
    open_and_run(page, lab_server, notebook)
    panel = page.locator(".klviz-panel").first
    panel.scroll_into_view_if_needed()
    before_step: list[str] = []
    steps = []  # per step: the orders of the images after it and the status line (for a failure's message)
    for _ in range(3):
        # the kernel idles: the next frame is drawn, sent beneath, loaded by the page and settled
        page.wait_for_function(
            NEW_FRAME_SETTLED, arg=[panel.element_handle(), before_step, 1000 * SETTLE_S + 10], timeout=60_000
        )
        before_step = _sources(panel)
        _step(page, panel)
        status = panel.locator(".klviz-status").first.inner_text()
        steps.append((panel.evaluate(STACK)["orders"], status))
    # the frame raised by the last step is the one on top, loaded
    page.wait_for_function(
        """panel => { const imgs = Array.from(panel.querySelectorAll('.klviz-figure img'));
                      const order = el => parseInt(el.style.order || '0', 10);
                      const top = imgs.reduce((a, b) => (order(b) > order(a) ? b : a));
                      return top.complete && top.naturalWidth > 0; }""",
        arg=panel.element_handle(),
        timeout=30_000,
    )
    state = panel.evaluate(STACK)
    seen = {k: v for k, v in state.items() if k != "src"}  # for the messages: the frame itself is long
    assert state["n"] == 3, seen
    assert max(state["orders"]) >= 4, f"the steps were not answered by raising frames beneath: {steps}"
    assert all(state["hits"]), f"another image is painted over the one on top: {seen}"
    assert state["complete"] and state["natural"] == [round(v) for v in state["shown"]], seen
    png = page.screenshot(clip=state["at"], full_page=True)  # what the page paints where the top image is
    (artifacts / "frame_stack_step.png").write_bytes(png)
    shot = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))
    frame = _decode(state["src"])
    assert shot.shape == frame.shape, (shot.shape, frame.shape, state["at"], state["box"])
    worst = int(np.abs(shot.astype(np.int16) - frame).max())
    assert worst <= 3, f"the figure seen differs from the frame on top by up to {worst} levels"

    # a page narrower than the figure shrinks it, at its own aspect, inside the panel
    page.set_viewport_size({"width": 800, "height": 1100})
    page.wait_for_function(  # the page has laid the figure out at the new width
        "panel => panel.querySelector('.klviz-figure').getBoundingClientRect().width < 800",
        arg=panel.element_handle(),
        timeout=30_000,
    )
    narrow = panel.evaluate(STACK)
    narrow.pop("src")
    (width, height), (nat_w, nat_h) = narrow["box"], narrow["natural"]
    assert width < nat_w and width <= narrow["panel"] + 1, narrow
    assert abs(height - width * nat_h / nat_w) <= 1.5, f"the figure is distorted: {narrow}"
