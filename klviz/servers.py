"""Starting the lesson servers (JupyterLab, the Voila presenter) so that nobody else can use them.

Every server klviz starts:

- listens on 127.0.0.1 only, with a random token that travels in a private config file (never on
  the command line, where other users could read it) and that **overrides** the user's own Jupyter
  configuration: a ``jupyter_server_config`` that switches the token off or opens cross-origin
  requests does not take effect;
- is then **probed**: a request without the token and from a foreign origin must be refused, else
  the server is stopped and klviz refuses to run (:func:`verify_locked`);
- runs with its working directory in a private folder, so nothing in the lesson folder (a learner's
  ``random.py``, a ``voila.py``) can be imported by the server in place of the real module, and
  starts its kernels with ``PYTHONSAFEPATH=1``, so a ``klviz.py`` in the lesson folder is not
  imported by the lessons either (:func:`safe_import_path`);
- lives exactly as long as the command that started it: Ctrl+C, SIGTERM, closing the terminal
  (SIGHUP) or a broken output pipe stop it with its kernels, and on Linux the kernel delivers
  SIGTERM to it if the klviz process dies without cleaning up;
- writes its own log to a file in the private folder, so the terminal shows one URL (klviz's), and
  the log's tail is printed if the server fails to start.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "LOCKED_SERVER_SETTINGS",
    "KERNEL_MALLOC",
    "LANG_VARIABLE",
    "edition_env",
    "Server",
    "start_server",
    "start_lab_server",
    "safe_import_path",
    "verify_locked",
    "run_until_interrupted",
    "free_port",
    "port_is_free",
    "wait_for_http",
    "lab_settings_dir",
    "private_folder",
    "running",
]

#: JupyterLab's first-start news prompt and update check, switched off for lesson servers.
_QUIET_LAB = {"@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": False}}
_PROBE_ORIGIN = "http://klviz-probe.invalid"


#: glibc's allocator for the servers and their kernels: memory blocks of 1 MiB or more are mapped on
#: their own and returned when freed, and a free top of the heap over 1 MiB is trimmed. By default the
#: threshold rises with each large block freed (up to 32 MiB), so a lesson's tensors of a few MiB end
#: up in the heap and stay resident. Measured in JupyterLab (benchmarks/lesson_memory.py, one lesson
#: at a time): lesson 05's kernel peaked at 536 MB by default and 368 MB with this, with no slower
#: panel updates measured (benchmarks/panels.py). Only glibc (Linux) reads these variables.
KERNEL_MALLOC = {"MALLOC_MMAP_THRESHOLD_": "1048576", "MALLOC_TRIM_THRESHOLD_": "1048576"}


#: The variable that tells klviz in a kernel which language to speak (panel labels, readouts, check messages,
#: figure labels): every kernel of a server for the Chinese edition has ``KLVIZ_LANG=zh``.
LANG_VARIABLE = "KLVIZ_LANG"


def edition_env(lang: str, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """A copy of ``base`` (default: this process's environment) for the servers and kernels of edition
    ``lang`` (``"en"``, ``"zh"``): :data:`LANG_VARIABLE` set to it for a translated edition, and removed
    for the English one, so that a ``KLVIZ_LANG`` left in a shell never mixes the two in one lesson."""
    env = dict(os.environ if base is None else base)
    if lang == "en":
        env.pop(LANG_VARIABLE, None)
    else:
        env[LANG_VARIABLE] = lang
    return env


def port_is_free(port: int) -> bool:
    """Whether nothing listens on 127.0.0.1:``port`` and it can be bound now."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def private_folder(prefix: str) -> Path:
    """A new folder only this user can read (mode 0700)."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    folder.chmod(0o700)
    return folder


def lab_settings_dir(folder: Path) -> Path:
    """A JupyterLab ``app_settings_dir`` in ``folder``: this environment's overrides, plus ours.

    The environment's ``overrides.json`` and ``overrides.d/`` (an administrator's theme, say) are
    copied; ``overrides.d/zz-klviz.json`` then turns off the news prompt and the update check, for
    servers klviz starts only.
    """
    target = folder / "lab-settings"
    (target / "overrides.d").mkdir(parents=True, exist_ok=True)
    source = Path(sysconfig.get_paths()["data"]) / "share" / "jupyter" / "lab" / "settings"
    for name in ("overrides.json", "overrides.json5"):
        if (source / name).is_file():
            shutil.copyfile(source / name, target / name)
    if (source / "overrides.d").is_dir():
        for f in (source / "overrides.d").iterdir():
            if f.is_file():
                shutil.copyfile(f, target / "overrides.d" / f.name)
    (target / "overrides.d" / "zz-klviz.json").write_text(json.dumps(_QUIET_LAB, indent=1))
    return target


def wait_for_http(url: str, proc: subprocess.Popen[Any], timeout: float = 120.0) -> None:
    """Poll ``url`` until it answers; fail early if ``proc`` exits."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except Exception:  # noqa: BLE001 - not up yet
            if proc.poll() is not None:
                raise RuntimeError(f"the server exited with code {proc.returncode} before answering") from None
            if time.monotonic() > deadline:
                raise RuntimeError(f"the server did not answer within {timeout:.0f} s") from None
            time.sleep(0.25)


