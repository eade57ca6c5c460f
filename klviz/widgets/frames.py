"""How a panel's figure becomes the frames the reader sees: composed in the Agg buffer, sent as PNG.

Nothing here knows of widgets: :class:`FrameComposer` takes a matplotlib figure and brings its Agg
buffer up to date, redrawing only the artists that changed over a background kept per view;
:class:`LegendLayer` is one legend drawn once onto a transparent layer and laid over each frame;
:func:`encode_png` turns the buffer into the PNG bytes a panel's ``ipywidgets.Image`` shows, and
:func:`pixel_ratio` says how many pixels a frame has per CSS pixel. :class:`klviz.widgets.base.Panel`
owns one composer per figure.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import TYPE_CHECKING, Any

import numpy as np
from matplotlib.figure import Figure

if TYPE_CHECKING:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

__all__ = [
    "SHARED_BACKGROUNDS",
    "FrameComposer",
    "LegendLayer",
    "PngEncoder",
    "legend_signature",
    "text_signature",
    "blank_png",
    "encode_png",
    "frame_url",
    "pixel_ratio",
    "png_url",
]


#: backgrounds kept by all the panels of a kernel together (about 1.3 MB each for a panel's figure,
#: four times as much at a pixel ratio of 2). A reader moves one panel at a time: the panel drawn last
#: keeps up to its own ``max_backgrounds`` within this budget, and the others give theirs up first, with
#: their PNG encoder. Four hold the views a control toggles between; ``benchmarks/panels.py`` (30 changes,
#: each control one step and back) found 7 views rendered in full for the RLHF lab with 4 or 6, and 9 with
#: 3 (its p95 then passed 100 ms). A panel drawn again after another one renders its first frame in full
#: (a view it had kept is rendered again) and blits as before from then on.
SHARED_BACKGROUNDS = 4

_SHARED_LOCK = threading.RLock()  # renders of different panels (a background run draws from its thread)
_BY_RECENCY: list[weakref.ref[FrameComposer]] = []  # the composers that have rendered, least recent first


def _share_caches(current: FrameComposer) -> None:
    """Make ``current`` the most recently drawn composer; the others drop what only speeds up their
    next frame, and backgrounds are dropped (the others' first, then ``current``'s oldest views) until
    all together keep at most :data:`SHARED_BACKGROUNDS`."""
    others = [c for c in (ref() for ref in _BY_RECENCY) if c is not None and c is not current]
    _BY_RECENCY[:] = [weakref.ref(c) for c in others] + [weakref.ref(current)]
    excess = len(current._backgrounds) + sum(len(c._backgrounds) for c in others) - SHARED_BACKGROUNDS
    for c in others:  # least recently drawn first
        c._encoder = c._scratch = None
    for c in [*others, current]:  # current's view of this frame is its newest: it stays (the budget is >= 1)
        while excess > 0 and c._backgrounds:
            del c._backgrounds[next(iter(c._backgrounds))]  # its oldest view first
            excess -= 1


class FrameComposer:
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
    #: text layers kept per panel (small: a text's bounding box), one per dynamic text and its recent contents
    max_text_layers: int = 32

    def __init__(self, fig: Figure) -> None:
        self.fig = fig
        self.dynamic: set[int] = set()
        self.background: Any = None
        self.state: Any = None
        self.last_was_blit = False
        # view state -> (background region, ids of the artists left out of it); most recent last
        self._backgrounds: dict[Any, tuple[Any, frozenset[int]]] = {}
        self._legend_layers: dict[tuple, LegendLayer] = {}
        self._text_layers: dict[tuple, LegendLayer] = {}
        self._texts_seen: dict[tuple, None] = {}  # texts drawn once, not yet given a layer; most recent last
        self._scratch: Any = None  # a transparent renderer the size of the figure, for new text layers of one render
        self._encoder: PngEncoder | None = None

    def _axes_state(self) -> tuple:
        from matplotlib.ticker import FixedFormatter, FixedLocator

        key: list[Any] = [
            tuple(self.fig.bbox.bounds),
            self.fig.dpi,
            tuple(id(t) for t in self.fig.texts),
            tuple(id(a) for a in self.fig.axes),
        ]
        for ax in self.fig.axes:
            key.append(
                (
                    ax.get_xlim(),
                    ax.get_ylim(),
                    tuple(ax.get_position().bounds),
                    ax.get_visible(),
                    tuple(id(c) for c in ax.get_children()),
                )
            )
            for axis in (ax.xaxis, ax.yaxis):
                loc, fmt = axis.get_major_locator(), axis.get_major_formatter()
                key.append(
                    (
                        axis.get_scale(),
                        id(loc),
                        id(fmt),
                        axis.label.get_text(),
                        # set in FixedLocator.__init__, missing from matplotlib's stubs
                        tuple(loc.locs) if isinstance(loc, FixedLocator) else (),  # type: ignore[attr-defined]
                        tuple(fmt.seq) if isinstance(fmt, FixedFormatter) else (),
                    )
                )
        return tuple(key)

    def _artists(self) -> list[Any]:
        from matplotlib.axis import Axis
        from matplotlib.legend import Legend
        from matplotlib.spines import Spine

        return [
            a
            for ax in self.fig.axes
            for a in ax.get_children()
            if a is not ax.patch and not isinstance(a, (Axis, Spine, Legend)) and not _empty_text(a)
        ]

    def _legends(self) -> list[Any]:
        return [ax.get_legend() for ax in self.fig.axes if ax.get_legend() is not None]

    @property
    def canvas(self) -> FigureCanvasAgg:
        """The figure's canvas: Agg (``klviz.plotting.panel_figure``) or a backend built on it."""
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        canvas = self.fig.canvas
        if not isinstance(canvas, FigureCanvasAgg):
            raise TypeError(f"frames are composed in an Agg buffer; this figure's canvas is a {type(canvas).__name__}")
        return canvas

    def render(self, blit: bool = True) -> None:
        """Bring the Agg buffer up to date with the figure (the caches it keeps: :data:`SHARED_BACKGROUNDS`)."""
        with _SHARED_LOCK:
            try:
                self._render(blit)
            finally:
                self._scratch = None  # a figure-size buffer, needed only while a new text layer is cut
            _share_caches(self)

    def _render(self, blit: bool) -> None:
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        canvas = self.canvas
        state = self._axes_state()
        if self.state is None or not blit:  # first frame: render everything, learn what changes later
            FigureCanvasAgg.draw(canvas)
            self.state, self.last_was_blit = state, False
            self._backgrounds.clear()
            return
        artists = self._artists()
        changed = [a for a in artists if a.stale]
        if any(t.stale for t in self.fig.texts) or any(lg.stale for lg in self.fig.legends):
            self._backgrounds.clear()  # figure-level text is in every background
        for a in changed:  # a background with a changed artist baked in is stale
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
        self._draw_dynamic(sorted(dynamic, key=lambda a: a.get_zorder()), renderer)
        self._draw_legends(renderer)
        self.fig.stale = False
        for ax in self.fig.axes:
            ax.stale = False
        self.state, self.last_was_blit = state, cached is not None

    def _render_background(self, canvas: FigureCanvasAgg, dynamic: list[Any], state: Any) -> None:
        """Full Agg render without the dynamic artists and legends; keep it as this view's background."""
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        self.dynamic = {id(a) for a in dynamic}
        hidden = [a for a in dynamic + self._legends() if a.get_visible()]
        titles = {id(t): t.get_text() for ax in self.fig.axes for t in _titles(ax)}
        for a in hidden:
            if id(a) in titles:
                a.set_text("")  # an invisible title would make the axes misplace it
            else:
                a.set_visible(False)
        try:
            FigureCanvasAgg.draw(canvas)  # the background; no frame is sent yet
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

    def _draw_dynamic(self, artists: list[Any], renderer: Any) -> None:
        """Draw the dynamic artists in order; a plain text comes from its layer for what it says now.

        Matplotlib 3.11's Agg renders text one glyph at a time through FreeType: a 40-character
        title takes 3-5 ms, the largest part of a blitted frame for panels whose titles or notes
        hold numbers. Such a text is dynamic because some setting changes it, and from then on it
        was drawn on every frame, also for the controls that leave it alone. Now a text drawn a
        second time with the same content (and place, font, colour) is drawn once more onto a
        transparent layer, which is laid over the later frames that show it, as the legends are.
        A text whose content is new is drawn as before (a drag that changes it on every step
        costs what it did).
        """
        buf = None
        for a in artists:
            key = text_signature(a, renderer)
            if key is None:
                a.draw(renderer)
                continue
            if buf is None:
                buf = np.asarray(renderer.buffer_rgba())
            layer = self._text_layers.pop(key, None)
            if layer is None:
                if key not in self._texts_seen:  # a content seen once may never come back: draw it
                    self._texts_seen[key] = None
                    while len(self._texts_seen) > 4 * self.max_text_layers:
                        del self._texts_seen[next(iter(self._texts_seen))]
                    a.draw(renderer)
                    continue
                del self._texts_seen[key]
                layer = self._render_text_layer(a, renderer)
            self._text_layers[key] = layer  # most recently used goes last
            if not layer.composite(buf):
                a.draw(renderer)  # a see-through figure: let Agg blend it
            a.stale = False
        while len(self._text_layers) > self.max_text_layers:
            del self._text_layers[next(iter(self._text_layers))]

    def _render_text_layer(self, text: Any, renderer: Any) -> LegendLayer:
        from matplotlib.backends.backend_agg import RendererAgg

        width, height = int(renderer.width), int(renderer.height)
        scratch = self._scratch
        if scratch is None or (int(scratch.width), int(scratch.height), scratch.dpi) != (width, height, renderer.dpi):
            scratch = self._scratch = RendererAgg(width, height, renderer.dpi)
        scratch.clear()  # transparent black
        text.draw(scratch)
        # measured on the layer, whose layout of the text is cached (same size and dpi as the figure's)
        return LegendLayer.cut(scratch, text.get_window_extent(scratch))

    def _draw_legends(self, renderer: Any) -> None:
        legends = self._legends()
        buf = np.asarray(renderer.buffer_rgba())
        for lg in legends:
            if not lg.get_visible():
                continue
            signature = legend_signature(lg, renderer)
            key = (id(lg), signature)  # a legend whose texts come back finds its layer
            layer = self._legend_layers.pop(key, None)
            if layer is None:
                layer = LegendLayer.render(lg, renderer)
            self._legend_layers[key] = layer  # most recently used goes last
            if not layer.composite(buf):
                lg.draw(renderer)  # a see-through figure: let Agg blend it
            lg.stale = False
        while len(self._legend_layers) > self.max_legend_layers:  # keep those of recent settings
            del self._legend_layers[next(iter(self._legend_layers))]

    def png(self) -> bytes:
        """The current Agg buffer as PNG bytes (fast compression: it is sent on every update).

        Encoded by a :class:`PngEncoder` kept with the composer: the bands of rows that did not
        change since the last frame keep their compressed bytes."""
        with _SHARED_LOCK:  # another panel's render may drop this one's encoder (see SHARED_BACKGROUNDS)
            if self._encoder is None:
                self._encoder = PngEncoder()
            return self._encoder.encode(np.asarray(self.canvas.buffer_rgba()))


