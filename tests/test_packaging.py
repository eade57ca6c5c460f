"""The environment files agree with each other; lessons have their shape (clean storage: test_notebook_hygiene.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# conda-forge names of PyPI packages where they differ
CONDA_NAME = {"torch": "pytorch-cpu"}


def _pyproject():
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _name(req: str) -> str:
    return re.split(r"[<>=!~\[ ;]", req, maxsplit=1)[0].strip().lower()


def _conda_pins(name: str = "environment.yml") -> dict[str, str]:
    """``{package: version}`` of a conda environment file's dependencies (version "" when unpinned)."""
    pins, in_deps = {}, False
    for line in (ROOT / name).read_text().splitlines():
        if re.match(r"^\w", line):
            in_deps = line.startswith("dependencies:")
            continue
        m = re.match(r"\s*-\s+([A-Za-z0-9_.\-]+)\s*(?:=+\s*([^\s#]+))?", line)
        if in_deps and m:
            pins[m.group(1).lower()] = m.group(2) or ""
    return pins


def _constraints() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            pins[_name(name)] = version.strip()
    return pins


def test_environment_files_name_the_same_packages_as_pyproject():
    proj = _pyproject()["project"]
    runtime = {_name(r) for r in proj["dependencies"]} | {_name(r) for r in proj["optional-dependencies"]["present"]}
    extras = set()
    for reqs in proj["optional-dependencies"].values():
        extras |= {_name(r) for r in reqs}
    lean = set(_conda_pins()) - {"python", "pip", "ipykernel"}
    dev = set(_conda_pins("environment-dev.yml"))
    assert lean == {CONDA_NAME.get(n, n) for n in runtime}, "environment.yml: the runtime and presenter mode only"
    expected_dev = {CONDA_NAME.get(n, n) for n in extras - runtime}
    assert dev == expected_dev, f"only in environment-dev.yml: {dev - expected_dev}; missing: {expected_dev - dev}"


def test_environment_files_pin_what_constraints_pin():
    wanted = _constraints()
    for file in ("environment.yml", "environment-dev.yml"):
        for name, version in _conda_pins(file).items():
            pypi = {v: k for k, v in CONDA_NAME.items()}.get(name, name)
            if pypi in wanted:
                assert version == wanted[pypi], f"{file}: {name}={version}, constraints.txt pins {wanted[pypi]}"
    assert _conda_pins()["pytorch-cpu"] == "2.13.0"  # the Makefile's TORCH_VERSION


def test_environment_yml_is_binder_ready():
    text = (ROOT / "environment.yml").read_text()
    assert "conda-forge" in text
    assert "-e ." not in text and "pip:" not in text, "install the package in postBuild, not in environment.yml"


