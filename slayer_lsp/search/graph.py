"""The property graph behind ``search(cypher_filter=...)``, on LadybugDB.

SLayer answers a ``cypher_filter`` by running the caller's openCypher query against an in-memory
LadybugDB graph of the store; the ids it returns become an allowlist for the search channels. This
module keeps SLayer's graph schema, so filters written for SLayer keep working, but differs in how
the graph is made and kept:

* it is loaded in bulk (``COPY`` from temporary CSV files, never inside the store) instead of one
  statement per node and edge, which is what makes SLayer's build take seconds;
* it follows the catalog: ``apply(catalog, delta)`` replaces only the nodes and edges of the touched
  canonical ids and rebuilds only when that is cheaper;
* the query is checked by a small lexer that knows Cypher's strings, comments and quoted names, so a
  word inside a literal never trips the checks and a keyword outside one always does.

Schema (every node table has ``id`` as primary key; leaf ids are canonical ids)::

    Memory(id='memory:<id>', learning, description)   Datasource(id, name, description)
    Model(id, name, description)                       ModelColumn(id, name, data_type, description)
    Measure(id, name, description)                     Aggregation(id, name, description)
    MENTIONS  Memory -> any node table (from the memory's tags that are in the graph)
    CONTAINS  Datasource -> Model, Model -> ModelColumn | Measure | Aggregation
    JOINS     Model -> Model, property cardinality

Hidden models, hidden columns and the leaves of hidden models are left out; so is time_spine.
"""

from __future__ import annotations

import csv
import io
import logging
import re
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from slayer_lsp.catalog.ids import MEMORY_PREFIX

if TYPE_CHECKING:
    from slayer_lsp.catalog import Catalog, Delta
    from slayer_lsp.store import documents as d

log = logging.getLogger(__name__)

MAX_CYPHER_CHARS = 10_000
#: Variable-length paths get at most this many hops; an open upper bound is capped to it. The
#: graph is shallow (CONTAINS is two levels deep) and enumerating long JOINS or MENTIONS walks grows
#: exponentially, so a larger bound only buys a timeout.
MAX_PATH_HOPS = 10
DEFAULT_TIMEOUT_S = 10.0
#: Rows a filter may return (its ids are an allowlist: more rows than the graph has nodes means
#: duplicates); reading them is ours, outside the engine's timeout, so they are counted.
MAX_FILTER_ROWS = 200_000
#: Memory of the graph's buffer pool: an intermediate result that needs more fails the filter with
#: an error instead of growing the daemon (a graph of 100,000 entities needs well under 128 MiB).
BUFFER_POOL_BYTES = 256 * 1024 * 1024
#: Functions that build a value of any size from a small input (``repeat('x', 10^9)``): the engine
#: allocates it outside the buffer pool and checks no timeout meanwhile, so they are refused.
AMPLIFYING_FUNCTIONS = frozenset({"REPEAT", "LPAD", "RPAD", "RANGE", "LIST_REDUCE", "ARRAY_REDUCE", "REDUCE"})
#: Concatenations multiply what they are fed when chained through WITH (``WITH a + a AS a`` thirty
#: times is 2**30 times the input). A clause with c of them (``+`` or these functions) grows a value
#: at most c + 1 fold; the product over the filter's clauses may not exceed ``MAX_GROWTH``.
CONCAT_FUNCTIONS = frozenset({
    "CONCAT", "LIST_CONCAT", "LIST_CAT", "ARRAY_CONCAT", "ARRAY_CAT", "LIST_APPEND", "ARRAY_APPEND",
    "ARRAY_PUSH_BACK", "LIST_PREPEND", "ARRAY_PREPEND", "ARRAY_PUSH_FRONT", "REGEXP_REPLACE",
})
MAX_GROWTH = 64

# Clause and statement keywords that write, read files, load code or manage transactions.
FORBIDDEN_KEYWORDS = frozenset({
    "CREATE", "MERGE", "DELETE", "DETACH", "SET", "REMOVE", "DROP", "CALL", "LOAD", "COPY", "ATTACH",
    "INSTALL", "UNINSTALL", "EXPORT", "IMPORT", "USE", "ALTER", "CHECKPOINT", "BEGIN", "COMMIT",
    "ROLLBACK",
})

