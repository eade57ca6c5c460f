"""What each RL framework computes and logs as "KL", following each framework's current code.

Every function takes per-token log-probabilities laid out the way the frameworks store them,
``[batch, response_length]`` with a 0/1 ``mask`` of valid response tokens, and returns a dict of
named tensors: the per-token values, the scalar the framework puts in its loss or reward, and the
scalar it *logs* (under the name it logs it). Which distribution sampled the tokens fixes what is
estimated (see :mod:`klviz.estimators`): rollouts come from pi_old, so

* the **reference penalty** (policy vs reference, on the policy's own tokens) estimates
  KL(pi_theta || pi_ref) on the first minibatch (where pi_theta = pi_old);
* PPO's **approx_kl / ppo_kl** (old vs current, on old's tokens) estimates KL(pi_old || pi_theta).

The functions re-derive each formula from the upstream source (they are not copies of the
frameworks' code) and reuse :func:`klviz.agg_loss`, :func:`klviz.masked_mean`, the estimator kernel
(:mod:`klviz.kernel`) where a framework's formula is ours, and the clamp table
(:mod:`klviz.framework_rules`). A formula is written out here only where the framework's own
differs from the kernel's (most write k3 as ``exp(d) - d - 1``, which loses its digits to
rounding near d = 0 in float32: the value a framework logs is that one); each such place says so.
Each docstring names the repository, commit and file it follows (read 2026-08; the defaults are the
frameworks' defaults of that commit); where users still run an older behaviour, a named keyword
option gives it.

Where a framework's float32 arithmetic overflows (a weight times a KL, ``exp`` of a large
log-ratio) these functions return what the framework returns (a clamp that catches ``inf`` gives
the bound; an unclamped overflow gives ``inf`` or NaN) instead of raising. Padding positions (mask
0) are set to 0 before any sum, so whatever they hold never reaches a result; an all-zero mask
gives 0.0 where a framework would divide 0 by 0.

**Precision.** "What the framework returns" holds for float32 and float64 inputs. float16 and
bfloat16 log-probabilities are computed in float32 here, as everywhere in klviz. OpenRLHF does the
same (``compute_approx_kl`` casts to float32, and ``Actor.forward`` already upcasts the logits);
verl's ``kl_penalty``, TRL's GRPO loss, NeMo-RL's ``calculate_kl`` and MiniMind's losses compute in
the dtype they are given, so on bfloat16 inputs their numbers differ from these by bfloat16
rounding. The one exception is :func:`openrlhf_compute_approx_kl` with ``float32=False``, which
models OpenRLHF before PR #620 and computes in the inputs' own dtype.
"""

from __future__ import annotations

from typing import Any

import torch

from . import kernel
from .estimators import KL_PENALTY_KINDS, agg_loss, masked_mean
from .framework_rules import NEMO_RL, OPENRLHF, VERL_LOW_VAR_KL, VERL_PPO_KL
from .validation import (
    Tensor,
    as_float_tensor,
    as_mask,
    check_choice,
    check_finite_values,
    check_positive_int,
    check_positive_number,
    check_same_shape,
    common_dtype,
)

__all__ = [
    "verl_kl_loss",
    "verl_kl_in_reward",
    "verl_ppo_kl",
    "verl_kl_penalty",
    "openrlhf_compute_approx_kl",
    "openrlhf_kl",
    "trl_grpo_kl",
    "trl_ppo_kl",
    "nemo_rl_calculate_kl",
    "nemo_rl_kl_loss",
    "minimind_approx_kl",
    "minimind_kl_ref_penalty",
    "minimind_grpo_kl",
    "minimind_rollout",
    "MINIMIND_ROLLOUT_TEMPERATURE",
    "verl_offpolicy_metrics",
    "VERL_PPO_KL_MODES",
    "side_by_side",
    "FRAMEWORK_FUNCTIONS",
    "TRL_RELEASE",
    "TRL_COMMIT",
]

#: The TRL sources read: the release pip installs (GRPO) and main (the PPO trainer, which the
#: release no longer ships).
TRL_RELEASE = "huggingface/trl release 1.16.0 (PyPI)"
TRL_COMMIT = "huggingface/trl @ f2cd577 (2026-07-24)"


# ---------------------------------------------------------------------------------------------
# shared input handling
# ---------------------------------------------------------------------------------------------
def _pair(
    a: Tensor, b: Tensor, name_a: str, name_b: str, *, finite: bool = True, keep_dtype: bool = False
) -> tuple[Tensor, Tensor]:
    """Two checked log-prob tensors of one shape and dtype. ``finite=False`` leaves the NaN/inf check
    to :func:`_mask`, which makes it on counted tokens only (padding may hold anything).
    ``keep_dtype=True`` keeps float16/bfloat16 tensors in their own dtype (promoted as torch promotes
    the two) instead of upcasting them: for a framework option that computed in that dtype."""
    x = as_float_tensor(a, name_a, check_finite=finite)
    y = as_float_tensor(b, name_b, check_finite=finite)
    check_same_shape(x, y, name_a, name_b)
    if keep_dtype and isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        dt = torch.promote_types(a.dtype, b.dtype)
        return a.to(device=x.device, dtype=dt), b.to(device=x.device, dtype=dt)
    dt = common_dtype(x, y)
    return x.to(dt), y.to(dt)


def _mask(mask: Tensor, like: Tensor, name: str = "mask", **counted: Tensor) -> Tensor:
    """The 0/1 ``mask`` as a tensor like ``like``; each tensor in ``counted`` (by its argument's
    name) must be finite where the mask counts a token: NaN or inf in padding is ignored."""
    m = as_mask(mask, like, name)
    check_same_shape(like, m, "the log-probabilities", name)
    if like.dim() != 2:
        raise ValueError(
            f"the log-probabilities must be a [batch, response_length] matrix, got shape {tuple(like.shape)}"
        )
    if bool(((m != 0) & (m != 1)).any()):
        raise ValueError(f"{name} must hold only 0 and 1 (valid response token or not)")
    for arg, t in counted.items():
        check_finite_values(t, arg, where=m != 0)
    return m.to(like.device)


def _masked(values: Tensor, mask: Tensor) -> Tensor:
    """``values`` on counted tokens, 0 on padding (``where``, so an inf in padding stays out)."""
    return torch.where(mask != 0, values, torch.zeros((), dtype=values.dtype, device=values.device))


