"""Monte Carlo statistics of the k1, k2, k3 estimators: bias, spread, and the reproduced tables.

:func:`estimator_stats` streams over samples in chunks: each chunk of Gaussian draws is turned
into k1, k2, k3 by :mod:`klviz.kernel` (k3 with its series near r = 1, written into scratch
buffers by :func:`klviz.kernel.k3_into`) and reduced to sums of deviations from a fixed shift
(the first chunk's mean), accumulated in float64; on the CPU a second thread draws the next chunk
meanwhile. So 10^7 samples cost little more than drawing them, no array of size n is ever made,
and the variance never suffers from catastrophic cancellation.
"""

from __future__ import annotations

import contextlib
import math
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch
from torch.distributions import Categorical, Distribution, Normal

from . import kernel
from .devices import check_generator, resolve_device, single_thread
from .statistics import RunningMoments
from .validation import as_float_tensor, check_positive_int

__all__ = [
    "estimator_stats",
    "categorical_counts",
    "check_probabilities",
    "moments_from_counts",
    "summarize",
    "ESTIMATORS",
    "MAX_SAMPLES",
]

ESTIMATORS = kernel.ESTIMATORS
#: The most samples one call draws: 10^10 Gaussian draws take about 20 minutes on a 2-core CPU;
#: beyond that a typo (10**30) would run for years instead of failing.
MAX_SAMPLES = 10**10
_CHUNK = 1 << 18  # categorical draws per chunk (float64 uniforms: 2 MiB)
_NORMAL_CHUNK = {"cpu": 1 << 16, "cuda": 1 << 24}  # Gaussian draws per chunk, by device type


def _relative(value: float, true_kl: float) -> float:
    if true_kl > 0:
        return value / true_kl
    return 0.0 if value == 0 else math.copysign(math.inf, value)


class _ShiftedSums:
    """Sums of d = x - K and of d² over a stream of chunks, in float64, for one statistic.

    The shift K is the mean of the first chunk, so it sits within a few standard errors of the
    final mean: M2 = sum d² - (sum d)² / n then subtracts a term that is tiny next to sum d², and no
    digits are lost to cancellation (the textbook E[x²] - E[x]² would lose them all when the mean
    is large next to the spread). Each chunk's two sums are float32 sums in torch (``sum``, a
    cascade sum, and ``dot(d, d)``, both vectorised reads of d), added to float64 totals.
    """

    def __init__(self) -> None:
        self.n = 0
        self.shift: float | None = None
        self.s1 = 0.0
        self.s2 = 0.0

    def add(self, x: Any, d: torch.Tensor) -> None:
        """Add a chunk ``x`` (NumPy array or torch tensor), using the tensor ``d`` of its size as scratch.

        For a NumPy ``x``, ``d`` is a CPU tensor: the subtraction runs in NumPy on d's memory.
        """
        if isinstance(x, np.ndarray):
            if self.shift is None:
                self.shift = float(x.mean(dtype=np.float64))
            np.subtract(x, x.dtype.type(self.shift), out=d.numpy())
        else:
            if self.shift is None:
                self.shift = float(x.mean(dtype=torch.float64))
            torch.sub(x, self.shift, out=d)
        s1, s2 = d.sum().item(), torch.dot(d, d).item()
        self.n += x.shape[0]
        self.s1 += s1
        self.s2 += s2

    def moments(self) -> RunningMoments:
        assert self.shift is not None, "no chunk was added"
        mean = self.shift + self.s1 / self.n
        m2 = max(self.s2 - self.s1 * self.s1 / self.n, 0.0)
        return RunningMoments(self.n, mean, m2)


