"""An open document's text as plain data: what kind of file it is, the entity references it contains
with their exact ranges and roles, its query stages and symbols, its syntax errors, and the context
of a cursor for completion.

Parsing never fails: ``texttree`` reads well-formed YAML with PyYAML and JSON or half-typed YAML
with tolerant scanners, all into one node tree, and one walker here turns the tree into references.
Positions are 0-based lines and code-point columns; the server converts them to the client's units.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path, PurePosixPath
from typing import Any

from slayer_lsp.analysis.texttree import (
    JsonScanner,
    Mapping,
    Node,
    Region,
    Scalar,
    Sequence,
    Span,
    Text,
    YamlScanner,
    compose_yaml,
    parse_json,
    to_plain,
)
from slayer_lsp.query.formulas import FILTER_KEYWORDS
from slayer_lsp.query.normal_form import QUERY_FIELDS  # the fields of a SlayerQuery; SLayer refuses any other

KINDS = ("query", "memory", "model", "datasource", "other")


# Words of the filter/formula language that are never entity references (SLayer's own list plus
# the sort directions and literals of the formula language).
KEYWORDS = FILTER_KEYWORDS | {"as", "asc", "desc", "none"}

# Reference roles.
SOURCE_MODEL = "source_model"
DIMENSION = "dimension"
TIME_DIMENSION = "time_dimension"
MEASURE = "measure"
FILTER = "filter"
ORDER = "order"
ENTITY_TAG = "entity_tag"
FUNCTION = "function"  # a call whose name may be a custom aggregation of the source model
JOIN_TARGET = "join_target"  # model files: joins[].target_model
JOIN_KEY = "join_key"  # model files: joins[].join_pairs[][0|1]
MODEL_FORMULA = "model_formula"  # model files: a measure formula, a filter, default_time_dimension
DEFINITION = "definition"  # model/datasource files: the name that defines an entity

QUERY_ROLES = frozenset({SOURCE_MODEL, DIMENSION, TIME_DIMENSION, MEASURE, FILTER, ORDER})

# --------------------------------------------------------------------------- plain data


@dataclass(frozen=True, slots=True)
class Reference:
    """One entity reference as written in the document."""

    text: str  # "stores.name", "memory:1", "subtotal", "orders"
    span: Span
    role: str
    field: str  # the field it sits in: "dimensions", "entities", "joins", ...
    index: int | None = None  # item index within that field's list
    stage: int | None = None  # index into ``ParsedDocument.stages`` (query refs)
    call: str | None = None  # enclosing function in a formula: "sum" in "sum(amount)"
    canonical: str | None = None  # known without resolution (definitions, model-file refs)
    prefix_span: Span | None = None  # a ``{name, model}`` reference: where its model is written


@dataclass(frozen=True, slots=True)
class Problem:
    """A syntax or structure problem found while parsing (not a catalog check)."""

    span: Span
    code: str  # "invalid-yaml" | "invalid-json" | "unknown-query-field"
    message: str
    severity: str = "error"
    suggestions: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Stage:
    """One SlayerQuery object of a document: a query file's root (or each item of a list of stages),
    or the ``query`` of a memory's front matter."""

    index: int
    name: str | None
    source_model: str | None  # as written ("orders"), or an extension's source_name
    source_span: Span | None
    local_names: frozenset[str]  # measure names and computed dimensions the query defines itself
    inline_source: bool  # an inline model: its fields cannot be checked against the catalog
    earlier_stage: bool  # source_model names an earlier stage of the same file
    query: Any  # the stage's data (dict), or None when the stage is not a mapping
    region: Region | None = None
    keys: tuple[tuple[str, Span], ...] = ()  # the stage's field names and their spans

    def key_span(self, name: str) -> Span | None:
        return next((span for k, span in self.keys if k == name), None)


@dataclass(frozen=True, slots=True)
class Symbol:
    """An entity defined by a model or datasource file (document symbols, go to definition)."""

    name: str
    kind: str  # "datasource" | "model" | "column" | "measure" | "aggregation" | "join"
    selection: Span
    region: Region
    detail: str | None = None
    children: tuple[Symbol, ...] = ()


