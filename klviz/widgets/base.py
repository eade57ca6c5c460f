"""The panel pattern shared by every interactive figure in the suite.

A panel owns its controls, a figure built **once**, and a pure ``compute(**values) -> dict``.
On every control change it recomputes, updates the existing artists in ``draw`` (``set_data``,
``set_height``, ...) and redraws what changed (see :class:`_FrameComposer`); it never rebuilds the
figure. Frames go to the page as PNG images (:meth:`Panel._make_canvas` says why not ipympl).
Errors raised while updating are shown inside the panel instead of vanishing into a log. The status
line shows the device and how long the last update took: compute, then the redraw, marked
"(blitted)" when only the changed artists were drawn.

Tests drive a panel without a browser: ``panel.set(name=value, ...)`` then read ``panel.last``
(the numbers of the last update) or ``panel.readout.value`` (the HTML the reader sees).
"""
from __future__ import annotations

import html
import io
import os
import time
import traceback
from typing import Any

import ipywidgets as widgets
import numpy as np
import torch
from matplotlib.figure import Figure

from ..devices import describe_device, resolve_device

__all__ = ["Panel", "encode_png", "html_table", "pixel_ratio", "static_mode"]


class Panel:
    """Base class: subclasses implement ``make_controls``, ``make_figure``, ``compute`` and ``draw``."""

    title: str = "panel"
    css_class: str = "klviz-panel"
    #: compose frames by blitting when only artists that changed before have changed again
    blit: bool = True

    def __init__(self, device: str | torch.device | None = None) -> None:
        self.device = resolve_device(device)
        self._legends_by_key: dict[int, dict[Any, Any]] = {}   # see show_legend
        self.controls: dict[str, widgets.ValueWidget] = self.make_controls()
        self.fig: Figure = self.make_figure()
        # Redraws are requested by the panel only: with pyplot's interactive mode on (as in a
        # notebook), every artist change would otherwise ask the canvas for a full redraw too.
        self.fig.stale_callback = None
        self._layout_frozen = False
        self._frames = _FrameComposer(self.fig)
        self.last: dict[str, Any] = {}
        self.last_error: BaseException | None = None
        self.last_compute_ms = float("nan")
        self.last_draw_ms = float("nan")
        self.updates = 0
        self._holding = False
        self.readout = widgets.HTML().add_class("klviz-readout")
        self.error = widgets.HTML().add_class("klviz-error")
        self.status = widgets.HTML().add_class("klviz-status")
        self._canvas = self._make_canvas()
        for name, w in self.controls.items():
            w.add_class(f"klviz-{name.replace('_', '-')}")
            w.observe(self._on_change, names="value")
        self.widget = widgets.VBox(
            [widgets.HTML(f"<b>{html.escape(self.title)}</b>"), self.layout_controls(), self._canvas,
             self.readout, self.error, self.status],
        ).add_class(self.css_class).add_class("klviz-panel")
        self.update()
        self._prime_frames()

    # -- to implement -------------------------------------------------------------------------
    def make_controls(self) -> dict[str, widgets.ValueWidget]:
        """The named controls (their names are the keyword arguments of :meth:`compute`)."""
        raise NotImplementedError

    def make_figure(self) -> Figure:
        """Build the figure and its artists once (keep references to the artists on ``self``)."""
        raise NotImplementedError

    def compute(self, **values: Any) -> dict[str, Any]:
        """Pure function from control values to the data drawn and shown."""
        raise NotImplementedError

    def draw(self, data: dict[str, Any]) -> None:
        """Update the existing artists and the readout from ``data``."""
        raise NotImplementedError

    def layout_controls(self) -> widgets.Widget:
        """Arrange the controls (override for a custom layout)."""
        return widgets.HBox(list(self.controls.values()), layout=widgets.Layout(flex_flow="row wrap"))

    # -- machinery ----------------------------------------------------------------------------
    def show_legend(self, ax: Any, key: Any, **kwargs: Any) -> Any:
        """Give ``ax`` the legend made for ``key`` (made once with ``ax.legend(**kwargs)``, then reused).

        For a legend whose entries depend on a setting (a mode, a function): switching back to a
        setting shown before brings back the same legend object, so the frame cache finds the
        background it rendered for that setting instead of rendering the whole figure again.
        Set the artists' labels for ``key`` before the first call with that key.
        """
        cache: dict[Any, Any] = self._legends_by_key.setdefault(id(ax), {})
        legend = cache.get(key)
        if legend is None:
            legend = cache[key] = ax.legend(**kwargs)
        elif ax.get_legend() is not legend:
            ax.legend_ = legend
            ax.stale = True
        return legend

    def values(self) -> dict[str, Any]:
        """Current control values by name."""
        return {name: w.value for name, w in self.controls.items()}

    def set(self, **values: Any) -> dict[str, Any]:
        """Set several controls at once with a single update; returns :attr:`last`."""
        unknown = set(values) - set(self.controls)
        if unknown:
            raise ValueError(f"unknown control(s) {sorted(unknown)}; this panel has {sorted(self.controls)}")
        self._holding = True
        try:
            for name, value in values.items():
                self.controls[name].value = value
        finally:
            self._holding = False
        self.update()
        return self.last

    def _on_change(self, _change: dict[str, Any]) -> None:
        if not self._holding:
            self.update()

    def update(self) -> None:
        """Recompute and redraw; any exception is shown in the panel and kept in ``last_error``."""
        t0 = time.perf_counter()
        try:
            data = self.compute(**self.values())
            self.draw(data)
        except Exception as err:  # noqa: BLE001 - shown to the reader, never swallowed silently
            self.last_error = err
            self.error.value = (
                "<div style='color:#b00020'><b>This setting could not be computed:</b> "
                f"{html.escape(type(err).__name__)}: {html.escape(str(err))}</div>"
                f"<details><summary>details</summary><pre>{html.escape(traceback.format_exc(limit=4))}</pre></details>"
            )
            self.last_compute_ms = (time.perf_counter() - t0) * 1e3
            self._show_status()
            return
        self.last, self.last_error, self.error.value = data, None, ""
        self.last_compute_ms = (time.perf_counter() - t0) * 1e3
        self.updates += 1
        self._redraw()
        self._show_status()

    def _make_canvas(self) -> widgets.Widget:
        """The widget that shows the frames: an ``ipywidgets.Image`` fed with PNG bytes.

        Not ipympl's canvas, measured in JupyterLab with headless Chromium: ipympl's front end
        re-encodes the previous frame as a PNG in the browser for every frame it receives
        (``toDataURL``), which made each slider step about 10 ms slower than an image, and its diff
        frames could leave a stale picture when the browser dropped one. The panels use none of
        ipympl's zoom or pan tools.
        """
        ratio = pixel_ratio()
        width_px = int(round(self.fig.get_figwidth() * self.fig.dpi))
        height_px = int(round(self.fig.get_figheight() * self.fig.dpi))
        if ratio != 1.0:
            self.fig.set_dpi(self.fig.dpi * ratio)   # sharper on high-density screens, same size
        # a fixed size: the page keeps its layout before the first frame has loaded and after
        self._image = widgets.Image(format="png", layout=widgets.Layout(width=f"{width_px}px", height=f"{height_px}px",
                                                                         min_height=f"{height_px}px"))
        self._image.add_class("klviz-figure")
        return self._image

    def _freeze_layout(self) -> None:
        """Lay the figure out once, then keep the layout: constrained layout on every redraw is slow."""
        if not self._layout_frozen:
            self.fig.draw_without_rendering()   # runs the layout engine
            self.fig.set_layout_engine("none")
            self._layout_frozen = True

    def _redraw(self) -> None:
        """Compose the new frame and hand it to the canvas widget; times the whole redraw."""
        self._freeze_layout()
        t0 = time.perf_counter()
        self._frames.render(blit=self._blitting())
        self._image.value = self._frames.png()
        self.last_draw_ms = (time.perf_counter() - t0) * 1e3

    def _show_status(self, note: str = "") -> None:
        """Device and timing of the last update, then ``note`` (HTML, e.g. the progress of a run)."""
        draw = "" if self.last_draw_ms != self.last_draw_ms else f" · redraw {self.last_draw_ms:.0f} ms"
        if self._frames.last_was_blit:
            draw += " (blitted)"
        self.status.value = (
            f"<span style='color:#666;font-size:85%'>device {html.escape(describe_device(self.device))}"
            f" · compute {self.last_compute_ms:.1f} ms{draw}{note}</span>"
        )

    def _prime_frames(self) -> None:
        """Keep a background of the first view before the reader touches anything.

        The first frame is a full render, and which artists an update changes is learned from the
        next one. Drawing the first data once more marks the artists that ``draw`` touches, so the
        default view's background is kept now (one more render while the cell runs) and the
        reader's first change, and every return to the default view, redraw only what moved.
        """
        if self.last_error is not None or not self._blitting():
            return
        try:
            self.draw(self.last)
            self._frames.render()
        except Exception:  # noqa: BLE001 - an optimisation only: the next update renders in full
            self._frames.state = None

    def _blitting(self) -> bool:
        """Whether frames redraw only what changed (``KLVIZ_NO_BLIT=1`` turns it off, for comparison)."""
        return self.blit and os.environ.get("KLVIZ_NO_BLIT", "") in ("", "0")

    def png(self) -> bytes:
        """The figure as PNG bytes (for saving a picture of the panel)."""
        buf = io.BytesIO()
        self.fig.savefig(buf, format="png")
        return buf.getvalue()

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)
        if static_mode():
            self.display_snapshot()

    def display_snapshot(self) -> None:
        """Show the panel as plain outputs: its settings, readout and figure as a PNG image.

        The static site (``KLVIZ_STATIC=1``) needs this: an HTML page opened from disk has no
        kernel and no widget renderer, so the widget itself shows nothing there.
        """
        from IPython.display import HTML, Image, display

        settings = []
        for name, w in self.controls.items():
            label = getattr(w, "label", None)
            shown = label if isinstance(label, str) else w.value
            settings.append(f"{html.escape(w.description or name)} = {html.escape(str(shown))}")
        display(HTML(
            f"<div class='klviz-snapshot'><b>{html.escape(self.title)}</b><br>"
            f"<span style='color:#666;font-size:90%'>Snapshot at {'; '.join(settings)}. "
            "Run the notebook to move the controls.</span>"
            f"<div>{self.readout.value}</div>{self.error.value}</div>"))
        display(Image(data=self.png(), format="png"))


