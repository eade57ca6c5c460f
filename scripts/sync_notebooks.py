"""Clean the lesson notebooks and write their paired percent scripts (``make sync-notebooks``).

The ``.ipynb`` is the source (JupyterLab, nbval and the site use it). For ``notebooks/NN_topic.ipynb``
this script

1. stores the notebook in its clean form (``scripts/strip_notebooks.py``: no outputs, no execution
   counts, no widget state, nbformat 4.5 with stable cell ids), and
2. writes ``notebooks/scripts/NN_topic.py``, the same cells as a jupytext percent script
   (``# %%`` code cells, ``# %% [markdown]`` prose as comments), which ruff lints and whose diffs read
   like code. It is generated: edit the notebook, then run this again.

Usage: python scripts/sync_notebooks.py [--check] [notebooks/NN_topic.ipynb ...]   (default: all lessons)
With --check nothing is written; the exit status is 1, naming each notebook, when a notebook is not
clean or its script is missing or out of date, or a script has no notebook. Running it twice changes nothing.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jupytext
import nbformat

sys.path.insert(0, str(Path(__file__).resolve().parent))
from strip_notebooks import clean_text, problems  # noqa: E402  (the one home of the cleaning)

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
SCRIPTS_DIR = "scripts"  # beside the notebooks: notebooks/scripts/NN_topic.py
FORMAT = "py:percent"
# no YAML header (it would carry jupytext's version) and no cell metadata: code and prose only
JUPYTEXT_METADATA = {"notebook_metadata_filter": "-all", "cell_metadata_filter": "-all"}


def script_path(notebook: Path) -> Path:
    return notebook.parent / SCRIPTS_DIR / (notebook.stem + ".py")


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def script_text(notebook: Path, clean: str) -> str:
    """The percent script of a notebook whose clean stored text is ``clean``."""
    nb = nbformat.reads(clean, as_version=4)
    nb.metadata["jupytext"] = dict(JUPYTEXT_METADATA)
    body = jupytext.writes(nb, fmt=FORMAT)
    name = f"{notebook.parent.name}/{notebook.name}"  # never a path of this machine
    return f"# Generated from {name} by `make sync-notebooks`: edit the notebook, not this file.\n\n{body}"


def sync(notebooks: list[Path], check: bool) -> list[str]:
    """Clean and pair ``notebooks`` (or, with ``check``, only report); returns what was (or is) out of date."""
    stale = []
    for nb_path in notebooks:
        text = nb_path.read_text(encoding="utf-8")
        clean = clean_text(text)
        script = script_path(nb_path)
        wanted = script_text(nb_path, clean)
        reasons = []
        if clean != text:
            reasons.append(", ".join(problems(json.loads(text))) or "layout of the stored JSON")
        if not script.is_file():
            reasons.append(f"no script {_shown(script)}")
        elif script.read_text(encoding="utf-8") != wanted:
            reasons.append(f"{_shown(script)} out of date")
        if reasons:
            stale.append(f"{_shown(nb_path)}: {'; '.join(reasons)}")
        if not check:
            if clean != text:
                nb_path.write_text(clean, encoding="utf-8")
            if not script.is_file() or script.read_text(encoding="utf-8") != wanted:
                script.parent.mkdir(exist_ok=True)
                script.write_text(wanted, encoding="utf-8")
    # a script whose notebook is gone (renamed, deleted)
    for folder in sorted({nb.parent for nb in notebooks}):
        for orphan in sorted((folder / SCRIPTS_DIR).glob("*.py")):
            if not (folder / (orphan.stem + ".ipynb")).exists():
                stale.append(f"{_shown(orphan)}: no notebook {orphan.stem}.ipynb")
                if not check:
                    orphan.unlink()
    return stale


def main(argv: list[str]) -> int:
    check = "--check" in argv
    paths = [Path(a) for a in argv if a != "--check"] or sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    stale = sync(paths, check)
    if check and stale:
        print("notebooks not in sync (run `make sync-notebooks`):\n  " + "\n  ".join(stale))
        return 1
    for line in stale:
        print("synced " + line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
