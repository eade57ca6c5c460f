"""Drawing ahead: the frames one step either side of the reader's position, made while the kernel idles.

A reader moves a slider one step at a time (an arrow key, a slow drag). Measured in JupyterLab with
headless Chromium on a 2-core machine, the kernel's share of such a step was 1.4-2x what the same
update takes in a loop: between two key presses the CPU idles, and the next update starts with cold
caches. So after each update, once the frame has left, a panel in a live kernel renders the
positions one step away along the control the reader moved last (the direction of travel first),
in pieces (compute, artists, render, PNG, one per turn of the kernel's event loop, so that a change
arriving meanwhile waits for one piece at most; with ``KLVIZ_WEBP_FRAMES=1`` then a lossless WebP,
encoded on a thread of its own, see :func:`klviz.widgets.frames.frame_url`), and keeps each frame
with its readout. Each frame drawn ahead is sent to the page at once, to an image
beneath the one seen (:mod:`klviz.widgets.stack`). A change to one of those positions is answered by
raising that image, with no frame to send, compute or draw (or with the kept frame, if the page has not
had it for long); a change to the position being drawn finishes it (with the PNG, if a WebP is not
ready); any other change is computed as before, and a kept frame is dropped as soon as the reader is
no longer next to it.

Nothing here runs outside an IPython kernel (a script, a test, even one with an event loop of its
own running, such as Playwright's) or in static mode, and a panel that trains in the background
(``start_background``) does not draw ahead. ``KLVIZ_NO_DRAW_AHEAD=1`` turns it off, for comparison.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import threading
import time
from collections.abc import Generator, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..messages import N_, tr
from .frames import WEBP_FRAMES, frame_url, png_url

if TYPE_CHECKING:
    from .base import Panel

__all__ = ["NOTES", "DrawAhead", "Prepared", "neighbours", "same_values"]

#: seconds to wait after an update before drawing ahead. The frame, readout and status messages
#: leave through the kernel's IOPub thread, which needs the interpreter lock the drawing would hold.
#: When every step sent its frame, the drawing also took the CPU the page needed to load it (a
#: frame's load took 6-10 ms (median) when drawing ahead began after 20 ms, 5-7 ms after 80), so it
#: waited 80 ms. Now most steps only raise a frame already on the page, and a frame drawn sooner
#: is ready for more steps: alternating 80 and 40 ms over three blocks of four panels (JupyterLab,
#: 150 ms between presses), 40 ms found the frame on the page in 317 of 360 presses against 287,
#: with median ratios to the round trip 0.10 ± 0.05 lower (mean ± SE over blocks)
START_AFTER_S = 0.04
#: prepared positions kept: the two neighbours of the reader's position and the position itself
KEEP = 3
#: seconds between two pieces of drawing ahead (compute, artists, render, PNG; then, while a WebP
#: is encoded on its thread, between two looks at it): a reader's change that arrives meanwhile is
#: handled first, and waits for one piece at most
PAUSE_S = 0.001
#: with KLVIZ_WEBP_FRAMES=1 the last piece, a frame's lossless WebP (10-16 ms a frame here, the
#: longest piece but a new view's render), runs on this thread: Pillow releases the interpreter lock
#: while it encodes, so a reader's change that arrives meanwhile is answered at once
_ENCODER: ThreadPoolExecutor | None = None
_ENCODER_LOCK = threading.Lock()


def _encoder() -> ThreadPoolExecutor:
    global _ENCODER
    with _ENCODER_LOCK:
        if _ENCODER is None:
            _ENCODER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="klviz-encode")
        return _ENCODER


def _timed_frame_url(rgba: np.ndarray, png: bytes) -> tuple[bytes, float]:
    """:func:`frame_url` and the CPU seconds the encoder's thread spent on it (not the time it
    waited for a core: the page and the kernel's main thread share them)."""
    t0 = time.thread_time()
    url = frame_url(rgba, png)
    return url, time.thread_time() - t0


#: changes closer together than this (a key held down) draw ahead only in the direction of travel:
#: each frame drawn ahead costs 20-30 ms of CPU here (100 ms and more for a view not seen before)
QUICK_S = 0.25


