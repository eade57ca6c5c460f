"""Binder conventions, checked statically (conda channels are unreachable here, so the environment
cannot be built in CI): ``environment.yml`` + ``postBuild`` at the repository root, no ``binder/``
folder hiding them, every runtime dependency of pyproject.toml present on conda-forge names with the
same lower bounds, postBuild an executable bash script that installs klviz without dependencies,
and a README launch link that opens an existing notebook."""

from __future__ import annotations

import os
import re
import stat
import subprocess
from pathlib import Path

import pytest
import tomllib
import yaml  # noqa: E402  (PyYAML comes with JupyterLab)

ROOT = Path(__file__).resolve().parents[1]
# pip name -> conda-forge names that provide it (pytorch-cpu / pytorch-gpu are pytorch variants)
CONDA_NAMES = {"torch": ("pytorch", "pytorch-cpu", "pytorch-gpu")}


def _requirement(spec: str) -> tuple[str, str | None]:
    """``"numpy>=1.24"`` -> ("numpy", "1.24"); conda specs use the same operators."""
    match = re.match(r"\s*([A-Za-z0-9_.\-]+)\s*(?:\[[^\]]*\])?\s*(?:>=\s*([0-9][^,;\s]*))?", spec)
    assert match, f"cannot read requirement {spec!r}"
    return match.group(1).lower().replace("_", "-"), match.group(2)


@pytest.fixture(scope="module")
def env() -> dict:
    path = ROOT / "environment.yml"
    assert path.is_file(), "environment.yml is missing at the repository root"
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict), "environment.yml must be a mapping"
    return data


def _conda_packages(env: dict) -> dict[str, str | None]:
    """``{name: pinned version}`` ("numpy=2.4.6" -> "2.4.6"; None where unpinned)."""
    out = {}
    for dep in env.get("dependencies", []):
        if isinstance(dep, str):
            match = re.match(r"\s*([A-Za-z0-9_.\-]+)\s*(?:=+\s*([0-9][^\s]*))?", dep)
            assert match, f"cannot read {dep!r}"
            out[match.group(1).lower().replace("_", "-")] = match.group(2)
    return out


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


def test_binder_reads_the_root_files():
    for folder in ("binder", ".binder"):
        assert not (ROOT / folder).exists(), (
            f"a {folder}/ folder makes Binder ignore the root environment.yml/postBuild"
        )
    assert (ROOT / "environment.yml").is_file() and (ROOT / "postBuild").is_file()


def test_environment_uses_conda_forge_only(env):
    assert env.get("channels") == ["conda-forge"], f"channels should be just conda-forge, got {env.get('channels')}"
    names = _conda_packages(env)
    assert "python" in names and "pip" in names
    python = next(d for d in env["dependencies"] if isinstance(d, str) and d.startswith("python"))
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    minimum = re.search(r">=\s*(\d+)\.(\d+)", project["requires-python"])
    version = re.search(r"(\d+)\.(\d+)", python)
    assert version and minimum and tuple(map(int, version.groups())) >= tuple(map(int, minimum.groups())), python


def test_every_runtime_dependency_is_in_the_environment(env):
    names = _conda_packages(env)
    pip_section = [d for d in env["dependencies"] if isinstance(d, dict)]
    pip_names = {_requirement(s)[0] for section in pip_section for s in section.get("pip", [])}
    assert "klviz" not in pip_names, "klviz itself is installed by postBuild, not by environment.yml"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for spec in project["dependencies"]:
        name, bound = _requirement(spec)
        candidates = CONDA_NAMES.get(name, (name,))
        found = [c for c in candidates if c in names]
        assert found or name in pip_names, f"{name} (pyproject) is missing from environment.yml"
        if found and bound:
            pinned = names[found[0]]
            assert pinned and _version(pinned) >= _version(bound), (
                f"{found[0]}: environment.yml pins {pinned}, below pyproject.toml's >={bound}"
            )


def test_postbuild_is_an_executable_bash_script_installing_klviz_without_deps():
    path = ROOT / "postBuild"
    text = path.read_text()
    assert text.startswith("#!/bin/bash") or text.startswith("#!/usr/bin/env bash"), "postBuild needs a bash shebang"
    assert re.search(r"^set -e", text, re.M), "postBuild must stop on the first error (set -e)"
    assert os.stat(path).st_mode & stat.S_IXUSR, "postBuild must be executable (chmod +x postBuild)"
    tracked = subprocess.run(["git", "ls-files", "-s", "postBuild"], cwd=ROOT, capture_output=True, text=True)
    if tracked.returncode == 0 and tracked.stdout.strip():
        assert tracked.stdout.startswith("100755"), "git must record postBuild as executable (git add --chmod=+x)"
    installs = [
        line for line in text.splitlines() if re.search(r"\bpip install\b", line) and not line.lstrip().startswith("#")
    ]
    assert installs, "postBuild does not pip install klviz"
    for line in installs:
        assert "--no-deps" in line, f"pip must not pull dependencies over conda's (use --no-deps): {line}"
        assert re.search(r"\s\.(\s|$)", line), f"postBuild should install the checkout ('.'): {line}"
    assert "torch" not in " ".join(installs)
    syntax = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert syntax.returncode == 0, syntax.stderr


def test_readme_shows_how_to_launch_binder():
    readme = ROOT / "README.md"
    links = re.findall(r"https://mybinder\.org/v2/gh/[^\s)\]]+", readme.read_text())
    assert links, "README.md has no mybinder.org launch link"
    for link in links:
        target = re.search(r"urlpath=(?:lab/tree|voila/render)/([^&\s)]+\.ipynb)", link)
        if target:
            assert (ROOT / target.group(1)).is_file(), f"Binder link opens {target.group(1)}, which does not exist"


