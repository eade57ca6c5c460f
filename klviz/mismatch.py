"""When the sampler is not the trainer: rollout engines, their mismatch with the trainer, and corrections.

In RL for language models the tokens are sampled by a **rollout engine** (vLLM, SGLang: bf16 kernels,
its own temperature and top-p/top-k) and then rescored by the **trainer** (FSDP/Megatron). Even with
the same weights these are two policies:

- ``π_rollout``: the engine's distribution, the one that *sampled* the tokens (log-probs it reports);
- ``π_old``: the trainer's recompute of the same tokens before the update (``old_log_prob``);
- ``π_θ``: the trainer's current policy during the update; ``π_ref``: the frozen reference.

The suite's direction rule applies unchanged: tokens come from the sampler q = π_rollout, the
log-ratio is ``log r = log π_old - log π_rollout`` (target minus sampler), and k1, k2, k3 of it
estimate **KL(π_rollout ‖ π_old)**. This module provides

- engines of the tiny LM (:class:`EngineSpec`, :func:`sample_engine`): the same weights in bf16, a
  temperature the trainer does not divide out, top-p/top-k truncation with the kept mass ``S``, and
  the sampling mask, which :func:`trainer_logprobs` can replay on the trainer side;
- mismatch metrics (:func:`mismatch_metrics`): per-token and per-sequence k1/k2/k3, χ², the
  perplexity ratio, the mean ratio and NeMo-RL's ``token_mult_prob_error``;
- corrections (:func:`correction_weights`): truncated token IS (TIS), token masking (IcePop),
  sequence IS, geometric-mean rejection; :func:`corrected_estimates` applies them to a per-token
  objective;
- an exactly enumerable case (:class:`MarkovPair`, :func:`exact_correction_stats`) and the
  length trap of sequence weights (:func:`sequence_weight_moments`, :func:`log_weight_clamp_rate`).
"""

from __future__ import annotations

import itertools
import math
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from . import kernel, lm
from .devices import check_generator, single_thread
from .statistics import clustered_mean_se
from .validation import as_float_tensor, check_choice, check_positive_int, check_same_shape

Tensor = torch.Tensor

__all__ = [
    "PRECISIONS",
    "EngineSpec",
    "EngineRollouts",
    "engine_model",
    "sampling_mask",
    "engine_logprobs",
    "sample_engine",
    "trainer_logprobs",
    "replay_sampling_mask",
    "kept_mass_of",
    "mismatch_metrics",
    "batch_invariance",
    "SAFETY_BOUND",
    "CORRECTIONS",
    "correction_weights",
    "corrected_estimates",
    "MarkovPair",
    "exact_correction_stats",
    "sequence_weight_moments",
    "log_weight_clamp_rate",
]

#: Engine precisions: the dtype the engine runs the model's weights and activations in.
PRECISIONS: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
#: verl's bound on a log importance weight before ``exp`` (``rollout_corr_helper.SAFETY_BOUND``).
SAFETY_BOUND = 20.0
#: The corrections :func:`correction_weights` knows, in the order the lesson shows them.
CORRECTIONS: tuple[str, ...] = ("none", "token_tis", "token_mask", "sequence_is", "sequence_tis", "geo_reject")


# ---------------------------------------------------------------------------------------------
# engines
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class EngineSpec:
    """How a rollout engine differs from the float32 trainer that shares its weights.

    ``precision``: dtype of the engine's weights and activations (the logits are cast to float32
    before the softmax, as engines do). ``temperature``: the engine divides the logits by it; a
    trainer that forgets to do the same scores another policy. ``top_p`` (1 = off) and ``top_k``
    (0 = off): the engine samples from the renormalised truncated distribution (top-k first, then
    the smallest set of most likely tokens whose probability reaches ``top_p``, as vLLM does).
    """

    precision: str = "float32"
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0

    def __post_init__(self) -> None:
        check_choice(self.precision, "precision", tuple(PRECISIONS))
        t = self.temperature
        if not (isinstance(t, (int, float)) and math.isfinite(t) and t > 0):
            raise ValueError(f"temperature must be a positive number, got {self.temperature!r}")
        if not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be a non-negative integer (0 = off), got {self.top_k!r}")

    @property
    def truncates(self) -> bool:
        return self.top_p < 1 or self.top_k > 0

    def describe(self) -> str:
        parts = [self.precision]
        if self.temperature != 1:
            parts.append(f"T={self.temperature:g}")
        if self.top_p < 1:
            parts.append(f"top_p={self.top_p:g}")
        if self.top_k:
            parts.append(f"top_k={self.top_k}")
        return ", ".join(parts)


