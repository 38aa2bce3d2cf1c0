"""Facets: the texts each kind declares, the part vectors the worker keeps for them (our own table,
never SLayer's), and the rankings over them: one facet, or several by the weakest."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import sqlite3
import subprocess

import numpy as np
import pytest
import yaml

from slayer_lsp.embed.lane import LaneConfig
from slayer_lsp.embed.parts import PARTS_TABLE, part_store
from slayer_lsp.embed.providers import FakeProvider
from slayer_lsp.embed.store import SLAYER_KINDS, NewVector, VectorStore
from slayer_lsp.embed.worker import EmbeddingWorker, PartVectors, WorkerConfig
from slayer_lsp.engine import Engine
from slayer_lsp.search.facet_ranking import (
    SearchFacetsParams,
    facet_kinds,
    parse_facets_params,
    rank_by_facet,
    search_facets,
)
from slayer_lsp.search.types import SearchError
from slayer_lsp.store import documents as d
from slayer_lsp.texts.facets import FACETS, facet_names, facet_texts, kinds_with
from slayer_lsp.texts.parts import PIECE_KIND, SEPARATORS, PartItems, owner_of, part_id, part_kind, parts_for
from slayer_lsp.texts.statements import EmbedItem, memory_text
from tests import slayer_oracle
from tests.conftest import SQLITE_STORE, YAML_STORE

WAIT = 120.0


class WordsProvider(FakeProvider):
    """Bag-of-words vectors: the cosine of two texts grows with the words they share, so dense
    rankings are predictable (and differ from BM25's)."""

    def __init__(self, dim: int = 512) -> None:
        super().__init__(dim=dim, name=f"test/words-{dim}")

    def vector(self, text: str) -> np.ndarray:
        v = np.zeros(self.dim, dtype=np.float32)
        for word in re.findall(r"[a-z0-9]+", text.lower()):
            v[int.from_bytes(hashlib.sha256(word.encode()).digest()[:4], "little") % self.dim] += 1.0
        if not v.any():
            v[0] = 1.0
        return v / np.linalg.norm(v)


@pytest.fixture()
def store(tmp_path):
    dst = tmp_path / "store"
    shutil.copytree(YAML_STORE, dst)
    return dst


def live(store, provider=None, **kw) -> Engine:
    engine = Engine(store, dense="live", embedding_provider=provider or WordsProvider(), **kw)
    engine.refresh()
    assert engine.dense is not None
    assert engine.dense.wait_idle(WAIT)
    if engine.dense.parts is not None:
        assert engine.dense.parts.wait_idle(WAIT)
    return engine


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    """The same store ranked densely (bag-of-words vectors) and lexically (BM25)."""
    root = tmp_path_factory.mktemp("facets")
    dst = root / "store"
    shutil.copytree(YAML_STORE, dst)
    dense = live(dst)
    lexical = Engine(dst)
    lexical.refresh()
    yield {"dense": dense, "lexical": lexical}
    dense.close()
    lexical.close()


def facets_search(engine, **params):
    state = engine.current()
    return search_facets(state.catalog, state.search, SearchFacetsParams(**params))


def ranking(engine, facet, query, **kw):
    state = engine.current()
    return rank_by_facet(state.catalog, state.search, facet, query, **kw)


def expected_kind(owner_kind: str, part: str) -> str:
    """A facet's part kind is ``<owner kind>#<facet>``; every memory piece is ``memory#piece``."""
    if owner_kind == "memory" and part[:1] == "p" and part[1:].isdigit():
        return PIECE_KIND
    return part_kind(owner_kind, part)


def expected_parts(catalog) -> dict[str, str]:
    """part id -> text, computed from the declarations alone (and a memory's pieces)."""
    from slayer_lsp.texts.pieces import piece_texts

    out = {}
    for cid in catalog.searchable_ids():
        ent = catalog.get(cid)
        for facet, text in facet_texts(ent.obj).items():
            out[part_id(cid, facet)] = text
        if ent.kind == "memory":
            for n, text in enumerate(piece_texts(ent.obj)):
                out[part_id(cid, f"p{n}")] = text
    return out


# --------------------------------------------------------------------------- facet texts


def test_every_searchable_entity_has_its_kinds_facets_only(yaml_catalog):
    seen: dict[str, set[str]] = {}
    for cid in yaml_catalog.searchable_ids():
        ent = yaml_catalog.get(cid)
        texts = facet_texts(ent.obj)
        assert texts.get("meaning"), cid  # every kind has a meaning, and every entity one
        assert set(texts) <= set(FACETS[ent.kind]), cid
        assert all(t == " ".join(t.split()) or ent.kind == "memory" for t in texts.values()), cid
        seen.setdefault(ent.kind, set()).update(texts)
    assert seen == {kind: set(facets) for kind, facets in FACETS.items()}  # each facet occurs in the fixture


@pytest.mark.parametrize(
    ("obj", "want"),
    [
        (
            d.Column(name="CustomerID", label="Customer ID", description="Who bought.", type="int"),
            {"meaning": "customer id. Who bought"},
        ),  # a label repeating the name's words adds nothing
        (
            d.Column(
                name="segment", label="Client segment", sampled_values=["SME", "LAM", "KAM"], type="text"
            ),
            {"meaning": "segment. Client segment", "values": "text values: SME, LAM, KAM"},
        ),
        (
            d.Column(name="amount", sampled="3.0 .. 115.5", type="DOUBLE"),
            {"meaning": "amount", "values": "double values: 3.0 .. 115.5"},
        ),
        (
            d.Measure(name="total_revenue", formula="sum(order_total)", label="Revenue"),
            {"meaning": "total revenue. Revenue", "formula": "sum(order_total)"},
        ),
        (d.Measure(name="count"), {"meaning": "count"}),
        (
            d.Aggregation(
                name="avg_nonzero",
                formula="AVG(NULLIF({value}, 0))",
                params=[d.AggregationParam(name="floor", sql="0")],
            ),
            {"meaning": "avg nonzero", "formula": "AVG(NULLIF({value}, 0)); parameters floor"},
        ),
        (
            d.Model(
                name="order_items",
                description="Order lines.",
                columns=[
                    d.Column(name="sku"),
                    d.Column(name="qty", label="Units"),
                    d.Column(name="x", hidden=True),
                ],
            ),
            {"meaning": "order items. Order lines", "columns": "sku, qty (Units)"},
        ),
        (d.Model(name="empty"), {"meaning": "empty"}),
        (d.Datasource(name="shop_db", description="The shop."), {"meaning": "shop db. The shop"}),
        (
            d.Memory(
                id="7",
                learning="Net sales exclude tax.",
                description="Glossary",
                entities=["jaffle.orders.subtotal", "jaffle", "memory:3"],
            ),
            {"meaning": "Net sales exclude tax.\n\nGlossary", "entities": "orders subtotal, jaffle"},
        ),
        (
            d.Memory(id="8", learning="Only a memory ref.", entities=["memory:3"]),
            {"meaning": "Only a memory ref."},
        ),
    ],
)
def test_facet_texts(obj, want):
    assert facet_texts(obj) == want


def test_memory_meaning_is_slayers_embedding_text(yaml_catalog):
    for mem in yaml_catalog.memories.values():
        assert facet_texts(mem)["meaning"] == memory_text(mem).strip()


def test_declarations():
    assert facet_names() == ["meaning", "columns", "values", "formula", "entities"]
    assert kinds_with("formula") == ["measure", "aggregation"]
    assert facet_kinds("meaning") == list(FACETS)
    assert facet_kinds("values", ["column", "model"]) == ["column"]
    with pytest.raises(SearchError, match="unknown facet 'colour'"):
        facet_kinds("colour")
    with pytest.raises(SearchError, match="not declared by kind"):
        facet_kinds("values", ["model"])


def test_parts_of_a_catalog(yaml_catalog):
    items = PartItems(yaml_catalog)
    listed = list(items)
    assert len(items) == len(listed) == len(expected_parts(yaml_catalog))
    assert {i.canonical_id: i.text for i in listed} == expected_parts(yaml_catalog)
    for item in listed:
        owner = owner_of(item.canonical_id)
        assert item.kind == expected_kind(yaml_catalog.kind_of(owner), item.canonical_id.rpartition("#")[2])
    hidden = [e.canonical for e in yaml_catalog.entities.values() if e.hidden]
    assert hidden and all(parts_for(yaml_catalog, c) == [] for c in hidden)
    assert parts_for(yaml_catalog, "jaffle.nosuch") == []


# --------------------------------------------------------------------------- storage


def _row(cid: str, kind: str, seed: int) -> NewVector:
    vec = np.random.default_rng(seed).standard_normal(8).astype(np.float32)
    return NewVector(cid, kind, f"h{seed}", vec)


def test_part_store_round_trip_and_removal(tmp_path):
    store = VectorStore(
        tmp_path / "parts.db", create=True, table=PARTS_TABLE, kinds=None, separators=SEPARATORS
    )
    rows = [
        _row("ds.m#meaning", "model#meaning", 1),
        _row("ds.m.c#values", "column#values", 2),
        _row("ds.m2#meaning", "model#meaning", 3),
        _row("memory:4#meaning", "memory#meaning", 4),
        _row("memory:42#meaning", "memory#meaning", 5),
    ]
    assert store.upsert("m", rows) == 5
    got = store.get("m", [r.canonical_id for r in rows])
    for r in rows:
        assert got[r.canonical_id].kind == r.kind and got[r.canonical_id].content_hash == r.content_hash
        assert np.array_equal(got[r.canonical_id].vector, r.vector)  # float32 exactly restored
    assert store.delete("ds.m") == 2  # the owner's parts and its descendants', never ds.m2's
    assert store.delete("memory:4") == 1  # never memory:42's
    assert sorted(store.get("m", [r.canonical_id for r in rows])) == ["ds.m2#meaning", "memory:42#meaning"]
    tables = {
        n for (n,) in sqlite3.connect(store.path).execute("SELECT name FROM sqlite_master WHERE type='table'")
    }
    assert tables == {PARTS_TABLE}
    # SLayer's table takes only SLayer's kinds: a part can never be written there by mistake
    slayer_table = VectorStore(tmp_path / "embeddings.db", create=True)
    with pytest.raises(ValueError, match="not one SLayer reads"):
        slayer_table.upsert("m", [_row("ds.m#meaning", "model#meaning", 1)])
    assert "model#meaning" not in SLAYER_KINDS


def test_part_store_lives_in_the_cache_dir(store, monkeypatch, tmp_path):
    from slayer_lsp.embed.store import MemoryStore

    monkeypatch.setenv("SLAYER_LSP_CACHE_DIR", str(tmp_path / "cache"))
    ps = part_store(store)
    assert ps.path.name == "parts.db" and (tmp_path / "cache") in ps.path.parents and ps.table == PARTS_TABLE
    monkeypatch.setenv("SLAYER_LSP_CACHE", "off")
    assert isinstance(part_store(store), MemoryStore)


def _items(owner: str, kind: str, **texts: str) -> list[EmbedItem]:
    return [EmbedItem(part_id(owner, f), part_kind(kind, f), t) for f, t in texts.items()]


# a worker whose one lane takes parts, as the part lane of a dense channel does
PARTS_ALONE = WorkerConfig(entities=LaneConfig(kinds=None, separators=SEPARATORS, prune=True))


def test_part_worker_sets_skips_and_removes(tmp_path):
    provider = FakeProvider(dim=8)
    pstore = VectorStore(
        tmp_path / "parts.db", create=True, table=PARTS_TABLE, kinds=None, separators=SEPARATORS
    )
    worker = EmbeddingWorker(tmp_path, provider, store=pstore, config=PARTS_ALONE)
    try:
        worker.entities.set_parts(
            "ds.m.c", _items("ds.m.c", "column", meaning="amount", values="int values: 1, 2")
        )
        worker.entities.set_parts("ds.m", _items("ds.m", "model", meaning="orders", columns="amount"))
        worker.entities.set_parts("ds.m2", _items("ds.m2", "model", meaning="orders two"))
        assert worker.wait_idle(WAIT)
        assert sorted(worker.index.ids()) == [
            "ds.m#columns",
            "ds.m#meaning",
            "ds.m.c#meaning",
            "ds.m.c#values",
            "ds.m2#meaning",
        ]
        calls = provider.calls
        worker.entities.set_parts(
            "ds.m.c", _items("ds.m.c", "column", meaning="amount", values="int values: 1, 2")
        )
        assert worker.wait_idle(WAIT) and provider.calls == calls  # unchanged texts: skipped by hash
        worker.entities.set_parts(
            "ds.m.c", _items("ds.m.c", "column", meaning="amount paid")
        )  # lost its samples
        assert worker.wait_idle(WAIT)
        assert worker.index.parts_of("ds.m.c") == ["ds.m.c#meaning"]
        assert sorted(pstore.get(provider.name, ["ds.m.c#meaning", "ds.m.c#values"])) == ["ds.m.c#meaning"]
        worker.remove("ds.m")  # the owner goes: its parts and its columns' parts go with it
        assert worker.wait_idle(WAIT)
        assert worker.index.ids() == ["ds.m2#meaning"]
        assert list(
            pstore.get(provider.name, ["ds.m#meaning", "ds.m#columns", "ds.m.c#meaning", "ds.m2#meaning"])
        ) == ["ds.m2#meaning"]
        st = worker.entities.parts_status()
        assert st.rows == 1 and st.kinds == {"model#meaning": 1} and st.pending == 0 and st.failed == 0
    finally:
        worker.close()


def test_backfill_prunes_rows_of_entities_gone_while_stopped(tmp_path):
    provider = FakeProvider(dim=8)
    pstore = VectorStore(
        tmp_path / "parts.db", create=True, table=PARTS_TABLE, kinds=None, separators=SEPARATORS
    )
    pstore.upsert(provider.name, [NewVector("gone.m#meaning", "model#meaning", "x", provider.vector("gone"))])
    items = _items("ds.m", "model", meaning="orders")
    worker = EmbeddingWorker(tmp_path, provider, store=pstore, config=PARTS_ALONE, items=lambda: items)
    try:
        assert worker.wait_idle(WAIT)
        assert worker.index.ids() == ["ds.m#meaning"]
        assert list(pstore.get(provider.name, ["gone.m#meaning", "ds.m#meaning"])) == ["ds.m#meaning"]
    finally:
        worker.close()


# --------------------------------------------------------------------------- in the engine


def _stored_ids(engine) -> set[str]:
    parts = engine.dense.parts
    with sqlite3.connect(parts.store.path) as conn:
        return {
            c
            for (c,) in conn.execute(
                f"SELECT canonical_id FROM {PARTS_TABLE} WHERE embedding_model_name = ?",
                (parts.provider.name,),
            )
        }


def test_engine_keeps_a_vector_per_part(store):
    provider = WordsProvider()
    engine = live(store, provider)
    parts = engine.dense.parts
    want = expected_parts(engine.catalog)
    assert set(parts.index.ids()) == set(want) == _stored_ids(engine)
    counts: dict[str, int] = {}
    for pid in want:
        kind = expected_kind(engine.catalog.kind_of(owner_of(pid)), pid.rpartition("#")[2])
        counts[kind] = counts.get(kind, 0) + 1
    st = engine.dense.status().parts
    assert st is not None and st.kinds == dict(sorted(counts.items())) and st.rows == len(want)
    assert st.pending == 0 and st.failed == 0 and st.store == str(parts.store.path)
    # a memory's meaning is its main text: its vector is taken from the main index, never embedded twice
    texts = [t for batch in provider.batches for t in batch]
    mems = list(engine.catalog.memories.values())
    assert st.reused >= len(mems) and all(texts.count(memory_text(m)) == 1 for m in mems)
    engine.close()

    again = live(store, WordsProvider())  # a restart reads the stored parts; nothing is embedded
    st = again.dense.status().parts
    assert st.embedded == 0 and st.rows == len(want)
    again.close()


def _edit(path, change) -> None:
    doc = yaml.safe_load(path.read_text())
    change({c["name"]: c for c in doc["columns"]})
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


def test_store_edits_reach_the_parts(store):
    engine = live(store)
    parts = engine.dense.parts
    embedded = parts.embedded

    def change(cols):
        cols["city"]["description"] = "Town of the shop"
        for key in ("sampled", "sampled_values", "distinct_count"):
            cols["name"].pop(key, None)
        cols["opened_at"]["hidden"] = True

    _edit(store / "models" / "jaffle" / "stores.yaml", change)
    engine.refresh()
    assert parts.wait_idle(WAIT)
    # only the changed meaning is embedded again (the model's column list lost a hidden column: one more)
    assert parts.embedded - embedded == 2
    want = expected_parts(engine.catalog)
    assert set(parts.index.ids()) == set(want)
    assert "jaffle.stores.name#values" not in _stored_ids(engine)  # a facet with no text left: deleted
    assert "jaffle.stores.opened_at#meaning" in _stored_ids(engine)  # hidden: out of the index only
    assert parts.index.hash_of("jaffle.stores.city#meaning") is not None

    (store / "models" / "jaffle" / "stores.yaml").unlink()
    engine.refresh()
    assert parts.wait_idle(WAIT)
    assert not [p for p in parts.index.ids() if p.startswith(("jaffle.stores#", "jaffle.stores."))]
    assert not [p for p in _stored_ids(engine) if p.startswith(("jaffle.stores#", "jaffle.stores."))]
    engine.close()


# --------------------------------------------------------------------------- rankings


CHANNELS = ["dense", "lexical"]


@pytest.mark.parametrize("channel", CHANNELS)
def test_the_weakest_facet_decides(engines, channel):
    resp = facets_search(
        engines[channel], kind="column", facets={"meaning": "city", "values": "Berlin"}, limit=20
    )
    assert resp.channel == channel and resp.warnings == []
    ids = [h.id for h in resp.results]
    assert ids[0] == "jaffle.customers.city"
    # stores.city is the best meaning match, but none of its samples is Berlin
    best_meaning = ranking(engines[channel], "meaning", "city", kinds=["column"]).ids()[0]
    assert best_meaning == "jaffle.stores.city"
    assert "jaffle.stores.city" not in ids[:1]
    scores = [h.score for h in resp.results]
    assert scores == sorted(scores, reverse=True)
    for hit in resp.results:
        assert set(hit.facet_scores) == {"meaning", "values"} and hit.score == min(hit.facet_scores.values())


@pytest.mark.parametrize("channel", CHANNELS)
def test_an_entity_without_a_facet_is_never_combined(engines, channel):
    alone = ranking(engines[channel], "meaning", "fax number or city", kinds=["column"])
    assert alone.ids()[0] == "jaffle.customers.fax_number"  # it has a meaning, and no samples
    resp = facets_search(
        engines[channel],
        kind="column",
        facets={"meaning": "fax number or city", "values": "Berlin"},
        limit=1000,
    )
    assert resp.results and "jaffle.customers.fax_number" not in [h.id for h in resp.results]
    catalog = engines[channel].catalog
    assert all("values" in facet_texts(catalog.get(h.id).obj) for h in resp.results)


@pytest.mark.parametrize("channel", CHANNELS)
def test_each_facet_is_ranked_to_depth(engines, channel):
    params = {"kind": "column", "facets": {"meaning": "city", "values": "Berlin"}}
    shallow = facets_search(engines[channel], depth=1, **params)
    # the best meaning (stores.city) and the best values (customers.city) differ: nothing is in both top 1s
    assert shallow.results == []
    assert any("top 1 of every facet" in w for w in shallow.warnings)
    assert facets_search(engines[channel], depth=2, **params).results[0].id == "jaffle.customers.city"
    with pytest.raises(SearchError, match="depth must be >= 1"):
        facets_search(engines[channel], depth=0, **params)


@pytest.mark.parametrize("channel", CHANNELS)
def test_min_score_cuts_and_there_is_no_cutoff_by_default(engines, channel):
    params = {"kind": "column", "facets": {"meaning": "order total amount"}, "limit": 1000}
    every = facets_search(engines[channel], **params).results
    assert len(every) >= 3
    cut = (every[1].score + every[2].score) / 2
    kept = facets_search(engines[channel], min_score=cut, **params).results
    assert [h.id for h in kept] == [h.id for h in every[:2]] and all(h.score >= cut for h in kept)


@pytest.mark.parametrize("channel", CHANNELS)
def test_datasource_restricts_before_ranking(engines, channel):
    everywhere = ranking(
        engines[channel], "meaning", "unit price list price in dollars", kinds=["column"], depth=1
    )
    assert everywhere.ids() == ["jaffle.products.price"]
    scoped = ranking(
        engines[channel],
        "meaning",
        "unit price list price in dollars",
        kinds=["column"],
        depth=1,
        datasource="supplies",
    )
    assert scoped.ids() == ["supplies.products.price"]  # filtering after a top-1 cut would leave nothing
    allowed = ranking(
        engines[channel], "meaning", "price", depth=5, allow=frozenset({"jaffle.orders.subtotal", "memory:1"})
    )
    assert set(allowed.ids()) <= {"jaffle.orders.subtotal", "memory:1"}
    resp = facets_search(engines[channel], kind="column", facets={"meaning": "price"}, datasource="supplies")
    assert resp.results and all(h.id.startswith("supplies.") for h in resp.results)


@pytest.mark.parametrize("channel", CHANNELS)
def test_a_facet_ranks_the_kinds_that_declare_it(engines, channel):
    catalog = engines[channel].catalog
    formula = ranking(engines[channel], "formula", "sum order total")
    assert formula.ids()[0] == "jaffle.orders.total_revenue"
    assert {catalog.kind_of(c) for c in formula.ids()} <= {"measure", "aggregation"}
    meaning = ranking(engines[channel], "meaning", "revenue", depth=1000)
    assert {catalog.kind_of(c) for c in meaning.ids()} >= {"column", "measure", "memory"}
    assert ranking(engines[channel], "meaning", "   ").ranked == []


@pytest.mark.parametrize("channel", CHANNELS)
def test_memories_by_meaning_and_tags(engines, channel):
    resp = facets_search(
        engines[channel],
        kind="memory",
        facets={"meaning": "tax", "entities": "orders tax paid"},
        limit=3,
        compact=False,
    )
    assert [h.id for h in resp.results][:2] == ["1", "12"] or [h.id for h in resp.results][:2] == ["12", "1"]
    hit = resp.results[0]
    assert hit.kind == "memory" and hit.text.startswith(engines[channel].catalog.memory(hit.id).learning)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"kind": "join", "facets": {"meaning": "x"}}, "kind 'join' has no facets"),
        ({"kind": "column", "facets": {}}, "facets must name at least one facet of column: meaning, values"),
        ({"kind": "column", "facets": {"formula": "x"}}, "facet 'formula' is not a facet of column"),
        ({"kind": "column", "facets": {"meaning": "  "}}, "facet 'meaning' has an empty query"),
        ({"kind": "column", "facets": {"meaning": "x"}, "limit": 0}, "limit must be >= 1; got 0"),
        (
            {"kind": "column", "facets": {"meaning": "x"}, "datasource": "nosuch"},
            "datasource 'nosuch' not found",
        ),
        (
            {"kind": "column", "facets": {"meaning": "x"}, "min_score": float("nan")},
            "min_score must be a finite",
        ),
    ],
)
def test_invalid_params(engines, params, message):
    with pytest.raises(SearchError) as info:
        facets_search(engines["lexical"], **params)
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"kind": "column"}, "missing required field `facets`"),
        ({"kind": "column", "facets": {"meaning": 3}}, "Expected `str`"),
        ({"kind": "column", "facets": {"meaning": "x"}, "colour": 1}, "unknown field `colour`"),
    ],
)
def test_params_are_validated(raw, message):
    with pytest.raises(SearchError, match=re.escape(message)):
        parse_facets_params(raw)