@dataclass(frozen=True)
class ParsedDocument:
    kind: str  # one of KINDS
    fmt: str  # "yaml" | "json" | "markdown"
    text: str
    refs: tuple[Reference, ...]
    stages: tuple[Stage, ...]
    problems: tuple[Problem, ...]
    symbols: tuple[Symbol, ...]
    data: Any  # the parsed value (the front matter for a memory file); None if it did not parse
    scanned: bool  # True when the tolerant scanner stood in for a parser (text mid-edit)
    front_matter: tuple[int, int] | None = None  # memory files: line range of the front matter
    model_id: str | None = None  # model files: "ds.model" as the file declares it

    def ref_at(self, line: int, col: int) -> Reference | None:
        best: Reference | None = None
        for ref in self.refs:
            if ref.span.contains(line, col) and (
                best is None or ref.span.end - ref.span.start < best.span.end - best.span.start
            ):
                best = ref
        return best

    @property
    def lines(self) -> list[str]:
        return self.text.split("\n")


# --------------------------------------------------------------------------- classification


@lru_cache(maxsize=256)
def glob_regex(pattern: str) -> re.Pattern[str]:
    """A regex for a glob with ``**``, ``*``, ``?``, ``[...]`` and ``{a,b}``; a relative pattern
    matches at any directory depth (workspace roots differ between clients)."""
    i, out = 0, []
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "{":
            close = pattern.find("}", i)
            if close < 0:
                out.append(re.escape(c))
                i += 1
            else:
                alts = pattern[i + 1 : close].split(",")
                out.append("(?:" + "|".join(re.escape(a) for a in alts) + ")")
                i = close + 1
        elif c == "[":
            close = pattern.find("]", i + 1)
            if close < 0:
                out.append(re.escape(c))
                i += 1
            else:
                body = pattern[i + 1 : close].replace("\\", "\\\\")
                if body.startswith("!"):
                    body = "^" + body[1:]
                out.append(f"[{body}]")
                i = close + 1
        else:
            out.append(re.escape(c))
            i += 1
    body = "".join(out)
    prefix = "" if pattern.startswith("/") else "(?:.*/)?"
    return re.compile(f"^{prefix}{body}$")


def matches_any(path: str, patterns: Iterable[str]) -> bool:
    posix = path.replace("\\", "/")
    return any(glob_regex(p).match(posix) for p in patterns)


def classify(
    path: str | None,
    query_patterns: Iterable[str],
    memory_patterns: Iterable[str],
    store_root: str | Path | None = None,
) -> str:
    """The document kind of a file path: the store's own files first (a model file is YAML under
    ``<store>/models/<ds>/``), then the memory and query patterns."""
    if not path:
        return "other"
    p = PurePosixPath(path.replace("\\", "/"))
    if store_root is not None:
        root = PurePosixPath(str(store_root).replace("\\", "/"))
        try:
            rel = p.relative_to(root)
        except ValueError:
            rel = None
        if rel is not None:
            parts = rel.parts
            if len(parts) == 3 and parts[0] == "models" and p.suffix in (".yaml", ".yml"):
                return "model"
            if len(parts) == 2 and parts[0] == "datasources" and p.suffix in (".yaml", ".yml"):
                return "datasource"
            if len(parts) == 2 and parts[0] == "memories" and p.suffix == ".md":
                return "memory"
    if matches_any(str(p), memory_patterns):
        return "memory"
    if matches_any(str(p), query_patterns):
        return "query"
    return "other"


def format_of(path: str | None, kind: str) -> str:
    if kind == "memory":
        return "markdown"
    if path and path.lower().endswith(".json"):
        return "json"
    return "yaml"


# --------------------------------------------------------------------------- formulas

_FORMULA_TOKEN = re.compile(
    r"""
    (?P<str>'(?:[^'\\]|\\.|'')*'?|"(?:[^"\\]|\\.)*"?)
  | (?P<var>\{[^}]*\}?)
  | (?P<num>\d[\w.]*)
  | (?P<id>[A-Za-z_]\w*(?:\.(?:[A-Za-z_]\w*|\*))*)(?P<agg>:\w+)?
  | (?P<open>\()
  | (?P<close>\))
  | (?P<other>.)
""",
    re.VERBOSE | re.DOTALL,
)


@dataclass(frozen=True, slots=True)
class FormulaToken:
    text: str  # the path: "stores.name", "orders" (from "orders.*"), "sum" for a call
    start: int  # offsets within the formula text
    end: int
    is_call: bool  # a function name (followed by "(")
    call: str | None  # the innermost enclosing call


