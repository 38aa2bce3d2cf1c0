"""The default ranking: which columns (and tables, measures, memories) does this question need?

SLayer's ranking fuses the ranks of its channels and stops there. This one scores the evidence:

1. **Own evidence** of each entity, from every channel that found it: the full-text score (BM25,
   divided by the question's best), the cosine of the dense channel, the name channel (the
   question's stems against the entity's split, abbreviation-expanded name —
   ``search/name_stems.py``), a sampled value the question names, and a value *shape* it matches
   (a year -> date columns, a full name -> name columns — ``search/sampled_values.py``).
2. **Table routing.** A table scores the mean of its two best leaves plus its own document's
   evidence; a datasource scores its best table. Every entity's final score adds its table's
   and datasource's, so the columns of the table and database the question is about come
   first, the way an analyst reads a question: database, then tables, then columns.
3. **Join completion.** Questions never name the keys that join their tables; the SQL always
   needs them. The first declared join between the leading tables of the leading datasource
   (tables within half of the best table's score, at most three) puts its key columns right after
   the best few columns.
4. **Memories** are scored on the same scale as entities, by how well they *answer* the question
   (``memory_strength``, in [0, 1], times ``W_MEMORY``): BM25 of the whole memory and of its best
   piece (each over the best memory's), the cosine of its vector or nearest piece, and how much
   of the memory the question covers (``memory_terms.py``); exact tokens, the keyword and tags
   naming the inputs add as for entities, recency separates near-ties. A memory is routed like
   what it is about (a datasource tag: its best table; no entity tag: wherever the question is
   routed). The best memories lend part of their score to the entities they are tagged with
   (memory evidence), and the best memory then leads the entities it lent to: it explains them.
   Measured on ``bench/memory_ranking.py`` (dev-public, fit half / held half), one channel alone:
   whole-memory BM25 is the strongest (Hit@1 .75 / .79), best-piece BM25 next (.71 / .71);
   coverage alone .66 / .64; the dense channel is weak on the fit half (.59 / .75: BIRD's
   evidence strings quote the question's words) but carries paraphrases, so it keeps weight 1;
   the tag-word ("about") channel is weak for memories (.33 / .27) and is only a candidate
   source here, not evidence. The tag channel (BM25 over tags) needs named inputs and says
   nothing about a question alone. Memories found only through link hops score by those
   channels like any other (often near 0) and keep their ``via``.
5. Named entities (``entities``) lead, in the order given.

Weights were chosen on the public dev part of the schema-linking benchmark with coarse steps and
round numbers (``bench/schema_linking.py``), never per question or database. A score is a sum of
these terms: higher is better, comparable within one answer only.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from slayer_lsp.catalog import Catalog
from slayer_lsp.catalog.ids import (
    MEMORY_PREFIX,
    datasource_of,
    is_leaf_id,
    is_memory_ref,
    is_model_id,
    memory_id_of,
    memory_ref,
    model_of,
    parent_of,
    rooted_at,
)
from slayer_lsp.search import name_stems, sampled_values
from slayer_lsp.search.facet_ranking import rank_by_facet
from slayer_lsp.search.hits import memory_hit, named_ranking, search_hit
from slayer_lsp.search.indexes import SearchIndexes
from slayer_lsp.search.lexicon import LEAF_KINDS
from slayer_lsp.search.memory_ranking import MemoryMatch, rank_memories
from slayer_lsp.search.piece_index import MemoryPieceIndex, Started
from slayer_lsp.search.recency import recency_factor
from slayer_lsp.search.request import Request
from slayer_lsp.search.tag_bm25 import TagCorpus
from slayer_lsp.search.types import MAX_RELATED_HOPS, SearchError, SearchHit
from slayer_lsp.store.documents import Memory
from slayer_lsp.texts.parts import PART_SEP, PIECE_KIND

CANDIDATES = 200  # per channel: deeper ranks carry too little evidence to reach the answer
# memories per memory channel, and memories weighed; each costs ~25 us a search (50 -> 30: -13% of a
# lexical search at 1,000 models). bench/memory_ranking.py, 2026-12-04: the same memory Hit@1 and
# Hit@5 from 20 to 50 (MRR@10 .890 -> .889 at 30), the same column figures at 30. On the 1,000-model
# store (5,000 near-alike memories) a memory is found first from its own words as often at 20, 30 and
# 50 (.412 / .410 / .403 of 400; default list's MRR .469 / .469 / .467); 30 keeps a margin
MEMORY_CANDIDATES = 30
WHOLE_MEMORY_DEPTH = 50  # memories with whole-text BM25 evidence (a dict entry each, not a candidate)
DENSE_PIECES = 300  # nearest memory pieces asked of the part vectors
W_TEXT = 1.0
W_DENSE = 1.5
W_NAME = 0.5
W_TABLE_NAME = 1.0  # a table's name (and description words) against the question's stems
W_VALUE = 0.5
W_SHAPE = 0.3
W_TABLE = 0.5
W_DATASOURCE = 1.0
W_TAGS = 1.0  # a memory whose tags name the inputs
W_MEMORY_EVIDENCE = (
    0.25  # share of a matching memory's own score (W_MEMORY units) lent to the entities it tags
)
TABLE_LEAVES = 2  # a table scores the mean of this many best leaves
JOIN_TABLE_RATIO = 0.5  # tables within this share of the best table's score are joined
JOIN_TABLES = 3
JOIN_AFTER = 6  # join keys come right after this many leaves
EVIDENCE_MEMORIES = 3
EVIDENCE_MEMORY_RATIO = 0.5  # only memories within this share of the best memory's score lend evidence
EVIDENCE_DATASOURCE_RATIO = 1.0  # ... and only to datasources within this share of the best one
W_TOKEN = 2.0  # a memory holding an exact token of the question (a code, an id) — as a canonical id written
W_KEYWORD = 1.0  # ... or the ``keyword`` parameter
# A memory's strength (``memory_strength``, in [0, 1]) from its whole-text BM25, its best piece's,
# its cosine and the share of it the question covers; ``W_MEMORY`` puts it in the entities' units.
W_M_WHOLE = 2.0
W_M_PIECE = 1.0
W_M_DENSE = 1.0
W_M_COVER = 2.0
W_MEMORY = 5.0
LINK_DECAY = 0.5  # a memory reached only through a link scores this share of the memory it was reached from
LONG_MEMORY_CHARS = 600  # a memory this long is a note of several ideas (see _memory_own)
LEAD_MARGIN = 1e-6  # the memory of a named record leads the memories by this much


@dataclass
class _MemoryEvidence:
    """What the question's channels found of the memories: whole-memory BM25 and cosine by memory
    id, and the nearest memory pieces (memory id, piece number, cosine)."""

    text: dict[str, float] = field(default_factory=dict)
    cosine: dict[str, float] = field(default_factory=dict)
    pieces: list[tuple[str, int, float]] = field(default_factory=list)
    _piece_best: dict[str, float] | None = None

    def piece_cosine(self, memory_id: str) -> float:
        if self._piece_best is None:
            best: dict[str, float] = {}
            for mid, _, cos in self.pieces:
                best[mid] = max(best.get(mid, 0.0), cos)
            self._piece_best = best
        return self._piece_best.get(memory_id, 0.0)


@dataclass
class _Scores:
    own: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    table: dict[str, float] = field(default_factory=dict)
    datasource: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    leaves: dict[str, list[str]] = field(default_factory=dict)  # table -> its leaves scored (by _route)


def rank(catalog: Catalog, indexes: SearchIndexes, req: Request) -> list[SearchHit]:
    if req.params.facet is not None:
        return _facet_ranking(catalog, indexes, req, req.params.facet)
    named, named_warnings = named_ranking(catalog, req.inputs, req.datasource, req.candidate_ids)
    req.warnings.extend(named_warnings)
    allowed = _Allowed(catalog, indexes, req)
    sc = _Scores()
    evidence = _MemoryEvidence()
    memory_side = _start_memories(catalog, indexes, req, allowed)  # its searches run meanwhile
    if req.has_question:
        _question_evidence(catalog, indexes, req, allowed, sc, evidence)
    if req.has_question:
        evidence.pieces = _dense_pieces(indexes, req, allowed)
    matches = _memories(catalog, req, evidence, memory_side)
    mem_own = _memory_own(catalog, indexes, req, matches, evidence)
    _route(sc)
    lent = _memory_evidence(catalog, mem_own, sc, allowed)
    if lent:
        _route(sc, {tag for tags in lent.values() for tag in tags})

    final: dict[str, float] = {}
    tables, dss = sc.table, sc.datasource
    places = _PLACES
    for cid, own in sc.own.items():
        _, _, model, ds = places.get(cid) or _place(cid)
        table = tables.get(model, 0.0) if model is not None else 0.0
        final[cid] = own + W_TABLE * table + W_DATASOURCE * dss.get(ds, 0.0)
    memory_final: dict[str, float] = {}
    best_own = max(mem_own.values(), default=0.0)
    routed = (max(sc.table.values(), default=0.0), max(sc.datasource.values(), default=0.0))
    memories = catalog.memories
    for m in matches:  # best first: a memory reached by a link alone follows the one it was reached from
        if m.channels == ("link",) and m.via:
            memory_final[m.memory_id] = LINK_DECAY * memory_final.get(memory_id_of(m.via), 0.0)
        else:
            share = mem_own[m.memory_id] / best_own if best_own > 0 else 0.0
            memory_final[m.memory_id] = mem_own[m.memory_id] + _memory_routing(
                memories, m.memory_id, sc, share, routed
            )
    if matches and matches[0].named:  # the best memory of a named record leads the memories
        memory_final[matches[0].memory_id] = max(memory_final.values()) + LEAD_MARGIN
    elif memory_final:  # the best memory leads the entities it lent its evidence to: it explains them
        best = max(memory_final, key=lambda mid: (memory_final[mid], mid))
        lifted = max((final[t] for t in lent.get(best, ()) if t in final), default=None)
        if lifted is not None and lifted >= memory_final[best]:
            memory_final[best] = lifted + LEAD_MARGIN
    for mid, score in memory_final.items():
        final[memory_ref(mid)] = score
    via = {m.canonical: m.via for m in matches if m.via}
    if req.has_question and allowed.kind_ok("column"):
        _complete_joins(catalog, indexes, sc, final, allowed)
    top = max(final.values(), default=0.0)
    for i, cid in enumerate(reversed(named)):  # named entities lead, in the order given
        final[cid] = top + 1.0 + i

    return _hits(catalog, indexes, req, ((c, final[c]) for c in _best_first(final, req.max_results)), via)


def _hits(
    catalog: Catalog,
    indexes: SearchIndexes,
    req: Request,
    scored: Iterable[tuple[str, float]],
    via: dict[str, str],
) -> list[SearchHit]:
    """Hits for (id, score) pairs best first, up to ``max_results``; what may not come back (kind,
    cypher filter, scope) is skipped."""
    results: list[SearchHit] = []
    for cid, score in scored:
        if is_memory_ref(cid):
            mid = memory_id_of(cid)
            mem = catalog.memory(mid) if req.memory_allowed() and mid in req.scoped_ids else None
            hit = memory_hit(mem, score, req.inputs, req.valid, req.params.compact) if mem else None
            if hit is not None and cid in via:
                hit.via = via[cid]
        else:
            hit = search_hit(
                catalog,
                indexes,
                cid,
                score,
                req.inputs,
                req.valid,
                req.candidate_ids,
                req.kind_filter,
                req.params.compact,
            )
        if hit is not None:
            hit.score = round(hit.score, 6)
            results.append(hit)
            if len(results) >= req.max_results:
                break
    return results


def _facet_ranking(catalog: Catalog, indexes: SearchIndexes, req: Request, facet: str) -> list[SearchHit]:
    """``facet``: the question ranks one facet of the entities that declare it, nothing else
    (``search/facet_ranking.py``; the whole surface of several facets at once is ``slayer/searchFacets``)."""
    if not req.has_question:
        raise SearchError("facet needs a question to rank by.")
    kinds = sorted(req.kind_filter) if req.kind_filter is not None else None
    ranking = rank_by_facet(
        catalog,
        indexes,
        facet,
        req.question or "",
        kinds=kinds,
        allow=req.candidate_ids,
        datasource=req.datasource,
        depth=max(req.max_results, 50),
    )
    req.warnings.extend(ranking.warnings)
    return _hits(catalog, indexes, req, ranking.ranked, {})


@dataclass
class _MemorySide:
    """What the memory side searches: the piece index, the memories it may rank (None: all) and
    its full-text searches, begun before the entities are scored."""

    pieces: MemoryPieceIndex
    allowed: frozenset[str] | None
    tag_corpus: TagCorpus | None  # the tags channel's, when inputs are named and no cypher filter
    started: Started | None


def _start_memories(
    catalog: Catalog, indexes: SearchIndexes, req: Request, allowed: _Allowed
) -> _MemorySide | None:
    """The memory side's index and scope, its piece and tag-word searches begun on a helper thread
    (None: no memory may be ranked)."""
    if not allowed.memories_on or not allowed.memory_ids:
        return None
    pieces = indexes.pieces_for(catalog)
    scope = None if req.datasource is None and req.candidate_ids is None else allowed.memory_ids
    question = req.question if req.has_question else None
    started = (
        pieces.start(question, allow=scope, depth=MEMORY_CANDIDATES)
        if question and question.strip()
        else None
    )
    corpus = indexes.tag_corpus(catalog, req.datasource) if req.candidate_ids is None and req.inputs else None
    return _MemorySide(pieces, scope, corpus, started)


def _memories(
    catalog: Catalog, req: Request, evidence: _MemoryEvidence, side: _MemorySide | None
) -> list[MemoryMatch]:
    """The memory side's candidates (``search/memory_ranking.py``): pieces, exact tokens, keyword, tags,
    links — one match per memory, with the channels that found it and the named-record lead."""
    if side is None:
        return []
    dense = [*evidence.pieces, *((mid, -1, cos) for mid, cos in evidence.cosine.items())]
    return rank_memories(
        catalog,
        side.pieces,
        question=req.question if req.has_question else None,
        named=req.inputs,
        allowed=side.allowed,
        # the nearest pieces, and the whole memories' vectors (for what is not cut into vectors yet)
        dense=dense or None,
        keyword=req.params.keyword,
        related=min(req.params.related, MAX_RELATED_HOPS),
        tag_corpus=side.tag_corpus,
        depth=max(MEMORY_CANDIDATES, 2 * req.max_results),
        now=req.now,
        channel_depth=MEMORY_CANDIDATES,
        started=side.started,
    )


def _memory_own(
    catalog: Catalog,
    indexes: SearchIndexes,
    req: Request,
    matches: list[MemoryMatch],
    evidence: _MemoryEvidence,
) -> dict[str, float]:
    """Each matched memory's own evidence in the entities' units (see ``memory_strength``), times
    its recency factor (which only separates near-ties)."""
    if not matches:
        return {}
    ids = [m.memory_id for m in matches]
    best_piece = max((m.text_score for m in matches), default=0.0) or 1.0
    best_whole = max(evidence.text.values(), default=0.0) or 1.0
    asked = name_stems.stems(req.question or "") if req.has_question else []
    terms = indexes.memory_terms_for(catalog)
    coverage = terms.coverage(asked, ids) if asked else {}
    memories = catalog.memories
    long_notes = {
        mid for mid in ids if mid in memories and len(memories[mid].learning or "") >= LONG_MEMORY_CHARS
    }
    for m in matches:  # a long note holds several ideas: the piece that matched counts by itself
        if asked and m.piece and m.memory_id in long_notes:
            coverage[m.memory_id] = max(coverage.get(m.memory_id, 0.0), terms.text_coverage(asked, m.piece))
    now = req.now
    own: dict[str, float] = {}
    for m in matches:
        mid = m.memory_id
        cos = max(evidence.cosine.get(mid, 0.0), evidence.piece_cosine(mid))
        whole, piece = evidence.text.get(mid, 0.0) / best_whole, m.text_score / best_piece
        if mid in long_notes:  # ... and is not diluted by the others
            whole = max(whole, piece)
        strength = memory_strength(whole, piece, max(cos, 0.0), coverage.get(mid, 0.0))
        score = W_MEMORY * strength
        if "exact" in m.channels:
            score += W_TOKEN
        if "keyword" in m.channels:
            score += W_KEYWORD
        if "tags" in m.channels:
            score += W_TAGS
        mem = memories.get(mid)
        own[mid] = score * (recency_factor(mem.created_at, now) if mem is not None else 1.0)
    return own


def memory_strength(whole: float, piece: float, cosine: float, coverage: float) -> float:
    """How well a memory answers the question, in [0, 1]: BM25 of the whole memory and of its best
    piece (each over the best memory's), the cosine of its vector, and how much of it the question
    covers (``memory_terms.py``) — weighted sum over the weights' total."""
    total = (W_M_WHOLE + W_M_PIECE + W_M_DENSE + W_M_COVER) or 1.0
    return (W_M_WHOLE * whole + W_M_PIECE * piece + W_M_DENSE * cosine + W_M_COVER * coverage) / total


def _dense_pieces(indexes: SearchIndexes, req: Request, allowed: _Allowed) -> list[tuple[str, int, float]]:
    """(memory id, piece number, cosine) of the memory pieces nearest the question, from the part
    vectors (``embed/parts.py``); empty while they are not embedded."""
    worker = indexes.dense
    parts = getattr(worker, "parts", None) if worker is not None else None
    if not allowed.memories_on or worker is None or parts is None or not len(parts.index):
        return []  # (worker None: parts None too)
    try:
        vec = worker.embed_query(req.question or "")
    except Exception:  # noqa: BLE001 - the dense channel already warned about its provider
        return []
    hits = parts.index.top_k(vec, DENSE_PIECES, kinds=[PIECE_KIND], model=worker.provider.name)
    out: list[tuple[str, int, float]] = []
    scoped = allowed.memory_ids
    for pid, cos in hits.by_kind.get(PIECE_KIND, ()):
        owner, _, part = pid.rpartition(PART_SEP)  # "memory:<id>#p<n>": the owner and the part
        mid = memory_id_of(owner)
        if mid in scoped and part[1:].isdigit():
            out.append((mid, int(part[1:]), cos))
    return out


class _Allowed:
    """What may be ranked at all (datasource, cypher filter, kinds): applied to every channel's
    candidates before they are scored."""

    def __init__(self, catalog: Catalog, indexes: SearchIndexes, req: Request):
        self.ds = req.datasource
        self.ids = req.candidate_ids
        self.kinds = req.kind_filter
        self.memory_ids = frozenset(req.scoped_ids)
        self.memories_on = req.memory_allowed()
        self.docs = indexes.docs

    def kind_ok(self, kind: str) -> bool:
        return self.kinds is None or kind in self.kinds

    def entity(self, cid: str) -> bool:
        if self.ids is not None and cid not in self.ids:
            return False
        if self.ds is not None and not rooted_at(cid, self.ds):
            return False
        return cid in self.docs

    def entity_test(self) -> Callable[[str], bool]:
        """``entity`` as the cheapest callable that answers the same (a hot loop's)."""
        known, ds = self.docs.membership(), self.ds
        if self.ids is None and ds is None:
            return known
        if self.ids is None and ds is not None:  # rooted_at, inline
            prefix = ds + "."
            return lambda c: (
                (c.startswith(prefix) or c == ds) and not c.startswith(MEMORY_PREFIX) and known(c)
            )
        return self.entity

    def memory(self, mid: str) -> bool:
        return self.memories_on and mid in self.memory_ids


def _best_first(final: dict[str, float], wanted: int) -> Iterator[str]:
    """Ids by score (ties by id): a partial sort first, the full one only if hits were dropped."""
    for _, c in _in_order([(-score, c) for c, score in final.items()], 4 * wanted + 16, largest=False):
        yield c


def _in_order(pairs: list[tuple[float, str]], head: int, *, largest: bool) -> Iterator[tuple[float, str]]:
    """``pairs`` sorted (compared as tuples, with no key calls; ``largest``: descending), by a
    partial sort of the first ``head`` and the full sort only if more are read."""
    first = heapq.nlargest(head, pairs) if largest else heapq.nsmallest(head, pairs)
    yield from first
    if len(first) < len(pairs):
        yield from sorted(pairs, reverse=largest)[len(first) :]


def _question_evidence(
    catalog: Catalog,
    indexes: SearchIndexes,
    req: Request,
    allowed: _Allowed,
    sc: _Scores,
    evidence: _MemoryEvidence,
) -> None:
    """The entities' own evidence from every channel; the memories' whole-text BM25 and cosines go
    to ``evidence`` for the memory side."""
    question = req.question or ""
    index = indexes.fulltext_for(catalog, req.datasource)
    query = index.parse(question)
    ent_allow = frozenset(c for c in req.candidate_ids if not is_memory_ref(c)) if req.candidate_ids else None
    text = index.scored(query, memories=False, limit=CANDIDATES, allow=ent_allow) if query is not None else []
    entity_ok = allowed.entity_test()
    own = sc.own
    best = max((score for _, score in text), default=0.0) or 1.0
    for cid, score in text:
        if entity_ok(cid):
            own[cid] += W_TEXT * score / best
    for cid in index.exact_ids(question):  # a canonical id written in the question
        if not is_memory_ref(cid) and entity_ok(cid):
            own[cid] += W_TEXT * 2
    if query is not None and allowed.memories_on:
        mem_allow = (
            frozenset(memory_ref(m) for m in req.scoped_ids) if req.candidate_ids is not None else None
        )
        for ref, score in index.scored(query, memories=True, limit=WHOLE_MEMORY_DEPTH, allow=mem_allow):
            mid = memory_id_of(ref)
            if allowed.memory(mid):
                evidence.text[mid] = score

    if indexes.dense is not None:
        allow = indexes.scope_ids(catalog, req.datasource) if req.datasource is not None else None
        if req.candidate_ids is not None:
            allow = req.candidate_ids if allow is None else allow & req.candidate_ids
        hits = indexes.dense.search(question, k=CANDIDATES, allow=allow)
        req.warnings.extend(hits.warnings)
        for kind, ranked in hits.by_kind.items():
            if kind == "memory":
                evidence.cosine.update(
                    (memory_id_of(c), cos) for c, cos in ranked if allowed.memory(memory_id_of(c))
                )
                continue
            for cid, cos in ranked:
                if entity_ok(cid):
                    own[cid] += W_DENSE * max(cos, 0.0)

    lexicon = indexes.lexicon_for(catalog)
    q_stems = name_stems.stems(question)
    by_name = lexicon.name_scores(q_stems, ordered=False)  # only added up: the order never counts
    # each channel's best: a leaf has a parent and is no model; a model's parent is its datasource
    leaf_best: float | None = None
    model_best: float | None = None
    named: list[tuple[str, float, bool]] = []
    places = _PLACES
    for cid, s in by_name.items():
        up, is_model, _, _ = places.get(cid) or _place(cid)
        named.append((cid, s, is_model))
        if is_model:
            if model_best is None or s > model_best:
                model_best = s
        elif up is not None and (leaf_best is None or s > leaf_best):
            leaf_best = s
    per_model, per_leaf = W_TABLE_NAME / (model_best or 1.0), W_NAME / (leaf_best or 1.0)
    for cid, s, is_model in named:
        if entity_ok(cid):
            own[cid] += (per_model if is_model else per_leaf) * s
    for cid in sorted(lexicon.value_matches(question)):
        if entity_ok(cid):
            own[cid] += W_VALUE
    shapes = sampled_values.question_shapes(question)
    if shapes:
        for cid in list(own):
            if is_leaf_id(cid) and shapes & lexicon.shapes_of(cid):
                own[cid] += W_SHAPE * len(shapes & lexicon.shapes_of(cid))


def _memory_evidence(
    catalog: Catalog, mem_own: dict[str, float], sc: _Scores, allowed: _Allowed
) -> dict[str, list[str]]:
    """The best matching memories lend part of their score to the entities they are tagged with —
    within the datasources the question is routed to (a memory about another database must not
    pull that database's columns in). Returns the entities each memory lent to."""
    lent: dict[str, list[str]] = {}
    if not mem_own:
        return lent
    best_ds = max(sc.datasource.values(), default=0.0)
    routed = {ds for ds, s in sc.datasource.items() if s >= EVIDENCE_DATASOURCE_RATIO * best_ds}
    best = max(mem_own.values())
    for mid, score in sorted(mem_own.items(), key=lambda kv: (-kv[1], kv[0]))[:EVIDENCE_MEMORIES]:
        mem = catalog.memory(mid)
        if mem is None or score < EVIDENCE_MEMORY_RATIO * best:
            continue
        for tag in mem.entities:
            if (
                not is_memory_ref(tag)
                and allowed.entity(tag)
                and (not routed or datasource_of(tag) in routed)
            ):
                sc.own[tag] += W_MEMORY_EVIDENCE * score
                lent.setdefault(mid, []).append(tag)
    return lent


def _route(sc: _Scores, changed: set[str] | None = None) -> None:
    """Table and datasource scores from the leaves' own scores (and the tables' own documents).
    ``changed``: the ids whose own score rose since the last call; only their tables are scored
    again (own scores only rise, so a datasource keeps the best of its old and new tables)."""
    members: dict[str, list[str]] = {} if changed is None else sc.leaves
    todo: set[str] = set()
    places = _PLACES
    for cid in sc.own if changed is None else changed:
        parent, is_model, _, _ = places.get(cid) or _place(cid)
        if parent is None:
            continue  # a datasource
        if is_model:
            todo.add(cid)
            continue
        todo.add(parent)
        group = members.get(parent)
        if group is None:
            members[parent] = [cid]
        elif changed is None or cid not in group:
            group.append(cid)
    sc.leaves = members
    own, table_scores, datasources = sc.own, sc.table, sc.datasource
    for table in todo:
        leaves = members.get(table)
        # the best TABLE_LEAVES own scores summed (one or two floats add up the same either way round)
        if not leaves:
            best: float = 0.0
        elif len(leaves) == 1:
            best = own[leaves[0]]
        elif len(leaves) == 2 and TABLE_LEAVES >= 2:
            best = own[leaves[0]] + own[leaves[1]]
        else:
            best = sum(sorted([own[c] for c in leaves], reverse=True)[:TABLE_LEAVES])
        score = best / TABLE_LEAVES + 0.5 * own.get(table, 0.0)
        table_scores[table] = score
        ds = (places.get(table) or _place(table))[3]
        if score > datasources[ds]:
            datasources[ds] = score


_Place = tuple[str | None, bool, str | None, str]  # parent, is a model, model (or None), datasource
_PLACES: dict[str, _Place] = {}  # read directly by the hot loops: a dict lookup, no call
PLACES_KEPT = 1 << 17  # ids remembered before the cache starts over (a few MiB)


def _place(cid: str) -> _Place:
    """Where an id sits: its parent, whether it is a model (a table of its own), its model (None for
    a datasource) and its datasource. Id arithmetic done once per id and kept: the ranking asks it
    of every scored id several times a search."""
    place = _PLACES.get(cid)
    if place is None:
        if len(_PLACES) >= PLACES_KEPT:
            _PLACES.clear()
        place = _PLACES[cid] = (parent_of(cid), is_model_id(cid), model_of(cid), datasource_of(cid))
    return place


def _memory_routing(
    memories: Mapping[str, Memory], mid: str, sc: _Scores, share: float, routed: tuple[float, float]
) -> float:
    """A memory is routed like what it is about: its best tagged table and datasource. A tag of a
    datasource is about all of its tables (its best one counts), and a memory tagged with no entity
    is general knowledge that applies wherever the question is routed — in proportion to ``share``,
    how it matches the question against the best memory (nothing ties it to the tables there).
    ``routed``: the best table's and the best datasource's scores of the question."""
    mem = memories.get(mid)
    if mem is None:
        return 0.0
    places = _tag_places(tuple(mem.entities))
    if not places:
        return W_TABLE * (share * routed[0]) + W_DATASOURCE * (share * routed[1])
    table = ds = 0.0
    datasources, tables = sc.datasource, sc.table
    for datasource, model in places:
        ds_score = datasources.get(datasource, 0.0)
        ds = max(ds, ds_score)
        # a tag of a datasource scores its best table
        table = max(table, tables.get(model, 0.0) if model is not None else ds_score)
    return W_TABLE * table + W_DATASOURCE * ds


@lru_cache(maxsize=1 << 14)
def _tag_places(tags: tuple[str, ...]) -> tuple[tuple[str, str | None], ...]:
    """(datasource, model or None) of each entity tag of a memory (memory links are not places)."""
    return tuple((datasource_of(t), model_of(t)) for t in tags if not is_memory_ref(t))


def _complete_joins(
    catalog: Catalog, indexes: SearchIndexes, sc: _Scores, final: dict[str, float], allowed: _Allowed
) -> None:
    leaves = _best_leaves(catalog, final, sc.own, JOIN_AFTER)
    if not leaves:
        return
    best_ds = datasource_of(leaves[0])
    prefix = best_ds + "."  # a table is a model id (never a memory ref): rooted_at, inline
    tables = sorted(
        (t for t in sc.table if t.startswith(prefix) or t == best_ds), key=lambda t: (-sc.table[t], t)
    )
    if not tables:
        return
    chosen = [t for t in tables[:JOIN_TABLES] if sc.table[t] >= JOIN_TABLE_RATIO * sc.table[tables[0]]]
    keys: list[str] = []
    for i, a in enumerate(chosen):
        for b in chosen[i + 1 :]:
            keys += indexes.lexicon_for(catalog).join_keys(a, b)
    head = set(leaves[:JOIN_AFTER])
    keys = [k for k in dict.fromkeys(keys) if k not in head and allowed.entity(k)]
    if not keys:
        return
    anchor = final[leaves[-1]]
    for i, key in enumerate(keys, start=1):
        final[key] = max(final.get(key, 0.0), anchor - 1e-6 * i)


def _best_leaves(catalog: Catalog, final: dict[str, float], ids: Iterable[str], k: int) -> list[str]:
    """The ``k`` best-scored leaves among ``ids`` (the entities of ``final``, its memories left out:
    they are never leaves) by score, then id, both descending: the best few ids first, most of which
    are leaves, and every id sorted only when those held too few."""
    entities = catalog.entities
    out: list[str] = []
    for _, c in _in_order([(final[c], c) for c in ids], 4 * k, largest=True):
        ent = entities.get(c)
        if ent is not None and ent.kind in LEAF_KINDS and is_leaf_id(c):
            out.append(c)
            if len(out) == k:
                break
    return out


def describe() -> dict[str, Any]:
    """The weights, for status and the protocol notes."""
    return {k: v for k, v in globals().items() if k.startswith(("W_", "JOIN_", "TABLE_", "CANDIDATES"))}
