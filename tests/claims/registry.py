"""What a claim is, and the one table of them.

A sentence in a lesson that states a general rule ("always", "never", "on tokens", "for sequences",
"framework X does Y", "k3 is less noisy than k1 when ...") is a **claim**. It is written in the lesson
with a marker right after it::

    k3 is never negative ([checked on 2,000 random token pairs](claims.md#k3-never-negative)).

and registered here by a function in ``tests/claims/lessonNN.py`` (NN: the first lesson that states
it; later lessons link the same id)::

    @claim("k3-never-negative", unit="random token pairs",
           wording="k3 = (r - 1) - log r is never negative, for any pair of distributions.",
           domain="random token pairs: vocabularies 2 to 50,257, every family of families.token_pairs")
    def _() -> Evidence:
        ...                          # check every case, raise AssertionError on a counter-example
        return Evidence(cases=n, worst="smallest k3 found: 0 (at log r = 0, p = q)")

The check runs at least :data:`MIN_CASES` cases over the whole domain its wording names (a seeded
sweep, or exact enumeration), raises ``AssertionError`` naming a counter-example when the claim fails,
and returns :class:`Evidence`: how many cases it ran and the case closest to breaking the claim, in
words with its numbers. The marker's text is exactly ``checked on {cases:,} {unit}``. Checks are
deterministic (seeded), so the claims page (``notebooks/claims.md``, written by
``scripts/claims_page.py``) is reproducible and CI can compare it.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "Evidence",
    "Claim",
    "CLAIMS",
    "claim",
    "load_all",
    "MIN_CASES",
    "CLAIM_ID",
    "marker_text",
    "run_check",
    "run_checks_apart",
]

#: The fewest cases a claim's check may run.
MIN_CASES = 1000
#: A claim id: lower-case words joined by hyphens (it is also the anchor on the claims page).
CLAIM_ID = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")


@dataclass(frozen=True)
class Evidence:
    """What a claim's check found: the number of cases it ran, and the case closest to breaking the
    claim, described in words with its numbers (``"largest k2 bias found: -0.4 % of KL at ..."``)."""

    cases: int
    worst: str


@dataclass(frozen=True)
class Claim:
    """A registered claim (see the module docstring)."""

    id: str
    wording: str
    domain: str
    unit: str
    check: Callable[[], Evidence]
    module: str

    @property
    def test(self) -> str:
        """Where its check lives, as a path a reader can open."""
        return f"tests/claims/{self.module}.py::{self.check.__name__}"


CLAIMS: dict[str, Claim] = {}


def claim(
    id: str, *, wording: str, domain: str, unit: str
) -> Callable[[Callable[[], Evidence]], Callable[[], Evidence]]:
    """Register the decorated check as the evidence of claim ``id`` (see the module docstring)."""
    if not CLAIM_ID.match(id):
        raise ValueError(f"claim id {id!r} must be lower-case words joined by hyphens")

    def register(check: Callable[[], Evidence]) -> Callable[[], Evidence]:
        if id in CLAIMS and CLAIMS[id].check.__qualname__ != check.__qualname__:
            raise ValueError(f"claim {id!r} is registered twice ({CLAIMS[id].test} and {check.__module__})")
        module = check.__module__.rsplit(".", 1)[-1]
        CLAIMS[id] = Claim(id, " ".join(wording.split()), " ".join(domain.split()), unit, check, module)
        return check

    return register


def run_check(c: Claim) -> Evidence:
    """Run a claim's check on one CPU thread (its thousands of small vocabulary sums gain nothing from a
    thread pool, and on a busy machine the pool's hand-offs made them 10-20x slower), restoring the
    caller's setting afterwards."""
    from klviz.devices import single_thread

    with single_thread():
        return c.check()


def run_checks_apart(ids: list[str], timeout: float = 3600) -> dict[str, Evidence | str]:
    """Run the checks of the claims ``ids`` (:func:`run_check`, one after another) in a fresh Python process
    and return, per claim, its :class:`Evidence` or, where the check failed, its error message. The checks'
    memory stays in that process."""
    import json
    import subprocess
    import sys

    tests = Path(__file__).resolve().parents[1]
    code = (
        "import json, sys, traceback\n"
        f"sys.path.insert(0, {str(tests)!r})\n"
        "from claims.registry import load_all, run_check\n"
        "claims = load_all()\n"
        "out = {}\n"
        "for cid in json.loads(sys.stdin.read()):\n"
        "    try:\n"
        "        ev = run_check(claims[cid])\n"
        "        out[cid] = {'cases': ev.cases, 'worst': ev.worst}\n"
        "    except Exception as err:\n"
        "        out[cid] = {'error': f'{type(err).__name__}: {err}'}\n"
        "print('CLAIMS-JSON ' + json.dumps(out))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], input=json.dumps(list(ids)), capture_output=True, text=True, timeout=timeout
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("CLAIMS-JSON ")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"the claims' child process failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    results: dict[str, Evidence | str] = {}
    for cid, r in json.loads(lines[-1][len("CLAIMS-JSON ") :]).items():
        results[cid] = r["error"] if "error" in r else Evidence(int(r["cases"]), str(r["worst"]))
    return results


def marker_text(c: Claim, cases: int) -> str:
    """The exact text of a claim's marker in an English lesson: ``checked on 2,000 random token pairs``."""
    return f"checked on {cases:,} {c.unit}"


def load_all() -> dict[str, Claim]:
    """Import every ``lessonNN`` module of this package (each registers its claims) and return the table."""
    here = Path(__file__).resolve().parent
    for info in pkgutil.iter_modules([str(here)]):
        if info.name.startswith("lesson"):
            importlib.import_module(f"{__package__}.{info.name}")
    return CLAIMS


# -- markers in the lessons, and the claims page --------------------------------------------------
NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
PAGE = NOTEBOOKS / "claims.md"
#: A marker: a Markdown link to the claim's anchor on the claims page.
MARKER = re.compile(r"\[([^\]]*)\]\(claims\.md#([^)\s]*)\)")


@dataclass(frozen=True)
class Marker:
    """A link to a claim in a lesson's prose: the lesson, the cell id, the link's text, the claim id."""

    lesson: str
    cell: str
    text: str
    id: str


def markers(folder: Path = NOTEBOOKS) -> list[Marker]:
    """Every claim marker in the markdown cells of the lessons ``NN_*.ipynb`` in ``folder``."""
    import json

    found = []
    for nb_path in sorted(folder.glob("[0-9][0-9]_*.ipynb")):
        for cell in json.loads(nb_path.read_text(encoding="utf-8"))["cells"]:
            if cell["cell_type"] != "markdown":
                continue
            source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            for m in MARKER.finditer(source):
                found.append(Marker(nb_path.stem, cell.get("id", "?"), " ".join(m.group(1).split()), m.group(2)))
    return found


def _lesson_title(stem: str) -> str:
    number, _, words = stem.partition("_")
    return f"{number} {words.replace('_', ' ').capitalize()}"


PAGE_HEAD = """# Claims and their evidence

Every sentence in a lesson that states a general rule (*always*, *never*, *on tokens*, *for sequences*,
*framework X does Y*) carries a small link, such as "(checked on 2,000 random token pairs)", to its entry
on this page. An entry gives the claim's wording, the domain it is stated for, the property test that
checks it over that whole domain (not only on the lesson's example), how many cases the test ran, and
the case that came closest to breaking it. Where a test found counter-examples, the sentence was
narrowed until its wording and the test's domain agree. CI fails on a link without a test, a test
without a link, or a claim that no longer holds.

*Written by `scripts/claims_page.py` from `tests/claims/`: edit the tests, not this page.*
"""


def render_page(claims: dict[str, Claim], evidence: dict[str, Evidence], found: list[Marker]) -> str:
    """The claims page: one section per claim, ordered by the first lesson that states it."""
    where: dict[str, list[str]] = {}
    for m in found:
        where.setdefault(m.id, [])
        if m.lesson not in where[m.id]:
            where[m.id].append(m.lesson)
    order = sorted(claims, key=lambda i: (min(where.get(i, ["99"])), claims[i].module, i))
    parts = [PAGE_HEAD]
    for cid in order:
        c, ev = claims[cid], evidence[cid]
        lessons = ", ".join(f"[{_lesson_title(s)}]({s}.ipynb)" for s in sorted(where.get(cid, []))) or "none"
        parts.append(
            f"\n## {cid}\n\n> {c.wording}\n\n"
            f"- **Domain:** {c.domain}\n"
            f"- **Test:** `{c.test}`\n"
            f"- **Cases:** {ev.cases:,} {c.unit}\n"
            f"- **Closest to breaking it:** {ev.worst}\n"
            f"- **Stated in:** {lessons}\n"
        )
    return "".join(parts)
