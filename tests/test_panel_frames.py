"""Blitted panel frames look like full renders.

Panels redraw only the artists that changed over a cached background (klviz.widgets.frames). For every
panel in the suite, each control is moved in turn; after every update the composed frame is compared
with a full Agg render of the same figure, pixel by pixel.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

import klviz.widgets as W

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from panels import change_plan  # noqa: E402  (the benchmark's own plan: each control one step and back)

SKIP_SLOW_CONTROLS = {"RLHFLabPanel": {"steps", "epochs", "prompts", "group_size"}}  # each retrains (~1 s)


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


@pytest.mark.parametrize("name", list(W.PANELS))
def test_views_seen_before_come_back_blitted(name):
    """Two controls, each one step away and back, twice: the second time every view has been seen,
    so every frame must come from a kept background (nothing the panel does by itself, such as
    hiding and showing artists to render a layer, may look like a change)."""
    panel = getattr(W, name)()
    plan = [(c, v) for c, v in change_plan(panel, 4) if c not in SKIP_SLOW_CONTROLS.get(name, ())]
    # the RLHF lab trains a setting the first time it is shown; run alone (nothing trained by other
    # tests before), the frames of that first pass are not yet those of later passes: one pass more
    for _ in range(2 if name == "RLHFLabPanel" else 1):
        for control, value in plan:
            panel.set(**{control: value})
    for control, value in plan:
        panel.set(**{control: value})
        assert panel._frames.last_was_blit, f"{name}: {control}={value!r} was rendered again"


def test_changed_axis_limits_force_a_full_render():
    panel = W.StartHerePanel()
    panel.set(seed=1)
    panel.set(seed=2)  # new tokens, same policies: only bars and error bars move
    assert panel._frames.last_was_blit and "(blitted)" in panel.status.value
    panel.set(push=4.0)  # the KL jumps: the estimate axis must grow
    assert not panel._frames.last_was_blit
    assert "(blitted)" not in panel.status.value


def test_blitting_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("KLVIZ_NO_BLIT", "1")
    panel = W.StartHerePanel()
    panel.set(seed=1)
    panel.set(seed=2)
    assert not panel._frames.last_was_blit


# -- the pieces of the frame pipeline -------------------------------------------------------------


def test_encode_png_round_trips_exactly():
    import io

    from PIL import Image

    from klviz.widgets.frames import encode_png

    rng = np.random.default_rng(0)
    rgba = rng.integers(0, 256, size=(37, 53, 4), dtype=np.uint8)
    decoded = np.asarray(Image.open(io.BytesIO(encode_png(rgba))))
    assert decoded.shape == rgba.shape and np.array_equal(decoded, rgba)
    with pytest.raises(ValueError, match="rgba"):
        encode_png(rgba[..., :3])
    with pytest.raises(ValueError, match="rgba"):
        encode_png(rgba.astype(np.float32))


def _legend_bbox_pixels(panel):
    """Rows and columns of the panel's legends (their window extents, rounded outward)."""
    renderer = panel.fig.canvas.get_renderer()
    height = int(renderer.height)
    boxes = []
    for ax in panel.fig.axes:
        lg = ax.get_legend()
        if lg is not None:
            x0, y0, x1, y1 = lg.get_window_extent(renderer).extents
            boxes.append(
                (
                    slice(max(height - int(np.ceil(y1)), 0), height - int(np.floor(y0))),
                    slice(max(int(np.floor(x0)), 0), int(np.ceil(x1))),
                )
            )
    return boxes


@pytest.mark.parametrize("name", ["SamplingPanel", "BregmanPanel", "WorkedTokensPanel"])
def test_composited_legends_match_agg_to_rounding(name):
    """Legends are drawn once on a transparent layer and laid over each frame: inside each legend's
    box the result must equal Agg drawing the legend itself, up to 8-bit rounding."""
    panel = getattr(W, name)()
    for control, value in change_plan(panel, 4):
        panel.set(**{control: value})
        composed = np.asarray(panel.fig.canvas.buffer_rgba()).astype(np.int16).copy()
        FigureCanvasAgg.draw(panel.fig.canvas)
        full = np.asarray(panel.fig.canvas.buffer_rgba()).astype(np.int16)
        boxes = _legend_bbox_pixels(panel)
        assert boxes, f"{name} has no legend to check"
        for rows, cols in boxes:
            diff = np.abs(composed[rows, cols] - full[rows, cols])
            # the same pixels, except where a changed line runs under the legend (stacking order)
            assert np.mean(diff.max(-1) <= 2) > 0.995, (name, control, int(diff.max()))


