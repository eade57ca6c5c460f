"""Which KL gradient does *your* KL term follow? An exact audit on a tiny enumerable policy.

:func:`audit_loss` takes a function written the way training code writes a KL term,
``fn(logprob, old_logprob, ref_logprob, response_mask)`` on ``[batch, length]`` tensors, builds a
tabular autoregressive policy (:class:`klviz.bandit.SequenceToy`: one row of logits per prefix), and
enumerates every one of the ``vocab_size ** length`` sequences. Tokens come from the current policy
π_θ (``sampler="current"``) or from a perturbed old policy π_old (``sampler="old"``), so the expected
gradient with respect to π_θ's logits is an exact sum, with no sampling noise:

- ``placement="loss"``: ``fn`` returns a scalar loss with the gradient flowing through ``logprob``;
  the expected gradient is Σ_y q(y) ∇ fn(one sequence y), q the sampler;
- ``placement="reward"``: ``fn`` returns per-token penalties ``[batch, length]``, used detached as a
  negative reward with reward-to-go in the REINFORCE surrogate Σ_t ρ_t · sg(Σ_{u≥t} pen_u), with
  ρ_t = π_θ(y_t)/sg(π_old(y_t)) (PPO's per-token ratio; 1 in value on-policy, so plain REINFORCE).

It is compared with the two sequence-level targets, ∇KL(π_θ‖π_ref) (reverse) and ∇KL(π_ref‖π_θ)
(forward). The relative error to a target t is ``‖g − c·t‖ / ‖c·t‖`` with c = ⟨g, t⟩/⟨t, t⟩ the best
*positive* multiple (so a KL coefficient or a 1/length normalisation changes nothing); it equals
tan of the angle between g and t, and is infinite when g points away from t (c ≤ 0).

**Classification** (``follows``): ``"zero"`` when ‖g‖ < :data:`ZERO_TOL` · ‖∇KL(π_θ‖π_ref)‖; else the
target with the smaller relative error if that error is at most :data:`FOLLOWS_TOL` (0.05, an
angle below 2.9°); else ``"neither"``. The threshold is set by the exact numbers: a term that is
the target's gradient in expectation comes out at rounding level (about 1e-15 in float64, 1e-7
through a framework's float32 arithmetic), while the closest structural near-misses are an order of
magnitude beyond 0.05 (the token-level "partial" gradient of a length-3 k2 loss, about 0.3 on the
default policies; see the table in ``tests/test_audit.py``). The policies are drawn far enough apart
(:data:`TARGET_SEPARATION`) that the two targets themselves differ by a relative error of at least
0.3, so that a term cannot follow both; the result reports how far apart they are. The token-level
reverse target Σ_t E[∇ log π(y_t) k1_t] (what per-token losses follow at best) is reported too,
under ``relative_error_token_level``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from .bandit import SequenceToy

__all__ = ["AuditResult", "audit_loss", "FOLLOWS_TOL", "ZERO_TOL", "TARGET_SEPARATION", "TARGETS"]

#: Largest relative error (tan of the angle to the target) at which a term "follows" it.
FOLLOWS_TOL = 0.05
#: A gradient smaller than this fraction of the reverse-KL gradient counts as zero.
ZERO_TOL = 1e-6
#: Smallest relative error between the reverse and the forward target that the drawn policies allow.
TARGET_SEPARATION = 0.3
TARGETS: tuple[str, str] = ("reverse_kl", "forward_kl")
_LESSONS = {
    "reverse_kl": "lesson 05 (gradients: k2 in the loss = k1 in the reward; ratio-corrected k3) and the lesson 07 lab",
    "forward_kl": "lesson 05 (k3 as a loss follows the forward KL, mode-covering) and the lesson 07 lab, where it "
    "converges elsewhere",
    "zero": "lesson 05 (k1 as a loss does nothing on average: E[∇ log π] = 0)",
    "neither": "lesson 05 (token-level vs sequence gradients, off-policy terms without importance weights) and the "
    "lesson 07 lab",
}


@dataclass
class AuditResult:
    """What :func:`audit_loss` found (see the module docstring)."""

    follows: str
    relative_error: dict[str, float]
    relative_error_token_level: float
    gradient_norm: float
    target_norms: dict[str, float]
    scale: dict[str, float]  # the best positive multiple c of each target
    target_separation: float  # relative error between the two targets
    kl: dict[str, float]  # KL(π‖π_ref), KL(π_ref‖π), KL(π_old‖π) of the drawn policies
    placement: str
    sampler: str
    vocab_size: int
    length: int
    seed: int
    summary: str = ""
    gradient: torch.Tensor | None = field(default=None, repr=False)

    def as_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items() if k != "gradient"}
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}


def _rel_error(g: torch.Tensor, t: torch.Tensor) -> tuple[float, float]:
    tt = float(t.flatten() @ t.flatten())
    if tt == 0:
        return math.inf, 0.0
    c = float(g.flatten() @ t.flatten()) / tt
    if c <= 0:
        return math.inf, c
    return float((g - c * t).norm()) / (abs(c) * math.sqrt(tt)), c


def _policies(toy: SequenceToy, seed: int, sampler: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]:
    """θ, ref and old logits drawn from ``seed`` (re-drawn until the two targets are far enough apart)."""
    for attempt in range(50):
        g = torch.Generator().manual_seed(int(seed) * 1000 + attempt)
        theta = toy.random_logits(1.0, generator=g)
        ref = theta + toy.random_logits(1.2, generator=g)
        old = theta + toy.random_logits(0.6, generator=g)
        rev = toy.true_gradient(theta, ref)
        fwd = _forward_gradient(toy, theta, ref)
        sep, _ = _rel_error(fwd, rev)
        if sep >= TARGET_SEPARATION:
            return theta, ref, old, sep
    return theta, ref, old, sep


def _forward_gradient(toy: SequenceToy, theta: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """∇_θ KL(π_ref ‖ π_θ) over whole sequences = −Σ_y π_ref(y) ∇ log π_θ(y)."""
    lg = theta.detach().clone().requires_grad_(True)
    with torch.enable_grad():
        w = toy.sequence_probs(ref).detach()
        (g,) = torch.autograd.grad(-(w * toy.token_logprobs(lg).sum(-1)).sum(), lg)
    return g


def _token_level_gradient(toy: SequenceToy, theta: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Σ_t E_π[∇ log π(y_t) · k1_t]: the reverse target with each token's own KL only (the "partial" gradient)."""
    return toy.expected_gradient(theta, ref, "k1 in reward, same token")