def scan_formula(text: str) -> list[FormulaToken]:
    """Identifier paths of a formula or filter, with the calls they sit in. String literals,
    ``{variables}``, numbers, keywords and keyword-argument names are skipped; ``orders.*`` names
    the model ``orders``; the legacy ``amount:sum`` form names ``amount``. A tolerant scan with
    positions, for half-typed text; SLayer's own tokens (strings) are ``query.formulas.formula_tokens``."""
    out: list[FormulaToken] = []
    calls: list[str | None] = []
    pending_call: str | None = None
    for m in _FORMULA_TOKEN.finditer(text):
        kind = m.lastgroup
        if kind == "agg":
            kind = "id"
        if kind == "open":
            calls.append(pending_call)
            pending_call = None
            continue
        pending_call = None
        if kind == "close":
            if calls:
                calls.pop()
            continue
        if kind != "id":
            continue
        path = m.group("id")
        start, end = m.start("id"), m.end("id")
        rest = text[m.end() :]
        nxt = rest.lstrip()
        call = next((c for c in reversed(calls) if c is not None), None) if calls else None
        if path.lower() in KEYWORDS:
            if nxt.startswith("("):
                pending_call = path
            continue
        if nxt.startswith("("):
            pending_call = path
            out.append(FormulaToken(path, start, end, True, call))
            continue
        if (
            calls
            and rest.startswith("=")
            and not rest.startswith("==")
            and text[:start].rstrip()[-1:] in ("(", ",")
        ):
            continue  # keyword argument name: weight=..., partition_by=...
        if path.endswith(".*"):
            path = path[:-2]
            end -= 2
        if path.endswith("*"):
            continue
        out.append(FormulaToken(path, start, end, False, call))
    return out


_COLUMN_REF_RE = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*$")


def is_plain_ref(text: str) -> bool:
    return bool(_COLUMN_REF_RE.match(text))


# --------------------------------------------------------------------------- the walker


@dataclass
class _Out:
    text: Text
    refs: list[Reference] = field(default_factory=list)
    stages: list[Stage] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    symbols: list[Symbol] = field(default_factory=list)


def scalar_span(
    t: Text,
    sc: Scalar,
    start: int | None = None,
    end: int | None = None,
    token: str | None = None,
    hint: int = 0,
) -> Span:
    """The span of ``value[start:end]`` of a scalar in the text (the whole value by default). A value
    that is not verbatim in the source (escapes, folded lines) is located by searching ``token``."""
    value = sc.value if isinstance(sc.value, str) else ("" if sc.value is None else str(sc.value))
    if start is None:
        start, end = 0, len(value)
    assert end is not None
    if sc.verbatim:
        return t.span(sc.text_start + start, sc.text_start + end)
    needle = token if token is not None else value[start:end]
    if needle:
        region = t.text[sc.start : sc.end]
        pos = region.find(needle, hint)
        if pos < 0:
            pos = region.find(needle)
        if pos >= 0:
            return t.span(sc.start + pos, sc.start + pos + len(needle))
    return t.span(sc.start, sc.end)


def _formula_refs(
    out: _Out,
    sc: Scalar,
    role: str,
    fld: str,
    index: int | None,
    stage: int | None,
    prefix: str | None = None,
    owner: str | None = None,
) -> None:
    value = sc.str_value
    if value is None:
        return
    hint = 0
    for tok in scan_formula(value):
        span = scalar_span(out.text, sc, tok.start, tok.end, token=tok.text, hint=hint)
        hint = tok.end
        if tok.is_call:
            out.refs.append(
                Reference(
                    tok.text,
                    span,
                    FUNCTION,
                    fld,
                    index,
                    stage,
                    tok.call,
                    canonical=f"{owner}.{tok.text}" if owner else None,
                )
            )
            continue
        text = f"{prefix}.{tok.text}" if prefix else tok.text
        out.refs.append(Reference(text, span, role, fld, index, stage, tok.call))


def _ref(
    out: _Out,
    sc: Node,
    role: str,
    fld: str,
    index: int | None = None,
    stage: int | None = None,
    text: str | None = None,
    canonical: str | None = None,
    prefix_span: Span | None = None,
) -> None:
    if not isinstance(sc, Scalar) or not isinstance(sc.value, str) or not sc.value.strip():
        return
    value = sc.value
    lead = len(value) - len(value.lstrip())
    stripped = value.strip()
    span = scalar_span(out.text, sc, lead, lead + len(stripped))
    out.refs.append(
        Reference(
            text or stripped, span, role, fld, index, stage, canonical=canonical, prefix_span=prefix_span
        )
    )


