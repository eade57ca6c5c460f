"""The static site: every lesson executed and written as HTML that opens from disk with no server.

    python -m klviz.site                       # all lessons -> build/site  (make site)
    python -m klviz.site notebooks/00_start_here.ipynb --out /tmp/site

Each notebook runs in a fresh kernel with ``KLVIZ_STATIC=1``: ``klviz.setup_notebook()`` then picks
inline PNG figures, and each panel, when displayed, renders its figure and readout at several
positions of its main control (and of a second one where the lesson needs it; the table is
:data:`STATIC_CONTROLS`). The page gets a slider per swept control that swaps the precomputed frames
with a few lines of inline JavaScript: no kernel, no server, no external script (an HTML page has no
kernel, so the widgets themselves would show nothing). The frames are written once each, by content,
to ``_static/frames/``. nbconvert writes one page per lesson with links to the previous and next
lesson and to the index; links between lessons (``01_x.ipynb#Section``) become links between pages;
exercise solutions and cells that only assert sit in closed ``<details>`` blocks. Math is typeset by
a copy of MathJax (with its STIX-Web fonts) placed in ``_static/`` when the ``jupyter-server-mathjax``
package is installed (so the pages need no network), else from a CDN.

Both editions. The English lessons are written at the site's root and the Chinese ones, built from
the same notebooks and the catalogues in ``notebooks/locale/`` (:mod:`klviz.i18n`), under ``zh/``
with the same file names: ``zh/02_three_estimators.html`` is lesson 02 in Chinese, and links between
lessons, to the claims page and to the downloads work the same way in both folders. Every page has a
language switch to the same page in the other edition, the right ``lang`` attribute (``zh-Hans`` on
the Chinese pages) and the CJK font klviz ships (:mod:`klviz.fonts`) by ``@font-face`` from a copy
in its own folder's ``_static/fonts/`` (a browser may refuse a font from a parent folder of a page
opened from disk); MathJax and the panels' frames are shared, in the root's ``_static/``. The
Chinese lessons run with ``KLVIZ_LANG=zh``, so the library's own words in them are Chinese too.

Why not Jupyter Book 2 / MyST: tried (``jupyter-book`` 2.1.7, mystmd 1.11): its build downloads the
site theme from api.mystmd.org, which a build without the network cannot reach, and its HTML is a
Remix application meant to be served over HTTP, not opened from disk (jupyter-book/mystmd#188).
"""

from __future__ import annotations

import argparse
import ast
import base64
import hashlib
import html
import os
import re
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

import nbformat

if TYPE_CHECKING:
    from nbconvert import HTMLExporter

from .fonts import FONT_FILE, LICENSE_FILE, font_face_css, font_path, jupyterlab_css
from .labcmd import lesson_paths
from .notebook_format import CHECK_TAG, clean_text
from .palette import PAGE_CSS
from .widgets.static import (
    PRECOMPUTED_NOTE,
    STATIC_CONTROLS,
    STATIC_PANEL_MIME,
    render_static_panel,
    static_panel_html,
)

__all__ = [
    "LessonPage",
    "STATIC_CONTROLS",
    "execute_notebook",
    "lesson_title",
    "render_lesson",
    "build_site",
    "static_panel_html",
    "clean_html",
    "build_wheel",
    "site_editions",
    "EDITION_FOLDERS",
    "main",
]

CDN_MATHJAX = "https://cdnjs.cloudflare.com/ajax/libs/mathjax/2.7.7/MathJax.js?config=TeX-AMS_CHTML-full,Safe"
LOCAL_MATHJAX = "_static/mathjax/MathJax.js?config=TeX-AMS-MML_HTMLorMML-full,Safe"

#: MathJax 2 setup for every page, before MathJax loads: jupyter-server-mathjax ships the STIX-Web
#: fonts only, and MathJax's default TeX web fonts would be asked for (and 404) otherwise. MathJax's
#: blank test font is declared as a local font: its default, ``url('about:blank')``, is a request that a
#: page opened from disk refuses, with two errors in the console.
MATHJAX_CONFIG = """<script type="text/x-mathjax-config">
MathJax.Hub.Config({
  tex2jax: {inlineMath: [['$','$'], ['\\\\(','\\\\)']], displayMath: [['$$','$$'], ['\\\\[','\\\\]']],
            processEscapes: true, processEnvironments: true},
  "HTML-CSS": {availableFonts: [], preferredFont: null, webFont: "STIX-Web", imageFont: null,
               styles: {"@font-face": {"font-family": "MathJax_Blank", src: "local('MathJax_Blank')"}}},
  SVG: {font: "STIX-Web"},
  messageStyle: "none"
});
</script>
<style>/* the hidden MathML that MathJax adds for screen readers would ask for MathJax's TeX fonts */
.MJX_Assistive_MathML, .MJX_Assistive_MathML * { font-family: inherit !important; }</style>"""

# Extends nbconvert's "lab" template: navigation, collapsed solutions and checks, no require.js or
# mermaid from the network (a page on disk needs neither).
_TEMPLATE = r"""
{%- extends 'lab/index.html.j2' -%}
{%- block html_head_js_requirejs -%}{%- endblock html_head_js_requirejs -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
{%- block html_head_js_mathjax -%}
{{ resources.klviz.mathjax_config }}
{{ super() }}
{%- endblock html_head_js_mathjax -%}
{% block extra_css %}
{{ resources.klviz.page_css }}
{{ resources.klviz.alternate }}
<style type="text/css">
{{ resources.klviz.font_css }}
body.jp-Notebook { max-width: 1000px; margin: 0 auto; padding: 0 16px; }
nav.klviz-nav { display: flex; justify-content: space-between; gap: 12px; padding: 10px 0;
  font-family: var(--jp-ui-font-family, sans-serif); font-size: 14px; border-bottom: 1px solid #ddd; }
nav.klviz-nav.bottom { border-top: 1px solid #ddd; border-bottom: none; margin-top: 24px; }
nav.klviz-nav a { text-decoration: none; }
nav.klviz-nav a.klviz-lang-switch { margin-left: 14px; padding: 1px 8px; border: 1px solid #c8d3e0;
  border-radius: 4px; }
p.klviz-download a, nav.klviz-nav a { color: #1f5fa8; }
p.klviz-precomputed-note, p.klviz-download { font-family: var(--jp-ui-font-family, sans-serif); font-size: 13px;
  color: #555;  background: #f6f8fa; border: 1px solid #e1e4e8; border-radius: 4px; padding: 6px 10px; margin: 10px 0; }
details.klviz-solution, details.klviz-checks { margin: 4px 0 12px 0; }
details.klviz-solution > summary, details.klviz-checks > summary { cursor: pointer; color: #1f5fa8;
  font-family: var(--jp-ui-font-family, sans-serif); }
details.klviz-checks > summary { color: #595959; font-size: 12px; }
.klviz-live-select { font-size: 13px; padding: 2px 4px; }
.klviz-live, .klviz-snapshot { font-family: var(--jp-ui-font-family, sans-serif); }
.klviz-live-controls { display: flex; flex-wrap: wrap; gap: 4px 24px; margin: 6px 0; font-size: 13px; }
.klviz-live-controls label { display: flex; align-items: center; gap: 8px; }
.klviz-live-controls input[type=range] { width: 260px; }
.klviz-live-controls output { min-width: 6em; font-weight: 600; }
.klviz-live-note { color: #666; font-size: 90%; }
.jp-OutputArea-output img { max-width: 100%; height: auto; }
</style>
{% endblock extra_css %}
{%- macro klviz_nav(where) -%}
<nav class="klviz-nav {{ where }}">
  <span>{% if resources.klviz.prev %}<a class="klviz-prev" href="{{ resources.klviz.prev.href }}">
    &larr; {{ resources.klviz.prev.title | e }}</a>{% endif %}</span>
  <span><a class="klviz-index" href="index.html">{{ resources.klviz.words.all_lessons }}</a>
    {{- resources.klviz.switch }}</span>
  <span>{% if resources.klviz.next %}<a class="klviz-next" href="{{ resources.klviz.next.href }}">
    {{ resources.klviz.next.title | e }} &rarr;</a>{% endif %}</span>
</nav>
{%- endmacro -%}
{%- block body_header -%}
{{ super() }}
{{ klviz_nav('top') }}
<p class="klviz-precomputed-note">{{ resources.klviz.words.note }}</p>
{%- if resources.klviz.download %}
<p class="klviz-download">{{ resources.klviz.download }}</p>
{%- endif %}
{%- endblock body_header -%}
{% block body_footer %}
{{ klviz_nav('bottom') }}
{{ super() }}
{% endblock body_footer %}
{% block codecell %}
{%- if cell.metadata.get('jupyter', {}).get('source_hidden') -%}
<details class="klviz-solution"><summary>{{ resources.klviz.words.solution }}</summary>
{{ super() }}
</details>
{%- elif cell.metadata.get('klviz_checks') -%}
<details class="klviz-checks"><summary>{{ resources.klviz.words.checks
  | replace("{n}", cell.metadata.klviz_checks | string)
  | replace("{s}", "s" if cell.metadata.klviz_checks > 1 else "") }}</summary>
{{ super() }}
</details>
{%- else -%}
{{ super() }}
{%- endif -%}
{% endblock codecell %}
"""

