"""The catalog snapshot: one immutable value holding everything the store says.

A snapshot is built once from a full ``StoreRead`` and afterwards *derived*: ``snapshot.derive(read)``
compares document digests, touches only the documents that changed and returns the new snapshot
with a ``Delta`` naming the canonical ids that were added, changed or removed, which is what the
indexes downstream consume. Nothing here knows about LSP or search.

One edit must cost the same at 400k columns as at 40k, so the entity map is persistent (a
``layered.LayeredMap``: the next snapshot shares the base dict and every overlay node the edit did
not touch; a first build is a plain dict, 10x faster to make than a HAMT), and what is kept
beside it (kind counts, the models' listing order, the datasource names, the count of document
notes) is updated from the change, never recounted.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from operator import attrgetter
from types import MappingProxyType
from typing import Any, TypeVar

import msgspec

from slayer_lsp.catalog.ids import memory_ref, name_of, parent_of
from slayer_lsp.catalog.layered import LayeredMap, LayeredMutation
from slayer_lsp.store import documents as d
from slayer_lsp.store.locate import StoreLocation
from slayer_lsp.store.reader import PRIORITY_KEY, DocKey, LoadIssue, Source, StoredDoc, StoreRead

_T = TypeVar("_T")
_K = TypeVar("_K")

ENTITY_KINDS = ("datasource", "model", "column", "measure", "aggregation", "memory")
_CANONICAL = attrgetter("canonical")
_HIDDEN = attrgetter("hidden")
# the documents of the read a snapshot was derived from (or last found unchanged by), kept with its
# lazily derived lookups: what a later read names as the one it follows
_READ_DOCS = "read docs"


class Entity(msgspec.Struct, frozen=True, gc=False):
    """One addressable thing of the catalog, in plain data. A struct rather than a dataclass: a
    warehouse store has 430,000 of them, made at every start (a tenth of the time; and, pointing
    only at documents, never in a cycle, so kept out of GC passes)."""

    canonical: str  # "ds", "ds.model", "ds.model.leaf" or "memory:<id>"
    kind: str  # one of ENTITY_KINDS
    datasource: str | None
    model: d.Model | None
    obj: d.Datasource | d.Model | d.Column | d.Measure | d.Aggregation | d.Memory
    hidden: bool  # a hidden model, or a hidden column, or a leaf of a hidden model
    source: Source

    @property
    def name(self) -> str:
        return name_of(self.canonical)

    @property
    def description(self) -> str | None:
        return getattr(self.obj, "description", None)


@dataclass(frozen=True, slots=True)
class Delta:
    """Canonical ids whose entity appeared, changed or disappeared between two snapshots."""

    added: frozenset[str] = frozenset()
    changed: frozenset[str] = frozenset()
    removed: frozenset[str] = frozenset()
    priority_changed: bool = False

    @property
    def empty(self) -> bool:
        return not (self.added or self.changed or self.removed or self.priority_changed)

    @property
    def touched(self) -> frozenset[str]:
        return self.added | self.changed | self.removed


def _model_entities(model: d.Model, source: Source) -> list[Entity]:
    """A model's entity and its leaves' (columns, then measures and aggregations whose names no
    earlier leaf took). Built by comprehensions: a warehouse start makes 430,000 of them."""
    ds = model.data_source or ""
    mid = f"{ds}.{model.name}"
    hidden = model.hidden
    out = [Entity(mid, "model", ds, model, model, hidden, source)]
    out += [
        Entity(f"{mid}.{col.name}", "column", ds, model, col, hidden or col.hidden, source)
        for col in model.columns
    ]
    if model.measures or model.aggregations:
        seen = {col.name for col in model.columns}
        for meas in model.measures:
            if meas.name and meas.name not in seen:
                seen.add(meas.name)
                out.append(Entity(f"{mid}.{meas.name}", "measure", ds, model, meas, hidden, source))
        for agg in model.aggregations:
            if agg.name not in seen:  # SLayer lets an aggregation shadow a column; the column wins here
                seen.add(agg.name)
                out.append(Entity(f"{mid}.{agg.name}", "aggregation", ds, model, agg, hidden, source))
    return out


def _doc_entities(doc: StoredDoc) -> list[Entity]:
    value = doc.value
    if isinstance(value, d.Model):
        return _model_entities(value, doc.source)
    if isinstance(value, d.Datasource):
        return [Entity(value.name, "datasource", value.name, None, value, False, doc.source)]
    if isinstance(value, d.Memory):
        return [Entity(memory_ref(value.id), "memory", None, None, value, False, doc.source)]
    return []


@dataclass(frozen=True)
class Catalog:
    """An immutable snapshot of a SLayer store. Build with ``Catalog.from_read``."""

    location: StoreLocation
    docs: Mapping[DocKey, StoredDoc]
    entities: Mapping[str, Entity]  # every canonical id -> entity (hidden included)
    children_of: Mapping[str, tuple[str, ...]]  # "ds" -> models, "ds.model" -> leaves (declared order)
    models_by_name: Mapping[str, tuple[str, ...]]  # bare model name -> datasources, sorted
    memory_order: tuple[str, ...]  # memory ids in the backend's listing order
    priority: tuple[str, ...]
    load_issues: tuple[LoadIssue, ...]  # documents that did not load
    fatal: str | None = None
    generation: int = 0
    # Kept up to date by ``derive`` (None on a catalog made some other way: computed on first use).
    model_order: tuple[str, ...] | None = None  # model ids in SLayer's listing order (datasource, name)
    datasource_names: tuple[str, ...] | None = None  # sorted
    kind_counts: Mapping[str, int] | None = None  # entities per kind, hidden included
    doc_issue_count: int | None = None  # notes on documents that did load
    _extra: dict = field(default_factory=dict, compare=False, repr=False)  # lazily derived lookups

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_read(cls, read: StoreRead) -> Catalog:
        return cls.empty(read.location).derive(read)[0]

    @classmethod
    def empty(cls, location: StoreLocation) -> Catalog:
        return cls(location, {}, {}, {}, {}, (), (), (), None, -1)

    def derive(self, read: StoreRead) -> tuple[Catalog, Delta]:
        """The snapshot after ``read``; touches only documents whose digest changed.

        A read that failed as a whole (store missing, locked, corrupt) keeps every document of this
        snapshot and records the failure in ``fatal``: the last good state keeps serving."""
        if read.fatal is not None:
            return self._replace(fatal=read.fatal, generation=self.generation + 1), Delta()
        if read.unchanged and self.fatal is None:
            return self, Delta()
        old_docs, new_docs = self.docs, read.docs
        changed_keys, removed_keys = self._changed_keys(read)
        load_issues = tuple(read.issues)
        if not changed_keys and not removed_keys:
            if load_issues == self.load_issues and self.fatal is None:
                self._extra[_READ_DOCS] = read.docs  # the next read may say what changed since this one
                return self, Delta()
            return self._replace(load_issues=load_issues, fatal=None, generation=self.generation + 1), Delta()

        docs = _copied(old_docs)  # one entry per file or row: small beside the entities
        base = self.entities if isinstance(self.entities, LayeredMap) else LayeredMap(dict(self.entities))
        # a first build fills a plain dict (C lookups), which becomes the new map's base as it is
        entities: dict[str, Entity] | LayeredMutation[Entity] = {} if not base else base.mutate()
        children = _copied(self.children_of)
        # which datasources hold a model of each name: changed only when a model comes or goes (an
        # edited model keeps its key, and so its name and datasource)
        models_come_or_go = any(k.kind == "model" for k in removed_keys) or any(
            k.kind == "model" and k not in old_docs for k in changed_keys
        )
        by_name = {k: list(v) for k, v in self.models_by_name.items()} if models_come_or_go else None
        counts = dict(self.counts())
        doc_issues = self.document_issue_count()
        before: dict[str, Entity] = {}
        after: dict[str, Entity] = {}
        memories_touched = False
        priority_changed = False
        models_gone: set[str] = set()
        models_new: set[str] = set()
        datasources_touched = False
        ds_models: dict[str, set[str]] = {}  # datasources whose model list changes
        for key in removed_keys + changed_keys:
            old = old_docs.get(key)
            if old is not None:
                doc_issues -= len(old.issues)
                for ent in _doc_entities(old):
                    before[ent.canonical] = ent
                    if entities.pop(ent.canonical, None) is not None:
                        counts[ent.kind] -= 1
                self._unlink(old, children, ds_models, by_name)
                del docs[key]
                if key.kind == "model":
                    models_gone.add(key.name)
        # a first build: every entity is new, and none is counted yet
        first = entities if isinstance(entities, dict) else None
        for key in changed_keys:
            doc = new_docs[key]
            docs[key] = doc
            doc_issues += len(doc.issues)
            made = _doc_entities(doc)
            if first is not None:
                first.update(zip(map(_CANONICAL, made), made, strict=True))
            else:
                for ent in made:
                    after[ent.canonical] = ent
                    if ent.canonical not in entities:
                        counts[ent.kind] = counts.get(ent.kind, 0) + 1
                    entities[ent.canonical] = ent
            self._link(doc, made, children, ds_models, by_name)
            if key.kind == "model":
                models_new.add(key.name)
        if first is not None:  # counted and listed once, in C, rather than per entity above
            after = first
            counts = dict(Counter([ent.kind for ent in first.values()]))
        for ds, mids in ds_models.items():
            children[ds] = tuple(sorted(mids))
        for key in removed_keys + changed_keys:
            memories_touched |= key.kind == "memory"
            priority_changed |= key.kind == "priority"
            datasources_touched |= key.kind == "datasource"

        memory_order = self.memory_order
        extra: dict[str, object] = {_READ_DOCS: new_docs}
        if memories_touched:
            names = {k.name for k in removed_keys + changed_keys if k.kind == "memory"}
            backend = self.location.backend
            few = len(names) * 8 < len(memory_order)
            if few:  # a few bisects rather than a sort of them all
                memory_order = _memory_order_after(memory_order, docs, names, backend)
            else:
                memory_order = _memory_order(docs, backend)
            memories = self._extra.get("memories")
            if few and memories is not None:  # the map by id, carried on (not rebuilt per memory edit)
                extra["memories"] = _memories_after(memories, memory_order, docs, names)
        priority_doc = docs.get(PRIORITY_KEY)
        priority = tuple(priority_doc.value) if priority_doc is not None else ()  # type: ignore[arg-type]
        delta = Delta(
            added=frozenset(c for c in after if c not in before) if before else frozenset(after),
            changed=frozenset(c for c in after if c in before and entity_differs(before[c], after[c])),
            removed=frozenset(c for c in before if c not in after),
            priority_changed=priority_changed,
        )
        model_order = self.models_in_order()
        if models_gone or models_new:
            model_order = _reordered(model_order, models_gone - models_new, models_new - models_gone)
        datasource_names = self.datasources_in_order()
        if datasources_touched:
            datasource_names = tuple(sorted(k.name for k in docs if k.kind == "datasource"))
        snap = Catalog(
            self.location,
            MappingProxyType(docs),
            LayeredMap(entities) if isinstance(entities, dict) else entities.finish(),
            MappingProxyType(children),
            MappingProxyType({k: tuple(v) for k, v in by_name.items()})
            if by_name is not None
            else self.models_by_name,
            memory_order,
            priority,
            load_issues,
            None,
            self.generation + 1,
            model_order,
            datasource_names,
            MappingProxyType({k: n for k, n in counts.items() if n}),
            doc_issues,
            extra,
        )
        return snap, delta

    def _changed_keys(self, read: StoreRead) -> tuple[list[DocKey], list[DocKey]]:
        """The keys whose document ``read`` changed or added (in its order), and those it removed
        (in this snapshot's order). Only the keys the read says it touched are compared when it
        follows the very read this snapshot was derived from: an edit costs what it changed, not
        a pass over the store's 30,000 documents (40 ms at 10,000 models)."""
        old_docs, new_docs = self.docs, read.docs
        get = old_docs.get
        hint = read.touched if read.since is not None and read.since is self._extra.get(_READ_DOCS) else None
        if hint is None:
            changed = [  # a reader hands back an unchanged document as the same object
                k
                for k, doc in new_docs.items()
                if (old := get(k)) is not doc and (old is None or old.digest != doc.digest)
            ]
            return changed, [k for k in old_docs if k not in new_docs]
        changed = [
            k
            for k in hint
            if (doc := new_docs.get(k)) is not None
            and (old := get(k)) is not doc
            and (old is None or old.digest != doc.digest)
        ]
        removed = [k for k in hint if k not in new_docs and k in old_docs]
        # the orders a full comparison gives (they decide where documents sit in the next snapshot)
        if len(changed) > 1:
            wanted = set(changed)
            changed = [k for k in new_docs if k in wanted]
        if len(removed) > 1:
            wanted = set(removed)
            removed = [k for k in old_docs if k in wanted]
        return changed, removed

    @staticmethod
    def _unlink(
        doc: StoredDoc,
        children: dict[str, tuple[str, ...]],
        ds_models: dict[str, set[str]],
        by_name: dict[str, list[str]] | None,
    ) -> None:
        value = doc.value
        if isinstance(value, d.Model):
            ds = value.data_source or ""
            mid = f"{ds}.{value.name}"
            children.pop(mid, None)
            ds_models.setdefault(ds, set(children.get(ds, ()))).discard(mid)
            if by_name is not None and value.name in by_name:
                by_name[value.name] = [x for x in by_name[value.name] if x != ds]
                if not by_name[value.name]:
                    del by_name[value.name]

    @staticmethod
    def _link(
        doc: StoredDoc,
        entities: list[Entity],
        children: dict[str, tuple[str, ...]],
        ds_models: dict[str, set[str]],
        by_name: dict[str, list[str]] | None,
    ) -> None:
        value = doc.value
        if isinstance(value, d.Model):
            ds = value.data_source or ""
            mid = f"{ds}.{value.name}"
            children[mid] = tuple(e.canonical for e in entities[1:])
            ds_models.setdefault(ds, set(children.get(ds, ()))).add(mid)
            if by_name is not None:
                names = by_name.setdefault(value.name, [])
                if ds not in names:
                    names.append(ds)
                    names.sort()

    def _replace(self, **changes: object) -> Catalog:
        fields = {
            f: getattr(self, f)
            for f in (
                "location",
                "docs",
                "entities",
                "children_of",
                "models_by_name",
                "memory_order",
                "priority",
                "load_issues",
                "fatal",
                "generation",
                "model_order",
                "datasource_names",
                "kind_counts",
                "doc_issue_count",
            )
        }
        fields.update(changes)
        return Catalog(**fields)

    # ------------------------------------------------------------------ lookups

    def __contains__(self, canonical: str) -> bool:
        return canonical in self.entities

    def get(self, canonical: str) -> Entity | None:
        return self.entities.get(canonical)

    def kind_of(self, canonical: str) -> str | None:
        ent = self.entities.get(canonical)
        return ent.kind if ent else None

    def children(self, canonical: str) -> tuple[str, ...]:
        return self.children_of.get(canonical, ())

    @staticmethod
    def parent(canonical: str) -> str | None:
        return parent_of(canonical)

    def datasources_in_order(self) -> tuple[str, ...]:
        if self.datasource_names is not None:
            return self.datasource_names
        return self._lazy(
            "datasource names", lambda: tuple(sorted(k.name for k in self.docs if k.kind == "datasource"))
        )

    def models_in_order(self) -> tuple[str, ...]:
        """Model ids in SLayer's listing order (datasource, then name)."""
        if self.model_order is not None:
            return self.model_order
        return self._lazy(
            "model order",
            lambda: tuple(sorted((k.name for k in self.docs if k.kind == "model"), key=_model_key)),
        )

    def counts(self) -> Mapping[str, int]:
        """Entities per kind, hidden ones included."""
        if self.kind_counts is not None:
            return self.kind_counts

        def build() -> dict[str, int]:
            out: dict[str, int] = {}
            for ent in self.entities.values():
                out[ent.kind] = out.get(ent.kind, 0) + 1
            return out

        return self._lazy("counts", build)

    def document_issue_count(self) -> int:
        if self.doc_issue_count is not None:
            return self.doc_issue_count
        return self._lazy("doc issues", lambda: sum(len(doc.issues) for doc in self.docs.values()))

    @property
    def issue_count(self) -> int:
        """``len(self.issues)``, without listing them."""
        return len(self.load_issues) + self.document_issue_count()

    @property
    def datasources(self) -> dict[str, d.Datasource]:
        # the isinstance tests always hold (a key's kind fixes its value's type); they tell the checker
        def build() -> dict[str, d.Datasource]:
            out = {}
            for name in self.datasources_in_order():
                value = self.docs[DocKey("datasource", name)].value
                if isinstance(value, d.Datasource):
                    out[name] = value
            return out

        return self._lazy("datasources", build)

    @property
    def models(self) -> dict[str, d.Model]:
        """``"ds.model"`` -> model, in SLayer's listing order (datasource, then name)."""

        def build() -> dict[str, d.Model]:
            out = {}
            for mid in self.models_in_order():
                value = self.docs[DocKey("model", mid)].value
                if isinstance(value, d.Model):
                    out[mid] = value
            return out

        return self._lazy("models", build)

    @property
    def memories(self) -> dict[str, d.Memory]:
        """Memory id -> memory, in the backend's listing order."""

        def build() -> dict[str, d.Memory]:
            out = {}
            for mid in self.memory_order:
                mem = self.docs[DocKey("memory", mid)].value
                if isinstance(mem, d.Memory):  # always (the key's kind fixes the value's type)
                    out[mid] = mem
            return out

        return self._lazy("memories", build)

    def model(self, datasource: str, name: str) -> d.Model | None:
        ent = self.entities.get(f"{datasource}.{name}")
        return ent.obj if ent is not None and ent.kind == "model" else None  # type: ignore[return-value]

    def memory(self, memory_id: str) -> d.Memory | None:
        doc = self.docs.get(DocKey("memory", memory_id))
        return doc.value if doc is not None else None  # type: ignore[return-value]

    @property
    def valid_canonicals(self) -> Collection[str]:
        """Every id a memory tag may name and still count (hidden entities included): what stale
        tags are tested against (the entity map itself: nothing is copied)."""
        return self.entities

    def stale_tags(self, memory: d.Memory) -> list[str]:
        valid = self.valid_canonicals
        return [t for t in memory.entities if t not in valid]

    @property
    def issues(self) -> tuple[LoadIssue, ...]:
        """Documents that did not load, then notes on documents that did."""
        return self._lazy(
            "issues", lambda: self.load_issues + tuple(i for doc in self.docs.values() for i in doc.issues)
        )

    def searchable_ids(self) -> tuple[str, ...]:
        """Every searchable canonical id in SLayer's corpus order: datasources (sorted), then each
        visible model with its visible leaves, then memories in storage order. Hidden models and
        columns are not searchable; there are no virtual time_spine entities (they never resolve)."""

        def build() -> tuple[str, ...]:
            out: list[str] = sorted(self.datasources)
            children = self.children_of.get
            for mid, model in self.models.items():
                if model.hidden:
                    continue
                out.append(mid)
                leaves: Iterable[str] = children(mid, ())
                if any(map(_HIDDEN, model.columns)):  # else every leaf is visible (most models)
                    # (a model's columns have unique names: the reader keeps the first of a name)
                    hidden = {f"{mid}.{col.name}" for col in model.columns if col.hidden}
                    leaves = [c for c in leaves if c not in hidden]
                out.extend(leaves)
            out.extend(memory_ref(m) for m in self.memory_order)
            return tuple(out)

        return self._lazy("searchable", build)

    def iter_entities(self, kinds: Iterable[str] | None = None) -> Iterator[Entity]:
        """Entities document by document, in the documents' order (a model, then its leaves): the
        order they were read in, whatever order the entity map keeps."""
        wanted = set(kinds) if kinds is not None else None
        for key, doc in self.docs.items():
            if key.kind == "model":
                ids: Iterable[str] = (key.name, *self.children_of.get(key.name, ()))
            elif key.kind == "datasource":
                ids = (key.name,)
            elif key.kind == "memory":
                ids = (memory_ref(key.name),)
            else:
                continue
            for canonical in ids:
                ent = self.entities.get(canonical)
                if ent is not None and ent.source == doc.source and (wanted is None or ent.kind in wanted):
                    yield ent

    def _lazy(self, name: str, build: Callable[[], _T]) -> _T:
        cache = self._extra
        if name not in cache:
            cache[name] = build()
        return cache[name]


def _copied(mapping: Mapping[_K, _T]) -> dict[_K, _T]:
    """A dict copy of a snapshot's map: through the dict's own copy (C) when the map is a read-only
    view of one; ``dict()`` of a view steps key by key (30,000 documents: 10 ms an edit)."""
    if isinstance(mapping, (dict, MappingProxyType)):
        return mapping.copy()
    return dict(mapping)


def entity_differs(a: Entity, b: Entity) -> bool:
    """An entity changed when its own definition, visibility or source did (a sibling column's
    edit rewrites the model file but leaves this column as it was)."""
    return a.obj != b.obj or a.hidden != b.hidden or a.source != b.source


def _model_key(model_id: str) -> tuple[str, str]:
    """SLayer's listing order of models: datasource, then name (names hold no dots)."""
    ds, _, name = model_id.partition(".")
    return ds, name


def _reordered(order: tuple[str, ...], gone: set[str], new: set[str]) -> tuple[str, ...]:
    """``order`` less ``gone``, with ``new`` inserted in place: a few bisects, or one sort when
    ``new`` is most of it (a first build)."""
    out = [m for m in order if m not in gone] if gone else list(order)
    if len(new) * 8 > len(out):  # a first build, or most of the store: one sort
        out += new
        out.sort(key=_model_key)
        return tuple(out)
    for mid in sorted(new, key=_model_key):
        bisect.insort(out, mid, key=_model_key)
    return tuple(out)


def _memory_key(memory: d.Memory, backend: str) -> Any:
    """A memory's place in the listing: YAML lists memories by (created_at, id), SQLite by id as
    text (ids are unique, so every key is). Ties downstream follow this."""
    return (memory.created_at, memory.id) if backend == "yaml" else memory.id


def _memory_order(docs: Mapping[DocKey, StoredDoc], backend: str) -> tuple[str, ...]:
    mems = [doc.value for k, doc in docs.items() if k.kind == "memory"]
    mems.sort(key=lambda m: _memory_key(m, backend))  # type: ignore[arg-type]
    return tuple(m.id for m in mems)  # type: ignore[union-attr]


def _memory_sort_key(docs: Mapping[DocKey, StoredDoc], backend: str) -> Callable[[str], Any]:
    """``_memory_key`` of a memory named by its id."""
    return lambda mid: _memory_key(docs[DocKey("memory", mid)].value, backend)  # type: ignore[arg-type]


def _memory_order_after(
    order: tuple[str, ...], docs: Mapping[DocKey, StoredDoc], names: set[str], backend: str
) -> tuple[str, ...]:
    """``_memory_order`` after the memories ``names`` changed, came or went: ``order`` without them,
    each present one put back at its place."""
    key = _memory_sort_key(docs, backend)
    out = [m for m in order if m not in names]
    for mid in names:
        if DocKey("memory", mid) in docs:
            out.insert(bisect.bisect_right(out, key(mid), key=key), mid)
    return tuple(out)


def _memories_after(
    before: Mapping[str, object], order: tuple[str, ...], docs: Mapping[DocKey, StoredDoc], names: set[str]
) -> dict[str, object]:
    """``Catalog.memories`` from the last snapshot's: the others' values looked up in C, the few
    changed ones read from their documents."""
    values = list(map(before.get, order))
    for mid in names:
        doc = docs.get(DocKey("memory", mid))
        if doc is not None:
            values[order.index(mid)] = doc.value
    return dict(zip(order, values, strict=True))


def load_catalog(storage: object = None) -> Catalog:
    """Read a store and build its snapshot in one call (the CLI's path)."""
    from slayer_lsp.store.reader import StoreReader

    return Catalog.from_read(StoreReader(storage).read())  # type: ignore[arg-type]
