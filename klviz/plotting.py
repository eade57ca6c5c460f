"""One visual language for the whole suite: colours per estimator, a quiet style, figure helpers."""

from __future__ import annotations

import math
from typing import Any

import matplotlib as mpl
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

__all__ = ["COLORS", "LABELS", "apply_style", "theme", "new_figure", "panel_figure", "snapped_limits", "sticky_limits"]

#: The same colour means the same quantity in every lesson.
COLORS: dict[str, str] = {
    "k1": "#1f77b4",
    "k2": "#ff7f0e",
    "k3": "#2ca02c",
    "exact": "#222222",
    "q": "#7f7f7f",
    "p": "#9467bd",
    "mu": "#d62728",
    "reverse": "#2ca02c",
    "forward": "#d62728",
}
LABELS: dict[str, str] = {
    "k1": r"$k_1=-\log r$",
    "k2": r"$k_2=\frac{1}{2}(\log r)^2$",
    "k3": r"$k_3=(r-1)-\log r$",
    "exact": "exact KL",
}

_STYLE: dict[str, Any] = {
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
#: near-black series become light; the estimator colours read on both.
_DARK: dict[str, Any] = {
    "figure.facecolor": "#111111",
    "axes.facecolor": "#111111",
    "savefig.facecolor": "#111111",
    "text.color": "#e6e6e6",
    "axes.labelcolor": "#e6e6e6",
    "axes.edgecolor": "#9a9a9a",
    "xtick.color": "#cfcfcf",
    "ytick.color": "#cfcfcf",
    "grid.color": "#bbbbbb",
    "grid.alpha": 0.2,
    "legend.labelcolor": "#e6e6e6",
    "patch.edgecolor": "#e6e6e6",
}
_DARK_COLORS = {"exact": "#e6e6e6", "q": "#b0b0b0"}
_LIGHT_COLORS = {k: COLORS[k] for k in _DARK_COLORS}


def theme() -> str:
    """The page the figures go on: ``"dark"`` when ``KLVIZ_THEME=dark`` (presenter mode sets it), else ``"light"``."""
    import os

    return "dark" if os.environ.get("KLVIZ_THEME", "").strip().lower() == "dark" else "light"


def apply_style() -> None:
    """Apply the klviz style to matplotlib's global settings (idempotent), for the page's :func:`theme`."""
    from .fonts import use_in_matplotlib

    dark = theme() == "dark"
    mpl.rcParams.update(_STYLE)
    use_in_matplotlib()  # Chinese glyphs from the shipped CJK font where the default font has none
    if dark:
        mpl.rcParams.update(_DARK)
    COLORS.update(_DARK_COLORS if dark else _LIGHT_COLORS)


def new_figure(width: float = 9.0, height: float = 3.6, **subplot_kw: Any) -> tuple[Figure, Any]:
    """A figure with subplots, created without being displayed (panels show it themselves)."""
    apply_style()
    with plt.ioff():
        fig, axes = plt.subplots(figsize=(width, height), **subplot_kw)
    return fig, axes


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