def _items(node: Node) -> list[tuple[int, Any]]:
    if isinstance(node, Sequence):
        return list(enumerate(node.items))
    if node is None:
        return []
    return [(0, node)]  # a single value where a list is expected: SLayer coerces several of these


def _walk_stage(out: _Out, node: Node, stage_index: int, earlier: set[str]) -> None:
    if not isinstance(node, Mapping):
        out.stages.append(Stage(stage_index, None, None, None, frozenset(), False, False, to_plain(node)))
        return
    t = out.text
    for key, _ in node.items:
        if isinstance(key.value, str) and key.value not in QUERY_FIELDS:
            close = tuple(difflib.get_close_matches(key.value, QUERY_FIELDS, n=3, cutoff=0.6))
            out.problems.append(
                Problem(
                    scalar_span(t, key),
                    "unknown-query-field",
                    f"unknown query field '{key.value}'",
                    "error",
                    close,
                )
            )
    name_node = node.get("name")
    name = name_node.value if isinstance(name_node, Scalar) and isinstance(name_node.value, str) else None
    src = node.get("source_model")
    source: str | None = None
    source_span: Span | None = None
    inline = False
    src_scalar: Node = None
    if isinstance(src, Scalar) and isinstance(src.value, str) and src.value.strip():
        src_scalar = src
    elif isinstance(src, Mapping):
        if src.get("source_name") is not None:
            src_scalar = src.get("source_name")
        else:
            inline = True
    if isinstance(src_scalar, Scalar) and isinstance(src_scalar.value, str) and src_scalar.value.strip():
        source = src_scalar.value.strip()
        source_span = scalar_span(
            t,
            src_scalar,
            len(src_scalar.value) - len(src_scalar.value.lstrip()),
            len(src_scalar.value.rstrip()),
        )
    earlier_stage = source is not None and source in earlier
    local: set[str] = set()
    for _, m in _items(node.get("measures")):
        if isinstance(m, Mapping):
            n = m.get("name")
            if isinstance(n, Scalar) and isinstance(n.value, str):
                local.add(n.value)
    for _, d in _items(node.get("dimensions")):
        if isinstance(d, Mapping) and d.get("expression") is not None:
            n = d.get("name")
            if isinstance(n, Scalar) and isinstance(n.value, str):
                local.add(n.value)
    si = len(out.stages)
    keys = tuple((str(k.value), scalar_span(t, k)) for k, _ in node.items if isinstance(k.value, str))
    out.stages.append(
        Stage(
            si,
            name,
            source,
            source_span,
            frozenset(local),
            inline,
            earlier_stage,
            to_plain(node),
            t.region(node.start, node.end),
            keys,
        )
    )
    if src_scalar is not None and not earlier_stage:
        _ref(out, src_scalar, SOURCE_MODEL, "source_model", None, si)

    for i, d in _items(node.get("dimensions")):
        if isinstance(d, Scalar):
            _formula_refs(out, d, DIMENSION, "dimensions", i, si)
        elif isinstance(d, Mapping):
            if d.get("expression") is not None:
                expr = d.get("expression")
                if isinstance(expr, Scalar):
                    _formula_refs(out, expr, DIMENSION, "dimensions", i, si)
            else:
                _name_ref(out, d, DIMENSION, "dimensions", i, si)
    for i, td in _items(node.get("time_dimensions")):
        if isinstance(td, Scalar):
            _formula_refs(out, td, TIME_DIMENSION, "time_dimensions", i, si)
        elif isinstance(td, Mapping):
            dim = td.get("dimension")
            if isinstance(dim, Scalar):
                _formula_refs(out, dim, TIME_DIMENSION, "time_dimensions", i, si)
            elif isinstance(dim, Mapping):
                _name_ref(out, dim, TIME_DIMENSION, "time_dimensions", i, si)
    mtd = node.get("main_time_dimension")
    if isinstance(mtd, Scalar):
        _ref(out, mtd, TIME_DIMENSION, "main_time_dimension", None, si)
    for i, m in _items(node.get("measures")):
        if isinstance(m, Scalar):
            _formula_refs(out, m, MEASURE, "measures", i, si)
        elif isinstance(m, Mapping):
            f = m.get("formula")
            if isinstance(f, Scalar):
                _formula_refs(out, f, MEASURE, "measures", i, si)
    for i, f in _items(node.get("filters")):
        if isinstance(f, Scalar):
            _formula_refs(out, f, FILTER, "filters", i, si)
    for i, o in _items(node.get("order")):
        if isinstance(o, Scalar):
            _formula_refs(out, o, ORDER, "order", i, si)
        elif isinstance(o, Mapping):
            col = o.get("column")
            raw = o.get("raw_formula")
            if isinstance(raw, Scalar) and raw.value:
                _formula_refs(out, raw, ORDER, "order", i, si)
            elif isinstance(col, Scalar):
                _formula_refs(out, col, ORDER, "order", i, si)
            elif isinstance(col, Mapping):
                _name_ref(out, col, ORDER, "order", i, si)
            elif col is None and o.get("direction") is None:
                for k, _ in o.items:  # shorthand {column: direction}
                    _ref(out, k, ORDER, "order", i, si)


