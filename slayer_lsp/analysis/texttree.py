"""The text of a YAML or JSON document as a tree of nodes with exact character offsets.

Three readers produce the same tree (``Scalar``/``Mapping``/``Sequence``): PyYAML's composer for
well-formed YAML (exact marks), and two tolerant scanners written here for JSON and for YAML that is
being typed. The scanners never raise: an unterminated string ends at the line's end, a missing
bracket at the end of the text, a line they cannot read becomes a plain scalar. ``Span``/``Region``
are 0-based lines and code-point columns.
"""

from __future__ import annotations

import bisect
import json
import re
from dataclasses import dataclass
from typing import Any

import yaml

from slayer_lsp.store import fastyaml
from slayer_lsp.store.limits import LimitError

try:  # PyYAML's C loader; its marks count code points like Python strings
    _Loader: Any = yaml.CSafeLoader
except AttributeError:  # pragma: no cover
    _Loader = yaml.SafeLoader


# --------------------------------------------------------------------------- positions


@dataclass(frozen=True, slots=True)
class Span:
    """A single-line range: 0-based line, start and end columns in code points (end exclusive)."""

    line: int
    start: int
    end: int

    def contains(self, line: int, col: int) -> bool:
        return line == self.line and self.start <= col <= self.end


@dataclass(frozen=True, slots=True)
class Region:
    """A multi-line range (start inclusive, end exclusive), for symbols."""

    start_line: int
    start_col: int
    end_line: int
    end_col: int


@dataclass(frozen=True, slots=True)
class SyntaxIssue:
    span: Span
    code: str  # "invalid-yaml" | "invalid-json"
    message: str


# --------------------------------------------------------------------------- the tree


@dataclass(slots=True)
class Scalar:
    value: Any  # str, or None/bool/int/float for JSON and YAML literals
    start: int  # absolute offsets of the scalar in the text (quotes included)
    end: int
    text_start: int  # where the value's characters begin (after an opening quote)
    verbatim: bool  # the value appears unaltered at text_start (offsets map by addition)
    quoted: bool = False

    @property
    def str_value(self) -> str | None:
        return self.value if isinstance(self.value, str) else None


@dataclass(slots=True)
class Mapping:
    items: list[tuple[Scalar, Any]]
    start: int
    end: int

    def get(self, key: str) -> Any:
        for k, v in self.items:
            if k.value == key:
                return v
        return None

    def key_node(self, key: str) -> Scalar | None:
        for k, _ in self.items:
            if k.value == key:
                return k
        return None


@dataclass(slots=True)
class Sequence:
    items: list[Any]
    start: int
    end: int
    flow: bool = False  # a YAML ``[...]`` list: the cursor between items is a new item


Node = Scalar | Mapping | Sequence | None


def to_plain(node: Node) -> Any:
    if isinstance(node, Scalar):
        return node.value
    if isinstance(node, Mapping):
        return {str(k.value): to_plain(v) for k, v in node.items}
    if isinstance(node, Sequence):
        return [to_plain(v) for v in node.items]
    return None


class Text:
    """Offset <-> (line, column) for one text."""

    def __init__(self, text: str):
        self.text = text
        self.starts = [0]
        for m in re.finditer("\n", text):
            self.starts.append(m.end())

    def pos(self, offset: int) -> tuple[int, int]:
        line = bisect.bisect_right(self.starts, offset) - 1
        return line, offset - self.starts[line]

    def offset(self, line: int, col: int) -> int:
        if line >= len(self.starts):
            return len(self.text)
        return min(self.starts[line] + col, len(self.text))

    def span(self, start: int, end: int) -> Span:
        line, col = self.pos(start)
        eline, ecol = self.pos(end)
        if eline != line:  # clip to the first line
            nl = self.text.find("\n", start)
            ecol = (nl if nl >= 0 else len(self.text)) - self.starts[line]
        return Span(line, col, max(col, ecol))

    def region(self, start: int, end: int) -> Region:
        a, b = self.pos(start)
        c, d = self.pos(end)
        return Region(a, b, c, d)


# ----- PyYAML composition

_YAML_NULLS = {"", "~", "null", "Null", "NULL"}


