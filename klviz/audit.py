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
angle below 2.9°); else ``"neither"``. A term that is the target's gradient in expectation comes out at
rounding level (about 1e-15 in float64, 1e-7 through a framework's float32 arithmetic).

**Policies drawn so that verdicts do not depend on the seed.** The policies are re-drawn until every
pair of *structural* gradients a term can follow differs by a relative error of at least
:data:`TARGET_SEPARATION` (0.3, six times the threshold): the reverse and the forward target; from length 2,
the token-level "partial" reverse gradient Σ_t E[∇ log π(y_t) k1_t] (what per-token losses follow at
best) and the gradient of a per-token k3 loss (verl's default); off-policy from length 2, per-token ρ·k3 (what
TRL's and NeMo-RL's corrections compute). A term that
follows one of them is then at least 0.25 from every other, on every seed (``tests/test_audit.py`` checks
the verdicts of the frameworks' own terms over many seeds).

**What the term behaves like.** Beside the verdict the audit compares the gradient with a small library of
known terms (:data:`FINGERPRINTS`: k1, k2, k3 as losses, per-token ρ·k3, the prefix-product ρ·k3 that is exact
off-policy, k3 with the inverted ratio π/π_ref, k1 in the reward computed at π_θ or frozen at rollout,
clamped k3 as verl and NeMo-RL clamp it) and names the closest one within the threshold, with the fix that
fits it (``behaves_like``, ``hint``).

**Length.** At length 1 a token-level term and a sequence-level one cannot differ, so a k2 loss looks like
"reverse KL". With the default ``length=1`` the result also carries the audit at length 3
(``result.sequence``), and the summary shows both side by side.

**Clamps.** ``policies="far"`` lowers the reference's logit of the policy's most likely token at every
prefix by 25 (log r ≈ −25 there), so verl's and NeMo-RL's input clamp (±20) and every output clamp (±10)
bind on tokens the policy samples often; with the default ``"mild"`` policies no clamp ever binds.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from .bandit import SequenceToy
from .devices import single_thread

__all__ = [
    "AuditResult",
    "audit_loss",
    "FOLLOWS_TOL",
    "ZERO_TOL",
    "TARGET_SEPARATION",
    "TARGETS",
    "FINGERPRINTS",
    "MAX_SEQUENCES",
    "SEQUENCE_LENGTH",
    "POLICIES",
]

#: Largest relative error (tan of the angle to the target) at which a term "follows" it.
FOLLOWS_TOL = 0.05
#: A gradient smaller than this fraction of the reverse-KL gradient counts as zero.
ZERO_TOL = 1e-6
#: Smallest relative error between any two structural gradients that the drawn policies allow.
TARGET_SEPARATION = 0.3
TARGETS: tuple[str, str] = ("reverse_kl", "forward_kl")
#: Most sequences the audit enumerates (vocab_size ** length).
MAX_SEQUENCES = 4096
#: The length of the side-by-side audit when ``length=1``.
SEQUENCE_LENGTH = 3
#: The kinds of policy pairs: mild (no clamp binds) or far apart (every framework's clamps bind).
POLICIES = ("mild", "far")
#: How far "far" policies put the reference below the policy's most likely token (nats).
FAR_GAP = 25.0
_LESSONS = {
    "reverse_kl": "lesson 05 (gradients: k2 in the loss = k1 in the reward; ratio-corrected k3) and the lesson 07 lab",
    "forward_kl": "lesson 05 (k3 as a loss follows the forward KL, mode-covering) and the lesson 07 lab, where it "
    "converges elsewhere",
    "zero": "lesson 05 (k1 as a loss does nothing on average: E[∇ log π] = 0)",
    "neither": "lesson 05 (token-level vs sequence gradients, off-policy terms without importance weights) and the "
    "lesson 07 lab",
}

_Fn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def _k3(lp: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    d = ref - lp
    return torch.exp(d) - d - 1


def _prefix_rho(lp: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    return torch.exp(torch.cumsum(lp - old.detach(), -1))


@dataclass(frozen=True)
class Fingerprint:
    """A known KL term: per-sequence values ``term(lp, old, ref) -> [S]`` (loss) or per-token penalties
    ``[S, T]`` (reward), what it is, and the hint that fits it."""

    name: str
    placement: str
    term: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
    hint: str


def _clamped_k3(lp: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    d = (ref - lp).clamp(-20.0, 20.0)
    return (torch.exp(d) - d - 1).clamp(max=10.0)


def _nemo_k3(lp: torch.Tensor, old: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    d = (ref - lp).clamp(-20.0, 20.0)
    return (torch.exp(lp - old.detach()) * (torch.exp(d) - d - 1)).clamp(max=10.0)


#: The known terms the audit compares a gradient with (see the module docstring).
FINGERPRINTS: tuple[Fingerprint, ...] = (
    Fingerprint(
        "k1 as a loss",
        "loss",
        lambda lp, o, r: (lp - r).mean(-1),
        "k1 as a loss has zero expected gradient (E[∇ log π] = 0): put k1 in the reward (detached, with "
        "reward-to-go), or use k2 as the loss.",
    ),
    Fingerprint(
        "k2 as a loss, per token",
        "loss",
        lambda lp, o, r: (0.5 * (lp - r) ** 2).mean(-1),
        "A per-token k2 loss gives the token-level (partial) gradient of the sequence KL; k1 in the reward "
        "with reward-to-go gives the full one.",
    ),
    Fingerprint(
        "k3 as a loss, per token",
        "loss",
        lambda lp, o, r: _k3(lp, r).mean(-1),
        "k3 as a loss follows the forward KL(π_ref‖π_θ): weight it by ρ = π_θ/sg(π_sampler) (k3·ρ), or use "
        "the straight-through k3+ (value of k3, gradient of k2).",
    ),
    Fingerprint(
        "k3 clamped as verl's low_var_kl (log r to ±20, k3 to ≤ 10)",
        "loss",
        lambda lp, o, r: _clamped_k3(lp, r).mean(-1),
        "Where the clamps bind the gradient is 0, so the tokens the reference all but excludes stop pulling "
        "the policy back; and unclamped this is k3 as a loss (forward KL). Use k3·ρ, or k2 / k1 in the "
        "reward, and keep the policy near the reference.",
    ),
    Fingerprint(
        "k3·ρ with a per-token ρ = π_θ/sg(π_old)",
        "loss",
        lambda lp, o, r: (torch.exp(lp - o.detach()) * _k3(lp, r)).mean(-1),
        "A per-token ρ corrects only the token given its prefix; the prefix itself came from π_old. For the "
        "sequence KL weight token t by the prefix product ∏_{u≤t} ρ_u (gradient through it), or keep the "
        "update on-policy.",
    ),
    Fingerprint(
        "clamp(ρ·k3) as NeMo-RL computes it (ρ before the ±10 clamp)",
        "loss",
        lambda lp, o, r: _nemo_k3(lp, o, r).mean(-1),
        "Where the clamp binds the gradient is 0, the ρ included: clamped tokens get no correction. Keep the "
        "policy where the clamps do not bind, or clamp the weight, not the product.",
    ),
    Fingerprint(
        "k3·ρ with the prefix-product weight ∏_{u≤t} ρ_u",
        "loss",
        lambda lp, o, r: (_prefix_rho(lp, o) * _k3(lp, r)).mean(-1),
        "The prefix product makes a per-token term exact for the sequence KL off-policy.",
    ),
    Fingerprint(
        "k3 with the inverted ratio r = π_θ/π_ref",
        "loss",
        lambda lp, o, r: _k3(r, lp).mean(-1),
        "The ratio is inverted: k3 needs r = π_ref/π_θ (target over sampler). With π_θ/π_ref it estimates "
        "χ² − KL, not KL (lesson 06 §1).",
    ),
    Fingerprint(
        "k1 in the reward, computed at π_θ",
        "reward",
        lambda lp, o, r: (lp - r).detach(),
        "k1 in the reward with reward-to-go follows the sequence KL on-policy; off-policy its per-token ρ "
        "leaves the prefixes unweighted.",
    ),
    Fingerprint(
        "k1 in the reward, frozen at rollout (π_old's log-probs)",
        "reward",
        lambda lp, o, r: (o - r).detach(),
        "The penalty was computed at rollout, from π_old: recompute it at π_θ (log π_θ − log π_ref) when the "
        "update runs, so it penalises the policy being trained.",
    ),
    Fingerprint(
        "k3 in the reward",
        "reward",
        lambda lp, o, r: _k3(lp, r).detach(),
        "k3 in the reward is biased: its expectation is KL but E[k3 · ∇ log π] is not ∇KL. Use k1 in the reward.",
    ),
)


@dataclass
class AuditResult:
    """What :func:`audit_loss` found (see the module docstring)."""

    follows: str
    relative_error: dict[str, float]
    relative_error_token_level: float
    gradient_norm: float
    target_norms: dict[str, float]
    scale: dict[str, float]  # the best positive multiple c of each target
    target_separation: float  # smallest relative error between two structural gradients
    kl: dict[str, float]  # KL(π‖π_ref), KL(π_ref‖π), KL(π_old‖π) of the drawn policies
    placement: str
    sampler: str
    vocab_size: int
    length: int
    seed: int
    policies: str = "mild"
    behaves_like: str | None = None  # the closest known term (FINGERPRINTS), within FOLLOWS_TOL
    behaves_like_error: float = math.inf
    hint: str = ""
    clamp_binds: float = 0.0  # share of the sampler's probability on tokens with |log r| > 10
    sequence: AuditResult | None = None  # the audit at SEQUENCE_LENGTH beside a length-1 audit
    summary: str = ""
    gradient: torch.Tensor | None = field(default=None, repr=False)

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {}
        for k, v in self.__dict__.items():
            if k == "gradient":
                continue
            if k == "sequence":
                d[k] = v.as_dict() if v is not None else None
            elif isinstance(v, float) and not math.isfinite(v):
                d[k] = None
            elif isinstance(v, dict):
                d[k] = {kk: (None if isinstance(vv, float) and not math.isfinite(vv) else vv) for kk, vv in v.items()}
            else:
                d[k] = v
        return d


def _rel_error(g: torch.Tensor, t: torch.Tensor) -> tuple[float, float]:
    tt = float(t.flatten() @ t.flatten())
    if tt == 0:
        return math.inf, 0.0
    c = float(g.flatten() @ t.flatten()) / tt
    if c <= 0:
        return math.inf, c
    return float((g - c * t).norm()) / (abs(c) * math.sqrt(tt)), c


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


def _fingerprint_gradient(
    fp: Fingerprint, toy: SequenceToy, theta: torch.Tensor, ref: torch.Tensor, old: torch.Tensor | None
) -> torch.Tensor:
    """The exact expected gradient of a known term, all sequences at once (the same sums as for ``fn``)."""
    lg = theta.detach().clone().requires_grad_(True)
    with torch.enable_grad():
        lp = toy.token_logprobs(lg)
        lp_ref = toy.token_logprobs(ref).detach()
        lp_old = toy.token_logprobs(old).detach() if old is not None else lp.detach()
        q = toy.sequence_probs(old if old is not None else theta).detach()
        if fp.placement == "loss":
            per_seq = fp.term(lp, lp_old, lp_ref)
        else:
            pen = fp.term(lp, lp_old, lp_ref).detach()
            to_go = pen.flip(-1).cumsum(-1).flip(-1)
            per_seq = (torch.exp(lp - lp_old) * to_go).sum(-1)
        (g,) = torch.autograd.grad((q * per_seq).sum(), lg)
    return g


def _policies(
    toy: SequenceToy, seed: int, sampler: str, policies: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]:
    """θ, ref and old logits drawn from ``seed``, re-drawn until every pair of structural gradients is
    :data:`TARGET_SEPARATION` apart (the best draw of 200 otherwise; the result reports the separation)."""
    best: tuple[float, torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    for attempt in range(200):
        g = torch.Generator().manual_seed(int(seed) * 1000 + attempt)
        theta = toy.random_logits(1.0, generator=g)
        ref = theta + toy.random_logits(1.2, generator=g)
        old = theta + toy.random_logits(0.6, generator=g)
        if policies == "far":
            top = torch.nn.functional.one_hot(theta.argmax(-1), toy.vocab_size).to(theta.dtype)
            ref = ref - FAR_GAP * top
        sep = _separation(toy, theta, ref, old if sampler == "old" else None)
        if best is None or sep > best[0]:
            best = (sep, theta, ref, old)
        if sep >= TARGET_SEPARATION:
            break
    assert best is not None
    return best[1], best[2], best[3], best[0]


def _structural(
    toy: SequenceToy, theta: torch.Tensor, ref: torch.Tensor, old: torch.Tensor | None
) -> dict[str, torch.Tensor]:
    out = {"reverse_kl": toy.true_gradient(theta, ref), "forward_kl": _forward_gradient(toy, theta, ref)}
    if toy.length > 1:
        out["token_level"] = _token_level_gradient(toy, theta, ref)
        out["token_level_k3_loss"] = _fingerprint_gradient(FINGERPRINTS[2], toy, theta, ref, old)
        if old is not None:
            out["per_token_rho_k3"] = _fingerprint_gradient(FINGERPRINTS[4], toy, theta, ref, old)
    return out


def _separation(toy: SequenceToy, theta: torch.Tensor, ref: torch.Tensor, old: torch.Tensor | None) -> float:
    grads = list(_structural(toy, theta, ref, old).values())
    seps = [_rel_error(a, b)[0] for i, a in enumerate(grads) for b in grads[i + 1 :]]
    seps += [_rel_error(b, a)[0] for i, a in enumerate(grads) for b in grads[i + 1 :]]
    return min(seps)


def _check(fn: Any, placement: str, sampler: str, vocab_size: Any, length: Any, policies: str) -> None:
    if not callable(fn):
        raise ValueError(
            f"fn must be callable (fn(logprob, old_logprob, ref_logprob, response_mask)), got {type(fn).__name__}"
        )
    if placement not in ("loss", "reward"):
        raise ValueError(f"placement must be 'loss' or 'reward', got {placement!r}")
    if sampler not in ("current", "old"):
        raise ValueError(f"sampler must be 'current' or 'old', got {sampler!r}")
    if policies not in POLICIES:
        raise ValueError(f"policies must be one of {POLICIES}, got {policies!r}")
    for name, v in (("vocab_size", vocab_size), ("length", length)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    if vocab_size < 2:
        raise ValueError(f"vocab_size must be at least 2, got {vocab_size}")
    # bounds first, in logarithms: vocab_size ** length is never computed when it is too large
    if length * math.log(vocab_size) > math.log(MAX_SEQUENCES) + 1e-9:
        raise ValueError(
            f"vocab_size ** length ({vocab_size} ** {length}) is more than {MAX_SEQUENCES} sequences to enumerate; "
            f"lower --length or --vocab-size"
        )


def _expected_gradient(
    fn: _Fn,
    toy: SequenceToy,
    theta: torch.Tensor,
    ref: torch.Tensor,
    old: torch.Tensor | None,
    placement: str,
) -> torch.Tensor:
    """Σ_y q(y) ∇ term(y), the user's ``fn`` called on one sequence at a time."""
    length = toy.length
    with torch.no_grad():
        lp_ref = toy.token_logprobs(ref)
        lp_old = toy.token_logprobs(old) if old is not None else None
        q = toy.sequence_probs(old if old is not None else theta)
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
            except SystemExit as err:
                raise ValueError(f"fn called sys.exit({err.code!r}): a KL term must return a value") from None
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
            return torch.zeros_like(theta)
        (grad,) = torch.autograd.grad(total, lg, allow_unused=True)
    return torch.zeros_like(theta) if grad is None else grad


def audit_loss(
    fn: Callable[..., torch.Tensor],
    *,
    placement: str = "loss",
    sampler: str = "current",
    vocab_size: int = 4,
    length: int = 1,
    seed: int = 0,
    policies: str = "mild",
) -> AuditResult:
    """The exact expected gradient of a user's KL term, and which KL gradient it follows.

    ``fn(logprob, old_logprob, ref_logprob, response_mask)`` gets float64 ``[1, length]`` tensors for
    one sequence at a time (``logprob`` carries the gradient; ``old_logprob`` holds the sampler's
    log-probs, equal to ``logprob`` in value when ``sampler="current"``; the mask is all ones) and
    returns a scalar loss (``placement="loss"``) or per-token penalties ``[1, length]``
    (``placement="reward"``). ``policies="far"`` makes the frameworks' clamps bind. With ``length=1`` the
    audit at length :data:`SEQUENCE_LENGTH` comes along in ``result.sequence`` (when the vocabulary allows
    it). See the module docstring for the classification.
    """
    _check(fn, placement, sampler, vocab_size, length, policies)
    with single_thread():  # tiny tensors: a thread pool only adds hand-offs
        res = _audit(fn, placement, sampler, vocab_size, length, seed, policies)
        if length == 1 and SEQUENCE_LENGTH * math.log(vocab_size) <= math.log(MAX_SEQUENCES):
            res.sequence = _audit(fn, placement, sampler, vocab_size, SEQUENCE_LENGTH, seed, policies)
    res.summary = _summary(res)
    return res


def _audit(
    fn: _Fn, placement: str, sampler: str, vocab_size: int, length: int, seed: int, policies: str
) -> AuditResult:
    toy = SequenceToy(vocab_size, length)
    theta, ref, old, sep = _policies(toy, seed, sampler, policies)
    old_used = old if sampler == "old" else None
    grad = _expected_gradient(fn, toy, theta, ref, old_used, placement)
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
        q = toy.sequence_probs(old_used if old_used is not None else theta)
        lr = toy.token_logprobs(ref) - toy.token_logprobs(theta)
        binds = float((q[:, None] * (lr.abs() > 10).double()).sum() / length)
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
        policies=policies,
        clamp_binds=binds,
        gradient=grad,
    )
    _fingerprint(res, toy, theta, ref, old_used)
    res.summary = _summary(res)
    return res


def _fingerprint(
    res: AuditResult, toy: SequenceToy, theta: torch.Tensor, ref: torch.Tensor, old: torch.Tensor | None
) -> None:
    """The closest known term within FOLLOWS_TOL, and its hint."""
    g = res.gradient
    assert g is not None
    best: tuple[float, Fingerprint] | None = None
    if res.follows == "zero":
        res.behaves_like, res.behaves_like_error, res.hint = FINGERPRINTS[0].name, 0.0, FINGERPRINTS[0].hint
        return
    for fp in FINGERPRINTS:
        if fp.placement != res.placement:
            continue
        ref_g = _fingerprint_gradient(fp, toy, theta, ref, old)
        if float(ref_g.norm()) < ZERO_TOL * float(g.norm()):
            continue
        err, _ = _rel_error(g, ref_g)
        if err <= FOLLOWS_TOL and (best is None or err < best[0] - 1e-12):
            best = (err, fp)
    if best is not None:
        res.behaves_like, res.behaves_like_error, res.hint = best[1].name, best[0], best[1].hint


def _e(x: float) -> str:
    return "∞ (points away)" if not math.isfinite(x) else f"{x:.3g}"


_VERDICT = {
    "reverse_kl": "follows the gradient of the reverse KL, KL(π_θ‖π_ref): what a KL penalty is meant to do.",
    "forward_kl": "follows the gradient of the forward KL, KL(π_ref‖π_θ) (mode-covering), not the reverse KL a "
    "penalty is meant to follow; they agree only to first order near π_θ = π_ref.",
    "zero": "has zero expected gradient: on average it does nothing to the policy.",
    "neither": f"follows neither KL gradient (relative error above {FOLLOWS_TOL:g} to both).",
}
_SHORT = {"reverse_kl": "reverse KL", "forward_kl": "forward KL", "zero": "zero", "neither": "neither"}


def _summary(r: AuditResult) -> str:
    where = "tokens from the current policy π_θ" if r.sampler == "current" else "tokens from an older policy π_old"
    far = "; far-apart policies, clamps bind" if r.policies == "far" else ""
    lines = [
        f"klviz audit: your KL term ({r.placement}, {where}; vocab {r.vocab_size}, length {r.length}, "
        f"{r.vocab_size**r.length} sequences, exact sums{far}) {_VERDICT[r.follows]}",
        f"  relative error to ∇KL(π_θ‖π_ref): {_e(r.relative_error['reverse_kl'])}; to ∇KL(π_ref‖π_θ): "
        f"{_e(r.relative_error['forward_kl'])}; to the token-level reverse gradient: "
        f"{_e(r.relative_error_token_level)}",
        "  the drawn policies: "
        + ", ".join(f"{k} = {v:.3g}" for k, v in r.kl.items())
        + f"; the structural gradients differ pairwise by a relative error of at least {r.target_separation:.2f}"
        + (f"; {100 * r.clamp_binds:.0f}% of sampled tokens have |log r| > 10" if r.policies == "far" else ""),
    ]
    s = r.sequence
    if s is not None:
        lines.append(
            f"  side by side: length {r.length}: {_SHORT[r.follows]}; length {s.length}: {_SHORT[s.follows]} "
            f"(relative error to the sequence ∇KL(π_θ‖π_ref) {_e(s.relative_error['reverse_kl'])}, to the "
            f"token-level gradient {_e(s.relative_error_token_level)})"
        )
        if s.follows != r.follows:
            lines.append(
                f"  At length 1 a token-level term cannot differ from a sequence-level one: the length-{s.length} "
                "verdict is the one that holds for responses."
            )
    shown = s if s is not None and s.follows != r.follows else r
    if shown.behaves_like is not None:
        lines.append(
            f"  It behaves like {shown.behaves_like} (relative error {_e(shown.behaves_like_error)}"
            + (f", at length {shown.length}" if shown is s else "")
            + f"): {shown.hint}"
        )
    elif shown.follows == "neither" and shown.length > 1 and shown.relative_error_token_level <= FOLLOWS_TOL:
        lines.append(
            '  It follows the token-level ("partial") reverse-KL gradient: each token\'s own KL without the '
            "KL of the tokens after it; k1 in the reward with reward-to-go gives the full gradient."
        )
    elif shown.follows == "neither" and shown.sampler == "old":
        lines.append(
            "  Off-policy, a term needs importance weights to follow a KL: ρ = π_θ/sg(π_old) for one token; for a "
            "sequence, the prefix product ∏_{u≤t} ρ_u on token t."
        )
    lines.append(f"  Why: {_LESSONS[shown.follows]}.")
    return "\n".join(lines)
