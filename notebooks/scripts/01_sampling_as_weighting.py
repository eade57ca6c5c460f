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
# - what goes wrong when the tokens come from another policy $\mu$, how the importance weight $\pi/\mu$ (the policy the average is over, divided by the sampler) repairs it, and
#   what the repair costs (the effective sample size);
# - why RL code does not simply sum over the vocabulary: the cost of the exact sum, measured with `klviz.exact_kl`.
#
# **Time**: about 35 minutes of reading (prose and code), plus the panel and three exercises.
# **Runs in**: about 15 s on a 2-core CPU (measured under nbval; the heavy cells have a size knob at the top).
#
# Notation (lesson 00's rule): tokens come from the **sampler** $q$; the other policy is the **target** $p$;
# $r = p(x)/q(x)$; k1, k2 and k3 estimate $\mathrm{KL}(q\,\|\,p)$, the divergence *from the sampler*. In `ppo_kl`
# the sampler is $\pi_\text{old}$, which produced the rollout. Section 4 needs a third policy: there the policy the
# expectation is over is called $\pi$ and the sampler $\mu$, so that $q$ keeps meaning "the sampler" everywhere.

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
from klviz.sampling import (draw_tokens, ess_fraction, expected_ess_fraction, importance_variance_ratio,
                            importance_weights, running_mean, zipf_policy_pair)
from klviz.statistics import clustered_mean_se, mean_se, plus_minus   # the suite's one home for "mean ± 2 SE"

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
freq_se = torch.sqrt(q.double() * (1 - q.double()) / N_TOY)
print(f"largest |n_x/N - q(x)|: {float(((counts / N_TOY) - q.double()).abs().max()):.4f} "
      f"(its own standard error: {float(freq_se[int(((counts / N_TOY) - q.double()).abs().argmax())]):.4f})")

# %%
assert abs(sample_mean - regrouped) < 1e-12                   # bookkeeping: exact for every N
assert abs(sample_mean - exact) < 4 * se_toy                  # law of large numbers, within 4 SE
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
# **Takeaway.** Averaging over sampled tokens *is* weighting by the sampler's probabilities. Code that averages
# over sampled tokens needs no factor $\pi_\text{old}(x)$, and must not add one: it would weight twice and estimate
# $\sum_x q(x)^2 g(x)$ instead (exercise 1 catches exactly this).
#
# ## 2. A vocabulary that feels real: 50,257 tokens
#
# Twelve tokens are easy. A real tokenizer has tens of thousands, with a few frequent tokens and a long tail of
# rare ones (a Zipf-like law: the $k$-th most frequent token has probability roughly $\propto k^{-1.1}$).
# Does averaging a few thousand draws still work when most tokens are never drawn at all?
#
# `zipf_policy_pair` builds such a $q$ over GPT-2's 50,257 token ids and a target $p$ that moved every logit a
# little (Gaussian noise of scale 0.5), as a fine-tuning step would. `klviz.exact_kl` sums over the whole vocabulary,
# over non-negative terms (in float64 wherever float32 cannot vouch for the result), so it stays accurate even for a
# tiny KL between two float32 models
# ([checked on 2,000 random token pairs](claims.md#exact-kl-accurate)).

# %%
VOCAB = 50_257
N_BIG = 100_000          # draws; more: slower, tighter
log_q_big, log_p_big = zipf_policy_pair(VOCAB, exponent=1.1, nudge=0.5, generator=klviz.make_generator(2))
q_big = log_q_big.exp()
g_big = (log_q_big - log_p_big).double()
exact_big = float(klviz.exact_kl(log_q_big, log_p_big))       # sum over all 50,257 tokens

tokens_big = draw_tokens(q_big, N_BIG, generator=klviz.make_generator(3))
mean_big, se_big = mean_se(g_big[tokens_big])
counts_big = torch.bincount(tokens_big, minlength=VOCAB)
seen = counts_big > 0
print(f"exact KL(q||p) over {VOCAB:,} tokens: {exact_big:.5f}")
print(f"mean of k1 over {N_BIG:,} draws     : {plus_minus(mean_big, se_big, '.5f')}")
print(f"tokens never drawn: {int((~seen).sum()):,} of {VOCAB:,} ({100 * float((~seen).float().mean()):.1f}%), "
      f"holding {100 * float(q_big[~seen].sum()):.1f}% of q's probability")

