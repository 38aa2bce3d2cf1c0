"""Document parsing: fixture text in, references (text, role, exact range), problems and cursor
contexts out. ``§`` marks the cursor in context cases; ranges are (line, start, end) in code points."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slayer_lsp.analysis import parsed_file as dm
from slayer_lsp.lsp.options import DEFAULT_MEMORY_PATTERNS, DEFAULT_QUERY_PATTERNS


def refs_of(text: str, kind: str, path: str) -> list[tuple[str, str, int, int, int]]:
    doc = dm.parse_document(text, kind, path)
    return [(r.text, r.role, r.span.line, r.span.start, r.span.end) for r in doc.refs]


def sliced(text: str, span: dm.Span) -> str:
    return text.split("\n")[span.line][span.start : span.end]


# --------------------------------------------------------------------------- references

REF_CASES = [
    pytest.param(
        "source_model: orders\ndimensions: [stores.name, status]\n",
        "query",
        "q.query.yaml",
        [
            ("orders", "source_model", 0, 14, 20),
            ("stores.name", "dimension", 1, 13, 24),
            ("status", "dimension", 1, 26, 32),
        ],
        id="yaml-flow-list",
    ),
    pytest.param(
        "source_model: orders\nmeasures:\n  - sum(subtotal)\n  - {formula: 'count_distinct(customer_id)', name: buyers}\n",
        "query",
        "q.query.yaml",
        [
            ("orders", "source_model", 0, 14, 20),
            ("sum", "function", 2, 4, 7),
            ("subtotal", "measure", 2, 8, 16),
            ("count_distinct", "function", 3, 15, 29),
            ("customer_id", "measure", 3, 30, 41),
        ],
        id="yaml-measures",
    ),
    pytest.param(
        "source_model: orders\nfilters:\n  - status = 'completed' and order_total > {min}\n",
        "query",
        "q.query.yaml",
        [
            ("orders", "source_model", 0, 14, 20),
            ("status", "filter", 2, 4, 10),
            ("order_total", "filter", 2, 29, 40),
        ],
        id="filter-skips-literals-and-variables",
    ),
    pytest.param(
        "source_model: orders\ntime_dimensions:\n  - month(ordered_at)\n  - dimension: {name: city, model: stores}\n"
        "    granularity: day\norder:\n  - column: total_revenue\n    direction: desc\n  - {stores.name: asc}\n",
        "query",
        "q.query.yaml",
        [
            ("orders", "source_model", 0, 14, 20),
            ("month", "function", 2, 4, 9),
            ("ordered_at", "time_dimension", 2, 10, 20),
            ("stores.city", "time_dimension", 3, 22, 26),
            ("total_revenue", "order", 6, 12, 25),
            ("stores.name", "order", 8, 5, 16),
        ],
        id="time-dims-and-order",
    ),
    pytest.param(
        '{"source_model": "orders", "dimensions": ["customers.city"],\n "measures": ["weighted_avg(order_total, weight=subtotal)"]}',
        "query",
        "q.query.json",
        [
            ("orders", "source_model", 0, 18, 24),
            ("customers.city", "dimension", 0, 43, 57),
            ("weighted_avg", "function", 1, 15, 27),
            ("order_total", "measure", 1, 28, 39),
            ("subtotal", "measure", 1, 48, 56),
        ],
        id="json",
    ),
    pytest.param(
        "- name: monthly\n  source_model: orders\n  dimensions: [status]\n- source_model: monthly\n  dimensions: [status]\n",
        "query",
        "q.query.yaml",
        [
            ("orders", "source_model", 1, 16, 22),
            ("status", "dimension", 2, 15, 21),
            ("status", "dimension", 4, 15, 21),
        ],
        id="stages-earlier-stage-is-no-source-ref",
    ),
    pytest.param(
        "---\nentities:\n- jaffle.orders\n- memory:kb.revenue\nversion: 4\n---\nA learning with jaffle.stores in it.\n",
        "memory",
        "memories/x.md",
        [("jaffle.orders", "entity_tag", 2, 2, 15), ("memory:kb.revenue", "entity_tag", 3, 2, 19)],
        id="memory-tags",
    ),
    pytest.param(
        "---\nentities: [jaffle.orders]\nquery:\n  source_model: orders\n  dimensions: [status]\n---\nbody\n",
        "memory",
        "memories/x.md",
        [
            ("jaffle.orders", "entity_tag", 1, 11, 24),
            ("orders", "source_model", 3, 16, 22),
            ("status", "dimension", 4, 15, 21),
        ],
        id="memory-with-query",
    ),
    pytest.param(
        "source_model: orders\ndimensions:\n  - \"caf\\u00e9.name\"\n  - 'it''s'\n",
        "query",
        "q.query.yaml",
        # an escaped value is not verbatim in the text: a token not found there gets the scalar's range
        [
            ("orders", "source_model", 0, 14, 20),
            ("café.name", "dimension", 2, 4, 20),
            ("it", "dimension", 3, 5, 7),
        ],
        id="escaped-scalars",
    ),
    pytest.param(
        "source_model: orders\ndimensions: [sto😀res.name]\n",
        "query",
        "q.query.yaml",
        [
            ("orders", "source_model", 0, 14, 20),
            ("sto", "dimension", 1, 13, 16),
            ("res.name", "dimension", 1, 17, 25),
        ],
        id="code-points-not-utf16",
    ),
]


@pytest.mark.parametrize(("text", "kind", "path", "expected"), REF_CASES)
def test_references(text, kind, path, expected):
    assert refs_of(text, kind, path) == expected


def test_reference_ranges_cover_their_text():
    text = REF_CASES[3].values[0]
    doc = dm.parse_document(text, "query", "q.query.yaml")
    for r in doc.refs:
        if r.text != "stores.city":  # a {name, model} ref spans the name only
            assert sliced(text, r.span) == r.text


def test_model_file_symbols_and_refs():
    text = (
        "name: orders\ndata_source: jaffle\ncolumns:\n- name: id\n  type: INT\n- name: store_id\n  type: INT\n"
        "measures:\n- name: revenue\n  formula: sum(amount)\naggregations:\n- name: avg_nz\n  formula: AVG({value})\n"
        "joins:\n- target_model: stores\n  join_pairs:\n  - - store_id\n    - id\n"
    )
    doc = dm.parse_document(text, "model", "/s/models/jaffle/orders.yaml")
    assert doc.model_id == "jaffle.orders"
    (model,) = doc.symbols
    assert (model.name, model.kind, model.selection) == ("orders", "model", dm.Span(0, 6, 12))
    assert [(c.name, c.kind, c.selection.line) for c in model.children] == [
        ("id", "column", 3),
        ("store_id", "column", 5),
        ("revenue", "measure", 8),
        ("avg_nz", "aggregation", 11),
        ("stores", "join", 14),
    ]
    roles = {(r.text, r.role, r.canonical) for r in doc.refs}
    assert ("stores", "join_target", "jaffle.stores") in roles
    assert ("store_id", "join_key", "jaffle.orders.store_id") in roles
    assert ("id", "join_key", "jaffle.stores.id") in roles
    assert ("amount", "model_formula", None) in roles
    assert ("revenue", "definition", "jaffle.orders.revenue") in roles


# --------------------------------------------------------------------------- problems and fallback

PROBLEM_CASES = [
    pytest.param(
        "source_model: orders\nlimt: 3\n",
        "q.query.yaml",
        [("unknown-query-field", 1, ("limit",))],
        id="unknown-field-with-suggestion",
    ),
    pytest.param(
        "source_model: orders\ndimensions: [a, b\n", "q.query.yaml", [("invalid-yaml", 2, ())], id="yaml"
    ),
    pytest.param(
        '{"source_model": "orders",\n "dimensions": ["a"\n',
        "q.query.json",
        [("invalid-json", 2, ())],
        id="json",
    ),
    pytest.param(
        "source_model: orders\n\tdimensions: [a]\n", "q.query.yaml", [("invalid-yaml", 1, ())], id="tab"
    ),
]


@pytest.mark.parametrize(("text", "path", "expected"), PROBLEM_CASES)
def test_problems(text, path, expected):
    doc = dm.parse_document(text, "query", path)
    assert [(p.code, p.span.line, p.suggestions) for p in doc.problems] == expected


def test_half_typed_yaml_still_yields_references():
    text = "source_model: orders\ndimensions:\n  - stores.na\n  - [\nmeasures: [sum(sub\n"
    doc = dm.parse_document(text, "query", "q.query.yaml")
    assert doc.scanned and doc.problems[0].code == "invalid-yaml"
    assert [(r.text, r.role) for r in doc.refs] == [
        ("orders", "source_model"),
        ("stores.na", "dimension"),
        ("sum", "function"),
        ("sub", "measure"),
    ]
    assert doc.stages[0].source_model == "orders"


def test_unterminated_front_matter_is_read_to_the_end():
    doc = dm.parse_document("---\nentities:\n- jaffle.or", "memory", "memories/m.md")
    assert [(r.text, r.role) for r in doc.refs] == [("jaffle.or", "entity_tag")]


@settings(max_examples=300, deadline=None)
@given(
    st.text(alphabet=st.sampled_from(list("ab:-[]{}\"' \n\t#,.()|>&*!%@`\\")), max_size=80),
    st.sampled_from(["q.query.yaml", "q.query.json"]),
)
def test_parsing_never_raises(text, path):
    doc = dm.parse_document(text, "query", path)
    for line in range(len(text.split("\n")) + 1):
        for col in range(0, 12):
            dm.context_at(doc, line, col)


# --------------------------------------------------------------------------- cursor context

CONTEXT_CASES = [
    pytest.param(
        "source_model: or§", "query", "q.query.yaml", ("source_model", "or", None, False), id="source"
    ),
    pytest.param(
        "source_model: orders\ndimensions:\n  - stores.na§\n",
        "query",
        "q.query.yaml",
        ("dimension", "stores.na", None, False),
        id="dimension-item",
    ),
    pytest.param(
        "source_model: orders\ndimensions:\n  - §\n",
        "query",
        "q.query.yaml",
        ("dimension", "", None, False),
        id="empty-item",
    ),
    pytest.param(
        "source_model: orders\nmeasures: [sum(sub§\n",
        "query",
        "q.query.yaml",
        ("measure", "sub", "sum", False),
        id="inside-call-broken-yaml",
    ),
    pytest.param(
        'source_model: orders\nmeasures: ["avg(a) + max(§)"]\n',
        "query",
        "q.query.yaml",
        ("measure", "", "max", False),
        id="second-call",
    ),
    pytest.param(
        "source_model: orders\nfilters:\n  - status = 'x' and cust§\n",
        "query",
        "q.query.yaml",
        ("filter", "cust", None, False),
        id="filter",
    ),
    pytest.param(
        "source_model: orders\norder:\n  - column: tot§\n",
        "query",
        "q.query.yaml",
        ("order", "tot", None, False),
        id="order-column",
    ),
    pytest.param(
        '{"source_model": "orders", "dimensions": ["stores.§',
        "query",
        "q.query.json",
        ("dimension", "stores.", None, False),
        id="json-unterminated",
    ),
    pytest.param(
        "source_model: orders\ndimen§", "query", "q.query.yaml", (None, "dimen", None, True), id="key"
    ),
    pytest.param(
        "---\nentities:\n- memory:§\n---\n",
        "memory",
        "memories/m.md",
        ("entity_tag", "memory:", None, False),
        id="memory-tag",
    ),
    pytest.param(
        "---\nentities: [jaffle.ord§]\n---\n",
        "memory",
        "memories/m.md",
        ("entity_tag", "jaffle.ord", None, False),
        id="memory-flow-tag",
    ),
    pytest.param("---\nentities: [a]\n---\nbody text §\n", "memory", "memories/m.md", None, id="memory-body"),
    pytest.param(
        "source_model: orders\nlimit: 1§\n", "query", "q.query.yaml", (None, "", None, False), id="no-ref"
    ),
]


@pytest.mark.parametrize(("marked", "kind", "path", "expected"), CONTEXT_CASES)
def test_context_at(marked, kind, path, expected):
    before = marked[: marked.index("§")]
    line, col = before.count("\n"), len(before.split("\n")[-1])
    doc = dm.parse_document(marked.replace("§", ""), kind, path)
    ctx = dm.context_at(doc, line, col)
    got = None if ctx is None else (ctx.role, ctx.prefix, ctx.call, ctx.on_key)
    assert got == expected
    if ctx is not None:
        assert ctx.start.end == col and ctx.start.end - ctx.start.start == len(ctx.prefix)


# --------------------------------------------------------------------------- formulas, classification

FORMULA_CASES = [
    ("status = 'completed' and order_total > 10", [("status", False, None), ("order_total", False, None)]),
    (
        "weighted_avg(order_total, weight=subtotal)",
        [
            ("weighted_avg", True, None),
            ("order_total", False, "weighted_avg"),
            ("subtotal", False, "weighted_avg"),
        ],
    ),
    (
        "count(orders.*) / count(*)",
        [("count", True, None), ("orders", False, "count"), ("count", True, None)],
    ),
    ("x in ('a', 'b') or y is not null", [("x", False, None), ("y", False, None)]),
    ("amount:sum", [("amount", False, None)]),
    ("coalesce(a, 0) >= {floor}", [("a", False, "coalesce")]),
]


@pytest.mark.parametrize(("text", "expected"), FORMULA_CASES)
def test_scan_formula(text, expected):
    assert [(tok.text, tok.is_call, tok.call) for tok in dm.scan_formula(text)] == expected


CLASSIFY_CASES = [
    ("/w/reports/a.query.yaml", "query"),
    ("/w/reports/a.query.json", "query"),
    ("/w/queries/sub/x.yml", "query"),
    ("/w/notes/memories/7.md", "memory"),
    ("/store/models/jaffle/orders.yaml", "model"),
    ("/store/datasources/jaffle.yaml", "datasource"),
    ("/store/memories/kb.md", "memory"),
    ("/w/other.yaml", "other"),
    ("/w/README.md", "other"),
]


@pytest.mark.parametrize(("path", "kind"), CLASSIFY_CASES)
def test_classify(path, kind):
    assert dm.classify(path, DEFAULT_QUERY_PATTERNS, DEFAULT_MEMORY_PATTERNS, "/store") == kind


@pytest.mark.parametrize(
    ("pattern", "path", "hit"),
    [
        ("**/*.q.{yaml,json}", "/a/b/c.q.json", True),
        ("queries/*.yaml", "/x/queries/a.yaml", True),
        ("queries/*.yaml", "/x/queries/sub/a.yaml", False),
        ("/abs/*.yaml", "/abs/a.yaml", True),
        ("/abs/*.yaml", "/other/abs/a.yaml", False),
        ("**/q[0-9].yaml", "/q1.yaml", True),
    ],
)
def test_glob(pattern, path, hit):
    assert dm.matches_any(path, [pattern]) is hit
