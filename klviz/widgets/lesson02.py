"""Lesson 02's panels: the three estimators on Gaussians, on tokens, and the control-variate family.

- :class:`GaussianEstimatorsPanel`: q = N(0, 1) fixed, p = N(mu, sigma²) moved by sliders; per-sample
  histograms of k1, k2, k3 overlaid on one shared x axis (log y, so their spreads compare) and a
  live table of bias/true and std/true, Monte Carlo (rounded to its standard error) beside exact.
- :class:`TokenEstimatorsPanel`: the same on twelve tokens, exact values by enumeration.
- :class:`ControlVariatePanel`: the spread of k1 + lambda (r - 1) as a function of lambda, the best
  lambda*, and how often each member of the family comes out negative.

Each samples with a seeded generator (the same seed draws the same x whatever p is, so moving a
slider shows the effect of p alone). The Gaussian panels (a) and (c) sample on the panel's device:
on a GPU they start at 10^6 samples instead of 10^5 and offer up to 10^7
(:func:`klviz.devices.panel_sample_count`), since only the precision of their Monte Carlo figures
depends on N. The token panel (b) counts draws over twelve tokens on the CPU: a GPU has nothing
to add there.
"""

from __future__ import annotations

import html
import math
from typing import Any

import ipywidgets as widgets
import numpy as np
import torch
from matplotlib.figure import Figure
from torch.distributions import Normal

from .. import kernel
from ..devices import make_generator, panel_sample_count, resolve_device
from ..divergences import categorical_kl, target_favours
from ..estimators import k1, k2, k3
from ..messages import N_, tr
from ..montecarlo import ESTIMATORS, categorical_counts
from ..palette import FIGURE_BACKGROUND, css, theme
from ..plotting import COLORS, panel_figure, sticky_limits
from ..policies import TOY_VOCAB, move_policy, toy_sampler_logits
from ..statistics import PairedMoments, StreamedMeanStd, control_variate_lambda, mean_std_with_se
from ..tables import (
    EstimatorMoments,
    categorical_moments,
    format_mc,
    gaussian_moments,
    k1_negative_probability,
    sample_log_ratio,
)
from .base import Panel, move_policy_controls

__all__ = ["GaussianEstimatorsPanel", "TokenEstimatorsPanel", "ControlVariatePanel"]

_SAMPLE_COUNTS = (1_000, 3_000, 10_000, 30_000, 100_000, 300_000, 1_000_000)
_BINS = 60
_STYLE = {"description_width": "initial"}
_FNS = {"k1": k1, "k2": k2, "k3": k3}
_KERNEL = {"k1": kernel.k1, "k2": kernel.k2, "k3": kernel.k3}  # the same, without input checks


def _rel(x: float, kl: float) -> float:
    return x / kl if kl > 0 else math.nan


_TD = "<td style='padding:1px 12px 1px 0'>"
_TABLE = "<table class='klviz-table' style='font-size:90%;border-collapse:collapse'>"
_TH = "<th style='padding:1px 12px 1px 0;text-align:left'>"


def _cell(x: float, se: float | None = None, signed: bool = False) -> str:
    """A table cell: '—' for undefined, 'inf' for infinite, else the number.

    An exact value (``se`` None) prints to 4 significant digits, and as 0 when it is zero up to
    rounding (|x| < 1e-12: k1's and k3's exact bias); a Monte Carlo value prints with ± 2 SE,
    rounded to the decimal place its standard error allows (:func:`klviz.tables.format_mc`).
    """
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return _TD + "—</td>"
    if math.isinf(x):
        return _TD + "<b>inf</b></td>"
    if se is not None and math.isfinite(se) and se > 0:
        return f"{_TD}{format_mc(x, se, signed=signed)}</td>"
    if abs(x) < 1e-12:
        return _TD + "0</td>"
    txt = f"{x:+.4g}" if signed else f"{x:.4g}"
    return f"{_TD}{txt}</td>"


