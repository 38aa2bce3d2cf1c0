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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import tantivy

from slayer_lsp.catalog.ids import is_memory_ref, memory_id_of
from slayer_lsp.search.exact_tokens import LiteralIndex
from slayer_lsp.search.fastfields import u64_values
from slayer_lsp.store import documents as d
from slayer_lsp.texts.pieces import piece_texts
from slayer_lsp.texts.words import TOKEN_RE, words_of

if TYPE_CHECKING:
    from slayer_lsp.catalog import Catalog, Delta

log = logging.getLogger(__name__)

# Function words dropped from pieces and questions alike. On one-sentence pieces BM25's length
# normalisation makes a rare "how" or "who" outweigh the content words; comparatives, negations
# and time words ("before", "more", "not", "first") are content in this domain and stay.
STOPWORDS = tuple("""
a an the and or but nor so yet if then than that this these those there here it its itself is are
was were be been being am do does did doing done have has had having will would shall should can
could may might must ought i me my mine myself we us our ours ourselves you your yours yourself
yourselves he him his himself she her hers herself they them their theirs themselves what which
who whom whose when where why how of to in on at by for with from into onto about as also just
ever very too please tell show give let lets s t d ll re ve m
""".split())
ANALYZER = "memory_pieces"


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

    @property
    def about(self) -> str:
        return about_text(self.tags)


ABOUT_PIECE = 2**32  # the piece number of a memory's about document (never a real piece)
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
    return (tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.simple())
            .filter(tantivy.Filter.remove_long(40))
            .filter(tantivy.Filter.lowercase())
            .filter(tantivy.Filter.custom_stopword(list(STOPWORDS)))
            .filter(tantivy.Filter.stemmer("english"))
            .build())


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


