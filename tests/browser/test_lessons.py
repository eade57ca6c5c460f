"""Every lesson in a real browser: run the notebook in JupyterLab, move its panel, see it answer.

One test per lesson, driven by the table ``LESSONS``. For each panel of a lesson the test runs the
same frame: find the panel (by its CSS class), wait for it, let its readout settle, remember the text
of the element it *watches* and a screenshot of its figure, then play the panel's steps (press a
slider's keys, click a toggle button, and check what must follow), and finally check that the panel
shows no error, the page raised none, and keep a screenshot in ``build/browser/``.

A step is a function of the :class:`Run` (page, panel, what was remembered); the small factories
below (``slide``, ``click``, ``watched_differs``, ...) make the table read like the lesson.
"""

from __future__ import annotations

import re
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from playwright.sync_api import Locator, Page, expect

from .conftest import NOTEBOOKS
from .helpers import (
    changed_number,
    changed_screenshot,
    figure_of,
    move_slider,
    open_and_run,
    settled_screenshot,
    settled_text,
)

pytestmark = pytest.mark.browser
WAIT = 20_000  # ms for a kernel round trip to show


@dataclass
class Run:
    """One panel under test: the page, the panel and what it showed before the steps."""

    page: Page
    panel: Locator
    watched: Locator
    before_watched: str
    before_readout: str
    before_figure: bytes

    def readout(self) -> Locator:
        return self.panel.locator(".klviz-readout")


Step = Callable[[Run], None]


@dataclass
class PanelCase:
    css: str  # the panel's css_class
    watch: str  # selector (inside the panel) of the number or text that must react
    artifact: str  # screenshot file name in build/browser/
    steps: list[Step]
    ready: list[Step] = field(default_factory=list)  # before anything is remembered


@dataclass
class Lesson:
    notebook: str
    panels: list[PanelCase]
    run_timeout_ms: int = 180_000


# ---- steps ----


def slide(control: str, key: str = "ArrowRight", times: int = 1) -> Step:
    """Press ``key`` ``times`` on the slider of the control ``control`` (CSS class klviz-<control>)."""
    return lambda r: move_slider(r.page, r.panel, control, key, times=times)


def click(control: str, text: str) -> Step:
    """Click the toggle button labelled ``text`` of the control ``control``."""
    return lambda r: r.panel.locator(f".klviz-{control} button", has_text=text).first.click()


def choose(control: str, label: str) -> Step:
    """Choose the option labelled ``label`` in the dropdown of the control ``control``."""
    return lambda r: r.panel.locator(f".klviz-{control} select").select_option(label=label)


def watched_is(text: str, timeout: int = WAIT) -> Step:
    return lambda r: expect(r.watched).to_have_text(text, timeout=timeout)


def watched_matches(pattern: str, timeout: int = WAIT) -> Step:
    return lambda r: expect(r.watched).to_have_text(re.compile(pattern), timeout=timeout)


def watched_visible(timeout: int = WAIT) -> Step:
    return lambda r: expect(r.watched).to_be_visible(timeout=timeout)


def watched_differs(timeout: int = WAIT) -> Step:
    # the readout's HTML is replaced on every update: poll through locators, not element handles
    return lambda r: expect(r.watched).not_to_have_text(r.before_watched, timeout=timeout)


def watched_rises(r: Run) -> None:
    assert changed_number(r.page, r.watched, r.before_watched) > float(r.before_watched)


def watched_falls(r: Run) -> None:
    assert changed_number(r.page, r.watched, r.before_watched) < float(r.before_watched)


def watched_changes_number(r: Run) -> None:
    changed_number(r.page, r.watched, r.before_watched)


def readout_differs(timeout: int = WAIT) -> Step:
    return lambda r: expect(r.readout()).not_to_have_text(r.before_readout, timeout=timeout)


def readout_settles(r: Run) -> None:
    settled_text(r.page, r.readout())  # every queued key press has landed


def readout_says(text: str, timeout: int = WAIT) -> Step:
    return lambda r: expect(r.readout()).to_contain_text(text, timeout=timeout)


def readout_clean_and_has(word: str) -> Step:
    def step(r: Run) -> None:
        text = r.readout().inner_text()
        assert word in text and "nan" not in text.lower(), text

    return step


def visible(selector: str, timeout: int = WAIT) -> Step:
    return lambda r: expect(r.panel.locator(selector)).to_be_visible(timeout=timeout)


