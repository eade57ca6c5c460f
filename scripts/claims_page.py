"""Write the claims page, ``notebooks/claims.md``, from the claims' tests (``tests/claims/``).

Usage: python scripts/claims_page.py [--check]
Runs every claim's check (deterministic, seeded), then writes the page; with --check it writes nothing
and exits 1 when the page is out of date or a claim fails. ``tests/claims/test_claims.py`` checks the
same in ``make test``.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from claims.registry import PAGE, load_all, markers, render_page, run_check  # noqa: E402


def main(argv: list[str]) -> int:
    claims = load_all()
    evidence = {}
    for cid, c in sorted(claims.items()):
        evidence[cid] = run_check(c)
        print(f"{cid}: {evidence[cid].cases:,} {c.unit}; {evidence[cid].worst}")
    page = render_page(claims, evidence, markers())
    if "--check" in argv:
        if not PAGE.is_file() or PAGE.read_text(encoding="utf-8") != page:
            print(f"{PAGE.relative_to(ROOT)} is out of date: run python scripts/claims_page.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(page, encoding="utf-8")
    print(f"wrote {PAGE.relative_to(ROOT)} ({len(claims)} claims)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
