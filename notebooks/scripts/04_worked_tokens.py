# Generated from notebooks/04_worked_tokens.ipynb by `make sync-notebooks`: edit the notebook, not this file.

# %% [markdown]
# # 04 · Worked tokens: PPO's `approx_kl`, masks, and every framework's KL on one batch
#
# A PPO step on a language model computes two different KLs from the same sampled tokens, through a mask,
# with an aggregation, and every framework does each of these a little differently. This lesson takes one
# batch of real rollouts, from a tiny language model that ships with `klviz`, and follows it token by token.
#
# **What you will learn**
# - two worked tokens of MiniMind's `approx_kl`, and why one token's $\frac12\Delta^2$ is not a KL;
# - when $\frac12\Delta^2$ stops approximating $\mathrm{KL}(\pi_{old}\|\pi_\theta)$;
# - the response mask: response tokens up to and including the first EOS, padding out, denominator at least 1,
#   and what goes wrong without each part; token-mean vs sequence-mean vs sequence-sum;
# - the two KLs of one PPO step: `approx_kl` (old vs current, for early stopping) and the reference penalty
#   (current vs reference, in the loss), and which distribution sampled the tokens in each; why MiniMind's, sampled at
#   temperature 0.8 and scored at 1, estimate neither KL, measured;
# - verl's `low_var_kl` line by line: what each clamp protects and where each binds, measured;
# - one batch through verl, OpenRLHF, TRL (GRPO and PPO), NeMo-RL and MiniMind, beside the exact KL, what the
#   logged numbers look like in a real run, and what to set in each framework's config.
#
# **Time** about 40 minutes of reading. **Runs in** about 15 s on an idle 2-core CPU (measured under nbval: 13 s of CPU time; 33 s of wall time on a
# machine busy with other jobs).
#
# The direction rule of the whole suite: tokens $x$ come from the **sampler** $q$, $\log r = \log p(x) - \log q(x)$
# (target minus sampler), and $k_1=-\log r$, $k_2=\frac12(\log r)^2$, $k_3=(r-1)-\log r$ estimate
# $\mathrm{KL}(q\|p)$, the divergence *from the sampler*.

# %%
import klviz
device = klviz.setup_notebook()

# %%
import math

import numpy as np
import torch
from IPython.display import HTML, display

from klviz import frameworks as fw
from klviz import lm
from klviz import tokens as tk
from klviz.plotting import COLORS, new_figure
from klviz.statistics import clustered_mean_se, is_resolved, plus_minus, seeds_to_resolve

torch.set_num_threads(1)       # the tiny model's matrices are small: one thread is fastest

# %% [markdown]
# ## 1. Two tokens, step by step
#
# MiniMind's PPO (`trainer/train_ppo.py`) rescoring a rollout token: the old actor gave it log-probability
# $\log\pi_{old}(x)=-2.0$ when it sampled it; the current actor, a few gradient steps later, gives
# $\log\pi_\theta(x)=-1.8$. The token was drawn from $\pi_{old}$, so $\pi_{old}$ is the sampler and $\pi_\theta$
# the target:
#
# $$\Delta = \log r = \log\pi_\theta(x)-\log\pi_{old}(x),\qquad \text{ratio}=e^{\Delta},\qquad
# \texttt{approx\_kl}_{\text{token}}=\tfrac12\Delta^2 = k_2 .$$
#
# `klviz.tokens.worked_token` does the arithmetic with the library's own `k1`, `k2`, `k3`:

# %%
worked = [tk.worked_token(old, new) for old, new in tk.WORKED_EXAMPLES]
rows = "".join(
    f"<tr><td>{t.old_logprob:.1f}</td><td>{t.new_logprob:.1f}</td><td>{t.delta:.4f}</td><td>{t.ratio:.4f}</td>"
    f"<td>{t.k2:.4f}</td><td>{t.k1:+.4f}</td><td>{t.k3:.4f}</td></tr>" for t in worked)
display(HTML("<table><tr><th>log π_old</th><th>log π_θ</th><th>Δ = log r</th><th>ratio e^Δ</th>"
             "<th>½Δ² (k2)</th><th>k1 = −Δ</th><th>k3 = (r−1)−Δ</th></tr>" + rows + "</table>"))

# %%
# the worked numbers, exactly (to the 4 decimals it prints)
small, large = worked

# %%
assert abs(small.delta - 0.2) < 1e-12 and abs(small.ratio - 1.2214) < 5e-5 and abs(small.k2 - 0.02) < 1e-12
assert abs(large.delta - 1.5) < 1e-12 and abs(large.ratio - 4.4817) < 5e-5 and abs(large.k2 - 1.125) < 1e-12
assert abs(small.ratio - math.exp(0.2)) < 1e-12 and abs(large.k3 - (math.exp(1.5) - 1 - 1.5)) < 1e-12


# %% [markdown]
# A common reading of this code takes 0.02 and 1.125 as "how far the actor moved". They are not KL divergences: a KL is an
# expectation over **all** tokens the old policy could have emitted, and one token only says how its own
# probability moved. To see the KL, give these tokens a distribution. The smallest change that moves the
# sampled token from $e^{-2}=0.135$ to $e^{-1.8}$ rescales every other token by the same factor, so the whole
# vocabulary collapses to two outcomes, "$x$" and "not $x$" (`tk.one_token_push`). Exact sums over those two
# outcomes, weighted by $\pi_{old}$:

# %%
def two_outcome_kl(old_logprob, new_logprob):
    """KL(pi_old || pi_theta) written out by hand for the two-outcome push."""
    p, q = math.exp(old_logprob), math.exp(new_logprob)
    return p * math.log(p / q) + (1 - p) * math.log((1 - p) / (1 - q))

pushes = {ex: tk.push_expectations(*ex) for ex in tk.WORKED_EXAMPLES}
for (old, new), e in pushes.items():
    print(f"{old} -> {new}:  exact KL(π_old‖π_θ) = {e['exact_kl']:.5f}   E[k1] = {e['E_k1']:.5f}   "
          f"E[k3] = {e['E_k3']:.5f}   E[½Δ²] = {e['E_k2']:.5f} ({100 * e['E_k2_over_kl']:.1f}% of the KL)   "
          f"this token's ½Δ² = {e['token_k2']:.4f}")

# %%
for (old, new), e in pushes.items():
    assert abs(e["exact_kl"] - two_outcome_kl(old, new)) < 1e-12        # the library agrees with the hand formula
    assert abs(e["E_k1"] - e["exact_kl"]) < 1e-12 and abs(e["E_k3"] - e["exact_kl"]) < 1e-12   # unbiased
    assert e["E_k2"] < e["exact_kl"] < e["token_k2"]          # ½Δ² of the one token overstates; its mean understates
assert 0.94 < pushes[(-2.0, -1.8)]["E_k2_over_kl"] < 0.95 and 0.87 < pushes[(-2.0, -0.5)]["E_k2_over_kl"] < 0.89
assert 5 < pushes[(-2.0, -1.8)]["token_k2"] / pushes[(-2.0, -1.8)]["exact_kl"] < 7     # "six times the KL"

# %% [markdown]
# Two lessons in one table. First, the sampled token's $\frac12\Delta^2 = 0.02$ is six times the KL (0.0034):
# the other tokens moved too, but less, and they are drawn most of the time. Only the *average* over many
# tokens from $\pi_{old}$ estimates a KL. Second, even that average, $\mathbb{E}_{\pi_{old}}[\frac12\Delta^2]$, is
# not the KL: $k_1$ and $k_3$ average to it exactly ([checked on 2,000 random token pairs](claims.md#k1-k3-unbiased-on-tokens)), $k_2$ only to second order in $\Delta$ ([checked on 1,000 random token pairs](claims.md#k2-matches-kl-to-second-order)) (lesson 02):
# 95% of it for the small step, 88% for the large one.
#
# **When does $\frac12\Delta^2$ stop being a good approximation?** Sweep the new log-probability of the
# sampled token and compare $\mathbb{E}[k_2]$ with the exact KL:

# %%
N_GRID = 400                                      # points of the sweep
new_grid = np.linspace(-4.0, -0.02, N_GRID)       # new log-prob of the sampled token; old is -2.0
sweep = [tk.push_expectations(-2.0, float(n)) for n in new_grid]
delta = new_grid + 2.0
kl = np.array([s["exact_kl"] for s in sweep])
ek2 = np.array([s["E_k2"] for s in sweep])
rel = np.where(kl > 0, ek2 / np.where(kl > 0, kl, 1), np.nan)     # undefined where KL = 0 (Δ = 0)
ok = ~(np.abs(rel - 1) > 0.10)
lo_edge, hi_edge = delta[~ok & (delta < 0)].max(), delta[~ok & (delta > 0)].min()

fig, (ax1, ax2) = new_figure(9.0, 3.2, ncols=2)
ax1.plot(delta, kl, color=COLORS["exact"], lw=2, ls="--", label="exact KL(π_old‖π_θ) = E[k1] = E[k3]")
ax1.plot(delta, ek2, color=COLORS["k2"], lw=1.8, label="E[½Δ²]: what approx_kl averages to")
ax1.set_xlabel("Δ = log π_θ(x) − log π_old(x) of the sampled token (log π_old = −2)")
ax1.set_ylabel("nats (log scale)")
ax1.set_yscale("log")
ax1.set_ylim(1e-4, 10)
ax1.set_title("one-token push: KL and the mean of ½Δ²")
ax1.legend()
ax2.plot(delta, rel, color=COLORS["k2"], lw=1.8)
ax2.axhspan(0.9, 1.1, color=COLORS["k3"], alpha=0.12, label="within ±10%")
for t in worked:
    ax2.axvline(t.delta, color=COLORS["muted"], lw=0.8, ls=":")
ax2.set_xlabel("Δ (dotted: the worked tokens' 0.2 and 1.5)")
ax2.set_ylabel("E[½Δ²] / KL")
ax2.set_title("relative accuracy of ½Δ²")
ax2.axhline(1.0, color=COLORS["muted"], lw=0.8)
ax2.set_ylim(0.4, 2.4)
ax2.legend(loc="lower left")
display(fig)
at = {d: rel[np.argmin(np.abs(delta - d))] for d in (-2.0, -1.0, 0.2, 1.1, 1.5, 1.98)}
up = delta > 0.5
cross_up = delta[up][np.argmax(rel[up] > 1.0)]             # pushed up: where E[½Δ²] passes the KL again
print(f"around Δ = 0, E[½Δ²] stays within 10% of the KL only for Δ between {lo_edge:.2f} and {hi_edge:.2f}; "
      "E[½Δ²]/KL at Δ = " + ", ".join(f"{d:+.2f}: {v:.2f}" for d, v in at.items())
      + f"; pushed up, it passes the KL again at Δ = {cross_up:.2f}")

# %%
assert -0.6 < lo_edge < -0.1 and 0.2 < hi_edge < 0.7        # the ±10% band is narrow: a fraction of a nat
assert at[0.2] > 0.9 and 0.78 < at[1.1] < 0.84                   # pushed up a little: ½Δ² undershoots ...
assert 1.6 < cross_up < 1.8 and 2.1 < at[1.98] < 2.2             # ... pushed up hard, it overshoots
assert at[-1.0] > 1.1 and at[-2.0] > 1.5                       # pushed down: it overshoots

# %% [markdown]
# Near $\Delta=0$ the two curves touch (both are the same $\frac12$ Fisher quadratic). The band where
# $\frac12\Delta^2$ is within 10% is narrow, printed above: less than half a nat either way. Outside it the error has no
# fixed sign. For a token whose old probability is below ½, like this one (0.135), pushed *down* it overshoots; pushed *up* it
# first undershoots (0.81 of the KL at $\Delta=1.1$) and then, once the token holds more than half of the probability,
# overshoots (past $\Delta\approx1.7$, and 2.15 times the KL at $\Delta=1.98$), as the right panel shows; for a token above ½
# the two directions swap ([checked on 1,000 old probabilities](claims.md#one-token-push-half-delta-squared)). An early-stopping rule built on it is a heuristic threshold, not a
# measured KL. Takeaway: **one token's $\frac12\Delta^2$ is not a KL; its batch mean is a second-order approximation of
# $\mathrm{KL}(\pi_{old}\|\pi_\theta)$, too high or too low depending on where the policy moved.**
#
# ## 2. A tiny real language model: reference, old, new
#
# `klviz.lm` ships a character-level model (a neural n-gram: the last 16 characters through one hidden layer,
# 45k parameters) trained by `scripts/train_tiny_lm.py` on sentences like *"the cat sat on the happy mat."*,
# in three states, as in RLHF:
#
# - **ref**: the model after supervised training (frozen reference);
# - **old**: ref after a few policy-gradient steps on a programmatic reward (+1 per positive word such as
#   *happy*, *kind*, *good*; −1 per negative word; −1 without an EOS): the policy that samples a batch;
# - **new**: old after 10 more update steps on one batch of old's rollouts, as PPO's inner loop does.

# %%
ref, old, new = (lm.load_tiny_lm(state) for state in lm.STATES)
show = lm.PROMPTS[:5]
for name, model in (("ref", ref), ("old", old), ("new", new)):
    ro = lm.sample_rollouts(model, show, klviz.make_generator(11), max_new_tokens=48)
    print(f"{name:>3}  reward {lm.reward(ro.responses, ro.finished).mean():+.2f}  " +
          " | ".join(f"{p}{r}" for p, r in zip(ro.prompts[:3], ro.responses[:3])))

# %% [markdown]
# A batch looks like a real rollout: prompts of different lengths, responses that end in EOS at different
# places, padding. `lm.update_batch()` is the batch the shipped update steps were trained on (every prompt six
# times, sampled from old). Its tensors are `[batch, T]`, one layout for everything: BOS, prompt, response,
# EOS, PAD; `logprobs[b, t]` is the sampler's log-probability of token `t`, and
# `lm.next_token_logprobs(model, ro)` gives the **full** next-token distribution at every position, so the
# exact KL sits beside every estimate.

# %%
batch = lm.update_batch(old)
b = 1
print("tokens   :", " ".join(lm.token_strings(batch.input_ids[b])))
print("resp mask:", " ".join(f"{int(m):>{len(s)}}" for m, s in zip(batch.response_mask[b], lm.token_strings(batch.input_ids[b]))))
print(f"batch {tuple(batch.input_ids.shape)}; response lengths {batch.response_lengths[:8].tolist()} ...; "
      f"{int(batch.finished.sum())} of {batch.batch_size} ended with EOS")

# %%
# rescoring the sampled tokens with the sampler reproduces its log-probs, and every row of the full
# distributions is normalised: the log-probs are real
rescored = lm.logprobs_of(old, batch)
assert torch.allclose(rescored, batch.logprobs, atol=1e-5)
full_old = lm.next_token_logprobs(old, batch)

# %%
assert torch.allclose(full_old.logsumexp(-1), torch.zeros(()), atol=1e-5)
assert int(batch.response_lengths.min()) < int(batch.response_lengths.max())     # EOS at different places

# %% [markdown]
# ## 3. Masks: which tokens count
#
# The frameworks store per-token tensors response-first: one column per generated token, `[batch, R]`
# (`batch.response_layout(x)` moves our rows into that layout). MiniMind's mask is built in three moves:
#
# 1. a row's length is the position of its **first EOS + 1** (the EOS is kept: stopping is an action the policy
#    chose), or all of its generated tokens if it never emitted EOS;
# 2. padding positions are out;
# 3. the denominator is `mask.sum().clamp(min=1)`, so a batch with no response token gives 0, not NaN (so do
#    `klviz.masked_mean` and every framework model of `klviz.frameworks` ([checked on 1,000 random batches](claims.md#empty-mask-gives-zero))).
#
# Some generation engines keep sampling every row until the longest is done. `stop_at_eos=False` imitates
# that: the rows go on after their EOS.

# %%
klviz.show_source(tk.minimind_response_mask)

# %%
engine = lm.sample_rollouts(old, [p for p in lm.PROMPTS for _ in range(4)], klviz.make_generator(5),
                            max_new_tokens=40, stop_at_eos=False)
