"""Means and their standard errors, and the best control-variate coefficient: one home for each.

Every "value ± standard error" the suite prints comes from here:

- :func:`mean_se`: independent samples, SE = s / sqrt(n);
- :func:`mean_std_with_se`: also the single-sample std and its SE (delta method);
- :func:`clustered_mean_se`: a token mean over a ``[batch, tokens]`` mask with *sequences* as the
  independent units (tokens of one response are correlated);
- :func:`batch_means_se`: the SE of a statistic from its values on independent batches;
- :class:`RunningMoments`: count, mean and centred sum of squares merged chunk by chunk;
- :func:`control_variate_lambda`: λ* = −Cov(k1, r) / Var(r), the coefficient that minimises
  Var(k1 + λ (r − 1)), from exact or sampled moments alike;
- :data:`RESOLVED_AT_SE`, :func:`is_resolved` and :func:`verdict`: when the lessons call a difference
  between training runs resolved, and :func:`seeds_to_resolve`: how many seeds it would take;
- :data:`PM_SE` and :func:`plus_minus`: the one "±" convention of the suite (2 SE, always labelled).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .validation import Tensor, as_float_tensor

__all__ = [
    "mean_se",
    "mean_std_with_se",
    "clustered_mean_se",
    "clustered_mean_se_from_sums",
    "batch_means_se",
    "RunningMoments",
    "control_variate_lambda",
    "sample_moments",
    "RESOLVED_AT_SE",
    "is_resolved",
    "verdict",
    "ROUNDING",
    "PM_SE",
    "plus_minus",
    "seeds_to_resolve",
]

#: A paired difference of training runs over seeds is called resolved when its mean is at least this many
#: standard errors from zero (lessons 07 and 08). Under Student's t that is a two-sided p of about 0.02
#: with 8 seeds (7 degrees of freedom) and 0.009 with 16; a table of many comparisons still holds a false
#: alarm now and then.
RESOLVED_AT_SE = 3.0


#: Differences below this fraction of the compared values are float rounding, never an effect (two runs that
#: differ only in the last bits of their arithmetic, such as a mask of all tokens replayed).
ROUNDING = 1e-6


#: Every "±" the suite prints (readouts, tables, error bars and bands) is this many standard errors, and says so.
PM_SE = 2


def plus_minus(mean: float, se: float, fmt: str = ".4g") -> str:
    """``mean ± PM_SE·se``, labelled: ``plus_minus(0.05, 0.001)`` is ``"0.05 ± 0.002 (2 SE)"``.

    ``fmt`` formats the mean; the half-width gets two significant digits. A NaN or infinite ``se``
    (one sample, say) prints as ``"± n/a"`` instead of a number that looks measured.
    """
    if not math.isfinite(se):
        return f"{mean:{fmt}} ± n/a"
    return f"{mean:{fmt}} ± {PM_SE * se:.2g} ({PM_SE} SE)"


def seeds_to_resolve(diff: float, se: float, n: int) -> int | None:
    """How many seeds a paired difference measured as ``diff`` ± ``se`` over ``n`` seeds would need to be
    resolved (:data:`RESOLVED_AT_SE` standard errors), if its mean and spread stayed as measured: the SE
    shrinks like 1/sqrt(n). None when ``diff`` is 0 or not finite (no number of seeds would do)."""
    if not (math.isfinite(diff) and math.isfinite(se)) or diff == 0 or n < 1:
        return None
    return max(n, math.ceil(n * (RESOLVED_AT_SE * se / abs(diff)) ** 2))


def is_resolved(diff: float, se: float, scale: float = 0.0) -> bool:
    """Whether a mean difference ``diff`` with standard error ``se`` is :data:`RESOLVED_AT_SE` from zero.

    ``scale`` (the size of the values compared) marks differences within :data:`ROUNDING` of it as rounding:
    those are never resolved, however small their standard error.
    """
    if not (math.isfinite(diff) and math.isfinite(se)) or diff == 0:
        return False
    if abs(diff) <= ROUNDING * abs(scale):
        return False
    return abs(diff) >= RESOLVED_AT_SE * se


def verdict(diff: float, se: float, scale: float = 0.0) -> str:
    """ "resolved", "within noise" or "same up to rounding" (see :func:`is_resolved`)."""
    if diff == 0 and se == 0:
        return "identical"
    if abs(diff) <= ROUNDING * abs(scale):
        return "same up to rounding"
    return "resolved" if is_resolved(diff, se, scale) else "within noise"


def mean_se(values: Tensor) -> tuple[float, float]:
    """Mean of independent samples and its standard error ``s / sqrt(n)``.

    An empty input gives ``(nan, nan)``; a single sample gives its value and ``nan`` (one draw says
    nothing about the spread).
    """
    x = torch.as_tensor(values).double().reshape(-1)
    n = x.numel()
    if n == 0:
        return math.nan, math.nan
    mean = float(x.mean())
    return mean, (float(x.std()) / math.sqrt(n) if n > 1 else math.nan)


def mean_std_with_se(values: Tensor, counts: Tensor | None = None, *, check: bool = True) -> dict[str, float]:
    """Sample mean, single-sample std and the standard error of each, from one batch of samples.

    SE(mean) = s / sqrt(n); SE(std) ≈ sqrt(m4 - s⁴) / (2 s sqrt(n)) with m4 the sample fourth
    central moment (the delta method applied to Var(s²) ≈ (m4 - s⁴) / n). Needs n ≥ 2. With
    ``counts``, ``values[i]`` stands for ``counts[i]`` equal draws (a categorical sample kept as
    counts per category: :func:`klviz.categorical_counts`) and n is their total. ``check=False``
    skips the validation of ``values`` (a float tensor the caller knows to be finite).
    """
    if check:
        v = as_float_tensor(values, "values").to(torch.float64).reshape(-1)
    else:  # a caller's own float tensor, known finite (a panel's sample): no pass to look for NaN or inf
        v = values.to(torch.float64).reshape(-1)
    if counts is None:  # one draw per value: plain sums (a panel calls this on 10^5 draws per update)
        n = v.numel()
        if n < 2:
            raise ValueError(f"values must hold at least 2 samples, got {n}")
        m = float(v.sum()) / n
        d2 = (v - m).square_()
        var = float(d2.sum()) / (n - 1)
        m4 = float(d2.square_().sum()) / n
    else:
        w = torch.as_tensor(counts, dtype=torch.float64).reshape(-1)
        if w.shape != v.shape:
            raise ValueError(f"counts must have one entry per value ({v.numel()}), got {w.numel()}")
        n = int(round(float(w.sum())))
        if n < 2:
            raise ValueError(f"values must hold at least 2 samples, got {n}")
        m = float((w * v).sum()) / n
        d2 = (v - m).square()
        var = float((w * d2).sum()) / (n - 1)
        m4 = float((w * d2.square()).sum()) / n
    return _mean_std(m, var, m4, n)


def _mean_std(mean: float, var: float, m4: float, n: int) -> dict[str, float]:
    """The dict of :func:`mean_std_with_se` from the mean, the sample variance (divisor n − 1) and the fourth
    central moment of n samples: SE(std) by the delta method, sqrt(m4 − s⁴) / (2 s sqrt(n))."""
    s = math.sqrt(var)
    se_std = math.sqrt(max(m4 - var * var, 0.0) / n) / (2 * s) if s > 0 else 0.0
    return {"mean": mean, "se": s / math.sqrt(n), "std": s, "se_std": se_std, "n": n}


def clustered_mean_se(values: Tensor, mask: Tensor) -> tuple[float, float]:
    """Token mean of ``values`` over the boolean ``mask`` and its SE with sequences (rows) as clusters.

    The mean is the ratio estimator Σ_i s_i / Σ_i n_i (s_i, n_i: the sum and count of row i); its SE
    is the cluster-robust sqrt(b / (b − 1) Σ_i (s_i − mean · n_i)²) / Σ_i n_i over the b rows that
    count a token. Positions outside the mask are ignored, whatever they hold. Fewer than two such
    rows give an SE of ``nan``; no counted token at all gives ``(nan, nan)``.
    """
    m = torch.as_tensor(mask).bool()
    v = torch.where(m, torch.as_tensor(values).double(), torch.zeros((), dtype=torch.float64))
    return clustered_mean_se_from_sums(v.sum(-1).reshape(-1).numpy(), m.double().sum(-1).reshape(-1).numpy())


def clustered_mean_se_from_sums(sums: np.ndarray, counts: np.ndarray) -> tuple[float, float]:
    """:func:`clustered_mean_se` from per-row sums and token counts (what a pass over rows keeps).

    Rows with no counted token are left out; fewer than two rows give an SE of ``nan``.
    """
    s, n = np.asarray(sums, dtype=np.float64), np.asarray(counts, dtype=np.float64)
    keep = n > 0
    s, n = s[keep], n[keep]
    total = float(n.sum())
    if total == 0:
        return math.nan, math.nan
    mean = float(s.sum()) / total
    b = int(keep.sum())
    if b < 2:
        return mean, math.nan
    resid = s - mean * n
    return mean, math.sqrt(float(np.square(resid).sum()) * b / (b - 1)) / total


def batch_means_se(batch_values: Sequence[float]) -> float:
    """SE of a statistic from its values on ``b`` independent equal batches: std(ddof=1) / sqrt(b)."""
    vals = [float(v) for v in batch_values]
    b = len(vals)
    if b < 2:
        raise ValueError(f"batch_values needs at least 2 batches, got {b}")
    mean = sum(vals) / b
    return math.sqrt(sum((v - mean) ** 2 for v in vals) / (b - 1)) / math.sqrt(b)


@dataclass
class RunningMoments:
    """Count, mean and centred sum of squares (M2), mergeable chunk by chunk (Chan et al. 1979)."""

    n: int = 0
    mean: float = 0.0
    m2: float = 0.0

    def add_chunk(self, values: Tensor) -> None:
        """Merge a chunk of samples (any shape; float32 or float64)."""
        nb = values.numel()
        if nb == 0:
            return
        mb = float(values.mean(dtype=torch.float64))
        m2b = float((values - mb).square().sum(dtype=torch.float64))
        self.add_moments(nb, mb, m2b)

    def add_moments(self, nb: int, mb: float, m2b: float) -> None:
        """Merge the moments of another group of ``nb`` samples."""
        na, n = self.n, self.n + nb
        delta = mb - self.mean
        self.mean += delta * nb / n
        self.m2 += m2b + delta * delta * na * nb / n
        self.n = n

    @property
    def variance(self) -> float:
        """Unbiased sample variance (0 for fewer than two samples)."""
        return self.m2 / (self.n - 1) if self.n > 1 else 0.0

    @property
    def std(self) -> float:
        """Single-sample standard deviation."""
        return math.sqrt(max(self.variance, 0.0))

    @property
    def se(self) -> float:
        """Standard error of the mean, std / sqrt(n) (``nan`` before any sample)."""
        return self.std / math.sqrt(self.n) if self.n > 0 else math.nan


def sample_moments(a: Tensor, c: Tensor) -> dict[str, float]:
    """Population moments of two paired samples: ``var_a``, ``var_c`` and ``cov`` (divisor n)."""
    da, dc = a - a.mean(), c - c.mean()
    return {"var_a": float(da.square().mean()), "var_c": float(dc.square().mean()), "cov": float((da * dc).mean())}


class PairedMoments:
    """:func:`sample_moments` of two paired samples that arrive in chunks: ``add(a, c)`` per chunk, then ``result()``.

    Sums of da = a - K_a, dc = c - K_c, their squares and their product are kept in float64, with the
    shifts K the first chunk's means (within a few standard errors of the final means, so the
    subtraction of the squared mean loses no digits). Memory: the chunk, not the whole sample.
    """

    def __init__(self) -> None:
        self.n = 0
        self.shift: tuple[float, float] | None = None
        self.sums = np.zeros(5)  # da, dc, da², dc², da·dc

    def add(self, a: Tensor, c: Tensor) -> None:
        """Add a chunk of paired values (two float tensors of one shape)."""
        a, c = a.to(torch.float64).reshape(-1), c.to(torch.float64).reshape(-1)
        if self.shift is None:
            self.shift = (float(a.mean()), float(c.mean()))
        da, dc = a - self.shift[0], c - self.shift[1]
        self.sums += [float(da.sum()), float(dc.sum()), float(torch.dot(da, da)), float(torch.dot(dc, dc)),
                      float(torch.dot(da, dc))]  # fmt: skip
        self.n += a.numel()

    def result(self) -> dict[str, float]:
        """``var_a``, ``var_c`` and ``cov`` (divisor n) of everything added."""
        if self.n == 0:
            raise ValueError("no values were added")
        ma, mc, saa, scc, sac = self.sums / self.n
        return {"var_a": max(saa - ma * ma, 0.0), "var_c": max(scc - mc * mc, 0.0), "cov": sac - ma * mc}


class StreamedMeanStd:
    """:func:`mean_std_with_se` of a sample that arrives in chunks: ``add(values)`` per chunk, then ``result()``.

    Keeps float64 sums of d, d², d³ and d⁴ with d = v − K, K the first chunk's mean (close to the final
    mean, so the central moments rebuilt from these sums lose no digits that matter at panel sizes).
    Memory: one chunk, not the whole sample.
    """

    def __init__(self) -> None:
        self.n = 0
        self.shift: float | None = None
        self.sums = np.zeros(4)

    def add(self, values: Tensor) -> None:
        """Add a chunk of finite values (a float tensor of any shape)."""
        v = values.to(torch.float64).reshape(-1)
        if v.numel() == 0:
            return
        if self.shift is None:
            self.shift = float(v.mean())
        d = v - self.shift
        d2 = d * d
        self.sums += [float(d.sum()), float(d2.sum()), float(torch.dot(d2, d)), float(torch.dot(d2, d2))]
        self.n += v.numel()

    def result(self) -> dict[str, float]:
        """The same keys as :func:`mean_std_with_se`: ``mean``, ``se``, ``std``, ``se_std``, ``n``."""
        n = self.n
        if n < 2 or self.shift is None:
            raise ValueError(f"values must hold at least 2 samples, got {n}")
        m1, r2, r3, r4 = self.sums / n
        mu2 = max(r2 - m1 * m1, 0.0)  # central moments from the moments about the shift
        mu4 = max(r4 - 4 * m1 * r3 + 6 * m1 * m1 * r2 - 3 * m1**4, 0.0)
        return _mean_std(self.shift + m1, mu2 * n / (n - 1), mu4, n)


def control_variate_lambda(cov_k1_r: float, var_r: float) -> float:
    """λ* = −Cov(k1, r) / Var(r): the λ that minimises Var(k1 + λ (r − 1)) = Var k1 + 2λ Cov + λ² Var r.

    Works from exact moments and from sampled ones alike. 0 when Var(r) is 0 (p = q: every λ gives
    the same variance) or infinite (any λ ≠ 0 has infinite variance).
    """
    if not math.isfinite(var_r) or var_r <= 0.0:
        return 0.0
    return -cov_k1_r / var_r