_ENGINE_COPIES: weakref.WeakKeyDictionary[nn.Module, dict[str, lm.TinyLM]] = weakref.WeakKeyDictionary()


def engine_model(model: lm.TinyLM, precision: str = "bfloat16", *, sync: bool = False) -> lm.TinyLM:
    """A copy of ``model`` with its weights in ``precision`` (cached per model): the engine's weights.

    The copy is made once per model and precision. A model that trains changes its weights after the
    copy was made: ``sync=True`` copies the current weights into the engine first (rounded to
    ``precision``), as a training framework syncs its weights to the rollout engine before each
    rollout. float32 engines are ``model`` itself.
    """
    if not isinstance(model, lm.TinyLM):
        raise ValueError(f"model must be a klviz.lm.TinyLM, got {type(model).__name__}")
    check_choice(precision, "precision", tuple(PRECISIONS))
    if precision == "float32":
        return model
    copies = _ENGINE_COPIES.setdefault(model, {})
    if precision not in copies:
        import copy

        copies[precision] = copy.deepcopy(model).to(PRECISIONS[precision]).eval().requires_grad_(False)
    elif sync:
        with torch.no_grad():
            for dst, src in zip(copies[precision].state_dict().values(), model.state_dict().values()):
                dst.copy_(src)
    return copies[precision]


def sampling_mask(logp: Tensor, top_p: float = 1.0, top_k: int = 0) -> Tensor:
    """Boolean mask of the tokens a top-k/top-p sampler can draw from ``logp [..., V]``.

    top-k keeps the k most likely tokens; top-p then keeps the smallest set of the most likely tokens
    whose renormalised probability reaches ``top_p`` (the most likely token is always kept).
    """
    logp = as_float_tensor(logp, "logp", allow_neg_inf=True)
    EngineSpec(top_p=top_p, top_k=top_k)  # validates both
    keep = torch.ones_like(logp, dtype=torch.bool)
    if top_k and top_k < logp.shape[-1]:
        kth = logp.topk(top_k, dim=-1).values[..., -1:]
        keep &= logp >= kth
    if top_p < 1:
        lp = torch.where(keep, logp, torch.full_like(logp, -math.inf))
        lp = lp - torch.logsumexp(lp, -1, keepdim=True)
        sorted_lp, order = lp.sort(-1, descending=True)
        cum = sorted_lp.exp().cumsum(-1)
        before = cum - sorted_lp.exp()  # mass of the tokens ranked above each one
        keep_sorted = before < top_p  # keep until the mass reaches top_p
        keep_sorted[..., 0] = True
        keep &= torch.zeros_like(keep).scatter(-1, order, keep_sorted)
    return keep


def kept_mass_of(logp: Tensor, keep: Tensor) -> Tensor:
    """``S = Σ_{x kept} p(x)``: the mass that distribution ``logp [..., V]`` puts on the kept set."""
    logp = as_float_tensor(logp, "logp", allow_neg_inf=True)
    return torch.logsumexp(torch.where(keep, logp, torch.full_like(logp, -math.inf)), -1).exp()


def engine_logprobs(logits: Tensor, spec: EngineSpec) -> tuple[Tensor, Tensor, Tensor]:
    """The engine's sampling distribution from raw logits ``[..., V]``.

    Returns ``(logp, keep, kept_mass)``: ``logp`` the log-probabilities the engine samples from
    (logits / temperature, truncated to ``keep``, renormalised; ``-inf`` outside), ``keep`` the
    sampling mask and ``kept_mass`` the mass ``S`` the tempered distribution had on it before
    renormalising.
    """
    tempered = torch.log_softmax(logits.float() / spec.temperature, -1)
    if spec.truncates:
        keep = sampling_mask(tempered, spec.top_p, spec.top_k)
    else:
        keep = torch.ones_like(tempered, dtype=torch.bool)
    mass = kept_mass_of(tempered, keep)
    logp = torch.where(keep, tempered - mass.log().unsqueeze(-1), torch.full_like(tempered, -math.inf))
    return logp, keep, mass


