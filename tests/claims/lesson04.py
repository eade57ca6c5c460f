"""Claims first stated in lesson 04 (Worked tokens: approx_kl, masks, every framework's KL on one batch)."""

from __future__ import annotations

import math

import numpy as np
import torch

import klviz
from klviz import frameworks as fw
from klviz import tokens as tk

from .batches import log_ratios, one_thread, random_batches
from .families import token_pairs
from .registry import Evidence, claim


def _k2_gap(q: torch.Tensor, u: torch.Tensor) -> float:
    """E_q[½u²] − KL(q‖p) = Σ q (½u² − k3(u)), each term computed without cancellation (a series below |u| = 0.01)."""
    small = u.abs() < 1e-2
    series = -(u**3 / 6 + u**4 / 24 + u**5 / 120 + u**6 / 720 + u**7 / 5040)
    direct = 0.5 * u**2 - (torch.expm1(u) - u)
    return float((q * torch.where(small, series, direct)).sum())


@claim(
    "k2-matches-kl-to-second-order",
    wording="E_q[½(log r)²] agrees with KL(q‖p) to second order only: its relative error is at most 0.35 times the "
    "largest "
    "|log r| once that is below 0.3, so it vanishes as p approaches q.",
    domain="random token pairs (families.token_pairs, vocabularies 2 to 50,257, all five kinds), p moved towards q "
    "along "
    "its log-ratio until the largest |log r| is 0.3 and 0.03; exact sums over the vocabulary in float64, the "
    "normaliser by log1p/expm1 and the gap term by term",
    unit="random token pairs",
)
@one_thread
def k2_matches_kl_to_second_order() -> Evidence:
    cases = token_pairs(1000, seed=41)
    worst, where, n = 0.0, "", 0
    for c in cases:
        u0 = c.log_r
        if float(u0.abs().max()) == 0:
            continue
        n += 1
        for top in (0.3, 0.03):
            w = (top / float(u0.abs().max())) * u0
            u = w - torch.log1p((c.q * torch.expm1(w)).sum())  # log r of the moved p, accurately
            kl = float((c.q * (torch.expm1(u) - u)).sum())
            rel = abs(_k2_gap(c.q, u)) / kl / float(u.abs().max())
            assert rel <= 0.35, f"relative gap {rel:.3g} × max|log r| at {top} on {c.describe()}"
            if rel > worst:
                worst, where = rel, f"largest |log r| {top} on {c.describe()}"
    return Evidence(n, f"largest |E[k2] − KL| / (KL · max|log r|): {worst:.4f} at {where}")


def _push_ratio(p0: float, delta: np.ndarray) -> np.ndarray:
    """E_{π_old}[½Δ²] / KL(π_old‖π_θ) of the one-token push, vectorised over Δ (float64; the rest rescaled by
    (1 − p0 e^Δ)/(1 − p0), its log computed with log1p so that tiny pushes keep their digits)."""
    d = np.asarray(delta, dtype=np.float64)
    rest = np.log1p(-p0 * np.expm1(d) / (1 - p0))  # log of the factor on every other token
    kl = p0 * -d + (1 - p0) * -rest
    # KL written without cancellation: p0 (e^d − 1 − d)... via k3 of the two log-ratios, weighted by the old probs
    kl = p0 * (np.expm1(d) - d) + (1 - p0) * (np.expm1(rest) - rest)
    ek2 = 0.5 * (p0 * d**2 + (1 - p0) * rest**2)
    return ek2 / kl


