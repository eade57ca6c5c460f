"""Where a lesson's memory goes: each cell's peak, and each panel control's, in one IPython shell.

A quick companion to ``lesson_memory.py`` (which measures the kernel in JupyterLab, as a class uses
it, and is the number to report): no server, no browser. The lesson's code cells run one after another
in an IPython shell (figures closed after each cell, as the inline backend closes them; outputs kept in
``Out`` as a kernel keeps them), the process started with the allocator settings klviz's servers give kernels
(``klviz.servers.KERNEL_MALLOC``). Before each cell the peak resident memory is reset
(``/proc/self/clear_refs``), so each line shows the most that cell held (``VmHWM``) and what stayed
resident after it (``VmRSS``). Then every panel the lesson made is walked as ``lesson_memory.py`` walks
it: each slider to its end, its start, its end and one step back, each option of each selection. Drawing
ahead does not run outside a kernel, so the frames it keeps are not counted here.

    python benchmarks/lesson_memory_cells.py 01          # a lesson by number or name prefix
    python benchmarks/lesson_memory_cells.py 01 --top 8  # only the 8 cells that peak highest

Linux only (``/proc``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _moves(control) -> list[object]:
    """The values a student's walk gives a control, in order (as ``lesson_memory.walk_controls``)."""
    import ipywidgets as widgets

    if isinstance(control, (widgets.SelectionSlider,)):
        opts = [v[1] if isinstance(v, tuple) else v for v in control._options_full]
        return [opts[-1], opts[0], opts[-1], opts[-2] if len(opts) > 1 else opts[-1]]
    if isinstance(control, (widgets.IntSlider, widgets.FloatSlider)):
        return [control.max, control.min, control.max, control.max - control.step]
    if isinstance(control, widgets.FloatLogSlider):
        lo, hi = control.base**control.min, control.base**control.max
        return [hi, lo, hi, control.base ** (control.max - control.step)]
    if isinstance(control, (widgets.Dropdown, widgets.ToggleButtons, widgets.RadioButtons, widgets.Select)):
        return [v for _label, v in control._options_full]
    if isinstance(control, (widgets.Checkbox, widgets.ToggleButton)):
        return [not control.value, control.value]
    return []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("lesson", help="lesson number or name prefix")
    parser.add_argument("--top", type=int, default=0, help="show only the N cells that peak highest")
    parser.add_argument("--no-walk", action="store_true", help="skip the walk over the panels' controls")
    args = parser.parse_args(argv)

    from klviz.servers import KERNEL_MALLOC

    if any(os.environ.get(k) != v for k, v in KERNEL_MALLOC.items()):  # glibc reads these at start only
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **KERNEL_MALLOC})
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from common import reset_peak, status_mb  # after the exec: it imports torch

    (path,) = sorted((ROOT / "notebooks").glob(f"{args.lesson}*.ipynb"))
    cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    os.chdir(path.parent)
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.enable_gui = lambda gui=None: None  # the lessons ask for the inline backend: no GUI loop to start
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = []
    for i, cell in enumerate(cells):
        source = "".join(cell["source"])
        reset_peak()
        result = shell.run_cell(source, silent=False, store_history=True)
        plt.close("all")  # as the inline backend does after showing a cell's figures
        if not result.success:
            print(f"cell {i} failed", file=sys.stderr)
            return 1
        first = next((line for line in source.splitlines() if line.strip() and not line.startswith("#")), "")
        rows.append((status_mb("VmHWM"), status_mb("VmRSS"), f"cell {i:2d}: {first[:70]}"))

    from klviz.widgets.base import Panel

    panels = [(k, v) for k, v in shell.user_ns.items() if isinstance(v, Panel) and not k.startswith("_")]
    if not args.no_walk:
        for name, panel in panels:
            for control_name, control in panel.controls.items():
                for value in _moves(control):
                    reset_peak()
                    panel.set(**{control_name: value})
                    panel.wait()
                    rows.append((status_mb("VmHWM"), status_mb("VmRSS"), f"{name}.{control_name}={value!r}"[:80]))
    shown = sorted(rows, reverse=True)[: args.top] if args.top else rows
    print(f"{'peak MB':>8} {'after MB':>9}  step")
    for hwm, rss, what in shown:
        print(f"{hwm:8.0f} {rss:9.0f}  {what}")
    print(f"highest: {max(r[0] for r in rows):.0f} MB; panels walked: {', '.join(n for n, _ in panels)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