@dataclass
class EngineRollouts:
    """Responses sampled by an engine: ``rollouts`` (a :class:`klviz.lm.Rollouts` whose ``logprobs`` are
    the engine's reported log-probs of its own distribution, i.e. ``rollout_log_prob``), ``kept_mass``
    ``[B, T]`` (S at each sampled position; 1 without truncation) and ``keep`` ``[B, T, V]`` (the
    sampling mask at each position, all True without truncation)."""

    rollouts: lm.Rollouts
    kept_mass: Tensor
    keep: Tensor
    spec: EngineSpec = field(default_factory=EngineSpec)

    @property
    def engine_logprob(self) -> Tensor:
        return self.rollouts.logprobs

    @property
    def mask(self) -> Tensor:
        return self.rollouts.response_mask.bool()


@torch.no_grad()
def sample_engine(
    model: lm.TinyLM,
    prompts: Sequence[str],
    generator: torch.Generator,
    spec: EngineSpec | None = None,
    max_new_tokens: int = 40,
) -> EngineRollouts:
    """Sample one response per prompt with an *engine* of ``model`` (its weights, ``spec``'s numerics).

    Decoding is token by token, as an engine does (one ``[B, context]`` step per position); the
    trainer rescoring the tokens (:func:`trainer_logprobs`) does one teacher-forced forward pass over
    the whole batch. With ``EngineSpec()`` (float32, T = 1, no truncation) the engine is the trainer
    up to the arithmetic of those two ways of computing the same logits (:func:`batch_invariance`).
    Tokens come from π_rollout; the reported log-probs are those of π_rollout (what TRL obtains from
    vLLM with ``logprobs_mode="processed_logprobs"``).
    """
    spec = EngineSpec() if spec is None else spec
    if not isinstance(spec, EngineSpec):
        raise ValueError(f"spec must be a klviz.mismatch.EngineSpec, got {type(spec).__name__}")
    if not isinstance(model, lm.TinyLM):
        raise ValueError(f"model must be a klviz.lm.TinyLM, got {type(model).__name__}")
    if not isinstance(generator, torch.Generator):
        raise ValueError(
            f"generator must be a torch.Generator (klviz.make_generator(seed)), got {type(generator).__name__}"
        )
    if isinstance(prompts, str) or len(prompts) == 0:
        raise ValueError("prompts must be a non-empty list of strings")
    max_new = check_positive_int(max_new_tokens, "max_new_tokens")
    eng = engine_model(model, spec.precision)
    dev = next(eng.parameters()).device
    check_generator(generator, dev)
    encoded = [lm.encode(p) for p in prompts]
    bsz, V, ctx = len(encoded), len(lm.VOCAB), eng.context
    plen = torch.tensor([len(e) for e in encoded], dtype=torch.long)
    total = 1 + int(plen.max()) + max_new
    ids = torch.full((bsz, total), lm.PAD_ID, dtype=torch.long)
    ids[:, 0] = lm.BOS_ID
    for b, e in enumerate(encoded):
        ids[b, 1 : 1 + len(e)] = torch.tensor(e, dtype=torch.long)
    logprobs, resp = torch.zeros(bsz, total), torch.zeros(bsz, total)
    kept = torch.ones(bsz, total)
    keep_all = torch.ones(bsz, total, V, dtype=torch.bool)
    done = torch.zeros(bsz, dtype=torch.bool)
    finished = torch.zeros(bsz, dtype=torch.bool)
    n_new = torch.zeros(bsz, dtype=torch.long)
    with single_thread():
        padded = nn.functional.pad(ids, (ctx, 0), value=lm.PAD_ID)
        for t in range(1, total):
            sampling = ~(t <= plen) & ~done
            if not bool(sampling.any()):
                if bool((t > plen).all()):
                    break
                continue
            logits = eng.window_logits(padded[:, t : t + ctx].to(dev)).float()
            logp, keep, mass = engine_logprobs(logits, spec)
            tok = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(1).cpu()
            s = sampling
            ids[s, t] = tok[s]
            padded[:, t + ctx] = ids[:, t]
            logprobs[s, t] = logp.gather(1, tok[:, None].to(dev)).squeeze(1).cpu()[s]
            kept[s, t] = mass.cpu()[s]
            keep_all[s, t] = keep.cpu()[s]
            resp[s, t] = 1.0
            n_new[s] += 1
            hit = s & (tok == lm.EOS_ID)
            finished |= hit
            done |= hit | (s & (n_new >= max_new))
            if bool((t > plen).all()) and bool(done.all()):
                total = t + 1
                break
    ids, logprobs, resp = ids[:, :total], logprobs[:, :total], resp[:, :total]
    ro = lm.Rollouts(ids, (ids != lm.PAD_ID).float(), resp, logprobs, plen, n_new, finished, prompts=list(prompts))
    return EngineRollouts(ro, kept[:, :total], keep_all[:, :total], spec)


