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
    start = next(
        (
            i
            for i, c in enumerate(nb.cells)
            if c.cell_type == "markdown" and re.search(r"^#{1,4}\s*Exercises\b", c.source, re.M)
        ),
        None,
    )
    assert start is not None, "no '## Exercises' heading"
    code = [(i, c) for i, c in enumerate(nb.cells) if i > start and c.cell_type == "code"]
    pairs, pending = [], None
    for i, cell in code:
        if _hidden(cell):
            assert pending is not None, f"cell {i}: a collapsed solution without an exercise cell before it"
            pairs.append((pending, (i, cell)))
            pending = None
        else:
            assert pending is None, (
                f"cell {pending[0]}: exercise without a collapsed solution after it (next code cell {i})"
            )
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
        assert any(re.search(rf"^\s*assert\s+klviz\.check\.{m}\.{f}\(", solution.source, re.M) for m, f in calls), (
            f"cell {j}: the solution should `assert klviz.check.{calls[0][0]}.{calls[0][1]}(...)`"
        )
        for module, name in calls:
            check = getattr(importlib.import_module(f"klviz.check.{module}"), name, None)
            assert callable(check), f"cell {i}: klviz.check.{module}.{name} does not exist"


# ---- lessons 00-03: a check answers every kind of wrong answer in one sentence, and never raises


def _lesson00_03_checks():
    from klviz.check import lesson00, lesson01, lesson02, lesson03

    answers = [lesson00.direction, lesson02.variance_crossing, lesson03.concave_from]
    functions = [
        lesson00.k1_from_logprobs,
        lesson01.estimate_from_draws,
        lesson01.weighted_estimate,
        lesson01.effective_sample_size,
        lesson02.k3_estimator,
        lesson02.k3_direction,
        lesson02.best_lambda,
        lesson03.kl_pq_estimator,
        lesson03.k2_curvature,
        lesson03.bregman_estimator,
    ]
    return answers, functions


def test_lesson00_03_checks_never_raise():
    import math

    import torch

    from klviz.check import CheckResult

    answers, functions = _lesson00_03_checks()
    odd = [
        None,
        "abc",
        {},
        {"a": 1},
        torch.tensor(1.0, requires_grad=True),
        (1, 2),
        [1, 2, 3],
        torch.ones(3, requires_grad=True),
        float("nan"),
        True,
    ]
    for check in answers:
        for value in odd:
            result = check(value)
            assert isinstance(result, CheckResult) and not result.ok and result.message
    learner_fns = [lambda *a, v=v: v for v in odd] + [
        lambda *a: (a[0], a[0]),
        lambda *a: 1 / 0,
        lambda *a: torch.exp(2.0),
        lambda *a: math.exp(a[0]),
    ]
    for check in functions:
        for fn in learner_fns + odd:
            result = check(fn)
            assert isinstance(result, CheckResult) and not result.ok and result.message, (check.__name__, fn)


def test_lesson00_03_checks_hint_tensors_clamps_and_accept_e():
    import math

    import torch

    from klviz.check import lesson02, lesson03

    assert lesson03.concave_from(2.718) and lesson03.concave_from(torch.tensor(math.e, requires_grad=True))
    msg = lesson02.best_lambda(lambda mu: mu**2 / torch.expm1(mu**2)).message
    assert "plain Python number" in msg
    msg = lesson02.k3_estimator(lambda lr: math.expm1(lr) - lr).message
    assert "torch.exp" in msg
    assert "clamps" in lesson02.k3_estimator(lambda lr: (torch.expm1(lr) - lr).clamp(-10, 10)).message
    clamped = lesson02.k3_estimator(lambda lr: torch.expm1(lr.clamp(-20, 20)) - lr.clamp(-20, 20))
    assert "clamps log r" in clamped.message
    assert "clamps" in lesson03.kl_pq_estimator(lambda lr: (lr.exp() * lr - torch.expm1(lr)).clamp(max=10)).message
