"""The memory piece index: one tantivy document per piece of a memory (``texts/pieces.py``).

``MemoryPieceIndex`` is a tantivy index in RAM with one document per piece (memory id, piece
number, text), updated per memory from a catalog ``Delta``. Its ranking returns one entry per
memory, the best piece, restricted before ranking to the memories the caller may return. Each
memory also has one *about* document: the words of the entities it is tagged with
(``jaffle.orders.order_total`` -> "jaffle orders order total"), ranked on its own (``rank_about``)
so that what a memory is about counts without its tag list ever being a piece.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Collection, Iterable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import tantivy
from immutables import Map

from slayer_lsp.catalog.ids import is_memory_ref, memory_id_of
from slayer_lsp.catalog.numbering import Numbering
from slayer_lsp.search import helper_threads
from slayer_lsp.search.exact_tokens import LiteralIndex
from slayer_lsp.search.fastfields import u64_values
from slayer_lsp.search.persistent import Moves, moved, note
from slayer_lsp.search.tantivy_open import open_index
from slayer_lsp.store import documents as d
from slayer_lsp.texts.pieces import piece_texts
from slayer_lsp.texts.words import TOKEN_RE, words_of

if TYPE_CHECKING:
    from slayer_lsp.catalog import Catalog, Delta

log = logging.getLogger(__name__)

# Function words dropped from pieces and questions alike. On one-sentence pieces BM25's length
# normalisation makes a rare "how" or "who" outweigh the content words; comparatives, negations
# and time words ("before", "more", "not", "first") are content in this domain and stay.
STOPWORDS = tuple(
    """
a an the and or but nor so yet if then than that this these those there here it its itself is are
was were be been being am do does did doing done have has had having will would shall should can
could may might must ought i me my mine myself we us our ours ourselves you your yours yourself
yourselves he him his himself she her hers herself they them their theirs themselves what which
who whom whose when where why how of to in on at by for with from into onto about as also just
ever very too please tell show give let lets s t d ll re ve m
""".split()
)
ANALYZER = "memory_pieces"


# --------------------------------------------------------------------------- searches begun early


def _first_fetch(depth: int) -> int:
    """How many pieces ``rank`` asks for first: a few per memory, fetched deeper when that did not
    hold ``depth`` memories."""
    return max(depth * 3, 32)


def _top_hits(
    searcher: tantivy.Searcher, query: tantivy.Query, limit: int
) -> list[tuple[float, tantivy.DocAddress]]:
    # count=False: no total counted (see fulltext.py)
    return searcher.search(query, limit, count=False).hits


@dataclass(frozen=True)
class Started:
    """``rank``'s and ``rank_about``'s first searches for one question, running on a helper thread
    (None: nothing could match). They serve exactly the arguments they were begun with."""

    question: str
    allow: Collection[str] | None
    depth: int
    text: Future[list[tuple[float, tantivy.DocAddress]]] | None
    about: Future[list[tuple[float, tantivy.DocAddress]]] | None

    def made_for(self, question: object, allow: Collection[str] | None, depth: int) -> bool:
        # the very allow set (a frozenset compared by value would cost a pass over it)
        return question == self.question and allow is self.allow and depth == self.depth


# --------------------------------------------------------------------------- the index


@dataclass(frozen=True, slots=True)
class PieceHit:
    """The best piece of one memory for a query."""

    memory_id: str
    piece_no: int
    text: str
    score: float


@dataclass(frozen=True, slots=True)
class _Entry:
    pieces: tuple[str, ...]
    tags: tuple[str, ...]
    about: str  # about_text(tags)


ABOUT_PIECE = 2**32  # the piece number of a memory's about document (never a real piece)
# restriction queries kept per generation: one per datasource searched (a store of 20 datasources
# searched in turn evicted every one of 16 and rebuilt its id list on every search)
RESTRICTIONS_KEPT = 64


def about_text(tags: Iterable[str]) -> str:
    """The words of a memory's entity tags (``memory:<id>`` links are not about anything)."""
    words: list[str] = []
    for tag in tags:
        if not is_memory_ref(tag):
            words.append(words_of(tag))
    return " ".join(" ".join(words).split())


