"""Lesson 08's panels: an engine of the tiny LM samples, the trainer rescores, a correction reweights;
and the same in training.

:class:`EngineMismatchPanel` samples one batch of responses with each engine setting (precision,
top-p) once, when the panel is built, and then
shows, for the chosen setting,

- left: the per-token log-ratio ``log r = log π_old − log π_rollout`` of the sampled tokens (tokens
  from the engine), with the mean log kept mass ``log S`` marked;
- right: each response's sequence log-weight ``log W = Σ_t log r_t`` against its length, with the
  band a correction uses (the truncation cap, or the geometric-mean band scaled by the length);
- the readout: the mismatch metrics of :func:`klviz.mismatch.mismatch_metrics` and what the chosen
  correction does to the batch (tokens and responses it changes, effective sample size).

:class:`MismatchTrainingPanel` shows lesson 07's lab trained through each engine with each
correction: the stored runs of every seed as mean ± 2 SE per step, and a further seed trained live.
"""

from __future__ import annotations

import html
import math
from dataclasses import replace
from typing import Any

import ipywidgets as widgets
import numpy as np
import torch
from matplotlib.figure import Figure

from .. import lm, rlhf
from .. import mismatch as mm
from ..devices import make_generator
from ..messages import N_, tr
from ..plotting import COLORS, panel_figure, sticky_limits
from ..statistics import PM_SE, RESOLVED_AT_SE, mean_se
from ..statistics import verdict as seed_verdict
from .base import BackgroundRun, Panel, html_table

__all__ = [
    "EngineMismatchPanel",
    "MismatchTrainingPanel",
    "PRECISION_CHOICES",
    "TOP_P_CHOICES",
    "TRAINER_CHOICES",
    "TRAINING_ENGINES",
    "LIVE_SEEDS",
]

PRECISION_CHOICES: tuple[str, ...] = ("float32", "bfloat16")
TOP_P_CHOICES: tuple[float, ...] = (1.0, 0.9, 0.8, 0.7)
TRAINER_CHOICES: dict[str, str] = {N_("recompute as is"): "plain", N_("replay the sampling mask"): "fixed"}
_STYLE = {"description_width": "initial"}
_BINS = np.linspace(-0.6, 0.6, 61)


