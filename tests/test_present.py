"""Presenter mode without a browser: which lesson, which cells, which server settings.
(The browser test, tests/browser/test_present.py, serves lesson 00 and moves a slider.)"""
from __future__ import annotations

import json

import nbformat
import pytest

from klviz import present
from klviz.labcmd import resolve_lesson


def test_presenter_copy_drops_solutions_and_outputs(tmp_path):
    nb = nbformat.v4.new_notebook()
    solution = nbformat.v4.new_code_cell("answer = 1")
    solution.metadata["jupyter"] = {"source_hidden": True}
    ran = nbformat.v4.new_code_cell("x = 1", execution_count=3,
                                    outputs=[nbformat.v4.new_output("stream", text="old\n")])
    nb.cells = [nbformat.v4.new_markdown_cell("# Title"), ran, nbformat.v4.new_code_cell("def f(): ..."), solution]
    path = tmp_path / "03_x.ipynb"
    nbformat.write(nb, path)
    shown = present.presenter_notebook(path)
    assert [c.source for c in shown.cells] == ["# Title", "x = 1", "def f(): ..."]
    assert shown.cells[1].outputs == [] and shown.cells[1].execution_count is None
    assert len(present.presenter_notebook(path, with_solutions=True).cells) == 4


def test_voila_settings_are_local_tokened_and_codeless():
    cfg = present._voila_config(8870, "s3cret")
    assert cfg["Voila"]["ip"] == "127.0.0.1" and cfg["Voila"]["token"] == "s3cret"
    assert cfg["VoilaConfiguration"]["strip_sources"] is True
    assert "s3cret" not in " ".join(present.voila_command(present.Path("/x/02_y.ipynb")))
    json.dumps(cfg)


def test_every_repository_lesson_resolves_by_number():
    from klviz.labcmd import lesson_paths

    lessons = lesson_paths()
    assert lessons, "no lessons found"
    for path in lessons:
        assert resolve_lesson(path.name[:2]) == path
        assert resolve_lesson(str(int(path.name[:2]))) == path


def test_cli_rejects_unknown_lessons_clearly(capsys):
    assert present.main(["99"]) == 2
    assert "lesson '99' matches no lesson" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        present.main(["00", "--port", "70000"])
