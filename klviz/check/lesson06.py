"""Checks for the exercises of lesson 06 (pitfalls and your own rollouts)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .. import kernel
from ..messages import tr
from . import CheckResult, WrongAnswer, failed, learner_answer, never_raises, passed


def _call(fn: Callable[..., Any], *args: Any, convert: Callable[[Any], Any] | None = None) -> Any:
    """:func:`klviz.check.learner_answer` on copies of the tensors (a learner may change them in place)."""
    return learner_answer(fn, *[a.clone() if isinstance(a, torch.Tensor) else a for a in args], convert=convert)


def _as64(out: Any) -> torch.Tensor:
    """A learner's answer as a float64 tensor, or :class:`WrongAnswer` saying it is not numbers."""
    if isinstance(out, (str, bytes, dict)) or callable(out):
        raise WrongAnswer(tr("Return a tensor of numbers, not a {name}.", name=type(out).__name__))
    if isinstance(out, torch.Tensor) and (out.is_complex() or out.dtype == torch.bool):
        raise WrongAnswer(tr("Return real numbers, not a tensor of {dtype}.", dtype=out.dtype))
    try:
        return out.detach().double() if isinstance(out, torch.Tensor) else torch.as_tensor(out, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError):
        raise WrongAnswer(
            tr("Return a tensor of numbers; got a {name} that is not one.", name=type(out).__name__)
        ) from None


