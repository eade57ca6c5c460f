# Generated from notebooks/02_three_estimators.ipynb by `make sync-notebooks`: edit the notebook, not this file.

# %% [markdown]
# # 02 · The three estimators: k1, k2, k3
#
# **What you will learn**
#
# - the rule about direction: tokens come from the **sampler** q, the ratio is r = p(x)/q(x) (target over sampler), and k1, k2, k3 all estimate **KL(q‖p)**;
# - how often k1 is negative: P_q(p > q), almost half for two close Gaussians and typically for a diffuse change of many tokens, exactly q(token) for a push on one token; while k2 and k3 never are;
# - Schulman's table reproduced with 10⁷ samples and checked, number by number, against closed forms, including why the published 0.002 is the exact 0.0025 seen through Monte Carlo noise;
# - the same numbers on a token distribution, exact by summing over the vocabulary, and why k2's bias there can be far larger and of either sign: its sign follows the third moment of log r wherever that term dominates;
# - why `low_var_kl` (k3) has low variance: the first-order term of k1 cancels, which helps only while |log r| is small on *every* token;
# - how bias and spread change as two Gaussians separate, the distance at which plain k1 beats k3 there, and why tokens have no such fixed distance;
# - control variates: the family k1 + λ(r − 1), the best λ*, and why λ = 1 (k3) is the only member that is never negative.
#
# **Time**: about 50 minutes of reading (prose and code), plus three panels and four exercises.
# **Runs in**: about 12 s on a 2-core CPU (measured under nbval); every size is a visible knob at the top of its cell.

# %%
import klviz
device = klviz.setup_notebook()

# %%
import math

import numpy as np
import torch
from IPython.display import HTML, display
from torch.distributions import Categorical, Normal

from klviz.plotting import COLORS, new_figure
from klviz.policies import move_policy, toy_sampler_logits
from klviz.statistics import plus_minus   # "mean ± 2 SE (2 SE)": the suite's one ± convention
from klviz.tables import (SCHULMAN_PUBLISHED, categorical_moments, control_variate_samples, gaussian_closed_forms,
                          gaussian_k2_bias_rule, gaussian_moments, k1_negative_mass, k1_negative_probability,
                          k2_bias_rule, k2_bias_series, k3_variance_parts, monte_carlo_row, sample_log_ratio,
                          schulman_table, table_html, variance_crossing_mu)
from klviz.widgets.lesson02 import ControlVariatePanel, GaussianEstimatorsPanel, TokenEstimatorsPanel


def normal(mu, sigma=1.0):
    # a float64 Normal: the exact columns are float64, so the sampled ones are too
    return Normal(torch.tensor(float(mu), dtype=torch.float64), torch.tensor(float(sigma), dtype=torch.float64))


# %% [markdown]
# ## 1 · The rule about direction, three estimators
#
# **Question.** Your trainer logs a number called `kl`. A KL divergence has a direction: KL(q‖p) ≠ KL(p‖q). From which distribution, to which?
#
# **The rule.** Look at which distribution produced the tokens. Call it the **sampler** q; the other one is the **target** p. Every estimator in this lesson is a function of one sampled x ~ q through
#
# $$\log r = \log p(x) - \log q(x) \qquad(\text{target minus sampler}),$$
#
# and every one of them estimates $\mathrm{KL}(q\|p) = \mathbb{E}_{x\sim q}\left[\log \frac{q(x)}{p(x)}\right]$, the divergence *from the sampler* ([checked on 2,000 random token pairs](claims.md#direction-rule-scope)). The order in which a function takes its arguments never changes this. In verl's `kl_penalty(logprob, ref_logprob)` the tokens come from the policy π (on the first minibatch of a step; later ones score π_old's tokens, lesson 00), so there `log r = ref_logprob - logprob` and the estimate is KL(π‖π_ref).
#
# | name | one sample | E over x ∼ q | sign of one sample |
# |---|---|---|---|
# | k1 | −log r | KL(q‖p): unbiased | either |
# | k2 | ½ (log r)² | KL(q‖p) only to second order: biased | ≥ 0 |
# | k3 | (r − 1) − log r | KL(q‖p): unbiased, because E_q[r − 1] = 0 | ≥ 0 |
#
# klviz has one copy of each, in `klviz.kernel`; here is k3 as it runs, with the detail that keeps it accurate near r = 1. `expm1(t) - t` subtracts two numbers of size t to get one of size t²/2, so it loses digits as |t| shrinks: in float32 about 1e-6 relative at |t| = 0.1 (harmless), 1e-3 at 10⁻⁴, up to 11 % at 10⁻⁶. Below 0.1 (float32; 10⁻³ in float64) the Taylor series t²/2 + t³/6 + … is used instead, which keeps full precision everywhere ([checked on 32,000 values of log r](claims.md#k3-accurate-in-float32)).

# %%
klviz.show_source(klviz.kernel.k3)

# %% [markdown]
# **Why k1 is negative for some samples.** k1 = log q(x)/p(x) is negative exactly where the target likes x more than the sampler does, p(x) > q(x). Its *average* under q is still KL(q‖p) ≥ 0, because q draws more often where q(x) > p(x). For q = N(0, 1) and p = N(μ, 1), log r = μx − μ²/2 is positive when x > μ/2, so k1 < 0 with probability 1 − Φ(μ/2): **almost half the samples** when the policies are close. Schulman's note, where it introduces k1, says it has high variance "as it's negative for half of the samples, whereas KL is always positive"; for two close Gaussians that is the number above. In general the fraction is P_q(p(x) > q(x)), the sampler's mass on the tokens the target favours, and on tokens it depends on the *shape* of the change. A diffuse change, a little noise on every logit, typically gives about one half again (median 0.48 over random token pairs) ([checked on 2,000 random token pairs](claims.md#k1-negative-diffuse)); a change concentrated on one token gives exactly that token's q when it is pushed up, 1 − q when it is pushed down ([checked on 2,000 random token pairs](claims.md#k1-negative-one-push)). For the token pairs of section 3 it is 16 % (a push toward " sofa", q(sofa) = 0.162), 17 % (the far pair) and 2 % (panel (b)'s default, a push toward the rare " moon"). A small fraction does not make k1 quiet: its few negative values are large.
#
# **Why k2 and k3 never are.** k2 is a square. k3 = (r − 1) − log r is the gap between the straight line t − 1 and the concave curve log t, which touches it at t = 1 (log t ≤ t − 1 for every t > 0), so it is ≥ 0 for every single sample ([checked on 2,000 random token pairs](claims.md#k2-k3-never-negative)). Lesson 03 turns this gap into a picture.
#
# The experiment: 10⁶ samples at μ = 0.1, where KL(q‖p) = μ²/2 = 0.005.

# %%
MU = 0.1
N_SAMPLES = 10**6  # more: slower, tighter
q, p = normal(0.0), normal(MU)
log_r = sample_log_ratio(q, p, N_SAMPLES, generator=klviz.make_generator(0))   # log p(x) - log q(x), x ~ q
k1_vals, k2_vals, k3_vals = klviz.k1(log_r), klviz.k2(log_r), klviz.k3(log_r)

frac_neg = float((k1_vals < 0).double().mean())
frac_exact = k1_negative_probability(0.0, 1.0, MU, 1.0)
print(f"k1 < 0 for {100 * frac_neg:.2f} % of the samples (exact: 1 - Phi(mu/2) = {100 * frac_exact:.2f} %)")
print(f"k1 ranges over [{float(k1_vals.min()):.3f}, {float(k1_vals.max()):.3f}]; its mean is "
      f"{float(k1_vals.mean()):.5f} (true KL {MU**2 / 2:.5f})")
