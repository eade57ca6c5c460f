"""The hub test runs only when asked for (``make test-hub``, i.e. ``pytest -m hub tests/hub``): it needs
root (it creates two Unix users), the network (the package index, npm) and about five minutes."""

from __future__ import annotations


def pytest_collection_modifyitems(config, items):
    if "hub" in (config.getoption("markexpr") or ""):
        return
    hub = [item for item in items if item.get_closest_marker("hub")]
    if hub:
        config.hook.pytest_deselected(items=hub)
        items[:] = [item for item in items if not item.get_closest_marker("hub")]
