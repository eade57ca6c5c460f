# Generated from notebooks/01_sampling_as_weighting.ipynb by `make sync-notebooks`: edit the notebook, not this file.

# %% [markdown]
# # 01 · Sampling as weighting: where did P(i) go?
#
# RL code for language models logs a KL divergence as a plain average over sampled tokens, for example
# verl's `ppo_kl = masked_mean(old_log_prob - log_prob, response_mask)`. The textbook formula
# $\mathrm{KL}(q\,\|\,p)=\sum_x q(x)\log\frac{q(x)}{p(x)}$ has a factor $q(x)$ in front of the log (the "P(i)"
# of a widely shared explanation of verl's code, which asks where it went). The code has none. This lesson shows where it went.
#
# **What you will learn**
# - why a plain mean over tokens drawn from $q$ already carries the weight $q(x)$: the draw counts *are* the weights;
# - how fast the mean converges: a running mean with its ±2 standard-error band, on 12 tokens and on 50,257;
# - what goes wrong when the tokens come from another policy $\mu$, how the importance weight $q/\mu$ repairs it, and
#   what the repair costs (the effective sample size);
# - why RL code does not simply sum over the vocabulary: the cost of the exact sum, measured with `klviz.exact_kl`.
#
# **Time**: about 25 minutes of reading, plus the panel and three exercises.
# **Runs in**: about 15 s on a 2-core CPU (measured under nbval; the heavy cells have a size knob at the top).
#
# Notation (the suite's one rule, see lesson 00): tokens come from the **sampler** $q$; the other policy is the
# **target** $p$; $r = p(x)/q(x)$; every estimator here estimates $\mathrm{KL}(q\,\|\,p)$, the divergence *from
# the sampler*. In `ppo_kl` the sampler is $\pi_\text{old}$, which produced the rollout.

# %%
import klviz
device = klviz.setup_notebook()

# %%
import math
import time

import numpy as np
import torch
from IPython.display import display

from klviz.plotting import COLORS, new_figure
from klviz.policies import TOY_VOCAB, move_policy, toy_sampler_logits
from klviz.sampling import (draw_tokens, ess_fraction, expected_ess_fraction, importance_weights,
                            running_mean, zipf_policy_pair)

# %% [markdown]
# ## 1. The question, on twelve tokens you can read
#
# **Question.** The rollout drew tokens from $q = \pi_\text{old}$. The code averages
# $g(x) = \log q(x) - \log p(x)$ over those tokens. The definition sums $q(x)\,g(x)$ over every token of the
# vocabulary. Why are these the same thing?
#
# **Intuition.** A token with $q(x) = 0.3$ turns up in about 30% of the draws. When you average over the draws, its
# term $g(x)$ is added in about 30% of the slots, so it is weighted by 0.3 without anyone multiplying by 0.3.
#
# **Math.** Group the $N$ draws by token: if token $x$ was drawn $n_x$ times,
#
# $$\frac1N\sum_{i=1}^N g(x_i) \;=\; \sum_x \frac{n_x}{N}\, g(x) \;\xrightarrow[N\to\infty]{}\; \sum_x q(x)\, g(x)
# = \mathbb{E}_{x\sim q}[g(x)],$$
#
# because $n_x/N \to q(x)$ (the law of large numbers). The first equality is plain bookkeeping, exact for every $N$.
# The weight is in the *frequency* of each token, not in a multiplication.
#
# **Code.** $q$ is a next-token distribution after "The cat sat on the"; $p$ is $q$ after a fine-tuning step
# that flattens the distribution and favours " sofa". We draw tokens from $q$ with an explicit generator (inverse CDF on uniform numbers).

# %%
log_q = toy_sampler_logits()                                  # the sampler q = pi_old
log_p = move_policy(log_q, temperature=1.5, push=1.0, push_token=1)  # p = pi_new: flatter, likes " sofa"
q, p = log_q.exp(), log_p.exp()
g = (log_q - log_p).double()                                  # g(x) = log q(x)/p(x): k1 of each token

exact = float((q.double() * g).sum())                         # sum_x q(x) g(x): the definition, P(i) included
N_TOY = 1_000
tokens = draw_tokens(q, N_TOY, generator=klviz.make_generator(0))
sample_mean = float(g[tokens].mean())                         # what RL code computes: no q(x) anywhere
counts = torch.bincount(tokens, minlength=len(TOY_VOCAB)).double()
regrouped = float((counts / N_TOY * g).sum())                 # the same draws, grouped by token

