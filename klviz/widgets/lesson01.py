"""Lesson 01's panel: the weight is in the sampling, and importance weights put it back.

Over the twelve readable tokens of :data:`klviz.policies.TOY_VOCAB` there are three policies (the
lesson calls the expectation's policy pi, so that q keeps its lesson-00 meaning, "the sampler"):

- **pi** (the current policy pi_theta), the distribution the expectation is taken over; movable (the
  code's ``q``: controls ``q_push``, ``q_temperature``);
- **p** (the reference pi_ref), fixed; the quantity is KL(pi || p) = sum_x pi(x) log pi(x)/p(x);
- **mu** (a stale policy pi_old), the sampler that drew the tokens when they do not come from pi; movable.

A toggle picks where the tokens come from and how they are averaged: from pi (plain mean: unbiased),
from mu (plain mean: biased, it converges to E_mu[log pi/p]), or from mu with importance weights pi/mu
(the expectation's policy over the sampler: unbiased again, at
the price of variance; the effective sample size says how much). With weights, a tiny effective
sample size makes the ±2 SE band itself untrustworthy: the readout then says so instead of calling
the (unbiased) weighted mean biased.
"""

from __future__ import annotations

import math
from typing import Any

import ipywidgets as widgets
import numpy as np
import torch
from matplotlib.figure import Figure

from ..devices import make_generator
from ..divergences import categorical_kl
from ..messages import N_, tr
from ..palette import css
from ..plotting import COLORS, panel_figure, sticky_limits
from ..policies import TOY_VOCAB, move_policy, toy_sampler_logits
from ..sampling import SAMPLING_CHUNK, RunningMean, draw_tokens, effective_sample_size, importance_weights
from ..statistics import plus_minus
from .base import Panel

__all__ = ["SamplingPanel", "MODES"]

#: The three ways of drawing and averaging, as (label, value) pairs for the toggle.
MODES = ((N_("samples from π"), "q"), (N_("samples from μ"), "mu"), (N_("with importance weights"), "weighted"))
_SAMPLE_COUNTS = (100, 300, 1_000, 3_000, 10_000, 30_000, 100_000, 300_000, 1_000_000)
_PUSH_TOKEN = 1  # " sofa": the token fine-tuning made pi prefer
_MU_PUSH_TOKEN = 0  # " mat": the token the stale sampler mu can over- or under-weight


