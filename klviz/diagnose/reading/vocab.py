"""``--vocab FILE``: token strings for a dump's ``token_ids``, from a JSON vocabulary or a text file."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import numpy as np

from .core import MAX_TOKEN_CHARS, RolloutFileError, escape_text
from .safetensors import parse_json
from .sources import open_regular

__all__ = ["read_vocab"]

_MAX_VOCAB_BYTES = 256 << 20
_ID = re.compile(r"-?[0-9]{1,18}\Z")  # a token id written as a key: an int64, ASCII digits only


def _token(text: object) -> str:
    """A vocabulary entry as a report shows it: at most ``MAX_TOKEN_CHARS`` characters (``…`` marks a cut)."""
    s = str(text)
    return s if len(s) <= MAX_TOKEN_CHARS else s[: MAX_TOKEN_CHARS - 1] + "…"


def read_vocab(path: str | Path) -> Callable[[np.ndarray], list[str]]:
    """A function from token ids to strings, from ``--vocab FILE``: a JSON list (id -> token), a JSON
    object ``{token: id}`` (``vocab.json``) or a ``tokenizer.json`` (its ``model.vocab``), or a text file
    with one token per line (line number = id). Entries longer than ``MAX_TOKEN_CHARS`` are cut (they
    only label tokens in the report)."""
    p = Path(path)
    name = f"--vocab {escape_text(p, 120)}"
    try:
        fh = open_regular(p)
    except RolloutFileError as err:
        raise RolloutFileError(f"{name}: {err}") from None
    with fh:
        data = fh.read(_MAX_VOCAB_BYTES + 1)
    if len(data) > _MAX_VOCAB_BYTES:
        raise RolloutFileError(f"{name}: the file is larger than 256 MiB: refused")
    text = data.decode("utf-8", errors="replace")
    table: dict[int, str] = {}
    if p.suffix.lower() == ".json":
        obj = parse_json(text, name)
        if isinstance(obj, dict) and isinstance(obj.get("model"), dict) and "vocab" in obj["model"]:
            obj = obj["model"]["vocab"]
        if isinstance(obj, list):
            table = {i: _token(t) for i, t in enumerate(obj)}
        elif isinstance(obj, dict):
            for k, v in obj.items():
                if isinstance(v, int) and not isinstance(v, bool) and abs(v) < 1 << 63:
                    table[v] = _token(k)
                elif _ID.match(str(k)):
                    table[int(k)] = _token(v)
        else:
            raise RolloutFileError(f"{name}: expected a JSON list or object")
    else:
        table = {i: _token(t) for i, t in enumerate(text.split("\n"))}

    def lookup(ids: np.ndarray) -> list[str]:
        return [table.get(int(i), f"<id {int(i)}>") for i in np.asarray(ids).reshape(-1)]

    return lookup
