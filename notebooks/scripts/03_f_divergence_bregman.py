# Generated from notebooks/03_f_divergence_bregman.ipynb by `make sync-notebooks`: edit the notebook, not this file.

# %% [markdown]
# # 03 · f-divergences and Bregman: why k3 is never negative
#
# $k_1 = -\log r$ is negative for every token that the target likes more than the sampler does. $k_3 = (r-1)-\log r$
# has the same mean and is never negative. This lesson shows why, with one picture: $k_3$ is the vertical gap
# between the convex curve $-\log t$ and its tangent at $t = 1$. The same construction gives a non-negative
# estimator of the *other* KL direction, and of any f-divergence, from the same samples.
#
# **What you will learn**
# - $\mathbb{E}_q[r] = 1$, and why that lets you add $c\,(r-1)$ to any estimator for free (and when it fails);
# - f-divergences $D_f(p\,\|\,q) = \mathbb{E}_q[f(r)]$; both KL directions as f-divergences ($t\log t$ and $-\log t$);
# - $k_2$'s generator $\tfrac12(\log t)^2$ is not convex (it bends the wrong way beyond $t = e$), so $\mathbb{E}[k_2]$
#   is not an f-divergence, yet it matches KL to second order;
# - the Bregman recipe $f(r) - f'(1)(r-1)$: $k_3$ for $\mathrm{KL}(q\,\|\,p)$, $r\log r - (r-1)$ for $\mathrm{KL}(p\,\|\,q)$.
#
# **Time**: about 35 minutes of reading (prose and code), plus the panel and three exercises.
# **Runs in**: about 10 s on a 2-core CPU (measured under nbval).
#
# Notation as in every lesson: tokens $x \sim q$ (the **sampler**), $p$ the **target**, $r = p(x)/q(x)$,
# `log_r = log p(x) - log q(x)`. $k_1, k_2, k_3$ estimate $\mathrm{KL}(q\,\|\,p)$ (lesson 00's rule, which this lesson
# extends: the same samples can estimate the other direction too).

# %%
import klviz
device = klviz.setup_notebook()

# %%
import math

import numpy as np
import torch
from IPython.display import display
from torch.distributions import Normal

from klviz.fdiv import (GENERATORS, bregman_gap, expected_ratio, f_divergence, f_second, f_value,
                        tangent_at_one)
from klviz.plotting import COLORS, new_figure
from klviz.policies import move_policy, toy_sampler_logits
from klviz.sampling import draw_tokens
from klviz.statistics import mean_se, plus_minus   # (mean, its SE s / sqrt(N)); "mean ± 2 SE (2 SE)"

# %% [markdown]
# ## 1. $\mathbb{E}_q[r] = 1$
#
# **Question.** Why can $k_3$ add $r - 1$ to $k_1$ without changing its mean?
#
# **Math.** Whenever $q(x) > 0$ wherever $p(x) > 0$,
# $$\mathbb{E}_{x\sim q}[r] = \sum_x q(x)\,\frac{p(x)}{q(x)} = \sum_x p(x) = 1, \qquad\text{so}\qquad \mathbb{E}_q[r - 1] = 0.$$
# Any multiple $c\,(r-1)$ is a zero-mean term (a *control variate*): it changes each sample, not the average.
#
# **Code.** The twelve-token policies of lesson 01, and Gaussians $q = \mathcal N(0,1)$, $p = \mathcal N(1, 1)$
# (there $r = e^{x - 1/2}$ and $\mathrm{Var}_q[r] = e - 1$).

# %%
log_q = torch.log_softmax(toy_sampler_logits().double(), -1)   # float64, normalised: exact checks to 1e-12
log_p = move_policy(log_q, temperature=1.5, push=1.0, push_token=1)
q, p = log_q.exp(), log_p.exp()

N = 200_000              # samples; more: slower, tighter
tok = draw_tokens(q, N, generator=klviz.make_generator(0))
r_tok = torch.exp(log_p - log_q).double()[tok]
m_tok, se_tok = mean_se(r_tok)
print(f"tokens:    E_q[r] exact {float(expected_ratio(q, p)):.6f}, sampled {plus_minus(m_tok, se_tok, '.4f')}")

gq, gp = Normal(0.0, 1.0), Normal(1.0, 1.0)
x = torch.randn(N, generator=klviz.make_generator(1), dtype=torch.float64)
r_gauss = torch.exp(gp.log_prob(x) - gq.log_prob(x))
m_g, se_g = mean_se(r_gauss)
print(f"Gaussians: E_q[r] = 1 exactly, sampled {plus_minus(m_g, se_g, '.4f')}; "
      f"std of r {float(r_gauss.std()):.3f} (exact sqrt(e - 1) = {math.sqrt(math.e - 1):.3f})")

# %%
assert abs(float(expected_ratio(q, p)) - 1) < 1e-12
assert abs(m_tok - 1) < 4 * se_tok and abs(m_g - 1) < 4 * se_g

# %% [markdown]
# **When it fails: the sampler must cover the target.** If the tokens come from a *truncated* sampler (top-k or
# top-p decoding) while $p$ is the full reference distribution, the sum runs only over the sampler's support $S$:
# $\mathbb{E}_q[r] = p(S) < 1$. Then $\mathbb{E}_q[k_3] = \mathrm{KL}(q\,\|\,p) + p(S) - 1$: $k_3$ is biased low
# by the reference's mass outside $S$ (and $\mathbb{E}_q[k_1]$ is still exactly $\mathrm{KL}(q\,\|\,p)$ for this truncated
# $q$) ([checked on 2,000 random token pairs](claims.md#truncated-sampler)). By enumeration, top-6 sampling from $q$. (In practice the trainer usually recomputes log-probabilities with
# the full policy rather than the truncated sampler: that is the off-policy situation of lesson 01, with its own fix.)

