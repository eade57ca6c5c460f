"""A mini RLHF lab: train a tiny language model with a KL penalty placed in the reward or in the loss.

One training step, REINFORCE/GRPO-style, on a batch of prompts each repeated ``group_size`` times:

1. sample one response per row from the current policy (it becomes pi_old for this batch);
2. score the responses with a programmatic reward R (:func:`klviz.lm.reward`: +1 per positive word,
   -1 per negative word, -1 if the response never ends);
3. compute per-token log-probabilities of the policy and of the frozen reference pi_ref on the
   sampled tokens, and the full next-token distributions of both (for the exact KL);
4. take ``epochs`` gradient steps on that batch (more than one makes the later ones off-policy),
   optionally stopping early when PPO's ``approx_kl`` (masked mean of ½(log pi - log pi_old)²,
   MiniMind's choice) exceeds ``early_stop_kl``.

The KL term is one of :data:`PLACEMENTS`:

* ``"k1 in reward"``: per-token reward -beta · k1_t, summed **to go** (the return of token t is
  R - beta · sum_{u>=t} k1_u); the gradient of the sequence KL in full (lesson 05, section 5);
* ``"k1 in loss"``, ``"k2 in loss"``, ``"k3 in loss"``, ``"k3+ in loss"``: beta · sum_t kl_penalty(log pi,
  log pi_ref, kind) added to the loss (verl's ``kl_penalty`` kinds), the advantage carries R only;
* ``"k3·ρ in loss"``: k3 (unclamped, as TRL computes it) multiplied by rho = pi / sg(pi_old), the
  gradient flowing through rho (DeepSeek-V3.2, TRL ``use_bias_correction_kl``);
* ``"none"``: no KL term (the baseline every penalty is compared with).

The advantage is the return minus the mean return of the row's group (a leave-in baseline, as in
GRPO without the division by the standard deviation, so the objective stays E[R] - beta · KL).
Per-token terms are summed over the response (each row's sequence objective) and averaged over rows.

Everything the lab reports is computed from the same batch, *before* the update: the reward, the
**true KL(pi || pi_ref)** (the exact next-token KL summed along each sampled response, averaged: an
unbiased estimate of the sequence KL with no sampling noise inside each position), the KL the chosen
estimator **reports** (the batch mean of its per-sequence sum; k1 for the reward placement), and the
mean per-token entropy of the policy.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch

from . import kernel, lm
from . import mismatch as mm
from .devices import make_generator, resolve_device, single_thread
from .divergences import exact_kl
from .estimators import k3, kl_penalty
from .palette import ThemedColours
from .usage import EstimatorUse, parse_use
from .validation import check_choice, check_positive_int

__all__ = [
    "PLACEMENTS",
    "ENGINES",
    "LAB_CORRECTIONS",
    "LabConfig",
    "TrainingHistory",
    "TrainingRun",
    "train_policy",
    "run_placements",
    "METRICS",
]

#: The uses of an estimator the lab trains with (:mod:`klviz.usage`). In the loss they are verl's
#: ``kl_penalty`` kinds, its clamps included; k3·ρ is TRL's unclamped k3 times rho.
LAB_USES: tuple[EstimatorUse, ...] = (
    EstimatorUse("k1", "reward"),
    EstimatorUse("k1"),
    EstimatorUse("k2"),
    EstimatorUse("k3"),
    EstimatorUse("k3", weighting="rho"),
    EstimatorUse("k3", weighting="straight-through"),
)
#: The lab's KL choices by label, and "none" (no KL term) last.
PLACEMENTS: tuple[str, ...] = (*(use.label for use in LAB_USES), "none")


def _verl_kind(use: EstimatorUse) -> str:
    """verl's ``kl_penalty`` kind for a use in the loss: the estimator, with "+" for straight-through."""
    return use.estimator + ("+" if use.weighting == "straight-through" else "")


#: The rollout engines the lab can sample with (lesson 08). "trainer": the policy samples itself, the
#: ideal every other lesson assumes; the others are an engine of the same weights that differs the way
#: real engines do, while the trainer recomputes log-probs in float32 at temperature 1 on the full
#: vocabulary. Its weights are synced to the engine before every rollout.
ENGINES: dict[str, mm.EngineSpec | None] = {
    "trainer": None,
    "bf16": mm.EngineSpec(precision="bfloat16"),
    "T=0.7": mm.EngineSpec(temperature=0.7),
    "top-p 0.8": mm.EngineSpec(top_p=0.8),
}
#: The corrections the lab can apply to the policy-gradient term (:func:`klviz.mismatch.correction_weights`,
#: default cap 2 and band [0.5, 2]). As in verl (``compute_policy_loss_vanilla`` in
#: ``verl/trainer/ppo/core_algos.py``: ``pg_losses = pg_losses * rollout_is_weights``) the weights multiply
#: the clipped per-token policy loss only; the KL term is left as it is.
#: ``"keep_mask"`` is of another kind: the trainer replays the engine's top-p/top-k sampling mask on
#: π_old and π_θ (DeepSeek-V3.2's "keep sampling mask"), so that both score the truncated policy the
#: engine sampled from (:func:`klviz.mismatch.trainer_logprobs` with ``replay_mask``).
LAB_CORRECTIONS: tuple[str, ...] = ("none", "token_tis", "token_mask", "sequence_tis", "geo_reject", "keep_mask")

#: What a history records at every step (one float each). ``mismatch_kl`` is the token mean of k3 of
#: log π_old − log π_rollout on the engine's tokens, an estimate of KL(π_rollout ‖ π_old) per token
#: (verl's ``rollout_corr/k3_kl``; about 0 with the "trainer" engine); ``rejected_tokens`` the fraction
#: of response tokens the correction gives weight 0; ``trainer_reward`` and ``trainer_true_kl`` the mean
#: reward and true KL(π_θ ‖ π_ref) of a second batch sampled by the trainer's policy itself (float32,
#: T = 1, full vocabulary; its own generator, seeded from the run's seed): the two terms of the objective
#: the update is meant to improve. With the "trainer" engine they are ``reward`` and ``true_kl`` (the
#: batch is the same policy's). ``engine_true_kl`` is the true KL(π_rollout ‖ π_ref) of the policy the engine
#: *serves* (its sampling distribution: bf16 weights, temperature, top-p truncation), summed along the engine's
#: own responses: with ``reward`` it scores the served policy, as ``trainer_reward`` and ``trainer_true_kl``
#: score the trainer's (``true_kl`` is π_old's KL along the engine's responses, which the engine did not sample
#: from π_old, so it scores neither).
METRICS: tuple[str, ...] = (
    "reward",
    "true_kl",
    "reported_kl",
    "entropy",
    "approx_kl",
    "epochs_run",
    "response_length",
    "finished",
    "mismatch_kl",
    "rejected_tokens",
    "trainer_reward",
    "trainer_true_kl",
    "engine_true_kl",
)