ids, produced = engine.response_layout(engine.input_ids), engine.response_layout_mask
for row in range(3):
    print(repr(lm.decode(ids[row], specials=True)))
masks = tk.mask_variants(ids, produced, lm.EOS_ID)
lp_old = engine.response_layout(engine.logprobs)
lp_new = engine.response_layout(lm.logprobs_of(new, engine))
print()
for name, m in masks.items():
    ak = fw.minimind_approx_kl(lp_new, lp_old, m)["approx_kl"]
    print(f"{name:>13}: {int(m.sum()):5d} tokens counted, approx_kl(old → new) = {float(ak):.4f}")

# %%
right = masks["minimind"]
first_eos = (ids == lm.EOS_ID).float().argmax(1)
has_eos = (ids == lm.EOS_ID).any(1)
assert torch.equal(right.sum(1), torch.where(has_eos, first_eos + 1, produced.sum(1).long()).float())
after_eos = int(masks["no_eos_cut"].sum() - right.sum())
assert after_eos > 0                                  # this engine produced tokens after EOS ...
ak = {n: float(fw.minimind_approx_kl(lp_new, lp_old, m)["approx_kl"]) for n, m in masks.items()}
assert ak["no_eos_cut"] != ak["minimind"]             # ... and counting them changes approx_kl
print(f"{after_eos} of {int(masks['no_eos_cut'].sum())} generated tokens came after an EOS")

# %% [markdown]
# Counting tokens after EOS averages in what the model says *after it has stopped*, text that nobody reads
# and no reward scored; dropping the EOS itself removes the one decision that ends a response from the
# statistic and from the loss. And the denominator: a micro-batch whose responses were all truncated to
# nothing has an all-zero mask.

# %%
values = torch.tensor([[0.3, 0.1, 0.0]])
empty = torch.zeros(1, 3)
no_clamp = (values * empty).sum() / empty.sum()
with_clamp = (values * empty).sum() / empty.sum().clamp(min=1)
print(f"without clamp: {no_clamp.item()}   with clamp(min=1): {with_clamp.item()}   klviz.masked_mean: "
      f"{klviz.masked_mean(values, empty).item()}")

# %%
assert math.isnan(no_clamp.item()) and with_clamp.item() == 0.0 == klviz.masked_mean(values, empty).item()

# %% [markdown]
# One NaN in a logged mean poisons every running average after it, and in a loss it poisons the weights.
#
# **Aggregation.** The same per-token matrix gives different numbers depending on how it is averaged
# (`klviz.agg_loss` implements verl's modes). On the update batch, the per-token $k_1$ of
# $\mathrm{KL}(\pi_{old}\|\pi_{ref})$ (KL in the reward is computed at rollout time, when the policy *is* old):

# %%
R_mask = batch.response_layout_mask
lp_old_b = batch.response_layout(batch.logprobs)
lp_ref_b = batch.response_layout(lm.logprobs_of(ref, batch))
k1_old_ref = (lp_old_b - lp_ref_b) * R_mask          # k1 of KL(pi_old || pi_ref) per token
agg = tk.aggregations(k1_old_ref, R_mask)
who = {"token-mean": "verl loss default, MiniMind, TRL GRPO `kl`",
       "seq-mean-token-mean": "verl `reward_kl_penalty`, OpenRLHF `kl`",
       "seq-mean-token-sum": "TRL PPO `objective/kl` (a sequence KL)"}
for mode, value in agg.items():
    print(f"{mode:>20}: {value:8.4f}   logged by {who[mode]}")
print(f"mean response length {float(R_mask.sum(1).mean()):.1f} tokens; "
      f"seq-mean-token-sum / token-mean = {agg['seq-mean-token-sum'] / agg['token-mean']:.1f}")

# %%
seq_sum, seq_len = k1_old_ref.sum(1), R_mask.sum(1)

# %%
assert abs(agg["token-mean"] - float(seq_sum.sum() / seq_len.sum())) < 1e-5          # long rows weigh more
assert abs(agg["seq-mean-token-mean"] - float((seq_sum / seq_len).mean())) < 1e-5     # every row weighs 1
assert abs(agg["seq-mean-token-sum"] - float(seq_sum.mean())) < 1e-4                  # chain rule: a sequence KL
assert agg["seq-mean-token-sum"] > 10 * agg["token-mean"]

# %% [markdown]
# Same tokens, same estimator: the batch mean of per-sequence sums is the token mean times the mean response length,
# exactly ([checked on 1,000 random batches](claims.md#token-mean-times-length-is-sequence-sum)) (printed above). Before comparing a KL curve from TRL's PPO with one from verl, check which of the
# three it is.
#
# ## 4. Two KLs in one PPO step
#
# Inside one PPO step there are two KLs, and the sampled tokens are old's in both:
#
# | | compares | on whose tokens | estimates | used for |
# |---|---|---|---|---|
# | `approx_kl` (MiniMind), `ppo_kl` (verl), `approxkl` (TRL) | current π_θ vs old π_old | π_old's | $\mathrm{KL}(\pi_{old}\|\pi_\theta)$ | early stopping / monitoring |
# | `kl_ref_penalty` (MiniMind), `kl_loss` (verl) | current π_θ vs reference | π_old's | $\mathrm{KL}(\pi_\theta\|\pi_{ref})$ when π_θ = π_old | a term in the loss |
#
# For `approx_kl` the sampler is π_old, so $\log r=\log\pi_\theta-\log\pi_{old}$ and it estimates the
# divergence *from* π_old. For the reference penalty the code puts the policy first; it estimates
# $\mathrm{KL}(\pi_\theta\|\pi_{ref})$ exactly only on the first minibatch, when π_θ still equals the sampler.
# After that the tokens come from another policy and, without the ratio $\pi_\theta/\pi_{old}$ (TRL's
# `use_bias_correction_kl`, NeMo-RL), it is off-policy.
#
# Follow both along the shipped update path, on the batch the steps were trained on, beside the exact values
# from the full distributions:

# %%
path = lm.update_path()
full_ref = batch.response_layout(lm.next_token_logprobs(ref, batch))
full_old_b = batch.response_layout(full_old)
trace = []
for model in path:
    lp = batch.response_layout(lm.logprobs_of(model, batch))
    full = batch.response_layout(lm.next_token_logprobs(model, batch))
    trace.append({
        "approx_kl": float(fw.minimind_approx_kl(lp, lp_old_b, R_mask)["approx_kl"]),
        "ppo_kl": float(fw.verl_ppo_kl(lp, lp_old_b, R_mask)["ppo_kl"]),
        "exact_old_theta": float(klviz.masked_mean(klviz.exact_kl(full_old_b, full), R_mask)),
        "kl_ref": float(fw.minimind_kl_ref_penalty(lp, lp_ref_b, R_mask)["kl_ref_penalty"]),
        "exact_theta_ref": float(klviz.masked_mean(klviz.exact_kl(full, full_ref), R_mask)),
    })
stop = next((s for s, t in enumerate(trace) if t["approx_kl"] > 0.25), None)
print(" step  approx_kl  ppo_kl  exact KL(old‖θ)   kl_ref   exact KL(θ‖ref)")
for s, t in enumerate(trace):
    print(f"{s:5d}  {t['approx_kl']:9.4f}  {t['ppo_kl']:6.4f}  {t['exact_old_theta']:15.4f}  "
          f"{t['kl_ref']:7.4f}  {t['exact_theta_ref']:15.4f}" + ("   <- MiniMind stops" if s == stop else ""))

# %%
assert trace[0]["approx_kl"] == 0.0 and trace[0]["ppo_kl"] == 0.0          # step 0: pi_theta is pi_old
assert all(a["approx_kl"] < b["approx_kl"] for a, b in zip(trace, trace[1:]))   # the policy drifts monotonically
assert stop is not None and 3 <= stop <= 10
assert trace[0]["kl_ref"] > 0                                              # old already differs from ref
assert trace[-1]["kl_ref"] > 10 * trace[-1]["exact_theta_ref"]              # unclamped k3 off-policy explodes
at_stop = trace[stop]
assert at_stop["kl_ref"] > 10 * at_stop["exact_theta_ref"]                   # ... already at the stop step
assert 0.1 < at_stop["ppo_kl"] < 0.2 < trace[-1]["ppo_kl"] < 0.25              # ten times a real run's 1e-2
print(f"at the stop step {stop}: kl_ref = {at_stop['kl_ref']:.2f} against an exact KL(θ‖ref) of "
      f"{at_stop['exact_theta_ref']:.3f}; approx_kl = {at_stop['approx_kl']:.3f}, ppo_kl = {at_stop['ppo_kl']:.3f}")

