"""Diagnostics: fixture text in, (code, range, message fragment, fixes) out."""

from __future__ import annotations

import shutil

import pytest

from slayer_lsp.analysis import diagnostics as dg
from slayer_lsp.analysis import parsed_file as dm
from slayer_lsp.catalog import load_catalog

from .conftest import YAML_STORE


def run(catalog, text: str, kind: str = "query", path: str = "q.query.yaml", store_path: str | None = None):
    doc = dm.parse_document(text, kind, path)
    return dg.diagnose(doc, catalog, path=store_path)


def summary(found):
    return [
        (d.code, d.span.line, d.span.start, d.span.end, tuple(f.new_text for f in d.fixes)) for d in found
    ]


CASES = [
    pytest.param(
        "source_model: orders\ndimensions: [status, stores.name]\nmeasures: [sum(subtotal), total_revenue]\n",
        [],
        id="clean",
    ),
    pytest.param(
        "source_model: orders\ndimensions: [stauts]\n",
        [("unknown-entity", 1, 13, 19, ("status",), "Entity 'stauts' not found")],
        id="unknown-with-fix",
    ),
    pytest.param(
        "source_model: orders\ndimensions: [stors.city]\n",
        [("unknown-entity", 1, 13, 23, ("stores.city", "customers.city"), "'stors' is neither")],
        id="unknown-join-head",
    ),
    pytest.param(
        "source_model: ordrs\ndimensions: [status]\n",
        [("unknown-entity", 0, 14, 19, ("orders", "order_items"), "Source model not found: 'ordrs'.")],
        id="unknown-source-model-silences-its-fields",
    ),
    pytest.param(
        "source_model: orders\ndimensions: [customers.email]\n",
        [("hidden-entity", 1, 13, 28, (), "column jaffle.customers.email is hidden")],
        id="hidden",
    ),
    pytest.param(
        "dimensions: [supplies.supplies.cost]\n",
        [("entity-warning", 0, 13, 35, (), "is both a datasource and a model")],
        id="resolver-warning",
    ),
    pytest.param(
        "source_model: orders\nlimt: 3\n",
        [("unknown-query-field", 1, 0, 4, ("limit",), "unknown query field 'limt'; did you mean 'limit'?")],
        id="unknown-field",
    ),
    pytest.param(
        "source_model: orders\ndimensions: ['stores.']\n",
        [("invalid-query", 1, 14, 20, (), "Dimension 'stores.' is neither a column reference")],
        id="shape-problem",
    ),
    pytest.param(
        "source_model: orders\nmeasures: [{formula: 'sum(subtotal)', name: net}]\nfilters: [net > 1]\n"
        "order: [{column: net, direction: desc}]\n",
        [],
        id="names-the-query-defines",
    ),
    pytest.param(
        "- name: s1\n  source_model: orders\n  dimensions: [status]\n- source_model: s1\n  dimensions: [anything]\n",
        [],
        id="later-stage-reads-earlier-stage",
    ),
    pytest.param(
        "source_model: orders\ndimensions: [status, id\n",
        [("invalid-yaml", 2, 0, 0, (), "invalid YAML")],
        id="invalid-yaml-still-checks-the-rest",
    ),
    pytest.param(
        "source_model: orders\ndimensions: [status, idd\n",
        [("invalid-yaml", 2, 0, 0, (), "invalid YAML"), ("unknown-entity", 1, 21, 24, ("id",), "'idd'")],
        id="invalid-yaml-and-unknown",
    ),
]


@pytest.mark.parametrize(("text", "expected"), CASES)
def test_query_diagnostics(yaml_catalog, text, expected):
    found = run(yaml_catalog, text)
    assert summary(found) == [e[:5] for e in expected]
    for d, e in zip(found, expected, strict=True):
        assert e[5] in d.message
        assert d.severity == dg.CODES[d.code][0]


def test_invalid_json(yaml_catalog):
    found = run(yaml_catalog, '{"source_model": "orders",\n "dimensions": ["staus"', path="q.query.json")
    assert [(d.code, d.span.line) for d in found] == [("invalid-json", 1), ("unknown-entity", 1)]


