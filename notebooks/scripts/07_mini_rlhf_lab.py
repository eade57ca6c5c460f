# Generated from notebooks/07_mini_rlhf_lab.ipynb by `make sync-notebooks`: edit the notebook, not this file.

# %% [markdown]
# # 07 · Mini RLHF lab: train a tiny model with each KL placement
#
# Lesson 05 computed, on problems small enough to sum exactly, what each way of adding a KL term does to the
# gradient. Here the same choices train a real (tiny) language model: a character-level model of about 45k
# parameters that writes short sentences, a reward that likes positive words, and a REINFORCE/GRPO-style loop with
# the KL in the reward or in the loss. You watch reward, KL and entropy move, and compare the placements side by
# side with the same seed.
#
# **What you will learn**
# - what one RLHF training step does, in about 80 lines you can read (`klviz.rlhf`);
# - how to measure the **true** KL of a trained policy: the exact next-token KL summed along sampled responses,
#   beside the number the estimator reports;
# - what each placement does to reward, KL and entropy: k1 in the loss restrains nothing; k1 in the reward, k2,
#   k3+ and the ratio-corrected k3 in the loss do; k3 in the loss pulls towards a different (forward-KL) target;
# - that on-policy, k2 in the loss, k3+ and the ratio-corrected k3 take *identical* gradient steps (checked on a batch);
# - what happens with several epochs per batch (off-policy) and PPO-style early stopping on `approx_kl`;
# - what these runs say, at this scale, about three recent papers on KL gradients.
#
# **Time**: about 30 minutes of reading, plus the panel and two exercises.
# **Runs in**: about 25 s on an idle 2-core CPU (`STEPS` below sets the length of the side-by-side runs; each run of the
# panel takes 2–5 s at its defaults). The same code runs on a GPU when one is present (`device`).

# %%
import klviz
device = klviz.setup_notebook()

# %%
import math

import numpy as np
import torch
from IPython.display import display

from klviz import lm
from klviz.plotting import new_figure
from klviz.rlhf import PLACEMENT_COLORS, PLACEMENTS, LabConfig, cached_run, train_policy
from klviz.widgets.lesson07 import RLHFLabPanel

# %% [markdown]
# ## 1. The model, the reward, the reference
#
# The policy starts as a copy of the **reference** model $\pi_\text{ref}$ (lesson 04's tiny model, trained on a small
# corpus of sentences). The reward is programmatic: +1 for each positive word (*happy, kind, good, warm, bright*),
# −1 for each negative one, −1 if the response does not end within the token budget. A few samples from the
# reference, with their rewards:

# %%
ref_model = lm.load_tiny_lm("ref")
rollouts = lm.sample_rollouts(ref_model, lm.PROMPTS[:6], klviz.make_generator(0), max_new_tokens=24)
for prompt, text, r in zip(rollouts.prompts, rollouts.responses, lm.reward(rollouts.responses, rollouts.finished)):
    print(f"{prompt!r:>18} -> {text!r:<30} reward {float(r):+.0f}")

# %% [markdown]
# ## 2. One training step
#
# Each step samples a batch of responses from the current policy (which is $\pi_\text{old}$ for this batch), scores
# them, and takes `epochs` gradient steps on the loss
# $$\mathcal L = \frac1B\sum_b\sum_{t\in\text{response}}\Big[-\rho_t A_t \;+\; \beta\,\text{(KL term)}_t\Big],\qquad \rho_t=\frac{\pi_\theta(y_t|\cdot)}{\pi_\text{old}(y_t|\cdot)},$$
# with the advantage $A_t$ = return minus the mean return of the prompt's group. With the KL **in the reward**, the
# return of token $t$ is $R-\beta\sum_{u\ge t}k_1(y_u)$ (reward-to-go: the full sequence gradient of lesson 05) and
# there is no KL term in the loss. With the KL **in the loss**, $A_t$ carries $R$ only and the KL term is verl's
# `kl_penalty(log π, log π_ref, kind)` for k1, k2, k3 or k3+ (or $\rho_t\cdot k_3$ for the ratio-corrected k3).
# Everything below is the library's one copy of the loop:

# %%
klviz.show_source(klviz.rlhf.TrainingRun._advance)