# %% [markdown]
# At step 0 the current policy *is* old and `approx_kl` is exactly 0, while the reference penalty is already
# positive: old has moved away from ref in earlier iterations. MiniMind stops this batch at the step printed
# above (threshold 0.25), and zeroes the loss of the remaining minibatches. Without that stop, the unclamped
# $k_3$ of `kl_ref` explodes while the exact $\mathrm{KL}(\pi_\theta\|\pi_{ref})$ barely moves: a few of old's
# tokens whose probability the updates crushed have $\pi_{ref}/\pi_\theta$ in the thousands, and $k_3$ grows
# like that ratio (section 5).
#
# What early stopping does and does not protect: it bounds how far one batch's epochs move the policy from π_old
# (the quantity it measures), and with it how far off-policy the later minibatches are. It does **not** make the
# reference penalty's sampled value meaningful: at the stop step (printed below the table) `kl_ref` already reads
# more than ten times the exact $\mathrm{KL}(\pi_\theta\|\pi_{ref})$. Without the ratio correction, the
# unclamped $k_3$ on old's tokens is a poor estimate long before `approx_kl` reaches 0.25.
#
# Notice also that on this batch $\frac12\Delta^2$ and even $k_1$ run **above** the exact KL. That is not
# noise: these are the very tokens the update steps were fitted to, so they are the tokens whose
# probability moved most. On a **fresh** batch from old, $k_1$ is unbiased for the exact per-position KL,
# token by token ($\mathbb{E}[k_1 \mid \text{prefix}]$ is the exact KL at that prefix, so the differences are
# uncorrelated and the plain standard error applies ([checked on 2,000 random token pairs](claims.md#k1-k3-unbiased-on-tokens))):

# %%
N_FRESH_REPEATS = 20     # fresh responses per prompt (more: tighter check, slower)
fresh = lm.sample_rollouts(old, [p for p in lm.PROMPTS for _ in range(N_FRESH_REPEATS)], klviz.make_generator(99),
                           max_new_tokens=48)
F_mask = fresh.response_layout_mask
f_old = fresh.response_layout(fresh.logprobs)
f_new = fresh.response_layout(lm.logprobs_of(new, fresh))
f_exact = klviz.exact_kl(fresh.response_layout(lm.next_token_logprobs(old, fresh)),
                         fresh.response_layout(lm.next_token_logprobs(new, fresh)))
sel = F_mask.bool()
diff = (f_old - f_new - f_exact)[sel]                     # k1 minus the exact KL at each position
se = float(diff.std() / math.sqrt(diff.numel()))
print(f"fresh batch, {diff.numel()} tokens: mean k1 = {float((f_old - f_new)[sel].mean()):.4f}, "
      f"exact = {float(f_exact[sel].mean()):.4f}, difference {plus_minus(float(diff.mean()), se, '+.4f')}")
print(f"training batch at the last step: ppo_kl = {trace[-1]['ppo_kl']:.4f}, exact = {trace[-1]['exact_old_theta']:.4f}")

# %%
assert abs(float(diff.mean())) < 4 * se                                     # unbiased on fresh tokens
assert trace[-1]["approx_kl"] > trace[-1]["exact_old_theta"]                # the fitted batch overstates

# %% [markdown]
# **MiniMind's rollouts are not π_old's.** Everything so far assumed that π_old sampled the batch. MiniMind's
# `train_ppo.py` (and `train_grpo.py`) call `rollout_engine.rollout(..., temperature=0.8)`; its default engine
# (`TorchRolloutEngine` in `trainer/rollout_engine.py`) samples with `model.generate(do_sample=True, temperature=0.8)` and
# then recomputes `per_token_logps` from the raw logits, at temperature 1 (`compute_per_token_logps`). So
# `old_resp_logp` is π_old's log-probability of a token that $\pi_{old}^{(T=0.8)}$ drew, and every mean MiniMind takes is
# over the tempered policy's tokens. Neither `kl_ref` nor `approx_kl` is then an estimate of the KL it names, not even on
# the first minibatch, where π_θ = π_old: $k_3$ is unbiased ([checked on 2,000 random token pairs](claims.md#k1-k3-unbiased-on-tokens)) because $\mathbb E_\pi[\pi_{ref}/\pi]=1$
# under π's own tokens, and under the tempered policy's tokens that mean is no longer 1. `fw.minimind_rollout` builds a batch the way MiniMind does. The same policy's tokens at T = 1 and at T = 0.8,
# each against the exact value at its own prefixes (responses as the independent units):

# %%
MM_REPEATS = 20     # responses per prompt for each sampler (more: tighter, slower)
mm_prompts = [p for p in lm.PROMPTS for _ in range(MM_REPEATS)]
at_1 = lm.sample_rollouts(old, mm_prompts, klviz.make_generator(404), max_new_tokens=48)
samplers = {"T = 1, π_old itself": (at_1, at_1.logprobs),
            "T = 0.8, MiniMind's rollout": fw.minimind_rollout(old, mm_prompts, klviz.make_generator(404), 48)}
tempered = {}
for name, (ro, old_resp_logp) in samplers.items():
    M = ro.response_layout_mask
    full = {n: ro.response_layout(lm.next_token_logprobs(m, ro)) for n, m in (("old", old), ("ref", ref), ("new", new))}
    lp_o, lp_r, lp_n = (ro.response_layout(x) for x in (old_resp_logp, lm.logprobs_of(ref, ro), lm.logprobs_of(new, ro)))
    kl_ref = fw.minimind_kl_ref_penalty(lp_o, lp_r, M)            # first minibatch: pi_theta = pi_old
    approx = fw.minimind_approx_kl(lp_n, lp_o, M)                 # after the shipped update steps
    exact_ref = klviz.exact_kl(full["old"], full["ref"])          # KL(pi_old || pi_ref) at each prefix
    mean_k2 = (full["old"].exp() * 0.5 * (full["new"] - full["old"]) ** 2).sum(-1)   # E_{pi_old}[½Δ²] at each prefix
    tempered[name] = {"kl_ref": clustered_mean_se(kl_ref["per_token"] - exact_ref, M.bool()),
                      "approx": clustered_mean_se(approx["per_token"] - mean_k2, M.bool()),
                      "exact_ref": float(klviz.masked_mean(exact_ref, M)), "responses": ro.batch_size}
    print(f"{name}: kl_ref {float(kl_ref['kl_ref_penalty']):.4f} against KL(π_old‖π_ref) {tempered[name]['exact_ref']:.4f} "
          f"at the same prefixes, difference {plus_minus(*tempered[name]['kl_ref'])};  approx_kl {float(approx['approx_kl']):.4f}, "
          f"minus E_π_old[½Δ²] at the same prefixes: {plus_minus(*tempered[name]['approx'])}")
t08, t1 = tempered["T = 0.8, MiniMind's rollout"], tempered["T = 1, π_old itself"]
kl_ref_low = -t08["kl_ref"][0] / t08["exact_ref"]
approx_needs = seeds_to_resolve(*t08["approx"], t08["responses"])
print(f"on MiniMind's tokens kl_ref reads {100 * kl_ref_low:.0f}% below the KL; the approx_kl shift is "
      + ("resolved" if is_resolved(*t08["approx"]) else f"not resolved by {t08['responses']} responses (it would take about "
         f"{approx_needs:,} at this size)" if approx_needs else "not resolved"))

# %%
for d, se in (t1["kl_ref"], t1["approx"]):
    assert not is_resolved(d, se)                                 # pi_old's own tokens: unbiased at each prefix
