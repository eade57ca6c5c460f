"""The Chinese edition (klviz.i18n, scripts/translations.py): every markdown cell of every lesson has a
current translation that keeps the English's claims, formulas, code, links and numbers; a change to an
English cell fails the check until its translation is revised; the built lessons keep the code and
the cell ids; ``klviz lab --lang zh`` gets them to a reader; the catalogues ship in the wheel."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from klviz import i18n

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
SCRIPT = ROOT / "scripts" / "translations.py"


def _copy_sources(dest: Path) -> Path:
    """The English lessons, the claims page and the catalogues, copied into ``dest/notebooks``."""
    folder = dest / "notebooks"
    folder.mkdir()
    for nb in NOTEBOOKS.glob("*.ipynb"):
        shutil.copy(nb, folder)
    shutil.copy(NOTEBOOKS / "claims.md", folder)
    shutil.copytree(NOTEBOOKS / "locale", folder / "locale")
    return folder


def _script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)


def test_every_markdown_cell_has_a_current_translation():
    found = i18n.problems("zh", NOTEBOOKS)
    assert not found, "the Chinese edition is not current:\n" + "\n".join(found)


def test_an_english_change_fails_the_check_until_its_translation_is_revised(tmp_path):
    folder = _copy_sources(tmp_path)
    lesson = folder / "02_three_estimators.ipynb"
    nb = json.loads(lesson.read_text(encoding="utf-8"))
    cell = next(c for c in nb["cells"] if c["cell_type"] == "markdown" and "claims.md#" not in "".join(c["source"]))
    cell["source"][-1] += " A sentence added to the English."
    lesson.write_text(json.dumps(nb, indent=1, ensure_ascii=False), encoding="utf-8")
    where = f"02_three_estimators cell {cell['id']}"

    before = _script("--check", "--notebooks", str(folder))  # the catalogue still holds the old English
    assert before.returncode == 1, before.stdout
    flagged = [line for line in before.stdout.splitlines() if line.startswith("  ")]
    assert len(flagged) == 1 and where in flagged[0] and "English changed" in flagged[0], before.stdout

    assert _script("update", "--notebooks", str(folder)).returncode == 0
    after_update = _script("--check", "--notebooks", str(folder))  # merged: the old translation is now fuzzy
    assert after_update.returncode == 1
    flagged = [line for line in after_update.stdout.splitlines() if line.startswith("  ")]
    assert len(flagged) == 1 and where in flagged[0] and "fuzzy" in flagged[0], after_update.stdout
    po = i18n.catalogue_path("02_three_estimators", "zh", folder)
    text = po.read_text(encoding="utf-8")
    assert "#, fuzzy" in text and "#| msgid" in text  # the translator sees the English it was made from

    catalog = i18n.read_catalogue(po)
    entry = next(m for m in catalog if m.context == cell["id"])
    assert "fuzzy" in entry.flags and entry.string  # the old translation is kept, to revise
    entry.string = str(entry.string) + " 这是英文中新增的一句。"
    entry.flags.discard("fuzzy")
    entry.previous_id = []
    i18n.write_catalogue(catalog, po)
    revised = _script("--check", "--notebooks", str(folder))
    assert revised.returncode == 0, revised.stdout


def test_a_fuzzy_entry_keeps_the_english_it_was_translated_from_across_updates(tmp_path):
    """A cell changed twice before its translation is revised: the translator still diffs against the English
    the translation was made from (the ``#| msgid``), not the intermediate one; and reading and writing a
    catalogue with fuzzy entries rewrites the same bytes."""
    folder = _copy_sources(tmp_path)
    lesson = folder / "03_f_divergence_bregman.ipynb"
    nb = json.loads(lesson.read_text(encoding="utf-8"))
    po = i18n.catalogue_path("03_f_divergence_bregman", "zh", folder)
    current = {m.context for m in i18n.read_catalogue(po) if m.id and m.string and "fuzzy" not in m.flags}
    cell = next(c for c in nb["cells"] if c["cell_type"] == "markdown" and c["id"] in current)
    original = "".join(cell["source"])
    for added in (" First change.", " Second change."):
        cell["source"][-1] += added
        lesson.write_text(json.dumps(nb, indent=1, ensure_ascii=False), encoding="utf-8")
        assert _script("update", "--notebooks", str(folder)).returncode == 0
        entry = next(m for m in i18n.read_catalogue(po) if m.context == cell["id"])
        assert "fuzzy" in entry.flags and list(entry.previous_id) == [original]
    text = po.read_bytes()
    i18n.write_catalogue(i18n.read_catalogue(po), po)
    assert po.read_bytes() == text


def test_a_new_cell_and_a_removed_cell_are_named(tmp_path):
    folder = _copy_sources(tmp_path)
    lesson = folder / "01_sampling_as_weighting.ipynb"
    nb = json.loads(lesson.read_text(encoding="utf-8"))
    removed = next(c for c in nb["cells"] if c["cell_type"] == "markdown")
    nb["cells"].remove(removed)
    nb["cells"].append({"cell_type": "markdown", "id": "newcell1", "metadata": {}, "source": ["## A new section"]})
    lesson.write_text(json.dumps(nb, indent=1), encoding="utf-8")
    found = i18n.problems("zh", folder)
    assert any("cell newcell1: no entry" in line for line in found), found
    assert any(f"cell {removed['id']}, which the lesson no longer has" in line for line in found), found
    _script("update", "--notebooks", str(folder))
    found = i18n.problems("zh", folder)
    assert found == ["01_sampling_as_weighting cell newcell1: not translated yet"], found
    text = i18n.catalogue_path("01_sampling_as_weighting", "zh", folder).read_text(encoding="utf-8")
    assert f'#~ msgctxt "{removed["id"]}"' in text  # the removed cell's translation is kept as obsolete


def test_update_changes_nothing_when_nothing_changed(tmp_path):
    folder = _copy_sources(tmp_path)
    assert _script("update", "--notebooks", str(folder)).returncode == 0
    for po in sorted((NOTEBOOKS / "locale").rglob("*.po")):
        again = folder / po.relative_to(NOTEBOOKS)
        assert again.read_bytes() == po.read_bytes(), f"{po.name}: `update` rewrote a current catalogue"


@pytest.mark.parametrize(
    ("translation", "complaint"),
    [
        ("k1 与 k3 无偏。", "claim markers differ"),
        ("k1 与 k3 无偏（[在 1,000 对随机词元分布上检验](claims.md#k1-k3-unbiased-on-tokens)）。", "claim markers"),
        ("k1 与 k3 无偏（[checked on 2,000 random token pairs](claims.md#k1-k3-unbiased-on-tokens)）。", "claim"),
        ("k1 与 k3 无偏（[在 2,000 对随机词元分布上检验](claims.md#k1-k3-unbiased-on-tokens)），$r=q/p$。", "math"),
        ("k1 与 k3 无偏（[在 2,000 对随机词元分布上检验](claims.md#k1-k3-unbiased-on-tokens)），$r=p/q$。", "numbers"),
        ("`approx_kl` 无偏（[在 2,000 对随机词元分布上检验](claims.md#k1-k3-unbiased-on-tokens)），$r=p/q$。", "code"),
        ("k1 and k3 are unbiased", "no Chinese"),
    ],
)
def test_a_translation_that_loses_a_marker_formula_code_or_number_is_flagged(translation, complaint):
    english = (
        "k1 and k3 are unbiased ([checked on 2,000 random token pairs](claims.md#k1-k3-unbiased-on-tokens)), "
        "$r=p/q$, at 14.6 %."
    )
    units = {"random token pairs": "对随机词元分布"}
    good = "k1 与 k3 无偏（[在 2,000 对随机词元分布上检验](claims.md#k1-k3-unbiased-on-tokens)），$r=p/q$，为 14.6%。"
    assert not i18n.mismatches(english, good, units)
    found = i18n.mismatches(english, translation, units)
    assert any(complaint in line for line in found), found


def test_the_built_edition_has_the_same_code_cells_and_ids(tmp_path):
    written = i18n.build_edition("zh", tmp_path, NOTEBOOKS)
    assert [p.name for p in written] == [p.name for p in i18n.lesson_notebooks(NOTEBOOKS)]
    assert (tmp_path / "claims.md").is_file()  # the markers' links resolve beside the lessons
    for path in written:
        en = json.loads((NOTEBOOKS / path.name).read_text(encoding="utf-8"))
        zh = json.loads(path.read_text(encoding="utf-8"))
        assert zh["metadata"] == en["metadata"] and len(zh["cells"]) == len(en["cells"]), path.name
        for a, b in zip(en["cells"], zh["cells"]):
            assert (a["id"], a["cell_type"], a["metadata"]) == (b["id"], b["cell_type"], b["metadata"]), path.name
            if a["cell_type"] == "code":  # its source differs only in the words it shows: tests/test_code_text.py
                same = {k: v for k, v in a.items() if k != "source"} == {k: v for k, v in b.items() if k != "source"}
                assert same, f"{path.name} cell {a['id']}: a code cell differs between the editions"
            else:
                assert "".join(b["source"]) != "".join(a["source"]), f"{path.name} cell {a['id']} is not translated"
    nb = json.loads((tmp_path / "00_start_here.ipynb").read_text(encoding="utf-8"))
    assert "".join(nb["cells"][0]["source"]).startswith("# 00"), "the title keeps the lesson number"


def test_a_fuzzy_entry_shows_the_english_in_the_build(tmp_path):
    folder = _copy_sources(tmp_path)
    po = i18n.catalogue_path("00_start_here", "zh", folder)
    catalog = i18n.read_catalogue(po)
    entry = next(m for m in catalog if m.id and not i18n.is_glossary_cell("00_start_here", str(m.id)))
    entry.flags.add("fuzzy")
    i18n.write_catalogue(catalog, po)
    i18n.build_edition("zh", tmp_path / "out", folder)
    nb = json.loads((tmp_path / "out" / "00_start_here.ipynb").read_text(encoding="utf-8"))
    cell = next(c for c in nb["cells"] if c["id"] == entry.context)
    assert "".join(cell["source"]) == entry.id  # as gettext does: an out-of-date translation is not shown


# -- the glossary ---------------------------------------------------------------------------------
def test_the_glossary_uses_the_terms_practitioners_use():
    terms = {t.en: t.zh for t in i18n.read_glossary(i18n.glossary_path(NOTEBOOKS))}
    assert len(terms) == len(i18n.read_glossary(i18n.glossary_path(NOTEBOOKS))), "a term is listed twice"
    expected = {
        "policy / reference policy": "策略 / 参考策略",
        "old policy": "旧策略",
        "sampler / target": "采样分布 / 目标分布",
        "importance sampling": "重要性采样",
        "truncated importance sampling (TIS)": "截断重要性采样 (TIS)",
        "bias": "偏差",
        "variance": "方差",
        "estimator": "估计量",
        "log-ratio": "对数比",
        "gradient": "梯度",
        "advantage": "优势",
    }
    assert {k: terms.get(k) for k in expected} == expected


def test_the_chinese_glossary_cell_is_rendered_from_the_glossary():
    catalog = i18n.read_catalogue(i18n.catalogue_path("00_start_here", "zh", NOTEBOOKS))
    cells = [m for m in catalog if m.id and i18n.is_glossary_cell("00_start_here", str(m.id))]
    assert len(cells) == 1
    assert cells[0].string == i18n.render_glossary("zh", i18n.read_glossary(i18n.glossary_path(NOTEBOOKS)))
    assert i18n.GLOSSARY_NOTE in " ".join(cells[0].auto_comments)


def test_the_english_glossary_cell_is_rendered_from_the_glossary():
    nb = json.loads((NOTEBOOKS / "00_start_here.ipynb").read_text(encoding="utf-8"))
    cell = next(s for _, s in i18n.markdown_cells(nb) if i18n.is_glossary_cell("00_start_here", s))
    assert cell == i18n.render_glossary("en", i18n.read_glossary(i18n.glossary_path(NOTEBOOKS)))


# -- reaching a reader ------------------------------------------------------------------------------
def test_klviz_lab_lang_zh_copies_the_chinese_lessons_and_keeps_a_learners_edit(tmp_path, capsys):
    from klviz import labcmd

    dest = tmp_path / "lessons"
    assert labcmd.main(["--lang", "zh", "--copy-only", str(dest)]) == 0
    lessons = sorted(dest.glob("*.ipynb"))
    assert [p.name for p in lessons] == [p.name for p in i18n.lesson_notebooks(NOTEBOOKS)]
    first = json.loads(lessons[0].read_text(encoding="utf-8"))
    assert any("术语表" in "".join(c["source"]) for c in first["cells"])
    first["cells"][0]["source"] = ["# 我的笔记\n"]
    lessons[0].write_text(json.dumps(first, ensure_ascii=False), encoding="utf-8")
    capsys.readouterr()
    assert labcmd.main(["--lang", "zh", "--copy-only", str(dest)]) == 0
    assert "kept your edited 00_start_here.ipynb" in capsys.readouterr().out
    assert "我的笔记" in lessons[0].read_text(encoding="utf-8")


def test_klviz_lab_refuses_an_unknown_language_and_in_place_chinese(tmp_path):
    from klviz import labcmd

    for argv in (["--lang", "fr", "--copy-only", str(tmp_path)], ["--lang", "zh", "--in-place", str(tmp_path)]):
        with pytest.raises(SystemExit) as err:
            labcmd.main(argv)
        assert err.value.code == 2


def test_the_wheel_ships_the_catalogues_the_glossary_and_the_font():
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["klviz"]
    package = ROOT / "klviz"
    shipped = {p.resolve() for pattern in patterns for p in package.glob(pattern)}
    wanted = [*sorted((NOTEBOOKS / "locale").rglob("*.po")), i18n.glossary_path(NOTEBOOKS)]
    wanted += [package / "data" / "fonts" / "klviz-cjk-sc.ttf", package / "data" / "fonts" / "OFL.txt"]
    left_out = [p for p in wanted if p.resolve() not in shipped]
    assert len(wanted) > 4 and not left_out, left_out
