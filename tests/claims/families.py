"""The domains claims are checked over: seeded, deterministic families of cases.

- :func:`token_pairs`: a sampler q and a target p over a vocabulary of 2 to 50,257 tokens, from five
  kinds of change: diffuse logit noise, one token pushed up, one pushed down, p sharpened or flattened
  by a temperature, p mixed with the uniform distribution; q's own shape varies too (Gaussian or
  Zipf-like logits, sharp or flat).
- :func:`gaussian_pairs`: q = N(mu_q, sigma_q^2) and p = N(mu_p, sigma_p^2) with unequal variances.
- :func:`sequence_policies`: tabular autoregressive policies (vocabulary 2-4, length 2-4, every
  sequence enumerable) for the current policy, the reference and an old (sampling) policy.

Everything is float64 unless a claim is about a lower precision.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import torch

from klviz.bandit import SequenceToy

__all__ = [
    "TOKEN_KINDS",
    "TokenPair",
    "token_pairs",
    "GaussianPair",
    "gaussian_pairs",
    "SequenceCase",
    "sequence_policies",
    "clear_cache",
]

TOKEN_KINDS = ("logit-noise", "push-up", "push-down", "temperature", "mix-uniform")
MAX_VOCAB = 50_257


@dataclass(frozen=True)
class TokenPair:
    """One case: log-probabilities of the sampler q and the target p (float64, [V]), and how p was made."""

    kind: str
    q_logp: torch.Tensor
    p_logp: torch.Tensor
    detail: str

    @property
    def vocab(self) -> int:
        return int(self.q_logp.numel())

    @property
    def log_r(self) -> torch.Tensor:
        """log p - log q for every token (target minus sampler)."""
        return self.p_logp - self.q_logp

    @property
    def q(self) -> torch.Tensor:
        return self.q_logp.exp()

    def kl(self) -> float:
        """Exact KL(q || p), summed over the vocabulary."""
        return float((self.q * -self.log_r).sum().clamp_min(0.0))

    def describe(self) -> str:
        return f"{self.kind}, V = {self.vocab:,}, {self.detail}"


def _log_uniform(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def _base_logits(rng: np.random.Generator, v: int) -> tuple[torch.Tensor, str]:
    if rng.random() < 0.5:
        scale = rng.uniform(0.3, 3.0)
        logits = scale * rng.standard_normal(v)
        what = f"Gaussian logits (sd {scale:.2g})"
    else:
        a = rng.uniform(0.5, 1.5)
        logits = -a * np.log(np.arange(1, v + 1)) + 0.3 * rng.standard_normal(v)
        rng.shuffle(logits)
        what = f"Zipf-like logits (exponent {a:.2g})"
    return torch.from_numpy(logits), what


def token_pairs(
    n: int,
    seed: int = 0,
    *,
    kinds: tuple[str, ...] = TOKEN_KINDS,
    vocab: tuple[int, int] = (2, MAX_VOCAB),
    noise: tuple[float, float] = (1e-3, 1.0),
) -> list[TokenPair]:
    """``n`` cases cycling through ``kinds``; vocabulary sizes log-uniform over ``vocab`` (both ends
    included: the first cases of each kind take the smallest and the largest size); the logit noise of
    ``"logit-noise"`` log-uniform over ``noise``.

    The same arguments return the same cases (cached, four families at most: several claims share
    one family without drawing it again); a check must not modify them.
    """
    return list(_token_pairs(n, seed, tuple(kinds), tuple(vocab), tuple(noise)))


def clear_cache() -> None:
    """Forget the cached families (hundreds of MiB): a process that goes on to other work, or that
    starts child processes whose peak memory is measured, should not carry them."""
    _token_pairs.cache_clear()


@functools.lru_cache(maxsize=4)
def _token_pairs(
    n: int, seed: int, kinds: tuple[str, ...], vocab: tuple[int, int], noise: tuple[float, float]
) -> tuple[TokenPair, ...]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        kind = kinds[i % len(kinds)]
        step = i // len(kinds)
        v = vocab[0] if step == 0 else vocab[1] if step == 1 else round(_log_uniform(rng, vocab[0], vocab[1]))
        logits, base = _base_logits(rng, v)
        q_logp = torch.log_softmax(logits, -1)
        if kind == "logit-noise":
            s = _log_uniform(rng, noise[0], noise[1])
            p_logits = logits + s * torch.from_numpy(rng.standard_normal(v))
            detail = f"noise sd {s:.3g}"
        elif kind in ("push-up", "push-down"):
            j = int(rng.integers(v))
            d = _log_uniform(rng, 0.01, 3.0) * (1 if kind == "push-up" else -1)
            p_logits = logits.clone()
            p_logits[j] += d
            detail = f"token with q = {float(q_logp[j].exp()):.3g} pushed by {d:+.3g}"
        elif kind == "temperature":
            t = _log_uniform(rng, 0.5, 2.0)
            p_logits = logits / t
            detail = f"p at temperature {t:.3g} ({'sharper' if t < 1 else 'flatter'})"
        elif kind == "mix-uniform":
            a = rng.uniform(0.01, 0.9)
            p_probs = (1 - a) * q_logp.exp() + a / v
            p_logits = p_probs.log()
            detail = f"p = {1 - a:.2f} q + {a:.2f} uniform"
        else:
            raise ValueError(f"unknown kind {kind!r}; the kinds are {TOKEN_KINDS}")
        out.append(TokenPair(kind, q_logp, torch.log_softmax(p_logits, -1), f"{base}, {detail}"))
    return tuple(out)


@dataclass(frozen=True)
class GaussianPair:
    """q = N(mu_q, sigma_q^2), p = N(mu_p, sigma_p^2)."""

    mu_q: float
    sigma_q: float
    mu_p: float
    sigma_p: float

    def kl(self) -> float:
        """Closed-form KL(q || p)."""
        return (
            math.log(self.sigma_p / self.sigma_q)
            + (self.sigma_q**2 + (self.mu_q - self.mu_p) ** 2) / (2 * self.sigma_p**2)
            - 0.5
        )

    def describe(self) -> str:
        return f"q = N({self.mu_q:.3g}, {self.sigma_q:.3g}²), p = N({self.mu_p:.3g}, {self.sigma_p:.3g}²)"


def gaussian_pairs(n: int, seed: int = 0, *, max_shift: float = 2.0, max_ratio: float = 2.0) -> list[GaussianPair]:
    """``n`` pairs: sigma_q log-uniform in [0.3, 3], sigma_p / sigma_q log-uniform in [1/max_ratio,
    max_ratio], (mu_p - mu_q) / sigma_q uniform in [-max_shift, max_shift]."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        sq = _log_uniform(rng, 0.3, 3.0)
        sp = sq * _log_uniform(rng, 1 / max_ratio, max_ratio)
        mq = float(rng.uniform(-1, 1))
        mp = mq + sq * float(rng.uniform(-max_shift, max_shift))
        out.append(GaussianPair(mq, sq, mp, sp))
    return out