class LegendLayer:
    """One legend (or text) rendered on a transparent layer, cut to its bounding box, ready to composite.

    Laying it over the frame ("over" blending in float32, as Agg blends) costs 0.3-1 ms for a
    legend; the pixels it covered and the result are kept, so when the same pixels lie under it
    again (the legend sits on the unchanged background, the usual case) the result is copied back.
    """

    def __init__(self, rows: slice, cols: slice, premultiplied: np.ndarray, transparency: np.ndarray) -> None:
        self.rows, self.cols = rows, cols
        self.premultiplied, self.transparency = premultiplied, transparency
        self._under: np.ndarray | None = None  # the pixels under the layer at the last composite
        self._over: np.ndarray | None = None  # and what they became

    @classmethod
    def render(cls, legend: Any, renderer: Any) -> LegendLayer:
        from matplotlib.backends.backend_agg import RendererAgg

        width, height = int(renderer.width), int(renderer.height)
        layer = RendererAgg(width, height, renderer.dpi)
        layer.clear()  # transparent black
        legend.draw(layer)
        return cls.cut(layer, legend.get_window_extent(layer))

    @classmethod
    def cut(cls, layer: Any, extent: Any) -> LegendLayer:
        """The part of ``layer`` (a transparent renderer drawn on) inside ``extent`` (display pixels)."""
        width, height = int(layer.width), int(layer.height)
        x0, y0, x1, y1 = extent.extents
        pad = 3  # antialiased edges and the frame's line width
        c0, c1 = max(int(np.floor(x0)) - pad, 0), min(int(np.ceil(x1)) + pad, width)
        r0, r1 = max(height - int(np.ceil(y1)) - pad, 0), min(height - int(np.floor(y0)) + pad, height)
        c1, r1 = max(c1, c0), max(r1, r0)  # a box wholly outside the figure: nothing to lay over
        rgba = np.asarray(layer.buffer_rgba())[r0:r1, c0:c1].astype(np.float32)
        alpha = rgba[..., 3:] / 255.0
        return cls(slice(r0, r1), slice(c0, c1), rgba[..., :3] * alpha, 1.0 - alpha)

    def composite(self, buf: np.ndarray) -> bool:
        """Lay the layer over ``buf`` (an opaque RGBA frame, changed in place); False if not opaque."""
        region = buf[self.rows, self.cols]
        if self._under is not None and self._over is not None and np.array_equal(region, self._under):
            region[...] = self._over
            return True
        if region.size and region[..., 3].min() != 255:
            return False
        under = region.copy()
        region[..., :3] = np.rint(self.premultiplied + region[..., :3] * self.transparency).astype(np.uint8)
        self._under, self._over = under, region.copy()
        return True


