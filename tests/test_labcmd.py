"""``klviz lab``: the lessons ship inside the package, are copied without destroying a learner's
edits, and JupyterLab starts on 127.0.0.1 behind a token."""

from __future__ import annotations

import io
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

from klviz import labcmd

ROOT = Path(__file__).resolve().parents[1]


def _notebook(source: str, outputs: list | None = None) -> str:
    """A one-cell notebook whose code is ``source`` (with ``outputs`` as if it had been run)."""
    cell = {
        "cell_type": "code",
        "execution_count": 1 if outputs else None,
        "metadata": {},
        "outputs": outputs or [],
        "source": [source],
    }
    return json.dumps({"cells": [cell], "metadata": {}, "nbformat": 4, "nbformat_minor": 5})


@pytest.fixture
def shipped(tmp_path) -> Path:
    """A fake shipped folder with two lessons (and a stray file that is not a lesson)."""
    src = tmp_path / "shipped"
    src.mkdir()
    (src / "00_start.ipynb").write_text(_notebook("x = 1"))
    (src / "01_next.ipynb").write_text(_notebook("y = 1"))
    (src / "scratch.ipynb").write_text("{}")
    return src


def test_shipped_notebooks_are_the_repository_lessons():
    shipped = labcmd.shipped_notebooks_dir()
    repo = sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))
    assert repo, "notebooks/ is empty"
    assert sorted(p.name for p in shipped.glob("*.ipynb")) == repo
    for name in repo:  # same bytes: klviz/notebooks is the repository's folder, not a stale copy
        assert (shipped / name).read_bytes() == (ROOT / "notebooks" / name).read_bytes()


def test_package_data_declares_the_notebooks():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    data = project["tool"]["setuptools"]["package-data"]["klviz"]
    assert "notebooks/*.ipynb" in data
    link = ROOT / "klviz" / "notebooks"
    assert link.is_dir() and link.resolve() == (ROOT / "notebooks").resolve(), (
        "klviz/notebooks must lead to notebooks/ (a symlink that setuptools dereferences into the wheel)"
    )


def test_fresh_copy_then_nothing_to_do(tmp_path, shipped):
    dest = tmp_path / "work"
    report = labcmd.sync_lessons(dest, source=shipped)
    assert report.copied == ["00_start.ipynb", "01_next.ipynb"]
    assert not (dest / "scratch.ipynb").exists()
    assert json.loads((dest / labcmd.MANIFEST).read_text()).keys() == {"00_start.ipynb", "01_next.ipynb"}
    again = labcmd.sync_lessons(dest, source=shipped)
    assert again.unchanged == ["00_start.ipynb", "01_next.ipynb"] and not again.copied
    assert "up to date" in again.lines()[0]


def test_edited_copy_is_kept_without_a_terminal(tmp_path, shipped):
    dest = tmp_path / "work"
    labcmd.sync_lessons(dest, source=shipped)
    (dest / "00_start.ipynb").write_text(_notebook("x = 'my answer'"))
    (shipped / "00_start.ipynb").write_text(_notebook("x = 2"))  # a newer klviz
    report = labcmd.sync_lessons(dest, source=shipped)
    assert report.kept == ["00_start.ipynb"]
    assert (dest / "00_start.ipynb").read_text() == _notebook("x = 'my answer'")
    assert any("kept your edited 00_start.ipynb" in line and "--force" in line for line in report.lines())


def test_unedited_copy_follows_a_new_version(tmp_path, shipped):
    dest = tmp_path / "work"
    labcmd.sync_lessons(dest, source=shipped)
    (shipped / "01_next.ipynb").write_text(_notebook("y = 2"))
    report = labcmd.sync_lessons(dest, source=shipped)
    assert report.updated == ["01_next.ipynb"]
    assert (dest / "01_next.ipynb").read_text() == _notebook("y = 2")


def test_a_lesson_that_was_only_run_is_not_edited(tmp_path, shipped):
    dest = tmp_path / "work"
    labcmd.sync_lessons(dest, source=shipped)
    ran = _notebook("y = 1", outputs=[{"output_type": "stream", "name": "stdout", "text": ["1\n"]}])
    (dest / "01_next.ipynb").write_text(ran)  # run and saved in JupyterLab
    again = labcmd.sync_lessons(dest, source=shipped)
    assert "01_next.ipynb" in again.unchanged and (dest / "01_next.ipynb").read_text() == ran  # outputs kept
    (shipped / "01_next.ipynb").write_text(_notebook("y = 2"))  # a newer klviz still reaches it
    assert labcmd.sync_lessons(dest, source=shipped).updated == ["01_next.ipynb"]
    assert labcmd.lesson_fingerprint(dest / "01_next.ipynb") == labcmd.lesson_fingerprint(shipped / "01_next.ipynb")
    assert labcmd.lesson_fingerprint(tmp_path / "missing.ipynb") is None


