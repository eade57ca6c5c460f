"""What each RL framework computes and logs as "KL", reproduced from its published formula.

Every function takes per-token log-probabilities laid out the way the frameworks store them,
``[batch, response_length]`` with a 0/1 ``mask`` of valid response tokens, and returns a dict of
named tensors: the per-token values, the scalar the framework puts in its loss or reward, and the
scalar it *logs* (under the name it logs it). Which distribution sampled the tokens fixes what is
estimated (see :mod:`klviz.estimators`): rollouts come from pi_old, so

* the **reference penalty** (policy vs reference, on the policy's own tokens) estimates
  KL(pi_theta || pi_ref) on the first minibatch (where pi_theta = pi_old);
* PPO's **approx_kl / ppo_kl** (old vs current, on old's tokens) estimates KL(pi_old || pi_theta).

The functions re-derive each formula (they are not copies of the frameworks' code) and reuse
:func:`klviz.kl_penalty`, :func:`klviz.agg_loss`, :func:`klviz.masked_mean`, the estimator kernel
(:mod:`klviz.kernel`) where a framework's formula is ours, and the clamp table
(:mod:`klviz.framework_rules`). A formula is written out here only where the framework's own
differs from the kernel's (most write k3 as ``exp(d) - d - 1``, which loses its digits to
rounding near d = 0 in float32: the value a framework logs is that one); each such place says so. Source files are
named in each docstring; behaviour is that of the frameworks' main branches in 2025-2026, with
older variants behind flags where they differ.
"""
from __future__ import annotations

from typing import Any

import torch

from . import kernel
from .estimators import agg_loss, kl_penalty, masked_mean
from .framework_rules import NEMO_RL, OPENRLHF
from .validation import Tensor, as_float_tensor, check_choice, check_same_shape, common_dtype

__all__ = [
    "verl_kl_loss", "verl_kl_in_reward", "verl_ppo_kl",
    "openrlhf_compute_approx_kl", "openrlhf_kl",
    "trl_grpo_kl", "trl_ppo_kl",
    "nemo_rl_calculate_kl", "nemo_rl_kl_loss",
    "minimind_approx_kl", "minimind_kl_ref_penalty",
    "side_by_side", "FRAMEWORK_FUNCTIONS",
]


# ---------------------------------------------------------------------------------------------
# shared input handling
# ---------------------------------------------------------------------------------------------
def _pair(a: Tensor, b: Tensor, name_a: str, name_b: str) -> tuple[Tensor, Tensor]:
    x = as_float_tensor(a, name_a)
    y = as_float_tensor(b, name_b)
    check_same_shape(x, y, name_a, name_b)
    dt = common_dtype(x, y)
    return x.to(dt), y.to(dt)


def _mask(mask: Tensor, like: Tensor, name: str = "mask") -> Tensor:
    m = mask if isinstance(mask, Tensor) else torch.as_tensor(mask)
    if m.dtype == torch.bool or not m.is_floating_point():
        m = m.to(like.dtype)
    else:
        m = as_float_tensor(m, name).to(like.dtype)
    check_same_shape(like, m, "the log-probabilities", name)
    if like.dim() != 2:
        raise ValueError(f"the log-probabilities must be a [batch, response_length] matrix, got shape {tuple(like.shape)}")
    if bool(((m != 0) & (m != 1)).any()):
        raise ValueError(f"{name} must hold only 0 and 1 (valid response token or not)")
    return m.to(like.device)


def _clamped_mean(values: Tensor, mask: Tensor) -> Tensor:
    """sum(values * mask) / clamp(sum(mask), min=1): MiniMind's and TRL's denominator."""
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