def text_signature(text: Any, renderer: Any) -> tuple | None:
    """What a plain text's pixels depend on, or None for an artist drawn as it is (not a plain
    ``Text``, hidden, with a box, path effects, TeX, a wrap or a clip path)."""
    from matplotlib.colors import to_rgba
    from matplotlib.text import Text

    if type(text) is not Text or not text.get_visible() or not text.get_text():
        return None
    if text.get_bbox_patch() is not None or text.get_path_effects() or text.get_usetex() or text.get_wrap():
        return None
    if text.get_clip_on() and text.get_clip_path() is not None:
        return None
    clip = text.get_clip_box() if text.get_clip_on() else None
    return (
        text.get_text(),
        tuple(text.get_transform().transform(text.get_unitless_position())),
        text.get_rotation(),
        text.get_rotation_mode(),
        text.get_transform_rotates_text(),
        text.get_horizontalalignment(),
        text.get_verticalalignment(),
        text._multialignment,  # type: ignore[attr-defined]  # private: no public getter before matplotlib 3.10
        text._linespacing,  # type: ignore[attr-defined]  # private: no public getter before matplotlib 3.10
        text.get_fontproperties(),
        to_rgba(text.get_color()),
        text.get_alpha(),
        text.get_antialiased(),
        text.get_parse_math(),
        tuple(getattr(text, "get_fontfeatures", lambda: None)() or ()),
        getattr(text, "get_language", lambda: None)(),
        None if clip is None else tuple(clip.bounds),
        renderer.dpi,
    )