def test_backgrounds_come_back_for_views_seen_before():
    panel = W.BregmanPanel()
    first = panel.values()["f"]
    other = next(
        o[1] if isinstance(o, tuple) else o
        for o in panel.controls["f"].options
        if (o[1] if isinstance(o, tuple) else o) != first
    )
    panel.set(f=other)
    assert not panel._frames.last_was_blit  # a new view: full render
    panel.set(f=first)  # (its limits may still be the other view's)
    for _ in range(2):
        panel.set(f=other)
        assert panel._frames.last_was_blit  # both views now come from their backgrounds
        panel.set(f=first)
        assert panel._frames.last_was_blit


def test_the_first_change_after_build_is_blitted():
    """A panel keeps its default view's background at build, so the reader's first change that
    leaves the axes alone redraws only what moved."""
    panel = W.StartHerePanel()
    panel.set(seed=1)
    assert panel._frames.last_was_blit and "(blitted)" in panel.status.value


def test_a_cached_background_is_dropped_when_an_artist_baked_into_it_changes():
    """Two views A and B; while B is shown, an artist that is part of A's background (not dynamic
    there) changes. Coming back to A must not reuse the old background."""
    from matplotlib.figure import Figure

    from klviz.widgets.frames import FrameComposer

    fig = Figure(figsize=(3, 2), dpi=50)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    (moving,) = ax.plot([0, 1], [0, 1])
    label = ax.text(0.1, 0.8, "static")
    frames = FrameComposer(fig)
    frames.render()  # first frame
    moving.set_ydata([1, 0])
    frames.render()  # view A: 'moving' is dynamic, 'label' baked in
    view_a = ax.get_ylim()
    ax.set_ylim(-1, 2)
    frames.render()  # view B
    label.set_text("changed")  # changes while B is shown ...
    frames.render()
    ax.set_ylim(view_a)
    frames.render()  # ... so A's background cannot come back
    composed = np.asarray(fig.canvas.buffer_rgba()).copy()
    FigureCanvasAgg.draw(fig.canvas)
    assert np.array_equal(composed, np.asarray(fig.canvas.buffer_rgba()))


def test_panels_share_one_budget_of_backgrounds_and_a_panel_drawn_again_is_exact():
    """Three composers, each walked through eight views in turn: together they never keep more than
    SHARED_BACKGROUNDS backgrounds, only the one drawn last keeps its PNG encoder, and a composer drawn
    again after the others gives the pixels of a full render, then blits again."""
    from matplotlib.figure import Figure

    from klviz.widgets.frames import SHARED_BACKGROUNDS, FrameComposer

    def composer() -> tuple[FrameComposer, Any, Any]:
        fig = Figure(figsize=(3, 2), dpi=50)
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        (line,) = ax.plot([0, 1], [0, 1])
        return FrameComposer(fig), ax, line

    panels = [composer() for _ in range(3)]
    for frames, ax, line in panels:
        frames.render()
        for view in range(8):
            ax.set_ylim(-view - 1, 2)  # a new view: a background each
            line.set_ydata([view, 0])
            frames.render()
            frames.png()
            kept = sum(len(f._backgrounds) for f, _, _ in panels)
            assert kept <= SHARED_BACKGROUNDS, kept
            assert frames.state in frames._backgrounds  # the view just drawn is kept, whatever the budget
            assert frames._scratch is None  # no figure-size layer buffer outlives a render
        assert len(frames._backgrounds) == min(frames.max_backgrounds, SHARED_BACKGROUNDS)
        assert [f._encoder is not None for f, _, _ in panels if f is not frames] == [False, False]
    frames, ax, line = panels[0]
    line.set_ydata([0.5, 0.5])
    frames.render()
    composed = np.asarray(frames.fig.canvas.buffer_rgba()).copy()
    FigureCanvasAgg.draw(frames.fig.canvas)
    assert np.array_equal(composed, np.asarray(frames.fig.canvas.buffer_rgba()))
    line.set_ydata([0.2, 0.8])
    frames.render()
    assert frames.last_was_blit


