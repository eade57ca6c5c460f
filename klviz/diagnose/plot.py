"""The optional PNGs of ``klviz diagnose --plot``; matplotlib is imported only when one is drawn.

:func:`plot_report` draws one batch (four panels); off-policy, the estimates panel shows the
ρ-weighted rows (the ones that estimate KL(π ‖ π_ref)) beside the plain ones. :func:`plot_series`
draws the trend of a run.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from .. import kernel
from .analysis import Diagnosis

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

__all__ = ["plot_report", "plot_series"]


#: the palette name (``klviz.palette.NAMED``) of each severity's colour, read from ``COLORS`` when drawn
_SEVERITY_COLOUR_NAME = {"error": "bad", "warning": "warn", "info": "muted"}


def plot_report(d: Diagnosis, path: str | Path | None = None) -> Figure:
    """A four-panel figure of the diagnosis with its trouble signs: each sign listed under the panels in the
    colour of its severity, and marked on the panel that shows it (the Markov bound on the log-ratio
    histogram, the shifted-copy test and the mask's edges on the per-position panel). Saved as PNG to
    ``path`` when given. Returns the figure."""
    from ..plotting import COLORS, new_figure

    shown = [t for t in d.trouble if t.severity != "info"] or list(d.trouble)
    n_lines = max(1, len(shown))
    fig, axes = new_figure(
        9.0, 6.4 + 0.32 * n_lines, nrows=3, ncols=2, gridspec_kw={"height_ratios": [1, 1, 0.12 + 0.1 * n_lines]}
    )
    (ax_lr, ax_k), (ax_pos, ax_bar), (ax_t, ax_t2) = axes
    grid = ax_t.get_gridspec()
    ax_t2.remove()
    ax_t.remove()
    ax_text = fig.add_subplot(grid[2, :])
    codes = {t.code for t in d.trouble}
    lr = d.log_r_sample if d.log_r_sample is not None else np.zeros(1)
    lo, hi = float(np.min(lr)), float(np.max(lr))
    span = max(hi - lo, 1e-6)
    ax_lr.hist(lr, bins=60, range=(lo - 0.02 * span, hi + 0.02 * span), color=COLORS["q"], alpha=0.9)
    ax_lr.set_yscale("log")
    for x in (-10, 10, -20, 20):
        if lo - 0.02 * span <= x <= hi + 0.02 * span:
            ax_lr.axvline(x, color=COLORS["mu"], ls="--", lw=1)
    ax_lr.set_xlabel("log r = log π_ref − log π  (per token)")
    ax_lr.set_ylabel("tokens")
    sub = "" if d.quantiles_from >= d.n_tokens else f", subsample of {d.quantiles_from:,}"
    ax_lr.set_title(f"per-token log-ratio ({d.n_tokens:,} tokens{sub})")
    tb = d.tail_bound
    if tb and tb.get("above"):
        c, (frac, _se) = max(tb["above"].items(), key=lambda kv: kv[1][0] * kv[0])
        x_c = math.log(c)
        bad = "not_sampler_tokens" in codes
        if lo - 0.02 * span <= x_c <= hi + 0.02 * span:
            ax_lr.axvline(x_c, color=COLORS[_SEVERITY_COLOUR_NAME["error" if bad else "info"]], lw=1.2, ls=":")
        ax_lr.text(
            0.02,
            0.96,
            f"{100 * frac:.3g}% of tokens with {tb['ratio']} ≥ {c:g}\n(sampled tokens allow ≤ {100 / c:.3g}%)",
            transform=ax_lr.transAxes,
            va="top",
            fontsize=7.5,
            color=COLORS[_SEVERITY_COLOUR_NAME["error" if bad else "info"]],
        )

    ests = kernel.estimates(torch.as_tensor(lr))
    top = max(float(np.quantile(ests[k].numpy(), 0.999)) for k in ("k2", "k3"))
    low = float(np.quantile(ests["k1"].numpy(), 0.001))
    bins = np.linspace(min(low, 0.0), max(top, float(np.quantile(ests["k1"].numpy(), 0.999)), 1e-3), 60)
    for k in ("k1", "k2", "k3"):
        ax_k.hist(
            np.clip(ests[k].numpy(), bins[0], bins[-1]), bins=bins, histtype="step", lw=1.6, color=COLORS[k], label=k
        )
    ax_k.set_yscale("log")
    ax_k.set_xlabel("per-token value [nats] (clipped to the 0.1–99.9% range)")
    ax_k.set_ylabel("tokens")
    ax_k.set_title("per-token k1, k2, k3")
    ax_k.legend()

    st = d.positions.get("start") or {"count": [], "k3": [], "log_r": []}
    pos = np.arange(1, len(st["count"]) + 1)
    if pos.size:
        ax_pos.plot(pos, st["log_r"], color=COLORS["k1"], lw=1.2, label="mean log r")
        ax_pos.plot(pos, st["k3"], color=COLORS["k3"], lw=1.2, label="mean k3")
        ax_pos.set_xscale("log")
    ax_pos.axhline(0, color=COLORS["ink"], lw=0.6)
    ax_pos.set_xlabel("position in the response (from its first counted token)")
    ax_pos.set_ylabel("nats")
    ax_pos.set_title("per-position means")
    ax_pos.legend(loc="lower right", fontsize=7)
    notes = []
    for pair, a in d.alignment.items():
        m = a["mean_abs"]
        if a.get("pairs"):
            first, second = pair.split("|")
            notes.append(f"mean |{first} − {second}| at t: {m[0]:.3g}; vs t+1: {m[1]:.3g}; vs t−1: {m[-1]:.3g}")
    if notes:
        ax_pos.text(
            0.02,
            0.96,
            "\n".join(notes),
            transform=ax_pos.transAxes,
            va="top",
            fontsize=6.5,
            color=COLORS[_SEVERITY_COLOUR_NAME["error" if "logprob_misaligned" in codes else "info"]],
        )
    if codes & {"mask_shifted", "last_token", "logprob_misaligned"}:
        ax_pos.set_title(
            "per-position means: " + ", ".join(sorted(codes & {"mask_shifted", "last_token", "logprob_misaligned"})),
            color=COLORS[
                _SEVERITY_COLOUR_NAME["error" if codes & {"mask_shifted", "logprob_misaligned"} else "warning"]
            ],
        )

    modes = [("token_mean", "token-mean"), ("seq_token_mean", "seq-mean-\ntoken-mean")]
    width = 0.25
    if d.off_policy:
        rows = [(f"ρ·{k}", d.extra[f"ρ·{k}, ρ = π/π_old"]) for k in ("k1", "k2", "k3")]
        for i, (k, e) in enumerate(rows):
            err = 2 * e["token_mean_se"] if math.isfinite(e["token_mean_se"]) else 0.0
            ax_bar.bar(
                [i],
                [e["token_mean"]],
                width=0.6,
                color=COLORS[k[-2:]],
                yerr=[err],
                capsize=3,
                ecolor=COLORS["ink"],
                label=k,
            )
        ax_bar.set_xticks(range(3), [k for k, _ in rows])
        ax_bar.set_title("ρ-weighted estimates ± 2 SE (tokens from π_old)")
    else:
        for i, k in enumerate(("k1", "k2", "k3")):
            e = d.estimates[k]
            xs = np.arange(len(modes)) + (i - 1) * width
            ys = [e[m] for m, _ in modes]
            errs = [2 * e[m + "_se"] if math.isfinite(e[m + "_se"]) else 0.0 for m, _ in modes]
            ax_bar.bar(xs, ys, width=width, color=COLORS[k], label=k, yerr=errs, capsize=3, ecolor=COLORS["ink"])
        ax_bar.set_xticks(np.arange(len(modes)), [lab for _, lab in modes])
        ax_bar.set_title("batch estimates ± 2 SE")
    ax_bar.axhline(0, color=COLORS["ink"], lw=0.6)
    ax_bar.set_ylabel("KL(π ‖ π_ref) estimate [nats/token]")
    ax_bar.legend()
    ax_text.axis("off")
    if not d.trouble:
        ax_text.text(0.0, 0.5, "no trouble signs", va="center", fontsize=9, color=COLORS[_SEVERITY_COLOUR_NAME["info"]])
    for i, t in enumerate(shown):
        line = f"[{t.severity}] {t.code}: {t.message}"
        ax_text.text(
            0.0,
            1.0 - (i + 0.5) / n_lines,
            line if len(line) <= 150 else line[:147] + "...",
            va="center",
            fontsize=7.5,
            color=COLORS[_SEVERITY_COLOUR_NAME[t.severity]],
            transform=ax_text.transAxes,
        )
    worst = d.worst_severity()
    fig.suptitle(
        f"klviz diagnose: {Path(d.source).name}  ·  {len(d.trouble)} trouble sign(s)"
        + (f", worst: {worst}" if worst else ""),
        fontsize=11,
        color=COLORS[_SEVERITY_COLOUR_NAME[worst]] if worst in ("error", "warning") else COLORS["ink"],
    )
    if path is not None:
        fig.savefig(path, dpi=100)
    return fig


def plot_series(items: list, path: str | Path | None = None) -> Figure:
    """The trend of a run: k1, k3 (and ρ·k3, ppo_kl, engine mismatch when present) per dump, ± 2 SE."""
    from ..plotting import COLORS, new_figure
    from .report import _trend_values

    fig, axes = new_figure(9.0, 3.6, nrows=1, ncols=2)
    ax, ax_t = axes
    good = [(i, step, d) for i, (_n, step, d) in enumerate(items) if isinstance(d, Diagnosis)]
    xs = [step if step is not None else i for i, step, _d in good]
    for name, color in (
        ("k1", COLORS["k1"]),
        ("k3", COLORS["k3"]),
        ("ρ·k3", COLORS["k2"]),
        ("ppo_kl", COLORS["mu"]),
        ("mismatch k3", COLORS["ink"]),
    ):
        vals = [_trend_values(d).get(name) for _i, _s, d in good]
        if not any(v is not None for v in vals):
            continue
        pts = [(x, v) for x, v in zip(xs, vals) if v is not None]
        ax.errorbar(
            [p[0] for p in pts],
            [p[1][0] for p in pts],
            yerr=[2 * p[1][1] if math.isfinite(p[1][1]) else 0 for p in pts],
            color=color,
            label=name,
            marker="o",
            ms=3,
            capsize=2,
        )
    ax.axhline(0, color=COLORS["ink"], lw=0.6)
    ax.set_xlabel("step" if all(s is not None for _i, s, _d in good) else "dump")
    ax.set_ylabel("nats/token")
    ax.set_title("KL estimates across the run")
    ax.legend()
    counts = [sum(t.severity != "info" for t in d.trouble) for _i, _s, d in good]
    ax_t.bar(xs, counts, color=COLORS["q"])
    ax_t.set_xlabel(ax.get_xlabel())
    ax_t.set_ylabel("warnings + errors")
    ax_t.set_title("trouble signs per dump")
    if path is not None:
        fig.savefig(path, dpi=100)
    return fig
