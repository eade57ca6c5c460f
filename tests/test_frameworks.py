"""klviz.frameworks against the published formulas, re-computed inline on random batches.

Each reference below is written from the formula in shared REFERENCE section 6 and the frameworks'
source files (named in the functions' docstrings), with plain tensor operations and loops: none of
them calls a klviz function.
"""
from __future__ import annotations

import math

import pytest
import torch

from klviz import frameworks as fw

B, R = 6, 11


def _batch(seed: int, spread: float = 1.0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, R, generator=g, dtype=dtype) * 5 - 0.01
    new = old + spread * torch.randn(B, R, generator=g, dtype=dtype)
    ref = old + spread * torch.randn(B, R, generator=g, dtype=dtype)
    lengths = torch.randint(1, R + 1, (B,), generator=g)
    lengths[0] = R
    mask = (torch.arange(R)[None, :] < lengths[:, None]).to(dtype)
    return new, old, ref, mask


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


SEEDS = [0, 1, 2, 3]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("kind", ["low_var_kl", "k1", "mse"])
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_verl_kl_loss(seed, kind, agg):
    new, _old, ref, mask = _batch(seed, spread=3.0)
    got = fw.verl_kl_loss(new, ref, mask, kl_loss_type=kind, loss_agg_mode=agg, kl_loss_coef=0.001)
    if kind == "k1":
        per = new - ref
    elif kind == "mse":
        per = 0.5 * (new - ref) ** 2
    else:
        d = torch.clamp(ref - new, min=-20, max=20)
        per = torch.clamp(torch.exp(d) - d - 1, min=-10, max=10)
    if agg == "token-mean":
        want = _loop_token_mean(per, mask)
    elif agg == "seq-mean-token-mean":
        want = sum(_loop_seq_means(per, mask)) / B
    else:
        want = sum(float((per[b] * mask[b]).sum()) for b in range(B)) / B
    assert math.isclose(float(got["kl_loss"]), want, rel_tol=1e-9, abs_tol=1e-12)
    assert math.isclose(float(got["loss_term"]), 0.001 * want, rel_tol=1e-9, abs_tol=1e-15)
    assert torch.allclose(got["per_token"], per * mask)


@pytest.mark.parametrize("seed", SEEDS)
def test_verl_kl_in_reward(seed):
    _new, old, ref, mask = _batch(seed)
    got = fw.verl_kl_in_reward(old, ref, mask, "kl", kl_coef=0.05)
    kld = (old - ref) * mask
    assert torch.allclose(got["reward_delta"], -0.05 * kld)
    assert math.isclose(float(got["logged"]), sum(_loop_seq_means(kld, mask)) / B, rel_tol=1e-9)


@pytest.mark.parametrize("seed", SEEDS)
def test_verl_ppo_kl_is_mean_of_old_minus_new(seed):
    new, old, _ref, mask = _batch(seed)
    got = fw.verl_ppo_kl(new, old, mask)
    assert math.isclose(float(got["ppo_kl"]), _loop_token_mean(old - new, mask), rel_tol=1e-9)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("est", ["k1", "k2", "k3"])
def test_openrlhf_compute_approx_kl_clamps_every_estimator(seed, est):
    new, _old, ref, _mask = _batch(seed, spread=4.0)
    lr = new - ref
    if est == "k1":
        raw = lr
    elif est == "k2":
        raw = lr ** 2 / 2
    else:
        raw = torch.exp(-lr) - 1 + lr
    got = fw.openrlhf_compute_approx_kl(new, ref, est)
    assert torch.allclose(got, raw.clamp(-10, 10))
    assert torch.allclose(fw.openrlhf_compute_approx_kl(new, ref, est, clamp=False), raw)
    if est != "k2":
        assert bool((raw.abs() > 10).any())            # the clamp is exercised by this batch


@pytest.mark.parametrize("seed", SEEDS)
def test_openrlhf_kl_reward_and_loss(seed):
    new, old, ref, mask = _batch(seed)
    r = fw.openrlhf_kl(old, ref, mask, "k1", init_kl_coef=0.01)
    kl = (old - ref).clamp(-10, 10) * mask
    assert torch.allclose(r["reward_delta"], -0.01 * kl)
    assert math.isclose(float(r["logged"]), sum(_loop_seq_means(kl, mask)) / B, rel_tol=1e-9)
    lossy = fw.openrlhf_kl(new, ref, mask, "k3", init_kl_coef=0.01, use_kl_loss=True)
    k3 = (torch.exp(ref - new) - 1 + (new - ref)).clamp(-10, 10)
    assert math.isclose(float(lossy["kl_loss"]), _loop_token_mean(k3, mask), rel_tol=1e-9)
    assert math.isclose(float(lossy["loss_term"]), 0.01 * _loop_token_mean(k3, mask), rel_tol=1e-9)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
