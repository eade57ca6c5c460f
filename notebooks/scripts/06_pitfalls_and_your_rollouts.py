# Generated from notebooks/06_pitfalls_and_your_rollouts.ipynb by `make sync-notebooks`: edit the notebook, not this file.

# %% [markdown]
# # 06 · Pitfalls, and the KL of your own rollouts
#
# **What you will learn**
# - nine ways a KL number in RL code goes wrong, each *measured* here rather than warned about: the
#   inverted ratio of a widely shared `compute_kl`, clamps, low precision, off-policy tokens, sum vs mean, negative k1
#   logs, a KL loss under `torch.no_grad`, "mix in samples from p" without weights, and an unsourced
#   variance table;
# - how to read a dump of your own run's log-probabilities with `klviz diagnose`, what each trouble
#   sign in its report means, and what a dump cannot show (how the KL term was wired: `klviz audit`);
# - for whole responses on a second epoch: why a per-token importance weight is not enough (exercise 2);
# - short answers to the questions people keep asking on GitHub, each linked to the place in the suite
#   that shows the answer.
#
# **Time:** 40 minutes of reading and playing · **Runs in:** about 15 s on an idle 2-core CPU (measured under nbval: 15 s of CPU time; 39 s of wall time on a
# machine busy with other jobs).
#
# Direction rule, as in every lesson: tokens $x$ come from the **sampler** $q$, $\log r=\log p(x)-\log q(x)$
# (target minus sampler), and k1, k2, k3 estimate $\mathrm{KL}(q\,\|\,p)$.
#
# | pitfall | section |
# |---|---|
# | an inverted ratio, as often written | [1](#inverted-ratio) |
# | clamps (verl, OpenRLHF) | [2](#clamps) |
# | bfloat16 / float16 log-probs | [3](#precision) |
# | off-policy tokens (the second PPO epoch) | [4](#off-policy) |
# | sum vs mean over responses of different lengths | [5](#sum-vs-mean) |
# | negative k1 means in your logs | [6](#negative-k1) |
# | a KL loss computed under `torch.no_grad` | [7](#no-grad) |
# | "mix in samples from p" without importance weights | [8](#mix-samples) |
# | a widely quoted variance table, measured | [9](#variance-table) |
# | misspelled estimator names | [10](#fall-through) |
# | **your own rollouts: `klviz diagnose`** | [11](#diagnose) |
# | FAQ | [12](#faq) |

# %%
import klviz
device = klviz.setup_notebook()

# %%
import math

import numpy as np
import torch
from IPython.display import display

from klviz import diagnose as dg
from klviz import lm
from klviz import pitfalls as pf
from klviz.plotting import COLORS, new_figure
from klviz.statistics import PM_SE, plus_minus
from klviz.policies import move_policy, toy_sampler_logits, zipf_logits

# %% [markdown]
# ## 1 · The inverted ratio <a id="inverted-ratio"></a>
#
# **Question.** A widely shared explanation of PPO's KL samples tokens from $q$ (the old policy), defines $r=q(x)/p(x)$ and then uses
# $k_3=(r-1)-\log r$. Its code does the same: `ratios = torch.exp(logp_old - logp_new)`. Does it matter
# which way up the ratio is?
#
# **Intuition.** k3 is unbiased because $r-1$ has mean zero *under the sampler*: $\mathbb{E}_q[p/q]=\sum_x p(x)=1$.
# Turn the ratio over and $\mathbb{E}_q[q/p]=\sum_x q(x)^2/p(x)$ is no longer 1: it is $1+\chi^2(q\,\|\,p)$.
#
# **Math.** With $r'=q/p$ and $x\sim q$:
# $\mathbb{E}_q[(r'-1)-\log r'] = \chi^2(q\,\|\,p) - \mathrm{KL}(q\,\|\,p)$.
# For $q=\mathcal N(0,1)$, $p=\mathcal N(\mu,1)$: $\chi^2=e^{\mu^2}-1$ and $\mathrm{KL}=\mu^2/2$, so the inverted estimator averages
# $e^{\mu^2}-1-\mu^2/2$ instead of $\mu^2/2$. Both start as $\mu^2/2$ for small $\mu$: the bug is invisible while the
# policies are close and grows exponentially as they drift.

# %%
klviz.show_source(pf.inverted_compute_kl)
klviz.show_source(pf.correct_compute_kl)

# %%
N_SAMPLES = 200_000   # per μ; more: slower, tighter
gen = klviz.make_generator(0)
mus = np.linspace(0.0, 1.5, 61)
exact_ok = np.array([pf.inverted_k3_exact(m)["kl"] for m in mus])
exact_bad = np.array([pf.inverted_k3_exact(m)["inverted"] for m in mus])
mc_mus = [0.1, 0.5, 1.0, 1.3]
mc = {m: pf.inverted_k3_mc(m, N_SAMPLES, generator=gen) for m in mc_mus}
for m, r in mc.items():       # Monte Carlo agrees with both closed forms
    ex = pf.inverted_k3_exact(m)
    assert abs(r["correct"] - ex["kl"]) < 4 * r["correct_se"]
    assert abs(r["inverted"] - ex["inverted"]) < 4 * r["inverted_se"]

fig, ax = new_figure(7.5, 3.4)
ax.plot(mus, exact_ok, color=COLORS["k3"], label=r"correct $k_3$, $r=p/q$: mean $\mu^2/2$")
ax.plot(mus, exact_bad, color=COLORS["mu"], label=r"inverted $k_3$, $r=q/p$: mean $e^{\mu^2}-1-\mu^2/2$")
ax.errorbar(mc_mus, [mc[m]["correct"] for m in mc_mus], yerr=[2 * mc[m]["correct_se"] for m in mc_mus],
            fmt="o", color=COLORS["k3"], ms=4, label=f"Monte Carlo ± {PM_SE} SE")
ax.errorbar(mc_mus, [mc[m]["inverted"] for m in mc_mus], yerr=[2 * mc[m]["inverted_se"] for m in mc_mus],
            fmt="o", color=COLORS["mu"], ms=4)
ax.set_xlabel(r"distance between the policies $\mu$  ($q=\mathcal{N}(0,1)$, $p=\mathcal{N}(\mu,1)$)")
ax.set_ylabel("mean of the estimator [nats]")
ax.set_title("The inverted ratio: invisible when close, badly wrong when the policies drift")
ax.legend()
display(fig)

for m in (0.1, 1.0):
    ex = pf.inverted_k3_exact(m)
    print(f"μ = {m}: true KL {ex['kl']:.5f}, the inverted estimator averages {ex['inverted']:.5f} "
          f"({100 * ex['rel_error']:+.1f}%)")

# %%
assert abs(pf.inverted_k3_exact(1.0)["rel_error"] - (2 * math.e - 4)) < 1e-12    # (e - 1 - 1/2)/(1/2) - 1

# %% [markdown]
# At $\mu=1$ the relative error is exactly $2e-4\approx 1.437$: the inverted estimator reports 144% more than the
# true KL. Nothing warns you: the inverted k3 is still never negative and still looks smooth.
#
# The same identity holds for any two token distributions, not just Gaussians ([checked on 1,000 random token pairs](claims.md#inverted-ratio-measures-chi2-minus-kl)). A brute-force check on the
# twelve tokens of lesson 00, summing over the vocabulary:

