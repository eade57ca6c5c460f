# Generated from notebooks/05_gradients.ipynb by `make sync-notebooks`: edit the notebook, not this file.

# %% [markdown]
# # 05 · Gradients: a correct value is not a correct gradient
#
# Lesson 02 judged k1, k2 and k3 by their **values**: k1 and k3 average to $\mathrm{KL}(\pi\,\|\,\pi_\text{ref})$, k2
# nearly does. Training does not use the value. It uses a **gradient**, and how the estimator enters the loss decides
# which gradient that is. verl puts `low_var_kl` (k3) in the loss, GRPO does the same, OpenRLHF and TRL's PPO put k1
# in the reward. This lesson computes, exactly and by sampling, what each of these choices really pushes the policy
# toward, and where it ends up.
#
# **What you will learn**
# - for one token, every placement gives a per-sample gradient $c(x)\,\nabla\log\pi(x)$, and which $c$ each one has;
# - k1 as a loss averages to **zero**; k2 as a loss **equals** k1 in the reward, sample by sample; k3 as a loss follows
#   the **forward** KL; k3 in the reward is biased; the ratio-corrected k3 (DeepSeek-V3.2, TRL
#   `use_bias_correction_kl`) and verl's straight-through `k3+` recover the reverse-KL gradient;
# - how noisy each gradient estimate is, as a function of the number of tokens $N$;
# - on the triangle of three tokens: the field each choice follows, and where gradient descent goes;
# - in a KL-regularised bandit, the fixed point of each choice against the optimum $\pi^*\propto\pi_\text{ref}\,e^{R/\beta}$;
# - for sequences: token-level losses give only a **partial** gradient; k1 in the reward with reward-to-go gives the full one;
# - what a clamp does to the ratio-corrected k3 (verl's clamped `low_var_kl` times $\rho$; NeMo-RL);
# - off-policy (tokens from $\pi_\text{old}$): the bias of each placement, with and without importance weights, which way
#   k1 as a loss really moves the policy, and the bias of what PPO-style trainers actually do with a KL in the reward
#   (the value frozen at rollout, the advantage weighted by $\rho$);
# - for whole responses off-policy: why a per-token $\rho$ is a one-token correction, what TRL's
#   `use_bias_correction_kl` corrects and what it leaves, the prefix-product weight that is exact, and how to audit your
#   own KL term in place with `klviz.audit_loss` (the same check as `klviz audit`).
#
# **Time**: about 40 minutes of reading, plus two panels and three exercises.
# **Runs in**: about 25 s on an idle 2-core CPU (measured under nbval: 21 s of CPU time; 61 s of wall time on a
# machine busy with other jobs).
#
# Notation as in the whole suite: $\pi=\pi_\theta=\mathrm{softmax}(\theta)$ is the policy being trained, tokens
# $x\sim\pi$ (on-policy), $r(x)=\pi_\text{ref}(x)/\pi(x)$ (target over sampler), $\log r = \log\pi_\text{ref}(x)-\log\pi(x)$,
# and the **score** $s(x)=\nabla_\theta\log\pi(x)$, which for a softmax is $e_x-\pi$ and has mean zero: $\mathbb E_\pi[s]=0$.

# %%
import klviz
device = klviz.setup_notebook()

# %%
import math

import numpy as np
import torch
from IPython.display import display

from klviz import frameworks as fw
from klviz.bandit import (BETA_GRID, REF_PROBS, REWARDS, SEQUENCE_WEIGHTS, SequenceToy, bandit_table, forward_kl_optimum,
                          offpolicy_expected_gradient, reverse_kl_optimum, reward_updates, tv_distance)
from klviz.divergences import categorical_kl
from klviz.plotting import COLORS, new_figure
from klviz.statistics import plus_minus
from klviz.policies import TOY_VOCAB, move_policy, toy_sampler_logits
from klviz.simplex import CHOICE_COLORS, CHOICE_STYLES, CHOICES, descent_paths, gradient_error_terms
from klviz.usage import EstimatorUse
from klviz.widgets.lesson05 import BanditPanel, SimplexFlowPanel

# %% [markdown]
# ## 1. One token, eight ways to put a KL in the loss
#
# **Question.** The policy $\pi$ has drifted from $\pi_\text{ref}$. You sample one token $x\sim\pi$ and add a KL term
# for it to the loss. Which gradient do you get, on average?
#
# **Intuition.** A loss built from a sampled token is differentiated *with the token held fixed*: autograd sees
# $\log\pi(x)$, not the fact that $x$ was drawn from $\pi$. An estimator whose *value* averages to the KL can
# therefore have a *gradient* that averages to something else: the derivative of the sampling distribution is missing.
#
# **Math.** Every placement gives a per-sample gradient $c(x)\,s(x)$; only the coefficient $c$ differs
# ([checked on 1,000 random token pairs](claims.md#k2-loss-equals-k1-reward-per-sample)).
#
# | choice | surrogate for token $x$ | $c(x)$ | expected gradient $\mathbb E_\pi[c\,s]$ |
# |---|---|---|---|
# | k1 in the loss | $-\log r$ | $1$ | $\mathbb E[s]=0$ |
# | k2 in the loss | $\tfrac12(\log r)^2$ | $-\log r = k_1$ | $\nabla\mathrm{KL}(\pi\|\pi_\text{ref})$ |
# | k3 in the loss | $(r-1)-\log r$ | $1-r$ | $-\mathbb E_\pi[r\,s] = -\sum_x\pi_\text{ref}(x)\,s(x) = \nabla\mathrm{KL}(\pi_\text{ref}\|\pi)$ |
# | k1 in the reward | $\mathrm{sg}(k_1)\log\pi(x)$ | $k_1$ | $\nabla\mathrm{KL}(\pi\|\pi_\text{ref})$ (the policy-gradient theorem) |
# | k2 in the reward | $\mathrm{sg}(k_2)\log\pi(x)$ | $k_2$ | biased |
# | k3 in the reward | $\mathrm{sg}(k_3)\log\pi(x)$ | $k_3$ | $\nabla\mathrm{KL}(\pi\|\pi_\text{ref})-\nabla\mathrm{KL}(\pi_\text{ref}\|\pi)$ |
# | k3·ρ in the loss | $\rho\,k_3$, $\rho=\pi(x)/\mathrm{sg}(\pi(x))$ | $k_1$ | $\nabla\mathrm{KL}(\pi\|\pi_\text{ref})$ |
# | k3+ in the loss | value of $k_3$, gradient of $k_2$ | $k_1$ | $\nabla\mathrm{KL}(\pi\|\pi_\text{ref})$ |
#
# ($\mathrm{sg}$ = stop-gradient, `.detach()`. "In the reward" means the value is subtracted from the reward and enters
# through the policy-gradient term $-A\,\log\pi(x)$, so its own gradient is the value times the score.) The reverse
# KL $\mathrm{KL}(\pi\|\pi_\text{ref})$ is what RLHF regularises; its gradient is the target.
#
# The library keeps this table in one place: `klviz.gradient_coefficient` checks its input and hands the work to
# `klviz.gradients.use_coefficient`, which is the table:

# %%
klviz.show_source(klviz.gradient_coefficient)
klviz.show_source(klviz.gradients.use_coefficient)

# %% [markdown]
# **Code.** Do not trust the table: build each surrogate loss the way RL code builds it, one token at a time, and let
# autograd differentiate it. The expected gradient is then $\sum_x \pi(x)\,\nabla L_x(\theta)$ with the weights
# $\pi(x)$ **detached** (the sampling is not differentiated, exactly as in training). The policy below is the lesson-01
# next-token distribution after an RL step that sharpened it and favoured " sofa".

# %%
log_ref = toy_sampler_logits().double()                                   # pi_ref over 12 tokens
logits = move_policy(log_ref, temperature=0.8, push=1.5, push_token=1)    # pi_theta: sharper, likes " sofa"
pi, ref = logits.exp(), log_ref.exp()
print(f"KL(pi || pi_ref) = {float(categorical_kl(pi, ref)):.4f}   KL(pi_ref || pi) = {float(categorical_kl(ref, pi)):.4f}")


def surrogate(theta, x, use):
    # The loss that one sampled token x contributes, built as RL code builds it.
    log_pi = torch.log_softmax(theta, -1)[x]
    log_r = log_ref[x] - log_pi                               # log pi_ref(x) - log pi(x)
    k = {"k1": -log_r, "k2": 0.5 * log_r ** 2, "k3": torch.expm1(log_r) - log_r}
    value = k[use.estimator]
    if use.weighting == "rho":                                # rho = pi / sg(pi): value 1, gradient of log pi
        value = torch.exp(log_pi - log_pi.detach()) * value
    elif use.weighting == "straight-through":                 # value of k3, gradient of k2
        value = value.detach() + k["k2"] - k["k2"].detach()
    return value if use.placement == "loss" else value.detach() * log_pi