def in_kernel() -> bool:
    """Whether this is an IPython kernel (whose event loop idles between the reader's messages)."""
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - IPython is a dependency
        return False
    return getattr(get_ipython(), "kernel", None) is not None


def _option_values(widget: Any) -> list[Any]:
    """The values of an option widget's options (``(label, value)`` pairs or plain values)."""
    return [o[1] if isinstance(o, tuple) else o for o in widget.options]


def neighbours(widget: Any, toward: int = 1) -> list[Any]:
    """The values one step either side of ``widget``'s value that it accepts, ``toward`` first.

    ``toward`` is +1 (the step up first) or -1. Sliders step by their ``step`` (a log slider in its
    exponent), option widgets (dropdowns, selection sliders, toggle buttons) go to the next option,
    a checkbox to the other value, an integer box by one. Widgets with other values give none.
    """
    from ipywidgets import FloatLogSlider

    value = widget.value
    found: list[Any] = []
    if hasattr(widget, "options") and hasattr(widget, "index"):
        index, options = widget.index, _option_values(widget)
        if isinstance(index, int) and len(options) > 1:
            found = [options[i] for i in (index + toward, index - toward) if 0 <= i < len(options)]
        return found
    if isinstance(value, bool):
        return [not value]
    if not isinstance(value, (int, float)):
        return found
    lo, hi = getattr(widget, "min", None), getattr(widget, "max", None)
    step = getattr(widget, "step", None) or 1
    for sign in (toward, -toward):
        if isinstance(widget, FloatLogSlider):
            # as the slider steps: its value times base**step (the page's own arithmetic may differ
            # in the last bits; see same_values)
            other = value * widget.base ** (sign * step)
            inside = widget.base**lo <= other <= widget.base**hi
        else:
            other = type(value)(value + sign * step)
            inside = (lo is None or other >= lo) and (hi is None or other <= hi)
        if inside:
            found.append(other)
    return found


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, float) or isinstance(b, float):
        # the page's slider computes a step as it likes (0.1 + 0.05 or round(x / step) * step):
        # the same position may differ in the last bits
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and math.isclose(a, b, rel_tol=1e-12)
    return bool(a == b) and type(a) is type(b)


def same_values(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two settings of a panel's controls are the same position (floats to 1e-12 relative)."""
    return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)


@dataclass
class Prepared:
    """One position drawn: its values, data, frame, readout and how long it took."""

    values: dict[str, Any]
    data: dict[str, Any]
    png: bytes
    #: the ``data:`` URL the page is sent (a PNG; lossless WebP with ``KLVIZ_WEBP_FRAMES=1``, see frame_url)
    url: bytes
    readout: str
    compute_ms: float
    draw_ms: float
    blitted: bool
    #: how it came to be kept: "drawn ahead" (while the kernel idled), "finished" (drawn ahead in
    #: part, finished when the reader arrived) or "kept" (shown before)
    how: str = "drawn ahead"
    #: every pixel's alpha is 255: the frame may wait beneath the one shown (FrameStack.put_beneath)
    opaque: bool = False

    @property
    def note(self) -> str:
        """What the status line says of a position shown this way (see :data:`NOTES`)."""
        return tr(NOTES[self.how])


#: the status line's note for each way a shown position was prepared (:attr:`Prepared.how`)
NOTES = {
    "drawn ahead": N_("drawn ahead while idle"),
    "finished": N_("drawn ahead in part, finished now"),
    "kept": N_("shown before, kept"),
}


