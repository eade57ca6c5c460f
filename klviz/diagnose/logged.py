"""Which of the report's numbers a value your framework logged is, and whether it is consistent with the dump.

``klviz diagnose FILE --logged actor/kl_loss=0.0123`` names a logged metric the way the framework logs
it. :data:`LOGGED_NAMES` says, for each known name, which of the report's numbers the framework
computes under that name by default (and which other numbers it can be under other settings);
:func:`match_logged` compares the value with every number of the report and says which ones it
matches within their uncertainty.

A value is *consistent* with the dump when it lies within ``3 SE + 2e-4 |x| + 1e-6`` of one of the
numbers the framework can log under that name (``SE``: the number's standard error with responses as
the independent units; the relative and absolute terms absorb float32 arithmetic in the framework and
per-micro-batch averaging, which moves a mean by far less than its SE). Consistency is judged against
the numbers the framework logs under that name with its default aggregation (any estimator type);
``matches`` also lists the other numbers a value equals (another aggregation, another metric). A
name klviz does not know is compared with every number.
"""

from __future__ import annotations

import math
from typing import Any

from .analysis import Diagnosis

__all__ = ["LOGGED_NAMES", "candidate_numbers", "match_logged", "parse_logged"]

_REF = "KL(π ‖ π_ref)"
_OLDREF = "KL(π_old ‖ π_ref)"
_PPO = "KL(π_old ‖ π)"

#: Logged name -> (framework and default, [numbers it can be, the default first]).
LOGGED_NAMES: dict[str, tuple[str, list[str]]] = {
    "actor/ppo_kl": (
        "verl: masked mean of old − new log-probs (log-ratio clamped ±20), k1 of KL(π_old ‖ π)",
        ["ppo_kl k1 token-mean (verl clamp)", "ppo_kl k1 token-mean"],
    ),
    "actor/kl_loss": (
        "verl use_kl_loss: kl_penalty(logprob, ref) with low_var_kl (k3, clamps), loss_agg_mode token-mean",
        ["k3 token-mean (verl low_var_kl)", "k3 token-mean", "k1 token-mean", "k2 token-mean"],
    ),
    "actor/reward_kl_penalty": (
        "verl use_kl_in_reward: k1 of the sampler (old_log_probs) vs ref, mean of per-sequence token means",
        ["sampler k1 seq-mean-token-mean", "sampler k3 seq-mean-token-mean", "sampler k2 seq-mean-token-mean"],
    ),
    "objective/kl": (
        "TRL PPO: k1 of the sampler vs ref, summed per sequence, mean over sequences",
        ["sampler k1 seq-mean-token-sum", "sampler k3 seq-mean-token-sum"],
    ),
    "kl": (
        "TRL GRPO: k3 (× π/π_old with use_bias_correction_kl), token mean; OpenRLHF: k1 clamped ±10, mean "
        "of per-sequence means (or the token mean with use_kl_loss)",
        [
            "k3 token-mean",
            "ρ·k3 token-mean",
            "k1 seq-mean-token-mean",
            "k1 token-mean",
            "k3 seq-mean-token-mean",
            "sampler k1 seq-mean-token-mean",
            "sampler k3 token-mean",
        ],
    ),
    "kl_penalty": ("NeMo-RL: k3 (clamps 20/10) × importance weight, token mean", ["k3 token-mean", "ρ·k3 token-mean"]),
    "approxkl": (
        "TRL PPO: ½ (new − old)², mean over every position (padding included)",
        ["ppo_kl k2 all-positions mean", "ppo_kl k2 token-mean"],
    ),
    "policy/approxkl_avg": (
        "TRL PPO: approxkl averaged over minibatches",
        ["ppo_kl k2 all-positions mean", "ppo_kl k2 token-mean"],
    ),
    "approx_kl": ("MiniMind: ½ (new − old)², token mean", ["ppo_kl k2 token-mean"]),
    "kl_ref": ("MiniMind: k3 of current vs ref, token mean", ["k3 token-mean"]),
    "rollout_corr/kl": ("verl rollout correction: k1 of π_rollout vs π_old, token mean", ["mismatch k1 token-mean"]),
    "rollout_corr/k3_kl": ("verl rollout correction: k3 of π_rollout vs π_old, token mean", ["mismatch k3 token-mean"]),
}


def parse_logged(text: str) -> tuple[str, float]:
    """``"NAME=VALUE"`` -> ``(name, value)``; ValueError naming the problem otherwise."""
    if "=" not in text:
        raise ValueError(f"--logged expects NAME=VALUE (e.g. actor/kl_loss=0.0123), got {text!r}")
    name, value = text.rsplit("=", 1)
    name = name.strip()
    try:
        v = float(value)
    except ValueError:
        raise ValueError(f"--logged {name}: {value!r} is not a number") from None
    if not name or not math.isfinite(v):
        raise ValueError(f"--logged expects NAME=VALUE with a finite number, got {text!r}")
    return name, v


def candidate_numbers(d: Diagnosis) -> dict[str, dict[str, Any]]:
    """Every number of the report a framework could log: ``{label: {value, se, estimates}}``."""
    out: dict[str, dict[str, Any]] = {}
    modes = (
        ("token-mean", "token_mean", "token_mean_se"),
        ("seq-mean-token-mean", "seq_token_mean", "seq_token_mean_se"),
        ("seq-mean-token-sum", "seq_sum_mean", "seq_sum_se"),
    )
    what = _REF if not d.off_policy else "no KL exactly (π's log-probs on π_old's tokens)"
    for k, e in d.estimates.items():
        for mode, key, se in modes:
            out[f"{k} {mode}"] = {"value": e[key], "se": e[se], "estimates": what}
    verl = "verl low_var_kl: k3 clamped to ≤ 10 (also NeMo-RL)"
    if verl in d.clamps:
        e = d.estimates["k3"]
        out["k3 token-mean (verl low_var_kl)"] = {
            "value": e["token_mean"] + d.clamps[verl]["mean_shift"],
            "se": e["token_mean_se"],
            "estimates": what,
        }
    for label, key in (
        ("ppo_kl k1 token-mean", "ppo_kl k1 (old − new)"),
        ("ρ·k3 token-mean", "ρ·k3, ρ = π/π_old"),
        ("ρ·k1 token-mean", "ρ·k1, ρ = π/π_old"),
    ):
        if key in d.extra:
            out[label] = {
                "value": d.extra[key]["token_mean"],
                "se": d.extra[key]["token_mean_se"],
                "estimates": _PPO if label.startswith("ppo") else _REF,
            }
    if not d.off_policy:
        out["ρ·k3 token-mean"] = dict(out["k3 token-mean"])
        for k in ("k1", "k2", "k3"):
            for mode, key, se in modes:
                out[f"sampler {k} {mode}"] = {
                    "value": d.estimates[k][key],
                    "se": d.estimates[k][se],
                    "estimates": _REF if k != "k2" else _REF + " (second order)",
                }
    out.update(d.sampler_numbers)
    if d.mismatch:
        for k in ("k1", "k3"):
            out[f"mismatch {k} token-mean"] = {
                "value": d.mismatch[k],
                "se": d.mismatch[f"{k}_se"],
                "estimates": "KL(π_rollout ‖ π_old)",
            }
    return out


def match_logged(d: Diagnosis, logged: list[tuple[str, float]]) -> list[dict[str, Any]]:
    """One item per logged value: ``{name, value, consistent, matches, expected, framework, estimates, note}``."""
    numbers = candidate_numbers(d)
    items = []
    for name, value in logged:
        known = LOGGED_NAMES.get(name)
        allowed = [c for c in known[1] if c in numbers] if known else list(numbers)
        matches = []
        for label, num in numbers.items():
            x, se = num["value"], num["se"]
            if not math.isfinite(x):
                continue
            tol = 3 * (se if math.isfinite(se) else 0.0) + 2e-4 * abs(x) + 1e-6
            if abs(value - x) <= tol:
                matches.append(
                    {
                        "number": label,
                        "value": x,
                        "se": se,
                        "estimates": num["estimates"],
                        "z": (value - x) / se if math.isfinite(se) and se > 0 else None,
                    }
                )
        matches.sort(key=lambda m: abs(value - m["value"]))
        ok = [m for m in matches if m["number"] in allowed]
        expected = allowed[0] if allowed else None
        item: dict[str, Any] = {
            "name": name,
            "value": value,
            "consistent": bool(ok),
            "matches": [m["number"] for m in ok] or [m["number"] for m in matches],
            "framework": known[0] if known else None,
            "expected": expected,
            "estimates": (ok[0] if ok else numbers.get(expected, {})).get("estimates") if (ok or expected) else None,
        }
        if expected is not None and expected in numbers:
            item["expected_value"] = numbers[expected]["value"]
            item["expected_se"] = numbers[expected]["se"]
        if known and not allowed:
            item["note"] = (
                "the dump lacks what this metric needs (old_logprob for PPO's old-vs-new KL, "
                "rollout_logprob for the engine mismatch)"
            )
            item["consistent"] = None
        elif ok:
            item["note"] = f"matches {ok[0]['number']}, an estimate of {ok[0]['estimates']}"
        elif matches:
            item["note"] = (
                f"not what {name} computes by default, but equal to {matches[0]['number']} "
                f"({matches[0]['estimates']}): another setting, or another metric"
            )
        else:
            exp = numbers.get(expected) if expected else None
            item["note"] = (
                "far from every number this dump gives"
                + (f"; the default for {name} here is {exp['value']:.5g} ± {2 * exp['se']:.2g}" if exp else "")
                + ": logged from another batch or step, or the dump is not what the framework saw"
            )
        items.append(item)
    return items