def _all_edges(log_r: torch.Tensor) -> dict[str, np.ndarray]:
    """One set of bin edges for k1, k2 and k3, covering the central 99.8 % of log r for all three.

    k1 = -log r is monotone, and k2, k3 are convex in log r with their minimum 0 at log r = 0, so
    the extremes of each over the central range of log r sit at its two ends. The shared range runs
    from k1's lowest value (it always includes 0, to show the negative samples) to the highest of
    the three: the histograms then sit on one x axis and their spreads can be compared by eye.
    """
    sub = log_r[:20_000].cpu().numpy()
    lo_hi = np.quantile(sub, [0.001, 0.999])  # a partial sort: a third of torch.quantile's full sort here
    lo, hi = min(float(lo_hi[0]), 0.0), max(float(lo_hi[1]), 0.0)
    ends = torch.tensor([lo, hi], dtype=torch.float64)
    ranges = {"k1": (-hi, -lo)}
    for name in ("k2", "k3"):
        ranges[name] = (0.0, float(_FNS[name](ends).max()))
    a = min(r[0] for r in ranges.values())
    b = max(r[1] for r in ranges.values())
    if not b - a > 1e-9:
        b = a + 1e-3
    edges = np.linspace(a, b, _BINS + 1)
    return {name: edges for name in ranges}


_CUDA_SAMPLE_COUNTS = _SAMPLE_COUNTS + (3_000_000, 10_000_000)
_CHUNK = 1 << 17  # samples per chunk of the Gaussian panel (1 MB of float64; at least the 20,000 behind the bin edges)
_FLOOR = 1e-6  # the bottom of the histograms' log axis: below one sample in 10^5


def _gaussian_controls(seed: int, device: torch.device) -> dict[str, widgets.ValueWidget]:
    """p's mean and scale, the sample count and the seed: the controls of panels (a) and (c)."""
    counts = _CUDA_SAMPLE_COUNTS if device.type == "cuda" else _SAMPLE_COUNTS
    return {
        "mu": widgets.FloatSlider(
            value=1.0, min=-3.0, max=3.0, step=0.05, description=tr("p's mean μ"), style=_STYLE, continuous_update=True
        ),
        "sigma": widgets.FloatSlider(
            value=1.0, min=0.3, max=3.0, step=0.05, description=tr("p's scale σ"), style=_STYLE, continuous_update=True
        ),
        "num_samples": widgets.SelectionSlider(
            options=list(counts),
            value=panel_sample_count(device, cpu=100_000, cuda=1_000_000),
            description=tr("samples N"),
            style=_STYLE,
            continuous_update=False,
        ),
        "seed": widgets.BoundedIntText(
            value=seed, min=0, max=2**31 - 1, description=tr("seed"), layout=widgets.Layout(width="140px")
        ),
    }


def _kept_draws(panel: GaussianEstimatorsPanel | ControlVariatePanel, seed: int, n: int) -> torch.Tensor:
    """The z ~ N(0, 1) behind x ~ q for ``seed`` and ``n``, drawn once and kept on the panel.

    The draws ``sample_log_ratio`` would make from ``make_generator(seed, device)``: moving p's
    mean or scale reuses them (the same numbers, 1-3 ms less per update at N = 100,000).
    """
    kept = panel._kept_z
    if kept is None or kept[0] != (seed, n):
        z = torch.randn(n, generator=make_generator(seed, panel.device), device=panel.device, dtype=torch.float64)
        kept = panel._kept_z = ((seed, n), z)
    return kept[1]


class GaussianEstimatorsPanel(Panel):
    """q = N(0, 1) samples x; p = N(mu, sigma²) is moved; k1, k2, k3 of each sample estimate KL(q || p)."""

    title = N_("Lesson 02 (a): k1, k2, k3 on Gaussians: q = N(0, 1) samples, p = N(μ, σ²) is the target")
    css_class = "klviz-lesson02-gaussian"
    _kept_z: tuple[tuple[int, int], torch.Tensor] | None = None  # see _kept_draws

    def __init__(self, seed: int = 0, device: str | torch.device | None = None) -> None:
        self.seed = seed
        super().__init__(resolve_device(device))  # the GPU when there is one (see the module docstring)

    def make_controls(self) -> dict[str, widgets.ValueWidget]:
        return _gaussian_controls(self.seed, self.device)

    def make_figure(self) -> Figure:
        fig, axes = panel_figure(9.6, 3.4, ncols=2, gridspec_kw={"width_ratios": [1, 2]})
        ax_d = axes[0]
        self.xs = np.linspace(-7.0, 7.0, 400)
        q = np.exp(-0.5 * self.xs**2) / math.sqrt(2 * math.pi)
        ax_d.plot(self.xs, q, color=COLORS["q"], lw=2, label=tr("sampler q = N(0,1)"))
        (self.p_line,) = ax_d.plot(self.xs, q, color=COLORS["p"], lw=2, label=tr("target p = N(μ,σ²)"))
        ax_d.set_xlim(-7, 7)
        ax_d.set_xlabel("x")
        ax_d.set_ylabel(tr("density"))
        ax_d.set_title(tr("the two policies"))
        ax_d.legend(loc="upper left")
        self.ax_d = ax_d
        ax = axes[1]
        self.hist, self.outline, self.mean_lines = {}, {}, {}
        edges = np.linspace(0, 1, _BINS + 1)
        labels = {"k1": "k1 = −log r", "k2": "k2 = ½(log r)² ≥ 0", "k3": "k3 = (r − 1) − log r ≥ 0"}
        for name in ESTIMATORS:
            # a light fill and a solid outline per estimator: the three overlap, and each stays visible
            self.hist[name] = ax.stairs(
                np.full(_BINS, _FLOOR), edges, fill=True, color=COLORS[name], alpha=0.18, baseline=_FLOOR
            )
            self.outline[name] = ax.stairs(
                np.full(_BINS, _FLOOR), edges, color=COLORS[name], lw=1.6, baseline=_FLOOR, label=labels[name]
            )
        for name in ESTIMATORS:
            self.mean_lines[name] = ax.axvline(0.0, color=COLORS[name], lw=1.4, ls=":")
        self.kl_line = ax.axvline(0.0, color=COLORS["exact"], ls="--", lw=1.5, label=tr("true KL(q‖p)"))
        ax.axvline(0.0, color=COLORS["ink"], lw=0.6)
        ax.set_yscale("log")
        ax.set_ylim(_FLOOR, 10.0)  # a decade above the highest bar: room for the legend
        ax.set_xlabel(tr("value of one sample  [nats]  (central 99.8 % of the samples, one x axis for all three)"))
        ax.set_ylabel(tr("fraction of samples per bin"))
        ax.legend(loc="upper right", title=tr("dotted: sample means"), frameon=True, framealpha=0.9, edgecolor="none")
        # a fixed title (the share of negative k1 is in the readout): a title that changed with every
        # setting would be redrawn on every frame, about a quarter of the redraw time (measured)
        ax.set_title(tr("one sample of each estimator (k1 < 0 wherever p > q)"))
        self.ax_h = ax
        return fig

    def compute(self, mu: float, sigma: float, num_samples: int, seed: int) -> dict[str, Any]:
        n = int(num_samples)
        exact = gaussian_moments(0.0, 1.0, float(mu), float(sigma))
        q = Normal(torch.tensor(0.0, dtype=torch.float64), torch.tensor(1.0, dtype=torch.float64))
        p = Normal(torch.tensor(float(mu), dtype=torch.float64), torch.tensor(float(sigma), dtype=torch.float64))
        # the same seed gives the same x ~ q whatever p is: only the effect of moving p shows
        z = _kept_draws(self, int(seed), n)
        moments = {name: StreamedMeanStd() for name in ESTIMATORS}
        counts = {name: np.zeros(_BINS) for name in ESTIMATORS}
        positive = 0
        all_edges: dict[str, np.ndarray] = {}
        for z_chunk in z.split(_CHUNK):  # log r and each estimator a chunk at a time: 1 MB each, whatever N
            chunk = sample_log_ratio(q, p, z_chunk.numel(), z=z_chunk)
            if not all_edges:
                all_edges = _all_edges(chunk)  # from the first 20,000 samples (the chunk holds more)
            for name in ESTIMATORS:
                v = _KERNEL[name](chunk)  # log_r is the panel's own finite sample: no checks
                moments[name].add(v)
                edges = all_edges[name]
                counts[name] += torch.histc(v, bins=_BINS, min=float(edges[0]), max=float(edges[-1])).cpu().numpy()
            positive += int((chunk > 0).sum())
        mc = {name: moments[name].result() for name in ESTIMATORS}
        hists = {name: (counts[name] / n, all_edges[name]) for name in ESTIMATORS}  # fraction of samples per bin
        density_p = np.exp(-0.5 * ((self.xs - mu) / sigma) ** 2) / (sigma * math.sqrt(2 * math.pi))
        return {
            "mu": float(mu),
            "sigma": float(sigma),
            "n": n,
            "exact": exact,
            "mc": mc,
            "hists": hists,
            "density_p": density_p,
            "frac_neg_mc": positive / n,
            "frac_neg_exact": k1_negative_probability(0.0, 1.0, float(mu), float(sigma)),
        }

    def draw(self, data: dict[str, Any]) -> None:
        self.p_line.set_ydata(data["density_p"])
        sticky_limits(self.ax_d, "y", 0, 1.08 * max(0.4, float(data["density_p"].max())))
        exact: EstimatorMoments = data["exact"]
        for name in ESTIMATORS:
            frac, edges = data["hists"][name]
            shown = np.maximum(frac, _FLOOR)  # empty bins sit on the floor of the log axis
            self.hist[name].set_data(shown, edges)
            self.outline[name].set_data(shown, edges)
            m = data["mc"][name]["mean"]
            self.mean_lines[name].set_xdata([m, m])
        edges = data["hists"]["k1"][1]
        sticky_limits(self.ax_h, "x", edges[0], edges[-1])
        self.kl_line.set_xdata([exact.true_kl, exact.true_kl])
        self.readout.value = self._table(data)

    @staticmethod
    def _table(data: dict[str, Any]) -> str:
        exact: EstimatorMoments = data["exact"]
        kl = exact.true_kl
        rows = []
        for name in ESTIMATORS:
            m = data["mc"][name]
            rows.append(
                f"<tr><td style='color:{css(name)};padding-right:12px'><b>{name}</b></td>"
                + _cell(_rel(m["mean"] - kl, kl), _rel(m["se"], kl), signed=True)
                + _cell(exact.bias_rel(name) if kl > 0 else math.nan, signed=True)
                + _cell(_rel(m["std"], kl), _rel(m["se_std"], kl))
                + _cell(exact.std_rel(name) if kl > 0 else math.nan)
                + "</tr>"
            )
        notes = []
        if kl == 0:
            notes.append(tr("p = q: the KL is 0 and every estimator is exactly 0; relative numbers are undefined (—)."))
        if "k3" in exact.notes:
            notes.append(
                html.escape(exact.notes["k3"])
                + tr(
                    " The Monte Carlo std shown for k3 is therefore "
                    "not an estimate of anything: rerun with a larger N and watch it grow."
                )
            )
        return (
            _TABLE
            + tr(
                "<tr>{th}</th>{th}bias/true: Monte Carlo ± 2 SE</th>{th}exact</th>{th}std/true: Monte "
                "Carlo ± 2 SE</th>{th}exact</th></tr>",
                th=_TH,
            )
            + "".join(rows)
            + tr(
                "</table><div style='font-size:90%'>true KL(q‖p) = <b class='klviz-exact'>{kl:.5g}</b> "
                "nats · N = {n:,} · k1 &lt; 0 for {frac_neg_mc:.1f} % of the samples (exact "
                "{frac_neg_exact:.1f} %): wherever p(x) &gt; q(x).</div>",
                kl=kl,
                n=data["n"],
                frac_neg_mc=100 * data["frac_neg_mc"],
                frac_neg_exact=100 * data["frac_neg_exact"],
            )
            + "".join(f"<div style='font-size:90%;color:{css('warn')}'>{n}</div>" for n in notes)
        )


