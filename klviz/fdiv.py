"""f-divergences, their generators, and the Bregman construction behind k3.

With tokens x ~ q and the ratio ``r = p(x)/q(x)`` (target over sampler), an f-divergence is
``D_f(p || q) = E_q[f(r)]`` for a convex f with f(1) = 0. Two generators give the two KLs:

- ``f(t) = t log t``  ->  ``E_q[r log r] = KL(p || q)``;
- ``f(t) = -log t``   ->  ``E_q[-log r] = KL(q || p)`` (the sampler first: what k1 estimates).

Because ``E_q[r] = 1``, adding ``c (t - 1)`` to f changes nothing in expectation. Choosing
``c = -f'(1)`` gives the **Bregman gap** ``f(r) - f'(1)(r - 1)``: the height of the convex curve f
above its tangent at t = 1. It is never negative and has the same expectation: for f = -log t it is
k3 = (r - 1) - log r, for f = t log t it is r log r - (r - 1), an estimator of KL(p || q).

Every function here takes ``log_r`` (or ``log t``) rather than r, so that ratios of 10^-30 or
10^30 stay finite and tiny log-ratios keep their precision (``expm1``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from . import kernel
from .validation import Tensor, as_float_tensor, check_choice, check_same_shape, common_dtype

__all__ = [
    "FGenerator",
    "GENERATORS",
    "generator",
    "f_value",
    "f_prime",
    "f_second",
    "tangent_at_one",
    "bregman_gap",
    "f_divergence",
    "expected_ratio",
]


@dataclass(frozen=True)
class FGenerator:
    """A generator f of an f-divergence, written as functions of ``u = log t`` for stability.

    ``f(u)`` is f(e^u); ``df(u)`` is f'(e^u); ``d2f(u)`` is f''(e^u) (derivatives with respect to t).
    ``df1`` is f'(1), the slope of the tangent at t = 1. ``divergence`` names E_q[f(r)].
    ``slope_at_infinity`` = lim f(t)/t: the convention 0 · f(p/0) = p · that limit decides how mass of p
    that q never samples counts (0 for -log t, infinite for t log t).
    """

    name: str
    formula: str
    divergence: str
    f: Callable[[Tensor], Tensor]
    df: Callable[[Tensor], Tensor]
    d2f: Callable[[Tensor], Tensor]
    df1: float
    convex: bool
    estimator_name: str
    slope_at_infinity: float  # lim f(t)/t as t -> inf: the weight of p's mass where q = 0
    #: the Bregman gap f(e^u) - f'(1)(e^u - 1) computed without cancellation near u = 0, where the
    #: kernel has it (k3 for -log t, r log r - (r - 1) for t log t); None: computed from f and df1
    gap: Callable[[Tensor], Tensor] | None = None

    def __repr__(self) -> str:
        return f"FGenerator({self.name!r}: f(t) = {self.formula}; E_q[f(r)] = {self.divergence})"


def _t(u: Tensor) -> Tensor:
    return torch.exp(u)


#: The generators used in lesson 03, by name.
GENERATORS: dict[str, FGenerator] = {
    "-log t": FGenerator(
        "-log t",
        "-log t",
        "KL(q‖p)",
        f=kernel.k1,
        df=lambda u: -torch.exp(-u),
        d2f=lambda u: torch.exp(-2 * u),
        df1=-1.0,
        convex=True,
        estimator_name="k3 = (r - 1) - log r",
        slope_at_infinity=0.0,
        gap=kernel.k3,
    ),
    "t log t": FGenerator(
        "t log t",
        "t log t",
        "KL(p‖q)",
        f=lambda u: _t(u) * u,
        df=lambda u: u + 1,
        d2f=lambda u: torch.exp(-u),
        df1=1.0,
        convex=True,
        estimator_name="r log r - (r - 1)",
        slope_at_infinity=math.inf,
        gap=kernel.kl_to_target,
    ),
    "k2": FGenerator(
        "k2",
        "½ (log t)²",
        "E_q[k2] (not an f-divergence)",
        f=kernel.k2,
        df=lambda u: u * torch.exp(-u),
        d2f=lambda u: (1 - u) * torch.exp(-2 * u),
        df1=0.0,
        convex=False,
        estimator_name="k2 = ½ (log r)²",
        slope_at_infinity=0.0,
    ),
    "chi2": FGenerator(
        "chi2",
        "(t - 1)²",
        "χ²(p‖q)",
        f=lambda u: torch.expm1(u).square(),
        df=lambda u: 2 * torch.expm1(u),
        d2f=lambda u: 2 * torch.ones_like(u),
        df1=0.0,
        convex=True,
        estimator_name="(r - 1)²",
        slope_at_infinity=math.inf,
    ),
    "hellinger": FGenerator(
        "hellinger",
        "(√t - 1)²",
        "Σ(√p − √q)² (twice the squared Hellinger)",
        f=lambda u: torch.expm1(u / 2).square(),
        df=lambda u: -torch.expm1(-u / 2),
        d2f=lambda u: 0.5 * torch.exp(-1.5 * u),
        df1=0.0,
        convex=True,
        estimator_name="(√r - 1)²",
        slope_at_infinity=1.0,
    ),
}


def generator(name: str | FGenerator) -> FGenerator:
    """The :class:`FGenerator` called ``name`` (one of :data:`GENERATORS`), or ``name`` itself."""
    if isinstance(name, FGenerator):
        return name
    return GENERATORS[check_choice(name, "f", tuple(GENERATORS))]


def _log_t(log_t: Tensor, name: str = "log_t", *, allow_neg_inf: bool = False) -> Tensor:
    u = as_float_tensor(log_t, name, allow_neg_inf=allow_neg_inf)
    return u if u.dtype == torch.float64 else u.float()


def f_value(f: str | FGenerator, log_t: Tensor) -> Tensor:
    """f(t) at ``t = exp(log_t)``."""
    return generator(f).f(_log_t(log_t))


def f_prime(f: str | FGenerator, log_t: Tensor) -> Tensor:
    """f'(t), the slope, at ``t = exp(log_t)``."""
    return generator(f).df(_log_t(log_t))