class DrawAhead:
    """A panel's prepared positions, and the kernel's idle turns that make them."""

    def __init__(self, panel: Panel) -> None:
        self.panel = panel
        self.kept: list[Prepared] = []
        self.moved: str | None = None  # the control the reader moved last
        self.toward = 1
        self.quick = False  # the last change came within QUICK_S of the one before
        self._changed_at = -math.inf
        self.made = 0  # positions drawn ahead (for tests and the benchmark)
        self.used = 0  # changes answered with one of them
        self.drawing = False  # True while a position is being drawn ahead (nothing may reach the page)
        self._handle: asyncio.TimerHandle | None = None
        #: the position being drawn, piece by piece (see _draw), and its values
        self._work: Generator[None, None, Prepared | None] | None = None
        self._work_values: dict[str, Any] = {}
        self._finishing = False  # the reader has arrived at the position being drawn (see _finish)

    @staticmethod
    def enabled() -> bool:
        """False when ``KLVIZ_NO_DRAW_AHEAD`` is set (to anything but 0)."""
        return os.environ.get("KLVIZ_NO_DRAW_AHEAD", "") in ("", "0")

    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The event loop to draw ahead in: the kernel's, when this panel draws ahead at all."""
        from .base import static_mode

        panel = self.panel
        if not (panel.draw_ahead and self.enabled()) or static_mode() or not panel._built:
            return None
        if getattr(panel, "closed", False) or not in_kernel():
            return None
        try:
            return asyncio.get_running_loop()
        except RuntimeError:  # a kernel without a running loop (an old ipykernel): nothing idles
            return None

    @property
    def pending(self) -> bool:
        """Whether drawing ahead is scheduled (the kernel will do it at its next idle turns)."""
        return self._handle is not None

    def note_change(self, change: dict[str, Any]) -> None:
        """Remember which control the reader moved, which way, and whether changes come quickly."""
        now = time.perf_counter()
        self.quick, self._changed_at = now - self._changed_at < QUICK_S, now
        owner = change.get("owner")
        for name, widget in self.panel.controls.items():
            if widget is owner:
                self.moved = name
        old, new = change.get("old"), change.get("new")
        try:
            if getattr(owner, "options", None) is not None:
                options = _option_values(owner)
                self.toward = 1 if options.index(new) >= options.index(old) else -1
            elif isinstance(new, (int, float)) and isinstance(old, (int, float)):
                self.toward = 1 if new >= old else -1
        except ValueError:
            self.toward = 1

    def take(self, values: dict[str, Any]) -> Prepared | None:
        """The position prepared for ``values``, if there is one, finished now if it was half drawn
        (never without a loop to draw in)."""
        if (not self.kept and self._work is None) or self.loop() is None:
            return None
        for prepared in self.kept:
            if same_values(prepared.values, values):
                return prepared
        if self._work is not None and same_values(self._work_values, values):
            return self._finish()
        return None

    def _finish(self) -> Prepared | None:
        """Finish the position being drawn ahead, now that the reader has arrived there (the pieces
        already done are not done again; a WebP still being encoded is not waited for: the frame
        goes as its PNG)."""
        work, self._work = self._work, None
        if work is None:
            return None
        self.drawing = self._finishing = True
        try:
            while True:
                next(work)
        except StopIteration as done:
            prepared: Prepared | None = done.value
        finally:
            self.drawing = self._finishing = False
        if prepared is not None:
            prepared.how = "finished"
        return prepared

    def keep_current(self, prepared: Prepared) -> None:
        """Keep the position just shown (the reader may step back to it; the panel's first position
        too, while it is being built: its frame stays on the page, so a first step back raises it)."""
        self.panel._stack.label(prepared)
        if self.loop() is None and self.panel._built:
            self.kept = []
            return
        self.kept = [p for p in self.kept if not same_values(p.values, prepared.values)][-(KEEP - 1) :] + [prepared]

    def stop(self) -> None:
        """Draw nothing more ahead (the panel is closed): drop what is scheduled and half drawn."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._work = None
        self.kept = []

    def plan(self) -> None:
        """After an update: schedule the neighbours of the new position for the kernel's idle turns."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._work = None  # the update drew over a position half drawn
        panel = self.panel
        loop = self.loop()
        if loop is None:
            return
        current = panel.values()
        name = self.moved if self.moved in panel.controls else panel.first_slider()
        if name is None:
            return
        steps = [dict(current, **{name: value}) for value in neighbours(panel.controls[name], self.toward)]
        targets = [values for values in steps[: 1 if self.quick else 2] if self.take(values) is None]
        # drop what is no longer one step away; keep the position shown
        near = [current] + steps
        self.kept = [p for p in self.kept if any(same_values(p.values, v) for v in near)][-KEEP:]
        if targets or not panel._figure_current:  # nothing to draw: still put the artists back
            self._handle = loop.call_later(START_AFTER_S, self._next, panel._generation, targets, loop)

    def _next(self, generation: int, targets: list[dict[str, Any]], loop: asyncio.AbstractEventLoop) -> None:
        """One piece of work per turn of the loop: a reader's change waits for one piece at most."""
        self._handle = None
        panel = self.panel
        if generation != panel._generation:
            return
        if not panel._lock.acquire(blocking=False):  # a background frame is being drawn: later
            self._handle = loop.call_later(START_AFTER_S, self._next, generation, targets, loop)
            return
        try:
            if self._work is None and targets:
                self._work, self._work_values = self._draw(targets[0]), targets[0]
            if self._work is not None:
                try:
                    self.drawing = True
                    next(self._work)
                except StopIteration as done:
                    self._work, targets = None, targets[1:]
                    if done.value is not None:
                        self.kept = (self.kept + [done.value])[-KEEP:]
                        # to the page now, beneath the frame shown: a step there only raises it
                        panel._stack.put_beneath(done.value.url, done.value, keep=self.kept, opaque=done.value.opaque)
                finally:
                    self.drawing = False
            if self._work is not None or targets:
                self._handle = loop.call_later(PAUSE_S, self._next, generation, targets, loop)
            else:
                self.restore()
        finally:
            panel._lock.release()

    def _draw(self, values: dict[str, Any]) -> Generator[None, None, Prepared | None]:
        """Compute, draw and encode ``values`` without showing them, in pieces (a generator: it
        pauses between them and returns the :class:`Prepared` position, or None if it raised: the
        reader's change will show the error). Anything that touches the figure in between (an
        update, :meth:`restore`) drops it."""
        panel = self.panel
        spent = [0.0, 0.0]  # compute, draw: the pieces' own time, not the turns in between

        def timed(i: int, piece: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return piece()
            finally:
                spent[i] += time.perf_counter() - t0

        try:
            data = timed(0, lambda: panel.compute(**values))
            yield
            panel._figure_current = False
            with self._quiet_readout():
                timed(0, lambda: panel.draw(data))
                text = panel.readout.value
            yield
            timed(1, lambda: panel._frames.render(blit=panel._blitting()))
            blitted = panel._frames.last_was_blit
            yield
            png = timed(1, panel._frames.png)
            opaque = bool((np.asarray(panel._frames.canvas.buffer_rgba())[..., 3] == 255).all())
            yield
            url: bytes | None = None
            if not self._finishing and WEBP_FRAMES:
                # a copy: the figure is drawn on while the encoder works
                rgba = timed(1, lambda: np.array(panel._frames.canvas.buffer_rgba()))
                encoding: Future[tuple[bytes, float]] = _encoder().submit(_timed_frame_url, rgba, png)
                while not (encoding.done() or self._finishing):
                    yield
                if encoding.done():
                    url, seconds = encoding.result()
                    spent[1] += seconds
            if url is None:  # the PNG (the reader may have arrived: it does not wait for a WebP)
                url = png_url(png)
        except Exception:  # noqa: BLE001 - shown by the ordinary update if the reader goes there
            return None
        self.made += 1
        return Prepared(values, data, png, url, text, spent[0] * 1e3, spent[1] * 1e3, blitted, "drawn ahead", opaque)

    def restore(self) -> None:
        """Put the figure's artists back to the position shown (drawing ahead moved them); a
        position half drawn is dropped."""
        self._work = None
        panel = self.panel
        if panel._figure_current or not panel.last:
            return
        with self._quiet_readout():
            panel.draw(panel.last)
        panel._figure_current = True

    @contextlib.contextmanager
    def _quiet_readout(self) -> Iterator[None]:
        """Let ``draw`` write the readout without the page seeing it (a stand-in while it runs)."""
        from .base import PanelText  # base imports this module

        panel = self.panel
        readout, panel.readout = panel.readout, PanelText()
        try:
            yield
        finally:
            panel.readout = readout
