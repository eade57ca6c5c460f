"""Toy policies: small named vocabularies, Zipf-like large ones, and ways to move one policy away from another."""

from __future__ import annotations

import torch

from .validation import Tensor, as_float_tensor, check_positive_int

__all__ = ["TOY_VOCAB", "toy_sampler_logits", "zipf_logits", "move_policy", "categorical_from_logits"]

#: Twelve tokens a reader can read: the next-token choices after "The cat sat on the".
TOY_VOCAB: tuple[str, ...] = (
    " mat",
    " sofa",
    " floor",
    " chair",
    " bed",
    " rug",
    " roof",
    " table",
    " dog",
    " moon",
    " keyboard",
    "<eos>",
)


def toy_sampler_logits() -> Tensor:
    """Logits of a plausible next-token distribution over :data:`TOY_VOCAB` (fixed, float32)."""
    probs = torch.tensor([0.30, 0.16, 0.12, 0.09, 0.08, 0.07, 0.05, 0.045, 0.035, 0.02, 0.015, 0.005])
    return torch.log(probs / probs.sum())


def zipf_logits(vocab_size: int, exponent: float = 1.1, *, generator: torch.Generator | None = None) -> Tensor:
    """Logits of a Zipf-like distribution over ``vocab_size`` tokens, p(rank k) ∝ k^(-exponent).

    With a ``generator`` the ranks are assigned to token ids in a random (seeded) order, as in a
    real tokenizer where frequent tokens are not the first ids.
    """
    v = check_positive_int(vocab_size, "vocab_size")
    ranks = torch.arange(1, v + 1, dtype=torch.float32)
    logits = -float(exponent) * torch.log(ranks)
    if generator is not None:
        logits = logits[torch.randperm(v, generator=generator, device=generator.device).cpu()]
    return torch.log_softmax(logits, -1)


def move_policy(
    logits: Tensor,
    *,
    temperature: float = 1.0,
    push: float = 0.0,
    push_token: int = 0,
    mix: float = 0.0,
    mix_logits: Tensor | None = None,
) -> Tensor:
    """A new policy's normalised log-probabilities, made from ``logits`` by three familiar moves.

    1. **temperature**: divide the logits by ``temperature`` (> 0): below 1 sharpens, above 1 flattens;
    2. **push**: add ``push`` to the logit of ``push_token`` (a fine-tuning step that favours it);
    3. **mix**: blend the probabilities with ``mix_logits``' distribution (uniform by default),
       ``(1 - mix) · p + mix · u`` with ``mix`` in [0, 1].
    """
    lg = as_float_tensor(logits, "logits")
    if lg.dim() != 1:
        raise ValueError(f"logits must be 1-D, got shape {tuple(lg.shape)}")
    if not temperature > 0:
        raise ValueError(f"temperature must be positive, got {temperature!r}")
    if not 0.0 <= mix <= 1.0:
        raise ValueError(f"mix must lie in [0, 1], got {mix!r}")
    if not 0 <= push_token < lg.numel():
        raise ValueError(f"push_token must index the vocabulary (0..{lg.numel() - 1}), got {push_token!r}")
    moved = (lg / temperature).clone()
    moved[push_token] += push
    log_p = torch.log_softmax(moved, -1)
    if mix > 0:
        other = (
            torch.full_like(lg, 1.0 / lg.numel())
            if mix_logits is None
            else torch.softmax(as_float_tensor(mix_logits, "mix_logits"), -1)
        )
        if other.shape != lg.shape:
            raise ValueError(f"mix_logits has shape {tuple(other.shape)} but logits has {tuple(lg.shape)}")
        log_p = torch.log((1.0 - mix) * log_p.exp() + mix * other)
    return log_p


def categorical_from_logits(logits: Tensor) -> torch.distributions.Categorical:
    """A ``torch.distributions.Categorical`` from (possibly unnormalised) logits, validated."""
    return torch.distributions.Categorical(logits=as_float_tensor(logits, "logits"))
