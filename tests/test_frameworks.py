"""klviz.frameworks against the frameworks' current code, re-implemented inline on random batches.

Each reference below is written from the upstream source named in the functions' docstrings
(verl-project/verl @ 1dda039, NVIDIA-NeMo/RL @ 7ea279a, OpenRLHF/OpenRLHF @ 3c3be62, TRL release
1.16.0 and huggingface/trl @ f2cd577, jingyaogong/minimind @ d65ef2c), with plain tensor operations
in the order the frameworks write them: none of them calls a klviz function. Values and autograd
gradients are compared, for the default behaviour and for every legacy option.
"""

from __future__ import annotations

import functools
import inspect
import math

import pytest
import torch

from klviz import frameworks as fw

B, R = 6, 11
SEEDS = [0, 1, 2, 3]


def _batch(seed: int, spread: float = 1.0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, R, generator=g, dtype=torch.float64) * 5 - 0.01
    new = old + spread * torch.randn(B, R, generator=g, dtype=torch.float64)
    ref = old + spread * torch.randn(B, R, generator=g, dtype=torch.float64)
    lengths = torch.randint(1, R + 1, (B,), generator=g)
    lengths[0] = R
    mask = (torch.arange(R)[None, :] < lengths[:, None]).to(torch.float64)
    return new.to(dtype), old.to(dtype), ref.to(dtype), mask.to(dtype)


def _loop_token_mean(values, mask):
    num = sum(float(values[b, t]) for b in range(B) for t in range(R) if mask[b, t])
    den = sum(1 for b in range(B) for t in range(R) if mask[b, t])
    return num / max(den, 1)


def _loop_seq_means(values, mask):
    out = []
    for b in range(B):
        ts = [t for t in range(R) if mask[b, t]]
        out.append(sum(float(values[b, t]) for t in ts) / len(ts))
    return out


def _value_and_grads(fn, tensors, n_grad):
    xs = [t.detach().clone().requires_grad_(i < n_grad) for i, t in enumerate(tensors)]
    out = fn(*xs)
    grads = torch.autograd.grad(out, xs[:n_grad], allow_unused=True)
    return out.detach(), [torch.zeros_like(x) if g is None else g for x, g in zip(xs, grads)]


def _agree(model, reference, tensors, n_grad=1, rtol=1e-9, atol=1e-12):
    """Same value and same gradient with respect to the first ``n_grad`` tensors (NaN == NaN)."""
    v1, g1 = _value_and_grads(model, tensors, n_grad)
    v2, g2 = _value_and_grads(reference, tensors, n_grad)
    assert v1.dtype == v2.dtype
    assert torch.allclose(v1, v2, rtol=rtol, atol=atol, equal_nan=True), (v1, v2)
    for a, b in zip(g1, g2):
        assert torch.allclose(a, b, rtol=rtol, atol=atol, equal_nan=True), (a - b).abs().max()
    return v1


def _weights(seed=99, dtype=torch.float64):
    return torch.rand(B, R, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)


# =============================================================================================
# verl (verl-project/verl @ 1dda039): core_algos.kl_penalty / kl_penalty_forward / agg_loss /
# compute_policy_loss_vanilla, torch_functional.masked_sum / masked_mean, ray_trainer.apply_kl_penalty
# =============================================================================================
def _verl_kl_penalty_forward(logprob, ref_logprob, kl_penalty):
    if kl_penalty in ("kl", "k1"):
        return logprob - ref_logprob
    if kl_penalty == "abs":
        return (logprob - ref_logprob).abs()
    if kl_penalty in ("mse", "k2"):
        return 0.5 * (logprob - ref_logprob).square()
    kl = ref_logprob - logprob
    kl = torch.clamp(kl, min=-20, max=20)
    ratio = torch.exp(kl)
    kld = (ratio - kl - 1).contiguous()
    return torch.clamp(kld, min=-10, max=10)


def _verl_kl_penalty(logprob, ref_logprob, kl_penalty):
    base = kl_penalty[:-1] if kl_penalty.endswith("+") else kl_penalty
    forward_score = _verl_kl_penalty_forward(logprob, ref_logprob, base)
    if not kl_penalty.endswith("+") or kl_penalty in ("mse", "k2"):
        return forward_score
    backward_score = 0.5 * (logprob - ref_logprob).square()
    return backward_score - backward_score.detach() + forward_score.detach()


def _verl_masked_sum(values, mask, axis=None):
    valid = torch.where(mask.bool(), values, 0.0)
    return (valid * mask).sum() if axis is None else (valid * mask).sum(axis)


def _verl_masked_mean(values, mask, axis=None):
    s = _verl_masked_sum(values, mask, axis)
    return s / ((mask.sum() if axis is None else mask.sum(axis)) + 1e-8)


def _verl_agg_loss(loss_mat, loss_mask, loss_agg_mode, loss_scale_factor=None):
    """agg_loss @ 1dda039 with dp_size=1 and no global counts."""
    if loss_agg_mode == "token-mean":
        return _verl_masked_sum(loss_mat, loss_mask) / loss_mask.sum()
    if loss_agg_mode == "token-sum":
        return _verl_masked_sum(loss_mat, loss_mask)
    if loss_agg_mode in ("seq-mean-token-sum", "seq-mean-token-sum-norm"):
        seq_losses = torch.sum(loss_mat * loss_mask, dim=-1)
        seq_mask = (torch.sum(loss_mask, dim=-1) > 0).to(loss_mat.dtype)
        loss = _verl_masked_sum(seq_losses, seq_mask) / seq_mask.sum()
        if loss_agg_mode == "seq-mean-token-sum-norm":
            loss = loss / (loss_mask.shape[-1] if loss_scale_factor is None else loss_scale_factor)
        return loss
    seq_mask = torch.sum(loss_mask, dim=-1)
    seq_losses = torch.sum(loss_mat * loss_mask, dim=-1) / (seq_mask + 1e-8)
    seq_mask = (seq_mask > 0).to(loss_mat.dtype)
    return _verl_masked_sum(seq_losses, seq_mask) / seq_mask.sum()


def _verl_agg_loss_before_5366(loss_mat, loss_mask, loss_scale_factor=None):
    """seq-mean-token-sum-norm before PR #5366: the sum of per-sequence sums over the scale."""
    seq_losses = torch.sum(loss_mat * loss_mask, dim=-1)
    return torch.sum(seq_losses) / (loss_mask.shape[-1] if loss_scale_factor is None else loss_scale_factor)


def _batch_with_empty_row(seed):
    new, old, ref, mask = _batch(seed, spread=3.0)
    mask = mask.clone()
    mask[2] = 0.0  # an empty response: left out of every sequence mean
    return new, old, ref, mask


VERL_KINDS = ["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"]
VERL_MODES = ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


