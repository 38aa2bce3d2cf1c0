"""Search: SLayer's ``search`` surface answered from warm indexes.

``SearchIndexes`` holds what is expensive to build (rendered documents, the tantivy indexes, the
Cypher graph, the tag corpora) for one catalog snapshot and derives the next one from a ``Delta``.
``search()`` is a pure function of (catalog, indexes, params) that follows SLayer's pipeline step by
step: validate, resolve inputs leniently, apply the cypher filter, scope memories, rank per channel
and kind, fuse with RRF, build hits, warn about stale example queries.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from slayer_lsp.catalog import Catalog, Delta
from slayer_lsp.catalog.ids import is_memory_ref, memory_id_of, memory_ref, rooted_at
from slayer_lsp.query.references import stale_query_warning
from slayer_lsp.search.fulltext import FullTextIndex
from slayer_lsp.search.tag_bm25 import TagCorpus
from slayer_lsp.search.types import (
    ENTITY_KINDS,
    MAX_QUESTION_CHARS,
    MAX_RESULTS_CAP,
    SearchError,
    SearchHit,
    SearchParams,
    SearchResponse,
)
from slayer_lsp.store import documents as d
from slayer_lsp.texts import render

if TYPE_CHECKING:  # imported where used: building these is what a search may never need
    from slayer_lsp.embed.worker import EmbeddingWorker
    from slayer_lsp.search.graph import GraphIndex
    from slayer_lsp.search.lexicon import Lexicon
    from slayer_lsp.search.memory_terms import MemoryTerms
    from slayer_lsp.search.piece_index import MemoryPieceIndex
    from slayer_lsp.store.cache import StoreCache

log = logging.getLogger(__name__)

_T = TypeVar("_T")

RRF_K = 60
TEXT_DEPTH = 5000  # per channel and kind; deeper ranks add < 1/5060 to a fused score
DENSE_DEPTH = 1000  # per kind: cosine ranks past this add < 1/1060


# --------------------------------------------------------------------------- indexes


def _doc_scopes(catalog: Catalog, canonical: str) -> set[str]:
    """The datasources whose filtered corpus holds this document."""
    if is_memory_ref(canonical):
        mem = catalog.memory(memory_id_of(canonical))
        if mem is None:
            return set()
        return {ds for ds in catalog.datasources if any(rooted_at(t, ds) for t in mem.entities)}
    return {canonical.split(".", 1)[0]}


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
                if not is_memory_ref(cid) and cid.count(".") == 1:
                    touched.add(cid.split(".", 1)[0])
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
                scoped = [u for u in upserts if ds in _doc_scopes(catalog, u.canonical)]
                gone = [c for c in removals if c in index] + [
                    u.canonical for u in upserts if u.canonical in index and ds not in _doc_scopes(catalog, u.canonical)]
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
        by_ds = {ds: FullTextIndex(doc for cid, doc in docs.items() if ds in _doc_scopes(catalog, cid))
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
                                      if datasource in _doc_scopes(catalog, cid))
                if not self._superseded:
                    self.by_datasource[datasource] = index
            return index

    def pieces_for(self, catalog: Catalog):  # -> MemoryPieceIndex
        """Memories cut into pieces for the hybrid ranking (built once, then updated per delta)."""
        with self._lock:
            if self._pieces is None:
                from slayer_lsp.search.piece_index import MemoryPieceIndex

                self._pieces = MemoryPieceIndex.build(catalog)
            return self._pieces

    def memory_terms_for(self, catalog: Catalog):  # -> MemoryTerms
        """The memories' stems and their frequencies (built once, then derived per delta)."""
        with self._lock:
            if self._memory_terms is None:
                from slayer_lsp.search.memory_terms import MemoryTerms

                self._memory_terms = MemoryTerms.build(catalog)
            return self._memory_terms

    def warm(self, catalog: Catalog) -> None:
        """Build what the hybrid ranking needs (run off the request path at start-up)."""
        self.lexicon_for(catalog)
        self.pieces_for(catalog)
        self.memory_terms_for(catalog)

    def lexicon_for(self, catalog: Catalog):  # -> Lexicon
        """Names, values and joins of the hybrid ranking (built once, then updated per delta)."""
        with self._lock:
            if self._lexicon is None:
                from slayer_lsp.search.lexicon import Lexicon

                self._lexicon = Lexicon.build(catalog)
            return self._lexicon

    def graph(self, catalog: Catalog):  # -> GraphIndex
        """The graph of ``catalog``, built on the first cypher_filter and brought up to date on each
        one after. Neither the build nor the update holds the indexes' lock: an update waits for a
        running filter, which must not hold up the searches that use no graph."""
        with self._lock:
            graph, pending = self._graph, self._graph_pending
            self._graph_pending = frozenset()
        if graph is None:
            from slayer_lsp.search.graph import GraphIndex

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
        return self._cached(("memories", datasource), lambda: _scoped_memories(catalog, datasource))

    def scope_ids(self, catalog: Catalog, datasource: str) -> frozenset[str]:
        """Every searchable id in one datasource's filtered corpus (kept as one frozenset so the
        vector index caches its row positions)."""
        return self._cached(("scope", datasource), lambda: frozenset(
            cid for cid in catalog.searchable_ids() if datasource in _doc_scopes(catalog, cid)))

    def tag_corpus(self, catalog: Catalog, datasource: str | None) -> TagCorpus:
        def build() -> TagCorpus:
            mems = self.scoped_memories(catalog, datasource)
            return TagCorpus.build(mems, _validity(catalog, datasource, {m.id for m in mems}))
        return self._cached(("tags", datasource), build)

    def _cached(self, key: tuple[str, str | None], build: Callable[[], _T]) -> _T:
        with self._lock:
            if key not in self._cache:
                self._cache[key] = build()
            return self._cache[key]


