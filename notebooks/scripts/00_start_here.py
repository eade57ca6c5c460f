# Generated from notebooks/00_start_here.ipynb by `make sync-notebooks`: edit the notebook, not this file.

# %% [markdown]
# # 00 · Start here: what RL code means by "the KL"
#
# **What you will learn**
# - the one rule that fixes the *direction* of every sampled KL estimate;
# - what k1, k2 and k3 are, and why a single sampled token can estimate a sum over a whole vocabulary;
# - how the rest of the suite is organised, and the words it uses (in English and Chinese).
#
# **Time:** 15 minutes of reading and playing · **Runs in:** about 5 s on a 2-core CPU.

# %% [markdown]
# ## The map of the suite
#
# | lesson | question it answers |
# |---|---|
# | **00 Start here** (this one) | What do k1, k2, k3 estimate, and in which direction? |
# | [01 Sampling as weighting](01_sampling_as_weighting.ipynb) | Where did the factor P(x) go when code averages over sampled tokens? |
# | [02 The three estimators](02_three_estimators.ipynb) | How biased and how noisy are k1, k2, k3? Schulman's table, reproduced and checked. |
# | [03 f-divergences and Bregman](03_f_divergence_bregman.ipynb) | Why is k3 never negative, and how do you build such an estimator for any divergence? |
# | [04 Worked tokens](04_worked_tokens.ipynb) | What do verl, OpenRLHF, TRL and MiniMind actually compute on a real batch? |
# | [05 Gradients](05_gradients.ipynb) | A correct value is not a correct gradient: which placement follows which KL? |
# | [06 Pitfalls and your rollouts](06_pitfalls_and_your_rollouts.ipynb) | Inverted ratios, clamps, low precision, and a diagnosis of your own run. |
# | [07 Mini RLHF lab](07_mini_rlhf_lab.ipynb) | Train a tiny language model with each KL placement and watch what happens. |

# %% [markdown]
# ## Glossary · 术语表
#
# | English | 中文 | in this suite |
# |---|---|---|
# | KL divergence | KL散度 | $\mathrm{KL}(q\,\|\,p)=\mathbb{E}_{x\sim q}[\log q(x)-\log p(x)]\ge 0$ |
# | estimator | 估计器 | a function of one sample whose average approaches the quantity |
# | sampling | 采样 | drawing tokens $x_1,\dots,x_N$ from a policy |
# | sampler / target | 采样分布 / 目标分布 | $q$ produced the tokens; $p$ is the other distribution |
# | importance sampling | 重要性采样 | reweighting samples from $\mu$ by $q(x)/\mu(x)$ to average under $q$ |
# | variance | 方差 | how much one estimate scatters around its mean |
# | bias | 偏差 | how far the estimator's mean is from the true value |
# | gradient | 梯度 | what the optimiser actually follows, which can differ from the value's meaning |
# | policy / reference policy | 策略 / 参考策略 | $\pi_\theta$ being trained / the frozen $\pi_\text{ref}$ |
# | log-ratio | 对数比 | $\log r=\log p(x)-\log q(x)$ (target minus sampler) |

# %%
import torch
import klviz

device = klviz.setup_notebook()

# %% [markdown]
# ## The one rule about direction
#
# Tokens are always drawn from some policy: call it the **sampler** $q$. The other policy is the
# **target** $p$. Every sampled estimate below uses the ratio
#
# $$ r(x) = \frac{p(x)}{q(x)}, \qquad \log r = \log p(x) - \log q(x) \quad\text{(target minus sampler)}, \qquad x\sim q, $$
#
# and estimates $\mathrm{KL}(q\,\|\,p)$, **the divergence from the sampler**. The order of the arguments in
# somebody's code does not decide the direction; *which policy produced the tokens* does.
# So verl's `kl_penalty(logprob, ref_logprob)`, on tokens sampled from the policy, estimates
# $\mathrm{KL}(\pi\,\|\,\pi_\text{ref})$; PPO's `approx_kl`, on tokens sampled by $\pi_\text{old}$, estimates
# $\mathrm{KL}(\pi_\text{old}\,\|\,\pi_\theta)$.
#
# The three per-token estimators (Schulman, 2020):
#
# | | value for one token | mean over $x\sim q$ | sign |
# |---|---|---|---|
# | k1 | $-\log r$ | $\mathrm{KL}(q\|p)$ exactly | either |
# | k2 | $\tfrac12(\log r)^2$ | close to $\mathrm{KL}(q\|p)$ when $p\approx q$ | $\ge 0$ |
# | k3 | $(r-1)-\log r$ | $\mathrm{KL}(q\|p)$ exactly | $\ge 0$ |
#
# In klviz they are three one-liners:

# %%
klviz.show_source(klviz.k1)
klviz.show_source(klviz.k3)

# %% [markdown]
# A hand check before trusting the library (karpathy's habit): a token whose probability is 0.10 under
# the sampler and 0.25 under the target has $\log r=\log 2.5\approx 0.916$, so k1 $\approx -0.916$ (negative!),
# k2 $\approx 0.420$ and k3 $= 1.5-0.916\approx 0.584$.