# %% [markdown]
# **The true KL.** The number to trust is not any estimator's: at every response position the model gives both full
# next-token distributions, so the exact $\mathrm{KL}(\pi(\cdot|y_{<t})\,\|\,\pi_\text{ref}(\cdot|y_{<t}))$ is a sum over the
# 32 tokens (`klviz.exact_kl`). Summed along a sampled response and averaged over the batch, it is an unbiased
# estimate of the sequence KL with no sampling noise inside each position (the Rao-Blackwellized estimator of
# Amini et al.). The lab logs it beside what the chosen estimator reports.
#
# ## 3. Watch it train
#
# Pick a placement and a β: the run trains in the background (1–5 s) and its curves grow every few steps; the
# kernel stays free, and moving another control starts another run. Settings already
# run come back at once. Things to try: *none* vs *k1 in loss* (the same KL growth); *k1 in reward* vs *k3 in loss*;
# β = 0; 4 epochs per batch with and without early stopping.

# %%
lab = RLHFLabPanel(device)
lab

# %% [markdown]
# ## 4. Side by side, same seed
#
# Every placement, the same settings and seed: the same first batch, the same initial policy. `STEPS` is the length
# of these runs (40 keeps the whole notebook well under a minute on two cores; the panel's `steps` slider goes to 200).

# %%
STEPS = 40                 # training steps per run (more: slower, closer to convergence)
BETA = 0.2
SHOWN = ("none", "k1 in loss", "k1 in reward", "k2 in loss", "k3 in loss")
runs = {p: cached_run(LabConfig(placement=p, beta=BETA, steps=STEPS), device) for p in SHOWN}

fig, axes = new_figure(9.0, 5.4, nrows=2, ncols=2, sharex=True)
panels = (("reward", "reward (batch mean)"), ("true_kl", "true KL(π‖π_ref) per response [nats]"),
          ("reported_kl", "KL the estimator reports [nats]"), ("entropy", "entropy per token [nats]"))
for ax, (metric, title) in zip(axes.flat, panels):
    for p, h in runs.items():
        ax.plot(h.metrics[metric], color=PLACEMENT_COLORS[p], lw=1.6, label=p)
    ax.set_title(title, fontsize=9.5)
for ax in axes[1]:
    ax.set_xlabel("training step")
axes[0, 0].legend(fontsize=7.5)
fig.suptitle(f"Five placements, β = {BETA}, seed 0, {STEPS} steps", fontsize=10)
display(fig)

print(f"{'placement':<14}{'reward':>8}{'true KL':>9}{'reported':>10}{'entropy':>9}{'seconds':>9}   (means of the last 5 steps)")
for p, h in runs.items():
    s = h.summary()
    print(f"{p:<14}{s['reward']:8.2f}{s['true_kl']:9.2f}{s['reported_kl']:10.2f}{s['entropy']:9.2f}{s['seconds']:9.1f}")

# %% [markdown]
# The checks below state what the table shows, for this seed; each inequality has a wide margin in the run above.

# %%
kl = {p: runs[p].last("true_kl") for p in SHOWN}
ent = {p: runs[p].last("entropy") for p in SHOWN}
# the penalties that follow the reverse-KL gradient (and k3's forward KL) hold the KL down ...
for p in ("k1 in reward", "k2 in loss", "k3 in loss"):
    assert kl[p] < kl["none"] / 2, p
# ... k1 in the loss does not: it ends closer to no penalty than to the real ones
assert kl["k1 in loss"] > 2 * kl["k1 in reward"]
# without a working penalty the entropy collapses further
assert ent["none"] < ent["k1 in reward"] and ent["k1 in loss"] < ent["k1 in reward"]

# the reported number of an unbiased estimator tracks the true KL: mean difference within 4 standard errors
for p in ("k1 in reward", "k3 in loss"):
    diff = np.array(runs[p].metrics["reported_kl"]) - np.array(runs[p].metrics["true_kl"])
    se = diff.std(ddof=1) / math.sqrt(len(diff))
    print(f"{p}: reported - true = {diff.mean():+.3f} ± {2 * se:.3f} (2 SE over {len(diff)} batches)")
    assert abs(diff.mean()) < 4 * se + 1e-9

# %% [markdown]
# How much do the runs differ by chance? Run the two placements whose gradients differ only in the *future* terms
# (k1 in the reward with reward-to-go: full sequence gradient; k2 in the loss: partial gradient) with a second seed:

# %%
seed_runs = {(p, s): (runs[p] if s == 0 else cached_run(LabConfig(placement=p, beta=BETA, steps=STEPS, seed=s), device))
             for p in ("k1 in reward", "k2 in loss") for s in (0, 1)}
for (p, s), h in seed_runs.items():
    print(f"{p:<14} seed {s}: reward {h.last('reward'):.2f}, true KL {h.last('true_kl'):.2f}")
seed_spread = abs(seed_runs[("k1 in reward", 0)].last("true_kl") - seed_runs[("k1 in reward", 1)].last("true_kl"))
placement_gap = abs(seed_runs[("k1 in reward", 0)].last("true_kl") - seed_runs[("k2 in loss", 0)].last("true_kl"))
print(f"\nKL gap between the placements (seed 0): {placement_gap:.2f};  between seeds (k1 in reward): {seed_spread:.2f}")
assert placement_gap < seed_spread
assert abs(kl["k3 in loss"] - kl["k1 in reward"]) < seed_spread   # k3 in the loss: no visible instability either

# %% [markdown]
# At this scale the partial gradient of the token-level k2 loss and the full gradient of k1 in the reward end in the
# same place within seed-to-seed noise. Lesson 05 showed the difference exactly on an enumerable toy; here the
# responses are short, β·(future KL) is small next to the reward signal, and 40 noisy steps do not resolve it.
#
# ## 5. Identical steps on-policy: k2, k3+, ratio-corrected k3, and k1 in the reward (same token)
#
# On-policy ($\pi_\theta=\pi_\text{old}$, one epoch), lesson 05 proved that these four have the same per-token gradient
# $k_1\,\nabla\log\pi$. Check it on the language model: one batch from a trained policy, the gradient of each KL term
# with respect to all 45k parameters.

# %%
policy = runs["k1 in reward"].policy                  # a policy that has moved away from pi_ref
policy.requires_grad_(True)
batch = lm.sample_rollouts(policy, list(lm.PROMPTS[:8]), klviz.make_generator(1), max_new_tokens=24)
mask = batch.response_mask
ref_logp = lm.logprobs_of(ref_model, batch)


def kl_term_gradient(form):
    logp = lm.logprobs_of(policy, batch)
    old = logp.detach()                               # on-policy: pi_old is the current policy
    if form == "k1 in reward (same token)":
        per_token = (logp - ref_logp).detach() * logp
    elif form == "k3·ρ in loss":                      # TRL's k3 has no clamp
        per_token = torch.exp(logp - old) * klviz.k3(ref_logp - logp)
    elif form == "k3·ρ, verl's clamped k3":
        per_token = torch.exp(logp - old) * klviz.kl_penalty(logp, ref_logp, "k3")
    else:
        per_token = klviz.kl_penalty(logp, ref_logp, {"k2 in loss": "k2", "k3+ in loss": "k3+", "k3 in loss": "k3"}[form])
    loss = (per_token * mask).sum(-1).mean()
    return torch.cat([g.flatten() for g in torch.autograd.grad(loss, list(policy.parameters()))])


grads = {f: kl_term_gradient(f) for f in ("k1 in reward (same token)", "k2 in loss", "k3+ in loss", "k3·ρ in loss",
                                          "k3·ρ, verl's clamped k3", "k3 in loss")}
base = grads["k1 in reward (same token)"]
for f, g in grads.items():
    print(f"{f:<26} |grad| = {float(g.norm()):.5f}   relative difference from k1-in-reward: {float((g - base).norm() / base.norm()):.2e}")
for f in ("k2 in loss", "k3+ in loss", "k3·ρ in loss"):
    assert torch.allclose(grads[f], base, rtol=1e-4, atol=1e-7), f
assert float((grads["k3 in loss"] - base).norm() / base.norm()) > 1e-2
k3_values = klviz.k3(ref_logp - lm.logprobs_of(policy, batch).detach())[mask.bool()]
print(f"tokens with k3 > 10 (where verl clamps): {int((k3_values > 10).sum())} of {int(mask.sum())}")
policy.requires_grad_(False)