# --------------------------------------------------------------------------- helpers


def _feed_dense(worker: Any, catalog: Catalog, touched: set[str], delta: Delta) -> None:
    """Queue what a change means for channel 3: re-embed what changed (unchanged texts are skipped
    by their content hash), drop vectors of deleted entities from the store, and of entities that
    became hidden from memory only."""
    from slayer_lsp.texts.statements import item_for

    for cid in sorted(touched):
        item = item_for(catalog, cid)
        if item is not None:
            worker.enqueue(item.canonical_id, item.kind, item.text)
        else:
            worker.remove(cid, from_store=cid in delta.removed)


def _dense_rankings(hits: Any) -> tuple[list[str], list[str]]:
    """Channel 3's memory ranking and entity ranking (all entity kinds by cosine)."""
    memories = [memory_id_of(c) for c in hits.ids("memory")]
    entities = sorted(((score, cid) for kind, ranked in hits.by_kind.items() if kind != "memory"
                       for cid, score in ranked), key=lambda sc: -sc[0])
    return memories, [cid for _, cid in entities]


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
    from slayer_lsp.store.cache import TextManifest

    opstamp, names, members = index.manifest()
    cache.save_text_manifest(TextManifest(0, "", str(index.path), opstamp, names, members))
    cache.collect_garbage(keep=index.path)


def _scoped_memories(catalog: Catalog, datasource: str | None) -> list[d.Memory]:
    mems = list(catalog.memories.values())
    if datasource is None:
        return mems
    return [m for m in mems if any(rooted_at(t, datasource) for t in m.entities)]


def _validity(catalog: Catalog, datasource: str | None, memory_ids: Collection[str]) -> Callable[[str], bool]:
    """Which tags count in a scope: existing entities (hidden included) rooted at the datasource,
    and refs to memories that are themselves in scope."""
    entities = catalog.entities

    def valid(tag: str) -> bool:
        if is_memory_ref(tag):
            return memory_id_of(tag) in memory_ids
        return tag in entities and (datasource is None or rooted_at(tag, datasource))
    return valid


def _dedup(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))


