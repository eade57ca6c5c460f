"""The analysis behind ``klviz diagnose``: estimates, what each one estimates, clamps and trouble signs.

It streams over the rows of a dump (a chunk of about :data:`CHUNK_TOKENS` tokens at a time), so its
memory does not grow with the batch: per chunk it adds per-response sums (the units of every
standard error), per-position sums, clamp counts, counts of storage rounding, and a bounded uniform
subsample of log r for the quantiles and the plot. Per-token values come from :mod:`klviz.kernel`,
moments from :mod:`klviz.statistics`, clamps from :data:`klviz.framework_rules.CLAMP_RULES`, the
engine-trainer corrections from :mod:`klviz.mismatch`: this module decides which of them to compute
and what they say about the batch.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .. import kernel
from ..framework_rules import CLAMP_RULES, ClampRule
from ..statistics import RunningMoments, clustered_mean_se_from_sums, mean_se
from . import identify as ident
from .reading import DumpFile, RolloutDump, RolloutFileError, escape_text, open_dump
from .rules import LARGE_LOG_RATIO, MIN_TAIL_TOKENS, SEVERITIES, Trouble, find_trouble

__all__ = [
    "Diagnosis",
    "Trouble",
    "diagnose",
    "clamp_rows",
    "LARGE_LOG_RATIO",
    "CHUNK_TOKENS",
    "SEVERITIES",
    "QUANTILE_SAMPLE",
    "MIN_TAIL_TOKENS",
]

#: Tokens per chunk of the streaming pass (rows are never split).
CHUNK_TOKENS = 1 << 18
#: Largest number of log r values kept for quantiles and plots (a uniform subsample beyond it).
QUANTILE_SAMPLE = 1 << 21
#: Thresholds c of the Markov test: tokens sampled by q have q-probability at most 1/c of p/q ≥ c.
MARKOV_THRESHOLDS = (3.0, 10.0, 100.0)
#: TRL's padding value for log-probs (``INVALID_LOGPROB`` in its PPO/RLOO trainers).
TRL_INVALID_LOGPROB = 1.0
#: Estimators whose values are never negative, so that a lower output bound at or below 0 never binds.
_NEVER_NEGATIVE = ("k2", "k3")
_LOW_PRECISION = {"bfloat16": 8, "float16": 11}  # significand bits, implicit bit included


def _framework(rule: ClampRule) -> str:
    """The framework's name as the clamp table shows it ("OpenRLHF ±10" -> "OpenRLHF")."""
    return re.sub(r"\s*±[\d.]+$", "", rule.name)


def _bound(name: str, output_clamp: tuple[float, float]) -> str:
    lo, hi = output_clamp
    if name in _NEVER_NEGATIVE and lo <= 0:
        return f"≤ {hi:g}"
    return f"±{hi:g}" if lo == -hi else f"[{lo:g}, {hi:g}]"


def clamp_rows(rules: Mapping[str, ClampRule] = CLAMP_RULES) -> dict[str, tuple[ClampRule, str, str]]:
    """The rows of the report's clamp table: ``{label: (rule, estimator, "input" or "output")}``.

    An *input* clamp (``log r`` clamped before the estimator) is one row per rule: the tokens it alters
    are the same for every estimator, and its effect is measured on k3 (exponential in log r, the
    estimator it moves most) *within the rule*: the rule with all its clamps against the same rule
    without the input clamp. Where the rule's output clamp binds wherever the input clamp does
    (verl's low_var_kl: |log r| > 20 gives k3 > 10), that effect is exactly 0: the input clamp can
    only zero gradients. An *output* clamp is one row per estimator the rule acts on; its mean shift
    is that of the rule with all its clamps (:meth:`ClampRule.apply`) against the raw estimator. Rules
    with the same numbers for a row share it (the label names the first and adds "(also ...)").
    """
    groups: dict[tuple, list[ClampRule]] = {}
    for rule in rules.values():
        if not any(rule.acts_on(name) for name in kernel.ESTIMATORS):
            continue
        if rule.input_clamp is not None:
            name = "k3" if "k3" in rule.estimators else rule.estimators[-1]
            groups.setdefault(("input", name, rule.input_clamp, None), []).append(rule)
        if rule.output_clamp is not None:
            for name in rule.estimators:
                groups.setdefault(("output", name, rule.input_clamp, rule.output_clamp), []).append(rule)
    rows: dict[str, tuple[ClampRule, str, str]] = {}
    for (kind, name, input_clamp, output_clamp), members in groups.items():
        what = (
            f"log r clamped to ±{input_clamp:g}"
            if kind == "input"
            else f"{name} clamped to {_bound(name, output_clamp)}"
        )
        also = f" (also {', '.join(_framework(r) for r in members[1:])})" if len(members) > 1 else ""
        rows[f"{_framework(members[0])}: {what}{also}"] = (members[0], name, kind)
    return rows


def input_clamp_changes_value(rule: ClampRule, name: str) -> bool:
    """Whether ``rule``'s input clamp can change the forward value of ``name`` (False where its output
    clamp already binds at the input clamp's bounds; each estimator is monotone beyond them)."""
    if rule.input_clamp is None:
        return False
    if rule.output_clamp is None:
        return True
    lo, hi = rule.output_clamp
    c = torch.tensor([-rule.input_clamp, rule.input_clamp], dtype=torch.float64)
    v = kernel.estimate(name, c)
    return not bool(((v >= hi) | (v <= lo)).all())


