"""What the lexicon holds per entity: read from the catalog, or taken back from the last run.

An entry is a model's or a leaf's name stems, and a column's sampled-value terms and value shapes.
Reading them for the 400,000 leaves of a 10,000-model store took seconds that the first search after
every start waited for, though few leaves had changed since the last run. So the first build reads
``Rows``: one row per entry, each value a number into a table of the distinct values (a warehouse
repeats ``id`` and ``created_at`` in every model: the tables are small, and equal values are one
object). ``lexicon.msgpack`` in the store's cache keeps each model document's leaf rows with the
document's digest (the reader's ``StoredDoc.digest``); at start the leaves of an unchanged document
come back as three byte strings (with the model's own stems), and only the others are read. A
model's joins are always read: they name other models' columns.

The file is trusted only for the code that computed it (``code_stamp`` of the modules below and of
the readers), and only when every number in it points into its tables.
"""

from __future__ import annotations

import logging
import sys
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import msgspec
import numpy as np

from slayer_lsp.catalog import Catalog
from slayer_lsp.catalog.ids import child_id
from slayer_lsp.catalog.layered import getter
from slayer_lsp.catalog.numbering import Numbering
from slayer_lsp.search import name_stems, sampled_values
from slayer_lsp.store import blockyaml, documents, fastyaml, reader, yamlscalar
from slayer_lsp.store.cache import StoreCache, code_stamp
from slayer_lsp.store.reader import DocKey

log = logging.getLogger(__name__)

FILE = "lexicon.msgpack"
LEAF_KINDS = ("column", "measure", "aggregation")
KINDS = frozenset((*LEAF_KINDS, "model"))  # the kinds with an entry
_EMPTY: frozenset[str] = frozenset()

Joins = tuple[tuple[str, str, str], ...]  # (other model id, key column here, key column there), ...


