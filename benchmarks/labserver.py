"""A private JupyterLab for scripts and tests that drive the notebooks from a real browser.

The server binds 127.0.0.1 on a free port with a random token, runs with HOME in a given folder
(Jupyter, IPython, matplotlib and Chromium write there; JupyterLab's news and update checks are
off), serves ``root``, and is stopped with its kernels when the ``with`` block ends. The browser
tests (``tests/browser/conftest.py``) and ``benchmarks/browser_panels.py`` both use it.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from klviz.servers import free_port

__all__ = ["CHROMIUM_FLAGS", "find_chromium", "running_lab", "stop_process_group"]

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
def running_lab(root: Path, home: Path, timeout: float = 90.0) -> Iterator[dict]:
    """Run ``jupyter lab`` serving ``root``; yields ``{"base", "token", "root", "pid", "log"}``."""
    settings = home / ".jupyter/lab/user-settings/@jupyterlab/apputils-extension"
    settings.mkdir(parents=True, exist_ok=True)
    (settings / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False})
    )
    token = secrets.token_hex(16)
    port = free_port()
    env = dict(os.environ, HOME=str(home), JUPYTER_CONFIG_DIR=str(home / ".jupyter"))
    env.pop("MPLBACKEND", None)
    env.pop("KLVIZ_STATIC", None)
    log_path = home / "lab.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "jupyterlab",
                "--no-browser",
                "--allow-root",
                f"--port={port}",
                "--ip=127.0.0.1",
                f"--IdentityProvider.token={token}",
                "--LabApp.expose_app_in_browser=True",
                f"--ServerApp.root_dir={root}",
            ],
            cwd=root,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.time() + timeout
            while True:
                try:
                    urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
                    break
                except Exception:  # noqa: BLE001 - not up yet
                    if proc.poll() is not None or time.time() > deadline:
                        raise RuntimeError("jupyter lab did not start:\n" + log_path.read_text()[-3000:]) from None
                    time.sleep(0.25)
            yield {"base": base, "token": token, "root": root, "pid": proc.pid, "log": log_path}
        finally:
            stop_process_group(proc)


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