def _schema() -> tantivy.Schema:
    builder = tantivy.SchemaBuilder()
    builder.add_text_field("mid", stored=False, tokenizer_name="raw")
    builder.add_unsigned_field("key", stored=False, indexed=False, fast=True)
    builder.add_unsigned_field("piece", stored=False, indexed=False, fast=True)
    builder.add_text_field("text", stored=False, tokenizer_name=ANALYZER)
    builder.add_text_field("about", stored=False, tokenizer_name=ANALYZER)
    return builder.build()


def _analyzer() -> tantivy.TextAnalyzer:
    """tantivy's ``en_stem`` (simple tokens, long ones dropped, lower-cased, stemmed) with the
    function words removed before stemming."""
    return (
        tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.simple())
        .filter(tantivy.Filter.remove_long(40))
        .filter(tantivy.Filter.lowercase())
        .filter(tantivy.Filter.custom_stopword(list(STOPWORDS)))
        .filter(tantivy.Filter.stemmer("english"))
        .build()
    )


def _query_text(question: str) -> str:
    """A question as plain query-parser input: words (lower-cased, so AND/OR/NOT are words) and
    compound tokens as phrases (``PROD-4471`` -> ``"prod 4471"``). It never fails to parse."""
    terms: list[str] = []
    for tok in TOKEN_RE.findall(question):
        parts = [p for p in re.split(r"[-.:@_]", tok.lower()) if p]
        if len(parts) > 1:
            terms.append('"' + " ".join(parts) + '"')
        elif parts:
            terms.append(parts[0])
    return " ".join(terms)


def _entry_of(mem: d.Memory) -> _Entry:
    tags = tuple(mem.entities)
    return _Entry(tuple(piece_texts(mem)), tags, about_text(tags))


def _note_links(tags: Moves, links: Moves, mid: str, entry: _Entry, *, joins: bool) -> None:
    """Record that ``mid`` leaves or joins the tag and link sets ``entry`` names."""
    for tag in entry.tags:
        note(tags, tag.casefold(), mid, joins=joins)
        if is_memory_ref(tag):
            note(links, memory_id_of(tag), mid, joins=joins)


class _PieceWriter:
    """The tantivy index and writer behind a chain of piece-index generations. Only the refresh
    (whoever derives the next generation) touches it; ``head`` is the generation of its last commit,
    the only one a next generation may be derived from in place."""

    def __init__(self) -> None:
        self.schema = _schema()
        self.tantivy = open_index(self.schema)
        self.tantivy.register_tokenizer(ANALYZER, _analyzer())
        self.writer = self.tantivy.writer(heap_size=16_000_000, num_threads=1)
        self.numbers: Numbering[str] = (
            Numbering()
        )  # memory id -> u64 fast-field key; a generation reads only its own
        self.head: MemoryPieceIndex | None = None
        self.closed = False

    def close(self) -> None:
        """Let go of the writer (its memory and threads) now rather than at a full GC pass."""
        if not self.closed:
            self.closed = True
            self.head = None  # a later change forks a writer of its own
            self.writer.wait_merging_threads()


_NO_ENTRIES: Map[str, _Entry] = Map()
_NO_IDS: Map[str, frozenset[str]] = Map()


