"""``--logged NAME=VALUE``: every formula a framework logs, recomputed exactly on the dump, and matched within
the framework's own floating-point rounding (``klviz.diagnose.identify``).

The logged values here come from ``klviz.frameworks`` (each function follows one framework's source) run in
float32 on float32 inputs, as the frameworks run: each must be identified as its own formula, and values that
are not the formula on this batch (3×, the previous step's, an arbitrary 0.05, one rounding bound off) must not.
"""

from __future__ import annotations

import math

import pytest
import torch

from klviz import diagnose as dg
from klviz import frameworks as fw
from klviz.diagnose import identify as ident


def _batch(seed=0, B=32, T=48, spread=0.4, old_shift=0.3, engine=0.1, dtype=torch.float32):
    """Log-probs of sampled tokens: policy, reference, an older policy and an engine; right padding."""
    g = torch.Generator().manual_seed(seed)
    lp = -torch.empty(B, T).exponential_(1.0, generator=g) - 0.01
    ref = (lp + spread * torch.randn(B, T, generator=g)).clamp(max=-1e-3)
    old = (lp + old_shift * torch.randn(B, T, generator=g)).clamp(max=-1e-3)
    ro = (old + engine * torch.randn(B, T, generator=g)).clamp(max=-1e-3)
    lengths = torch.randint(4, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None] < lengths[:, None]).to(torch.float32)
    return {k: v.to(dtype) for k, v in {"lp": lp, "ref": ref, "old": old, "ro": ro}.items()} | {"m": mask}


def _labels(framework, name):
    return [m.label for m in ident.METRICS if m.framework == framework and m.name == name]


def _logged_cases(b):
    """(name, value the framework logs, the label klviz must name) for one batch with old and rollout log-probs."""
    lp, ref, old, ro, m = b["lp"], b["ref"], b["old"], b["ro"], b["m"]
    f = lambda x: float(x)  # noqa: E731
    cases = [
        ("kl", f(fw.trl_grpo_kl(lp, ref, m, old_per_token_logps=old)["logged"]), "TRL GRPO `kl`: k3 × π/π_old"),
        ("kl", f(fw.trl_grpo_kl(lp, ref, m, use_bias_correction_kl=False)["logged"]), "TRL GRPO `kl`: k3, token"),
        (
            "kl",
            f(fw.trl_grpo_kl(lp, ref, m, old_per_token_logps=old, importance_sampling_level="sequence")["logged"]),
            "TRL GRPO `kl`: k3 × exp(mean",
        ),
        ("objective/kl", f(fw.trl_ppo_kl(old, ref, m, "k1")["logged"]), "TRL PPO `objective/kl`: k1"),
        ("objective/kl", f(fw.trl_ppo_kl(old, ref, m, "k3")["logged"]), "TRL PPO `objective/kl`: k3"),
        ("approxkl", f(fw.trl_ppo_kl(old, ref, m, new_logprobs=lp)["approxkl"]), "TRL PPO `approxkl`"),
        ("actor/kl_loss", f(fw.verl_kl_loss(lp, ref, m)["logged"]), "verl `actor/kl_loss`: kl_penalty low_var_kl"),
        ("actor/ppo_kl", f(fw.verl_ppo_kl(lp, old, m)["logged"]), "verl `actor/ppo_kl`: old − new log-prob (log"),
        (
            "actor/ppo_kl",
            f(fw.verl_ppo_kl(lp, old, m, clamp_log_ratio=False)["logged"]),
            "verl `actor/ppo_kl`: old − new log-prob,",
        ),
        ("actor/reward_kl_penalty", f(fw.verl_kl_in_reward(old, ref, m)["logged"]), "kl_penalty kl of π_old"),
        ("kl_penalty", f(fw.nemo_rl_kl_loss(lp, ref, m)["logged"]), "NeMo-RL `kl_penalty`: k3 (clamps"),
        (
            "kl_penalty",
            f(fw.nemo_rl_kl_loss(lp, ref, m, generation_logprobs=old, use_on_policy_kl_approximation=True)["logged"]),
            "NeMo-RL `kl_penalty`: k3 × π/π_old",
        ),
        ("approx_kl", f(fw.minimind_approx_kl(lp, old, m)["logged"]), "MiniMind `approx_kl`"),
        ("kl_ref", f(fw.minimind_kl_ref_penalty(lp, ref, m)["logged"]), "MiniMind `kl_ref`: k3"),
        ("kl_ref", f(((ref - lp) * m).sum() / m.sum()), "MiniMind `kl_ref`: log π_ref"),
        # verl rollout_corr_helper.compute_offpolicy_metrics: masked means of (rollout - old) and of k3 of old - rollout
        ("rollout_corr/kl", f(((ro - old) * m).sum() / m.sum()), "verl `rollout_corr/kl`"),
        (
            "rollout_corr/k3_kl",
            f(((torch.exp(old - ro) - (old - ro) - 1) * m).sum() / m.sum()),
            "verl `rollout_corr/k3_kl`",
        ),
    ]
    for est in ("k1", "k2", "k3"):
        cases.append(("kl", f(fw.openrlhf_kl(old, ref, m, est)["logged"]), f"OpenRLHF `kl`: {est} clamped to ±10 (π"))
        in_loss = f(fw.openrlhf_kl(lp, ref, m, est, use_kl_loss=True)["logged"])
        cases.append(("kl", in_loss, f"OpenRLHF `kl`: {est} clamped to ±10,"))
    for agg in ("seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"):
        v = f(fw.verl_kl_loss(lp, ref, m, loss_agg_mode=agg)["logged"])
        cases.append(("actor/kl_loss", v, f"low_var_kl (k3, clamps), {agg.replace('-', ' ')}"))
    return cases


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_framework_metric_is_identified_as_itself(seed):
    b = _batch(seed=seed)
    r = dg.rollouts_from_tensors(b["lp"], b["ref"], b["m"], b["old"], rollout_logprob=b["ro"])
    cases = _logged_cases(b)
    d = dg.diagnose(r, logged=[(n, v) for n, v, _ in cases])
    for (name, _value, label), item in zip(cases, d.logged):
        assert item["consistent"], (name, label, item["note"])
        assert any(label in mt for mt in item["matches"]), (label, item["matches"])
        best = min((c for c in item["candidates"] if c["equal"]), key=lambda c: abs(c["difference"]))
        assert abs(best["difference"]) <= best["tolerance"]