def legend_signature(legend: Any, renderer: Any) -> tuple:
    """What a legend's pixels depend on: its place and size, its texts and the look of its handles.

    The place is the legend's location and the box it is anchored to (its axes, or the
    ``bbox_to_anchor`` given) at the renderer's dpi: with the texts and handles (in the signature
    too) they fix its bounding box, which would take 1-2 ms to measure (a layout of every entry)
    on each frame. Only ``loc="best"`` depends on the data drawn; that legend's measured box is used.
    """
    from matplotlib.colors import to_rgba

    def look(artist: Any) -> tuple:
        props = []
        for getter in (
            "get_color",
            "get_facecolor",
            "get_edgecolor",
            "get_alpha",
            "get_linestyle",
            "get_linewidth",
            "get_marker",
            "get_visible",
        ):
            value = getattr(artist, getter, None)
            if value is not None:
                v = value()
                props.append(repr(to_rgba(v) if isinstance(v, str) and getter.endswith("color") else v))
        return tuple(props)

    loc = legend._loc  # a location code (0: "best") or the (x, y) of its lower left corner
    if isinstance(loc, (int, np.integer)) and loc == 0:
        place: tuple = ("best", tuple(legend.get_window_extent(renderer).bounds))
    else:
        place = (loc, tuple(legend.get_bbox_to_anchor().bounds), renderer.dpi, legend.borderaxespad)
    return (
        place,
        tuple((t.get_text(), look(t)) for t in legend.get_texts()),
        tuple(look(h) for h in legend.legend_handles),
        look(legend.get_frame()),
        legend.get_title().get_text(),
    )


