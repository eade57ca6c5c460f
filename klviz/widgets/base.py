"""The panel pattern shared by every interactive figure in the suite.

A panel owns its controls, a figure built **once**, and a pure ``compute(**values) -> dict``.
On every control change it recomputes, updates the existing artists in ``draw`` (``set_data``,
``set_height``, ...) and redraws what changed (:class:`klviz.widgets.frames.FrameComposer`); it
never rebuilds the figure. Frames go to the page as PNG images (:meth:`Panel._make_canvas` says why
not ipympl). Errors raised while updating are shown inside the panel instead of vanishing into a log.
The status line shows the device and how long the last update took: compute, then the redraw,
marked "(blitted)" when only the changed artists were drawn. In a live kernel a panel draws ahead:
while the kernel idles it prepares the frames one step either side of the reader's position
(:mod:`klviz.widgets.ahead`) and sends them to the page beneath the frame shown
(:mod:`klviz.widgets.stack`); a step to one of them raises that frame, marked "drawn ahead".

Work that takes seconds (training a model) runs in a thread when the reader moves a control: a
panel overrides :meth:`Panel.start_background` and starts it with :meth:`Panel.run_in_background`;
the base cancels a run that a newer setting replaced, draws the progress the run reports
(:meth:`Panel.draw_progress`) and shows its result or its error as for an ordinary update.

Under the figure the reader sees the readout, any error, and the status line, shown together by
one HTML widget (:attr:`Panel.text`), so that an update sends one message for all three.

Tests drive a panel without a browser: ``panel.set(name=value, ...)`` then read ``panel.last``
(the numbers of the last update) or ``panel.readout.value`` (the HTML the reader sees).
"""

from __future__ import annotations

import atexit
import contextlib
import html
import io
import os
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import ipywidgets as widgets
import torch
import traitlets
from matplotlib.figure import Figure

from ..devices import describe_device, resolve_device
from ..memory import release_freed_memory
from ..messages import tr
from ..palette import PAGE_CSS, css
from .ahead import KEEP, DrawAhead, Prepared, neighbours
from .frames import FrameComposer, pixel_ratio, png_url
from .stack import FrameStack

__all__ = ["Panel", "PanelText", "BackgroundRun", "Cancelled", "html_table", "move_policy_controls", "static_mode"]


class PanelText(traitlets.HasTraits):
    """One part of the text under a panel's figure (its readout, error or status line), as HTML.

    Not a widget of its own: the panel shows its three parts in one HTML widget (:attr:`Panel.text`),
    so that an update that changes the readout and the status line sends the page one message, not
    two (see :meth:`Panel._text_after_frame`). Read and write it as a widget's: ``part.value``.
    """

    value = traitlets.Unicode("")


