"""Lesson 07: the mini RLHF lab's training loop, its panel and the exercise checks (short runs only)."""

from __future__ import annotations

import math
import time
from dataclasses import replace

import matplotlib
import numpy as np

matplotlib.use("agg")

import pytest
import torch

import klviz
from klviz import lm
from klviz.check import lesson07 as check07
from klviz.rlhf import METRICS, PLACEMENTS, LabConfig, train_policy

SMALL = {"steps": 3, "prompts": 2, "group_size": 6, "max_new_tokens": 20}


def _run(placement: str, **kw):
    return train_policy(LabConfig(placement=placement, **{**SMALL, **kw}))


def test_config_validation_names_the_argument():
    for kw, name in (
        ({"placement": "k4 in loss"}, "placement"),
        ({"steps": 0}, "steps"),
        ({"beta": -0.1}, "beta"),
        ({"beta": float("nan")}, "beta"),
        ({"lr": 0.0}, "lr"),
        ({"epochs": 0}, "epochs"),
        ({"early_stop_kl": -1.0}, "early_stop_kl"),
        ({"clip": 1.5}, "clip"),
        ({"group_size": 1.5}, "group_size"),
        ({"seed": 1.5}, "seed"),
    ):
        with pytest.raises(ValueError, match=name):
            LabConfig(**kw)


def test_run_is_reproducible_and_starts_at_the_reference():
    a, b = _run("k1 in reward"), _run("k1 in reward")
    assert a.metrics == b.metrics
    assert a.samples == b.samples
    for name in METRICS:
        assert len(a.metrics[name]) == SMALL["steps"]
        assert all(math.isfinite(v) for v in a.metrics[name])
    # step 0 samples from a copy of the reference: the true KL and k1's report are exactly 0
    assert a.metrics["true_kl"][0] == pytest.approx(0.0, abs=1e-6)
    assert a.metrics["reported_kl"][0] == pytest.approx(0.0, abs=1e-6)
    assert a.metrics["true_kl"][-1] > 0


def test_identical_on_policy_gradients_give_identical_runs():
    runs = {p: _run(p) for p in ("k2 in loss", "k3+ in loss", "k3·ρ in loss")}
    base = runs["k2 in loss"].metrics
    for p in ("k3+ in loss", "k3·ρ in loss"):
        for name in ("reward", "true_kl", "entropy"):
            assert runs[p].metrics[name] == pytest.approx(base[name], rel=1e-4, abs=1e-6), (p, name)
    # with beta = 0 every placement is the same run as no penalty
    none = _run("none", beta=0.0).metrics
    for p in ("k1 in reward", "k3 in loss"):
        assert _run(p, beta=0.0).metrics["true_kl"] == pytest.approx(none["true_kl"], rel=1e-5, abs=1e-7)


def test_early_stopping_epochs_and_callback():
    seen = []
    h = train_policy(
        LabConfig(placement="k3 in loss", epochs=3, early_stop_kl=1e-12, **SMALL),
        callback=lambda step, hist: seen.append((step, len(hist.metrics["reward"]))),
    )
    assert h.metrics["epochs_run"] == [1.0] * SMALL["steps"]
    assert seen == [(i, i + 1) for i in range(SMALL["steps"])]
    h3 = train_policy(LabConfig(placement="k3 in loss", epochs=3, **SMALL))
    assert h3.metrics["epochs_run"] == [3.0] * SMALL["steps"]
    assert all(v > 0 for v in h3.metrics["approx_kl"])


def test_custom_reward_and_policy():
    calls = []

    def count_a(texts, finished):
        calls.append(len(texts))
        return torch.tensor([float(t.count("a")) for t in texts])

    policy = lm.load_tiny_lm("old")
    h = train_policy(LabConfig(placement="k1 in reward", **SMALL), policy=policy, reward_fn=count_a)
    assert calls == [SMALL["prompts"] * SMALL["group_size"]] * SMALL["steps"]
    assert h.metrics["true_kl"][0] > 0  # "old" already differs from the reference
    assert h.policy is not policy  # the caller's model is not modified
    assert all(p.requires_grad is False for p in policy.parameters())


def test_all_placements_run():
    for p in PLACEMENTS:
        h = train_policy(LabConfig(placement=p, **{**SMALL, "steps": 2}))
        assert all(math.isfinite(h.last(m)) for m in METRICS), p
        assert h.summary()["placement"] == p


def test_runs_on_the_default_device():
    # the GPU when there is one, else the CPU: the same code path a lesson takes
    h = train_policy(LabConfig(placement="k1 in reward", **SMALL), device=klviz.default_device())
    assert all(math.isfinite(v) for v in h.metrics["true_kl"])


