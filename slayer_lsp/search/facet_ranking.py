"""Facet rankings: rank entities by one facet, or by several facets at once by their weakest.

A facet (declared per kind in ``texts.facets``) is one part of an entity, embedded and indexed on
its own, so a query about a column's values is not diluted by its description. ``rank_by_facet``
ranks one facet (the ``facet`` parameter of ``slayer/search``); ``search_facets`` (the
``slayer/searchFacets`` request) takes a query per facet and ranks the entities of one kind that
have every named facet by their weakest facet score: a close match on one part does not make up for
a poor match on another. Each facet is ranked to ``depth`` entities and only entities in every
facet's ranking are combined, so combine within a scope (``datasource``) small enough to be ranked
whole, or raise ``depth``.

Two channels, one per call:

* dense, when the daemon's dense channel runs and the facet's part vectors are there (the part
  worker, ``EmbeddingWorker.parts``): the score is the cosine similarity of the query's vector and
  the facet's vector, in [-1, 1];
* lexical otherwise (dense off, or the part vectors not embedded yet): tantivy BM25 over the facet
  texts of the kind, divided by the best BM25 of that ranking, so the best match scores 1 and the
  facets of one call share a scale.

Scores are not comparable across queries, channels, embedding models or stores; there is no cutoff
unless ``min_score`` gives one, and a threshold belongs to one caller, one model and one kind of
query. Candidates are restricted before ranking (``allow``, the datasource's scope): an entity
outside them never takes a place.
"""

from __future__ import annotations

import math
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from slayer_lsp.catalog import Catalog
from slayer_lsp.catalog.ids import is_memory_ref, memory_id_of
from slayer_lsp.search.types import MAX_QUESTION_CHARS, MAX_RESULTS_CAP, SearchError, SearchHit
from slayer_lsp.texts import render
from slayer_lsp.texts.facets import FACETS, facet_names, facet_texts, kinds_with
from slayer_lsp.texts.parts import owner_of, part_id, part_kind

DEFAULT_DEPTH = 500
MAX_DEPTH = 5000
CHANNELS = ("auto", "dense", "lexical")


# --------------------------------------------------------------------------- wire shapes