print(f"exact sum over the vocabulary    : {exact:.5f}")
print(f"plain mean over {N_TOY} draws        : {sample_mean:.5f}")
print(f"regrouped: sum_x (n_x/N) g(x)     : {regrouped:.5f}")
print()
print(f"{'token':>10} {'q(x)':>7} {'n_x/N':>7} {'g(x)':>8}")
for name, qx, fx, gx in zip(TOY_VOCAB, q.tolist(), (counts / N_TOY).tolist(), g.tolist()):
    print(f"{name.strip():>10} {qx:7.3f} {fx:7.3f} {gx:+8.3f}")

# %% [markdown]
# The plain mean and the regrouped sum agree to the last digit (that is the bookkeeping identity), and both are
# close to the exact sum (that is the law of large numbers). How close? A sample mean of $N$ independent draws
# has a standard error $\mathrm{SE} = s/\sqrt N$, with $s$ the standard deviation of one draw; an honest
# comparison allows a few standard errors, and every check in this suite is written that way. Each frequency
# $n_x/N$ is itself a sample mean (of the indicator "the draw was $x$"), with standard error
# $\sqrt{q(x)(1-q(x))/N}$.

# %%
se_toy = float(g[tokens].std() / math.sqrt(N_TOY))
print(f"plain mean - exact = {sample_mean - exact:+.5f}, standard error {se_toy:.5f}")
assert abs(sample_mean - regrouped) < 1e-12                   # bookkeeping: exact for every N
assert abs(sample_mean - exact) < 4 * se_toy                  # law of large numbers, within 4 SE
freq_se = torch.sqrt(q.double() * (1 - q.double()) / N_TOY)
assert bool((((counts / N_TOY) - q.double()).abs() < 4 * freq_se).all())   # n_x/N is close to q(x)

# %% [markdown]
# **Picture.** The counts divided by $N$ (black marks) sit on the bars of $q$, closer as $N$ grows:

# %%
fig, axes = new_figure(9.0, 3.2, ncols=2, sharey=True)
x = np.arange(len(TOY_VOCAB))
for ax, n in zip(axes, (100, 10_000)):
    c = torch.bincount(draw_tokens(q, n, generator=klviz.make_generator(1)), minlength=len(TOY_VOCAB))
    ax.bar(x, q.numpy(), color=COLORS["q"], label="q(x)")
    ax.plot(x, (c / n).numpy(), "_", color=COLORS["ink"], ms=12, mew=2.2, label="counts / N")
    ax.set_xticks(x, [t.strip() for t in TOY_VOCAB], rotation=40, ha="right")
    ax.set_title(f"N = {n:,} draws from q")
    ax.set_xlabel("next token")
axes[0].set_ylabel("probability")
axes[0].legend()
fig.suptitle("Draw frequencies are the weights q(x)")
display(fig)

# %% [markdown]
# **Takeaway.** Averaging over sampled tokens *is* weighting by the sampler's probabilities. No RL framework
# multiplies by $\pi_\text{old}(x)$, and none should: doing so would weight twice and estimate
# $\sum_x q(x)^2 g(x)$ instead (exercise 1 catches exactly this).
#
# ## 2. A vocabulary that feels real: 50,257 tokens
#
# Twelve tokens are easy. A real tokenizer has tens of thousands, with a few frequent tokens and a long tail of
# rare ones (a Zipf-like law: the $k$-th most frequent token has probability roughly $\propto k^{-1.1}$).
# Does averaging a few thousand draws still work when most tokens are never drawn at all?
#
# `zipf_policy_pair` builds such a $q$ over GPT-2's 50,257 token ids and a target $p$ that moved every logit a
# little (Gaussian noise of scale 0.5), as a fine-tuning step would. `klviz.exact_kl` sums over the whole vocabulary.

# %%
VOCAB = 50_257
N_BIG = 100_000          # draws; more: slower, tighter
log_q_big, log_p_big = zipf_policy_pair(VOCAB, exponent=1.1, nudge=0.5, generator=klviz.make_generator(2))
q_big = log_q_big.exp()
g_big = (log_q_big - log_p_big).double()
exact_big = float(klviz.exact_kl(log_q_big, log_p_big))       # sum over all 50,257 tokens

tokens_big = draw_tokens(q_big, N_BIG, generator=klviz.make_generator(3))
mean_big = float(g_big[tokens_big].mean())
se_big = float(g_big[tokens_big].std() / math.sqrt(N_BIG))
counts_big = torch.bincount(tokens_big, minlength=VOCAB)
seen = counts_big > 0
print(f"exact KL(q||p) over {VOCAB:,} tokens: {exact_big:.5f}")
print(f"mean of k1 over {N_BIG:,} draws     : {mean_big:.5f} ± {2 * se_big:.5f} (2 SE)")
print(f"tokens never drawn: {int((~seen).sum()):,} of {VOCAB:,} ({100 * float((~seen).float().mean()):.1f}%), "
      f"holding {100 * float(q_big[~seen].sum()):.1f}% of q's probability")
