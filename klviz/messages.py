"""The library's own words in other languages: what the panels, checks, figures and tables say.

The lessons' prose has its catalogues under ``notebooks/locale`` (:mod:`klviz.i18n`); the words the
package itself shows a reader (a panel's control labels and readout, a check's verdict, a figure's
title, axis labels and legend, a table's header) have one gettext catalogue of their own, shipped in
the package::

    klviz/locale/zh_CN/LC_MESSAGES/klviz.po

    #: klviz/widgets/lesson03.py
    msgid "tangent at t = 1"          <- the English, as the code writes it
    msgstr "t = 1 处的切线"            <- the Chinese

The code marks each such string with :func:`tr`; the English in the code is the message id. A
template keeps its fields, so the numbers are formatted the same way in every language::

    tr("gap at r = {r:.3g} is {gap:.3g}", r=r, gap=gap)

``context=`` separates two meanings of one English word (gettext's ``msgctxt``). A string built
before the language is known (a module-level table of labels) is marked with :func:`N_`, which
only marks it, and translated where it is shown with ``tr(label)``.

The language is read when a string is shown, not when klviz is imported: ``KLVIZ_LANG=zh`` (or
``zh_CN``, ``zh-Hans``) in the kernel's environment gives Chinese; unset, empty or ``en`` gives the
English of the code, unchanged. The catalogue is read once, on the first Chinese string, into a dict;
each later :func:`tr` is a dict lookup.

``python scripts/translations.py update`` extracts every marked string (:func:`extract`, a walk over
the package's syntax trees) and merges it into the catalogue (a new string gets an empty entry, a
changed one keeps its old translation marked fuzzy); ``--check`` fails while :func:`problems` lists
anything: a string without a translation, a fuzzy or stale entry, a translation that lost a field.
"""

from __future__ import annotations

import ast
import io
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "ENV_VAR",
    "DOMAIN",
    "language",
    "tr",
    "N_",
    "catalogue_file",
    "translations",
    "Extracted",
    "extract",
    "update",
    "problems",
]

#: The environment variable that chooses the language of the library's words (read at use time).
ENV_VAR = "KLVIZ_LANG"
#: The catalogue's name (gettext's domain).
DOMAIN = "klviz"
PACKAGE_DIR = Path(__file__).resolve().parent
_LOCALES = {"zh": "zh_CN"}
_ALIASES = {"zh": "zh", "zh_cn": "zh", "zh-cn": "zh", "zh-hans": "zh", "zh_hans": "zh", "cn": "zh"}
#: Language -> {(context, English): translation}, filled on first use.
_LOADED: dict[str, dict[tuple[str | None, str], str]] = {}


def language() -> str:
    """The language the library speaks now: ``"zh"`` when ``KLVIZ_LANG`` names Chinese, else ``"en"``."""
    value = os.environ.get(ENV_VAR)
    if not value:
        return "en"
    return _ALIASES.get(value.strip().lower(), "en")


def tr(text: str, /, *, context: str | None = None, **fields: Any) -> str:
    """``text`` in the reader's language (:func:`language`), then formatted with ``fields`` if any
    (``str.format``: ``tr("{n} samples", n=n)``). A string the catalogue lacks shows in English."""
    lang = language()
    if lang != "en":
        table = _LOADED.get(lang)
        if table is None:
            table = translations(lang)
        text = table.get((context, text), text)
    return text.format(**fields) if fields else text


def N_(text: str, /, *, context: str | None = None) -> str:  # noqa: N802 - gettext's name for it
    """Mark ``text`` for the catalogue without translating it (it is translated where shown, by :func:`tr`)."""
    return text


def catalogue_file(lang: str = "zh", package: Path | None = None) -> Path:
    """``klviz/locale/zh_CN/LC_MESSAGES/klviz.po``."""
    return (package or PACKAGE_DIR) / "locale" / _LOCALES[lang] / "LC_MESSAGES" / f"{DOMAIN}.po"


# -- reading the catalogue -----------------------------------------------------------------------
_ESCAPES = {"n": "\n", "t": "\t", '"': '"', "\\": "\\", "r": "\r"}


def _unquote(line: str) -> str:
    body = line[line.index('"') + 1 : line.rindex('"')]
    return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), m.group(1)), body)


