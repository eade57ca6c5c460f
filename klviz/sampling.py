"""Sampling as weighting: draws, running means, importance weights and effective sample size.

An expectation over a vocabulary, ``sum_x q(x) g(x)``, is estimated by the plain mean
``(1/N) sum_i g(x_i)`` of tokens drawn from q: the factor q(x) is in how often x is drawn.
When the tokens come from another distribution mu, each term needs the **importance weight**
``w(x) = q(x) / mu(x)``; the price is variance, measured by the **effective sample size**.
Lesson 01 is built from the functions here.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from .devices import check_generator
from .policies import zipf_logits
from .statistics import mean_se
from .validation import Tensor, as_float_tensor, check_positive_int, check_same_shape

__all__ = [
    "draw_tokens",
    "importance_weights",
    "effective_sample_size",
    "ess_fraction",
    "expected_ess_fraction",
    "importance_variance_ratio",
    "RunningMean",
    "running_mean",
    "log_spaced_counts",
    "zipf_policy_pair",
]

_CHUNK = 1 << 18
#: The chunk of draws and running sums: a caller that draws a chunk at a time with this size gets the same draws
#: as one call of :func:`draw_tokens` and the same numbers as :func:`running_mean`.
SAMPLING_CHUNK = _CHUNK


def _probs_vector(probs: Any, name: str) -> Tensor:
    pr = as_float_tensor(probs, name)
    if pr.dim() != 1:
        raise ValueError(f"{name} must be a 1-D probability vector, got shape {tuple(pr.shape)}")
    if bool((pr < 0).any()):
        raise ValueError(f"{name} has negative probabilities")
    total = float(pr.sum(dtype=torch.float64))
    if not abs(total - 1.0) < 1e-4:
        raise ValueError(f"{name} must sum to 1, sums to {total:.6g}")
    return pr


def draw_tokens(
    probs: Tensor, num_samples: int, *, generator: torch.Generator | None = None, chunk_size: int = _CHUNK
) -> Tensor:
    """``num_samples`` token ids drawn from the categorical ``probs`` by inverse CDF (int64 tensor).

    Uses the same uniforms and the same rule as :func:`klviz.montecarlo.categorical_counts`, so with
    the same seed ``torch.bincount(draw_tokens(...))`` equals the counts it returns: this function
    keeps the order of the draws (needed for a running mean), the other only their counts.
    """
    n = check_positive_int(num_samples, "num_samples")
    chunk = check_positive_int(chunk_size, "chunk_size")
    pr = _probs_vector(probs, "probs").to(torch.float64)
    check_generator(generator, pr.device)
    cdf = torch.cumsum(pr, 0)
    cdf = cdf / cdf[-1]
    out = torch.empty(n, dtype=torch.int64, device=pr.device)
    for start in range(0, n, chunk):
        m = min(chunk, n - start)
        u = torch.rand(m, generator=generator, device=pr.device, dtype=torch.float64)
        out[start : start + m] = torch.searchsorted(cdf, u, right=True).clamp_max_(pr.numel() - 1)
    return out


def importance_weights(log_target: Tensor, log_sampler: Tensor) -> Tensor:
    """``w = target(x) / sampler(x) = exp(log_target - log_sampler)``, elementwise.

    ``log_target`` is the log-probability under the distribution the expectation is taken over (q),
    ``log_sampler`` under the one that actually drew the tokens (mu). ``-inf`` in ``log_target`` is a
    weight of 0; ``-inf`` in ``log_sampler`` where the target is positive raises ``ValueError``: such a
    token is never drawn, so no weighting can recover its share of the expectation.
    """
    lt = as_float_tensor(log_target, "log_target", allow_neg_inf=True)
    ls = as_float_tensor(log_sampler, "log_sampler", allow_neg_inf=True)
    check_same_shape(lt, ls, "log_target", "log_sampler")
    uncovered = torch.isneginf(ls) & ~torch.isneginf(lt)
    if bool(uncovered.any()):
        raise ValueError(
            f"log_sampler is -inf at {int(uncovered.sum())} token(s) where log_target is not: the "
            "sampler never draws tokens the target can emit, so importance weights cannot fix the bias"
        )
    diff = torch.where(torch.isneginf(lt), torch.full_like(lt, -math.inf), lt - ls)
    return torch.exp(diff)


def _weights_and_counts(weights: Tensor, counts: Tensor | None) -> tuple[Tensor, Tensor]:
    w = as_float_tensor(weights, "weights").to(torch.float64)
    if bool((w < 0).any()):
        raise ValueError("weights must be non-negative (they are ratios of probabilities)")
    if counts is None:
        c = torch.ones_like(w)
    else:
        c = as_float_tensor(counts, "counts").to(torch.float64)
        check_same_shape(w, c, "weights", "counts")
        if bool((c < 0).any()):
            raise ValueError("counts must be non-negative")
    if not float((c * w).sum()) > 0:
        raise ValueError("weights are all zero (on the drawn tokens): no sample says anything about the target")
    return w, c


def effective_sample_size(weights: Tensor, counts: Tensor | None = None) -> float:
    """Kish's effective sample size ``(sum w)^2 / sum w^2`` of importance-weighted samples.

    Equal weights give N (every draw counts fully); one dominant weight gives about 1. With
    ``counts`` the weights are per category and ``counts`` says how often each was drawn.
    """
    w, c = _weights_and_counts(weights, counts)
    return float((c * w).sum() ** 2 / (c * w * w).sum())


def ess_fraction(weights: Tensor) -> tuple[float, float]:
    """``ESS / N`` of per-sample ``weights`` and its standard error (delta method).

    ESS/N = mean(w)^2 / mean(w^2); its large-N limit is :func:`expected_ess_fraction`.
    """
    w, _ = _weights_and_counts(weights, None)
    n = w.numel()
    if n < 2:
        raise ValueError("weights needs at least two samples for a standard error")
    a, b = float(w.mean()), float((w * w).mean())
    # gradient of a^2 / b with respect to (a, b), times the covariance of (w, w^2) / n
    ga, gb = 2 * a / b, -a * a / (b * b)
    d = ga * (w - a) + gb * (w * w - b)
    return a * a / b, mean_se(d)[1]


def expected_ess_fraction(target_probs: Tensor, sampler_probs: Tensor) -> float:
    """Large-N limit of ESS/N for weights target/sampler: ``1 / sum_x target(x)^2 / sampler(x)``.

    The denominator is E_sampler[w^2] = 1 + chi^2(target || sampler): the further the sampler is from
    the target (especially where the sampler is thin and the target is not), the fewer useful samples.
    """
    t = _probs_vector(target_probs, "target_probs").to(torch.float64)
    s = _probs_vector(sampler_probs, "sampler_probs").to(torch.float64)
    check_same_shape(t, s, "target_probs", "sampler_probs")
    if bool(((s == 0) & (t > 0)).any()):
        raise ValueError("sampler_probs is 0 where target_probs is not: the weights are unbounded")
    second = torch.where(t > 0, t * t / s.clamp_min(torch.finfo(torch.float64).tiny), torch.zeros_like(t)).sum()
    return float(1.0 / second)


def importance_variance_ratio(target_probs: Tensor, sampler_probs: Tensor, values: Tensor) -> float:
    """How many times the variance of one draw grows when ``values`` g is averaged over the sampler's
    tokens with weights w = target/sampler instead of over the target's own tokens (exact, by enumeration):

        Var_sampler(w · g) / Var_target(g).

    N weighted tokens are then worth N divided by this many tokens from the target *for this g*. Kish's
    ESS (:func:`expected_ess_fraction`) does not look at g at all: it is a rule of thumb for how much
    weights cost, not the cost for the quantity being averaged.
    """
    t = _probs_vector(target_probs, "target_probs").to(torch.float64)
    s = _probs_vector(sampler_probs, "sampler_probs").to(torch.float64)
    g = as_float_tensor(values, "values").to(torch.float64)
    check_same_shape(t, s, "target_probs", "sampler_probs")
    check_same_shape(t, g, "target_probs", "values")
    if bool(((s == 0) & (t > 0)).any()):
        raise ValueError("sampler_probs is 0 where target_probs is not: the weights are unbounded")
    mean = float((t * g).sum())  # E_target[g] = E_sampler[w g]
    var_target = float((t * (g - mean).square()).sum())
    if var_target <= 0:
        raise ValueError("values is constant under target_probs: there is no variance to compare")
    w = torch.where(t > 0, t / s.clamp_min(torch.finfo(torch.float64).tiny), torch.zeros_like(t))
    var_sampler = float((s * (w * g - mean).square()).sum())
    return var_sampler / var_target


def log_spaced_counts(num_samples: int, num_points: int = 200) -> np.ndarray:
    """Distinct sample counts from 1 to ``num_samples``, evenly spaced on a log scale (int64 array)."""
    n = check_positive_int(num_samples, "num_samples")
    k = check_positive_int(num_points, "num_points")
    pts = np.unique(np.round(np.logspace(0, math.log10(n), k)).astype(np.int64))
    return pts[(pts >= 1) & (pts <= n)]


class RunningMean:
    """:func:`running_mean` of a sequence that arrives in order, a chunk at a time: ``add(chunk)`` for each,
    then ``result()``. ``total`` is the length of the whole sequence (it fixes the log-spaced counts).

    Memory: the chunk and its two cumulative sums, whatever the length of the sequence. Chunks of the sizes
    :func:`running_mean` uses give its numbers exactly (the same pilot value, the same sums).
    """

    def __init__(self, total: int, num_points: int = 200) -> None:
        self.total = check_positive_int(total, "total")
        self.pts = log_spaced_counts(self.total, num_points)
        self.a = np.empty(len(self.pts))  # sum of d = v - shift over the first pts[j] samples
        self.b = np.empty(len(self.pts))  # sum of d²
        self.c1 = self.c2 = 0.0  # the totals over the chunks so far
        self.j = 0
        self.seen = 0
        self.shift: float | None = None

    def add(self, values: Tensor) -> None:
        """The next ``values`` of the sequence (a float tensor; the first chunk sets the pilot value from its
        first 1,024 samples)."""
        v = as_float_tensor(values, "values").reshape(-1)
        if v.numel() == 0:
            return
        start, stop = self.seen, self.seen + v.numel()
        if stop > self.total:
            raise ValueError(f"values go past the total of {self.total:,} samples given to RunningMean")
        if self.shift is None:  # the pilot value: the mean of the first samples
            self.shift = float(v[: min(v.numel(), 1024)].to(torch.float64).mean())
        d = v.to(torch.float64) - self.shift
        s1 = torch.cumsum(d, 0).add_(self.c1)
        s2 = torch.cumsum(d.square_(), 0).add_(self.c2)
        k = int(np.searchsorted(self.pts, stop, side="right"))  # the counts that end in this chunk
        if k > self.j:
            idx = torch.as_tensor(self.pts[self.j : k] - 1 - start, device=v.device)
            self.a[self.j : k] = s1[idx].cpu().numpy()
            self.b[self.j : k] = s2[idx].cpu().numpy()
            self.j = k
        self.c1, self.c2 = float(s1[-1]), float(s2[-1])
        self.seen = stop

    def result(self) -> dict[str, np.ndarray]:
        """``{"n", "mean", "se"}`` as :func:`running_mean` returns them, once all ``total`` samples are in."""
        if self.seen != self.total or self.shift is None:
            raise ValueError(f"RunningMean has {self.seen:,} of its {self.total:,} samples")
        n = self.pts.astype(np.float64)
        mean = self.shift + self.a / n
        var = np.maximum((self.b - self.a * self.a / n) / np.maximum(n - 1, 1.0), 0.0)
        se = np.where(n > 1, np.sqrt(var / n), 0.0)
        return {"n": self.pts.astype(np.int64), "mean": mean, "se": se}


def running_mean(values: Tensor, num_points: int = 200, *, chunk_size: int = _CHUNK) -> dict[str, np.ndarray]:
    """Running mean of a sequence of samples and its standard error at log-spaced sample counts.

    Returns ``{"n", "mean", "se"}`` (NumPy arrays, float64): after the first ``n[j]`` samples the mean is
    ``mean[j]`` and the standard error ``se[j] = std / sqrt(n[j])`` (0 at n = 1). Sums are taken in
    float64 around a pilot value (the mean of the first samples), so no precision is lost to
    cancellation even for 10^7 samples. The running sums are built ``chunk_size`` samples at a time
    (:class:`RunningMean`): the scratch memory is a few chunks, not four copies of the whole sequence.
    """
    v = as_float_tensor(values, "values").reshape(-1)
    chunk = check_positive_int(chunk_size, "chunk_size")
    acc = RunningMean(v.numel(), num_points)
    for part in v.split(chunk):
        acc.add(part)
    return acc.result()


def zipf_policy_pair(
    vocab_size: int, *, exponent: float = 1.1, nudge: float = 0.5, generator: torch.Generator | None = None
) -> tuple[Tensor, Tensor]:
    """Two nearby policies over a large Zipf-like vocabulary: ``(log_q, log_p)``, normalised.

    ``log_q`` is :func:`klviz.policies.zipf_logits` with ranks shuffled over token ids; ``log_p``
    adds independent N(0, ``nudge``^2) noise to every logit of q (a fine-tuned model that moved each
    token a little) and renormalises. Both come from ``generator`` (CPU), so a seed fixes the pair.
    """
    v = check_positive_int(vocab_size, "vocab_size")
    if not (isinstance(nudge, (int, float)) and math.isfinite(nudge) and nudge >= 0):
        raise ValueError(f"nudge must be a finite non-negative number, got {nudge!r}")
    if not (isinstance(exponent, (int, float)) and math.isfinite(exponent) and exponent > 0):
        raise ValueError(f"exponent must be a finite positive number, got {exponent!r}")
    if generator is not None:
        check_generator(generator, torch.device("cpu"))
    log_q = zipf_logits(v, exponent, generator=generator)
    noise = torch.randn(v, generator=generator) * float(nudge)
    log_p = torch.log_softmax(log_q + noise, -1)
    return log_q, log_p
