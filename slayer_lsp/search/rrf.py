"""SLayer's ranking (``ranking: "slayer"``): per kind, its channels fused by reciprocal rank.

SLayer 1.4.1's pipeline after the shared steps: channel 1 (tags of the named inputs, and the named
entities themselves), channel 2 (full text) and channel 3 (dense), ranked per kind and fused with
RRF, ``score = sum 1 / (k + rank)`` with k = 60; ties keep first-insertion order, as SLayer's do.
Full-text rankings are fetched shallow first and deeper only when the cut could change
(``_fused_hits``), so the answer is always the full ranking's.
"""

from __future__ import annotations

from typing import Any

from slayer_lsp.catalog import Catalog
from slayer_lsp.catalog.ids import is_memory_ref, memory_id_of, memory_ref
from slayer_lsp.search.fulltext import FullTextView
from slayer_lsp.search.hits import named_ranking, search_hit
from slayer_lsp.search.indexes import SearchIndexes
from slayer_lsp.search.request import Request
from slayer_lsp.search.tag_bm25 import TagCorpus
from slayer_lsp.search.types import SearchHit

RRF_K = 60
TEXT_DEPTH = 5000  # per channel and kind; deeper ranks add < 1/5060 to a fused score
DENSE_DEPTH = 1000  # per kind: cosine ranks past this add < 1/1060

Ranking = tuple[
    list[str], Any
]  # (ids best first, None when complete, else a probe: ids -> those it would hold)


def rank(catalog: Catalog, indexes: SearchIndexes, req: Request) -> list[SearchHit]:
    """SLayer 1.4.1's ranking: channels per kind fused with RRF (k = 60), the cut exact."""
    ds, question, inputs, warnings = req.datasource, req.question, req.inputs, req.warnings
    candidate_ids, kind_filter, valid = req.candidate_ids, req.kind_filter, req.valid
    scoped, scoped_ids, has_question, max_results = (
        req.scoped,
        req.scoped_ids,
        req.has_question,
        req.max_results,
    )
    named, named_warnings = named_ranking(catalog, inputs, ds, candidate_ids)
    warnings.extend(named_warnings)

    memory_rankings: list[list[str]] = []
    entity_rankings: list[list[str]] = [named]
    if inputs:  # channel 1: tags
        corpus = indexes.tag_corpus(catalog, ds) if candidate_ids is None else TagCorpus.build(scoped, valid)
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
            ents.append(
                _text_ranking(index, query, memories=False, allow=ent_allow, exact=exact, depth=depth)
            )
            if indexes.dense is not None:
                mems.append(([memory_ref(m) for m in dense_memories], None))
                ents.append((dense_entities, None))
        return [r for r in mems + ents if r[0]]

    def build(key: str, score: float) -> SearchHit | None:
        return search_hit(
            catalog, indexes, key, score, inputs, valid, candidate_ids, kind_filter, req.params.compact
        )

    depth = initial_depth(max_results)
    results = _fused_hits(rankings(depth), depth, build, max_results)
    while results is None:  # deeper until the answer is certain (the full depth always is)
        depth = TEXT_DEPTH if depth * 10 >= TEXT_DEPTH else depth * 10
        results = _fused_hits(rankings(depth), depth, build, max_results)
    return results


def _entity_allow(
    candidate_ids: frozenset[str] | None, kind_filter: set[str] | None
) -> frozenset[str] | None:
    if candidate_ids is None:
        return None
    return frozenset(c for c in candidate_ids if not is_memory_ref(c))


def _dense_rankings(hits: Any) -> tuple[list[str], list[str]]:
    """Channel 3's memory ranking and entity ranking (all entity kinds by cosine)."""
    memories = [memory_id_of(c) for c in hits.ids("memory")]
    entities = sorted(
        ((score, cid) for kind, ranked in hits.by_kind.items() if kind != "memory" for cid, score in ranked),
        key=lambda sc: -sc[0],
    )
    return memories, [cid for _, cid in entities]


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


def initial_depth(max_results: int) -> int:
    """How deep full-text rankings are fetched first; deeper only when the answer could change."""
    return max(100, 5 * max_results)


def _text_ranking(
    index: FullTextView,
    query,
    *,
    memories: bool,
    allow,
    exact: list[str],  # noqa: ANN001
    depth: int,
) -> Ranking:
    """One full-text ranking (best first; tantivy breaks score ties by insertion order, as SLayer's
    fresh index does) fetched ``depth`` deep. When deeper hits were left out, the second element
    tells which of some ids the whole ranking would hold."""
    full = min(index.kind_counts["memory" if memories else "entity"], TEXT_DEPTH)
    limit = min(full, depth)
    ranked = index.ranked_ids(query, memories=memories, limit=limit, allow=allow) if query is not None else []
    fetched = len(ranked)
    lead = [c for c in exact if (is_memory_ref(c) == memories) and (allow is None or c in allow)]
    if lead:
        ranked = lead + [c for c in ranked if c not in lead]
    if not fetched == limit < full:
        return ranked, None
    return ranked, lambda ids: index.matching(query, ids, memories=memories) & (allow or ids)


def _fused_hits(
    rankings: list[Ranking],
    depth: int,
    build,
    max_results: int,  # noqa: ANN001
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
    close = [fused[p] for p in picked] + [
        kv for kv in fused[picked[-1] + 1 :] if kv[1] + gap * widest >= last
    ]
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
    return results if all(s + slack(k) < last for k, s in close[len(picked) :]) else None
