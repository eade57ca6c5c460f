"""Checks the wheel and sdist builds make (pyproject.toml: ``[tool.setuptools.cmdclass]``).

A lesson that carries outputs (run and saved in a lab that does not strip them) must not ship: the
build stops and names it. Editable installs (``make setup``) are not builds of a package and are
not checked; ``make sync-notebooks`` cleans the lessons.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from klviz.notebook_format import problems  # noqa: E402  (standard library only)


def unclean_lessons(folder: Path = ROOT / "notebooks") -> list[str]:
    """``name (what is wrong)`` for each lesson in ``folder`` that is not in its stored form."""
    out = []
    for path in sorted(folder.glob("*.ipynb")):
        found = problems(json.loads(path.read_text(encoding="utf-8")))
        if found:
            out.append(f"{path.name} ({', '.join(found)})")
    return out


class BuildPy(build_py):
    """setuptools' build_py, refusing lessons with outputs in a real (non-editable) build."""

    def run(self) -> None:
        if not getattr(self, "editable_mode", False):
            bad = unclean_lessons()
            if bad:
                raise SystemExit(
                    "klviz: refusing to package lessons that carry outputs: "
                    + "; ".join(bad)
                    + ". Run `make sync-notebooks` first."
                )
        super().run()
