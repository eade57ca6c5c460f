"""The lessons in other languages: gettext catalogues of their prose, one per lesson, and the edition
built from them.

One source, no drift. A lesson's code cells, numbers and figures exist once, in the English notebook
(the words its code cells show, figure titles and printed lines, have their own catalogue per lesson:
:mod:`klviz.code_text`).
What a reader reads, its markdown cells, has a translation in a gettext catalogue (``.po``, read and
written with Babel, which JupyterLab already installs), one per lesson::

    notebooks/locale/zh_CN/LC_MESSAGES/02_three_estimators.po

    #. en-sha256 3f0c2a9b1d7e
    #: 02_three_estimators.ipynb
    msgctxt "4c1d9e2a"                 <- the cell id
    msgid "## Why k3 has low variance ..."   <- the English cell, as it was when last updated
    msgstr "## 为什么 k3 的方差小 ..."          <- the Chinese

:func:`update_catalogue` merges a lesson's current English into its catalogue by cell id: a new cell
gets an empty entry, a cell whose English changed keeps its old translation marked ``fuzzy`` with the
English it was translated from as ``#| msgid`` (what a translator diffs against), a removed cell's
entry becomes obsolete (``#~``). :func:`problems` lists every entry that keeps the edition from being
current (missing, fuzzy, not updated, or a translation that lost a claim marker, a formula, a code
name, a link or a number of its English); CI fails while that list is not empty.
:func:`build_edition` writes the translated notebooks: the same cells with the same ids, code cells
byte for byte, each markdown cell replaced by its translation (an entry that is missing or fuzzy
shows the English, as gettext does). The built notebooks are not stored in git: code exists once.

The glossary (``notebooks/locale/glossary.csv``, English and Chinese side by side) serves both
editions: lesson 00's glossary cell is rendered from it (:func:`render_glossary`), and the
translations use its terms.
"""

from __future__ import annotations

import copy
import csv
import hashlib
import io
import json
import os
import re
import shutil
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from babel.messages.catalog import Catalog, Message

__all__ = [
    "EDITIONS",
    "LOCALES",
    "edition",
    "locale_dir",
    "catalogue_path",
    "code_catalogue_path",
    "units_path",
    "glossary_path",
    "markdown_cells",
    "english_hash",
    "read_catalogue",
    "write_catalogue",
    "update_catalogue",
    "carried_over",
    "untranslated",
    "update_units",
    "CatalogueChanges",
    "GlossaryTerm",
    "read_glossary",
    "render_glossary",
    "is_glossary_cell",
    "marker_text",
    "mismatches",
    "problems",
    "translate_notebook",
    "translate_lesson",
    "write_claims_page",
    "build_edition",
]

#: The editions there are: ``en`` (the source) and the languages with catalogues.
EDITIONS = ("en", "zh")
#: Edition -> gettext locale (the catalogues' folder name).
LOCALES = {"zh": "zh_CN"}
_ALIASES = {"en": "en", "english": "en", "zh": "zh", "zh_cn": "zh", "zh-cn": "zh", "zh-hans": "zh", "cn": "zh"}

#: The comment that records the hash of the English an entry was updated from.
HASH_PREFIX = "en-sha256 "
GLOSSARY_NOTE = "generated from glossary.csv by `scripts/translations.py update`: edit the glossary, not this entry"
UNIT_CONTEXT = "claim marker unit"
UNITS_CATALOGUE = "claims"

