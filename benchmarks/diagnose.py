"""``klviz diagnose`` on a real-size dump against a plain torch script that reads the same file.

The baseline is what an engineer would write in five minutes: ``torch.load(path, weights_only=True)``,
then the masked means of k1, k2, k3 and of the ratio r, printed. Both run as fresh processes (start-up,
imports, reading and computing all count), in the same rounds; the figures are the median over rounds
of klviz's wall time over the baseline's, and each one's peak resident memory (``VmHWM``, read by the
process itself at exit) with the ratio. klviz runs with ``--logged kl=VALUE``, VALUE being TRL's logged
``kl`` on the dump computed in float32 the way TRL computes it, so the exact identification of a logged
metric (every formula logged as ``kl`` recomputed on the dump) is part of what is timed, and the run fails
unless klviz calls the value equal to TRL's formula (``--no-logged`` times the report alone). Targets:
time ≤ 1.25×, peak memory ≤ 1.3× the baseline's. ``--big`` adds a 4096 × 4096 (16.8M-token) dump, whose peak
must stay under 2 GiB.

Run from the repository root: ``python benchmarks/diagnose.py`` (512 × 4096 float32, 2.1M tokens).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from common import (
    fmt_ratio,
    make_parser,
    median,
    parse_args,
    positive_int,
    print_header,
    print_table,
    ratio_median,
    verdict,
)

ROOT = Path(__file__).resolve().parents[1]
TIME_TARGET, MEMORY_TARGET, BIG_MEMORY_LIMIT = 1.25, 1.3, 2 * 2**30
_PEAK = (
    "import atexit\n"
    "def _peak():\n"
    "    for line in open('/proc/self/status'):\n"
    "        if line.startswith('VmHWM:'):\n"
    "            print('PEAK_KIB=' + line.split()[1], flush=True)\n"
    "atexit.register(_peak)\n"
)
_PLAIN = (
    _PEAK
    + """import sys, torch
d = torch.load(sys.argv[1], weights_only=True)
lp, ref, m = d["logprob"].double(), d["ref_logprob"].double(), d["response_mask"].bool()
lr = (ref - lp)[m]
print("k1", float((-lr).mean()), "k2", float((0.5 * lr * lr).mean()), "k3", float((torch.expm1(lr) - lr).mean()),
      "r", float(lr.exp().mean()))
"""
)
_KLVIZ = (
    _PEAK
    + """import sys
from klviz.cli import main
status = main(["diagnose", *sys.argv[1:]])
sys.exit(status if status in (0, 1) else status)
"""
)


def make_dump(path: Path, batch: int, tokens: int, seed: int = 0) -> tuple[int, float]:
    """A float32 dump like a real batch: log-probs of sampled tokens, a reference nearby, right padding.
    Returns the counted tokens and TRL GRPO's logged ``kl`` on it (k3 token mean, in float32 as TRL computes it)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(tokens // 8, tokens + 1, (batch,), generator=g)
    mask = torch.arange(tokens)[None, :] < lengths[:, None]
    lp = -torch.distributions.Exponential(1.0).sample((batch, tokens))  # log-probs of sampled tokens
    ref = lp + 0.3 * torch.randn(batch, tokens, generator=g) - 0.05
    lp, ref = lp.masked_fill(~mask, 0.0).float(), ref.masked_fill(~mask, 0.0).float()
    torch.save({"logprob": lp, "ref_logprob": ref, "response_mask": mask.to(torch.int8)}, path)
    m = mask.float()
    d = ref - lp  # TRL _compute_loss: exp(ref - logp) - (ref - logp) - 1, then (x * mask).sum() / mask.sum()
    kl = float(((torch.exp(d) - d - 1) * m).sum() / m.sum().clamp(min=1.0))
    return int(mask.sum()), kl