# %%
assert abs(mean_big - exact_big) < 4 * se_big

# %% [markdown]
# Most of the vocabulary is never drawn, yet the estimate lands within a few standard errors of the exact sum.
# The unseen tokens are many but light: together they hold a small share of $q$'s probability, and the
# estimator accounts for them *on average*: an unlucky sample that misses a token is balanced by samples that
# hit it. On the left, frequencies against rank on log-log axes: the draws follow $q$ wherever $q$ is large
# enough to be drawn.
#
# On the right, *where the exact sum comes from*. That question has no answer until one picks how to split the
# sum into terms: the textbook terms $q(x)\log\frac{q(x)}{p(x)}$ have both signs (negative wherever $p > q$), so their
# running total jumps and falls back (dashed: the top token alone would "carry" 77 % of the KL), and its shape
# says more about the order of the tokens than about where the divergence lives. Written as $\sum_x q(x)\,k_3(x)$, the same KL is a sum of
# terms that are never negative (lesson 03), and their running total, in order of rank under $q$, climbs to the KL:
# the share after the top $k$ tokens is the share of the divergence they carry.

# %%
order = torch.argsort(q_big, descending=True)
ranks = np.arange(1, VOCAB + 1)
log_grid = np.unique(np.geomspace(1, VOCAB, 2_000).astype(int)) - 1   # 2,000 ranks even on a log axis: same lines, light figure
freq_sorted = (counts_big[order].double() / N_BIG).numpy()
fig, (ax_l, ax_r) = new_figure(9.0, 3.4, ncols=2)
ax_l.loglog(ranks[log_grid], q_big[order].numpy()[log_grid], color=COLORS["q"], lw=2, label="q(x) by rank")
hit = freq_sorted > 0
ax_l.loglog(ranks[hit], freq_sorted[hit], ".", color=COLORS["ink"], ms=2, alpha=0.7, label=f"counts / N (N = {N_BIG:,})")
ax_l.axhline(1 / N_BIG, color=COLORS["mu"], ls=":", lw=1.2, label="one draw: 1/N")
ax_l.set_xlabel("rank of the token under q")
ax_l.set_ylabel("probability")
ax_l.set_title("Zipf-like vocabulary: draws track q")
ax_l.legend()
lq64, lp64 = torch.log_softmax(log_q_big.double(), -1), torch.log_softmax(log_p_big.double(), -1)
terms_k3 = (lq64.exp() * klviz.k3(lp64 - lq64))[order]          # q(x) k3(x) >= 0: they sum to the KL
terms_k1 = (lq64.exp() * (lq64 - lp64))[order]                   # q(x) log q(x)/p(x): both signs
share_k3 = torch.cumsum(terms_k3, 0).numpy() / exact_big
share_k1 = torch.cumsum(terms_k1, 0).numpy() / exact_big
ax_r.semilogx(ranks[log_grid], share_k3[log_grid], color=COLORS["k3"], lw=1.8, label="Σ q·k3 over the top-k tokens (terms ≥ 0)")
ax_r.semilogx(ranks[log_grid], share_k1[log_grid], color=COLORS["k1"], lw=1.0, ls="--", label="Σ q·log(q/p) (signed terms)")
ax_r.axhline(1.0, color=COLORS["exact"], ls=":", lw=1.2, label="the whole KL(q‖p)")
ax_r.set_xlabel("k (tokens included, by rank under q)")
ax_r.set_ylabel("running total / KL")
ax_r.set_title("where the exact sum comes from (two ways to split it)")
ax_r.set_ylim(min(0.0, float(share_k1.min())) - 0.05, max(1.05, float(share_k1.max()) + 0.05))
ax_r.legend(loc="lower right", fontsize=8)
display(fig)
heads = {k: float(share_k3[k - 1]) for k in (1, 100, 1000)}
print("share of the KL carried by the top-k tokens (non-negative terms q·k3): "
      + ", ".join(f"top {k:,}: {100 * v:.0f}%" for k, v in heads.items()))
first_1000 = share_k1[:1000]
print(f"signed terms q·log(q/p): the top token alone gives {100 * share_k1[0]:.0f}% of the KL; over the top 1,000 "
      f"the running total wanders between {100 * first_1000.min():.0f}% and {100 * first_1000.max():.0f}%")

