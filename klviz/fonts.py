"""Chinese glyphs on a machine without a CJK font: the subset font klviz ships, for figures and pages.

Lab machines are often installed without any CJK font, and then every Chinese character (lesson 00's
glossary, the Chinese edition) renders as an empty box. klviz ships ``klviz/data/fonts/klviz-cjk-sc.ttf``,
a subset of Noto Sans CJK SC (SIL Open Font License 1.1, ``OFL.txt`` beside it) holding the characters
the Chinese edition uses, renamed to the family :data:`FAMILY` as the licence asks of a modified
version. ``scripts/make_cjk_font.py`` rebuilds it from the full font when the translations need more
characters (``tests/test_cjk_font.py`` fails until then).

- Figures: :func:`use_in_matplotlib` registers it and puts it after the default family, so a glyph the
  default font lacks (every CJK one) is drawn from it; Latin text is unchanged. ``klviz.plotting.apply_style``
  calls it.
- Pages: :func:`font_face_css` is an ``@font-face`` rule limited to the CJK code points
  (``unicode-range``), and :func:`jupyterlab_css` puts the family first in JupyterLab's font
  variables: CJK characters come from it, everything else from the page's own fonts.
  :func:`write_jupyterlab_custom` writes both files where a JupyterLab started with
  ``LabApp.custom_css`` serves them (``klviz.servers.start_lab_server`` does).
"""

from __future__ import annotations

import os
import shutil
from functools import lru_cache
from pathlib import Path
from typing import Any

__all__ = [
    "FAMILY",
    "FONT_FILE",
    "LICENSE_FILE",
    "UNICODE_RANGE",
    "is_cjk",
    "font_path",
    "missing_glyphs",
    "use_in_matplotlib",
    "font_face_css",
    "jupyterlab_css",
    "write_jupyterlab_custom",
]

#: The family name of the shipped subset (not "Noto": a modified version carries a name of its own).
FAMILY = "klviz CJK"
FONT_FILE = Path(__file__).resolve().parent / "data" / "fonts" / "klviz-cjk-sc.ttf"
LICENSE_FILE = FONT_FILE.with_name("OFL.txt")
#: The code points the font serves on a page: CJK punctuation, ideographs, full-width forms.
CJK_BLOCKS: tuple[tuple[int, int], ...] = (
    (0x2E80, 0x2FDF),  # radicals
    (0x3000, 0x303F),  # CJK symbols and punctuation: 、。《》「」
    (0x3400, 0x4DBF),  # extension A
    (0x4E00, 0x9FFF),  # unified ideographs
    (0xF900, 0xFAFF),  # compatibility ideographs
    (0xFE30, 0xFE4F),  # compatibility forms
    (0xFF00, 0xFFEF),  # full-width forms: ，：；（）！？
)
UNICODE_RANGE = ", ".join(f"U+{lo:04X}-{hi:04X}" for lo, hi in CJK_BLOCKS)


def is_cjk(char: str) -> bool:
    """Whether ``char`` lies in the blocks the font is meant for (:data:`CJK_BLOCKS`)."""
    code = ord(char)
    return any(lo <= code <= hi for lo, hi in CJK_BLOCKS)


def font_path() -> Path:
    """The shipped font file; FileNotFoundError (saying how to get it back) if it is missing."""
    if not FONT_FILE.is_file():
        raise FileNotFoundError(
            f"the CJK font {FONT_FILE} is missing: reinstall klviz, or run `python scripts/make_cjk_font.py`"
        )
    return FONT_FILE


@lru_cache(maxsize=1)
def _cmap() -> frozenset[int]:
    from fontTools.ttLib import TTFont

    with TTFont(str(font_path()), lazy=True) as font:
        return frozenset(font.getBestCmap())


def missing_glyphs(text: str) -> list[str]:
    """The CJK characters of ``text`` the shipped font has no glyph for, in order of first use."""
    have = _cmap()
    seen: dict[str, None] = {}
    for ch in text:
        if is_cjk(ch) and ord(ch) not in have:
            seen.setdefault(ch)
    return list(seen)


_registered = False


def use_in_matplotlib() -> None:
    """Register the font with matplotlib and make it the fallback after the default family (per
    glyph: Latin text keeps its font, a CJK character the default font lacks comes from this one).
    Idempotent; a missing font file leaves matplotlib as it was."""
    global _registered
    import matplotlib as mpl
    from matplotlib import font_manager

    if not _registered:
        if not FONT_FILE.is_file():
            return
        font_manager.fontManager.addfont(str(FONT_FILE))
        _registered = True
    family = mpl.rcParams["font.family"]
    families = [family] if isinstance(family, str) else list(family)
    if FAMILY not in families:
        mpl.rcParams["font.family"] = [*families, FAMILY]


def font_face_css(url: str) -> str:
    """An ``@font-face`` rule for :data:`FAMILY` loading the font from ``url``, limited to the CJK code
    points (a page's Latin text never downloads or uses it)."""
    return (
        "@font-face {\n"
        f'  font-family: "{FAMILY}";\n'
        f'  src: url("{url}") format("truetype");\n'
        f"  unicode-range: {UNICODE_RANGE};\n"
        "  font-display: swap;\n"
        "}\n"
    )


#: JupyterLab 4's own font stacks (its light and dark themes), which the CSS below extends.
_JUPYTERLAB_SANS = (
    'system-ui, -apple-system, blinkmacsystemfont, "Segoe UI", helvetica, arial, sans-serif, '
    '"Apple Color Emoji", "Segoe UI Emoji", "Segoe UI Symbol"'
)


def jupyterlab_css(url: str = "klviz-cjk-sc.ttf") -> str:
    """``custom.css`` for JupyterLab: the font face, and :data:`FAMILY` first in the interface, prose
    and code font variables (set on ``body``, below the theme's ``:root``, so they win whatever the
    order the styles load in). Thanks to ``unicode-range`` only CJK characters use it."""
    stack = f'"{FAMILY}", {_JUPYTERLAB_SANS}'
    return (
        "/* klviz: Chinese text renders on machines without a CJK font (klviz/fonts.py) */\n"
        + font_face_css(url)
        + "body {\n"
        f"  --jp-ui-font-family: {stack};\n"
        f"  --jp-content-font-family: {stack};\n"
        f'  --jp-code-font-family: "{FAMILY}", var(--jp-code-font-family-default);\n'
        "}\n"
    )


def write_jupyterlab_custom(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """Write ``custom.css`` and the font into ``folder/custom`` and return the JupyterLab config that
    serves them on every page (``LabApp.custom_css`` and the server's ``static_custom_path``)."""
    custom = Path(folder) / "custom"
    custom.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(font_path(), custom / FONT_FILE.name)
    (custom / "custom.css").write_text(jupyterlab_css(FONT_FILE.name), encoding="utf-8")
    return {
        "LabApp": {"custom_css": True},
        "ServerApp": {"tornado_settings": {"static_custom_path": [str(custom)]}},
    }
