"""Lesson 08 (sampler vs trainer): klviz.mismatch against independent computations, the checks, the panel."""

from __future__ import annotations

import copy
import itertools
import math
from dataclasses import replace

import numpy as np
import pytest
import torch

import klviz
from klviz import lm
from klviz import mismatch as mm
from klviz.check import lesson08 as ch


@pytest.fixture(scope="module")
def trainer():
    return lm.load_tiny_lm("old")


@pytest.fixture(scope="module")
def prompts():
    return [p for p in lm.PROMPTS for _ in range(4)]


# -- sampling masks and the kept mass ----------------------------------------------------------
def test_sampling_mask_matches_a_hand_computation():
    p = torch.tensor([0.5, 0.25, 0.15, 0.1], dtype=torch.float64)
    logp = p.log()
    assert mm.sampling_mask(logp, top_p=0.7).tolist() == [True, True, False, False]  # 0.5 < 0.7 ≤ 0.75
    assert mm.sampling_mask(logp, top_p=0.75).tolist() == [True, True, False, False]  # reached exactly
    assert mm.sampling_mask(logp, top_p=0.76).tolist() == [True, True, True, False]
    assert mm.sampling_mask(logp, top_p=0.1).tolist() == [True, False, False, False]  # top token always kept
    assert mm.sampling_mask(logp, top_k=3).tolist() == [True, True, True, False]
    assert mm.sampling_mask(logp, top_k=3, top_p=0.6).tolist() == [True, True, False, False]  # renormalised over k
    assert abs(float(mm.kept_mass_of(logp, mm.sampling_mask(logp, top_p=0.7))) - 0.75) < 1e-12


def test_engine_distribution_is_the_renormalised_truncation():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(5, 11, generator=g)
    spec = mm.EngineSpec(temperature=0.7, top_p=0.8)
    logp, keep, mass = mm.engine_logprobs(logits, spec)
    tempered = torch.softmax(logits.double() / 0.7, -1)
    for row in range(5):
        order = tempered[row].argsort(descending=True)
        cum, kept = 0.0, []
        for i in order.tolist():
            if cum >= 0.8:
                break
            kept.append(i)
            cum += float(tempered[row, i])
        assert sorted(kept) == keep[row].nonzero().flatten().tolist()
        assert abs(float(mass[row]) - cum) < 1e-5
        expected = tempered[row] / cum
        assert torch.allclose(logp[row, keep[row]].exp().double(), expected[keep[row]], atol=1e-5)
    assert bool(torch.isinf(logp[~keep]).all())


def test_engine_spec_and_arguments_are_validated(trainer):
    with pytest.raises(ValueError, match="precision"):
        mm.EngineSpec("int8")
    with pytest.raises(ValueError, match="top_p"):
        mm.EngineSpec(top_p=0.0)
    with pytest.raises(ValueError, match="temperature"):
        mm.EngineSpec(temperature=-1.0)
    with pytest.raises(ValueError, match="top_k"):
        mm.EngineSpec(top_k=-2)
    with pytest.raises(ValueError, match="generator"):
        mm.sample_engine(trainer, ["the cat"], 0)
    with pytest.raises(ValueError, match="method"):
        mm.correction_weights(torch.zeros(1, 2), torch.ones(1, 2, dtype=torch.bool), "seq")
    with pytest.raises(ValueError, match="train_logprob"):
        mm.mismatch_metrics(torch.zeros(2, 3), torch.zeros(2, 4))
    with pytest.raises(ValueError, match="mask"):
        mm.mismatch_metrics(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 3))


# -- engines of the tiny LM --------------------------------------------------------------------
def test_float32_engine_is_the_trainer(trainer, prompts):
    er = mm.sample_engine(trainer, prompts, klviz.make_generator(0), mm.EngineSpec(), 24)
    ro = lm.sample_rollouts(trainer, prompts, klviz.make_generator(0), max_new_tokens=24)
    assert torch.equal(er.rollouts.input_ids, ro.input_ids)  # the same sampler as lm's
    tl = mm.trainer_logprobs(trainer, er)
    assert torch.allclose(tl, lm.logprobs_of(trainer, ro), atol=1e-6)
    assert float((tl - er.engine_logprob).abs().max()) < 1e-5


