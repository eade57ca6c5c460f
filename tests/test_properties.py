"""Property tests (hypothesis): signs, directions and dtypes hold for every input, not just examples."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import klviz

finite32 = st.floats(min_value=-80, max_value=80, allow_nan=False, width=32)
log_r_arrays = arrays("float32", st.integers(1, 64), elements=finite32)
probs = st.lists(st.floats(min_value=1e-3, max_value=1.0), min_size=2, max_size=12)


@settings(max_examples=200, deadline=None)
@given(log_r_arrays)
def test_k2_k3_never_negative_and_k3_accurate(a):
    x = torch.from_numpy(a)
    assert (klviz.k2(x) >= 0).all()
    v = klviz.k3(x)
    assert torch.isfinite(v).all() and (v >= 0).all()
    ref = torch.tensor([_k3_reference(float(t)) for t in x.double()], dtype=torch.float64)
    assert torch.allclose(v.double(), ref, rtol=2e-6, atol=1e-37)


def _k3_reference(x: float) -> float:
    """(e^x - 1) - x: the exponential series from x² on for small |x| (no cancellation), else float64."""
    if abs(x) > 0.5:
        return math.expm1(x) - x
    term, total, n = x * x / 2, 0.0, 2
    while abs(term) > 1e-30 * abs(total) and n < 60:
        total += term
        n += 1
        term *= x / n
    return total


@settings(max_examples=150, deadline=None)
@given(probs, probs)
def test_k1_and_k3_expectations_are_kl_from_the_sampler(pq, pp):
    n = min(len(pq), len(pp))
    q = torch.tensor(pq[:n], dtype=torch.float64)
    p = torch.tensor(pp[:n], dtype=torch.float64)
    q, p = q / q.sum(), p / p.sum()
    log_r = (p / q).log()  # target over sampler, x ~ q
    kl_qp = float((q * (q / p).log()).sum())
    kl_pq = float((p * (p / q).log()).sum())
    e1 = float((q * klviz.k1(log_r)).sum())
    e3 = float((q * klviz.k3(log_r)).sum())
    e2 = float((q * klviz.k2(log_r)).sum())
    assert math.isclose(e1, kl_qp, rel_tol=1e-9, abs_tol=1e-12)
    assert math.isclose(e3, kl_qp, rel_tol=1e-9, abs_tol=1e-12)
    assert e2 >= 0
    # the other direction, from the same samples: r log r - (r - 1)
    r = log_r.exp()
    assert math.isclose(float((q * (r * log_r - (r - 1))).sum()), kl_pq, rel_tol=1e-9, abs_tol=1e-12)
    assert math.isclose(float(klviz.categorical_kl(q, p)), kl_qp, rel_tol=1e-9, abs_tol=1e-12)


@settings(max_examples=60, deadline=None)
@given(
    arrays("float32", st.tuples(st.integers(1, 4), st.integers(1, 9)), elements=st.floats(-30, 30, width=32)),
    st.sampled_from([torch.float16, torch.bfloat16, torch.float32, torch.float64]),
)
def test_dtypes_are_handled(a, dtype):
    x = torch.from_numpy(a).to(dtype)
    expected = torch.float64 if dtype == torch.float64 else torch.float32
    for fn in (klviz.k1, klviz.k2, klviz.k3):
        assert fn(x).dtype == expected
    for kind in klviz.KL_PENALTY_KINDS:
        out = klviz.kl_penalty(x, torch.zeros_like(x), kind)
        assert out.dtype == expected and torch.isfinite(out).all()
    assert klviz.exact_kl(x, x.flip(-1)).dtype == expected
    assert torch.isfinite(klviz.exact_kl(x, x.flip(-1))).all()


@settings(max_examples=100, deadline=None)
@given(arrays("float64", st.tuples(st.integers(1, 5), st.integers(1, 8)), elements=st.floats(-1e3, 1e3)), st.data())
def test_straight_through_keeps_forward_values_and_masked_mean_matches_loop(a, data):
    v = torch.from_numpy(a)
    for kind in klviz.KL_PENALTY_KINDS:
        assert torch.equal(klviz.kl_penalty(v, v * 0.5, kind + "+"), klviz.kl_penalty(v, v * 0.5, kind))
    mask = torch.tensor(data.draw(arrays("bool", a.shape)))
    mm = klviz.masked_mean(v, mask).item()
    sel = v[mask]
    assert math.isclose(mm, float(sel.mean()) if sel.numel() else 0.0, rel_tol=1e-12, abs_tol=1e-9)
