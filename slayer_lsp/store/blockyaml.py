"""The block-style YAML that PyYAML's emitter writes, read line by line without a YAML parser.

SLayer writes every model, datasource and memory front matter with ``yaml.dump``/``yaml.safe_dump``:
block mappings and sequences indented by two, plain, single- and double-quoted scalars (folded over
lines when long), ``{}`` and ``[]``. libyaml's event stream costs ~2 ms for a 40-column model file,
most of it building an event object per scalar; reading the lines directly costs a fraction, and a
cold start of a large store is mostly this.

The subset is chosen so that anything outside it is seen, never misread: comments, tabs, anchors,
tags, flow collections, block scalars, complex or quoted keys, blank lines outside quoted scalars,
odd indentation and any character YAML treats specially raise ``Unhandled``, and the caller reads
the text with a full YAML reader instead. Within the subset the value equals ``yaml.safe_load``'s
(timestamps kept as text); ``tests/test_blockyaml.py`` checks that against PyYAML on generated
documents and on every document of the fixture stores.
"""

from __future__ import annotations

import re
from itertools import repeat
from operator import sub
from typing import Any

import yaml

from slayer_lsp.store.limits import MAX_NESTING
from slayer_lsp.store.yamlscalar import Unhandled, resolve_plain

# Characters outside the subset anywhere in the text: tabs, carriage returns, YAML's other line
# breaks (NEL, LS, PS), the byte-order mark, and what YAML refuses as non-printable.
_UNSAFE = re.compile("[^\n\x20-\x7e\xa0-\u2027\u202a-\ud7ff\ue000-\ufefe\uff00-\ufffd\U00010000-\U0010ffff]")
# A key line: a plain key (no ": " or " #" inside, no indicator first, no space before the colon) or
# a one-line quoted key, then ": " and the value's first line, or ":" at the end of the line.
_KEY_LINE = re.compile(
    r"(?:((?:[^\s\-?:,\[\]{}#&*!|>'\"%@`]|[\-?:](?=\S))(?:[^\s:]|:(?=\S)| (?=[^\s:#]))*)"
    r"|'((?:[^']|'')*)'"
    r'|"((?:[^"\\]|\\.)*)")'
    r":(?: (.*))?\Z"
)
_KEY_MAX = 1000  # characters: libyaml refuses a longer implicit key
# Lines "key: value" with a one-line plain value, read before: a store repeats "type: INT" or
# "hidden: false" on every column. Keys and values are immutable (strings, numbers, None).
_PAIRS: dict[str, tuple[Any, Any]] = {}
_PAIRS_MAX = 50_000  # a few megabytes at most; cleared when full
_PAIR_LINE_MAX = 40  # longer lines are mostly descriptions, which do not repeat
# The characters that may not open a plain scalar (``-``, ``?`` and ``:`` only when a space follows).
_NOT_PLAIN_START = frozenset(" ,[]{}#&*!|>'\"%@`")
_SPECIAL_START = _NOT_PLAIN_START | frozenset("-?:")
_SQ_BODY = re.compile(r"(?:[^']|'')*")
_DQ_BODY = re.compile(r'(?:[^"\\]|\\.)*')
_DQ_ESCAPE = re.compile(r"\\(?:x([0-9A-Fa-f]{2})|u([0-9A-Fa-f]{4})|U([0-9A-Fa-f]{8})|(.))")
_DQ_SIMPLE = yaml.scanner.Scanner.ESCAPE_REPLACEMENTS  # PyYAML's own table (libyaml's is the same)


def load(text: str) -> Any:
    """The document's value, or ``Unhandled`` when the text is outside the subset."""
    if (
        not text
        or _UNSAFE.search(text) is not None
        or " #" in text
        or "\n#" in text
        or " \n" in text
        or text[0] == "#"
        or text[-1] == " "
        or text.startswith(("---", "..."))
        or "\n---" in text
        or "\n..." in text  # document markers (and lines that merely start like one)
    ):
        raise Unhandled
    return _Lines(text).document()


def _unescape(match: re.Match[str]) -> str:
    simple = match.group(4)
    if simple is not None:
        try:
            return _DQ_SIMPLE[simple]
        except KeyError:
            raise Unhandled from None
    code = int(match.group(1) or match.group(2) or match.group(3), 16)
    if code > 0x10FFFF or 0xD800 <= code <= 0xDFFF:
        raise Unhandled  # libyaml refuses these
    return chr(code)