def test_top_p_ratio_is_the_kept_mass_and_replay_removes_it(trainer, prompts):
    er = mm.sample_engine(trainer, prompts, klviz.make_generator(1), mm.EngineSpec(top_p=0.8), 24)
    tl = mm.trainer_logprobs(trainer, er)
    ratio = torch.exp(tl - er.engine_logprob)[er.mask]
    assert torch.allclose(ratio, er.kept_mass[er.mask], atol=1e-5)  # per token, exactly S
    assert float(er.kept_mass[er.mask].min()) < 0.9
    replay = mm.trainer_logprobs(trainer, er, replay_mask=True)
    assert float((replay - er.engine_logprob)[er.mask].abs().max()) < 1e-5
    # independent: renormalise the trainer's full distribution by hand at one position
    b, t = (er.mask & (er.kept_mass < 0.95)).nonzero()[0].tolist()
    full = lm.next_token_logprobs(trainer, er.rollouts)[b, t].double().exp()
    keep = er.keep[b, t]
    tok = int(er.rollouts.input_ids[b, t])
    assert abs(math.log(full[tok] / full[keep].sum()) - float(replay[b, t])) < 1e-5


def test_bf16_and_temperature_engines_keep_the_mean_ratio_at_one(trainer, prompts):
    for spec, temperature in ((mm.EngineSpec("bfloat16"), 1.0), (mm.EngineSpec(temperature=0.8), 0.8)):
        er = mm.sample_engine(trainer, prompts * 3, klviz.make_generator(2), spec, 32)
        m = mm.mismatch_metrics(mm.trainer_logprobs(trainer, er), er.engine_logprob, er.mask)
        assert abs(m["mean_ratio"] - 1) < 4 * m["mean_ratio_se"]
        assert m["k3"] > 4 * m["k3_se"] > 0
        fixed = mm.trainer_logprobs(trainer, er, temperature=temperature)
        if temperature != 1:
            assert float((fixed - er.engine_logprob)[er.mask].abs().max()) < 1e-5


def test_batch_invariance_reports_differences(trainer, prompts):
    ro = lm.sample_rollouts(trainer, prompts, klviz.make_generator(3), max_new_tokens=16)
    out = mm.batch_invariance(trainer, ro, "float32")
    assert set(out) == {"batch_vs_row", "batch_vs_decode", "tokens"} and out["tokens"] == int(ro.response_mask.sum())
    assert 0.0 <= out["batch_vs_row"] < 1e-4 and 0.0 <= out["batch_vs_decode"] < 1e-4


# -- metrics -------------------------------------------------------------------------------------
def test_mismatch_metrics_against_direct_formulas():
    g = torch.Generator().manual_seed(8)
    eng = -torch.rand(5, 7, generator=g, dtype=torch.float64) * 3
    tr = eng + 0.2 * torch.randn(5, 7, generator=g, dtype=torch.float64)
    mask = torch.arange(7)[None] < torch.tensor([7, 3, 5, 1, 6])[:, None]
    m = mm.mismatch_metrics(tr, eng, mask)
    d = (tr - eng)[mask]
    assert abs(m["k1"] - float(-d.mean())) < 1e-12
    assert abs(m["k3"] - float((d.exp() - 1 - d).mean())) < 1e-12
    assert abs(m["k2"] - float((0.5 * d * d).mean())) < 1e-12
    assert abs(m["mean_ratio"] - float(d.exp().mean())) < 1e-12
    assert abs(m["chi2_token"] - float((d.exp() ** 2).mean() - 1)) < 1e-12
    seq = [(tr - eng)[b][mask[b]] for b in range(5)]
    assert abs(m["chi2_seq"] - (sum(math.exp(2 * float(s.sum())) for s in seq) / 5 - 1)) < 1e-12
    assert abs(m["seq_sum_k1"] - sum(float(-s.sum()) for s in seq) / 5) < 1e-12
    assert abs(m["seq_max_k3"] - sum(float((s.exp() - 1 - s).max()) for s in seq) / 5) < 1e-12
    # verl's ppl_ratio: the mean over responses of each one's ratio (compute_offpolicy_metrics), not exp of the mean
    assert abs(m["ppl_ratio"] - sum(math.exp(float(-s.mean())) for s in seq) / 5) < 1e-12
    assert abs(m["token_mult_prob_error"] - float(d.abs().exp().mean())) < 1e-12
    assert m["tokens"] == int(mask.sum()) and m["sequences"] == 5