def _resolve_inputs(catalog: Catalog, params: SearchParams) -> tuple[list[str], list[str]]:
    from slayer_lsp.query.references import extract_entities_from_query
    from slayer_lsp.query.resolver import EntityResolutionError, resolve_entity

    canonical: list[str] = []
    warnings: list[str] = []
    for raw in params.entities or []:
        try:
            res = resolve_entity(raw, catalog)
        except EntityResolutionError as exc:
            warnings.append(f"entity {raw!r} dropped: {exc}")
            continue
        canonical.append(res.canonical)
        warnings.extend(res.warnings)
    if params.query is not None:
        try:
            refs = extract_entities_from_query(params.query, catalog)
        except EntityResolutionError as exc:
            warnings.append(f"query input dropped: {exc}")
        else:
            canonical.extend(refs.canonicals)
            warnings.extend(refs.warnings)
    return _dedup(canonical), _dedup(warnings)


def _memory_hit(mem: d.Memory, score: float, inputs: list[str], valid, compact: bool) -> SearchHit:  # noqa: ANN001
    live = [t for t in mem.entities if valid(t)]
    live.append(memory_ref(mem.id))
    matched = sorted(set(inputs) & set(live)) if inputs else []
    if compact:
        return SearchHit(kind="memory", id=mem.id, score=score, text="",
                         description=render.compact_description(mem), matched_entities=matched, query=mem.query)
    return SearchHit(kind="memory", id=mem.id, score=score, text=render.memory_text(mem),
                     description=mem.description, matched_entities=matched, query=mem.query)


def _fuse(rankings: list[list[str]]) -> list[tuple[str, float]]:
    """Reciprocal Rank Fusion (k = 60), stable: ties keep first-insertion order."""
    fused: dict[str, float] = {}
    get = fused.get
    for ranking in rankings:
        for rank, key in enumerate(ranking, start=RRF_K + 1):
            fused[key] = get(key, 0.0) + 1.0 / rank
    return sorted(fused.items(), key=_neg_score)


def _neg_score(kv: tuple[str, float]) -> float:
    return -kv[1]


def _initial_depth(max_results: int) -> int:
    """How deep full-text rankings are fetched first; deeper only when the answer could change."""
    return max(100, 5 * max_results)


Ranking = tuple[list[str], Any]  # (ids best first, None when complete, else a probe: ids -> those it would hold)


def _text_ranking(index: FullTextIndex, query, *, memories: bool, allow, exact: list[str],  # noqa: ANN001
                  depth: int) -> Ranking:
    """One full-text ranking (best first; tantivy breaks score ties by insertion order, as SLayer's
    fresh index does) fetched ``depth`` deep. When deeper hits were left out, the second element
    tells which of some ids the whole ranking would hold."""
    full = min(index.kind_counts["memory" if memories else "entity"], TEXT_DEPTH)
    limit = min(full, depth)
    ranked = index.ranked_ids(query, memories=memories, limit=limit, allow=allow) if query is not None else []
    fetched = len(ranked)
    lead = [c for c in exact if (c.startswith("memory:") == memories) and (allow is None or c in allow)]
    if lead:
        ranked = lead + [c for c in ranked if c not in lead]
    if not fetched == limit < full:
        return ranked, None
    return ranked, lambda ids: index.matching(query, ids, memories=memories) & (allow or ids)