def test_ask_decides_and_force_backs_up(tmp_path, shipped):
    dest = tmp_path / "work"
    labcmd.sync_lessons(dest, source=shipped)
    (dest / "00_start.ipynb").write_text("edited 0")
    (dest / "01_next.ipynb").write_text("edited 1")
    asked = []
    report = labcmd.sync_lessons(dest, source=shipped, ask=lambda name: asked.append(name) or name.startswith("01"))
    assert asked == ["00_start.ipynb", "01_next.ipynb"]
    assert report.kept == ["00_start.ipynb"] and report.overwritten == ["01_next.ipynb"]
    assert (report.backup_dir / "01_next.ipynb").read_text() == "edited 1"
    forced = labcmd.sync_lessons(dest, source=shipped, force=True)
    assert forced.overwritten == ["00_start.ipynb"]
    assert (forced.backup_dir / "00_start.ipynb").read_text() == "edited 0"
    assert (dest / "00_start.ipynb").read_text() == (shipped / "00_start.ipynb").read_text()


def test_bad_destination_and_lesson_names(tmp_path, shipped):
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(ValueError, match="afile exists and is not a folder"):
        labcmd.sync_lessons(afile, source=shipped)
    assert labcmd.resolve_lesson("0", shipped).name == "00_start.ipynb"
    assert labcmd.resolve_lesson("01_next", shipped).name == "01_next.ipynb"
    with pytest.raises(ValueError, match="lesson '7' matches no lesson"):
        labcmd.resolve_lesson("7", shipped)
    with pytest.raises(ValueError, match="lesson"):
        labcmd.resolve_lesson(str(tmp_path / "missing.ipynb"), shipped)


