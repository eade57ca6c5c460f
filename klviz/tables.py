"""Schulman's table of the k1, k2, k3 estimators, reproduced: Monte Carlo beside exact values.

Two kinds of ground truth sit beside every Monte Carlo number in lesson 02:

- **Gaussians.** With x ~ q = N(mu_q, sigma_q²) written as ``x = mu_q + sigma_q z``, the log-ratio
  ``log r = log p(x) - log q(x)`` is a quadratic ``a + b z + c z²`` in a standard normal z. Every
  moment of k1 and k2 is then a finite sum of Gaussian moments E[z^k], and E_q[r²] is a Gaussian
  integral that converges exactly when ``sigma_p² < 2 sigma_q²``: :func:`gaussian_moments`.
  :func:`gaussian_closed_forms` states the equal-scale special case (q = N(0,1), p = N(mu,1)) in
  the form the lesson prints.
- **Token distributions.** Sums over the vocabulary, no sampling: :func:`categorical_moments`.

:func:`monte_carlo_row` measures the same numbers with :func:`klviz.estimator_stats` over
independent batches, so that the standard error of a *standard deviation* (which needs the fourth
moment) is measured by the spread of the batch values instead of guessed.

One identity ties the estimators together: ``Cov_q(log r, r) = KL(q||p) + KL(p||q)`` (the
Jeffreys divergence, never negative). It is why k3 = (r - 1) - log r has less variance than
k1 = -log r when p is close to q, and it fixes the best control-variate coefficient
``lambda* = (KL(q||p) + KL(p||q)) / chi²(p||q)`` of the family ``k1 + lambda (r - 1)``.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.distributions import Categorical, Normal

from .divergences import categorical_kl, gaussian_kl, target_favours
from .estimators import k1, k2, k3
from .messages import tr
from .montecarlo import ESTIMATORS, _relative, estimator_stats
from .statistics import RunningMoments, batch_means_se, control_variate_lambda
from .validation import as_float_tensor, check_positive_int

__all__ = [
    "EstimatorMoments",
    "gaussian_moments",
    "gaussian_closed_forms",
    "categorical_moments",
    "monte_carlo_row",
    "schulman_table",
    "SCHULMAN_PUBLISHED",
    "table_html",
    "k1_negative_probability",
    "variance_crossing_mu",
    "control_variate_samples",
    "sample_log_ratio",
    "exact_moments",
    "k1_negative_mass",
    "k2_bias_series",
    "k2_bias_rule",
    "gaussian_k2_bias_rule",
    "k3_variance_parts",
    "format_mc",
]

#: The numbers printed in Schulman's blog post (bias/true and std/true of one sample), by mu.
SCHULMAN_PUBLISHED: dict[float, dict[str, tuple[float, float]]] = {
    0.1: {"k1": (0.0, 20.0), "k2": (0.002, 1.42), "k3": (0.0, 1.42)},
    1.0: {"k1": (0.0, 2.0), "k2": (0.25, 1.73), "k3": (0.0, 1.7)},
}

# E[z^k] for z ~ N(0, 1), k = 0..8: 0 for odd k, (k - 1)!! for even k
_NORMAL_MOMENTS = np.array([1.0, 0.0, 1.0, 0.0, 3.0, 0.0, 15.0, 0.0, 105.0])


def _finite_float(value: Any, name: str) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a real number, got {value!r}") from None
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {v}")
    return v


def _positive_float(value: Any, name: str) -> float:
    v = _finite_float(value, name)
    if v <= 0:
        raise ValueError(f"{name} must be a positive standard deviation, got {v:g}")
    return v


@dataclass(frozen=True)
class EstimatorMoments:
    """Exact means and variances of k1, k2, k3 (one sample, x ~ q) and of r, for one pair (q, p).

    ``var_r`` is Var_q(r) = chi²(p||q) (``inf`` when the integral diverges); ``cov_k1_r`` is
    Cov_q(k1, r) = -(KL(q||p) + KL(p||q)) when p's support lies inside q's. ``notes`` explains
    any infinite entry in words, for a reader who sees "inf" in a table.
    """

    true_kl: float
    mean: dict[str, float]
    var: dict[str, float]
    var_r: float
    cov_k1_r: float
    notes: dict[str, str] = field(default_factory=dict)

    def bias(self, name: str) -> float:
        """Exact bias ``E[k] - KL(q||p)`` of one estimator."""
        return self.mean[name] - self.true_kl

    def std(self, name: str) -> float:
        """Exact single-sample standard deviation (``inf`` when the variance diverges)."""
        return math.sqrt(self.var[name])

    def bias_rel(self, name: str) -> float:
        """Bias divided by the true KL (the first number of each cell of Schulman's table)."""
        return _relative(self.bias(name), self.true_kl)

    def std_rel(self, name: str) -> float:
        """Single-sample std divided by the true KL (the second number of each cell)."""
        return _relative(self.std(name), self.true_kl)

    @property
    def lambda_star(self) -> float:
        """The lambda that minimises Var(k1 + lambda (r - 1)): ``-Cov(k1, r) / Var(r)``.

        0 when Var(r) is infinite (any other lambda has infinite variance) or zero (p = q)."""
        return control_variate_lambda(self.cov_k1_r, self.var_r)

    def cv_variance(self, lam: float | np.ndarray) -> float | np.ndarray:
        """Var(k1 + lambda (r - 1)) = Var k1 + 2 lambda Cov(k1, r) + lambda² Var r (vectorised over lambda)."""
        lam_arr = np.asarray(lam, dtype=np.float64)
        if not np.all(np.isfinite(lam_arr)):
            raise ValueError("lam must be finite")
        if math.isfinite(self.var_r):
            out = self.var["k1"] + 2.0 * lam_arr * self.cov_k1_r + lam_arr**2 * self.var_r
            out = np.maximum(out, 0.0)
        else:
            out = np.where(lam_arr == 0.0, self.var["k1"], np.inf)
        return float(out) if out.ndim == 0 else out


def _poly_mean(coef: np.ndarray) -> float:
    """E[P(z)] for a polynomial with coefficients ``coef`` (lowest degree first) and z ~ N(0, 1)."""
    return float(np.dot(coef, _NORMAL_MOMENTS[: len(coef)]))


def _log_ratio_quadratic(mu_q: float, sigma_q: float, mu_p: float, sigma_p: float) -> tuple[float, float, float]:
    """(a, b, c) with log p(x) - log q(x) = a + b z + c z² for x = mu_q + sigma_q z."""
    d = mu_q - mu_p
    a = math.log(sigma_q / sigma_p) - d * d / (2 * sigma_p**2)
    b = -d * sigma_q / sigma_p**2
    c = 0.5 - sigma_q**2 / (2 * sigma_p**2)
    return a, b, c


def gaussian_moments(mu_q: float, sigma_q: float, mu_p: float, sigma_p: float) -> EstimatorMoments:
    """Exact means and variances of k1, k2, k3 for x ~ q = N(mu_q, sigma_q²), p = N(mu_p, sigma_p²).

    With log r = a + b z + c z² (z ~ N(0,1)): Var k1 = b² + 2c²; E k2 = ½ E[(log r)²] and Var k2 =
    ¼ (E[(log r)⁴] - E[(log r)²]²) are finite sums of normal moments; E k3 = KL(q||p) and
    Var k3 = chi² + Var(log r) - 2 (KL(q||p) + KL(p||q)) with chi² = E_q[r²] - 1, which is finite
    only when ``sigma_p² < 2 sigma_q²``: otherwise p's tails are too heavy for q's, the integral
    of p²/q diverges, and Var k3 is ``inf`` (a sample std then never settles as N grows).
    """
    mq, mp = _finite_float(mu_q, "mu_q"), _finite_float(mu_p, "mu_p")
    sq, sp = _positive_float(sigma_q, "sigma_q"), _positive_float(sigma_p, "sigma_p")
    a, b, c = _log_ratio_quadratic(mq, sq, mp, sp)
    poly = np.array([a, b, c])
    l1 = _poly_mean(poly)
    poly2 = np.convolve(poly, poly)
    l2 = _poly_mean(poly2)
    l4 = _poly_mean(np.convolve(poly2, poly2))
    t = lambda v: torch.tensor(v, dtype=torch.float64)  # noqa: E731 - keep float64 end to end
    kl_qp = float(gaussian_kl(t(mq), t(sq), t(mp), t(sp)))
    kl_pq = float(gaussian_kl(t(mp), t(sp), t(mq), t(sq)))
    var_l = max(b * b + 2 * c * c, 0.0)
    notes: dict[str, str] = {}
    # E_q[r²] = e^{2a} E[exp(2b z + 2c z²)] = e^{2a} (1 - 4c)^{-1/2} exp(2b² / (1 - 4c)), if 1 - 4c > 0
    s = 1.0 - 4.0 * c  # = 2 sigma_q² / sigma_p² - 1
    if s <= 0:
        var_r = math.inf
        notes["k3"] = tr(
            "Var k3 = inf: sigma_p² = {var_p:.3g} ≥ 2 sigma_q² = {twice_var_q:.3g}, so r² = (p/q)² grows faster "
            "in q's tails than q decays and E_q[r²] diverges; a sample std of k3 keeps growing with "
            "N instead of settling.",
            var_p=sp * sp,
            twice_var_q=2 * sq * sq,
        )
    else:
        log_er2 = 2 * a - 0.5 * math.log(s) + 2 * b * b / s
        if log_er2 > 709.0:
            var_r = math.inf
            notes["k3"] = tr(
                "Var k3 overflows float64: E_q[r²] = e^{log_er2:.0f} is finite but beyond 1e308; in "
                "practice no sample size estimates it.",
                log_er2=log_er2,
            )
        else:
            var_r = math.expm1(log_er2) if abs(log_er2) < 1 else math.exp(log_er2) - 1.0
    jeffreys = kl_qp + kl_pq
    var_k3 = var_r + var_l - 2 * jeffreys if math.isfinite(var_r) else math.inf
    mean = {"k1": -l1, "k2": 0.5 * l2, "k3": kl_qp}
    var = {"k1": var_l, "k2": max(0.25 * (l4 - l2 * l2), 0.0), "k3": max(var_k3, 0.0)}
    return EstimatorMoments(true_kl=kl_qp, mean=mean, var=var, var_r=var_r, cov_k1_r=-jeffreys, notes=notes)


def gaussian_closed_forms(mu: float) -> dict[str, float]:
    """The closed forms for q = N(0, 1), p = N(mu, 1), written out literally (lesson 02 shows this code).

    ``log r = mu x - mu²/2``, so KL = mu²/2, Var k1 = mu², E k2 = mu²/2 + mu⁴/8 (bias/true = mu²/4),
    Var k2 = mu⁴/2 + mu⁶/4, Var k3 = Var r + Var log r - 2 Cov(r, log r) = (e^{mu²} - 1) + mu² - 2 mu²
    = e^{mu²} - 1 - mu², Var(r) = e^{mu²} - 1 and the best
    control-variate coefficient lambda* = mu² / (e^{mu²} - 1). Relative values divide by the KL
    (they are ``inf`` at mu = 0, where the KL is 0).
    """
    m = _finite_float(mu, "mu")
    m2 = m * m
    if m2 > 700:
        raise ValueError(f"mu must satisfy mu² ≤ 700 (e^(mu²) overflows float64 beyond), got mu = {m:g}")
    kl = m2 / 2
    em1 = math.expm1(m2)
    out = {
        "true_kl": kl,
        "mean_k1": kl,
        "mean_k2": m2 / 2 + m2 * m2 / 8,
        "mean_k3": kl,
        "var_k1": m2,
        "var_k2": m2 * m2 / 2 + m2**3 / 4,
        "var_k3": em1 - m2,
        "var_r": em1,
        "cov_k1_r": -m2,
        "lambda_star": m2 / em1 if m2 > 0 else 1.0,
        # Var k3 = Var r + Var log r - 2 Cov(r, log r), piece by piece (Cov(Y, e^Y) = s² E[e^Y], Stein)
        "var_log_r": m2,
        "cov_r_log_r": m2,
    }
    out["bias_rel_k2"] = m2 / 4
    for k in ESTIMATORS:
        out[f"std_rel_{k}"] = _relative(math.sqrt(out[f"var_{k}"]), kl)
    return out


def categorical_moments(q_probs: Any, p_probs: Any) -> EstimatorMoments:
    """Exact means and variances of k1, k2, k3 for one token x ~ q, by summing over the vocabulary.

    ``E_q[f(x)] = sum_x q(x) f(x)``: no sampling. Tokens with q(x) = 0 are never drawn and do not
    count; p must be positive wherever q is (else KL(q||p) is infinite: ``ValueError``). If p has
    mass where q has none, E_q[r] < 1 and k3 is biased: the returned mean shows it.
    """
    q = as_float_tensor(q_probs, "q_probs").to(torch.float64)
    p = as_float_tensor(p_probs, "p_probs").to(torch.float64)
    true_kl = float(categorical_kl(q, p))  # validates shapes, signs and normalisation
    if q.dim() != 1:
        raise ValueError(f"q_probs must be one probability vector (1-D), got shape {tuple(q.shape)}")
    support = q > 0
    if bool((p[support] <= 0).any()):
        raise ValueError("p_probs is zero on a token that q_probs can sample: KL(q||p) is infinite")
    w = q[support]
    log_r = torch.log(p[support]) - torch.log(w)
    r = torch.exp(log_r)
    mean, var = {}, {}
    for name, fn in (("k1", k1), ("k2", k2), ("k3", k3)):
        v = fn(log_r)
        m = float((w * v).sum())
        mean[name] = m
        var[name] = max(float((w * (v - m).square()).sum()), 0.0)
    er = float((w * r).sum())
    var_r = max(float((w * (r - er).square()).sum()), 0.0)
    cov = float((w * (-log_r - mean["k1"]) * (r - er)).sum())
    return EstimatorMoments(true_kl=true_kl, mean=mean, var=var, var_r=var_r, cov_k1_r=cov)


def _check_dists(q: Any, p: Any) -> None:
    for d, name in ((q, "q"), (p, "p")):
        if not isinstance(d, (Normal, Categorical)):
            raise ValueError(f"{name} must be a torch.distributions Normal or Categorical, got {type(d).__name__}")


def exact_moments(q: Normal | Categorical, p: Normal | Categorical) -> EstimatorMoments:
    """:func:`gaussian_moments` or :func:`categorical_moments` for two ``torch.distributions``."""
    _check_dists(q, p)
    if type(q) is not type(p):
        raise ValueError(f"q is a {type(q).__name__} but p is a {type(p).__name__}; both must be of one kind")
    if isinstance(q, Normal) and isinstance(p, Normal):
        return gaussian_moments(float(q.loc), float(q.scale), float(p.loc), float(p.scale))
    assert isinstance(q, Categorical) and isinstance(p, Categorical)  # _check_dists and the kinds agree
    return categorical_moments(q.probs, p.probs)


def monte_carlo_row(
    q: Normal | Categorical,
    p: Normal | Categorical,
    num_samples: int,
    *,
    num_batches: int = 20,
    generator: torch.Generator | None = None,
    device: str | torch.device | None = None,
) -> dict[str, Any]:
    """Monte Carlo bias/true and std/true of k1, k2, k3 with their standard errors, from batches.

    Draws ``num_samples`` x ~ q with :func:`klviz.estimator_stats`, in ``num_batches`` independent
    batches (the last ones one sample shorter when the split is uneven). The pooled mean and std
    use all samples. Standard errors:

    - of a mean: ``std / sqrt(n)``;
    - of the single-sample std: the spread of the batch stds divided by ``sqrt(num_batches)``
      (batch means), which accounts for the fourth moment without assuming it.

    Returns ``{"true_kl", "num_samples", "num_batches", "k1": {...}, "k2": {...}, "k3": {...}}``
    with, per estimator, ``mean``, ``se``, ``bias_rel``, ``se_bias_rel``, ``std``, ``se_std``,
    ``std_rel``, ``se_std_rel`` and ``se_batches`` (the batch-means SE of the mean, a cross-check of ``se``).
    """
    n = check_positive_int(num_samples, "num_samples")
    nb = check_positive_int(num_batches, "num_batches")
    if nb < 2:
        raise ValueError(f"num_batches must be at least 2 to measure a standard error, got {nb}")
    if n < 2 * nb:
        raise ValueError(f"num_samples must be at least 2 * num_batches = {2 * nb}, got {n}")
    sizes = [n // nb + (1 if i < n % nb else 0) for i in range(nb)]
    batches = [estimator_stats(q, p, m, generator=generator, device=device) for m in sizes]
    true_kl = batches[0]["true_kl"]
    out: dict[str, Any] = {"true_kl": true_kl, "num_samples": n, "num_batches": nb}
    for k in ESTIMATORS:
        pooled = RunningMoments()
        for b in batches:
            s = b[k]
            pooled.add_moments(b["num_samples"], s["mean"], s["std"] ** 2 * (b["num_samples"] - 1))
        stds = [float(b[k]["std"]) for b in batches]
        means = [float(b[k]["mean"]) for b in batches]
        se = pooled.se
        se_std = batch_means_se(stds)
        out[k] = {
            "mean": pooled.mean,
            "se": se,
            "se_batches": batch_means_se(means),
            "bias_rel": _relative(pooled.mean - true_kl, true_kl),
            "se_bias_rel": _relative(se, true_kl),
            "std": pooled.std,
            "se_std": se_std,
            "std_rel": _relative(pooled.std, true_kl),
            "se_std_rel": _relative(se_std, true_kl),
        }
    return out


def schulman_table(
    mus: tuple[float, ...] = (0.1, 1.0),
    num_samples: int = 10**7,
    *,
    num_batches: int = 20,
    generator: torch.Generator | None = None,
    device: str | torch.device | None = None,
) -> list[dict[str, Any]]:
    """Schulman's experiment: q = N(0, 1), p = N(mu, 1) for each ``mu``, ``num_samples`` draws each.

    One row per mu: ``{"mu", "exact": EstimatorMoments, "closed": gaussian_closed_forms(mu),
    "mc": monte_carlo_row(...), "published": SCHULMAN_PUBLISHED.get(mu)}``.
    """
    rows = []
    for mu in mus:
        m = _finite_float(mu, "mus")
        if m == 0:
            raise ValueError("mus must be non-zero: at mu = 0 the KL is 0 and relative numbers are undefined")
        q = Normal(torch.tensor(0.0, dtype=torch.float64), torch.tensor(1.0, dtype=torch.float64))
        p = Normal(torch.tensor(m, dtype=torch.float64), torch.tensor(1.0, dtype=torch.float64))
        rows.append(
            {
                "mu": m,
                "exact": gaussian_moments(0.0, 1.0, m, 1.0),
                "closed": gaussian_closed_forms(m),
                "mc": monte_carlo_row(q, p, num_samples, num_batches=num_batches, generator=generator, device=device),
                "published": SCHULMAN_PUBLISHED.get(m),
            }
        )
    return rows


def _fmt(x: float, digits: int = 4) -> str:
    """An exact value to ``digits`` decimals; an exact zero (or rounding noise below 1e-12) prints as 0."""
    if math.isinf(x):
        return "inf"
    if abs(x) < 1e-12:
        return "0"
    return f"{round(x, digits) + 0.0:.{digits}f}"  # + 0.0 turns a rounded -0.0 into 0.0


def format_mc(value: float, se: float, *, signed: bool = False) -> str:
    """A Monte Carlo value with its ± 2 SE, rounded to the precision its standard error allows.

    The half-width 2 SE keeps two significant digits and the value is rounded to the same decimal
    place: ``format_mc(0.02134, 0.00152)`` is ``"0.0213 ± 0.0030"``. A non-finite SE prints the value
    to four significant digits alone.
    """
    sign = "+" if signed else ""
    if not (math.isfinite(value) and math.isfinite(se)) or se <= 0:
        return "inf" if math.isinf(value) else f"{value:{sign}.4g}"
    half = 2 * se
    decimals = max(0, 1 - math.floor(math.log10(half)))
    return f"{round(value, decimals) + 0.0:{sign}.{decimals}f} ± {half:.{decimals}f}"


def table_html(rows: list[dict[str, Any]], label: str = "mu") -> str:
    """An HTML table: per row and estimator, bias/true and std/true as MC ± SE, exact, and published.

    ``rows`` are :func:`schulman_table` rows (or any dicts with ``"exact"`` (EstimatorMoments),
    ``"mc"`` (a :func:`monte_carlo_row` result), ``label`` and optionally ``"published"``).
    """
    head = (
        "<tr><th rowspan=2>"
        + html.escape(label)
        + tr(
            "</th><th rowspan=2>true KL</th><th rowspan=2>"
            "estimator</th><th colspan=3>bias / true</th><th colspan=3>std / true (one sample)</th></tr>"
            "<tr><th>Monte Carlo ± 2 SE</th><th>exact</th><th>published</th>"
            "<th>Monte Carlo ± 2 SE</th><th>exact</th><th>published</th></tr>"
        )
    )
    body = []
    for row in rows:
        ex, mc, pub = row["exact"], row["mc"], row.get("published")
        for i, k in enumerate(ESTIMATORS):
            c = mc[k]
            first = (
                f"<td rowspan=3>{html.escape(str(row[label]))}</td><td rowspan=3>{ex.true_kl:.4g}</td>"
                if i == 0
                else ""
            )
            pb = pub[k] if pub else None
            body.append(
                f"<tr>{first}<td><b>{k}</b></td>"
                f"<td>{format_mc(c['bias_rel'], c['se_bias_rel'], signed=True)}</td><td>{_fmt(ex.bias_rel(k))}</td>"
                f"<td>{'' if pb is None else pb[0]}</td>"
                f"<td>{format_mc(c['std_rel'], c['se_std_rel'])}</td><td>{_fmt(ex.std_rel(k))}</td>"
                f"<td>{'' if pb is None else pb[1]}</td></tr>"
            )
    pad = " style='padding:2px 8px'"
    return (
        "<table class='klviz-table' style='border-collapse:collapse;font-size:90%'>"
        + (head + "".join(body)).replace("<td>", f"<td{pad}>").replace("<th>", f"<th{pad}>")
        + "</table>"
    )


def _normal_cdf(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def k1_negative_probability(mu_q: float, sigma_q: float, mu_p: float, sigma_p: float) -> float:
    """Exact P_{x~q}(k1 < 0) = P(log r > 0) = P(p(x) > q(x)) for two Gaussians.

    With log r = a + b z + c z² this is the normal probability of an interval (or of its complement).
    For equal scales and mu_p > mu_q it is ``1 - Phi((mu_p - mu_q) / (2 sigma))``: close to one half
    for close policies, which is why k1 is negative for almost half of the samples.
    """
    mq, mp = _finite_float(mu_q, "mu_q"), _finite_float(mu_p, "mu_p")
    sq, sp = _positive_float(sigma_q, "sigma_q"), _positive_float(sigma_p, "sigma_p")
    a, b, c = _log_ratio_quadratic(mq, sq, mp, sp)
    if abs(c) < 1e-15:
        if b == 0:
            return 0.0  # log r = a is constant (equal distributions give a = 0: never > 0)
        z0 = -a / b
        return 1.0 - _normal_cdf(z0) if b > 0 else _normal_cdf(z0)
    disc = b * b - 4 * a * c
    if disc <= 0:
        return 1.0 if c > 0 else 0.0  # the quadratic never crosses zero: it keeps the sign of c
    root = math.sqrt(disc)
    z1, z2 = sorted(((-b - root) / (2 * c), (-b + root) / (2 * c)))
    inside = _normal_cdf(z2) - _normal_cdf(z1)
    return 1.0 - inside if c > 0 else inside


def variance_crossing_mu() -> float:
    """The mu where Var k1 = Var k3 for q = N(0,1), p = N(mu,1): mu² = t with e^t = 1 + 2t, t > 0.

    Var k1 = mu² and Var k3 = e^{mu²} - 1 - mu² are equal where e^t - 1 - 2t = 0; Newton's method
    from t = 2 (the function is convex with its positive root near 1.26). Beyond this mu, k1 has the
    smaller variance.
    """
    t = 2.0
    for _ in range(60):
        step = (math.expm1(t) - 2 * t) / (math.exp(t) - 2)
        t -= step
        if abs(step) < 1e-15:
            break
    return math.sqrt(t)


def sample_log_ratio(
    q: Normal, p: Normal, num_samples: int, *, generator: torch.Generator | None = None, z: torch.Tensor | None = None
) -> torch.Tensor:
    """``num_samples`` values of log r = log p(x) - log q(x) with x ~ q, in float64 (two Normals).

    Draws z ~ N(0, 1) from ``generator`` (on its device) and evaluates log r as the quadratic
    a + b z + c z² of x = mu_q + sigma_q z: the same numbers as ``p.log_prob(x) - q.log_prob(x)``
    in a third of the operations. ``z`` (float64, ``num_samples`` values) gives the standard normal
    draws instead: a panel that keeps the draws of its seed moves p without drawing again.
    """
    n = check_positive_int(num_samples, "num_samples")
    if z is not None and (z.dtype != torch.float64 or z.shape != (n,)):
        raise ValueError(f"z must be a float64 tensor of {n} values, got {z.dtype} of shape {tuple(z.shape)}")
    for d, name in ((q, "q"), (p, "p")):
        if not isinstance(d, Normal) or d.batch_shape != torch.Size():
            raise ValueError(f"{name} must be a single torch.distributions.Normal")
    a, b, c = _log_ratio_quadratic(
        _finite_float(q.loc, "q.loc"),
        _positive_float(q.scale, "q.scale"),
        _finite_float(p.loc, "p.loc"),
        _positive_float(p.scale, "p.scale"),
    )
    dev = generator.device if generator is not None else q.loc.device
    if z is None:
        z = torch.randn(n, generator=generator, device=dev, dtype=torch.float64)
    return (c * z + b).mul_(z).add_(a) if c != 0.0 else (b * z).add_(a)


def control_variate_samples(
    q: Normal, p: Normal, num_samples: int, *, num_batches: int = 20, generator: torch.Generator | None = None
) -> dict[str, float]:
    """Measure the best coefficient of k1 + lambda (r - 1) from samples, with a batch-means SE.

    In each batch lambda*_b = -Cov(k1, r) / Var(r) from the sample moments; the result is the
    pooled estimate (all samples) with SE = spread of the batch values / sqrt(num_batches). Also
    returns the pooled sample ``var_k1``, ``var_r`` and ``cov_k1_r`` (so the whole variance curve
    Var k1 + 2 lambda Cov + lambda² Var r can be drawn from the same samples).
    """
    n = check_positive_int(num_samples, "num_samples")
    nb = check_positive_int(num_batches, "num_batches")
    if nb < 2 or n < 2 * nb:
        raise ValueError(f"num_batches must be ≥ 2 and num_samples ≥ 2 * num_batches; got {nb} and {n}")
    size = n // nb
    pooled = np.zeros(5)  # running sums of k1, r - 1, k1², (r - 1)², k1 (r - 1)
    lams = []
    for _ in range(nb):
        log_r = sample_log_ratio(q, p, size, generator=generator)
        a, c = k1(log_r), torch.expm1(log_r)
        sums = torch.stack([a.sum(), c.sum(), a.square().sum(), c.square().sum(), (a * c).sum()]).tolist()
        ma, mc = sums[0] / size, sums[1] / size
        vc = sums[3] / size - mc * mc
        lams.append(control_variate_lambda(sums[4] / size - ma * mc, vc))
        pooled += np.array(sums)
    total = size * nb
    ma, mc = pooled[0] / total, pooled[1] / total
    var_k1 = pooled[2] / total - ma * ma
    var_r = pooled[3] / total - mc * mc
    cov = pooled[4] / total - ma * mc
    return {
        "lambda_star": control_variate_lambda(cov, var_r),
        "se": batch_means_se(lams),
        "var_k1": var_k1,
        "var_r": var_r,
        "cov_k1_r": cov,
        "num_samples": total,
    }


def k1_negative_mass(q_probs: Any, p_probs: Any) -> float:
    """P_{x~q}(k1 < 0) = P_q(p(x) > q(x)) = the q-mass of the tokens the target likes more.

    The token counterpart of :func:`k1_negative_probability`: for two close Gaussians it is almost
    one half, on a token distribution it is whatever mass q puts on the tokens p favours (a push
    toward one rare token makes it small). Log-ratios within rounding of 0 in the inputs' dtype
    (:func:`klviz.divergences.log_ratio_tolerance`) do not count: at p = q it is 0, not a coin flip.
    """
    q = as_float_tensor(q_probs, "q_probs")
    p = as_float_tensor(p_probs, "p_probs")
    if q.shape != p.shape or q.dim() != 1:
        raise ValueError(
            f"q_probs and p_probs must be probability vectors of one shape, got {tuple(q.shape)} and {tuple(p.shape)}"
        )
    return float(q.double()[target_favours(q, p)].sum())  # p > q beyond rounding in the inputs' dtype


def k2_bias_series(q_probs: Any, p_probs: Any, max_order: int = 10) -> dict[str, Any]:
    """k2's exact bias E_q[k2] - KL(q||p) on a token distribution, beside its series in u = log r.

    ``E_q[e^u] = E_q[r] = 1`` expands to ``E[u] + E[u²]/2 + E[u³]/6 + ... = 0``, and KL(q||p) = -E[u], so

        E_q[k2] - KL = E[u²]/2 + E[u] = -E[u³]/3! - E[u⁴]/4! - E[u⁵]/5! - ...

    exactly (p must be positive wherever q is, and put no mass where q has none). Returns ``true_kl``,
    ``mean_k2``, ``bias`` (exact, by summing over the vocabulary), ``orders`` (3..max_order),
    ``terms`` (-E[u^n]/n! for each order), ``partial`` (their running sums, which converge to
    ``bias``), the central ``skewness`` of u, and ``third_central`` = E[(u - E u)³], whose sign sets
    the sign of the leading term when p is close to q (E[u] = -KL is then of second order).
    """
    check_positive_int(max_order, "max_order")
    if max_order < 3:
        raise ValueError(f"max_order must be at least 3 (the series starts at the cube), got {max_order}")
    q = as_float_tensor(q_probs, "q_probs").to(torch.float64)
    p = as_float_tensor(p_probs, "p_probs").to(torch.float64)
    true_kl = float(categorical_kl(q, p))  # validates shapes and normalisation
    support = q > 0
    if bool((p[support] <= 0).any()):
        raise ValueError("p_probs is zero on a token that q_probs can sample: KL(q||p) is infinite")
    if abs(float(p[support].sum()) - 1.0) > 1e-9:
        raise ValueError("p_probs puts mass where q_probs has none: E_q[r] < 1 and the series does not apply")
    w, u = q[support], torch.log(p[support]) - torch.log(q[support])
    orders = np.arange(3, int(max_order) + 1)
    terms = np.array([-float((w * u ** int(n)).sum()) / math.factorial(int(n)) for n in orders])
    mean_k2 = float((w * 0.5 * u * u).sum())
    m1 = float((w * u).sum())
    c2 = float((w * (u - m1) ** 2).sum())
    c3 = float((w * (u - m1) ** 3).sum())
    return {
        "true_kl": true_kl,
        "mean_k2": mean_k2,
        "bias": mean_k2 - true_kl,
        "orders": orders,
        "terms": terms,
        "partial": np.cumsum(terms),
        "third_central": c3,
        "skewness": c3 / c2**1.5 if c2 > 0 else 0.0,
    }


def _rule(bias: float, true_kl: float, e3: float, bound: float) -> dict[str, Any]:
    third = -e3 / 6
    decided = abs(third) > bound
    return {
        "true_kl": true_kl,
        "bias": bias,
        "third_order": third,
        "bound": bound,
        "decided": decided,
        "predicted_sign": int(math.copysign(1, third)) if decided else 0,
    }


def k2_bias_rule(q_probs: Any, p_probs: Any) -> dict[str, Any]:
    """The third-moment rule for the sign of k2's bias, on a token distribution (exact sums, float64).

    With u = log r: ``E_q[k2] - KL(q||p) = -E[u³]/6 - E[u⁴]/24 - ...`` (:func:`k2_bias_series`), and the
    Taylor remainder after the cubic term is at most ``E_q[u⁴ max(1, r)]/24`` (``e^u - 1 - u - u²/2 - u³/6
    = e^ξ u⁴/24`` with ξ between 0 and u). So where ``|E[u³]|/6`` exceeds that bound the bias has the sign of
    ``-E[u³]``; elsewhere the rule does not decide. Returns ``true_kl``, ``bias``, ``third_order``
    (``-E[u³]/6``), ``bound``, ``decided`` and ``predicted_sign`` (+1, -1, or 0 when undecided).
    """
    q = as_float_tensor(q_probs, "q_probs").to(torch.float64)
    p = as_float_tensor(p_probs, "p_probs").to(torch.float64)
    true_kl = float(categorical_kl(q, p))
    support = q > 0
    if bool((p[support] <= 0).any()):
        raise ValueError("p_probs is zero on a token that q_probs can sample: KL(q||p) is infinite")
    w, u = q[support], torch.log(p[support]) - torch.log(q[support])
    bias = float((w * k2(u)).sum()) - true_kl
    e3 = float((w * u**3).sum())
    bound = float((w * u**4 * torch.clamp(u.exp(), min=1.0)).sum()) / 24
    return _rule(bias, true_kl, e3, bound)


def gaussian_k2_bias_rule(mu_q: float, sigma_q: float, mu_p: float, sigma_p: float) -> dict[str, Any]:
    """:func:`k2_bias_rule` for x ~ q = N(mu_q, sigma_q²), p = N(mu_p, sigma_p²): the bias and E[u³] in closed
    form (:func:`gaussian_moments`, u a quadratic in a standard normal), the bound by the trapezoid rule."""
    mq, mp = _finite_float(mu_q, "mu_q"), _finite_float(mu_p, "mu_p")
    sq, sp = _positive_float(sigma_q, "sigma_q"), _positive_float(sigma_p, "sigma_p")
    moments = gaussian_moments(mq, sq, mp, sp)
    poly = np.array(_log_ratio_quadratic(mq, sq, mp, sp))
    e3 = _poly_mean(np.convolve(np.convolve(poly, poly), poly))
    lo, hi = min(mq - 16 * sq, mp - 16 * sp), max(mq + 16 * sq, mp + 16 * sp)
    x = torch.linspace(lo, hi, 40_001, dtype=torch.float64)
    log_q = Normal(torch.tensor(mq, dtype=torch.float64), torch.tensor(sq, dtype=torch.float64)).log_prob(x)
    log_p = Normal(torch.tensor(mp, dtype=torch.float64), torch.tensor(sp, dtype=torch.float64)).log_prob(x)
    u = log_p - log_q
    bound = float(torch.trapezoid(log_q.exp() * u**4 * torch.clamp(u.exp(), min=1.0), x)) / 24
    return _rule(moments.bias("k2"), moments.true_kl, e3, bound)


def k3_variance_parts(q_probs: Any, p_probs: Any) -> dict[str, float]:
    """Var k3 = Var r + Var log r - 2 Cov(r, log r) on a token distribution, each piece by enumeration.

    k3 = (r - 1) - log r, so its variance is that of r, plus that of log r (= Var k1), minus twice
    their covariance, Cov(r, log r) = KL(q||p) + KL(p||q). Near p = q, r - 1 ≈ log r and the three
    pieces nearly cancel: what is left is of the size of the KL itself.
    """
    q = as_float_tensor(q_probs, "q_probs").to(torch.float64)
    p = as_float_tensor(p_probs, "p_probs").to(torch.float64)
    categorical_kl(q, p)  # validates
    support = q > 0
    w, u = q[support], torch.log(p[support]) - torch.log(q[support])
    r = u.exp()

    def cov(a: torch.Tensor, b: torch.Tensor) -> float:
        return float((w * (a - (w * a).sum()) * (b - (w * b).sum())).sum())

    k3v = torch.expm1(u) - u
    return {"var_r": cov(r, r), "var_log_r": cov(u, u), "cov_r_log_r": cov(r, u), "var_k3": cov(k3v, k3v)}