class _FrameComposer:
    """Renders a panel's frames into the Agg buffer, redrawing only what changed when it can.

    A panel's ``draw`` changes a few artists (bars, lines, a title) and leaves axes, ticks and
    legends alone, yet a full Agg render spends most of its time on that unchanged text. So the
    composer keeps backgrounds: the figure rendered *without* the artists known to change
    ("dynamic") and without the legends. A frame is then: restore the background, draw the dynamic
    artists, lay the legends on top.

    - **Backgrounds** are kept for the last few *views* (axis limits, ticks, scales, figure size,
      set of artists): a control that toggles between two views (a dropdown, a slider that moves an
      axis and back) finds its background again. A new view, a figure-level text that changed, or a
      changed artist that is baked into the background forces a full render and a new background;
      an artist found changed is dropped from every background it is baked into, and counts as
      dynamic from then on. Changes are found by matplotlib's own ``stale`` flag.
    - **Legends** are drawn once onto a transparent layer and composited over each frame ("over",
      the same blending Agg does); a legend is drawn again when its place, texts or colours change.
    """

    #: backgrounds kept per panel (one full-size RGBA buffer each, about 1.3 MB for a 840x390 figure)
    max_backgrounds: int = 6
    #: legend layers kept per panel (small: a legend's bounding box)
    max_legend_layers: int = 16

    def __init__(self, fig: Figure) -> None:
        self.fig = fig
        self.dynamic: set[int] = set()
        self.background: Any = None
        self.state: Any = None
        self.last_was_blit = False
        # view state -> (background region, ids of the artists left out of it); most recent last
        self._backgrounds: dict[Any, tuple[Any, frozenset[int]]] = {}
        self._legend_layers: dict[tuple, _LegendLayer] = {}

    def _axes_state(self) -> tuple:
        from matplotlib.ticker import FixedFormatter, FixedLocator

        key: list[Any] = [tuple(self.fig.bbox.bounds), self.fig.dpi, tuple(id(t) for t in self.fig.texts),
                          tuple(id(a) for a in self.fig.axes)]
        for ax in self.fig.axes:
            key.append((ax.get_xlim(), ax.get_ylim(), tuple(ax.get_position().bounds), ax.get_visible(),
                        tuple(id(c) for c in ax.get_children())))
            for axis in (ax.xaxis, ax.yaxis):
                loc, fmt = axis.get_major_locator(), axis.get_major_formatter()
                key.append((axis.get_scale(), id(loc), id(fmt), axis.label.get_text(),
                            tuple(loc.locs) if isinstance(loc, FixedLocator) else (),
                            tuple(fmt.seq) if isinstance(fmt, FixedFormatter) else ()))
        return tuple(key)

    def _artists(self) -> list[Any]:
        from matplotlib.axis import Axis
        from matplotlib.legend import Legend
        from matplotlib.spines import Spine

        return [a for ax in self.fig.axes for a in ax.get_children()
                if a is not ax.patch and not isinstance(a, (Axis, Spine, Legend)) and not _empty_text(a)]

    def _legends(self) -> list[Any]:
        return [ax.get_legend() for ax in self.fig.axes if ax.get_legend() is not None]

    def render(self, blit: bool = True) -> None:
        """Bring the Agg buffer up to date with the figure."""
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        canvas = self.fig.canvas
        state = self._axes_state()
        if self.state is None or not blit:     # first frame: render everything, learn what changes later
            FigureCanvasAgg.draw(canvas)
            self.state, self.last_was_blit = state, False
            self._backgrounds.clear()
            return
        artists = self._artists()
        changed = [a for a in artists if a.stale]
        if any(t.stale for t in self.fig.texts) or any(lg.stale for lg in self.fig.legends):
            self._backgrounds.clear()          # figure-level text is in every background
        for a in changed:                      # a background with a changed artist baked in is stale
            for key in [k for k, (_, left_out) in self._backgrounds.items() if id(a) not in left_out]:
                del self._backgrounds[key]
        cached = self._backgrounds.pop(state, None)
        if cached is not None:
            self._backgrounds[state] = cached  # most recently used goes last
            self.background, left_out = cached
            self.dynamic = set(left_out)
            canvas.restore_region(self.background)
        else:
            self._render_background(canvas, [a for a in artists if id(a) in self.dynamic or a.stale], state)
        dynamic = [a for a in artists if id(a) in self.dynamic]
        renderer = canvas.get_renderer()
        for a in sorted(dynamic, key=lambda a: a.get_zorder()):
            a.draw(renderer)
        self._draw_legends(renderer)
        self.fig.stale = False
        for ax in self.fig.axes:
            ax.stale = False
        self.state, self.last_was_blit = state, cached is not None

    def _render_background(self, canvas: Any, dynamic: list[Any], state: Any) -> None:
        """Full Agg render without the dynamic artists and legends; keep it as this view's background."""
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        self.dynamic = {id(a) for a in dynamic}
        hidden = [a for a in dynamic + self._legends() if a.get_visible()]
        titles = {id(t): t.get_text() for ax in self.fig.axes for t in _titles(ax)}
        for a in hidden:
            if id(a) in titles:
                a.set_text("")   # an invisible title would make the axes misplace it
            else:
                a.set_visible(False)
        try:
            FigureCanvasAgg.draw(canvas)       # the background; no frame is sent yet
            self.background = canvas.copy_from_bbox(self.fig.bbox)
        finally:
            for a in hidden:
                if id(a) in titles:
                    a.set_text(titles[id(a)])
                else:
                    a.set_visible(True)
        self._backgrounds[state] = (self.background, frozenset(self.dynamic))
        while len(self._backgrounds) > self.max_backgrounds:
            del self._backgrounds[next(iter(self._backgrounds))]

    def _draw_legends(self, renderer: Any) -> None:
        legends = self._legends()
        buf = np.asarray(renderer.buffer_rgba())
        for lg in legends:
            if not lg.get_visible():
                continue
            signature = _legend_signature(lg, renderer)
            key = (id(lg), signature)               # a legend whose texts come back finds its layer
            layer = self._legend_layers.pop(key, None)
            if layer is None:
                layer = _LegendLayer.render(lg, renderer)
            self._legend_layers[key] = layer        # most recently used goes last
            if not layer.composite(buf):
                lg.draw(renderer)              # a see-through figure: let Agg blend it
            lg.stale = False
        while len(self._legend_layers) > self.max_legend_layers:   # keep those of recent settings
            del self._legend_layers[next(iter(self._legend_layers))]

    def png(self) -> bytes:
        """The current Agg buffer as PNG bytes (fast compression: it is sent on every update)."""
        return encode_png(np.asarray(self.fig.canvas.buffer_rgba()))


