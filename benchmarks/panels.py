"""Latency of every panel in the suite: from a control change to a finished redraw.

Every ``Panel`` subclass in the modules of ``klviz.widgets`` that can be built with no arguments
(besides ``device``) is found by importing those modules, built at its default settings, and given
``--changes`` control changes (default 30): each control in turn moves one step from its default
and back. For each change two parts are timed:

- **compute**: what the panel reports as ``last_compute_ms`` (its pure ``compute`` plus updating
  the artists and the readout);
- **draw**: the panel's own redraw, as it reports it in ``last_draw_ms``: composing the frame in
  the Agg buffer (only the changed artists over a kept background when the axes, ticks and the set
  of artists look as in a view seen before, else a render of the axes) and encoding the PNG that the
  panel's ``ipywidgets.Image`` sends to the page, as in a notebook.

torch runs on as many threads as in a lesson's kernel (``klviz.setup_notebook`` uses one thread on
machines with two cores or fewer); the header shows the count.

Each change is made as a reader's control makes it (``widget.value = ...``; the panel's observer
updates it). A panel that trains a model (the RLHF lab) answers such a change at once and trains in a
background thread; the script waits for that run before the next change and reports how long runs
took on a line of their own.

Printed per panel: median and p95 of compute + draw, the median of each part and which part is the
slowest, how many changes needed a full render (a view not seen before: new axis limits, a new
legend; the rest redraw only what changed over a kept background) and their median, and whether
the panel's status line shows the latest update time. Target on the 2-core
CPU: median <= 50 ms and p95 <= 100 ms.

    python benchmarks/panels.py                      # every panel, 30 changes each
    python benchmarks/panels.py --only StartHerePanel --changes 10
"""

from __future__ import annotations

import importlib
import inspect
import os
import pkgutil
import re
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import matplotlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import make_parser, median, p95, parse_args, positive_int, print_header, print_table  # noqa: E402

TARGET_MEDIAN_MS = 50.0
TARGET_P95_MS = 100.0


@dataclass
class PanelResult:
    name: str
    build_ms: float = float("nan")
    compute_ms: list[float] = field(default_factory=list)
    draw_ms: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    status_ok: bool = True
    changes: list[str] = field(default_factory=list)
    full_render: list[bool] = field(default_factory=list)
    background_s: list[float] = field(default_factory=list)
    failure: str | None = None

    @property
    def total_ms(self) -> list[float]:
        return [c + d for c, d in zip(self.compute_ms, self.draw_ms)]


def discover_panels() -> tuple[list[type], list[str]]:
    """Panel subclasses defined in ``klviz.widgets.*`` that need no constructor argument but ``device``."""
    import klviz.widgets
    from klviz.widgets.base import Panel

    found: list[type] = []
    problems: list[str] = []
    for info in sorted(pkgutil.iter_modules(klviz.widgets.__path__), key=lambda m: m.name):
        module_name = f"klviz.widgets.{info.name}"
        try:
            module = importlib.import_module(module_name)
        except Exception as err:  # noqa: BLE001 - reported, the other panels still run
            problems.append(f"{module_name}: import failed: {type(err).__name__}: {err}")
            continue
        for obj in vars(module).values():
            if (
                inspect.isclass(obj)
                and issubclass(obj, Panel)
                and obj is not Panel
                and obj.__module__ == module_name
                and not inspect.isabstract(obj)
                and _buildable_without_arguments(obj)
            ):
                found.append(obj)
    return found, problems


def _buildable_without_arguments(cls: type) -> bool:
    try:
        params = inspect.signature(cls).parameters.values()
    except (TypeError, ValueError):
        return False
    return all(p.default is not inspect.Parameter.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params)


def neighbour_value(widget: Any) -> Any:
    """A value one step away from the widget's current one, up if it can (None if it has no other value)."""
    from klviz.widgets.ahead import neighbours

    found = neighbours(widget)
    return found[0] if found else None