# %%
q_logp = toy_sampler_logits()
p_logp = move_policy(q_logp, temperature=1.6, push=1.5, push_token=9)
q, p = q_logp.double().softmax(0), p_logp.double().softmax(0)     # normalised in float64
mean_inverted = float((q * klviz.k3(torch.log(q / p))).sum())     # E_q[k3(log q/p)], no sampling
chi2 = float((q * q / p).sum() - 1)
kl = float((q * torch.log(q / p)).sum())
assert abs(kl - float(klviz.categorical_kl(q, p))) < 1e-6        # klviz's exact KL (float32) agrees
print(f"E_q[inverted k3] = {mean_inverted:.6f};  χ²(q‖p) − KL(q‖p) = {chi2 - kl:.6f};  KL(q‖p) = {kl:.6f}")

# %%
assert abs(mean_inverted - (chi2 - kl)) < 1e-10

# %% [markdown]
# **A second slip in the same note.** It says k3 reduces variance because $\mathrm{Cov}[\log r, r-1]\approx-\mathrm{Var}[\log r]$.
# The sign is wrong: $\log r$ and $r-1$ both increase with $r$, so their covariance is never negative
# ([checked on 1,000 random token pairs](claims.md#cov-log-r-and-r-is-positive)); near $r=1$, $r-1\approx\log r$, so it is about $+\mathrm{Var}[\log r]$; for the Gaussian pair it is
# *exactly* $\mu^2=\mathrm{Var}[\log r]$. What is negatively correlated is $r-1$ and $-\log r$, the two terms k3 adds;
# that is the control variate at work (lesson [02](02_three_estimators.ipynb)).

# %%
MU = 0.7
x = torch.randn(N_SAMPLES, generator=gen, dtype=torch.float64)
log_r = MU * x - MU**2 / 2
prod = (log_r - log_r.mean()) * (torch.expm1(log_r) - torch.expm1(log_r).mean())
cov, cov_se = float(prod.mean()), float(prod.std()) / math.sqrt(N_SAMPLES)
exact = pf.gaussian_cov_logr_r(MU)
print(f"Cov[log r, r − 1] = {plus_minus(cov, cov_se, '.4f')} (exact {exact['cov']:.4f} = Var[log r] = {exact['var_log_r']:.4f})")

# %%
assert abs(cov - exact["cov"]) < 4 * cov_se and cov > 0

# %% [markdown]
# **Takeaway.** Write the ratio as *target over sampler*. With tokens from the old policy that is
# $r=\pi_\text{new}/\pi_\text{old}$, i.e. `log_r = logp_new - logp_old`; the inverted version measures
# $\chi^2-\mathrm{KL}$ and hides it until the policies drift.

# %% [markdown]
# ## 2 · Clamps <a id="clamps"></a>
#
# **Question.** verl's `low_var_kl` clamps $\log r$ to $[-20, 20]$ and the result to $[-10, 10]$; OpenRLHF
# clamps *every* estimator's value to $[-10, 10]$ (so k1 is clipped too). What do clamps cost, and how often do
# they act?
#
# **Intuition.** A clamp only changes tokens where it binds. While the policies are close, no token comes near
# the bounds and the clamp is free. As they separate, $k_3$ grows like $e^{\log r}$ on tokens the target likes far more
# than the sampler; the output clamp cuts exactly the tokens that carry the mean, so the clamped k3 becomes biased
# *downwards* ([checked on 1,000 random token pairs](claims.md#clamps-only-lower-k3)). verl's lower bound $-10$ can never act because $k_3\ge 0$ ([checked on 2,000 random token pairs](claims.md#k2-k3-never-negative)), but its upper bound binds on **both** sides:
# also where $\log r<-11$, a token the *policy* finds $e^{11}\approx6\cdot10^4$ times likelier than the reference. There
# $k_3\approx-\log r-1$ is linear, not heavy-tailed, and the clamp sets its gradient to zero on the very tokens RL pushed up
# hardest (lesson [04](04_worked_tokens.ipynb) §5 computes both crossing points).
#
# **Math.** For the Gaussian pair the clamped expectations are one-dimensional integrals over $x\sim\mathcal N(0,1)$;
# `pf.gaussian_clamped_expectation` evaluates them by quadrature, and we check it against sampling.

# %%
mus = np.linspace(0.25, 6.0, 47)
curves = {
    ("k3", "verl low_var_kl"): ("verl low_var_kl (k3)", COLORS["k3"]),
    ("k1", "OpenRLHF ±10"): ("OpenRLHF k1", COLORS["k1"]),
    ("k2", "OpenRLHF ±10"): ("OpenRLHF k2", COLORS["k2"]),
}
fig, (ax_b, ax_h) = new_figure(9.0, 3.4, ncols=2)
for (est, rule), (label, colour) in curves.items():
    clamped, hits = pf.gaussian_clamp_curve(mus, est, rule)      # quadrature for every μ at once
    ax_b.plot(mus, clamped / (mus**2 / 2), color=colour, label=label)
    ax_h.semilogy(mus, np.maximum(hits, 1e-12), color=colour, label=label)
ax_b.axhline(1.0, color=COLORS["exact"], ls="--", lw=1, label="unbiased (k1, k3)")
ax_b.set_xlabel(r"$\mu$  (true KL $=\mu^2/2$)")
ax_b.set_ylabel("clamped mean / true KL")
ax_b.set_title("Bias of the clamped estimators")
ax_b.legend()
ax_h.set_ylim(1e-9, 1.5)
ax_h.set_xlabel(r"$\mu$")
ax_h.set_ylabel("fraction of tokens the clamp alters")
ax_h.set_title("How often the clamp acts")
ax_h.legend()
display(fig)

MU_CHECK = 4.0   # quadrature against sampling at one distance
x = torch.randn(N_SAMPLES, generator=gen, dtype=torch.float64)
log_r = MU_CHECK * x - MU_CHECK**2 / 2
for (est, rule) in curves:
    v = pf.apply_clamp(log_r, est, rule)
    mean, se = float(v.mean()), float(v.std()) / math.sqrt(N_SAMPLES)
    quad = pf.gaussian_clamped_expectation(MU_CHECK, est, rule)
    print(f"μ = {MU_CHECK}: {curves[(est, rule)][0]:22s} quadrature {quad:.4f}, sampled {plus_minus(mean, se, '.4f')} "
          f"(true KL {MU_CHECK**2 / 2})")
    assert abs(mean - quad) < 4 * se

# %%
assert pf.gaussian_clamp_hit_rate(1.0, "k3", "verl low_var_kl") < 0.01 < pf.gaussian_clamp_hit_rate(4.0, "k3", "verl low_var_kl")

# %% [markdown]
# **How often do real-looking batches hit them?** Language-model log-ratios are not Gaussian: most tokens
# have $|\log r|$ near zero and a few are far out. The sample dump shipped with klviz holds 120 responses of
# the tiny language model of lesson [04](04_worked_tokens.ipynb) (sampled by its RL-tuned policy, scored by
# that policy and by the reference). Its second log-prob column, `new_logprob`, is the policy after more update
# steps: the tokens of a *second* PPO epoch. `klviz diagnose` counts clamp hits; here is the part of its analysis
# that concerns clamps, for both pairs:

