"""Panel latency as a reader sees it: key press on a slider in JupyterLab -> the new frame drawn.

A private JupyterLab (``labserver.py``) serves a notebook this script writes: one cell runs
``klviz.setup_notebook()`` (as the lessons do), then one cell per panel
builds it at its default settings. Headless Chromium opens the notebook, runs it, and for each
panel presses the arrow keys on one slider, each press 150 ms after the last one's frame (``--pause``;
``--changes`` presses, default 30). By
default the presses walk one way and turn at the slider's end, so nearly every press goes to a
position the panel has not shown (``--pattern alternate``: one step right, one step back). Panels
draw ahead while the kernel idles (``klviz.widgets.ahead``); ``--no-draw-ahead`` measures every
press computed as it arrives. Each press is timed in the page, from the keydown event to the moment the
frame that the kernel sent back has loaded into the panel's image (a ``load`` event; a figure on a
canvas counts when ``drawImage`` puts the frame there). The browser paints that frame at its next
animation frame, at most 16 ms later. A press whose frame has the same pixels as the one shown
(nothing is sent for it: the RLHF lab's empty run at a new beta) is answered by its new readout.

The baseline, measured in the same run and the same kernel, is the plain round trip of the widget
machinery: a slider whose observer writes its value into an HTML widget, timed from keydown to
the moment the page changes the text (seen by a MutationObserver, as exactly as an image's load
event; polling at animation frames added up to 16 ms to the baseline alone). It is measured in
blocks, one before the panels and one before each panel, and pooled: one block at the start moved
by 19-26 ms between runs of the same script. Printed per panel:
median and p95 in ms, and the median as a ratio to the baseline's median. Target: median <= 1.6x
the baseline's median (same run), p95 <= 100 ms.
``--breakdown`` also prints where each press's time went, from the timestamps of the kernel messages.

    python benchmarks/browser_panels.py                         # every panel, 30 presses each
    python benchmarks/browser_panels.py --only BregmanPanel --changes 10
    python benchmarks/browser_panels.py --only RLHFLabPanel --control RLHFLabPanel=steps
    python benchmarks/browser_panels.py --no-draw-ahead --breakdown  # every press computed on arrival

Needs Chromium (``apt-get install -y chromium``) and the test extra (Playwright). Screenshots of
each panel after its last press go to ``build/browser-bench/`` with ``--screenshots``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import median, p95, positive_int, print_table  # noqa: E402
from labserver import CHROMIUM_FLAGS, find_chromium, running_lab  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
#: target: each panel's median within this many times the plain round trip's median, p95 within 100 ms
TARGET_RATIO = 1.6
BASELINE = "(baseline) slider -> kernel -> HTML"
TARGET_P95_MS = 100.0
#: the slider moved in each panel, when it is not the panel's first one (none: every panel's first
#: slider; the RLHF lab's first, beta, starts a training run in the background and answers at once)
DEFAULT_CONTROLS: dict[str, str] = {}

RECORD_FRAMES = """
(() => {
  if (window.__klvizFrames) return;
  window.__klvizFrames = [];
  window.__klvizEcho = [];
  window.__klvizKeyAt = null;
  // a waiting probe is woken by the events themselves: polling at every animation frame made the
  // page composite 60 times a second while the kernel worked, taking CPU from it on a small machine
  window.__klvizWaiters = [];
  window.__klvizWake = () => { const w = window.__klvizWaiters; window.__klvizWaiters = []; w.forEach(f => f()); };
  const draw = CanvasRenderingContext2D.prototype.drawImage;
  CanvasRenderingContext2D.prototype.drawImage = function (...args) {
    window.__klvizFrames.push({t: performance.now(), canvas: this.canvas});
    window.__klvizWake();
    return draw.apply(this, args);
  };
  // a figure shown as an <img> (ipywidgets.Image) has its frame once the new image has loaded
  document.addEventListener('load', (e) => {
    if (e.target && e.target.tagName === 'IMG') {
      window.__klvizFrames.push({t: performance.now(), canvas: e.target});
      window.__klvizWake();
    }
  }, true);
  window.addEventListener('keydown', () => { window.__klvizKeyAt = performance.now(); }, true);
  // a panel's figure is a stack of images in one grid cell (klviz.widgets.stack): the one with the
  // highest CSS order is seen; an image outside such a stack is always seen
  const order = (el) => parseInt(el.style.order || '0', 10);
  const onTop = (el) => {
    const stack = el.parentElement;
    if (!stack || !stack.classList.contains('klviz-figure')) return true;
    return Array.from(stack.children).every(s => s === el || order(s) < order(el));
  };
  // when the page hands a new frame to an image (its widget's view setting src); a frame sent to an
  // image beneath the one seen (drawn ahead, for later) is not an answer to a press
  window.__klvizSrc = [];
  const src = Object.getOwnPropertyDescriptor(HTMLImageElement.prototype, 'src');
  Object.defineProperty(HTMLImageElement.prototype, 'src', {
    get() { return src.get.call(this); },
    set(v) { window.__klvizSrc.push({t: performance.now(), el: this, top: onTop(this)}); src.set.call(this, v); },
  });
  // when an image already loaded beneath is brought to the top (its order raised): the page shows it
  // at its next paint with nothing to load, as it shows a changed text
  window.__klvizRaised = [];
  new MutationObserver((records) => {
    const t = performance.now();
    for (const r of records) {
      if (r.target.tagName === 'IMG' && onTop(r.target) && order(r.target) > 0) {
        // complete: its frame had loaded (else the page shows the image's previous frame until it has)
        window.__klvizRaised.push({t, el: r.target, loaded: r.target.complete});
        window.__klvizWake();
      }
    }
  }).observe(document, {subtree: true, attributes: true, attributeFilter: ['style']});
  // the baseline's text and the panels' readouts, timed when the page changes them (as exactly as
  // an image's load event)
  window.__klvizReadout = [];
  new MutationObserver((records) => {
    const t = performance.now();
    for (const r of records) {
      const el = r.target.nodeType === 1 ? r.target : r.target.parentElement;
      const echo = el && el.closest && el.closest('.klviz-echo');
      if (echo) window.__klvizEcho.push({t, el: echo, text: echo.textContent});
      // a panel's readout is inside its text widget, whose content the page replaces as a whole
      const readout = el && el.closest && (el.closest('.klviz-readout') || el.closest('.klviz-text'));
      if (readout) window.__klvizReadout.push({t, el: readout});
    }
    window.__klvizWake();
  }).observe(document, {subtree: true, childList: true, characterData: true});
})();
"""

# The kernel messages as the page sends and receives them (for --breakdown): a WebSocket that
# notes the time, size, type, kernel timestamp and parent of each Jupyter message (v1 protocol).
RECORD_WIRE = """
(() => {
  if (window.__klvizWire) return;
  window.__klvizWire = [];
  const dec = new TextDecoder();
  const kernelMs = (date) => {              // ISO date of the kernel's header -> performance.now() scale
    const m = /^(.*T[0-9][0-9]:[0-9][0-9]:[0-9][0-9])([.][0-9]+)?(.*)$/.exec(date || '');
    if (!m) return null;
    const ms = Date.parse(m[1] + (m[3] || 'Z')) + (m[2] ? parseFloat(m[2]) * 1000 : 0);
    return ms - performance.timeOrigin;
  };
  const note = (dir, data) => {
    const t = performance.now();
    try {
      let header, parent, content, bytes, nbuf = 0;
      if (typeof data === 'string') {
        const msg = JSON.parse(data);
        header = msg.header; parent = msg.parent_header; content = msg.content; bytes = data.length;
      } else {
        const buf = data instanceof ArrayBuffer ? data : data.buffer;
        const dv = new DataView(buf);
        const n = Number(dv.getBigUint64(0, true));
        const off = [];
        for (let i = 0; i < n; i++) off.push(Number(dv.getBigUint64(8 * (i + 1), true)));
        const part = (i) => JSON.parse(dec.decode(new Uint8Array(buf, off[i], off[i + 1] - off[i])));
        header = part(1); parent = part(2); content = part(4); bytes = buf.byteLength; nbuf = n - 6;
      }
      const data_ = (content && content.data) || {};
      window.__klvizWire.push({t, dir, bytes, nbuf, type: header.msg_type, id: header.msg_id,
        parent: parent && parent.msg_id, kt: kernelMs(header.date), state: content && content.execution_state,
        method: data_.method, keys: data_.state ? Object.keys(data_.state).join(',') : ''});
    } catch (err) { /* not a kernel message */ }
  };
  const Native = window.WebSocket;
  class Recorded extends Native {
    constructor(...args) { super(...args); this.addEventListener('message', (e) => note('in', e.data)); }
    send(data) { note('out', data); return super.send(data); }
  }
  window.WebSocket = Recorded;
})();
"""

# Resolves with ms from the last keydown to the moment the panel shows its answer: the new frame
# loaded (the last one given to the image seen inside `panel`, or one drawn on a canvas there), or an
# image loaded beneath brought to the top; a press that leaves the frame as it was (the same pixels
# send nothing) is answered by its new readout.
# For the baseline (`before` not null): until `panel`'s `.klviz-echo` shows text other than `before`.
WAIT_FOR_FRAME = """
async ([selector, before, timeoutMs]) => {
  const panel = document.querySelector(selector);
  const start = performance.now();
  while (performance.now() - start < timeoutMs) {
    const t0 = window.__klvizKeyAt;
    if (t0 !== null) {
      if (before === null) {
        const srcs = window.__klvizSrc.filter(e => e.t >= t0 && e.top && panel.contains(e.el));
        const shown = window.__klvizFrames.filter(f => f.t >= t0 && panel.contains(f.canvas));
        const last = srcs[srcs.length - 1];
        const f = last ? shown.find(f => f.t >= last.t && f.canvas === last.el)
                       : shown.find(f => f.canvas.tagName !== 'IMG');
        if (f) return f.t - t0;
        const raised = window.__klvizRaised.find(e => e.t >= t0 && panel.contains(e.el));
        if (raised && !last) return raised.t - t0;
        const text = window.__klvizReadout.find(e => e.t >= t0 && panel.contains(e.el));
        if (text && !last) return text.t - t0;
      } else {
        const e = window.__klvizEcho.find(e => e.t >= t0 && panel.contains(e.el) && e.text !== before);
        if (e) return e.t - t0;
      }
    }
    await new Promise(r => {
      window.__klvizWaiters.push(r);
      setTimeout(r, Math.max(1, timeoutMs - (performance.now() - start)));
    });
  }
  return null;
}
"""

# Where one press's time went, from the messages RECORD_WIRE noted (ms, performance.now() scale).
BREAKDOWN = """
([selector, total]) => {
  const t0 = window.__klvizKeyAt, wire = window.__klvizWire;
  const outs = wire.filter(m => m.dir === 'out' && m.t >= t0 && m.type === 'comm_msg');
  if (!outs.length) return null;
  const ids = new Set(outs.map(m => m.id));
  const replies = wire.filter(m => m.dir === 'in' && ids.has(m.parent));
  const busy = replies.find(m => m.type === 'status' && m.state === 'busy');
  const updates = replies.filter(m => m.type === 'comm_msg' && m.method === 'update');
  // the answer: the first update carrying a binary buffer (the frame) or raising an image beneath
  // (frames sent beneath later, while the kernel idles, come after it); the baseline: the HTML's value
  const main = updates.find(m => m.nbuf > 0 || m.keys === 'order') || updates.find(m => m.keys === 'value');
  if (!busy || !main) return null;
  const end = t0 + total;
  const panel = document.querySelector(selector);
  const raised = main.keys === 'order';
  const set = raised ? window.__klvizRaised.find(e => e.t >= main.t && panel.contains(e.el))
                     : (window.__klvizSrc || []).find(e => e.t >= main.t && e.top && panel.contains(e.el));
  return {slider: outs[0].t - t0, to_kernel: busy.kt - outs[0].t, kernel: main.kt - busy.kt,
          to_page: main.t - main.kt, in_page: end - main.t, kb: main.bytes / 1024,
          to_src: set ? set.t - main.t : NaN, src_load: set ? end - set.t : NaN, raised,
          unloaded: raised && !!set && !set.loaded,
          messages: replies.filter(m => m.type === 'comm_msg' && m.t <= end).length};
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
    nb = {
        "nbformat": 4,
        "nbformat_minor": 5,
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
        "cells": [
            {"cell_type": "code", "id": f"c{i}", "metadata": {}, "execution_count": None, "outputs": [], "source": src}
            for i, src in enumerate(cells)
        ],
    }
    path = folder / "panel_latency.ipynb"
    path.write_text(json.dumps(nb, indent=1))
    return path


def measure(
    page,
    selector: str,
    handle_selector: str,
    changes: int,
    echo: bool,
    timeout_ms: int,
    parts: list[dict] | None = None,
    pattern: str = "walk",
    pause_ms: int = 150,
) -> list[float]:
    """Press the arrow keys ``changes`` times; ms from each keydown to its frame (or the new text).

    ``pattern`` "walk": keep going one way (right first) and turn at the slider's end, so that every
    press but those next to a turn goes to a position the panel has not shown since it was built;
    "alternate": one step right, one step back. With ``parts`` (a list), where each press's time
    went is appended to it (see BREAKDOWN)."""
    handle = page.locator(f"{selector} {handle_selector}").first
    handle.scroll_into_view_if_needed()
    handle.focus()
    page.wait_for_timeout(300)
    out = []
    right = True
    for i in range(changes):
        before = (
            page.evaluate("s => document.querySelector(s + ' .klviz-echo').textContent", selector) if echo else None
        )
        if pattern == "walk":
            now, lo, hi = (float(handle.get_attribute(f"aria-value{k}") or "nan") for k in ("now", "min", "max"))
            right = (now < hi) if right else not (now > lo)
        else:
            right = i % 2 == 0
        page.evaluate("window.__klvizKeyAt = null")
        page.keyboard.press("ArrowRight" if right else "ArrowLeft")
        ms = page.evaluate(WAIT_FOR_FRAME, [selector, before, timeout_ms])
        if ms is None:
            raise RuntimeError(f"{selector}: press {i + 1} drew no frame within {timeout_ms} ms")
        out.append(ms)
        page.wait_for_timeout(pause_ms)  # the reader's pause before the next press
        if parts is not None:
            part = page.evaluate(BREAKDOWN, [selector, ms])
            if part:
                part.update(panel_times(page, selector))
                parts.append(part)
    return out


_STATUS_TIMES = re.compile(r"compute ([0-9.]+) ms(?: · redraw ([0-9.]+) ms)?")


@functools.cache
def _ready_notes() -> re.Pattern[str]:
    """The status notes of a press whose frame was ready: drawn ahead whole, or kept (not finished)."""
    from klviz.widgets.ahead import NOTES  # imported when needed: --help stays quick

    return re.compile("|".join(re.escape(NOTES[how]) for how in ("drawn ahead", "kept")))


def panel_times(page, selector: str) -> dict[str, float]:
    """The panel's own compute and redraw times for the last press, as its status line shows them."""
    status = page.locator(f"{selector} .klviz-status")
    text = status.first.inner_text() if status.count() else ""
    found = _STATUS_TIMES.search(text)
    if not found:
        return {}
    ahead = bool(_ready_notes().search(text))
    return {"compute": float(found.group(1)), "redraw": float(found.group(2) or "nan"), "ahead": ahead}


#: the columns of --breakdown: (key in BREAKDOWN's result, heading)
PARTS = [
    ("slider", "key->sent"),
    ("to_kernel", "->kernel"),
    ("kernel", "kernel"),
    ("compute", "(compute"),
    ("redraw", "redraw)"),
    ("to_page", "->page"),
    ("in_page", "page"),
    ("to_src", "(->src"),
    ("src_load", "load)"),
    ("kb", "kB"),
    ("messages", "msgs"),
    ("ahead", "ready"),
    ("raised", "on page"),
    ("unloaded", "unloaded"),
]


def breakdown_row(name: str, parts: list[dict]) -> list[str]:
    row = [name]
    for key, _ in PARTS:
        values = [p[key] for p in parts if key in p and p[key] == p[key]]
        if key in ("ahead", "raised", "unloaded"):  # how many presses found their frame ready (on the page), of all
            row.append(f"{sum(values)}/{len(parts)}" if values else "-")
            continue
        row.append(f"{median(values):.1f}" if values else "-")
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument(
        "--device",
        default=None,
        help="build the panels on this device (default: the notebook's, the GPU when there is one)",
    )
    parser.add_argument("--changes", type=positive_int, default=30, help="key presses per panel")
    parser.add_argument("--only", nargs="*", default=None, metavar="CLASS", help="only these panels")
    parser.add_argument(
        "--control",
        nargs="*",
        default=[],
        metavar="PANEL=CONTROL",
        help="the slider to move in a panel (default: its first)",
    )
    parser.add_argument("--timeout", type=positive_int, default=30_000, help="ms to wait for one frame")
    parser.add_argument("--screenshots", action="store_true", help="save each panel to build/browser-bench/")
    parser.add_argument(
        "--breakdown",
        action="store_true",
        help="also print where each press's time went (from the kernel messages' timestamps)",
    )
    parser.add_argument(
        "--pattern",
        choices=["walk", "alternate"],
        default="walk",
        help="walk: one way to the slider's end and back (new positions); alternate: one step and back",
    )
    parser.add_argument("--pause", type=positive_int, default=150, help="ms from a press's frame to the next press")
    parser.add_argument(
        "--no-draw-ahead",
        action="store_true",
        help="compute every press (KLVIZ_NO_DRAW_AHEAD=1 in the kernel): the panels' cost without drawing ahead",
    )
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
    print(
        f"   JupyterLab + headless Chromium · {os.cpu_count()} CPUs · load average "
        + " ".join(f"{v:.2f}" for v in os.getloadavg())
    )
    print(
        f"   changes {args.changes} per panel · panels {len(names)} · pattern {args.pattern} · pause {args.pause} ms"
        f" · drawing ahead {'off' if args.no_draw_ahead else 'on'}"
    )
    if args.no_draw_ahead:
        os.environ["KLVIZ_NO_DRAW_AHEAD"] = "1"  # the lab server's kernels inherit it
    else:
        os.environ.pop("KLVIZ_NO_DRAW_AHEAD", None)
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as pw:
        root, home = Path(tmp) / "root", Path(tmp) / "home"
        root.mkdir()
        home.mkdir()
        nb = write_notebook(root, names, args.device)
        with running_lab(root, home) as lab:
            browser = pw.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_FLAGS)
            page = browser.new_context(viewport={"width": 1280, "height": 1100}).new_page()
            page.add_init_script(RECORD_FRAMES)
            if args.breakdown:
                page.add_init_script(RECORD_WIRE)
            t0 = time.perf_counter()
            sys.path.insert(0, str(ROOT / "tests" / "browser"))
            from helpers import open_and_run

            open_and_run(page, lab, nb.name)
            print(f"   notebook ran in {time.perf_counter() - t0:.1f} s")
            parts: dict[str, list[dict]] = {}

            def measure_baseline(changes: int) -> list[float]:
                return measure(
                    page,
                    ".klviz-baseline",
                    ".noUi-handle",
                    changes,
                    True,
                    args.timeout,
                    parts.setdefault(BASELINE, []) if args.breakdown else None,
                    args.pattern,
                    args.pause,
                )

            # the baseline in blocks: one before the panels, then one before each panel, pooled; a
            # single block at the start moved by 19-26 ms between runs of the same script
            baseline = measure_baseline(args.changes)
            block = max(5, args.changes // 3)
            results: list[tuple[str, str, list[float] | str]] = []  # (panel, control, times or failure)
            for i, name in enumerate(names):
                selector = f".klviz-bench-{i}"
                control = controls.get(name) or ""
                handle = f".klviz-{control.replace('_', '-')} .noUi-handle" if control else ".noUi-handle"
                if page.locator(f"{selector} {handle}").count() == 0:
                    results.append((name, control, "no slider"))
                    continue
                baseline += measure_baseline(block)
                try:
                    times = measure(
                        page,
                        selector,
                        handle,
                        args.changes,
                        False,
                        args.timeout,
                        parts.setdefault(name, []) if args.breakdown else None,
                        args.pattern,
                        args.pause,
                    )
                except RuntimeError as err:
                    results.append((name, control, f"NO FRAME: {str(err)[:40]}"))
                    continue
                results.append((name, control, times))
                if args.screenshots:
                    shots.mkdir(parents=True, exist_ok=True)
                    page.locator(selector).screenshot(path=str(shots / f"{name}.png"))
            base_med = median(baseline)
            rows = [[BASELINE, f"{base_med:.1f}", f"{p95(baseline):.1f}", "1.00", f"{len(baseline)} presses", ""]]
            missed = False
            for name, control, got in results:
                if isinstance(got, str):
                    rows.append([name, got.split(":")[0], "", "", control, got.partition(": ")[2]])
                    missed = missed or got.startswith("NO FRAME")
                    continue
                ok = median(got) <= TARGET_RATIO * base_med and p95(got) <= TARGET_P95_MS
                missed = missed or not ok
                rows.append(
                    [
                        name,
                        f"{median(got):.1f}",
                        f"{p95(got):.1f}",
                        f"{median(got) / base_med:.2f}",
                        control or "first slider",
                        "ok" if ok else "OVER TARGET",
                    ]
                )
            browser.close()
    print_table(
        [
            "panel",
            "median ms",
            "p95 ms",
            "median / baseline",
            "slider moved",
            f"<= {TARGET_RATIO:g}x / {TARGET_P95_MS:.0f} ms",
        ],
        rows,
    )
    if args.breakdown:
        print(
            "\n== where the time went (medians, ms): key->sent = the slider's own handling until the"
            " message leaves the page;\n   ->kernel = until the kernel starts on it; kernel = until it sends"
            " the frame (the HTML text for the\n   baseline); (compute redraw) = what the frame took to make"
            " (its status line), spent while the kernel\n   idled for a frame drawn ahead; ->page = until that"
            " message reaches the page; page = until the frame has\n   loaded (the text is shown), of which"
            " (->src load) = until the page gives the image its new frame, then\n   until it has loaded;"
            " ready = presses whose frame was drawn ahead or kept; on page = of those, presses answered\n   by"
            " raising the frame, loaded beneath the one seen while the kernel idled (kB: the raise's message);"
            " unloaded = of those, raised before\n   its frame had loaded (the page showed that image's"
            " previous frame until it had)."
            " ->kernel\n   and ->page compare the kernel's clock (header.date) with the page's, so they share an"
            " offset of a few ms;\n   their sum does not."
        )
        print_table(["panel"] + [h for _, h in PARTS], [breakdown_row(n, v) for n, v in parts.items()])
    print("   load average at the end " + " ".join(f"{v:.2f}" for v in os.getloadavg()))
    return 1 if args.strict and missed else 0


if __name__ == "__main__":
    sys.exit(main())