# %%
top = torch.topk(q, 6).indices
q_top = torch.zeros_like(q)
q_top[top] = q[top] / q[top].sum()                       # the sampler actually used (top-6)
support = q_top > 0
log_r_top = torch.log(p[support]) - torch.log(q_top[support])
e_r = float(expected_ratio(q_top, p))
e_k3 = float((q_top[support] * klviz.k3(log_r_top)).sum())
e_k1 = float((q_top[support] * klviz.k1(log_r_top)).sum())
kl_top = float(klviz.categorical_kl(q_top, p))
print(f"E_q[r] = p(S) = {e_r:.4f};  E_q[k3] = {e_k3:.4f}, E_q[k1] = {e_k1:.4f}  vs  KL(q_top || p) = {kl_top:.4f}")

# %%
assert abs(e_r - float(p[top].sum())) < 1e-12
assert abs(e_k3 - (kl_top + e_r - 1)) < 1e-12
assert abs(e_k1 - kl_top) < 1e-12     # k1 stays unbiased

# %% [markdown]
# **The other way to break it: the ratio upside down.** A widely shared explanation of `low_var_kl` defines $r = q/p$ while sampling from $q$,
# then uses $k_3 = (r - 1) - \log r$. With that ratio the correction no longer has mean zero:
# $\mathbb{E}_q[q/p] = 1 + \chi^2(q\,\|\,p)$, so the "estimator" averages to $\chi^2(q\,\|\,p) - \mathrm{KL}(q\,\|\,p)$ ([checked on 2,000 random token pairs](claims.md#direction-rule-scope)).
# For $q = \mathcal N(0,1)$, $p = \mathcal N(\mu,1)$ that is $e^{\mu^2} - 1 - \mu^2/2$ instead of $\mu^2/2$:
# barely off at $\mu = 0.1$ (lost in the noise of any real batch), far too high at $\mu = 1$.

# %%
inv = (log_q - log_p).double()                                        # log(q/p): the inverted log-ratio
e_inverted_k3 = float((q * klviz.k3(inv)).sum())
chi2_qp = float(f_divergence("chi2", p, q))                           # chi^2(q||p) = E_p[(q/p - 1)^2]
kl_qp_tok = float(klviz.categorical_kl(q, p))
print(f"tokens: E_q[k3 with r = q/p] = {e_inverted_k3:.4f}; chi2(q||p) - KL(q||p) = {chi2_qp - kl_qp_tok:.4f}; "
      f"KL(q||p) = {kl_qp_tok:.4f}")
inverted = {}
for mu in (0.1, 1.0):
    wrong, right = math.exp(mu ** 2) - 1 - mu ** 2 / 2, mu ** 2 / 2
    # check the closed form by sampling: k3 with the inverted ratio, x ~ q = N(0, 1)
    xs = torch.randn(N, generator=klviz.make_generator(3), dtype=torch.float64)
    inverted[mu] = (*mean_se(klviz.k3(Normal(0.0, 1.0).log_prob(xs) - Normal(mu, 1.0).log_prob(xs))), wrong)
    print(f"Gaussians, mu = {mu}: inverted-ratio k3 averages {plus_minus(*inverted[mu][:2], '.5f')} "
          f"(closed form {wrong:.5f}); KL = {right:.5f}; {100 * (wrong / right - 1):.1f}% too high")

# %%
assert abs(e_inverted_k3 - (chi2_qp - kl_qp_tok)) < 1e-12
for m, se, wrong in inverted.values():
    assert abs(m - wrong) < 4 * se

# %% [markdown]
# ## 2. f-divergences: both KLs from one family
#
# **Definition.** For a convex $f$ with $f(1) = 0$, the f-divergence of $p$ from $q$ is
# $$D_f(p\,\|\,q) = \mathbb{E}_{x\sim q}\!\left[f\!\left(\frac{p(x)}{q(x)}\right)\right] = \sum_x q(x)\, f(r(x)).$$
# By Jensen's inequality $D_f \ge f(\mathbb{E}_q[r]) = f(1) = 0$.
#
# | generator $f(t)$ | $D_f(p\,\|\,q) = \mathbb{E}_q[f(r)]$ | check |
# |---|---|---|
# | $t\log t$ | $\sum_x p\log\frac{p}{q} = \mathrm{KL}(p\,\|\,q)$ | $q\cdot\frac pq\log\frac pq = p\log\frac pq$ |
# | $-\log t$ | $\sum_x q\log\frac{q}{p} = \mathrm{KL}(q\,\|\,p)$ | what $k_1$ averages |
# | $t - 1 - \log t$ | $\mathrm{KL}(q\,\|\,p)$ again | adds $(t - 1)$, mean zero: what $k_3$ averages |
#
# Notice the direction: the sampler $q$ is always the one outside the ratio; $f$ decides which KL you get.
# `f_divergence(f, q, p)` sums $\sum_x q(x) f(p(x)/q(x))$; compare with the direct KL sums:

# %%
kl_qp, kl_pq = float(klviz.categorical_kl(q, p)), float(klviz.categorical_kl(p, q))
df_minus_log, df_tlogt = float(f_divergence("-log t", q, p)), float(f_divergence("t log t", q, p))
print(f"KL(q||p) = {kl_qp:.6f}   D_f with f = -log t  : {df_minus_log:.6f}")
print(f"KL(p||q) = {kl_pq:.6f}   D_f with f = t log t : {df_tlogt:.6f}")

# adding c (t - 1) to f leaves D_f unchanged, for any c; the per-sample values change
log_r = (log_p - log_q).double()
r = log_r.exp()
shifted = {}
for c in (-2.0, -1.0, 0.5, 1.0, 3.0):
    shifted[c] = float((q * (-log_r + c * (r - 1))).sum())
    spread = float(torch.sqrt((q * (-log_r + c * (r - 1) - shifted[c]) ** 2).sum()))
    print(f"c = {c:+.1f}: E_q[-log r + c (r - 1)] = {shifted[c]:.6f}, std of one sample {spread:.4f}")

# which c gives the smallest spread? (exact, by enumeration on a fine grid), against the bound for close policies
cs = np.linspace(-1.0, 3.0, 401)
spreads = [float(torch.sqrt((q * (-log_r + c * (r - 1)) ** 2).sum() - kl_qp ** 2)) for c in cs]
c_best = float(cs[int(np.argmin(spreads))])
delta = float(log_r.abs().max())
print(f"smallest spread at c = {c_best:.2f}; at c = 1 (k3) the spread is {spreads[200]:.4f} vs {min(spreads):.4f}; "
      f"largest |log r| {delta:.2f}, so the best c lies in [{delta / math.expm1(delta):.2f}, {delta / -math.expm1(-delta):.2f}]")

