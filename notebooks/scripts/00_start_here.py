# Generated from notebooks/00_start_here.ipynb by `make sync-notebooks`: edit the notebook, not this file.

# %% [markdown]
# # 00 · Start here: what RL code means by "the KL"
#
# **What you will learn**
# - the rule that fixes the *direction* of the k1, k2 and k3 estimates, and where it stops;
# - what k1, k2 and k3 are, and why a single sampled token can estimate a sum over a whole vocabulary;
# - how the rest of the suite is organised, and the words it uses (in English and Chinese).
#
# **Time:** about 15 minutes: 12 of reading, the rest with the panel · **Runs in:** about 6 s on a 2-core CPU (measured under nbval).

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
# | [08 Sampler vs trainer](08_sampler_vs_trainer.ipynb) | The rollout engine and the trainer are two policies: where their log-probs part, how to measure it, how frameworks correct it, and what it does to a training run. |

# %% [markdown]
# ## Glossary · 术语表
#
# | English | 中文 | in this suite |
# |---|---|---|
# | KL divergence | KL 散度 | $\mathrm{KL}(q\,\|\,p)=\mathbb{E}_{x\sim q}[\log q(x)-\log p(x)]\ge 0$ |
# | estimator | 估计量 | a function of one sample whose average approaches the quantity |
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
# ## The rule about direction
#
# Tokens are always drawn from some policy: call it the **sampler** $q$. The other policy is the
# **target** $p$. The three estimators of this suite, k1, k2 and k3, are functions of one sampled token through
#
# $$ r(x) = \frac{p(x)}{q(x)}, \qquad \log r = \log p(x) - \log q(x) \quad\text{(target minus sampler)}, \qquad x\sim q, $$
#
# and they estimate $\mathrm{KL}(q\,\|\,p)$, **the divergence from the sampler**. The order of the arguments in
# somebody's code does not decide the direction; *which policy produced the tokens* does. The rule is about these
# three with this $\log r$, not about every function of sampled tokens: from the same samples, $r\log r-(r-1)$
# estimates the *other* direction, $\mathrm{KL}(p\,\|\,q)$ (lesson 03), and k3 fed the ratio upside down estimates
# $\chi^2(q\,\|\,p)-\mathrm{KL}(q\,\|\,p)$ ([checked on 2,000 random token pairs](claims.md#direction-rule-scope)).
#
# So PPO's `approx_kl`, on tokens sampled by $\pi_\text{old}$, estimates $\mathrm{KL}(\pi_\text{old}\,\|\,\pi_\theta)$.
# verl calls `kl_penalty(logprob, ref_logprob)` in two places. In the reward (`apply_kl_penalty` in
# `verl/trainer/ppo/ray_trainer.py`) it is computed once per rollout from `old_log_probs`, the sampler's own
# log-probabilities: it estimates $\mathrm{KL}(\pi_\text{old}\,\|\,\pi_\text{ref})$, as the rule says (up to the gap
# between the rollout engine and the trainer's recomputation of $\pi_\text{old}$, lesson 08). In the loss
# (`use_kl_loss`; `ppo_loss` in `verl/workers/utils/losses.py`) it is computed on every minibatch with the current
# policy's `log_prob`. On the first minibatch of a step the current policy $\pi$ is still the one that sampled the
# rollout, so there it estimates $\mathrm{KL}(\pi\,\|\,\pi_\text{ref})$. After the first update
# the tokens are $\pi_\text{old}$'s while `logprob` is the moved $\pi$'s: the average of k1 is then
# $\mathrm{KL}(\pi_\text{old}\,\|\,\pi_\text{ref})-\mathrm{KL}(\pi_\text{old}\,\|\,\pi)$, not $\mathrm{KL}(\pi\,\|\,\pi_\text{ref})$
# ([checked on 2,000 random token pairs](claims.md#framework-k3-first-minibatch)). Lesson 01 shows the importance weight that repairs it.
#
# The three per-token estimators (Schulman, 2020):
#
# | | value for one token | mean over $x\sim q$ | sign |
# |---|---|---|---|
# | k1 | $-\log r$ | $\mathrm{KL}(q\|p)$ exactly | either |
# | k2 | $\tfrac12(\log r)^2$ | $\mathrm{KL}(q\|p)$ to second order in $\log r$ only: biased | $\ge 0$ |
# | k3 | $(r-1)-\log r$ | $\mathrm{KL}(q\|p)$ exactly | $\ge 0$ |
#
# In klviz each lives once, in `klviz.kernel` (the public `klviz.k1`, `klviz.k2`, `klviz.k3` check their input and
# call these). k1 and k2 are one line each; k3 is one line too, plus the detail that keeps it accurate when
# $r$ is close to 1 (lesson 02 explains it):

