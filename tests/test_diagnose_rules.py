"""Each trouble rule of ``klviz.diagnose.rules`` on a dump made to show it, and the format guide's table of codes.

Every rule in ``RULES`` has a case here (``CASES``: a batch that must raise it); the clean batch raises none of
the warnings or errors. A test fails when a rule is added without a case.
"""

from __future__ import annotations

import re

import pytest
import torch

from klviz import diagnose as dg
from klviz.diagnose import rules


def _clean(seed=0, B=48, T=40, V=30, spread=0.3):
    """Tokens sampled from π with their exact log-probs under π and a nearby reference."""
    g = torch.Generator().manual_seed(seed)
    pol = 1.5 * torch.randn(B, T, V, generator=g, dtype=torch.float64)
    ref = pol + spread * torch.randn(B, T, V, generator=g, dtype=torch.float64)
    x = torch.multinomial(pol.softmax(-1).reshape(-1, V), 1, generator=g).reshape(B, T, 1)
    lengths = torch.randint(T // 2, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None] < lengths[:, None]).to(torch.int64)
    lp = pol.log_softmax(-1).gather(-1, x)[..., 0]
    lr = ref.log_softmax(-1).gather(-1, x)[..., 0]
    return lp, lr, mask, g


def _diag(lp, ref, mask, old=None, **kw):
    return dg.diagnose(dg.rollouts_from_tensors(lp, ref, mask, old, **kw))


def _nonfinite():
    lp, ref, m, _ = _clean()
    ref[0, 0] = float("nan")
    return _diag(lp, ref, m)


def _trl_padding(counted):
    lp, ref, m, _ = _clean()
    b = m.bool()
    lp, ref = lp.masked_fill(~b, 1.0), ref.masked_fill(~b, 1.0)
    return _diag(lp, ref, torch.ones_like(m) if counted else m)


def _positive():
    lp, ref, m, _ = _clean()
    return _diag(lp + 3.0, ref, m)


def _mask_shifted():
    lp, ref, m, _ = _clean()
    m[:, 0] = 1
    lp, ref = lp.masked_fill(m == 0, 0.0), ref.masked_fill(m == 0, 0.0)
    shifted = torch.zeros_like(m)
    shifted[:, 1:] = m[:, :-1]
    return _diag(lp, ref, shifted)


def _misaligned():
    lp, ref, m, _ = _clean()
    late = lp.clone()
    late[:, 1:] = lp[:, :-1]  # the policy's log-prob of token t stored at t + 1
    return _diag(late, ref, m)


def _not_sampler():
    lp, ref, m, g = _clean()
    lp = lp - 5.0
    hit = torch.rand(lp.shape, generator=g, dtype=torch.float64) < 0.5
    return _diag(lp, torch.where(hit, lp + 3.0, lp), m)  # π_ref/π = e^3 > 10 on half the tokens: Markov allows 10 %


def _large():
    lp, ref, m, _ = _clean()
    lp[0, 0] = ref[0, 0] - 12.0  # log r = 12 on one token
    return _diag(lp, ref, m)


def _k1_negative():
    lp, _ref, m, _ = _clean()
    return _diag(lp - 1.0, lp - 0.5, m)  # log r = 0.5 on every token


def _k1_negative_off_policy():
    lp, ref, m, g = _clean()
    old = lp + 0.8 * torch.randn(lp.shape, generator=g, dtype=torch.float64)
    return _diag(lp - 1.0, lp - 0.6, m, old - 1.0)


def _k1_noise():
    g = torch.Generator().manual_seed(3)
    lp = -1.0 - torch.rand(16, 8, generator=g, dtype=torch.float64)
    noise = 0.05 * torch.randn(16, 8, generator=g, dtype=torch.float64)
    ref = lp + noise - noise.mean() + 0.004  # k1 mean exactly -0.004, its SE about 0.004
    return _diag(lp, ref, torch.ones(16, 8))


def _heavy_tail():
    lp, ref, m, g = _clean()
    hit = torch.rand(lp.shape, generator=g, dtype=torch.float64) < 0.005
    return _diag(lp - 6.0, torch.where(hit, lp - 1.0, lp - 6.0 + 0.05), m)


def _low_precision():
    lp, ref, m, _ = _clean()
    return _diag(lp.bfloat16(), ref.bfloat16(), m)


def _off_policy(shift):
    lp, ref, m, g = _clean()
    return _diag(lp, ref, m, (lp + shift * torch.randn(lp.shape, generator=g, dtype=torch.float64)).clamp(max=-1e-4))


def _empty():
    lp, ref, m, _ = _clean()
    m[3] = 0
    return _diag(lp, ref, m)


def _last_token():
    lp, ref, m, _ = _clean()
    last = m.sum(1) - 1
    ref[torch.arange(len(last)), last] = lp[torch.arange(len(last)), last] + 2.5
    return _diag(lp, ref.clamp(max=-1e-4), m)


def _identical():
    lp, _ref, m, _ = _clean()
    return _diag(lp, lp.clone(), m)


def _engine(shift, noise=0.0, T=40):
    lp, ref, m, g = _clean(T=T)
    ro = lp + shift + noise * torch.randn(lp.shape, generator=g, dtype=torch.float64)
    return _diag(lp, ref, m, rollout_logprob=ro.clamp(max=-1e-4))


CASES = {
    "nonfinite": _nonfinite,
    "trl_padding_counted": lambda: _trl_padding(True),
    "trl_padding": lambda: _trl_padding(False),
    "positive_logprobs": _positive,
    "mask_shifted": _mask_shifted,
    "logprob_misaligned": _misaligned,
    "not_sampler_tokens": _not_sampler,
    "large_log_ratio": _large,
    "k1_negative": _k1_negative,
    "k1_negative_off_policy": _k1_negative_off_policy,
    "k1_negative_noise": _k1_noise,
    "mean_ratio": _k1_negative,
    "heavy_tail": _heavy_tail,
    "low_precision": _low_precision,
    "off_policy": lambda: _off_policy(0.2),
    "clip_fraction": lambda: _off_policy(1.0),
    "empty_sequences": _empty,
    "last_token": _last_token,
    "identical": _identical,
    "engine_mismatch": lambda: _engine(0.0, noise=0.3),
    "engine_support": lambda: _engine(0.2, noise=0.02),
    "engine_temperature": lambda: _engine(-0.2, noise=0.02),
    "length_trap": lambda: _engine(0.01, T=200),
}


def _codes(d):
    return {t.code: t.severity for t in d.trouble}


def test_every_rule_has_a_case():
    assert set(CASES) == {r.code for r in rules.RULES}


@pytest.mark.parametrize("code", [r.code for r in rules.RULES])
def test_rule_fires_on_its_fault(code):
    d = CASES[code]()
    found = _codes(d)
    assert code in found, (code, found)
    rule = rules.rule(code)
    t = next(t for t in d.trouble if t.code == code)
    assert t.severity in rules.SEVERITIES and t.message and t.advice
    if code != "engine_mismatch":  # the only rule whose severity depends on the size found
        assert t.severity == rule.severity


def test_a_clean_batch_raises_no_warning_or_error():
    lp, ref, m, _ = _clean()
    d = _diag(lp, ref, m)
    assert not {c for c, s in _codes(d).items() if s != "info"}, d.trouble


def test_misalignment_is_an_error_and_no_estimator_advice_is_given():
    """A policy one position late: an error that says so, and no advice to log another estimator."""
    d = _misaligned()
    t = next(t for t in d.trouble if t.code == "logprob_misaligned")
    assert t.severity == "error" and "one position late" in t.message and "logprob[t+1]" in t.message
    for tr in d.trouble:
        assert "steadier" not in tr.advice
        if tr.code == "heavy_tail":
            assert "Fix the data first" in tr.advice
    assert d.alignment["ref_logprob|logprob"]["mean_abs"][1] < 0.5 * d.alignment["ref_logprob|logprob"]["mean_abs"][0]


def test_temperature_advice_leads_with_the_cause():
    d = _engine(-0.2, noise=0.02)
    t = next(t for t in d.trouble if t.code == "engine_temperature")
    assert t.advice.startswith("Above 1") and t.advice.index("Divide") < t.advice.index("Truncated IS")
    mm = next(r for r in rules.RULES if r.code == "engine_mismatch")
    assert mm.advice.index("divide the trainer's logits") < mm.advice.index("truncated importance sampling")


def test_the_header_says_who_sampled():
    d = _engine(0.0, noise=0.3)
    text = dg.format_report(d)
    assert "tokens sampled by: the rollout engine (rollout_logprob)" in text
    assert "assumed on-policy" not in text and "(tokens sampled by π)" not in text
    assert "rollout engine" in d.directions["k1"] and "engine" in d.agreement["rows"]
    lp, ref, m, _ = _clean()
    assert "assumed on-policy" in dg.format_report(_diag(lp, ref, m))


def test_the_format_guide_tables_are_the_registries():
    from klviz.diagnose import identify

    guide = dg.format_guide_path().read_text(encoding="utf-8")
    assert identify.markdown_table() in guide, "regenerate the tables: python scripts/format_guide_tables.py"


def test_the_format_guide_table_is_the_registry():
    guide = dg.format_guide_path().read_text(encoding="utf-8")
    table = rules.markdown_table()
    assert table in guide, "regenerate the tables: python scripts/format_guide_tables.py"
    section = guide[guide.index(rules.GUIDE_START) : guide.index(rules.GUIDE_END)]
    codes_in_guide = set(re.findall(r"^\| `([a-z0-9_]+)` \|", section, flags=re.M))
    assert codes_in_guide == {r.code for r in rules.RULES}
