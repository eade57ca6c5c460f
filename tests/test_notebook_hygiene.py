"""Lesson notebooks are kept clean in git and paired with their percent scripts.

Stored form (scripts/strip_notebooks.py): no outputs, no execution counts, no widget state, nbformat
4.5 with a unique id on every cell, nbformat's JSON layout. Pairing (scripts/sync_notebooks.py):
``notebooks/scripts/NN_topic.py`` is the jupytext percent script of ``notebooks/NN_topic.ipynb``.
`make sync-notebooks` repairs all of it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import strip_notebooks  # noqa: E402
import sync_notebooks  # noqa: E402

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_stored_clean_at_nbformat_4_5_with_ids(nb):
    data = json.loads(nb.read_text(encoding="utf-8"))
    for i, cell in enumerate(data["cells"]):
        if cell["cell_type"] == "code":
            assert cell.get("outputs") == [], f"{nb.name} cell {i} has stored outputs (run `make sync-notebooks`)"
            assert cell.get("execution_count") is None, f"{nb.name} cell {i} has an execution count"
    assert "widgets" not in data.get("metadata", {}), f"{nb.name} stores widget state"
    assert data["metadata"]["kernelspec"]["name"] == "python3"
    assert (data["nbformat"], data["nbformat_minor"]) >= (4, 5), f"{nb.name} is nbformat 4.{data['nbformat_minor']}"
    ids = [cell.get("id") for cell in data["cells"]]
    assert all(isinstance(i, str) and strip_notebooks.CELL_ID.match(i) for i in ids), f"{nb.name}: a cell lacks an id"
    assert len(set(ids)) == len(ids), f"{nb.name}: duplicate cell ids"
    nbformat.validate(nbformat.reads(nb.read_text(encoding="utf-8"), as_version=nbformat.NO_CONVERT))
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts/strip_notebooks.py"), "--check", str(nb)], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.name)
def test_no_cell_holds_control_characters(nb):
    # a Python string escape such as "\rho" or "\nabla" written into a cell stores a carriage return or a
    # newline plus letters: the LaTeX then renders broken. Only newlines (and tabs) belong in a cell's source.
    data = json.loads(nb.read_text(encoding="utf-8"))
    for i, cell in enumerate(data["cells"]):
        text = "".join(cell["source"])
        bad = sorted({repr(ch) for ch in text if (ord(ch) < 32 and ch not in "\n\t") or 127 <= ord(ch) < 160})
        assert not bad, f"{nb.name} cell {i} holds control characters {', '.join(bad)}"
        # "\nabla" read as an escape is a newline followed by "abla": the one such case a newline hides
        assert "\nabla" not in text, f"{nb.name} cell {i}: a line starts with 'abla' (a '\\nabla' read as '\\n')"


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.name)
def test_percent_script_is_in_sync(nb):
    script = sync_notebooks.script_path(nb)
    assert script.is_file(), f"no {script.relative_to(ROOT)}: run `make sync-notebooks`"
    wanted = sync_notebooks.script_text(nb, strip_notebooks.clean_text(nb.read_text(encoding="utf-8")))
    assert script.read_text(encoding="utf-8") == wanted, (
        f"{script.relative_to(ROOT)} is out of date: run `make sync-notebooks`"
    )


def test_every_percent_script_has_its_notebook():
    scripts = sorted((ROOT / "notebooks" / sync_notebooks.SCRIPTS_DIR).glob("*.py"))
    assert [s.stem for s in scripts] == [nb.stem for nb in NOTEBOOKS]


def test_sync_check_passes_on_the_repository():
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts/sync_notebooks.py"), "--check"], capture_output=True, text=True, cwd=ROOT
    )
    assert out.returncode == 0, out.stdout + out.stderr


# ---- the scripts themselves, on notebooks made up for the test ----


def _raw_notebook(minor: int = 4) -> dict:
    cells = [
        {"cell_type": "markdown", "metadata": {}, "source": ["# Title\n", "Prose."]},
        {
            "cell_type": "code",
            "execution_count": 3,
            "metadata": {"scrolled": True, "tags": ["keep"]},
            "outputs": [{"output_type": "stream", "name": "stdout", "text": ["1\n"]}],
            "source": ["x = 1\n", "x"],
        },
        {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": ["y = 2"]},
    ]
    return {
        "cells": cells,
        "metadata": {
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
            "language_info": {"name": "python", "version": "3.11.7"},
            "widgets": {"state": {}},
        },
        "nbformat": 4,
        "nbformat_minor": minor,
    }


def test_strip_upgrades_to_4_5_with_deterministic_ids_and_is_idempotent():
    clean = strip_notebooks.strip(_raw_notebook())
    assert (clean["nbformat"], clean["nbformat_minor"]) == (4, 5)
    assert clean["metadata"] == {
        "kernelspec": _raw_notebook()["metadata"]["kernelspec"],
        "language_info": {"name": "python"},
    }
    code = clean["cells"][1]
    assert code["outputs"] == [] and code["execution_count"] is None and code["metadata"] == {"tags": ["keep"]}
    ids = [c["id"] for c in clean["cells"]]
    assert len(set(ids)) == 3 and ids == [c["id"] for c in strip_notebooks.strip(_raw_notebook())["cells"]]
    text = strip_notebooks.dumps(clean)
    assert strip_notebooks.clean_text(text) == text  # a second pass changes nothing
    nbformat.validate(nbformat.reads(text, as_version=nbformat.NO_CONVERT))


def test_strip_keeps_ids_and_repairs_duplicates():
    raw = _raw_notebook(minor=5)
    for cell, cell_id in zip(raw["cells"], ["intro", "intro", None]):  # a copied cell, a new one
        if cell_id:
            cell["id"] = cell_id
    ids = [c["id"] for c in strip_notebooks.strip(raw)["cells"]]
    assert ids[0] == "intro" and len(set(ids)) == 3
    assert strip_notebooks.problems(raw) == [
        "cells without a valid id",
        "stored outputs",
        "execution counts",
        "widget state",
    ]


def test_sync_writes_the_script_and_check_names_what_is_wrong(tmp_path):
    folder = tmp_path / "notebooks"
    folder.mkdir()
    nb = folder / "09_test.ipynb"
    nb.write_text(json.dumps(_raw_notebook()), encoding="utf-8")
    [stale] = sync_notebooks.sync([nb], check=True)
    assert "09_test.ipynb" in stale and "nbformat 4.4" in stale and "no script" in stale
    sync_notebooks.sync([nb], check=False)
    script = folder / "scripts" / "09_test.py"
    text = script.read_text(encoding="utf-8")
    assert text.startswith("# Generated from notebooks/09_test.ipynb")
    assert "# %% [markdown]\n# # Title\n# Prose.\n" in text and "# %%\nx = 1\nx\n" in text
    assert str(tmp_path) not in text
    assert sync_notebooks.sync([nb], check=True) == []  # in sync, and idempotent
    stored = nb.read_text(encoding="utf-8")
    sync_notebooks.sync([nb], check=False)
    assert nb.read_text(encoding="utf-8") == stored and script.read_text(encoding="utf-8") == text

    script.write_text(text + "z = 3\n", encoding="utf-8")  # an edit to the generated script
    [stale] = sync_notebooks.sync([nb], check=True)
    assert "09_test.ipynb" in stale and "out of date" in stale
    (folder / "scripts" / "08_gone.py").write_text("", encoding="utf-8")
    assert any("08_gone.py: no notebook" in s for s in sync_notebooks.sync([nb], check=True))


def test_the_kernel_is_named_one_way_whoever_saved_the_lesson():
    """JupyterLab writes the display name of the kernel it started ("Python 3 (ipykernel)" with a recent
    ipykernel): the stored form, and a save through ``make lab``, name it "Python 3" as every lesson does."""
    from klviz.notebook_format import PYTHON3_KERNELSPEC, strip_outputs_before_save

    raw = _raw_notebook(minor=5)
    raw["metadata"]["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    assert "kernelspec" in ", ".join(strip_notebooks.problems(raw))
    assert strip_notebooks.strip(raw)["metadata"]["kernelspec"] == PYTHON3_KERNELSPEC
    model = {"type": "notebook", "content": raw}
    strip_outputs_before_save(model)
    assert model["content"]["metadata"]["kernelspec"] == PYTHON3_KERNELSPEC
    other = _raw_notebook(minor=5)
    other["metadata"]["kernelspec"] = {"name": "julia-1.10", "display_name": "Julia 1.10", "language": "julia"}
    assert strip_notebooks.strip(other)["metadata"]["kernelspec"]["display_name"] == "Julia 1.10"  # not ours to rename
    for path in NOTEBOOKS:
        assert json.loads(path.read_text(encoding="utf-8"))["metadata"]["kernelspec"] == PYTHON3_KERNELSPEC, path.name
