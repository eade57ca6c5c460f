"""Measured pitfalls of KL estimation in RL code: each function returns the numbers a lesson shows.

Every pitfall here comes with an exact value (a closed form or a sum over the vocabulary) and,
where it is a statement about samples, a Monte Carlo measurement with its standard error, so a
lesson can assert that the two agree. Direction rule as everywhere in klviz: tokens x ~ q (the
sampler), ``log_r = log p(x) - log q(x)``, and k1, k2, k3 estimate KL(q || p).

Gaussian toy: q = N(0, 1), p = N(mu, 1), so ``log r = mu x - mu²/2`` with x ~ q, KL(q||p) = mu²/2
and χ²(q||p) = E_q[q/p] - 1 = e^{mu²} - 1.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from .estimators import k1, k2, k3
from .framework_rules import CLAMP_RULES
from .kernel import ESTIMATORS
from .statistics import mean_se
from .validation import Tensor, as_float_tensor, check_choice, check_positive_int, check_same_shape

__all__ = [
    "inverted_k3_exact",
    "inverted_k3_mc",
    "inverted_compute_kl",
    "correct_compute_kl",
    "gaussian_clamped_expectation",
    "gaussian_clamp_hit_rate",
    "gaussian_clamp_curve",
    "CLAMP_RULES",
    "apply_clamp",
    "logprobs_in_precision",
    "precision_errors",
    "off_policy_expectations",
    "aggregation_weights",
    "prob_negative_k1_mean",
    "negative_k1_mc",
    "no_grad_kl_demo",
    "mixture_k3_exact",
    "mixture_k3_mc",
    "relative_variance_table",
    "gaussian_cov_logr_r",
]


def _mu(mu: Any) -> float:
    if (
        isinstance(mu, bool)
        or not isinstance(mu, (int, float, np.floating, np.integer))
        or not math.isfinite(float(mu))
    ):
        raise ValueError(f"mu must be a finite number, got {mu!r}")
    return float(mu)


# ---------------------------------------------------------------------------------------------
# 1. the inverted ratio (a widely copied compute_kl samples from q and uses r = q/p)
# ---------------------------------------------------------------------------------------------


def inverted_k3_exact(mu: float) -> dict[str, float]:
    """Exact expectations for q = N(0,1), p = N(mu,1) when k3 is fed the **inverted** ratio q/p.

    With x ~ q, ``k3(log(q/p))`` has mean χ²(q||p) - KL(q||p) = e^{mu²} - 1 - mu²/2, while the
    correct ``k3(log(p/q))`` has mean KL(q||p) = mu²/2. Returns both and the relative error.
    """
    m = _mu(mu)
    kl = 0.5 * m * m
    chi2 = math.expm1(m * m)
    wrong = chi2 - kl
    return {"kl": kl, "chi2": chi2, "inverted": wrong, "rel_error": (wrong - kl) / kl if kl > 0 else 0.0}


def inverted_k3_mc(mu: float, num_samples: int, *, generator: torch.Generator | None = None) -> dict[str, float]:
    """Monte Carlo means (and standard errors) of k3 with the correct and with the inverted ratio."""
    m = _mu(mu)
    n = check_positive_int(num_samples, "num_samples")
    x = torch.randn(n, generator=generator, dtype=torch.float64)
    log_r = m * x - 0.5 * m * m  # log p(x) - log q(x): target over sampler
    right, wrong = k3(log_r), k3(-log_r)  # the inverted r = q/p is exp(-log_r)
    (c, c_se), (w, w_se) = mean_se(right), mean_se(wrong)
    return {"correct": c, "correct_se": c_se, "inverted": w, "inverted_se": w_se}


def inverted_compute_kl(logp_new: Tensor, logp_old: Tensor) -> Tensor:
    """A widely copied ``compute_kl``: ``ratios = exp(logp_old - logp_new)`` with tokens from old.

    Kept only to measure it: the ratio is sampler over target, the inverse of what k3 needs.
    """
    d = as_float_tensor(logp_old, "logp_old") - as_float_tensor(logp_new, "logp_new")
    return torch.exp(d) - 1 - d  # the mistaken code as written, kept to be measured (not klviz.kernel.k3)


def correct_compute_kl(logp_new: Tensor, logp_old: Tensor) -> Tensor:
    """The corrected version: tokens from old, ``log r = logp_new - logp_old``, k3 estimates KL(old || new)."""
    return k3(as_float_tensor(logp_new, "logp_new") - as_float_tensor(logp_old, "logp_old"))


def gaussian_cov_logr_r(mu: float) -> dict[str, float]:
    """For q = N(0,1), p = N(mu,1): Cov[log r, r - 1] and Var[log r] (both mu²: the sign is +)."""
    m = _mu(mu)
    return {"cov": m * m, "var_log_r": m * m}


# ---------------------------------------------------------------------------------------------
# 2. clamps
# ---------------------------------------------------------------------------------------------


def apply_clamp(log_r: Tensor, estimator: str, rule: str) -> Tensor:
    """Per-token ``estimator`` (``"k1"``, ``"k2"``, ``"k3"``) of ``log_r`` with a framework's clamps.

    ``rule`` is a key of :data:`klviz.framework_rules.CLAMP_RULES`: the input clamp limits |log r|
    before the estimator, the output clamp limits the value after it (verl applies both to k3 only,
    as ``low_var_kl``, and leaves k1 and k2 alone; OpenRLHF clamps the output of every estimator,
    which also clips k1).
    """
    estimator = check_choice(estimator, "estimator", ESTIMATORS)
    rule = check_choice(rule, "rule", tuple(CLAMP_RULES))
    return CLAMP_RULES[rule].apply(as_float_tensor(log_r, "log_r"), estimator)


def _gauss_grid(mu: float, width: float = 14.0, n: int = 40_001) -> tuple[torch.Tensor, torch.Tensor]:
    if abs(mu) > 6:
        raise ValueError(f"mu must lie in [-6, 6] for the quadrature (r's mass sits near x = mu), got {mu!r}")
    x = torch.linspace(-width, width, n, dtype=torch.float64)
    w = torch.exp(-0.5 * x * x) / math.sqrt(2 * math.pi) * (x[1] - x[0])
    return x, w


def gaussian_clamped_expectation(mu: float, estimator: str, rule: str) -> float:
    """E_q[clamped estimator] for q = N(0,1), p = N(mu,1), by quadrature on a fine grid (error below 1e-6)."""
    m = _mu(mu)
    x, w = _gauss_grid(m)
    return float((w * apply_clamp(m * x - 0.5 * m * m, estimator, rule).double()).sum())


def gaussian_clamp_hit_rate(mu: float, estimator: str, rule: str) -> float:
    """P_q(the clamp changes the value) for q = N(0,1), p = N(mu,1), by quadrature."""
    m = _mu(mu)
    x, w = _gauss_grid(m)
    lr = m * x - 0.5 * m * m
    raw = apply_clamp(lr, estimator, "none")
    return float((w * (apply_clamp(lr, estimator, rule) != raw).double()).sum())


def gaussian_clamp_curve(mus: Any, estimator: str, rule: str, *, grid: int = 20_001) -> tuple[np.ndarray, np.ndarray]:
    """:func:`gaussian_clamped_expectation` and :func:`gaussian_clamp_hit_rate` for many ``mus`` at once.

    One ``[len(mus), grid]`` quadrature instead of a loop: returns (expectations, hit rates) as arrays
    (hit rates are step functions of x, accurate to about 1e-3 on the default grid).
    """
    m = torch.as_tensor(np.asarray(mus, dtype=np.float64))
    if m.dim() != 1 or m.numel() == 0 or not bool(torch.isfinite(m).all()) or bool((m.abs() > 6).any()):
        raise ValueError(f"mus must be a non-empty 1-D list of finite numbers in [-6, 6], got {mus!r}")
    n = check_positive_int(grid, "grid")
    x, w = _gauss_grid(0.0, n=n)
    means, hits = [], []
    for mc in m.split(_CURVE_ROWS):  # a few mus at a time: each row is its own sum (same numbers, less memory)
        lr = mc[:, None] * x[None, :] - 0.5 * mc[:, None] ** 2
        clamped = apply_clamp(lr, estimator, rule).double()
        raw = apply_clamp(lr, estimator, "none").double()
        means.append((w * clamped).sum(-1))
        hits.append((w * (clamped != raw).double()).sum(-1))
    return torch.cat(means).numpy(), torch.cat(hits).numpy()


#: rows of mus per quadrature chunk in :func:`gaussian_clamp_curve` (8 x 20,001 float64: ~1.3 MB an array)
_CURVE_ROWS = 8


# ---------------------------------------------------------------------------------------------
# 3. low precision
# ---------------------------------------------------------------------------------------------

_PRECISIONS = ("float32", "bfloat16 logits", "bfloat16", "float16")


def logprobs_in_precision(logits: Tensor, tokens: Tensor, precision: str) -> Tensor:
    """Log-probabilities of ``tokens`` from ``logits`` [..., V] as a forward pass in ``precision`` gives them.

    - ``"float32"``: log-softmax in float32 (the reference);
    - ``"bfloat16 logits"``: logits rounded to bfloat16 (a bf16 model), log-softmax in float32. This is
      what OpenRLHF does (``Actor.forward`` casts the logits to float32, ``openrlhf/models/actor.py``), what
      TRL 1.16.0 does on CUDA/XPU (``selective_log_softmax`` hands the logits to a Triton kernel that
      computes and returns float32, ``trl/kernels/logprob_entropy.py``) and what verl does when flash-attn
      is installed (its Triton cross-entropy, ``logprobs_from_logits`` in ``verl/utils/torch_functional.py``);
    - ``"bfloat16"``/``"float16"``: logits and log-softmax in that dtype, result stored in it. This is
      TRL's CPU fallback (``selective_log_softmax`` runs ``log_softmax`` row by row in the logits' dtype when
      they are not float32/float64) and verl's ``logprobs_from_logits_v2`` without flash-attn.
    Returned as float64 for comparison.
    """
    precision = check_choice(precision, "precision", _PRECISIONS)
    lg = as_float_tensor(logits, "logits").float()
    tok = torch.as_tensor(tokens)
    if tok.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"tokens must be an integer tensor of ids, got dtype {tok.dtype}")
    if tok.shape != lg.shape[:-1]:
        raise ValueError(
            f"tokens has shape {tuple(tok.shape)} but logits has {tuple(lg.shape)}; expected logits [..., V]"
        )
    rows, idx = lg.reshape(-1, lg.shape[-1]), tok.long().reshape(-1, 1)
    # a few positions at a time: each row's log-softmax is its own (same numbers; a [64, 32,000] batch
    # would otherwise hold several full-vocabulary copies at once)
    out = [_row_logprobs(r, i, precision) for r, i in zip(rows.split(_LOGPROB_ROWS), idx.split(_LOGPROB_ROWS))]
    return torch.cat(out).reshape(tok.shape).double()


#: positions per chunk in :func:`logprobs_in_precision`
_LOGPROB_ROWS = 8


def _row_logprobs(lg: Tensor, idx: Tensor, precision: str) -> Tensor:
    """``log_softmax(lg)[row, idx]`` for ``lg [rows, V]`` in ``precision`` (see :func:`logprobs_in_precision`)."""
    if precision == "float32":
        lp = torch.log_softmax(lg, -1)
    elif precision == "bfloat16 logits":
        lp = torch.log_softmax(lg.to(torch.bfloat16).float(), -1)
    else:
        dt = torch.bfloat16 if precision == "bfloat16" else torch.float16
        lp = torch.log_softmax(lg.to(dt), -1)
    return lp.gather(-1, idx).squeeze(-1)


def precision_errors(
    policy_logits: Tensor, ref_logits: Tensor, tokens: Tensor, precision: str, *, ref_precision: str = "float32"
) -> dict[str, Any]:
    """How much k1, k2, k3 change when the policy's log-probs come from a ``precision`` forward pass.

    ``ref_precision`` is the precision of the reference pass (float32 by default; pass the same as
    ``precision`` to model two passes in one precision). Returns per-token errors (low − float32)
    and, per estimator, the mean absolute per-token error, the error of the batch mean, and the
    float32 batch mean.
    """
    lp32 = logprobs_in_precision(policy_logits, tokens, "float32")
    ref32 = logprobs_in_precision(ref_logits, tokens, "float32")
    lp = logprobs_in_precision(policy_logits, tokens, precision)
    ref = logprobs_in_precision(ref_logits, tokens, ref_precision)
    out: dict[str, Any] = {"logprob_error": lp - lp32}
    for name, fn in (("k1", k1), ("k2", k2), ("k3", k3)):
        exact, low = fn(ref32 - lp32), fn(ref - lp)
        err = low - exact
        out[name] = {
            "per_token_abs": float(err.abs().mean()),
            "batch_mean_error": float(err.mean()),
            "batch_mean": float(exact.mean()),
            "batch_mean_low": float(low.mean()),
            "errors": err,
        }
    return out


# ---------------------------------------------------------------------------------------------
# 4. off-policy tokens (the second PPO epoch)
# ---------------------------------------------------------------------------------------------


def off_policy_expectations(old_logits: Tensor, theta_logits: Tensor, ref_logits: Tensor) -> dict[str, float]:
    """Exact expectations (vocabulary sums) when tokens come from pi_old but the code uses pi_theta.

    Keys: the three KLs (``KL(theta||ref)``, ``KL(old||ref)``, ``KL(old||theta)``); the naive
    ``k1``, ``k2``, ``k3`` of ``log r = log ref - log theta`` averaged over old's tokens;
    the ratio-weighted ``rho*k1``/``rho*k3`` (rho = theta/old), and PPO's ``ppo_kl`` (k1 of old vs theta).
    """
    lo = torch.log_softmax(as_float_tensor(old_logits, "old_logits").double(), -1)
    lt = torch.log_softmax(as_float_tensor(theta_logits, "theta_logits").double(), -1)
    lr_ = torch.log_softmax(as_float_tensor(ref_logits, "ref_logits").double(), -1)
    check_same_shape(lo, lt, "old_logits", "theta_logits")
    check_same_shape(lo, lr_, "old_logits", "ref_logits")
    po, pt = lo.exp(), lt.exp()
    log_r = lr_ - lt
    rho = (lt - lo).exp()
    e = lambda v: float((po * v).sum(-1).mean())  # noqa: E731 - expectation under old, averaged over positions
    return {
        "KL(theta||ref)": float((pt * (lt - lr_)).sum(-1).mean()),
        "KL(old||ref)": float((po * (lo - lr_)).sum(-1).mean()),
        "KL(old||theta)": float((po * (lo - lt)).sum(-1).mean()),
        "k1": e(k1(log_r)),
        "k2": e(k2(log_r)),
        "k3": e(k3(log_r)),
        "rho*k1": e(rho * k1(log_r)),
        "rho*k3": e(rho * k3(log_r)),
        "ppo_kl": e(lo - lt),
    }


# ---------------------------------------------------------------------------------------------
# 5. sum vs mean over sequences of different lengths
# ---------------------------------------------------------------------------------------------


def aggregation_weights(lengths: Any, mode: str) -> torch.Tensor:
    """Weight each *token* of a sequence of the given length receives in ``klviz.agg_loss(mode)``.

    ``token-mean``: 1/ΣL for every token; ``seq-mean-token-mean``: 1/(B·L_b) (tokens of short
    responses weigh more); ``seq-mean-token-sum``: 1/B (the result is a sequence KL, not per token).
    """
    from .estimators import AGG_MODES

    mode = check_choice(mode, "mode", AGG_MODES[:3])
    L = torch.as_tensor(lengths, dtype=torch.float64)
    if L.dim() != 1 or L.numel() == 0 or bool((L <= 0).any()):
        raise ValueError(f"lengths must be a non-empty 1-D list of positive lengths, got {lengths!r}")
    B = L.numel()
    if mode == "token-mean":
        return torch.full_like(L, 1.0 / float(L.sum()))
    if mode == "seq-mean-token-mean":
        return 1.0 / (B * L)
    return torch.full_like(L, 1.0 / B)


# ---------------------------------------------------------------------------------------------
# 6. negative k1 batch means
# ---------------------------------------------------------------------------------------------


def prob_negative_k1_mean(mu: float, batch_tokens: int) -> float:
    """P(mean of ``batch_tokens`` k1 values < 0) for q = N(0,1), p = N(mu,1): Φ(-|mu|·√N / 2).

    k1 = -log r = mu²/2 - mu x is Gaussian with mean mu²/2 (the KL) and variance mu², so its
    batch mean is N(mu²/2, mu²/N).
    """
    m = abs(_mu(mu))
    n = check_positive_int(batch_tokens, "batch_tokens")
    if m == 0:
        return 0.0
    return 0.5 * math.erfc(m * math.sqrt(n) / 2 / math.sqrt(2))


def negative_k1_mc(
    mu: float, batch_tokens: int, num_batches: int, *, generator: torch.Generator | None = None
) -> dict[str, float]:
    """Fraction of ``num_batches`` simulated batches whose k1 mean is negative, and its standard error."""
    m = _mu(mu)
    n = check_positive_int(batch_tokens, "batch_tokens")
    nb = check_positive_int(num_batches, "num_batches")
    x = torch.randn(nb, n, generator=generator, dtype=torch.float64)
    # batch means a block of rows at a time: the same numbers without three more [nb, n] temporaries
    means = torch.cat([k1(m * xb - 0.5 * m * m).mean(-1) for xb in x.split(max(1, 2**16 // n))])
    frac = float((means < 0).double().mean())
    return {"fraction": frac, "se": math.sqrt(max(frac * (1 - frac), 1e-12) / nb), "num_batches": nb}


# ---------------------------------------------------------------------------------------------
# 7. a KL loss under torch.no_grad
# ---------------------------------------------------------------------------------------------


def no_grad_kl_demo(
    policy_logits: Tensor, ref_logits: Tensor, tokens: Tensor, advantages: Tensor, beta: float = 0.1
) -> dict[str, Any]:
    """Gradients of a toy policy-gradient loss with a k3 penalty computed three ways.

    ``"pg only"``: no KL term; ``"kl under no_grad"``: the k3 term computed inside
    ``torch.no_grad()`` and added to the loss (open-instruct#530); ``"kl with grad"``: the same term
    with autograd on. Returns each loss value and gradient with respect to ``policy_logits``.
    """
    logits0 = as_float_tensor(policy_logits, "policy_logits").double().detach()
    ref = torch.log_softmax(as_float_tensor(ref_logits, "ref_logits").double(), -1)
    tok = torch.as_tensor(tokens).long()
    adv = as_float_tensor(advantages, "advantages").double()

    def run(kind: str) -> tuple[float, torch.Tensor, bool]:
        logits = logits0.clone().requires_grad_(True)
        logp = torch.log_softmax(logits, -1).gather(-1, tok[..., None])[..., 0]
        ref_lp = ref.gather(-1, tok[..., None])[..., 0]
        pg = -(torch.exp(logp - logp.detach()) * adv).mean()
        if kind == "pg only":
            loss = pg
            kl_requires_grad = False
        elif kind == "kl under no_grad":
            with torch.no_grad():
                kl = k3(ref_lp - logp).mean()
            kl_requires_grad = kl.requires_grad
            loss = pg + beta * kl
        else:
            kl = k3(ref_lp - logp).mean()
            kl_requires_grad = kl.requires_grad
            loss = pg + beta * kl
        (grad,) = torch.autograd.grad(loss, logits)
        return float(loss.detach()), grad, kl_requires_grad

    out = {}
    for kind in ("pg only", "kl under no_grad", "kl with grad"):
        loss, grad, req = run(kind)
        out[kind] = {"loss": loss, "grad": grad, "kl_requires_grad": req}
    return out


# ---------------------------------------------------------------------------------------------
# 8. "mix samples from p" without importance weights
# ---------------------------------------------------------------------------------------------


def mixture_k3_exact(mu: float, alpha: float) -> dict[str, float]:
    """q = N(0,1), p = N(mu,1); a fraction ``alpha`` of the samples drawn from p, k3 averaged naively.

    Naive: (1 - alpha)·KL(q||p) + alpha·(χ²(p||q) - KL(p||q)) = (1-α)μ²/2 + α(e^{μ²} - 1 - μ²/2).
    With importance weights q/m (m the mixture) the mean is KL(q||p) for every alpha.
    """
    m = _mu(mu)
    if not (isinstance(alpha, (int, float)) and 0.0 <= alpha <= 1.0):
        raise ValueError(f"alpha must lie in [0, 1], got {alpha!r}")
    kl = 0.5 * m * m
    return {"kl": kl, "naive": (1 - alpha) * kl + alpha * (math.expm1(m * m) - kl), "weighted": kl}


def mixture_k3_mc(
    mu: float, alpha: float, num_samples: int, *, generator: torch.Generator | None = None
) -> dict[str, float]:
    """Monte Carlo of :func:`mixture_k3_exact`: naive and importance-weighted means with standard errors."""
    m = _mu(mu)
    mixture_k3_exact(m, alpha)
    n = check_positive_int(num_samples, "num_samples")
    from_p = torch.rand(n, generator=generator, dtype=torch.float64) < alpha
    x = torch.randn(n, generator=generator, dtype=torch.float64) + m * from_p
    log_q = -0.5 * x * x
    log_p = -0.5 * (x - m) ** 2
    lr = log_p - log_q
    naive = k3(lr)
    log_mix = torch.logaddexp(
        math.log1p(-alpha) + log_q if alpha < 1 else torch.full_like(x, -math.inf),
        math.log(alpha) + log_p if alpha > 0 else torch.full_like(x, -math.inf),
    )
    weighted = torch.exp(log_q - log_mix) * naive
    (a, a_se), (w, w_se) = mean_se(naive), mean_se(weighted)
    return {"naive": a, "naive_se": a_se, "weighted": w, "weighted_se": w_se}


# ---------------------------------------------------------------------------------------------
# 9. a widely quoted variance table, measured
# ---------------------------------------------------------------------------------------------


def relative_variance_table(
    log_r: Tensor, exact_kl: float, weights: Tensor | None = None
) -> dict[str, dict[str, float]]:
    """The quoted table (relative variance, bias %) measured on per-token ``log_r`` of tokens x ~ q.

    ``exact_kl`` is the true KL(q||p) the tokens estimate (a vocabulary sum); ``weights`` optional
    per-token weights (counts). Returns per estimator ``var_rel_k1`` (variance / variance of k1),
    ``bias_pct`` (100 · (mean - exact) / exact), ``mean`` and ``var``.
    """
    lr = as_float_tensor(log_r, "log_r").double().flatten()
    w = torch.ones_like(lr) if weights is None else as_float_tensor(weights, "weights").double().flatten()
    if w.shape != lr.shape:
        raise ValueError(f"weights has {w.numel()} entries but log_r has {lr.numel()}")
    if not exact_kl > 0:
        raise ValueError(f"exact_kl must be positive, got {exact_kl!r}")
    w = w / w.sum()
    out = {}
    var1 = None
    for name, fn in (("k1", k1), ("k2", k2), ("k3", k3)):
        v = fn(lr)
        mean = float((w * v).sum())
        var = float((w * (v - mean) ** 2).sum())
        if var1 is None:
            var1 = var
        out[name] = {
            "mean": mean,
            "var": var,
            "var_rel_k1": var / var1 if var1 > 0 else math.nan,
            "bias_pct": 100.0 * (mean - exact_kl) / exact_kl,
        }
    return out