@claim(
    "one-token-push-half-delta-squared",
    wording="In the one-token push (one token's probability p moved to p·e^Δ, the others rescaled), for a token with "
    "p below ½, E[½Δ²] is above the KL for every push down, and for pushes up below it until the token holds between "
    "½ and "
    "0.87 of the probability, above it beyond; for p above ½ the two directions swap.",
    domain="old probabilities p on a grid of 1,000 in (0, 1) (½ left out), each with 200 pushes towards the edge (Δ "
    "from "
    "±1e-4 on, to a probability of 99.99% or 1e-4 times p) and 400 the other way, the crossing found by bisection; "
    "exact "
    "two-outcome sums, checked against klviz.tokens.push_expectations on every tenth p",
    unit="old probabilities",
)
@one_thread
def one_token_push() -> Evidence:
    ps = [float(p) for p in np.linspace(0.0009, 0.9991, 1001) if abs(p - 0.5) > 1e-9]
    closest, where, held = math.inf, "", []
    for i, p0 in enumerate(ps):
        small = p0 < 0.5
        edge = -np.geomspace(1e-4, 8.0, 200) if small else np.geomspace(1e-4, math.log(0.9999 / p0), 200)
        r = _push_ratio(p0, edge)  # below 1/2 pushed down, above 1/2 pushed up: always above the KL
        assert (r > 1).all(), f"p = {p0:.4f}, Δ = {edge[np.argmin(r)]:.3g}: E[½Δ²]/KL = {r.min()}"
        if r.min() - 1 < closest:
            closest, where = float(r.min() - 1), f"p = {p0:.4f}, Δ = {edge[np.argmin(r)]:+.2g}"
        if i % 10 == 0:  # the closed form is the library's
            e = tk.push_expectations(math.log(p0), math.log(p0) + float(edge[100]))
            assert abs(e["E_k2"] / e["exact_kl"] - r[100]) < 1e-6 * r[100]
        far = math.log(0.9999 / p0) if small else math.log(1e-4 / p0)
        grid = math.copysign(1.0, far) * np.geomspace(1e-4, abs(far), 400)
        ratios = _push_ratio(p0, grid)
        first_above = int(np.argmax(ratios > 1))
        assert ratios[0] < 1 and ratios[-1] > 1, f"p = {p0:.4f}: no crossing"
        assert (ratios[:first_above] < 1).all() and (ratios[first_above:] > 1).all(), f"p = {p0:.4f}: two crossings"
        lo, hi = float(grid[first_above - 1]), float(grid[first_above])
        for _ in range(50):
            mid = (lo + hi) / 2
            lo, hi = (lo, mid) if _push_ratio(p0, np.array([mid]))[0] > 1 else (mid, hi)
        token = p0 * math.exp(hi)
        share = token if small else 1 - token  # the share of the side that grew
        assert 0.5 < share < 0.87, f"p = {p0:.4f}: crossing where the growing side holds {share:.3f}"
        held.append(share)
    return Evidence(
        len(ps),
        f"closest to the KL on the always-above side: E[½Δ²]/KL − 1 = {closest:.2g} at {where}; crossings where "
        f"the growing side holds {min(held):.3f} to {max(held):.3f} of the probability",
    )


@claim(
    "token-mean-times-length-is-sequence-sum",
    wording="On the same per-token values, the batch mean of per-sequence sums is the token mean times the mean "
    "response "
    "length, exactly.",
    domain="random [batch, length] batches (batches.random_batches: batch 1-8, length 1-24, log-ratio scales 1e-4 to "
    "30, "
    "extreme tokens), every row non-empty, k1 of every batch, klviz.agg_loss in float64",
    unit="random batches",
)
@one_thread
def token_mean_times_length() -> Evidence:
    cases = random_batches(1000, seed=42, empty_rows=False)
    worst, where = 0.0, ""
    for c in cases:
        v = c.logprob - c.ref
        tok = float(klviz.agg_loss(v, c.mask, "token-mean"))
        seq = float(klviz.agg_loss(v, c.mask, "seq-mean-token-sum"))
        want = tok * float(c.mask.sum(-1).mean())
        err = abs(seq - want) / max(1.0, abs(seq))
        assert err < 1e-12, f"{seq} vs {want} on {c.describe()}"
        if err >= worst:
            worst, where = err, c.describe()
    return Evidence(len(cases), f"largest relative difference {worst:.2g} (float64 rounding) on {where}")


