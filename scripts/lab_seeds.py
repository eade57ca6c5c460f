"""Train the multi-seed comparisons of lessons 07 and 08 and store them (``klviz/data/*.npz``).

Each run of a store's configs is trained with every seed of the store (16 for lessons 07 and 08) on
the CPU; the per-step metrics, one sampled response per run and the training times go to a small
compressed ``.npz``:

- ``lab``: lesson 07's placements (:data:`klviz.rlhf.LAB_SEED_CONFIGS`) -> ``lab_seeds.npz``;
- ``mismatch``: lesson 08's training through a mismatched engine, every engine with every
  correction (:data:`klviz.rlhf.MISMATCH_SEED_CONFIGS`) -> ``mismatch_seeds.npz``;
- ``lab-check``, ``mismatch-check``: the same runs with seeds no lesson trains with
  (:data:`klviz.rlhf.CHECK_SEEDS`, 100-115) -> ``lab_check_seeds.npz``, ``mismatch_check_seeds.npz``: lessons 07 and
  08 show every verdict on both sets of seeds.

The lessons load the files, state every comparison as mean ± SE over the seeds, and re-run seed 0
of a few configs to check that they reproduce the stored numbers exactly. ``tests/test_rlhf.py``
checks the files against the configs.

``--seeds A-B --out PATH`` trains the same runs with any other seeds into another file; ``benchmarks/lab_verdicts.py``
re-checks every verdict of lessons 07 and 08 on such a file.

Usage: python scripts/lab_seeds.py [lab|mismatch|lab-check|mismatch-check|all] [--seeds A-B] [--out PATH]
(lab: about four minutes on an idle 2-core CPU; mismatch: about fifteen; the check stores as long again)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from klviz import rlhf  # noqa: E402

STORES = {
    "lab": (rlhf.LAB_SEED_CONFIGS, rlhf.LAB_SEEDS, rlhf.LAB_SEED_METRICS, rlhf.LAB_SEEDS_PATH),
    "mismatch": (rlhf.MISMATCH_SEED_CONFIGS, rlhf.MISMATCH_SEEDS, rlhf.MISMATCH_SEED_METRICS, rlhf.MISMATCH_SEEDS_PATH),
    "lab-check": (rlhf.LAB_SEED_CONFIGS, rlhf.CHECK_SEEDS, rlhf.LAB_SEED_METRICS, rlhf.LAB_CHECK_PATH),
    "mismatch-check": (
        rlhf.MISMATCH_SEED_CONFIGS,
        rlhf.CHECK_SEEDS,
        rlhf.MISMATCH_SEED_METRICS,
        rlhf.MISMATCH_CHECK_PATH,
    ),
}


def _seeds(text: str) -> tuple[int, ...]:
    """``"100-115"`` or ``"3,5,8"`` as a tuple of seeds."""
    try:
        if "-" in text:
            first, last = (int(x) for x in text.split("-", 1))
            out = tuple(range(first, last + 1))
        else:
            out = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"seeds must be FIRST-LAST or A,B,...; got {text!r}") from None
    if len(out) < 2:
        raise argparse.ArgumentTypeError(f"a comparison over seeds needs at least two seeds; got {text!r}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("store", nargs="?", choices=[*STORES, "all"], default="all", help="which store to train")
    parser.add_argument("--out", type=Path, help="where to write the .npz (one store only)")
    parser.add_argument("--seeds", type=_seeds, help="seeds instead of the store's own: FIRST-LAST or A,B,C")
    args = parser.parse_args(argv)
    chosen = list(STORES) if args.store == "all" else [args.store]
    if args.out is not None and len(chosen) > 1:
        parser.error("--out needs one store, not all")
    if args.seeds is not None and args.out is None:
        parser.error("--seeds needs --out: the stored files hold the lessons' own seeds")
    t0 = time.perf_counter()

    def progress(name: str, seed: int, seconds: float) -> None:
        print(f"{time.perf_counter() - t0:7.1f} s  {name:<40} seed {seed}: {seconds:.1f} s", flush=True)

    for store in chosen:
        configs, seeds, metrics, path = STORES[store]
        data = rlhf.run_lab_seeds(configs, args.seeds or seeds, progress=progress, metric_names=metrics)
        out = rlhf.save_lab_seeds(data, args.out or path)
        print(f"wrote {out} ({out.stat().st_size / 1024:.0f} kB) in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