# %%
sample = dg.load_rollouts(dg.sample_rollouts_path())
first = dg.diagnose(sample)
second = dg.diagnose(dg.load_rollouts(dg.sample_rollouts_path(), logprob_key="new_logprob", old_key=None))
assert first.n_sequences == 120      # the text above describes the dump
for name, d in (("policy vs reference", first), ("newer policy vs reference (2nd epoch)", second)):
    print(name)
    for label, c in d.clamps.items():
        print(f"  {label:52s} {100 * c['fraction']:6.3f}% of tokens, token-mean moves by {c['mean_shift']:+.4f}")

# the same fraction by hand, for the verl output clamp on the first pair
lr = (sample.ref_logprob - sample.logprob)[sample.mask]
by_hand = float((pf.apply_clamp(lr, "k3", "verl low_var_kl") != klviz.k3(lr)).double().mean())
assert by_hand == first.clamps["verl low_var_kl: k3 clamped to ≤ 10 (also NeMo-RL)"]["fraction"]
k3_mean = float(klviz.k3(lr).mean())
print(f"\nverl's clamp moves the k3 token-mean from {k3_mean:.4f} by "
      f"{100 * first.clamps['verl low_var_kl: k3 clamped to ≤ 10 (also NeMo-RL)']['mean_shift'] / k3_mean:+.1f}% "
      f"while touching {100 * by_hand:.2f}% of the tokens")

# %% [markdown]
# (The k2 curve rises above 1 before its clamp acts because k2 itself is biased upward, by $\mu^2/4$ relative;
# the clamp then pulls it down like the others.)
#
# **Takeaway.** A clamp that touches a fraction of a percent of the tokens can still move the mean noticeably,
# because those are exactly the tokens that carry k3's mean. Clamps keep `exp` finite (an input clamp at 20 is
# what prevents `inf` and `NaN`, see [FAQ](#faq)); they are not free when the policies are far apart, and OpenRLHF's
# clamp on k1 makes even k1 biased. The clamp at 10 is not only "the heavy tail": it also stops the
# penalty from pulling back tokens whose probability RL multiplied by $6\cdot10^4$ or more.

# %% [markdown]
# ## 3 · Low precision <a id="precision"></a>
#
# **Question.** Trainers run the policy in bfloat16. How much do log-probs from a bf16 forward pass change k1,
# k2 and k3, per token and in the batch mean?
#
# **Intuition.** bfloat16 keeps 8 significant bits: a logit between 16 and 32 is stored on a grid of spacing
# $2^{-3}$, so it can be off by $0.0625$, and the log-probability computed from such logits carries errors of
# that order, token by token. k1 is linear in $\log r$: its error is the log-prob error itself, noise that
# averages out over a batch. k2 and k3 are convex: besides a noise term, an error $e$ adds about $\tfrac12 e^2$,
# always upward ([checked on 1,000 random logit batches](claims.md#rounding-noise-biases-k2-and-k3-upwards)), a bias that no batch size removes. It is negligible next to a large KL and dominates when
# the true KL is near zero.
#
# **Setup.** A synthetic but language-model-like batch: 64 positions over a 32,000-token vocabulary, logits =
# Zipf log-frequencies + Gaussian noise + an offset of 10 (real logits are not centred, and rounding depends on
# magnitude). The reference differs from the policy by small logit noise; tokens are sampled from the policy.

# %%
V, POSITIONS = 32_000, 64     # vocabulary and positions; more: slower
g = klviz.make_generator(6)
base = zipf_logits(V, generator=g)
# base + 2·noise + 10 and policy + 0.3·noise, built in place: one [POSITIONS, V] array each, no temporaries
policy_logits = torch.randn(POSITIONS, V, generator=g).mul_(2.0).add_(base).add_(10.0)
ref_logits = torch.randn(POSITIONS, V, generator=g).mul_(0.3).add_(policy_logits)
tokens = torch.multinomial(torch.softmax(policy_logits, -1), 1, generator=g)[:, 0]

rows = []
for label, pol, ref in (("policy: bf16 logits, log-softmax in fp32", "bfloat16 logits", "float32"),
                        ("both: bf16 logits, log-softmax in fp32", "bfloat16 logits", "bfloat16 logits"),
                        ("both: everything in bf16", "bfloat16", "bfloat16"),
                        ("both: everything in fp16", "float16", "float16")):
    e = pf.precision_errors(policy_logits, ref_logits, tokens, pol, ref_precision=ref)
    rows.append((label, e))
print(f"{'':44s}" + "".join(f"{k + ' |err|/token':>16s}{k + ' mean err':>14s}" for k in ("k1", "k2", "k3")))
for label, e in rows:
    print(f"{label:44s}" + "".join(f"{e[k]['per_token_abs']:16.2e}{e[k]['batch_mean_error']:+14.2e}" for k in ("k1", "k2", "k3")))
print(f"{'float32 batch means (for scale)':44s}" + "".join(f"{rows[0][1][k]['batch_mean']:16.4f}{'':14s}" for k in ("k1", "k2", "k3")))
del ref_logits   # 8 MB that no later cell needs (the next cell uses policy_logits only)

# %% [markdown]
# Per token, k1 moves the most (its error is the whole log-prob error). The batch-mean errors are small next
# to this batch's KL, but they would not be next to a KL a hundred times smaller.
#
# **Same weights, two precisions: a KL that should be zero.** A common real case: the rollout engine scores
# tokens in one precision and the trainer in another, or the "reference" is the policy itself at step 0.
# The true KL is 0, yet k2 and k3 come out positive: exactly $\tfrac12\overline{e^2}$ for k2 and almost the same for
# k3 ([checked on 1,000 random logit batches](claims.md#rounding-noise-biases-k2-and-k3-upwards)), while k1's mean is zero up to its noise.

# %%
same = pf.precision_errors(policy_logits, policy_logits, tokens, "bfloat16 logits", ref_precision="float32")
err = same["logprob_error"]
print(f"true KL 0; batch means: k1 {same['k1']['batch_mean_low']:+.2e}, k2 {same['k2']['batch_mean_low']:.2e}, "
      f"k3 {same['k3']['batch_mean_low']:.2e};  ½·mean(e²) = {0.5 * float((err**2).mean()):.2e}")
assert abs(same["k2"]["batch_mean_low"] - 0.5 * float((err**2).mean())) < 1e-12       # k2 of an error e is ½e²
assert same["k3"]["batch_mean_low"] > 0 and same["k2"]["batch_mean_low"] > 0
k1_se = float(same["k1"]["errors"].std()) / math.sqrt(POSITIONS)
assert abs(same["k1"]["batch_mean_low"]) < 4 * k1_se + 1e-12                           # k1: noise, no bias

