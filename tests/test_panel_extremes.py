"""Every panel at the ends of every control: no error shown in the panel, a readout, a frame.

The lessons' own tests drive their panels through meaningful settings; this one walks each control
of each registered panel to both ends (a slider's min and max, a selection's first and last option,
a toggle both ways), one at a time from the default, and a corner with every control at its max.
"""

from __future__ import annotations

import ipywidgets as widgets
import pytest

from klviz import widgets as W

#: Controls whose every change retrains the lab in the foreground (about a second each).
SLOW = {"RLHFLabPanel": {"steps", "epochs", "prompts", "group_size", "seed", "beta"}}


def _ends(control: widgets.ValueWidget) -> list[object]:
    if isinstance(
        control,
        (
            widgets.IntSlider,
            widgets.FloatSlider,
            widgets.FloatLogSlider,
            widgets.BoundedIntText,
            widgets.BoundedFloatText,
        ),
    ):
        if isinstance(control, widgets.FloatLogSlider):
            return [control.base**control.min, control.base**control.max]
        return [control.min, control.max]
    if isinstance(
        control,
        (widgets.SelectionSlider, widgets.Dropdown, widgets.ToggleButtons, widgets.RadioButtons, widgets.Select),
    ):
        values = [v for _label, v in control._options_full] if hasattr(control, "_options_full") else None
        if values is None:
            values = list(control.options)
            values = [v[1] if isinstance(v, tuple) else v for v in values]
        return [values[0], values[-1]]
    if isinstance(control, (widgets.Checkbox, widgets.ToggleButton)):
        return [False, True]
    if isinstance(control, widgets.IntText):
        return [0, 10_000]
    return []


@pytest.mark.parametrize("name", list(W.PANELS))
def test_every_control_at_both_ends(name):
    panel = getattr(W, name)()
    default = panel.values()
    tried = 0
    for control_name, control in panel.controls.items():
        if control_name in SLOW.get(name, ()):
            continue
        for value in _ends(control):
            panel.set(**{control_name: value})  # the others at their defaults
            assert panel.last_error is None, (name, control_name, value, panel.error.value)
            assert panel.readout.value.strip(), (name, control_name, value)
            tried += 1
        panel.set(**{control_name: default[control_name]})
    assert tried >= 2, name
    for control_name, control in panel.controls.items():  # the corner: every control at its upper end
        if control_name not in SLOW.get(name, ()) and _ends(control):
            panel.set(**{control_name: _ends(control)[-1]})  # one after another, the earlier ones kept
            assert panel.last_error is None, (name, "corner", control_name, panel.error.value)
    assert panel.png()[:8] == b"\x89PNG\r\n\x1a\n"