def brute_force_expected_gradient(theta, use):
    theta = theta.detach().clone().requires_grad_(True)
    per_token = torch.stack([surrogate(theta, x, use) for x in range(theta.numel())])
    weights = torch.softmax(theta, -1).detach()               # sampling weights: not differentiated
    (grad,) = torch.autograd.grad((weights * per_token).sum(), theta)
    return grad


rev = klviz.reverse_kl_gradient(logits, log_ref)              # autograd of the exact sum, reverse KL
fwd = klviz.forward_kl_gradient(logits, log_ref)              # autograd of the exact sum, forward KL
expected = {}
print(f"\n{'choice':<16}{'|E[grad]|':>10}{'vs reverse':>12}{'vs forward':>12}{'cos(reverse)':>14}")
for name, use in CHOICES.items():                            # name is the use's label: "k3·ρ in loss", ...
    g = brute_force_expected_gradient(logits, use)
    assert torch.allclose(g, klviz.expected_kl_gradient(logits, log_ref, use), atol=1e-12), name
    expected[name] = g
    cos = float(g @ rev / (g.norm() * rev.norm())) if g.norm() > 1e-12 else float("nan")
    print(f"{name:<16}{float(g.norm()):10.4f}{float((g - rev).norm() / rev.norm()):12.4f}"
          f"{float((g - fwd).norm() / fwd.norm()):12.4f}{cos:14.3f}")
print(f"{'(reverse KL)':<16}{float(rev.norm()):10.4f}   columns 3-4: ||E[grad] - target|| / ||target||")

# %% [markdown]
# The brute-force autograd sums agree with `klviz.expected_kl_gradient` to float64 precision, and the columns read
# off the table: k1 in the loss has no mean gradient at all, four choices sit exactly on the reverse-KL gradient,
# k3 in the loss sits exactly on the **forward**-KL gradient, and k3 in the reward is the difference of the two, for every
# pair of token distributions ([checked on 1,000 random token pairs](claims.md#on-policy-gradient-table)).
# The asserts below hold to $10^{-12}$:

# %%
E = expected
assert E["k1 in loss"].abs().max() < 1e-12                                   # does nothing on average
for name in ("k2 in loss", "k1 in reward", "k3·ρ in loss", "k3+ in loss"):
    assert torch.allclose(E[name], rev, atol=1e-12), name                    # the reverse-KL gradient
assert torch.allclose(E["k3 in loss"], fwd, atol=1e-12)                      # the forward-KL gradient
assert torch.allclose(E["k3 in reward"], rev - fwd, atol=1e-12)              # biased: reverse minus forward
assert (E["k2 in reward"] - rev).norm() > 0.05 * rev.norm()                  # biased
print("all identities hold to 1e-12")

# %% [markdown]
# **k2 in the loss is k1 in the reward, sample by sample** ([checked on 1,000 random token pairs](claims.md#k2-loss-equals-k1-reward-per-sample)). Not only on average: $\nabla\tfrac12(\log r)^2 =
# \log r\cdot\nabla(-\log\pi(x)) = k_1\,s(x)$, which is exactly the gradient of $\mathrm{sg}(k_1)\log\pi(x)$. The same
# holds for `k3+` and the ratio-corrected k3. Check it on 64 sampled tokens, one autograd call per token:

# %%
gen = klviz.make_generator(0)
tokens = torch.multinomial(pi, 64, replacement=True, generator=gen)


def per_sample_gradient(x, use):
    theta = logits.detach().clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(surrogate(theta, int(x), use), theta)
    return grad


worst = 0.0
for x in tokens:
    g_k1_reward = per_sample_gradient(x, CHOICES["k1 in reward"])
    for name in ("k2 in loss", "k3·ρ in loss", "k3+ in loss"):
        worst = max(worst, float((per_sample_gradient(x, CHOICES[name]) - g_k1_reward).abs().max()))
print(f"largest difference from k1-in-the-reward over 64 tokens x 3 choices: {worst:.1e}")

# %%
assert worst < 1e-12

# %% [markdown]
# **Sampled estimates and their spread.** In training the expectation is a mean over $N$ sampled tokens. Each panel
# below shows one choice: bars are the mean of $N$ per-sample gradients (one bar per logit) with ±2 standard errors,
# black dashes the true reverse-KL gradient, red crosses the forward-KL gradient.

# %%
N_SAMPLES = 4_000          # tokens per estimate (more: slower, tighter bars)
fig, axes = new_figure(9.0, 4.8, nrows=2, ncols=4, sharex=True, sharey=True)
x = np.arange(len(TOY_VOCAB))
for ax, (name, use) in zip(axes.flat, CHOICES.items()):
    per = klviz.sampled_kl_gradients(logits, log_ref, use, None, N_SAMPLES, generator=klviz.make_generator(1))
    mean, se = per.mean(0), per.std(0) / math.sqrt(N_SAMPLES)
    assert ((mean - E[name]).abs() <= 4.5 * se + 1e-12).all(), name   # sampled mean agrees with the exact sum
    ax.bar(x, mean.numpy(), yerr=2 * se.numpy(), color=CHOICE_COLORS[name], alpha=0.75, capsize=1.5,
           error_kw={"lw": 0.8, "ecolor": COLORS["ink"]})
    ax.plot(x, rev.numpy(), "_", color=COLORS["ink"], ms=9, mew=2)
    ax.plot(x, fwd.numpy(), "x", color=COLORS["forward"], ms=4)
    ax.set_title(name, fontsize=9, color=CHOICE_COLORS[name])
    ax.axhline(0, color=COLORS["ink"], lw=0.5)
for ax in axes[1]:
    ax.set_xticks(x, [t.strip() for t in TOY_VOCAB], rotation=90, fontsize=6.5)
for ax in axes[:, 0]:
    ax.set_ylabel("∂/∂θ_x  (mean ± 2 SE)")
fig.suptitle(f"Mean gradient of {N_SAMPLES:,} sampled tokens per choice;  — true reverse-KL gradient,  × forward-KL gradient",
             fontsize=9.5)
display(fig)

# %% [markdown]
# **Takeaway.** A KL estimator is a *value*; what it does in training depends on where its gradient comes from.
# Of the eight common choices, four follow $\nabla\mathrm{KL}(\pi\|\pi_\text{ref})$ exactly ([checked on 1,000 random token pairs](claims.md#on-policy-gradient-table)) (k1 in the reward, k2 in the
# loss, the ratio-corrected k3, k3+), k3 in the loss follows the forward KL, and the other three are biased; k1 in the
# loss only adds noise.
#
# **A clamp breaks the equivalence.** The table assumes the estimator as written. verl's `low_var_kl` clamps $k_3$ at 10,
# and a clamped value has zero gradient. Multiply that by $\rho$ and the token's gradient is $k_3\,\nabla\rho = 10\,s(x)$
# instead of $k_1\,s(x)$: on exactly the tokens where policy and reference disagree most, the term pushes with a constant
# of the wrong sign. The combination arises wherever a ratio multiplies an already clamped $k_3$: NeMo-RL computed
# `weights * calculate_kl(...)` between its PR #2506 and PR #2958 (June 2026;
# `fw.nemo_rl_kl_loss(weight_inside_clamp=False)`), and so does any code that multiplies verl's `low_var_kl` by an
# importance ratio. NeMo-RL now clamps the product $\rho\,k_3$ instead (`calculate_kl` with `importance_sampling_weights`),
# which zeroes the clamped token's term. Take the lesson's policy and crush one token, " rug", by 4 in logit, as an
# RL update does to a token it punishes; its ratio $\pi_\text{ref}/\pi$ passes 13.6, where $k_3$ passes 10:

# %%
crushed = logits.clone()
crushed[5] -= 4.0                                            # the update crushed one token
lp_c, lr_c = torch.log_softmax(crushed, -1), torch.log_softmax(log_ref, -1)


def expected_of(per_token):
    """Exact expected gradient of a per-token term built from log pi (sampling weights detached)."""
    theta = crushed.detach().clone().requires_grad_(True)
    logp = torch.log_softmax(theta, -1)
    (grad,) = torch.autograd.grad((logp.exp().detach() * per_token(logp)).sum(), theta)
    return grad


rho_of = lambda logp: torch.exp(logp - logp.detach())        # noqa: E731 - value 1, gradient of log pi
forms = {"k3·ρ, unclamped (TRL)": lambda logp: rho_of(logp) * klviz.k3(lr_c - logp),
         "ρ × verl's clamped k3": lambda logp: rho_of(logp) * klviz.kl_penalty(logp, lr_c, "low_var_kl"),
         "NeMo-RL: clamp(ρ·k3)": lambda logp: fw.nemo_rl_calculate_kl(logp, lr_c, "k3",
                                                                     importance_sampling_weights=rho_of(logp))}
rev_c = klviz.reverse_kl_gradient(crushed, log_ref)
print(f"crushed token {TOY_VOCAB[5]!r}: pi = {float(lp_c[5].exp()):.4f}, ratio pi_ref/pi = {float((lr_c - lp_c)[5].exp()):.1f}, "
      f"k3 = {float(klviz.k3(lr_c - lp_c)[5]):.1f}")