# -- corrections ---------------------------------------------------------------------------------
def test_correction_weights_by_hand():
    lr = torch.tensor([[math.log(3.0), math.log(0.5), 0.0], [math.log(1.5), math.log(1.5), 9.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True, True], [True, True, False]])
    w = lambda m, **k: mm.correction_weights(lr, mask, m, **k)  # noqa: E731
    f64 = lambda rows: torch.tensor(rows, dtype=torch.float64)  # noqa: E731
    assert torch.allclose(w("token_tis", cap=2.0), f64([[2.0, 0.5, 1.0], [1.5, 1.5, 0.0]]))
    assert torch.allclose(w("token_mask", band=(0.6, 2.0)), f64([[0, 0, 1.0], [1.5, 1.5, 0]]))
    assert torch.allclose(w("sequence_is"), torch.tensor([[1.5] * 3, [2.25, 2.25, 0]], dtype=torch.float64))
    assert torch.allclose(w("sequence_tis", cap=2.0), torch.tensor([[1.5] * 3, [2.0, 2.0, 0]], dtype=torch.float64))
    # geometric means: (1.5)^(1/3) ≈ 1.145 and 1.5: a band (0.8, 1.2) keeps the first response only
    assert torch.allclose(w("geo_reject", band=(0.8, 1.2)), f64([[3.0, 0.5, 1.0], [0, 0, 0]]))
    big = torch.full((1, 4), 10.0, dtype=torch.float64)
    assert float(mm.correction_weights(big, torch.ones(1, 4, dtype=torch.bool), "sequence_is")[0, 0]) == math.exp(20.0)


def test_exact_stats_against_brute_force():
    pair = mm.MarkovPair.make("noise", 0.5, vocab=3, seed=1)
    T = 4
    tp, ep = pair.train_logp.exp(), pair.engine_logp.exp()
    truth = mean_none = mean_seq = 0.0
    sq_seq = 0.0
    for seq in itertools.product(range(3), repeat=T):
        prev, p, q, gsum = 3, 1.0, 1.0, 0.0
        for tok in seq:
            p *= float(tp[prev, tok])
            q *= float(ep[prev, tok])
            gsum += float(pair.g[tok])
            prev = tok
        truth += p * gsum
        mean_none += q * gsum
        mean_seq += q * (p / q) * gsum
        sq_seq += q * ((p / q) * gsum) ** 2
    none = mm.exact_correction_stats(pair, T, "none")
    seq_is = mm.exact_correction_stats(pair, T, "sequence_is")
    assert abs(none["truth"] - truth) < 1e-12 and abs(none["mean"] - mean_none) < 1e-12
    assert abs(seq_is["mean"] - truth) < 1e-12 and abs(seq_is["bias"]) < 1e-12
    assert abs(seq_is["std"] - math.sqrt(sq_seq - mean_seq**2)) < 1e-10
    tok = mm.exact_correction_stats(pair, T, "token_tis", cap=1e9)
    assert abs(tok["bias"]) > 1e-4  # token-level IS: prefix mismatch biases it


