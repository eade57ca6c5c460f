"""The ``klviz`` console script: ``klviz --version`` and one subcommand per task.

Each subcommand is one ``_add_<name>`` function that declares its arguments and one ``_run_<name>``
function that runs it and returns the exit status. Exit status 0: fine; 1: ``diagnose --fail-on``
found trouble; 2: the input could not be used, including an allocation failure (one line on stderr,
never a traceback); 3: a bug in klviz. Output is written for any terminal or pipe: text and JSON never
carry a raw control, bidi or unencodable character, and a reader that stops early (``| head``) ends
the output quietly without changing the status.

Start-up stays fast: this module imports only the standard library, and ``import klviz`` loads
nothing heavy, so ``klviz --help`` and ``klviz diagnose --help`` parse and print without torch,
matplotlib or ipywidgets. A subcommand imports what it needs inside its ``_run_<name>`` function
(``tests/test_startup.py`` checks this).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import unicodedata
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # types only: a subcommand imports what it needs when it runs
    import numpy as np
    from matplotlib.figure import Figure

    from .diagnose import Diagnosis

EXIT_OK = 0
EXIT_BAD_INPUT = 2
EXIT_INTERNAL = 3


def _error(message: str, limit: int = 400) -> None:
    line = " ".join(_escape(" ".join(str(message).split())).split())
    if len(line) > limit:
        line = line[: limit - 3] + "..."
    try:
        print(f"klviz: error: {line}", file=sys.stderr, flush=True)
    except (OSError, ValueError):  # stderr closed too: nothing more can be said
        pass


def _write(text: str, *, utf8: bool = False) -> bool:
    """Print ``text`` (already escaped); ``False`` when the reader has gone (a closed pipe, ``| head``).

    ``utf8``: the bytes are UTF-8 whatever the locale says (JSON); otherwise the output's own encoding,
    with anything it cannot encode written as an escape."""
    out = sys.stdout
    try:
        buffer = getattr(out, "buffer", None)
        if utf8 and buffer is not None:
            out.flush()
            buffer.write((text + "\n").encode("utf-8"))
            buffer.flush()
        else:
            encoding = getattr(out, "encoding", None) or "utf-8"
            try:
                text.encode(encoding)
            except (UnicodeEncodeError, LookupError):
                text = text.encode(encoding, "backslashreplace").decode(encoding, "replace")
            out.write(text + "\n")
            out.flush()
    except BrokenPipeError:
        _silence_stdout()
        return False
    return True


def _silence_stdout() -> None:
    """After the reader closed the pipe: send what is still buffered nowhere, so exit stays quiet."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # not a real file (a test's capture): nothing to silence
        pass


# -- klviz diagnose ---------------------------------------------------------------------------

EXIT_FAIL_ON = 1
_GUIDE = Path(__file__).resolve().parent / "docs" / "rollout_format.md"


def _escape(text: str, keep: str = "") -> str:
    """Control, format (bidi) and unpaired-surrogate characters shown as escapes (``\\x9b``, ``\\u202e``),
    so nothing a file or its name holds reaches the terminal raw; characters in ``keep`` stay."""
    out = []
    for ch in str(text):
        if (unicodedata.category(ch)[0] == "C" or ch in "\u2028\u2029") and ch not in keep:
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
        else:
            out.append(ch)
    return "".join(out)


def _clean_json(obj: object) -> object:
    """Every string of a report (keys included) escaped like :func:`_escape`: valid UTF-8 JSON whatever
    the file names, and no raw control or bidi character in it."""
    if isinstance(obj, str):
        return _escape(obj)
    if isinstance(obj, dict):
        return {_escape(str(k)): _clean_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean_json(v) for v in obj]
    return obj


