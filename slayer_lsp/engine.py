"""The engine: one store, its last good snapshot, and the warm indexes derived from it.

Front ends (the language server, the CLI) hold one ``Engine``. ``refresh()`` re-reads the store
(cheap: unchanged files are not re-parsed), derives the next catalog snapshot and, from the last
generation of indexes, the next one (``SearchIndexes.apply``, which changes nothing the last one
holds). The pair is swapped in one assignment; a request takes ``current()`` once and sees exactly
that generation, however many refreshes follow, and takes no lock a refresh holds. A store that
cannot be read keeps the last good state serving.
"""

from __future__ import annotations

import gc
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, cast

from slayer_lsp import allocator, collector
from slayer_lsp.catalog import Catalog, Delta
from slayer_lsp.reach.reachable import Reach
from slayer_lsp.reach.scope import Scope
from slayer_lsp.store.locate import StoreLocation, locate
from slayer_lsp.store.reader import StoreReader

if TYPE_CHECKING:  # imported where used: the engine starts before search and embedding load
    from slayer_lsp.embed.providers import EmbeddingProvider
    from slayer_lsp.embed.worker import EmbeddingWorker, PartVectors, WorkerConfig
    from slayer_lsp.search.indexes import SearchIndexes
    from slayer_lsp.search.types import SearchResponse

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class State:
    """A consistent pair: a catalog snapshot and the search indexes of exactly that snapshot (one
    generation: read-only, never changed by a later refresh)."""

    catalog: Catalog  # what the session may reach (the whole store unless the engine has a scope)
    search: SearchIndexes
    full: Catalog | None = None  # the whole store under a scope (None: the same as ``catalog``)


COMPACT_MAX_WAIT_S = 30.0  # a wanted compaction is put off by further edits at most this long


@dataclass
class RefreshStats:
    generation: int = 0
    last_refresh_s: float = 0.0
    last_delta_size: int = 0
    refreshes: int = 0
    compactions: int = 0  # rebuilds swapped in
    last_error: str | None = None
    unreadable_since: float | None = None  # time.time() when the store became unreadable (None: readable)
    timings: dict[str, float] = field(default_factory=dict)


class _BuildWithoutGc:
    """The cyclic collector is paused while the first index and the warm-up build (millions of
    objects that all stay alive: each full collection would walk them all again, 1-1.4 s apiece at
    10,000 models, some 30 times during a start), and what they built is frozen out of later
    collections when the last of them ends. Refcounting frees garbage meanwhile; cycles wait."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._depth = 0
        self._was_enabled = False

    def __enter__(self) -> None:
        with self._lock:
            if self._depth == 0:
                self._was_enabled = gc.isenabled()
                gc.disable()
            self._depth += 1

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._depth -= 1
            if self._depth == 0:
                # out of every later pass at once (those walk only what changed since): the young
                # generation is the whole build, and a pass over it would stall the next request.
                # A pass over everything (at the server's next idle moment) follows only when an
                # earlier build was frozen: what that held may be garbage now, and a frozen cycle is
                # otherwise never collected. A process's first build leaves ~100 cycles of its own,
                # not worth a pass of 1.4 s at 10,000 models that the next request would wait for.
                earlier = gc.get_freeze_count() > 0
                gc.freeze()
                if earlier:
                    collector.settle()
                if self._was_enabled:
                    gc.enable()


_BUILDING = _BuildWithoutGc()

WARM_YIELD_MAX_S = 5.0  # the longest the warm-up waits for searches to pause before it goes on


class SearchesInFlight:
    """How many searches (ranked answers: ``search`` and ``search_facets``) run now. The warm-up (a
    datasource index at a time, pure Python under the interpreter lock) waits for a pause in them
    before each step: run side by side, a search would take twice its time while the warm-up holds
    the lock half of it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0

    def __enter__(self) -> None:
        with self._lock:
            self._count += 1

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._count -= 1

    def wait_idle(self, limit_s: float = WARM_YIELD_MAX_S) -> None:
        deadline = time.monotonic() + limit_s
        while self._count and time.monotonic() < deadline:
            time.sleep(0.002)


