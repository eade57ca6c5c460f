"""Lesson 07's panel: train the tiny language model with one KL placement and watch it learn.

:class:`RLHFLabPanel` runs :func:`klviz.rlhf.train_policy` for the chosen settings and draws reward,
the true KL(pi || pi_ref), the KL the estimator reports, and the entropy, step by step; the
curves grow while the run trains. Runs are kept by their settings (:func:`klviz.rlhf.lab_history`,
resumable :class:`klviz.rlhf.TrainingRun`): going back to a setting already trained is instant,
fewer ``steps`` shows the start of the longer run, and more ``steps`` trains only the new steps.

A control moved by the reader starts a new run in a background thread
(:meth:`klviz.widgets.base.Panel.run_in_background`): the panel answers at once (the run so far,
marked as training), the kernel stays free, the curves grow every five steps, and a newer setting
stops an older run that is still training. ``panel.set(...)`` in code trains in the foreground and
returns when the run is there; ``panel.wait()`` waits for a background run.
"""

from __future__ import annotations

import html
import time
from typing import Any, TypedDict

import ipywidgets as widgets
import numpy as np
import torch
from matplotlib.figure import Figure

from ..messages import N_, tr
from ..plotting import COLORS, panel_figure, sticky_limits
from ..rlhf import PLACEMENT_COLORS, PLACEMENTS, LabConfig, TrainingHistory, lab_history, trained_history
from .base import BackgroundRun, Panel

__all__ = ["RLHFLabPanel"]

_STYLE = {"description_width": "initial"}


class _FixedSettings(TypedDict):
    """The lab's settings that no control moves (given to the panel, passed to every LabConfig)."""

    lr: float
    prompts: int
    group_size: int
    max_new_tokens: int