def figure_changes(r: Run) -> None:
    """The figure now looks different from before the steps (fails if no redraw reached the browser)."""
    after = changed_screenshot(r.page, figure_of(r.panel), r.before_figure)
    assert after != r.before_figure, "the figure did not redraw after the panel moved"


def no_error_shown(r: Run) -> None:
    expect(r.panel.locator(".klviz-error")).to_have_text("")


def status_says(*words: str) -> Step:
    def step(r: Run) -> None:
        status = r.panel.locator(".klviz-status").inner_text()
        assert all(w in status for w in words), status

    return step


def gap_equals_k3(r: Run) -> None:
    """Lesson 03: the Bregman gap for f = -log t is k3, as klviz.k3 computes it."""
    gap, k3 = r.panel.locator(".klviz-readout .klviz-gap"), r.panel.locator(".klviz-readout .klviz-k3")
    assert float(gap.inner_text()) == pytest.approx(float(k3.inner_text()), rel=1e-5)


def tokens_carry_tooltips(r: Run) -> None:
    """Lesson 04: every token carries its numbers in a tooltip; hover one."""
    token = r.panel.locator(".klviz-token").nth(3)
    title = token.get_attribute("title") or ""
    assert "k3" in title and "exact" in title, title
    token.hover()


# ---- the lessons ----

# fmt: off
LESSONS = [
    Lesson("00_start_here.ipynb", [
        PanelCase("klviz-start-here", ".klviz-exact", "00_start_here_panel.png",
                  ready=[watched_matches(r"^\d+\.\d{4}$", timeout=10_000)],
                  steps=[slide("push", times=5),            # push p harder toward "sofa": a larger KL
                         watched_rises, figure_changes, status_says("device cpu", "ms")]),
    ]),
    Lesson("01_sampling_as_weighting.ipynb", [
        PanelCase("klviz-sampling", ".klviz-exact", "lesson01_sampling_panel.png",
                  steps=[slide("q-push", times=5),          # push q's " sofa" further: exact KL and estimate change
                         watched_differs(), readout_differs(),
                         click("mode", "with importance weights"),   # tokens from mu: an effective sample size
                         visible(".klviz-readout .klviz-ess"), figure_changes]),
    ]),
    Lesson("02_three_estimators.ipynb", [
        PanelCase("klviz-lesson02-gaussian", ".klviz-exact", "lesson02_gaussian_panel.png",
                  ready=[watched_is("0.5")],                # default mu = 1: KL(q||p) = mu²/2
                  steps=[slide("mu", times=5),              # mu 1.0 -> 1.25: KL = 1.25²/2
                         watched_is("0.78125"), readout_differs(), readout_clean_and_has("k3"), figure_changes,
                         slide("sigma", times=10),          # p wider than sqrt(2): Var k3 is infinite, and says why
                         readout_says("diverges"), no_error_shown]),
    ]),
    Lesson("03_f_divergence_bregman.ipynb", [
        PanelCase("klviz-bregman", ".klviz-readout .klviz-gap", "lesson03_bregman_panel.png",
                  steps=[slide("r", times=20),              # drag r right: the gap (k3 for f = -log t) changes
                         watched_changes_number, readout_settles, gap_equals_k3,
                         click("f", "t log t"),             # f = t log t: the readout names the other direction
                         readout_says("KL(p‖q)"), figure_changes]),
    ]),
    Lesson("04_worked_tokens.ipynb", [
        PanelCase("klviz-lesson04", ".klviz-approx-kl", "lesson04_worked_tokens_panel.png",
                  steps=[slide("step", times=4),            # approx_kl grows past MiniMind's threshold: stopped
                         watched_rises, readout_says("stopped"), readout_differs(),
                         click("color-by", "exact"),        # colour the tokens by the exact KL
                         readout_says("exact KL(π_old‖π_θ) at this position"), tokens_carry_tooltips,
                         figure_changes]),
    ]),
    Lesson("05_gradients.ipynb", [
        PanelCase("klviz-bandit", ".klviz-beta-value", "lesson05_bandit_panel.png",
                  ready=[watched_visible()],                # cells after the panel may still move it: settle first
                  steps=[slide("beta", times=3), watched_differs(), readout_differs(), figure_changes]),
        PanelCase("klviz-simplex-flow", ".klviz-start", "lesson05_simplex_panel.png",
                  ready=[watched_visible()],
                  steps=[slide("start-mat", times=20),      # continuous_update=False: one update on release
                         watched_differs(), figure_changes]),
    ]),
    Lesson("06_pitfalls_and_your_rollouts.ipynb", [
        PanelCase("klviz-rollouts", ".klviz-spread-k1", "lesson06_rollout_panel.png",
                  ready=[watched_visible(), watched_matches(r"\d")],   # the first readout has landed
                  steps=[slide("batch-sequences", times=2),  # larger batches: the spread of k1 shrinks (1/sqrt B)
                         watched_falls,
                         click("estimator", "k1"),          # the left histogram shows k1's tokens
                         figure_changes, no_error_shown]),
    ]),
    Lesson("07_mini_rlhf_lab.ipynb", [
        PanelCase("klviz-rlhf-lab", ".klviz-final-kl", "lesson07_lab_panel.png",
                  ready=[watched_visible()],
                  # beta 0.2 -> 0: a new 40-step run without a penalty trains in the background; the panel
                  # answers at once, then shows the finished run, whose KL has grown
                  steps=[slide("beta", "Home"), readout_says("β = 0,", timeout=30_000),
                         visible(".klviz-readout .klviz-final-kl", timeout=90_000),
                         watched_differs(timeout=30_000), readout_differs(), figure_changes]),
    ], run_timeout_ms=300_000),
    Lesson("08_sampler_vs_trainer.ipynb", [
        PanelCase("klviz-lesson08", ".klviz-kept-mass", "lesson08_mismatch_panel.png",
                  steps=[slide("top-p", times=1),           # engine top_p 0.9 -> 0.8: less of the mass is kept
                         watched_falls, readout_differs(), figure_changes]),
        PanelCase("klviz-lesson08-training", ".klviz-final-trainer-reward", "lesson08_training_panel.png",
                  steps=[click("engine", "top-p 0.8"),      # the stored runs of another engine: new bands, new finals
                         watched_differs(), readout_differs(), figure_changes,
                         choose("live", "+ seed 17, trained here"),  # one more seed trains in the background
                         readout_says("live seed 17", timeout=60_000), no_error_shown]),
    ]),
]
# fmt: on