@pytest.mark.parametrize("seed", SEEDS[:2])
@pytest.mark.parametrize("kind", VERL_KINDS + [k + "+" for k in VERL_KINDS])
def test_verl_kl_penalty_values_and_gradients(seed, kind):
    new, _old, ref, _mask = _batch(seed, spread=8.0)  # spread 8: both k3 clamps act
    w = _weights()
    _agree(
        lambda x, r: (fw.verl_kl_penalty(x, r, kind) * w).sum(),
        lambda x, r: (_verl_kl_penalty(x, r, kind) * w).sum(),
        [new, ref],
        n_grad=2,
    )


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("kind", ["low_var_kl", "k1", "mse", "k3+"])
@pytest.mark.parametrize("agg", VERL_MODES)
def test_verl_kl_loss(seed, kind, agg):
    new, _old, ref, mask = _batch_with_empty_row(seed)

    def reference(x, r):
        return _verl_agg_loss(_verl_kl_penalty(x, r, kind), mask, agg)

    # verl divides each sequence's sum by its length + 1e-8 in seq-mean-token-mean; klviz exactly
    rtol = 1e-7 if agg == "seq-mean-token-mean" else 1e-9
    got = _agree(
        lambda x, r: fw.verl_kl_loss(x, r, mask, kl_loss_type=kind, loss_agg_mode=agg)["kl_loss"],
        reference,
        [new, ref],
        n_grad=2,
        rtol=rtol,
    )
    out = fw.verl_kl_loss(new, ref, mask, kl_loss_type=kind, loss_agg_mode=agg, kl_loss_coef=0.001)
    assert float(out["loss_term"]) == pytest.approx(0.001 * float(got), rel=1e-12)
    assert out["logged_name"] == "actor/kl_loss"
    assert torch.allclose(out["per_token"], _verl_kl_penalty(new, ref, kind) * mask)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("scale", [None, 7.0])
def test_verl_seq_mean_token_sum_norm_new_and_legacy(seed, scale):
    new, _old, ref, mask = _batch_with_empty_row(seed)
    per = _verl_kl_penalty(new, ref, "low_var_kl")
    now = fw.verl_kl_loss(new, ref, mask, loss_agg_mode="seq-mean-token-sum-norm", loss_scale_factor=scale)
    old = fw.verl_kl_loss(
        new, ref, mask, loss_agg_mode="seq-mean-token-sum-norm", loss_scale_factor=scale, legacy_norm=True
    )
    assert float(now["kl_loss"]) == pytest.approx(
        float(_verl_agg_loss(per, mask, "seq-mean-token-sum-norm", scale)), rel=1e-12
    )
    assert float(old["kl_loss"]) == pytest.approx(float(_verl_agg_loss_before_5366(per, mask, scale)), rel=1e-12)
    # the old value is the new one times the number of non-empty sequences
    assert float(old["kl_loss"]) == pytest.approx(float(now["kl_loss"]) * (B - 1), rel=1e-12)
    _agree(
        lambda x: fw.verl_kl_loss(
            x, ref, mask, loss_agg_mode="seq-mean-token-sum-norm", loss_scale_factor=scale, legacy_norm=True
        )["kl_loss"],
        lambda x: _verl_agg_loss_before_5366(_verl_kl_penalty(x, ref, "low_var_kl"), mask, scale),
        [new],
    )


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("kind", ["kl", "low_var_kl", "k2"])
def test_verl_kl_in_reward(seed, kind):
    _new, old, ref, mask = _batch(seed, spread=3.0)

    def reference(o, r):
        kld = _verl_kl_penalty(o, r, kind) * mask
        return torch.mean(_verl_masked_mean(kld, mask, axis=-1), dim=0)

    _agree(
        lambda o, r: fw.verl_kl_in_reward(o, r, mask, kind, kl_coef=0.05)["logged"], reference, [old, ref], 2, rtol=1e-7
    )  # verl's per-sequence means divide by length + 1e-8
    got = fw.verl_kl_in_reward(old, ref, mask, kind, kl_coef=0.05)
    assert torch.allclose(got["reward_delta"], -0.05 * _verl_kl_penalty(old, ref, kind) * mask)
    assert got["logged_name"] == "actor/reward_kl_penalty"


def _verl_ppo_kl(log_prob, old_log_prob, response_mask, clamp=True):
    """compute_policy_loss_vanilla's ppo_kl (clamp since PR #1779; clamp=False: before it)."""
    negative_approx_kl = log_prob - old_log_prob
    if clamp:
        negative_approx_kl = torch.clamp(negative_approx_kl, min=-20.0, max=20.0)
    return _verl_masked_mean(-negative_approx_kl, response_mask)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("clamp", [True, False])
def test_verl_ppo_kl_clamped_and_legacy(seed, clamp):
    new, old, _ref, mask = _batch(seed, spread=12.0)  # spread 12: some |log-ratio| > 20
    assert bool(((new - old).abs() > 20).any())
    _agree(
        lambda x, o: fw.verl_ppo_kl(x, o, mask, clamp_log_ratio=clamp)["ppo_kl"],
        lambda x, o: _verl_ppo_kl(x, o, mask, clamp),
        [new, old],
        n_grad=2,
    )
    if not clamp:
        assert float(fw.verl_ppo_kl(new, old, mask, clamp_log_ratio=False)["ppo_kl"]) == pytest.approx(
            _loop_token_mean(old - new, mask), rel=1e-9
        )


def test_verl_ppo_kl_default_clamp_changes_the_value_only_beyond_20():
    new, old, _ref, mask = _batch(0)
    assert float(fw.verl_ppo_kl(new, old, mask)["ppo_kl"]) == float(
        fw.verl_ppo_kl(new, old, mask, clamp_log_ratio=False)["ppo_kl"]
    )
    far = new.clone()
    far[0, 0] = old[0, 0] + 60.0
    assert float(fw.verl_ppo_kl(far, old, mask)["per_token"][0, 0]) == -20.0


# =============================================================================================
# OpenRLHF (OpenRLHF/OpenRLHF @ 3c3be62): models/utils.compute_approx_kl / masked_mean,
# experience_maker (kl in the reward, logged kl), ray/ppo_actor (kl loss via aggregate_loss)
# =============================================================================================
def _openrlhf_compute_approx_kl(log_probs, log_probs_base, kl_estimator="k1", clamp=True, as_float=True):
    log_ratio = log_probs.float() - log_probs_base.float() if as_float else log_probs - log_probs_base
    if kl_estimator == "k2":
        log_ratio = log_ratio**2 / 2.0
    elif kl_estimator == "k3":
        log_ratio = (-log_ratio).exp() - 1 + log_ratio
    return log_ratio.clamp(min=-10, max=10) if clamp else log_ratio


def _openrlhf_masked_mean(tensor, mask, dim=None):
    return (tensor * mask).sum() / mask.sum() if dim is None else (tensor * mask).sum(dim=dim) / mask.sum(dim=dim)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("est", ["k1", "k2", "k3"])
@pytest.mark.parametrize("clamp", [True, False])
@pytest.mark.parametrize("as_float", [True, False])
def test_openrlhf_compute_approx_kl(seed, est, clamp, as_float):
    new, _old, ref, _mask = _batch(seed, spread=4.0)
    w = _weights()
    w = w.float() if as_float else w
    got = _agree(
        lambda x, b: (fw.openrlhf_compute_approx_kl(x, b, est, clamp=clamp, float32=as_float) * w).sum(),
        lambda x, b: (_openrlhf_compute_approx_kl(x, b, est, clamp, as_float) * w).sum(),
        [new, ref],
        2,
    )
    assert got.dtype == (torch.float32 if as_float else torch.float64)
    out = fw.openrlhf_compute_approx_kl(new, ref, est, clamp=clamp, float32=as_float)
    assert out.dtype == (torch.float32 if as_float else torch.float64)
    raw = _openrlhf_compute_approx_kl(new, ref, est, False, as_float)
    if est != "k2" and clamp:
        assert bool((raw.abs() > 10).any())  # the clamp is exercised by this batch


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("est", ["k1", "k3"])
def test_openrlhf_kl_reward_and_loss(seed, est):
    new, old, ref, mask = _batch(seed)
    r = fw.openrlhf_kl(old, ref, mask, est, init_kl_coef=0.01)
    kl = _openrlhf_compute_approx_kl(old, ref, est)
    assert r["per_token"].dtype == torch.float32
    assert torch.allclose(r["reward_delta"], -0.01 * kl * mask.float())
    assert float(r["logged"]) == pytest.approx(float(_openrlhf_masked_mean(kl, mask.float(), dim=-1).mean()), rel=1e-6)
    _agree(
        lambda x, b: fw.openrlhf_kl(x, b, mask, est, use_kl_loss=True)["kl_loss"],
        lambda x, b: _openrlhf_masked_mean(_openrlhf_compute_approx_kl(x, b, est), mask.float()),
        [new, ref],
        2,
        rtol=1e-6,
    )
    lossy = fw.openrlhf_kl(new, ref, mask, est, init_kl_coef=0.01, use_kl_loss=True)
    assert float(lossy["loss_term"]) == pytest.approx(0.01 * float(lossy["kl_loss"]), rel=1e-6)
    assert float(lossy["logged"]) == float(lossy["kl_loss"])  # the actor logs kl = kl_loss


