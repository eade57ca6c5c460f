"""The form in which lesson notebooks are stored, in one place: no outputs, no execution counts, no
widget state, nbformat 4.5 with a unique id on every cell, nbformat's JSON layout.

Used by ``scripts/strip_notebooks.py`` and ``make sync-notebooks`` (which clean the repository's
lessons), by the lab that ``make lab`` serves from the repository (a notebook saved there is
stored in this form, so running a lesson does not modify tracked files) and by the wheel build
(which refuses lessons that carry outputs). Standard library only, so the scripts run with any
python3 before klviz's dependencies are installed.

Cell ids: an id that is valid and not already taken in the notebook is kept (JupyterLab gives new
cells random ones); a cell without one, or with a duplicate (a copied cell), gets an id derived from its
position, so running this twice changes nothing and two people cleaning the same notebook get the same ids.
"""

from __future__ import annotations

import hashlib
import json
import re

KEEP_NOTEBOOK_METADATA = ("kernelspec", "language_info")
#: The kernel every lesson names. JupyterLab writes the display name of the kernel it started
#: ("Python 3 (ipykernel)" with ipykernel 6 and later, "Python 3" before), so a lesson saved on
#: another machine would change only that line; the stored form always names it this way.
PYTHON3_KERNELSPEC = {"display_name": "Python 3", "language": "python", "name": "python3"}
KEEP_CELL_METADATA = ("jupyter", "tags")
#: A code cell tagged so holds a lesson's regression checks (asserts on the numbers it states): it runs
#: under nbval like every cell, but is stored with its source collapsed, and the site, the presenter
#: and a reader's JupyterLab fold it away (a reader sees a lecture, not a test file).
CHECK_TAG = "klviz-check"
NBFORMAT = (4, 5)
CELL_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")  # nbformat 4.5 schema


def derived_id(index: int, taken: set[str]) -> str:
    """A deterministic id for the cell at ``index``: 8 hex digits (the look of Jupyter's own ids)."""
    salt = 0
    while True:
        key = f"klviz-cell-{index}" + (f"-{salt}" if salt else "")
        cell_id = hashlib.sha1(key.encode()).hexdigest()[:8]
        if cell_id not in taken:
            return cell_id
        salt += 1


def strip(nb: dict) -> dict:
    """Return a copy of the notebook dict in its stored form (see the module docstring)."""
    out = dict(nb)
    out["metadata"] = {k: v for k, v in nb.get("metadata", {}).items() if k in KEEP_NOTEBOOK_METADATA}
    if "language_info" in out["metadata"]:
        out["metadata"]["language_info"] = {"name": "python"}
    kernelspec = out["metadata"].get("kernelspec")
    if isinstance(kernelspec, dict) and kernelspec.get("name") == PYTHON3_KERNELSPEC["name"]:
        out["metadata"]["kernelspec"] = dict(PYTHON3_KERNELSPEC)
    if (nb.get("nbformat", 0), nb.get("nbformat_minor", 0)) < NBFORMAT:
        out["nbformat"], out["nbformat_minor"] = NBFORMAT
    cells = [dict(cell) for cell in nb["cells"]]
    # ids kept first (in order), so that a copied cell, not the original, is the one that gets a new id
    kept: set[str] = set()
    for c in cells:
        cell_id = c.get("id")
        if isinstance(cell_id, str) and CELL_ID.match(cell_id) and cell_id not in kept:
            kept.add(cell_id)
        else:
            c.pop("id", None)
    for i, c in enumerate(cells):
        if "id" not in c:
            c["id"] = derived_id(i, kept)
            kept.add(c["id"])
        c["metadata"] = {k: v for k, v in c.get("metadata", {}).items() if k in KEEP_CELL_METADATA}
        if CHECK_TAG in c["metadata"].get("tags", []):
            c["metadata"]["jupyter"] = {**c["metadata"].get("jupyter", {}), "source_hidden": True}
        if c["cell_type"] == "code":
            c["outputs"] = []
            c["execution_count"] = None
    out["cells"] = cells
    return out


def problems(nb: dict) -> list[str]:
    """What keeps ``nb`` from being in its stored form, in words (empty when it is clean)."""
    found = []
    if (nb.get("nbformat", 0), nb.get("nbformat_minor", 0)) < NBFORMAT:
        found.append(f"nbformat {nb.get('nbformat')}.{nb.get('nbformat_minor')} (wants 4.5 with cell ids)")
    ids = [c.get("id") for c in nb.get("cells", [])]
    if any(not (isinstance(i, str) and CELL_ID.match(i)) for i in ids):
        found.append("cells without a valid id")
    elif len(set(ids)) != len(ids):
        found.append("duplicate cell ids")
    code = [c for c in nb.get("cells", []) if c.get("cell_type") == "code"]
    if any(c.get("outputs") for c in code):
        found.append("stored outputs")
    if any(c.get("execution_count") is not None for c in code):
        found.append("execution counts")
    if "widgets" in nb.get("metadata", {}):
        found.append("widget state")
    kernelspec = nb.get("metadata", {}).get("kernelspec")
    if isinstance(kernelspec, dict) and kernelspec.get("name") == "python3" and kernelspec != PYTHON3_KERNELSPEC:
        found.append(f"kernelspec {kernelspec} (wants {PYTHON3_KERNELSPEC})")
    tagged = [c for c in nb.get("cells", []) if CHECK_TAG in c.get("metadata", {}).get("tags", [])]
    if any(not c["metadata"].get("jupyter", {}).get("source_hidden") for c in tagged):
        found.append(f"a {CHECK_TAG} cell whose source is not collapsed")
    return found


def dumps(nb: dict) -> str:
    """The stored JSON: nbformat's own layout (indent 1, sorted keys, UTF-8 as is, final newline)."""
    return json.dumps(nb, indent=1, ensure_ascii=False, sort_keys=True) + "\n"


def clean_text(text: str) -> str:
    """The stored form of a notebook given as the text of its file."""
    return dumps(strip(json.loads(text)))


def strip_outputs_before_save(model: dict, **_kwargs: object) -> None:
    """A Jupyter ``ContentsManager.pre_save_hook``: a notebook is saved in its stored form.

    ``make lab`` serves the repository's lessons in place with this hook, so running and saving a
    lesson leaves ``git status`` clean (only edits of cell sources show).
    """
    if model.get("type") != "notebook" or not isinstance(model.get("content"), dict):
        return
    clean = strip(json.loads(json.dumps(model["content"])))
    model["content"].clear()
    model["content"].update(clean)