def _check_panel(page: Page, case: PanelCase, artifacts) -> None:
    panel = page.locator(f".{case.css}").first
    expect(panel).to_be_visible(timeout=30_000)
    panel.scroll_into_view_if_needed()
    figure = figure_of(panel)
    expect(figure).to_be_visible(timeout=30_000)
    watched = panel.locator(case.watch)
    partial = Run(page, panel, watched, "", "", b"")
    for step in case.ready:
        step(partial)
    before_readout = settled_text(page, panel.locator(".klviz-readout"))
    run = Run(page, panel, watched, settled_text(page, watched), before_readout, settled_screenshot(page, figure))
    try:
        for step in case.steps:
            step(run)
        no_error_shown(run)
    except AssertionError as err:
        # what the reader would have seen, to tell a kernel that never answered from a press that
        # never reached the slider
        panel.screenshot(path=str(artifacts / f"FAILED-{case.artifact}"))
        status = panel.locator(".klviz-status").inner_text() if panel.locator(".klviz-status").count() else ""
        focused = page.evaluate("document.activeElement ? document.activeElement.className : null")
        raise AssertionError(
            f"{err}\n(panel status: {status!r}; focused element: {focused!r}; screenshot: FAILED-{case.artifact})"
        ) from err
    panel.screenshot(path=str(artifacts / case.artifact))


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda lesson: lesson.notebook.split("_")[0])
def test_lesson_panels_respond(page: Page, lab_server, artifacts, lesson: Lesson):
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    open_and_run(page, lab_server, lesson.notebook, timeout_ms=lesson.run_timeout_ms)
    for case in lesson.panels:
        _check_panel(page, case, artifacts)
    assert not errors, errors


def test_every_lesson_is_in_the_table():
    assert sorted(lesson.notebook for lesson in LESSONS) == sorted(nb.name for nb in NOTEBOOKS.glob("*.ipynb"))


def test_lab_refuses_requests_without_the_token(lab_server):
    try:
        urllib.request.urlopen(f"{lab_server['base']}/api/contents", timeout=5)
    except urllib.error.HTTPError as err:
        assert err.code in (401, 403)
    else:
        raise AssertionError("JupyterLab answered without a token")
