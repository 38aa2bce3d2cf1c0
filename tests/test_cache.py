"""The on-disk cache: a second start reuses parsed documents and the full-text index, and a broken,
stale or foreign cache is detected and rebuilt, never trusted."""

from __future__ import annotations

import shutil

import msgspec
import pytest

from slayer_lsp.engine import Engine
from slayer_lsp.store import fastyaml
from slayer_lsp.store.cache import StoreCache
from tests.conftest import YAML_STORE

CALLS = [
    {"question": "monthly revenue by store"},
    {"question": "supply cost", "datasource": "supplies"},
    {"entities": ["jaffle.orders.status"], "question": "tax"},
]


@pytest.fixture()
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("SLAYER_LSP_CACHE_DIR", str(tmp_path / "cache"))
    dst = tmp_path / "store"
    shutil.copytree(YAML_STORE, dst)
    return dst


def _answers(engine):
    return [msgspec.to_builtins(engine.search(c)) for c in CALLS]


def _count_parses(monkeypatch):
    calls = []
    real = fastyaml.load
    monkeypatch.setattr(fastyaml, "load", lambda text: calls.append(1) or real(text))
    return calls


def test_second_start_parses_nothing_and_answers_the_same(store, monkeypatch):
    first = Engine(store)
    expected = _answers(first)
    first.close()
    del first
    parses = _count_parses(monkeypatch)
    second = Engine(store)
    assert _answers(second) == expected
    assert parses == []  # every document came from the cache
    manifest = StoreCache.for_location(second.location).load_text_manifest()
    assert manifest is not None and second.state.search.fulltext.path is not None


def test_changed_file_is_reparsed_and_reindexed(store, monkeypatch):
    first = Engine(store)
    first.refresh()
    first.close()
    mem = store / "memories/3.md"
    mem.write_text(mem.read_text().replace("Chicago", "Zebracorn City"))
    parses = _count_parses(monkeypatch)
    engine = Engine(store)
    engine.refresh()
    assert len(parses) == 1
    assert [h.id for h in engine.search({"question": "zebracorn", "ranking": "slayer"}).results] == ["3"]
    assert _answers(engine) == _answers(Engine(store, use_cache=False))