@claim(
    "empty-mask-gives-zero",
    wording="With no counted token (an all-zero mask), klviz.masked_mean and every framework model return 0, not NaN.",
    domain="random batches (batches.random_batches) with their mask set to zero; klviz.masked_mean and the logged "
    "value of "
    "every function of klviz.frameworks.FRAMEWORK_FUNCTIONS at its defaults",
    unit="random batches",
)
@one_thread
def empty_mask_gives_zero() -> Evidence:
    cases = random_batches(1000, seed=43)
    fns = {
        "masked_mean": lambda c, m: klviz.masked_mean(c.logprob, m),
        "verl_kl_loss": lambda c, m: fw.verl_kl_loss(c.logprob, c.ref, m)["logged"],
        "verl_kl_in_reward": lambda c, m: fw.verl_kl_in_reward(c.old, c.ref, m)["logged"],
        "verl_ppo_kl": lambda c, m: fw.verl_ppo_kl(c.logprob, c.old, m)["logged"],
        "openrlhf_kl": lambda c, m: fw.openrlhf_kl(c.logprob, c.ref, m, use_kl_loss=True)["logged"],
        "trl_grpo_kl": lambda c, m: fw.trl_grpo_kl(c.logprob, c.ref, m, c.old)["logged"],
        "trl_ppo_kl": lambda c, m: fw.trl_ppo_kl(c.old, c.ref, m)["logged"],
        "nemo_rl_kl_loss": lambda c, m: fw.nemo_rl_kl_loss(c.logprob, c.ref, m)["logged"],
        "minimind_approx_kl": lambda c, m: fw.minimind_approx_kl(c.logprob, c.old, m)["logged"],
        "minimind_kl_ref_penalty": lambda c, m: fw.minimind_kl_ref_penalty(c.logprob, c.ref, m)["logged"],
        "minimind_grpo_kl": lambda c, m: fw.minimind_grpo_kl(c.logprob, c.ref, m)["logged"],
    }
    assert set(fns) - {"masked_mean"} == set(fw.FRAMEWORK_FUNCTIONS), "a framework model has no case here"
    for c in cases:
        empty = torch.zeros_like(c.mask)
        for name, f in fns.items():
            out = float(f(c, empty))
            assert out == 0.0, f"{name} gives {out} on {c.describe()} with an empty mask"
    return Evidence(len(cases), f"every one of the {len(fns)} functions gave exactly 0 on every batch")


@claim(
    "verl-input-clamp-changes-no-value",
    wording="In verl's low_var_kl the output clamp at 10 binds before the input clamp at ±20 for every log-ratio: the "
    "input "
    "clamp changes no value, and only keeps the gradient finite (without it, exp overflows to a NaN gradient).",
    domain="log-ratios (batches.log_ratios: uniform on [−120, 120], log-uniform magnitudes 1e-8 to 30, and points near "
    "2.61, −11.0 and ±20), float32 and float64",
    unit="log-ratios",
)
@one_thread
def verl_input_clamp() -> Evidence:
    d = log_ratios(3000, seed=44)
    nan_without = 0
    for dtype in (torch.float32, torch.float64):
        x = d.to(dtype)
        with_c = tk.low_var_kl_gradient(x, input_clamp=True)
        without = tk.low_var_kl_gradient(x, input_clamp=False)
        assert torch.equal(with_c["value"], without["value"]), "the input clamp changed a value"
        assert bool(torch.isfinite(with_c["grad"]).all()), "a gradient with the input clamp is not finite"
        nan_without += int(torch.isnan(without["grad"]).sum())
    assert nan_without > 0, "no overflow case in the domain: the claim's second half is untested"
    return Evidence(
        d.numel(),
        f"values identical in both precisions; without the input clamp {nan_without} gradients were NaN "
        "(float32 beyond log r ≈ 88.7, float64 beyond ≈ 709.8 does not occur here)",
    )


@claim(
    "verl-k3-clamp-binds-at-2-61-and-minus-11",
    wording="verl's output clamp on k3 binds exactly where log r > 2.6109 (π_ref/π > 13.6) or log r < −11.0 (π/π_ref > "
    "6·10⁴), and sets the gradient there to 0; its lower half never binds, and k3 computed verl's way (exp(d) − d − 1 "
    "in "
    "float32) never falls below −1e-6.",
    domain="log-ratios (batches.log_ratios) plus a grid of 200,001 points on [−30, 30] and 4,002 within 1e-9..0.1 of "
    "0, "
    "float32 and float64",
    unit="log-ratios",
)
@one_thread
def verl_k3_clamp_points() -> Evidence:
    d_hi, d_lo = tk.k3_crossing_point(), tk.k3_crossing_point(negative=True)
    assert abs(d_hi - 2.6109) < 1e-4 and abs(d_lo + 11.0) < 1e-3
    tiny = torch.logspace(-9, -1, 2_001, dtype=torch.float64)
    d = torch.cat([log_ratios(3000, seed=45), torch.linspace(-30, 30, 200_001, dtype=torch.float64), tiny, -tiny])
    margin = 1e-6
    for dtype in (torch.float32, torch.float64):
        x = d.to(dtype)
        out = tk.low_var_kl_gradient(x, input_clamp=True)
        binds = out["value"] >= 10.0
        far = ((x.double() - d_hi).abs() > margin) & ((x.double() - d_lo).abs() > margin)
        want = (x.double() > d_hi) | (x.double() < d_lo)
        assert torch.equal(binds[far], want[far]), f"the clamp binds elsewhere ({dtype})"
        assert bool((out["grad"][binds] == 0).all()), "a clamped token kept a gradient"
        raw = torch.exp(x) - x - 1
        assert float(raw[torch.isfinite(raw)].min()) > -1e-6
    return Evidence(d.numel(), f"crossing points {d_hi:.6f} and {d_lo:.6f}; bound checked away from each by {margin:g}")