def trainer_logprobs(
    model: lm.TinyLM, batch: EngineRollouts | lm.Rollouts, *, temperature: float = 1.0, replay_mask: bool = False
) -> Tensor:
    """``[B, T]``: the trainer's log-probs of the sampled tokens (``old_log_prob``, π_old), 0 outside the mask.

    One float32 teacher-forced forward pass of ``model``, logits divided by ``temperature`` (pass the
    engine's temperature: a trainer that leaves it at 1 scores the untempered policy). With
    ``replay_mask`` the engine's sampling mask is applied and the kept tokens renormalised
    (DeepSeek-V3.2's "keep sampling mask"): the trainer then scores the same truncated policy the
    engine sampled from, and ``exp(logp_train - logp_engine)`` no longer carries the kept mass.
    """
    if not (isinstance(temperature, (int, float)) and temperature > 0):
        raise ValueError(f"temperature must be a positive number, got {temperature!r}")
    ro = batch.rollouts if isinstance(batch, EngineRollouts) else batch
    if not isinstance(ro, lm.Rollouts):
        raise ValueError(f"batch must be EngineRollouts or klviz.lm.Rollouts, got {type(batch).__name__}")
    with torch.no_grad():
        full = lm.next_token_logprobs(model, ro)
        if temperature != 1:
            full = torch.log_softmax(full / temperature, -1)
        if replay_mask:
            if not isinstance(batch, EngineRollouts):
                raise ValueError("replay_mask needs EngineRollouts (they carry the engine's sampling mask)")
            full = replay_sampling_mask(full, batch.keep.to(full.device))
        tok = full.gather(-1, ro.input_ids.to(full.device).unsqueeze(-1)).squeeze(-1)
    return torch.where(ro.response_mask.bool(), tok, torch.zeros_like(tok))


def replay_sampling_mask(logp: Tensor, keep: Tensor) -> Tensor:
    """Log-probabilities ``logp [..., V]`` restricted to the sampling mask ``keep`` and renormalised:
    the truncated policy the engine sampled from, scored with the trainer's numbers (DeepSeek-V3.2's
    "keep sampling mask"; ``-inf`` outside the mask). Differentiable: the lab trains through it."""
    masked = logp.masked_fill(~keep, -math.inf)
    return masked - torch.logsumexp(masked, -1, keepdim=True)


def batch_invariance(model: lm.TinyLM, rollouts: lm.Rollouts, precision: str = "float32") -> dict[str, float]:
    """How much the logits of the same tokens depend on how they are batched, on this machine.

    Compares the log-probs of ``rollouts``' response tokens computed (a) in one forward pass of the
    whole batch, (b) row by row (batch of one), (c) position by position as a decoder does (one
    ``[B, context]`` window per step). Returns the largest absolute differences (nats); 0.0 means the
    arithmetic here is batch- and chunk-invariant for this model and ``precision``.
    """
    eng = engine_model(model, precision)
    ids, mask = rollouts.input_ids, rollouts.response_mask.bool()
    with torch.no_grad(), single_thread():
        whole = torch.log_softmax(eng(ids[:, :-1]).float(), -1)
        rows = torch.cat([torch.log_softmax(eng(ids[b : b + 1, :-1]).float(), -1) for b in range(ids.shape[0])])
        padded = nn.functional.pad(ids, (eng.context - 1, 0), value=lm.PAD_ID)
        steps = torch.stack(
            [
                torch.log_softmax(eng.window_logits(padded[:, t : t + eng.context]).float(), -1)
                for t in range(ids.shape[1] - 1)
            ],
            1,
        )
    tok = ids[:, 1:].unsqueeze(-1)
    m = mask[:, 1:]
    pick = lambda x: x.gather(-1, tok).squeeze(-1)[m]  # noqa: E731
    w, r, s = pick(whole), pick(rows), pick(steps)
    return {
        "batch_vs_row": float((w - r).abs().max()),
        "batch_vs_decode": float((w - s).abs().max()),
        "tokens": int(m.sum()),
    }


