"""A real JupyterHub for a class of two, set up as the README tells an instructor to (``make test-hub``).

The parts are the real ones: klviz's wheel and ``jupyterhub`` installed from the package index into a
fresh environment (as an instructor installs them: no checkout, CPU torch first), ``configurable-http-
proxy`` from npm, ``docs/jupyterhub_config.py`` (the file the README shows), LocalProcessSpawner with two
Unix users created for the test and removed after it, and JupyterHub's dummy authenticator in place of
PAM. Headless Chromium logs in as each student, finds lesson 00 in the copy their server made in their
home, runs it, moves a panel's slider and watches the readout change, edits the lesson and saves it;
each student's edit stays in their own copy. Needs root (it creates the users) and the network to the
package index and npm; about five minutes, most of it installing.
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "browser"))
sys.path.insert(0, str(ROOT / "benchmarks"))
from labserver import CHROMIUM_FLAGS, find_chromium  # noqa: E402

pytestmark = pytest.mark.hub

#: what the README installs
JUPYTERHUB = "jupyterhub==6.1.1"
PROXY = "configurable-http-proxy@5.3.0"
TORCH = "torch==2.13.0"
STUDENTS = ("klviz-student1", "klviz-student2")
LESSON = "00_start_here.ipynb"
DEADLINE_S = 240  # generous: a first JupyterLab with a kernel on a busy 2-core machine


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert done.returncode == 0, f"{' '.join(cmd)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    return done


def _python_for_everyone() -> str:
    """A Python that every user can run (the students' servers run the environment made from it): this
    one if it can, else the system's. A Python in root's home (pyenv's) cannot."""
    candidates = [os.path.realpath(sys.executable), "/usr/bin/python3", shutil.which("python3") or ""]
    for python in dict.fromkeys(c for c in candidates if c):
        probe = ["runuser", "-u", "nobody", "--", python, "-c", "import venv, ensurepip"]
        if subprocess.run(probe, capture_output=True).returncode == 0:
            return python
    pytest.fail(
        f"no Python that other users can run among {candidates}: install one outside root's home "
        "(Debian: apt-get install python3-venv)",
        pytrace=False,
    )


@pytest.fixture(scope="module")
def place():
    """A folder every user can read (the students' servers run the environment inside it)."""
    if os.geteuid() != 0:
        pytest.fail("make test-hub creates two Unix users for the students: run it as root (CI does)", pytrace=False)
    folder = Path(tempfile.mkdtemp(prefix="klviz-hub-", dir="/tmp"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def hub_env(place):
    """The environment an instructor installs: CPU torch, then klviz's wheel and jupyterhub (no checkout).
    ``KLVIZ_HUB_ENV`` names one installed so before (readable by every user), to run the test again
    without installing."""
    from klviz.site import build_wheel

    if os.environ.get("KLVIZ_HUB_ENV"):
        return Path(os.environ["KLVIZ_HUB_ENV"])

    wheel = build_wheel(place / "wheel", ROOT, log=lambda *_: None)
    assert wheel is not None, "the wheel did not build"
    env = place / "env"
    _run([_python_for_everyone(), "-m", "venv", str(env)])
    pip = [str(env / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    local = subprocess.run([*pip, "--no-index", "--no-deps", TORCH], capture_output=True, text=True)
    if local.returncode != 0:  # no wheel on this machine: the CPU index, as the README says
        _run([*pip, TORCH, "--index-url", "https://download.pytorch.org/whl/cpu"])
    _run([*pip, "-c", str(ROOT / "constraints.txt"), str(wheel), JUPYTERHUB])
    return env


@pytest.fixture(scope="module")
def proxy(place):
    _run(["npm", "install", "--prefix", str(place / "node"), "--no-audit", "--no-fund", PROXY])
    command = place / "node" / "node_modules" / ".bin" / "configurable-http-proxy"
    assert command.exists()
    return command


@pytest.fixture(scope="module")
def students():
    """Two Unix users with homes of their own, removed (with their homes) afterwards."""
    for name in STUDENTS:
        subprocess.run(["userdel", "--remove", name], capture_output=True)  # a run that died before cleaning up
        _run(["useradd", "--create-home", "--shell", "/bin/sh", name])
    yield {name: pwd.getpwnam(name) for name in STUDENTS}
    for name in STUDENTS:
        subprocess.run(["pkill", "-u", name], capture_output=True)  # their servers and kernels
        subprocess.run(["userdel", "--remove", name], capture_output=True)


@pytest.fixture(scope="module")
def hub(place, hub_env, proxy, students):
    """JupyterHub from ``docs/jupyterhub_config.py``, with what a test changes: local ports, the dummy
    authenticator for these two users, and JupyterLab exposing its app to the page (for the test)."""
    from klviz.servers import free_port, wait_for_http

    work = place / "hub"
    work.mkdir()
    port, api_port, hub_port = free_port(), free_port(), free_port()
    password = secrets.token_urlsafe(12)
    config = (ROOT / "docs" / "jupyterhub_config.py").read_text()
    config += f"""
# -- the test's own settings --------------------------------------------------------------------
c.JupyterHub.bind_url = "http://127.0.0.1:{port}"
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = {hub_port}
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{api_port}"
c.ConfigurableHTTPProxy.command = [{str(proxy)!r}]
c.JupyterHub.authenticator_class = "dummy"
c.DummyAuthenticator.password = {password!r}
c.Authenticator.allowed_users = {set(STUDENTS)!r}
c.JupyterHub.db_url = "sqlite:///{work}/jupyterhub.sqlite"
c.JupyterHub.cookie_secret_file = "{work}/cookie_secret"
c.Spawner.args = ["--LabApp.expose_app_in_browser=True"]
c.Spawner.start_timeout = {DEADLINE_S}
c.Spawner.http_timeout = {DEADLINE_S}
"""
    (work / "jupyterhub_config.py").write_text(config)
    log = open(work / "hub.log", "wb")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KLVIZ_", "JUPYTER", "MPLBACKEND"))}
    proc = subprocess.Popen(
        [str(hub_env / "bin" / "jupyterhub"), "-f", str(work / "jupyterhub_config.py")],
        cwd=work,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        wait_for_http(f"http://127.0.0.1:{port}/hub/login", proc, timeout=DEADLINE_S)
        yield {"base": f"http://127.0.0.1:{port}", "password": password, "log": work / "hub.log"}
    finally:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
        log.close()


def _wait_for_file_change(path: Path, before: int | None) -> None:
    deadline = time.monotonic() + 60
    while not path.exists() or path.stat().st_mtime_ns == before:
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} was not saved")
        time.sleep(0.05)


def _student_session(browser, hub: dict, name: str, marker: str, artifacts: Path) -> None:
    """Log in, open lesson 00 from the student's copy, run it, move a slider, edit and save."""
    from helpers import ALL_RUN, ERRORS, KERNEL_IDLE, move_slider, settled_text
    from playwright.sync_api import expect

    context = browser.new_context(viewport={"width": 1280, "height": 1000})
    page = context.new_page()
    try:
        page.goto(f"{hub['base']}/hub/login")
        page.fill("input[name=username]", name)
        page.fill("input[name=password]", hub["password"])
        page.click("input[type=submit], button[type=submit]")
        # the spawn page hands over to the student's JupyterLab at lesson 00 (the default URL)
        page.wait_for_url(f"**/user/{name}/lab/**", timeout=DEADLINE_S * 1000)
        page.wait_for_function(KERNEL_IDLE, timeout=DEADLINE_S * 1000)
        path = page.evaluate("window.jupyterapp.shell.currentWidget.context.path")
        assert path == f"klviz-lessons/{LESSON}", f"{name}'s server opened {path!r}, not the distributed lesson"
        page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")
        page.wait_for_function(ALL_RUN, timeout=DEADLINE_S * 1000, polling=500)
        assert not page.evaluate(ERRORS), page.evaluate(ERRORS)
        panel = page.locator(".klviz-panel").first
        expect(panel).to_be_visible(timeout=60_000)
        readout = panel.locator(".klviz-readout")
        before = settled_text(page, readout)
        move_slider(page, panel, "push", times=3)
        expect(readout).not_to_have_text(before, timeout=60_000)
        # the student writes in their copy of the lesson, and saves it
        page.evaluate(
            """(marker) => {
                 const cell = window.jupyterapp.shell.currentWidget.content.model.cells.get(0);
                 cell.sharedModel.setSource(cell.sharedModel.getSource() + '\\n\\n' + marker);
               }""",
            marker,
        )
        home = Path(pwd.getpwnam(name).pw_dir)
        saved = home / "klviz-lessons" / LESSON
        before_save = saved.stat().st_mtime_ns
        page.evaluate("window.jupyterapp.commands.execute('docmanager:save')")
        _wait_for_file_change(saved, before_save)
        page.wait_for_function("() => !window.jupyterapp.shell.currentWidget.context.model.dirty", timeout=60_000)
        page.screenshot(path=str(artifacts / f"hub_{name}.png"))
    finally:
        context.close()


def test_two_students_on_a_real_hub(hub, students, tmp_path):
    from playwright.sync_api import sync_playwright

    artifacts = ROOT / "build" / "browser"
    artifacts.mkdir(parents=True, exist_ok=True)
    chromium = find_chromium()
    assert chromium, "Chromium is missing: `make test-hub` finds or installs one (scripts/ensure_browser.py)"
    markers = {name: f"Notes of {name}: {secrets.token_hex(4)}" for name in STUDENTS}
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_FLAGS)
            try:
                for name in STUDENTS:
                    _student_session(browser, hub, name, markers[name], artifacts)
            finally:
                browser.close()
    except BaseException:
        print(hub["log"].read_text(errors="replace")[-6000:])
        raise
    for name, user in students.items():
        copy = Path(user.pw_dir) / "klviz-lessons" / LESSON
        text = copy.read_text()
        others = [m for n, m in markers.items() if n != name]
        assert markers[name] in text and not any(m in text for m in others), f"{name}'s copy: {copy}"
        assert copy.stat().st_uid == user.pw_uid, f"{copy} is not {name}'s"
        assert not copy.stat().st_mode & 0o002, f"{copy} is writable by other users"
        assert json.loads(text)["cells"], f"{copy} is not a notebook"