def change_plan(panel: Any, changes: int) -> list[tuple[str, Any]]:
    """``changes`` control changes near the defaults: each control one step away, then back."""
    moves = []
    for name, widget in panel.controls.items():
        other = neighbour_value(widget)
        if other is not None and other != widget.value:
            moves.append((name, other, widget.value))
    plan: list[tuple[str, Any]] = []
    i = 0
    while moves and len(plan) < changes:
        name, other, default = moves[(i // 2) % len(moves)]
        plan.append((name, other if i % 2 == 0 else default))
        i += 1
    return plan


_STATUS_MS = re.compile(r"compute\s+([0-9.]+)\s*ms")


def benchmark_panel(cls: type, device: Any, changes: int) -> PanelResult:
    result = PanelResult(cls.__name__)
    try:
        t0 = time.perf_counter()
        panel = cls(device=device) if "device" in inspect.signature(cls).parameters else cls()
        result.build_ms = (time.perf_counter() - t0) * 1e3
        if panel.last_error is not None:
            result.errors.append(f"at defaults: {type(panel.last_error).__name__}: {panel.last_error}")
        for name, value in change_plan(panel, changes):
            result.changes.append(f"{name}={value!r}")
            panel.controls[name].value = value  # as the reader's control does: its observer updates
            if panel.last_error is not None:
                result.errors.append(f"{name}={value!r}: {type(panel.last_error).__name__}: {panel.last_error}")
            result.compute_ms.append(panel.last_compute_ms)
            result.draw_ms.append(panel.last_draw_ms)
            frames = getattr(panel, "_frames", None)
            result.full_render.append(not getattr(frames, "last_was_blit", False))
            run = getattr(panel, "background_run", None)
            if run is not None and run.active:  # the panel answered and trains in the background
                t_bg = time.perf_counter()
                panel.wait()
                result.background_s.append(time.perf_counter() - t_bg)
            shown = _STATUS_MS.search(getattr(getattr(panel, "status", None), "value", "") or "")
            if shown is None or abs(float(shown.group(1)) - panel.last_compute_ms) > 0.06:
                result.status_ok = False
        import matplotlib.pyplot as plt

        plt.close(panel.fig)
    except Exception as err:  # noqa: BLE001 - one broken panel must not hide the others
        result.failure = f"{type(err).__name__}: {err}\n{traceback.format_exc(limit=3)}"
    return result


def _threads_as_in_the_notebooks() -> None:
    """Use the torch thread count a lesson's kernel uses (``klviz.setup_notebook`` sets it)."""
    try:
        from klviz.notebook import use_one_thread_on_small_machines
    except ImportError:  # older klviz: the kernel keeps torch's default
        return
    use_one_thread_on_small_machines()


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__.splitlines()[0], repeat=1)
    parser.add_argument("--changes", type=positive_int, default=30, help="control changes per panel")
    parser.add_argument("--only", nargs="*", default=None, metavar="CLASS", help="only these panel classes")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    args = parse_args(parser, argv)
    matplotlib.use("agg")
    _threads_as_in_the_notebooks()

    panels, problems = discover_panels()
    if args.only:
        panels = [cls for cls in panels if cls.__name__ in args.only]
    print_header(
        "panels: control change -> finished redraw (compute + draw)", args, changes=args.changes, panels=len(panels)
    )
    for line in problems:
        print(f"   ! {line}")

    results = []
    for cls in panels:
        for _ in range(args.repeat):
            res = benchmark_panel(cls, args.device, args.changes)
            results.append(res)
    rows = []
    missed = bool(problems)
    for res in results:
        if res.failure:
            rows.append([res.name, "FAILED", "", "", "", "", "", "", "", ""])
            missed = True
            continue
        if not res.total_ms:
            rows.append([res.name, "no controls", "", "", "", "", "", "", "", ""])
            continue
        tot, comp, drw = res.total_ms, res.compute_ms, res.draw_ms
        slowest = "compute" if median(comp) >= median(drw) else "draw"
        ok = median(tot) <= TARGET_MEDIAN_MS and p95(tot) <= TARGET_P95_MS and not res.errors
        missed = missed or not ok
        full = [t for t, f in zip(tot, res.full_render) if f]
        rows.append(
            [
                res.name,
                f"{median(tot):.1f}",
                f"{p95(tot):.1f}",
                f"{median(comp):.1f}",
                f"{median(drw):.1f}",
                slowest,
                f"{len(full)}",
                f"{median(full):.1f}" if full else "-",
                "yes" if res.status_ok else "NO",
                "ok" if ok else ("ERRORS" if res.errors else "OVER TARGET"),
            ]
        )
    print_table(
        [
            "panel",
            "median ms",
            "p95 ms",
            "compute ms",
            "draw ms",
            "slowest",
            "full renders",
            "their median",
            "status shows it",
            f"<= {TARGET_MEDIAN_MS:.0f}/{TARGET_P95_MS:.0f}",
        ],
        rows,
    )
    for res in results:
        if res.failure:
            print(f"   ! {res.name} could not be benchmarked: {res.failure}")
        for err in res.errors[:3]:
            print(f"   ! {res.name} showed an error: {err}")
        if not res.failure:
            worst = max(range(len(res.total_ms)), key=res.total_ms.__getitem__, default=None)
            if worst is not None:
                print(
                    f"   {res.name}: built in {res.build_ms:.0f} ms; slowest change {res.changes[worst]} "
                    f"({res.compute_ms[worst]:.1f} + {res.draw_ms[worst]:.1f} ms)"
                )
            if res.background_s:
                print(
                    f"   {res.name}: {len(res.background_s)} changes started a training run in the background "
                    f"(the panel answered at once, as timed above); the runs then took "
                    f"{min(res.background_s):.1f}-{max(res.background_s):.1f} s "
                    f"(median {median(res.background_s):.1f} s)"
                )
    return 1 if args.strict and missed else 0


if __name__ == "__main__":
    sys.exit(main())