def _normal_stats(
    q: Normal,
    p: Normal,
    n: int,
    gen: torch.Generator | None,
    dev: torch.device,
    chunk: int,
    use_numpy: bool | None = None,
    draw_ahead: bool | None = None,
) -> dict[str, RunningMoments]:
    mq, sq = q.loc.to(dev, torch.float64), q.scale.to(dev, torch.float64)
    mp, sp = p.loc.to(dev, torch.float64), p.scale.to(dev, torch.float64)
    # With x = mq + sq z, log r = log p(x) - log q(x) is a quadratic a + b z + c z² in z ~ N(0, 1).
    a = float(torch.log(sq / sp) - (mq - mp).square() / (2 * sp.square()))
    b = float(-(mq - mp) * sq / sp.square())
    c = float(0.5 - sq.square() / (2 * sp.square()))
    dtype = torch.promote_types(torch.promote_types(q.loc.dtype, p.loc.dtype), torch.float32)
    # One streaming pass: each chunk of z ~ N(0, 1) is drawn into a buffer (with the torch
    # generator), turned into log r in place, and k1, k2, k3 of it (klviz.kernel; k3 stable near
    # r = 1) are reduced to sums: chunk-sized buffers only, nothing of size n. On the CPU the
    # elementwise arithmetic runs in NumPy on the buffers' memory (with AVX-512 its expm1 is five
    # times faster than torch's) and the sums in torch, on one thread (a chunk fits in cache; a
    # thread pool's hand-offs would cost more than the work), while a second thread draws the
    # next chunk into a second buffer: the draw is a third of the work, and the generator is used
    # by that thread alone, chunk after chunk, so the samples are those of a plain loop.
    sizes = [min(chunk, n - i) for i in range(0, n, chunk)]
    cpu = dev.type == "cpu" if use_numpy is None else use_numpy
    if draw_ahead is None:
        draw_ahead = dev.type == "cpu" and len(sizes) > 1 and _cpu_count() > 1
    zs = [torch.empty(sizes[0], device=dev, dtype=dtype) for _ in range(2 if draw_ahead else 1)]
    v_t, d_t, s_t, w_t = (torch.empty_like(zs[0]) for _ in range(4))  # k3; deviations; k3's scratch
    v_all, s_all, w_all = (x.numpy() for x in (v_t, s_t, w_t)) if cpu else (v_t, s_t, w_t)

    def draw(z: torch.Tensor, m: int) -> torch.Tensor:
        """The next chunk of draws: log r itself when c = 0 (a + |b| z: z and -z have one
        distribution), else z."""
        return z[:m].normal_(generator=gen) if c != 0.0 else z[:m].normal_(a, abs(b), generator=gen)

    sums = {k: _ShiftedSums() for k in ESTIMATORS}
    with contextlib.ExitStack() as stack:
        stack.enter_context(single_thread())
        stack.enter_context(np.errstate(over="ignore", invalid="ignore"))
        pool = stack.enter_context(ThreadPoolExecutor(1, "klviz-draw")) if draw_ahead else None
        pending = pool.submit(draw, zs[0], sizes[0]) if pool else None
        for i, m in enumerate(sizes):
            if pool is not None and pending is not None:
                z = pending.result()
                if i + 1 < len(sizes):
                    pending = pool.submit(draw, zs[(i + 1) % 2], sizes[i + 1])
            else:
                z = draw(zs[0], m)
            log_r: Any = z.numpy() if cpu else z
            v, s, w, d = v_all[:m], s_all[:m], w_all[:m], d_t[:m]
            if c != 0.0:
                v[...] = log_r
                v *= c
                v += b
                log_r *= v
                log_r += a  # log r = a + b z + c z²
            sums["k1"].add(kernel.k1(log_r), d)
            sums["k2"].add(kernel.k2(log_r), d)
            sums["k3"].add(kernel.k3_into(log_r, v, s, w), d)
    return {k: sums[k].moments() for k in ESTIMATORS}


def _cpu_count() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def check_probabilities(probs: Any, name: str) -> torch.Tensor:
    """``probs`` as a float64 1-D tensor of non-negative, finite weights with a positive sum.

    Unnormalised weights are accepted (they are divided by their sum); NaN, inf, negative entries,
    an all-zero or empty vector and more than one axis raise ``ValueError`` naming ``name``.
    """
    pr = as_float_tensor(probs, name).to(torch.float64)
    if pr.dim() != 1:
        raise ValueError(f"{name} must be 1-D (one probability per category), got shape {tuple(pr.shape)}")
    if bool((pr < 0).any()):
        raise ValueError(f"{name} has negative entries (smallest {float(pr.min()):g}); probabilities are ≥ 0")
    if not float(pr.sum()) > 0:
        raise ValueError(f"{name} is all zero: there is no category to draw")
    return pr


