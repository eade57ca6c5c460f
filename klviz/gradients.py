"""What the gradient of each KL estimator does, on a categorical policy pi = softmax(logits).

The value of an estimator can be unbiased while its gradient points somewhere else. For one token
x ~ pi with score s(x) = grad log pi(x) = onehot(x) - pi and ``log r = log pi_ref(x) - log pi(x)``,
every placement gives a per-sample gradient of the form ``c(x) · s(x)``:

=============  ======================  =================================================
estimator      as a loss (token fixed)  in the reward (value detached, times the score)
=============  ======================  =================================================
k1 = -log r    c = 1       (mean 0)     c = k1  -> grad KL(pi || pi_ref)  (unbiased)
k2 = ½ log² r  c = k1      (= k1 rew.)  c = k2  -> biased
k3             c = 1 - r   -> grad KL(pi_ref || pi) (forward KL)   c = k3 -> biased
=============  ======================  =================================================

and two loss-side weightings (:mod:`klviz.usage`): ``"rho"`` multiplies the value by rho = pi / sg(pi)
(value 1, gradient s), so c = k + c_loss(k): for k3 that is k1, the ratio-corrected k3 of
DeepSeek-V3.2 and TRL; ``"straight-through"`` keeps the value and takes the gradient of k2, c = k1
(verl's ``"k3+"``).

:func:`expected_kl_gradient` sums ``pi(x) c(x) s(x)`` over the vocabulary (exact, no sampling);
:func:`sampled_kl_gradients` draws tokens and returns the per-sample gradients.
"""

from __future__ import annotations

import torch

from . import kernel
from .devices import check_generator
from .usage import EstimatorUse, parse_use
from .validation import Tensor, as_float_tensor, check_positive_int, check_same_shape, common_dtype

__all__ = [
    "expected_kl_gradient",
    "reverse_kl_gradient",
    "forward_kl_gradient",
    "sampled_kl_gradients",
    "gradient_coefficient",
]


def _policy_pair(policy_logits: Tensor, ref_logits: Tensor) -> tuple[Tensor, Tensor]:
    th = as_float_tensor(policy_logits, "policy_logits")
    ref = as_float_tensor(ref_logits, "ref_logits")
    if th.dim() != 1:
        raise ValueError(
            f"policy_logits must be 1-D (one categorical over the vocabulary), got shape {tuple(th.shape)}"
        )
    check_same_shape(th, ref, "policy_logits", "ref_logits")
    if th.numel() < 2:
        raise ValueError("policy_logits needs at least two tokens")
    dtype = common_dtype(th, ref)
    return th.to(dtype), ref.to(dtype)


def _loss_coefficient(log_r: Tensor, estimator: str) -> Tensor:
    """d k / d log pi for each estimator as a loss (the token fixed): k1 -> 1, k2 -> k1, k3 -> 1 - r."""
    if estimator == "k1":
        return torch.ones_like(log_r)
    if estimator == "k2":
        return kernel.k1(log_r)
    return -torch.expm1(log_r)


def use_coefficient(log_r: Tensor, use: EstimatorUse) -> Tensor:
    """c(x) for an already checked ``log_r`` and ``use`` (no input checks; see :func:`gradient_coefficient`)."""
    if use.placement == "reward":  # sg(k) · s, or sg(k) · grad rho = sg(k) · s on-policy
        return kernel.estimate(use.estimator, log_r)
    if use.weighting == "straight-through":
        return kernel.k1(log_r)  # the gradient of k2, whatever the value
    c = _loss_coefficient(log_r, use.estimator)
    if use.weighting == "rho":  # grad(rho · k) = k · s + grad k, rho = pi / sg(pi) = 1 in value
        c = c + kernel.estimate(use.estimator, log_r)
    return c


def _as_use(estimator: str | EstimatorUse, placement: str | None, weighting: str) -> EstimatorUse:
    """An :class:`EstimatorUse` from ``("k3", "loss", "rho")``, a label ``"k3·ρ in loss"`` or a use."""
    if isinstance(estimator, EstimatorUse) or (
        placement is None and isinstance(estimator, str) and " in " in estimator
    ):
        if placement is not None or weighting != "none":
            raise ValueError(
                f"placement and weighting are part of the use already; pass only the use {str(estimator)!r}"
            )
        return parse_use(estimator)
    if placement is None:
        raise ValueError(
            f"placement is needed with estimator {estimator!r} ('loss' or 'reward'), or pass a use such as 'k3 in loss'"
        )
    return EstimatorUse(estimator, placement, weighting)


def weighted_coefficient(log_pi: Tensor, log_ref: Tensor, use: EstimatorUse) -> Tensor:
    """``pi(x) · c(x)`` for every token, computed without forming r = pi_ref/pi where it could overflow.

    Where c holds r (k3's 1 - r and r - 1 - log r), pi · r is written as pi_ref: a token the policy
    almost never takes (pi ≈ e^-120, so r ≈ e^120 overflows float32) still gives a finite term.
    The expected gradient is then ``w - pi · sum(w)`` (see :func:`expected_kl_gradient`).
    """
    pi, ref = log_pi.exp(), log_ref.exp()
    log_r = log_ref - log_pi
    k1_term = pi * kernel.k1(log_r)  # pi · (-log r)

    def value_term(estimator: str) -> Tensor:  # pi · k
        if estimator == "k3":
            return (ref - pi) + k1_term  # pi (r - 1 - log r)
        return pi * kernel.estimate(estimator, log_r)

    if use.placement == "reward":
        return value_term(use.estimator)
    if use.weighting == "straight-through":
        return k1_term
    loss_term = {"k1": pi, "k2": k1_term, "k3": pi - ref}[use.estimator]  # pi · d k / d log pi
    return loss_term + value_term(use.estimator) if use.weighting == "rho" else loss_term


