"""The memory side of one hybrid search: pieces, exact tokens, tags, links and recency, fused.

``rank_memories`` returns one ``MemoryMatch`` per memory, best first. A memory is matched by its
best piece and answered whole (the caller builds the hit from the memory, never from the piece).

Fusion is weighted reciprocal-rank fusion, ``score = sum_c w_c / (60 + rank_c)``, over channels
that each rank memories (one entry per memory):

========  ======  =====================================================================
channel   weight  ranks memories by
========  ======  =====================================================================
tags      1.0     BM25 of their tags against the named inputs (SLayer's channel 1); a
                  named ``memory:<id>`` leads it
text      1.0     BM25 of their best piece against the question
about     1.0     BM25 of the words of their entity tags against the question (what the
                  memory is about: ``orders.order_total`` -> "orders order total")
dense     1.0     cosine of their best piece vector (when the caller has piece vectors)
exact     3.0     how many distinctive question tokens (``exact_tokens.extract_tokens``) they hold
                  as whole tokens (in a piece, or as a tag for canonical ids and memory
                  refs); a memory the question names as ``memory:<id>`` counts twice. Silent
                  when the question has no distinctive token
keyword   1.5     holding the caller's ``keyword`` as whole tokens: matched like an exact
                  token but trusted less (the caller chose a word; the extractor
                  recognised a shape)
link      0.5     link hops (only memories no other channel found)
========  ======  =====================================================================

Within a channel, scores within 1 % of the better one share its rank (equal counts and equal tag
scores share exactly), so equally good matches tie after fusion and recency decides between
them. Then:

* Recency: the fused score is multiplied by ``recency.recency_factor`` (in [0.99, 1]).
* Links (``related`` = n hops): a stated link is a ``memory:<id>`` tag; it is followed in both
  directions (a memory that names another, and the one named). Hops start from the memories of
  named records when there are any, else from the best ``LINK_SEEDS`` direct matches; they pass
  only through memories in ``allowed`` (both ends of every hop checked). A memory reached this
  way carries ``via = "memory:<id>"`` (the memory it was reached from), contributes one best
  piece like any other, and, when no other channel found it, enters through the link channel.
* The lead: a memory *belongs to a named record* when the caller named it (``memory:<id>``) or
  it is tagged with a named entity. Whenever such a memory is among the matches, the first match
  is one (the best of them), even if a linked or unrelated memory matched the question better;
  it then carries the top score, so scores never increase down the list.
* The piece shown is the best piece of the channel that contributed most to the memory's score
  (None when only tags, tag words or links found it: no prose of it matched).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

from slayer_lsp.catalog.ids import is_memory_ref, memory_id_of, memory_ref
from slayer_lsp.search.exact_tokens import ExactToken, extract_tokens, shape_of
from slayer_lsp.search.piece_index import MemoryPieceIndex, Started
from slayer_lsp.search.recency import recency_factor, today
from slayer_lsp.search.tag_bm25 import TagCorpus

if TYPE_CHECKING:
    from slayer_lsp.catalog import Catalog

RRF_K = 60
WEIGHTS = {"tags": 1.0, "text": 1.0, "about": 1.0, "dense": 1.0, "exact": 3.0, "keyword": 1.5, "link": 0.5}
TIE_TOLERANCE = 0.01  # relative: scores this close share a rank within a channel
LINK_SEEDS = 10  # without named records, hops start from this many best direct matches
CHANNEL_DEPTH = 300  # memories per full-text channel: deeper ranks add < 1/360 to a fused score
_SELF_NAMED = 2  # what a memory the question names as memory:<id> counts in the exact channel

DensePiece = tuple[str, int, float]  # (memory id, piece number, cosine)


@dataclass(frozen=True, slots=True)
class MemoryMatch:
    """One memory of a search: its fused (recency-adjusted) score, its best piece (an index
    entry, for explaining the match: the hit itself is the whole memory), the link that reached it
    and the channels that found it."""

    memory_id: str
    score: float
    piece: str | None = None
    piece_no: int | None = None
    via: str | None = None  # "memory:<id>" of the memory a link hop came from
    channels: tuple[str, ...] = ()
    tokens: tuple[str, ...] = ()  # exact tokens (and the keyword) it holds
    named: bool = False  # belongs to a record the caller named
    text_score: float = 0.0  # BM25 of its best piece for the question (0 when the text did not match)

    @property
    def canonical(self) -> str:
        return memory_ref(self.memory_id)


@dataclass
class _Channel:
    name: str
    ranks: dict[str, int] = field(default_factory=dict)  # memory id -> shared 1-based rank
    pieces: dict[str, int] = field(default_factory=dict)  # memory id -> its best piece here


def _shared_ranks(scored: Sequence[tuple[str, float]], tolerance: float) -> dict[str, int]:
    """1-based ranks for (id, score) sorted best first; an item within ``tolerance`` (relative)
    of the first item of its group shares that item's rank."""
    ranks: dict[str, int] = {}
    lead_score: float | None = None
    lead_rank = 0
    for pos, (key, score) in enumerate(scored, start=1):
        if key in ranks:
            continue
        same = lead_score is not None and (
            score == lead_score
            or (math.isfinite(lead_score) and lead_score > 0 and score >= lead_score * (1.0 - tolerance))
        )
        if not same:
            lead_score, lead_rank = score, pos
        ranks[key] = lead_rank
    return ranks


def _literal_hits(
    index: MemoryPieceIndex, token: ExactToken, allowed: frozenset[str] | None, ok
) -> dict[str, tuple[int, ...]]:  # noqa: ANN001
    """Memories holding one exact token: in their pieces, as a tag (ids), or being it."""
    hits = dict(index.literal.lookup(token.text, allowed))
    if token.shape in ("canonical", "memory"):
        for mid in index.tagged_with(token.text):
            if ok(mid):
                hits.setdefault(mid, ())
    return hits


def _token_channel(
    name: str,
    index: MemoryPieceIndex,
    tokens: Sequence[ExactToken],
    allowed: frozenset[str] | None,
    ok,
    found: dict[str, list[str]],
) -> _Channel:  # noqa: ANN001
    counts: dict[str, int] = {}
    per_piece: dict[str, dict[int, int]] = {}
    for tok in tokens:
        hits = _literal_hits(index, tok, allowed, ok)
        if tok.shape == "memory":
            own = memory_id_of(tok.text)
            if ok(own):
                hits.setdefault(own, ())
                counts[own] = counts.get(own, 0) + _SELF_NAMED - 1
        for mid, nos in hits.items():
            counts[mid] = counts.get(mid, 0) + 1
            found.setdefault(mid, []).append(tok.text)
            tally = per_piece.setdefault(mid, {})
            for n in nos:
                tally[n] = tally.get(n, 0) + 1
    ch = _Channel(name)
    ordered = sorted(counts.items(), key=lambda kv: -kv[1])
    ch.ranks = _shared_ranks([(m, float(c)) for m, c in ordered], 0.0)
    for mid, tally in per_piece.items():
        if tally:
            ch.pieces[mid] = min(tally, key=lambda n: (-tally[n], n))
    return ch


def named_record_memories(catalog: Catalog, index: MemoryPieceIndex, named: Iterable[str], ok) -> set[str]:  # noqa: ANN001
    """Memories that belong to a named record: named as ``memory:<id>``, or tagged with a named
    entity (the exact tag, as channel 1 counts tags)."""
    out: set[str] = set()
    for c in named:
        if is_memory_ref(c):
            if ok(memory_id_of(c)):
                out.add(memory_id_of(c))
            continue
        for mid in index.tagged_with(c):  # case-folded there; the tag itself must be exact
            mem = catalog.memory(mid)
            if ok(mid) and mem is not None and c in mem.entities:
                out.add(mid)
    return out