def test_a_run_continued_in_pieces_is_the_run_trained_at_once():
    from klviz.rlhf import TrainingRun

    cfg = LabConfig(placement="k3 in loss", epochs=2, early_stop_kl=0.01, **SMALL)
    whole = train_policy(cfg)
    run = TrainingRun(cfg)
    run.advance(1)
    run.advance(SMALL["steps"] - 1)
    assert run.history.metrics == whole.metrics and run.history.samples == whole.samples
    short = train_policy(LabConfig(placement="k3 in loss", epochs=2, early_stop_kl=0.01, **{**SMALL, "steps": 2}))
    prefix = run.prefix(2)
    assert prefix.metrics == short.metrics and prefix.config == short.config
    assert len(run.seconds) == SMALL["steps"] and prefix.seconds == run.seconds[1]
    with pytest.raises(ValueError, match="steps"):
        run.prefix(SMALL["steps"] + 1)
    with pytest.raises(ValueError, match="steps"):
        run.advance(0)


def test_lab_history_trains_only_new_steps(monkeypatch):
    from klviz.rlhf import TrainingRun, lab_history

    trained = []
    advance = TrainingRun._advance

    def counting(self, steps, callback):
        trained.append(steps)
        return advance(self, steps, callback)

    monkeypatch.setattr(TrainingRun, "_advance", counting)
    base = {**SMALL, "steps": 2}
    cfg = LabConfig(placement="k2 in loss", seed=11, **base)
    h2 = lab_history(cfg)
    h3 = lab_history(LabConfig(placement="k2 in loss", seed=11, **{**base, "steps": 3}))
    h1 = lab_history(LabConfig(placement="k2 in loss", seed=11, **{**base, "steps": 1}))
    assert trained == [2, 1]  # 2 steps, then 1 more; the 1-step run is a prefix
    assert h3.metrics["reward"][:2] == h2.metrics["reward"] and h1.metrics["reward"] == h2.metrics["reward"][:1]
    assert h1.metrics == train_policy(LabConfig(placement="k2 in loss", seed=11, **{**base, "steps": 1})).metrics


# ---------------------------------------------------------------- panel
def test_lab_panel_defaults_and_extremes(monkeypatch):
    from klviz import rlhf
    from klviz.widgets.lesson07 import RLHFLabPanel

    panel = RLHFLabPanel(steps=5, prompts=2, group_size=6, max_new_tokens=20)
    assert panel.last_error is None
    first = panel.readout.value
    assert "klviz-final-kl" in first
    panel.set(placement="k3 in loss", beta=1.0, epochs=4, early_stop_kl=0.2, seed=3)
    assert panel.last_error is None and panel.readout.value != first
    panel.set(placement="none", beta=0.0, epochs=1, early_stop_kl=0.0, steps=5)
    assert panel.last_error is None
    for p in ("k3·ρ in loss", "k1 in loss"):
        panel.set(placement=p)
        assert panel.last_error is None, p
        assert all(math.isfinite(float(v[-1])) for v in panel.last["metrics"].values())
    # a setting already trained comes back from the cache: no training step runs for it
    panel.set(placement="k1 in reward")
    steps = []
    real_advance = rlhf.TrainingRun._advance
    monkeypatch.setattr(rlhf.TrainingRun, "_advance", lambda self, n, cb: steps.append(n) or real_advance(self, n, cb))
    panel.set(placement="k3·ρ in loss")
    panel.set(placement="k1 in reward")
    assert steps == [] and panel.last["config"].placement == "k1 in reward"


@pytest.fixture
def no_runs_trained(monkeypatch):
    """The training-run caches empty for the test (restored after): a run another test trained in this
    process (test_panel_close's β = 0.35) would not train again, in the background or at all."""
    from klviz import rlhf

    monkeypatch.setattr(rlhf, "_RUNS", {})
    monkeypatch.setattr(rlhf, "_RESUMABLE", {})