# %%
# they add up to the KL (exact_kl from float32 logits: within its documented float32 bound)
assert abs(float(terms_k3.sum()) - exact_big) < klviz.divergences.FLOAT32_RELATIVE_ERROR * exact_big
assert bool((terms_k3 >= 0).all()) and bool((terms_k1 < 0).any())      # one split is one-signed, the other is not
assert [round(100 * v) for v in heads.values()] == [20, 56, 75] and round(100 * share_k1[0]) == 77

# %% [markdown]
# ## 3. Convergence with N: the ±2 SE band
#
# **Question.** How many tokens does a trustworthy estimate need? **Intuition.** Each draw adds independent
# noise, and independent noise averages down like $1/\sqrt N$: a hundred times more tokens for ten times less
# error. **Math.** $\mathrm{SE}(N) = s/\sqrt N$, where $s^2 = \mathrm{Var}_q[g(x)]$. Once $N$ is large enough for
# the mean to be nearly normal (the central limit theorem), it lies within ±2 SE of the exact value in about 95% of
# runs. How large is "large enough" depends on the tails: a token that $q$ rarely draws but whose $\log r$ is large
# keeps the distribution of the mean skewed for a long time. With k1 on random token pairs, $N = 4{,}096$ draws
# covered the exact KL within ±2 SE for only 84 % of them ([checked on 1,955 random token pairs](claims.md#coverage-2se-tokens)).
#
# The cell draws `N_MAX` tokens once and follows the running mean of $k_1$ with its ±2 SE band (`running_mean`
# uses float64 sums, so even $10^7$ draws lose no precision). On a GPU it draws ten times more.

# %%
N_MAX = 10**7 if device.type == "cuda" else 10**6        # more: slower, tighter
gen = klviz.make_generator(4, device)
tokens_run = draw_tokens(q_big.to(device), N_MAX, generator=gen)
run = running_mean(g_big.to(device)[tokens_run])
del tokens_run                                            # only the running sums are kept
final_mean, final_se = float(run["mean"][-1]), float(run["se"][-1])
print(f"after {N_MAX:,} draws: {plus_minus(final_mean, final_se, '.5f')}; exact {exact_big:.5f}")
# the band narrows like 1/sqrt(N): slope of log SE against log N, from N = 1,000 on
late = run["n"] >= 1_000
slope = float(np.polyfit(np.log(run["n"][late]), np.log(run["se"][late]), 1)[0])
print(f"log-log slope of SE against N: {slope:.3f} (1/sqrt(N) is -0.5)")
j = int(np.searchsorted(run["n"], 4096))
print(f"with about {run['n'][j]:,} independent draws from this q: ± {2 * run['se'][j]:.3f} nats (2 SE)")

# %%
assert abs(final_mean - exact_big) < 4 * final_se
assert abs(slope + 0.5) < 0.05
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
# **Takeaway.** A few thousand *independent draws from one next-token distribution* pin this KL down to about
# ± 0.015 nats (2 SE, printed above). The tokens of a real batch are neither: each position of a response has its own
# next-token distribution, and the tokens of one response move together (a response that strays from the reference
# early keeps straying). The honest unit of independence is the response. `klviz.statistics.clustered_mean_se`
# computes the token mean's standard error with responses as the independent units; here it is, on 120 responses
# that lesson 04's tiny language model wrote (its log-probabilities and the reference's, stored in the package):

# %%
from klviz.diagnose import sample_rollouts_path

batch = np.load(sample_rollouts_path())
k1_batch = torch.from_numpy(batch["logprob"] - batch["ref_logprob"]).double()   # tokens from the policy
mask = torch.from_numpy(batch["response_mask"]).bool()
naive = mean_se(k1_batch[mask])                  # as if every token were an independent draw
clustered = clustered_mean_se(k1_batch, mask)    # responses as the independent units
print(f"{int(mask.sum()):,} tokens in {mask.shape[0]} responses: token mean of k1")
print(f"  treating tokens as independent : {plus_minus(*naive, '.4f')}")
print(f"  responses as independent units : {plus_minus(*clustered, '.4f')}   "
      f"({clustered[1] / naive[1]:.2f} x the first standard error)")

