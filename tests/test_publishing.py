"""What a package index and a citation show: the README (the package's long description) has no image
or link that only works inside the repository, and CITATION.cff names the version and its date."""

from __future__ import annotations

import re
from pathlib import Path

import tomllib
import yaml

ROOT = Path(__file__).resolve().parents[1]


def test_readme_has_no_image_a_package_index_cannot_show():
    """An index shows the README without the repository around it: a relative image path breaks there,
    and there is no public address for an absolute one yet, so the README describes its figure."""
    text = (ROOT / "README.md").read_text()
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text) + re.findall(r"<img[^>]+src=\"([^\"]+)\"", text)
    assert not [src for src in images if not src.startswith("https://")], images


def test_citation_names_the_version_and_its_date():
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert str(cff["version"]) == project["version"]
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", str(cff["date-released"]))
    assert cff["authors"] and cff["title"] and cff["abstract"]
    # no address is invented: one appears here when the project has one (and in pyproject's [project.urls])
    assert ("url" in cff or "repository-code" in cff) == ("urls" in project)
