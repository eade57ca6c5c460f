"""Lesson 00's first panel: move a target policy p away from a sampler q over twelve named tokens."""

from __future__ import annotations

from typing import Any

import ipywidgets as widgets
import numpy as np
import torch
from matplotlib.figure import Figure

from ..devices import make_generator
from ..divergences import categorical_kl, target_favours
from ..messages import N_, tr
from ..montecarlo import categorical_counts, moments_from_counts, summarize
from ..palette import css
from ..plotting import COLORS, panel_figure, sticky_limits
from ..policies import TOY_VOCAB, move_policy, toy_sampler_logits
from ..tables import categorical_moments
from .base import Panel, html_table, move_policy_controls

__all__ = ["StartHerePanel"]

_SAMPLE_COUNTS = (10, 30, 100, 300, 1_000, 3_000, 10_000, 100_000, 1_000_000)


class StartHerePanel(Panel):
    """Sampler q (fixed) and target p (moved by temperature, a push, a mix) over :data:`TOY_VOCAB`.

    Shows the exact KL(q || p) beside the sample means of k1, k2, k3 over N tokens drawn from q,
    each with a ±2 standard-error bar and its exact mean E_q[k] (so that k2's bias and the sampling
    noise can be told apart), and how often k1 comes out negative (exactly: P_q(p(x) > q(x))).
    """

    title = N_("Start here: sample tokens from q, estimate KL(q ‖ p)")
    css_class = "klviz-start-here"

    def __init__(self, device: str | torch.device | None = None, seed: int = 0) -> None:
        self.q_logp = toy_sampler_logits()
        self.seed = seed
        super().__init__(device)

    def make_controls(self) -> dict[str, widgets.ValueWidget]:
        style = {"description_width": "initial"}
        return {
            **move_policy_controls(push=1.0, push_range=4.0, token=1),
            "mix": widgets.FloatSlider(
                value=0.0,
                min=0.0,
                max=1.0,
                step=0.02,
                description=tr("mix p with uniform"),
                style=style,
                continuous_update=True,
            ),
            "num_samples": widgets.SelectionSlider(
                options=list(_SAMPLE_COUNTS),
                value=1_000,
                description=tr("tokens N"),
                style=style,
                continuous_update=False,
            ),
            "seed": widgets.BoundedIntText(
                value=self.seed, min=0, max=2**31 - 1, description=tr("seed"), layout=widgets.Layout(width="140px")
            ),
        }

    def make_figure(self) -> Figure:
        fig, (ax_pol, ax_est) = panel_figure(8.2, 3.4, ncols=2, gridspec_kw={"width_ratios": [2.2, 1]})
        x = np.arange(len(TOY_VOCAB))
        q = self.q_logp.exp().numpy()
        self.bars_q = ax_pol.bar(x - 0.2, q, width=0.4, color=COLORS["q"], label=tr("sampler q (fixed)"))
        self.bars_p = ax_pol.bar(x + 0.2, q, width=0.4, color=COLORS["p"], label=tr("target p (move me)"))
        (self.freq_line,) = ax_pol.plot(x - 0.2, q, "_", color=COLORS["ink"], ms=9, mew=2, label=tr("draw frequency"))
        ax_pol.set_xticks(x, [t.strip() for t in TOY_VOCAB], rotation=40, ha="right")
        ax_pol.set_ylabel(tr("probability"))
        ax_pol.set_title(tr('next token after "The cat sat on the"'))
        ax_pol.set_ylim(0, 1)
        ax_pol.legend(loc="upper right")
        self.ax_pol = ax_pol

        pos = np.arange(3)
        self.est_bars = ax_est.bar(
            pos, [0, 0, 0], width=0.6, color=[COLORS["k1"], COLORS["k2"], COLORS["k3"]], alpha=0.85
        )
        self.err = ax_est.errorbar(pos, [0, 0, 0], yerr=[0, 0, 0], fmt="none", ecolor=COLORS["ink"], capsize=5, lw=1.2)
        self.exact_line = ax_est.axhline(0.0, color=COLORS["exact"], ls="--", lw=1.5, label=tr("exact KL(q‖p)"))
        ax_est.axhline(0.0, color=COLORS["ink"], lw=0.6)
        ax_est.set_xticks(pos, ["k1", "k2", "k3"])
        ax_est.set_ylabel(tr("estimate of KL(q‖p)  [nats]"))
        ax_est.set_title(tr("sample means ± 2 SE"))
        ax_est.legend(loc="upper left")
        self.ax_est = ax_est
        return fig

    def compute(
        self, temperature: float, push: float, push_token: int, mix: float, num_samples: int, seed: int
    ) -> dict[str, Any]:
        log_p = move_policy(self.q_logp, temperature=temperature, push=push, push_token=push_token, mix=mix)
        # the same seed draws the same tokens whatever p is: only the effect of moving p shows
        counts = categorical_counts(self.q_logp.exp(), int(num_samples), generator=make_generator(seed, "cpu"))
        q, p = self.q_logp.exp(), log_p.exp()
        # p > q beyond float32 rounding: at push 0 the log-ratios are rounding noise, not a preference of p
        favoured = target_favours(q, p)
        same = not bool((favoured | target_favours(p, q)).any())  # p = q up to rounding
        log_r = torch.zeros_like(log_p) if same else log_p - self.q_logp  # log p(x) - log q(x), per token
        exact = float(categorical_kl(q, p))  # never below 0, and 0 where p = q up to rounding
        stats = summarize(moments_from_counts(counts, log_r), exact)
        frac_neg_k1 = float(counts[favoured].sum() / num_samples)
        # exact E_q[k], summed over the 12 tokens in float64 (renormalised: E_q[r] = 1 to the last digit)
        p64 = torch.softmax(self.q_logp.double(), -1) if same else torch.softmax(log_p.double(), -1)
        moments = categorical_moments(torch.softmax(self.q_logp.double(), -1), p64)
        return {
            "p": log_p.exp().numpy(),
            "freq": (counts / num_samples).numpy(),
            "exact": exact,
            "stats": stats,
            "frac_negative_k1": frac_neg_k1,
            "num_samples": int(num_samples),
            "exact_mean": dict(moments.mean),
            "exact_bias": {k: moments.bias(k) for k in moments.mean},
            "frac_negative_k1_exact": float(q[favoured].sum()),
            "same": same,
        }

    def draw(self, data: dict[str, Any]) -> None:
        for bar, h in zip(self.bars_p, data["p"]):
            bar.set_height(h)
        self.freq_line.set_ydata(data["freq"])
        sticky_limits(self.ax_pol, "y", 0, max(0.4, float(data["p"].max()) * 1.1, float(data["freq"].max()) * 1.1))
        stats = data["stats"]
        means = [stats[k]["mean"] for k in ("k1", "k2", "k3")]
        ses = [2 * stats[k]["se"] for k in ("k1", "k2", "k3")]
        for bar, h in zip(self.est_bars, means):
            bar.set_height(h)
        _set_errorbars(self.err, np.arange(3), means, ses)
        self.exact_line.set_ydata([data["exact"], data["exact"]])
        lo = min(0.0, *(m - s for m, s in zip(means, ses)))
        hi = max(data["exact"], *(m + s for m, s in zip(means, ses)))
        pad = 0.12 * (hi - lo) if hi > lo else 0.01
        sticky_limits(self.ax_est, "y", lo - pad, hi + pad)
        kl = data["exact"]

        def bias(k: str) -> str:
            b = data["exact_bias"][k]  # float64 sums over the vocabulary
            if abs(b) < 1e-12 + 1e-9 * kl:
                return tr("0 (unbiased)") if k != "k2" else "0"
            return tr("{b:+.4f} ({b2:+.1f} % of KL)", b=b, b2=100 * b / kl)

        rows = [
            [
                f"<b style='color:{css(k)}'>{k}</b>",
                f"{stats[k]['mean']:.4f}",
                f"± {2 * stats[k]['se']:.4f}",
                f"{data['exact_mean'][k]:.4f}",
                bias(k),
                f"{stats[k]['std']:.4f}",
            ]
            for k in ("k1", "k2", "k3")
        ]
        rows.append(
            [
                tr("<b>exact KL</b>"),
                f"<span class='klviz-exact'>{kl:.4f}</span>",
                "",
                "",
                tr("KL(q‖p), sum over 12 tokens"),
                "",
            ]
        )
        if data["same"]:
            sign_note = tr(
                "p = q (up to float32 rounding): every token has log r = 0, so k1, k2 and k3 are exactly 0 on every "
                "draw and the KL is 0."
            )
        else:
            sign_note = tr(
                "k1 is negative for <b>{frac_negative_k1:.1f}%</b> of the draws (exactly P<sub>q</sub>(p "
                "&gt; q) = {frac_negative_k1_exact:.1f}%: the tokens p likes more than q does); k2 and "
                "k3 never are.",
                frac_negative_k1=100 * data["frac_negative_k1"],
                frac_negative_k1_exact=100 * data["frac_negative_k1_exact"],
            )
        self.readout.value = html_table(
            [
                "",
                tr("sample mean"),
                "±2 SE",
                tr("exact mean E<sub>q</sub>[k]"),
                tr("bias = exact mean − KL"),
                tr("std of one sample"),
            ],
            rows,
        ) + tr(
            "<div style='font-size:90%'>N = {num_samples:,} tokens from q; every ± is 2 standard "
            "errors (2 SE). Sample mean − exact mean is noise (within about ±2 SE); exact mean − KL "
            "is bias (only k2 has one). {sign_note}</div>",
            num_samples=data["num_samples"],
            sign_note=sign_note,
        )


def _set_errorbars(container: Any, x: np.ndarray, y: list[float], half: list[float]) -> None:
    """Move the vertical error bars of an ``errorbar`` container without rebuilding it."""
    _line, caps, (segments,) = container
    segments.set_segments([[[xi, yi - h], [xi, yi + h]] for xi, yi, h in zip(x, y, half)])
    if caps:
        caps[0].set_data(x, np.asarray(y) - np.asarray(half))
        caps[1].set_data(x, np.asarray(y) + np.asarray(half))