_HEADER = """\
# {language} translation of the markdown cells of {what}.
# msgctxt: the cell id; msgid: the English cell as it was at the last update; msgstr: the translation.
# After an English cell changes, `python scripts/translations.py update` marks its entry fuzzy (the
# English it was translated from stays as "#| msgid"): revise the msgstr, then delete the fuzzy flag.
# This file is distributed under the same license as klviz.
#"""
_UNITS_HEADER = """\
# {language} translation of the words of the claims page (notebooks/claims.md).
# msgctxt "claim marker unit": the unit of each claim marker; a lesson's marker `checked on 2,000 random token
# pairs` reads `在 2,000 <msgstr>上检验` in the translation (klviz.i18n.marker_text).
# msgctxt "<claim id>": the claim's wording; "<claim id> domain": the domain its test checks; "page head": the
# text above the first claim (klviz.claims_text). `python scripts/translations.py update` merges the current
# English: a changed text is marked fuzzy, with the English it was translated from as "#| msgid".
# This file is distributed under the same license as klviz.
#"""
CODE_HEADER = """\
# {language} translation of the words shown by the code cells of
# {what}: figure titles, axis labels, legend entries, annotations, printed lines (klviz.code_text).
# msgctxt: the cell id; msgid: the string literal as written in the English code, {{fields}} included;
# msgstr: its translation, keeping every {{field}}, $formula$ and number of the English.
# After an English literal changes, `python scripts/translations.py update` marks its entry fuzzy (the
# English it was translated from stays as "#| msgid"): revise the msgstr, then delete the fuzzy flag.
# This file is distributed under the same license as klviz.
#"""
_LANGUAGE_NAMES = {"zh": "Simplified Chinese (zh_CN)"}


def edition(lang: str) -> str:
    """``lang`` as an edition code (``"en"`` or ``"zh"``); ``zh_CN``, ``zh-CN``, ``zh-Hans`` mean ``"zh"``.

    Raises ValueError naming ``lang`` for a language without an edition."""
    if not isinstance(lang, str) or lang.strip().lower() not in _ALIASES:
        raise ValueError(f"lang {lang!r} has no edition; choose one of {', '.join(EDITIONS)}")
    return _ALIASES[lang.strip().lower()]


# -- where things are ----------------------------------------------------------------------------
def _notebooks(folder: str | os.PathLike[str] | None) -> Path:
    if folder is not None:
        return Path(folder)
    from .labcmd import shipped_notebooks_dir

    return shipped_notebooks_dir()


def locale_dir(notebooks: str | os.PathLike[str] | None = None) -> Path:
    """``notebooks/locale``: the catalogues and the glossary (shipped inside the package)."""
    return _notebooks(notebooks) / "locale"


def catalogue_path(stem: str, lang: str = "zh", notebooks: str | os.PathLike[str] | None = None) -> Path:
    """The catalogue of lesson ``stem`` (``"02_three_estimators"``) in edition ``lang``."""
    return locale_dir(notebooks) / LOCALES[edition(lang)] / "LC_MESSAGES" / f"{stem}.po"


def code_catalogue_path(stem: str, lang: str = "zh", notebooks: str | os.PathLike[str] | None = None) -> Path:
    """The catalogue of the words lesson ``stem``'s code cells show (:mod:`klviz.code_text`)."""
    return catalogue_path(f"{stem}.code", lang, notebooks)


def units_path(lang: str = "zh", notebooks: str | os.PathLike[str] | None = None) -> Path:
    """The catalogue of the claims page's words (the units in claim markers: "random token pairs")."""
    return catalogue_path(UNITS_CATALOGUE, lang, notebooks)


def glossary_path(notebooks: str | os.PathLike[str] | None = None) -> Path:
    return locale_dir(notebooks) / "glossary.csv"


def lesson_notebooks(notebooks: str | os.PathLike[str] | None = None) -> list[Path]:
    folder = _notebooks(notebooks)
    return sorted(p for p in folder.glob("[0-9][0-9]_*.ipynb"))


def _source(cell: Mapping[str, object]) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else str(src)


def markdown_cells(nb: Mapping[str, object]) -> list[tuple[str, str]]:
    """``(cell id, source)`` of each markdown cell of a notebook, in order."""
    cells = nb.get("cells", [])
    assert isinstance(cells, list)
    return [(str(c.get("id")), _source(c)) for c in cells if c.get("cell_type") == "markdown"]


