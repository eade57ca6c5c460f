"""Interactive panels, one class per panel (see :mod:`klviz.widgets.base` for the pattern and
:mod:`klviz.widgets.frames` for how a figure becomes the frames the reader sees).

Each lesson's panels live in their own module and are imported on first use, so that
``klviz.widgets.StartHerePanel`` does not pay for the tiny language model of lesson 04.
"""

from __future__ import annotations

import importlib
from typing import Any

from .base import Panel, html_table, static_mode

#: panel class -> the module that defines it, in lesson order
PANELS: dict[str, str] = {
    "StartHerePanel": "start_here",
    "SamplingPanel": "lesson01",
    "GaussianEstimatorsPanel": "lesson02",
    "TokenEstimatorsPanel": "lesson02",
    "ControlVariatePanel": "lesson02",
    "BregmanPanel": "lesson03",
    "WorkedTokensPanel": "lesson04",
    "SimplexFlowPanel": "lesson05",
    "BanditPanel": "lesson05",
    "RolloutPanel": "lesson06",
    "RLHFLabPanel": "lesson07",
    "EngineMismatchPanel": "lesson08",
    "MismatchTrainingPanel": "lesson08",
}

__all__ = ["Panel", "html_table", "static_mode", "PANELS", *PANELS]


def __getattr__(name: str) -> Any:
    if name in PANELS:
        return getattr(importlib.import_module(f"{__name__}.{PANELS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