def _fused_hits(rankings: list[Ranking], depth: int, build, max_results: int  # noqa: ANN001
                ) -> list[SearchHit] | None:
    """Fuse and cut to ``max_results``; None when rankings fetched only ``depth`` deep could still
    change the answer, in which case the caller fetches everything. A document missing from a
    truncated ranking gains at most 1/(k+depth+1) from it, and nothing when the ranking cannot hold
    it (memory rankings hold no entities; a document the query does not match). So the answer is
    always the full ranking's whatever ``max_results`` is: the cut never reorders what is above it."""
    fused = _fuse([r for r, _ in rankings])
    results: list[SearchHit] = []
    picked: list[int] = []
    for i, (key, score) in enumerate(fused):
        hit = build(key, score)
        if hit is not None:
            results.append(hit)
            picked.append(i)
            if len(results) >= max_results:
                break
    partial = [(is_memory_ref(r[0]), set(r), probe) for r, probe in rankings if probe is not None]
    if not partial:
        return results
    if len(results) < max_results:
        return None
    gap = 1.0 / (RRF_K + depth + 1)
    widest = max(sum(1 for m, _, _ in partial if m is group) for group in (True, False))
    last = fused[picked[-1]][1]
    if last <= gap * widest:  # a document no fetched ranking holds could still overtake
        return None
    close = [fused[p] for p in picked] + [kv for kv in fused[picked[-1] + 1:] if kv[1] + gap * widest >= last]
    held: dict[int, set[str]] = {}  # per truncated ranking: which close documents it would hold
    for n, (mem, seen, probe) in enumerate(partial):
        want = {k for k, _ in close if is_memory_ref(k) is mem and k not in seen}
        held[n] = probe(want) if want else set()

    def slack(key: str) -> float:  # how much a key's true score may exceed its fused one
        return gap * sum(1 for n in held if key in held[n])

    for a, b in zip(picked, picked[1:], strict=False):
        (_, sa), (kb, sb) = fused[a], fused[b]
        if slack(kb) and sa <= sb + slack(kb):
            return None
    return results if all(s + slack(k) < last for k, s in close[len(picked):]) else None


# --------------------------------------------------------------------------- the search


@dataclass
class Request:
    """A search request after the steps both rankings share: validated, inputs resolved leniently,
    the cypher filter run, memories scoped. What is not allowed here can never be ranked."""

    params: SearchParams
    max_results: int
    datasource: str | None
    question: str | None  # None or blank: no channels 2 and 3
    inputs: list[str]  # resolved canonical ids (channel 1)
    warnings: list[str]
    candidate_ids: frozenset[str] | None  # the cypher filter's allowlist
    kind_filter: set[str] | None  # kinds that may come back (cypher label fallback, ``kinds``)
    scoped: list[d.Memory]  # memories the datasource and cypher filters keep, in storage order
    scoped_ids: frozenset[str] | set[str]
    valid: Callable[[str], bool]  # which tags count in this scope

    @property
    def has_question(self) -> bool:
        return bool(self.question and self.question.strip())

    def memory_allowed(self) -> bool:
        return self.kind_filter is None or "memory" in self.kind_filter


def _validate(params: SearchParams, catalog: Catalog) -> tuple[int, str | None, list[str]]:
    warnings: list[str] = []
    max_results = params.limit if params.limit is not None else params.max_results
    if max_results < 1:
        raise SearchError(f"max_results must be >= 1; got {max_results}.")
    if max_results > MAX_RESULTS_CAP:
        warnings.append(f"max_results {max_results} is above the cap; returning at most {MAX_RESULTS_CAP}.")
        max_results = MAX_RESULTS_CAP
    ds = params.datasource
    if ds is not None and ds not in catalog.datasources:
        raise SearchError(f"datasource {ds!r} not found; known: {sorted(catalog.datasources)}.")
    if params.kinds is not None:
        unknown = sorted(set(params.kinds) - set(ENTITY_KINDS))
        if unknown:
            raise SearchError(f"unknown kinds {unknown}; known: {list(ENTITY_KINDS)}.")
    if params.ranking == "slayer":
        extra = [f for f in ("keyword", "facet") if getattr(params, f) is not None]
        extra += ["related"] if params.related else []
        if extra:
            raise SearchError(f"{', '.join(extra)} need ranking 'hybrid'; ranking 'slayer' is SLayer's surface.")
    if params.related < 0:
        raise SearchError(f"related must be >= 0; got {params.related}.")
    return max_results, ds, warnings


