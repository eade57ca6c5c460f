"""Rollout dumps from TRL's ``GRPOTrainer``, one per rank per optimizer step, checked exactly by ``klviz diagnose``.

::

    from trl import GRPOConfig, GRPOTrainer
    from klviz.integrations.trl import attach

    trainer = GRPOTrainer(model=..., args=GRPOConfig(..., beta=0.04), ...)
    attach(trainer, "kl_dumps")          # or: class MyTrainer(KLDumpMixin, GRPOTrainer)
    trainer.train()

then ``klviz diagnose kl_dumps/`` checks every logged ``kl`` exactly against the dumps of its step.

**What is written.** TRL computes its KL in ``GRPOTrainer._compute_loss`` (release 1.16.0,
``trl/trainer/grpo_trainer.py``): ``per_token_kl = exp(ref - logp) - (ref - logp) - 1``, times
``coef_1 = exp(logp - old)`` with ``use_bias_correction_kl``, and logs ``kl`` as the token mean over
``completion_mask * tool_mask`` of each micro-batch (summed across processes), averaged over the micro-batches
since the last log (``GRPOTrainer.log``). :func:`attach` records, for every micro-batch that reaches
``_compute_loss`` in training (reuse steps of ``num_iterations > 1`` included), exactly the tensors that line
reads: the policy's ``per_token_logps`` (captured from the ``_get_per_token_logps_and_entropies`` call inside
``_compute_loss``, not recomputed), ``ref_per_token_logps``, ``old_per_token_logps`` (present when TRL reuses
or reorders a generation batch; absent means ρ = 1), ``sampling_per_token_logps`` (the vLLM engine's, when
TRL has them), ``completion_ids``, and the mask TRL uses, ``completion_mask * tool_mask``. After the optimizer
step (``on_step_end``) the micro-batches of that step are written as one ``.pt`` per rank,
``kl_dump_step{K}_rank{R}.pt``, whose ``step`` is K, the ``global_step`` TRL logs them under, and whose
``micro_batch`` key says which rows formed which micro-batch. Log-probs keep their dtype (the arithmetic TRL
did). TRL's logged metrics go to ``log_history.jsonl`` beside the dumps (one JSON object per log call, with its
``step``; rank 0 only).

Tokens the engine returned no log-prob for (``sampling_per_token_logps`` holds NaN there, e.g. tool output)
get the trainer's log-prob in ``rollout_logprob`` (no mismatch counted), and their number is stored under
``rollout_logprob_missing``. With ``every=N`` only the steps of every N-th logging window are written (a logged
value averages its whole window, so windows are written whole).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

__all__ = ["attach", "KLDumpMixin", "KLDumpRecorder", "LOG_FILE"]

#: The log-history file written beside the dumps (``klviz diagnose DIR`` reads it by itself).
LOG_FILE = "log_history.jsonl"


class KLDumpRecorder:
    """Collects the micro-batches of the current optimizer step and writes them (see the module docstring)."""

    def __init__(self, out_dir: str | Path, every: int = 1) -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"every must be a positive integer, got {every!r}")
        self.out_dir = Path(out_dir)
        self.every = every
        self.pending: list[dict[str, Any]] = []
        self.capturing = False
        self.captured: Any = None
        self.warned_no_ref = False
        self.written: list[Path] = []

    # -- capture ------------------------------------------------------------------------------------------------
    def record(self, trainer: Any, inputs: dict[str, Any], per_token_logps: Any) -> None:
        """Keep one training micro-batch's tensors (on the CPU, in their own dtype)."""
        ref = inputs.get("ref_per_token_logps")
        if ref is None:
            if not self.warned_no_ref:
                import warnings

                warnings.warn(
                    "klviz.integrations.trl: TRL computes no reference log-probs with beta = 0.0 (its default), so "
                    "there is no KL to dump; set GRPOConfig(beta=...) > 0",
                    stacklevel=2,
                )
                self.warned_no_ref = True
            return
        mask = inputs["completion_mask"]
        if inputs.get("tool_mask") is not None:
            mask = mask * inputs["tool_mask"]
        item = {
            "logprob": per_token_logps.detach().cpu(),
            "ref_logprob": ref.detach().cpu(),
            "response_mask": mask.detach().to("cpu").to(dtype=_torch().int8),
            "token_ids": inputs["completion_ids"].detach().cpu(),
        }
        old = inputs.get("old_per_token_logps")
        if old is not None:
            item["old_logprob"] = old.detach().cpu()
        sampling = inputs.get("sampling_per_token_logps")
        if sampling is not None:
            item["rollout_logprob"] = sampling.detach().cpu()
        self.pending.append(item)

    # -- writing -------------------------------------------------------------------------------------------------
    def wanted(self, step: int, logging_steps: float) -> bool:
        window = max(int(math.ceil(logging_steps)), 1) if logging_steps >= 1 else 1
        return ((step - 1) // window) % self.every == 0

    def flush(self, step: int, rank: int, world_size: int, logging_steps: float = 1) -> Path | None:
        """Write the micro-batches recorded since the last flush as the dump of ``step`` (None if none)."""
        torch = _torch()
        items, self.pending = self.pending, []
        if not items or not self.wanted(step, logging_steps):
            return None
        width = max(it["logprob"].shape[1] for it in items)
        has_old = any("old_logprob" in it for it in items)
        has_ro = any("rollout_logprob" in it for it in items)
        cols: dict[str, list[Any]] = {k: [] for k in ("logprob", "ref_logprob", "response_mask", "token_ids")}
        if has_old:
            cols["old_logprob"] = []
        if has_ro:
            cols["rollout_logprob"] = []
        groups, missing = [], 0
        for g, it in enumerate(items):
            trainer_lp = it.get("old_logprob", it["logprob"])
            if has_old:
                it.setdefault("old_logprob", it["logprob"])  # ρ = 1 in this micro-batch
            if has_ro:
                ro = it.get("rollout_logprob", trainer_lp)
                gap = torch.isnan(ro) & it["response_mask"].bool()
                missing += int(gap.sum())
                it["rollout_logprob"] = torch.where(torch.isnan(ro), trainer_lp.to(ro.dtype), ro)
            for k in cols:
                t = it[k]
                pad = width - t.shape[1]
                if pad:
                    t = torch.nn.functional.pad(t, (0, pad), value=0)
                cols[k].append(t)
            groups.append(torch.full((it["logprob"].shape[0],), g, dtype=torch.int64))
        dump = {k: torch.cat(v, 0) for k, v in cols.items()}
        dump["micro_batch"] = torch.cat(groups)
        dump["step"] = torch.tensor([step], dtype=torch.int64)
        dump["rank"] = torch.tensor([rank], dtype=torch.int64)
        dump["world_size"] = torch.tensor([world_size], dtype=torch.int64)
        if has_ro:
            dump["rollout_logprob_missing"] = torch.tensor([missing], dtype=torch.int64)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        path = self.out_dir / f"kl_dump_step{step}_rank{rank}.pt"
        tmp = path.with_suffix(".pt.tmp")
        torch.save(dump, tmp)
        tmp.replace(path)
        self.written.append(path)
        return path

    def write_log(self, step: int, logs: dict[str, Any]) -> None:
        """Append one log call's numbers (with ``step``) to :data:`LOG_FILE`."""
        record: dict[str, Any] = {"step": step}
        for k, v in logs.items():
            if isinstance(v, bool):
                continue
            if isinstance(v, (int, float)) and math.isfinite(float(v)):
                record[k] = v
        self.out_dir.mkdir(parents=True, exist_ok=True)
        with open(self.out_dir / LOG_FILE, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")


def _torch() -> Any:
    import torch

    return torch


def _callback(recorder: KLDumpRecorder, trainer: Any) -> Any:
    from transformers import TrainerCallback

    class _KLDumpCallback(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            acc = trainer.accelerator
            recorder.flush(state.global_step, acc.process_index, acc.num_processes, args.logging_steps)
            return control

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> Any:
            if state.is_world_process_zero and logs:
                recorder.write_log(state.global_step, logs)
            return control

    return _KLDumpCallback()


def attach(trainer: Any, out_dir: str | Path, every: int = 1) -> KLDumpRecorder:
    """Make ``trainer`` (a TRL ``GRPOTrainer``) write rollout dumps to ``out_dir`` as it trains.

    Wraps the instance's ``_compute_loss`` and ``_get_per_token_logps_and_entropies`` (the policy's log-probs
    are captured from the call TRL makes anyway) and adds a callback that writes each optimizer step's dump
    and the log history. Returns the recorder (``recorder.written`` lists the files). Needs ``beta > 0``.
    """
    if not (hasattr(trainer, "_compute_loss") and hasattr(trainer, "_get_per_token_logps_and_entropies")):
        raise ValueError(
            f"attach expects a TRL GRPOTrainer (with _compute_loss and _get_per_token_logps_and_entropies), "
            f"got {type(trainer).__name__}"
        )
    recorder = KLDumpRecorder(out_dir, every)
    compute_loss = trainer._compute_loss
    get_logps = trainer._get_per_token_logps_and_entropies

    def _get_per_token_logps_and_entropies(*args: Any, **kwargs: Any) -> Any:
        out = get_logps(*args, **kwargs)
        if recorder.capturing:
            recorder.captured = out[0]
        return out

    def _compute_loss(model: Any, inputs: dict[str, Any]) -> Any:
        recorder.capturing, recorder.captured = True, None
        try:
            loss = compute_loss(model, inputs)
        finally:
            recorder.capturing = False
        if trainer.model.training and recorder.captured is not None:
            recorder.record(trainer, inputs, recorder.captured)
        recorder.captured = None
        return loss

    trainer._compute_loss = _compute_loss
    trainer._get_per_token_logps_and_entropies = _get_per_token_logps_and_entropies
    trainer.add_callback(_callback(recorder, trainer))
    return recorder


class KLDumpMixin:
    """The same as :func:`attach`, as a mixin: ``class MyTrainer(KLDumpMixin, GRPOTrainer)`` with
    ``klviz_dump_dir`` (and optionally ``klviz_dump_every``) passed as keyword arguments."""

    def __init__(self, *args: Any, klviz_dump_dir: str | Path = "kl_dumps", klviz_dump_every: int = 1, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.klviz_recorder = attach(self, klviz_dump_dir, klviz_dump_every)
