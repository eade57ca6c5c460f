"""Where each KL penalty pushes a policy: gradient fields and descent paths on the probability simplex.

A policy over a small vocabulary is ``pi = softmax(logits)``. Every way of putting a KL estimator
into training (see :mod:`klviz.gradients`) has an *expected* per-step gradient ``g(pi)`` with
respect to the logits. This module evaluates those fields for many policies at once, turns a
logit step into the motion of the probabilities (what you see on the triangle of three tokens),
and follows gradient descent from a starting policy, optionally with a reward (the KL-regularised
bandit ``max_pi E_pi[R] - beta · penalty``).

The names of the choices, used by the lesson and its panels:

==================  ===========================  ==============================================
choice              :class:`~klviz.usage.EstimatorUse`  expected gradient
==================  ===========================  ==============================================
``k1 in loss``      ``("k1", "loss")``           0 (it does nothing on average)
``k2 in loss``      ``("k2", "loss")``           grad KL(pi || pi_ref)
``k3 in loss``      ``("k3", "loss")``           grad KL(pi_ref || pi)  (the forward KL)
``k1 in reward``    ``("k1", "reward")``         grad KL(pi || pi_ref)
``k2 in reward``    ``("k2", "reward")``         biased
``k3 in reward``    ``("k3", "reward")``         grad KL(pi || pi_ref) - grad KL(pi_ref || pi)
``k3·ρ in loss``    ``("k3", "loss", "rho")``    grad KL(pi || pi_ref)
``k3+ in loss``     ``("k3", "loss", "s.-t.")``  grad KL(pi || pi_ref)
==================  ===========================  ==============================================

plus the two references ``reverse KL`` (the true gradient of KL(pi || pi_ref)) and ``forward KL``
(the true gradient of KL(pi_ref || pi) = pi - pi_ref).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from .devices import single_thread
from .gradients import use_coefficient, weighted_coefficient
from .palette import ThemedColours
from .usage import LESSON_USES, EstimatorUse
from .validation import Tensor, as_float_tensor, check_choice, check_positive_int

__all__ = [
    "CHOICES",
    "REFERENCE_FLOWS",
    "ALL_FLOWS",
    "CHOICE_COLORS",
    "CHOICE_STYLES",
    "LOGIT_FLOOR",
    "check_probs",
    "to_xy",
    "simplex_grid",
    "flow_coefficient",
    "field_gradient",
    "gradient_error_terms",
    "reward_gradient",
    "probability_velocity",
    "descent_paths",
]

#: Every use of an estimator the lesson compares, by its label (built from :data:`klviz.usage.LESSON_USES`).
CHOICES: dict[str, EstimatorUse] = {use.label: use for use in LESSON_USES}
#: The two true gradients every choice is compared with.
REFERENCE_FLOWS: tuple[str, ...] = ("reverse KL", "forward KL")
ALL_FLOWS: tuple[str, ...] = tuple(CHOICES) + REFERENCE_FLOWS

#: Colour per estimator (the suite's k1/k2/k3 colours, as :mod:`klviz.palette` names them), line style per
#: placement. ``CHOICE_COLORS[label]`` is the colour for the theme figures are drawn in, ``CHOICE_COLORS.css(label)``
#: the one for HTML on either page.
CHOICE_COLORS: ThemedColours = ThemedColours(
    {
        "k1 in loss": "k1",
        "k2 in loss": "k2",
        "k3 in loss": "k3",
        "k1 in reward": "k1",
        "k2 in reward": "k2",
        "k3 in reward": "k3",
        "k3·ρ in loss": "p",
        "k3+ in loss": "brown",
        "reverse KL": "ink",
        "forward KL": "forward",
    }
)
CHOICE_STYLES: dict[str, str] = {
    "k1 in loss": "-",
    "k2 in loss": "-",
    "k3 in loss": "-",
    "k1 in reward": "--",
    "k2 in reward": "--",
    "k3 in reward": "--",
    "k3·ρ in loss": "-",
    "k3+ in loss": "-",
    "reverse KL": ":",
    "forward KL": ":",
}

_SQRT3_2 = math.sqrt(3.0) / 2.0
#: Lowest logit (relative to the largest) a descent path may reach: probabilities stay ≥ e^-60.
LOGIT_FLOOR = -60.0


def check_probs(probs: Tensor | Sequence[float], name: str = "probs", *, min_prob: float = 0.0) -> Tensor:
    """Return ``probs`` as a float64 tensor if it is a probability vector on its last axis.

    Every entry must be at least ``min_prob`` (and positive when ``min_prob`` is 0) and each row
    must sum to 1 within 1e-6; otherwise ``ValueError`` names the argument.
    """
    p = as_float_tensor(probs, name).to(torch.float64)
    if p.dim() == 0 or p.shape[-1] < 2:
        raise ValueError(f"{name} must have at least two entries on its last axis, got shape {tuple(p.shape)}")
    if bool((p <= 0).any()) or bool((p < min_prob).any()):
        floor = f"at least {min_prob:g}" if min_prob > 0 else "positive"
        raise ValueError(f"{name} must be {floor} everywhere (inside the simplex), got minimum {float(p.min()):.3g}")
    total = p.sum(-1)
    if bool(((total - 1).abs() > 1e-6).any()):
        raise ValueError(f"{name} must sum to 1 on its last axis, got {float(total.flatten()[0]):.6g}")
    return p


def to_xy(probs: Tensor) -> Tensor:
    """Points of the 3-token simplex drawn in the plane: token 0 at (0, 0), token 1 at (1, 0),
    token 2 at (1/2, √3/2). ``probs`` has shape [..., 3]; returns [..., 2]."""
    p = torch.as_tensor(probs)
    if p.shape[-1] != 3:
        raise ValueError(f"probs must have 3 entries on its last axis (three tokens), got shape {tuple(p.shape)}")
    x = p[..., 1] + 0.5 * p[..., 2]
    y = _SQRT3_2 * p[..., 2]
    return torch.stack([x, y], -1)


def simplex_grid(resolution: int = 14, *, margin: float = 0.04) -> Tensor:
    """Probability vectors of 3 tokens on a triangular lattice, at least ``margin`` from every edge.

    Returns a float64 tensor [M, 3]; ``resolution`` lattice steps per edge.
    """
    n = check_positive_int(resolution, "resolution")
    if not 0.0 <= margin < 1.0 / 3.0:
        raise ValueError(f"margin must lie in [0, 1/3), got {margin!r}")
    pts = [(i / n, j / n, (n - i - j) / n) for i in range(n + 1) for j in range(n + 1 - i)]
    grid = torch.tensor(pts, dtype=torch.float64)
    grid = grid[(grid >= margin - 1e-12).all(-1)]
    return grid[:, [2, 0, 1]]


def _flow_coefficient(log_pi: Tensor, log_ref: Tensor, flow: str) -> Tensor:
    """The per-token coefficient c with expected gradient sum_x pi(x) c(x) s(x) = pi * (c - E_pi[c])."""
    if flow == "reverse KL":
        return log_pi - log_ref  # grad KL(pi || ref) = E_pi[(log pi - log ref) s]
    if flow == "forward KL":
        return -torch.exp(log_ref - log_pi)  # grad KL(ref || pi) = -E_pi[(ref/pi) s] = pi - ref
    return use_coefficient(log_ref - log_pi, CHOICES[flow])


def _prepare(logits: Tensor, ref_logits: Tensor, flow: str) -> tuple[Tensor, Tensor]:
    flow = check_choice(flow, "flow", ALL_FLOWS)
    lg = as_float_tensor(logits, "logits")
    ref = as_float_tensor(ref_logits, "ref_logits")
    if ref.dim() != 1 or lg.shape[-1] != ref.shape[0]:
        raise ValueError(
            f"ref_logits must be 1-D with the vocabulary size of logits ({lg.shape[-1]}), got shape {tuple(ref.shape)}"
        )
    dtype = torch.float64 if torch.float64 in (lg.dtype, ref.dtype) else torch.float32
    return torch.log_softmax(lg.to(dtype), -1), torch.log_softmax(ref.to(dtype), -1)


def flow_coefficient(logits: Tensor, ref_logits: Tensor, flow: str) -> Tensor:
    """Per-token coefficient c(x) of the penalty ``flow``: its expected gradient is E_pi[c · s].

    For the two references: ``log pi - log pi_ref`` (reverse KL) and ``-pi_ref/pi`` (forward KL).
    """
    log_pi, log_ref = _prepare(logits, ref_logits, flow)
    return _flow_coefficient(log_pi, log_ref, flow)


def field_gradient(logits: Tensor, ref_logits: Tensor, flow: str) -> Tensor:
    """Expected gradient with respect to the logits of the penalty ``flow``, for a batch of policies.

    ``logits`` [..., V] (each row a policy), ``ref_logits`` [V]; ``flow`` a key of :data:`CHOICES` or
    ``"reverse KL"``/``"forward KL"``. Row by row this equals
    :func:`klviz.expected_kl_gradient` (and the two true gradients), computed for all rows at once.
    """
    log_pi, log_ref = _prepare(logits, ref_logits, flow)
    pi = log_pi.exp()
    if flow == "reverse KL":
        w = pi * (log_pi - log_ref)
    elif flow == "forward KL":
        w = -log_ref.exp().expand_as(pi)  # pi · (-ref/pi), without forming ref/pi
    else:
        w = weighted_coefficient(log_pi, log_ref, CHOICES[flow])  # pi · c, in log space (see gradients)
    return w - pi * w.sum(-1, keepdim=True)


def gradient_error_terms(policy_logits: Tensor, ref_logits: Tensor, flow: str) -> dict[str, float]:
    """Exact error budget of the one-token gradient estimate ``c(x) · s(x)``, x ~ pi, of ``flow``.

    Returns ``bias_sq`` = ||E[c s] - grad KL(pi || pi_ref)||² (distance of the mean from the gradient a
    KL penalty is meant to follow), ``variance`` = E||c s - E[c s]||² (total variance of one sample),
    so the mean of N samples has mean squared error ``bias_sq + variance / N``.
    """
    lg = as_float_tensor(policy_logits, "policy_logits").to(torch.float64)
    if lg.dim() != 1:
        raise ValueError(f"policy_logits must be 1-D, got shape {tuple(lg.shape)}")
    log_pi, log_ref = _prepare(lg, as_float_tensor(ref_logits, "ref_logits").to(torch.float64), flow)
    pi = log_pi.exp()
    c = _flow_coefficient(log_pi, log_ref, flow)
    mean = pi * c - pi * (pi * c).sum()
    target = pi * (log_pi - log_ref) - pi * (pi * (log_pi - log_ref)).sum()
    score_sq = 1.0 - 2.0 * pi + (pi * pi).sum()  # ||e_x - pi||² for each token x
    second = (pi * c * c * score_sq).sum()
    return {"bias_sq": float((mean - target).square().sum()), "variance": float(second - mean.square().sum())}


def reward_gradient(logits: Tensor, rewards: Tensor) -> Tensor:
    """Gradient of the expected reward E_pi[R] = sum_x pi(x) R(x) with respect to the logits:
    ``pi * (R - E_pi[R])`` (exact; a policy-gradient estimator averages to it)."""
    lg = as_float_tensor(logits, "logits")
    rw = as_float_tensor(rewards, "rewards").to(lg.dtype)
    if rw.shape[-1] != lg.shape[-1]:
        raise ValueError(f"rewards must have one entry per token ({lg.shape[-1]}), got shape {tuple(rw.shape)}")
    pi = torch.softmax(lg, -1)
    return pi * (rw - (pi * rw).sum(-1, keepdim=True))


def probability_velocity(probs: Tensor, logit_step: Tensor) -> Tensor:
    """How the probabilities move, to first order, when the logits move by ``logit_step``:
    ``d pi = (diag(pi) - pi pi^T) · step``. Both [..., V]."""
    p = torch.as_tensor(probs)
    d = torch.as_tensor(logit_step).to(p.dtype)
    return p * (d - (p * d).sum(-1, keepdim=True))


def descent_paths(
    start_probs: Tensor,
    ref_probs: Tensor,
    flows: Sequence[str],
    *,
    steps: int = 200,
    lr: float = 1.0,
    rewards: Tensor | None = None,
    beta: float | Tensor = 1.0,
    record_every: int = 1,
    preconditioned: bool = False,
) -> dict[str, Tensor]:
    """Gradient descent on the logits, one run per penalty in ``flows``, all from ``start_probs``.

    Each step is ``logits -= lr · (beta · g_flow(pi) - grad E_pi[R])`` with ``g_flow`` the expected
    gradient of the penalty (:func:`field_gradient`) and the reward term present when ``rewards`` is
    given; that is the KL-regularised bandit ``max E_pi[R] - beta · penalty`` climbed with exact
    expected gradients. ``start_probs`` may be a batch [..., V]; ``beta`` a float or a tensor that
    broadcasts against [..., 1] (one beta per row). Returns, for each flow, the probabilities
    [num_records, ..., V] after steps 0, record_every, 2·record_every, ... (the last step always).

    With ``preconditioned=True`` the step is the natural-gradient one, ``logits -= lr · (beta · c -
    R)`` with c the per-token coefficient (:func:`flow_coefficient`): the expected gradient is
    ``pi * (c - E[c])``, so this only removes the factor pi; it has the same fixed points and reaches
    them in far fewer steps when some tokens are rare. Logits are kept within
    :data:`LOGIT_FLOOR` of the largest one (probabilities ≥ e^-60), so that a policy sliding into a
    vertex stays finite.
    """
    n = check_positive_int(steps, "steps")
    every = check_positive_int(record_every, "record_every")
    if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
        raise ValueError(f"lr must be a positive finite number, got {lr!r}")
    start = check_probs(start_probs, "start_probs")
    ref = check_probs(ref_probs, "ref_probs")
    if ref.dim() != 1 or ref.shape[0] != start.shape[-1]:
        raise ValueError(f"ref_probs must be 1-D with {start.shape[-1]} entries, got shape {tuple(ref.shape)}")
    b = torch.as_tensor(beta, dtype=torch.float64)
    if not bool(torch.isfinite(b).all()) or bool((b <= 0).any()):
        raise ValueError(f"beta must be positive and finite, got {beta!r}")
    rw = None if rewards is None else as_float_tensor(rewards, "rewards").to(torch.float64)
    for flow in flows:
        check_choice(flow, "flows", ALL_FLOWS)
    log_ref = torch.log_softmax(ref.log(), -1)
    out: dict[str, Tensor] = {}
    flows = list(dict.fromkeys(flows))
    with single_thread(), torch.no_grad():
        # all flows advance together: one stacked tensor [F, ..., V], one coefficient call per flow
        theta = start.log().expand(len(flows), *start.shape).clone()
        rec = [theta.softmax(-1)]
        for t in range(1, n + 1):
            log_pi = torch.log_softmax(theta, -1)
            c = torch.stack([_flow_coefficient(log_pi[i], log_ref, flow) for i, flow in enumerate(flows)])
            c = b * c - rw if rw is not None else b * c
            if preconditioned:
                step = c
            else:
                pi = log_pi.exp()
                step = pi * (c - (pi * c).sum(-1, keepdim=True))
            theta = theta - lr * step
            theta = (theta - theta.max(-1, keepdim=True).values).clamp_min(LOGIT_FLOOR)
            if t % every == 0 or t == n:
                rec.append(torch.softmax(theta, -1))
        stacked = torch.stack(rec, 1)  # [F, records, ..., V]
        for i, flow in enumerate(flows):
            out[flow] = stacked[i]
            if not bool(torch.isfinite(out[flow]).all()):
                raise ValueError(f"descent for {flow!r} left the simplex (non-finite policy); lower lr")
    return out