# %%
assert abs(df_minus_log - kl_qp) < 1e-12 and abs(df_tlogt - kl_pq) < 1e-12
assert all(abs(v - kl_qp) < 1e-12 for v in shifted.values())
assert abs(c_best - 1.0) < 0.2 and abs(cs[200] - 1.0) < 1e-12
assert delta / math.expm1(delta) - 0.01 <= c_best <= delta / -math.expm1(-delta) + 0.01   # within the grid's step

# %% [markdown]
# The mean never moves; the spread does, and for close policies the best $c$ is near 1 ($k_3$): if $|\log r| \le \delta$
# on every token $q$ can draw, it lies between $\delta/(e^\delta - 1)$ and $\delta/(1 - e^{-\delta})$, 0.95 to 1.05 at
# $\delta = 0.1$ ([checked on 2,000 random token pairs](claims.md#lambda-star-near-one)) (lesson 02 finds the best $c$ exactly, as $\lambda^*$). The generators, side by side:

# %%
t = np.linspace(0.02, 4.0, 400)
lt = torch.from_numpy(np.log(t))
fig, (ax_l, ax_r) = new_figure(9.0, 3.3, ncols=2, sharey=True)
ax_l.plot(t, f_value("-log t", lt), color=COLORS["k1"], lw=1.8, label="−log t   (KL(q‖p))")
ax_l.plot(t, bregman_gap("-log t", lt), color=COLORS["k3"], lw=1.8, label="t − 1 − log t   (same D_f)")
ax_l.set_title("generators of KL(q‖p)")
ax_r.plot(t, f_value("t log t", lt), color=COLORS["p"], lw=1.8, label="t log t   (KL(p‖q))")
ax_r.plot(t, bregman_gap("t log t", lt), color=COLORS["mu"], lw=1.8, label="t log t − (t − 1)   (same D_f)")
ax_r.set_title("generators of KL(p‖q)")
for ax in (ax_l, ax_r):
    ax.axhline(0, color=COLORS["ink"], lw=0.6)
    ax.axvline(1, color=COLORS["q"], lw=0.6, ls=":")
    ax.set_xlabel("t = p/q")
    ax.set_ylim(-1.5, 3.5)
    ax.legend(loc="upper center")
ax_l.set_ylabel("f(t)")
display(fig)

# %% [markdown]
# **Takeaway.** The green and red curves touch zero at $t = 1$ and stay above it: those are the versions whose
# *every sample* is non-negative. Section 4 explains where they come from.
#
# ## 3. $k_2$: not an f-divergence, but close to KL
#
# $\mathbb{E}_q[k_2] = \mathbb{E}_q[\tfrac12(\log r)^2]$ has the form $\mathbb{E}_q[f(r)]$ with $f(t) = \tfrac12(\log t)^2$.
# Schulman's note explains k2's low bias this way: "its expectation is an f-divergence", namely "the f-divergence where f(x) = ½(log x)²" (the passage that follows the definition of k2). That is loose, by the note's own definition, which asks for a convex $f$. Is this $f$ convex? Its curvature is
# $$f''(t) = \frac{1 - \log t}{t^2},$$
# positive for $t < e$ and **negative for $t > e$**. So $\mathbb{E}_q[k_2]$ is not an f-divergence in the strict sense. On a log axis the curve looks convex everywhere (it is a parabola in $\log t$); on a linear axis a chord between two ratios beyond $e$ lies *below* it, the mark of a concave stretch:

# %%
grid = np.linspace(0.05, 12.0, 600)                     # a linear t axis: on a log axis ½(log t)² looks convex
lg = torch.from_numpy(np.log(grid))
curv_k2 = f_second("k2", lg).numpy()
t_a, t_b = 3.0, 10.0                                       # two ratios beyond e (the merge example below)
f_a, f_b = (float(f_value("k2", torch.tensor(math.log(v), dtype=torch.float64))) for v in (t_a, t_b))
fig, (ax_l, ax_r) = new_figure(10.0, 3.6, ncols=2)
for name, colour, label in (("k2", COLORS["k2"], "½(log t)²  (k2)"), ("-log t", COLORS["k1"], "−log t"),
                            ("t log t", COLORS["p"], "t log t")):
    ax_l.plot(grid, f_value(name, lg), color=colour, lw=1.8, label=label)
    ax_r.plot(grid, f_second(name, lg), color=colour, lw=1.8, label=f"f″ of {label}")
ax_l.plot([t_a, t_b], [f_a, f_b], color=COLORS["ink"], lw=1.4, ls="--", marker="o", ms=4,
          label=f"chord from t = {t_a:g} to {t_b:g}: below the curve")
for ax in (ax_l, ax_r):
    ax.axvspan(math.e, grid[-1], color=COLORS["mu"], alpha=0.08, lw=0)
    ax.axhline(0, color=COLORS["ink"], lw=0.6)
    ax.set_xlabel("t = p/q")
    ax.set_xlim(0, grid[-1])
ax_l.legend(loc="upper left")
ax_r.legend(loc="upper right")
ax_l.set_ylim(-1.5, 4)
ax_l.set_ylabel("f(t)")
ax_l.set_title("generators on a linear axis (shaded: t > e)")
ax_r.set_ylim(-0.1, 1.5)
i_min = int(np.argmin(curv_k2))
ax_r.annotate(f"k2's f″ < 0 beyond e\n(lowest {curv_k2[i_min]:.3f} at t = {grid[i_min]:.2f})",
              xy=(grid[i_min], curv_k2[i_min]), xytext=(5.0, 0.45), color=COLORS["k2"],
              arrowprops=dict(arrowstyle="->", color=COLORS["k2"]))
ax_r.set_ylabel("f″(t)")
ax_r.set_title("curvature: k2's turns negative at t = e")
display(fig)

# %%
assert bool((curv_k2[grid > math.e] < 0).all()) and bool((curv_k2[grid < math.e] > 0).all())
for name in ("k2", "-log t", "t log t"):                  # all three have f''(1) = 1
    assert abs(float(f_second(name, torch.zeros((), dtype=torch.float64))) - 1.0) < 1e-12
