"""Interactive panels, one class per panel (see :mod:`klviz.widgets.base` for the pattern)."""
from .base import Panel
from .start_here import StartHerePanel

__all__ = ["Panel", "StartHerePanel"]