def test_caps_are_warned(engines):
    resp = facets_search(
        engines["lexical"], kind="column", facets={"meaning": "city"}, limit=5000, depth=9000
    )
    assert any("limit 5000 is above the cap" in w for w in resp.warnings)
    assert any("depth 9000 is above the cap" in w for w in resp.warnings)


def test_without_part_vectors_facets_rank_lexically(store):
    engine = live(store, WordsProvider(), parts=False)  # dense channel on, no part worker
    assert engine.dense.parts is None
    resp = facets_search(engine, kind="column", facets={"meaning": "city", "values": "Berlin"})
    assert resp.channel == "lexical" and resp.results[0].id == "jaffle.customers.city"
    assert any("no part vectors" in w for w in resp.warnings)
    engine.close()


def test_lexical_ranking_follows_edits(store):
    engine = Engine(store)
    engine.refresh()
    before = facets_search(engine, kind="column", facets={"values": "Berlin"}, limit=50)
    assert "jaffle.stores.city" not in [h.id for h in before.results]

    def change(cols):
        cols["city"]["sampled_values"] = ["Berlin", "Lyon"]
        cols["city"]["sampled"] = "Berlin, Lyon"

    _edit(store / "models" / "jaffle" / "stores.yaml", change)
    engine.refresh()
    after = facets_search(engine, kind="column", facets={"values": "Berlin"}, limit=50)
    assert "jaffle.stores.city" in [h.id for h in after.results]
    engine.close()


