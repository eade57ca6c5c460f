"""The words the lessons' code cells show, in the Chinese edition (klviz.code_text): which literals are taken,
that the built code differs from the English only in them, that a translation which would change what the
code does is refused, and that a change to an English literal fails the check until it is revised."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from klviz import code_text, i18n

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"

CELL = """\
%matplotlib inline
import numpy as np
n, kl, name = 1_000, 0.25, "k3"
fig, ax = plt.subplots()
ax.plot([1, 2], label="π·log(π/p), summed")   # non-ASCII before the next literal on the line: ± √
ax.set_title(f"N = {n:,} draws: KL {kl:.3f}")
ax.set_xlabel(r"distance $\\mu$ between the policies")
ax.set_ylabel("f(t)")                        # a formula, no words: left alone
ax.legend(title=name)                        # a variable: left alone
lookup = {"running mean": 1}["running mean"]  # a key the code uses: left alone
print("exact sum over the vocabulary: "
      f"{kl:.5f} nats ({{exact}})")
"""


def _exec(source: str) -> dict:
    """What the cell's shown literals evaluate to, in order (no matplotlib needed)."""
    shown: list[str] = []
    namespace = {"plt": _Plt(shown), "print": lambda *a: shown.append(" ".join(map(str, a)))}
    exec(re.sub(r"^%.*$", "", source, flags=re.M), namespace)
    return {"shown": shown}


class _Plt:
    def __init__(self, shown: list[str]):
        self.shown = shown

    def subplots(self):
        return None, self

    def __getattr__(self, name):
        def record(*args, **kwargs):
            self.shown += [a for a in args if isinstance(a, str)]
            self.shown += [v for k, v in kwargs.items() if k in code_text.TEXT_KEYWORDS and isinstance(v, str)]

        return record


def test_the_shown_literals_are_found_with_their_exact_place():
    texts = code_text.code_texts(CELL, "c1")
    assert [t.text for t in texts] == [
        "π·log(π/p), summed",
        "N = {n:,} draws: KL {kl:.3f}",
        "distance $\\mu$ between the policies",
        "exact sum over the vocabulary: {kl:.5f} nats ({{exact}})",  # the parts joined as one f-string
    ]
    for t in texts:  # the offsets cut exactly the literal (all its parts) out of the source
        segment = CELL[t.start : t.end]
        assert segment[0] in "\"'rf" and segment[-1] in "\"'"
        compile(f"({segment})", "<cell>", "eval")
    assert [t.where for t in texts] == ["label= of plot()", "set_title()", "set_xlabel()", "print()"]
    assert texts[2].prefix == "r" and texts[1].prefix == "f" and texts[3].prefix == "f"


def test_the_translated_cell_differs_from_the_english_only_in_the_shown_literals():
    texts = code_text.code_texts(CELL, "c1")
    table = {
        ("c1", texts[0].text): "π·log(π/p) 之和",
        ("c1", texts[1].text): "N = {n:,} 次抽样：KL {kl:.3f}",
        ("c1", texts[2].text): "两个策略之间的距离 $\\mu$",
        ("c1", texts[3].text): "对整个词表的精确求和：{kl:.5f} nats（{{exact}}）",
    }
    zh = code_text.translate_code(CELL, "c1", table)

    assert _program(zh) == _program(CELL)
    assert _exec(zh)["shown"] == [
        "π·log(π/p) 之和",
        "N = 1,000 次抽样：KL 0.250",
        "两个策略之间的距离 $\\mu$",
        "f(t)",
        "k3",
        "对整个词表的精确求和：0.25000 nats（{exact}）",
    ]
    assert _exec(CELL)["shown"][-1] == "exact sum over the vocabulary: 0.25000 nats ({exact})"
    assert code_text.translate_code(CELL, "c1", {}) == CELL  # no translation: byte for byte the English


@pytest.mark.parametrize(
    ("translation", "complaint"),
    [
        ("N = {n} 次抽样：KL {kl:.3f}", "fields differ"),  # a format spec lost
        ("N = {n:,} 次抽样：KL {kl:.3f} {n+1}", "fields differ"),  # code added
        ("N = {n:,} 次抽样", "fields differ"),
        ('N = {n:,} 次"抽样"：KL {kl:.3f}', "Python literal"),  # the quote character
        ("N = {n:,} draws: KL {kl:.3f} (again)", "no Chinese"),
    ],
)
def test_a_translation_that_would_change_the_code_or_lose_a_field_is_refused(translation, complaint):
    title = code_text.code_texts(CELL, "c1")[1]
    found = code_text.text_problems(title, translation)
    assert any(complaint in f for f in found), found
    assert code_text.translate_code(CELL, "c1", {("c1", title.text): translation}) == CELL


