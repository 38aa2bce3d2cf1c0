"""The memory writer: SLayer's save/forget semantics, its exact bytes, and safety under concurrency.

Most checks run on temp copies of the jaffle fixture stores. The ones marked ``oracle`` also run
motley-slayer in its own venv (``tests/slayer_oracle.py``) to load what we wrote, to write the same
memory itself for a byte comparison, and to save concurrently with us.
"""

from __future__ import annotations

import errno
import fcntl
import json
import math
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from slayer_lsp.catalog import load_catalog
from slayer_lsp.query.normal_form import QueryRefused, normalize_query
from slayer_lsp.store import files as store_files
from slayer_lsp.store import transactions
from slayer_lsp.store.locate import StoreLocation
from slayer_lsp.writer import memories as writer
from slayer_lsp.writer.errors import WriteErrorKind
from slayer_lsp.writer.memories import (
    MemoryWriteError,
    forget_memory,
    format_created_at,
    save_memory,
)
from tests import slayer_oracle as oracle
from tests.conftest import REPO, SQLITE_STORE, YAML_STORE

needs_slayer = pytest.mark.skipif(oracle.slayer_python() is None, reason=oracle.SKIP_REASON)
STAMP = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{6})?Z")
FIXTURE_IDS = ("1", "2", "3", "4", "6", "7", "8", "9", "10", "11", "12", "kb.revenue")  # not 5: stale tag


# ------------------------------------------------------------------------------------ store copies


def _copy_store(backend: str, dest: Path) -> StoreLocation:
    """A writable copy of a fixture store (the fixtures themselves are read-only)."""
    dest.mkdir(parents=True, exist_ok=True)
    if backend == "yaml":
        target = dest / "store-yaml"
        shutil.copytree(YAML_STORE, target)
        for root, dirs, files in os.walk(target):
            for name in dirs:
                os.chmod(os.path.join(root, name), 0o755)
            for name in files:
                os.chmod(os.path.join(root, name), 0o644)
        os.chmod(target, 0o755)
    else:
        target = dest / "store.db"
        shutil.copyfile(SQLITE_STORE, target)
        os.chmod(target, 0o644)
    return StoreLocation(backend, target)


@pytest.fixture(params=["yaml", "sqlite"])
def store(request, tmp_path):
    loc = _copy_store(request.param, tmp_path)
    return loc, load_catalog(loc.path)


@pytest.fixture
def yaml_store(tmp_path):
    loc = _copy_store("yaml", tmp_path)
    return loc, load_catalog(loc.path)


def stored_text(loc: StoreLocation, memory_id: str) -> str | None:
    """What the store holds for ``memory_id``: the .md text or the JSON row."""
    if loc.backend == "yaml":
        path = loc.path / "memories" / f"{memory_id}.md"
        return path.read_text(encoding="utf-8") if path.exists() else None
    with sqlite3.connect(loc.path) as conn:
        row = conn.execute("SELECT data FROM memories WHERE id = ?", (memory_id,)).fetchone()
    return row[0] if row else None


def stored_doc(loc: StoreLocation, memory_id: str) -> dict | None:
    text = stored_text(loc, memory_id)
    if text is None:
        return None
    if loc.backend == "sqlite":
        return json.loads(text)
    front, body = writer._split_markdown(text)
    return {**front, "id": memory_id, "learning": body}


def memory_ids(loc: StoreLocation) -> set[str]:
    if loc.backend == "yaml":
        return {n[:-3] for n in os.listdir(loc.path / "memories") if n.endswith(".md")}
    with sqlite3.connect(loc.path) as conn:
        return {r[0] for r in conn.execute("SELECT id FROM memories")}


def entity_rows(loc: StoreLocation) -> set[tuple[str, str]]:
    with sqlite3.connect(loc.path) as conn:
        return set(conn.execute("SELECT memory_id, entity FROM memory_entities"))


def stray_temp_files(loc: StoreLocation) -> list[str]:
    if loc.backend != "yaml":
        return []
    return [n for n in os.listdir(loc.path / "memories") if ".tmp." in n]


def embeddings_db(loc: StoreLocation) -> Path:
    return loc.path / "embeddings.db" if loc.backend == "yaml" else loc.path


def add_embeddings(loc: StoreLocation, canonical_ids: list[str]) -> None:
    with sqlite3.connect(embeddings_db(loc)) as conn:
        conn.executemany(
            "INSERT INTO embeddings (canonical_id, embedding_model_name, entity_kind, content_hash, embedding, "
            "created_at) VALUES (?, 'test/model', 'memory', 'h', '[0.0]', '2026-01-01T00:00:00+00:00')",
            [(c,) for c in canonical_ids],
        )


def embedding_ids(loc: StoreLocation) -> set[str]:
    with sqlite3.connect(embeddings_db(loc)) as conn:
        return {r[0] for r in conn.execute("SELECT canonical_id FROM embeddings")}


# ------------------------------------------------------------------------------------ ids


def test_new_ids_count_up_from_the_store(store):
    loc, cat = store
    first = save_memory(loc, cat, learning="first note", entities=["orders.status"])
    # the catalog is now stale (it has no memory 13); the id still comes from the store
    second = save_memory(loc, cat, learning="second note", entities=["stores"])
    assert (first.id, second.id) == ("13", "14")
    assert first.created and second.created
    assert STAMP.fullmatch(first.created_at) and first.created_at <= second.created_at
    assert first.entities == ("jaffle.orders.status",) and second.entities == ("jaffle.stores",)
    doc = stored_doc(loc, "14")
    assert (doc["learning"], doc["entities"], doc["created_at"], doc["version"]) == (
        "second note",
        ["jaffle.stores"],
        second.created_at,
        4,
    )
    fresh = load_catalog(loc.path)  # our own reader sees what we wrote
    assert fresh.memory("13").learning == "first note" and fresh.memory("13").entities == [
        "jaffle.orders.status"
    ]


