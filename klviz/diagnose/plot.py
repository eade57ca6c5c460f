"""The optional four-panel PNG of ``klviz diagnose --plot``; matplotlib is imported only when it is drawn."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from .. import kernel
from .analysis import Diagnosis

__all__ = ["plot_report"]


def plot_report(d: Diagnosis, path: str | Path | None = None):
    """A four-panel figure of the diagnosis; saved as PNG to ``path`` when given. Returns the figure."""
    from ..plotting import COLORS, new_figure

    fig, axes = new_figure(9.0, 6.4, nrows=2, ncols=2)
    (ax_lr, ax_k), (ax_seq, ax_bar) = axes
    assert d.log_r is not None and d.valid is not None
    lr = d.log_r[d.valid].numpy()
    lo, hi = float(np.min(lr)), float(np.max(lr))
    span = max(hi - lo, 1e-6)
    ax_lr.hist(lr, bins=60, range=(lo - 0.02 * span, hi + 0.02 * span), color=COLORS["q"], alpha=0.9)
    ax_lr.set_yscale("log")
    for x in (-10, 10, -20, 20):
        if lo - 0.02 * span <= x <= hi + 0.02 * span:
            ax_lr.axvline(x, color=COLORS["mu"], ls="--", lw=1)
    ax_lr.set_xlabel("log r = log π_ref − log π  (per token)")
    ax_lr.set_ylabel("tokens")
    ax_lr.set_title(f"per-token log-ratio ({d.n_tokens:,} tokens)")

    ests = kernel.estimates(torch.as_tensor(lr))
    top = max(float(np.quantile(ests[k].numpy(), 0.999)) for k in ("k2", "k3"))
    low = float(np.quantile(ests["k1"].numpy(), 0.001))
    bins = np.linspace(min(low, 0.0), max(top, float(np.quantile(ests["k1"].numpy(), 0.999)), 1e-3), 60)
    for k in ("k1", "k2", "k3"):
        ax_k.hist(np.clip(ests[k].numpy(), bins[0], bins[-1]), bins=bins, histtype="step", lw=1.6,
                  color=COLORS[k], label=k)
    ax_k.set_yscale("log")
    ax_k.set_xlabel("per-token value [nats] (clipped to the 0.1–99.9% range)")
    ax_k.set_ylabel("tokens")
    ax_k.set_title("per-token k1, k2, k3")
    ax_k.legend()

    valid = d.valid
    lengths = valid.sum(-1).numpy()
    keep = lengths > 0
    zero = torch.zeros((), dtype=torch.float64)
    full = kernel.estimates(d.log_r)
    for k in ("k1", "k3"):
        s = torch.where(valid, full[k], zero).sum(-1).numpy()
        ax_seq.scatter(lengths[keep], s[keep], s=12, alpha=0.7, color=COLORS[k], label=f"{k} summed over the response")
    ax_seq.axhline(0, color="black", lw=0.6)
    ax_seq.set_xlabel("counted tokens in the response")
    ax_seq.set_ylabel("sequence KL estimate [nats]")
    ax_seq.set_title("per-sequence sums vs length")
    ax_seq.legend()

    modes = [("token_mean", "token-mean"), ("seq_token_mean", "seq-mean-\ntoken-mean")]
    width = 0.25
    for i, k in enumerate(("k1", "k2", "k3")):
        e = d.estimates[k]
        xs = np.arange(len(modes)) + (i - 1) * width
        ys = [e[m] for m, _ in modes]
        errs = [2 * e[m + "_se"] if math.isfinite(e[m + "_se"]) else 0.0 for m, _ in modes]
        ax_bar.bar(xs, ys, width=width, color=COLORS[k], label=k, yerr=errs, capsize=3)
    ax_bar.axhline(0, color="black", lw=0.6)
    ax_bar.set_xticks(np.arange(len(modes)), [lab for _, lab in modes])
    ax_bar.set_ylabel("KL(π ‖ π_ref) estimate [nats/token]")
    ax_bar.set_title("batch estimates ± 2 SE")
    ax_bar.legend()
    fig.suptitle(f"klviz diagnose: {Path(d.source).name}  ·  {len(d.trouble)} trouble sign(s)", fontsize=11)
    if path is not None:
        fig.savefig(path, dpi=100)
    return fig