def test_lab_panel_trains_in_the_background_when_a_control_moves(no_runs_trained):
    import threading

    from klviz.widgets.lesson07 import RLHFLabPanel

    panel = RLHFLabPanel(steps=5, prompts=2, group_size=6, max_new_tokens=20)
    threads = threading.active_count()
    panel.controls["beta"].value = 0.35  # what the reader's slider does
    assert panel.training is not None and panel.training.beta == 0.35
    assert "klviz-training" in panel.readout.value and "β = 0.35" in panel.readout.value
    assert "training step" in panel.status.value
    panel.controls["beta"].value = 0.4  # a newer setting replaces the run still training
    panel.wait(timeout=60)
    assert panel.training is None and panel.last_error is None
    assert panel.last["config"].beta == 0.4 and "klviz-final-kl" in panel.readout.value
    deadline = time.time() + 10
    while threading.active_count() > threads and time.time() < deadline:
        time.sleep(0.05)  # the replaced run stops after its current step
    assert threading.active_count() == threads
    # code asks for a result: set() trains in the foreground and returns with it
    panel.controls["beta"].value = 0.45
    last = panel.set(beta=0.5)
    assert panel.training is None and last["config"].beta == 0.5 and "klviz-final-kl" in panel.readout.value
    panel.wait(timeout=60)
    assert panel.last["config"].beta == 0.5  # the stopped background run did not overwrite it


def test_a_run_replaced_before_it_starts_never_trains(monkeypatch):
    """A reader walking a slider starts one training run, at the position where they stop."""
    import klviz.widgets.lesson07 as lesson07
    from klviz.widgets.base import BACKGROUND_START_S

    panel = lesson07.RLHFLabPanel(steps=5, prompts=2, group_size=6, max_new_tokens=20)
    trained: list[float] = []
    real = lesson07.lab_history

    def counted(cfg, *args, **kwargs):
        trained.append(cfg.beta)
        return real(cfg, *args, **kwargs)

    monkeypatch.setattr(lesson07, "lab_history", counted)
    t0 = time.perf_counter()
    for beta in (0.55, 0.6, 0.65):
        panel.controls["beta"].value = beta  # each answered at once, marked as training
        assert "β = " + f"{beta:g}" in panel.readout.value
    assert time.perf_counter() - t0 < BACKGROUND_START_S  # the three changes came before any run started
    panel.wait(timeout=60)
    # (the finished run is read once more by the update that shows it)
    assert set(trained) == {0.65} and panel.last["config"].beta == 0.65


# ---------------------------------------------------------------- exercise checks
def test_check_kl_returns():
    def right(r, k1, m, b):
        return (r[:, None] - b * (k1 * m).flip(-1).cumsum(-1).flip(-1)) * m

    assert check07.kl_returns(right)
    assert not check07.kl_returns(lambda r, k1, m, b: ...).attempted
    assert (
        "Sign"
        in check07.kl_returns(lambda r, k1, m, b: (r[:, None] + b * (k1 * m).flip(-1).cumsum(-1).flip(-1)) * m).message
    )
    assert "partial" in check07.kl_returns(lambda r, k1, m, b: (r[:, None] - b * k1 * m) * m).message
    assert "past" in check07.kl_returns(lambda r, k1, m, b: (r[:, None] - b * (k1 * m).cumsum(-1)) * m).message
    assert (
        "mask" in check07.kl_returns(lambda r, k1, m, b: (r[:, None] - b * k1.flip(-1).cumsum(-1).flip(-1)) * m).message
    )
    assert "raised" in check07.kl_returns(lambda r, k1, m, b: r.no_such_method()).message


def test_check_approx_kl_stop():
    def right(new, old, m, t):
        v = (0.5 * (new - old) ** 2 * m).sum() / m.sum()
        return v, bool(v > t)

    assert check07.approx_kl_stop(right)
    assert not check07.approx_kl_stop(lambda *a: ...).attempted
    assert "mask" in check07.approx_kl_stop(lambda n, o, m, t: ((0.5 * (n - o) ** 2).mean(), False)).message
    assert "½" in check07.approx_kl_stop(lambda n, o, m, t: (((n - o) ** 2 * m).sum() / m.sum(), True)).message
    assert "k1" in check07.approx_kl_stop(lambda n, o, m, t: (((o - n) * m).sum() / m.sum(), True)).message

    def wrong_direction(new, old, m, t):
        v = (0.5 * (new - old) ** 2 * m).sum() / m.sum()
        return v, bool(v < t)

    assert "greater" in check07.approx_kl_stop(wrong_direction).message
    assert "pair" in check07.approx_kl_stop(lambda *a: 0.1).message