@pytest.mark.parametrize(
    "existing, expected",
    [
        (["001", "42abc", "help.99", "0"], "13"),  # leading zero, suffix, dotted: not int-shaped; "0" is
        (["99"], "100"),
        (["1000000000000000000000"], "1000000000000000000001"),
    ],
)
def test_new_id_is_max_int_shaped_plus_one(store, existing, expected):
    loc, cat = store
    for memory_id in existing:
        save_memory(loc, cat, learning=f"note {memory_id}", entities=["orders"], id=memory_id)
    assert save_memory(loc, cat, learning="auto", entities=["orders"]).id == expected


def test_upsert_keeps_created_at(store):
    loc, cat = store
    first = save_memory(loc, cat, learning="v1", entities=["orders.status"], id="kb.status")
    time.sleep(0.01)
    second = save_memory(loc, cat, learning="v2", entities=["stores.name"], id="kb.status", description="d")
    assert first.created and not second.created
    assert second.created_at == first.created_at
    doc = stored_doc(loc, "kb.status")
    assert (doc["learning"], doc["entities"], doc["description"], doc["created_at"]) == (
        "v2",
        ["jaffle.stores.name"],
        "d",
        first.created_at,
    )
    # a fixture memory keeps the timestamp SLayer gave it
    original = stored_doc(loc, "1")["created_at"]
    saved = save_memory(loc, cat, learning="rewritten", entities=["orders.subtotal"], id="1")
    assert not saved.created and saved.created_at == original == "2026-11-30T04:22:12.008273Z"


@pytest.mark.parametrize("memory_id", FIXTURE_IDS)
def test_resaving_a_slayer_memory_reproduces_its_bytes(store, memory_id):
    """Upserting a fixture memory with its own content writes exactly the bytes SLayer wrote."""
    loc, cat = store
    before = stored_text(loc, memory_id)
    mem = cat.memory(memory_id)
    saved = save_memory(
        loc,
        cat,
        id=memory_id,
        learning=mem.learning,
        description=mem.description,
        entities=None if mem.query else list(mem.entities),
        query=mem.query,
    )
    assert list(saved.entities) == mem.entities
    assert stored_text(loc, memory_id) == before
    if loc.backend == "sqlite":
        assert {e for m, e in entity_rows(loc) if m == memory_id} == set(mem.entities)


def test_a_user_form_query_is_stored_like_slayer_stored_it(store):
    """Memory 6 of the fixture was saved by SLayer from this user-form query."""
    loc, cat = store
    before = stored_text(loc, "6")
    user_query = {
        "source_model": "orders",
        "measures": [{"formula": "sum(subtotal)", "name": "net_sales"}],
        "dimensions": ["stores.name"],
        "time_dimensions": ["month(ordered_at)"],
        "filters": ["status = 'completed'"],
    }
    saved = save_memory(
        loc,
        cat,
        id="6",
        learning="Monthly net sales per store, completed orders only.",
        description="Example: monthly net sales by store",
        query=user_query,
    )
    assert saved.entities == (
        "jaffle.orders",
        "jaffle.stores.name",
        "jaffle.orders.ordered_at",
        "jaffle.orders.subtotal",
        "jaffle.orders.status",
    )
    assert stored_text(loc, "6") == before


# ------------------------------------------------------------------------------------ input rules

BAD_IDS = [
    ("a:b", "memory id 'a:b': forbidden character ':'."),
    ("a/b", "memory id 'a/b': forbidden character '/'."),
    ("a?b", "memory id 'a?b': forbidden character '?'."),
    ("a#b", "memory id 'a#b': forbidden character '#'."),
    ("a\\b", "memory id 'a\\\\b': forbidden character '\\\\'."),
    ("a b", "memory id 'a b': whitespace and ASCII control characters are not allowed."),
    ("x\x7f", "memory id 'x\\x7f': whitespace and ASCII control characters are not allowed."),
    ("", "memory id must be non-empty."),
    (True, "memory id must be str or int; got bool."),
]


@pytest.mark.parametrize("memory_id, message", BAD_IDS)
def test_bad_ids_are_refused(store, memory_id, message):
    loc, cat = store
    before = memory_ids(loc)
    with pytest.raises(MemoryWriteError) as exc:
        save_memory(loc, cat, learning="x", entities=["orders"], id=memory_id)
    assert str(exc.value) == message
    with pytest.raises(MemoryWriteError):
        forget_memory(loc, cat, memory_id)
    assert memory_ids(loc) == before


def test_int_ids_are_strings(store):
    loc, cat = store
    assert save_memory(loc, cat, learning="x", entities=["orders"], id=77).id == "77"


def test_case_collisions(store):
    loc, cat = store
    if loc.backend == "yaml":  # file names would collide on a case-insensitive file system
        with pytest.raises(
            MemoryWriteError,
            match=r"^Memory id 'KB.Revenue' conflicts with existing 'kb.revenue' "
            r"\(differs only by case\)\. Rename or delete one\.$",
        ):
            save_memory(loc, cat, learning="x", entities=["orders"], id="KB.Revenue")
        assert "KB.Revenue" not in memory_ids(loc)
    else:  # SLayer's SQLite backend keeps both
        assert save_memory(loc, cat, learning="x", entities=["orders"], id="KB.Revenue").created
        assert {"KB.Revenue", "kb.revenue"} <= memory_ids(loc)


