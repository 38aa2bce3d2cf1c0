"""The engine keeps its indexes warm: a change on disk shows in the next search, and an incrementally
updated engine answers exactly like one built from scratch on the same store."""

from __future__ import annotations

import shutil

import msgspec
import pytest
import yaml

from slayer_lsp.engine import Engine
from slayer_lsp.search.types import SearchError
from tests.conftest import YAML_STORE

CALLS = [
    {"question": "monthly revenue by store"},
    {"question": "what's the average order total?"},
    {"question": "supply cost", "datasource": "supplies"},
    {"question": "tax", "entities": ["jaffle.orders.status"], "compact": False},
    {"entities": ["jaffle.stores", "jaffle.stores.city"]},
    {"entities": ["memory:1"]},
    {"query": {"source_model": "orders", "measures": ["sum(subtotal)"], "dimensions": ["stores.name"]}},
    {"question": "orders", "datasource": "jaffle", "max_results": 30},
    {},
]


@pytest.fixture()
def store(tmp_path):
    dst = tmp_path / "store"
    shutil.copytree(YAML_STORE, dst)
    return dst


def _answers(engine: Engine) -> list:
    return [msgspec.to_builtins(engine.search(c)) for c in CALLS]


def _edit(store):
    orders = store / "models/jaffle/orders.yaml"
    data = yaml.safe_load(orders.read_text())
    for col in data["columns"]:
        if col["name"] == "discount_code":
            col["description"] = "Voucher code (zebracorn campaign) applied at checkout."
    data["columns"] = [c for c in data["columns"] if c["name"] != "tax_paid"]
    orders.write_text(yaml.safe_dump(data, sort_keys=False))
    (store / "memories/2.md").unlink()
    (store / "memories/60.md").write_text(
        "---\ncreated_at: '2026-12-01T00:00:00Z'\nentities:\n- supplies.supplies.cost\nversion: 4\n---\n"
        "Zebracorn supplies are priced per crate."
    )
    (store / "models/supplies/products.yaml").unlink()


def test_change_on_disk_is_visible_after_refresh(store):
    engine = Engine(store)
    before = engine.search({"question": "zebracorn", "ranking": "slayer"})
    assert before.results == []
    engine.search({"question": "supply", "datasource": "supplies"})  # builds the supplies index too
    _edit(store)
    delta = engine.refresh()
    assert "jaffle.orders.tax_paid" in delta.removed and "memory:60" in delta.added
    ids = [h.id for h in engine.search({"question": "zebracorn", "ranking": "slayer"}).results]
    assert ids == ["60", "jaffle.orders.discount_code"]
    scoped = [
        h.id
        for h in engine.search(
            {"question": "zebracorn", "datasource": "supplies", "ranking": "slayer"}
        ).results
    ]
    assert scoped == ["60"]
    gone = engine.search({"entities": ["jaffle.orders.tax_paid"]})
    assert gone.resolved_input_entities == [] and "dropped" in gone.warnings[0]


def test_incremental_equals_fresh(store):
    engine = Engine(store)
    _answers(engine)  # warm every lazily built index
    _edit(store)
    engine.refresh()
    fresh = _answers(Engine(store))
    incremental = _answers(engine)
    # right after the change nothing stale is returned (scores may drift a little: deleted
    # documents still weigh in tantivy's statistics) ...
    removed = {"2", "jaffle.orders.tax_paid", "supplies.products"}
    for answer in incremental:
        for hit in answer["results"]:
            assert not any(hit["id"] == r or hit["id"].startswith(r + ".") for r in removed), hit["id"]
    assert [a["warnings"] for a in incremental] == [a["warnings"] for a in fresh]
    # ... and after the background compaction, exactly a fresh build's answers
    assert engine.compact()
    assert _answers(engine) == fresh


def test_unreadable_store_keeps_serving_then_recovers(store, tmp_path):
    engine = Engine(store)
    good = _answers(engine)
    moved = tmp_path / "moved"
    store.rename(moved)
    engine.refresh()
    assert engine.catalog.fatal and "does not exist" in engine.catalog.fatal
    assert _answers(engine) == good  # the last good snapshot answers
    moved.rename(store)
    engine.refresh()
    assert engine.catalog.fatal is None and _answers(engine) == good


@pytest.mark.parametrize(
    "params,message",
    [
        ({"max_results": 0, "question": "x"}, "max_results must be >= 1; got 0."),
        (
            {"datasource": "warehouse", "question": "x"},
            "datasource 'warehouse' not found; known: ['jaffle', 'supplies'].",
        ),
        ({"questoin": "typo"}, "invalid search parameters"),
        ({"entities": "jaffle.orders"}, "invalid search parameters"),
    ],
)
def test_bad_requests_are_clear_errors(params, message):
    engine = Engine(YAML_STORE)
    with pytest.raises(SearchError) as err:
        engine.search(params)
    assert message in str(err.value)