# %%
log_r = torch.log(torch.tensor(0.25 / 0.10))
print(f"log r = {log_r:.4f}   k1 = {klviz.k1(log_r):.4f}   k2 = {klviz.k2(log_r):.4f}   k3 = {klviz.k3(log_r):.4f}")
assert abs(klviz.k1(log_r) - (-0.9163)) < 1e-4 and abs(klviz.k2(log_r) - 0.4198) < 1e-4
assert abs(klviz.k3(log_r) - (1.5 - 0.9163)) < 1e-4

# %% [markdown]
# ## Your first panel
#
# Below, the sampler $q$ (grey) is a next-token distribution over twelve tokens. Move the target $p$
# (purple): sharpen or flatten it with the temperature, push it toward one token, or mix it with the
# uniform distribution. The panel draws $N$ tokens from $q$, evaluates k1, k2 and k3 on each, and shows
# their means with a ±2 standard-error bar beside the exact $\mathrm{KL}(q\|p)$, summed over all twelve tokens.
#
# Things to try:
# 1. Push $p$ toward *sofa* and watch k1 turn negative on the tokens $p$ likes more than $q$ does.
# 2. Set $N=10$: k1's mean jumps around and can even be negative; k3 stays positive.
# 3. Set the temperature to 4: $p$ flattens, the KL grows, and k2's bias becomes visible.

# %%
panel = klviz.widgets.StartHerePanel(device="cpu")
panel

# %% [markdown]
# ### What the panel just showed, checked
#
# The numbers in the panel come from `panel.last`. With the default settings (N = 1,000 tokens) the
# sample means of the unbiased k1 and k3 must lie within a few standard errors of the exact value; k2's
# mean need not. At N = 1,000,000 the standard errors shrink by a factor of about 30.

# %%
for n in (1_000, 1_000_000):
    last = panel.set(num_samples=n)
    exact = last["exact"]
    print(f"N = {n:>9,}: exact KL(q||p) = {exact:.5f}")
    for k in ("k1", "k2", "k3"):
        s = last["stats"][k]
        print(f"   {k}: mean {s['mean']:.5f} ± {2 * s['se']:.5f} (2 SE)   std of one sample {s['std']:.4f}")
    for k in ("k1", "k3"):   # unbiased: within 4 standard errors of the truth
        assert abs(last["stats"][k]["mean"] - exact) < 4 * last["stats"][k]["se"], k
# the exact value is the full sum over the twelve tokens
q = torch.softmax(panel.q_logp, -1)
p = torch.tensor(last["p"])
assert abs(exact - float((q * (q / p).log()).sum())) < 1e-6
# k3 has a smaller spread than k1 when p is close to q
assert last["stats"]["k3"]["std"] < last["stats"]["k1"]["std"]
panel.set(num_samples=1_000)

# %% [markdown]
# The exact value needs all twelve probabilities of both policies. A language model has 50,000 or more
# tokens at each of thousands of positions, and RL code usually keeps only the log-probability of the
# *one* token that was sampled: that is why it estimates, and why lesson 01 starts from the question
# "where did the probability go?".
#
# ## Takeaways
#
# - The tokens' sampler fixes the direction: sampled estimates measure $\mathrm{KL}(\text{sampler}\,\|\,\text{other})$.
# - k1 and k3 are unbiased; k2 is slightly biased; k1 is negative for every token the target likes more than the sampler.
# - k2 and k3 are never negative, and k3 has much less spread than k1 while the policies are close.

# %% [markdown]
# ## Exercises
#
# **Exercise 1.** PPO computes `approx_kl` from the old policy's log-probabilities and the current
# policy's log-probabilities of the tokens in the rollout buffer, which the old policy sampled. Which KL
# does it estimate? Answer `"KL(old||new)"` or `"KL(new||old)"`.

# %%
answer = ...   # "KL(old||new)" or "KL(new||old)"
klviz.check.lesson00.direction(answer)

# %%
# Solution
answer = "KL(old||new)"
assert klviz.check.lesson00.direction(answer)
klviz.check.lesson00.direction(answer)


# %% [markdown]
# **Exercise 2.** Write `my_k1(logp_sampler, logp_target)`, the per-token k1 estimate of
# $\mathrm{KL}(\text{sampler}\,\|\,\text{target})$ from the two log-probabilities of each sampled token.

# %%
def my_k1(logp_sampler, logp_target):
    ...   # your code: one number per token

klviz.check.lesson00.k1_from_logprobs(my_k1)


# %%
# Solution: k1 = -log r = log q(x) - log p(x)
def my_k1(logp_sampler, logp_target):
    return logp_sampler - logp_target

assert klviz.check.lesson00.k1_from_logprobs(my_k1)
klviz.check.lesson00.k1_from_logprobs(my_k1)

# %% [markdown]
# ## References
#
# - J. Schulman, [Approximating KL Divergence](http://joschu.net/blog/kl-approx.html) (2020): k1, k2, k3 and the Gaussian table.
# - verl, [`verl/trainer/ppo/core_algos.py`](https://github.com/volcengine/verl/blob/main/verl/trainer/ppo/core_algos.py): `kl_penalty` and `low_var_kl`.
# - MiniMind, [`trainer/train_ppo.py`](https://github.com/jingyaogong/minimind/blob/master/trainer/train_ppo.py): `approx_kl` and early stopping.
# - Next: [01 Sampling as weighting](01_sampling_as_weighting.ipynb).