@dataclass(frozen=True)
class SequenceCase:
    """A tabular autoregressive toy with the current policy's logits, the reference's and an old
    (sampling) policy's: one row of logits per prefix, float64."""

    toy: SequenceToy
    theta: torch.Tensor
    ref: torch.Tensor
    old: torch.Tensor

    def describe(self) -> str:
        return f"V = {self.toy.vocab_size}, length {self.toy.length}"


def sequence_policies(
    n: int, seed: int = 0, *, vocab: tuple[int, int] = (2, 4), length: tuple[int, int] = (2, 4)
) -> list[SequenceCase]:
    """``n`` cases: vocabulary and length uniform over the given ranges (at most 4,096 sequences);
    the reference at logit scale 0.3-2, the policy and the old policy each the reference plus noise
    of scale 0.05-1."""
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    toys: dict[tuple[int, int], SequenceToy] = {}
    out = []
    for _ in range(n):
        v = int(rng.integers(vocab[0], vocab[1] + 1))
        t = int(rng.integers(length[0], length[1] + 1))
        while v**t > 4096:
            t -= 1
        toy = toys.setdefault((v, t), SequenceToy(v, t))
        ref = toy.random_logits(float(rng.uniform(0.3, 2.0)), generator=gen)
        theta = ref + toy.random_logits(_log_uniform(rng, 0.05, 1.0), generator=gen)
        old = theta + toy.random_logits(_log_uniform(rng, 0.05, 1.0), generator=gen)
        out.append(SequenceCase(toy, theta, ref, old))
    return out