def test_openrlhf_float32_and_legacy_dtype():
    new, _old, ref, mask = _batch(1)
    a = fw.openrlhf_kl(new, ref, mask, "k3", use_kl_loss=True)["kl_loss"]
    b = fw.openrlhf_kl(new, ref, mask, "k3", use_kl_loss=True, float32=False)["kl_loss"]
    assert a.dtype == torch.float32 and b.dtype == torch.float64
    assert float(a) == pytest.approx(float(b), rel=1e-5)


# =============================================================================================
# TRL GRPO: TRL's own code, run. The release pip installs (trl 1.16.0, in the test extra) ships
# GRPOTrainer._compute_loss; it is called here on a minimal stand-in for the trainer (the attributes
# it reads, an identity accelerator, a model stub that returns our log-probs), with zero advantages so
# that the loss is TRL's KL term alone. Its returned loss and its logged ``kl`` metric are compared with
# fw.trl_grpo_kl, values and autograd gradients.
# =============================================================================================
TRL_VERSION = "1.16.0"  # pinned in constraints.txt; the test extra installs it


@functools.cache
def _grpo_trainer():
    """TRL's GRPOTrainer class (imported on first use: ``import trl`` takes seconds)."""
    import trl
    from trl.trainer.grpo_trainer import GRPOTrainer

    assert trl.__version__ == TRL_VERSION, f"these tests run TRL release {TRL_VERSION}, found {trl.__version__}"
    return GRPOTrainer


class _OneProcess:
    """The accelerator of a single process: reductions and gathers are the identity."""

    num_processes = 1
    sync_gradients = True

    def reduce(self, x, reduction="sum"):
        return x

    def gather(self, x):
        return x

    gather_for_metrics = gather


def _trl_run(logps, ref, mask, old=None, *, beta=0.04, loss_type="dapo", corrected=True, level="token", width=None):
    """(loss, logged kl) of TRL 1.16.0's GRPOTrainer._compute_loss on these log-probs."""
    import collections
    import types

    b, t = logps.shape
    trainer = types.SimpleNamespace(
        aux_loss_enabled=False,
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        importance_sampling_level=level,
        beta=beta,
        loss_type=loss_type,
        epsilon_low=0.2,
        epsilon_high=0.2,
        use_vllm=False,
        vllm_importance_sampling_correction=False,
        model=types.SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1,
        accelerator=_OneProcess(),
        max_completion_length=t if width is None else width,
        _entropy_bonus_enabled=False,
        _metrics={"train": collections.defaultdict(list)},
        args=types.SimpleNamespace(
            use_bias_correction_kl=corrected,
            delta=None,
            steps_per_generation=1,
            sapo_temperature_pos=1.0,
            sapo_temperature_neg=1.05,
            vespo_k_pos=2.0,
            vespo_lambda_pos=3.0,
            vespo_k_neg=3.0,
            vespo_lambda_neg=2.0,
        ),
    )
    trainer._get_per_token_logps_and_entropies = lambda *a, **k: (logps, torch.zeros_like(logps), None)
    inputs = {
        "prompt_ids": torch.zeros(b, 1, dtype=torch.long),
        "prompt_mask": torch.ones(b, 1, dtype=torch.long),
        "completion_ids": torch.zeros(b, t, dtype=torch.long),
        "completion_mask": mask,
        "advantages": torch.zeros(b, dtype=logps.dtype),  # no policy-gradient term: the loss is the KL term
        "ref_per_token_logps": ref,
        "num_items_in_batch": mask.sum(),
    }
    if old is not None:
        inputs["old_per_token_logps"] = old
    loss = _grpo_trainer()._compute_loss(trainer, None, inputs)
    kl = trainer._metrics["train"].get("kl", [None])[-1]
    return loss, kl


#: every loss type of TRL 1.16.0 but vespo, whose policy term needs vLLM's importance ratios (its KL term is dapo's)
TRL_LOSS_TYPES = ["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo"]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("loss_type", TRL_LOSS_TYPES)
@pytest.mark.parametrize("corrected", [False, True])
def test_trl_grpo_kl_is_trls_own_loss(seed, loss_type, corrected):
    new, old, ref, mask = _batch(seed)
    kw = dict(use_bias_correction_kl=corrected, loss_type=loss_type, max_completion_length=20)
    _agree(
        lambda x, o: fw.trl_grpo_kl(x, ref, mask, old_per_token_logps=o, beta=0.04, **kw)["loss_term"],
        lambda x, o: _trl_run(x, ref, mask, o, beta=0.04, loss_type=loss_type, corrected=corrected, width=20)[0],
        [new, old],
        n_grad=2,
    )
    got = fw.trl_grpo_kl(new, ref, mask, old_per_token_logps=old, beta=0.04, **kw)
    _, logged = _trl_run(new, ref, mask, old, beta=0.04, loss_type=loss_type, corrected=corrected, width=20)
    assert float(got["logged"]) == pytest.approx(logged, rel=1e-12)
    assert float(got["loss_term"]) == pytest.approx(0.04 * float(got["kl_in_loss"]), rel=1e-12)


@pytest.mark.parametrize("seed", SEEDS[:2])
@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_trl_grpo_importance_sampling_level(seed, level, loss_type):
    new, old, ref, mask = _batch(seed)
    _agree(
        lambda x, o: fw.trl_grpo_kl(x, ref, mask, o, beta=0.04, loss_type=loss_type, importance_sampling_level=level)[
            "loss_term"
        ],
        lambda x, o: _trl_run(x, ref, mask, o, beta=0.04, loss_type=loss_type, level=level)[0],
        [new, old],
        n_grad=2,
    )


def test_trl_grpo_defaults_are_on_policy_when_no_old_logps():
    new, _old, ref, mask = _batch(5)
    # value: the ratio exp(logp - logp.detach()) is 1, so the logged kl is the plain k3 token mean ...
    plain = fw.trl_grpo_kl(new, ref, mask, use_bias_correction_kl=False)["logged"]
    default = fw.trl_grpo_kl(new, ref, mask)["logged"]
    assert float(default) == float(plain) == pytest.approx(_trl_run(new, ref, mask)[1], rel=1e-12)
    # ... but its gradient carries the score-function term k3 * d log pi, as TRL's own loss does
    _agree(lambda x: fw.trl_grpo_kl(x, ref, mask, beta=0.04)["loss_term"], lambda x: _trl_run(x, ref, mask)[0], [new])
    x = new.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(fw.trl_grpo_kl(x, ref, mask)["logged"], x)
    k3 = torch.exp(ref - new) - (ref - new) - 1
    manual = (k3 + 1 - torch.exp(ref - new)) * mask / mask.sum()
    assert torch.allclose(g, manual)
    assert fw.trl_grpo_kl(new, ref, mask)["loss_term"] == 0.0  # beta = 0.0: no KL in TRL's loss


