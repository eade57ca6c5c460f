"""Every comparison lessons 07 and 08 state, re-checked on seeds the lessons do not use.

The lessons judge their verdicts (``klviz.rlhf.LAB_VERDICTS`` and ``MISMATCH_VERDICTS``) on the stored runs of
seeds 0-15 by one rule: a paired difference is resolved at 3 standard errors (``klviz.statistics.is_resolved``).
By default it reads the stored runs of the check seeds (``klviz.rlhf.CHECK_SEEDS``, 100-115, which lessons 07 and 08
also show); ``--train A-B`` trains the same runs with yet other seeds first (lab: about 4 minutes, mismatch: 15, on an
idle 2-core CPU), and ``--lab-file``/``--mismatch-file`` read files that ``scripts/lab_seeds.py --seeds ... --out ...``
wrote. It prints each verdict on both seed sets, its difference ± 2 SE and z, and whether what the lesson says holds
(on other seeds, what the lesson says about its check seeds). A verdict that holds on the lesson's seeds and not on
others is a finding to report (it measures how fragile that comparison is), not a failure of this script.

Usage:
  python benchmarks/lab_verdicts.py [lab|mismatch|all] [--train A-B] [--lab-file PATH] [--mismatch-file PATH]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from klviz import rlhf  # noqa: E402
from klviz.statistics import plus_minus  # noqa: E402

STORES = {
    "lab": (rlhf.LAB_SEED_CONFIGS, rlhf.LAB_SEED_METRICS, rlhf.LAB_SEEDS_PATH, rlhf.LAB_CHECK_PATH, rlhf.LAB_VERDICTS),
    "mismatch": (
        rlhf.MISMATCH_SEED_CONFIGS,
        rlhf.MISMATCH_SEED_METRICS,
        rlhf.MISMATCH_SEEDS_PATH,
        rlhf.MISMATCH_CHECK_PATH,
        rlhf.MISMATCH_VERDICTS,
    ),
}


def _seeds(text: str) -> tuple[int, ...]:
    first, _, last = text.partition("-")
    return tuple(range(int(first), int(last) + 1)) if last else tuple(int(x) for x in text.split(","))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("store", nargs="?", choices=[*STORES, "all"], default="all")
    parser.add_argument("--lab-file", type=Path, help="check-seed runs of lesson 07 (scripts/lab_seeds.py lab --out)")
    parser.add_argument("--mismatch-file", type=Path, help="check-seed runs of lesson 08")
    parser.add_argument("--train", type=_seeds, help="train these seeds first (FIRST-LAST or A,B,...)")
    args = parser.parse_args(argv)
    chosen = list(STORES) if args.store == "all" else [args.store]
    summary = []
    for store in chosen:
        configs, metrics, path, check_path, verdicts = STORES[store]
        given = args.lab_file if store == "lab" else args.mismatch_file
        if args.train is not None:
            print(f"training {store} with seeds {args.train[0]}-{args.train[-1]} ...", flush=True)
            other = rlhf.run_lab_seeds(configs, args.train, metric_names=metrics)
        else:
            other = rlhf.load_lab_seeds(given or check_path)
        own = rlhf.load_lab_seeds(path)
        overlap = set(own.seeds) & set(other.seeds)
        if overlap:
            parser.error(f"the check seeds overlap the lesson's: {sorted(overlap)}")
        rows_own, rows_other = rlhf.judge(own, verdicts), rlhf.judge(other, verdicts, check_seeds=True)
        print(f"\n{store}: lesson seeds {own.seeds[0]}-{own.seeds[-1]}, check seeds {other.seeds[0]}-{other.seeds[-1]}")
        print(f"{'verdict':<80}{'says':>14}{'lesson seeds':>34}{'check seeds':>34}")
        for a, b in zip(rows_own, rows_other):
            v = a["verdict"]

            def cell(r: dict, fragile: bool) -> str:
                mark = "fragile" if fragile else ("ok" if r["holds"] else "NO")
                return f"{plus_minus(r['diff'], r['se'], '+.3f')} z={r['z']:+.1f} {mark}"

            print(f"{v.wording[:79]:<80}{v.says:>14}{cell(a, False):>38}{cell(b, v.fragile):>38}")
            summary.append((store, v.wording, a["holds"], b["holds"], v.fragile))
    firm = [s for s in summary if not s[4]]
    print(
        f"\n{sum(s[2] for s in summary)} of {len(summary)} verdicts hold on the lesson's seeds; of the "
        f"{len(firm)} the lessons call firm, {sum(s[3] for s in firm)} hold on the other seeds too."
    )
    for store, wording, _, other, fragile in summary:
        if fragile:
            print(f"  fragile (the lessons say so): [{store}] {wording}")
        elif not other:
            print(f"  does not hold on the other seeds: [{store}] {wording}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
