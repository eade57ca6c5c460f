"""Worked token examples: one sampled token by hand, response masks, aggregation, verl's clamps.

Lesson 04 reads a PPO step token by token. The direction rule of :mod:`klviz.estimators` applies
throughout: PPO's ``approx_kl`` compares the current policy pi_theta with the rollout policy
pi_old **on pi_old's tokens**, so ``log r = log pi_theta(x) - log pi_old(x)`` (target minus
sampler) and every estimator estimates **KL(pi_old || pi_theta)**.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from . import kernel
from .estimators import agg_loss, k1, k2, k3, kl_penalty, masked_mean
from .framework_rules import VERL_LOW_VAR_KL
from .validation import Tensor, as_float_tensor, check_same_shape

__all__ = [
    "WORKED_EXAMPLES",
    "WorkedToken",
    "worked_token",
    "one_token_push",
    "push_expectations",
    "minimind_response_mask",
    "mask_variants",
    "aggregations",
    "low_var_kl_clamp_effect",
    "low_var_kl_gradient",
    "k3_crossing_point",
]

#: The two tokens of MiniMind's ``approx_kl`` walk-through, as widely retold: (old log-prob, new log-prob).
WORKED_EXAMPLES: tuple[tuple[float, float], ...] = ((-2.0, -1.8), (-2.0, -0.5))
#: The same two (old, new) log-probability pairs under the name lesson 04 uses.


@dataclass(frozen=True)
class WorkedToken:
    """Every number of one sampled token, old → new (x sampled from pi_old)."""

    old_logprob: float
    new_logprob: float
    delta: float  #: log pi_theta(x) - log pi_old(x) = log r
    ratio: float  #: pi_theta(x) / pi_old(x) = exp(delta), PPO's ratio
    k1: float  #: -delta: this token's k1 of KL(pi_old || pi_theta) (can be negative)
    k2: float  #: ½ delta²: MiniMind's and TRL's ``approx_kl`` for this token
    k3: float  #: (ratio - 1) - delta: CleanRL's/SB3's approx_kl for this token


def worked_token(old_logprob: float, new_logprob: float) -> WorkedToken:
    """The worked arithmetic for one token, computed with :func:`klviz.k1`/``k2``/``k3``.

    >>> t = worked_token(-2.0, -1.8)
    >>> round(t.delta, 4), round(t.ratio, 4), round(t.k2, 4)
    (0.2, 1.2214, 0.02)
    """
    values = []
    for v, name in ((old_logprob, "old_logprob"), (new_logprob, "new_logprob")):
        try:
            f = float(v)
        except (TypeError, ValueError):
            raise ValueError(f"{name} must be one log-probability (a number <= 0), got {v!r}") from None
        if not (math.isfinite(f) and f <= 0):
            raise ValueError(f"{name} must be one finite log-probability (a number <= 0), got {v!r}")
        values.append(torch.tensor(f, dtype=torch.float64))
    old, new = values
    log_r = new - old
    return WorkedToken(
        float(old),
        float(new),
        float(log_r),
        float(torch.exp(log_r)),
        float(k1(log_r)),
        float(k2(log_r)),
        float(k3(log_r)),
    )


def one_token_push(old_logprob: float, new_logprob: float) -> tuple[Tensor, Tensor]:
    """The smallest change of a distribution in which the sampled token moves from ``old`` to ``new``.

    The sampled token x has probability ``exp(old_logprob)`` under pi_old and ``exp(new_logprob)``
    under pi_theta; every other token keeps its share of the remaining mass (all other tokens are
    rescaled by the same factor). Whatever the vocabulary, KL and every expectation then depend only
    on the two numbers (x, not-x), so the pair of two-outcome distributions ``[p(x), 1 - p(x)]`` is
    returned as probabilities (old, new), float64.
    """
    old = float(old_logprob)
    new = float(new_logprob)
    for v, name in ((old, "old_logprob"), (new, "new_logprob")):
        if not (math.isfinite(v) and v < 0):
            raise ValueError(
                f"{name} must be a finite log-probability below 0 (a token with probability < 1), got {v!r}"
            )
    p, q = math.exp(old), math.exp(new)
    return torch.tensor([p, 1 - p], dtype=torch.float64), torch.tensor([q, 1 - q], dtype=torch.float64)


def push_expectations(old_logprob: float, new_logprob: float) -> dict[str, float]:
    """Exact KL(pi_old || pi_theta) for :func:`one_token_push`, beside E_old[k1], E_old[k2], E_old[k3].

    Expectations are sums over the two outcomes weighted by pi_old (no sampling). E[k1] and E[k3]
    equal the KL exactly; E[k2] (what ``approx_kl`` averages to) matches it only to second order.
    Also returns the sampled token's own values, to show that one token's ½Δ² is not the KL.
    """
    p_old, p_new = one_token_push(old_logprob, new_logprob)
    log_r = torch.log(p_new) - torch.log(p_old)  # target pi_theta over sampler pi_old
    kl = float((p_old * (torch.log(p_old) - torch.log(p_new))).sum())
    out = {
        "exact_kl": kl,
        "E_k1": float((p_old * k1(log_r)).sum()),
        "E_k2": float((p_old * k2(log_r)).sum()),
        "E_k3": float((p_old * k3(log_r)).sum()),
        "token_k1": float(k1(log_r[0])),
        "token_k2": float(k2(log_r[0])),
        "token_k3": float(k3(log_r[0])),
    }
    out["E_k2_over_kl"] = out["E_k2"] / kl if kl > 0 else float("nan")
    return out


# ---------------------------------------------------------------------------------------------
# masks
# ---------------------------------------------------------------------------------------------
def minimind_response_mask(completion_ids: Tensor, completion_mask: Tensor, eos_id: int) -> Tensor:
    """MiniMind's ``resp_policy_mask``: response tokens up to **and including** the first EOS.

    ``completion_ids [B, R]`` are the generated tokens (left-aligned), ``completion_mask [B, R]``
    is 1 where the engine produced a token and 0 on padding. Following ``trainer/train_ppo.py``
    (jingyaogong/minimind): a row's length is the position of its first EOS + 1 if it has one,
    else its number of generated tokens, clamped to at least 1; the mask keeps positions
    ``< length`` that are not padding. Returns a float ``[B, R]`` mask.
    """
    if not isinstance(completion_ids, Tensor) or completion_ids.is_floating_point() or completion_ids.dim() != 2:
        raise ValueError("completion_ids must be a [batch, response_length] integer tensor of token ids")
    if not isinstance(completion_mask, Tensor) or completion_mask.shape != completion_ids.shape:
        raise ValueError(f"completion_mask must be a tensor of shape {tuple(completion_ids.shape)}")
    if isinstance(eos_id, bool) or not isinstance(eos_id, int):
        raise ValueError(f"eos_id must be an int token id, got {eos_id!r}")
    pad_ok = completion_mask.bool()
    idx = torch.arange(completion_ids.shape[1], device=completion_ids.device)[None, :]
    is_eos = completion_ids.eq(eos_id) & pad_ok
    has_eos = is_eos.any(1)
    first_eos = torch.argmax(is_eos.int(), dim=1)
    lengths = torch.where(has_eos, first_eos + 1, pad_ok.sum(1)).clamp(min=1)
    return ((idx < lengths[:, None]) & pad_ok).float()


def mask_variants(completion_ids: Tensor, completion_mask: Tensor, eos_id: int) -> dict[str, Tensor]:
    """The right mask and three broken ones, to show what each part of the mask is for.

    - ``"minimind"``: :func:`minimind_response_mask` (the right one);
    - ``"no_eos_cut"``: padding out but nothing cut at EOS: counts tokens generated after EOS;
    - ``"eos_excluded"``: stops *before* the EOS: the decision to stop is never trained or penalised;
    - ``"no_mask"``: every position, padding included.
    """
    right = minimind_response_mask(completion_ids, completion_mask, eos_id)
    is_eos = completion_ids.eq(eos_id).float()
    return {
        "minimind": right,
        "no_eos_cut": completion_mask.float(),
        "eos_excluded": right * (1 - is_eos),
        "no_mask": torch.ones_like(right),
    }


def aggregations(values: Tensor, mask: Tensor) -> dict[str, float]:
    """One per-token matrix, aggregated every way the frameworks do (via :func:`klviz.agg_loss`).

    ``token-mean`` (verl's default loss aggregation, MiniMind, TRL GRPO's logged ``kl``),
    ``seq-mean-token-mean`` (verl's logged ``reward_kl_penalty``, OpenRLHF's logged ``kl``),
    ``seq-mean-token-sum`` (TRL PPO's ``objective/kl``: a *sequence* KL, by the chain rule).
    """
    v = as_float_tensor(values, "values", check_finite=False)
    return {
        mode: float(agg_loss(v, mask, mode)) for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
    }


# ---------------------------------------------------------------------------------------------
# verl's low_var_kl and its two clamps
# ---------------------------------------------------------------------------------------------
def k3_crossing_point(bound: float = VERL_LOW_VAR_KL.upper_bound, *, negative: bool = False) -> float:
    """The log-ratio d at which k3 = exp(d) - d - 1 reaches ``bound`` (Newton's method).

    k3 reaches ``bound`` twice. Above d > 0 (``negative=False``): for 10 about 2.61, a token whose
    reference probability is 13.6 times the policy's. Below, d < 0 (``negative=True``): for 10 about
    -11.0, a token the policy finds e^11 = 6·10^4 times likelier than the reference, where k3 is
    nearly linear (-d - 1). Beyond either point verl's output clamp replaces k3 by ``bound`` and its
    gradient by 0.
    """
    if not bound > 0:
        raise ValueError(f"bound must be positive, got {bound!r}")
    start = -(bound + 1.0) if negative else math.log(bound + 1.0) + 0.5
    d = torch.tensor(start, dtype=torch.float64)
    for _ in range(60):
        d = d - (kernel.k3(d) - bound) / torch.expm1(d)  # Newton: d k3 / d d = e^d - 1
    return float(d)


def low_var_kl_clamp_effect(logprob: Tensor, ref_logprob: Tensor, mask: Tensor) -> dict[str, float]:
    """How much verl's output clamp at 10 changes ``low_var_kl`` on a batch.

    Compares k3 with both clamps (:func:`klviz.kl_penalty` ``"low_var_kl"``) against plain k3
    (:func:`klviz.k3`) on the same tokens: the fraction of counted tokens clamped, both token means
    and the share of the unclamped value the clamp removed. Also reports the smallest k3 seen
    (never below -1e-6: the lower clamp at -10 cannot act).
    """
    lp = as_float_tensor(logprob, "logprob")
    ref = as_float_tensor(ref_logprob, "ref_logprob")
    check_same_shape(lp, ref, "logprob", "ref_logprob")
    m = torch.as_tensor(mask).to(lp.dtype)
    check_same_shape(lp, m, "logprob", "mask")
    clamped = kl_penalty(lp, ref, "low_var_kl")
    plain = k3(ref - lp)
    counted = m != 0
    n = int(counted.sum())
    if n == 0:
        raise ValueError("mask counts no token")
    mean_clamped = float(masked_mean(clamped, m))
    mean_plain = float(masked_mean(plain, m))
    return {
        "tokens": n,
        "fraction_clamped": float(((plain > 10.0) & counted).sum()) / n,
        "mean_clamped": mean_clamped,
        "mean_unclamped": mean_plain,
        "removed_share": (mean_plain - mean_clamped) / mean_plain if mean_plain > 0 else 0.0,
        "largest_k3": float(plain[counted].max()),
        "smallest_k3": float(plain[counted].min()),
    }


def low_var_kl_gradient(
    log_ratio: Tensor, input_clamp: bool = True, output_clamp: bool = True, dtype: torch.dtype = torch.float32
) -> dict[str, Tensor]:
    """Value and gradient (w.r.t. the policy log-prob) of k3 written verl's way, clamps on or off.

    ``log_ratio`` = ``ref_logprob - logprob`` per token. Built as verl builds it
    (``exp(d) - d - 1`` with ``d`` optionally clamped to ±20, the result optionally clamped to ±10),
    so the effect of each clamp on the backward pass can be seen: without the input clamp a
    log-ratio above ~88.7 (float32) makes ``exp`` overflow, and the output clamp's zero gradient
    times the infinite inner gradient gives **NaN**.
    """
    d0 = as_float_tensor(log_ratio, "log_ratio").to(dtype)
    logprob = (-d0).clone().requires_grad_(True)  # ref_logprob = 0, logprob = -d
    d = 0.0 - logprob
    rule = VERL_LOW_VAR_KL  # the clamp values, from the one table of rules
    if input_clamp:
        d = rule.clamp_input(d, "k3")
    # verl's own formula, not klviz.kernel.k3: what its exp() does to the backward pass is the point here
    val = torch.exp(d) - d - 1
    if output_clamp:
        val = rule.clamp_output(val, "k3")
    (grad,) = torch.autograd.grad(val.sum(), logprob)
    return {"value": val.detach(), "grad": grad}