def _name_ref(out: _Out, node: Mapping, role: str, fld: str, index: int, stage: int) -> None:
    """A ``{name, model}`` column reference: the name's span, the dotted text."""
    name = node.get("name")
    model = node.get("model")
    prefix = (
        model.value.strip()
        if isinstance(model, Scalar) and isinstance(model.value, str) and model.value.strip()
        else None
    )
    if isinstance(name, Scalar) and isinstance(name.value, str):
        pspan = None
        if prefix is not None and isinstance(model, Scalar) and isinstance(model.value, str):
            lead = len(model.value) - len(model.value.lstrip())
            pspan = scalar_span(out.text, model, lead, lead + len(prefix))
        _ref(
            out,
            name,
            role,
            fld,
            index,
            stage,
            text=f"{prefix}.{name.value.strip()}" if prefix else None,
            prefix_span=pspan,
        )


def _walk_query(out: _Out, root: Node) -> None:
    if isinstance(root, Sequence):
        names: set[str] = set()
        for item in root.items:
            _walk_stage(out, item, len(out.stages), names)
            if isinstance(item, Mapping):
                n = item.get("name")
                if isinstance(n, Scalar) and isinstance(n.value, str):
                    names.add(n.value)
    elif root is not None:
        _walk_stage(out, root, 0, set())


def _walk_memory(out: _Out, front: Node) -> None:
    if not isinstance(front, Mapping):
        return
    for i, e in _items(front.get("entities")):
        _ref(out, e, ENTITY_TAG, "entities", i)
    q = front.get("query")
    if isinstance(q, Mapping):
        _walk_stage(out, q, 0, set())


def _str(node: Node) -> str | None:
    return node.value if isinstance(node, Scalar) and isinstance(node.value, str) else None


