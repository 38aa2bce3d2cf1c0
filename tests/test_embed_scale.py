"""Embedding at scale: what is embedded first, identical texts embedded once, the worker stepping
back for search, and ``slayer-lsp embed``'s progress, interruption and resumption (no timings)."""

from __future__ import annotations

import _thread
import io
import shutil
import sqlite3
import sys
import threading
import time
from dataclasses import replace

import numpy as np
import pytest

from slayer_lsp.catalog import load_catalog
from slayer_lsp.cli.embed_command import INTERRUPTED, ProgressView, duration, run_embed
from slayer_lsp.embed.lane import PART_LANE, LaneConfig
from slayer_lsp.embed.parts import PARTS_TABLE
from slayer_lsp.embed.priority import KIND_RANK, RankedItems, RankedParts, WorkQueue, priority
from slayer_lsp.embed.providers import FakeProvider
from slayer_lsp.embed.store import MemoryStore, VectorStore
from slayer_lsp.embed.worker import EmbeddingWorker, PartVectors, WorkerConfig
from slayer_lsp.engine import Engine
from slayer_lsp.texts.parts import PartItems
from slayer_lsp.texts.statements import CatalogItems, EmbedItem
from tests.conftest import YAML_STORE

WAIT = 120.0
FAST = LaneConfig(backoff=0.001, max_backoff=0.01)


@pytest.fixture
def store(tmp_path):
    dst = tmp_path / "store"
    shutil.copytree(YAML_STORE, dst)
    return dst


# --------------------------------------------------------------------------- what goes first


def test_kinds_are_ranked_memories_first_parts_last():
    order = [
        "memory",
        "datasource",
        "model",
        "measure",
        "column",
        "memory#piece",
        "model#meaning",
        "column#values",
    ]
    ranks = [priority(kind) for kind in order]
    assert ranks == sorted(ranks) and ranks[0] == 0
    assert priority("measure") == priority("aggregation") and priority("column#meaning") == priority(
        "column#values"
    )
    assert priority("some-new-kind") > priority("column") and priority("some-new-kind") < priority(
        "memory#piece"
    )
    assert set(KIND_RANK) >= {"memory", "datasource", "model", "measure", "aggregation", "column"}


def test_work_queue_takes_the_highest_tier_first_and_replaces_in_place():
    q = WorkQueue()
    for cid, kind in [
        ("ds.m.a", "column"),
        ("ds.m", "model"),
        ("ds.m.a#values", "column#values"),
        ("memory:1", "memory"),
        ("ds.m.b", "column"),
    ]:
        q.put(EmbedItem(cid, kind, cid))
    q.put(EmbedItem("ds.m.a", "column", "newer text"))  # replaces the queued text, keeps its place
    assert len(q) == 5 and "ds.m" in q and "nope" not in q
    first = q.take(3)
    assert [i.canonical_id for i in first] == ["memory:1", "ds.m", "ds.m.a"] and first[2].text == "newer text"
    assert q.pop("ds.m.b") is not None and q.pop("ds.m.b") is None
    assert [i.canonical_id for i in q.take(10)] == ["ds.m.a#values"] and len(q) == 0


def test_ranked_items_walk_the_catalog_by_rank_and_cover_it_exactly():
    cat = load_catalog(YAML_STORE)
    items = list(RankedItems(cat))
    assert len(items) == len(RankedItems(cat)) == len(CatalogItems(cat))
    assert {i.canonical_id for i in items} == {i.canonical_id for i in CatalogItems(cat)}
    ranks = [KIND_RANK[i.kind] for i in items]
    assert ranks == sorted(ranks) and items[0].kind == "memory" and items[-1].kind == "column"
    parts = list(RankedParts(cat))
    assert len(parts) == len(RankedParts(cat)) == len(PartItems(cat))
    assert sorted(p.canonical_id for p in parts) == sorted(p.canonical_id for p in PartItems(cat))
    owners = [KIND_RANK[p.kind.partition("#")[0]] for p in parts]
    assert owners == sorted(owners) and parts[0].kind.startswith("memory#")


