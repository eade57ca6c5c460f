"""The reports ``klviz diagnose`` writes: plain text (:func:`format_report`), JSON (:func:`report_json`), and
the trend across the dumps of a run (:func:`format_series`, :func:`series_json`).

The JSON schema is versioned (:data:`SCHEMA_VERSION`) and documented in the rollout-format guide
(``klviz/docs/rollout_format.md``, section "The JSON report").
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .analysis import Diagnosis
from .reading import escape_text

__all__ = ["format_report", "report_json", "format_series", "series_json", "SCHEMA", "SCHEMA_VERSION"]

#: Name and version of the JSON report's schema (bump the version when a field changes meaning).
SCHEMA = "klviz.diagnose.report"
SCHEMA_VERSION = 1
_AGG = (
    ("token-mean", "token_mean", "token_mean_se"),
    ("seq-mean-token-mean", "seq_token_mean", "seq_token_mean_se"),
    ("seq-mean-token-sum", "seq_sum_mean", "seq_sum_se"),
)


def _fmt(x: float) -> str:
    if x is None or not math.isfinite(x):
        return "  n/a" if x is None or math.isnan(x) else str(x)
    return f"{x:.4g}"


def _fixed(x: float, spec: str = ".4f") -> str:
    """``x`` in ``spec`` when it is an ordinary number; extreme or non-finite values as :func:`_fmt` writes them."""
    return _fmt(x) if x is None or not math.isfinite(x) or abs(x) >= 1e6 else format(x, spec)


def _pct(fraction: float, spec: str = ".0f") -> str:
    return "n/a" if fraction is None or not math.isfinite(fraction) else f"{100 * fraction:{spec}}%"


def _pm(x: float, se: float) -> str:
    return f"{_fmt(x)} ± {_fmt(2 * se)}"


def _positions_lines(d: Diagnosis) -> list[str]:
    st, en = d.positions.get("start"), d.positions.get("end")
    if not st or not st["count"] or not en:
        return []
    lines = [
        "",
        "Per position (mean ± 2 SE over the responses that reach it; a shifted mask, EOS trouble and drift show here)",
        f"  {'position':>18}{'tokens':>9}  {'log r':>24}  {'k3':>24}",
    ]

    def row(label: str, side: dict, i: int) -> str:
        return (
            f"  {label:>18}{side['count'][i]:>9}  {_pm(side['log_r'][i], side['log_r_se'][i]):>24}"
            f"  {_pm(side['k3'][i], side['k3_se'][i]):>24}"
        )

    n = len(st["count"])
    for i in range(min(4, n)):
        lines.append(
            row(f"{i + 1}st" if i == 0 else f"{i + 1}nd" if i == 1 else f"{i + 1}rd" if i == 2 else f"{i + 1}th", st, i)
        )
    if n > 8:
        edges = np.unique(np.geomspace(4, n, 6).astype(int))
        for a, b in zip(edges[:-1], edges[1:]):
            c = np.asarray(st["count"][a:b], dtype=float)
            if c.sum() == 0:
                continue
            lr = float(np.dot(c, st["log_r"][a:b]) / c.sum())
            k3 = float(np.dot(c, st["k3"][a:b]) / c.sum())
            lines.append(f"  {f'{a + 1}–{b}':>18}{int(c.sum()):>9}  {_fmt(lr):>24}  {_fmt(k3):>24}")
    for i in range(min(3, len(en["count"]))):
        lines.append(row("last" if i == 0 else f"last − {i}", en, i))
    return lines


def format_report(d: Diagnosis) -> str:
    """The plain-text report ``klviz diagnose`` prints."""
    b, t = d.shape
    keyname = lambda role: escape_text(d.keys.get(role, role))  # noqa: E731
    lines = [
        f"klviz diagnose: {escape_text(d.source, 200)}" + (f"  (step {d.step:g})" if d.step is not None else ""),
        f"  shape [batch {b}, tokens {t}]; dtypes " + ", ".join(f"{keyname(k)}={v}" for k, v in d.dtypes.items()),
        f"  counted tokens {d.n_tokens:,} in {d.n_sequences} sequences; response length min {d.lengths['min']:.0f}, "
        f"median {d.lengths['median']:.0f}, max {d.lengths['max']:.0f}",
        f"  tokens sampled by: {d.who_sampled or d.sampler}",
        "",
        "Per-token estimates with log r = ref_logprob − logprob  "
        "(mean ± 2 SE; SE counts sequences as the independent units)"
        + ("\n  (tokens from π_old: these are biased, see 'Off-policy estimates')" if d.off_policy else "")
        + (
            "\n  (tokens from the rollout engine: unbiased for KL(π ‖ π_ref) only as far as the engine samples π; "
            "see 'Engine–trainer mismatch')"
            if d.mismatch
            else ""
        ),
        f"  {'':4}{'token-mean':>22}{'seq-mean-token-mean':>24}{'seq-mean-token-sum':>24}{'std/token':>11}"
        f"{'p1':>11}{'p50':>11}{'p99':>11}{'max':>11}",
    ]
    for k in ("k1", "k2", "k3"):
        e = d.estimates[k]
        lines.append(
            f"  {k:4}{_pm(e['token_mean'], e['token_mean_se']):>22}"
            f"{_pm(e['seq_token_mean'], e['seq_token_mean_se']):>24}"
            f"{_pm(e['seq_sum_mean'], e['seq_sum_se']):>24}{_fmt(e['token_std']):>11}"
            f"{_fmt(e['p01']):>11}{_fmt(e['p50']):>11}{_fmt(e['p99']):>11}{_fmt(e['max']):>11}"
        )
    if d.quantiles_from < d.n_tokens:
        lines.append(f"  (quantiles from a uniform subsample of {d.quantiles_from:,} tokens)")
    lines += [
        "  (verl's kl_loss with loss_agg_mode token-mean is the first column; verl's in-reward metric "
        "actor/reward_kl_penalty is the second; TRL PPO's logged KL is the third, a sequence KL)",
        "",
        "What each number estimates",
    ]
    for k, what in d.directions.items():
        lines.append(f"  {k}: {what}")
    if d.extra:
        lines += ["", "Off-policy estimates (tokens from π_old)"]
        for k, e in d.extra.items():
            lines.append(f"  {k:26} {_pm(e['token_mean'], e['token_mean_se'])}")
    a = d.agreement
    lines += [
        "",
        f"Agreement between estimators (on the {a['rows']}, which estimate KL(π ‖ π_ref))",
        f"  k1 − k3 (token-mean) = {_pm(a['k1_minus_k3'], a['k1_minus_k3_se'])} = mean"
        + ("(ρ (1 − π_ref/π))" if d.off_policy else "(1 − π_ref/π)")
        + " over the tokens (0 in expectation)",
        f"  mean of {a['ratio']} = {_fixed(a['mean_ratio'])} ± {_fmt(2 * a['mean_ratio_se'])} (1 in expectation when "
        "the tokens are samples of the sampler whose log-probs you saved)",
        f"  k2 − k3 = {_fmt(a['k2_minus_k3'])} (k2's bias; third order in log r when π ≈ π_ref)",
    ]
    if not d.off_policy:
        lines.append(
            f"  k1 negative on {100 * d.estimates['k1']['frac_negative']:.1f}% of tokens (expected: the tokens "
            "π_ref prefers)"
        )
    lines += [
        "",
        "Clamps: fraction of counted tokens each framework's clamp would alter, and how much it moves the token-mean",
        "  (output rows: the rule with all its clamps minus the raw estimator; input rows: the rule minus the same "
        "rule without its input clamp)",
    ]
    for label, c in d.clamps.items():
        line = f"  {label:52} {100 * c['fraction']:7.3f}%  ({c['count']} tokens)"
        if c["kind"] == "input" and not c.get("value_can_change", True):
            line += "  forward value cannot change (the output clamp binds there too); it only zeroes these gradients"
        else:
            line += f"  mean shift {_fixed(c['mean_shift'], '+.3g')}"
        lines.append(line)
    lines += _positions_lines(d)
    r = d.ratio
    lines += ["", "Ratios"]
    if "clip_fraction" in r:
        lines.append(
            f"  PPO ratio ρ = π/π_old outside 1 ± {d.clip:g} (cut by the clip): {100 * r['clip_fraction']:.2f}% "
            "of tokens"
        )
    else:
        lines.append("  no old_logprob: on the first PPO minibatch ρ = π/π_old = 1 and the clip cuts nothing")
    if "clip_fraction_engine" in r:
        lines.append(
            f"  π/π_rollout outside 1 ± {d.clip:g} (what the clip would cut if π_old were the engine's): "
            f"{100 * r['clip_fraction_engine']:.2f}%"
        )
    p = d.precision
    lines += ["", "Precision of the stored log-probs"]
    for role in ("logprob", "ref_logprob"):
        info = p.get(role, {})
        if info.get("rounded_to"):
            how = (
                "stored as"
                if info["stored"] == info["rounded_to"]
                else f"stored as {info['stored']}, values rounded to"
            )
            lines.append(f"  {keyname(role)}: {how} {info['rounded_to']}")
        else:
            lines.append(f"  {keyname(role)}: {info.get('stored', '?')}")
    if p.get("k3_bias_from_rounding"):
        lines.append(
            f"  storage rounding biases k2 and k3 by about +{p['k3_bias_from_rounding']:.3g} nats/token "
            "(k1 is unbiased)"
        )
    tr = d.token_report
    if tr:
        lines += ["", f"Tokens that dominate each estimate ({tr['distinct']:,} distinct tokens)"]
        for k in ("k1", "k3"):
            parts = [
                f"{x['token']!r} {_pct(x['share'])} of the sum in {_pct(x['token_share'], '.1f')} of tokens"
                for x in tr[k][:3]
            ]
            lines.append(f"  {k}: " + "; ".join(parts))
    if d.sequences:
        parts = [f"row {x['row']} ({x['tokens']} tokens) {_pct(x['share'])}" for x in d.sequences["k3"][:3]]
        lines += ["", "Sequences that carry the most of the k3 sum: " + ", ".join(parts)]
    mm = d.mismatch
    if mm:
        lines += [
            "",
            f"Engine–trainer mismatch (tokens from the engine's π_rollout; trainer = {mm['trainer']}; "
            "log r = trainer − engine)",
            f"  per token: k1 {_pm(mm['k1'], mm['k1_se'])}, k2 {_pm(mm['k2'], mm['k2_se'])}, "
            f"k3 {_pm(mm['k3'], mm['k3_se'])}  (KL(π_rollout ‖ π_old))",
            f"  per sequence: k1 sum {_fmt(mm['seq_sum_k1'])}, k3 sum {_fmt(mm['seq_sum_k3'])}, max k3 "
            f"{_fmt(mm['seq_max_k3'])}",
            f"  χ² per token {_fmt(mm['chi2_token'])}, per sequence {_fmt(mm['chi2_seq'])}; perplexity ratio "
            f"{_fixed(mm['ppl_ratio'])}; token_mult_prob_error {_fixed(mm['token_mult_prob_error'])}",
            f"  E[π_old/π_rollout] = {_fixed(mm['mean_ratio'])} ± {_fmt(2 * mm['mean_ratio_se'])} (1 unless the engine "
            "truncates the support)",
            f"  a TIS cap of {mm['tis_cap']:g} changes {100 * mm['tis_fraction']:.3f}% of tokens; a mask band "
            f"[{mm['mask_band'][0]:g}, {mm['mask_band'][1]:g}] drops {100 * mm['mask_fraction']:.3f}%",
            f"  length × KL: mean {_fmt(mm['length_x_kl'])}, longest {_fmt(mm['max_length_x_kl'])} nats; "
            f"P(|log W| > 20) ≈ {_fmt(mm['log_weight_clamp_rate'])}",
        ]
        for k in ("ρ_e·k1, ρ_e = π/π_rollout", "ρ_e·k3, ρ_e = π/π_rollout", "mean ρ_e"):
            lines.append(f"  {k:26} {_pm(mm[k]['token_mean'], mm[k]['token_mean_se'])}")
        lines.append(
            "  the reference-KL rows above treat π_old as the sampler: the mismatch biases them (and the policy "
            "gradient); the ρ_e rows correct the reference KL."
        )
    if d.logged:
        lines += [
            "",
            "Logged values (each formula recomputed exactly on this dump; equal means within the framework's "
            "floating-point rounding)",
        ]
        for item in d.logged:
            lines += logged_lines(item)
    lines += ["", "Trouble signs"]
    if not d.trouble:
        lines.append("  none found: finite log-probs, no huge ratios, estimators agree within noise.")
    for i, tr_ in enumerate(d.trouble, 1):
        lines.append(f"  {i}. [{tr_.severity}] {tr_.message}")
        lines.append(f"     → {tr_.advice}")
    return "\n".join(lines)


def logged_lines(item: dict[str, Any], indent: str = "  ") -> list[str]:
    """The text lines of one identified logged value."""
    name = escape_text(item["name"])
    status = {True: "equal", False: "NOT equal", None: "cannot check"}[item["consistent"]]
    out = [f"{indent}{name} = {item['value']:.10g}: {status}; {item['note']}"]
    ob = item.get("other_batch")
    if ob:
        out.append(
            f"{indent}  if it was logged from another batch of this run (a standard-error reading, not an identity): "
            f"{ob['z']:+.1f} SE from {ob['formula']} on this batch ({'within' if ob['within_3se'] else 'beyond'} 3 SE)"
        )
    return out


def _clean(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, np.ndarray):
        return _clean(x.tolist())
    if isinstance(x, (np.floating, float)):
        v = float(x)
        return v if math.isfinite(v) else None
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.bool_,)):
        return bool(x)
    return x


def _unbiased(d: Diagnosis, name: str) -> bool:
    return not d.off_policy and name in ("k1", "k3")


def report_json(d: Diagnosis) -> dict[str, Any]:
    """The JSON report (a dict ready for ``json.dumps``; non-finite numbers are ``null``)."""
    from .. import __version__

    what = {k: d.directions.get(k) for k in ("k1", "k2", "k3")}
    estimates = []
    for k, e in d.estimates.items():
        for agg, key, se in _AGG:
            estimates.append(
                {
                    "name": k,
                    "aggregation": agg,
                    "value": e[key],
                    "se": e[se],
                    "estimates": ("KL(π ‖ π_ref)" + (" per sequence" if agg == "seq-mean-token-sum" else ""))
                    if not d.off_policy
                    else None,
                    "unbiased": _unbiased(d, k),
                    "description": what[k],
                    "section": "per_token",
                }
            )
    for k, e in d.extra.items():
        estimates.append(
            {
                "name": k,
                "aggregation": "token-mean",
                "value": e["token_mean"],
                "se": e["token_mean_se"],
                "estimates": d.directions.get(k),
                "unbiased": "unbiased" in (d.directions.get(k) or ""),
                "description": d.directions.get(k),
                "section": "off_policy",
            }
        )
    if d.mismatch:
        for k in ("k1", "k2", "k3"):
            estimates.append(
                {
                    "name": f"mismatch {k}",
                    "aggregation": "token-mean",
                    "value": d.mismatch[k],
                    "se": d.mismatch[f"{k}_se"],
                    "estimates": "KL(π_rollout ‖ π_old)",
                    "unbiased": k != "k2",
                    "description": "engine vs trainer",
                    "section": "mismatch",
                }
            )
    out = {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "klviz_version": __version__,
        "source": d.source,
        "step": d.step,
        "shape": list(d.shape),
        "dtypes": d.dtypes,
        "keys": d.keys,
        "counts": {
            "tokens": d.n_tokens,
            "sequences": d.n_sequences,
            "empty_sequences": d.n_empty_sequences,
            "lengths": d.lengths,
            "quantiles_from": d.quantiles_from,
        },
        "sampler": d.sampler,
        "who_sampled": d.who_sampled,
        "off_policy": d.off_policy,
        "max_abs_policy_shift": d.max_abs_policy_shift,
        "estimates": estimates,
        "sections": {
            "per_token": d.estimates,
            "directions": d.directions,
            "off_policy": d.extra,
            "agreement": d.agreement,
            "clamps": [{"label": label, **c} for label, c in d.clamps.items()],
            "positions": d.positions,
            "precision": d.precision,
            "ratio": d.ratio,
            "tokens": d.token_report,
            "sequences": d.sequences,
            "mismatch": d.mismatch or None,
            "large_log_ratio": {
                "count": d.n_large,
                "largest": [{"row": i, "column": j, "log_r": v} for i, j, v in d.large_tokens],
            },
            "nonfinite": {
                "counts": d.nonfinite,
                "examples": [{"key": r, "row": i, "column": j, "value": str(v)} for r, i, j, v in d.nonfinite_examples],
            },
            "padding": d.padding,
            "positive_logprobs": d.positive_logprobs,
            "alignment": d.alignment,
            "tail_bound": {
                "ratio": d.tail_bound.get("ratio"),
                "sampler": d.tail_bound.get("sampler"),
                "above": [
                    {"c": c, "fraction": f, "se": se, "allowed": 1.0 / c}
                    for c, (f, se) in d.tail_bound.get("above", {}).items()
                ],
            }
            if d.tail_bound
            else None,
            "edges": d.edges,
        },
        "trouble": [
            {"code": t.code, "severity": t.severity, "message": t.message, "advice": t.advice} for t in d.trouble
        ],
        "logged": d.logged,
    }
    return _clean(out)


# -- a run: several dumps ------------------------------------------------------------------------

_TREND = (
    ("k1", lambda d: (d.estimates["k1"]["token_mean"], d.estimates["k1"]["token_mean_se"])),
    ("k3", lambda d: (d.estimates["k3"]["token_mean"], d.estimates["k3"]["token_mean_se"])),
    ("k3 seq-sum", lambda d: (d.estimates["k3"]["seq_sum_mean"], d.estimates["k3"]["seq_sum_se"])),
    ("mean r", lambda d: d.mean_ratio),
)


def _trend_values(d: Diagnosis) -> dict[str, tuple[float, float]]:
    vals = {name: fn(d) for name, fn in _TREND}
    if "ρ·k3, ρ = π/π_old" in d.extra:
        e = d.extra["ρ·k3, ρ = π/π_old"]
        vals["ρ·k3"] = (e["token_mean"], e["token_mean_se"])
        e = d.extra["ppo_kl k1 (old − new)"]
        vals["ppo_kl"] = (e["token_mean"], e["token_mean_se"])
    if d.mismatch:
        vals["mismatch k3"] = (d.mismatch["k3"], d.mismatch["k3_se"])
    return vals


def _verdicts(checked: dict[str, Any] | None) -> dict[str, str]:
    """File name -> the verdict cell of the logged step its dump belongs to ("kl =" or "kl ≠ (+206%)")."""
    out: dict[str, str] = {}
    if not checked:
        return out
    for entry in checked["steps"]:
        cells = []
        for it in entry["logged"]:
            if it["consistent"]:
                cells.append(f"{it['name']} =")
            elif it.get("closest"):
                cells.append(f"{it['name']} ≠ ({100 * it['closest']['relative_difference']:+.3g}%)")
            else:
                cells.append(f"{it['name']} ?")
        for name in entry["dumps"]:
            out[name] = f"@{entry['step']:g}: " + ", ".join(cells) if cells else ""
    return out


def format_series(items: list[tuple[str, float | None, Diagnosis | str]], checked: dict[str, Any] | None = None) -> str:
    """The trend table across dumps: ``items`` are ``(name, step, Diagnosis or error message)`` in order;
    ``checked`` (:func:`klviz.diagnose.logged.check_history`) adds each step's logged values and their verdicts."""
    cols: list[str] = []
    for _n, _s, d in items:
        if isinstance(d, Diagnosis):
            for c in _trend_values(d):
                if c not in cols:
                    cols.append(c)
    verdicts = _verdicts(checked)
    lines = [
        f"klviz diagnose: a run of {len(items)} dumps (ordered by step, else by name; ± 2 SE)",
        "  "
        + f"{'step':>8}  {'file':<28}{'tokens':>10}"
        + "".join(f"{c:>22}" for c in cols)
        + "  trouble"
        + ("   logged (= exact, ≠ not)" if checked else ""),
    ]
    for name, step, d in items:
        s = "" if step is None else f"{step:g}"
        if not isinstance(d, Diagnosis):
            lines.append(f"  {s:>8}  {escape_text(name, 28):<28}  unreadable: {escape_text(d, 120)}")
            continue
        vals = _trend_values(d)
        cells = "".join(f"{_pm(*vals[c]) if c in vals else '':>22}" for c in cols)
        codes = ",".join(f"{t.code}({t.severity[0]})" for t in d.trouble if t.severity != "info") or "-"
        verdict = f"   {verdicts.get(name, '-')}" if checked else ""
        lines.append(f"  {s:>8}  {escape_text(name, 28):<28}{d.n_tokens:>10,}{cells}  {codes}{verdict}")
    if checked:
        lines += ["", "Logged values, step by step (each formula recomputed exactly on the dumps of that step)"]
        if checked.get("note"):
            lines.append(f"  note: {checked['note']}")
        for entry in checked["steps"]:
            lines.append(f"  step {entry['step']:g} ({', '.join(escape_text(n, 40) for n in entry['dumps'])}):")
            for it in entry["logged"]:
                lines += logged_lines(it, indent="    ")
        if not checked["steps"]:
            lines.append("  no logged step pairs with a dump step")
    return "\n".join(lines)


def series_json(
    items: list[tuple[str, float | None, Diagnosis | str]], checked: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The JSON report of a run: ``{"schema", "schema_version", "series": [...], "trouble": [...]}``, plus
    ``"logged"`` (:func:`klviz.diagnose.logged.check_history`) when a log history was given."""
    series, trouble = [], []
    for name, step, d in items:
        if isinstance(d, Diagnosis):
            rep = report_json(d)
            rep["trend"] = {k: {"value": v, "se": se} for k, (v, se) in _trend_values(d).items()}
            series.append({"file": name, "step": step, "report": rep})
            trouble += [dict(t, file=name) for t in rep["trouble"]]
        else:
            series.append({"file": name, "step": step, "error": d})
            trouble.append({"code": "unreadable", "severity": "error", "message": d, "advice": "", "file": name})
    out: dict[str, Any] = {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "series": series, "trouble": trouble}
    if checked is not None:
        out["logged"] = checked
    return _clean(out)
