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
<style type="text/css">
body.jp-Notebook { max-width: 1000px; margin: 0 auto; padding: 0 16px; }
nav.klviz-nav { display: flex; justify-content: space-between; gap: 12px; padding: 10px 0;
  font-family: var(--jp-ui-font-family, sans-serif); font-size: 14px; border-bottom: 1px solid #ddd; }
nav.klviz-nav.bottom { border-top: 1px solid #ddd; border-bottom: none; margin-top: 24px; }
nav.klviz-nav a { text-decoration: none; }
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
  <span><a class="klviz-index" href="index.html">All lessons</a></span>
  <span>{% if resources.klviz.next %}<a class="klviz-next" href="{{ resources.klviz.next.href }}">
    {{ resources.klviz.next.title | e }} &rarr;</a>{% endif %}</span>
</nav>
{%- endmacro -%}
{%- block body_header -%}
{{ super() }}
{{ klviz_nav('top') }}
<p class="klviz-precomputed-note">{{ resources.klviz.note }}</p>
{%- if resources.klviz.download %}
<p class="klviz-download">To run this lesson yourself,
  <a class="klviz-download-lesson" href="{{ resources.klviz.download | e }}"
     download="{{ resources.klviz.download_name | e }}">download it ({{ resources.klviz.download_name | e }})</a>;
  <a href="index.html#downloads">all lessons and the package</a> are on the index page, with how to run them.</p>
{%- endif %}
{%- endblock body_header -%}
{% block body_footer %}
{{ klviz_nav('bottom') }}
{{ super() }}
{% endblock body_footer %}
{% block codecell %}
{%- if cell.metadata.get('jupyter', {}).get('source_hidden') -%}
<details class="klviz-solution"><summary>Solution (click to show)</summary>
{{ super() }}
</details>
{%- elif cell.metadata.get('klviz_checks') -%}
<details class="klviz-checks"><summary>Checks: {{ cell.metadata.klviz_checks }} assert
{{- 's' if cell.metadata.klviz_checks > 1 }} on the numbers above (click to show)</summary>
{{ super() }}
</details>
{%- else -%}
{{ super() }}
{%- endif -%}
{% endblock codecell %}
"""

_HREF_IPYNB = re.compile(r'href="(?![a-zA-Z][a-zA-Z0-9+.-]*:|/|#)([^"#?]*?)\.ipynb((?:#[^"]*)?)"')


@dataclass
class LessonPage:
    """One lesson of the site: its notebook, page file name, title, summary and build time."""

    source: Path
    page: str
    title: str
    summary: str
    seconds: float = float("nan")


@contextmanager
def _static_environment() -> Iterator[None]:
    """Kernels started inside inherit ``KLVIZ_STATIC=1`` and no forced matplotlib backend."""
    saved = {k: os.environ.get(k) for k in ("KLVIZ_STATIC", "MPLBACKEND")}
    os.environ["KLVIZ_STATIC"] = "1"
    os.environ.pop("MPLBACKEND", None)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def execute_notebook(path: str | os.PathLike[str], *, timeout: int = 600) -> nbformat.NotebookNode:
    """Run the notebook top to bottom in a fresh ``python3`` kernel, in its own folder, in static mode.

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
                with _static_environment():
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


_LEARN = re.compile(r"^\s*\*\*What you will learn\*\*\s*:?\s*$", re.I)


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


def _exporter(mathjax_url: str) -> HTMLExporter:
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
) -> str:
    """The HTML page of an executed lesson, with navigation and rewritten lesson links.

    Everything from the notebook is sanitised (:func:`clean_html`); ``panels`` maps the placeholders
    that :func:`precomputed_panels` left in the outputs to the panels' HTML, which the builder wrote
    itself and which is put in after sanitising. ``download``: the URL that saves the lesson (:func:`lesson_download`).
    """

    def ref(p: LessonPage | None) -> dict | None:  # short titles in the navigation bar
        return None if p is None else {"href": p.page, "title": _plain_title(p.title).split(":")[0].strip()}

    nb = fold_check_cells(_mark_checks(_without_widget_views(nb)))
    resources = {
        "klviz": {
            "prev": ref(prev),
            "next": ref(next_),
            "note": PRECOMPUTED_NOTE,
            "mathjax_config": MATHJAX_CONFIG,
            "page_css": PAGE_CSS,
            "download": download,
            "download_name": page.source.name if page.source is not None else "",
        },
        "metadata": {"name": _plain_title(page.title)},
    }
    body, _ = _exporter(mathjax_url).from_notebook_node(nb, resources=resources)
    for slot, panel_html in (panels or {}).items():
        body = body.replace(slot, panel_html)
    return rewrite_claim_links(rewrite_links(body))


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


_CLAIMS_HTML = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1.0">
<title>klviz: claims and their evidence</title>
{mathjax_config}
<script src="{mathjax}"></script>
<style>
body {{ font-family: -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; max-width: 920px;
  margin: 32px auto; padding: 0 16px; color: #222; line-height: 1.5; }}
nav.klviz-nav {{ padding: 8px 0 12px 0; border-bottom: 1px solid #ddd; font-size: 14px; }}
h2 {{ margin-top: 28px; font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 1.15em; }}
h2:target {{ background: #fff7d6; }}
blockquote {{ margin: 8px 0; padding: 4px 12px; border-left: 3px solid #1f5fa8; background: #f6f8fa; }}
a.anchor-link {{ visibility: hidden; margin-left: 6px; text-decoration: none; }}
h2:hover a.anchor-link {{ visibility: visible; }}
code {{ background: #f4f4f4; padding: 1px 4px; border-radius: 3px; }}
</style></head>
<body>
<nav class="klviz-nav"><a class="klviz-index" href="index.html">All lessons</a></nav>
{body}
</body></html>
"""


def render_claims_page(markdown_text: str, *, mathjax_url: str = LOCAL_MATHJAX) -> str:
    """The claims page as HTML: each claim's heading keeps its id as the anchor the lessons link to
    (``claims.html#claim-id``), and its links to lessons point at their pages."""
    from nbconvert.filters.markdown import markdown2html

    body = clean_html(markdown2html(markdown_text))
    # every claim heading carries its id as an anchor (the id is lower-case words and hyphens)
    body = re.sub(
        r"<h2>([a-z0-9]+(?:-[a-z0-9]+)*)</h2>",
        lambda m: f'<h2 id="{m.group(1)}">{m.group(1)}<a class="anchor-link" href="#{m.group(1)}">&#182;</a></h2>',
        body,
    )
    return _CLAIMS_HTML.format(
        body=rewrite_links(body), mathjax=html.escape(mathjax_url), mathjax_config=MATHJAX_CONFIG
    )


def write_claims_page(source: Path, out: Path, *, mathjax_url: str = LOCAL_MATHJAX) -> Path | None:
    """Write ``out/claims.html`` from the ``claims.md`` beside the lessons in ``source`` (or the shipped one);
    returns its path, or None when there is no claims page to render."""
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
                render_claims_page(path.read_text(encoding="utf-8"), mathjax_url=mathjax_url), encoding="utf-8"
            )
            return target
    return None


def add_claims_link(index_html: str) -> str:
    """The index page with a link to the claims page above its footer."""
    link = (
        '<p class="klviz-claims-link">Every general sentence in a lesson links to its evidence: '
        f'<a href="{CLAIMS_PAGE}">claims and the property tests that check them</a>.</p>\n'
    )
    return index_html.replace("<footer>", link + "<footer>", 1)


# -- panels on the static site: precomputed frames along their main controls -----------------------

_DATA_PNG = re.compile(r"^data:image/png;base64,([A-Za-z0-9+/=]+)$")


def precomputed_panels(nb: nbformat.NotebookNode, out: Path) -> tuple[int, dict[str, str]]:
    """Write each panel's precomputed positions (outputs of type ``STATIC_PANEL_MIME``) as the site's own
    HTML, its frames as files in ``out/_static/frames/`` (one per distinct image, named by content).

    The output is replaced by a placeholder that no notebook can know in advance (a fresh random
    token); :func:`render_lesson` puts the panel's HTML there after sanitising the rest. Returns the
    bytes of new frames written and ``{placeholder: panel HTML}``.
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
        return f"_static/frames/{name}"

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
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1.0">
<title>klviz lessons</title>
{page_css}
{mathjax_config}
<script src="{mathjax}"></script>
<style>
body {{ font-family: -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; max-width: 860px;
  margin: 40px auto; padding: 0 16px; color: #222; line-height: 1.5; }}
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
<h1>klviz: KL divergence from sampled tokens</h1>
<p class="sub">How RL for language models (PPO, GRPO; verl, TRL, OpenRLHF) estimates KL divergence with k1, k2 and k3,
why it works, when it misleads, and what the gradients do. A static copy: every lesson executed, and each panel's
sliders step through positions precomputed when the site was built (no kernel, no server).</p>
<ol class="lessons">
{items}
</ol>
{downloads}
<footer>Built {when} with klviz {version}: every lesson executed on CPU (KLVIZ_STATIC=1) and converted with nbconvert;
the panels' frames were rendered at build time.</footer>
</body></html>
"""


_DOWNLOADS = """<section class="klviz-downloads" id="downloads">
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


def _downloads_html(downloads: dict[str, str]) -> str:
    """The index's section of downloads: the zip of all lessons and the wheel."""
    items = []
    if "zip" in downloads:
        items.append(
            f'<li><a class="klviz-download-zip" href="{html.escape(downloads["zip"])}" download>'
            "All lessons (.zip)</a>: "
            "the notebooks, the claims page and the wheel when there is one, with a <code>README.txt</code> on how to "
            "run them (everything in it works without the network once PyTorch is installed).</li>"
        )
    if "wheel" in downloads:
        items.append(
            f'<li><a class="klviz-download-wheel" href="{html.escape(downloads["wheel"])}" download>The klviz '
            "package (wheel)</a>: the library the lessons import, with the lessons inside it.</li>"
        )
    items.append("<li>One lesson at a time: the link at the top of each lesson's page.</li>")
    wheel = Path(downloads["wheel"]).name if "wheel" in downloads else "klviz-VERSION-py3-none-any.whl"
    return _DOWNLOADS.format(items="\n".join(items), wheel_name=html.escape(wheel))


def render_index(
    pages: list[LessonPage], *, mathjax_url: str = LOCAL_MATHJAX, downloads: dict[str, str] | None = None
) -> str:
    """The index page: one card per lesson, linking to its page, with what the lesson teaches, and the
    downloads (``{"zip": path, "wheel": path}``, relative to the page)."""
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
    return _INDEX.format(
        items="\n".join(items),
        mathjax=html.escape(mathjax_url),
        when=when,
        version=html.escape(__version__),
        mathjax_config=MATHJAX_CONFIG,
        page_css=PAGE_CSS,
        downloads=_downloads_html(downloads or {}),
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
    notebooks: list[Path], out: Path, *, wheel: Path | None, log: Callable[[str], object] = print
) -> dict[str, str]:
    """Put the wheel and a zip of every lesson (in its stored form, no outputs), the claims page and the
    wheel, with a README, in ``out/downloads/``; returns their paths relative to ``out`` (``"zip"``,
    ``"wheel"``). Each lesson's own page offers the lesson itself (:func:`lesson_download`)."""
    import zipfile

    from . import __version__

    folder = out / DOWNLOADS
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    found: dict[str, str] = {}
    if wheel is not None:
        shutil.copy(wheel, folder / wheel.name)
        found["wheel"] = f"{DOWNLOADS}/{wheel.name}"
    zip_name = f"klviz-lessons-{__version__}.zip"
    readme = _ZIP_README.format(
        version=__version__,
        wheel=wheel.name if wheel else f"klviz-{__version__}-py3-none-any.whl",
        no_wheel=""
        if wheel
        else "\n\nThis zip was built without the wheel: build it from a checkout with `pip wheel --no-deps .`.",
    )
    claims = notebooks[0].parent / "claims.md" if notebooks else None
    with zipfile.ZipFile(folder / zip_name, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("klviz-lessons/README.txt", readme)
        for path in notebooks:
            z.writestr(f"klviz-lessons/{path.name}", clean_text(path.read_text(encoding="utf-8")))
        if claims is not None and claims.is_file():
            z.write(claims, "klviz-lessons/claims.md")
        if wheel is not None:
            z.write(folder / wheel.name, f"klviz-lessons/{wheel.name}")
    found["zip"] = f"{DOWNLOADS}/{zip_name}"
    log(f"klviz site: wrote {folder} ({zip_name}{' and the wheel' if wheel else ''})")
    return found


def build_site(
    notebooks: list[Path] | None = None,
    out: str | os.PathLike[str] = "build/site",
    *,
    timeout: int = 600,
    keep_going: bool = False,
    jobs: int = 2,
    wheel: str | os.PathLike[str] | None = None,
    log: Callable[[str], object] = print,
) -> list[LessonPage]:
    """Execute ``notebooks`` (default: every lesson) and write ``out/index.html`` and one page each.

    ``jobs`` lessons run at a time, each in its own kernel. A lesson that fails stops the build with
    its error (``keep_going`` skips it instead and the failures are raised together at the end, after
    the other pages are written). The pages link to ``out/downloads/``: each lesson, a zip of them all
    and, with ``wheel`` (a wheel file, or ``"auto"``: built from the checkout klviz runs from), the wheel.
    """
    from concurrent.futures import ThreadPoolExecutor

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
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    mathjax_url = _copy_mathjax(out)
    frames = out / "_static" / "frames"
    if frames.exists():
        shutil.rmtree(frames)  # frames of an earlier build would pile up

    sources = [nbformat.read(p, as_version=4) for p in notebooks]
    pages = []
    for path, nb in zip(notebooks, sources):
        title, summary = lesson_title(nb, path.stem)
        pages.append(LessonPage(path, _page_name(path), title, summary))

    built_wheel = build_wheel(out / ".wheel", log=log) if wheel == "auto" else (Path(wheel) if wheel else None)
    downloads = write_downloads(notebooks, out, wheel=built_wheel, log=log)
    shutil.rmtree(out / ".wheel", ignore_errors=True)

    from nbclient.exceptions import CellExecutionError, CellTimeoutError

    def run(page: LessonPage) -> nbformat.NotebookNode | str:
        """The executed lesson, or the message that says why it failed."""
        t0 = time.perf_counter()
        log(f"klviz site: running {page.source.name} ...")
        try:
            executed = execute_notebook(page.source, timeout=timeout)
        except (CellExecutionError, CellTimeoutError) as err:
            return f"{page.source.name} failed:\n{err}"
        page.seconds = time.perf_counter() - t0
        return executed

    failures: list[str] = []
    built: list[LessonPage] = []
    with _static_environment(), ThreadPoolExecutor(max_workers=jobs) as pool:
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
            frame_bytes, panels = precomputed_panels(executed, out)
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
            )
            (out / page.page).write_text(page_html, encoding="utf-8")
            built.append(page)
            log(
                f"klviz site: wrote {out / page.page} ({page.seconds:.1f} s, "
                f"{frame_bytes / 1e6:.1f} MB of new panel frames)"
            )
    claims = write_claims_page(notebooks[0].parent, out, mathjax_url=mathjax_url)
    index = render_index(pages, mathjax_url=mathjax_url, downloads=downloads)
    (out / "index.html").write_text(add_claims_link(index) if claims else index, encoding="utf-8")
    if claims:
        log(f"klviz site: wrote {claims}")
    log(f"klviz site: wrote {out / 'index.html'}; open it in a browser (file://{(out / 'index.html').resolve()})")
    if failures:
        raise RuntimeError("\n\n".join(failures))
    return built


def main(argv: list[str] | None = None) -> int:
    """``python -m klviz.site [NOTEBOOK ...] [--out DIR] [--timeout S] [--keep-going] [--jobs N] [--wheel W]``."""
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
    args = parser.parse_args(argv)
    if args.timeout <= 0:
        parser.error(f"--timeout must be positive, got {args.timeout}")
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")
    try:
        build_site(
            args.notebooks or None,
            args.out,
            timeout=args.timeout,
            keep_going=args.keep_going,
            jobs=args.jobs,
            wheel=None if args.wheel == "none" else args.wheel,
        )
    except (ValueError, FileNotFoundError, RuntimeError) as err:
        print(f"klviz site: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