def _from_yaml(node: Any, text: str) -> Node:
    if isinstance(node, yaml.ScalarNode):
        start, end = node.start_mark.index, node.end_mark.index
        style = node.style or None  # the C loader reports a plain scalar as style ""
        value: Any = node.value
        if style is None and node.tag == "tag:yaml.org,2002:null" and value in _YAML_NULLS:
            value = None
        if style in ("'", '"'):
            text_start = start + 1
        else:
            text_start = start
        verbatim = (
            isinstance(value, str)
            and style in (None, "'", '"')
            and text[text_start : text_start + len(value)] == value
        )
        return Scalar(value, start, end, text_start, verbatim, quoted=style in ("'", '"'))
    if isinstance(node, yaml.MappingNode):
        items = []
        for k, v in node.value:
            key = _from_yaml(k, text)
            if not isinstance(key, Scalar):
                continue
            items.append((key, _from_yaml(v, text)))
        return Mapping(items, node.start_mark.index, node.end_mark.index)
    if isinstance(node, yaml.SequenceNode):
        return Sequence([_from_yaml(v, text) for v in node.value], node.start_mark.index, node.end_mark.index)
    return None


def compose_yaml(text: str) -> tuple[Node, SyntaxIssue | None, bool]:
    """(tree, problem, composed): PyYAML's tree, or the tolerant scanner's with the YAML error."""
    try:
        fastyaml.check_bounds(text)  # before a composer expands aliases or recurses into deep nesting
    except LimitError as exc:
        mark = re.search(r"\(line (\d+), column \d+\)", str(exc))
        line = int(mark.group(1)) - 1 if mark else 0
        return None, SyntaxIssue(Span(line, 0, 0), "invalid-yaml", f"invalid YAML: {exc}"), False
    except yaml.YAMLError:
        pass  # reported below, with the tolerant scanner's tree
    try:
        node = yaml.compose(text, Loader=_Loader)
        tree = _from_yaml(node, text) if node is not None else None  # recursive: deep nesting fails here
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        line = mark.line if mark is not None else 0
        col = mark.column if mark is not None else 0
        problem = getattr(exc, "problem", None) or str(exc)
        context = getattr(exc, "context", None)
        message = f"invalid YAML: {problem}" + (f" ({context})" if context else "")
        lines = text.split("\n")
        width = len(lines[line]) if line < len(lines) else 0
        span = Span(line, min(col, width), max(min(col, width), min(col + 1, width)))
        return YamlScanner(text).parse(), SyntaxIssue(span, "invalid-yaml", message), False
    except Exception as exc:  # noqa: BLE001 - recursion limits and the like: the scanner still answers
        return (
            YamlScanner(text).parse(),
            SyntaxIssue(Span(0, 0, 0), "invalid-yaml", f"invalid YAML: {exc}"),
            False,
        )
    return tree, None, True


# ----- tolerant block-YAML scanner (text mid-edit)

_KEY_RE = re.compile(
    r"""(?:"(?:[^"\\]|\\.)*"|'(?:[^']|'')*'|[^\s#'"\[\]{},:-][^:#]*?|-[^\s:#][^:#]*?)\s*:(?=\s|$)"""
)


def _strip_comment(s: str) -> str:
    """Drop a trailing `` # comment`` outside quotes."""
    quote = None
    for i, ch in enumerate(s):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"" and (i == 0 or s[i - 1] in " [{,:"):
            quote = ch
        elif ch == "#" and (i == 0 or s[i - 1] in " \t"):
            return s[:i].rstrip()
    return s.rstrip()


def _unquote(raw: str) -> tuple[str, int, bool, bool]:
    """(value, offset of the value in raw, verbatim, quoted) for a flow scalar's raw text."""
    if raw[:1] in ("'", '"'):
        q = raw[0]
        body = raw[1:]
        if body.endswith(q) and len(body) >= 1:
            body = body[:-1]
        if q == "'":
            value = body.replace("''", "'")
        else:
            try:
                value = json.loads(f'"{body}"')
            except ValueError:
                value = body
        return value, 1, value == body, True
    return raw, 0, True, False