class SamplingPanel(Panel):
    """Sample tokens from pi or from mu, average log pi/p, and watch the running mean converge (or not).

    ``compute`` returns the three policies (pi under the key ``"q"``), the draw frequencies (raw and
    weighted), the running mean with its standard error at log-spaced N, the exact KL(pi || p), the
    value a plain mean over mu's tokens converges to, and the effective sample size.
    """

    title = N_("Sampling as weighting: tokens from π, from μ, or from μ with weights π/μ")
    css_class = "klviz-sampling"

    def __init__(self, device: str | torch.device | None = None, seed: int = 0) -> None:
        self.ref_logp = toy_sampler_logits()  # p = pi_ref, fixed
        self.seed = seed
        super().__init__(device)

    def make_controls(self) -> dict[str, widgets.ValueWidget]:
        style = {"description_width": "initial"}
        slider = dict(style=style, continuous_update=True, layout=widgets.Layout(width="340px"))
        return {
            "mode": widgets.ToggleButtons(
                options=[(tr(label), mode) for label, mode in MODES],
                value="q",
                description=tr("tokens"),
                style={"button_width": "190px"},
            ),
            "q_push": widgets.FloatSlider(
                value=1.5, min=-4.0, max=4.0, step=0.1, description=tr("π: push ' sofa'"), **slider
            ),
            "q_temperature": widgets.FloatSlider(
                value=0.8, min=0.25, max=4.0, step=0.05, description=tr("π: temperature"), **slider
            ),
            "mu_temperature": widgets.FloatSlider(
                value=2.0, min=0.25, max=4.0, step=0.05, description=tr("μ: temperature"), **slider
            ),
            "mu_push": widgets.FloatSlider(
                value=0.0, min=-4.0, max=4.0, step=0.1, description=tr("μ: push ' mat'"), **slider
            ),
            "num_samples": widgets.SelectionSlider(
                options=list(_SAMPLE_COUNTS),
                value=10_000,
                description=tr("tokens N"),
                style=style,
                continuous_update=False,
                layout=widgets.Layout(width="340px"),
            ),
            "seed": widgets.BoundedIntText(
                value=self.seed, min=0, max=2**31 - 1, description=tr("seed"), layout=widgets.Layout(width="140px")
            ),
        }

    def layout_controls(self) -> widgets.Widget:
        c = self.controls
        row = dict(layout=widgets.Layout(flex_flow="row wrap"))
        return widgets.VBox(
            [
                c["mode"],
                widgets.HBox([c["q_push"], c["q_temperature"]], **row),
                widgets.HBox([c["mu_temperature"], c["mu_push"]], **row),
                widgets.HBox([c["num_samples"], c["seed"]], **row),
            ]
        )

    def make_figure(self) -> Figure:
        fig, (ax_pol, ax_run) = panel_figure(8.4, 3.9, ncols=2, gridspec_kw={"width_ratios": [1.35, 1]})
        x = np.arange(len(TOY_VOCAB))
        zeros = np.zeros(len(TOY_VOCAB))
        self.bars_q = ax_pol.bar(
            x - 0.2, zeros, width=0.4, color=COLORS["q"], label=tr("π(x): the expectation's weights")
        )
        self.bars_mu = ax_pol.bar(
            x + 0.2, zeros, width=0.4, color=COLORS["mu"], alpha=0.55, label=tr("μ(x): the sampler")
        )
        (self.p_line,) = ax_pol.plot(
            x, self.ref_logp.exp().numpy(), "o", color=COLORS["p"], ms=4, label=tr("p(x): reference (fixed)")
        )
        (self.freq_line,) = ax_pol.plot(
            x - 0.2, zeros, "_", color=COLORS["ink"], ms=10, mew=2.2, label=tr("counts / N")
        )
        ax_pol.set_xticks(x, [t.strip() for t in TOY_VOCAB], rotation=40, ha="right")
        ax_pol.set_ylabel(tr("probability"))
        ax_pol.set_title(tr("draw frequencies vs π(x)"))
        self.legend_pol = ax_pol.legend(loc="upper right")
        self.ax_pol = ax_pol

        self.band = ax_run.fill_between([1, 2], [0, 0], [0, 0], color=COLORS["k1"], alpha=0.2, lw=0, label="± 2 SE")
        self._run_labels = {
            "q": tr("running mean of log π/p, x ~ π"),
            "mu": tr("running mean of log π/p, x ~ μ"),
            "weighted": tr("running mean of (π/μ)·log π/p, x ~ μ"),
        }
        (self.run_line,) = ax_run.plot([1, 2], [0, 0], color=COLORS["k1"], lw=1.4, label=self._run_labels["q"])
        self.exact_line = ax_run.axhline(0.0, color=COLORS["exact"], ls="--", lw=1.4, label=tr("exact KL(π‖p)"))
        self.biased_line = ax_run.axhline(
            0.0, color=COLORS["mu"], ls=":", lw=1.6, label=tr("E_μ[log π/p] (plain mean over μ's tokens)")
        )
        ax_run.set_xscale("log")
        ax_run.minorticks_off()  # dozens of minor ticks cost redraw time and add nothing here
        ax_run.set_xlabel(tr("number of tokens N"))
        ax_run.set_ylabel(tr("estimate of KL(π‖p)  [nats]"))
        # a fixed title: what is averaged, and over which tokens, is the legend's first entry (a changed
        # title would be baked into every kept background and force a full render on each mode change)
        ax_run.set_title(tr("running mean as N grows"))
        # below the axes: the curves use the whole plot, and the legend never hides them
        self.legend_run = ax_run.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, fontsize=8)
        # one legend per axes for every mode: a mode changes an entry's text or hides the last entry,
        # so switching modes redraws the legend and the data but not the axes
        self._freq_entry = [t.get_text() for t in self.legend_pol.get_texts()].index(tr("counts / N"))
        self._run_entry = [t.get_text() for t in self.legend_run.get_texts()].index(self.run_line.get_label())
        self._biased_entry = [t.get_text() for t in self.legend_run.get_texts()].index(self.biased_line.get_label())
        assert self._biased_entry == len(self.legend_run.get_texts()) - 1  # hidden, it leaves no gap
        self.ax_run = ax_run
        self._legend_mode: str | None = None
        return fig

    def policies(
        self, q_push: float, q_temperature: float, mu_temperature: float, mu_push: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """log q and log mu for the given control values (p is the fixed reference)."""
        log_q = move_policy(self.ref_logp, temperature=q_temperature, push=q_push, push_token=_PUSH_TOKEN)
        log_mu = move_policy(self.ref_logp, temperature=mu_temperature, push=mu_push, push_token=_MU_PUSH_TOKEN)
        return log_q, log_mu

    def compute(
        self,
        mode: str,
        q_push: float,
        q_temperature: float,
        mu_temperature: float,
        mu_push: float,
        num_samples: int,
        seed: int,
    ) -> dict[str, Any]:
        if mode not in dict(MODES).values():
            raise ValueError(f"mode must be one of {[m for _, m in MODES]}, got {mode!r}")
        n = int(num_samples)
        log_q, log_mu = self.policies(q_push, q_temperature, mu_temperature, mu_push)
        log_p = self.ref_logp
        q, mu = log_q.exp(), log_mu.exp()
        g = (log_q - log_p).double()  # log pi(x)/p(x): one sample of k1 for KL(pi||p)
        exact = float(categorical_kl(q, log_p.exp()))
        biased_limit = float((mu.double() * g).sum())  # what a plain mean over mu's tokens converges to
        sampler = q if mode == "q" else mu
        w = (
            importance_weights(log_q, log_mu).double()
            if mode == "weighted"
            else torch.ones(len(TOY_VOCAB), dtype=torch.float64)
        )
        # the same seed gives the same uniforms: switching the sampler changes the tokens, nothing else.
        # Drawn and followed a chunk at a time (the same draws as one call): a million tokens cost 2 MB, not 30.
        generator, value = make_generator(seed, "cpu"), w * g
        acc, counts = RunningMean(n), torch.zeros(len(TOY_VOCAB), dtype=torch.float64)
        for start in range(0, n, SAMPLING_CHUNK):
            tokens = draw_tokens(sampler, min(SAMPLING_CHUNK, n - start), generator=generator)
            acc.add(value[tokens])
            counts += torch.bincount(tokens, minlength=len(TOY_VOCAB))
        run = acc.result()
        # the exact spread of one draw's value w·g under the sampler: sets the y range of the plot
        # (from the policies alone, so a new seed or N moves the curve, not the axis)
        one_draw_mean = float((sampler.double() * w * g).sum())
        one_draw_sd = float((sampler.double() * (w * g - one_draw_mean).square()).sum().sqrt())
        ess = effective_sample_size(w, counts)
        return {
            "mode": mode,
            "q": q.numpy(),
            "mu": mu.numpy(),
            "freq": (counts / n).numpy(),
            "weighted_freq": (counts * w / n).numpy(),
            "run": run,
            "estimate": float(run["mean"][-1]),
            "se": float(run["se"][-1]),
            "exact": exact,
            "biased_limit": biased_limit,
            "ess": ess,
            "num_samples": n,
            "max_weight": float(w.max()),
            "one_draw_mean": one_draw_mean,
            "one_draw_sd": one_draw_sd,
        }

    def draw(self, data: dict[str, Any]) -> None:
        mode = data["mode"]
        for bar, h in zip(self.bars_q, data["q"]):
            bar.set_height(h)
        for bar, h in zip(self.bars_mu, data["mu"]):
            bar.set_height(h)
        for bar in self.bars_mu:
            bar.set_alpha(0.15 if mode == "q" else 0.55)
        freq = data["weighted_freq"] if mode == "weighted" else data["freq"]
        # raw counts sit on the bars of the distribution that drew them; weighted counts come back to q
        offset = 0.2 if mode == "mu" else -0.2
        self.freq_line.set_data(np.arange(len(TOY_VOCAB)) + offset, freq)
        if mode != self._legend_mode:  # legends list only what is shown
            self.legend_pol.get_texts()[self._freq_entry].set_text(
                tr("counts·(π/μ) / N") if mode == "weighted" else tr("counts / N")
            )
            shown = mode == "mu"
            self.legend_run.get_texts()[self._biased_entry].set_visible(shown)
            self.legend_run.legend_handles[self._biased_entry].set_visible(shown)
            self.legend_run.get_texts()[self._run_entry].set_text(self._run_labels[mode])  # what is averaged
            self._legend_mode = mode
        top = max(float(data["q"].max()), float(data["mu"].max()), float(freq.max()), 0.3)
        sticky_limits(self.ax_pol, "y", 0, 1.12 * top)

        run = data["run"]
        lo, hi = run["mean"] - 2 * run["se"], run["mean"] + 2 * run["se"]
        n = run["n"].astype(float)
        self.run_line.set_data(n, run["mean"])
        self.band.set_verts([np.column_stack([np.r_[n, n[::-1]], np.r_[lo, hi[::-1]]])])
        self.exact_line.set_ydata([data["exact"]] * 2)
        self.biased_line.set_ydata([data["biased_limit"]] * 2)
        self.biased_line.set_visible(mode == "mu")
        self.ax_run.set_xlim(1, max(10.0, float(n[-1])))
        # the y range: where the running mean goes from N = 30 on (its mean ± 2.5 SE at N = 30, from
        # the exact spread of one draw), not the wild first few draws; the same for every seed and N
        reach = 2.5 * data["one_draw_sd"] / math.sqrt(30.0)
        ys = [
            data["exact"],
            data["biased_limit"] if mode == "mu" else data["exact"],
            data["one_draw_mean"] - reach,
            data["one_draw_mean"] + reach,
        ]
        ymin, ymax = min(ys), max(ys)
        pad = 0.15 * (ymax - ymin) if ymax > ymin else 0.05
        sticky_limits(self.ax_run, "y", ymin - pad, ymax + pad)

        est, se, exact = data["estimate"], data["se"], data["exact"]
        how = {
            "q": tr("plain mean of log π/p over tokens from π"),
            "mu": tr("plain mean of log π/p over tokens from μ (no weights)"),
            "weighted": tr("mean of (π/μ)·log π/p over tokens from μ"),
        }[mode]
        z = (est - exact) / se if se > 0 else float("inf") if est != exact else 0.0
        ess_share = data["ess"] / data["num_samples"]
        if mode == "weighted" and (ess_share < 0.05 or abs(z) >= 3):
            # the weighted mean is unbiased: a large z here says the SE (computed from the weights seen
            # so far) cannot be trusted, not that the estimator is biased
            verdict = tr(
                "<b style='color:{css}'>SE unreliable (ESS {ess_share:.1f} %)</b>: the weighted mean is "
                "unbiased, but with so few effective tokens its ±2 SE is computed from weights it has "
                "barely sampled",
                css=css("warn"),
                ess_share=100 * ess_share,
            )
        elif abs(z) < 3:
            verdict = tr("consistent with the exact value")
        else:
            verdict = tr("<b style='color:{css}'>off by more than 3 standard errors: biased</b>", css=css("bad"))
        ess_line = (
            tr(
                "effective sample size <b class='klviz-ess'>{ess:,.0f}</b> of {num_samples:,} "
                "({ess2:.1f}%), largest weight π/μ = {max_weight:.3g}",
                ess=data["ess"],
                num_samples=data["num_samples"],
                ess2=100 * data["ess"] / data["num_samples"],
                max_weight=data["max_weight"],
            )
            if mode == "weighted"
            else tr(
                "every token counts fully: effective sample size = N = {num_samples:,}", num_samples=data["num_samples"]
            )
        )
        self.readout.value = tr(
            "<style>.klviz-sampling .klviz-table td{{padding:1px 14px 1px 0}}</style><table "
            "class='klviz-table' style='font-size:90%;border-collapse:collapse'><tr><td><b>exact</b> "
            "KL(π‖p) = Σ<sub>x</sub> π(x) log π(x)/p(x)</td><td "
            "class='klviz-exact'>{exact:.4f}</td></tr><tr><td><b>estimate</b>: {how}</td><td "
            "class='klviz-estimate'>{plus_minus}</td></tr><tr><td>what a plain mean over μ's tokens "
            "converges to, E<sub>μ</sub>[log π/p]</td><td>{biased_limit:.4f}</td></tr></table><div "
            "style='font-size:90%'>N = {num_samples:,}: {verdict} (estimate − exact = {est:+.4f}, "
            "{z:+.1f} SE). {ess_line}.</div>",
            exact=exact,
            how=how,
            plus_minus=plus_minus(est, se, ".4f"),
            biased_limit=data["biased_limit"],
            num_samples=data["num_samples"],
            verdict=verdict,
            est=est - exact,
            z=z,
            ess_line=ess_line,
        )
