"""Claims first stated in lesson 08 (When the sampler is not the trainer)."""

from __future__ import annotations

import math

import numpy as np
import torch

from klviz import frameworks as fw
from klviz import mismatch as mm

from .batches import one_thread, random_batches
from .families import token_pairs
from .registry import Evidence, claim


def _truncations(n: int, seed: int):  # type: ignore[no-untyped-def]
    """(token pair, top_p, top_k) cases: the trainer's distribution is the pair's p; the engine truncates it."""
    rng = np.random.default_rng(seed)
    out = []
    for c in token_pairs(n, seed=seed):
        top_p = float(rng.uniform(0.3, 0.99))
        top_k = int(rng.integers(0, 3)) * int(rng.integers(1, max(2, min(c.vocab, 50))))
        out.append((c, top_p, top_k))
    return out


@claim(
    "truncation-puts-kept-mass-in-every-ratio",
    wording="With top-p/top-k truncation, every token the engine can sample has π_train/π_engine = S, the kept mass, "
    "so the mean ratio is S, one minus the mass cut away (below 1 whenever a token the trainer gives weight is cut); "
    "replaying the sampling mask on the trainer's side makes every ratio 1 exactly.",
    domain="random token distributions (the p of families.token_pairs, vocabularies 2 to 50,257) as the trainer's, "
    "truncated by "
    "top-p uniform in [0.3, 0.99] and top-k 0 (off) to 49 (klviz.mismatch.sampling_mask), exact sums in float64",
    unit="random token distributions",
)
@one_thread
def kept_mass_in_every_ratio() -> Evidence:
    cases = _truncations(1000, seed=81)
    smallest = math.inf
    for c, top_p, top_k in cases:
        train = c.p_logp
        keep = mm.sampling_mask(train, top_p=top_p, top_k=top_k)
        s = float(mm.kept_mass_of(train, keep))
        engine = torch.where(keep, train - math.log(s), torch.full_like(train, -math.inf))
        log_r = (train - engine)[keep]
        assert torch.allclose(log_r, torch.full_like(log_r, math.log(s)), rtol=0, atol=1e-12), c.describe()
        mean_ratio = float((engine[keep].exp() * log_r.exp()).sum())
        assert abs(mean_ratio - s) < 1e-12
        cut = float(train.double().exp()[~keep].sum())  # the trainer's mass the engine can no longer sample
        assert abs(s - (1.0 - cut)) < 1e-12 and (s < 1.0 or cut < 1e-15), c.describe()
        replayed = mm.replay_sampling_mask(train, keep)
        assert torch.allclose(replayed[keep], engine[keep], atol=1e-12)
        smallest = min(smallest, s)
    return Evidence(len(cases), f"kept masses from {smallest:.3g} up; every ratio equal to S to 1e-12")


@claim(
    "mean-ratio-test-sees-only-lost-support",
    wording="With tokens from the engine, E[π_train/π_engine] is the mass the trainer puts where the engine can "
    "sample: 1 "
    "for any mismatch on a shared support (rounding, temperature), below 1 only when the engine lost support; and "
    "χ² = E[r²] − 1 can go negative only then.",
    domain="random token pairs (families.token_pairs, vocabularies 2 to 50,257, all five kinds) as (engine, trainer), "
    "and "
    "the same trainers against their own top-p truncations (top-p 0.3-0.99); exact sums in float64",
    unit="random token pairs",
)
@one_thread
def mean_ratio_test() -> Evidence:
    cases = _truncations(1000, seed=82)
    chi2_min = math.inf
    for c, top_p, _top_k in cases:
        q, lr = c.q, c.log_r  # engine q, trainer p, r = p/q
        mean_r = float((q * lr.exp()).sum())
        chi2 = float((q * (2 * lr).exp()).sum()) - 1
        assert abs(mean_r - 1) < 1e-9 and chi2 >= -1e-9, c.describe()
        chi2_min = min(chi2_min, chi2)
        keep = mm.sampling_mask(c.p_logp, top_p=top_p)
        s = float(mm.kept_mass_of(c.p_logp, keep))
        if s < 1 - 1e-12:
            eng = torch.where(keep, c.p_logp - math.log(s), torch.full_like(c.p_logp, -math.inf))
            r = (c.p_logp - eng)[keep].exp()
            assert float((eng[keep].exp() * r).sum()) < 1 and float((eng[keep].exp() * r * r).sum()) - 1 < 0
    return Evidence(len(cases), f"on shared supports the mean ratio was 1 and χ² ≥ {chi2_min:.2g}")


@claim(
    "truncation-caps-act-only-above-log-c",
    wording="A truncated-IS cap C (verl's rollout_is_threshold, TRL's vllm_importance_sampling_clip_max) changes a "
    "token's "
    "weight only where log r > log C: it never acts on log r < 0; a masking band [1/C, C] (IcePop) acts on both sides.",
    domain="10,000 random log-ratios uniform on [−3, 3] in [batch, length] layout, caps C in {1.2, 2, 3}, "
    "klviz.mismatch.correction_weights in float64",
    unit="random log-ratios",
)
@one_thread
def caps_only_above() -> Evidence:
    rng = np.random.default_rng(83)
    log_r = torch.from_numpy(rng.uniform(-3, 3, (100, 100)))
    mask = torch.ones_like(log_r, dtype=torch.bool)
    for cap in (1.2, 2.0, 3.0):
        w = mm.correction_weights(log_r, mask, "token_tis", cap=cap)
        changed = ~torch.isclose(w, log_r.exp(), rtol=1e-12, atol=0)
        assert torch.equal(changed, log_r > math.log(cap)), f"cap {cap}"
        band = mm.correction_weights(log_r, mask, "token_mask", band=(1 / cap, cap))
        dropped = band == 0
        assert torch.equal(dropped, (log_r > math.log(cap)) | (log_r < -math.log(cap))), f"band at {cap}"
    return Evidence(log_r.numel(), "caps changed exactly the tokens above log C; bands dropped both tails")