assert abs(mean_big - exact_big) < 4 * se_big

# %% [markdown]
# Most of the vocabulary is never drawn, yet the estimate lands within a few standard errors of the exact sum.
# The unseen tokens are many but light: together they hold a small share of $q$'s probability, and the
# estimator accounts for them *on average*: an unlucky sample that misses a token is balanced by samples that
# hit it. On the left, frequencies against rank on log-log axes: the draws follow $q$ wherever $q$ is large
# enough to be drawn. On the right, the exact sum accumulated over tokens in order of rank: the head of the
# distribution carries most of the sum.

# %%
order = torch.argsort(q_big, descending=True)
ranks = np.arange(1, VOCAB + 1)
freq_sorted = (counts_big[order].double() / N_BIG).numpy()
fig, (ax_l, ax_r) = new_figure(9.0, 3.4, ncols=2)
ax_l.loglog(ranks, q_big[order].numpy(), color=COLORS["q"], lw=2, label="q(x) by rank")
hit = freq_sorted > 0
ax_l.loglog(ranks[hit], freq_sorted[hit], ".", color=COLORS["ink"], ms=2, alpha=0.7, label=f"counts / N (N = {N_BIG:,})")
ax_l.axhline(1 / N_BIG, color=COLORS["mu"], ls=":", lw=1.2, label="one draw: 1/N")
ax_l.set_xlabel("rank of the token under q")
ax_l.set_ylabel("probability")
ax_l.set_title("Zipf-like vocabulary: draws track q")
ax_l.legend()
partial = torch.cumsum(q_big[order].double() * g_big[order], 0).numpy()
ax_r.semilogx(ranks, partial, color=COLORS["k1"], lw=1.8, label="sum of q(x) g(x) over the top-k tokens")
ax_r.axhline(exact_big, color=COLORS["exact"], ls="--", lw=1.2, label="exact KL(q‖p), all tokens")
ax_r.set_xlabel("k (tokens included, by rank)")
ax_r.set_ylabel("partial sum  [nats]")
ax_r.set_title("where the exact sum comes from")
span = partial.max() - partial.min()
ax_r.set_ylim(partial.min() - 0.45 * span, partial.max() + 0.05 * span)
ax_r.legend(loc="lower right")
display(fig)
head_share = float(partial[99] / exact_big)
print(f"the 100 most likely tokens (of {VOCAB:,}) carry {100 * head_share:.0f}% of the exact sum")
assert head_share > 0.5

# %% [markdown]
# ## 3. Convergence with N: the ±2 SE band
#
# **Question.** How many tokens does a trustworthy estimate need? **Intuition.** Each draw adds independent
# noise, and independent noise averages down like $1/\sqrt N$: a hundred times more tokens for ten times less
# error. **Math.** $\mathrm{SE}(N) = s/\sqrt N$, where $s^2 = \mathrm{Var}_q[g(x)]$; the mean lies within
# ±2 SE of the exact value in about 95% of runs.
#
# The cell draws `N_MAX` tokens once and follows the running mean of $k_1$ with its ±2 SE band (`running_mean`
# uses float64 sums, so even $10^7$ draws lose no precision). On a GPU it draws ten times more.

# %%
N_MAX = 10**7 if device.type == "cuda" else 10**6        # more: slower, tighter
gen = klviz.make_generator(4, device)
tokens_run = draw_tokens(q_big.to(device), N_MAX, generator=gen)
run = running_mean(g_big.to(device)[tokens_run])
final_mean, final_se = float(run["mean"][-1]), float(run["se"][-1])
print(f"after {N_MAX:,} draws: {final_mean:.5f} ± {2 * final_se:.5f}; exact {exact_big:.5f}")
assert abs(final_mean - exact_big) < 4 * final_se
# the band narrows like 1/sqrt(N): slope of log SE against log N, from N = 1,000 on
late = run["n"] >= 1_000
slope = float(np.polyfit(np.log(run["n"][late]), np.log(run["se"][late]), 1)[0])
print(f"log-log slope of SE against N: {slope:.3f} (1/sqrt(N) is -0.5)")
assert abs(slope + 0.5) < 0.05
j = int(np.searchsorted(run["n"], 4096))
print(f"with about {run['n'][j]:,} tokens (a modest batch): ± {2 * run['se'][j]:.3f} nats (2 SE)")
assert 0.01 < 2 * run["se"][j] < 0.02                     # "about ± 0.015 nats", the takeaway below