# -- the editions: where their pages go, how they are marked, the words the site adds to a lesson ------
#: Each edition's folder in the site, relative to its root.
EDITION_FOLDERS = {"en": "", "zh": "zh/"}
#: The ``lang`` attribute of each edition's pages (BCP 47: Simplified Chinese is ``zh-Hans``).
HTML_LANG = {"en": "en", "zh": "zh-Hans"}
#: How the language switch names each edition, in that edition's own language.
LANGUAGE_NAMES = {"en": "English", "zh": "中文"}
#: Where each edition's folder holds its copy of the CJK font.
FONT_FOLDER = "_static/fonts"

#: The site's own words on each edition's pages (the lessons' words come from the lessons).
WORDS: dict[str, dict[str, str]] = {
    "en": {
        "all_lessons": "All lessons",
        "note": PRECOMPUTED_NOTE,
        "download": 'To run this lesson yourself, <a class="klviz-download-lesson" href="{href}" download="{name}">'
        'download it ({name})</a>; <a href="index.html#downloads">all lessons and the package</a> are on the '
        "index page, with how to run them.",
        "solution": "Solution (click to show)",
        "checks": "Checks: {n} assert{s} on the numbers above (click to show)",
        "switch": "English version",
    },
    "zh": {
        "all_lessons": "全部课程",
        "note": "这些面板是预先算好的：滑块在构建时画好的各个位置之间切换，背后没有内核。"
        "要使用实时面板（每个控件、任意取值），就运行这一课：在仓库目录中 <code>pip install .</code>"
        "（或从 wheel 安装）之后运行 <code>klviz lab --lang zh</code>，或者在仓库目录中运行 "
        "<code>make lab LANG=zh</code>。",
        "download": '想自己运行这一课，就<a class="klviz-download-lesson" href="{href}" download="{name}">'
        '下载它（{name}）</a>；<a href="index.html#downloads">全部课程和 klviz 包</a>都在课程目录里，并附有运行方法。',
        "solution": "参考答案（点开查看）",
        "checks": "检查：对上面数字的 {n} 条断言（点开查看）",
        "switch": "中文版",
    },
}


def site_editions(notebooks: list[Path], langs: list[str] | None = None) -> list[str]:
    """The editions a site of ``notebooks`` has: ``langs`` (edition codes, English first), or by default
    English and every edition whose catalogues are beside the notebooks (``locale/zh_CN/LC_MESSAGES``)."""
    from .i18n import EDITIONS, LOCALES, edition, locale_dir

    if langs is not None:
        chosen = {edition(lang) for lang in langs}
        if not chosen:
            raise ValueError("langs: no edition chosen")
        return [code for code in EDITIONS if code in chosen]
    folder = notebooks[0].parent if notebooks else None
    found = [
        code
        for code in EDITIONS
        if code == "en" or (folder is not None and (locale_dir(folder) / LOCALES[code] / "LC_MESSAGES").is_dir())
    ]
    return found


def _edition_sources(notebooks: list[Path], lang: str, folder: Path) -> list[Path]:
    """The notebooks of edition ``lang``: the English ones themselves, or each translated from its catalogues
    (``klviz.i18n.translate_lesson``; text without a current translation keeps its English) into
    ``folder``, with the claims page of that edition beside them for the downloads."""
    import json

    from .i18n import translate_lesson, write_claims_page
    from .notebook_format import dumps

    if lang == "en":
        return notebooks
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for path in notebooks:
        nb = translate_lesson(json.loads(path.read_text(encoding="utf-8")), path.stem, lang, path.parent)
        (folder / path.name).write_text(dumps(nb), encoding="utf-8")
        written.append(folder / path.name)
    if (notebooks[0].parent / "claims.md").is_file():
        write_claims_page(notebooks[0].parent, folder, lang, written)
    return written


def _switch(lang: str, other: str | None, page: str) -> dict[str, str] | None:
    """The language switch of a page of edition ``lang`` to the same ``page`` in edition ``other``."""
    if other is None:
        return None
    up = "../" * EDITION_FOLDERS[lang].count("/")
    return {
        "href": up + EDITION_FOLDERS[other] + page,
        "hreflang": HTML_LANG[other],
        "label": LANGUAGE_NAMES[other],
        "title": WORDS[other]["switch"],
    }


def _switch_html(switch: dict[str, str] | None) -> str:
    if switch is None:
        return ""
    return (
        f'<a class="klviz-lang-switch" href="{html.escape(switch["href"])}" hreflang="{switch["hreflang"]}" '
        f'lang="{switch["hreflang"]}" title="{html.escape(switch["title"])}">{html.escape(switch["label"])}</a>'
    )


def _alternate_link(switch: dict[str, str] | None) -> str:
    if switch is None:
        return ""
    return f'<link rel="alternate" hreflang="{switch["hreflang"]}" href="{html.escape(switch["href"])}">'


def _font_css(page_font_stack: str | None = None) -> str:
    """The CJK font for a page of the site (from its edition folder's ``_static/fonts/``): its
    ``@font-face``, first in JupyterLab's font variables (lesson pages) or in ``page_font_stack``'s place."""
    url = f"{FONT_FOLDER}/{FONT_FILE.name}"
    if page_font_stack is None:
        return jupyterlab_css(url)
    from .fonts import FAMILY

    return font_face_css(url) + f'body {{ font-family: "{FAMILY}", {page_font_stack}; }}\n'


def _copy_font(folder: Path) -> None:
    """The CJK font and its licence into ``folder/_static/fonts``."""
    target = folder / FONT_FOLDER
    target.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(font_path(), target / FONT_FILE.name)
    if LICENSE_FILE.is_file():
        shutil.copyfile(LICENSE_FILE, target / LICENSE_FILE.name)


def _mark_lang(page_html: str, lang: str) -> str:
    """The page's ``<html lang>`` as :data:`HTML_LANG` says (nbconvert accepts ISO 639-1 codes only)."""
    return re.sub(r'<html lang="[^"]*"', f'<html lang="{HTML_LANG[lang]}"', page_html, count=1)


_HREF_IPYNB = re.compile(r'href="(?![a-zA-Z][a-zA-Z0-9+.-]*:|/|#)([^"#?]*?)\.ipynb((?:#[^"]*)?)"')