def _probe(url: str, headers: dict[str, str]) -> tuple[int, str | None]:
    req = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, resp.headers.get("Access-Control-Allow-Origin")
    except urllib.error.HTTPError as err:
        return err.code, err.headers.get("Access-Control-Allow-Origin")
    except OSError as err:
        raise RuntimeError(f"could not probe the server ({err})") from None


def verify_locked(url: str) -> None:
    """Raise ``RuntimeError`` unless ``url`` refuses a request without the token, and a web page of
    another origin too.

    A request that gets through, or an answer that allows any origin, means some configuration
    switched the token or the origin check off.
    """
    status, _ = _probe(url, {})
    if status not in (401, 403):
        raise RuntimeError(
            f"the server answered a request without its token with HTTP {status}: a Jupyter "
            "configuration has switched the token off, so klviz will not serve the lessons"
        )
    status, allow = _probe(url, {"Origin": _PROBE_ORIGIN})
    if 200 <= status < 300 or allow in ("*", _PROBE_ORIGIN):
        raise RuntimeError(
            "the server lets other web pages call it (HTTP "
            f"{status}, Access-Control-Allow-Origin: {allow}): a Jupyter configuration has opened "
            "it up, so klviz will not serve the lessons"
        )


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    os.setsid()
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: SIGTERM when the klviz process dies


