"""The warm indexes of one catalog snapshot, and how a ``Delta`` brings them to the next.

``SearchIndexes`` holds what is expensive to build: the rendered documents, the tantivy indexes
(the whole store's and, on first use, one per datasource), the Cypher graph, the lexicon, the
memory pieces and terms, and per-scope tag corpora. ``apply`` derives the next snapshot's indexes
from a delta, re-rendering only the touched documents; ``rebuilt`` makes fresh full-text indexes
off the request path. Rankings read these; nothing here ranks.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from slayer_lsp.catalog import Catalog, Delta
from slayer_lsp.catalog.ids import datasource_of, is_model_id
from slayer_lsp.search import scope
from slayer_lsp.search.fulltext import FullTextIndex
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


@dataclass
class SearchIndexes:
    """Warm indexes for one catalog snapshot. ``apply`` mutates the tantivy indexes in place and
    returns the object for the next snapshot (the engine swaps it in with the catalog)."""

    docs: dict[str, render.RenderedDoc]  # every searchable (visible) document
    fulltext: FullTextIndex
    by_datasource: dict[str, FullTextIndex]  # built on first use, then kept up to date
    graph_enabled: bool = True
    _graph: GraphIndex | None = None
    cache: StoreCache | None = None
    dense: EmbeddingWorker | None = None  # channel 3
    _graph_pending: frozenset[str] = frozenset()  # ids touched since the graph was last brought up to date
    ram_live: bool = False  # a long-lived engine keeps the live full-text index in memory (see rebuilt)
    _lexicon: Lexicon | None = None  # built on the first hybrid search, then kept up to date
    _pieces: MemoryPieceIndex | None = None  # likewise
    _memory_terms: MemoryTerms | None = None  # of this snapshot, derived per delta
    # Set once ``apply`` derived the next snapshot: the dicts of lazily built indexes are shared with
    # it, and an index built from this snapshot's documents must not be left there for it.
    _superseded: bool = False
    _lock: threading.RLock = field(default_factory=threading.RLock)
    _cache: dict[Any, Any] = field(default_factory=dict)  # per-snapshot derived values

    @classmethod
    def build(cls, catalog: Catalog, *, graph: bool = True, cache: Any = None) -> SearchIndexes:
        docs: dict[str, render.RenderedDoc] = {}
        for cid in catalog.searchable_ids():
            doc = render.render_entity(catalog, cid)
            if doc is not None:
                docs[cid] = doc
        fulltext = None
        if cache is not None:
            manifest = cache.load_text_manifest()
            if manifest is not None:
                fulltext = FullTextIndex.reopen(Path(manifest.directory), manifest.names, manifest.members,
                                                manifest.opstamp)
            if fulltext is not None:
                fulltext.sync(docs)  # only documents whose text changed since the last run
            else:
                fulltext = _persistent_index(cache, docs)
            if fulltext is not None:
                _save_manifest(cache, fulltext)
        return cls(docs, fulltext or FullTextIndex(docs.values()), {}, graph, cache=cache)

    def apply(self, catalog: Catalog, delta: Delta) -> SearchIndexes:
        with self._lock:
            touched = set(delta.touched)
            for cid in delta.touched:  # a datasource document lists its models
                if is_model_id(cid):
                    touched.add(datasource_of(cid))
            docs = dict(self.docs)
            upserts: list[render.RenderedDoc] = []
            removals: list[str] = []
            for cid in sorted(touched):
                doc = render.render_entity(catalog, cid) if _is_visible(catalog, cid) else None
                if doc is None:
                    if docs.pop(cid, None) is not None:
                        removals.append(cid)
                elif docs.get(cid) != doc:
                    docs[cid] = doc
                    upserts.append(doc)
            self.fulltext.replace(removals, upserts)
            for ds, index in list(self.by_datasource.items()):
                if ds not in catalog.datasources:
                    del self.by_datasource[ds]
                    continue
                scoped = [u for u in upserts if ds in scope.doc_scopes(catalog, u.canonical)]
                gone = [c for c in removals if c in index] + [
                    u.canonical for u in upserts
                    if u.canonical in index and ds not in scope.doc_scopes(catalog, u.canonical)]
                index.replace(gone, scoped)
            if self.dense is not None:
                _feed_dense(self.dense, catalog, touched, delta)
            # the graph catches up on the next cypher_filter, not on every edit
            pending = self._graph_pending | delta.touched if self._graph is not None else frozenset()
            lexicon = self._lexicon.apply(catalog, delta) if self._lexicon is not None else None
            pieces = self._pieces.apply(catalog, delta) if self._pieces is not None else None
            terms = self._memory_terms.derive(catalog, delta) if self._memory_terms is not None else None
            self._superseded = True
            return SearchIndexes(docs, self.fulltext, self.by_datasource, self.graph_enabled, self._graph,
                                 cache=self.cache, dense=self.dense, _graph_pending=frozenset(pending),
                                 ram_live=self.ram_live, _lexicon=lexicon, _pieces=pieces, _memory_terms=terms,
                                 _lock=self._lock)

    @property
    def needs_compaction(self) -> bool:
        """Replaced or deleted documents linger in tantivy's BM25 statistics, so scores drift a
        little from a fresh build until the index is rebuilt."""
        stale = any(ix.deletions for ix in (self.fulltext, *self.by_datasource.values()))
        stale = stale or bool(self._pieces is not None and self._pieces.deletions)
        return stale or (self.ram_live and self.fulltext.path is not None)

    def rebuilt(self, catalog: Catalog) -> SearchIndexes:
        """Fresh full-text indexes over the same documents (run off the request path). With
        ``ram_live`` the live index is kept in memory, so edits commit without an fsync, and the
        on-disk cache gets a separate snapshot that the next start reopens and brings up to date."""
        with self._lock:
            docs = dict(self.docs)
            scopes = list(self.by_datasource)
        by_ds = {ds: FullTextIndex(doc for cid, doc in docs.items() if ds in scope.doc_scopes(catalog, cid))
                 for ds in scopes if ds in catalog.datasources}
        snapshot = _persistent_index(self.cache, docs) if self.cache is not None else None
        if snapshot is not None:
            _save_manifest(self.cache, snapshot)
        if self.ram_live or snapshot is None:
            del snapshot  # releases its writer lock; the directory stays as the cache
            live = FullTextIndex(docs.values())
        else:
            live = snapshot
        pieces = self._pieces.rebuilt() if self._pieces is not None else None
        return SearchIndexes(docs, live, by_ds, self.graph_enabled, self._graph, cache=self.cache,
                             dense=self.dense, _graph_pending=self._graph_pending, ram_live=self.ram_live,
                             _lexicon=self._lexicon, _pieces=pieces, _memory_terms=self._memory_terms)

    def save_cache(self) -> None:
        """Record the live index's state so the next start reopens it (after incremental updates)."""
        if self.cache is not None and self.fulltext.path is not None:
            _save_manifest(self.cache, self.fulltext)

    def fulltext_for(self, catalog: Catalog, datasource: str | None) -> FullTextIndex:
        if datasource is None:
            return self.fulltext
        with self._lock:
            index = self.by_datasource.get(datasource)
            if index is None:
                index = FullTextIndex(doc for cid, doc in self.docs.items()
                                      if datasource in scope.doc_scopes(catalog, cid))
                if not self._superseded:
                    self.by_datasource[datasource] = index
            return index

    def pieces_for(self, catalog: Catalog) -> MemoryPieceIndex:
        """Memories cut into pieces for the hybrid ranking (built once, then updated per delta)."""
        with self._lock:
            if self._pieces is None:
                self._pieces = MemoryPieceIndex.build(catalog)
            return self._pieces

    def memory_terms_for(self, catalog: Catalog) -> MemoryTerms:
        """The memories' stems and their frequencies (built once, then derived per delta)."""
        with self._lock:
            if self._memory_terms is None:
                self._memory_terms = MemoryTerms.build(catalog)
            return self._memory_terms

    def warm(self, catalog: Catalog) -> None:
        """Build what the hybrid ranking needs (run off the request path at start-up)."""
        self.lexicon_for(catalog)
        self.pieces_for(catalog)
        self.memory_terms_for(catalog)

    def lexicon_for(self, catalog: Catalog) -> Lexicon:
        """Names, values and joins of the hybrid ranking (built once, then updated per delta)."""
        with self._lock:
            if self._lexicon is None:
                self._lexicon = Lexicon.build(catalog)
            return self._lexicon

    def graph(self, catalog: Catalog) -> GraphIndex:
        """The graph of ``catalog``, built on the first cypher_filter and brought up to date on each
        one after. Neither the build nor the update holds the indexes' lock: an update waits for a
        running filter, which must not hold up the searches that use no graph."""
        with self._lock:
            graph, pending = self._graph, self._graph_pending
            self._graph_pending = frozenset()
        if graph is None:
            built = GraphIndex.build(catalog)
            with self._lock:
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
        with self._lock:
            graph, self._graph = self._graph, None
        if graph is not None:
            graph.close()

    def abort_graph(self) -> None:
        """Kill the graph's process without waiting for anything (a running filter fails at once)."""
        graph = self._graph
        if graph is not None:
            graph.abort()

    def scoped_memory_ids(self, catalog: Catalog, datasource: str | None) -> frozenset[str]:
        return self._cached(("memory ids", datasource),
                            lambda: frozenset(m.id for m in self.scoped_memories(catalog, datasource)))

    def scoped_memories(self, catalog: Catalog, datasource: str | None) -> list[d.Memory]:
        """The memories a datasource filter keeps (a tag rooted at it), in storage order."""
        return self._cached(("memories", datasource), lambda: scope.scoped_memories(catalog, datasource))

    def scope_ids(self, catalog: Catalog, datasource: str) -> frozenset[str]:
        """Every searchable id in one datasource's filtered corpus (kept as one frozenset so the
        vector index caches its row positions)."""
        return self._cached(("scope", datasource), lambda: frozenset(
            cid for cid in catalog.searchable_ids() if datasource in scope.doc_scopes(catalog, cid)))

    def tag_corpus(self, catalog: Catalog, datasource: str | None) -> TagCorpus:
        def build() -> TagCorpus:
            mems = self.scoped_memories(catalog, datasource)
            return TagCorpus.build(mems, scope.tag_validity(catalog, datasource, {m.id for m in mems}))
        return self._cached(("tags", datasource), build)

    def _cached(self, key: tuple[str, str | None], build: Callable[[], _T]) -> _T:
        with self._lock:
            if key not in self._cache:
                self._cache[key] = build()
            return self._cache[key]


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


def _persistent_index(cache: Any, docs: dict[str, render.RenderedDoc]) -> FullTextIndex | None:
    path = cache.new_text_dir()
    if path is None:
        return None
    try:
        return FullTextIndex(docs.values(), path=path)
    except (ValueError, OSError) as exc:
        log.warning("cannot build the cached full-text index in %s: %s", path, exc)
        return None


def _save_manifest(cache: Any, index: FullTextIndex) -> None:
    opstamp, names, members = index.manifest()
    cache.save_text_manifest(TextManifest(0, "", str(index.path), opstamp, names, members))
    cache.collect_garbage(keep=index.path)