def _postbuild_server_config() -> str:
    """The ``jupyter_server_config.py`` that postBuild writes on Binder."""
    text = (ROOT / "postBuild").read_text()
    match = re.search(r"<<'PY'\n(.*?)\nPY\n", text, re.S)
    assert match, "postBuild writes no jupyter_server_config.py for Voila"
    return match.group(1) + "\n"


class _Request:
    def __init__(self, **args: str) -> None:
        self.args = args

    def get_argument(self, name: str, default: str) -> str:
        return self.args.get(name, default)


def test_binder_voila_presents_a_lesson_as_klviz_present_does(tmp_path):
    """The hook postBuild installs: exercises as code to complete, no solutions or checks, and a first
    hidden cell that puts the kernel in presenter mode with the page's theme."""
    import nbformat
    from traitlets.config import Config

    from klviz import present

    config = Config()
    namespace = {"c": config}
    exec(compile(_postbuild_server_config().replace("configure_voila(c)", "configure_voila(c, DATA)"), "cfg", "exec"),
         {**namespace, "DATA": str(tmp_path)})  # fmt: skip
    voila = config.VoilaConfiguration
    assert voila.prelaunch_hook is present.voila_prelaunch_hook and voila.template == present.PRESENTER_TEMPLATE
    assert (tmp_path / "voila" / "templates" / present.PRESENTER_TEMPLATE / "index.html.j2").is_file()
    lesson = next((ROOT / "notebooks").glob("00_*.ipynb"))
    for theme in ("dark", "light"):
        shown = voila.prelaunch_hook(_Request(theme=theme), nbformat.read(lesson, as_version=4), str(lesson.parent))
        first = shown.cells[0]
        assert (
            first.cell_type == "code"
            and f"KLVIZ_THEME='{theme}'" in first.source
            and "KLVIZ_PRESENTER='1'" in first.source
        )
        assert not any(c.metadata.get("jupyter", {}).get("source_hidden") for c in shown.cells)  # solutions, checks
        assert any("**Your turn:**" in c.source for c in shown.cells if c.cell_type == "markdown")
    # ?lang=zh: the Chinese lesson (its prose from the catalogue beside it), its kernel told KLVIZ_LANG=zh
    from types import SimpleNamespace

    from klviz import i18n

    request = _Request(theme="dark", lang="zh")
    request.request = SimpleNamespace(path=f"/voila/render/notebooks/{lesson.name}")  # type: ignore[attr-defined]
    shown = voila.prelaunch_hook(request, nbformat.read(lesson, as_version=4), str(lesson.parent))
    assert "KLVIZ_LANG='zh'" in shown.cells[0].source and "KLVIZ_THEME='dark'" in shown.cells[0].source
    chinese = present.presenter_notebook(lesson, lang="zh")
    assert [c.source for c in shown.cells[1:]] == [c.source for c in chinese.cells]
    assert any("**轮到你了**" in c.source for c in shown.cells if c.cell_type == "markdown")
    assert i18n.catalogue_path(lesson.stem, "zh", lesson.parent).is_file()


@pytest.mark.slow
def test_binder_voila_url_serves_the_presenter_view(tmp_path):
    """A Jupyter server configured as postBuild configures Binder's (its own jupyter_server_config.py,
    read as Binder's server reads it), asked for the README's ``voila/render`` URL with ``?theme=dark``:
    the page is dark, shows the exercise to complete, and neither the line about the machine nor a
    check's "not attempted" nor a style sheet from a CDN."""
    import json
    import secrets
    import shutil
    import subprocess
    import sys
    import urllib.request

    from klviz.servers import free_port, wait_for_http

    config_dir, data_dir, root = tmp_path / "config", tmp_path / "data", tmp_path / "repo"
    config_dir.mkdir()
    (root / "notebooks").mkdir(parents=True)
    lesson = next((ROOT / "notebooks").glob("00_*.ipynb"))
    shutil.copy(lesson, root / "notebooks")
    port, token = free_port(), secrets.token_urlsafe(16)
    (config_dir / "jupyter_server_config.py").write_text(_postbuild_server_config())
    server_settings = {
        "ServerApp": {"root_dir": str(root), "ip": "127.0.0.1", "port": port, "open_browser": False},
        "IdentityProvider": {"token": token},
    }
    (config_dir / "jupyter_server_config.json").write_text(json.dumps(server_settings))
    env = dict(os.environ, HOME=str(tmp_path), JUPYTER_CONFIG_DIR=str(config_dir), JUPYTER_DATA_DIR=str(data_dir))
    for name in ("KLVIZ_STATIC", "KLVIZ_THEME", "KLVIZ_PRESENTER", "MPLBACKEND"):
        env.pop(name, None)
    root_flag = ["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []
    log = open(tmp_path / "server.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyter_server", *root_flag], cwd=tmp_path, env=env, stdout=log, stderr=log
    )
    try:
        wait_for_http(f"http://127.0.0.1:{port}/api/status?token={token}", proc, timeout=120)
        url = f"http://127.0.0.1:{port}/voila/render/notebooks/{lesson.name}?theme=dark&token={token}"
        with urllib.request.urlopen(url, timeout=240) as response:
            page = response.read().decode("utf-8")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
    assert 'data-jp-theme-light="false"' in page
    assert "Your turn:" in page
    assert "klviz on cpu" not in page and "not attempted" not in page
    assert "fontawesome" not in page  # the presenter's template
