"""The trouble signs of ``klviz diagnose``: a registry of small named rules.

Each :class:`Rule` has a stable ``code``, a ``severity`` (``info``, ``warning``, ``error``), one sentence on what
it ``detects``, its ``advice``, and a ``check`` that reads a finished :class:`~klviz.diagnose.analysis.Diagnosis`
and returns a :class:`Finding` (the message, and a severity or advice when they depend on what was found) or
``None``. :func:`find_trouble` runs them in registry order; a rule sees the codes found before it (the heavy-tail
rule gives no advice on the estimator once the data itself looks wrong). :func:`markdown_table` writes the table
of trouble codes in the format guide (``klviz/docs/rollout_format.md``), which a test keeps equal to this registry;
``python scripts/format_guide_tables.py`` rewrites it. Each rule has its own test in ``tests/test_diagnose_rules.py``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from .reading import escape_text

if TYPE_CHECKING:  # pragma: no cover
    from .analysis import Diagnosis

__all__ = ["Trouble", "Finding", "Rule", "RULES", "SEVERITIES", "find_trouble", "markdown_table", "DATA_LOOKS_WRONG"]

#: Severities of trouble signs, mildest first.
SEVERITIES: tuple[str, str, str] = ("info", "warning", "error")
#: A per-token |log r| above this is called "very large" in the report (a ratio beyond e^10 ≈ 22026).
LARGE_LOG_RATIO = 10.0
#: The heavy-tail sign needs at least this many counted tokens (the top 1 % is then ≥ 2 tokens) and
#: at least 10 responses: below that a "tail" is one token.
MIN_TAIL_TOKENS = 200


class Trouble(NamedTuple):
    """One trouble sign: a stable ``code``, a ``severity`` in :data:`SEVERITIES`, the ``message`` (what
    was found) and the ``advice`` (what it means and what to do)."""

    code: str
    severity: str
    message: str
    advice: str


class Finding(NamedTuple):
    """What a rule's check found: the message, and a severity or advice that replace the rule's own."""

    message: str
    severity: str | None = None
    advice: str | None = None


@dataclass(frozen=True)
class Rule:
    """A trouble sign: ``code``, default ``severity``, what it ``detects`` (one sentence, for the format
    guide), the ``advice`` printed with it, and ``check(diagnosis, codes_found_so_far)``."""

    code: str
    severity: str
    detects: str
    advice: str
    check: Callable[[Diagnosis, set[str]], Finding | None]


#: Codes that say the saved log-probs do not describe the tokens: advice about which estimator to log
#: would keep corrupted numbers on the dashboard, so none is given while one of these is found.
DATA_LOOKS_WRONG = frozenset(
    {
        "nonfinite",
        "trl_padding_counted",
        "positive_logprobs",
        "mask_shifted",
        "logprob_misaligned",
        "not_sampler_tokens",
        "k1_negative",
        "mean_ratio",
        "engine_temperature",
        "engine_support",
    }
)


# -- the checks -------------------------------------------------------------------------------------------------


def _nonfinite(d: Diagnosis, _found: set[str]) -> Finding | None:
    if not d.has_nonfinite:
        return None
    parts = ", ".join(f"{n} in '{escape_text(d.keys.get(role, role))}'" for role, n in d.nonfinite.items() if n)
    ex = "; ".join(f"{role}[{i}, {j}] = {v}" for role, i, j, v in d.nonfinite_examples[:3])
    return Finding(f"NaN or inf log-probs at counted tokens ({parts}; e.g. {ex})")


def _trl_padding_counted(d: Diagnosis, _found: set[str]) -> Finding | None:
    n = d.padding.get("trl_counted")
    if not n:
        return None
    return Finding(f"{n} counted token(s) hold TRL's padding value INVALID_LOGPROB = 1.0 in both tensors")


def _trl_padding(d: Diagnosis, found: set[str]) -> Finding | None:
    n = d.padding.get("trl_outside")
    if not n or "trl_padding_counted" in found:
        return None
    return Finding(f"{n} position(s) outside the mask hold TRL's padding value INVALID_LOGPROB = 1.0")


def _positive(d: Diagnosis, _found: set[str]) -> Finding | None:
    pos = {k: v for k, v in d.positive_logprobs.items() if v}
    if not pos:
        return None
    return Finding(f"positive log-probs ({', '.join(f'{v} in {k}' for k, v in pos.items())})")


def _mask_shifted(d: Diagnosis, _found: set[str]) -> Finding | None:
    edge = d.edges
    rows = edge.get("rows", 0)
    if rows < 4:
        return None
    interior = (edge.get("filler_counted", 0) - edge["last_filler"]) / max(d.n_tokens, 1)
    if edge["last_filler"] >= 0.5 * rows and interior < 0.05:
        return Finding(
            f"the last counted position of {edge['last_filler']} of {rows} responses holds padding "
            "(log-probs 0 or 1.0 in both tensors)",
            advice="The mask reaches one position past each response: it is shifted right by one against the "
            "log-probs (and probably leaves out the first response token). Align the mask with the log-probs of the "
            "response tokens (the per-position table shows the edge).",
        )
    if edge["after_rows"] >= 4 and edge["after_real"] >= 0.5 * edge["after_rows"]:
        return Finding(
            f"the position just after the last counted token holds a real log-prob in {edge['after_real']} of "
            f"{edge['after_rows']} responses, with padding after it",
            advice="The mask stops one token early: the last token of each response (usually EOS) is left out, as if "
            "the mask were shifted left by one. EOS carries much of the KL when the policy learned where to stop.",
        )
    if edge["first_rows"] >= 4 and edge["before_real"] >= 0.5 * edge["first_rows"]:
        return Finding(
            f"the position just before the first counted token holds a real log-prob in {edge['before_real']} of "
            f"{edge['first_rows']} responses",
            advice="The mask starts one token late: the first response token is left out (a mask shifted right by "
            "one).",
        )
    return None


#: The shifted-copy test: a pair is called misaligned when one of its tensors shifted by one position agrees
#: with the other at least this many times better (mean |Δ log-prob|) than as saved.
MISALIGNED_RATIO = 0.5


def _misaligned(d: Diagnosis, _found: set[str]) -> Finding | None:
    worst = None
    for pair, a in d.alignment.items():
        if a.get("pairs", 0) < 20 or a.get("rows", 0) < 4:
            continue
        base = a["mean_abs"][0]
        for shift in (1, -1):
            alt = a["mean_abs"][shift]
            if base > 0.05 and alt < MISALIGNED_RATIO * base and (worst is None or alt / base < worst[0]):
                worst = (alt / base, pair, shift, base, alt)
    if worst is None:
        return None
    _ratio, pair, shift, base, alt = worst
    first, second = pair.split("|")
    late = "late" if shift == 1 else "early"
    return Finding(
        f"'{second}' is one position {late} against '{first}': {first}[t] agrees with {second}[t{shift:+d}] "
        f"(mean |difference| {alt:.3g}) far better than with {second}[t] as saved ({base:.3g})",
        advice=f"The two tensors score different tokens at the same position: an off-by-one in the logits slice "
        f"(the log-prob of token t comes from the logits at position t − 1: logits[:, :-1] against labels[:, 1:]). "
        f"Every KL number above pairs unrelated tokens and means nothing; fix the alignment of '{second}' and dump "
        f"again. Do not change the estimator you log to make these numbers look better.",
    )


def _not_sampler_tokens(d: Diagnosis, _found: set[str]) -> Finding | None:
    tb = d.tail_bound
    if not tb or tb.get("sequences", 0) < 4:
        return None
    worst = None
    for c, (frac, se) in tb["above"].items():
        limit = 1.0 / float(c)
        if math.isfinite(se) and frac > 1.2 * limit and frac - limit > 4 * se:
            excess = (frac - limit) / max(se, 1e-12)
            if worst is None or excess > worst[0]:
                worst = (excess, c, frac, se, limit)
    if worst is None:
        return None
    _e, c, frac, se, limit = worst
    return Finding(
        f"{100 * frac:.1f}% ± {200 * se:.2g}% of tokens have {tb['ratio']} ≥ {c:g}; tokens sampled by "
        f"{tb['sampler']} allow at most {100 * limit:.3g}% (Markov: E[{tb['ratio']}] ≤ 1)",
        advice="These tokens cannot be samples of the distribution whose log-probs were saved as the sampler's: "
        "the log-probs belong to other tokens (misaligned, another batch), to another policy, or to another "
        "temperature or truncation of it. Every KL number above is then an estimate of nothing; fix the dump "
        "before reading them.",
    )


def _large_log_ratio(d: Diagnosis, _found: set[str]) -> Finding | None:
    if not d.n_large:
        return None
    worst = ", ".join(f"[{i}, {j}] log r = {v:+.4g}" for i, j, v in d.large_tokens[:3])
    return Finding(f"{d.n_large} token(s) with |log r| > {LARGE_LOG_RATIO:g} (largest: {worst})")


def _k1_shown(d: Diagnosis) -> tuple[float, float, str] | None:
    k1 = d.estimates["k1"]
    if not k1["token_mean"] < 0:
        return None
    se = k1["token_mean_se"]
    z = -k1["token_mean"] / se if se > 0 else math.inf
    return z, se, f"{k1['token_mean']:.4g} ± {2 * se:.2g}"


def _k1_negative_off_policy(d: Diagnosis, _found: set[str]) -> Finding | None:
    s = _k1_shown(d)
    return Finding(f"the k1 mean is negative ({s[2]})") if s and d.off_policy else None


def _k1_negative(d: Diagnosis, _found: set[str]) -> Finding | None:
    s = _k1_shown(d)
    if not s or d.off_policy or not (s[0] > 3 and d.n_sequences >= 2):
        return None
    return Finding(f"the k1 mean is negative beyond noise ({s[2]})")


def _k1_negative_noise(d: Diagnosis, _found: set[str]) -> Finding | None:
    s = _k1_shown(d)
    if not s or d.off_policy or (s[0] > 3 and d.n_sequences >= 2):
        return None
    return Finding(f"the k1 mean is negative but within noise ({s[2]})")


def _mean_ratio(d: Diagnosis, _found: set[str]) -> Finding | None:
    rm, rse = d.mean_ratio
    if not (math.isfinite(rse) and abs(rm - 1) > max(4 * rse, 0.01)):
        return None
    return Finding(f"the mean ratio r = π_ref/{'π_old' if d.off_policy else 'π'} is {rm:.4f} ± {2 * rse:.2g}, not 1")


def _heavy_tail(d: Diagnosis, found: set[str]) -> Finding | None:
    k1, k3 = d.estimates["k1"], d.estimates["k3"]
    if not (
        d.n_tokens >= MIN_TAIL_TOKENS
        and d.n_sequences >= 10
        and (k3["token_std"] > 2 * k1["token_std"] or d.k3_top_share > 0.5)
    ):
        return None
    message = (
        f"k3 is heavy-tailed (per-token std {k3['token_std']:.3g} vs k1's {k1['token_std']:.3g}; "
        f"top 1% of tokens carry {100 * d.k3_top_share:.0f}% of its sum)"
    )
    wrong = sorted(found & DATA_LOOKS_WRONG)
    if wrong:
        return Finding(
            message,
            advice=f"The tail comes with {', '.join(wrong)} above: the saved log-probs do not describe the tokens, so "
            "the tail is a symptom, not a property of k3. Fix the data first; no estimator makes these numbers right.",
        )
    return Finding(message)


def _low_precision(d: Diagnosis, _found: set[str]) -> Finding | None:
    prec = d.precision
    low = {role: info["rounded_to"] for role, info in prec.items() if isinstance(info, dict) and info.get("rounded_to")}
    if not low:
        return None
    bias, k3m = prec["k3_bias_from_rounding"], prec["k3_token_mean"]
    rel = f" ({100 * bias / k3m:.0f}% of the k3 token-mean)" if k3m > 0 else ""
    how = ", ".join(
        f"{d.keys.get(role, role)} "
        + (
            "stored as " + dt
            if prec[role]["stored"] == dt
            else f"holds {dt}-rounded values (stored as {prec[role]['stored']})"
        )
        for role, dt in low.items()
    )
    return Finding(
        f"low-precision log-probs: {how}",
        advice=f"Rounding each stored log-prob to {', '.join(sorted(set(low.values())))} adds noise of about half a "
        f"unit in the last place to log r: k1 averages it out, but k2 and k3 are quadratic in log r and gain about "
        f"+{bias:.3g} nats/token{rel} from storage alone. Save log-probs in float32 (compute them from float32 "
        "logits: logits.float().log_softmax(-1)).",
    )


def _off_policy(d: Diagnosis, _found: set[str]) -> Finding | None:
    if not d.off_policy:
        return None
    return Finding(
        f"the tokens were sampled by π_old, not π (max |logprob − old_logprob| = {d.max_abs_policy_shift:.3g})"
    )


def _clip_fraction(d: Diagnosis, _found: set[str]) -> Finding | None:
    cf = d.ratio.get("clip_fraction")
    if not d.off_policy or cf is None or cf <= 0.2:
        return None
    return Finding(f"{100 * cf:.1f}% of tokens have a PPO ratio π/π_old outside 1 ± {d.clip:g}")


def _empty(d: Diagnosis, _found: set[str]) -> Finding | None:
    return Finding(f"{d.n_empty_sequences} sequence(s) have no counted token") if d.n_empty_sequences else None


def _last_token(d: Diagnosis, _found: set[str]) -> Finding | None:
    ends = d.positions.get("end")
    if not (ends and ends["count"] and ends["count"][0] >= 20 and len(ends["count"]) > 1):
        return None
    k3 = d.estimates["k3"]
    k3_last = ends["k3"][0]
    rest = (k3["token_mean"] * d.n_tokens - k3_last * ends["count"][0]) / max(d.n_tokens - ends["count"][0], 1)
    if not (k3_last > 5 * max(rest, 1e-12) and k3_last - 4 * ends["k3_se"][0] > rest):
        return None
    return Finding(
        f"the last token of each response carries a k3 of {k3_last:.3g} on average, "
        f"{k3_last / max(rest, 1e-12):.0f}× the other tokens'"
    )


def _identical(d: Diagnosis, _found: set[str]) -> Finding | None:
    ks = d.estimates
    if all(abs(ks[k]["max"]) == 0 and abs(ks[k]["min"]) == 0 for k in ks):
        return Finding("policy and reference log-probs are identical")
    return None


def _engine_mismatch(d: Diagnosis, found: set[str]) -> Finding | None:
    mm = d.mismatch
    if not mm:
        return None
    k3, se = mm["k3"], mm["k3_se"]
    if not (math.isfinite(se) and k3 > 4 * se and k3 > 1e-4):
        return None
    sev = "warning" if k3 > 1e-3 or mm["tis_fraction"] > 0.001 else "info"
    return Finding(
        f"engine and trainer disagree: KL(π_rollout ‖ π_old) ≈ {k3:.3g} ± {2 * se:.2g} nats/token (k3), "
        f"χ² {mm['chi2_token']:.3g}, perplexity ratio {mm['ppl_ratio']:.4f}",
        severity=sev,
    )


def _engine_support(d: Diagnosis, _found: set[str]) -> Finding | None:
    mm = d.mismatch
    if not mm:
        return None
    rm, rse = mm["mean_ratio"], mm["mean_ratio_se"]
    if not (math.isfinite(rse) and rm < 1 - max(4 * rse, 0.005)):
        return None
    return Finding(f"E[π_old/π_rollout] = {rm:.4f} ± {2 * rse:.2g} < 1")


def _engine_temperature(d: Diagnosis, _found: set[str]) -> Finding | None:
    mm = d.mismatch
    if not mm:
        return None
    rm, rse = mm["mean_ratio"], mm["mean_ratio_se"]
    if not (math.isfinite(rse) and rm > 1 + max(4 * rse, 0.005)):
        return None
    return Finding(f"E[π_old/π_rollout] = {rm:.4f} ± {2 * rse:.2g} > 1")


def _length_trap(d: Diagnosis, _found: set[str]) -> Finding | None:
    mm = d.mismatch
    if not mm or not (mm["max_length_x_kl"] > 1.0 or mm["log_weight_clamp_rate"] > 0.01):
        return None
    return Finding(
        f"response length × mismatch KL reaches {mm['max_length_x_kl']:.3g} nats "
        f"(mean length × KL {mm['length_x_kl']:.3g}); P(|log W| > 20) ≈ {mm['log_weight_clamp_rate']:.3g}"
    )


_FIX_CAUSE = (
    "Fix the cause first: divide the trainer's logits by the engine's sampling temperature before the log-softmax "
    "(or have the engine return log-probs of the distribution it sampled from), replay the engine's top-p/top-k "
    "sampling mask on the trainer side (keep sampling mask), and score with the same precision"
)

RULES: tuple[Rule, ...] = (
    Rule(
        "nonfinite",
        "error",
        "NaN or inf log-probs at tokens the mask counts",
        "These tokens were left out of every number above. A -inf reference log-prob means the reference gives the "
        "token probability 0, so KL(π‖π_ref) is infinite there; NaN usually comes from an overflow in the forward "
        "pass or from a mask that does not cover padding. Fix the source before trusting the KL.",
        _nonfinite,
    ),
    Rule(
        "trl_padding_counted",
        "error",
        "counted tokens holding TRL's padding value 1.0 in both tensors",
        "TRL's PPO/RLOO trainers fill the log-probs of padding (and tokens after EOS) with 1.0; the mask counts them, "
        "so it is not the completion mask (inverted, or the padding mask). These positions were left out of the "
        "numbers above; save the mask TRL builds from the sequence lengths.",
        _trl_padding_counted,
    ),
    Rule(
        "trl_padding",
        "info",
        "TRL's padding value 1.0 outside the mask (expected in a TRL dump)",
        "Expected in a TRL dump: padding log-probs are set to 1.0, and the mask leaves them out. Nothing to do.",
        _trl_padding,
    ),
    Rule(
        "positive_logprobs",
        "error",
        "log-probabilities above 0",
        "A log-probability is ≤ 0. Positive values mean these are logits, scores or log-probs summed with something "
        "else: check which tensor you saved.",
        _positive,
    ),
    Rule(
        "mask_shifted",
        "error",
        "a mask one position off the log-probs (padding counted, EOS or the first token left out)",
        "Align the mask with the log-probs of the response tokens (the per-position table shows the edge).",
        _mask_shifted,
    ),
    Rule(
        "logprob_misaligned",
        "error",
        "one log-prob tensor one position off another: shifted by one, it agrees "
        f"with the other at least {1 / MISALIGNED_RATIO:g}× better than as saved",
        "An off-by-one in the logits slice; every KL number pairs unrelated tokens. Fix the alignment and dump again.",
        _misaligned,
    ),
    Rule(
        "not_sampler_tokens",
        "error",
        "more tokens with π_ref/π_sampler ≥ c than the 1/c that tokens sampled by "
        "the sampler allow (Markov's inequality, beyond 4 SE)",
        "The saved log-probs do not belong to the policy that sampled these tokens (misaligned, another batch, "
        "another temperature or truncation); fix the dump before reading any KL.",
        _not_sampler_tokens,
    ),
    Rule(
        "large_log_ratio",
        "warning",
        f"tokens with |log r| > {LARGE_LOG_RATIO:g}",
        "A ratio beyond e^10 means policy and reference disagree completely on these tokens. k3 grows like "
        "e^|log r| when log r > 0 and the frameworks' clamps start to bind (see the clamp table); k1 stays linear. "
        "Look at these tokens: often a special token, a tokenizer mismatch, or a prompt token that the mask should "
        "have excluded.",
        _large_log_ratio,
    ),
    Rule(
        "k1_negative",
        "error",
        "a negative k1 mean beyond 3 SE on-policy, where E[k1] = KL ≥ 0",
        "On-policy, E[k1] = KL(π‖π_ref) ≥ 0, so a clearly negative mean says the tokens were not drawn from the "
        "distribution whose log-probs you saved: sampling temperature, top-p/top-k, a different inference engine "
        "(vLLM vs the trainer), or stale/off-policy tokens. " + _FIX_CAUSE + ".",
        _k1_negative,
    ),
    Rule(
        "k1_negative_off_policy",
        "info",
        "a negative k1 mean on π_old's tokens (expected once π has moved)",
        "Expected off-policy: on π_old's tokens E[log π − log π_ref] = KL(π_old‖π_ref) − KL(π_old‖π), which is "
        "negative once π has moved further from π_old than π_old is from π_ref. It is not a KL; use the ρ-weighted "
        "rows.",
        _k1_negative_off_policy,
    ),
    Rule(
        "k1_negative_noise",
        "info",
        "a negative k1 mean within noise",
        "Expected when π and π_ref are close: k1 is negative on every token π_ref likes more than π, and the true KL "
        "is small next to the noise. Nothing is wrong; k3 is never negative.",
        _k1_negative_noise,
    ),
    Rule(
        "mean_ratio",
        "warning",
        "a mean ratio π_ref/π_sampler away from 1 (beyond 4 SE and 1 %)",
        "E[r] = 1 exactly when the tokens are samples of the sampler's distribution, so k1 and k3 (whose difference "
        "is 1 − r) disagree here by more than noise. The saved log-probs do not describe the distribution the tokens "
        "were drawn from (a temperature not divided out, top-p, an engine mismatch), or the reference misses part of "
        "the support. " + _FIX_CAUSE + "; until then no estimator's value can be trusted.",
        _mean_ratio,
    ),
    Rule(
        "heavy_tail",
        "warning",
        "k3 carried by a few tokens (per-token std over twice k1's, or the top 1 % of "
        "tokens holding over half its sum)",
        "k3 = r − 1 − log r contains r = π_ref/π, exponential in log r: on tokens that π_ref finds far likelier than "
        "π, one token outweighs hundreds. The batch value then rests on a few tokens: look at them (the token and "
        "sequence tables); log k1 beside k3 to see how much of the number they carry.",
        _heavy_tail,
    ),
    Rule(
        "low_precision",
        "warning",
        "log-probs stored in (or rounded to) bfloat16 or float16",
        "Rounding adds noise to log r that k1 averages out and k2, k3 turn into a positive bias. Save log-probs in "
        "float32.",
        _low_precision,
    ),
    Rule(
        "off_policy",
        "info",
        "old_logprob differs from logprob: the tokens came from π_old",
        "k1/k2/k3 of logprob vs ref_logprob then estimate no KL exactly; weight by ρ = π/π_old (the ρ·k rows) for "
        "KL(π‖π_ref), or compare old_logprob with ref_logprob for KL(π_old‖π_ref).",
        _off_policy,
    ),
    Rule(
        "clip_fraction",
        "warning",
        "over 20 % of tokens with a PPO ratio outside the clip range",
        "The clipped surrogate ignores their gradient: π has moved far from the policy that sampled the batch (too "
        "many epochs, too large a learning rate, or stale tokens).",
        _clip_fraction,
    ),
    Rule(
        "empty_sequences",
        "warning",
        "responses with no counted token",
        "They are left out of the per-sequence means (as recent verl does); check that the mask is not shifted by "
        "one or empty for truncated responses.",
        _empty,
    ),
    Rule(
        "last_token",
        "warning",
        "the last token of each response carrying several times the others' k3",
        "Usually the EOS token: policy and reference disagree on where to stop (the reference never learned to end, "
        "or the policy ends early/late). If EOS should not count, fix the mask; otherwise the length behaviour is "
        "what the KL measures.",
        _last_token,
    ),
    Rule(
        "identical",
        "info",
        "policy and reference log-probs equal at every counted token",
        "KL = 0: expected at step 0, before the first update. Later it means the reference is the policy itself (or "
        "the same tensor was saved twice).",
        _identical,
    ),
    Rule(
        "engine_mismatch",
        "warning",
        "engine and trainer log-probs apart beyond noise (info when below 1e-3 nats/token)",
        "The tokens were sampled by the engine, not by the trainer's π_old: every KL above that treats π_old as the "
        "sampler is biased by this much (the ρ_e rows weight by π/π_rollout and are not), and so is the policy "
        "gradient. " + _FIX_CAUSE + ". What remains is rounding (bf16 engine, fp32 trainer): truncated importance "
        "sampling (verl rollout_is, TRL vllm_importance_sampling_correction) or masking bounds its effect; neither "
        "repairs a temperature or a truncation.",
        _engine_mismatch,
    ),
    Rule(
        "engine_support",
        "warning",
        "E[π_old/π_rollout] below 1: the engine samples a truncated distribution",
        "With tokens from the engine the mean ratio is the mass π_old puts where the engine can sample: below 1, the "
        "engine truncates the distribution (top-p/top-k), so the trainer scores a different policy. Replay the "
        "sampling mask on the trainer side (keep sampling mask) or sample without truncation; no importance weight "
        "repairs lost support (lesson 08).",
        _engine_support,
    ),
    Rule(
        "engine_temperature",
        "warning",
        "E[π_old/π_rollout] above 1: the engine's log-probs are tempered or processed differently",
        "Above 1 cannot happen when both log-probs describe one distribution each on the same support: the engine "
        "sampled at a temperature the trainer does not divide out (or returned raw log-probs of processed sampling). "
        "Divide the trainer's logits by the engine's temperature, or have the engine return the log-probs it sampled "
        "from. Truncated IS or masking do not fix it: in lesson 08's 16 seeds at T = 0.7 they did not improve the "
        "score.",
        _engine_temperature,
    ),
    Rule(
        "length_trap",
        "warning",
        "long responses × mismatch KL large enough for sequence weights to degenerate",
        "A sequence-level importance weight W = Π π_old/π_rollout has a variance that grows like (1 + χ²)^T: long "
        "responses get weights near 0 or huge ones. Prefer token-level truncated IS or a geometric-mean "
        "(length-normalised) rejection over sequence-level weights.",
        _length_trap,
    ),
)

_BY_CODE = {r.code: r for r in RULES}


def find_trouble(d: Diagnosis) -> list[Trouble]:
    """Run every rule of :data:`RULES` on a finished diagnosis, in order."""
    out: list[Trouble] = []
    found: set[str] = set()
    for rule in RULES:
        f = rule.check(d, found)
        if f is None:
            continue
        found.add(rule.code)
        out.append(Trouble(rule.code, f.severity or rule.severity, f.message, f.advice or rule.advice))
    return out


def rule(code: str) -> Rule:
    """The rule with this code (KeyError naming it otherwise)."""
    return _BY_CODE[code]


def markdown_table() -> str:
    """The format guide's table of trouble codes, from :data:`RULES`."""
    lines = ["| code | severity | what it detects |", "|---|---|---|"]
    for r in RULES:
        lines.append(f"| `{r.code}` | {r.severity} | {r.detects} |")
    return "\n".join(lines)


GUIDE_START = "<!-- trouble codes: generated from klviz/diagnose/rules.py by scripts/format_guide_tables.py -->"
GUIDE_END = "<!-- end of trouble codes -->"


def write_guide_table(guide: str) -> str:
    """The format guide's text with the table between its markers replaced by :func:`markdown_table`."""
    start, end = guide.index(GUIDE_START) + len(GUIDE_START), guide.index(GUIDE_END)
    return guide[:start] + "\n" + markdown_table() + "\n" + guide[end:]
