"""The claims page reaches readers (the wheel, ``klviz lab``, ``klviz site``), and the lessons' check
cells stay out of the lecture: folded into "Checks" on the site, left out by the presenter."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import nbformat
import pytest

from klviz import labcmd, present, site
from klviz.notebook_format import CHECK_TAG

ROOT = Path(__file__).resolve().parents[1]
LECTURES = ("00_start_here", "01_sampling_as_weighting", "02_three_estimators", "03_f_divergence_bregman")

CLAIMS_MD = """# Claims and their evidence

## tiny-claim

> Two plus two is four.

- **Stated in:** [00 First](00_first.ipynb)
"""


def _notebook(cells) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells = cells
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


def _lesson() -> nbformat.NotebookNode:
    M, C = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell
    check = C("for x in (1, 2):\n    assert x > 0, x\nassert 2 + 2 == 4\nprint('checks ran')")
    check.metadata["tags"] = [CHECK_TAG]
    check.metadata["jupyter"] = {"source_hidden": True}  # how make sync-notebooks stores it
    solution = C("answer = 42\nprint('solution ran')")
    solution.metadata["jupyter"] = {"source_hidden": True}
    return _notebook(
        [
            M("# 00 · First lesson\n\nTwo plus two is four ([checked on 1 sum](claims.md#tiny-claim))."),
            C("import klviz\nvalue = 2 + 2\nprint('lecture ran', value)"),
            check,
            M("## Exercises"),
            C("answer = ...\nprint(klviz.check.lesson00.direction(answer))"),
            solution,
        ]
    )


# -- the site ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def built(tmp_path_factory):
    src = tmp_path_factory.mktemp("nbs")
    nbformat.write(_lesson(), src / "00_first.ipynb")
    (src / "claims.md").write_text(CLAIMS_MD, encoding="utf-8")
    out = tmp_path_factory.mktemp("site")
    site.build_site([src / "00_first.ipynb"], out, timeout=120, log=lambda *_: None)
    return out


def test_site_renders_the_claims_page_with_anchors(built):
    page = (built / "claims.html").read_text(encoding="utf-8")
    assert '<h2 id="tiny-claim">' in page and 'href="#tiny-claim"' in page
    assert 'href="00_first.html"' in page and ".ipynb" not in page  # lesson links point at pages
    assert 'href="index.html"' in page


def test_site_points_lessons_and_index_at_the_claims_page(built):
    lesson = (built / "00_first.html").read_text(encoding="utf-8")
    assert 'href="claims.html#tiny-claim"' in lesson and "claims.md" not in lesson
    index = (built / "index.html").read_text(encoding="utf-8")
    assert 'href="claims.html"' in index


def test_site_folds_check_cells_into_checks_not_solutions(built):
    lesson = (built / "00_first.html").read_text(encoding="utf-8")
    checks = re.findall(
        r'<details class="klviz-checks"><summary>(Checks: \d+ asserts?)[^<]*</summary>(.*?)</details>', lesson, re.S
    )
    assert len(checks) == 1, checks
    summary, body = checks[0]
    assert summary == "Checks: 2 asserts" and "checks ran" in body and '2</span> <span class="o">+</span>' in body
    solutions = re.findall(r'<details class="klviz-solution">(.*?)</details>', lesson, re.S)
    assert len(solutions) == 1 and "solution ran" in solutions[0] and "checks ran" not in solutions[0]
    visible = re.sub(r"<details.*?</details>", "", lesson, flags=re.S)
    assert "lecture ran" in visible and "checks ran" not in visible


def test_fold_check_cells_counts_asserts_anywhere():
    C = nbformat.v4.new_code_cell
    cell = C("for k in ks:\n    assert k\nif x:\n    assert y")
    cell.metadata["tags"] = [CHECK_TAG]
    cell.metadata["jupyter"] = {"source_hidden": True}
    odd = C("%timeit 1")
    odd.metadata["tags"] = [CHECK_TAG]
    plain = C("assert z")
    nb = site.fold_check_cells(_notebook([cell, odd, plain]))
    assert nb.cells[0].metadata["klviz_checks"] == 2 and "source_hidden" not in nb.cells[0].metadata["jupyter"]
    assert nb.cells[1].metadata["klviz_checks"] == 1  # not Python: still a check, one of them
    assert "klviz_checks" not in nb.cells[2].metadata  # untagged cells are _mark_checks' business


def test_rewrite_claim_links_only_touches_the_claims_page():
    html = '<a href="claims.md#x-y">a</a> <a href="./claims.md">b</a> <a href="https://e.org/claims.md">c</a>'
    assert site.rewrite_claim_links(html) == (
        '<a href="claims.html#x-y">a</a> <a href="claims.html">b</a> <a href="https://e.org/claims.md">c</a>'
    )


# -- presenter mode ----------------------------------------------------------------------------------
@pytest.mark.parametrize("with_solutions", (False, True))
def test_presenter_leaves_check_cells_out(tmp_path, with_solutions):
    path = tmp_path / "00_first.ipynb"
    nbformat.write(_lesson(), path)
    nb = present.presenter_notebook(path, with_solutions=with_solutions)
    text = "\n".join(c.source for c in nb.cells)
    assert "checks ran" not in text and "assert 2 + 2" not in text
    assert "lecture ran" in text
    assert ("solution ran" in text) == with_solutions


def test_presenter_leaves_out_every_check_of_the_lessons():
    for stem in LECTURES:
        nb = present.presenter_notebook(ROOT / "notebooks" / f"{stem}.ipynb", with_solutions=True)
        assert not any(CHECK_TAG in c.metadata.get("tags", []) for c in nb.cells), stem


# -- klviz lab ---------------------------------------------------------------------------------------
@pytest.fixture()
def shipped(tmp_path):
    src = tmp_path / "shipped"
    src.mkdir()
    nbformat.write(_lesson(), src / "00_first.ipynb")
    (src / "claims.md").write_text(CLAIMS_MD, encoding="utf-8")
    return src


def test_lab_copies_the_claims_page_beside_the_lessons(tmp_path, shipped):
    dest = tmp_path / "work"
    report = labcmd.sync_lessons(dest, source=shipped)
    assert (dest / "claims.md").read_text(encoding="utf-8") == CLAIMS_MD
    assert report.pages == ["claims.md"] and any("claims.md" in line for line in report.lines())
    again = labcmd.sync_lessons(dest, source=shipped)
    assert again.pages == []  # up to date: nothing written
    (shipped / "claims.md").write_text(CLAIMS_MD + "\n## another-claim\n", encoding="utf-8")
    assert labcmd.sync_lessons(dest, source=shipped).pages == ["claims.md"]  # follows the installed page
    assert "another-claim" in (dest / "claims.md").read_text(encoding="utf-8")
    assert json.loads((dest / labcmd.MANIFEST).read_text()).keys() == {"00_first.ipynb"}  # not a lesson


def test_lab_writes_no_claims_page_through_a_link(tmp_path, shipped):
    victim = tmp_path / "victim"
    victim.mkdir()
    dest = tmp_path / "work"
    dest.mkdir()
    (dest / "claims.md").symlink_to(victim / "planted.md")  # dangling
    with pytest.raises(labcmd.UnsafeFolderError, match="claims.md is a symbolic link"):
        labcmd.sync_lessons(dest, source=shipped)
    assert not (victim / "planted.md").exists() and not (dest / "00_first.ipynb").exists()


def test_lab_without_a_claims_page_copies_only_lessons(tmp_path, shipped):
    (shipped / "claims.md").unlink()
    dest = tmp_path / "work"
    assert labcmd.sync_lessons(dest, source=shipped).pages == []
    assert not (dest / "claims.md").exists()


def test_the_shipped_lessons_come_with_their_claims_page():
    shipped = labcmd.shipped_notebooks_dir()
    assert (shipped / "claims.md").read_bytes() == (ROOT / "notebooks" / "claims.md").read_bytes()


# -- the wheel ---------------------------------------------------------------------------------------
def test_the_wheel_ships_the_claims_page(tmp_path):
    import tomllib

    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["klviz"]
    assert "notebooks/claims.md" in data
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    (wheel,) = tmp_path.glob("klviz-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        assert "klviz/notebooks/claims.md" in names
        assert z.read("klviz/notebooks/claims.md") == (ROOT / "notebooks" / "claims.md").read_bytes()
        lessons = {n for n in names if re.fullmatch(r"klviz/notebooks/\d\d_\w+\.ipynb", n)}
        assert len(lessons) == len(list((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")))


# -- the lessons read as lectures --------------------------------------------------------------------
@pytest.mark.parametrize("stem", LECTURES)
def test_no_assert_in_the_lecture_cells(stem):
    """Regression asserts live in cells tagged klviz-check (or in the exercises' collapsed solutions),
    never in the cells a reader reads."""
    nb = json.loads((ROOT / "notebooks" / f"{stem}.ipynb").read_text(encoding="utf-8"))
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        meta = cell.get("metadata", {})
        if CHECK_TAG in meta.get("tags", []) or meta.get("jupyter", {}).get("source_hidden"):
            continue
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        asserts = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Assert)]
        assert not asserts, f"{stem}, cell {cell['id']}: assert on line {asserts[0]} of a lecture cell"
