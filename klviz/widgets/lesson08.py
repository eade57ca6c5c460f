"""Lesson 08's panel: an engine of the tiny LM samples, the trainer rescores, a correction reweights.

:class:`EngineMismatchPanel` samples one batch of responses with each engine setting (precision,
top-p) once, when the panel is built, and then
shows, for the chosen setting,

- left: the per-token log-ratio ``log r = log π_old − log π_rollout`` of the sampled tokens (tokens
  from the engine), with the mean log kept mass ``log S`` marked;
- right: each response's sequence log-weight ``log W = Σ_t log r_t`` against its length, with the
  band a correction uses (the truncation cap, or the geometric-mean band scaled by the length);
- the readout: the mismatch metrics of :func:`klviz.mismatch.mismatch_metrics` and what the chosen
  correction does to the batch (tokens and responses it changes, effective sample size).
"""

from __future__ import annotations

import math
from typing import Any

import ipywidgets as widgets
import numpy as np
import torch
from matplotlib.figure import Figure

from .. import lm
from .. import mismatch as mm
from ..devices import make_generator
from ..plotting import COLORS, panel_figure, sticky_limits
from .base import Panel, html_table

__all__ = ["EngineMismatchPanel", "PRECISION_CHOICES", "TOP_P_CHOICES", "TRAINER_CHOICES"]

PRECISION_CHOICES: tuple[str, ...] = ("float32", "bfloat16")
TOP_P_CHOICES: tuple[float, ...] = (1.0, 0.9, 0.8, 0.7)
TRAINER_CHOICES: dict[str, str] = {"recompute as is": "plain", "replay the sampling mask": "fixed"}
_STYLE = {"description_width": "initial"}
_BINS = np.linspace(-0.6, 0.6, 61)


