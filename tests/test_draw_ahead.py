"""Drawing ahead (klviz.widgets.ahead): frames prepared while the kernel idles are the frames an update makes.

A panel in a live kernel prepares the positions one step either side of the reader's; a step there is
answered with the kept frame. These tests run each panel inside an asyncio loop of its own, in a thread
of its own (pytest may already run one: Playwright's), standing in for the kernel's,
let it idle, step to a prepared position, and compare what the page would get with what a panel that
computes the same setting from scratch shows: the readout exactly, the numbers exactly, the pixels
as blitting allows (tests/test_panel_frames.py's criterion).
"""

from __future__ import annotations

import asyncio
import base64
import io
import threading
import time

import ipywidgets as widgets
import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from PIL import Image

import klviz.widgets as W
from klviz.widgets import ahead, stack
from klviz.widgets.ahead import neighbours, same_values
from klviz.widgets.base import Panel
from klviz.widgets.frames import frame_url

DRAWING_AHEAD = [name for name in W.PANELS if getattr(W, name).draw_ahead]


@pytest.fixture
def kernel(monkeypatch):
    """As if in an IPython kernel: panels draw ahead in the loop that :func:`in_loop` runs."""
    monkeypatch.setattr(ahead, "in_kernel", lambda: True)


def in_loop(main):
    """Run the coroutine function ``main`` in a fresh event loop on a thread of its own; its result."""
    out: dict = {}

    def target():
        try:
            out["result"] = asyncio.run(main())
        except BaseException as err:  # noqa: BLE001 - raised again in the test's thread
            out["error"] = err

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(120)
    assert not thread.is_alive(), "the loop did not finish"
    if "error" in out:
        raise out["error"]
    return out.get("result")


async def idle(panel: Panel, timeout: float = 20.0) -> None:
    """Let the loop turn until the panel has nothing left to draw ahead."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    await asyncio.sleep(0)
    while panel._ahead.pending:
        assert loop.time() < end, "drawing ahead did not finish"
        await asyncio.sleep(0.005)


async def settled(panel: Panel, timeout: float = 20.0) -> None:
    """Until every frame sent to the page beneath has been there :data:`stack.SETTLE_S`: what a step
    checks before it raises a frame instead of sending it (``FrameStack.bring_up``)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    frames = panel._stack
    while any(
        key is not None and time.perf_counter() - sent < stack.SETTLE_S
        for key, sent in zip(frames._keys, frames._sent_at)
    ):
        assert loop.time() < end, "the frames beneath never settled"
        await asyncio.sleep(0.005)


def keys_of(msg: dict) -> tuple[str, ...]:
    """The keys a widget's update message sets (binary values travel as buffers, named by path)."""
    return tuple(sorted([*msg.get("state", {}), *(path[0] for path in msg.get("buffer_paths", []))]))


def record_messages(panel: Panel) -> list[tuple[str, tuple[str, ...]]]:
    """From now on, each message the panel's figure and text send: (what, the keys of its state)."""
    sent: list[tuple[str, tuple[str, ...]]] = []
    parts = [("text", panel.text)]
    parts += [(what, w) for image in panel._stack.images for what, w in (("image", image), ("layout", image.layout))]
    for what, w in parts:
        w._send = lambda msg, buffers=None, _what=what: sent.append((_what, keys_of(msg)))
    return sent


def decoded(url: bytes) -> np.ndarray:
    head, _, body = bytes(url).partition(b",")
    assert head in (b"data:image/webp;base64", b"data:image/png;base64"), head
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(body))).convert("RGBA")).astype(np.int16)