class _LegendLayer:
    """One legend rendered on a transparent layer, cut to its bounding box, ready to composite."""

    def __init__(self, rows: slice, cols: slice, premultiplied: np.ndarray, transparency: np.ndarray) -> None:
        self.rows, self.cols = rows, cols
        self.premultiplied, self.transparency = premultiplied, transparency

    @classmethod
    def render(cls, legend: Any, renderer: Any) -> _LegendLayer:
        from matplotlib.backends.backend_agg import RendererAgg

        width, height = int(renderer.width), int(renderer.height)
        layer = RendererAgg(width, height, renderer.dpi)
        layer.clear()                          # transparent black
        legend.draw(layer)
        x0, y0, x1, y1 = legend.get_window_extent(layer).extents
        pad = 3                                # antialiased edges and the frame's line width
        c0, c1 = max(int(np.floor(x0)) - pad, 0), min(int(np.ceil(x1)) + pad, width)
        r0, r1 = max(height - int(np.ceil(y1)) - pad, 0), min(height - int(np.floor(y0)) + pad, height)
        rgba = np.asarray(layer.buffer_rgba())[r0:r1, c0:c1].astype(np.float32)
        alpha = rgba[..., 3:] / 255.0
        return cls(slice(r0, r1), slice(c0, c1), rgba[..., :3] * alpha, 1.0 - alpha)

    def composite(self, buf: np.ndarray) -> bool:
        """Lay the legend over ``buf`` (an opaque RGBA frame, changed in place); False if not opaque."""
        region = buf[self.rows, self.cols]
        if region.size and region[..., 3].min() != 255:
            return False
        region[..., :3] = np.rint(self.premultiplied + region[..., :3] * self.transparency).astype(np.uint8)
        return True


