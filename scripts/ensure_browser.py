"""Find a Chromium for the browser tests, installing one where that is possible; print its path.

``make test`` runs this first, so a new machine needs no manual step. In order:

1. ``KLVIZ_CHROMIUM`` (a path you set);
2. a system Chromium or Chrome on ``PATH`` (chromium, chromium-browser, google-chrome, google-chrome-stable);
3. Playwright's own Chromium, if its installer (``python -m playwright install chromium``) already put one
   in its cache;
4. as root on Debian or Ubuntu: ``apt-get install -y chromium`` (the distribution's package);
5. otherwise: Playwright's installer (``python -m playwright install chromium``: a download to your
   user cache, no root needed).

Only when all of these fail does it exit with status 1 and one line naming the fix.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

SYSTEM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def configured() -> str | None:
    path = os.environ.get("KLVIZ_CHROMIUM", "").strip()
    return path if path and os.access(path, os.X_OK) else None


def on_path() -> str | None:
    for name in SYSTEM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


def playwright_browser() -> str | None:
    """The Chromium Playwright's installer keeps in its cache, if it is there."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None
    try:
        with sync_playwright() as p:
            path = p.chromium.executable_path
    except Exception:  # noqa: BLE001 - no driver, no browser: not found
        return None
    return path if path and Path(path).is_file() else None


def _run(cmd: list[str]) -> bool:
    print(f"ensure_browser: {' '.join(cmd)}", file=sys.stderr, flush=True)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    return subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL).returncode == 0


def install() -> str | None:
    """Install a Chromium the way this machine allows; its path, or None."""
    is_root = hasattr(os, "geteuid") and os.geteuid() == 0
    if is_root and Path("/etc/debian_version").exists() and shutil.which("apt-get"):
        if _run(["apt-get", "update", "-qq"]) and _run(["apt-get", "install", "-y", "-qq", "chromium"]):
            return on_path()
    if _run([sys.executable, "-m", "playwright", "install", "chromium"]):
        return playwright_browser()
    return None


def main() -> int:
    path = configured() or on_path() or playwright_browser() or install()
    if not path:
        print(
            "ensure_browser: no Chromium found and none could be installed. Install one "
            "(`sudo apt-get install -y chromium` on Debian/Ubuntu, or `python -m playwright install chromium`), "
            "or set KLVIZ_CHROMIUM=/path/to/chrome.",
            file=sys.stderr,
        )
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