class SearchFacetsParams(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``slayer/searchFacets``: a query per facet (``{"meaning": "customer", "values": "SME, KAM"}``)
    for the entities of one ``kind``; ``limit`` hits (default 10, capped at 1000); ``min_score``
    drops weaker hits (no cutoff by default); ``datasource`` restricts to one datasource's entities
    (and memories tagged under it); each facet is ranked ``depth`` deep (default 500, at most
    5000); ``compact`` as in ``slayer/search``."""

    facets: dict[str, str]
    kind: str
    limit: int = 10
    min_score: float | None = None
    datasource: str | None = None
    depth: int = DEFAULT_DEPTH
    compact: bool = True


class FacetHit(SearchHit, kw_only=True):
    """A hit of ``slayer/search`` plus each named facet's own score (``score`` is the weakest)."""

    facet_scores: dict[str, float] = {}


class SearchFacetsResponse(msgspec.Struct, kw_only=True):
    results: list[FacetHit] = []
    channel: str = ""  # "dense" (cosine) or "lexical" (BM25 relative to each facet's best match)
    warnings: list[str] = []


def parse_facets_params(raw: Any) -> SearchFacetsParams:
    """Decode untrusted params; raises ``SearchError`` with the reason."""
    try:
        return msgspec.convert(raw, SearchFacetsParams)
    except msgspec.ValidationError as exc:
        raise SearchError(f"invalid searchFacets parameters: {exc}") from exc


# --------------------------------------------------------------------------- one facet


@dataclass(frozen=True)
class FacetRanking:
    """One facet's ranking: ``(canonical id, score)`` best first (memories as ``memory:<id>``),
    restricted before ranking; ``truncated`` when ``depth`` cut it (more entities may have the
    facet and match)."""

    facet: str
    ranked: list[tuple[str, float]]
    channel: str  # "dense" | "lexical"
    warnings: list[str] = field(default_factory=list)
    truncated: bool = False

    def ids(self) -> list[str]:
        return [cid for cid, _ in self.ranked]


def facet_kinds(facet: str, kinds: Iterable[str] | None = None) -> list[str]:
    """The kinds (of ``kinds``, default all) that declare ``facet``; ``SearchError`` when none."""
    declaring = kinds_with(facet)
    if not declaring:
        raise SearchError(f"unknown facet {facet!r}; facets: {', '.join(facet_names())}.")
    if kinds is None:
        return declaring
    wanted = set(kinds)
    out = [k for k in declaring if k in wanted]
    if not out:
        raise SearchError(
            f"facet {facet!r} is not declared by kind(s) {sorted(wanted)}; "
            f"it is declared by {', '.join(declaring)}."
        )
    return out


def rank_by_facet(
    catalog: Catalog,
    indexes: Any,
    facet: str,
    query: str,
    *,
    kinds: Iterable[str] | None = None,
    allow: frozenset[str] | None = None,
    datasource: str | None = None,
    depth: int = DEFAULT_DEPTH,
    channel: str = "auto",
) -> FacetRanking:
    """Rank the entities of ``kinds`` (default: every kind declaring ``facet``) by ``facet`` alone.

    ``indexes`` is the search's ``SearchIndexes`` (its ``dense`` worker's ``parts`` holds the part
    vectors; its ``scope_ids`` a datasource's ids). ``allow`` (canonical ids, ``memory:<id>`` for
    memories) and ``datasource`` restrict the candidates before ranking. Each kind is ranked
    ``depth`` deep; kinds are merged by score. ``channel``: "auto" (dense when the part vectors of
    every kind's facet are there, else lexical), "dense" (falls back to lexical with a warning) or
    "lexical". Raises ``SearchError`` for an unknown facet or one no given kind declares."""
    if channel not in CHANNELS:
        raise SearchError(f"channel must be one of {', '.join(CHANNELS)}; got {channel!r}.")
    wanted = facet_kinds(facet, kinds)
    depth = max(1, min(int(depth), MAX_DEPTH))
    owners = _scope(catalog, indexes, allow, datasource)
    warnings: list[str] = []
    if not query or not query.strip():
        return FacetRanking(facet, [], "lexical", warnings)
    if len(query) > MAX_QUESTION_CHARS:
        warnings.append(f"facet {facet!r}: query cut to its first {MAX_QUESTION_CHARS} characters.")
        query = query[:MAX_QUESTION_CHARS]
    use_dense, why = _dense_ready(indexes, [part_kind(k, facet) for k in wanted], channel)
    if why:
        warnings.append(why)
    if use_dense:
        ranking = _dense_ranking(indexes, facet, query, wanted, owners, depth, warnings)
        if ranking is not None:
            return ranking
    return _lexical_ranking(catalog, facet, query, wanted, owners, depth, warnings)


def _scope(
    catalog: Catalog, indexes: Any, allow: frozenset[str] | None, datasource: str | None
) -> frozenset[str] | None:
    if datasource is None:
        return allow
    if datasource not in catalog.datasources:
        raise SearchError(f"datasource {datasource!r} not found; known: {sorted(catalog.datasources)}.")
    scope = indexes.scope_ids(catalog, datasource)
    return scope if allow is None else scope & allow


def _parts_worker(indexes: Any) -> Any:
    return getattr(getattr(indexes, "dense", None), "parts", None)


def _dense_ready(indexes: Any, part_kinds: list[str], channel: str) -> tuple[bool, str | None]:
    """Whether the dense channel can rank these part kinds, and a warning when it was asked for
    (or is on) but cannot."""
    if channel == "lexical":
        return False, None
    parts = _parts_worker(indexes)
    if parts is None:
        if channel == "dense" or getattr(indexes, "dense", None) is not None:
            return (
                False,
                "facets: no part vectors (the dense channel or its part worker is off); ranked lexically",
            )
        return False, None
    counts = parts.index.kind_counts()
    missing = [k for k in part_kinds if not counts.get(k)]
    if missing:
        return False, f"facets: no part vectors of {', '.join(missing)} yet; ranked lexically"
    return True, None


_PART_ALLOW: OrderedDict[tuple[str, frozenset[str]], frozenset[str]] = OrderedDict()
_PART_ALLOW_LOCK = threading.Lock()


def _part_allow(facet: str, owners: frozenset[str]) -> frozenset[str]:
    """The part ids of ``owners`` for one facet, one frozenset per (facet, scope) kept in a small
    LRU, so that the vector index's cache of row positions hits for a scope used again."""
    key = (facet, owners)
    with _PART_ALLOW_LOCK:
        hit = _PART_ALLOW.get(key)
        if hit is not None:
            _PART_ALLOW.move_to_end(key)
            return hit
    made = frozenset(part_id(c, facet) for c in owners)
    with _PART_ALLOW_LOCK:
        _PART_ALLOW[key] = made
        while len(_PART_ALLOW) > 8:
            _PART_ALLOW.popitem(last=False)
    return made


def _dense_ranking(
    indexes: Any,
    facet: str,
    query: str,
    kinds: list[str],
    owners: frozenset[str] | None,
    depth: int,
    warnings: list[str],
) -> FacetRanking | None:
    """Cosine over the facet's part vectors; None (with a warning) when the query cannot be embedded."""
    worker = indexes.dense
    parts = worker.parts
    try:
        vec = worker.embed_query(query)
    except Exception as exc:  # any provider failure falls back to the lexical channel
        warnings.append(f"facets: the query could not be embedded ({exc}); ranked lexically")
        return None
    allow = _part_allow(facet, owners) if owners is not None else None
    hits = parts.index.top_k(
        vec, depth, allow=allow, kinds=[part_kind(k, facet) for k in kinds], model=worker.provider.name
    )
    warnings.extend(parts.parts_status().warnings())
    warnings.extend(hits.warnings)
    ranked: list[tuple[str, float]] = []
    truncated = False
    for pairs in hits.by_kind.values():
        truncated |= len(pairs) >= depth
        ranked.extend((owner_of(pid), score) for pid, score in pairs)
    ranked.sort(key=lambda cs: (-cs[1], cs[0]))
    return FacetRanking(facet, ranked, "dense", warnings, truncated)


# --------------------------------------------------------------------------- lexical channel


class _Lexicon:
    """The facet texts of one (kind, facet) in a tantivy index, kept in step with the catalog it
    was last asked about: an entity whose stored object is the same object as at the last sync is
    not looked at again, so a sync after an edit re-indexes only what the edit replaced."""

    def __init__(self, kind: str, facet: str) -> None:
        from slayer_lsp.search.fulltext import FullTextIndex

        self.kind, self.facet = kind, facet
        self.index = FullTextIndex()
        self.lock = threading.Lock()
        self._seen: dict[str, tuple[object, bool]] = {}  # canonical -> (stored object, has the facet)
        self._catalog: weakref.ref[Catalog] | None = None

    def sync(self, catalog: Catalog) -> None:
        """Under ``lock``."""
        if self._catalog is not None and self._catalog() is catalog:
            return
        seen: dict[str, tuple[object, bool]] = {}
        removals: list[str] = []
        upserts: list[render.RenderedDoc] = []
        for ent in catalog.iter_entities([self.kind]):
            if ent.hidden:
                continue
            old = self._seen.get(ent.canonical)
            if old is not None and old[0] is ent.obj:
                seen[ent.canonical] = old
                continue
            text = facet_texts(ent.obj).get(self.facet)
            seen[ent.canonical] = (ent.obj, bool(text))
            if text:
                upserts.append(render.RenderedDoc(ent.canonical, self.kind, text, None))
            elif old is not None and old[1]:
                removals.append(ent.canonical)
        removals.extend(c for c, (_, has) in self._seen.items() if has and c not in seen)
        if removals or upserts:
            self.index.replace(removals, upserts)
        self._seen = seen
        self._catalog = weakref.ref(catalog)

    def rank(self, query: str, owners: frozenset[str] | None, depth: int) -> list[tuple[str, float]]:
        parsed = self.index.parse(query)
        if parsed is None:
            return []
        hits = self.index.search(parsed, memories=self.kind == "memory", limit=depth, allow=owners)
        return [(h.canonical, h.score) for h in hits]


_LEXICONS: OrderedDict[str, dict[tuple[str, str], _Lexicon]] = OrderedDict()
_LEXICONS_LOCK = threading.Lock()
_STORES_KEPT = 4


def _lexicon(catalog: Catalog, kind: str, facet: str) -> _Lexicon:
    """The lexicon of a store's (kind, facet), built on first use and kept for the few stores used
    last (a daemon has one), so an edit costs a resync of what it replaced, not a rebuild."""
    store = f"{catalog.location.backend}:{catalog.location.path}"
    with _LEXICONS_LOCK:
        per_store = _LEXICONS.get(store)
        if per_store is None:
            per_store = _LEXICONS[store] = {}
            while len(_LEXICONS) > _STORES_KEPT:
                _LEXICONS.popitem(last=False)
        _LEXICONS.move_to_end(store)
        lex = per_store.get((kind, facet))
        if lex is None:
            lex = per_store[(kind, facet)] = _Lexicon(kind, facet)
        return lex


def _lexical_ranking(
    catalog: Catalog,
    facet: str,
    query: str,
    kinds: list[str],
    owners: frozenset[str] | None,
    depth: int,
    warnings: list[str],
) -> FacetRanking:
    ranked: list[tuple[str, float]] = []
    truncated = False
    for kind in kinds:
        lex = _lexicon(catalog, kind, facet)
        with lex.lock:
            lex.sync(catalog)
            pairs = lex.rank(query, owners, depth)
        truncated |= len(pairs) >= depth
        best = max((s for _, s in pairs), default=0.0)
        ranked.extend((cid, s / best if best > 0 else 0.0) for cid, s in pairs)
    ranked.sort(key=lambda cs: (-cs[1], cs[0]))
    return FacetRanking(facet, ranked, "lexical", warnings, truncated)


# --------------------------------------------------------------------------- several facets


def search_facets(
    catalog: Catalog, indexes: Any, params: SearchFacetsParams, channel: str = "auto"
) -> SearchFacetsResponse:
    """Rank the entities of ``params.kind`` having every named facet by their weakest facet score
    (each facet ranked ``depth`` deep). Raises ``SearchError`` for invalid params."""
    kind, warnings = params.kind, []
    if kind not in FACETS:
        raise SearchError(f"kind {kind!r} has no facets; kinds with facets: {', '.join(FACETS)}.")
    if not params.facets:
        raise SearchError(f"facets must name at least one facet of {kind}: {', '.join(FACETS[kind])}.")
    for facet, query in params.facets.items():
        if facet not in FACETS[kind]:
            raise SearchError(
                f"facet {facet!r} is not a facet of {kind}; its facets: {', '.join(FACETS[kind])}."
            )
        if not query.strip():
            raise SearchError(f"facet {facet!r} has an empty query.")
    if params.limit < 1:
        raise SearchError(f"limit must be >= 1; got {params.limit}.")
    if params.depth < 1:
        raise SearchError(f"depth must be >= 1; got {params.depth}.")
    if params.min_score is not None and not math.isfinite(params.min_score):
        raise SearchError(f"min_score must be a finite number; got {params.min_score}.")
    limit, depth = params.limit, params.depth
    if limit > MAX_RESULTS_CAP:
        warnings.append(f"limit {limit} is above the cap; returning at most {MAX_RESULTS_CAP}.")
        limit = MAX_RESULTS_CAP
    if depth > MAX_DEPTH:
        warnings.append(f"depth {depth} is above the cap; each facet is ranked {MAX_DEPTH} deep.")
        depth = MAX_DEPTH
    owners = _scope(catalog, indexes, None, params.datasource)

    # One channel for every facet, so that their scores share a scale.
    part_kinds = [part_kind(kind, f) for f in params.facets]
    use_dense, why = _dense_ready(indexes, part_kinds, channel)
    if why:
        warnings.append(why)
    chosen = "dense" if use_dense else "lexical"
    rankings = [
        rank_by_facet(catalog, indexes, f, q, kinds=[kind], allow=owners, depth=depth, channel=chosen)
        for f, q in params.facets.items()
    ]
    if any(r.channel != chosen for r in rankings):  # a query could not be embedded: all lexical
        rankings = [
            rank_by_facet(catalog, indexes, f, q, kinds=[kind], allow=owners, depth=depth, channel="lexical")
            for f, q in params.facets.items()
        ]
    chosen = rankings[0].channel
    for r in rankings:
        warnings.extend(w for w in r.warnings if w != why)

    scores: dict[str, dict[str, float]] | None = None
    for r in rankings:
        mine = dict(r.ranked)
        if scores is None:
            scores = {cid: {r.facet: s} for cid, s in mine.items()}
        else:
            scores = {cid: {**per, r.facet: mine[cid]} for cid, per in scores.items() if cid in mine}
    combined = sorted(
        ((min(per.values()), cid) for cid, per in (scores or {}).items()), key=lambda sc: (-sc[0], sc[1])
    )
    if params.min_score is not None:
        combined = [(s, c) for s, c in combined if s >= params.min_score]
    results: list[FacetHit] = []
    for score, cid in combined:
        hit = _hit(catalog, indexes, cid, score, (scores or {})[cid], params.compact)
        if hit is not None:
            results.append(hit)
            if len(results) >= limit:
                break
    if len(results) < limit and any(r.truncated for r in rankings) and all(r.ranked for r in rankings):
        warnings.append(
            f"only entities in the top {depth} of every facet were combined; "
            "a larger depth or a narrower datasource may find more."
        )
    return SearchFacetsResponse(results=results, channel=chosen, warnings=list(dict.fromkeys(warnings)))


def _hit(
    catalog: Catalog, indexes: Any, cid: str, score: float, per_facet: dict[str, float], compact: bool
) -> FacetHit | None:
    facet_scores = dict(per_facet)
    if is_memory_ref(cid):
        mem = catalog.memory(memory_id_of(cid))
        if mem is None:
            return None
        if compact:
            return FacetHit(
                kind="memory",
                id=mem.id,
                score=score,
                description=render.compact_description(mem),
                query=mem.query,
                facet_scores=facet_scores,
            )
        return FacetHit(
            kind="memory",
            id=mem.id,
            score=score,
            text=render.memory_text(mem),
            description=mem.description,
            query=mem.query,
            facet_scores=facet_scores,
        )
    doc = indexes.docs.get(cid)
    if doc is None:  # hidden, or gone since the ranking was made
        return None
    return FacetHit(
        kind=doc.kind,
        id=cid,
        score=score,
        text="" if compact else doc.text,
        description=doc.description,
        facet_scores=facet_scores,
    )
