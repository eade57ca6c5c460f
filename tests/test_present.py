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


# -- the Chinese edition in presenter mode ------------------------------------------------------------
def test_the_chinese_presenter_copy_translates_the_prose_and_keeps_the_code():
    from klviz.labcmd import lesson_paths

    lesson = next(p for p in lesson_paths() if p.name.startswith("02_"))
    en, zh = present.presenter_notebook(lesson), present.presenter_notebook(lesson, lang="zh")
    assert [c.cell_type for c in en.cells] == [c.cell_type for c in zh.cells]
    # prose and code are the built edition's (the code differs from the English only in the words it shows,
    # tests/test_code_text.py; a text whose translation is out of date shows its English there too)
    from klviz import i18n

    built = i18n.translate_lesson(json.loads(lesson.read_text(encoding="utf-8")), lesson.stem, "zh", lesson.parent)
    code = ["".join(c["source"]) for c in built["cells"] if c["cell_type"] == "code"]
    shown = [c.source for c in zh.cells if c.cell_type == "code"]
    assert len(shown) == len([c for c in en.cells if c.cell_type == "code"])
    assert all(source in code for source in shown)  # the presenter leaves the check cells out, changes none
    assert any("的" in source for source in shown), "the code's figure titles and printed words are translated too"
    prose = ["".join(c["source"]) for c in built["cells"] if c["cell_type"] == "markdown"]
    assert [c.source for c in zh.cells if c.cell_type == "markdown" and "```python" not in c.source] == prose
    assert sum("的" in text for text in prose) > len(prose) // 4, "hardly any Chinese in lesson 02"
    exercises = [c.source for c in zh.cells if c.cell_type == "markdown" and "```python" in c.source]
    assert exercises and all("**轮到你了**：" in s and "Your turn" not in s for s in exercises)
    from nbconvert.filters.markdown import markdown2html

    # bold in CommonMark: a closing ** after a full-width colon and before a CJK character would stay literal
    assert "<strong>轮到你了</strong>：" in markdown2html(exercises[0])


def test_a_lesson_without_a_catalogue_is_refused_by_name(tmp_path, capsys):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# 00 · Alone")]
    nbformat.write(nb, tmp_path / "00_alone.ipynb")
    assert present.main(["00", "--notebooks", str(tmp_path), "--lang", "zh", "--no-browser"]) == 2
    assert "00_alone has no zh translation" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        present.main(["00", "--lang", "fr"])


def test_the_presenter_kernel_and_page_speak_the_edition(tmp_path, monkeypatch):
    """``klviz present --lang zh``: the server (whose environment its kernels inherit) gets KLVIZ_LANG=zh and
    a page marked ``lang="zh"``; the English one gets no KLVIZ_LANG, even one left in the shell."""
    pytest.importorskip("voila")
    import shutil

    from klviz.fonts import FONT_FILE

    started = []

    def fake_start_server(args, config, *, env, folder, **kw):
        template = folder / "jupyter-data" / "voila" / "templates" / present.PRESENTER_TEMPLATE
        started.append((env, config, (template / "static" / FONT_FILE.name).read_bytes()))
        shutil.rmtree(folder)
        return None

    monkeypatch.setattr(present, "start_server", fake_start_server)
    monkeypatch.setenv("KLVIZ_LANG", "zh")
    lesson = resolve_lesson("00")
    present.start_presenter(lesson, lang="zh")
    present.start_presenter(lesson)
    (zh_env, zh_cfg, font), (en_env, en_cfg, _) = started
    assert zh_env["KLVIZ_LANG"] == "zh" and "KLVIZ_LANG" not in en_env
    assert zh_cfg["HTMLExporter"] == {"language_code": "zh"} and en_cfg["HTMLExporter"] == {"language_code": "en"}
    assert font == FONT_FILE.read_bytes()  # the font every presented page loads, served from the template


def test_the_presenter_template_serves_the_cjk_font(tmp_path):
    from klviz.fonts import FAMILY, FONT_FILE

    folder = present.write_presenter_template(tmp_path)
    assert (folder / "static" / FONT_FILE.name).is_file() and (folder / "static" / "OFL.txt").is_file()
    text = (folder / "index.html.j2").read_text()
    css = text.split("{%- block extra_css -%}", 1)[1]
    assert "@font-face" in css and f'"{FAMILY}"' in css and "unicode-range" in css
    assert f'url("{{{{ resources.base_url }}}}voila/templates/klviz/static/{FONT_FILE.name}")' in css
