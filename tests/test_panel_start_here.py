"""Lesson 00's panel, driven in code: numbers follow the controls, extremes never crash."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from klviz.divergences import categorical_kl
from klviz.policies import TOY_VOCAB, move_policy, toy_sampler_logits
from klviz.widgets import StartHerePanel


@pytest.fixture(scope="module")
def panel():
    return StartHerePanel(device="cpu")


def test_defaults_show_exact_kl_and_unbiased_means(panel):
    last = panel.set(temperature=1.0, push=1.0, push_token=1, mix=0.0, num_samples=100_000, seed=0)
    q = toy_sampler_logits().exp()
    p = move_policy(toy_sampler_logits(), push=1.0, push_token=1).exp()
    assert last["exact"] == pytest.approx(float(categorical_kl(q, p)), rel=1e-6)
    for k in ("k1", "k3"):
        assert abs(last["stats"][k]["mean"] - last["exact"]) < 4 * last["stats"][k]["se"]
    assert last["stats"]["k2"]["mean"] >= 0 and last["stats"]["k3"]["mean"] >= 0
    # the readout shows the same numbers the reader sees
    assert f"{last['exact']:.4f}" in panel.readout.value
    assert f"{last['stats']['k3']['mean']:.4f}" in panel.readout.value
    # k1 is negative exactly on the tokens p likes more than q; their share matches the counts
    log_r = np.log(last["p"]) - np.log(q.numpy())
    share = float(np.sum(last["freq"][log_r > 0]))
    assert last["frac_negative_k1"] == pytest.approx(share, abs=1e-9)
    assert panel.error.value == "" and "device cpu" in panel.status.value


def test_moving_p_changes_the_numbers_and_the_figure(panel):
    a = panel.set(temperature=1.0, push=0.0, mix=0.0, num_samples=1000, seed=0)
    assert a["exact"] == pytest.approx(0.0, abs=1e-7)  # p = q: no divergence
    png_a = panel.png()
    b = panel.set(push=3.0)
    assert b["exact"] > 0.1
    assert panel.png() != png_a
    # same seed, same tokens: the draw frequencies do not depend on p
    assert np.array_equal(a["freq"], b["freq"])


@pytest.mark.parametrize(
    "values",
    [
        dict(temperature=0.25, push=4.0, mix=0.0, num_samples=10),
        dict(temperature=4.0, push=-4.0, mix=1.0, num_samples=1_000_000),
        dict(temperature=0.25, push=-4.0, push_token=11, mix=0.0, num_samples=10),
        dict(temperature=4.0, push=4.0, push_token=11, mix=0.02, num_samples=30, seed=2**31 - 1),
    ],
)
def test_extreme_settings_stay_finite(panel, values):
    last = panel.set(**values)
    assert panel.last_error is None, panel.error.value
    assert math.isfinite(last["exact"])
    for k in ("k1", "k2", "k3"):
        assert all(math.isfinite(last["stats"][k][f]) for f in ("mean", "std", "se"))


def test_errors_are_shown_inside_the_panel(panel, monkeypatch):
    def boom(**_):
        raise ValueError("temperature must be positive")

    monkeypatch.setattr(panel, "compute", boom)
    panel.update()
    assert "temperature must be positive" in panel.error.value
    assert isinstance(panel.last_error, ValueError)
    monkeypatch.undo()
    panel.update()
    assert panel.error.value == "" and panel.last_error is None


def test_set_rejects_unknown_controls(panel):
    with pytest.raises(ValueError, match="unknown control"):
        panel.set(temprature=2.0)


def test_vocabulary_is_readable():
    assert 8 <= len(TOY_VOCAB) <= 16
    assert torch.allclose(toy_sampler_logits().exp().sum(), torch.tensor(1.0))