class SavedModel(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """The leaf rows of one model document: its leaves with an entry, in order, and each one's
    numbers into the file's tables (native int32, one byte string per column)."""

    source: str  # digest of the model's stored document
    model: int  # the number of the model's own stem tuple
    ids: list[str]
    stems: bytes
    terms: bytes
    shapes: bytes


class LexiconFile(msgspec.Struct):
    format: int
    store: str
    code: str
    stems: list[tuple[str, ...]]  # the distinct stem tuples
    terms: list[list[str]]  # the distinct term sets; the first is empty
    shapes: list[list[str]]  # the distinct shape sets; the first is empty
    models: dict[str, SavedModel]  # by model id


def code() -> str:
    """What the entries depend on besides the stored bytes."""
    return code_stamp(
        sys.modules[__name__], name_stems, sampled_values, documents, reader, fastyaml, blockyaml, yamlscalar
    )


@dataclass
class Rows:
    """The lexicon's entries as columns, in corpus order: ids, and per id the numbers of its stem
    tuple, term set and shape set in the tables (term and shape set 0 is the empty set)."""

    ids: list[str] = field(default_factory=list)
    stem_rows: array[int] = field(default_factory=lambda: array("i"))
    term_rows: array[int] = field(default_factory=lambda: array("i"))
    shape_rows: array[int] = field(default_factory=lambda: array("i"))
    # the distinct values, each with its number (``Numbering``: one per value, in order of first sight)
    stem_table: Numbering[tuple[str, ...]] = field(default_factory=Numbering)
    term_table: Numbering[frozenset[str]] = field(default_factory=lambda: Numbering([_EMPTY]))
    shape_table: Numbering[frozenset[str]] = field(default_factory=lambda: Numbering([_EMPTY]))
    joins: dict[str, Joins] = field(default_factory=dict)  # model id -> its joins
    leaves: dict[str, tuple[int, int]] = field(default_factory=dict)  # model id -> its leaf rows
    fresh: int = 0  # leaves read from the catalog (not taken back)

    def add(
        self, canonical: str, stems: tuple[str, ...], terms: frozenset[str], shapes: frozenset[str]
    ) -> None:
        self.ids.append(canonical)
        self.stem_rows.append(self.stem_table.of(stems))
        self.term_rows.append(self.term_table.of(terms) if terms else 0)
        self.shape_rows.append(self.shape_table.of(shapes) if shapes else 0)

    def columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The three number columns as int32 arrays (views of the rows)."""
        return tuple(
            np.frombuffer(r, dtype=np.int32) for r in (self.stem_rows, self.term_rows, self.shape_rows)
        )  # type: ignore[return-value]


def read_rows(catalog: Catalog, saved: LexiconFile | None = None) -> Rows:
    """Every entry of ``catalog``: each visible model's (read), then its visible leaves' (taken from
    ``saved`` when its document is unchanged, else read)."""
    rows = Rows() if saved is None else _rows_of(saved)
    kept = saved.models if saved is not None else {}
    get = getter(catalog.entities)
    children = catalog.children_of.get
    docs = catalog.docs
    for mid, model in catalog.models.items():
        ent = get(mid)
        if model.hidden or ent is None:
            continue
        rows.joins[mid] = _joins(catalog, ent)
        old = kept.get(mid)
        doc = docs.get(DocKey("model", mid))
        if old is not None and doc is not None and old.source == doc.digest:
            rows.ids.append(mid)
            rows.stem_rows.append(old.model)
            rows.term_rows.append(0)
            rows.shape_rows.append(0)
            start = len(rows.ids)
            rows.ids.extend(old.ids)
            rows.stem_rows.frombytes(old.stems)
            rows.term_rows.frombytes(old.terms)
            rows.shape_rows.frombytes(old.shapes)
        else:
            rows.add(mid, _model_stems(ent), _EMPTY, _EMPTY)
            start = len(rows.ids)
            for cid in children(mid, ()):
                leaf = get(cid)
                if leaf is not None and not leaf.hidden and leaf.kind in KINDS:
                    rows.add(*leaf_entry(leaf))
                    rows.fresh += 1
        rows.leaves[mid] = (start, len(rows.ids))
    return rows


def _rows_of(saved: LexiconFile) -> Rows:
    """Empty rows over the saved tables (their strings interned, as read entries' are)."""
    return Rows(
        stem_table=Numbering([tuple(map(sys.intern, t)) for t in saved.stems]),
        term_table=Numbering([frozenset(map(sys.intern, t)) for t in saved.terms]),
        shape_table=Numbering([frozenset(t) for t in saved.shapes]),
    )


def load(cache: StoreCache) -> LexiconFile | None:
    """The last run's file, when this code wrote it and its numbers all point into its tables."""
    value = cache.read_file(FILE, LexiconFile)
    if value is None or value.code != code():
        return None
    models = value.models.values()
    broken = not value.terms or value.terms[0] or not value.shapes or value.shapes[0]
    for m in models:
        n = 4 * len(m.ids)
        if (
            len(m.stems) != n
            or len(m.terms) != n
            or len(m.shapes) != n
            or not 0 <= m.model < len(value.stems)
        ):
            broken = True
            break
    if not broken and models:
        for attr, table in (("stems", value.stems), ("terms", value.terms), ("shapes", value.shapes)):
            numbers = np.frombuffer(b"".join(getattr(m, attr) for m in models), dtype=np.int32)
            if len(numbers) and (numbers.min() < 0 or numbers.max() >= len(table)):
                broken = True
    if broken:
        log.warning("discarding a broken cache file %s", cache.root / FILE)
        return None
    return value


def file_of(catalog: Catalog, rows: Rows) -> LexiconFile:
    """What the next start takes back: each visible model's leaf rows with its document's digest."""
    stems, terms, shapes = rows.stem_rows.tobytes(), rows.term_rows.tobytes(), rows.shape_rows.tobytes()
    models: dict[str, SavedModel] = {}
    for mid, (start, end) in rows.leaves.items():
        doc = catalog.docs.get(DocKey("model", mid))
        if doc is not None:
            a, b = 4 * start, 4 * end
            models[mid] = SavedModel(
                doc.digest,
                rows.stem_rows[start - 1],
                rows.ids[start:end],
                stems[a:b],
                terms[a:b],
                shapes[a:b],
            )
    return LexiconFile(
        0,
        "",
        code(),
        list(rows.stem_table.names),
        [sorted(t) for t in rows.term_table.names],
        [sorted(t) for t in rows.shape_table.names],
        models,
    )


def entries(catalog: Catalog, ids: list[str]) -> Iterator[tuple[Any, ...]]:
    """(canonical, name stems, value terms, value shapes, joins or None) of each id that has an
    entry (a visible model or leaf), equal values as one object: the per-id path of an edit."""
    get = getter(catalog.entities)
    same: dict[Any, Any] = {}
    for cid in ids:
        ent = get(cid)
        if ent is None or ent.hidden or ent.kind not in KINDS:
            continue
        if ent.kind == "model":
            model_stems = _model_stems(ent)
            yield (
                ent.canonical,
                same.setdefault(model_stems, model_stems),
                _EMPTY,
                _EMPTY,
                _joins(catalog, ent),
            )
        else:
            canonical, stems, terms, shapes = leaf_entry(ent)
            yield (
                canonical,
                same.setdefault(stems, stems),
                same.setdefault(terms, terms),
                same.setdefault(shapes, shapes),
                None,
            )


def _model_stems(ent) -> tuple[str, ...]:  # noqa: ANN001
    """A model's name stems, with its description's."""
    obj = ent.obj
    stems = list(name_stems.name_stems(obj.name, None, obj.description))
    if obj.description:
        stems = list(dict.fromkeys(stems + name_stems.stems(obj.description)))
    return tuple(sys.intern(s) for s in stems)


def _joins(catalog: Catalog, ent) -> Joins:  # noqa: ANN001
    """Each declared join's first key pair, where both columns exist (read every time: the other
    model's columns are another document). A pair without two keys (a hand edit, a file cut short)
    is skipped, as everywhere else that reads pairs."""
    obj = ent.obj
    joins = []
    for j in obj.joins or []:
        if not j.join_pairs or len(j.join_pairs[0]) < 2:
            continue
        other = child_id(obj.data_source, j.target_model)
        here, there = j.join_pairs[0][:2]
        k_here, k_there = child_id(ent.canonical, here), child_id(other, there)
        if k_here in catalog.entities and k_there in catalog.entities:
            joins.append((other, k_here, k_there))
    return tuple(joins)


def leaf_entry(ent) -> tuple[str, tuple[str, ...], frozenset[str], frozenset[str]]:  # noqa: ANN001
    """A leaf's (canonical, name stems, value terms, value shapes)."""
    obj = ent.obj
    stems = name_stems.name_stems(obj.name, getattr(obj, "label", None), getattr(obj, "description", None))
    if ent.kind != "column":
        return ent.canonical, stems, _EMPTY, _EMPTY
    samples = obj.sampled_values
    terms, shapes = _column_values(tuple(map(str, samples)) if samples else (), obj.type)
    return ent.canonical, stems, terms, shapes


@lru_cache(maxsize=1 << 14)
def _column_values(sampled: tuple[str, ...], type_name: str | None) -> tuple[frozenset[str], frozenset[str]]:
    """A column's value terms (interned) and value shapes. Cached: sample sets repeat across a
    warehouse (flags, statuses, the generator's few dozen)."""
    values = list(sampled)
    terms = frozenset(sys.intern(t) for t in sampled_values.value_terms(values))
    return terms, sampled_values.column_shapes(values, type_name)