def test_wrong_values_are_not_consistent_and_name_the_closest():
    b = _batch(seed=4)
    prev = _batch(seed=5)  # the previous step's batch
    lp, ref, old, m = b["lp"], b["ref"], b["old"], b["m"]
    true = float(fw.trl_grpo_kl(lp, ref, m, old_per_token_logps=old)["logged"])
    previous = float(fw.trl_grpo_kl(prev["lp"], prev["ref"], prev["m"], old_per_token_logps=prev["old"])["logged"])
    r = dg.rollouts_from_tensors(lp, ref, m, old)
    d = dg.diagnose(r, logged=[("kl", true), ("kl", 3 * true), ("kl", previous), ("kl", 0.05)])
    exact, triple, prev_item, arbitrary = d.logged
    assert exact["consistent"] and exact["matches"][0].startswith("TRL GRPO `kl`: k3 × π/π_old")
    for item in (triple, prev_item, arbitrary):
        assert item["consistent"] is False and item["matches"] == []
        c = item["closest"]
        assert set(c) == {"formula", "value", "relative_difference"} and math.isfinite(c["relative_difference"])
        assert "other_batch" in item  # the standard-error reading, for a value from another batch, labelled
    assert triple["other_batch"]["z"] > 3


def test_one_rounding_bound_off_is_not_equal():
    b = _batch(seed=6)
    lp, ref, m = b["lp"], b["ref"], b["m"]
    d = dg.diagnose(dg.rollouts_from_tensors(lp, ref, m), identify=["kl"])
    metric = next(mt for mt in ident.METRICS if mt.name == "kl" and mt.framework == "TRL GRPO" and mt.default)
    ev = ident.evaluate(metric, d.row_terms)
    for factor, equal in ((0.5, True), (1.5, False), (-1.5, False)):
        item = ident.identify("kl", ev.value + factor * ev.bound, d.row_terms, metrics=[metric])
        assert item["consistent"] is equal


def test_the_bound_is_derived_from_dtype_and_terms():
    u = ident.UNIT_ROUNDOFF["float32"]
    assert ident.gamma_tilde(1, u) == 0.0
    small, big = ident.gamma_tilde(100, u), ident.gamma_tilde(1_000_000, u)
    lam = math.sqrt(2 * math.log(2 * 1_000_000 / ident.FAILURE_PROBABILITY))
    assert big == pytest.approx(lam * 1000 * u, rel=1e-3)
    assert 50 < big / small < 150  # ~ sqrt(n), not n
    # bfloat16 arithmetic has a unit roundoff 2^16 times float32's: its bound is that much looser per token
    b = _batch(seed=7)
    f32 = dg.diagnose(dg.rollouts_from_tensors(b["lp"], b["ref"], b["m"]), identify=["kl"])
    bf = dg.diagnose(dg.rollouts_from_tensors(b["lp"].bfloat16(), b["ref"].bfloat16(), b["m"]), identify=["kl"])
    m = next(mt for mt in ident.METRICS if mt.name == "kl" and mt.default)
    assert ident.evaluate(m, bf.row_terms).bound > 1000 * ident.evaluate(m, f32.row_terms).bound