lp32 = pf.logprobs_in_precision(policy_logits, tokens, "float32")
fig, ax = new_figure(7.5, 3.2)
for prec, colour in (("bfloat16 logits", COLORS["k1"]), ("bfloat16", COLORS["mu"])):
    ax.scatter(lp32.numpy(), (pf.logprobs_in_precision(policy_logits, tokens, prec) - lp32).numpy(), s=8,
               color=colour, label=prec)
ax.axhline(0, color=COLORS["ink"], lw=0.6)
ax.set_xlabel(r"float32 log-probability of the sampled token, $\log\pi(x)$")
ax.set_ylabel("low-precision error [nats]")
ax.set_title("Log-prob error of a low-precision forward pass, per token")
ax.legend(title="computed in")
display(fig)

# %% [markdown]
# **Takeaway.** Compute the log-softmax in float32 (upcast the logits first), and compute policy and reference
# log-probs the same way. What each framework does with bf16 logits, read in its code:
#
# - **OpenRLHF** upcasts the logits in `Actor.forward` (`openrlhf/models/actor.py`: `output["logits"].to(torch.float32)`,
#   PR #634) before `log_probs_from_logits`, and `compute_approx_kl` computes the log-ratio in float32 again: the
#   "bfloat16 logits" row above.
# - **TRL 1.16.0**'s `selective_log_softmax` (`trl/trainer/utils.py`) hands CUDA and XPU logits to a Triton kernel
#   (`trl/kernels/logprob_entropy.py`) that loads them as float32 and returns float32: the "bfloat16 logits" row. Only
#   its fallback, on the CPU (or without Triton), runs `log_softmax` row by row **in the logits' own dtype**: the
#   "everything in bf16" row.
# - **verl**'s `logprobs_from_logits` (`verl/utils/torch_functional.py`) uses flash-attn's Triton cross-entropy when
#   flash-attn is installed, which computes in float32; without it, `logprobs_from_logits_v2` runs `log_softmax` row by
#   row in the logits' dtype, as TRL's fallback does.
#
# `klviz.pitfalls.logprobs_in_precision` names the same cases in its docstring. The k1 batch mean tolerates independent
# rounding; k2 and k3 turn rounding noise into a positive "KL" even between identical models.

# %% [markdown]
# ## 4 · Off-policy tokens: the second PPO epoch <a id="off-policy"></a>
#
# **Question.** PPO reuses a batch for several epochs. In the second epoch the tokens were sampled by
# $\pi_\text{old}$ but the code plugs in the current $\pi_\theta$: `kl_penalty(logprob=π_θ, ref_logprob)`.
# Which KL does each number estimate now?
#
# **Math.** Averages are under $\pi_\text{old}$, the sampler. For k1:
# $\mathbb{E}_{\pi_\text{old}}[\log\pi_\theta-\log\pi_\text{ref}] = \mathrm{KL}(\pi_\text{old}\|\pi_\text{ref})-\mathrm{KL}(\pi_\text{old}\|\pi_\theta)$:
# neither the KL you want nor any KL, and negative once $\pi_\theta$ moves further from $\pi_\text{old}$ than $\pi_\text{old}$ is from the
# reference ([checked on 1,000 random token triples](claims.md#k1-on-old-tokens-is-a-difference-of-kls)). With the importance weight $\rho=\pi_\theta/\pi_\text{old}$, $\mathbb{E}_{\pi_\text{old}}[\rho\,k]=\mathbb{E}_{\pi_\theta}[k]$ is
# unbiased again. PPO's own `ppo_kl` (old minus new on old's tokens) estimates $\mathrm{KL}(\pi_\text{old}\|\pi_\theta)$.
# Exact values, summing over the twelve-token vocabulary:

# %%
old = toy_sampler_logits()
theta = move_policy(old, push=2.0, push_token=8)             # the update pushed " dog"
ref = move_policy(old, temperature=1.3, push=-0.5, push_token=0)
e = pf.off_policy_expectations(old, theta, ref)
for k, v in e.items():
    print(f"  {k:16s} {v:+.5f}")

# %%
assert abs(e["k1"] - (e["KL(old||ref)"] - e["KL(old||theta)"])) < 1e-12
assert abs(e["rho*k1"] - e["KL(theta||ref)"]) < 1e-12 and abs(e["rho*k3"] - e["KL(theta||ref)"]) < 1e-12
assert abs(e["ppo_kl"] - e["KL(old||theta)"]) < 1e-12

# %% [markdown]
# | on $\pi_\text{old}$'s tokens | estimates |
# |---|---|
# | k1 of $\log\pi_\text{ref}-\log\pi_\theta$ | $\mathrm{KL}(\pi_\text{old}\Vert \pi_\text{ref})-\mathrm{KL}(\pi_\text{old}\Vert \pi_\theta)$ (no KL; may be negative) |
# | k2, k3 of the same | no KL in particular (biased) |
# | $\rho\,k_1$, $\rho\,k_3$ with $\rho=\pi_\theta/\pi_\text{old}$ | $\mathrm{KL}(\pi_\theta\Vert \pi_\text{ref})$, unbiased |
# | k1 of $\log\pi_\theta-\log\pi_\text{old}$ (`ppo_kl`) | $\mathrm{KL}(\pi_\text{old}\Vert \pi_\theta)$, unbiased |
#
# The table is about **one token**, drawn at one position. A response is drawn token by token, and on a second epoch its
# prefixes came from $\pi_\text{old}$ too. Per position, $\mathbb E[\rho_t k_t\mid y_{<t}]$ is the KL of $\pi_\theta$ at that
# prefix, but the prefixes are $\pi_\text{old}$'s: summed over a response, per-token $\rho\,k$ averages to the per-position KLs at
# $\pi_\text{old}$'s prefixes, not to the sequence $\mathrm{KL}(\pi_\theta\|\pi_\text{ref})$. The weight that makes a whole response
# unbiased is the prefix product $\prod_{u\le t}\rho_u$ ([checked on 1,000 tabular sequence policies](claims.md#prefix-product-weights-are-exact));
# lesson [05](05_gradients.ipynb) §6 shows what each weighting does to the *gradient*, and exercise 2 below asks for both.
#
# On the sample dump, the second epoch's numbers, as `klviz diagnose --logprob-key new_logprob --old-key logprob` reports them:

# %%
off = dg.diagnose(dg.load_rollouts(dg.sample_rollouts_path(), logprob_key="new_logprob", old_key="logprob"))
assert off.off_policy
for name, v in off.extra.items():
    print(f"  {name:26s} {plus_minus(v['token_mean'], v['token_mean_se'], '+.4f')}   {off.directions[name]}")
print(f"  {'naive k1 (new − ref)':26s} {plus_minus(off.estimates['k1']['token_mean'], off.estimates['k1']['token_mean_se'], '+.4f')}"
      f"   {off.directions['k1']}")
rho = off.extra["mean ρ = π/π_old"]

# %%
assert abs(rho["token_mean"] - 1) < 4 * rho["token_mean_se"]      # E_old[π/π_old] = 1: the weights are consistent

# %% [markdown]
# **Takeaway.** On reused tokens, weight one token's term by $\rho=\pi_\theta/\pi_\text{old}$ (clipped in practice), a
# whole response's token $t$ by $\prod_{u\le t}\rho_u$, or compute the reference KL once, on the first epoch. Lesson
# [05](05_gradients.ipynb) shows what each does to gradients.