def test_show_legend_reuses_the_legend_of_a_setting():
    panel = W.BregmanPanel()
    legend = panel.ax_f.get_legend()
    start = panel.values()["f"]
    other = next(
        o[1] if isinstance(o, tuple) else o
        for o in panel.controls["f"].options
        if (o[1] if isinstance(o, tuple) else o) != start
    )
    panel.set(f=other)
    assert panel.ax_f.get_legend() is not legend
    panel.set(f=start)
    assert panel.ax_f.get_legend() is legend


def test_a_mode_switch_changes_legend_entries_not_the_axes():
    """Lesson 01's legends keep one object per axes: a mode renames an entry or hides the last one."""
    panel = W.SamplingPanel()
    legends = (panel.ax_pol.get_legend(), panel.ax_run.get_legend())
    texts = {}
    for mode in ("mu", "weighted", "q", "mu", "weighted", "q"):
        panel.set(mode=mode)
        assert (panel.ax_pol.get_legend(), panel.ax_run.get_legend()) == legends
        shown = [t.get_text() for t in panel.legend_run.get_texts() if t.get_visible()]
        texts[mode] = ([t.get_text() for t in panel.legend_pol.get_texts()], shown)
    assert any("π/μ" in t for t in texts["weighted"][0]) and not any("π/μ" in t for t in texts["q"][0])
    assert any("plain mean over μ" in t for t in texts["mu"][1])
    assert not any("plain mean over μ" in t for t in texts["q"][1] + texts["weighted"][1])
    assert panel._frames.last_was_blit  # the third round of modes: all views seen


def test_snapped_limits_depend_on_the_data_alone():
    import math

    from klviz.plotting import snapped_limits

    lo, hi = snapped_limits(-3.41, 10.99)
    assert lo <= -3.41 - 0.15 * 14.4 and hi >= 10.99 + 0.15 * 14.4
    assert hi - lo <= 14.4 * (1 + 2 * 0.15 + 2 / 8)  # a grid step is at most span / 8
    step = 1.0  # span / 20 = 0.72 -> 1
    assert math.isclose(lo / step, round(lo / step)) and math.isclose(hi / step, round(hi / step))
    assert snapped_limits(0.0, 0.013)[0] == 0.0  # a baseline at 0 stays
    assert snapped_limits(-3.41, 10.99) == (lo, hi)
    assert snapped_limits(-3.40, 11.0) == (lo, hi)  # nearby data, same limits
    with pytest.raises(ValueError):
        snapped_limits(1.0, 1.0)
    with pytest.raises(ValueError):
        snapped_limits(float("nan"), 1.0)


def test_frames_are_images_and_can_be_sharper(monkeypatch):
    import base64
    import io

    from PIL import Image

    from klviz.widgets.frames import pixel_ratio

    panel = W.StartHerePanel()
    assert "klviz-figure" in panel._canvas._dom_classes and panel._image in panel._canvas.children
    # the image widget holds the frame as a PNG data URL (no Blob for the page to load): frame_png's bytes
    assert panel._image.format == "url"
    assert panel._image.value == b"data:image/png;base64," + base64.b64encode(panel.frame_png)
    width, height = Image.open(io.BytesIO(panel.frame_png)).size
    assert (width, height) == (int(panel._image.width), int(panel._image.height))  # its size on the page
    assert panel._canvas.layout.width == f"{width}px" and panel._canvas.layout.max_width == "100%"
    monkeypatch.setenv("KLVIZ_PIXEL_RATIO", "2")
    sharp = W.StartHerePanel()
    w2, h2 = Image.open(io.BytesIO(sharp.frame_png)).size
    assert (w2, h2) == (2 * width, 2 * height)
    assert (sharp._image.width, sharp._image.height) == (panel._image.width, panel._image.height)  # same size
    for bad in ("0.5", "4", "two"):
        monkeypatch.setenv("KLVIZ_PIXEL_RATIO", bad)
        with pytest.raises(ValueError, match="KLVIZ_PIXEL_RATIO"):
            pixel_ratio()