def encode_png(rgba: np.ndarray) -> bytes:
    """An ``[H, W, 4]`` uint8 RGBA image as PNG bytes, written for speed rather than size.

    Panels send a frame on every update. Pillow's encoder spends most of its time choosing a
    filter per row; plot frames are mostly flat colour and compress about as well unfiltered with
    zlib's fastest level, in about a third of the time.
    """
    import zlib

    _check_rgba(rgba)
    height, width = rgba.shape[:2]
    rows = np.zeros((height, 1 + 4 * width), dtype=np.uint8)  # filter byte 0 ("none") per row
    rows[:, 1:] = rgba.reshape(height, 4 * width)
    return _png(width, height, 6, zlib.compress(rows.data.cast("B"), 1))  # 8-bit RGBA


#: frames drawn ahead go to the page as lossless WebP only with ``KLVIZ_WEBP_FRAMES=1``: see :func:`frame_url`
WEBP_FRAMES = os.environ.get("KLVIZ_WEBP_FRAMES", "") in ("1", "true", "yes")
#: libwebp's effort for those frames (``method``; 0 fastest)
WEBP_METHOD = int(os.environ.get("KLVIZ_WEBP_METHOD", "1"))


def blank_png(width: int, height: int) -> bytes:
    """A fully transparent ``width`` x ``height`` PNG (grey and alpha samples, all zero; under 1 kB
    at a panel's size)."""
    import zlib

    if width < 1 or height < 1:
        raise ValueError(f"width and height must be at least 1, got {width} x {height}")
    raw = bytes((1 + 2 * width) * height)  # per row: filter byte 0 ("none"), then two zero samples a pixel
    return _png(width, height, 4, zlib.compress(raw, 9))


def png_url(png: bytes) -> bytes:
    """A ``data:`` URL of the PNG bytes ``png``."""
    import base64

    return b"data:image/png;base64," + base64.b64encode(png)


def frame_url(rgba: np.ndarray, png: bytes) -> bytes:
    """A ``data:`` URL for a frame the page has not been sent yet: lossless WebP, else ``png``.

    Measured in headless Chromium, an image's ``load`` takes about as long as its compressed bytes
    are long: 4.8 ms (median) for a 70 kB PNG frame, 1.6 ms for the same pixels as a 37 kB lossless
    WebP. Encoding WebP costs 7-16 ms a frame here, more than the PNG writer's bands, so it is spent
    only on frames made while the kernel idles, on a thread of their own (:mod:`klviz.widgets.ahead`),
    and only with ``KLVIZ_WEBP_FRAMES=1`` (:data:`WEBP_FRAMES`): libwebp's lossless encoder holds
    about 6 MB while it works on a panel's frame (24 MB at a pixel ratio of 2), which set a lesson
    kernel's peak in JupyterLab (lesson 08's slider moves: 404 MB with it, 393 MB without).
    Lossless: the page shows the same pixels (``tests/test_panel_frames.py``). ``png`` (the same
    frame) is used when Pillow has no WebP support or the frame is not opaque.
    """
    import base64
    import io

    _check_rgba(rgba)
    try:
        from PIL import Image, features

        if not features.check("webp") or not bool((rgba[..., 3] == 255).all()):
            raise ValueError("no WebP support, or a transparent frame")
        out = io.BytesIO()
        Image.fromarray(np.ascontiguousarray(rgba[..., :3])).save(
            out, "WEBP", lossless=True, method=WEBP_METHOD, quality=0
        )
        return b"data:image/webp;base64," + base64.b64encode(out.getvalue())
    except (ImportError, ValueError, OSError):
        return png_url(png)


