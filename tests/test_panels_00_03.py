"""The panels of lessons 00-03 at the ends of their controls: no NaN anywhere a reader looks, and the
readouts say what the lessons now say (p = q up to rounding is p = q; every ± is labelled 2 SE)."""

from __future__ import annotations

import math
import re

import ipywidgets as widgets
import numpy as np
import pytest

from klviz import widgets as W

PANELS = (
    "StartHerePanel",
    "SamplingPanel",
    "GaussianEstimatorsPanel",
    "TokenEstimatorsPanel",
    "ControlVariatePanel",
    "BregmanPanel",
)
_NAN = re.compile(r"\bnan\b|\bNaN\b|\binf %|nan%", re.I)


def _ends(control: widgets.ValueWidget) -> list[object]:
    if isinstance(control, widgets.FloatLogSlider):
        return [control.base**control.min, control.base**control.max]
    if isinstance(control, (widgets.IntSlider, widgets.FloatSlider, widgets.BoundedIntText, widgets.BoundedFloatText)):
        return [control.min, control.max]
    if isinstance(control, (widgets.SelectionSlider, widgets.Dropdown, widgets.ToggleButtons)):
        values = [v for _label, v in control._options_full]
        return [values[0], values[-1]]
    return []


def _finite_numbers(data: object, where: str = "") -> None:
    """Every float a panel computed for its readout is finite or a deliberate inf (an infinite variance)."""
    if isinstance(data, dict):
        for k, v in data.items():
            _finite_numbers(v, f"{where}.{k}")
    elif isinstance(data, float):
        assert not math.isnan(data), f"NaN at {where}"
    elif isinstance(data, np.ndarray) and data.dtype.kind == "f":
        assert not np.isnan(data).any(), f"NaN in {where}"


@pytest.mark.parametrize("name", PANELS)
def test_no_nan_at_the_ends_of_any_control(name):
    panel = getattr(W, name)()
    for control_name, control in panel.controls.items():
        for value in _ends(control):
            data = panel.set(**{control_name: value})
            assert panel.last_error is None, (name, control_name, value, panel.error.value)
            text = re.sub(r"<[^>]+>", " ", panel.readout.value)
            assert not _NAN.search(text), (name, control_name, value, text)
            if name in ("StartHerePanel", "SamplingPanel", "BregmanPanel"):
                _finite_numbers({k: v for k, v in data.items() if k not in ("run",)}, name)
        panel.set(**{control_name: panel.controls[control_name].value})


def test_start_here_at_p_equal_q_says_so():
    panel = W.StartHerePanel(device="cpu")
    d = panel.set(push=0.0, temperature=1.0, mix=0.0)
    assert d["same"] and d["exact"] == 0 and d["frac_negative_k1"] == 0 and d["frac_negative_k1_exact"] == 0
    assert all(d["stats"][k]["mean"] == 0 for k in ("k1", "k2", "k3"))
    text = re.sub(r"<[^>]+>", " ", panel.readout.value)
    assert "p = q" in text and "-0.0000" not in text and "(2 SE)" in text
    moved = panel.set(push=1.0)
    assert not moved["same"] and round(100 * moved["frac_negative_k1_exact"], 1) == 16.2


def test_token_panel_at_p_equal_q_and_at_its_default():
    panel = W.TokenEstimatorsPanel()
    d = panel.set(push=0.0, temperature=1.0)
    assert d["exact"].true_kl == 0 and d["frac_neg_exact"] == 0 and d["frac_neg_mc"] == 0
    assert "p = q" in panel.readout.value
    d = panel.set(push=1.5, push_token=9)
    assert "k1</b> is the quieter" in panel.readout.value and "above 1" in panel.readout.value
    d = panel.set(push=0.5)
    assert "k3</b> is the quieter" in panel.readout.value and "below 1" in panel.readout.value


def test_sampling_panel_labels_its_plus_minus():
    panel = W.SamplingPanel()
    panel.set(mode="q")
    assert "(2 SE)" in panel.readout.value and "KL(π‖p)" in panel.readout.value