@never_raises
def fixed_compute_kl(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> CheckResult:
    """Exercise 1: ``fn(logp_new, logp_old)``, tokens sampled by the old policy, must return the
    per-token k3 estimate of KL(old || new), accurate for tiny and finite for large log-ratios."""
    g = torch.Generator().manual_seed(606)
    old = -torch.rand(40, generator=g, dtype=torch.float64) * 6
    new = old + torch.randn(40, generator=g, dtype=torch.float64) * 1.5
    new[:3] = old[:3] + torch.tensor([1e-9, -3e-9, 2e-8], dtype=torch.float64)  # nearly equal policies
    new[3] = old[3] + 30.0
    log_r = new - old  # target (new) minus sampler (old)
    expected = kernel.k3(log_r)
    out = _call(fn, new, old, convert=_as64)
    if isinstance(out, CheckResult):
        return out
    if out.shape != expected.shape:
        return failed(
            tr(
                "Return one value per token: expected shape {tuple}, got {tuple2}.",
                tuple=tuple(expected.shape),
                tuple2=tuple(out.shape),
            )
        )
    if not bool(torch.isfinite(out).all()):
        return failed(
            tr(
                "Your function returns inf or NaN for a token whose log-ratio is 30: compute in a way that "
                "stays finite (k3 is e^30 - 31 there, large but finite in float64)."
            )
        )
    inverted = kernel.k3(-log_r)  # the same estimator fed the ratio upside down
    if torch.allclose(out, inverted, rtol=1e-6, atol=1e-12):
        return failed(
            tr(
                "Ratio inverted: that is the often-copied exp(logp_old - logp_new), sampler over target. With tokens "
                "from old, r must be new/old (target over sampler); the inverted version averages to "
                "chi²(old||new) - KL(old||new)."
            )
        )
    if torch.allclose(out, old - new, atol=1e-9):
        return failed(
            tr("That is k1 = log old - log new: unbiased but noisy and sometimes negative; the exercise asks for k3.")
        )
    body = slice(4, None)
    if not torch.allclose(out[body], expected[body], rtol=1e-6, atol=1e-9):
        return failed(tr("Not k3 of KL(old || new): use log r = logp_new - logp_old and return (r - 1) - log r."))
    rel = ((out[:3] - expected[:3]).abs() / expected[:3]).max()
    if float(rel) > 1e-3:
        return failed(
            tr(
                "Right formula, but for nearly equal policies (log r ≈ 1e-9) it loses every digit to "
                "cancellation: compute r - 1 as torch.expm1(log_r)."
            )
        )
    if not torch.allclose(out, expected, rtol=1e-6):
        return failed(tr("Close, but the token with log r = 30 is off: compute it as expm1(log_r) - log_r in float64."))
    return passed(
        tr(
            "k3 with r = new/old (target over sampler), computed as expm1(log r) - log r: unbiased for "
            "KL(old || new), never negative, accurate for tiny log-ratios."
        )
    )


@never_raises
def importance_weighted_kl(fn: Callable[..., Any]) -> CheckResult:
    """Exercise 2: ``fn(logprob, ref_logprob, old_logprob, mask)`` with tokens from pi_old must return the
    token-mean over the mask of an unbiased per-token estimate of KL(pi || pi_ref)."""
    g = torch.Generator().manual_seed(6060)
    B, T = 6, 9
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 4
    lp = old + 0.4 * torch.randn(B, T, generator=g, dtype=torch.float64)
    ref = old + 0.6 * torch.randn(B, T, generator=g, dtype=torch.float64)
    lengths = torch.tensor([9, 2, 5, 7, 1, 4])
    mask = (torch.arange(T)[None] < lengths[:, None]).to(torch.float64)
    lp_pad = torch.where(mask > 0, lp, torch.full_like(lp, -50.0))  # padding holds junk that must be ignored
    rho = torch.exp(lp - old)
    per_token = rho * (lp - ref)
    expected = float((per_token * mask).sum() / mask.sum())
    out = _call(fn, lp_pad, ref, old, mask)
    if isinstance(out, CheckResult):
        return out
    try:
        value = float(_as64(out).reshape(()))
    except (RuntimeError, ValueError, TypeError):
        return failed(tr("Return one number: the token-mean over the mask."))
    close = lambda v: abs(value - v) <= 1e-6 * max(1.0, abs(v))  # noqa: E731
    if close(expected):
        return passed(
            tr(
                "rho · k1 with rho = pi/pi_old, averaged over the masked tokens: unbiased for KL(pi "
                "|| pi_ref) at every "
                "position, given its prefix, although pi_old sampled the tokens (part (b): whole responses)."
            )
        )
    m = mask
    if close(float(((lp - ref) * m).sum() / m.sum())):
        return failed(
            tr(
                "No importance weight: on pi_old's tokens, log pi - log pi_ref averages to KL(old||ref) - "
                "KL(old||pi), not KL(pi||ref). Multiply each token by rho = exp(logprob - old_logprob)."
            )
        )
    if close(float((torch.exp(old - lp) * (lp - ref) * m).sum() / m.sum())):
        return failed(tr("Weight inverted: rho must be pi/pi_old = exp(logprob - old_logprob), target over sampler."))
    k3 = kernel.k3(ref - lp)
    if close(float((rho * k3 * m).sum() / m.sum())):
        return passed(tr("rho · k3, averaged over the mask: also unbiased for KL(pi || pi_ref), and never negative."))
    if close(float(((rho * (lp - ref) * m).sum(-1) / m.sum(-1)).mean())):
        return failed(
            tr(
                "Right weights, wrong aggregation: that is seq-mean-token-mean; the exercise asks for the token-mean "
                "(sum over all counted tokens / number of counted tokens)."
            )
        )
    if close(float((rho * (lp - ref)).mean())) or close(float((torch.exp(lp_pad - old) * (lp_pad - ref)).mean())):
        return failed(tr("The padding was counted: average only where mask is 1."))
    return failed(
        tr(
            "Not the importance-weighted estimate: per token rho · (logprob - ref_logprob) with "
            "rho = exp(logprob - old_logprob), then the mean over the counted tokens."
        )
    )


@never_raises
def sequence_importance_weighted_kl(fn: Callable[..., Any]) -> CheckResult:
    """Exercise 2, sequence part: ``fn(logprob, ref_logprob, old_logprob, mask)`` with whole responses sampled by
    pi_old must return the mean over responses of an unbiased estimate of the **sequence** KL(pi || pi_ref).

    Checked exactly: on an enumerable policy (vocabulary 3, length 3, all 27 responses), the pi_old-weighted mean of
    ``fn`` over single responses must equal the sequence KL; then on a padded batch the value must be the mean of
    its responses' values."""
    from ..bandit import SequenceToy

    toy = SequenceToy(3, 3)
    g = torch.Generator().manual_seed(6062)
    ref_l = toy.random_logits(1.0, generator=g)
    theta_l = ref_l + toy.random_logits(0.8, generator=g)
    old_l = theta_l + toy.random_logits(1.5, generator=g)
    with torch.no_grad():
        lp, ref, old = (toy.token_logprobs(x) for x in (theta_l, ref_l, old_l))
        q = toy.sequence_probs(old_l)
        target = float(toy.sequence_kl(theta_l, ref_l))
    ones = torch.ones(1, toy.length, dtype=torch.float64)
    values = []
    for y in range(lp.shape[0]):
        out = _call(fn, lp[y : y + 1], ref[y : y + 1], old[y : y + 1], ones)
        if isinstance(out, CheckResult):
            return out
        try:
            values.append(float(_as64(out).reshape(())))
        except (RuntimeError, ValueError, TypeError):
            return failed(tr("Return one number: the mean over the responses of each response's estimate."))
    v = torch.tensor(values, dtype=torch.float64)
    mean = float((q * v).sum())
    close = lambda a, b: abs(a - b) <= 1e-8 * max(1.0, abs(b))  # noqa: E731
    rho = torch.exp(lp - old)
    k1 = lp - ref
    per_token = float((q * (rho * k1).sum(-1)).sum())
    if not close(mean, target):
        if close(mean, per_token) or close(mean, float((q * (rho * kernel.k3(ref - lp)).sum(-1)).sum())):
            return failed(
                tr(
                    "Per-token rho corrects the choice of each token, not its prefix, which pi_old drew too: "
                    "its mean is {mean:.4f}, the sequence KL {target:.4f}. Weight token t by the product of "
                    "rho over the tokens up to and including t (exp of the cumulative sum of logprob - "
                    "old_logprob).",
                    mean=mean,
                    target=target,
                )
            )
        if close(mean, float((q * k1.sum(-1)).sum())):
            return failed(
                tr(
                    "No importance weight: pi_old drew the responses, so the plain sum of log pi - log "
                    "pi_ref averages to {mean:.4f}, not the sequence KL {target:.4f}.",
                    mean=mean,
                    target=target,
                )
            )
        if close(mean, target / toy.length):
            return failed(tr("A token mean: the sequence KL is the sum over a response's tokens (the chain rule)."))
        return failed(
            tr(
                "Its pi_old-weighted mean over all 27 responses is {mean:.4f}, the sequence KL(pi || "
                "pi_ref) is {target:.4f}: per response, sum_t (prod_(u<=t) rho_u) · (logprob_t - "
                "ref_logprob_t).",
                mean=mean,
                target=target,
            )
        )
    # a padded batch: the mean over its responses, padding ignored
    b_lp, b_ref, b_old = lp[:4].clone(), ref[:4].clone(), old[:4].clone()
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]], dtype=torch.float64)
    b_lp = torch.where(mask > 0, b_lp, torch.zeros_like(b_lp))  # junk in the padding: a weight of e^10
    b_old = torch.where(mask > 0, b_old, torch.full_like(b_old, -10.0))
    out = _call(fn, b_lp, b_ref, b_old, mask)
    if isinstance(out, CheckResult):
        return out
    try:
        got = float(_as64(out).reshape(()))
    except (RuntimeError, ValueError, TypeError):
        return failed(tr("Return one number: the mean over the responses."))
    singles = []  # the learner's own value of each response alone, without padding
    for b in range(4):
        n = int(mask[b].sum())
        one = _call(fn, b_lp[b : b + 1, :n], b_ref[b : b + 1, :n], b_old[b : b + 1, :n], torch.ones(1, n).double())
        if isinstance(one, CheckResult):
            return one
        singles.append(float(_as64(one).reshape(())))
    want = sum(singles) / len(singles)
    if not close(got, want):
        return failed(
            tr(
                "Unbiased over whole responses, but on a padded batch it gives {got:.4f} instead of "
                "{want:.4f}: sum each response over its own tokens only (mask the padding before the "
                "cumulative sum), then average over responses.",
                got=got,
                want=want,
            )
        )
    return passed(
        tr(
            "Each token weighted by the product of rho up to it: the prefix is corrected too, and the mean over "
            "pi_old's responses is the sequence KL(pi || pi_ref) exactly (checked over all 27 responses)."
        )
    )