# Label spelling (lower case) -> node table. ``Column`` is a reserved word in LadybugDB, hence the
# table name ModelColumn; the short spelling is accepted and rewritten.
NODE_LABELS = {
    "memory": "Memory", "datasource": "Datasource", "model": "Model", "modelcolumn": "ModelColumn",
    "column": "ModelColumn", "measure": "Measure", "aggregation": "Aggregation",
}
REL_TYPES = {"mentions": "MENTIONS", "contains": "CONTAINS", "joins": "JOINS"}
TABLE_KINDS = {
    "Memory": "memory", "Datasource": "datasource", "Model": "model", "ModelColumn": "column",
    "Measure": "measure", "Aggregation": "aggregation",
}

_NODE_COLUMNS = {
    "Memory": ("id", "learning", "description"),
    "Datasource": ("id", "name", "description"),
    "Model": ("id", "name", "description"),
    "ModelColumn": ("id", "name", "data_type", "description"),
    "Measure": ("id", "name", "description"),
    "Aggregation": ("id", "name", "description"),
}
_REL_PAIRS = {
    "MENTIONS": tuple(("Memory", t) for t in
                      ("Datasource", "Model", "ModelColumn", "Measure", "Aggregation", "Memory")),
    "CONTAINS": (("Datasource", "Model"), ("Model", "ModelColumn"), ("Model", "Measure"),
                 ("Model", "Aggregation")),
    "JOINS": (("Model", "Model"),),
}
_REL_PROPS = {"JOINS": ("cardinality",)}

# Node sets up to this size are created with one UNWIND statement, larger ones with COPY (UNWIND
# costs ~20 us a row, COPY ~2 us a row plus ~1.5 ms a statement; see bench/graph_build.py).
_UNWIND_MAX_ROWS = 100
# An update whose touched units weigh (in rows) more than this share of the graph is replaced by a
# rebuild: deleting and re-linking costs two to three times as much per row as a bulk load.
_REBUILD_SHARE = 0.3


class CypherFilterError(ValueError):
    """A cypher_filter that is unsafe, malformed, failed or timed out; the message says which."""


class GraphUnavailableError(ImportError):
    """LadybugDB cannot be imported or started; callers fall back to ``parse_label_filter``. An
    ``ImportError`` so that one ``except ImportError`` covers a missing package and a broken one."""


def is_available() -> bool:
    """True when LadybugDB imports (the import is deferred until a graph is needed)."""
    try:
        import ladybug  # noqa: F401
    except Exception:  # noqa: BLE001 - a broken native library is as unavailable as a missing one
        return False
    return True


# --------------------------------------------------------------------------- lexing and validation


class _Tok(NamedTuple):
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
_UNTERMINATED = {"'": "string literal (or a bad escape)", '"': "string literal (or a bad escape)",
                 "`": "quoted name"}
_PATH_WORDS = frozenset({"SHORTEST", "ALL", "TRAIL", "ACYCLIC"})


def _lex(text: str) -> Iterator[_Tok]:
    pos, n = 0, len(text)
    while pos < n:
        m = _TOKEN_RE.match(text, pos)
        assert m is not None and m.lastgroup is not None  # the op branch matches any non-space
        kind, tok = m.lastgroup, m.group()
        if kind == "op":
            if tok in _UNTERMINATED:
                raise CypherFilterError(f"cypher_filter has an unterminated {_UNTERMINATED[tok]} at offset {pos}.")
            if tok == "/" and text.startswith("/*", pos):
                raise CypherFilterError(f"cypher_filter has an unterminated /* comment at offset {pos}.")
        yield _Tok(kind, tok, pos, m.end())
        pos = m.end()


def _significant(text: str) -> list[_Tok]:
    return [t for t in _lex(text) if t.kind not in ("ws", "comment")]


def _name(tok: _Tok) -> str:
    return tok.text[1:-1].replace("``", "`") if tok.kind == "qident" else tok.text


