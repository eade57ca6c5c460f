"""The words a lesson's own code cells show, and their translations: figure titles, axis labels, legend
entries and annotations, and the lines the cells print.

A lesson's code exists once, in the English notebook. The Chinese edition is built from it by replacing
each such string literal with its translation, so that a reader of the Chinese lesson sees a Chinese
figure and reads the very code that drew it::

    ax.set_title("the error shrinks like 1/√N")          # notebooks/01_sampling_as_weighting.ipynb
    ax.set_title("误差按 1/√N 缩小")                        # build/lessons-zh/01_sampling_as_weighting.ipynb

Which literals: a string passed to ``print``, ``set_title``, ``set_xlabel``, ``set_ylabel``, ``suptitle``,
``supxlabel``, ``supylabel``, ``title``, ``xlabel``, ``ylabel``, ``text``, ``figtext``, ``annotate``,
``set_label`` or ``set_text`` (both branches of ``a if c else b`` and both sides of ``a + b`` in such a
place), the value of a ``label=``, ``title=``, ``xlabel=`` or ``ylabel=`` keyword of a matplotlib call
(``plot``, ``bar``, ``axhline``, ``legend``, ...: :data:`KEYWORD_CALLS`), and the strings of a literal
sequence that a ``for`` loop binds to a variable whose every use is such a place; each only when it has
English words in it (:func:`has_words`): a formula such as ``"f(t)"`` or ``r"$\\mu$"`` is left as it is. A
string the code also uses otherwise (a key it looks up, a value it compares) is never taken.

Each lesson has a catalogue of them beside the one of its markdown cells,
``notebooks/locale/zh_CN/LC_MESSAGES/NN_topic.code.po``: ``msgctxt`` the cell id, ``msgid`` the literal's
text as written in the source (an f-string's ``{fields}`` included, escapes as written), ``msgstr`` its
translation, which must keep every ``{field}`` and ``$formula$`` of the English unchanged
(:func:`text_problems`). ``scripts/translations.py update`` merges the English into it as ``msgmerge``
does, and ``--check`` fails while a literal has no current translation.
"""

from __future__ import annotations

import ast
import difflib
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from babel.messages.catalog import Catalog, Message

__all__ = [
    "TEXT_CALLS",
    "TEXT_KEYWORDS",
    "KEYWORD_CALLS",
    "CodeText",
    "code_texts",
    "has_words",
    "fields",
    "literal",
    "text_problems",
    "notebook_texts",
    "translations",
    "update_code_catalogue",
    "translate_code",
]

#: Calls whose positional string arguments are shown to the reader.
TEXT_CALLS = frozenset(
    {"print", "set_title", "set_xlabel", "set_ylabel", "suptitle", "supxlabel", "supylabel", "title", "xlabel",
     "ylabel", "text", "figtext", "annotate", "set_label", "set_text"}
)  # fmt: skip
#: Keyword arguments whose string value is shown to the reader, in the calls of :data:`KEYWORD_CALLS`.
TEXT_KEYWORDS = frozenset({"label", "title", "xlabel", "ylabel"})
#: The matplotlib calls whose ``label=`` (``title=``, ...) is a legend entry or a title. Elsewhere such a
#: keyword may be a key (``klviz.tables.table_html(rows, label="target p")`` looks rows up by it).
KEYWORD_CALLS = frozenset(
    {"plot", "scatter", "bar", "barh", "hist", "step", "stairs", "stem", "errorbar", "fill_between", "fill_betweenx",
     "axhline", "axvline", "axhspan", "axvspan", "hlines", "vlines", "loglog", "semilogx", "semilogy", "legend",
     "Line2D", "Patch", "set", "text", "annotate"}
)  # fmt: skip

_PREFIX = re.compile(r"([A-Za-z]{0,2})('''|\"\"\"|'|\")")
_GAP = re.compile(r"(?:\s|\\\n|#[^\n]*)*")
_MATH = re.compile(r"\$[^$]*\$")
_CODE = re.compile(r"`[^`]*`|\b\w*_\w*\b")
_WORD = re.compile(r"[A-Za-z]{3,}|\b(?:of|in|on|to|at|by|vs|is|or|up|no)\b")
_CJK = re.compile(r"[\u3400-\u9fff]")
_NUMBER = re.compile(r"(?<![A-Za-z_\d.,])\d+(?:[.,]\d+)*")
_MAGIC = re.compile(r"^(\s*)[%!]", re.M)


