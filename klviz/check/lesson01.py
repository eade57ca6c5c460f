"""Exercise checks for lesson 01, sampling as weighting.

Each check calls the learner's function on cases it was not shown and names the mistake it finds:
weighting by the sampler twice, averaging over the vocabulary instead of the draws, weights inverted or
missing, an effective sample size upside down or not invariant to the scale of the weights.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from ..messages import tr
from . import CheckResult, as_answer_number, failed, learner_answer, never_raises, passed

__all__ = ["estimate_from_draws", "weighted_estimate", "effective_sample_size"]


def _close(a: float, b: float, tol: float = 1e-6) -> bool:
    return math.isfinite(a) and abs(a - b) <= tol * max(1.0, abs(b))


def _run(fn: Callable[..., Any], cases: list[tuple], what: str) -> list[float] | CheckResult:
    """Call ``fn`` on every case; a skeleton becomes "not attempted", an exception a clear failure."""
    out = []
    for args in cases:
        value = learner_answer(fn, *args, convert=lambda v: as_answer_number(v, what))
        if isinstance(value, CheckResult):
            return value
        out.append(value)
    return out


def _cases_same_sampler(seed: int = 11) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    cases = []
    for vocab, n in ((7, 50), (40, 400), (1000, 3000)):
        q = torch.softmax(torch.randn(vocab, generator=gen) * 1.5, -1)
        g = torch.randn(vocab, generator=gen) + 0.5
        tokens = torch.multinomial(q, n, replacement=True, generator=gen)
        cases.append((tokens, g, q))
    return cases


@never_raises
def estimate_from_draws(fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], Any]) -> CheckResult:
    """Exercise 1: ``fn(tokens, g, q)`` must estimate sum_x q(x) g(x) from ``tokens`` drawn from q.

    The right answer is the plain mean of g over the draws; q is passed only as a trap.
    """
    cases = _cases_same_sampler()
    got = _run(fn, cases, tr("the estimate"))
    if isinstance(got, CheckResult):
        return got
    right = [float(g[t].double().mean()) for t, g, _ in cases]
    if all(_close(a, b) for a, b in zip(got, right)):
        return passed(
            tr("The plain mean of g over the draws: the factor q(x) is already in how often each token was drawn.")
        )
    wrong = {
        "q_twice": [float((q[t] * g[t]).double().mean()) for t, g, q in cases],
        "vocab_mean": [float(g.double().mean()) for _, g, _ in cases],
        "sum": [float(g[t].double().sum()) for t, g, _ in cases],
        "exact": [float((q.double() * g.double()).sum()) for _, g, q in cases],
    }
    messages = {
        "q_twice": tr(
            "You multiplied by q(x_i): the draws already carry the weight q, so now it counts twice "
            "(this estimates sum_x q(x)^2 g(x))."
        ),
        "vocab_mean": tr(
            "You averaged g over the vocabulary: that gives every token the same weight, as if q were "
            "uniform; average over the draws instead."
        ),
        "sum": tr("You summed g over the draws: divide by the number of draws N."),
        "exact": tr(
            "That is the exact sum over the vocabulary, the quantity itself; the exercise is to estimate it "
            "from the draws without touching q, as RL code must."
        ),
    }
    for key, values in wrong.items():
        if all(_close(a, b) for a, b in zip(got, values)):
            return failed(messages[key])
    return failed(
        tr(
            "Not the plain mean of g over the drawn tokens (first case: expected {right_0:.6f}, got {got_0:.6f}).",
            right_0=right[0],
            got_0=got[0],
        )
    )


def _cases_other_sampler(seed: int = 23) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    cases = []
    for vocab, n in ((9, 60), (50, 500), (2000, 4000)):
        log_q = torch.log_softmax(torch.randn(vocab, generator=gen) * 1.5, -1)
        log_mu = torch.log_softmax(torch.randn(vocab, generator=gen), -1)
        g = torch.randn(vocab, generator=gen) + 1.0
        tokens = torch.multinomial(log_mu.exp(), n, replacement=True, generator=gen)
        cases.append((tokens, g, log_q, log_mu))
    return cases


@never_raises
def weighted_estimate(fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], Any]) -> CheckResult:
    """Exercise 2: ``fn(tokens, g, log_pi, log_mu)`` with tokens drawn from mu must estimate
    sum_x pi(x) g(x) without bias: the mean of (pi/mu)(x_i) g(x_i) (pi: the expectation's policy)."""
    cases = _cases_other_sampler()
    got = _run(fn, cases, tr("the weighted estimate"))
    if isinstance(got, CheckResult):
        return got

    def mean_of(weight: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], normalise: bool = False) -> list[float]:
        out = []
        for t, g, lq, lm in cases:
            w = weight(lq, lm).double()[t]
            out.append(float((w * g.double()[t]).sum() / (w.sum() if normalise else t.numel())))
        return out

    right = mean_of(lambda lq, lm: (lq - lm).exp())
    if all(_close(a, b) for a, b in zip(got, right)):
        return passed(
            tr(
                "Each draw weighted by pi(x)/mu(x), the expectation's policy over the sampler: "
                "unbiased for sum_x pi(x) g(x)."
            )
        )
    wrong = {
        "inverted": mean_of(lambda lq, lm: (lm - lq).exp()),
        "none": mean_of(lambda lq, lm: torch.ones_like(lq)),
        "self_normalised": mean_of(lambda lq, lm: (lq - lm).exp(), normalise=True),
        "log_weight": mean_of(lambda lq, lm: lq - lm),
    }
    messages = {
        "inverted": tr(
            "The weights are upside down: use pi(x)/mu(x), the distribution in the expectation over the "
            "one that drew the tokens."
        ),
        "none": tr("No weights: a plain mean over mu's tokens converges to E_mu[g], not E_pi[g]; it is biased."),
        "self_normalised": tr(
            "That is the self-normalised estimate, sum(w g)/sum(w): consistent, but biased for finite "
            "N; the exercise asks for the unbiased (1/N) sum(w g)."
        ),
        "log_weight": tr(
            "You used log pi - log mu as the weight; the weight is the ratio itself, exp(log pi - log mu)."
        ),
    }
    for key, values in wrong.items():
        if all(_close(a, b) for a, b in zip(got, values)):
            return failed(messages[key])
    return failed(
        tr(
            "Not the importance-weighted mean (first case: expected {right_0:.6f}, got {got_0:.6f}).",
            right_0=right[0],
            got_0=got[0],
        )
    )


@never_raises
def effective_sample_size(fn: Callable[[torch.Tensor], Any]) -> CheckResult:
    """Exercise 3: ``fn(weights)`` must return Kish's effective sample size (sum w)^2 / sum w^2."""
    gen = torch.Generator().manual_seed(5)
    base = [
        torch.rand(20, generator=gen) * 3,
        torch.exp(torch.randn(500, generator=gen) * 1.5),
        torch.tensor([1.0, 1.0, 1.0, 1.0]),
        torch.tensor([100.0, 0.01, 0.01, 0.01, 0.01]),
    ]
    cases = [(w,) for w in base] + [(w * 7.5,) for w in base]
    got = _run(fn, cases, tr("the effective sample size"))
    if isinstance(got, CheckResult):
        return got
    kish = [float(w.double().sum() ** 2 / (w.double() ** 2).sum()) for (w,) in cases]
    if all(_close(a, b) for a, b in zip(got, kish)):
        return passed(
            tr(
                "(sum w)^2 / sum w^2: N for equal weights, about 1 when one weight dominates, and the same "
                "whatever the scale of the weights."
            )
        )
    n = [w.numel() for (w,) in cases]
    if all(_close(a, 1.0 / b) for a, b in zip(got, kish)):
        return failed(tr("Upside down: you returned sum w^2 / (sum w)^2; equal weights must give N, not 1/N."))
    if all(_close(a, b / m) for a, b, m in zip(got, kish, n)):
        return failed(
            tr("That is the fraction ESS/N; the exercise asks for the effective number of samples, multiply by N.")
        )
    half = len(base)
    unscaled_ok = all(_close(a, b) for a, b in zip(got[:half], kish[:half]))
    scaled = [float(m / (w.double() ** 2).mean()) for (w,), m in zip(cases, n)]
    if all(_close(a, b) for a, b in zip(got, scaled)) or (
        unscaled_ok and not all(_close(a, b) for a, b in zip(got[half:], kish[half:]))
    ):
        return failed(
            tr(
                "Your answer changes when every weight is multiplied by the same constant; N / mean(w^2) "
                "assumes the weights average 1. Use (sum w)^2 / sum w^2, which is scale-free."
            )
        )
    return failed(
        tr(
            "Not Kish's effective sample size (for weights {tolist} expected 4, got {got_2:.4g}).",
            tolist=base[2].tolist(),
            got_2=got[2],
        )
    )