# ---------------------------------------------------------------- lesson 07's stored multi-seed runs
def test_stored_lab_seeds_match_their_configs():
    from klviz.rlhf import LAB_SEED_CONFIGS, LAB_SEED_METRICS, LAB_SEEDS, LAB_SEEDS_PATH, load_lab_seeds

    assert LAB_SEEDS_PATH.stat().st_size < 512 * 1024  # small package data
    data = load_lab_seeds()
    assert data.configs == LAB_SEED_CONFIGS and data.seeds == LAB_SEEDS and len(LAB_SEEDS) >= 5
    for name, cfg in LAB_SEED_CONFIGS.items():
        for m in LAB_SEED_METRICS:
            assert data.metrics[name][m].shape == (len(LAB_SEEDS), cfg.steps), (name, m)
            assert np.isfinite(data.metrics[name][m]).all()
        assert len(data.samples[name]) == len(LAB_SEEDS)
    c = data.compare("on · k1 in loss", "on · k1 in reward")
    va, vb = data.final("on · k1 in loss", "true_kl"), data.final("on · k1 in reward", "true_kl")
    assert abs(c["diff"] - float((va - vb).mean())) < 1e-12
    assert abs(c["diff_se"] - float((va - vb).std(ddof=1) / math.sqrt(len(va)))) < 1e-12
    assert c["a_above"] == int((va > vb).sum()) and c["seeds"] == len(LAB_SEEDS)


def test_lab_seeds_round_trip_and_reproduce(tmp_path):
    from klviz.rlhf import load_lab_seeds, run_lab_seeds, save_lab_seeds

    cfgs = {
        "tiny · k3·ρ in loss": LabConfig(placement="k3·ρ in loss", **{**SMALL, "steps": 2}),
        "tiny · none": LabConfig(placement="none", **{**SMALL, "steps": 2}),
    }
    data = run_lab_seeds(cfgs, seeds=(0, 1))
    path = save_lab_seeds(data, tmp_path / "seeds.npz")
    back = load_lab_seeds(path)
    assert back.configs == cfgs and back.seeds == (0, 1)
    for n in cfgs:
        for m, v in data.metrics[n].items():
            assert np.array_equal(back.metrics[n][m], v)
        assert back.samples[n] == data.samples[n]
    again = train_policy(replace(cfgs["tiny · none"], seed=1))  # the same config and seed: same run
    assert np.array_equal(np.asarray(again.metrics["true_kl"]), back.metrics["tiny · none"]["true_kl"][1])


def test_a_run_reproduces_within_rounding_and_a_changed_run_does_not():
    """The stored runs' check asks for the same run within 1 % of the seeds' spread, not bitwise (CPUs differ)."""
    from klviz.rlhf import run_lab_seeds

    cfgs = {"tiny · k3 in loss": LabConfig(placement="k3 in loss", **{**SMALL, "steps": 4})}
    data = run_lab_seeds(cfgs, seeds=(0, 1, 2))
    same = train_policy(replace(cfgs["tiny · k3 in loss"], seed=0))
    assert max(data.reproduction_gaps("tiny · k3 in loss", same.metrics).values()) == 0
    rounded = {m: [v * (1 + 1e-6) for v in vs] for m, vs in same.metrics.items()}  # float noise: still the same run
    assert max(data.reproduction_gaps("tiny · k3 in loss", rounded).values()) <= 1
    cfg = cfgs["tiny · k3 in loss"]
    moved = train_policy(replace(cfg, seed=0, lr=cfg.lr * 1.05))  # a change of the code's arithmetic: caught
    assert max(data.reproduction_gaps("tiny · k3 in loss", moved.metrics).values()) > 1


def test_resolved_needs_three_standard_errors_and_more_than_rounding():
    from klviz.statistics import RESOLVED_AT_SE, is_resolved, verdict

    assert RESOLVED_AT_SE == 3.0
    assert is_resolved(0.31, 0.1) and not is_resolved(0.29, 0.1) and is_resolved(-0.31, 0.1)
    assert not is_resolved(0.0, 0.0) and not is_resolved(float("nan"), 0.1) and not is_resolved(1.0, float("nan"))
    # a difference in the last bits of two runs is rounding, however small its SE
    assert not is_resolved(3e-8, 1e-9, scale=0.17) and is_resolved(3e-8, 1e-9)
    assert verdict(3e-8, 1e-9, 0.17) == "same up to rounding"
    assert verdict(0.0, 0.0) == "identical"
    assert verdict(0.5, 0.1, 1.0) == "resolved" and verdict(0.1, 0.1, 1.0) == "within noise"