class Panel:
    """Base class: subclasses implement ``make_controls``, ``make_figure``, ``compute`` and ``draw``."""

    title: str = "panel"
    css_class: str = "klviz-panel"
    #: compose frames by blitting when only artists that changed before have changed again
    blit: bool = True
    #: the controls the static site sweeps, ``{name: positions}`` (see ``klviz.widgets.static.STATIC_CONTROLS``,
    #: the table that sets them per panel and wins over this); None: the site's table, else the first control
    static_controls: dict[str, Any] | None = None
    #: prepare the positions one step from the reader's while the kernel idles (see klviz.widgets.ahead);
    #: off for panels whose changes start background work
    draw_ahead: bool = True

    def __init__(self, device: str | torch.device | None = None) -> None:
        self.device = resolve_device(device)
        self._legends_by_key: dict[int, dict[Any, Any]] = {}  # see show_legend
        self.controls: dict[str, widgets.ValueWidget] = self.make_controls()
        self.fig: Figure = self.make_figure()
        # Redraws are requested by the panel only: with pyplot's interactive mode on (as in a
        # notebook), every artist change would otherwise ask the canvas for a full redraw too.
        self.fig.stale_callback = None
        self._layout_frozen = False
        self._frames = FrameComposer(self.fig)
        self.last: dict[str, Any] = {}
        self.last_error: BaseException | None = None
        self.last_compute_ms = float("nan")
        self.last_draw_ms = float("nan")
        self.updates = 0
        self._holding = False
        self._lock = threading.RLock()  # one update or progress frame at a time (see run_in_background)
        self._generation = 0  # bumped by every new setting: older background runs stop
        self._built = False  # progress is shown once the panel has been built
        #: the latest background run (see :meth:`run_in_background`); None before the first
        self.background_run: BackgroundRun | None = None
        #: the numbers the reader reads (HTML, written by ``draw``), the error of the last update,
        #: and the status line (device and times): shown together by :attr:`text`
        self.readout, self.error, self.status = PanelText(), PanelText(), PanelText()
        self.text = widgets.HTML().add_class("klviz-text")
        self._text_held = 0  # > 0 inside _text_after_frame: the text is sent when it ends
        for part in (self.readout, self.error, self.status):
            part.observe(self._text_changed, names="value")
        self._frame_png: bytes = b""  # the last frame handed to the page (see frame_png)
        self._ahead = DrawAhead(self)
        self._figure_current = True  # False while the artists show a position drawn ahead
        self._canvas = self._make_canvas()
        for name, w in self.controls.items():
            w.add_class(f"klviz-{name.replace('_', '-')}")
            w.observe(self._on_change, names="value")
        self.widget = (
            widgets.VBox(
                [
                    widgets.HTML(
                        f"{PAGE_CSS}<b>{html.escape(tr(self.title))}</b>"
                    ),  # PAGE_CSS: the colours of both themes
                    self.layout_controls(),
                    self._canvas,
                    self.text,
                ],
            )
            .add_class(self.css_class)
            .add_class("klviz-panel")
        )
        self.closed = False
        # closing the panel's box (panel.widget.close(), or a notebook that closes its widgets) closes the panel
        self.widget.observe(self._widget_closed, names="comm")
        self.update()
        self._prime_frames()
        self._built = True
        self._ahead.plan()

    # -- to implement -------------------------------------------------------------------------
    def make_controls(self) -> dict[str, widgets.ValueWidget]:
        """The named controls (their names are the keyword arguments of :meth:`compute`)."""
        raise NotImplementedError

    def make_figure(self) -> Figure:
        """Build the figure and its artists once (keep references to the artists on ``self``)."""
        raise NotImplementedError

    def compute(self, *args: Any, **values: Any) -> dict[str, Any]:
        """Pure function from control values to the data drawn and shown.

        Called with keyword arguments only; each panel declares its own (its controls' names):
        ``*args: Any`` beside ``**values: Any`` tells the type checker that any signature overrides this."""
        raise NotImplementedError

    def draw(self, data: dict[str, Any]) -> None:
        """Update the existing artists and the readout from ``data``."""
        raise NotImplementedError

    def layout_controls(self) -> widgets.Widget:
        """Arrange the controls (override for a custom layout)."""
        return widgets.HBox(list(self.controls.values()), layout=widgets.Layout(flex_flow="row wrap"))

    # -- to implement for work that takes seconds (optional) -----------------------------------
    def start_background(self, **values: Any) -> bool:
        """For a control the reader moved: start slow work for ``values`` and answer at once, or not.

        Return False (the default) for the ordinary foreground update. A panel whose setting takes
        seconds shows what it has now (:meth:`show_progress`), starts the work with
        :meth:`run_in_background` and returns True. Not called by :meth:`set` (code asks for a
        result and gets it in the foreground) nor in static mode; an exception raised here leaves
        the setting to the ordinary update, which shows the error.
        """
        return False

    def draw_progress(self, progress: Any) -> str:
        """Update the artists and the readout for work still running; return a note (HTML) for the
        status line. ``progress`` is what the work passed to :meth:`show_progress` or
        :meth:`BackgroundRun.report`."""
        raise NotImplementedError

    # -- machinery ----------------------------------------------------------------------------
    def show_legend(self, ax: Any, key: Any, **kwargs: Any) -> Any:
        """Give ``ax`` the legend made for ``key`` (made once with ``ax.legend(**kwargs)``, then reused).

        For a legend whose entries depend on a setting (a mode, a function): switching back to a
        setting shown before brings back the same legend object, so the frame cache finds the
        background it rendered for that setting instead of rendering the whole figure again.
        Set the artists' labels for ``key`` before the first call with that key.
        """
        cache: dict[Any, Any] = self._legends_by_key.setdefault(id(ax), {})
        legend = cache.get(key)
        if legend is None:
            legend = cache[key] = ax.legend(**kwargs)
        elif ax.get_legend() is not legend:
            ax.legend_ = legend
            ax.stale = True
        return legend

    def values(self) -> dict[str, Any]:
        """Current control values by name."""
        return {name: w.value for name, w in self.controls.items()}

    def set(self, **values: Any) -> dict[str, Any]:
        """Set several controls at once with a single update; returns :attr:`last`."""
        unknown = set(values) - set(self.controls)
        if unknown:
            raise ValueError(f"unknown control(s) {sorted(unknown)}; this panel has {sorted(self.controls)}")
        self._generation += 1  # code asks for a result: stop any background run
        self._holding = True
        try:
            for name, value in values.items():
                control = self.controls[name]
                try:
                    control.value = value
                except traitlets.TraitError as err:  # say which control, and what it takes
                    options = getattr(control, "options", None)
                    allowed = f"one of {list(options)}" if options is not None else _range_of(control)
                    raise ValueError(f"{name} must be {allowed}, got {value!r} ({err})") from None
        finally:
            self._holding = False
        self.update()
        return self.last

    def first_slider(self) -> str | None:
        """The name of the first control that steps (a slider, else any control with neighbours)."""
        stepping = [name for name, w in self.controls.items() if neighbours(w)]
        sliders = [name for name in stepping if "Slider" in type(self.controls[name]).__name__]
        return next(iter(sliders or stepping), None)

    def close(self) -> None:
        """Close the panel: its background run stops at its next check (the thread ends, nothing more is
        drawn), drawing ahead stops, and its widgets are closed (their views leave the page). Closing
        :attr:`widget` does the same. Idempotent."""
        if self.closed:
            return
        self.closed = True
        self._generation += 1  # a run still working is out of date: its next check() raises Cancelled
        self._ahead.stop()
        _close_widgets(self.widget)

    def _widget_closed(self, change: dict[str, Any]) -> None:
        if change["new"] is None:
            self.close()

    def _on_change(self, change: dict[str, Any]) -> None:
        if self._holding or self.closed:
            return
        self._ahead.note_change(change)
        self._generation += 1  # a run still working in the background is out of date
        started = False
        if not static_mode():
            try:
                started = self.start_background(**self.values())
            except Exception:  # noqa: BLE001 - an invalid setting: the ordinary update shows the error
                started = False
        if not started:
            self.update()

    def update(self) -> None:
        """Recompute and redraw; any exception is shown in the panel and kept in ``last_error``.

        A position drawn ahead (see :mod:`klviz.widgets.ahead`) is shown as it was prepared."""
        with self._lock, self._text_after_frame():
            values = self.values()
            prepared = self._ahead.take(values)
            if prepared is not None:
                self._show_prepared(prepared)
            else:
                t0 = time.perf_counter()
                try:
                    data = self.compute(**values)
                    self.draw(data)
                except Exception as err:  # noqa: BLE001 - shown to the reader, never swallowed silently
                    self._show_error(err, t0)
                    return
                self.last, self.last_error, self.error.value = data, None, ""
                self._figure_current = True
                self.last_compute_ms = (time.perf_counter() - t0) * 1e3
                self.updates += 1
                self._redraw()
                self._show_status()
                self._ahead.keep_current(
                    Prepared(
                        values,
                        data,
                        self._frame_png,
                        bytes(self._stack.shown.value),
                        self.readout.value,
                        self.last_compute_ms,
                        self.last_draw_ms,
                        self._frames.last_was_blit,
                        "kept",
                    )
                )
        self._ahead.plan()

    def _show_prepared(self, prepared: Prepared) -> None:
        """Show a position drawn ahead: its frame, readout and the times it took when it was drawn."""
        self.last, self.last_error, self.error.value = prepared.data, None, ""
        self._figure_current = False  # the artists show whatever was drawn last (see DrawAhead.restore)
        self.last_compute_ms, self.last_draw_ms = prepared.compute_ms, prepared.draw_ms
        self.updates += 1
        self._ahead.used += 1
        if self._stack.bring_up(prepared):  # already on the page, beneath the frame shown
            self._frame_png = prepared.png
        else:
            self._show_frame(prepared.png, prepared.url)
        self.readout.value = prepared.readout
        # the times it took when it was drawn; it is shown now without computing or drawing anything
        self._show_status(f" · {prepared.note}", blitted=prepared.blitted)
        self._ahead.keep_current(prepared)

    @contextlib.contextmanager
    def _text_after_frame(self) -> Iterator[None]:
        """Send the text under the figure once, when the block ends, so that the frame leaves first.

        Each widget's change is a message of its own, handled by the page in the order sent; a
        readout sent before the frame was parsed and laid out before the page began loading the
        frame. The readout, error and status line are one widget, sent once after the frame.
        Measured in JupyterLab with headless Chromium against the readout and status line as two
        widgets (alternated in one page; mean ± SE over 16 panel blocks of 24-40 presses): the
        readout showed 1.5 ± 0.5 ms sooner (in 12 of 16), the frame loaded 1.2 ± 0.8 ms sooner
        (in 11 of 16; within the noise).
        """
        self._text_held += 1
        try:
            yield
        finally:
            self._text_held -= 1
            if not self._text_held:
                self._show_text()

    def _text_changed(self, change: dict[str, Any]) -> None:
        if not self._text_held:  # outside an update (a background run's error, a test writing it)
            self._show_text()

    def _show_text(self) -> None:
        """Hand the readout, error and status line to the page (nothing is sent if none changed)."""
        self.text.value = (
            f"<div class='klviz-readout'>{self.readout.value}</div>"
            f"<div class='klviz-error'>{self.error.value}</div>"
            f"<div class='klviz-status'>{self.status.value}</div>"
        )

    def _show_error(self, err: BaseException, t0: float) -> None:
        """Show ``err`` (being handled) in the panel and keep it in ``last_error``."""
        self.last_error = err
        self.error.value = (
            f"<div style='color:{css('bad')}'><b>{tr('This setting could not be computed:')}</b> "
            f"{html.escape(type(err).__name__)}: {html.escape(str(err))}</div>"
            f"<details><summary>{tr('details')}</summary><pre>{html.escape(traceback.format_exc(limit=4))}</pre></details>"
        )
        self.last_compute_ms = (time.perf_counter() - t0) * 1e3
        self._show_status()

    # -- long-running work --------------------------------------------------------------------
    def show_progress(self, progress: Any, since: float | None = None) -> None:
        """Show work still running now: :meth:`draw_progress`, a new frame and the status line.

        For ``compute`` that reports as it goes (the curves of a run training in the foreground)
        and for the start of a background run. ``since`` (a ``time.perf_counter()`` value) is where
        the time shown as compute starts (default: now). Does nothing while the panel is being
        built and in static mode (nobody sees those frames).
        """
        if not self._built or static_mode() or self._ahead.drawing:
            return
        with self._lock, self._text_after_frame():
            self._show_progress(progress, time.perf_counter() if since is None else since)

    def _show_progress(self, progress: Any, t0: float) -> None:
        note = self.draw_progress(progress)
        self.error.value = ""
        self.last_compute_ms = (time.perf_counter() - t0) * 1e3
        self._redraw()
        self._show_status(note)

    def run_in_background(
        self, work: Callable[[BackgroundRun], Any], *, what: Any = None, on_done: Callable[[Any], None] | None = None
    ) -> BackgroundRun:
        """Run ``work(run)`` in a daemon thread for the current setting; returns the run.

        The work starts :data:`BACKGROUND_START_S` seconds later, and not at all if a newer setting
        has arrived by then (a reader walking a slider starts one run, where they stop).
        ``work`` reports as it goes with ``run.report(progress)`` (drawn by :meth:`draw_progress`,
        skipped when the panel is busy: the work never waits on the reader) and calls
        ``run.check()`` often: both raise :class:`Cancelled` once a newer setting has arrived
        (a control moved, :meth:`set`), which ends the run quietly. When ``work`` returns, and the
        setting is still current, ``on_done(result)`` runs (default: the ordinary :meth:`update`,
        whose ``compute`` should find the result the work has kept); an exception raised by
        ``work`` is shown in the panel as for an ordinary update. ``what`` labels the run
        (:attr:`BackgroundRun.what`); :meth:`wait` waits for it.
        """
        run = BackgroundRun(self, self._generation, what)
        self.background_run = run
        if self.closed:  # nothing starts on a closed panel
            run.finished = True
            return run
        run.thread = threading.Thread(
            target=self._work_in_background, args=(run, work, on_done), name=f"klviz-{type(self).__name__}", daemon=True
        )
        run.thread.start()
        _RUNNING.add(run)
        return run

    def _work_in_background(
        self, run: BackgroundRun, work: Callable[[BackgroundRun], Any], on_done: Callable[[Any], None] | None
    ) -> None:
        try:
            self._run_work(run, work, on_done)
        finally:
            release_freed_memory()

    def _run_work(
        self, run: BackgroundRun, work: Callable[[BackgroundRun], Any], on_done: Callable[[Any], None] | None
    ) -> None:
        time.sleep(BACKGROUND_START_S)  # see BACKGROUND_START_S
        if not run.current:
            return
        t0 = time.perf_counter()
        try:
            result = work(run)
        except Cancelled:
            return
        except Exception as err:  # noqa: BLE001 - shown to the reader, as for an ordinary update
            with self._lock:
                if run.current:
                    run.finished = True
                    self._show_error(err, t0)
            return
        with self._lock:
            if run.current:
                run.finished = True
                if on_done is None:
                    self.update()  # the result is there now (or its error is shown)
                else:
                    on_done(result)

    def wait(self, timeout: float | None = None) -> None:
        """Wait until the latest background run has ended (and the panel shows its result)."""
        run = self.background_run
        if run is not None and run.thread is not None:
            run.thread.join(timeout)

    def _make_canvas(self) -> widgets.Widget:
        """The widget that shows the frames: ``ipywidgets.Image`` views fed with data URLs, stacked
        (:class:`klviz.widgets.stack.FrameStack`: the frame shown on top, frames drawn ahead beneath).

        Not ipympl's canvas, measured in JupyterLab with headless Chromium: ipympl's front end
        re-encodes the previous frame as a PNG in the browser for every frame it receives
        (``toDataURL``), which made each slider step about 10 ms slower than an image, and its diff
        frames could leave a stale picture when the browser dropped one. The panels use none of
        ipympl's zoom or pan tools.

        An image's value is a ``data:image/...;base64,...`` URL (``format="url"``), not the bytes
        (``format="png"``): for bytes, the widget's view wraps them in a Blob URL that Chromium
        then loads through its network service, 8-10 ms from ``src`` to ``load`` for a 60 kB frame,
        where a data URL loads in about 1 ms (the base64 text is a third larger, and encoding it
        takes about 0.1 ms). :attr:`frame_png` is the PNG bytes of the frame shown. A panel that
        does not draw ahead (or in static mode) has one image.
        """
        ratio = pixel_ratio()
        width_px = int(round(self.fig.get_figwidth() * self.fig.dpi))
        height_px = int(round(self.fig.get_figheight() * self.fig.dpi))
        if ratio != 1.0:
            self.fig.set_dpi(self.fig.dpi * ratio)  # sharper on high-density screens, same size
        ahead = self.draw_ahead and DrawAhead.enabled() and not static_mode()
        self._stack = FrameStack(width_px, height_px, slots=KEEP if ahead else 1)
        return self._stack.widget

    @property
    def _image(self) -> widgets.Image:
        """The image the reader sees (the top of the stack)."""
        return self._stack.shown

    def _freeze_layout(self) -> None:
        """Lay the figure out once, then keep the layout: constrained layout on every redraw is slow."""
        if not self._layout_frozen:
            self.fig.draw_without_rendering()  # runs the layout engine
            self.fig.set_layout_engine("none")
            self._layout_frozen = True

    def _redraw(self) -> None:
        """Compose the new frame and hand it to the canvas widget; times the whole redraw."""
        self._freeze_layout()
        t0 = time.perf_counter()
        self._frames.render(blit=self._blitting())
        self._show_frame(self._frames.png())
        self.last_draw_ms = (time.perf_counter() - t0) * 1e3

    def _show_frame(self, png: bytes, url: bytes | None = None) -> None:
        """Send a frame: ``png``, or the same pixels as the ``data:`` URL ``url``."""
        self._frame_png = png
        self._stack.show(png_url(png) if url is None else url)

    @property
    def frame_png(self) -> bytes:
        """The PNG bytes of the frame the page shows now (empty before the first frame).

        The image widget holds the same frame as a data URL (see :meth:`_make_canvas`)."""
        return self._frame_png

    def _show_status(self, note: str = "", blitted: bool | None = None) -> None:
        """Device and timing of the last update, then ``note`` (HTML, e.g. the progress of a run)."""
        draw = "" if self.last_draw_ms != self.last_draw_ms else tr(" · redraw {ms:.0f} ms", ms=self.last_draw_ms)
        if self._frames.last_was_blit if blitted is None else blitted:
            draw += tr(" (blitted)")
        device = describe_device(self.device)
        line = tr("device {device} · compute {ms:.1f} ms", device=html.escape(device), ms=self.last_compute_ms)
        self.status.value = f"<span style='color:{css('muted')};font-size:85%'>{line}{draw}{note}</span>"

    def _prime_frames(self) -> None:
        """Keep a background of the first view before the reader touches anything.

        The first frame is a full render, and which artists an update changes is learned from the
        next one. Drawing the first data once more marks the artists that ``draw`` touches, so the
        default view's background is kept now (one more render while the cell runs) and the
        reader's first change, and every return to the default view, redraw only what moved.
        """
        if self.last_error is not None or not self._blitting():
            return
        try:
            self.draw(self.last)
            self._frames.render()
        except Exception:  # noqa: BLE001 - an optimisation only: the next update renders in full
            self._frames.state = None

    def _blitting(self) -> bool:
        """Whether frames redraw only what changed (``KLVIZ_NO_BLIT=1`` turns it off, for comparison)."""
        return self.blit and os.environ.get("KLVIZ_NO_BLIT", "") in ("", "0")

    def png(self) -> bytes:
        """The figure as PNG bytes (for saving a picture of the panel)."""
        buf = io.BytesIO()
        with self._lock:
            self._ahead.restore()
            self.fig.savefig(buf, format="png")
        return buf.getvalue()

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)
        if static_mode():
            self.display_snapshot()

    def display_snapshot(self) -> None:
        """Show the panel as plain outputs for the static site (``KLVIZ_STATIC=1``).

        An HTML page opened from disk has no kernel and no widget renderer, so the widget itself shows
        nothing there. The panel is rendered at several positions of its main controls
        (:func:`klviz.widgets.static.static_panel_html`): the page gets sliders that swap these precomputed
        frames and readouts. Should that fail, one snapshot of the current setting is shown instead.
        """
        from IPython.display import HTML, Image, display

        try:
            from .static import STATIC_PANEL_MIME, render_static_panel, static_panel_data

            data = static_panel_data(self)
            page = PAGE_CSS + render_static_panel(data)
        except Exception as err:  # noqa: BLE001 - the single snapshot below still shows the panel
            page = None
            failure = f"{type(err).__name__}: {err}"
        if page is not None:  # the HTML, and the same as data for the site builder (klviz.site)
            display({STATIC_PANEL_MIME: data, "text/html": page}, raw=True)
            return
        settings = []
        for name, w in self.controls.items():
            label = getattr(w, "label", None)
            shown = label if isinstance(label, str) else w.value
            settings.append(f"{html.escape(w.description or name)} = {html.escape(str(shown))}")
        display(
            HTML(
                f"{PAGE_CSS}<div class='klviz-snapshot'><b>{html.escape(tr(self.title))}</b><br>"
                f"<span style='color:{css('muted')};font-size:90%'>"
                + tr(
                    "Snapshot at {settings} (no precomputed positions: {failure}). "
                    "Run the lesson (<code>klviz lab</code> or <code>make lab</code>) to move the controls.",
                    settings="; ".join(settings),
                    failure=html.escape(failure),
                )
                + "</span>"
                f"<div>{self.readout.value}</div>{self.error.value}</div>"
            )
        )
        display(Image(data=self.png(), format="png"))


