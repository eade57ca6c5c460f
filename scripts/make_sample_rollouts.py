"""Make klviz/data/sample_rollouts.npz: a rollout dump from the tiny language model (klviz.lm).

Usage: python scripts/make_sample_rollouts.py [--seed 0] [--out klviz/data/sample_rollouts.npz]

The batch is what an RL trainer holds just before its update: responses sampled from the
**old** policy (every prompt of ``klviz.lm.PROMPTS`` repeated), rescored by

- ``logprob``: the old policy itself (verl's ``old_log_probs``; the policy on the first minibatch),
- ``ref_logprob``: the frozen reference model,
- ``new_logprob``: the policy after the shipped update steps (a second PPO epoch: same tokens, newer
  policy); diagnose it with ``klviz diagnose --logprob-key new_logprob --old-key logprob``,

plus ``response_mask`` (1 on response tokens up to and including EOS) and ``input_ids`` (the
character ids, so a lesson can show which tokens stand out). Same seed, same file (on one CPU type).

It also writes ``klviz/data/sample_rollouts_mismatch.npz``: the same kind of batch sampled by a
rollout *engine* of the old policy that differs the way real engines do (bfloat16 numerics, top-p
0.8; ``klviz.mismatch``), with the engine's log-probs as ``rollout_logprob`` and the float32
trainer's recompute as ``logprob`` (``old_log_prob``): ``klviz diagnose`` then reports the mismatch.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from klviz import lm, mismatch
from klviz.devices import make_generator

ROOT = Path(__file__).resolve().parents[1]
REPEATS = 12
MAX_NEW_TOKENS = 48


def make(seed: int = 0) -> dict[str, np.ndarray]:
    torch.set_num_threads(1)
    ref, old, new = (lm.load_tiny_lm(s) for s in ("ref", "old", "new"))
    prompts = [p for p in lm.PROMPTS for _ in range(REPEATS)]
    ro = lm.sample_rollouts(old, prompts, make_generator(seed), max_new_tokens=MAX_NEW_TOKENS)
    mask = ro.response_mask.bool()
    out = {
        "logprob": lm.logprobs_of(old, ro),
        "ref_logprob": lm.logprobs_of(ref, ro),
        "new_logprob": lm.logprobs_of(new, ro),
    }
    arrays = {k: torch.where(mask, v, torch.zeros(())).float().numpy() for k, v in out.items()}
    arrays["response_mask"] = mask.numpy().astype(np.int8)
    arrays["input_ids"] = ro.input_ids.numpy().astype(np.int8)
    return arrays


#: The engine of the mismatched sample: what a vLLM-style engine in bf16 with nucleus sampling does.
MISMATCH_ENGINE = mismatch.EngineSpec(precision="bfloat16", top_p=0.8)


def make_mismatched(seed: int = 0) -> dict[str, np.ndarray]:
    torch.set_num_threads(1)
    ref, old = lm.load_tiny_lm("ref"), lm.load_tiny_lm("old")
    prompts = [p for p in lm.PROMPTS for _ in range(REPEATS)]
    batch = mismatch.sample_engine(old, prompts, make_generator(seed), MISMATCH_ENGINE, max_new_tokens=MAX_NEW_TOKENS)
    ro, mask = batch.rollouts, batch.mask.bool()
    out = {
        "logprob": mismatch.trainer_logprobs(old, batch),
        "rollout_logprob": batch.engine_logprob,
        "ref_logprob": lm.logprobs_of(ref, ro),
    }
    arrays = {k: torch.where(mask, v, torch.zeros(())).float().numpy() for k, v in out.items()}
    arrays["response_mask"] = mask.numpy().astype(np.int8)
    arrays["input_ids"] = ro.input_ids.numpy().astype(np.int8)
    return arrays


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=ROOT / "klviz" / "data" / "sample_rollouts.npz")
    args = ap.parse_args()
    for out, arrays in (
        (args.out, make(args.seed)),
        (args.out.with_name(args.out.stem + "_mismatch.npz"), make_mismatched(args.seed)),
    ):
        np.savez_compressed(out, **arrays)
        size = out.stat().st_size
        shape = arrays["logprob"].shape
        print(
            f"wrote {out} ({size / 1024:.0f} KiB): batch {shape[0]}, tokens {shape[1]}, "
            f"{int(arrays['response_mask'].sum())} response tokens"
        )


if __name__ == "__main__":
    main()