# ---------------------------------------------------------------------------------------------
# metrics
# ---------------------------------------------------------------------------------------------
def _checked_pair(train_logprob: Tensor, engine_logprob: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor]:
    tr = as_float_tensor(train_logprob, "train_logprob", check_finite=False).double()
    en = as_float_tensor(engine_logprob, "engine_logprob", check_finite=False).double()
    check_same_shape(tr, en, "train_logprob", "engine_logprob")
    if tr.dim() != 2:
        raise ValueError(f"train_logprob must be [batch, tokens], got shape {tuple(tr.shape)}")
    m = torch.ones_like(tr, dtype=torch.bool) if mask is None else torch.as_tensor(mask).bool()
    if m.shape != tr.shape:
        raise ValueError(f"mask has shape {tuple(m.shape)} but train_logprob has shape {tuple(tr.shape)}")
    if not bool(m.any()):
        raise ValueError("mask selects no token")
    for name, t in (("train_logprob", tr), ("engine_logprob", en)):
        if not bool(torch.isfinite(t[m]).all()):
            raise ValueError(f"{name} holds NaN or inf values at masked positions")
    return tr - en, m


def _seq_stats(per_token: Tensor, m: Tensor) -> dict[str, Tensor]:
    z = torch.where(m, per_token, torch.zeros_like(per_token))
    n = m.sum(-1).clamp(min=1)
    rows = m.any(-1)
    mx = torch.where(m, per_token, torch.full_like(per_token, -math.inf)).max(-1).values
    return {"sum": z.sum(-1)[rows], "mean": (z.sum(-1) / n)[rows], "max": mx[rows]}


def mismatch_metrics(train_logprob: Tensor, engine_logprob: Tensor, mask: Tensor | None = None) -> dict[str, float]:
    """Engine–trainer mismatch of one batch, from the log-probs of the engine's sampled tokens.

    Tokens were sampled by the engine (q = π_rollout); ``log r = train_logprob - engine_logprob``.
    Returned (token means over ``mask``, with responses as the independent units for ``*_se``):

    - ``k1``, ``k2``, ``k3`` (and ``k1_se``, ``k3_se``): k1 and k3 estimate KL(π_rollout ‖ π_old) per
      token (verl's ``rollout_corr/kl`` and ``k3_kl``); ``seq_sum_kN``, ``seq_mean_kN``, ``seq_max_kN``:
      batch means of the per-sequence sum, mean and max (verl's rejection statistics);
    - ``mean_ratio`` (± ``mean_ratio_se``): token mean of r = π_old/π_rollout. E_q[r] is the mass π_old
      puts where the engine can sample: 1 unless the engine truncated the support;
    - ``chi2_token`` = mean(r²) − 1 and ``chi2_seq`` = mean(W²) − 1 with W = Π r per response:
      estimates of χ²(π_old ‖ π_rollout) per token and per sequence (verl's names);
    - ``ppl_ratio``: the batch mean over responses of exp(mean_t(log π_rollout − log π_old)), each
      response's training-over-rollout perplexity ratio averaged as verl's ``compute_offpolicy_metrics``
      averages it (``rollout_corr/ppl_ratio``; > 1: the trainer is less sure than the engine;
      :func:`klviz.frameworks.verl_offpolicy_metrics` is verl's whole formula);
    - ``token_mult_prob_error``: mean exp(|log r|), NeMo-RL's metric (≥ 1; 1 only without mismatch);
    - ``abs_diff_mean``, ``abs_diff_max``: mean and max |log r| (TRL's ``sampling_logp_difference``).
    """
    log_r, m = _checked_pair(train_logprob, engine_logprob, mask)
    lr = torch.where(m, log_r, torch.zeros_like(log_r))
    out: dict[str, float] = {}
    vals = kernel.estimates(lr)
    for name, v in vals.items():
        mean, se = clustered_mean_se(v, m)
        out[name], out[f"{name}_se"] = mean, se
        for agg, s in _seq_stats(v, m).items():
            if agg == "max" and name == "k1":
                continue
            out[f"seq_{agg}_{name}"] = float(s.mean())
    r = torch.exp(lr.clamp(-SAFETY_BOUND, SAFETY_BOUND))
    out["mean_ratio"], out["mean_ratio_se"] = clustered_mean_se(r, m)
    out["chi2_token"] = float(r[m].square().mean()) - 1.0
    log_w = lr.sum(-1)[m.any(-1)]
    out["chi2_seq"] = float(torch.exp(2 * log_w.clamp(-SAFETY_BOUND, SAFETY_BOUND)).mean()) - 1.0
    out["ppl_ratio"] = float(torch.exp(_seq_stats(kernel.k1(lr), m)["mean"].double()).mean())
    out["token_mult_prob_error"] = float(torch.exp(lr.abs())[m].mean())
    out["abs_diff_mean"], out["abs_diff_max"] = float(lr.abs()[m].mean()), float(lr.abs()[m].max())
    out["tokens"], out["sequences"] = int(m.sum()), int(m.any(-1).sum())
    return out