def categorical_counts(
    probs: torch.Tensor, num_samples: int, *, generator: torch.Generator | None = None, chunk_size: int = _CHUNK
) -> torch.Tensor:
    """How many of ``num_samples`` draws from the categorical ``probs`` landed on each category.

    Draws by inverse CDF on uniform numbers from ``generator``, chunk by chunk, keeping only the
    counts: for any function g, ``sum(counts * g) / n`` is the sample mean of g(x_i), which is
    why a sampled average needs no explicit factor q(x): the weight is in how often x is drawn.
    """
    n = check_positive_int(num_samples, "num_samples", maximum=MAX_SAMPLES)
    pr = check_probabilities(probs, "probs")
    cdf = torch.cumsum(pr, 0)
    cdf = cdf / cdf[-1]
    counts = torch.zeros_like(pr)
    done = 0
    while done < n:
        m = min(chunk_size, n - done)
        u = torch.rand(m, generator=generator, device=pr.device, dtype=torch.float64)
        idx = torch.searchsorted(cdf, u, right=True).clamp_max_(pr.numel() - 1)
        counts += torch.bincount(idx, minlength=pr.numel()).to(counts.dtype)
        done += m
    return counts


def moments_from_counts(counts: torch.Tensor, log_r: torch.Tensor) -> dict[str, RunningMoments]:
    """Moments of k1, k2, k3 over draws summarised as ``counts`` per category with ``log_r`` per category."""
    n = int(counts.sum())
    used = counts > 0
    w = counts[used].to(torch.float64)
    moments = {}
    for name, values in kernel.estimates(log_r[used].to(torch.float64)).items():
        mean = float((w * values).sum() / n)
        rm = RunningMoments()
        rm.add_moments(n, mean, float((w * (values - mean).square()).sum()))
        moments[name] = rm
    return moments


def summarize(moments: dict[str, RunningMoments], true_kl: float) -> dict[str, Any]:
    """The mapping :func:`estimator_stats` returns, from moments and the true KL.

    With a single sample the spread is unknown: ``std``, ``se`` and ``std_rel`` are NaN (as
    :func:`klviz.statistics.mean_se` gives), never a 0 that would look like a measured certainty.
    """
    n = next(iter(moments.values())).n
    out: dict[str, Any] = {"true_kl": true_kl, "num_samples": n}
    for name, rm in moments.items():
        bias = rm.mean - true_kl
        std = rm.std if n > 1 else math.nan
        out[name] = {
            "mean": rm.mean,
            "bias": bias,
            "std": std,
            "se": std / math.sqrt(n) if n > 1 else math.nan,
            "bias_rel": _relative(bias, true_kl),
            "std_rel": _relative(std, true_kl) if n > 1 else math.nan,
        }
    return out


def _categorical_stats(
    q: Categorical, p: Categorical, n: int, gen: torch.Generator | None, dev: torch.device, chunk: int
) -> dict[str, RunningMoments]:
    probs_q = q.probs.to(dev, torch.float64)
    log_r = (p.logits - q.logits).to(dev, torch.float64)  # per category; logits are normalised
    support = probs_q > 0
    counts = categorical_counts(probs_q, n, generator=gen, chunk_size=chunk)
    if bool((counts[~support] > 0).any()):  # pragma: no cover - inverse CDF never picks zero mass
        raise RuntimeError("sampled a token with zero probability")
    return moments_from_counts(counts, log_r)


