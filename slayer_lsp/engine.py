"""The engine: one store, its last good snapshot, and the warm indexes derived from it.

Front ends (the language server, the CLI) hold one ``Engine``. ``refresh()`` re-reads the store
(cheap: unchanged files are not re-parsed), derives the next catalog snapshot and updates every index
with the delta; readers always see a complete (snapshot, indexes) pair because the pair is swapped in
one assignment under a lock. A store that cannot be read keeps the last good state serving.
"""

from __future__ import annotations

import gc
import logging
import os
import threading
import time
from dataclasses import dataclass, field

from slayer_lsp.catalog import Catalog, Delta
from slayer_lsp.store.locate import StoreLocation, locate
from slayer_lsp.store.reader import StoreReader

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class State:
    """A consistent pair: a catalog snapshot and the search indexes built for exactly that snapshot."""

    catalog: Catalog
    search: object  # slayer_lsp.search.service.SearchIndexes, typed loosely to keep imports lazy


@dataclass
class RefreshStats:
    generation: int = 0
    last_refresh_s: float = 0.0
    last_delta_size: int = 0
    refreshes: int = 0
    last_error: str | None = None
    timings: dict[str, float] = field(default_factory=dict)


class Engine:
    def __init__(self, storage: str | os.PathLike[str] | StoreLocation | None = None, *,
                 graph: bool = True, compact_after_s: float | None = None, use_cache: bool = True,
                 dense: str = "off", embedding_model: str | None = None, switch_model: bool = False,
                 embedding_provider: object = None):
        """``dense``: "off"; "stored" (rank the vectors already in the store's embeddings table, embed
        nothing but questions: the one-shot CLI); "live" (also embed what is missing or changes, in a
        background worker: the daemon)."""
        self.location = storage if isinstance(storage, StoreLocation) else locate(storage)
        self._reader = StoreReader(self.location, use_cache=use_cache)
        self._use_cache = use_cache
        if dense not in ("off", "stored", "live"):
            raise ValueError(f"dense must be 'off', 'stored' or 'live', not {dense!r}")
        self._dense_mode = dense
        self._embedding_model = embedding_model
        self._embedding_provider = embedding_provider  # tests inject a fake; else the configured model
        self._switch_model = switch_model
        self.dense = None  # the EmbeddingWorker of channel 3, when on
        self._lock = threading.RLock()
        self._graph_enabled = graph
        self.stats = RefreshStats()
        self._state: State | None = None
        self._compact_after_s = compact_after_s  # None: only on explicit compact() calls
        self._compact_timer: threading.Timer | None = None

    # ------------------------------------------------------------------ state

    @property
    def state(self) -> State:
        if self._state is None:
            self.refresh()
        assert self._state is not None
        return self._state

    def current(self) -> State | None:
        """The last complete state, without waiting for a refresh in progress (None before the first
        one finished): what request handlers answer from."""
        return self._state

    @property
    def catalog(self) -> Catalog:
        return self.state.catalog

    def refresh(self, changed_paths: list[str] | None = None) -> Delta:
        """Re-read the store and bring every index up to date; returns what changed.
        ``changed_paths`` (from a file watcher) lets a YAML store skip its full listing."""
        from slayer_lsp.search.service import SearchIndexes

        with self._lock:
            t0 = time.perf_counter()
            read = self._reader.read(changed_paths if self._state is not None else None)
            t1 = time.perf_counter()
            if self._state is None:
                catalog = Catalog.from_read(read)
                cache = None
                if self._use_cache and read.fatal is None:
                    from slayer_lsp.cache import StoreCache

                    cache = StoreCache.for_location(self.location)
                indexes = SearchIndexes.build(catalog, graph=self._graph_enabled, cache=cache)
                indexes.ram_live = self._compact_after_s is not None  # long-lived: edits commit in RAM
                indexes.dense = self.dense = self._start_dense(catalog) if read.fatal is None else None
                if read.fatal is None:
                    self._reader.save_cache()
                delta = Delta(added=frozenset(catalog.entities))
            else:
                catalog, delta = self._state.catalog.derive(read)
                if catalog is self._state.catalog:
                    return delta
                indexes = self._state.search.apply(catalog, delta)  # type: ignore[attr-defined]
            self._state = State(catalog, indexes)
            t2 = time.perf_counter()
            self.stats.generation = catalog.generation
            self.stats.refreshes += 1
            self.stats.last_refresh_s = t2 - t0
            self.stats.last_delta_size = len(delta.touched)
            self.stats.last_error = catalog.fatal
            self.stats.timings = {"read_s": t1 - t0, "index_s": t2 - t1}
            if catalog.fatal:
                log.warning("store unreadable, serving the last good snapshot: %s", catalog.fatal)
            self._schedule_compaction()
            gc.freeze()  # the snapshot and indexes are long-lived: keep them out of every GC pass
            return delta

    def _start_dense(self, catalog: Catalog):  # -> EmbeddingWorker | None
        """Channel 3's worker. A missing runtime or model degrades to a warning in the log and no
        dense channel: search keeps its lexical channels."""
        if self._dense_mode == "off":
            return None
        try:
            from slayer_lsp.embed.providers import configured_model_name, provider_for
            from slayer_lsp.embed.store import VectorStore
            from slayer_lsp.embed.text import CatalogItems
            from slayer_lsp.embed.worker import EmbeddingWorker

            provider = self._embedding_provider or provider_for(
                self._embedding_model or configured_model_name(dict(os.environ)))
            if self._dense_mode == "stored" and not VectorStore.for_store(self.location).count(provider.name):
                log.info("dense channel off: no stored vectors of %s in this store", provider.name)
                return None
            items = (lambda: CatalogItems(catalog)) if self._dense_mode == "live" else None
            worker = EmbeddingWorker(self.location, provider, items=items, switch_model=self._switch_model)
            if self._dense_mode == "stored":
                worker.wait_idle(timeout=60)  # the stored vectors, loaded once
            return worker
        except Exception as exc:  # noqa: BLE001 - an optional channel never takes search down
            log.warning("dense channel unavailable: %s", exc)
            return None

    def close(self) -> None:
        """Record the caches so that the next start on this store resumes from here."""
        with self._lock:
            if self._compact_timer is not None:
                self._compact_timer.cancel()
            if self._state is not None and self.catalog.fatal is None:
                self._reader.save_cache()
                self._state.search.save_cache()  # type: ignore[attr-defined]
            if self.dense is not None:
                self.dense.close()

    def compact(self) -> bool:
        """Rebuild the full-text indexes so their statistics match a fresh build; requests keep
        being answered from the current state meanwhile. Returns True when a rebuild was swapped in."""
        with self._lock:
            state = self._state
        if state is None or not state.search.needs_compaction:  # type: ignore[attr-defined]
            return False
        fresh = state.search.rebuilt(state.catalog)  # type: ignore[attr-defined]
        with self._lock:
            if self._state is not state:  # a newer refresh won; it schedules its own compaction
                return False
            self._state = State(state.catalog, fresh)
            return True

    def _schedule_compaction(self) -> None:
        if self._compact_after_s is None or not self._state.search.needs_compaction:  # type: ignore[union-attr]
            return
        if self._compact_timer is not None:
            self._compact_timer.cancel()
        self._compact_timer = threading.Timer(self._compact_after_s, self.compact)
        self._compact_timer.daemon = True
        self._compact_timer.start()

    # ------------------------------------------------------------------ queries

    def search(self, params: object):  # -> SearchResponse
        """Run one search on the current state (``params``: a ``SearchParams`` or a plain dict)."""
        from slayer_lsp.search.service import search
        from slayer_lsp.search.types import SearchParams, parse_params

        p = params if isinstance(params, SearchParams) else parse_params(params)
        state = self.state
        return search(state.catalog, state.search, p)