# %%
fig, (ax_l, ax_r) = new_figure(9.0, 3.4, ncols=2)
n = run["n"]
ax_l.fill_between(n, run["mean"] - 2 * run["se"], run["mean"] + 2 * run["se"], color=COLORS["k1"], alpha=0.2,
                  lw=0, label="± 2 SE")
ax_l.plot(n, run["mean"], color=COLORS["k1"], lw=1.3, label="running mean of k1")
ax_l.axhline(exact_big, color=COLORS["exact"], ls="--", lw=1.3, label="exact KL(q‖p)")
ax_l.set_xscale("log")
ax_l.set_ylim(exact_big - 0.25, exact_big + 0.25)
ax_l.set_xlabel("number of tokens N")
ax_l.set_ylabel("estimate  [nats]")
ax_l.set_title("running mean, 50,257-token vocabulary")
ax_l.legend(loc="upper right")
ax_r.loglog(n, np.abs(run["mean"] - exact_big) + 1e-12, color=COLORS["k1"], lw=1, label="|mean − exact|")
ax_r.loglog(n[1:], 2 * run["se"][1:], color=COLORS["ink"], lw=1.2, label="2 SE")   # from N = 2: one draw has no SE
ax_r.loglog(n, 2 * float(run["se"][-1]) * np.sqrt(n[-1] / n), color=COLORS["mu"], ls=":", lw=1.2,
            label="∝ 1/√N")
ax_r.set_ylim(1e-5, 10)
ax_r.set_xlabel("number of tokens N")
ax_r.set_ylabel("error  [nats]")
ax_r.set_title("the error shrinks like 1/√N")
ax_r.legend(loc="lower left")
display(fig)

# %% [markdown]
# **Takeaway.** For policies this close, a batch of a few thousand response tokens pins the KL down to about
# ± 0.015 nats (printed above): the *logged* KL of one step is a noisy number, and its noise is predictable.
#
# ## 4. Sampling from the wrong policy
#
# **Question.** PPO reuses one rollout for several minibatch updates. After the first update the policy is
# $\pi_\theta$, but the tokens still come from $\pi_\text{old}$. If we want $\mathrm{KL}(\pi_\theta\,\|\,\pi_\text{ref})$
# from those tokens, is the plain mean still right? (A common suggestion, "mix in samples from $p$"
# to estimate the KL better, raises the same question.)
#
# To keep the roles clear (the suite's one rule still holds: $p$ is the target, the expectation is over $q$):
#
# | symbol | role here | in PPO/GRPO code |
# |---|---|---|
# | $q$ | the policy the expectation is over: we want $\mathrm{KL}(q\,\|\,p)$ | $\pi_\theta$, the current policy |
# | $p$ | the target, the other side of the KL | $\pi_\text{ref}$, the frozen reference |
# | $\mu$ | the sampler that actually drew the tokens | $\pi_\text{old}$, the rollout policy |
#
# The importance weight is $q/\mu$: **the expectation's policy over the sampler**. It is not $p/q$, the ratio inside
# the estimators, and $p$ plays no part in it.
#
# **Intuition.** Tokens from $\mu$ turn up with frequency $\mu(x)$, so the plain mean weights each token by
# $\mu(x)$ and converges to $\mathbb{E}_\mu[g]$, the wrong sum. Multiply each term by
# $w(x) = q(x)/\mu(x)$ and the frequency $\mu(x)$ turns back into $q(x)$:
#
# $$\mathbb{E}_{x\sim\mu}\!\left[\frac{q(x)}{\mu(x)}\,g(x)\right] = \sum_x \mu(x)\frac{q(x)}{\mu(x)}g(x)
# = \sum_x q(x)\,g(x).$$
#
# This is **importance sampling** (重要性采样); it needs $\mu(x) > 0$ wherever $q(x) > 0$.

# %%
log_ref = toy_sampler_logits()                                   # p = pi_ref
log_q = move_policy(log_ref, temperature=0.8, push=1.5, push_token=1)  # q = pi_theta: the expectation's policy
log_mu = move_policy(log_ref, temperature=2.0)                   # mu = pi_old: drew the tokens (flatter)
q, mu = log_q.exp().double(), log_mu.exp().double()
g = (log_q - log_ref).double()                                   # log q/p, per token
kl = float((q * g).sum())                                        # KL(q || p), the target value
limit_plain = float((mu * g).sum())                              # E_mu[g]: where the plain mean goes