print(f"smallest k2: {float(k2_vals.min()):.1e}   smallest k3: {float(k3_vals.min()):.1e}")
k1_mean, k1_std, k2_min, k3_min = (float(v) for v in (k1_vals.mean(), k1_vals.std(), k2_vals.min(), k3_vals.min()))
del k1_vals, k2_vals, k3_vals                              # their statistics are kept: 24 MB freed
# on tokens the fraction is P_q(p > q): the pairs of section 3 and panel (b)'s default
q_tok = torch.log_softmax(toy_sampler_logits().double(), -1)
neg_tok = {name: k1_negative_mass(q_tok.exp(), move_policy(q_tok, **kw).exp())
           for name, kw in (("close", dict(push=0.5, push_token=1)), ("far", dict(temperature=2.0, push=2.0, push_token=9)),
                            ("panel (b)", dict(push=1.5, push_token=9)))}
print("P_q(p > q) on tokens:", {k: f"{100 * v:.1f} %" for k, v in neg_tok.items()})

# %%
se_frac = math.sqrt(frac_exact * (1 - frac_exact) / N_SAMPLES)        # binomial standard error
assert abs(frac_neg - frac_exact) < 4 * se_frac
assert abs(frac_exact - 0.5 * math.erfc((MU / 2) / math.sqrt(2))) < 1e-15   # 1 - Phi(mu/2)
assert round(100 * frac_exact) == 48                                    # "almost half"
se_k1 = k1_std / math.sqrt(N_SAMPLES)
assert abs(k1_mean - MU**2 / 2) < 4 * se_k1                              # unbiased although half are negative
assert k2_min >= 0 and k3_min >= 0
assert [round(100 * v) for v in neg_tok.values()] == [16, 17, 2]
assert abs(neg_tok["close"] - float(q_tok.exp()[1])) < 1e-12      # only " sofa" gains: the mass of " sofa"
assert round(float(q_tok.exp()[1]), 3) == 0.162

# %% [markdown]
# ## 2 · Schulman's table, reproduced and checked
#
# **Question.** Schulman's note *Approximating KL Divergence* (2020) compares the three estimators on q = N(0, 1) and p = N(0.1, 1) (true KL 0.005) and p = N(1, 1) (true KL 0.5), with 10⁷ samples, and prints the bias and the standard deviation of **one sample**, both divided by the true KL. Which of those digits are real?
#
# **Math.** Under q, log r = μx − μ²/2 is normal with mean −μ²/2 and variance μ². Everything follows from moments of a normal variable Y: $\mathbb{E}[Y^2] = m^2 + s^2$, $\mathrm{Var}(Y^2) = 2s^4 + 4m^2s^2$, $\mathbb{E}[e^{kY}] = e^{km + k^2s^2/2}$, and $\mathrm{Cov}(Y, e^Y) = s^2\,\mathbb{E}[e^Y]$ (Stein's lemma), with $m = -\mu^2/2$, $s^2 = \mu^2$:
#
# | quantity | closed form | at μ = 0.1 | at μ = 1 |
# |---|---|---|---|
# | KL(q‖p) | μ²/2 | 0.005 | 0.5 |
# | Var k1 | μ² | std/true = 2/μ = 20 | 2 |
# | E k2 | μ²/2 + μ⁴/8 | bias/true = μ²/4 = 0.0025 | 0.25 |
# | Var k2 | μ⁴/2 + μ⁶/4 | std/true ≈ 1.4177 | ≈ 1.7321 |
# | Var k3 | Var r + Var log r − 2 Cov(r, log r) = (e^(μ²) − 1) + μ² − 2μ² = e^(μ²) − 1 − μ² | std/true ≈ 1.4166 | ≈ 1.6950 |
#
# `klviz.tables.gaussian_moments` computes the exact moments for *any* two Gaussians (with x = μ_q + σ_q z, log r is a quadratic a + bz + cz² in a standard normal z, so moments of k1 and k2 are finite sums of E[zᵏ], and E_q[r²] is a Gaussian integral). First, it must agree with the formulas of the table:

# %%
for mu in (0.1, 1.0):
    closed = gaussian_closed_forms(mu)
    print(f"mu = {mu}: std/true  k1 {closed['std_rel_k1']:.4f}   k2 {closed['std_rel_k2']:.4f}   "
          f"k3 {closed['std_rel_k3']:.4f}   bias/true of k2 {closed['bias_rel_k2']:.4f}")

# %%
for mu in (0.1, 1.0):
    general, closed = gaussian_moments(0.0, 1.0, mu, 1.0), gaussian_closed_forms(mu)
    for name in ("k1", "k2", "k3"):
        assert math.isclose(general.var[name], closed[f"var_{name}"], rel_tol=1e-9)
        assert math.isclose(general.mean[name], closed[f"mean_{name}"], rel_tol=1e-12)
assert round(gaussian_closed_forms(0.1)["std_rel_k2"], 4) == 1.4177 and round(gaussian_closed_forms(1.0)["std_rel_k2"], 4) == 1.7321
assert round(gaussian_closed_forms(0.1)["std_rel_k3"], 4) == 1.4166 and round(gaussian_closed_forms(1.0)["std_rel_k3"], 4) == 1.6950
for mu in (0.1, 1.0):   # the Var k3 row, piece by piece: the same three pieces as the control variates of section 5
    c = gaussian_closed_forms(mu)
    assert math.isclose(c["var_r"] + c["var_log_r"] - 2 * c["cov_r_log_r"], c["var_k3"], rel_tol=1e-12)

# %% [markdown]
# The closed forms are the heart of this section, so here is the code that computes them, exactly as the table above states them:

# %%
klviz.show_source(gaussian_closed_forms)

# %% [markdown]
# Now the experiment itself, with Schulman's sample size. `monte_carlo_row` draws the samples with `klviz.estimator_stats` in 20 independent batches. The standard error of a **mean** is std/√n. The standard error of a **standard deviation** depends on the fourth moment, which for k3 is large, so instead of guessing it we measure it: the spread of the 20 batch standard deviations divided by √20 (batch means). Every Monte Carlo number below is compared with the exact one within 4 of these standard errors.

# %%
N_TABLE = 10**7   # Schulman's size; 10**6 runs 10x faster with error bars sqrt(10) wider
N_BATCHES = 20
rows = schulman_table(mus=(0.1, 1.0), num_samples=N_TABLE, num_batches=N_BATCHES,
                     generator=klviz.make_generator(0, device), device=device)   # on the GPU when there is one
display(HTML(table_html(rows)))

# %%
for row in rows:
    exact, mc = row["exact"], row["mc"]
    for name in ("k1", "k2", "k3"):
        m = mc[name]
        assert abs(m["bias_rel"] - exact.bias_rel(name)) < 4 * m["se_bias_rel"], (row["mu"], name, "bias")
        assert abs(m["std_rel"] - exact.std_rel(name)) < 4 * m["se_std_rel"], (row["mu"], name, "std")
        # the two standard errors of the mean (std/sqrt(n) and batch means) agree within what 20 batches can tell
        assert 0.5 < m["se"] / m["se_batches"] < 2.0
        # the published std/true values are the exact ones rounded to 2-3 digits
        assert abs(row["published"][name][1] - exact.std_rel(name)) < 0.006
    assert row["published"]["k1"][0] == 0 and abs(exact.bias_rel("k1")) < 1e-12 and abs(exact.bias_rel("k3")) < 1e-12
print("every Monte Carlo number agrees with its closed form within 4 standard errors")

# %% [markdown]
# **Why 0.002 is 0.0025.** E k2 − KL = μ⁴/8, so the relative bias of k2 is exactly μ²/4: **0.0025** at μ = 0.1. The published 0.002 is one Monte Carlo run of 10⁷ samples, printed to three decimals: its standard error is 1.42/√10⁷ ≈ 0.00045, so ± 2 SE is ± 0.0009, and 0.002 lies 1.1 SE from the exact value. It is sampling noise, not a different value. (Every ± in this lesson, as everywhere in the suite, is ± 2 SE, and the printouts say so.) (Schulman's code also names the two distributions the other way round and calls `kl_divergence(p, q)`; that is harmless only because two Gaussians with equal variance have a symmetric KL.)