# %% [markdown]
# Identical to float32 rounding, on 45k parameters, for the ratio-corrected k3 computed as TRL computes it. Built on
# verl's `low_var_kl`, whose value is clamped at 10, the product $
# ho\cdot k_3$ is no longer exact: on a clamped token the
# gradient of $k_3$ is zero and only $k_3\,
# abla
# ho = 10\,
# abla\log\pi$ remains (the count of such tokens is printed
# above; when it is 0 the two rows agree). k3 in the loss is the odd one out: its gradient is the forward-KL one. (k1 in the reward *with reward-to-go*, the placement of section 4, adds the future terms on top.)
#
# ## 6. Several epochs per batch: off-policy, and early stopping
#
# PPO-style training reuses a batch for several epochs; from the second epoch on, the tokens come from
# $\pi_\text{old}\ne\pi_\theta$, and lesson 05 showed that k1 as a loss then becomes gradient *ascent* on
# $\mathrm{KL}(\pi_\text{old}\|\pi_\theta)$. `approx_kl` (MiniMind's masked mean of $\tfrac12(\log\pi_\theta-\log\pi_\text{old})^2$) measures
# how far the inner epochs have moved; early stopping skips the remaining epochs of a batch once it passes a threshold.

# %%
OFF_STEPS = 20             # steps per off-policy run (4 epochs each: about 4x the cost of a step above)
EPOCHS = 4
off = {p: cached_run(LabConfig(placement=p, beta=BETA, steps=OFF_STEPS, epochs=EPOCHS), device)
       for p in ("none", "k1 in loss", "k3 in loss", "k3·ρ in loss")}
stopped = cached_run(LabConfig(placement="k3 in loss", beta=BETA, steps=OFF_STEPS, epochs=EPOCHS, early_stop_kl=0.01), device)
print(f"{EPOCHS} epochs per batch, {OFF_STEPS} steps:")
print(f"{'placement':<28}{'reward':>8}{'true KL':>9}{'entropy':>9}{'epochs run':>12}")
for name, h in list(off.items()) + [("k3 in loss + early stop 0.01", stopped)]:
    print(f"{name:<28}{h.last('reward'):8.2f}{h.last('true_kl'):9.2f}{h.last('entropy'):9.2f}{np.mean(h.metrics['epochs_run']):12.2f}")
assert off["k1 in loss"].last("true_kl") > off["none"].last("true_kl")      # k1 loss off-policy: pushes KL up
assert np.mean(stopped.metrics["epochs_run"]) < EPOCHS                        # early stopping did cut epochs
assert stopped.last("true_kl") < off["k3 in loss"].last("true_kl")            # ... and the KL stayed lower

fig, (ax1, ax2) = new_figure(9.0, 3.2, ncols=2)
for name, h in list(off.items()) + [("k3 in loss + early stop", stopped)]:
    color = PLACEMENT_COLORS.get(name, "#2ca02c")
    style = ":" if "early" in name else "-"
    ax1.plot(h.metrics["true_kl"], style, color=color, label=name)
    ax2.plot(h.metrics["approx_kl"], style, color=color, label=name)
ax1.set_title(f"true KL(π‖π_ref), {EPOCHS} epochs per batch"); ax1.set_xlabel("training step"); ax1.set_ylabel("nats")
ax2.set_title("approx_kl after the batch's last epoch"); ax2.set_xlabel("training step"); ax2.set_ylabel("½ mean (Δ log π)²")
ax2.set_yscale("log")
ax1.legend(fontsize=7.5)
display(fig)


