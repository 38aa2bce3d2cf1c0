"""What a ``cypher_filter`` may say: one read-only ``MATCH ... RETURN ... AS id`` statement.

``validate_cypher`` refuses writes, several statements, calls outside ``ALLOWED_FUNCTIONS`` and
concatenations that could grow a value without bound; it spells labels for LadybugDB and caps
open-ended variable-length paths. ``parse_label_filter`` reads the naive label form for when the
graph is unavailable. Both work on the tokens of ``cypher_lexer.py``; running a filter is
``graph.py``'s.
"""

from __future__ import annotations

import logging

from slayer_lsp.search.cypher_lexer import CypherFilterError, Token, significant_tokens, token_name

log = logging.getLogger(__name__)

MAX_CYPHER_CHARS = 10_000
#: Variable-length paths get at most this many hops; an open upper bound is capped to it. The
#: graph is shallow (CONTAINS is two levels deep) and enumerating long JOINS or MENTIONS walks grows
#: exponentially, so a larger bound only buys a timeout.
MAX_PATH_HOPS = 10
#: Where the functions a filter may call are listed for users.
ALLOWED_FUNCTIONS_DOC = "protocol/README.md (cypher_filter)"
#: The functions a filter may call: what selecting catalog entities needs (string tests and case,
#: null handling, labels and paths, list membership, aggregation). Everything else -- functions
#: that build values of any size (repeat, lpad, replace, regexp_replace, list_concat, range...),
#: run in more than linear time (levenshtein, list_sort...), read files or settings -- is refused.
ALLOWED_FUNCTIONS = frozenset(
    {
        # strings (linear in their input)
        "LOWER",
        "UPPER",
        "TOLOWER",
        "TOUPPER",
        "LCASE",
        "UCASE",
        "TRIM",
        "LTRIM",
        "RTRIM",
        "SIZE",
        "STARTS_WITH",
        "ENDS_WITH",
        "CONTAINS",
        "PREFIX",
        "SUFFIX",
        "SUBSTRING",
        "SUBSTR",
        "LEFT",
        "RIGHT",
        "SPLIT_PART",
        "REGEXP_MATCHES",
        "REGEXP_FULL_MATCH",
        "CONCAT",
        "STRING",
        "TO_STRING",
        "CAST",
        # nulls
        "COALESCE",
        "IFNULL",
        "NULLIF",
        # nodes, relationships, paths
        "ID",
        "LABEL",
        "LABELS",
        "NODES",
        "RELS",
        "RELATIONSHIPS",
        "PROPERTIES",
        "START_NODE",
        "END_NODE",
        "LENGTH",
        "IS_TRAIL",
        "IS_ACYCLIC",
        # lists: membership and picking
        "LIST_CONTAINS",
        "LIST_HAS",
        "ARRAY_CONTAINS",
        "ARRAY_HAS",
        "LIST_HAS_ANY",
        "LIST_HAS_ALL",
        "LIST_ELEMENT",
        "LIST_EXTRACT",
        "LIST_POSITION",
        "LIST_INDEXOF",
        "LIST_DISTINCT",
        "LIST_UNIQUE",
        "LIST_MIN",
        "LIST_MAX",
        "ALL",
        "ANY",
        "NONE",
        "SINGLE",
        # aggregation
        "COUNT",
        "COLLECT",
        "MIN",
        "MAX",
        "SUM",
        "AVG",
    }
)
#: Words followed by '(' that are syntax, not calls (``WHERE (a)-->(b)``, ``NOT (x)``, ...).
_NOT_CALLS = frozenset(
    {
        "MATCH",
        "OPTIONAL",
        "WHERE",
        "AND",
        "OR",
        "XOR",
        "NOT",
        "RETURN",
        "WITH",
        "UNWIND",
        "IN",
        "AS",
        "DISTINCT",
        "CASE",
        "WHEN",
        "THEN",
        "ELSE",
        "END",
        "ORDER",
        "BY",
        "SKIP",
        "LIMIT",
        "UNION",
        "IS",
        "STARTS",
        "ENDS",
        "ASC",
        "DESC",
        "ASCENDING",
        "DESCENDING",
        "EXISTS",
        "NULL",
        "TRUE",
        "FALSE",
    }
)
#: Concatenations multiply what they are fed when chained through WITH (``WITH a + a AS a`` thirty
#: times is 2**30 times the input). A clause with c of them (``+`` or concat()) grows a value at most
#: c + 1 fold; the product over the filter's clauses may not exceed ``MAX_GROWTH``.
CONCAT_FUNCTIONS = frozenset({"CONCAT"})
MAX_GROWTH = 64

