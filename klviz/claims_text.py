"""The claims page (``notebooks/claims.md``) in another language: the words a translation replaces, and the
check that the translation is current.

``scripts/claims_page.py`` writes the English page from the claims' tests: a head, then one section per
claim::

    ## direction-rule-scope

    > With tokens drawn from the sampler q ...           <- the claim's wording: translated
    - **Domain:** random token pairs (...)               <- the domain it is checked on: translated
    - **Test:** `tests/claims/lesson00.py::...`          <- code: kept
    - **Cases:** 2,000 random token pairs               <- the count kept, the unit from claims.po
    - **Closest to breaking it:** largest gap, ...      <- the test's own output: kept in English
    - **Stated in:** [00 Start here](00_start_here.ipynb)   <- the lessons, by their translated titles

The translations live in the claims catalogue beside the claim marker units
(``notebooks/locale/zh_CN/LC_MESSAGES/claims.po``): ``msgctxt`` ``<claim id>`` for the wording,
``<claim id> domain`` for the domain, ``page head`` for the text above the first claim. A changed English
wording or domain keeps its old translation marked fuzzy until revised, as a lesson's cells do, and
``scripts/translations.py --check`` fails meanwhile. The test outputs stay English: they are numbers and
the names of cases that change with every run of the tests.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from babel.messages.catalog import Catalog, Message

__all__ = [
    "HEAD_CONTEXT",
    "LABELS",
    "ClaimSection",
    "claim_sections",
    "update_claims_catalogue",
    "claims_problems",
    "translate_claims_page",
]

HEAD_CONTEXT = "page head"
DOMAIN_SUFFIX = " domain"
#: The labels of a claim's entry, per edition.
LABELS = {
    "zh": {
        "Domain": "检验范围",
        "Test": "测试",
        "Cases": "用例数",
        "Closest to breaking it": "最接近推翻它的情形（测试的输出，保留英文）",
        "Stated in": "出现在",
    }
}
_SECTION = re.compile(r"^## ([a-z0-9]+(?:-[a-z0-9]+)*)\n", re.M)
_LINE = re.compile(r"^- \*\*(Domain|Test|Cases|Closest to breaking it|Stated in):\*\* (.*)$", re.M)
_LESSON_LINK = re.compile(r"\[([^\]]*)\]\(([0-9][0-9]_[a-z0-9_]+)\.ipynb\)")


@dataclass(frozen=True)
class ClaimSection:
    """One claim's section of the page: its id, wording and domain, and the section's text."""

    cid: str
    wording: str
    domain: str
    text: str


def claim_sections(page: str) -> tuple[str, list[ClaimSection]]:
    """The page's head (the text above the first claim) and its claims' sections, in order."""
    starts = [m.start() for m in _SECTION.finditer(page)]
    head = page[: starts[0]] if starts else page
    sections = []
    for a, b in zip(starts, [*starts[1:], len(page)]):
        text = page[a:b]
        cid = _SECTION.match(text).group(1)  # type: ignore[union-attr]
        wording = next((line[2:] for line in text.splitlines() if line.startswith("> ")), "")
        domain = next((m.group(2) for m in _LINE.finditer(text) if m.group(1) == "Domain"), "")
        sections.append(ClaimSection(cid, wording, domain, text))
    return head, sections


def _english(page: str) -> dict[str, str]:
    """context -> English text of everything the page's translation replaces."""
    head, sections = claim_sections(page)
    out = {HEAD_CONTEXT: head.strip("\n")}
    for s in sections:
        out[s.cid] = s.wording
        out[s.cid + DOMAIN_SUFFIX] = s.domain
    return out


def _page_entries(catalog: Catalog | None) -> dict[str, Message]:
    """The catalogue's entries for the page (head, wordings, domains) by context; the marker units left out."""
    from .i18n import UNIT_CONTEXT

    if catalog is None:
        return {}
    return {str(m.context): m for m in catalog if m.id and m.context and m.context != UNIT_CONTEXT}


def update_claims_catalogue(page: str, old: Catalog | None, new: Catalog) -> list[str]:
    """Merge the English claims page ``page`` into ``new`` (a catalogue holding the marker units), taking
    translations from ``old``: an unchanged text keeps its entry; a changed one keeps its translation,
    fuzzy, with the English it was made from as previous msgid; a new one is empty. Returns the contexts
    that are new or changed."""
    from babel.messages.catalog import Message

    from .i18n import HASH_PREFIX, carried_over, english_hash

    have = _page_entries(old)
    touched = []
    for context, english in _english(page).items():
        if not english:
            continue
        prev = have.get(context)
        string, flags, previous = carried_over(prev, english) if prev is not None else ("", set(), None)
        if prev is None or prev.id != english:
            touched.append(context)
        new[english] = Message(
            english,
            string,
            flags=flags,
            auto_comments=[HASH_PREFIX + english_hash(english)],
            previous_id=[previous] if previous else [],
            context=context,
        )
    return touched


def claims_problems(page: str, catalog: Catalog | None, units: Mapping[str, str]) -> list[str]:
    """Everything that keeps the translated claims page from being current, one line each."""
    from .i18n import mismatches, untranslated

    live = _page_entries(catalog)
    found = []
    for context, english in _english(page).items():
        if not english:
            continue
        where = f"claims page, {context}"
        msg = live.get(context)
        if msg is None:
            found.append(f"{where}: no entry (run update, then translate it)")
        elif msg.id != english:
            found.append(f"{where}: the English changed since the catalogue was updated (run update, then revise)")
        elif (state := untranslated(msg)) is not None:
            found.append(f"{where}: {state}")
        else:
            found += [f"{where}: {issue}" for issue in mismatches(english, str(msg.string), units)]
    return found


def translate_claims_page(
    page: str, catalog: Catalog | None, units: Mapping[str, str], titles: Mapping[str, str], lang: str = "zh"
) -> str:
    """The claims page in edition ``lang``: the head, each wording and domain replaced by its current
    translation (one without stays English), the labels in ``lang``, each case count in the units of
    ``units`` and each lesson named by its title in ``titles`` (stem -> title); ids, tests and test
    outputs unchanged."""
    from .i18n import untranslated

    entries = {c: m for c, m in _page_entries(catalog).items() if untranslated(m) is None}
    current = {c: str(entries[c].string) for c, en in _english(page).items() if c in entries and entries[c].id == en}
    labels = LABELS[lang]
    head, sections = claim_sections(page)
    out = [current.get(HEAD_CONTEXT, head.strip("\n")) + "\n\n"]
    for s in sections:
        text = s.text
        if s.cid in current:
            text = text.replace(f"> {s.wording}\n", f"> {current[s.cid]}\n", 1)

        def line(m: re.Match[str], cid: str = s.cid) -> str:
            label, value = m.group(1), m.group(2)
            if label == "Domain" and cid + DOMAIN_SUFFIX in current:
                value = current[cid + DOMAIN_SUFFIX]
            elif label == "Cases":
                count, _, unit = value.partition(" ")
                value = f"{count} {units[unit]}" if unit in units else value
            elif label == "Stated in":
                value = _LESSON_LINK.sub(lambda k: f"[{titles.get(k.group(2), k.group(1))}]({k.group(2)}.ipynb)", value)
            return f"- **{labels[label]}：** {value}"

        out.append(_LINE.sub(line, text))
    return "".join(out)