class PngEncoder:
    """PNG frames of one figure, re-compressing only the bands of rows that changed since the last.

    A blitted frame changes the rows its moving artists cover (a quarter to four fifths of a panel's
    rows) and leaves the rest as they were. The image data is written as one deflate stream made of
    independent pieces, one per band of :attr:`band` rows, each compressed on its own (zlib level 1,
    no per-row filter) and ended by a full flush, so that a band whose pixels are unchanged reuses
    its bytes from the previous frame; only the checksum covers the whole image each time. A band is
    unchanged when the SHA-1 digest of its pixels is: the encoder keeps 20 bytes per band instead of
    a copy of the last frame (1.3 MB for a panel, 5 MB at a pixel ratio of 2), for about 0.7 ms more
    a frame than comparing the pixels. Frames stay 8-bit RGBA: dropping the alpha channel (RGB) costs a
    strided copy (about 3 ms a frame) that zlib does not win back. Decoding gives back the pixels
    exactly (``tests/test_panel_frames.py``).
    """

    #: rows per independently compressed band (smaller: more reuse, slightly larger files)
    band: int = 16

    def __init__(self) -> None:
        self._key: tuple | None = None  # (height, width) of the cached frame
        self._digests: list[bytes] = []  # SHA-1 of each band's RGBA pixels in the last frame
        self._pieces: list[bytes] = []  # each band's compressed PNG rows
        self._checksums: list[int] = []  # adler32 of each band's PNG rows

    def encode(self, rgba: np.ndarray) -> bytes:
        """``rgba`` (``[H, W, 4]`` uint8) as PNG bytes; decodes to exactly these pixels."""
        import hashlib
        import zlib

        _check_rgba(rgba)
        rgba = np.ascontiguousarray(rgba)
        height, width = rgba.shape[:2]
        band = self.band
        count = -(-height // band)
        if (height, width) != self._key or len(self._pieces) != count:
            self._key = (height, width)
            self._digests, self._pieces, self._checksums = [b""] * count, [b""] * count, [1] * count
        rows = np.zeros((band, 1 + 4 * width), dtype=np.uint8)  # one band's PNG rows: filter byte 0, pixels
        for i in range(count):
            r0, r1 = i * band, min(i * band + band, height)
            digest = hashlib.sha1(rgba[r0:r1].data).digest()
            if digest == self._digests[i]:
                continue
            rows[: r1 - r0, 1:] = rgba[r0:r1].reshape(r1 - r0, 4 * width)
            data = rows[: r1 - r0].data.cast("B")
            comp = zlib.compressobj(1, zlib.DEFLATED, -15)  # raw deflate, no dictionary carried over
            self._pieces[i] = comp.compress(data) + comp.flush(zlib.Z_FULL_FLUSH)
            self._checksums[i] = zlib.adler32(data)
            self._digests[i] = digest
        checksum = self._checksums[0]
        row_bytes = rows.shape[1]
        for i in range(1, count):  # the whole image's adler32, from those of its bands
            length = (min(i * band + band, height) - i * band) * row_bytes
            checksum = adler32_combine(checksum, self._checksums[i], length)
        idat = b"".join([b"\x78\x01", *self._pieces, _DEFLATE_END, checksum.to_bytes(4, "big")])
        return _png(width, height, 6, idat)


def adler32_combine(first: int, second: int, second_length: int) -> int:
    """The adler32 of two pieces of data joined, from the checksum of each (zlib's ``adler32_combine``)."""
    base = 65521
    rem = second_length % base
    sum1 = first & 0xFFFF
    sum2 = (rem * sum1) % base
    sum1 = (sum1 + (second & 0xFFFF) + base - 1) % base
    sum2 = (sum2 + ((first >> 16) & 0xFFFF) + ((second >> 16) & 0xFFFF) + base - rem) % base
    return sum1 | (sum2 << 16)


#: an empty final deflate block: ends a stream of full-flushed pieces
_DEFLATE_END = b"\x03\x00"


def _check_rgba(rgba: np.ndarray) -> None:
    if rgba.ndim != 3 or rgba.shape[2] != 4 or rgba.dtype != np.uint8:
        raise ValueError(f"rgba must be a uint8 array of shape [H, W, 4]; got {rgba.dtype} {tuple(rgba.shape)}")


def _png(width: int, height: int, colour_type: int, idat: bytes) -> bytes:
    """A PNG file: 8-bit samples of ``colour_type`` (6: RGBA), one IDAT chunk, no interlace."""
    import struct
    import zlib

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))

    header = struct.pack(">IIBBBBB", width, height, 8, colour_type, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


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