assert is_resolved(*t08["kl_ref"]) and t08["kl_ref"][0] < 0          # T = 0.8: kl_ref reads low, resolved
assert 0.2 < kl_ref_low < 0.3                                        # "20–30% low"
assert not is_resolved(*t08["approx"])

# %% [markdown]
# On π_old's own tokens both differences are zero within their standard errors: `kl_ref` is unbiased for the
# KL at each prefix, and `approx_kl` averages to its own expectation $\mathbb E_{\pi_{old}}[\frac12\Delta^2]$ (section 1: a
# second-order KL). On MiniMind's tokens `kl_ref` reads lower than the KL it is named after, by the fraction printed above
# (a difference beyond 3 standard errors: `klviz.statistics.is_resolved`, the suite's one rule for such verdicts); the
# shift of `approx_kl` is not resolved at this size. (A likely reason for the sign, not isolated here: the tempered policy
# draws the tokens π_old already likes most, and reaches prefixes of its own.) So MiniMind's logged `kl_ref` is a number about
# $\pi_{old}^{(0.8)}$'s tokens, not a KL of π_θ, and its early stopping compares a threshold with an average over the tempered
# policy. Lesson [08](08_sampler_vs_trainer.ipynb) §2 meets the same thing as "a temperature not divided out": the fix is to
# score with the temperature that sampled (divide the logits by 0.8 in the recompute and in the update, as TRL and verl
# divide by theirs), or to sample at 1.

# %% [markdown]
# ## 5. verl's `low_var_kl`, line by line
#
# verl's $k_3$ (`kl_penalty(logprob, ref_logprob, "low_var_kl")`) is reproduced by `klviz.kl_penalty`; this
# is the one copy of it: `_penalty_value` computes the log-ratio and hands k3 to the clamp table,
# `klviz.framework_rules.VERL_LOW_VAR_KL` (read from verl's source), whose `ClampRule.apply` does the two clamps:

# %%
import klviz.estimators
from klviz.framework_rules import VERL_LOW_VAR_KL, ClampRule

klviz.show_source(klviz.estimators._penalty_value)
print(VERL_LOW_VAR_KL)
klviz.show_source(ClampRule.apply)

# %% [markdown]
# - `log_r = ref_logprob - logprob` (written $d$ below): $\log r$ with the policy as the sampler, so it estimates
#   $\mathrm{KL}(\pi\|\pi_{ref})$.
# - **Input clamp to $[-20, 20]$.** $e^{d}$ overflows float32 above $d\approx 88.7$: a token to which the
#   policy gives a probability below $10^{-38}$ but the reference does not. The forward value would still be clamped to 10 at
#   the end: the output clamp binds long before the input clamp, which therefore changes no value at all ([checked on 3,000 log-ratios](claims.md#verl-input-clamp-changes-no-value)).
#   The *gradient* is the problem: the output clamp's zero gradient times the infinite gradient of `exp` is
#   NaN, and one NaN gradient destroys the weights. Clamping $d$ first keeps everything finite.

# %%
d_values = torch.tensor([0.5, 3.0, 25.0, 100.0, -12.0])
with_clamp = tk.low_var_kl_gradient(d_values, input_clamp=True)
without = tk.low_var_kl_gradient(d_values, input_clamp=False)
for d, v, g1, g2 in zip(d_values.tolist(), with_clamp["value"].tolist(), with_clamp["grad"].tolist(),
                        without["grad"].tolist()):
    print(f"log r = {d:6.1f}: value {v:8.4f}   gradient with input clamp {g1:+.4f}   without {g2:+.4f}")

# %%
assert bool(torch.isfinite(with_clamp["grad"]).all()) and math.isnan(without["grad"][3].item())
assert math.isfinite(torch.exp(torch.tensor(88.7)).item()) and math.isinf(torch.exp(torch.tensor(88.8)).item())
assert math.exp(-88.7) < 1e-38
assert with_clamp["value"][4] == 10.0 and with_clamp["grad"][4] == 0.0     # d = -12: clamped, no gradient
assert torch.equal(with_clamp["value"], without["value"])         # same forward value: only the backward differs

# %% [markdown]
# - **Output clamp to $[-10, 10]$.** Its lower half can never act: $k_3=e^{d}-d-1\ge 0$ ([checked on 2,000 random token pairs](claims.md#k2-k3-never-negative)) because
#   $e^{d}\ge 1+d$ (the tangent line lies under the convex curve). Computed verl's way,
#   `exp(d) - d - 1` in float32, rounding can at worst leave values a hair below 0 near $d=0$ (of the order
#   of float32's spacing $10^{-7}$), nowhere near $-10$. The upper half acts on **both** sides of $d=0$, at the two crossing points printed below. For $d>2.61$, a token
#   the reference finds about 13.6 times likelier than the policy does: the heavy tail of $k_3$. And for $d<-11.0$, a
#   token the *policy* finds $e^{11}\approx 6\cdot10^4$ times likelier than the reference: there $k_3\approx -d-1$ is
#   nearly linear, not heavy-tailed at all, and these are the tokens RL pushed up hardest. On both sides the clamp
#   sets the gradient to 0 (the last row of the table above, $d=-12$): the penalty stops pulling back exactly the tokens
#   that moved most ([checked on 207,003 log-ratios](claims.md#verl-k3-clamp-binds-at-2-61-and-minus-11)).

# %%
tiny = torch.logspace(-9, -1, 2_001)
grid = torch.cat([torch.linspace(-30, 30, 200_001), tiny, -tiny])     # float32, as in training
k3_verl_way = torch.exp(grid) - grid - 1
d_star, d_low = tk.k3_crossing_point(), tk.k3_crossing_point(negative=True)
print(f"smallest k3 over log r in [-30, 30]: {k3_verl_way.min().item():.3g} (verl's formula), "
      f"{klviz.k3(grid).min().item():.3g} (klviz's expm1); k3 reaches 10 at log r = {d_star:.4f} "
      f"(π_ref/π = {math.exp(d_star):.1f}) and at log r = {d_low:.4f} (π/π_ref = {math.exp(-d_low):.3g})")

# %%
assert abs(d_low + 11.0) < 1e-3 and 5e4 < math.exp(-d_low) < 7e4
assert abs(float(klviz.k3(torch.tensor(d_low, dtype=torch.float64))) - 10) < 1e-9
assert k3_verl_way.min().item() > -1e-6 and klviz.k3(grid).min().item() > -1e-6
assert abs(d_star - 2.6109) < 1e-4 and abs(math.exp(d_star) - 13.6) < 0.05

# %% [markdown]
# How much value does the upper clamp remove on a real batch? Take the policy after the last update step
# against the reference, on the update batch:

# %%
lp_new_b = batch.response_layout(lm.logprobs_of(new, batch))
effect = tk.low_var_kl_clamp_effect(lp_new_b, lp_ref_b, R_mask)
print(f"{100 * effect['fraction_clamped']:.2f}% of {effect['tokens']} tokens clamped; token mean of k3 "
      f"{effect['mean_unclamped']:.4f} unclamped vs {effect['mean_clamped']:.4f} clamped: the clamp removes "
      f"{100 * effect['removed_share']:.0f}% of the value (largest single k3: {effect['largest_k3']:.1f})")

# %%
manual = klviz.k3(lp_ref_b - lp_new_b)

# %%
assert abs(effect["mean_unclamped"] - float(klviz.masked_mean(manual, R_mask))) < 1e-5
assert effect["fraction_clamped"] < 0.05 and effect["removed_share"] > 0.1    # a few tokens, much of the value
assert effect["smallest_k3"] > -1e-6
assert float((lp_ref_b - lp_new_b)[R_mask.bool()].min()) > tk.k3_crossing_point(negative=True)   # all on the d > 2.61 side

# %% [markdown]
# A handful of tokens, each with a ratio above 13.6, carry a large share of the unclamped mean: $k_3$'s
# variance is dominated by its tail (lesson 02), and the clamp trades that variance for a bias, on exactly the
# tokens where policy and reference disagree most (on this batch all clamped tokens are on the $d>2.61$ side; a run that
# pushes some tokens up by a factor of $6\cdot10^4$ meets the other side). `ppo_kl`, finally, is the other KL:
# `masked_mean(old_log_prob - log_prob)`, the $k_1$ of $\mathrm{KL}(\pi_{old}\|\pi_\theta)$, with the log-ratio clamped to $\pm20$
# in verl's default loss (`compute_policy_loss_vanilla`, since PR #1779), and it can come out negative on a single
# minibatch.
#
# **Calibrating your dashboard.** The numbers of this lesson are large because the shipped update steps are large:
# `ppo_kl` reaches 0.15 per token at the step where MiniMind stops, and 0.21 at the last step (section 4). And `ppo_kl` on
# verl's *first* minibatch is exactly 0 only if the update's forward pass reproduces `old_log_prob` bit for bit. In verl's
# default mode the trainer recomputes `old_log_prob` itself before the update (`compute_log_prob`, with its own
# `log_prob_micro_batch_size`), so a non-zero first-minibatch `ppo_kl` comes from recompute-versus-update numerics (other
# micro-batches, other packing, reductions that depend on the batch shape) and says nothing about the rollout engine. Only
# when the engine's own log-probabilities stand in for `old_log_prob` (verl's rollout-correction `bypass_mode`; MiniMind with
# `--rollout_engine sglang`, whose `per_token_logps` are SGLang's) is the first-minibatch value the engine–trainer
# mismatch: lesson [08](08_sampler_vs_trainer.ipynb) measures it. MiniMind's default torch engine recomputes them with the
# policy itself, and its `--debug_log_ratio` flag prints the first minibatch's largest |log ratio| for exactly this check.
#
# ## 6. One batch through every framework
#
# `klviz.frameworks` re-derives, from their published formulas, what each framework computes and what it
# logs. Each function's docstring names the repository and file. One fresh batch from old, the policy after
# six update steps, and the reference:

# %%
theta = path[6]
T_mask = F_mask
t_old, t_ref = f_old, fresh.response_layout(lm.logprobs_of(ref, fresh))
t_theta = fresh.response_layout(lm.logprobs_of(theta, fresh))
full = {name: fresh.response_layout(lm.next_token_logprobs(m, fresh)) for name, m in (("old", old), ("ref", ref), ("theta", theta))}
table = fw.side_by_side(t_theta, t_old, t_ref, T_mask,
                        exact_policy_ref=klviz.exact_kl(full["theta"], full["ref"]),
                        exact_old_policy=klviz.exact_kl(full["old"], full["theta"]),
                        exact_old_ref=klviz.exact_kl(full["old"], full["ref"]))
html_rows = "".join(f"<tr><td>{r['framework']}</td><td><code>{r['logged as']}</code></td><td>{r['estimates']}</td>"
                    f"<td>{r['how']}</td><td style='text-align:right'>{r['value']:.4f}</td></tr>" for r in table)
display(HTML("<table><tr><th>framework</th><th>logged as</th><th>estimates</th><th>how</th><th>value</th></tr>"
             + html_rows + "</table>"))

# %%
val = {(r["framework"], r["logged as"], r["estimates"]): r["value"] for r in table}
ex_tok = {r["estimates"]: r["value"] for r in table if r["framework"] == "exact" and r["logged as"] == "per-token mean"}
# identical formulas give identical numbers
assert val[("TRL GRPO", "kl", "KL(π_θ‖π_ref)")] == val[("MiniMind", "kl_ref", "KL(π_θ‖π_ref)")]
assert abs(val[("verl", "actor/kl_loss", "KL(π_θ‖π_ref)")]
           - val[("OpenRLHF", "kl (use_kl_loss, k3)", "KL(π_θ‖π_ref)")]) < 1e-6
assert abs(val[("verl", "actor/kl_loss", "KL(π_θ‖π_ref)")] - val[("NeMo-RL", "kl_penalty", "KL(π_θ‖π_ref)")]) < 1e-6
assert val[("MiniMind", "kl_ref (train_grpo.py)", "−KL(π_θ‖π_ref)")] < 0 < val[("MiniMind", "kl_ref", "KL(π_θ‖π_ref)")]
# TRL's approxkl is MiniMind's approx_kl diluted by padding: times (valid tokens) / (all entries)
trl_ak, mm_ak = val[("TRL PPO", "approxkl", "KL(π_old‖π_θ)")], val[("MiniMind", "approx_kl", "KL(π_old‖π_θ)")]
assert abs(trl_ak - mm_ak * float(T_mask.sum()) / T_mask.numel()) < 1e-5
# unbiased estimators of the KL from the sampler agree with the exact value within their standard error
k1_tok = (t_old - t_theta)[T_mask.bool()]
se_k1 = float((k1_tok - klviz.exact_kl(full["old"], full["theta"])[T_mask.bool()]).std() / math.sqrt(k1_tok.numel()))
assert abs(val[("verl", "actor/ppo_kl", "KL(π_old‖π_θ)")] - ex_tok["KL(π_old‖π_θ)"]) < 4 * se_k1

# %% [markdown]
# How to read the table:
#
# - **Directions.** Rows that compare old with the reference (verl and OpenRLHF in the reward, TRL PPO's
#   `objective/kl`) estimate $\mathrm{KL}(\pi_{old}\|\pi_{ref})$; the loss terms compare π_θ with the
#   reference on old's tokens. `ppo_kl`, `approx_kl` and `approxkl` estimate $\mathrm{KL}(\pi_{old}\|\pi_\theta)$.
# - **Clamps.** verl and OpenRLHF clamp $k_3$ at 10; NeMo-RL clamps the importance weight times $k_3$ at 10 (since
#   its PR #2958); TRL and MiniMind do not clamp. On the same tokens
#   the unclamped token mean is larger (the tail of section 5).
# - **NeMo-RL's default.** The `kl_penalty` row is NeMo-RL as it ships, `use_on_policy_kl_approximation=False`: the weight
#   is `exp(curr - curr.detach())`, 1 in value, so the number equals verl's `actor/kl_loss` (the same clamps, checked in the
#   cell below). Its gradient is not verl's: the weight adds the score of the token, which makes it the straight-through
#   `k3+` gradient, $k_1\nabla\log\pi$ per token ([checked on 1,000 random batches](claims.md#nemo-rl-default-kl-gradient-is-k3-plus)),
#   on-policy the reverse-KL one and off-policy without any weight for the sampler. The row labelled **non-default** sets the
#   flag: the weight is then $\pi_\theta/\pi_\text{generation}$, the rollout *engine*'s log-probs in the denominator, not
#   π_old's (here π_old stands in for the engine; lesson [08](08_sampler_vs_trainer.ipynb) measures where they part).
# - **Off-policy.** π_θ did not sample these tokens. $k_3$ of π_θ vs ref on old's tokens is biased for
#   $\mathrm{KL}(\pi_\theta\|\pi_{ref})$; multiplying by $\pi_\theta/\pi_{old}$ (TRL `use_bias_correction_kl`) is the
#   per-token importance weight that removes the bias *at each prefix*, at the price of variance (next cell). The prefixes
#   themselves were drawn by π_old: for the KL of whole responses a per-token weight is not enough ([checked on 1,000 tabular sequence policies](claims.md#per-token-rho-is-the-partial-gradient-at-old-prefixes)) (lesson
#   [05](05_gradients.ipynb) §6).
# - **MiniMind's GRPO** logs `kl_ref` as the token mean of `ref - logp`: **minus** $k_1$, negative on average, under the name
#   its PPO gives to $k_3$ (`train_grpo.py`, `fw.minimind_grpo_kl`) ([checked on 1,000 random batches](claims.md#minimind-grpo-logs-minus-k1)). MiniMind's rows read this batch as if π_old had
#   sampled it at temperature 1; section 4 measured what its temperature of 0.8 changes.
# - **Scale.** TRL PPO's `objective/kl` is a per-sequence sum, tens of times larger than the token means, and
#   its `approxkl` is diluted by padding (a plain mean over all `batch × R` entries).
#
# Is the ratio-corrected $k_3$ really unbiased here, and how noisy is it? Per position,
# $\mathbb{E}_{\pi_{old}}[\rho\,k_3 \mid \text{prefix}]$ is the exact $\mathrm{KL}(\pi_\theta\|\pi_{ref})$ at that prefix, so the
# differences from the exact per-position KL have mean 0 and the plain standard error applies (the prefixes are old's:
# this is the per-position KL at old's prefixes, which is what a per-token weight can promise):

# %%
sel_t = T_mask.bool()
exact_tr = klviz.exact_kl(full["theta"], full["ref"])[sel_t]
d_tr = (t_ref - t_theta)[sel_t]
plain_k3 = klviz.k3(d_tr)
corrected = torch.exp((t_theta - t_old)[sel_t]) * plain_k3
for name, est in (("k3 on old's tokens", plain_k3), ("k3 × π_θ/π_old", corrected)):
    gap = est - exact_tr
    print(f"{name:>19}: mean {float(est.mean()):.4f} vs exact {float(exact_tr.mean()):.4f}, "
          f"difference {plus_minus(float(gap.mean()), float(gap.std() / math.sqrt(gap.numel())), '+.4f')}")
for est in (plain_k3, corrected):
    gap = est - exact_tr
    assert abs(float(gap.mean())) < 4 * float(gap.std() / math.sqrt(gap.numel()))

# %% [markdown]
# On this batch both are within a few standard errors of the exact value: the correction removes a bias that
# is small next to the noise of a heavy-tailed estimator. The weights matter more as π_θ drifts further from
# the sampler (on the training batch at the last update step the uncorrected $k_3$ is far above the exact
# KL: the trace of section 4), and they change the *gradient* even where the value barely moves (lesson 05).
#
# ## 7. The panel: one response, token by token
#
# The response strip shows old's tokens coloured by the chosen quantity at the chosen update step (hover a
# token for its log-probabilities and all four values). The left plot shows the batch means against the
# update step with MiniMind's early-stop threshold; the right one the chosen response's per-token values, on one scale for that response at every step, so a
# point twice as high is twice the value whichever step you compare it with.
# Move **update step** and watch which tokens light up; switch the colouring between $k_1$ (signed: blue
# tokens became more likely), $k_2$, $k_3$ and the exact KL at each position.

# %%
from klviz.widgets.lesson04 import WorkedTokensPanel

panel = WorkedTokensPanel(device="cpu")
panel

# %%
# the panel's numbers are the lesson's numbers
for s in (0, 4, panel.num_steps):
    d = panel.set(step=s)
    assert panel.last_error is None and abs(d["approx_kl"] - trace[s]["approx_kl"]) < 1e-6
assert panel.last["stop_step"] == stop
panel.set(step=4);


# %% [markdown]
# Things to try: find a token where $k_1$ is negative but the exact KL at that position is large (the
# update moved *other* tokens at that position); set the threshold to 0.1 and see how much earlier PPO would
# stop; compare $k_2$ and $k_3$ colourings on the tokens of *good*, *kind*, *happy*, which the reward pushed up.
#
# ## 8. What to set in your config
#
# Which flag selects each placement and estimator, its default, and which logged metric estimates which KL. Read from
# each framework's config and loss code (files named; `klviz.frameworks` follows the same code, commit in each docstring).
#
# | framework | KL in the reward | KL in the loss | clip, epochs | logged: name → estimates |
# |---|---|---|---|---|
# | **verl** (`verl/trainer/config/actor/actor.yaml`, `algorithm.py`, `core_algos.py`, `workers/utils/losses.py`) | `algorithm.use_kl_in_reward` (False), `algorithm.kl_penalty` (`kl` = k1), `kl_ctrl.kl_coef` (0.001) | `actor.use_kl_loss` (False), `kl_loss_type` (`low_var_kl` = clamped k3; `+` suffix: k2's gradient), `kl_loss_coef` (0.001), `loss_agg_mode` (`token-mean`) | `clip_ratio` 0.2; `ppo_epochs` (1); `ppo_mini_batch_size` (256) splits a batch into several updates | `actor/reward_kl_penalty` → KL(π_old‖π_ref) (mean of per-sequence token means); `actor/kl_loss` → KL(π_θ‖π_ref) on π_old's tokens; `actor/ppo_kl` → KL(π_old‖π_θ), k1, log-ratio clamped ±20 (with `policy_loss.loss_mode=kl_cov`: the mean of \|Δ\|, no KL ([checked on 1,000 random batches](claims.md#verl-kl-cov-logs-mean-abs-delta))) |
# | **TRL** GRPO (`trl/trainer/grpo_config.py`, `grpo_trainer.py`, release 1.16.0) | — | `beta` (**0.0**: no KL term, no reference model, no `kl` metric), k3 unclamped, `use_bias_correction_kl` (True: × per-token ρ) | `epsilon` 0.2; `num_iterations` (1) | `kl` → token mean of (ρ·)k3, KL(π_θ‖π_ref) per position |
# | **TRL** PPO (`trl/experimental/ppo/ppo_config.py`, `ppo_trainer.py`; not in release 1.16.0) | `kl_estimator` (`k1`; or `k3`), `kl_coef` (0.05) | — | `cliprange` 0.2; `num_ppo_epochs` (4) | `objective/kl` → KL(π_old‖π_ref) as a **per-sequence sum**; `policy/approxkl_avg` → ½Δ², padding-diluted |
# | **OpenRLHF** (`openrlhf/cli/train_ppo_ray.py`, `models/utils.py`, `trainer/ray/ppo_actor.py`) | default: `--algo.kl.estimator` (`k1`), `--algo.kl.init_coef` (0.01; 0 builds no reference model); every estimator clamped ±10 | `--algo.kl.use_loss` (off; for GRPO), with `--algo.kl.init_coef` as its coefficient | `--actor.eps_clip` 0.2; `--train.max_epochs` (1); `--rollout.batch_size` 1024 prompts (× `--rollout.n_samples_per_prompt`, 1) over `--train.batch_size` 128: 8 updates per batch | `kl` → KL(π_old‖π_ref), mean of per-sequence means (reward); KL(π_θ‖π_ref), **token mean** (`use_loss`); 0 when `init_coef` is 0 ([checked on 1,000 random batches](claims.md#openrlhf-logged-kl)) |
# | **NeMo-RL** (`nemo_rl/algorithms/loss/loss_functions.py`, `utils.py`, `advantage_estimator.py`, `examples/configs/grpo_math_1B.yaml`) | `use_kl_in_reward` (False): with the Reinforce++ estimator β·k of each token is subtracted from that token's own advantage (no reward-to-go); with the PPO estimator it is a per-token reward under GAE; the loss coefficient is then 0 | `reference_policy_kl_penalty` (0.01), `reference_policy_kl_type` (`k3`), input clamp 20, output clamp 10 on weight × k3; `use_on_policy_kl_approximation` (False: weight `exp(curr - curr.detach())`, value 1, gradient of k3+; True: π_θ/π_generation) | `ratio_clip_min/max` 0.2 | `kl_penalty` → KL(π_θ‖π_ref) per position |
# | **MiniMind** (`trainer/train_ppo.py`, `train_grpo.py`, `rollout_engine.py`) | — | PPO: `--kl_coef` (0.02), k3 unclamped (`kl_ref_penalty`); GRPO: `--beta` (0.1), the same k3 | `--clip_epsilon` 0.2; `--ppo_update_iters` (2); `--early_stop_kl` (0.25) on `approx_kl`; rollouts at temperature 0.8, log-probs recomputed at 1 | PPO: `kl_ref` → k3 on the T = 0.8 policy's tokens, no KL of π_θ; `approx_kl` → ½Δ² on the same tokens (section 4). GRPO: `kl_ref` → **minus k1** |
#
# **With more than one update per batch** (a second epoch, or the second of several minibatches): the tokens come from
# π_old ≠ π_θ. A KL **in the reward** was computed once, at rollout, and does not change; PPO then weights the whole
# advantage by ρ, which leaves a bias that grows with the drift (lesson 05 §6). A KL **in the loss** is recomputed every
# update with π_θ on π_old's tokens: without ρ (verl, OpenRLHF, MiniMind, NeMo-RL's default) it is off-policy and its
# value is no longer a KL estimate ([checked on 1,000 random token triples](claims.md#k1-on-old-tokens-is-a-difference-of-kls)) (section 4 above); TRL's `use_bias_correction_kl` weights each token by ρ = π_θ/π_old,
# NeMo-RL only with `use_on_policy_kl_approximation`, and then by π_θ/π_generation. Both are per-token weights: they
# correct each token at its prefix, not the prefixes (lesson [05](05_gradients.ipynb) §6). `ppo_kl` and `approx_kl`
# grow from 0 across the updates of a batch; early stopping on them bounds the drift, not the reference penalty's error.
#
# ## Takeaways
#
# - One token's $\frac12\Delta^2$ (0.02, 1.125 above) is not a KL. The batch mean of $\frac12\Delta^2$ is
#   a second-order approximation of $\mathrm{KL}(\pi_{old}\|\pi_\theta)$ ([checked on 1,000 random token pairs](claims.md#k2-matches-kl-to-second-order)), within 10% only for
#   $|\Delta|$ well below 1 in the push above, and too low or too high beyond ([checked on 1,000 old probabilities](claims.md#one-token-push-half-delta-squared)); $k_1$ and
#   $k_3$ are unbiased for it ([checked on 2,000 random token pairs](claims.md#k1-k3-unbiased-on-tokens)).
# - The mask: response tokens up to and including the first EOS, no padding, denominator at least 1.
# - Token mean, sequence mean and sequence sum are three different numbers from the same tokens.
# - `approx_kl`/`ppo_kl` (old vs current, old's tokens) guard the PPO update; the reference penalty
#   (current vs reference) shapes the objective. The sampler decides each direction.
# - verl's input clamp protects gradients from NaN and changes no value ([checked on 3,000 log-ratios](claims.md#verl-input-clamp-changes-no-value)); the output
#   clamp's lower half never acts, its upper half binds twice ([checked on 207,003 log-ratios](claims.md#verl-k3-clamp-binds-at-2-61-and-minus-11)): on the heavy tail of $k_3$ ($\pi_{ref}/\pi>13.6$) and on tokens the policy pushed up by $6\cdot10^4$,
#   where it zeroes the gradient that should pull them back.
# - Early stopping on `approx_kl` bounds the drift per batch; it does not make an off-policy reference penalty accurate.
# - A non-zero first-minibatch `ppo_kl` in verl's default mode is recompute-versus-update numerics; it is the engine–trainer
#   mismatch only when the engine's log-probs stand in for `old_log_prob` (bypass; lesson 08).
# - MiniMind samples at temperature 0.8 and scores at 1: its `kl_ref` and `approx_kl` average over the tempered policy's
#   tokens and estimate neither KL (its `kl_ref` read 20–30% low here); its GRPO logs minus $k_1$ as `kl_ref`.
# - NeMo-RL's default KL weight is 1 in value and $k_3$+'s gradient; TRL's `use_bias_correction_kl` is a per-token ρ. Neither
#   corrects the prefixes of a response drawn by π_old.
# - Measured on the batch the update was fitted to, sampled-token KLs overstate the drift; on fresh tokens
#   $k_1$ is unbiased for the exact per-position KL.
#
# ## Exercises