# Clause and statement keywords that write, read files, load code or manage transactions.
FORBIDDEN_KEYWORDS = frozenset(
    {
        "CREATE",
        "MERGE",
        "DELETE",
        "DETACH",
        "SET",
        "REMOVE",
        "DROP",
        "CALL",
        "LOAD",
        "COPY",
        "ATTACH",
        "INSTALL",
        "UNINSTALL",
        "EXPORT",
        "IMPORT",
        "USE",
        "ALTER",
        "CHECKPOINT",
        "BEGIN",
        "COMMIT",
        "ROLLBACK",
    }
)

# Label spelling (lower case) -> node table. ``Column`` is a reserved word in LadybugDB, hence the
# table name ModelColumn; the short spelling is accepted and rewritten.
NODE_LABELS = {
    "memory": "Memory",
    "datasource": "Datasource",
    "model": "Model",
    "modelcolumn": "ModelColumn",
    "column": "ModelColumn",
    "measure": "Measure",
    "aggregation": "Aggregation",
}
REL_TYPES = {"mentions": "MENTIONS", "contains": "CONTAINS", "joins": "JOINS"}
TABLE_KINDS = {
    "Memory": "memory",
    "Datasource": "datasource",
    "Model": "model",
    "ModelColumn": "column",
    "Measure": "measure",
    "Aggregation": "aggregation",
}
_PATH_WORDS = frozenset({"SHORTEST", "ALL", "TRAIL", "ACYCLIC"})  # words of a path length spec


def validate_cypher(text: str) -> str:
    """Check that ``text`` is one read-only ``MATCH ... RETURN ... AS id`` statement and return the
    text to run: labels spelled for LadybugDB (``Column`` -> ``ModelColumn``) and open-ended
    variable-length paths capped at ``MAX_PATH_HOPS``. Raises ``CypherFilterError``."""
    if not isinstance(text, str):
        raise CypherFilterError(f"cypher_filter must be a string, not {type(text).__name__}.")
    if len(text) > MAX_CYPHER_CHARS:
        raise CypherFilterError(
            f"cypher_filter is {len(text)} characters long; the limit is {MAX_CYPHER_CHARS}."
        )
    toks = significant_tokens(text)
    if not toks:
        raise CypherFilterError("cypher_filter is empty; expected 'MATCH ... RETURN n.id AS id'.")
    if toks[0].kind != "ident" or toks[0].text.upper() != "MATCH":
        raise CypherFilterError(
            "cypher_filter must start with MATCH: only read-only graph queries are allowed."
        )
    growth, concatenations = 1, 0
    for i, tok in enumerate(toks):
        if tok.kind == "ident" and tok.text.upper() in ("WITH", "RETURN"):
            growth, concatenations = growth * (concatenations + 1), 0
        if tok.kind == "op" and tok.text == ";":
            raise CypherFilterError(
                "cypher_filter must be a single statement; ';' is not allowed outside string literals."
            )
        if tok.kind == "ident" and tok.text.upper() in FORBIDDEN_KEYWORDS:
            raise CypherFilterError(
                f"cypher_filter must be read-only; the keyword {tok.text.upper()} is not allowed "
                f"(offset {tok.start})."
            )
        called = _call_name(toks, i)
        if called is not None and called not in ALLOWED_FUNCTIONS:
            raise CypherFilterError(
                f"cypher_filter may not call {called.lower()}() (offset {tok.start}): only the functions "
                f"listed in {ALLOWED_FUNCTIONS_DOC} are allowed: "
                f"{', '.join(sorted(f.lower() for f in ALLOWED_FUNCTIONS))}."
            )
        if called in CONCAT_FUNCTIONS or (tok.kind == "op" and tok.text == "+"):
            concatenations += 1
    growth *= concatenations + 1
    if growth > MAX_GROWTH:
        raise CypherFilterError(
            f"cypher_filter chains concatenations ('+', concat()) that can grow a value "
            f"{growth}-fold; at most {MAX_GROWTH}-fold is allowed."
        )
    if not any(
        a.kind == "ident"
        and a.text.upper() == "AS"
        and b.kind in ("ident", "qident")
        and token_name(b).lower() == "id"
        for a, b in zip(toks, toks[1:], strict=False)
    ):
        raise CypherFilterError("cypher_filter must return a column aliased id, e.g. 'RETURN n.id AS id'.")
    edits = _rewrites(toks)
    for start, end, new in sorted(edits, reverse=True):
        text = text[:start] + new + text[end:]
    return text


