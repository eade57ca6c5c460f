"""Every lesson ends with 2-4 exercises checked by ``klviz.check`` (CONTRIBUTING.md, "Exercises").

Shape required, one test per notebook in notebooks/: a Markdown heading ``Exercises``; after it,
pairs of (exercise cell, solution cell) where the exercise is a visible code cell with a ``...``
skeleton that calls ``klviz.check.lessonNN``, and the solution is the next code cell, collapsed
(cell metadata ``"jupyter": {"source_hidden": true}``) and asserting the same check; after the
last pair only Markdown (the references). The checks exist and load.
"""
from __future__ import annotations

import importlib
import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
LESSONS = sorted(p for p in (ROOT / "notebooks").glob("*.ipynb") if p.name[:2].isdigit())
CHECK_CALL = re.compile(r"klviz\.check\.(lesson\d\d)\.(\w+)\(")


def _hidden(cell) -> bool:
    return bool(cell.get("metadata", {}).get("jupyter", {}).get("source_hidden"))


def _exercise_pairs(nb):
    start = next((i for i, c in enumerate(nb.cells)
                  if c.cell_type == "markdown" and re.search(r"^#{1,4}\s*Exercises\b", c.source, re.M)), None)
    assert start is not None, "no '## Exercises' heading"
    code = [(i, c) for i, c in enumerate(nb.cells) if i > start and c.cell_type == "code"]
    pairs, pending = [], None
    for i, cell in code:
        if _hidden(cell):
            assert pending is not None, f"cell {i}: a collapsed solution without an exercise cell before it"
            pairs.append((pending, (i, cell)))
            pending = None
        else:
            assert pending is None, f"cell {pending[0]}: exercise without a collapsed solution after it (next code cell {i})"
            pending = (i, cell)
    assert pending is None, f"cell {pending[0]}: code after the last solution (or an exercise without a solution)"
    return pairs


@pytest.mark.parametrize("path", LESSONS, ids=[p.stem for p in LESSONS])
def test_lesson_ends_with_checked_exercises(path):
    nb = nbformat.read(path, as_version=4)
    pairs = _exercise_pairs(nb)
    assert 2 <= len(pairs) <= 4, f"{len(pairs)} exercises; a lesson ends with 2 to 4"
    for (i, exercise), (j, solution) in pairs:
        assert "..." in exercise.source, f"cell {i}: the exercise skeleton should leave `...` for the reader"
        calls = CHECK_CALL.findall(exercise.source)
        assert calls, f"cell {i}: the exercise does not call a klviz.check.lessonNN check"
        assert any(re.search(rf"^\s*assert\s+klviz\.check\.{m}\.{f}\(", solution.source, re.M) for m, f in calls), \
            f"cell {j}: the solution should `assert klviz.check.{calls[0][0]}.{calls[0][1]}(...)`"
        for module, name in calls:
            check = getattr(importlib.import_module(f"klviz.check.{module}"), name, None)
            assert callable(check), f"cell {i}: klviz.check.{module}.{name} does not exist"