# %% [markdown]
# ## 5 · Sum vs mean over responses of different lengths <a id="sum-vs-mean"></a>
#
# **Question.** The same batch is logged as a small KL by one framework and a far larger one by another.
# Which is right?
#
# **Answer.** Both, in different units. By the chain rule the *sequence* KL is the sum of per-token terms, so
# `seq-mean-token-sum` (TRL's PPO log, verl's `seq-mean-token-sum`) is nats per response; `token-mean` and
# `seq-mean-token-mean` (verl's in-reward metric `actor/reward_kl_penalty`) are nats per token. They also weigh tokens
# differently ([checked on 1,000 random batches](claims.md#aggregation-weights)):

# %%
lengths = [4, 12, 48]
for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"):
    w = pf.aggregation_weights(lengths, mode)
    print(f"{mode:22s} weight of one token in a response of length " +
          ", ".join(f"{L}: {float(wi):.4f}" for L, wi in zip(lengths, w)))

vals = klviz.k3(sample.ref_logprob - sample.logprob) * sample.mask
for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"):
    w = pf.aggregation_weights(sample.mask.sum(-1), mode)
    by_weights = float((vals * w[:, None]).sum())
    print(f"sample dump, k3, {mode:22s} = {by_weights:.4f}")
    assert abs(by_weights - float(klviz.agg_loss(vals, sample.mask, mode))) < 1e-9

# %% [markdown]
# `seq-mean-token-mean` gives each token of a 4-token response twelve times the weight of a token in a
# 48-token one: a length bias in the penalty's gradient. Compare numbers only within one aggregation, and say
# which one a dashboard shows.

# %% [markdown]
# ## 6 · Negative k1 means in your logs <a id="negative-k1"></a>
#
# **Question.** TRL users see `objective/kl` below zero (trl#925, trl#1161). A KL is never negative: is the
# code broken?
#
# **Math.** k1 is negative on every token the reference likes more than the policy. Its batch mean is unbiased
# ([checked on 2,000 random token pairs](claims.md#k1-k3-unbiased-on-tokens)),
# so it can only be negative through noise, and noise wins when the KL is small next to k1's spread. For the
# Gaussian pair, k1 is itself Gaussian with mean $\mu^2/2$ and variance $\mu^2$, so the mean of $N$ tokens is negative with
# probability $\Phi(-\mu\sqrt N/2)$.

# %%
NUM_BATCHES = 10_000   # simulated batches per dot; more: slower, tighter
fig, ax = new_figure(7.5, 3.2)
ns = np.unique(np.geomspace(1, 10_000, 60).astype(int))
for m, colour in ((0.02, COLORS["k1"]), (0.1, COLORS["k2"]), (0.3, COLORS["k3"])):
    ax.semilogx(ns, [pf.prob_negative_k1_mean(m, int(n)) for n in ns], color=colour, label=f"KL = {m**2 / 2:g}")
    for n in (10, 100):
        sim = pf.negative_k1_mc(m, n, NUM_BATCHES, generator=gen)
        exact = pf.prob_negative_k1_mean(m, n)
        assert abs(sim["fraction"] - exact) < 4 * math.sqrt(exact * (1 - exact) / NUM_BATCHES) + 1e-9
        ax.plot([n], [sim["fraction"]], "o", color=colour, ms=4)
ax.set_xlabel("tokens in the batch N")
ax.set_ylabel("P(batch mean of k1 < 0)")
ax.set_title("How often an unbiased k1 log is negative (dots: simulated)")
ax.legend()
display(fig)
print(f"KL 0.005, 100 tokens: the k1 mean is negative with probability {pf.prob_negative_k1_mean(0.1, 100):.3f}")

# %% [markdown]
# Negative is expected when the policy has barely moved (early training, small learning rate). It is a
# warning only when it is negative *beyond* its standard error: then the tokens were not sampled by the
# distribution whose log-probs you saved (temperature or top-p in generation, a different inference engine,
# off-policy reuse; section [4](#off-policy)). `klviz diagnose` makes exactly that distinction. The
# [panel below](#diagnose) shows how often a batch of your chosen size comes out negative.

# %% [markdown]
# ## 7 · A KL loss computed under `torch.no_grad` <a id="no-grad"></a>
#
# **Question.** A KL term is added to the loss and logged, and the policy drifts as if there were no penalty
# (open-instruct#530; the same slip was reported in SkyRL). Why?
#
# **Answer.** A tensor computed inside `torch.no_grad()` is a constant to autograd: adding it to the loss changes
# the loss *value* (and the log) and nothing else. Autograd shows it directly:

# %%
g = klviz.make_generator(7)
logits = torch.randn(16, 12, generator=g)
ref_logits = logits + torch.randn(16, 12, generator=g)
toks = torch.multinomial(torch.softmax(logits, -1), 1, generator=g)[:, 0]
adv = torch.randn(16, generator=g)
demo = pf.no_grad_kl_demo(logits, ref_logits, toks, adv, beta=0.5)
for kind, d in demo.items():
    print(f"{kind:18s} loss {d['loss']:+.4f}   KL term requires_grad={d['kl_requires_grad']!s:5s}  "
          f"|grad| = {float(d['grad'].norm()):.5f}")

# %%
assert torch.equal(demo["kl under no_grad"]["grad"], demo["pg only"]["grad"])       # identical gradient
assert demo["kl under no_grad"]["loss"] != demo["pg only"]["loss"]                  # but a different logged loss
assert not torch.allclose(demo["kl with grad"]["grad"], demo["pg only"]["grad"])

# %% [markdown]
# **Takeaway.** Assert `kl_loss.requires_grad` once in your training step. (Computing the *reference*
# log-probs under `no_grad` is right; computing the policy's side of the KL there is the bug.)

# %% [markdown]
# ## 8 · "Mix in samples from p" without importance weights <a id="mix-samples"></a>
#
# **Question.** A common suggestion is to sample part of the batch from $p$ so that regions where $q$ is small are
# not under-explored. What does the estimate become?
#
# **Math.** With a fraction $\alpha$ of the samples from $p$ and k3 averaged as usual, the mean is
# $(1-\alpha)\,\mathrm{KL}(q\|p)+\alpha\,\big(\chi^2(p\|q)-\mathrm{KL}(p\|q)\big)$: on $p$'s samples the ratio $p/q$ is the *inverted* one of
# section [1](#inverted-ratio). Weighting every sample by $q(x)/m(x)$, with $m=(1-\alpha)q+\alpha p$ the mixture that
# actually drew it, restores $\mathrm{KL}(q\|p)$ exactly ([checked on 1,000 random token pairs](claims.md#mixture-sampling-needs-weights)).

# %%
MU = 1.0
print(f"q = N(0,1), p = N({MU},1), true KL(q‖p) = {MU**2 / 2}")
for alpha in (0.0, 0.1, 0.25, 0.5):
    ex = pf.mixture_k3_exact(MU, alpha)
    sim = pf.mixture_k3_mc(MU, alpha, N_SAMPLES, generator=gen)
    print(f"  α = {alpha:4}: naive mean {plus_minus(sim['naive'], sim['naive_se'], '.4f')} (exact {ex['naive']:.4f});"
          f"  weighted {plus_minus(sim['weighted'], sim['weighted_se'], '.4f')}")
    assert abs(sim["naive"] - ex["naive"]) < 4 * sim["naive_se"]
    assert abs(sim["weighted"] - ex["kl"]) < 4 * sim["weighted_se"]