def test_a_translation_keeps_formulas_and_numbers():
    axis = code_text.code_texts(CELL, "c1")[2]
    assert any("formulas" in f for f in code_text.text_problems(axis, "两个策略之间的距离 μ"))
    plain = code_text.code_texts('print("50,257 tokens")', "c")[0]
    assert any("numbers" in f for f in code_text.text_problems(plain, "五万多个词元"))
    assert code_text.text_problems(plain, "50,257 个词元") == []
    assert code_text.text_problems(plain, "50,257 tokens") == []  # the English itself, kept on purpose


def _lesson(tmp_path: Path, source: str) -> tuple[Path, dict]:
    folder = tmp_path / "notebooks"
    folder.mkdir(exist_ok=True)
    nb = {
        "cells": [
            {"cell_type": "markdown", "id": "m1", "metadata": {}, "source": ["# A lesson\n"]},
            {"cell_type": "code", "id": "c1", "metadata": {}, "source": source, "outputs": [],
             "execution_count": None},
        ],
        "metadata": {},
        "nbformat": 4,
        "nbformat_minor": 5,
    }  # fmt: skip
    (folder / "09_test.ipynb").write_text(json.dumps(nb), encoding="utf-8")
    return folder, nb


def _update(folder: Path, nb: dict) -> list[str]:
    po = i18n.code_catalogue_path("09_test", "zh", folder)
    old = i18n.read_catalogue(po) if po.is_file() else None
    new, summary = code_text.update_code_catalogue(nb, old, "09_test")
    i18n.write_catalogue(new, po)
    return summary


def _code_problems(folder: Path) -> list[str]:
    return [p for p in i18n.problems("zh", folder) if "09_test" in p and "cell c1" in p or ".code.po" in p]


def test_an_english_literal_change_fails_the_check_until_its_translation_is_revised(tmp_path):
    folder, nb = _lesson(tmp_path, 'ax.set_title("the error shrinks like 1/√N")\nprint("done")\n')
    assert _update(folder, nb) == ["2 new"]
    po = i18n.code_catalogue_path("09_test", "zh", folder)
    assert len([p for p in _code_problems(folder) if "not translated yet" in p]) == 2
    catalog = i18n.read_catalogue(po)
    for message, zh in zip([m for m in catalog if m.id], ["误差按 1/√N 缩小", "完成"]):
        message.string = zh
    i18n.write_catalogue(catalog, po)
    assert _code_problems(folder) == []
    before = po.read_bytes()
    assert _update(folder, nb) == [] and po.read_bytes() == before  # nothing changed: the same bytes

    nb["cells"][1]["source"] = 'ax.set_title("the error shrinks like 1/sqrt(N)")\nprint("done")\n'
    (folder / "09_test.ipynb").write_text(json.dumps(nb), encoding="utf-8")
    assert any("no entry" in p for p in _code_problems(folder))  # the catalogue still holds the old English
    assert _update(folder, nb) == ["1 changed (now fuzzy)"]
    found = _code_problems(folder)
    assert len(found) == 1 and "fuzzy" in found[0], found
    text = po.read_text(encoding="utf-8")
    assert '#| "the error shrinks like 1/√N"' in text  # what the translator diffs against
    assert i18n.read_catalogue(po).obsolete == {}  # the old entry became the fuzzy one, not obsolete
    assert _update(folder, nb) == [] and po.read_text(encoding="utf-8") == text  # and survives another update

    built = i18n.translate_notebook(nb, None, i18n.read_catalogue(po))
    assert "".join(built["cells"][1]["source"]) == 'ax.set_title("the error shrinks like 1/sqrt(N)")\nprint("完成")\n'

    catalog = i18n.read_catalogue(po)
    entry = next(m for m in catalog if "fuzzy" in m.flags)
    entry.string, entry.previous_id = "误差按 1/sqrt(N) 缩小", []
    entry.flags.discard("fuzzy")
    i18n.write_catalogue(catalog, po)
    assert _code_problems(folder) == []


