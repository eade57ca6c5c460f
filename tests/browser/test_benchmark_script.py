"""benchmarks/browser_panels.py keeps working: one panel, two key presses (not a timed test)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser
ROOT = Path(__file__).resolve().parents[2]


def test_browser_panels_script_tiny():
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "browser_panels.py"), "--only", "BregmanPanel", "--changes", "2"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    rows = {
        ln.split()[0]: ln for ln in done.stdout.splitlines() if ln.strip().startswith(("BregmanPanel", "(baseline)"))
    }
    assert set(rows) == {"BregmanPanel", "(baseline)"}, done.stdout
    assert "NO FRAME" not in rows["BregmanPanel"] and "no slider" not in rows["BregmanPanel"]
    float(rows["BregmanPanel"].split()[1])  # a median in ms was measured
