"""Lesson 07's panel: train the tiny language model with one KL placement and watch it learn.

:class:`RLHFLabPanel` runs :func:`klviz.rlhf.train_policy` for the chosen settings and draws reward,
the true KL(pi || pi_ref), the KL the estimator reports, and the entropy, step by step; the
curves grow while the run trains. Runs are kept by their settings
(:class:`klviz.rlhf.TrainingRun`, resumable): going back to a setting already trained is instant,
fewer ``steps`` shows the start of the longer run, and more ``steps`` trains only the new steps.

A control moved by the reader starts a new run in a background thread: the panel answers at once
(the run so far, marked as training), the kernel stays free, the curves grow every few steps, and a
newer setting stops an older run that is still training. ``panel.set(...)`` in code trains in the
foreground and returns when the run is there; ``panel.wait()`` waits for a background run.
"""
from __future__ import annotations

import html
import threading
import time
from dataclasses import replace
from typing import Any

import ipywidgets as widgets
import numpy as np
import torch
from matplotlib.figure import Figure

from ..plotting import panel_figure, sticky_limits
from ..rlhf import PLACEMENTS, LabConfig, TrainingHistory, TrainingRun, train_policy
from .base import Panel, static_mode

__all__ = ["RLHFLabPanel", "cached_run", "lab_history", "trained_history", "PLACEMENT_COLORS"]

PLACEMENT_COLORS: dict[str, str] = {
    "k1 in reward": "#1f77b4", "k1 in loss": "#17becf", "k2 in loss": "#ff7f0e", "k3 in loss": "#2ca02c",
    "k3·ρ in loss": "#9467bd", "k3+ in loss": "#8c564b", "none": "#7f7f7f",
}
_STYLE = {"description_width": "initial"}


_RUNS: dict[tuple[LabConfig, str], TrainingHistory] = {}
_MAX_RUNS = 32


def cached_run(config: LabConfig, device: str | torch.device = "cpu", callback: Any = None) -> TrainingHistory:
    """:func:`klviz.rlhf.train_policy` with the default policy, reward and reference, cached by
    (config, device): the same settings train once per kernel. ``callback`` is passed to a new run."""
    key = (config, str(torch.device(device)))
    if key not in _RUNS:
        hist = train_policy(config, device=device, callback=callback)
        if len(_RUNS) >= _MAX_RUNS:
            _RUNS.pop(next(iter(_RUNS)))
        _RUNS[key] = hist
    return _RUNS[key]


_RESUMABLE: dict[tuple[LabConfig, str], TrainingRun] = {}
_MAX_RESUMABLE = 16
_TRAINING = threading.RLock()


def lab_history(config: LabConfig, device: str | torch.device = "cpu", callback: Any = None) -> TrainingHistory:
    """The history of a run with ``config``, training only what no earlier call has trained.

    A run already made by :func:`cached_run` is returned as is. Otherwise the settings other than
    ``steps`` name one resumable :class:`klviz.rlhf.TrainingRun`: a request for fewer steps than it
    has trained is its prefix (the same numbers a run of that length records), a request for more
    advances it. The history comes without a policy; use :func:`cached_run` when you need it.
    """
    dev = str(torch.device(device))
    with _TRAINING:                            # one run trains at a time (runs are shared)
        if (config, dev) in _RUNS:
            return _RUNS[(config, dev)]
        key = _resumable_key(config, dev)
        run = _RESUMABLE.pop(key, None)
        if run is None:
            run = TrainingRun(config, device=device)
        _RESUMABLE[key] = run                  # most recently used goes last
        while len(_RESUMABLE) > _MAX_RESUMABLE:
            del _RESUMABLE[next(iter(_RESUMABLE))]
        if run.steps_done < config.steps:
            run.advance(config.steps - run.steps_done, callback=callback)
        return run.prefix(config.steps)


def trained_history(config: LabConfig, device: str | torch.device = "cpu") -> TrainingHistory | None:
    """The history of ``config`` if it is there without training (a kept run or the start of a longer
    one), else None."""
    dev = str(torch.device(device))
    # no lock: a background run may hold it for seconds; a run's history only ever grows
    if (config, dev) in _RUNS:
        return _RUNS[(config, dev)]
    run = _RESUMABLE.get(_resumable_key(config, dev))
    return run.prefix(config.steps) if run is not None and run.steps_done >= config.steps else None


def _resumable_key(config: LabConfig, device: str) -> tuple[LabConfig, str]:
    """Runs that differ only in ``steps`` are one resumable run."""
    return replace(config, steps=1), device


class _Cancelled(Exception):
    """Raised from a training callback to stop a background run that a newer setting replaced."""


