"""Run the Chinese edition's lessons (``build/zh``, built by ``make test``) with ``KLVIZ_LANG=zh``, as
``klviz lab --lang zh`` runs them: nbval starts a notebook's kernel when the file's first cell is set up,
and the kernel inherits this process's environment. Every other test sees the environment it started with."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

_ZH_BUILD = (Path(__file__).resolve().parent / "build" / "zh").resolve()
_STARTED_WITH = os.environ.get("KLVIZ_LANG")


def _in_zh_build(item: pytest.Item) -> bool:
    return _ZH_BUILD in Path(str(item.path)).resolve().parents


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if _in_zh_build(item):
        os.environ["KLVIZ_LANG"] = "zh"
    elif _STARTED_WITH is None:
        os.environ.pop("KLVIZ_LANG", None)
    else:
        os.environ["KLVIZ_LANG"] = _STARTED_WITH