def test_a_fresh_store_gets_memories_and_models_before_columns(store):
    """The order vectors land in on a fresh store: every memory, datasource, model and measure
    before the first column, and every entity before the first part."""

    class Recording(FakeProvider):
        def __init__(self):
            super().__init__(dim=8)
            self.kinds: list[str] = []
            self.by_text: dict[str, str] = {}

        def embed(self, texts):
            self.kinds.extend(self.by_text[t] for t in texts)
            return super().embed(texts)

    provider = Recording()
    cat = load_catalog(store)
    for item in [*CatalogItems(cat), *PartItems(cat)]:  # a text shared by kinds is embedded for the first
        known = provider.by_text.get(item.text)
        if known is None or priority(item.kind) < priority(known):
            provider.by_text[item.text] = item.kind
    config = WorkerConfig(
        entities=replace(FAST, batch_size=4, window=16, page=20),
        parts=replace(PART_LANE, batch_size=4, window=16, page=20),
        nice=0,
    )
    engine = Engine(store, dense="live", embedding_provider=provider, embed_config=config)
    try:
        engine.refresh()
        assert engine.dense is not None and engine.dense.parts is not None
        assert engine.dense.wait_idle(WAIT) and engine.dense.parts.wait_idle(WAIT)
    finally:
        engine.close()
    ranks = [priority(kind) for kind in provider.kinds]
    assert ranks == sorted(ranks)  # never a less useful text before a more useful one
    first_column = provider.kinds.index("column")
    assert {"memory", "datasource", "model", "measure"} <= set(provider.kinds[:first_column])


# --------------------------------------------------------------------------- identical texts once


def test_identical_texts_are_embedded_once_across_windows_and_lanes(tmp_path):
    provider = FakeProvider(dim=8)
    with EmbeddingWorker(
        tmp_path,
        provider,
        store=MemoryStore(),
        parts=PartVectors(MemoryStore()),
        config=WorkerConfig(
            entities=replace(FAST, window=4, batch_size=2),
            parts=replace(PART_LANE, window=4, batch_size=2),
            nice=0,
        ),
    ) as w:
        w.enqueue_many(EmbedItem(f"ds.m{i}.id", "column", "Name is id. Type is INT.") for i in range(10))
        w.enqueue_many([EmbedItem("ds.m0.amount", "column", "Name is amount.")])
        assert w.wait_idle(WAIT)
        texts = [t for batch in provider.batches for t in batch]
        assert sorted(texts) == ["Name is amount.", "Name is id. Type is INT."]  # windows of 4: still once
        st = w.status()
        assert (st.rows, st.embedded, st.reused) == (11, 2, 9)
        assert np.allclose(w.index.vector("ds.m7.id"), provider.vector("Name is id. Type is INT."))
        # a part whose text some entity (or another part) already has takes that vector
        assert w.parts is not None
        w.parts.enqueue_many(
            [
                EmbedItem("ds.m3.id#meaning", "column#meaning", "Name is amount."),
                EmbedItem("ds.m4.id#meaning", "column#meaning", "id"),
                EmbedItem("ds.m5.id#meaning", "column#meaning", "id"),
            ]
        )
        assert w.parts.wait_idle(WAIT)
        assert [t for batch in provider.batches for t in batch][len(texts) :] == ["id"]
        ps = w.status().parts
        assert ps is not None and (ps.rows, ps.embedded, ps.reused) == (3, 1, 2)


def test_a_failing_text_fails_every_item_that_shares_it(tmp_path):
    provider = FakeProvider(dim=8, fail_texts=["bad"])
    with EmbeddingWorker(
        tmp_path, provider, store=MemoryStore(), config=WorkerConfig(entities=FAST, nice=0)
    ) as w:
        w.enqueue_many(
            [
                EmbedItem("a.b.c", "column", "bad"),
                EmbedItem("a.b.d", "column", "bad"),
                EmbedItem("a.b.e", "column", "good"),
            ]
        )
        assert w.wait_idle(WAIT)
        assert sorted(w.failures()) == ["a.b.c", "a.b.d"] and w.index.ids() == ["a.b.e"]
        assert w.status().failed == 2