# %% [markdown]
# With four epochs per batch every run drifts further than with one (compare section 4), and k1 in the loss ends
# *above* the no-penalty run: off-policy it is no longer a zero-mean term but a push away from $\pi_\text{old}$, as lesson 05
# measured. Early stopping on `approx_kl` limits how far each batch can move the policy, and the KL with it.
#
# ## 7. What these runs say about the papers
#
# One seed per setting, a 45k-parameter model, 20–40 steps: read these as demonstrations, not as benchmarks.
#
# - **Tang & Munos (arXiv 2506.09477).** *Agrees:* k1 as a loss does not regularise: its KL grows like the no-penalty
#   run's, several times the KL of k1 in the reward (section 4). *Not resolved here:* the partial-gradient pitfall
#   (token-level k2 loss vs k1 in the reward with reward-to-go) is smaller than seed-to-seed noise at this scale
#   (section 4); lesson 05 shows it exactly on an enumerable toy.
# - **Shah et al., "A Comedy of Estimators" (arXiv 2512.21852).** *Agrees:* k1 in the reward trains stably and holds
#   the KL; k1 in the loss is the biased configuration that lets the KL run. *Where the toy differs:* on-policy, k3
#   in the loss shows no instability here: it holds the KL down like k1 in the reward, ending a little lower in KL and
#   reward in section 4, a gap smaller than the seed-to-seed spread measured there (consistent with lesson 05: it
#   optimises the forward KL, which near $\pi_\text{ref}$ agrees with the reverse KL to second order). Off-policy with 4 epochs the ratio-corrected k3
#   and plain k3 differ in the table of section 6, but with one seed that is not evidence for their downstream claims.
# - **Liu et al., "Rethinking KL Regularization in RLHF" (arXiv 2510.01555).** *Agrees exactly:* k2 in the loss and k1
#   in the reward (same token) take the same gradient step on-policy, and so do k3+ and the ratio-corrected k3
#   (section 5, checked on all parameters). k3 in the loss has a different gradient.
#
# ## Takeaways
#
# - Log the **true** KL when you can (exact next-token KL along the sampled responses), not only the estimator's number.
# - k1 as a loss is not a KL penalty: on-policy it averages to nothing, off-policy it pushes the policy away from $\pi_\text{old}$.
# - k1 in the reward (with reward-to-go), k2 in the loss, k3+ and k3·ρ regularise towards $\pi_\text{ref}$; the last three
#   are the same gradient on-policy. k3 in the loss regularises towards a different, forward-KL target.
# - Several epochs per batch make every placement off-policy; `approx_kl` early stopping bounds the drift per batch.
#
# ## Exercises
#
# **Exercise 1: returns with the KL in the reward.** Given sequence rewards `rewards` [B], per-token
# $k_1=\log\pi-\log\pi_\text{ref}$ values `k1` [B, T], the response mask `mask` [B, T] and `beta`, return the per-token
# returns $R_b-\beta\sum_{u\ge t}k_1(y_u)$ on response tokens (0 elsewhere).

# %%
def kl_returns(rewards, k1, mask, beta):
    ...

klviz.check.lesson07.kl_returns(kl_returns)


# %%
# solution
def kl_returns(rewards, k1, mask, beta):
    to_go = (k1 * mask).flip(-1).cumsum(-1).flip(-1)
    return (rewards[:, None] - beta * to_go) * mask

assert klviz.check.lesson07.kl_returns(kl_returns)


# %% [markdown]
# **Exercise 2: `approx_kl` and early stopping.** Given the new and old log-probabilities of the sampled tokens, the
# response mask and a threshold, return `(approx_kl, stop)`: MiniMind's masked mean of $\tfrac12(\log\pi_\text{new}-\log\pi_\text{old})^2$
# and whether it exceeds the threshold.

# %%
def approx_kl_stop(new_logp, old_logp, mask, threshold):
    ...

klviz.check.lesson07.approx_kl_stop(approx_kl_stop)


# %%
# solution
def approx_kl_stop(new_logp, old_logp, mask, threshold):
    value = (0.5 * (new_logp - old_logp) ** 2 * mask).sum() / mask.sum().clamp_min(1)
    return value, bool(value > threshold)

assert klviz.check.lesson07.approx_kl_stop(approx_kl_stop)

# %% [markdown]
# ## References
#
# - Y. Tang, R. Munos, [On a few pitfalls in KL divergence gradient estimation for RL](https://arxiv.org/abs/2506.09477) (2025).
# - V. Shah et al., [A Comedy of Estimators: On KL Regularization in RL Training of LLMs](https://arxiv.org/abs/2512.21852) (2025).
# - Liu et al., [Rethinking KL Regularization in RLHF: From Value Estimation to Gradient Optimization](https://arxiv.org/abs/2510.01555) (2025).
# - A. Amini, T. Vieira, R. Cotterell, [Better Estimation of the KL Divergence Between Language Models](https://arxiv.org/abs/2504.10637) (2025):
#   the exact next-token KL along sampled prefixes.
# - Z. Shao et al., [DeepSeekMath](https://arxiv.org/abs/2402.03300) (2024): GRPO, group baselines, k3 in the loss.
# - verl [`kl_penalty`](https://github.com/volcengine/verl/blob/main/verl/trainer/ppo/core_algos.py); MiniMind
#   `trainer/train_ppo.py` (`approx_kl` early stopping, seed 004); OpenRLHF `compute_approx_kl` (k1 in the reward).
# - Previous: lesson 05 (the exact gradient view). Lesson 04 introduced the tiny model.