# %%
exact_bias_rel = gaussian_closed_forms(0.1)["bias_rel_k2"]
se_published = gaussian_closed_forms(0.1)["std_rel_k2"] / math.sqrt(10**7)   # SE of bias/true at 10^7 samples
published = SCHULMAN_PUBLISHED[0.1]["k2"][0]
print(f"exact {exact_bias_rel:.6f}, published {published}, standard error {se_published:.6f}: "
      f"the gap is {(exact_bias_rel - published) / se_published:.1f} standard errors")

# %%
assert math.isclose(exact_bias_rel, 0.0025, rel_tol=1e-12)
assert abs(exact_bias_rel - published) < 2 * se_published
assert round(se_published, 5) == 0.00045
assert round((exact_bias_rel - published) / se_published, 1) == 1.1

# %% [markdown]
# ### Per-sample distributions: panel (a)
#
# **Question.** Two numbers per estimator hide the shape. What do single samples of k1, k2, k3 look like?
#
# **Panel (a).** q = N(0, 1) draws the samples; move p's mean μ and scale σ. The three histograms share one x axis and a logarithmic y axis, so their spreads compare at a glance: the true KL is dashed, each sample mean dotted. The table puts bias/true and std/true from the samples (± 2 standard errors, rounded to what the standard error allows) beside the exact values. Try μ = 0.1 (k1 is a symmetric blob around almost zero, half of it negative; k2 and k3 are nearly identical), μ = 2 (k3 grows a long right tail), and σ = 1.5: then σ_p² ≥ 2σ_q², E_q[r²] diverges, and the exact variance of k3 is **infinite** (the table says so and why; the sample std is finite but keeps growing with N).

# %%
gauss_panel = GaussianEstimatorsPanel(device=device)   # 10^6 samples by default on a GPU, 10^5 on the CPU
gauss_panel

# %% [markdown]
# ## 3 · The same on token distributions
#
# **Question.** In a language model one sample is one token from a vocabulary. Do the Gaussian lessons carry over?
#
# **Intuition.** For a categorical distribution no closed form is needed: an expectation under q is the finite sum E_q[f] = Σ_x q(x) f(x), so the exact mean and variance of each estimator come from *enumerating* the vocabulary (`klviz.tables.categorical_moments`). The sampler q below is a next-token distribution over twelve readable tokens; the target p is q moved two ways: a small push towards " sofa" (close), and a flatter version (temperature 2) that also favours " moon" (far).

# %%
N_TOKENS = 5 * 10**5   # tokens drawn per target; more: slower, tighter
q_logp = torch.log_softmax(toy_sampler_logits().double(), -1)   # renormalised in float64
targets = {
    'close: push " sofa" by 0.5': move_policy(q_logp, push=0.5, push_token=1),
    'far: temperature 2, push " moon" by 2': move_policy(q_logp, temperature=2.0, push=2.0, push_token=9),
}
token_rows = []
gen = klviz.make_generator(1)
for label, p_logp in targets.items():
    token_rows.append({
        "target p": label,
        "exact": categorical_moments(q_logp.exp(), p_logp.exp()),
        "mc": monte_carlo_row(Categorical(logits=q_logp), Categorical(logits=p_logp), N_TOKENS, generator=gen),
    })
display(HTML(table_html(token_rows, label="target p")))

# %%
for row, p_logp in zip(token_rows, targets.values()):
    exact, mc = row["exact"], row["mc"]
    q_probs, p_probs = q_logp.exp(), p_logp.exp()
    kl_qp = float(klviz.categorical_kl(q_probs, p_probs))
    kl_pq = float(klviz.categorical_kl(p_probs, q_probs))
    assert math.isclose(exact.true_kl, kl_qp, rel_tol=1e-12)
    assert abs(exact.bias("k1")) < 1e-12 and abs(exact.bias("k3")) < 1e-12      # unbiased, by enumeration
    assert math.isclose(exact.cov_k1_r, -(kl_qp + kl_pq), rel_tol=1e-9)          # Cov(k1, r) = -(KL(q||p) + KL(p||q))
    for name in ("k1", "k2", "k3"):
        m = mc[name]
        assert abs(m["bias_rel"] - exact.bias_rel(name)) < 4 * m["se_bias_rel"], (row["target p"], name)
        assert abs(m["std_rel"] - exact.std_rel(name)) < 4 * m["se_std_rel"], (row["target p"], name)
close, far = (row["exact"] for row in token_rows)
assert close.std("k3") < close.std("k1") and far.std("k3") > 2 * far.std("k1")
print(f"close pair: std/true k1 {close.std_rel('k1'):.2f} vs k3 {close.std_rel('k3'):.2f};  "
      f"far pair: k1 {far.std_rel('k1'):.2f} vs k3 {far.std_rel('k3'):.2f}")

# %% [markdown]
# **What the table shows.** k1 and k3 are unbiased (exactly, by enumeration), and for the close pair k3's spread is far below k1's; for the far pair the order flips (k3's spread is more than twice k1's; section 4 follows the flip for the Gaussians). But k2 is **not** the same story as for the Gaussian pair: its bias is *negative* and large, −0.094 of the KL for the close pair and −0.338 for the far pair, against +0.0025 for the close Gaussian pair. Other moves of the same tokens give *positive* biases instead (sharpening p, pushing a token down; the table below has them). The next subsection says what decides.
#
# ### k2's bias on tokens, retold
#
# **Math.** Write u = log r. Under q the ratio averages to one, E_q[e^u] = 1, and expanding the exponential gives E[u] + E[u²]/2 + E[u³]/6 + E[u⁴]/24 + … = 0. Since KL(q‖p) = −E[u] and E[k2] = E[u²]/2,
#
# $$\mathbb{E}_q[k_2] - \mathrm{KL}(q\|p) = -\frac{\mathbb{E}_q[u^3]}{6} - \frac{\mathbb{E}_q[u^4]}{24} - \frac{\mathbb{E}_q[u^5]}{120} - \dots$$
#
# exactly (`klviz.tables.k2_bias_series`), with *raw* moments of u under q. The leading term is of **third** order in the distance, so the bias relative to the KL is of *first* order: it can be large at a tiny KL. Taylor's remainder makes the rule exact where it applies: e^u − 1 − u − u²/2 − u³/6 = e^ξ u⁴/24 for some ξ between 0 and u, so the bias differs from −E[u³]/6 by at most E_q[u⁴ max(1, r)]/24. **Wherever |E[u³]|/6 exceeds that bound, the bias has the sign of −E_q[(log r)³]**; where it does not, the rule does not decide and only the whole series does ([checked on 3,000 random token and Gaussian pairs](claims.md#k2-bias-sign)).
#
# What makes E[u³] positive or negative? The raw moment mixes two things: E[u] = −KL pulls it down (a symmetric log r, such as the equal-variance Gaussian pair's, still has E[u³] = −3·KL·Var u − KL³ < 0, hence its positive bias μ⁴/8), and the skew of log r about its mean pushes it either way. For a small push δ on one token with probability q, E[u³] ≈ δ³ q(1 − q)(1 − 2q): pushing up a token with q < ½ (one token gains a lot, all the others lose a little) makes it positive and the bias negative; pushing such a token *down* does the reverse. For pushes of up to 1 this holds exactly, not only to leading order, for every token with q ≤ 1/3 (and reversed for q ≥ 2/3); near q = ½ the sign depends on more ([checked on 3,072 random token pairs](claims.md#k2-bias-one-token-push)). The cell checks the series against the exact values, term by term, on the three pairs of this section:

# %%
pairs = {"close": targets['close: push " sofa" by 0.5'], "far": targets['far: temperature 2, push " moon" by 2'],
         "panel (b) default": move_policy(q_logp, push=1.5, push_token=9)}
series = {name: k2_bias_series(q_logp.exp(), p_logp.exp(), max_order=12) for name, p_logp in pairs.items()}
print(f"{'pair':<18} {'KL':>8} {'bias/true':>10} {'E[u^3]':>9}   partial sums of the series / true, orders 3, 4, 5, 6, 12")
for name, s in series.items():
    partial = s["partial"] / s["true_kl"]
    print(f"{name:<18} {s['true_kl']:8.5f} {s['bias'] / s['true_kl']:+10.4f} {-6 * s['terms'][0]:+9.4f}   "
          + "  ".join(f"{v:+.4f}" for v in (*partial[:4], partial[-1])))
close_s = series["close"]
print(f"close pair: the third-order term alone is {100 * close_s['terms'][0] / close_s['bias']:.0f} % of the bias")

# %%
# the series converges to the exact bias; the exact bias is the one in the table (by enumeration)
for s, row in zip(list(series.values())[:2], token_rows):
    assert math.isclose(s["bias"], row["exact"].bias("k2"), rel_tol=1e-9, abs_tol=1e-15)
for s in series.values():
    assert abs(s["partial"][-1] - s["bias"]) < 1e-3 * abs(s["bias"])
    assert s["bias"] < 0 and s["terms"][0] < 0      # E[u^3] > 0 here, and the bias is negative
assert [round(s["bias"] / s["true_kl"], 3) for s in series.values()] == [-0.094, -0.338, -0.39]
assert [round(s["true_kl"], 2) for s in series.values()] == [0.02, 0.3, 0.04]              # the KLs of the three pairs
assert round(close_s["terms"][0] / close_s["bias"], 2) == 0.89    # close pair: the third-order term is 89 % of it
# the Gaussian pair, by contrast: log r ~ N(-mu^2/2, mu^2) is symmetric about its mean, and the mu^4 parts of the
# third- and fourth-order terms add up to +mu^4/8 (the bias of the table): mu^4/4 - mu^4/8
for mu in (0.1, 1.0):
    m, v = -mu**2 / 2, mu**2
    e3, e4 = m**3 + 3 * m * v, m**4 + 6 * m**2 * v + 3 * v**2
    assert math.isclose(-3 * m * v / 6 - 3 * v**2 / 24, mu**4 / 8, rel_tol=1e-12)    # the mu^4 parts of both terms
    assert abs(-e3 / 6 - e4 / 24 - mu**4 / 8) < mu**6                                 # the rest is of higher order

# %% [markdown]
# **The rule at work, and where it stops.** The moves below include the ones that look like exceptions to any rule
# stated by "tokens against Gaussians": a sharper p, a pushed-down token, the temperature-4 setting of lesson 00's
# panel, and two Gaussian pairs with unequal variances. For each: the exact bias, the third-order term −E[u³]/6, the
# bound on everything after it, and whether the rule decides.

# %%
moves = {
    'push " sofa" by 0.5': k2_bias_rule(q_logp.exp(), move_policy(q_logp, push=0.5, push_token=1).exp()),
    'push " moon" by 1.5 (panel b)': k2_bias_rule(q_logp.exp(), move_policy(q_logp, push=1.5, push_token=9).exp()),
    "p sharper, temperature 0.5": k2_bias_rule(q_logp.exp(), move_policy(q_logp, temperature=0.5).exp()),
    'push " mat" (q = 0.30) down by 1': k2_bias_rule(q_logp.exp(), move_policy(q_logp, push=-1.0, push_token=0).exp()),
    'temperature 4, push " sofa" by 1': k2_bias_rule(q_logp.exp(),
                                                      move_policy(q_logp, temperature=4.0, push=1.0, push_token=1).exp()),
    "Gaussians N(0,1) vs N(0,0.7²)": gaussian_k2_bias_rule(0.0, 1.0, 0.0, 0.7),
    "Gaussians N(0,1) vs N(1,1.3²)": gaussian_k2_bias_rule(0.0, 1.0, 1.0, 1.3),
}
print(f"{'move':<34} {'KL':>7} {'bias/KL':>8} {'-E[u³]/6 /KL':>13} {'bound/KL':>9}   rule")
for name, r in moves.items():
    kl = r["true_kl"]
    verdict = (f"decides {r['predicted_sign']:+d}" if r["decided"] else "does not decide") + (
        "" if not r["decided"] else (": right" if (r["bias"] > 0) == (r["predicted_sign"] > 0) else ": WRONG"))
    print(f"{name:<34} {kl:7.4f} {r['bias'] / kl:+8.3f} {r['third_order'] / kl:+13.3f} {r['bound'] / kl:9.3f}   {verdict}")

# %%
assert all((r["bias"] > 0) == (r["predicted_sign"] > 0) for r in moves.values() if r["decided"])
decided = [name for name, r in moves.items() if r["decided"]]
assert decided == ['push " sofa" by 0.5', "p sharper, temperature 0.5", 'push " mat" (q = 0.30) down by 1',
                   "Gaussians N(0,1) vs N(0,0.7²)"]
t4 = moves['temperature 4, push " sofa" by 1']
assert round(t4["bias"] / t4["true_kl"], 3) == 0.097 and round(t4["third_order"] / t4["true_kl"], 3) == 0.198
assert round(t4["bound"] / t4["true_kl"], 2) == 0.23
g13 = moves["Gaussians N(0,1) vs N(1,1.3²)"]
assert round(g13["bias"] / g13["true_kl"], 2) == -0.21 and g13["third_order"] > 0 and not g13["decided"]
assert round(moves["Gaussians N(0,1) vs N(0,0.7²)"]["bias"] / moves["Gaussians N(0,1) vs N(0,0.7²)"]["true_kl"], 2) == 0.74
for name in ("p sharper, temperature 0.5", 'push " mat" (q = 0.30) down by 1'):
    assert moves[name]["bias"] > 0                                     # tokens, and a positive bias

# %% [markdown]
# Sharpening p (+33 %) and pushing " mat" down (+21 %) give *positive* biases on tokens, and the rule predicts both.
# The temperature-4 setting of lesson 00 (+9.7 %) is where the rule stops: E[(log r)³] < 0 points the right way, but
# its term (0.198 of the KL) is smaller than the bound on the rest (0.23), and only the whole series settles the sign.
# The second Gaussian pair shows why the bound matters: there −E[u³]/6 is tiny and *positive*, the bias is −21 %, and
# the rule, rightly, does not decide. So the sign of k2's bias is neither "positive for Gaussians" nor "negative on
# tokens": it is set by the shape of log r, and the third moment decides it whenever it dominates.

# %% [markdown]
# **"Below a KL of 0.1, k2's bias is negligible."** A common reading of Schulman's table (0.25 % bias at KL 0.005) is that k2 is safe whenever the logged KL is small. For the equal-variance Gaussian pair the relative bias is μ²/4 = KL/2, so that is true there: 5 % at KL 0.1. On tokens the relative bias is of first order in the distance and can be large at a tiny KL, in either direction. Below, the exact bias/true of k2 against the exact KL, as p is pushed toward " sofa" (q = 0.162) or toward the rare " moon" (q = 0.02), or as " mat" (q = 0.30) is pushed down, beside the Gaussian pair:

# %%
pushes = np.linspace(0.02, 5.0, 250)   # far enough that both token curves pass their lowest point
curves = {}
for tok, sign, name in ((1, 1, 'push " sofa" up'), (9, 1, 'push " moon" up'), (0, -1, 'push " mat" down')):
    s_list = [k2_bias_series(q_logp.exp(), move_policy(q_logp, push=sign * float(s), push_token=tok).exp())
              for s in pushes]
    curves[name] = (np.array([s["true_kl"] for s in s_list]), np.array([s["bias"] / s["true_kl"] for s in s_list]))
