"""The stems of each memory and their document frequencies: how much of a memory a question covers.

A memory that *answers* a question is usually explained by it almost entirely: most of the
memory's distinctive words are the question's ("highest overall rating refers to
MAX(overall_rating)" for "Which player has the highest overall rating?"), while a memory that
only shares a word with it is mostly about something else. BM25 rewards the shared words but,
over a short text, barely penalises the rest; ``coverage`` measures the rest: the IDF-weighted
share of the memory's stems that the question holds, in [0, 1] and comparable between memories.

A value of one snapshot: ``derive`` makes the next snapshot's from the memories a delta touches
(the maps are copied shallowly, never changed in place), so an older snapshot's searches keep
their own statistics.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from slayer_lsp.catalog.ids import is_memory_ref, memory_id_of
from slayer_lsp.search.name_stems import stems

_UNSET: Any = object()
_MAX_WEIGHTED = 4096  # memories whose weights a snapshot keeps (the rest are weighed per search)

if TYPE_CHECKING:
    from slayer_lsp.catalog import Catalog, Delta
    from slayer_lsp.store import documents as d


def memory_stems(memory: d.Memory) -> frozenset[str]:
    """The distinct stems of a memory's prose (learning and description; tags are not prose)."""
    return frozenset(stems(f"{memory.learning or ''} {memory.description or ''}"))


@dataclass(frozen=True)
class MemoryTerms:
    by_memory: Mapping[str, frozenset[str]]
    doc_freq: Mapping[str, int]
    _weights: dict[str, tuple[float, dict[str, tuple[int, float]]] | None] = field(
        default_factory=dict, compare=False, repr=False
    )  # memory id -> its IDF total and term IDFs, filled by the searches of this snapshot

    @classmethod
    def build(cls, catalog: Catalog, known: Mapping[str, frozenset[str]] | None = None) -> MemoryTerms:
        """Every memory's stems; ``known``: those already stemmed (``memory_entries``), by memory id."""
        if known is None:
            by_memory = {mid: memory_stems(m) for mid, m in catalog.memories.items()}
        else:
            by_memory = {mid: known.get(mid) or memory_stems(m) for mid, m in catalog.memories.items()}
        doc_freq: dict[str, int] = {}
        for terms in by_memory.values():
            for t in terms:
                doc_freq[t] = doc_freq.get(t, 0) + 1
        return cls(by_memory, doc_freq)

    def derive(self, catalog: Catalog, delta: Delta) -> MemoryTerms:
        """The next snapshot's terms: only the memories ``delta`` touches are stemmed again."""
        touched = [memory_id_of(c) for c in delta.touched if is_memory_ref(c)]
        if not touched:
            return self
        by_memory, doc_freq = dict(self.by_memory), dict(self.doc_freq)
        for mid in touched:
            for t in by_memory.pop(mid, ()):
                left = doc_freq[t] - 1
                if left:
                    doc_freq[t] = left
                else:
                    del doc_freq[t]
            mem = catalog.memories.get(mid)
            if mem is not None:
                terms = by_memory[mid] = memory_stems(mem)
                for t in terms:
                    doc_freq[t] = doc_freq.get(t, 0) + 1
        return MemoryTerms(by_memory, doc_freq)

    def idf(self, term: str) -> float:
        """BM25's IDF over the memories (never negative)."""
        n, df = len(self.by_memory), self.doc_freq.get(term, 0)
        return math.log(1.0 + (n - df + 0.5) / (df + 0.5))

    def text_coverage(self, question_stems: Collection[str], text: str) -> float:
        """``coverage`` of one text (a piece of a long memory), with the memories' statistics."""
        terms = sorted(frozenset(stems(text)))  # sorted: sums never follow the hash seed
        total = sum(self.idf(t) for t in terms)
        asked = frozenset(question_stems)
        return sum(self.idf(t) for t in terms if t in asked) / total if total else 0.0

    def coverage(self, question_stems: Collection[str], memory_ids: Collection[str]) -> dict[str, float]:
        """Per memory: the IDF-weighted share of its stems that the question holds (0 for a memory
        without prose or unknown here)."""
        asked = frozenset(question_stems)
        out: dict[str, float] = {}
        for mid in memory_ids:
            weighted = self._weighted(mid)
            if weighted is None:
                out[mid] = 0.0
                continue
            total, weights = weighted
            if total:
                # the question's few stems looked up, then summed in the memory's own term order
                # (the same float every time, whatever the question's order)
                found = sorted(pw for t in asked if (pw := weights.get(t)) is not None)
                shared = 0.0
                for _, w in found:
                    shared += w
                out[mid] = shared / total
            else:
                out[mid] = 0.0
        return out

    def _weighted(self, mid: str) -> tuple[float, dict[str, tuple[int, float]]] | None:
        """A memory's total IDF and, per term, its place among the memory's terms and its IDF
        (computed once per snapshot: a search weighs a hundred memories, and the next search
        mostly the same ones)."""
        cached = self._weights.get(mid, _UNSET)
        if cached is not _UNSET:
            return cached
        terms = self.by_memory.get(mid)
        value = None
        if terms:
            ordered = sorted(terms)  # a set's order follows the hash seed; sums must not
            idfs = [self.idf(t) for t in ordered]
            value = (sum(idfs), {t: (i, w) for i, (t, w) in enumerate(zip(ordered, idfs, strict=True))})
        if len(self._weights) < _MAX_WEIGHTED:
            self._weights[mid] = value
        return value