class YamlScanner:
    """A forgiving reader of block YAML: indentation, ``key:``, ``- item``, flow lists and plain or
    quoted scalars. It never raises; what it cannot read becomes a plain scalar."""

    def __init__(self, text: str):
        self.text = text
        self.lines = text.split("\n")
        self.starts = [0]
        for ln in self.lines[:-1]:
            self.starts.append(self.starts[-1] + len(ln) + 1)
        self.n = len(self.lines)

    # helpers
    def _blank(self, li: int) -> bool:
        s = self.lines[li].strip()
        return not s or s.startswith("#") or s in ("---", "...")

    def _next(self, li: int) -> int:
        while li < self.n and self._blank(li):
            li += 1
        return li

    def _indent(self, li: int) -> int:
        ln = self.lines[li]
        return len(ln) - len(ln.lstrip(" \t"))  # a tab is invalid YAML indentation; read it as one column

    def _is_item(self, li: int, col: int) -> bool:
        ln = self.lines[li]
        return ln[col : col + 1] == "-" and (len(ln) == col + 1 or ln[col + 1] in " \t")

    def _key_at(self, li: int, col: int) -> re.Match[str] | None:
        return _KEY_RE.match(self.lines[li], col)

    def _off(self, li: int, col: int) -> int:
        return self.starts[li] + col

    def parse(self) -> Node:
        li = self._next(0)
        root: Node = None
        while li < self.n:
            node, nli = self._node(li, self._indent(li))
            if isinstance(root, Mapping) and isinstance(node, Mapping):
                root.items.extend(node.items)
                root.end = node.end
            elif isinstance(root, Sequence) and isinstance(node, Sequence):
                root.items.extend(node.items)
                root.end = node.end
            elif root is None:
                root = node
            li = self._next(max(nli, li + 1))
        return root

    def _node(self, li: int, col: int) -> tuple[Node, int]:
        if self._is_item(li, col):
            return self._seq(li, col)
        if self._key_at(li, col):
            return self._map(li, col)
        line = self.lines[li]
        raw = line[col:]
        if raw.lstrip().startswith(("|", ">")):
            return self._block_scalar(li, col)
        return self._flow(li, col, _strip_comment(raw)), li + 1

    def _seq(self, li: int, col: int) -> tuple[Sequence, int]:
        items: list[Any] = []
        start = self._off(li, col)
        end = start
        first = True
        while li < self.n and (first or (self._indent(li) == col and self._is_item(li, col))):
            first = False
            line = self.lines[li]
            rest_col = col + 1
            while rest_col < len(line) and line[rest_col] in " \t":
                rest_col += 1
            rest = _strip_comment(line[rest_col:])
            if not rest:
                nli = self._next(li + 1)
                if nli < self.n and self._indent(nli) > col:
                    child, li = self._node(nli, self._indent(nli))
                else:
                    pos = self._off(li, min(col + 2, len(line)))
                    child = Scalar("", pos, self._off(li, len(line)), pos, True)
                    li += 1
            else:
                child, li = self._node(li, rest_col)
            items.append(child)
            end = _end_of(child, end)
            li = self._next(li)
        return Sequence(items, start, end), li

    def _map(self, li: int, col: int) -> tuple[Mapping, int]:
        items: list[tuple[Scalar, Any]] = []
        start = self._off(li, col)
        end = start
        first = True
        while li < self.n:
            if not first:
                if self._indent(li) != col or self._is_item(li, col):
                    break
            line = self.lines[li]
            m = self._key_at(li, col)
            if m is None:
                if first:
                    break
                # a key being typed (no colon yet): keep it so completion can offer field names
                raw = _strip_comment(line[col:])
                key = Scalar(raw, self._off(li, col), self._off(li, col + len(raw)), self._off(li, col), True)
                items.append((key, None))
                li = self._next(li + 1)
                continue
            first = False
            key_raw = m.group(0)[:-1].rstrip()
            kval, koff, kverb, kq = _unquote(key_raw)
            key = Scalar(
                kval,
                self._off(li, col),
                self._off(li, col + len(key_raw)),
                self._off(li, col + koff),
                kverb,
                kq,
            )
            vcol = m.end()
            while vcol < len(line) and line[vcol] in " \t":
                vcol += 1
            rest = _strip_comment(line[vcol:])
            if not rest:
                nli = self._next(li + 1)
                if nli < self.n and (
                    self._indent(nli) > col or (self._indent(nli) == col and self._is_item(nli, col))
                ):
                    child, li = self._node(nli, self._indent(nli))
                else:
                    pos = self._off(li, vcol)
                    child = Scalar(None, pos, self._off(li, len(line)), pos, True)
                    li += 1
            elif rest.startswith(("|", ">")):
                child, li = self._block_scalar(li, vcol, parent=col)
            else:
                child = self._flow(li, vcol, rest)
                li += 1
                # continuation lines of a multi-line plain scalar
                while (
                    li < self.n
                    and not self._blank(li)
                    and self._indent(li) > col
                    and not self._key_at(li, self._indent(li))
                    and not self._is_item(li, self._indent(li))
                    and isinstance(child, Scalar)
                    and not child.quoted
                ):
                    cont = self.lines[li].strip()
                    child.value = f"{child.value} {cont}" if child.value else cont
                    child.end = self._off(li, len(self.lines[li]))
                    child.verbatim = False
                    li += 1
            items.append((key, child))
            end = _end_of(child, key.end)
            li = self._next(li)
        return Mapping(items, start, end), li

    def _block_scalar(self, li: int, col: int, parent: int | None = None) -> tuple[Scalar, int]:
        base = parent if parent is not None else col - 1
        start = self._off(li, col)
        li += 1
        body: list[str] = []
        while li < self.n and (not self.lines[li].strip() or self._indent(li) > base):
            body.append(self.lines[li].strip())
            li += 1
        end = self._off(li - 1, len(self.lines[li - 1]))
        return Scalar("\n".join(body).strip(), start, end, start, False), li

    def _flow(self, li: int, col: int, raw: str) -> Node:
        base = self._off(li, col)
        node, _ = _parse_flow(raw, 0, base)
        return node