def test_constraints_pin_every_direct_dependency_but_torch():
    proj = _pyproject()["project"]
    pinned = {
        _name(line)
        for line in (ROOT / "constraints.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    direct = {_name(r) for r in proj["dependencies"] + proj["optional-dependencies"]["test"]} - {"torch"}
    assert direct <= pinned, f"not pinned: {direct - pinned}"


@pytest.mark.parametrize("nb", sorted((ROOT / "notebooks").glob("*.ipynb")), ids=lambda p: p.name)
def test_lessons_open_with_what_you_will_learn_and_run_time(nb):
    cells = json.loads(nb.read_text())["cells"]
    first = "".join(cells[0]["source"])
    assert first.startswith("# "), f"{nb.name}: first cell must be the title"
    assert "What you will learn" in first and "Runs in" in first and "Time" in first, nb.name
    code = [c for c in cells if c["cell_type"] == "code"]
    assert "klviz.setup_notebook()" in "".join(code[0]["source"]), f"{nb.name}: first code cell must set up klviz"
    text = "\n".join("".join(c["source"]) for c in cells)
    assert "## Takeaways" in text and "## Exercises" in text and "## References" in text, nb.name
    assert "TODO" not in text, f"{nb.name} contains a TODO"


def test_every_panel_class_is_listed_in_klviz_widgets():
    import importlib
    import inspect
    import pkgutil

    import klviz.widgets as w
    from klviz.widgets.base import Panel

    found = {}
    for mod in pkgutil.iter_modules(w.__path__):
        module = importlib.import_module(f"klviz.widgets.{mod.name}")
        for name, obj in inspect.getmembers(module, inspect.isclass):
            if issubclass(obj, Panel) and obj is not Panel and obj.__module__ == module.__name__:
                found[name] = mod.name
    assert found == w.PANELS
    for name in w.PANELS:
        assert getattr(w, name) is getattr(importlib.import_module(f"klviz.widgets.{w.PANELS[name]}"), name)


def test_mypy_checks_every_module_of_the_package():
    """`make lint` type-checks all of klviz, strictly: every module lies under ``[tool.mypy] files`` and
    outside its ``exclude``, which leaves out only the lessons' percent scripts (``klviz/notebooks`` is a
    link to the lessons). A module added anywhere in klviz is checked from its first commit."""
    import os

    cfg = _pyproject()["tool"]["mypy"]
    files = [Path(f) for f in cfg["files"]]
    excludes = [re.compile(x) for x in ([cfg["exclude"]] if isinstance(cfg.get("exclude"), str) else cfg["exclude"])]
    modules = [
        (Path(folder) / name).relative_to(ROOT)
        for folder, _dirs, names in os.walk(ROOT / "klviz")  # links to folders are not followed
        for name in names
        if name.endswith(".py")
    ]
    assert len(modules) > 50
    unchecked = [
        m.as_posix()
        for m in modules
        if not any(f == m or f in m.parents for f in files) or any(x.search(m.as_posix()) for x in excludes)
    ]
    assert not unchecked, f"modules mypy does not check: {unchecked}"
    assert any(x.search("klviz/notebooks/scripts/00_start_here.py") for x in excludes)
    assert cfg["disallow_untyped_defs"] is True and cfg.get("ignore_errors") is not True
    overrides = cfg.get("overrides", [])
    loosened = [o["module"] for o in overrides if any(str(m).startswith("klviz") for m in _as_list(o["module"]))]
    assert not loosened, f"[[tool.mypy.overrides]] must not loosen klviz's own modules: {loosened}"


def _as_list(value: str | list[str]) -> list[str]:
    return [value] if isinstance(value, str) else value


def test_license_and_citation_agree_with_pyproject():
    proj = _pyproject()["project"]
    assert proj["license"] == "MIT" and (ROOT / "LICENSE").read_text().startswith("MIT License")
    cff = (ROOT / "CITATION.cff").read_text()
    assert f"version: {proj['version']}" in cff and "license: MIT" in cff


def test_a_wheel_build_refuses_lessons_with_outputs(tmp_path, monkeypatch):
    import sys

    sys.path.insert(0, str(ROOT))
    from scripts import build_checks

    assert _pyproject()["tool"]["setuptools"]["cmdclass"]["build_py"] == "scripts.build_checks.BuildPy"
    assert build_checks.unclean_lessons() == []  # the repository's lessons ship clean
    nb = {
        "cells": [
            {
                "cell_type": "code",
                "execution_count": 1,
                "id": "c1",
                "metadata": {},
                "outputs": [{"output_type": "stream", "name": "stdout", "text": "x"}],
                "source": "1",
            }
        ],
        "metadata": {},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    (tmp_path / "00_x.ipynb").write_text(json.dumps(nb))
    assert build_checks.unclean_lessons(tmp_path) == ["00_x.ipynb (stored outputs, execution counts)"]
    monkeypatch.setattr(build_checks, "unclean_lessons", lambda: ["00_x.ipynb (stored outputs)"])
    from setuptools.dist import Distribution

    cmd = build_checks.BuildPy(Distribution())
    cmd.editable_mode = False
    with pytest.raises(SystemExit, match="refusing to package lessons that carry outputs"):
        cmd.run()
