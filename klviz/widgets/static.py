"""A panel on a page with no kernel: frames and readouts rendered along one or two of its controls.

In static mode (``KLVIZ_STATIC=1``, what the static site sets while it executes a lesson)
:meth:`klviz.widgets.base.Panel.display_snapshot` shows :func:`static_panel_html`: the panel set to
each position of the controls in :data:`STATIC_CONTROLS` (its main control first), each frame a PNG
with the readout beside it, and a small inline script whose slider swaps them. Every frame is the
panel's own composed frame, what a live reader would see at that setting. The site builder
(:mod:`klviz.site`) moves the frames into files of their own.
"""

from __future__ import annotations

import base64
import html
import itertools
import json
import re
from typing import Any

from ..messages import N_, tr
from ..palette import PAGE_CSS

__all__ = [
    "STATIC_CONTROLS",
    "PRECOMPUTED_NOTE",
    "MAX_FRAMES",
    "control_positions",
    "static_frames",
    "static_panel_data",
    "render_static_panel",
    "static_panel_html",
    "STATIC_PANEL_MIME",
]

#: What every page says about its panels.
PRECOMPUTED_NOTE = N_(
    "The panels on this page are precomputed: their sliders step through positions rendered when the site "
    "was built, with no kernel behind them. For the live panels (every control, any value), run the lesson: "
    "<code>klviz lab</code> after <code>pip install .</code> in a checkout (or from a wheel), or "
    "<code>make lab</code> in a checkout."
)  # shown as tr(PRECOMPUTED_NOTE)


#: Panel class name -> the controls the static site sweeps, in order (main control first), each with
#: its positions: a count (that many evenly spaced values of a slider's range, on a log scale for a
#: log slider, or that many of a selection's options, all of them when it has no more) or a list of
#: values. The control's value in the lesson is always added, so the page opens on the lesson's view;
#: the other controls stay at the lesson's values. One frame per combination (at most
#: :data:`MAX_FRAMES`). A panel missing here sweeps ``Panel.static_controls`` when a subclass sets
#: it, else its first control at 12 positions.
STATIC_CONTROLS: dict[str, dict[str, int | list[Any]]] = {
    "StartHerePanel": {"push": 9, "num_samples": [10, 100, 1000, 10000, 100000]},
    "SamplingPanel": {"mode": 3, "mu_temperature": [0.3, 0.5, 1.0, 2.0, 3.0, 4.0]},
    "GaussianEstimatorsPanel": {"mu": [0.1, 0.25, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0], "sigma": [0.5, 1.0, 1.5]},
    "TokenEstimatorsPanel": {"push": 13, "push_token": [1, 9]},
    "ControlVariatePanel": {"mu": [0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0], "sigma": [1.0, 1.5]},
    "BregmanPanel": {"r": 11, "f": 5},
    "WorkedTokensPanel": {"step": 11, "color_by": 4},
    "SimplexFlowPanel": {"flow": 8, "steps": [5, 20, 60, 150, 400]},
    "BanditPanel": {"beta": 12, "flow": ["k1 in loss", "k3 in loss", "k1 in reward", "k3 in reward"]},
    "RolloutPanel": {"batch_sequences": 8, "clamp": 5},
    "RLHFLabPanel": {"placement": 7},
    "EngineMismatchPanel": {"top_p": 4, "trainer": 2},
}

#: at most this many frames per panel (the product of its positions)
MAX_FRAMES = 120


def _is_selection(w: Any) -> bool:
    return hasattr(w, "_options_values")


def _slider_label(w: Any, value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def control_positions(w: Any, spec: int | list[Any]) -> tuple[list[Any], list[str]]:
    """(values, labels) of a control's positions on the site (see :data:`STATIC_CONTROLS`)."""
    import numpy as np

    current = w.value
    if _is_selection(w):
        options, labels = list(w._options_values), list(w._options_labels)
        if isinstance(spec, int):
            idx = sorted(set(np.linspace(0, len(options) - 1, min(spec, len(options))).round().astype(int).tolist()))
        else:
            idx = [options.index(v) for v in spec if v in options]
        if current in options and options.index(current) not in idx:
            idx = sorted([*idx, options.index(current)])
        return [options[i] for i in idx], [labels[i] for i in idx]
    lo, hi = w.min, w.max
    log = type(w).__name__ == "FloatLogSlider"
    if isinstance(spec, int):
        if log:  # evenly spaced exponents, 3 significant digits, inside the range
            values = [min(max(float(f"{w.base**e:.3g}"), w.base**lo), w.base**hi) for e in np.linspace(lo, hi, spec)]
        else:
            step = w.step or 1
            values = [min(lo + round((v - lo) / step) * step, hi) for v in np.linspace(lo, hi, spec)]
            values = [int(v) if isinstance(current, int) else round(float(v), 10) for v in values]
    else:
        values = list(spec)
    if log:
        lo, hi = w.base**lo, w.base**hi
    values = [v for v in values if lo - 1e-9 <= v <= hi + 1e-9]
    if current not in values:
        values.append(current)
    values = sorted(set(values))
    return values, [_slider_label(w, v) for v in values]


def _png_uri(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode("ascii")


def _frame_png(panel: Any) -> bytes:
    """The frame the panel composed for its current setting (what a reader of the live panel sees),
    else a fresh rendering of its figure."""
    data = getattr(panel, "frame_png", b"")
    if panel.last_error is None and isinstance(data, bytes) and data.startswith(b"\x89PNG"):
        return data
    return panel.png()


def _panel_readout(panel: Any) -> str:
    return panel.readout.value + panel.error.value


def static_frames(panel: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
    """Render ``panel`` at every combination of the positions of its site controls.

    Returns (axes, frames, start): per swept control its name, description, values and labels; per
    combination (the last control varies fastest) the PNG as a data URI and the readout HTML; and
    the index of the frame of the lesson's own setting. The panel ends at the lesson's setting.
    """
    spec = (
        STATIC_CONTROLS.get(type(panel).__name__)
        or getattr(panel, "static_controls", None)
        or {next(iter(panel.controls)): 12}
    )
    unknown = set(spec) - set(panel.controls)
    if unknown:
        raise ValueError(f"STATIC_CONTROLS[{type(panel).__name__!r}]: no control(s) {sorted(unknown)}")
    original = panel.values()
    axes: list[dict[str, Any]] = []
    for name, positions in spec.items():
        w = panel.controls[name]
        values, labels = control_positions(w, positions)
        axes.append({"name": name, "description": w.description or name, "values": values, "labels": labels})
    count = 1
    for axis in axes:
        count *= len(axis["values"])
    if count > MAX_FRAMES:
        raise ValueError(f"{type(panel).__name__}: {count} frames, more than MAX_FRAMES = {MAX_FRAMES}")
    frames = []
    try:
        for combo in itertools.product(*(a["values"] for a in axes)):
            panel.set(**{a["name"]: v for a, v in zip(axes, combo)})
            frames.append({"src": _png_uri(_frame_png(panel)), "readout": _panel_readout(panel)})
    finally:
        panel.set(**original)
    start = 0
    for axis in axes:
        start = start * len(axis["values"]) + axis["values"].index(original[axis["name"]])
    return axes, frames, start


# The controls of one panel on a page: inline, no external script, works from disk. A slider steps
# through numbers, a select chooses among named options; either gives the index of its position.
_LIVE_JS = """(function (root) {
  var data = JSON.parse(root.querySelector('script.klviz-live-data').textContent);
  var controls = root.querySelectorAll('.klviz-live-control');
  var img = root.querySelector('img.klviz-live-figure'), out = root.querySelector('.klviz-live-readout');
  function show() {
    var k = 0;
    for (var a = 0; a < controls.length; a++) {
      var i = +controls[a].value;
      k = k * data.axes[a].labels.length + i;
      var label = root.querySelector('output[data-axis="' + a + '"]');
      if (label) label.textContent = data.axes[a].labels[i];
    }
    var f = data.frames[k];
    img.src = f.src; out.innerHTML = f.readout; root.setAttribute('data-frame', k);
    if (window.MathJax && MathJax.Hub) MathJax.Hub.Queue(['Typeset', MathJax.Hub, out]);
  }
  for (var a = 0; a < controls.length; a++) {
    controls[a].addEventListener('input', show);
    controls[a].addEventListener('change', show);
  }
})(document.currentScript.parentElement);"""

#: The MIME type of a panel's precomputed positions as data (title, controls, frames, readouts), shown
#: beside their HTML: the site builder writes the page's HTML from it, escaping and sanitising every
#: part, instead of trusting HTML found in a notebook's outputs.
STATIC_PANEL_MIME = "application/vnd.klviz.static-panel+json"

_FRAME_SRC = re.compile(r"^(data:image/png;base64,[A-Za-z0-9+/=]+|_static/frames/[0-9a-f]{20}\.png)$")


def _json_for_html(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def static_panel_data(panel: Any) -> dict[str, Any]:
    """The panel on a static page, as data: its title, the swept controls (name, description, labels,
    ``"slider"`` for numbers or ``"select"`` for named options, the lesson's position), the other
    controls at their values, and every frame (PNG data URI) with its readout (HTML)."""
    axes, frames, start = static_frames(panel)
    values = panel.values()
    swept = {a["name"] for a in axes}
    others = []
    for name, w in panel.controls.items():
        if name not in swept:
            label = getattr(w, "label", None)
            shown = label if isinstance(label, str) else values[name]
            others.append(f"{w.description or name} = {shown}")
    index: list[int] = []
    rest = start
    for axis in reversed(axes):
        index.insert(0, rest % len(axis["values"]))
        rest //= len(axis["values"])
    return {
        "title": tr(panel.title),
        "axes": [
            {
                "name": a["name"],
                "description": a["description"],
                "labels": a["labels"],
                "kind": "select"
                if _is_selection(panel.controls[a["name"]]) and not _is_numeric(a["values"])
                else "slider",
                "index": i,
            }
            for a, i in zip(axes, index)
        ],
        "others": others,
        "frames": frames,
        "start": start,
    }


def _is_numeric(values: list[Any]) -> bool:
    """Options that are numbers in order (a selection slider of sample sizes) read best on a slider."""
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values) and values == sorted(values)


def render_static_panel(data: dict[str, Any], *, clean: Any = None) -> str:
    """The HTML of a panel on a static page, from :func:`static_panel_data` (or the same data read back
    from a notebook's outputs): every text escaped, every readout passed through ``clean`` (a function
    from HTML to safe HTML; the site builder gives its sanitiser), every frame's ``src`` a PNG data URI
    or a frame file of the site, else left out. The script is this module's own."""
    clean = clean or (lambda text: text)
    axes, frames = list(data["axes"]), list(data["frames"])
    count = 1
    for axis in axes:
        count *= len(axis["labels"])
    if not axes or count != len(frames) or not 0 <= int(data["start"]) < len(frames):
        raise ValueError(f"data: {len(frames)} frames for controls of {[len(a['labels']) for a in axes]} positions")
    safe_frames = [
        {"src": f["src"] if _FRAME_SRC.match(str(f["src"])) else "", "readout": clean(str(f["readout"]))}
        for f in frames
    ]
    controls = []
    for k, axis in enumerate(axes):
        name, description = html.escape(str(axis["name"])), html.escape(str(axis["description"]))
        labels = [str(label) for label in axis["labels"]]
        i = int(axis["index"])
        if axis.get("kind") == "select":
            options = "".join(
                f'<option value="{j}"{" selected" if j == i else ""}>{html.escape(label)}</option>'
                for j, label in enumerate(labels)
            )
            controls.append(
                f'<label>{description} <select class="klviz-live-control klviz-live-select" data-control="{name}" '
                f'aria-label="{description}">{options}</select></label>'
            )
        else:
            controls.append(
                f'<label>{description} <input type="range" class="klviz-live-control klviz-live-slider" '
                f'data-control="{name}" min="0" max="{len(labels) - 1}" step="1" value="{i}" '
                f'aria-label="{description}"><output data-axis="{k}">{html.escape(labels[i])}</output></label>'
            )
    others = [html.escape(str(o)) for o in data.get("others", [])]
    note = (
        tr("{n} precomputed positions", n=len(frames))
        + (tr("; the other controls stay at {others}", others="; ".join(others)) if others else "")
        + tr(". For the live panel run the lesson with <code>klviz lab</code> (or <code>make lab</code>).")
    )
    script_data = {"axes": [{"name": str(a["name"]), "labels": [str(x) for x in a["labels"]]} for a in axes]}
    script_data["frames"] = safe_frames
    first = safe_frames[int(data["start"])]
    title = html.escape(str(data["title"]))
    return (
        f'<div class="klviz-live" data-frames="{len(frames)}" data-frame="{int(data["start"])}">'
        f'<b>{title}</b><br><span class="klviz-live-note">{note}</span>'
        f'<div class="klviz-live-controls">{"".join(controls)}</div>'
        f'<img class="klviz-live-figure" src="{html.escape(first["src"])}" alt="{title}">'
        f'<div class="klviz-live-readout">{first["readout"]}</div>'
        f'<script type="application/json" class="klviz-live-data">{_json_for_html(script_data)}</script>'
        f"<script>{_LIVE_JS}</script></div>"
    )


def static_panel_html(panel: Any) -> str:
    """The panel on a static page: a control per swept control over precomputed frames and readouts
    (:func:`static_frames`), the lesson's setting shown first, with a note on how to get it live."""
    return PAGE_CSS + render_static_panel(static_panel_data(panel))