# %%
klviz.show_source(klviz.kernel.k1)
klviz.show_source(klviz.kernel.k2)
klviz.show_source(klviz.kernel.k3)

# %% [markdown]
# A hand check before trusting the library (karpathy's habit): a token whose probability is 0.10 under
# the sampler and 0.25 under the target has $\log r=\log 2.5\approx 0.916$, so k1 $\approx -0.916$ (negative!),
# k2 $\approx 0.420$ and k3 $= 1.5-0.916\approx 0.584$.

# %%
log_r = torch.log(torch.tensor(0.25 / 0.10))
print(f"log r = {log_r:.4f}   k1 = {klviz.k1(log_r):.4f}   k2 = {klviz.k2(log_r):.4f}   k3 = {klviz.k3(log_r):.4f}")

# %%
assert abs(klviz.k1(log_r) - (-0.9163)) < 1e-4 and abs(klviz.k2(log_r) - 0.4198) < 1e-4
assert abs(klviz.k3(log_r) - (1.5 - 0.9163)) < 1e-4

# %% [markdown]
# ## Your first panel
#
# Below, the sampler $q$ (grey) is a next-token distribution over twelve tokens. Move the target $p$
# (purple): sharpen or flatten it with the temperature, push it toward one token, or mix it with the
# uniform distribution. The panel draws $N$ tokens from $q$, evaluates k1, k2 and k3 on each, and shows
# their means with a ±2 standard-error bar beside the exact $\mathrm{KL}(q\|p)$, summed over all twelve tokens.
# (Every ± in this suite is ± 2 standard errors, and says so.)
#
# The readout puts each sample mean beside its **exact mean** $\mathbb{E}_q[k]$ (a sum over the twelve tokens), so
# you can tell the two kinds of error apart: sample mean − exact mean is *noise* (it shrinks with $N$), exact mean −
# KL is *bias* (it does not).
#
# Things to try:
# 1. The default $p$ is already pushed toward *sofa* (push 1). The readout says k1 is negative for about 16 % of the
#    draws: exactly the draws of *sofa*, the one token $p$ now likes more than $q$ does. A push on one token always
#    does this: $P_q(p > q)$ becomes that token's $q$, here $q(\text{sofa}) = 0.162$ (pushed down, it would be
#    $1 - q$) ([checked on 2,000 random token pairs](claims.md#k1-negative-one-push)). Switch the token to *moon*: only 2 % of the draws are
#    negative now, because $q$ rarely draws *moon*. Set the push to 0: $p = q$, every log-ratio is 0 up to float
#    rounding, and so is every estimator.
# 2. Set $N = 10$ and the seed to 15: k1's mean is **negative** (−0.25), an impossible value for a KL; k3 stays
#    positive. Try other seeds: k1 jumps around, k3 much less.
# 3. Look at k2 at the default setting: its exact mean is 14.6 % *below* the KL, a bias no $N$ removes. Now set the
#    temperature to 4: $p$ flattens, the KL grows from 0.083 to 0.21, and k2's bias turns positive, +9.7 %.
#    Lesson 02 shows what decides the sign: the third moment of $\log r$, $\mathbb{E}_q[(\log r)^3]$, which is
#    positive in the first setting and negative in the second.