def _end_of(node: Node, default: int) -> int:
    return node.end if node is not None else default


_FLOW_STOP = ",]}"


def _parse_flow(s: str, i: int, base: int, nested: bool = False) -> tuple[Node, int]:
    """A flow value within one line: ``[a, b]``, ``{k: v}`` or a scalar (tolerant of a missing
    closing bracket). ``base`` is the absolute offset of ``s[0]``."""
    while i < len(s) and s[i] in " \t":
        i += 1
    if i < len(s) and s[i] in "[{":
        opening = s[i]
        closing = "]" if opening == "[" else "}"
        start = i
        i += 1
        seq_items: list[Any] = []
        map_items: list[tuple[Scalar, Any]] = []
        while True:
            while i < len(s) and s[i] in " \t":
                i += 1
            if i >= len(s):
                break
            if s[i] == closing:
                i += 1
                break
            if s[i] == ",":
                # an empty item (``[a, , b]`` or a trailing ``, `` being typed)
                if opening == "[":
                    seq_items.append(Scalar("", base + i, base + i, base + i, True))
                i += 1
                continue
            item_start = i
            item, i = _parse_flow(s, i, base, nested=True)
            if i <= item_start:  # a stray closer of the other kind: skip it
                i = item_start + 1
                continue
            if opening == "{":
                key = (
                    item
                    if isinstance(item, Scalar)
                    else Scalar("", base + item_start, base + i, base + item_start, True)
                )
                entry: Node = None
                while i < len(s) and s[i] in " \t":
                    i += 1
                if i < len(s) and s[i] == ":":
                    entry, i = _parse_flow(s, i + 1, base, nested=True)
                map_items.append((key, entry))
            else:
                seq_items.append(item)
            while i < len(s) and s[i] in " \t":
                i += 1
            if i < len(s) and s[i] == ",":
                i += 1
                if opening == "[":
                    j = i
                    while j < len(s) and s[j] in " \t":
                        j += 1
                    if j >= len(s):  # trailing comma at the end of the text: an item being typed
                        seq_items.append(Scalar("", base + len(s), base + len(s), base + len(s), True))
        if opening == "[":
            return Sequence(seq_items, base + start, base + i, flow=True), i
        return Mapping(map_items, base + start, base + i), i
    # scalar: quoted, or plain up to a flow separator (only when nested) at depth 0
    start = i
    if i < len(s) and s[i] in "'\"":
        q = s[i]
        j = i + 1
        while j < len(s):
            if s[j] == "\\" and q == '"':
                j += 2
                continue
            if s[j] == q:
                if q == "'" and j + 1 < len(s) and s[j + 1] == "'":
                    j += 2
                    continue
                j += 1
                break
            j += 1
        raw = s[i:j]
        text, off, verb, quoted = _unquote(raw)
        return Scalar(text, base + i, base + j, base + i + off, verb, quoted), j
    depth = 0
    j = i
    while j < len(s):
        ch = s[j]
        if ch in "([":
            depth += 1
        elif ch in ")]" and depth > 0:
            depth -= 1
        elif (
            nested and depth == 0 and (ch in _FLOW_STOP or (ch == ":" and j + 1 < len(s) and s[j + 1] == " "))
        ):
            break
        elif ch in "'\"":
            close = s.find(ch, j + 1)
            j = close if close >= 0 else len(s) - 1
        j += 1
    raw = s[start:j].rstrip()
    value: Any = raw
    if not nested or raw:
        value = _plain_value(raw)
    return Scalar(value, base + start, base + start + len(raw), base + start, isinstance(value, str)), j