def test_judge_applies_one_rule_to_each_verdict():
    from klviz.rlhf import LabSeeds, Verdict, judge

    steps = 5
    seeds = tuple(range(16))
    base = np.linspace(1.0, 2.0, 16)[:, None] * np.ones((16, steps))
    wiggle = np.where(np.arange(16) % 2 == 0, 1.0, -1.0)[:, None] * np.ones((16, steps))
    cfg = LabConfig(placement="none", **{**SMALL, "steps": steps})
    metrics = {
        "a": {"true_kl": base + 0.5 + 0.1 * wiggle},  # 0.5 above b, SE 0.1/4: resolved
        "b": {"true_kl": base},
        "c": {"true_kl": base + 0.01 + 0.1 * wiggle},  # 0.01 above b with SE 0.026: not resolved
    }
    store = LabSeeds(
        {n: cfg for n in metrics},
        seeds,
        metrics,
        {n: [""] * 16 for n in metrics},
        {n: np.zeros(16) for n in metrics},
        "",
        ("true_kl",),
    )
    rows = judge(
        store,
        [
            Verdict("a above b", "a", "b", "true_kl", "a > b"),
            Verdict("a below b", "a", "b", "true_kl", "a < b"),
            Verdict("c and b", "c", "b", "true_kl", "not resolved"),
            Verdict("c above b", "c", "b", "true_kl", "a > b"),
        ],
    )
    assert [r["holds"] for r in rows] == [True, False, True, False]
    assert rows[0]["a_above"] == 16 and rows[0]["seeds"] == 16 and abs(rows[0]["diff"] - 0.5) < 1e-12
    assert rows[0]["seeds_to_resolve"] is None  # resolved already
    se = 0.1 * math.sqrt(16 / 15) / 4  # the sample std of ±0.1 over 16 seeds, over √16
    assert rows[2]["seeds_to_resolve"] == math.ceil(16 * (3 * se / 0.01) ** 2)
    with pytest.raises(ValueError, match="says"):
        Verdict("x", "a", "b", "true_kl", "a >> b")


def test_lessons_verdicts_hold_on_the_stored_seeds_and_the_check_seeds():
    from klviz import rlhf

    for path, check_path, verdicts, configs in (
        (rlhf.LAB_SEEDS_PATH, rlhf.LAB_CHECK_PATH, rlhf.LAB_VERDICTS, rlhf.LAB_SEED_CONFIGS),
        (rlhf.MISMATCH_SEEDS_PATH, rlhf.MISMATCH_CHECK_PATH, rlhf.MISMATCH_VERDICTS, rlhf.MISMATCH_SEED_CONFIGS),
    ):
        store, check = rlhf.load_lab_seeds(path), rlhf.load_lab_seeds(check_path)
        assert len(store.seeds) == 16 and not set(store.seeds) & set(rlhf.CHECK_SEEDS)
        assert check.seeds == rlhf.CHECK_SEEDS and check.configs == configs and check.metric_names == store.metric_names
        assert check_path.stat().st_size < 512 * 1024
        for r in rlhf.judge(store, verdicts):
            assert r["holds"], (r["verdict"].wording, r["diff"], r["se"])
            assert r["verdict"].a in store.configs and r["verdict"].b in store.configs
        for r in rlhf.judge(check, verdicts, check_seeds=True):  # what the lessons say about seeds 100-115
            assert r["holds"], ("check seeds", r["verdict"].wording, r["diff"], r["se"])


def test_served_policy_kl_is_the_trainers_when_the_trainer_samples():
    h = train_policy(LabConfig(placement="k3 in loss", **{**SMALL, "steps": 2}))
    assert h.metrics["engine_true_kl"] == h.metrics["true_kl"]
    e = train_policy(LabConfig(placement="k3 in loss", engine="top-p 0.8", **{**SMALL, "steps": 2}))
    assert all(math.isfinite(v) and v > 0 for v in e.metrics["engine_true_kl"])
    assert e.metrics["engine_true_kl"] != e.metrics["true_kl"]  # the truncated policy's KL is another number


def test_a_finished_background_run_hands_freed_memory_back(monkeypatch, no_runs_trained):
    """Each background run ends by calling release_freed_memory (glibc keeps a thread's freed blocks
    in that thread's arena otherwise), also a run replaced before it trained."""
    import klviz.widgets.base as base
    from klviz.widgets.lesson07 import RLHFLabPanel

    calls: list[str] = []
    monkeypatch.setattr(base, "release_freed_memory", lambda: calls.append("released"))
    panel = RLHFLabPanel(steps=3, prompts=2, group_size=6, max_new_tokens=20)
    panel.controls["beta"].value = 0.25
    first = panel.background_run
    panel.controls["beta"].value = 0.3  # replaces the first run
    panel.wait(timeout=60)
    for run in (first, panel.background_run):
        assert run is not None and run.thread is not None
        run.thread.join(10)  # the memory is handed back after the panel shows the result
    assert panel.last["config"].beta == 0.3 and calls == ["released", "released"]