@dataclass
class Diagnosis:
    """Everything the report says, as numbers (see :func:`diagnose`)."""

    source: str
    shape: tuple[int, int]
    dtypes: dict[str, str]
    keys: dict[str, str]
    n_tokens: int  # counted, finite tokens
    n_sequences: int  # sequences with at least one counted token
    n_empty_sequences: int
    lengths: dict[str, float]
    sampler: str
    off_policy: bool
    max_abs_policy_shift: float  # max |logprob - old_logprob| (0 when on-policy)
    nonfinite: dict[str, int]  # counted tokens with NaN/inf, per role
    nonfinite_examples: list[tuple[str, int, int, float]]
    positive_logprobs: dict[str, int]
    estimates: dict[str, dict[str, float]]  # k1/k2/k3 -> statistics (reference KL)
    directions: dict[str, str]
    extra: dict[str, dict[str, float]]  # other estimates (ppo_kl, importance-weighted, ...)
    mean_ratio: tuple[float, float]  # mean of r = exp(ref - sampler) and its SE
    clamps: dict[str, dict[str, Any]]
    large_tokens: list[tuple[int, int, float]]  # (row, column, log r) of the largest |log r|
    n_large: int
    k3_top_share: float  # share of the k3 sum carried by the top 1% of tokens
    trouble: list[Trouble] = field(default_factory=list)
    agreement: dict[str, Any] = field(default_factory=dict)
    positions: dict[str, Any] = field(default_factory=dict)
    precision: dict[str, Any] = field(default_factory=dict)
    ratio: dict[str, Any] = field(default_factory=dict)
    padding: dict[str, int] = field(default_factory=dict)
    token_report: dict[str, Any] = field(default_factory=dict)
    sequences: dict[str, Any] = field(default_factory=dict)
    mismatch: dict[str, Any] = field(default_factory=dict)
    quantiles_from: int = 0  # tokens behind the quantiles (a subsample beyond QUANTILE_SAMPLE)
    step: float | None = None
    log_r_sample: np.ndarray | None = None  # the subsample of log r (all tokens up to QUANTILE_SAMPLE)
    seq_lengths: np.ndarray | None = None  # counted tokens per response
    seq_sums: dict[str, np.ndarray] = field(default_factory=dict)  # per-response sums of k1, k3
    logged: list[dict[str, Any]] = field(default_factory=list)
    clip: float = 0.2
    edges: dict[str, int] = field(default_factory=dict)  # where the mask starts and ends against the log-probs
    alignment: dict[str, Any] = field(default_factory=dict)  # the shifted-copy comparison of each log-prob pair
    tail_bound: dict[str, Any] = field(default_factory=dict)  # the Markov test of the sampler's ratio
    who_sampled: str = ""  # one line: which policy sampled the tokens, which scored them
    row_terms: ident.RowTerms | None = None  # per-row sums of the formulas frameworks log (identification)

    @property
    def has_nonfinite(self) -> bool:
        return sum(self.nonfinite.values()) > 0

    def worst_severity(self) -> str | None:
        found = [SEVERITIES.index(t.severity) for t in self.trouble]
        return SEVERITIES[max(found)] if found else None


# -- helpers ------------------------------------------------------------------------------------


def _ulp(x: np.ndarray, bits: int) -> np.ndarray:
    """Spacing of a float format with ``bits`` significand bits at |x| (subnormals of float16 included)."""
    _m, e = np.frexp(x)
    u = np.ldexp(1.0, e - bits)
    return np.maximum(u, 2.0**-24) if bits == 11 else u


def _clamp_threshold(defs: dict[str, tuple[ClampRule, str, str]]) -> float:
    """The smallest |log r| at which any clamp row can alter a token (found on a fine grid, minus a margin):
    tokens below it are left out of the clamp computations, which cannot change them."""
    t = torch.linspace(-60.0, 60.0, 24_001, dtype=torch.float64)
    changed = torch.zeros_like(t, dtype=torch.bool)
    for rule, name, kind in defs.values():
        if kind == "input":
            changed |= rule.input_binds(t, name)
        else:
            changed |= rule.output_binds(t, name)
    return float(t[changed].abs().min()) - 0.02 if bool(changed.any()) else math.inf


class _Source:
    """Rows of a dump, from a file or from tensors."""

    def __init__(self, r: RolloutDump | DumpFile) -> None:
        dump: Any = r  # a DumpFile or a RolloutDump: the methods below read what each one has
        self.r = dump
        self.file = isinstance(r, DumpFile)
        self.step: float | None
        self.shape = tuple(r.shape)
        self.keys = dict(r.keys)
        self.dtypes = dict(r.dtypes)
        self.source = r.source
        if self.file:
            self.roles = set(r.keys)
            self.step = dump.step()
        else:
            self.roles = {"logprob", "ref_logprob", "response_mask"} | {
                role
                for role in ("old_logprob", "rollout_logprob", "tokens", "token_ids")
                if getattr(r, role) is not None
            }
            self.step = dump.step

    def groups(self) -> np.ndarray | None:
        """The micro-batch index of each row, when the dump carries one (key ``micro_batch``, ``[batch]``)."""
        if not self.file:
            return None
        spec = self.r.specs.get("micro_batch")
        if spec is None or spec.refused or len(spec.shape) != 1 or spec.numel != self.shape[0] or spec.is_float:
            return None
        g = np.asarray(spec.whole()).reshape(-1)
        return g.astype(np.int64) if g.dtype.kind in "iub" else None

    def rows(self, role: str, r0: int, r1: int) -> np.ndarray:
        if self.file:
            return self.r.rows(role, r0, r1)
        if role == "response_mask":
            return self.r.mask[r0:r1].numpy()
        v = getattr(self.r, role)
        return v[r0:r1].numpy() if isinstance(v, torch.Tensor) else np.asarray(v[r0:r1])


