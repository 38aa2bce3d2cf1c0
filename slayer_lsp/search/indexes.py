"""The indexes of one catalog snapshot (one generation), and how a ``Delta`` derives the next.

``SearchIndexes`` holds what is expensive to build: the rendered documents, the tantivy indexes
(the whole store's and, on first use, one per datasource), the Cypher graph, the lexicon, the
memory pieces and terms, and per-scope tag corpora. ``apply`` derives the next generation from a
delta, re-rendering only the touched documents; ``rebuilt`` makes fresh full-text indexes off the
request path. Rankings read these; nothing here ranks.

What a generation owns, per index (none of it changes once the engine publishes the generation):

* full text, whole store and per datasource: a ``FullTextView`` (a searcher taken after this
  generation's commit); the writer behind it belongs to the refresh;
* memory pieces: a ``MemoryPieceIndex`` generation; lexicon and memory terms: values;
* per-scope values and the datasource indexes first asked for here: built into this generation;
* shared on purpose: the Cypher graph (one process per engine, brought up to date by the filter
  that uses it) and the dense worker (each query ranks the vector view published last).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from slayer_lsp.catalog import Catalog, Delta
from slayer_lsp.catalog.ids import datasource_of, is_model_id
from slayer_lsp.catalog.layered import LayeredMap
from slayer_lsp.search import lexicon_entries, memory_entries, rendered, scope
from slayer_lsp.search.fulltext import FullTextIndex, FullTextView, IndexState
from slayer_lsp.search.graph import GraphIndex
from slayer_lsp.search.lexicon import Lexicon
from slayer_lsp.search.memory_terms import MemoryTerms
from slayer_lsp.search.piece_index import MemoryPieceIndex
from slayer_lsp.search.tag_bm25 import TagCorpus
from slayer_lsp.store import documents as d
from slayer_lsp.store.cache import StoreCache, TextManifest
from slayer_lsp.texts import render
from slayer_lsp.texts.statements import item_for

if TYPE_CHECKING:
    from slayer_lsp.embed.worker import EmbeddingWorker

log = logging.getLogger(__name__)

_T = TypeVar("_T")


def _is_visible(catalog: Catalog, canonical: str) -> bool:
    ent = catalog.get(canonical)
    return ent is not None and not ent.hidden


_MISSING: Any = object()


class _Lazy:
    """What one generation builds on first use (a datasource's full-text index, the hybrid
    ranking's indexes, per-scope values), each under a lock of its own: a build never holds up a
    request that needs something else, and a built value is read without any lock."""

    def __init__(self, seed: dict[Any, Any] | None = None) -> None:
        self._values: dict[Any, Any] = dict(seed or {})
        self._locks: dict[Any, threading.Lock] = {}
        self._guard = threading.Lock()

    def _lock(self, key: Any) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(key, threading.Lock())

    def get(self, key: Any, build: Callable[[], _T]) -> _T:
        value = self._values.get(key, _MISSING)
        if value is not _MISSING:
            return value
        with self._lock(key):
            value = self._values.get(key, _MISSING)
            if value is _MISSING:
                value = self._values[key] = build()
            return value

    def peek(self, key: Any, *, wait: bool = False) -> Any:
        """The value if built (None if not); ``wait``: let a build under way finish first."""
        if wait and key not in self._values:
            with self._lock(key):
                pass
        return self._values.get(key)

    def items(self) -> list[tuple[Any, Any]]:
        return list(self._values.items())


@dataclass
class SearchIndexes:
    """The indexes of one catalog snapshot: one generation, read-only to the requests that hold it.

    Every index here is a view of this snapshot and of no other: the full-text views carry a
    tantivy searcher taken after this generation's commit, the lexicon, piece index and memory
    terms are values, and what is built on first use (a datasource's index, per-scope values) is
    built from this generation's documents into this generation only. ``apply`` derives the next
    generation from a delta without changing this one; the tantivy writers behind the views
    belong to the refresh, which alone calls ``apply``."""

    # every searchable (visible) document, shared with the generations derived from this one: an
    # edit layers its few texts over the map instead of copying 400,000 entries (20-30 ms at 10k)
    docs: LayeredMap[render.RenderedDoc]
    fulltext: FullTextView
    graph_enabled: bool = True
    _graph: GraphIndex | None = None
    cache: StoreCache | None = None
    dense: EmbeddingWorker | None = None  # channel 3
    _graph_pending: frozenset[str] = frozenset()  # ids touched since the graph was last brought up to date
    ram_live: bool = False  # a long-lived engine keeps the live full-text index in memory (see rebuilt)
    edited: bool = False  # derived from a change since the index was opened or rebuilt
    # the cache may give values back by stored document: the catalog holds the store's documents as
    # they are (not pruned by a scope)
    reuse: bool = False
    _lazy: _Lazy = field(default_factory=_Lazy)
    # the graph (a process of its own) is shared by the generations of one engine: its lock is too
    _graph_lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def build(
        cls, catalog: Catalog, *, graph: bool = True, cache: Any = None, reuse_texts: bool = True
    ) -> SearchIndexes:
        """The first generation. With ``cache``, the last run's full-text index is reopened and brought
        up to date, and (``reuse_texts``: the catalog holds the stored documents as they are, not
        pruned by a scope) the texts of unchanged documents are taken from the cache, not rendered."""
        rendering = rendered.Rendering(catalog, cache if reuse_texts else None)
        fulltext = None
        if cache is None:
            fulltext = FullTextIndex(rendering)
        else:
            manifest = cache.load_text_manifest()
            if manifest is not None:
                fulltext = FullTextIndex.reopen(
                    Path(manifest.directory), _state_of(manifest), manifest.opstamp
                )
            if fulltext is not None:
                rendering.finish()  # only documents whose text changed since the last run
                assert manifest is not None
                if rendering.indexed_at == (manifest.directory, manifest.opstamp):
                    fulltext.sync(rendering.docs, indexed_except=rendering.rendered)
                else:
                    fulltext.sync(rendering.docs, rendering.known)
            else:  # a cold start: the texts are indexed as they are rendered
                fulltext = _persistent_index(cache, rendering)
            if fulltext is not None:
                _save_manifest(cache, fulltext, background=True)
        texts = rendering.finish().docs
        if cache is not None and fulltext is not None and reuse_texts and fulltext.path is not None:
            at = (str(fulltext.path), fulltext.opstamp)
            if rendering.fresh or rendering.indexed_at != at:  # written beside the start, not in its way
                digest_of = fulltext.digests.getter()  # of this commit: later ones leave it as it is
                cache.write_in_background(
                    rendered.FILE, lambda: rendered.cache_file(catalog, texts, digest_of, at)
                )
        return cls(
            LayeredMap(texts),
            (fulltext or FullTextIndex(texts.values())).view(),
            graph,
            cache=cache,
            reuse=reuse_texts,
        )

    @property
    def by_datasource(self) -> dict[str, FullTextView]:
        """The datasource indexes this generation has (built on first use, or derived)."""
        return {key[1]: view for key, view in self._lazy.items() if _is_text_key(key)}

    def apply(
        self, catalog: Catalog, delta: Delta, *, feed_dense: bool = True, newer: SearchIndexes | None = None
    ) -> SearchIndexes:
        """The next generation: the touched documents rendered again, every index derived from this
        generation's by the delta. This generation is left as it was (run by the refresh only).

        ``newer``: a compaction's rebuild catching up with the generations the refreshes made while
        it ran (``newer`` is the last of them, ``delta`` all their changes in one). A datasource index
        the rebuild carried on is the very writer those refreshes committed to, so ``newer``'s view
        of it is taken as it is, as are the datasource indexes first built meanwhile, and the graph."""
        touched = set(delta.touched)
        for cid in delta.touched:  # a datasource document lists its models
            if is_model_id(cid):
                touched.add(datasource_of(cid))
        changing = self.docs.mutate()
        upserts: list[render.RenderedDoc] = []
        removals: list[str] = []
        for cid in sorted(touched):
            doc = render.render_entity(catalog, cid) if _is_visible(catalog, cid) else None
            if doc is None:
                if changing.pop(cid, None) is not None:
                    removals.append(cid)
            elif changing.get(cid) != doc:
                changing[cid] = doc
                upserts.append(doc)
        docs = changing.finish()
        fulltext = _derived(self.fulltext, in_corpus_order(catalog, docs), removals, upserts)
        seed: dict[Any, Any] = {}
        for key, view in self._lazy.items():
            if not _is_text_key(key) or key[1] not in catalog.datasources:
                continue
            ds = key[1]
            if newer is not None:
                current = newer._lazy.peek(key)
                if current is not None and current.index is view.index:  # carried on: already current
                    seed[key] = current
                    continue
            if not view.index.extends(view):  # not this writer's last commit: rebuilt on first use
                continue
            scoped = [u for u in upserts if ds in scope.doc_scopes(catalog, u.canonical)]
            gone = [c for c in removals if c in view] + [
                u.canonical
                for u in upserts
                if u.canonical in view and ds not in scope.doc_scopes(catalog, u.canonical)
            ]
            seed[key] = view.index.replace(gone, scoped)
        if newer is not None:  # datasource indexes first built while the rebuild ran
            for key, view in newer._lazy.items():
                if _is_text_key(key) and key not in seed and key[1] in catalog.datasources:
                    if view.index.extends(view):
                        seed[key] = view
        if self.dense is not None and feed_dense:
            _feed_dense(self.dense, catalog, touched, delta)
        # the graph catches up on the next cypher_filter, not on every edit
        with self._graph_lock:
            source = newer if newer is not None else self
            graph, pending = source._graph, source._graph_pending
        pending = pending | delta.touched if graph is not None else frozenset()
        # the hybrid ranking's values: derived when this generation has them (a first build under way
        # is waited for, so that the next generation need not build them again)
        lexicon: Lexicon | None = self._lazy.peek("lexicon", wait=True)
        pieces: MemoryPieceIndex | None = self._lazy.peek("pieces", wait=True)
        terms: MemoryTerms | None = self._lazy.peek("memory terms", wait=True)
        if lexicon is not None:
            seed["lexicon"] = lexicon.apply(catalog, delta)
        if pieces is not None:
            seed["pieces"] = pieces.apply(catalog, delta)
        if terms is not None:
            seed["memory terms"] = terms.derive(catalog, delta)
        return SearchIndexes(
            docs,
            fulltext,
            self.graph_enabled,
            graph,
            cache=self.cache,
            dense=self.dense,
            _graph_pending=frozenset(pending),
            ram_live=self.ram_live,
            reuse=self.reuse,
            edited=self.edited or bool(removals or upserts),
            _lazy=_Lazy(seed),
            _graph_lock=self._graph_lock,
        )

    @property
    def needs_compaction(self) -> bool:
        """Replaced or deleted documents linger in tantivy's BM25 statistics, so scores drift a
        little from a fresh build until the index is rebuilt."""
        # a compaction rebuilds every index, so the whole store's size sets the policy: a warehouse's
        # datasource index is small, but one edit to it must not cost a 27 s rebuild of them all
        small = self._small
        stale = any(
            _worth_rebuilding(ix.deletions, len(ix), small)
            for ix in (self.fulltext, *self.by_datasource.values())
        )
        pieces = self._lazy.peek("pieces")
        stale = stale or bool(pieces is not None and _worth_rebuilding(pieces.deletions, len(pieces), small))
        # a long-lived engine moves its live index into memory (edits then commit without an fsync)
        # once an edit came, but never rebuilds a warehouse index for that alone: at 10,000 models it
        # took 27 s of CPU beside the first requests and 700 MiB more at its peak, where an edit
        # committed to the on-disk index costs an fsync. Not at start: a rebuild then (4 s at 1,000
        # models) took the interpreter lock from the first searches for nothing yet
        return stale or (self.ram_live and self.edited and self.fulltext.path is not None and small)

    def rebuilt(self, catalog: Catalog) -> SearchIndexes:
        """Fresh full-text indexes over the same documents (run off the request path). With
        ``ram_live`` the live index is kept in memory, so edits commit without an fsync, and the
        on-disk cache gets a separate snapshot that the next start reopens and brings up to date."""
        docs = self.docs
        corpus = list(in_corpus_order(catalog, docs))  # the order a fresh start indexes them in
        seed: dict[Any, Any] = {}
        small = self._small
        for ds, view in self.by_datasource.items():
            if ds not in catalog.datasources:
                continue
            if view.index.extends(view) and not _worth_rebuilding(view.deletions, len(view), small):
                seed[("fulltext", ds)] = view  # exact as it is: carried on, writer and all
            else:
                ds_docs = self._docs_by_datasource(catalog).get(ds, ())
                seed[("fulltext", ds)] = _datasource_index(self.cache, ds, ds_docs, reopen=False).view()
        cache = self.cache
        snapshot = _persistent_index(cache, corpus) if cache is not None else None
        if cache is not None and snapshot is not None:
            _save_manifest(cache, snapshot)
        if self.ram_live or snapshot is None:
            if snapshot is not None:
                snapshot.close()  # releases its writer lock; the directory stays as the cache
            live = FullTextIndex(corpus)
        else:
            live = snapshot
        pieces: MemoryPieceIndex | None = self._lazy.peek("pieces", wait=True)
        if pieces is not None:
            seed["pieces"] = pieces.rebuilt()
        for key in ("lexicon", "memory terms"):  # values: shared as they are
            value = self._lazy.peek(key, wait=True)
            if value is not None:
                seed[key] = value
        with self._graph_lock:
            graph, pending = self._graph, self._graph_pending
        return SearchIndexes(
            docs,
            live.view(),
            self.graph_enabled,
            graph,
            cache=self.cache,
            dense=self.dense,
            _graph_pending=pending,
            ram_live=self.ram_live,
            reuse=self.reuse,
            _lazy=_Lazy(seed),
            _graph_lock=self._graph_lock,
        )

    def close_writers(self, keep: SearchIndexes | None = None) -> None:
        """Close the writers behind this generation's indexes once no later generation derives from
        them (it was replaced by a rebuild, or the engine closes): their memory, threads and on-disk
        lock go now, not at the next full GC pass. The views keep answering requests that hold them;
        a later change to a closed index indexes anew. ``keep``: the generation that replaces this
        one (or that this one failed to replace); the writers the two share stay open."""
        shared = set() if keep is None else {id(view.index) for view in keep.by_datasource.values()}
        self.fulltext.index.close()
        for view in self.by_datasource.values():
            if id(view.index) not in shared:
                view.index.close()
        pieces: MemoryPieceIndex | None = self._lazy.peek("pieces")
        if pieces is not None:
            pieces.close()

    def save_cache(self) -> None:
        """Record the live indexes' state so the next start reopens them (after incremental updates)."""
        if self.cache is None:
            return
        if self.fulltext.path is not None:
            _save_manifest(self.cache, self.fulltext.index)
        for ds, view in self.by_datasource.items():
            if view.path is not None and view.index.extends(view):
                _save_manifest(self.cache, view.index, ds)

    def fulltext_for(self, catalog: Catalog, datasource: str | None) -> FullTextView:
        if datasource is None:
            return self.fulltext
        return self._lazy.get(
            ("fulltext", datasource),
            lambda: _datasource_index(
                self.cache,
                datasource,
                self._docs_by_datasource(catalog).get(datasource, ()),
                small_store=self._small,
            ).view(),
        )

    @property
    def _small(self) -> bool:
        """Whether every replaced document is worth a rebuild (see ``_worth_rebuilding``)."""
        return len(self.fulltext) <= COMPACT_EVERY_CHANGE_UP_TO

    def warm_datasources(self, catalog: Catalog, before_each: Callable[[], None] | None = None) -> int:
        """Build the full-text index of every datasource this generation lacks (run off the request
        path after start-up, so the first question scoped to a datasource does not build one);
        returns how many were built. ``before_each`` runs before each build (it may wait)."""
        built = 0
        self._scope_ids(catalog)  # what a scoped dense channel restricts its rows to
        for ds in sorted(catalog.datasources):
            if self._lazy.peek(("fulltext", ds)) is None:
                if before_each is not None:
                    before_each()
                if self._lazy.peek(("fulltext", ds)) is None:  # a search may have built it meanwhile
                    self.fulltext_for(catalog, ds)
                    built += 1
        if self.cache is not None:
            self.cache.forget_datasources(catalog.datasources)
        return built

    def _docs_by_datasource(self, catalog: Catalog) -> dict[str, list[render.RenderedDoc]]:
        """This generation's documents per datasource scope, in one pass (not one pass per datasource)."""

        def group() -> dict[str, list[render.RenderedDoc]]:
            out: dict[str, list[render.RenderedDoc]] = {}
            for doc in in_corpus_order(catalog, self.docs):
                for ds in scope.doc_scopes(catalog, doc.canonical):
                    out.setdefault(ds, []).append(doc)
            return out

        return self._lazy.get("documents by datasource", group)

    def pieces_for(self, catalog: Catalog) -> MemoryPieceIndex:
        """Memories cut into pieces for the hybrid ranking (built once, then derived per delta)."""

        def build() -> MemoryPieceIndex:
            entries = self._memory_entries(catalog)
            if entries is None:
                return MemoryPieceIndex.build(catalog)
            return MemoryPieceIndex.build(
                catalog, {mid: (e.pieces, e.about) for mid, e in entries.by_memory.items()}
            )

        return self._lazy.get("pieces", build)

    def memory_terms_for(self, catalog: Catalog) -> MemoryTerms:
        """The memories' stems and their frequencies (built once, then derived per delta)."""

        def build() -> MemoryTerms:
            entries = self._memory_entries(catalog)
            if entries is None:
                return MemoryTerms.build(catalog)
            return MemoryTerms.build(catalog, {mid: e.stems for mid, e in entries.by_memory.items()})

        return self._lazy.get("memory terms", build)

    def _memory_entries(self, catalog: Catalog) -> memory_entries.MemoryEntries | None:
        """The memories' pieces, about texts and stems for the first piece index and terms, those of
        unchanged documents taken from the cache (``memory_entries``), which is written anew when any
        had to be read; None without a cache to take them from."""
        cache = self.cache if self.reuse else None
        if cache is None:
            return None

        def read() -> memory_entries.MemoryEntries:
            entries = memory_entries.read_entries(catalog, memory_entries.load(cache))
            if entries.fresh:
                cache.write_in_background(
                    memory_entries.FILE, lambda: memory_entries.file_of(catalog, entries)
                )
            return entries

        return self._lazy.get("memory entries", read)

    def warm(self, catalog: Catalog) -> None:
        """Build what the hybrid ranking needs (run off the request path at start-up): what every
        question needs first, then the exact-token lookup that only some need."""
        t0 = time.perf_counter()
        self.fulltext.index.prepare()
        self.lexicon_for(catalog)
        t1 = time.perf_counter()
        pieces = self.pieces_for(catalog)
        t2 = time.perf_counter()
        self.memory_terms_for(catalog)
        t3 = time.perf_counter()
        pieces.literal  # noqa: B018 - built on first use
        log.info(
            "warm-up: lexicon %.2f s, memory pieces %.2f s, memory terms %.2f s, exact tokens %.2f s",
            t1 - t0,
            t2 - t1,
            t3 - t2,
            time.perf_counter() - t3,
        )

    def lexicon_for(self, catalog: Catalog) -> Lexicon:
        """Names, values and joins of the hybrid ranking (built once, then derived per delta)."""
        return self._lazy.get("lexicon", lambda: self._first_lexicon(catalog))

    def _first_lexicon(self, catalog: Catalog) -> Lexicon:
        """The lexicon built from ``catalog``, the leaves of unchanged documents taken from the cache
        (``lexicon_entries``), which is written anew when any had to be read."""
        cache = self.cache if self.reuse else None
        rows = lexicon_entries.read_rows(catalog, lexicon_entries.load(cache) if cache is not None else None)
        if cache is not None and rows.fresh:
            cache.write_in_background(lexicon_entries.FILE, lambda: lexicon_entries.file_of(catalog, rows))
        return Lexicon.from_rows(rows)

    def graph(self, catalog: Catalog) -> GraphIndex:
        """The graph of ``catalog``, built on the first cypher_filter and brought up to date on each
        one after. Neither the build nor the update holds the graph's lock: an update waits for a
        running filter, which must not hold up the searches that use no graph."""
        with self._graph_lock:
            graph, pending = self._graph, self._graph_pending
            self._graph_pending = frozenset()
        if graph is None:
            built = GraphIndex.build(catalog)
            with self._graph_lock:
                if self._graph is None:
                    self._graph = built
                    return built
                graph = self._graph  # another request built it meanwhile
            built.close()
        if pending:  # a failed update leaves the graph to be rebuilt by the filter that follows
            graph.apply(catalog, Delta(changed=pending))
        return graph

    def close_graph(self) -> None:
        """Stop the graph's process (engine close); it is shared by every snapshot of the engine."""
        with self._graph_lock:
            graph, self._graph = self._graph, None
        if graph is not None:
            graph.close()

    def abort_graph(self) -> None:
        """Kill the graph's process without waiting for anything (a running filter fails at once)."""
        graph = self._graph
        if graph is not None:
            graph.abort()

    def scoped_memory_ids(self, catalog: Catalog, datasource: str | None) -> frozenset[str]:
        return self._cached(
            ("memory ids", datasource),
            lambda: frozenset(m.id for m in self.scoped_memories(catalog, datasource)),
        )

    def scoped_memories(self, catalog: Catalog, datasource: str | None) -> list[d.Memory]:
        """The memories a datasource filter keeps (a tag rooted at it), in storage order."""
        return self._cached(("memories", datasource), lambda: scope.scoped_memories(catalog, datasource))

    def scope_ids(self, catalog: Catalog, datasource: str) -> frozenset[str]:
        """Every searchable id in one datasource's filtered corpus (kept as one frozenset so the
        vector index caches its row positions)."""
        return self._scope_ids(catalog).get(datasource, frozenset())

    def _scope_ids(self, catalog: Catalog) -> dict[str, frozenset[str]]:
        """Every datasource's filtered corpus, in one pass over the searchable ids (one pass per
        datasource cost ~50 ms each at 1,000 models, in its first scoped search)."""

        def group() -> dict[str, frozenset[str]]:
            out: dict[str, list[str]] = {}
            for cid in catalog.searchable_ids():
                for ds in scope.doc_scopes(catalog, cid):
                    out.setdefault(ds, []).append(cid)
            return {ds: frozenset(ids) for ds, ids in out.items()}

        return self._lazy.get("scope ids", group)

    def tag_corpus(self, catalog: Catalog, datasource: str | None) -> TagCorpus:
        def build() -> TagCorpus:
            mems = self.scoped_memories(catalog, datasource)
            return TagCorpus.build(mems, scope.tag_validity(catalog, datasource, {m.id for m in mems}))

        return self._cached(("tags", datasource), build)

    def _cached(self, key: tuple[str, str | None], build: Callable[[], _T]) -> _T:
        return self._lazy.get(key, build)


def _feed_dense(worker: Any, catalog: Catalog, touched: set[str], delta: Delta) -> None:
    """Queue what a change means for channel 3: re-embed what changed (unchanged texts are skipped
    by their content hash), drop vectors of deleted entities from the store, and of entities that
    became hidden from memory only."""
    for cid in sorted(touched):
        item = item_for(catalog, cid)
        if item is not None:
            worker.enqueue(item.canonical_id, item.kind, item.text)
        else:
            worker.remove(cid, from_store=cid in delta.removed)


def _is_text_key(key: Any) -> bool:
    """Whether a ``_Lazy`` key names a datasource's full-text view (``("fulltext", ds)``)."""
    return isinstance(key, tuple) and key[0] == "fulltext"


def in_corpus_order(catalog: Catalog, docs: LayeredMap[render.RenderedDoc]) -> Iterator[render.RenderedDoc]:
    """``docs`` (the texts of ``catalog``) in its corpus order, the order a fresh start indexes them
    in: a rebuild after edits then breaks score ties as a restart would, and edits never reorder
    the corpus (a map layered by later changes keeps no order of its own for what they added)."""
    get = docs.getter()
    for cid in catalog.searchable_ids():
        doc = get(cid)
        if doc is not None:
            yield doc


def _derived(
    view: FullTextView,
    docs: Iterable[render.RenderedDoc],
    removals: list[str],
    upserts: list[render.RenderedDoc],
) -> FullTextView:
    """The next view of the whole store's index: committed by its writer when ``view`` is that
    writer's last commit (always, for the refresh), else a fresh index over ``docs``."""
    if view.index.extends(view):
        return view.index.replace(removals, upserts)
    log.info("full text: deriving from an older generation; indexing every document anew")
    return FullTextIndex(docs).view()


def _datasource_index(
    cache: StoreCache | None,
    datasource: str,
    docs: Iterable[render.RenderedDoc],
    *,
    small_store: bool = True,
    reopen: bool = True,
) -> FullTextIndex:
    """One datasource's own index over ``docs``. With a cache it lives on disk: the last run's is
    reopened and brought up to date (``reopen``) unless that replaced enough documents to be worth
    a rebuild anyway (the same policy as a compaction's), else it is built into a new directory."""
    if cache is None:
        return FullTextIndex(docs)
    docs = list(docs)
    manifest = cache.load_text_manifest(datasource) if reopen else None
    if manifest is not None:
        index = FullTextIndex.reopen(Path(manifest.directory), _state_of(manifest), manifest.opstamp)
        if index is not None:
            try:
                index.sync({doc.canonical: doc for doc in docs})
            except (ValueError, OSError) as exc:
                log.info("cached index of datasource %s not brought up to date: %s", datasource, exc)
            else:
                if not _worth_rebuilding(index.deletions, len(index), small_store):
                    _save_manifest(cache, index, datasource)
                    return index
            index.close()
    index = _persistent_index(cache, docs, datasource)
    if index is None:
        return FullTextIndex(docs)
    _save_manifest(cache, index, datasource)
    return index


def _state_of(manifest: TextManifest) -> IndexState:
    return IndexState(
        manifest.names, manifest.members, manifest.digests, manifest.memories, manifest.deletions
    )


def _persistent_index(
    cache: StoreCache, docs: Iterable[render.RenderedDoc], datasource: str | None = None
) -> FullTextIndex | None:
    path = cache.new_text_dir(datasource)
    if path is None:
        return None
    try:
        return FullTextIndex(docs, path=path)
    except (ValueError, OSError) as exc:
        log.warning("cannot build the cached full-text index in %s: %s", path, exc)
        return None


def _save_manifest(
    cache: StoreCache, index: FullTextIndex, datasource: str | None = None, *, background: bool = False
) -> None:
    """``background``: the file is written on a thread (the start's own manifest: off its path)."""
    # an unchanged index keeps its manifest
    if not cache.holds_manifest(str(index.path), index.opstamp, datasource):
        opstamp, state = index.manifest()
        manifest = TextManifest(
            format=0,  # stamped when written
            store="",
            directory=str(index.path),
            opstamp=opstamp,
            names=state.names,
            members=state.members,
            digests=state.digests,
            memories=state.memories,
            deletions=state.deletions,
        )
        cache.save_text_manifest(manifest, datasource, background=background)
    cache.collect_garbage(keep=index.path, datasource=datasource)


# A rebuild costs time in proportion to the whole index. Up to this many documents it follows every
# change (a second or less: answers stay exactly a cold start's); past it, once the replaced
# documents reach 1/COMPACT_DIVISOR of the index, so a warehouse store is not rebuilt per edit
# (its BM25 statistics drift by at most that share meanwhile).
COMPACT_EVERY_CHANGE_UP_TO = 50_000
COMPACT_DIVISOR = 200


def _worth_rebuilding(deletions: int, size: int, small_store: bool) -> bool:
    """Whether an index of ``size`` documents with ``deletions`` replaced ones is worth a rebuild
    (``small_store``: the whole store's index has at most COMPACT_EVERY_CHANGE_UP_TO documents)."""
    if small_store:
        return deletions > 0
    return deletions * COMPACT_DIVISOR >= size