def test_sequence_weight_moments_against_enumeration():
    for kind, s in (("noise", 0.4), ("temperature", 0.8), ("top_p", 0.8)):
        pair = mm.MarkovPair.make(kind, s)
        for T in (1, 3, 5):
            tr, en, _ = pair.enumerate(T)
            q = en.sum(-1).exp()
            ok = q > 0
            w = torch.exp(tr.sum(-1) - en.sum(-1))[ok]
            mom = mm.sequence_weight_moments(pair, T)
            assert abs(mom["E_W"] - float((q[ok] * w).sum())) < 1e-10
            assert abs(mom["E_W2"] - float((q[ok] * w * w).sum())) < 1e-10
            assert abs(mom["kl_seq"] - float((q[ok] * (en.sum(-1) - tr.sum(-1))[ok]).sum())) < 1e-10
        if kind != "top_p":
            assert abs(mm.sequence_weight_moments(pair, 7)["E_W"] - 1) < 1e-10
        else:
            assert mm.sequence_weight_moments(pair, 7)["E_W"] < 1


def test_log_weight_clamp_rate():
    rate = mm.log_weight_clamp_rate(-0.05, 1e-6, torch.tensor([100.0, 399.0, 401.0, 1000.0]))
    assert rate.tolist()[0] < 1e-6 and rate.tolist()[1] < 0.01 and rate.tolist()[2] > 0.99
    sd = mm.log_weight_clamp_rate(0.0, 1.0, 400)  # log W ~ N(0, 400): P(|Z| > 1) two-sided
    assert abs(float(sd) - math.erfc(1 / math.sqrt(2))) < 1e-9


# -- checks fed typical wrong answers ----------------------------------------------------------
def test_policy_pairs_check():
    good = dict(ch.LOGGED_NUMBERS)
    assert ch.policy_pairs(lambda: good)
    assert not ch.policy_pairs(lambda: ...).attempted
    swapped = {**good, "rollout_corr/kl": ("old", "rollout")}
    assert "swapped" in ch.policy_pairs(lambda: swapped).message
    assumed = {**good, "actor/ppo_kl": ("rollout", "theta")}
    r = ch.policy_pairs(lambda: assumed)
    assert not r and "ppo_kl" in r.message
    assert not ch.policy_pairs(lambda: {"rollout_corr/kl": ("rollout", "old")})
    assert not ch.policy_pairs(lambda: {**good, "gen_kl_error": ("engine", "old")})
    assert not ch.policy_pairs(lambda: 3)
    assert not ch.policy_pairs(lambda: 1 / 0)


def test_kept_mass_check():
    def right(logp, top_p):
        p = logp.exp().sort(descending=True).values
        return float(p[(p.cumsum(0) - p) < top_p].sum())

    assert ch.kept_mass(right)
    assert "not top_p" in ch.kept_mass(lambda logp, top_p: top_p).message
    assert "1/S" in ch.kept_mass(lambda logp, top_p: 1 / right(logp, top_p)).message
    assert "1 − S" in ch.kept_mass(lambda logp, top_p: 1 - right(logp, top_p)).message

    def early(logp, top_p):
        p = logp.exp().sort(descending=True).values
        return float(p[p.cumsum(0) <= top_p + 1e-12].sum())

    assert "early" in ch.kept_mass(early).message
    assert not ch.kept_mass(lambda logp, top_p: "S")
    assert not ch.kept_mass(lambda logp, top_p: ...).attempted


def test_paired_difference_check():
    import math

    def right(a, b):
        d = a - b
        return float(d.mean()), float(d.std()) / math.sqrt(len(d))

    assert ch.paired_difference(right)
    assert (
        "independent"
        in ch.paired_difference(
            lambda a, b: (float((a - b).mean()), math.sqrt(float(a.var() + b.var()) / len(a)))
        ).message
    )
    assert "Sign" in ch.paired_difference(lambda a, b: (float((b - a).mean()), 0.1)).message
    assert "sqrt(n)" in ch.paired_difference(lambda a, b: (float((a - b).mean()), float((a - b).std()))).message
    assert not ch.paired_difference(lambda a, b: 1.0)
    assert not ch.paired_difference(lambda a, b: ...).attempted


