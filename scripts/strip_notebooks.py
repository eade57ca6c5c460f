"""Clean lesson notebooks into their stored form (defined in ``klviz/notebook_format.py``): no outputs,
no execution counts, no widget state, nbformat 4.5 with a unique id on every cell.

Usage: python scripts/strip_notebooks.py [--check] notebooks/*.ipynb
With --check nothing is written; the exit status is 1 if any notebook is not clean.
Standard library only (runs with any python3). ``make sync-notebooks`` (scripts/sync_notebooks.py)
does this and also writes the lessons' percent scripts.

Cell ids: an id that is valid and not already taken in the notebook is kept (JupyterLab gives new
cells random ones); a cell without one, or with a duplicate (a copied cell), gets an id derived from its
position, so running this twice changes nothing and two people cleaning the same notebook get the same ids.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from klviz.notebook_format import CELL_ID, clean_text, dumps, problems, strip  # noqa: E402,F401  (the one home)


def main(argv: list[str]) -> int:
    check = "--check" in argv
    paths = [Path(a) for a in argv if a != "--check"]
    dirty = []
    for path in paths:
        text = path.read_text(encoding="utf-8")
        clean = clean_text(text)
        if clean != text:
            what = ", ".join(problems(json.loads(text))) or "layout of the stored JSON"
            dirty.append(f"{path} ({what})")
            if not check:
                path.write_text(clean, encoding="utf-8")
    if check and dirty:
        print("not clean (run `make sync-notebooks`): " + "; ".join(dirty))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