@dataclass(frozen=True)
class CodeText:
    """One string literal a code cell shows: where it is in the cell's source, and its text as written.

    ``text`` is the literal's body, implicitly concatenated parts joined; when any part is an f-string,
    it is written as one f-string body (``{{`` for a brace of a plain part). ``start``/``end`` are
    character offsets of the whole literal (all its parts) in the cell's source."""

    cell: str
    text: str
    start: int
    end: int
    prefix: str  # "", "r", "f" or "rf"
    quote: str
    where: str  # the call it is passed to: "set_title()", "label= of plot()"


def _offset(lines: list[str], lineno: int, col_bytes: int) -> int:
    """The character offset of line ``lineno`` (1-based), UTF-8 byte column ``col_bytes``."""
    line = lines[lineno - 1]
    return sum(len(x) for x in lines[: lineno - 1]) + len(line.encode("utf-8")[:col_bytes].decode("utf-8"))


def _split_parts(segment: str) -> list[tuple[str, str, str]] | None:
    """``(prefix, quote, body)`` of each part of an implicitly concatenated literal; None for bytes."""
    parts: list[tuple[str, str, str]] = []
    i = 0
    while True:
        i = _GAP.match(segment, i).end()  # type: ignore[union-attr]
        if i >= len(segment):
            return parts
        m = _PREFIX.match(segment, i)
        if m is None:
            return None
        prefix, quote = m.group(1).lower(), m.group(2)
        if "b" in prefix:
            return None
        j = m.end()
        while not segment.startswith(quote, j):
            j += 2 if segment[j] == "\\" else 1
        parts.append(("".join(sorted(prefix.replace("u", ""), reverse=True)), quote, segment[m.end() : j]))
        i = j + len(quote)


def _text_of(parts: list[tuple[str, str, str]]) -> tuple[str, str, str] | None:
    """The joined body, the prefix and the quote to write it back with; None where the parts cannot be
    joined into one literal (raw and plain parts mixed, or different quotes)."""
    if len({"r" in p for p, _, _ in parts}) != 1 or len({q for _, q, _ in parts}) != 1:
        return None
    is_f = any("f" in p for p, _, _ in parts)
    raw = "r" in parts[0][0]
    body = "".join(b if ("f" in p or not is_f) else b.replace("{", "{{").replace("}", "}}") for p, _, b in parts)
    return body, ("r" if raw else "") + ("f" if is_f else ""), parts[0][1]


def _call_name(node: ast.Call) -> str | None:
    f = node.func
    if isinstance(f, ast.Attribute):
        return f.attr
    if isinstance(f, ast.Name):
        return f.id
    return None


def has_words(text: str) -> bool:
    """Whether ``text`` has English words for a reader (a word of three letters or more, or a short one
    such as "of" or "vs", outside ``{fields}``, ``$formulas$``, backquoted code and snake_case names)."""
    rest = _MATH.sub(" ", _strip_fields(text))
    rest = _CODE.sub(" ", rest)
    return bool(_WORD.search(rest))


def _strip_fields(text: str) -> str:
    out, depth = [], 0
    i = 0
    while i < len(text):
        ch = text[i]
        if depth == 0 and text.startswith(("{{", "}}"), i):
            out.append(ch)
            i += 2
            continue
        if ch == "{":
            depth += 1
        elif ch == "}" and depth:
            depth -= 1
        elif depth == 0:
            out.append(ch)
        i += 1
    return "".join(out)


def fields(text: str) -> list[str]:
    """The replacement fields of an f-string body, as written (``{x:.3f}``), in order; nested braces
    (``{x:{w}}``) stay inside their field and ``{{``/``}}`` are not fields."""
    found, depth, start = [], 0, 0
    i = 0
    while i < len(text):
        if depth == 0 and text.startswith(("{{", "}}"), i):
            i += 2
            continue
        if text[i] == "{":
            if depth == 0:
                start = i
            depth += 1
        elif text[i] == "}" and depth:
            depth -= 1
            if depth == 0:
                found.append(text[start : i + 1])
        i += 1
    return found


def _is_text(value: ast.expr) -> bool:
    return isinstance(value, ast.JoinedStr) or (isinstance(value, ast.Constant) and isinstance(value.value, str))