def test_tis_weights_check():
    assert ch.tis_weights(lambda t, r, c: torch.exp(t - r).clamp(max=c))
    assert "inverted" in ch.tis_weights(lambda t, r, c: torch.exp(r - t).clamp(max=c)).message
    assert "below" in ch.tis_weights(lambda t, r, c: torch.exp(t - r).clamp(min=1 / c, max=c)).message
    assert (
        "sequence"
        in ch.tis_weights(lambda t, r, c: torch.exp((t - r).sum(-1, keepdim=True)).clamp(max=c).expand_as(t)).message
    )
    assert "inf" in ch.tis_weights(lambda t, r, c: torch.exp(t - r)).message or not ch.tis_weights(
        lambda t, r, c: torch.exp(t - r)
    )
    assert not ch.tis_weights(lambda t, r, c: torch.zeros(2))
    assert not ch.tis_weights(lambda t, r, c: ...).attempted


# -- the panel -----------------------------------------------------------------------------------
def test_panel_driven_in_code():
    from klviz.widgets.lesson08 import EngineMismatchPanel

    panel = EngineMismatchPanel(repeats=2, max_new_tokens=24)
    assert panel.last_error is None and "klviz-lesson08" in panel.widget._dom_classes
    a = panel.set(precision="float32", top_p=0.8, trainer="recompute as is", correction="none")
    assert panel.last_error is None
    assert abs(a["metrics"]["mean_ratio"] - a["kept_mass"]) < 1e-5 and a["kept_mass"] < 1
    b = panel.set(trainer="replay the sampling mask")
    assert abs(b["metrics"]["mean_ratio"] - 1) < 1e-5 and b["metrics"]["k3"] < 1e-9
    c = panel.set(precision="float32", top_p=1.0, trainer="recompute as is")
    assert c["metrics"]["abs_diff_max"] < 1e-5 and c["kept_mass"] == 1.0
    d = panel.set(precision="bfloat16", top_p=0.7, correction="geo_reject", cap=1.2)
    assert 0.0 <= d["seq_changed_fraction"] <= 1.0 and 0 < d["ess"] <= 1.0
    e = panel.set(correction="token_tis", cap=1.2)
    assert e["token_changed_fraction"] == 0.0  # top-p ratios are ≤ 1: a cap above 1 never binds
    assert "mean ratio" in panel.readout.value
    panel.controls["correction"].value = "sequence_tis"  # as a reader's control does
    assert panel.last["correction"] == "sequence_tis" and panel.last_error is None


# -- training through a mismatched engine (lesson 08, section 6) ----------------------------------
TINY = {"steps": 2, "prompts": 2, "group_size": 6, "max_new_tokens": 24}  # some responses end: advantages are not all 0


def test_lab_engine_and_correction_options_are_validated():
    from klviz.rlhf import LabConfig

    for kw, name in (({"engine": "vllm"}, "engine"), ({"correction": "tis"}, "correction")):
        with pytest.raises(ValueError, match=name):
            LabConfig(**kw)


