"""A lesson kernel keeps no memory it does not need, and nothing it shows changes for it.

- ``klviz.plotting.release_pixels_after_each_frame``: an interactive figure (ipympl) drops the Agg
  renderer and ipympl's copy of the last frame once a frame is sent. What the browser receives must not
  change: the first frame (while ipympl still builds the figure's static image from its last frame), a
  redraw, and a zoom, each compared with a plain Agg render of the same figure.
- ``klviz.setup_notebook`` registers ``klviz.memory.release_freed_memory`` to run after every cell, once
  however often a lesson's first cell runs.
"""

from __future__ import annotations

import base64
import io
import subprocess
import sys
import textwrap
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from PIL import Image

from klviz.plotting import release_pixels_after_each_frame

ipympl_backend = pytest.importorskip("ipympl.backend_nbagg")


def interactive_figure() -> tuple[Figure, Any, list[Any]]:
    """A figure on ipympl's canvas, as ``%matplotlib widget`` makes it, with the frames it sends collected."""
    fig = Figure(figsize=(6.0, 3.0), dpi=100)
    ax = fig.subplots()
    ax.plot(np.linspace(0, 1, 50), np.linspace(0, 1, 50) ** 2, label="x²")
    ax.legend()
    with plt.ioff():
        ipympl_backend.new_figure_manager_given_figure(1, fig)
    sent: list[Any] = []
    fig.canvas.send = lambda content, buffers=None: sent.append(buffers[0] if buffers else None)
    release_pixels_after_each_frame(fig)
    return fig, ax, sent


def agg_pixels(fig: Figure) -> np.ndarray:
    """The figure rendered by a plain Agg canvas of its own."""
    canvas = FigureCanvasAgg(Figure())  # a throwaway canvas: the figure is moved onto it and back
    interactive = fig.canvas
    canvas.figure = fig
    fig.set_canvas(canvas)
    try:
        canvas.draw()
        return np.asarray(canvas.buffer_rgba()).copy()
    finally:
        fig.set_canvas(interactive)


def png_pixels(png: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(bytes(png))).convert("RGBA"))


@pytest.mark.filterwarnings("ignore:Passing unrecognized arguments:DeprecationWarning")  # ipympl's toolbar
def test_an_interactive_figure_holds_no_pixels_after_a_frame():
    fig, ax, sent = interactive_figure()
    canvas = fig.canvas
    canvas.draw()  # the first frame: ipympl makes the static image from the last frame, then sends it
    assert canvas._data_url, "ipympl's static image was not made"
    assert png_pixels(base64.b64decode(canvas._data_url)).shape[:2] == (300, 600)
    assert "renderer" not in canvas.__dict__ and canvas._last_buff.size == 0

    canvas.syncing_data_url = False  # the browser has the figure (its "initialized" message)
    canvas.draw()
    first = sent[-1]
    assert isinstance(first, bytes) and np.array_equal(png_pixels(first), agg_pixels(fig))
    assert canvas._current_image_mode == "full"  # a whole picture, never a difference from a dropped frame
    assert "renderer" not in canvas.__dict__ and canvas._last_buff.size == 0

    canvas.draw()  # a redraw of the same figure sends the same picture
    assert png_pixels(sent[-1]).tobytes() == png_pixels(first).tobytes()

    ax.set_xlim(0.0, 0.5)  # a zoom
    canvas.draw()
    zoomed = png_pixels(sent[-1])
    assert not np.array_equal(zoomed, png_pixels(first))
    assert np.array_equal(zoomed, agg_pixels(fig))
    assert "renderer" not in canvas.__dict__ and canvas._last_buff.size == 0


def test_other_canvases_are_left_alone():
    fig = Figure()
    canvas = FigureCanvasAgg(fig)
    release_pixels_after_each_frame(fig)
    canvas.draw()
    assert canvas.renderer is not None and not hasattr(canvas, "send_binary")


def test_setup_registers_the_release_after_each_cell_once():
    """In an IPython shell of its own (the inline backend it selects stays out of this process)."""
    code = textwrap.dedent(
        """
        from IPython.testing.globalipapp import start_ipython
        import klviz, klviz.memory as memory
        ip = start_ipython()
        calls = []
        memory._malloc_trim = lambda: calls.append  # what glibc's malloc_trim would receive
        klviz.setup_notebook(interactive=False, quiet=True)
        klviz.setup_notebook(interactive=False, quiet=True)  # the first cell run again
        hooks = [f for f in ip.events.callbacks["post_run_cell"] if f is memory.release_freed_memory]
        assert len(hooks) == 1, hooks
        ip.run_cell("x = 1 + 1")
        ip.run_cell("y = x")
        assert calls == [0, 0], calls
        print("ok")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]