@dataclass
class LessonPage:
    """One lesson of the site: its notebook, page file name, title, summary and build time."""

    source: Path
    page: str
    title: str
    summary: str
    seconds: float = float("nan")
    #: the edition (``"en"``, ``"zh"``): the page is ``EDITION_FOLDERS[lang] + page`` in the site
    lang: str = "en"


@contextmanager
def _static_environment(lang: str | None = None) -> Iterator[None]:
    """Kernels started inside inherit ``KLVIZ_STATIC=1`` and no forced matplotlib backend, and with
    ``lang`` the edition's language (``KLVIZ_LANG``, :func:`klviz.servers.edition_env`): the library's
    words in the lesson's outputs, and in the panels this process renders, are that edition's."""
    from .servers import LANG_VARIABLE, edition_env

    saved = {k: os.environ.get(k) for k in ("KLVIZ_STATIC", "MPLBACKEND", LANG_VARIABLE)}
    os.environ["KLVIZ_STATIC"] = "1"
    os.environ.pop("MPLBACKEND", None)
    if lang is not None:
        if LANG_VARIABLE in edition_env(lang, {}):
            os.environ[LANG_VARIABLE] = lang
        else:
            os.environ.pop(LANG_VARIABLE, None)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def execute_notebook(
    path: str | os.PathLike[str], *, timeout: int = 600, lang: str | None = None
) -> nbformat.NotebookNode:
    """Run the notebook top to bottom in a fresh ``python3`` kernel, in its own folder, in static mode
    (and, with ``lang``, in that edition's language: ``KLVIZ_LANG``).

    ``timeout`` bounds each cell in seconds. Raises ``nbclient.exceptions.CellExecutionError`` (with
    the cell and the traceback) when a cell fails. The kernel talks to this process over Unix sockets
    in a private folder (IPC): nothing listens on a TCP port, and ipykernel has no reason to warn that
    its traffic is unencrypted.
    """
    import tempfile

    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError
    from traitlets.config import Config

    path = Path(path)
    for attempt in (1, 2):
        nb = nbformat.read(path, as_version=4)
        with tempfile.TemporaryDirectory(prefix="klviz-kernel-") as sockets:
            try:
                with _static_environment(lang):
                    ipc = Config({"KernelManager": {"transport": "ipc", "ip": str(Path(sockets) / "kernel")}})
                    NotebookClient(
                        nb,
                        config=ipc,
                        timeout=timeout,
                        kernel_name="python3",
                        store_widget_state=False,
                        resources={"metadata": {"path": str(path.parent.resolve())}},
                    ).execute()
                return nb
            except (CellExecutionError, CellTimeoutError):
                raise
            except Exception:  # noqa: BLE001 - the kernel did not start: once more
                if attempt == 2:
                    raise
    raise AssertionError("unreachable")  # pragma: no cover


def _markdown_text(nb: nbformat.NotebookNode) -> str:
    for cell in nb.cells:
        if cell.cell_type == "markdown" and cell.source.strip():
            return cell.source
    return ""


def lesson_title(nb: nbformat.NotebookNode, fallback: str) -> tuple[str, str]:
    """(title, summary) from the first Markdown cell: its first ``#`` heading, and its "What you will
    learn" list (with the bold line that opens it) or, without one, the first paragraph after the
    heading (Markdown, rendered later)."""
    text = _markdown_text(nb)
    title, summary = fallback, ""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("# "):
            title = line[2:].strip()
            rest = lines[i + 1 :]
            summary = _learn_list(rest)
            if not summary:
                body = "\n".join(rest).strip()
                summary = body.split("\n\n")[0].strip() if body else ""
            break
    return title, summary


_LEARN = re.compile(r"^\s*\*\*(?:What you will learn|你将学到)\*\*\s*[:：]?\s*$", re.I)


def _learn_list(lines: list[str]) -> str:
    """The "**What you will learn**" line and the list below it (blank lines before the list allowed,
    items and their indented continuations and sub-items kept), or ``""``."""
    for i, line in enumerate(lines):
        if _LEARN.match(line):
            kept, j = [line.strip(), ""], i + 1
            while j < len(lines) and not lines[j].strip():
                j += 1
            while (
                j < len(lines)
                and lines[j].strip()
                and (re.match(r"\s*([-*+]|\d+[.)])\s", lines[j]) or lines[j].startswith((" ", "\t")))
            ):
                kept.append(lines[j].rstrip())
                j += 1
            return "\n".join(kept).strip() if len(kept) > 2 else ""
    return ""


def _inline_markdown(text: str) -> str:
    """``text`` (one line of Markdown: inline code, emphasis) as HTML without the enclosing paragraph,
    sanitised (Markdown lets raw HTML through: a heading's ``<script>`` must not reach the index)."""
    from nbconvert.filters.markdown import markdown2html

    out = clean_html(markdown2html(text)).strip()
    if out.startswith("<p>") and out.endswith("</p>"):
        out = out[3:-4]
    return out


# -- sanitising what comes from the lessons ---------------------------------------------------------

#: Attributes kept (every other one goes: ``onerror=``, ``onclick=``, ...).
_ALLOWED_ATTRIBUTES: dict[str, set[str]] = {
    "*": {"class", "style", "title", "lang", "dir", "align"},
    "a": {"href", "hreflang", "name", "id"},
    "img": {"src", "alt", "width", "height"},
    "td": {"colspan", "rowspan"},
    "th": {"colspan", "rowspan", "scope"},
    "ol": {"start"},
    **{f"h{n}": {"id"} for n in range(1, 7)},  # the anchors nbconvert gives headings
}
#: CSS properties kept in ``style`` attributes (the colours, spacing and layout the readouts use).
_ALLOWED_CSS = {
    "color", "background", "background-color", "font-size", "font-weight", "font-style", "font-family",
    "font-variant-numeric", "text-align", "text-decoration", "vertical-align", "white-space", "line-height",
    "padding", "padding-left", "padding-right", "padding-top", "padding-bottom",
    "margin", "margin-left", "margin-right", "margin-top", "margin-bottom",
    "border", "border-top", "border-bottom", "border-left", "border-right", "border-radius", "border-collapse",
    "border-spacing", "outline", "outline-offset", "display", "width", "max-width", "min-width", "height", "opacity",
}  # fmt: skip
_STYLE_BLOCK = re.compile(r"<style\b[^>]*>(.*?)(?:</style\s*>|\Z)", re.I | re.S)
_UNSAFE_CSS = re.compile(r"url\s*\(|@import|expression\s*\(|javascript:|behavior\s*:|\\|<", re.I)


def _set_style_blocks_aside(fragment: str) -> tuple[str, dict[str, str]]:
    """``fragment`` with each ``<style>`` block replaced by a placeholder no notebook can know in advance
    (a random token), and ``{placeholder: block}`` for the blocks that load nothing and hide no escape;
    the others are dropped. (ammonia cannot keep style elements while it filters style attributes.)"""
    import secrets

    token = secrets.token_hex(12)
    kept: dict[str, str] = {}

    def aside(m: re.Match[str]) -> str:
        if _UNSAFE_CSS.search(m.group(1)):
            return ""
        key = f"klviz-style-{token}-{len(kept)}"
        kept[key] = f"<style>{m.group(1)}</style>"
        return key

    return _STYLE_BLOCK.sub(aside, fragment), kept


def _url_filter(element: str, attribute: str, value: str) -> str | None:
    """Keep a ``data:`` URL only as an image's source; drop a style that loads something."""
    if attribute in ("href", "src") and value.strip().lower().startswith("data:"):
        return value if element == "img" and value.strip().lower().startswith("data:image/") else None
    if attribute == "style" and _UNSAFE_CSS.search(value):
        return None
    return value


def clean_html(fragment: str | bytes) -> str:
    """HTML from a lesson (its Markdown rendered, an output's HTML) made safe for a page: no scripts,
    no event handlers (``onerror=``), no ``javascript:`` or other non-web links, only inline styles of
    listed properties and ``<style>`` blocks that load nothing. Uses nh3 (Rust's ammonia), a maintained
    sanitiser; every page's HTML from a notebook goes through it (nbconvert's ``clean_html`` filter)."""
    import nh3

    text = fragment.decode() if isinstance(fragment, bytes) else str(fragment)
    text, styles = _set_style_blocks_aside(text)
    clean = nh3.clean(
        text,
        tags=set(nh3.ALLOWED_TAGS),
        clean_content_tags={"script", "style"},
        attributes=_ALLOWED_ATTRIBUTES,
        url_schemes={"http", "https", "mailto", "data"},
        attribute_filter=_url_filter,
        filter_style_properties=_ALLOWED_CSS,
        link_rel=None,
        strip_comments=True,
    )
    for key, block in styles.items():
        clean = clean.replace(key, block)
    return clean


def _plain_title(title: str) -> str:
    """A title for places that show plain text (``<title>``, the navigation): Markdown marks removed."""
    return re.sub(r"[`*]", "", title)


def _short_title(title: str) -> str:
    """The navigation's title: the plain title up to its colon (``:`` or the full-width ``：``)."""
    return re.split(r"[:：]", _plain_title(title))[0].strip()