def pixels(png: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGBA")).astype(np.int16)


def test_neighbours_of_each_kind_of_control():
    s = widgets.FloatSlider(value=0.5, min=0.0, max=1.0, step=0.25)
    assert neighbours(s) == [0.75, 0.25] and neighbours(s, -1) == [0.25, 0.75]
    s.value = 1.0
    assert neighbours(s) == [0.75]  # nothing beyond the end
    i = widgets.IntSlider(value=3, min=0, max=3)
    assert neighbours(i, -1) == [2] and all(type(v) is int for v in neighbours(i))
    log = widgets.FloatLogSlider(value=1.0, base=10, min=-1, max=1, step=0.5)
    assert np.allclose(neighbours(log), [10**0.5, 10**-0.5])
    sel = widgets.SelectionSlider(options=[("a", 1), ("b", 2), ("c", 3)], value=2)
    assert neighbours(sel) == [3, 1] and neighbours(sel, -1) == [1, 3]
    drop = widgets.Dropdown(options=["x", "y"], value="x")
    assert neighbours(drop) == ["y"]
    assert neighbours(widgets.Checkbox(value=True)) == [False]
    assert neighbours(widgets.BoundedIntText(value=0, min=0, max=9)) == [1]
    assert neighbours(widgets.Text(value="k3")) == []


def test_same_values_forgives_the_last_bits_of_a_float_only():
    assert same_values({"x": 0.1 + 0.05, "n": 4}, {"x": 0.15, "n": 4})
    assert not same_values({"x": 0.15}, {"x": 0.1501})
    assert not same_values({"n": 4}, {"n": 5})
    assert not same_values({"flag": True}, {"flag": 1})
    assert not same_values({"x": 0.1}, {"x": 0.1, "y": 1})


def test_frames_drawn_ahead_are_sent_losslessly():
    rng = np.random.default_rng(0)
    rgba = rng.integers(0, 256, size=(37, 53, 4), dtype=np.uint8)
    rgba[..., 3] = 255
    from klviz.widgets.frames import encode_png

    url = frame_url(rgba, encode_png(rgba))
    assert url.startswith(b"data:image/webp;base64,")  # Pillow here has WebP
    assert np.array_equal(decoded(url), rgba)
    clear = rgba.copy()
    clear[0, 0, 3] = 0  # not opaque: WebP is not used (the page gets the PNG)
    assert np.array_equal(decoded(frame_url(clear, encode_png(clear))), clear)


def test_nothing_is_drawn_ahead_outside_a_kernel():
    def steps():
        panel = W.GaussianEstimatorsPanel()
        panel.set(mu=panel.controls["mu"].value + 0.05)
        panel.set(mu=panel.controls["mu"].value - 0.05)
        return panel

    async def with_a_loop():  # an event loop running is not a kernel (Playwright runs one in tests)
        panel = steps()
        assert not panel._ahead.pending  # nothing was even scheduled for the loop's idle turns
        await asyncio.sleep(0)
        return panel

    for panel in (steps(), in_loop(with_a_loop)):
        assert panel._ahead.made == 0 and panel._ahead.used == 0 and panel._ahead.kept == []


def test_panels_that_train_do_not_draw_ahead():
    assert not W.RLHFLabPanel.draw_ahead and not W.MismatchTrainingPanel.draw_ahead
    assert set(W.PANELS) - set(DRAWING_AHEAD) == {"RLHFLabPanel", "MismatchTrainingPanel"}


@pytest.mark.parametrize("name", DRAWING_AHEAD)
def test_a_step_to_a_position_drawn_ahead_shows_what_computing_it_shows(name, kernel):
    async def run():
        panel = getattr(W, name)()
        control = panel.first_slider()
        assert control is not None
        await idle(panel)
        assert panel._ahead.made >= 1, "nothing was drawn ahead after the panel was built"
        shown_url, shown_readout = panel._image.value, panel.readout.value
        assert panel._figure_current  # the artists were put back after drawing ahead
        await settled(panel)  # the frames sent beneath have had time to load
        sent = record_messages(panel)
        steps = [neighbours(panel.controls[control])[0]]
        for value in steps:
            panel.controls[control].value = value  # as the reader's slider does
            assert panel._ahead.used == 1, "the step was computed, not answered from the frame drawn ahead"
            assert "drawn ahead" in panel.status.value
            assert panel._image.value != shown_url and panel.readout.value != shown_readout
            # the frame was on the page already, beneath: the step raised it and sent no frame
            assert panel._stack.raised == 1
            assert sent == [("layout", ("order",)), ("text", ("value",))], sent
            await idle(panel)
        return panel

    panel = in_loop(run)
    fresh = getattr(W, name)()
    fresh.set(**panel.values())  # the same setting, computed and drawn in full
    assert panel.readout.value == fresh.readout.value
    assert panel.last.keys() == fresh.last.keys()
    for key, value in fresh.last.items():
        got = panel.last[key]
        if isinstance(value, (float, int, np.ndarray)) or hasattr(value, "numpy"):
            assert np.array_equal(np.asarray(got), np.asarray(value), equal_nan=True), key
    sent, full = decoded(panel._image.value), pixels(fresh.frame_png)
    assert sent.shape == full.shape
    differing = float((np.abs(sent - full).max(-1) > 40).mean())
    assert differing < 0.005, f"{name}: {100 * differing:.2f}% of pixels differ from the frame computed in full"
    assert np.array_equal(decoded(panel._image.value), pixels(panel.frame_png))  # WebP and PNG: same pixels


class _Refuses(Panel):
    """x above 0.5 raises: a position that cannot be computed is not kept, and the step shows its error."""

    title = "refuses"

    def make_controls(self):
        return {"x": widgets.FloatSlider(value=0.5, min=0.0, max=1.0, step=0.25)}

    def make_figure(self):
        fig = Figure(figsize=(2, 1), dpi=50)
        FigureCanvasAgg(fig)
        self.line = fig.add_subplot().plot([0, 1], [0, 0])[0]
        return fig

    def compute(self, x):
        if x > 0.5:
            raise ValueError(f"x = {x} is too large")
        return {"x": x}

    def draw(self, data):
        self.line.set_ydata([0, data["x"]])
        self.readout.value = f"x = {data['x']}"


def test_a_position_that_raises_is_not_kept_and_its_step_shows_the_error(kernel):
    async def run():
        panel = _Refuses()
        await idle(panel)
        # the position built (0.5) and one neighbour: 0.75 raised while drawn ahead
        assert [p.values["x"] for p in panel._ahead.kept] == [0.5, 0.25]
        assert panel.readout.value == "x = 0.5" and panel.error.value == ""  # nothing reached the page
        panel.controls["x"].value = 0.75
        assert isinstance(panel.last_error, ValueError) and "too large" in panel.error.value
        panel.controls["x"].value = 0.25  # not next to 0.75's neighbours any more: computed again
        assert panel.last_error is None and panel.readout.value == "x = 0.25"

    in_loop(run)


def test_drawing_ahead_can_be_turned_off(monkeypatch, kernel):
    monkeypatch.setenv("KLVIZ_NO_DRAW_AHEAD", "1")

    async def run():
        panel = W.BregmanPanel()
        await idle(panel)
        panel.controls["r"].value = neighbours(panel.controls["r"])[0]
        await idle(panel)
        return panel

    panel = in_loop(run)
    assert panel._ahead.made == 0 and panel._ahead.used == 0


def test_quick_changes_draw_ahead_only_the_way_the_reader_goes(kernel):
    async def run():
        panel = W.BregmanPanel()
        await idle(panel)
        r = panel.controls["r"]
        for _ in range(3):  # a key held down: each change well within QUICK_S of the last
            r.value = neighbours(r, 1)[0]
        assert panel._ahead.quick
        up = dict(panel.values(), r=neighbours(r, 1)[0])
        made = panel._ahead.made
        await idle(panel)
        assert panel._ahead.made == made + 1 and panel._ahead.take(up) is not None
        assert ahead.QUICK_S > 0

    in_loop(run)


def test_a_position_half_drawn_is_dropped_when_the_figure_is_touched(kernel):
    """Drawing ahead goes in pieces, one per turn of the loop; whatever touches the figure in
    between (here a saved picture, which puts the artists back) drops the position half drawn,
    so no kept frame shows anything but its own values."""

    async def run():
        panel = W.GaussianEstimatorsPanel()
        loop = asyncio.get_running_loop()
        end = loop.time() + 20
        while panel._ahead._work is None or panel._figure_current:  # until its artists have moved
            assert loop.time() < end, "drawing ahead did not start"
            await asyncio.sleep(0)
        made = panel._ahead.made
        shown = panel.png()  # between two pieces
        assert panel._ahead._work is None and panel._figure_current
        await idle(panel)
        # the dropped position was drawn again from its start, then the other neighbour (kept with
        # the position built)
        assert panel._ahead.made == made + 2 and len(panel._ahead.kept) == 3
        return panel, shown

    panel, shown = in_loop(run)
    assert np.array_equal(pixels(shown), pixels(panel.png()))  # the picture showed the reader's position
    for prepared in panel._ahead.kept:
        fresh = W.GaussianEstimatorsPanel()
        fresh.set(**prepared.values)
        differing = float((np.abs(decoded(prepared.url) - pixels(fresh.frame_png)).max(-1) > 40).mean())
        assert differing < 0.005, prepared.values
        assert prepared.readout == fresh.readout.value


def test_a_step_to_the_position_being_drawn_ahead_finishes_it(kernel):
    """The reader arrives while their next position is half drawn: the pieces left are done then,
    and the step shows exactly what computing that setting shows."""

    async def run():
        panel = W.GaussianEstimatorsPanel()
        loop = asyncio.get_running_loop()
        end = loop.time() + 20
        while panel._ahead._work is None or panel._figure_current:  # its artists have moved, no more
            assert loop.time() < end, "drawing ahead did not start"
            await asyncio.sleep(0)
        target, made = dict(panel._ahead._work_values), panel._ahead.made
        (name,) = [k for k, v in target.items() if v != panel.values()[k]]
        panel.controls[name].value = target[name]  # as the reader's slider does
        assert panel._ahead.used == 1 and panel._ahead.made == made + 1
        assert "drawn ahead in part, finished now" in panel.status.value
        await idle(panel)
        return panel

    panel = in_loop(run)
    fresh = W.GaussianEstimatorsPanel()
    fresh.set(**panel.values())
    assert panel.readout.value == fresh.readout.value
    differing = float((np.abs(decoded(panel._image.value) - pixels(fresh.frame_png)).max(-1) > 40).mean())
    assert differing < 0.005


def test_the_webp_is_encoded_off_the_loop_and_a_step_does_not_wait_for_it(kernel, monkeypatch):
    """The last piece, the frame's WebP, runs on the encoder's thread: while it runs the loop is free,
    and a step to that position is answered with the same pixels as a PNG at once, without waiting
    for the encoder (here held until the step is done: a step that waited would find the encoder
    still held, and its frame would be a WebP)."""
    release, started, encoded = threading.Event(), threading.Event(), threading.Event()
    real = ahead._timed_frame_url

    def held(rgba, png):
        started.set()
        release.wait(30)
        try:
            return real(rgba, png)
        finally:
            encoded.set()

    monkeypatch.setattr(ahead, "_timed_frame_url", held)
    monkeypatch.setattr(ahead, "WEBP_FRAMES", True)  # KLVIZ_WEBP_FRAMES=1

    async def run():
        panel = W.GaussianEstimatorsPanel()
        loop = asyncio.get_running_loop()
        end = loop.time() + 20
        while not started.is_set():
            assert loop.time() < end, "drawing ahead never reached the WebP"
            await asyncio.sleep(0.001)
        for _ in range(5):  # the loop turns while the encoder works (an encoder on this thread would block it)
            await asyncio.sleep(0)
        turned_while_encoding = not encoded.is_set()
        target = dict(panel._ahead._work_values)
        (name,) = [k for k, v in target.items() if v != panel.values()[k]]
        panel.controls[name].value = target[name]  # as the reader's slider does
        answered_while_encoding = not encoded.is_set()
        release.set()
        await idle(panel)
        return panel, turned_while_encoding, answered_while_encoding

    try:
        panel, turned_while_encoding, answered_while_encoding = in_loop(run)
    finally:
        release.set()
    assert turned_while_encoding and answered_while_encoding
    assert "drawn ahead in part, finished now" in panel.status.value
    assert bytes(panel._image.value).startswith(b"data:image/png;base64,")
    fresh = W.GaussianEstimatorsPanel()
    fresh.set(**panel.values())
    assert panel.readout.value == fresh.readout.value
    differing = float((np.abs(decoded(panel._image.value) - pixels(fresh.frame_png)).max(-1) > 40).mean())
    assert differing < 0.005


def test_a_walk_raises_the_frames_beneath_and_each_shows_its_own_position(kernel):
    """Walking a slider (four steps up, three back): each step lands on a frame sent beneath while
    the kernel idled; the three images are reused, and each step shows the pixels of its setting."""
    steps = [1, 1, 1, 1, -1, -1, -1]

    async def run():
        panel = W.BregmanPanel()
        control = panel.first_slider()
        shown = []
        for toward in steps:
            await idle(panel)
            await settled(panel)
            before = panel._stack.raised
            panel.controls[control].value = neighbours(panel.controls[control], toward)[0]
            assert panel._stack.raised == before + 1, f"step {len(shown) + 1} was sent its frame"
            shown.append((panel.values(), bytes(panel._image.value), panel.readout.value))
        return panel, shown

    panel, shown = in_loop(run)
    assert len(panel._stack.images) == ahead.KEEP
    # by default a frame drawn ahead is the PNG already made (no WebP encoder's memory: see frame_url)
    assert all(url.startswith(b"data:image/png;base64,") for _, url, _ in shown) or ahead.WEBP_FRAMES
    fresh = W.BregmanPanel()
    for values, url, readout in shown:
        fresh.set(**values)
        assert readout == fresh.readout.value
        differing = float((np.abs(decoded(url) - pixels(fresh.frame_png)).max(-1) > 40).mean())
        assert differing < 0.005, f"{values}: {100 * differing:.2f}% of pixels differ"


def test_a_step_before_the_frame_beneath_has_settled_is_sent_its_frame(kernel, monkeypatch):
    """A frame sent beneath may not have loaded yet: a step there sooner than SETTLE_S sends it again."""
    monkeypatch.setattr(stack, "SETTLE_S", 3600.0)

    async def run():
        panel = W.BregmanPanel()
        control = panel.first_slider()
        await idle(panel)
        sent = record_messages(panel)
        panel.controls[control].value = neighbours(panel.controls[control])[0]
        return panel, sent

    panel, sent = in_loop(run)
    assert panel._ahead.used == 1 and panel._stack.raised == 0
    assert sent[0] == ("image", ("value",)) and ("layout", ("order",)) not in sent, sent


def test_a_step_back_to_the_first_position_raises_its_frame(kernel):
    """The position a panel was built at stays on the page beneath: one step away and back is two raises,
    and the step back shows the first frame's pixels."""

    async def run():
        panel = W.BregmanPanel()
        control = panel.first_slider()
        first = (panel.values(), panel.frame_png, panel.readout.value)
        for toward in (1, -1):
            await idle(panel)
            await settled(panel)
            panel.controls[control].value = neighbours(panel.controls[control], toward)[0]
        return panel, first

    panel, (values, png, readout) = in_loop(run)
    assert panel._stack.raised == 2 and same_values(panel.values(), values)
    assert panel.readout.value == readout
    assert np.array_equal(decoded(panel._image.value), pixels(png))