def test_huge_requests_are_bounded():
    engine = Engine(YAML_STORE)
    resp = engine.search({"question": "revenue " * 200_000, "max_results": 10**9})
    assert any("cut" in w for w in resp.warnings) and any("cap" in w for w in resp.warnings)
    assert resp.results


def test_max_results_never_reorders():
    engine = Engine(YAML_STORE)
    for call in CALLS:
        full = [h.id for h in engine.search({**call, "max_results": 50}).results]
        for n in (1, 3, 7):
            assert [h.id for h in engine.search({**call, "max_results": n}).results] == full[:n]


def test_graph_catches_up_lazily(store):
    engine = Engine(store)
    query = (
        "MATCH (m:Memory)-[:MENTIONS]->(c:ModelColumn) WHERE c.id = 'jaffle.orders.status' RETURN m.id AS id"
    )
    before = {
        h.id for h in engine.search({"question": "orders", "cypher_filter": query, "max_results": 50}).results
    }
    assert before == {"2", "6"}
    (store / "memories/80.md").write_text(
        "---\nentities:\n- jaffle.orders.status\nversion: 4\n---\norders again"
    )
    engine.refresh()
    engine.compact()  # a compaction between the change and the next cypher call must not lose it
    after = {
        h.id for h in engine.search({"question": "orders", "cypher_filter": query, "max_results": 50}).results
    }
    assert after == {"2", "6", "80"}


@pytest.mark.parametrize("first_depth", [1, 2, 5])
def test_shallow_fetch_gives_the_full_answer(monkeypatch, first_depth):
    """Rankings fetched shallow first must answer exactly as rankings fetched in full."""
    from slayer_lsp.search import rrf

    engine = Engine(YAML_STORE)
    calls = [{**c, "max_results": n} for c in CALLS if c.get("question") for n in (1, 3, 10, 40)]
    calls += [
        {"question": q, "max_results": 5} for q in ("order", "customer city", "tax paid", "name", "supply")
    ]
    monkeypatch.setattr(rrf, "initial_depth", lambda n: rrf.TEXT_DEPTH)
    full = [msgspec.to_builtins(engine.search(c)) for c in calls]
    monkeypatch.setattr(rrf, "initial_depth", lambda n: first_depth)
    assert [msgspec.to_builtins(engine.search(c)) for c in calls] == full


@pytest.mark.parametrize(
    "every_change_up_to, divisor, expected", [(10**6, 200, True), (10, 200, True), (10, 2, False)]
)
def test_a_large_index_is_not_rebuilt_for_every_change(
    store, monkeypatch, every_change_up_to, divisor, expected
):
    """Up to ``COMPACT_EVERY_CHANGE_UP_TO`` documents a change is followed by a rebuild (answers stay
    a cold start's); past it, only once replaced documents are ``1/COMPACT_DIVISOR`` of the index
    (this store: 74 documents, of which the edit replaces a few)."""
    from slayer_lsp.search import indexes

    monkeypatch.setattr(indexes, "COMPACT_EVERY_CHANGE_UP_TO", every_change_up_to)
    monkeypatch.setattr(indexes, "COMPACT_DIVISOR", divisor)
    engine = Engine(store, use_cache=False)
    engine.refresh()
    assert not engine.current().search.needs_compaction
    _edit(store)
    engine.refresh()
    assert engine.current().search.needs_compaction is expected


@pytest.mark.parametrize("use_cache", [True, False])
def test_the_first_read_waits_for_what_must_come_before_it(store, tmp_path, monkeypatch, use_cache):
    """``before_first_read`` (a server's watch being put in place) runs once, before the first read
    looks at the store: a change made while it runs is in the first snapshot."""
    monkeypatch.setenv("SLAYER_LSP_CACHE_DIR", str(tmp_path / "cache"))
    Engine(store).close()  # a parse cache to load first
    calls = []

    def before() -> None:
        calls.append(1)
        path = store / "models/jaffle/orders.yaml"
        path.write_text(
            path.read_text().replace("columns:\n", "columns:\n- name: zebracorn\n  type: TEXT\n", 1)
        )

    engine = Engine(store, use_cache=use_cache)
    engine.before_first_read = before
    engine.refresh()
    assert calls == [1]
    assert engine.catalog.get("jaffle.orders.zebracorn") is not None
    engine.refresh()
    assert calls == [1]
