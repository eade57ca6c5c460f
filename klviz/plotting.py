"""One visual language for the whole suite: colours per estimator, a quiet style, figure helpers."""

from __future__ import annotations

import math
from typing import Any

import matplotlib as mpl
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from .messages import N_, tr
from .palette import FIGURE_BACKGROUND, colour
from .palette import theme as _palette_theme

#: the names of :data:`klviz.palette.NAMED` that figures use, by :data:`COLORS`
_FIGURE_COLOURS = (
    "k1",
    "k2",
    "k3",
    "exact",
    "q",
    "p",
    "mu",
    "reverse",
    "forward",
    "brown",
    "cyan",
    "ink",
    "muted",
    "bad",
    "warn",
)

__all__ = ["COLORS", "LABELS", "apply_style", "theme", "new_figure", "panel_figure", "snapped_limits", "sticky_limits"]

#: The same colour means the same quantity in every lesson; the values are those of the page the
#: figures are drawn for (:func:`apply_style` sets them from :data:`klviz.palette.NAMED`). ``"ink"`` is
#: what a figure would draw in black (dark grey on a light page, light grey on a dark one).
COLORS: dict[str, str] = {name: colour(name, "light") for name in _FIGURE_COLOURS}


class _Labels(dict[str, str]):
    """Labels that come out in the reader's language (:func:`klviz.messages.tr`) when they are read."""

    def __getitem__(self, key: str) -> str:
        return tr(super().__getitem__(key))


LABELS: dict[str, str] = _Labels(
    {
        "k1": r"$k_1=-\log r$",
        "k2": r"$k_2=\frac{1}{2}(\log r)^2$",
        "k3": r"$k_3=(r-1)-\log r$",
        "exact": N_("exact KL"),
    }
)

_STYLE: dict[Any, Any] = {  # keys: rcParams names
    "figure.dpi": 100,
    "savefig.dpi": 100,
    "font.size": 9.5,
    "axes.titlesize": 10.5,
    "axes.labelsize": 9.5,
    "legend.fontsize": 8.5,
    "legend.frameon": False,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.25,
    "grid.linewidth": 0.6,
    "figure.constrained_layout.use": True,
}


#: Colours that change on a dark page (presenter mode with ``--theme dark``): text, axes and the
#: near-black series become light; every series takes its dark-page value (:mod:`klviz.palette`).
_DARK: dict[Any, Any] = {
    "figure.facecolor": FIGURE_BACKGROUND["dark"],
    "axes.facecolor": FIGURE_BACKGROUND["dark"],
    "savefig.facecolor": FIGURE_BACKGROUND["dark"],
    "legend.facecolor": FIGURE_BACKGROUND["dark"],
    "text.color": "#e6e6e6",
    "axes.labelcolor": "#e6e6e6",
    "axes.edgecolor": "#9a9a9a",
    "xtick.color": "#cfcfcf",
    "ytick.color": "#cfcfcf",
    "xtick.labelcolor": "#cfcfcf",
    "ytick.labelcolor": "#cfcfcf",
    "grid.color": "#bbbbbb",
    "grid.alpha": 0.2,
    "legend.labelcolor": "#e6e6e6",
    "patch.edgecolor": "#e6e6e6",
    "lines.color": "#e6e6e6",
}
#: The light page: matplotlib's defaults, restored when a kernel switches back from dark.
_LIGHT: dict[Any, Any] = {key: mpl.rcParamsDefault[key] for key in _DARK}


def theme() -> str:
    """The page the figures go on: ``"dark"`` when ``KLVIZ_THEME=dark`` (presenter mode sets it), else ``"light"``."""
    return _palette_theme()


def apply_style() -> None:
    """Apply the klviz style to matplotlib's global settings (idempotent), for the page's :func:`theme`."""
    from .fonts import use_in_matplotlib

    which = theme()
    mpl.rcParams.update(_LIGHT)
    mpl.rcParams.update(_STYLE)
    use_in_matplotlib()  # Chinese glyphs from the shipped CJK font where the default font has none
    if which == "dark":
        mpl.rcParams.update(_DARK)
    COLORS.update({name: colour(name, which) for name in _FIGURE_COLOURS})


def new_figure(width: float = 9.0, height: float = 3.6, **subplot_kw: Any) -> tuple[Figure, Any]:
    """A figure with subplots, created without being displayed (a lesson displays it).

    In an interactive notebook (ipympl) the figure keeps no pixels between frames: see
    :func:`release_pixels_after_each_frame`.
    """
    apply_style()
    with plt.ioff():
        fig, axes = plt.subplots(figsize=(width, height), **subplot_kw)
    release_pixels_after_each_frame(fig)
    return fig, axes


def release_pixels_after_each_frame(fig: Figure) -> None:
    """Let an interactive figure (ipympl) drop its two pixel buffers once it has sent a frame.

    A browser-backed canvas keeps the Agg renderer it drew into and a copy of the last frame (to send
    only the pixels that change next time): two buffers of width x height x 4 bytes at the screen's
    pixel ratio, 3 MB for a 10 x 3.6 inch figure, 12 MB on a high-density screen, for as long as the
    kernel lives. A lesson's figure is drawn once and then read, so after each frame both are
    released: a pan or a zoom draws into a new renderer and sends a full frame (a bigger message, the
    same picture). Canvases of other backends (inline PNG, Agg) are left as they are.
    """
    canvas: Any = fig.canvas  # ipympl's Canvas: its private attributes are what is released
    send_binary = getattr(canvas, "send_binary", None)
    if send_binary is None or not hasattr(canvas, "_last_buff") or not hasattr(canvas, "_lastKey"):
        return

    def send_then_release(data: Any) -> None:
        send_binary(data)  # ipympl may still read the last frame here (the figure's static image)
        canvas._last_buff = np.empty((0, 0))
        canvas._force_full = True  # the next frame is a whole picture, not a difference from this one
        canvas._lastKey = None  # the next draw makes a new renderer (FigureCanvasAgg.get_renderer)
        canvas.__dict__.pop("renderer", None)

    canvas.send_binary = send_then_release