#: Background runs started and perhaps still working (see :func:`_stop_background_runs`).
_RUNNING: weakref.WeakSet[BackgroundRun] = weakref.WeakSet()

#: seconds a background run waits before it starts working. A reader walking a slider replaces each
#: run within this time, before it has cost anything: measured in JupyterLab on a 2-core machine,
#: runs that started at once trained while the next key press waited for the CPU and the
#: interpreter lock (RLHF lab: 44 ms median a press, against 27 ms with this wait)
BACKGROUND_START_S = 0.25


@atexit.register
def _stop_background_runs(timeout: float = 5.0) -> None:
    """At interpreter exit, stop every background run at its next check and wait for it.

    A daemon thread still inside a torch operation when the interpreter ends aborts the process
    ("terminate called without an active exception"); a kernel shut down while a panel trains would
    end that way.
    """
    threads = [(run, run.thread) for run in list(_RUNNING) if run.thread is not None and run.thread.is_alive()]
    for run, _ in threads:
        run.panel._generation += 1  # the run is out of date: its next check() raises Cancelled
    deadline = time.perf_counter() + timeout
    for _, thread in threads:
        thread.join(max(0.0, deadline - time.perf_counter()))


class Cancelled(Exception):
    """Raised inside background work (by :meth:`BackgroundRun.check`) when a newer setting replaced it."""