# ---------------------------------------------------------------------------------------------
# verl
# ---------------------------------------------------------------------------------------------
def verl_kl_loss(logprob: Tensor, ref_logprob: Tensor, response_mask: Tensor, kl_loss_type: str = "low_var_kl",
                 loss_agg_mode: str = "token-mean", kl_loss_coef: float = 0.001) -> dict[str, Tensor]:
    """verl's KL **in the loss** (``actor.use_kl_loss``): ``kl_penalty`` then ``agg_loss``.

    Source: volcengine/verl, ``verl/trainer/ppo/core_algos.py`` (``kl_penalty``, ``agg_loss``) and
    ``verl/workers/actor/dp_actor.py`` (``kl_loss = agg_loss(kld, response_mask, loss_agg_mode)``,
    ``policy_loss += kl_loss * kl_loss_coef``; logged as ``actor/kl_loss``).

    ``logprob``: current policy on the rollout tokens; ``ref_logprob``: reference on the same
    tokens. Estimates KL(pi_theta || pi_ref) (exactly so on the first minibatch, where
    pi_theta = pi_old sampled the tokens). Returns ``per_token``, ``kl_loss`` (logged) and
    ``loss_term`` (``kl_loss_coef * kl_loss``, added to the policy loss).
    """
    lp, ref = _pair(logprob, ref_logprob, "logprob", "ref_logprob")
    m = _mask(response_mask, lp, "response_mask")
    per_token = kl_penalty(lp, ref, kl_loss_type)
    kl_loss = agg_loss(per_token, m, loss_agg_mode)
    return {"per_token": per_token * m, "kl_loss": kl_loss, "loss_term": kl_loss_coef * kl_loss,
            "logged": kl_loss, "logged_name": "actor/kl_loss"}


def verl_kl_in_reward(old_logprob: Tensor, ref_logprob: Tensor, response_mask: Tensor, kl_penalty_kind: str = "kl",
                      kl_coef: float = 0.001) -> dict[str, Tensor]:
    """verl's KL **in the reward** (``algorithm.use_kl_in_reward``), ``apply_kl_penalty``.

    Source: volcengine/verl, ``verl/trainer/ppo/ray_trainer.py`` (``apply_kl_penalty``) with
    ``kl_penalty`` from ``verl/trainer/ppo/core_algos.py``: ``kld = kl_penalty(old_log_probs,
    ref_log_prob) * response_mask``; ``token_level_rewards = token_level_scores - beta * kld``;
    logged ``actor/reward_kl_penalty`` = batch mean of each sequence's *token mean* of ``kld``.

    Returns ``per_token`` (masked ``kld``), ``reward_delta`` (``-kl_coef * kld``, added to every
    token's reward) and ``logged`` (the mean of per-sequence token means).
    """
    old, ref = _pair(old_logprob, ref_logprob, "old_logprob", "ref_logprob")
    m = _mask(response_mask, old, "response_mask")
    kld = kl_penalty(old, ref, kl_penalty_kind) * m
    per_seq = masked_mean(kld, m, dim=-1)
    logged = per_seq.mean()
    return {"per_token": kld, "reward_delta": -kl_coef * kld, "per_sequence": per_seq, "logged": logged,
            "logged_name": "actor/reward_kl_penalty"}


def verl_ppo_kl(log_prob: Tensor, old_log_prob: Tensor, response_mask: Tensor) -> dict[str, Tensor]:
    """verl's ``ppo_kl``: the masked mean of ``old_log_prob - log_prob``, i.e. **k1 of KL(pi_old || pi_theta)**.

    Source: volcengine/verl, ``verl/trainer/ppo/core_algos.py`` (``compute_policy_loss``:
    ``negative_approx_kl = log_prob - old_log_prob``; ``ppo_kl = masked_mean(-negative_approx_kl,
    response_mask)``), logged as ``actor/ppo_kl``. Monitoring only: it enters no loss. Being k1 it
    can come out negative for a single minibatch.
    """
    lp, old = _pair(log_prob, old_log_prob, "log_prob", "old_log_prob")
    m = _mask(response_mask, lp, "response_mask")
    neg_approx_kl = lp - old
    ppo_kl = masked_mean(-neg_approx_kl, m)
    return {"per_token": -neg_approx_kl * m, "ppo_kl": ppo_kl, "logged": ppo_kl, "logged_name": "actor/ppo_kl"}


