"""The ``klviz`` console script: ``klviz --version`` and one subcommand per task.

Each subcommand is one ``_add_<name>`` function that declares its arguments and one ``_run_<name>``
function that runs it and returns the exit status. Exit status 0: fine; 2: the input could not be
used (one line on stderr, never a traceback).

Start-up stays fast: this module imports only the standard library, and ``import klviz`` loads
nothing heavy, so ``klviz --help`` and ``klviz diagnose --help`` parse and print without torch,
matplotlib or ipywidgets. A subcommand imports what it needs inside its ``_run_<name>`` function
(``tests/test_startup.py`` checks this).
"""
from __future__ import annotations

import argparse
import sys
from typing import Callable

EXIT_OK = 0
EXIT_BAD_INPUT = 2
EXIT_INTERNAL = 3


def _error(message: str) -> None:
    print(f"klviz: error: {' '.join(str(message).split())}", file=sys.stderr)


# -- klviz diagnose ---------------------------------------------------------------------------

def _add_diagnose(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "diagnose", help="diagnose the KL estimates in a rollout dump (.npz, .pt, .safetensors)",
        description="Read per-token log-probs of one batch ([batch, tokens] tensors) and report k1, k2, k3, "
                    "what each estimates, the frameworks' clamps and trouble signs. Without FILE, the sample "
                    "dump shipped with klviz is used.")
    p.add_argument("file", nargs="?", default=None, metavar="FILE",
                   help="rollout dump; see docs/rollout_format.md (default: the shipped sample)")
    p.add_argument("--plot", metavar="OUT.png", default=None, help="also write a PNG report to this path")
    p.add_argument("--logprob-key", default="logprob", help="key of the policy's log-probs (default: logprob)")
    p.add_argument("--ref-key", default="ref_logprob", help="key of the reference log-probs (default: ref_logprob)")
    p.add_argument("--mask-key", default="response_mask", help="key of the response mask (default: response_mask)")
    p.add_argument("--old-key", default=None,
                   help="key of the sampler's log-probs when it is not the policy (default: old_logprob if present)")
    p.set_defaults(run=_run_diagnose)


def _run_diagnose(args: argparse.Namespace) -> int:
    from . import diagnose as dg

    path = args.file if args.file is not None else dg.sample_rollouts_path()
    try:
        rollouts = dg.load_rollouts(
            path, logprob_key=args.logprob_key, ref_key=args.ref_key, mask_key=args.mask_key,
            old_key=args.old_key if args.old_key is not None else "old_logprob", require_old=args.old_key is not None)
        result = dg.diagnose(rollouts)
    except ValueError as err:           # RolloutFileError and any other bad-input error
        _error(f"{path}: {err}")
        return EXIT_BAD_INPUT
    print(dg.format_report(result))
    if args.plot:
        try:
            import matplotlib
            matplotlib.use("agg")
            fig = dg.plot_report(result, args.plot)
            import matplotlib.pyplot as plt
            plt.close(fig)
            print(f"\nPNG report written to {args.plot}")
        except (OSError, ValueError) as err:
            _error(f"could not write the plot to {args.plot}: {err}")
            return EXIT_BAD_INPUT
    if result.has_nonfinite:
        n = sum(result.nonfinite.values())
        _error(f"{path}: {n} counted token(s) have NaN or inf log-probs (left out of the report above; "
               "see 'Trouble signs')")
        return EXIT_BAD_INPUT
    return EXIT_OK


# -- klviz lab / present / site: own argument parsers, handed the rest of the command line ------

_DELEGATED = {
    "lab": ("klviz.labcmd", "copy the lessons into DIR (default ./klviz-lessons) and open JupyterLab there"),
    "present": ("klviz.present", "serve one lesson's prose and panels with Voila (presenter mode)"),
    "site": ("klviz.site", "execute the lessons and write a static HTML site"),
}


def _add_delegated(sub: argparse._SubParsersAction) -> None:
    for name, (_module, help_text) in _DELEGATED.items():
        sub.add_parser(name, add_help=False, help=help_text + f" (klviz {name} --help)")


# -- the parser -------------------------------------------------------------------------------

_SUBCOMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [_add_diagnose, _add_delegated]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="klviz", description="KL estimators for RL on language models")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in _SUBCOMMANDS:
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``klviz`` console script; returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in _DELEGATED:      # their options (e.g. --force) pass through untouched
        import importlib

        return importlib.import_module(_DELEGATED[argv[0]][0]).main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.version:
        from . import __version__

        print(f"klviz {__version__}")
        return EXIT_OK
    run = getattr(args, "run", None)
    if run is None:
        parser.print_help()
        return EXIT_OK
    try:
        return run(args)
    except KeyboardInterrupt:  # pragma: no cover
        return 130
    except Exception as err:  # noqa: BLE001 - never a traceback on the command line
        _error(f"unexpected {type(err).__name__}: {err} (please report this)")
        return EXIT_INTERNAL


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
