"""Closing a panel stops what it does in the background: a training run ends at its next check and
draws nothing more, drawing ahead stops, and its widgets close. Closing only its box (what a notebook
does with a widget it closes) does the same. Every wait here is for the state checked (a thread that
has ended), with a generous deadline."""

from __future__ import annotations

import threading

import pytest

from klviz.widgets.base import BackgroundRun, Panel

DEADLINE_S = 60.0  # generous: a training step is tens of milliseconds, a busy machine may be slower


def _reader_moves(panel: Panel, name: str, value) -> BackgroundRun:
    """Move a control as the reader's slider does, and return the background run it started."""
    before = panel.background_run
    panel.controls[name].value = value
    run = panel.background_run
    assert run is not None and run is not before and run.thread is not None, "no background run started"
    return run


def _ended(run: BackgroundRun) -> bool:
    assert run.thread is not None
    run.thread.join(DEADLINE_S)
    return not run.thread.is_alive()


@pytest.fixture
def lab():
    from klviz.widgets.lesson07 import RLHFLabPanel

    panel = RLHFLabPanel(steps=40, prompts=2, group_size=6, max_new_tokens=20)
    yield panel
    panel.close()


def _training_started(run: BackgroundRun) -> threading.Event:
    """An event set once the run's work is past its start delay and training (its first progress)."""
    started = threading.Event()
    panel = run.panel
    original = panel.draw_progress

    def noted(progress):
        started.set()
        return original(progress)

    panel.draw_progress = noted  # type: ignore[method-assign]
    return started


def test_closing_the_lab_stops_its_training_thread(lab):
    run = _reader_moves(lab, "beta", 0.35)
    started = _training_started(run)
    assert started.wait(DEADLINE_S), "the run never started training"
    updates = lab.updates
    lab.close()
    assert _ended(run), "the training thread still runs after the panel was closed"
    assert not run.finished and not run.current  # cancelled, not completed
    assert lab.updates == updates  # nothing was drawn after closing
    assert lab.closed and lab.widget.comm is None and all(w.comm is None for w in lab.controls.values())


def test_closing_the_widget_closes_the_panel(lab):
    run = _reader_moves(lab, "beta", 0.4)
    lab.widget.close()  # what closing the output's widget does
    assert lab.closed
    assert _ended(run) and not run.finished
    lab.controls["beta"].value = 0.45  # a control of a closed panel starts nothing
    assert lab.background_run is run


def test_a_run_closed_before_it_starts_never_trains(lab, monkeypatch):
    import klviz.rlhf

    trained = threading.Event()
    original = klviz.rlhf.cached_run
    monkeypatch.setattr(klviz.rlhf, "cached_run", lambda *a, **k: (trained.set(), original(*a, **k))[1])
    run = _reader_moves(lab, "beta", 0.3)
    lab.close()  # within the start delay
    assert _ended(run) and not trained.is_set()


def test_closing_the_mismatch_training_panel_stops_its_thread():
    from dataclasses import replace

    import klviz.rlhf as rlhf
    from klviz.widgets.lesson08 import LIVE_SEEDS, MismatchTrainingPanel

    panel = MismatchTrainingPanel()
    live = next(name for name, seed in LIVE_SEEDS.items() if seed is not None)  # a seed trained live
    cfg = panel._live_config(panel.values()["engine"], panel.values()["correction"], live)
    for cache in (rlhf._RUNS, rlhf._RESUMABLE):  # trained earlier in this process: it would not train again
        for key in [k for k in cache if k[0] in (cfg, replace(cfg, steps=1))]:
            del cache[key]
    run = _reader_moves(panel, "live", live)
    panel.close()
    assert _ended(run) and not run.finished
    assert panel.closed and panel.widget.comm is None


def test_closing_is_idempotent_and_stops_drawing_ahead():
    from klviz.widgets import StartHerePanel

    panel = StartHerePanel()
    panel.close()
    panel.close()
    assert panel.closed and not panel._ahead.pending and panel._ahead.loop() is None
