"""``klviz.audit_loss`` and ``klviz audit``: the exact expected gradient of a user's KL term, classified.

Each case is written here independently of the package's estimator code (or goes through
``klviz.frameworks``, which follows each framework's source). Expected classifications, from lessons
05 and 07 and the exact numbers (``follows`` needs a relative error ≤ 0.05; token-level terms at
length 3 follow the token-level "partial" gradient, about 0.26 from the sequence-level reverse KL on
these policies, hence "neither"; off-policy at length 3 the per-token ratio does not reweight the
prefixes, hence "neither" too):

==========================  ===========  ===========  ===========  ===========
case                        current, 1   current, 3   old, 1       old, 3
==========================  ===========  ===========  ===========  ===========
k1 in loss                  zero         zero         neither      neither
k2 in loss                  reverse      neither      neither      neither
k3 in loss                  forward      neither      neither      neither
k3·ρ in loss                reverse      neither      reverse      neither
k3+ (straight-through)      reverse      neither      neither      neither
k1 in reward (to go)        reverse      reverse      reverse      neither
k3 in reward                neither      neither      neither      neither
==========================  ===========  ===========  ===========  ===========
"""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch

import klviz
from klviz import frameworks as fw


def _mean(x, mask):
    return (x * mask).sum() / mask.sum()


def _k3(lp, ref):
    d = ref - lp
    return torch.exp(d) - d - 1


LOSSES = {
    "k1": lambda lp, old, ref, mask: _mean(lp - ref, mask),
    "k2": lambda lp, old, ref, mask: _mean(0.5 * (lp - ref) ** 2, mask),
    "k3": lambda lp, old, ref, mask: _mean(_k3(lp, ref), mask),
    "k3·ρ": lambda lp, old, ref, mask: _mean(torch.exp(lp - old.detach()) * _k3(lp, ref), mask),
    "k3+": lambda lp, old, ref, mask: _mean(
        _k3(lp, ref).detach() + 0.5 * (lp - ref) ** 2 - (0.5 * (lp - ref) ** 2).detach(), mask
    ),
}
REWARDS = {
    "k1": lambda lp, old, ref, mask: lp - ref,
    "k3": lambda lp, old, ref, mask: _k3(lp, ref),
}
EXPECTED = {  # (placement, case): follows at (current, 1), (current, 3), (old, 1), (old, 3)
    ("loss", "k1"): ("zero", "zero", "neither", "neither"),
    ("loss", "k2"): ("reverse_kl", "neither", "neither", "neither"),
    ("loss", "k3"): ("forward_kl", "neither", "neither", "neither"),
    ("loss", "k3·ρ"): ("reverse_kl", "neither", "reverse_kl", "neither"),
    ("loss", "k3+"): ("reverse_kl", "neither", "neither", "neither"),
    ("reward", "k1"): ("reverse_kl", "reverse_kl", "reverse_kl", "neither"),
    ("reward", "k3"): ("neither", "neither", "neither", "neither"),
}
SETTINGS = (("current", 1), ("current", 3), ("old", 1), ("old", 3))


@pytest.mark.parametrize("key", list(EXPECTED), ids=lambda k: f"{k[1]} in {k[0]}")
def test_textbook_cases(key):
    placement, case = key
    fn = (LOSSES if placement == "loss" else REWARDS)[case]
    for (sampler, length), want in zip(SETTINGS, EXPECTED[key]):
        r = klviz.audit_loss(fn, placement=placement, sampler=sampler, length=length)
        assert r.follows == want, (key, sampler, length, r.relative_error)
        assert set(r.relative_error) == {"reverse_kl", "forward_kl"}
        if want in ("reverse_kl", "forward_kl"):
            assert r.relative_error[want] < 1e-6
        assert r.target_separation >= 0.3


def test_token_level_losses_follow_the_partial_gradient():
    r = klviz.audit_loss(LOSSES["k2"], length=3)
    assert r.follows == "neither" and r.relative_error_token_level < 1e-9
    assert 0.1 < r.relative_error["reverse_kl"] < 1
    assert "token-level" in r.summary and "lesson 05" in r.summary