# the chord lies below the curve between 3 and 10: concave there, so not an f-divergence generator
mid = torch.from_numpy(np.log(np.linspace(t_a, t_b, 50)[1:-1]))
chord = f_a + (np.exp(mid.numpy()) - t_a) * (f_b - f_a) / (t_b - t_a)
assert bool((f_value("k2", mid).numpy() > chord).all())


# %% [markdown]
# **Why $k_2$ is still close to KL.** Expand any smooth $f$ with $f(1) = 0$ around $t = 1$:
# $f(r) = f'(1)(r-1) + \tfrac12 f''(1)(r-1)^2 + O((r-1)^3)$. The first term has mean zero, so
# $$\mathbb{E}_q[f(r)] \approx \tfrac12 f''(1)\,\mathbb{E}_q[(r-1)^2] = \tfrac12 f''(1)\,\chi^2(p\,\|\,q).$$
# All three generators have $f''(1) = 1$: for close policies $\mathbb{E}[k_2]$, $\mathrm{KL}(q\,\|\,p)$ and
# $\mathrm{KL}(p\,\|\,q)$ all equal $\tfrac12\chi^2$ to second order: if $|\log r| \le \delta \le 1$ on every token $q$ can draw,
# each lies within a factor $1 \pm 1.5\,\delta$ of $\tfrac12\chi^2(p\,\|\,q)$ ([checked on 1,280 random token pairs](claims.md#second-order-match)). They part at third order.
#
# **How close, as the policies separate?** For $q = \mathcal N(0,1)$, $p = \mathcal N(\mu, 1)$ the closed forms are
# $\mathrm{KL} = \mu^2/2$ and $\mathbb{E}[k_2] = \mu^2/2 + \mu^4/8$, a relative gap of $\mu^2/4$ (0.25% at $\mu = 0.1$).
# The cell checks the closed form of $\mathbb{E}[k_2]$ by numerical integration, then does the same comparison
# on the twelve tokens by exact enumeration, pushing " sofa" further and further.

# %%
def expected_k2_gaussian_numeric(mu):
    # E_q[½ (log r)²] for q = N(0,1), p = N(mu,1), by the trapezoid rule on a wide grid
    xs = torch.linspace(-12.0, 12.0, 200_001, dtype=torch.float64)
    log_r = Normal(mu, 1.0).log_prob(xs) - Normal(0.0, 1.0).log_prob(xs)
    return float(torch.trapezoid(Normal(0.0, 1.0).log_prob(xs).exp() * 0.5 * log_r ** 2, xs))

mus = np.linspace(0.02, 2.0, 60)
kl_g = mus ** 2 / 2
k2_g = mus ** 2 / 2 + mus ** 4 / 8
numeric = {}
for mu in (0.1, 1.0, 2.0):
    numeric[mu] = expected_k2_gaussian_numeric(mu)
    closed = mu ** 2 / 2 + mu ** 4 / 8
    print(f"mu = {mu}: E[k2] closed form {closed:.6f}, numerical {numeric[mu]:.6f}, "
          f"KL {float(klviz.gaussian_kl(0.0, 1.0, mu, 1.0)):.6f}, relative gap {(closed - mu**2 / 2) / (mu**2 / 2):.4f}")

pushes = np.linspace(0.0, 5.0, 60)
kl_tok, k2_tok, third_tok = [], [], []
for s in pushes:
    lp = move_policy(log_q, push=float(s), push_token=1)
    kl_tok.append(float(f_divergence("-log t", q, lp.exp())))
    k2_tok.append(float(f_divergence("k2", q, lp.exp())))
    third_tok.append(-float((q * (lp - log_q) ** 3).sum()) / 6)      # the third-order term, -E[u^3]/6
kl_tok, k2_tok, third_tok = np.array(kl_tok), np.array(k2_tok), np.array(third_tok)

gap_tok = k2_tok - kl_tok
fig, (ax_l, ax_r) = new_figure(10.0, 3.6, ncols=2)
ax_l.plot(mus, kl_g, color=COLORS["exact"], lw=1.8, label="KL(q‖p) = μ²/2")
ax_l.plot(mus, k2_g, color=COLORS["k2"], lw=1.8, ls="--", label="E[k2] = μ²/2 + μ⁴/8")
ax_l.set_xlabel("μ  (p = N(μ, 1), q = N(0, 1))")
ax_l.set_ylabel("nats")
ax_l.set_title("Gaussians, equal variances: closed forms")
ax_l.legend()
safe_kl = np.where(kl_tok > 0, kl_tok, np.nan)
rel_tok = gap_tok / safe_kl                                          # relative: the dip is visible at every scale
ax_r.plot(pushes, rel_tok, color=COLORS["k2"], lw=1.8, label="twelve tokens: (E_q[k2] − KL) / KL, exact sums")
ax_r.plot(pushes, third_tok / safe_kl, color=COLORS["k1"], lw=1.2, ls=":", label="its third-order term −E[u³]/6 / KL")
ax_r.axhline(0, color=COLORS["ink"], lw=0.6)
ax_r.fill_between(pushes, rel_tok, 0, where=rel_tok < 0, color=COLORS["k2"], alpha=0.2, lw=0,
                  label="below zero: k2 underestimates")
ax_r.set_ylim(-0.25, 1.0)
ax_r.set_xlabel("push on ' sofa' (logit added in p)")
ax_r.set_ylabel("(E[k2] − KL) / KL")
ax_r.set_title("tokens: the gap dips below zero first")
ax_r.legend(loc="upper left", fontsize=8)
display(fig)
cross = float(pushes[1:][(gap_tok[1:] > 0) & (gap_tok[:-1] <= 0)][0])
cross_third = float(pushes[1:][(third_tok[1:] > 0) & (third_tok[:-1] <= 0)][0])
lp1 = move_policy(log_q, push=1.0, push_token=1).exp()                 # a push of 1 (lesson 00's default)
rel_at_1 = float(f_divergence("k2", q, lp1) / f_divergence("-log t", q, lp1)) - 1
print(f"tokens: largest undershoot {gap_tok.min():.4f} at push {pushes[gap_tok.argmin()]:.2f}; "
      f"overshoot {gap_tok[-1]:.4f} at push {pushes[-1]:.1f}")