def gradient_coefficient(
    log_r: Tensor, estimator: str | EstimatorUse, placement: str | None = None, weighting: str = "none"
) -> Tensor:
    """The coefficient c(x) with per-sample gradient ``c(x) · grad log pi(x)`` (see the module table).

    ``log_r = log pi_ref(x) - log pi(x)`` for tokens x sampled from the policy pi. ``estimator`` in
    ``"k1"``, ``"k2"``, ``"k3"``; ``placement`` ``"loss"`` or ``"reward"``; ``weighting`` ``"none"``,
    ``"rho"`` or ``"straight-through"`` (loss only; see :class:`klviz.usage.EstimatorUse`). The
    three may also come as one use, an :class:`~klviz.usage.EstimatorUse` or its label (``"k3·ρ in loss"``).
    """
    use = _as_use(estimator, placement, weighting)
    return use_coefficient(as_float_tensor(log_r, "log_r"), use)


def expected_kl_gradient(
    policy_logits: Tensor,
    ref_logits: Tensor,
    estimator: str | EstimatorUse,
    placement: str | None = None,
    weighting: str = "none",
) -> Tensor:
    """Exact E_{x~pi}[per-sample gradient] w.r.t. the policy logits, by summing over the vocabulary.

    Tokens are sampled from the policy pi = softmax(policy_logits); ``ref_logits`` define pi_ref.
    ``estimator`` in ``"k1"``, ``"k2"``, ``"k3"``; ``placement`` ``"loss"`` (differentiated through
    log pi with the token fixed) or ``"reward"`` (detached value times the score); ``weighting``
    ``"none"``, ``"rho"`` (the ratio-corrected value rho · k) or ``"straight-through"`` (value of k,
    gradient of k2); or the three as one use (``"k3·ρ in loss"``, an :class:`~klviz.usage.EstimatorUse`).
    Compare with :func:`reverse_kl_gradient` (the gradient of KL(pi || pi_ref), what a KL penalty
    is meant to follow) and :func:`forward_kl_gradient`.
    """
    use = _as_use(estimator, placement, weighting)
    th, ref = _policy_pair(policy_logits, ref_logits)
    log_pi = torch.log_softmax(th, -1)
    pi = log_pi.exp()
    w = weighted_coefficient(log_pi, torch.log_softmax(ref, -1), use)  # pi · c, in log space where r is
    # E[c s] = sum_x pi(x) c(x) (e_x - pi) = w - pi · sum(w)
    return w - pi * w.sum()


def sampled_kl_gradients(
    policy_logits: Tensor,
    ref_logits: Tensor,
    estimator: str | EstimatorUse,
    placement: str | None,
    num_samples: int,
    *,
    weighting: str = "none",
    generator: torch.Generator | None = None,
) -> Tensor:
    """Per-sample gradients ``c(x_i) · (onehot(x_i) - pi)`` for ``num_samples`` tokens x_i ~ pi.

    Returns a [num_samples, V] tensor whose mean estimates :func:`expected_kl_gradient` (the use
    given as there; with a use, pass ``placement=None``).
    """
    use = _as_use(estimator, placement, weighting)
    th, ref = _policy_pair(policy_logits, ref_logits)
    n = check_positive_int(num_samples, "num_samples")
    check_generator(generator, th.device)
    log_pi = torch.log_softmax(th, -1)
    pi = log_pi.exp()
    x = torch.multinomial(pi, n, replacement=True, generator=generator)
    c = use_coefficient((torch.log_softmax(ref, -1) - log_pi)[x], use)
    scores = torch.nn.functional.one_hot(x, th.numel()).to(th.dtype) - pi
    return c[:, None] * scores


def reverse_kl_gradient(policy_logits: Tensor, ref_logits: Tensor) -> Tensor:
    """Gradient of the **reverse KL, KL(pi || pi_ref)**, w.r.t. the policy logits (autograd, exact)."""
    th, ref = _policy_pair(policy_logits, ref_logits)
    with torch.enable_grad():
        th = th.detach().requires_grad_(True)
        log_pi = torch.log_softmax(th, -1)
        kl = (log_pi.exp() * (log_pi - torch.log_softmax(ref, -1))).sum()
        (grad,) = torch.autograd.grad(kl, th)
    return grad


def forward_kl_gradient(policy_logits: Tensor, ref_logits: Tensor) -> Tensor:
    """Gradient of the **forward KL, KL(pi_ref || pi)**, w.r.t. the policy logits (equals pi - pi_ref)."""
    th, ref = _policy_pair(policy_logits, ref_logits)
    with torch.enable_grad():
        th = th.detach().requires_grad_(True)
        log_ref = torch.log_softmax(ref, -1)
        kl = (log_ref.exp() * (log_ref - torch.log_softmax(th, -1))).sum()
        (grad,) = torch.autograd.grad(kl, th)
    return grad
