"""Exact expectations over a vocabulary and over enumerable sequences, for the claims' checks.

Everything is float64 and summed over every token (or every sequence), so a claim's check compares
exact values, not Monte Carlo estimates. ``u`` is always ``log r = log p(x) - log q(x)`` (target minus
sampler) on the tokens q can draw.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from klviz import kernel

from .families import GaussianPair, SequenceCase

__all__ = [
    "mean",
    "std",
    "moments_of",
    "chi2_pq",
    "kl_pq",
    "rel_gap",
    "gaussian_log_ratio_moments",
    "gaussian_expectation",
    "sequence_terms",
]


def mean(q: torch.Tensor, v: torch.Tensor) -> float:
    """E_q[v] = sum_x q(x) v(x)."""
    return float((q * v).sum())


def std(q: torch.Tensor, v: torch.Tensor) -> float:
    """The single-draw standard deviation of v(x), x ~ q."""
    m = (q * v).sum()
    return float((q * (v - m).square()).sum().clamp_min(0).sqrt())


def moments_of(q: torch.Tensor, u: torch.Tensor) -> dict[str, float]:
    """KL(q||p), E_q[k2], the raw moments E_q[u^n] (n = 3, 4) and E_q[u^4 max(1, r)]."""
    return {
        "kl": mean(q, kernel.k3(u)),  # = E_q[-u], as a sum of non-negative terms
        "k2": mean(q, kernel.k2(u)),
        "e3": mean(q, u**3),
        "e4": mean(q, u**4),
        "e4_weighted": mean(q, u**4 * torch.clamp(u.exp(), min=1.0)),
    }


def chi2_pq(q: torch.Tensor, u: torch.Tensor) -> float:
    """chi²(p||q) = Var_q(r) = E_q[(r - 1)²] (p inside q's support)."""
    return mean(q, torch.expm1(u).square())


def kl_pq(q: torch.Tensor, u: torch.Tensor) -> float:
    """KL(p||q) = E_q[r log r - (r - 1)], a sum of non-negative terms."""
    return mean(q, kernel.kl_to_target(u))


def rel_gap(a: float, b: float, rel: float = 1e-9, abs_: float = 1e-13) -> float:
    """|a - b| in units of the tolerance ``rel · |b| + abs_`` (a value above 1 breaks an equality)."""
    return abs(a - b) / (rel * abs(b) + abs_)


# -- Gaussians: log r is a quadratic in a standard normal z --------------------------------------
_Z_MOMENTS = [1.0, 0.0, 1.0, 0.0, 3.0, 0.0, 15.0, 0.0, 105.0, 0.0, 945.0]


def _quadratic(mu_a: float, s_a: float, mu_b: float, s_b: float) -> np.ndarray:
    """Coefficients (a, b, c) of log b(x) - log a(x) = a + b z + c z² with x = mu_a + s_a z, x ~ a."""
    d = mu_a - mu_b
    return np.array([math.log(s_a / s_b) - d * d / (2 * s_b**2), -d * s_a / s_b**2, 0.5 - s_a**2 / (2 * s_b**2)])


def _poly_mean(coef: np.ndarray) -> float:
    return float(np.dot(coef, _Z_MOMENTS[: len(coef)]))


def gaussian_log_ratio_moments(g: GaussianPair) -> dict[str, float]:
    """E_q[u^n] for n = 1..4 with u = log p - log q under q, and E_p[u^4] (under the target p).

    ``E_q[u^4 max(1, r)] <= E_q[u^4] + E_q[u^4 r] = E_q[u^4] + E_p[u^4]``: the bound the k2 sign rule
    uses for Gaussians (their vocabulary cannot be enumerated)."""
    u_q = _quadratic(g.mu_q, g.sigma_q, g.mu_p, g.sigma_p)  # u = log p - log q as a function of x ~ q
    powers = {1: u_q}
    for n in (2, 3, 4):
        powers[n] = np.convolve(powers[n - 1], u_q)
    out = {f"e{n}": _poly_mean(c) for n, c in powers.items()}
    u_p = -_quadratic(g.mu_p, g.sigma_p, g.mu_q, g.sigma_q)  # the same u, for x ~ p
    p4 = np.convolve(np.convolve(u_p, u_p), np.convolve(u_p, u_p))
    out["e4_under_p"] = _poly_mean(p4)
    return out


def gaussian_expectation(g: GaussianPair, f: Callable[[torch.Tensor], torch.Tensor], points: int = 40_001) -> float:
    """E_q[f(u)] for a Gaussian pair by the trapezoid rule in x, over 16 standard deviations of both q and p
    around their means (so that f's weight where p, not q, has its mass, as in u⁴ r, is covered)."""
    lo = min(g.mu_q - 16 * g.sigma_q, g.mu_p - 16 * g.sigma_p)
    hi = max(g.mu_q + 16 * g.sigma_q, g.mu_p + 16 * g.sigma_p)
    x = torch.linspace(lo, hi, points, dtype=torch.float64)
    log_q = -0.5 * ((x - g.mu_q) / g.sigma_q) ** 2 - math.log(g.sigma_q * math.sqrt(2 * math.pi))
    log_p = -0.5 * ((x - g.mu_p) / g.sigma_p) ** 2 - math.log(g.sigma_p * math.sqrt(2 * math.pi))
    return float(torch.trapezoid(log_q.exp() * f(log_p - log_q), x))


# -- sequences -------------------------------------------------------------------------------------
def sequence_terms(case: SequenceCase, policy: torch.Tensor, ref: torch.Tensor) -> dict[str, torch.Tensor]:
    """For every sequence y of a tabular toy: its probability under ``policy``, the per-token k1 of
    log pi(y_t|y<t) - log ref(y_t|y<t) ([S, T]) and the exact next-token KL(pi||ref) at each of its
    prefixes ([S, T])."""
    toy = case.toy
    lp, lr = toy.token_logprobs(policy), toy.token_logprobs(ref)
    pol, rf = torch.log_softmax(policy, -1), torch.log_softmax(ref, -1)
    kl_prefix = (pol.exp() * kernel.k3(rf - pol)).sum(-1)  # exact next-token KL at every prefix
    return {"prob": lp.sum(-1).exp(), "k1": lp - lr, "kl_at_prefix": kl_prefix[toy.prefix_index]}
