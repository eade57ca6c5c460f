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


# -- verdicts that hold on every seed, hints that fit the term, clamps, lengths side by side -------------------

SEED_TERMS = {  # the frameworks' own terms: (fn, placement, verdict at length >= 2 for (current, old))
    "verl low_var_kl": (FRAMEWORKS["verl low_var_kl"][0], "loss", ("neither", "neither")),
    "TRL GRPO (bias-corrected, per-token ρ·k3)": (
        FRAMEWORKS["TRL GRPO (bias-corrected)"][0],
        "loss",
        ("neither", "neither"),
    ),
    "verl mse (k2)": (FRAMEWORKS["verl mse (k2)"][0], "loss", ("neither", "neither")),
    "verl k1 in reward": (FRAMEWORKS["verl k1 in reward"][0], "reward", ("reverse_kl", "neither")),
    "k3·ρ prefix product": (
        lambda lp, o, r, m: _mean(torch.exp(torch.cumsum(lp - o.detach(), -1)) * (torch.exp(r - lp) - (r - lp) - 1), m),
        "loss",
        ("reverse_kl", "reverse_kl"),  # on-policy too: the prefix product is 1 in value, a score function in gradient
    ),
}


@pytest.mark.parametrize("name", list(SEED_TERMS))
def test_verdicts_do_not_depend_on_the_seed(name):
    """Length 2 and 3, on- and off-policy, eight seeds: one verdict each, and every structural gradient at least
    TARGET_SEPARATION from every other, so no term sits near the 0.05 threshold."""
    from klviz import audit

    fn, placement, want = SEED_TERMS[name]
    for length in (2, 3):
        for sampler, expected in zip(("current", "old"), want):
            for seed in range(8):
                r = klviz.audit_loss(fn, placement=placement, sampler=sampler, length=length, seed=seed)
                assert r.follows == expected, (name, length, sampler, seed, r.relative_error)
                assert r.target_separation >= audit.TARGET_SEPARATION, (length, sampler, seed)
                errs = [*r.relative_error.values(), r.relative_error_token_level]
                assert all(e < 1e-9 or e > 3 * audit.FOLLOWS_TOL for e in errs), (name, seed, errs)


def test_hints_fit_the_term():
    k3rho = klviz.audit_loss(LOSSES["k3·ρ"], sampler="old", length=3)
    assert k3rho.behaves_like.startswith("k3·ρ with a per-token ρ") and "prefix product" in k3rho.hint
    assert "∏" in k3rho.summary and "(as k3·ρ)" not in k3rho.summary
    frozen = klviz.audit_loss(lambda lp, o, r, m: o - r, placement="reward", sampler="old", length=2)
    assert "frozen at rollout" in frozen.behaves_like and "recompute it at π_θ" in frozen.hint
    inverted = klviz.audit_loss(lambda lp, o, r, m: _mean(_k3(r, lp), m))
    assert "inverted" in inverted.behaves_like and "π_ref/π_θ" in inverted.hint
    k1 = klviz.audit_loss(LOSSES["k1"])
    assert k1.follows == "zero" and "k1 in the reward" in k1.hint


def test_lengths_one_and_three_side_by_side():
    r = klviz.audit_loss(LOSSES["k2"])
    assert r.follows == "reverse_kl" and r.sequence is not None and r.sequence.follows == "neither"
    assert "side by side: length 1: reverse KL; length 3: neither" in r.summary
    assert r.as_dict()["sequence"]["follows"] == "neither"
    assert klviz.audit_loss(LOSSES["k2"], length=2).sequence is None
    assert klviz.audit_loss(LOSSES["k2"], vocab_size=20).sequence is None  # 20 ** 3 is too many to enumerate


def test_far_policies_make_the_clamps_bind():
    from klviz import audit

    mild = klviz.audit_loss(FRAMEWORKS["verl low_var_kl"][0])
    far = klviz.audit_loss(FRAMEWORKS["verl low_var_kl"][0], policies="far")
    assert mild.clamp_binds == 0 and mild.follows == "forward_kl"
    assert far.clamp_binds > 0.3 and far.follows == "neither"
    assert far.behaves_like.startswith("k3 clamped as verl's low_var_kl")
    nemo = klviz.audit_loss(FRAMEWORKS["NeMo-RL (generation weights)"][0], sampler="old", policies="far")
    assert nemo.follows == "neither" and nemo.behaves_like.startswith("clamp(ρ·k3)")
    assert klviz.audit_loss(LOSSES["k3·ρ"], sampler="old", policies="far").follows == "reverse_kl"
    with pytest.raises(ValueError, match="policies"):
        klviz.audit_loss(LOSSES["k2"], policies="near")
    assert audit.FAR_GAP > 20  # beyond verl's and NeMo-RL's input clamp


def test_cli_audit_user_code_edge_cases(tmp_path, capsys):
    """In-process (the console script is test_cli_audit's): a module with `from __future__ import annotations`,
    a dataclass and a sibling import works; sys.exit anywhere, a hang and absurd sizes exit 2 with one line."""
    from klviz import cli

    pkg = tmp_path / "mine"
    pkg.mkdir()
    (pkg / "helper.py").write_text(
        "import torch\n\ndef k3(lp, ref):\n    d = ref - lp\n    return torch.exp(d) - d - 1\n"
    )
    (pkg / "kl.py").write_text(
        "from __future__ import annotations\n\nimport sys\nfrom dataclasses import dataclass\n\n"
        "from helper import k3\n\n\n@dataclass\nclass Config:\n    beta: float = 0.1\n\n\n"
        "def kl(logprob, old_logprob, ref_logprob, response_mask):\n"
        "    return Config().beta * (k3(logprob, ref_logprob) * response_mask).mean()\n\n\n"
        "def leaves(logprob, old_logprob, ref_logprob, response_mask):\n    sys.exit(0)\n\n\n"
        "def hangs(logprob, old_logprob, ref_logprob, response_mask):\n"
        "    while True:\n        try:\n            pass\n        except Exception:\n            pass\n"
    )
    (pkg / "exits.py").write_text("import sys\nsys.exit(0)\n")
    path_before = list(sys.path)

    def run(*args):
        code = cli.main(["audit", *args])
        out, err = capsys.readouterr()
        return code, out, err

    code, out, err = run(f"{pkg / 'kl.py'}:kl")
    assert code == 0, err
    assert "forward KL" in out and "side by side" in out
    for target, words in (
        (f"{pkg / 'kl.py'}:leaves", "sys.exit(0)"),
        (f"{pkg / 'exits.py'}:kl", "while being imported"),
    ):
        code, out, err = run(target)
        assert code == 2 and words in err and out == "", err
    code, _out, err = run(f"{pkg / 'kl.py'}:hangs", "--timeout", "1")
    assert code == 2 and "--timeout 1" in err
    for extra in (["--length", "1e3"], ["--vocab-size", "3", "--length", "30000000"]):
        code, _out, err = run(f"{pkg / 'kl.py'}:kl", *extra)
        assert code == 2 and "more than 4096 sequences" in err
        assert len(err) < 400  # no 400-digit number
    code, out, _err = run(f"{pkg / 'kl.py'}:kl", "--policies", "far", "--json")
    assert code == 0 and '"policies": "far"' in out
    assert sys.path == path_before and not any(m.startswith("klviz_audit_target") for m in sys.modules)