@pytest.mark.parametrize("damage", ["garbage", "truncate", "foreign", "index"])
def test_broken_cache_is_rebuilt(store, damage):
    engine = Engine(store)
    expected = _answers(engine)
    engine.close()
    cache = StoreCache.for_location(engine.location)
    del engine
    if damage == "garbage":
        (cache.root / "docs.msgpack").write_bytes(b"\x00garbage")
        (cache.root / "fulltext.msgpack").write_bytes(b"\xffnot msgpack")
    elif damage == "truncate":
        for name in ("docs.msgpack", "fulltext.msgpack"):
            data = (cache.root / name).read_bytes()
            (cache.root / name).write_bytes(data[: len(data) // 2])
    elif damage == "foreign":  # a manifest written for another store must not be used
        other = StoreCache(cache.location, cache.root)
        other.ident = "yaml:/somewhere/else"
        manifest = cache.load_text_manifest()
        other.save_text_manifest(manifest)
    else:  # the index directory disagrees with its manifest (e.g. killed mid-commit)
        manifest = cache.load_text_manifest()
        for f in (cache.root / manifest.directory).glob("*.idx"):
            f.unlink()
        shutil.rmtree(manifest.directory)
    assert _answers(Engine(store)) == expected


def test_cache_can_be_turned_off(store, monkeypatch, tmp_path):
    monkeypatch.setenv("SLAYER_LSP_CACHE", "off")
    engine = Engine(store)
    engine.refresh()
    engine.close()
    assert not (tmp_path / "cache").exists()


def test_long_lived_engine_goes_live_in_memory_and_leaves_a_snapshot(store, monkeypatch):
    import time

    engine = Engine(store, compact_after_s=0.05)
    assert engine.state.search.fulltext.path is not None  # it starts on the on-disk index
    mem = store / "memories/3.md"
    mem.write_text(mem.read_text().replace("Chicago", "Zebracorn City"))
    engine.refresh([str(mem)])
    deadline = time.monotonic() + 30
    while engine.state.search.fulltext.path is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine.state.search.fulltext.path is None  # after an edit, edits commit in RAM, no fsync
    assert [h.id for h in engine.search({"question": "zebracorn", "ranking": "slayer"}).results] == ["3"]
    engine.close()
    parses = _count_parses(monkeypatch)
    restarted = Engine(store)
    assert [h.id for h in restarted.search({"question": "zebracorn", "ranking": "slayer"}).results] == ["3"]
    assert len(parses) <= 1  # the snapshot plus the one changed file, not a rebuild


# --------------------------------------------------------------------------- rendered texts


def _count_renders(monkeypatch):
    from slayer_lsp.texts import render

    rendered = []
    real = render.render_entity
    monkeypatch.setattr(render, "render_entity", lambda cat, cid: rendered.append(cid) or real(cat, cid))
    return rendered


def _docs(engine):
    return list(engine.state.search.docs.items())


def test_restart_renders_only_what_changed_and_matches_a_cold_start(store, monkeypatch):
    first = Engine(store)
    first.refresh()
    first.close()  # waits for the texts to be written
    model = store / "models/jaffle/orders.yaml"
    model.write_text(model.read_text().replace("status", "order_state"))
    rendered = _count_renders(monkeypatch)
    restarted = Engine(store)
    catalog = restarted.catalog
    changed = {
        cid
        for cid in catalog.searchable_ids()
        if catalog.kind_of(cid) == "datasource" or catalog.get(cid).source.path == str(model)
    }
    assert set(rendered) == changed  # the edited model's entities, and the datasources (listing models)
    cold = Engine(store, use_cache=False)
    assert _docs(restarted) == _docs(cold)
    assert _answers(restarted) == _answers(cold)


def test_a_cold_build_indexes_each_text_as_it_is_rendered(store, monkeypatch):
    """tantivy's indexing thread works on one text while the next is rendered, rather than after all
    are: the first document reaches the index before the last is rendered."""
    from slayer_lsp.search import fulltext
    from slayer_lsp.texts import render

    events: list[str] = []
    real_render, real_add = render.render_entity, fulltext.FullTextIndex._add
    monkeypatch.setattr(
        render, "render_entity", lambda cat, cid: events.append("render") or real_render(cat, cid)
    )
    monkeypatch.setattr(
        fulltext.FullTextIndex, "_add", lambda self, m, doc: events.append("add") or real_add(self, m, doc)
    )
    engine = Engine(store)
    engine.refresh()
    assert events.index("add") < len(events) - 1 - events[::-1].index("render")
    assert _docs(engine) == _docs(Engine(store, use_cache=False))


def test_a_cold_build_that_cannot_write_its_index_keeps_every_text(store, monkeypatch):
    """The on-disk build fails halfway (a full disk): the texts it had not reached are still rendered,
    and the index is built in memory over all of them."""
    from slayer_lsp.search import fulltext

    real_add = fulltext.FullTextIndex._add
    added = []

    def failing_add(self, members, doc):  # noqa: ANN001, ANN202
        if self.path is not None and len(added) == 5:
            raise OSError("No space left on device")
        added.append(doc.canonical)
        return real_add(self, members, doc)

    monkeypatch.setattr(fulltext.FullTextIndex, "_add", failing_add)
    engine = Engine(store)
    engine.refresh()
    assert engine.state.search.fulltext.path is None
    cold = Engine(store, use_cache=False)
    assert _docs(engine) == _docs(cold)
    assert _answers(engine) == _answers(cold)


def _hide_status(store):
    model = store / "models/jaffle/orders.yaml"
    text = model.read_text()
    at = text.index("- name: status")
    end = text.index("hidden: false", at)
    model.write_text(text[:end] + "hidden: true" + text[end + len("hidden: false") :])


def _reword_status_values(store):
    model = store / "models/jaffle/orders.yaml"
    model.write_text(model.read_text().replace("  - returned\n", "  - refunded\n", 1))


EDITS_BETWEEN_RUNS = {
    "a column's sampled values changed": _reword_status_values,
    "a memory reworded": lambda store: (store / "memories/3.md").write_text(
        (store / "memories/3.md").read_text().replace("Chicago", "Zebracorn City")
    ),
    "a column hidden": _hide_status,
    "a model removed": lambda store: (store / "models/jaffle/orders.yaml").unlink(),
    "a memory removed": lambda store: (store / "memories/3.md").unlink(),
}


@pytest.mark.parametrize("edit", list(EDITS_BETWEEN_RUNS), ids=list(EDITS_BETWEEN_RUNS))
def test_texts_taken_back_by_document_match_a_cold_start(store, monkeypatch, edit):
    """The cached texts come back a whole document at a time: whatever changed between two runs, the
    restart holds exactly the texts (and the order) a cold start renders."""
    first = Engine(store)
    first.refresh()
    first.close()
    EDITS_BETWEEN_RUNS[edit](store)
    rendered = _count_renders(monkeypatch)
    restarted = Engine(store)
    searchable = restarted.catalog.searchable_ids()
    assert len(rendered) < len(searchable)  # the unchanged documents came from the cache
    cold = Engine(store, use_cache=False)
    assert _docs(restarted) == _docs(cold)
    assert _answers(restarted) == _answers(cold)


def _lexicon(engine):
    from tests.test_lexicon import contents

    return contents(engine.state.search.lexicon_for(engine.catalog))


def _memory_values(engine):
    search, catalog = engine.state.search, engine.catalog
    pieces, terms = search.pieces_for(catalog), search.memory_terms_for(catalog)
    return {
        mid: (
            pieces.pieces(mid),
            pieces.linked(mid),
            terms.by_memory[mid],
            pieces.rank_about(mem.description),
        )
        for mid, mem in catalog.memories.items()
    }, dict(terms.doc_freq)


def _taken_back(store, monkeypatch, edit, values, module, reader):
    """Run, edit, restart: the restart's ``values`` (checked against a cold start's, as are its
    answers) and what it handed to ``module.reader`` (the per-document work the cache saves)."""
    first = Engine(store)
    values(first)
    first.close()
    EDITS_BETWEEN_RUNS[edit](store)
    seen = []
    real = getattr(module, reader)
    monkeypatch.setattr(module, reader, lambda item: seen.append(item) or real(item))
    restarted = Engine(store)
    got = values(restarted)
    monkeypatch.setattr(module, reader, real)
    cold = Engine(store, use_cache=False)
    assert got == values(cold)
    assert _answers(restarted) == _answers(cold)
    return got, seen


@pytest.mark.parametrize("edit", list(EDITS_BETWEEN_RUNS), ids=list(EDITS_BETWEEN_RUNS))
def test_lexicon_entries_taken_back_by_document_match_a_cold_start(store, monkeypatch, edit):
    """The lexicon's leaves come back a model document at a time: whatever changed between two runs,
    the restart's lexicon is the one a cold start builds, and only changed documents are read."""
    from slayer_lsp.search import lexicon_entries

    got, read = _taken_back(store, monkeypatch, edit, _lexicon, lexicon_entries, "leaf_entry")
    orders = {c for c in got["stems"] if c.startswith("jaffle.orders.")}
    assert {ent.canonical for ent in read} <= orders  # every other model's leaves came from the cache


@pytest.mark.parametrize("edit", list(EDITS_BETWEEN_RUNS), ids=list(EDITS_BETWEEN_RUNS))
def test_memory_values_taken_back_by_document_match_a_cold_start(store, monkeypatch, edit):
    """A memory's pieces, about text and stems come back per memory document: the restart's piece
    index and terms are a cold start's, and only changed memories are cut again."""
    from slayer_lsp.texts import pieces

    _, cut = _taken_back(store, monkeypatch, edit, _memory_values, pieces, "piece_texts")
    assert {mem.id for mem in cut} <= {"3"}  # the only memory an edit touches


@pytest.mark.parametrize("damage", ["not msgpack", "another code", "a piece list that is not one"])
def test_a_damaged_memories_file_is_read_anew(store, damage):
    from slayer_lsp.search import memory_entries

    first = Engine(store)
    expected = _memory_values(first)
    first.close()
    path = StoreCache.for_location(first.location).root / memory_entries.FILE
    saved = msgspec.msgpack.decode(path.read_bytes())
    if damage == "another code":
        saved["code"] = "an older cutter"
    elif damage == "a piece list that is not one":
        saved["memories"]["3"][1] = 7
    path.write_bytes(b"\x00garbage" if damage == "not msgpack" else msgspec.msgpack.encode(saved))
    assert _memory_values(Engine(store)) == expected


@pytest.mark.parametrize(
    "damage",
    ["a number past its table", "rows of the wrong length", "not msgpack", "another code"],
)
def test_a_damaged_lexicon_file_is_read_anew(store, monkeypatch, damage):
    from slayer_lsp.search import lexicon_entries

    first = Engine(store)
    expected = _lexicon(first)
    first.close()
    path = StoreCache.for_location(first.location).root / lexicon_entries.FILE
    saved = msgspec.msgpack.decode(path.read_bytes(), type=lexicon_entries.LexiconFile)
    some = next(m for m in saved.models.values() if m.ids)
    if damage == "a number past its table":
        saved.models["jaffle.orders"] = msgspec.structs.replace(
            some, stems=len(saved.stems).to_bytes(4, "little") * len(some.ids)
        )
    elif damage == "rows of the wrong length":
        saved.models["jaffle.orders"] = msgspec.structs.replace(some, terms=some.terms[:-4])
    elif damage == "another code":
        saved.code = "an older lexicon"
    path.write_bytes(b"\x00garbage" if damage == "not msgpack" else msgspec.msgpack.encode(saved))
    restarted = Engine(store)
    assert _lexicon(restarted) == expected


def _sync_calls(monkeypatch):
    from slayer_lsp.search import fulltext

    calls = []
    real = fulltext.FullTextIndex.sync
    monkeypatch.setattr(
        fulltext.FullTextIndex,
        "sync",
        lambda self, docs, known=None, **kw: (
            calls.append(kw.get("indexed_except")) or real(self, docs, known, **kw)
        ),
    )
    return calls


@pytest.mark.parametrize("edit", [None, *EDITS_BETWEEN_RUNS], ids=["unchanged", *EDITS_BETWEEN_RUNS])
def test_a_restart_compares_only_the_texts_it_rendered_when_the_cache_matches_the_index(
    store, monkeypatch, edit
):
    """The texts file records the index commit that holds its texts: while the manifest names that
    commit, a restart compares only what it rendered afresh, and still answers as a cold start."""
    first = Engine(store)
    first.refresh()
    first.close()
    if edit is not None:
        EDITS_BETWEEN_RUNS[edit](store)
    calls = _sync_calls(monkeypatch)
    restarted = Engine(store)
    restarted.refresh()
    assert len(calls) == 1 and calls[0] is not None
    if edit is None:  # only the datasources (their texts list models) were rendered, and compared
        assert {restarted.catalog.kind_of(c) for c in calls[0]} == {"datasource"}
    cold = Engine(store, use_cache=False)
    assert _docs(restarted) == _docs(cold)
    assert _answers(restarted) == _answers(cold)


def test_a_texts_file_of_another_index_commit_is_compared_in_full(store, monkeypatch):
    from slayer_lsp.search import rendered as rendered_cache

    first = Engine(store)
    first.refresh()
    first.close()
    cache = StoreCache.for_location(first.location)
    value = cache.read_file(rendered_cache.FILE, rendered_cache.RenderedFile)
    value.opstamp += 1  # as if the index had been committed to since
    cache.write_file(rendered_cache.FILE, value)
    calls = _sync_calls(monkeypatch)
    restarted = Engine(store)
    restarted.refresh()
    assert calls == [None]
    assert _answers(restarted) == _answers(Engine(store, use_cache=False))


def test_texts_of_another_renderer_are_not_reused(store, monkeypatch):
    from slayer_lsp.search import rendered as rendered_cache

    first = Engine(store)
    expected = _docs(first)
    first.close()
    monkeypatch.setattr(rendered_cache, "renderer_stamp", lambda: "an older renderer")
    rendered = _count_renders(monkeypatch)
    restarted = Engine(store)
    assert _docs(restarted) == expected
    assert set(rendered) == set(restarted.catalog.searchable_ids())


def test_an_unchanged_restart_rewrites_no_cache_file(store):
    first = Engine(store)
    _lexicon(first)
    _memory_values(first)
    first.close()
    root = StoreCache.for_location(first.location).root
    files = ["docs.msgpack", "fulltext.msgpack", "rendered.msgpack", "lexicon.msgpack", "memories.msgpack"]
    before = {name: (root / name).stat().st_mtime_ns for name in files}
    second = Engine(store)
    _lexicon(second)
    _memory_values(second)
    second.close()
    assert {name: (root / name).stat().st_mtime_ns for name in files} == before


def test_sqlite_restart_decodes_only_the_changed_row(tmp_path, monkeypatch):
    import json
    import sqlite3

    from slayer_lsp.store.reader import SqliteReader, StoreReader
    from tests.conftest import SQLITE_STORE

    monkeypatch.setenv("SLAYER_LSP_CACHE_DIR", str(tmp_path / "cache"))
    db = tmp_path / "store.db"
    shutil.copy(SQLITE_STORE, db)
    first = Engine(db)
    first.refresh()
    first.close()
    with sqlite3.connect(db) as conn:
        key, data = conn.execute("SELECT id, data FROM memories ORDER BY id LIMIT 1").fetchone()
        mem = json.loads(data)
        mem["learning"] += " Zebracorn."
        conn.execute("UPDATE memories SET data = ? WHERE id = ?", (json.dumps(mem), key))
    parsed = []
    real = SqliteReader._parse
    monkeypatch.setattr(
        SqliteReader,
        "_parse",
        staticmethod(lambda table, row, *a: parsed.append(row) or real(table, row, *a)),
    )
    restarted = Engine(db)
    restarted.refresh()
    assert parsed == [key]  # every other row came from the cache
    assert restarted.catalog.docs == StoreReader(db).read().docs
    assert _answers(restarted) == _answers(Engine(db, use_cache=False))


def _edit_until_compacted(engine, path, old, new):
    """Replace ``old`` by ``new`` in a store file, refresh, and wait for the compaction it calls for."""
    import time

    path.write_text(path.read_text().replace(old, new))
    engine.refresh([str(path)])
    deadline = time.monotonic() + 10
    while engine.stats.compactions == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert engine.stats.compactions >= 1


def _long_lived_after_a_first_run(store):
    """A daemon's engine on a store whose cache a first run (closed since) has written."""
    import gc

    first = Engine(store)
    first.refresh()
    first.close()
    del first
    gc.collect()
    return Engine(store, compact_after_s=0.05)


def test_a_long_lived_engine_keeps_a_warehouse_index_on_disk(store, monkeypatch):
    """Moving the live index into memory means rebuilding it: done for a small store, never for a
    large one alone (27 s and 700 MiB at 10,000 models); its edits commit to the on-disk index."""
    import gc
    import time

    from slayer_lsp.search import indexes

    monkeypatch.setattr(indexes, "COMPACT_EVERY_CHANGE_UP_TO", 10)  # the example store counts as large
    monkeypatch.setattr(indexes, "COMPACT_DIVISOR", 1)  # ... and one edit is not worth a rebuild
    engine = _long_lived_after_a_first_run(store)
    expected = _answers(engine)
    assert not engine.state.search.needs_compaction and engine.state.search.fulltext.path is not None
    mem = store / "memories/3.md"
    mem.write_text(mem.read_text().replace("Chicago", "Zebracorn City"))
    engine.refresh([str(mem)])
    time.sleep(0.3)  # a compaction, if one were due, would have run
    assert engine.state.search.fulltext.path is not None  # still the on-disk index
    assert [h.id for h in engine.search({"question": "zebracorn", "ranking": "slayer"}).results] == ["3"]
    assert _answers(engine) != expected
    engine.close()
    del engine
    gc.collect()
    parses = _count_parses(monkeypatch)
    # a small store again: a one-shot engine rebuilds an index whose replaced documents still weigh
    # in its BM25, which it knows from the manifest, and answers exactly as a cold start
    monkeypatch.setattr(indexes, "COMPACT_EVERY_CHANGE_UP_TO", 50_000)
    restarted = Engine(store)
    assert [h.id for h in restarted.search({"question": "zebracorn", "ranking": "slayer"}).results] == ["3"]
    assert parses == []  # the edit was recorded in the cache when the engine closed
    assert _answers(restarted) == _answers(Engine(store, use_cache=False))


def test_a_small_store_moves_its_index_into_memory_at_the_first_edit_not_at_start(store):
    """A restart reopens the on-disk index and serves from it: rebuilding it into memory right away
    (4 s at 1,000 models) took the interpreter lock from the first searches. The first edit moves it."""
    import time

    engine = _long_lived_after_a_first_run(store)
    expected = _answers(engine)
    time.sleep(0.3)  # a compaction, if one were due, would have run
    assert engine.stats.compactions == 0 and engine.state.search.fulltext.path is not None
    mem = store / "memories/3.md"
    _edit_until_compacted(engine, mem, "Chicago", "Zebracorn City")
    assert engine.state.search.fulltext.path is None  # in memory now
    mem.write_text(mem.read_text().replace("Zebracorn City", "Chicago"))
    engine.refresh([str(mem)])
    deadline = time.monotonic() + 10
    while engine.state.search.needs_compaction and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _answers(engine) == expected  # the same documents again, compacted: a cold start's answers
    engine.close()


SCOPED = [
    {"question": question, "datasource": ds, "ranking": ranking}
    for question in ("supply cost", "orders by status", "customer lifetime value")
    for ds in ("jaffle", "supplies")
    for ranking in ("slayer", "hybrid")
]


def _scoped_answers(engine):
    return [msgspec.to_builtins(engine.search(c)) for c in SCOPED]


def _datasource_dirs(engine):
    return {ds: view.path for ds, view in engine.state.search.by_datasource.items()}


def _warmed(engine):
    """Every datasource indexed apart, as a daemon's warm-up does after its start."""
    state = engine.state
    state.search.warm_datasources(state.catalog)
    return engine


def test_a_restart_reopens_each_datasource_index_and_answers_as_a_cold_start(store, monkeypatch):
    """A datasource's own index (tens of ms at 1,000 models, seconds at 10,000) is built once and
    kept in the cache: after a restart the first question scoped to it reopens it."""
    from slayer_lsp.search import fulltext

    first = _warmed(Engine(store))
    dirs = _datasource_dirs(first)
    assert set(dirs) == {"jaffle", "supplies"} and all(p is not None and p.is_dir() for p in dirs.values())
    first.close()
    del first
    built = []
    real = fulltext.FullTextIndex._add
    monkeypatch.setattr(fulltext.FullTextIndex, "_add", lambda self, *a: built.append(1) or real(self, *a))
    restarted = Engine(store)
    answers = _scoped_answers(restarted)
    assert _datasource_dirs(restarted) == dirs  # the same directories, reopened
    assert built == []  # nothing indexed again
    monkeypatch.undo()
    assert answers == _scoped_answers(Engine(store, use_cache=False))


def test_a_restart_after_an_edit_reindexes_only_the_edited_datasource(store):
    first = _warmed(Engine(store))
    dirs = _datasource_dirs(first)
    first.close()
    del first
    model = store / "models/supplies/supplies.yaml"
    model.write_text(model.read_text().replace("paper cup", "zebracorn cup"))
    restarted = _warmed(Engine(store))
    now = _datasource_dirs(restarted)
    assert now["jaffle"] == dirs["jaffle"]
    # a small store's replaced document still weighs in BM25: that index is rebuilt, not patched
    assert now["supplies"] != dirs["supplies"] and not dirs["supplies"].exists()
    assert _scoped_answers(restarted) == _scoped_answers(Engine(store, use_cache=False))


def test_a_compaction_rebuilds_only_the_datasource_indexes_an_edit_touched(store):

    engine = _warmed(Engine(store, compact_after_s=0.05))
    before = engine.state.search.by_datasource
    _edit_until_compacted(engine, store / "models/supplies/supplies.yaml", "paper cup", "zebracorn cup")
    after = engine.state.search.by_datasource
    assert set(after) == {"jaffle", "supplies"}
    assert after["jaffle"] is before["jaffle"]  # untouched: carried on as it was
    assert after["supplies"] is not before["supplies"] and after["supplies"].deletions == 0
    assert _scoped_answers(engine) == _scoped_answers(Engine(store, use_cache=False))
    carried = after["jaffle"]
    orders = store / "models/jaffle/orders.yaml"
    orders.write_text(
        orders.read_text().replace("description: Customer orders", "description: Quagga orders")
    )
    engine.refresh([str(orders)])  # the carried writer takes the next edit
    assert engine.state.search.by_datasource["jaffle"].index is carried.index
    hits = engine.search({"question": "quagga", "datasource": "jaffle", "ranking": "slayer"}).results
    assert [h.id for h in hits][:1] == ["jaffle.orders"]
    engine.close()


def test_the_index_of_a_removed_datasource_leaves_the_cache(store):
    first = _warmed(Engine(store))
    gone = _datasource_dirs(first)["supplies"]
    first.close()
    del first
    shutil.rmtree(store / "models/supplies")
    (store / "datasources/supplies.yaml").unlink()
    restarted = _warmed(Engine(store))
    assert set(_datasource_dirs(restarted)) == {"jaffle"}
    assert not gone.exists()
    root = StoreCache.for_location(restarted.location).root
    assert len(list(root.glob("datasource-*.msgpack"))) == 1


def test_a_cache_file_of_an_older_format_is_rebuilt_without_a_warning(store, caplog):
    """An upgrade changes the layout of a cache file: the start rebuilds it and says so quietly; only
    a file that is really damaged is reported as broken."""
    import logging

    first = Engine(store)
    expected = _answers(first)
    first.close()
    cache = StoreCache.for_location(first.location)
    older = {
        "format": 2,
        "store": cache.ident,
        "directory": "x",
        "opstamp": 1,
        "members": {"a": ["e", 0, "d"]},
    }
    (cache.root / "fulltext.msgpack").write_bytes(msgspec.msgpack.encode(older))
    with caplog.at_level(logging.INFO, logger="slayer_lsp.store.cache"):
        assert _answers(Engine(store)) == expected
    said = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "slayer_lsp.store.cache"]
    assert any(level == logging.INFO and "another format" in text for level, text in said), said
    assert not any(level >= logging.WARNING for level, _ in said), said


def test_writes_of_one_cache_file_land_in_the_order_they_were_asked_for(store):
    """A manifest written in the background (a start's) and a later one written at once (a
    compaction's): the later is the one left on disk, however slow the first was to prepare."""
    import threading

    from slayer_lsp.store.cache import DocCacheFile
    from slayer_lsp.store.locate import locate

    cache = StoreCache.for_location(locate(store))
    release = threading.Event()

    def slow_first() -> DocCacheFile:
        release.wait(10)
        return DocCacheFile(0, "", [])

    cache.write_in_background("order.msgpack", slow_first)
    later = DocCacheFile(0, "", [])
    threading.Timer(0.2, release.set).start()
    second = threading.Thread(target=cache.write_file, args=("order.msgpack", later))
    second.start()
    cache.write_in_background("order.msgpack", lambda: DocCacheFile(0, "", []))  # a third, queued
    second.join()
    cache.flush()
    assert cache.read_file("order.msgpack", DocCacheFile) is not None
    # the order itself: each write waits for the one asked for before it
    writes: list[str] = []
    real = StoreCache._write

    def record(self, name, value):  # noqa: ANN001, ANN202
        writes.append(value.store)
        return real(self, name, value)

    release.clear()
    StoreCache._write = record  # type: ignore[method-assign]
    try:
        cache.write_in_background("order.msgpack", lambda: release.wait(10) and DocCacheFile(0, "first", []))
        cache.write_in_background("order.msgpack", lambda: DocCacheFile(0, "second", []))
        threading.Timer(0.2, release.set).start()
        cache.write_file("order.msgpack", DocCacheFile(0, "third", []))
        cache.flush()
    finally:
        StoreCache._write = real  # type: ignore[method-assign]
    assert writes == ["first", "second", "third"]
