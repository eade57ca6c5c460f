"""The analysis behind ``klviz diagnose``: estimates, what each one estimates, clamps and trouble signs.

Per-token values come from :mod:`klviz.kernel`, means and standard errors from :mod:`klviz.statistics`,
the frameworks' clamps from :data:`klviz.framework_rules.CLAMP_RULES`: this module only decides which
of them to compute and what they say about the batch.
"""
from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from .. import kernel
from ..framework_rules import CLAMP_RULES, ClampRule
from ..statistics import clustered_mean_se, mean_se
from .reading import RolloutFileError, RolloutDump

__all__ = ["Diagnosis", "diagnose", "clamp_rows", "LARGE_LOG_RATIO"]

#: A per-token |log r| above this is called "very large" in the report (a ratio beyond e^10 ≈ 22026).
LARGE_LOG_RATIO = 10.0
#: Estimators whose values are never negative, so that a lower output bound at or below 0 never binds.
_NEVER_NEGATIVE = ("k2", "k3")


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
    are the same for every estimator, and its mean shift is measured on k3 (exponential in log r, the
    estimator it moves most), with that clamp alone. An *output* clamp is one row per estimator the rule
    acts on; its mean shift is that of the rule with all its clamps (:meth:`ClampRule.apply`). Rules
    with the same numbers for a row share it (verl's low_var_kl and NeMo-RL on k3): the label names the
    first and adds "(also ...)".
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
        what = (f"log r clamped to ±{input_clamp:g}" if kind == "input"
                else f"{name} clamped to {_bound(name, output_clamp)}")
        also = f" (also {', '.join(_framework(r) for r in members[1:])})" if len(members) > 1 else ""
        rows[f"{_framework(members[0])}: {what}{also}"] = (members[0], name, kind)
    return rows


@dataclass
class Diagnosis:
    """Everything the report says, as numbers (see :func:`diagnose`)."""

    source: str
    shape: tuple[int, int]
    dtypes: dict[str, str]
    keys: dict[str, str]
    n_tokens: int                    # counted, finite tokens
    n_sequences: int                 # sequences with at least one counted token
    n_empty_sequences: int
    lengths: dict[str, float]
    sampler: str                     # "policy" or "old policy"
    off_policy: bool
    max_abs_policy_shift: float      # max |logprob - old_logprob| (0 when on-policy)
    nonfinite: dict[str, int]        # counted tokens with NaN/inf, per role
    nonfinite_examples: list[tuple[str, int, int, float]]
    positive_logprobs: dict[str, int]
    estimates: dict[str, dict[str, float]]      # k1/k2/k3 -> statistics (reference KL)
    directions: dict[str, str]
    extra: dict[str, dict[str, float]]          # other estimates (ppo_kl, importance-weighted, ...)
    mean_ratio: tuple[float, float]             # mean of r = exp(ref - sampler) and its SE
    clamps: dict[str, dict[str, float]]
    large_tokens: list[tuple[int, int, float]]  # (row, column, log r) of the largest |log r|
    n_large: int
    k3_top_share: float                         # share of the k3 sum carried by the top 1% of tokens
    trouble: list[tuple[str, str]] = field(default_factory=list)   # (title, advice)
    # per-token and per-sequence values, kept for plotting
    log_r: torch.Tensor | None = None
    valid: torch.Tensor | None = None

    @property
    def has_nonfinite(self) -> bool:
        return sum(self.nonfinite.values()) > 0


def diagnose(r: RolloutDump) -> Diagnosis:
    """Analyse a batch of rollouts: estimates, their directions, clamps and trouble signs."""
    lp, ref, mask, old = r.logprob, r.ref_logprob, r.mask, r.old_logprob
    roles = {"logprob": lp, "ref_logprob": ref} | ({"old_logprob": old} if old is not None else {})
    finite = torch.ones_like(mask)
    nonfinite: dict[str, int] = {}
    examples: list[tuple[str, int, int, float]] = []
    for role, t in roles.items():
        bad = mask & ~torch.isfinite(t)
        nonfinite[role] = int(bad.sum())
        for i, j in bad.nonzero().tolist()[:3]:
            examples.append((role, i, j, float(t[i, j])))
        finite &= torch.isfinite(t)
    valid = mask & finite
    if not bool(valid.any()):
        raise RolloutFileError("every counted token has a NaN or inf log-prob: nothing left to diagnose")
    positive = {role: int((valid & (t > 1e-3)).sum()) for role, t in roles.items()}

    lengths_all = mask.sum(-1)
    n_i = valid.sum(-1)
    kept = n_i > 0
    lengths = {"min": float(lengths_all[kept].min()), "median": float(lengths_all[kept].double().median()),
               "max": float(lengths_all[kept].max()), "mean": float(lengths_all[kept].double().mean())}

    shift = float((lp - old)[valid].abs().max()) if old is not None else 0.0
    off_policy = old is not None and shift > 1e-6
    sampler_lp = old if off_policy else lp
    sampler = "old policy (old_logprob)" if off_policy else "policy (logprob)"

    zero = torch.zeros((), dtype=torch.float64)
    log_r = torch.where(valid, ref - lp, zero)          # target ref, over the policy: k_n of KL(pi||ref)
    per_token = kernel.estimates(log_r)
    estimates: dict[str, dict[str, float]] = {}
    vals_masked = {}
    for name, v in per_token.items():
        tm, tse = clustered_mean_se(v, valid)
        seq_sum = torch.where(valid, v, zero).sum(-1)[kept]
        seq_mean = seq_sum / n_i[kept]
        sm, sse = mean_se(seq_sum)
        mm, mse = mean_se(seq_mean)
        x = v[valid]
        vals_masked[name] = x
        q = torch.quantile(x, torch.tensor([0.01, 0.5, 0.99], dtype=torch.float64)) if x.numel() <= 16_000_000 else None
        estimates[name] = {
            "token_mean": tm, "token_mean_se": tse, "seq_sum_mean": sm, "seq_sum_se": sse,
            "seq_token_mean": mm, "seq_token_mean_se": mse, "token_std": float(x.std()) if x.numel() > 1 else 0.0,
            "min": float(x.min()), "max": float(x.max()),
            "p01": float(q[0]) if q is not None else math.nan, "p50": float(q[1]) if q is not None else math.nan,
            "p99": float(q[2]) if q is not None else math.nan,
            "frac_negative": float((x < 0).double().mean()),
        }

    directions: dict[str, str] = {}
    extra: dict[str, dict[str, float]] = {}
    if not off_policy:
        for name in ("k1", "k3"):
            directions[name] = "KL(π ‖ π_ref), unbiased (tokens sampled by π)"
        directions["k2"] = "KL(π ‖ π_ref) to second order; biased upward or downward as π and π_ref separate"
    else:
        directions["k1"] = ("KL(π_old ‖ π_ref) − KL(π_old ‖ π) on average: neither KL(π ‖ π_ref) nor KL(π_old ‖ π_ref), "
                            "because the tokens came from π_old")
        directions["k2"] = "no KL in particular (tokens from π_old, log-probs from π): biased"
        directions["k3"] = "no KL in particular (tokens from π_old, log-probs from π): biased"
        rho = torch.where(valid, torch.exp(lp - old), zero)
        lr_old = torch.where(valid, lp - old, zero)           # target π, sampler π_old
        for nm, vals, what in (
            ("ppo_kl k1 (old − new)", kernel.k1(lr_old), "KL(π_old ‖ π), unbiased: PPO's ppo_kl / approx_kl"),
            ("k3 of π vs π_old", kernel.k3(lr_old), "KL(π_old ‖ π), unbiased, ≥ 0"),
            ("ρ·k1, ρ = π/π_old", rho * per_token["k1"], "KL(π ‖ π_ref), unbiased with importance weights"),
            ("ρ·k3, ρ = π/π_old", rho * per_token["k3"], "KL(π ‖ π_ref), unbiased with importance weights"),
            ("sampler k1 (old − ref)", kernel.k1(torch.where(valid, ref - old, zero)), "KL(π_old ‖ π_ref), unbiased"),
        ):
            m, se = clustered_mean_se(vals, valid)
            extra[nm] = {"token_mean": m, "token_mean_se": se}
            directions[nm] = what
        rm, rse = clustered_mean_se(rho, valid)
        extra["mean ρ = π/π_old"] = {"token_mean": rm, "token_mean_se": rse}
        directions["mean ρ = π/π_old"] = "1 on average when the tokens were sampled by π_old"

    ratio = torch.where(valid, torch.exp(ref - sampler_lp), zero)
    mean_ratio = clustered_mean_se(ratio, valid)

    d = log_r[valid]
    clamps = {}
    for label, (rule, name, kind) in clamp_rows().items():
        if kind == "input":
            hit = rule.input_binds(d, name)
            clamped = kernel.estimate(name, rule.clamp_input(d, name))
        else:
            hit = rule.output_binds(d, name)
            clamped = rule.apply(d, name)
        shift_mean = float(clamped.mean()) - float(vals_masked[name].mean())
        clamps[label] = {"fraction": float(hit.double().mean()), "count": int(hit.sum()), "mean_shift": shift_mean}

    absd = log_r.abs().masked_fill(~valid, -1.0)
    n_large = int((absd > LARGE_LOG_RATIO).sum())
    top = torch.topk(absd.flatten(), k=min(5, int(valid.sum())))
    width = lp.shape[1]
    large = [(int(i) // width, int(i) % width, float(log_r.flatten()[i])) for i in top.indices if absd.flatten()[i] >= 0]
    k3v = vals_masked["k3"]
    k_top = max(1, int(math.ceil(0.01 * k3v.numel())))
    k3_sum = float(k3v.sum())
    share = float(torch.topk(k3v, k_top).values.sum()) / k3_sum if k3_sum > 0 else 0.0

    diag = Diagnosis(
        source=r.source, shape=r.shape, dtypes=r.dtypes, keys=r.keys, n_tokens=int(valid.sum()),
        n_sequences=int(kept.sum()), n_empty_sequences=int((mask.sum(-1) == 0).sum()), lengths=lengths,
        sampler=sampler, off_policy=off_policy, max_abs_policy_shift=shift, nonfinite=nonfinite,
        nonfinite_examples=examples, positive_logprobs=positive, estimates=estimates, directions=directions,
        extra=extra, mean_ratio=mean_ratio, clamps=clamps, large_tokens=large, n_large=n_large,
        k3_top_share=share, log_r=log_r, valid=valid)
    diag.trouble = _trouble(diag)
    return diag


def _trouble(d: Diagnosis) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    if d.has_nonfinite:
        parts = ", ".join(f"{n} in '{d.keys.get(role, role)}'" for role, n in d.nonfinite.items() if n)
        ex = "; ".join(f"{role}[{i}, {j}] = {v}" for role, i, j, v in d.nonfinite_examples[:3])
        out.append((f"NaN or inf log-probs at counted tokens ({parts}; e.g. {ex})",
                    "These tokens were left out of every number above. A -inf reference log-prob means the reference "
                    "gives the token probability 0, so KL(π‖π_ref) is infinite there; NaN usually comes from an "
                    "overflow in the forward pass or from a mask that does not cover padding. Fix the source before "
                    "trusting the KL."))
    pos = {k: v for k, v in d.positive_logprobs.items() if v}
    if pos:
        out.append((f"positive log-probs ({', '.join(f'{v} in {k}' for k, v in pos.items())})",
                    "A log-probability is ≤ 0. Positive values mean these are logits, scores or log-probs summed "
                    "with something else: check which tensor you saved."))
    if d.n_large:
        worst = ", ".join(f"[{i}, {j}] log r = {v:+.1f}" for i, j, v in d.large_tokens[:3])
        out.append((f"{d.n_large} token(s) with |log r| > {LARGE_LOG_RATIO:g} (largest: {worst})",
                    "A ratio beyond e^10 means policy and reference disagree completely on these tokens. k3 grows like "
                    "e^|log r| when log r > 0 and the frameworks' clamps start to bind (see the clamp table); k1 stays "
                    "linear. Look at these tokens: often a special token, a tokenizer mismatch, or a prompt token "
                    "that the mask should have excluded."))
    k1 = d.estimates["k1"]
    if k1["token_mean"] < 0:
        z = -k1["token_mean"] / k1["token_mean_se"] if k1["token_mean_se"] > 0 else math.inf
        shown = f"{k1['token_mean']:.4g} ± {2 * k1['token_mean_se']:.2g}"
        if d.off_policy:
            out.append((f"the k1 mean is negative ({shown})",
                        "Expected off-policy: on π_old's tokens E[log π − log π_ref] = KL(π_old‖π_ref) − KL(π_old‖π), "
                        "which is negative once π has moved further from π_old than π_old is from π_ref. It is not a KL; "
                        "use the ρ-weighted rows."))
        elif z > 3:
            out.append((f"the k1 mean is negative beyond noise ({shown})",
                        "On-policy, E[k1] = KL(π‖π_ref) ≥ 0, so a clearly negative mean says the tokens were not "
                        "drawn from the distribution whose log-probs you saved: sampling temperature, top-p/top-k, a "
                        "different inference engine (vLLM vs the trainer), or stale/off-policy tokens."))
        else:
            out.append((f"the k1 mean is negative but within noise ({shown})",
                        "Expected when π and π_ref are close: k1 is negative on every token π_ref likes more than π, "
                        "and the true KL is small next to the noise. Nothing is wrong; k3 is never negative."))
    rm, rse = d.mean_ratio
    if math.isfinite(rse) and abs(rm - 1) > max(4 * rse, 0.01):
        out.append((f"the mean ratio r = π_ref/π_sampler is {rm:.4f} ± {2 * rse:.2g}, not 1",
                    "E[r] = 1 exactly when the tokens are samples of the sampler's distribution, so k1 and k3 (whose "
                    "difference is 1 − r) disagree here by more than noise. The saved log-probs do not describe the "
                    "distribution the tokens were drawn from (temperature, top-p, engine mismatch), or the reference "
                    "misses part of the support. Treat the k3 value with care."))
    k3 = d.estimates["k3"]
    if k3["token_std"] > 2 * k1["token_std"] or d.k3_top_share > 0.5:
        out.append((f"k3 is heavy-tailed (per-token std {k3['token_std']:.3g} vs k1's {k1['token_std']:.3g}; "
                    f"top 1% of tokens carry {100 * d.k3_top_share:.0f}% of its sum)",
                    "k3 = r − 1 − log r contains r = π_ref/π, exponential in log r: on tokens that π_ref finds "
                    "far likelier than π, one token outweighs hundreds (for Gaussians Var k3 grows like e^{μ²}). "
                    "The batch value then rests on a few tokens; k1 is the steadier number to log here, or look at "
                    "those tokens."))
    if d.off_policy:
        out.append((f"the tokens were sampled by π_old, not π (max |logprob − old_logprob| = {d.max_abs_policy_shift:.3g})",
                    "k1/k2/k3 of logprob vs ref_logprob then estimate no KL exactly; weight by ρ = π/π_old (the ρ·k rows) "
                    "for KL(π‖π_ref), or compare old_logprob with ref_logprob for KL(π_old‖π_ref)."))
    if d.n_empty_sequences:
        out.append((f"{d.n_empty_sequences} sequence(s) have no counted token",
                    "They are left out of the per-sequence means (as recent verl does); check that the mask is not "
                    "shifted by one or empty for truncated responses."))
    ks = d.estimates
    if all(abs(ks[k]["max"]) == 0 and abs(ks[k]["min"]) == 0 for k in ks):
        out.append(("policy and reference log-probs are identical",
                    "KL = 0: expected at step 0, before the first update. Later it means the reference is the policy "
                    "itself (or the same tensor was saved twice)."))
    return out
