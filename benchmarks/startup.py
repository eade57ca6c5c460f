"""How long does ``klviz`` take to start, next to ``import numpy``?

Four commands, each a fresh Python process, timed round by round in one run:

- ``import numpy``: ``python -c "import numpy"``, an interpreter that loads one compiled library
  (the baseline);
- ``klviz --help``: the console script printing its help (argparse only: no torch);
- ``klviz diagnose --help``: the same for the subcommand (its heavy imports wait until it runs);
- ``import klviz``: ``python -c "import klviz"`` (public names load on first use).

Target: ``klviz --help`` <= 3x ``import numpy``. Also checked: that ``klviz --help`` exits 0 and
leaves torch, matplotlib and ipywidgets unloaded (exit 1 otherwise).

    python benchmarks/startup.py                    # 15 rounds
    python benchmarks/startup.py --repeat 31
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (  # noqa: E402
    fmt_ms,
    fmt_ratio,
    make_parser,
    median,
    parse_args,
    print_header,
    print_table,
    ratio_median,
    rounds,
    verdict,
)

TARGET_HELP_VS_NUMPY = 3.0
HEAVY = ("torch", "matplotlib", "ipywidgets")


def klviz_command() -> list[str]:
    """The ``klviz`` console script beside this interpreter, else ``python -m klviz.cli``."""
    script = Path(sys.executable).with_name("klviz")
    if script.is_file():
        return [str(script)]
    found = shutil.which("klviz")
    return [found] if found else [sys.executable, "-m", "klviz.cli"]


def commands() -> dict[str, list[str]]:
    klviz = klviz_command()
    return {
        "import numpy": [sys.executable, "-c", "import numpy"],
        "klviz --help": [*klviz, "--help"],
        "klviz diagnose --help": [*klviz, "diagnose", "--help"],
        "import klviz": [sys.executable, "-c", "import klviz"],
    }


def run(cmd: list[str]) -> None:
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed (exit {done.returncode}): {done.stderr[-500:]}")


def heavy_modules_after_help() -> list[str]:
    """Which of HEAVY the CLI's ``--help`` leaves in ``sys.modules`` (run in a fresh process)."""
    probe = (
        "import sys\nsys.argv = ['klviz', '--help']\nimport klviz.cli\n"
        "try:\n    klviz.cli.main()\nexcept SystemExit:\n    pass\n"
        f"print('HEAVY=' + ','.join(m for m in {HEAVY!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    line = next(ln for ln in out.splitlines() if ln.startswith("HEAVY="))
    return [m for m in line[len("HEAVY=") :].split(",") if m]


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__.splitlines()[0], repeat=15)
    parser.add_argument("--strict", action="store_true", help="exit 1 when the target is missed")
    args = parse_args(parser, argv)
    cmds = commands()
    print_header(
        "startup: klviz's command line and import vs import numpy, each a fresh process",
        args,
        klviz="console script" if len(cmds["klviz --help"]) == 2 else "python -m klviz.cli",
    )
    times = rounds({name: (lambda cmd=cmd: run(cmd)) for name, cmd in cmds.items()}, args.repeat, args.device)
    base = times["import numpy"]
    rows = [[name, fmt_ms(median(ts)), fmt_ratio(ratio_median(ts, base))] for name, ts in times.items()]
    print_table(["command", "median time", "/ import numpy"], rows)
    vs_numpy = ratio_median(times["klviz --help"], base)
    print(
        f"   klviz --help / import numpy = {vs_numpy:.2f}x  (target <= {TARGET_HELP_VS_NUMPY}x): "
        f"{verdict(vs_numpy, TARGET_HELP_VS_NUMPY)}"
    )

    heavy = heavy_modules_after_help()
    print(
        f"   check: klviz --help loads {', '.join(heavy) if heavy else 'none of ' + ', '.join(HEAVY)} "
        f"({'MISMATCH' if heavy else 'ok'})"
    )
    if heavy:
        return 1
    return 1 if args.strict and vs_numpy > TARGET_HELP_VS_NUMPY else 0


if __name__ == "__main__":
    sys.exit(main())