def _branches(value: ast.expr) -> list[ast.expr]:
    """The parts of a shown ``value`` that are shown as they are: ``value`` itself, both branches of
    ``a if c else b`` (each shown in its turn), and both sides of ``a + b`` (shown one after the other)."""
    if isinstance(value, ast.IfExp):
        return _branches(value.body) + _branches(value.orelse)
    if isinstance(value, ast.BinOp) and isinstance(value.op, ast.Add):
        return _branches(value.left) + _branches(value.right)
    return [value]


class _Shown:
    """Where a cell's code puts text in front of the reader: text arguments and keywords of the text calls
    (through ``a if c else b``), and the names whose every use is such a place."""

    def __init__(self, tree: ast.Module):
        self.places: dict[int, str] = {}  # id(expression) -> where it is shown
        self.loads: dict[str, list[ast.Name]] = {}
        parents: dict[int, ast.AST] = {}
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                parents[id(child)] = node
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                self.loads.setdefault(node.id, []).append(node)
            if not isinstance(node, ast.Call):
                continue
            name = _call_name(node) or "call"
            args = [(a, f"{name}()") for a in node.args] if name in TEXT_CALLS else []
            if name in KEYWORD_CALLS:
                args += [(k.value, f"{k.arg}= of {name}()") for k in node.keywords if k.arg in TEXT_KEYWORDS]
            for value, where in args:
                for branch in _branches(value):
                    self.places[id(branch)] = where
        self.parents = parents

    def where(self, node: ast.expr) -> str | None:
        """Where ``node`` is shown: itself a text argument, or a ``{field}`` of an f-string that is one."""
        if id(node) in self.places:
            return self.places[id(node)]
        field = self.parents.get(id(node))
        if isinstance(node, ast.Name) and isinstance(field, ast.FormattedValue) and field.value is node:
            fstring = self.parents.get(id(field))
            if fstring is not None and id(fstring) in self.places:
                return self.places[id(fstring)]
        return None

    def shown_only(self, name: str) -> str | None:
        """Where variable ``name`` is shown, when every use of it in the cell shows it; ``""`` when it is
        never used; None when some use does something else with it."""
        uses = [self.where(n) for n in self.loads.get(name, [])]
        if None in uses:
            return None
        if not uses:
            return ""
        return f"`{name}`, shown by {', '.join(sorted(set(u for u in uses if u)))}"


def _looped_texts(tree: ast.Module, shown: _Shown) -> list[tuple[ast.expr, str]]:
    """The string literals of a literal sequence that a ``for`` loop binds to variables only ever shown as
    text: ``for name, label in (("k2", "½(log t)²"), ...)`` with ``label`` used only in ``label=`` takes
    the second strings and never the first. A sequence kept in a variable counts when every use of that
    variable is such a loop, and a position is taken only when every one of those loops shows it."""
    containers: dict[str, ast.Tuple | ast.List] = {}
    assigned: Counter[str] = Counter()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for n in ast.walk(target):
                    if isinstance(n, ast.Name):
                        assigned[n.id] += 1
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                if isinstance(node.value, (ast.Tuple, ast.List)):
                    containers[node.targets[0].id] = node.value
    verdicts: dict[int, list[str | None]] = {}  # id(literal) -> where each loop shows it
    literals: dict[int, ast.expr] = {}
    consumed: Counter[str] = Counter()

    def match(target: ast.expr, element: ast.expr, out: dict[int, str | None]) -> None:
        if isinstance(target, ast.Name):
            for branch in _branches(element):
                if _is_text(branch):
                    out[id(branch)] = shown.shown_only(target.id)
                    literals[id(branch)] = branch
        elif isinstance(target, (ast.Tuple, ast.List)) and isinstance(element, (ast.Tuple, ast.List)):
            if len(target.elts) == len(element.elts):
                for t, e in zip(target.elts, element.elts):
                    match(t, e, out)

    for loop in ast.walk(tree):
        if not isinstance(loop, (ast.For, ast.comprehension)):
            continue
        pairs = [(loop.target, loop.iter)]
        it = loop.iter
        if isinstance(it, ast.Call) and _call_name(it) == "zip" and isinstance(loop.target, ast.Tuple):
            if len(loop.target.elts) == len(it.args) and not it.keywords:
                pairs = list(zip(loop.target.elts, it.args))
        for target, source in pairs:
            sequence: ast.Tuple | ast.List | None = None
            if isinstance(source, (ast.Tuple, ast.List)):
                sequence = source
            elif isinstance(source, ast.Name) and assigned[source.id] == 1 and source.id in containers:
                sequence = containers[source.id]
                consumed[source.id] += 1
            if sequence is None:
                continue
            seen: dict[int, str | None] = {}
            for element in sequence.elts:
                match(target, element, seen)
            for key, where in seen.items():
                verdicts.setdefault(key, []).append(where)
    # a sequence in a variable: every use of the variable must be one of the loops above
    unsafe = {id(e) for name, seq in containers.items() if consumed[name] != len(shown.loads.get(name, []))
              for e in ast.walk(seq)}  # fmt: skip
    out = []
    for key, wheres in verdicts.items():
        if key in unsafe or None in wheres or not any(wheres):
            continue
        out.append((literals[key], "; ".join(sorted({w for w in wheres if w}))))
    return out