def search(catalog: Catalog, indexes: SearchIndexes, params: SearchParams,
           cancel: threading.Event | None = None) -> SearchResponse:
    """Answer one search: the shared steps, then the chosen ranking, then the narrowing by score.
    ``cancel``, once set, stops a running cypher_filter (the request was cancelled)."""
    max_results, ds, warnings = _validate(params, catalog)
    question = params.question
    if question is not None and len(question) > MAX_QUESTION_CHARS:
        warnings.append(f"question cut to its first {MAX_QUESTION_CHARS} characters.")
        question = question[:MAX_QUESTION_CHARS]

    inputs, resolve_warnings = _resolve_inputs(catalog, params)
    warnings.extend(resolve_warnings)
    channel1 = bool(params.entities) or params.query is not None
    has_question = bool(question and question.strip())

    candidate_ids, kind_filter = _apply_cypher(catalog, indexes, params.cypher_filter, warnings, cancel)
    if params.kinds is not None:
        kind_filter = set(params.kinds) if kind_filter is None else kind_filter & set(params.kinds)
    if candidate_ids is not None and not candidate_ids:
        warnings.append("cypher_filter returned no matching nodes; search returned no results.")
        return SearchResponse(results=[], resolved_input_entities=inputs, warnings=_dedup(warnings))
    if kind_filter is not None and "memory" not in kind_filter:
        warnings.extend(f"{c} excluded by cypher_filter kind filter (allowed kinds: {sorted(kind_filter)!r})."
                        for c in inputs if is_memory_ref(c))

    keyword = params.ranking == "hybrid" and bool(params.keyword and params.keyword.strip())
    if not channel1 and not has_question and not keyword:
        return _recency(catalog, ds, candidate_ids, kind_filter, max_results, warnings, params.compact)

    scoped = indexes.scoped_memories(catalog, ds)
    scoped_ids: frozenset[str] | set[str] = indexes.scoped_memory_ids(catalog, ds)
    if ds is not None:
        warnings.extend(f"{c} is not rooted at datasource {ds!r}; dropped." for c in inputs
                        if is_memory_ref(c) and memory_id_of(c) not in scoped_ids)
    if candidate_ids is not None:
        scoped = [m for m in scoped if memory_ref(m.id) in candidate_ids]
        scoped_ids = {m.id for m in scoped}
        warnings.extend(f"{c!r} excluded by cypher_filter." for c in inputs
                        if is_memory_ref(c) and c not in candidate_ids)
    valid = _validity(catalog, ds, scoped_ids)
    req = Request(params, max_results, ds, question, inputs, warnings, candidate_ids, kind_filter,
                  scoped, scoped_ids, valid)
    if params.ranking == "slayer":
        results = _slayer_ranking(catalog, indexes, req)
    else:
        from slayer_lsp.search import hybrid

        results = hybrid.rank(catalog, indexes, req)
    if params.min_score is not None:
        results = [h for h in results if h.score >= params.min_score]
    _warn_stale_queries(catalog, req, results)
    return SearchResponse(results=results, resolved_input_entities=inputs, warnings=_dedup(req.warnings))


