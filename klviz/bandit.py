"""Small problems where every gradient can be computed exactly, by summing over all outcomes.

* The **KL-regularised bandit**: ``max_pi E_pi[R] - beta · KL(pi || pi_ref)`` has the optimum
  ``pi* ∝ pi_ref · exp(R / beta)``; with the forward KL, ``KL(pi_ref || pi)``, the optimum is
  ``pi(x) = beta · pi_ref(x) / (lambda - R(x))`` with lambda fixed by normalisation.
* A **sequence toy**: a tabular autoregressive policy over ``vocab_size`` tokens and ``length`` steps,
  small enough to enumerate every sequence, so that "the expected gradient" of a per-token surrogate
  loss is an exact sum, and the true gradient of the sequence KL comes from autograd.
* **Off-policy** tokens: tokens drawn from pi_old while the gradient is taken at pi_theta, with and
  without importance weights.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import torch

from . import kernel
from .devices import single_thread
from .simplex import CHOICES, check_probs, descent_paths, field_gradient, reward_gradient
from .usage import EstimatorUse, parse_use, per_token_surrogate
from .validation import Tensor, as_float_tensor, check_choice, check_positive_int

__all__ = [
    "reverse_kl_optimum",
    "forward_kl_optimum",
    "bandit_fixed_points",
    "tv_distance",
    "SequenceToy",
    "SEQUENCE_METHODS",
    "IMPORTANCE_WEIGHTS",
    "REWARD_VALUES",
    "REWARD_CREDIT",
    "SEQUENCE_WEIGHTS",
    "offpolicy_expected_gradient",
    "reward_updates",
]


# --------------------------------------------------------------------------------------------------
# the KL-regularised bandit
# --------------------------------------------------------------------------------------------------


def _check_bandit(ref_probs: Tensor, rewards: Tensor, beta: float) -> tuple[Tensor, Tensor, float]:
    ref = check_probs(ref_probs, "ref_probs")
    if ref.dim() != 1:
        raise ValueError(f"ref_probs must be 1-D, got shape {tuple(ref.shape)}")
    rw = as_float_tensor(rewards, "rewards").to(torch.float64)
    if rw.shape != ref.shape:
        raise ValueError(f"rewards must have one entry per token ({ref.shape[0]}), got shape {tuple(rw.shape)}")
    if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not math.isfinite(beta) or beta <= 0:
        raise ValueError(f"beta must be a positive finite number, got {beta!r}")
    return ref, rw, float(beta)


def reverse_kl_optimum(ref_probs: Tensor, rewards: Tensor, beta: float) -> Tensor:
    """``argmax_pi E_pi[R] - beta · KL(pi || pi_ref)`` = ``pi_ref · exp(R / beta)`` normalised (float64)."""
    ref, rw, b = _check_bandit(ref_probs, rewards, beta)
    return torch.softmax(ref.log() + rw / b, -1)


def forward_kl_optimum(ref_probs: Tensor, rewards: Tensor, beta: float, *, tol: float = 1e-13) -> Tensor:
    """``argmax_pi E_pi[R] - beta · KL(pi_ref || pi)`` (float64).

    Stationarity gives ``R(x) + beta · pi_ref(x) / pi(x) = lambda`` for every token, so
    ``pi(x) = beta · pi_ref(x) / (lambda - R(x))``; the sum over x decreases in lambda from +inf
    (lambda just above max R) to 0, and bisection finds the lambda where it equals 1.
    """
    ref, rw, b = _check_bandit(ref_probs, rewards, beta)
    lo, hi = float(rw.max()), float(rw.max()) + b + 1.0  # at hi every term < beta·ref/(beta+1) < ref
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        total = float((b * ref / (mid - rw)).sum())
        if total > 1.0:
            lo = mid
        else:
            hi = mid
        if hi - lo < tol:
            break
    lam = 0.5 * (lo + hi)
    pi = b * ref / (lam - rw)
    return pi / pi.sum()


def tv_distance(p: Tensor, q: Tensor) -> Tensor:
    """Total variation distance ½ Σ|p - q| along the last axis (bounded by 1, finite at the vertices)."""
    return 0.5 * (torch.as_tensor(p) - torch.as_tensor(q)).abs().sum(-1)


def bandit_fixed_points(
    ref_probs: Tensor,
    rewards: Tensor,
    betas: Sequence[float],
    *,
    flows: Sequence[str] = tuple(CHOICES) + ("reverse KL", "forward KL"),
    steps: int = 3000,
    lr: float = 0.5,
) -> dict[str, dict[str, Tensor]]:
    """Where gradient descent on ``-E_pi[R] + beta · penalty`` ends, for every flow and every beta.

    Starts at pi_ref (where RL fine-tuning starts) and runs ``steps`` natural-gradient steps
    (:func:`klviz.simplex.descent_paths` with ``preconditioned=True``: same fixed points as plain
    gradient descent, reached in fewer steps) with step size ``lr / (beta + spread of R)``, small
    enough to be stable for every flow at every beta. Returns, per flow,
    ``{"policy": [B, V], "grad_norm": [B]}``: the final policy and the norm of the expected gradient
    there (small at a fixed point; a policy sliding to a vertex also has a small gradient, so compare
    with the closed forms).
    """
    ref = check_probs(ref_probs, "ref_probs")
    rw = as_float_tensor(rewards, "rewards").to(torch.float64)
    bt = torch.as_tensor([float(b) for b in betas], dtype=torch.float64)
    if bt.numel() == 0 or not bool(torch.isfinite(bt).all()) or bool((bt <= 0).any()):
        raise ValueError(f"betas must be positive finite numbers, got {list(betas)!r}")
    check_positive_int(steps, "steps")
    # one descent per beta in one batch; the step size per row is lr / (beta + spread), folded into
    # beta and the rewards because descent_paths takes one scalar lr
    scale = lr / (bt + float(rw.max() - rw.min()))
    start = ref.expand(bt.numel(), -1).clone()
    paths = descent_paths(
        start,
        ref,
        flows,
        steps=steps,
        lr=1.0,
        rewards=rw * scale[:, None],
        beta=(bt * scale)[:, None],
        record_every=steps,
        preconditioned=True,
    )
    out: dict[str, dict[str, Tensor]] = {}
    for flow, path in paths.items():
        final = path[-1]
        g = field_gradient(final.log(), ref.log(), flow) * bt[:, None] - reward_gradient(final.log(), rw)
        out[flow] = {"policy": final, "grad_norm": g.norm(dim=-1)}
    return out


# --------------------------------------------------------------------------------------------------
# an enumerable sequence toy
# --------------------------------------------------------------------------------------------------

#: How the per-token values of a use in the reward are credited to the tokens of a sequence.
REWARD_CREDIT: dict[str, str] = {
    "same token": "sum_t sg(k1_t) · log pi_t",
    "reward-to-go": "sum_t sg(sum_{u>=t} k1_u) · log pi_t",
    "whole sequence": "sum_t sg(sum_u k1_u) · log pi_t",
}
#: Per-sequence surrogates compared in the lesson, by label: uses of an estimator in the loss
#: (differentiated through log pi), and k1 in the reward with each way of crediting it.
SEQUENCE_METHODS: dict[str, str] = {
    **{
        use.label: f"sum_t {use.label.split(' in ')[0]}_t, differentiated"
        for use in (
            EstimatorUse("k1"),
            EstimatorUse("k2"),
            EstimatorUse("k3"),
            EstimatorUse("k3", weighting="straight-through"),
        )
    },
    **{f"k1 in reward, {credit}": formula for credit, formula in REWARD_CREDIT.items()},
}


#: How a per-token KL term k_t is weighted when the sequences were sampled by pi_old (off-policy), with
#: rho_u = pi_theta(y_u | y_<u) / sg(pi_old(y_u | y_<u)) and the gradient flowing through every rho that is
#: not marked sg. Only the prefix product corrects the distribution of the prefix y_<t as well as the
#: choice of y_t; for k3 it makes the surrogate's expectation the sequence KL(pi_theta || pi_ref) itself.
SEQUENCE_WEIGHTS: dict[str, str] = {
    "none": "sum_t k_t",
    "per-token ρ": "sum_t rho_t · k_t (TRL use_bias_correction_kl, DeepSeek-V3.2)",
    "prefix product, prefix detached": "sum_t sg(prod_{u<t} rho_u) · rho_t · k_t",
    "prefix product": "sum_t (prod_{u<=t} rho_u) · k_t",
}


class SequenceToy:
    """A tabular autoregressive policy: one row of logits per prefix, every sequence enumerable.

    ``vocab_size`` tokens, ``length`` steps (no EOS: every sequence has the full length). Logits are a
    tensor [num_prefixes, vocab_size]; prefix 0 is the empty prefix. ``sequences`` [S, T] lists all
    S = V^T sequences; ``prefix_index`` [S, T] gives the row used at step t of each sequence.
    """

    def __init__(self, vocab_size: int = 2, length: int = 3) -> None:
        v = check_positive_int(vocab_size, "vocab_size")
        t = check_positive_int(length, "length")
        if v < 2:
            raise ValueError(f"vocab_size must be at least 2, got {v}")
        if v**t > 4096:
            raise ValueError(f"vocab_size**length = {v**t} sequences is too many to enumerate (max 4096)")
        self.vocab_size, self.length = v, t
        prefixes: list[tuple[int, ...]] = [p for n in range(t) for p in itertools.product(range(v), repeat=n)]
        self.prefixes = prefixes
        index = {p: i for i, p in enumerate(prefixes)}
        seqs = list(itertools.product(range(v), repeat=t))
        self.sequences = torch.tensor(seqs, dtype=torch.long)
        self.prefix_index = torch.tensor([[index[s[:u]] for u in range(t)] for s in seqs], dtype=torch.long)

    @property
    def num_prefixes(self) -> int:
        return len(self.prefixes)

    def _check_logits(self, logits: Tensor, name: str) -> Tensor:
        lg = as_float_tensor(logits, name)
        if lg.shape != (self.num_prefixes, self.vocab_size):
            raise ValueError(
                f"{name} must have shape ({self.num_prefixes}, {self.vocab_size}) "
                f"(one row of logits per prefix), got {tuple(lg.shape)}"
            )
        return lg

    def random_logits(self, scale: float = 1.0, *, generator: torch.Generator | None = None) -> Tensor:
        """Gaussian logits [num_prefixes, V] (float64) with standard deviation ``scale``."""
        return scale * torch.randn(self.num_prefixes, self.vocab_size, generator=generator, dtype=torch.float64)

    def token_logprobs(self, logits: Tensor) -> Tensor:
        """log pi(y_t | y_<t) for every sequence and step: [S, T] (differentiable in ``logits``)."""
        lg = self._check_logits(logits, "logits")
        logp = torch.log_softmax(lg, -1)
        return logp[self.prefix_index, self.sequences]

    def sequence_probs(self, logits: Tensor) -> Tensor:
        """pi(y) for every sequence: [S] (sums to 1)."""
        return self.token_logprobs(logits).sum(-1).exp()

    def sequence_kl(self, logits: Tensor, ref_logits: Tensor) -> Tensor:
        """Exact KL(pi || pi_ref) over whole sequences: sum_y pi(y) log pi(y)/pi_ref(y)."""
        lp = self.token_logprobs(logits).sum(-1)
        lr = self.token_logprobs(ref_logits).sum(-1)
        return (lp.exp() * (lp - lr)).sum()

    def true_gradient(self, logits: Tensor, ref_logits: Tensor) -> Tensor:
        """Gradient of the exact sequence KL(pi || pi_ref) with respect to the logits (autograd)."""
        lg = self._check_logits(logits, "logits").detach().clone().requires_grad_(True)
        with torch.enable_grad():
            (g,) = torch.autograd.grad(self.sequence_kl(lg, ref_logits.detach()), lg)
        return g

    def surrogates(self, logits: Tensor, ref_logits: Tensor, method: str) -> Tensor:
        """The per-sequence surrogate loss L(y) of ``method`` (a key of :data:`SEQUENCE_METHODS`): [S].

        Its gradient for a sampled y is what a training step would use; the tokens of y are fixed.
        """
        method = check_choice(method, "method", tuple(SEQUENCE_METHODS))
        logp = self.token_logprobs(logits)  # [S, T], carries the gradient
        ref_logp = self.token_logprobs(ref_logits).detach()
        if ", " not in method:  # a use in the loss
            return per_token_surrogate(parse_use(method), logp, ref_logp).sum(-1)
        credit = method.split(", ", 1)[1]
        v = kernel.k1(ref_logp - logp).detach()
        if credit == "reward-to-go":
            v = v.flip(-1).cumsum(-1).flip(-1)
        elif credit == "whole sequence":
            v = v.sum(-1, keepdim=True).expand_as(v)
        return (v * logp).sum(-1)

    def expected_gradient(self, logits: Tensor, ref_logits: Tensor, method: str) -> Tensor:
        """Exact E_{y~pi}[grad L(y)]: autograd of sum_y sg(pi(y)) · L(y), the sampling left undifferentiated."""
        lg = self._check_logits(logits, "logits").detach().clone().requires_grad_(True)
        ref = self._check_logits(ref_logits, "ref_logits").detach()
        with torch.enable_grad():
            weights = self.sequence_probs(lg).detach()
            (g,) = torch.autograd.grad((weights * self.surrogates(lg, ref, method)).sum(), lg)
        return g

    def gradient_variance(self, logits: Tensor, ref_logits: Tensor, method: str) -> float:
        """Total variance E||grad L(y) - E grad L||² of the one-sequence gradient estimate (exact)."""
        lg = self._check_logits(logits, "logits").detach().clone().requires_grad_(True)
        ref = self._check_logits(ref_logits, "ref_logits").detach()
        with torch.enable_grad():
            weights = self.sequence_probs(lg).detach()
            per = self.surrogates(lg, ref, method)
            grads = torch.stack(
                [torch.autograd.grad(per[i], lg, retain_graph=True)[0].flatten() for i in range(per.numel())]
            )
        mean = weights @ grads
        return float((weights * (grads - mean).square().sum(-1)).sum())

    def partial_gradient(self, logits: Tensor, ref_logits: Tensor, prefix_logits: Tensor | None = None) -> Tensor:
        """The token-level ("partial") gradient: sum_t E_{y_<t}[grad KL(pi(.|y_<t) || pi_ref(.|y_<t))], the
        prefix distribution held fixed. Prefixes are weighted by ``prefix_logits``' policy (default: pi itself).

        With pi's own prefixes this is what every per-token KL loss with the reverse-KL gradient follows on-policy
        (lesson 05 §5); with pi_old's prefixes it is what per-token rho · k3 follows off-policy.
        """
        lg = self._check_logits(logits, "logits").detach().clone().requires_grad_(True)
        ref = self._check_logits(ref_logits, "ref_logits").detach()
        src = lg.detach() if prefix_logits is None else self._check_logits(prefix_logits, "prefix_logits")
        seq_p = self.sequence_probs(src).detach()
        prefix_p = torch.zeros(self.num_prefixes, dtype=torch.float64)
        for t in range(self.length):
            prefix_p.index_add_(0, self.prefix_index[:, t], seq_p.to(torch.float64))
        with torch.enable_grad():
            logp, logq = torch.log_softmax(lg, -1), torch.log_softmax(ref, -1)
            per_prefix = (logp.exp() * (logp - logq)).sum(-1)
            (g,) = torch.autograd.grad((prefix_p * per_prefix).sum(), lg)
        return g

    def offpolicy_surrogates(
        self, logits: Tensor, ref_logits: Tensor, old_logits: Tensor, estimator: str = "k3", weighting: str = "none"
    ) -> Tensor:
        """Per-sequence surrogate ``sum_t w_t · k_t`` [S] on sequences drawn by pi_old (see :data:`SEQUENCE_WEIGHTS`).

        ``k_t`` is ``estimator`` (k1, k2 or k3) of log r = log pi_ref - log pi_theta, differentiated through
        log pi_theta; the weight of ``weighting`` multiplies it. Autograd of ``sum_y pi_old(y) · L(y)`` is the exact
        expected gradient of a training step on pi_old's sequences (:meth:`offpolicy_gradient`).
        """
        check_choice(estimator, "estimator", kernel.ESTIMATORS)
        check_choice(weighting, "weighting", tuple(SEQUENCE_WEIGHTS))
        logp = self.token_logprobs(logits)
        ref_logp = self.token_logprobs(ref_logits).detach()
        old_logp = self.token_logprobs(old_logits).detach()
        k = kernel.estimate(estimator, ref_logp - logp)
        log_rho = logp - old_logp
        if weighting == "none":
            w = torch.ones_like(k)
        elif weighting == "per-token ρ":
            w = torch.exp(log_rho)
        elif weighting == "prefix product, prefix detached":
            before = torch.cumsum(log_rho, -1) - log_rho  # sum_{u<t} log rho_u
            w = torch.exp(before.detach() + log_rho)
        else:
            w = torch.exp(torch.cumsum(log_rho, -1))
        return (w * k).sum(-1)

    def offpolicy_gradient(
        self, logits: Tensor, ref_logits: Tensor, old_logits: Tensor, estimator: str = "k3", weighting: str = "none"
    ) -> Tensor:
        """Exact E_{y~pi_old}[grad L(y)] of :meth:`offpolicy_surrogates` with respect to pi_theta's logits."""
        lg = self._check_logits(logits, "logits").detach().clone().requires_grad_(True)
        ref = self._check_logits(ref_logits, "ref_logits").detach()
        old = self._check_logits(old_logits, "old_logits").detach()
        with torch.enable_grad():
            q = self.sequence_probs(old).detach()
            (g,) = torch.autograd.grad((q * self.offpolicy_surrogates(lg, ref, old, estimator, weighting)).sum(), lg)
        return g

    def offpolicy_value(
        self, logits: Tensor, ref_logits: Tensor, old_logits: Tensor, estimator: str = "k3", weighting: str = "none"
    ) -> float:
        """Exact E_{y~pi_old}[L(y)]: the value the surrogate reports on average (a KL estimate or not)."""
        with torch.no_grad():
            q = self.sequence_probs(self._check_logits(old_logits, "old_logits"))
            return float((q * self.offpolicy_surrogates(logits, ref_logits, old_logits, estimator, weighting)).sum())

    def optimum(self, ref_logits: Tensor, rewards: Tensor, beta: float) -> Tensor:
        """pi*(y) ∝ pi_ref(y) exp(R(y)/beta) over whole sequences (the optimum of E[R] - beta·KL)."""
        rw = as_float_tensor(rewards, "rewards").to(torch.float64)
        if rw.shape != (self.sequences.shape[0],):
            raise ValueError(
                f"rewards must hold one number per sequence ({self.sequences.shape[0]}), got shape {tuple(rw.shape)}"
            )
        if not (isinstance(beta, (int, float)) and beta > 0 and math.isfinite(beta)):
            raise ValueError(f"beta must be a positive finite number, got {beta!r}")
        log_ref = self.token_logprobs(ref_logits.to(torch.float64)).sum(-1)
        return torch.softmax(log_ref + rw / beta, -1)

    def train(
        self,
        start_logits: Tensor,
        ref_logits: Tensor,
        rewards: Tensor,
        beta: float,
        method: str,
        *,
        steps: int = 1500,
        lr: float = 1.0,
        record_every: int = 50,
    ) -> dict[str, Tensor]:
        """Gradient descent on ``-E[R(y)] + beta · (KL term of method)`` with exact expected gradients.

        The reward part is the exact policy gradient sum_y pi(y) R(y) grad log pi(y); the KL part is
        :meth:`expected_gradient` of ``method``. Returns the final logits, the final sequence
        distribution, and the true sequence KL and expected reward every ``record_every`` steps.
        """
        n = check_positive_int(steps, "steps")
        check_choice(method, "method", tuple(SEQUENCE_METHODS))
        rw = as_float_tensor(rewards, "rewards").to(torch.float64)
        theta = self._check_logits(start_logits, "start_logits").detach().to(torch.float64).clone()
        ref = self._check_logits(ref_logits, "ref_logits").detach().to(torch.float64)
        kls, rews, record_steps = [], [], []
        with single_thread():
            for t in range(n + 1):
                if t % record_every == 0 or t == n:
                    with torch.no_grad():
                        pr = self.sequence_probs(theta)
                        kls.append(float(self.sequence_kl(theta, ref)))
                        rews.append(float(pr @ rw))
                        record_steps.append(t)
                if t == n:
                    break
                lg = theta.clone().requires_grad_(True)
                with torch.enable_grad():
                    logp_seq = self.token_logprobs(lg).sum(-1)
                    w = logp_seq.exp().detach()
                    surrogate = (w * (beta * self.surrogates(lg, ref, method) - rw * logp_seq)).sum()
                    (g,) = torch.autograd.grad(surrogate, lg)
                theta = theta - lr * g
        return {
            "logits": theta,
            "probs": self.sequence_probs(theta).detach(),
            "kl": torch.tensor(kls),
            "reward": torch.tensor(rews),
            "steps": torch.tensor(record_steps),
        }


