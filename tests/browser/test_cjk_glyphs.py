"""Chinese text in JupyterLab on a machine without a CJK font: Chromium runs with a font configuration
that holds only matplotlib's DejaVu fonts (so any CJK glyph must come from the page), and

- a Chinese lesson's prose and lesson 00's glossary in the English lesson are drawn with the font
  klviz serves (``klviz.fonts``: ``custom.css`` of every JupyterLab klviz starts), as Chromium itself
  reports (DevTools' ``CSS.getPlatformFontsForNode``);
- distinct characters drawn with the page's font stack have distinct shapes, where the browser's own
  fonts alone draw them as identical empty boxes (the control: this machine really has no CJK font).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import matplotlib
import pytest

from klviz import fonts, i18n

from .conftest import CHROMIUM_FLAGS, NOTEBOOKS, ROOT, chromium_path, running_lab

pytestmark = pytest.mark.browser

CHARACTERS = "策略参考偏差方梯度优势"

#: Draw each character on a canvas with ``font`` and return the pixels as strings, once the fonts load.
SHAPES = """async ([chars, font]) => {
  await document.fonts.load(font, chars);
  await document.fonts.ready;
  const out = [];
  for (const ch of chars) {
    const c = document.createElement('canvas'); c.width = 48; c.height = 48;
    const g = c.getContext('2d'); g.font = font; g.fillStyle = '#000'; g.textBaseline = 'top';
    g.fillText(ch, 4, 4);
    const d = g.getImageData(0, 0, 48, 48).data;
    let s = ''; for (let i = 3; i < d.length; i += 4) s += d[i] > 127 ? '1' : '0';
    out.push(s);
  }
  return out;
}"""


@pytest.fixture(scope="module")
def no_cjk_fonts(tmp_path_factory) -> dict[str, str]:
    """An environment whose fontconfig knows only matplotlib's DejaVu fonts: no CJK font at all."""
    folder = tmp_path_factory.mktemp("fontconfig")
    ttf = Path(matplotlib.get_data_path()) / "fonts" / "ttf"
    conf = folder / "fonts.conf"
    conf.write_text(
        '<?xml version="1.0"?>\n<!DOCTYPE fontconfig SYSTEM "fonts.dtd">\n'
        f"<fontconfig><dir>{ttf}</dir><cachedir>{folder / 'cache'}</cachedir></fontconfig>\n"
    )
    return {**os.environ, "FONTCONFIG_FILE": str(conf)}


@pytest.fixture(scope="module")
def lab_with_both_editions(tmp_path_factory):
    """A JupyterLab (started as klviz starts one) serving the English lessons and, in ``zh/``, the Chinese."""
    root = tmp_path_factory.mktemp("cjk-root")
    for nb in NOTEBOOKS.glob("*.ipynb"):
        shutil.copy(nb, root)
    i18n.build_edition("zh", root / "zh", ROOT / "notebooks")
    with running_lab(root, tmp_path_factory.mktemp("cjk-home")) as lab:
        yield lab


@pytest.fixture(scope="module")
def page(browser_type, no_cjk_fonts, lab_with_both_editions):
    browser = browser_type.launch(executable_path=chromium_path(), headless=True, args=CHROMIUM_FLAGS, env=no_cjk_fonts)
    try:
        context = browser.new_context(viewport={"width": 1280, "height": 1000})
        yield context.new_page()
    finally:
        browser.close()


def _platform_fonts(page, selector: str) -> dict[str, int]:
    """The fonts Chromium drew the text of the first element matching ``selector`` with: family -> glyphs."""
    cdp = page.context.new_cdp_session(page)
    cdp.send("DOM.enable")
    cdp.send("CSS.enable")
    root = cdp.send("DOM.getDocument", {"depth": -1, "pierce": True})["root"]["nodeId"]
    node = cdp.send("DOM.querySelector", {"nodeId": root, "selector": selector})["nodeId"]
    assert node, f"no element matches {selector!r}"
    used = cdp.send("CSS.getPlatformFontsForNode", {"nodeId": node})["fonts"]
    cdp.detach()
    return {f["familyName"]: f["glyphCount"] for f in used}


def _open(page, lab: dict, path: str, text: str) -> None:
    page.goto(f"{lab['base']}/lab/tree/{path}?token={lab['token']}&reset")
    page.locator(".jp-RenderedMarkdown", has_text=text).first.wait_for(timeout=90_000)
    page.evaluate("document.fonts.ready.then(() => true)")


def test_the_browser_has_no_cjk_font_of_its_own(page, lab_with_both_editions):
    page.goto(f"{lab_with_both_editions['base']}/lab?token={lab_with_both_editions['token']}")
    boxes = page.evaluate(SHAPES, [CHARACTERS, "40px sans-serif"])
    assert len(set(boxes)) == 1, "the browser found CJK glyphs of its own: the check below would prove nothing"


def test_a_chinese_lesson_renders_cjk_glyphs(page, lab_with_both_editions, artifacts):
    _open(page, lab_with_both_editions, "zh/00_start_here.ipynb", "术语表")
    heading = ".jp-RenderedMarkdown h1"
    title = page.locator(heading).first.inner_text()
    assert sum(map(fonts.is_cjk, title)) >= 4, title
    used = _platform_fonts(page, heading)
    assert used.get(fonts.FAMILY, 0) >= sum(map(fonts.is_cjk, title)), used
    stack = page.evaluate("getComputedStyle(document.querySelector('.jp-RenderedMarkdown')).fontFamily")
    shapes = page.evaluate(SHAPES, [CHARACTERS, f"40px {stack}"])
    assert len(set(shapes)) == len(CHARACTERS), "distinct characters rendered with the same shape"
    assert all(s.count("1") > 40 for s in shapes), "a character drew (almost) no ink"
    page.locator(".jp-RenderedMarkdown").first.screenshot(path=str(artifacts / "cjk_lesson00_zh.png"))


def test_the_english_lesson_00_glossary_renders_its_chinese_column(page, lab_with_both_editions, artifacts):
    _open(page, lab_with_both_editions, "00_start_here.ipynb", "Glossary")
    glossary = page.locator(".jp-RenderedMarkdown", has_text="Glossary").first
    glossary.evaluate("el => el.setAttribute('data-klviz-test', 'glossary')")
    cell = "[data-klviz-test=glossary] table tbody tr:first-child td:nth-child(2)"
    text = page.locator(cell).first.inner_text()
    assert any(map(fonts.is_cjk, text)), text
    used = _platform_fonts(page, cell)
    assert used.get(fonts.FAMILY, 0) >= sum(map(fonts.is_cjk, text)), used
    glossary.locator("table").screenshot(path=str(artifacts / "cjk_glossary_en.png"))
