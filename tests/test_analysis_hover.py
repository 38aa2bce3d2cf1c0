"""Hover cards: marked text in (``§`` is the cursor), Markdown checked for what it must and must not say."""

from __future__ import annotations

import json

import pytest

from slayer_lsp.analysis import hover as hv
from slayer_lsp.analysis import parsed_file as dm


def run(catalog, marked: str, kind: str = "query", path: str = "q.query.yaml", max_chars: int = 4000):
    before = marked[: marked.index("§")]
    line, col = before.count("\n"), len(before.split("\n")[-1])
    doc = dm.parse_document(marked.replace("§", ""), kind, path)
    return hv.hover(doc, line, col, catalog, max_chars)


CASES = [
    pytest.param(
        "source_model: orders\ndimensions: [sta§tus]\n",
        [
            "**column** `jaffle.orders.status` · `TEXT`",
            "**Label:** Order status",
            'Sample values:** `["completed", "returned", "pending"]`',
            "**Distinct count:** 3",
        ],
        id="column",
    ),
    pytest.param(
        "source_model: orders\ndimensions: [i§d]\n",
        ["`jaffle.orders.id` · `INT` · primary key", "**Format:** integer"],
        id="primary-key-and-format",
    ),
    pytest.param(
        "source_model: orders\nmeasures: [sum(subtot§al)]\n",
        ["**Format:** currency, precision 2, symbol $", "Pre-tax order amount, in dollars."],
        id="in-call",
    ),
    pytest.param(
        "source_model: ord§ers\n",
        [
            "**model** `jaffle.orders`",
            "**Columns (9):** `id INT`",
            "**Measures:** `total_revenue`",
            "**Aggregations:** `avg_nonzero`",
            "`stores` on `store_id = stores.id`",
        ],
        id="model",
    ),
    pytest.param(
        "source_model: orders\nmeasures: [total_rev§enue]\n",
        ["**measure** `jaffle.orders.total_revenue`", "**Formula:** `sum(order_total)`"],
        id="measure",
    ),
    pytest.param(
        "source_model: orders\nmeasures: [avg_non§zero(tax_paid)]\n",
        ["**aggregation** `jaffle.orders.avg_nonzero`", "AVG(NULLIF({value}, 0))"],
        id="custom-aggregation",
    ),
    pytest.param(
        "dimensions: [jaff§le.orders.status]\n", ["**column** `jaffle.orders.status`"], id="canonical"
    ),
    pytest.param(
        "source_model: orders\ndimensions: [stors§.city]\n",
        ["**Unknown reference** `stors.city`", "neither a known datasource nor a saved model"],
        id="unknown",
    ),
    pytest.param(
        "dimensions: [na§me]\n",
        ["**Ambiguous reference** `name`", "Qualify as '&lt;model&gt;.name'"],
        id="ambiguous-bare-name",
    ),
]


@pytest.mark.parametrize(("marked", "expected"), CASES)
def test_hover(yaml_catalog, marked, expected):
    h = run(yaml_catalog, marked)
    assert h is not None
    for part in expected:
        assert part in h.markdown, (part, h.markdown)


def test_hover_span_is_the_reference(yaml_catalog):
    h = run(yaml_catalog, "source_model: orders\ndimensions: [stores.na§me]\n")
    assert h.span == dm.Span(1, 13, 24) and h.canonical == "jaffle.stores.name"


def test_memory_tag_hover_marks_stale_tags(yaml_catalog):
    h = run(yaml_catalog, "---\nentities:\n- memory:§5\n---\n", kind="memory", path="/w/memories/x.md")
    assert "**memory** `memory:5`" in h.markdown
    assert "~~`jaffle.customers.loyalty_tier`~~ *(stale)*" in h.markdown
    assert "`jaffle.customers`" in h.markdown
    h = run(yaml_catalog, "---\nentities:\n- memory:§6\n---\n", kind="memory", path="/w/memories/x.md")
    body = h.markdown.split("```json\n", 1)[1].split("\n```", 1)[0]
    assert json.loads(body)["source_model"] == "orders"  # the attached query, as JSON


def test_stale_tag_hover_says_why(yaml_catalog):
    h = run(
        yaml_catalog,
        "---\nentities:\n- jaffle.customers.loyalty§_tier\n---\n",
        kind="memory",
        path="/w/memories/x.md",
    )
    assert h.markdown.startswith("**Stale tag**") and "not a join target" in h.markdown


def test_skipped_reference_explains(yaml_catalog):
    h = run(
        yaml_catalog,
        "source_model: orders\nmeasures: [{formula: 'sum(subtotal)', name: net}]\nfilters: [ne§t > 1]\n",
    )
    assert "a name this query defines" in h.markdown


def test_no_hover_off_references(yaml_catalog):
    assert run(yaml_catalog, "source_model: orders\nlimit: 1§0\n") is None


@pytest.mark.parametrize(
    ("text", "escaped"),
    [
        ("*bold* <b>x</b> [l](u)", r"\*bold\* &lt;b&gt;x&lt;/b&gt; \[l\](u)"),
        ("# not a heading", r"\# not a heading"),
        ("- not a list\n1. nor this", "\\- not a list\n1\\. nor this"),
        ("a_b `c` | d ~ e & f", r"a\_b \`c\` \| d \~ e &amp; f"),
    ],
)
def test_escape(text, escaped):
    assert hv.escape(text) == escaped


def test_code_span_survives_backticks():
    assert hv.code("a`b") == "``a`b``"
    assert hv.code("`x") == "`` `x ``"


def test_length_cap(yaml_catalog):
    h = run(yaml_catalog, "source_model: ord§ers\n", max_chars=200)
    assert len(h.markdown) <= 200 + 60
    assert "cut at 200 characters" in h.markdown
    assert h.markdown.count("```") % 2 == 0