@claim(
    "sequence-is-unbiased-token-weights-are-not",
    wording="Weighting a whole response by W = Π_t r_t (sequence IS) gives the trainer's expectation exactly, from the "
    "engine's responses; per-token weights (token IS, TIS) leave a bias once a response has two tokens or more, "
    "because "
    "they do not correct the prefix; and the variance of W grows with the length.",
    domain="Markov engine-trainer pairs (klviz.mismatch.MarkovPair: 3 tokens; logit noise 0.05-1, temperature 0.5-2; "
    "1,000 "
    "seeds), responses of length 1-5 enumerated exactly; untruncated weights",
    unit="Markov pairs",
)
@one_thread
def sequence_is_exact() -> Evidence:
    rng = np.random.default_rng(84)
    smallest_token_bias = math.inf
    for i in range(1000):
        kind = "noise" if i % 2 == 0 else "temperature"
        strength = float(np.exp(rng.uniform(np.log(0.05), 0.0))) if kind == "noise" else float(rng.uniform(0.5, 2.0))
        pair = mm.MarkovPair.make(kind, strength, vocab=3, seed=int(rng.integers(1 << 30)))
        var_prev = 0.0
        for T in range(1, 6):
            seq = mm.exact_correction_stats(pair, T, "sequence_is", cap=1e30)
            assert abs(seq["bias"]) < 1e-9 * max(1.0, abs(seq["mean"])), (kind, strength, T)
            tok = mm.exact_correction_stats(pair, T, "token_tis", cap=1e30)  # untruncated token IS
            if T == 1:
                assert abs(tok["bias"]) < 1e-9 * max(1.0, abs(tok["mean"]))
            else:
                smallest_token_bias = min(smallest_token_bias, abs(tok["bias"]))
            var_w = mm.sequence_weight_moments(pair, T)["var_W"]
            assert var_w > var_prev, (kind, strength, T, var_w, var_prev)
            var_prev = var_w
    assert smallest_token_bias > 0
    return Evidence(
        1000, f"sequence IS exact at every length; the smallest token-IS bias at length ≥ 2: {smallest_token_bias:.2g}"
    )


def _verl_ppl_ratio_as_read(old_log_prob, rollout_log_prob, response_mask):  # type: ignore[no-untyped-def]
    """verl @ 1dda039, rollout_corr_helper.compute_offpolicy_metrics, the ppl_ratio lines as read."""

    def masked_mean(values, mask, axis):  # type: ignore[no-untyped-def]
        return (torch.where(mask.bool(), values, 0.0) * mask).sum(axis) / (mask.sum(axis) + 1e-8)

    mean_log_prob_training = masked_mean(old_log_prob, response_mask, -1)
    mean_log_prob_rollout = masked_mean(rollout_log_prob, response_mask, -1)
    log_ppl_diff = mean_log_prob_rollout - mean_log_prob_training
    return torch.exp(log_ppl_diff).mean().item(), log_ppl_diff.mean().item()


@claim(
    "verl-ppl-ratio-is-a-mean-of-ratios",
    wording="verl's rollout_corr/ppl_ratio is the batch mean of each response's perplexity ratio, exp(mean log "
    "π_rollout − "
    "mean log π_old), never below the exp of their mean log (Jensen); klviz.mismatch.mismatch_metrics reports the "
    "same.",
    domain="random batches (batches.random_batches, log-ratio scales 1e-4 to 30 between the trainer and the engine), "
    "klviz.frameworks.verl_offpolicy_metrics against the code as read, and mismatch_metrics on batches without empty "
    "rows",
    unit="random batches",
)
@one_thread
def verl_ppl_ratio() -> Evidence:
    cases = random_batches(1000, seed=85)
    gap_max = 0.0
    for c in cases:
        got = fw.verl_offpolicy_metrics(c.old, c.logprob, c.mask)
        want, mean_log = _verl_ppl_ratio_as_read(c.old, c.logprob, c.mask)
        if not (math.isfinite(want) and math.isfinite(got["ppl_ratio"])):
            assert math.isinf(want) and math.isinf(got["ppl_ratio"]), c.describe()
            continue
        assert abs(got["ppl_ratio"] - want) <= 1e-12 * max(1.0, abs(want)), c.describe()
        assert want >= math.exp(mean_log) * (1 - 1e-12)
        if bool((c.mask.sum(-1) > 0).all()):
            ours = mm.mismatch_metrics(c.old, c.logprob, c.mask.bool())["ppl_ratio"]
            assert abs(ours - want) <= 1e-6 * max(1.0, abs(want)), c.describe()
        gap_max = max(gap_max, want / math.exp(mean_log) - 1)
    return Evidence(
        len(cases), f"the mean of ratios exceeded the exp of the mean log by a factor of up to {1 + gap_max:.3g}"
    )