# --------------------------------------------------------------------------- stepping back


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread niceness is Linux's")
def test_the_worker_thread_runs_nicer_than_the_process(tmp_path):
    import os

    seen: list[int] = []

    class Probe(FakeProvider):
        def embed(self, texts):
            seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
            return super().embed(texts)

    base = os.getpriority(os.PRIO_PROCESS, 0)
    with EmbeddingWorker(tmp_path, Probe(8), store=MemoryStore(), config=WorkerConfig(nice=5)) as w:
        w.enqueue("a.b.c", "column", "text")
        assert w.wait_idle(WAIT)
    assert seen and seen[0] == min(19, base + 5)
    assert os.getpriority(os.PRIO_PROCESS, 0) == base  # the process (and the caller's thread) untouched
    with EmbeddingWorker(tmp_path, Probe(8), store=MemoryStore(), config=WorkerConfig(nice=0)) as w:
        w.enqueue("a.b.c", "column", "text")
        assert w.wait_idle(WAIT)
    assert seen[-1] == base


def test_a_pause_between_calls_leaves_results_unchanged_and_stops_promptly(tmp_path):
    provider = FakeProvider(dim=8)
    config = WorkerConfig(entities=replace(FAST, batch_size=1, pause=0.01), nice=0)
    with EmbeddingWorker(tmp_path, provider, store=MemoryStore(), config=config) as w:
        w.enqueue_many(EmbedItem(f"a.b.c{i}", "column", f"text {i}") for i in range(5))
        assert w.wait_idle(WAIT) and len(w.index) == 5 and all(len(b) == 1 for b in provider.batches)
    slow = WorkerConfig(entities=replace(FAST, batch_size=1, pause=3600), nice=0)
    w = EmbeddingWorker(tmp_path, FakeProvider(dim=8), store=MemoryStore(), config=slow)
    w.enqueue_many(EmbedItem(f"a.b.c{i}", "column", f"text {i}") for i in range(5))
    w.close(timeout=WAIT)  # a pause never holds up a stop
    assert w._thread is not None and not w._thread.is_alive()


# --------------------------------------------------------------------------- slayer-lsp embed


class _Stream(io.StringIO):
    def __init__(self, tty: bool = False, on_write=None):
        super().__init__()
        self.tty = tty
        self.on_write = on_write

    def isatty(self) -> bool:
        return self.tty

    def write(self, s: str) -> int:
        if self.on_write is not None:
            self.on_write(s)
        return super().write(s)


def test_progress_view_draws_a_bar_on_a_terminal_and_lines_elsewhere():
    tty = _Stream(tty=True)
    view = ProgressView(tty, {"entities": 100, "parts": 300}, tty=True)
    view.update({"entities": 0}, 0.0)
    view.update({"entities": 100, "parts": 100}, 10.0)
    view.end()
    text = tty.getvalue()
    assert text.count("\r") == 2 and text.endswith("\n") and "\x1b[K" in text
    assert "[######" in text and "50%" in text and "entities 100/100, parts 100/300" in text
    assert "20 texts/s" in text and "ETA 10s" in text
    plain = _Stream()
    view = ProgressView(plain, {"entities": 10}, every=5.0)
    view.update({"entities": 1}, 0.0)
    view.update({"entities": 2}, 1.0)  # too soon for another line
    view.update({"entities": 10}, 6.0)
    lines = plain.getvalue().splitlines()
    assert (
        len(lines) == 2 and "\r" not in plain.getvalue() and lines[-1].startswith("embedding: entities 10/10")
    )
    assert lines[-1].endswith("done")
    assert (duration(42), duration(432), duration(11100)) == ("42s", "7m12s", "3h05m")