print(f"{'form':<24}{'rel. error vs ∇KL':>18}{'∂/∂θ of the crushed token':>28}   (reverse KL: {float(rev_c[5]):+.5f})")
clamp_grads = {}
for name, per_token in forms.items():
    g = expected_of(per_token)
    clamp_grads[name] = g
    print(f"{name:<24}{float((g - rev_c).norm() / rev_c.norm()):18.4f}{float(g[5]):+28.5f}")

# %%
g_trl, g_verl, g_nemo = clamp_grads.values()
assert torch.allclose(g_trl, rev_c, atol=1e-12)                        # unclamped: the reverse-KL gradient
assert float(klviz.k3(lr_c - lp_c)[5]) > 10 and (klviz.k3(lr_c - lp_c) > 10).sum() == 1   # one token clamped
assert rev_c[5] < 0 < g_verl[5]                                        # the restoring push flips sign ...
assert g_verl[5] > 1.5 * abs(float(rev_c[5]))                          # ... and is larger than the right one
assert abs(float(g_nemo[5])) < 0.2 * abs(float(rev_c[5]))              # clamping the product removes most of it
# the per-token gradient of rho x clamped k3 on the clamped token is 10 s(x), by hand:
s5 = torch.nn.functional.one_hot(torch.tensor(5), 12).double() - lp_c.exp()
by_hand = rev_c - lp_c.exp()[5] * (klviz.k1(lr_c - lp_c)[5] - 10.0) * s5

# %%
assert torch.allclose(g_verl, by_hand, atol=1e-12)

# %% [markdown]
# The token RL crushed hardest is the one a reverse-KL penalty should pull back up (negative $\partial/\partial\theta$:
# descent raises its logit). With $\rho$ times verl's clamped $k_3$ its coefficient is 10 instead of $k_1$, and the push
# **flips sign**: it drives the token further down, harder than the right gradient would lift it. That holds on every token
# the clamp catches on this side ([checked on 2,000 log-ratios](claims.md#rho-times-clamped-k3-flips-the-push)). The vector as a whole
# moves little here because the crushed token is rare (its weight is its probability); on a language model the same
# thing happens on every clamped token, and lesson 07 §5 measures it on all 45k parameters. Clamping the product
# (NeMo-RL today) does not flip the sign but removes most of the restoring push. Unclamped $k_3\cdot\rho$ (TRL) is exact.
#
# ## 2. How noisy is each gradient?
#
# **Question.** Several choices share one expected gradient. Do they cost the same number of tokens?
#
# **Math.** A mean of $N$ per-sample gradients $g_i=c(x_i)s(x_i)$ has mean squared error, measured against the
# reverse-KL gradient, $\|\mathbb E[g]-\nabla\mathrm{KL}\|^2 + \mathrm{tr\,Cov}(g)/N$: bias squared plus variance over $N$.
# Both terms are exact sums over the vocabulary (`gradient_error_terms`). The four unbiased choices have the *same*
# per-sample gradient, so the same variance; the biased ones stop improving once the variance term falls below their bias.
#
# **Code.** Exact curves, and measured points from `REPS` independent batches at each $N$:

# %%
REPS = 300                          # batches per N for the measured points (more: tighter)
N_GRID = (10, 100, 1_000)
shown = {"k1 in reward = k2 in loss = k3·ρ = k3+": "k1 in reward", "k3 in loss": "k3 in loss",
         "k3 in reward": "k3 in reward", "k2 in reward": "k2 in reward", "k1 in loss": "k1 in loss"}
fig, ax = new_figure(7.5, 3.6)
n_line = np.geomspace(1, 10_000, 60)
print(f"{'choice':<42}{'bias^2':>10}{'variance':>10}")
for label, name in shown.items():
    terms = gradient_error_terms(logits, log_ref, name)
    print(f"{label:<42}{terms['bias_sq']:10.4f}{terms['variance']:10.4f}")
    color = COLORS["ink"] if name == "k1 in reward" else CHOICE_COLORS[name]
    ax.plot(n_line, np.sqrt(terms["bias_sq"] + terms["variance"] / n_line), CHOICE_STYLES[name], color=color, label=label)
    for j, n in enumerate(N_GRID):
        g_n = klviz.make_generator(10 + j)
        chunks = [min(30, REPS - k) for k in range(0, REPS, 30)]   # 30 batches at a time: the same draws, in pieces
        sq_err = torch.cat([(klviz.sampled_kl_gradients(logits, log_ref, CHOICES[name], None, m * n, generator=g_n)
                             .view(m, n, -1).mean(1) - rev).square().sum(-1) for m in chunks])  # squared error of each batch mean
        mse, se = float(sq_err.mean()), float(sq_err.std() / math.sqrt(REPS))
        exact_mse = terms["bias_sq"] + terms["variance"] / n
        assert abs(mse - exact_mse) < 4 * se, (name, n, mse, exact_mse, se)
        ax.plot([n], [math.sqrt(mse)], "o", color=color, ms=5)
ax.set_xscale("log")
ax.set_yscale("log")
ax.set_xlabel("tokens per gradient estimate N")
ax.set_ylabel("RMS error vs ∇KL(π‖π_ref)")
ax.set_title("error of the mean gradient of N tokens: lines exact, dots measured")
ax.legend(fontsize=7.5)
display(fig)

# %% [markdown]
# The four reverse-KL choices are one curve: identical per-sample gradients, identical variance, error falling like
# $1/\sqrt N$. k1 in the loss has the full variance of the score and no signal. The biased choices flatten out at
# their bias: more tokens do not help them.
#
# **Low variance in value, not in gradient.** `low_var_kl` earned its name as a *value*: one token's $k_3$ has far less
# variance than one token's $k_1$ (lesson 02). Used as a loss, its *gradient* is another matter: the table above gives
# the per-token gradient variance of k3 in the loss beside the reverse-KL group's. Checked, with the value variances:

# %%
gvar = {n: gradient_error_terms(logits, log_ref, n)["variance"] for n in ("k1 in reward", "k3 in loss")}
log_r_all = torch.log_softmax(log_ref, -1) - torch.log_softmax(logits, -1)
value_var = {k: float(pi @ (fn(log_r_all) - pi @ fn(log_r_all)) ** 2) for k, fn in (("k1", klviz.k1), ("k3", klviz.k3))}
print(f"value variance per token:    k1 {value_var['k1']:.3f}   k3 {value_var['k3']:.3f}")
print(f"gradient variance per token: reverse-KL group {gvar['k1 in reward']:.3f}   k3 in the loss {gvar['k3 in loss']:.3f}")

# %%
assert value_var["k3"] < value_var["k1"]                       # low variance as a value ...
assert gvar["k3 in loss"] > 1.3 * gvar["k1 in reward"]         # ... noisier than the reverse-KL group as a loss

# %% [markdown]
# So here the "low-variance" estimator is the *noisier* KL loss, and it follows the forward KL besides.
#
# ## 3. On the triangle: the field each choice follows
#
# **Question.** Where does gradient descent on a KL term alone take the policy, for each choice?
#
# **Picture.** With three tokens every policy is a point of a triangle (a corner = all mass on one token). At each
# point the arrows show how the probabilities move under one descent step on the choice's *expected* gradient (the
# logit step $-\eta\,\mathbb E[g]$ mapped to probabilities by the softmax Jacobian). The paths start from the policy you
# set with the sliders; black and red dotted paths follow the true reverse- and forward-KL gradients.
#
# Things to try: pick *k3 in loss* and compare its path with the red one (identical); pick *k2 in loss* (on the black
# one); pick *k1 in loss* (no arrows: it does not move); pick *k3 in reward* from a start near a corner and watch KL
# *grow*; pick *k2 in reward* from the default start and watch " mat" die out although $\pi_\text{ref}(\text{mat})=0.5$.

# %%
flow_panel = SimplexFlowPanel(device)
flow_panel

# %% [markdown]
# The same statements, computed and checked (60 descent steps, learning rate 0.3, from the panel's default start):

# %%
ref3 = torch.tensor(REF_PROBS, dtype=torch.float64)
start3 = torch.tensor([0.08, 0.12, 0.80], dtype=torch.float64)
paths = descent_paths(start3, ref3, list(CHOICES) + ["reverse KL", "forward KL"], steps=60, lr=0.3)
print(f"{'choice':<14}{'KL(pi||ref) start':>19}{'after 60 steps':>16}   policy after 60 steps")
for name, path in paths.items():
    kl0, kl1 = float(categorical_kl(path[0], ref3)), float(categorical_kl(path[-1], ref3))
    print(f"{name:<14}{kl0:19.4f}{kl1:16.4f}   {np.round(path[-1].numpy(), 3)}")