MEMORY_CASES = [
    pytest.param("---\nentities:\n- jaffle.orders\n- memory:kb.revenue\n---\nok\n", [], id="clean"),
    pytest.param(
        "---\nentities:\n- jaffle.customers.loyalty_tier\n---\nx\n",
        [("stale-tag", 2, 2, 31, (), "not a join target on model 'customers'")],
        id="stale",
    ),
    pytest.param(
        "---\nentities:\n- orders.status\n---\nx\n",
        [("stale-tag", 2, 2, 15, ("jaffle.orders.status",), "resolves to jaffle.orders.status")],
        id="not-canonical",
    ),
    pytest.param(
        "---\nentities:\n- jaffle.ordres.status\n---\nx\n",
        [("stale-tag", 2, 2, 22, ("jaffle.orders.status",), "No model 'ordres'")],
        id="misspelt",
    ),
    pytest.param(
        "---\nentities:\n- memory:99\n---\nx\n",
        [("stale-tag", 2, 2, 11, ("memory:9",), "No memory with id '99'.")],
        id="missing-memory",
    ),
    pytest.param(
        "---\nentities: [jaffle.orders]\nquery:\n  source_model: orders\n  dimensions: [statuz]\n---\nx\n",
        [("stale-query", 4, 15, 21, ("status",), "attached query has a stale reference")],
        id="stale-query",
    ),
]


@pytest.mark.parametrize(("text", "expected"), MEMORY_CASES)
def test_memory_diagnostics(yaml_catalog, text, expected):
    found = run(yaml_catalog, text, kind="memory", path="/w/memories/m.md")
    assert summary(found) == [e[:5] for e in expected]
    for d, e in zip(found, expected, strict=True):
        assert e[5] in d.message


def test_model_file(yaml_catalog):
    text = (
        "name: orders\ndata_source: jaffle\ncolumns:\n- name: id\n- name: store_id\nmeasures:\n"
        "- name: r\n  formula: sum(order_totl)\njoins:\n- target_model: storez\n  join_pairs:\n  - - store_id\n"
        "    - id\n- target_model: stores\n  join_pairs:\n  - - store_id\n    - idd\n"
    )
    found = run(yaml_catalog, text, kind="model", path="/s/models/jaffle/orders.yaml")
    assert [(d.code, d.span.line, d.message) for d in found] == [
        (
            "unknown-entity",
            7,
            "Entity 'order_totl' not found in any datasource (checked all known datasources).",
        ),
        ("unknown-entity", 9, "No model 'storez' in datasource 'jaffle'."),
        ("unknown-entity", 16, "No column 'idd' on model 'jaffle.stores'."),
    ]
    assert found[1].fixes[0].new_text == "stores"


@pytest.fixture(scope="module")
def odd_store(tmp_path_factory):
    """The fixture store without its priority list, plus a model whose file name disagrees."""
    root = tmp_path_factory.mktemp("odd") / "store"
    shutil.copytree(YAML_STORE, root)
    (root / "priority.yaml").unlink()
    text = (root / "models" / "jaffle" / "stores.yaml").read_text()
    (root / "models" / "jaffle" / "shops.yaml").write_text(text)
    return root


def test_ambiguous_source_model(odd_store):
    found = run(load_catalog(odd_store), "source_model: products\ndimensions: [name]\n")
    assert [(d.code, d.span.line) for d in found] == [("ambiguous-entity", 0)]
    assert "exists in multiple datasources" in found[0].message


def test_store_load_issues_on_store_files(odd_store):
    path = str(odd_store / "models" / "jaffle" / "shops.yaml")
    text = (odd_store / "models" / "jaffle" / "shops.yaml").read_text()
    cat = load_catalog(odd_store)
    found = run(cat, text, kind="model", path=path, store_path=path)
    issues = [d for d in found if d.code == "load-issue"]
    assert len(issues) == 1 and "defines model 'jaffle.stores', not 'jaffle.shops'" in issues[0].message
    stores = str(odd_store / "models" / "jaffle" / "stores.yaml")
    dup = run(cat, text, kind="model", path=stores, store_path=stores)
    assert any(d.code == "load-issue" and "also defined in" in d.message for d in dup)


def test_codes_table_is_complete():
    assert set(dg.CODES) >= {
        "invalid-yaml",
        "invalid-json",
        "unknown-query-field",
        "invalid-query",
        "unknown-entity",
        "ambiguous-entity",
        "hidden-entity",
        "stale-tag",
        "stale-query",
        "entity-warning",
        "load-issue",
    }
    assert all(sev in ("error", "warning", "information", "hint") for sev, _ in dg.CODES.values())
