"""Lesson 06's panel: how noisy is the KL your trainer logs, and what do clamps and precision do to it?

:class:`RolloutPanel` takes a rollout dump (the sample made with the tiny language model, or your
own file via :func:`klviz.diagnose.load_rollouts`) and shows

- left: the per-token values of one estimator over the whole batch, after a framework's clamp and
  with the log-probs stored in a chosen precision;
- right: the spread of the *batch* value a trainer would log if its batch held only ``B`` of these
  sequences (bootstrap: batches drawn with replacement from the dump), for k1, k2 and k3, beside the
  whole-dump value; the readout gives each spread and how often k1's batch value comes out negative.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import ipywidgets as widgets
import numpy as np
import torch
from matplotlib.figure import Figure

from ..devices import make_generator
from ..diagnose import RolloutDump, load_rollouts, sample_rollouts_path
from ..messages import N_, tr
from ..palette import css
from ..pitfalls import CLAMP_RULES, apply_clamp
from ..plotting import COLORS, panel_figure, sticky_limits
from .base import Panel, html_table

__all__ = ["RolloutPanel", "BATCH_SIZES", "STORAGE_DTYPES", "AGGREGATIONS"]

BATCH_SIZES: tuple[int, ...] = (2, 4, 8, 16, 32, 64, 128, 256)
STORAGE_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
AGGREGATIONS: tuple[str, ...] = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
_NUM_BATCHES = 400
_STYLE = {"description_width": "initial"}


def _aggregate(seq_sum: torch.Tensor, seq_n: torch.Tensor, mode: str) -> torch.Tensor:
    """Aggregate along the last axis of per-sequence sums and counts the way ``klviz.agg_loss`` does."""
    if mode == "token-mean":
        return seq_sum.sum(-1) / seq_n.sum(-1)
    if mode == "seq-mean-token-mean":
        return (seq_sum / seq_n).mean(-1)
    return seq_sum.mean(-1)


class RolloutPanel(Panel):
    """Bootstrap the logged KL of a rollout dump at batch size B, with clamps and storage precision."""

    title = N_("Your rollouts: the KL a trainer would log from B sequences of this dump")
    css_class = "klviz-rollouts"

    def __init__(
        self, rollouts: RolloutDump | None = None, device: str | torch.device | None = "cpu", seed: int = 0
    ) -> None:
        r = load_rollouts(sample_rollouts_path()) if rollouts is None else rollouts
        if not isinstance(r, RolloutDump):
            raise ValueError(
                f"rollouts must be a klviz.diagnose.RolloutDump (from load_rollouts), got {type(r).__name__}"
            )
        if r.old_logprob is not None and bool(((r.old_logprob - r.logprob).abs() > 1e-6)[r.mask].any()):
            raise ValueError(
                "rollouts holds off-policy tokens (old_logprob differs from logprob); this panel "
                "shows on-policy estimates: pass logprob=old_logprob for the sampler's view"
            )
        keep = r.mask.any(-1)
        self.mask = r.mask[keep]
        finite = torch.isfinite(r.logprob[keep]) & torch.isfinite(r.ref_logprob[keep])
        self.mask = self.mask & finite
        keep2 = self.mask.any(-1)
        self.mask = self.mask[keep2]
        lp = torch.where(self.mask, r.logprob[keep][keep2], torch.zeros(()))
        ref = torch.where(self.mask, r.ref_logprob[keep][keep2], torch.zeros(()))
        if self.mask.shape[0] < 2:
            raise ValueError("rollouts needs at least two sequences with counted, finite tokens")
        self.source = r.source
        # the log-ratio per storage precision, computed once: rounding the stored log-probs
        self.log_r = {name: (ref.to(dt).double() - lp.to(dt).double()) for name, dt in STORAGE_DTYPES.items()}
        self.seq_n = self.mask.sum(-1).double()
        self.seed = seed
        self._cache: dict[tuple[str, str, str], tuple[np.ndarray, torch.Tensor, float]] = {}
        super().__init__(device)

    def make_controls(self) -> dict[str, widgets.ValueWidget]:
        return {
            "batch_sequences": widgets.SelectionSlider(
                options=list(BATCH_SIZES),
                value=16,
                description=tr("batch B (sequences)"),
                style=_STYLE,
                continuous_update=True,
            ),
            "estimator": widgets.ToggleButtons(
                options=["k1", "k2", "k3"],
                value="k3",
                description=tr("left: tokens of"),
                style={"button_width": "48px", "description_width": "initial"},
            ),
            "clamp": widgets.Dropdown(
                options=list(CLAMP_RULES),
                value="none",
                description=tr("clamp"),
                style=_STYLE,
                layout=widgets.Layout(width="230px"),
            ),
            "precision": widgets.Dropdown(
                options=list(STORAGE_DTYPES),
                value="float32",
                description=tr("log-probs stored in"),
                style=_STYLE,
                layout=widgets.Layout(width="230px"),
            ),
            "aggregation": widgets.Dropdown(
                options=list(AGGREGATIONS),
                value="token-mean",
                description=tr("aggregation"),
                style=_STYLE,
                layout=widgets.Layout(width="270px"),
            ),
            "seed": widgets.BoundedIntText(
                value=self.seed, min=0, max=2**31 - 1, description=tr("seed"), layout=widgets.Layout(width="140px")
            ),
        }

    def make_figure(self) -> Figure:
        fig, (ax_tok, ax_boot) = panel_figure(8.4, 3.5, ncols=2)
        self.tok_hist = ax_tok.stairs(np.ones(40), np.linspace(0, 1, 41), color=COLORS["k3"], fill=True, alpha=0.6)
        self.tok_mean = ax_tok.axvline(0.0, color=COLORS["ink"], ls="--", lw=1.2, label=tr("batch token-mean"))
        ax_tok.set_yscale("log")
        ax_tok.set_xlabel(tr("per-token value [nats]"))
        ax_tok.set_ylabel(tr("tokens (log scale)"))
        ax_tok.legend(loc="upper right")
        self.ax_tok = ax_tok
        self.boot = {}
        self.full = {}
        for k in ("k1", "k2", "k3"):
            self.boot[k] = ax_boot.stairs(np.zeros(40), np.linspace(0, 1, 41), color=COLORS[k], lw=1.8, label=k)
            self.full[k] = ax_boot.axvline(0.0, color=COLORS[k], ls=":", lw=1.4)
        ax_boot.axvline(0.0, color=COLORS["ink"], lw=0.6)
        ax_boot.set_xlabel(tr("logged batch value [nats]"))
        ax_boot.set_ylabel(tr("fraction of batches"))
        ax_boot.legend(
            loc="upper right",
            title=tr("dotted: whole dump"),
            fontsize=8,
            title_fontsize=8,
            frameon=True,
            framealpha=0.85,
            edgecolor="none",
        )
        self.ax_boot = ax_boot
        return fig

    def compute(
        self, batch_sequences: int, estimator: str, clamp: str, precision: str, aggregation: str, seed: int
    ) -> dict[str, Any]:
        if precision not in STORAGE_DTYPES:
            raise ValueError(f"precision must be one of {', '.join(STORAGE_DTYPES)}, got {precision!r}")
        if aggregation not in AGGREGATIONS:
            raise ValueError(f"aggregation must be one of {', '.join(AGGREGATIONS)}, got {aggregation!r}")
        B = int(batch_sequences)
        if B < 1:
            raise ValueError(f"batch_sequences must be a positive integer, got {batch_sequences!r}")
        gen = make_generator(int(seed), "cpu")
        idx = torch.randint(0, self.mask.shape[0], (_NUM_BATCHES, B), generator=gen)
        n_boot = self.seq_n[idx]
        out: dict[str, Any] = {
            "batch_sequences": B,
            "estimator": estimator,
            "clamp": clamp,
            "precision": precision,
            "aggregation": aggregation,
            "stats": {},
        }
        for k in ("k1", "k2", "k3"):
            tokens, seq_sum, hit = self._per_token(k, clamp, precision)
            _, raw32, _ = self._per_token(k, "none", "float32")
            boot = _aggregate(seq_sum[idx], n_boot, aggregation)
            out["stats"][k] = {
                "full": float(_aggregate(seq_sum, self.seq_n, aggregation)),
                "unclamped_float32": float(_aggregate(raw32, self.seq_n, aggregation)),
                "boot_std": float(boot.std()),
                "boot_mean": float(boot.mean()),
                "frac_negative": float((boot < 0).double().mean()),
                "hit_fraction": hit,
                "boot": boot.numpy(),
            }
            if k == estimator:
                out["tokens"] = tokens
        return out

    def _per_token(self, estimator: str, clamp: str, precision: str) -> tuple[np.ndarray, torch.Tensor, float]:
        """Counted per-token values, per-sequence sums and the clamp's hit fraction (cached: 36 combinations)."""
        key = (estimator, clamp, precision)
        if key not in self._cache:
            lr = self.log_r[precision]
            vals = apply_clamp(lr, estimator, clamp).double()
            hit = float((vals != apply_clamp(lr, estimator, "none").double())[self.mask].double().mean())
            vals = torch.where(self.mask, vals, torch.zeros((), dtype=torch.float64))
            self._cache[key] = (vals[self.mask].numpy(), vals.sum(-1), hit)
        return self._cache[key]

    def draw(self, data: dict[str, Any]) -> None:
        k = data["estimator"]
        tok = data["tokens"]
        lo, hi = float(np.min(tok)), float(np.max(tok))
        if hi - lo < 1e-9:
            lo, hi = lo - 0.5, hi + 0.5
        counts, edges = np.histogram(tok, bins=40, range=(lo, hi))
        self.tok_hist.set_data(np.maximum(counts, 0.5), edges)  # 0.5: empty bins stay below the log axis's 1
        self.tok_hist.set_facecolor(COLORS[k])
        self.tok_hist.set_edgecolor(COLORS[k])
        self.tok_mean.set_xdata([float(tok.mean())] * 2)
        sticky_limits(self.ax_tok, "x", lo - 0.02 * (hi - lo), hi + 0.02 * (hi - lo))
        sticky_limits(self.ax_tok, "y", 0.8, max(10.0, counts.max() * 2.0))
        self.ax_tok.set_title(
            tr(
                "{size:,} tokens: {k} ({clamp}, {precision})",
                size=tok.size,
                k=k,
                clamp=data["clamp"],
                precision=data["precision"],
            )
        )

        stats = data["stats"]
        allb = np.concatenate([stats[e]["boot"] for e in stats] + [np.array([stats[e]["full"] for e in stats])])
        blo, bhi = float(np.quantile(allb, 0.002)), float(np.quantile(allb, 0.998))
        pad = 0.05 * (bhi - blo) if bhi > blo else 0.05
        edges = np.linspace(min(blo, 0.0) - pad, bhi + pad, 41)
        top = 0.0
        for e in ("k1", "k2", "k3"):
            c, _ = np.histogram(np.clip(stats[e]["boot"], edges[0], edges[-1]), bins=edges)
            frac = c / c.sum()
            top = max(top, float(frac.max()))
            self.boot[e].set_data(frac, edges)
            self.full[e].set_xdata([stats[e]["full"]] * 2)
        sticky_limits(self.ax_boot, "x", edges[0], edges[-1])
        sticky_limits(self.ax_boot, "y", 0, top * 1.15)
        self.ax_boot.set_title(
            tr(
                "{num_batches} batches of B = {batch_sequences}: {aggregation}",
                num_batches=_NUM_BATCHES,
                batch_sequences=data["batch_sequences"],
                aggregation=data["aggregation"],
            )
        )

        rows = [
            [
                f"<b style='color:{css(e)}'>{e}</b>",
                f"<span class='klviz-full-{e}'>{s['full']:.4f}</span>",
                f"{s['unclamped_float32']:.4f}",
                f"<span class='klviz-spread-{e}'>{s['boot_std']:.4f}</span>",
                f"{100 * s['frac_negative']:.1f}%",
                f"{100 * s['hit_fraction']:.2f}%",
            ]
            for e, s in stats.items()
        ]
        self.readout.value = html_table(
            [
                "",
                tr("whole dump"),
                tr("no clamp, float32"),
                tr("spread of one batch (std)"),
                tr("batches &lt; 0"),
                tr("tokens clamped"),
            ],
            rows,
        ) + tr(
            "<div style='font-size:90%'>Source: {name} · {sum:,} counted tokens in {shape_0} "
            "sequences. The estimate is of KL(π ‖ π_ref) per token (per sequence for "
            "seq-mean-token-sum).</div>",
            name=html.escape(Path(str(self.source)).name),
            sum=int(self.mask.sum()),
            shape_0=self.mask.shape[0],
        )
