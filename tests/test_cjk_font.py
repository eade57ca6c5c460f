"""Chinese glyphs without a CJK font on the machine (klviz.fonts): the shipped subset covers every
character the translations use, carries its licence, and a saved figure draws distinct Chinese
characters as distinct shapes, not as empty boxes. (The pages' side: tests/browser/test_cjk_glyphs.py.)"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from klviz import fonts

ROOT = Path(__file__).resolve().parents[1]
#: Distinct characters of the glossary's terms (策略 参考 偏差 方差 梯度 优势 估计量 对数比 采样 散度).
CHARACTERS = "策略参考偏差方梯度优势估计量对数比采样散"
#: A CJK character no translation uses (nor the font): drawn as the missing-glyph box.
ABSENT = "\u9f98"  # 龘


def translated_text() -> str:
    files = sorted((ROOT / "notebooks" / "locale").rglob("*.po")) + [ROOT / "notebooks" / "locale" / "glossary.csv"]
    files += sorted((ROOT / "klviz" / "locale").rglob("*.po"))  # the library's own words (klviz.messages)
    return "".join(p.read_text(encoding="utf-8") for p in files)


def test_the_font_covers_every_character_of_the_chinese_text():
    text = translated_text()
    assert sum(map(fonts.is_cjk, text)) > 1000, "the catalogues hold little Chinese: is the edition translated?"
    missing = fonts.missing_glyphs(text)
    assert not missing, (
        f"the shipped CJK font lacks {len(missing)} characters the translations use ({''.join(missing[:40])}): "
        "run `python scripts/make_cjk_font.py` (its docstring says where the source font comes from)"
    )
    assert ABSENT not in text and fonts.missing_glyphs(ABSENT) == [ABSENT]


def test_the_font_is_renamed_and_carries_its_licence():
    from fontTools.ttLib import TTFont

    with TTFont(str(fonts.font_path())) as font:
        names = {n.nameID: n.toUnicode() for n in font["name"].names if n.platformID == 3}
        assert "glyf" in font and "CFF " not in font, "TrueType outlines (every matplotlib backend embeds them)"
    assert names[1] == fonts.FAMILY and "Noto" not in names[1] and "Source" not in names[1]
    assert "Adobe" in names[0] and "Open Font License" in names[13]
    licence = fonts.LICENSE_FILE.read_text(encoding="utf-8")
    assert "SIL OPEN FONT LICENSE Version 1.1" in licence and "Copyright 2014-2021 Adobe" in licence
    assert fonts.font_path().stat().st_size < 3_000_000, "a subset, not the whole font"


def _glyph_images(tmp_path: Path, chars: str, family: str | None = None) -> list[np.ndarray]:
    """Each character drawn alone into a saved PNG, read back as a boolean ink mask cropped to its ink."""
    import matplotlib.image as mpimg
    import matplotlib.pyplot as plt

    from klviz.plotting import new_figure

    images = []
    for i, ch in enumerate(chars):
        fig, ax = new_figure(0.8, 0.8)
        ax.set_axis_off()
        ax.text(0.5, 0.5, ch, fontsize=36, ha="center", va="center", **({"fontfamily": family} if family else {}))
        path = tmp_path / f"glyph{i}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        ink = mpimg.imread(path)[..., :3].mean(axis=-1) < 0.5
        rows, cols = np.flatnonzero(ink.any(axis=1)), np.flatnonzero(ink.any(axis=0))
        images.append(ink[rows[0] : rows[-1] + 1, cols[0] : cols[-1] + 1] if rows.size else ink)
    return images


def _differ(a: np.ndarray, b: np.ndarray) -> int:
    """How many pixels two ink masks differ in (a different size counts every pixel)."""
    return int((a != b).sum()) if a.shape == b.shape else max(a.size, b.size)


def test_a_saved_figure_draws_distinct_chinese_characters_as_distinct_shapes(tmp_path):
    import matplotlib as mpl

    from klviz.plotting import apply_style

    apply_style()
    assert fonts.FAMILY in mpl.rcParams["font.family"], "apply_style puts the CJK font in the fallback chain"
    drawn = _glyph_images(tmp_path, CHARACTERS)
    with pytest.warns(UserWarning, match="missing from font"):
        box = _glyph_images(tmp_path, ABSENT)[0]  # what a character without a glyph looks like: the empty box
    assert box.sum() > 0
    for ch, ink in zip(CHARACTERS, drawn):
        assert ink.sum() > 20, f"{ch} drew no ink"
        assert _differ(ink, box) > 20, f"{ch} was drawn as the missing-glyph box"
    pairs = [(a, b) for i, a in enumerate(range(len(drawn))) for b in range(i + 1, len(drawn))]
    same = [(CHARACTERS[a], CHARACTERS[b]) for a, b in pairs if _differ(drawn[a], drawn[b]) <= 20]
    assert not same, f"distinct characters drawn alike: {same}"
    # the glyphs are the shipped font's: the fallback chain is the default font, then the shipped one,
    # and the default font has none of these characters
    from matplotlib.font_manager import FontProperties, fontManager
    from matplotlib.ft2font import FT2Font

    chain = fontManager._find_fonts_by_props(FontProperties(family=mpl.rcParams["font.family"]))
    assert Path(chain[-1]).resolve() == fonts.font_path().resolve(), chain
    first = FT2Font(chain[0])
    assert all(first.get_char_index(ord(ch)) == 0 for ch in CHARACTERS), f"{chain[0]} has CJK glyphs"


def test_latin_text_keeps_its_font(tmp_path):
    from klviz.plotting import apply_style

    apply_style()
    fallback = _glyph_images(tmp_path, "Kk3")
    plain = _glyph_images(tmp_path, "Kk3", family="DejaVu Sans")
    assert all(_differ(a, b) == 0 for a, b in zip(fallback, plain))


def test_the_jupyterlab_css_serves_the_font_for_cjk_code_points_only(tmp_path):
    config = fonts.write_jupyterlab_custom(tmp_path)
    custom = tmp_path / "custom"
    assert config["LabApp"]["custom_css"] is True
    assert config["ServerApp"]["tornado_settings"]["static_custom_path"] == [str(custom)]
    css = (custom / "custom.css").read_text(encoding="utf-8")
    assert (custom / fonts.FONT_FILE.name).read_bytes() == fonts.font_path().read_bytes()
    assert f'url("{fonts.FONT_FILE.name}")' in css and "U+4E00-9FFF" in css
    for var in ("--jp-ui-font-family", "--jp-content-font-family", "--jp-code-font-family"):
        assert f'{var}: "{fonts.FAMILY}",' in css


@pytest.mark.parametrize("char", ["策", "，", "（", "a", "·", "—"])
def test_is_cjk(char):
    assert fonts.is_cjk(char) == (char in "策，（")