# %%
panel = klviz.widgets.StartHerePanel(device="cpu")
panel

# %% [markdown]
# ### What the panel just showed, in numbers
#
# The numbers in the panel come from `panel.last`. With the default settings (N = 1,000 tokens) each sample mean
# lies within a few standard errors of its exact mean; for the unbiased k1 and k3 that exact mean is the KL, for
# k2 it is not. At N = 1,000,000 the standard errors shrink by a factor of about 30, and k2's bias stands out.

# %%
from klviz.statistics import plus_minus   # "mean ± 2 SE (2 SE)": the suite's one ± convention

runs = {}
for n in (1_000, 1_000_000):
    last = runs[n] = panel.set(num_samples=n)
    print(f"N = {n:>9,}: exact KL(q||p) = {last['exact']:.5f}")
    for k in ("k1", "k2", "k3"):
        s = last["stats"][k]
        print(f"   {k}: mean {plus_minus(s['mean'], s['se'], '.5f')}, exact mean {last['exact_mean'][k]:.5f}, "
              f"std of one sample {s['std']:.4f}")
exact, bias_k2 = last["exact"], last["exact_bias"]["k2"]
print(f"k2's bias: {100 * bias_k2 / exact:+.1f} % of the KL; P_q(p > q) = {100 * last['frac_negative_k1_exact']:.1f} %")

# the things to try, in numbers
tried = {
    "push toward moon": panel.set(num_samples=1_000, push_token=9),
    "push 0 (p = q)": panel.set(push=0.0, push_token=1),
    "N = 10, seed 15": panel.set(push=1.0, num_samples=10, seed=15),
    "temperature 4": panel.set(num_samples=1_000, seed=0, temperature=4.0),
}
for name, d in tried.items():
    bias = f"{100 * d['exact_bias']['k2'] / d['exact']:+.1f} % of the KL" if d["exact"] > 0 else "none (KL = 0)"
    print(f"{name:>17}: KL {d['exact']:.4f}, k1 mean {d['stats']['k1']['mean']:+.4f}, k3 mean "
          f"{d['stats']['k3']['mean']:.4f}, P_q(p > q) {100 * d['frac_negative_k1_exact']:.1f} %, k2's bias {bias}")
_ = panel.set(temperature=1.0)     # back to the defaults (the underscore keeps the cell from printing the dict)

# %%
for n, d in runs.items():
    for k in ("k1", "k2", "k3"):   # every sample mean within 4 standard errors of its own exact mean ...
        assert abs(d["stats"][k]["mean"] - d["exact_mean"][k]) < 4 * d["stats"][k]["se"], (n, k)
    for k in ("k1", "k3"):         # ... which for k1 and k3 is the KL itself: unbiased
        assert abs(d["exact_bias"][k]) < 1e-12
