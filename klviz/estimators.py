"""Per-sample KL estimators, the penalties RL frameworks compute from them, and aggregation.

The direction rule used everywhere in klviz: the tokens were drawn from the **sampler** q, the
other distribution is the **target** p, and ``log_r = log p(x) - log q(x)`` (target minus
sampler). Then k1, k2 and k3 all estimate **KL(q || p)**, the divergence *from the sampler*.
"""

from __future__ import annotations

import numpy as np
import torch

from . import kernel
from .framework_rules import VERL_LOW_VAR_KL
from .validation import (
    Tensor,
    as_float_tensor,
    as_mask,
    check_choice,
    check_dim,
    check_finite_values,
    check_positive_number,
    check_same_shape,
    common_dtype,
)

__all__ = ["k1", "k2", "k3", "kl_penalty", "KL_PENALTY_KINDS", "masked_mean", "agg_loss", "AGG_MODES"]


def k1(log_r: Tensor) -> Tensor:
    """Naive estimator ``-log r``: unbiased for KL(q||p) when x ~ q, but negative for some samples.

    ``log_r = log p(x) - log q(x)`` with x drawn from q (target minus sampler).
    """
    return kernel.k1(as_float_tensor(log_r, "log_r"))


def k2(log_r: Tensor) -> Tensor:
    """``½ (log r)²``: never negative, low variance, *biased* for KL(q||p) (x ~ q).

    Its expectation is an f-divergence-like quantity that matches KL(q||p) to second order in
    ``log r``, so the bias is tiny for close policies and grows as they separate.
    """
    return kernel.k2(as_float_tensor(log_r, "log_r"))


def k3(log_r: Tensor) -> Tensor:
    """``(r - 1) - log r``: unbiased for KL(q||p) with x ~ q, and never negative.

    Computed as ``expm1(log_r) - log_r``, and by its Taylor series (to x⁶) for ``|log_r| < 0.1``
    (float32; 1e-3 in float64)
    where that subtraction would cancel, so it keeps full relative precision near
    ``r = 1``; finite for ``|log_r|`` up to 88 in float32 (beyond that the true value exceeds what
    float32 can hold and the result is ``+inf``; pass float64 to go further). The formula lives in
    :func:`klviz.kernel.k3`.
    """
    return kernel.k3(as_float_tensor(log_r, "log_r"))


KL_PENALTY_KINDS = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
_ALL_KINDS = KL_PENALTY_KINDS + tuple(k + "+" for k in KL_PENALTY_KINDS)


def _penalty_value(logprob: Tensor, ref_logprob: Tensor, kind: str) -> Tensor:
    log_r = ref_logprob - logprob  # target pi_ref over the sampler, the policy
    if kind in ("kl", "k1"):
        return kernel.k1(log_r)
    if kind == "abs":
        return log_r.abs()
    if kind in ("mse", "k2"):
        return kernel.k2(log_r)
    # low_var_kl / k3, with verl's two clamps (klviz.framework_rules.VERL_LOW_VAR_KL): log r to ±20 so
    # exp() and its gradient stay finite, the value to ±10 (k3 >= 0: only the upper bound can act)
    return VERL_LOW_VAR_KL.apply(log_r, "k3")


def kl_penalty(logprob: Tensor, ref_logprob: Tensor, kind: str) -> Tensor:
    """verl's per-token KL penalty: estimates **KL(pi || pi_ref)**, tokens sampled from the policy.

    Follows verl-project/verl @ 1dda039 (2026-08-22), ``verl/trainer/ppo/core_algos.py``
    ``kl_penalty`` and ``kl_penalty_forward`` (the ``+`` kinds work upstream since PR #6058, 2026-04).

    ``logprob`` are the policy's log-probabilities of its own sampled tokens, ``ref_logprob`` the
    reference model's log-probabilities of the same tokens. Kinds, as named in verl:

    - ``"kl"``/``"k1"``: ``logprob - ref_logprob`` (k1);
    - ``"abs"``: ``|logprob - ref_logprob|`` (biased; not an estimator of any KL);
    - ``"mse"``/``"k2"``: ``½ (logprob - ref_logprob)²`` (k2);
    - ``"low_var_kl"``/``"k3"``: k3 with ``log r = ref_logprob - logprob`` clamped to [-20, 20]
      and the result clamped to [-10, 10] (the lower bound can never act because k3 >= 0).
    - any kind with a ``"+"`` suffix: straight-through: the forward value of that kind with the
      gradient of k2 (``½ Δ²``), whose expected gradient is the true gradient of KL(pi || pi_ref).

    verl's ``"full"`` (the exact sum over the vocabulary) needs logits, not log-probabilities of
    sampled tokens: use :func:`klviz.exact_kl` for it. Half-precision inputs are computed in float32.
    k3 comes from :func:`klviz.kernel.k3` (``expm1`` and a series near 0); verl writes
    ``exp(d) - d - 1``, which rounds differently near d = 0 in float32:
    :func:`klviz.frameworks.verl_kl_loss` reproduces verl's own rounding.
    """
    kind = check_choice(kind, "kind", _ALL_KINDS)
    lp = as_float_tensor(logprob, "logprob")
    ref = as_float_tensor(ref_logprob, "ref_logprob")
    check_same_shape(lp, ref, "logprob", "ref_logprob")
    dtype = common_dtype(lp, ref)
    lp, ref = lp.to(dtype), ref.to(dtype)
    if not kind.endswith("+"):
        return _penalty_value(lp, ref, kind)
    forward = _penalty_value(lp, ref, kind[:-1]).detach()
    backward = kernel.k2(ref - lp)
    return backward - backward.detach() + forward


