"""Channel 3 inside search: the worker embeds in the background, search never waits for it, ranks
what is embedded (restricted before ranking), and says what is missing."""

from __future__ import annotations

import shutil

import pytest

from slayer_lsp.embed.providers import FakeProvider, TransientEmbeddingError
from slayer_lsp.engine import Engine
from tests.conftest import YAML_STORE


@pytest.fixture()
def store(tmp_path):
    dst = tmp_path / "store"
    shutil.copytree(YAML_STORE, dst)
    return dst


def _engine(store, provider, **kw):
    engine = Engine(store, dense="live", embedding_provider=provider, **kw)
    engine.refresh()
    return engine


def test_dense_channel_adds_a_ranking(store):
    provider = FakeProvider(dim=32)
    engine = _engine(store, provider)
    assert engine.dense.wait_idle(timeout=60)
    status = engine.dense.status()
    assert status.rows == len(engine.catalog.searchable_ids()) and status.pending == 0
    lexical = Engine(store).search({"question": "zzqx qqvv"})
    assert lexical.results == []
    dense = engine.search({"question": "zzqx qqvv"})
    assert dense.results and dense.warnings == []  # the fake's vectors rank everything by cosine
    # vectors were written to SLayer's table beside the store
    from slayer_lsp.embed.store import VectorStore

    assert VectorStore.for_store(engine.location).count(provider.name) == status.rows
    engine.close()


def test_datasource_and_cypher_restrict_before_ranking(store):
    engine = _engine(store, FakeProvider(dim=32))
    assert engine.dense.wait_idle(timeout=60)
    resp = engine.search({"question": "zzqx", "datasource": "supplies", "max_results": 100})
    assert resp.results
    for hit in resp.results:
        if hit.kind != "memory":
            assert hit.id == "supplies" or hit.id.startswith("supplies.")
        else:
            mem = engine.catalog.memory(hit.id)
            assert any(t == "supplies" or t.startswith("supplies.") for t in mem.entities)
    only_memories = engine.search(
        {"question": "zzqx", "max_results": 100, "cypher_filter": "MATCH (v:Memory) RETURN v.id AS id"}
    )
    assert only_memories.results and {h.kind for h in only_memories.results} == {"memory"}
    engine.close()


def test_search_never_waits_and_says_what_is_pending(store):
    provider = FakeProvider(dim=32, delay=0.5)
    engine = _engine(store, provider)
    resp = engine.search({"question": "revenue"})
    assert resp.results  # the lexical channels answer at once
    assert any("waiting to be embedded" in w or "loading" in w for w in resp.warnings)
    engine.close()


def test_provider_failures_are_warnings_not_errors(store):
    provider = FakeProvider(dim=32)
    provider.fail(10_000, TransientEmbeddingError("rate limited"))
    engine = _engine(store, provider)
    resp = engine.search({"question": "revenue"})
    assert resp.results
    engine.close()


def test_a_change_is_re_embedded(store):
    provider = FakeProvider(dim=32)
    engine = _engine(store, provider)
    assert engine.dense.wait_idle(timeout=60)
    before = engine.dense.status().rows
    (store / "memories/70.md").write_text("---\nentities:\n- jaffle.orders\nversion: 4\n---\nA new memory.")
    (store / "memories/1.md").unlink()
    engine.refresh()
    assert engine.dense.wait_idle(timeout=60)
    index = engine.dense.index
    assert "memory:70" in index and "memory:1" not in index
    assert engine.dense.status().rows == before
    engine.close()