def _check(fn: Any, placement: str, sampler: str, vocab_size: Any, length: Any) -> None:
    if not callable(fn):
        raise ValueError(
            f"fn must be callable (fn(logprob, old_logprob, ref_logprob, response_mask)), got {type(fn).__name__}"
        )
    if placement not in ("loss", "reward"):
        raise ValueError(f"placement must be 'loss' or 'reward', got {placement!r}")
    if sampler not in ("current", "old"):
        raise ValueError(f"sampler must be 'current' or 'old', got {sampler!r}")
    for name, v in (("vocab_size", vocab_size), ("length", length)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    if vocab_size < 2:
        raise ValueError(f"vocab_size must be at least 2, got {vocab_size}")
    if vocab_size**length > 4096:
        raise ValueError(f"vocab_size ** length = {vocab_size**length} sequences is too many to enumerate (max 4096)")


def audit_loss(
    fn: Callable[..., torch.Tensor],
    *,
    placement: str = "loss",
    sampler: str = "current",
    vocab_size: int = 4,
    length: int = 1,
    seed: int = 0,
) -> AuditResult:
    """The exact expected gradient of a user's KL term, and which KL gradient it follows.

    ``fn(logprob, old_logprob, ref_logprob, response_mask)`` gets float64 ``[1, length]`` tensors for
    one sequence at a time (``logprob`` carries the gradient; ``old_logprob`` holds the sampler's
    log-probs, equal to ``logprob`` in value when ``sampler="current"``; the mask is all ones) and
    returns a scalar loss (``placement="loss"``) or per-token penalties ``[1, length]``
    (``placement="reward"``). See the module docstring for the classification.
    """
    _check(fn, placement, sampler, vocab_size, length)
    toy = SequenceToy(vocab_size, length)
    theta, ref, old, sep = _policies(toy, seed, sampler)
    with torch.no_grad():
        lp_ref = toy.token_logprobs(ref)
        lp_old = toy.token_logprobs(old) if sampler == "old" else None
        q = toy.sequence_probs(old if sampler == "old" else theta)
    lg = theta.detach().clone().requires_grad_(True)
    mask = torch.ones(1, length, dtype=torch.float64)
    total = torch.zeros((), dtype=torch.float64)
    with torch.enable_grad():
        lp = toy.token_logprobs(lg)
        for y in range(lp.shape[0]):
            lp_y = lp[y : y + 1]
            old_y = (lp_old[y : y + 1] if lp_old is not None else lp_y.detach()).clone()
            try:
                out = fn(lp_y, old_y, lp_ref[y : y + 1].clone(), mask.clone())
            except Exception as err:  # noqa: BLE001 - the user's function failed
                raise ValueError(f"fn raised {type(err).__name__}: {err}") from err
            if not isinstance(out, torch.Tensor):
                raise ValueError(f"fn must return a torch tensor, got {type(out).__name__}")
            if placement == "loss":
                if out.numel() != 1:
                    raise ValueError(f"placement='loss': fn must return a scalar loss, got shape {tuple(out.shape)}")
                term = out.reshape(())
            else:
                if out.shape != (1, length):
                    raise ValueError(
                        f"placement='reward': fn must return per-token penalties of shape (batch, length) "
                        f"= (1, {length}), got {tuple(out.shape)}"
                    )
                pen = out.detach().to(torch.float64)
                to_go = pen.flip(-1).cumsum(-1).flip(-1)
                rho = torch.exp(lp_y - old_y.detach())
                term = (rho * to_go).sum()
            total = total + q[y] * term.to(torch.float64)
        if not total.requires_grad:
            grad = torch.zeros_like(theta)
        else:
            (grad,) = torch.autograd.grad(total, lg, allow_unused=True)
            grad = torch.zeros_like(theta) if grad is None else grad
    if not bool(torch.isfinite(grad).all()):
        raise ValueError("the expected gradient of fn is not finite on the audit policies")
    rev = toy.true_gradient(theta, ref)
    fwd = _forward_gradient(toy, theta, ref)
    targets = {"reverse_kl": rev, "forward_kl": fwd}
    rel, scale = {}, {}
    for name, t in targets.items():
        rel[name], scale[name] = _rel_error(grad, t)
    tok_err, _ = _rel_error(grad, _token_level_gradient(toy, theta, ref))
    gnorm = float(grad.norm())
    if gnorm < ZERO_TOL * float(rev.norm()):
        follows = "zero"
    else:
        best = min(TARGETS, key=lambda k: rel[k])
        follows = best if rel[best] <= FOLLOWS_TOL else "neither"
    with torch.no_grad():
        kl = {"KL(π‖π_ref)": float(toy.sequence_kl(theta, ref)), "KL(π_ref‖π)": float(toy.sequence_kl(ref, theta))}
        if sampler == "old":
            kl["KL(π_old‖π)"] = float(toy.sequence_kl(old, theta))
    res = AuditResult(
        follows,
        rel,
        tok_err,
        gnorm,
        {k: float(t.norm()) for k, t in targets.items()},
        scale,
        sep,
        kl,
        placement,
        sampler,
        vocab_size,
        length,
        seed,
        gradient=grad,
    )
    res.summary = _summary(res)
    return res


def _e(x: float) -> str:
    return "∞ (points away)" if not math.isfinite(x) else f"{x:.3g}"


def _summary(r: AuditResult) -> str:
    where = "tokens from the current policy π_θ" if r.sampler == "current" else "tokens from an older policy π_old"
    verdict = {
        "reverse_kl": "follows the gradient of the reverse KL, KL(π_θ‖π_ref): what a KL penalty is meant to do.",
        "forward_kl": "follows the gradient of the forward KL, KL(π_ref‖π_θ) (mode-covering), not the reverse KL a "
        "penalty is meant to follow; they agree only to first order near π_θ = π_ref.",
        "zero": "has zero expected gradient: on average it does nothing to the policy.",
        "neither": f"follows neither KL gradient (relative error above {FOLLOWS_TOL:g} to both).",
    }[r.follows]
    lines = [
        f"klviz audit: your KL term ({r.placement}, {where}; vocab {r.vocab_size}, length {r.length}, "
        f"{r.vocab_size**r.length} sequences, exact sums) {verdict}",
        f"  relative error to ∇KL(π_θ‖π_ref): {_e(r.relative_error['reverse_kl'])}; to ∇KL(π_ref‖π_θ): "
        f"{_e(r.relative_error['forward_kl'])}; to the token-level reverse gradient: "
        f"{_e(r.relative_error_token_level)}",
        "  the drawn policies: "
        + ", ".join(f"{k} = {v:.3g}" for k, v in r.kl.items())
        + f"; the two targets differ by a relative error of {r.target_separation:.2f}",
    ]
    if r.follows == "neither" and r.length > 1 and r.relative_error_token_level <= FOLLOWS_TOL:
        lines.append(
            '  It follows the token-level ("partial") reverse-KL gradient: each token\'s own KL without the '
            "KL of the tokens after it; k1 in the reward with reward-to-go gives the full gradient."
        )
    if r.follows == "neither" and r.sampler == "old":
        lines.append("  Off-policy, a term needs the importance weight ρ = π_θ/sg(π_old) (as k3·ρ) to follow a KL.")
    lines.append(f"  Why: {_LESSONS[r.follows]}.")
    return "\n".join(lines)