def test_bf16_storage_of_a_float32_computation_widens_the_bound():
    """OpenRLHF upcasts to float32: a bf16-stored dump of its inputs is exact; a bf16 dump of float32 values
    (rounded on saving) is not, and the bound says so through the storage term."""
    b = _batch(seed=8)
    lp, ref, m = b["lp"], b["ref"], b["m"]
    exact = float(fw.openrlhf_kl(lp, ref, m, "k3", use_kl_loss=True)["logged"])
    d = dg.diagnose(dg.rollouts_from_tensors(lp.bfloat16(), ref.bfloat16(), m), logged=[("kl", exact)])
    rt = d.row_terms
    key = next(k for k in rt.terms if k.startswith("ref|policy:k3") and "out" in k)
    assert rt.terms[key].storage.sum() > 0
    assert d.logged[0]["consistent"], d.logged[0]["note"]


def test_micro_batches_make_a_mean_of_token_means():
    """TRL logs the mean over gradient-accumulation micro-batches of each micro-batch's token mean."""
    b = _batch(seed=9, B=16)
    lp, ref, m = b["lp"], b["ref"], b["m"]
    groups = torch.arange(16) // 4
    per_micro = [float(fw.trl_grpo_kl(lp[groups == i], ref[groups == i], m[groups == i])["logged"]) for i in range(4)]
    logged = sum(per_micro) / 4
    whole = float(fw.trl_grpo_kl(lp, ref, m)["logged"])
    assert abs(logged - whole) > 1e-4
    r = dg.rollouts_from_tensors(lp, ref, m)
    d = dg.diagnose(r, logged=[("kl", logged), ("kl", whole)], groups=groups.numpy())
    assert d.logged[0]["consistent"] and not d.logged[1]["consistent"]
    assert dg.diagnose(r, logged=[("kl", whole)]).logged[0]["consistent"]


def test_a_value_typed_with_few_digits_is_not_equal_but_says_why():
    b = _batch(seed=10)
    lp, ref, m = b["lp"], b["ref"], b["m"]
    true = float(fw.trl_grpo_kl(lp, ref, m)["logged"])
    text = f"{true:.3g}"
    d = dg.diagnose(dg.rollouts_from_tensors(lp, ref, m), logged=[("kl", float(text), text)])
    item = d.logged[0]
    assert item["consistent"] is False and item["rounded_input"]
    assert "significant digit" in item["note"]


def test_on_policy_equal_formulas_are_listed_together():
    """Without old_logprob ρ = 1: TRL's three weightings give one number, and the text says it equals all."""
    b = _batch(seed=11)
    lp, ref, m = b["lp"], b["ref"], b["m"]
    true = float(fw.trl_grpo_kl(lp, ref, m)["logged"])
    item = dg.diagnose(dg.rollouts_from_tensors(lp, ref, m), logged=[("kl", true)]).logged[0]
    assert sum(mt.startswith("TRL GRPO") for mt in item["matches"]) == 3
    assert "also equals" in item["note"]


def test_logged_zero_is_openrlhf_without_a_reference():
    b = _batch(seed=12)
    item = dg.diagnose(dg.rollouts_from_tensors(b["lp"], b["ref"], b["m"]), logged=[("kl", 0.0)]).logged[0]
    assert item["consistent"] and "init_coef 0" in " ".join(c["setting"] for c in item["candidates"] if c["equal"])


def test_unknown_name_is_compared_with_every_formula_and_missing_roles_are_named():
    b = _batch(seed=13)
    lp, ref, m = b["lp"], b["ref"], b["m"]
    v = float(fw.verl_kl_loss(lp, ref, m)["logged"])
    d = dg.diagnose(dg.rollouts_from_tensors(lp, ref, m), logged=[("my/kl", v), ("actor/ppo_kl", 0.01)])
    unknown, ppo = d.logged
    assert unknown["consistent"] and unknown["framework"] is None
    assert any("actor/kl_loss" in mt for mt in unknown["matches"])
    assert ppo["consistent"] is None and "old_logprob" in ppo["note"]


def test_match_logged_needs_the_terms():
    b = _batch(seed=14)
    d = dg.diagnose(dg.rollouts_from_tensors(b["lp"], b["ref"], b["m"]))
    with pytest.raises(ValueError, match="identify"):
        dg.match_logged(d, [("kl", 0.1)])


def test_the_json_contract(tmp_path, capsys):
    import json

    from klviz import cli

    b = _batch(seed=15)
    lp, ref, m = b["lp"], b["ref"], b["m"]
    p = dg.save_rollouts(tmp_path / "b.pt", lp, ref, m)
    true = float(fw.trl_grpo_kl(lp, ref, m)["logged"])
    assert cli.main(["diagnose", str(p), "--json", "--logged", f"kl={true!r}", "--logged", "kl=0.05"]) == 0
    items = json.loads(capsys.readouterr().out)["logged"]
    assert {"name", "value", "consistent", "matches", "closest"} <= set(items[0]) and items[0]["closest"] is None
    assert items[0]["consistent"] is True and items[1]["consistent"] is False
    assert set(items[1]["closest"]) == {"formula", "value", "relative_difference"}
    cli.main(["diagnose", str(p), "--logged", f"kl={true!r}"])
    text = capsys.readouterr().out
    assert "kl = " in text and "equals TRL GRPO `kl`: k3 × π/π_old, token mean" in text