# %%
assert torch.allclose(paths["k2 in loss"], paths["reverse KL"], atol=1e-12)
assert torch.allclose(paths["k3 in loss"], paths["forward KL"], atol=1e-12)
assert (paths["k1 in loss"] - start3).abs().max() < 1e-12
assert categorical_kl(paths["k3 in reward"][-1], ref3) > categorical_kl(start3, ref3)   # the "penalty" increases KL
assert paths["k2 in reward"][-1][0] < paths["k2 in reward"][0][0] / 4                      # " mat" is driven out

# %% [markdown]
# Why does k3 in the reward *increase* the KL? Its expected gradient is $\nabla\mathrm{KL}(\pi\|\pi_\text{ref}) -
# \nabla\mathrm{KL}(\pi_\text{ref}\|\pi)$, so descending it minimises the difference of the two KLs. Near a corner the
# forward KL grows without bound while the reverse KL stays finite: the "penalty" is lowest at the corners. Near
# $\pi_\text{ref}$ the two KLs agree to second order ([checked on 1,000 random token pairs](claims.md#forward-and-reverse-kl-agree-to-second-order)), which is why the bias is
# invisible for small steps. k2 in the
# reward penalises $\tfrac12(\log r)^2$, which is large both for tokens that rose *and* for tokens that fell, so it
# keeps pushing down tokens that have already fallen below $\pi_\text{ref}$.
#
# ## 4. A KL-regularised bandit: where does each choice converge?
#
# **Question.** Add a reward. The policy maximises $\mathbb E_\pi[R]-\beta\,\mathrm{KL}(\pi\|\pi_\text{ref})$. The optimum
# is known in closed form,
# $$\pi^*(x)\;\propto\;\pi_\text{ref}(x)\,e^{R(x)/\beta}.$$
# Which choices actually converge to it?
#
# **Math.** With the *forward* KL instead, $\max_\pi \mathbb E_\pi[R]-\beta\,\mathrm{KL}(\pi_\text{ref}\|\pi)$, stationarity
# gives $R(x)+\beta\,\pi_\text{ref}(x)/\pi(x)=\lambda$, so $\pi(x)=\beta\,\pi_\text{ref}(x)/(\lambda-R(x))$ with $\lambda$ set by
# normalisation (`forward_kl_optimum` finds it by bisection). It decays like $\beta$, not like $e^{-R/\beta}$: the forward
# KL keeps mass on every token the reference likes (mode-covering).
#
# **Code.** The panel runs gradient descent from $\pi_\text{ref}$ (where fine-tuning starts) for every choice and every
# $\beta$ on its slider, with rewards $R=(0, 0.5, 1)$ for (" mat", " sofa", " moon") and $\pi_\text{ref}=(0.5, 0.3, 0.2)$.
# The descent uses natural-gradient steps (the expected gradient divided by $\pi$): same fixed points, far fewer steps.

# %%
bandit_panel = BanditPanel(device)
bandit_panel

# %%
rw3 = torch.tensor(REWARDS, dtype=torch.float64)
reverse_group = ("k1 in reward", "k2 in loss", "k3·ρ in loss", "k3+ in loss", "reverse KL")
print(f"{'beta':>6}{'TV(pi*, fwd)':>14}{'KL(pi*||ref)':>14}{'KL(fwd||ref)':>14}{'E_pi*[R]':>10}{'E_fwd[R]':>10}"
      f"{'  worst TV of the 5 reverse-KL choices to pi*':>46}")
gaps = []
for i, beta in enumerate(BETA_GRID):
    rows = {r["choice"]: r for r in bandit_table(i)}
    star, fwd_opt = reverse_kl_optimum(ref3, rw3, beta), forward_kl_optimum(ref3, rw3, beta)
    worst = max(float(tv_distance(torch.as_tensor(rows[c]["policy"]), star)) for c in reverse_group)
    assert worst < 1e-8, (beta, worst)                                                   # converge to pi*
    assert float(tv_distance(torch.as_tensor(rows["k3 in loss"]["policy"]), fwd_opt)) < 1e-8   # solves the forward problem
    assert rows["k1 in loss"]["policy"][2] > 1 - 1e-6                                    # no regulariser: all on " moon"
    assert rows["k3 in reward"]["policy"][0] < 1e-6 and rows["k2 in reward"]["policy"][0] < 1e-6   # " mat" wiped out
    gaps.append(float(tv_distance(star, fwd_opt)))
    if i % 4 == 0 or i == len(BETA_GRID) - 1:
        print(f"{beta:6.3g}{gaps[-1]:14.4f}{float(categorical_kl(star, ref3)):14.4f}{float(categorical_kl(fwd_opt, ref3)):14.4f}"
              f"{float(star @ rw3):10.4f}{float(fwd_opt @ rw3):10.4f}{worst:46.1e}")
i_max = int(np.argmax(gaps))
print(f"\nk3 in the loss is farthest from pi* at beta = {BETA_GRID[i_max]:g}: TV = {gaps[i_max]:.3f}")

# %% [markdown]
# What the table and the panel show, for this bandit:
# - every choice with the reverse-KL gradient converges to $\pi^*$ (to $10^{-8}$), at every $\beta$;
# - k3 in the loss converges to the **forward-KL optimum**, a different policy. The two agree when $\beta$ is large
#   (both stay near $\pi_\text{ref}$) and when $\beta$ is tiny (both go to the best token); in between they differ by the
#   TV distance printed above. With small $\beta$ the forward solution keeps visibly more mass on low-reward tokens;
# - k1 in the loss regularises nothing: the policy goes to the best token whatever $\beta$ is;
# - k2 and k3 in the reward drive " mat", the token the reference likes most, to zero even at $\beta=10$: from
#   $\pi_\text{ref}$ the reward first lowers $\pi(\text{mat})$, and from then on these penalties push it further down.
#
# ## 5. Sequences: token-level losses give a partial gradient
#
# **Question.** A response is a sequence $y=(y_1,\dots,y_T)$. The sequence KL is $\mathbb E_{y\sim\pi}\big[\sum_t k_1(y_t)\big]$
# with $k_1(y_t)=\log\pi(y_t|y_{<t})-\log\pi_\text{ref}(y_t|y_{<t})$. Frameworks add a per-token KL term to the
# per-token loss. Is that the gradient of the sequence KL?
#
# **Math.** By the score-function rule with $s_t=\nabla\log\pi(y_t|y_{<t})$,
# $$\nabla\,\mathrm{KL}_\text{seq} = \mathbb E\Big[\sum_t s_t \sum_{u\ge t} k_1(y_u)\Big],$$
# because token $t$ changes which tokens come *after* it. k2 as a per-token loss (or k1 in the reward of the token
# itself, without the later tokens) gives $\mathbb E[\sum_t s_t\,k_1(y_t)]$: only the $u=t$ term, the **partial gradient**
# ([checked on 1,000 tabular sequence policies](claims.md#token-level-losses-give-the-partial-gradient)). It equals the gradient
# of $\sum_t\mathbb E[\mathrm{KL}(\pi(\cdot|y_{<t})\|\pi_\text{ref}(\cdot|y_{<t}))]$ with the prefix distribution held fixed: the
# part of the cost that comes from steering into prefixes where later tokens will pay KL is lost.
#
# **Code.** A tabular policy over two tokens, "a" and "b", three steps: 8 sequences, 7 prefixes, 14 logits. Every
# expectation is an exact sum over the 8 sequences; the true gradient comes from autograd of the exact sequence KL.

# %%
toy = SequenceToy(vocab_size=2, length=3)
seq_ref = toy.random_logits(1.0, generator=klviz.make_generator(5))      # pi_ref: one row of logits per prefix
seq_theta = toy.random_logits(1.0, generator=klviz.make_generator(4))    # the current policy
true_grad = toy.true_gradient(seq_theta, seq_ref)


def partial_gradient(theta):
    # gradient of sum over prefixes of P(prefix) * KL(pi(.|prefix) || pi_ref(.|prefix)), P(prefix) held fixed
    theta = theta.detach().clone().requires_grad_(True)
    seq_p = toy.sequence_probs(theta).detach()
    prefix_p = torch.zeros(toy.num_prefixes, dtype=torch.float64)
    for t in range(toy.length):                    # P(prefix) = sum of P(y) over sequences that start with it
        prefix_p.index_add_(0, toy.prefix_index[:, t], seq_p)
    per_prefix_kl = categorical_kl(torch.softmax(theta, -1), torch.softmax(seq_ref, -1))
    (g,) = torch.autograd.grad((prefix_p * per_prefix_kl).sum(), theta)
    return g


partial = partial_gradient(seq_theta)
print(f"sequence KL = {float(toy.sequence_kl(seq_theta, seq_ref)):.4f}; ||true gradient|| = {float(true_grad.norm()):.4f}")
print(f"{'surrogate':<32}{'rel. error vs true':>20}{'= partial?':>12}{'variance/sample':>17}")
seq_expected = {}
for method in ("k1 in loss", "k2 in loss", "k3 in loss", "k3+ in loss", "k1 in reward, same token",
               "k1 in reward, reward-to-go", "k1 in reward, whole sequence"):
    g = toy.expected_gradient(seq_theta, seq_ref, method)
    seq_expected[method] = g
    print(f"{method:<32}{float((g - true_grad).norm() / true_grad.norm()):20.4f}"
          f"{str(bool(torch.allclose(g, partial, atol=1e-12))):>12}{toy.gradient_variance(seq_theta, seq_ref, method):17.4f}")

