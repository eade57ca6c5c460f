"""The suite's colours on a light and on a dark page, and the contrast rule they keep.

Every colour a figure or a panel's text uses is named here once, with one value for each page theme
(a light page, and the dark one of ``klviz present --theme dark`` or JupyterLab's dark theme). Each value
keeps a contrast ratio of at least 4.5:1 (WCAG 2 AA for text; kept for lines too) against the
background it is drawn on: the figure's background in that theme, or the page's (JupyterLab's
``--jp-layout-color0``). ``tests/test_theme_contrast.py`` renders every panel in both themes and checks it.

Figures take the value of the theme the kernel draws for (:func:`theme`, from ``KLVIZ_THEME``):
:func:`klviz.plotting.apply_style` copies them into :data:`klviz.plotting.COLORS`. Text in HTML (readouts,
tables, check results) cannot know the page's theme from the kernel, since a reader may switch JupyterLab
to its dark theme at any time. So it uses :func:`css`, a CSS custom property whose fallback is the light
value, and :data:`PAGE_CSS` gives the dark values on pages that JupyterLab, Voila and nbconvert mark as dark
(``body[data-jp-theme-light="false"]``).

Standard library only: ``import klviz`` stays light.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping

__all__ = [
    "THEMES",
    "PAGE",
    "FIGURE_BACKGROUND",
    "NAMED",
    "PAGE_CSS",
    "theme",
    "colour",
    "css",
    "text_on",
    "ThemedColours",
    "to_rgb",
    "to_rgba",
    "relative_luminance",
    "contrast_ratio",
    "blend",
    "MIN_CONTRAST",
]

THEMES: tuple[str, str] = ("light", "dark")

#: WCAG 2 AA for normal text, kept for text and lines alike.
MIN_CONTRAST = 4.5

#: The page as JupyterLab, Voila and nbconvert's ``lab`` template draw it in each theme: the background
#: (``--jp-layout-color0``) and the colour of text that sets none (``--jp-content-font-color1``, opaque).
PAGE: dict[str, dict[str, str]] = {
    "light": {"background": "#ffffff", "text": "#212121"},
    "dark": {"background": "#111111", "text": "#ffffff"},
}

#: A figure's own background in each theme (``klviz.plotting`` sets it as the face colour).
FIGURE_BACKGROUND: dict[str, str] = {"light": "#ffffff", "dark": "#111111"}

#: name -> (on a light page, on a dark page). The estimator colours are matplotlib's first colours, darkened
#: or lightened just enough to read at 4.5:1 on either background.
NAMED: dict[str, tuple[str, str]] = {
    # quantities, the same in every lesson
    "k1": ("#1f77b4", "#5aa7e0"),
    "k2": ("#c25400", "#ff7f0e"),
    "k3": ("#23812a", "#3fb83f"),
    "exact": ("#222222", "#e6e6e6"),
    "q": ("#6b6b6b", "#a6a6a6"),
    "p": ("#8058b0", "#b58fe0"),
    "mu": ("#d62728", "#ff6161"),
    "reverse": ("#23812a", "#3fb83f"),
    "forward": ("#d62728", "#ff6161"),
    "brown": ("#8c564b", "#c98b7e"),
    "cyan": ("#0e7c86", "#17becf"),
    # lines and text that carry no quantity's colour
    "ink": ("#222222", "#e6e6e6"),  # where a figure would draw black
    "muted": ("#595959", "#a6a6a6"),  # secondary text: captions, status lines, keys
    "bad": ("#b00020", "#ff7b8a"),  # errors, "stopped", "not yet"
    "warn": ("#8a4b00", "#e0a040"),  # caveats
    "good": ("#1b7f3b", "#6fcf8f"),  # "correct"
    # backgrounds and rules (not text: what text is drawn on, or a border)
    "note-background": ("#f6f8fa", "#1c2128"),
    "rule": ("#cccccc", "#555555"),
}


def theme() -> str:
    """The page the figures go on: ``"dark"`` when ``KLVIZ_THEME=dark`` (presenter mode sets it), else ``"light"``."""
    return "dark" if os.environ.get("KLVIZ_THEME", "").strip().lower() == "dark" else "light"


def colour(name: str, which: str | None = None) -> str:
    """The hex colour ``name`` (a key of :data:`NAMED`) for theme ``which`` (default: :func:`theme`)."""
    if name not in NAMED:
        raise ValueError(f"name must be one of {sorted(NAMED)}, got {name!r}")
    which = theme() if which is None else which
    if which not in THEMES:
        raise ValueError(f"which must be one of {THEMES}, got {which!r}")
    return NAMED[name][THEMES.index(which)]


def css(name: str) -> str:
    """``name`` as a CSS colour for HTML that may sit on either page: ``var(--klviz-NAME, LIGHT)``."""
    return f"var(--klviz-{name}, {colour(name, 'light')})"


class ThemedColours(Mapping[str, str]):
    """A mapping from labels to colours of :data:`NAMED`, read in the theme of the moment: ``m[label]``
    is the hex colour for figures (:func:`theme`), ``m.css(label)`` the CSS colour for HTML (:func:`css`)."""

    def __init__(self, names: Mapping[str, str]) -> None:
        unknown = sorted(set(names.values()) - set(NAMED))
        if unknown:
            raise ValueError(f"names: {unknown} are not colours of klviz.palette.NAMED")
        self.names = dict(names)

    def __getitem__(self, label: str) -> str:
        return colour(self.names[label])

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)

    def css(self, label: str) -> str:
        """The colour of ``label`` for HTML on either page."""
        return css(self.names[label])


def _page_css() -> str:
    light = "; ".join(f"--klviz-{name}: {values[0]}" for name, values in NAMED.items())
    dark = "; ".join(f"--klviz-{name}: {values[1]}" for name, values in NAMED.items())
    return f'<style>:root {{ {light}; }} body[data-jp-theme-light="false"], .klviz-theme-dark {{ {dark}; }}</style>'


#: A ``<style>`` element that gives :func:`css`'s custom properties their values, the dark ones on a page
#: marked dark. Panels, check results and the site put it beside their HTML (once is enough on a page;
#: more are harmless).
PAGE_CSS: str = _page_css()


def text_on(background: str) -> str:
    """Black or white, whichever reads better on ``background`` (a fixed colour, e.g. a colour map's)."""
    bg = to_rgb(background)
    return "#000000" if contrast_ratio((0.0, 0.0, 0.0), bg) >= contrast_ratio((1.0, 1.0, 1.0), bg) else "#ffffff"


# -- contrast (WCAG 2) ------------------------------------------------------------------------------

_HEX = re.compile(r"^#([0-9a-fA-F]{3}|[0-9a-fA-F]{6}|[0-9a-fA-F]{8})$")
_RGBA = re.compile(r"^rgba?\(\s*([\d.]+)\s*,\s*([\d.]+)\s*,\s*([\d.]+)\s*(?:,\s*([\d.]+)\s*)?\)$")
_CSS_NAMES = {"black": "#000000", "white": "#ffffff", "transparent": "#00000000"}


def to_rgba(value: str | tuple[float, ...]) -> tuple[float, float, float, float]:
    """A colour (``#rgb``, ``#rrggbb``, ``#rrggbbaa``, ``rgb()``/``rgba()``, black/white, or a tuple of
    floats in [0, 1]) as (r, g, b, a) in [0, 1]."""
    if isinstance(value, tuple):
        r, g, b, *a = (float(v) for v in value)
        return r, g, b, (a[0] if a else 1.0)
    text = _CSS_NAMES.get(value.strip().lower(), value.strip())
    m = _HEX.match(text)
    if m:
        digits = m.group(1)
        if len(digits) == 3:
            digits = "".join(c * 2 for c in digits)
        parts = [int(digits[i : i + 2], 16) / 255 for i in range(0, len(digits), 2)]
        return parts[0], parts[1], parts[2], (parts[3] if len(parts) == 4 else 1.0)
    m = _RGBA.match(text)
    if m:
        r, g, b = (float(m.group(i)) / 255 for i in (1, 2, 3))
        return r, g, b, float(m.group(4)) if m.group(4) is not None else 1.0
    raise ValueError(f"value must be a colour (#hex, rgb(), rgba() or a tuple), got {value!r}")


def to_rgb(value: str | tuple[float, ...]) -> tuple[float, float, float]:
    """A colour as (r, g, b) in [0, 1], its alpha ignored (see :func:`blend`)."""
    r, g, b, _ = to_rgba(value)
    return r, g, b


def blend(colour_: str | tuple[float, ...], background: str | tuple[float, ...]) -> tuple[float, float, float]:
    """``colour_`` painted with its alpha over the opaque ``background``: the colour the eye sees."""
    r, g, b, a = to_rgba(colour_)
    br, bg, bb = to_rgb(background)
    return (a * r + (1 - a) * br, a * g + (1 - a) * bg, a * b + (1 - a) * bb)


def relative_luminance(rgb: str | tuple[float, ...]) -> float:
    """WCAG 2's relative luminance of an opaque colour."""

    def linear(c: float) -> float:
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = to_rgb(rgb)
    return 0.2126 * linear(r) + 0.7152 * linear(g) + 0.0722 * linear(b)


def contrast_ratio(a: str | tuple[float, ...], b: str | tuple[float, ...]) -> float:
    """WCAG 2's contrast ratio of two opaque colours, from 1 (same) to 21 (black on white)."""
    la, lb = sorted((relative_luminance(a), relative_luminance(b)), reverse=True)
    return (la + 0.05) / (lb + 0.05)


# -- checking HTML --------------------------------------------------------------------------------

_VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}
_CSS_COLOR = re.compile(r"(?:^|;)\s*color\s*:\s*([^;]+)", re.I)
_CSS_BACKGROUND = re.compile(r"(?:^|;)\s*background(?:-color)?\s*:\s*([^;]+)", re.I)
_CSS_VAR = re.compile(r"^var\(\s*--([\w-]+)\s*(?:,\s*(.+))?\)$")


