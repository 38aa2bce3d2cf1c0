"""Navigation: definitions land on the YAML line of the entity, references find memories and open
documents, symbols describe model files."""

from __future__ import annotations

from pathlib import Path

import pytest

from slayer_lsp.analysis import navigation as nav
from slayer_lsp.analysis import parsed_file as dm

from .conftest import SQLITE_STORE, YAML_STORE


def at(marked: str, kind: str = "query", path: str = "q.query.yaml"):
    before = marked[: marked.index("§")]
    line, col = before.count("\n"), len(before.split("\n")[-1])
    return dm.parse_document(marked.replace("§", ""), kind, path), line, col


def line_of(loc: nav.LocationData) -> str:
    return Path(loc.path).read_text().split("\n")[loc.span.line]


@pytest.mark.parametrize(
    ("marked", "file", "text_at_span"),
    [
        ("source_model: orders\ndimensions: [sta§tus]\n", "models/jaffle/orders.yaml", "status"),
        ("source_model: orders\nmeasures: [total_re§venue]\n", "models/jaffle/orders.yaml", "total_revenue"),
        (
            "source_model: orders\nmeasures: [avg_non§zero(tax_paid)]\n",
            "models/jaffle/orders.yaml",
            "avg_nonzero",
        ),
        ("source_model: or§ders\n", "models/jaffle/orders.yaml", "orders"),
        ("dimensions: [sup§plies.supplies.cost]\n", "models/supplies/supplies.yaml", "cost"),
        ("source_model: orders\ndimensions: [stores.ci§ty]\n", "models/jaffle/stores.yaml", "city"),
    ],
)
def test_definition_into_the_yaml(yaml_catalog, marked, file, text_at_span):
    doc, line, col = at(marked)
    (loc,) = nav.definition(doc, line, col, yaml_catalog)
    assert loc.path == str(YAML_STORE / file)
    src_line = line_of(loc)
    assert src_line[loc.span.start : loc.span.end] == text_at_span
    assert "name:" in src_line


def test_definition_of_datasource_and_memory(yaml_catalog):
    doc, line, col = at(
        "---\nentities:\n- jaff§le\n- memory:k§b.revenue\n---\n", "memory", "/w/memories/x.md"
    )
    (ds,) = nav.definition(doc, 2, 4, yaml_catalog)
    assert ds.path == str(YAML_STORE / "datasources" / "jaffle.yaml") and line_of(ds) == "name: jaffle"
    (mem,) = nav.definition(doc, 3, 10, yaml_catalog)
    assert mem.path == str(YAML_STORE / "memories" / "kb.revenue.md") and mem.span == dm.Span(0, 0, 0)


def test_definition_in_a_sqlite_store_names_the_row(sqlite_catalog):
    doc, line, col = at("source_model: orders\ndimensions: [sta§tus]\n")
    (loc,) = nav.definition(doc, line, col, sqlite_catalog)
    assert loc.path == str(SQLITE_STORE) and loc.detail == "models row 'jaffle.orders'"


def test_no_definition_for_unknown(yaml_catalog):
    doc, line, col = at("source_model: orders\ndimensions: [nope§]\n")
    assert nav.definition(doc, line, col, yaml_catalog) == []


def test_references_from_memories_and_open_documents(yaml_catalog):
    q1 = dm.parse_document(
        "source_model: orders\ndimensions: [status]\nfilters: [status = 'x']\n", "query", "a"
    )
    q2 = dm.parse_document("dimensions: [jaffle.orders.status]\n", "query", "b")
    q3 = dm.parse_document("source_model: stores\ndimensions: [name]\n", "query", "c")
    found = nav.references(
        "jaffle.orders.status", yaml_catalog, {"file:///a": q1, "file:///b": q2, "file:///c": q3}
    )
    memory_files = sorted(Path(loc.path).name for loc in found if loc.path.endswith(".md"))
    assert memory_files == ["2.md", "6.md"]  # the memories that tag it
    for loc in found:
        if loc.path.endswith(".md"):
            assert line_of(loc).strip() == "- jaffle.orders.status"
    in_docs = sorted((loc.path, loc.span.line) for loc in found if loc.path.startswith("file://"))
    assert in_docs == [("file:///a", 1), ("file:///a", 2), ("file:///b", 0)]
    with_decl = nav.references("jaffle.orders.status", yaml_catalog, {}, include_declaration=True)
    assert with_decl[0].path.endswith("orders.yaml")


def test_document_symbols_of_a_model_file():
    text = (YAML_STORE / "models" / "jaffle" / "order_items.yaml").read_text()
    doc = dm.parse_document(text, "model", str(YAML_STORE / "models" / "jaffle" / "order_items.yaml"))
    (model,) = nav.document_symbols(doc)
    assert model.name == "order_items" and model.kind == "model"
    assert [(c.kind, c.name) for c in model.children] == [
        ("column", "id"),
        ("column", "order_id"),
        ("column", "sku"),
        ("column", "quantity"),
        ("column", "unit_price"),
        ("join", "product"),
        ("join", "orders"),
    ]
    for c in model.children:
        assert c.region.start_line <= c.selection.line <= c.region.end_line


def test_workspace_symbols(yaml_catalog):
    syms = nav.workspace_symbols(
        yaml_catalog, [("column", "jaffle.orders.status"), ("memory", "kb.revenue"), ("model", "gone.model")]
    )
    assert [(s.name, s.kind, s.container) for s in syms] == [
        ("jaffle.orders.status", "column", "jaffle.orders"),
        ("memory:kb.revenue", "memory", None),
    ]
    assert line_of(syms[0].location).strip() == "- name: status"