@dataclass(frozen=True)
class LabConfig:
    """Settings of one training run (every field is a visible knob of the lesson)."""

    placement: str = "k1 in reward"
    beta: float = 0.2
    steps: int = 60
    prompts: int = 4  # distinct prompts per batch (from klviz.lm.PROMPTS, cycled)
    group_size: int = 8  # responses per prompt (the baseline is the group mean)
    max_new_tokens: int = 24
    lr: float = 1e-3
    epochs: int = 1  # gradient steps per batch; > 1: the later ones are off-policy
    early_stop_kl: float | None = None  # stop a batch's epochs when approx_kl exceeds this
    clip: float | None = None  # PPO ratio clip epsilon (None: plain importance ratio)
    seed: int = 0
    engine: str = "trainer"  # who samples: a key of ENGINES (lesson 08)
    correction: str = "none"  # reweighting of the policy-gradient term: one of LAB_CORRECTIONS

    def __post_init__(self) -> None:
        check_choice(self.placement, "placement", PLACEMENTS)
        check_choice(self.engine, "engine", tuple(ENGINES))
        check_choice(self.correction, "correction", LAB_CORRECTIONS)
        for name in ("steps", "prompts", "group_size", "max_new_tokens", "epochs"):
            check_positive_int(getattr(self, name), name)
        for name in ("beta", "lr"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ValueError(f"{name} must be a finite non-negative number, got {v!r}")
        if self.lr == 0:
            raise ValueError("lr must be positive, got 0")
        if self.early_stop_kl is not None and not (
            isinstance(self.early_stop_kl, (int, float)) and self.early_stop_kl > 0
        ):
            raise ValueError(f"early_stop_kl must be a positive number or None, got {self.early_stop_kl!r}")
        if self.clip is not None and not (isinstance(self.clip, (int, float)) and 0 < self.clip < 1):
            raise ValueError(f"clip must lie in (0, 1) or be None, got {self.clip!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")


@dataclass
class TrainingHistory:
    """Per-step metrics of one run, the final policy and a few sampled responses."""

    config: LabConfig
    metrics: dict[str, list[float]] = field(default_factory=lambda: {m: [] for m in METRICS})
    samples: list[list[str]] = field(default_factory=list)
    seconds: float = 0.0
    policy: lm.TinyLM | None = None

    def last(self, name: str, window: int = 5) -> float:
        """Mean of the last ``window`` recorded values of a metric."""
        vals = self.metrics[name][-window:]
        return float(sum(vals) / len(vals)) if vals else math.nan

    def as_tensors(self) -> dict[str, torch.Tensor]:
        return {k: torch.tensor(v) for k, v in self.metrics.items()}

    def summary(self) -> dict[str, Any]:
        return {
            "placement": self.config.placement,
            "engine": self.config.engine,
            "correction": self.config.correction,
            **{m: self.last(m) for m in METRICS},
            "seconds": self.seconds,
        }


class Adam:
    """Adam (Kingma and Ba, 2015) with PyTorch's defaults (betas 0.9 and 0.999, eps 1e-8, no weight decay),
    the same arithmetic as ``torch.optim.Adam``'s single-tensor update, so a run gives the same numbers
    bit for bit on the CPU (``tests/test_rlhf_adam.py``).

    Written out because ``torch.optim``'s first step imports ``torch._dynamo`` (about 800 modules, 70 MB
    resident in every kernel that trains: lessons 07 and 08).
    """

    def __init__(
        self, params: list[torch.Tensor], lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8
    ):
        self.params, self.lr, self.betas, self.eps = params, lr, betas, eps
        self.steps = 0
        self.exp_avg = [torch.zeros_like(p) for p in params]
        self.exp_avg_sq = [torch.zeros_like(p) for p in params]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    @torch.no_grad()
    def step(self) -> None:
        beta1, beta2 = self.betas
        self.steps += 1
        step = float(torch.tensor(float(self.steps), dtype=torch.float32))  # torch keeps the count as a float32
        bias_correction1 = 1 - beta1**step
        bias_correction2_sqrt = (1 - beta2**step) ** 0.5
        step_size = self.lr / bias_correction1
        for p, m, v in zip(self.params, self.exp_avg, self.exp_avg_sq):
            if p.grad is None:
                continue
            grad = p.grad
            m.lerp_(grad, 1 - beta1)
            v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            denom = (v.sqrt() / bias_correction2_sqrt).add_(self.eps)
            p.addcdiv_(m, denom, value=-step_size)


def _masked_row_sum(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (values * mask).sum(-1)


def _replay(logp_all: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
    """The trainer's log-probs ``[B, T, V]`` with the engine's sampling mask replayed (``keep_mask``),
    or unchanged when ``keep`` is None."""
    return logp_all if keep is None else mm.replay_sampling_mask(logp_all, keep)


def _batch_prompts(cfg: LabConfig) -> list[str]:
    chosen = [lm.PROMPTS[i % len(lm.PROMPTS)] for i in range(cfg.prompts)]
    return [p for p in chosen for _ in range(cfg.group_size)]


def train_policy(
    config: LabConfig,
    *,
    policy: lm.TinyLM | None = None,
    reference: lm.TinyLM | None = None,
    reward_fn: Callable[[Sequence[str], torch.Tensor], torch.Tensor] | None = None,
    device: str | torch.device | None = "cpu",
    callback: Callable[[int, TrainingHistory], None] | None = None,
) -> TrainingHistory:
    """Train ``policy`` (default: a fresh copy of the reference) for ``config.steps`` steps.

    ``reference`` defaults to ``klviz.lm.load_tiny_lm("ref")``; the policy may be any
    :class:`klviz.lm.TinyLM`. ``reward_fn(texts, finished) -> [B]`` defaults to :func:`klviz.lm.reward`.
    Sampling uses ``make_generator(config.seed, device)`` and the policy starts from the same
    weights, so the same config gives the same run (on the same device). ``callback(step, history)``
    is called after every step (the lesson's panel uses it to redraw live).
    """
    run = TrainingRun(config, policy=policy, reference=reference, reward_fn=reward_fn, device=device)
    run.advance(run.config.steps, callback=callback)
    run.history.policy = run.policy
    return run.history


class TrainingRun:
    """A training run that can be continued: :meth:`advance` trains more steps where it stopped.

    The number of steps enters nothing but the loop (no schedule depends on it), so a run advanced
    to N steps in pieces records exactly the history of :func:`train_policy` with ``steps = N``, and
    :meth:`prefix` gives the history of any shorter run without training again. The lesson's panel
    uses this: moving its ``steps`` slider down shows a prefix, moving it up trains only the new steps.
    ``config.steps`` is ignored here.
    """

    def __init__(
        self,
        config: LabConfig,
        *,
        policy: lm.TinyLM | None = None,
        reference: lm.TinyLM | None = None,
        reward_fn: Callable[[Sequence[str], torch.Tensor], torch.Tensor] | None = None,
        device: str | torch.device | None = "cpu",
    ) -> None:
        self.config = config if isinstance(config, LabConfig) else LabConfig(**config)
        self.device = resolve_device(device)
        dev = self.device
        self.reference = (
            lm.load_tiny_lm("ref", dev) if reference is None else reference.to(dev).eval().requires_grad_(False)
        )
        self.policy = copy.deepcopy(self.reference if policy is None else policy).to(dev)
        self.reward_fn = lm.reward if reward_fn is None else reward_fn
        self.optimizer = Adam(list(self.policy.parameters()), lr=self.config.lr)
        self.generator = make_generator(self.config.seed, dev)
        #: samples the trainer's own policy when an engine samples the training batch (``trainer_reward``)
        self.eval_generator = make_generator(self.config.seed + 1_000_003, dev)
        self.history = TrainingHistory(self.config)
        #: wall-clock seconds from the start of the run to the end of each step
        self.seconds: list[float] = []

    @property
    def steps_done(self) -> int:
        return len(self.history.metrics["reward"])

    def prefix(self, steps: int) -> TrainingHistory:
        """The history of the first ``steps`` steps (without a policy: only the run's last one is kept)."""
        check_positive_int(steps, "steps")
        if steps > self.steps_done:
            raise ValueError(f"steps={steps} but this run has trained {self.steps_done}; advance it first")
        cfg = replace(self.config, steps=steps)
        return TrainingHistory(
            cfg,
            {k: v[:steps] for k, v in self.history.metrics.items()},
            self.history.samples[:steps],
            self.seconds[steps - 1],
        )

    def advance(self, steps: int, callback: Callable[[int, TrainingHistory], None] | None = None) -> None:
        """Train ``steps`` more steps; ``callback(step, history)`` after each (``step`` counts from the run's start)."""
        check_positive_int(steps, "steps")
        if self.device.type == "cpu":  # a 45k-parameter model: one thread beats two threads handing work back and forth
            with single_thread():
                self._advance(steps, callback)
        else:
            self._advance(steps, callback)

    def _advance(self, steps: int, callback: Callable[[int, TrainingHistory], None] | None) -> None:
        cfg, dev, pol, ref = self.config, self.device, self.policy, self.reference
        reward_fn, opt, gen, hist = self.reward_fn, self.optimizer, self.generator, self.history
        prompts = _batch_prompts(cfg)
        use = None if cfg.placement == "none" else parse_use(cfg.placement)
        loss_use = use if use is not None and use.placement == "loss" else None  # the KL term is in the loss
        kind = None if loss_use is None else _verl_kind(loss_use)
        spec = ENGINES[cfg.engine]
        eval_gen = self.eval_generator
        pol.train().requires_grad_(True)
        try:
            for step in range(self.steps_done, self.steps_done + steps):
                t_step = time.perf_counter()
                with torch.no_grad():
                    if spec is None:  # the policy samples itself
                        ro = lm.sample_rollouts(pol, prompts, gen, max_new_tokens=cfg.max_new_tokens)
                        keep = None
                        trainer_reward = trainer_true_kl = None
                        served_all = None
                    else:  # an engine of the policy's current weights samples (lesson 08)
                        mm.engine_model(pol, spec.precision, sync=True)
                        er = mm.sample_engine(pol, prompts, gen, spec, max_new_tokens=cfg.max_new_tokens)
                        ro = er.rollouts
                        keep = er.keep.to(dev) if cfg.correction == "keep_mask" else None
                        # the policy the engine serves: its weights, its temperature, its sampling mask
                        served_all = mm.replay_sampling_mask(
                            torch.log_softmax(
                                lm.next_token_logprobs(mm.engine_model(pol, spec.precision), ro) / spec.temperature, -1
                            ),
                            er.keep.to(dev),
                        )
                        own = lm.sample_rollouts(pol, prompts, eval_gen, max_new_tokens=cfg.max_new_tokens)
                        trainer_reward = float(reward_fn(own.responses, own.finished).float().mean())
                        own_kl = exact_kl(lm.next_token_logprobs(pol, own), lm.next_token_logprobs(ref, own))
                        trainer_true_kl = float(_masked_row_sum(own_kl, own.response_mask).mean())
                    mask = ro.response_mask
                    rewards = reward_fn(ro.responses, ro.finished).to(dev).float()
                    ref_logp_all = lm.next_token_logprobs(ref, ro)
                    old_logp_all = lm.next_token_logprobs(pol, ro)
                    ids = ro.input_ids.unsqueeze(-1)
                    ref_logp = ref_logp_all.gather(-1, ids).squeeze(-1)
                    old_logp = _replay(old_logp_all, keep).gather(-1, ids).squeeze(-1)
                    k1_tok = (old_logp - ref_logp) * mask
                    true_kl = _masked_row_sum(exact_kl(old_logp_all, ref_logp_all), mask).mean()
                    engine_true_kl = (
                        true_kl
                        if served_all is None
                        else _masked_row_sum(exact_kl(served_all, ref_logp_all), mask).mean()
                    )
                    entropy = (-(old_logp_all.exp() * old_logp_all).sum(-1) * mask).sum() / mask.sum().clamp_min(1)
                    if kind is None:
                        reported = _masked_row_sum(k1_tok, mask).mean()
                    else:
                        reported = _masked_row_sum(kl_penalty(old_logp, ref_logp, kind), mask).mean()
                    # returns per token: R for every token; k1 in the reward adds -beta · (k1 of this and later tokens)
                    returns = rewards[:, None].expand_as(mask).clone()
                    if use is not None and use.placement == "reward":
                        to_go = k1_tok.flip(-1).cumsum(-1).flip(-1)
                        returns = returns - cfg.beta * to_go
                    # group baseline: mean over the group of the return at each row's first response token
                    first = torch.stack([returns[b, ro.response_slice(b).start] for b in range(ro.batch_size)])
                    base = first.view(cfg.prompts, cfg.group_size).mean(-1).repeat_interleave(cfg.group_size)
                    adv = (returns - base[:, None]) * mask
                    # the engine's log-probs of its own tokens against the trainer's recompute (pi_old)
                    log_r = (old_logp - ro.logprobs.to(dev)) * mask
                    n_tok = mask.sum().clamp_min(1)
                    mismatch_kl = (kernel.k3(log_r) * mask).sum() / n_tok
                    weights = None
                    rejected = 0.0
                    if cfg.correction not in ("none", "keep_mask"):
                        weights = mm.correction_weights(log_r, mask.bool(), cfg.correction)
                        rejected = float(((weights == 0) & mask.bool()).sum() / n_tok)
                approx = 0.0
                epochs_run = 0
                for _epoch in range(cfg.epochs):
                    logp_all = lm.next_token_logprobs(pol, ro)
                    logp = _replay(logp_all, keep).gather(-1, ids).squeeze(-1)
                    ratio = torch.exp(logp - old_logp)
                    if cfg.clip is None:
                        pg = -(ratio * adv)
                    else:
                        pg = -torch.minimum(ratio * adv, ratio.clamp(1 - cfg.clip, 1 + cfg.clip) * adv)
                    if weights is not None:
                        pg = pg * weights  # the rollout correction, on the policy-gradient term only
                    loss_tok = pg
                    if loss_use is not None and cfg.beta > 0:
                        if loss_use.weighting == "rho":  # TRL / DeepSeek-V3.2: unclamped k3 times rho
                            pen = ratio * k3(ref_logp - logp)  # rho = pi / sg(pi_old), differentiated
                        else:  # verl's kinds, with verl's clamps for k3
                            pen = kl_penalty(logp, ref_logp, _verl_kind(loss_use))
                        loss_tok = loss_tok + cfg.beta * pen
                    loss = _masked_row_sum(loss_tok, mask).mean()
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    opt.step()
                    epochs_run += 1
                    with torch.no_grad():
                        new_logp = lm.logprobs_of(pol, ro)
                        approx = float((kernel.k2(new_logp - old_logp) * mask).sum() / mask.sum().clamp_min(1))
                    if cfg.early_stop_kl is not None and approx > cfg.early_stop_kl:
                        break
                m = hist.metrics
                m["reward"].append(float(rewards.mean()))
                m["true_kl"].append(float(true_kl))
                m["reported_kl"].append(float(reported))
                m["entropy"].append(float(entropy))
                m["approx_kl"].append(approx)
                m["epochs_run"].append(float(epochs_run))
                m["response_length"].append(float(ro.response_lengths.float().mean()))
                m["finished"].append(float(ro.finished.float().mean()))
                m["mismatch_kl"].append(float(mismatch_kl))
                m["rejected_tokens"].append(rejected)
                m["trainer_reward"].append(float(rewards.mean()) if trainer_reward is None else trainer_reward)
                m["trainer_true_kl"].append(float(true_kl) if trainer_true_kl is None else trainer_true_kl)
                m["engine_true_kl"].append(float(engine_true_kl))
                hist.samples.append(ro.responses[:: cfg.group_size][:3])
                if not all(math.isfinite(m[k][-1]) for k in METRICS):
                    raise ValueError(f"training diverged at step {step} (non-finite metric); lower lr or beta")
                hist.seconds = (self.seconds[-1] if self.seconds else 0.0) + time.perf_counter() - t_step
                self.seconds.append(hist.seconds)
                if callback is not None:
                    callback(step, hist)
        finally:
            pol.eval().requires_grad_(False)


def run_placements(
    placements: Sequence[str] = PLACEMENTS, *, device: str | torch.device | None = "cpu", **overrides: Any
) -> dict[str, TrainingHistory]:
    """Side-by-side runs: the same config (and seed) for each placement."""
    out = {}
    for p in placements:
        out[p] = train_policy(LabConfig(placement=p, **overrides), device=device)
    return out


def config_dict(config: LabConfig) -> dict[str, Any]:
    """The config as a plain dict (for printing)."""
    return asdict(config)


# --------------------------------------------------------------------------------------------------
# lesson 07's runs, kept for the kernel: the notebook's figures and the lab's panel share them
# --------------------------------------------------------------------------------------------------
import threading  # noqa: E402 - this section's lock; the section is kept apart from the training code

__all__ += ["PLACEMENT_COLORS", "cached_run", "lab_history", "trained_history"]

#: The colour of each placement in lesson 07's figures and panel (:mod:`klviz.palette` names):
#: ``PLACEMENT_COLORS[p]`` for the theme figures are drawn in, ``PLACEMENT_COLORS.css(p)`` for HTML.
PLACEMENT_COLORS: ThemedColours = ThemedColours(
    {
        "k1 in reward": "k1",
        "k1 in loss": "cyan",
        "k2 in loss": "k2",
        "k3 in loss": "k3",
        "k3·ρ in loss": "p",
        "k3+ in loss": "brown",
        "none": "q",
    }
)

_RUNS: dict[tuple[LabConfig, str], TrainingHistory] = {}
_MAX_RUNS = 32


def cached_run(config: LabConfig, device: str | torch.device = "cpu", callback: Any = None) -> TrainingHistory:
    """:func:`train_policy` with the default policy, reward and reference, cached by (config, device):
    the same settings train once per kernel. ``callback`` is passed to a new run."""
    key = (config, str(torch.device(device)))
    if key not in _RUNS:
        hist = train_policy(config, device=device, callback=callback)
        if len(_RUNS) >= _MAX_RUNS:
            _RUNS.pop(next(iter(_RUNS)))
        _RUNS[key] = hist
    return _RUNS[key]


_RESUMABLE: dict[tuple[LabConfig, str], TrainingRun] = {}
_MAX_RESUMABLE = 16
_TRAINING = threading.RLock()


def lab_history(config: LabConfig, device: str | torch.device = "cpu", callback: Any = None) -> TrainingHistory:
    """The history of a run with ``config``, training only what no earlier call has trained.

    A run already made by :func:`cached_run` is returned as is. Otherwise the settings other than
    ``steps`` name one resumable :class:`TrainingRun`: a request for fewer steps than it has trained
    is its prefix (the same numbers a run of that length records), a request for more advances it.
    The history comes without a policy; use :func:`cached_run` when you need it.
    """
    dev = str(torch.device(device))
    with _TRAINING:  # one run trains at a time (runs are shared)
        if (config, dev) in _RUNS:
            return _RUNS[(config, dev)]
        key = _resumable_key(config, dev)
        run = _RESUMABLE.pop(key, None)
        if run is None:
            run = TrainingRun(config, device=device)
        _RESUMABLE[key] = run  # most recently used goes last
        while len(_RESUMABLE) > _MAX_RESUMABLE:
            del _RESUMABLE[next(iter(_RESUMABLE))]
        if run.steps_done < config.steps:
            run.advance(config.steps - run.steps_done, callback=callback)
        return run.prefix(config.steps)


def trained_history(config: LabConfig, device: str | torch.device = "cpu") -> TrainingHistory | None:
    """The history of ``config`` if it is there without training (a kept run or the start of a longer
    one), else None."""
    dev = str(torch.device(device))
    # no lock: a background run may hold it for seconds; a run's history only ever grows
    if (config, dev) in _RUNS:
        return _RUNS[(config, dev)]
    run = _RESUMABLE.get(_resumable_key(config, dev))
    return run.prefix(config.steps) if run is not None and run.steps_done >= config.steps else None


def _resumable_key(config: LabConfig, device: str) -> tuple[LabConfig, str]:
    """Runs that differ only in ``steps`` are one resumable run."""
    return replace(config, steps=1), device


# --------------------------------------------------------------------------------------------------
# lesson 07's comparisons across seeds: the runs, stored once by scripts/lab_seeds.py
# --------------------------------------------------------------------------------------------------
import json  # noqa: E402 - used by this section only
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

__all__ += [
    "LAB_SEEDS",
    "CHECK_SEEDS",
    "LAB_SEED_CONFIGS",
    "LAB_SEEDS_PATH",
    "LAB_CHECK_PATH",
    "MISMATCH_CHECK_PATH",
    "MISMATCH_SEED_CONFIGS",
    "MISMATCH_SEED_METRICS",
    "MISMATCH_SEEDS_PATH",
    "MISMATCH_SEEDS",
    "LabSeeds",
    "run_lab_seeds",
    "save_lab_seeds",
    "load_lab_seeds",
]

#: The seeds every comparison of lesson 07 rests on (a verdict from one seed is no verdict): 16, as in lesson 08.
LAB_SEEDS: tuple[int, ...] = tuple(range(16))
#: Seeds no lesson trains with: the same runs with these seeds are stored too (``LAB_CHECK_PATH``,
#: ``MISMATCH_CHECK_PATH``), and lessons 07 and 08 show every verdict on both sets.
CHECK_SEEDS: tuple[int, ...] = tuple(range(100, 116))
#: Stored metrics of each run (the per-step lists of :attr:`TrainingHistory.metrics`).
LAB_SEED_METRICS: tuple[str, ...] = ("reward", "true_kl", "reported_kl", "entropy", "approx_kl", "epochs_run")


def _lab_seed_configs() -> dict[str, LabConfig]:
    on = LabConfig(beta=0.2, steps=40)  # on-policy: one gradient step per batch
    off = LabConfig(beta=0.2, steps=20, epochs=4)  # PPO-style: four epochs per batch
    big = LabConfig(beta=1.0, steps=20, epochs=4)  # a strong penalty, four epochs
    cfgs = {
        f"on · {p}": replace(on, placement=p)
        for p in ("none", "k1 in loss", "k1 in reward", "k2 in loss", "k3 in loss")
    }
    cfgs.update({f"off · {p}": replace(off, placement=p) for p in ("none", "k1 in loss", "k3 in loss", "k3·ρ in loss")})
    cfgs["off · k3 in loss, early stop 0.01"] = replace(off, placement="k3 in loss", early_stop_kl=0.01)
    cfgs.update({f"β=1 · {p}": replace(big, placement=p) for p in ("k1 in loss", "k3·ρ in loss")})
    cfgs["β=1 · k1 in loss, clip 0.2"] = replace(big, placement="k1 in loss", clip=0.2)
    return cfgs


#: Lesson 07's multi-seed runs by name (seed 0 shown; each runs with every seed of :data:`LAB_SEEDS`):
#: ``"on · ..."`` one epoch per batch, ``"off · ..."`` four epochs (off-policy after the first),
#: ``"β=1 · ..."`` four epochs with beta = 1.
LAB_SEED_CONFIGS: dict[str, LabConfig] = _lab_seed_configs()
#: Where :func:`save_lab_seeds` writes them (package data, a few hundred kB); the same runs with :data:`CHECK_SEEDS`
#: go to ``LAB_CHECK_PATH``.
LAB_SEEDS_PATH = Path(__file__).resolve().parent / "data" / "lab_seeds.npz"
LAB_CHECK_PATH = Path(__file__).resolve().parent / "data" / "lab_check_seeds.npz"


def _mismatch_seed_configs() -> dict[str, LabConfig]:
    base = LabConfig(placement="k3 in loss", beta=0.2, steps=40)  # lesson 07's "on · k3 in loss"
    cfgs = {"trainer · none": base}
    for engine in ENGINES:
        if engine != "trainer":
            cfgs.update({f"{engine} · {c}": replace(base, engine=engine, correction=c) for c in LAB_CORRECTIONS})
    return cfgs


#: Lesson 08's training runs through a mismatched engine, by name ``"<engine> · <correction>"``: every
#: engine of :data:`ENGINES` with every correction of :data:`LAB_CORRECTIONS`, and the trainer sampling
#: itself (``"trainer · none"``, the run lesson 07 calls ``"on · k3 in loss"``). k3 in the loss, beta 0.2,
#: 40 on-policy steps; each with every seed of :data:`MISMATCH_SEEDS`.
MISMATCH_SEED_CONFIGS: dict[str, LabConfig] = _mismatch_seed_configs()
#: What the store keeps of each of those runs.
MISMATCH_SEED_METRICS: tuple[str, ...] = (
    "reward",
    "trainer_reward",
    "true_kl",
    "trainer_true_kl",
    "engine_true_kl",
    "mismatch_kl",
    "rejected_tokens",
    "entropy",
)
MISMATCH_SEEDS_PATH = Path(__file__).resolve().parent / "data" / "mismatch_seeds.npz"
MISMATCH_CHECK_PATH = Path(__file__).resolve().parent / "data" / "mismatch_check_seeds.npz"
#: The seeds of lesson 08's runs: twice lesson 07's, because the differences between corrections are small and
#: the runs through different engines are paired by seed only loosely (their batches differ from the first step).
MISMATCH_SEEDS: tuple[int, ...] = tuple(range(16))


#: A run trained again reproduces a stored one when every metric is within this share of the seeds' spread ...
REPRODUCE_SHARE = 0.01
#: ... plus this absolute amount (metrics that are float rounding at every seed, such as a KL of 1e-16).
REPRODUCE_FLOOR = 1e-6


@dataclass
class LabSeeds:
    """The metrics of every run of :data:`LAB_SEED_CONFIGS` for every seed of :data:`LAB_SEEDS`.

    ``metrics[name][metric]`` is an array ``[seeds, steps]``; ``samples[name]`` the first sampled
    response of the last step, one per seed; ``seconds[name]`` the training time of each seed's run.
    """

    configs: dict[str, LabConfig]
    seeds: tuple[int, ...]
    metrics: dict[str, dict[str, np.ndarray]]
    samples: dict[str, list[str]]
    seconds: dict[str, np.ndarray]
    torch_version: str = ""
    metric_names: tuple[str, ...] = LAB_SEED_METRICS

    def reproduction_gaps(self, name: str, metrics: dict[str, list[float]], seed: int = 0) -> dict[str, float]:
        """How far a run trained again (``metrics``, a :class:`TrainingHistory`'s) is from the stored run of
        ``name`` and ``seed``, per metric: the largest gap over the steps, in units of :data:`REPRODUCE_SHARE`
        of the spread between seeds (the largest over steps of the SD across the stored seeds) plus an absolute
        :data:`REPRODUCE_FLOOR`. A value ≤ 1 means the same run.

        Bitwise equality is not asked for: CPUs of two vendors (and GPUs) round float32 sums differently, and
        training carries the difference along (measured: up to 2e-4 of the seed spread after 40 steps between
        an Intel and an AMD CPU). A change of the code that moves a run by 1 % of the seed-to-seed spread is
        caught; the lessons' verdicts, which rest on that spread, cannot notice less.
        """
        row = self.seeds.index(seed)
        out = {}
        for m in self.metric_names:
            stored = self.metrics[name][m]
            gap = float(np.abs(np.asarray(metrics[m], dtype=np.float64) - stored[row]).max())
            spread = float(stored.std(0, ddof=1).max()) if stored.shape[0] > 1 else 0.0
            out[m] = gap / (REPRODUCE_SHARE * spread + REPRODUCE_FLOOR)
        return out

    def final(self, name: str, metric: str, window: int = 5) -> np.ndarray:
        """Per seed, the mean of the last ``window`` steps of ``metric`` (what :meth:`TrainingHistory.last` gives)."""
        return self.metrics[name][metric][:, -window:].mean(-1)

    def score(self, name: str, window: int = 5, *, policy: str = "trainer") -> np.ndarray:
        """Per seed, lesson 07's yardstick J = E[R] − beta · KL(π ‖ π_ref), the objective the KL-regularised
        update climbs, for one policy: ``"trainer"``, the trainer's own π_θ (``trainer_reward`` and
        ``trainer_true_kl``, which lesson 08's store keeps; lesson 07's runs sample with the trainer, so there
        ``reward`` and ``true_kl``), or ``"engine"``, the policy the engine serves (``reward`` and
        ``engine_true_kl``: top-p truncated, at the engine's temperature)."""
        check_choice(policy, "policy", ("trainer", "engine"))
        beta = self.configs[name].beta
        if policy == "engine":
            reward, kl = "reward", "engine_true_kl"
        elif "trainer_reward" in self.metric_names:
            reward, kl = "trainer_reward", "trainer_true_kl"
        else:
            reward, kl = "reward", "true_kl"
        return self.final(name, reward, window) - beta * self.final(name, kl, window)

    def same_runs(self, a: str, b: str) -> bool:
        """Whether runs ``a`` and ``b`` are the very same, seed for seed and step for step (a correction whose
        weights never bind trains exactly what no correction trains)."""
        return all(np.array_equal(self.metrics[a][m], self.metrics[b][m]) for m in self.metric_names)

    def compare(self, a: str, b: str, metric: str = "true_kl", window: int = 5) -> dict[str, Any]:
        """Run ``a`` against run ``b`` on the final ``metric``, paired by seed (same seed, same first batch).

        Returns both means and their standard errors over seeds, the paired difference a - b with its
        SE, and in how many seeds a came out above b.
        """
        from .statistics import mean_se  # one home of mean ± SE

        va, vb = self.final(a, metric, window), self.final(b, metric, window)
        ma, sa = mean_se(torch.as_tensor(va))
        mb, sb = mean_se(torch.as_tensor(vb))
        md, sd = mean_se(torch.as_tensor(va - vb))
        return {
            "a": ma,
            "a_se": sa,
            "b": mb,
            "b_se": sb,
            "diff": md,
            "diff_se": sd,
            "a_above": int((va > vb).sum()),
            "seeds": len(va),
        }


def _history_arrays(hist: TrainingHistory, names: Sequence[str]) -> dict[str, np.ndarray]:
    return {m: np.asarray(hist.metrics[m], dtype=np.float64) for m in names}


def run_lab_seeds(
    configs: dict[str, LabConfig] | None = None,
    seeds: Sequence[int] = LAB_SEEDS,
    *,
    device: str | torch.device = "cpu",
    progress: Callable[[str, int, float], None] | None = None,
    metric_names: Sequence[str] = LAB_SEED_METRICS,
) -> LabSeeds:
    """Train every config with every seed on ``device`` (CPU: what the stored files hold), keeping
    ``metric_names`` of each run (lesson 08's store: :data:`MISMATCH_SEED_CONFIGS` with
    :data:`MISMATCH_SEED_METRICS`)."""
    configs = LAB_SEED_CONFIGS if configs is None else configs
    names = tuple(metric_names)
    for m in names:
        check_choice(m, "metric_names", METRICS)
    metrics: dict[str, dict[str, list[np.ndarray]]] = {n: {m: [] for m in names} for n in configs}
    samples: dict[str, list[str]] = {n: [] for n in configs}
    seconds: dict[str, list[float]] = {n: [] for n in configs}
    for name, cfg in configs.items():
        for s in seeds:
            hist = train_policy(replace(cfg, seed=int(s)), device=device)
            for m, v in _history_arrays(hist, names).items():
                metrics[name][m].append(v)
            samples[name].append(hist.samples[-1][0] if hist.samples and hist.samples[-1] else "")
            seconds[name].append(hist.seconds)
            if progress is not None:
                progress(name, int(s), hist.seconds)
    return LabSeeds(
        dict(configs),
        tuple(int(s) for s in seeds),
        {n: {m: np.stack(v) for m, v in d.items()} for n, d in metrics.items()},
        samples,
        {n: np.asarray(v) for n, v in seconds.items()},
        torch.__version__,
        names,
    )


def save_lab_seeds(data: LabSeeds, path: str | Path = LAB_SEEDS_PATH) -> Path:
    """Write ``data`` as a compressed ``.npz`` (no pickles: strings are unicode arrays, configs JSON)."""
    names = list(data.configs)
    arrays: dict[str, np.ndarray] = {
        "names": np.asarray(names),
        "seeds": np.asarray(data.seeds, dtype=np.int64),
        "configs": np.asarray(json.dumps({n: asdict(c) for n, c in data.configs.items()}, ensure_ascii=False)),
        "torch_version": np.asarray(data.torch_version),
        "metric_names": np.asarray(data.metric_names),
    }
    for i, n in enumerate(names):
        for m in data.metric_names:
            arrays[f"run{i}_{m}"] = data.metrics[n][m]
        arrays[f"run{i}_samples"] = np.asarray(data.samples[n])
        arrays[f"run{i}_seconds"] = data.seconds[n]
    out = Path(path)
    np.savez_compressed(out, **arrays)  # type: ignore[arg-type]  # the stubs type every keyword as allow_pickle
    return out


def load_lab_seeds(path: str | Path = LAB_SEEDS_PATH) -> LabSeeds:
    """Read what :func:`save_lab_seeds` wrote (``allow_pickle=False``)."""
    with np.load(Path(path), allow_pickle=False) as f:
        names = [str(n) for n in f["names"]]
        configs = {n: LabConfig(**c) for n, c in json.loads(str(f["configs"])).items()}
        kept = tuple(str(m) for m in f["metric_names"]) if "metric_names" in f.files else LAB_SEED_METRICS
        metrics = {n: {m: f[f"run{i}_{m}"] for m in kept} for i, n in enumerate(names)}
        samples = {n: [str(s) for s in f[f"run{i}_samples"]] for i, n in enumerate(names)}
        seconds = {n: f[f"run{i}_seconds"] for i, n in enumerate(names)}
        seeds = tuple(int(s) for s in f["seeds"])
        version = str(f["torch_version"])
    return LabSeeds(configs, seeds, metrics, samples, seconds, version, kept)


# --------------------------------------------------------------------------------------------------
# the verdicts of lessons 07 and 08: one rule (3 standard errors), stated as data, re-checked on other seeds
# --------------------------------------------------------------------------------------------------
__all__ += ["Verdict", "LAB_VERDICTS", "MISMATCH_VERDICTS", "judge"]


@dataclass(frozen=True)
class Verdict:
    """A comparison a lesson states: run ``a`` against run ``b`` on the final ``metric``, paired by seed.

    ``says`` is what the lesson says: ``"a < b"`` or ``"a > b"`` (resolved, at least
    :data:`klviz.statistics.RESOLVED_AT_SE` standard errors from 0, in that direction) or ``"not resolved"``.
    ``metric`` is a stored metric, ``"score"`` (lesson 07's J on the trainer's own policy) or ``"served score"``
    (J of the policy the engine serves, :meth:`LabSeeds.score`). ``wording`` is the lesson's sentence.
    ``on_check_seeds`` is what the same comparison gives on the check seeds (:data:`CHECK_SEEDS`), when it differs
    from ``says``: the lesson then calls the comparison fragile and says both.
    """

    wording: str
    a: str
    b: str
    metric: str
    says: str
    on_check_seeds: str | None = None

    def __post_init__(self) -> None:
        check_choice(self.says, "says", ("a < b", "a > b", "not resolved"))
        if self.on_check_seeds is not None:
            check_choice(self.on_check_seeds, "on_check_seeds", ("a < b", "a > b", "not resolved"))

    @property
    def fragile(self) -> bool:
        """Whether the lesson's seeds and the check seeds say different things about this comparison."""
        return self.on_check_seeds is not None and self.on_check_seeds != self.says


def _final_values(store: LabSeeds, name: str, metric: str) -> np.ndarray:
    if metric == "score":
        return store.score(name)
    if metric == "served score":
        return store.score(name, policy="engine")
    return store.final(name, metric)


def judge(store: LabSeeds, verdicts: Sequence[Verdict], *, check_seeds: bool = False) -> list[dict[str, Any]]:
    """Each verdict on ``store``: the paired difference a − b (mean and SE over the seeds), its z, in how many seeds
    a came out above, whether it is resolved (:func:`klviz.statistics.is_resolved`), how many seeds an unresolved one
    would take (:func:`klviz.statistics.seeds_to_resolve`), and ``holds``: whether the data say what the lesson says
    (with ``check_seeds``, what it says about the check seeds: ``on_check_seeds`` where given)."""
    from .statistics import is_resolved, mean_se, seeds_to_resolve

    rows = []
    for v in verdicts:
        says = v.on_check_seeds if (check_seeds and v.on_check_seeds is not None) else v.says
        va, vb = _final_values(store, v.a, v.metric), _final_values(store, v.b, v.metric)
        d, se = mean_se(torch.as_tensor(va - vb))
        scale = float(np.abs(vb).mean())
        resolved = is_resolved(d, se, scale)
        if says == "not resolved":
            holds = not resolved
        else:
            holds = resolved and (d < 0 if says == "a < b" else d > 0)
        rows.append(
            {
                "verdict": v,
                "diff": d,
                "se": se,
                "z": d / se if se > 0 else math.nan,
                "a_above": int((va > vb).sum()),
                "seeds": len(va),
                "resolved": resolved,
                "seeds_to_resolve": None if resolved else seeds_to_resolve(d, se, len(va)),
                "holds": holds,
            }
        )
    return rows


def _on(p: str) -> str:
    return f"on · {p}"


#: Lesson 07's comparisons, each as the lesson states it (16 seeds; ``benchmarks/lab_verdicts.py`` re-checks them on
#: seeds no lesson uses).
LAB_VERDICTS: tuple[Verdict, ...] = (
    *(
        Verdict(f"{p} holds the true KL below no penalty", _on(p), _on("none"), "true_kl", "a < b")
        for p in ("k1 in reward", "k2 in loss", "k3 in loss")
    ),
    Verdict(
        "k1 in the loss ends above k1 in the reward in KL", _on("k1 in loss"), _on("k1 in reward"), "true_kl", "a > b"
    ),
    Verdict("k1 in the loss against no penalty, in KL", _on("k1 in loss"), _on("none"), "true_kl", "not resolved"),
    Verdict(
        "no penalty ends with less entropy than k1 in the reward", _on("none"), _on("k1 in reward"), "entropy", "a < b"
    ),
    Verdict(
        "k1 in the loss ends with less entropy than k1 in the reward",
        _on("k1 in loss"),
        _on("k1 in reward"),
        "entropy",
        "a < b",
    ),
    Verdict(
        "k2 in the loss (partial gradient) against k1 in the reward (full), in KL",
        _on("k2 in loss"),
        _on("k1 in reward"),
        "true_kl",
        "not resolved",
    ),
    Verdict(
        "k3 in the loss ends lower in KL than k1 in the reward",
        _on("k3 in loss"),
        _on("k1 in reward"),
        "true_kl",
        "a < b",
        on_check_seeds="not resolved",
    ),
    Verdict(
        "k3 in the loss ends lower in reward than k1 in the reward",
        _on("k3 in loss"),
        _on("k1 in reward"),
        "reward",
        "a < b",
    ),
    Verdict(
        "k3 in the loss against k1 in the reward, in the score J",
        _on("k3 in loss"),
        _on("k1 in reward"),
        "score",
        "not resolved",
        on_check_seeds="a < b",
    ),
    Verdict(
        "off-policy, k1 in the loss against no penalty, in KL",
        "off · k1 in loss",
        "off · none",
        "true_kl",
        "not resolved",
    ),
    Verdict(
        "early stopping on approx_kl keeps the KL lower",
        "off · k3 in loss, early stop 0.01",
        "off · k3 in loss",
        "true_kl",
        "a < b",
    ),
    Verdict(
        "off-policy, k3·ρ against plain k3 in the loss, in KL",
        "off · k3·ρ in loss",
        "off · k3 in loss",
        "true_kl",
        "not resolved",
    ),
    Verdict(
        "four epochs per batch drift further than one (k3 in the loss)",
        "off · k3 in loss",
        _on("k3 in loss"),
        "true_kl",
        "a > b",
    ),
    Verdict(
        "at β = 1, k1 in the loss ends above no penalty in KL", "β=1 · k1 in loss", "off · none", "true_kl", "a > b"
    ),
    Verdict(
        "at β = 1, k1 in the loss ends below no penalty in reward", "β=1 · k1 in loss", "off · none", "reward", "a < b"
    ),
    Verdict(
        "the clip does not stop it: β = 1, clip 0.2, in KL",
        "β=1 · k1 in loss, clip 0.2",
        "off · none",
        "true_kl",
        "a > b",
        on_check_seeds="not resolved",
    ),
)


def _mismatch_verdicts() -> tuple[Verdict, ...]:
    ref, bf, t, p = "trainer · none", "bf16", "T=0.7", "top-p 0.8"
    out = []
    for c in LAB_CORRECTIONS:  # 1. bf16: nothing resolvable
        for other in (ref, f"{bf} · none"):
            if other == f"{bf} · {c}":
                continue
            for metric, what in (("trainer_reward", "the trainer's own reward"), ("score", "the score")):
                out.append(
                    Verdict(f"bf16 · {c} against {other}, in {what}", f"{bf} · {c}", other, metric, "not resolved")
                )
    out += [  # 2. a temperature not divided out
        Verdict(
            "T = 0.7, no correction, against the trainer sampling itself, in its own reward",
            f"{t} · none",
            ref,
            "trainer_reward",
            "not resolved",
        ),
        Verdict(
            "T = 0.7, no correction, ends further from the reference than the trainer sampling itself",
            f"{t} · none",
            ref,
            "trainer_true_kl",
            "a > b",
        ),
    ]
    effects = {  # (own reward, own KL, score, served score) of each correction against none at T = 0.7
        "token_tis": ("a > b", "a > b", "not resolved", "not resolved"),
        "geo_reject": ("a > b", "a > b", "a < b", "a < b"),  # both scores: fragile (not resolved on the check seeds)
        "token_mask": ("a < b", "a < b", "not resolved", "not resolved"),
    }
    for c, says in effects.items():
        for metric, said in zip(("trainer_reward", "trainer_true_kl", "score", "served score"), says):
            fragile = c == "geo_reject" and metric in ("score", "served score")
            out.append(
                Verdict(
                    f"T = 0.7, {c} against none, in {metric.replace('_', ' ')}",
                    f"{t} · {c}",
                    f"{t} · none",
                    metric,
                    said,
                    on_check_seeds="not resolved" if fragile else None,
                )
            )
    out += [  # 3. top-p
        Verdict("top-p, no correction, scores below the trainer sampling itself", f"{p} · none", ref, "score", "a < b"),
        Verdict(
            "top-p, no correction: the served policy scores below the trainer sampling itself",
            f"{p} · none",
            ref,
            "served score",
            "a < b",
        ),
        Verdict(
            "top-p, token TIS: less KL along the engine's batch than no correction",
            f"{p} · token_tis",
            f"{p} · none",
            "true_kl",
            "a < b",
            on_check_seeds="not resolved",
        ),
        Verdict(
            "top-p, token TIS against none, in the score", f"{p} · token_tis", f"{p} · none", "score", "not resolved"
        ),
        Verdict(
            "top-p, token TIS against none, in the served score",
            f"{p} · token_tis",
            f"{p} · none",
            "served score",
            "not resolved",
        ),
        Verdict(
            "top-p, token TIS still scores below the trainer sampling itself", f"{p} · token_tis", ref, "score", "a < b"
        ),
        Verdict(
            "top-p, sequence TIS: less of the trainer's own reward",
            f"{p} · sequence_tis",
            f"{p} · none",
            "trainer_reward",
            "a < b",
        ),
        Verdict("top-p, sequence TIS: far less KL", f"{p} · sequence_tis", f"{p} · none", "trainer_true_kl", "a < b"),
        Verdict(
            "top-p, sequence TIS against none, in the score",
            f"{p} · sequence_tis",
            f"{p} · none",
            "score",
            "not resolved",
        ),
        Verdict(
            "top-p, sequence TIS against none, in the served score",
            f"{p} · sequence_tis",
            f"{p} · none",
            "served score",
            "not resolved",
        ),
        Verdict(
            "top-p, the replayed mask: the untruncated policy drifts further",
            f"{p} · keep_mask",
            f"{p} · none",
            "trainer_true_kl",
            "a > b",
        ),
        Verdict(
            "top-p, the replayed mask scores lower (trainer's policy)",
            f"{p} · keep_mask",
            f"{p} · none",
            "score",
            "a < b",
        ),
        Verdict(
            "top-p, the replayed mask scores lower (the served policy)",
            f"{p} · keep_mask",
            f"{p} · none",
            "served score",
            "a < b",
        ),
    ]
    return tuple(out)


#: Lesson 08's comparisons (16 seeds), as the lesson states them (§6).
MISMATCH_VERDICTS: tuple[Verdict, ...] = _mismatch_verdicts()
