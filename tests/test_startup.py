"""Start-up stays light: ``import klviz`` and ``klviz --help`` must not pull in the heavy libraries.

Each check runs in a fresh interpreter (this test process has long imported everything), so a new
top-level ``import matplotlib`` or ``import torch`` on the way to the CLI fails here.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "matplotlib", "ipywidgets")


def loaded_after(code: str) -> dict[str, bool]:
    """Run ``code`` in a fresh interpreter; which of HEAVY are in ``sys.modules`` afterwards."""
    probe = f"{code}\nimport json, sys\nprint('\\nLOADED=' + json.dumps({{m: m in sys.modules for m in {HEAVY!r}}}))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("LOADED="))
    return json.loads(line[len("LOADED=") :])


def test_import_klviz_loads_no_matplotlib_or_ipywidgets():
    loaded = loaded_after("import klviz")
    assert not loaded["matplotlib"], "import klviz imported matplotlib (a module-level import on the way?)"
    assert not loaded["ipywidgets"], "import klviz imported ipywidgets"


@pytest.mark.parametrize("argv", [["--help"], ["diagnose", "--help"], ["--version"]], ids=" ".join)
def test_cli_help_loads_no_torch(argv):
    code = (
        "import sys\n"
        f"sys.argv = ['klviz', *{argv!r}]\n"
        "import klviz.cli as c\n"
        "try:\n    status = c.main()\nexcept SystemExit as e:\n    status = e.code\n"
        "assert status in (0, None), status"
    )
    loaded = loaded_after(code)
    assert not any(loaded.values()), f"klviz {' '.join(argv)} imported {[m for m, v in loaded.items() if v]}"


def test_lazy_public_names_still_work():
    code = (
        "import klviz\n"
        "from klviz import k3, setup_notebook, show_source, check\n"
        "assert klviz.k1 is klviz.estimators.k1 and callable(setup_notebook) and callable(show_source)\n"
        "assert check.lesson02.__name__ == 'klviz.check.lesson02'\n"
        "assert set(klviz.__all__) <= set(dir(klviz))\n"
        "ns = {}\nexec('from klviz import *', ns)\n"
        "assert all(n in ns for n in klviz.__all__)\n"
        "import klviz.diagnose as dg\n"
        "assert dg.sample_rollouts_path().is_file() and callable(dg.load_rollouts)"
    )
    loaded_after(code)
    with pytest.raises(AttributeError):
        import klviz

        klviz.no_such_name  # noqa: B018


def test_diagnose_imports_no_matplotlib_until_it_plots():
    loaded = loaded_after(
        "import klviz.diagnose as dg\n"
        "print(dg.format_report(dg.diagnose(dg.load_rollouts(dg.sample_rollouts_path())))[:20])"
    )
    assert loaded["torch"] and not loaded["matplotlib"] and not loaded["ipywidgets"]