class TokenEstimatorsPanel(Panel):
    """Twelve tokens: q fixed, p moved; each token's k1, k2, k3, and exact moments by enumeration."""

    title = N_("Lesson 02 (b): k1, k2, k3 on a token distribution (exact values by summing over the vocabulary)")
    css_class = "klviz-lesson02-tokens"

    def __init__(self, seed: int = 0) -> None:
        self.q_logp = torch.log_softmax(toy_sampler_logits().double(), -1)  # renormalised in float64
        self.seed = seed
        super().__init__("cpu")  # twelve tokens: see the module docstring

    def make_controls(self) -> dict[str, widgets.ValueWidget]:
        return {
            **move_policy_controls(push=1.5, push_range=6.0, token=9),
            "num_samples": widgets.SelectionSlider(
                options=list(_SAMPLE_COUNTS),
                value=10_000,
                description=tr("tokens N"),
                style=_STYLE,
                continuous_update=False,
            ),
            "seed": widgets.BoundedIntText(
                value=self.seed, min=0, max=2**31 - 1, description=tr("seed"), layout=widgets.Layout(width="140px")
            ),
        }

    def make_figure(self) -> Figure:
        fig, (ax_pol, ax_est) = panel_figure(9.6, 3.4, ncols=2)
        x = np.arange(len(TOY_VOCAB))
        q = self.q_logp.exp().numpy()
        labels = [t.strip() for t in TOY_VOCAB]
        ax_pol.bar(x - 0.2, q, width=0.4, color=COLORS["q"], label=tr("sampler q"))
        self.bars_p = ax_pol.bar(x + 0.2, q, width=0.4, color=COLORS["p"], label=tr("target p"))
        ax_pol.set_xticks(x, labels, rotation=45, ha="right")
        ax_pol.set_ylabel(tr("probability"))
        ax_pol.set_title(tr('next token after "The cat sat on the"'))
        ax_pol.legend(loc="upper right")
        self.ax_pol = ax_pol
        self.est_bars = {}
        for j, name in enumerate(ESTIMATORS):
            self.est_bars[name] = ax_est.bar(
                x + (j - 1) * 0.27, np.zeros(len(x)), width=0.27, color=COLORS[name], label=name
            )
        self.kl_line = ax_est.axhline(0.0, color=COLORS["exact"], ls="--", lw=1.3, label=tr("exact KL(q‖p)"))
        ax_est.axhline(0.0, color=COLORS["ink"], lw=0.6)
        ax_est.set_xticks(x, labels, rotation=45, ha="right")
        ax_est.set_ylabel(tr("value if this token is drawn  [nats]"))
        ax_est.set_title(tr("each token's k1, k2, k3 (log r = log p − log q)"))
        ax_est.legend(loc="upper left", ncols=2)
        self.ax_est = ax_est
        return fig

    def compute(self, temperature: float, push: float, push_token: int, num_samples: int, seed: int) -> dict[str, Any]:
        n = int(num_samples)
        log_p = move_policy(self.q_logp, temperature=float(temperature), push=float(push), push_token=int(push_token))
        q, p = self.q_logp.exp(), log_p.exp()
        favoured = target_favours(q, p)  # p > q beyond float64 rounding
        if not bool((favoured | target_favours(p, q)).any()):  # p = q up to rounding: log r is 0 on every token
            log_p, p = self.q_logp, q
        exact = categorical_moments(q, p)
        log_r = log_p - self.q_logp
        per_token = {name: fn(log_r).numpy() for name, fn in _FNS.items()}
        counts = categorical_counts(q, n, generator=make_generator(int(seed), "cpu"))
        mc = {name: mean_std_with_se(torch.from_numpy(vals), counts) for name, vals in per_token.items()}
        return {
            "p": p.numpy(),
            "exact": exact,
            "mc": mc,
            "per_token": per_token,
            "n": n,
            "exact_kl_check": float(categorical_kl(q, p)),
            "frac_neg_mc": float(counts[favoured].sum()) / n,
            "frac_neg_exact": float(q[favoured].sum()),
            "max_abs_log_r": float(log_r.abs().max()),
        }

    def draw(self, data: dict[str, Any]) -> None:
        for bar, h in zip(self.bars_p, data["p"]):
            bar.set_height(h)
        sticky_limits(self.ax_pol, "y", 0, 1.08 * max(0.35, float(data["p"].max())))
        lo, hi = 0.0, data["exact"].true_kl
        for name in ESTIMATORS:
            vals = data["per_token"][name]
            for bar, h in zip(self.est_bars[name], vals):
                bar.set_height(h)
            lo, hi = min(lo, float(vals.min())), max(hi, float(vals.max()))
        pad = 0.08 * (hi - lo) if hi > lo else 0.01
        sticky_limits(self.ax_est, "y", lo - pad, hi + 3 * pad)
        self.kl_line.set_ydata([data["exact"].true_kl] * 2)
        self.readout.value = GaussianEstimatorsPanel._table(
            {
                "exact": data["exact"],
                "mc": data["mc"],
                "n": data["n"],
                "frac_neg_mc": data["frac_neg_mc"],
                "frac_neg_exact": data["frac_neg_exact"],
            }
        ).replace("of the samples", "of the tokens drawn") + self._spread_note(data)

    @staticmethod
    def _spread_note(data: dict[str, Any]) -> str:
        """Which of k1 and k3 spreads less, and whether |log r| on every token makes that a rule or a case."""
        exact: EstimatorMoments = data["exact"]
        if exact.true_kl == 0:
            return ""
        s1, s3 = exact.std("k1"), exact.std("k3")
        quieter = "k3" if s3 < s1 else "k1"
        top = data["max_abs_log_r"]
        why = (
            tr("below 1 on every token q can draw, so k3 is the quieter one (lesson 02, section 3)")
            if top <= 1
            else tr("above 1 on some token q can draw: closeness fails there, and either can be the quieter one")
        )
        return tr(
            "<div style='font-size:90%'>Spread of one draw: k1 {s1:.4g}, k3 {s3:.4g}: "
            "<b>{quieter}</b> is the quieter here. Largest |log r| = {top:.2f}, {why}.</div>",
            s1=s1,
            s3=s3,
            quieter=quieter,
            top=top,
            why=why,
        )


