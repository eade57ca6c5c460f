"""The library's own words in Chinese (klviz.messages): with ``KLVIZ_LANG=zh`` every panel's controls,
readout and figure, and every check's verdict, come out in Chinese from the catalogue
``klviz/locale/zh_CN/LC_MESSAGES/klviz.po``; unset, they are the English of the code. Every string the
code marks has a current translation, and a new or changed one fails the check until it is translated.
(The English output itself is covered by the panels' and checks' own tests.)"""

from __future__ import annotations

import html
import importlib
import re
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from klviz import messages

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "translations.py"
CJK = re.compile(r"[\u3400-\u9fff]")


class _Recording(dict):
    """The loaded catalogue, noting every string looked up that it has no translation for."""

    def __init__(self, table: dict) -> None:
        super().__init__(table)
        self.missing: set[tuple] = set()

    def get(self, key, default=None):  # noqa: D401 - dict.get, as tr calls it
        if key not in self:
            self.missing.add(key)
        return super().get(key, default)


@pytest.fixture
def chinese(monkeypatch):
    """``KLVIZ_LANG=zh``, with the catalogue recording what it was asked for and lacked."""
    monkeypatch.setenv("KLVIZ_LANG", "zh")
    recording = _Recording(messages.translations("zh"))
    monkeypatch.setitem(messages._LOADED, "zh", recording)
    return recording


def _english_phrases() -> list[str]:
    """Pieces of the catalogue's English (between fields and tags) long enough to be prose: none of
    them may appear in what a Chinese reader sees."""
    found, _ = messages.extract()
    phrases = set()
    for item in found:
        for piece in re.split(r"\{[^{}]*\}|<[^>]+>", item.text):
            piece = piece.strip(" .,:;()")
            if re.search(r"[A-Za-z]{3,} [a-z]{3,} [a-z]{2,}", piece):
                phrases.add(piece)
    return sorted(phrases)


def test_every_library_string_has_a_current_translation():
    found = messages.problems("zh")
    assert not found, "the library's words are not all translated:\n" + "\n".join(found)
    strings, errors = messages.extract()
    assert len({(s.context, s.text) for s in strings}) > 500 and not errors


def test_the_language_is_read_when_a_string_is_shown(monkeypatch):
    monkeypatch.delenv("KLVIZ_LANG", raising=False)
    assert messages.tr("exact KL") == "exact KL"
    assert messages.tr("{n} precomputed positions", n=12) == "12 precomputed positions"
    monkeypatch.setenv("KLVIZ_LANG", "zh")
    assert messages.tr("exact KL") == "精确 KL"
    assert messages.tr("{n} precomputed positions", n=12) == "12 个预先计算的位置"
    for english in ("en", "", "fr"):  # English, unset, or a language without a catalogue: the code's English
        monkeypatch.setenv("KLVIZ_LANG", english)
        assert messages.tr("exact KL") == "exact KL"
    monkeypatch.setenv("KLVIZ_LANG", "zh_CN")
    assert messages.language() == "zh"


def test_the_catalogue_loads_once_and_quickly():
    path = messages.catalogue_file("zh")
    text = path.read_text(encoding="utf-8")
    best = min(_timed(lambda: messages.parse_po(text)) for _ in range(3))
    assert best < 0.05, f"reading the catalogue took {best * 1e3:.0f} ms (budget 50 ms)"
    assert messages.translations("zh") is messages.translations("zh")  # read once, then a dict


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _package_copy(dest: Path) -> Path:
    """The package's code and its catalogue, copied into ``dest/klviz`` (no data files)."""
    package = dest / "klviz"
    shutil.copytree(
        ROOT / "klviz",
        package,
        ignore=lambda folder, names: [
            n for n in names if not (n.endswith((".py", ".po")) or (Path(folder) / n).is_dir()) or n == "__pycache__"
        ],
    )
    return package


def _script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300)


def test_a_new_string_fails_the_check_until_it_is_translated(tmp_path):
    package = _package_copy(tmp_path)
    module = package / "widgets" / "lesson03.py"
    module.write_text(
        module.read_text(encoding="utf-8")
        + '\n\ndef _new_caption() -> str:\n    return tr("A caption added to the code")\n',
        encoding="utf-8",
    )
    found = messages.problems("zh", package)
    assert len(found) == 1 and "'A caption added to the code': not in" in found[0], found

    before = _script("--check", "--package", str(package))
    assert before.returncode == 1 and "A caption added to the code" in before.stdout, before.stdout

    assert "1 new" in messages.update("zh", package)
    found = messages.problems("zh", package)
    assert len(found) == 1 and found[0].endswith("not translated yet"), found

    po = messages.catalogue_file("zh", package)
    assert 'msgid "A caption added to the code"\nmsgstr ""' in po.read_text(encoding="utf-8")
    _translate(po, "A caption added to the code", "代码中新增的说明")
    assert messages.problems("zh", package) == []


