"""Hostile but fair input to every public function: a clear error naming the argument, or a documented
correct result. Never a silent NaN, a hang, or an error from deep inside torch that names nothing."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.distributions import Categorical, Normal

import klviz
from klviz import frameworks as fw
from klviz.montecarlo import MAX_SAMPLES

F64 = torch.float64
GOOD = torch.tensor([-1.0, -2.0, -0.5])
MASK = torch.tensor([1.0, 1.0, 0.0])

# ----------------------------------------------------------------------------- bad tensors, one class each
#: (label, value, words the error must contain besides the argument's name)
BAD_TENSORS = [
    ("bools", [True, False, True], "bool"),
    ("string", "0.5", "str"),
    ("strings", ["0.1", "0.2", "0.3"], "number"),
    ("none", None, "NoneType"),
    ("dict", {"a": 1.0}, "dict"),
    ("meta", torch.empty(3, device="meta"), "meta"),
    ("nan", torch.tensor([0.1, float("nan"), 0.2]), "NaN"),
    ("inf", torch.tensor([0.1, float("inf"), 0.2]), "inf"),
    ("int tensor", torch.tensor([1, 2, 3]), "dtype"),
    ("bool tensor", torch.tensor([True, False, True]), "dtype"),
    ("empty", torch.empty(0), "empty"),
    ("object array", np.array([1.0, "x", None], dtype=object), "dtype"),
    ("complex", torch.tensor([1 + 1j, 2, 3]), "dtype"),
]

ESTIMATOR_CALLS = {
    "k1": lambda x: klviz.k1(x),
    "k2": lambda x: klviz.k2(x),
    "k3": lambda x: klviz.k3(x),
    "kl_penalty logprob": lambda x: klviz.kl_penalty(x, GOOD, "low_var_kl"),
    "kl_penalty ref_logprob": lambda x: klviz.kl_penalty(GOOD, x, "k3"),
    "masked_mean values": lambda x: klviz.masked_mean(x, MASK),
    "exact_kl q_logits": lambda x: klviz.exact_kl(x, GOOD),
    "gradient policy_logits": lambda x: klviz.expected_kl_gradient(x, GOOD, "k3", "loss"),
}
ARG_NAME = {
    "k1": "log_r",
    "k2": "log_r",
    "k3": "log_r",
    "kl_penalty logprob": "logprob",
    "kl_penalty ref_logprob": "ref_logprob",
    "masked_mean values": "values",
    "exact_kl q_logits": "q_logits",
    "gradient policy_logits": "policy_logits",
}


@pytest.mark.parametrize("label,value,words", BAD_TENSORS, ids=[b[0] for b in BAD_TENSORS])
@pytest.mark.parametrize("call", list(ESTIMATOR_CALLS), ids=list(ESTIMATOR_CALLS))
def test_bad_tensors_are_refused_by_name(call, label, value, words):
    if call == "masked_mean values" and label in ("nan", "inf"):
        value = value if label == "nan" else value  # a NaN at a counted position (index 1) must still be refused
    if call == "exact_kl q_logits" and label == "inf":
        value = torch.tensor([0.1, float("inf"), 0.2])
    with pytest.raises((ValueError, TypeError)) as err:
        ESTIMATOR_CALLS[call](value)
    message = str(err.value)
    assert ARG_NAME[call] in message, message
    if words:
        assert words.lower() in message.lower(), message


@pytest.mark.parametrize(
    "mask",
    [None, "1 1 0", [True, "x", False], {"m": 1}, torch.empty(3, device="meta")],
    ids=["none", "string", "mixed list", "dict", "meta"],
)
def test_bad_masks_are_refused_by_name(mask):
    for call in (
        lambda: klviz.masked_mean(GOOD, mask),
        lambda: klviz.agg_loss(GOOD[None], mask, "token-mean"),
        lambda: fw.verl_kl_loss(GOOD[None], GOOD[None], mask),
    ):
        with pytest.raises((ValueError, TypeError), match="mask"):
            call()


def test_unusual_but_valid_arrays_give_correct_results():
    ref = klviz.k3(torch.tensor([0.5, -1.0, 2.0], dtype=F64))
    big_endian = np.array([0.5, -1.0, 2.0], dtype=">f8")
    assert torch.equal(klviz.k3(big_endian), ref)
    strided = np.array([0.5, 9.0, -1.0, 9.0, 2.0])[::2]
    assert torch.equal(klviz.k3(strided), ref)
    long_double = np.array([0.5, -1.0, 2.0], dtype=np.longdouble)
    assert torch.allclose(klviz.k3(long_double), ref)
    assert klviz.k3(np.float32(0.5)).dtype == torch.float32
    assert torch.equal(klviz.k1(torch.tensor([0.5, -1.0, 2.0], dtype=F64).numpy()), -ref.new_tensor([0.5, -1.0, 2.0]))


# ----------------------------------------------------------------------------- dims
@pytest.mark.parametrize(
    "dim,ok",
    [
        (-1, True),
        (0, True),
        (np.int64(0), True),
        (torch.tensor(0), False),
        (2, False),
        (-3, False),
        (1.0, False),
        ("0", False),
        (True, False),
    ],
)
def test_dim_is_an_integer_in_range(dim, ok):
    q, p = torch.randn(4, 5), torch.randn(4, 5)
    axis = int(dim) if ok else -1
    for call in (
        lambda: klviz.exact_kl(q, p, dim=dim),
        lambda: klviz.categorical_kl(q.softmax(axis), p.softmax(axis), dim=dim),
        lambda: klviz.masked_mean(q, torch.ones(4, 5), dim=dim),
    ):
        if ok:
            call()
        else:
            with pytest.raises((ValueError, TypeError), match="dim"):
                call()


# ----------------------------------------------------------------------------- autograd through exact_kl
def test_exact_kl_works_with_autograd_and_agrees_with_a_brute_force_gradient():
    q = torch.randn(3, 7, dtype=F64, requires_grad=True)
    p = torch.randn(3, 7, dtype=F64, requires_grad=True)
    kl = klviz.exact_kl(q, p)
    assert kl.requires_grad
    kl.sum().backward()
    q2, p2 = q.detach().clone().requires_grad_(True), p.detach().clone().requires_grad_(True)
    lq, lp = q2.log_softmax(-1), p2.log_softmax(-1)
    (lq.exp() * (lq - lp)).sum().backward()
    assert torch.allclose(q.grad, q2.grad) and torch.allclose(p.grad, p2.grad)
    with torch.no_grad():  # ordinary model outputs in an eval loop
        assert not klviz.exact_kl(q, p).requires_grad


# ----------------------------------------------------------------------------- silent NaN and inf
def test_k3_expected_gradients_stay_finite_where_pi_times_r_would_overflow():
    theta = torch.tensor([0.0, -120.0, 0.0], dtype=torch.float32)  # one token the policy nearly never takes
    ref = torch.tensor([0.0, 0.0, 0.0], dtype=torch.float32)
    for placement, weighting in (("loss", "none"), ("reward", "none"), ("loss", "rho")):
        g = klviz.expected_kl_gradient(theta, ref, "k3", placement, weighting)
        assert bool(torch.isfinite(g).all()), (placement, weighting, g)
    from klviz import simplex

    for flow in simplex.ALL_FLOWS:  # the same sums for a batch of policies (lesson 05's fields)
        assert bool(torch.isfinite(simplex.field_gradient(theta[None], ref, flow)).all()), flow
    g64 = klviz.expected_kl_gradient(theta.double(), ref.double(), "k3", "loss")
    assert torch.allclose(klviz.expected_kl_gradient(theta, ref, "k3", "loss").double(), g64, atol=1e-6)
    assert torch.allclose(g64, klviz.forward_kl_gradient(theta.double(), ref.double()), atol=1e-12)


def test_masked_mean_does_not_overflow_in_float32():
    v = torch.full((4,), 3e38, dtype=torch.float32)
    out = klviz.masked_mean(v, torch.ones(4))
    assert out.dtype == torch.float32 and float(out) == pytest.approx(3e38, rel=1e-6)
    assert float(klviz.agg_loss(v[None], torch.ones(1, 4), "token-mean")) == pytest.approx(3e38, rel=1e-6)


def test_framework_outputs_ignore_inf_at_padded_positions():
    lp = torch.tensor([[-1.0, -2.0, -float("inf")]])
    ref = torch.tensor([[-1.5, -1.0, -3.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    for out in (
        fw.trl_grpo_kl(lp, ref, mask, beta=0.04),
        fw.minimind_kl_ref_penalty(lp, ref, mask),
        fw.openrlhf_kl(lp, ref, mask, "k3"),
        fw.verl_kl_loss(lp, ref, mask),
    ):
        assert bool(torch.isfinite(out["logged"])), out
        assert float(out["per_token"][0, 2]) == 0.0


def test_zero_max_completion_length_is_refused():
    with pytest.raises(ValueError, match="max_completion_length"):
        fw.trl_grpo_kl(GOOD[None], GOOD[None], MASK[None], loss_type="dr_grpo", max_completion_length=0)


# ----------------------------------------------------------------------------- hangs
def test_estimator_stats_refuses_a_sample_count_that_would_run_for_days():
    q, p = Normal(0.0, 1.0), Normal(1.0, 1.0)
    with pytest.raises(ValueError, match="num_samples"):
        klviz.estimator_stats(q, p, 10**30)
    with pytest.raises(ValueError, match="num_samples"):
        klviz.estimator_stats(q, p, MAX_SAMPLES + 1)
    with pytest.raises(ValueError, match="num_samples"):
        klviz.categorical_counts(torch.tensor([0.5, 0.5]), 10**30)


# ----------------------------------------------------------------------------- distributions and generators
@pytest.mark.parametrize(
    "q,p,word",
    [
        (Normal(torch.tensor(0.0), torch.tensor(-1.0), validate_args=False), Normal(0.0, 1.0), "q"),
        (Normal(0.0, 1.0), Normal(torch.tensor(0.0), torch.tensor(0.0), validate_args=False), "p"),
        (Normal(torch.tensor(float("nan")), torch.tensor(1.0), validate_args=False), Normal(0.0, 1.0), "q"),
        (Categorical(probs=torch.tensor([0.5, 0.5])), Categorical(probs=torch.tensor([0.2, 0.3, 0.5])), "categories"),
        (Normal(torch.zeros(2), torch.ones(2)), Normal(torch.zeros(2), torch.ones(2)), "batch_shape"),
        (Normal(0.0, 1.0), Categorical(probs=torch.tensor([0.5, 0.5])), "kind"),
        ("N(0, 1)", Normal(0.0, 1.0), "q"),
    ],
)
def test_estimator_stats_refuses_bad_distributions_by_name(q, p, word):
    with pytest.raises((ValueError, TypeError), match=word):
        klviz.estimator_stats(q, p, 100)


@pytest.mark.parametrize("seed", [-1, 2**64, 1.5, "3", True, None, float("nan")])
def test_make_generator_refuses_bad_seeds(seed):
    with pytest.raises((ValueError, TypeError), match="seed"):
        klviz.make_generator(seed)


def test_make_generator_accepts_numpy_integers():
    a = torch.rand(3, generator=klviz.make_generator(np.int64(7)))
    assert torch.equal(a, torch.rand(3, generator=klviz.make_generator(7)))


@pytest.mark.parametrize(
    "probs,word",
    [
        (torch.tensor([0.5, float("nan"), 0.5]), "NaN"),
        (torch.tensor([0.5, -0.1, 0.6]), "negative"),
        (torch.zeros(3), "zero"),
        (torch.empty(0), "empty"),
        (torch.full((2, 3), 1 / 3), "1-D"),
        ([True, False], "bool"),
        ("0.5 0.5", "str"),
        (torch.tensor([0.5, float("inf")]), "inf"),
    ],
)
def test_categorical_counts_refuses_bad_probabilities(probs, word):
    with pytest.raises((ValueError, TypeError), match="probs") as err:
        klviz.categorical_counts(probs, 10)
    assert word.lower() in str(err.value).lower()


def test_categorical_counts_normalises_unnormalised_weights():
    counts = klviz.categorical_counts(torch.tensor([1.0, 3.0]), 40_000, generator=klviz.make_generator(0))
    assert int(counts.sum()) == 40_000
    assert abs(float(counts[1]) / 40_000 - 0.75) < 4 * math.sqrt(0.75 * 0.25 / 40_000)


# ----------------------------------------------------------------------------- properties
@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-80, 80, allow_nan=False, width=32), min_size=1, max_size=20))
def test_estimators_never_return_nan_for_finite_input(values):
    x = torch.tensor(values, dtype=torch.float32)
    for f in (klviz.k1, klviz.k2, klviz.k3):
        assert not bool(torch.isnan(f(x)).any())
    assert bool((klviz.k3(x) >= 0).all()) and bool((klviz.k2(x) >= 0).all())
    lp = -x.abs() - 0.01
    assert bool(torch.isfinite(klviz.kl_penalty(lp, torch.zeros_like(lp), "low_var_kl")).all())
