"""Rebuild ``klviz/data/fonts/klviz-cjk-sc.ttf``: the CJK characters klviz's Chinese text uses, cut from
Noto Sans CJK SC (SIL Open Font License 1.1).

    python scripts/make_cjk_font.py [--source NotoSansCJK-Regular.ttc]

The source is Debian's ``fonts-noto-cjk`` package (``apt-get install fonts-noto-cjk``, or without
installing it: ``apt-get download fonts-noto-cjk && dpkg-deb -x fonts-noto-cjk_*.deb x`` and pass
``--source x/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc``), or any Noto Sans CJK SC /
Source Han Sans SC file. The characters: every CJK character in the translation catalogues
(``notebooks/locale/``, ``klviz/locale/`` if present), the glossary, and the full-width punctuation.
The result is TrueType (quadratic outlines, which every matplotlib backend embeds), named
``klviz CJK`` (a modified version may not present itself under the original's name), with the
original copyright and licence kept in its name table and ``OFL.txt`` beside it. The output depends
only on the source and the characters (no timestamps), so rerunning it changes nothing.
``tests/test_cjk_font.py`` fails, naming the characters, when a translation uses one the font lacks.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from klviz.fonts import FAMILY, FONT_FILE, is_cjk  # noqa: E402

DEFAULT_SOURCES = (
    Path("/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc"),
    Path("/usr/share/fonts/opentype/noto/NotoSansCJKsc-Regular.otf"),
)
SOURCE_FAMILY = "Noto Sans CJK SC"
#: Punctuation a Chinese text may use even where today's translations do not.
PUNCTUATION = "，。、；：？！（）《》〈〉「」『』【】〔〕…—～·％＋－＝／０１２３４５６７８９"


def text_sources() -> list[Path]:
    """The files whose CJK characters the font must hold."""
    files = sorted((ROOT / "notebooks" / "locale").rglob("*.po")) + sorted((ROOT / "klviz" / "locale").rglob("*.po"))
    return files + [ROOT / "notebooks" / "locale" / "glossary.csv"]


def needed_characters() -> list[str]:
    chars = {ch for ch in PUNCTUATION if is_cjk(ch)}
    for path in text_sources():
        if path.is_file():
            chars |= {ch for ch in path.read_text(encoding="utf-8") if is_cjk(ch)}
    return sorted(chars)


def open_source(path: Path):
    from fontTools.ttLib import TTCollection, TTFont

    if path.suffix.lower() == ".ttc":
        for font in TTCollection(str(path)).fonts:
            if font["name"].getDebugName(1) == SOURCE_FAMILY:
                return font
        raise SystemExit(f"{path} holds no font named {SOURCE_FAMILY!r}")
    return TTFont(str(path))


def to_truetype(font) -> None:
    """Convert CFF (cubic) outlines to glyf (quadratic) in place (as fontTools' otf2ttf snippet does)."""
    from fontTools.pens.cu2quPen import Cu2QuPen
    from fontTools.pens.ttGlyphPen import TTGlyphPen
    from fontTools.ttLib import newTable

    order = font.getGlyphOrder()
    glyph_set = font.getGlyphSet()
    glyphs = {}
    for name in order:
        pen = TTGlyphPen(glyph_set)
        glyph_set[name].draw(Cu2QuPen(pen, max_err=1.0, reverse_direction=True))
        glyphs[name] = pen.glyph()
    font["loca"] = newTable("loca")
    glyf = font["glyf"] = newTable("glyf")
    glyf.glyphOrder = order
    glyf.glyphs = glyphs
    for table in ("CFF ", "VORG"):
        if table in font:
            del font[table]
    glyf.compile(font)
    hmtx = font["hmtx"]
    for name, glyph in glyf.glyphs.items():
        if hasattr(glyph, "xMin"):
            hmtx[name] = (hmtx[name][0], glyph.xMin)
    maxp = font["maxp"] = newTable("maxp")
    maxp.tableVersion = 0x00010000
    for field in ("maxZones",):
        setattr(maxp, field, 1)
    for field in (
        "maxTwilightPoints", "maxStorage", "maxFunctionDefs", "maxInstructionDefs",
        "maxStackElements", "maxSizeOfInstructions", "maxComponentElements",
    ):  # fmt: skip
        setattr(maxp, field, 0)
    maxp.compile(font)
    post = font["post"]
    post.formatType = 3.0  # no glyph names (the source's are CIDs)
    post.extraNames, post.mapping = [], {}
    font["head"].glyphDataFormat = 0
    font.sfntVersion = "\x00\x01\x00\x00"


def rename(font) -> None:
    """The subset's own name; the original's copyright (0), licence (13, 14) and designer stay."""
    name = font["name"]
    version = name.getDebugName(5) or ""
    keep = {0, 7, 8, 9, 11, 12, 13, 14}
    name.names = [n for n in name.names if n.nameID in keep]
    values = {
        1: FAMILY,
        2: "Regular",
        3: f"{FAMILY.replace(' ', '')}-Regular;{version}",
        4: f"{FAMILY} Regular",
        5: f"{version}; klviz subset",
        6: f"{FAMILY.replace(' ', '')}-Regular",
        10: f"A subset of {SOURCE_FAMILY} ({version.split(';')[0]}) holding the characters of klviz's Chinese text.",
    }
    for name_id, value in values.items():
        name.setName(value, name_id, 3, 1, 0x409)
        name.setName(value, name_id, 1, 0, 0)


def build(source: Path, out: Path) -> tuple[int, int]:
    from fontTools import subset

    chars = needed_characters()
    font = open_source(source)
    options = subset.Options()
    options.drop_tables += ["vhea", "vmtx", "VORG", "DSIG", "BASE", "JSTF"]
    options.layout_features = ["*"]
    options.name_IDs = ["*"]
    options.name_languages = ["*"]
    options.notdef_outline = True
    options.hinting = False
    options.desubroutinize = True
    subsetter = subset.Subsetter(options)
    subsetter.populate(unicodes=[ord(c) for c in chars])
    subsetter.subset(font)
    to_truetype(font)
    rename(font)
    head = font["head"]
    head.modified = head.created  # no build time in the file: rerunning changes nothing
    font.recalcTimestamp = False
    out.parent.mkdir(parents=True, exist_ok=True)
    font.save(str(out), reorderTables=True)
    return len(chars), out.stat().st_size


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", type=Path, default=None, help="Noto Sans CJK (.ttc or SC .otf)")
    parser.add_argument("--out", type=Path, default=FONT_FILE)
    args = parser.parse_args(argv)
    source = args.source or next((p for p in DEFAULT_SOURCES if p.is_file()), None)
    if source is None or not source.is_file():
        parser.error("no Noto Sans CJK found: `apt-get install fonts-noto-cjk`, or pass --source (see the docstring)")
    count, size = build(source, args.out)
    print(f"wrote {args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out}: "
          f"{count} characters, {size / 1e6:.2f} MB")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