# the exact value is the full sum over the twelve tokens
q = torch.softmax(panel.q_logp.double(), -1)
p = torch.softmax(torch.tensor(last["p"]).double().log(), -1)
assert abs(exact - float((q * (q / p).log()).sum())) < 1e-6
# k2 is biased, and downward here: -14.6 % of the KL, far outside 4 SE at N = 10^6
assert round(100 * bias_k2 / exact, 1) == -14.6 and abs(bias_k2) > 10 * last["stats"]["k2"]["se"]
# how often k1 < 0: the q-mass of the tokens p likes more than q, here sofa alone, q(sofa) = 0.16 / 0.99
assert round(100 * last["frac_negative_k1_exact"]) == 16 and abs(last["frac_negative_k1_exact"] - float(q[1])) < 1e-6
assert round(float(q[1]), 3) == 0.162
# the things to try do what they say
assert round(100 * tried["push toward moon"]["frac_negative_k1_exact"]) == 2
same = tried["push 0 (p = q)"]
assert same["exact"] == 0 and same["frac_negative_k1_exact"] == 0 and same["frac_negative_k1"] == 0
assert all(same["stats"][k]["mean"] == 0 for k in ("k1", "k2", "k3"))
few = tried["N = 10, seed 15"]
assert round(few["stats"]["k1"]["mean"], 2) == -0.25 and few["stats"]["k3"]["mean"] > 0
flat = tried["temperature 4"]
assert round(flat["exact"], 2) == 0.21 and round(exact, 3) == 0.083
assert round(100 * flat["exact_bias"]["k2"] / flat["exact"], 1) == 9.7
# the sign follows -E_q[(log r)^3] in both settings (lesson 02)
for d, sign in ((last, -1), (flat, +1)):
    u = torch.log(torch.tensor(d["p"]).double()) - torch.log(q)
    assert (float((q * u**3).sum()) < 0) == (sign > 0) and (d["exact_bias"]["k2"] > 0) == (sign > 0)

# %% [markdown]
# The exact value needs all twelve probabilities of both policies. A language model has 50,000 or more
# tokens at each of thousands of positions, and RL code usually keeps only the log-probability of the
# *one* token that was sampled: that is why it estimates, and why lesson 01 starts from the question
# "where did the probability go?".
#
# ## Takeaways
#
# - For k1, k2 and k3 with $\log r = \log(\text{other}) - \log(\text{sampler})$, the tokens' sampler fixes the direction:
#   they estimate $\mathrm{KL}(\text{sampler}\,\|\,\text{other})$ ([checked on 2,000 random token pairs](claims.md#direction-rule-scope)). verl's
#   penalty estimates $\mathrm{KL}(\pi\,\|\,\pi_\text{ref})$ on the first minibatch only ([checked on 2,000 random token pairs](claims.md#framework-k3-first-minibatch)).
# - k1 and k3 are unbiased ([checked on 2,000 random token pairs](claims.md#k1-k3-unbiased-on-tokens)). k2 is biased, and on tokens not by a little:
#   14.6 % *below* the KL at the default setting, 9.7 % above it once $p$ is flattened (lesson 02 tells why the sign
#   changes).
# - k1 is negative for every token the target likes more than the sampler; how often that happens is
#   $P_q(p > q)$, the sampler's mass on those tokens. A change concentrated on one token makes it $q(\text{token})$ when
#   pushed up (16 % for *sofa*, 2 % for *moon*), $1 - q(\text{token})$ when pushed down ([checked on 2,000 random token pairs](claims.md#k1-negative-one-push)).
#   "Almost half the samples" holds for two close Gaussians, and is typical for a diffuse change of many logits
#   (median 0.48) ([checked on 2,000 random token pairs](claims.md#k1-negative-diffuse)).
# - k2 and k3 are never negative ([checked on 2,000 random token pairs](claims.md#k2-k3-never-negative)). k3 has less spread than k1 while
#   $|\log r| \le 1$ on every token the sampler can draw ([checked on 4,180 random token pairs](claims.md#gap-less-spread-near-one)); "close" must hold on
#   every token, rare ones included (lesson 02's token panel shows a KL of 0.04 where k1 is the quieter).

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

# %% [markdown]
# ## References
#
# - J. Schulman, [Approximating KL Divergence](http://joschu.net/blog/kl-approx.html) (2020): k1, k2, k3 and the Gaussian table.
# - verl, [`verl/trainer/ppo/core_algos.py`](https://github.com/volcengine/verl/blob/main/verl/trainer/ppo/core_algos.py): `kl_penalty` and `low_var_kl`.
# - MiniMind, [`trainer/train_ppo.py`](https://github.com/jingyaogong/minimind/blob/master/trainer/train_ppo.py): `approx_kl` and early stopping.
# - Next: [01 Sampling as weighting](01_sampling_as_weighting.ipynb).