@pytest.mark.parametrize(
    "description, stored",
    [
        (None, None),
        ("", None),
        ("   \n", None),
        ("short", "short"),
        ("x" * 500, "x" * 500),
        (" padded ", " padded "),
    ],
)
def test_description_rules(store, description, stored):
    loc, cat = store
    saved = save_memory(loc, cat, learning="x", entities=["orders"], description=description)
    doc = stored_doc(loc, saved.id)
    assert doc.get("description") == stored
    assert ("description" in doc) == (loc.backend == "sqlite" or stored is not None)  # YAML omits it


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(description="x" * 501), "description must be <= 500 chars; got 501."),
        (dict(description=5), "description must be a string; got int."),
        (dict(learning=""), "learning text must be a non-empty string."),
        (dict(learning=" \n\t"), "learning text must be a non-empty string."),
        (dict(entities=None), "linked_entities must be a non-empty list"),
        (dict(entities=[]), "linked_entities must be a non-empty list"),
        (dict(entities="orders"), "linked_entities must be a non-empty list"),
        (dict(entities=[3]), "linked_entities list items must be strings; got int."),
        (dict(query={"source_model": "orders"}), "give either entities or a query, not both."),
    ],
)
def test_input_rules(store, kwargs, message):
    loc, cat = store
    args = dict(learning="note", entities=["orders"]) | kwargs
    before = memory_ids(loc)
    with pytest.raises(MemoryWriteError) as exc:
        save_memory(loc, cat, **args)
    assert str(exc.value).startswith(message)
    assert memory_ids(loc) == before


def test_entities_are_deduplicated_in_order(store):
    loc, cat = store
    saved = save_memory(
        loc,
        cat,
        learning="x",
        entities=[
            "stores",
            "orders.status",
            "status",
            "jaffle.orders.status",
            "jaffle.stores",
            "sum(orders.status)",
        ],
    )
    assert saved.entities == ("jaffle.stores", "jaffle.orders.status")
    assert stored_doc(loc, saved.id)["entities"] == ["jaffle.stores", "jaffle.orders.status"]


@pytest.mark.parametrize(
    "reference, message",
    [
        ("nope", "Entity 'nope' not found in any datasource (checked all known datasources)."),
        ("orders.nope", "'nope' is not a join target on model 'orders'."),
        ("memory:999", "No memory with id '999'."),
        ("jaffle.customers.loyalty_tier", "'loyalty_tier' is not a join target on model 'customers'."),
    ],
)
def test_references_resolve_strictly(store, reference, message):
    loc, cat = store
    before = memory_ids(loc)
    with pytest.raises(MemoryWriteError) as exc:
        save_memory(loc, cat, learning="x", entities=["orders", reference])
    assert exc.value.reference == reference and exc.value.kind == WriteErrorKind.UNRESOLVED
    assert str(exc.value) == f"cannot resolve {reference!r}: {message}"
    assert memory_ids(loc) == before


def test_memory_tags_are_checked_against_the_store(store):
    """A memory the (stale) catalog still lists but the store no longer has is refused."""
    loc, cat = store
    assert forget_memory(loc, cat, "12")
    with pytest.raises(MemoryWriteError, match=r"No memory with id '12'") as exc:
        save_memory(loc, cat, learning="x", entities=["memory:12"])
    assert exc.value.reference == "memory:12"
    fresh = load_catalog(loc.path)
    saved = save_memory(loc, fresh, learning="links", entities=["memory:kb.revenue", "orders"])
    assert saved.entities == ("memory:kb.revenue", "jaffle.orders")


def test_query_errors_name_the_reference(store):
    loc, cat = store
    with pytest.raises(MemoryWriteError, match=r"^query: Entity 'nonexistent' not found"):
        save_memory(
            loc, cat, learning="x", query={"source_model": "orders", "measures": ["sum(nonexistent)"]}
        )
    with pytest.raises(MemoryWriteError, match=r"^query: Source model not found: 'nope'"):
        save_memory(loc, cat, learning="x", query={"source_model": "nope", "measures": ["count(*)"]})


# ------------------------------------------------------------------------------------ query normal form

# Each is accepted by SLayer and must be stored exactly as SlayerQuery.model_dump(mode="json") stores it.
SAME_AS_SLAYER = [
    {"source_model": "orders", "measures": ["sum(subtotal)"], "dimensions": ["status", "stores.name"]},
    {"source_model": "orders", "dimensions": ["month(ordered_at)"]},
    {
        "source_model": "orders",
        "dimensions": ["MONTH(ordered_at)", "status"],
        "time_dimensions": [{"dimension": "ordered_at", "granularity": "year"}],
    },
    {
        "source_model": "orders",
        "time_dimensions": [{"dimension": "ordered_at", "granularity": "MONTH", "date_range": "2024"}],
    },
    {
        "source_model": "orders",
        "time_dimensions": [
            {"column": "orders.ordered_at", "granularity": "month", "date_range": ["2024-01-01", None]}
        ],
    },
    {
        "source_model": "orders",
        "time_dimensions": [
            {
                "dimension": "ordered_at",
                "granularity": "week",
                "date_range": ["2024-W05", "2024-Q3"],
                "label": "wk",
            }
        ],
    },
    {
        "source_model": "orders",
        "time_dimensions": [
            {"dimension": "ordered_at", "granularity": "day", "date_range": ["last 7 days"]},
            {"dimension": "ordered_at", "granularity": "hour", "date_range": "2024-01-01 10:00"},
        ],
    },
    {"source_model": "orders", "time_dimensions": ["fiscal_q(ordered_at)"]},
    {"source_model": "orders", "time_dimensions": [{"dimension": "ordered_at", "granularity": "Fiscal"}]},
    {
        "source_model": "orders",
        "time_dimensions": [
            {"dimension": "ordered_at", "granularity": "month"},
            {"dimension": "orders.ordered_at", "granularity": "month"},
        ],
    },
    {
        "source_model": "orders",
        "measures": ["count(*)"],
        "order": [{"column": "sum(subtotal)", "direction": "DESC"}],
    },
    {
        "source_model": "orders",
        "measures": [{"formula": "sum(subtotal)", "name": "rev"}],
        "order": [{"rev": "desc", "status": "asc"}],
    },
    {"source_model": "orders", "order": {"column": "status"}},
    {"source_model": "orders", "order": [{"column": "subtotal:sum", "direction": "ascending"}]},
    {"source_model": "orders", "order": [{"column": "*:count"}]},
    {"source_model": "orders", "order": [{"column": "stores.name", "direction": " Desc "}]},
    {"source_model": "orders", "order": [{"column": "subtotal + sum(tax_paid)"}]},
    {"source_model": "orders", "order": [{"column": {"name": "sum(subtotal)"}}]},
    {
        "source_model": "orders",
        "order": [{"column": {"name": "name", "model": "stores"}, "direction": "desc"}],
    },
    {
        "source_model": "orders",
        "measures": ["count(*)"],
        "limit": 5,
        "offset": 2,
        "whole_periods_only": True,
        "to_many_handling": "associate",
    },
    {
        "source_model": "orders",
        "measures": [
            {
                "formula": "sum(subtotal)",
                "type": "DOUBLE",
                "label": "Net",
                "description": "d",
                "meta": {"b": [1, 2.5, None], "a": "x"},
            }
        ],
    },
    {"source_model": "orders", "dimensions": [{"name": "stores.name", "label": "Store"}]},
    {"source_model": "orders", "dimensions": [{"expression": "subtotal * 2"}]},
    {"source_model": "orders", "dimensions": [{"expression": "subtotal * 2", "name": "double_sub"}]},
    {"source_model": "orders", "dimensions": ["subtotal * 2"]},
    {"source_model": "orders", "variables": {"x": 1, "y": ["a", "b"]}, "filters": ["subtotal > {x}"]},
    {"source_model": "orders", "main_time_dimension": "orders.ordered_at", "name": "my_query"},
    {"source_model": "orders", "dimensions": ["status"], "distinct_dimension_values": False},
    {"version": 6, "source_model": "orders", "measures": ["sum(subtotal)"]},
    {"source_model": "orders", "fields": ["sum(subtotal)"]},
    {"source_model": "orders", "measures": ["sum(subtotal)"], "dry_run": True},
    {"source_model": "orders", "measures": [{"formula": "sum(subtotal)", "extra_key": 1}]},
    {
        "source_model": "orders",
        "dimensions": ["customers.city"],
        "measures": ["count_distinct(customer_id)"],
        "filters": ["status = 'completed' and subtotal > 10"],
    },
]

