"""A private JupyterLab and headless Chromium for the real-browser tests.

The server binds 127.0.0.1 on a free port with a random token, runs with HOME in a temporary
folder (Jupyter, IPython, matplotlib and Chromium write there), serves a copy of ``notebooks/``,
and is stopped, with its kernels, when the session ends. Chromium is Debian's package
(``apt-get install -y chromium``); Playwright's own browser download is never used.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from .helpers import stop_process_group

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = Path(os.environ.get("KLVIZ_NOTEBOOK_DIR", ROOT / "notebooks"))
ARTIFACTS = ROOT / "build" / "browser"
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage"]


def chromium_path() -> str:
    """The Chromium binary, or a clear failure that says how to install it."""
    path = os.environ.get("KLVIZ_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not path:
        pytest.fail("Chromium is missing: the browser tests need it. Install it with "
                    "`sudo apt-get install -y chromium` (Debian/Ubuntu) or set KLVIZ_CHROMIUM=/path/to/chrome.",
                    pytrace=False)
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args):
    # Playwright's launch() gives every browser a fresh temporary profile of its own
    return {**browser_type_launch_args, "executable_path": chromium_path(), "headless": True,
            "args": CHROMIUM_FLAGS}


@pytest.fixture(scope="session")
def browser_context_args(browser_context_args):
    return {**browser_context_args, "viewport": {"width": 1280, "height": 1100}}


@pytest.fixture(scope="session")
def lab_server(tmp_path_factory):
    """Start ``jupyter lab`` for the test session; yields base URL, token and root folder."""
    home = tmp_path_factory.mktemp("home")
    root = tmp_path_factory.mktemp("nbroot")
    for nb in NOTEBOOKS.glob("*.ipynb"):
        shutil.copy(nb, root)
    settings = home / ".jupyter/lab/user-settings/@jupyterlab/apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    token = secrets.token_hex(16)
    port = _free_port()
    env = dict(os.environ, HOME=str(home), JUPYTER_CONFIG_DIR=str(home / ".jupyter"))
    env.pop("MPLBACKEND", None)
    log_path = home / "lab.log"
    log = open(log_path, "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", f"--port={port}",
         "--ip=127.0.0.1", f"--IdentityProvider.token={token}", "--LabApp.expose_app_in_browser=True",
         f"--ServerApp.root_dir={root}"],
        cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 90
        while True:
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
                break
            except Exception:
                if proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError("jupyter lab did not start:\n" + log_path.read_text()[-3000:])
                time.sleep(0.25)
        yield {"base": base, "token": token, "root": root, "pid": proc.pid, "log": log_path}
    finally:
        stop_process_group(proc)
        log.close()


@pytest.fixture(scope="session")
def artifacts() -> Path:
    """Folder for screenshots (``build/browser``)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS
