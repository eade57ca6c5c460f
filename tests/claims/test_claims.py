"""CI for the claims (see ``registry.py``): each claim holds over its domain with at least
``MIN_CASES`` cases; every marker in a lesson names a registered claim and states the cases its test
ran; every claim is stated in some lesson; the claims page is current."""

from __future__ import annotations

import pytest

from .registry import CLAIMS, MIN_CASES, PAGE, Evidence, load_all, marker_text, markers, render_page, run_checks_apart

load_all()
_EVIDENCE: dict[str, Evidence | str] = {}


def evidence(cid: str) -> Evidence:
    """A claim's evidence, every check run once per session in a child process (the page test reuses it).

    The checks hold their seeded families in memory (hundreds of MiB); run here, they would raise the
    test process's peak memory, which every process it starts afterwards inherits as its own high-water
    mark (Linux keeps ru_maxrss across fork and exec), and tests that measure a child's peak memory
    would read the claims' instead. A failed check comes back as its message and fails here."""
    if not _EVIDENCE:
        _EVIDENCE.update(run_checks_apart(sorted(CLAIMS)))
    ev = _EVIDENCE[cid]
    if isinstance(ev, str):
        pytest.fail(f"claim {cid} does not hold: {ev}")
    return ev


@pytest.mark.parametrize("cid", sorted(CLAIMS))
def test_claim_holds_over_its_domain(cid):
    ev = evidence(cid)
    assert ev.cases >= MIN_CASES, f"claim {cid} ran {ev.cases} cases; a claim's test runs at least {MIN_CASES}"
    assert ev.worst.strip(), f"claim {cid} reports no worst case"


def test_every_marker_names_a_claim_and_states_its_cases():
    found = markers()
    assert found, "no claim markers in the lessons"
    for m in found:
        assert m.id in CLAIMS, f"{m.lesson} (cell {m.cell}) links claim {m.id!r}, which has no test in tests/claims/"
        want = marker_text(CLAIMS[m.id], evidence(m.id).cases)
        assert m.text == want, (
            f"{m.lesson} (cell {m.cell}): the marker of {m.id} reads {m.text!r}; it must read {want!r}"
        )


def test_every_claim_is_stated_in_a_lesson():
    stated = {m.id for m in markers()}
    missing = sorted(set(CLAIMS) - stated)
    assert not missing, f"claims with a test but no marker in any lesson: {missing}"


def test_the_claims_page_is_current():
    page = render_page(CLAIMS, {cid: evidence(cid) for cid in CLAIMS}, markers())
    assert PAGE.is_file() and PAGE.read_text(encoding="utf-8") == page, (
        "notebooks/claims.md is out of date: run `python scripts/claims_page.py`"
    )