def _slayer_ranking(catalog: Catalog, indexes: SearchIndexes, req: Request) -> list[SearchHit]:
    """SLayer 1.4.1's ranking: channels per kind fused with RRF (k = 60), the cut exact."""
    ds, question, inputs, warnings = req.datasource, req.question, req.inputs, req.warnings
    candidate_ids, kind_filter, valid = req.candidate_ids, req.kind_filter, req.valid
    scoped, scoped_ids, has_question, max_results = req.scoped, req.scoped_ids, req.has_question, req.max_results
    named, named_warnings = _named_ranking(catalog, inputs, ds, candidate_ids)
    warnings.extend(named_warnings)

    memory_rankings: list[list[str]] = []
    entity_rankings: list[list[str]] = [named]
    if inputs:  # channel 1: tags
        corpus = (indexes.tag_corpus(catalog, ds) if candidate_ids is None
                  else TagCorpus.build(scoped, valid))
        ranked = [mid for mid, _ in corpus.rank(inputs)]
        named_mems = [memory_id_of(c) for c in inputs if is_memory_ref(c) and memory_id_of(c) in scoped_ids]
        lead = [m for m in named_mems if m in ranked]  # a named memory leads its own ranking
        memory_rankings.append(lead + [m for m in ranked if m not in lead])
    if has_question:  # channels 2 and 3
        assert question is not None
        index = indexes.fulltext_for(catalog, ds)
        query = index.parse(question)
        exact = index.exact_ids(question)
        mem_allow = frozenset(memory_ref(m) for m in scoped_ids) if candidate_ids is not None else None
        ent_allow = _entity_allow(candidate_ids, kind_filter)
        if indexes.dense is not None:  # channel 3: restricted before ranking to what may come back
            allow = indexes.scope_ids(catalog, ds) if ds is not None else None
            if candidate_ids is not None:
                allowed = frozenset(c for c in candidate_ids if not is_memory_ref(c)) | mem_allow  # type: ignore[operator]
                allow = allowed if allow is None else allow & allowed
            hits = indexes.dense.search(question, k=DENSE_DEPTH, allow=allow)
            warnings.extend(hits.warnings)
            dense_memories, dense_entities = _dense_rankings(hits)

    def rankings(depth: int) -> list[Ranking]:
        mems: list[Ranking] = [([memory_ref(m) for m in r], None) for r in memory_rankings]
        ents: list[Ranking] = [(r, None) for r in entity_rankings]
        if has_question:
            mems.append(_text_ranking(index, query, memories=True, allow=mem_allow, exact=exact, depth=depth))
            ents.append(_text_ranking(index, query, memories=False, allow=ent_allow, exact=exact, depth=depth))
            if indexes.dense is not None:
                mems.append(([memory_ref(m) for m in dense_memories], None))
                ents.append((dense_entities, None))
        return [r for r in mems + ents if r[0]]

    def build(key: str, score: float) -> SearchHit | None:
        return _hit(catalog, indexes, key, score, inputs, valid, candidate_ids, kind_filter, req.params.compact)

    depth = _initial_depth(max_results)
    results = _fused_hits(rankings(depth), depth, build, max_results)
    while results is None:  # deeper until the answer is certain (the full depth always is)
        depth = TEXT_DEPTH if depth * 10 >= TEXT_DEPTH else depth * 10
        results = _fused_hits(rankings(depth), depth, build, max_results)
    return results


def _warn_stale_queries(catalog: Catalog, req: Request, results: list[SearchHit]) -> None:
    """SLayer warns about each returned or named memory whose example query no longer resolves."""
    warned: set[str] = set()
    for hit in results:
        if hit.kind == "memory" and hit.query is not None:
            mem = catalog.memory(hit.id)
            if mem is not None and (w := stale_query_warning(catalog, mem)):
                req.warnings.append(w)
            warned.add(hit.id)
    for c in req.inputs:
        if is_memory_ref(c) and memory_id_of(c) in req.scoped_ids and memory_id_of(c) not in warned:
            mem = catalog.memory(memory_id_of(c))
            if mem is not None and (w := stale_query_warning(catalog, mem)):
                req.warnings.append(w)


_LABEL_KINDS = {"memory": "memory", "datasource": "datasource", "model": "model", "column": "column",
                "measure": "measure", "aggregation": "aggregation"}


def _entity_allow(candidate_ids: frozenset[str] | None, kind_filter: set[str] | None) -> frozenset[str] | None:
    if candidate_ids is None:
        return None
    return frozenset(c for c in candidate_ids if not is_memory_ref(c))


def _apply_cypher(catalog: Catalog, indexes: SearchIndexes, cypher: str | None, warnings: list[str],
                  cancel: threading.Event | None = None) -> tuple[frozenset[str] | None, set[str] | None]:
    """Run the cypher filter: an id allowlist from the graph, or (graph unavailable) a kind filter
    from the naive label form."""
    if cypher is None:
        return None, None
    from slayer_lsp.search.cypher_filter import parse_label_filter, validate_cypher
    from slayer_lsp.search.cypher_lexer import CypherFilterError

    if indexes.graph_enabled:
        try:  # a refused filter is refused before the graph is built for it
            validate_cypher(cypher)
        except CypherFilterError as exc:
            raise SearchError(f"cypher_filter rejected: {exc}") from exc
        try:
            graph = indexes.graph(catalog)
        except CypherFilterError as exc:  # the graph was closed under us (shutdown)
            raise SearchError(f"cypher_filter rejected: {exc}") from exc
        except ImportError as exc:
            log.warning("LadybugDB unavailable, using the label-only cypher fallback: %s", exc)
        else:
            try:
                return frozenset(graph.run(cypher, cancel=cancel)), None
            except CypherFilterError as exc:
                raise SearchError(f"cypher_filter rejected: {exc}") from exc
    kinds = parse_label_filter(cypher)
    if kinds is None:
        raise SearchError("cypher_filter is too complex for the label-only fallback "
                          "(MATCH (v:Label[:Label]) RETURN v.id AS id); the graph is unavailable.")
    return None, set(kinds)


