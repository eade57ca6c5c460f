"""Checks for the exercises of lesson 08 (when the sampler is not the trainer)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..messages import tr
from . import CheckResult, WrongAnswer, as_answer_number, as_answer_tensor, failed, learner_answer, passed

__all__ = ["policy_pairs", "kept_mass", "tis_weights", "paired_difference", "LOGGED_NUMBERS", "POLICY_NAMES"]

#: The policies a logged number can compare.
POLICY_NAMES: tuple[str, ...] = ("rollout", "old", "theta", "ref")
#: Logged number -> (sampler of the tokens it averages over, the other policy): the KL it estimates is
#: KL(sampler || other). ``actor/ppo_kl`` treats pi_old as the sampler, which it is only when pi_old = pi_rollout.
LOGGED_NUMBERS: dict[str, tuple[str, str]] = {
    "rollout_corr/kl": ("rollout", "old"),  # verl: mean(rollout_log_prob - old_log_prob)
    "actor/ppo_kl": ("old", "theta"),  # verl: mean(old_log_prob - log_prob)
    "actor/kl_loss": ("theta", "ref"),  # verl: kl_penalty(log_prob, ref_log_prob)
    "gen_kl_error": ("rollout", "old"),  # NeMo-RL: generation vs training log-probs
}


def policy_pairs(fn: Callable[[], Any]) -> CheckResult:
    """Exercise 1: ``fn()`` returns ``{logged name: (sampler, other)}`` for every name in
    :data:`LOGGED_NUMBERS`, each policy one of :data:`POLICY_NAMES`."""
    out = learner_answer(fn)
    if isinstance(out, CheckResult):
        return out
    if not isinstance(out, dict):
        return failed(
            tr("Return a dict {{logged name: (sampler, other policy)}}, got {name}.", name=type(out).__name__)
        )
    missing = [k for k in LOGGED_NUMBERS if k not in out]
    if missing:
        return failed(tr("Give a pair for every logged number; missing: {join}.", join=", ".join(missing)))
    for name, want in LOGGED_NUMBERS.items():
        got = out[name]
        if got is Ellipsis or (isinstance(got, tuple) and Ellipsis in got):
            return failed(tr("{name}: replace the `...` with two of {join}.", name=name, join=", ".join(POLICY_NAMES)))
        if not (isinstance(got, (tuple, list)) and len(got) == 2 and all(isinstance(g, str) for g in got)):
            return failed(
                tr(
                    "{name}: give a pair of two policy names such as ('rollout', 'old'), got {got!r}.",
                    name=name,
                    got=got,
                )
            )
        got = (got[0].strip().lower(), got[1].strip().lower())
        unknown = [g for g in got if g not in POLICY_NAMES]
        if unknown:
            return failed(
                tr(
                    "{name}: {unknown_0!r} is not one of {join}.",
                    name=name,
                    unknown_0=unknown[0],
                    join=", ".join(POLICY_NAMES),
                )
            )
        if got == want:
            continue
        if got == want[::-1]:
            return failed(
                tr(
                    "{name}: direction swapped. The first policy is the one whose tokens are averaged over "
                    "(the sampler), so {name} estimates KL({want_0} || {want_1}).",
                    name=name,
                    want_0=want[0],
                    want_1=want[1],
                )
            )
        if set(got) == {"old", "theta"} or set(want) == {"old", "theta"}:
            return failed(
                tr(
                    "{name}: not that pair. actor/ppo_kl compares the trainer's recompute before the update "
                    "(old) with the current policy (theta); the engine's log-probs (rollout) never enter it.",
                    name=name,
                )
            )
        if "rollout" in want:
            return failed(
                tr(
                    "{name}: this number compares the engine's log-probs (rollout, the sampler) with the "
                    "trainer's recompute (old): it measures the mismatch, before any update.",
                    name=name,
                )
            )
        return failed(
            tr(
                "{name}: not that pair; it is the KL penalty of the current policy (theta) against the "
                "reference (ref), on the policy's tokens.",
                name=name,
            )
        )
    return passed(
        tr(
            "Every logged number matched with its pair. Only rollout_corr/kl and gen_kl_error see the engine: "
            "ppo_kl treats pi_old as the sampler, which holds only if pi_old = pi_rollout."
        )
    )


def _top_p_mass(logp: torch.Tensor, top_p: float) -> float:
    p = logp.exp().sort(descending=True).values
    before = p.cumsum(0) - p
    return float(p[before < top_p].sum())


def kept_mass(fn: Callable[[torch.Tensor, float], Any]) -> CheckResult:
    """Exercise 2: ``fn(logp, top_p)``, ``logp [V]`` a log-distribution, returns the mass S that a top-p sampler
    keeps: the smallest set of most likely tokens whose probability reaches ``top_p``."""
    g = torch.Generator().manual_seed(808)
    cases = []
    for V, scale, top_p in ((6, 1.0, 0.9), (12, 2.0, 0.8), (32, 1.5, 0.95), (5, 0.3, 0.5), (8, 3.0, 0.7)):
        logp = torch.log_softmax(scale * torch.randn(V, generator=g, dtype=torch.float64), 0)
        cases.append((logp, top_p, _top_p_mass(logp, top_p)))
    cases.append((torch.log(torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)), 0.8, 0.8))  # boundary reached exactly
    for logp, top_p, want in cases:
        out = learner_answer(fn, logp.clone(), top_p, convert=lambda o: as_answer_number(o, "kept_mass", finite=True))
        if isinstance(out, CheckResult):
            return out
        if abs(out - want) <= 1e-6:
            continue
        if abs(out - top_p) <= 1e-9:
            return failed(
                tr(
                    "S is not top_p: the sampler keeps whole tokens until their mass reaches top_p, so S is at "
                    "least top_p and usually more (the last token kept crosses the threshold)."
                )
            )
        if want > 0 and abs(out - 1 / want) <= 1e-6:
            return failed(
                tr(
                    "That is 1/S, the factor by which the engine scales up the kept tokens; the exercise asks "
                    "for S itself, the kept mass (at most 1)."
                )
            )
        if abs(out - (1 - want)) <= 1e-6:
            return failed(tr("That is the dropped mass 1 − S; return the kept mass S."))
        p = logp.exp().sort(descending=True).values
        strict = float(p[p.cumsum(0) <= top_p + 1e-12].sum())
        if abs(out - strict) <= 1e-6:
            return failed(
                tr(
                    "You stopped one token early: keep the token that makes the cumulative mass reach top_p "
                    "(keep a token while the mass of the tokens ranked above it is below top_p)."
                )
            )
        return failed(
            tr(
                "Not the kept mass: for top_p = {top_p} expected S = {want:.6f}, got {out:.6f}. Sort the "
                "probabilities, keep a token while the mass above it is below top_p, and sum the kept "
                "ones.",
                top_p=top_p,
                want=want,
                out=out,
            )
        )
    return passed(
        tr(
            "S computed right: the engine samples p(x)/S on the kept set, so every ratio "
            "pi_train/pi_engine of a sampled token carries the factor S."
        )
    )


def tis_weights(fn: Callable[[torch.Tensor, torch.Tensor, float], Any]) -> CheckResult:
    """Exercise 3: ``fn(train_logprob, rollout_logprob, cap)`` returns per-token truncated importance weights
    min(pi_train/pi_rollout, cap) for tokens sampled by the rollout engine."""
    g = torch.Generator().manual_seed(8008)
    rollout = -torch.rand(3, 7, generator=g, dtype=torch.float64) * 4
    train = rollout + 0.8 * torch.randn(3, 7, generator=g, dtype=torch.float64)
    train[0, 0] = rollout[0, 0] + 40.0  # an extreme token: the weight must stay finite once capped
    cap = 2.0
    want = torch.exp(train - rollout).clamp(max=cap)
    out = learner_answer(
        fn,
        train.clone(),
        rollout.clone(),
        cap,
        convert=lambda o: as_answer_tensor(o, tuple(train.shape), tr("your weights")),
    )
    if isinstance(out, CheckResult):
        return out
    if not bool(torch.isfinite(out).all()):
        return failed(
            tr(
                "Your weights hold inf or NaN: cap the ratio (clamp(max=cap)) so that a token with a huge "
                "log-ratio gets weight cap."
            )
        )
    if torch.allclose(out, want, atol=1e-9):
        return passed(
            tr("Truncated IS: min(pi_train/pi_rollout, C) per token (verl rollout_is='token', TRL token_truncate).")
        )
    inv = torch.exp(rollout - train).clamp(max=cap)
    if torch.allclose(out, inv, atol=1e-9):
        return failed(
            tr("Ratio inverted: the weight is target over sampler, pi_train/pi_rollout = exp(train − rollout).")
        )
    if torch.allclose(out, want.clamp(min=1 / cap), atol=1e-9):
        return failed(tr("You also clipped from below at 1/C: TIS only truncates from above (small weights are kept)."))
    seq = torch.exp((train - rollout).sum(-1, keepdim=True)).clamp(max=cap).expand_as(want)
    if torch.allclose(out, seq, atol=1e-9):
        return failed(
            tr(
                "That is the sequence-level weight (product over the response); the exercise asks "
                "for one weight per token."
            )
        )
    if torch.allclose(out[1:], torch.exp(train - rollout)[1:], atol=1e-9):
        return failed(tr("No truncation: weights above C = {cap} must be cut to C.", cap=cap))
    return failed(tr("Not the TIS weights: per token exp(train_logprob − rollout_logprob), then clamp(max=cap)."))


def paired_difference(fn: Callable[[Any, Any], Any]) -> CheckResult:
    """Exercise 4: ``fn(a, b)`` returns ``(mean, se)`` of the difference a − b of two runs' final values,
    one pair per seed (``a[i]`` and ``b[i]`` trained with seed i): the mean of the per-seed differences
    and its standard error, std(a − b, ddof=1) / sqrt(n)."""
    import math

    g = torch.Generator().manual_seed(808)
    shared = torch.randn(8, generator=g, dtype=torch.float64)  # what a seed's batches do to both runs
    a = 0.5 + shared + 0.1 * torch.randn(8, generator=g, dtype=torch.float64)
    b = 0.3 + shared + 0.1 * torch.randn(8, generator=g, dtype=torch.float64)
    d = a - b
    n = d.numel()
    want_mean, want_se = float(d.mean()), float(d.std()) / math.sqrt(n)

    def convert(o: Any) -> tuple[float, float]:
        if not (isinstance(o, (tuple, list)) and len(o) == 2):
            raise WrongAnswer(tr("return two numbers (mean, se), got {name}", name=type(o).__name__))
        return as_answer_number(o[0], tr("your mean")), as_answer_number(o[1], tr("your standard error"))

    out = learner_answer(fn, a.clone(), b.clone(), convert=convert)
    if isinstance(out, CheckResult):
        return out
    mean, se = out
    if abs(mean - want_mean) > 1e-9:
        if abs(mean + want_mean) < 1e-9:
            return failed(tr("Sign swapped: the difference is a − b."))
        return failed(
            tr(
                "The mean difference is the mean of a − b over the seeds ({want_mean:.4f}); got {mean:.4f}.",
                want_mean=want_mean,
                mean=mean,
            )
        )
    if abs(se - want_se) < 1e-9:
        return passed(
            tr(
                "Paired: {want_mean:.3f} ± {want_se:.3f}. The seed's shared part cancels in a − b, so "
                "the paired SE is far smaller than the runs' own spreads suggest.",
                want_mean=want_mean,
                want_se=want_se,
            )
        )
    unpaired = math.sqrt(float(a.var()) / n + float(b.var()) / n)
    if abs(se - unpaired) < 1e-9:
        return failed(
            tr(
                "That SE ({se:.3f}) treats the runs as independent: sqrt(se_a² + se_b²). Runs with the "
                "same seed share their first batch; take the SE of the per-seed differences instead "
                "({want_se:.3f}).",
                se=se,
                want_se=want_se,
            )
        )
    if abs(se - float(d.std(unbiased=False)) / math.sqrt(n)) < 1e-9:
        return failed(tr("Use the sample standard deviation (ddof = 1) of the differences."))
    if abs(se - float(d.std())) < 1e-9:
        return failed(tr("That is the spread of the differences; the standard error divides it by sqrt(n)."))
    return failed(tr("Not the paired SE: std(a − b, ddof=1) / sqrt(number of seeds)."))