# ---------------------------------------------------------------------------------------------
# OpenRLHF
# ---------------------------------------------------------------------------------------------
def openrlhf_compute_approx_kl(log_probs: Tensor, log_probs_base: Tensor, kl_estimator: str = "k1",
                               clamp: bool = True) -> Tensor:
    """OpenRLHF's ``compute_approx_kl``: per-token k1, k2 or k3 with ``log_ratio = log_probs - log_probs_base``.

    Source: OpenRLHF/OpenRLHF, ``openrlhf/models/utils.py``. k1 = ``log_ratio``; k2 =
    ``log_ratio² / 2``; k3 = ``exp(-log_ratio) - 1 + log_ratio`` (no input clamp, so ``exp`` can
    overflow in float32 beyond a log-ratio of about -88); then **every** estimator is clamped to
    [-10, 10] (``clamp=True``, current releases; older releases returned it unclamped). For k1 both
    bounds can act, since k1 can be negative.
    """
    kind = check_choice(kl_estimator, "kl_estimator", kernel.ESTIMATORS)
    lp, base = _pair(log_probs, log_probs_base, "log_probs", "log_probs_base")
    log_ratio = lp - base                  # = -log r, r = pi_base / pi
    if kind == "k3":
        out = torch.exp(-log_ratio) - 1.0 + log_ratio      # OpenRLHF's own k3 (no expm1, no input clamp)
    else:
        out = kernel.estimate(kind, -log_ratio)
    return OPENRLHF.clamp_output(out, kind) if clamp else out


def openrlhf_kl(action_log_probs: Tensor, base_action_log_probs: Tensor, action_mask: Tensor,
                kl_estimator: str = "k1", init_kl_coef: float = 0.01, use_kl_loss: bool = False,
                clamp: bool = True) -> dict[str, Tensor]:
    """OpenRLHF's KL in the reward (default, PPO) or in the loss (``--use_kl_loss``, GRPO-style).

    Source: OpenRLHF/OpenRLHF, ``openrlhf/models/utils.py`` (``compute_approx_kl``,
    ``compute_reward``: ``reward = -kl_coef * kl`` per token, plus the score on the last token),
    ``openrlhf/trainer/ppo_utils/experience_maker.py`` (logs ``kl`` = each sequence's masked mean,
    averaged over the batch) and ``openrlhf/trainer/ppo_trainer.py`` / the actor loss
    (``kl_loss = masked_mean(kl, action_mask)`` over all tokens, times ``kl_coef``).
    """
    lp, base = _pair(action_log_probs, base_action_log_probs, "action_log_probs", "base_action_log_probs")
    m = _mask(action_mask, lp, "action_mask")
    kl = openrlhf_compute_approx_kl(lp, base, kl_estimator, clamp=clamp) * m
    per_seq = masked_mean(kl, m, dim=-1)
    out: dict[str, Any] = {"per_token": kl, "per_sequence": per_seq, "logged": per_seq.mean(), "logged_name": "kl"}
    if use_kl_loss:
        kl_loss = masked_mean(kl, m)
        out.update(kl_loss=kl_loss, loss_term=init_kl_coef * kl_loss)
    else:
        out.update(reward_delta=-init_kl_coef * kl)
    return out


# ---------------------------------------------------------------------------------------------
# TRL
# ---------------------------------------------------------------------------------------------
_TRL_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")