mu_g = np.linspace(0.01, math.sqrt(3.0), 150)   # the Gaussian pair up to a KL of 1.5
fig, ax = new_figure(10.0, 3.6)
ax.plot(mu_g**2 / 2, mu_g**2 / 4, color=COLORS["ink"], lw=1.8, label="Gaussian pair, equal variances: +μ²/4 = +KL/2")
for (name, (kl_c, rel_c)), colour in zip(curves.items(), (COLORS["k2"], COLORS["p"], COLORS["k3"])):
    ax.plot(kl_c, rel_c, color=colour, lw=1.8, label=f"tokens: {name}")
ax.axhline(0, color=COLORS["ink"], lw=0.6)
ax.axvline(0.1, color=COLORS["mu"], ls=":", lw=1.2, label="KL = 0.1")
ax.set_xscale("log")
ax.set_xlim(1e-4, 1.5)
ax.set_xlabel("exact KL(q‖p)  [nats, log scale]")
ax.set_ylabel("bias / true KL of k2")
ax.set_title("k2's relative bias: +KL/2 for the equal-variance Gaussian pair; on tokens, large and of either sign")
ax.legend(loc="lower left", fontsize=8)
display(fig)

kl_moon, rel_moon = curves['push " moon" up']
below = kl_moon < 0.1
i_low = int(np.argmin(rel_moon))
print(f'push toward " moon": |bias| > 10 % from KL {kl_moon[np.abs(rel_moon) > 0.1].min():.4f} on; below KL 0.1 '
      f'bias/true down to {rel_moon[below].min():+.3f}; lowest {rel_moon[i_low]:+.3f} at KL {kl_moon[i_low]:.3f} '
      f'(push {pushes[i_low]:.1f}), back to {rel_moon[-1]:+.3f} at push {pushes[-1]:.0f}')
kl_sofa, rel_sofa = curves['push " sofa" up']
kl_mat, rel_mat = curves['push " mat" down']
print(f'push toward " sofa": lowest {rel_sofa.min():+.3f}, {rel_sofa[-1]:+.3f} at push {pushes[-1]:.0f}; '
      f'" mat" pushed down: positive from the start, {rel_mat[np.argmin(np.abs(kl_mat - 0.1))]:+.3f} near KL 0.1')

# %%
assert kl_moon[np.abs(rel_moon) > 0.1].min() < 0.002       # 10 % off already at a KL of 0.002
assert round(rel_moon[below].min(), 2) == -0.49            # almost half the KL, at a KL below 0.1
# the lowest point lies inside the range, and the curve climbs well back up after it
assert 0 < i_low < len(pushes) - 1 and rel_moon[-1] > rel_moon[i_low] + 0.3
assert round(rel_moon[i_low], 2) == -0.53 and round(kl_moon[i_low], 2) == 0.24 and abs(pushes[i_low] - 2.9) < 0.05
assert round(rel_sofa.min(), 2) == -0.15 and 0 < int(np.argmin(rel_sofa)) < len(pushes) - 1 and rel_sofa[-1] > 0
assert bool((rel_mat > 0).all())                            # pushing a token down: positive all the way
assert math.isclose(gaussian_closed_forms(math.sqrt(0.2))["bias_rel_k2"], 0.05, rel_tol=1e-12)   # Gaussians: 5 % at KL 0.1

# %% [markdown]
# So the reading holds for the pair it was measured on and fails on tokens. With p pushed toward " moon", k2 is 10 % low already at a KL of 0.002 and 49 % low just below a KL of 0.1; its relative bias bottoms out at −53 % (KL 0.24, a push of about 2.9) and only then turns back. Pushed toward " sofa", it dips to −15 % and turns positive for a large push (E[u³] changes sign there, lesson 03 shows the curve). Pushing " mat" down keeps it positive all the way. Whether k2 is close to the KL depends on the *shape* of log r, not only on its size.
#
# ### Why `low_var_kl` (k3) has low variance, and when
#
# This is the question most readers arrive with. Expand both estimators in u = log r around r = 1:
#
# $$k_1 = -u, \qquad k_3 = (e^u - 1) - u = \tfrac12 u^2 + \tfrac16 u^3 + \dots$$
#
# k1's value is of the size of u: a first-order term whose mean is small but whose spread is of the size of the *distance* between the policies. In k3 that first-order term cancels exactly (the u of e^u − 1 against the −u), and what is left is of second order. So relative to the KL, k1's spread explodes as p → q, while k3's tends to a constant set by the *shape* of log r, √(E[u⁴]/E[u²]² − 1): √2 for the Gaussian pair, and for a push on one token |skew(log r)| = |1 − 2q|/√(q(1 − q)), which is 1.84 for " sofa" but 14 for "<eos>" (q = 0.005) ([checked on 2,000 random token distributions](claims.md#k3-spread-limit-one-push)). The same cancellation, read as Var k3 = Var r + Var log r − 2 Cov(r, log r), is the control-variate argument of section 5.
#
# The expansion is only as good as u is small, and it must be small on **every** token q can draw, rare ones included: while |log r| ≤ 1 on all of them, k3's spread is below k1's (at most 0.72 of it) ([checked on 4,180 random token pairs](claims.md#gap-less-spread-near-one)); one rare token with a larger |log r| can reverse the order at a small KL, because k3's term e^u − 1 − u grows exponentially in u while k1's grows linearly.

# %%
print(f"{'push on sofa':>12} {'KL':>10} {'std/true k1':>12} {'std/true k3':>12}")
rows_k3 = {}
for s in (1e-3, 1e-2, 1e-1, 0.5):
    p_s = move_policy(q_logp, push=s, push_token=1).exp()
    m = rows_k3[s] = categorical_moments(q_logp.exp(), p_s)
    print(f"{s:>12g} {m.true_kl:10.3g} {m.std_rel('k1'):12.1f} {m.std_rel('k3'):12.3f}")
u_small = torch.log(move_policy(q_logp, push=1e-3, push_token=1).exp()) - q_logp
limit = math.sqrt(float((q_logp.exp() * u_small**4).sum()) / float((q_logp.exp() * u_small**2).sum())**2 - 1)
q_sofa, q_eos = float(q_logp.exp()[1]), float(q_logp.exp()[11])
print(f"limit sqrt(E[u^4]/E[u^2]^2 - 1) at a push of 1e-3: {limit:.3f}; |1 - 2q|/sqrt(q(1 - q)): sofa "
      f"{abs(1 - 2 * q_sofa) / math.sqrt(q_sofa * (1 - q_sofa)):.3f}, <eos> {abs(1 - 2 * q_eos) / math.sqrt(q_eos * (1 - q_eos)):.1f}")
g = gaussian_closed_forms(1e-3)
print(f"Gaussian pair at mu = 0.001: std/true k1 {g['std_rel_k1']:.0f} (= 2/mu), k3 {g['std_rel_k3']:.4f} (sqrt 2 = {math.sqrt(2):.4f})")

# %%
m = rows_k3[1e-3]
assert m.std_rel("k1") > 5000 and abs(m.std_rel("k3") - limit) < 1e-3      # k1 explodes, k3 tends to a constant
assert round(limit, 2) == 1.84 and abs(limit - abs(k2_bias_series(q_logp.exp(),
                                                 move_policy(q_logp, push=1e-3, push_token=1).exp())["skewness"])) < 1e-3
assert round(abs(1 - 2 * q_eos) / math.sqrt(q_eos * (1 - q_eos))) == 14
for s in rows_k3:                                                           # the one-line identity, on tokens
    parts = k3_variance_parts(q_logp.exp(), move_policy(q_logp, push=s, push_token=1).exp())
    assert math.isclose(parts["var_r"] + parts["var_log_r"] - 2 * parts["cov_r_log_r"], parts["var_k3"], rel_tol=1e-6)