class EngineMismatchPanel(Panel):
    """Sampler vs trainer on the tiny LM: choose the engine, the trainer's recompute and a correction."""

    title = N_("Sampler vs trainer: the engine samples, the trainer rescores, a correction reweights")
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
                options=list(PRECISION_CHOICES), value="bfloat16", description=tr("engine runs in"), style=_STYLE
            ),
            "top_p": widgets.SelectionSlider(
                options=list(TOP_P_CHOICES),
                value=0.9,
                description=tr("engine top_p"),
                style=_STYLE,
                continuous_update=True,
            ),
            "trainer": widgets.Dropdown(
                options=[(tr(label), label) for label in TRAINER_CHOICES],
                value="recompute as is",
                description=tr("trainer"),
                style=_STYLE,
                layout=widgets.Layout(width="300px"),
            ),
            "correction": widgets.Dropdown(
                options=list(mm.CORRECTIONS),
                value="token_tis",
                description=tr("correction"),
                style=_STYLE,
                layout=widgets.Layout(width="230px"),
            ),
            "cap": widgets.SelectionSlider(
                options=[1.2, 1.5, 2.0, 3.0, 5.0],
                value=2.0,
                description=tr("cap C / band"),
                style=_STYLE,
                continuous_update=True,
            ),
        }

    def make_figure(self) -> Figure:
        fig, (ax_tok, ax_seq) = panel_figure(9.0, 3.5, ncols=2)
        self.hist = ax_tok.stairs(
            np.ones(len(_BINS) - 1), _BINS, color=COLORS["k1"], fill=True, alpha=0.6, label=tr("sampled tokens")
        )
        self.log_s = ax_tok.axvline(0.0, color=COLORS["mu"], ls="--", lw=1.4, label=tr("mean log S (kept mass)"))
        ax_tok.axvline(0.0, color=COLORS["ink"], lw=0.6)
        ax_tok.set_yscale("log")
        ax_tok.set_ylim(0.8, 1e4)
        ax_tok.set_xlim(_BINS[0], _BINS[-1])
        ax_tok.set_xlabel("log r = log π_old − log π_rollout  [nats]")
        ax_tok.set_ylabel(tr("tokens (log scale)"))
        ax_tok.legend(loc="upper left")
        self.ax_tok = ax_tok
        self.kept = ax_seq.scatter(
            np.zeros(1), np.zeros(1), s=12, color=COLORS["k3"], label=tr("kept by the correction")
        )
        self.dropped = ax_seq.scatter(
            np.zeros(1), np.zeros(1), s=14, color=COLORS["mu"], marker="x", label=tr("dropped or capped")
        )
        (self.band_hi,) = ax_seq.plot(
            [0, 60], [0, 0], color=COLORS["ink"], ls=":", lw=1.2, label=tr("correction's bound")
        )
        (self.band_lo,) = ax_seq.plot([0, 60], [0, 0], color=COLORS["ink"], ls=":", lw=1.2)
        ax_seq.axhline(0.0, color=COLORS["ink"], lw=0.6)
        ax_seq.set_xlim(0, self.max_new_tokens + 2)
        ax_seq.set_xlabel(tr("response length T [tokens]"))
        ax_seq.set_ylabel(tr("sequence log-weight log W = Σ log r"))
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
        self.ax_tok.set_title(
            tr("{tokens:,} tokens: engine {spec}", tokens=data["metrics"]["tokens"], spec=data["spec"])
        )
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
        self.ax_seq.set_title(tr("{n_lw} responses: {corr} (C = {cap:g})", n_lw=len(lw), corr=corr, cap=data["cap"]))
        m = data["metrics"]
        rows = [
            [
                tr("mean ratio E[π_old/π_rollout]"),
                f"<span class='klviz-mean-ratio'>{m['mean_ratio']:.4f}</span> ± {2 * m['mean_ratio_se']:.4f}",
            ],
            [tr("mean kept mass S"), f"<span class='klviz-kept-mass'>{data['kept_mass']:.4f}</span>"],
            [
                tr("k1 / k3 per token (KL(π_rollout‖π_old))"),
                f"{m['k1']:.2e} / <span class='klviz-k3'>{m['k3']:.2e}</span>",
            ],
            [tr("χ² token / sequence"), f"{m['chi2_token']:+.2e} / {m['chi2_seq']:+.2e}"],
            [tr("token_mult_prob_error · ppl ratio"), f"{m['token_mult_prob_error']:.4f} · {m['ppl_ratio']:.4f}"],
            ["max |log r|", f"{m['abs_diff_max']:.3f}"],
            [
                tr("{corr}: tokens / responses changed", corr=corr),
                f"{100 * data['token_changed_fraction']:.1f}% / {100 * data['seq_changed_fraction']:.1f}%",
            ],
            [tr("effective sample size of the weights"), f"{data['ess']:.3f}"],
        ]
        self.readout.value = html_table(["", tr("value")], rows) + (
            tr(
                "<div style='font-size:90%'>Tokens sampled by the engine (π_rollout), rescored by the float32 trainer "
                "(π_old, same weights). Without a mismatch: ratio 1, S 1, k3 0, error 1.</div>"
            )
        )


# ---------------------------------------------------------------------------------------------
# training through a mismatched engine (section 6)
# ---------------------------------------------------------------------------------------------
#: The engines the training panel offers (every one of :data:`klviz.rlhf.ENGINES` but the trainer itself,
#: which is drawn as the reference in every setting).
TRAINING_ENGINES: tuple[str, ...] = tuple(e for e in rlhf.ENGINES if e != "trainer")
#: The live-run choices of the training panel: none, or a seed beyond the stored ones, trained here.
LIVE_SEEDS: dict[str, int | None] = {
    N_("stored seeds only"): None,
    **{f"+ seed {s}, trained here": s for s in range(len(rlhf.MISMATCH_SEEDS), len(rlhf.MISMATCH_SEEDS) + 3)},
}
_REFERENCE = "trainer · none"


#: What :func:`klviz.statistics.verdict` says, as the catalogue has it (shown as ``tr(said)``).
_VERDICTS = (N_("identical"), N_("same up to rounding"), N_("resolved"), N_("within noise"))


