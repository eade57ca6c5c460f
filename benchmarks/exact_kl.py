"""Exact KL over a 50k vocabulary: ``klviz.exact_kl`` against the one-liner everybody writes.

The baseline is the full-vocabulary KL as TRL (legacy) and ROLL compute it:

    F.kl_div(F.log_softmax(p, -1), F.log_softmax(q, -1), log_target=True, reduction="none").sum(-1)

which is KL(softmax(q) || softmax(p)) per row, with three full-size temporaries. ``klviz.exact_kl(q, p)``
computes the same numbers in row chunks. Printed: median time and peak extra memory of each, as
ratios to the baseline, and the largest relative difference between the two results.

Targets on the 2-core CPU, [4096, 50257] float32 logits: <= 0.8x the time and <= 0.25x the peak
extra memory of the baseline, agreeing to 1e-4 relative.

Peak extra memory is measured in a fresh process per method (CPU: growth of the resident-set
high-water mark; CUDA: the allocator's peak), after the inputs exist and after a small warm-up.

    python benchmarks/exact_kl.py                        # 4096 x 50257, float32
    python benchmarks/exact_kl.py --rows 8 --vocab 1000 --repeat 3 --device cuda
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (
    child_peak_memory,
    fmt_mib,
    fmt_ms,
    fmt_ratio,
    make_parser,
    median,  # noqa: E402
    parse_args,
    peak_memory_in_child,
    positive_int,
    print_header,
    print_table,
    ratio_median,
    rounds,
    verdict,
)

import klviz  # noqa: E402

TARGET_TIME = 0.8
TARGET_MEMORY = 0.25
TARGET_AGREEMENT = 1e-4


def baseline_kl(q_logits: torch.Tensor, p_logits: torch.Tensor) -> torch.Tensor:
    """KL(softmax(q) || softmax(p)) per row, the straightforward way (full-size temporaries)."""
    return F.kl_div(F.log_softmax(p_logits, -1), F.log_softmax(q_logits, -1), log_target=True, reduction="none").sum(-1)


def make_logits(rows: int, vocab: int, scale: float, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Two [rows, vocab] float32 logit matrices, N(0, scale²), built in place (no temporaries)."""
    gen = klviz.make_generator(0, device)
    q = torch.randn(rows, vocab, generator=gen, device=device).mul_(scale)
    p = torch.randn(rows, vocab, generator=gen, device=device).mul_(scale)
    return q, p


def methods(q: torch.Tensor, p: torch.Tensor) -> dict[str, object]:
    return {"F.kl_div": lambda: baseline_kl(q, p), "klviz": lambda: klviz.exact_kl(q, p)}


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__.splitlines()[0], repeat=5)
    parser.add_argument("--rows", type=positive_int, default=4096, help="positions (rows of logits)")
    parser.add_argument("--vocab", type=positive_int, default=50257, help="vocabulary size")
    parser.add_argument("--scale", type=float, default=2.0, help="standard deviation of the random logits")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    parser.add_argument("--child", choices=("F.kl_div", "klviz"), help=argparse.SUPPRESS)
    args = parse_args(parser, argv)
    size_argv = [
        "--device",
        str(args.device),
        "--rows",
        str(args.rows),
        "--vocab",
        str(args.vocab),
        "--scale",
        str(args.scale),
    ]

    if args.child:
        q, p = make_logits(args.rows, args.vocab, args.scale, args.device)
        methods(q[:2], p[:2])[args.child]()  # warm-up on two rows: code paths, not data
        child_peak_memory(methods(q, p)[args.child], args.device)
        return 0

    gib = 2 * args.rows * args.vocab * 4 / 2**30
    print_header(
        "exact_kl: exact KL(q || p) over the vocabulary vs F.kl_div on log_softmax",
        args,
        logits=f"2 x [{args.rows}, {args.vocab}] float32 ({gib:.2f} GiB)",
        scale=args.scale,
    )
    memory = {}
    if not args.no_memory:  # before the timing, so the parent's inputs do not sit beside the children's
        for name in ("F.kl_div", "klviz"):
            memory[name] = peak_memory_in_child(os.path.abspath(__file__), [*size_argv, "--child", name])

    q, p = make_logits(args.rows, args.vocab, args.scale, args.device)
    ours, ref = klviz.exact_kl(q, p), baseline_kl(q, p)
    positive = ref.abs() > 0
    rel = ((ours - ref).abs()[positive] / ref.abs()[positive]).max().item() if bool(positive.any()) else 0.0
    del ours, ref
    times = rounds(methods(q, p), args.repeat, args.device)

    base = "F.kl_div"
    rows = []
    for name, ts in times.items():
        mem_ratio = fmt_ratio(memory[name] / memory[base]) if memory and memory[base] > 0 else "-"
        rows.append(
            [
                name,
                fmt_ms(median(ts)),
                fmt_ratio(ratio_median(ts, times[base])),
                fmt_mib(memory[name]) if memory else "-",
                mem_ratio,
            ]
        )
    print_table(["method", "median time", "time / F.kl_div", "peak extra memory", "memory / F.kl_div"], rows)

    t_ratio = ratio_median(times["klviz"], times[base])
    print(f"   time   klviz / F.kl_div = {t_ratio:.2f}x  (target <= {TARGET_TIME}x): {verdict(t_ratio, TARGET_TIME)}")
    missed = t_ratio > TARGET_TIME
    if memory:
        m_ratio = memory["klviz"] / memory[base] if memory[base] > 0 else float("nan")
        print(
            f"   memory klviz / F.kl_div = {m_ratio:.3f}x  (target <= {TARGET_MEMORY}x): "
            f"{verdict(m_ratio, TARGET_MEMORY)}"
        )
        missed = missed or not m_ratio <= TARGET_MEMORY
    agree = rel <= TARGET_AGREEMENT
    print(
        f"   largest relative difference between the two results: {rel:.2e} "
        f"(target <= {TARGET_AGREEMENT:g}): {'ok' if agree else 'MISMATCH'}"
    )
    if not agree:
        return 1
    return 1 if args.strict and missed else 0


if __name__ == "__main__":
    sys.exit(main())