def english_hash(text: str) -> str:
    """The first 12 hex digits of the SHA-256 of an English cell (recorded beside its entry)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


# -- catalogues (Babel) ---------------------------------------------------------------------------
def read_catalogue(path: str | os.PathLike[str], lang: str = "zh") -> Catalog:
    """A ``.po`` file as a Babel catalogue (obsolete entries kept in ``catalog.obsolete``)."""
    from babel.messages.pofile import read_po

    with open(path, "rb") as f:
        catalog = read_po(f, locale=LOCALES[edition(lang)], abort_invalid=True)
    for message in list(catalog) + list(catalog.obsolete.values()):
        _recover_previous(message)
    return catalog


def _po_string(quoted: str) -> str:
    """The text of one quoted ``.po`` string such as ``"a\\n"`` (gettext's C escapes)."""
    from babel.messages.pofile import unescape

    return unescape(quoted)


def _recover_previous(message: Message) -> None:
    """Babel does not read ``#| msgid`` lines back (it keeps them as translator comments): move the English a
    fuzzy entry was made from into ``message.previous_id``. Reads the form :func:`write_catalogue` writes (one
    quoted string per line) and Babel's own, whose long comment lines are wrapped at a space."""
    lines = [c[1:].strip() for c in message.user_comments if c.startswith("|")]
    if not lines:
        return
    message.user_comments = [c for c in message.user_comments if not c.startswith("|")]
    joined = " ".join(lines)
    if not joined.startswith("msgid "):
        return  # an old msgctxt or msgid_plural: cells have neither
    quoted = re.findall(r'"(?:[^"\\]|\\.)*"', joined[len("msgid ") :])
    message.previous_id = ["".join(_po_string(q) for q in quoted)]


def _new_catalogue(lang: str, what: str | None, like: Catalog | None = None, header: str | None = None) -> Catalog:
    """An empty catalogue for lesson ``what`` (None: the claim units), dated as ``like`` if given;
    ``header``: the comment at its top (default: that of a lesson's markdown cells)."""
    from datetime import datetime, timezone

    from babel.messages.catalog import Catalog

    code = edition(lang)
    language = _LANGUAGE_NAMES.get(code, code)
    created = like.creation_date if like is not None else datetime.now(timezone.utc).replace(second=0, microsecond=0)
    template = header or (_HEADER if what else _UNITS_HEADER)
    header = template.format(language=language, what=what)
    return Catalog(
        locale=LOCALES[code],
        header_comment=header,
        project="klviz",
        version="lessons",
        last_translator="klviz contributors",
        language_team=f"{language} (klviz)",
        creation_date=created,
        revision_date=created,
        fuzzy=False,
    )


def write_catalogue(catalog: Catalog, path: str | os.PathLike[str]) -> None:
    """Write ``catalog`` as a ``.po`` file: lines unwrapped (one line of a cell per line of the file),
    entries in cell order, the English each fuzzy entry was translated from kept as ``#| msgid``.
    The output depends only on the entries (no tool version in the header), so an update that
    changes nothing rewrites the same bytes."""
    from babel.messages.pofile import write_po

    for message in list(catalog) + list(catalog.obsolete.values()):
        # Babel guesses these from `%` and `{` in the text (LaTeX has plenty); they mean nothing here
        message.flags -= {"python-format", "python-brace-format"}
    buf = io.BytesIO()
    write_po(buf, catalog, width=0, include_previous=False, include_lineno=False)
    text = _with_previous(buf.getvalue().decode("utf-8"), catalog)
    drop = ('"Generated-By: ', '"Report-Msgid-Bugs-To: ')  # a tool version; an address there is none of
    text = "".join(line for line in text.splitlines(keepends=True) if not line.startswith(drop))
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, target)


def _with_previous(text: str, catalog: Catalog) -> str:
    """``text`` (a catalogue written without previous msgids) with each live fuzzy entry's English written as
    gettext does, one quoted line per line of the cell, above its ``msgctxt``. Babel would wrap these comment
    lines at 76 characters, and its reader does not read them back."""
    from babel.messages.pofile import escape

    previous = {
        (str(m.context), str(m.id)): p for m in catalog if m.context and "fuzzy" in m.flags and (p := _previous(m))
    }
    if not previous:
        return text
    lines = text.splitlines(keepends=True)
    out = []
    for i, line in enumerate(lines):
        match = re.fullmatch(r'msgctxt "([^"\\]*)"\n', line)
        if match:
            msgid, j = [], i + 1
            while j < len(lines) and (lines[j].startswith('"') or (j == i + 1 and lines[j].startswith("msgid "))):
                msgid.append(lines[j].removeprefix("msgid ").strip())
                j += 1
            key = (match.group(1), "".join(_po_string(q) for q in msgid))
            if key in previous:
                out.append('#| msgid ""\n')
                out += [f"#| {escape(part)}\n" for part in previous[key].splitlines(keepends=True)]
        out.append(line)
    return "".join(out)