class RLHFLabPanel(Panel):
    """One training run of the mini RLHF lab, with its settings as controls."""

    title = N_("Mini RLHF lab: train the tiny model with a KL penalty")
    css_class = "klviz-rlhf-lab"

    #: train in a background thread when the reader moves a control (see the module docstring)
    background_training: bool = True
    #: a position is a training run of seconds: nothing is drawn ahead
    draw_ahead = False

    def __init__(
        self,
        device: str | torch.device | None = "cpu",
        *,
        steps: int = 40,
        lr: float = 1e-3,
        prompts: int = 4,
        group_size: int = 8,
        max_new_tokens: int = 24,
    ) -> None:
        self.fixed: _FixedSettings = {
            "lr": lr,
            "prompts": prompts,
            "group_size": group_size,
            "max_new_tokens": max_new_tokens,
        }
        self.default_steps = steps
        super().__init__(device)

    @property
    def training(self) -> LabConfig | None:
        """The settings a background run is training now (None when none is)."""
        run = self.background_run
        return run.what if run is not None and run.active else None

    # -- foreground and background training ----------------------------------------------------
    def start_background(self, **values: Any) -> bool:
        cfg = self._config(**values)
        if not self.background_training or trained_history(cfg, self.device) is not None:
            return False  # nothing to train: answer in the foreground
        self.show_progress((cfg, None))  # answer at once: an empty run, marked as training

        def train(run: BackgroundRun) -> TrainingHistory:
            def progress(step: int, hist: TrainingHistory) -> None:
                if step % 5 == 4:
                    run.report((cfg, hist))  # the curves grow every five steps
                else:
                    run.check()  # a newer setting stops this run after its current step

            return lab_history(cfg, self.device, callback=progress)

        self.run_in_background(train, what=cfg)  # when done: the ordinary update finds the run kept
        return True

    def draw_progress(self, progress: tuple[LabConfig, TrainingHistory | None]) -> str:
        """Draw a run that is still training: its curves so far and where it stands."""
        cfg, hist = progress
        m = (
            {k: np.asarray(v) for k, v in hist.metrics.items()}
            if hist is not None
            else {k: np.zeros(0) for k in ("reward", "true_kl", "reported_kl", "entropy")}
        )
        self._draw_curves(m, cfg.steps)
        done = len(m["reward"])
        self.readout.value = tr(
            "<div style='font-size:90%' class='klviz-training'><b "
            "style='color:{css}'>{placement}</b>, β = {beta:g}, {steps} steps: training in the "
            "background, step {done} of {steps} … (move any control to start another run)</div>",
            css=PLACEMENT_COLORS.css(cfg.placement),
            placement=html.escape(tr(cfg.placement)),
            beta=cfg.beta,
            steps=cfg.steps,
            done=done,
        )
        return tr(" · training step {done} of {steps}", done=done, steps=cfg.steps)

    def make_controls(self) -> dict[str, widgets.ValueWidget]:
        return {
            "placement": widgets.Dropdown(
                options=[(tr(placement), placement) for placement in PLACEMENTS],
                value="k1 in reward",
                description=tr("KL placement"),
                style=_STYLE,
                layout=widgets.Layout(width="250px"),
            ),
            "beta": widgets.FloatSlider(
                value=0.2, min=0.0, max=1.0, step=0.05, description="β", style=_STYLE, continuous_update=False
            ),
            "steps": widgets.IntSlider(
                value=self.default_steps,
                min=5,
                max=200,
                step=5,
                description=tr("steps"),
                style=_STYLE,
                continuous_update=False,
            ),
            "epochs": widgets.IntSlider(
                value=1, min=1, max=4, description=tr("epochs per batch"), style=_STYLE, continuous_update=False
            ),
            "early_stop_kl": widgets.FloatSlider(
                value=0.0,
                min=0.0,
                max=0.2,
                step=0.01,
                readout_format=".2f",
                description=tr("early stop at approx_kl"),
                style=_STYLE,
                continuous_update=False,
                tooltip=tr("0 = no early stopping"),
                layout=widgets.Layout(width="380px"),
            ),
            "seed": widgets.BoundedIntText(
                value=0, min=0, max=2**31 - 1, description=tr("seed"), layout=widgets.Layout(width="140px")
            ),
        }

    def make_figure(self) -> Figure:
        fig, axes = panel_figure(8.4, 3.2, ncols=3)
        ax_r, ax_kl, ax_h = axes
        (self.line_r,) = ax_r.plot([], [], color=COLORS["ink"], lw=1.8)
        ax_r.set_title(tr("reward R (batch mean)"))
        ax_r.set_xlabel(tr("training step"))
        (self.line_true,) = ax_kl.plot([], [], color=COLORS["mu"], lw=1.8, label=tr("true KL(π‖π_ref)"))
        (self.line_rep,) = ax_kl.plot([], [], "--", color=COLORS["k1"], lw=1.4, label=tr("what the estimator reports"))
        ax_kl.set_title(tr("KL per response  [nats]"))
        ax_kl.set_xlabel(tr("training step"))
        ax_kl.legend(loc="upper left", fontsize=7.5)
        (self.line_h,) = ax_h.plot([], [], color=COLORS["k3"], lw=1.8)
        ax_h.set_title(tr("entropy per token  [nats]"))
        ax_h.set_xlabel(tr("training step"))
        self.axes = axes
        return fig

    def _config(
        self, placement: str, beta: float, steps: int, epochs: int, early_stop_kl: float, seed: int
    ) -> LabConfig:
        return LabConfig(
            placement=placement,
            beta=float(beta),
            steps=int(steps),
            epochs=int(epochs),
            early_stop_kl=float(early_stop_kl) if early_stop_kl > 0 else None,
            seed=int(seed),
            **self.fixed,
        )

    def compute(
        self, placement: str, beta: float, steps: int, epochs: int, early_stop_kl: float, seed: int
    ) -> dict[str, Any]:
        cfg = self._config(placement, beta, steps, epochs, early_stop_kl, seed)
        t0 = time.perf_counter()

        def live(step: int, hist: TrainingHistory) -> None:  # the curves grow while this update trains
            if step % 5 == 4:
                self.show_progress((cfg, hist), since=t0)  # (nothing while the panel is built)

        hist = lab_history(cfg, self.device, callback=live)
        return {"config": cfg, "history": hist, "metrics": {k: np.asarray(v) for k, v in hist.metrics.items()}}

    def _draw_curves(self, m: dict[str, np.ndarray], total_steps: int) -> None:
        t = np.arange(len(m["reward"]))
        self.line_r.set_data(t, m["reward"])
        self.line_true.set_data(t, m["true_kl"])
        self.line_rep.set_data(t, m["reported_kl"])
        self.line_h.set_data(t, m["entropy"])
        for ax, series in zip(self.axes, ((m["reward"],), (m["true_kl"], m["reported_kl"]), (m["entropy"],))):
            ax.set_xlim(0, max(total_steps - 1, 1))
            if not len(t):
                continue  # a run that has just started: keep the y ranges
            lo = min(float(np.min(s)) for s in series)
            hi = max(float(np.max(s)) for s in series)
            pad = 0.08 * (hi - lo) if hi > lo else 0.5
            sticky_limits(ax, "y", min(lo - pad, 0.0) if ax is not self.axes[0] else lo - pad, hi + pad)

    def draw(self, data: dict[str, Any]) -> None:
        m, cfg, hist = data["metrics"], data["config"], data["history"]
        self._draw_curves(m, cfg.steps)
        self.line_rep.set_label(
            tr("reported ({v})", v="k1" if cfg.placement in ("k1 in reward", "none") else cfg.placement.split()[0])
        )
        samples = "".join(
            f"<li><code>{html.escape(p)}</code>→<code>{html.escape(s)}</code></li>"
            for p, s in zip(_first_prompts(cfg), hist.samples[-1])
        )
        stopped = int(np.sum(m["epochs_run"] < cfg.epochs))
        self.readout.value = (
            tr(
                "<div style='font-size:90%'><b style='color:{css}'>{placement}</b>, β = {beta:g}, "
                "{steps} steps in {seconds:.1f} s: reward <b class='klviz-final-reward'>{last:.2f}</b>, "
                "true KL <b class='klviz-final-kl'>{last2:.2f}</b> nats, reported {last3:.2f}, entropy "
                "{last4:.2f} (means of the last 5 steps)",
                css=PLACEMENT_COLORS.css(cfg.placement),
                placement=html.escape(tr(cfg.placement)),
                beta=cfg.beta,
                steps=cfg.steps,
                seconds=hist.seconds,
                last=hist.last("reward"),
                last2=hist.last("true_kl"),
                last3=hist.last("reported_kl"),
                last4=hist.last("entropy"),
            )
            + (
                tr("; early stopping cut {stopped} of {steps} batches short", stopped=stopped, steps=cfg.steps)
                if cfg.early_stop_kl
                else tr("; early stopping off (0)")
            )
            + tr(".<br>Last samples:<ul style='margin:0'>{samples}</ul></div>", samples=samples)
        )


def _first_prompts(cfg: LabConfig) -> list[str]:
    from .. import lm

    return [lm.PROMPTS[i % len(lm.PROMPTS)] for i in range(cfg.prompts)][:3]
