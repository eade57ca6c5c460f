"""The lessons' translations: update the catalogues, build an edition, check that it is current.

    python scripts/translations.py update          # merge the English lessons into notebooks/locale/zh_CN/*.po
    python scripts/translations.py build [--out build/zh]   # the Chinese lessons, built from the catalogues
    python scripts/translations.py --check         # exit 1, naming each entry that is missing or out of date
    python scripts/translations.py glossary [--write]   # lesson 00's English glossary cell, from glossary.csv

``update`` keys each lesson's markdown cells by cell id: a new cell gets an empty entry, a cell whose
English changed keeps its translation marked fuzzy (with the English it was translated from as
``#| msgid``, to diff against), a removed cell's entry becomes obsolete. It also regenerates the
Chinese glossary cell from ``notebooks/locale/glossary.csv`` and the list of claim marker units
(``claims.po``). Then translate: edit the ``msgstr`` of each new or fuzzy entry (and delete the
``fuzzy`` flag) in any PO editor or by hand, and run ``--check``. The check also compares each
translation with its English: the same claim markers (``[在 2,000 对随机词元分布上检验](claims.md#id)``),
formulas, code names, links and numbers, and the same headings, table rows and list items.

The words the library itself shows (panel controls and readouts, check messages, figure labels,
tables) are marked in the code with ``klviz.messages.tr``; ``update`` also extracts them into
``klviz/locale/zh_CN/LC_MESSAGES/klviz.po`` and ``--check`` fails while one has no current
translation (see ``klviz/messages.py``).

See ``klviz/i18n.py`` for the format and the choices behind it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from klviz import claims_text, code_text, i18n, messages  # noqa: E402
from klviz.notebook_format import dumps  # noqa: E402

NOTEBOOKS = ROOT / "notebooks"
PACKAGE = ROOT / "klviz"
_ENGLISH_UNIT = i18n._ENGLISH_MARKER  # "checked on 2,000 random token pairs"


def _units_in(notebooks: Path) -> set[str]:
    units = set()
    for nb_path in i18n.lesson_notebooks(notebooks):
        nb = json.loads(nb_path.read_text(encoding="utf-8"))
        for _cid, source in i18n.markdown_cells(nb):
            for label, _anchor in i18n._MARKER.findall(source):
                m = _ENGLISH_UNIT.match(" ".join(label.split()))
                if m:
                    units.add(m.group(2))
    return units


def update(notebooks: Path, lang: str, package: Path = PACKAGE) -> int:
    glossary = i18n.render_glossary(lang, i18n.read_glossary(i18n.glossary_path(notebooks)))
    for nb_path in i18n.lesson_notebooks(notebooks):
        po = i18n.catalogue_path(nb_path.stem, lang, notebooks)
        old = i18n.read_catalogue(po, lang) if po.is_file() else None
        nb = json.loads(nb_path.read_text(encoding="utf-8"))
        new, changes = i18n.update_catalogue(nb, old, nb_path.stem, lang, glossary=glossary)
        i18n.write_catalogue(new, po)
        print(f"{po.relative_to(notebooks.parent)}: {changes.summary()}")
        code_po = i18n.code_catalogue_path(nb_path.stem, lang, notebooks)
        old_code = i18n.read_catalogue(code_po, lang) if code_po.is_file() else None
        new_code, summary = code_text.update_code_catalogue(nb, old_code, nb_path.stem, lang)
        i18n.write_catalogue(new_code, code_po)
        print(f"{code_po.relative_to(notebooks.parent)}: {', '.join(summary) or 'up to date'}")
    units = i18n.units_path(lang, notebooks)
    old = i18n.read_catalogue(units, lang) if units.is_file() else None
    claims = i18n.update_units(_units_in(notebooks), old, lang)
    page = notebooks / "claims.md"
    if page.is_file():
        touched = claims_text.update_claims_catalogue(page.read_text(encoding="utf-8"), old, claims)
        print(f"{units.relative_to(notebooks.parent)}: {len(touched)} claims page texts new or changed")
    i18n.write_catalogue(claims, units)
    summary = messages.update(lang, package)  # the library's own words: klviz/locale/<lang>/LC_MESSAGES/klviz.po
    print(f"{messages.catalogue_file(lang, package).relative_to(package.parent)}: {summary}")
    return 0


def check(notebooks: Path, lang: str, package: Path = PACKAGE) -> int:
    found = i18n.problems(lang, notebooks) + messages.problems(lang, package)
    if found:
        print(f"the {lang} edition is not current ({len(found)}):")
        for line in found:
            print(f"  {line}")
        print("fix: `python scripts/translations.py update`, then translate each entry named above")
        return 1
    print(
        f"the {lang} edition is current: every markdown cell of every lesson, every word their code cells show, "
        "and every string the library shows has an up-to-date translation"
    )
    return 0


def build(notebooks: Path, lang: str, out: Path) -> int:
    written = i18n.build_edition(lang, out, notebooks)
    print(f"wrote {len(written)} lessons into {out}")
    return 0


def glossary(notebooks: Path, write: bool) -> int:
    """Print lesson 00's English glossary cell rendered from the glossary; ``--write`` puts it in the lesson."""
    text = i18n.render_glossary("en", i18n.read_glossary(i18n.glossary_path(notebooks)))
    if not write:
        print(text)
        return 0
    path = next(p for p in i18n.lesson_notebooks(notebooks) if p.name.startswith("00_"))
    nb = json.loads(path.read_text(encoding="utf-8"))
    cells = [
        c
        for c in nb["cells"]
        if c["cell_type"] == "markdown" and i18n.is_glossary_cell(path.stem, "".join(c["source"]))
    ]
    if len(cells) != 1:
        print(f"{path.name}: found {len(cells)} glossary cells (a markdown cell starting `## Glossary`), want 1")
        return 1
    cells[0]["source"] = text.splitlines(keepends=True)
    path.write_text(dumps(nb), encoding="utf-8")
    print(
        f"rewrote the glossary cell of {path.name}; now run `make sync-notebooks` and `scripts/translations.py update`"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", nargs="?", choices=("update", "build", "check", "glossary"))
    parser.add_argument("--check", action="store_true", help="the same as the `check` command")
    parser.add_argument("--lang", default="zh", help="the edition (default zh)")
    parser.add_argument("--out", type=Path, default=None, help="build: the folder to write (default build/LANG)")
    parser.add_argument("--write", action="store_true", help="glossary: rewrite lesson 00's English glossary cell")
    parser.add_argument("--notebooks", type=Path, default=NOTEBOOKS, help="the English lessons (default notebooks/)")
    parser.add_argument("--package", type=Path, default=PACKAGE, help="the package whose strings to check (klviz/)")
    args = parser.parse_args(argv)
    command = "check" if args.check else args.command
    if command is None:
        parser.error("say what to do: update, build, check (or --check), glossary")
    try:
        lang = i18n.edition(args.lang)
    except ValueError as err:
        parser.error(str(err))
    if lang == "en" and command != "build":
        parser.error("the English lessons are the source: nothing to update or check")
    notebooks = args.notebooks.resolve()
    package = args.package.resolve()
    if command == "update":
        return update(notebooks, lang, package)
    if command == "check":
        return check(notebooks, lang, package)
    if command == "build":
        return build(notebooks, lang, args.out or ROOT / "build" / lang)
    return glossary(notebooks, args.write)


if __name__ == "__main__":
    sys.exit(main())