def _walk_model(out: _Out, root: Node, path: str | None) -> str | None:
    if not isinstance(root, Mapping):
        return None
    t = out.text
    p = PurePosixPath(path.replace("\\", "/")) if path else None
    name = _str(root.get("name")) or (p.stem if p else None)
    ds = _str(root.get("data_source")) or (p.parent.name if p else None)
    if not name:
        return None
    mid = f"{ds}.{name}" if ds else name
    children: list[Symbol] = []
    sections = (("columns", "column"), ("measures", "measure"), ("aggregations", "aggregation"))
    for section, kind in sections:
        for i, item in _items(root.get(section)):
            if not isinstance(item, Mapping):
                continue
            nnode = item.get("name")
            leaf = _str(nnode)
            if not leaf:
                continue
            detail = _str(item.get("type")) if kind == "column" else _str(item.get("formula"))
            sel = scalar_span(t, nnode)
            children.append(Symbol(leaf, kind, sel, t.region(item.start, item.end), detail))
            out.refs.append(Reference(leaf, sel, DEFINITION, section, i, canonical=f"{mid}.{leaf}"))
            if kind == "measure":
                f = item.get("formula")
                if isinstance(f, Scalar):
                    _formula_refs(out, f, MODEL_FORMULA, "measures", i, None, owner=mid)
    for i, j in _items(root.get("joins")):
        if not isinstance(j, Mapping):
            continue
        target = j.get("target_model")
        tname = _str(target)
        if tname:
            sel = scalar_span(t, target)
            label = _str(j.get("name")) or tname
            children.append(Symbol(label, "join", sel, t.region(j.start, j.end), f"→ {tname}"))
            _ref(out, target, JOIN_TARGET, "joins", i, canonical=f"{ds}.{tname.strip()}" if ds else None)
        for _, pair in _items(j.get("join_pairs")):
            if isinstance(pair, Sequence) and len(pair.items) == 2:
                left, right = pair.items
                left_name, right_name = _str(left), _str(right)
                if left_name:
                    _ref(out, left, JOIN_KEY, "joins", i, canonical=f"{mid}.{left_name.strip()}")
                if right_name and tname and ds:
                    _ref(
                        out,
                        right,
                        JOIN_KEY,
                        "joins",
                        i,
                        canonical=f"{ds}.{tname.strip()}.{right_name.strip()}",
                    )
    for i, f in _items(root.get("filters")):
        if isinstance(f, Scalar):
            _formula_refs(out, f, MODEL_FORMULA, "filters", i, None, owner=mid)
    dtd = root.get("default_time_dimension")
    if isinstance(dtd, Scalar):
        _ref(out, dtd, MODEL_FORMULA, "default_time_dimension")
    nnode = root.get("name")
    sel = scalar_span(t, nnode) if isinstance(nnode, Scalar) else Span(0, 0, 0)
    if isinstance(nnode, Scalar):
        out.refs.append(Reference(name, sel, DEFINITION, "name", canonical=mid))
    out.symbols.append(
        Symbol(
            name,
            "model",
            sel,
            t.region(root.start, max(root.end, root.start)),
            _str(root.get("description")),
            tuple(children),
        )
    )
    return mid


def _walk_datasource(out: _Out, root: Node, path: str | None) -> None:
    if not isinstance(root, Mapping):
        return
    t = out.text
    nnode = root.get("name")
    name = _str(nnode) or (PurePosixPath(path).stem if path else None)
    if not name:
        return
    sel = scalar_span(t, nnode) if isinstance(nnode, Scalar) else Span(0, 0, 0)
    if isinstance(nnode, Scalar):
        out.refs.append(Reference(name, sel, DEFINITION, "name", canonical=name))
    out.symbols.append(
        Symbol(name, "datasource", sel, t.region(root.start, root.end), _str(root.get("type")))
    )


# --------------------------------------------------------------------------- entry points


def split_front_matter_lines(text: str) -> tuple[int, int] | None:
    """(first, last) line numbers of a memory file's front matter body (between the ``---`` lines),
    or None. An unterminated front matter runs to the end (it is being typed)."""
    lines = text.split("\n")
    if not lines or lines[0].rstrip("\r") != "---":
        return None
    for i in range(1, len(lines)):
        if lines[i].rstrip("\r") == "---":
            return 1, i
    return 1, len(lines)


def parse_document(text: str, kind: str, path: str | None = None, fmt: str | None = None) -> ParsedDocument:
    """Parse one document. Never raises: syntax errors become ``problems`` and the tolerant scanner
    stands in for the parser."""
    fmt = fmt or format_of(path, kind)
    t = Text(text)
    out = _Out(t)
    tree: Node = None
    data: Any = None
    scanned = False
    front: tuple[int, int] | None = None
    model_id = None
    if kind == "memory":
        front = split_front_matter_lines(text)
        if front is not None:
            first, last = front
            start = t.offset(first, 0)
            end = t.offset(last, 0) if last < len(t.starts) else len(text)
            # compose the front matter in place: blank out everything else so offsets stay exact
            masked = "".join(ch if ch == "\n" else " " for ch in text[:start]) + text[start:end]
            tree, problem, ok = compose_yaml(masked)
            scanned = not ok
            if problem is not None:
                out.problems.append(Problem(problem.span, problem.code, problem.message))
            data = to_plain(tree)
            _walk_memory(out, tree)
    elif kind in ("query", "model", "datasource"):
        if fmt == "json":
            tree, problem = parse_json(text)
            scanned = problem is not None
        else:
            tree, problem, ok = compose_yaml(text)
            scanned = not ok
        if problem is not None:
            out.problems.append(Problem(problem.span, problem.code, problem.message))
        data = to_plain(tree)
        if kind == "query":
            _walk_query(out, tree)
        elif kind == "model":
            model_id = _walk_model(out, tree, path)
        else:
            _walk_datasource(out, tree, path)
    return ParsedDocument(
        kind,
        fmt,
        text,
        tuple(out.refs),
        tuple(out.stages),
        tuple(out.problems),
        tuple(out.symbols),
        data,
        scanned,
        front,
        model_id,
    )