def test_a_literal_moved_to_another_cell_keeps_its_translation_and_a_removed_one_becomes_obsolete(tmp_path):
    folder, nb = _lesson(tmp_path, 'print("done")\nprint("a line that goes away")\n')
    _update(folder, nb)
    po = i18n.code_catalogue_path("09_test", "zh", folder)
    catalog = i18n.read_catalogue(po)
    for message, zh in zip([m for m in catalog if m.id], ["完成", "一行将被删去的文字"]):
        message.string = zh
    i18n.write_catalogue(catalog, po)
    nb["cells"][1]["source"] = "x = 1\n"
    nb["cells"].append({**nb["cells"][1], "id": "c2", "source": 'print("done")\n'})
    summary = _update(folder, nb)
    assert summary == ["1 moved", "2 obsolete"], summary
    catalog = i18n.read_catalogue(po)
    assert {(m.context, m.id, m.string) for m in catalog if m.id} == {("c2", "done", "完成")}


def _program(source: str) -> str:
    """The code of a cell with its words taken out: string constants blanked, and each f-string reduced to
    its fields (expression, conversion, format spec), in sorted order, since a translation may reorder them."""
    tree = ast.parse(re.sub(r"^(\s*)[%!]", r"\1#", source, flags=re.M))
    specs = {id(n.format_spec) for n in ast.walk(tree) if isinstance(n, ast.FormattedValue) and n.format_spec}
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr) and id(node) not in specs:
            fields = [v for v in node.values if isinstance(v, ast.FormattedValue)]
            node.values = sorted(fields, key=ast.dump)  # type: ignore[assignment]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            node.value = ""
    return ast.dump(tree)


def test_the_lessons_code_is_the_same_in_both_editions_but_for_the_shown_literals(tmp_path):
    """Every code cell of every built Chinese lesson: the same program as the English cell once string
    constants are blanked, and each literal it changed is one the catalogue translates."""
    built = i18n.build_edition("zh", tmp_path, NOTEBOOKS)
    changed = 0
    for path in built:
        en = json.loads((NOTEBOOKS / path.name).read_text(encoding="utf-8"))
        zh = json.loads(path.read_text(encoding="utf-8"))
        for a, b in zip(en["cells"], zh["cells"]):
            assert a["id"] == b["id"]
            if a["cell_type"] != "code":
                continue
            src_en, src_zh = "".join(a["source"]), "".join(b["source"])
            if src_en == src_zh:
                continue
            changed += 1
            trees = [_program(src) for src in (src_en, src_zh)]
            assert trees[0] == trees[1], f"{path.name} cell {a['id']}: the code differs, not only its words"
    if not any(m.string for po in (NOTEBOOKS / "locale").rglob("*.code.po") for m in i18n.read_catalogue(po) if m.id):
        pytest.fail("no code catalogue has a translation: nothing was checked")
    assert changed > 0


LOOPS = """\
for name, colour, label in (("k2", "C1", "half the squared log"), ("k1", "C0", "minus the log")):
    ax.plot(x, y[name], color=colour, label=label)
    ax.set_title(f"generator of {label}")
panels = (("reward", "reward per batch"), ("true_kl", "true KL per response"))
for ax, (metric, title) in zip(axes, panels):
    ax.plot(metrics[metric])
    ax.set_title(title)
kept = (("mean of k1", 1), ("mean of k3", 3))
for what, k in kept:
    print(what)
table = {what: k for what, k in kept}  # the names are keys too: left alone
html = table_html(rows, label="target p")  # a keyword of a call that is not a plot: a key, left alone
ax.plot(x, label="first pass" if k == 1 else "second pass")
print("mean of " + ", ".join(kept) + f" over {k} seeds")
"""


def test_a_loop_variable_only_ever_shown_as_text_has_its_literals_taken_and_no_other():
    texts = code_text.code_texts(LOOPS, "c")
    assert [t.text for t in texts] == [
        "half the squared log",
        "minus the log",
        "generator of {label}",
        "reward per batch",
        "true KL per response",
        "first pass",
        "second pass",
        "mean of ",
        " over {k} seeds",
    ]
    assert texts[0].where == "`label`, shown by label= of plot(), set_title()"
    # "k2", "C1" (keys and colours), "reward" (a key), "mean of k1" (also a dict key) are never taken
