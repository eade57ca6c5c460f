"""One visual language for the whole suite: colours per estimator, a quiet style, figure helpers."""
from __future__ import annotations

from typing import Any

import matplotlib as mpl
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

__all__ = ["COLORS", "LABELS", "apply_style", "new_figure"]

#: The same colour means the same quantity in every lesson.
COLORS: dict[str, str] = {
    "k1": "#1f77b4", "k2": "#ff7f0e", "k3": "#2ca02c", "exact": "#222222",
    "q": "#7f7f7f", "p": "#9467bd", "mu": "#d62728", "reverse": "#2ca02c", "forward": "#d62728",
}
LABELS: dict[str, str] = {
    "k1": r"$k_1=-\log r$", "k2": r"$k_2=\frac{1}{2}(\log r)^2$", "k3": r"$k_3=(r-1)-\log r$",
    "exact": "exact KL",
}

_STYLE: dict[str, Any] = {
    "figure.dpi": 100, "savefig.dpi": 100, "font.size": 9.5, "axes.titlesize": 10.5,
    "axes.labelsize": 9.5, "legend.fontsize": 8.5, "legend.frameon": False,
    "axes.spines.top": False, "axes.spines.right": False, "axes.grid": True,
    "grid.alpha": 0.25, "grid.linewidth": 0.6, "figure.constrained_layout.use": True,
}


def apply_style() -> None:
    """Apply the klviz style to matplotlib's global settings (idempotent)."""
    mpl.rcParams.update(_STYLE)


def new_figure(width: float = 9.0, height: float = 3.6, **subplot_kw: Any) -> tuple[Figure, Any]:
    """A figure with subplots, created without being displayed (panels show it themselves)."""
    apply_style()
    with plt.ioff():
        fig, axes = plt.subplots(figsize=(width, height), **subplot_kw)
    return fig, axes