def code_texts(source: str, cell: str = "") -> list[CodeText]:
    """The literals a code cell's ``source`` shows to a reader (see the module's docstring), in source
    order. IPython's ``%magic`` and ``!shell`` lines are skipped; a cell Python cannot parse has none."""
    parsable = _MAGIC.sub(lambda m: m.group(1) + "#", source)
    try:
        tree = ast.parse(parsable)
    except SyntaxError:
        return []
    lines = parsable.splitlines(keepends=True)
    shown = _Shown(tree)
    candidates = [(n, w) for n in ast.walk(tree) if isinstance(n, ast.expr) and (w := shown.where(n)) and _is_text(n)]
    found: list[CodeText] = []
    for value, where in candidates + _looped_texts(tree, shown):
        assert value.end_lineno is not None and value.end_col_offset is not None
        start = _offset(lines, value.lineno, value.col_offset)
        end = _offset(lines, value.end_lineno, value.end_col_offset)
        parts = _split_parts(source[start:end])
        joined = _text_of(parts) if parts else None
        if joined is None or not has_words(joined[0]):
            continue
        found.append(CodeText(cell, joined[0], start, end, joined[1], joined[2], where))
    found.sort(key=lambda t: (t.start, -t.end))
    return [t for i, t in enumerate(found) if all(t.start >= u.end for u in found[:i])]  # none inside another


def literal(text: str, prefix: str, quote: str) -> str:
    """``text`` (a body as written in source) as a Python literal with ``prefix`` and ``quote``."""
    return f"{prefix}{quote}{text}{quote}"


def text_problems(english: CodeText, translation: str) -> list[str]:
    """What keeps ``translation`` from standing in for the literal ``english``: it must keep each
    ``{field}`` (f-strings) and ``$formula$`` and every number of the English, be Chinese (or the
    English itself, kept on purpose), and make a literal Python reads as the same kind of string."""
    found = []
    if "f" in english.prefix and Counter(fields(english.text)) != Counter(fields(translation)):
        lost = sorted((Counter(fields(english.text)) - Counter(fields(translation))).elements())
        extra = sorted((Counter(fields(translation)) - Counter(fields(english.text))).elements())
        found.append(f"fields differ: missing {lost}, not in the English {extra}")
    if Counter(_MATH.findall(english.text)) != Counter(_MATH.findall(translation)):
        found.append("formulas ($...$) differ from the English")
    plain_en = _MATH.sub(" ", _strip_fields(english.text) if "f" in english.prefix else english.text)
    plain_zh = _MATH.sub(" ", _strip_fields(translation) if "f" in english.prefix else translation)
    lost_numbers = set(_NUMBER.findall(plain_en)) - set(_NUMBER.findall(plain_zh))
    if lost_numbers:
        found.append(f"numbers of the English missing: {sorted(lost_numbers)}")
    if translation != english.text and not _CJK.search(translation):
        found.append("the translation has no Chinese in it (write the English itself to keep it)")
    code = literal(translation, english.prefix, english.quote)
    try:
        tree = ast.parse(code, mode="eval")
    except SyntaxError as err:
        found.append(f"not a Python literal once written as {code!r}: {err.msg}")
    else:
        want = ast.JoinedStr if "f" in english.prefix else ast.Constant
        if not isinstance(tree.body, want) and not (
            want is ast.JoinedStr and isinstance(tree.body, ast.Constant)  # an f-string without fields
        ):
            found.append(f"written as {code!r} it is no longer one string literal")
    return found


