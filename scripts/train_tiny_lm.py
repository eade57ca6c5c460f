"""Train the tiny language model that klviz ships, and its three RLHF states.

    python scripts/train_tiny_lm.py            # writes klviz/data/tiny_lm_*.pt and tiny_corpus.txt
    python scripts/train_tiny_lm.py --check    # retrain in memory and compare with the shipped files

Everything is reproducible from ``--seed`` (default 0) on a CPU, in about two minutes on 2 cores:

1. **Corpus.** Sentences from a small grammar ("the cat sat on the happy mat."), generated with a
   seeded ``random.Random``; written to ``klviz/data/tiny_corpus.txt``.
2. **Reference.** The GRU of :class:`klviz.lm.TinyLM` trained by next-character cross-entropy on
   the corpus (teacher forcing); saved as ``tiny_lm_ref.pt``.
3. **Old.** The reference after a few REINFORCE steps on :func:`klviz.lm.reward` (positive words
   +1, negative words -1, no EOS -1) with a group-mean baseline and a k1 penalty to the reference in
   the reward, as in RLHF; saved as ``tiny_lm_old.pt``: the policy that samples a rollout batch.
4. **New.** Old's rollout batch (:func:`klviz.lm.update_batch`) reused for several update steps,
   like PPO's inner loop: loss = -token-mean(ratio · advantage), ratio = pi_theta / pi_old on old's
   tokens, no clipping and no early stop, so the policy visibly drifts. The intermediate states
   go to ``tiny_lm_path.pt`` (a dict of state_dicts) and the last one to ``tiny_lm_new.pt``.

All files are plain tensors, loadable with ``torch.load(..., weights_only=True)``.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from klviz import lm  # noqa: E402
from klviz.devices import make_generator  # noqa: E402

DATA = ROOT / "klviz" / "data"

SUBJECTS = list(lm.PROMPTS) + ["the teacher", "a fox", "my brother"]
VERBS = ["sat on", "looked at", "ran to", "found", "liked", "saw", "sang to", "walked past", "painted"]
NOUNS = ["mat", "tree", "garden", "house", "song", "ball", "river", "hill", "cake", "moon", "door"]
NEUTRAL_ADJ = ["big", "little", "red", "old", "green", "quiet", "tall", "round"]
ADJECTIVES = NEUTRAL_ADJ + list(lm.POSITIVE_WORDS) + list(lm.NEGATIVE_WORDS)
ENDINGS = ["", "", "", " in the morning", " at night", " again", " with a smile", " and went home"]


def make_corpus(n: int, rng: random.Random) -> list[str]:
    """``n`` sentences "<subject> <verb> the/a [adjective] <noun>[ ending]." from the grammar."""
    lines = []
    for _ in range(n):
        det = rng.choice(["the", "a"])
        adj = rng.choice(ADJECTIVES) + " " if rng.random() < 0.7 else ""
        noun = rng.choice(NOUNS)
        if det == "a" and (adj or noun)[0] in "aeiou":
            det = "an"
        lines.append(f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {det} {adj}{noun}{rng.choice(ENDINGS)}.")
    return lines


def batch_of(lines: list[str]) -> torch.Tensor:
    """[B, T] ids: BOS, the sentence, EOS, right-padded with PAD."""
    seqs = [[lm.BOS_ID] + lm.encode(s) + [lm.EOS_ID] for s in lines]
    width = max(map(len, seqs))
    out = torch.full((len(seqs), width), lm.PAD_ID, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = torch.tensor(s)
    return out


def train_reference(corpus: list[str], steps: int, rng: random.Random) -> lm.TinyLM:
    model = lm.TinyLM()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    for step in range(steps):
        ids = batch_of(rng.sample(corpus, 128))
        logits = model(ids[:, :-1])
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), ignore_index=lm.PAD_ID
        )
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 200 == 0 or step == steps - 1:
            print(f"  ref step {step:4d}  cross-entropy {loss.item():.3f} nats/char")
    return model


def _trainable_copy(model: lm.TinyLM) -> lm.TinyLM:
    copy = lm.TinyLM()
    copy.load_state_dict(model.state_dict())
    return copy.train().requires_grad_(True)


def reinforce(ref: lm.TinyLM, steps: int, seed: int, kl_coef: float = 0.1) -> lm.TinyLM:
    """REINFORCE with a per-prompt group baseline; k1 to the reference subtracted from the reward."""
    policy = _trainable_copy(ref)
    opt = torch.optim.Adam(policy.parameters(), lr=1e-3)
    gen = make_generator(seed)
    prompts = [p for p in lm.PROMPTS for _ in range(8)]  # 8 responses per prompt (a group)
    for step in range(steps):
        sampler = _frozen(policy)
        ro = lm.sample_rollouts(sampler, prompts, gen, max_new_tokens=48)
        ref_lp = lm.logprobs_of(ref, ro)
        mask = ro.response_mask
        seq_k1 = ((ro.logprobs - ref_lp) * mask).sum(1)  # k1 of KL(pi || ref), per sequence
        r = lm.reward(ro.responses, ro.finished) - kl_coef * seq_k1
        grouped = r.view(len(lm.PROMPTS), 8)
        adv = (grouped - grouped.mean(1, keepdim=True)).view(-1)
        logp = lm.logprobs_of(policy, ro)
        loss = -((adv[:, None] * logp * mask).sum() / mask.sum())
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
        opt.step()
        if step % 10 == 0 or step == steps - 1:
            print(
                f"  old step {step:3d}  mean reward {lm.reward(ro.responses, ro.finished).mean():+.3f}  "
                f"seq k1 to ref {seq_k1.mean():.3f}"
            )
    return _frozen(policy)


def _frozen(model: lm.TinyLM) -> lm.TinyLM:
    out = lm.TinyLM()
    out.load_state_dict({k: v.detach().clone() for k, v in model.state_dict().items()})
    return out.eval().requires_grad_(False)


def inner_updates(old: lm.TinyLM, steps: int, lr: float) -> list[lm.TinyLM]:
    """PPO-like inner loop on old's batch, unclipped: the states after each step (old first)."""
    ro = lm.update_batch(old)
    r = lm.reward(ro.responses, ro.finished)
    adv = (r - r.mean()) / (r.std() + 1e-6)
    mask = ro.response_mask
    policy = _trainable_copy(old)
    opt = torch.optim.Adam(policy.parameters(), lr=lr)
    states = [_frozen(policy)]
    for step in range(steps):
        logp = lm.logprobs_of(policy, ro)
        ratio = torch.exp((logp - ro.logprobs) * mask)
        loss = -((ratio * adv[:, None] * mask).sum() / mask.sum())
        opt.zero_grad()
        loss.backward()
        opt.step()
        states.append(_frozen(policy))
        with torch.no_grad():
            d = (lm.logprobs_of(policy, ro) - ro.logprobs) * mask
            print(
                f"  update {step + 1:2d}  approx_kl (½Δ², token mean) {(0.5 * d**2).sum() / mask.sum():.4f}  "
                f"ppo_kl (k1) {(-d).sum() / mask.sum():+.4f}"
            )
    return states


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ref-steps", type=int, default=800)
    ap.add_argument("--old-steps", type=int, default=30)
    ap.add_argument("--update-steps", type=int, default=10)
    ap.add_argument("--update-lr", type=float, default=1e-3)
    ap.add_argument("--out", type=Path, default=DATA)
    ap.add_argument("--check", action="store_true", help="compare with the shipped files instead of writing")
    args = ap.parse_args(argv)
    torch.manual_seed(args.seed)  # parameter initialisation
    torch.set_num_threads(1)  # tiny matrices: one thread is fastest and reproducible
    rng = random.Random(args.seed)
    t0 = time.perf_counter()
    corpus = make_corpus(4000, rng)
    print(f"corpus: {len(corpus)} sentences, e.g. {corpus[0]!r}")
    ref = _frozen(train_reference(corpus, args.ref_steps, rng))
    old = reinforce(ref, args.old_steps, args.seed + 1)
    path = inner_updates(old, args.update_steps, args.update_lr)
    files = {
        "tiny_lm_ref.pt": ref.state_dict(),
        "tiny_lm_old.pt": old.state_dict(),
        "tiny_lm_new.pt": path[-1].state_dict(),
        "tiny_lm_path.pt": {f"step_{i}": m.state_dict() for i, m in enumerate(path[1:-1], start=1)},
    }
    print(f"trained in {time.perf_counter() - t0:.0f} s")
    if args.check:
        worst = 0.0
        for name, sd in files.items():
            shipped = torch.load(args.out / name, weights_only=True)
            flat_new = sd if name != "tiny_lm_path.pt" else {f"{s}.{k}": v for s, d in sd.items() for k, v in d.items()}
            flat_old = (
                shipped
                if name != "tiny_lm_path.pt"
                else {f"{s}.{k}": v for s, d in shipped.items() for k, v in d.items()}
            )
            worst = max(worst, max(float((flat_new[k] - flat_old[k]).abs().max()) for k in flat_new))
        print(f"largest difference from the shipped weights: {worst:.3g}")
        return 0 if worst < 1e-3 else 1
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "tiny_corpus.txt").write_text("\n".join(corpus) + "\n")
    for name, sd in files.items():
        torch.save(sd, args.out / name)
    print("wrote", ", ".join(files), "and tiny_corpus.txt to", args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