# %%
assert seq_expected["k1 in loss"].abs().max() < 1e-12
for m in ("k2 in loss", "k3+ in loss", "k1 in reward, same token"):
    assert torch.allclose(seq_expected[m], partial, atol=1e-12), m            # the partial gradient
for m in ("k1 in reward, reward-to-go", "k1 in reward, whole sequence"):
    assert torch.allclose(seq_expected[m], true_grad, atol=1e-12), m          # the full gradient
missing = (true_grad - partial).norm() / true_grad.norm()
assert missing > 0.1
var_rtg = toy.gradient_variance(seq_theta, seq_ref, "k1 in reward, reward-to-go")
var_whole = toy.gradient_variance(seq_theta, seq_ref, "k1 in reward, whole sequence")
assert var_rtg < var_whole
print(f"the partial gradient misses {100 * missing:.0f}% of the true gradient (relative norm); "
      f"reward-to-go has {100 * (1 - var_rtg / var_whole):.0f}% less variance than the whole-sequence sum")

# %% [markdown]
# **Where does each one converge?** Give the toy a reward, $R(y)$ = number of "a" tokens, and train with
# $\beta = 0.5$. The optimum over whole sequences is $\pi^*(y)\propto\pi_\text{ref}(y)\,e^{R(y)/\beta}$. Exact expected gradients,
# plain gradient descent from $\pi_\text{ref}$:

# %%
SEQ_STEPS = 1_500          # descent steps per run (more: closer to the fixed point)
BETA_SEQ = 0.5
seq_reward = (toy.sequences == 0).sum(-1).double()           # number of "a" tokens
seq_star = toy.optimum(seq_ref, seq_reward, BETA_SEQ)
runs = {m: toy.train(seq_ref, seq_ref, seq_reward, BETA_SEQ, m, steps=SEQ_STEPS, lr=1.0)
        for m in ("k1 in reward, reward-to-go", "k2 in loss", "k3 in loss", "k1 in loss")}


def objective(probs):                                         # E[R] - beta KL over whole sequences, exactly
    ref_p = toy.sequence_probs(seq_ref)
    return float(probs @ seq_reward - BETA_SEQ * (probs * (probs / ref_p).log()).sum())


labels = ["".join("ab"[int(t)] for t in s) for s in toy.sequences]
fig, (ax, ax2) = new_figure(9.0, 3.6, ncols=2, gridspec_kw={"width_ratios": [1.4, 1]})
xs = np.arange(len(labels))
ax.bar(xs - 0.3, seq_star.numpy(), width=0.2, color=COLORS["ink"], label="π* ∝ π_ref·exp(R/β)")
run_colors = {"k1 in reward, reward-to-go": COLORS["k1"], "k2 in loss": COLORS["k2"], "k3 in loss": COLORS["k3"]}
for j, (m, col) in enumerate(run_colors.items()):
    ax.bar(xs - 0.1 + 0.2 * j, runs[m]["probs"].numpy(), width=0.2, color=col, label=m)
ax.set_xticks(xs, labels)
ax.set_xlabel("sequence y  (R = number of a's)")
ax.set_ylabel("π(y) after training")
ax.set_title(f"where each surrogate converges (β = {BETA_SEQ})")
ax.legend(fontsize=7.5)
print(f"{'method':<28}{'TV to pi*':>10}{'seq KL':>9}{'E[R]':>8}{'E[R]-beta KL':>14}")
print(f"{'optimum pi*':<28}{0:10.4f}{float((seq_star * (seq_star / toy.sequence_probs(seq_ref)).log()).sum()):9.4f}"
      f"{float(seq_star @ seq_reward):8.4f}{objective(seq_star):14.4f}")
for m, out in runs.items():
    col = run_colors.get(m, COLORS["cyan"])
    ax2.plot(out["steps"].numpy(), out["kl"].numpy(), "-" if m in run_colors else "--", color=col, label=m)
    print(f"{m:<28}{float(tv_distance(out['probs'], seq_star)):10.4f}{float(out['kl'][-1]):9.4f}"
          f"{float(out['reward'][-1]):8.4f}{objective(out['probs']):14.4f}")
ax2.set_xlabel("gradient-descent step")
ax2.set_ylabel("true sequence KL(π‖π_ref)")
ax2.set_title("KL during training")
ax2.legend(fontsize=7)
display(fig)

# %%
assert tv_distance(runs["k1 in reward, reward-to-go"]["probs"], seq_star) < 1e-3
assert tv_distance(runs["k2 in loss"]["probs"], seq_star) > 0.02
assert objective(runs["k1 in reward, reward-to-go"]["probs"]) > objective(runs["k2 in loss"]["probs"])
assert objective(runs["k1 in reward, reward-to-go"]["probs"]) > objective(runs["k3 in loss"]["probs"])
assert runs["k1 in loss"]["kl"][-1] > 2 * runs["k1 in reward, reward-to-go"]["kl"][-1]

# %% [markdown]
# The full gradient (k1 in the reward with reward-to-go) converges to $\pi^*$; the partial gradient of the token-level
# k2 loss converges elsewhere, with more reward **and more KL** than the optimum: it does not see that an early "a"
# leads into prefixes where later tokens pay KL. k3 in the loss is both partial and forward. k1 in the loss leaves
# only the reward, and the KL runs away.
#
# ## 6. Off-policy: tokens from $\pi_\text{old}$
#
# **Question.** PPO and GRPO take several gradient steps on one batch. After the first step the tokens come from
# $\pi_\text{old}$, not from the current $\pi_\theta$. What happens to each KL term?
#
# **Math.** The expected gradient is now $\sum_x\pi_\text{old}(x)\,\nabla L_x(\theta)$. Three ways to weight a token's KL term:
# `none` (as on-policy code writes it), `detached` (an importance weight $\mathrm{sg}(\pi_\theta/\pi_\text{old})$, one of
# `IMPORTANCE_WEIGHTS`: it restores the on-policy expectation of the same surrogate) and `ratio` (the use's weighting
# `"rho"`: the term times $\rho=\pi_\theta/\mathrm{sg}(\pi_\text{old})$ with the gradient flowing through $\rho$,
# DeepSeek-V3.2's form; verl's straight-through `k3+` has no such form). For a KL **in the reward** there is a fourth
# option, and it is the one PPO-style trainers use: the KL reward is computed once, when the batch is scored (k1 of
# $\pi_\text{old}$ against $\pi_\text{ref}$: verl's `apply_kl_penalty` on `old_log_probs`, OpenRLHF's `compute_reward`, the
# lab of lesson 07), it is part of the advantage, and later epochs only re-weight that advantage by
# $\rho=\pi_\theta/\mathrm{sg}(\pi_\text{old})$ (`offpolicy_expected_gradient(..., reward_values="rollout")`). Its expected
# gradient is $\mathbb E_{\pi_\theta}[k_1^{\text{old}}\,s] = \nabla\mathrm{KL}(\pi_\theta\|\pi_\text{ref}) - \nabla\mathrm{KL}(\pi_\theta\|\pi_\text{old})$
# ($\pi_\text{old}$ held fixed): the reward was scored by the old policy, so it still rewards the old policy's log-ratios. The ratio form of k3 has gradient
# $\rho\,k_1\,s$, whose $\pi_\text{old}$-expectation is $\mathbb E_{\pi_\theta}[k_1 s]=\nabla\mathrm{KL}(\pi_\theta\|\pi_\text{ref})$.
#
# **Code.** $\pi_\text{old}$ is the lesson's policy before the batch; $\pi_\theta$ is $\pi_\text{old}$ after $k$ exact
# reward-gradient steps (reward 1 for " sofa", 0.5 for " chair"). For each choice and weighting: relative bias
# $\|\mathbb E_{\pi_\text{old}}[g] - \nabla\mathrm{KL}(\pi_\theta\|\pi_\text{ref})\|/\|\nabla\mathrm{KL}(\pi_\theta\|\pi_\text{ref})\|$.

# %%
old_logits = logits.clone()                                      # pi_old: sampled the batch
R12 = torch.zeros(len(TOY_VOCAB), dtype=torch.float64)
R12[1], R12[3] = 1.0, 0.5
UPDATES = list(range(0, 9))                                       # inner updates since the batch was sampled
WEIGHTS = ("none", "detached", "ratio")
FROZEN = ("k1 in reward", "frozen at rollout, ×ρ")               # PPO's practice (see the text above)


def offpolicy_term(base, weight):
    """(use, importance weight) of one table cell: `ratio` puts rho into the term itself."""
    if weight == "ratio":
        return EstimatorUse(base.estimator, base.placement, "rho"), "none"
    return base, weight


