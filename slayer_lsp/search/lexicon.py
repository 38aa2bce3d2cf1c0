"""The schema lexicon: name words, sampled values, value shapes and join keys of every entity.

What the hybrid ranking needs besides the full-text and dense channels, kept per snapshot and
updated per ``Delta`` (only the touched entities are re-read). Plain data; no ranking here.
"""

from __future__ import annotations

import heapq
import math
import threading
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from slayer_lsp.catalog import Catalog, Delta
from slayer_lsp.catalog.ids import child_id, is_memory_ref
from slayer_lsp.search import name_stems, sampled_values

LEAF_KINDS = ("column", "measure", "aggregation")
MAX_POSTINGS = 20000  # a stem in more names than this says nothing (its idf is ~0): skipped


@dataclass
class Lexicon:
    """Stems per entity name, value terms per column, shapes per column, declared joins per model."""

    stems: dict[str, tuple[str, ...]] = field(default_factory=dict)  # leaf or model id -> name stems
    postings: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))  # stem -> ids
    terms: dict[str, frozenset[str]] = field(default_factory=dict)  # column id -> its value terms
    by_value: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))  # term -> column ids
    shapes: dict[str, frozenset[str]] = field(default_factory=dict)  # column id -> value shapes
    joins: dict[str, tuple[tuple[str, str, str], ...]] = field(default_factory=dict)
    # model id -> ((other model id, key column here, key column there), ...): each join's first pair
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def build(cls, catalog: Catalog) -> Lexicon:
        lex = cls()
        lex._update(catalog, catalog.searchable_ids())
        return lex

    def apply(self, catalog: Catalog, delta: Delta) -> Lexicon:
        """Re-read the touched entities in place (the lexicon is shared between snapshots, like the
        full-text index; readers take the lock)."""
        touched = [c for c in delta.touched if not is_memory_ref(c)]
        with self._lock:
            for cid in touched:
                self._remove(cid)
        self._update(catalog, touched)
        return self

    def _remove(self, cid: str) -> None:
        for stem in self.stems.pop(cid, ()):
            ids = self.postings.get(stem)
            if ids is not None:
                ids.discard(cid)
                if not ids:
                    del self.postings[stem]
        for term in self.terms.pop(cid, ()):
            ids = self.by_value.get(term)
            if ids is not None:
                ids.discard(cid)
                if not ids:
                    del self.by_value[term]
        self.shapes.pop(cid, None)
        self.joins.pop(cid, None)

    def _update(self, catalog: Catalog, ids: Iterable[str]) -> None:
        entries = []
        for cid in ids:
            ent = catalog.get(cid)
            if ent is None or ent.hidden or ent.kind not in (*LEAF_KINDS, "model"):
                continue
            entries.append(_entry(catalog, ent))
        with self._lock:
            for cid, stems, terms, shapes, joins in entries:
                self._remove(cid)
                self.stems[cid] = stems
                for stem in stems:
                    self.postings[stem].add(cid)
                if terms:
                    self.terms[cid] = terms
                    for term in terms:
                        self.by_value[term].add(cid)
                if shapes:
                    self.shapes[cid] = shapes
                if joins is not None:
                    self.joins[cid] = joins

    # ------------------------------------------------------------------ lookups

    def name_scores(self, question_stems: Iterable[str], allow=None, limit: int = 200) -> dict[str, float]:  # noqa: ANN001
        """IDF-weighted overlap of the question's stems with each name, damped by name length: the
        ``limit`` best."""
        n = max(len(self.stems), 1)
        scores: dict[str, float] = defaultdict(float)
        with self._lock:
            for stem in sorted(set(question_stems)):  # sorted: float sums never depend on the hash seed
                ids = self.postings.get(stem)
                if not ids or len(ids) > MAX_POSTINGS:
                    continue
                df = len(ids)
                idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
                for cid in ids:
                    if allow is None or cid in allow:
                        scores[cid] += idf
            stems = self.stems
            damped = {cid: s / (1 + 0.1 * len(stems[cid])) for cid, s in scores.items()}
        if len(damped) <= limit:
            return damped
        return dict(heapq.nlargest(limit, damped.items(), key=lambda kv: (kv[1], kv[0])))

    def value_matches(self, question: str, allow=None) -> set[str]:  # noqa: ANN001
        """Columns one of whose sampled values the question names."""
        out: set[str] = set()
        with self._lock:
            for gram in sampled_values.question_ngrams(question):
                ids = self.by_value.get(gram)
                if ids:
                    out.update(c for c in ids if allow is None or c in allow)
        return out

    def shapes_of(self, cid: str) -> frozenset[str]:
        return self.shapes.get(cid, frozenset())

    def join_keys(self, a: str, b: str) -> list[str]:
        """The key columns of the first declared join between two models (either direction)."""
        out: list[str] = []
        for here, there in ((a, b), (b, a)):
            for other, key_here, key_there in self.joins.get(here, ()):
                if other == there:
                    out += [key_here, key_there]
                    break
        return list(dict.fromkeys(out))


def _entry(catalog: Catalog, ent) -> tuple:  # noqa: ANN001
    obj = ent.obj
    label = getattr(obj, "label", None)
    if ent.kind == "model":
        model_stems = name_stems.name_stems(obj.name, None, obj.description)
        if obj.description:
            model_stems = list(dict.fromkeys(model_stems + name_stems.stems(obj.description)))
        joins = []
        for j in obj.joins or []:
            if not j.join_pairs:
                continue
            other = child_id(obj.data_source, j.target_model)
            here, there = j.join_pairs[0]
            k_here, k_there = child_id(ent.canonical, here), child_id(other, there)
            if k_here in catalog.entities and k_there in catalog.entities:
                joins.append((other, k_here, k_there))
        return ent.canonical, tuple(model_stems), frozenset(), frozenset(), tuple(joins)
    stems = tuple(name_stems.name_stems(obj.name, label, getattr(obj, "description", None)))
    terms: frozenset[str] = frozenset()
    shapes: frozenset[str] = frozenset()
    if ent.kind == "column":
        sampled = [str(v) for v in (obj.sampled_values or [])]
        terms = frozenset(sampled_values.value_terms(sampled))
        shapes = sampled_values.column_shapes(sampled, obj.type)
    return ent.canonical, stems, terms, shapes, None