def parse_po(text: str) -> dict[tuple[str | None, str], str]:
    """The current, translated entries of a ``.po`` text: {(msgctxt, msgid): msgstr}. Fuzzy and
    obsolete entries and empty translations are left out (they show the English, as gettext does).

    A reader for the subset of the format Babel writes (no plurals): fast enough to run on the
    first Chinese string of a kernel."""
    table: dict[tuple[str | None, str], str] = {}
    for block in text.split("\n\n"):
        fields: dict[str, str] = {}
        key = ""
        fuzzy = False
        for line in block.splitlines():
            if line.startswith("#,") and "fuzzy" in line:
                fuzzy = True
            elif line.startswith("#"):
                continue
            elif line.startswith('"'):
                if key:
                    fields[key] += _unquote(line)
            else:
                key = line.split(" ", 1)[0]
                fields[key] = _unquote(line)
        msgid, msgstr = fields.get("msgid"), fields.get("msgstr")
        if msgid and msgstr and not fuzzy:
            table[(fields.get("msgctxt"), msgid)] = msgstr
    return table


def translations(lang: str = "zh", package: Path | None = None) -> dict[tuple[str | None, str], str]:
    """The catalogue of ``lang`` as a dict, read once (a missing catalogue is an empty one)."""
    if package is None and lang in _LOADED:
        return _LOADED[lang]
    path = catalogue_file(lang, package)
    table = parse_po(path.read_text(encoding="utf-8")) if path.is_file() else {}
    if package is None:
        _LOADED[lang] = table
    return table


# -- extracting the strings from the code ---------------------------------------------------------
@dataclass(frozen=True)
class Extracted:
    """One marked string: its English, its context, and where the code has it."""

    text: str
    context: str | None
    path: str
    line: int


def _marked(node: ast.Call) -> bool:
    func = node.func
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
    return name in ("tr", "N_")


def extract(package: Path | None = None) -> tuple[list[Extracted], list[str]]:
    """Every string the package marks with :func:`tr` or :func:`N_`, in the order of the code, and
    the calls that cannot be extracted (``tr(f"...")``, ``tr(variable)`` outside a few known
    pass-throughs): each named with file and line."""
    package = package or PACKAGE_DIR
    found: list[Extracted] = []
    errors: list[str] = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package.parent).as_posix()
        if rel == f"{package.name}/messages.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and _marked(node) and node.args):
                continue
            first = node.args[0]
            context = next((k.value for k in node.keywords if k.arg == "context"), None)
            ctx = context.value if isinstance(context, ast.Constant) and isinstance(context.value, str) else None
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                found.append(Extracted(first.value, ctx, rel, node.lineno))
            elif isinstance(first, ast.JoinedStr):
                errors.append(
                    f"{rel}:{node.lineno}: an f-string cannot be translated: pass the template and its fields"
                )
    found.sort(key=lambda e: (e.path, e.line))
    return found, errors


# -- the catalogue, kept current -------------------------------------------------------------------
_HEADER = """\
# Simplified Chinese (zh_CN) translation of the words klviz itself shows: panel controls and readouts,
# check messages, figure titles, axis labels and legends, tables.
# msgid: the English as the code writes it (klviz.messages.tr); msgstr: the translation.
# `python scripts/translations.py update` adds the new strings (empty) and marks the changed ones fuzzy;
# translate each, keep every {field} and HTML tag, delete the fuzzy flag; `--check` must then pass.
# Terms: notebooks/locale/glossary.csv. This file is distributed under the same license as klviz.
#"""