class MemoryPieceIndex:
    """Pieces of every memory of one snapshot: a tantivy searcher (full text), a literal index
    (exact tokens), the tags of each memory (literal tag matches) and the links between memories
    (``memory:<id>`` tags, both directions).

    One generation, read-only: ``apply`` returns the next generation and leaves this one as it
    was (its searcher was taken after its own commit; its maps are persistent and shared with the
    next where unchanged), so a search on an older snapshot never sees a newer memory."""

    def __init__(
        self,
        _writer: _PieceWriter | None = None,
        _entries: Map[str, _Entry] = _NO_ENTRIES,
        _tag_members: Map[str, frozenset[str]] = _NO_IDS,
        _linked_from: Map[str, frozenset[str]] = _NO_IDS,
        literal: LiteralIndex | None = None,
        deletions: int = 0,
    ) -> None:
        """An empty index, or (from ``_put``) one generation of a writer."""
        self._w = _writer if _writer is not None else _PieceWriter()
        if _writer is None:
            self._w.head = self
        self._searcher = self._w.tantivy.searcher()
        self._names = self._w.numbers.names
        self._entries = _entries
        self._tag_members = _tag_members  # case-folded tag -> memory ids carrying it
        self._linked_from = _linked_from  # memory id -> memories whose tags name it
        # built on first use (``literal``): most questions carry no exact token, so the first search
        # after a start need not wait for it; derived per delta once a generation has it
        self._literal = literal
        self._literal_lock = threading.Lock()
        self.deletions = deletions  # replaced pieces still weigh in BM25 statistics until a rebuild
        # the restriction queries of the last allowed sets (a datasource's memories come as the same
        # frozenset call after call); per generation, since it names this generation's memories
        self._restrictions: dict[frozenset[str], tantivy.Query | None] = {}

    # ------------------------------------------------------------------ building

    @classmethod
    def build(
        cls, catalog: Catalog, known: Mapping[str, tuple[tuple[str, ...], str]] | None = None
    ) -> MemoryPieceIndex:
        """Every memory of ``catalog``; ``known``: memory id -> its pieces and about text, where
        already cut (``memory_entries``), in place of cutting them again."""
        if known is None:
            return cls().synced(catalog.memories)
        updates: dict[str, _Entry | None] = {}
        for mid, mem in catalog.memories.items():
            got = known.get(mid)
            updates[mid] = _entry_of(mem) if got is None else _Entry(got[0], tuple(mem.entities), got[1])
        return cls()._put(updates)

    def apply(self, catalog: Catalog, delta: Delta) -> MemoryPieceIndex:
        """The next generation: this one with the memories ``delta`` touches re-read from
        ``catalog`` (itself when the delta touches no memory)."""
        touched = [memory_id_of(c) for c in delta.touched if is_memory_ref(c)]
        return self.replaced(touched, catalog.memories) if touched else self

    def close(self) -> None:
        """Close the writer behind this chain of generations (their searchers keep answering)."""
        self._w.close()

    def rebuilt(self) -> MemoryPieceIndex:
        """A fresh index over the same memories (BM25 statistics without replaced pieces)."""
        return MemoryPieceIndex()._put(dict(self._entries))

    def synced(self, memories: Mapping[str, d.Memory]) -> MemoryPieceIndex:
        """The generation holding exactly ``memories`` (unchanged ones are not touched)."""
        gone = [m for m in self._entries if m not in memories]
        return self.replaced([*gone, *memories], memories)

    def replaced(self, memory_ids: Iterable[str], memories: Mapping[str, d.Memory]) -> MemoryPieceIndex:
        """The generation with these memories re-read from ``memories`` (absent ones removed); one
        commit."""
        updates: dict[str, _Entry | None] = {}
        for mid in memory_ids:
            mem = memories.get(mid)
            updates[mid] = None if mem is None else _entry_of(mem)
        return self._put(updates)

    def _put(self, updates: Mapping[str, _Entry | None]) -> MemoryPieceIndex:
        updates = {mid: e for mid, e in updates.items() if self._entries.get(mid) != e}
        if not updates:
            return self
        w = self._w
        if w.head is not self:  # a newer generation was derived from this one: fork a writer of our own
            log.info(
                "memory pieces: deriving from an older generation; indexing %d memories anew",
                len(self._entries),
            )
            base = MemoryPieceIndex()
            return base._put({**dict(self._entries), **updates})
        deletions = self.deletions
        entries = self._entries.mutate()
        tags: Moves = {}  # case-folded tag -> (memories gone, memories new)
        links: Moves = {}  # linked memory -> (sources gone, sources new)
        literal_gone: list[str] = []
        literal_new: list[tuple[str, tuple[str, ...]]] = []
        for mid, entry in updates.items():
            old = entries.get(mid)
            if old is not None:
                w.writer.delete_documents_by_term("mid", mid)
                deletions += len(old.pieces) + bool(old.about)
                _note_links(tags, links, mid, old, joins=False)
                literal_gone.append(mid)
                del entries[mid]
            if entry is not None:
                key = w.numbers.of(mid)
                for n, text in enumerate(entry.pieces):
                    doc = tantivy.Document()
                    doc.add_text("mid", mid)
                    doc.add_unsigned("key", key)
                    doc.add_unsigned("piece", n)
                    doc.add_text("text", text)
                    w.writer.add_document(doc)
                about = entry.about
                if about:
                    doc = tantivy.Document()
                    doc.add_text("mid", mid)
                    doc.add_unsigned("key", key)
                    doc.add_unsigned("piece", ABOUT_PIECE)
                    doc.add_text("about", about)
                    w.writer.add_document(doc)
                entries[mid] = entry
                _note_links(tags, links, mid, entry, joins=True)
                literal_new.append((mid, entry.pieces))
        w.writer.commit()
        w.tantivy.reload()
        nxt = MemoryPieceIndex(
            w,
            entries.finish(),
            moved(self._tag_members, tags),
            moved(self._linked_from, links),
            self._literal.replaced(literal_gone, literal_new) if self._literal is not None else None,
            deletions,
        )
        w.head = nxt
        return nxt

    # ------------------------------------------------------------------ lookups

    @property
    def literal(self) -> LiteralIndex:
        """Exact-token lookup over this generation's pieces, built the first time it is asked for
        (by a question with an exact token, or by the warm-up after the first search's needs)."""
        literal = self._literal
        if literal is None:
            with self._literal_lock:
                literal = self._literal
                if literal is None:
                    literal = self._literal = LiteralIndex((m, e.pieces) for m, e in self._entries.items())
        return literal

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, memory_id: str) -> bool:
        return memory_id in self._entries

    def pieces(self, memory_id: str) -> tuple[str, ...]:
        entry = self._entries.get(memory_id)
        return entry.pieces if entry is not None else ()

    def piece(self, memory_id: str, piece_no: int) -> str | None:
        pieces = self.pieces(memory_id)
        return pieces[piece_no] if 0 <= piece_no < len(pieces) else None

    def tagged_with(self, tag: str) -> frozenset[str]:
        """Memories carrying ``tag`` (compared case-insensitively, as exact tokens are)."""
        return self._tag_members.get(tag.casefold(), frozenset())

    def linked(self, memory_id: str) -> tuple[str, ...]:
        """Memories linked to this one in either direction: the memories its ``memory:<id>`` tags
        name, and those whose tags name it (sorted, for a stable traversal)."""
        entry = self._entries.get(memory_id)
        out = {memory_id_of(t) for t in entry.tags if is_memory_ref(t)} if entry is not None else set()
        out |= self._linked_from.get(memory_id, frozenset())
        out.discard(memory_id)
        return tuple(sorted(out))

    # ------------------------------------------------------------------ ranking

    def parse(self, question: str, field: str = "text") -> tantivy.Query | None:
        text = _query_text(question)
        if not text:
            return None
        try:
            return self._w.tantivy.parse_query(text, [field])
        except ValueError:  # not expected for plain words and phrases; never fatal
            log.debug("piece query %r did not parse", text)
            return None

    def start(self, question: str, *, allow: Collection[str] | None = None, depth: int = 1000) -> Started:
        """The first searches ``rank`` and ``rank_about`` make for these arguments, begun now on a
        helper thread: tantivy lets go of the GIL while it searches, so they run while the caller
        scores its entities. Hand the result to both (their answers are the same either way)."""
        limit = _first_fetch(depth)
        searcher = self._searcher
        text = self._restricted(self.parse(question), allow, depth)
        about = self._restricted(self.parse(question, "about"), allow, depth)
        return Started(
            question,
            allow,
            depth,
            helper_threads.begin(_top_hits, searcher, text, limit) if text is not None else None,
            helper_threads.begin(_top_hits, searcher, about, depth) if about is not None else None,
        )

    def rank(
        self,
        question: str | tantivy.Query | None,
        *,
        allow: Collection[str] | None = None,
        depth: int = 1000,
        started: Started | None = None,
    ) -> list[PieceHit]:
        """Memories whose pieces match ``question``, best first, each with its best piece (ties in
        tantivy's order), at most ``depth`` memories; ``allow`` restricts the ranking before it is
        scored (a memory outside it is never looked at). ``started``: this search begun by ``start``."""
        begun = started is not None and started.made_for(question, allow, depth)
        first = started.text if started is not None and begun else None
        if begun and first is None:
            return []  # begun, and nothing could match
        full: tantivy.Query | None = None
        limit = _first_fetch(depth)
        searcher = self._searcher
        while True:
            if first is not None:
                hits, first = first.result(), None
            else:
                if full is None:  # not begun, or deeper than the search begun: the query is needed now
                    full = self._restricted(
                        self.parse(question) if isinstance(question, str) else question, allow, depth
                    )
                    if full is None:
                        return []
                hits = _top_hits(searcher, full, limit)
            addrs = [addr for _, addr in hits]
            keys = u64_values(searcher, "key", addrs)
            nos = u64_values(searcher, "piece", addrs)
            names, entries = self._names, self._entries
            best: dict[str, PieceHit] = {}
            for (score, _), key, no in zip(hits, keys, nos, strict=True):
                mid = names[key]
                if mid not in best:
                    best[mid] = PieceHit(mid, int(no), entries[mid].pieces[no], float(score))
                    if len(best) == depth:  # the first ``depth`` memories in rank order are all
                        return list(best.values())
            if len(hits) < limit:
                return list(best.values())
            limit *= 4

    def rank_about(
        self,
        question: str | None,
        *,
        allow: Collection[str] | None = None,
        depth: int = 1000,
        started: Started | None = None,
    ) -> list[tuple[str, float]]:
        """Memories whose tags' words match ``question`` (BM25 over the about documents), best
        first, restricted before ranking like ``rank``. ``started``: this search begun by ``start``."""
        searcher = self._searcher
        if started is not None and question is not None and started.made_for(question, allow, depth):
            if started.about is None:
                return []
            hits = started.about.result()
        else:
            query = self.parse(question, "about") if question else None
            full = self._restricted(query, allow, depth)
            if full is None:
                return []
            hits = _top_hits(searcher, full, depth)
        keys = u64_values(searcher, "key", [addr for _, addr in hits])
        return [(self._names[k], float(score)) for (score, _), k in zip(hits, keys, strict=True)]

    def _restricted(
        self, query: tantivy.Query | None, allow: Collection[str] | None, depth: int
    ) -> tantivy.Query | None:
        """``query`` limited to the allowed memories (a filter: scores stay the query's own), or
        None when nothing can match."""
        if query is None or depth <= 0 or (allow is not None and not allow):
            return None
        clauses = [(tantivy.Occur.Must, query)]
        if allow is not None:
            key = allow if isinstance(allow, frozenset) else None
            cached: tantivy.Query | Literal[False] | None = (  # False: not cached
                self._restrictions.get(key, False) if key is not None else False
            )
            if cached is False:
                ids = [m for m in allow if m in self._entries]
                if not ids:
                    return None
                cached = None
                if len(ids) < len(self._entries):
                    restrict = tantivy.Query.term_set_query(self._w.schema, "mid", ids)
                    cached = tantivy.Query.const_score_query(restrict, 0.0)
                if key is not None:
                    if len(self._restrictions) >= RESTRICTIONS_KEPT:  # the oldest goes
                        self._restrictions.pop(next(iter(self._restrictions), key), None)
                    self._restrictions[key] = cached
            if cached is not None:
                clauses.append((tantivy.Occur.Must, cached))
        return tantivy.Query.boolean_query(clauses)

    def best_piece(self, question: str | tantivy.Query | None, memory_id: str) -> PieceHit | None:
        """The best piece of one memory for ``question`` (None when nothing in it matches)."""
        hits = self.rank(question, allow=(memory_id,), depth=1)
        return hits[0] if hits else None
