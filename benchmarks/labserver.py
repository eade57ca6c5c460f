"""A private JupyterLab for scripts and tests that drive the notebooks from a real browser.

Started by :func:`klviz.servers.start_lab_server`, as ``klviz lab`` starts one: 127.0.0.1 on a free
port, a random token in a private config file that overrides any other Jupyter configuration,
probed after start, its own private working folder, JupyterLab's news and update checks off. Here
it also exposes the app to the page (``window.jupyterapp``, which the tests and the benchmark
drive), runs with HOME in a given folder (Jupyter, IPython, matplotlib and the kernels write
there), serves ``root``, and is stopped with its kernels when the ``with`` block ends. The browser
tests (``tests/browser/conftest.py``) and ``benchmarks/browser_panels.py`` both use it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

from klviz.servers import start_lab_server

__all__ = ["ALL_RUN", "KERNEL_IDLE", "CHROMIUM_FLAGS", "find_chromium", "running_lab", "stop_process_group"]

#: A page's condition (for Playwright's ``wait_for_function``): the open notebook's kernel is idle.
KERNEL_IDLE = """() => {
  const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
  return !!(w && w.sessionContext && w.sessionContext.session &&
            w.sessionContext.session.kernel && w.sessionContext.session.kernel.status === 'idle');
}"""
#: ... and Run All has finished: every code cell ran, or one raised (run-all stops there).
ALL_RUN = """() => {
  const w = window.jupyterapp.shell.currentWidget;
  const code = w.content.widgets.filter(c => c.model.type === 'code');
  const failed = code.some(c => { for (let i = 0; i < c.model.outputs.length; i++)
                                    if (c.model.outputs.get(i).type === 'error') return true;
                                  return false; });
  // run-all stops at a cell that raises: done (the caller reports the error) instead of waiting for the timeout
  return w.sessionContext.session.kernel.status === 'idle' &&
         (failed || code.every(c => c.model.executionCount !== null));
}"""

#: Flags for headless Chromium in a container (no sandbox as root, no GPU, nothing phoning home).
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]


def find_chromium() -> str | None:
    """The Chromium binary: ``KLVIZ_CHROMIUM`` (``make test`` sets it from ``scripts/ensure_browser.py``),
    else a Chromium or Chrome on PATH."""
    names = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
    return os.environ.get("KLVIZ_CHROMIUM") or next(filter(None, map(shutil.which, names)), None)


@contextlib.contextmanager
def running_lab(root: Path, home: Path, timeout: float = 90.0, *, strip_on_save: bool = False) -> Iterator[dict]:
    """Run ``jupyter lab`` serving ``root``; yields ``{"base", "token", "root", "pid", "log"}``.

    ``log`` is the server's log file; it lives in the server's private folder, which is deleted
    when the block ends. ``strip_on_save``: save notebooks in their stored form, as ``make lab`` does.
    """
    env = dict(os.environ, HOME=str(home), JUPYTER_CONFIG_DIR=str(home / ".jupyter"))
    env.pop("MPLBACKEND", None)
    env.pop("KLVIZ_STATIC", None)
    server = start_lab_server(
        Path(root),
        env=env,
        extra={"LabApp": {"expose_app_in_browser": True}},
        strip_on_save=strip_on_save,
        timeout=timeout,
    )
    try:
        url = urllib.parse.urlsplit(server.url)
        token = urllib.parse.parse_qs(url.query)["token"][0]
        base = f"{url.scheme}://{url.netloc}"
        yield {"base": base, "token": token, "root": root, "pid": server.proc.pid, "log": server.log}
    finally:
        server.stop()


def stop_process_group(proc: subprocess.Popen) -> None:
    """Stop a server started with ``start_new_session=True`` and everything it started (kernels)."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