assert math.isclose(g["std_rel_k1"], 2 / 1e-3, rel_tol=1e-9) and abs(g["std_rel_k3"] - math.sqrt(2)) < 1e-3

# %% [markdown]
# **Panel (b).** Push a token up or down, sharpen or flatten p. The default, a push of 1.5 toward " moon", is the third row of the series table: k2 39 % low, k1 negative on 2 % of the draws, and, at a KL of only 0.038, **k1 is the quieter estimator** (std/true 5.60 against 6.55 for k3): " moon" has log r = 1.43, above the bound of 1, and k3's exponential term on that one token outweighs everything else. The readout says which one is quieter and why. The right plot shows what each token would contribute if it were drawn: k1 is negative on every token that p likes more than q, k2 and k3 never are. The table below it is exact (a sum over the twelve tokens) beside N sampled tokens.

# %%
token_panel = TokenEstimatorsPanel()
token_panel

# %%
d = token_panel.last
assert round(d["exact"].std_rel("k1"), 2) == 5.60 and round(d["exact"].std_rel("k3"), 2) == 6.55
assert round(d["exact"].true_kl, 3) == 0.038 and round(d["max_abs_log_r"], 2) == 1.43 and "1.43" in token_panel.readout.value  # the note on |log r|, shown

# %% [markdown]
# ## 4 · What happens as p moves away
#
# **Question.** Bias and spread at two distances hide the trend. How do they change as p moves away from q, and is there a distance beyond which k3 stops being the better choice? For two Gaussians the closed forms answer it; tokens answer differently.

# %% [markdown]
# **As the Gaussian policies separate.** For q = N(0, 1), p = N(μ, 1) the closed forms give the whole curve: std/true of k1 is 2/μ, which *falls* as μ grows, while k3's, $\sqrt{e^{\mu^2} - 1 - \mu^2}\,/\,(\mu^2/2)$, rises like $e^{\mu^2/2}$. So there is a distance beyond which plain k1 has the smaller variance. Setting Var k1 = Var k3 gives μ² = e^(μ²) − 1 − μ², i.e. e^t = 1 + 2t with t = μ²; its positive root is t ≈ 1.2564, **μ* ≈ 1.1209**, where KL(q‖p) = μ*²/2 ≈ 0.63 nats. Below it k3 wins; beyond it k1 does. **That 0.63 is a fact about this Gaussian pair, not a threshold for tokens:** on tokens the order is decided by the largest |log r| over the tokens q can draw, not by the KL, and panel (b)'s default already has k1 quieter at a KL of 0.038 (exercise 4 asks you to find such a pair below 0.01). The same root t ≈ 1.26 does reappear on tokens, as a log-ratio rather than a KL: a push up on a token with q ≤ 0.01 makes k3 the noisier estimator exactly when that token's log r passes a threshold between 1.256 and 1.274, whatever the KL (on random pairs, at KLs down to 6e-8) ([checked on 4,156 random token pairs](claims.md#k3-loses-on-a-rare-push)).
#
# The dots are Monte Carlo measurements with ±2 standard-error bars. They stop at μ = 1.25 on purpose: the error bar of a standard deviation depends on the fourth moment, and k3's grows like exp(6μ²), so for larger μ a few hundred thousand samples no longer give an error bar one can trust (the exact curves need no samples).

# %%
MUS_MC = (0.25, 0.5, 0.75, 1.0, 1.25)
N_PER_MU = 3 * 10**5   # samples per dot; more: slower, tighter
gen = klviz.make_generator(2)
sweep = {mu: monte_carlo_row(normal(0.0), normal(mu), N_PER_MU, num_batches=20, generator=gen) for mu in MUS_MC}
mu_cross = variance_crossing_mu()

mu_grid = np.linspace(0.05, 2.2, 300)
closed = [gaussian_closed_forms(m) for m in mu_grid]
fig, (ax_s, ax_b) = new_figure(9.0, 3.4, ncols=2)
for name in ("k1", "k2", "k3"):
    ax_s.plot(mu_grid, [c[f"std_rel_{name}"] for c in closed], color=COLORS[name], label=f"{name} exact")
    ax_s.errorbar(MUS_MC, [sweep[m][name]["std_rel"] for m in MUS_MC],
                  yerr=[2 * sweep[m][name]["se_std_rel"] for m in MUS_MC], fmt="o", ms=4, color=COLORS[name])
ax_s.axvline(mu_cross, color=COLORS["ink"], ls=":", lw=1.2, label=f"Var k1 = Var k3 at μ = {mu_cross:.3f}")
ax_s.set_yscale("log")
ax_s.set_xlabel("μ   (p = N(μ, 1), q = N(0, 1))")
ax_s.set_ylabel("std / true KL of one sample")
ax_s.set_title("Gaussian pair: spread of one sample (dots: Monte Carlo ± 2 SE)")
ax_s.legend()
ax_b.plot(mu_grid, [c["bias_rel_k2"] for c in closed], color=COLORS["k2"], label="k2 exact: μ²/4")
ax_b.errorbar(MUS_MC, [sweep[m]["k2"]["bias_rel"] for m in MUS_MC],
              yerr=[2 * sweep[m]["k2"]["se_bias_rel"] for m in MUS_MC], fmt="o", ms=4, color=COLORS["k2"],
              label="k2 Monte Carlo ± 2 SE")
ax_b.axhline(0.0, color=COLORS["k3"], lw=2, label="k1 and k3: 0 (unbiased)")
ax_b.set_xlabel("μ")
ax_b.set_ylabel("bias / true KL")
ax_b.set_title("bias: only k2 has one, and it grows like μ²/4")
ax_b.legend()
display(fig)

# %%
t_cross = mu_cross**2
assert abs(math.expm1(t_cross) - 2 * t_cross) < 1e-12 and round(mu_cross, 4) == 1.1209 and round(t_cross, 4) == 1.2564
assert round(t_cross / 2, 2) == 0.63                                   # the KL at the crossing, in nats
for mu in (mu_cross - 0.01, mu_cross + 0.01):                           # k3 smaller before, k1 smaller after
    c = gaussian_closed_forms(mu)
    assert (c["var_k3"] < c["var_k1"]) == (mu < mu_cross)
for mu in MUS_MC:
    exact = gaussian_moments(0.0, 1.0, mu, 1.0)
    for name in ("k1", "k2", "k3"):
        m = sweep[mu][name]
        assert abs(m["std_rel"] - exact.std_rel(name)) < 4 * m["se_std_rel"], (mu, name)
        assert abs(m["bias_rel"] - exact.bias_rel(name)) < 4 * m["se_bias_rel"], (mu, name)
# the crossing, measured: k3 clearly smaller at mu = 0.75, clearly larger at mu = 1.25
for mu, k3_smaller in ((0.75, True), (1.25, False)):
    a, b = sweep[mu]["k1"], sweep[mu]["k3"]
    gap = b["std_rel"] - a["std_rel"]
    assert (gap < 0) == k3_smaller and abs(gap) > 4 * math.hypot(a["se_std_rel"], b["se_std_rel"])