# %%
assert abs(naive[0] - clustered[0]) < 1e-12 and 0.8 < clustered[1] / naive[1] < 1.2
assert abs(2 * clustered[1] - 0.015) < 0.002 and int(mask.sum()) == 3742 and mask.shape[0] == 120

# %% [markdown]
# Here the two standard errors are close (this tiny model's tokens are nearly independent given the prompt);
# in a large model's long responses they need not be, and the clustered one is the standard error that allows for
# it. The mean itself also changes meaning over a batch: averaged over the response tokens it estimates the
# next-token KL averaged over positions and over the prefixes the sampler visited, which is the sequence KL divided by
# the response length; summed over each response, k1 estimates the sequence KL itself ([checked on 1,000 random sequence policies](claims.md#sequence-token-mean)).
#
# ## 4. Sampling from the wrong policy
#
# **Question.** PPO reuses one rollout for several minibatch updates. After the first update the policy is
# $\pi_\theta$, but the tokens still come from $\pi_\text{old}$. If we want $\mathrm{KL}(\pi_\theta\,\|\,\pi_\text{ref})$
# from those tokens, is the plain mean still right? (A common suggestion, "mix in samples from $p$"
# to estimate the KL better, raises the same question.)
#
# Three policies now, so three letters. The sampler, lesson 00's $q$, is written $\mu$ in this section, so that the letter $q$ is never used for another policy:
#
# | symbol | role here | in PPO/GRPO code |
# |---|---|---|
# | $\pi$ | the policy the expectation is over: we want $\mathrm{KL}(\pi\,\|\,p)$ | $\pi_\theta$, the current policy |
# | $p$ | the target, the other side of the KL | $\pi_\text{ref}$, the frozen reference |
# | $\mu$ | the sampler that actually drew the tokens | $\pi_\text{old}$, the rollout policy |
#
# The importance weight is $\pi/\mu$: **the expectation's policy over the sampler**. It is not $p/\pi$, the ratio inside
# the estimators, and $p$ plays no part in it.
#
# **Intuition.** Tokens from $\mu$ turn up with frequency $\mu(x)$, so the plain mean weights each token by
# $\mu(x)$ and converges to $\mathbb{E}_\mu[g]$, the wrong sum. Multiply each term by
# $w(x) = \pi(x)/\mu(x)$ and the frequency $\mu(x)$ turns back into $\pi(x)$:
#
# $$\mathbb{E}_{x\sim\mu}\!\left[\frac{\pi(x)}{\mu(x)}\,g(x)\right] = \sum_x \mu(x)\frac{\pi(x)}{\mu(x)}g(x)
# = \sum_x \pi(x)\,g(x).$$
#
# This is **importance sampling** (重要性采样); it needs $\mu(x) > 0$ wherever $\pi(x) > 0$.

# %%
log_ref = toy_sampler_logits()                                   # p = pi_ref
log_pi = move_policy(log_ref, temperature=0.8, push=1.5, push_token=1)  # pi = pi_theta: the expectation's policy
log_mu = move_policy(log_ref, temperature=2.0)                   # mu = pi_old: drew the tokens (flatter)
pi, mu = log_pi.exp().double(), log_mu.exp().double()
g = (log_pi - log_ref).double()                                  # log pi/p, per token
kl = float((pi * g).sum())                                       # KL(pi || p), the target value
limit_plain = float((mu * g).sum())                              # E_mu[g]: where the plain mean goes

N_IS = 100_000
t_mu = draw_tokens(mu, N_IS, generator=klviz.make_generator(5))
plain = g[t_mu]
w = importance_weights(log_pi, log_mu).double()[t_mu]           # pi(x_i) / mu(x_i)
weighted = w * g[t_mu]
t_pi = draw_tokens(pi, N_IS, generator=klviz.make_generator(6))  # for comparison: tokens from pi itself
on_policy = g[t_pi]

rows = {"tokens from pi, plain mean": mean_se(on_policy), "tokens from mu, plain mean": mean_se(plain),
        "tokens from mu, weights pi/mu": mean_se(weighted)}
print(f"exact KL(pi||p) = {kl:.4f};  E_mu[log pi/p] = {limit_plain:.4f}")
for name, (m, s) in rows.items():
    print(f"{name:<30} {plus_minus(m, s, '+.4f'):<26} ({(m - kl) / s:+.1f} SE from the exact value)")
