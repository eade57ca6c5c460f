"""The plain-text report ``klviz diagnose`` prints, from a :class:`~klviz.diagnose.analysis.Diagnosis`."""
from __future__ import annotations

import math

from .analysis import Diagnosis

__all__ = ["format_report"]


def _fmt(x: float) -> str:
    if not math.isfinite(x):
        return "  n/a" if math.isnan(x) else str(x)
    return f"{x:.4g}"


def format_report(d: Diagnosis) -> str:
    """The plain-text report ``klviz diagnose`` prints."""
    b, t = d.shape
    lines = [
        f"klviz diagnose: {d.source}",
        f"  shape [batch {b}, tokens {t}]; dtypes " + ", ".join(f"{d.keys.get(k, k)}={v}" for k, v in d.dtypes.items()),
        f"  counted tokens {d.n_tokens:,} in {d.n_sequences} sequences; response length min {d.lengths['min']:.0f}, "
        f"median {d.lengths['median']:.0f}, max {d.lengths['max']:.0f}",
        f"  tokens sampled by: {d.sampler}"
        + ("" if d.off_policy or "old_logprob" in d.keys else " (no old_logprob key: assumed on-policy, the first PPO minibatch)"),
        "",
        "Per-token estimates with log r = ref_logprob − logprob  (mean ± 2 SE; SE counts sequences as the independent units)"
        + ("\n  (tokens from π_old: these are biased, see 'Off-policy estimates')" if d.off_policy else ""),
        f"  {'':4}{'token-mean':>22}{'seq-mean-token-mean':>24}{'seq-mean-token-sum':>24}{'std/token':>11}"
        f"{'p1':>11}{'p50':>11}{'p99':>11}{'max':>11}",
    ]
    for k in ("k1", "k2", "k3"):
        e = d.estimates[k]
        lines.append(
            f"  {k:4}{_fmt(e['token_mean']) + ' ± ' + _fmt(2 * e['token_mean_se']):>22}"
            f"{_fmt(e['seq_token_mean']) + ' ± ' + _fmt(2 * e['seq_token_mean_se']):>24}"
            f"{_fmt(e['seq_sum_mean']) + ' ± ' + _fmt(2 * e['seq_sum_se']):>24}{_fmt(e['token_std']):>11}"
            f"{_fmt(e['p01']):>11}{_fmt(e['p50']):>11}{_fmt(e['p99']):>11}{_fmt(e['max']):>11}")
    lines += ["  (verl's kl_loss with loss_agg_mode token-mean is the first column; verl's in-reward metric "
              "actor/reward_kl_penalty is the second; TRL PPO's logged KL is the third, a sequence KL)", "",
              "What each number estimates"]
    for k, what in d.directions.items():
        lines.append(f"  {k}: {what}")
    if d.extra:
        lines += ["", "Off-policy estimates (tokens from π_old)"]
        for k, e in d.extra.items():
            lines.append(f"  {k:26} {_fmt(e['token_mean'])} ± {_fmt(2 * e['token_mean_se'])}")
    e1, e2, e3 = (d.estimates[k] for k in ("k1", "k2", "k3"))
    rm, rse = d.mean_ratio
    lines += ["", "Agreement between estimators",
              f"  k1 − k3 (token-mean) = {_fmt(e1['token_mean'] - e3['token_mean'])} = mean(1 − π_ref/π) over the tokens",
              f"  mean of π_ref/π_sampler = {rm:.4f} ± {_fmt(2 * rse)} (1 in expectation when the tokens are samples of "
              "the sampler whose log-probs you saved)",
              f"  k2 − k3 = {_fmt(e2['token_mean'] - e3['token_mean'])} (k2's bias; third order in log r when π ≈ π_ref)",
              f"  k1 negative on {100 * e1['frac_negative']:.1f}% of tokens (expected: the tokens π_ref prefers)", "",
              "Clamps: fraction of counted tokens each framework's clamp would alter, and how much it moves the token-mean",
              "  (clamped minus unclamped; verl's second row is low_var_kl with both of its clamps)"]
    for label, c in d.clamps.items():
        lines.append(f"  {label:52} {100 * c['fraction']:7.3f}%  ({c['count']} tokens)  mean shift {c['mean_shift']:+.3g}")
    lines += ["", "Trouble signs"]
    if not d.trouble:
        lines.append("  none found: finite log-probs, no huge ratios, estimators agree within noise.")
    for i, (title, advice) in enumerate(d.trouble, 1):
        lines.append(f"  {i}. {title}")
        lines.append(f"     → {advice}")
    return "\n".join(lines)