# SLayer refuses these too.
REFUSED_BY_BOTH = [
    {"source_model": "orders", "order": ["status"]},
    {"source_model": "orders", "measures": "sum(subtotal)"},
    {"source_model": "orders", "strict": True},
    {"source_model": "orders", "bogus": 1},
    {"source_model": "orders", "filters": ["rank() over (order by x) < 3"]},
    {"source_model": "orders", "measures": ["sum(x) OVER (partition by y)"]},
    {"source_model": "orders", "dimensions": ["month(ordered_at, 2)"]},
    {"source_model": "orders", "time_dimensions": ["ordered_at"]},
    {
        "source_model": "orders",
        "time_dimensions": [{"dimension": "ordered_at", "granularity": "month", "date_range": "soon"}],
    },
    {
        "source_model": "orders",
        "time_dimensions": [{"dimension": "ordered_at", "granularity": "month", "date_range": [None, None]}],
    },
    {
        "source_model": "orders",
        "time_dimensions": [{"dimension": "ordered_at", "granularity": "month", "date_range": "2024-13"}],
    },
    {
        "source_model": "orders",
        "time_dimensions": [
            {"dimension": "ordered_at", "granularity": "month"},
            {"dimension": "ordered_at", "granularity": "month", "label": "x"},
        ],
    },
    {
        "source_model": "orders",
        "measures": ["sum(subtotal)"],
        "distinct_dimension_values": False,
        "dimensions": ["status"],
    },
    {"source_model": "orders", "distinct_dimension_values": False},
    {"source_model": "orders", "measures": [{"formula": "sum(subtotal)", "name": "bad name"}]},
    {"source_model": "orders", "measures": [{"formula": "sum(subtotal)", "type": "double"}]},
    {"source_model": "orders", "order": [{"column": "status", "direction": "up"}]},
    {"source_model": "orders", "order": [{"column": "status", "nulls": "first"}]},
    {"source_model": "orders", "dimensions": [{"name": "bad-name"}]},
    {"source_model": "orders", "dimensions": [{"expression": "a + b", "name": "x.y"}]},
    {"source_model": "orders", "name": "a.b"},
    {"source_model": "orders", "to_many_handling": "whatever"},
    {"source_model": "orders", "fields": ["x"], "measures": ["y"]},
    {"source_model": "orders", "dimensions": ["a +* b"]},
]

# SLayer would store these, but we cannot reproduce its normal form faithfully: refused on purpose.
REFUSED_BY_US = [
    {"source_model": {"source_name": "orders", "columns": [{"name": "x", "sql": "1"}]}},
    {"source_model": {"name": "inline", "data_source": "jaffle", "sql_table": "t", "columns": []}},
    {"source_model": "orders", "version": 5},
    {"source_model": "orders", "limit": "5"},
    {
        "source_model": "orders",
        "time_dimensions": [{"dimension": "ordered_at", "granularity": "month", "date_range": "{start}"}],
    },
    {"source_model": "orders", "variables": {"x": math.nan}},
    {"source_model": "orders", "variables": {"x": object()}},
]


def _json_safe(query):
    return json.loads(json.dumps(query, default=str).replace("NaN", "null"))


@pytest.mark.parametrize("query", REFUSED_BY_BOTH + REFUSED_BY_US)
def test_unstorable_queries_are_refused(query):
    with pytest.raises(QueryRefused, match=r"^query"):
        normalize_query(query)


def test_normal_form_is_idempotent_on_slayer_written_queries(yaml_catalog):
    queries = [m.query for m in yaml_catalog.memories.values() if m.query]
    assert len(queries) == 2
    for query in queries:
        assert normalize_query(query) == (query, ())