# %% [markdown]
# **Takeaway.** Samples from any other distribution need the weight (sampler in the expectation) / (sampler
# that drew them) ([checked on 1,000 random token pairs](claims.md#mixture-sampling-needs-weights)); lesson [01](01_sampling_as_weighting.ipynb) shows this on tokens.

# %% [markdown]
# ## 9 · A widely quoted variance table, measured <a id="variance-table"></a>
#
# A widely shared write-up quotes a "GPT-2 medium" table (relative variance k1 1.0, k2 0.3, k3 0.4; k2 bias 12%) with no source.
# Numbers like these depend on how far apart the two policies are, so a table without the KL it was measured at
# says little. Here is the same table *measured*: exact values for the Gaussian pair at three distances, and a
# measurement on the tiny language model (its RL-tuned policy against its reference: 120 sampled responses,
# exact KL from the full next-token distributions at every position).

# %%
def gaussian_row(mu):
    var1, var2, var3 = mu**2, mu**4 / 2 + mu**6 / 4, math.exp(mu**2) - 1 - mu**2   # closed forms (REFERENCE §2)
    return {"k1": (1.0, 0.0), "k2": (var2 / var1, 100 * mu**2 / 4), "k3": (var3 / var1, 0.0)}

table = {f"Gaussian, KL = {mu**2 / 2:g}": gaussian_row(mu) for mu in (0.1, 0.5, 1.0, 1.5)}

ref_lm, old_lm = lm.load_tiny_lm("ref"), lm.load_tiny_lm("old")
prompts = [p for p in lm.PROMPTS for _ in range(12)]
ro = lm.sample_rollouts(old_lm, prompts, klviz.make_generator(0), max_new_tokens=48)
logp_old, logp_ref = lm.next_token_logprobs(old_lm, ro), lm.next_token_logprobs(ref_lm, ro)
mask = ro.response_mask.bool()
ids = ro.input_ids.unsqueeze(-1)
log_r_bt = (logp_ref.gather(-1, ids) - logp_old.gather(-1, ids)).squeeze(-1)   # [B, T] log π_ref − log π
exact_bt = klviz.exact_kl(logp_old, logp_ref)                                  # [B, T] KL(π ‖ π_ref) per position
log_r, exact_per_pos = log_r_bt[mask], exact_bt[mask]
measured = pf.relative_variance_table(log_r, float(exact_per_pos.mean()))
table[f"tiny LM, KL = {float(exact_per_pos.mean()):.3f}/token"] = {k: (v["var_rel_k1"], v["bias_pct"]) for k, v in measured.items()}

print(f"{'':30s}{'Var k2/Var k1':>14s}{'Var k3/Var k1':>14s}{'k2 bias':>10s}{'k1, k3 bias':>18s}")
for name, row in table.items():
    print(f"{name:30s}{row['k2'][0]:14.3f}{row['k3'][0]:14.3f}{row['k2'][1]:9.1f}%{row['k1'][1]:8.1f}%{row['k3'][1]:8.1f}%")
print(f"{'quoted (unsourced)':30s}{0.3:14.3f}{0.4:14.3f}{12.0:9.1f}%")

# k1 and k3 are unbiased: their error against the exact per-position KL is zero within its standard error
# (responses are the independent units: tokens of one response share their prefix)
for name, fn in (("k1", klviz.k1), ("k3", klviz.k3)):
    diff, se = klviz.statistics.clustered_mean_se(fn(log_r_bt) - exact_bt, mask)
    print(f"{name}: mean − exact = {plus_minus(diff, se, '+.4f')}")
    assert abs(diff) < 4 * se

row15 = table["Gaussian, KL = 1.125"]                        # both variance ratios pass 1 there

# %%
assert abs(row15["k2"][0] - 2.3906) < 1e-3 and abs(row15["k3"][0] - 2.7731) < 1e-3 and min(row15["k2"][0], row15["k3"][0]) > 1

# %% [markdown]
# Read it row by row. When the policies are close, k2 and k3 have far less variance than k1 and k2's bias is
# negligible. As they separate, both ratios climb; at KL = 1.125 ($\mu=1.5$) **both** pass 1 (k2's 2.39, k3's 2.77: k3's
# variance grows like $e^{\mu^2}$ for Gaussians, k2's polynomially), while k2's bias grows like $\mu^2/4$. The tiny language model's tokens are heavy-tailed, so its
# row looks like a far-apart Gaussian although its KL is small; its k1 and k3 "bias" entries are Monte Carlo
# noise (checked against the exact KL just above). A single row of ratios with no KL and no distribution
# attached, as it is often quoted, cannot be reproduced or compared.
# (Schedule advice sometimes given with it, k2 for warm-up then k3, is an anecdote; it is not tested here, so it is not taught.)

# %% [markdown]
# ## 10 · Misspelled estimator names <a id="fall-through"></a>
#
# A config key with a typo, or a name from another framework, can silently select a default estimator
# (AReaL PR #408 fixed such a fall-through). klviz refuses unknown names, naming the argument
# ([checked on 1,000 names](claims.md#unknown-estimator-names-raise)):

# %%
try:
    klviz.kl_penalty(torch.tensor([-1.0]), torch.tensor([-1.2]), "low-var-kl")
except ValueError as err:
    print("ValueError:", err)
    assert "kind" in str(err)

# %% [markdown]
# ## 11 · Diagnose your own rollouts <a id="diagnose"></a>
#
# Save one batch of your run: `[batch, tokens]` tensors `logprob` (the policy's log-probs of its sampled
# tokens), `ref_logprob`, `response_mask`, and optionally `old_logprob` (the sampler's log-probs when the tokens
# came from another policy). `docs/rollout_format.md` shows how to save it from verl and from TRL; then
#
# ```
# klviz diagnose my_batch.npz --plot report.png
# ```
#
# Files are read without running anything in them: a `.pt` file is read from its zip archive's headers and storages,
# never through `torch.load` or any unpickler that could call code (a file whose pickle asks for more is refused), `.npz`
# with `allow_pickle=False`, `.safetensors` when installed; a broken file gets one line of explanation and exit status 2.
# Without a file it reads the sample dump. This is what the command prints for it:

# %%
from klviz.cli import main as klviz_cli
status = klviz_cli(["diagnose"])

# %%
assert status == 0

# %% [markdown]
# How to read it: the first table is the value each framework would log, with a standard error that treats
# *responses* as the independent units (tokens of one response are correlated). "What each number estimates"
# follows from which log-probs sampled the tokens. "Agreement" uses the identity $k_1-k_3=1-r$: on-policy,
# $\mathbb{E}[r]=1$, so a mean ratio far from 1 says the log-probs you saved are not those of the sampler. The clamp
# table is section [2](#clamps) on your data, and each trouble sign comes with what to check. The PNG report:

# %%
fig = dg.plot_report(first)
display(fig)

# %% [markdown]
# **The panel.** How noisy is the KL your trainer logs? The dump holds 120 responses; the panel draws 400
# batches of $B$ of them (with replacement) and shows the spread of the logged value for k1, k2 and k3, after a
# clamp and with the log-probs stored in the chosen precision. Pass your own file with
# `RolloutPanel(dg.load_rollouts("my_batch.npz"))`. Try: $B=2$ with k1 (how often is it negative?); the verl
# clamp with k3; `bfloat16` storage.

# %%
from klviz.widgets.lesson06 import RolloutPanel

panel = RolloutPanel(device="cpu")
panel

# %%
# the panel's whole-dump values are the report's token-means
for k in ("k1", "k2", "k3"):
    assert abs(panel.last["stats"][k]["full"] - first.estimates[k]["token_mean"]) < 1e-9
small = panel.set(batch_sequences=4)["stats"]["k1"]["boot_std"]
large = panel.set(batch_sequences=64)["stats"]["k1"]["boot_std"]
print(f"spread of the logged k1 at B = 4: {small:.4f}; at B = 64: {large:.4f} (ratio {small / large:.2f}; √16 = 4)")
panel.set(batch_sequences=16)
print(f"panel update: compute {panel.last_compute_ms:.1f} ms")


# %% [markdown]
# ## FAQ <a id="faq"></a>
#
# **Which direction does verl's / TRL's KL go?** (trl#2914, verl#3061) The policy that *sampled* the tokens fixes
# it, not the argument order: `kl_penalty(logprob, ref_logprob)` on the policy's own tokens estimates
# $\mathrm{KL}(\pi\|\pi_\text{ref})$, and PPO's `approx_kl` on the rollout tokens estimates $\mathrm{KL}(\pi_\text{old}\|\pi_\theta)$. On reused
# tokens the naive number is no KL at all ([checked on 1,000 random token triples](claims.md#k1-on-old-tokens-is-a-difference-of-kls)). See [00 Start here](00_start_here.ipynb)
# and [section 4](#off-policy).
#
# **Why isn't this the KL formula $\sum_x p\log(p/q)$?** (trl#2854, trl#3104) It is, estimated: averaging over tokens drawn
# from $q$ replaces the factor $q(x)$ by how often $x$ is drawn, so one sampled token per position is an unbiased estimate
# of the vocabulary sum. The exact sum (TRL's old `F.kl_div` path) needs full logits. See [01 Sampling as weighting](01_sampling_as_weighting.ipynb).
#
# **Per token or per sequence?** (trl#3556) By the chain rule the per-token k1 summed over a response estimates the
# sequence KL; a token-mean is the same thing divided by length, with a different weighting of short and long responses.
# For the *gradient* the difference is larger than a weighting: a per-token KL loss (or a per-token k1 reward without
# reward-to-go) gives only the **partial** gradient of the sequence KL ([checked on 1,000 tabular sequence policies](claims.md#token-level-losses-give-the-partial-gradient)),
# which leaves out how a token steers the later ones; k1 in the reward summed to go gives the full one ([05 Gradients](05_gradients.ipynb) §5). See [section 5](#sum-vs-mean)
# and [04 Worked tokens](04_worked_tokens.ipynb).
#
# **KL in the reward or in the loss, and is it counted twice?** (verl#3276, verl#509, OpenRLHF#768) In the reward, the
# detached k1 value enters the advantages and acts through the score function; in the loss, the estimator is
# differentiated, and only some choices (k2, or ratio-corrected k3) give the gradient of $\mathrm{KL}(\pi\|\pi_\text{ref})$. Using
# both penalises twice with two different gradients; pick one. See [05 Gradients](05_gradients.ipynb).
#
# **Why does verl clamp k3 to $[-10,10]$, and why the lower bound?** (verl#2928) The upper bound caps rare huge tokens
# (and also binds at $\log r<-11$, on tokens the policy pushed far above the reference, zeroing their gradient); the lower
# one can never act because $k_3\ge0$ ([checked on 2,000 random token pairs](claims.md#k2-k3-never-negative)). Clamps bias the mean downwards when policies drift
# ([checked on 1,000 random token pairs](claims.md#clamps-only-lower-k3)). See [section 2](#clamps).
#
# **`low_var_kl` gives NaN / inf.** (verl#891, verl#751) `exp(log r)` overflows float32 beyond $\log r\approx88$, and
# $-\infty-(-\infty)$ at padded positions is NaN: clamp the input (verl uses 20): that is what prevents the
# overflow. `expm1(log r) - log r` does not help there (it overflows at the same point); it keeps k3's digits near
# $\log r=0$, where `exp(log r) - 1` loses them. And mask padding before reducing. `klviz diagnose` lists NaN/inf tokens and huge ratios. See [section 2](#clamps) and [section 11](#diagnose).
#
# **My logged k1 KL is negative.** (trl#925, trl#1161) k1 is unbiased but negative on tokens the reference prefers; when
# the KL is small, the batch mean is negative by chance. Clearly negative beyond its standard error means the tokens
# were not sampled by the scored distribution. See [section 6](#negative-k1).
#
# **Is k3 in the loss biased, and what do the `+` variants and ratio corrections fix?** (verl PR #2953 and #6058,
# trl#4637, trl#4967, TRL PR #6503, OpenRLHF PR #1309, SkyRL#805) k3's value is unbiased but its gradient as a loss
# follows the forward KL $\mathrm{KL}(\pi_\text{ref}\|\pi)$ ([checked on 1,000 random token pairs](claims.md#on-policy-gradient-table)); multiplying by $\rho=\pi_\theta/\mathrm{sg}(\pi_\text{sampler})$ or using the
# straight-through "k3+" gives the gradient of $\mathrm{KL}(\pi\|\pi_\text{ref})$ token by token; for a whole response
# off-policy a per-token $\rho$ still leaves the prefixes $\pi_\text{old}$'s, and only the prefix product corrects them. See
# [05 Gradients](05_gradients.ipynb) §1 and §6, and audit your own term with `klviz.audit_loss`.
#
# **I added a KL loss and nothing changed.** (open-instruct#530, SkyRL) It was computed under `torch.no_grad`: the
# value changes, the gradient does not. See [section 7](#no-grad); `klviz.audit_loss` on your KL function reports such a
# term as following `"zero"`.
#
# **A typo in the estimator name went unnoticed.** (AReaL PR #408) Some code falls through to a default estimator
# on an unknown name; check that unknown names raise. See [section 10](#fall-through).
#
# **Can I try training with each placement myself?** Yes: [07 Mini RLHF lab](07_mini_rlhf_lab.ipynb) trains a tiny
# policy with each KL placement and shows reward, KL and entropy live.