def test_trl_grpo_beta_zero_has_no_kl_term_even_where_k3_overflows():
    new, _old, ref, mask = _batch(6, dtype=torch.float32)
    ref = ref.clone()
    ref[0, 0] = new[0, 0] + 95.0  # exp(95) overflows float32: k3 = inf
    got = fw.trl_grpo_kl(new, ref, mask, beta=0.0)
    assert math.isinf(float(got["logged"]))  # the value TRL would log with a KL: inf
    assert float(got["loss_term"]) == 0.0  # TRL computes no KL at beta = 0: no NaN from 0 * inf
    loss, logged = _trl_run(new, ref, mask, beta=0.0)
    assert float(loss) == 0.0 and logged is None  # TRL's loss holds no KL, and it logs none


def _trl_main_luspo_kl(per_token_logps, ref, mask, old):
    """huggingface/trl @ f2cd577, grpo_trainer._compute_loss, the KL part of ``luspo`` as read: per_token_kl
    enters per_token_loss unmasked, then ``(per_token_loss * mask.sum(1, keepdim=True)).mean()``."""
    per_token_kl = torch.exp(ref - per_token_logps) - (ref - per_token_logps) - 1
    per_token_kl = per_token_kl * torch.exp(per_token_logps - old)
    return (per_token_kl * mask.sum(1, keepdim=True)).mean()


@pytest.mark.parametrize("seed", SEEDS)
def test_trl_main_luspo_counts_padding(seed):
    new, old, ref, mask = _batch(seed)
    _agree(
        lambda x, o: fw.trl_grpo_kl(x, ref, mask, o, beta=1.0, loss_type="luspo", version="main")["kl_in_loss"],
        lambda x, o: _trl_main_luspo_kl(x, ref, mask, o),
        [new, old],
        n_grad=2,
    )
    release = fw.trl_grpo_kl(new, ref, mask, old, beta=1.0, loss_type="luspo")["kl_in_loss"]
    main = fw.trl_grpo_kl(new, ref, mask, old, beta=1.0, loss_type="luspo", version="main")["kl_in_loss"]
    assert float(release) != pytest.approx(float(main), rel=1e-3)  # padding (and the per-entry mean) count
    full = torch.ones_like(mask)  # no padding: main is the release divided by the width
    a = fw.trl_grpo_kl(new, ref, full, old, beta=1.0, loss_type="luspo")["kl_in_loss"]
    b = fw.trl_grpo_kl(new, ref, full, old, beta=1.0, loss_type="luspo", version="main")["kl_in_loss"]
    assert float(b) == pytest.approx(float(a), rel=1e-12)


# =============================================================================================
# TRL PPO (huggingface/trl @ f2cd577, trl/experimental/ppo/ppo_trainer.py)
# =============================================================================================
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("est", ["k1", "k3"])
def test_trl_ppo_kl(seed, est):
    new, old, ref, mask = _batch(seed)
    invalid = 1.0  # INVALID_LOGPROB
    pad = mask == 0

    def reference(lp, rp):
        logprobs = torch.masked_fill(lp, pad, invalid)
        ref_logprobs = torch.masked_fill(rp, pad, invalid)
        logr = ref_logprobs - logprobs
        kl = -logr if est == "k1" else (logr.exp() - 1) - logr
        return kl.sum(1).mean()

    _agree(lambda lp, rp: fw.trl_ppo_kl(lp, rp, mask, kl_estimator=est)["logged"], reference, [old, ref], 2)
    got = fw.trl_ppo_kl(old, ref, mask, kl_estimator=est, kl_coef=0.05, new_logprobs=new)
    logr = (ref - old) * mask
    kl = -logr if est == "k1" else (torch.exp(logr) - 1) - logr
    assert torch.allclose(got["reward_delta"], -0.05 * kl)

    def approxkl(nl):
        logprobs_diff = torch.masked_fill(nl, pad, invalid) - torch.masked_fill(old, pad, invalid)
        return 0.5 * (logprobs_diff**2).mean()

    _agree(lambda nl: fw.trl_ppo_kl(old, ref, mask, new_logprobs=nl)["approxkl"], approxkl, [new])


# =============================================================================================
# NeMo-RL (NVIDIA-NeMo/RL @ 7ea279a): algorithms/utils.calculate_kl / masked_mean,
# algorithms/loss/loss_functions.ClippedPGLossFn (KL part)
# =============================================================================================
def _nemo_calculate_kl(
    logprobs,
    logprobs_reference,
    kl_type="k3",
    input_clamp_value=20.0,
    output_clamp_value=10.0,
    importance_sampling_weights=None,
):
    logr = logprobs_reference - logprobs
    if input_clamp_value is not None:
        logr_clamped = logr.clamp(min=-input_clamp_value, max=input_clamp_value)
        if importance_sampling_weights is not None:
            importance_sampling_weights = torch.where(
                logr == logr_clamped, importance_sampling_weights, importance_sampling_weights.detach()
            )
        logr = logr_clamped
    if kl_type == "k1":
        kl = -logr
    elif kl_type == "k2":
        kl = torch.square(logr) / 2
    else:
        kl = torch.exp(logr) - 1 - logr
    if importance_sampling_weights is not None:
        kl = importance_sampling_weights * kl
    if output_clamp_value is not None:
        kl = kl.clamp(min=-output_clamp_value, max=output_clamp_value)
    return kl


def _nemo_masked_mean(values, mask, dim=None):
    if dim is None:
        return (values * mask).sum() / (mask.sum() + 1e-8)
    return (values * mask).sum(dim) / (mask.sum(dim) + 1e-8)


def _nemo_kl(
    curr, ref, mask, gen=None, kl_type="k3", coef=0.01, on_policy_approx=False, version="current", token_level=True
):
    """version: "current" (PR #2958), "2506" (weights not detached, times the clamped KL), "pre2506"."""
    if version == "pre2506":
        w = torch.exp(curr - gen).detach() if on_policy_approx else torch.ones_like(curr)
        w = torch.nan_to_num(w, nan=0.0, posinf=0.0, neginf=0.0)
    else:
        w = torch.exp(curr - gen) if on_policy_approx else torch.exp(curr - curr.detach())
        w = torch.nan_to_num(w, nan=0.0, posinf=0.0, neginf=0.0)
    if version == "current":
        kl = coef * _nemo_calculate_kl(curr, ref, kl_type, 20.0, 10.0, importance_sampling_weights=w)
    else:
        kl = w * coef * _nemo_calculate_kl(curr, ref, kl_type, 20.0, 10.0)
    if token_level:
        return _nemo_masked_mean(kl, mask)
    return _nemo_masked_mean(_nemo_masked_mean(kl, mask, dim=-1), torch.ones_like(mask[:, 0]))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("kl_type", ["k1", "k2", "k3"])