class BackgroundRun:
    """One run of :meth:`Panel.run_in_background`, as its work and the panel's user see it."""

    def __init__(self, panel: Panel, generation: int, what: Any = None) -> None:
        self.panel = panel
        #: the label given to :meth:`Panel.run_in_background` (the lab: the settings being trained)
        self.what = what
        #: True once the work has returned and the panel shows its result or its error
        self.finished = False
        self.thread: threading.Thread | None = None
        self._generation = generation

    @property
    def current(self) -> bool:
        """False once a newer setting has arrived: the run's result would be out of date."""
        return self._generation == self.panel._generation

    @property
    def active(self) -> bool:
        """Still working for the setting the panel shows."""
        return self.current and not self.finished

    def check(self) -> None:
        """Raise :class:`Cancelled` if a newer setting has replaced this run (call it often)."""
        if not self.current:
            raise Cancelled

    def report(self, progress: Any) -> None:
        """Show ``progress`` in the panel (:meth:`Panel.draw_progress`), unless the panel is busy
        with an update right now (then this report is skipped); raises :class:`Cancelled` like :meth:`check`."""
        self.check()
        panel = self.panel
        if panel._lock.acquire(blocking=False):  # never wait on the reader
            try:
                if self.current:
                    panel._show_progress(progress, time.perf_counter())
            finally:
                panel._lock.release()


