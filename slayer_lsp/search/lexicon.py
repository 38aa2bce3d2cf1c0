"""The schema lexicon: name words, sampled values, value shapes and join keys of every entity.

What the hybrid ranking needs besides the full-text and dense channels, kept per snapshot and
updated per ``Delta`` (only the touched entities are re-read). Plain data; no ranking here.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from operator import itemgetter
from typing import TypeVar

import numpy as np
from immutables import Map

from slayer_lsp.catalog import Catalog, Delta
from slayer_lsp.catalog.ids import is_memory_ref
from slayer_lsp.catalog.layered import LayeredMap
from slayer_lsp.catalog.numbering import Numbering, pick
from slayer_lsp.search import lexicon_entries, sampled_values
from slayer_lsp.search.persistent import Moves, moved, note

LEAF_KINDS = lexicon_entries.LEAF_KINDS
_V = TypeVar("_V")
_score_then_id = itemgetter(1, 0)
MAX_POSTINGS = 20000  # a stem in more names than this says nothing (its idf is ~0): skipped


_NO_IDS: Map[str, frozenset[str]] = Map()
_NO_POSTINGS: Map[str, np.ndarray] = Map()
_NO_NUMBERS = np.zeros(0, dtype=np.int32)


@dataclass(frozen=True, eq=False)
class Lexicon:
    """Stems per entity name, value terms per column, shapes per column, declared joins per model.

    A value of one snapshot: ``apply`` returns the next snapshot's lexicon and leaves this one as it
    was. The maps are persistent: the next lexicon shares every entry the delta did not touch, and
    a posting set is replaced whole, never changed in place. The maps by id are ``LayeredMap``s (a
    dict of the first build under the changes since: 400,000 ids made into one ``immutables.Map``
    took seconds at 10,000 models); those by stem or term are small enough to be ``Map``s."""

    stems: LayeredMap[tuple[str, ...]] = field(default_factory=LayeredMap)  # leaf or model id -> name stems
    # stem -> the numbers (``numbers``) of the ids whose name has it, sorted: scoring a question adds
    # whole arrays, where a set of ids would cost a Python step per id
    postings: Map[str, np.ndarray] = _NO_POSTINGS
    terms: LayeredMap[frozenset[str]] = field(default_factory=LayeredMap)  # column id -> its value terms
    by_value: Map[str, frozenset[str]] = _NO_IDS  # term -> column ids
    shapes: LayeredMap[frozenset[str]] = field(default_factory=LayeredMap)  # column id -> value shapes
    joins: LayeredMap[tuple[tuple[str, str, str], ...]] = field(default_factory=LayeredMap)
    # model id -> ((other model id, key column here, key column there), ...): each join's first pair
    numbers: Numbering[str] = field(default_factory=Numbering)  # shared by the generations
    # number -> how many stems its name has (this generation's)
    lengths: np.ndarray = field(default_factory=_NO_NUMBERS.copy)

    @classmethod
    def build(cls, catalog: Catalog) -> Lexicon:
        """The first lexicon of a store, every entry read from the catalog."""
        return cls.from_rows(lexicon_entries.read_rows(catalog))

    @classmethod
    def from_rows(cls, rows: lexicon_entries.Rows) -> Lexicon:
        """The first lexicon of a store, in bulk: the same values as ``apply`` over every id, made by
        grouping the rows by their stem tuples and term sets (numbers into small tables) rather than
        moving each id into each posting (at 10,000 models: seconds the first search after a start
        waited for)."""
        ids = rows.ids
        stem_rows, term_rows, shape_rows = rows.columns()
        stem_table = rows.stem_table.names
        stems = dict(zip(ids, pick(stem_table, stem_rows.tolist()), strict=True))
        numbers = Numbering(ids)
        postings: dict[str, np.ndarray] = {}
        by_stem: dict[str, list[np.ndarray]] = {}
        for table_no, members in _groups(stem_rows):
            for stem in dict.fromkeys(stem_table[table_no]):
                by_stem.setdefault(stem, []).append(members)
        for stem, arrays in by_stem.items():
            # each row is in one group: the groups of a stem are disjoint, each one ascending
            array = arrays[0] if len(arrays) == 1 else np.sort(np.concatenate(arrays))
            array.flags.writeable = False
            postings[stem] = array
        terms = _non_empty(ids, term_rows, rows.term_table.names)
        by_value: dict[str, list[str]] = {}
        for table_no, members in _groups(term_rows):
            if table_no:
                cids = pick(ids, members.tolist())
                for term in rows.term_table.names[table_no]:
                    by_value.setdefault(term, []).extend(cids)
        sizes = np.fromiter(map(len, stem_table), np.int32, len(stem_table))
        return cls(
            LayeredMap(stems),
            Map(postings),
            LayeredMap(terms),
            Map({term: frozenset(cids) for term, cids in by_value.items()}),
            LayeredMap(_non_empty(ids, shape_rows, rows.shape_table.names)),
            LayeredMap(dict(rows.joins)),
            numbers,
            sizes[stem_rows] if len(ids) else _NO_NUMBERS.copy(),
        )

    def apply(self, catalog: Catalog, delta: Delta) -> Lexicon:
        """The next snapshot's lexicon: the touched entities re-read (itself when none is)."""
        touched = [c for c in delta.touched if not is_memory_ref(c)]
        return self._updated(catalog, touched) if touched else self

    def _updated(self, catalog: Catalog, ids: Iterable[str]) -> Lexicon:
        ids = list(ids)
        entries = list(lexicon_entries.entries(catalog, ids))
        stems, terms = self.stems.mutate(), self.terms.mutate()
        shapes, joins = self.shapes.mutate(), self.joins.mutate()
        numbers = self.numbers
        by_stem: dict[str, tuple[set[int], set[int]]] = {}  # stem -> (numbers gone, numbers new)
        by_term: Moves = {}
        changed: dict[int, int] = {}  # number -> its name's stem count now
        for cid in ids:  # every id re-read leaves first (as a removed or hidden one must)
            old = stems.pop(cid, ())
            if old:
                n = numbers.of(cid)
                changed[n] = 0
                for stem in old:
                    by_stem.setdefault(stem, (set(), set()))[0].add(n)
            for term in terms.pop(cid) or ():
                note(by_term, term, cid, joins=False)
            shapes.pop(cid, None)
            joins.pop(cid, None)
        for cid, name_stems_, value_terms, value_shapes, model_joins in entries:
            stems[cid] = name_stems_
            n = numbers.of(cid)
            changed[n] = len(name_stems_)
            for stem in name_stems_:
                by_stem.setdefault(stem, (set(), set()))[1].add(n)
            if value_terms:
                terms[cid] = value_terms
                for term in value_terms:
                    note(by_term, term, cid, joins=True)
            if value_shapes:
                shapes[cid] = value_shapes
            if model_joins is not None:
                joins[cid] = model_joins
        lengths = self.lengths
        if changed:
            lengths = np.zeros(len(numbers.names), dtype=np.int32)
            lengths[: len(self.lengths)] = self.lengths
            lengths[np.fromiter(changed, np.int64, len(changed))] = np.fromiter(
                changed.values(), np.int32, len(changed)
            )
        return Lexicon(
            stems.finish(),
            _moved_numbers(self.postings, by_stem),
            terms.finish(),
            moved(self.by_value, by_term),
            shapes.finish(),
            joins.finish(),
            numbers,
            lengths,
        )

    # ------------------------------------------------------------------ lookups

    def name_scores(
        self, question_stems: Iterable[str], limit: int = 200, *, ordered: bool = True
    ) -> dict[str, float]:
        """IDF-weighted overlap of the question's stems with each name, damped by name length: the
        ``limit`` best (ties: the larger id kept), best first unless not ``ordered`` (a caller
        that only adds the scores up skips the sort)."""
        n = max(len(self.stems), 1)
        arrays: list[np.ndarray] = []
        weights: list[float] = []
        for stem in sorted(set(question_stems)):  # sorted: float sums never depend on the hash seed
            numbers = self.postings.get(stem)
            if numbers is None or len(numbers) > MAX_POSTINGS:
                continue
            df = len(numbers)
            arrays.append(numbers)
            weights.append(math.log(1 + (n - df + 0.5) / (df + 0.5)))
        if not arrays:
            return {}
        hit = np.concatenate(arrays)
        spread = np.repeat(weights, [len(a) for a in arrays])
        # bincount adds in input order (stem by stem, as sorted): the same float sums as adding each
        # stem's idf to each of its ids in turn. Hits fewer than an eighth of the numbers are made
        # dense first (a sort of the hits); more, and the sums are laid out over every number at
        # once (no sort): measured, the two cost the same about there. Every idf is > 0, so the ids
        # found are those with a sum, found through a boolean mask (numpy scans one several times
        # faster than the floats themselves: ~2 ms of 400k floats).
        if len(hit) * 8 < len(self.numbers.names):
            found, where = np.unique(hit, return_inverse=True)
            sums = np.bincount(where, weights=spread)
        else:
            sums = np.bincount(hit, weights=spread)
            found = np.flatnonzero(sums != 0)
            sums = sums[found]
        damped = sums / (1 + 0.1 * self.lengths[found])
        names = self.numbers.names
        if len(found) > limit:
            floor = np.partition(damped, len(damped) - limit)[len(damped) - limit]
            above = np.flatnonzero(damped > floor)
            ties = np.flatnonzero(damped == floor)  # the last places go to the larger ids
            chosen = pick(names, found[ties].tolist())
            wanted = limit - len(above)
            # the same names either way: a C sort beats the heap once a good share is wanted
            kept = (
                sorted(chosen, reverse=True)[:wanted]
                if wanted * 8 > len(chosen)
                else heapq.nlargest(wanted, chosen)
            )
            pairs = list(zip(pick(names, found[above].tolist()), damped[above].tolist(), strict=True))
            pairs += [(name, float(floor)) for name in kept]
        else:
            pairs = list(zip(pick(names, found.tolist()), damped.tolist(), strict=True))
        if ordered:
            pairs.sort(key=_score_then_id, reverse=True)
        return dict(pairs)

    def value_matches(self, question: str, allow=None) -> set[str]:  # noqa: ANN001
        """Columns one of whose sampled values the question names."""
        out: set[str] = set()
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