def estimator_stats(
    q: Distribution,
    p: Distribution,
    num_samples: int,
    *,
    generator: torch.Generator | None = None,
    device: str | torch.device | None = None,
    chunk_size: int | None = None,
) -> dict[str, Any]:
    """Bias and spread of k1, k2, k3 as estimators of **KL(q || p)**, from ``num_samples`` draws x ~ q.

    ``q`` (the sampler) and ``p`` (the target) are ``torch.distributions`` objects with no batch
    shape: two ``Normal`` or two ``Categorical`` over the same categories. Returns

    ``{"true_kl": float, "num_samples": n, "k1": {...}, "k2": {...}, "k3": {...}}`` where each
    estimator maps ``"mean"``, ``"bias"`` (mean - true), ``"std"`` (single-sample standard deviation),
    ``"se"`` (standard error of the mean, std/sqrt(n)), ``"bias_rel"`` and ``"std_rel"`` (divided by
    the true KL; when the true KL is 0 they are 0 for a zero numerator and inf otherwise).

    Sampling uses ``generator`` (a ``torch.Generator`` on ``device``) so results repeat under a seed;
    ``device`` defaults to the device of q's parameters. Samples are drawn ``chunk_size`` at a time
    (default for Normal: 65,536 on the CPU, where a chunk stays in cache, 16 million on CUDA;
    262,144 for Categorical) and never all held at once: each Normal chunk is reduced to sums of
    the deviations of k1, k2, k3 from a fixed shift near their means (no cancellation in the
    variance), with k1, k2, k3 from :mod:`klviz.kernel` (k3 stable near r = 1); on the CPU a second
    thread draws the next chunk while one is reduced, from the same generator in the same order.
    Categorical draws are reduced to counts per category. Results repeat exactly for a given seed,
    device and chunk size.
    """
    n = check_positive_int(num_samples, "num_samples", maximum=MAX_SAMPLES)
    chunk = None if chunk_size is None else check_positive_int(chunk_size, "chunk_size")
    for dist, name in ((q, "q"), (p, "p")):
        if not isinstance(dist, (Normal, Categorical)):
            raise ValueError(f"{name} must be a torch.distributions Normal or Categorical, got {type(dist).__name__}")
        if dist.batch_shape != torch.Size():
            raise ValueError(
                f"{name} must be a single distribution (batch_shape ()), got batch_shape {tuple(dist.batch_shape)}"
            )
    if type(q) is not type(p):
        raise ValueError(f"q is a {type(q).__name__} but p is a {type(p).__name__}; both must be of one kind")
    if isinstance(q, Categorical) and isinstance(p, Categorical) and q.probs.numel() != p.probs.numel():
        raise ValueError(f"q has {q.probs.numel()} categories but p has {p.probs.numel()}")
    params = q.loc if isinstance(q, Normal) else q.probs  # type: ignore[attr-defined]
    for dist, name in ((q, "q"), (p, "p")):
        if any(v.device.type == "meta" for v in _parameters(dist)):
            raise ValueError(f"{name} has parameters on the 'meta' device: they hold no numbers to sample from")
    dev = resolve_device(device) if device is not None else params.device
    check_generator(generator, dev)
    for dist, name in ((q, "q"), (p, "p")):
        vals = _parameters(dist)
        if not all(bool(torch.isfinite(v).all()) for v in vals):
            raise ValueError(f"{name} has NaN or inf parameters")
        if isinstance(dist, Normal) and not bool((dist.scale > 0).all()):
            raise ValueError(
                f"{name} has scale {float(dist.scale):g}; a Normal's scale must be positive "
                "(it was built with validate_args=False, which let it through)"
            )
        if isinstance(dist, Categorical):
            check_probabilities(dist.probs, f"{name}.probs")

    true_kl = float(torch.distributions.kl_divergence(_float64_copy(q), _float64_copy(p)))
    if isinstance(q, Normal) and isinstance(p, Normal):
        moments = _normal_stats(q, p, n, generator, dev, chunk or _NORMAL_CHUNK.get(dev.type, _CHUNK))
    else:
        assert isinstance(q, Categorical) and isinstance(p, Categorical)
        if not math.isfinite(true_kl):
            raise ValueError("p gives zero probability to a token that q can sample: KL(q||p) is infinite")
        moments = _categorical_stats(q, p, n, generator, dev, chunk or _CHUNK)

    return summarize(moments, true_kl)


def _parameters(d: Distribution) -> tuple[torch.Tensor, ...]:
    """A Normal's loc and scale, or a Categorical's probabilities."""
    if isinstance(d, Normal):
        return (d.loc, d.scale)
    return (d.probs,)  # type: ignore[attr-defined]


def _float64_copy(d: Distribution) -> Distribution:
    """The same Normal or Categorical with float64 parameters on the CPU (for the exact KL)."""
    if isinstance(d, Normal):
        return Normal(d.loc.double().cpu(), d.scale.double().cpu())
    assert isinstance(d, Categorical)
    return Categorical(probs=d.probs.double().cpu())