_LAMBDAS = np.linspace(-0.5, 1.5, 201)
_LAMBDAS_NEG = np.linspace(-0.5, 1.5, 41)
_N_FRAC = 20_000
_MOMENT_CHUNK = 1 << 16  # samples per chunk of the control variate's moments (at least _N_FRAC)


class ControlVariatePanel(Panel):
    """The family k1 + lambda (r - 1): every member is unbiased; its spread is a parabola in lambda."""

    title = N_("Lesson 02 (c): the control-variate family k1 + λ (r − 1), q = N(0, 1), p = N(μ, σ²)")
    css_class = "klviz-lesson02-lambda"
    _kept_z: tuple[tuple[int, int], torch.Tensor] | None = None  # see _kept_draws

    def __init__(self, seed: int = 0, device: str | torch.device | None = None) -> None:
        self.seed = seed
        super().__init__(resolve_device(device))  # the GPU when there is one (see the module docstring)

    def make_controls(self) -> dict[str, widgets.ValueWidget]:
        return _gaussian_controls(self.seed, self.device)

    def make_figure(self) -> Figure:
        fig, (ax_v, ax_n) = panel_figure(9.6, 3.7, ncols=2)
        (self.exact_curve,) = ax_v.plot(
            _LAMBDAS, np.ones_like(_LAMBDAS), color=COLORS["exact"], lw=2, label=tr("exact")
        )
        (self.mc_curve,) = ax_v.plot(
            _LAMBDAS,
            np.ones_like(_LAMBDAS),
            color=COLORS["mu"],
            lw=1.2,
            ls="--",
            label=tr("Monte Carlo (same samples)"),
        )
        (self.mark_k1,) = ax_v.plot([0], [1], "o", color=COLORS["k1"], ms=8, label="λ = 0: k1")
        (self.mark_k3,) = ax_v.plot([1], [1], "s", color=COLORS["k3"], ms=8, label="λ = 1: k3")
        (self.mark_star,) = ax_v.plot([1], [1], "*", color=COLORS["ink"], ms=13, label=tr("λ* exact"))
        self.mark_star_mc = ax_v.axvline(1.0, color=COLORS["mu"], lw=1, ls=":", label=tr("λ* measured"))
        self.note = ax_v.text(
            0.5,
            0.6,
            "",
            transform=ax_v.transAxes,
            ha="center",
            va="center",
            fontsize=8.5,
            bbox={"facecolor": FIGURE_BACKGROUND[theme()], "edgecolor": "none", "alpha": 0.85},
            color=COLORS["warn"],
        )
        ax_v.set_xlabel("λ")
        ax_v.set_ylabel(tr("std / true KL of one sample"))
        ax_v.set_title(tr("spread of k1 + λ (r − 1)"))
        ax_v.set_xlim(_LAMBDAS[0], _LAMBDAS[-1])
        fig.legend(handles=ax_v.get_legend_handles_labels()[0], loc="outside lower left", ncols=6)
        self.ax_v = ax_v
        (self.neg_line,) = ax_n.plot(
            _LAMBDAS_NEG, np.zeros_like(_LAMBDAS_NEG), "o-", ms=3, color=COLORS["mu"], label=tr("Monte Carlo")
        )
        (self.neg_exact,) = ax_n.plot(
            [0, 1], [0.5, 0.0], "D", color=COLORS["exact"], ms=6, label=tr("exact (λ = 0 and λ = 1)")
        )
        ax_n.axvline(1.0, color=COLORS["k3"], lw=0.8)
        ax_n.set_xlabel("λ")
        ax_n.set_ylabel(tr("fraction of samples < 0"))
        ax_n.set_title(tr("how often k1 + λ (r − 1) is negative"))
        ax_n.set_xlim(_LAMBDAS[0], _LAMBDAS[-1])
        ax_n.set_ylim(-0.02, 1.0)
        ax_n.legend(loc="upper right")
        return fig

    def compute(self, mu: float, sigma: float, num_samples: int, seed: int) -> dict[str, Any]:
        n = int(num_samples)
        exact = gaussian_moments(0.0, 1.0, float(mu), float(sigma))
        q = Normal(torch.tensor(0.0, dtype=torch.float64), torch.tensor(1.0, dtype=torch.float64))
        p = Normal(torch.tensor(float(mu), dtype=torch.float64), torch.tensor(float(sigma), dtype=torch.float64))
        z = _kept_draws(self, int(seed), n)
        # k1 and r - 1 of the samples, a chunk at a time: at N = 10^6 the whole arrays and their centred
        # copies held 48 MB more than the chunks do
        moments = PairedMoments()
        for start in range(0, n, _MOMENT_CHUNK):
            log_r = sample_log_ratio(q, p, min(_MOMENT_CHUNK, n - start), z=z[start : start + _MOMENT_CHUNK])
            a, c = k1(log_r), torch.expm1(log_r)
            moments.add(a, c)
            if start == 0:  # how often each member is negative: from the first 20,000 samples (SE ≤ 0.0036)
                sub_a, sub_c = a[:_N_FRAC], c[:_N_FRAC]  # float64: at lambda = 1 the sum must not round below 0
        mom = moments.result()
        var_a, var_c, cov = mom["var_a"], mom["var_c"], mom["cov"]
        mc_var = np.maximum(var_a + 2 * _LAMBDAS * cov + _LAMBDAS**2 * var_c, 0.0)
        lam_mc = control_variate_lambda(cov, var_c)
        lam_t = torch.from_numpy(_LAMBDAS_NEG).to(z.device)[:, None]
        frac_neg = (torch.addcmul(sub_a, lam_t, sub_c) < 0).sum(1).cpu().numpy() / sub_a.numel()
        return {
            "exact": exact,
            "exact_var": exact.cv_variance(_LAMBDAS),
            "mc_var": mc_var,
            "lambda_mc": lam_mc,
            "frac_neg": frac_neg,
            "frac_neg_k1": k1_negative_probability(0.0, 1.0, float(mu), float(sigma)),
            "n": n,
            "n_frac": int(sub_a.numel()),
        }

    def draw(self, data: dict[str, Any]) -> None:
        exact: EstimatorMoments = data["exact"]
        kl = exact.true_kl
        scale = 1.0 / kl if kl > 0 else 1.0
        ex_std = np.sqrt(data["exact_var"]) * scale
        mc_std = np.sqrt(data["mc_var"]) * scale
        finite = np.isfinite(ex_std)
        self.exact_curve.set_ydata(np.where(finite, ex_std, np.nan))
        self.mc_curve.set_ydata(mc_std)
        lam = exact.lambda_star
        self.mark_k1.set_ydata([math.sqrt(exact.var["k1"]) * scale])
        self.mark_k3.set_ydata([math.sqrt(exact.var["k3"]) * scale if math.isfinite(exact.var["k3"]) else np.nan])
        self.mark_star.set_data([lam], [math.sqrt(exact.cv_variance(lam)) * scale])
        self.mark_star_mc.set_xdata([data["lambda_mc"]] * 2)
        shown = np.concatenate([ex_std[finite], mc_std])
        top = float(np.percentile(shown, 90)) if shown.size else 1.0
        sticky_limits(self.ax_v, "y", 0, max(top, 1e-9) * 1.15)
        self.ax_v.set_ylabel(tr("std / true KL of one sample") if kl > 0 else tr("std of one sample (KL = 0)"))
        infinite = not math.isfinite(exact.var_r)
        self.note.set_text(
            tr("exact variance is infinite for every λ ≠ 0:\nVar(r) diverges (see the note below)") if infinite else ""
        )
        self.neg_line.set_ydata(data["frac_neg"])
        self.neg_exact.set_ydata([data["frac_neg_k1"], 0.0])
        std_at = {lbl: math.sqrt(exact.cv_variance(v)) * scale for lbl, v in (("0", 0.0), ("star", lam), ("1", 1.0))}
        rel = tr("std/true") if kl > 0 else "std"
        note = (
            f"<div style='font-size:90%;color:{css('warn')}'>" + html.escape(exact.notes["k3"]) + "</div>"
            if infinite
            else ""
        )
        self.readout.value = (
            _TABLE
            + tr(
                "<tr>{th}</th>{th}λ</th>{th}{rel} "
                "(exact)</th></tr><tr>{td}k1</td>{td}0</td>{cell}</tr><tr>{td}<b>best</b></td><td "
                "class='klviz-lambda-star' style='padding-right:12px'>{lam:.4f} (exact) · "
                "{lambda_mc:.4f} "
                "(measured)</td>{cell2}</tr><tr>{td}k3</td>{td}1</td>{cell3}</tr></table><div "
                "style='font-size:90%'>λ* = (KL(q‖p) + KL(p‖q)) / χ²(p‖q) = −Cov(k1, r) / Var(r). Only λ "
                "= 1 is never negative: −log r + λ (r − 1) &lt; 0 at r = 1/λ for every other λ &gt; 0. N "
                "= {n:,} (fraction negative from the first {n_frac:,}).</div>",
                th=_TH,
                rel=rel,
                td=_TD,
                cell=_cell(std_at["0"]),
                lam=lam,
                lambda_mc=data["lambda_mc"],
                cell2=_cell(std_at["star"]),
                cell3=_cell(std_at["1"]),
                n=data["n"],
                n_frac=data["n_frac"],
            )
            + note
        )