def _call_name(toks: list[Token], i: int) -> str | None:
    """The upper-cased name of the function ``toks[i]`` calls, or None when it calls nothing (a
    name not followed by '(', or a keyword such as ``WHERE (a)-->(b)``). A quoted name is a call
    too: the engine resolves `levenshtein`(...) as it does levenshtein(...)."""
    tok = toks[i]
    if tok.kind not in ("ident", "qident") or i + 1 >= len(toks) or toks[i + 1].text != "(":
        return None
    name = token_name(tok).upper()
    if tok.kind == "ident" and name in _NOT_CALLS:
        return None
    return name


def _rewrites(toks: list[Token]) -> list[tuple[int, int, str]]:
    """Label spellings and path caps, as (start, end, replacement) edits of the original text.

    Brackets are tracked so that a ``:`` is read as a label only inside a node pattern ``( )`` or a
    relationship pattern ``-[ ]`` (not in a map ``{k: v}`` or a list slice ``l[1:2]``), and ``*``
    as a path length only at the top of a relationship pattern."""
    edits: list[tuple[int, int, str]] = []
    stack: list[str] = []
    expect: str | None = None  # "node" or "rel": the next name is a label
    after_label: str | None = None  # a label was just read, so '|' continues the alternation
    prev: Token | None = None
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


def _label_edit(tok: Token, where: str) -> list[tuple[int, int, str]]:
    name = token_name(tok)
    known = NODE_LABELS if where == "node" else REL_TYPES
    table = known.get(name.lower())
    if table is None:
        if where == "node":
            raise CypherFilterError(
                f"unknown node label {name!r} in cypher_filter; known labels: Memory, Datasource, Model, "
                f"ModelColumn (or Column), Measure, Aggregation."
            )
        raise CypherFilterError(
            f"unknown relationship type {name!r} in cypher_filter; known types: MENTIONS, CONTAINS, JOINS."
        )
    return [] if table == tok.text else [(tok.start, tok.end, table)]


def _bound_path(toks: list[Token], i: int, edits: list[tuple[int, int, str]]) -> int:
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
                f"{MAX_PATH_HOPS} hops."
            )
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
    toks = significant_tokens(text)
    words = [t.text.lower() if t.kind in ("ident", "op") else None for t in toks]
    if words[:2] != ["match", "("] or len(toks) < 4 or toks[2].kind != "ident":
        return None
    var = words[2]
    labels: list[str] = []
    i = 3
    while i + 1 < len(toks) and words[i] == ":" and toks[i + 1].kind in ("ident", "qident"):
        labels.append(token_name(toks[i + 1]))
        i += 2
    if not labels or words[i:] != [")", "return", var, ".", "id", "as", "id"]:
        return None
    # validate_cypher has already refused unknown labels.
    return frozenset(TABLE_KINDS[NODE_LABELS[label.lower()]] for label in labels)