# --------------------------------------------------------------------------------------------------
# off-policy tokens
# --------------------------------------------------------------------------------------------------

#: The importance weight a per-token KL term gets for the tokens coming from pi_old: ``none`` (as
#: on-policy code writes it) or ``detached`` (times sg(pi_theta / pi_old), which restores the
#: on-policy expectation of the same surrogate). The ratio that carries a gradient, rho =
#: pi_theta / sg(pi_old), is part of the term itself: ``EstimatorUse(..., weighting="rho")``.
IMPORTANCE_WEIGHTS: tuple[str, ...] = ("none", "detached")


#: Where the value of a KL *in the reward* is computed off-policy: ``"current"`` (recomputed at
#: pi_theta for every gradient step) or ``"rollout"`` (frozen when the batch was sampled, k1 of
#: pi_old vs pi_ref, as PPO, verl, OpenRLHF and lesson 07's lab compute it: the reward is part of the
#: batch, and only the advantage's weight rho = pi_theta / sg(pi_old) changes between epochs).
REWARD_VALUES: tuple[str, ...] = ("current", "rollout")


def offpolicy_expected_gradient(
    logits: Tensor,
    old_logits: Tensor,
    ref_logits: Tensor,
    use: EstimatorUse | str,
    importance: str = "none",
    *,
    reward_values: str = "current",
) -> Tensor:
    """Exact expected gradient w.r.t. ``logits`` when tokens come from pi_old = softmax(old_logits).

    Brute force: for every token x the per-token term of ``use`` (an :class:`~klviz.usage.EstimatorUse`
    or its label, e.g. ``"k3·ρ in loss"``: rho is pi_theta / sg(pi_old)) is built with torch ops by
    :func:`klviz.usage.per_token_surrogate`, times sg(pi_theta / pi_old) when ``importance`` is
    ``"detached"``, and the gradient of sum_x pi_old(x) L_x is taken by autograd. With
    ``old_logits == logits`` it is the on-policy expected gradient.

    ``reward_values`` (a use in the reward only; :data:`REWARD_VALUES`): ``"current"`` recomputes the
    KL value at pi_theta; ``"rollout"`` freezes it at pi_old, the value the batch was scored with, so
    the term is sg(k(pi_old vs pi_ref)) times rho (``weighting="rho"``: PPO's rho · A) or times
    log pi_theta. With rho its expectation is E_{pi_theta}[k1_old · s] = grad KL(pi_theta || pi_ref) -
    grad KL(pi_theta || pi_old) (pi_old held fixed): biased as soon as pi_theta has moved.
    """
    use = parse_use(use)
    importance = check_choice(importance, "importance", IMPORTANCE_WEIGHTS)
    reward_values = check_choice(reward_values, "reward_values", REWARD_VALUES)
    if reward_values == "rollout" and use.placement != "reward":
        raise ValueError(f"reward_values='rollout' freezes a KL in the reward; {use.label!r} is in the loss")
    th = as_float_tensor(logits, "logits").to(torch.float64)
    old = as_float_tensor(old_logits, "old_logits").to(torch.float64)
    ref = as_float_tensor(ref_logits, "ref_logits").to(torch.float64)
    for t, name in ((th, "logits"), (old, "old_logits"), (ref, "ref_logits")):
        if t.dim() != 1 or t.shape != th.shape:
            raise ValueError(
                f"{name} must be 1-D with {th.shape[0] if th.dim() == 1 else '?'} entries, got shape {tuple(t.shape)}"
            )
    th = th.detach().clone().requires_grad_(True)
    with torch.enable_grad():
        log_pi = torch.log_softmax(th, -1)
        log_old = torch.log_softmax(old, -1)
        log_ref = torch.log_softmax(ref, -1)
        if reward_values == "rollout":  # the value the batch was scored with, at pi_old
            value = kernel.estimate(use.estimator, log_ref - log_old).detach()
            per_token = value * (torch.exp(log_pi - log_old.detach()) if use.weighting == "rho" else log_pi)
        else:
            per_token = per_token_surrogate(use, log_pi, log_ref, log_old)
        if importance == "detached":
            per_token = torch.exp(log_pi - log_old).detach() * per_token
        (g,) = torch.autograd.grad((log_old.exp() * per_token).sum(), th)
    return g


