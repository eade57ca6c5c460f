"""Rewrite the generated tables of the rollout-format guide (``klviz/docs/rollout_format.md``).

The table of trouble codes comes from the registry of rules (``klviz.diagnose.rules.RULES``), the table of
logged metrics from ``klviz.diagnose.identify.METRICS``; ``tests/test_diagnose_rules.py`` fails while the
guide differs from them. ``--check`` only says whether it would change anything (exit status 1 if so).
"""

from __future__ import annotations

import sys
from pathlib import Path

from klviz.diagnose import identify, rules

GUIDE = Path(__file__).resolve().parents[1] / "klviz" / "docs" / "rollout_format.md"


def main(argv: list[str]) -> int:
    old = GUIDE.read_text(encoding="utf-8")
    new = identify.write_guide_table(rules.write_guide_table(old))
    if "--check" in argv:
        return int(new != old)
    if new != old:
        GUIDE.write_text(new, encoding="utf-8")
        print(f"rewrote {GUIDE.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