N_IS = 100_000
t_mu = draw_tokens(mu, N_IS, generator=klviz.make_generator(5))
plain = g[t_mu]
w = importance_weights(log_q, log_mu).double()[t_mu]            # q(x_i) / mu(x_i)
weighted = w * g[t_mu]
t_q = draw_tokens(q, N_IS, generator=klviz.make_generator(6))    # for comparison: tokens from q itself
on_policy = g[t_q]

from klviz.statistics import mean_se    # (mean, s / sqrt(N)), the suite's one home for it
rows = {"tokens from q, plain mean": mean_se(on_policy), "tokens from mu, plain mean": mean_se(plain),
        "tokens from mu, weights q/mu": mean_se(weighted)}
print(f"exact KL(q||p) = {kl:.4f};  E_mu[log q/p] = {limit_plain:.4f}")
for name, (m, s) in rows.items():
    print(f"{name:<30} {m:+.4f} ± {2 * s:.4f}   ({(m - kl) / s:+.1f} SE from the exact value)")

# %%
m_plain, s_plain = rows["tokens from mu, plain mean"]
m_w, s_w = rows["tokens from mu, weights q/mu"]
m_q, s_q = rows["tokens from q, plain mean"]
assert abs(m_q - kl) < 4 * s_q                     # on-policy: unbiased
assert abs(m_plain - limit_plain) < 4 * s_plain    # off-policy plain mean converges to E_mu[g] ...
assert abs(m_plain - kl) > 20 * s_plain            # ... which is far from the KL: biased
assert abs(m_w - kl) < 4 * s_w                     # importance weights remove the bias
assert s_w > s_q                                   # ... and cost variance
print(f"the weighted estimate's standard error is {s_w / s_q:.2f}x the on-policy one")

# %% [markdown]
# The weights remove the bias and cost variance. How much? Kish's **effective sample size** answers it in
# tokens: $\mathrm{ESS} = (\sum_i w_i)^2 / \sum_i w_i^2$. Equal weights give $N$; one dominant weight gives
# about 1. For large $N$,
#
# $$\frac{\mathrm{ESS}}{N} \;\to\; \frac{(\mathbb{E}_\mu w)^2}{\mathbb{E}_\mu w^2} = \frac{1}{\sum_x q(x)^2/\mu(x)}
# = \frac{1}{1+\chi^2(q\,\|\,\mu)}.$$
#
# (`ess_fraction` returns ESS/N with a delta-method standard error; `expected_ess_fraction` the limit.)

# %%
ess, ess_se = ess_fraction(w)
ess_limit = expected_ess_fraction(q, mu)
print(f"ESS/N measured {ess:.4f} ± {2 * ess_se:.4f}; large-N limit {ess_limit:.4f}: "
      f"{N_IS:,} weighted tokens are worth about {ess * N_IS:,.0f} tokens from q")
assert abs(ess - ess_limit) < 4 * ess_se

# %% [markdown]
# **Where the sampler is thin, the weights explode.** Move $\mu$'s temperature (here $\mu$ is the reference at a
# temperature $T$; $T = 1$ is $\mu = p$). ESS/N is largest, about 0.60, near $T \approx 0.71$, where $\mu$ comes closest
# to $q$ (q itself is the reference at temperature 0.8 with a push toward " sofa", so no $T$ reaches it exactly).
# Away from there it falls on both sides, but not alike: a flatter $\mu$ ($T$ above 1) still covers $q$'s tokens,
# so ESS/N declines slowly (0.45 at $T = 2$, 0.37 at $T = 4$) as more draws land on tokens $q$ rarely wants; a
# sharper $\mu$ almost never draws tokens that $q$ still likes, and when it does their weight $q/\mu$ is enormous:
# ESS/N collapses to 0.02 at $T = 0.25$. The lesson is about mismatch, not flatness: the best sampler is the one
# closest to $q$, and erring on the flat side is far cheaper than erring on the sharp side. Below, the large-N limit of ESS/N as a curve,
# and measured values (20,000 draws each) with ±2 SE. For the sharpest sampler the measured point sits
# well *above* the curve: the rare tokens that would carry the huge weights have not been drawn yet, so the
# sample looks healthier than the sampler is. A measured ESS can flatter a bad sampler; it cannot flatter a good one.

# %%
N_ESS = 20_000           # draws per measured point
temps_curve = np.geomspace(0.25, 4.0, 200)
limits = [expected_ess_fraction(q, move_policy(log_ref, temperature=float(t)).exp()) for t in temps_curve]
temps_meas = [0.25, 0.4, 0.5, 0.7, 1.0, 1.5, 2.0, 3.0, 4.0]
meas = []
for i, t in enumerate(temps_meas):
    log_m = move_policy(log_ref, temperature=t)
    tok = draw_tokens(log_m.exp(), N_ESS, generator=klviz.make_generator(100 + i))
    f, se = ess_fraction(importance_weights(log_q, log_m)[tok])
    meas.append((t, f, se, expected_ess_fraction(q, log_m.exp())))
