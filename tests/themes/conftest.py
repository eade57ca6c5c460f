"""The lessons' figures in both themes run only when asked for (``make test-themes``, i.e. ``pytest -m
themes tests/themes``): each lesson runs twice more, minutes on a 2-core machine. CI runs them."""

from __future__ import annotations


def pytest_collection_modifyitems(config, items):
    if "themes" in (config.getoption("markexpr") or ""):
        return
    runs = [item for item in items if item.get_closest_marker("themes")]
    if runs:
        config.hook.pytest_deselected(items=runs)
        items[:] = [item for item in items if not item.get_closest_marker("themes")]
