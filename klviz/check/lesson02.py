"""Checks for lesson 02's exercises: k3 itself, its direction, the best control variate, the crossing.

Each check tests the learner's answer on cases the lesson did not show and says in one sentence
what is wrong (inverted ratio, swapped direction, lost precision, a forgotten term).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import torch

from ..estimators import k1 as _k1
from ..estimators import k2 as _k2
from ..estimators import k3 as _k3
from ..messages import tr
from ..tables import variance_crossing_mu
from . import (
    CheckResult,
    WrongAnswer,
    as_answer_number,
    as_answer_tensor,
    clamp_hint,
    failed,
    learner_answer,
    learner_tensor,
    never_raises,
    not_attempted,
    passed,
)

__all__ = ["k3_estimator", "k3_direction", "best_lambda", "variance_crossing", "k2_sign_rule", "k1_quieter_close_pair"]


def _close(a: torch.Tensor, b: torch.Tensor, rtol: float = 1e-6, atol: float = 1e-12) -> bool:
    return bool(torch.isfinite(a).all()) and bool(torch.allclose(a, b, rtol=rtol, atol=atol))


@never_raises
def k3_estimator(fn: Callable[[torch.Tensor], Any]) -> CheckResult:
    """Check ``fn(log_r) -> k3`` per sample, with ``log_r = log p(x) - log q(x)`` (target minus sampler)."""
    log_r = torch.tensor([-3.0, -1.2, -0.4, -0.05, 0.0, 0.07, 0.3, 1.0, 2.5, 4.0], dtype=torch.float64)
    out = learner_tensor(fn, (log_r.clone(),), log_r.shape, tr("your k3"))
    if isinstance(out, CheckResult):
        return out
    right = _k3(log_r)
    if not _close(out, right):
        if _close(out, _k3(-log_r)):
            return failed(
                tr(
                    "You inverted the ratio: with x ~ q and log_r = log p - log q, r = exp(log_r) = p/q; "
                    "your version uses q/p, whose mean is chi²(q‖p) - KL(q‖p), not KL(q‖p) (a common bug)."
                )
            )
        if _close(out, _k1(log_r)):
            return failed(tr("That is k1 = -log r; k3 adds the control variate r - 1: k3 = (r - 1) - log r."))
        if _close(out, _k2(log_r)):
            return failed(tr("That is k2 = ½ (log r)²; k3 is (r - 1) - log r."))
        if _close(out, torch.expm1(log_r) + log_r):
            return failed(tr("Sign of the log term: k3 = (r - 1) - log r, which is never negative (log r ≤ r - 1)."))
        hint = clamp_hint(out, right, _k3, log_r)
        if hint:
            return failed(hint)
        if bool((out < -1e-12).any()):
            return failed(
                tr("Your values go negative, but k3 = (r - 1) - log r is never negative because log r ≤ r - 1.")
            )
        return failed(
            tr(
                "At log_r = {tolist} k3 should be {v}, yours gave {v2}.",
                tolist=log_r.tolist(),
                v=[round(v, 6) for v in right.tolist()],
                v2=[round(v, 6) for v in out.tolist()],
            )
        )
    # precision: float32 inputs with tiny |log r|, where exp(x) - 1 - x cancels catastrophically
    tiny = torch.tensor([1e-3, -2e-3, 5e-4, -4e-4, 3e-4, -1e-4], dtype=torch.float32)
    small = learner_tensor(fn, (tiny.clone(),), tiny.shape, tr("your k3 on float32 input"), when=tr("on float32 input"))
    if isinstance(small, CheckResult):
        return small
    truth = _k3(tiny.double())
    if not _close(small, truth, rtol=1e-2, atol=0.0):  # expm1: < 1e-3; exp(x) - 1: > 0.1
        return failed(
            tr(
                "Right formula, but in float32 it loses its digits for small |log r| (exp(x) - 1 cancels): "
                "compute r - 1 as torch.expm1(log_r) (open-instruct does; the plain exp(x) - 1 of verl's "
                "low_var_kl does not)."
            )
        )
    big = torch.tensor([30.0, -30.0], dtype=torch.float64)
    large = learner_tensor(fn, (big.clone(),), big.shape, tr("your k3 for |log r| = 30"), when=tr("for |log r| = 30"))
    if isinstance(large, CheckResult):
        return large
    if not _close(large, _k3(big), rtol=1e-9):
        hint = clamp_hint(large, _k3(big), _k3, big)
        return failed(
            hint or tr("Your k3 is wrong for large |log r| (tried ±30 in float64); do not clamp or approximate it.")
        )
    return passed(
        tr(
            "k3 = expm1(log r) - log r: unbiased for KL(q‖p), never negative, and in float32 accurate to "
            "1 % down to |log r| = 1e-4."
        )
    )


_POLICY = torch.tensor([2.0, 0.4, -0.3, 1.1, -1.5, 0.0, 0.8, -2.2], dtype=torch.float64)
_REF = torch.tensor([1.2, 0.9, 0.1, 1.4, -0.2, -0.8, 0.3, -1.0], dtype=torch.float64)


@never_raises
def k3_direction(fn: Callable[[torch.Tensor, torch.Tensor], Any]) -> CheckResult:
    """Check ``fn(logprob, ref_logprob)``: tokens sampled from the policy; per-token k3 of KL(pi || pi_ref).

    The check evaluates the learner's function on *every* token of a vocabulary it was not shown
    and takes the exact expectation under the policy, sum_x pi(x) f(x): it must equal KL(pi || pi_ref).
    """
    logp = torch.log_softmax(_POLICY, -1)
    ref = torch.log_softmax(_REF, -1)
    out = learner_tensor(fn, (logp.clone(), ref.clone()), logp.shape, tr("your function"))
    if isinstance(out, CheckResult):
        return out
    pi = logp.exp()
    mean = float((pi * out).sum())
    kl_fwd = float((pi * (logp - ref)).sum())  # KL(pi || pi_ref): the target
    kl_rev = float((ref.exp() * (ref - logp)).sum())  # KL(pi_ref || pi)
    if _close(out, _k3(ref - logp)):
        return passed(
            tr(
                "log r = ref_logprob - logprob: on this vocabulary E_pi[your k3] = {mean:.5f} = "
                "KL(pi‖pi_ref) exactly (KL(pi_ref‖pi) would be {kl_rev:.5f}).",
                mean=mean,
                kl_rev=kl_rev,
            )
        )
    if _close(out, _k3(logp - ref)):
        return failed(
            tr(
                "Ratio inverted (a common bug): the tokens come from pi, so r = pi_ref/pi and log r = "
                "ref_logprob - logprob; your version averages to {mean:.5f} under pi instead of "
                "KL(pi‖pi_ref) = {kl_fwd:.5f} (it estimates chi² - KL).",
                mean=mean,
                kl_fwd=kl_fwd,
            )
        )
    if abs(mean - kl_fwd) < 1e-9 and bool((out >= -1e-12).all()):
        return passed(
            tr("Your estimator averages to KL(pi‖pi_ref) = {kl_fwd:.5f} and is never negative.", kl_fwd=kl_fwd)
        )
    if abs(mean - kl_fwd) < 1e-9:
        return failed(tr("Your estimator has the right mean but goes negative on some tokens: that is k1, not k3."))
    if abs(mean - kl_rev) < 1e-6:
        return failed(
            tr(
                "Direction swapped: your function averages to KL(pi_ref‖pi) = {kl_rev:.5f}, but with "
                "tokens from pi the target is KL(pi‖pi_ref) = {kl_fwd:.5f}.",
                kl_rev=kl_rev,
                kl_fwd=kl_fwd,
            )
        )
    return failed(
        tr(
            "Under the policy your function averages to {mean:.5f}; KL(pi‖pi_ref) is {kl_fwd:.5f}. "
            "Use log r = ref_logprob - logprob and k3 = (r - 1) - log r.",
            mean=mean,
            kl_fwd=kl_fwd,
        )
    )


@never_raises
def best_lambda(fn: Callable[[float], Any]) -> CheckResult:
    """Check ``fn(mu)``: the lambda minimising Var(k1 + lambda (r - 1)) for q = N(0,1), p = N(mu,1)."""
    mus = (0.3, 0.7, 1.3, 2.0)
    got = []
    for mu in mus:
        value = learner_answer(
            fn, mu, convert=functools.partial(as_answer_number, what=tr("your best_lambda({mu})", mu=mu), finite=True)
        )
        if isinstance(value, CheckResult):
            return value
        got.append(value)

    def matches(f: Callable[[float], float]) -> bool:
        return all(math.isclose(g, f(m), rel_tol=1e-6, abs_tol=1e-12) for g, m in zip(got, mus))

    if matches(lambda m: m * m / math.expm1(m * m)):
        return passed(
            tr(
                "lambda* = mu²/(e^{mu²} - 1) = -Cov(k1, r)/Var(r): near 1 (k3) for close policies, "
                "much smaller far apart."
            )
        )
    if matches(lambda m: 1.0):
        return failed(
            tr(
                "lambda = 1 is k3: the best choice only in the limit mu -> 0; minimise "
                "Var k1 - 2 lambda mu² + lambda² (e^{mu²} - 1) over lambda."
            )
        )
    if matches(lambda m: m * m / math.exp(m * m)):
        return failed(tr("Almost: Var(r) = E[r²] - 1 = e^{mu²} - 1, you dropped the - 1."))
    if matches(lambda m: math.expm1(m * m) / (m * m)):
        return failed(tr("Upside down: lambda* = -Cov(k1, r) / Var(r) = mu² / (e^{mu²} - 1)."))
    if matches(lambda m: m / math.expm1(m)):
        return failed(tr("Use mu² where you used mu: Cov(log r, r) = mu² and Var(r) = e^{mu²} - 1."))
    if matches(lambda m: -m * m / math.expm1(m * m)):
        return failed(tr("Sign: Cov(k1, r) = -mu² is negative, so lambda* = -Cov(k1, r)/Var(r) is positive."))
    return failed(
        tr(
            "At mu = {mus} the best lambda is {v}; yours gave {v2}. Minimise mu² - 2 lambda mu² + "
            "lambda² (e^{{mu²}} - 1).",
            mus=mus,
            v=[round(m * m / math.expm1(m * m), 5) for m in mus],
            v2=[round(g, 5) for g in got],
        )
    )


@never_raises
def variance_crossing(answer: Any) -> CheckResult:
    """Check the mu > 0 at which Var k1 = Var k3 for q = N(0, 1), p = N(mu, 1) (to 3 decimals)."""
    if answer is Ellipsis or answer is None:
        return not_attempted()
    try:
        v = as_answer_number(answer, tr("your answer"), finite=True)
    except WrongAnswer as err:
        return failed(str(err))
    mu_star = variance_crossing_mu()
    if abs(v - mu_star) < 1e-3:
        return passed(
            tr(
                "mu = {mu_star:.4f}: beyond it Var k1 = mu² is smaller than Var k3 = e^(mu²) - 1 - mu².",
                mu_star=mu_star,
            )
        )
    if abs(v - mu_star**2) < 1e-3:
        return failed(tr("{v:.4f} is mu² (the root t of e^t = 1 + 2t); the crossing in mu is its square root.", v=v))
    k2_cross = math.sqrt(math.sqrt(5.0) - 1.0)
    if abs(v - k2_cross) < 1e-3:
        return failed(tr("That is where Var k2 = mu⁴/2 + mu⁶/4 crosses Var k1; the question asks about k3."))
    if v <= 0:
        return failed(tr("The crossing is at a positive mu (at mu = 0 both variances are 0)."))
    var1, var3 = v * v, math.expm1(v * v) - v * v
    side = tr("k3 still has the smaller variance there") if var3 < var1 else tr("k1 already wins there")
    return failed(
        tr(
            "At mu = {v:.4f}, Var k1 = {var1:.4f} and Var k3 = {var3:.4f}: {side}. Solve e^(mu²) - 1 - mu² = mu².",
            v=v,
            var1=var1,
            var3=var3,
            side=side,
        )
    )


def _rule_cases() -> list[tuple[torch.Tensor, torch.Tensor, str]]:
    """Token pairs the lesson did not show: pushes up and down, sharpened and flattened p."""
    gen = torch.Generator().manual_seed(202)
    cases = []
    for vocab in (3, 9, 40, 400):
        logits = torch.randn(vocab, generator=gen, dtype=torch.float64) * 1.5
        q = torch.softmax(logits, -1)
        rare, common = int(q.argmin()), int(q.argmax())
        some = int(torch.randint(vocab, (1,), generator=gen))

        def pushed(j: int, by: float, logits: torch.Tensor = logits) -> torch.Tensor:
            out = logits.clone()
            out[j] += by
            return out

        moves = {
            "a rare token pushed up by 0.3": pushed(rare, 0.3),
            "a common token pushed down by 0.4": pushed(common, -0.4),
            "p sharpened (temperature 0.7)": logits / 0.7,
            "p flattened (temperature 2.5)": logits / 2.5,
            "a token pushed up by 2": pushed(some, 2.0),
        }
        for name, moved in moves.items():
            cases.append((q, torch.softmax(moved, -1), f"V = {vocab}, {name}"))
    return cases


@never_raises
def k2_sign_rule(fn: Callable[[torch.Tensor, torch.Tensor], Any]) -> CheckResult:
    """Check ``fn(q_probs, p_probs) -> +1, -1 or 0``: the sign of k2's bias predicted by the third-moment rule
    (0 where the fourth-order bound is larger than the cubic term, so the rule does not decide)."""
    from ..tables import k2_bias_rule

    cases = _rule_cases()
    got = []
    for q, p, _ in cases:
        value = learner_answer(fn, q.clone(), p.clone(), convert=lambda v: as_answer_number(v, tr("your prediction")))
        if isinstance(value, CheckResult):
            return value
        got.append(value)
    rules = [k2_bias_rule(q, p) for q, p, _ in cases]
    want = [r["predicted_sign"] for r in rules]
    if [int(v) for v in got] == want and all(v in (-1, 0, 1) for v in got):
        decided = sum(w != 0 for w in want)
        right = sum(w != 0 and math.copysign(1, r["bias"]) == w for w, r in zip(want, rules))
        return passed(
            tr(
                "Your rule decides {decided} of the {n_cases} moves and every decided sign matches the "
                "measured bias ({right} of {decided}); on the others only the whole series says.",
                decided=decided,
                n_cases=len(cases),
                right=right,
            )
        )
    u3 = []
    skew = []
    for q, p, _ in cases:
        u = torch.log(p) - torch.log(q)
        u3.append(int(math.copysign(1, -float((q * u**3).sum()))))
        c = u - (q * u).sum()
        skew.append(int(math.copysign(1, -float((q * c**3).sum()))))
    measured = [int(math.copysign(1, r["bias"])) for r in rules]
    if [int(v) for v in got] == [-s for s in u3]:
        return failed(tr("Sign flipped: the bias is −E[u³]/6 − …, so a positive E[(log r)³] means a negative bias."))
    if [int(v) for v in got] == u3:
        return failed(
            tr(
                "Right direction, but the rule only decides where |E[u³]|/6 exceeds E[u⁴ max(1, r)]/24: return 0 "
                "elsewhere (there the fourth and higher orders can flip the sign)."
            )
        )
    if [int(v) for v in got] == skew:
        return failed(
            tr(
                "That is the sign of the *central* third moment (the skew). The series is in raw moments of u = log r, "
                "which include E[u] = −KL: use E_q[(log r)³] itself."
            )
        )
    if [int(v) for v in got] == measured:
        return failed(
            tr(
                "Those are the measured signs of the bias; the exercise asks for the prediction from the moments of "
                "log r, which must say 0 where it cannot decide."
            )
        )
    first = next(i for i, (a, b) in enumerate(zip(got, want)) if int(a) != b)
    return failed(
        tr(
            "For {cases_2} the rule says {want:+d}, your function said {got:+g}.",
            cases_2=cases[first][2],
            want=want[first],
            got=got[first],
        )
    )


@never_raises
def k1_quieter_close_pair(answer: Any) -> CheckResult:
    """Check ``(q_probs, p_probs)``: a token pair with KL(q‖p) < 0.01 on which k1 has the smaller spread."""
    if answer is Ellipsis or answer is None:
        return not_attempted()
    if not (isinstance(answer, (tuple, list)) and len(answer) == 2):
        return failed(tr("Give a pair (q_probs, p_probs): two probability vectors of the same length."))
    q = as_answer_tensor(answer[0], tuple(torch.as_tensor(answer[0]).shape), "q_probs")
    p = as_answer_tensor(answer[1], tuple(q.shape), "p_probs", finite=True)
    if q.dim() != 1 or q.numel() < 2:
        return failed(tr("q_probs must be one vector of at least two probabilities."))
    for name, v in (("q_probs", q), ("p_probs", p)):
        if bool((v < 0).any()) or abs(float(v.sum()) - 1) > 1e-6:
            return failed(
                tr(
                    "{name} must be probabilities: non-negative and summing to 1 (it sums to {sum:.6g}).",
                    name=name,
                    sum=float(v.sum()),
                )
            )
    support = q > 0
    if bool((p[support] <= 0).any()):
        return failed(tr("p is 0 on a token q can draw: KL(q‖p) is infinite there."))
    w, u = q[support], torch.log(p[support]) - torch.log(q[support])
    kl = float((w * _k3(u)).sum())
    if not kl > 0:
        return failed(tr("p = q: the KL is 0 and every estimator is exactly 0; move p a little."))
    if kl >= 0.01:
        return failed(tr("KL(q‖p) = {kl:.4f}: the pair is not close (the exercise asks for a KL below 0.01).", kl=kl))

    def spread(v: torch.Tensor) -> float:
        m = (w * v).sum()
        return float((w * (v - m).square()).sum().sqrt())

    s1, s3 = spread(_k1(u)), spread(_k3(u))
    top = float(u.abs().max())
    if s1 < s3:
        return passed(
            tr(
                "KL {kl:.4f}, yet k1's spread {s1:.4g} is below k3's {s3:.4g}: the largest |log r| is "
                "{top:.2f}. 'Close' in KL is not close on every token; k3's advantage needs small |log "
                "r| on all of them.",
                kl=kl,
                s1=s1,
                s3=s3,
                top=top,
            )
        )
    return failed(
        tr(
            "KL {kl:.4f}, but k3 is still the quieter ({s3:.4g} against k1's {s1:.4g}); the largest "
            "|log r| is {top:.2f}. k3 loses only where some token q can draw has a large log r "
            "(above about 1.26): push a rare token up hard, keeping the KL small because q rarely "
            "draws it.",
            kl=kl,
            s3=s3,
            s1=s1,
            top=top,
        )
    )