def untranslated(message: Message) -> str | None:
    """Why ``message`` has no current translation (``"not translated yet"``, or fuzzy), None when it has one."""
    if not message.string:
        return "not translated yet"
    if "fuzzy" in message.flags:
        return "out of date (fuzzy): the English changed since it was translated"
    return None


def carried_over(prev: Message, english: str) -> tuple[str, set[str], str | None]:
    """What the entry for ``english`` takes from ``prev``, the entry its cell, claim or literal had before, as
    ``msgmerge`` does: ``(translation, flags, previous msgid)``. Unchanged English keeps the translation and its
    fuzzy flag; changed English keeps the translation marked fuzzy, with the English it was made from as previous
    msgid (an entry already fuzzy keeps its first one, the one a translator diffs against)."""
    string = str(prev.string or "")
    if prev.id == english:
        flags = set(prev.flags) & {"fuzzy"}
        return string, flags, (_previous(prev) if string and flags else None)
    if not string:
        return "", set(), None
    return string, {"fuzzy"}, (_previous(prev) if "fuzzy" in prev.flags else None) or str(prev.id)


def _previous(message: Message) -> str | None:
    """The English a fuzzy entry was translated from (its ``#| msgid``), if recorded."""
    prev = message.previous_id
    if isinstance(prev, str):
        return prev or None
    return str(prev[0]) if prev else None


def _hash_of(message: Message) -> str | None:
    for comment in getattr(message, "auto_comments", []):
        if comment.startswith(HASH_PREFIX):
            return comment[len(HASH_PREFIX) :].strip()
    return None


def _entries(catalog: Catalog) -> dict[str, Message]:
    """The catalogue's live (not obsolete) entries by context (cell id)."""
    return {m.context: m for m in catalog if m.id and m.context}


@dataclass
class CatalogueChanges:
    """What :func:`update_catalogue` did, by cell id."""

    added: list[str]
    changed: list[str]
    obsoleted: list[str]
    reused: list[str]

    def summary(self) -> str:
        parts = [
            f"{len(v)} {k}" for k, v in (("new", self.added), ("changed (now fuzzy)", self.changed),
                                           ("obsolete", self.obsoleted), ("reused", self.reused)) if v
        ]  # fmt: skip
        return ", ".join(parts) or "up to date"


def update_catalogue(
    nb: Mapping[str, object], old: Catalog | None, stem: str, lang: str = "zh", glossary: str | None = None
) -> tuple[Catalog, CatalogueChanges]:
    """Merge lesson ``stem``'s English markdown cells (``nb``) into its catalogue ``old`` (None: none yet).

    Keyed by cell id (msgctxt), as ``msgmerge`` keys by message: an unchanged cell keeps its entry;
    a cell whose English changed keeps its translation, marked fuzzy, with the English that
    translation was made from as its previous msgid; a new cell gets an empty entry (or the
    translation of an obsolete entry with the very same English: a cell whose id changed); an entry
    whose cell is gone becomes obsolete. ``glossary``: the translation of the glossary cell, which
    is generated (:func:`render_glossary`), not translated.
    """
    from babel.messages.catalog import Message

    new = _new_catalogue(lang, f"lesson {stem}", like=old)
    live: dict[str, Message] = _entries(old) if old is not None else {}
    obsolete: dict[str, Message] = {str(m.id): m for m in old.obsolete.values()} if old is not None else {}
    changes = CatalogueChanges([], [], [], [])
    for cid, english in markdown_cells(nb):
        comments = [HASH_PREFIX + english_hash(english)]
        prev = live.pop(cid, None)
        string, flags, previous = "", set[str](), None
        if glossary is not None and is_glossary_cell(stem, english):
            string = glossary
            comments.append(GLOSSARY_NOTE)
        elif prev is None:
            reuse = obsolete.pop(english, None)
            if reuse is not None and reuse.string:
                string = str(reuse.string)
                changes.reused.append(cid)
            else:
                changes.added.append(cid)
        else:
            string, flags, previous = carried_over(prev, english)
            if prev.id != english:
                changes.changed.append(cid)
        new[english] = Message(
            english,
            string,
            locations=[(f"{stem}.ipynb", 0)],  # written without a line number
            flags=flags,
            auto_comments=comments,
            previous_id=[previous] if previous else [],
            context=cid,
        )
    for cid, message in live.items():
        if message.string:
            new.obsolete[(str(message.id), cid)] = message
            changes.obsoleted.append(cid)
    for message in obsolete.values():  # obsolete before, and still unused
        new.obsolete[(str(message.id), str(message.context))] = message
    return new, changes