def test_nemo_rl_calculate_kl(seed, kl_type):
    new, old, ref, _mask = _batch(seed, spread=8.0)
    w = _weights()
    iw = torch.exp(new - old)
    for clamps in ((20.0, 10.0), (None, None), (20.0, None), (None, 10.0)):
        _agree(
            lambda x, r, c=clamps: (fw.nemo_rl_calculate_kl(x, r, kl_type, *c) * w).sum(),
            lambda x, r, c=clamps: (_nemo_calculate_kl(x, r, kl_type, *c) * w).sum(),
            [new, ref],
            2,
        )
        _agree(
            lambda x, r, i, c=clamps: (
                fw.nemo_rl_calculate_kl(x, r, kl_type, *c, importance_sampling_weights=i) * w
            ).sum(),
            lambda x, r, i, c=clamps: (_nemo_calculate_kl(x, r, kl_type, *c, importance_sampling_weights=i) * w).sum(),
            [new, ref, iw],
            3,
        )


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("kl_type", ["k1", "k2", "k3"])
@pytest.mark.parametrize("approx", [False, True])
@pytest.mark.parametrize("version", ["current", "2506", "pre2506"])
def test_nemo_rl_kl_loss_current_and_legacy(seed, kl_type, approx, version):
    new, old, ref, mask = _batch(seed, spread=6.0)
    opts = {
        "current": {},
        "2506": {"weight_inside_clamp": False},
        "pre2506": {"weight_inside_clamp": False, "detach_weights": True},
    }[version]

    def model(x, g):
        out = fw.nemo_rl_kl_loss(
            x, ref, mask, generation_logprobs=g, kl_type=kl_type, use_on_policy_kl_approximation=approx, **opts
        )
        return out["loss_term"]

    got = _agree(model, lambda x, g: _nemo_kl(x, ref, mask, g, kl_type, 0.01, approx, version), [new, old], 2)
    logged = fw.nemo_rl_kl_loss(new, ref, mask, old, kl_type, use_on_policy_kl_approximation=approx, **opts)["logged"]
    assert float(logged) == pytest.approx(float(got) / 0.01, rel=1e-9)


@pytest.mark.parametrize("seed", SEEDS[:2])
def test_nemo_rl_sequence_level_loss(seed):
    new, old, ref, mask = _batch(seed, spread=3.0)
    _agree(
        lambda x: fw.nemo_rl_kl_loss(x, ref, mask, old, use_on_policy_kl_approximation=True, token_level_loss=False)[
            "loss_term"
        ],
        lambda x: _nemo_kl(x, ref, mask, old, on_policy_approx=True, token_level=False),
        [new],
        rtol=1e-7,
    )  # NeMo-RL divides by count + 1e-8


def test_nemo_rl_weight_order_matters_only_where_the_output_clamp_binds():
    new, old, ref, mask = _batch(4, spread=2.0)
    now = fw.nemo_rl_kl_loss(new, ref, mask, old, use_on_policy_kl_approximation=True)["per_token"]
    before = fw.nemo_rl_kl_loss(new, ref, mask, old, use_on_policy_kl_approximation=True, weight_inside_clamp=False)[
        "per_token"
    ]
    raw = fw.nemo_rl_calculate_kl(new, ref, "k3", 20.0, None)
    w = torch.exp(new - old)
    binds = (raw > 10.0) | (w * raw > 10.0)
    assert bool(binds.any()) and bool((~binds & (mask > 0)).any())
    assert torch.allclose(now[~binds], before[~binds])
    assert not torch.allclose(now[binds], before[binds])


def test_nemo_rl_detached_weights_change_the_gradient_not_the_value():
    new, old, ref, mask = _batch(7)
    x1, x2 = new.clone().requires_grad_(True), new.clone().requires_grad_(True)
    a = fw.nemo_rl_kl_loss(x1, ref, mask, generation_logprobs=old, use_on_policy_kl_approximation=True)["logged"]
    b = fw.nemo_rl_kl_loss(
        x2, ref, mask, generation_logprobs=old, use_on_policy_kl_approximation=True, detach_weights=True
    )["logged"]
    assert math.isclose(float(a.detach()), float(b.detach()), rel_tol=1e-12)
    (ga,), (gb,) = torch.autograd.grad(a, x1), torch.autograd.grad(b, x2)
    assert not torch.allclose(ga, gb)


# =============================================================================================
# MiniMind (jingyaogong/minimind @ d65ef2c, trainer/train_ppo.py)
# =============================================================================================
@pytest.mark.parametrize("seed", SEEDS)
def test_minimind_approx_kl_and_kl_ref(seed):
    new, old, ref, mask = _batch(seed)
    got = fw.minimind_approx_kl(new, old, mask, early_stop_kl=0.25)
    want = sum(0.5 * float(new[b, t] - old[b, t]) ** 2 for b in range(B) for t in range(R) if mask[b, t])
    want /= max(1.0, float(mask.sum()))
    assert math.isclose(float(got["approx_kl"]), want, rel_tol=1e-9)
    assert bool(got["stop"]) == (want > 0.25)
    pen = fw.minimind_kl_ref_penalty(new, ref, mask, kl_coef=0.02)
    want_ref = sum(
        math.exp(float(ref[b, t] - new[b, t])) - float(ref[b, t] - new[b, t]) - 1
        for b in range(B)
        for t in range(R)
        if mask[b, t]
    ) / float(mask.sum())
    assert math.isclose(float(pen["kl_ref_penalty"]), want_ref, rel_tol=1e-9)
    assert math.isclose(float(pen["loss_term"]), 0.02 * want_ref, rel_tol=1e-9)
    _agree(
        lambda x: fw.minimind_kl_ref_penalty(x, ref, mask)["loss_term"],
        lambda x: 0.02 * (((torch.exp(ref - x) - (ref - x) - 1.0) * mask).sum() / mask.sum().clamp(min=1)),
        [new],
    )


# =============================================================================================
# defaults: the frameworks' current defaults
# =============================================================================================
UPSTREAM_DEFAULTS = {
    # verl actor.yaml / algorithm.py @ 1dda039
    fw.verl_kl_loss: {
        "kl_loss_type": "low_var_kl",
        "loss_agg_mode": "token-mean",
        "kl_loss_coef": 0.001,
        "loss_scale_factor": None,
        "legacy_norm": False,
    },
    fw.verl_kl_in_reward: {"kl_penalty_kind": "kl", "kl_coef": 0.001},
    fw.verl_ppo_kl: {"clamp_log_ratio": True, "loss_mode": "vanilla"},
    # OpenRLHF cli/train_ppo_ray.py @ 3c3be62
    fw.openrlhf_kl: {"kl_estimator": "k1", "init_kl_coef": 0.01, "use_kl_loss": False, "clamp": True, "float32": True},
    fw.openrlhf_compute_approx_kl: {"kl_estimator": "k1", "clamp": True, "float32": True},
    # TRL 1.16.0 GRPOConfig; TRL @ f2cd577 PPOConfig
    fw.trl_grpo_kl: {
        "old_per_token_logps": None,
        "use_bias_correction_kl": True,
        "beta": 0.0,
        "loss_type": "dapo",
        "max_completion_length": 512,
        "importance_sampling_level": "token",
        "version": "1.16.0",
    },
    fw.trl_ppo_kl: {"kl_estimator": "k1", "kl_coef": 0.05},
    # NeMo-RL ClippedPGLossConfig @ 7ea279a
    fw.nemo_rl_kl_loss: {
        "kl_type": "k3",
        "reference_policy_kl_penalty": 0.01,
        "use_on_policy_kl_approximation": False,
        "detach_weights": False,
        "weight_inside_clamp": True,
        "kl_input_clamp_value": 20.0,
        "kl_output_clamp_value": 10.0,
        "token_level_loss": True,
    },
    fw.nemo_rl_calculate_kl: {
        "kl_type": "k3",
        "input_clamp_value": 20.0,
        "output_clamp_value": 10.0,
        "importance_sampling_weights": None,
    },
    # MiniMind train_ppo.py @ d65ef2c
    fw.minimind_approx_kl: {"early_stop_kl": 0.25},
    fw.minimind_kl_ref_penalty: {"kl_coef": 0.02},
    # MiniMind train_grpo.py @ d65ef2c
    fw.minimind_grpo_kl: {"beta": 0.1},
}