def test_dropped_keys_are_reported():
    stored, warnings = normalize_query(
        {"source_model": "orders", "measures": [{"formula": "count(*)", "lable": "x"}]}
    )
    assert stored["measures"] == [
        {"formula": "count(*)", "name": None, "label": None, "description": None, "type": None, "meta": None}
    ]
    assert warnings == ("query.measures[0]: unknown key 'lable' ignored (SLayer drops it)",)


@needs_slayer
def test_query_normal_form_matches_slayer():
    cases = SAME_AS_SLAYER + REFUSED_BY_BOTH
    answers = oracle.ask([{"op": "normalize", "query": _json_safe(q)} for q in cases])
    for query, answer in zip(SAME_AS_SLAYER, answers[: len(SAME_AS_SLAYER)], strict=True):
        assert normalize_query(query)[0] == oracle.ok(answer), query
    for query, answer in zip(REFUSED_BY_BOTH, answers[len(SAME_AS_SLAYER) :], strict=True):
        assert "error" in answer, f"SLayer accepts {query}: refusing it is no longer needed"


# ------------------------------------------------------------------------------------ created_at

STAMPS = [
    datetime(2024, 1, 1, tzinfo=UTC),
    datetime(2024, 1, 1, 0, 0, 0, 5, tzinfo=UTC),
    datetime(2024, 2, 29, 23, 59, 59, 999999, tzinfo=UTC),
    datetime(2024, 1, 1, 0, 0, 0, 500000, tzinfo=timezone(timedelta(hours=2))),
    datetime(2024, 1, 1, 12, tzinfo=timezone(timedelta(hours=-5, minutes=-30))),
    datetime(2024, 1, 1, 12, 30),
]


def test_created_at_format():
    assert [format_created_at(d) for d in STAMPS[:3]] == [
        "2024-01-01T00:00:00Z",
        "2024-01-01T00:00:00.000005Z",
        "2024-02-29T23:59:59.999999Z",
    ]


@pytest.mark.parametrize(
    "stored, kept",
    [
        ("'2026-11-30T04:23:22.070024Z'", "2026-11-30T04:23:22.070024Z"),
        ("'2026-11-30T04:23:22+00:00'", "2026-11-30T04:23:22Z"),
        ("'2026-11-30 04:23:22.1'", "2026-11-30T04:23:22.100000"),
        ("'2026-11-30T04:23:22.0700249Z'", "2026-11-30T04:23:22.070024Z"),  # pydantic truncates
        ("'2026-11-30'", "2026-11-30T00:00:00"),
        ("2026-11-30", "2026-11-30T00:00:00"),  # unquoted: a YAML date
        ("2026-11-30T04:23:22.5Z", "2026-11-30T04:23:22.500000Z"),  # unquoted: a YAML timestamp
        ("2026-11-30T04:23:22.5+05:30", "2026-11-30T04:23:22.500000+05:30"),
    ],
)
def test_upsert_reformats_a_stored_created_at_like_slayer(yaml_store, stored, kept):
    loc, cat = yaml_store
    path = loc.path / "memories" / "1.md"
    path.write_text(path.read_text().replace("'2026-11-30T04:22:12.008273Z'", stored))
    assert save_memory(loc, cat, learning="x", entities=["orders"], id="1").created_at == kept


def test_upsert_refuses_an_unreadable_existing_memory(yaml_store):
    loc, cat = yaml_store
    path = loc.path / "memories" / "1.md"
    path.write_text("---\ncreated_at: [unclosed\n---\nbody")
    with pytest.raises(MemoryWriteError, match="existing memory '1' cannot be read"):
        save_memory(loc, cat, learning="x", entities=["orders"], id="1")
    path.write_text("---\ncreated_at: 'yesterday'\n---\nbody")
    with pytest.raises(MemoryWriteError, match="unreadable created_at"):
        save_memory(loc, cat, learning="x", entities=["orders"], id="1")


@needs_slayer
def test_created_at_format_matches_pydantic():
    values = [format_created_at(d) for d in STAMPS]
    assert oracle.ok(oracle.ask([{"op": "format_created_at", "values": values}])[0]) == values


# ------------------------------------------------------------------------------------ forget


def test_forget_removes_the_memory_its_tags_and_its_embeddings(store):
    loc, cat = store
    add_embeddings(loc, ["memory:1", "memory:10", "memory:1.x", "memory:12"])
    assert "memory:1" in stored_doc(loc, "kb.revenue")["entities"]
    assert forget_memory(loc, cat, "1")
    assert stored_doc(loc, "1") is None
    assert stored_doc(loc, "kb.revenue")["entities"] == ["memory:2", "jaffle.orders.total_revenue"]
    assert embedding_ids(loc) == {"memory:10", "memory:1.x", "memory:12"}  # exact id only, never a prefix
    if loc.backend == "sqlite":
        rows = entity_rows(loc)
        assert not {r for r in rows if r[0] == "1"} and ("kb.revenue", "memory:1") not in rows
    assert not forget_memory(loc, cat, "1")
    assert not forget_memory(loc, cat, "no.such.memory")


def test_forget_drops_an_emptied_entity_list(store):
    loc, cat = store
    save_memory(loc, cat, learning="only a link", entities=["memory:2"], id="link")
    assert forget_memory(loc, cat, "2")
    doc = stored_doc(loc, "link")
    if loc.backend == "yaml":
        assert "entities" not in doc and doc["learning"] == "only a link"
    else:
        assert doc["entities"] == []


# ------------------------------------------------------------------------------------ store checks


def test_missing_or_legacy_stores_are_refused(tmp_path):
    cat = load_catalog(YAML_STORE)
    with pytest.raises(MemoryWriteError, match="no SLayer SQLite store"):
        save_memory(StoreLocation("sqlite", tmp_path / "absent.db"), cat, learning="x", entities=["orders"])
    assert not (tmp_path / "absent.db").exists()
    with pytest.raises(MemoryWriteError, match="no SLayer YAML store"):
        save_memory(StoreLocation("yaml", tmp_path / "absent"), cat, learning="x", entities=["orders"])
    legacy = _copy_store("yaml", tmp_path)
    (legacy.path / "memories.yaml").write_text("[]\n")
    with pytest.raises(MemoryWriteError, match="legacy memories.yaml"):
        save_memory(legacy, cat, learning="x", entities=["orders"])
    old = tmp_path / "old.db"
    with sqlite3.connect(old) as conn:
        conn.execute("CREATE TABLE memories (id INTEGER PRIMARY KEY, data TEXT NOT NULL)")
        conn.execute("CREATE TABLE memory_entities (memory_id INTEGER, entity TEXT)")
    with pytest.raises(MemoryWriteError, match="legacy memories table"):
        save_memory(StoreLocation("sqlite", old), cat, learning="x", entities=["orders"])


def test_file_modes_and_lock_file(yaml_store):
    loc, cat = yaml_store
    (loc.path / "memories.lock").unlink()
    saved = save_memory(loc, cat, learning="x", entities=["orders"])
    assert (loc.path / "memories.lock").exists()
    assert (loc.path / "memories" / f"{saved.id}.md").stat().st_mode & 0o777 == 0o600
    existing = loc.path / "memories" / "2.md"
    existing.chmod(0o640)
    save_memory(loc, cat, learning="y", entities=["orders"], id="2")
    assert existing.stat().st_mode & 0o777 == 0o640


def test_a_held_lock_times_out_cleanly(yaml_store):
    loc, cat = yaml_store
    with open(loc.path / "memories.lock", "ab") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        with pytest.raises(MemoryWriteError, match="timed out") as saving:
            save_memory(loc, cat, learning="x", entities=["orders"], lock_timeout=0.2)
        with pytest.raises(MemoryWriteError, match="timed out") as forgetting:
            forget_memory(loc, cat, "1", lock_timeout=0.2)
    assert saving.value.kind == forgetting.value.kind == WriteErrorKind.BUSY and saving.value.store_side
    assert "13" not in memory_ids(loc) and "1" in memory_ids(loc)


def _disk_full(*_args, **_kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("target", ["write_all", "os.replace", "tempfile.mkstemp"])
def test_yaml_write_failures_leave_nothing_behind(yaml_store, monkeypatch, target):
    loc, cat = yaml_store
    before = {n: (loc.path / "memories" / n).read_bytes() for n in os.listdir(loc.path / "memories")}
    owner, _, name = target.rpartition(".")
    monkeypatch.setattr(getattr(store_files, owner) if owner else store_files, name, _disk_full)
    with pytest.raises(MemoryWriteError, match=r"No space left on device \(ENOSPC\)") as full:
        save_memory(loc, cat, learning="new", entities=["orders"])
    assert full.value.kind == WriteErrorKind.STORE
    with pytest.raises(MemoryWriteError, match="No space left on device"):
        save_memory(loc, cat, learning="changed", entities=["orders"], id="3")
    monkeypatch.undo()
    after = {n: (loc.path / "memories" / n).read_bytes() for n in os.listdir(loc.path / "memories")}
    assert after == before and not stray_temp_files(loc)


def test_yaml_permission_errors(yaml_store, monkeypatch):
    loc, cat = yaml_store

    def denied(*_args, **_kwargs):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(store_files.tempfile, "mkstemp", denied)
    with pytest.raises(MemoryWriteError, match=r"Permission denied \(EACCES\)"):
        save_memory(loc, cat, learning="x", entities=["orders"])
    monkeypatch.undo()
    if os.geteuid() != 0:  # root ignores file modes, so only a real user can see the real error
        (loc.path / "memories").chmod(0o555)
        try:
            with pytest.raises(MemoryWriteError, match="Permission denied"):
                save_memory(loc, cat, learning="x", entities=["orders"])
        finally:
            (loc.path / "memories").chmod(0o755)
    assert not stray_temp_files(loc) and "13" not in memory_ids(loc)


def test_sqlite_disk_full_rolls_back(tmp_path, monkeypatch):
    loc = _copy_store("sqlite", tmp_path)
    cat = load_catalog(loc.path)
    before = (memory_ids(loc), entity_rows(loc), stored_text(loc, "3"))
    real_connect = transactions.connect

    def full_connect(db, timeout):  # a database that cannot grow: SQLite reports SQLITE_FULL
        conn = real_connect(db, timeout)
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        conn.execute(f"PRAGMA max_page_count = {pages}")
        return conn

    monkeypatch.setattr(transactions, "connect", full_connect)
    big = "x" * 200_000
    with pytest.raises(MemoryWriteError, match="database or disk is full"):
        save_memory(loc, cat, learning=big, entities=["orders", "stores", "orders.status"])
    with pytest.raises(MemoryWriteError, match="database or disk is full"):
        save_memory(loc, cat, learning=big, entities=["orders"], id="3")
    monkeypatch.undo()
    assert (memory_ids(loc), entity_rows(loc), stored_text(loc, "3")) == before


# ------------------------------------------------------------------------------------ SLayer oracle

COMPAT_INPUTS = [
    dict(id="c1", learning="amount is in cents", entities=["orders.subtotal", "stores"]),
    dict(
        id="c2",
        learning="Ünïcödé — “quotes”, emoji 🎉\n\nsecond paragraph\n",
        entities=["customers.city"],
        description="Ünïcödé: preview # with 'quotes'",
    ),
    dict(id="c3", learning="---\nnot front matter\n---\n", entities=["memory:kb.revenue", "jaffle"]),
    dict(
        id="c4",
        learning="top products",
        description="yes",
        query={
            "source_model": "order_items",
            "measures": [{"formula": "sum(quantity)", "name": "units"}],
            "dimensions": ["products.name"],
            "order": [{"units": "desc"}],
            "limit": 10,
        },
    ),
    dict(
        id="c5",
        learning="monthly",
        query={
            "source_model": "orders",
            "dimensions": ["month(ordered_at)", "stores.name"],
            "measures": ["sum(subtotal)", "count(*)"],
            "filters": ["status = 'completed'"],
            "time_dimensions": [
                {"dimension": "ordered_at", "granularity": "year", "date_range": ["2024", "2025"]}
            ],
            "order": [{"column": "sum(subtotal)", "direction": "desc"}],
            "variables": {"s": "completed"},
        },
    ),
    dict(
        id="c6",
        learning="x: 1\ny: [2]",
        entities=["supplies.supplies.cost", "order_items.products.name"],
        description="  leading and trailing  ",
    ),
    dict(id="yes", learning="null", entities=["orders"], description="null"),
    dict(id="0123", learning="'quoted' \"both\" \\ backslash", entities=["products"]),
]


def _save_all(loc, cat):
    saved = {}
    for spec in COMPAT_INPUTS:
        saved[spec["id"]] = save_memory(loc, cat, **spec)
    return saved


@pytest.mark.slow
@needs_slayer
@pytest.mark.parametrize("backend", ["yaml", "sqlite"])
def test_slayer_loads_and_writes_the_same_memories(tmp_path, backend):
    ours = _copy_store(backend, tmp_path / "ours")
    theirs = _copy_store(backend, tmp_path / "theirs")
    service = _copy_store(backend, tmp_path / "service")
    cat = load_catalog(ours.path)
    saved = _save_all(ours, cat)
    upsert = save_memory(
        ours, cat, id="c1", learning="amount is in cents (upserted)", entities=["orders.subtotal"]
    )
    assert upsert.created_at == saved["c1"].created_at
    saved["c1"] = upsert
    specs = {
        s["id"]: s
        | (
            {"learning": "amount is in cents (upserted)", "entities": ["orders.subtotal"]}
            if s["id"] == "c1"
            else {}
        )
        for s in COMPAT_INPUTS
    }

    ops = [{"op": "load", "store": str(ours.path)}]
    # SLayer writes the same memories itself (same id and created_at, query from the raw input)
    ops += [
        {
            "op": "write_row",
            "store": str(theirs.path),
            "memory": {
                "id": mid,
                "learning": spec["learning"],
                "description": spec.get("description"),
                "entities": list(saved[mid].entities),
                "query": spec.get("query"),
                "created_at": saved[mid].created_at,
            },
        }
        for mid, spec in specs.items()
    ]
    # and resolves the same references through its own service
    ops += [
        {
            "op": "service_save",
            "store": str(service.path),
            "learning": spec["learning"],
            "entities": spec.get("entities"),
            "query": spec.get("query"),
            "id": mid,
            "description": spec.get("description"),
        }
        for mid, spec in specs.items()
    ]
    answers = oracle.ask(ops)

    loaded = oracle.ok(answers[0])
    assert loaded["errors"] == []
    for mid, result in saved.items():
        doc = stored_doc(ours, mid)
        expected = writer._document(
            mid,
            doc["learning"],
            doc.get("description"),
            list(result.entities),
            doc.get("query"),
            result.created_at,
        )
        assert loaded["memories"][mid] == expected, mid
        assert loaded["memories"][mid]["learning"] == specs[mid]["learning"]
    for mid, answer in zip(specs, answers[1 : 1 + len(specs)], strict=True):
        oracle.ok(answer)
        assert stored_text(theirs, mid) == stored_text(ours, mid), mid
        if backend == "yaml":
            assert (theirs.path / "memories" / f"{mid}.md").read_bytes() == (
                ours.path / "memories" / f"{mid}.md"
            ).read_bytes()
    for mid, answer in zip(specs, answers[1 + len(specs) :], strict=True):
        response = oracle.ok(answer)
        assert response["memory_id"] == mid
        assert tuple(response["resolved_entities"]) == saved[mid].entities, mid
        assert tuple(response["warnings"]) == saved[mid].warnings, mid
    if backend == "sqlite":
        assert entity_rows(theirs) == entity_rows(ours)


HAND_WRITTEN_MD = """---
version: 4
created_at: 2026-01-02T03:04:05Z
description: ''
entities: [memory:1, jaffle.orders]
query: {source_model: orders, measures: ["count(*)"], dimensions: [stores.name]}
---
hand written"""
HAND_WRITTEN_ROW = {
    "id": "hand",
    "version": 4,
    "learning": "hand written",
    "entities": ["memory:1", "jaffle.orders"],
    "created_at": "2026-01-02T03:04:05+00:00",
    "query": {"source_model": "orders", "measures": ["count(*)"], "dimensions": ["stores.name"]},
}
LEGACY_MD = "---\ncreated_at: '2026-01-02T03:04:05Z'\nentities:\n- memory:1\n---\nno version: v1"
LEGACY_ROW = {
    "id": "legacy",
    "learning": "no version: v1",
    "entities": ["memory:1"],
    "created_at": "2026-01-02T03:04:05Z",
}


def _plant(loc: StoreLocation, memory_id: str, markdown: str, row: dict) -> None:
    """Put a memory in the store as someone else wrote it (not in SLayer's canonical form)."""
    if loc.backend == "yaml":
        (loc.path / "memories" / f"{memory_id}.md").write_text(markdown)
        return
    with sqlite3.connect(loc.path) as conn:
        conn.execute("INSERT INTO memories (id, data) VALUES (?, ?)", (memory_id, json.dumps(row)))
        conn.executemany(
            "INSERT INTO memory_entities VALUES (?, ?)", [(memory_id, e) for e in row["entities"]]
        )


@pytest.mark.slow
@needs_slayer
@pytest.mark.parametrize("backend", ["yaml", "sqlite"])
def test_forget_matches_slayer(tmp_path, backend):
    ours = _copy_store(backend, tmp_path / "ours")
    theirs = _copy_store(backend, tmp_path / "theirs")
    # a second memory linking memory 1, byte-identical in both stores
    save_memory(ours, load_catalog(ours.path), id="link1", learning="see 1", entities=["memory:1", "orders"])
    if backend == "yaml":
        shutil.copyfile(ours.path / "memories" / "link1.md", theirs.path / "memories" / "link1.md")
    else:
        with sqlite3.connect(theirs.path) as conn:
            conn.execute("INSERT INTO memories (id, data) VALUES ('link1', ?)", (stored_text(ours, "link1"),))
            conn.executemany(
                "INSERT INTO memory_entities VALUES ('link1', ?)", [("memory:1",), ("jaffle.orders",)]
            )
    for loc in (ours, theirs):  # a current memory in a non-canonical layout, and a version-less one
        _plant(loc, "hand", HAND_WRITTEN_MD, HAND_WRITTEN_ROW)
        _plant(loc, "legacy", LEGACY_MD, LEGACY_ROW)
    assert forget_memory(ours, None, "1")
    answers = oracle.ask(
        [
            {"op": "service_forget", "store": str(theirs.path), "id": "1"},
            {"op": "load", "store": str(ours.path)},
        ]
    )
    oracle.ok(answers[0])
    assert memory_ids(ours) == memory_ids(theirs)
    for mid in memory_ids(ours) - {"legacy"}:  # SLayer migrates the v1 document as it rewrites it; we do not
        assert stored_text(ours, mid) == stored_text(theirs, mid), mid
    loaded = oracle.ok(answers[1])
    assert loaded["errors"] == [] and loaded["memories"]["legacy"]["entities"] == []
    assert loaded["memories"]["legacy"]["learning"] == "no version: v1"
    if backend == "sqlite":
        assert entity_rows(ours) == entity_rows(theirs)


# ------------------------------------------------------------------------------------ concurrency

OUR_WORKER = r"""
import json, random, sys, time
from pathlib import Path
from slayer_lsp.catalog import load_catalog
from slayer_lsp.store.locate import locate
from slayer_lsp.writer.memories import save_memory

store, tag, count, gate = sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
location, catalog = locate(store), load_catalog(store)  # loaded once: stale for the whole run, on purpose
rnd = random.Random(tag)
(gate / f"ready-{tag}").touch()
while not (gate / "go").exists():
    time.sleep(0.002)
saved = []
for i in range(count):
    learning = f"{tag} note {i}"
    if i % 4 == 3:
        query = {"source_model": "orders", "measures": ["sum(subtotal)"], "dimensions": ["status"]}
        memory = save_memory(location, catalog, learning=learning, query=query)
    else:
        memory = save_memory(location, catalog, learning=learning, entities=["orders.status", "stores"])
    saved.append([memory.id, learning])
    if i % 6 == 0:
        save_memory(location, catalog, id="kb.shared", learning=f"{tag} shared {i}", entities=["stores"])
    time.sleep(rnd.uniform(0, 0.12))
print(json.dumps(saved))
"""

SLAYER_WORKER = r"""
import contextlib, io, json, re, sys, time
from pathlib import Path
from slayer.cli import main
import slayer.search.service  # noqa: F401  (imports paid before the start gate)
from slayer.embeddings.client import is_available

is_available()
store, tag, count, gate = sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
(gate / f"ready-{tag}").touch()
while not (gate / "go").exists():
    time.sleep(0.002)


def cli(*args):
    sys.argv = ["slayer", "memory", "--storage", store, "save", *args]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            main()
        except SystemExit as exc:
            raise RuntimeError(out.getvalue()) from exc
    return out.getvalue()


saved = []
for i in range(count):
    learning = f"{tag} note {i}"
    text = cli("--learning", learning, "--entities", "orders.status,stores")
    saved.append([re.search(r"Saved memory (\S+)\.", text).group(1), learning])
    if i % 6 == 0:
        cli("--learning", f"{tag} shared {i}", "--entities", "stores", "--id", "kb.shared")
print(json.dumps(saved))
"""


@pytest.mark.slow
@needs_slayer
@pytest.mark.parametrize("backend", ["yaml", "sqlite"])
def test_concurrent_writers_never_lose_or_duplicate(tmp_path, backend):
    loc = _copy_store(backend, tmp_path)
    initial = memory_ids(loc)
    gate = tmp_path / "gate"
    gate.mkdir()
    per_worker = 24
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", OUR_WORKER, str(loc.path), f"ours{k}", str(per_worker), str(gate)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for k in range(3)
    ]
    workers.append(
        subprocess.Popen(
            [
                oracle.slayer_python(),
                "-c",
                SLAYER_WORKER,
                str(loc.path),
                "slayer",
                str(per_worker),
                str(gate),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=oracle.slayer_env(tmp_path),
        )
    )
    try:
        deadline = time.monotonic() + 120
        while len(list(gate.glob("ready-*"))) < len(workers):
            assert time.monotonic() < deadline, "workers did not start"
            assert all(w.poll() is None for w in workers), [
                w.communicate() for w in workers if w.poll() is not None
            ]
            time.sleep(0.05)
        (gate / "go").touch()
        results = [w.communicate(timeout=180) for w in workers]
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
    for w, (_out, err) in zip(workers, results, strict=True):
        assert w.returncode == 0, err[-3000:]
    saved = [pair for out, _ in results for pair in json.loads(out)]
    ids = [memory_id for memory_id, _ in saved]
    total = per_worker * len(workers)
    assert len(set(ids)) == len(ids) == total  # no id handed out twice
    assert set(ids) == {str(n) for n in range(13, 13 + total)}  # and none skipped
    assert memory_ids(loc) == initial | set(ids) | {"kb.shared"}  # nothing lost
    assert not stray_temp_files(loc)
    loaded = oracle.ok(oracle.ask([{"op": "load", "store": str(loc.path)}])[0])
    assert loaded["errors"] == []
    assert set(loaded["memories"]) == memory_ids(loc)
    for memory_id, learning in saved:
        assert loaded["memories"][memory_id]["learning"] == learning
    assert re.fullmatch(r"(ours\d|slayer) shared \d+", loaded["memories"]["kb.shared"]["learning"])