def update_units(units: Iterable[str], old: Catalog | None, lang: str = "zh") -> Catalog:
    """The catalogue of claim marker units: one entry per English unit (``"random token pairs"``),
    keeping the translations it had."""
    from babel.messages.catalog import Message

    new = _new_catalogue(lang, None, like=old)
    have = {m.id: m for m in old if m.id and m.context == UNIT_CONTEXT} if old is not None else {}
    for unit in sorted(set(units)):
        prev = have.get(unit)
        new[unit] = Message(unit, str(prev.string) if prev is not None else "", context=UNIT_CONTEXT)
    return new


def _units(catalog: Catalog | None) -> dict[str, str]:
    if catalog is None:
        return {}
    return {
        str(m.id): str(m.string)
        for m in catalog
        if m.id and m.context == UNIT_CONTEXT and m.string and "fuzzy" not in m.flags
    }


# -- the glossary ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class GlossaryTerm:
    """One row of the glossary: the term in English and Chinese, what it means in this suite in each
    language, and whether lesson 00's glossary table shows it."""

    en: str
    zh: str
    en_note: str
    zh_note: str
    lesson00: bool


GLOSSARY_FIELDS = ("en", "zh", "en_note", "zh_note", "lesson00")


def read_glossary(path: str | os.PathLike[str] | None = None) -> list[GlossaryTerm]:
    """The glossary's rows, in file order. Raises ValueError naming the row of a malformed one."""
    with open(path or glossary_path(), encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        if tuple(reader.fieldnames or ()) != GLOSSARY_FIELDS:
            raise ValueError(f"glossary columns must be {', '.join(GLOSSARY_FIELDS)}, got {reader.fieldnames}")
        terms = []
        for row in reader:
            values = {k: (row.get(k) or "").strip() for k in GLOSSARY_FIELDS}
            if not values["en"] or not values["zh"]:
                raise ValueError(f"glossary row {reader.line_num}: both `en` and `zh` are needed, got {values}")
            if values["lesson00"] not in ("", "yes"):
                raise ValueError(f"glossary row {reader.line_num}: lesson00 is `yes` or empty")
            terms.append(
                GlossaryTerm(
                    values["en"], values["zh"], values["en_note"], values["zh_note"], values["lesson00"] == "yes"
                )
            )
    return terms


def is_glossary_cell(stem: str, english: str) -> bool:
    """Whether ``english`` is lesson 00's glossary cell (its first line is the glossary heading)."""
    return stem.startswith("00_") and english.lstrip().startswith("## Glossary")


def render_glossary(lang: str, terms: list[GlossaryTerm] | None = None) -> str:
    """Lesson 00's glossary cell in edition ``lang``, from the glossary's ``lesson00`` rows."""
    rows = [t for t in (terms if terms is not None else read_glossary()) if t.lesson00]
    if edition(lang) == "en":
        lines = ["## Glossary · 术语表", "", "| English | 中文 | in this suite |", "|---|---|---|"]
        lines += [f"| {t.en} | {t.zh} | {t.en_note} |" for t in rows]
    else:
        lines = ["## 术语表 · Glossary", "", "| 中文 | English | 在本课程中的含义 |", "|---|---|---|"]
        lines += [f"| {t.zh} | {t.en} | {t.zh_note} |" for t in rows]
    return "\n".join(lines)


# -- does a translation say the same things? --------------------------------------------------------
_FENCE = re.compile(r"```.*?```", re.S)
_CODE = re.compile(r"`[^`\n]+`")
_DISPLAY_MATH = re.compile(r"(?<!\\)\$\$(.+?)(?<!\\)\$\$", re.S)
_INLINE_MATH = re.compile(r"(?<![\\$])\$(?!\$)(.+?)(?<![\\$])\$", re.S)
_MARKER = re.compile(r"\[([^\]]*)\]\(claims\.md#([^)\s]*)\)")
_LINK_TARGET = re.compile(r"\]\(([^)\s]+)\)")
_TAG = re.compile(r"</?[A-Za-z][^>\n]*>")
_NUMBER = re.compile(r"(?<![A-Za-z_\d.,])\d+(?:[.,]\d+)*")
_HEADING = re.compile(r"^(#{1,6})\s", re.M)
_TABLE_ROW = re.compile(r"^\s*\|", re.M)
_LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+\.)\s", re.M)
_ENGLISH_MARKER = re.compile(r"^checked on ([\d,]+) (.+)$")
_CJK = re.compile(r"[\u3400-\u9fff]")