# %% [markdown]
# **Exercise 1: MiniMind's `approx_kl`.** Given the current log-probabilities `new_logp`, the rollout ones
# `old_logp` and a 0/1 `mask`, all `[batch, R]`, return the scalar MiniMind uses for early stopping.

# %%
def my_approx_kl(new_logp, old_logp, mask):
    ...

klviz.check.lesson04.approx_kl(my_approx_kl)


# %%
# solution
def my_approx_kl(new_logp, old_logp, mask):
    log_ratio = new_logp - old_logp                  # target (current) minus sampler (old)
    return (0.5 * log_ratio ** 2 * mask).sum() / mask.sum().clamp(min=1)

assert klviz.check.lesson04.approx_kl(my_approx_kl)


# %% [markdown]
# **Exercise 2: the response mask.** `completion_ids` `[batch, R]` are generated tokens, `completion_mask` is 1
# where the engine produced a token and 0 on padding. Return the float mask that keeps each response up to and
# including its first `eos_id` (a row without EOS keeps all its tokens).

# %%
def my_response_mask(completion_ids, completion_mask, eos_id):
    ...

klviz.check.lesson04.response_mask(my_response_mask)


# %%
# solution
def my_response_mask(completion_ids, completion_mask, eos_id):
    is_eos = (completion_ids == eos_id) & completion_mask.bool()
    first = is_eos.int().argmax(1)
    length = torch.where(is_eos.any(1), first + 1, completion_mask.sum(1))
    cols = torch.arange(completion_ids.shape[1])[None, :]
    return ((cols < length[:, None]) & completion_mask.bool()).float()

assert klviz.check.lesson04.response_mask(my_response_mask)


# %% [markdown]
# **Exercise 3: verl's `low_var_kl`.** Return the per-token $k_3$ penalty from the policy's `logprob` and the
# reference's `ref_logprob`, with verl's two clamps, so that both its value and its gradient stay finite.

# %%
def my_low_var_kl(logprob, ref_logprob):
    ...

klviz.check.lesson04.low_var_kl(my_low_var_kl)


# %%
# solution
def my_low_var_kl(logprob, ref_logprob):
    log_r = (ref_logprob - logprob).clamp(-20, 20)       # tokens from the policy: ref minus policy
    return (torch.exp(log_r) - log_r - 1).clamp(-10, 10)

assert klviz.check.lesson04.low_var_kl(my_low_var_kl)

# %% [markdown]
# ## References
#
# - MiniMind, [`trainer/train_ppo.py`](https://github.com/jingyaogong/minimind/blob/master/trainer/train_ppo.py):
#   `approx_kl`, `early_stop_kl`, `kl_ref_penalty`, `resp_policy_mask`.
# - verl, [`verl/trainer/ppo/core_algos.py`](https://github.com/verl-project/verl/blob/main/verl/trainer/ppo/core_algos.py):
#   `kl_penalty` (`low_var_kl` and its clamps), `agg_loss`, `compute_policy_loss_vanilla` (`ppo_kl`); `verl/trainer/config/actor/actor.yaml` (the config card); issues
#   [#2928](https://github.com/verl-project/verl/issues/2928) (why clamp at −10), [#891](https://github.com/verl-project/verl/issues/891)
#   and [#751](https://github.com/verl-project/verl/issues/751) (NaN from `low_var_kl`).
# - OpenRLHF, [`openrlhf/models/utils.py`](https://github.com/OpenRLHF/OpenRLHF/blob/main/openrlhf/models/utils.py):
#   `compute_approx_kl`, `compute_reward`; [`openrlhf/cli/train_ppo_ray.py`](https://github.com/OpenRLHF/OpenRLHF/blob/main/openrlhf/cli/train_ppo_ray.py) (flags).
# - TRL, [`trl/trainer/grpo_trainer.py`](https://github.com/huggingface/trl/blob/main/trl/trainer/grpo_trainer.py)
#   (`per_token_kl`, `use_bias_correction_kl`) and [`trl/experimental/ppo/ppo_trainer.py`](https://github.com/huggingface/trl/blob/main/trl/experimental/ppo/ppo_trainer.py)
#   (`kl_estimator`, `objective/kl`, `approxkl`); issues [#2914](https://github.com/huggingface/trl/issues/2914) (direction)
#   and [#925](https://github.com/huggingface/trl/issues/925) (negative KL with k1).
# - NeMo-RL, [`nemo_rl/algorithms/utils.py`](https://github.com/NVIDIA-NeMo/RL/blob/main/nemo_rl/algorithms/utils.py)
#   (`calculate_kl`) and [`nemo_rl/algorithms/loss/loss_functions.py`](https://github.com/NVIDIA-NeMo/RL/blob/main/nemo_rl/algorithms/loss/loss_functions.py) (the importance-weighted KL term).
# - J. Schulman, [Approximating KL Divergence](http://joschu.net/blog/kl-approx.html) (2020).
# - Y. Bengio et al., *A Neural Probabilistic Language Model*, JMLR 2003: the architecture of `klviz.lm`.