def _positive_int(text: str) -> int:
    try:
        value = int(float(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0 or value != float(text):
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value < 2**32:
        raise argparse.ArgumentTypeError(f"expected an integer from 0 to {2**32 - 1:,}, got {_escape(text)!r}")
    return value


def _clip(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1), got {text!r}") from None
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1), got {text!r}")
    return value


_DIAGNOSE_STATUSES = """\
exit status (the same for one file and for a folder or several files; the highest applies):
  0  every dump was read and analysed, and --fail-on (if given) found nothing
  1  --fail-on found a trouble sign of that severity or worse
  2  the input could not be used: an option or --vocab file is wrong, a dump is refused or
     unreadable (in a run: any one of them; the others are still reported and the unreadable
     ones are listed), not enough memory, or NaN/inf log-probs at counted tokens
  3  a bug in klviz (the message says so; please report it)
A reader that stops early (| head) ends the output quietly; the status is still that of the check."""


def _add_diagnose(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "diagnose",
        help="diagnose the KL estimates in a rollout dump (.npz, .pt, .safetensors)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Read per-token log-probs of one batch ([batch, tokens] tensors) and report k1, k2, k3, "
        "what each estimates, the frameworks' clamps, per-position means, storage precision, the "
        "engine-trainer mismatch and trouble signs. Without FILE, the sample dump shipped with klviz "
        "is used; several files or a folder give a trend across the run.",
        epilog=f"The dump format, with snippets for verl, TRL and OpenRLHF, and the JSON schema: {_GUIDE} "
        "(klviz diagnose --format-guide prints it).\n\n" + _DIAGNOSE_STATUSES,
    )
    p.add_argument(
        "file", nargs="*", metavar="FILE", help="rollout dump(s) or a folder of them (default: the shipped sample)"
    )
    p.add_argument("--json", action="store_true", help="print the versioned JSON report instead of text")
    p.add_argument(
        "--fail-on",
        choices=("warning", "error"),
        default=None,
        help="exit with status 1 when a trouble sign of this severity (or worse) is found",
    )
    p.add_argument(
        "--logged",
        action="append",
        default=[],
        metavar="NAME=VALUE|HISTORY",
        help="a value your framework logged for this batch (e.g. kl=0.0123; repeatable): every formula the "
        "frameworks log under that name is recomputed exactly on the dump, and the report says which one the "
        "value is (or which is closest). Or a log history (.json, .jsonl, .csv of step -> metrics, e.g. "
        "trainer_state.json): each logged step is checked against the dumps of that step. A folder holding "
        "log_history.jsonl or trainer_state.json is checked against it without this option",
    )
    p.add_argument("--plot", metavar="OUT.png", default=None, help="also write a PNG report to this path")
    p.add_argument(
        "--clip", type=_clip, default=0.2, help="PPO clip epsilon whose cut fraction is reported (default 0.2)"
    )
    p.add_argument(
        "--vocab",
        metavar="FILE",
        default=None,
        help="token strings for a token_ids key: JSON list, vocab.json, tokenizer.json or one token per line",
    )
    p.add_argument(
        "--max-tokens",
        type=_positive_int,
        default=None,
        help="refuse arrays declaring more elements than this, or more bytes than 8 per element of it "
        "(default 134,217,728 = 2**27 elements, 1 GiB)",
    )
    p.add_argument("--logprob-key", default="logprob", help="key of the policy's log-probs (default: logprob)")
    p.add_argument("--ref-key", default="ref_logprob", help="key of the reference log-probs (default: ref_logprob)")
    p.add_argument("--mask-key", default="response_mask", help="key of the response mask (default: response_mask)")
    p.add_argument(
        "--old-key",
        default=None,
        help="key of the sampler's log-probs when it is not the policy (default: old_logprob if present)",
    )
    p.add_argument(
        "--rollout-key",
        default=None,
        help="key of the rollout engine's log-probs (default: rollout_logprob if present)",
    )
    p.add_argument("--format-guide", action="store_true", help="print the rollout-format guide and exit")
    p.set_defaults(run=_run_diagnose_quietly)


def _quiet_numerics() -> contextlib.ExitStack:
    """NumPy's floating-point warnings silenced: extreme values are reported in the report, not as
    multi-line warnings on stderr."""
    import warnings

    import numpy as np

    stack = contextlib.ExitStack()
    stack.enter_context(warnings.catch_warnings())
    warnings.simplefilter("ignore", RuntimeWarning)
    stack.enter_context(np.errstate(all="ignore"))
    return stack


def _run_diagnose_quietly(args: argparse.Namespace) -> int:
    with _quiet_numerics():
        return _run_diagnose(args)


def _run_diagnose(args: argparse.Namespace) -> int:
    if args.format_guide:
        try:
            text = _GUIDE.read_text(encoding="utf-8")
        except OSError as err:
            _error(f"cannot read the format guide {_GUIDE}: {err}")
            return EXIT_BAD_INPUT
        _write(text)
        return EXIT_OK
    from . import diagnose as dg

    try:
        histories = [x for x in args.logged if dg.is_history(x)]
        logged = [dg.parse_logged_text(x) for x in args.logged if x not in histories]
        if len(histories) > 1:
            raise ValueError("--logged: give at most one log history file")
        history = dg.read_history(histories[0]) if histories else _folder_history(args.file)
    except ValueError as err:
        _error(str(err))
        return EXIT_BAD_INPUT
    open_kwargs = dict(
        logprob_key=args.logprob_key,
        ref_key=args.ref_key,
        mask_key=args.mask_key,
        old_key=args.old_key if args.old_key is not None else "old_logprob",
        require_old=args.old_key is not None,
        rollout_key=args.rollout_key if args.rollout_key is not None else "rollout_logprob",
        require_rollout=args.rollout_key is not None,
        max_tokens=args.max_tokens or dg.DEFAULT_MAX_TOKENS,
    )
    files = args.file or [str(dg.sample_rollouts_path())]
    try:
        vocab = dg.read_vocab(args.vocab) if args.vocab else None
        paths = dg.collect_dumps(files)
    except ValueError as err:
        _error(str(err))
        return EXIT_BAD_INPUT
    except OSError as err:  # a folder that cannot be listed
        _error(f"cannot read {err.filename}: {err.strerror or err}")
        return EXIT_BAD_INPUT
    if len(paths) > 1 or history is not None:
        return _run_series(args, paths, open_kwargs, vocab, logged, history)
    path = paths[0]
    try:
        with dg.open_dump(path, **open_kwargs) as f:
            result = dg.diagnose(f, clip=args.clip, vocab=vocab, logged=logged)
    except MemoryError:
        _error(f"{path}: not enough memory to analyse this dump (lower --max-tokens to refuse such files early)")
        return EXIT_BAD_INPUT
    except ValueError as err:  # RolloutFileError and any other bad-input error
        _error(f"{path}: {err}")
        return EXIT_BAD_INPUT
    status = _emit(
        args, lambda: dg.report_json(result), lambda: dg.format_report(result), lambda out: dg.plot_report(result, out)
    )
    if status:
        return status
    if result.has_nonfinite:
        n = sum(result.nonfinite.values())
        _error(
            f"{path}: {n} counted token(s) have NaN or inf log-probs (left out of the report above; "
            "see 'Trouble signs')"
        )
        return EXIT_BAD_INPUT
    return _fail_on(args, [t.severity for t in result.trouble])


def _emit(
    args: argparse.Namespace, as_json: Callable[[], object], as_text: Callable[[], str], draw: Callable[[str], Figure]
) -> int:
    """Print the report (``--json`` or text) and write ``--plot``; a non-zero status if the plot failed."""
    if args.json:
        import json

        _write(json.dumps(_clean_json(as_json()), ensure_ascii=False, indent=1, allow_nan=False), utf8=True)
    else:
        _write(_escape(as_text(), keep="\n"))
    return _plot(draw, args.plot, quiet=args.json) if args.plot else EXIT_OK


def _plot(draw: Callable[[str], Figure], out: str, quiet: bool) -> int:
    try:
        import matplotlib

        matplotlib.use("agg")
        fig = draw(out)
        import matplotlib.pyplot as plt

        plt.close(fig)
        if not quiet:
            _write(_escape(f"\nPNG report written to {out}", keep="\n"))
    except (OSError, ValueError) as err:
        _error(f"could not write the plot to {out}: {err}")
        return EXIT_BAD_INPUT
    return EXIT_OK


def _fail_on(args: argparse.Namespace, severities: list[str]) -> int:
    if args.fail_on is None:
        return EXIT_OK
    order = ("info", "warning", "error")
    if any(order.index(s) >= order.index(args.fail_on) for s in severities):
        _error(f"--fail-on {args.fail_on}: trouble of severity {args.fail_on} or worse was found (see the report)")
        return EXIT_FAIL_ON
    return EXIT_OK


def _folder_history(files: list[str]) -> dict[float, dict[str, float]] | None:
    """The log history a run folder holds (``log_history.jsonl`` from the TRL integration, or
    ``trainer_state.json``), or None."""
    from . import diagnose as dg

    for f in files:
        for name in dg.HISTORY_FILES:
            candidate = Path(f) / name
            if Path(f).is_dir() and candidate.is_file():
                return dg.read_history(candidate)
    return None


def _run_series(
    args: argparse.Namespace,
    paths: list[Path],
    open_kwargs: dict[str, Any],
    vocab: Callable[[np.ndarray], list[str]] | None,
    logged: list[tuple[str, float, str]],
    history: dict[float, dict[str, float]] | None = None,
) -> int:
    from . import diagnose as dg

    names = [x[0] for x in logged] + (dg.history_names(history) if history else [])

    def each(_p: Path, d: Diagnosis) -> None:
        d.logged = dg.match_logged(d, logged) if logged else []

    try:
        items = dg.diagnose_series(
            paths, open_kwargs, clip=args.clip, vocab=vocab, on_each=each, identify=names or None
        )
    except MemoryError:
        _error("not enough memory to analyse these dumps")
        return EXIT_BAD_INPUT
    checked = dg.check_history(items, history) if history else None
    status = _emit(
        args,
        lambda: dg.series_json(items, checked),
        lambda: dg.format_series(items, checked),
        lambda out: dg.plot_series(items, out),
    )
    if status:
        return status
    unreadable = [name for name, _s, d in items if isinstance(d, str)]
    nonfinite = [name for name, _s, d in items if not isinstance(d, str) and d.has_nonfinite]
    if unreadable or nonfinite:
        parts = []
        for names, what in (
            (unreadable, "could not be used"),
            (nonfinite, "have NaN or inf log-probs at counted tokens"),
        ):
            if names:
                shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
                parts.append(f"{len(names)} of {len(items)} dumps {what} ({shown})")
        _error("; ".join(parts) + " (see the report above)")
        return EXIT_BAD_INPUT
    return _fail_on(args, [t.severity for _n, _s, d in items if not isinstance(d, str) for t in d.trouble])


# -- klviz audit ------------------------------------------------------------------------------


def _add_audit(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "audit",
        help="which KL gradient does your KL loss follow? (runs your file as code)",
        description="Import FILE.py and call FUNCTION on every sequence of a tiny enumerable policy: the exact "
        "expected gradient of your KL term is compared with the gradients of KL(π‖π_ref) and "
        "KL(π_ref‖π), and with known terms (what it behaves like, and the fix that fits it). With the default "
        "--length 1 the audit at length 3 is shown beside it (a token-level term only shows there). WARNING: "
        "auditing runs your file as Python code, with your permissions; audit only code you trust.",
        epilog="Exit status: 0 the audit ran (whatever it found); 2 the file, the function or an option could not "
        "be used (an exception, sys.exit, a timeout); 3 a bug in klviz.",
    )
    p.add_argument(
        "target",
        metavar="FILE.py:FUNCTION",
        help="fn(logprob, old_logprob, ref_logprob, response_mask) -> scalar loss (placement loss) or "
        "per-token penalties [batch, length] (placement reward)",
    )
    p.add_argument("--placement", choices=("loss", "reward"), default="loss")
    p.add_argument(
        "--sampler",
        choices=("current", "old"),
        default="current",
        help="tokens from the current policy, or from a perturbed old policy (off-policy)",
    )
    p.add_argument("--vocab-size", type=_positive_int, default=4)
    p.add_argument("--length", type=_positive_int, default=1, help="sequence length (default 1, shown beside length 3)")
    p.add_argument(
        "--policies",
        choices=("mild", "far"),
        default="mild",
        help="far: the reference all but excludes the policy's likeliest token (log r ≈ -25), so every "
        "framework's clamps bind",
    )
    p.add_argument("--seed", type=_seed, default=0, help="seed of the toy policies (an integer, 0 to 2**32 - 1)")
    p.add_argument(
        "--timeout",
        type=_positive_float,
        default=120.0,
        metavar="SECONDS",
        help="stop (exit status 2) if importing the file and auditing take longer (default 120)",
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(run=_run_audit)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}") from None
    if not (value > 0 and value < 1e7):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


class _AuditTimeout(BaseException):  # not an Exception: user code that catches those cannot swallow it
    """The --timeout of klviz audit ran out."""


def _run_audit(args: argparse.Namespace) -> int:
    import json

    file, sep, func = args.target.rpartition(":")
    if not sep or not file or not func:
        _error(f"expected FILE.py:FUNCTION, got {_escape(args.target)!r}")
        return EXIT_BAD_INPUT
    path = Path(file)
    if not path.is_file():
        _error(f"no such file: {path}")
        return EXIT_BAD_INPUT
    print(f"klviz audit: running {path} as Python code (it can do anything your user can)", file=sys.stderr)
    with _deadline(args.timeout):
        try:
            status, text = _audit_file(args, path, func)
        except _AuditTimeout:
            _error(f"{path}: importing and auditing took longer than --timeout {args.timeout:g} s")
            return EXIT_BAD_INPUT
    if status != EXIT_OK:
        _error(text)
        return status
    print(text if not args.json else json.dumps(json.loads(text), ensure_ascii=False, indent=1))
    return EXIT_OK


def _deadline(seconds: float) -> contextlib.AbstractContextManager[None]:
    """A context that raises _AuditTimeout after ``seconds`` (SIGALRM; no limit where there is none)."""
    import contextlib
    import signal
    import threading

    @contextlib.contextmanager
    def ctx() -> Iterator[None]:
        usable = hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
        if not usable:
            yield
            return

        def fire(_sig: int, _frame: object) -> None:
            raise _AuditTimeout

        before = signal.signal(signal.SIGALRM, fire)
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, before)

    return ctx()


