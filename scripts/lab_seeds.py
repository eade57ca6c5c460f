"""Train lesson 07's comparisons with every seed and store them (``klviz/data/lab_seeds.npz``).

Each run of :data:`klviz.rlhf.LAB_SEED_CONFIGS` is trained with every seed of
:data:`klviz.rlhf.LAB_SEEDS` on the CPU; the per-step metrics, one sampled response per run and the
training times go to a small compressed ``.npz``. Lesson 07 loads the file, states every comparison
as mean ± SE over the seeds, and re-runs seed 0 of two configs to check that they reproduce the
stored numbers exactly. ``tests/test_rlhf.py`` checks the file against the configs.

Usage: python scripts/lab_seeds.py [--out PATH]     (about two minutes on a 2-core CPU)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from klviz import rlhf  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=rlhf.LAB_SEEDS_PATH, help="where to write the .npz")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()

    def progress(name: str, seed: int, seconds: float) -> None:
        print(f"{time.perf_counter() - t0:7.1f} s  {name:<40} seed {seed}: {seconds:.1f} s", flush=True)

    data = rlhf.run_lab_seeds(progress=progress)
    out = rlhf.save_lab_seeds(data, args.out)
    print(f"wrote {out} ({out.stat().st_size / 1024:.0f} kB) in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