def validate_cypher(text: str) -> str:
    """Check that ``text`` is one read-only ``MATCH ... RETURN ... AS id`` statement and return the
    text to run: labels spelled for LadybugDB (``Column`` -> ``ModelColumn``) and open-ended
    variable-length paths capped at ``MAX_PATH_HOPS``. Raises ``CypherFilterError``."""
    if not isinstance(text, str):
        raise CypherFilterError(f"cypher_filter must be a string, not {type(text).__name__}.")
    if len(text) > MAX_CYPHER_CHARS:
        raise CypherFilterError(
            f"cypher_filter is {len(text)} characters long; the limit is {MAX_CYPHER_CHARS}.")
    toks = _significant(text)
    if not toks:
        raise CypherFilterError("cypher_filter is empty; expected 'MATCH ... RETURN n.id AS id'.")
    if toks[0].kind != "ident" or toks[0].text.upper() != "MATCH":
        raise CypherFilterError(
            "cypher_filter must start with MATCH: only read-only graph queries are allowed.")
    growth, concatenations = 1, 0
    for i, tok in enumerate(toks):
        if tok.kind == "ident" and tok.text.upper() in ("WITH", "RETURN"):
            growth, concatenations = growth * (concatenations + 1), 0
        if tok.kind == "op" and tok.text == ";":
            raise CypherFilterError(
                "cypher_filter must be a single statement; ';' is not allowed outside string literals.")
        if tok.kind == "ident" and tok.text.upper() in FORBIDDEN_KEYWORDS:
            raise CypherFilterError(
                f"cypher_filter must be read-only; the keyword {tok.text.upper()} is not allowed "
                f"(offset {tok.start}).")
        called = _name(tok).upper() if tok.kind in ("ident", "qident") and i + 1 < len(toks) \
            and toks[i + 1].text == "(" else None
        if called in AMPLIFYING_FUNCTIONS:
            raise CypherFilterError(
                f"cypher_filter may not call {called.lower()}(): it builds values of any size (offset {tok.start}).")
        if called in CONCAT_FUNCTIONS or (tok.kind == "op" and tok.text == "+"):
            concatenations += 1
    growth *= concatenations + 1
    if growth > MAX_GROWTH:
        raise CypherFilterError(
            f"cypher_filter chains concatenations ('+', concat(), list_concat(), ...) that can grow a value "
            f"{growth}-fold; at most {MAX_GROWTH}-fold is allowed.")
    if not any(a.kind == "ident" and a.text.upper() == "AS" and b.kind in ("ident", "qident")
               and _name(b).lower() == "id" for a, b in zip(toks, toks[1:], strict=False)):
        raise CypherFilterError(
            "cypher_filter must return a column aliased id, e.g. 'RETURN n.id AS id'.")
    edits = _rewrites(toks)
    for start, end, new in sorted(edits, reverse=True):
        text = text[:start] + new + text[end:]
    return text


def _rewrites(toks: list[_Tok]) -> list[tuple[int, int, str]]:
    """Label spellings and path caps, as (start, end, replacement) edits of the original text.

    Brackets are tracked so that a ``:`` is read as a label only inside a node pattern ``( )`` or a
    relationship pattern ``-[ ]`` (not in a map ``{k: v}`` or a list slice ``l[1:2]``), and ``*``
    as a path length only at the top of a relationship pattern."""
    edits: list[tuple[int, int, str]] = []
    stack: list[str] = []
    expect: str | None = None  # "node" or "rel": the next name is a label
    after_label: str | None = None  # a label was just read, so '|' continues the alternation
    prev: _Tok | None = None
    i = 0
    while i < len(toks):
        tok = toks[i]
        if expect is not None and tok.kind in ("ident", "qident"):
            edits.extend(_label_edit(tok, expect))
            after_label, expect, prev = expect, None, tok
            i += 1
            continue
        expect, label_ctx, after_label = None, after_label, None
        if tok.kind == "op":
            text = tok.text
            top = stack[-1] if stack else None
            if text == "(":
                stack.append("(")
            elif text == "{":
                stack.append("{")
            elif text == "[":
                rel = prev is not None and prev.kind == "op" and prev.text in ("-", "<-")
                stack.append("rel" if rel else "list")
            elif text in ")]}":
                if stack:
                    stack.pop()
            elif text == ":" and top in ("(", "rel"):
                expect = "node" if top == "(" else "rel"
            elif text == "|" and label_ctx is not None:
                expect = label_ctx
            elif text == "*" and top == "rel":
                i = _bound_path(toks, i, edits)
                prev = toks[i - 1]
                continue
        prev = tok
        i += 1
    return edits


def _label_edit(tok: _Tok, where: str) -> list[tuple[int, int, str]]:
    name = _name(tok)
    known = NODE_LABELS if where == "node" else REL_TYPES
    table = known.get(name.lower())
    if table is None:
        if where == "node":
            raise CypherFilterError(
                f"unknown node label {name!r} in cypher_filter; known labels: Memory, Datasource, Model, "
                f"ModelColumn (or Column), Measure, Aggregation.")
        raise CypherFilterError(
            f"unknown relationship type {name!r} in cypher_filter; known types: MENTIONS, CONTAINS, JOINS.")
    return [] if table == tok.text else [(tok.start, tok.end, table)]