m_plain, s_plain = rows["tokens from mu, plain mean"]
m_w, s_w = rows["tokens from mu, weights pi/mu"]
m_pi, s_pi = rows["tokens from pi, plain mean"]
print(f"the weighted estimate's standard error is {s_w / s_pi:.2f}x the on-policy one")

# %%
assert abs(m_pi - kl) < 4 * s_pi                   # on-policy: unbiased
assert abs(m_plain - limit_plain) < 4 * s_plain    # off-policy plain mean converges to E_mu[g] ...
assert abs(m_plain - kl) > 20 * s_plain            # ... which is far from the KL: biased
assert abs(m_w - kl) < 4 * s_w                     # importance weights remove the bias
assert s_w > s_pi                                  # ... and, here, cost variance

# %% [markdown]
# The weights remove the bias, and here they cost variance: the weighted mean's standard error is 1.83 times
# the on-policy one (weights *can* lower the variance for a well-chosen sampler; a stale policy is not chosen for
# that). How many tokens are the weighted ones worth? Two answers:
#
# - **For this $g$, exactly.** The variance of one weighted draw over that of one on-policy draw is
#   $\mathrm{Var}_\mu(w\,g)/\mathrm{Var}_\pi(g)$ (`importance_variance_ratio`, by enumeration); $N$ weighted tokens
#   are worth $N$ divided by it.
# - **For any $g$, as a rule of thumb.** Kish's **effective sample size**, $\mathrm{ESS} = (\sum_i w_i)^2 / \sum_i w_i^2$,
#   looks only at the weights: equal weights give $N$, one dominant weight about 1, and for large $N$
#
# $$\frac{\mathrm{ESS}}{N} \;\to\; \frac{(\mathbb{E}_\mu w)^2}{\mathbb{E}_\mu w^2} = \frac{1}{\sum_x \pi(x)^2/\mu(x)}
# = \frac{1}{1+\chi^2(\pi\,\|\,\mu)}.$$
#
# It ignores what is being averaged, so it can be off for the $g$ at hand, in either direction.
# (`ess_fraction` returns ESS/N with a delta-method standard error; `expected_ess_fraction` the limit.)

# %%
ess, ess_se = ess_fraction(w)
ess_limit = expected_ess_fraction(pi, mu)
ratio_g = importance_variance_ratio(pi, mu, g)
print(f"for g = log pi/p: Var_mu(w g) / Var_pi(g) = {ratio_g:.2f} (standard errors {math.sqrt(ratio_g):.2f}x): "
      f"{N_IS:,} weighted tokens are worth {N_IS / ratio_g:,.0f} tokens from pi")
print(f"Kish's rule of thumb: ESS/N measured {plus_minus(ess, ess_se, '.4f')}, large-N limit {ess_limit:.4f}: "
      f"{N_IS:,} weighted tokens 'are worth' about {ess * N_IS:,.0f}")

# %%
assert abs(ess - ess_limit) < 4 * ess_se
assert abs(math.sqrt(ratio_g) - s_w / s_pi) < 0.05                       # the exact ratio is what the samples showed
assert round(ratio_g, 2) == 3.39 and round(N_IS / ratio_g, -2) == 29_500 and round(ess * N_IS, -3) == 45_000
assert round(s_w / s_pi, 2) == 1.83

# %% [markdown]
# **Where the sampler is thin, the weights explode.** Move $\mu$'s temperature (here $\mu$ is the reference at a
# temperature $T$; $T = 1$ is $\mu = p$). ESS/N is largest, about 0.60, near $T \approx 0.71$, where $\chi^2(\pi\,\|\,\mu)$
# is smallest and $\mu$ also comes closest to $\pi$ in KL ($\pi$ is the reference at temperature 0.8 with a push toward
# " sofa", so no $T$ reaches it exactly). Away from there it falls on both sides, but not alike: a flatter $\mu$ ($T$
# above 1) still covers $\pi$'s tokens, so ESS/N declines slowly (0.45 at $T = 2$, 0.37 at $T = 4$) as more draws land
# on tokens $\pi$ rarely wants; a sharper $\mu$ almost never draws tokens that $\pi$ still likes, and when it does their
# weight $\pi/\mu$ is enormous: ESS/N collapses to 0.02 at $T = 0.25$. For samplers that are tempered copies of $\pi$
# itself the lopsidedness is exact: sharper by a temperature factor $c$ always leaves fewer effective samples than
# flatter by the same factor ([checked on 2,000 random token distributions](claims.md#ess-sharper-costs-more)). Below, the large-N limit of ESS/N as a curve, and
# measured values (20,000 draws each) with ±2 SE. For the sharpest sampler the measured point sits well *above* the
# curve: the rare tokens that would carry the huge weights have not been drawn yet, so the sample looks healthier
# than the sampler is. A measured ESS can flatter a bad sampler.

