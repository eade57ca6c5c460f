"""Helpers for driving JupyterLab notebooks and ipywidgets from Playwright."""

from __future__ import annotations

import sys
from pathlib import Path

from playwright.sync_api import Locator, Page

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from labserver import ALL_RUN, KERNEL_IDLE, stop_process_group  # noqa: E402,F401  (re-exported for the tests)

ERRORS = """() => {
  const w = window.jupyterapp.shell.currentWidget;
  const out = [];
  for (const c of w.content.widgets) {
    if (c.model.type !== 'code') continue;
    for (let i = 0; i < c.model.outputs.length; i++) {
      const o = c.model.outputs.get(i);
      if (o.type === 'error') out.push(o.toJSON().ename + ': ' + o.toJSON().evalue);
    }
  }
  return out;
}"""


def open_and_run(page: Page, lab: dict, notebook: str, timeout_ms: int = 180_000) -> None:
    """Open ``notebook`` in JupyterLab, run all cells, wait until done and fail on any error output."""
    page.goto(f"{lab['base']}/lab/tree/{notebook}?token={lab['token']}&reset")
    page.wait_for_function(KERNEL_IDLE, timeout=90_000)
    page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")
    page.wait_for_function(ALL_RUN, timeout=timeout_ms, polling=500)
    errors = page.evaluate(ERRORS)
    assert not errors, f"{notebook} raised: {errors}"


def move_slider(page: Page, panel: Locator, control: str, key: str = "ArrowRight", times: int = 1) -> None:
    """Press ``key`` on the slider handle of the control named ``control`` inside ``panel``."""
    handle = panel.locator(f".klviz-{control} .noUi-handle").first
    handle.scroll_into_view_if_needed()
    for _ in range(times):
        # JupyterLab may move the focus (to the active cell) while a notebook settles after running;
        # a key pressed then goes to the notebook and the slider never moves: focus before each press,
        # until the handle has it
        try:
            page.wait_for_function(
                "el => { el.focus(); return el === document.activeElement; }",
                arg=handle.element_handle(),
                timeout=10_000,
                polling=100,
            )
        except Exception:  # noqa: BLE001 - Playwright's timeout: say what it means here
            raise AssertionError(f"the slider handle of {control!r} does not keep the keyboard focus") from None
        page.keyboard.press(key)


def type_into_readout(page: Page, panel: Locator, control: str, text: str) -> None:
    """Type a value into a slider's readout box and press Enter."""
    readout = panel.locator(f".klviz-{control} .widget-readout").first
    readout.click()
    page.keyboard.press("Control+A")
    page.keyboard.type(text)
    page.keyboard.press("Enter")


def figure_of(panel: Locator) -> Locator:
    """The rendered figure of a panel (its image)."""
    return panel.locator(".jupyter-matplotlib-figure, img.widget-image").first


def settled_screenshot(page: Page, locator: Locator, timeout_ms: int = 20_000) -> bytes:
    """A screenshot of ``locator`` once two taken 0.5 s apart are identical (the canvas has repainted).

    The readout changes as soon as the kernel has computed; the figure arrives later, as an image from
    the kernel, so a screenshot taken right away may still show the previous frame.
    """
    shot = locator.screenshot()
    for _ in range(max(1, timeout_ms // 500)):
        page.wait_for_timeout(500)
        again = locator.screenshot()
        if again == shot:
            return shot
        shot = again
    return shot


def changed_screenshot(page: Page, locator: Locator, before: bytes, timeout_ms: int = 20_000) -> bytes:
    """Wait until ``locator`` looks different from ``before`` and has settled; fail if it never changes."""
    for _ in range(max(1, timeout_ms // 250)):
        shot = locator.screenshot()
        if shot != before:
            return settled_screenshot(page, locator)
        page.wait_for_timeout(250)
    raise AssertionError("the figure did not change (no redraw reached the browser)")


def changed_number(page: Page, locator: Locator, before: str, timeout_ms: int = 20_000) -> float:
    """Wait until ``locator`` shows a number other than ``before`` and return it.

    An HTML readout is replaced as a whole when it updates, so for a moment the element can be
    empty or half written; only a complete number that differs from the old text counts.
    """
    for _ in range(max(1, timeout_ms // 100)):
        text = locator.inner_text().strip() if locator.count() else ""
        if text and text != before.strip():
            try:
                return float(text)
            except ValueError:
                pass
        page.wait_for_timeout(100)
    raise AssertionError(f"the readout never changed from {before!r} (last seen {text!r})")


def settled_text(page: Page, locator: Locator, timeout_ms: int = 20_000) -> str:
    """The text of ``locator`` once it has stayed the same for 0.5 s (all queued updates have landed)."""
    text = locator.inner_text()
    for _ in range(max(1, timeout_ms // 500)):
        page.wait_for_timeout(500)
        again = locator.inner_text()
        if again == text and again.strip():
            return again
        text = again
    return text