def trl_grpo_kl(per_token_logps: Tensor, ref_per_token_logps: Tensor, completion_mask: Tensor,
                old_per_token_logps: Tensor | None = None, use_bias_correction_kl: bool = False,
                beta: float = 0.04, loss_type: str = "dapo", max_completion_length: int | None = None) -> dict[str, Tensor]:
    """TRL's GRPO KL: k3 of (current vs reference) **in the loss**, optionally times the ratio.

    Source: huggingface/trl, ``trl/trainer/grpo_trainer.py`` (``_compute_loss``):
    ``per_token_kl = exp(ref - logp) - (ref - logp) - 1`` (no clamp); with
    ``use_bias_correction_kl`` it is multiplied by ``coef_1 = exp(logp - old_logp)`` (not
    detached, so the gradient is that of KL(pi_theta || pi_ref) even off-policy);
    ``per_token_loss += beta * per_token_kl``; logged ``kl`` = token mean over the batch,
    ``sum(kl * mask) / clamp(sum(mask), min=1)``. ``beta`` defaults to 0.0 in current TRL (no KL at
    all); 0.04 here so there is something to see. ``loss_type`` says how the KL term is aggregated
    into the loss: ``grpo`` (per-sequence mean, then batch mean), ``bnpo``/``dapo`` (token mean;
    ``dapo`` normalises by the tokens of the whole batch, the same on one process), ``dr_grpo``
    (sum / (batch * max_completion_length)).
    """
    lp, ref = _pair(per_token_logps, ref_per_token_logps, "per_token_logps", "ref_per_token_logps")
    m = _mask(completion_mask, lp, "completion_mask")
    loss_type = check_choice(loss_type, "loss_type", _TRL_LOSS_TYPES)
    d = ref - lp
    per_token_kl = torch.exp(d) - d - 1.0          # TRL's own k3 (exp, not expm1; no clamp)
    if use_bias_correction_kl:
        if old_per_token_logps is None:
            raise ValueError("old_per_token_logps is needed when use_bias_correction_kl=True (the ratio is logp - old)")
        old, _ = _pair(old_per_token_logps, lp, "old_per_token_logps", "per_token_logps")
        per_token_kl = per_token_kl * torch.exp(lp - old)
    per_token_kl = per_token_kl * m
    logged = _clamped_mean(per_token_kl, m)
    if loss_type == "grpo":
        kl_in_loss = ((per_token_kl * m).sum(-1) / m.sum(-1).clamp(min=1.0)).mean()
    elif loss_type in ("bnpo", "dapo"):
        kl_in_loss = logged
    else:
        width = lp.shape[-1] if max_completion_length is None else int(max_completion_length)
        kl_in_loss = (per_token_kl * m).sum() / (lp.shape[0] * width)
    return {"per_token": per_token_kl, "logged": logged, "logged_name": "kl", "kl_in_loss": kl_in_loss,
            "loss_term": beta * kl_in_loss}


def trl_ppo_kl(logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor, kl_estimator: str = "k1", kl_coef: float = 0.05,
               new_logprobs: Tensor | None = None) -> dict[str, Tensor]:
    """TRL's PPO: k1 or k3 of (policy vs reference) **in the reward**, and ``approxkl`` logging.

    Source: huggingface/trl, ``trl/trainer/ppo_trainer.py``: ``logr = ref_logprobs - logprobs``;
    ``kl = -logr`` (k1) or ``(exp(logr) - 1) - logr`` (k3); ``non_score_reward = -kl_coef * kl``
    per token (the score is added at the last token); logged ``objective/kl`` =
    ``kl.sum(1).mean()`` (mean over sequences of per-sequence **sums**: a sequence-level KL).
    Padded positions hold equal filler values in both tensors, so they contribute 0.

    With ``new_logprobs`` (the policy during a PPO epoch) it also returns ``approxkl`` =
    ``0.5 * (logprobs_diff ** 2).mean()``, an **unmasked** mean over all ``batch × length``
    entries, padding included (where the difference is 0): padding dilutes it.
    """
    lp, ref = _pair(logprobs, ref_logprobs, "logprobs", "ref_logprobs")
    m = _mask(mask, lp, "mask")
    kind = check_choice(kl_estimator, "kl_estimator", ("k1", "k3"))
    logr = (ref - lp) * m                                  # filler positions: equal values -> 0
    kl = kernel.k1(logr) if kind == "k1" else (torch.exp(logr) - 1) - logr     # TRL's own k3, as written there
    out: dict[str, Any] = {"per_token": kl, "reward_delta": -kl_coef * kl, "per_sequence": kl.sum(1),
                           "logged": kl.sum(1).mean(), "logged_name": "objective/kl"}
    if new_logprobs is not None:
        new, _ = _pair(new_logprobs, lp, "new_logprobs", "logprobs")
        diff = (new - lp) * m
        out["approxkl"] = kernel.k2(diff).mean()
    return out