@pytest.mark.parametrize("fn", list(UPSTREAM_DEFAULTS), ids=lambda f: f.__name__)
def test_defaults_are_the_frameworks_defaults(fn):
    params = inspect.signature(fn).parameters
    for name, value in UPSTREAM_DEFAULTS[fn].items():
        assert params[name].default == value, (fn.__name__, name)


def test_trl_grpo_defaults_are_trls_own_config_defaults():
    import dataclasses

    _grpo_trainer()  # imports trl and checks its version
    from trl import GRPOConfig

    fields = {f.name: f.default for f in dataclasses.fields(GRPOConfig)}
    params = inspect.signature(fw.trl_grpo_kl).parameters
    for name in ("use_bias_correction_kl", "beta", "loss_type", "max_completion_length", "importance_sampling_level"):
        assert params[name].default == fields[name], name


def test_agg_loss_default_is_todays_verl():
    import klviz

    params = inspect.signature(klviz.agg_loss).parameters
    assert params["legacy_norm"].default is False and params["legacy_norm"].kind is inspect.Parameter.KEYWORD_ONLY
    assert "token-sum" in klviz.AGG_MODES and klviz.AGG_MODES[:3] == (
        "token-mean",
        "seq-mean-token-sum",
        "seq-mean-token-mean",
    )


# =============================================================================================
# extreme inputs (float32, log-ratios of ±100): finite where the framework is finite, no errors
# =============================================================================================
def _extreme(dtype=torch.float32):
    new, old, ref, mask = _batch(11, dtype=dtype)
    mask = torch.ones_like(mask)
    ref = ref.clone()
    old = old.clone()
    ref[0, :4] = new[0, :4] + torch.tensor([100.0, -100.0, 30.0, -30.0], dtype=dtype)
    old[1, :4] = new[1, :4] - torch.tensor([100.0, -100.0, 88.0, -88.0], dtype=dtype)  # log pi - log old
    ref[1, 2] = new[1, 2] + 30.0  # a weight of e^88 times a k3 clamped at log r = 20: overflows
    return new, old, ref, mask


def test_extreme_verl():
    new, old, ref, mask = _extreme()
    for kind in ("low_var_kl", "k3+", "k1", "k2"):
        v = _agree(
            lambda x, r, k=kind: fw.verl_kl_loss(x, r, mask, kl_loss_type=k)["kl_loss"],
            lambda x, r, k=kind: _verl_agg_loss(_verl_kl_penalty(x, r, k), mask, "token-mean"),
            [new, ref],
            2,
            rtol=1e-5,
            atol=1e-6,
        )
        assert torch.isfinite(v)
    for clamp in (True, False):
        v = _agree(
            lambda x, o, c=clamp: fw.verl_ppo_kl(x, o, mask, clamp_log_ratio=c)["ppo_kl"],
            lambda x, o, c=clamp: _verl_ppo_kl(x, o, mask, c),
            [new, old],
            2,
            rtol=1e-5,
            atol=1e-6,
        )
        assert torch.isfinite(v)


def test_extreme_openrlhf():
    new, _old, ref, mask = _extreme()
    for est in ("k1", "k2", "k3"):
        v = _agree(
            lambda x, b, e=est: fw.openrlhf_kl(x, b, mask, e, use_kl_loss=True)["kl_loss"],
            lambda x, b, e=est: _openrlhf_masked_mean(_openrlhf_compute_approx_kl(x, b, e), mask),
            [new, ref],
            2,
            rtol=1e-5,
            atol=1e-6,
        )
        assert torch.isfinite(v)  # exp(100) = inf, and the ±10 clamp catches it
    unclamped = fw.openrlhf_kl(new, ref, mask, "k3", use_kl_loss=True, clamp=False)["kl_loss"]
    assert torch.isinf(unclamped)  # what OpenRLHF returned before its clamp: inf, no error


def test_extreme_trl():
    new, old, ref, mask = _extreme()
    # TRL's run has zero advantages (its loss is the KL term alone): a ratio of e^100 would make its
    # policy term inf * 0 = NaN, which a real advantage would not; keep the ratios of e^±88
    old = old.clone()
    old[1, :2] = new[1, :2]
    for corrected in (False, True):
        got = _agree(
            lambda x, o, c=corrected: fw.trl_grpo_kl(x, ref, mask, o, use_bias_correction_kl=c, beta=0.04)["loss_term"],
            lambda x, o, c=corrected: _trl_run(x, ref, mask, o, corrected=c)[0],
            [new, old],
            2,
            rtol=1e-5,
            atol=1e-6,
        )
        assert not torch.isfinite(got)  # TRL has no clamp: exp(100) overflows, as in TRL
        logged = float(fw.trl_grpo_kl(new, ref, mask, old, use_bias_correction_kl=corrected)["logged"])
        assert logged == _trl_run(new, ref, mask, old, corrected=corrected)[1]  # inf, as TRL logs it
    fine = ref.clone()
    fine[0, 0] = new[0, 0] - 100.0  # log r = -100 is finite: k3 = 99
    v = _agree(
        lambda x: fw.trl_grpo_kl(x, fine, mask, use_bias_correction_kl=False, beta=0.04)["loss_term"],
        lambda x: _trl_run(x, fine, mask, corrected=False)[0],
        [new],
        rtol=1e-5,
        atol=1e-6,
    )
    assert torch.isfinite(v)
    out = fw.trl_ppo_kl(new, ref, mask, "k1")["logged"]
    assert torch.isfinite(out)


def test_extreme_nemo_rl():
    new, old, ref, mask = _extreme()
    for approx in (False, True):
        v = _agree(
            lambda x, g, a=approx: fw.nemo_rl_kl_loss(x, ref, mask, g, use_on_policy_kl_approximation=a)["loss_term"],
            lambda x, g, a=approx: _nemo_kl(x, ref, mask, g, on_policy_approx=a),
            [new, old],
            2,
            rtol=1e-5,
            atol=1e-6,
        )
        assert torch.isfinite(v)  # overflowing weight -> 0 (nan_to_num); w * k3 = inf -> 10
    pt = fw.nemo_rl_kl_loss(new, ref, mask, old, use_on_policy_kl_approximation=True)["per_token"]
    assert float(pt[1, 0]) == 0.0 and float(pt[1, 2]) == 10.0
    # the order before PR #2958, (weight * coef) * clamped k: e^88 * 0.01 * 10 stays finite there too
    for opts, version in (
        ({"weight_inside_clamp": False}, "2506"),
        ({"weight_inside_clamp": False, "detach_weights": True}, "pre2506"),
    ):
        v = _agree(
            lambda x, g, o=opts: fw.nemo_rl_kl_loss(x, ref, mask, g, use_on_policy_kl_approximation=True, **o)[
                "loss_term"
            ],
            lambda x, g, v=version: _nemo_kl(x, ref, mask, g, on_policy_approx=True, version=v),
            [new, old],
            2,
            rtol=1e-5,
            atol=1e-6,
        )
        assert torch.isfinite(v)
        logged = fw.nemo_rl_kl_loss(new, ref, mask, old, use_on_policy_kl_approximation=True, **opts)["logged"]
        assert torch.isfinite(logged) and float(logged) == pytest.approx(float(v) / 0.01, rel=1e-6)


