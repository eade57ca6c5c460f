"""Saving a lesson from JupyterLab leaves ``git status`` clean, as ``make lab`` promises.

A git repository holding a copy of ``notebooks/`` (the lessons as committed) is served the way ``make
lab`` serves the checkout: in place, notebooks saved in their stored form. Each lesson is opened in
headless Chromium (which starts its kernel; JupyterLab then writes that kernel's own name and display
name into the notebook) and saved; every save must reach the disk, and ``git status`` must stay empty.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .helpers import KERNEL_IDLE

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from labserver import running_lab  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = Path(os.environ.get("KLVIZ_TEST_NOTEBOOKS", ROOT / "notebooks"))

pytestmark = pytest.mark.browser


def _git(repo: Path, *args: str) -> str:
    env = dict(
        os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t"
    )
    done = subprocess.run(["git", *args], cwd=repo, env=env, capture_output=True, text=True, check=True)
    return done.stdout


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
    """A repository like a fresh clone's ``notebooks/``, committed, and ``make lab``'s server on it."""
    repo = tmp_path_factory.mktemp("clone")
    lessons = repo / "notebooks"
    lessons.mkdir()
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        shutil.copy(path, lessons)
    shutil.copy(ROOT / ".gitignore", repo)  # a clone has it: JupyterLab's checkpoints are ignored
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "lessons")
    home = tmp_path_factory.mktemp("save-home")
    with running_lab(lessons, home, strip_on_save=True) as lab:
        yield {"repo": repo, "lessons": lessons, "lab": lab}


def _wait_for_save(path: Path, before: int, timeout_s: float = 60.0) -> None:
    """Until the file's modification time moves past ``before`` (the save has reached the disk)."""
    deadline = time.monotonic() + timeout_s
    while path.stat().st_mtime_ns == before:
        if time.monotonic() > deadline:
            raise AssertionError(f"{path.name} was not saved within {timeout_s:.0f} s")
        time.sleep(0.05)


def test_saving_every_lesson_leaves_git_status_clean(page, clone):
    lab, lessons = clone["lab"], clone["lessons"]
    names = sorted(p.name for p in lessons.glob("*.ipynb"))
    assert names, f"no lessons in {NOTEBOOKS}"
    for name in names:
        path = lessons / name
        before = path.stat().st_mtime_ns
        page.goto(f"{lab['base']}/lab/tree/{name}?token={lab['token']}&reset")
        page.wait_for_function(KERNEL_IDLE, timeout=90_000)  # the kernel has started and named itself
        page.evaluate("window.jupyterapp.commands.execute('docmanager:save')")
        _wait_for_save(path, before)
        page.wait_for_function(
            "() => !window.jupyterapp.shell.currentWidget.context.model.dirty", timeout=30_000
        )  # JupyterLab has its answer: nothing left unsaved
    status = _git(clone["repo"], "status", "--porcelain")
    assert status == "", f"saving the lessons changed the tree:\n{status}\n{_git(clone['repo'], 'diff', '--stat')}"