@pytest.mark.parametrize("corrected", [False, True])
def test_trl_grpo_kl(seed, loss_type, corrected):
    new, old, ref, mask = _batch(seed)
    got = fw.trl_grpo_kl(new, ref, mask, old_per_token_logps=old, use_bias_correction_kl=corrected,
                         beta=0.04, loss_type=loss_type, max_completion_length=20)
    per = torch.exp(ref - new) - (ref - new) - 1          # no clamp in TRL
    if corrected:
        per = per * torch.exp(new - old)
    logged = _loop_token_mean(per, mask)
    assert math.isclose(float(got["logged"]), logged, rel_tol=1e-9)
    if loss_type == "grpo":
        want = sum(_loop_seq_means(per, mask)) / B
    elif loss_type == "dr_grpo":
        want = float((per * mask).sum()) / (B * 20)
    else:
        want = logged
    assert math.isclose(float(got["kl_in_loss"]), want, rel_tol=1e-9)
    assert math.isclose(float(got["loss_term"]), 0.04 * want, rel_tol=1e-9)


def test_trl_grpo_bias_correction_has_the_gradient_of_the_ratio():
    new, old, ref, mask = _batch(5)
    x = new.clone().requires_grad_(True)
    out = fw.trl_grpo_kl(x, ref, mask, old_per_token_logps=old, use_bias_correction_kl=True)["logged"]
    (g,) = torch.autograd.grad(out, x)
    # d/dx [ e^{x-o} (e^{r-x} - (r-x) - 1) ] = e^{x-o} (k3 + 1 - e^{r-x})
    k3 = torch.exp(ref - new) - (ref - new) - 1
    manual = torch.exp(new - old) * (k3 + 1 - torch.exp(ref - new)) * mask / mask.sum()
    assert torch.allclose(g, manual)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("est", ["k1", "k3"])
def test_trl_ppo_kl(seed, est):
    new, old, ref, mask = _batch(seed)
    got = fw.trl_ppo_kl(old, ref, mask, kl_estimator=est, kl_coef=0.05, new_logprobs=new)
    logr = (ref - old) * mask
    kl = -logr if est == "k1" else (torch.exp(logr) - 1) - logr
    assert torch.allclose(got["reward_delta"], -0.05 * kl)
    seq_sums = [float(kl[b].sum()) for b in range(B)]
    assert math.isclose(float(got["logged"]), sum(seq_sums) / B, rel_tol=1e-9)
    # approxkl: 0.5 * mean over ALL B*R entries; padded entries hold equal values, difference 0
    diff = [(float(new[b, t] - old[b, t]) if mask[b, t] else 0.0) for b in range(B) for t in range(R)]
    assert math.isclose(float(got["approxkl"]), 0.5 * sum(d * d for d in diff) / (B * R), rel_tol=1e-9)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("kl_type", ["k1", "k2", "k3"])
def test_nemo_rl_calculate_kl_and_loss(seed, kl_type):
    new, old, ref, mask = _batch(seed, spread=6.0)
    logr = (ref - new).clamp(-20, 20)
    kl = {"k1": -logr, "k2": logr ** 2 / 2, "k3": torch.exp(logr) - 1 - logr}[kl_type].clamp(-10, 10)
    assert torch.allclose(fw.nemo_rl_calculate_kl(new, ref, kl_type), kl)
    unclamped = {"k1": -(ref - new), "k2": (ref - new) ** 2 / 2,
                 "k3": torch.exp(ref - new) - 1 - (ref - new)}[kl_type]
    assert torch.allclose(fw.nemo_rl_calculate_kl(new, ref, kl_type, None, None), unclamped)
    got = fw.nemo_rl_kl_loss(new, ref, mask, generation_logprobs=old, kl_type=kl_type,
                             reference_policy_kl_penalty=0.01)
    weighted = torch.exp(new - old) * kl
    assert math.isclose(float(got["logged"]), _loop_token_mean(weighted, mask), rel_tol=1e-9)
    assert math.isclose(float(got["loss_term"]), 0.01 * _loop_token_mean(weighted, mask), rel_tol=1e-9)
    plain = fw.nemo_rl_kl_loss(new, ref, mask, kl_type=kl_type, use_on_policy_kl_approximation=False)
    assert math.isclose(float(plain["logged"]), _loop_token_mean(kl, mask), rel_tol=1e-9)