@claim(
    "nemo-rl-default-kl-gradient-is-k3-plus",
    wording="NeMo-RL's default KL term (use_on_policy_kl_approximation=False: weight exp(curr − curr.detach())) has "
    "the "
    "value of verl's low_var_kl and, on every token where no clamp binds, the gradient of verl's k3+, k1·∇log π; it "
    "carries no weight for the policy that sampled the tokens.",
    domain="random batches (batches.random_batches, log-ratio scales 1e-4 to 30, extreme tokens), float64, values of "
    "every token and autograd gradients with respect to the policy's log-probs",
    unit="random batches",
)
@one_thread
def nemo_default_is_k3_plus() -> Evidence:
    cases = random_batches(1000, seed=46)
    checked = 0
    for c in cases:
        x1 = c.logprob.clone().requires_grad_(True)
        x2 = c.logprob.clone().requires_grad_(True)
        nemo = fw.nemo_rl_kl_loss(x1, c.ref, c.mask)["per_token"]
        verl_value = fw.verl_kl_penalty(c.logprob, c.ref, "low_var_kl") * c.mask
        assert torch.allclose(nemo.detach(), verl_value, rtol=1e-12, atol=1e-12), c.describe()
        plus = fw.verl_kl_penalty(x2, c.ref, "k3+") * c.mask
        (g1,) = torch.autograd.grad(nemo.sum(), x1)
        (g2,) = torch.autograd.grad(plus.sum(), x2)
        d = c.ref - c.logprob
        free = (c.mask > 0) & (d < 2.6109) & (d > -11.0)  # no clamp binds
        assert torch.allclose(g1[free], g2[free], rtol=1e-9, atol=1e-12), c.describe()
        assert torch.allclose(g1[free], (c.logprob - c.ref)[free], rtol=1e-9, atol=1e-12)  # k1 per token
        checked += int(free.sum())
    return Evidence(len(cases), f"{checked:,} unclamped tokens, gradients equal to float64 rounding")


def _openrlhf_as_read(log_probs, log_probs_base, mask, estimator, init_coef, use_loss):
    """OpenRLHF @ 3c3be62 as read: compute_approx_kl (float32, clamp ±10) only when init_coef > 0 (else zeros);
    experience_maker logs masked_mean(kl, mask, dim=-1) per sequence (then the batch mean); ppo_actor logs
    aggregate_loss(kl, mask), the token mean, with --algo.kl.use_loss."""
    if init_coef > 0:
        log_ratio = log_probs.float() - log_probs_base.float()
        if estimator == "k2":
            log_ratio = log_ratio**2 / 2.0
        elif estimator == "k3":
            log_ratio = (-log_ratio).exp() - 1 + log_ratio
        kl = log_ratio.clamp(min=-10, max=10)
    else:
        kl = torch.zeros_like(log_probs.float())
    m = mask.float()
    if use_loss:
        return (kl * m).sum() / m.sum()
    return ((kl * m).sum(-1) / m.sum(-1)).mean()


