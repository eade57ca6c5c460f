"""Lesson 03's panel: an estimator as the gap between a convex curve and its tangent at r = 1.

Pick a generator f and a ratio r = p(x)/q(x). Left: f(t), its tangent at t = 1, and the vertical gap
at t = r, which is the per-sample estimator f(r) - f'(1)(r - 1) (k3 for f = -log t; r log r - (r - 1)
for f = t log t). Right: that estimator for every r on a log axis, with the region where f'' < 0
(f not convex) shaded.
"""

from __future__ import annotations

import html
import math
from typing import Any

import ipywidgets as widgets
import numpy as np
import torch
from matplotlib.figure import Figure

from ..estimators import k3
from ..fdiv import GENERATORS, bregman_gap, f_second, f_value, generator, tangent_at_one
from ..messages import N_, tr
from ..palette import css
from ..plotting import COLORS, panel_figure, sticky_limits
from .base import Panel

__all__ = ["BregmanPanel", "F_CHOICES"]

#: The generators offered by the panel, as (label, name) pairs.
F_CHOICES = (
    ("−log t  → KL(q‖p)", "-log t"),
    ("t log t  → KL(p‖q)", "t log t"),
    ("½(log t)²  (k2)", "k2"),
    ("(t − 1)²  → χ²", "chi2"),
    ("(√t − 1)²  → Hellinger", "hellinger"),
)
_R_MIN, _R_MAX = 10**-1.5, 10**1.3
_GRID_LOG = np.linspace(math.log(_R_MIN), math.log(_R_MAX), 400)