# --------------------------------------------------------------------------- cursor context


@dataclass(frozen=True, slots=True)
class CursorContext:
    """What the cursor is on, for completion: the reference role of the value being typed (None on a
    key or outside any reference), the text typed so far and where it starts."""

    role: str | None
    field: str | None
    prefix: str  # the reference typed left of the cursor: "stores.na", "memory:", ""
    start: Span  # from the start of ``prefix`` to the cursor
    stage: int | None = None
    call: str | None = None  # the innermost call around the cursor ("sum" in "sum(am|")
    on_key: bool = False  # the cursor is on a mapping key (a field name is being typed)
    path: tuple[Any, ...] = ()  # key path from the stage root (or document root)


_PREFIX_RE = re.compile(r"[A-Za-z_0-9.:*]*$")
_TAG_PREFIX_RE = re.compile(r"[^\s\[\],'\"{}]*$")  # a canonical id or memory:<id> being typed


def _locate(node: Node, offset: int, path: tuple[Any, ...]) -> tuple[Scalar | None, tuple[Any, ...], bool]:
    """The scalar containing ``offset`` (end inclusive), its path and whether it is a key."""
    if isinstance(node, Scalar):
        if node.start <= offset <= node.end:
            return node, path, False
        return None, path, False
    if isinstance(node, Mapping):
        for k, v in node.items:
            if (
                isinstance(k, Scalar)
                and k.start <= offset <= k.end
                and not (v is not None and _within(v, offset))
            ):
                return k, path + (k.value,), True
            if v is not None and _within(v, offset):
                return _locate(v, offset, path + (k.value,))
        return None, path, False
    if isinstance(node, Sequence):
        for i, v in enumerate(node.items):
            if v is not None and _within(v, offset):
                return _locate(v, offset, path + (i,))
        if node.flow and node.start < offset and (offset < node.end or not node.items):
            return Scalar("", offset, offset, offset, True), path + (len(node.items),), False
    return None, path, False


def _within(node: Node, offset: int) -> bool:
    return node is not None and node.start <= offset <= node.end


def _role_for(kind: str, path: tuple[Any, ...]) -> tuple[str | None, str | None, str]:
    """(role, field, mode) of a value at ``path`` (from a stage root for queries). ``mode`` is
    "ref" (the whole value is one reference) or "formula" (references inside an expression)."""
    if kind == "memory":
        if path[:1] == ("entities",):
            return ENTITY_TAG, "entities", "ref"
        if path[:1] == ("query",):
            return _role_for("query", path[1:])
        return None, None, "ref"
    if kind == "model":
        if len(path) >= 3 and path[0] == "joins" and path[2] == "target_model":
            return JOIN_TARGET, "joins", "ref"
        if len(path) >= 3 and path[0] == "joins" and path[2] == "join_pairs":
            return JOIN_KEY, "joins", "ref"
        if len(path) >= 3 and path[0] == "measures" and path[2] == "formula":
            return MODEL_FORMULA, "measures", "formula"
        if path[:1] == ("filters",):
            return MODEL_FORMULA, "filters", "formula"
        if path[:1] == ("default_time_dimension",):
            return MODEL_FORMULA, "default_time_dimension", "ref"
        return None, None, "ref"
    if kind != "query" or not path:
        return None, None, "ref"
    head = path[0]
    rest = path[1:]
    last = path[-1]
    if head == "source_model":
        if not rest or rest == ("source_name",):
            return SOURCE_MODEL, "source_model", "ref"
        return None, None, "ref"
    if head == "dimensions":
        if last in ("label", "model"):
            return None, None, "ref"
        return DIMENSION, "dimensions", "formula"
    if head == "time_dimensions":
        if len(rest) <= 1 or "dimension" in rest[1:2]:
            if last in ("label", "model", "granularity", "date_range"):
                return None, None, "ref"
            return TIME_DIMENSION, "time_dimensions", "formula"
        return None, None, "ref"
    if head == "main_time_dimension":
        return TIME_DIMENSION, "main_time_dimension", "ref"
    if head == "measures":
        if len(rest) <= 1 or rest[1:2] == ("formula",):
            return MEASURE, "measures", "formula"
        return None, None, "ref"
    if head == "filters":
        return FILTER, "filters", "formula"
    if head == "order":
        if len(rest) <= 1 or rest[1:2] in (("column",), ("raw_formula",)):
            if last in ("label", "model", "direction"):
                return None, None, "ref"
            return ORDER, "order", "formula"
        return None, None, "ref"
    return None, None, "ref"


