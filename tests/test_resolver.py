"""Entity resolver and query-reference extraction against SLayer 1.4.1's own outputs.

The fixture rows (expected/resolve.json, expected/extract.json) run on both fixture stores. Where we
deliberately differ from SLayer, the row is listed in ``DELIBERATE_FIXES`` and a ``test_fix_*`` test
shows SLayer's output next to ours. Small temp-dir stores cover what the fixture lacks (ambiguous and
reverse join hops, edge names, extensions); their expectations were checked against SLayer itself.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from slayer_lsp.catalog import load_catalog
from slayer_lsp.query import formulas
from slayer_lsp.query.references import (
    QueryRef,
    QueryShapeError,
    extract_entities_from_query,
    query_references,
)
from slayer_lsp.query.resolver import (
    AmbiguousJoinPathError,
    AmbiguousModelError,
    EntityResolutionError,
    Resolution,
    resolve_entity,
)
from tests.conftest import EXPECTED

RESOLVE_ROWS = json.loads((EXPECTED / "resolve.json").read_text())
EXTRACT_ROWS = json.loads((EXPECTED / "extract.json").read_text())

# Rows where our output is deliberately not SLayer's: (file, row index) -> the named test explaining it.
DELIBERATE_FIXES = {
    ("extract", 4): "test_fix_edge_name_head_under_source_model",
}
# What we give instead for those rows.
FIXED_OUTPUT = {
    ("extract", 4): {
        "canonical": ["jaffle.order_items", "jaffle.products.name", "jaffle.order_items.quantity"],
        "warnings": [],
        "error": None,
        "error_type": None,
    },
}


@pytest.fixture(params=["yaml", "sqlite"])
def catalog(request, yaml_catalog, sqlite_catalog):
    return yaml_catalog if request.param == "yaml" else sqlite_catalog


def _outcome_of_resolve(raw, catalog, source, priority):
    try:
        res = resolve_entity(raw, catalog, source, priority)
    except EntityResolutionError as exc:
        return {"canonical": None, "warnings": [], "error": str(exc), "error_type": type(exc).__name__}
    return {"canonical": res.canonical, "warnings": list(res.warnings), "error": None, "error_type": None}


def _outcome_of_extract(query, catalog):
    try:
        res = extract_entities_from_query(query, catalog)
    except EntityResolutionError as exc:
        return {"canonical": None, "warnings": [], "error": str(exc), "error_type": type(exc).__name__}
    return {
        "canonical": list(res.canonicals),
        "warnings": list(res.warnings),
        "error": None,
        "error_type": None,
    }


def _expected(row):
    return {k: row[k] for k in ("canonical", "warnings", "error", "error_type")}


# ------------------------------------------------------------------------------- SLayer's own outputs


def test_fixture_files_have_the_documented_rows():
    assert len(RESOLVE_ROWS) == 62
    assert sum("priority_override" in r for r in RESOLVE_ROWS) == 4
    assert len(EXTRACT_ROWS) == 5


@pytest.mark.parametrize(
    "i",
    range(len(RESOLVE_ROWS)),
    ids=[f"{i}:{r['input']!r}@{r['source_model']}" for i, r in enumerate(RESOLVE_ROWS)],
)
def test_resolve_matches_slayer(catalog, i):
    row = RESOLVE_ROWS[i]
    priority = tuple(row["priority_override"]) if "priority_override" in row else None
    got = _outcome_of_resolve(row["input"], catalog, row["source_model"], priority)
    if ("resolve", i) in DELIBERATE_FIXES:
        assert got != _expected(row) and got == FIXED_OUTPUT[("resolve", i)]
    else:
        assert got == _expected(row)


@pytest.mark.parametrize("i", range(len(EXTRACT_ROWS)))
def test_extract_matches_slayer(catalog, i):
    row = EXTRACT_ROWS[i]
    got = _outcome_of_extract(row["query"], catalog)
    if ("extract", i) in DELIBERATE_FIXES:
        assert got != _expected(row) and got == FIXED_OUTPUT[("extract", i)]
    else:
        assert got == _expected(row)


def test_every_deliberate_fix_has_its_named_test():
    names = set(globals())
    for key, test_name in DELIBERATE_FIXES.items():
        assert test_name.startswith("test_fix_") and test_name in names, key
        assert key in FIXED_OUTPUT


# ------------------------------------------------------------------------------------ deliberate fixes


def test_fix_edge_name_head_under_source_model(catalog):
    """A dotted dimension starting with a join *name* (``product`` is order_items' edge to products).

    SLayer reads the head of every dotted token as a model name, so this valid query cannot be
    saved: ``'product' is neither a known datasource nor a saved model``. The query engine walks it
    from the source model, and so do we (only where SLayer would have failed)."""
    row = EXTRACT_ROWS[4]
    assert row["query"]["dimensions"] == ["product.name"]
    slayer = _expected(row)
    assert (
        slayer["error"]
        == "'product' is neither a known datasource nor a saved model. (segment of 'product.name')."
    )
    ours = _outcome_of_extract(row["query"], catalog)
    assert ours == FIXED_OUTPUT[("extract", 4)]
    assert resolve_entity("product.name", catalog, "jaffle.order_items").canonical == "jaffle.products.name"
    # Without a source model there is nothing to walk from: SLayer's error stands.
    with pytest.raises(EntityResolutionError, match="'product' is neither a known datasource"):
        resolve_entity("product.name", catalog)
    # A head that is no hop from the source model either keeps SLayer's error too.
    with pytest.raises(EntityResolutionError, match="'nosuch' is neither a known datasource"):
        resolve_entity("nosuch.name", catalog, "jaffle.order_items")


def test_fix_ambiguous_join_path_is_an_entity_resolution_error(tmp_path):
    """SLayer's ``AmbiguousJoinPathError`` is not an ``EntityResolutionError``, so one ambiguous
    dotted input aborts a whole search instead of being dropped with a warning. Ours subclasses it
    (same message), so lenient callers drop just that input."""
    cat = _shop(tmp_path)
    with pytest.raises(AmbiguousJoinPathError) as info:
        resolve_entity("orders.customers.name", cat)
    assert isinstance(info.value, EntityResolutionError)
    assert str(info.value) == (
        "Ambiguous join hop 'orders' → 'customers': 2 edges connect these models and no edge name resolves it.\n"
        "  - declared on 'orders': pairs [customer_id=id], cardinality many_to_one\n"
        "  - declared on 'orders' name='referrer': pairs [referrer_id=id], cardinality many_to_one\n"
        "Give one edge a `name` and use it as the path segment to disambiguate."
    )
    dropped = []
    for raw in ["orders.customers.name", "orders.amount"]:
        try:
            resolve_entity(raw, cat)
        except EntityResolutionError as exc:
            dropped.append(type(exc).__name__)
    assert dropped == ["AmbiguousJoinPathError"]


def test_fix_extension_columns_are_query_local(yaml_catalog):
    """Columns and measures a query's ModelExtension adds exist only in that query. SLayer resolves
    them like stored names and refuses the query (``Entity 'net' not found in any datasource``);
    we skip them as the query's own names, like its named measures."""
    query = {
        "source_model": {
            "source_name": "orders",
            "columns": [{"name": "net", "sql": "subtotal - tax_paid"}],
            "measures": [{"name": "aov", "formula": "avg(order_total)"}],
        },
        "measures": ["sum(net)", "aov"],
        "dimensions": ["status"],
    }
    # SLayer 1.4.1 refuses the query: it resolves ``net`` as if it were a stored name.
    slayer_error = "Entity 'net' not found in any datasource (checked all known datasources)."
    with pytest.raises(EntityResolutionError) as as_stored_name:
        resolve_entity("net:sum", yaml_catalog, "jaffle.orders")
    assert str(as_stored_name.value) == slayer_error
    got = extract_entities_from_query(query, yaml_catalog)
    assert got.canonicals == ("jaffle.orders", "jaffle.orders.status")
    assert [r.text for r in query_references(query)] == ["orders", "status"]


def test_removed_column_keeps_slayer_message_with_hint(catalog):
    """A tag on a removed column gets SLayer's misleading 'not a join target' message (search
    warnings must match SLayer's), plus a ``hint`` saying what really failed."""
    with pytest.raises(EntityResolutionError) as info:
        resolve_entity("jaffle.customers.loyalty_tier", catalog)
    assert str(info.value) == "'loyalty_tier' is not a join target on model 'customers'."
    assert info.value.hint == (
        "'loyalty_tier' is neither a column, measure or aggregation of model "
        "'jaffle.customers' nor a join from it"
    )
    with pytest.raises(EntityResolutionError) as bad_hop:
        resolve_entity("orders.nosuch.city", catalog)
    assert bad_hop.value.hint is None  # a genuinely bad hop needs no hint


# ------------------------------------------------------------------------------------ own small stores


def _write_store(root: Path, models: dict[str, dict[str, dict]], priority: list[str] | None = None) -> Path:
    (root / "datasources").mkdir(parents=True)
    for ds, by_name in models.items():
        (root / "datasources" / f"{ds}.yaml").write_text(
            yaml.safe_dump(
                {"version": 2, "name": ds, "type": "sqlite", "connection_string": "sqlite:///x.db"}
            )
        )
        (root / "models" / ds).mkdir(parents=True)
        for name, body in by_name.items():
            doc = {"version": 15, "name": name, "sql_table": name, "data_source": ds, **body}
            doc["columns"] = [c if isinstance(c, dict) else {"name": c} for c in doc.get("columns", [])]
            (root / "models" / ds / f"{name}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    if priority is not None:
        (root / "priority.yaml").write_text(yaml.safe_dump({"priority": priority}))
    return root


SHOP = {
    "shop": {
        "orders": {
            "columns": ["id", "customer_id", "referrer_id", "amount"],
            "joins": [
                {
                    "target_model": "customers",
                    "join_pairs": [["customer_id", "id"]],
                    "cardinality": "many_to_one",
                },
                {
                    "target_model": "customers",
                    "join_pairs": [["referrer_id", "id"]],
                    "cardinality": "many_to_one",
                    "name": "referrer",
                },
                {"target_model": "ghosts", "join_pairs": [["id", "id"]]},
            ],
        },
        "customers": {
            "columns": ["id", "region_id", "name"],
            "joins": [
                {"target_model": "regions", "join_pairs": [["region_id", "id"]], "cardinality": "many_to_one"}
            ],
        },
        "regions": {
            "columns": ["id", "name"],
            "joins": [
                {
                    "target_model": "customers",
                    "join_pairs": [["id", "region_id"]],
                    "cardinality": "one_to_many",
                }
            ],
        },
    },
    "crm": {"regions": {"columns": ["id", "label"]}},
}


def _shop(tmp_path, priority=None):
    return load_catalog(_write_store(tmp_path / "store", SHOP, priority))


# (input, source model, expected canonical | (error type, message)); checked against SLayer 1.4.1.
AMBIGUOUS_CUSTOMERS = (
    "Ambiguous join hop 'orders' → 'customers': 2 edges connect these models and no edge name resolves it.\n"
    "  - declared on 'orders': pairs [customer_id=id], cardinality many_to_one\n"
    "  - declared on 'orders' name='referrer': pairs [referrer_id=id], cardinality many_to_one\n"
    "Give one edge a `name` and use it as the path segment to disambiguate."
)
SHOP_CASES = [
    ("orders.referrer.name", None, "shop.customers.name"),  # edge name picks one of two parallel edges
    ("customers.referrer.amount", None, "shop.orders.amount"),  # the edge name works walked backwards too
    ("customers.referrer", None, "shop.orders"),
    ("orders.customers.name", None, ("AmbiguousJoinPathError", AMBIGUOUS_CUSTOMERS)),
    ("orders.customers", None, ("AmbiguousJoinPathError", AMBIGUOUS_CUSTOMERS)),
    ("orders.customers.name:sum", None, ("AmbiguousJoinPathError", AMBIGUOUS_CUSTOMERS)),
    (
        "customers.orders.amount",
        None,
        (
            "AmbiguousJoinPathError",
            "Ambiguous join hop 'customers' → 'orders': 2 edges connect these models and no edge name resolves it.\n"
            "  - declared on 'orders': pairs [id=customer_id], cardinality one_to_many\n"
            "  - declared on 'orders' name='referrer': pairs [id=referrer_id], cardinality one_to_many\n"
            "Give one edge a `name` and use it as the path segment to disambiguate.",
        ),
    ),
    # both ends declare the same relation: two edges, each side's seen from customers
    (
        "shop.customers.regions",
        None,
        (
            "AmbiguousJoinPathError",
            "Ambiguous join hop 'customers' → 'regions': 2 edges connect these models and no edge name resolves it.\n"
            "  - declared on 'customers': pairs [region_id=id], cardinality many_to_one\n"
            "  - declared on 'regions': pairs [region_id=id], cardinality many_to_one\n"
            "Give one edge a `name` and use it as the path segment to disambiguate.",
        ),
    ),
    (
        "orders.referrer.referrer.amount",
        None,
        (
            "EntityResolutionError",
            "Circular join detected resolving 'referrer.referrer.amount' from 'orders': hop 'referrer' revisits model 'orders'.",
        ),
    ),
    ("orders.ghosts", None, ("EntityResolutionError", "'ghosts' is not a join target on model 'orders'.")),
    ("orders.ghosts.x", None, ("EntityResolutionError", "'ghosts' is not a join target on model 'orders'.")),
    (
        "orders.referrer.nosuch",
        None,
        ("EntityResolutionError", "'nosuch' is not a join target on model 'customers'."),
    ),
    (
        "name",
        None,
        (
            "EntityResolutionError",
            "Ambiguous bare name 'name' matches columns / measures / aggregations "
            "on ['customers', 'regions'] in datasource 'shop'. Qualify as '<model>.name'.",
        ),
    ),
    ("label", None, "crm.regions.label"),  # no priority: datasources in sorted order, crm first
    ("region_id", None, "shop.customers.region_id"),
    (
        "regions",
        None,
        (
            "AmbiguousModelError",
            "Model 'regions' exists in multiple datasources: ['crm', 'shop']. "
            "Specify a data_source or set a datasource priority to disambiguate.",
        ),
    ),
    ("crm.regions.label", None, "crm.regions.label"),
    ("crm.regions.id", None, "crm.regions.id"),
    ("count(customers.*)", None, "shop.customers"),
    ("sum(shop.orders.amount)", None, "shop.orders.amount"),
    ("count(*)", "shop.orders", "shop.orders"),
    ("amount", "shop.orders", "shop.orders.amount"),
    ("memory:x", None, ("EntityResolutionError", "No memory with id 'x'.")),
    ("memory:a/b", None, ("EntityResolutionError", "memory id 'a/b': forbidden character '/'.")),
]


@pytest.mark.parametrize("raw,source,expected", SHOP_CASES, ids=[c[0] for c in SHOP_CASES])
def test_join_walks_and_collisions(tmp_path, raw, source, expected):
    cat = _shop(tmp_path)
    if isinstance(expected, str):
        assert resolve_entity(raw, cat, source) == Resolution(expected)
    else:
        with pytest.raises(EntityResolutionError) as info:
            resolve_entity(raw, cat, source)
        assert (type(info.value).__name__, str(info.value)) == expected


def test_priority_settles_models_and_orders_the_leaf_search(tmp_path):
    cat = _shop(tmp_path, priority=["shop"])
    assert resolve_entity("regions.name", cat).canonical == "shop.regions.name"
    assert resolve_entity("label", cat).canonical == "crm.regions.label"  # not in shop: the rest are searched
    assert resolve_entity("id", cat, priority=("crm",)).canonical == "crm.regions.id"
    with pytest.raises(AmbiguousModelError):
        resolve_entity("regions", cat, priority=())
    assert resolve_entity("regions", cat, priority=("nosuch", "crm")).canonical == "crm.regions"


def test_inline_source_model(yaml_catalog):
    query = {
        "source_model": {
            "name": "adhoc",
            "data_source": "jaffle",
            "sql_table": "orders",
            "columns": [{"name": "a"}, {"name": "b"}],
        },
        "measures": ["sum(a)"],
        "dimensions": ["b", "customers.city"],
    }
    got = extract_entities_from_query(query, yaml_catalog)
    assert got.canonicals == ("jaffle.adhoc", "jaffle.adhoc.b", "jaffle.customers.city", "jaffle.adhoc.a")


def test_resolution_follows_a_derived_catalog(tmp_path):
    """Derived indexes are cached per snapshot; a new snapshot sees the change."""
    from slayer_lsp.store.reader import StoreReader

    root = _write_store(tmp_path / "store", SHOP)
    cat = load_catalog(root)
    assert resolve_entity("region_id", cat).canonical == "shop.customers.region_id"
    path = root / "models" / "shop" / "orders.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["columns"].append({"name": "region_id"})
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    new, delta = cat.derive(StoreReader(root).read())
    assert "shop.orders.region_id" in delta.added
    with pytest.raises(EntityResolutionError, match="Ambiguous bare name 'region_id'"):
        resolve_entity("region_id", new)
    assert resolve_entity("region_id", cat).canonical == "shop.customers.region_id"  # old snapshot unchanged


def test_source_model_must_exist(yaml_catalog):
    with pytest.raises(EntityResolutionError, match="Source model not found"):
        resolve_entity("status", yaml_catalog, "jaffle.nosuch")


# --------------------------------------------------------------------------------- query references

USER_QUERY = {
    "source_model": "orders",
    "dimensions": ["customers.city", "month(ordered_at)", {"expression": "upper(status)", "name": "st"}],
    "time_dimensions": [{"dimension": "tax_paid", "granularity": "day"}],
    "measures": ["sum(order_total)/count(*)", {"formula": "count_distinct(customer_id)", "name": "buyers"}],
    "filters": ["status = 'completed' and st != 'X'", "buyers > 1"],
    "order": [{"column": "sum(subtotal)", "direction": "desc"}, {"buyers": "asc"}],
}


def test_query_references_fields_and_walk_order():
    refs = query_references(USER_QUERY)
    assert refs == [
        QueryRef("orders", "source_model", 0, "source"),
        QueryRef("customers.city", "dimensions", 0, "ref"),
        QueryRef("status", "dimensions", 2, "formula"),
        QueryRef("tax_paid", "time_dimensions", 0, "ref"),
        QueryRef("ordered_at", "dimensions", 1, "ref"),  # month(ordered_at) becomes a time dimension, last
        QueryRef("order_total:sum", "measures", 0, "formula"),
        QueryRef("*:count", "measures", 0, "formula"),
        QueryRef("customer_id:count_distinct", "measures", 1, "formula"),
        QueryRef("status", "filters", 0, "filter"),
        QueryRef("subtotal:sum", "order", 0, "formula"),
    ]


def test_stored_form_reads_like_user_form(yaml_catalog):
    """The memory form (``model_dump(mode="json")``) of a query names the same references."""
    stored = {
        "dimensions": [
            {"label": None, "model": "customers", "name": "city"},
            {"expression": "upper(status)", "name": "st"},
        ],
        "filters": ["status = 'completed' and st != 'X'", "buyers > 1"],
        "limit": None,
        "measures": [
            {
                "description": None,
                "formula": "sum(order_total)/count(*)",
                "label": None,
                "meta": None,
                "name": None,
                "type": None,
            },
            {
                "description": None,
                "formula": "count_distinct(customer_id)",
                "label": None,
                "meta": None,
                "name": "buyers",
                "type": None,
            },
        ],
        "order": [
            {
                "column": {"label": None, "model": None, "name": "_funcstyle_pending"},
                "direction": "desc",
                "raw_formula": "sum(subtotal)",
            },
            {
                "column": {"label": None, "model": None, "name": "buyers"},
                "direction": "asc",
                "raw_formula": None,
            },
        ],
        "source_model": "orders",
        "time_dimensions": [
            {
                "date_range": None,
                "dimension": {"label": None, "model": None, "name": "tax_paid"},
                "granularity": "day",
                "label": None,
            },
            {
                "date_range": None,
                "dimension": {"label": None, "model": None, "name": "ordered_at"},
                "granularity": "month",
                "label": None,
            },
        ],
        "version": 6,
    }
    texts = [r.text for r in query_references(stored)]
    assert texts == [r.text for r in query_references(USER_QUERY)]
    assert extract_entities_from_query(stored, yaml_catalog) == extract_entities_from_query(
        USER_QUERY, yaml_catalog
    )
    assert extract_entities_from_query(stored, yaml_catalog).canonicals == (
        "jaffle.orders",
        "jaffle.customers.city",
        "jaffle.orders.status",
        "jaffle.orders.tax_paid",
        "jaffle.orders.ordered_at",
        "jaffle.orders.order_total",
        "jaffle.orders.customer_id",
        "jaffle.orders.subtotal",
    )


def test_memory_queries_of_the_fixture_still_resolve(catalog):
    """The example queries SLayer stored in memories 6 and 7 give back their saved tags."""
    for mid in ("6", "7"):
        memory = catalog.memory(mid)
        got = extract_entities_from_query(memory.query, catalog)
        assert list(got.canonicals) == memory.entities


def test_query_shape_problems_raise_or_collect():
    bad = {
        "source_model": "orders",
        "dimensions": ["a +", "status"],
        "time_dimensions": ["ordered_at"],
        "measures": [{"name": "x"}],
        "filters": [3],
    }
    with pytest.raises(QueryShapeError) as info:
        query_references(bad)
    assert (info.value.field, info.value.index) == ("dimensions", 0)
    problems: list[QueryShapeError] = []
    refs = query_references(bad, problems)
    assert [(p.field, p.index) for p in problems] == [
        ("dimensions", 0),
        ("time_dimensions", 0),
        ("measures", 0),
        ("filters", 0),
    ]
    assert [r.text for r in refs] == ["orders", "status"]


def test_extract_errors(yaml_catalog):
    with pytest.raises(EntityResolutionError, match="Source model not found: 'nosuch'"):
        extract_entities_from_query({"source_model": "nosuch", "dimensions": ["x"]}, yaml_catalog)
    with pytest.raises(EntityResolutionError, match="Could not derive a model name"):
        extract_entities_from_query({"dimensions": ["x"]}, yaml_catalog)
    with pytest.raises(EntityResolutionError, match="Entity 'nosuch' not found"):
        extract_entities_from_query({"source_model": "orders", "measures": ["sum(nosuch)"]}, yaml_catalog)
    with pytest.raises(AmbiguousModelError):
        extract_entities_from_query({"source_model": "products"}, yaml_catalog, priority=())
    assert extract_entities_from_query({"source_model": "products"}, yaml_catalog).canonicals == (
        "jaffle.products",
    )


# ------------------------------------------------------------------------------ Mode-B formula tokens

# formula -> entity tokens, as SLayer 1.4.1's own tokenizer gives them; [formula] = unparseable.
FORMULA_TOKENS = {
    "sum(amount)/count(*)": ["amount:sum", "*:count"],
    "weighted_avg(order_total, weight=subtotal)": ["order_total:weighted_avg"],
    "sum(subtotal - tax_paid)": ["subtotal", "tax_paid"],
    "frobnicate(order_total)": ["order_total:frobnicate"],
    "orders.*:count": ["orders.*:count"],
    "count(orders.*)": ["orders.*:count"],
    "COUNT(DISTINCT customer_id)": ["customer_id:count_distinct"],
    "amount:percentile(p=0.9)": ["amount:percentile"],
    "x:sum + y:avg": ["x:sum", "y:avg"],
    "sum(amount) / sum(amount, partition_by=customers.regions.name)": ["amount:sum", "amount:sum"],
    "cumsum(sum(amount))": ["amount:sum"],
    "time_shift(sum(amount), -1, 'year')": ["amount:sum"],
    "consecutive_periods(sum(amount) > 0)": ["amount:sum"],
    "coalesce(a, b) + 1": ["a", "b"],
    "sum(CASE WHEN status = 'paid' THEN amount ELSE 0 END)": ["status", "amount"],
    "CASE status WHEN 'a' THEN x WHEN 'b' THEN y ELSE z END": ["status", "x", "status", "y", "z"],
    "sum(extract(day from ordered_at))": ["ordered_at"],
    "customers.sum(credit)": ["customers.credit:sum"],
    "customers.count(*)": ["customers.*:count"],
    "sum(sum(x))": [],
    "status in ('a', 'b')": ["status"],
    "x is not None": ["x"],
    "{var} + x": ["x"],
    "sum(amount) over (partition by x)": ["sum(amount) over (partition by x)"],
    "status in (a, b)": ["status in (a, b)"],
    "count(x, *)": ["count(x, *)"],
    "sum(class)": ["sum(class)"],
    "1 < x < 10": ["1 < x < 10"],
    "x if y else z": ["x if y else z"],
    "foo()": ["foo()"],
    "a.cumsum(b)": ["a.cumsum(b)"],
    "x = 1": ["x = 1"],
}


@pytest.mark.parametrize("formula", list(FORMULA_TOKENS))
def test_formula_tokens_match_slayer(formula):
    assert formulas.formula_tokens(formula) == FORMULA_TOKENS[formula]


@pytest.mark.parametrize(
    "text,tokens",
    [
        ("status='completed' and order_total>10", ["status", "order_total"]),
        ("coalesce(discount_code, 'a:b') = {v} or x:sum(p=1) > 2", ["discount_code", "x"]),
        ("customers.city in ('a', 'b') and x IS NOT NULL", ["customers.city", "x"]),
        ("1.5e3 > amount", ["e3", "amount"]),  # SLayer's text scan, quirks included
    ],
)
def test_filter_tokens(text, tokens):
    assert formulas.filter_tokens(text) == tokens


@pytest.mark.parametrize(
    "raw,split",
    [
        ("sum(orders.amount)", ("orders.amount", "sum")),
        ("orders.amount:sum", ("orders.amount", "sum")),
        ("revenue:last(created_at)", ("revenue", "last")),
        ("count(distinct customer_id)", ("customer_id", "count_distinct")),
        ("count(*)", ("*", "count")),
        ("plain.path", ("plain.path", None)),
    ],
)
def test_split_agg_ref(raw, split):
    assert formulas.split_agg_ref(raw) == split


@pytest.mark.parametrize("raw", ["coalesce(x)", "sum(a - b)", "sum(a) + 1", "sum(", "foo()"])
def test_split_agg_ref_refuses_non_column_aggregations(raw):
    with pytest.raises(formulas.ModeBError):
        formulas.split_agg_ref(raw)