# %% [markdown]
# ## 5 · Control variates: the family k1 + λ(r − 1)
#
# **Question.** Where does k3 come from, and is λ = 1 the best way to add r − 1?
#
# **Intuition.** Under q the ratio averages to one: E_q[r] = Σ_x q(x) · p(x)/q(x) = 1 (as long as p puts no mass where q has none; otherwise E_q[r] < 1 and k3 is biased ([checked on 2,000 random token pairs](claims.md#truncated-sampler))). So r − 1 has mean zero, and adding any multiple of it to k1 keeps the estimator unbiased. It can only change the spread, and it lowers it when r − 1 moves *against* k1, a **control variate**.
#
# **Math.** Var(k1 + λ(r − 1)) = Var k1 + 2λ Cov(k1, r) + λ² Var r, a parabola in λ with its minimum at λ* = −Cov(k1, r)/Var r. Both pieces are divergences:
#
# - E_q[r log r] = E_p[log r] = KL(p‖q) and E_q[log r] = −KL(q‖p), so **Cov(log r, r) = KL(q‖p) + KL(p‖q)**, which is never negative;
# - Var_q(r) = E_q[r²] − 1 = χ²(p‖q) ([checked on 2,000 random token pairs](claims.md#cov-log-r-r-jeffreys)).
#
# The same three pieces give k3's variance in one line (λ = 1): Var k3 = Var r + Var log r − 2 Cov(r, log r), which for the Gaussian pair is (e^(μ²) − 1) + μ² − 2μ² = e^(μ²) − 1 − μ², the row of section 2's table. Near p = q the three nearly cancel (r − 1 ≈ log r), which is the low-variance argument of section 3 again.
#
# Hence λ* = (KL(q‖p) + KL(p‖q)) / χ²(p‖q); for q = N(0, 1), p = N(μ, 1) this is **λ* = μ²/(e^(μ²) − 1)**: about 0.995 at μ = 0.1 (k3 is nearly optimal) but 0.582 at μ = 1. The variance is μ² − 2λμ² + λ²(e^(μ²) − 1).
#
# *A common reading to correct:* a widely shared explanation of `low_var_kl` writes Cov[log r, r − 1] ≈ −Var[log r]. The sign is wrong: the covariance is +(KL(q‖p) + KL(p‖q)) ≈ +Var[log r] near r = 1. It is k1 = −log r and r − 1 that are negatively correlated, which is exactly why adding r − 1 to k1 cancels noise. The samples of section 1 (μ = 0.1, where both sides equal μ² exactly) say so:

# %%
r_minus_1 = torch.expm1(log_r)
prod = (log_r - log_r.mean()) * (r_minus_1 - r_minus_1.mean())
cov_hat, se_cov = float(prod.mean()), float(prod.std()) / math.sqrt(N_SAMPLES)
print(f"Cov(log r, r - 1) = {plus_minus(cov_hat, se_cov, '.6f')}   Var(log r) = {float(log_r.var()):.6f}   "
      f"KL(q||p) + KL(p||q) = mu^2 = {MU**2:.6f}")
del log_r, r_minus_1, prod                                 # 24 MB; only their statistics are kept

# %%
assert cov_hat > 10 * se_cov                       # positive, not negative
assert abs(cov_hat - MU**2) < 4 * se_cov

# %% [markdown]
# Now λ* measured from samples (the pooled −Cov(k1, r)/Var r, with a batch-means standard error) beside the closed form, and the whole family's spread against the distance:

# %%
N_LAMBDA = 5 * 10**5   # samples per mu; more: slower, tighter
gen = klviz.make_generator(3)
measured = {mu: control_variate_samples(normal(0.0), normal(mu), N_LAMBDA, generator=gen) for mu in (0.1, 0.5, 1.0)}
for mu, m in measured.items():
    print(f"mu = {mu}: lambda* measured {plus_minus(m['lambda_star'], m['se'], '.4f')}, "
          f"closed form {gaussian_closed_forms(mu)['lambda_star']:.4f}")

mu_grid = np.linspace(0.02, 2.2, 300)
closed = [gaussian_closed_forms(m) for m in mu_grid]
fig, (ax_l, ax_v) = new_figure(9.0, 3.3, ncols=2)
ax_l.plot(mu_grid, [c["lambda_star"] for c in closed], color=COLORS["ink"], label="λ* = μ² / (exp(μ²) − 1)")
ax_l.errorbar(list(measured), [m["lambda_star"] for m in measured.values()],
              yerr=[2 * m["se"] for m in measured.values()], fmt="o", color=COLORS["mu"], label="measured ± 2 SE")
ax_l.axhline(1.0, color=COLORS["k3"], ls="--", label="λ = 1 (k3)")
ax_l.set_xlabel("μ")
ax_l.set_ylabel("best λ")
ax_l.set_title("the best coefficient falls as p moves away")
ax_l.legend()
best_std = [math.sqrt(c["var_k1"] - c["var_k1"]**2 / c["var_r"]) / c["true_kl"] for c in closed]
ax_v.plot(mu_grid, [c["std_rel_k1"] for c in closed], color=COLORS["k1"], label="k1 (λ = 0)")
ax_v.plot(mu_grid, [c["std_rel_k3"] for c in closed], color=COLORS["k3"], label="k3 (λ = 1)")
ax_v.plot(mu_grid, best_std, color=COLORS["ink"], ls="--", label="best member (λ = λ*)")
ax_v.set_yscale("log")
ax_v.set_xlabel("μ")
ax_v.set_ylabel("std / true KL of one sample")
ax_v.set_title("k3 is near-best only when p is close to q")
ax_v.legend()
display(fig)

# %%
for mu, m in measured.items():
    assert abs(m["lambda_star"] - gaussian_closed_forms(mu)["lambda_star"]) < 4 * m["se"], mu
assert round(gaussian_closed_forms(0.1)["lambda_star"], 3) == 0.995 and round(gaussian_closed_forms(1.0)["lambda_star"], 3) == 0.582
for c in closed:   # the best member is never worse than k1 or k3; Var at lambda* = Var k1 - Cov(k1, r)^2 / Var r
    best = c["var_k1"] - c["cov_k1_r"]**2 / c["var_r"]
    assert best <= min(c["var_k1"], c["var_k3"]) * (1 + 1e-12)

# %% [markdown]
# **λ = 1 is the only member that is never negative.** As a function of r, −log r + λ(r − 1) has its minimum at r = 1/λ (for λ > 0), where it equals log λ + 1 − λ. That is zero for λ = 1 and negative for every other λ > 0 (for λ ≤ 0 the function goes negative as r grows) ([checked on 2,001 values of λ](claims.md#only-lambda-one-never-negative)). So the best λ* buys a little variance at the price of negative per-sample values, the very thing that makes logged KLs confusing:

# %%
r_grid = torch.logspace(-4, 4, 20001, dtype=torch.float64)
lowest = {}
for lam in (0.0, 0.58, 0.9, 1.0, 1.1):
    g = klviz.k3(torch.log(r_grid)) if lam == 1.0 else -torch.log(r_grid) + lam * (r_grid - 1)
    lowest[lam] = float(g.min())
    predicted = math.log(lam) + 1 - lam if lam > 0 else -math.inf
    print(f"lambda = {lam:4}: smallest value {lowest[lam]:+.5f}  (log lambda + 1 - lambda = {predicted:+.5f})")

# %%
for lam, low in lowest.items():
    if lam == 1.0:
        assert low >= 0
    else:
        assert low < 0
        if lam > 0:
            assert abs(low - (math.log(lam) + 1 - lam)) < 1e-6

# %% [markdown]
# **Panel (c).** The whole parabola for any pair q = N(0, 1), p = N(μ, σ²): the exact curve (black), the same curve estimated from N samples (red dashes), k1 at λ = 0, k3 at λ = 1, λ* (star). On the right: how often each member is negative, zero only at λ = 1. Move μ from 0.1 to 2 and watch λ* slide away from 1; set σ = 1.5 and every λ ≠ 0 has infinite variance, because Var r = χ²(p‖q) diverges.

# %%
lambda_panel = ControlVariatePanel(device=device)
lambda_panel


