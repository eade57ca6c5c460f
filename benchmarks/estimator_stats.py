"""How much more than drawing the samples does ``klviz.estimator_stats`` cost?

Three methods on the same number of Gaussian samples, timed round by round in one process:

- ``randn``: ``torch.randn(n)`` alone, the cost of the samples themselves (the baseline);
- ``schulman``: the straightforward script of Schulman's post "Approximating KL Divergence"
  (sample x ~ q, log-probs through ``torch.distributions``, three full-size estimator tensors,
  their mean and std);
- ``klviz``: ``klviz.estimator_stats(q, p, n)`` (one streaming pass in chunks).

Both at q = N(0,1) with p = N(1,1) and with p = N(0.1,1) (where |log r| is mostly below 0.1 and
k3 takes its series branch), all in the same rounds. Targets on the 2-core CPU, for each pair:
klviz <= 2.0x randn (aim 1.5x) and <= 0.7x the Schulman script. Also printed: the peak extra
memory of each method (a fresh process each) and a check that the klviz figures agree with the
closed forms within 5 standard errors.

    python benchmarks/estimator_stats.py                    # 10^7 samples, p = N(1,1) and N(0.1,1)
    python benchmarks/estimator_stats.py --mu 1             # one pair only
    python benchmarks/estimator_stats.py --num-samples 1e5 --repeat 3 --device cuda
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import torch
from torch.distributions import Normal

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

TARGET_VS_RANDN = 2.0
AIM_VS_RANDN = 1.5
TARGET_VS_SCHULMAN = 0.7


def distributions(mu: float, device: torch.device) -> tuple[Normal, Normal]:
    """Sampler q = N(0, 1) and target p = N(mu, 1), parameters on ``device``."""
    zero, one = torch.zeros((), device=device), torch.ones((), device=device)
    return Normal(zero, one), Normal(zero + mu, one)


def schulman_script(q: Normal, p: Normal, n: int) -> dict[str, tuple[float, float]]:
    """The post's recipe, written out plainly: every per-sample quantity is a full-size tensor."""
    x = q.sample((n,))
    log_r = p.log_prob(x) - q.log_prob(x)
    k1 = -log_r
    k2 = log_r**2 / 2
    k3 = (log_r.exp() - 1) - log_r
    return {name: (k.mean().item(), k.std().item()) for name, k in (("k1", k1), ("k2", k2), ("k3", k3))}


def closed_forms(mu: float) -> dict[str, tuple[float, float]]:
    """Mean and single-sample std of k1, k2, k3 for q = N(0,1), p = N(mu,1) (REFERENCE section 2)."""
    m2 = mu * mu
    return {
        "k1": (m2 / 2, math.sqrt(m2)),
        "k2": (m2 / 2 + m2 * m2 / 8, math.sqrt(m2 * m2 / 2 + m2**3 / 4)),
        "k3": (m2 / 2, math.sqrt(math.expm1(m2) - m2)),
    }