def f_second(f: str | FGenerator, log_t: Tensor) -> Tensor:
    """f''(t), the curvature, at ``t = exp(log_t)``. Negative somewhere means f is not convex there
    (for k2's ½ (log t)² that happens for t > e)."""
    return generator(f).d2f(_log_t(log_t))


def tangent_at_one(f: str | FGenerator, log_t: Tensor) -> Tensor:
    """The tangent line of f at t = 1, evaluated at ``t = exp(log_t)``: ``f(1) + f'(1)(t - 1)`` (f(1) = 0)."""
    g = generator(f)
    return g.df1 * torch.expm1(_log_t(log_t))


def bregman_gap(f: str | FGenerator, log_r: Tensor) -> Tensor:
    """The Bregman construction ``f(r) - f'(1)(r - 1)``: f above its tangent at r = 1.

    With ``log_r = log p(x) - log q(x)`` for x ~ q it is an unbiased estimator of E_q[f(r)] (because
    E_q[r - 1] = 0), and non-negative wherever f is convex between 1 and r. ``"-log t"`` gives
    k3 = (r - 1) - log r (an estimator of KL(q‖p)); ``"t log t"`` gives r log r - (r - 1) (KL(p‖q)).
    ``log_r = -inf`` (a token the target never emits, r = 0) is allowed and gives the limit f(0+) + f'(1):
    ``+inf`` for ``-log t`` and k2, 1 for ``t log t``, χ² and Hellinger. Where r overflows the dtype
    (log r above about 88.7 in float32) the value is ``+inf``, as the true value is beyond it.
    """
    g = generator(f)
    u = _log_t(log_r, "log_r", allow_neg_inf=True)
    if g.gap is not None:
        return g.gap(u)
    if g.df1 == 0:  # a flat tangent: the gap is f itself (0 · inf would make a NaN where r overflows)
        return g.f(u)
    return g.f(u) - g.df1 * torch.expm1(u)


def f_divergence(f: str | FGenerator, q_probs: Tensor, p_probs: Tensor, dim: int = -1) -> Tensor:
    """Exact ``D_f(p || q) = sum_x q(x) f(p(x)/q(x))`` over categories along ``dim``.

    Summed as ``sum_x q(x) gap(r_x) + f'(1) (p(S) - 1)``, with gap the Bregman gap f(r) - f'(1)(r - 1)
    (:func:`bregman_gap`) and p(S) the target's mass where q > 0: the same value, but for a convex f
    every term of the sum is non-negative, so a tiny divergence between nearly equal distributions
    keeps its digits instead of cancelling. Categories with q = 0 are never sampled; where p > 0 there,
    they count as ``p(x) · lim_{t→∞} f(t)/t`` (nothing for KL(q‖p), infinity for KL(p‖q) and χ²).
    """
    g = generator(f)
    q = as_float_tensor(q_probs, "q_probs")
    p = as_float_tensor(p_probs, "p_probs")
    check_same_shape(q, p, "q_probs", "p_probs")
    for t, name in ((q, "q_probs"), (p, "p_probs")):
        if bool((t < 0).any()):
            raise ValueError(f"{name} has negative probabilities")
        total = t.sum(dim)
        if not torch.allclose(total, torch.ones_like(total), atol=1e-4):
            raise ValueError(f"{name} does not sum to 1 along dim={dim}")
    dtype = common_dtype(q, p)
    q, p = q.to(dtype), p.to(dtype)
    support = q > 0
    safe_q = torch.where(support, q, torch.ones_like(q))
    u = torch.where(support, torch.log(p) - torch.log(safe_q), torch.zeros_like(q))  # -inf where p = 0
    gaps = g.gap(u) if g.gap is not None else (g.f(u) if g.df1 == 0 else g.f(u) - g.df1 * torch.expm1(u))
    terms = torch.where(support, q * gaps, torch.zeros_like(q))
    total = terms.sum(dim)
    if g.df1 != 0:  # f'(1) E_q[r - 1] = f'(1) sum_S (p - q): zero when q covers p (summed as differences,
        # so its rounding is eps times the distance between p and q, not eps)
        total = total + g.df1 * torch.where(support, p - q, torch.zeros_like(p)).sum(dim)
    # p > 0 where q = 0: mass the sampler never sees, weighted by lim f(t)/t (0 * inf counts as 0)
    missed = (~support) & (p > 0)
    if bool(missed.any()) and g.slope_at_infinity != 0:
        total = total + torch.where(missed, p * g.slope_at_infinity, torch.zeros_like(p)).sum(dim)
    return total


def expected_ratio(q_probs: Tensor, p_probs: Tensor, dim: int = -1) -> Tensor:
    """Exact ``E_q[r] = sum_x q(x) p(x)/q(x)``: the mass of p on q's support (1 when q covers p)."""
    q = as_float_tensor(q_probs, "q_probs")
    p = as_float_tensor(p_probs, "p_probs")
    check_same_shape(q, p, "q_probs", "p_probs")
    return torch.where(q > 0, p, torch.zeros_like(p)).sum(dim)
