"""One search, end to end: parameters -> ``Request`` -> the chosen ranking -> hits.

``search()`` is a pure function of (catalog, indexes, params) that follows SLayer's pipeline step
by step: validate, resolve the named inputs leniently, apply the cypher filter, scope memories,
then hand the ``Request`` to the ranking asked for (``hybrid.py``, the default, or ``rrf.py``,
SLayer's), cut by ``min_score`` and warn about stale example queries. Without entities, query,
question or keyword it answers the newest memories instead.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Iterable

from slayer_lsp.catalog import Catalog
from slayer_lsp.catalog.ids import is_memory_ref, memory_id_of, memory_ref
from slayer_lsp.catalog.snapshot import ENTITY_KINDS
from slayer_lsp.query.references import extract_entities_from_query, stale_query_warning
from slayer_lsp.query.resolver import EntityResolutionError, resolve_entity
from slayer_lsp.search import hybrid, rrf
from slayer_lsp.search.cypher_filter import parse_label_filter, validate_cypher
from slayer_lsp.search.cypher_lexer import CypherFilterError
from slayer_lsp.search.hits import memory_hit
from slayer_lsp.search.indexes import SearchIndexes
from slayer_lsp.search.request import Request
from slayer_lsp.search.scope import scoped_memories, tag_validity
from slayer_lsp.search.types import (
    MAX_QUESTION_CHARS,
    MAX_RESULTS_CAP,
    SearchError,
    SearchHit,
    SearchParams,
    SearchResponse,
)
from slayer_lsp.store import documents as d

log = logging.getLogger(__name__)


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
            raise SearchError(
                f"{', '.join(extra)} need ranking 'hybrid'; ranking 'slayer' is SLayer's surface."
            )
    if params.related < 0:
        raise SearchError(f"related must be >= 0; got {params.related}.")
    return max_results, ds, warnings


def search(
    catalog: Catalog, indexes: SearchIndexes, params: SearchParams, cancel: threading.Event | None = None
) -> SearchResponse:
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
        warnings.extend(
            f"{c} excluded by cypher_filter kind filter (allowed kinds: {sorted(kind_filter)!r})."
            for c in inputs
            if is_memory_ref(c)
        )

    keyword = params.ranking == "hybrid" and bool(params.keyword and params.keyword.strip())
    if not channel1 and not has_question and not keyword:
        return _recency(catalog, ds, candidate_ids, kind_filter, max_results, warnings, params.compact)

    scoped = indexes.scoped_memories(catalog, ds)
    scoped_ids: frozenset[str] | set[str] = indexes.scoped_memory_ids(catalog, ds)
    if ds is not None:
        warnings.extend(
            f"{c} is not rooted at datasource {ds!r}; dropped."
            for c in inputs
            if is_memory_ref(c) and memory_id_of(c) not in scoped_ids
        )
    if candidate_ids is not None:
        scoped = [m for m in scoped if memory_ref(m.id) in candidate_ids]
        scoped_ids = {m.id for m in scoped}
        warnings.extend(
            f"{c!r} excluded by cypher_filter." for c in inputs if is_memory_ref(c) and c not in candidate_ids
        )
    valid = tag_validity(catalog, ds, scoped_ids)
    req = Request(
        params,
        max_results,
        ds,
        question,
        inputs,
        warnings,
        candidate_ids,
        kind_filter,
        scoped,
        scoped_ids,
        valid,
    )
    results = (
        rrf.rank(catalog, indexes, req) if params.ranking == "slayer" else hybrid.rank(catalog, indexes, req)
    )
    if params.min_score is not None:
        results = [h for h in results if h.score >= params.min_score]
    _warn_stale_queries(catalog, req, results)
    return SearchResponse(results=results, resolved_input_entities=inputs, warnings=_dedup(req.warnings))


def _warn_stale_queries(catalog: Catalog, req: Request, results: list[SearchHit]) -> None:
    """SLayer warns about each returned or named memory whose example query no longer resolves."""
    warned: set[str] = set()
    for hit in results:
        if hit.kind == "memory" and hit.query is not None:
            mem = catalog.memory(hit.id)
            if mem is not None and (w := _stale_warning(catalog, mem)):
                req.warnings.append(w)
            warned.add(hit.id)
    for c in req.inputs:
        if is_memory_ref(c) and memory_id_of(c) in req.scoped_ids and memory_id_of(c) not in warned:
            mem = catalog.memory(memory_id_of(c))
            if mem is not None and (w := _stale_warning(catalog, mem)):
                req.warnings.append(w)


# the last catalog's stale-query warnings by memory id: a snapshot never changes, and resolving a
# memory's query costs ~0.15 ms where a search returns a few of the same memories again and again
_stale_memo: tuple[weakref.ref[Catalog], dict[str, str | None]] | None = None


def _stale_warning(catalog: Catalog, mem: d.Memory) -> str | None:
    global _stale_memo
    memo = _stale_memo
    if memo is None or memo[0]() is not catalog:
        memo = _stale_memo = (weakref.ref(catalog), {})  # swapped whole: a concurrent search keeps its own
    known = memo[1]
    if mem.id not in known:
        known[mem.id] = stale_query_warning(catalog, mem)
    return known[mem.id]


def _apply_cypher(
    catalog: Catalog,
    indexes: SearchIndexes,
    cypher: str | None,
    warnings: list[str],
    cancel: threading.Event | None = None,
) -> tuple[frozenset[str] | None, set[str] | None]:
    """Run the cypher filter: an id allowlist from the graph, or (graph unavailable) a kind filter
    from the naive label form."""
    if cypher is None:
        return None, None
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
        raise SearchError(
            "cypher_filter is too complex for the label-only fallback "
            "(MATCH (v:Label[:Label]) RETURN v.id AS id); the graph is unavailable."
        )
    return None, set(kinds)


def _resolve_inputs(catalog: Catalog, params: SearchParams) -> tuple[list[str], list[str]]:
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


def _recency(
    catalog: Catalog,
    ds: str | None,
    candidate_ids: frozenset[str] | None,
    kind_filter: set[str] | None,
    max_results: int,
    warnings: list[str],
    compact: bool,
) -> SearchResponse:
    """No entities, query or question: the newest memories, scoped like a search."""
    warnings.append("no entities, query, or question supplied; returning newest memories by recency.")
    mems = scoped_memories(catalog, ds)
    had_any = bool(mems)
    if candidate_ids is not None:
        mems = [m for m in mems if memory_ref(m.id) in candidate_ids]
    if kind_filter is not None and "memory" not in kind_filter:
        mems = []
    if had_any and not mems and (candidate_ids is not None or kind_filter is not None):
        warnings.append(
            "cypher_filter excluded all memory candidates for the empty-input recency fallback; no results."
        )
    mems.sort(key=lambda m: m.created_at, reverse=True)
    valid = tag_validity(catalog, ds, {m.id for m in mems})
    hits = [memory_hit(m, 0.0, [], valid, compact) for m in mems[:max_results]]
    for h in hits:
        if h.query is not None and (w := _stale_warning(catalog, catalog.memory(h.id))):  # type: ignore[arg-type]
            warnings.append(w)
    return SearchResponse(results=hits, resolved_input_entities=[], warnings=_dedup(warnings))


def _dedup(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))