# -- the catalogue ----------------------------------------------------------------------------------
def notebook_texts(nb: Mapping[str, object]) -> list[CodeText]:
    """Every shown literal of every code cell of notebook ``nb``, in cell order."""
    cells = nb.get("cells", [])
    assert isinstance(cells, list)
    out: list[CodeText] = []
    for c in cells:
        if c.get("cell_type") == "code":
            src = c.get("source", "")
            out += code_texts("".join(src) if isinstance(src, list) else str(src), str(c.get("id")))
    return out


def _key(message: Message) -> tuple[str, str]:
    return str(message.context), str(message.id)


def update_code_catalogue(
    nb: Mapping[str, object], old: Catalog | None, stem: str, lang: str = "zh"
) -> tuple[Catalog, list[str]]:
    """Merge the literals lesson ``stem`` shows (``nb``) into its code catalogue ``old``, as ``msgmerge``
    does: an unchanged literal keeps its entry; one whose English changed takes the translation of
    the most similar vanished literal of the same cell, marked fuzzy, with that English as its
    previous msgid; a literal moved to another cell keeps its translation; a vanished literal's
    entry becomes obsolete. Returns the catalogue and a one-line summary per kind of change."""
    from babel.messages.catalog import Message

    from .i18n import CODE_HEADER, HASH_PREFIX, _new_catalogue, carried_over, english_hash

    new = _new_catalogue(lang, f"lesson {stem}", like=old, header=CODE_HEADER)
    live: dict[tuple[str, str], Message] = {_key(m): m for m in old if m.id} if old is not None else {}
    by_text = {str(m.id): m for m in live.values() if m.string and "fuzzy" not in m.flags}
    texts = notebook_texts(nb)
    wanted = {(t.cell, t.text) for t in texts}
    vanished = {k: m for k, m in live.items() if k not in wanted}
    counts: Counter[str] = Counter()
    seen: set[tuple[str, str]] = set()
    for t in texts:
        key = (t.cell, t.text)
        if key in seen:  # the same words twice in a cell: one entry
            continue
        seen.add(key)
        comments = [HASH_PREFIX + english_hash(t.text), f"in {t.where}"]
        string, flags, previous = "", set[str](), None
        prev = live.get(key)
        if prev is not None:
            string, flags, previous = carried_over(prev, t.text)
        elif t.text in by_text:
            string = str(by_text[t.text].string)
            counts["moved"] += 1
        else:
            same_cell = {str(m.id): m for (cid, _), m in vanished.items() if cid == t.cell and m.string}
            close = difflib.get_close_matches(t.text, list(same_cell), n=1, cutoff=0.6)
            if close:
                match = same_cell[close[0]]
                string, flags, previous = carried_over(match, t.text)
                vanished.pop((t.cell, str(match.id)))
                counts["changed (now fuzzy)"] += 1
            else:
                counts["new"] += 1
        new[t.text] = Message(
            t.text,
            string,
            locations=[(f"{stem}.ipynb", 0)],
            flags=flags,
            auto_comments=comments,
            previous_id=[previous] if previous else [],
            context=t.cell,
        )
    for (cid, text), message in vanished.items():
        if message.string:
            new.obsolete[(text, cid)] = message
            counts["obsolete"] += 1
    if old is not None:
        for message in old.obsolete.values():
            new.obsolete.setdefault((str(message.id), str(message.context)), message)
    summary = [f"{n} {kind}" for kind, n in counts.items()]
    return new, summary


def translations(catalog: Catalog | None) -> dict[tuple[str, str], str]:
    """``(cell id, English) -> translation`` for every current (translated, not fuzzy) entry."""
    if catalog is None:
        return {}
    return {_key(m): str(m.string) for m in catalog if m.id and m.string and "fuzzy" not in m.flags}


def translate_code(source: str, cell: str, table: Mapping[tuple[str, str], str]) -> str:
    """Code cell ``source`` with each shown literal that has a current translation in ``table``
    (:func:`translations`) replaced by it; everything else byte for byte."""
    out = source
    for t in reversed(code_texts(source, cell)):
        zh = table.get((t.cell, t.text))
        if zh is not None and not text_problems(t, zh):
            out = out[: t.start] + literal(zh, t.prefix, t.quote) + out[t.end :]
    return out