# ---------------------------------------------------------------------------------------------
# corrections
# ---------------------------------------------------------------------------------------------
def correction_weights(
    log_r: Tensor,
    mask: Tensor,
    method: str,
    *,
    cap: float = 2.0,
    band: tuple[float, float] = (0.5, 2.0),
    log_clamp: float = SAFETY_BOUND,
) -> Tensor:
    """Per-token weights ``[B, T]`` that correct tokens sampled by the engine towards the trainer.

    ``log_r = log π_train − log π_rollout`` of the sampled tokens (tokens from π_rollout); ``method``:

    - ``"none"``: 1 (assume π_old = π_rollout);
    - ``"token_tis"``: min(r_t, ``cap``), truncated token-level IS (verl ``rollout_is="token"``, TRL
      ``token_truncate``, OpenRLHF/NeMo-RL ``tis``);
    - ``"token_mask"``: r_t where ``band[0] ≤ r_t ≤ band[1]``, else 0 (IcePop; TRL ``token_mask``);
    - ``"sequence_is"``: W = Π_t r_t for every token of the response, its log clamped to ±``log_clamp``
      (verl's safety bound); ``"sequence_tis"``: min(W, ``cap``) (TRL ``sequence_truncate``);
    - ``"geo_reject"``: r_t, times 0 for every token of a response whose geometric-mean ratio
      exp(mean_t log r_t) falls outside ``band`` (OpenRLHF/NeMo-RL ``seq-mask-tis``).

    Positions outside ``mask`` get weight 0.
    """
    check_choice(method, "method", CORRECTIONS)
    lr = as_float_tensor(log_r, "log_r", check_finite=False)
    m = torch.as_tensor(mask).bool()
    if m.shape != lr.shape:
        raise ValueError(f"mask has shape {tuple(m.shape)} but log_r has shape {tuple(lr.shape)}")
    if not (isinstance(cap, (int, float)) and cap > 0):
        raise ValueError(f"cap must be a positive number, got {cap!r}")
    lo, hi = band
    if not (0 <= lo < hi):
        raise ValueError(f"band must be (low, high) with 0 <= low < high, got {band!r}")
    lr = torch.where(m, lr, torch.zeros_like(lr))
    r = torch.exp(lr.clamp(-log_clamp, log_clamp))
    if method == "none":
        w = torch.ones_like(lr)
    elif method == "token_tis":
        w = r.clamp(max=cap)
    elif method == "token_mask":
        w = r * ((r >= lo) & (r <= hi))
    elif method in ("sequence_is", "sequence_tis"):
        w_seq = torch.exp(lr.sum(-1, keepdim=True).clamp(-log_clamp, log_clamp))
        if method == "sequence_tis":
            w_seq = w_seq.clamp(max=cap)
        w = w_seq.expand_as(lr)
    else:
        geo = torch.exp(lr.sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp(min=1))
        w = r * ((geo >= lo) & (geo <= hi))
    return torch.where(m, w, torch.zeros_like(w))