def _mean(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Masked mean without klviz's finiteness check (a framework's overflow passes through); 0 if empty.

    The frameworks divide by ``count + 1e-8`` (verl, NeMo-RL), ``clamp(count, min=1)`` (TRL,
    MiniMind) or ``count`` (OpenRLHF): for a non-empty mask these differ by rounding only.
    """
    m = mask.to(values.dtype)
    v = _masked(values, m)
    total = v.sum() if dim is None else v.sum(dim)
    count = m.sum() if dim is None else m.sum(dim)
    return torch.where(count > 0, total / count.clamp_min(1e-30), torch.zeros_like(total))


def _clamped_mean(values: Tensor, mask: Tensor) -> Tensor:
    """sum(values * mask) / clamp(sum(mask), min=1): MiniMind's and TRL's denominator."""
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


# ---------------------------------------------------------------------------------------------
# verl
# ---------------------------------------------------------------------------------------------
_VERL_KINDS = KL_PENALTY_KINDS + tuple(k + "+" for k in KL_PENALTY_KINDS)


def verl_kl_penalty(logprob: Tensor, ref_logprob: Tensor, kind: str = "low_var_kl") -> Tensor:
    """verl's ``kl_penalty`` as verl computes it, float rounding included.

    Follows verl-project/verl @ 1dda039, ``verl/trainer/ppo/core_algos.py`` ``kl_penalty`` /
    ``kl_penalty_forward``: ``kl``/``k1`` = ``logprob - ref``; ``abs``; ``mse``/``k2`` = ``½ Δ²``;
    ``low_var_kl``/``k3``: ``d = clamp(ref - logprob, ±20)``, ``exp(d) - d - 1``, clamped to ±10; a
    ``+`` suffix gives the forward value of the kind with the gradient of ``½ Δ²`` (straight-through,
    working since PR #6058). Same values as :func:`klviz.kl_penalty` except for rounding: verl's k3 is
    ``exp(d) - d - 1``, not the kernel's ``expm1`` form.
    """
    kind = check_choice(kind, "kind", _VERL_KINDS)
    lp, ref = _pair(logprob, ref_logprob, "logprob", "ref_logprob")
    return _verl_penalty(lp, ref, kind)


def _verl_penalty(lp: Tensor, ref: Tensor, kind: str) -> Tensor:
    base = kind[:-1] if kind.endswith("+") else kind
    if base in ("kl", "k1"):
        forward = kernel.k1(ref - lp)
    elif base == "abs":
        forward = (lp - ref).abs()
    elif base in ("mse", "k2"):
        forward = kernel.k2(ref - lp)
    else:
        d = VERL_LOW_VAR_KL.clamp_input(ref - lp, "k3")
        forward = VERL_LOW_VAR_KL.clamp_output(torch.exp(d) - d - 1, "k3")  # verl's own k3 (exp, not expm1)
    if not kind.endswith("+"):
        return forward
    backward = kernel.k2(ref - lp)
    return backward - backward.detach() + forward.detach()


def verl_kl_loss(
    logprob: Tensor,
    ref_logprob: Tensor,
    response_mask: Tensor,
    kl_loss_type: str = "low_var_kl",
    loss_agg_mode: str = "token-mean",
    kl_loss_coef: float = 0.001,
    *,
    loss_scale_factor: float | None = None,
    legacy_norm: bool = False,
) -> dict[str, Any]:
    """verl's KL **in the loss** (``actor.use_kl_loss``): ``kl_penalty`` then ``agg_loss``.

    Follows verl-project/verl @ 1dda039, ``verl/workers/utils/losses.py`` (``ppo_loss``: ``kld =
    kl_penalty(log_prob, ref_log_prob, kl_loss_type)``, ``kl_loss = agg_loss(kld, response_mask,
    loss_agg_mode)``, ``policy_loss += kl_loss * kl_loss_coef``; metric ``kl_loss``, logged as
    ``actor/kl_loss``) with ``kl_penalty`` and ``agg_loss`` from ``verl/trainer/ppo/core_algos.py``
    (the actor's loss lived in ``verl/workers/actor/dp_actor.py`` until PR #6067, 2026-04). Defaults
    are those of ``verl/trainer/config/actor/actor.yaml`` (``low_var_kl``, ``token-mean``, 0.001).

    ``logprob``: current policy on the rollout tokens; ``ref_logprob``: reference on the same
    tokens. Estimates KL(pi_theta || pi_ref) (exactly so on the first minibatch, where
    pi_theta = pi_old sampled the tokens). ``loss_scale_factor`` and ``legacy_norm`` are passed to
    :func:`klviz.agg_loss` (``seq-mean-token-sum-norm``; ``legacy_norm=True`` is verl before
    PR #5366, 2026-02). Returns ``per_token``, ``kl_loss`` (logged) and ``loss_term``
    (``kl_loss_coef * kl_loss``, added to the policy loss).
    """
    kind = check_choice(kl_loss_type, "kl_loss_type", _VERL_KINDS)
    lp, ref = _pair(logprob, ref_logprob, "logprob", "ref_logprob", finite=False)
    m = _mask(response_mask, lp, "response_mask", **{"logprob": lp, "ref_logprob": ref})
    per_token = _verl_penalty(lp, ref, kind)
    kl_loss = agg_loss(per_token, m, loss_agg_mode, loss_scale_factor, legacy_norm=legacy_norm)
    return {
        "per_token": _masked(per_token, m),
        "kl_loss": kl_loss,
        "loss_term": kl_loss_coef * kl_loss,
        "logged": kl_loss,
        "logged_name": "actor/kl_loss",
    }


def verl_kl_in_reward(
    old_logprob: Tensor, ref_logprob: Tensor, response_mask: Tensor, kl_penalty_kind: str = "kl", kl_coef: float = 0.001
) -> dict[str, Any]:
    """verl's KL **in the reward** (``algorithm.use_kl_in_reward``), ``apply_kl_penalty``.

    Follows verl-project/verl @ 1dda039, ``verl/trainer/ppo/ray_trainer.py`` (``apply_kl_penalty``)
    with ``kl_penalty`` from ``verl/trainer/ppo/core_algos.py``: ``kld = kl_penalty(old_log_probs,
    ref_log_prob) * response_mask``; ``token_level_rewards = token_level_scores - beta * kld``;
    logged ``actor/reward_kl_penalty`` = batch mean of each sequence's *token mean* of ``kld``.
    Defaults from ``verl/trainer/config/algorithm.py`` (``kl_penalty="kl"``, ``kl_coef=0.001``).

    Returns ``per_token`` (masked ``kld``), ``reward_delta`` (``-kl_coef * kld``, added to every
    token's reward) and ``logged`` (the mean of per-sequence token means).
    """
    kind = check_choice(kl_penalty_kind, "kl_penalty_kind", _VERL_KINDS)
    old, ref = _pair(old_logprob, ref_logprob, "old_logprob", "ref_logprob", finite=False)
    m = _mask(response_mask, old, "response_mask", **{"old_logprob": old, "ref_logprob": ref})
    kld = _masked(_verl_penalty(old, ref, kind), m)
    per_seq = masked_mean(kld, m, dim=-1)
    logged = per_seq.mean()
    return {
        "per_token": kld,
        "reward_delta": -kl_coef * kld,
        "per_sequence": per_seq,
        "logged": logged,
        "logged_name": "actor/reward_kl_penalty",
    }


#: verl's policy losses (``policy_loss.loss_mode``) by how each computes the ``actor/ppo_kl`` it logs, read at
#: verl-project/verl @ 1dda039, ``verl/trainer/ppo/core_algos.py``: ``"clamped"`` the masked mean of
#: ``-clamp(log_prob - old_log_prob, ±20)``; ``"unclamped"`` the same without the clamp; ``"abs"`` the masked mean
#: of ``|log_prob - old_log_prob|`` (``compute_policy_loss_kl_cov``).
VERL_PPO_KL_MODES: dict[str, str] = {
    "vanilla": "clamped",
    "dppo_tv": "clamped",
    "dppo_kl": "clamped",
    "sapo": "clamped",
    "cispo": "clamped",
    "gspo": "unclamped",
    "clip_cov": "unclamped",
    "geo_mean": "unclamped",
    "dro": "unclamped",
    "kl_cov": "abs",
}


def verl_ppo_kl(
    log_prob: Tensor,
    old_log_prob: Tensor,
    response_mask: Tensor,
    *,
    clamp_log_ratio: bool = True,
    loss_mode: str = "vanilla",
) -> dict[str, Any]:
    """verl's ``ppo_kl``: the masked mean of ``old_log_prob - log_prob``, i.e. **k1 of KL(pi_old || pi_theta)**.

    Follows verl-project/verl @ 1dda039, ``verl/trainer/ppo/core_algos.py``
    (``compute_policy_loss_vanilla``, the default ``policy_loss.loss_mode``): ``negative_approx_kl =
    clamp(log_prob - old_log_prob, -20, 20)`` (:data:`klviz.framework_rules.VERL_PPO_KL`, since
    PR #1779, 2025-06), ``ppo_kl = masked_mean(-negative_approx_kl, response_mask)``, logged as
    ``actor/ppo_kl``. Monitoring only: it enters no loss. Being k1 it can come out negative for a
    single minibatch.

    ``loss_mode`` (a key of :data:`VERL_PPO_KL_MODES`) gives what the other policy losses log under the
    same name: dppo_tv, dppo_kl, sapo and cispo clamp as vanilla does; gspo, clip_cov, geo_mean and dro
    do not clamp; **kl_cov logs the mean of |log_prob - old_log_prob|** (``ppo_kl_abs``), which is no
    KL estimate (it is never negative and is of the order of the mean |Δ|, not of ½Δ²).
    ``clamp_log_ratio=False`` gives vanilla's unclamped mean (verl before PR #1779).
    """
    mode = VERL_PPO_KL_MODES[check_choice(loss_mode, "loss_mode", tuple(VERL_PPO_KL_MODES))]
    lp, old = _pair(log_prob, old_log_prob, "log_prob", "old_log_prob", finite=False)
    m = _mask(response_mask, lp, "response_mask", **{"log_prob": lp, "old_log_prob": old})
    neg_approx_kl = lp - old
    if mode == "abs":
        per_token = neg_approx_kl.abs()
    else:
        if mode == "clamped" and clamp_log_ratio:
            neg_approx_kl = VERL_PPO_KL.clamp_input(neg_approx_kl, "k1")
        per_token = -neg_approx_kl
    ppo_kl = _mean(per_token, m)
    return {"per_token": _masked(per_token, m), "ppo_kl": ppo_kl, "logged": ppo_kl, "logged_name": "actor/ppo_kl"}


def verl_offpolicy_metrics(old_log_prob: Tensor, rollout_log_prob: Tensor, response_mask: Tensor) -> dict[str, float]:
    """verl's rollout-correction diagnostics (``rollout_corr/*``), as verl computes them.

    Follows verl-project/verl @ 1dda039, ``verl/trainer/ppo/rollout_corr_helper.py``
    (``compute_offpolicy_metrics``) with ``masked_mean`` and ``masked_sum`` from
    ``verl/utils/torch_functional.py`` (a per-row masked mean divides by ``count + 1e-8``, so an empty
    row counts as a row with mean 0). Tokens were sampled by the rollout engine; ``old_log_prob`` is
    the trainer's recompute. Returns floats:

    - ``kl`` = token mean of ``rollout - old`` and ``k3_kl`` = token mean of ``exp(d) - d - 1`` with
      ``d = old - rollout``: k1 and k3 of KL(π_rollout ‖ π_old);
    - ``training_ppl``, ``rollout_ppl``: the batch mean of each row's ``exp(-mean log-prob)``, and
      ``training_log_ppl``, ``rollout_log_ppl`` the batch means of ``-mean log-prob``;
    - ``log_ppl_diff`` (and ``_abs_diff``, ``_max``, ``_min``): per row, ``mean(rollout) - mean(old)``;
    - ``ppl_ratio`` = the batch **mean of exp(log_ppl_diff)** (the mean of the per-row ratios, not the
      exp of their mean log);
    - ``chi2_token`` = token mean of ``exp(clamp(d, ±20))²`` − 1 and ``chi2_seq`` = batch mean of
      ``exp(2 clamp(Σ_t d, ±20))`` − 1.

    verl asserts at least one valid token; so does this function (``ValueError``).
    """
    old, roll = _pair(old_log_prob, rollout_log_prob, "old_log_prob", "rollout_log_prob", finite=False)
    m = _mask(response_mask, old, "response_mask", **{"old_log_prob": old, "rollout_log_prob": roll})
    if not bool(m.any()):
        raise ValueError("response_mask must count at least one token (verl asserts it)")

    def row_mean(x: Tensor) -> Tensor:  # verl_F.masked_mean(x, mask, axis=-1)
        return _masked(x, m).sum(-1) / (m.sum(-1) + 1e-8)

    def token_mean(x: Tensor) -> Tensor:  # verl_F.masked_mean(x, mask)
        return _masked(x, m).sum() / (m.sum() + 1e-8)

    bound = 20.0  # rollout_corr_helper.SAFETY_BOUND
    mean_old, mean_roll = row_mean(old), row_mean(roll)
    d = old - roll
    log_ppl_diff = mean_roll - mean_old
    log_ratio_sum = _masked(d, m).sum(-1)
    out = {
        "training_ppl": torch.exp(-mean_old).mean(),
        "training_log_ppl": (-mean_old).mean(),
        "kl": token_mean(roll - old),
        "k3_kl": token_mean(torch.exp(d) - d - 1),  # verl's own k3 (exp, not expm1)
        "rollout_ppl": torch.exp(-mean_roll).mean(),
        "rollout_log_ppl": (-mean_roll).mean(),
        "log_ppl_diff": log_ppl_diff.mean(),
        "log_ppl_abs_diff": log_ppl_diff.abs().mean(),
        "log_ppl_diff_max": log_ppl_diff.max(),
        "log_ppl_diff_min": log_ppl_diff.min(),
        "ppl_ratio": torch.exp(log_ppl_diff).mean(),
        "chi2_token": token_mean(torch.exp(d.clamp(-bound, bound)).square()) - 1.0,
        "chi2_seq": torch.exp(2.0 * log_ratio_sum.clamp(-bound, bound)).mean() - 1.0,
    }
    return {k: float(v) for k, v in out.items()}


# ---------------------------------------------------------------------------------------------
# OpenRLHF
# ---------------------------------------------------------------------------------------------
def openrlhf_compute_approx_kl(
    log_probs: Tensor, log_probs_base: Tensor, kl_estimator: str = "k1", clamp: bool = True, *, float32: bool = True
) -> Tensor:
    """OpenRLHF's ``compute_approx_kl``: per-token k1, k2 or k3 with ``log_ratio = log_probs - log_probs_base``.

    Follows OpenRLHF/OpenRLHF @ 3c3be62, ``openrlhf/models/utils.py``: ``log_ratio =
    log_probs.float() - log_probs_base.float()`` (**float32**, whatever the inputs' dtype, since
    PR #620, 2024-12; ``float32=False`` computes in the inputs' own dtype, bfloat16 included, as
    OpenRLHF did before); k1 = ``log_ratio``; k2 =
    ``log_ratio² / 2``; k3 = ``exp(-log_ratio) - 1 + log_ratio`` (no input clamp, so ``exp``
    overflows beyond a log-ratio of about -88, and the output clamp turns that ``inf`` into 10); then
    **every** estimator is clamped to [-10, 10] (``clamp=True``, since 2025-07; ``clamp=False`` gives
    the earlier unclamped values). For k1 both bounds can act, since k1 can be negative.
    """
    kind = check_choice(kl_estimator, "kl_estimator", kernel.ESTIMATORS)
    lp, base = _pair(log_probs, log_probs_base, "log_probs", "log_probs_base", keep_dtype=not float32)
    return _openrlhf_approx_kl(lp, base, kind, clamp, float32)


def _openrlhf_approx_kl(lp: Tensor, base: Tensor, kind: str, clamp: bool, float32: bool) -> Tensor:
    if float32:
        lp, base = lp.float(), base.float()
    log_ratio = lp - base  # = -log r, r = pi_base / pi
    if kind == "k3":
        out = torch.exp(-log_ratio) - 1.0 + log_ratio  # OpenRLHF's own k3 (no expm1, no input clamp)
    else:
        out = kernel.estimate(kind, -log_ratio)
    return OPENRLHF.clamp_output(out, kind) if clamp else out


def openrlhf_kl(
    action_log_probs: Tensor,
    base_action_log_probs: Tensor,
    action_mask: Tensor,
    kl_estimator: str = "k1",
    init_kl_coef: float = 0.01,
    use_kl_loss: bool = False,
    clamp: bool = True,
    *,
    float32: bool = True,
) -> dict[str, Any]:
    """OpenRLHF's KL in the reward (default, PPO) or in the loss (``--algo.kl.use_loss``, GRPO-style).

    Follows OpenRLHF/OpenRLHF @ 3c3be62: ``openrlhf/models/utils.py`` (``compute_approx_kl``;
    ``compute_reward``: ``reward = -kl_coef * kl`` per token, plus the score on the last token),
    ``openrlhf/trainer/ppo_utils/experience_maker.py`` (logs ``kl`` = each sequence's masked mean,
    averaged over the batch) and ``openrlhf/trainer/ray/ppo_actor.py`` (``kl_loss =
    aggregate_loss(kl, action_mask)``, the token mean, times ``kl_ctl``; logged ``kl``). Flags and
    defaults from ``openrlhf/cli/train_ppo_ray.py``: ``--algo.kl.estimator`` (``k1``),
    ``--algo.kl.init_coef`` (0.01), ``--algo.kl.use_loss`` (off). Values are float32 (see
    :func:`openrlhf_compute_approx_kl` for ``clamp`` and ``float32``). OpenRLHF hands the unmasked
    ``kl`` to ``compute_reward``; here padding positions are 0.

    The two logged ``kl`` differ in aggregation: in the reward it is the batch mean of per-sequence
    means (``experience_maker.py``: ``masked_mean(kl, action_mask, dim=-1)``); with ``use_kl_loss`` it is
    the **token mean** (``aggregate_loss`` with ``token_level_loss=True``). With ``init_kl_coef <= 0``
    OpenRLHF builds no reference model and fills ``kl`` with zeros, in the reward and in the loss, so it
    logs ``kl`` = 0 whatever the policies: this function does the same.
    """
    lp, base = _pair(
        action_log_probs,
        base_action_log_probs,
        "action_log_probs",
        "base_action_log_probs",
        finite=False,
        keep_dtype=not float32,
    )
    m = _mask(action_mask, lp, "action_mask", **{"action_log_probs": lp, "base_action_log_probs": base})
    kind = check_choice(kl_estimator, "kl_estimator", kernel.ESTIMATORS)
    if float(init_kl_coef) <= 0:  # no reference model: kl = torch.zeros_like(action_log_probs)
        kl = torch.zeros_like(lp)
    else:
        kl = _openrlhf_approx_kl(lp, base, kind, clamp, float32)
    m = m.to(kl.dtype)
    kl = _masked(kl, m)
    per_seq = _mean(kl, m, dim=-1)
    out: dict[str, Any] = {"per_token": kl, "per_sequence": per_seq, "logged": per_seq.mean(), "logged_name": "kl"}
    coef = max(float(init_kl_coef), 0.0)  # compute_reward: kl_coef <= 0 counts as 0
    if use_kl_loss:
        kl_loss = _mean(kl, m)
        out.update(kl_loss=kl_loss, loss_term=coef * kl_loss, logged=kl_loss)
    else:
        out.update(reward_delta=-coef * kl)
    return out


# ---------------------------------------------------------------------------------------------
# TRL
# ---------------------------------------------------------------------------------------------
_TRL_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "vespo", "luspo")


def trl_grpo_kl(
    per_token_logps: Tensor,
    ref_per_token_logps: Tensor,
    completion_mask: Tensor,
    old_per_token_logps: Tensor | None = None,
    use_bias_correction_kl: bool = True,
    beta: float = 0.0,
    loss_type: str = "dapo",
    max_completion_length: int | None = 512,
    *,
    importance_sampling_level: str = "token",
    version: str = "1.16.0",
) -> dict[str, Any]:
    """TRL's GRPO KL: k3 of (current vs reference) **in the loss**, times the importance ratio by default.

    Follows huggingface/trl release 1.16.0 (PyPI), ``trl/trainer/grpo_trainer.py``
    (``_compute_loss``) and ``trl/trainer/grpo_config.py`` (defaults); ``tests/test_frameworks.py`` runs
    TRL's own ``_compute_loss`` beside it. ``per_token_kl = exp(ref - logp) - (ref - logp) - 1`` (no clamp); with
    ``use_bias_correction_kl`` (default **True**) it is multiplied by ``coef_1 = exp(logp - old)``,
    not detached, so its gradient is that of KL(pi_theta || pi_ref) even off-policy. Without
    ``old_per_token_logps`` TRL takes ``old = logp.detach()`` (on-policy, one update per
    generation): the ratio is then 1 in value and still carries the score-function gradient.
    ``importance_sampling_level="sequence"`` uses one ratio per sequence, ``exp`` of the mean
    log-ratio, broadcast over its tokens. ``per_token_loss += beta * per_token_kl``; logged ``kl`` =
    token mean over the micro-batch, ``sum(kl * mask) / clamp(sum(mask), min=1)``.

    ``beta`` defaults to **0.0** as in TRL: TRL then loads no reference model, computes no KL and
    logs no ``kl``; this function still returns the values it would log, and ``loss_term`` is exactly 0
    (not ``0 · kl``, which is NaN where k3 overflows to ``inf``). Pass a non-zero ``beta`` for a KL in
    the loss. k3 on the policy's own tokens is k3 with r = π_ref/π: one sampled token's term, averaged,
    estimates KL(π_θ‖π_ref) at its prefix; with the ratio it corrects the choice of that token for the
    policy that sampled it, not the distribution of its prefix (lesson 05 §6: a per-token ratio is not a
    sequence correction). ``loss_type`` (default ``dapo``) says how the KL term is
    aggregated into the loss: ``grpo``/``sapo`` (per-sequence mean, then batch mean), ``bnpo``
    (token mean), ``dapo``/``cispo``/``vespo`` (token sum over the tokens of the whole generation
    batch: the token mean on one process and one step), ``dr_grpo`` (sum / (batch *
    max_completion_length); ``max_completion_length=None`` uses the padded width), ``luspo``
    (per-sequence sums, batch mean). ``use_bias_correction_kl=False`` is TRL's behaviour before the
    default changed.

    ``version="main"`` follows huggingface/trl @ f2cd577 (2026-07-24), whose KL code (``per_token_kl``, the
    ratio, the logged ``kl``) is the release's but whose ``luspo`` aggregation is
    ``(per_token_loss * mask.sum(1, keepdim=True)).mean()``: the mean over all ``batch × length`` entries of
    the KL times its row's length, **padding entries included, unmasked** (whatever k3 the padded
    log-probs give counts). Its config default is ``use_bias_correction_kl=False``; pass it explicitly.
    """
    lp, ref = _pair(per_token_logps, ref_per_token_logps, "per_token_logps", "ref_per_token_logps", finite=False)
    m = _mask(completion_mask, lp, "completion_mask", **{"per_token_logps": lp, "ref_per_token_logps": ref})
    if max_completion_length is not None:
        max_completion_length = check_positive_int(max_completion_length, "max_completion_length")
    loss_type = check_choice(loss_type, "loss_type", _TRL_LOSS_TYPES)
    level = check_choice(importance_sampling_level, "importance_sampling_level", ("token", "sequence"))
    version = check_choice(version, "version", ("1.16.0", "main"))
    d = ref - lp
    per_token_kl = torch.exp(d) - d - 1.0  # TRL's own k3 (exp, not expm1; no clamp)
    weights = None
    if use_bias_correction_kl:
        if old_per_token_logps is None:
            old = lp.detach()
        else:
            old, _ = _pair(old_per_token_logps, lp, "old_per_token_logps", "per_token_logps", finite=False)
            check_finite_values(old, "old_per_token_logps", where=m != 0)
        log_ratio = lp - old
        if level == "sequence":
            log_ratio = (_masked(log_ratio, m).sum(-1) / m.sum(-1).clamp(min=1.0)).unsqueeze(-1)
        weights = torch.exp(log_ratio)
        per_token_kl = per_token_kl * weights
    unmasked = per_token_kl
    per_token_kl = _masked(per_token_kl, m)
    logged = _clamped_mean(per_token_kl, m)
    if loss_type in ("grpo", "sapo"):
        kl_in_loss = (per_token_kl.sum(-1) / m.sum(-1).clamp(min=1.0)).mean()
    elif loss_type in ("bnpo", "dapo", "cispo", "vespo"):
        kl_in_loss = logged
    elif loss_type == "luspo" and version == "main":
        kl_in_loss = (unmasked * m.sum(-1, keepdim=True)).mean()  # padding entries count, unmasked
    elif loss_type == "luspo":
        kl_in_loss = per_token_kl.sum(-1).mean()
    else:
        width = lp.shape[-1] if max_completion_length is None else max_completion_length
        kl_in_loss = per_token_kl.sum() / (lp.shape[0] * width)
    # TRL adds beta * per_token_kl only when beta != 0: at beta = 0 there is no term, not 0 * kl
    loss_term = beta * kl_in_loss if float(beta) != 0.0 else torch.zeros_like(kl_in_loss)
    out: dict[str, Any] = {
        "per_token": per_token_kl,
        "logged": logged,
        "logged_name": "kl",
        "kl_in_loss": kl_in_loss,
        "loss_term": loss_term,
    }
    if weights is not None:
        out["weights"] = weights
    return out


def trl_ppo_kl(
    logprobs: Tensor,
    ref_logprobs: Tensor,
    mask: Tensor,
    kl_estimator: str = "k1",
    kl_coef: float = 0.05,
    new_logprobs: Tensor | None = None,
) -> dict[str, Any]:
    """TRL's PPO: k1 or k3 of (policy vs reference) **in the reward**, and ``approxkl`` logging.

    Follows huggingface/trl @ f2cd577, ``trl/experimental/ppo/ppo_trainer.py`` (moved from
    ``trl/trainer/ppo_trainer.py``; release 1.16.0 no longer ships it) and ``ppo_config.py``
    (``kl_estimator="k1"``, ``kl_coef=0.05``): ``logr = ref_logprobs - logprobs``; ``kl = -logr``
    (k1) or ``(exp(logr) - 1) - logr`` (k3); ``non_score_reward = -kl_coef * kl`` per token (the
    score is added at the last token); logged ``objective/kl`` = ``kl.sum(1).mean()`` (mean over
    sequences of per-sequence **sums**: a sequence-level KL). Padded positions hold equal filler
    values (``INVALID_LOGPROB``) in both tensors, so they contribute 0.

    With ``new_logprobs`` (the policy during a PPO epoch) it also returns ``approxkl`` =
    ``0.5 * (logprobs_diff ** 2).mean()``, an **unmasked** mean over all ``batch × length``
    entries, padding included (where the difference is 0): padding dilutes it (logged averaged as
    ``policy/approxkl_avg``).
    """
    lp, ref = _pair(logprobs, ref_logprobs, "logprobs", "ref_logprobs", finite=False)
    m = _mask(mask, lp, "mask", **{"logprobs": lp, "ref_logprobs": ref})
    kind = check_choice(kl_estimator, "kl_estimator", ("k1", "k3"))
    logr = _masked(ref - lp, m)  # filler positions: equal values -> 0
    kl = kernel.k1(logr) if kind == "k1" else (torch.exp(logr) - 1) - logr  # TRL's own k3, as written there
    out: dict[str, Any] = {
        "per_token": kl,
        "reward_delta": -kl_coef * kl,
        "per_sequence": kl.sum(1),
        "logged": kl.sum(1).mean(),
        "logged_name": "objective/kl",
    }
    if new_logprobs is not None:
        new, _ = _pair(new_logprobs, lp, "new_logprobs", "logprobs", finite=False)
        check_finite_values(new, "new_logprobs", where=m != 0)
        diff = _masked(new - lp, m)
        out["approxkl"] = kernel.k2(diff).mean()
    return out


# ---------------------------------------------------------------------------------------------
# NeMo-RL
# ---------------------------------------------------------------------------------------------
def nemo_rl_calculate_kl(
    logprobs: Tensor,
    logprobs_reference: Tensor,
    kl_type: str = "k3",
    input_clamp_value: float | None = NEMO_RL.input_clamp,
    output_clamp_value: float | None = NEMO_RL.upper_bound,
    importance_sampling_weights: Tensor | None = None,
) -> Tensor:
    """NeMo-RL's ``calculate_kl``: ``logr = ref - logprobs`` clamped to ±20, then k1 (``-logr``),
    k2 (``logr²/2``) or k3 (``exp(logr) - 1 - logr``), optionally times importance weights, the
    result clamped to ±10.

    Follows NVIDIA-NeMo/RL @ 7ea279a, ``nemo_rl/algorithms/utils.py``. Either clamp is skipped when
    its value is ``None``. ``importance_sampling_weights`` (since PR #2958, 2026-06-27) multiply the
    estimate **before** the output clamp, and are detached on the tokens where the input clamp
    changed ``logr``, so a clamped token passes no gradient through its weight either.
    """
    kind = check_choice(kl_type, "kl_type", kernel.ESTIMATORS)
    lp, ref = _pair(logprobs, logprobs_reference, "logprobs", "logprobs_reference")
    w = None
    if importance_sampling_weights is not None:
        w = as_float_tensor(importance_sampling_weights, "importance_sampling_weights", check_finite=False)
        check_same_shape(w, lp, "importance_sampling_weights", "logprobs")
    return _nemo_calculate_kl(lp, ref, kind, input_clamp_value, output_clamp_value, w)


def _nemo_calculate_kl(
    lp: Tensor,
    ref: Tensor,
    kind: str,
    input_clamp_value: float | None,
    output_clamp_value: float | None,
    weights: Tensor | None,
) -> Tensor:
    logr = ref - lp
    if input_clamp_value is not None:
        c = float(input_clamp_value)
        clamped = logr.clamp(-c, c)
        if weights is not None:
            weights = torch.where(logr == clamped, weights, weights.detach())
        logr = clamped
    if kind == "k3":
        kl = torch.exp(logr) - 1 - logr  # NeMo-RL's own k3 (exp, not expm1)
    else:
        kl = kernel.estimate(kind, logr)
    if weights is not None:
        kl = weights * kl
    if output_clamp_value is not None:
        kl = kl.clamp(-float(output_clamp_value), float(output_clamp_value))
    return kl


def nemo_rl_kl_loss(
    curr_logprobs: Tensor,
    reference_policy_logprobs: Tensor,
    mask: Tensor,
    generation_logprobs: Tensor | None = None,
    kl_type: str = "k3",
    reference_policy_kl_penalty: float = 0.01,
    use_on_policy_kl_approximation: bool = False,
    detach_weights: bool = False,
    *,
    weight_inside_clamp: bool = True,
    kl_input_clamp_value: float | None = NEMO_RL.input_clamp,
    kl_output_clamp_value: float | None = NEMO_RL.upper_bound,
    token_level_loss: bool = True,
) -> dict[str, Any]:
    """NeMo-RL's reference KL in the loss (``ClippedPGLossFn``), importance-weighted.

    Follows NVIDIA-NeMo/RL @ 7ea279a, ``nemo_rl/algorithms/loss/loss_functions.py``
    (``ClippedPGLossConfig`` defaults: ``reference_policy_kl_penalty`` 0.01, ``k3``, clamps 20 and
    10, ``use_on_policy_kl_approximation`` **False**, ``token_level_loss`` True) with
    ``calculate_kl`` from ``nemo_rl/algorithms/utils.py``. The weights are ``exp(curr -
    curr.detach())`` by default (``use_on_policy_kl_approximation=False``): value 1, so the logged KL
    is the plain clamped k3, but the gradient of k3 times the score of the sampling probability, which
    per token is ``k1 · ∇log π``: on-policy the reverse-KL gradient of k3·ρ, and off-policy (tokens
    from π_old, a later minibatch) exactly the gradient of verl's straight-through ``k3+``, with no
    importance weight for the sampler. With ``use_on_policy_kl_approximation=True`` the weights are
    ``exp(curr - generation)``: π_θ over **π_generation**, the rollout engine's log-probs, not over
    π_old (the trainer's recompute); the two differ by the engine–trainer mismatch (lesson 08). NaN/inf
    weights replaced by 0 (``nan_to_num``: an overflowing weight gives 0, not an error); ``kl = coef
    * calculate_kl(..., importance_sampling_weights=weights)``, so the weight multiplies the estimate
    before the ±10 clamp and is detached where the ±20 input clamp acts (PR #2958, 2026-06-27);
    then the token mean over the mask (``token_level_loss=False``: the mean over sequences of
    per-sequence token means). Logged ``kl_penalty`` = that mean divided by the coefficient.

    Older behaviour: ``weight_inside_clamp=False`` computes ``weights * coef * calculate_kl(...)``,
    the weight times the already clamped estimate, without the detach (PR #2506 to #2958,
    2026-06-24..27); adding ``detach_weights=True`` gives releases before PR #2506 (weights
    detached; without the approximation a constant 1). Returns ``per_token`` (weighted k, without
    the coefficient; in the old order ``weight * k`` can overflow float32 where NeMo-RL's
    ``(weight * coef) * k`` does not, and ``loss_term`` and ``logged`` follow NeMo-RL's order),
    ``weights``, ``logged`` (``loss_term / coef``; with ``coef = 0``, where NeMo-RL computes and logs
    nothing, the mean of ``per_token``) and ``loss_term`` (the mean of ``coef`` times the weighted k).
    """
    kind = check_choice(kl_type, "kl_type", kernel.ESTIMATORS)
    lp, ref = _pair(
        curr_logprobs, reference_policy_logprobs, "curr_logprobs", "reference_policy_logprobs", finite=False
    )
    m = _mask(mask, lp, "mask", **{"curr_logprobs": lp, "reference_policy_logprobs": ref})
    if use_on_policy_kl_approximation:
        if generation_logprobs is None:
            raise ValueError("generation_logprobs is needed when use_on_policy_kl_approximation=True")
        gen, _ = _pair(generation_logprobs, lp, "generation_logprobs", "curr_logprobs", finite=False)
        check_finite_values(gen, "generation_logprobs", where=m != 0)
        w = torch.exp(lp - gen)
    else:
        w = torch.exp(lp - lp.detach())
    if detach_weights:
        w = w.detach()
    w = torch.nan_to_num(w, nan=0.0, posinf=0.0, neginf=0.0)
    coef = float(reference_policy_kl_penalty)
    if weight_inside_clamp:
        per_token = _nemo_calculate_kl(lp, ref, kind, kl_input_clamp_value, kl_output_clamp_value, w)
        loss_tok = coef * per_token
    else:
        k = _nemo_calculate_kl(lp, ref, kind, kl_input_clamp_value, kl_output_clamp_value, None)
        per_token = w * k
        loss_tok = w * coef * k  # NeMo-RL's order: (weight * coef) * kl
    per_token, loss_tok = _masked(per_token, m), _masked(loss_tok, m)
    if token_level_loss:
        loss_term = _mean(loss_tok, m)
    else:
        loss_term = _mean(_mean(loss_tok, m, dim=-1), torch.ones_like(m[:, 0]))
    if coef != 0:
        logged = loss_term / coef  # NeMo-RL logs kl / reference_policy_kl_penalty
    else:  # NeMo-RL skips the KL at 0; the value it would log
        logged = (
            _mean(per_token, m) if token_level_loss else _mean(_mean(per_token, m, dim=-1), torch.ones_like(m[:, 0]))
        )
    return {"per_token": per_token, "weights": w, "logged": logged, "logged_name": "kl_penalty", "loss_term": loss_term}


# ---------------------------------------------------------------------------------------------
# MiniMind
# ---------------------------------------------------------------------------------------------
def minimind_approx_kl(
    mb_resp_logp: Tensor, old_resp_logp: Tensor, resp_policy_mask: Tensor, early_stop_kl: float = 0.25
) -> dict[str, Any]:
    """MiniMind's ``approx_kl`` = masked mean of ``½ (log pi_theta - log pi_old)²`` on old's tokens.

    Follows jingyaogong/minimind @ d65ef2c (2026-08-21), ``trainer/train_ppo.py``: ``log_ratio = mb_resp_logp -
    old_resp_logp``; ``approx_kl = (0.5 * log_ratio**2 * mask).sum() / mask.sum().clamp(min=1)``;
    PPO stops this batch (``stop_ppo``, the loss is multiplied by 0) once ``approx_kl >
    early_stop_kl`` (default 0.25). On tokens sampled by π_old it is k2 of KL(pi_old || pi_theta): it
    agrees with the exact KL only to second order in the log-ratio. But MiniMind samples its rollouts
    at temperature :data:`MINIMIND_ROLLOUT_TEMPERATURE` (0.8) while ``old_resp_logp`` is a T = 1
    recompute (:func:`minimind_rollout`): the tokens come from π_old^(T=0.8), not from π_old, so the
    value averages ½Δ² over the tempered policy's tokens and estimates no KL between π_old and π_θ,
    not even on the first minibatch (lessons 04 §4 and 08 §2 measure the gap). Returns ``approx_kl``,
    ``stop`` (bool tensor) and the per-token values.
    """
    new, old = _pair(mb_resp_logp, old_resp_logp, "mb_resp_logp", "old_resp_logp", finite=False)
    m = _mask(resp_policy_mask, new, "resp_policy_mask", **{"mb_resp_logp": new, "old_resp_logp": old})
    early_stop_kl = check_positive_number(early_stop_kl, "early_stop_kl", allow_inf=True)
    per_token = _masked(kernel.k2(new - old), m)  # MiniMind multiplies by the mask; padding here may hold inf
    approx_kl = per_token.sum() / m.sum().clamp(min=1.0)
    return {
        "per_token": per_token,
        "approx_kl": approx_kl,
        "stop": approx_kl > early_stop_kl,
        "logged": approx_kl,
        "logged_name": "approx_kl",
    }


def minimind_kl_ref_penalty(
    mb_resp_logp: Tensor, ref_resp_logp: Tensor, resp_policy_mask: Tensor, kl_coef: float = 0.02
) -> dict[str, Any]:
    """MiniMind's ``kl_ref_penalty``: masked mean of k3 of (current vs reference), in the loss.

    Follows jingyaogong/minimind @ d65ef2c (2026-08-21), ``trainer/train_ppo.py``:
    ``(exp(ref - logp) - (ref - logp) - 1)``
    masked, summed, divided by ``mask.sum().clamp(min=1)``, no clamp; ``policy_loss = clipped
    surrogate + kl_coef * kl_ref_penalty`` (``kl_coef`` 0.02); logged as ``kl_ref``. With tokens from the
    policy it estimates KL(pi_theta || pi_ref); MiniMind's tokens come from the policy at temperature
    0.8 (see :func:`minimind_approx_kl`), so its ``kl_ref`` estimates no KL of π_θ either: k3 is unbiased
    only because E[π_ref/π_θ] = 1 under π_θ's own tokens, and under the tempered policy's tokens it is not.
    """
    lp, ref = _pair(mb_resp_logp, ref_resp_logp, "mb_resp_logp", "ref_resp_logp", finite=False)
    m = _mask(resp_policy_mask, lp, "resp_policy_mask", **{"mb_resp_logp": lp, "ref_resp_logp": ref})
    d = ref - lp
    per_token = _masked(torch.exp(d) - d - 1.0, m)  # MiniMind's own k3 (exp, not expm1; no clamp)
    pen = per_token.sum() / m.sum().clamp(min=1.0)
    return {
        "per_token": per_token,
        "kl_ref_penalty": pen,
        "loss_term": kl_coef * pen,
        "logged": pen,
        "logged_name": "kl_ref",
    }


def minimind_grpo_kl(
    per_token_logps: Tensor, ref_per_token_logps: Tensor, completion_mask: Tensor, beta: float = 0.1
) -> dict[str, Any]:
    """MiniMind's GRPO KL: k3 in the loss, and a logged ``kl_ref`` that is **minus k1**.

    Follows jingyaogong/minimind @ d65ef2c (2026-08-21), ``trainer/train_grpo.py``: ``kl_div = ref -
    logp``; ``per_token_kl = exp(kl_div) - kl_div - 1`` (no clamp) enters ``per_token_loss`` as
    ``+ beta * per_token_kl`` (``--beta`` 0.1), aggregated as the mean over sequences of per-sequence
    token means; the logged ``kl_ref`` is ``sum((ref - logp) * mask) / max(sum(mask), 1)``: the token mean
    of ``log π_ref − log π``, which is **−k1**, an estimate of −KL(π‖π_ref) (negative on average), not the k3
    that enters the loss. (``train_ppo.py`` logs its k3 as ``kl_ref``: the same name, another estimator.)
    Returns ``per_token`` (k3), ``kl_in_loss``, ``loss_term`` (``beta * kl_in_loss``) and ``logged``.
    """
    lp, ref = _pair(per_token_logps, ref_per_token_logps, "per_token_logps", "ref_per_token_logps", finite=False)
    m = _mask(completion_mask, lp, "completion_mask", **{"per_token_logps": lp, "ref_per_token_logps": ref})
    d = ref - lp
    per_token = _masked(torch.exp(d) - d - 1.0, m)  # MiniMind's own k3 (exp, not expm1; no clamp)
    kl_in_loss = (per_token.sum(-1) / m.sum(-1).clamp(min=1.0)).mean()
    logged = _masked(d, m).sum() / m.sum().clamp(min=1.0)
    return {
        "per_token": per_token,
        "kl_in_loss": kl_in_loss,
        "loss_term": beta * kl_in_loss,
        "logged": logged,
        "logged_name": "kl_ref",
    }


#: The temperature MiniMind's ``train_ppo.py`` and ``train_grpo.py`` pass to ``rollout_engine.rollout``
#: (jingyaogong/minimind @ d65ef2c); its log-probs are recomputed at T = 1 (:func:`minimind_rollout`).
MINIMIND_ROLLOUT_TEMPERATURE = 0.8


def minimind_rollout(model: Any, prompts: Any, generator: torch.Generator, max_new_tokens: int = 40) -> Any:
    """A batch as MiniMind's rollout engine makes it, for a :class:`klviz.lm.TinyLM`.

    Follows jingyaogong/minimind @ d65ef2c, ``trainer/rollout_engine.py`` (``TorchRolloutEngine.rollout``,
    the default ``--rollout_engine torch``): ``model.generate(..., do_sample=True, temperature=0.8)``, then
    ``per_token_logps = compute_per_token_logps(model, output_ids, ...)``, a teacher-forced recompute of the
    **raw** logits (``log_softmax`` at T = 1). So the tokens come from π^(T=0.8) and the log-probs that
    ``train_ppo.py`` calls ``old_resp_logp`` (and ``train_grpo.py`` ``old_per_token_logps``) are π's at T = 1.

    Returns ``(rollouts, old_logprob)``: a :class:`klviz.lm.Rollouts` whose ``logprobs`` are the sampler's
    (π^(T=0.8), what no MiniMind tensor holds) and ``[B, T]`` T = 1 log-probs of the same tokens, MiniMind's
    ``old_resp_logp``.
    """
    from . import mismatch as mm  # the engine machinery (imports the tiny LM); only this function needs it

    er = mm.sample_engine(
        model, prompts, generator, mm.EngineSpec(temperature=MINIMIND_ROLLOUT_TEMPERATURE), max_new_tokens
    )
    return er.rollouts, mm.trainer_logprobs(model, er)


FRAMEWORK_FUNCTIONS = {
    "verl_kl_loss": verl_kl_loss,
    "verl_kl_in_reward": verl_kl_in_reward,
    "verl_ppo_kl": verl_ppo_kl,
    "openrlhf_kl": openrlhf_kl,
    "trl_grpo_kl": trl_grpo_kl,
    "trl_ppo_kl": trl_ppo_kl,
    "nemo_rl_kl_loss": nemo_rl_kl_loss,
    "minimind_approx_kl": minimind_approx_kl,
    "minimind_kl_ref_penalty": minimind_kl_ref_penalty,
    "minimind_grpo_kl": minimind_grpo_kl,
}


def side_by_side(
    policy_logprob: Tensor,
    old_logprob: Tensor,
    ref_logprob: Tensor,
    mask: Tensor,
    exact_policy_ref: Tensor | None = None,
    exact_old_policy: Tensor | None = None,
    exact_old_ref: Tensor | None = None,
) -> list[dict[str, Any]]:
    """One batch through every framework: a list of table rows (framework, name, direction, value).

    ``policy_logprob``: the policy being updated (pi_theta), ``old_logprob``: the sampler
    (pi_old), ``ref_logprob``: the reference, all ``[batch, length]`` on old's tokens.
    ``exact_policy_ref`` / ``exact_old_policy`` / ``exact_old_ref``: optional ``[batch, length]``
    exact per-position KLs (from the full next-token distributions) to put beside the estimates:
    their token mean and their mean of per-sequence sums are added as rows.

    Rows that score pi_old against the reference (KL in the reward is computed at rollout time,
    when the policy *is* pi_old) estimate KL(pi_old || pi_ref); the loss terms, computed during the
    update, compare pi_theta with the reference on pi_old's tokens: unbiased for
    KL(pi_theta || pi_ref) only on-policy or with the ratio correction.
    """
    lp, old = _pair(policy_logprob, old_logprob, "policy_logprob", "old_logprob", finite=False)
    ref, _ = _pair(ref_logprob, lp, "ref_logprob", "policy_logprob", finite=False)
    m = _mask(mask, lp, "mask", policy_logprob=lp, old_logprob=old, ref_logprob=ref)
    ref_dir, ppo_dir, old_ref_dir = "KL(π_θ‖π_ref)", "KL(π_old‖π_θ)", "KL(π_old‖π_ref)"
    rows: list[dict[str, Any]] = []

    def row(framework: str, name: str, direction: str, how: str, value: Tensor) -> None:
        rows.append(
            {"framework": framework, "logged as": name, "estimates": direction, "how": how, "value": float(value)}
        )

    row("verl", "actor/kl_loss", ref_dir, "low_var_kl (k3, clamps), token-mean", verl_kl_loss(lp, ref, m)["logged"])
    row(
        "verl",
        "actor/reward_kl_penalty",
        old_ref_dir,
        "k1 of π_old vs ref, mean of per-seq token means",
        verl_kl_in_reward(old, ref, m)["logged"],
    )
    row("verl", "actor/ppo_kl", ppo_dir, "k1 (log-ratio clamped ±20), token mean", verl_ppo_kl(lp, old, m)["logged"])
    row(
        "OpenRLHF",
        "kl",
        old_ref_dir,
        "k1 of π_old vs ref clamped ±10 (float32), mean of per-seq means",
        openrlhf_kl(old, ref, m, "k1")["logged"],
    )
    row(
        "OpenRLHF",
        "kl (use_kl_loss, k3)",
        ref_dir,
        "k3 clamped ±10 (float32), token mean",
        openrlhf_kl(lp, ref, m, "k3", use_kl_loss=True)["kl_loss"],
    )
    row(
        "TRL GRPO",
        "kl",
        ref_dir,
        "k3, token mean (no ratio: use_bias_correction_kl=False or on-policy)",
        trl_grpo_kl(lp, ref, m, use_bias_correction_kl=False)["logged"],
    )
    row(
        "TRL GRPO",
        "kl (bias-corrected)",
        ref_dir,
        "k3 × π_θ/π_old, token mean (TRL's default weighting)",
        trl_grpo_kl(lp, ref, m, old_per_token_logps=old, use_bias_correction_kl=True)["logged"],
    )
    trl_ppo = trl_ppo_kl(old, ref, m, "k1", new_logprobs=lp)
    row("TRL PPO", "objective/kl", old_ref_dir, "k1 of π_old vs ref, mean of per-seq sums", trl_ppo["logged"])
    row("TRL PPO", "approxkl", ppo_dir, "½Δ², unmasked mean (padding counts)", trl_ppo["approxkl"])
    row(
        "NeMo-RL",
        "kl_penalty",
        ref_dir,
        "k3 clamped ±10, token mean (default: weight exp(curr − curr.detach()), value 1)",
        nemo_rl_kl_loss(lp, ref, m)["logged"],
    )
    row(
        "NeMo-RL",
        "kl_penalty (non-default: use_on_policy_kl_approximation=True)",
        ref_dir,
        "π_θ/π_generation × k3, then the ±10 clamp, token mean (π_old stands in for the engine here)",
        nemo_rl_kl_loss(lp, ref, m, generation_logprobs=old, use_on_policy_kl_approximation=True)["logged"],
    )
    row(
        "MiniMind",
        "approx_kl",
        ppo_dir,
        "½Δ² (k2), token mean (train_ppo.py)",
        minimind_approx_kl(lp, old, m)["logged"],
    )
    row("MiniMind", "kl_ref", ref_dir, "k3, token mean (train_ppo.py)", minimind_kl_ref_penalty(lp, ref, m)["logged"])
    row(
        "MiniMind",
        "kl_ref (train_grpo.py)",
        "−" + ref_dir,
        "mean of ref − logp: minus k1, token mean",
        minimind_grpo_kl(lp, ref, m)["logged"],
    )
    for exact, direction, name in (
        (exact_policy_ref, ref_dir, "exact_policy_ref"),
        (exact_old_policy, ppo_dir, "exact_old_policy"),
        (exact_old_ref, old_ref_dir, "exact_old_ref"),
    ):
        if exact is None:
            continue
        ex = as_float_tensor(exact, name).to(lp.dtype)
        check_same_shape(ex, lp, "exact", "policy_logprob")
        row(
            "exact",
            "per-token mean",
            direction,
            "Σ over the vocabulary at each position, token mean",
            masked_mean(ex, m),
        )
        row(
            "exact",
            "per-sequence sum",
            direction,
            "Σ over the vocabulary, summed per sequence, mean",
            (ex * m).sum(-1).mean(),
        )
    return rows