def update(lang: str = "zh", package: Path | None = None) -> str:
    """Merge the strings of the code into the catalogue of ``lang`` (written with Babel); returns a
    one-line summary."""
    from babel.messages.catalog import Catalog
    from babel.messages.pofile import read_po, write_po

    path = catalogue_file(lang, package)
    found, _errors = extract(package)
    template = Catalog(domain=DOMAIN, project="klviz", fuzzy=False)
    for item in found:
        template.add(item.text, locations=[(item.path, None)], context=item.context)  # type: ignore[list-item]
    if path.is_file():
        with path.open("rb") as fh:
            catalog = read_po(fh, locale=_LOCALES[lang], domain=DOMAIN)
    else:
        catalog = Catalog(locale=_LOCALES[lang], domain=DOMAIN, project="klviz", fuzzy=False)
    before = {(m.context, m.id) for m in catalog if m.id}
    english_of = {(m.context, str(m.string)): str(m.id) for m in catalog if m.id and m.string}
    catalog.update(template, update_header_comment=False)
    for m in catalog:  # a changed string keeps its old translation, fuzzy, with the English it was made from
        old = english_of.get((m.context, str(m.string)))
        if m.id and m.fuzzy and not m.previous_id and old is not None:
            m.previous_id = [old]
    catalog.header_comment = _HEADER
    catalog.fuzzy = False
    after = {(m.context, m.id) for m in catalog if m.id}
    buffer = io.BytesIO()
    write_po(
        buffer, catalog, width=0, include_lineno=False, sort_output=False, ignore_obsolete=True, include_previous=True
    )
    text = _strip_dates(buffer.getvalue().decode("utf-8"))
    if not path.is_file() or path.read_text(encoding="utf-8") != text:  # a current catalogue is left untouched
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    _LOADED.pop(lang, None)
    untranslated = sum(1 for m in catalog if m.id and (not m.string or m.fuzzy))
    return f"{len(after)} strings, {len(after - before)} new, {len(before - after)} gone, {untranslated} to translate"


def _strip_dates(text: str) -> str:
    """Drop the header fields that change on every write (the file then changes only when its entries do)."""
    return re.sub(r'^"(POT-Creation-Date|PO-Revision-Date|Generated-By): .*\\n"\n', "", text, flags=re.M)


_FIELD = re.compile(r"(?<!\{)\{([^{}]*)\}(?!\})")
_TAG = re.compile(r"</?([a-zA-Z]+)")
_CJK = re.compile(r"[\u3000-\u303f\u3400-\u9fff\uff00-\uffef]")  # ideographs, CJK and full-width punctuation


def _fields(text: str) -> list[str]:
    return sorted(_FIELD.findall(text))


def problems(lang: str = "zh", package: Path | None = None) -> list[str]:
    """Everything that keeps the library's words in ``lang`` from being current, one line each:
    a marked string with no entry or no translation, a fuzzy entry, an entry the code no longer has,
    a translation whose ``{fields}`` or HTML tags differ from its English, or one with no Chinese
    (unless flagged ``#, same``: a formula that reads the same in both languages)."""
    path = catalogue_file(lang, package)
    found, errors = extract(package)
    out = list(errors)
    table: dict[tuple[str | None, str], tuple[str, bool, bool]] = {}
    if path.is_file():
        from babel.messages.pofile import read_po

        with path.open("rb") as fh:
            catalog = read_po(fh, locale=_LOCALES[lang], domain=DOMAIN)
        table = {(m.context, str(m.id)): (str(m.string or ""), m.fuzzy, "same" in m.flags) for m in catalog if m.id}
    rel = path.relative_to(path.parents[4]).as_posix() if len(path.parents) > 4 else str(path)
    seen: set[tuple[str | None, str]] = set()
    for item in found:
        key = (item.context, item.text)
        if key in seen:
            continue
        seen.add(key)
        where = f"{item.path}:{item.line} {item.text[:70]!r}"
        if key not in table:
            out.append(f"{where}: not in {rel} (run update, then translate it)")
            continue
        string, fuzzy, same = table[key]
        if not string:
            out.append(f"{where}: not translated yet")
        elif fuzzy:
            out.append(f"{where}: fuzzy (its English changed): revise the translation, delete the flag")
        elif _fields(string) != _fields(item.text):
            out.append(f"{where}: the translation's fields {_fields(string)} differ from {_fields(item.text)}")
        elif sorted(_TAG.findall(string)) != sorted(_TAG.findall(item.text)):
            out.append(f"{where}: the translation's HTML tags differ from the English's")
        elif not _CJK.search(string) and not (same and string == item.text):
            out.append(f"{where}: the translation has no Chinese (flag it `#, same` if it is the same in Chinese)")
    for key in table:
        if key not in seen:
            out.append(f"{rel}: {key[1][:70]!r} is no longer in the code (run update)")
    return out


def cjk_text(texts: Iterable[str]) -> bool:
    """Whether any of ``texts`` holds a Chinese character."""
    return any(_CJK.search(t) for t in texts)