class BregmanPanel(Panel):
    """Drag r along the curve of f: the tangent at 1, the gap, and its value as an estimator."""

    title = N_("Bregman view: the estimator is the gap between f and its tangent at r = 1")
    css_class = "klviz-bregman"

    def make_controls(self) -> dict[str, widgets.ValueWidget]:
        return {
            "f": widgets.ToggleButtons(
                options=list(F_CHOICES),
                value="-log t",
                description="f(t)",
                style={"button_width": "165px"},
            ),
            "r": widgets.FloatLogSlider(
                value=2.5,
                base=10,
                min=-1.5,
                max=1.3,
                step=0.01,
                description="r = p(x)/q(x)",
                readout_format=".3g",
                style={"description_width": "initial"},
                layout=widgets.Layout(width="520px"),
                continuous_update=True,
            ),
        }

    def layout_controls(self) -> widgets.Widget:
        return widgets.VBox([self.controls["f"], self.controls["r"]])

    def make_figure(self) -> Figure:
        fig, (ax_f, ax_g) = panel_figure(8.4, 3.6, ncols=2)
        (self.curve,) = ax_f.plot([], [], color=COLORS["k3"], lw=2.0, label="f(t)")
        (self.tangent,) = ax_f.plot([], [], color=COLORS["exact"], ls="--", lw=1.2, label=tr("tangent at t = 1"))
        (self.gap_line,) = ax_f.plot(
            [], [], color=COLORS["mu"], lw=3.0, solid_capstyle="butt", label=tr("gap = estimator")
        )
        (self.point,) = ax_f.plot([], [], "o", color=COLORS["mu"], ms=6)
        (self.one,) = ax_f.plot([1.0], [0.0], "o", color=COLORS["exact"], ms=5)
        ax_f.axhline(0, color=COLORS["ink"], lw=0.6)
        ax_f.set_xlabel(tr("t  (a ratio p/q)"))
        ax_f.set_ylabel("f(t)")
        ax_f.legend(loc="upper center", fontsize=8)
        self.ax_f = ax_f

        grid = np.exp(_GRID_LOG)
        self.shade = ax_g.axvspan(math.e, _R_MAX, color=COLORS["mu"], alpha=0.08, lw=0, label=tr("f'' < 0: not convex"))
        (self.est_curve,) = ax_g.plot(
            grid, np.zeros_like(grid), color=COLORS["k3"], lw=2.0, label="f(r) − f′(1)(r − 1)"
        )
        (self.naive_curve,) = ax_g.plot(
            grid, np.zeros_like(grid), color=COLORS["q"], lw=1.2, ls=":", label=tr("f(r) alone (same mean)")
        )
        (self.est_point,) = ax_g.plot([], [], "o", color=COLORS["mu"], ms=6)
        ax_g.axhline(0, color=COLORS["ink"], lw=0.6)
        ax_g.axvline(1.0, color=COLORS["q"], lw=0.6, ls=":")
        ax_g.set_xscale("log")
        ax_g.minorticks_off()
        ax_g.set_xlim(_R_MIN, _R_MAX)
        ax_g.set_xlabel(tr("r = p(x)/q(x)  (log scale)"))
        ax_g.set_ylabel(tr("one sample's estimate"))
        ax_g.set_title(tr("the estimator for every r"))
        ax_g.legend(loc="upper center", fontsize=8)
        self.ax_g = ax_g
        self._legend_f: str | None = None
        return fig

    def compute(self, f: str, r: float) -> dict[str, Any]:
        gen = generator(f)
        r = float(r)
        if not (math.isfinite(r) and r > 0):
            raise ValueError(f"r must be a positive finite ratio, got {r!r}")
        log_r = torch.tensor(math.log(r), dtype=torch.float64)
        t_max = max(4.0, 1.25 * r)
        t = np.linspace(max(1e-3, 0.01 * min(r, 1.0)), t_max, 300)
        lt = torch.from_numpy(np.log(t))
        curve = f_value(gen, lt).numpy()
        tangent = tangent_at_one(gen, lt).numpy()
        grid = torch.from_numpy(_GRID_LOG)
        value = float(f_value(gen, log_r))
        tan_r = float(tangent_at_one(gen, log_r))
        gap = float(bregman_gap(gen, log_r))
        curvature = float(f_second(gen, log_r))
        return {
            "f": gen.name,
            "r": r,
            "log_r": math.log(r),
            "t": t,
            "curve": curve,
            "tangent": tangent,
            "f_r": value,
            "tangent_r": tan_r,
            "gap": gap,
            "curvature": curvature,
            "estimator": bregman_gap(gen, grid).numpy(),
            "naive": f_value(gen, grid).numpy(),
            "k3": float(k3(log_r)),
            "t_max": t_max,
        }

    def draw(self, data: dict[str, Any]) -> None:
        gen = GENERATORS[data["f"]]
        r, fr, tan_r, gap = data["r"], data["f_r"], data["tangent_r"], data["gap"]
        t, curve, tangent = data["t"], data["curve"], data["tangent"]
        self.curve.set_data(t, curve)
        self.tangent.set_data(t, tangent)
        self.gap_line.set_data([r, r], [tan_r, fr])
        self.point.set_data([r], [fr])
        sticky_limits(self.ax_f, "x", 0, data["t_max"])
        # y range: the curve where it is visible, both ends of the gap, and a little room for the legend
        visible = t >= min(0.15, r)
        ys = np.concatenate([curve[visible], tangent[visible], [fr, tan_r, 0.0]])
        lo, hi = float(np.min(ys)), float(np.max(ys))
        pad = 0.08 * (hi - lo) if hi > lo else 0.5
        sticky_limits(self.ax_f, "y", lo - pad, hi + 0.45 * (hi - lo) + pad)
        self.ax_f.set_title(tr("f(t) = {formula}: gap at r = {r:.3g} is {gap:.3g}", formula=gen.formula, r=r, gap=gap))

        est, naive = data["estimator"], data["naive"]
        self.est_curve.set_ydata(est)
        self.naive_curve.set_ydata(naive)
        self.naive_curve.set_visible(gen.df1 != 0)
        self.est_point.set_data([r], [gap])
        self.shade.set_visible(not gen.convex)
        if gen.name != self._legend_f:  # legends list only what is shown: one pair per f
            self.curve.set_label(f"f(t) = {gen.formula}")
            self.show_legend(self.ax_f, gen.name, loc="upper center", fontsize=8)
            self.shade.set_label("_f'' < 0" if gen.convex else tr("f'' < 0: not convex"))
            self.naive_curve.set_label("_f(r) alone" if gen.df1 == 0 else tr("f(r) alone (same mean, can be < 0)"))
            self.show_legend(self.ax_g, gen.name, loc="upper center", fontsize=8)
            self._legend_f = gen.name
        # y range: the curves up to a little beyond the current r (the far right may run off the top)
        near = np.exp(_GRID_LOG) <= max(4.0, 2.0 * r)
        lo = min(float(est.min()), float(naive[near].min()) if gen.df1 != 0 else 0.0, 0.0)
        hi = max(float(est[near].max()), gap, 1e-3)
        sticky_limits(self.ax_g, "y", lo - 0.05 * (hi - lo), hi + 0.35 * (hi - lo))

        what = {
            "-log t": tr(
                "= k3 = (r − 1) − log r, one sample's estimate of KL(q‖p) (klviz.k3 gives <span "
                "class='klviz-k3'>{k3:.6g}</span>)",
                k3=data["k3"],
            ),
            "t log t": tr("= r log r − (r − 1), one sample's estimate of KL(p‖q), from q's samples"),
            "k2": tr("= k2 = ½ (log r)²: f′(1) = 0, the tangent is flat and the gap is f itself"),
            "chi2": tr("= (r − 1)²: f′(1) = 0, already non-negative"),
            "hellinger": tr("= (√r − 1)²: f′(1) = 0, already non-negative"),
        }[gen.name]
        convex_note = (
            ""
            if data["curvature"] >= 0
            else tr(
                "<br><b style='color:{css}'>f″(r) = {curvature:.3g} &lt; 0:</b> at r &gt; e ½(log t)² "
                "bends the wrong way, so E<sub>q</sub>[k2] is not an f-divergence.",
                css=css("bad"),
                curvature=data["curvature"],
            )
        )
        self.readout.value = tr(
            "<div style='font-size:92%'>r = <b>{r:.4g}</b> (log r = {log_r:+.3f}) · f(r) = {fr:.4g} "
            "· tangent f′(1)(r − 1) = {tan_r:.4g} · <b>gap</b> f(r) − f′(1)(r − 1) = <b "
            "class='klviz-gap'>{gap:.6g}</b> {what}. Its mean under q is E<sub>q</sub>[f(r)] = "
            "{divergence}, because E<sub>q</sub>[r − 1] = 0.{convex_note}</div>",
            r=r,
            log_r=data["log_r"],
            fr=fr,
            tan_r=tan_r,
            gap=gap,
            what=what,
            divergence=html.escape(gen.divergence),
            convex_note=convex_note,
        )