@claim(
    "openrlhf-logged-kl",
    wording="OpenRLHF logs kl in the reward as the batch mean of per-sequence means, with --algo.kl.use_loss as the "
    "token "
    "mean, and as 0 whenever --algo.kl.init_coef is 0.",
    domain="random batches with no empty row (batches.random_batches), k1, k2 and k3, coefficients 0.01 and 0, reward "
    "and "
    "loss; klviz.frameworks.openrlhf_kl against the code as read at OpenRLHF @ 3c3be62",
    unit="random batches",
)
@one_thread
def openrlhf_logged_kl() -> Evidence:
    cases = random_batches(1000, seed=47, empty_rows=False)
    worst = 0.0
    for i, c in enumerate(cases):
        est = ("k1", "k2", "k3")[i % 3]
        for coef in (0.01, 0.0):
            for use_loss in (False, True):
                got = float(
                    fw.openrlhf_kl(c.logprob, c.ref, c.mask, est, init_kl_coef=coef, use_kl_loss=use_loss)["logged"]
                )
                want = float(_openrlhf_as_read(c.logprob, c.ref, c.mask, est, coef, use_loss))
                err = abs(got - want) / max(1.0, abs(want))
                assert err < 1e-6, f"{est}, coef {coef}, use_loss {use_loss}: {got} vs {want} on {c.describe()}"
                worst = max(worst, err)
                if coef == 0:
                    assert got == 0.0
    return Evidence(len(cases), f"largest relative difference {worst:.2g} (float32 arithmetic, as OpenRLHF's)")


@claim(
    "minimind-grpo-logs-minus-k1",
    wording="MiniMind's train_grpo.py logs as kl_ref the token mean of log π_ref − log π, which is minus k1 (an "
    "estimate "
    "of −KL(π‖π_ref)), while the k3 it puts in the loss is never negative.",
    domain="random batches (batches.random_batches, no empty row); klviz.frameworks.minimind_grpo_kl against the "
    "logging "
    "line of trainer/train_grpo.py as read at jingyaogong/minimind @ d65ef2c",
    unit="random batches",
)
@one_thread
def minimind_grpo_minus_k1() -> Evidence:
    cases = random_batches(1000, seed=48, empty_rows=False)
    for c in cases:
        out = fw.minimind_grpo_kl(c.logprob, c.ref, c.mask)
        as_read = float(((c.ref - c.logprob) * c.mask).sum()) / max(float(c.mask.sum()), 1)
        assert abs(float(out["logged"]) - as_read) <= 1e-12 * max(1.0, abs(as_read)), c.describe()
        k1_mean = float(klviz.masked_mean(klviz.k1(c.ref - c.logprob), c.mask))
        assert abs(float(out["logged"]) + k1_mean) <= 1e-9 * max(1.0, abs(k1_mean))
        assert float(out["per_token"].min()) >= -1e-12
    return Evidence(len(cases), "logged value equal to −(token mean of k1) to float64 rounding on every batch")


@claim(
    "verl-kl-cov-logs-mean-abs-delta",
    wording="verl's kl_cov policy loss logs actor/ppo_kl as the mean of |log_prob − old_log_prob| (never negative, no "
    "KL "
    "estimate); vanilla, dppo_tv, dppo_kl, sapo and cispo log k1 with the log-ratio clamped to ±20, gspo, clip_cov, "
    "geo_mean and dro k1 unclamped.",
    domain="random batches (batches.random_batches, log-ratio scales up to 30) for every loss mode of "
    "klviz.frameworks.VERL_PPO_KL_MODES, against verl/trainer/ppo/core_algos.py as read at verl @ 1dda039",
    unit="random batches",
)
@one_thread
def verl_ppo_kl_modes() -> Evidence:
    cases = random_batches(1000, seed=49, empty_rows=False)
    clamped = {"vanilla", "dppo_tv", "dppo_kl", "sapo", "cispo"}
    for c in cases:
        neg = c.logprob - c.old
        m = c.mask
        for mode in fw.VERL_PPO_KL_MODES:
            got = float(fw.verl_ppo_kl(c.logprob, c.old, m, loss_mode=mode)["ppo_kl"])
            if mode == "kl_cov":
                vals = neg.abs()
            elif mode in clamped:
                vals = -neg.clamp(-20.0, 20.0)
            else:
                vals = -neg
            want = float((vals * m).sum() / (m.sum() + 1e-8))
            assert abs(got - want) <= 1e-7 * max(1.0, abs(want)), (mode, got, want, c.describe())
            if mode == "kl_cov":
                assert got >= 0
    return Evidence(
        len(cases), f"all {len(fw.VERL_PPO_KL_MODES)} loss modes on every batch, equal to verl's masked_mean"
    )