def _stored(store) -> set[str]:
    with sqlite3.connect(store / "embeddings.db") as conn:
        return {c for (c,) in conn.execute("SELECT canonical_id FROM embeddings")}


def _engine(store, provider) -> Engine:
    config = WorkerConfig(
        entities=replace(FAST, batch_size=8, window=16), parts=replace(PART_LANE, batch_size=8), nice=0
    )
    engine = Engine(store, dense="live", embedding_provider=provider, embed_config=config)
    engine.refresh()
    return engine


def test_embed_command_stops_on_ctrl_c_keeps_its_vectors_and_resumes(store):
    drawing, noticed = threading.Event(), threading.Event()

    class CtrlC(FakeProvider):
        """Presses Ctrl-C during its third call (once the command draws its progress), and finishes
        that call once the command noticed."""

        def embed(self, texts):
            assert drawing.wait(WAIT)
            if self.calls == 2:
                _thread.interrupt_main()
                assert noticed.wait(WAIT)
            return super().embed(texts)

    def seen(text: str) -> None:
        drawing.set()
        if "interrupted" in text:
            noticed.set()

    first = CtrlC(dim=8)
    out, err = io.StringIO(), _Stream(on_write=seen)
    assert run_embed(_engine(store, first), out, err) == INTERRUPTED
    assert "interrupted: finishing the batch in flight" in err.getvalue()
    assert "embedded now" in out.getvalue()
    kept = _stored(store)
    made = {t for batch in first.batches for t in batch}
    total = {i.canonical_id for i in CatalogItems(load_catalog(store))}
    assert kept and kept < total  # the calls that finished (the third too) are in the table, not all

    second = FakeProvider(dim=8)
    out = io.StringIO()
    assert run_embed(_engine(store, second), out, _Stream()) == 0
    assert _stored(store) == total
    again = [t for batch in second.batches for t in batch]
    assert not made & set(again)  # nothing made by the first run is embedded again
    texts = {i.canonical_id: i.text for i in CatalogItems(load_catalog(store))}
    assert {texts[c] for c in total - kept} <= set(again)  # ...and whatever it had not made is
    assert out.getvalue().startswith(f"fake/hash-8: {len(total)} rows")
    with sqlite3.connect(VectorStore.for_store(store).path) as conn:
        assert PARTS_TABLE not in {n for (n,) in conn.execute("SELECT name FROM sqlite_master")}


def test_embed_command_draws_progress_and_reports_the_parts(store):
    err = _Stream(tty=True)
    out = io.StringIO()
    assert run_embed(_engine(store, FakeProvider(dim=8)), out, err) == 0
    n = len(load_catalog(store).searchable_ids())
    assert f"entities {n}/{n}" in err.getvalue() and "100%" in err.getvalue() and "texts/s" in err.getvalue()
    assert "part vectors (facets):" in out.getvalue()


# --------------------------------------------------------------------------- searches first


def test_the_worker_waits_before_each_batch_while_the_hook_holds_it(tmp_path):
    """The engine hands the worker its wait for a pause in the searches: no batch starts while a
    search runs (a batch's Python steps share the interpreter lock with it)."""
    gate = threading.Event()
    waits: list[float] = []

    def before_job() -> None:
        waits.append(time.monotonic())
        gate.wait(5.0)

    provider = FakeProvider(dim=8)
    with EmbeddingWorker(
        tmp_path,
        provider,
        store=MemoryStore(),
        config=WorkerConfig(entities=replace(FAST, window=2, batch_size=2), nice=0),
        before_job=before_job,
    ) as w:
        w.enqueue_many(EmbedItem(f"ds.m.c{i}", "column", f"text {i}") for i in range(6))
        time.sleep(0.3)
        assert waits and not provider.batches  # held at the first batch
        gate.set()
        assert w.wait_idle(WAIT)
        assert sorted(t for batch in provider.batches for t in batch) == [f"text {i}" for i in range(6)]
        assert len(waits) >= 3  # asked before every batch of two