def test_a_correction_changes_nothing_without_a_mismatch_and_something_with_one():
    from klviz.rlhf import LabConfig, train_policy

    def params(**kw):
        h = train_policy(LabConfig(placement="k3 in loss", **TINY, **kw))
        return torch.cat([p.detach().flatten() for p in h.policy.parameters()]), h

    plain, h0 = params()
    tis, h1 = params(correction="token_tis")  # the trainer samples itself: every ratio is 1
    assert max(h0.metrics["mismatch_kl"]) < 1e-9  # the sampler's log-probs are the recompute's, up to rounding
    assert torch.allclose(plain, tis, rtol=0, atol=1e-6)  # so the weights are 1 up to rounding
    hot_none, h2 = params(engine="T=0.7")
    hot_tis, h3 = params(engine="T=0.7", correction="token_tis")
    assert not torch.equal(hot_none, hot_tis)  # same batches, reweighted gradient
    assert h2.metrics["reward"][0] == h3.metrics["reward"][0]  # the first batch is the same: only the update differs
    assert min(h2.metrics["mismatch_kl"]) > 1e-3  # T = 0.7 not divided out: a large mismatch
    _, h4 = params(engine="T=0.7", correction="token_mask")
    assert max(h4.metrics["rejected_tokens"]) > 0  # the band [0.5, 2] drops some tokens
    _, h5 = params(engine="top-p 0.8", correction="keep_mask")
    assert max(h5.metrics["mismatch_kl"]) < 1e-12  # the replayed mask: trainer and engine agree
    _, h6 = params(engine="bf16")
    assert 0 < max(h6.metrics["mismatch_kl"]) < 1e-3  # bf16 rounding: small but not zero


def test_engine_weights_follow_the_training_policy():
    from klviz import mismatch as mm

    model = lm.load_tiny_lm("old")
    policy = copy.deepcopy(model)
    eng = mm.engine_model(policy, "bfloat16")
    first = next(iter(eng.parameters())).detach().clone()
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.5)
    assert torch.equal(next(iter(mm.engine_model(policy, "bfloat16").parameters())), first)  # a stale copy
    synced = next(iter(mm.engine_model(policy, "bfloat16", sync=True).parameters()))
    assert torch.equal(synced, next(iter(policy.parameters())).to(torch.bfloat16))


def test_stored_mismatch_runs_match_their_configs_and_lesson_07():
    from klviz import rlhf

    assert rlhf.MISMATCH_SEEDS_PATH.stat().st_size < 1024 * 1024
    data = rlhf.load_lab_seeds(rlhf.MISMATCH_SEEDS_PATH)
    assert data.configs == rlhf.MISMATCH_SEED_CONFIGS and data.seeds == rlhf.MISMATCH_SEEDS
    assert data.metric_names == rlhf.MISMATCH_SEED_METRICS
    for name, cfg in rlhf.MISMATCH_SEED_CONFIGS.items():
        for m in rlhf.MISMATCH_SEED_METRICS:
            assert data.metrics[name][m].shape == (len(rlhf.MISMATCH_SEEDS), cfg.steps), (name, m)
            assert np.isfinite(data.metrics[name][m]).all(), (name, m)
    # the trainer sampling itself is lesson 07's "on · k3 in loss", run for run, on the seeds they share
    lab = rlhf.load_lab_seeds()
    assert rlhf.MISMATCH_SEED_CONFIGS["trainer · none"] == rlhf.LAB_SEED_CONFIGS["on · k3 in loss"]
    shared = [data.seeds.index(s) for s in lab.seeds]
    assert len(shared) == len(lab.seeds) == len(data.seeds) == 16
    for m in ("reward", "true_kl", "entropy"):
        assert np.array_equal(data.metrics["trainer · none"][m][shared], lab.metrics["on · k3 in loss"][m]), m
    # what the stored runs say follows from the configs: no mismatch after replaying the mask, the same
    # numbers for the two weightings that never bind under top-p (ratios S < 1, geometric mean in band)
    assert data.metrics["top-p 0.8 · keep_mask"]["mismatch_kl"].max() < 1e-12
    assert np.array_equal(
        data.metrics["top-p 0.8 · token_tis"]["reward"], data.metrics["top-p 0.8 · geo_reject"]["reward"]
    )
    assert data.same_runs("top-p 0.8 · token_tis", "top-p 0.8 · geo_reject")
    assert not data.same_runs("top-p 0.8 · token_tis", "top-p 0.8 · none")
    name = "T=0.7 · token_tis"
    want = data.final(name, "trainer_reward") - 0.2 * data.final(name, "trainer_true_kl")
    assert np.array_equal(data.score(name), want)
    served = data.final(name, "reward") - 0.2 * data.final(name, "engine_true_kl")
    assert np.array_equal(data.score(name, policy="engine"), served)
    # the trainer sampling itself serves its own policy: both scores are one
    assert np.array_equal(data.score("trainer · none"), data.score("trainer · none", policy="engine"))