def _bound_path(toks: list[_Tok], i: int, edits: list[tuple[int, int, str]]) -> int:
    """Read the length spec after the ``*`` at ``toks[i]``; cap an open upper bound, refuse a bound
    above ``MAX_PATH_HOPS``. Returns the index of the first token after the spec."""
    j, last = i + 1, toks[i]
    while j < len(toks) and toks[j].kind == "ident" and toks[j].text.upper() in _PATH_WORDS:
        last, j = toks[j], j + 1
    lower = upper = dots = None
    if j < len(toks) and toks[j].kind == "number":
        lower, last, j = toks[j], toks[j], j + 1
    if j < len(toks) and toks[j].text == "..":
        dots, last, j = toks[j], toks[j], j + 1
        if j < len(toks) and toks[j].kind == "number":
            upper, last, j = toks[j], toks[j], j + 1
    for bound in (lower, upper):
        if bound is None:
            continue
        if not bound.text.isdigit():
            raise CypherFilterError(f"path length {bound.text!r} in cypher_filter must be a whole number.")
        if int(bound.text) > MAX_PATH_HOPS:
            raise CypherFilterError(
                f"variable-length path bound {bound.text} in cypher_filter exceeds the limit of "
                f"{MAX_PATH_HOPS} hops.")
    if (lower is not None and dots is None) or upper is not None:
        return j  # exactly n hops, or a closed range
    if dots is not None:
        edits.append((dots.end, dots.end, str(MAX_PATH_HOPS)))
    else:
        gap = " " if last.kind == "ident" else ""
        edits.append((last.end, last.end, f"{gap}1..{MAX_PATH_HOPS}"))
    log.info("cypher_filter: open-ended variable-length path capped at %d hops", MAX_PATH_HOPS)
    return j


def parse_label_filter(text: str) -> frozenset[str] | None:
    """The entity kinds of the naive form ``MATCH (v:Label[:Label...]) RETURN v.id AS id``, for use
    when the graph is unavailable; ``None`` when ``text`` is valid Cypher but not of that form.
    Labels are case-insensitive and ``Column`` means ``ModelColumn``. Raises ``CypherFilterError``
    for an unsafe or malformed filter or an unknown label."""
    validate_cypher(text)
    toks = _significant(text)
    words = [t.text.lower() if t.kind in ("ident", "op") else None for t in toks]
    if words[:2] != ["match", "("] or len(toks) < 4 or toks[2].kind != "ident":
        return None
    var = words[2]
    labels: list[str] = []
    i = 3
    while i + 1 < len(toks) and words[i] == ":" and toks[i + 1].kind in ("ident", "qident"):
        labels.append(_name(toks[i + 1]))
        i += 2
    if not labels or words[i:] != [")", "return", var, ".", "id", "as", "id"]:
        return None
    # validate_cypher has already refused unknown labels.
    return frozenset(TABLE_KINDS[NODE_LABELS[label.lower()]] for label in labels)


# --------------------------------------------------------------------------- rows from the catalog


@dataclass
class _Rows:
    """Node rows by table and edge rows by (relationship, from table, to table)."""

    nodes: dict[str, list[tuple[str, ...]]] = field(default_factory=dict)
    edges: dict[tuple[str, str, str], list[tuple[str, ...]]] = field(default_factory=dict)

    def node(self, table: str, values: tuple[str, ...]) -> None:
        self.nodes.setdefault(table, []).append(values)

    def edge(self, rel: str, src_table: str, dst_table: str, values: tuple[str, ...]) -> None:
        self.edges.setdefault((rel, src_table, dst_table), []).append(values)

    def __len__(self) -> int:
        return sum(map(len, self.nodes.values())) + sum(map(len, self.edges.values()))


def _unit(canonical: str) -> tuple[str, str]:
    """The unit of the graph an entity belongs to: its memory, its datasource node or its model
    subtree (a model and its leaves are always replaced together)."""
    if canonical.startswith(MEMORY_PREFIX):
        return ("memory", canonical)
    parts = canonical.split(".", 2)
    if len(parts) == 1:
        return ("datasource", canonical)
    return ("model", f"{parts[0]}.{parts[1]}")