# --------------------------------------------------------------------------- SLayer still reads its store


_SLAYER_READ = r"""
import asyncio, json, sys
from slayer.search.service import SearchService
from slayer.storage.base import resolve_storage

async def main(store, model):
    storage = resolve_storage(store)
    memories, errors = await storage.load_memories()
    rows = await storage.list_embeddings(embedding_model_name=model)
    resp = await SearchService(storage=storage).search(question="revenue by store", max_results=8)
    return {"memories": len(memories), "errors": [str(e) for e in errors],
            "rows": sorted([r.canonical_id, r.entity_kind] for r in rows),
            "hits": [[h.kind, h.id] for h in resp.results]}

print(json.dumps(asyncio.run(main(sys.argv[1], sys.argv[2]))))
"""


def _slayer_read(store, model: str) -> dict:
    python = slayer_oracle.slayer_python()
    env = slayer_oracle.slayer_env()
    env.setdefault("SLAYER_FIXTURE_DIR", str(store.parent))  # the fixture's connection strings name it
    proc = subprocess.run(
        [python, "-c", _SLAYER_READ, str(store), model], capture_output=True, text=True, timeout=300, env=env
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


@pytest.mark.slow
@pytest.mark.skipif(slayer_oracle.slayer_python() is None, reason=slayer_oracle.SKIP_REASON)
def test_slayer_reads_and_searches_a_sqlite_store_after_parts_were_written(tmp_path):
    store = tmp_path / "store.db"
    shutil.copyfile(SQLITE_STORE, store)
    store.chmod(0o644)
    provider = FakeProvider(dim=16)
    before = _slayer_read(store, provider.name)
    engine = live(store, provider)
    parts = engine.dense.parts
    n_parts = len(parts.index)
    assert n_parts == len(expected_parts(engine.catalog)) and parts.store.path != store
    n_rows = len(engine.dense.index)
    engine.close()

    after = _slayer_read(store, provider.name)
    # SLayer validates every row of our model (its search loads them all), finds its own kinds only
    assert len(after["rows"]) == n_rows and all("#" not in cid for cid, _ in after["rows"])
    assert {kind for _, kind in after["rows"]} <= SLAYER_KINDS
    assert after["memories"] == before["memories"] and after["errors"] == before["errors"]
    assert after["hits"] == before["hits"] and after["hits"]
    with sqlite3.connect(store) as conn:
        tables = {n for (n,) in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert PARTS_TABLE not in tables  # the store file holds nothing of ours but rows of SLayer's table


def test_dense_ranking_says_what_is_still_waiting(tmp_path, yaml_catalog):
    from types import SimpleNamespace

    from slayer_lsp.embed.store import MemoryStore

    provider = WordsProvider()
    main = EmbeddingWorker(
        tmp_path, provider, store=MemoryStore(), start=False, parts=PartVectors(MemoryStore())
    )
    parts = main.parts
    assert parts is not None
    texts = {"jaffle.stores.city": "city", "jaffle.customers.city": "city. Home city"}
    parts.index.upsert_many(
        [part_id(c, "meaning") for c in texts],
        ["column#meaning"] * 2,
        np.stack([provider.vector(t) for t in texts.values()]),
    )
    parts.enqueue_many(
        _items("jaffle.orders.status", "column", meaning="status")
    )  # never processed: not started
    got = rank_by_facet(yaml_catalog, SimpleNamespace(dense=main), "meaning", "city", kinds=["column"])
    assert got.channel == "dense" and got.ids() == ["jaffle.stores.city", "jaffle.customers.city"]
    assert any("1 parts still waiting to be embedded" in w for w in got.warnings)
    values = rank_by_facet(yaml_catalog, SimpleNamespace(dense=main), "values", "Berlin", kinds=["column"])
    assert values.channel == "lexical" and any(
        "no part vectors of column#values yet" in w for w in values.warnings
    )


def test_cli_search_facets(store, capsys):
    from slayer_lsp.cli.main import main

    argv = [
        "search-facets",
        "--storage",
        str(store),
        "--kind",
        "column",
        "--facet",
        "meaning=city",
        "--facet",
        "values=Berlin",
        "--no-dense",
    ]
    assert main([*argv, "--format", "json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["channel"] == "lexical" and got["results"][0]["id"] == "jaffle.customers.city"
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "Results (1, lexical):" in text and "jaffle.customers.city" in text and "values=1.0000" in text
    assert (
        main(
            [
                "search-facets",
                "--storage",
                str(store),
                "--kind",
                "column",
                "--facet",
                "colour=red",
                "--no-dense",
            ]
        )
        == 1
    )
    assert "facet 'colour' is not a facet of column" in capsys.readouterr().err