# %%
N_ESS = 20_000           # draws per measured point
temps_curve = np.geomspace(0.25, 4.0, 200)
limits = [expected_ess_fraction(pi, move_policy(log_ref, temperature=float(t)).exp()) for t in temps_curve]
temps_meas = [0.25, 0.4, 0.5, 0.7, 1.0, 1.5, 2.0, 3.0, 4.0]
meas = []
for i, t in enumerate(temps_meas):
    log_m = move_policy(log_ref, temperature=t)
    tok = draw_tokens(log_m.exp(), N_ESS, generator=klviz.make_generator(100 + i))
    f, se = ess_fraction(importance_weights(log_pi, log_m)[tok])
    meas.append((t, f, se, expected_ess_fraction(pi, log_m.exp())))
for t, f, se, lim in meas:
    print(f"mu temperature {t:4.2f}: ESS/N measured {plus_minus(f, se, '.4f')}, limit {lim:.4f}")
t_best = float(temps_curve[int(np.argmax(limits))])
kl_to_pi = [float(klviz.categorical_kl(pi, move_policy(log_ref, temperature=float(t)).exp())) for t in temps_curve]
print(f"ESS/N peaks at {max(limits):.2f} for temperature {t_best:.2f}; KL(pi || mu) is smallest at "
      f"{float(temps_curve[int(np.argmin(kl_to_pi))]):.2f}")
ess_at = {t: expected_ess_fraction(pi, move_policy(log_ref, temperature=t).exp()) for t in (0.25, 2.0, 4.0)}
print("ESS/N limit at temperature " + ", ".join(f"{t}: {v:.2f}" for t, v in ess_at.items()))