def marker_text(count: str, unit_zh: str) -> str:
    """The text of a claim marker in the Chinese edition: ``在 2,000 对随机词元分布上检验``."""
    return f"在 {count} {unit_zh}上检验"


def _squash(text: str) -> str:
    return " ".join(text.split())


def _parts(text: str) -> dict[str, list[str]]:
    """The pieces of a markdown cell that a translation keeps as they are, and the prose left over."""
    out: dict[str, list[str]] = {}
    rest = text
    for name, pattern in (("code block", _FENCE), ("code", _CODE)):
        out[name] = [_squash(m) for m in pattern.findall(rest)]
        rest = pattern.sub(" ", rest)
    out["display math"] = [_squash(m) for m in _DISPLAY_MATH.findall(rest)]
    rest = _DISPLAY_MATH.sub(" ", rest)
    out["math"] = [_squash(m) for m in _INLINE_MATH.findall(rest)]
    rest = _INLINE_MATH.sub(" ", rest)
    out["marker"] = [f"{anchor}|{_squash(label)}" for label, anchor in _MARKER.findall(rest)]
    rest = _MARKER.sub(" ", rest)
    out["link"] = _LINK_TARGET.findall(rest)
    rest = _LINK_TARGET.sub("] ", rest)
    out["html tag"] = _TAG.findall(rest)
    rest = _TAG.sub(" ", rest)
    out["prose"] = [rest]
    return out


def mismatches(english: str, translation: str, units: Mapping[str, str]) -> list[str]:
    """What ``translation`` fails to keep of ``english``: claim markers (same claims and case counts,
    Chinese text per :func:`marker_text`), formulas, code, links, HTML tags, every number of the
    English prose, and the shape (headings, table rows, list items). Empty when it keeps them all."""
    en, zh = _parts(english), _parts(translation)
    found = []
    want_markers = []
    for item in en["marker"]:
        anchor, label = item.split("|", 1)
        m = _ENGLISH_MARKER.match(label)
        if m is None:
            found.append(f"English marker text {label!r} is not `checked on N unit`")
            continue
        unit_zh = units.get(m.group(2))
        if unit_zh is None:
            found.append(f"no translation of the claim unit {m.group(2)!r} in claims.po")
            continue
        want_markers.append(f"{anchor}|{marker_text(m.group(1), unit_zh)}")
    if Counter(want_markers) != Counter(zh["marker"]):
        found.append(f"claim markers differ: want {sorted(want_markers)}, found {sorted(zh['marker'])}")
    for kind in ("code block", "code", "display math", "math", "link", "html tag"):
        if Counter(en[kind]) != Counter(zh[kind]):
            lost = sorted((Counter(en[kind]) - Counter(zh[kind])).elements())
            extra = sorted((Counter(zh[kind]) - Counter(en[kind])).elements())
            found.append(f"{kind} differs: missing {lost}, not in the English {extra}")
    numbers_en = set(_NUMBER.findall(en["prose"][0]))
    numbers_zh = set(_NUMBER.findall(zh["prose"][0]))
    if numbers_en - numbers_zh:
        found.append(f"numbers of the English missing: {sorted(numbers_en - numbers_zh)}")
    for what, pattern in (("headings", _HEADING), ("table rows", _TABLE_ROW), ("list items", _LIST_ITEM)):
        a, b = pattern.findall(english), pattern.findall(translation)
        if (Counter(a) if what == "headings" else len(a)) != (Counter(b) if what == "headings" else len(b)):
            found.append(f"{what} differ: {len(a)} in the English, {len(b)} in the translation")
    if not _CJK.search(translation):
        found.append("the translation has no Chinese in it")
    return found


