"""A private JupyterLab and headless Chromium for the real-browser tests.

The server binds 127.0.0.1 on a free port with a random token, runs with HOME in a temporary
folder (Jupyter, IPython, matplotlib and Chromium write there), serves a copy of ``notebooks/``,
and is stopped, with its kernels, when the session ends. Chromium is Debian's package
(``make test`` finds or installs one with ``scripts/ensure_browser.py`` and passes it as ``KLVIZ_CHROMIUM``).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from labserver import CHROMIUM_FLAGS, find_chromium, running_lab  # noqa: E402  (shared with the browser benchmark)

NOTEBOOKS = Path(os.environ.get("KLVIZ_NOTEBOOK_DIR", ROOT / "notebooks"))
ARTIFACTS = ROOT / "build" / "browser"


def chromium_path() -> str:
    """The Chromium binary, or a clear failure that says how to install it."""
    path = find_chromium()
    if not path:
        pytest.fail(
            "Chromium is missing: the browser tests need it. Install it with "
            "`sudo apt-get install -y chromium` (Debian/Ubuntu) or set KLVIZ_CHROMIUM=/path/to/chrome.",
            pytrace=False,
        )
    return path


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args):
    # Playwright's launch() gives every browser a fresh temporary profile of its own
    return {**browser_type_launch_args, "executable_path": chromium_path(), "headless": True, "args": CHROMIUM_FLAGS}


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
    with running_lab(root, home) as lab:
        yield lab


@pytest.fixture(scope="session")
def artifacts() -> Path:
    """Folder for screenshots (``build/browser``)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS
