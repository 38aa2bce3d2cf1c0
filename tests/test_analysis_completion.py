"""Completion against the jaffle fixture store: marked text in (``§`` is the cursor), labels out."""

from __future__ import annotations

import pytest

from slayer_lsp.analysis import completion as comp
from slayer_lsp.analysis import parsed_file as dm

ORDERS_LEAVES = [
    "id",
    "customer_id",
    "store_id",
    "ordered_at",
    "status",
    "subtotal",
    "tax_paid",
    "order_total",
    "discount_code",
    "total_revenue",
    "avg_nonzero",
]
ORDERS_COLUMNS = ORDERS_LEAVES[:9]
ORDERS_JOINS = ["stores", "customers", "order_items"]  # declared both ways: order_items joins to orders


def run(catalog, marked: str, kind: str = "query", path: str = "q.query.yaml", scope=None):
    before = marked[: marked.index("§")]
    line, col = before.count("\n"), len(before.split("\n")[-1])
    doc = dm.parse_document(marked.replace("§", ""), kind, path)
    return comp.complete(doc, line, col, catalog, scope or comp.CompletionFilter())


def labels(result) -> list[str]:
    return [i.label for i in sorted(result.items, key=lambda i: i.sort_text)]


CASES = [
    pytest.param(
        "source_model: orders\ndimensions:\n  - §\n",
        ORDERS_LEAVES + ORDERS_JOINS + ["jaffle", "supplies"],
        id="dimension-item",
    ),
    pytest.param("source_model: orders\nmeasures: [sum(§\n", ORDERS_COLUMNS + ORDERS_JOINS, id="inside-sum"),
    pytest.param(
        "source_model: orders\nmeasures:\n  - formula: count_distinct(cust§)\n",
        ORDERS_COLUMNS + ORDERS_JOINS,
        id="inside-call-in-formula-key",
    ),
    pytest.param(
        "source_model: orders\ndimensions: [stores.§]\n",
        ["id", "name", "city", "opened_at", "tax_rate", "orders"],
        id="join-path",
    ),
    pytest.param(
        "source_model: order_items\ndimensions: [product.§]\n",
        ["sku", "name", "type", "price", "description", "stores", "order_items"],
        id="named-join",
    ),
    pytest.param(
        "source_model: orders\nfilters:\n  - status = 'x' and customers.§\n",
        ["id", "name", "city", "income_band", "signup_date", "fax_number", "orders"],
        id="filter-hidden-column-absent",
    ),
    pytest.param(
        "source_model: orders\norder:\n  - column: §\n",
        ORDERS_LEAVES + ORDERS_JOINS + ["jaffle", "supplies"],
        id="order",
    ),
    pytest.param(
        "source_model: §\n",
        ["customers", "order_items", "orders", "products", "stores", "supplies"],
        id="source-model",
    ),
    pytest.param(
        "dimensions: [jaffle.§]\n",
        ["customers", "order_items", "orders", "products", "stores"],
        id="canonical-datasource-hidden-model-absent",
    ),
    pytest.param("dimensions: [jaffle.orders.§]\n", ORDERS_LEAVES + ORDERS_JOINS, id="canonical-model"),
    pytest.param(
        '{"source_model": "orders", "time_dimensions": ["month(§', ORDERS_COLUMNS + ORDERS_JOINS, id="json"
    ),
    pytest.param(
        "source_model: orders\ndimen§\n",
        [f for f in dm.QUERY_FIELDS if f != "source_model"],
        id="field-names",
    ),
    pytest.param("source_model: orders\nlimit: §\n", None, id="not-a-reference"),
]


@pytest.mark.parametrize(("marked", "expected"), CASES)
def test_query_completion(yaml_catalog, marked, expected):
    res = run(yaml_catalog, marked)
    if expected is None:
        assert res is None
    else:
        assert labels(res) == expected


MEMORY_CASES = [
    pytest.param("---\nentities:\n- §\n---\n", ["jaffle", "supplies", "memory:"], id="empty-tag"),
    pytest.param(
        "---\nentities:\n- jaffle.§\n---\n",
        ["customers", "order_items", "orders", "products", "stores"],
        id="datasource-children",
    ),
    pytest.param(
        "---\nentities: [jaffle.stores.§]\n---\n",
        ["id", "name", "city", "opened_at", "tax_rate"],
        id="model-children-no-joins",
    ),
    pytest.param("---\nentities:\n- memory:§\n---\n", None, id="memory-ids"),
    pytest.param(
        "---\nentities:\n- jaffle.customers.§\n---\n",
        ["id", "name", "city", "income_band", "signup_date", "fax_number"],
        id="hidden-column-absent",
    ),
]


@pytest.mark.parametrize(("marked", "expected"), MEMORY_CASES)
def test_memory_tag_completion(yaml_catalog, marked, expected):
    res = run(yaml_catalog, marked, kind="memory", path="/w/memories/n.md")
    if expected is None:  # memory ids: every memory, in the store's order
        assert labels(res) == list(yaml_catalog.memory_order)
    else:
        assert labels(res) == expected


def test_items_carry_kind_detail_and_replace_range(yaml_catalog):
    res = run(yaml_catalog, "source_model: orders\ndimensions: [stores.ci§]\n")
    city = next(i for i in res.items if i.label == "city")
    assert (city.kind, city.insert_text, city.canonical) == ("column", "city", "jaffle.stores.city")
    assert city.detail.startswith("TEXT")
    assert res.replace == dm.Span(1, 20, 22)  # only the segment being typed is replaced
    measure = next(
        i
        for i in run(yaml_catalog, "source_model: orders\nmeasures: [§]\n").items
        if i.label == "total_revenue"
    )
    assert measure.kind == "measure" and "sum(order_total)" in measure.detail
    join = next(i for i in res.items if i.label == "orders")
    assert join.kind == "join" and join.canonical == "jaffle.orders"


def test_scope_limits_datasources_and_access_tags(yaml_catalog):
    scoped = run(yaml_catalog, "source_model: §\n", scope=comp.CompletionFilter(datasources=("supplies",)))
    assert labels(scoped) == ["products", "supplies"]


def test_model_file_join_target_and_keys(yaml_catalog):
    text = "name: orders\ndata_source: jaffle\njoins:\n- target_model: §\n"
    res = run(yaml_catalog, text, kind="model", path="/s/models/jaffle/orders.yaml")
    assert labels(res) == ["customers", "order_items", "orders", "products", "stores"]
    text = "name: orders\ndata_source: jaffle\njoins:\n- target_model: stores\n  join_pairs:\n  - - store_id\n    - §\n"
    res = run(yaml_catalog, text, kind="model", path="/s/models/jaffle/orders.yaml")
    assert labels(res) == ["id", "name", "city", "opened_at", "tax_rate"]


def test_index_is_per_snapshot(yaml_catalog):
    a = comp.index_for(yaml_catalog)
    assert comp.index_for(yaml_catalog) is a
    assert a.children("jaffle.orders") is a.children("jaffle.orders")  # built once, then reused


def test_large_catalog(tmp_path):
    """Many models: lists are built per parent on demand and the cut-off keeps answers bounded."""
    from slayer_lsp.catalog import load_catalog

    ds_dir = tmp_path / "models" / "big"
    ds_dir.mkdir(parents=True)
    (tmp_path / "datasources").mkdir()
    (tmp_path / "datasources" / "big.yaml").write_text("name: big\ntype: sqlite\n")
    n_models, n_cols = 700, 12
    for m in range(n_models):
        cols = "".join(f"- name: c{c}\n  type: INT\n" for c in range(n_cols))
        (ds_dir / f"m{m:04d}.yaml").write_text(f"name: m{m:04d}\ndata_source: big\ncolumns:\n{cols}")
    cat = load_catalog(tmp_path)
    assert len(cat.entities) == 1 + n_models * (n_cols + 1)
    res = run(cat, "source_model: §\n")
    assert res.is_incomplete and len(res.items) == comp.MAX_ITEMS
    res = run(cat, "source_model: m06§\n")
    assert res.is_incomplete and {i.label for i in res.items} == {f"m{m:04d}" for m in range(600, 700)}
    res = run(cat, "source_model: m0042\ndimensions: [§]\n")
    assert [i.label for i in res.items if i.kind == "column"] == [f"c{c}" for c in range(n_cols)]