def _tag_corpus(catalog: Catalog, ok) -> TagCorpus:  # noqa: ANN001
    mems = [m for mid, m in catalog.memories.items() if ok(mid)]
    entities = catalog.entities

    def valid(tag: str) -> bool:
        if is_memory_ref(tag):
            return ok(memory_id_of(tag))
        return tag in entities

    return TagCorpus.build(mems, valid)


def rank_memories(
    catalog: Catalog,
    index: MemoryPieceIndex,
    *,
    question: str | None = None,
    named: Sequence[str] = (),
    allowed: Collection[str] | None = None,
    dense: Iterable[DensePiece] | None = None,
    keyword: str | None = None,
    related: int = 0,
    now: datetime | None = None,
    tag_corpus: TagCorpus | None = None,
    depth: int | None = None,
    channel_depth: int = CHANNEL_DEPTH,
    started: Started | None = None,
) -> list[MemoryMatch]:
    """Rank the memories of one search, one match per memory, best first (see the module doc).

    ``named``: the canonical inputs the caller named (entities and ``memory:<id>`` refs, resolved).
    ``allowed``: the memory ids the search may return (already scoped by datasource, cypher filter
    and reachability); None means every memory. Nothing outside it is ranked or hopped through.
    ``dense``: (memory id, piece number, cosine) of the caller's piece-vector search, if any.
    ``tag_corpus``: channel 1's corpus for this scope (built from ``allowed`` when not given).
    ``depth``: at most this many matches (None: all); ``channel_depth``: how many memories each
    full-text ranking (pieces, tag words) holds; ``started``: those two rankings' searches, begun
    ahead by the caller (``MemoryPieceIndex.start``)."""
    allow = frozenset(allowed) if allowed is not None else None
    memories = catalog.memories

    def ok(mid: str) -> bool:
        return mid in memories and (allow is None or mid in allow)

    now = now or today()
    question = question if question and question.strip() else None
    channels: list[_Channel] = []
    found_tokens: dict[str, list[str]] = {}

    if named:  # tags (channel 1)
        corpus = tag_corpus if tag_corpus is not None else _tag_corpus(catalog, ok)
        ranked = [(m, round(s, 9)) for m, s in corpus.rank(list(named)) if ok(m)]
        leads = [memory_id_of(c) for c in named if is_memory_ref(c) and ok(memory_id_of(c))]
        ranked = [(m, math.inf) for m in dict.fromkeys(leads)] + [(m, s) for m, s in ranked if m not in leads]
        channels.append(_Channel("tags", _shared_ranks(ranked, 0.0)))
    text_scores: dict[str, float] = {}
    if question is not None:
        hits = index.rank(question, allow=allow, depth=channel_depth, started=started)
        text_scores = {h.memory_id: h.score for h in hits}
        text = _Channel(
            "text",
            _shared_ranks([(h.memory_id, h.score) for h in hits], TIE_TOLERANCE),
            {h.memory_id: h.piece_no for h in hits},
        )
        channels.append(text)
        about = index.rank_about(question, allow=allow, depth=channel_depth, started=started)
        channels.append(_Channel("about", _shared_ranks(about, TIE_TOLERANCE)))
        tokens = extract_tokens(question)
        if tokens:
            channels.append(_token_channel("exact", index, tokens, allow, ok, found_tokens))
    if dense is not None:
        best: dict[str, tuple[float, int]] = {}
        for mid, no, cos in dense:
            cos = float(cos)
            if ok(mid) and (mid not in best or cos > best[mid][0]):
                best[mid] = (cos, int(no))
        ordered = sorted(best.items(), key=lambda kv: -kv[1][0])
        channels.append(
            _Channel(
                "dense",
                _shared_ranks([(m, c) for m, (c, _) in ordered], TIE_TOLERANCE),
                {m: n for m, (_, n) in ordered if n >= 0},
            )
        )  # n < 0: a whole-memory vector
    if keyword and keyword.strip():
        term = keyword.strip()  # a keyword shaped like an id also matches tags, as an extracted one does
        channels.append(
            _token_channel(
                "keyword", index, [ExactToken(term, shape_of(term) or "keyword")], allow, ok, found_tokens
            )
        )

    fused: dict[str, float] = {}
    for ch in channels:
        w = WEIGHTS[ch.name]
        for mid, rank in ch.ranks.items():  # every channel ranked allowed memories of this snapshot only
            fused[mid] = fused.get(mid, 0.0) + w / (RRF_K + rank)

    leaders = named_record_memories(catalog, index, named, ok) if named else set()
    via: dict[str, str] = {}
    if related > 0:
        seeds = (
            sorted(leaders, key=lambda m: -fused.get(m, 0.0))
            if leaders
            else sorted(fused, key=lambda m: -fused[m])[:LINK_SEEDS]
        )
        link = _Channel("link")
        for reached in _hops(index, seeds, related, ok):
            rank = len(link.ranks) + 1  # one hop, one shared rank
            for mid, source in reached:
                via[mid] = memory_ref(source)
                if mid not in fused:
                    link.ranks[mid] = rank
        for mid, rank in link.ranks.items():
            if ok(mid):
                fused[mid] = WEIGHTS["link"] / (RRF_K + rank)
        channels.append(link)

    position = _positions(catalog.memory_order)
    adjusted = {mid: s * recency_factor(memories[mid].created_at, now) for mid, s in fused.items()}
    order = sorted(adjusted, key=lambda m: (-adjusted[m], position.get(m, 0)))
    if leaders and order and order[0] not in leaders:
        first = next((m for m in order if m in leaders), None)
        if first is not None:
            top = adjusted[order[0]]
            order.remove(first)
            order.insert(0, first)
            adjusted[first] = top
    if depth is not None:
        order = order[: max(depth, 0)]

    out: list[MemoryMatch] = []
    for mid in order:
        contributing = [
            (WEIGHTS[ch.name] / (RRF_K + ch.ranks[mid]), ch) for ch in channels if mid in ch.ranks
        ]
        piece_no = None
        for _, ch in sorted(contributing, key=lambda wc: -wc[0]):
            if mid in ch.pieces:
                piece_no = ch.pieces[mid]
                break
        if piece_no is None and mid in via and question is not None:
            hit = index.best_piece(question, mid)  # a linked memory still shows only its best piece
            piece_no = hit.piece_no if hit is not None else None
        piece = index.piece(mid, piece_no) if piece_no is not None else None
        out.append(
            MemoryMatch(
                memory_id=mid,
                score=adjusted[mid],
                piece=piece,
                piece_no=piece_no if piece is not None else None,
                via=via.get(mid),
                channels=tuple(ch.name for _, ch in contributing),
                tokens=tuple(dict.fromkeys(found_tokens.get(mid, ()))),
                named=mid in leaders,
                text_score=text_scores.get(mid, 0.0),
            )
        )
    return out


_positions_cache: tuple[tuple[str, ...], dict[str, int]] = ((), {})  # the last memory order seen


def _positions(order: tuple[str, ...]) -> dict[str, int]:
    """Storage positions (the tie order), computed once per catalog memory order (the cache is
    swapped in one assignment, so concurrent searches never see a half-made pair)."""
    global _positions_cache
    cached = _positions_cache
    if cached[0] is not order:
        cached = (order, {mid: i for i, mid in enumerate(order)})
        _positions_cache = cached
    return cached[1]


def _hops(index: MemoryPieceIndex, seeds: Sequence[str], hops: int, ok):  # noqa: ANN001, ANN202
    """Breadth-first over links: per hop, the (memory, memory it was reached from) pairs first
    reached at that hop, in seed order. Only allowed memories are entered or left."""
    seen = set(seeds)
    frontier = [s for s in seeds if ok(s)]
    for _ in range(hops):
        reached: list[tuple[str, str]] = []
        for source in frontier:
            for target in index.linked(source):
                if target not in seen and ok(target):
                    seen.add(target)
                    reached.append((target, source))
        if not reached:
            return
        yield reached
        frontier = [t for t, _ in reached]
