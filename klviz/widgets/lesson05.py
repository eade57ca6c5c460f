"""Lesson 05's panels: where each KL placement pushes a policy of three tokens.

- :class:`SimplexFlowPanel`: the expected-gradient field of one choice (estimator × placement) on the
  triangle of three tokens, with gradient-descent paths from a starting policy set by sliders,
  beside the paths of the true reverse-KL and forward-KL gradients.
- :class:`BanditPanel`: the KL-regularised bandit max E_pi[R] - beta · KL: the fixed point each
  choice converges to, against pi* ∝ pi_ref · exp(R/beta) and the forward-KL solution, as beta moves.

The lesson's tokens, reference policy, rewards and beta grid, and the bandit's solutions, live in
:mod:`klviz.bandit` (``THREE_TOKENS``, ``REF_PROBS``, ``REWARDS``, ``BETA_GRID``, ``bandit_table``).
"""

from __future__ import annotations

import functools
import html
from typing import Any

import ipywidgets as widgets
import numpy as np
import torch
from matplotlib.figure import Figure

from ..bandit import BETA_GRID, REF_PROBS, REWARDS, THREE_TOKENS, bandit_solutions, bandit_table, tv_distance
from ..divergences import categorical_kl
from ..messages import N_, tr
from ..palette import css
from ..plotting import COLORS, panel_figure, sticky_limits
from ..simplex import (
    ALL_FLOWS,
    CHOICE_COLORS,
    CHOICE_STYLES,
    CHOICES,
    check_probs,
    descent_paths,
    field_gradient,
    probability_velocity,
    simplex_grid,
    to_xy,
)
from .base import Panel

__all__ = ["SimplexFlowPanel", "BanditPanel"]

_STYLE = {"description_width": "initial"}
_CORNERS = np.array([[0.0, 0.0], [1.0, 0.0], [0.5, np.sqrt(3) / 2]])


def _draw_triangle(ax: Any) -> None:
    ax.plot(*np.vstack([_CORNERS, _CORNERS[:1]]).T, color=COLORS["ink"], lw=1.0)
    for (x, y), name, (dx, dy) in zip(_CORNERS, THREE_TOKENS, ((-0.03, -0.06), (0.03, -0.06), (0.0, 0.03))):
        ax.annotate(
            tr("all on '{strip}'", strip=name.strip()), (x, y), xytext=(x + dx, y + dy), ha="center", fontsize=8.5
        )
    ax.set_xlim(-0.12, 1.12)
    ax.set_ylim(-0.1, 0.95)
    ax.set_aspect("equal")
    ax.axis("off")