@never_raises
def kl_term_with_gradient(fn: Callable[..., Any]) -> CheckResult:
    """Exercise 3: ``fn(logprob, ref_logprob, mask)`` must return the token-mean k3 penalty as a tensor that
    carries a gradient to ``logprob`` (not computed under ``torch.no_grad`` nor detached)."""
    g = torch.Generator().manual_seed(66)
    lp = (-torch.rand(3, 5, generator=g, dtype=torch.float64) * 3).requires_grad_(True)
    ref = lp.detach() + 0.5 * torch.randn(3, 5, generator=g, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0]], dtype=torch.float64)
    d = ref - lp.detach()
    expected = float((kernel.k3(d) * mask).sum() / mask.sum())
    out = learner_answer(fn, lp, ref, mask)
    if isinstance(out, CheckResult):
        return out
    if not isinstance(out, torch.Tensor) or out.numel() != 1:
        return failed(
            tr("Return a one-element torch tensor (the loss term), not a Python number: a float has no gradient.")
        )
    if abs(float(out.detach()) - expected) > 1e-8 * max(1.0, expected):
        return failed(
            tr(
                "The value is off: expected the masked token-mean of k3 = {expected:.6f}, got {detach:.6f}.",
                expected=expected,
                detach=float(out.detach()),
            )
        )
    if not out.requires_grad:
        return failed(
            tr(
                "Right value, but no gradient: the term was computed under torch.no_grad() or detached, so "
                "adding it to the loss changes the logged number and nothing else (open-instruct#530)."
            )
        )
    (grad,) = torch.autograd.grad(out.sum(), lp)
    expected_grad = (1 - torch.exp(d)) * mask / mask.sum()
    if not torch.allclose(grad, expected_grad, atol=1e-10):
        return failed(
            tr(
                "The gradient is not that of k3 with respect to logprob: keep logprob in the graph and "
                "detach nothing inside the formula."
            )
        )
    return passed(
        tr(
            "A loss term with a gradient: its expected gradient follows KL(pi_ref || pi) (lesson 05), "
            "and it does reach the optimizer."
        )
    )
