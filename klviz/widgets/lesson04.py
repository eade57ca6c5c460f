"""Lesson 04's panel: a real response as a strip of tokens, coloured by k1, k2, k3 or the exact KL,
while the policy drifts away from the one that sampled it, update step by update step."""

from __future__ import annotations

import html
from typing import Any

import ipywidgets as widgets
import numpy as np
import torch
from matplotlib import colormaps
from matplotlib.colors import Normalize, TwoSlopeNorm, to_hex
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from .. import lm
from ..devices import single_thread
from ..divergences import exact_kl
from ..estimators import k1, k2, k3, masked_mean
from ..messages import N_, tr
from ..palette import css, text_on
from ..plotting import COLORS, panel_figure, snapped_limits, sticky_limits
from .base import Panel

__all__ = ["WorkedTokensPanel"]

_QUANTITIES = {
    "k1": N_("k1 = −log r (this token's log π_old − log π_θ)"),
    "k2": N_("k2 = ½(log r)² (MiniMind's approx_kl per token)"),
    "k3": N_("k3 = (r − 1) − log r"),
    "exact": N_("exact KL(π_old‖π_θ) at this position (Σ over the vocabulary)"),
}


class WorkedTokensPanel(Panel):
    """PPO's inner loop on one rollout batch of the tiny model: old's tokens, pi_theta after each step.

    The batch is :func:`klviz.lm.update_batch` (60 responses sampled from pi_old) and the states are
    :func:`klviz.lm.update_path` (pi_old, then pi_theta after each real update step on that batch).
    Everything is scored once when the panel is built; moving a control only indexes and colours.

    Left: the token mean of ½Δ² (MiniMind's ``approx_kl``), of k1 (verl's ``ppo_kl``), of k3 and of
    the exact per-position KL against the update step, with the early-stop threshold and the step at
    which MiniMind would stop. Right: one response's per-token values at the chosen step. Below the
    figure the response itself, each token coloured by the chosen quantity; hover a token for all
    its numbers.
    """

    title = N_("Lesson 04: one response, token by token, while π_θ drifts from π_old")
    css_class = "klviz-lesson04"

    def __init__(self, device: str | torch.device | None = None) -> None:
        self._precompute()
        super().__init__(device)

    # -- data, computed once --------------------------------------------------------------------
    def _precompute(self) -> None:
        with single_thread():  # tiny tensors: one thread avoids contention on a busy machine
            self._score_path()

    def _score_path(self) -> None:
        old = lm.load_tiny_lm("old")
        path = lm.update_path()
        ro = lm.update_batch(old)
        self.rollouts = ro
        mask = ro.response_layout_mask
        self.mask = mask
        self.ids = ro.response_layout(ro.input_ids)
        old_lp = ro.response_layout(ro.logprobs)
        old_full = ro.response_layout(lm.next_token_logprobs(old, ro))
        per_step: dict[str, list[torch.Tensor]] = {q: [] for q in ("delta", "exact")}
        for model in path:
            full = ro.response_layout(lm.next_token_logprobs(model, ro))  # [B, R, V], scored once
            lp = full.gather(-1, self.ids.unsqueeze(-1)).squeeze(-1)
            per_step["delta"].append((lp - old_lp) * mask)  # log r = log π_θ − log π_old
            per_step["exact"].append(exact_kl(old_full, full) * mask)
        delta = torch.stack(per_step["delta"])  # [S, B, R]
        self.token_values = {
            "k1": k1(delta) * mask,
            "k2": k2(delta) * mask,
            "k3": k3(delta) * mask,
            "exact": torch.stack(per_step["exact"]),
        }
        self.old_logprob = old_lp
        self.new_logprob = old_lp + delta
        self.curves = {
            q: np.array([float(masked_mean(v[s], mask)) for s in range(v.shape[0])])
            for q, v in self.token_values.items()
        }
        self.num_steps = delta.shape[0] - 1
        # fixed colour scales (the same colour means the same value at every step): k1 symmetric
        # around 0, the others from 0 to their 99th percentile over all steps and tokens
        self.colour_span = {"k1": max(1e-6, float(self.token_values["k1"].abs().max()))}
        for q in ("k2", "k3", "exact"):
            pos = self.token_values[q][self.token_values[q] > 0]
            self.colour_span[q] = max(1e-6, float(torch.quantile(pos.double(), 0.99))) if pos.numel() else 1.0
        self.labels = [f"{i}: {p}|{r}" for i, (p, r) in enumerate(zip(ro.prompts, ro.responses))]
        # each response's per-token axis spans its values over every step (a function of the response
        # alone): stepping keeps the scale, so a bar twice as high is twice the value at any step
        values = torch.stack(list(self.token_values.values()))  # [Q, S, B, R]; padding is 0
        lows = values.amin(dim=(0, 1, 3)).clamp(max=0.0)
        highs = values.amax(dim=(0, 1, 3)).clamp(min=0.0)
        self.token_limits = [
            snapped_limits(float(lo), float(hi)) if hi > lo else (-0.05, 0.05)
            for lo, hi in zip(lows.tolist(), highs.tolist())
        ]

    # -- panel ------------------------------------------------------------------------------------
    def make_controls(self) -> dict[str, widgets.ValueWidget]:
        style = {"description_width": "initial"}
        return {
            "step": widgets.IntSlider(
                value=4,
                min=0,
                max=self.num_steps,
                step=1,
                description=tr("update step"),
                style=style,
                continuous_update=True,
            ),
            "color_by": widgets.ToggleButtons(
                options=[("k1", "k1"), ("k2", "k2"), ("k3", "k3"), ("exact", "exact")],
                value="k2",
                description=tr("colour by"),
                style={"button_width": "72px"},
                tooltips=[
                    tr("k1 = −log r (signed)"),
                    tr("k2 = ½(log r)², MiniMind's approx_kl"),
                    "k3 = (r − 1) − log r",
                    tr("exact KL(π_old‖π_θ) at the position"),
                ],
            ),
            "row": widgets.IntSlider(
                value=1,
                min=0,
                max=self.rollouts.batch_size - 1,
                step=1,
                description=tr("response #"),
                style=style,
                continuous_update=True,
            ),
            "threshold": widgets.FloatSlider(
                value=0.25,
                min=0.01,
                max=1.0,
                step=0.01,
                description="early_stop_kl",
                style=style,
                continuous_update=True,
            ),
        }

    def layout_controls(self) -> widgets.Widget:
        c = self.controls
        return widgets.VBox([widgets.HBox([c["step"], c["threshold"]]), widgets.HBox([c["row"], c["color_by"]])])

    def make_figure(self) -> Figure:
        fig, (ax_c, ax_t) = panel_figure(8.4, 3.3, ncols=2, gridspec_kw={"width_ratios": [1, 1.35]})
        steps = np.arange(self.num_steps + 1)
        names = {
            "k2": tr("approx_kl: ½Δ² (MiniMind, TRL)"),
            "k1": tr("ppo_kl: k1 (verl)"),
            "k3": tr("k3 (CleanRL, SB3)"),
            "exact": tr("exact KL(π_old‖π_θ)"),
        }
        for q in ("k2", "k1", "k3", "exact"):
            ax_c.plot(
                steps,
                self.curves[q],
                marker="o",
                ms=3,
                color=COLORS[q],
                lw=1.6 if q != "exact" else 2.2,
                ls="--" if q == "exact" else "-",
                label=names[q],
            )
        self.thr_line = ax_c.axhline(0.25, color=COLORS["bad"], lw=1.2, ls=":", label=tr("early-stop threshold"))
        self.step_line = ax_c.axvline(0, color=COLORS["muted"], lw=1.0)
        (self.stop_marker,) = ax_c.plot(
            [], [], "X", color=COLORS["bad"], ms=10, zorder=5, label=tr("MiniMind stops here")
        )
        ax_c.set_xlabel(tr("update step on the rollout batch"))
        ax_c.set_ylabel(tr("token mean over the batch [nats]"))
        ax_c.set_title(tr("π_θ drifts from π_old: batch averages"))
        ax_c.set_xticks(steps)
        ax_c.legend(loc="upper left", fontsize=7.5)
        self.ax_c = ax_c

        width = self.ids.shape[1]
        x = np.arange(width)
        self.tok_lines = {}
        for q in ("k1", "k2", "k3", "exact"):
            (self.tok_lines[q],) = ax_t.plot(
                x,
                np.zeros(width),
                "-o" if q != "exact" else "--",
                ms=2.5,
                color=COLORS[q],
                lw=1.3 if q != "exact" else 1.8,
                label={"k1": "k1", "k2": "k2 = ½Δ²", "k3": "k3", "exact": tr("exact KL")}[q],
            )
        ax_t.axhline(0, color=COLORS["ink"], lw=0.6)
        ax_t.set_xlabel(tr("position in the response (the token strip below, left to right)"))
        ax_t.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax_t.set_ylabel(tr("per-token value [nats]"))
        ax_t.legend(loc="upper right", ncol=4, fontsize=7.5)
        self.ax_t = ax_t
        return fig

    def compute(self, step: int, color_by: str, row: int, threshold: float) -> dict[str, Any]:
        if color_by not in _QUANTITIES:
            raise ValueError(f"color_by must be one of {sorted(_QUANTITIES)}, got {color_by!r}")
        s = int(np.clip(step, 0, self.num_steps))
        b = int(np.clip(row, 0, self.rollouts.batch_size - 1))
        thr = float(threshold)
        if not thr > 0:
            raise ValueError(f"threshold must be positive, got {threshold!r}")
        n = int(self.mask[b].sum())
        per_token = {q: self.token_values[q][s, b, :n].numpy() for q in _QUANTITIES}
        above = np.nonzero(self.curves["k2"] > thr)[0]
        stop_step = int(above[0]) if above.size else None
        return {
            "step": s,
            "row": b,
            "threshold": thr,
            "color_by": color_by,
            "n": n,
            "tokens": lm.token_strings(self.ids[b, :n]),
            "per_token": per_token,
            "old_logprob": self.old_logprob[b, :n].numpy(),
            "new_logprob": self.new_logprob[s, b, :n].numpy(),
            "approx_kl": float(self.curves["k2"][s]),
            "ppo_kl": float(self.curves["k1"][s]),
            "k3_mean": float(self.curves["k3"][s]),
            "exact_mean": float(self.curves["exact"][s]),
            "row_means": {q: float(v.mean()) if n else 0.0 for q, v in per_token.items()},
            "stop_step": stop_step,
            "stopped": stop_step is not None and s >= stop_step,
            "prompt": self.rollouts.prompts[b],
        }

    def draw(self, data: dict[str, Any]) -> None:
        s, thr = data["step"], data["threshold"]
        self.thr_line.set_ydata([thr, thr])
        self.step_line.set_xdata([s, s])
        if data["stop_step"] is None:
            self.stop_marker.set_data([], [])
        else:
            self.stop_marker.set_data([data["stop_step"]], [self.curves["k2"][data["stop_step"]]])
        top = max(float(max(c.max() for c in self.curves.values())), thr) * 1.08
        low = min(0.0, float(self.curves["k1"].min()))
        sticky_limits(self.ax_c, "y", low - 0.02 * top, top)

        n = data["n"]
        width = self.ids.shape[1]
        for q, line in self.tok_lines.items():
            y = np.full(width, np.nan)
            y[:n] = data["per_token"][q]
            line.set_ydata(y)
        self.ax_t.set_ylim(*self.token_limits[data["row"]])
        self.ax_t.set_xlim(-0.5, max(n, 2) - 0.5)
        self.ax_t.set_title(tr("response #{row} at step {s}: per-token values", row=data["row"], s=s), fontsize=10)
        self.readout.value = self._strip_html(data) + self._summary_html(data)

    # -- HTML ---------------------------------------------------------------------------------------
    def _colour(self, q: str, values: np.ndarray) -> list[str]:
        span = self.colour_span[q]
        norm: Normalize
        if q == "k1":
            norm = TwoSlopeNorm(vcenter=0.0, vmin=-span, vmax=span)
            cmap = colormaps["RdBu_r"]
        else:
            norm = Normalize(vmin=0.0, vmax=span, clip=True)
            cmap = colormaps["YlOrRd"]
        return [to_hex(c) for c in cmap(norm(np.asarray(values, dtype=float)))]

    def _strip_html(self, data: dict[str, Any]) -> str:
        q = data["color_by"]
        pt = data["per_token"]
        colours = self._colour(q, pt[q])
        spans = []
        for i, tok in enumerate(data["tokens"]):
            tip = tr(
                "token {i} {tok!r}: log π_old {old_logprob:.3f}, log π_θ {new_logprob:.3f}; k1 "
                "{k1:+.4f}, k2 {k2:.4f}, k3 {k3:.4f}, exact {exact:.4f}",
                i=i,
                tok=tok,
                old_logprob=data["old_logprob"][i],
                new_logprob=data["new_logprob"][i],
                k1=pt["k1"][i],
                k2=pt["k2"][i],
                k3=pt["k3"][i],
                exact=pt["exact"][i],
            )
            spans.append(
                f"<span class='klviz-token' title='{html.escape(tip, quote=True)}' "
                f"style='background:{colours[i]};color:{text_on(colours[i])};padding:2px 1px;margin:0 1px;"
                f"border-radius:3px;"
                f"font-family:monospace;font-size:15px'>{html.escape(tok)}</span>"
            )
        return tr(
            "<div class='klviz-strip' style='margin:4px 0;line-height:2'><span "
            "style='color:{css};font-family:monospace;font-size:15px'>{prompt}</span>{join}</div><div "
            "style='font-size:85%;color:{css}'>colour: {quantities}{v}; hover a token for all its "
            "numbers.</div>",
            css=css("muted"),
            prompt=html.escape(data["prompt"]),
            join="".join(spans),
            quantities=html.escape(tr(_QUANTITIES[q])),
            v=tr(" (blue: π_θ likes the token more than π_old, red: less)") if q == "k1" else "",
        )

    def _summary_html(self, data: dict[str, Any]) -> str:
        stop = data["stop_step"]
        if stop is None:
            verdict = tr(
                "approx_kl never exceeds {threshold:.2f} within {num_steps} steps: no early stop.",
                threshold=data["threshold"],
                num_steps=self.num_steps,
            )
        elif data["stopped"]:
            verdict = tr(
                "<b style='color:{css}'>stopped</b>: approx_kl first exceeded {threshold:.2f} at step "
                "{stop}; MiniMind zeroes the loss from there on for this batch.",
                css=css("bad"),
                threshold=data["threshold"],
                stop=stop,
            )
        else:
            verdict = tr(
                "still updating; approx_kl will first exceed {threshold:.2f} at step {stop}.",
                threshold=data["threshold"],
                stop=stop,
            )
        rm = data["row_means"]
        return (
            tr(
                "<style>.klviz-lesson04 .klviz-table td, .klviz-lesson04 .klviz-table th {padding:1px 10px;"
                "text-align:right} .klviz-lesson04 .klviz-table td:first-child {text-align:left}</style>"
                "<table class='klviz-table' style='font-size:90%;border-collapse:collapse;margin-top:4px'>"
                "<tr><th style='text-align:left'>step "
            )
            + str(data["step"])
            + tr(
                "</th><th>approx_kl ½Δ²</th><th>ppo_kl k1</th><th>k3</th><th>exact "
                "KL(π_old‖π_θ)</th></tr><tr><td>batch token mean</td><td "
                "class='klviz-approx-kl'>{approx_kl:.4f}</td><td>{ppo_kl:+.4f}</td><td>{k3_mean:.4f}</td>"
                "<td>{exact_mean:.4f}</td></tr><tr><td>this "
                "response ({n} "
                "tokens)</td><td>{k2:.4f}</td><td>{k1:+.4f}</td><td>{k3:.4f}</td><td>{exact:.4f}</td></tr></table><div "
                "style='font-size:90%'>{verdict}</div>",
                approx_kl=data["approx_kl"],
                ppo_kl=data["ppo_kl"],
                k3_mean=data["k3_mean"],
                exact_mean=data["exact_mean"],
                n=data["n"],
                k2=rm["k2"],
                k1=rm["k1"],
                k3=rm["k3"],
                exact=rm["exact"],
                verdict=verdict,
            )
        )
