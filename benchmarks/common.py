"""What every benchmark script shares: arguments, timing with a baseline in the same run, printing.

The scripts print measured figures, each as a ratio against a baseline timed in the same process
and in the same rounds: a round runs every method once (in rotating order), and the ratio reported
is the median over rounds of (method time / baseline time). A busy machine slows both sides of a
round alike, so the ratio is much steadier than either time.

Run a script from the repository root, e.g. ``python benchmarks/estimator_stats.py --repeat 9``.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from klviz.devices import describe_device, resolve_device

__all__ = [
    "make_parser",
    "parse_args",
    "positive_int",
    "sync",
    "time_once",
    "rounds",
    "median",
    "p95",
    "ratio_median",
    "print_header",
    "print_table",
    "fmt_ms",
    "fmt_ratio",
    "fmt_mib",
    "verdict",
    "child_peak_memory",
    "peak_memory_in_child",
]


def make_parser(description: str, *, repeat: int = 7) -> argparse.ArgumentParser:
    """A parser with the options every benchmark takes: ``--device`` and ``--repeat``."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument(
        "--device", default="cpu", help="where tensors live: cpu, cuda, cuda:1 (cuda needs a visible GPU)"
    )
    parser.add_argument(
        "--repeat",
        type=_positive_int,
        default=repeat,
        help="timed rounds per method (the median is reported); one warm-up round comes first",
    )
    return parser


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> argparse.Namespace:
    """Parse, and turn ``--device`` into a ``torch.device`` (exit with a clear message if absent)."""
    args = parser.parse_args(argv)
    try:
        args.device = resolve_device(args.device)
    except ValueError as err:
        parser.error(f"--device: {err}")
    return args


def _positive_int(text: str) -> int:
    value = int(float(text))  # accepts 1e7
    if value <= 0 or value != float(text):
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


positive_int = _positive_int


def sync(device: torch.device) -> None:
    """Wait for queued GPU work, so that a timer measures the work and not just its launch."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_once(fn: Callable[[], object], device: torch.device) -> float:
    """Seconds taken by one call of ``fn`` (synchronised on CUDA before and after)."""
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


def rounds(
    methods: dict[str, Callable[[], object]], repeat: int, device: torch.device, warmup: int = 1
) -> dict[str, list[float]]:
    """Time each method once per round for ``warmup + repeat`` rounds; return the timed rounds.

    The order rotates from round to round so that no method always runs first (on a warm cache)
    or last (after the others have heated the CPU).
    """
    names = list(methods)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(warmup + repeat):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            t = time_once(methods[name], device)
            if r >= warmup:
                times[name].append(t)
    return times


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def p95(xs: list[float]) -> float:
    """The 95th percentile (linear interpolation between order statistics)."""
    s = sorted(xs)
    if len(s) == 1:
        return s[0]
    pos = 0.95 * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def ratio_median(times: list[float], baseline: list[float]) -> float:
    """Median over rounds of time / baseline time (rounds paired by index)."""
    return statistics.median(t / b for t, b in zip(times, baseline))


def fmt_ms(seconds: float) -> str:
    return f"{seconds * 1e3:9.1f} ms"


def fmt_ratio(r: float) -> str:
    return f"{r:6.2f}x"


def verdict(value: float, target: float) -> str:
    return "ok" if value <= target else "OVER TARGET"


def print_header(title: str, args: argparse.Namespace, **extra: object) -> None:
    """The context a figure needs to mean something: machine, device, threads, load, versions."""
    print(f"== {title}")
    load = ""
    if hasattr(os, "getloadavg"):
        load = " · load average {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())
    print(
        f"   device {describe_device(args.device)} · torch {torch.__version__} · python "
        f"{platform.python_version()} · {os.cpu_count()} CPUs{load}"
    )
    settings = " · ".join(f"{k} {v}" for k, v in {"repeat": args.repeat, **extra}.items())
    print(f"   {settings}")
    sys.stdout.flush()


def print_table(header: list[str], rows: list[list[str]]) -> None:
    """A plain fixed-width table (first column left-aligned, the rest right-aligned)."""
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        first = str(cells[0]).ljust(widths[0])
        rest = [str(c).rjust(w) for c, w in zip(cells[1:], widths[1:])]
        return "   " + "  ".join([first, *rest])

    print(line(header))
    print("   " + "  ".join("-" * w for w in widths))
    for row in rows:
        print(line(row))
    sys.stdout.flush()


# -- peak memory ------------------------------------------------------------------------------
# CPU: PyTorch's allocator is invisible to tracemalloc, so the peak is read from the kernel: a fresh
# process builds its inputs, resets its resident-set high-water mark (VmHWM, by writing 5 to
# /proc/self/clear_refs), runs the method once and reports VmHWM minus the resident set before.
# CUDA: the caching allocator's own peak counter, reset before the call.
_MARK = "PEAK_EXTRA_BYTES="


def status_mb(field: str, pid: int | str = "self") -> float:
    """A memory field of ``/proc/PID/status`` (``VmHWM``, ``VmRSS``, ...) in MB (10^6 bytes)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024 / 1e6
    raise RuntimeError(f"{field} not found in /proc/{pid}/status")


def reset_peak(pid: int | str = "self") -> None:
    """Start process ``pid``'s ``VmHWM`` again from its current resident memory (5 to ``clear_refs``)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not found in /proc/self/status")


def child_peak_memory(fn: Callable[[], object], device: torch.device) -> None:
    """In a child process: run ``fn`` once and print its peak extra memory for the parent to read."""
    if device.type == "cuda":
        sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        fn()
        sync(device)
        extra = torch.cuda.max_memory_allocated(device) - before
    else:
        try:
            reset_peak()
        except OSError:  # no reset: the high-water mark may then include input creation
            pass
        before = _status_kib("VmRSS")
        fn()
        extra = (_status_kib("VmHWM") - before) * 1024
    print(f"{_MARK}{max(extra, 0)}", flush=True)


def peak_memory_in_child(script: str, argv: list[str]) -> int:
    """Run ``python script *argv`` in a fresh process and return the peak extra bytes it printed."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    done = subprocess.run([sys.executable, script, *argv], capture_output=True, text=True, env=env)
    for line in done.stdout.splitlines():
        if line.startswith(_MARK):
            return int(line[len(_MARK) :])
    raise RuntimeError(
        f"memory probe {' '.join(argv)} failed (exit {done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
    )


def fmt_mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:9.1f} MiB"