for t, f, se, lim in meas:
    print(f"mu temperature {t:4.2f}: ESS/N measured {f:.4f} ± {2 * se:.4f}, limit {lim:.4f}")
# from temperature 0.5 on the weights stay moderate and the delta-method SE is trustworthy
assert all(abs(f - lim) < 4 * se for t, f, se, lim in meas if t >= 0.5)
# at 0.25 the sample has not met its heaviest weights: measured ESS far above the limit
t, f, se, lim = meas[0]
assert f > lim + 4 * se
# the peak: where mu comes closest to q; flatter falls slowly, sharper collapses
t_best = float(temps_curve[int(np.argmax(limits))])
kl_to_q = [float(klviz.categorical_kl(q, move_policy(log_ref, temperature=float(t)).exp())) for t in temps_curve]
print(f"ESS/N peaks at {max(limits):.2f} for temperature {t_best:.2f}; KL(q || mu) is smallest at "
      f"{float(temps_curve[int(np.argmin(kl_to_q))]):.2f}")
assert round(t_best, 2) == 0.71 and round(max(limits), 2) == 0.60
assert abs(t_best - float(temps_curve[int(np.argmin(kl_to_q))])) < 0.05     # the peak is where mu is closest to q
ess_at = {t: expected_ess_fraction(q, move_policy(log_ref, temperature=t).exp()) for t in (0.25, 2.0, 4.0)}
assert round(ess_at[2.0], 2) == 0.45 and round(ess_at[4.0], 2) == 0.37 and round(ess_at[0.25], 2) == 0.02

# %%
fig, ax = new_figure(10.0, 3.6)
ax.semilogx(temps_curve, limits, color=COLORS["mu"], lw=1.8, label="large-N limit 1/Σ q²/μ")
tm, fm, sm, _ = map(np.array, zip(*meas))
ax.errorbar(tm, fm, yerr=2 * sm, fmt="o", color=COLORS["ink"], ms=4, capsize=3, label=f"measured, N = {N_ESS:,} (± 2 SE)")
ax.axvline(1.0, color=COLORS["p"], lw=1.0, ls=":", label="T = 1: μ = p (the reference)")
ax.axvline(t_best, color=COLORS["q"], lw=1.6, ls="--", label=f"T = {t_best:.2f}: μ closest to q (peak)")
ax.set_xticks([0.25, 0.5, 1, 2, 4], ["0.25", "0.5", "1", "2", "4"])
ax.minorticks_off()
ax.set_xlabel("temperature of the sampler μ (below 1: sharper, above 1: flatter)")
ax.set_ylabel("ESS / N")
ax.set_ylim(0, 1)
ax.set_title("Importance weights cost samples: effective sample size")
ax.legend(loc="lower center", ncols=2)
display(fig)

# %% [markdown]
# **Takeaway.** Tokens from the wrong policy give a biased plain mean, with no warning in the logs. The weight
# $q/\mu$ (the expectation's policy over the sampler) removes the bias; it is what DeepSeek-V3.2's and TRL's
# `use_bias_correction_kl` "ratio-corrected k3" multiplies by. The price is variance, measured by the effective
# sample size; a sampler much sharper than the target can make that price ruinous, and a small sample may not
# even show it.
#
# ## 5. Why not sum over the vocabulary?
#
# **Question.** If the exact sum removes all sampling noise, why does RL code estimate the KL from one token per
# position? **Answer by measurement.** The exact KL at one position needs both models' full next-token
# distributions: $V$ numbers each. The estimate needs the log-probability of the sampled token under each
# model: one number each, which the rollout stores anyway. Below: a batch of `POSITIONS` token positions over a
# 50,257-token vocabulary; exact per-position KL with `klviz.exact_kl` (chunked, so memory stays small) against
# the per-token estimate $k_3$ from the two stored log-probabilities.
#
# (Computing a token's log-probability still needs a log-sum-exp over the vocabulary inside the forward pass;
# frameworks fuse that. What the exact sum adds is keeping both models' full distributions for every position
# at once, and moving them between the actor and the reference workers.)

# %%
POSITIONS = 256                  # token positions; more: slower (512 takes about twice as long)
V = 50_257
gen = klviz.make_generator(7)
base = klviz.policies.zipf_logits(V, 1.1, generator=gen)
q_logits = torch.randn(POSITIONS, V, generator=gen).add_(base)        # policy logits, per position (in place: 50 MB less)
p_logits = torch.randn(POSITIONS, V, generator=gen).mul_(0.3).add_(q_logits)  # reference logits