# %% [markdown]
# ## Takeaways
#
# - Ratio = target over sampler. The inverted ratio measures $\chi^2-\mathrm{KL}$ ([checked on 1,000 random token pairs](claims.md#inverted-ratio-measures-chi2-minus-kl)): fine
#   at $\mu=0.1$, 144% high at $\mu=1$.
# - Clamps are free while the policies are close and biased (downwards for k3 ([checked on 1,000 random token pairs](claims.md#clamps-only-lower-k3))) once they drift;
#   OpenRLHF's also clips k1.
# - Low precision: k1 averages rounding out; k2 and k3 turn it into a positive bias
#   ([checked on 1,000 random logit batches](claims.md#rounding-noise-biases-k2-and-k3-upwards)), which dominates when the true KL is near zero. Upcast logits, score both models alike.
# - Reused (off-policy) tokens need $\rho=\pi_\theta/\pi_\text{old}$ per token; without it, k1 is $\mathrm{KL}(\pi_\text{old}\|\pi_\text{ref})-\mathrm{KL}(\pi_\text{old}\|\pi_\theta)$.
#   Whole responses need the prefix product $\prod_{u\le t}\rho_u$ ([checked on 1,000 tabular sequence policies](claims.md#prefix-product-weights-are-exact)).
# - Per-token and per-sequence KLs differ in units and in how they weigh long responses ([checked on 1,000 random batches](claims.md#aggregation-weights)).
# - A negative k1 mean is noise unless it is beyond its standard error; a KL under `no_grad` has no gradient; samples
#   from another distribution need importance weights; a variance table means nothing without its KL.
# - `klviz diagnose` checks your own batch for what a dump can show: the values, the clamps, the precision, the sampler's
#   consistency, the aggregation. It cannot see how the KL term was wired into the loss (under `no_grad`, detached, the
#   wrong placement, per-token where a sequence weight is needed): `klviz.audit_loss` (lesson [05](05_gradients.ipynb) §6),
#   or `klviz audit FILE.py:FUNCTION` from a shell, runs your KL function and says which gradient it follows.

# %% [markdown]
# ## Exercises
#
# **Exercise 1.** Fix the widely copied `compute_kl`. Tokens were sampled by the old policy; return, per token, the k3
# estimate of $\mathrm{KL}(\text{old}\,\|\,\text{new})$, accurate even when the two log-probs are almost equal.

# %%
def my_compute_kl(logp_new, logp_old):
    ...   # your code: one k3 value per token

klviz.check.lesson06.fixed_compute_kl(my_compute_kl)


# %%
# Solution: r = new/old (target over sampler); r - 1 = expm1(log r) keeps tiny differences exact
def my_compute_kl(logp_new, logp_old):
    log_r = logp_new - logp_old
    return torch.expm1(log_r) - log_r

assert klviz.check.lesson06.fixed_compute_kl(my_compute_kl)
klviz.check.lesson06.fixed_compute_kl(my_compute_kl)


# %% [markdown]
# **Exercise 2 (a).** A second-epoch batch: `logprob` from the current policy, `old_logprob` from the policy that
# sampled the tokens, `ref_logprob`, and a 0/1 `mask` (padding may hold junk). Return the token-mean over the mask
# of a per-token estimate of $\mathrm{KL}(\pi\,\|\,\pi_\text{ref})$ that is unbiased at every position, given its prefix.

# %%
def my_is_kl(logprob, ref_logprob, old_logprob, mask):
    ...   # your code: one number

klviz.check.lesson06.importance_weighted_kl(my_is_kl)


# %%
# Solution: weight k1 by rho = pi/pi_old, then average over the counted tokens only
def my_is_kl(logprob, ref_logprob, old_logprob, mask):
    rho = torch.exp(logprob - old_logprob)
    per_token = torch.where(mask > 0, rho * (logprob - ref_logprob), torch.zeros_like(logprob))
    return per_token.sum() / mask.sum()

assert klviz.check.lesson06.importance_weighted_kl(my_is_kl)
klviz.check.lesson06.importance_weighted_kl(my_is_kl)


# %% [markdown]
# **Exercise 2 (b): whole responses.** The same second-epoch batch, read as responses: every token of a row, its
# prefix included, was drawn by $\pi_\text{old}$. Return the mean over the responses of an unbiased estimate of the
# **sequence** KL, $\mathrm{KL}(\pi\,\|\,\pi_\text{ref})=\mathbb E_{y\sim\pi}\big[\sum_t \log\pi(y_t|y_{<t})-\log\pi_\text{ref}(y_t|y_{<t})\big]$.
# The check averages your function over all 27 responses of a small policy, each weighted by $\pi_\text{old}$: an
# answer with per-token weights comes out close, and wrong.

# %%
def my_sequence_is_kl(logprob, ref_logprob, old_logprob, mask):
    ...   # your code: one number

klviz.check.lesson06.sequence_importance_weighted_kl(my_sequence_is_kl)


# %%
# Solution: weight token t by the product of rho over the tokens up to t (the prefix was drawn by pi_old too)
def my_sequence_is_kl(logprob, ref_logprob, old_logprob, mask):
    weight = torch.exp(torch.cumsum((logprob - old_logprob) * mask, -1))
    return (weight * (logprob - ref_logprob) * mask).sum(-1).mean()

assert klviz.check.lesson06.sequence_importance_weighted_kl(my_sequence_is_kl)
klviz.check.lesson06.sequence_importance_weighted_kl(my_sequence_is_kl)


# %% [markdown]
# **Exercise 3.** Write the KL loss term: the masked token-mean of k3 (with $\log r$ = `ref_logprob - logprob`) as a
# tensor whose gradient reaches `logprob`.

# %%
def my_kl_term(logprob, ref_logprob, mask):
    ...   # your code: a one-element tensor

klviz.check.lesson06.kl_term_with_gradient(my_kl_term)


# %%
# Solution: nothing under no_grad, nothing detached, a tensor (not a float)
def my_kl_term(logprob, ref_logprob, mask):
    log_r = ref_logprob - logprob
    return ((torch.expm1(log_r) - log_r) * mask).sum() / mask.sum()

assert klviz.check.lesson06.kl_term_with_gradient(my_kl_term)
klviz.check.lesson06.kl_term_with_gradient(my_kl_term)

# %% [markdown]
# ## References
#
# - J. Schulman, [Approximating KL Divergence](http://joschu.net/blog/kl-approx.html) (2020).
# - verl, [`core_algos.py`](https://github.com/volcengine/verl/blob/main/verl/trainer/ppo/core_algos.py): `kl_penalty`, `low_var_kl` and its clamps; issues [#2928](https://github.com/volcengine/verl/issues/2928), [#891](https://github.com/volcengine/verl/issues/891).
# - OpenRLHF, [`models/utils.py`](https://github.com/OpenRLHF/OpenRLHF/blob/main/openrlhf/models/utils.py): `compute_approx_kl` with its ±10 clamp.
# - TRL issues [#925](https://github.com/huggingface/trl/issues/925) (negative KL) and [#2914](https://github.com/huggingface/trl/issues/2914) (direction); open-instruct [#530](https://github.com/allenai/open-instruct/issues/530) (no_grad).
# - Y. Tang, R. Munos, [On a few pitfalls in KL divergence gradient estimation for RL](https://arxiv.org/abs/2506.09477) (2025).
# - `docs/rollout_format.md`: the dump format of `klviz diagnose`.
# - Next: [07 Mini RLHF lab](07_mini_rlhf_lab.ipynb).