bases = [CHOICES[n] for n in ("k1 in loss", "k2 in loss", "k3 in loss", "k3+ in loss", "k1 in reward", "k3 in reward")]
combos = [(b.label, w) for b in bases for w in WEIGHTS if not (w == "ratio" and b.weighting != "none")]
bias = {c: [] for c in combos}
for k in UPDATES:
    theta_k = reward_updates(old_logits, R12, steps=k, lr=2.0)
    target = klviz.reverse_kl_gradient(theta_k, log_ref)
    for c in combos:
        use, importance = offpolicy_term(CHOICES[c[0]], c[1])
        g = offpolicy_expected_gradient(theta_k, old_logits, log_ref, use, importance)
        bias[c].append(float((g - target).norm() / target.norm()))
        if k == 0 and c[1] != "ratio":                            # on-policy: the plain choice again
            assert torch.allclose(g, klviz.expected_kl_gradient(theta_k, log_ref, CHOICES[c[0]]), atol=1e-12), c
    # what PPO, verl, OpenRLHF and the lab do: k1 frozen at rollout, advantage times rho
    frozen = offpolicy_expected_gradient(theta_k, old_logits, log_ref, "k1·ρ in reward", reward_values="rollout")
    assert torch.allclose(frozen, target - klviz.reverse_kl_gradient(theta_k, old_logits), atol=1e-12)   # the identity
    bias.setdefault(FROZEN, []).append(float((frozen - target).norm() / target.norm()))

k_show = 4
print(f"relative bias after {k_show} updates (pi_theta(sofa) = {float(torch.softmax(reward_updates(old_logits, R12, steps=k_show, lr=2.0), -1)[1]):.2f}, "
      f"pi_old(sofa) = {float(pi[1]):.2f})")
print(f"{'use':<22}" + "".join(f"{w:>12}" for w in WEIGHTS))
for b in bases:
    print(f"{b.label:<22}" + "".join(f"{bias[(b.label, w)][k_show]:12.3f}" if (b.label, w) in bias else f"{'—':>12}"
                                     for w in WEIGHTS))
print("k1 in reward, value frozen at rollout, advantage × ρ (PPO, verl, OpenRLHF): relative bias "
      + ", ".join(f"{bias[FROZEN][k]:.2f} at k = {k}" for k in (1, 4, 8)))

for k in UPDATES:
    for c in (("k3 in loss", "ratio"), ("k1 in loss", "ratio"), ("k2 in loss", "detached"),
              ("k3+ in loss", "detached"), ("k1 in reward", "detached"), ("k1 in reward", "ratio")):
        assert bias[c][k] < 1e-10, (c, k)                         # unbiased off-policy
assert bias[("k2 in loss", "ratio")][0] > 0.1                    # ratio times k2: biased even on-policy
assert bias[("k2 in loss", "none")][k_show] > 0.1 and bias[("k1 in reward", "none")][k_show] > 0.1
assert bias[FROZEN][0] < 1e-12                                   # exact on the first minibatch ...
assert [round(bias[FROZEN][k], 2) for k in (1, 4, 8)] == [0.29, 0.55, 0.63]   # ... then biased, growing with k

fig, ax = new_figure(7.5, 3.4)
for c, style in ((("k1 in loss", "none"), "-"), (("k2 in loss", "none"), "-"), (("k3 in loss", "none"), "-"),
                 (("k1 in reward", "none"), "--"), (("k3 in loss", "detached"), ":"), (("k3 in loss", "ratio"), "-."),
                 (FROZEN, (0, (1, 1)))):
    color = CHOICE_COLORS[c[0]] if c[1] != "ratio" else CHOICE_COLORS["k3·ρ in loss"]
    color = COLORS["ink"] if c == FROZEN else color
    ax.plot(UPDATES, bias[c], ls=style, marker="o", ms=3, color=color, label=f"{c[0]}, weight: {c[1]}" if c != FROZEN else "k1 in reward, frozen at rollout, ×ρ (PPO)")
ax.set_yscale("symlog", linthresh=0.01)
ax.set_xlabel("updates since the batch was sampled (k)")
ax.set_ylabel("relative bias vs ∇KL(π_θ‖π_ref)")
ax.set_title("off-policy bias of each KL term (exact sums over π_old)")
ax.legend(fontsize=7.5)
display(fig)

# %% [markdown]
# (k2 in the loss and k1 in the reward, both unweighted, lie on one curve: their per-sample gradients are the same
# ([checked on 1,000 random token pairs](claims.md#k2-loss-equals-k1-reward-per-sample)), whoever sampled.) At $k=0$ the `none` and `detached` weightings are exactly the on-policy choices of section 1 (checked); the
# `ratio` form changes the gradient even on-policy, which is its purpose for k3. Off-policy, the unweighted terms drift away from
# the target as $\pi_\theta$ moves: k2 in the loss and k1 in the reward lose their exactness, k3 in the loss gets much
# worse. Importance weights repair what was right on-policy: `detached` weights on k2/k3+ in the loss, and the `ratio` form
# of k3 (and, less known, of k1), are exact for every $k$; so is k1 in the reward *recomputed at the current
# $\pi_\theta$* with a detached weight, for one token and any three policies ([checked on 1,000 random token triples](claims.md#importance-weights-repair-one-token-offpolicy)). That last one is not what trainers run. PPO, verl, OpenRLHF and the lab of lesson 07
# freeze the KL reward at rollout and weight the advantage by $\rho$: exact on the first minibatch, then biased by
# $-\nabla\mathrm{KL}(\pi_\theta\|\pi_\text{old})$ (the identity is checked to $10^{-12}$ above), a relative bias of 0.29 after one
# update, 0.55 after four and 0.63 after eight in this setting (the black dotted curve). PPO's clip and small inner
# steps keep $\pi_\theta$ close to $\pi_\text{old}$, which is what keeps this bias small in practice. The `ratio` form of k2 is
# **not** exact: differentiating through $\rho$ adds $\mathbb E[k_2 s]$, biased even on-policy.
#
# **Which way does k1 as a loss move the policy off-policy?** Sources disagree on this, so measure it. The exact
# expected gradient of $\sum_x \pi_\text{old}(x)\,k_1(x)$ is
# $$\mathbb E_{\pi_\text{old}}[\nabla\log\pi_\theta(x)] = \pi_\text{old}-\pi_\theta = -\nabla_\theta\,\mathrm{KL}(\pi_\text{old}\|\pi_\theta),$$
# so a descent step *increases* $\mathrm{KL}(\pi_\text{old}\|\pi_\theta)$: it pushes $\pi_\theta$ **away from $\pi_\text{old}$**, and it does not
# involve $\pi_\text{ref}$ at all. What it does to the KL that matters, $\mathrm{KL}(\pi_\theta\|\pi_\text{ref})$, depends on where the policies
# sit, so we measure the directional derivative $\frac{d}{d\eta}\mathrm{KL}(\pi_\theta\|\pi_\text{ref})$ along the descent direction, in the
# lesson's setting and over random triples ($\pi_\text{ref}$ with standard-normal logits, $\pi_\text{old}$ = $\pi_\text{ref}$'s logits plus
# N(0, 0.5²) noise, $\pi_\theta$ = $\pi_\text{old}$ after 4 reward-gradient steps with standard-normal rewards):

# %%
N_TRIALS = 2_000           # random (pi_ref, pi_old, pi_theta) triples (more: tighter fraction)
theta4 = reward_updates(old_logits, R12, steps=4, lr=2.0)
g = offpolicy_expected_gradient(theta4, old_logits, log_ref, "k1 in loss")
assert torch.allclose(g, pi - torch.softmax(theta4, -1), atol=1e-12)                  # = pi_old - pi_theta
d_old = float(-(g @ (torch.softmax(theta4, -1) - pi)))                                # d/d eta KL(pi_old || pi_theta)
d_rev = float(-(g @ klviz.reverse_kl_gradient(theta4, log_ref)))                      # d/d eta KL(pi_theta || pi_ref)
print(f"lesson setting, 4 updates: d KL(pi_old||pi_theta) = {d_old:+.4f},  d KL(pi_theta||pi_ref) = {d_rev:+.4f} per unit step")
assert d_old > 0 and d_rev > 0

gen = klviz.make_generator(7)
V = len(TOY_VOCAB)
up_old, up_rev = 0, 0
for _ in range(N_TRIALS):
    r_logits = torch.randn(V, generator=gen, dtype=torch.float64)
    o_logits = r_logits + 0.5 * torch.randn(V, generator=gen, dtype=torch.float64)
    t_logits = reward_updates(o_logits, torch.randn(V, generator=gen, dtype=torch.float64), steps=4, lr=1.0)
    g = offpolicy_expected_gradient(t_logits, o_logits, r_logits, "k1 in loss")
    up_old += float(-(g @ (torch.softmax(t_logits, -1) - torch.softmax(o_logits, -1)))) > 0
    up_rev += float(-(g @ klviz.reverse_kl_gradient(t_logits, r_logits))) > 0