def _close_widgets(widget: widgets.Widget) -> None:
    """Close ``widget`` and every widget inside it (children first)."""
    for child in getattr(widget, "children", ()):
        _close_widgets(child)
    widget.close()


def static_mode() -> bool:
    """True when the environment variable ``KLVIZ_STATIC`` asks for static output (the static site)."""
    return os.environ.get("KLVIZ_STATIC", "").strip().lower() in ("1", "true", "yes")


def move_policy_controls(*, push: float, push_range: float, token: int) -> dict[str, widgets.ValueWidget]:
    """The controls of :func:`klviz.policies.move_policy` over the toy vocabulary: ``temperature``,
    ``push`` (in [-push_range, push_range]) and ``push_token``, for the panels that move the target p."""
    from ..policies import TOY_VOCAB

    style = {"description_width": "initial"}
    names = [t.strip() for t in TOY_VOCAB]
    return {
        "temperature": widgets.FloatSlider(
            value=1.0,
            min=0.25,
            max=4.0,
            step=0.05,
            description=tr("p temperature"),
            style=style,
            continuous_update=True,
        ),
        "push": widgets.FloatSlider(
            value=push,
            min=-push_range,
            max=push_range,
            step=0.1,
            description=tr("push p toward"),
            style=style,
            continuous_update=True,
        ),
        "push_token": widgets.Dropdown(
            options=list(zip(names, range(len(names)))),
            value=token,
            description=tr("token"),
            layout=widgets.Layout(width="160px"),
        ),
    }


def _range_of(control: widgets.ValueWidget) -> str:
    """What a numeric control accepts, for an error message."""
    lo, hi = getattr(control, "min", None), getattr(control, "max", None)
    return f"a value in [{lo}, {hi}]" if lo is not None and hi is not None else "a value this control accepts"


def html_table(header: list[str], rows: list[list[str]], css_class: str = "klviz-table") -> str:
    """A compact HTML table for a panel readout (cells are inserted as given: escape text yourself)."""
    cell = "padding:2px 10px;text-align:right;white-space:nowrap"
    head = "".join(f"<th style='{cell};border-bottom:1px solid {css('rule')}'>{h}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td style='{cell}'>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table class='{css_class}' style='border-collapse:collapse;font-size:90%'><tr>{head}</tr>{body}</table>"