def methods(args, mu: float) -> dict[str, object]:
    """The three methods at p = N(mu, 1), keyed ``randn``, ``schulman``, ``klviz``."""
    dev, n = args.device, args.num_samples
    q, p = distributions(mu, dev)
    gen = klviz.make_generator(0, dev)
    torch.manual_seed(0)
    return {
        "randn": lambda: torch.randn(n, generator=gen, device=dev),
        "schulman": lambda: schulman_script(q, p, n),
        "klviz": lambda: klviz.estimator_stats(q, p, n, generator=gen, device=dev),
    }


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__.splitlines()[0], repeat=9)
    parser.add_argument("--num-samples", type=positive_int, default=10**7, help="Gaussian samples per call")
    parser.add_argument(
        "--mu",
        type=float,
        nargs="+",
        default=[1.0, 0.1],
        help="p = N(mu, 1), q = N(0, 1); one pair per value, timed in the same rounds",
    )
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    parser.add_argument("--child", choices=("randn", "schulman", "klviz"), help=argparse.SUPPRESS)
    args = parse_args(parser, argv)
    if args.child:
        # warm up at a tiny size first (code paths, thread pools), so that the peak measures data
        methods(argparse.Namespace(**{**vars(args), "num_samples": 1000}), args.mu[0])[args.child]()
        child_peak_memory(methods(args, args.mu[0])[args.child], args.device)
        return 0

    pairs = ", ".join(f"N({mu:g},1)" for mu in args.mu)
    print_header(
        "estimator_stats: k1, k2, k3 statistics vs the cost of the samples",
        args,
        samples=f"{args.num_samples:,}",
        q="N(0,1)",
        p=pairs,
    )
    # one set of rounds: randn once, then the Schulman script and klviz at each mu
    timed: dict[str, object] = {"randn": methods(args, args.mu[0])["randn"]}
    for mu in args.mu:
        for name, fn in methods(args, mu).items():
            if name != "randn":
                timed[f"{name} mu={mu:g}"] = fn
    times = rounds(timed, args.repeat, args.device)
    memory = {}
    if not args.no_memory:
        for label in times:
            name, _, mu = label.partition(" mu=")
            child_argv = [
                "--device",
                str(args.device),
                "--num-samples",
                str(args.num_samples),
                "--mu",
                mu or str(args.mu[0]),
                "--child",
                name,
            ]
            memory[label] = peak_memory_in_child(os.path.abspath(__file__), child_argv)
    rows = []
    for label, ts in times.items():
        mu = label.partition(" mu=")[2]
        schulman = times.get(f"schulman mu={mu}", times[f"schulman mu={args.mu[0]:g}"])
        rows.append(
            [
                label,
                fmt_ms(median(ts)),
                fmt_ratio(ratio_median(ts, times["randn"])),
                fmt_ratio(ratio_median(ts, schulman)),
                fmt_mib(memory[label]) if memory else "-",
            ]
        )
    print_table(["method", "median time", "/ randn", "/ schulman (same mu)", "peak extra memory"], rows)

    missed = False
    worst_all = 0.0
    for mu in args.mu:
        klviz_t, schulman_t = times[f"klviz mu={mu:g}"], times[f"schulman mu={mu:g}"]
        vs_randn = ratio_median(klviz_t, times["randn"])
        vs_schulman = ratio_median(klviz_t, schulman_t)
        print(
            f"   mu={mu:g}: klviz / randn    = {vs_randn:.2f}x  (target <= {TARGET_VS_RANDN}x, aim "
            f"{AIM_VS_RANDN}x): {verdict(vs_randn, TARGET_VS_RANDN)}"
        )
        print(
            f"   mu={mu:g}: klviz / schulman = {vs_schulman:.2f}x  (target <= {TARGET_VS_SCHULMAN}x): "
            f"{verdict(vs_schulman, TARGET_VS_SCHULMAN)}"
        )
        missed = missed or vs_randn > TARGET_VS_RANDN or vs_schulman > TARGET_VS_SCHULMAN

        # the fast path must still be right: compare with the closed forms
        q, p = distributions(mu, args.device)
        stats = klviz.estimator_stats(q, p, args.num_samples, generator=klviz.make_generator(1, args.device))
        exact = closed_forms(mu)
        for k in ("k1", "k2", "k3"):
            se = stats[k]["std"] / math.sqrt(args.num_samples)
            worst_all = max(worst_all, abs(stats[k]["mean"] - exact[k][0]) / se if se > 0 else 0.0)
    print(
        f"   check: klviz means within {worst_all:.1f} standard errors of the closed forms "
        f"({'ok' if worst_all < 5 else 'MISMATCH'})"
    )
    if worst_all >= 5:
        return 1
    return 1 if args.strict and missed else 0


if __name__ == "__main__":
    sys.exit(main())