def test_nemo_rl_detached_weights_change_the_gradient_not_the_value():
    new, old, ref, mask = _batch(7)
    x1, x2 = new.clone().requires_grad_(True), new.clone().requires_grad_(True)
    a = fw.nemo_rl_kl_loss(x1, ref, mask, generation_logprobs=old)["logged"]
    b = fw.nemo_rl_kl_loss(x2, ref, mask, generation_logprobs=old, detach_weights=True)["logged"]
    assert math.isclose(float(a.detach()), float(b.detach()), rel_tol=1e-12)
    (ga,), (gb,) = torch.autograd.grad(a, x1), torch.autograd.grad(b, x2)
    assert not torch.allclose(ga, gb)


@pytest.mark.parametrize("seed", SEEDS)
def test_minimind_approx_kl_and_kl_ref(seed):
    new, old, ref, mask = _batch(seed)
    got = fw.minimind_approx_kl(new, old, mask, early_stop_kl=0.25)
    want = sum(0.5 * float(new[b, t] - old[b, t]) ** 2 for b in range(B) for t in range(R) if mask[b, t])
    want /= max(1.0, float(mask.sum()))
    assert math.isclose(float(got["approx_kl"]), want, rel_tol=1e-9)
    assert bool(got["stop"]) == (want > 0.25)
    pen = fw.minimind_kl_ref_penalty(new, ref, mask, kl_coef=0.02)
    want_ref = sum(math.exp(float(ref[b, t] - new[b, t])) - float(ref[b, t] - new[b, t]) - 1
                   for b in range(B) for t in range(R) if mask[b, t]) / float(mask.sum())
    assert math.isclose(float(pen["kl_ref_penalty"]), want_ref, rel_tol=1e-9)
    assert math.isclose(float(pen["loss_term"]), 0.02 * want_ref, rel_tol=1e-9)


def test_empty_masks_give_zero_not_nan():
    new, old, ref, mask = _batch(0)
    empty = torch.zeros_like(mask)
    for out in (fw.minimind_approx_kl(new, old, empty)["approx_kl"], fw.minimind_kl_ref_penalty(new, ref, empty)["logged"],
                fw.trl_grpo_kl(new, ref, empty)["logged"], fw.verl_ppo_kl(new, old, empty)["logged"]):
        assert float(out) == 0.0


def test_side_by_side_rows_name_direction_and_agree_with_the_functions():
    new, old, ref, mask = _batch(1)
    rows = fw.side_by_side(new, old, ref, mask, exact_old_policy=torch.rand(B, R, dtype=torch.float64))
    assert {r["framework"] for r in rows} >= {"verl", "OpenRLHF", "TRL GRPO", "TRL PPO", "NeMo-RL", "MiniMind", "exact"}
    by = {(r["framework"], r["logged as"]): r for r in rows}
    assert by[("MiniMind", "approx_kl")]["estimates"] == "KL(π_old‖π_θ)"
    assert by[("verl", "actor/ppo_kl")]["value"] == pytest.approx(_loop_token_mean(old - new, mask))
    for r in rows:
        assert math.isfinite(r["value"])


def test_every_function_names_its_source_file():
    for fn in list(fw.FRAMEWORK_FUNCTIONS.values()) + [fw.openrlhf_compute_approx_kl, fw.nemo_rl_calculate_kl]:
        assert "Source:" in fn.__doc__ and ".py" in fn.__doc__, fn.__name__


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
        fw.trl_grpo_kl(new, ref, mask, use_bias_correction_kl=True)
    with pytest.raises(ValueError, match="loss_type"):
        fw.trl_grpo_kl(new, ref, mask, loss_type="mean")
    with pytest.raises(ValueError, match="generation_logprobs"):
        fw.nemo_rl_kl_loss(new, ref, mask)
    with pytest.raises(ValueError, match="early_stop_kl"):
        fw.minimind_approx_kl(new, old, mask, early_stop_kl=0)
    nan = new.clone()
    nan[0, 0] = float("nan")
    with pytest.raises(ValueError, match="mb_resp_logp"):
        fw.minimind_approx_kl(nan, old, mask)
    with pytest.raises(ValueError, match="log_probs"):
        fw.openrlhf_compute_approx_kl(torch.tensor([1, 2]), ref[0, :2])