frac, se = up_rev / N_TRIALS, math.sqrt(up_rev / N_TRIALS * (1 - up_rev / N_TRIALS) / N_TRIALS)
print(f"random triples: a descent step on k1-as-loss increased KL(pi_old||pi_theta) in {up_old}/{N_TRIALS}, "
      f"and increased KL(pi_theta||pi_ref) in {up_rev}/{N_TRIALS}: {plus_minus(100 * frac, 100 * se, '.1f')} percent")

# %%
assert up_old == N_TRIALS
assert frac - 4 * se > 0.5

# %% [markdown]
# **Settled, for what was measured.** Off-policy, k1 as a loss is gradient *ascent* on $\mathrm{KL}(\pi_\text{old}\|\pi_\theta)$ (an
# identity ([checked on 1,000 random token triples](claims.md#importance-weights-repair-one-token-offpolicy))): it always pushes the policy away from the one that sampled the batch, i.e. further
# along the update it has just made, and never toward $\pi_\text{ref}$ as such. In the lesson's setting and in most random
# triples this *increases* $\mathrm{KL}(\pi_\theta\|\pi_\text{ref})$ ([checked on 2,000 random triples](claims.md#k1-loss-offpolicy-usually-raises-the-kl)): a "KL penalty"
# that makes the KL grow. Its size scales with
# $\|\pi_\theta-\pi_\text{old}\|$, so it is small when there are few inner steps, and it is zero on-policy.
#
# ### Whole responses off-policy: a per-token $\rho$ is a one-token correction
#
# Everything above is one token. A response is sampled token by token, and on a later minibatch every token of it came
# from $\pi_\text{old}$, **its prefix included**. The per-token ratio $\rho_t=\pi_\theta(y_t|y_{<t})/\pi_\text{old}(y_t|y_{<t})$
# turns the average over the token $y_t$ into one under $\pi_\theta$, *given its prefix*; the prefixes stay
# $\pi_\text{old}$'s. For the sequence KL the importance weight of token $t$'s term is the weight of everything drawn up to
# it, the **prefix product**:
#
# $$\mathbb E_{y\sim\pi_\text{old}}\Big[\sum_t\Big(\prod_{u\le t}\rho_u\Big)\,k_3(y_t)\Big]=\sum_t\mathbb E_{y_{\le t}\sim\pi_\theta}\big[k_3(y_t)\big]
# =\mathrm{KL}_\text{seq}(\pi_\theta\,\|\,\pi_\text{ref}),$$
#
# an identity in $\theta$ ($\pi_\text{old}$ held fixed), so differentiating the surrogate, through every $\rho_u$, gives the
# gradient of the sequence KL itself. Four weightings of $k_3$ (`SequenceToy.offpolicy_gradient`, every expectation an exact
# sum over the 27 responses of a tabular policy with 3 tokens and length 3, all of them drawn by $\pi_\text{old}$):

# %%
seq3 = SequenceToy(vocab_size=3, length=3)
g3 = klviz.make_generator(21)
ref_s = seq3.random_logits(1.0, generator=g3)                 # pi_ref: one row of logits per prefix
theta_s = ref_s + seq3.random_logits(0.7, generator=g3)       # pi_theta, being updated
old_s = theta_s + seq3.random_logits(0.7, generator=g3)       # pi_old: sampled the responses
target_s = seq3.true_gradient(theta_s, ref_s)                 # autograd of the exact sequence KL(pi_theta || pi_ref)
partial_old = seq3.partial_gradient(theta_s, ref_s, prefix_logits=old_s)   # per-position KL gradients, pi_old's prefixes
partial_theta = seq3.partial_gradient(theta_s, ref_s)                      # ... pi_theta's prefixes (section 5)
print(f"sequence KL(pi_theta || pi_ref) = {float(seq3.sequence_kl(theta_s, ref_s)):.4f}; "
      f"KL(pi_old || pi_theta) = {float(seq3.sequence_kl(old_s, theta_s)):.4f}")
print(f"{'weight of k3_t':<34}{'mean value':>11}{'rel. error vs ∇KL_seq':>23}{'= partial, old prefixes':>25}")
seq_off = {}
for w in SEQUENCE_WEIGHTS:
    g = seq3.offpolicy_gradient(theta_s, ref_s, old_s, "k3", w)
    seq_off[w] = g
    print(f"{w:<34}{seq3.offpolicy_value(theta_s, ref_s, old_s, 'k3', w):11.4f}"
          f"{float((g - target_s).norm() / target_s.norm()):23.3f}{str(bool(torch.allclose(g, partial_old))):>25}")

# %%
assert torch.allclose(seq_off["prefix product"], target_s, atol=1e-12)            # exact
assert abs(seq3.offpolicy_value(theta_s, ref_s, old_s, "k3", "prefix product") - float(seq3.sequence_kl(theta_s, ref_s))) < 1e-12
assert torch.allclose(seq_off["per-token ρ"], partial_old, atol=1e-12)              # per-token rho: old prefixes
assert torch.allclose(seq_off["prefix product, prefix detached"], partial_theta, atol=1e-12)
assert float((seq_off["per-token ρ"] - target_s).norm() / target_s.norm()) > 0.1


# %% [markdown]
# Read it row by row:
#
# - **none** (verl's `kl_loss`, MiniMind's `kl_ref_penalty`, OpenRLHF's `use_loss`, on a second minibatch): $k_3$'s
#   forward-KL gradient, at the wrong prefixes, with no weight at all.
# - **per-token $\rho$** (TRL's `use_bias_correction_kl`, DeepSeek-V3.2's correction; NeMo-RL's non-default
#   `use_on_policy_kl_approximation`, with $\pi_\text{generation}$ in the denominator) corrects what one token can: at each
#   position, $k_3$'s forward-KL gradient becomes the reverse one, and the token is reweighted from $\pi_\text{old}$'s choice to
#   $\pi_\theta$'s. Its expected gradient is exactly $\sum_t\mathbb E_{y_{<t}\sim\pi_\text{old}}[\nabla\mathrm{KL}(\pi_\theta(\cdot|y_{<t})\|\pi_\text{ref}(\cdot|y_{<t}))]$
#   ([checked on 1,000 tabular sequence policies](claims.md#per-token-rho-is-the-partial-gradient-at-old-prefixes)). It
#   leaves two things: the prefixes are $\pi_\text{old}$'s, and the future terms of section 5 are missing (the partial
#   gradient), so it is not the gradient of the sequence KL, off-policy or on.
# - **prefix product, prefix detached** repairs the prefixes only: the partial gradient at $\pi_\theta$'s prefixes.
# - **prefix product**, differentiated through every $\rho_u$, is the sequence gradient exactly, off-policy and on-policy
#   alike ([checked on 1,000 tabular sequence policies](claims.md#prefix-product-weights-are-exact)): the derivative of
#   $\prod_{u<t}\rho_u$ is the score of the prefix, which is where the future terms come from. Its price is variance: a product of
#   $t$ ratios, whose second moment grows like $(1+\chi^2)^t$ (lesson [08](08_sampler_vs_trainer.ipynb) §4 measures that trap).
#
# The mean values follow the same accounting: the prefix product's is the sequence KL, per-token $\rho$'s is
# $\sum_t\mathbb E_{y_{<t}\sim\pi_\text{old}}[\mathrm{KL}(\pi_\theta(\cdot|y_{<t})\|\pi_\text{ref}(\cdot|y_{<t}))]$, the per-position KLs at the old prefixes.
#
# **Audit your own KL term, in place.** `klviz.audit_loss` runs a function written the way training code writes a KL
# term, `fn(logprob, old_logprob, ref_logprob, response_mask)` on `[batch, length]` tensors, on every response of a tiny
# enumerable policy, and says which gradient its exact expectation follows. `sampler="old"` draws the responses from a
# perturbed $\pi_\text{old}$, as on a later minibatch. From a shell, `klviz audit my_loss.py:my_kl --sampler old --length 3`
# does the same with your file. The two weightings, written as a trainer writes them:

# %%
def kl_per_token_rho(logprob, old_logprob, ref_logprob, response_mask):
    log_r = ref_logprob - logprob
    rho = torch.exp(logprob - old_logprob)                                   # one ratio per token
    return (rho * (torch.expm1(log_r) - log_r) * response_mask).sum()


def kl_prefix_product(logprob, old_logprob, ref_logprob, response_mask):
    log_r = ref_logprob - logprob
    weight = torch.exp(torch.cumsum((logprob - old_logprob) * response_mask, -1))   # prod_{u<=t} rho_u
    return (weight * (torch.expm1(log_r) - log_r) * response_mask).sum()


audits = {fn.__name__: klviz.audit_loss(fn, sampler="old", length=3) for fn in (kl_per_token_rho, kl_prefix_product)}
for name, a in audits.items():
    print(f"{name:<18} follows: {a.follows:<11} relative error vs ∇KL(π‖π_ref): {a.relative_error['reverse_kl']:.2g}, "
          f"vs ∇KL(π_ref‖π): {a.relative_error['forward_kl']:.2g}")