# %% [markdown]
# ## Takeaways
#
# - **Direction:** the sampler fixes it. With x ∼ q and log r = log p(x) − log q(x), k1, k2, k3 all estimate KL(q‖p) ([checked on 2,000 random token pairs](claims.md#direction-rule-scope)).
# - **k1 = −log r** is unbiased but negative on a fraction P_q(p > q) of the samples: almost half for two close Gaussians and typically for a diffuse change, q(token) for a push on one token (2–17 % for this lesson's token pairs); its relative spread (2/μ for the Gaussians) explodes as the policies get close.
# - **k2 = ½(log r)²** is never negative and has low variance near p = q, but it is biased: E[k2] − KL = −E[u³]/6 − E[u⁴]/24 − … (u = log r, raw moments), a third-order error, so of first order *relative* to the KL. Its sign is that of −E_q[(log r)³] wherever that term exceeds the bound on the rest ([checked on 3,000 random token and Gaussian pairs](claims.md#k2-bias-sign)): positive for the equal-variance Gaussian pair (μ⁴/8; Schulman's 0.002 is the exact 0.0025 plus Monte Carlo noise), for a sharper p and for a pushed-down token; negative for a token with q < ½ pushed up (−9 % at KL 0.02, −39 % at KL 0.04, −49 % just under KL 0.1).
# - **k3 = (r − 1) − log r** is unbiased *and* never negative; it is k1 plus the zero-mean control variate r − 1, which cancels k1's first-order term: k3 = u²/2 + u³/6 + …, so near p = q its spread is of the size of the KL times a constant set by the shape of log r (√2 for Gaussians, 1.84 for the sofa push, 14 for a push on <eos>), while k1's is of the size of the distance. It is the quieter one while |log r| ≤ 1 on every token q can draw ([checked on 4,180 random token pairs](claims.md#gap-less-spread-near-one)), not whenever the KL is small.
# - **Cov(log r, r) = KL(q‖p) + KL(p‖q) ≥ 0** ([checked on 2,000 random token pairs](claims.md#cov-log-r-r-jeffreys)): this is why adding r − 1 to k1 cancels noise, and it gives the best coefficient λ* = (KL(q‖p) + KL(p‖q))/χ²(p‖q), which is μ²/(e^(μ²) − 1) for Gaussians.
# - **Far apart, k1 wins, for the Gaussian pair at a KL of 0.63:** Var k3 = e^(μ²) − 1 − μ² overtakes Var k1 = μ² at μ ≈ 1.12, and is infinite when σ_p² ≥ 2σ_q². On tokens the crossing is set by the largest |log r|, not by the KL.
# - Every number in this lesson is exact (closed form or vocabulary sum) or a Monte Carlo measurement checked against it within 4 standard errors (every ± shown is ± 2 SE).

# %% [markdown]
# ## Exercises
#
# Each exercise has a skeleton whose body is `...`: replace it and run the cell; `klviz.check` tests your answer on cases this lesson did not show and says what is wrong. A worked solution follows in a collapsed cell.
#
# ### Exercise 1 · k3 from the log-ratio
#
# Write `my_k3(log_r)` returning the per-sample k3 for `log_r = log p(x) - log q(x)` (x ∼ q). It must stay accurate to 1 % in float32 for |log r| down to 10⁻⁴ (a policy and a reference that nearly agree): use `torch.expm1` for r − 1. Below that even expm1(t) − t loses its digits to cancellation (about 10 % off at |log r| = 10⁻⁶ in float32); `klviz.kernel.k3`, shown in section 1, switches to the series t²/2 + t³/6 + … there.

# %%
def my_k3(log_r):
    ...

klviz.check.lesson02.k3_estimator(my_k3)


# %%
# Solution
def my_k3(log_r):
    # r - 1 via expm1: exp(x) - 1 would lose every digit of a tiny x in float32
    return torch.expm1(log_r) - log_r

assert klviz.check.lesson02.k3_estimator(my_k3)


# %% [markdown]
# ### Exercise 2 · The direction in framework code
#
# A trainer gives you `logprob` (the policy's log-probabilities of the tokens *it sampled*) and `ref_logprob` (the reference model's log-probabilities of the same tokens). Write `my_penalty(logprob, ref_logprob)` returning per-token k3 estimates of **KL(π‖π_ref)**. The check evaluates your function on every token of a vocabulary and takes the exact average under π.

# %%
def my_penalty(logprob, ref_logprob):
    ...

klviz.check.lesson02.k3_direction(my_penalty)


# %%
# Solution
def my_penalty(logprob, ref_logprob):
    log_r = ref_logprob - logprob        # target (reference) minus sampler (policy)
    return torch.expm1(log_r) - log_r

assert klviz.check.lesson02.k3_direction(my_penalty)


# %% [markdown]
# ### Exercise 3 · Predict k2's sign, then measure it
#
# Write `predict_k2_sign(q_probs, p_probs)` that *predicts* the sign of k2's bias from the moments of u = log r under q, without computing the bias: return +1 or −1 where the third-moment rule decides (|E[u³]|/6 larger than E[u⁴ max(1, r)]/24), and 0 where it does not. Then the cell measures the bias on three moves of the twelve tokens and puts your predictions beside it. The check runs your function on moves this lesson did not show.

# %%
def predict_k2_sign(q_probs, p_probs):
    ...

klviz.check.lesson02.k2_sign_rule(predict_k2_sign)


# %%
# Solution: the cubic term -E[u^3]/6 against the bound on everything after it, E[u^4 max(1, r)] / 24
def predict_k2_sign(q_probs, p_probs):
    u = torch.log(p_probs) - torch.log(q_probs)
    third = -float((q_probs * u**3).sum()) / 6
    bound = float((q_probs * u**4 * torch.clamp(u.exp(), min=1.0)).sum()) / 24
    return 0 if abs(third) <= bound else (1 if third > 0 else -1)

for name, kw in (("push ' dog' up by 0.8", dict(push=0.8, push_token=8)), ("sharper, T = 0.7", dict(temperature=0.7)),
                 ("flatter, T = 1.6", dict(temperature=1.6))):
    p_move = move_policy(q_logp, **kw).exp()
    measured = k2_bias_series(q_logp.exp(), p_move)["bias"]
    print(f"{name:<22} predicted {predict_k2_sign(q_logp.exp(), p_move):+d}, measured bias {measured:+.2e}")

assert klviz.check.lesson02.k2_sign_rule(predict_k2_sign)

# %% [markdown]
# ### Exercise 4 · A close pair where k1 beats k3
#
# Find two distributions `q_probs`, `p_probs` (any vocabulary) with KL(q‖p) **below 0.01** on which k1 has the *smaller* spread. Section 3 says where to look.

# %%
close_pair = ...   # (q_probs, p_probs)

klviz.check.lesson02.k1_quieter_close_pair(close_pair)

# %%
# Solution: a large log r on a token q rarely draws; its small q keeps the KL small
q_probs = torch.softmax(toy_sampler_logits().double(), -1)          # "<eos>" has q = 0.005
close_pair = (q_probs, move_policy(q_probs.log(), push=1.4, push_token=11).exp())   # KL 0.008

assert klviz.check.lesson02.k1_quieter_close_pair(close_pair)

# %% [markdown]
# ## References
#
# - J. Schulman, [Approximating KL Divergence](http://joschu.net/blog/kl-approx.html) (2020): the three estimators and the table reproduced in section 2.
# - verl, [`kl_penalty` in `verl/trainer/ppo/core_algos.py`](https://github.com/volcengine/verl/blob/main/verl/trainer/ppo/core_algos.py): `kl`/`k1`, `mse`/`k2`, `low_var_kl`/`k3` as used in PPO and GRPO training.
# - A. B. Owen, [Monte Carlo theory, methods and examples](https://artowen.su.domains/mc/): control variates and the optimal coefficient −Cov/Var.
# - Y. Tang and R. Munos, [On a few pitfalls in KL divergence gradient estimation for RL](https://arxiv.org/abs/2506.09477) (2025): what the *gradients* of these estimators do (lesson 05).
# - Next: lesson 03 draws k3 as the gap between a convex curve and its tangent (f-divergences and Bregman divergences).