class _View:
    """What one catalog puts into the graph: visible models, leaf tables, tag resolution."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.datasources = catalog.datasources
        self.models: dict[str, d.Model] = {mid: m for mid, m in catalog.models.items() if not m.hidden}
        self.memories = catalog.memories
        self._leaf_tables: dict[str, dict[str, str]] = {}

    def leaves(self, model: d.Model) -> Iterator[tuple[str, str, tuple[str, ...]]]:
        """(table, leaf name, extra values) for each leaf node of a visible model; a name is used
        once per table (a store may hold duplicates that SLayer's validation would refuse)."""
        seen: set[tuple[str, str]] = set()
        for col in model.columns:
            if not col.hidden and ("ModelColumn", col.name) not in seen:
                seen.add(("ModelColumn", col.name))
                yield "ModelColumn", col.name, (col.type or "", col.description or "")
        for meas in model.measures:
            if meas.name and ("Measure", meas.name) not in seen:
                seen.add(("Measure", meas.name))
                yield "Measure", meas.name, (meas.description or "",)
        for agg in model.aggregations:
            if ("Aggregation", agg.name) not in seen:
                seen.add(("Aggregation", agg.name))
                yield "Aggregation", agg.name, (agg.description or "",)

    def leaf_table(self, mid: str, leaf: str) -> str | None:
        tables = self._leaf_tables.get(mid)
        if tables is None:
            tables = {}
            # A tag naming a leaf that exists in two tables links to the measure, then the
            # aggregation, then the column, as SLayer does.
            for table, name, _ in self.leaves(self.models[mid]):
                rank = _LEAF_RANK[table]
                if name not in tables or rank < _LEAF_RANK[tables[name]]:
                    tables[name] = table
            self._leaf_tables[mid] = tables
        return tables.get(leaf)

    def table_of(self, tag: str) -> str | None:
        """The node table holding ``tag`` in this graph, or None (stale, hidden or malformed)."""
        if tag.startswith(MEMORY_PREFIX):
            return "Memory" if tag[len(MEMORY_PREFIX):] in self.memories else None
        parts = tag.split(".")
        if len(parts) == 1:
            return "Datasource" if tag in self.datasources else None
        mid = f"{parts[0]}.{parts[1]}"
        if mid not in self.models:
            return None
        if len(parts) == 2:
            return "Model"
        return self.leaf_table(mid, parts[2]) if len(parts) == 3 else None

    # Each emitter writes the unit's own nodes and the edges the unit owns: a model owns its leaves,
    # its CONTAINS edges (including the one from its datasource) and its outgoing JOINS; a memory
    # owns its outgoing MENTIONS.

    def emit_datasource(self, name: str, rows: _Rows) -> None:
        ds = self.datasources.get(name)
        if ds is not None:
            rows.node("Datasource", (name, name, ds.description or ""))

    def emit_model(self, mid: str, rows: _Rows) -> None:
        model = self.models.get(mid)
        if model is None:
            return
        ds = mid.split(".", 1)[0]
        rows.node("Model", (mid, model.name, model.description or ""))
        if ds in self.datasources:
            rows.edge("CONTAINS", "Datasource", "Model", (ds, mid))
        for table, name, extra in self.leaves(model):
            leaf = f"{mid}.{name}"
            rows.node(table, (leaf, name, *extra))
            rows.edge("CONTAINS", "Model", table, (mid, leaf))
        for join in model.joins:
            target = f"{ds}.{join.target_model}"
            if target in self.models:
                rows.edge("JOINS", "Model", "Model", (mid, target, join.cardinality or ""))

    def emit_memory(self, ref: str, rows: _Rows) -> None:
        memory = self.memories.get(ref[len(MEMORY_PREFIX):])
        if memory is None:
            return
        rows.node("Memory", (ref, memory.learning or "", memory.description or ""))
        self.emit_mentions(ref, memory.entities, rows)

    def emit_mentions(self, ref: str, tags: Iterable[str], rows: _Rows) -> None:
        for tag in tags:
            table = self.table_of(tag)
            if table is not None:
                rows.edge("MENTIONS", "Memory", table, (ref, tag))

    def emit_all(self) -> _Rows:
        rows = _Rows()
        for name in self.datasources:
            self.emit_datasource(name, rows)
        for mid in self.models:
            self.emit_model(mid, rows)
        for memory_id in self.memories:
            self.emit_memory(MEMORY_PREFIX + memory_id, rows)
        return rows

    def weight(self, kind: str, unit: str) -> int:
        """Rough number of rows (nodes and edges) a unit puts into the graph."""
        if kind == "model":
            model = self.models.get(unit)
            if model is None:
                return 1
            leaves = len(model.columns) + len(model.measures) + len(model.aggregations)
            return 2 + 2 * leaves + len(model.joins)
        if kind == "memory":
            memory = self.memories.get(unit[len(MEMORY_PREFIX):])
            return 1 + (len(memory.entities) if memory is not None else 0)
        return 1 + len(self.catalog.children(unit))


_LEAF_RANK = {"Measure": 0, "Aggregation": 1, "ModelColumn": 2}


# --------------------------------------------------------------------------- loading


def _schema_statements() -> Iterator[str]:
    for table, cols in _NODE_COLUMNS.items():
        yield f"CREATE NODE TABLE {table}({', '.join(f'{c} STRING' for c in cols)}, PRIMARY KEY(id))"
    for rel, pairs in _REL_PAIRS.items():
        props = "".join(f", {p} STRING" for p in _REL_PROPS.get(rel, ()))
        yield f"CREATE REL TABLE {rel}({', '.join(f'FROM {a} TO {b}' for a, b in pairs)}{props})"


def _quote_path(path: Path) -> str:
    return "'" + str(path).replace("\\", "\\\\").replace("'", "\\'") + "'"


def _load(conn: Any, rows: _Rows) -> None:
    """Load rows: edges and large node sets through ``COPY ... FROM`` temporary CSV files, small node
    sets through one parameterised UNWIND each (cheaper below about a hundred rows). Edges always
    use COPY: it finds endpoints through the primary-key index, whereas ``UNWIND ... MATCH`` joins
    against a scan of the whole endpoint table.

    The CSV is fully quoted, so '' stays '' rather than NULL and newlines survive; it is read
    sequentially because LadybugDB's parallel CSV reader cannot split quoted newlines."""
    jobs: list[tuple[str, list[tuple[str, ...]], str]] = []
    for table, lst in rows.nodes.items():
        if len(lst) <= _UNWIND_MAX_ROWS:
            _create_nodes(conn, table, lst)
        else:
            jobs.append((table, lst, ""))
    for (rel, src, dst), lst in rows.edges.items():
        jobs.append((rel, lst, f", from='{src}', to='{dst}'"))
    jobs = [job for job in jobs if job[1]]
    if not jobs:
        return
    with tempfile.TemporaryDirectory(prefix="slayer-lsp-graph-") as tmp:
        for n, (table, lst, extra) in enumerate(jobs):  # nodes first: edges look their endpoints up
            buf = io.StringIO()
            csv.writer(buf, quoting=csv.QUOTE_ALL).writerows(lst)
            path = Path(tmp) / f"{n}.csv"
            path.write_text(_no_nul(buf.getvalue()), encoding="utf-8", errors="replace", newline="")
            conn.execute(f"COPY {table} FROM {_quote_path(path)} (HEADER=false, PARALLEL=false{extra})")


def _create_nodes(conn: Any, table: str, lst: list[tuple[str, ...]]) -> None:
    if not lst:
        return
    cols = _NODE_COLUMNS[table]
    props = ", ".join(f"{c}: r.{c}" for c in cols)
    conn.execute(f"UNWIND $rows AS r CREATE (:{table} {{{props}}})",
                 {"rows": [dict(zip(cols, map(_no_nul, row), strict=True)) for row in lst]})


def _no_nul(text: str) -> str:
    """LadybugDB's CSV reader rejects NUL; it is dropped on both load paths so they agree."""
    return text.replace("\x00", "") if "\x00" in text else text


def _open_database(view: _View) -> tuple[Any, Any, Any, int]:
    """A fresh in-memory database holding ``view``: (database, query connection, write connection,
    number of rows loaded)."""
    try:
        import ladybug
    except Exception as exc:  # noqa: BLE001
        raise GraphUnavailableError(f"LadybugDB (python package 'ladybug') is not available: {exc}") from exc
    try:
        db = ladybug.Database(":memory:", buffer_pool_size=BUFFER_POOL_BYTES)
        writer = ladybug.Connection(db)
        reader = ladybug.Connection(db)
    except Exception as exc:  # noqa: BLE001
        raise GraphUnavailableError(f"LadybugDB could not start an in-memory database: {exc}") from exc
    try:
        for stmt in _schema_statements():
            writer.execute(stmt)
        rows = view.emit_all()
        _load(writer, rows)
    except Exception as exc:
        for obj in (reader, writer, db):
            _close_quietly(obj)
        raise GraphUnavailableError(f"LadybugDB could not load the graph: {exc}") from exc
    except BaseException:
        for obj in (reader, writer, db):
            _close_quietly(obj)
        raise
    return db, reader, writer, len(rows)


# --------------------------------------------------------------------------- the index


class GraphIndex:
    """A live LadybugDB graph of one store, kept in step with catalog snapshots.

    All use of the database goes through one lock: queries, updates and close never overlap."""

    def __init__(self, db: Any, reader: Any, writer: Any, rows: int, generation: int) -> None:
        self._db, self._reader, self._writer = db, reader, writer
        self._lock = threading.Lock()
        self._closed = False
        self._rows = rows  # rows loaded by the last build: the yardstick for rebuild decisions
        self.generation = generation  # of the catalog the graph reflects

    @classmethod
    def build(cls, catalog: Catalog) -> GraphIndex:
        """Build the graph of ``catalog`` in bulk. Raises ``GraphUnavailableError``."""
        return cls(*_open_database(_View(catalog)), catalog.generation)

    # ------------------------------------------------------------------ updates

    def apply(self, catalog: Catalog, delta: Delta) -> str:
        """Bring the graph to ``catalog``, touching only the units named by ``delta``; returns what
        was done: "unchanged", "incremental" or "rebuilt"."""
        touched: dict[str, set[str]] = {"datasource": set(), "model": set(), "memory": set()}
        for canonical in delta.touched:
            kind, unit = _unit(canonical)
            touched[kind].add(unit)
        with self._lock:
            self._check_open()
            if not any(touched.values()):
                self.generation = catalog.generation
                return "unchanged"
            view = _View(catalog)
            weight = sum(view.weight(kind, unit) for kind, units in touched.items() for unit in units)
            if weight > _REBUILD_SHARE * self._rows:
                self._rebuild(view)
                outcome = "rebuilt"
            else:
                try:
                    self._apply_units(view, touched)
                    outcome = "incremental"
                except Exception:  # noqa: BLE001 - a failed patch must not leave a half-updated graph
                    log.exception("graph: incremental update failed; rebuilding")
                    self._rebuild(view)
                    outcome = "rebuilt"
            self.generation = catalog.generation
            return outcome

    def _rebuild(self, view: _View) -> None:
        old = (self._reader, self._writer, self._db)
        self._db, self._reader, self._writer, self._rows = _open_database(view)
        for obj in old:
            _close_quietly(obj)

    def _apply_units(self, view: _View, touched: dict[str, set[str]]) -> None:
        conn = self._writer
        memories, models, datasources = (sorted(touched[k]) for k in ("memory", "model", "datasource"))
        # DETACH DELETE also drops every edge into the removed nodes; those from untouched units are
        # re-created below from the new catalog.
        if memories:
            conn.execute("MATCH (n:Memory) WHERE n.id IN $ids DETACH DELETE n", {"ids": memories})
        if models:
            conn.execute("MATCH (m:Model)-[:CONTAINS]->(n) WHERE m.id IN $ids DETACH DELETE n", {"ids": models})
            conn.execute("MATCH (m:Model) WHERE m.id IN $ids DETACH DELETE m", {"ids": models})
        if datasources:
            conn.execute("MATCH (n:Datasource) WHERE n.id IN $ids DETACH DELETE n", {"ids": datasources})

        rows = _Rows()
        for name in datasources:
            view.emit_datasource(name, rows)
        for mid in models:
            view.emit_model(mid, rows)
        for ref in memories:
            view.emit_memory(ref, rows)
        # Edges from untouched units into touched ones.
        for name in datasources:
            if name in view.datasources:
                for mid in view.catalog.children(name):
                    if mid in view.models and mid not in touched["model"]:
                        rows.edge("CONTAINS", "Datasource", "Model", (name, mid))
        if models:
            for mid, model in view.models.items():
                if mid in touched["model"]:
                    continue
                ds = mid.split(".", 1)[0]
                for join in model.joins:
                    target = f"{ds}.{join.target_model}"
                    if target in touched["model"] and target in view.models:
                        rows.edge("JOINS", "Model", "Model", (mid, target, join.cardinality or ""))
        exact = touched["memory"] | touched["datasource"] | touched["model"]
        below = tuple(mid + "." for mid in models)  # the leaves of a touched model
        for memory_id, memory in view.memories.items():
            ref = MEMORY_PREFIX + memory_id
            if ref in touched["memory"]:
                continue
            into = [tag for tag in memory.entities if tag in exact or tag.startswith(below)]
            if into:
                view.emit_mentions(ref, into, rows)
        _load(conn, rows)

    # ------------------------------------------------------------------ queries

    def run(self, cypher: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> frozenset[str]:
        """The ids returned by a validated ``cypher_filter``. Raises ``CypherFilterError`` when the
        filter is refused, fails or runs longer than ``timeout_s``."""
        text = validate_cypher(cypher)
        timeout_ms = max(1, int(timeout_s * 1000))
        deadline = time.monotonic() + timeout_s
        with self._lock:
            self._check_open()
            conn = self._reader
            conn.set_query_timeout(timeout_ms)
            try:
                result = conn.execute(text)
            except Exception as exc:  # noqa: BLE001 - the engine reports everything as RuntimeError
                message = str(exc).strip()
                if message.lower().startswith("interrupted"):
                    raise CypherFilterError(
                        f"cypher_filter timed out after {timeout_s:g} s; narrow the pattern or "
                        f"shorten variable-length paths.") from None
                if "buffer pool is full" in message.lower():
                    raise CypherFilterError(
                        f"cypher_filter needs more than the {BUFFER_POOL_BYTES >> 20} MiB the graph may use; "
                        f"narrow the pattern or return fewer, smaller values.") from None
                raise CypherFilterError(f"cypher_filter failed: {message}") from None
            if isinstance(result, list):  # cannot happen after validation; never trust it either
                for r in result:
                    r.close()
                raise CypherFilterError("cypher_filter must be a single statement.")
            try:
                return _collect_ids(result, deadline, timeout_s)
            finally:
                result.close()

    def counts(self) -> dict[str, int]:
        """Rows per node and relationship table (for checks and benchmarks)."""
        out: dict[str, int] = {}
        with self._lock:
            self._check_open()
            for table in _NODE_COLUMNS:
                out[table] = self._writer.execute(f"MATCH (n:{table}) RETURN count(*)").get_next()[0]
            for rel in _REL_PAIRS:
                out[rel] = self._writer.execute(f"MATCH ()-[r:{rel}]->() RETURN count(*)").get_next()[0]
        return out

    # ------------------------------------------------------------------ lifetime

    def _check_open(self) -> None:
        if self._closed:
            raise CypherFilterError("the cypher_filter graph has been closed.")

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for obj in (self._reader, self._writer, self._db):
                _close_quietly(obj)

    def __enter__(self) -> GraphIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _collect_ids(result: Any, deadline: float, timeout_s: float) -> frozenset[str]:
    """The ids of a result, read within ``MAX_FILTER_ROWS`` rows and the query's deadline (the
    engine's timeout ends at execute(); reading the rows is ours)."""
    names: list[str] = result.get_column_names()
    lowered = [n.lower() for n in names]
    if "id" in names:
        idx = names.index("id")
    elif "id" in lowered:
        idx = lowered.index("id")
    else:
        raise CypherFilterError(f"cypher_filter must return a column named id; it returned {names!r}.")
    ids: set[str] = set()
    rows = 0
    while result.has_next():
        rows += 1
        if rows > MAX_FILTER_ROWS:
            raise CypherFilterError(
                f"cypher_filter returned more than {MAX_FILTER_ROWS:,} rows; return each id once "
                f"(RETURN DISTINCT n.id AS id) or narrow the pattern.")
        if rows % 4096 == 0 and time.monotonic() > deadline:
            raise CypherFilterError(
                f"cypher_filter timed out after {timeout_s:g} s; narrow the pattern or shorten "
                f"variable-length paths.")
        value = result.get_next()[idx]
        if value is None:
            continue
        if isinstance(value, (dict, list)):
            raise CypherFilterError(
                "the id column of cypher_filter must hold ids (e.g. 'RETURN n.id AS id'), not nodes, "
                "relationships or lists.")
        ids.add(str(value))
    return frozenset(ids)


def _close_quietly(obj: Any) -> None:
    try:
        obj.close()
    except Exception:  # noqa: BLE001 - closing a dead handle must not mask the real work
        log.debug("graph: close failed", exc_info=True)