def reward_updates(start_logits: Tensor, rewards: Tensor, *, steps: int, lr: float) -> Tensor:
    """Logits after ``steps`` exact policy-gradient ascent steps on E_pi[R] (the "few updates" that
    make the current policy pi_theta differ from the pi_old that sampled the batch)."""
    lg = as_float_tensor(start_logits, "start_logits").to(torch.float64).clone()
    rw = as_float_tensor(rewards, "rewards").to(torch.float64)
    if not isinstance(steps, int) or steps < 0:
        raise ValueError(f"steps must be a non-negative integer, got {steps!r}")
    for _ in range(steps):
        lg = lg + lr * reward_gradient(lg, rw)
    return lg


# --------------------------------------------------------------------------------------------------
# lesson 05's bandit: its three tokens, reference policy, rewards and beta grid, and the solutions
# its figures and panels show (computed once per kernel)
# --------------------------------------------------------------------------------------------------
import functools  # noqa: E402 - this section's imports; it is kept apart from the functions above
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

from .divergences import categorical_kl  # noqa: E402
from .simplex import ALL_FLOWS  # noqa: E402

__all__ += ["THREE_TOKENS", "REF_PROBS", "REWARDS", "BETA_GRID", "bandit_solutions", "bandit_table"]

#: The three tokens of the lesson's triangle, the reference policy and the bandit's rewards.
THREE_TOKENS: tuple[str, str, str] = (" mat", " sofa", " moon")
REF_PROBS: tuple[float, float, float] = (0.5, 0.3, 0.2)
REWARDS: tuple[float, float, float] = (0.0, 0.5, 1.0)
#: The beta values of the bandit panel (log-spaced): fixed points are computed once for all of them.
BETA_GRID: tuple[float, ...] = tuple(float(f"{b:.3g}") for b in np.geomspace(0.05, 10.0, 24))