def assert_only(source: str) -> int:
    """The number of statements of a code cell that is nothing but ``assert`` statements (and
    comments), else 0 (also for cells that are not plain Python, e.g. with magics)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return 0
    body = tree.body
    return len(body) if body and all(isinstance(node, ast.Assert) for node in body) else 0


def _page_name(path: Path) -> str:
    return path.stem + ".html"


def rewrite_links(page_html: str) -> str:
    """Relative links to ``X.ipynb`` (with an optional ``#fragment``) become links to ``X.html``."""
    return _HREF_IPYNB.sub(lambda m: f'href="{m.group(1)}.html{m.group(2)}"', page_html)


def _exporter(mathjax_url: str, lang: str = "en") -> HTMLExporter:
    """nbconvert's HTML exporter with the site's template, sanitising Markdown cells and outputs
    (``sanitize_html``: its ``clean_html`` filter is :func:`clean_html`; JavaScript outputs are dropped)."""
    import jinja2
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(
        template_name="lab",
        extra_loaders=[jinja2.DictLoader({"klviz_site.html.j2": _TEMPLATE})],
        template_file="klviz_site.html.j2",
        mathjax_url=mathjax_url,
        exclude_input_prompt=True,
        exclude_output_prompt=True,
        sanitize_html=True,
        language_code=lang,
    )
    exporter.register_filter("clean_html", clean_html)
    return exporter


_WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def _without_widget_views(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """A copy without widget outputs: a page on disk has no kernel to render them, and their
    text fallback (``VBox(children=...)``) is noise. Panels leave a PNG snapshot beside them."""
    nb = nbformat.from_dict(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = [o for o in cell.outputs if _WIDGET_VIEW not in o.get("data", {})]
    return nb


def _mark_checks(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Mark the code cells that only assert (``metadata.klviz_checks`` = how many asserts): the page
    collapses them, they check the lesson rather than teach it."""
    for cell in nb.cells:
        if cell.cell_type == "code" and not cell.metadata.get("jupyter", {}).get("source_hidden"):
            n = assert_only(cell.source)
            if n:
                cell.metadata["klviz_checks"] = n
    return nb


def render_lesson(
    nb: nbformat.NotebookNode,
    page: LessonPage,
    prev: LessonPage | None,
    next_: LessonPage | None,
    *,
    mathjax_url: str = LOCAL_MATHJAX,
    panels: dict[str, str] | None = None,
    download: str | None = None,
    other: str | None = None,
) -> str:
    """The HTML page of an executed lesson of edition ``page.lang``, with navigation, the language switch
    to the same lesson in edition ``other`` (None: no switch) and rewritten lesson links.

    Everything from the notebook is sanitised (:func:`clean_html`); ``panels`` maps the placeholders
    that :func:`precomputed_panels` left in the outputs to the panels' HTML, which the builder wrote
    itself and which is put in after sanitising. ``download``: the URL that saves the lesson (:func:`lesson_download`).
    """
    lang = page.lang

    def ref(p: LessonPage | None) -> dict | None:  # short titles in the navigation bar
        return None if p is None else {"href": p.page, "title": _short_title(p.title)}

    words = WORDS[lang]
    name = page.source.name if page.source is not None else ""
    switch = _switch(lang, other, page.page)
    nb = fold_check_cells(_mark_checks(_without_widget_views(nb)))
    resources = {
        "klviz": {
            "prev": ref(prev),
            "next": ref(next_),
            "words": words,
            "mathjax_config": MATHJAX_CONFIG,
            "page_css": PAGE_CSS,
            "font_css": _font_css(),
            "switch": _switch_html(switch),
            "alternate": _alternate_link(switch),
            "download": words["download"].format(href=html.escape(download), name=html.escape(name))
            if download
            else "",
        },
        "metadata": {"name": _plain_title(page.title)},
    }
    body, _ = _exporter(mathjax_url, lang).from_notebook_node(nb, resources=resources)
    for slot, panel_html in (panels or {}).items():
        body = body.replace(slot, panel_html)
    return _mark_lang(rewrite_claim_links(rewrite_links(body)), lang)


# -- claims and checks: the page of claims with their evidence, and the lessons' check cells ---------
CLAIMS_SOURCE = "claims.md"
CLAIMS_PAGE = "claims.html"
_HREF_CLAIMS = re.compile(r'href="(?:\./)?claims\.md((?:#[^"]*)?)"')


def fold_check_cells(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Code cells tagged ``klviz-check`` (a lesson's regression checks) go into the closed "Checks" block,
    not the "Solution" one: they are stored with their source collapsed like a solution, so the collapse
    flag is dropped here and ``metadata.klviz_checks`` (how many asserts, at least 1) set instead."""
    for cell in nb.cells:
        if cell.cell_type != "code" or CHECK_TAG not in cell.metadata.get("tags", []):
            continue
        try:
            asserts = sum(isinstance(node, ast.Assert) for node in ast.walk(ast.parse(cell.source)))
        except SyntaxError:
            asserts = 0
        cell.metadata["klviz_checks"] = max(asserts, 1)
        cell.metadata.get("jupyter", {}).pop("source_hidden", None)
    return nb


def rewrite_claim_links(page_html: str) -> str:
    """Relative links to the claims page, ``claims.md#claim-id``, become links to ``claims.html#claim-id``."""
    return _HREF_CLAIMS.sub(lambda m: f'href="{CLAIMS_PAGE}{m.group(1)}"', page_html)


#: The font stack of the index and the claims page (the CJK font goes first: it serves CJK characters only).
_PAGE_FONTS = '-apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif'

_CLAIMS_HTML = """<!DOCTYPE html>
<html lang="{lang}"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1.0">
<title>{title}</title>
{alternate}
{mathjax_config}
<script src="{mathjax}"></script>
<style>
{font_css}
body {{ max-width: 920px; margin: 32px auto; padding: 0 16px; color: #222; line-height: 1.5; }}
nav.klviz-nav {{ padding: 8px 0 12px 0; border-bottom: 1px solid #ddd; font-size: 14px; }}
h2 {{ margin-top: 28px; font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 1.15em; }}
h2:target {{ background: #fff7d6; }}
blockquote {{ margin: 8px 0; padding: 4px 12px; border-left: 3px solid #1f5fa8; background: #f6f8fa; }}
a.anchor-link {{ visibility: hidden; margin-left: 6px; text-decoration: none; }}
h2:hover a.anchor-link {{ visibility: visible; }}
code {{ background: #f4f4f4; padding: 1px 4px; border-radius: 3px; }}
nav.klviz-nav a.klviz-lang-switch {{ margin-left: 14px; }}
p.klviz-claims-note {{ color: #444; background: #f6f8fa; border: 1px solid #e1e4e8; border-radius: 4px;
  padding: 6px 10px; }}
</style></head>
<body>
<nav class="klviz-nav"><a class="klviz-index" href="index.html">{all_lessons}</a>{switch}</nav>
{note}
{body}
</body></html>
"""

#: The claims page's own words per edition: its title, and on a translated edition's page the sentence that
#: says which part stays English (each test's own output; the entries are translated, klviz.claims_text).
_CLAIMS_WORDS = {
    "en": {"title": "klviz: claims and their evidence", "note": ""},
    "zh": {
        "title": "klviz：声明及其证据",
        "note": '<p class="klviz-claims-note">课程中的“在 N …上检验”标记都链接到这里对应的条目。'
        "每条的“最接近推翻它的情形”是测试程序的输出，保留英文。</p>",
    },
}


def render_claims_page(
    markdown_text: str, *, mathjax_url: str = LOCAL_MATHJAX, lang: str = "en", other: str | None = None
) -> str:
    """The claims page as HTML for edition ``lang`` (with the switch to edition ``other``): each claim's
    heading keeps its id as the anchor the lessons link to (``claims.html#claim-id``), and its links to
    lessons point at their pages (of the same edition). A translated edition's ``claims.md`` is translated
    already (:func:`klviz.i18n.build_edition`); the page says that the tests' outputs in it stay English."""
    from nbconvert.filters.markdown import markdown2html

    body = clean_html(markdown2html(markdown_text))
    # every claim heading carries its id as an anchor (the id is lower-case words and hyphens)
    body = re.sub(
        r"<h2>([a-z0-9]+(?:-[a-z0-9]+)*)</h2>",
        lambda m: f'<h2 id="{m.group(1)}">{m.group(1)}<a class="anchor-link" href="#{m.group(1)}">&#182;</a></h2>',
        body,
    )
    body = rewrite_links(body)
    switch = _switch(lang, other, CLAIMS_PAGE)
    words = _CLAIMS_WORDS[lang]
    return _CLAIMS_HTML.format(
        body=body,
        mathjax=html.escape(mathjax_url),
        mathjax_config=MATHJAX_CONFIG,
        lang=HTML_LANG[lang],
        title=html.escape(words["title"]),
        note=words["note"],
        all_lessons=html.escape(WORDS[lang]["all_lessons"]),
        switch=_switch_html(switch),
        alternate=_alternate_link(switch),
        font_css=_font_css(_PAGE_FONTS),
    )


def write_claims_page(
    source: Path, out: Path, *, mathjax_url: str = LOCAL_MATHJAX, lang: str = "en", other: str | None = None
) -> Path | None:
    """Write ``out/claims.html`` (edition ``lang``, switch to ``other``) from the ``claims.md`` beside the
    lessons in ``source`` (or the shipped one); returns its path, or None when there is no claims page to render."""
    candidates = [Path(source) / CLAIMS_SOURCE]
    try:
        from .labcmd import shipped_notebooks_dir

        candidates.append(shipped_notebooks_dir() / CLAIMS_SOURCE)
    except FileNotFoundError:  # pragma: no cover - no shipped lessons: only the given folder counts
        pass
    for path in candidates:
        if path.is_file():
            target = Path(out) / CLAIMS_PAGE
            target.write_text(
                render_claims_page(path.read_text(encoding="utf-8"), mathjax_url=mathjax_url, lang=lang, other=other),
                encoding="utf-8",
            )
            return target
    return None


_CLAIMS_LINK = {
    "en": '<p class="klviz-claims-link">Every general sentence in a lesson links to its evidence: '
    '<a href="{page}">claims and the property tests that check them</a>.</p>\n',
    "zh": '<p class="klviz-claims-link">课程中每一句陈述一般规律的话都链接到它的证据：'
    '<a href="{page}">各条声明以及检验它们的性质测试</a>。</p>\n',
}


def add_claims_link(index_html: str, lang: str = "en") -> str:
    """The index page with a link to the claims page above its footer."""
    return index_html.replace("<footer>", _CLAIMS_LINK[lang].format(page=CLAIMS_PAGE) + "<footer>", 1)


# -- panels on the static site: precomputed frames along their main controls -----------------------

_DATA_PNG = re.compile(r"^data:image/png;base64,([A-Za-z0-9+/=]+)$")


def precomputed_panels(nb: nbformat.NotebookNode, out: Path, prefix: str = "") -> tuple[int, dict[str, str]]:
    """Write each panel's precomputed positions (outputs of type ``STATIC_PANEL_MIME``) as the site's own
    HTML, its frames as files in ``out/_static/frames/`` (one per distinct image, named by content).

    The output is replaced by a placeholder that no notebook can know in advance (a fresh random
    token); :func:`render_lesson` puts the panel's HTML there after sanitising the rest. Returns the
    bytes of new frames written and ``{placeholder: panel HTML}``. ``prefix`` leads from the page's folder
    to ``out`` (``"../"`` for the pages of ``out/zh/``): the frames of both editions are one set.
    """
    import secrets

    folder = out / "_static" / "frames"
    written = 0
    panels: dict[str, str] = {}
    token = secrets.token_hex(16)

    def save(src: str) -> str:
        nonlocal written
        m = _DATA_PNG.match(src)
        if m is None:
            return ""  # a frame the builder did not make: left out
        data = base64.b64decode(m.group(1))
        name = hashlib.sha1(data).hexdigest()[:20] + ".png"
        path = folder / name
        if not path.exists():
            folder.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            written += len(data)
        return f"{prefix}_static/frames/{name}"

    for cell in nb.cells:
        for output in cell.get("outputs", []):
            data = output.get("data", {}).get(STATIC_PANEL_MIME)
            if data is None:
                continue
            data = dict(data)
            data["frames"] = [{**f, "src": save(str(f.get("src", "")))} for f in data.get("frames", [])]
            slot = f"klviz-panel-{token}-{len(panels)}"
            try:
                panels[slot] = render_static_panel(data, clean=clean_html)
            except (KeyError, TypeError, ValueError) as err:
                panels[slot] = f"<p>(a panel could not be shown: {html.escape(str(err))})</p>"
            output["data"] = {"text/html": f"<div>{slot}</div>"}
    return written, panels


def _copy_mathjax(out: Path) -> str:
    """Copy MathJax 2 (from ``jupyter-server-mathjax``) into ``out/_static/mathjax``; returns the
    URL pages use (the CDN when the package is not installed)."""
    try:
        import jupyter_server_mathjax
    except ImportError:
        print(
            "klviz site: jupyter-server-mathjax is not installed, pages load MathJax from a CDN "
            "(math needs the network); `pip install jupyter-server-mathjax` to ship it with the site",
            file=sys.stderr,
        )
        return CDN_MATHJAX
    src = Path(jupyter_server_mathjax.__file__).parent / "static"
    dst = out / "_static" / "mathjax"
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("localization", "*.otf", "*.eot", "*.svg"))
    return LOCAL_MATHJAX


_INDEX = """<!DOCTYPE html>
<html lang="{lang}"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1.0">
<title>{title}</title>
{alternate}
{page_css}
{mathjax_config}
<script src="{mathjax}"></script>
<style>
{font_css}
body {{ max-width: 860px; margin: 40px auto; padding: 0 16px; color: #222; line-height: 1.5; }}
nav.klviz-nav {{ text-align: right; font-size: 14px; }}
nav.klviz-nav a.klviz-lang-switch {{ padding: 1px 8px; border: 1px solid #c8d3e0; border-radius: 4px;
  text-decoration: none; }}
h1 {{ margin-bottom: 4px; }} .sub {{ color: #555; margin-top: 0; }}
ol.lessons {{ padding-left: 0; list-style: none; }}
ol.lessons > li {{ margin: 14px 0; padding: 10px 14px; border: 1px solid #e2e2e2; border-radius: 6px; }}
ol.lessons a.klviz-lesson {{ font-size: 1.15em; font-weight: 600; text-decoration: none; }}
.summary {{ color: #444; margin-top: 4px; }} .summary p {{ margin: 4px 0; }}
.summary ul, .summary ol {{ margin: 4px 0; padding-left: 22px; }} .summary li {{ margin: 2px 0; }}
code, pre {{ background: #f4f4f4; padding: 1px 4px; border-radius: 3px; }}
section.klviz-downloads {{ border-top: 1px solid #ddd; margin-top: 24px; }}
section.klviz-downloads li {{ margin: 6px 0; }}
footer {{ color: #595959; font-size: 90%; margin-top: 32px; border-top: 1px solid #ddd; padding-top: 8px; }}
</style></head>
<body>
{switch}
{header}
<ol class="lessons">
{items}
</ol>
{downloads}
<footer>{footer}</footer>
</body></html>
"""

#: The index's own words per edition: title, heading and introduction, footer.
_INDEX_WORDS = {
    "en": {
        "title": "klviz lessons",
        "header": """<h1>klviz: KL divergence from sampled tokens</h1>
<p class="sub">How RL for language models (PPO, GRPO; verl, TRL, OpenRLHF) estimates KL divergence with k1, k2 and k3,
why it works, when it misleads, and what the gradients do. A static copy: every lesson executed, and each panel's
sliders step through positions precomputed when the site was built (no kernel, no server).</p>""",
        "footer": """Built {when} with klviz {version}: every lesson executed on CPU (KLVIZ_STATIC=1) and converted
with nbconvert; the panels' frames were rendered at build time.""",
    },
    "zh": {
        "title": "klviz 课程",
        "header": "<h1>klviz：用采样到的词元估计 KL 散度</h1>\n"
        '<p class="sub">语言模型的强化学习（PPO、GRPO；verl、TRL、OpenRLHF）如何用 k1、k2 和 k3 估计 KL 散度，'
        "它为什么成立，什么时候会误导人，以及梯度实际做了什么。这是一个静态副本：每一课都已执行，"
        "每个面板的滑块在构建时预先算好的位置之间切换（没有内核，也没有服务器）。</p>",
        "footer": "构建于 {when}，klviz {version}：每一课都在 CPU 上执行（KLVIZ_STATIC=1，KLVIZ_LANG=zh），"
        "用 nbconvert 转换；面板的画面在构建时生成。",
    },
}


_DOWNLOADS_EN = """<section class="klviz-downloads" id="downloads">
<h2>Run the lessons yourself</h2>
<p class="klviz-install">This copy cannot run code: to move every control of the panels and try the exercises,
run the lessons in JupyterLab. klviz is not on a package index; everything needed is here:</p>
<ul>
{items}
</ul>
<p>Then, in a terminal (Python 3.10 or later): install a CPU build of PyTorch with
<code>pip install torch --index-url https://download.pytorch.org/whl/cpu</code> (or the build for your GPU), then
<code>pip install {wheel_name}</code>, then <code>klviz lab</code>: it copies the lessons into
<code>./klviz-lessons</code> and opens JupyterLab there. A lesson you downloaded alone opens in that JupyterLab
too. From a checkout of the repository, <code>make lab</code> does all of this (or <code>pip install .</code>
and <code>klviz lab</code>); a wheel is built there with <code>pip wheel --no-deps .</code>.</p>
</section>"""

# (no line breaks inside Chinese sentences: a browser shows a break between two CJK characters as a space)
_DOWNLOADS_ZH = (
    '<section class="klviz-downloads" id="downloads">\n<h2>自己运行这些课程</h2>\n'
    '<p class="klviz-install">这个副本不能运行代码：要拖动面板的每个控件、动手做练习，就在 JupyterLab 中运行这些课程。'
    "klviz 没有发布到 PyPI 这样的包索引上；所需的一切都在这里：</p>\n<ul>\n{items}\n</ul>\n"
    "<p>然后在终端里（Python 3.10 或更高版本）：先用 "
    "<code>pip install torch --index-url https://download.pytorch.org/whl/cpu</code> "
    "安装 CPU 版 PyTorch（或适合你的 GPU 的版本），再 <code>pip install {wheel_name}</code>，"
    "然后运行 <code>klviz lab --lang zh</code>：它把中文课程复制到 <code>./klviz-lessons-zh</code> "
    "并在那里打开 JupyterLab。单独下载的一课也可以在这个 JupyterLab 中打开。"
    "在仓库目录中，<code>make lab LANG=zh</code> 会完成这一切（或者 <code>pip install .</code> 之后运行 "
    "<code>klviz lab --lang zh</code>）；wheel 在仓库目录中用 <code>pip wheel --no-deps .</code> 构建。</p>\n"
    "</section>"
)

#: The downloads section per edition: its frame, and the words of its items.
_DOWNLOADS = {
    "en": {
        "section": _DOWNLOADS_EN,
        "zip": "All lessons (.zip)</a>: the notebooks, the claims page and the wheel when there is one, with a "
        "<code>README.txt</code> on how to run them (everything in it works without the network once PyTorch is "
        "installed).",
        "wheel": "The klviz package (wheel)</a>: the library the lessons import, with the lessons inside it.",
        "one": "One lesson at a time: the link at the top of each lesson's page.",
    },
    "zh": {
        "section": _DOWNLOADS_ZH,
        "zip": "全部中文课程（.zip）</a>：notebook、声明列表，以及（如果有的话）wheel，附一个说明如何运行它们的 "
        "<code>README.txt</code>（装好 PyTorch 之后，其中的一切都能离线使用）。",
        "wheel": "klviz 包（wheel）</a>：课程导入的库，课程也包含在其中。",
        "one": "单独一课：每一课开头的下载链接。",
    },
}


def _downloads_html(downloads: dict[str, str], lang: str = "en") -> str:
    """The index's section of downloads: the zip of all lessons and the wheel."""
    words = _DOWNLOADS[lang]
    items = []
    if "zip" in downloads:
        items.append(
            f'<li><a class="klviz-download-zip" href="{html.escape(downloads["zip"])}" download>{words["zip"]}</li>'
        )
    if "wheel" in downloads:
        items.append(
            f'<li><a class="klviz-download-wheel" href="{html.escape(downloads["wheel"])}" download>'
            f"{words['wheel']}</li>"
        )
    items.append(f"<li>{words['one']}</li>")
    wheel = Path(downloads["wheel"]).name if "wheel" in downloads else "klviz-VERSION-py3-none-any.whl"
    return words["section"].format(items="\n".join(items), wheel_name=html.escape(wheel))


def render_index(
    pages: list[LessonPage],
    *,
    mathjax_url: str = LOCAL_MATHJAX,
    downloads: dict[str, str] | None = None,
    lang: str = "en",
    other: str | None = None,
) -> str:
    """The index page of edition ``lang`` (with the switch to edition ``other``'s index): one card per
    lesson, linking to its page, with what the lesson teaches, and the downloads (``{"zip": path,
    "wheel": path}``, relative to the page)."""
    from nbconvert.filters.markdown import markdown2html

    from . import __version__

    items = []
    for p in pages:
        summary = clean_html(markdown2html(p.summary)) if p.summary else ""
        items.append(
            f'<li><a class="klviz-lesson" href="{html.escape(p.page)}">{_inline_markdown(p.title)}</a>'
            f'<div class="summary">{rewrite_links(summary)}</div></li>'
        )
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    words = _INDEX_WORDS[lang]
    switch = _switch(lang, other, "index.html")
    return _INDEX.format(
        lang=HTML_LANG[lang],
        title=words["title"],
        header=words["header"],
        footer=words["footer"].format(when=when, version=html.escape(__version__)),
        switch=f'<nav class="klviz-nav">{_switch_html(switch)}</nav>' if switch else "",
        alternate=_alternate_link(switch),
        font_css=_font_css(_PAGE_FONTS),
        items="\n".join(items),
        mathjax=html.escape(mathjax_url),
        mathjax_config=MATHJAX_CONFIG,
        page_css=PAGE_CSS,
        downloads=_downloads_html(downloads or {}, lang),
    )


# -- what a reader takes away: each lesson, all of them as a zip, the wheel ---------------------------

DOWNLOADS = "downloads"

_ZIP_README = """klviz {version}: the lessons, to run on your own machine
=======================================================

klviz is not on a package index; this folder has what you need besides PyTorch.

1. Python 3.10 or later. In a terminal, in this folder:
       python -m venv .venv && . .venv/bin/activate          (Windows: .venv\\Scripts\\activate)
2. PyTorch, a CPU build (no multi-GB download; for a GPU, the build for your CUDA):
       pip install torch --index-url https://download.pytorch.org/whl/cpu
3. klviz itself, from the wheel in this folder (it brings JupyterLab and the widgets):
       pip install {wheel}
4. Open the lessons:
       klviz lab .
   JupyterLab opens on this folder (on 127.0.0.1, with a token); start with 00_start_here.ipynb.

Once PyTorch and klviz are installed, nothing needs the network: the lessons, their data and the tiny
language model ship inside the package.{no_wheel}
"""

_ZIP_README_ZH = """klviz {version}：中文课程，在你自己的机器上运行
==============================================

klviz 不在软件包索引上；除了 PyTorch，你需要的一切都在这个文件夹里。

1. Python 3.10 或更高版本。在终端里，进入这个文件夹：
       python -m venv .venv && . .venv/bin/activate          （Windows：.venv\\Scripts\\activate）
2. PyTorch，CPU 版（不用下载好几 GB；有 GPU 的话装对应 CUDA 的版本）：
       pip install torch --index-url https://download.pytorch.org/whl/cpu
3. klviz 本身，用这个文件夹里的 wheel 安装（它会带上 JupyterLab 和各种控件）：
       pip install {wheel}
4. 打开课程：
       klviz lab --lang zh .
   JupyterLab 在这个文件夹上打开（只监听 127.0.0.1，带 token）；从 00_start_here.ipynb 开始。

装好 PyTorch 和 klviz 之后，一切都不需要网络：课程、数据和微型语言模型都在包里。{no_wheel}
"""
_ZIP = {
    "en": {
        "readme": _ZIP_README,
        "folder": "klviz-lessons",
        "no_wheel": "\n\nThis zip was built without the wheel: build it from a checkout with `pip wheel --no-deps .`.",
    },
    "zh": {
        "readme": _ZIP_README_ZH,
        "folder": "klviz-lessons-zh",
        "no_wheel": "\n\n这个 zip 构建时没有带上 wheel：在仓库目录中用 `pip wheel --no-deps .` 构建它。",
    },
}


def _checkout_root() -> Path | None:
    """The repository klviz runs from (an editable install or the source tree), if it is one."""
    root = Path(__file__).resolve().parents[1]
    pyproject = root / "pyproject.toml"
    try:
        if pyproject.is_file() and re.search(r'^name = "klviz"$', pyproject.read_text(encoding="utf-8"), re.M):
            return root
    except OSError:
        pass
    return None


def build_wheel(dest: Path, source: Path | None = None, *, log: Callable[[str], object] = print) -> Path | None:
    """Build klviz's wheel from ``source`` (default: the checkout klviz runs from) into ``dest``.

    Returns its path, or None (said in the log) where klviz is not running from a checkout or the
    build fails. Tries the installed setuptools first (no network), then pip's isolated build.
    """
    import subprocess
    import tempfile

    source = source or _checkout_root()
    if source is None:
        log("klviz site: not running from a checkout, so no wheel to offer (build one with `pip wheel --no-deps .`)")
        return None
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="klviz-wheel-") as tmp:
        for isolation in (["--no-build-isolation"], []):
            cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", *isolation, "-w", tmp, str(source)]
            done = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, PIP_NO_INPUT="1"))
            wheels = sorted(Path(tmp).glob("klviz-*.whl"))
            if done.returncode == 0 and wheels:
                target = dest / wheels[-1].name
                shutil.copy(wheels[-1], target)
                return target
        log(f"klviz site: the wheel did not build, so the site offers none:\n{done.stderr.strip()[-1500:]}")
    return None