def test_a_changed_or_removed_string_fails_the_check(tmp_path):
    package = _package_copy(tmp_path)
    module = package / "widgets" / "lesson03.py"
    source = module.read_text(encoding="utf-8")
    assert 'tr("tangent at t = 1")' in source
    module.write_text(source.replace('tr("tangent at t = 1")', 'tr("the tangent at t = 1")'), encoding="utf-8")
    found = messages.problems("zh", package)
    assert any("'the tangent at t = 1': not in" in line for line in found), found
    assert any("'tangent at t = 1' is no longer in the code" in line for line in found), found

    messages.update("zh", package)  # merged: the old translation is kept, marked fuzzy, to revise
    found = messages.problems("zh", package)
    assert len(found) == 1 and "fuzzy" in found[0], found
    text = messages.catalogue_file("zh", package).read_text(encoding="utf-8")
    assert '#, fuzzy\n#| msgid "tangent at t = 1"\nmsgid "the tangent at t = 1"' in text


@pytest.mark.parametrize(
    ("english", "translation", "complaint"),
    [
        ("{n} tokens", "{m} 个词元", "fields"),
        ("<b>gap</b> {g:.3g}", "差距 {g:.3g}", "HTML tags"),
        ("tangent at t = 1", "tangent at t = 1", "no Chinese"),
    ],
)
def test_a_translation_that_loses_a_field_or_tag_is_flagged(tmp_path, english, translation, complaint):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "m.py").write_text(f"from klviz.messages import tr\n\nX = tr({english!r})\n", encoding="utf-8")
    messages.update("zh", package)
    _translate(messages.catalogue_file("zh", package), english, translation)
    found = messages.problems("zh", package)
    assert len(found) == 1 and complaint in found[0], found


def _translate(po: Path, english: str, translation: str) -> None:
    from babel.messages.pofile import read_po, write_po

    with po.open("rb") as fh:
        catalog = read_po(fh)
    catalog[english].string = translation
    with po.open("wb") as fh:
        write_po(fh, catalog, width=0)


def test_an_f_string_marked_for_translation_is_an_error(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "m.py").write_text('from klviz.messages import tr\n\nn = 3\nX = tr(f"{n} tokens")\n', encoding="utf-8")
    found = messages.problems("zh", package)
    assert any("an f-string cannot be translated" in line for line in found), found


def _panel_texts(panel) -> tuple[list[str], str, list[str]]:
    """What a reader of ``panel`` reads: control labels (descriptions, option labels, tooltips), the
    readout and title (tags removed), and the figure's texts (titles, axis labels, legends, notes)."""
    from matplotlib.text import Text

    labels = []
    for control in panel.controls.values():
        labels.append(control.description or "")
        labels.extend(str(label) for label in getattr(control, "_options_labels", ()))
        labels.extend(getattr(control, "tooltips", None) or ())
    shown = html.unescape(re.sub(r"<[^>]+>", " ", panel.readout.value + panel.status.value))
    panel.fig.draw_without_rendering()
    figure = [t.get_text() for t in panel.fig.findobj(Text) if t.get_visible() and t.get_text().strip()]
    return labels, shown, figure


#: Panels whose controls are formulas only (``f(t)``, ``r = p(x)/q(x)``, ``−log t → KL(q‖p)``): the same in Chinese.
FORMULA_CONTROLS = {"BregmanPanel"}


def _all_panels() -> list[str]:
    from klviz import widgets as W

    return list(W.PANELS)


@pytest.mark.parametrize("name", _all_panels())
def test_each_panel_speaks_chinese(chinese, name):
    from klviz import widgets as W

    panel = getattr(W, name)()
    try:
        panel.wait(60)
        labels, shown, figure = _panel_texts(panel)
        title = messages.tr(panel.title)
    finally:
        panel.close()
    assert CJK.search(title), title
    if name not in FORMULA_CONTROLS:
        assert any(CJK.search(label) for label in labels), labels
    assert CJK.search(shown), shown
    assert any(CJK.search(t) for t in figure), figure
    assert not chinese.missing, f"strings without a translation: {sorted(chinese.missing)}"
    everything = "\n".join([title, *labels, shown, *figure])
    english = [phrase for phrase in _english_phrases() if phrase in everything]
    assert not english, f"{name} shows English the catalogue translates: {english}"