class _Lines:
    """The text as (indent, content) per line. A blank line has indent -1, so that it closes every
    block and only a quoted scalar reads past it; one more line of indent -2 ends the text, so
    that no loop tests the position against the length."""

    __slots__ = ("indent", "content", "pos")

    def __init__(self, text: str) -> None:
        lines = text.split("\n")
        if lines[-1] == "":
            lines.pop()
        content = list(map(str.lstrip, lines, repeat(" ", len(lines))))
        indent = list(map(sub, map(len, lines), map(len, content)))
        if "\n\n" in text or text[0] == "\n":
            indent = [i if c else -1 for i, c in zip(indent, content, strict=True)]
        content.append("")
        indent.append(-2)
        self.content = content
        self.indent = indent
        self.pos = 0

    def document(self) -> Any:
        if self.indent[0] < 0 or _KEY_LINE.match(self.content[0]) is None:
            raise Unhandled  # empty, or not a block mapping (a sequence or a scalar at the top)
        value = self.mapping(self.indent[0], 1)
        if self.indent[self.pos] != -2:
            raise Unhandled  # something after the mapping (a blank line, a line indented less)
        return value

    def mapping(self, indent: int, depth: int) -> dict[Any, Any]:
        if depth > MAX_NESTING:
            raise Unhandled  # the full reader refuses it with its limit's message
        out: dict[Any, Any] = {}
        ind, con, pos = self.indent, self.content, self.pos
        while True:
            at = ind[pos]
            if at != indent:
                if at < indent:
                    break
                raise Unhandled  # indented deeper with no key opening it
            line = con[pos]
            pos += 1
            pair = _PAIRS.get(line)
            if pair is not None and ind[pos] <= indent:  # a line seen before, not continued
                out[pair[0]] = pair[1]
                continue
            m = _KEY_LINE.match(line)
            if m is None:
                raise Unhandled
            key = _key(m)
            rest = m.group(4)
            if rest is not None:
                if ind[pos] <= indent and _is_simple_plain(rest):
                    value = out[key] = resolve_plain(rest)
                    if len(line) <= _PAIR_LINE_MAX:
                        if len(_PAIRS) >= _PAIRS_MAX:
                            _PAIRS.clear()
                        _PAIRS[line] = (key, value)
                    continue
                self.pos = pos
                out[key] = self.scalar(rest, indent)
            elif ind[pos] > indent:
                self.pos = pos
                out[key] = self.block(ind[pos], depth + 1)
            elif ind[pos] == indent and _is_item(con[pos]):
                self.pos = pos
                out[key] = self.sequence(indent, depth + 1)  # "key:" then "- item" at its own indent
            else:
                out[key] = None
                continue
            pos = self.pos
        self.pos = pos
        return out

    def block(self, indent: int, depth: int) -> Any:
        if _is_item(self.content[self.pos]):
            return self.sequence(indent, depth)
        return self.mapping(indent, depth)

    def sequence(self, indent: int, depth: int) -> list[Any]:
        if depth > MAX_NESTING:
            raise Unhandled
        out: list[Any] = []
        ind, con = self.indent, self.content
        inner = indent + 2
        while ind[self.pos] == indent:
            line = con[self.pos]
            if line[:2] != "- ":
                if line == "-":
                    raise Unhandled  # "-" alone: a block on the next lines, which the emitter does not write
                break
            item = line[2:]  # never empty: a line never ends in a space
            if item[0] == " ":
                raise Unhandled  # "-   x"
            # "- key: ..." or "- - x": a mapping or sequence that starts two columns in (the line is
            # read again as its first line)
            if _KEY_LINE.match(item) is not None:
                ind[self.pos], con[self.pos] = inner, item
                out.append(self.mapping(inner, depth + 1))
            elif _is_item(item):
                ind[self.pos], con[self.pos] = inner, item
                out.append(self.sequence(inner, depth + 1))
            else:
                self.pos += 1
                out.append(self.scalar(item, indent))
        return out

    def scalar(self, text: str, parent: int) -> Any:
        """The scalar starting with ``text`` (the rest of a line already consumed), reading on over
        the lines indented deeper than ``parent`` that continue it."""
        first = text[0]
        if first == "'":
            return self.quoted(text[1:], parent, _SQ_BODY, "'")
        if first == '"':
            return self.quoted(text[1:], parent, _DQ_BODY, '"')
        if text == "{}":
            return {}
        if text == "[]":
            return []
        if first in _NOT_PLAIN_START or (first in "-?:" and (len(text) == 1 or text[1] == " ")):
            raise Unhandled
        if ": " in text or text[-1] == ":":
            raise Unhandled  # a mapping where a scalar stands: an error PyYAML reports
        ind, con = self.indent, self.content
        if ind[self.pos] > parent:  # a long plain scalar folded over lines
            parts = [text]
            while ind[self.pos] > parent:
                more = con[self.pos]
                if ": " in more or more[-1] == ":":
                    raise Unhandled
                parts.append(more)
                self.pos += 1
            text = " ".join(parts)
        return resolve_plain(text)

    def quoted(self, chunk: str, parent: int, body: re.Pattern[str], quote: str) -> str:
        """A quoted scalar from just after its opening quote; a line break folds to a space, blank
        lines to that many newlines, and a double-quoted line ending in a backslash joins the next
        line without a space."""
        parts: list[str] = []
        ind, con = self.indent, self.content
        while True:
            text = body.match(chunk).group()  # type: ignore[union-attr]  # matches the empty string
            rest = chunk[len(text) :]
            if quote == "'":
                text = text.replace("''", "'")
            else:
                text = _unescape_double(text)
            parts.append(text)
            if rest == quote:
                return "".join(parts)
            escaped_break = quote == '"' and rest == "\\"
            if rest and not escaped_break:
                raise Unhandled  # text after the closing quote
            blanks = 0
            while ind[self.pos] == -1:
                blanks += 1
                self.pos += 1
            if ind[self.pos] <= parent:
                raise Unhandled  # unterminated, or continued where the emitter would not write it
            if blanks:
                parts.append("\n" * blanks)
            elif not escaped_break:
                parts.append(" ")
            chunk = con[self.pos]
            self.pos += 1


def _key(m: re.Match[str]) -> Any:
    plain, single, double = m.group(1, 2, 3)
    if max(m.end(1), m.end(2), m.end(3)) > _KEY_MAX:
        raise Unhandled
    if plain is not None:
        return resolve_plain(plain)
    if single is not None:
        return single.replace("''", "'")
    return _unescape_double(double)


def _unescape_double(text: str) -> str:
    if "\\" not in text:
        return text
    try:
        return _DQ_ESCAPE.sub(_unescape, text)
    except ValueError:
        raise Unhandled from None


def _is_simple_plain(text: str) -> bool:
    """A one-line plain scalar that needs no further look (no indicator first, no ": " inside)."""
    return text[0] not in _SPECIAL_START and ": " not in text and text[-1] != ":"


def _is_item(line: str) -> bool:
    return line[:2] == "- " or line == "-"