@dataclass
class Server:
    """A started server: its process, the URL to open (with the token), and its private folder."""

    proc: subprocess.Popen[Any]
    url: str
    folder: Path
    log: Path
    _closed: bool = field(default=False, repr=False)

    def stop(self) -> None:
        """Stop the server and its kernels, then delete the private folder (token and log with it)."""
        if self._closed:
            return
        self._closed = True
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        shutil.rmtree(self.folder, ignore_errors=True)

    def log_tail(self, lines: int = 15) -> str:
        """The last lines the server wrote (for an error message)."""
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def start_server(
    args: list[str],
    config: dict[str, Any],
    *,
    ready_path: str,
    probe_path: str,
    url_path: str,
    port: int | None = None,
    folder: Path | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 120.0,
) -> Server:
    """Start ``python -m <args>`` with ``config`` as its highest-priority config file, and lock it.

    ``config`` gets the address, port and a fresh token added; ``ready_path`` is polled (with the
    token) until the server answers, ``probe_path`` is asked without it (:func:`verify_locked`),
    and ``url_path`` is what the returned URL opens. On any failure the server is stopped, its
    private folder removed, and ``RuntimeError`` says why (with the server's last log lines).
    """
    work = private_folder("klviz-server-") if folder is None else folder
    if port and not port_is_free(port):  # said in one line, before any server log
        raise RuntimeError(f"port {port} is in use (another server?): choose another (--port N, or PORT=N with make)")
    port = port or free_port()
    token = secrets.token_urlsafe(24)
    cfg = json.loads(json.dumps(config))
    cfg.setdefault("ServerApp", {}).update({"ip": "127.0.0.1", "port": port, "port_retries": 0})
    cfg.setdefault("IdentityProvider", {})["token"] = token
    config_file = work / "klviz_server_config.json"
    fd = os.open(config_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # never through a link
    with os.fdopen(fd, "w") as f:
        json.dump(cfg, f, indent=1)
    log = work / "server.log"
    run_env = dict(os.environ if env is None else env)
    run_env.pop("JUPYTER_TOKEN", None)
    run_env.setdefault("PYTHONWARNINGS", "ignore::DeprecationWarning")
    run_env["PYTHONSAFEPATH"] = "1"  # kernels too: a lesson folder's klviz.py is never imported (safe_import_path)
    for name, value in KERNEL_MALLOC.items():  # kernels too; a value already set wins
        run_env.setdefault(name, value)
    cmd = [sys.executable, "-m", *args, f"--config={config_file}"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")  # containers and Binder-like machines run as root
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd,
            cwd=work,
            env=run_env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,
        )
    base = f"http://127.0.0.1:{port}"
    server = Server(proc, f"{base}{url_path}{'&' if '?' in url_path else '?'}token={token}", work, log)
    try:
        wait_for_http(f"{base}{ready_path}?token={token}", proc, timeout=timeout)
        verify_locked(f"{base}{probe_path}")
    except BaseException as err:
        tail = server.log_tail()
        server.stop()
        if isinstance(err, RuntimeError):
            raise RuntimeError(f"{err}" + (f"\n--- the server's last lines ---\n{tail}" if tail else "")) from None
        raise
    return server


#: Server settings every lesson server gets, overriding any user configuration.
LOCKED_SERVER_SETTINGS = {
    "allow_origin": "",
    "allow_origin_pat": "",
    "disable_check_xsrf": False,
    "allow_remote_access": False,
    "open_browser": False,
}


def safe_import_path(root: Path) -> None:
    """Make sure a kernel started in ``root`` imports the installed modules, not files in ``root``.

    A kernel's working folder is the notebook's. Python and IPython normally put it on ``sys.path``,
    so a ``klviz.py`` (or ``torch.py``) planted there would run on ``import klviz``. Every server
    klviz starts passes ``PYTHONSAFEPATH=1`` to its kernels (:func:`start_server`), which Python 3.11+
    and IPython 9.7+ honour: the working folder is not on the import path. On an older Python, which
    has no such switch, a folder holding Python modules is refused with ``RuntimeError`` instead.
    """
    if sys.version_info >= (3, 11):
        return
    modules = sorted(p.name for p in Path(root).iterdir() if p.suffix == ".py" or (p / "__init__.py").is_file())
    if modules:
        raise RuntimeError(
            f"{root} holds Python modules ({', '.join(modules[:3])}) that a kernel there would import in place of "
            "the installed ones; Python < 3.11 cannot be told not to: move them, or use Python 3.11 or newer"
        )


def start_lab_server(
    root: Path,
    *,
    first: str | None = None,
    port: int | None = None,
    env: dict[str, str] | None = None,
    extra: dict[str, Any] | None = None,
    strip_on_save: bool = False,
    timeout: float = 120.0,
) -> Server:
    """JupyterLab serving ``root``, locked (see the module docstring), opened at ``first`` if given.

    ``strip_on_save``: notebooks are saved in their stored form (no outputs; see
    :mod:`klviz.notebook_format`), for serving the repository's own lessons. ``extra`` is merged into
    the config (``{"LabApp": {"expose_app_in_browser": True}}`` for tests).
    """
    safe_import_path(root)
    folder = private_folder("klviz-lab-")
    config: dict[str, Any] = {
        "ServerApp": {"root_dir": str(Path(root).resolve()), **LOCKED_SERVER_SETTINGS},
        "LabApp": {"app_settings_dir": str(lab_settings_dir(folder))},
    }
    if strip_on_save:
        config["ContentsManager"] = {"pre_save_hook": "klviz.notebook_format.strip_outputs_before_save"}
    from .fonts import write_jupyterlab_custom  # Chinese text renders without a CJK font on the machine

    for section, values in write_jupyterlab_custom(folder).items():
        config.setdefault(section, {}).update(values)
    for section, values in (extra or {}).items():
        config.setdefault(section, {}).update(values)
    path = f"/lab/tree/{first}" if first else "/lab"
    try:
        return start_server(
            ["jupyterlab"],
            config,
            ready_path="/api/status",
            probe_path="/api/contents",
            url_path=path,
            port=port,
            folder=folder,
            env=env,
            timeout=timeout,
        )
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise


def run_until_interrupted(server: Server, announce: list[str]) -> int:
    """Print ``announce`` and wait for ``server``; any way the command ends stops the server.

    Ctrl+C, SIGTERM and SIGHUP (the terminal closed) stop it; so does a broken pipe on the output.
    Returns the exit status for the command (0 after a requested stop).

    The signal handler only notes the request, and the loop below polls for it: a handler that
    raised could land between a lock's acquire and the block that releases it (``Popen.wait``
    holds one while it reaps), and stopping the server then waited on that lock for ever
    (seen once in five stops of ``make lab`` by SIGTERM).
    """
    requested: list[int] = []

    def note(signum: int, _frame: object) -> None:
        requested.append(signum)

    # SIGINT too: a command started in the background of a shell inherits SIGINT ignored, and Python
    # then installs no KeyboardInterrupt handler of its own; Ctrl+C must stop the server all the same
    handled = [s for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s is not None]
    old = {s: signal.signal(s, note) for s in handled}
    try:
        try:
            for line in announce:
                print(line, flush=True)
        except (BrokenPipeError, OSError):
            with contextlib.suppress(OSError):  # nobody reads our output any more: keep quiet
                sys.stdout = open(os.devnull, "w")  # lives until exit
        while not requested:
            code = server.proc.poll()
            if code is not None:
                return code
            time.sleep(POLL_S)
        with contextlib.suppress(BrokenPipeError, OSError):
            print("\nstopping the server ...", flush=True)
        return 0
    finally:
        server.stop()
        for s, handler in old.items():
            signal.signal(s, handler)


#: seconds between two looks at a running server (:func:`run_until_interrupted`): how long a stop waits
POLL_S = 0.1


@contextlib.contextmanager
def running(server: Server) -> Iterator[Server]:
    """``with running(start_server(...)) as s:`` stops the server when the block ends."""
    try:
        yield server
    finally:
        server.stop()
