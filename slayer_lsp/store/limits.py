"""Bounds on what one stored document may cost to read.

A store is data written by SLayer (or by hand, or by anyone who can write the directory), and the
daemon reads it unattended. Each bound is far above anything SLayer writes (its largest model files
are tens of kilobytes, its documents nest a dozen levels, its writer never emits YAML aliases) and far
below what would hurt the process (memory, recursion in the encoders of the on-disk cache, parse time).
A document beyond a bound is refused with a load issue naming it; the rest of the store loads.

Shared with other layers (the memory writer's own limit on learnings is its business; the reader only
bounds what it keeps, with the writer's own ``MAX_LEARNING_CHARS``).
"""

from __future__ import annotations

import re

from slayer_lsp.store import documents as d

#: Bytes of one stored document (a YAML file, a SQLite row's JSON). SLayer's largest: ~50 KB.
MAX_DOCUMENT_BYTES = 4 * 1024 * 1024

#: Nesting of mappings and sequences in one document (YAML or JSON), aliases expanded. SLayer's
#: documents nest about ten levels; the cache's msgpack encoder and msgspec's decoders fail near 1,000.
MAX_NESTING = 64

#: Nodes that YAML aliases may add to one document once expanded (a scalar weighs one node per
#: ``ALIAS_SCALAR_CHARS`` characters). Hand-written anchors (``defaults: &d``) stay far below; a
#: "billion laughs" document of a few hundred bytes would expand to 10**9 nodes.
MAX_ALIAS_NODES = 10_000
ALIAS_SCALAR_CHARS = 64

#: Characters of a memory's learning that are kept (indexed, shown): exactly what the memory writer
#: accepts (one constant, in ``documents.py``); a longer one, planted by another tool, is cut there with
#: a warning.
MAX_LEARNING_CHARS = d.MAX_LEARNING_CHARS

#: Bytes of one on-disk cache file; a larger one is neither written nor read (the cache is rebuilt).
MAX_CACHE_BYTES = 256 * 1024 * 1024


class LimitError(ValueError):
    """A document exceeds one of the bounds above (its message says which and where)."""


_NOT_BRACKETS_OR_QUOTES = bytes(sorted(set(range(256)) - set(b'[]{}"')))
_JSON_PAIR = re.compile(rb"\[\]|\{\}")


def check_json_nesting(text: str, limit: int = MAX_NESTING) -> None:
    """Refuse JSON nested deeper than ``limit`` *before* a recursive decoder sees it.

    Runs at C speed: escapes are dropped, every character but brackets and quotes removed, the
    strings (now only the brackets they held) cut out, then innermost ``[]``/``{}`` pairs are removed
    once per level. Up to where a decoder would stop on malformed input, its string state matches
    this scan's, so the depth it could reach is bounded too. (It works on the UTF-8 bytes, where a
    backslash or quote is never part of another character. Most strings hold no bracket and are
    left as ``""``: removing two adjacent quotes leaves every bracket on its side of every string,
    so those go in one ``replace``, and only the few strings that held brackets are cut out by
    splitting at the quotes. A 10 KB model row takes 35 us, not 63: 10,000 models' rows were 0.9 s
    of a cold start.)"""
    plain = text.encode("utf-8", "surrogatepass")
    if b"\\" in plain:
        plain = plain.replace(b"\\\\", b"").replace(b'\\"', b"")
    marks = plain.translate(None, _NOT_BRACKETS_OR_QUOTES)
    if marks.count(b"[") + marks.count(b"{") <= limit:  # as many openers as the text holds
        return
    brackets = marks.replace(b'""', b"")
    if b'"' in brackets:
        brackets = b"".join(brackets.split(b'"')[0::2])
    for _ in range(limit):
        if not brackets:
            return
        reduced = _JSON_PAIR.sub(b"", brackets)
        if reduced == brackets:  # unbalanced: malformed JSON, which the decoder refuses on its own
            if len(brackets) <= limit:
                return
            break
        brackets = reduced
    if brackets:
        raise LimitError(f"JSON nested deeper than {limit} levels")