class EngineMismatchPanel(Panel):
    """Sampler vs trainer on the tiny LM: choose the engine, the trainer's recompute and a correction."""

    title = "Sampler vs trainer: the engine samples, the trainer rescores, a correction reweights"
    css_class = "klviz-lesson08"

    def __init__(
        self, device: str | torch.device | None = "cpu", repeats: int = 6, max_new_tokens: int = 40, seed: int = 8
    ) -> None:
        self.model = lm.load_tiny_lm("old")
        self.prompts = [p for p in lm.PROMPTS for _ in range(int(repeats))]
        self.max_new_tokens = int(max_new_tokens)
        self.seed = int(seed)
        self._batches: dict[tuple[str, float], dict[str, Any]] = {}
        for precision in PRECISION_CHOICES:  # every engine samples once, here: updates only reweight
            for top_p in TOP_P_CHOICES:
                self._batch(precision, top_p)
        super().__init__(device)

    def _batch(self, precision: str, top_p: float) -> dict[str, Any]:
        key = (precision, float(top_p))
        if key not in self._batches:
            spec = mm.EngineSpec(precision=precision, top_p=float(top_p))
            er = mm.sample_engine(self.model, self.prompts, make_generator(self.seed), spec, self.max_new_tokens)
            self._batches[key] = {
                "er": er,
                "plain": mm.trainer_logprobs(self.model, er),
                "fixed": mm.trainer_logprobs(self.model, er, replay_mask=True),
            }
        return self._batches[key]

    def make_controls(self) -> dict[str, widgets.ValueWidget]:
        return {
            "precision": widgets.ToggleButtons(
                options=list(PRECISION_CHOICES), value="bfloat16", description="engine runs in", style=_STYLE
            ),
            "top_p": widgets.SelectionSlider(
                options=list(TOP_P_CHOICES), value=0.9, description="engine top_p", style=_STYLE, continuous_update=True
            ),
            "trainer": widgets.Dropdown(
                options=list(TRAINER_CHOICES),
                value="recompute as is",
                description="trainer",
                style=_STYLE,
                layout=widgets.Layout(width="300px"),
            ),
            "correction": widgets.Dropdown(
                options=list(mm.CORRECTIONS),
                value="token_tis",
                description="correction",
                style=_STYLE,
                layout=widgets.Layout(width="230px"),
            ),
            "cap": widgets.SelectionSlider(
                options=[1.2, 1.5, 2.0, 3.0, 5.0],
                value=2.0,
                description="cap C / band",
                style=_STYLE,
                continuous_update=True,
            ),
        }

    def make_figure(self) -> Figure:
        fig, (ax_tok, ax_seq) = panel_figure(9.0, 3.5, ncols=2)
        self.hist = ax_tok.stairs(
            np.ones(len(_BINS) - 1), _BINS, color=COLORS["k1"], fill=True, alpha=0.6, label="sampled tokens"
        )
        self.log_s = ax_tok.axvline(0.0, color=COLORS["mu"], ls="--", lw=1.4, label="mean log S (kept mass)")
        ax_tok.axvline(0.0, color="black", lw=0.6)
        ax_tok.set_yscale("log")
        ax_tok.set_ylim(0.8, 1e4)
        ax_tok.set_xlim(_BINS[0], _BINS[-1])
        ax_tok.set_xlabel("log r = log π_old − log π_rollout  [nats]")
        ax_tok.set_ylabel("tokens (log scale)")
        ax_tok.legend(loc="upper left")
        self.ax_tok = ax_tok
        self.kept = ax_seq.scatter(np.zeros(1), np.zeros(1), s=12, color=COLORS["k3"], label="kept by the correction")
        self.dropped = ax_seq.scatter(
            np.zeros(1), np.zeros(1), s=14, color=COLORS["mu"], marker="x", label="dropped or capped"
        )
        (self.band_hi,) = ax_seq.plot([0, 60], [0, 0], color="black", ls=":", lw=1.2, label="correction's bound")
        (self.band_lo,) = ax_seq.plot([0, 60], [0, 0], color="black", ls=":", lw=1.2)
        ax_seq.axhline(0.0, color="black", lw=0.6)
        ax_seq.set_xlim(0, self.max_new_tokens + 2)
        ax_seq.set_xlabel("response length T [tokens]")
        ax_seq.set_ylabel("sequence log-weight log W = Σ log r")
        ax_seq.legend(loc="lower left", fontsize=8)
        self.ax_seq = ax_seq
        return fig

    def compute(self, precision: str, top_p: float, trainer: str, correction: str, cap: float) -> dict[str, Any]:
        if trainer not in TRAINER_CHOICES:
            raise ValueError(f"trainer must be one of {', '.join(TRAINER_CHOICES)}, got {trainer!r}")
        b = self._batch(precision, top_p)
        er: mm.EngineRollouts = b["er"]
        train = b[TRAINER_CHOICES[trainer]]
        mask = er.mask
        metrics = mm.mismatch_metrics(train, er.engine_logprob, mask)
        log_r = torch.where(mask, train - er.engine_logprob, torch.zeros_like(train)).double()
        band = (1.0 / cap, cap)
        w = mm.correction_weights(log_r, mask, correction, cap=cap, band=band)
        rows = mask.any(-1)
        if correction == "none":
            changed = torch.zeros_like(mask)
        elif correction in ("sequence_is", "sequence_tis"):
            changed = mask & ~torch.isclose(w, torch.exp(log_r.sum(-1, keepdim=True)).expand_as(w))
        else:
            changed = mask & ~torch.isclose(w, torch.exp(log_r))
        seq_changed = changed.any(-1)[rows]
        w_tok = w[mask]
        sq = float(w_tok.square().sum())
        ess = float(w_tok.sum() ** 2) / (sq * w_tok.numel()) if sq > 0 else 0.0
        lengths = mask.sum(-1)[rows].double()
        log_w = log_r.sum(-1)[rows]
        counts, _ = np.histogram(np.clip(log_r[mask].numpy(), _BINS[0], _BINS[-1]), bins=_BINS)
        return {
            "spec": er.spec.describe(),
            "trainer": trainer,
            "correction": correction,
            "cap": cap,
            "metrics": metrics,
            "kept_mass": float(er.kept_mass[mask].mean()),
            "log_kept_mass": float(er.kept_mass[mask].log().mean()),
            "counts": counts,
            "lengths": lengths.numpy(),
            "log_w": log_w.numpy(),
            "seq_changed": seq_changed.numpy(),
            "token_changed_fraction": float(changed[mask].double().mean()),
            "seq_changed_fraction": float(seq_changed.double().mean()),
            "ess": ess,
        }

    def draw(self, data: dict[str, Any]) -> None:
        self.hist.set_data(np.maximum(data["counts"], 0.5), _BINS)
        self.log_s.set_xdata([data["log_kept_mass"]] * 2)
        self.ax_tok.set_title(f"{data['metrics']['tokens']:,} tokens: engine {data['spec']}")
        L, lw, ch = data["lengths"], data["log_w"], data["seq_changed"]
        self.kept.set_offsets(np.column_stack([L[~ch], lw[~ch]]) if (~ch).any() else np.empty((0, 2)))
        self.dropped.set_offsets(np.column_stack([L[ch], lw[ch]]) if ch.any() else np.empty((0, 2)))
        c = math.log(data["cap"])
        t = np.array([0.0, self.max_new_tokens + 2.0])
        corr = data["correction"]
        if corr == "geo_reject":
            hi, lo = c * t, -c * t
        elif corr in ("sequence_tis",):
            hi, lo = np.array([c, c]), np.array([np.nan, np.nan])
        elif corr in ("token_tis", "token_mask"):
            hi, lo = c * t, (-c * t if corr == "token_mask" else np.array([np.nan, np.nan]))
        else:
            hi = lo = np.array([np.nan, np.nan])
        self.band_hi.set_data(t, hi)
        self.band_lo.set_data(t, lo)
        lo_y = min(float(np.min(lw)), -0.05)
        hi_y = max(float(np.max(lw)), 0.05)
        sticky_limits(self.ax_seq, "y", lo_y, hi_y)
        self.ax_seq.set_title(f"{len(lw)} responses: {corr} (C = {data['cap']:g})")
        m = data["metrics"]
        rows = [
            [
                "mean ratio E[π_old/π_rollout]",
                f"<span class='klviz-mean-ratio'>{m['mean_ratio']:.4f}</span> ± {2 * m['mean_ratio_se']:.4f}",
            ],
            ["mean kept mass S", f"<span class='klviz-kept-mass'>{data['kept_mass']:.4f}</span>"],
            ["k1 / k3 per token (KL(π_rollout‖π_old))", f"{m['k1']:.2e} / <span class='klviz-k3'>{m['k3']:.2e}</span>"],
            ["χ² token / sequence", f"{m['chi2_token']:+.2e} / {m['chi2_seq']:+.2e}"],
            ["token_mult_prob_error · ppl ratio", f"{m['token_mult_prob_error']:.4f} · {m['ppl_ratio']:.4f}"],
            ["max |log r|", f"{m['abs_diff_max']:.3f}"],
            [
                f"{corr}: tokens / responses changed",
                f"{100 * data['token_changed_fraction']:.1f}% / {100 * data['seq_changed_fraction']:.1f}%",
            ],
            ["effective sample size of the weights", f"{data['ess']:.3f}"],
        ]
        self.readout.value = html_table(["", "value"], rows) + (
            "<div style='font-size:90%'>Tokens sampled by the engine (π_rollout), rescored by the float32 trainer "
            "(π_old, same weights). Without a mismatch: ratio 1, S 1, k3 0, error 1.</div>"
        )