def _live_label(key: str) -> str:
    """A choice of :data:`LIVE_SEEDS` in the reader's language."""
    seed = LIVE_SEEDS[key]
    return tr(key) if seed is None else tr("+ seed {seed}, trained here", seed=seed)


_SERIES: tuple[tuple[str, str], ...] = (
    ("reward", N_("reward, engine's batch (logged)")),
    ("trainer_reward", N_("reward, trainer's own samples")),
    ("true_kl", N_("true KL(π_θ‖π_ref), along the engine's batch")),
    ("trainer_true_kl", N_("true KL(π_θ‖π_ref), trainer's own")),
    ("score", N_("score R − β·KL, trainer's own")),
    ("served score", N_("score R − β·KL, the policy the engine serves")),
    ("mismatch_kl", N_("mismatch k3 per token")),
    ("rejected_tokens", N_("tokens given weight 0")),
)
_MISMATCH_FLOOR = 1e-7  # the mismatch axis is logarithmic; "keep_mask" removes the mismatch (exactly 0)


def _band(ax: Any, color: str, alpha: float = 0.25) -> Any:
    """An empty filled band on ``ax`` (a PolyCollection whose outline :func:`_set_band` replaces)."""
    return ax.fill_between([0.0, 1.0], [0.0, 0.0], [0.0, 0.0], color=color, alpha=alpha, lw=0)