class RLHFLabPanel(Panel):
    """One training run of the mini RLHF lab, with its settings as controls."""

    title = "Mini RLHF lab: train the tiny model with a KL penalty"
    css_class = "klviz-rlhf-lab"

    def __init__(self, device: str | torch.device | None = "cpu", *, steps: int = 40, lr: float = 1e-3,
                 prompts: int = 4, group_size: int = 8, max_new_tokens: int = 24) -> None:
        self.fixed = {"lr": lr, "prompts": prompts, "group_size": group_size, "max_new_tokens": max_new_tokens}
        self.default_steps = steps
        self._lock = threading.RLock()          # one update or live redraw of this panel at a time
        self._generation = 0                    # bumped by every new setting; older runs stop
        self._worker: threading.Thread | None = None
        #: the settings a background run is training now (None when none is)
        self.training: LabConfig | None = None
        super().__init__(device)

    #: train in a background thread when the reader moves a control (see the module docstring)
    background_training: bool = True

    # -- foreground and background updates ----------------------------------------------------
    def update(self) -> None:
        with self._lock:
            super().update()

    def set(self, **values: Any) -> dict[str, Any]:
        self._generation += 1                   # code asks for a result: stop any background run
        self.training = None
        return super().set(**values)

    def wait(self, timeout: float | None = None) -> None:
        """Wait until a background run has finished and the panel shows it."""
        worker = self._worker
        if worker is not None:
            worker.join(timeout)

    def _on_change(self, _change: dict[str, Any]) -> None:
        if self._holding:
            return
        self._generation += 1                   # a run still training in the background is out of date
        self.training = None
        try:
            cfg = self._config(**self.values())
        except Exception:  # noqa: BLE001 - an invalid setting: the ordinary update shows the error
            cfg = None
        if (cfg is None or not self.background_training or static_mode()
                or trained_history(cfg, self.device) is not None):
            self.update()                       # nothing to train: answer in the foreground
            return
        self._start_background(cfg)

    def _start_background(self, cfg: LabConfig) -> None:
        t0 = time.perf_counter()
        with self._lock:
            generation = self._generation      # bumped by _on_change for this setting
            self.training = cfg
            self._show_training(cfg, None, t0)  # answer at once: an empty run, marked as training
        self._worker = threading.Thread(target=self._train_in_background, args=(cfg, generation),
                                        name="klviz-rlhf-lab", daemon=True)
        self._worker.start()

    def _train_in_background(self, cfg: LabConfig, generation: int) -> None:
        def progress(step: int, hist: TrainingHistory) -> None:
            if generation != self._generation:
                raise _Cancelled
            if step % 5 == 4 and self._lock.acquire(blocking=False):   # never wait on the reader
                try:
                    if generation == self._generation:
                        self._show_training(cfg, hist, time.perf_counter())
                finally:
                    self._lock.release()

        try:
            lab_history(cfg, self.device, callback=progress)
        except _Cancelled:
            return
        except Exception:  # noqa: BLE001 - shown by the update below, which meets the same error
            pass
        with self._lock:
            if generation == self._generation:
                self.training = None
                self.update()                   # the run is there now (or its error is shown)

    def _show_training(self, cfg: LabConfig, hist: TrainingHistory | None, t0: float) -> None:
        """Draw a run that is still training: its curves so far and where it stands."""
        m = ({k: np.asarray(v) for k, v in hist.metrics.items()} if hist is not None
             else {k: np.zeros(0) for k in ("reward", "true_kl", "reported_kl", "entropy")})
        self._draw_curves(m, cfg.steps)
        done = len(m["reward"])
        self.readout.value = (
            f"<div style='font-size:90%' class='klviz-training'><b style='color:{PLACEMENT_COLORS[cfg.placement]}'>"
            f"{html.escape(cfg.placement)}</b>, β = {cfg.beta:g}, {cfg.steps} steps: training in the background, "
            f"step {done} of {cfg.steps} … (move any control to start another run)</div>")
        self.error.value = ""
        self.last_compute_ms = (time.perf_counter() - t0) * 1e3
        self._redraw()
        self._show_status(f" · training step {done} of {cfg.steps}")

    def make_controls(self) -> dict[str, widgets.ValueWidget]:
        return {
            "placement": widgets.Dropdown(options=list(PLACEMENTS), value="k1 in reward", description="KL placement",
                                          style=_STYLE, layout=widgets.Layout(width="250px")),
            "beta": widgets.FloatSlider(value=0.2, min=0.0, max=1.0, step=0.05, description="β",
                                        style=_STYLE, continuous_update=False),
            "steps": widgets.IntSlider(value=self.default_steps, min=5, max=200, step=5, description="steps",
                                       style=_STYLE, continuous_update=False),
            "epochs": widgets.IntSlider(value=1, min=1, max=4, description="epochs per batch", style=_STYLE,
                                        continuous_update=False),
            "early_stop_kl": widgets.FloatSlider(value=0.0, min=0.0, max=0.2, step=0.01, readout_format=".2f",
                                                 description="early stop at approx_kl", style=_STYLE,
                                                 continuous_update=False, tooltip="0 = no early stopping",
                                                 layout=widgets.Layout(width="380px")),
            "seed": widgets.BoundedIntText(value=0, min=0, max=2**31 - 1, description="seed",
                                           layout=widgets.Layout(width="140px")),
        }

    def make_figure(self) -> Figure:
        fig, axes = panel_figure(8.4, 3.2, ncols=3)
        ax_r, ax_kl, ax_h = axes
        self.line_r, = ax_r.plot([], [], color="#222222", lw=1.8)
        ax_r.set_title("reward R (batch mean)")
        ax_r.set_xlabel("training step")
        self.line_true, = ax_kl.plot([], [], color="#d62728", lw=1.8, label="true KL(π‖π_ref)")
        self.line_rep, = ax_kl.plot([], [], "--", color="#1f77b4", lw=1.4, label="what the estimator reports")
        ax_kl.set_title("KL per response  [nats]")
        ax_kl.set_xlabel("training step")
        ax_kl.legend(loc="upper left", fontsize=7.5)
        self.line_h, = ax_h.plot([], [], color="#2ca02c", lw=1.8)
        ax_h.set_title("entropy per token  [nats]")
        ax_h.set_xlabel("training step")
        self.axes = axes
        return fig

    def _config(self, placement: str, beta: float, steps: int, epochs: int, early_stop_kl: float,
                seed: int) -> LabConfig:
        return LabConfig(placement=placement, beta=float(beta), steps=int(steps), epochs=int(epochs),
                         early_stop_kl=float(early_stop_kl) if early_stop_kl > 0 else None, seed=int(seed),
                         **self.fixed)

    def compute(self, placement: str, beta: float, steps: int, epochs: int, early_stop_kl: float,
                seed: int) -> dict[str, Any]:
        cfg = self._config(placement, beta, steps, epochs, early_stop_kl, seed)
        t0 = time.perf_counter()

        def live(step: int, hist: TrainingHistory) -> None:   # the curves grow while this update trains
            if step % 5 == 4:
                self._show_training(cfg, hist, t0)

        hist = lab_history(cfg, self.device, callback=live if self._live_ok() else None)
        return {"config": cfg, "history": hist, "metrics": {k: np.asarray(v) for k, v in hist.metrics.items()}}

    # live redraw while training (once the panel has shown its first frame)
    def _live_ok(self) -> bool:
        return self._layout_frozen and not static_mode()

    def _draw_curves(self, m: dict[str, np.ndarray], total_steps: int) -> None:
        t = np.arange(len(m["reward"]))
        self.line_r.set_data(t, m["reward"])
        self.line_true.set_data(t, m["true_kl"])
        self.line_rep.set_data(t, m["reported_kl"])
        self.line_h.set_data(t, m["entropy"])
        for ax, series in zip(self.axes, ((m["reward"],), (m["true_kl"], m["reported_kl"]), (m["entropy"],))):
            ax.set_xlim(0, max(total_steps - 1, 1))
            if not len(t):
                continue                        # a run that has just started: keep the y ranges
            lo = min(float(np.min(s)) for s in series)
            hi = max(float(np.max(s)) for s in series)
            pad = 0.08 * (hi - lo) if hi > lo else 0.5
            sticky_limits(ax, "y", min(lo - pad, 0.0) if ax is not self.axes[0] else lo - pad, hi + pad)

    def draw(self, data: dict[str, Any]) -> None:
        m, cfg, hist = data["metrics"], data["config"], data["history"]
        self._draw_curves(m, cfg.steps)
        self.line_rep.set_label(f"reported ({'k1' if cfg.placement in ('k1 in reward', 'none') else cfg.placement.split()[0]})")
        samples = "".join(f"<li><code>{html.escape(p)}</code>→<code>{html.escape(s)}</code></li>"
                          for p, s in zip(_first_prompts(cfg), hist.samples[-1]))
        stopped = int(np.sum(m["epochs_run"] < cfg.epochs))
        self.readout.value = (
            f"<div style='font-size:90%'><b style='color:{PLACEMENT_COLORS[cfg.placement]}'>"
            f"{html.escape(cfg.placement)}</b>, β = {cfg.beta:g}, {cfg.steps} steps in {hist.seconds:.1f} s: "
            f"reward <b class='klviz-final-reward'>{hist.last('reward'):.2f}</b>, true KL "
            f"<b class='klviz-final-kl'>{hist.last('true_kl'):.2f}</b> nats, reported {hist.last('reported_kl'):.2f}, "
            f"entropy {hist.last('entropy'):.2f} (means of the last 5 steps)"
            + (f"; early stopping cut {stopped} of {cfg.steps} batches short" if cfg.early_stop_kl
               else "; early stopping off (0)")
            + f".<br>Last samples:<ul style='margin:0'>{samples}</ul></div>"
        )


def _first_prompts(cfg: LabConfig) -> list[str]:
    from .. import lm

    return [lm.PROMPTS[i % len(lm.PROMPTS)] for i in range(cfg.prompts)][:3]
