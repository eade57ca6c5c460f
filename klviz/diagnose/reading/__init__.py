"""Reading rollout dumps safely, from their headers first, then row by row.

Every format is opened by klviz's own header parser; one judge (:func:`.core.judge`) decides from what
the file *declares* (dtype, shape, strides, storage size) whether to read each array, before anything
is allocated: at most three dimensions (checked before any arithmetic on the shape), at most
``max_tokens`` elements and 8 bytes per element of that cap, token strings of at most
:data:`.core.MAX_TOKEN_CHARS` characters, a view inside its storage with no overlap.

- :mod:`.npz`: each member's ``.npy`` header, parsed (not evaluated) and checked against the member's
  size; object arrays are refused; byte order and Fortran order are honoured.
- :mod:`.pt` (``torch.save``'s zip format): ``data.pkl`` is unpickled by a restricted unpickler, fresh
  for each file, that knows only tensors, dicts, lists, strings and numbers and builds descriptions of
  tensors; anything else is refused before it runs, and ``torch.load`` is never called.
- :mod:`.safetensors`: the JSON header (its length capped) and each tensor's byte range.
- :mod:`.vocab`: ``--vocab`` files.

:func:`open_dump` (:mod:`.dump`) returns a :class:`DumpFile` whose :meth:`~DumpFile.rows` reads
``[rows, tokens]`` slices with memory that does not grow with the batch, in any layout (:mod:`.core`);
:func:`load_rollouts` reads a whole dump into a :class:`RolloutDump`, :func:`rollouts_from_tensors`
validates in-memory tensors, :func:`save_rollouts` writes a dump (:mod:`.tensors`). Every problem is a
:class:`RolloutFileError` whose message is one line with control characters escaped.
"""

from __future__ import annotations

from .core import DEFAULT_MAX_TOKENS, MAX_DIMS, MAX_TOKEN_CHARS, ArraySpec, RolloutFileError, escape_text
from .dump import DEFAULT_KEYS, OPTIONAL_KEYS, DumpFile, open_dump
from .tensors import RolloutDump, load_rollouts, rollouts_from_tensors, sample_rollouts_path, save_rollouts
from .vocab import read_vocab

__all__ = [
    "RolloutFileError",
    "RolloutDump",
    "DumpFile",
    "ArraySpec",
    "DEFAULT_KEYS",
    "OPTIONAL_KEYS",
    "DEFAULT_MAX_TOKENS",
    "MAX_DIMS",
    "MAX_TOKEN_CHARS",
    "load_rollouts",
    "open_dump",
    "rollouts_from_tensors",
    "save_rollouts",
    "sample_rollouts_path",
    "escape_text",
    "read_vocab",
]