# ---------------------------------------------------------------------------------------------
# NeMo-RL
# ---------------------------------------------------------------------------------------------
def nemo_rl_calculate_kl(logprobs: Tensor, logprobs_reference: Tensor, kl_type: str = "k3",
                         input_clamp_value: float | None = NEMO_RL.input_clamp,
                         output_clamp_value: float | None = NEMO_RL.upper_bound) -> Tensor:
    """NeMo-RL's ``calculate_kl``: ``logr = ref - logprobs`` clamped to ±20, then k1 (``-logr``),
    k2 (``logr²/2``) or k3 (``exp(logr) - 1 - logr``), the result clamped to ±10.

    Source: NVIDIA-NeMo/RL, ``nemo_rl/algorithms/utils.py``. Either clamp is skipped when its
    value is ``None``.
    """
    kind = check_choice(kl_type, "kl_type", kernel.ESTIMATORS)
    lp, ref = _pair(logprobs, logprobs_reference, "logprobs", "logprobs_reference")
    logr = ref - lp
    if input_clamp_value is not None:
        logr = logr.clamp(-float(input_clamp_value), float(input_clamp_value))
    if kind == "k3":
        kl = torch.exp(logr) - 1 - logr            # NeMo-RL's own k3 (exp, not expm1)
    else:
        kl = kernel.estimate(kind, logr)
    if output_clamp_value is not None:
        kl = kl.clamp(-float(output_clamp_value), float(output_clamp_value))
    return kl


def nemo_rl_kl_loss(curr_logprobs: Tensor, reference_policy_logprobs: Tensor, mask: Tensor,
                    generation_logprobs: Tensor | None = None, kl_type: str = "k3",
                    reference_policy_kl_penalty: float = 0.01, use_on_policy_kl_approximation: bool = True,
                    detach_weights: bool = False) -> dict[str, Tensor]:
    """NeMo-RL's reference KL in the loss (``ClippedPGLossFn``), importance-weighted.

    Source: NVIDIA-NeMo/RL, ``nemo_rl/algorithms/loss_functions.py`` with ``calculate_kl`` from
    ``nemo_rl/algorithms/utils.py``: weights ``exp(curr - generation)`` when
    ``use_on_policy_kl_approximation`` (otherwise a weight whose value is 1), NaN/inf weights
    replaced by 0; ``kl = weights * coef * calculate_kl(...)``; token mean over the mask. Releases
    before PR #2506 **detached** the weights (``detach_weights=True``): same value, different
    gradient. Returns ``per_token`` (weighted k, without the coefficient), ``logged`` (its token
    mean) and ``loss_term`` (``coef`` times it).
    """
    lp, ref = _pair(curr_logprobs, reference_policy_logprobs, "curr_logprobs", "reference_policy_logprobs")
    m = _mask(mask, lp, "mask")
    if use_on_policy_kl_approximation:
        if generation_logprobs is None:
            raise ValueError("generation_logprobs is needed when use_on_policy_kl_approximation=True")
        gen, _ = _pair(generation_logprobs, lp, "generation_logprobs", "curr_logprobs")
        w = torch.exp(lp - gen)
    else:
        w = torch.exp(lp - lp.detach())
    if detach_weights:
        w = w.detach()
    w = torch.nan_to_num(w, nan=0.0, posinf=0.0, neginf=0.0)
    per_token = w * nemo_rl_calculate_kl(lp, ref, kl_type) * m
    logged = masked_mean(per_token, m)
    return {"per_token": per_token, "weights": w, "logged": logged, "logged_name": "kl_penalty",
            "loss_term": reference_policy_kl_penalty * logged}