def _audit_file(args: argparse.Namespace, path: Path, func: str) -> tuple[int, str]:
    """Import the user's file as a module (in sys.modules, its folder on the import path) and audit ``func``;
    returns (status, the report or an error message)."""
    import importlib.util
    import json

    name = f"klviz_audit_target_{abs(hash(str(path.resolve())))}"
    folder = str(path.resolve().parent)
    sys.path.insert(0, folder)
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            return EXIT_BAD_INPUT, f"{path} cannot be imported as a Python module"
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses and `from __future__ import annotations` look it up here
        try:
            spec.loader.exec_module(module)
        except SystemExit as err:
            return EXIT_BAD_INPUT, f"{path} called sys.exit({err.code!r}) while being imported"
        except _AuditTimeout:
            raise
        except Exception as err:  # noqa: BLE001 - the user's file failed
            return EXIT_BAD_INPUT, f"{path} failed to import: {type(err).__name__}: {err}"
        fn = getattr(module, func, None)
        if not callable(fn):
            return EXIT_BAD_INPUT, f"{path} has no function {_escape(func)!r}"
        from .audit import audit_loss

        try:
            result = audit_loss(
                fn,
                placement=args.placement,
                sampler=args.sampler,
                vocab_size=args.vocab_size,
                length=args.length,
                seed=args.seed,
                policies=args.policies,
            )
        except SystemExit as err:
            return EXIT_BAD_INPUT, f"{_escape(func)} called sys.exit({err.code!r}): a KL term must return a value"
        except ValueError as err:
            return EXIT_BAD_INPUT, str(err)
        return EXIT_OK, json.dumps(result.as_dict(), ensure_ascii=False) if args.json else result.summary
    finally:
        sys.modules.pop(name, None)
        if sys.path and sys.path[0] == folder:
            del sys.path[0]


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

_SUBCOMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [_add_diagnose, _add_audit, _add_delegated]


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
    if argv and argv[0] in _DELEGATED:  # their options (e.g. --force) pass through untouched
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
    except BrokenPipeError:  # the reader stopped early (| head): quiet, as the output itself would be
        _silence_stdout()
        return EXIT_OK
    except MemoryError:
        _error("not enough memory for this input")
        return EXIT_BAD_INPUT
    except Exception as err:  # noqa: BLE001 - never a traceback on the command line
        _error(f"unexpected {type(err).__name__}: {err} (please report this)")
        return EXIT_INTERNAL


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