def test_png_encoder_reuses_unchanged_bands_and_round_trips_exactly():
    """Frames encoded one after another (only the changed bands of rows are compressed again)
    decode to exactly the pixels given, whatever changed: a few rows, everything, transparency,
    the size, a height that is not a multiple of the band."""
    import io

    from PIL import Image

    from klviz.widgets.frames import PngEncoder

    rng = np.random.default_rng(1)
    encoder = PngEncoder()
    frame = np.full((37, 53, 4), 255, dtype=np.uint8)
    frame[..., :3] = rng.integers(0, 256, size=(37, 53, 3), dtype=np.uint8)
    frames = [frame]
    for r0 in (0, 15, 16, 36):  # one changed row per band, band edges included
        f = frames[-1].copy()
        f[r0, 3:9, :3] = rng.integers(0, 256, size=(6, 3), dtype=np.uint8)
        frames.append(f)
    frames.append(frames[-1].copy())  # nothing changed
    see_through = frames[-1].copy()
    see_through[5, 5, 3] = 7
    frames.append(see_through)
    frames.append(rng.integers(0, 256, size=(20, 11, 4), dtype=np.uint8))  # another size
    frames.append(rng.integers(0, 256, size=(20, 11, 4), dtype=np.uint8))  # every pixel changed
    for i, f in enumerate(frames):
        before = list(encoder._pieces)
        decoded = np.asarray(Image.open(io.BytesIO(encoder.encode(f))))
        assert decoded.shape == f.shape and np.array_equal(decoded, f), i
        if 1 <= i <= 5:  # one row changed (frames 1-4) or none (5): every other band keeps its bytes
            reused = sum(a is b for a, b in zip(before, encoder._pieces))
            assert reused == len(before) - (i < 5), (i, reused)
    # what the encoder keeps between frames: compressed bands and their digests, no copy of the pixels
    assert not any(isinstance(v, np.ndarray) for v in vars(encoder).values())
    with pytest.raises(ValueError, match="rgba"):
        encoder.encode(frames[0][..., :3])


def test_panel_frames_decode_to_the_agg_buffer():
    """The PNG a panel hands to its image widget (``frame_png``) is the composed Agg buffer, update after update."""
    import io

    from PIL import Image

    panel = W.BregmanPanel()
    for control, value in change_plan(panel, 4):
        panel.set(**{control: value})
        decoded = np.asarray(Image.open(io.BytesIO(panel.frame_png)))
        assert np.array_equal(decoded, np.asarray(panel.fig.canvas.buffer_rgba()))


def test_the_text_under_the_figure_is_one_message_after_the_frame():
    """A step sends the frame, then the readout and status line together, in one message."""
    panel = W.BregmanPanel()
    sent = []
    for name, w in (("image", panel._image), ("text", panel.text)):
        w._send = lambda msg, buffers=None, _n=name: sent.append(_n)
    control, value = change_plan(panel, 1)[0]
    panel.set(**{control: value})
    assert sent == ["image", "text"], sent
    assert panel.readout.value in panel.text.value and panel.status.value in panel.text.value
    assert "compute" in panel.status.value


def test_texts_seen_again_are_laid_over_from_their_layer_and_match_agg():
    """A dynamic text drawn a second time with the same content comes from a layer drawn once for
    it (see FrameComposer._draw_dynamic); the frame equals Agg drawing the text, up to rounding."""
    from matplotlib.figure import Figure

    from klviz.widgets.frames import FrameComposer

    fig = Figure(figsize=(3, 2), dpi=80, layout="none")  # a fixed layout, as a panel freezes its own
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    (line,) = ax.plot([0, 1], [0, 1])
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    title = ax.set_title("x = 1")
    frames = FrameComposer(fig)
    frames.render()
    for i, text in enumerate(["x = 2", "x = 1", "x = 2", "x = 1", "x = 2", "x = 3"]):
        title.set_text(text)
        line.set_ydata([i % 2, 1 - i % 2])
        frames.render()
        assert frames.last_was_blit or i == 0
        composed = np.asarray(fig.canvas.buffer_rgba()).astype(np.int16).copy()
        FigureCanvasAgg.draw(fig.canvas)
        full = np.asarray(fig.canvas.buffer_rgba()).astype(np.int16)
        x0, y0, x1, y1 = title.get_window_extent(fig.canvas.get_renderer()).extents
        rows = slice(max(160 - int(np.ceil(y1)) - 3, 0), 160 - int(np.floor(y0)) + 3)
        cols = slice(max(int(np.floor(x0)) - 3, 0), int(np.ceil(x1)) + 3)
        assert (full[rows, cols, :3] < 128).any()  # the title is there
        assert np.abs(composed[rows, cols] - full[rows, cols]).max() <= 2, (i, text)
    assert len(frames._text_layers) == 2  # "x = 1" and "x = 2", each seen again; "x = 3" drawn as it is
