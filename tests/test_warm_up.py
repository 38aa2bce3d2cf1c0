"""The warm-up after start (each datasource's full-text index) steps aside while searches run: it
shares the interpreter lock with them, and a search run beside it took twice its time."""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

import pytest

from slayer_lsp.engine import Engine, SearchesInFlight
from tests.conftest import YAML_STORE


@pytest.fixture()
def engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("SLAYER_LSP_CACHE", "off")
    shutil.copytree(YAML_STORE, tmp_path / "store")
    eng = Engine(tmp_path / "store")
    eng.refresh()
    yield eng
    eng.close()


def test_each_datasource_build_waits_for_its_turn_and_skips_what_a_search_built(engine):
    search, catalog = engine.state.search, engine.catalog
    datasources = sorted(catalog.datasources)
    assert len(datasources) >= 2
    calls: list[int] = []

    def before_each() -> None:
        calls.append(len(calls))
        if len(calls) == 1:  # a search scoped to the last datasource builds its index meanwhile
            search.fulltext_for(catalog, datasources[-1])

    built = search.warm_datasources(catalog, before_each=before_each)
    assert built == len(datasources) - 1
    assert len(calls) == len(datasources) - 1  # asked before each build; the one built meanwhile skipped
    assert search.warm_datasources(catalog, before_each=before_each) == 0
    assert len(calls) == len(datasources) - 1  # nothing left to build: nothing to wait for


def test_the_wait_lasts_while_a_search_runs_and_no_longer_than_its_limit():
    flight = SearchesInFlight()
    t0 = time.monotonic()
    flight.wait_idle()
    assert time.monotonic() - t0 < 0.1  # idle: no wait

    flight.__enter__()
    threading.Timer(0.3, flight.__exit__).start()
    t0 = time.monotonic()
    flight.wait_idle(limit_s=5.0)
    waited = time.monotonic() - t0
    assert 0.25 <= waited < 2.0, waited

    flight.__enter__()  # a search that never ends does not stop the warm-up for ever
    t0 = time.monotonic()
    flight.wait_idle(limit_s=0.2)
    assert 0.15 <= time.monotonic() - t0 < 1.0


RANKED_REQUESTS = {
    "search": ("slayer_lsp.search.pipeline", "search", {"question": "customers"}),
    "search_facets": (
        "slayer_lsp.search.facet_ranking",
        "search_facets",
        {"facets": {"meaning": "customer"}, "kind": "column"},
    ),
}


@pytest.mark.parametrize("method", list(RANKED_REQUESTS))
def test_a_search_is_counted_while_it_runs(engine, monkeypatch, method):
    import importlib

    module_name, function, params = RANKED_REQUESTS[method]
    module = importlib.import_module(module_name)
    seen: list[bool] = []
    real = getattr(module, function)

    def spy(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        waiter = threading.Thread(target=engine_wait, args=(seen,))
        waiter.start()
        waiter.join()
        return real(*args, **kwargs)

    def engine_wait(out: list[bool]) -> None:
        t0 = time.monotonic()
        engine.searches.wait_idle(limit_s=0.2)
        out.append(time.monotonic() - t0 >= 0.15)  # it waited: the search was in flight

    monkeypatch.setattr(module, function, spy)
    getattr(engine, method)(params)
    assert seen == [True]
    t0 = time.monotonic()
    engine.searches.wait_idle(limit_s=0.2)
    assert time.monotonic() - t0 < 0.1  # and no longer once it returned


def test_a_compaction_indexes_the_datasources_it_did_not_find(tmp_path, monkeypatch):
    """A compaction rebuilds the datasource indexes its generation had; one that began before the
    warm-up ended would leave the rest to the first scoped search of each (50 ms at 1,000 models)."""
    from slayer_lsp.search.indexes import SearchIndexes

    monkeypatch.setenv("SLAYER_LSP_CACHE", "off")
    shutil.copytree(YAML_STORE, tmp_path / "store")
    real = SearchIndexes.warm_datasources
    monkeypatch.setattr(SearchIndexes, "warm_datasources", lambda self, catalog, before_each=None: 0)
    engine = Engine(tmp_path / "store", compact_after_s=3600.0)
    try:
        engine.refresh()
        time.sleep(0.3)  # the start-up warm-up has run, without the datasources
        assert not engine.state.search.by_datasource
        monkeypatch.setattr(SearchIndexes, "warm_datasources", real)
        memory = tmp_path / "store/memories/3.md"
        memory.write_text(memory.read_text().replace("Chicago", "Zebracorn City"))
        engine.refresh([str(memory)])
        assert engine.state.search.needs_compaction and engine.compact()
        assert set(engine.state.search.by_datasource) == set(engine.catalog.datasources)
    finally:
        engine.close()


def test_a_long_lived_engine_reports_its_warm_up_until_every_datasource_is_indexed(tmp_path, monkeypatch):
    from slayer_lsp.status import engine_status

    monkeypatch.setenv("SLAYER_LSP_CACHE", "off")
    shutil.copytree(YAML_STORE, tmp_path / "store")
    release = threading.Event()
    eng = Engine(tmp_path / "store", compact_after_s=30.0)
    eng.searches.wait_idle = lambda limit_s=5.0: release.wait(limit_s)  # type: ignore[method-assign]
    try:
        assert engine_status(eng).warming is True  # held before its first datasource
        assert eng.state.search.by_datasource == {}
        release.set()
        deadline = time.monotonic() + 30
        while eng.warming and time.monotonic() < deadline:
            time.sleep(0.02)
        assert engine_status(eng).warming is False
        assert set(eng.state.search.by_datasource) == set(eng.catalog.datasources)
    finally:
        release.set()
        eng.close()
