"""Strip outputs, execution counts and widget state from notebooks (the form they are kept in git).

Usage: python scripts/strip_notebooks.py [--check] notebooks/*.ipynb
With --check nothing is written; the exit status is 1 if any notebook is not clean.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

KEEP_NOTEBOOK_METADATA = ("kernelspec", "language_info")


def strip(nb: dict) -> dict:
    """Return a copy of the notebook dict with outputs, counts and volatile metadata removed."""
    out = dict(nb)
    out["metadata"] = {k: v for k, v in nb.get("metadata", {}).items() if k in KEEP_NOTEBOOK_METADATA}
    if "language_info" in out["metadata"]:
        out["metadata"]["language_info"] = {"name": "python"}
    cells = []
    for cell in nb["cells"]:
        c = dict(cell)
        meta = {k: v for k, v in c.get("metadata", {}).items() if k in ("jupyter", "tags")}
        c["metadata"] = meta
        if c["cell_type"] == "code":
            c["outputs"] = []
            c["execution_count"] = None
        cells.append(c)
    out["cells"] = cells
    return out


def dumps(nb: dict) -> str:
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> int:
    check = "--check" in argv
    paths = [Path(a) for a in argv if a != "--check"]
    dirty = []
    for path in paths:
        text = path.read_text(encoding="utf-8")
        clean = dumps(strip(json.loads(text)))
        if clean != text:
            dirty.append(path)
            if not check:
                path.write_text(clean, encoding="utf-8")
    if check and dirty:
        print("not stripped (run `make strip`): " + ", ".join(map(str, dirty)))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