class Engine:
    def __init__(
        self,
        storage: str | os.PathLike[str] | StoreLocation | None = None,
        *,
        graph: bool = True,
        compact_after_s: float | None = None,
        use_cache: bool = True,
        dense: str = "off",
        embedding_model: str | None = None,
        switch_model: bool = False,
        embedding_provider: EmbeddingProvider | None = None,
        parts: bool = True,
        scope: Scope | None = None,
        embed_config: WorkerConfig | None = None,
    ):
        """``dense``: "off"; "stored" (rank the vectors already in the store's embeddings table, embed
        nothing but questions: the one-shot CLI); "live" (also embed what is missing or changes, in a
        background worker: the daemon). ``parts``: with the dense channel, also keep the part vectors
        (facets, ``embed.parts``) in a second worker, ranked by ``search.facet_ranking``. ``scope``: what the
        session may reach (``reach.scope``); every index and analysis then sees only the reachable
        catalog, and the vectors of anything else are never ranked. ``embed_config``: how the
        worker runs (default: in the background, a step behind search)."""
        self.scope = scope or Scope()
        self._reach = None if self.scope.unrestricted else Reach(self.scope)
        self.location = storage if isinstance(storage, StoreLocation) else locate(storage)
        self._reader = StoreReader(self.location, use_cache=use_cache)
        self._use_cache = use_cache
        if dense not in ("off", "stored", "live"):
            raise ValueError(f"dense must be 'off', 'stored' or 'live', not {dense!r}")
        self._dense_mode = dense
        self._embedding_model = embedding_model
        self._embedding_provider = embedding_provider  # tests inject a fake; else the configured model
        self._switch_model = switch_model
        self._parts = parts
        self._embed_config = embed_config
        self.dense: EmbeddingWorker | None = None  # channel 3, when on
        self._dense_proxy: _InStore | None = None  # how the indexes see it under a scope
        self._reach_s = 0.0  # the last refresh's time deriving the reachable catalog
        self._lock = threading.RLock()
        self._graph_enabled = graph
        self.stats = RefreshStats()
        self._state: State | None = None
        self._built = False  # indexes (with cache and dense channel) were built from a readable store
        self._compact_after_s = compact_after_s  # None: only on explicit compact() calls
        self._compact_timer: threading.Timer | None = None
        self._compact_due: float | None = None  # monotonic time since when a compaction is wanted
        self._changes_seen: list[list[Delta]] = []  # per running compaction: the refreshes' deltas since
        self._compacting = False  # a scheduled compaction is running
        self._closed = False
        self.searches = SearchesInFlight()  # searches running now: the warm-up steps aside for them
        self.warming = False  # the start-up's background work (``_warm``) is under way
        # what the first read waits for before it looks at the store (a server's watch being put in
        # place, so that no change between the two goes unseen)
        self.before_first_read: Callable[[], object] | None = None

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
        if self._state is None or not self._built:
            with _BUILDING:
                return self._refresh(changed_paths)
        return self._refresh(changed_paths)

    def _refresh(self, changed_paths: list[str] | None) -> Delta:
        from slayer_lsp.search.indexes import SearchIndexes

        with self._lock:
            t0 = time.perf_counter()
            # a store unreadable since the start has nothing indexed yet: its first good read builds
            first = self._state is None or not self._built
            read = self._reader.read(
                None if first else changed_paths, before_listing=self.before_first_read if first else None
            )
            t1 = time.perf_counter()
            was = self._state.catalog.fatal if self._state is not None else None
            if read.fatal is not None and read.fatal == was:
                return Delta()  # still unreadable, for the same reason: nothing new to serve or to report
            if first:
                full = Catalog.from_read(read)
                catalog = full if self._reach is None else self._reachable(full, None)[0]
                cache = None
                if self._use_cache and read.fatal is None:
                    from slayer_lsp.store.cache import StoreCache

                    cache = StoreCache.for_location(self.location)
                    if cache is not None and self._reach is not None:  # a scope's index holds less: its own
                        cache = StoreCache(self.location, cache.root / f"scope-{self.scope.key()}")
                try:
                    indexes = SearchIndexes.build(
                        catalog, graph=self._graph_enabled, cache=cache, reuse_texts=self._reach is None
                    )
                except (
                    ValueError,
                    OSError,
                ) as exc:  # the cached index cannot be brought up to date (disk full)
                    if cache is None:
                        raise
                    log.warning("cannot use the on-disk index cache (%s); indexing in memory", exc)
                    indexes = SearchIndexes.build(catalog, graph=self._graph_enabled)
                if self._compact_after_s is None and indexes.needs_compaction:
                    # the cached index caught up by replacing documents whose old versions still weigh
                    # in BM25 (and pile up run after run): a one-shot engine rebuilds now, so that it
                    # answers exactly as a cold start; a long-lived one compacts in the background
                    indexes = indexes.rebuilt(catalog)
                indexes.ram_live = self._compact_after_s is not None  # long-lived: edits commit in RAM
                indexes.dense = self.dense = self._start_dense(catalog) if read.fatal is None else None
                indexes.dense = self._dense_view(full)
                self._restrict_dense(catalog)
                if read.fatal is None:
                    self._save_caches(search=None, background=True)  # off the first answer's path
                    self._built = True
                delta = Delta(added=frozenset(catalog.entities))
            else:
                assert self._state is not None  # not the first refresh
                prev_full = self._state.full or self._state.catalog
                full, delta = prev_full.derive(read)
                if full is prev_full:
                    return delta
                catalog, delta = self._reachable(full, delta)
                if self._state.search.dense is not None:
                    self._dense_view(full)
                if delta.added or delta.removed:
                    self._restrict_dense(catalog)
                try:
                    indexes = self._state.search.apply(catalog, delta)
                except (ValueError, OSError) as exc:  # an on-disk index could not commit (disk full, ...)
                    log.warning(
                        "cannot update the on-disk full-text index (%s); rebuilding it in memory", exc
                    )
                    indexes = SearchIndexes.build(catalog, graph=self._graph_enabled)
                    indexes.ram_live, indexes.dense = (
                        self._compact_after_s is not None,
                        self._dense_view(full),
                    )
                if self.dense is not None and self.dense.parts is not None:
                    from slayer_lsp.embed.parts import feed_parts

                    feed_parts(_InStore.wrap(self.dense.parts, full, self._reach), catalog, delta)
            first = self._state is None
            for seen in self._changes_seen:  # a compaction under way catches up with these
                seen.append(delta)
            self._state = State(catalog, indexes, full if self._reach is not None else None)
            if first and self._compact_after_s is not None:
                # a long-lived engine builds the hybrid ranking's indexes off the request path (a search
                # that comes first waits for them rather than building them twice); a one-shot one
                # builds what its one request needs, and leaves no thread in native code at its exit
                self.warming = True
                threading.Thread(target=self._warm, name="slayer-warm", daemon=True).start()
            t2 = time.perf_counter()
            self.stats.generation = catalog.generation
            self.stats.refreshes += 1
            self.stats.last_refresh_s = t2 - t0
            self.stats.last_delta_size = len(delta.touched)
            self.stats.last_error = catalog.fatal
            self.stats.timings = {"read_s": t1 - t0, "index_s": t2 - t1}
            if self._reach is not None:
                self.stats.timings["reach_s"] = self._reach_s
            if catalog.fatal:
                log.warning("store unreadable, serving the last good snapshot: %s", catalog.fatal)
                if was is None:
                    self.stats.unreadable_since = time.time()
            elif was is not None:
                log.info(
                    "store readable again after %.1f s", time.time() - (self.stats.unreadable_since or 0)
                )
                self.stats.unreadable_since = None
            self._schedule_compaction()
            # The first build is frozen out of GC passes when it ends (_BUILDING), and the warm-up's
            # when that ends; never per refresh: a frozen object is never collected, so freezing
            # every refresh would keep each superseded snapshot's cycles for ever (the soak saw it).
            return delta

    @property
    def full_catalog(self) -> Catalog:
        """The whole store, whatever the scope (for writes, which must see every id in use)."""
        state = self.state
        return state.full or state.catalog

    def _reachable(self, full: Catalog, delta: Delta | None) -> tuple[Catalog, Delta]:
        """The session's catalog of a full snapshot, and the delta the indexes are to receive."""
        if self._reach is None:
            return full, delta if delta is not None else Delta(added=frozenset(full.entities))
        t0 = time.perf_counter()
        out = self._reach.restrict(full, delta)
        self._reach_s = time.perf_counter() - t0
        return out

    def _dense_view(self, full: Catalog) -> EmbeddingWorker | None:
        """The dense worker as the search indexes hold it (see ``_InStore``, typed as the worker it
        stands for: it forwards every attribute, narrowing only ``remove``)."""
        if self._reach is None or self.dense is None:
            return self.dense
        view = self._dense_proxy
        if view is None or view.worker is not self.dense:
            view = self._dense_proxy = _InStore(self.dense, full)
        view.full = full
        return cast("EmbeddingWorker", view)

    def _restrict_dense(self, catalog: Catalog) -> None:
        """Under a scope, the vector indexes rank reachable ids only (the store's table holds every
        session's vectors)."""
        if self._reach is None or self.dense is None:
            return
        reachable = frozenset(catalog.entities)
        self.dense.index.restrict_to(reachable)
        parts = getattr(self.dense, "parts", None)
        if parts is not None:
            parts.index.restrict_to(reachable)

    def _warm(self) -> None:
        """Build the hybrid ranking's indexes for the newest state (again if a refresh overtook)."""
        try:
            with _BUILDING:
                self._warm_indexes()
        finally:
            self.warming = False

    def _warm_indexes(self) -> None:
        try:
            while True:
                state = self._state
                if state is None:
                    return
                state.search.warm(state.catalog)
                if self._state is state:
                    break
            if self._compact_after_s is None:  # a one-shot engine asks what it asks, once
                return
            self._warm_datasources()
        except Exception:  # noqa: BLE001 - a request builds what it needs itself
            log.exception("warming the hybrid ranking's indexes failed")

    def _warm_datasources(self) -> None:
        """Each datasource's index, so that the first question scoped to one does not build it
        (50 ms at 1,000 models, seconds at 10,000): on the newest state, whose successors carry
        them on — after the start, and after a compaction (it rebuilds those it finds only)."""
        t0, built = time.perf_counter(), 0
        while (state := self._state) is not None and not self._closed:
            built += state.search.warm_datasources(state.catalog, before_each=self.searches.wait_idle)
            if self._state is state:
                break
        if built:
            log.info("indexed %d datasources apart in %.1f s", built, time.perf_counter() - t0)

    def _start_dense(self, catalog: Catalog) -> EmbeddingWorker | None:
        """Channel 3's worker. A missing runtime or model degrades to a warning in the log and no
        dense channel: search keeps its lexical channels."""
        if self._dense_mode == "off":
            return None
        try:
            from slayer_lsp.embed.priority import RankedItems
            from slayer_lsp.embed.providers import configured_model_name, provider_for
            from slayer_lsp.embed.store import VectorStore
            from slayer_lsp.embed.worker import EmbeddingWorker, WorkerConfig

            provider = self._embedding_provider or provider_for(
                self._embedding_model or configured_model_name(dict(os.environ))
            )
            if self._dense_mode == "stored" and not VectorStore.for_store(self.location).count(provider.name):
                log.info("dense channel off: no stored vectors of %s in this store", provider.name)
                return None
            items = (lambda: RankedItems(catalog)) if self._dense_mode == "live" else None
            parts = self._part_vectors(catalog, provider) if self._parts else None
            config = self._embed_config or WorkerConfig()
            if self._reach is not None:  # a scoped session backfills only what it reaches: pruning
                config = replace(
                    config, parts=replace(config.parts, prune=False)
                )  # would drop the others' parts
            worker = EmbeddingWorker(
                self.location,
                provider,
                items=items,
                switch_model=self._switch_model,
                parts=parts,
                config=config,
                before_job=self.searches.wait_idle,
            )
            if self._dense_mode == "stored":
                worker.wait_idle(timeout=60)  # the stored vectors, loaded once
                if worker.parts is not None:
                    worker.parts.wait_idle(timeout=60)
            return worker
        except Exception as exc:  # noqa: BLE001 - an optional channel never takes search down
            log.warning("dense channel unavailable: %s", exc)
            return None

    def _part_vectors(self, catalog: Catalog, provider: EmbeddingProvider) -> PartVectors | None:
        """Where the worker keeps the part vectors (our own table in the cache directory; in memory
        only without a cache). "stored" mode only loads what is there."""
        from slayer_lsp.embed.parts import part_store
        from slayer_lsp.embed.priority import RankedParts
        from slayer_lsp.embed.store import MemoryStore
        from slayer_lsp.embed.worker import PartVectors

        store = part_store(self.location) if self._use_cache else MemoryStore()
        if self._dense_mode == "stored" and not store.count(provider.name):
            return None

        def items() -> RankedParts:  # the newest snapshot when a model switch backfills again
            return RankedParts(self._state.catalog if self._state is not None else catalog)

        return PartVectors(store, items if self._dense_mode == "live" else None)

    def close(self) -> None:
        """Record the caches so that the next start on this store resumes from here."""
        with self._lock:
            self._closed = True  # no compaction is scheduled after this
            if self._compact_timer is not None:
                self._compact_timer.cancel()
            if self._state is not None and self.catalog.fatal is None:
                self._save_caches(search=self._state.search)
            if self.dense is not None:
                self.dense.close()
            if self._state is not None:
                self._state.search.close_graph()
                self._state.search.close_writers()
                if self._state.search.cache is not None:
                    self._state.search.cache.flush()
            self._reader.flush()
            self._reader.close()

    def _save_caches(self, search: SearchIndexes | None, *, background: bool = False) -> None:
        """Record the on-disk caches; one that cannot be written is skipped (served from memory).
        ``background``: the parsed documents are written on a thread (``close`` waits for it)."""
        try:
            self._reader.save_cache(background=background)
            if search is not None:
                search.save_cache()
        except Exception as exc:  # noqa: BLE001 - the cache is an optimisation, never a failure
            log.warning(
                "cannot record the on-disk caches (%s: %s); serving from memory", type(exc).__name__, exc
            )

    def compact(self) -> bool:
        """Rebuild the full-text indexes so their statistics match a fresh build; requests keep
        being answered from the current state meanwhile, and refreshes keep coming: the rebuild is
        then brought up to date with the changes they made before it is swapped in (so an edit never
        waits for a rebuild, which takes seconds at 1,000 models and half a minute at 10,000).
        Returns True when a rebuild was swapped in."""
        changes: list[Delta] = []  # what the refreshes during the rebuild changed, in order
        with self._lock:
            state = self._state
            if state is None or not state.search.needs_compaction:
                return False
            self._changes_seen.append(changes)
        t0 = time.perf_counter()
        try:
            fresh = state.search.rebuilt(state.catalog)
        except BaseException:
            with self._lock:
                self._changes_seen.remove(changes)
            raise
        with self._lock:  # one hold from here to the swap: no refresh lands unrecorded in between
            self._changes_seen.remove(changes)
            current = self._state
            if self._closed or current is None:
                fresh.close_writers(keep=state.search)
                return False
            if current is not state:  # refreshes came meanwhile: their changes, applied to the rebuild
                try:
                    fresh = fresh.apply(
                        current.catalog,
                        _merged(state.catalog, current.catalog, changes),
                        feed_dense=False,  # the refreshes fed the dense worker already
                        newer=current.search,
                    )
                except (ValueError, OSError) as exc:  # the rebuild could not commit them
                    fresh.close_writers(keep=current.search)
                    log.warning("compaction dropped: cannot bring it up to date (%s)", exc)
                    return False
                log.info("compaction brought up to date with %d refreshes", len(changes))
            self._state = State(current.catalog, fresh, current.full)
            self.stats.compactions += 1
        current.search.close_writers(keep=fresh)  # no generation derives from these any more
        del state, current, fresh
        allocator.trim()  # the old generation's native memory, freed in a burst
        log.info("compacted the full-text indexes in %.2f s", time.perf_counter() - t0)
        try:  # a compaction that began before the start-up's warm-up ended lacks some datasources
            self._warm_datasources()
        except Exception:  # noqa: BLE001 - a request builds what it needs itself
            log.exception("indexing the datasources apart after a compaction failed")
        return True

    def _schedule_compaction(self) -> None:
        """After a refresh (under the engine lock): compact once the store has been quiet for
        ``compact_after_s``, but never put off past ``COMPACT_MAX_WAIT_S`` since one was first
        wanted: under edits that never pause (the soak saw one a second) a debounce alone never
        fired, and the replaced documents piled up in the live indexes. A compaction still due
        after that long runs while the edits go on (it catches up with them before it is swapped in)."""
        if self._closed or self._compact_after_s is None or self._state is None:
            return
        if not self._state.search.needs_compaction:
            return
        now = time.monotonic()
        if self._compact_due is None:
            self._compact_due = now
        if self._compacting:
            return  # the running one schedules the next when it ends
        if self._compact_timer is not None:
            if now - self._compact_due >= COMPACT_MAX_WAIT_S:
                return  # due long enough: the scheduled one is not put off again
            self._compact_timer.cancel()
        self._compact_timer = threading.Timer(self._compact_after_s, self._compact_when_due)
        self._compact_timer.daemon = True
        self._compact_timer.start()

    def _compact_when_due(self) -> None:
        with self._lock:
            self._compact_timer, self._compacting = None, True
        done = False
        try:
            done = self.compact()
        except Exception:  # noqa: BLE001 - the live indexes keep serving; the next edit tries again
            log.exception("compacting the full-text indexes failed")
        finally:
            with self._lock:
                self._compacting = False
                if done:
                    self._compact_due = None
                self._schedule_compaction()  # edits meanwhile, or a refresh overtook this one

    # ------------------------------------------------------------------ queries

    def search(self, params: object, cancel: threading.Event | None = None) -> SearchResponse:
        """Run one search on the current state (``params``: a ``SearchParams`` or a plain dict).
        Setting ``cancel`` stops its cypher_filter, if one is running (the request was cancelled)."""
        from slayer_lsp.search.pipeline import search
        from slayer_lsp.search.types import SearchParams, parse_params

        p = params if isinstance(params, SearchParams) else parse_params(params)
        state = self.state
        with self.searches:
            return search(state.catalog, state.search, p, cancel)

    def abort_queries(self) -> None:
        """Stop a running cypher_filter now (its process is killed), without waiting for any lock:
        the first step of a shutdown."""
        state = self._state
        if state is not None:
            state.search.abort_graph()

    def search_facets(self, params: object):  # -> SearchFacetsResponse
        """Rank one kind's entities on several facets at once (``search.facet_ranking``); ``params``: a
        ``SearchFacetsParams`` or a plain dict."""
        from slayer_lsp.search.facet_ranking import SearchFacetsParams, parse_facets_params, search_facets

        p = params if isinstance(params, SearchFacetsParams) else parse_facets_params(params)
        state = self.state
        with self.searches:
            return search_facets(state.catalog, state.search, p)