class MemoryPieceIndex:
    """Pieces of every memory of a catalog: a tantivy index (full text), a literal index (exact
    tokens), the tags of each memory (literal tag matches) and the links between memories
    (``memory:<id>`` tags, both directions)."""

    def __init__(self) -> None:
        self._schema = _schema()
        self._index = tantivy.Index(self._schema)
        self._index.register_tokenizer(ANALYZER, _analyzer())
        self._writer = self._index.writer(heap_size=16_000_000, num_threads=1)
        self._lock = threading.RLock()
        self._entries: dict[str, _Entry] = {}
        self._keys: dict[str, int] = {}  # memory id -> u64 fast-field key
        self._names: list[str] = []
        self._tag_members: dict[str, set[str]] = {}  # case-folded tag -> memory ids carrying it
        self._linked_from: dict[str, set[str]] = {}  # memory id -> memories whose tags name it
        self.literal = LiteralIndex()
        self.deletions = 0  # replaced pieces still weigh in BM25 statistics until a rebuild
        # the restriction query of the last allowed sets (a datasource's memories come as the same
        # frozenset call after call); emptied whenever the memories change
        self._restrictions: dict[frozenset[str], tantivy.Query | None] = {}

    # ------------------------------------------------------------------ building

    @classmethod
    def build(cls, catalog: Catalog) -> MemoryPieceIndex:
        index = cls()
        index.sync(catalog.memories)
        return index

    def apply(self, catalog: Catalog, delta: Delta) -> MemoryPieceIndex:
        """Bring the index up to date with ``catalog`` for the memories ``delta`` touches (in
        place; returns itself, as ``SearchIndexes.apply`` expects of its parts)."""
        touched = [memory_id_of(c) for c in delta.touched if is_memory_ref(c)]
        if touched:
            self.replace(touched, catalog.memories)
        return self

    def rebuilt(self) -> MemoryPieceIndex:
        """A fresh index over the same memories (BM25 statistics without replaced pieces)."""
        fresh = MemoryPieceIndex()
        with self._lock:
            entries = dict(self._entries)
        fresh._put(entries)
        return fresh

    def sync(self, memories: Mapping[str, d.Memory]) -> None:
        """Make the index hold exactly ``memories`` (unchanged ones are not touched)."""
        with self._lock:
            gone = [m for m in self._entries if m not in memories]
        self.replace([*gone, *memories], memories)

    def replace(self, memory_ids: Iterable[str], memories: Mapping[str, d.Memory]) -> None:
        """Re-read these memories from ``memories`` (absent ones are removed); one commit."""
        self._restrictions = {}
        updates: dict[str, _Entry | None] = {}
        for mid in memory_ids:
            mem = memories.get(mid)
            updates[mid] = None if mem is None else _Entry(tuple(piece_texts(mem)), tuple(mem.entities))
        self._put(updates)

    def _put(self, updates: Mapping[str, _Entry | None]) -> None:
        with self._lock:
            changed = False
            literal_gone: list[str] = []
            literal_new: list[tuple[str, tuple[str, ...]]] = []
            for mid, entry in updates.items():
                old = self._entries.get(mid)
                if old == entry:
                    continue
                if old is not None:
                    self._writer.delete_documents_by_term("mid", mid)
                    self.deletions += len(old.pieces) + bool(old.about)
                    self._unlink(mid, old)
                    literal_gone.append(mid)
                    del self._entries[mid]
                if entry is not None:
                    key = self._keys.get(mid)
                    if key is None:
                        key = self._keys[mid] = len(self._names)
                        self._names.append(mid)
                    for n, text in enumerate(entry.pieces):
                        doc = tantivy.Document()
                        doc.add_text("mid", mid)
                        doc.add_unsigned("key", key)
                        doc.add_unsigned("piece", n)
                        doc.add_text("text", text)
                        self._writer.add_document(doc)
                    if entry.about:
                        doc = tantivy.Document()
                        doc.add_text("mid", mid)
                        doc.add_unsigned("key", key)
                        doc.add_unsigned("piece", ABOUT_PIECE)
                        doc.add_text("about", entry.about)
                        self._writer.add_document(doc)
                    self._entries[mid] = entry
                    self._link(mid, entry)
                    literal_new.append((mid, entry.pieces))
                changed = True
            if changed:
                self._writer.commit()
                self._index.reload()
                self.literal.replace(literal_gone, literal_new)

    def _link(self, mid: str, entry: _Entry) -> None:
        for tag in entry.tags:
            self._tag_members.setdefault(tag.casefold(), set()).add(mid)
            if is_memory_ref(tag):
                self._linked_from.setdefault(memory_id_of(tag), set()).add(mid)

    def _unlink(self, mid: str, entry: _Entry) -> None:
        for tag in entry.tags:
            members = self._tag_members.get(tag.casefold())
            if members is not None:
                members.discard(mid)
                if not members:
                    del self._tag_members[tag.casefold()]
            if is_memory_ref(tag):
                sources = self._linked_from.get(memory_id_of(tag))
                if sources is not None:
                    sources.discard(mid)
                    if not sources:
                        del self._linked_from[memory_id_of(tag)]

    # ------------------------------------------------------------------ lookups

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
        with self._lock:
            return frozenset(self._tag_members.get(tag.casefold(), ()))

    def linked(self, memory_id: str) -> tuple[str, ...]:
        """Memories linked to this one in either direction: the memories its ``memory:<id>`` tags
        name, and those whose tags name it (sorted, for a stable traversal)."""
        with self._lock:
            entry = self._entries.get(memory_id)
            out = {memory_id_of(t) for t in entry.tags if is_memory_ref(t)} if entry is not None else set()
            out |= self._linked_from.get(memory_id, set())
        out.discard(memory_id)
        return tuple(sorted(out))

    # ------------------------------------------------------------------ ranking

    def parse(self, question: str, field: str = "text") -> tantivy.Query | None:
        text = _query_text(question)
        if not text:
            return None
        try:
            return self._index.parse_query(text, [field])
        except ValueError:  # not expected for plain words and phrases; never fatal
            log.debug("piece query %r did not parse", text)
            return None

    def rank(self, question: str | tantivy.Query | None, *, allow: Collection[str] | None = None,
             depth: int = 1000) -> list[PieceHit]:
        """Memories whose pieces match ``question``, best first, each with its best piece (ties in
        tantivy's order), at most ``depth`` memories; ``allow`` restricts the ranking before it is
        scored (a memory outside it is never looked at)."""
        query = self.parse(question) if isinstance(question, str) else question
        full = self._restricted(query, allow, depth)
        if full is None:
            return []
        limit = max(depth * 3, 32)  # a few pieces per memory; fetched deeper when that was not enough
        while True:
            with self._lock:
                searcher = self._index.searcher()
                hits = searcher.search(full, limit).hits
                addrs = [addr for _, addr in hits]
                keys = u64_values(searcher, "key", addrs)
                nos = u64_values(searcher, "piece", addrs)
                names = self._names
                best: dict[str, PieceHit] = {}
                for (score, _), key, no in zip(hits, keys, nos, strict=True):
                    mid = names[key]
                    if mid not in best:
                        best[mid] = PieceHit(mid, int(no), self._entries[mid].pieces[no], float(score))
            if len(best) >= depth or len(hits) < limit:
                return list(best.values())[:depth]
            limit *= 4

    def rank_about(self, question: str | None, *, allow: Collection[str] | None = None,
                   depth: int = 1000) -> list[tuple[str, float]]:
        """Memories whose tags' words match ``question`` (BM25 over the about documents), best
        first, restricted before ranking like ``rank``."""
        query = self.parse(question, "about") if question else None
        full = self._restricted(query, allow, depth)
        if full is None:
            return []
        with self._lock:
            searcher = self._index.searcher()
            hits = searcher.search(full, depth).hits
            keys = u64_values(searcher, "key", [addr for _, addr in hits])
            return [(self._names[k], float(score)) for (score, _), k in zip(hits, keys, strict=True)]

    def _restricted(self, query: tantivy.Query | None, allow: Collection[str] | None,
                    depth: int) -> tantivy.Query | None:
        """``query`` limited to the allowed memories (a filter: scores stay the query's own), or
        None when nothing can match."""
        if query is None or depth <= 0 or (allow is not None and not allow):
            return None
        clauses = [(tantivy.Occur.Must, query)]
        if allow is not None:
            key = allow if isinstance(allow, frozenset) else None
            cached: tantivy.Query | Literal[False] | None = (  # False: not cached
                self._restrictions.get(key, False) if key is not None else False)
            if cached is False:
                ids = [m for m in allow if m in self._entries]
                if not ids:
                    return None
                cached = None
                if len(ids) < len(self._entries):
                    restrict = tantivy.Query.term_set_query(self._schema, "mid", ids)
                    cached = tantivy.Query.const_score_query(restrict, 0.0)
                if key is not None:
                    if len(self._restrictions) >= 16:
                        self._restrictions.clear()
                    self._restrictions[key] = cached
            if cached is not None:
                clauses.append((tantivy.Occur.Must, cached))
        return tantivy.Query.boolean_query(clauses)

    def best_piece(self, question: str | tantivy.Query | None, memory_id: str) -> PieceHit | None:
        """The best piece of one memory for ``question`` (None when nothing in it matches)."""
        hits = self.rank(question, allow=(memory_id,), depth=1)
        return hits[0] if hits else None