@functools.lru_cache(maxsize=4)
def _fields(resolution: int, ref: tuple[float, ...]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    grid = simplex_grid(resolution, margin=0.03)
    ref_logits = torch.tensor(ref, dtype=torch.float64).log()
    xy = to_xy(grid).numpy()
    out = {}
    for flow in ALL_FLOWS:
        g = field_gradient(grid.log(), ref_logits, flow)
        out[flow] = to_xy(probability_velocity(grid, -g)).numpy()  # to_xy is linear: it maps velocities too
    return xy, out


class SimplexFlowPanel(Panel):
    """Expected-gradient field and descent paths of one KL choice on the 3-token simplex."""

    title = N_("Where does each KL choice push the policy? (three tokens, no reward)")
    css_class = "klviz-simplex-flow"

    def __init__(self, device: str | torch.device | None = None, lr: float = 0.3) -> None:
        self.ref = torch.tensor(REF_PROBS, dtype=torch.float64)
        self.lr = lr
        self.grid_xy, self.fields = _fields(11, REF_PROBS)
        super().__init__(device)
        # after the panel's own observers: a step sends its frame and readout first, then the other
        # slider's new maximum (which the page lays out before it handles the next message)
        self._link_start_sliders(self.controls)

    def make_controls(self) -> dict[str, widgets.ValueWidget]:
        controls: dict[str, widgets.ValueWidget] = {
            "flow": widgets.Dropdown(
                options=[(tr(choice), choice) for choice in CHOICES],
                value="k3 in loss",
                description=tr("KL choice"),
                style=_STYLE,
                layout=widgets.Layout(width="240px"),
            ),
            "start_mat": widgets.FloatSlider(
                value=0.08,
                min=0.01,
                max=0.98,
                step=0.01,
                style=_STYLE,
                description=tr("start π(mat)"),
                continuous_update=False,
            ),
            "start_sofa": widgets.FloatSlider(
                value=0.12,
                min=0.01,
                max=0.98,
                step=0.01,
                style=_STYLE,
                description=tr("start π(sofa)"),
                continuous_update=False,
            ),
            "steps": widgets.IntSlider(
                value=60, min=5, max=400, step=5, description=tr("descent steps"), style=_STYLE, continuous_update=False
            ),
        }
        mat, sofa = controls["start_mat"], controls["start_sofa"]
        mat.max, sofa.max = self._room(sofa.value), self._room(mat.value)
        return controls

    #: the smallest start probability of each token (the sliders' minimum, and what " moon" keeps)
    START_MIN = 0.01

    @classmethod
    def _room(cls, other: float) -> float:
        """The largest start probability one token can take when the other takes ``other``."""
        return round(max(cls.START_MIN, 1.0 - cls.START_MIN - float(other)), 2)

    @classmethod
    def _link_start_sliders(cls, controls: dict[str, widgets.ValueWidget]) -> None:
        """Keep every start point inside the triangle: π(mat) + π(sofa) <= 1 - START_MIN.

        Each slider's maximum follows the other's value, so a slider cannot be moved past the edge
        (ipywidgets clamps a value to its slider's maximum). Moving one slider within its maximum
        leaves the other's value at or below the other's new maximum, so the panel computes a valid
        start whichever observer runs first.
        """
        mat, sofa = controls["start_mat"], controls["start_sofa"]

        def follow(target: widgets.FloatSlider) -> Any:
            def on_change(change: dict[str, Any]) -> None:
                target.max = cls._room(change["new"])

            return on_change

        mat.observe(follow(sofa), names="value")
        sofa.observe(follow(mat), names="value")

    def make_figure(self) -> Figure:
        fig, (ax, ax_kl) = panel_figure(8.4, 3.9, ncols=2, gridspec_kw={"width_ratios": [1.2, 1]})
        _draw_triangle(ax)
        xy = self.grid_xy
        self.quiver = ax.quiver(
            xy[:, 0],
            xy[:, 1],
            np.zeros(len(xy)),
            np.zeros(len(xy)),
            angles="xy",
            scale_units="xy",
            scale=1.0,
            width=0.004,
            color=COLORS["q"],
        )
        (self.path_rev,) = ax.plot([], [], CHOICE_STYLES["reverse KL"], color=CHOICE_COLORS["reverse KL"], lw=2.2)
        (self.path_fwd,) = ax.plot([], [], CHOICE_STYLES["forward KL"], color=CHOICE_COLORS["forward KL"], lw=2.2)
        (self.path_sel,) = ax.plot([], [], "-", lw=2.0)
        (self.end_sel,) = ax.plot([], [], "o", ms=6, mfc="none", mew=2)
        (self.start_dot,) = ax.plot([], [], "o", color=COLORS["ink"], ms=6)
        ref_xy = to_xy(self.ref).numpy()
        ax.plot(ref_xy[0], ref_xy[1], "*", color=COLORS["p"], ms=14, mec=COLORS["ink"])
        self.ax = ax  # the key of this plot is HTML under the figure: legends are slow to redraw
        ax.set_title(tr("expected-gradient field (arrows) and descent paths"), fontsize=9.5)

        (self.kl_rev,) = ax_kl.plot([], [], ":", color=CHOICE_COLORS["reverse KL"], lw=2.2, label=tr("reverse-KL path"))
        (self.kl_fwd,) = ax_kl.plot([], [], ":", color=CHOICE_COLORS["forward KL"], lw=2.2, label=tr("forward-KL path"))
        (self.kl_sel,) = ax_kl.plot([], [], "-", lw=2.0, label=tr("selected choice"))
        ax_kl.set_xlabel(tr("gradient-descent step t"))
        ax_kl.set_ylabel("KL(π_t ‖ π_ref)  [nats]")
        ax_kl.set_title(tr("the KL a penalty is meant to shrink"))
        self.legend_kl = ax_kl.legend(loc="upper right")
        self.ax_kl = ax_kl
        return fig

    def compute(self, flow: str, start_mat: float, start_sofa: float, steps: int) -> dict[str, Any]:
        moon = 1.0 - start_mat - start_sofa
        if moon < 0.01:
            raise ValueError(
                f"start π(mat) + start π(sofa) = {start_mat + start_sofa:.2f} leaves "
                f"π(moon) = {moon:.2f}; keep the sum at most 0.99"
            )
        start = check_probs(torch.tensor([start_mat, start_sofa, moon], dtype=torch.float64), "start")
        paths = _paths(tuple(start.tolist()), flow, int(steps), self.lr)
        kl = {f: categorical_kl(p, self.ref.expand_as(p)).numpy() for f, p in paths.items()}
        return {
            "flow": flow,
            "start": start.numpy(),
            "paths": {f: to_xy(p).numpy() for f, p in paths.items()},
            "end": paths[flow][-1].numpy(),
            "kl": kl,
            "field": self.fields[flow],
            "steps": int(steps),
        }

    def draw(self, data: dict[str, Any]) -> None:
        flow = data["flow"]
        field = data["field"]
        norm = np.linalg.norm(field, axis=1)
        scale = 0.07 / max(float(norm.max()), 1e-12)
        self.quiver.set_UVC(field[:, 0] * scale, field[:, 1] * scale)
        self.quiver.set_color(CHOICE_COLORS[flow])
        self.path_rev.set_data(*data["paths"]["reverse KL"].T)
        self.path_fwd.set_data(*data["paths"]["forward KL"].T)
        sel = data["paths"][flow]
        for line in (self.path_sel, self.kl_sel):
            line.set_color(CHOICE_COLORS[flow])
            line.set_linestyle(CHOICE_STYLES[flow])
        self.path_sel.set_data(*sel.T)
        self.end_sel.set_data([sel[-1, 0]], [sel[-1, 1]])
        self.end_sel.set_mec(CHOICE_COLORS[flow])
        self.start_dot.set_data([sel[0, 0]], [sel[0, 1]])
        t = np.arange(data["steps"] + 1)
        self.kl_rev.set_data(t, data["kl"]["reverse KL"])
        self.kl_fwd.set_data(t, data["kl"]["forward KL"])
        self.kl_sel.set_data(t, data["kl"][flow])
        self.ax_kl.set_xlim(0, data["steps"])
        top = max(float(np.max(v)) for v in data["kl"].values())
        sticky_limits(self.ax_kl, "y", 0, 1.08 * top if top > 0 else 1.0)
        self.legend_kl.texts[2].set_text(tr(flow))
        handle = self.legend_kl.legend_handles[2]
        handle.set_color(CHOICE_COLORS[flow])
        handle.set_linestyle(CHOICE_STYLES[flow])
        end, start = data["end"], data["start"]
        kl_end = float(data["kl"][flow][-1])
        kl_rev_end = float(data["kl"]["reverse KL"][-1])
        self.readout.value = tr(
            "<div style='font-size:85%;color:{css}'>Key: arrows = how π moves under one descent step "
            "of <b style='color:{css2}'>{flow}</b> (expected gradient); <span style='color:{css3}'>⋯ "
            "dark</span> true reverse-KL path; <span style='color:{css4}'>⋯ red</span> true "
            "forward-KL path; ● start; ○ end; <span style='color:{css5}'>★</span> π_ref.</div><div "
            "style='font-size:90%'><b style='color:{css2}'>{flow}</b>: start π = (<span "
            "class='klviz-start'>{start_0:.2f}, {start_1:.2f}, {start_2:.2f}</span>) → after {steps} "
            "steps π = (<span class='klviz-end'>{end_0:.3f}, {end_1:.3f}, {end_2:.3f}</span>); "
            "KL(π‖π_ref) = <b>{kl_end:.4f}</b> (the true reverse-KL gradient reaches "
            "{kl_rev_end:.4f}; start {kl_0:.4f}).</div>",
            css=css("muted"),
            css2=CHOICE_COLORS.css(flow),
            flow=html.escape(tr(flow)),
            css3=css("ink"),
            css4=css("forward"),
            css5=css("p"),
            start_0=start[0],
            start_1=start[1],
            start_2=start[2],
            steps=data["steps"],
            end_0=end[0],
            end_1=end[1],
            end_2=end[2],
            kl_end=kl_end,
            kl_rev_end=kl_rev_end,
            kl_0=float(data["kl"][flow][0]),
        )


@functools.lru_cache(maxsize=64)
def _paths(start: tuple[float, ...], flow: str, steps: int, lr: float) -> dict[str, torch.Tensor]:
    flows = tuple(dict.fromkeys((flow, "reverse KL", "forward KL")))
    return descent_paths(
        torch.tensor(start, dtype=torch.float64),
        torch.tensor(REF_PROBS, dtype=torch.float64),
        flows,
        steps=steps,
        lr=lr,
    )


#: The labels of the choices (:data:`klviz.simplex.ALL_FLOWS`) as the catalogue has them: shown as ``tr(label)``.
_CHOICE_LABELS = (
    N_("k1 in loss"),
    N_("k2 in loss"),
    N_("k3 in loss"),
    N_("k1 in reward"),
    N_("k2 in reward"),
    N_("k3 in reward"),
    N_("k3·ρ in loss"),
    N_("k3+ in loss"),
    N_("reverse KL"),
    N_("forward KL"),
    N_("none"),
    N_("k1 in reward = k2 in loss = k3·ρ = k3+"),
)

#: Choices that share one expected gradient are drawn as one curve in the bandit panel.
_GROUPS: dict[str, tuple[str, ...]] = {
    "k1 in reward = k2 in loss = k3·ρ = k3+": ("k1 in reward", "k2 in loss", "k3·ρ in loss", "k3+ in loss"),
    "k3 in loss": ("k3 in loss",),
    "k1 in loss": ("k1 in loss",),
    "k2 in reward": ("k2 in reward",),
    "k3 in reward": ("k3 in reward",),
}


class BanditPanel(Panel):
    """The KL-regularised bandit on three tokens: fixed point of each choice vs the analytic optimum."""

    title = N_("KL-regularised bandit: max E[R] − β·KL, where does each choice end?")
    css_class = "klviz-bandit"

    def __init__(self, device: str | torch.device | None = None) -> None:
        self.data = bandit_solutions(REF_PROBS, REWARDS, BETA_GRID)
        super().__init__(device)

    def make_controls(self) -> dict[str, widgets.ValueWidget]:
        return {
            "beta": widgets.SelectionSlider(
                options=list(BETA_GRID), value=BETA_GRID[12], description="β", style=_STYLE, continuous_update=True
            ),
            "flow": widgets.Dropdown(
                options=[(tr(choice), choice) for choice in CHOICES],
                value="k3 in loss",
                description=tr("highlight"),
                style=_STYLE,
                layout=widgets.Layout(width="240px"),
            ),
        }

    def make_figure(self) -> Figure:
        fig, (ax, ax_tv) = panel_figure(8.4, 3.9, ncols=2, gridspec_kw={"width_ratios": [1.1, 1]})
        _draw_triangle(ax)
        rev_xy = to_xy(self.data["reverse"]).numpy()
        fwd_xy = to_xy(self.data["forward"]).numpy()
        ax.plot(*rev_xy.T, "-", color=CHOICE_COLORS["reverse KL"], lw=1.0)
        ax.plot(*fwd_xy.T, "-", color=CHOICE_COLORS["forward KL"], lw=1.0)
        ref_xy = to_xy(torch.tensor(REF_PROBS)).numpy()
        ax.plot(*ref_xy, "*", color=COLORS["p"], ms=13, mec=COLORS["ink"])
        (self.star,) = ax.plot([], [], "P", color=CHOICE_COLORS["reverse KL"], ms=11)
        (self.fwd,) = ax.plot([], [], "D", color=CHOICE_COLORS["forward KL"], ms=8, mfc="none", mew=2)
        self.points = {flow: ax.plot([], [], "o", color=CHOICE_COLORS[flow], ms=5)[0] for flow in CHOICES}
        (self.sel,) = ax.plot([], [], "o", ms=11, mfc="none", mew=2.2)
        # the key of the triangle is HTML under the figure (legends are the slowest part of a redraw)
        ax.set_title(
            tr("rewards R = {rewards} for ({join})", rewards=REWARDS, join=", ".join(t.strip() for t in THREE_TOKENS)),
            fontsize=9,
        )
        self.ax = ax

        betas = np.array(BETA_GRID)
        star = self.data["reverse"]
        for label, members in _GROUPS.items():
            flow = members[0]
            tv = tv_distance(self.data["fixed"][flow]["policy"], star).numpy()
            ax_tv.plot(
                betas,
                tv,
                CHOICE_STYLES[flow],
                color=CHOICE_COLORS[flow] if len(members) == 1 else COLORS["ink"],
                lw=1.8,
                label=tr(label),
            )
        self.beta_line = ax_tv.axvline(betas[12], color=COLORS["q"], lw=1)
        ax_tv.set_xscale("log")
        ax_tv.set_ylim(-0.02, 1.0)
        ax_tv.set_xlabel(tr("KL coefficient β"))
        ax_tv.set_ylabel(tr("TV distance to π*  (½ Σ|π − π*|)"))
        ax_tv.set_title(tr("how far each fixed point is from the optimum"))
        ax_tv.legend(loc="upper right", fontsize=7.5)
        self.ax_tv = ax_tv
        return fig

    def compute(self, beta: float, flow: str) -> dict[str, Any]:
        if beta not in BETA_GRID:
            raise ValueError(f"beta must be one of the precomputed values {BETA_GRID}, got {beta!r}")
        i = BETA_GRID.index(beta)
        return {
            "beta": beta,
            "index": i,
            "flow": flow,
            "rows": bandit_table(i),
            "star": self.data["reverse"][i].numpy(),
            "forward": self.data["forward"][i].numpy(),
        }

    def draw(self, data: dict[str, Any]) -> None:
        rows = {r["choice"]: r for r in data["rows"]}
        for flow, pt in self.points.items():
            xy = to_xy(torch.as_tensor(rows[flow]["policy"])).numpy()
            pt.set_data([xy[0]], [xy[1]])
        sel_xy = to_xy(torch.as_tensor(rows[data["flow"]]["policy"])).numpy()
        self.sel.set_data([sel_xy[0]], [sel_xy[1]])
        self.sel.set_mec(CHOICE_COLORS[data["flow"]])
        self.star.set_data(*[[v] for v in to_xy(torch.as_tensor(data["star"])).numpy()])
        self.fwd.set_data(*[[v] for v in to_xy(torch.as_tensor(data["forward"])).numpy()])
        self.beta_line.set_xdata([data["beta"], data["beta"]])
        shade = f" style='outline:2px solid {css('muted')};outline-offset:-1px'"  # tinting would cost contrast
        body = "".join(
            f"<tr{shade if f == data['flow'] else ''}>"
            f"<td style='color:{CHOICE_COLORS.css(f)}'><b>{html.escape(tr(f))}</b></td>"
            f"<td>({r['policy'][0]:.3f}, {r['policy'][1]:.3f}, {r['policy'][2]:.3f})</td>"
            f"<td>{r['tv_to_optimum']:.3f}</td><td>{r['reward']:.3f}</td><td>{r['kl']:.3f}</td></tr>"
            for f, r in rows.items()
        )
        self.readout.value = tr(
            "<div style='font-size:85%;color:{css}'>Key (triangle): <span "
            "style='color:{css2}'>—</span> π* ∝ π_ref·exp(R/β) for every β, <b>✚</b> at this β; "
            "<span style='color:{css3}'>—</span> forward-KL optimum for every β, <span "
            "style='color:{css3}'>◇</span> at this β; <span style='color:{css4}'>★</span> π_ref "
            "(where descent starts); coloured dots: where each choice ends (colours as in the "
            "table); ○ the highlighted choice.</div><div style='font-size:90%'>β = <b "
            "class='klviz-beta-value'>{beta:g}</b>: fixed point reached from π_ref by gradient "
            "descent on −E[R] + β·(choice).</div><table class='klviz-table' "
            "style='font-size:85%;border-collapse:separate;border-spacing:10px 1px'><tr>"
            "<th>choice</th><th>π at the end (mat, sofa, moon)</th><th>TV to π*</th><th>E[R]</th>"
            "<th>KL(π‖π_ref)</th></tr>{body}</table>",
            css=css("muted"),
            css2=css("ink"),
            css3=css("forward"),
            css4=css("p"),
            beta=data["beta"],
            body=body,
        )