def lesson_download(path: Path) -> str:
    """The lesson in its stored form (no outputs) as a ``data:`` URL: a link with a ``download``
    attribute saves it as a file even from a page opened from disk, where a browser shows a linked
    ``.ipynb`` file as text instead (it ignores ``download`` for ``file:`` links)."""
    text = clean_text(path.read_text(encoding="utf-8"))
    return "data:application/x-ipynb+json;base64," + base64.b64encode(text.encode("utf-8")).decode("ascii")


def write_downloads(
    notebooks: list[Path],
    out: Path,
    *,
    wheel: Path | None,
    log: Callable[[str], object] = print,
    lang: str = "en",
    wheel_href: str | None = None,
) -> dict[str, str]:
    """Put the wheel and a zip of every lesson (in its stored form, no outputs), the claims page and the
    wheel, with a README, in ``out/downloads/``; returns their paths relative to ``out`` (``"zip"``,
    ``"wheel"``). Each lesson's own page offers the lesson itself (:func:`lesson_download`).

    ``lang``: the edition of ``notebooks`` (its README and the zip's name: ``klviz-lessons-zh-<version>.zip``).
    ``wheel_href``: where the wheel already is, relative to ``out`` (the other edition's copy): not copied again."""
    import zipfile

    from . import __version__

    folder = out / DOWNLOADS
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    found: dict[str, str] = {}
    if wheel is not None and wheel_href is None:
        shutil.copy(wheel, folder / wheel.name)
        found["wheel"] = f"{DOWNLOADS}/{wheel.name}"
    elif wheel is not None and wheel_href is not None:
        found["wheel"] = wheel_href
    words = _ZIP[lang]
    top = words["folder"]
    zip_name = f"{top}-{__version__}.zip"
    readme = words["readme"].format(
        version=__version__,
        wheel=wheel.name if wheel else f"klviz-{__version__}-py3-none-any.whl",
        no_wheel="" if wheel else words["no_wheel"],
    )
    claims = notebooks[0].parent / "claims.md" if notebooks else None
    with zipfile.ZipFile(folder / zip_name, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr(f"{top}/README.txt", readme)
        for path in notebooks:
            z.writestr(f"{top}/{path.name}", clean_text(path.read_text(encoding="utf-8")))
        if claims is not None and claims.is_file():
            z.write(claims, f"{top}/claims.md")
        if wheel is not None:
            z.write(wheel, f"{top}/{wheel.name}")
    found["zip"] = f"{DOWNLOADS}/{zip_name}"
    log(f"klviz site: wrote {folder} ({zip_name}{' and the wheel' if wheel else ''})")
    return found


def _build_edition(
    lang: str,
    sources: list[Path],
    out: Path,
    *,
    other: str | None,
    mathjax_url: str,
    downloads: dict[str, str],
    timeout: int,
    keep_going: bool,
    jobs: int,
    log: Callable[[str], object],
) -> tuple[list[LessonPage], list[str]]:
    """Execute edition ``lang``'s notebooks (``sources``) with ``KLVIZ_LANG`` set for it and write its pages,
    claims page and index into its folder of the site ``out``; returns the pages built and the failures
    (raised at once unless ``keep_going``)."""
    from concurrent.futures import ThreadPoolExecutor

    from nbclient.exceptions import CellExecutionError, CellTimeoutError

    folder = out / EDITION_FOLDERS[lang]
    up = "../" * EDITION_FOLDERS[lang].count("/")  # from the edition's folder back to the site's root
    pages = []
    for path in sources:
        title, summary = lesson_title(nbformat.read(path, as_version=4), path.stem)
        pages.append(LessonPage(path, _page_name(path), title, summary, lang=lang))

    def run(page: LessonPage) -> nbformat.NotebookNode | str:
        """The executed lesson, or the message that says why it failed."""
        t0 = time.perf_counter()
        log(f"klviz site: running {EDITION_FOLDERS[lang]}{page.source.name} ...")
        try:
            executed = execute_notebook(page.source, timeout=timeout, lang=lang)
        except (CellExecutionError, CellTimeoutError) as err:
            return f"{EDITION_FOLDERS[lang]}{page.source.name} failed:\n{err}"
        page.seconds = time.perf_counter() - t0
        return executed

    failures: list[str] = []
    built: list[LessonPage] = []
    with _static_environment(lang), ThreadPoolExecutor(max_workers=jobs) as pool:
        results = [pool.submit(run, page) for page in pages]
        for i, (page, future) in enumerate(zip(pages, results)):
            executed = future.result()
            if isinstance(executed, str):  # the lesson failed: this is why
                if not keep_going:
                    for later in results[i + 1 :]:
                        later.cancel()
                    raise RuntimeError(executed)
                failures.append(executed)
                continue
            frame_bytes, panels = precomputed_panels(executed, out, prefix=up)
            prev = pages[i - 1] if i > 0 else None
            next_ = pages[i + 1] if i + 1 < len(pages) else None
            page_html = render_lesson(
                executed,
                page,
                prev,
                next_,
                mathjax_url=mathjax_url,
                panels=panels,
                download=lesson_download(page.source),
                other=other,
            )
            (folder / page.page).write_text(page_html, encoding="utf-8")
            built.append(page)
            log(
                f"klviz site: wrote {folder / page.page} ({page.seconds:.1f} s, "
                f"{frame_bytes / 1e6:.1f} MB of new panel frames)"
            )
    claims = write_claims_page(sources[0].parent, folder, mathjax_url=mathjax_url, lang=lang, other=other)
    index = render_index(pages, mathjax_url=mathjax_url, downloads=downloads, lang=lang, other=other)
    (folder / "index.html").write_text(add_claims_link(index, lang) if claims else index, encoding="utf-8")
    if claims:
        log(f"klviz site: wrote {claims}")
    return built, failures


def build_site(
    notebooks: list[Path] | None = None,
    out: str | os.PathLike[str] = "build/site",
    *,
    timeout: int = 600,
    keep_going: bool = False,
    jobs: int = 2,
    wheel: str | os.PathLike[str] | None = None,
    langs: list[str] | None = None,
    log: Callable[[str], object] = print,
) -> list[LessonPage]:
    """Execute ``notebooks`` (default: every lesson) and write ``out/index.html`` and one page each, in
    each edition (:func:`site_editions`: ``langs``, or English and every translation beside the
    notebooks): English at ``out/``, Chinese at ``out/zh/``, each page with a switch to the other.

    ``jobs`` lessons run at a time, each in its own kernel. A lesson that fails stops the build with
    its error (``keep_going`` skips it instead and the failures are raised together at the end, after
    the other pages are written). The pages link to their edition's ``downloads/``: each lesson, a zip of
    them all and, with ``wheel`` (a wheel file, or ``"auto"``: built from the checkout klviz runs from),
    the wheel. Returns the pages built, edition by edition.
    """
    import tempfile

    notebooks = [Path(p) for p in (notebooks if notebooks is not None else lesson_paths())]
    if not notebooks:
        raise ValueError("notebooks: no lesson notebooks to build")
    for nb_path in notebooks:
        if nb_path.suffix != ".ipynb" or not nb_path.is_file():
            raise ValueError(f"notebooks: {str(nb_path)!r} is not a notebook file")
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, got {jobs}")
    if wheel is not None and wheel != "auto" and not Path(wheel).is_file():
        raise ValueError(f"wheel: {str(wheel)!r} is not a file (give a wheel, 'auto' or nothing)")
    editions = site_editions(notebooks, langs)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    mathjax_url = _copy_mathjax(out)
    frames = out / "_static" / "frames"
    if frames.exists():
        shutil.rmtree(frames)  # frames of an earlier build would pile up

    built_wheel = build_wheel(out / ".wheel", log=log) if wheel == "auto" else (Path(wheel) if wheel else None)
    failures: list[str] = []
    built: list[LessonPage] = []
    wheel_at: str | None = None  # the wheel's one copy in the site, relative to its root
    try:
        with tempfile.TemporaryDirectory(prefix="klviz-site-") as tmp:
            for lang in editions:
                folder = out / EDITION_FOLDERS[lang]
                up = "../" * EDITION_FOLDERS[lang].count("/")
                sources = _edition_sources(notebooks, lang, Path(tmp) / lang)
                folder.mkdir(parents=True, exist_ok=True)
                _copy_font(folder)
                downloads = write_downloads(
                    sources,
                    folder,
                    wheel=built_wheel,
                    log=log,
                    lang=lang,
                    wheel_href=None if wheel_at is None else up + wheel_at,
                )
                if wheel_at is None and "wheel" in downloads:
                    wheel_at = EDITION_FOLDERS[lang] + downloads["wheel"]
                pages, failed = _build_edition(
                    lang,
                    sources,
                    out,
                    other=next((o for o in editions if o != lang), None),
                    mathjax_url=mathjax_url if mathjax_url == CDN_MATHJAX else up + mathjax_url,
                    downloads=downloads,
                    timeout=timeout,
                    keep_going=keep_going,
                    jobs=jobs,
                    log=log,
                )
                built += pages
                failures += failed
    finally:
        shutil.rmtree(out / ".wheel", ignore_errors=True)
    for lang in editions:
        index = (out / EDITION_FOLDERS[lang] / "index.html").resolve()
        log(f"klviz site: wrote {index}; open it in a browser (file://{index})")
    if failures:
        raise RuntimeError("\n\n".join(failures))
    return built


def main(argv: list[str] | None = None) -> int:
    """``python -m klviz.site [NOTEBOOK ...] [--out DIR] [--lang all|en|zh] [--timeout S] [--keep-going] [--jobs N]
    [--wheel W]``."""
    parser = argparse.ArgumentParser(
        prog="klviz site",
        description="Execute the lessons (static figures) and write an HTML site that opens from disk.",
    )
    parser.add_argument("notebooks", nargs="*", type=Path, help="notebooks to build (default: every lesson)")
    parser.add_argument("--out", default="build/site", help="output folder (default build/site)")
    parser.add_argument("--timeout", type=int, default=600, help="seconds allowed per cell (default 600)")
    parser.add_argument("--keep-going", action="store_true", help="build the other lessons when one fails")
    parser.add_argument("--jobs", type=int, default=2, help="lessons executed at a time (default 2)")
    parser.add_argument(
        "--wheel",
        default="auto",
        help="the wheel the site offers: a .whl file, 'auto' (built from the checkout klviz runs from; "
        "the default) or 'none'",
    )
    parser.add_argument(
        "--lang",
        default="all",
        help="the editions: all (the default: English at the root, Chinese in zh/), en or zh (简体中文版 only)",
    )
    args = parser.parse_args(argv)
    if args.timeout <= 0:
        parser.error(f"--timeout must be positive, got {args.timeout}")
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")
    from .i18n import edition

    try:
        langs = None if args.lang == "all" else [edition(args.lang)]
    except ValueError as err:
        parser.error(f"--lang: {err}")
    try:
        build_site(
            args.notebooks or None,
            args.out,
            timeout=args.timeout,
            keep_going=args.keep_going,
            jobs=args.jobs,
            wheel=None if args.wheel == "none" else args.wheel,
            langs=langs,
        )
    except (ValueError, FileNotFoundError, RuntimeError) as err:
        print(f"klviz site: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