#: verl's ``loss_agg_mode`` values (verl/trainer/ppo/core_algos.py ``agg_loss``); the first three are
#: the aggregations of DESIGN's public contract, ``token-sum`` was added upstream in 2026-08 (PR #7197).
AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm", "token-sum")


def _checked_values_and_mask(values: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    v = as_float_tensor(values, "values", check_finite=False)
    m = as_mask(mask, v, "mask")
    check_same_shape(v, m, "values", "mask")
    check_finite_values(v, "values", where=m != 0)
    return torch.where(m != 0, v, torch.zeros((), dtype=v.dtype, device=v.device)), m


def masked_mean(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``values`` over the positions where ``mask`` is non-zero (weighted by ``mask``).

    Used to turn per-token KL estimates into one number. Positions with mask 0 are ignored even if
    they hold NaN or inf (padding often does); NaN or inf at a counted position raises ``ValueError``.
    An all-zero mask (no tokens) gives **0.0**, not NaN: the same value MiniMind's
    ``clamp(min=1)`` denominator and verl's ``+ 1e-8`` denominator produce.
    """
    v, m = _checked_values_and_mask(values, mask)
    axis = None if dim is None else check_dim(dim, v.dim())
    # products and sums in float64: a float32 batch of large values or weights (3e38) cannot overflow
    vm = v.double() * m.double()
    total = vm.sum() if axis is None else vm.sum(axis)
    count = m.double().sum() if axis is None else m.double().sum(axis)
    mean = torch.where(count > 0, total / count.clamp_min(torch.finfo(torch.float64).tiny), torch.zeros_like(total))
    return mean.to(v.dtype)


def agg_loss(
    values: Tensor, mask: Tensor, mode: str, loss_scale_factor: float | None = None, *, legacy_norm: bool = False
) -> Tensor:
    """Aggregate a [batch, tokens] matrix of per-token values into a scalar the way verl does.

    Follows verl-project/verl @ 1dda039 (2026-08-22), ``verl/trainer/ppo/core_algos.py`` ``agg_loss``
    on one data-parallel rank (``dp_size=1``, no global token or sequence counts passed):

    - ``"token-mean"``: every counted token weighs the same (mean over all tokens of the batch);
    - ``"token-sum"``: the sum over all counted tokens (no normalisation; PR #7197, 2026-08);
    - ``"seq-mean-token-sum"``: sum over each sequence's tokens, then mean over sequences
      (a per-sequence estimate of the *sequence* KL, by the chain rule);
    - ``"seq-mean-token-mean"``: mean over each sequence's tokens, then mean over sequences
      (short sequences weigh as much as long ones);
    - ``"seq-mean-token-sum-norm"``: the ``seq-mean-token-sum`` value divided by
      ``loss_scale_factor`` (default: the number of token columns, ``mask.shape[-1]``, as in
      Dr. GRPO), i.e. the mean over non-empty sequences of per-sequence sums / scale (PR #5366 and
      #5417, 2026-02). ``legacy_norm=True`` gives verl's earlier value, the **sum** (not the mean) of
      the per-sequence sums divided by the scale: larger by the number of non-empty sequences.

    Sequences whose mask is all zero are left out of the sequence means (as in verl); a mask with no
    counted token at all gives 0.0 (verl divides 0 by 0 there). verl divides a sequence's sum by its
    length plus 1e-8 in ``seq-mean-token-mean``; here the division is exact (they differ by about
    1e-8 / length, relative).
    """
    mode = check_choice(mode, "mode", AGG_MODES)
    v, m = _checked_values_and_mask(values, mask)
    if v.dim() != 2:
        raise ValueError(f"values must be a [batch, tokens] matrix for agg_loss, got shape {tuple(v.shape)}")
    scale = (
        float(v.shape[-1])
        if loss_scale_factor is None
        else check_positive_number(loss_scale_factor, "loss_scale_factor")
    )
    if not isinstance(legacy_norm, (bool, np.bool_)):
        raise ValueError(f"legacy_norm must be True or False, got {legacy_norm!r}")
    if mode == "token-mean":
        return masked_mean(v, m)
    vm, m64 = v.double() * m.double(), m.double()  # sums in float64 (see masked_mean), the result in v's dtype
    if mode == "token-sum":
        return vm.sum().to(v.dtype)
    seq_sum = vm.sum(-1)
    seq_count = m64.sum(-1)
    nonempty = (seq_count > 0).double()
    if mode == "seq-mean-token-sum-norm":
        if legacy_norm:
            return (seq_sum.sum() / scale).to(v.dtype)
        return (masked_mean(seq_sum, nonempty) / scale).to(v.dtype)
    per_seq = (
        seq_sum if mode == "seq-mean-token-sum" else seq_sum / seq_count.clamp_min(torch.finfo(torch.float64).tiny)
    )
    return masked_mean(per_seq, nonempty).to(v.dtype)