def run(code: str, argv: list[str]) -> tuple[float, int, str]:
    """Wall seconds, peak resident KiB and stdout of ``python -c code argv``."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, env=env, cwd=ROOT)
    wall = time.perf_counter() - t0
    peak = [int(ln.split("=")[1]) for ln in done.stdout.splitlines() if ln.startswith("PEAK_KIB=")]
    if done.returncode not in (0, 1) or not peak:
        raise SystemExit(f"run failed (exit {done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return wall, peak[0], done.stdout


def compare(path: Path, repeat: int, extra: list[str]) -> dict[str, list]:
    methods = {"plain torch": (_PLAIN, [str(path)]), "klviz diagnose": (_KLVIZ, [str(path), *extra])}
    times = {name: [] for name in methods}
    peaks = {name: [] for name in methods}
    names = list(methods)
    for r in range(1 + repeat):  # one warm-up round (page cache, bytecode)
        order = names[r % 2 :] + names[: r % 2]
        for name in order:
            wall, peak, _out = run(*methods[name])
            if r:
                times[name].append(wall)
                peaks[name].append(peak * 1024)
    return {"times": times, "peaks": peaks}


def main() -> int:
    parser = make_parser(__doc__.splitlines()[0], repeat=3)
    parser.add_argument("--batch", type=positive_int, default=512, help="responses in the dump")
    parser.add_argument("--tokens", type=positive_int, default=4096, help="token columns in the dump")
    parser.add_argument("--big", action="store_true", help="also measure a 4096 x 4096 (16.8M-token) dump")
    parser.add_argument("--json", action="store_true", help="time klviz diagnose --json instead of the text report")
    parser.add_argument(
        "--no-logged", action="store_true", help="time the report alone, without --logged kl=VALUE (identification)"
    )
    args = parse_args(parser)
    print_header(
        "klviz diagnose vs a plain torch script (fresh processes: start-up, read, compute)",
        args,
        batch=args.batch,
        tokens=args.tokens,
    )
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "dump.pt"
        n, kl = make_dump(path, args.batch, args.tokens)
        print(
            f"   dump: [{args.batch}, {args.tokens}] float32 .pt, {n:,} counted tokens, "
            f"{path.stat().st_size / 2**20:.1f} MiB"
            + ("" if args.no_logged else f"; klviz identifies --logged kl={kl!r} (TRL's formula, float32)")
        )
        extra = (["--json"] if args.json else []) + ([] if args.no_logged else ["--logged", f"kl={kl!r}"])
        if not args.no_logged:
            _w, _p, out = run(_KLVIZ, [str(path), *extra])
            equal = '"consistent": true' in out if args.json else "kl = " in out and ": equal; equals TRL GRPO" in out
            if not equal:
                raise SystemExit("klviz did not identify TRL's kl on the dump: " + out[-1500:])
        res = compare(path, args.repeat, extra)
        t, p = res["times"], res["peaks"]
        rows = [[name, f"{median(t[name]):.2f} s", f"{median(p[name]) / 2**20:.0f} MiB"] for name in t]
        print_table(["method", "wall (median)", "peak RSS"], rows)
        tr = ratio_median(t["klviz diagnose"], t["plain torch"])
        mr = median(p["klviz diagnose"]) / median(p["plain torch"])
        print(
            f"   klviz / plain torch: time {fmt_ratio(tr)} (target ≤ {TIME_TARGET}x: {verdict(tr, TIME_TARGET)}), "
            f"peak memory {fmt_ratio(mr)} (target ≤ {MEMORY_TARGET}x: {verdict(mr, MEMORY_TARGET)})"
        )
        ok &= tr <= TIME_TARGET and mr <= MEMORY_TARGET
        if args.big:
            big = Path(tmp) / "big.pt"
            n, _kl = make_dump(big, 4096, 4096, seed=1)
            path.unlink()
            wall, peak, _ = run(_KLVIZ, [str(big)])
            pw, pp, _ = run(_PLAIN, [str(big)])
            print(
                f"   big dump [4096, 4096] ({n:,} counted tokens, {big.stat().st_size / 2**20:.0f} MiB): klviz "
                f"{wall:.2f} s, peak {peak / 2**20:.2f} GiB (limit 2 GiB: "
                f"{verdict(peak * 1024, BIG_MEMORY_LIMIT)}); plain torch {pw:.2f} s, peak {pp / 2**20:.2f} GiB"
            )
            ok &= peak * 1024 <= BIG_MEMORY_LIMIT
    print(f"   check: klviz diagnose and the plain script both ran ({'ok' if ok else 'OVER TARGET'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