def _moved_numbers(
    postings: Map[str, np.ndarray], moves: dict[str, tuple[set[int], set[int]]]
) -> Map[str, np.ndarray]:
    """``postings`` with each stem's numbers moved (leaving first, then joining); a stem left with
    none is dropped. Arrays are replaced, never changed: an older generation may be reading them."""
    if not moves:
        return postings
    out = postings.mutate()
    for stem, (gone, new) in moves.items():
        numbers = out.get(stem, _NO_NUMBERS)
        if gone:
            numbers = numbers[~np.isin(numbers, np.fromiter(gone, np.int32, len(gone)))]
        if new:
            numbers = np.union1d(numbers, np.fromiter(new, np.int32, len(new))).astype(np.int32, copy=False)
        if len(numbers):
            numbers.flags.writeable = False
            out[stem] = numbers
        else:
            out.pop(stem, None)
    return out.finish()


def _groups(numbers: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
    """(value, the positions holding it) of each distinct value of ``numbers`` (positions ascending,
    as int32)."""
    if not len(numbers):
        return
    order = np.argsort(numbers, kind="stable").astype(np.int32)
    ordered = numbers[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    ends = np.r_[starts[1:], len(ordered)]
    for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
        yield int(ordered[a]), order[a:b]


def _non_empty(ids: list[str], numbers: np.ndarray, table: list[_V]) -> dict[str, _V]:
    """id -> its value, for the rows whose value is not the table's first (the empty set)."""
    where = np.flatnonzero(numbers).tolist()
    return dict(zip(pick(ids, where), pick(table, numbers[where].tolist()), strict=True))