def context_at(doc: ParsedDocument, line: int, col: int) -> CursorContext | None:
    """The completion context at a position, from the tolerant tree of the text as it is now."""
    t = Text(doc.text)
    if line >= len(t.starts):
        return None
    line_text = doc.text[t.starts[line] :].split("\n", 1)[0]
    col = min(col, len(line_text))
    offset = t.starts[line] + col
    tree: Node
    kind = doc.kind
    if kind == "memory":
        if doc.front_matter is None or not (doc.front_matter[0] <= line < doc.front_matter[1]):
            return None
        first, last = doc.front_matter
        start = t.offset(first, 0)
        end = t.offset(last, 0) if last < len(t.starts) else len(doc.text)
        masked = "".join(ch if ch == "\n" else " " for ch in doc.text[:start]) + doc.text[start:end]
        tree = YamlScanner(masked).parse()
    elif doc.fmt == "json":
        tree = JsonScanner(doc.text).parse()
    else:
        tree = YamlScanner(doc.text).parse()
    sc, path, on_key = _locate(tree, offset, ())
    if on_key or (sc is not None and sc.value is None):
        # ``- memory:`` reads as a one-key mapping while the id is being typed: a tag all the same
        role_here, _, _ = _role_for(kind, path[:-1] if on_key else path)
        if role_here == ENTITY_TAG or (on_key and _role_for(kind, path[:-1] + (0,))[0] == ENTITY_TAG):
            m = _TAG_PREFIX_RE.search(line_text[:col])
            prefix = m.group(0) if m else ""
            return CursorContext(
                ENTITY_TAG, "entities", prefix, Span(line, col - len(prefix), col), None, None, False, path
            )
    stage = None
    qpath = path
    if kind == "query" and isinstance(tree, Sequence) and path and isinstance(path[0], int):
        stage, qpath = path[0], path[1:]
    elif kind == "query":
        stage = 0
    elif kind == "memory" and path[:1] == ("query",):
        stage = 0
    if sc is None:
        return CursorContext(None, None, "", Span(line, col, col), stage, None, False, qpath)
    if on_key:
        typed = str(sc.value or "")[: max(0, offset - sc.text_start)] if sc.verbatim else ""
        depth_ok = (kind == "query" and len(qpath) == 1) or (
            kind == "memory" and qpath[:1] == ("query",) and len(qpath) == 2
        )
        if depth_ok:
            return CursorContext(
                None, None, typed, Span(line, col - len(typed), col), stage, None, True, qpath
            )
        return None
    role, fld, mode = _role_for(kind, qpath)
    if role is None:
        return CursorContext(None, None, "", Span(line, col, col), stage, None, False, qpath)
    value = sc.value if isinstance(sc.value, str) else ("" if sc.value is None else str(sc.value))
    if sc.verbatim or sc.value is None:
        rel = max(0, min(offset - sc.text_start, len(value)))
        before = value[:rel]
    else:
        before = line_text[:col]
    if mode == "ref" and role != JOIN_KEY:
        prefix = before.lstrip()
        if role in (ENTITY_TAG, SOURCE_MODEL, JOIN_TARGET):
            m = _TAG_PREFIX_RE.search(line_text[:col])
            prefix = m.group(0) if m else ""
        return CursorContext(role, fld, prefix, Span(line, col - len(prefix), col), stage, None, False, qpath)
    m = _PREFIX_RE.search(before)
    prefix = m.group(0) if m else ""
    # the innermost open call left of the prefix
    call = None
    toks = scan_formula(before[: len(before) - len(prefix)] + "x")
    if toks:
        call = toks[-1].call
    return CursorContext(role, fld, prefix, Span(line, col - len(prefix), col), stage, call, False, qpath)