def _named_ranking(catalog: Catalog, inputs: list[str], ds: str | None,
                   candidate_ids: frozenset[str] | None) -> tuple[list[str], list[str]]:
    """Each named entity surfaces as itself (channel 1's entity side), unless a filter drops it."""
    ranking: list[str] = []
    warnings: list[str] = []
    for c in inputs:
        if is_memory_ref(c):
            continue
        if candidate_ids is not None and c not in candidate_ids:
            warnings.append(f"entity {c!r} excluded by cypher_filter.")
            continue
        if ds is not None and not rooted_at(c, ds):
            warnings.append(f"entity {c!r} is not rooted at datasource {ds!r}; dropped from entities bucket.")
            continue
        ent = catalog.get(c)
        if ent is None:
            warnings.append(f"entity {c!r} resolved but is no longer present in storage; "
                            "dropped from entities bucket.")
            continue
        if ent.hidden:
            where = "model" if ent.model is not None and ent.model.hidden else "column"
            warnings.append(f"entity {c!r} is on a hidden {where}; dropped from entities bucket.")
            continue
        ranking.append(c)
    return ranking, warnings


def _hit(catalog: Catalog, indexes: SearchIndexes, key: str, score: float, inputs: list[str], valid,  # noqa: ANN001
         candidate_ids: frozenset[str] | None, kind_filter: set[str] | None, compact: bool) -> SearchHit | None:
    if candidate_ids is not None and key not in candidate_ids:
        return None
    if is_memory_ref(key):
        if kind_filter is not None and "memory" not in kind_filter:
            return None
        mem = catalog.memory(memory_id_of(key))
        return _memory_hit(mem, score, inputs, valid, compact) if mem is not None else None
    doc = indexes.docs.get(key)
    if doc is None:
        return None
    if kind_filter is not None and doc.kind not in kind_filter:
        return None
    return SearchHit(kind=doc.kind, id=key, score=score, text="" if compact else doc.text,
                     description=doc.description)


def _recency(catalog: Catalog, ds: str | None, candidate_ids: frozenset[str] | None,
             kind_filter: set[str] | None, max_results: int, warnings: list[str],
             compact: bool) -> SearchResponse:
    """No entities, query or question: the newest memories, scoped like a search."""
    warnings.append("no entities, query, or question supplied; returning newest memories by recency.")
    mems = _scoped_memories(catalog, ds)
    had_any = bool(mems)
    if candidate_ids is not None:
        mems = [m for m in mems if memory_ref(m.id) in candidate_ids]
    if kind_filter is not None and "memory" not in kind_filter:
        mems = []
    if had_any and not mems and (candidate_ids is not None or kind_filter is not None):
        warnings.append("cypher_filter excluded all memory candidates for the empty-input recency "
                        "fallback; no results.")
    mems.sort(key=lambda m: m.created_at, reverse=True)
    valid = _validity(catalog, ds, {m.id for m in mems})
    hits = [_memory_hit(m, 0.0, [], valid, compact) for m in mems[:max_results]]
    for h in hits:
        if h.query is not None and (w := stale_query_warning(catalog, catalog.memory(h.id))):  # type: ignore[arg-type]
            warnings.append(w)
    return SearchResponse(results=hits, resolved_input_entities=[], warnings=_dedup(warnings))
