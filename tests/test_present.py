"""Presenter mode without a browser: which lesson, which cells, which server settings.
(The browser test, tests/browser/test_present.py, serves lesson 00 and moves a slider.)"""

from __future__ import annotations

import json

import nbformat
import pytest

from klviz import present
from klviz.labcmd import resolve_lesson


def test_presenter_copy_shows_exercises_as_code_and_drops_solutions_and_outputs(tmp_path):
    nb = nbformat.v4.new_notebook()
    solution = nbformat.v4.new_code_cell("# Solution\ndef my_k3(x):\n    return x\n\nassert check(my_k3)")
    solution.metadata["jupyter"] = {"source_hidden": True}
    ran = nbformat.v4.new_code_cell(
        "x = 1", execution_count=3, outputs=[nbformat.v4.new_output("stream", text="old\n")]
    )
    skeleton = nbformat.v4.new_code_cell("def my_k3(x):\n    ...\n\nklviz.check.lesson02.k3_estimator(my_k3)")
    nb.cells = [
        nbformat.v4.new_markdown_cell("# Title"),
        ran,
        nbformat.v4.new_markdown_cell("### Exercise 1"),
        skeleton,
        solution,
    ]
    path = tmp_path / "03_x.ipynb"
    nbformat.write(nb, path)
    shown = present.presenter_notebook(path)
    assert [c.cell_type for c in shown.cells] == ["markdown", "code", "markdown", "markdown"]
    assert shown.cells[1].outputs == [] and shown.cells[1].execution_count is None
    assert (
        "```python\ndef my_k3(x):\n    ...\n```" in shown.cells[3].source
        and "check" not in shown.cells[3].source.split("```")[1]
    )
    with_solutions = present.presenter_notebook(path, with_solutions=True)
    assert len(with_solutions.cells) == 5 and "return x" in with_solutions.cells[4].source
    assert "assert check" not in with_solutions.cells[4].source


def test_every_lesson_exercise_is_shown_as_code_on_the_slides():
    from klviz.labcmd import lesson_paths

    for path in lesson_paths():
        shown = present.presenter_notebook(path)
        code = "\n".join(c.source for c in shown.cells if c.cell_type == "code")
        assert "klviz.check" not in code and "source_hidden" not in str([c.metadata for c in shown.cells]), path.name
        assert any("**Your turn:**" in c.source for c in shown.cells if c.cell_type == "markdown"), path.name


def test_voila_settings_are_locked_codeless_and_quiet(tmp_path):
    cfg = present.presenter_config(tmp_path, theme="dark")
    assert cfg["ServerApp"]["jpserver_extensions"] == {"voila": True, "jupyter_server_mathjax": False}
    assert cfg["ServerApp"]["allow_remote_access"] is False and cfg["ServerApp"]["allow_origin"] == ""
    # nothing from the network: Voila's bundled MathJax, a template without the CDN's style sheets, no
    # labextension beyond the widgets and ipympl
    assert cfg["ServerApp"]["tornado_settings"] == {"mathjax_url": "null", "mathjax_config": "null"}
    voila = cfg["VoilaConfiguration"]
    assert {k: voila[k] for k in ("strip_sources", "show_tracebacks", "theme")} == {
        "strip_sources": True,
        "show_tracebacks": False,
        "theme": "dark",
    }
    assert voila["template"] == present.PRESENTER_TEMPLATE and "jupyterlab-jupytext" not in voila["extension_allowlist"]
    json.dumps(cfg)


def test_the_presenter_template_drops_the_cdn_style_sheets(tmp_path):
    import jinja2

    folder = present.write_presenter_template(tmp_path)
    assert json.loads((folder / "conf.json").read_text())["base_template"] == "lab"
    parent = (
        "{% block notebook_css %}<link rel='x'>"
        + present._FONT_AWESOME.format("all.min.css")
        + present._FONT_AWESOME.format("v4-shims.min.css")
        + "{% endblock notebook_css %}"
    )
    env = jinja2.Environment(loader=jinja2.DictLoader({"lab/index.html.j2": parent, "t": present._TEMPLATE_INDEX}))
    assert env.get_template("t").render() == "<link rel='x'>"


@pytest.mark.slow
def test_presenter_never_writes_through_an_instructors_files(tmp_path):
    pytest.importorskip("voila")
    lessons = tmp_path / "lessons"
    lessons.mkdir()
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# Lesson"), nbformat.v4.new_code_cell("1 + 1")]
    nbformat.write(nb, lessons / "00_x.ipynb")
    mine = {"voila.json": '{"mine": true}', "klviz_server_config.json": "mine", "voila.py": "raise SystemExit(3)\n"}
    for name, text in mine.items():
        (lessons / name).write_text(text)
    server = present.start_presenter(lessons / "00_x.ipynb")
    try:
        assert server.proc.poll() is None  # voila.py beside the lesson was not imported
        assert "/voila/render/00_x.ipynb?token=" in server.url
    finally:
        server.stop()
    for name, text in mine.items():
        assert (lessons / name).read_text() == text  # nothing written through a link
    assert not server.folder.exists()


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