print(f"E[k2] - KL < 0 for every push up to {cross:.2f} (E[u^3] changes sign at {cross_third:.2f}); "
      f"bias/true {rel_at_1:+.3f} at a push of 1")

# %%
for mu, value in numeric.items():
    assert abs(value - (mu ** 2 / 2 + mu ** 4 / 8)) < 1e-8
assert abs((0.1 ** 4 / 8) / (0.1 ** 2 / 2) - 0.0025) < 1e-15
assert gap_tok.min() < 0 and 1.0 < pushes[gap_tok.argmin()] < 3.0 and gap_tok[-1] > 0
assert np.all(k2_g >= kl_g)                                      # the equal-variance Gaussian pair: always an overshoot
assert np.all(gap_tok[1:][pushes[1:] < cross - 0.1] < 0) and 2.0 < cross < 5.0
assert cross_third < cross                                       # the third moment turns first, the fourth order follows
assert round(rel_at_1, 3) == -0.146 and np.nanmax(rel_tok) < 1.0               # and the whole curve is in the plot

# %% [markdown]
# For the equal-variance Gaussians the curves coincide when close and $\mathbb{E}[k_2]$ overshoots far apart (the gap
# $\mu^4/8$ is of fourth order and positive: $\log r$ is symmetric there, and what is left is the pull of
# $\mathbb{E}[\log r] = -\mathrm{KL}$). On the tokens the gap is *negative* from the first push on, about −15 % of the KL at
# a push of 1 (−14.6 %, as in lesson 00's panel), and turns positive only for a large push (printed above). Its sign
# follows the third-order term $-\mathbb{E}_q[(\log r)^3]/6$ (dotted) wherever that term dominates the rest (lesson 02
# states the rule, with its bound, and where it stops deciding) ([checked on 3,000 random token and Gaussian pairs](claims.md#k2-bias-sign)): a push up on a token
# with $q < \tfrac12$ makes $\mathbb{E}[(\log r)^3]$ positive, until the push is so large that the other tokens' loss
# dominates and it turns negative; the bias follows a little later.
#
# **What "not an f-divergence" costs: the data-processing inequality.** A true f-divergence cannot grow when you
# merge outcomes (coarse-grain the vocabulary): merging loses information. Merging two tokens replaces their two
# ratios by their weighted average, and for convex $f$ that cannot increase $\sum q f(r)$ ([checked on 2,000 random token pairs](claims.md#merging-cannot-grow-f-divergence)).
# For $\tfrac12(\log t)^2$ beyond $t = e$, where $f$ is concave, it can. Two tokens with ratios 3 and 10, merged into one:

# %%
q3 = torch.tensor([0.04, 0.04, 0.92], dtype=torch.float64)
p3 = torch.tensor([0.12, 0.40, 0.48], dtype=torch.float64)           # ratios 3, 10 and 0.52
def merge(v):                                                         # tokens 0 and 1 become one token
    return torch.stack([v[0] + v[1], v[2]])

merged = {}
for name in ("k2", "-log t", "t log t"):
    merged[name] = before, after = float(f_divergence(name, q3, p3)), float(f_divergence(name, merge(q3), merge(p3)))
    print(f"{name:>8}: before merging {before:.5f}, after {after:.5f}  ({'grows' if after > before else 'shrinks'})")

# %%
assert merged["k2"][1] > merged["k2"][0]
for name in ("-log t", "t log t"):
    assert merged[name][1] < merged[name][0]

# %% [markdown]
# **Takeaway.** $\mathbb{E}[k_2]$ is a second-order approximation of KL: good when $r$ stays near 1, biased from
# third order on, with the sign of $-\mathbb{E}_q[(\log r)^3]$ where that term dominates: *downward* for a push up on one
# token with $q < \tfrac12$, upward for the equal-variance Gaussian pair, a sharper $p$ or a pushed-down token. It is still
# a divergence in the weak sense ($\mathbb{E}[k_2] \ge 0$, and $= 0$ only at $p = q$), but it breaks the
# **data-processing inequality**: merging tokens can make it grow, once ratios exceed $e$.
#
# ## 4. The Bregman view: $k_3$ is a gap between a curve and a tangent
#
# **Intuition.** Draw the convex curve $\varphi(t) = -\log t$ and its tangent at $t = 1$, the line $-(t-1)$.
# A convex curve lies above every tangent, so the vertical gap between them at $t = r$ is never negative:
# $$-\log r - \bigl(-(r - 1)\bigr) = (r - 1) - \log r = k_3.$$
# That gap is the **Bregman divergence** $D_\varphi(r, 1) = \varphi(r) - \varphi(1) - \varphi'(1)(r - 1)$.
# Its mean is $\mathbb{E}_q[-\log r] = \mathrm{KL}(q\,\|\,p)$, because the tangent's mean $-\mathbb{E}_q[r - 1]$ is zero.
#
# **The recipe.** For any convex generator $f$ with $f(1) = 0$:
# $$\text{estimator} = f(r) - f'(1)\,(r - 1) \;\ge 0, \qquad \mathbb{E}_q[\cdot] = D_f(p\,\|\,q)$$
# ([checked on 2,000 random token pairs](claims.md#bregman-gap-nonnegative-unbiased)). With $f(t) = t\log t$, $f'(1) = 1$: $r\log r - (r - 1)$, a
# non-negative unbiased estimator of $\mathrm{KL}(p\,\|\,q)$, from the *same samples of q*. Here is the library's one copy
# of the recipe:

# %%
klviz.show_source(bregman_gap)

# %%
t = np.linspace(0.02, 4.0, 400)
lt = torch.from_numpy(np.log(t))
fig, axes = new_figure(9.0, 3.4, ncols=2)
for ax, name, rs in ((axes[0], "-log t", (0.3, 2.5)), (axes[1], "t log t", (0.2, 3.0))):
    ax.plot(t, f_value(name, lt), color=COLORS["k3"], lw=2, label=f"f(t) = {GENERATORS[name].formula}")
    ax.plot(t, tangent_at_one(name, lt), color=COLORS["exact"], ls="--", lw=1.2, label="tangent at t = 1")
    for i, rv in enumerate(rs):
        lr = torch.tensor(math.log(rv), dtype=torch.float64)
        top, bottom = float(f_value(name, lr)), float(tangent_at_one(name, lr))
        ax.plot([rv, rv], [bottom, top], color=COLORS["mu"], lw=3, label="gap = estimator" if i == 0 else None)
        ax.annotate(f"{float(bregman_gap(name, lr)):.3f}", (rv, bottom), xytext=(0, -5),
                    textcoords="offset points", color=COLORS["mu"], va="top", ha="center")
    ax.plot([1], [0], "o", color=COLORS["exact"], ms=5)
    ax.axhline(0, color=COLORS["ink"], lw=0.6)
    ax.set_xlabel("t = p/q")
    ax.legend(loc="upper center")
axes[0].set_ylim(-3.2, 3.2)
axes[0].set_ylabel("f(t)")
axes[0].set_title("k3: gap under −log t  (→ KL(q‖p))")
axes[1].set_ylim(-1.5, 5.0)
axes[1].set_title("r log r − (r − 1): gap under t log t  (→ KL(p‖q))")
display(fig)

# %% [markdown]
# **Verify on samples from q.** $q = \mathcal N(0, 1)$, $p = \mathcal N(0.5, 0.8^2)$: unequal widths, so the two
# directions differ. From one set of samples of $q$ we estimate both KLs, each with its plain version
# ($-\log r$ and $r\log r$) and its Bregman version, against the closed form `klviz.gaussian_kl`.

# %%
N_G = 400_000            # samples; more: slower, tighter (and more memory: 8 bytes each, in 7 arrays)
gq, gp = Normal(0.0, 1.0), Normal(0.5, 0.8)
x = torch.randn(N_G, generator=klviz.make_generator(2), dtype=torch.float64)      # x ~ q
log_r = gp.log_prob(x) - gq.log_prob(x)
r = log_r.exp()
exact = {"KL(q||p)": float(klviz.gaussian_kl(0.0, 1.0, 0.5, 0.8)),
         "KL(p||q)": float(klviz.gaussian_kl(0.5, 0.8, 0.0, 1.0))}
per_sample = {
    ("KL(q||p)", "k1 = -log r"): -log_r,
    ("KL(q||p)", "k3 = (r-1) - log r"): bregman_gap("-log t", log_r),
    ("KL(p||q)", "r log r"): r * log_r,
    ("KL(p||q)", "r log r - (r-1)"): bregman_gap("t log t", log_r),
}
print(f"{'target':<9} {'estimator':<19} {'mean':>9} {'± 2 SE':>8} {'exact':>8} {'std':>7} {'min':>8}")
stats = {}
for (target, name), v in per_sample.items():
    m, se = mean_se(v)
    stats[name] = (m, se, float(v.std()), float(v.min()), exact[target])
    print(f"{target:<9} {name:<19} {m:9.5f} {2 * se:8.5f} {exact[target]:8.5f} {float(v.std()):7.3f} {float(v.min()):8.3f}")

# %%
for m, se, _, _, want in stats.values():
    assert abs(m - want) < 4 * se                                 # all four are unbiased
assert torch.allclose(bregman_gap("-log t", log_r), klviz.k3(log_r), rtol=1e-12, atol=1e-15)  # the recipe is k3
assert stats["k3 = (r-1) - log r"][3] >= 0 and stats["r log r - (r-1)"][3] >= 0   # never negative
assert stats["k1 = -log r"][3] < 0 and stats["r log r"][3] < 0                    # the plain ones are
assert stats["k3 = (r-1) - log r"][2] < stats["k1 = -log r"][2]                   # and the gaps vary less here
assert stats["r log r - (r-1)"][2] < stats["r log r"][2]
del x, log_r, r, per_sample, v  # the samples: only their statistics are needed below


# %% [markdown]
# Both Bregman versions are unbiased, never negative, and here have the smaller spread. **Why near $r = 1$, and what
# "near" means.** Subtracting the tangent removes $f$'s first-order term around $r = 1$:
# $f(r) - f'(1)(r - 1) = \tfrac12 f''(1)(r-1)^2 + O((r-1)^3)$. The plain $f(r)$ has a per-sample spread of the size of
# $r - 1$ (the distance), the gap one of the size of $(r-1)^2$ (the divergence itself). For the two KL generators that
# is guaranteed while $|\log r| \le 1$ on every token $q$ can draw: the gap's spread is then at most 0.72 of the plain
# one's ([checked on 4,180 random token pairs](claims.md#gap-less-spread-near-one)). Beyond that the tangent is no longer a good control variate and the gap
# can be the noisier one (lesson 02: $k_3$ loses to $k_1$ beyond $\mu \approx 1.12$ for the Gaussian pair; the next cell
# shows the same for $\mathrm{KL}(p\,\|\,q)$ on tokens: when $p$ all but drops " sofa", the gap's spread is four times that
# of $r\log r$). A common reading says "both KLs are put in Bregman form to reduce variance": what the form always buys
# is **non-negativity** of every sample; lower variance is guaranteed only near $r = 1$.

# %%
def spreads(p_probs):
    # exact std of one sample of r log r and of its Bregman gap r log r - (r - 1), x ~ q (twelve tokens)
    lr = torch.log(p_probs) - log_q
    out = {}
    for name, v in (("plain", f_value("t log t", lr)), ("gap", bregman_gap("t log t", lr))):
        m = float((q * v).sum())
        out[name] = math.sqrt(float((q * (v - m) ** 2).sum()))
    return out, float(klviz.categorical_kl(p_probs, q))

for label, push in (("close: push 0.01 on sofa", 0.01), ("far: p drops sofa, push -6", -6.0)):
    s_, kl_pq_here = spreads(move_policy(log_q, push=push, push_token=1).exp())
    print(f"{label}: KL(p||q) {kl_pq_here:.4g}; std/true of r log r {s_['plain'] / kl_pq_here:.1f}, "
          f"of the gap {s_['gap'] / kl_pq_here:.2f}")
close_s, close_kl = spreads(move_policy(log_q, push=0.01, push_token=1).exp())
far_s, far_kl = spreads(move_policy(log_q, push=-6.0, push_token=1).exp())

# %%
assert close_s["gap"] < close_s["plain"] / 50          # near r = 1: the gap is far quieter
assert far_s["gap"] > 4 * far_s["plain"]               # far apart (p drops a token q likes): the gap is noisier


# %% [markdown]
# **KL is itself a Bregman divergence, between the two vectors.** Take the negative entropy
# $\varphi(v) = \sum_x v_x \log v_x$ on vectors $v$. Its Bregman divergence between $p$ and $q$ is
# $D_\varphi(p, q) = \varphi(p) - \varphi(q) - \langle\nabla\varphi(q), p - q\rangle = \sum_x p\log\frac pq - \sum_x (p - q)
# = \mathrm{KL}(p\,\|\,q)$ for two probability vectors. Coordinate by coordinate it is the scalar gap of $t\log t$
# times $q(x)$: $q(x)\,[r\log r - (r - 1)] = p\log\frac pq - p + q$. So $\sum_x q(x)[r\log r - (r - 1)]$, the
# exact mean of the per-sample estimator, *is* $D_\varphi(p, q)$ term by term; likewise $\sum_x q(x)\,k_3(x) =
# D_\varphi(q, p) = \mathrm{KL}(q\,\|\,p)$. Checked on the twelve tokens:

# %%
def neg_entropy(v):                 # phi(v) = sum_x v log v, on probability vectors
    return (v * v.log()).sum()


def bregman_vec(a, b):              # D_phi(a, b) = phi(a) - phi(b) - <grad phi(b), a - b>, grad phi(b) = log b + 1
    return float(neg_entropy(a) - neg_entropy(b) - ((b.log() + 1) * (a - b)).sum())


lr_tok = (log_p - log_q).double()
per_token_pq = q * bregman_gap("t log t", lr_tok)                  # q(x) [r log r - (r - 1)]
per_token_qp = q * klviz.k3(lr_tok)                                # q(x) k3(x)
print(f"D_phi(p, q) = {bregman_vec(p, q):.6f} = sum_x q [r log r - (r - 1)] = {float(per_token_pq.sum()):.6f} "
      f"= KL(p||q) = {kl_pq:.6f}")
print(f"D_phi(q, p) = {bregman_vec(q, p):.6f} = sum_x q k3 = {float(per_token_qp.sum()):.6f} = KL(q||p) = {kl_qp:.6f}")

# %%
assert abs(bregman_vec(p, q) - kl_pq) < 1e-12 and abs(float(per_token_pq.sum()) - kl_pq) < 1e-12
assert abs(bregman_vec(q, p) - kl_qp) < 1e-12 and abs(float(per_token_qp.sum()) - kl_qp) < 1e-12
assert torch.allclose(per_token_pq, p * (p / q).log() - p + q, rtol=1e-10, atol=1e-15)   # coordinate by coordinate

# %%
log_r_tok = (log_p - log_q).double()
print(f"{'f(t)':<12} {'f′(1)':>6} {'D_f exact':>10} {'E_q[gap]':>10}  estimator")
recipe = {}
for name, gen in GENERATORS.items():
    recipe[name] = d_f, mean_gap = float(f_divergence(name, q, p)), float((q * bregman_gap(name, log_r_tok)).sum())
    print(f"{gen.formula:<12} {gen.df1:>6.0f} {d_f:10.6f} {mean_gap:10.6f}  {gen.estimator_name}")

# %%
assert all(abs(d_f - mean_gap) < 1e-12 for d_f, mean_gap in recipe.values())

# %% [markdown]
# **In the frameworks.** verl's `low_var_kl`, TRL's GRPO `per_token_kl`, NeMo-RL's and OpenRLHF's `k3` are all this
# gap with $\varphi = -\log$ (`exp(ref - logp) - (ref - logp) - 1`, with `log_r = ref - logp`), up to their clamps; on
# tokens the current policy sampled they average to $\mathrm{KL}(\pi\,\|\,\pi_\text{ref})$. That is the first minibatch of a
# PPO/GRPO step: later minibatches score $\pi_\text{old}$'s tokens, and a ratio correction (lesson 01) brings the
# average back to $\mathrm{KL}(\pi\,\|\,\pi_\text{ref})$ ([checked on 2,000 random token pairs](claims.md#framework-k3-first-minibatch)). The common version with
# $r = q/p$ applies the recipe to the ratio upside down: its correction $r - 1$ no longer has mean zero, and its
# mean is $\chi^2(q\,\|\,p) - \mathrm{KL}(q\,\|\,p)$ (section 1; lesson 06 finds the same bug in real code).
#
# ## 5. The panel: drag r along the curve
#
# Choose a generator and move $r$ (log-scaled slider). Left: $f$, its tangent at $t = 1$, and the gap at $t = r$;
# right: the estimator for every $r$, with the plain $f(r)$ dotted when it differs (it goes negative), and the
# region where $f'' < 0$ shaded for $k_2$.
#
# Things to try:
# 1. $-\log t$: move $r$ below and above 1; the gap is always $\ge 0$ and the readout shows `klviz.k3` agreeing.
# 2. $t\log t$: the same for $\mathrm{KL}(p\,\|\,q)$; note which side of $r = 1$ grows fast for each direction.
# 3. $\tfrac12(\log t)^2$: the tangent is flat ($f'(1) = 0$); push $r$ beyond $e$ and watch the curve bend the
#    wrong way.

# %%
from klviz.widgets.lesson03 import BregmanPanel

panel = BregmanPanel(device)
panel

# %%
# the panel's gap is k3 for -log t and r log r - (r - 1) for t log t, and never negative for convex f
for f_name in ("-log t", "t log t", "chi2", "hellinger", "k2"):
    for r_value in (0.05, 0.5, 1.0, 2.0, 15.0):
        d = panel.set(f=f_name, r=r_value)
        assert panel.last_error is None and d["gap"] >= 0