def resolve_css_colour(value: str, which: str) -> tuple[float, float, float, float]:
    """A CSS colour as the page of theme ``which`` shows it: :func:`css`'s custom properties take their
    value for that theme, any other ``var()`` its fallback."""
    value = value.strip().removesuffix("!important").strip()
    m = _CSS_VAR.match(value)
    if m:
        name, fallback = m.group(1), m.group(2)
        if name.startswith("klviz-") and name[6:] in NAMED:
            return to_rgba(colour(name[6:], which))
        if fallback is None:
            raise ValueError(f"value: {value!r} has no fallback and is not one of klviz's colours")
        return resolve_css_colour(fallback, which)
    return to_rgba(value)


def html_contrast_problems(text: str, which: str, *, minimum: float = MIN_CONTRAST) -> list[str]:
    """The pieces of text in the HTML ``text`` that read below ``minimum`` on a page of theme ``which``.

    Follows the colours set by inline ``style`` attributes (``color``, ``background``), inherited as a
    browser inherits them, over the page's own background and text colour (:data:`PAGE`). A colour that
    cannot be read is a problem too. Style sheets (``<style>``) and scripts are not interpreted.
    """
    from html.parser import HTMLParser

    page = PAGE[which]
    problems: list[str] = []

    class Walker(HTMLParser):
        def __init__(self) -> None:
            super().__init__(convert_charrefs=True)
            # per open element: (text colour rgba, background as seen: opaque rgb, tag)
            self.stack: list[tuple[tuple[float, float, float, float], tuple[float, float, float], str]] = [
                (to_rgba(page["text"]), to_rgb(page["background"]), "page")
            ]
            self.skip = 0

        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            if tag in ("style", "script"):
                self.skip += 1
                return
            if tag in _VOID:
                return
            fg, bg, _ = self.stack[-1]
            style = dict(attrs).get("style") or ""
            try:
                for m in _CSS_BACKGROUND.finditer(style):
                    bg = blend(resolve_css_colour(m.group(1), which), bg)
                for m in _CSS_COLOR.finditer(style):
                    fg = resolve_css_colour(m.group(1), which)
            except ValueError as err:
                problems.append(f"<{tag} style={style!r}>: {err}")
            self.stack.append((fg, bg, tag))

        def handle_endtag(self, tag: str) -> None:
            if tag in ("style", "script"):
                self.skip = max(0, self.skip - 1)
                return
            for i in range(len(self.stack) - 1, 0, -1):  # close up to the matching element
                if self.stack[i][2] == tag:
                    del self.stack[i:]
                    break

        def handle_data(self, data: str) -> None:
            if self.skip or not data.strip():
                return
            fg, bg, _ = self.stack[-1]
            seen = blend(fg, bg)
            ratio = contrast_ratio(seen, bg)
            if ratio < minimum:
                problems.append(
                    f"{data.strip()[:40]!r}: {ratio:.2f}:1 on a {which} page "
                    f"(text {_hex(seen)} on {_hex(bg)}; needs {minimum}:1)"
                )

    walker = Walker()
    walker.feed(text)
    walker.close()
    return problems


def _hex(rgb: tuple[float, ...]) -> str:
    return "#" + "".join(f"{round(255 * c):02x}" for c in rgb[:3])
