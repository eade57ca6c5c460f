"""Seeded families of ``[batch, length]`` log-probability batches, for the claims about what a framework computes
(lessons 04-08): a policy, an old (sampling) policy and a reference, per token, with a response mask of ragged
lengths. Log-ratios range from rounding size to far beyond every clamp, so that every branch of a framework's
formula is exercised.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["Batch", "random_batches", "log_ratios"]


@dataclass(frozen=True)
class Batch:
    """Per-token log-probabilities of the current policy, the old (sampling) policy and the reference, and a 0/1
    mask of counted tokens (float64, ``[B, T]``; the first row always full, some rows possibly empty)."""

    logprob: torch.Tensor
    old: torch.Tensor
    ref: torch.Tensor
    mask: torch.Tensor
    detail: str

    def describe(self) -> str:
        b, t = self.logprob.shape
        return f"batch [{b}, {t}], {self.detail}"


def random_batches(n: int, seed: int = 0, *, empty_rows: bool = True) -> list[Batch]:
    """``n`` batches: B in 1-8, T in 1-24, log-ratio scales log-uniform in [1e-4, 30] (policy vs old and vs reference
    drawn separately), a few tokens pushed to ±(40-100) in one case out of four."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        b, t = int(rng.integers(1, 9)), int(rng.integers(1, 25))
        base = -rng.uniform(0.01, 6.0, size=(b, t))
        s_old = math.exp(rng.uniform(math.log(1e-4), math.log(30.0)))
        s_ref = math.exp(rng.uniform(math.log(1e-4), math.log(30.0)))
        old = base + s_old * rng.standard_normal((b, t))
        ref = base + s_ref * rng.standard_normal((b, t))
        lp = base.copy()
        extreme = i % 4 == 3
        if extreme:
            k = int(rng.integers(1, min(4, b * t) + 1))
            idx = rng.choice(b * t, size=k, replace=False)
            ref.flat[idx] += rng.choice([-1.0, 1.0], size=k) * rng.uniform(40, 100, size=k)
        lengths = rng.integers(0 if empty_rows else 1, t + 1, size=b)
        lengths[0] = t
        mask = (np.arange(t)[None, :] < lengths[:, None]).astype(np.float64)
        detail = f"scales old {s_old:.2g}, ref {s_ref:.2g}" + (", extreme reference tokens" if extreme else "")
        out.append(Batch(*(torch.from_numpy(np.ascontiguousarray(x)) for x in (lp, old, ref, mask)), detail=detail))
    return out


def log_ratios(n: int, seed: int = 0, *, low: float = -120.0, high: float = 120.0) -> torch.Tensor:
    """``n`` log-ratios (float64): a third uniform on [low, high], a third log-uniform in magnitude from 1e-8 to 30 with
    either sign, a third near the clamp points of k3 (2.61 and -11.0) and of the input clamp (±20)."""
    rng = np.random.default_rng(seed)
    k = n // 3
    a = rng.uniform(low, high, size=k)
    b = rng.choice([-1.0, 1.0], size=k) * np.exp(rng.uniform(math.log(1e-8), math.log(30.0), size=k))
    pts = np.array([2.6109, -11.0001, 20.0, -20.0])
    c = pts[rng.integers(0, 4, size=n - 2 * k)] + rng.normal(0, 0.05, size=n - 2 * k)
    return torch.from_numpy(np.concatenate([a, b, c]))


def one_thread(check):  # type: ignore[no-untyped-def]
    """Run a claim's check on one CPU thread: its tensors are small, and on a busy 2-core machine torch's second
    thread turns each small operation from microseconds into milliseconds."""
    import functools

    from klviz.devices import single_thread

    @functools.wraps(check)
    def run():  # type: ignore[no-untyped-def]
        with single_thread():
            return check()

    return run