def panel_figure(width: float = 9.0, height: float = 3.6, **subplot_kw: Any) -> tuple[Figure, Any]:
    """A figure with subplots for a panel: drawn by Agg, outside pyplot, whatever the notebook's backend.

    A panel sends its frames itself (``klviz.widgets.base``), so its figure needs no interactive
    canvas and no place in pyplot's list of open figures (which would keep every panel alive).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    apply_style()
    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    axes = fig.subplots(**subplot_kw)
    return fig, axes


def sticky_limits(
    ax: Any, axis: str, lo: float, hi: float, *, keep_fraction: float = 0.35, headroom: float = 0.15
) -> None:
    """Set ``ax``'s x or y limits to show [lo, hi], changing them only when they must.

    The current limits are kept while they contain [lo, hi] and [lo, hi] fills at least
    ``keep_fraction`` of them. Otherwise they become :func:`snapped_limits` of [lo, hi]: widened by
    ``headroom`` of its span on each side (a side at exactly 0 stays at 0), then rounded outward to a
    round grid. Limits that rarely move keep a panel readable (the axis does not jump on every slider
    step); limits that are a function of the data alone come back exactly when a control does, so
    the panel finds the background it rendered for them (see the frame cache in
    :mod:`klviz.widgets.base`) instead of rendering all the axes again.
    """
    lo, hi = float(lo), float(hi)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise ValueError(f"limits must be finite numbers, got [{lo}, {hi}]")
    if hi <= lo:
        hi = lo + (abs(lo) * 0.1 or 1.0)
    get, set_ = (ax.get_xlim, ax.set_xlim) if axis == "x" else (ax.get_ylim, ax.set_ylim)
    log = (ax.get_xscale if axis == "x" else ax.get_yscale)() == "log"
    cur_lo, cur_hi = get()
    if log and (lo <= 0 or cur_lo <= 0):  # a log axis needs positive limits: show what was asked
        set_(lo, hi)
        return
    fwd, back = (math.log10, lambda v: 10.0**v) if log else (lambda v: v, lambda v: v)
    lo_t, hi_t, cur_lo_t, cur_hi_t = fwd(lo), fwd(hi), fwd(cur_lo), fwd(cur_hi)
    if cur_lo_t <= lo_t and hi_t <= cur_hi_t and hi_t - lo_t >= keep_fraction * (cur_hi_t - cur_lo_t):
        return
    new_lo, new_hi = snapped_limits(lo_t, hi_t, headroom=headroom, keep_zero=not log)
    set_(back(new_lo), back(new_hi))


def snapped_limits(lo: float, hi: float, *, headroom: float = 0.15, keep_zero: bool = True) -> tuple[float, float]:
    """[lo, hi] widened by ``headroom`` of its span on each side and rounded outward to a round grid.

    The grid step is a twentieth of the span rounded up to 1, 2 or 5 times a power of ten (at most an
    eighth of the span), so the result depends on the data alone and takes few distinct values as the
    data moves. With ``keep_zero`` a
    side at exactly 0 stays at 0 (a bar chart keeps its baseline).
    """
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        raise ValueError(f"need finite lo < hi, got [{lo}, {hi}]")
    span = hi - lo
    exponent = math.floor(math.log10(span / 20))
    step = next(m * 10.0**exponent for m in (1, 2, 5, 10) if m * 10.0**exponent >= span / 20)
    new_lo = 0.0 if (keep_zero and lo == 0) else math.floor((lo - headroom * span) / step) * step
    new_hi = 0.0 if (keep_zero and hi == 0) else math.ceil((hi + headroom * span) / step) * step
    return new_lo, new_hi


def contrast_problems(fig: Figure, *, minimum: float | None = None) -> list[str]:
    """The texts and lines of ``fig`` that read below ``minimum`` (default 4.5:1, WCAG AA) on what they
    are drawn on, from the colours used.

    Each visible text (titles, labels, tick labels, legend entries, annotations) is measured against
    its box if it has one, else its legend's frame, else the axes' face, else the figure's; each line
    (lines, markers, unfilled patches such as spines and steps, line collections such as error bars,
    arrows) against its axes' face. Colours are taken with their transparency, blended over that
    background. Grid lines (decoration, deliberately faint) and filled areas are not measured.
    """
    import numpy as np
    from matplotlib.axes import Axes
    from matplotlib.collections import Collection, LineCollection, PathCollection, PolyCollection
    from matplotlib.colors import to_rgba
    from matplotlib.legend import Legend
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib.quiver import Quiver
    from matplotlib.text import Text

    from .palette import MIN_CONTRAST, blend, contrast_ratio

    minimum = MIN_CONTRAST if minimum is None else minimum
    fig.draw_without_rendering()  # tick labels and legends get their texts and places
    fig_bg = blend(to_rgba(fig.get_facecolor()), (1.0, 1.0, 1.0))
    problems: list[str] = []
    grid: set[int] = set()
    for ax in fig.axes:
        grid.update(id(line) for line in (*ax.xaxis.get_gridlines(), *ax.yaxis.get_gridlines()))

    def name(artist: Any) -> str:
        label = artist.get_label() if hasattr(artist, "get_label") else ""
        where = getattr(artist, "axes", None)
        title = where.get_title() if where is not None else ""
        return f"{type(artist).__name__} {label!r}" + (f" in {title!r}" if title else "")

    def check(artist: Any, colour: Any, background: tuple[float, float, float], what: str) -> None:
        rgba = to_rgba(colour)
        alpha = artist.get_alpha()
        if alpha is not None:
            rgba = (*rgba[:3], rgba[3] * alpha)
        if rgba[3] == 0:
            return
        ratio = contrast_ratio(blend(rgba, background), background)
        if ratio < minimum:
            problems.append(f"{what} of {name(artist)}: {ratio:.2f}:1 (needs {minimum}:1)")

    def walk(artist: Any, background: tuple[float, float, float]) -> None:
        if not artist.get_visible():
            return
        if isinstance(artist, Axes):
            face = artist.patch
            background = blend(to_rgba(face.get_facecolor()), background) if face.get_visible() else background
        if isinstance(artist, Legend) and artist.get_frame_on():
            frame = artist.get_frame()
            background = blend(to_rgba(frame.get_facecolor()), background)
        if isinstance(artist, Text):
            if artist.get_text().strip():
                box = artist.get_bbox_patch()
                on = blend(to_rgba(box.get_facecolor()), background) if box is not None else background
                check(artist, artist.get_color(), on, "text")
        elif isinstance(artist, Line2D):
            if id(artist) not in grid and np.size(artist.get_xdata(orig=False)):
                if artist.get_linestyle() not in ("None", "", " ") and artist.get_linewidth() > 0:
                    check(artist, artist.get_color(), background, "line")
                if artist.get_marker() not in (None, "None", "", " "):
                    faces = [c for c in (artist.get_markerfacecolor(), artist.get_markeredgecolor()) if c != "none"]
                    if faces:  # the marker reads if its face or its edge does
                        best = max(faces, key=lambda c: contrast_ratio(blend(to_rgba(c), background), background))
                        check(artist, best, background, "marker")
        elif isinstance(artist, Quiver):
            for colour in np.atleast_2d(artist.get_facecolor()):
                check(artist, tuple(colour), background, "arrows")
        elif isinstance(artist, (LineCollection, PathCollection)) or (
            isinstance(artist, Collection) and not isinstance(artist, PolyCollection)
        ):
            colours = np.atleast_2d(artist.get_edgecolor()) if np.size(artist.get_linewidth()) else np.zeros((0, 4))
            if isinstance(artist, PathCollection) and np.size(artist.get_facecolor()):  # scatter: the face
                colours = np.atleast_2d(artist.get_facecolor())
            for colour in colours:
                check(artist, tuple(colour), background, "lines")
        elif isinstance(artist, Patch):
            unfilled = not artist.get_fill() or to_rgba(artist.get_facecolor())[3] == 0
            if unfilled and artist.get_linewidth() > 0:
                check(artist, artist.get_edgecolor(), background, "outline")
        for child in artist.get_children():
            walk(child, background)

    walk(fig, fig_bg)
    return problems