@functools.lru_cache(maxsize=2)
def bandit_solutions(ref: tuple[float, ...], rewards: tuple[float, ...], betas: tuple[float, ...]) -> dict[str, Any]:
    """Fixed points for every flow and beta (computed once), and both closed-form solution paths:
    ``{"fixed": bandit_fixed_points(...), "reverse": [len(betas), K], "forward": [len(betas), K]}``."""
    ref_t = torch.tensor(ref, dtype=torch.float64)
    rw_t = torch.tensor(rewards, dtype=torch.float64)
    fixed = bandit_fixed_points(ref_t, rw_t, betas, steps=1500)
    rev = torch.stack([reverse_kl_optimum(ref_t, rw_t, b) for b in betas])
    fwd = torch.stack([forward_kl_optimum(ref_t, rw_t, b) for b in betas])
    return {"fixed": fixed, "reverse": rev, "forward": fwd}


def bandit_table(beta_index: int) -> list[dict[str, Any]]:
    """Rows (one per choice) of the bandit panel's readout at ``BETA_GRID[beta_index]``."""
    data = bandit_solutions(REF_PROBS, REWARDS, BETA_GRID)
    star = data["reverse"][beta_index]
    ref = torch.tensor(REF_PROBS, dtype=torch.float64)
    rw = torch.tensor(REWARDS, dtype=torch.float64)
    rows = []
    for flow in ALL_FLOWS:
        p = data["fixed"][flow]["policy"][beta_index]
        rows.append(
            {
                "choice": flow,
                "policy": p.numpy(),
                "tv_to_optimum": float(tv_distance(p, star)),
                "reward": float(p @ rw),
                "kl": float(categorical_kl(p, ref)),
            }
        )
    return rows