# %%
assert audits["kl_per_token_rho"].follows == "neither" and audits["kl_prefix_product"].follows == "reverse_kl"
assert audits["kl_prefix_product"].relative_error["reverse_kl"] < 1e-9


# %% [markdown]
# ## 7. What this says about the papers
#
# Each paper's claim in its own words (with where it says it), then what the exact sums of this lesson show, at toy scale:
#
# - **Tang & Munos, "On a few pitfalls in KL divergence gradient estimation for RL" (arXiv 2506.09477).** Abstract: "The
#   first major pitfall is to differentiate through the KL estimate as loss functions to minimize KL divergence. We show
#   that such implementations are generally incorrect"; and "some implementations do not account for the sequential
#   nature of the estimation problem and produce a partial gradient at best". *Agrees, exactly:* k1 as a loss has zero
#   mean gradient and k3 as a loss follows the forward KL (section 1); token-level losses give the partial gradient and
#   converge to a different policy than the sequence optimum (section 5); k1 in the reward with reward-to-go is exact.
# - **Shah et al., "A Comedy of Estimators: On KL Regularization in RL Training of LLMs" (arXiv 2512.21852).** Abstract:
#   "in on-policy settings: (1) estimator configurations with biased gradients can result in training instabilities; and
#   (2) using estimator configurations resulting in unbiased gradients leads to better performance".
#   The configurations they compare include the one most libraries ship, k3 in the loss (GRPO's, verl's `use_kl_loss`),
#   and k1 in the reward; summaries of the paper list k1 in the loss and k3 in the reward among the biased ones (only the
#   abstract was read here, not the full text). *Agrees:* k1 in the reward is exact on-policy; k3 in the loss is biased (it is exactly the
#   forward-KL gradient, section 1) and converges to the forward-KL optimum (section 4); k1 in the loss and k3 in the
#   reward are biased, and k3 in the reward even *increases* the KL from a start near a corner (section 3). *Adds:*
#   off-policy, the frozen k1 reward that PPO-style trainers use is biased too (section 6); the results quoted above are stated for on-policy settings. Their downstream accuracy on 4B–8B models cannot be tested here.
# - **Liu et al., "Rethinking KL Regularization in RLHF: From Value Estimation to Gradient Optimization" (arXiv
#   2510.01555).** Abstract: "under on-policy conditions, the 'k2 as loss' formulation is, in fact, gradient-equivalent
#   to 'k1 in reward'"; "'k3 as loss' (like GRPO) is merely a first-order, biased approximation"; "common off-policy
#   implementations of 'kn as loss' methods are biased due to neglected importance sampling". *Agrees:* the equivalence
#   holds sample by sample (section 1); off-policy, k2 in the loss needs the weight (section 6). *Blunter here:* k3 in
#   the loss is not an approximation that degrades gracefully; it exactly solves the forward-KL problem, whose solution
#   differs from $\pi^*$ by up to the TV printed in section 4.
#
# ## Takeaways
#
# - A per-sample gradient is $c(x)\,s(x)$; write down $c$ before you trust a KL term. k1 in the loss: $c=1$, nothing on
#   average. k2 in the loss, k1 in the reward, k3·ρ, k3+: $c=k_1$, the reverse-KL gradient, identical per sample.
#   k3 in the loss: $c=1-r$, the forward-KL gradient, and a noisier one than the reverse-KL group's, although $k_3$ is
#   the low-variance *value*.
# - A clamp on $k_3$ breaks the ratio correction: $\rho$ times a clamped $k_3$ pushes the most-crushed tokens the wrong
#   way. Clamp after multiplying, or do not clamp.
# - The fixed point is what matters in the end: reverse-KL choices converge to $\pi^*\propto\pi_\text{ref}e^{R/\beta}$; k3 in the
#   loss converges to the forward-KL solution; k1 in the loss, k2 and k3 in the reward do not regularise towards
#   $\pi_\text{ref}$ at all in this bandit.
# - For sequences, per-token losses give the partial gradient; reward-to-go of k1 in the reward gives the full one.
# - Off-policy, one token's KL term needs $\rho=\pi_\theta/\pi_\text{old}$ (detached for k2; through the ratio for k3). A
#   whole response needs the prefix product $\prod_{u\le t}\rho_u$, differentiated: per-token $\rho$ (TRL's
#   `use_bias_correction_kl`) follows the partial gradient at $\pi_\text{old}$'s prefixes. `klviz.audit_loss` says which
#   gradient your own term follows. The KL in
#   the reward as PPO computes it (frozen at rollout, advantage times $\rho$) is exact only on the first minibatch; its
#   bias, $-\nabla\mathrm{KL}(\pi_\theta\|\pi_\text{old})$ ([checked on 1,000 random token triples](claims.md#importance-weights-repair-one-token-offpolicy)), grows with the
#   inner steps here. Unweighted k1 as a loss pushes the policy
#   away from $\pi_\text{old}$.
#
# ## Exercises
#
# **Exercise 1: the coefficient of k3 as a loss.** Return $c(x)$ such that $\nabla k_3(x) = c(x)\,\nabla\log\pi(x)$ for
# the token held fixed, given `log_r` $=\log\pi_\text{ref}(x)-\log\pi(x)$.

# %%
def k3_loss_coefficient(log_r):
    ...

klviz.check.lesson05.k3_loss_coefficient(k3_loss_coefficient)


# %%
# solution
def k3_loss_coefficient(log_r):
    return -torch.expm1(log_r)          # 1 - r, with r = pi_ref / pi = exp(log_r)

assert klviz.check.lesson05.k3_loss_coefficient(k3_loss_coefficient)


# %% [markdown]
# **Exercise 2: the bandit optimum.** Return $\arg\max_\pi \mathbb E_\pi[R]-\beta\,\mathrm{KL}(\pi\|\pi_\text{ref})$ for reference
# probabilities `ref_probs`, per-token rewards `rewards` and a coefficient `beta`.

# %%
def bandit_optimum(ref_probs, rewards, beta):
    ...

klviz.check.lesson05.bandit_optimum(bandit_optimum)


# %%
# solution
def bandit_optimum(ref_probs, rewards, beta):
    return torch.softmax(ref_probs.log() + rewards / beta, -1)

assert klviz.check.lesson05.bandit_optimum(bandit_optimum)


# %% [markdown]
# **Exercise 3: reward-to-go.** Given per-token k1 values `k1` of shape [batch, T], return $G_t=\sum_{u\ge t}k_1(y_u)$ for
# each sequence: the coefficient that turns the per-token KL in the reward into the full sequence gradient.

# %%
def reward_to_go(k1):
    ...

klviz.check.lesson05.reward_to_go(reward_to_go)


# %%
# solution
def reward_to_go(k1):
    return k1.flip(-1).cumsum(-1).flip(-1)

assert klviz.check.lesson05.reward_to_go(reward_to_go)

# %% [markdown]
# ## References
#
# - Y. Tang, R. Munos, [On a few pitfalls in KL divergence gradient estimation for RL](https://arxiv.org/abs/2506.09477) (2025).
# - V. Shah et al., [A Comedy of Estimators: On KL Regularization in RL Training of LLMs](https://arxiv.org/abs/2512.21852) (2025).
# - Liu et al., [Rethinking KL Regularization in RLHF: From Value Estimation to Gradient Optimization](https://arxiv.org/abs/2510.01555) (2025).
# - J. Schulman, [Approximating KL Divergence](http://joschu.net/blog/kl-approx.html) (2020): the estimators whose gradients this lesson takes.
# - DeepSeek-AI, DeepSeek-V3.2 (2025): the ratio-corrected k3; TRL GRPO `use_bias_correction_kl`; verl `kl_loss_type` with the
#   `+` suffix ([core_algos.py](https://github.com/verl-project/verl/blob/main/verl/trainer/ppo/core_algos.py)); verl PR #2953;
#   NeMo-RL [`calculate_kl`](https://github.com/NVIDIA-NeMo/RL/blob/main/nemo_rl/algorithms/utils.py) and
#   [`loss_functions.py`](https://github.com/NVIDIA-NeMo/RL/blob/main/nemo_rl/algorithms/loss/loss_functions.py) (PRs #2506, #2958).
# - Z. Shao et al., [DeepSeekMath](https://arxiv.org/abs/2402.03300) (2024): GRPO puts k3 in the loss.
# - User questions this lesson answers: verl [#3276](https://github.com/verl-project/verl/issues/3276) and
#   [#509](https://github.com/verl-project/verl/issues/509) (reward or loss?), OpenRLHF [#768](https://github.com/OpenRLHF/OpenRLHF/issues/768),
#   TRL [#3556](https://github.com/huggingface/trl/issues/3556) (token vs sequence).
# - Next: lesson 06 (pitfalls in your own rollouts), lesson 07 (train a tiny model with each placement).