def _legend_signature(legend: Any, renderer: Any) -> tuple:
    """What a legend's pixels depend on: its place and size, its texts and the look of its handles."""
    from matplotlib.colors import to_rgba

    def look(artist: Any) -> tuple:
        props = []
        for getter in ("get_color", "get_facecolor", "get_edgecolor", "get_alpha", "get_linestyle",
                       "get_linewidth", "get_marker", "get_visible"):
            value = getattr(artist, getter, None)
            if value is not None:
                v = value()
                props.append(repr(to_rgba(v) if isinstance(v, str) and getter.endswith("color") else v))
        return tuple(props)

    return (tuple(legend.get_window_extent(renderer).bounds),
            tuple((t.get_text(), look(t)) for t in legend.get_texts()),
            tuple(look(h) for h in legend.legend_handles), look(legend.get_frame()), legend.get_title().get_text())


def encode_png(rgba: np.ndarray) -> bytes:
    """An ``[H, W, 4]`` uint8 RGBA image as PNG bytes, written for speed rather than size.

    Panels send a frame on every update. Pillow's encoder spends most of its time choosing a
    filter per row; plot frames are mostly flat colour and compress about as well unfiltered with
    zlib's fastest level, in about a third of the time.
    """
    import struct
    import zlib

    if rgba.ndim != 3 or rgba.shape[2] != 4 or rgba.dtype != np.uint8:
        raise ValueError(f"rgba must be a uint8 array of shape [H, W, 4]; got {rgba.dtype} {tuple(rgba.shape)}")
    height, width = rgba.shape[:2]
    rows = np.zeros((height, 1 + 4 * width), dtype=np.uint8)   # filter byte 0 ("none") per row
    rows[:, 1:] = rgba.reshape(height, 4 * width)

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 6, 0, 0, 0)   # 8-bit RGBA, no interlace
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows.tobytes(), 1))
            + chunk(b"IEND", b""))