def corrected_estimates(
    values: Tensor,
    log_r: Tensor,
    mask: Tensor,
    method: str,
    *,
    cap: float = 2.0,
    band: tuple[float, float] = (0.5, 2.0),
    log_clamp: float = SAFETY_BOUND,
) -> Tensor:
    """Per-response estimates ``[B]`` of J = E_{π_train}[Σ_t g_t] from responses sampled by the engine.

    ``values [B, T]`` holds the per-token g_t of the sampled tokens; each response contributes
    Σ_t w_t g_t with the weights of :func:`correction_weights`. Their mean over responses is the
    batch estimate; "none" estimates E_{π_rollout}[Σ g] instead, the mistake of assuming
    π_old = π_rollout. (The policy gradient is the same sum with g_t = A · ∇ log π(y_t).)
    """
    v = as_float_tensor(values, "values", check_finite=False)
    w = correction_weights(log_r, mask, method, cap=cap, band=band, log_clamp=log_clamp)
    if v.shape != w.shape:
        raise ValueError(f"values has shape {tuple(v.shape)} but log_r has shape {tuple(w.shape)}")
    return torch.where(w != 0, w * v, torch.zeros_like(v)).sum(-1)


# ---------------------------------------------------------------------------------------------
# an exactly enumerable case
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MarkovPair:
    """A trainer and an engine over a ``V``-token vocabulary, each a Markov chain: the next token's
    distribution depends on the previous token (row ``V`` of each ``[V + 1, V]`` matrix is the start).

    Small enough to enumerate all ``V^T`` responses, so the mean and variance of every correction are
    exact sums, not samples. ``g [V]`` is the per-token payoff of the objective J = E_train[Σ_t g(y_t)].
    """

    train_logp: Tensor
    engine_logp: Tensor
    g: Tensor

    @classmethod
    def make(cls, kind: str = "noise", strength: float = 0.3, vocab: int = 3, seed: int = 0) -> MarkovPair:
        """A random trainer chain and an engine that differs by ``kind``: ``"noise"`` (logit noise of
        std ``strength``, like rounding), ``"temperature"`` (logits / ``strength``) or ``"top_p"``
        (truncation at ``top_p = strength``, renormalised)."""
        check_choice(kind, "kind", ("noise", "temperature", "top_p"))
        vocab = check_positive_int(vocab, "vocab")
        g = torch.Generator().manual_seed(int(seed))
        logits = 1.5 * torch.randn(vocab + 1, vocab, generator=g, dtype=torch.float64)
        train = torch.log_softmax(logits, -1)
        if kind == "noise":
            noise = torch.randn(vocab + 1, vocab, generator=g, dtype=torch.float64)
            eng = torch.log_softmax(logits + strength * noise, -1)
        elif kind == "temperature":
            eng = torch.log_softmax(logits / strength, -1)
        else:
            keep = sampling_mask(train, top_p=strength)
            log_s = kept_mass_of(train, keep).log().unsqueeze(-1)
            eng = torch.where(keep, train - log_s, torch.full_like(train, -math.inf))
        payoff = torch.linspace(0.0, 1.0, vocab, dtype=torch.float64)
        return cls(train, eng, payoff)

    @property
    def vocab(self) -> int:
        return int(self.train_logp.shape[1])

    def enumerate(self, length: int) -> tuple[Tensor, Tensor, Tensor]:
        """All responses of ``length`` tokens: per-token ``(train_logp, engine_logp, g)``, each ``[V^T, T]``."""
        T = check_positive_int(length, "length")
        V = self.vocab
        seqs = torch.tensor(list(itertools.product(range(V), repeat=T)), dtype=torch.long)
        prev = torch.cat([torch.full((seqs.shape[0], 1), V, dtype=torch.long), seqs[:, :-1]], 1)
        return self.train_logp[prev, seqs], self.engine_logp[prev, seqs], self.g[seqs]


