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


def _conda_packages() -> set[str]:
    names, in_deps = set(), False
    for line in (ROOT / "environment.yml").read_text().splitlines():
        if re.match(r"^\w", line):
            in_deps = line.startswith("dependencies:")
            continue
        m = re.match(r"\s*-\s+([A-Za-z0-9_.\-]+)", line)
        if in_deps and m:
            names.add(_name(m.group(1)))
    return names


def test_environment_yml_names_the_same_packages_as_pyproject():
    proj = _pyproject()["project"]
    wanted = {_name(r) for r in proj["dependencies"]}
    for name, extra in proj["optional-dependencies"].items():
        if name != "dev":                 # linters and hooks are for contributors, not for Binder
            wanted |= {_name(r) for r in extra}
    conda = _conda_packages() - {"python", "pip"}
    expected = {CONDA_NAME.get(n, n) for n in wanted}
    assert conda == expected, f"only in environment.yml: {conda - expected}; only in pyproject: {expected - conda}"


def test_environment_yml_is_binder_ready():
    text = (ROOT / "environment.yml").read_text()
    assert "conda-forge" in text
    assert "-e ." not in text and "pip:" not in text, "install the package in postBuild, not in environment.yml"


def test_constraints_pin_every_direct_dependency_but_torch():
    proj = _pyproject()["project"]
    pinned = {_name(line) for line in (ROOT / "constraints.txt").read_text().splitlines()
              if line.strip() and not line.startswith("#")}
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
