"""The Cypher lexer: a ``cypher_filter`` cut into the tokens LadybugDB would see.

The checks of ``cypher_filter.py`` read tokens, never raw text, so that a word inside a string, a
comment or a quoted name never trips them and a keyword outside one always does. That only holds
if this lexer and the engine agree on where each literal starts and ends, hence the grammar below.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import NamedTuple


class CypherFilterError(ValueError):
    """A cypher_filter that is unsafe, malformed, failed or timed out; the message says which."""


class Token(NamedTuple):
    """One lexeme of a filter and where it sits in the text (offsets for edits and messages)."""

    kind: str  # ws, comment, string, qident, number, ident, op
    text: str
    start: int
    end: int


# Comments, strings and quoted names follow LadybugDB's own grammar exactly (a line comment also
# ends at a carriage return; in a block comment a '*' swallows the next character, so '**/' does
# not close it; only the listed escapes exist): wherever this lexer sees a literal the engine sees
# the same one, so nothing the checks skip can be code to the engine.
_ESCAPE = r"""\\(?:[\\'"bBfFnNrRtT]|[xX][0-9a-fA-F]{2}|[uU][0-9a-fA-F]{4}(?:[0-9a-fA-F]{4})?)"""
_TOKEN_RE = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<comment>//[^\r\n]*|/\*(?:[^*]|\*[^/])*\*/)
  | (?P<string>'(?:[^'\\]|ESC)*'|"(?:[^"\\]|ESC)*")
  | (?P<qident>`(?:[^`]|``)*`)
  | (?P<number>\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)
  | (?P<ident>[^\W\d]\w*)
  | (?P<op>\.\.|<-|->|\S)
    """.replace("ESC", _ESCAPE),
    re.VERBOSE | re.DOTALL,
)
_UNTERMINATED = {
    "'": "string literal (or a bad escape)",
    '"': "string literal (or a bad escape)",
    "`": "quoted name",
}


def lex(text: str) -> Iterator[Token]:
    """Every token of ``text`` in order, whitespace and comments included; an unterminated literal
    or comment raises ``CypherFilterError``."""
    pos, n = 0, len(text)
    while pos < n:
        m = _TOKEN_RE.match(text, pos)
        assert m is not None and m.lastgroup is not None  # the op branch matches any non-space
        kind, tok = m.lastgroup, m.group()
        if kind == "op":
            if tok in _UNTERMINATED:
                raise CypherFilterError(
                    f"cypher_filter has an unterminated {_UNTERMINATED[tok]} at offset {pos}."
                )
            if tok == "/" and text.startswith("/*", pos):
                raise CypherFilterError(f"cypher_filter has an unterminated /* comment at offset {pos}.")
        yield Token(kind, tok, pos, m.end())
        pos = m.end()


def significant_tokens(text: str) -> list[Token]:
    """The tokens that mean something to the engine (no whitespace, no comments)."""
    return [t for t in lex(text) if t.kind not in ("ws", "comment")]


def token_name(tok: Token) -> str:
    """The name a name token stands for: a quoted name (`` `a``b` ``) unquoted."""
    return tok.text[1:-1].replace("``", "`") if tok.kind == "qident" else tok.text