def _titles(ax: Any) -> tuple[Any, ...]:
    return (ax.title, ax._left_title, ax._right_title)


def _empty_text(artist: Any) -> bool:
    """An empty Text draws nothing and never loses its stale flag; hiding one (an unused left or
    right axes title) also shifts where the axes places its main title, so leave them alone."""
    from matplotlib.text import Text

    return isinstance(artist, Text) and not artist.get_text()


def pixel_ratio() -> float:
    """Frames are rendered at this many pixels per CSS pixel: ``KLVIZ_PIXEL_RATIO`` (default 1).

    2 gives sharp figures on a high-density screen or a 4K projector at four times the pixels to
    draw and send, so each update takes longer; 1 keeps the panels within their latency target.
    """
    raw = os.environ.get("KLVIZ_PIXEL_RATIO", "").strip()
    if not raw:
        return 1.0
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"KLVIZ_PIXEL_RATIO must be a number between 1 and 3, got {raw!r}") from None
    if not 1.0 <= value <= 3.0:
        raise ValueError(f"KLVIZ_PIXEL_RATIO must be a number between 1 and 3, got {raw!r}")
    return value


def static_mode() -> bool:
    """True when the environment variable ``KLVIZ_STATIC`` asks for static output (the static site)."""
    return os.environ.get("KLVIZ_STATIC", "").strip().lower() in ("1", "true", "yes")


def html_table(header: list[str], rows: list[list[str]], css_class: str = "klviz-table") -> str:
    """A compact HTML table for a panel readout (cells are inserted as given: escape text yourself)."""
    cell = "padding:2px 10px;text-align:right;white-space:nowrap"
    head = "".join(f"<th style='{cell};border-bottom:1px solid #ccc'>{h}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td style='{cell}'>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table class='{css_class}' style='border-collapse:collapse;font-size:90%'><tr>{head}</tr>{body}</table>"
