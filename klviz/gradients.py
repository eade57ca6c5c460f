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
k3 · rho       c = k1      (rho = pi / sg(pi), the ratio-corrected k3)
k3+            c = k1      (straight-through: value of k3, gradient of k2)
=============  ======================  =================================================

:func:`expected_kl_gradient` sums ``pi(x) c(x) s(x)`` over the vocabulary (exact, no sampling);
:func:`sampled_kl_gradients` draws tokens and returns the per-sample gradients.
"""
from __future__ import annotations

import torch

from .validation import Tensor, as_float_tensor, check_choice, check_positive_int, check_same_shape, common_dtype
from .devices import check_generator

__all__ = [
    "expected_kl_gradient", "reverse_kl_gradient", "forward_kl_gradient", "sampled_kl_gradients",
    "gradient_coefficient", "GRADIENT_ESTIMATORS", "PLACEMENTS",
]

GRADIENT_ESTIMATORS = ("k1", "k2", "k3", "k3_ratio", "k3+")
PLACEMENTS = ("loss", "reward")


def _policy_pair(policy_logits: Tensor, ref_logits: Tensor) -> tuple[Tensor, Tensor]:
    th = as_float_tensor(policy_logits, "policy_logits")
    ref = as_float_tensor(ref_logits, "ref_logits")
    if th.dim() != 1:
        raise ValueError(f"policy_logits must be 1-D (one categorical over the vocabulary), got shape {tuple(th.shape)}")
    check_same_shape(th, ref, "policy_logits", "ref_logits")
    if th.numel() < 2:
        raise ValueError("policy_logits needs at least two tokens")
    dtype = common_dtype(th, ref)
    return th.to(dtype), ref.to(dtype)


def gradient_coefficient(log_r: Tensor, estimator: str, placement: str) -> Tensor:
    """The coefficient c(x) with per-sample gradient ``c(x) · grad log pi(x)`` (see the module table).

    ``log_r = log pi_ref(x) - log pi(x)`` for tokens x sampled from the policy pi.
    """
    estimator = check_choice(estimator, "estimator", GRADIENT_ESTIMATORS)
    placement = check_choice(placement, "placement", PLACEMENTS)
    lr = as_float_tensor(log_r, "log_r")
    k1 = -lr
    if placement == "reward":
        if estimator in ("k3_ratio", "k3+"):
            raise ValueError(f"estimator {estimator!r} is a loss-side fix; in the reward use 'k1', 'k2' or 'k3'")
        return {"k1": k1, "k2": 0.5 * lr * lr, "k3": torch.expm1(lr) - lr}[estimator]
    if estimator == "k1":
        return torch.ones_like(lr)
    if estimator == "k3":
        return -torch.expm1(lr)           # 1 - r
    return k1                             # k2, k3_ratio and k3+ all differentiate to k1 · s


def expected_kl_gradient(policy_logits: Tensor, ref_logits: Tensor, estimator: str, placement: str) -> Tensor:
    """Exact E_{x~pi}[per-sample gradient] w.r.t. the policy logits, by summing over the vocabulary.

    Tokens are sampled from the policy pi = softmax(policy_logits); ``ref_logits`` define pi_ref.
    ``estimator`` in ``"k1"``, ``"k2"``, ``"k3"`` (and the fixes ``"k3_ratio"``, ``"k3+"`` as a loss);
    ``placement`` ``"loss"`` (differentiated through log pi with the token fixed) or ``"reward"``
    (detached value times the score). Compare with :func:`reverse_kl_gradient` (the gradient of
    KL(pi || pi_ref), what a KL penalty is meant to follow) and :func:`forward_kl_gradient`.
    """
    th, ref = _policy_pair(policy_logits, ref_logits)
    log_pi = torch.log_softmax(th, -1)
    pi = log_pi.exp()
    c = gradient_coefficient(torch.log_softmax(ref, -1) - log_pi, estimator, placement)
    w = pi * c                          # E[c s] = sum_x pi(x) c(x) (e_x - pi) = w - pi · sum(w)
    return w - pi * w.sum()


def sampled_kl_gradients(policy_logits: Tensor, ref_logits: Tensor, estimator: str, placement: str,
                         num_samples: int, *, generator: torch.Generator | None = None) -> Tensor:
    """Per-sample gradients ``c(x_i) · (onehot(x_i) - pi)`` for ``num_samples`` tokens x_i ~ pi.

    Returns a [num_samples, V] tensor whose mean estimates :func:`expected_kl_gradient`.
    """
    th, ref = _policy_pair(policy_logits, ref_logits)
    n = check_positive_int(num_samples, "num_samples")
    check_generator(generator, th.device)
    log_pi = torch.log_softmax(th, -1)
    pi = log_pi.exp()
    x = torch.multinomial(pi, n, replacement=True, generator=generator)
    c = gradient_coefficient((torch.log_softmax(ref, -1) - log_pi)[x], estimator, placement)
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