FRAMEWORKS = {
    "verl low_var_kl": (lambda lp, old, ref, m: fw.verl_kl_loss(lp, ref, m)["kl_loss"], "loss", "forward_kl"),
    "verl mse (k2)": (lambda lp, old, ref, m: fw.verl_kl_loss(lp, ref, m, "mse")["kl_loss"], "loss", "reverse_kl"),
    "verl low_var_kl+": (
        lambda lp, old, ref, m: fw.verl_kl_loss(lp, ref, m, "low_var_kl+")["kl_loss"],
        "loss",
        "reverse_kl",
    ),
    "verl k1 in reward": (
        lambda lp, old, ref, m: fw.verl_kl_in_reward(lp, ref, m)["per_token"],
        "reward",
        "reverse_kl",
    ),
    "OpenRLHF k1 in reward": (
        lambda lp, old, ref, m: fw.openrlhf_kl(lp, ref, m, "k1")["per_token"],
        "reward",
        "reverse_kl",
    ),
    "OpenRLHF k3 in loss": (
        lambda lp, old, ref, m: fw.openrlhf_kl(lp, ref, m, "k3", use_kl_loss=True)["kl_loss"],
        "loss",
        "forward_kl",
    ),
    "TRL GRPO (bias-corrected)": (
        lambda lp, old, ref, m: fw.trl_grpo_kl(lp, ref, m, old_per_token_logps=old, beta=0.04)["loss_term"],
        "loss",
        "reverse_kl",
    ),
    "TRL GRPO (uncorrected)": (
        lambda lp, old, ref, m: fw.trl_grpo_kl(lp, ref, m, use_bias_correction_kl=False, beta=0.04)["loss_term"],
        "loss",
        "forward_kl",
    ),
    "NeMo-RL (generation weights)": (
        lambda lp, old, ref, m: fw.nemo_rl_kl_loss(
            lp, ref, m, generation_logprobs=old, use_on_policy_kl_approximation=True
        )["loss_term"],
        "loss",
        "reverse_kl",
    ),
}


@pytest.mark.parametrize("name", list(FRAMEWORKS))
def test_framework_terms(name):
    fn, placement, want = FRAMEWORKS[name]
    r = klviz.audit_loss(fn, placement=placement)
    assert r.follows == want, (name, r.relative_error)
    off = klviz.audit_loss(fn, placement=placement, sampler="old")
    ratio_corrected = name.startswith(("TRL GRPO (bias", "NeMo-RL"))
    assert (off.follows == "reverse_kl") == ratio_corrected or placement == "reward", (name, off.relative_error)
    r3 = klviz.audit_loss(fn, placement=placement, length=3)
    assert r3.follows == ("reverse_kl" if placement == "reward" else "neither"), (name, r3.relative_error)


def test_scale_free_and_bad_input():
    a = klviz.audit_loss(LOSSES["k2"])
    b = klviz.audit_loss(lambda *args: 0.001 * LOSSES["k2"](*args))
    assert a.relative_error["reverse_kl"] == pytest.approx(b.relative_error["reverse_kl"], abs=1e-12)
    assert b.follows == "reverse_kl"
    assert math.isinf(klviz.audit_loss(lambda lp, o, r, m: -LOSSES["k2"](lp, o, r, m)).relative_error["reverse_kl"])
    for kw in (dict(placement="x"), dict(sampler="x"), dict(vocab_size=1), dict(vocab_size=10, length=5)):
        with pytest.raises(ValueError):
            klviz.audit_loss(LOSSES["k2"], **kw)
    with pytest.raises(ValueError, match="scalar"):
        klviz.audit_loss(REWARDS["k1"], length=3)
    with pytest.raises(ValueError, match="fn raised"):
        klviz.audit_loss(lambda *a: 1 / 0)


def test_cli_audit(tmp_path):
    user = tmp_path / "my_kl.py"
    user.write_text(
        "import torch\n\ndef kl(logprob, old_logprob, ref_logprob, response_mask):\n"
        "    d = ref_logprob - logprob\n    return ((torch.exp(d) - d - 1) * response_mask).mean()\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "klviz.cli", "audit", f"{user}:kl"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "forward KL" in done.stdout and "lesson 05" in done.stdout
    assert "as Python code" in done.stderr
    bad = subprocess.run(
        [sys.executable, "-m", "klviz.cli", "audit", f"{user}:nope"], capture_output=True, text=True, timeout=120
    )
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 2