def test_stored_mismatch_run_reproduces():
    from klviz import rlhf

    data = rlhf.load_lab_seeds(rlhf.MISMATCH_SEEDS_PATH)
    name = "T=0.7 · token_tis"
    h = rlhf.train_policy(replace(rlhf.MISMATCH_SEED_CONFIGS[name], seed=1))
    gaps = data.reproduction_gaps(name, h.metrics, seed=1)
    assert max(gaps.values()) <= 1, gaps


def test_training_panel_reads_the_store_and_trains_a_live_seed():
    from klviz import rlhf
    from klviz.widgets.lesson08 import MismatchTrainingPanel

    panel = MismatchTrainingPanel()
    assert panel.last_error is None and "klviz-lesson08-training" in panel.widget._dom_classes
    d = panel.set(engine="T=0.7", correction="token_tis", live="stored seeds only")
    c = panel.store.compare("T=0.7 · token_tis", "T=0.7 · none", "trainer_reward")
    f = d["finals"]["trainer_reward"]
    assert f["this"] == (c["a"], c["a_se"]) and f["diff"] == (c["diff"], c["diff_se"])
    assert f"{c['a']:.3f}" in panel.readout.value
    assert ("resolved" in panel.readout.value) or ("within noise" in panel.readout.value)
    assert "0 in both" in panel.readout.value  # TIS gives no token weight 0, nor does no correction
    mean, _se = d["curves"]["kl"]
    assert np.allclose(mean, panel.store.metrics["T=0.7 · token_tis"]["true_kl"].mean(0))
    e = panel.set(engine="top-p 0.8", correction="keep_mask")
    assert "mask replayed" in panel.axes[2].get_title() and e["live"] is None
    first_live = len(rlhf.MISMATCH_SEEDS)  # the live seeds are beyond the stored ones
    g = panel.set(engine="bf16", correction="none", live=f"+ seed {first_live}, trained here")  # in the foreground
    assert panel.last_error is None and g["live_seed"] == first_live and len(g["live"]["reward"]) == panel.steps
    assert f"live seed {first_live}" in panel.readout.value
    again = rlhf.trained_history(replace(rlhf.MISMATCH_SEED_CONFIGS["bf16 · none"], seed=first_live), "cpu")
    assert again is not None and again.metrics["reward"] == list(g["live"]["reward"])
    with pytest.raises(ValueError, match="engine"):
        panel._config("fp8", "none")
    with pytest.raises(ValueError, match="correction"):
        panel._config("bf16", "icepop")


def test_training_panel_refuses_bad_settings_naming_the_control():
    from klviz.widgets.lesson08 import MismatchTrainingPanel

    panel = MismatchTrainingPanel()
    for kw, name in (
        ({"engine": "trainer"}, "engine"),
        ({"correction": "sequence_is"}, "correction"),
        ({"live": 8}, "live"),
    ):
        with pytest.raises(ValueError, match=f"^{name} must be one of"):
            panel.set(**kw)
    assert panel.last_error is None  # the panel itself still shows its last good setting


def test_background_runs_are_stopped_at_exit():
    """A daemon thread inside torch at interpreter exit aborts the process; the exit hook stops runs first."""
    from klviz.widgets import base
    from klviz.widgets.lesson08 import MismatchTrainingPanel

    panel = MismatchTrainingPanel()
    panel.controls["live"].value = "+ seed 18, trained here"  # as a reader's control: trains in the background
    run = panel.background_run
    assert run is not None and run.active and run in base._RUNNING
    base._stop_background_runs(timeout=10)
    assert not run.thread.is_alive() and not run.current
