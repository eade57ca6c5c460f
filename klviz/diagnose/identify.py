"""Which formula a logged KL metric is, decided exactly on the dump's own tensors.

A logged KL metric is one formula applied to one batch: an estimator (k1, k2, k3, |Δ|, log r) of a pair of
log-probs, a framework's clamps, an importance weight, an aggregation over the batch, all in the
framework's floating-point type. The dump holds every input, so each framework's logged metric is
recomputed here in float64 (:data:`METRICS`, one entry per framework, logged name and setting, each citing
the upstream file and function it follows) and the logged value is compared with it within the rounding
of the framework's own computation (:func:`rounding_bound`), not within a standard error: a value that is
not one of these formulas on this batch is not "consistent".

**The rounding bound** of a masked mean ``Σ v_i / N`` computed by the framework in a float type with unit
roundoff u (2^-24 for float32, 2^-8 for bfloat16) has three parts, each derived, none a chosen constant:

- *per token*: the first-order error of the framework's own formula, summed over the tokens
  (:data:`TOKEN_ERROR`; e.g. k3 written as ``exp(d) - d - 1`` is off by up to
  ``u (e^d (5 + |d|) + 2|d| + k3)``: the exponential within 2 ulp, its input ``d`` within u|d|, two
  roundings; the cancellation near d = 0 makes this the dominant term for small KL);
- *the sum*: ``γ̃(n) Σ|v_i|`` with ``γ̃(n) = exp(λ √n u + n u²/(1 - u)) - 1``, the probabilistic bound of
  Higham & Mary (SIAM J. Sci. Comput. 41(5), 2019) for a sum of n terms in any order (a tree reduction
  on a GPU, a pairwise one on a CPU, or a plain loop), with λ = sqrt(2 ln(2n / 1e-6)): the bound fails with
  probability below 1e-6;
- *the division and the final rounding*: ``2 u |value|``.

Sums are accumulated in at least float32 (PyTorch reduces bfloat16 in float32), so the sum's γ̃ uses
float32's u; the per-token and final terms use the framework's arithmetic type: float32 where the
framework upcasts (OpenRLHF's ``.float()``) or when the dump stores float32 or float64, else the stored
type. A mean of per-micro-batch means (TRL logs the mean over its gradient-accumulation micro-batches)
adds the same bound per micro-batch.

The inputs are taken as exact: the dump must hold the framework's own tensors (``.float()`` of a float32
or bfloat16 tensor is exact). When it was saved in a coarser type than the framework computed in, the
bound adds each token's storage rounding, ``|∂v/∂d|`` times half an ulp of each log-prob.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from .. import kernel
from ..framework_rules import NEMO_RL, OPENRLHF, VERL_LOW_VAR_KL, VERL_PPO_KL, ClampRule
from ..statistics import clustered_mean_se_from_sums

__all__ = [
    "Term",
    "LoggedMetric",
    "METRICS",
    "TermSums",
    "RowTerms",
    "terms_for",
    "metrics_for",
    "evaluate",
    "identify",
    "rounding_bound",
    "gamma_tilde",
    "UNIT_ROUNDOFF",
    "FAILURE_PROBABILITY",
    "known_names",
]

#: Unit roundoff (half an ulp at 1) of each floating type.
UNIT_ROUNDOFF: dict[str, float] = {"float64": 2.0**-53, "float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}
#: The probabilistic summation bound may fail with at most this probability.
FAILURE_PROBABILITY = 1e-6

# Pairs of log-probs: (the target's role, the sampler's role); log r = target - sampler.
#   ref|policy   ref_logprob - logprob         KL(π ‖ π_ref) on π's tokens (a penalty in the loss)
#   ref|sampler  ref_logprob - old_logprob     KL(π_old ‖ π_ref) (a penalty computed at rollout);
#                                              = ref|policy when the dump has no old_logprob
#   policy|old   logprob - old_logprob         KL(π_old ‖ π) (PPO's ppo_kl / approx_kl)
#   old|rollout  old_logprob - rollout_logprob KL(π_rollout ‖ π_old) (engine-trainer mismatch)
PAIRS = ("ref|policy", "ref|sampler", "policy|old", "old|rollout")
_PAIR_NEEDS = {"policy|old": "old_logprob", "old|rollout": "rollout_logprob"}
_PAIR_KL = {
    "ref|policy": "KL(π ‖ π_ref)",
    "ref|sampler": "KL(π_old ‖ π_ref)",
    "policy|old": "KL(π_old ‖ π)",
    "old|rollout": "KL(π_rollout ‖ π_old)",
}


@dataclass(frozen=True)
class Term:
    """A per-token quantity a framework computes: ``clamp_out(weight · estimator(clamp_in(log r)))``.

    ``estimator`` is ``k1`` (-log r), ``k2``, ``k3`` (written ``exp(d) - d - 1`` by every framework),
    ``abs`` (|log r|), ``log_r`` (log r itself, MiniMind's GRPO ``kl_ref``) or ``zero``; ``weight`` is
    ``none``, ``rho`` (π/π_old per token) or ``rho_seq`` (exp of the sequence's mean log π/π_old, TRL's
    ``importance_sampling_level="sequence"``); the weight multiplies before the output clamp (NeMo-RL).
    """

    pair: str
    estimator: str
    input_clamp: float | None = None
    output_clamp: tuple[float, float] | None = None
    weight: str = "none"

    @property
    def key(self) -> str:
        parts = [self.pair, self.estimator]
        if self.input_clamp is not None:
            parts.append(f"in±{self.input_clamp:g}")
        if self.output_clamp is not None:
            parts.append(f"out[{self.output_clamp[0]:g},{self.output_clamp[1]:g}]")
        if self.weight != "none":
            parts.append(self.weight)
        return ":".join(parts)

    def needs(self) -> set[str]:
        """The roles beyond logprob, ref_logprob and the mask that this term reads (when present)."""
        out = {_PAIR_NEEDS[self.pair]} if self.pair in _PAIR_NEEDS else set()
        return out

    @property
    def nonnegative(self) -> bool:
        return self.estimator in ("k2", "k3", "abs", "zero")


def _clamped(rule: ClampRule, pair: str, est: str, weight: str = "none") -> Term:
    return Term(pair, est, rule.input_clamp if est in rule.estimators else None, rule.output_clamp, weight)


@dataclass(frozen=True)
class LoggedMetric:
    """One metric a framework logs: its name, the formula and aggregation, and where upstream computes it."""

    framework: str
    name: str
    formula: str  # what is averaged, in words ("k3 × π/π_old")
    term: Term
    aggregation: str  # token-mean, seq-mean-token-mean, seq-mean-token-sum, batch-mean-token-sum, ...
    setting: str  # the configuration that gives it ("use_bias_correction_kl=True (default)")
    source: str  # repository, file and function
    default: bool = False  # what the framework logs under this name by default
    upcast: bool = False  # computes in float32 whatever the inputs' type

    @property
    def label(self) -> str:
        return f"{self.framework} `{self.name}`: {self.formula}, {self.aggregation.replace('-', ' ')}"

    @property
    def estimates(self) -> str:
        if self.term.estimator == "zero":
            return "nothing (a constant 0)"
        kl = _PAIR_KL[self.term.pair]
        if self.term.estimator == "log_r":
            return f"−{kl} (log r, the negative of k1)"
        if self.term.estimator in ("k2", "abs"):
            return f"{kl} only to leading order"
        return kl + (" per sequence" if "token-sum" in self.aggregation else "")


_TRL = (
    "huggingface/trl release 1.16.0, trl/trainer/grpo_trainer.py GRPOTrainer._compute_loss "
    "(per_token_kl, global_masked_mean)"
)
_TRL_PPO = "huggingface/trl @ f2cd577, trl/experimental/ppo/ppo_trainer.py PPOTrainer.train"
_OPENRLHF = "OpenRLHF @ 3c3be62, openrlhf/models/utils.py compute_approx_kl"
_OPENRLHF_REWARD = _OPENRLHF + "; openrlhf/trainer/ppo_utils/experience_maker.py make_experience (info['kl'])"
_OPENRLHF_LOSS = _OPENRLHF + "; openrlhf/trainer/ray/ppo_actor.py (use_loss: info['kl'] = aggregate_loss)"
_VERL = "verl @ 1dda039, verl/trainer/ppo/core_algos.py kl_penalty, agg_loss"
_VERL_LOSS = _VERL + "; verl/workers/utils/losses.py ppo_loss (metrics['kl_loss'])"
_VERL_REWARD = _VERL + "; verl/trainer/ppo/ray_trainer.py apply_kl_penalty"
_VERL_PPO = "verl @ 1dda039, verl/trainer/ppo/core_algos.py compute_policy_loss_vanilla (ppo_kl)"
_VERL_CORR = "verl @ 1dda039, verl/trainer/ppo/rollout_corr_helper.py compute_offpolicy_metrics"
_NEMO = "NeMo-RL @ 7ea279a, nemo_rl/algorithms/utils.py calculate_kl; nemo_rl/algorithms/loss/loss_functions.py"
_MINIMIND = "jingyaogong/minimind @ d65ef2c"

_VERL_KINDS = (("low_var_kl", "k3"), ("kl", "k1"), ("mse", "k2"), ("abs", "abs"))
_VERL_AGGS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


def _metrics() -> list[LoggedMetric]:
    out: list[LoggedMetric] = []
    add = out.append
    # TRL GRPO: per_token_kl = exp(ref - logp) - (ref - logp) - 1, times coef_1 = exp(logp - old) with
    # use_bias_correction_kl (default True in 1.16.0); logged kl = global token mean per micro-batch.
    for weight, formula, setting, default in (
        ("rho", "k3 × π/π_old", "use_bias_correction_kl=True (the default)", True),
        ("none", "k3", "use_bias_correction_kl=False", False),
        ("rho_seq", "k3 × exp(mean log π/π_old of the sequence)", "importance_sampling_level='sequence'", False),
    ):
        add(
            LoggedMetric(
                "TRL GRPO", "kl", formula, Term("ref|policy", "k3", weight=weight), "token-mean", setting, _TRL, default
            )
        )
    # TRL PPO (experimental): non_score_reward from k1 (or k3) of the rollout policy vs ref; objective/kl =
    # kl.sum(1).mean(); approxkl = 0.5 * (logprobs_diff ** 2).mean() over every position.
    add(
        LoggedMetric(
            "TRL PPO",
            "objective/kl",
            "k1 of π_old vs π_ref",
            Term("ref|sampler", "k1"),
            "batch-mean-token-sum",
            "kl_estimator='k1' (the default)",
            _TRL_PPO,
            True,
        )
    )
    add(
        LoggedMetric(
            "TRL PPO",
            "objective/kl",
            "k3 of π_old vs π_ref",
            Term("ref|sampler", "k3"),
            "batch-mean-token-sum",
            "kl_estimator='k3'",
            _TRL_PPO,
        )
    )
    for name in ("approxkl", "policy/approxkl_avg"):
        add(
            LoggedMetric(
                "TRL PPO",
                name,
                "½ (log π − log π_old)²",
                Term("policy|old", "k2"),
                "all-positions-mean",
                "padding counts as 0",
                _TRL_PPO,
                True,
            )
        )
    # OpenRLHF: compute_approx_kl in float32, every estimator clamped to [-10, 10]; in the reward (default)
    # kl = mean over samples of each sample's masked mean; with --algo.kl.use_loss the loss's token mean;
    # with --algo.kl.init_coef 0 there is no reference model and kl is 0.
    for est in ("k1", "k2", "k3"):
        add(
            LoggedMetric(
                "OpenRLHF",
                "kl",
                f"{est} clamped to ±10 (π_old vs π_ref)",
                _clamped(OPENRLHF, "ref|sampler", est),
                "seq-mean-token-mean",
                f"--algo.kl.estimator {est}" + (" (the default), KL in the reward" if est == "k1" else ""),
                _OPENRLHF_REWARD,
                est == "k1",
                upcast=True,
            )
        )
        add(
            LoggedMetric(
                "OpenRLHF",
                "kl",
                f"{est} clamped to ±10",
                _clamped(OPENRLHF, "ref|policy", est),
                "token-mean",
                f"--algo.kl.use_loss, --algo.kl.estimator {est}",
                _OPENRLHF_LOSS,
                upcast=True,
            )
        )
    add(
        LoggedMetric(
            "OpenRLHF",
            "kl",
            "0 (no reference model)",
            Term("ref|policy", "zero"),
            "token-mean",
            "--algo.kl.init_coef 0",
            _OPENRLHF_REWARD + "; openrlhf/cli/train_ppo_ray.py",
        )
    )
    # verl: kl_penalty(logprob, ref, kind) then agg_loss in the loss (actor/kl_loss); in the reward
    # kl_penalty(old_log_probs, ref, kind), logged as the mean of per-sequence token means.
    for kind, est in _VERL_KINDS:
        term = _clamped(VERL_LOW_VAR_KL, "ref|policy", est) if est == "k3" else Term("ref|policy", est)
        for agg in _VERL_AGGS:
            add(
                LoggedMetric(
                    "verl",
                    "actor/kl_loss",
                    f"kl_penalty {kind} ({est}" + (", clamps" if est == "k3" else "") + ")",
                    term,
                    agg,
                    f"kl_loss_type={kind}, loss_agg_mode={agg}",
                    _VERL_LOSS,
                    kind == "low_var_kl" and agg == "token-mean",
                )
            )
        rterm = _clamped(VERL_LOW_VAR_KL, "ref|sampler", est) if est == "k3" else Term("ref|sampler", est)
        add(
            LoggedMetric(
                "verl",
                "actor/reward_kl_penalty",
                f"kl_penalty {kind} of π_old vs π_ref",
                rterm,
                "seq-mean-token-mean",
                f"algorithm.kl_penalty={kind}",
                _VERL_REWARD,
                kind == "kl",
            )
        )
    add(
        LoggedMetric(
            "verl",
            "actor/ppo_kl",
            "old − new log-prob (log-ratio clamped ±20)",
            Term("policy|old", "k1", VERL_PPO_KL.input_clamp),
            "token-mean",
            "policy_loss.loss_mode=vanilla (the default)",
            _VERL_PPO,
            True,
        )
    )
    add(
        LoggedMetric(
            "verl",
            "actor/ppo_kl",
            "old − new log-prob",
            Term("policy|old", "k1"),
            "token-mean",
            "loss_mode gspo, clip_cov, geo_mean, dro (no clamp)",
            _VERL_PPO,
        )
    )
    add(
        LoggedMetric(
            "verl",
            "actor/ppo_kl",
            "|new − old log-prob|",
            Term("policy|old", "abs"),
            "token-mean",
            "policy_loss.loss_mode=kl_cov (ppo_kl_abs)",
            "verl @ 1dda039, verl/trainer/ppo/core_algos.py compute_policy_loss_kl_cov",
        )
    )
    add(
        LoggedMetric(
            "verl",
            "rollout_corr/kl",
            "k1 of π_rollout vs π_old",
            Term("old|rollout", "k1"),
            "token-mean",
            "algorithm.rollout_correction (decoupled mode)",
            _VERL_CORR,
            True,
        )
    )
    add(
        LoggedMetric(
            "verl",
            "rollout_corr/k3_kl",
            "k3 of π_rollout vs π_old",
            Term("old|rollout", "k3"),
            "token-mean",
            "algorithm.rollout_correction (decoupled mode)",
            _VERL_CORR,
            True,
        )
    )
    # NeMo-RL: calculate_kl (input clamp 20, output clamp 10) times the importance weight (before the output
    # clamp), token mean; logged kl_penalty = that mean (the loss divided by the coefficient).
    for est in ("k3", "k1", "k2"):
        for weight, setting, default in (
            ("none", "use_on_policy_kl_approximation=False (the default)", est == "k3"),
            ("rho", "use_on_policy_kl_approximation=True", False),
        ):
            add(
                LoggedMetric(
                    "NeMo-RL",
                    "kl_penalty",
                    f"{est}" + (" × π/π_old" if weight == "rho" else "") + " (clamps 20 and 10)",
                    _clamped(NEMO_RL, "ref|policy", est, weight),
                    "token-mean",
                    f"kl_type={est}, {setting}",
                    _NEMO,
                    default,
                )
            )
    # MiniMind: train_ppo.py logs approx_kl = masked mean ½Δ² and kl_ref = masked mean k3 (current vs ref);
    # train_grpo.py logs kl_ref = masked mean of (ref - logp), i.e. log r = -k1.
    add(
        LoggedMetric(
            "MiniMind",
            "approx_kl",
            "½ (log π − log π_old)²",
            Term("policy|old", "k2"),
            "token-mean",
            "trainer/train_ppo.py",
            f"{_MINIMIND}, trainer/train_ppo.py (approx_kl)",
            True,
        )
    )
    add(
        LoggedMetric(
            "MiniMind",
            "kl_ref",
            "k3",
            Term("ref|policy", "k3"),
            "token-mean",
            "trainer/train_ppo.py",
            f"{_MINIMIND}, trainer/train_ppo.py (kl_ref_penalty)",
            True,
        )
    )
    add(
        LoggedMetric(
            "MiniMind",
            "kl_ref",
            "log π_ref − log π (= −k1)",
            Term("ref|policy", "log_r"),
            "token-mean",
            "trainer/train_grpo.py",
            f"{_MINIMIND}, trainer/train_grpo.py (kl_ref_val)",
        )
    )
    return out


#: Every framework's logged KL metrics (what ``--logged NAME=VALUE`` is recomputed as).
METRICS: tuple[LoggedMetric, ...] = tuple(_metrics())


def known_names() -> list[str]:
    """The logged names klviz knows, in registry order."""
    return list(dict.fromkeys(m.name for m in METRICS))


def metrics_for(name: str) -> list[LoggedMetric]:
    """The metrics a logged ``name`` can be: those of that name (a ``train/`` prefix is ignored), else all."""
    base = _base_name(name)
    found = [m for m in METRICS if m.name == base]
    return found or list(METRICS)


def _base_name(name: str) -> str:
    for prefix in ("train/", "train_", "eval/"):
        if name.startswith(prefix) and name[len(prefix) :] in {m.name for m in METRICS}:
            return name[len(prefix) :]
    return name


def terms_for(names: Iterable[str] | None) -> list[Term]:
    """The terms to accumulate for these logged names (all of them for ``None`` or an unknown name)."""
    ms = list(METRICS) if names is None else [m for n in names for m in metrics_for(n)]
    return list(dict.fromkeys(m.term for m in ms))


# -- per-token values, their rounding error, and per-row sums -------------------------------------------------

#: The first-order rounding error of each estimator as the frameworks write it, in units of u, as a
#: function of log r (``d``), ``r = e^d`` and the value ``v`` (inputs exact; see the module docstring).
TOKEN_ERROR: dict[str, str] = {
    "k1": "|d| (one subtraction)",
    "log_r": "|d| (one subtraction)",
    "abs": "|d| (one subtraction)",
    "k2": "3 k2 (d within u|d|, squared, one product)",
    "k3": "e^d (5 + |d|) + 2|d| + k3 (exp within 2 ulp of e^d̂, d̂ within u|d|, two subtractions)",
    "zero": "0",
}


def _estimator(est: str, d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Values (float64, the exact formula) and first-order error in units of u of the framework's formula."""
    if est == "zero":
        z = np.zeros_like(d)
        return z, z
    if est in ("k1", "log_r", "abs"):
        a = np.abs(d)
        v = -d if est == "k1" else (d if est == "log_r" else a)
        return v, a
    if est == "k2":
        v = 0.5 * d * d
        return v, 3.0 * v
    v = np.empty_like(d)
    kernel.k3_into(d, v, np.empty_like(d), np.empty_like(d))
    with np.errstate(over="ignore"):
        r = np.exp(np.minimum(d, 700.0))
        a = np.abs(d)
        err = r * (5.0 + a) + 2.0 * a + v
    return v, err


class RowSegments:
    """The counted tokens of a chunk grouped by row (``rows`` ascending, as ``np.nonzero`` gives them): per-row
    sums by ``np.add.reduceat`` over contiguous segments, several times faster than ``np.bincount``."""

    def __init__(self, rows: np.ndarray, n_rows: int) -> None:
        self.rows = rows
        self.starts = np.searchsorted(rows, np.arange(n_rows))
        self.counts = np.diff(np.append(self.starts, rows.size)).astype(np.float64)
        self.empty = self.counts == 0

    def sums(self, x: np.ndarray | float) -> np.ndarray:
        """Per-row sums of a per-token array (a scalar: that value times each row's count)."""
        if np.isscalar(x):
            return self.counts * float(x)  # type: ignore[arg-type]
        if self.rows.size == 0:
            return np.zeros(len(self.counts))
        out = np.add.reduceat(np.append(x, 0.0), self.starts)
        out[self.empty] = 0.0
        return out

    def sums_of(self, t: _TokenValues) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        val = self.sums(t.value)
        absolute = val if t.absolute is t.value else self.sums(t.absolute)
        return val, absolute, self.sums(t.error), self.sums(t.storage)


class _TokenValues(NamedTuple):
    value: np.ndarray
    absolute: np.ndarray
    error: np.ndarray
    storage: np.ndarray | float


@dataclass
class TermSums:
    """Per-row sums of one term over counted tokens: value, |value|, rounding error (units of u) and the
    storage-rounding propagation (absolute), plus each row's token count."""

    value: np.ndarray
    absolute: np.ndarray
    error: np.ndarray
    storage: np.ndarray


@dataclass
class RowTerms:
    """What identification keeps of a dump: per-row sums of every accumulated term (no per-token data).

    ``counts``: counted tokens per row; ``width``: token columns of the dump; ``groups``: a micro-batch
    index per row (``None``: one group); ``dtypes``: the stored dtype of each log-prob role; ``roles``:
    the roles present; ``terms``: ``{Term.key: TermSums}``.
    """

    counts: np.ndarray
    width: int
    dtypes: dict[str, str]
    roles: set[str]
    terms: dict[str, TermSums] = field(default_factory=dict)
    groups: np.ndarray | None = None

    @staticmethod
    def concat(parts: Sequence[RowTerms]) -> RowTerms:
        """The rows of several dumps (the ranks of one step, or the steps of one logging window) as one."""
        first = parts[0]
        keys = set.intersection(*(set(p.terms) for p in parts))
        groups = None
        if any(p.groups is not None for p in parts):
            groups = np.concatenate([p.groups if p.groups is not None else np.zeros(len(p.counts)) for p in parts])
        return RowTerms(
            counts=np.concatenate([p.counts for p in parts]),
            width=max(p.width for p in parts),
            dtypes=dict(first.dtypes),
            roles=set.intersection(*(p.roles for p in parts)),
            terms={
                k: TermSums(
                    *(np.concatenate([getattr(p.terms[k], f) for p in parts]) for f in TermSums.__annotations__)
                )
                for k in keys
            },
            groups=groups,
        )


class TermAccumulator:
    """Accumulates :class:`RowTerms` chunk by chunk (rows are never split between chunks)."""

    def __init__(self, terms: Sequence[Term], batch: int, width: int, dtypes: dict[str, str], roles: set[str]):
        self.B, self.width = batch, width
        self.dtypes, self.roles = dict(dtypes), set(roles)
        self.requested = list(dict.fromkeys(terms))
        # without old_logprob the sampler is the policy: "ref|sampler" terms are the "ref|policy" ones
        self.canonical = {t.key: self._canonical(t) for t in self.requested}
        self.terms = list(dict.fromkeys(self.canonical.values()))
        self.counts = np.zeros(batch)
        z = lambda: np.zeros(batch)  # noqa: E731
        self.sums = {t.key: TermSums(z(), z(), z(), z()) for t in self.terms}
        self.storage_u = {
            role: UNIT_ROUNDOFF.get(self.dtypes.get(role, "float32"), 0.0)
            for role in ("logprob", "ref_logprob", "old_logprob", "rollout_logprob")
        }

    def _canonical(self, t: Term) -> Term:
        """Without old_logprob the sampler is the policy (ref|sampler = ref|policy) and every weight π/π_old is
        exactly 1: such terms are computed once."""
        if "old_logprob" in self.roles:
            return t
        pair = "ref|policy" if t.pair == "ref|sampler" else t.pair
        return Term(pair, t.estimator, t.input_clamp, t.output_clamp, "none")

    def _pair(self, pair: str, v: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray | float] | None:
        """log r of a pair and the storage half-ulp bound of log r (absolute)."""
        lp, ref = v["logprob"], v["ref_logprob"]
        old = v.get("old_logprob")
        if pair == "ref|policy":
            a, b, ra, rb = ref, lp, "ref_logprob", "logprob"
        elif pair == "ref|sampler":
            a, b, ra, rb = (
                (ref, old, "ref_logprob", "old_logprob") if old is not None else (ref, lp, "ref_logprob", "logprob")
            )
        elif pair == "policy|old":
            if old is None:
                return None
            a, b, ra, rb = lp, old, "logprob", "old_logprob"
        else:
            ro = v.get("rollout_logprob")
            if ro is None:
                return None
            a, b, ra, rb = (
                (old, ro, "old_logprob", "rollout_logprob")
                if old is not None
                else (lp, ro, "logprob", "rollout_logprob")
            )
        d = a - b
        storage = self._storage(a, ra) + self._storage(b, rb)
        return d, storage

    def _storage(self, x: np.ndarray, role: str) -> np.ndarray | float:
        """Half an ulp of the stored value where the dump is coarser than float32 (else 0: exact inputs)."""
        u = self.storage_u.get(role, 0.0)
        if u <= UNIT_ROUNDOFF["float32"]:
            return 0.0
        _m, e = np.frexp(x)
        return np.ldexp(u, e)  # u · 2^e ≥ half an ulp of x

    def add(self, rows: np.ndarray, r0: int, r1: int, v: dict[str, np.ndarray], seg: RowSegments | None = None) -> None:
        """Add the counted tokens of rows ``r0:r1``: ``rows`` (row of each token, relative to r0, ascending) and
        ``v`` (role -> float64 values of the counted tokens, in row order).

        Each (pair, estimator, weight) is computed once per chunk and summed per row; a clamp changes only the
        tokens beyond it, so each clamped term is the unclamped sums plus a correction over those tokens."""
        seg = seg if seg is not None and seg.rows is rows else RowSegments(rows, r1 - r0)
        self.counts[r0:r1] += seg.counts
        pairs: dict[str, Any] = {}
        bases: dict[tuple[str, str, str], Any] = {}
        for term in self.terms:
            if term.pair not in pairs:
                pairs[term.pair] = self._pair(term.pair, v)
            pd = pairs[term.pair]
            if pd is None:
                continue  # the dump lacks what this term needs
            d, stor = pd
            bkey = (term.pair, term.estimator, term.weight)
            if bkey not in bases:
                base = self._values(term.estimator, term.weight, d, stor, None, v, seg)
                bases[bkey] = (base, seg.sums_of(base))
            base, base_sums = bases[bkey]
            val_s, abs_s, err_s, stor_s = (x.copy() for x in base_sums)
            if term.input_clamp is not None or term.output_clamp is not None:
                self._clamp_correction(term, d, stor, v, seg, base, (val_s, abs_s, err_s, stor_s))
            out = self.sums[term.key]
            out.value[r0:r1] += val_s
            out.absolute[r0:r1] += abs_s
            out.error[r0:r1] += err_s
            out.storage[r0:r1] += stor_s

    def _values(
        self,
        est: str,
        weight: str,
        d: np.ndarray,
        stor: np.ndarray | float,
        idx: np.ndarray | None,
        v: dict[str, np.ndarray],
        seg: RowSegments,
        input_clamp: float | None = None,
    ) -> _TokenValues:
        """Per-token value, |value|, rounding error (units of u) and storage propagation of one unclamped-output
        term, on all counted tokens (``idx`` None) or on the tokens ``idx``."""
        dd = d if idx is None else d[idx]
        st = stor if (idx is None or np.isscalar(stor)) else stor[idx]  # type: ignore[index]
        din = dd if input_clamp is None else np.clip(dd, -input_clamp, input_clamp)
        val, err = _estimator(est, din)
        slope = _slope(est, din)
        if input_clamp is not None:
            slope = np.where(np.abs(dd) > input_clamp, 0.0, slope)
        stor_v = slope * st
        if weight != "none":
            lw = self._log_weight(weight, v, seg)
            if lw is not None:  # on-policy the weight is exp(0) = 1 exactly: nothing changes
                lw = lw if idx is None else lw[idx]
                w = np.exp(np.clip(lw, -700.0, 700.0))
                absval = np.abs(val)
                ws = self._weight_storage(v)
                ws = ws if (idx is None or np.isscalar(ws)) else ws[idx]  # type: ignore[index]
                err = w * err + w * absval * (5.0 + np.abs(lw))
                stor_v = w * stor_v + w * absval * ws
                val = w * val
        nonneg = est in ("k2", "k3", "abs", "zero")
        return _TokenValues(val, val if nonneg else np.abs(val), err, stor_v)

    def _clamp_correction(
        self,
        term: Term,
        d: np.ndarray,
        stor: np.ndarray | float,
        v: dict[str, np.ndarray],
        seg: RowSegments,
        base: _TokenValues,
        sums: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    ) -> None:
        """Add (clamped − unclamped) over the tokens a clamp changes to the per-row ``sums``, in place."""
        cond = np.zeros(d.shape, dtype=bool)
        if term.input_clamp is not None:
            cond |= np.abs(d) > term.input_clamp
        if term.output_clamp is not None:
            lo, hi = term.output_clamp
            u32 = UNIT_ROUNDOFF["float32"]
            cond |= (base.value > hi - u32 * base.error) | (base.value < lo + u32 * base.error)
        idx = np.flatnonzero(cond)
        if idx.size == 0:
            return
        new = self._values(term.estimator, term.weight, d, stor, idx, v, seg, term.input_clamp)
        val, err, stor_v = new.value, new.error, new.storage
        if term.output_clamp is not None:
            lo, hi = term.output_clamp
            u32 = UNIT_ROUNDOFF["float32"]
            bound = (val > hi + u32 * err) | (val < lo - u32 * err)  # robustly beyond: the bound, exactly
            val = np.clip(val, lo, hi)
            err = np.where(bound, 0.0, err)
            stor_v = np.where(bound, 0.0, stor_v)
        rows = seg.rows[idx]
        nb = len(seg.counts)
        old_b = base.storage if np.isscalar(base.storage) else base.storage[idx]  # type: ignore[index]
        for acc, new_x, old_x in (
            (sums[0], val, base.value[idx]),
            (sums[1], np.abs(val), base.absolute[idx]),
            (sums[2], err, base.error[idx]),
            (sums[3], stor_v, old_b),
        ):
            diff = np.asarray(np.asarray(new_x) - np.asarray(old_x), dtype=np.float64)
            if diff.ndim == 0:
                diff = np.full(idx.size, float(diff))
            acc += np.bincount(rows, weights=diff, minlength=nb)

    def _log_weight(self, weight: str, v: dict[str, np.ndarray], seg: RowSegments) -> np.ndarray | None:
        old = v.get("old_logprob")
        if old is None:
            return None
        key = f"_lw_{weight}"
        cached = v.get(key)
        if cached is not None:
            return cached
        lr = v["logprob"] - old
        if weight == "rho_seq":
            lr = (seg.sums(lr) / np.maximum(seg.counts, 1))[seg.rows]
        v[key] = lr  # per chunk: v is the chunk's own dict
        return lr

    def _weight_storage(self, v: dict[str, np.ndarray]) -> np.ndarray | float:
        old = v.get("old_logprob")
        if old is None:
            return 0.0
        return self._storage(v["logprob"], "logprob") + self._storage(old, "old_logprob")

    def finish(self, groups: np.ndarray | None = None) -> RowTerms:
        terms = {
            t.key: self.sums[self.canonical[t.key].key]
            for t in self.requested
            if all(r in self.roles for r in self.canonical[t.key].needs())
        }
        return RowTerms(
            counts=self.counts, width=self.width, dtypes=self.dtypes, roles=self.roles, terms=terms, groups=groups
        )


def _slope(est: str, d: np.ndarray) -> np.ndarray:
    """|∂ estimator / ∂ log r|."""
    if est in ("k1", "log_r", "abs"):
        return np.ones_like(d)
    if est == "k2":
        return np.abs(d)
    if est == "zero":
        return np.zeros_like(d)
    with np.errstate(over="ignore"):
        return np.abs(np.expm1(np.minimum(d, 700.0)))


# -- the rounding bound --------------------------------------------------------------------------------------


def gamma_tilde(n: float, u: float, failure: float = FAILURE_PROBABILITY) -> float:
    """Higham & Mary's probabilistic bound on the relative error of a sum of ``n`` terms, any order:
    ``exp(λ √n u + n u²/(1 - u)) - 1`` with λ = sqrt(2 ln(2n / failure))."""
    if n <= 1:
        return 0.0
    lam = math.sqrt(2.0 * math.log(2.0 * n / failure)) / (1.0 - u)
    return math.expm1(lam * math.sqrt(n) * u + n * u * u / (1.0 - u))


def rounding_bound(absolute: float, error_units: float, storage: float, n: float, value: float, u: float) -> float:
    """Bound on |framework's float result − exact value| of a sum divided by ``n`` (see the module docstring):
    ``(u · error_units + γ̃(n) · absolute + storage) / n + 2 u |value|``, the sum's γ̃ with the unit of
    the accumulator (float32 for bfloat16 and float16 arithmetic, as PyTorch's reductions do)."""
    if n <= 0:
        return 0.0
    u_sum = min(u, UNIT_ROUNDOFF["float32"])  # sums are accumulated in float32 at least
    return (u * error_units + gamma_tilde(n, u_sum) * absolute + storage) / n + 2.0 * u * abs(value)


def arithmetic_unit(metric: LoggedMetric, dtypes: dict[str, str]) -> float:
    """The unit roundoff of the framework's arithmetic for this metric on a dump with these dtypes."""
    if metric.upcast:
        return UNIT_ROUNDOFF["float32"]
    roles = {
        "ref|policy": ("logprob", "ref_logprob"),
        "ref|sampler": ("old_logprob", "ref_logprob"),
        "policy|old": ("logprob", "old_logprob"),
        "old|rollout": ("old_logprob", "rollout_logprob"),
    }
    us = [UNIT_ROUNDOFF.get(dtypes[r], UNIT_ROUNDOFF["float32"]) for r in roles[metric.term.pair] if r in dtypes]
    return max([UNIT_ROUNDOFF["float32"], *us])


# -- aggregation ------------------------------------------------------------------------------------------------


@dataclass
class Evaluation:
    """A metric recomputed on a dump: its exact value, the framework's rounding bound, and a standard error."""

    metric: LoggedMetric
    value: float
    bound: float
    se: float


def _aggregate(agg: str, s: TermSums, n: np.ndarray, width: int, u: float) -> tuple[float, float, float]:
    """(value, rounding bound, SE) of one aggregation over the rows given."""
    kept = n > 0
    if not kept.any():
        return math.nan, math.nan, math.nan
    if agg == "token-mean":
        total = float(n.sum())
        v = float(s.value.sum()) / total
        b = rounding_bound(float(s.absolute.sum()), float(s.error.sum()), float(s.storage.sum()), total, v, u)
        return v, b, clustered_mean_se_from_sums(s.value, n)[1]
    if agg == "all-positions-mean":
        total = float(len(n) * width)
        v = float(s.value.sum()) / total
        b = rounding_bound(float(s.absolute.sum()), float(s.error.sum()), float(s.storage.sum()), total, v, u)
        return v, b, clustered_mean_se_from_sums(s.value, n)[1] * float(n.sum()) / total
    if agg == "seq-mean-token-mean":
        nk = n[kept]
        m = s.value[kept] / nk
        v = float(m.mean())
        per = np.array(
            [
                rounding_bound(a, e, st, c, x, u)
                for a, e, st, c, x in zip(s.absolute[kept], s.error[kept], s.storage[kept], nk, m)
            ]
        )
        b = float(per.mean()) + gamma_tilde(len(m), UNIT_ROUNDOFF["float32"]) * float(np.abs(m).mean()) + 2 * u * abs(v)
        return v, b, _se(m)
    # sums per sequence, then a mean over sequences (non-empty ones for verl, all rows for TRL PPO)
    rows = kept if agg in ("seq-mean-token-sum", "seq-mean-token-sum-norm") else np.ones_like(kept)
    seq = s.value[rows]
    scale = float(width) if agg == "seq-mean-token-sum-norm" else 1.0
    v = float(seq.mean()) / scale
    per = u * s.error[rows] + np.array([gamma_tilde(c, UNIT_ROUNDOFF["float32"]) for c in n[rows]]) * s.absolute[rows]
    per = per + s.storage[rows]
    b = (float(per.mean()) + gamma_tilde(len(seq), UNIT_ROUNDOFF["float32"]) * float(np.abs(seq).mean())) / scale
    b += 2 * u * abs(v)
    return v, b, _se(seq) / scale


def _se(x: np.ndarray) -> float:
    return float(np.std(x, ddof=1) / math.sqrt(len(x))) if len(x) > 1 else math.nan


def evaluate(metric: LoggedMetric, rt: RowTerms) -> Evaluation | None:
    """The metric on these rows (``None`` when the dump lacks what it needs). With micro-batch ``groups``, the
    mean over micro-batches of the aggregation within each (TRL's logged value over gradient accumulation)."""
    s = rt.terms.get(metric.term.key)
    if s is None:
        return None
    u = arithmetic_unit(metric, rt.dtypes)
    if rt.groups is None:
        v, b, se = _aggregate(metric.aggregation, s, rt.counts, rt.width, u)
        return Evaluation(metric, v, b, se)
    vals, bounds, ses = [], [], []
    for g in np.unique(rt.groups):
        sel = rt.groups == g
        part = TermSums(s.value[sel], s.absolute[sel], s.error[sel], s.storage[sel])
        v, b, se = _aggregate(metric.aggregation, part, rt.counts[sel], rt.width, u)
        if math.isfinite(v):
            vals.append(v)
            bounds.append(b)
            ses.append(se)
    if not vals:
        return Evaluation(metric, math.nan, math.nan, math.nan)
    g = len(vals)
    value = sum(vals) / g
    se = math.sqrt(sum(x * x for x in ses if math.isfinite(x))) / g if all(map(math.isfinite, ses)) else math.nan
    return Evaluation(metric, value, sum(bounds) / g + 2 * g * UNIT_ROUNDOFF["float64"] * abs(value), se)


# -- identification ----------------------------------------------------------------------------------------


def _digits(text: str | None) -> int | None:
    """Significant digits of a number as the user typed it (None: not typed)."""
    if text is None:
        return None
    t = text.strip().lower().lstrip("+-")
    mant = t.split("e")[0].replace(".", "").lstrip("0")
    return max(len(mant), 1)


def identify(
    name: str,
    value: float,
    rt: RowTerms,
    *,
    text: str | None = None,
    metrics: Sequence[LoggedMetric] | None = None,
) -> dict[str, Any]:
    """Which of ``name``'s formulas equals ``value`` on this dump, within each one's rounding bound.

    Returns ``{name, value, consistent, matches, closest, candidates, expected, framework, estimates,
    other_batch, note}``: ``matches`` are the labels of the formulas equal to the value within the
    framework's floating-point rounding (:func:`rounding_bound`), ``consistent`` is true only when there is
    one, ``closest`` (when there is none) is ``{formula, value, relative_difference}``; ``other_batch`` is
    the reading for a value logged from *another* batch of the same run: its distance in standard errors
    from the framework's default formula on this batch. ``text``: the value as typed (to say when it was
    rounded to fewer digits than the check needs).
    """
    ms = list(metrics) if metrics is not None else metrics_for(name)
    known = any(m.name == _base_name(name) for m in METRICS)
    evals = [e for e in (evaluate(m, rt) for m in ms) if e is not None and math.isfinite(e.value)]
    cands: list[dict[str, Any]] = []
    for e in evals:
        diff = value - e.value
        cands.append(
            {
                "formula": e.metric.label,
                "framework": e.metric.framework,
                "setting": e.metric.setting,
                "source": e.metric.source,
                "value": e.value,
                "tolerance": e.bound,
                "difference": diff,
                "equal": abs(diff) <= e.bound,
                "estimates": e.metric.estimates,
            }
        )
    matches = [c for c in cands if c["equal"]]
    item: dict[str, Any] = {
        "name": name,
        "value": value,
        "consistent": bool(matches) if cands else None,
        "matches": [c["formula"] for c in matches],
        "closest": None,
        "candidates": cands,
        "framework": "; ".join(dict.fromkeys(m.framework for m in ms)) if known else None,
    }
    default = next((e for e in evals if e.metric.default), evals[0] if evals else None)
    item["expected"] = default.metric.label if default else None
    if default is not None:
        item["expected_value"] = default.value
        item["expected_se"] = default.se
    if matches:
        best = min(matches, key=lambda c: abs(c["difference"]))
        item["estimates"] = best["estimates"]
        same = [c["formula"] for c in matches if c is not best]
        item["note"] = (
            f"equals {best['formula']} ({best['setting']}; {best['source'].split(',')[0]}): "
            f"difference {best['difference']:.2g}, within the framework's rounding bound {best['tolerance']:.2g}"
            + (f"; on this dump it also equals {'; '.join(same)}" if same else "")
        )
    elif cands:
        rel = [(abs(c["difference"]) / abs(c["value"]) if c["value"] else math.inf, c) for c in cands]
        _r, best = min(rel, key=lambda t: (t[0], abs(t[1]["difference"])))
        rd = best["difference"] / best["value"] if best["value"] else math.inf
        item["closest"] = {"formula": best["formula"], "value": best["value"], "relative_difference": rd}
        item["estimates"] = None
        typed = _digits(text)
        rounded = typed is not None and best["value"] != 0 and _rounds_to(best["value"], value, typed)
        item["rounded_input"] = bool(rounded)
        item["note"] = (
            f"equals no formula {name} is logged as on this batch; closest: {best['formula']} = "
            f"{best['value']:.6g} (the value is {rd:+.3g} relative to it)"
            + (
                f". That formula rounds to the {typed} significant digit(s) given: pass the value as logged, "
                "with all its digits (trainer_state.json, a JSON export), to check it exactly"
                if rounded
                else ""
            )
        )
    else:
        item["estimates"] = None
        missing = sorted({r for m in ms for r in m.term.needs()} - rt.roles)
        item["note"] = (
            "the dump lacks what this metric needs (" + ", ".join(missing or ["the terms were not computed"]) + ")"
        )
    if default is not None and not matches and math.isfinite(default.se) and default.se > 0:
        z = (value - default.value) / default.se
        item["other_batch"] = {
            "formula": default.metric.label,
            "value": default.value,
            "se": default.se,
            "z": z,
            "within_3se": abs(z) <= 3.0,
        }
    return item


def _rounds_to(exact: float, given: float, digits: int) -> bool:
    if exact == 0 or not math.isfinite(exact):
        return False
    return float(f"{exact:.{digits}g}") == float(f"{given:.{digits}g}")


def markdown_table() -> str:
    """The format guide's table of the logged metrics klviz knows, from :data:`METRICS`."""
    lines = [
        "| framework | logged as | formula, aggregation | setting | estimates | upstream |",
        "|---|---|---|---|---|---|",
    ]
    for m in METRICS:
        agg = m.aggregation.replace("-", " ")
        default = " (default)" if m.default else ""
        lines.append(
            f"| {m.framework} | `{m.name}`{default} | {m.formula}, {agg} | {m.setting} | {m.estimates} | {m.source} |"
        )
    return "\n".join(lines)


GUIDE_START = "<!-- logged metrics: generated from klviz/diagnose/identify.py by scripts/format_guide_tables.py -->"
GUIDE_END = "<!-- end of logged metrics -->"


def write_guide_table(guide: str) -> str:
    """The format guide's text with the metrics table between its markers replaced by :func:`markdown_table`."""
    start, end = guide.index(GUIDE_START) + len(GUIDE_START), guide.index(GUIDE_END)
    return guide[:start] + "\n" + markdown_table() + "\n" + guide[end:]