def test_english_is_the_code_when_the_language_is_unset(monkeypatch):
    from klviz import widgets as W

    monkeypatch.delenv("KLVIZ_LANG", raising=False)
    panel = W.BregmanPanel()
    try:
        labels, shown, figure = _panel_texts(panel)
    finally:
        panel.close()
    assert not any(CJK.search(t) for t in [*labels, shown, *figure])
    assert "tangent at t = 1" in figure and "r = p(x)/q(x)" in labels


_LESSON_CHECKS = [f"lesson0{n}" for n in range(9)]


def _raises(*args):
    raise ZeroDivisionError("division by zero")


@pytest.mark.parametrize("lesson", _LESSON_CHECKS)
def test_check_messages_in_chinese(chinese, lesson):
    """Every check of the lesson, given an unfinished answer (``...``, a skeleton that returns ``...``)
    and a function that raises: its verdict, and how the page shows it, are Chinese."""
    module = importlib.import_module(f"klviz.check.{lesson}")
    names = getattr(module, "__all__", None) or [n for n, f in vars(module).items() if hasattr(f, "__wrapped__")]
    assert names
    for name in names:
        check = getattr(module, name)
        if not callable(check):  # a constant the lesson uses (lesson 08's LOGGED_NUMBERS)
            continue
        results = []
        for answer in (..., lambda *args: ..., _raises):
            try:
                results.append(check(answer))
            except Exception:  # noqa: BLE001 - a check that needs another kind of answer: the others say it
                continue
        assert results and any(not r.attempted for r in results), name
        for result in results:
            assert not result and CJK.search(result.message), (name, result.message)
            assert CJK.search(repr(result)), repr(result)
            page = result._repr_html_()
            assert ("✘ 还不对：" in page or "… 尚未作答：" in page) and "not yet" not in page, page
    assert not chinese.missing, f"strings without a translation: {sorted(chinese.missing)}"


def test_a_check_verdict_in_chinese(chinese):
    import torch

    from klviz.check import lesson02

    right = lesson02.k3_estimator(lambda log_r: torch.expm1(log_r) - log_r)
    assert right and repr(right).startswith("[正确] k3 = expm1(log r) - log r：对 KL(q‖p) 无偏")
    inverted = lesson02.k3_estimator(lambda log_r: torch.expm1(-log_r) + log_r)
    assert not inverted and inverted.message.startswith("你把概率比倒过来了"), inverted.message
    assert "KL(q‖p)" in inverted.message and "chi²(q‖p)" in inverted.message  # formulas kept as they are
    assert not chinese.missing


def test_a_chinese_figure_draws_chinese_glyphs(chinese, tmp_path):
    """The titles and labels of a panel drawn in Chinese are drawn with the shipped CJK font: a text
    renders differently from the same text with its Chinese replaced by a character no font has (which
    would be the empty box every missing glyph is drawn as)."""
    import matplotlib.image as mpimg

    from klviz import fonts
    from klviz import widgets as W
    from klviz.plotting import new_figure

    panel = W.StartHerePanel()
    try:
        _labels, _shown, figure = _panel_texts(panel)
    finally:
        panel.close()
    chinese_texts = [t for t in figure if CJK.search(t)]
    assert chinese_texts and not fonts.missing_glyphs("".join(chinese_texts))

    def ink(text: str, path: Path):
        fig, ax = new_figure(4.0, 0.8)
        ax.set_axis_off()
        ax.text(0.0, 0.5, text, fontsize=20, va="center")
        fig.savefig(path, dpi=80)
        return mpimg.imread(path)[..., :3].mean(axis=-1) < 0.5

    title = next(t for t in chinese_texts if "下一个词元" in t)
    boxes = "".join("\u9f98" if CJK.search(ch) else ch for ch in title)  # 龘: in no font shipped
    drawn = ink(title, tmp_path / "title.png")
    with warnings.catch_warnings():  # matplotlib warns that 龘 is in neither font: that is the point
        warnings.simplefilter("ignore", UserWarning)
        tofu = ink(boxes, tmp_path / "boxes.png")
    assert drawn.sum() > 0 and (drawn != tofu).sum() > 0.1 * drawn.sum()


def test_the_catalogue_ships_in_the_wheel():
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["klviz"]
    shipped = {p.resolve() for pattern in patterns for p in (ROOT / "klviz").glob(pattern)}
    assert messages.catalogue_file("zh").resolve() in shipped