def _plain_value(raw: str) -> Any:
    if raw in _YAML_NULLS:
        return None
    return raw


# ----- tolerant JSON scanner


class JsonScanner:
    """JSON with positions, never raising: an unterminated string ends at the line's end, a missing
    bracket at the end of the text; the first error is kept for the diagnostic when ``json`` itself
    also refuses the text."""

    def __init__(self, text: str):
        self.s = text
        self.n = len(text)

    def parse(self) -> Node:
        node, _ = self._value(self._ws(0))
        return node

    def _ws(self, i: int) -> int:
        while i < self.n and self.s[i] in " \t\r\n":
            i += 1
        return i

    def _value(self, i: int) -> tuple[Node, int]:
        if i >= self.n:
            return None, i
        c = self.s[i]
        if c == "{":
            return self._object(i)
        if c == "[":
            return self._array(i)
        if c == '"':
            return self._string(i)
        j = i
        while j < self.n and self.s[j] not in ",]}: \t\r\n":
            j += 1
        raw = self.s[i:j]
        value: Any = raw
        if raw in ("true", "false", "null"):
            value = {"true": True, "false": False, "null": None}[raw]
        else:
            try:
                value = json.loads(raw) if raw else raw
            except ValueError:
                value = raw
        if j == i:  # a stray character: consume it
            j += 1
        return Scalar(value, i, j, i, isinstance(value, str)), j

    def _string(self, i: int) -> tuple[Scalar, int]:
        j = i + 1
        closed = False
        while j < self.n:
            ch = self.s[j]
            if ch == "\\":
                j += 2
                continue
            if ch == '"':
                closed = True
                break
            if ch == "\n":
                break
            j += 1
        body = self.s[i + 1 : min(j, self.n)]
        try:
            value = json.loads(f'"{body}"')
        except ValueError:
            value = body
        end = j + 1 if closed else j
        return Scalar(value, i, end, i + 1, value == body, True), end

    def _object(self, i: int) -> tuple[Mapping, int]:
        start = i
        items: list[tuple[Scalar, Any]] = []
        i = self._ws(i + 1)
        while i < self.n and self.s[i] != "}":
            if self.s[i] == ",":
                i = self._ws(i + 1)
                continue
            if self.s[i] in "]":
                break
            key, i = self._value(i)
            if not isinstance(key, Scalar):
                break
            i = self._ws(i)
            value: Node = None
            if i < self.n and self.s[i] == ":":
                i = self._ws(i + 1)
                if i < self.n and self.s[i] not in ",}]":
                    value, i = self._value(i)
                else:
                    value = Scalar(None, i, i, i, True)
            items.append((key, value))
            i = self._ws(i)
        end = i + 1 if i < self.n and self.s[i] == "}" else i
        return Mapping(items, start, end), end

    def _array(self, i: int) -> tuple[Sequence, int]:
        start = i
        items: list[Any] = []
        i = self._ws(i + 1)
        while i < self.n and self.s[i] != "]":
            if self.s[i] == ",":
                i = self._ws(i + 1)
                continue
            if self.s[i] == "}":
                break
            value, i = self._value(i)
            items.append(value)
            i = self._ws(i)
        end = i + 1 if i < self.n and self.s[i] == "]" else i
        return Sequence(items, start, end), end


def parse_json(text: str) -> tuple[Node, SyntaxIssue | None]:
    problem = None
    try:
        json.loads(text)
    except json.JSONDecodeError as exc:
        lines = text.split("\n")
        line = max(exc.lineno - 1, 0)
        col = max(exc.colno - 1, 0)
        width = len(lines[line]) if line < len(lines) else 0
        problem = SyntaxIssue(
            Span(line, min(col, width), min(col + 1, width) if width else 0),
            "invalid-json",
            f"invalid JSON: {exc.msg}",
        )
    except RecursionError:
        problem = SyntaxIssue(Span(0, 0, 0), "invalid-json", "invalid JSON: nested too deeply")
    try:
        tree = JsonScanner(text).parse()
    except RecursionError:
        tree = None
    return tree, problem
