"""The claims page in Chinese (klviz.claims_text): what is translated and what is kept, and that a change to a
claim's English fails the check until its translation is revised."""

from __future__ import annotations

from pathlib import Path

from klviz import claims_text, i18n

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"

PAGE = """# Claims and their evidence

Every sentence that states a general rule links here, such as "(checked on 2,000 random token pairs)".

## tiny-claim

> k3 is never negative, on every token.

- **Domain:** random token pairs (vocabularies 2 to 50,257), exact sums in float64
- **Test:** `tests/claims/lesson00.py::tiny_claim`
- **Cases:** 2,000 random token pairs
- **Closest to breaking it:** smallest value 0.0 at V = 2
- **Stated in:** [00 Start here](00_start_here.ipynb), [02 Three estimators](02_three_estimators.ipynb)
"""
UNITS = {"random token pairs": "对随机词元分布"}
TITLES = {"00_start_here": "00 · 从这里开始"}


def _catalogue(old=None):
    new = i18n.update_units(UNITS, old)
    for message in new:
        if message.id in UNITS:
            message.string = UNITS[str(message.id)]
    return new, claims_text.update_claims_catalogue(PAGE, old, new)


def test_update_adds_the_head_each_wording_and_each_domain():
    catalog, touched = _catalogue()
    assert touched == ["page head", "tiny-claim", "tiny-claim domain"]
    assert claims_text.claims_problems(PAGE, catalog, UNITS) == [
        "claims page, page head: not translated yet",
        "claims page, tiny-claim: not translated yet",
        "claims page, tiny-claim domain: not translated yet",
    ]


def _translated():
    catalog, _ = _catalogue()
    zh = {
        "page head": "# 声明及其证据\n\n每一句陈述一般规律的话都链接到这里，例如“（在 2,000 对随机词元分布上检验）”。",
        "tiny-claim": "k3 在每个词元上都不为负。",
        "tiny-claim domain": "随机词元分布对（词表大小 2 到 50,257），float64 精确求和",
    }
    for message in catalog:
        if message.context in zh:
            message.string = zh[str(message.context)]
    return catalog


def test_the_translated_page_keeps_ids_tests_counts_and_outputs():
    catalog = _translated()
    assert claims_text.claims_problems(PAGE, catalog, UNITS) == []
    page = claims_text.translate_claims_page(PAGE, catalog, UNITS, TITLES)
    assert page.startswith("# 声明及其证据\n\n每一句")
    assert "\n## tiny-claim\n\n> k3 在每个词元上都不为负。\n" in page  # the id: the anchor the lessons link to
    assert "- **检验范围：** 随机词元分布对（词表大小 2 到 50,257），float64 精确求和\n" in page
    assert "- **测试：** `tests/claims/lesson00.py::tiny_claim`\n" in page
    assert "- **用例数：** 2,000 对随机词元分布\n" in page
    assert "：** smallest value 0.0 at V = 2\n" in page  # the test's own output, as it printed it
    # a lesson with a translated title gets it; one without keeps its English name
    assert "[00 · 从这里开始](00_start_here.ipynb), [02 Three estimators](02_three_estimators.ipynb)" in page


def test_a_changed_claim_fails_the_check_until_its_translation_is_revised():
    catalog = _translated()
    changed = PAGE.replace("on every token.", "on every token q can draw.")
    assert claims_text.claims_problems(changed, catalog, UNITS) == [
        "claims page, tiny-claim: the English changed since the catalogue was updated (run update, then revise)"
    ]
    # the page shows the English of a changed claim, never an outdated translation
    assert "> k3 is never negative, on every token q can draw.\n" in claims_text.translate_claims_page(
        changed, catalog, UNITS, TITLES
    )
    merged = i18n.update_units(UNITS, catalog)
    touched = claims_text.update_claims_catalogue(changed, catalog, merged)
    assert touched == ["tiny-claim"]
    entry = next(m for m in merged if m.context == "tiny-claim")
    assert "fuzzy" in entry.flags and entry.previous_id == ["k3 is never negative, on every token."]
    assert entry.string == "k3 在每个词元上都不为负。"  # kept, to revise
    problems = claims_text.claims_problems(changed, merged, UNITS)
    assert len(problems) == 1 and "fuzzy" in problems[0]


def test_a_translation_that_loses_a_number_or_code_is_flagged():
    catalog = _translated()
    for message in catalog:
        if message.context == "tiny-claim domain":
            message.string = "随机词元分布对（词表从两个词元到五万多个），float64 精确求和"
    problems = claims_text.claims_problems(PAGE, catalog, UNITS)
    assert len(problems) == 1 and "numbers" in problems[0], problems


def test_the_real_claims_page_has_a_current_translation_of_every_claim():
    page = (NOTEBOOKS / "claims.md").read_text(encoding="utf-8")
    catalog = i18n.read_catalogue(i18n.units_path("zh", NOTEBOOKS))
    found = claims_text.claims_problems(page, catalog, i18n._units(catalog))
    assert not found, "\n".join(found)
    _, sections = claims_text.claim_sections(page)
    assert len(sections) >= 60