def _set_band(band: Any, x: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> None:
    band.set_verts([np.column_stack([np.r_[x, x[::-1]], np.r_[lo, hi[::-1]]])])


def _per_step_mean_se(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean over seeds and its standard error at every step, from ``[seeds, steps]``."""
    return values.mean(0), values.std(0, ddof=1) / math.sqrt(values.shape[0])


class MismatchTrainingPanel(Panel):
    """Lesson 07's lab trained through a rollout engine that is not the trainer, with a correction.

    Shows, for the chosen engine and correction, every stored seed's run (:data:`klviz.rlhf.MISMATCH_SEED_CONFIGS`,
    :data:`klviz.rlhf.MISMATCH_SEEDS_PATH`) as mean ± 2 SE per step, beside the runs in which the trainer
    samples itself (grey): the reward the run logs (the engine's batch) and the reward of the trainer's own
    samples, the true KL(π_θ ‖ π_ref), and the mismatch (k3 of log π_old − log π_rollout per token, an
    estimate of KL(π_rollout ‖ π_old)). The readout states each final value as mean ± 2 SE over the seeds and
    the paired difference against the same engine without a correction. A seed beyond the stored ones can
    be trained here, live: its curves grow over the bands while it trains in the background.
    """

    title = N_("Training through a mismatched engine: what the run logs, what the trainer learns")
    css_class = "klviz-lesson08-training"
    #: the static site steps through every engine and correction (the stored runs; no live seed there)
    static_controls = {"engine": 3, "correction": len(rlhf.LAB_CORRECTIONS)}
    #: a live seed is a training run of seconds: nothing is drawn ahead
    draw_ahead = False

    def __init__(self, device: str | torch.device | None = "cpu") -> None:
        self.store = rlhf.load_lab_seeds(rlhf.MISMATCH_SEEDS_PATH)
        missing = set(rlhf.MISMATCH_SEED_CONFIGS) - set(self.store.configs)
        if missing:
            raise ValueError(f"{rlhf.MISMATCH_SEEDS_PATH.name} lacks {sorted(missing)}: run scripts/lab_seeds.py")
        self.steps = int(self.store.metrics[_REFERENCE]["reward"].shape[1])
        super().__init__(device)

    # -- controls and figure --------------------------------------------------------------------
    def make_controls(self) -> dict[str, widgets.ValueWidget]:
        return {
            "engine": widgets.ToggleButtons(
                options=list(TRAINING_ENGINES), value="T=0.7", description=tr("engine samples"), style=_STYLE
            ),
            "correction": widgets.Dropdown(
                options=list(rlhf.LAB_CORRECTIONS),
                value="none",
                description=tr("correction"),
                style=_STYLE,
                layout=widgets.Layout(width="230px"),
            ),
            "live": widgets.Dropdown(
                options=[(_live_label(label), label) for label in LIVE_SEEDS],
                value="stored seeds only",
                description=tr("live run"),
                style=_STYLE,
                layout=widgets.Layout(width="300px"),
            ),
        }

    def make_figure(self) -> Figure:
        fig, axes = panel_figure(9.6, 3.4, ncols=3)
        ax_r, ax_kl, ax_m = axes
        color, grey = COLORS["k3"], COLORS["q"]  # grey: the trainer sampling itself, for reference
        self.ref_r, self.ref_kl = _band(ax_r, grey), _band(ax_kl, grey)
        self.band_r, self.band_own = _band(ax_r, COLORS["k1"]), _band(ax_r, color)
        self.band_kl, self.band_own_kl = _band(ax_kl, COLORS["k1"]), _band(ax_kl, color)
        self.band_m = _band(ax_m, COLORS["mu"])
        (self.line_ref_r,) = ax_r.plot([], [], color=grey, lw=1.4, label=tr("trainer samples itself"))
        (self.line_r,) = ax_r.plot([], [], color=COLORS["k1"], lw=1.8, label=tr("engine's batch (logged)"))
        (self.line_own,) = ax_r.plot([], [], color=color, lw=1.8, ls="--", label=tr("trainer's own samples"))
        (self.live_r,) = ax_r.plot([], [], color=COLORS["ink"], lw=1.0, label=tr("live seed (engine's batch)"))
        (self.line_ref_kl,) = ax_kl.plot([], [], color=grey, lw=1.4)
        (self.line_kl,) = ax_kl.plot([], [], color=COLORS["k1"], lw=1.8)
        (self.line_own_kl,) = ax_kl.plot([], [], color=color, lw=1.8, ls="--")
        (self.live_kl,) = ax_kl.plot([], [], color=COLORS["ink"], lw=1.0)
        (self.line_m,) = ax_m.plot([], [], color=COLORS["mu"], lw=1.8)
        (self.live_m,) = ax_m.plot([], [], color=COLORS["ink"], lw=1.0)
        ax_r.set_title(tr("reward R (batch mean)"))
        ax_kl.set_title(tr("true KL(π_θ‖π_ref) per response"))
        ax_kl.set_ylabel("nats")
        ax_m.set_ylim(_MISMATCH_FLOOR / 2, 0.2)
        ax_m.set_yscale("log")
        ax_m.set_ylabel(tr("k3 per token [nats]"))
        for ax in axes:
            ax.set_xlabel(tr("training step"))
            ax.set_xlim(0, self.steps - 1)
        ax_r.set_ylim(-1.0, 1.3)
        ax_kl.set_ylim(0.0, 8.0)
        self.axes = axes
        return fig

    # -- data -----------------------------------------------------------------------------------
    def _config(self, engine: str, correction: str, seed: int | None = None) -> rlhf.LabConfig:
        if engine not in TRAINING_ENGINES:
            raise ValueError(f"engine must be one of {', '.join(TRAINING_ENGINES)}, got {engine!r}")
        name = f"{engine} · {correction}"
        if name not in self.store.configs:
            raise ValueError(f"correction must be one of {', '.join(rlhf.LAB_CORRECTIONS)}, got {correction!r}")
        cfg = self.store.configs[name]
        return cfg if seed is None else replace(cfg, seed=int(seed), steps=self.steps)

    def _live_config(self, engine: str, correction: str, live: str) -> rlhf.LabConfig | None:
        if live not in LIVE_SEEDS:
            raise ValueError(f"live must be one of {', '.join(LIVE_SEEDS)}, got {live!r}")
        seed = LIVE_SEEDS[live]
        return None if seed is None else self._config(engine, correction, seed)

    def start_background(self, **values: Any) -> bool:
        cfg = self._live_config(**values)
        if cfg is None or rlhf.trained_history(cfg, self.device) is not None:
            return False  # nothing to train: answer in the foreground
        self.show_progress((values, None))

        def train(run: BackgroundRun) -> rlhf.TrainingHistory:
            def progress(step: int, hist: rlhf.TrainingHistory) -> None:
                if step % 5 == 4:
                    run.report((values, hist))
                else:
                    run.check()

            return rlhf.lab_history(cfg, self.device, callback=progress)

        self.run_in_background(train, what=cfg)
        return True

    def compute(self, engine: str, correction: str, live: str) -> dict[str, Any]:
        name = f"{engine} · {correction}"
        self._config(engine, correction)  # validates both
        live_cfg = self._live_config(engine, correction, live)
        hist = None if live_cfg is None else rlhf.lab_history(live_cfg, self.device)
        return self._data(engine, correction, hist, name)

    def _data(
        self, engine: str, correction: str, hist: rlhf.TrainingHistory | None, name: str | None = None
    ) -> dict[str, Any]:
        name = name or f"{engine} · {correction}"
        # a correction is compared with the same engine without one; no correction, with no mismatch
        baseline = f"{engine} · none" if correction != "none" else _REFERENCE
        finals = {}
        for metric, _label in _SERIES:
            this, other, ref = (self._final(n, metric) for n in (name, baseline, _REFERENCE))
            finals[metric] = {
                "this": mean_se(torch.as_tensor(this)),
                "baseline": mean_se(torch.as_tensor(other)),
                "diff": mean_se(torch.as_tensor(this - other)),
                "above": int((this > other).sum()),
                "reference": mean_se(torch.as_tensor(ref)),
            }
        curves = {
            key: _per_step_mean_se(self.store.metrics[run][metric])
            for key, run, metric in (
                ("reward", name, "reward"),
                ("own", name, "trainer_reward"),
                ("kl", name, "true_kl"),
                ("own_kl", name, "trainer_true_kl"),
                ("mismatch", name, "mismatch_kl"),
                ("ref_reward", _REFERENCE, "reward"),
                ("ref_kl", _REFERENCE, "true_kl"),
            )
        }
        live = None if hist is None else {k: np.asarray(v) for k, v in hist.metrics.items()}
        return {
            "engine": engine,
            "correction": correction,
            "baseline": baseline,
            # a correction that never binds gives the very same runs (top-p ratios S < 1 under a cap above 1)
            "identical": self.store.same_runs(name, baseline),
            "finals": finals,
            "curves": curves,
            "live": live,
            "live_seed": None if hist is None else hist.config.seed,
            "seeds": len(self.store.seeds),
            "beta": self.store.configs[name].beta,
        }

    def _final(self, name: str, metric: str) -> np.ndarray:
        """Per seed, the mean of the last 5 steps of ``metric`` in run ``name``; "score" is lesson 07's
        yardstick J on the trainer's own policy, "served score" J of the policy the engine serves
        (:meth:`klviz.rlhf.LabSeeds.score`; k3 in the loss follows the forward KL's gradient, so it is not
        exactly what the update climbs)."""
        if metric == "score":
            return self.store.score(name)
        if metric == "served score":
            return self.store.score(name, policy="engine")
        return self.store.final(name, metric)

    # -- drawing --------------------------------------------------------------------------------
    def _draw_live(self, live: dict[str, np.ndarray] | None) -> None:
        # the legend names the live seed only while there is one (one legend kept per case)
        self.live_r.set_label(tr("live seed (engine's batch)") if live is not None else "_no live seed")
        self.show_legend(self.axes[0], live is not None, loc="lower right", fontsize=7)
        if live is None:
            for line in (self.live_r, self.live_kl, self.live_m):
                line.set_data([], [])
            return
        t = np.arange(len(live["reward"]))
        self.live_r.set_data(t, live["reward"])
        self.live_kl.set_data(t, live["true_kl"])
        self.live_m.set_data(t, np.maximum(live["mismatch_kl"], _MISMATCH_FLOOR))

    def draw_progress(self, progress: tuple[dict[str, Any], rlhf.TrainingHistory | None]) -> str:
        values, hist = progress
        self.draw(self._data(values["engine"], values["correction"], None))
        if hist is not None:
            self._draw_live({k: np.asarray(v) for k, v in hist.metrics.items()})
        done = 0 if hist is None else len(hist.metrics["reward"])
        return tr(" · training the live seed: step {done} of {steps}", done=done, steps=self.steps)

    def draw(self, data: dict[str, Any]) -> None:
        c = data["curves"]
        t = np.arange(self.steps, dtype=float)
        for line, band, key, floor in (
            (self.line_ref_r, self.ref_r, "ref_reward", None),
            (self.line_r, self.band_r, "reward", None),
            (self.line_own, self.band_own, "own", None),
            (self.line_ref_kl, self.ref_kl, "ref_kl", None),
            (self.line_kl, self.band_kl, "kl", None),
            (self.line_own_kl, self.band_own_kl, "own_kl", None),
            (self.line_m, self.band_m, "mismatch", _MISMATCH_FLOOR),
        ):
            mean, se = c[key]
            lo, hi = mean - PM_SE * se, mean + PM_SE * se
            if floor is not None:
                mean, lo, hi = (np.maximum(v, floor) for v in (mean, lo, hi))
            line.set_data(t, mean)
            _set_band(band, t, lo, hi)
        self._draw_live(data["live"])
        # the KL axis stays at [0, 8] unless a curve leaves it (a live seed can): limits from the data alone
        top = max([8.0, *(float(np.max(c[k][0] + PM_SE * c[k][1])) for k in ("kl", "own_kl", "ref_kl"))])
        if data["live"] is not None and len(data["live"]["true_kl"]):
            top = max(top, float(np.max(data["live"]["true_kl"])))
        self.axes[1].set_ylim(0.0, 8.0 if top <= 8.0 else float(math.ceil(top * 1.1)))
        self.axes[2].set_title(
            tr("mismatch KL(π_rollout‖π_old)")
            if data["correction"] != "keep_mask"
            else tr("mismatch: 0, mask replayed")
        )
        self.readout.value = self._readout(data)

    def _readout(self, data: dict[str, Any]) -> str:
        n, corr, engine = data["seeds"], data["correction"], data["engine"]
        live = data["live"]
        header = [
            tr("final (last 5 steps)"),
            f"<b>{html.escape(engine)} · {html.escape(corr)}</b>",
            tr("minus {baseline} (paired)", baseline=html.escape(data["baseline"])),
            tr("trainer samples itself"),
        ] + ([tr("live seed {live_seed}", live_seed=data["live_seed"])] if live is not None else [])
        rows = []
        for metric, label in _SERIES:
            f = data["finals"][metric]
            fmt = "{:.2e}" if metric == "mismatch_kl" else "{:.3f}"
            (a, sa), (d, sd), (r, sr) = f["this"], f["diff"], f["reference"]
            if data["identical"]:
                verdict = tr("identical runs")
            elif a == 0 and sa == 0 and d == 0 and sd == 0:
                verdict = tr("0 in both")
            else:
                said = seed_verdict(d, sd, abs(a) + abs(a - d))
                verdict = (
                    f"{fmt.format(d)} ± {fmt.format(PM_SE * sd)} "
                    + (f"<b>{tr(said)}</b>" if said == "resolved" else tr(said))
                    + tr(" ({above}/{n} above)", above=f["above"], n=n)
                )
            row = [
                tr(label),
                f"<span class='klviz-final-{metric.replace('_', '-').replace(' ', '-')}'>{fmt.format(a)}</span>"
                f" ± {fmt.format(PM_SE * sa)}",
                verdict,
                f"{fmt.format(r)} ± {fmt.format(PM_SE * sr)}" if (r, sr) != (0, 0) else "0",
            ]
            if live is not None:
                if metric == "score":
                    series = live["trainer_reward"] - data["beta"] * live["trainer_true_kl"]
                elif metric == "served score":
                    series = live["reward"] - data["beta"] * live["engine_true_kl"]
                else:
                    series = live[metric]
                row.append(fmt.format(float(np.mean(series[-5:]))) if len(series) else "…")
            rows.append(row)
        return html_table(header, rows) + (
            tr(
                "<div style='font-size:90%'>Mean over {n} seeds ± {pm_se} SE. A correction is compared "
                "with the same engine without one, no correction with the trainer sampling itself, on "
                "the same seeds: the difference is paired by seed (resolved: at least {resolved_at_se:g} "
                "SE from 0; runs through different engines share their seed, not their batches, so that "
                "pairing is loose). k3 in the loss, β = 0.2, 40 steps; the engine syncs the trainer's "
                "weights before every rollout, the trainer recomputes in float32 at T = 1 on the full "
                "vocabulary.</div>",
                n=n,
                pm_se=PM_SE,
                resolved_at_se=RESOLVED_AT_SE,
            )
        )