# ---------------------------------------------------------------------------------------------
# MiniMind
# ---------------------------------------------------------------------------------------------
def minimind_approx_kl(mb_resp_logp: Tensor, old_resp_logp: Tensor, resp_policy_mask: Tensor,
                       early_stop_kl: float = 0.25) -> dict[str, Tensor]:
    """MiniMind's ``approx_kl`` = masked mean of ``½ (log pi_theta - log pi_old)²`` on old's tokens.

    Source: jingyaogong/minimind, ``trainer/train_ppo.py``: ``log_ratio = mb_resp_logp -
    old_resp_logp``; ``approx_kl = (0.5 * log_ratio**2 * mask).sum() / mask.sum().clamp(min=1)``;
    PPO stops this batch (``stop_ppo``, the loss is multiplied by 0) once ``approx_kl >
    early_stop_kl`` (default 0.25). It is k2 of KL(pi_old || pi_theta): it agrees with the exact KL
    only to second order in the log-ratio. Returns ``approx_kl``, ``stop`` (bool tensor) and the
    per-token values.
    """
    new, old = _pair(mb_resp_logp, old_resp_logp, "mb_resp_logp", "old_resp_logp")
    m = _mask(resp_policy_mask, new, "resp_policy_mask")
    if not float(early_stop_kl) > 0:
        raise ValueError(f"early_stop_kl must be positive, got {early_stop_kl!r}")
    per_token = kernel.k2(new - old) * m
    approx_kl = per_token.sum() / m.sum().clamp(min=1.0)
    return {"per_token": per_token, "approx_kl": approx_kl, "stop": approx_kl > early_stop_kl,
            "logged": approx_kl, "logged_name": "approx_kl"}


def minimind_kl_ref_penalty(mb_resp_logp: Tensor, ref_resp_logp: Tensor, resp_policy_mask: Tensor,
                            kl_coef: float = 0.02) -> dict[str, Tensor]:
    """MiniMind's ``kl_ref_penalty``: masked mean of k3 of (current vs reference), in the loss.

    Source: jingyaogong/minimind, ``trainer/train_ppo.py``: ``(exp(ref - logp) - (ref - logp) - 1)``
    masked, summed, divided by ``mask.sum().clamp(min=1)``, no clamp; ``policy_loss = clipped
    surrogate + kl_coef * kl_ref_penalty`` (``kl_coef`` 0.02); logged as ``kl_ref``.
    """
    lp, ref = _pair(mb_resp_logp, ref_resp_logp, "mb_resp_logp", "ref_resp_logp")
    m = _mask(resp_policy_mask, lp, "resp_policy_mask")
    d = ref - lp
    per_token = (torch.exp(d) - d - 1.0) * m       # MiniMind's own k3 (exp, not expm1; no clamp)
    pen = per_token.sum() / m.sum().clamp(min=1.0)
    return {"per_token": per_token, "kl_ref_penalty": pen, "loss_term": kl_coef * pen, "logged": pen,
            "logged_name": "kl_ref"}


FRAMEWORK_FUNCTIONS = {
    "verl_kl_loss": verl_kl_loss, "verl_kl_in_reward": verl_kl_in_reward, "verl_ppo_kl": verl_ppo_kl,
    "openrlhf_kl": openrlhf_kl, "trl_grpo_kl": trl_grpo_kl, "trl_ppo_kl": trl_ppo_kl,
    "nemo_rl_kl_loss": nemo_rl_kl_loss, "minimind_approx_kl": minimind_approx_kl,
    "minimind_kl_ref_penalty": minimind_kl_ref_penalty,
}