# =============================================================================================
# side_by_side, sources, bad inputs
# =============================================================================================
def test_empty_masks_give_zero_not_nan():
    new, old, ref, mask = _batch(0)
    empty = torch.zeros_like(mask)
    for out in (
        fw.minimind_approx_kl(new, old, empty)["approx_kl"],
        fw.minimind_kl_ref_penalty(new, ref, empty)["logged"],
        fw.trl_grpo_kl(new, ref, empty)["logged"],
        fw.verl_ppo_kl(new, old, empty)["logged"],
        fw.nemo_rl_kl_loss(new, ref, empty)["logged"],
        fw.openrlhf_kl(new, ref, empty, use_kl_loss=True)["logged"],
    ):
        assert float(out) == 0.0


# =============================================================================================
# verl rollout correction (verl-project/verl @ 1dda039): rollout_corr_helper.compute_offpolicy_metrics,
# torch_functional.masked_mean / masked_sum, as read
# =============================================================================================
def _verl_offpolicy(old_log_prob, rollout_log_prob, response_mask):
    def masked_sum(values, mask, axis=None):
        valid = torch.where(mask.bool(), values, 0.0)
        return (valid * mask).sum() if axis is None else (valid * mask).sum(axis)

    def masked_mean(values, mask, axis=None):
        return masked_sum(values, mask, axis) / ((mask.sum() if axis is None else mask.sum(axis)) + 1e-8)

    m = {}
    mean_log_prob_training = masked_mean(old_log_prob, response_mask, axis=-1)
    m["training_ppl"] = torch.exp(-mean_log_prob_training).mean().item()
    m["training_log_ppl"] = (-mean_log_prob_training).mean().item()
    m["kl"] = masked_mean(rollout_log_prob - old_log_prob, response_mask).item()
    log_ratio = old_log_prob - rollout_log_prob
    m["k3_kl"] = masked_mean(torch.exp(log_ratio) - log_ratio - 1, response_mask).item()
    mean_log_prob_rollout = masked_mean(rollout_log_prob, response_mask, axis=-1)
    m["rollout_ppl"] = torch.exp(-mean_log_prob_rollout).mean().item()
    m["rollout_log_ppl"] = (-mean_log_prob_rollout).mean().item()
    log_ppl_diff = mean_log_prob_rollout - mean_log_prob_training
    m["log_ppl_diff"] = log_ppl_diff.mean().item()
    m["log_ppl_abs_diff"] = log_ppl_diff.abs().mean().item()
    m["log_ppl_diff_max"] = log_ppl_diff.max().item()
    m["log_ppl_diff_min"] = log_ppl_diff.min().item()
    m["ppl_ratio"] = torch.exp(log_ppl_diff).mean().item()
    rho_token = torch.exp(torch.clamp(log_ratio, min=-20.0, max=20.0))
    m["chi2_token"] = (masked_mean(rho_token.square(), response_mask) - 1.0).item()
    log_ratio_sum = masked_sum(log_ratio, response_mask, axis=-1)
    m["chi2_seq"] = (torch.exp(2.0 * torch.clamp(log_ratio_sum, min=-20.0, max=20.0)).mean() - 1.0).item()
    return m


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("spread", [0.05, 1.0, 6.0])
def test_verl_offpolicy_metrics(seed, spread):
    new, old, _ref, mask = _batch(seed, spread=spread)
    mask = mask.clone()
    mask[3] = 0.0  # an empty row: verl counts it in every per-row mean, with mean 0
    got, want = fw.verl_offpolicy_metrics(old, new, mask), _verl_offpolicy(old, new, mask)
    assert set(got) == set(want)
    for k in want:
        assert got[k] == pytest.approx(want[k], rel=1e-12, abs=1e-12), k
    # the ppl ratio is the mean of the per-row ratios, not exp of their mean log (Jensen: never below it)
    assert got["ppl_ratio"] >= math.exp(got["log_ppl_diff"]) - 1e-12


def test_mismatch_metrics_ppl_ratio_is_verls():
    from klviz import mismatch as mm

    new, old, _ref, mask = _batch(2, spread=0.5)
    verl = fw.verl_offpolicy_metrics(old, new, mask)  # verl: old = the trainer, new = the engine here
    ours = mm.mismatch_metrics(old, new, mask.bool())
    # equal up to verl's "+ 1e-8" in each denominator: a relative 1e-8 / (tokens per row) at most
    assert ours["ppl_ratio"] == pytest.approx(verl["ppl_ratio"], rel=1e-9)
    assert ours["k1"] == pytest.approx(verl["kl"], rel=1e-9)
    assert ours["chi2_seq"] == pytest.approx(verl["chi2_seq"], rel=1e-12)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("mode", sorted(fw.VERL_PPO_KL_MODES))
def test_verl_ppo_kl_by_loss_mode(seed, mode):
    new, old, _ref, mask = _batch(seed, spread=12.0)  # some |log ratio| beyond 20

    def as_read(log_prob, old_log_prob):
        negative_approx_kl = log_prob - old_log_prob
        if mode == "kl_cov":  # compute_policy_loss_kl_cov: ppo_kl_abs
            return _verl_masked_mean(negative_approx_kl.abs(), mask)
        if mode in ("vanilla", "dppo_tv", "dppo_kl", "sapo", "cispo"):
            negative_approx_kl = torch.clamp(negative_approx_kl, min=-20.0, max=20.0)
        return _verl_masked_mean(-negative_approx_kl, mask)

    _agree(lambda x, o: fw.verl_ppo_kl(x, o, mask, loss_mode=mode)["ppo_kl"], as_read, [new, old], n_grad=2)
    if mode == "kl_cov":  # never negative: no k1 of any KL
        assert float(fw.verl_ppo_kl(old, new, mask, loss_mode=mode)["ppo_kl"]) >= 0


def test_openrlhf_legacy_float32_false_keeps_bfloat16_arithmetic():
    new, _old, ref, mask = _batch(3, spread=3.0, dtype=torch.bfloat16)
    for est in ("k1", "k2", "k3"):
        legacy = fw.openrlhf_compute_approx_kl(new, ref, est, float32=False)
        assert legacy.dtype == torch.bfloat16
        assert torch.equal(legacy, _openrlhf_compute_approx_kl(new, ref, est, as_float=False))  # bf16, as read
        today = fw.openrlhf_compute_approx_kl(new, ref, est)
        assert today.dtype == torch.float32
        assert torch.equal(today, _openrlhf_compute_approx_kl(new, ref, est))
    gap = (fw.openrlhf_compute_approx_kl(new, ref, "k1", float32=False).float() - today).abs().max()
    assert float(gap) > 1e-3  # bf16 rounding of the log-ratio: the two are different numbers


@pytest.mark.parametrize("use_kl_loss", [False, True])
def test_openrlhf_init_coef_zero_logs_zero(use_kl_loss):
    new, _old, ref, mask = _batch(4, spread=2.0)
    out = fw.openrlhf_kl(new, ref, mask, "k3", init_kl_coef=0.0, use_kl_loss=use_kl_loss)
    assert float(out["logged"]) == 0.0 and float(out["per_token"].abs().sum()) == 0.0
    assert float(fw.openrlhf_kl(new, ref, mask, "k3", use_kl_loss=use_kl_loss)["logged"]) > 0