t0 = time.perf_counter()
kl_exact = klviz.exact_kl(q_logits, p_logits, chunk_elements=2**22)   # [POSITIONS]: the full sum (4M numbers at a time)
t_exact = time.perf_counter() - t0

# what a rollout keeps: one sampled token per position and its log-prob under each model
tok = torch.cat([torch.multinomial(torch.softmax(rows, -1), 1, generator=gen) for rows in q_logits.split(32)]).squeeze(-1)  # 32 positions at a time: the same draws, 100 MB less
logprob = torch.log_softmax(q_logits, -1).gather(-1, tok[:, None]).squeeze(-1)
ref_logprob = torch.log_softmax(p_logits, -1).gather(-1, tok[:, None]).squeeze(-1)
t0 = time.perf_counter()
k3_tok = klviz.k3(ref_logprob - logprob)                              # log r = log p - log q
t_est = time.perf_counter() - t0

est, est_se = float(k3_tok.mean()), float(k3_tok.std() / math.sqrt(POSITIONS))
print(f"exact KL, mean over positions : {float(kl_exact.mean()):.5f}   ({t_exact * 1e3:8.1f} ms)")
print(f"k3 from stored log-probs      : {est:.5f} ± {2 * est_se:.5f}   ({t_est * 1e3:8.3f} ms)")
print(f"numbers needed: exact {2 * POSITIONS * V:,}, estimate {2 * POSITIONS:,} (ratio {V:,})")
assert abs(est - float(kl_exact.mean())) < 4 * est_se

# %% [markdown]
# At training scale the ratio is what matters. A modest GRPO step with 256 responses of 1,024 tokens and a
# 151,936-token vocabulary (the Qwen2.5 tokenizer) would need, for the exact sum, both models' full
# distributions in bf16 (2 bytes per number):

# %%
responses, tokens_per_response, vocab_qwen, bytes_bf16 = 256, 1024, 151_936, 2
full = 2 * responses * tokens_per_response * vocab_qwen * bytes_bf16
sampled = 2 * responses * tokens_per_response * bytes_bf16
print(f"exact sum: {full / 2**30:,.1f} GiB of logits per step; per-token estimate: {sampled / 2**20:.1f} MiB")

# %% [markdown]
# This is why verl's `kl_penalty` raises `NotImplementedError` for `"full"`, and why TRL's legacy code and
# ROLL compute the full sum only as an option (`F.kl_div(ref_logprob, logprob, log_target=True).sum(-1)`, with
# full log-prob tensors). A middle road exists: at each *sampled prefix*, sum the next-token KL exactly over
# the vocabulary (Amini, Vieira and Cotterell's Rao-Blackwellized estimator): never more variance than
# sampling the token, at the cost of the full distributions at every position.
#
# ## 6. The panel: move the sampler and the target
#
# Three policies over the twelve tokens: $q$ (grey, movable: push " sofa", change its temperature), the fixed
# reference $p$ (purple dots), and the stale sampler $\mu$ (red, movable). The toggle says where the tokens come
# from and how they are averaged. Left: draw frequencies (black marks) against the bars; right: the running
# mean of $\log q/p$ with its ±2 SE band, the exact $\mathrm{KL}(q\,\|\,p)$ (dashed) and, when the tokens come
# from $\mu$ without weights, the value the plain mean converges to instead (dotted).
#
# Things to try:
# 1. **samples from q**, then raise N: the band narrows like $1/\sqrt N$ around the dashed line.
# 2. **samples from μ**: the black marks sit on the red bars, and the running mean settles on the dotted line.
# 3. **with importance weights**: the weighted marks return to the grey bars, the mean to the dashed line,
#    and the effective sample size drops below N.
# 4. Set μ's temperature to 0.3 with weights on: the ESS collapses, and the running mean jumps whenever a
#    rare token with a huge weight appears (try a few seeds).

# %%
from klviz.widgets.lesson01 import SamplingPanel

panel = SamplingPanel(device)
panel

# %%
# the panel's numbers obey the lesson: unbiased from q, biased from mu, unbiased again with weights
for mode in ("q", "mu", "weighted"):
    d = panel.set(mode=mode, num_samples=100_000)
    assert panel.last_error is None
    target = d["biased_limit"] if mode == "mu" else d["exact"]
    assert abs(d["estimate"] - target) < 4 * d["se"], mode
assert panel.last["ess"] < panel.last["num_samples"]
panel.set(mode="q", num_samples=10_000);


