"""Panel latency as a reader sees it: key press on a slider in JupyterLab -> the new frame drawn.

A private JupyterLab (``labserver.py``) serves a notebook this script writes: one cell runs
``klviz.setup_notebook()`` (as the lessons do), then one cell per panel
builds it at its default settings. Headless Chromium opens the notebook, runs it, and for each
panel presses the arrow keys on one slider (``--changes`` presses, default 30: one step right,
one step back, ...). Each press is timed in the page, from the keydown event to the moment the
frame that the kernel sent back has loaded into the panel's image (a ``load`` event; a figure on a
canvas counts when ``drawImage`` puts the frame there). The browser paints that frame at its next
animation frame, at most 16 ms later.

The baseline, measured in the same run and the same kernel, is the plain round trip of the widget
machinery: a slider whose observer writes its value into an HTML widget, timed from keydown to
the moment the new text appears. Printed per panel: median and p95 in ms, and the median as a
ratio to the baseline's median. Target (2-core CPU): median <= 50 ms, p95 <= 100 ms.

    python benchmarks/browser_panels.py                         # every panel, 30 presses each
    python benchmarks/browser_panels.py --only BregmanPanel --changes 10
    python benchmarks/browser_panels.py --only RLHFLabPanel --control RLHFLabPanel=steps

Needs Chromium (``apt-get install -y chromium``) and the test extra (Playwright). Screenshots of
each panel after its last press go to ``build/browser-bench/`` with ``--screenshots``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import median, p95, positive_int, print_table  # noqa: E402
from labserver import CHROMIUM_FLAGS, find_chromium, running_lab  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TARGET_MEDIAN_MS = 50.0
TARGET_P95_MS = 100.0
#: the slider moved in each panel, when it is not the panel's first one (none: every panel's first
#: slider; the RLHF lab's first, beta, starts a training run in the background and answers at once)
DEFAULT_CONTROLS: dict[str, str] = {}

RECORD_FRAMES = """
(() => {
  if (window.__klvizFrames) return;
  window.__klvizFrames = [];
  window.__klvizKeyAt = null;
  const draw = CanvasRenderingContext2D.prototype.drawImage;
  CanvasRenderingContext2D.prototype.drawImage = function (...args) {
    window.__klvizFrames.push({t: performance.now(), canvas: this.canvas});
    return draw.apply(this, args);
  };
  // a figure shown as an <img> (ipywidgets.Image) has its frame once the new image has loaded
  document.addEventListener('load', (e) => {
    if (e.target && e.target.tagName === 'IMG') window.__klvizFrames.push({t: performance.now(), canvas: e.target});
  }, true);
  window.addEventListener('keydown', () => { window.__klvizKeyAt = performance.now(); }, true);
})();
"""

# Resolves with ms from the last keydown to the first frame drawn on a canvas inside `panel`,
# or to the moment `panel`'s element `.klviz-echo` shows text other than `before`.
WAIT_FOR_FRAME = """
async ([selector, before, timeoutMs]) => {
  const panel = document.querySelector(selector);
  const start = performance.now();
  while (performance.now() - start < timeoutMs) {
    const t0 = window.__klvizKeyAt;
    if (t0 !== null) {
      if (before === null) {
        const f = window.__klvizFrames.find(f => f.t >= t0 && panel.contains(f.canvas));
        if (f) return f.t - t0;
      } else {
        const echo = panel.querySelector('.klviz-echo');
        if (echo && echo.textContent !== before) return performance.now() - t0;
      }
    }
    await new Promise(r => requestAnimationFrame(r));
  }
  return null;
}
"""

BASELINE_CELL = """\
import ipywidgets as widgets
_echo = widgets.HTML("0").add_class("klviz-echo")
_slider = widgets.IntSlider(value=0, min=-5, max=5, description="echo").add_class("klviz-echo-slider")
_slider.observe(lambda change: setattr(_echo, "value", str(change["new"])), names="value")
widgets.VBox([_slider, _echo]).add_class("klviz-baseline")
"""


def panel_names(only: list[str] | None) -> list[str]:
    import klviz.widgets as W

    names = list(W.PANELS)
    if only:
        unknown = sorted(set(only) - set(names))
        if unknown:
            raise SystemExit(f"--only: unknown panel(s) {unknown}; known: {names}")
        names = [n for n in names if n in only]
    return names


def write_notebook(folder: Path, names: list[str], device: str | None) -> Path:
    """A notebook with the setup cell, the baseline cell and one cell per panel."""
    import inspect

    import klviz.widgets as W

    cells = ["import klviz\nimport klviz.widgets as W\ndevice = klviz.setup_notebook()", BASELINE_CELL]
    for i, name in enumerate(names):
        takes_device = device is not None and "device" in inspect.signature(getattr(W, name)).parameters
        args = f"device={device!r}" if takes_device else ""
        cells.append(f"_p{i} = W.{name}({args})\n_p{i}.widget.add_class('klviz-bench-{i}')\n_p{i}")
    nb = {"nbformat": 4, "nbformat_minor": 5,
          "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
          "cells": [{"cell_type": "code", "id": f"c{i}", "metadata": {}, "execution_count": None, "outputs": [],
                     "source": src} for i, src in enumerate(cells)]}
    path = folder / "panel_latency.ipynb"
    path.write_text(json.dumps(nb, indent=1))
    return path


def measure(page, selector: str, handle_selector: str, changes: int, echo: bool, timeout_ms: int) -> list[float]:
    handle = page.locator(f"{selector} {handle_selector}").first
    handle.scroll_into_view_if_needed()
    handle.focus()
    page.wait_for_timeout(300)
    out = []
    for i in range(changes):
        before = page.locator(f"{selector} .klviz-echo").inner_text() if echo else None
        page.evaluate("window.__klvizKeyAt = null")
        page.keyboard.press("ArrowRight" if i % 2 == 0 else "ArrowLeft")
        ms = page.evaluate(WAIT_FOR_FRAME, [selector, before, timeout_ms])
        if ms is None:
            raise RuntimeError(f"{selector}: press {i + 1} drew no frame within {timeout_ms} ms")
        out.append(ms)
        page.wait_for_timeout(150)         # let the kernel go idle before the next press
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--device", default=None,
                        help="build the panels on this device (default: the notebook's, the GPU when there is one)")
    parser.add_argument("--changes", type=positive_int, default=30, help="key presses per panel")
    parser.add_argument("--only", nargs="*", default=None, metavar="CLASS", help="only these panels")
    parser.add_argument("--control", nargs="*", default=[], metavar="PANEL=CONTROL",
                        help="the slider to move in a panel (default: its first)")
    parser.add_argument("--timeout", type=positive_int, default=30_000, help="ms to wait for one frame")
    parser.add_argument("--screenshots", action="store_true", help="save each panel to build/browser-bench/")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args(argv)
    controls = dict(DEFAULT_CONTROLS)
    for item in args.control:
        name, _, control = item.partition("=")
        if not control:
            parser.error(f"--control takes PANEL=CONTROL, got {item!r}")
        controls[name] = control
    chromium = find_chromium()
    if not chromium:
        print("Chromium is missing: install it with `apt-get install -y chromium` or set KLVIZ_CHROMIUM.")
        return 2
    from playwright.sync_api import sync_playwright

    names = panel_names(args.only)
    shots = ROOT / "build" / "browser-bench"
    print("== panels in a real browser: key press on a slider -> the new frame drawn")
    print(f"   JupyterLab + headless Chromium · {os.cpu_count()} CPUs · load average "
          + " ".join(f"{v:.2f}" for v in os.getloadavg()))
    print(f"   changes {args.changes} per panel · panels {len(names)}")
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as pw:
        root, home = Path(tmp) / "root", Path(tmp) / "home"
        root.mkdir()
        home.mkdir()
        nb = write_notebook(root, names, args.device)
        with running_lab(root, home) as lab:
            browser = pw.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_FLAGS)
            page = browser.new_context(viewport={"width": 1280, "height": 1100}).new_page()
            page.add_init_script(RECORD_FRAMES)
            t0 = time.perf_counter()
            sys.path.insert(0, str(ROOT / "tests" / "browser"))
            from helpers import open_and_run

            open_and_run(page, lab, nb.name)
            print(f"   notebook ran in {time.perf_counter() - t0:.1f} s")
            baseline = measure(page, ".klviz-baseline", ".noUi-handle", args.changes, True, args.timeout)
            base_med = median(baseline)
            rows = [["(baseline) slider -> kernel -> HTML", f"{base_med:.1f}", f"{p95(baseline):.1f}", "1.00",
                     "-", ""]]
            missed = False
            for i, name in enumerate(names):
                selector = f".klviz-bench-{i}"
                control = controls.get(name)
                handle = (f".klviz-{control.replace('_', '-')} .noUi-handle" if control else ".noUi-handle")
                if page.locator(f"{selector} {handle}").count() == 0:
                    rows.append([name, "no slider", "", "", control or "", ""])
                    continue
                try:
                    times = measure(page, selector, handle, args.changes, False, args.timeout)
                except RuntimeError as err:
                    rows.append([name, "NO FRAME", "", "", control or "first slider", str(err)[:40]])
                    missed = True
                    continue
                ok = median(times) <= TARGET_MEDIAN_MS and p95(times) <= TARGET_P95_MS
                missed = missed or not ok
                rows.append([name, f"{median(times):.1f}", f"{p95(times):.1f}", f"{median(times) / base_med:.2f}",
                             control or "first slider", "ok" if ok else "OVER TARGET"])
                if args.screenshots:
                    shots.mkdir(parents=True, exist_ok=True)
                    page.locator(selector).screenshot(path=str(shots / f"{name}.png"))
            browser.close()
    print_table(["panel", "median ms", "p95 ms", "median / baseline", "slider moved",
                 f"<= {TARGET_MEDIAN_MS:.0f}/{TARGET_P95_MS:.0f}"], rows)
    return 1 if args.strict and missed else 0


if __name__ == "__main__":
    sys.exit(main())
