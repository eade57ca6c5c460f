"""The lesson servers against a hostile configuration, hostile sibling files and a closed terminal."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from klviz import servers

ROOT = Path(__file__).resolve().parents[1]

#: A user's Jupyter configuration that switches the token off and opens cross-origin requests.
HOSTILE_CONFIG = {
    "IdentityProvider": {"token": ""},
    "ServerApp": {
        "token": "",
        "password": "",
        "allow_origin": "*",
        "disable_check_xsrf": True,
        "allow_remote_access": True,
        "ip": "0.0.0.0",
    },
}
#: A server that answers everybody (what a lab with its token switched off looks like from outside).
OPEN_SERVER = """
import http.server, json, sys

config = json.load(open([a for a in sys.argv if a.startswith("--config=")][0].split("=", 1)[1]))


class Open(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Access-Control-Allow-Origin", "*")
        self.end_headers()
        self.wfile.write(b"{}")


http.server.HTTPServer(("127.0.0.1", config["ServerApp"]["port"]), Open).serve_forever()
"""


def _env(home: Path, config: dict | None = None, pythonpath: Path | None = None) -> dict[str, str]:
    cfg = home / "jupyter-config"
    cfg.mkdir(parents=True, exist_ok=True)
    if config is not None:
        (cfg / "jupyter_server_config.json").write_text(json.dumps(config))
    env = dict(os.environ, HOME=str(home), JUPYTER_CONFIG_DIR=str(cfg), PYTHONUNBUFFERED="1")
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    return env


def _lessons(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    nb = {"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    (folder / "00_start.ipynb").write_text(json.dumps(nb))
    return folder


def _status(url: str, headers: dict[str, str] | None = None) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as err:
        return err.code


@pytest.mark.slow
def test_hostile_config_cannot_open_the_lab(tmp_path):
    server = servers.start_lab_server(
        _lessons(tmp_path / "lessons"), first="00_start.ipynb", env=_env(tmp_path / "home", HOSTILE_CONFIG)
    )
    with servers.running(server):
        base = server.url.split("/lab")[0]
        token = server.url.rsplit("token=", 1)[1]
        assert base.startswith("http://127.0.0.1:")
        assert _status(f"{base}/api/contents") in (401, 403)
        assert _status(f"{base}/api/contents", {"Origin": "http://evil.example"}) in (401, 403, 404)
        assert _status(f"{base}/api/contents?token={token}") == 200
        assert _status(f"{base}/api/contents?token={token}", {"Host": "evil.example"}) == 403  # DNS rebinding
        assert token not in " ".join(server.proc.args)
        folder = server.folder
        assert (folder / "klviz_server_config.json").stat().st_mode & 0o077 == 0
    assert not folder.exists()  # the token file goes with the server


def test_a_server_that_lets_everyone_in_is_refused(tmp_path, monkeypatch):
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "open_server.py").write_text(OPEN_SERVER)
    private = tmp_path / "private"
    private.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(private))  # where the server's private folder goes
    with pytest.raises(RuntimeError, match="without its token"):
        servers.start_server(
            ["open_server"],
            {},
            ready_path="/",
            probe_path="/api/contents",
            url_path="/",
            env=_env(tmp_path / "home", pythonpath=mods),
            timeout=30,
        )
    assert list(private.iterdir()) == []  # stopped, and its token file removed


def test_verify_locked_wants_a_refusal_for_both_probes(tmp_path):
    import http.server
    import threading

    answers = {"plain": 403, "origin": 200}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(answers["origin" if self.headers.get("Origin") else "plain"])
            self.end_headers()

        def log_message(self, *args):
            pass

    httpd = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}/api/contents"
    try:
        with pytest.raises(RuntimeError, match="other web pages"):
            servers.verify_locked(url)
        answers["origin"] = 404
        servers.verify_locked(url)  # both refused: fine
        answers["plain"] = 200
        with pytest.raises(RuntimeError, match="without its token"):
            servers.verify_locked(url)
    finally:
        httpd.shutdown()


@pytest.mark.slow
def test_lesson_folder_cannot_shadow_the_servers_modules(tmp_path):
    lessons = _lessons(tmp_path / "lessons")
    for name in ("random", "jupyterlab", "voila", "json"):
        (lessons / f"{name}.py").write_text("raise SystemExit('a lesson-folder module was imported')\n")
    server = servers.start_lab_server(lessons, env=_env(tmp_path / "home"))
    with servers.running(server):
        assert server.proc.poll() is None
        assert "lesson-folder module" not in server.log_tail(200)


def _run_in_kernel(server: servers.Server, notebook: str, code: str, timeout: float = 120) -> str:
    """Start a kernel for ``notebook`` through the server's REST API (so its working folder is the
    notebook's, as for a reader), run ``code`` over the kernel's websocket, and return its stdout."""
    import asyncio
    import uuid

    from tornado.websocket import websocket_connect

    base, token = server.url.split("/lab")[0], server.url.rsplit("token=", 1)[1]
    body = json.dumps({"path": notebook, "type": "notebook", "name": notebook, "kernel": {"name": "python3"}})
    req = urllib.request.Request(
        f"{base}/api/sessions?token={token}",
        data=body.encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        kernel_id = json.load(r)["kernel"]["id"]

    async def run() -> str:
        ws_url = base.replace("http://", "ws://") + f"/api/kernels/{kernel_id}/channels?token={token}"
        ws = await websocket_connect(ws_url)
        msg_id = uuid.uuid4().hex
        header = {
            "msg_id": msg_id,
            "msg_type": "execute_request",
            "username": "t",
            "session": uuid.uuid4().hex,
            "version": "5.3",
            "date": "",
        }
        content = {"code": code, "silent": False, "store_history": False, "allow_stdin": False, "stop_on_error": True}
        ws.write_message(
            json.dumps(
                {
                    "header": header,
                    "parent_header": {},
                    "metadata": {},
                    "content": content,
                    "channel": "shell",
                    "buffers": [],
                }
            )
        )
        out: list[str] = []
        while True:  # until the kernel says the request is done (an event, not a fixed wait)
            raw = await asyncio.wait_for(ws.read_message(), timeout)
            if raw is None:
                raise RuntimeError("the kernel's websocket closed")
            msg = json.loads(raw)
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind = msg["header"]["msg_type"]
            if kind == "stream":
                out.append(msg["content"]["text"])
            elif kind == "error":
                out.append("ERROR " + msg["content"]["ename"] + ": " + msg["content"]["evalue"])
            elif kind == "status" and msg["content"]["execution_state"] == "idle":
                ws.close()
                return "".join(out)

    return asyncio.run(run())


@pytest.mark.slow
def test_a_kernel_in_the_lesson_folder_imports_the_installed_klviz(tmp_path):
    """A ``klviz.py`` planted in the lesson folder must not run when a lesson there imports klviz."""
    lessons = _lessons(tmp_path / "lessons")
    planted = tmp_path / "planted-ran"
    (lessons / "klviz.py").write_text(f"open({str(planted)!r}, 'w').write('ran')\n")
    # the environment of a Chinese edition's server (klviz lab --lang zh, klviz present --lang zh)
    server = servers.start_lab_server(lessons, env=servers.edition_env("zh", _env(tmp_path / "home")))
    with servers.running(server):
        out = _run_in_kernel(
            server,
            "00_start.ipynb",
            "import os, sys, klviz; print(os.getcwd()); print(klviz.__file__); print(os.environ.get('KLVIZ_LANG'))",
        )
    cwd, module, lang = out.split()
    assert Path(cwd) == lessons.resolve()  # the kernel did start in the lesson folder ...
    assert Path(module).resolve() == (ROOT / "klviz" / "__init__.py").resolve()  # ... and imported the real klviz
    assert not planted.exists()
    assert lang == "zh"  # the kernel speaks the edition's language


def _answers(port: str) -> bool:
    """Whether a server answers on ``port`` now (a refusal without the token is an answer)."""
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status", timeout=10)
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False
    return True


def _gone(port: str, timeout: float = 30) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status", timeout=2)
        except urllib.error.HTTPError:
            pass  # still answering (403): not stopped yet
        except OSError:
            return True  # nobody listens: the server has gone
        time.sleep(0.5)
    return False


@pytest.mark.slow
@pytest.mark.parametrize("how", ["SIGHUP", "SIGTERM", "SIGKILL", "closed pipe"])
def test_the_lab_ends_with_the_command_that_started_it(tmp_path, how):
    env = _env(tmp_path / "home")
    proc = subprocess.Popen(
        [sys.executable, "-m", "klviz.labcmd", str(_lessons(tmp_path / "lessons")), "--in-place", "--no-browser"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    seen = b""
    deadline = time.time() + 90
    while b"klviz lab: open" not in seen:
        line = proc.stdout.readline()
        if not line and (proc.poll() is not None or time.time() > deadline):
            pytest.fail(f"klviz lab did not start: {seen.decode()[-2000:]}")
        seen += line
    port = re.search(rb"127\.0\.0\.1:(\d+)", seen).group(1).decode()
    if how == "closed pipe":  # `klviz lab | head -2`: the reader went away
        proc.stdout.close()
        assert proc.poll() is None and _answers(port)  # still serving, no crash
        how = "SIGINT"  # then Ctrl+C
    os.kill(proc.pid, getattr(signal, how))  # the command alone, not its process group
    proc.wait(timeout=40)
    assert _gone(port), f"JupyterLab outlived the klviz lab command ({how})"


@pytest.mark.slow
def test_in_place_lab_saves_notebooks_without_outputs(tmp_path):
    """`make lab` serves the repository's lessons in place: a lesson run and saved stays clean in git."""
    lessons = _lessons(tmp_path / "lessons")
    server = servers.start_lab_server(lessons, env=_env(tmp_path / "home"), strip_on_save=True)
    with servers.running(server):
        base, token = server.url.split("/lab")[0], server.url.rsplit("token=", 1)[1]
        ran = {
            "cells": [
                {
                    "cell_type": "code",
                    "execution_count": 3,
                    "id": "a1",
                    "metadata": {},
                    "outputs": [{"output_type": "stream", "name": "stdout", "text": "2\n"}],
                    "source": "1 + 1",
                }
            ],
            "metadata": {"widgets": {"state": {}}},
            "nbformat": 4,
            "nbformat_minor": 5,
        }
        body = json.dumps({"type": "notebook", "format": "json", "content": ran}).encode()
        req = urllib.request.Request(
            f"{base}/api/contents/00_start.ipynb?token={token}",
            data=body,
            method="PUT",
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=20) as r:
            assert r.status == 200
    saved = json.loads((lessons / "00_start.ipynb").read_text())
    assert saved["cells"][0]["outputs"] == [] and saved["cells"][0]["execution_count"] is None
    assert saved["cells"][0]["source"] in ("1 + 1", ["1 + 1"]) and "widgets" not in saved["metadata"]


def test_a_signal_ends_the_wait_and_stops_the_server():
    """The handler only notes the signal; the wait notices it and stops the server in the open
    (a handler that raised could leave a lock held, and the stop then hung)."""
    import threading

    from klviz import servers

    class Proc:
        def poll(self):
            return None  # still serving

    class FakeServer:
        proc = Proc()
        stopped = 0

        def stop(self):
            self.stopped += 1

    server = FakeServer()
    before = signal.getsignal(signal.SIGTERM)
    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM)).start()
    t0 = time.perf_counter()
    assert servers.run_until_interrupted(server, []) == 0  # type: ignore[arg-type]
    assert server.stopped == 1 and time.perf_counter() - t0 < 0.3 + 10 * servers.POLL_S
    assert signal.getsignal(signal.SIGTERM) is before  # the command's own handlers are back


def test_a_port_in_use_is_said_in_one_line(tmp_path):
    """Before any server starts (whose log would bury it): one line naming the port and the fix."""
    import socket

    from klviz.servers import port_is_free, start_lab_server

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert not port_is_free(port)
        with pytest.raises(RuntimeError) as err:
            start_lab_server(tmp_path, port=port)
    message = str(err.value)
    assert message.count("\n") == 0 and f"port {port} is in use" in message and "PORT=" in message