d = panel.set(f="-log t", r=2.5)
assert abs(d["gap"] - d["k3"]) < 1e-12
d = panel.set(f="t log t", r=0.2)
assert abs(d["gap"] - (0.2 * math.log(0.2) - (0.2 - 1))) < 1e-12
panel.set(f="-log t", r=2.5);


# %% [markdown]
# ## Takeaways
#
# - $\mathbb{E}_q[r] = 1$ when the sampler covers the target, so $c\,(r - 1)$ is a free zero-mean correction. With
#   truncated sampling (top-k/top-p) it is not: $\mathbb{E}_q[r] = p(S) < 1$ and $k_3$ is biased low by $1 - p(S)$ ([checked on 2,000 random token pairs](claims.md#truncated-sampler)).
# - $D_f(p\,\|\,q) = \mathbb{E}_q[f(r)]$: $f = t\log t$ gives $\mathrm{KL}(p\,\|\,q)$, $f = -\log t$ gives
#   $\mathrm{KL}(q\,\|\,p)$. The sampler sits outside the ratio; $f$ picks the direction.
# - $k_2$'s $f = \tfrac12(\log t)^2$ has $f''(1) = 1$ (second-order match with both KLs) but $f'' < 0$ beyond $t = e$:
#   not an f-divergence (Schulman's note calls it one, loosely). $\mathbb{E}[k_2] \ge 0$ with equality only at $p = q$,
#   but it breaks the data-processing inequality (merging tokens can make it grow), and from third order on it is biased
#   with the sign of $-\mathbb{E}_q[(\log r)^3]$ where that term dominates (lesson 02): low for a push up on a token with
#   $q < \tfrac12$, high for a sharper $p$ or a pushed-down token.
# - Bregman recipe: $f(r) - f'(1)(r - 1)$ = gap between $f$ and its tangent at 1: non-negative, unbiased.
#   $-\log$ gives $k_3$; $t\log t$ gives $r\log r - (r - 1)$ for $\mathrm{KL}(p\,\|\,q)$. The form always buys
#   non-negativity; lower variance it guarantees only near $r = 1$ ($|\log r| \le 1$ on every token is enough),
#   because subtracting the tangent removes $f$'s first-order term.
# - KL is the Bregman divergence of negative entropy between the vectors $p$ and $q$; the per-token gaps weighted by
#   $q$ are its coordinates.
#
# ## Exercises
#
# **Exercise 1: the other direction.** `log_r = log p(x) - log q(x)` for tokens $x \sim q$. Return the
# per-sample, never-negative, unbiased estimator of $\mathrm{KL}(p\,\|\,q)$.

# %%
def kl_pq_estimator(log_r):
    ...

klviz.check.lesson03.kl_pq_estimator(kl_pq_estimator)


# %%
# solution: the gap under t log t, tangent slope f'(1) = 1
def kl_pq_estimator(log_r):
    r = torch.exp(log_r)
    return r * log_r - (r - 1)

assert klviz.check.lesson03.kl_pq_estimator(kl_pq_estimator)


# %% [markdown]
# **Exercise 2: where k2 bends the wrong way.** (a) Return $f''(t)$ for $f(t) = \tfrac12(\log t)^2$ (a tensor of
# $t$ values in, a tensor out). (b) Set `CONCAVE_FROM` to the ratio $t$ beyond which $f'' < 0$, to two decimals at
# least (a number such as 2.72, or an exact expression).

# %%
def k2_curvature(t):     # (a) f''(t) for f(t) = ½ (log t)², a tensor of t values in, a tensor out
    ...

CONCAVE_FROM = ...       # (b) the ratio t beyond which f'' < 0

display(klviz.check.lesson03.k2_curvature(k2_curvature))
klviz.check.lesson03.concave_from(CONCAVE_FROM)


# %%
# solution: f'(t) = log t / t, f''(t) = (1 - log t) / t^2, zero at log t = 1
def k2_curvature(t):
    return (1 - torch.log(t)) / t ** 2

CONCAVE_FROM = math.e

assert klviz.check.lesson03.k2_curvature(k2_curvature)
assert klviz.check.lesson03.concave_from(CONCAVE_FROM)


# %% [markdown]
# **Exercise 3: the general recipe.** Given any generator `f` and its derivative `df` (functions of a tensor
# `t`), return the Bregman estimator for samples with log-ratio `log_r`. The check also tries generators this
# lesson did not show.

# %%
def bregman_estimator(f, df, log_r):
    ...

klviz.check.lesson03.bregman_estimator(bregman_estimator)


# %%
# solution: curve minus its tangent at t = 1
def bregman_estimator(f, df, log_r):
    r = torch.exp(log_r)
    return f(r) - df(torch.ones_like(r)) * (r - 1)

assert klviz.check.lesson03.bregman_estimator(bregman_estimator)

# %% [markdown]
# ## References
#
# - J. Schulman, [Approximating KL Divergence](http://joschu.net/blog/kl-approx.html) (2020): $k_3$ as a
#   control variate and as a Bregman divergence; $r\log r - (r-1)$ for the other direction.
# - I. Csiszár, "Information-type measures of difference of probability distributions and indirect observations",
#   *Studia Sci. Math. Hungarica* 2 (1967); S. M. Ali and S. D. Silvey, *J. Royal Stat. Soc. B* 28 (1966):
#   f-divergences. Overview: [f-divergence (Wikipedia)](https://en.wikipedia.org/wiki/F-divergence).
# - L. M. Bregman, *USSR Comput. Math. and Math. Physics* 7 (1967): the divergence named after him.
#   Overview: [Bregman divergence (Wikipedia)](https://en.wikipedia.org/wiki/Bregman_divergence).
# - verl [`kl_penalty` (`low_var_kl`)](https://github.com/volcengine/verl/blob/main/verl/trainer/ppo/core_algos.py);
#   TRL [GRPO trainer](https://github.com/huggingface/trl/blob/main/trl/trainer/grpo_trainer.py) (`per_token_kl`).
# - Y. Liu et al., [Rethinking KL Regularization in RLHF](https://arxiv.org/abs/2510.01555) (2025): the gradient
#   view of the same estimators (lesson 05).
# - Previous: lesson 01 (sampling as weighting), lesson 02 (k1, k2, k3 measured). Next: lesson 04 (worked tokens).
