"""Channel 1: BM25Plus over memory tags, with each memory implicitly tagged with itself.

Each canonical tag is one atomic token. Statistics (N, document frequencies, average length) come
from the memories in the searched scope, with tags outside the scope's valid set ignored, exactly as
SLayer computes them; but the corpus is an inverted index kept per catalog generation rather than
rebuilt per call, and scores are summed in a fixed term order and rounded before sorting, so ties do
not depend on Python's hash seed (SLayer's do).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from slayer_lsp.catalog.ids import memory_ref
from slayer_lsp.store import documents as d

K1, B, DELTA = 1.5, 0.75, 1.0


@dataclass(frozen=True)
class TagCorpus:
    """BM25 statistics of one scope: memories in listing order, their live tags, and postings."""

    order: tuple[str, ...]  # memory ids in storage order (the tie order)
    doc_len: dict[str, int]
    postings: dict[str, tuple[str, ...]]  # tag -> memory ids having it
    avgdl: float

    @classmethod
    def build(cls, memories: Sequence[d.Memory], is_valid: Callable[[str], bool]) -> TagCorpus:
        doc_len: dict[str, int] = {}
        postings: dict[str, list[str]] = {}
        total = 0
        for mem in memories:
            tags = {t for t in mem.entities if is_valid(t)}
            tags.add(memory_ref(mem.id))
            doc_len[mem.id] = len(tags)
            total += len(tags)
            for t in tags:
                postings.setdefault(t, []).append(mem.id)
        n = len(doc_len)
        return cls(
            tuple(m.id for m in memories),
            doc_len,
            {t: tuple(ids) for t, ids in postings.items()},
            (total / n) if n else 0.0,
        )

    def rank(self, query_tags: Sequence[str]) -> list[tuple[str, float]]:
        """Memories sharing at least one tag with the query, best first (ties in storage order)."""
        n = len(self.order)
        terms = sorted(set(query_tags))
        eligible: set[str] = set()
        for t in terms:
            eligible.update(self.postings.get(t, ()))
        if not eligible or n == 0:
            return []
        idf = {t: math.log((n + 1) / len(self.postings[t])) for t in terms if t in self.postings}
        member_sets = {t: set(self.postings[t]) for t in idf}
        scored: list[tuple[float, int, str, float]] = []
        position = {mid: i for i, mid in enumerate(self.order)} if len(eligible) > 1 else {}
        for mid in eligible:
            norm = K1 * (1 - B + B * self.doc_len[mid] / self.avgdl)
            score = 0.0
            for t, w in idf.items():
                tf = 1.0 if mid in member_sets[t] else 0.0
                score += w * (DELTA + tf * (K1 + 1) / (norm + tf))
            scored.append((-round(score, 9), position.get(mid, 0), mid, score))
        scored.sort()
        return [(mid, score) for _, _, mid, score in scored]