# -- is the edition current? ------------------------------------------------------------------------
def _shown(path: Path, notebooks: Path) -> str:
    try:
        return str(path.relative_to(notebooks.parent))
    except ValueError:
        return str(path)


def problems(lang: str = "zh", notebooks: str | os.PathLike[str] | None = None) -> list[str]:
    """Everything that keeps edition ``lang`` from being a current translation of the English
    lessons, one line each naming the lesson and cell (empty when it is current)."""
    code = edition(lang)
    if code == "en":
        return []
    folder = _notebooks(notebooks)
    found: list[str] = []
    units_file = units_path(code, folder)
    units_cat = read_catalogue(units_file, code) if units_file.is_file() else None
    units = _units(units_cat)
    if units_cat is None:
        found.append(f"{_shown(units_file, folder)}: missing (run `python scripts/translations.py update`)")
    if (folder / "claims.md").is_file():
        from .claims_text import claims_problems

        found += claims_problems((folder / "claims.md").read_text(encoding="utf-8"), units_cat, units)
    glossary = None
    gpath = glossary_path(folder)
    if not gpath.is_file():
        found.append(f"{_shown(gpath, folder)}: missing")
    else:
        try:
            glossary = render_glossary(code, read_glossary(gpath))
        except ValueError as err:
            found.append(f"{_shown(gpath, folder)}: {err}")
    for nb_path in lesson_notebooks(folder):
        stem = nb_path.stem
        po = catalogue_path(stem, code, folder)
        nb = json.loads(nb_path.read_text(encoding="utf-8"))
        found += _code_problems(nb, stem, code, folder)
        if not po.is_file():
            found.append(f"{_shown(po, folder)}: missing (run `python scripts/translations.py update`)")
            continue
        catalog = read_catalogue(po, code)
        live = _entries(catalog)
        cells = markdown_cells(nb)
        for cid, english in cells:
            where = f"{stem} cell {cid}"
            msg = live.pop(cid, None)
            if msg is None:
                found.append(f"{where}: no entry (a new cell: run update, then translate it)")
                continue
            if msg.id != english:
                found.append(f"{where}: the English changed since the catalogue was updated (run update, then revise)")
                continue
            if _hash_of(msg) != english_hash(english):
                found.append(f"{where}: the recorded hash is not that of the English (run update)")
            if (state := untranslated(msg)) is not None:
                found.append(f"{where}: {state}")
                continue
            if is_glossary_cell(stem, english):
                if glossary is not None and msg.string != glossary:
                    found.append(f"{where}: not the glossary's rendering (run update after editing glossary.csv)")
                continue
            for issue in mismatches(english, str(msg.string), units):
                found.append(f"{where}: {issue}")
        for cid in live:
            found.append(f"{stem}: an entry for cell {cid}, which the lesson no longer has (run update)")
    return found


def _code_problems(nb: Mapping[str, object], stem: str, lang: str, folder: Path) -> list[str]:
    """What keeps the words lesson ``stem``'s code cells show from a current translation."""
    from .code_text import CodeText, notebook_texts, text_problems

    po = code_catalogue_path(stem, lang, folder)
    if not po.is_file():
        return [f"{_shown(po, folder)}: missing (run `python scripts/translations.py update`)"]
    catalog = read_catalogue(po, lang)
    live = {(str(m.context), str(m.id)): m for m in catalog if m.id}
    found = []
    texts: dict[tuple[str, str], CodeText] = {}
    for t in notebook_texts(nb):
        texts.setdefault((t.cell, t.text), t)  # the same words twice in a cell have one entry
    for t in texts.values():
        where = f"{stem} cell {t.cell}, {t.where}: {t.text[:40]!r}"
        msg = live.pop((t.cell, t.text), None)
        if msg is None:
            found.append(f"{where}: no entry (new or changed words: run update, then translate them)")
            continue
        if _hash_of(msg) != english_hash(t.text):
            found.append(f"{where}: the recorded hash is not that of the English (run update)")
        if (state := untranslated(msg)) is not None:
            found.append(f"{where}: {state}")
        else:
            found += [f"{where}: {issue}" for issue in text_problems(t, str(msg.string))]
    for cid, text in live:
        found.append(f"{stem}: an entry for {text[:40]!r} in cell {cid}, which the code no longer shows (run update)")
    return found