def test_openrlhf_logged_kl_aggregation_reward_vs_loss():
    new, _old, ref, mask = _batch(0)
    reward = fw.openrlhf_kl(new, ref, mask, "k1")
    loss = fw.openrlhf_kl(new, ref, mask, "k1", use_kl_loss=True)
    kl = _openrlhf_compute_approx_kl(new, ref, "k1")
    seq_means = _openrlhf_masked_mean(kl, mask.float(), dim=-1).mean()
    token_mean = _openrlhf_masked_mean(kl, mask.float())
    assert float(reward["logged"]) == pytest.approx(float(seq_means), rel=1e-6)
    assert float(loss["logged"]) == pytest.approx(float(token_mean), rel=1e-6)
    assert abs(float(seq_means) - float(token_mean)) > 1e-3  # the two aggregations differ on this batch


@pytest.mark.parametrize("seed", SEEDS)
def test_minimind_grpo_kl(seed):
    new, _old, ref, mask = _batch(seed)

    def as_read(per_token_logps):  # trainer/train_grpo.py @ d65ef2c, the KL part of policy_loss
        kl_div = ref - per_token_logps
        per_token_kl = torch.exp(kl_div) - kl_div - 1
        return ((0.1 * per_token_kl * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)).mean()

    _agree(lambda x: fw.minimind_grpo_kl(x, ref, mask)["loss_term"], as_read, [new])
    logged = float(fw.minimind_grpo_kl(new, ref, mask)["logged"])
    assert logged == pytest.approx(float(((ref - new) * mask).sum()) / max(float(mask.sum()), 1), rel=1e-12)
    assert logged == pytest.approx(-_loop_token_mean(new - ref, mask), rel=1e-12)  # minus k1


def test_minimind_rollout_samples_at_08_and_scores_at_1():
    import klviz
    from klviz import lm
    from klviz import mismatch as mm

    model = lm.load_tiny_lm("old")
    ro, old_logp = fw.minimind_rollout(model, list(lm.PROMPTS[:4]), klviz.make_generator(0), max_new_tokens=12)
    assert fw.MINIMIND_ROLLOUT_TEMPERATURE == 0.8
    m = ro.response_mask.bool()
    at_1 = lm.logprobs_of(model, ro)
    assert torch.allclose(old_logp[m], at_1[m], atol=1e-6)  # old_resp_logp: the T = 1 recompute
    full = lm.next_token_logprobs(model, ro)
    tempered = torch.log_softmax(full / 0.8, -1).gather(-1, ro.input_ids.unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(ro.logprobs[m], tempered[m], atol=1e-5)  # the sampler: T = 0.8
    assert float((ro.logprobs - old_logp)[m].abs().max()) > 0.01
    assert isinstance(mm.EngineSpec(temperature=fw.MINIMIND_ROLLOUT_TEMPERATURE), mm.EngineSpec)


def test_side_by_side_rows_name_direction_and_agree_with_the_functions():
    new, old, ref, mask = _batch(1)
    rows = fw.side_by_side(new, old, ref, mask, exact_old_policy=torch.rand(B, R, dtype=torch.float64))
    assert {r["framework"] for r in rows} >= {"verl", "OpenRLHF", "TRL GRPO", "TRL PPO", "NeMo-RL", "MiniMind", "exact"}
    by = {(r["framework"], r["logged as"]): r for r in rows}
    assert by[("MiniMind", "approx_kl")]["estimates"] == "KL(π_old‖π_θ)"
    assert by[("verl", "actor/ppo_kl")]["value"] == pytest.approx(_loop_token_mean(old - new, mask))
    assert by[("TRL GRPO", "kl")]["value"] == by[("MiniMind", "kl_ref")]["value"]
    # NeMo-RL's row is its default (use_on_policy_kl_approximation=False); the flag's row says it is not
    nemo_default = float(_nemo_kl(new, ref, mask, old, on_policy_approx=False)) / 0.01
    assert by[("NeMo-RL", "kl_penalty")]["value"] == pytest.approx(nemo_default, rel=1e-9)
    assert "default" in by[("NeMo-RL", "kl_penalty")]["how"]
    flag = by[("NeMo-RL", "kl_penalty (non-default: use_on_policy_kl_approximation=True)")]
    assert flag["value"] == pytest.approx(float(_nemo_kl(new, ref, mask, old, on_policy_approx=True)) / 0.01, rel=1e-9)
    # MiniMind's GRPO logs minus k1 under the name its PPO gives to k3
    assert by[("MiniMind", "kl_ref (train_grpo.py)")]["value"] == pytest.approx(_loop_token_mean(ref - new, mask))
    for r in rows:
        assert math.isfinite(r["value"])
        if "non-default" not in r["logged as"]:
            assert "use_on_policy_kl_approximation=True" not in r["how"], r  # non-defaults are labelled


def test_every_function_names_its_source_file_and_commit():
    for fn in list(fw.FRAMEWORK_FUNCTIONS.values()) + [
        fw.openrlhf_compute_approx_kl,
        fw.nemo_rl_calculate_kl,
        fw.verl_kl_penalty,
    ]:
        doc = " ".join(fn.__doc__.split())
        assert "Follows " in doc and ".py" in doc, fn.__name__
        assert " @ " in doc or "release 1.16.0" in doc, fn.__name__
    for fn, path in (
        (fw.verl_kl_loss, "verl/workers/utils/losses.py"),
        (fw.nemo_rl_kl_loss, "nemo_rl/algorithms/loss/loss_functions.py"),
        (fw.trl_ppo_kl, "trl/experimental/ppo/ppo_trainer.py"),
    ):
        assert path in fn.__doc__, fn.__name__


def test_bad_inputs_raise_value_errors_naming_the_argument():
    new, old, ref, mask = _batch(0)
    with pytest.raises(ValueError, match="kl_loss_type|kind"):
        fw.verl_kl_loss(new, ref, mask, kl_loss_type="k4")
    with pytest.raises(ValueError, match="ref_logprob"):
        fw.verl_kl_loss(new, ref[:, :3], mask)
    with pytest.raises(ValueError, match="response_mask"):
        fw.verl_ppo_kl(new, old, mask[:, :3])
    with pytest.raises(ValueError, match="mask"):
        fw.minimind_approx_kl(new, old, mask * 2)
    with pytest.raises(ValueError, match="kl_estimator"):
        fw.openrlhf_compute_approx_kl(new, ref, "k5")
    with pytest.raises(ValueError, match="old_per_token_logps"):
        fw.trl_grpo_kl(new, ref, mask, old_per_token_logps=old[:, :3])
    with pytest.raises(ValueError, match="loss_type"):
        fw.trl_grpo_kl(new, ref, mask, loss_type="mean")
    with pytest.raises(ValueError, match="importance_sampling_level"):
        fw.trl_grpo_kl(new, ref, mask, importance_sampling_level="tok")
    with pytest.raises(ValueError, match="generation_logprobs"):
        fw.nemo_rl_kl_loss(new, ref, mask, use_on_policy_kl_approximation=True)
    with pytest.raises(ValueError, match="importance_sampling_weights"):
        fw.nemo_rl_calculate_kl(new, ref, importance_sampling_weights=old[:, :2])
    with pytest.raises(ValueError, match="early_stop_kl"):
        fw.minimind_approx_kl(new, old, mask, early_stop_kl=0)
    nan = new.clone()
    nan[0, 0] = float("nan")
    with pytest.raises(ValueError, match="mb_resp_logp"):
        fw.minimind_approx_kl(nan, old, mask)
    with pytest.raises(ValueError, match="log_probs"):
        fw.openrlhf_compute_approx_kl(torch.tensor([1, 2]), ref[0, :2])
