"""How much memory each lesson's kernel needs, in JupyterLab, as a class uses it: sizing a hub.

A private JupyterLab (``labserver.py``) serves a copy of the lessons. Headless Chromium opens each
lesson in a fresh kernel, runs all its cells, then walks every panel's controls as a curious student
would: each slider to its end, its start and back (the extremes cost the most), each choice of each
drop-down and each toggle button, looking at each result before the next move (a move that starts a
background run, lesson 07's lab or lesson 08's live seed, waits until that run has trained). The
kernel's peak resident memory is read from the kernel process itself (``VmHWM`` in
``/proc/PID/status``: the most it ever held, sampled by the kernel of the operating system, not by
polling), after the walk; the single-user JupyterLab server's own peak the same way. Printed per
lesson: the kernel's peak, the server's, and how many students a 16 GB machine holds on that lesson
when each has a server and one kernel of that lesson at its peak, with 2 GB left to the system and
the hub (``--memory-gb``, ``--reserve-gb``). Target: each kernel at most 400 MB.

    python benchmarks/lesson_memory.py                 # every lesson (about 10 minutes here)
    python benchmarks/lesson_memory.py --only 01 07    # some lessons
    python benchmarks/lesson_memory.py --only 08 --per-move   # and the peak of each cell and of each move

Linux only (``/proc``). Needs Chromium (``apt-get install -y chromium``) and the test extra (Playwright).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import print_table, reset_peak, status_mb  # noqa: E402
from labserver import ALL_RUN, CHROMIUM_FLAGS, KERNEL_IDLE, find_chromium, running_lab  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TARGET_MB = 400.0

FAILED = """() => window.jupyterapp.shell.currentWidget.content.widgets.filter(c => c.model.type === 'code')
  .flatMap(c => { const o = [];
                  for (let i = 0; i < c.model.outputs.length; i++) o.push(c.model.outputs.get(i).toJSON());
                  return o; }).filter(o => o.output_type === 'error').map(o => o.ename + ': ' + o.evalue)"""
IDLE = """() => window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.status === 'idle'"""


def kernel_pid(lab: dict, kernel_id: str) -> int:
    """The process of the kernel ``kernel_id``: a child of the server whose command line names its
    connection file."""
    import psutil

    for child in psutil.Process(lab["pid"]).children(recursive=True):
        try:
            if any(kernel_id in part for part in child.cmdline()):
                return child.pid
        except psutil.Error:
            continue
    raise RuntimeError(f"kernel {kernel_id} not found among the server's processes")


def current_kernel_id(page) -> str:
    return page.evaluate("window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.id")


def wait_idle(page, timeout_ms: int = 300_000) -> None:
    """Until the kernel has answered everything asked of it (idle again after the page's messages)."""
    page.wait_for_function(IDLE, timeout=timeout_ms, polling=100)


TRAINING = """() => !Array.from(document.querySelectorAll('.klviz-status'))
  .some(s => /training step/.test(s.innerText))"""


def settle(page) -> None:
    """Until a move's result is all there: the kernel idle and no background run (the RLHF lab, lesson
    08's live seed) still training. A student looks at each result before the next move, so a run is
    never cut short by the next one."""
    wait_idle(page)
    page.wait_for_function(TRAINING, timeout=600_000, polling=200)
    wait_idle(page)


def walk_controls(page, pid: int, per_move: bool = False) -> tuple[int, float]:
    """Move every control of every panel on the page through its range, each move settled; returns how
    many moves and the kernel's peak over the walk (MB). With ``per_move`` each move's own peak is
    printed (the peak is reset before each move, so the walk's peak is the largest of them)."""
    moves, peak = 0, status_mb("VmHWM", pid)

    def moved(what: str) -> None:
        nonlocal moves, peak
        settle(page)
        moves += 1
        now = status_mb("VmHWM", pid)
        peak = max(peak, now)
        if per_move:
            print(f"   move {moves:3d}: peak {now:5.0f} MB  {what}", flush=True)
            reset_peak(pid)

    if per_move:
        reset_peak(pid)
    for index, panel in enumerate(page.locator(".klviz-panel").all()):
        panel.scroll_into_view_if_needed()
        for handle in panel.locator(".noUi-handle").all():
            for key in ("End", "Home", "End", "ArrowLeft"):
                handle.focus()
                page.keyboard.press(key)
                moved(f"panel {index + 1}, slider {key}")
        for select in panel.locator("select").all():
            for value in select.evaluate("el => Array.from(el.options).map(o => o.value)"):
                select.select_option(value)
                moved(f"panel {index + 1}, choice {value!r}")
        for button in panel.locator(".widget-toggle-buttons button").all():
            button.click()
            moved(f"panel {index + 1}, button {button.inner_text()!r}")
    return moves, peak


CODE_CELLS = """() => window.jupyterapp.shell.currentWidget.content.widgets
  .map((c, i) => [i, c.model.type, c.model.sharedModel.getSource().split('\\n')[0]]).filter(c => c[1] === 'code')"""
RUN_CELL = """i => { const nb = window.jupyterapp.shell.currentWidget.content;
  nb.activeCellIndex = i; return window.jupyterapp.commands.execute('notebook:run-cell'); }"""
CELL_DONE = """i => { const w = window.jupyterapp.shell.currentWidget;
  return w.content.widgets[i].model.executionCount !== null && w.sessionContext.session.kernel.status === 'idle'; }"""


def run_cells_one_by_one(page, pid: int) -> float:
    """Run the lesson's code cells one at a time, each settled, printing each cell's peak (the peak is
    reset before each): where Run All's peak comes from. Returns the largest (MB)."""
    peak = 0.0
    for index, _kind, first_line in page.evaluate(CODE_CELLS):
        reset_peak(pid)
        page.evaluate(RUN_CELL, index)
        page.wait_for_function(CELL_DONE, arg=index, timeout=600_000, polling=100)
        settle(page)
        now = status_mb("VmHWM", pid)
        peak = max(peak, now)
        after = status_mb("VmRSS", pid)
        print(f"   cell {index:3d}: peak {now:5.0f} MB, then {after:5.0f} MB  {first_line[:60]}", flush=True)
    return peak


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", help="lesson numbers or name prefixes (default: every lesson)")
    parser.add_argument("--memory-gb", type=float, default=16.0, help="the hub machine's memory (default 16)")
    parser.add_argument("--reserve-gb", type=float, default=2.0, help="left to the system and the hub (default 2)")
    parser.add_argument(
        "--per-move", action="store_true", help="run the cells one by one; print each cell's peak and each move's"
    )
    args = parser.parse_args(argv)
    if not Path("/proc/self/status").exists():
        parser.error("needs Linux (/proc)")
    chromium = find_chromium()
    if not chromium:
        parser.error("Chromium is missing: apt-get install -y chromium, or set KLVIZ_CHROMIUM")
    lessons = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    if args.only:
        lessons = [p for p in lessons if any(p.name.startswith(o) for o in args.only)]
    from playwright.sync_api import sync_playwright

    rows, results, failed = [], [], []
    with tempfile.TemporaryDirectory(prefix="klviz-memory-") as tmp:
        root, home = Path(tmp) / "lessons", Path(tmp) / "home"
        root.mkdir()
        home.mkdir()
        for path in (ROOT / "notebooks").iterdir():
            if path.suffix in (".ipynb", ".md"):
                shutil.copy(path, root)
        with running_lab(root, home, timeout=180) as lab, sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_FLAGS)
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            for lesson in lessons:
                t0 = time.perf_counter()
                page.goto(f"{lab['base']}/lab/tree/{lesson.name}?token={lab['token']}&reset")
                page.wait_for_function(KERNEL_IDLE, timeout=180_000)
                cells_peak = 0.0
                if args.per_move:
                    cells_peak = run_cells_one_by_one(page, kernel_pid(lab, current_kernel_id(page)))
                else:
                    page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")
                page.wait_for_function(ALL_RUN, timeout=900_000, polling=500)
                errors = page.evaluate(FAILED)
                if errors:  # the peak of a lesson that did not run to its end would say nothing
                    print(f"{lesson.name}: Run All stopped at an error, not measured: {errors[0][:200]}", flush=True)
                    failed.append(lesson.name)
                    continue
                pid = kernel_pid(lab, current_kernel_id(page))
                after_run = max(cells_peak, status_mb("VmHWM", pid))
                if args.per_move:
                    print(f"{lesson.name}: peak of the cells {after_run:.0f} MB", flush=True)
                moves, walk_peak = walk_controls(page, pid, args.per_move)
                kernel = max(after_run, walk_peak)
                server = status_mb("VmHWM", lab["pid"])
                results.append((lesson.name, kernel, server))
                print(
                    f"{lesson.name}: kernel peak {kernel:.0f} MB ({after_run:.0f} MB after Run All, "
                    f"{moves} control moves), {time.perf_counter() - t0:.0f} s",
                    flush=True,
                )
                page.evaluate("window.jupyterapp.commands.execute('kernelmenu:shutdown')")
                with urllib.request.urlopen(f"{lab['base']}/api/sessions?token={lab['token']}") as r:
                    for session in json.loads(r.read()):
                        req = urllib.request.Request(
                            f"{lab['base']}/api/sessions/{session['id']}?token={lab['token']}", method="DELETE"
                        )
                        urllib.request.urlopen(req).close()
            browser.close()
    usable = (args.memory_gb - args.reserve_gb) * 1e3  # MB
    server = max(s for _n, _k, s in results)
    for name, kernel, _server in results:
        students = math.floor(usable / (kernel + server))
        rows.append([name, f"{kernel:.0f}", "yes" if kernel <= TARGET_MB else "NO", f"{server:.0f}", f"{students}"])
    print()
    print_table(
        ["lesson", "kernel peak MB", f"<= {TARGET_MB:.0f} MB", "server peak MB", f"students on {args.memory_gb:g} GB"],
        rows,
    )
    worst = max(results, key=lambda r: r[1])
    students = math.floor(usable / (worst[1] + server))
    print(
        f"\na {args.memory_gb:g} GB hub holds about {students} students on lesson {worst[0][:2]} "
        f"(the largest kernel, {worst[1]:.0f} MB, plus a JupyterLab server of {server:.0f} MB each, "
        f"{args.reserve_gb:g} GB left to the system)"
    )
    if failed:
        print(f"not measured (a cell failed): {', '.join(failed)}")
    return 0 if all(k <= TARGET_MB for _n, k, _s in results) and not failed else 1


if __name__ == "__main__":
    sys.exit(main())