# %%
# from temperature 0.5 on the weights stay moderate and the delta-method SE is trustworthy
assert all(abs(f - lim) < 4 * se for t, f, se, lim in meas if t >= 0.5)
# at 0.25 the sample has not met its heaviest weights: measured ESS far above the limit
t, f, se, lim = meas[0]
assert f > lim + 4 * se
# the peak: where chi²(pi || mu) is smallest, here also where mu is closest to pi in KL
assert round(t_best, 2) == 0.71 and round(max(limits), 2) == 0.60
assert abs(t_best - float(temps_curve[int(np.argmin(kl_to_pi))])) < 0.05
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
# $\pi/\mu$ (the expectation's policy over the sampler) removes the bias: it is what TRL's `use_bias_correction_kl`
# (on by default) and DeepSeek-V3.2's "ratio-corrected k3" multiply k3 by, so that its average over $\pi_\text{old}$'s
# tokens is $\mathrm{KL}(\pi\,\|\,\pi_\text{ref})$ again on every minibatch ([checked on 2,000 random token pairs](claims.md#ratio-corrected-k3)). The price
# is variance, which Kish's ESS estimates roughly and $\mathrm{Var}_\mu(wg)/\mathrm{Var}_\pi(g)$ exactly; a sampler much
# sharper than the target can make that price ruinous, and a small sample may not even show it.
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
CHUNK = 8                        # positions made at a time: the full logits of 8 positions (3 MB), not of all
gen = klviz.make_generator(7)
base = klviz.policies.zipf_logits(V, 1.1, generator=gen)
kl_parts, logprob_parts, ref_parts, t_exact = [], [], [], 0.0
for _ in range(POSITIONS // CHUNK):
    q_logits = torch.randn(CHUNK, V, generator=gen).add_(base)                  # policy logits, per position
    p_logits = torch.randn(CHUNK, V, generator=gen).mul_(0.3).add_(q_logits)    # reference logits
    t0 = time.perf_counter()
    kl_parts.append(klviz.exact_kl(q_logits, p_logits))                        # the full sum over the vocabulary
    t_exact += time.perf_counter() - t0
    # what a rollout keeps: one sampled token per position and its log-prob under each model
    tok = torch.multinomial(torch.softmax(q_logits, -1), 1, generator=gen)
    logprob_parts.append(torch.log_softmax(q_logits, -1).gather(-1, tok).squeeze(-1))
    ref_parts.append(torch.log_softmax(p_logits, -1).gather(-1, tok).squeeze(-1))
del q_logits, p_logits                                     # the last chunk's logits: 3 MB
kl_exact, logprob, ref_logprob = torch.cat(kl_parts), torch.cat(logprob_parts), torch.cat(ref_parts)  # [POSITIONS]
t0 = time.perf_counter()
k3_tok = klviz.k3(ref_logprob - logprob)                              # log r = log p - log q
t_est = time.perf_counter() - t0

est, est_se = float(k3_tok.mean()), float(k3_tok.std() / math.sqrt(POSITIONS))
print(f"exact KL, mean over positions : {float(kl_exact.mean()):.5f}   ({t_exact * 1e3:8.1f} ms)")
print(f"k3 from stored log-probs      : {plus_minus(est, est_se, '.5f')}   ({t_est * 1e3:8.3f} ms)")
print(f"numbers needed: exact {2 * POSITIONS * V:,}, estimate {2 * POSITIONS:,} (ratio {V:,})")

# %%
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
# the vocabulary (Amini, Vieira and Cotterell's Rao-Blackwellized estimator, which they prove unbiased and never
# noisier than summing the sampled tokens' k1) ([checked on 1,000 random sequence policies](claims.md#rao-blackwell-never-worse)), at the cost of the full
# distributions at every position.
#
# ## 6. The panel: move the sampler and the target
#
# Three policies over the twelve tokens, named as in section 4: $\pi$ (grey, movable: push " sofa", change its
# temperature), the fixed reference $p$ (purple dots), and the stale sampler $\mu$ (red, movable). The toggle says
# where the tokens come from and how they are averaged. Left: draw frequencies (black marks) against the bars;
# right: the running mean of $\log \pi/p$ with its ±2 SE band, the exact $\mathrm{KL}(\pi\,\|\,p)$ (dashed) and, when
# the tokens come from $\mu$ without weights, the value the plain mean converges to instead (dotted).
#
# Things to try:
# 1. **samples from π**, then raise N: the band narrows like $1/\sqrt N$ around the dashed line.
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
# - The estimate's error shrinks like $1/\sqrt N$; report it with its standard error, $s/\sqrt N$, and remember that
#   ±2 SE means 95 % only once $N$ is large enough for the tails ([checked on 1,955 random token pairs](claims.md#coverage-2se-tokens)).
# - A batch mean over the tokens of real responses averages over more than the token: each position has its own
#   next-token distribution, so the token mean estimates the next-token KL averaged over positions and over the
#   prefixes the sampler visited ([checked on 1,000 random sequence policies](claims.md#sequence-token-mean)). Its standard error takes the responses as the
#   independent units (`clustered_mean_se`).
# - On a 50k-token vocabulary most tokens are never drawn in a batch, and the estimate is still unbiased: the
#   unseen tokens are accounted for on average.
# - Tokens from another policy $\mu$ bias the plain mean towards $\mathbb{E}_\mu[g]$. The weight $\pi/\mu$ (the
#   expectation's policy over the sampler) removes the bias and usually costs variance: exactly
#   $\mathrm{Var}_\mu(wg)/\mathrm{Var}_\pi(g)$ for the $g$ at hand, roughly $1+\chi^2(\pi\,\|\,\mu) = N/\mathrm{ESS}$ by Kish's
#   rule of thumb.
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
# Return an *unbiased* estimate of $\sum_x \pi(x)\,g(x)$, where $\pi$ has log-probabilities `log_pi`.

# %%
def weighted_estimate(tokens, g, log_pi, log_mu):
    ...

klviz.check.lesson01.weighted_estimate(weighted_estimate)


# %%
# solution
def weighted_estimate(tokens, g, log_pi, log_mu):
    w = torch.exp(log_pi - log_mu)[tokens]          # the expectation's policy over the sampler
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