def exact_correction_stats(
    pair: MarkovPair,
    length: int,
    method: str,
    *,
    cap: float = 2.0,
    band: tuple[float, float] = (0.5, 2.0),
    log_clamp: float = SAFETY_BOUND,
) -> dict[str, float]:
    """Exact bias and single-response variance of a correction on every response of ``length`` tokens.

    Responses are drawn from the engine; the estimate of J = E_train[Σ_t g(y_t)] is
    :func:`corrected_estimates`. Sums over all V^T responses weighted by their engine probability
    (responses the engine cannot produce have weight 0). Returns ``truth``, ``mean``, ``bias``,
    ``std`` and ``kept`` (the engine probability of a response with any non-zero weight).
    """
    tr, en, g = pair.enumerate(length)
    q = en.sum(-1).exp()
    p = tr.sum(-1).exp()
    truth = float((p * g.sum(-1)).sum())
    support = q > 0
    lr = torch.where(support[:, None], tr - en, torch.zeros_like(tr))
    m = support[:, None].expand_as(lr)
    est = corrected_estimates(g, lr, m, method, cap=cap, band=band, log_clamp=log_clamp)
    mean = float((q * est).sum())
    var = float((q * est.square()).sum()) - mean**2
    w = correction_weights(lr, m, method, cap=cap, band=band, log_clamp=log_clamp)
    kept = float((q * (w != 0).any(-1)).sum())
    return {"truth": truth, "mean": mean, "bias": mean - truth, "std": math.sqrt(max(var, 0.0)), "kept": kept}


def sequence_weight_moments(pair: MarkovPair, length: int) -> dict[str, float]:
    """Exact E_engine[W] and E_engine[W²] of the sequence weight W = Π_t π_train/π_rollout, any length.

    Computed by transfer matrices (no enumeration): E[W] = mass the trainer puts on responses the
    engine can produce (1 without truncation); Var W = E[W²] − E[W]², which grows like (1 + χ²)^T.
    Also ``kl_seq``: KL(π_rollout ‖ π_train) over whole responses.
    """
    T = check_positive_int(length, "length")
    tr, en = pair.train_logp, pair.engine_logp
    ok = torch.isfinite(en)
    m1 = torch.where(ok, tr.exp(), torch.zeros_like(tr))  # q · (p/q)
    m2 = torch.where(ok, torch.exp(2 * tr - en), torch.zeros_like(tr))  # q · (p/q)²
    kl_t = torch.where(ok, en.exp() * (en - tr), torch.zeros_like(tr))  # q log q/p, per transition
    V = pair.vocab
    q = torch.where(ok, en.exp(), torch.zeros_like(en))
    start = torch.zeros(V + 1, dtype=torch.float64)
    start[V] = 1.0

    def step(state: Tensor, mat: Tensor) -> Tensor:  # [V + 1] over the previous token -> next
        return torch.cat([state @ mat, torch.zeros(1, dtype=torch.float64)])

    s1, s2, sq, kl = start, start, start, 0.0
    row_kl = kl_t.sum(-1)
    for _ in range(T):
        kl += float(sq @ row_kl)
        s1, s2, sq = step(s1, m1), step(s2, m2), step(sq, q)
    ew, ew2 = float(s1.sum()), float(s2.sum())
    return {"E_W": ew, "E_W2": ew2, "var_W": ew2 - ew**2, "kl_seq": kl}


def log_weight_clamp_rate(
    mean_per_token: float, std_per_token: float, length: int | Tensor, bound: float = SAFETY_BOUND
) -> Tensor:
    """P(|log W| > ``bound``) for log W = Σ_t log r_t with i.i.d. per-token moments (normal approximation).

    ``mean_per_token`` is E[log r] = −KL(π_rollout ‖ π_train) per token, ``std_per_token`` its std;
    the clamp of a log sequence weight at ±20 (verl's safety bound) starts to act on typical
    responses once T · KL approaches 20.
    """
    T = torch.as_tensor(length, dtype=torch.float64)
    if bool((T <= 0).any()):
        raise ValueError("length must be positive")
    if std_per_token < 0:
        raise ValueError(f"std_per_token must be non-negative, got {std_per_token!r}")
    mu, sd = mean_per_token * T, max(std_per_token, 1e-300) * T.sqrt()
    return torch.special.ndtr((mu - bound) / sd) + torch.special.ndtr((-bound - mu) / sd)