# %% [markdown]
# ## Takeaways
#
# - $\frac1N\sum_i g(x_i)$ over tokens drawn from $q$ equals $\sum_x \frac{n_x}{N} g(x)$ exactly; the counts
#   $n_x/N$ converge to $q(x)$. The "missing" $P(i)$ is the draw frequency. Never multiply by it again.
# - The estimate's error shrinks like $1/\sqrt N$; report it with its standard error, $s/\sqrt N$.
# - A batch mean over the tokens of real responses averages over more than the token: each position has its own
#   next-token distribution, so the mean also averages over the prefixes the sampler happened to visit. It
#   estimates the KL per position averaged over the sampler's prefixes (the sequence-level picture is lesson 04's).
# - On a 50k-token vocabulary most tokens are never drawn in a batch, and the estimate is still unbiased: the
#   unseen tokens are accounted for on average.
# - Tokens from another policy $\mu$ bias the plain mean towards $\mathbb{E}_\mu[g]$. The weight $q/\mu$ (the
#   expectation's policy over the sampler) removes the bias and costs effective samples:
#   $\mathrm{ESS}/N \to 1/(1+\chi^2(q\,\|\,\mu))$.
# - The exact sum needs both models' full distributions at every position, $V$ times more numbers than the
#   per-token estimate; that is why RL code samples.
#
# ## Exercises
#
# Each exercise has a skeleton: replace the `...` and run the cell; `klviz.check` tests your function on cases
# you have not seen and says what is wrong. A solution follows each exercise in a collapsed cell.
#
# **Exercise 1: estimate without q.** `tokens` were drawn from `q`; `g[x]` is a value per token. Return the
# estimate of $\sum_x q(x)\,g(x)$ that RL code would compute from the draws. (`q` is passed in; do you need it?)

# %%
def estimate_from_draws(tokens, g, q):
    ...

klviz.check.lesson01.estimate_from_draws(estimate_from_draws)


# %%
# solution
def estimate_from_draws(tokens, g, q):
    return g[tokens].mean()          # the frequencies carry q: no q(x) factor

assert klviz.check.lesson01.estimate_from_draws(estimate_from_draws)


# %% [markdown]
# **Exercise 2: tokens from the wrong policy.** `tokens` were drawn from $\mu$ (log-probabilities `log_mu`).
# Return an *unbiased* estimate of $\sum_x q(x)\,g(x)$.

# %%
def weighted_estimate(tokens, g, log_q, log_mu):
    ...

klviz.check.lesson01.weighted_estimate(weighted_estimate)


# %%
# solution
def weighted_estimate(tokens, g, log_q, log_mu):
    w = torch.exp(log_q - log_mu)[tokens]          # the expectation's policy over the sampler
    return (w * g[tokens]).mean()

assert klviz.check.lesson01.weighted_estimate(weighted_estimate)


# %% [markdown]
# **Exercise 3: effective sample size.** Given the importance weights of $N$ draws, return Kish's effective
# sample size: $N$ when all weights are equal, about 1 when one weight dominates, and unchanged when every weight
# is multiplied by the same constant.

# %%
def effective_sample_size(weights):
    ...

klviz.check.lesson01.effective_sample_size(effective_sample_size)


# %%
# solution
def effective_sample_size(weights):
    return weights.sum() ** 2 / (weights ** 2).sum()

assert klviz.check.lesson01.effective_sample_size(effective_sample_size)

# %% [markdown]
# ## References
#
# - J. Schulman, [Approximating KL Divergence](http://joschu.net/blog/kl-approx.html) (2020): the estimators
#   of lesson 02 start from exactly this sample mean.
# - A. B. Owen, [Monte Carlo theory, methods and examples](https://artowen.su.domains/mc/), chapter 9
#   (importance sampling, effective sample size, self-normalised estimates).
# - L. Kish, *Survey Sampling* (Wiley, 1965): the effective sample size $(\sum w)^2/\sum w^2$.
# - verl, [`kl_penalty` and `ppo_kl` in core_algos.py](https://github.com/volcengine/verl/blob/main/verl/trainer/ppo/core_algos.py):
#   per-token estimates, `"full"` not implemented.
# - TRL issues [#2854](https://github.com/huggingface/trl/issues/2854) and
#   [#3104](https://github.com/huggingface/trl/issues/3104): "why isn't this the KL formula?"
# - A. Amini, T. Vieira, R. Cotterell, [Better Estimation of the KL Divergence Between Language Models](https://arxiv.org/abs/2504.10637)
#   (2025): the Rao-Blackwellized estimator.
# - Next: lesson 02 (k1, k2, k3), lesson 03 (why k3 is never negative).