# -- building the edition ---------------------------------------------------------------------------
def translate_notebook(nb: Mapping[str, object], catalog: Catalog | None, code: Catalog | None = None) -> dict:
    """A copy of the English notebook ``nb`` with each markdown cell replaced by its translation in
    ``catalog``, and each string literal its code cells show (:mod:`klviz.code_text`) by its translation
    in ``code``; everything else of the code, the ids and the metadata unchanged. Text without a current
    translation (none, empty or fuzzy) stays English, as gettext shows the msgid of an untranslated message."""
    from .code_text import translate_code, translations

    out = copy.deepcopy(dict(nb))
    live = _entries(catalog) if catalog is not None else {}
    table = translations(code)
    cells = out["cells"]
    assert isinstance(cells, list)
    for cell in cells:
        if cell.get("cell_type") == "code" and table:
            source = _source(cell)
            translated = translate_code(source, str(cell.get("id")), table)
            if translated != source:
                cell["source"] = translated.splitlines(keepends=True)
        if cell.get("cell_type") != "markdown":
            continue
        msg = live.get(str(cell.get("id")))
        english = _source(cell)
        if msg is None or msg.id != english or not msg.string or "fuzzy" in msg.flags:
            continue
        cell["source"] = str(msg.string).splitlines(keepends=True)
    return out


def build_edition(
    lang: str, out: str | os.PathLike[str], notebooks: str | os.PathLike[str] | None = None
) -> list[Path]:
    """Write edition ``lang`` of the lessons into folder ``out``: each ``NN_topic.ipynb`` (same file
    names, so links between lessons work) and the claims page. Returns the lesson paths written."""
    from .notebook_format import dumps

    code = edition(lang)
    folder = _notebooks(notebooks)
    target = Path(out)
    target.mkdir(parents=True, exist_ok=True)
    written = []
    for nb_path in lesson_notebooks(folder):
        nb = json.loads(nb_path.read_text(encoding="utf-8"))
        if code != "en":
            nb = translate_lesson(nb, nb_path.stem, code, folder)
        dest = target / nb_path.name
        text = dumps(nb)
        if not dest.is_file() or dest.read_text(encoding="utf-8") != text:
            dest.write_text(text, encoding="utf-8")
        written.append(dest)
    if (folder / "claims.md").is_file():
        if code == "en":
            shutil.copyfile(folder / "claims.md", target / "claims.md")
        else:
            write_claims_page(folder, target, code, written)
    return written


def translate_lesson(nb: Mapping[str, object], stem: str, lang: str, notebooks: str | os.PathLike[str]) -> dict:
    """Lesson ``stem`` (its English notebook ``nb``) in edition ``lang``: its prose from its catalogue and
    the words its code shows from its code catalogue, both in ``notebooks/locale`` (a missing catalogue
    leaves that text English)."""
    po = catalogue_path(stem, lang, notebooks)
    code_po = code_catalogue_path(stem, lang, notebooks)
    return translate_notebook(
        nb,
        read_catalogue(po, lang) if po.is_file() else None,
        read_catalogue(code_po, lang) if code_po.is_file() else None,
    )


def write_claims_page(folder: Path, target: Path, code: str, lessons: list[Path]) -> None:
    """The claims page of edition ``code`` (from ``folder/claims.md`` and the claims catalogue) into
    ``target``, each lesson named by its title in the translated ``lessons``."""
    from .claims_text import translate_claims_page

    titles = {}
    for path in lessons:
        cells = markdown_cells(json.loads(path.read_text(encoding="utf-8")))
        first = cells[0][1].splitlines()[0] if cells and cells[0][1] else ""
        if first.startswith("# "):
            titles[path.stem] = first[2:].strip()
    units_file = units_path(code, folder)
    catalog = read_catalogue(units_file, code) if units_file.is_file() else None
    page = translate_claims_page(
        (folder / "claims.md").read_text(encoding="utf-8"), catalog, _units(catalog), titles, code
    )
    (target / "claims.md").write_text(page, encoding="utf-8")