def _merged(before: Catalog, after: Catalog, deltas: list[Delta]) -> Delta:
    """One delta from ``before`` to ``after`` out of the deltas of the refreshes between them: an id
    touched by any of them is added, removed or changed as the two ends say (one that came and
    went again is left out)."""
    touched = frozenset().union(*(d.touched for d in deltas))
    old, new = before.entities, after.entities
    added = frozenset(c for c in touched if c in new and c not in old)
    removed = frozenset(c for c in touched if c in old and c not in new)
    return Delta(
        added=added,
        changed=frozenset(c for c in touched if c in old and c in new),
        removed=removed,
        priority_changed=any(d.priority_changed for d in deltas),
    )


class _InStore:
    """An embedding worker as a scoped engine's indexes feed it. An entity that only left the scope
    is still in the store: its stored vectors stay (other sessions rank them) and leave this
    session's index only; an entity gone from the store loses them. The rest is the worker's."""

    def __init__(self, worker: object, full: Catalog) -> None:
        self.worker = worker
        self.full = full

    @classmethod
    def wrap(cls, worker: object, full: Catalog, reach: Reach | None) -> object:
        return worker if reach is None else cls(worker, full)

    def remove(self, canonical_id: str, *, from_store: bool = True) -> None:
        self.worker.remove(canonical_id, from_store=from_store and canonical_id not in self.full.entities)  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> object:
        return getattr(self.worker, name)