def side_by_side(policy_logprob: Tensor, old_logprob: Tensor, ref_logprob: Tensor, mask: Tensor,
                 exact_policy_ref: Tensor | None = None, exact_old_policy: Tensor | None = None,
                 exact_old_ref: Tensor | None = None) -> list[dict[str, Any]]:
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
    lp, old = _pair(policy_logprob, old_logprob, "policy_logprob", "old_logprob")
    ref, _ = _pair(ref_logprob, lp, "ref_logprob", "policy_logprob")
    m = _mask(mask, lp, "mask")
    ref_dir, ppo_dir, old_ref_dir = "KL(π_θ‖π_ref)", "KL(π_old‖π_θ)", "KL(π_old‖π_ref)"
    rows: list[dict[str, Any]] = []

    def row(framework: str, name: str, direction: str, how: str, value: Tensor) -> None:
        rows.append({"framework": framework, "logged as": name, "estimates": direction, "how": how,
                     "value": float(value)})

    row("verl", "actor/kl_loss", ref_dir, "low_var_kl (k3, clamps), token-mean", verl_kl_loss(lp, ref, m)["logged"])
    row("verl", "actor/reward_kl_penalty", old_ref_dir, "k1 of π_old vs ref, mean of per-seq token means",
        verl_kl_in_reward(old, ref, m)["logged"])
    row("verl", "actor/ppo_kl", ppo_dir, "k1, token mean", verl_ppo_kl(lp, old, m)["logged"])
    row("OpenRLHF", "kl", old_ref_dir, "k1 of π_old vs ref clamped ±10, mean of per-seq means",
        openrlhf_kl(old, ref, m, "k1")["logged"])
    row("OpenRLHF", "kl (use_kl_loss, k3)", ref_dir, "k3 clamped ±10, token mean",
        openrlhf_kl(lp, ref, m, "k3", use_kl_loss=True)["kl_loss"])
    row("TRL GRPO", "kl", ref_dir, "k3, token mean", trl_grpo_kl(lp, ref, m)["logged"])
    row("TRL GRPO", "kl (bias-corrected)", ref_dir, "k3 × π_θ/π_old, token mean",
        trl_grpo_kl(lp, ref, m, old_per_token_logps=old, use_bias_correction_kl=True)["logged"])
    trl_ppo = trl_ppo_kl(old, ref, m, "k1", new_logprobs=lp)
    row("TRL PPO", "objective/kl", old_ref_dir, "k1 of π_old vs ref, mean of per-seq sums", trl_ppo["logged"])
    row("TRL PPO", "approxkl", ppo_dir, "½Δ², unmasked mean (padding counts)", trl_ppo["approxkl"])
    row("NeMo-RL", "kl_penalty", ref_dir, "k3 (clamps) × π_θ/π_old, token mean",
        nemo_rl_kl_loss(lp, ref, m, generation_logprobs=old)["logged"])
    row("MiniMind", "approx_kl", ppo_dir, "½Δ² (k2), token mean", minimind_approx_kl(lp, old, m)["logged"])
    row("MiniMind", "kl_ref", ref_dir, "k3, token mean", minimind_kl_ref_penalty(lp, ref, m)["logged"])
    for exact, direction, name in ((exact_policy_ref, ref_dir, "exact_policy_ref"),
                                   (exact_old_policy, ppo_dir, "exact_old_policy"),
                                   (exact_old_ref, old_ref_dir, "exact_old_ref")):
        if exact is None:
            continue
        ex = as_float_tensor(exact, name).to(lp.dtype)
        check_same_shape(ex, lp, "exact", "policy_logprob")
        row("exact", "per-token mean", direction, "Σ over the vocabulary at each position, token mean", masked_mean(ex, m))
        row("exact", "per-sequence sum", direction, "Σ over the vocabulary, summed per sequence, mean",
            (ex * m).sum(-1).mean())
    return rows