class _Top:
    """The k largest values seen so far, with a payload each."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.items: list[tuple[float, Any]] = []

    def add(self, scores: np.ndarray, payload: Callable[[np.ndarray], list]) -> None:
        if scores.size == 0:
            return
        k = min(self.k, scores.size)
        idx = np.argpartition(-scores, k - 1)[:k]
        for sc, p in zip(scores[idx].tolist(), payload(idx)):
            self.items.append((sc, p))
        self.items.sort(key=lambda t: -t[0])
        del self.items[self.k :]


# -- the streaming pass -------------------------------------------------------------------------


def diagnose(
    r: RolloutDump | DumpFile | str | Path,
    *,
    clip: float = 0.2,
    vocab: Callable | None = None,
    chunk_tokens: int = CHUNK_TOKENS,
    quantile_sample: int = QUANTILE_SAMPLE,
    tis_cap: float = 2.0,
    mask_band: tuple[float, float] = (0.5, 2.0),
    logged: Sequence[tuple] | None = None,
    identify: Iterable[str] | bool | None = None,
    groups: np.ndarray | None = None,
) -> Diagnosis:
    """Analyse a batch: estimates, their directions, clamps, positions, precision, mismatch, trouble signs.

    ``r`` is a :class:`RolloutDump` (tensors), a :class:`DumpFile` (:func:`open_dump`) or a path
    (opened with the default keys). ``clip`` is the PPO clip ε whose cut fraction is reported;
    ``vocab`` maps token ids to strings (:func:`klviz.diagnose.read_vocab`); ``tis_cap`` and
    ``mask_band`` are the truncated-IS cap and the masking band of the engine–trainer section.

    ``logged``: ``(name, value)`` pairs (or ``(name, value, text as typed)``) a framework logged for this
    batch; each is identified exactly (:func:`klviz.diagnose.identify.identify`) into ``Diagnosis.logged``.
    ``identify``: logged names (or ``True`` for every known formula) whose formulas to accumulate without a
    value yet (a run checked against its log history). ``groups``: a micro-batch index per row (default: the
    dump's ``micro_batch`` key, as the TRL integration writes it).
    """
    if isinstance(r, (str, Path)):
        with open_dump(r) as f:
            return diagnose(
                f,
                clip=clip,
                vocab=vocab,
                chunk_tokens=chunk_tokens,
                quantile_sample=quantile_sample,
                tis_cap=tis_cap,
                mask_band=mask_band,
                logged=logged,
                identify=identify,
                groups=groups,
            )
    if not (isinstance(clip, (int, float)) and 0 < clip < 1):
        raise ValueError(f"clip must be in (0, 1), got {clip!r}")
    logged = list(logged or [])
    if identify is True:
        terms: list[ident.Term] | None = ident.terms_for(None)
    else:
        names = [str(x[0]) for x in logged] + list(identify or [])
        terms = ident.terms_for(names) if names else None
    src = _Source(r)
    acc = _Accumulator(
        src,
        clip=clip,
        vocab=vocab,
        quantile_sample=quantile_sample,
        tis_cap=tis_cap,
        mask_band=mask_band,
        terms=terms,
    )
    B, T = src.shape
    step = max(1, chunk_tokens // max(T, 1))
    for r0 in range(0, B, step):
        acc.add(r0, min(B, r0 + step))
    d = acc.finish(groups if groups is not None else src.groups())
    if logged:
        from .logged import match_logged

        d.logged = match_logged(d, logged)
    return d


class _Accumulator:
    def __init__(
        self,
        src: _Source,
        *,
        clip: float,
        vocab: Callable | None,
        quantile_sample: int,
        tis_cap: float,
        mask_band: tuple[float, float],
        terms: list[ident.Term] | None = None,
    ) -> None:
        self.src, self.clip, self.vocab = src, clip, vocab
        self.ident = (
            ident.TermAccumulator(terms, src.shape[0], src.shape[1], src.dtypes, set(src.roles)) if terms else None
        )
        self._seg: ident.RowSegments | None = None
        self.tis_cap, self.mask_band = tis_cap, mask_band
        B, T = src.shape
        self.B, self.T = B, T
        self.has_old = "old_logprob" in src.roles
        self.has_ro = "rollout_logprob" in src.roles
        self.has_tok = "tokens" in src.roles or ("token_ids" in src.roles)
        z = lambda: np.zeros(B)  # noqa: E731
        self.n = z()
        self.mask_n = z()
        self.sums: dict[str, np.ndarray] = {}
        self.max_: dict[str, float] = {}
        self.min_: dict[str, float] = {}
        self.neg: dict[str, int] = {}
        self.moments = {k: RunningMoments() for k in kernel.ESTIMATORS}
        self.nonfinite: dict[str, int] = {
            role: 0 for role in ("logprob", "ref_logprob", "old_logprob", "rollout_logprob") if role in src.roles
        }
        self.examples: list[tuple[str, int, int, float]] = []
        self.positive: dict[str, int] = {role: 0 for role in self.nonfinite}
        self.trl_in, self.trl_out = 0, 0
        self.shift = 0.0
        self.clamp_defs = clamp_rows()
        self.clamp_from = _clamp_threshold(self.clamp_defs)
        self.clamp_count = {label: 0 for label in self.clamp_defs}
        self.clamp_diff = {label: 0.0 for label in self.clamp_defs}
        self.n_large = 0
        self.top_large = _Top(5)
        self.p_keep = min(1.0, quantile_sample / max(B * T, 1))
        self.sample: list[np.ndarray] = []
        self.sample_k3: list[np.ndarray] = []
        # the shifted-copy test: for each pair of log-prob roles, Σ|a[t] - b[t+s]| for s = 0, +1, -1 over the
        # positions t whose neighbours are counted too, and the rows that have such positions
        self.align: dict[str, dict[str, Any]] = {}
        # the Markov test on the sampler's ratio: per-row counts of r >= c
        self.sampler_role = "rollout_logprob" if self.has_ro else "old_logprob" if self.has_old else "logprob"
        self.markov = {c: np.zeros(B) for c in MARKOV_THRESHOLDS}
        self.pos = {side: {q: np.zeros(T) for q in ("n", "lr", "lr2", "k3", "k32", "k1")} for side in ("start", "end")}
        self.edge = {q: 0 for q in ("rows", "last_filler", "after_rows", "after_real", "first_rows", "before_real")}
        self.filler_counted = 0
        self.prec: dict[str, dict[str, Any]] = {
            role: {"nonzero": 0, "bf16": 0, "fp16": 0, "f32": 0, "ulp2": {"bfloat16": 0.0, "float16": 0.0}}
            for role in ("logprob", "ref_logprob")
        }
        edges = np.linspace(-2.0, 2.0, 81)
        self.hist_edges = edges
        self.hist = {name: np.zeros(len(edges) + 1) for name in ("log_rho", "log_r", "log_rho_engine")}
        self.clip_cut = {"old": 0, "engine": 0}
        self.token_stats: dict[Any, np.ndarray] = {}
        self.mm_max = {"k2": np.full(B, -np.inf), "k3": np.full(B, -np.inf)}
        self.mm_absmax = 0.0
        self.tis_cut, self.band_cut = 0, 0

    def _add_sum(self, name: str, values: np.ndarray, rows: np.ndarray, r0: int, r1: int) -> None:
        """Add per-token ``values`` (1-D, one per counted token, in row order) to per-response sums."""
        s = self.sums.setdefault(name, np.zeros(self.B))
        seg = self._seg if self._seg is not None and self._seg.rows is rows else ident.RowSegments(rows, r1 - r0)
        s[r0:r1] += seg.sums(values)

    def _k(self, d: np.ndarray) -> dict[str, np.ndarray]:
        """k1, k2, k3 of a 1-D float64 array (the kernel's formulas; k3 through its buffer version)."""
        k3 = np.empty_like(d)
        kernel.k3_into(d, k3, np.empty_like(d), np.empty_like(d))
        est: Any = kernel  # the kernel's formulas work on NumPy arrays as on tensors
        return {"k1": est.k1(d), "k2": est.k2(d), "k3": k3}

    def add(self, r0: int, r1: int) -> None:
        src = self.src
        raw: dict[str, np.ndarray] = {
            role: src.rows(role, r0, r1)
            for role in ("logprob", "ref_logprob", "old_logprob", "rollout_logprob")
            if role in src.roles
        }
        m_raw = src.rows("response_mask", r0, r1)
        if m_raw.dtype == np.bool_:
            mask = m_raw
        else:
            ok = (m_raw == 0) | (m_raw == 1)
            if not ok.all():
                bad = m_raw[~ok]
                raise RolloutFileError(
                    f"'{escape_text(src.keys['response_mask'])}' must hold only 0 and 1; found "
                    f"{bad.size} other value(s), e.g. {float(bad[0]):g}"
                )
            mask = m_raw == 1
        lp2, ref2 = raw["logprob"], raw["ref_logprob"]
        self.mask_n[r0:r1] = mask.sum(1)
        # padding and non-finite values
        trl = (lp2 == TRL_INVALID_LOGPROB) & (ref2 == TRL_INVALID_LOGPROB)
        n_trl_in = int(np.count_nonzero(trl & mask))
        self.trl_in += n_trl_in
        self.trl_out += int(np.count_nonzero(trl)) - n_trl_in
        finite = None
        for role, a in raw.items():
            fin = np.isfinite(a)
            if fin.all():
                continue
            bad = mask & ~fin
            nb = int(bad.sum())
            if nb:
                self.nonfinite[role] += nb
                if len(self.examples) < 3:
                    for i, j in np.argwhere(bad)[: 3 - len(self.examples)]:
                        self.examples.append((role, int(i) + r0, int(j), float(a[i, j])))
            finite = fin if finite is None else finite & fin
        valid = mask & ~trl if finite is None else mask & finite & ~trl
        rows, cols = np.nonzero(valid)
        v: dict[str, np.ndarray] = {role: a[rows, cols].astype(np.float64) for role, a in raw.items()}  # counted only
        lp, ref = v["logprob"], v["ref_logprob"]
        old, ro = v.get("old_logprob"), v.get("rollout_logprob")
        for role, x in v.items():
            self.positive[role] += int(np.count_nonzero(x > 1e-3))
        self._seg = ident.RowSegments(rows, r1 - r0)
        self.n[r0:r1] += self._seg.counts
        if old is not None and lp.size:
            self.shift = max(self.shift, float(np.abs(lp - old).max()))
        d = ref - lp
        ks = self._k(d)
        for name, x in ks.items():
            self._add_sum(name, x, rows, r0, r1)
            if x.size:
                mb = float(x.mean())
                self.moments[name].add_moments(x.size, mb, float(np.square(x - mb).sum()))
                self.max_[name] = max(self.max_.get(name, -math.inf), float(x.max()))
                self.min_[name] = min(self.min_.get(name, math.inf), float(x.min()))
                self.neg[name] = self.neg.get(name, 0) + int(np.count_nonzero(x < 0))
        self._add_sum("ratio_policy", np.exp(np.minimum(d, 700.0)), rows, r0, r1)
        # quantile subsample (log r and k3 of the same tokens)
        if d.size:
            if self.p_keep >= 1:
                self.sample.append(d.copy())
                self.sample_k3.append(ks["k3"].copy())
            else:
                rng = np.random.default_rng(r0)
                keep = rng.random(d.size) < self.p_keep
                self.sample.append(d[keep])
                self.sample_k3.append(ks["k3"][keep])
        if self.ident is not None:
            self.ident.add(rows, r0, r1, dict(v), self._seg)
        self._alignment(raw, mask, finite)
        sampler = {"logprob": lp, "old_logprob": old, "rollout_logprob": ro}[self.sampler_role]
        d_s = d if sampler is None or sampler is lp else ref - sampler
        for c in MARKOV_THRESHOLDS:
            hit = rows[d_s >= math.log(c)]
            if hit.size:
                self.markov[c][r0:r1] += np.bincount(hit, minlength=r1 - r0)
        # clamps: only tokens beyond the smallest |log r| at which any clamp can act are looked at
        absd = np.abs(d)
        cand = np.flatnonzero(absd > self.clamp_from)
        if cand.size:
            dt = torch.from_numpy(d[cand])
            raw_k = {k: torch.from_numpy(ks[k][cand]) for k in kernel.ESTIMATORS}
            for label, (rule, name, kind) in self.clamp_defs.items():
                if kind == "input":
                    hit = rule.input_binds(dt, name)
                    without = dataclasses.replace(rule, input_clamp=None)
                    diff = rule.apply(dt, name) - without.apply(dt, name)
                else:
                    hit = rule.output_binds(dt, name)
                    diff = rule.apply(dt, name) - raw_k[name]
                self.clamp_count[label] += int(hit.sum())
                self.clamp_diff[label] += float(diff.sum())
        # very large ratios
        self.n_large += int(np.count_nonzero(absd > LARGE_LOG_RATIO))
        tok_rows = self._token_rows(r0, r1) if self.has_tok else None

        def payload(idx: np.ndarray) -> list:
            return [
                (int(rows[i]) + r0, int(cols[i]), float(d[i]), None if tok_rows is None else tok_rows[rows[i]][cols[i]])
                for i in idx
            ]

        self.top_large.add(absd, payload)
        # positions, from each response's first and last counted token
        has = np.asarray(mask.any(1))
        first = np.where(has, mask.argmax(1), 0)
        last = np.where(has, self.T - 1 - mask[:, ::-1].argmax(1), 0)
        k3 = ks["k3"]
        for side, pv in (("start", cols - first[rows]), ("end", last[rows] - cols)):
            acc = self.pos[side]
            acc["n"] += np.bincount(pv, minlength=self.T)[: self.T]
            for q, vals in (("lr", d), ("lr2", d * d), ("k3", k3), ("k32", k3 * k3), ("k1", ks["k1"])):
                acc[q] += np.bincount(pv, weights=vals, minlength=self.T)[: self.T]
        self._edges(lp2, ref2, mask, has, first, last)
        # storage precision of the two main log-prob tensors
        for role in ("logprob", "ref_logprob"):
            self._precision(role, v[role])
        # the PPO ratio and the engine ratio
        self.hist["log_r"] += self._histogram(d)
        if old is not None:
            lr_old = lp - old  # log rho = log pi - log pi_old, tokens from pi_old
            rho = np.exp(np.clip(lr_old, -700, 700))
            ko = self._k(lr_old)
            d_old = ref - old
            kd = self._k(d_old)
            for name, x in (
                ("rho", rho),
                ("rho_k1", rho * ks["k1"]),
                ("rho_k2", rho * ks["k2"]),
                ("rho_k3", rho * ks["k3"]),
                ("ppo_k1", ko["k1"]),
                ("ppo_k3", ko["k3"]),
                ("old_k1", kd["k1"]),
                ("ratio_old", np.exp(np.clip(d_old, -700, 700))),
            ):
                self._add_sum(name, x, rows, r0, r1)
            self.hist["log_rho"] += self._histogram(lr_old)
            self.clip_cut["old"] += int(np.count_nonzero((rho > 1 + self.clip) | (rho < 1 - self.clip)))
        if ro is not None:
            self._mismatch(lp, old, ro, rows, cols, valid.shape, ks, r0, r1)
        if tok_rows is not None:
            self._tokens(tok_rows, rows, cols, ks)

    def _alignment(self, raw: dict[str, np.ndarray], mask: np.ndarray, finite: np.ndarray | None) -> None:
        """Σ|a[t] − b[t+s]|, s = 0, +1, −1, for each pair of log-prob roles, over positions counted with both
        neighbours: a tensor one position off the other agrees with it far better at s = ±1 than at 0."""
        if mask.shape[1] < 3:
            return
        inner = mask[:, 1:-1] & mask[:, :-2] & mask[:, 2:]
        if finite is not None:
            inner = inner & finite[:, 1:-1] & finite[:, :-2] & finite[:, 2:]
        n_pos = int(np.count_nonzero(inner))
        if n_pos == 0:
            return
        trainer = "old_logprob" if "old_logprob" in raw else "logprob"
        pairs = [("ref_logprob", "logprob")]
        if "old_logprob" in raw:
            pairs.append(("old_logprob", "logprob"))
        if "rollout_logprob" in raw:
            pairs.append(("rollout_logprob", trainer))
        rows_used = int(np.count_nonzero(inner.any(1)))
        for a_role, b_role in pairs:
            a, b = raw[a_role], raw[b_role]
            am = a[:, 1:-1]
            acc = self.align.setdefault(
                f"{a_role}|{b_role}", {"pairs": 0, "rows": 0, "sums": {0: 0.0, 1: 0.0, -1: 0.0}}
            )
            with np.errstate(invalid="ignore", over="ignore"):
                for shift, bm in ((0, b[:, 1:-1]), (1, b[:, 2:]), (-1, b[:, :-2])):
                    diff = np.abs(am - bm, dtype=np.float64)
                    acc["sums"][shift] += float(np.where(inner, diff, 0.0).sum())
            acc["pairs"] += n_pos
            acc["rows"] += rows_used

    def _histogram(self, x: np.ndarray) -> np.ndarray:
        idx = np.searchsorted(self.hist_edges, x, side="right")
        return np.bincount(idx, minlength=len(self.hist_edges) + 1)[: len(self.hist_edges) + 1]

    def _edges(
        self, lp: np.ndarray, ref: np.ndarray, mask: np.ndarray, has: np.ndarray, first: np.ndarray, last: np.ndarray
    ) -> None:
        fin = np.isfinite(lp) & np.isfinite(ref)
        filler = ~fin | ((lp == ref) & ((lp == 0) | (lp == TRL_INVALID_LOGPROB)))
        real = fin & (lp < 0) & (ref < 0) & (lp != ref)
        rows = np.flatnonzero(has)
        e = self.edge
        e["rows"] += rows.size
        self.filler_counted += int((filler & mask).sum())
        e["last_filler"] += int(filler[rows, last[rows]].sum())
        T = self.T
        a = rows[last[rows] + 1 < T]
        after_real = real[a, last[a] + 1]
        after2_ok = np.where(last[a] + 2 < T, filler[a, np.minimum(last[a] + 2, T - 1)], True)
        e["after_rows"] += a.size
        e["after_real"] += int((after_real & after2_ok).sum())
        b = rows[first[rows] >= 1]
        before_real = real[b, first[b] - 1]
        before2_ok = np.where(first[b] >= 2, filler[b, np.maximum(first[b] - 2, 0)], True)
        e["first_rows"] += b.size
        e["before_real"] += int((before_real & before2_ok).sum())

    def _precision(self, role: str, v: np.ndarray) -> None:
        p = self.prec[role]
        stored = self.src.dtypes.get(role, "float32")
        nz = v != 0
        p["nonzero"] += int(np.count_nonzero(nz))
        if stored in _LOW_PRECISION:
            p["ulp2"][stored] += float(np.square(_ulp(v, _LOW_PRECISION[stored])).sum())
            return
        f32 = v.astype(np.float32)
        is32 = f32 == v
        bits = f32.view(np.uint32)
        bf = is32 & ((bits & 0xFFFF) == 0) & nz
        with np.errstate(over="ignore"):
            hf = is32 & (f32.astype(np.float16).astype(np.float32) == f32) & nz
        n_bf, n_hf, n_nz = int(np.count_nonzero(bf)), int(np.count_nonzero(hf)), max(int(np.count_nonzero(nz)), 1)
        p["f32"] += int(np.count_nonzero(is32 & nz))
        p["bf16"] += n_bf
        p["fp16"] += n_hf
        if n_bf > 0.99 * n_nz:
            p["ulp2"]["bfloat16"] += float(np.square(_ulp(v, 8)).sum())
        elif n_hf > 0.99 * n_nz:
            p["ulp2"]["float16"] += float(np.square(_ulp(v, 11)).sum())

    def _mismatch(
        self,
        lp: np.ndarray,
        old: np.ndarray | None,
        ro: np.ndarray,
        rows: np.ndarray,
        cols: np.ndarray,
        shape: tuple[int, int],
        ks: dict[str, np.ndarray],
        r0: int,
        r1: int,
    ) -> None:
        from ..mismatch import SAFETY_BOUND, correction_weights

        trainer = old if old is not None else lp
        lr = trainer - ro  # log pi_old - log pi_rollout, tokens from the engine
        mk = self._k(lr)
        r = np.exp(np.clip(lr, -SAFETY_BOUND, SAFETY_BOUND))
        for name, x in (
            ("mm_k1", mk["k1"]),
            ("mm_k2", mk["k2"]),
            ("mm_k3", mk["k3"]),
            ("mm_r", r),
            ("mm_r2", r * r),
            ("mm_abs_exp", np.exp(np.minimum(np.abs(lr), 700))),
            ("mm_lr", lr),
            ("mm_lr2", lr * lr),
            ("mm_abs", np.abs(lr)),
        ):
            self._add_sum(name, x, rows, r0, r1)
        for k in ("k2", "k3"):
            seg = np.full(r1 - r0, -np.inf)
            np.maximum.at(seg, rows, mk[k])
            self.mm_max[k][r0:r1] = np.maximum(self.mm_max[k][r0:r1], seg)
        if lr.size:
            self.mm_absmax = max(self.mm_absmax, float(np.abs(lr).max()))
        lre = lp - ro  # pi / pi_rollout: the weight that makes the ref KL unbiased
        rho_e = np.exp(np.clip(lre, -700, 700))
        for name, x in (("eng_rho", rho_e), ("eng_rho_k1", rho_e * ks["k1"]), ("eng_rho_k3", rho_e * ks["k3"])):
            self._add_sum(name, x, rows, r0, r1)
        full = np.zeros(shape)
        full[rows, cols] = lr
        vt = np.zeros(shape, dtype=bool)
        vt[rows, cols] = True
        lrt, vtt = torch.from_numpy(full), torch.from_numpy(vt)
        w_tis = correction_weights(lrt, vtt, "token_tis", cap=self.tis_cap).numpy()[rows, cols]
        w_band = correction_weights(lrt, vtt, "token_mask", band=self.mask_band).numpy()[rows, cols]
        self.tis_cut += int(np.count_nonzero(w_tis < r))
        self.band_cut += int(np.count_nonzero(w_band == 0))
        self.hist["log_rho_engine"] += self._histogram(lre)
        self.clip_cut["engine"] += int(np.count_nonzero((rho_e > 1 + self.clip) | (rho_e < 1 - self.clip)))

    def _token_rows(self, r0: int, r1: int) -> Any:
        if "tokens" in self.src.roles:
            t = self.src.rows("tokens", r0, r1)
            return t if t.dtype != object or t.ndim == 2 else np.asarray(t, dtype=object)
        ids = self.src.rows("token_ids", r0, r1).astype(np.int64)
        if self.vocab is None:
            return ids.astype(object)
        return np.asarray(self.vocab(ids), dtype=object).reshape(ids.shape)

    def _tokens(self, tok_rows: Any, rows: np.ndarray, cols: np.ndarray, ks: dict[str, np.ndarray]) -> None:
        t = np.asarray(tok_rows)
        if t.ndim != 2 or rows.size == 0:
            return
        ids = t[rows, cols]
        keys = ids.astype(str) if ids.dtype == object else ids
        uniq, inv = np.unique(keys, return_inverse=True)
        stats = np.stack(
            [np.bincount(inv, minlength=uniq.size).astype(np.float64)]
            + [np.bincount(inv, weights=ks[k], minlength=uniq.size) for k in kernel.ESTIMATORS],
            1,
        )
        for u, row in zip(uniq.tolist(), stats):
            prev = self.token_stats.get(u)
            self.token_stats[u] = row if prev is None else prev + row

    # -- the numbers, once every row has been seen ------------------------------------------------
    def finish(self, groups: np.ndarray | None = None) -> Diagnosis:
        src = self.src
        n, B, T = self.n, self.B, self.T
        kept = n > 0
        total = int(n.sum())
        if total == 0:
            if self.trl_in and not self.mask_n.sum() - self.trl_in:
                raise RolloutFileError(
                    "every counted token holds TRL's padding value 1.0 in both tensors: nothing to "
                    "diagnose (the mask is inverted?)"
                )
            if self.mask_n.sum() == 0:
                raise RolloutFileError(
                    f"'{escape_text(src.keys['response_mask'])}' selects no token: nothing to diagnose"
                )
            raise RolloutFileError("every counted token has a NaN or inf log-prob: nothing left to diagnose")
        lengths_all = self.mask_n[kept]
        lengths = {
            "min": float(lengths_all.min()),
            "median": float(np.median(lengths_all)),
            "max": float(lengths_all.max()),
            "mean": float(lengths_all.mean()),
        }
        off_policy = self.has_old and self.shift > 1e-6
        sample = np.concatenate(self.sample) if self.sample else np.zeros(0)
        sample_k3 = np.concatenate(self.sample_k3) if self.sample_k3 else np.zeros(0)
        quant, share = _sample_quantiles(sample, sample_k3)
        estimates: dict[str, dict[str, float]] = {}
        for name in kernel.ESTIMATORS:
            s = self.sums[name]
            tm, tse = clustered_mean_se_from_sums(s, n)
            sm, sse = mean_se(torch.from_numpy(s[kept]))
            mm, mse = mean_se(torch.from_numpy(s[kept] / n[kept]))
            q = quant[name]
            estimates[name] = {
                "token_mean": tm,
                "token_mean_se": tse,
                "seq_sum_mean": sm,
                "seq_sum_se": sse,
                "seq_token_mean": mm,
                "seq_token_mean_se": mse,
                "token_std": self.moments[name].std,
                "min": self.min_[name],
                "max": self.max_[name],
                "p01": float(q[0]),
                "p50": float(q[1]),
                "p99": float(q[2]),
                "frac_negative": self.neg[name] / total,
            }
        directions: dict[str, str] = {}
        extra: dict[str, dict[str, float]] = {}
        if not off_policy:
            for name in ("k1", "k3"):
                directions[name] = (
                    "KL(π ‖ π_ref), unbiased as far as the engine samples π (tokens sampled by the rollout engine; "
                    "the ρ_e rows of the mismatch section reweight them)"
                    if self.has_ro
                    else "KL(π ‖ π_ref), unbiased (tokens sampled by π)"
                )
            directions["k2"] = "KL(π ‖ π_ref) to second order; biased upward or downward as π and π_ref separate"
        else:
            directions["k1"] = (
                "KL(π_old ‖ π_ref) − KL(π_old ‖ π) on average: neither KL(π ‖ π_ref) nor "
                "KL(π_old ‖ π_ref), because the tokens came from π_old"
            )
            directions["k2"] = "no KL in particular (tokens from π_old, log-probs from π): biased"
            directions["k3"] = "no KL in particular (tokens from π_old, log-probs from π): biased"
            for nm, key, what in (
                ("ppo_kl k1 (old − new)", "ppo_k1", "KL(π_old ‖ π), unbiased: PPO's ppo_kl / approx_kl"),
                ("k3 of π vs π_old", "ppo_k3", "KL(π_old ‖ π), unbiased, ≥ 0"),
                ("ρ·k1, ρ = π/π_old", "rho_k1", "KL(π ‖ π_ref), unbiased with importance weights"),
                ("ρ·k2, ρ = π/π_old", "rho_k2", "KL(π ‖ π_ref) to second order, with importance weights"),
                ("ρ·k3, ρ = π/π_old", "rho_k3", "KL(π ‖ π_ref), unbiased with importance weights"),
                ("sampler k1 (old − ref)", "old_k1", "KL(π_old ‖ π_ref), unbiased"),
            ):
                m_, se_ = clustered_mean_se_from_sums(self.sums[key], n)
                extra[nm] = {"token_mean": m_, "token_mean_se": se_}
                directions[nm] = what
            rm_, rse_ = clustered_mean_se_from_sums(self.sums["rho"], n)
            extra["mean ρ = π/π_old"] = {"token_mean": rm_, "token_mean_se": rse_}
            directions["mean ρ = π/π_old"] = "1 on average when the tokens were sampled by π_old"
        ratio_key = "ratio_old" if off_policy else "ratio_policy"
        mean_ratio = clustered_mean_se_from_sums(self.sums[ratio_key], n)
        agreement = self._agreement(estimates, extra, off_policy, mean_ratio, n)
        clamps: dict[str, dict[str, Any]] = {}
        for label, (rule, name, kind) in self.clamp_defs.items():
            row: dict[str, Any] = {
                "fraction": self.clamp_count[label] / total,
                "count": self.clamp_count[label],
                "mean_shift": self.clamp_diff[label] / total,
                "kind": kind,
                "estimator": name,
                "framework": _framework(rule),
            }
            if kind == "input":
                row["value_can_change"] = input_clamp_changes_value(rule, name)
            clamps[label] = row
        large = [(i, j, v) for _s, (i, j, v, _t) in self.top_large.items]
        diag = Diagnosis(
            source=src.source,
            shape=(B, T),
            dtypes=src.dtypes,
            keys=src.keys,
            n_tokens=total,
            n_sequences=int(kept.sum()),
            n_empty_sequences=int((self.mask_n == 0).sum()),
            lengths=lengths,
            sampler="old policy (old_logprob)" if off_policy else "policy (logprob)",
            off_policy=off_policy,
            max_abs_policy_shift=self.shift if self.has_old else 0.0,
            nonfinite=self.nonfinite,
            nonfinite_examples=self.examples,
            positive_logprobs=self.positive,
            estimates=estimates,
            directions=directions,
            extra=extra,
            mean_ratio=mean_ratio,
            clamps=clamps,
            large_tokens=large,
            n_large=self.n_large,
            k3_top_share=share,
            agreement=agreement,
            step=src.step,
            clip=self.clip,
            quantiles_from=int(sample.size),
            log_r_sample=sample,
            seq_lengths=n[kept].copy(),
            seq_sums={k: self.sums[k][kept].copy() for k in ("k1", "k3")},
            padding={"trl_counted": self.trl_in, "trl_outside": self.trl_out},
        )
        diag.positions = self._positions()
        diag.precision = self._precision_report(estimates)
        diag.ratio = self._ratio_report(total)
        diag.token_report = self._token_report(estimates, total)
        diag.sequences = self._sequence_report(kept)
        if self.has_ro:
            diag.mismatch = self._mismatch_report(n, kept, total, estimates, lengths)
        diag.edges = dict(self.edge, filler_counted=self.filler_counted)
        diag.alignment = {
            pair: {
                "pairs": a["pairs"],
                "rows": a["rows"],
                "mean_abs": {s_: a["sums"][s_] / max(a["pairs"], 1) for s_ in (0, 1, -1)},
            }
            for pair, a in self.align.items()
        }
        diag.tail_bound = self._tail_bound(n)
        diag.who_sampled = self._who_sampled(off_policy)
        if self.ident is not None:
            diag.row_terms = self.ident.finish(groups)
        diag.trouble = find_trouble(diag)
        return diag

    def _tail_bound(self, n: np.ndarray) -> dict[str, Any]:
        """The Markov test: the fraction of tokens with r = π_ref/π_sampler ≥ c, which tokens sampled by the
        sampler keep at most 1/c (E[r] ≤ 1), with a standard error over responses."""
        names = {"logprob": "π", "old_logprob": "π_old", "rollout_logprob": "π_rollout"}
        sampler = names[self.sampler_role]
        return {
            "ratio": f"π_ref/{sampler}",
            "sampler": f"{sampler} ({self.sampler_role})",
            "sequences": int((n > 0).sum()),
            "above": {c: clustered_mean_se_from_sums(self.markov[c], n) for c in MARKOV_THRESHOLDS},
        }

    def _who_sampled(self, off_policy: bool) -> str:
        if self.has_ro:
            trainer = "old_logprob" if self.has_old else "logprob"
            return f"the rollout engine (rollout_logprob); the trainer rescored them ({trainer})" + (
                "; logprob is a later policy π" if off_policy else ""
            )
        if off_policy:
            return "the old policy π_old (old_logprob); logprob is a later policy π"
        if self.has_old:
            return "the policy π (old_logprob equals logprob)"
        return (
            "the policy π (logprob): assumed on-policy (no old_logprob or rollout_logprob key: the first PPO minibatch)"
        )

    def _agreement(
        self, est: dict, extra: dict, off_policy: bool, mean_ratio: tuple[float, float], n: np.ndarray
    ) -> dict[str, Any]:
        """k1 − k3, the mean ratio and k2 − k3, on the rows that estimate KL(π ‖ π_ref) without bias:
        the plain rows on-policy, the ρ-weighted rows off-policy."""
        if off_policy:
            k1, k2, k3 = (extra[f"ρ·{k}, ρ = π/π_old"]["token_mean"] for k in ("k1", "k2", "k3"))
            d13 = clustered_mean_se_from_sums(self.sums["rho_k1"] - self.sums["rho_k3"], n)
            rows = "ρ-weighted rows (ρ = π/π_old)"
            ratio_text = "π_ref/π_old"
        else:
            k1, k2, k3 = (est[k]["token_mean"] for k in ("k1", "k2", "k3"))
            d13 = clustered_mean_se_from_sums(self.sums["k1"] - self.sums["k3"], n)
            rows = "plain rows (tokens sampled by the engine)" if self.has_ro else "plain rows (tokens sampled by π)"
            ratio_text = "π_ref/π"
        return {
            "rows": rows,
            "k1": k1,
            "k2": k2,
            "k3": k3,
            "k1_minus_k3": d13[0],
            "k1_minus_k3_se": d13[1],
            "k2_minus_k3": k2 - k3,
            "mean_ratio": mean_ratio[0],
            "mean_ratio_se": mean_ratio[1],
            "ratio": ratio_text,
        }

    def _positions(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for side, acc in self.pos.items():
            cnt = acc["n"]
            used = np.flatnonzero(cnt > 0)
            top = int(used.max()) + 1 if used.size else 0
            c = cnt[:top]
            safe = np.maximum(c, 1)
            lr_m, k3_m = acc["lr"][:top] / safe, acc["k3"][:top] / safe
            lr_var = np.maximum(acc["lr2"][:top] / safe - lr_m**2, 0) * c / np.maximum(c - 1, 1)
            k3_var = np.maximum(acc["k32"][:top] / safe - k3_m**2, 0) * c / np.maximum(c - 1, 1)
            out[side] = {
                "count": c.astype(int).tolist(),
                "log_r": lr_m.tolist(),
                "log_r_se": np.sqrt(lr_var / safe).tolist(),
                "k3": k3_m.tolist(),
                "k3_se": np.sqrt(k3_var / safe).tolist(),
                "k1": (acc["k1"][:top] / safe).tolist(),
            }
        return out

    def _precision_report(self, est: dict) -> dict[str, Any]:
        out: dict[str, Any] = {}
        bias_total = 0.0
        total = max(int(self.n.sum()), 1)
        for role, p in self.prec.items():
            stored = self.src.dtypes.get(role, "float32")
            nz = max(p["nonzero"], 1)
            effective = stored if stored in _LOW_PRECISION else None
            if effective is None and p["nonzero"] >= 20:
                if p["bf16"] / nz > 0.999:
                    effective = "bfloat16"
                elif p["fp16"] / nz > 0.999:
                    effective = "float16"
            info = {
                "stored": stored,
                "rounded_to": effective,
                "bf16_fraction": p["bf16"] / nz,
                "fp16_fraction": p["fp16"] / nz,
            }
            if effective is not None:
                info["ulp2_mean"] = p["ulp2"][effective] / total
                bias_total += p["ulp2"][effective] / total / 24
            out[role] = info
        out["k3_bias_from_rounding"] = bias_total
        out["k3_token_mean"] = est["k3"]["token_mean"]
        return out

    def _ratio_report(self, total: int) -> dict[str, Any]:
        out: dict[str, Any] = {"clip": self.clip, "edges_log": self.hist_edges.tolist()}
        out["log_r_hist"] = self.hist["log_r"].astype(int).tolist()
        if self.has_old:
            out["log_rho_hist"] = self.hist["log_rho"].astype(int).tolist()
            out["clip_fraction"] = self.clip_cut["old"] / total
        if self.has_ro:
            out["log_rho_engine_hist"] = self.hist["log_rho_engine"].astype(int).tolist()
            out["clip_fraction_engine"] = self.clip_cut["engine"] / total
        return out

    def _token_report(self, est: dict, total: int) -> dict[str, Any]:
        if not self.token_stats:
            return {}
        names = list(self.token_stats)
        stats = np.stack([self.token_stats[k] for k in names])
        out: dict[str, Any] = {"distinct": len(names)}
        for j, k in enumerate(kernel.ESTIMATORS, start=1):
            s_total = float(self.sums[k].sum())
            order = np.argsort(-np.abs(stats[:, j]))[:5]
            out[k] = [
                {
                    "token": escape_text(names[i], 40),
                    "count": int(stats[i, 0]),
                    "sum": float(stats[i, j]),
                    "share": float(stats[i, j]) / s_total if s_total else math.nan,
                    "token_share": float(stats[i, 0]) / total,
                }
                for i in order
            ]
        out["largest_log_r"] = [
            {"row": i, "column": j, "log_r": v, "token": None if t is None else escape_text(t, 40)}
            for _s, (i, j, v, t) in self.top_large.items
        ]
        return out

    def _sequence_report(self, kept: np.ndarray) -> dict[str, Any]:
        out: dict[str, Any] = {}
        rows = np.flatnonzero(kept)
        for k in kernel.ESTIMATORS:
            s = self.sums[k]
            total = float(s[kept].sum())
            order = rows[np.argsort(-np.abs(s[kept]))[:5]]
            out[k] = [
                {
                    "row": int(i),
                    "tokens": int(self.n[i]),
                    "sum": float(s[i]),
                    "share": float(s[i]) / total if total else math.nan,
                }
                for i in order
            ]
        return out

    def _mismatch_report(
        self, n: np.ndarray, kept: np.ndarray, total: int, est: dict, lengths: dict[str, float]
    ) -> dict[str, Any]:
        from ..mismatch import SAFETY_BOUND, log_weight_clamp_rate

        S = self.sums
        out: dict[str, Any] = {
            "trainer": "old_logprob" if self.has_old else "logprob",
            "tokens": total,
            "sequences": int(kept.sum()),
        }
        for k in kernel.ESTIMATORS:
            out[k], out[f"{k}_se"] = clustered_mean_se_from_sums(S[f"mm_{k}"], n)
            out[f"seq_sum_{k}"] = float(S[f"mm_{k}"][kept].mean())
            out[f"seq_mean_{k}"] = float((S[f"mm_{k}"][kept] / n[kept]).mean())
        for k in ("k2", "k3"):
            out[f"seq_max_{k}"] = float(self.mm_max[k][kept].mean())
        out["mean_ratio"], out["mean_ratio_se"] = clustered_mean_se_from_sums(S["mm_r"], n)
        out["chi2_token"] = float(S["mm_r2"].sum()) / total - 1.0
        log_w = S["mm_lr"][kept]
        out["chi2_seq"] = float(np.exp(2 * np.clip(log_w, -SAFETY_BOUND, SAFETY_BOUND)).mean()) - 1.0
        # verl's rollout_corr/ppl_ratio: the mean over responses of each one's ratio (klviz.mismatch.mismatch_metrics)
        out["ppl_ratio"] = float(np.exp(S["mm_k1"][kept] / n[kept]).mean())
        out["token_mult_prob_error"] = float(S["mm_abs_exp"].sum()) / total
        out["abs_diff_mean"], out["abs_diff_max"] = float(S["mm_abs"].sum()) / total, self.mm_absmax
        out["tis_cap"], out["tis_fraction"] = self.tis_cap, self.tis_cut / total
        out["mask_band"], out["mask_fraction"] = list(self.mask_band), self.band_cut / total
        mean_lr = float(S["mm_lr"].sum()) / total
        std_lr = math.sqrt(max(float(S["mm_lr2"].sum()) / total - mean_lr**2, 0.0))
        out["length_x_kl"] = lengths["mean"] * out["k1"]
        out["max_length_x_kl"] = lengths["max"] * out["k1"]
        mean_length: Any = max(lengths["mean"], 1.0)  # a mean length: a float where the function expects counts
        out["log_weight_clamp_rate"] = float(log_weight_clamp_rate(mean_lr, std_lr, mean_length))
        for nm, key in (
            ("ρ_e·k1, ρ_e = π/π_rollout", "eng_rho_k1"),
            ("ρ_e·k3, ρ_e = π/π_rollout", "eng_rho_k3"),
            ("mean ρ_e", "eng_rho"),
        ):
            m_, se_ = clustered_mean_se_from_sums(S[key], n)
            out[nm] = {"token_mean": m_, "token_mean_se": se_}
        return out


def _order_stats(x: np.ndarray, qs: Sequence[float]) -> list[float]:
    """``np.quantile(x, qs)`` (linear interpolation) from one partial sort."""
    n = x.size
    pos = [q * (n - 1) for q in qs]
    idx = sorted({int(math.floor(p)) for p in pos} | {min(int(math.floor(p)) + 1, n - 1) for p in pos})
    part = np.partition(x, idx)
    out = []
    for p in pos:
        lo = int(math.floor(p))
        hi = min(lo + 1, n - 1)
        out.append(float(part[lo] + (part[hi] - part[lo]) * (p - lo)))
    return out


def _sample_quantiles(log_r: np.ndarray, k3: np.ndarray) -> tuple[dict[str, list[float]], float]:
    """The 1 %, 50 % and 99 % quantiles of k1, k2, k3 over the sample, and the share of the k3 sum carried by
    its top 1 % of tokens. k1 = −log r and k2 = ½ (log r)² are monotone in log r and |log r|, so their
    quantiles come from those of log r (k2's interpolated in |log r|); k3 is sorted itself."""
    qs = (0.01, 0.5, 0.99)
    if log_r.size == 0:
        return {k: [math.nan] * 3 for k in kernel.ESTIMATORS}, 0.0
    lr = _order_stats(log_r, [1 - q for q in qs])
    ab = _order_stats(np.abs(log_r), qs)
    k_top = max(1, int(math.ceil(0.01 * k3.size)))
    cut = k3.size - k_top
    pos = [q * (k3.size - 1) for q in qs]
    idx = sorted({cut} | {int(math.floor(p)) for p in pos} | {min(int(math.floor(p)) + 1, k3.size - 1) for p in pos})
    part = np.partition(k3, idx)
    q3 = [float(part[int(p)] + (part[min(int(p) + 1, k3.size - 1)] - part[int(p)]) * (p - int(p))) for p in pos]
    total = float(k3.sum())
    share = float(part[cut:].sum()) / total if total > 0 else 0.0
    return {"k1": [-x for x in lr], "k2": [0.5 * x * x for x in ab], "k3": q3}, share