# -- a folder someone else controls -------------------------------------------------------------
def test_a_folder_of_another_user_is_refused_before_anything_is_written(tmp_path, shipped, monkeypatch, capsys):
    """Another local user pre-created DIR (in a shared /tmp, say): klviz refuses it in one line."""
    dest = tmp_path / "klviz-lessons"
    dest.mkdir()
    monkeypatch.setattr(labcmd.os, "geteuid", lambda: os.stat(dest).st_uid + 1)  # DIR is now someone else's
    with pytest.raises(labcmd.UnsafeFolderError, match="belongs to another user"):
        labcmd.sync_lessons(dest, source=shipped)
    assert list(dest.iterdir()) == []
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    assert labcmd.main([str(dest), "--copy-only"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "belongs to another user" in err and str(dest) in err
    assert labcmd.main([str(dest), "--in-place"]) == 2
    assert "belongs to another user" in capsys.readouterr().err


@pytest.mark.parametrize("mode", [0o777, 0o757, 0o1777])
def test_a_folder_others_can_write_is_refused(tmp_path, shipped, mode):
    dest = tmp_path / "shared"
    dest.mkdir()
    dest.chmod(mode)
    with pytest.raises(labcmd.UnsafeFolderError, match=r"can be written by other users .*chmod go-w"):
        labcmd.sync_lessons(dest, source=shipped)
    assert list(dest.iterdir()) == []
    dest.chmod(0o755)
    assert labcmd.sync_lessons(dest, source=shipped).copied == ["00_start.ipynb", "01_next.ipynb"]


def test_a_group_writable_folder_is_refused_when_the_group_has_other_users(tmp_path, shipped, monkeypatch):
    dest = tmp_path / "group"
    dest.mkdir()
    dest.chmod(0o775)
    monkeypatch.setattr(labcmd, "_others_share_group", lambda gid: True)
    with pytest.raises(labcmd.UnsafeFolderError, match="can be written by other users"):
        labcmd.sync_lessons(dest, source=shipped)
    monkeypatch.setattr(labcmd, "_others_share_group", lambda gid: False)  # a private group: fine
    assert labcmd.sync_lessons(dest, source=shipped).copied


def test_a_link_made_by_another_user_as_dir_is_refused(tmp_path, shipped, monkeypatch):
    mine = tmp_path / "mine"
    mine.mkdir()
    link = tmp_path / "klviz-lessons"
    link.symlink_to(mine)
    real_lstat = os.lstat
    monkeypatch.setattr(
        labcmd.os,
        "lstat",
        lambda p, **kw: (
            os.stat_result((*real_lstat(p, **kw)[:4], 12345, *real_lstat(p, **kw)[5:]))
            if Path(p) == link
            else real_lstat(p, **kw)
        ),
    )
    with pytest.raises(labcmd.UnsafeFolderError, match="link made by another user"):
        labcmd.sync_lessons(link, source=shipped)
    assert list(mine.iterdir()) == []


def test_nothing_is_written_through_a_link(tmp_path, shipped):
    """A manifest linked to a victim's file, a dangling lesson link, a linked backups folder: each is
    refused before the first write, and the files they point at are untouched or never created."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "bashrc").write_text("export PS1=mine\n")
    dest = tmp_path / "work"
    dest.mkdir()
    (dest / labcmd.MANIFEST).symlink_to(victim / "bashrc")
    with pytest.raises(labcmd.UnsafeFolderError, match=r"\.klviz-lessons\.json is a symbolic link"):
        labcmd.sync_lessons(dest, source=shipped)
    assert (victim / "bashrc").read_text() == "export PS1=mine\n"
    assert sorted(p.name for p in dest.iterdir()) == [labcmd.MANIFEST]  # no lesson was copied first

    (dest / labcmd.MANIFEST).unlink()
    (dest / "00_start.ipynb").symlink_to(victim / "planted.ipynb")  # dangling
    with pytest.raises(labcmd.UnsafeFolderError, match="00_start.ipynb is a symbolic link"):
        labcmd.sync_lessons(dest, source=shipped)
    assert not (victim / "planted.ipynb").exists()

    (dest / "00_start.ipynb").unlink()
    labcmd.sync_lessons(dest, source=shipped)
    (dest / "00_start.ipynb").write_text("edited")
    (dest / labcmd.BACKUPS).symlink_to(victim)
    with pytest.raises(labcmd.UnsafeFolderError, match="backups is not a folder"):
        labcmd.sync_lessons(dest, source=shipped, force=True)
    assert sorted(p.name for p in victim.iterdir()) == ["bashrc"]
    assert (dest / "00_start.ipynb").read_text() == "edited"


def test_writes_replace_a_link_instead_of_following_it(tmp_path):
    """The low-level write: a new file under a fresh name (O_EXCL, O_NOFOLLOW), renamed over the
    target, so a link raced in after the checks is replaced, never followed."""
    victim = tmp_path / "victim.txt"
    victim.write_text("victim")
    work = tmp_path / "work"
    work.mkdir()
    (work / "x.ipynb").symlink_to(victim)
    folder = labcmd._Folder.open(work)
    try:
        folder.write_bytes("x.ipynb", b"lesson")
        with pytest.raises(OSError):
            folder.read_bytes("nothing-here")
    finally:
        folder.close()
    assert victim.read_text() == "victim"
    assert not (work / "x.ipynb").is_symlink() and (work / "x.ipynb").read_text() == "lesson"
    assert sorted(p.name for p in work.iterdir()) == ["x.ipynb"]  # no temporary file left
    with pytest.raises(OSError):  # the folder itself is opened without following a link
        labcmd._Folder.open(tmp_path / "link-to-work") if (tmp_path / "link-to-work").symlink_to(work) is None else None


def test_cli_without_terminal_keeps_edits_and_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))  # not a terminal: never ask
    dest = tmp_path / "lessons"
    args = [str(dest), "--copy-only"]
    assert labcmd.main(args) == 0
    copied = sorted(p.name for p in dest.glob("*.ipynb"))
    assert copied == sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))
    (dest / copied[0]).write_text("my edits")
    capsys.readouterr()
    assert labcmd.main(args) == 0
    assert f"kept your edited {copied[0]}" in capsys.readouterr().out
    assert (dest / copied[0]).read_text() == "my edits"
    assert labcmd.main(args + ["--force"]) == 0
    assert "backups" in capsys.readouterr().out
    assert (dest / copied[0]).read_bytes() == (ROOT / "notebooks" / copied[0]).read_bytes()
    assert list((dest / "backups").glob(f"*/{copied[0]}"))
    with pytest.raises(SystemExit):
        labcmd.main(["--port", "0"])


@pytest.mark.slow
def test_lab_starts_on_localhost_with_a_token(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    env = dict(os.environ, HOME=str(home), JUPYTER_CONFIG_DIR=str(home / ".jupyter"), PYTHONUNBUFFERED="1")
    log_path = tmp_path / "lab.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "klviz.labcmd", str(tmp_path / "lessons"), "--no-browser"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            deadline = time.time() + 90
            url = None
            while url is None:
                found = re.search(
                    r"klviz lab: open (http://127\.0\.0\.1:(\d+)/lab/tree/\S+\?token=(\S+))", log_path.read_text()
                )
                if found:
                    url, port, token = found.group(1), found.group(2), found.group(3)
                elif proc.poll() is not None or time.time() > deadline:
                    pytest.fail("klviz lab did not start:\n" + log_path.read_text()[-3000:])
                else:
                    time.sleep(0.25)
            assert token not in " ".join(proc.args)  # the token is not on any command line
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/contents?token={token}", timeout=10) as r:
                names = {item["name"] for item in json.load(r)["content"]}
            assert any(name.startswith("00_") for name in names)
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/api/contents", timeout=10)
            assert refused.value.code in (401, 403)
        finally:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    assert proc.returncode == 0


def test_the_lab_kernels_speak_the_edition(tmp_path, monkeypatch):
    """``klviz lab --lang zh``: the server's environment (which its kernels inherit) has KLVIZ_LANG=zh; the
    English lab has none, even one left in the shell (tests/test_servers.py runs a real kernel with it)."""
    seen = []

    def no_lab(folder, **kw):
        seen.append(kw["env"])
        raise RuntimeError("not started in this test")

    monkeypatch.setattr(labcmd, "start_lab_server", no_lab)
    monkeypatch.setenv("KLVIZ_LANG", "zh")
    assert labcmd.main(["--lang", "zh", "--no-browser", str(tmp_path / "zh")]) == 1
    assert labcmd.main(["--no-browser", str(tmp_path / "en")]) == 1
    assert seen[0]["KLVIZ_LANG"] == "zh" and "KLVIZ_LANG" not in seen[1]
