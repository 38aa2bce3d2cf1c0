"""The catalog snapshot: one immutable value holding everything the store says.

A snapshot is built once from a full ``StoreRead`` and afterwards *derived*: ``snapshot.derive(read)``
compares document digests, touches only the documents that changed and returns the new snapshot
with a ``Delta`` naming the canonical ids that were added, changed or removed, which is what the
indexes downstream consume. Nothing here knows about LSP or search.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TypeVar

from slayer_lsp.catalog.ids import memory_ref, name_of, parent_of
from slayer_lsp.store import documents as d
from slayer_lsp.store.locate import StoreLocation
from slayer_lsp.store.reader import PRIORITY_KEY, DocKey, LoadIssue, Source, StoredDoc, StoreRead

_T = TypeVar("_T")

ENTITY_KINDS = ("datasource", "model", "column", "measure", "aggregation", "memory")


@dataclass(frozen=True, slots=True)
class Entity:
    """One addressable thing of the catalog, in plain data."""

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


def _model_entities(model: d.Model, source: Source) -> Iterator[Entity]:
    ds = model.data_source or ""
    mid = f"{ds}.{model.name}"
    yield Entity(mid, "model", ds, model, model, model.hidden, source)
    seen: set[str] = set()
    for col in model.columns:
        seen.add(col.name)
        yield Entity(f"{mid}.{col.name}", "column", ds, model, col, model.hidden or col.hidden, source)
    for meas in model.measures:
        if meas.name and meas.name not in seen:
            seen.add(meas.name)
            yield Entity(f"{mid}.{meas.name}", "measure", ds, model, meas, model.hidden, source)
    for agg in model.aggregations:
        if agg.name not in seen:  # SLayer lets an aggregation shadow a column; the column wins here
            seen.add(agg.name)
            yield Entity(f"{mid}.{agg.name}", "aggregation", ds, model, agg, model.hidden, source)


def _doc_entities(doc: StoredDoc) -> Iterator[Entity]:
    value = doc.value
    if isinstance(value, d.Model):
        yield from _model_entities(value, doc.source)
    elif isinstance(value, d.Datasource):
        yield Entity(value.name, "datasource", value.name, None, value, False, doc.source)
    elif isinstance(value, d.Memory):
        yield Entity(memory_ref(value.id), "memory", None, None, value, False, doc.source)


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
        old_docs, new_docs = self.docs, read.docs
        changed_keys = [k for k, doc in new_docs.items()
                        if (old := old_docs.get(k)) is None or old.digest != doc.digest]
        removed_keys = [k for k in old_docs if k not in new_docs]
        load_issues = tuple(read.issues)
        if not changed_keys and not removed_keys:
            if load_issues == self.load_issues and self.fatal is None:
                return self, Delta()
            return self._replace(load_issues=load_issues, fatal=None, generation=self.generation + 1), Delta()

        docs = dict(old_docs)
        entities = dict(self.entities)
        children = dict(self.children_of)
        by_name = {k: list(v) for k, v in self.models_by_name.items()} if self._touches_models(
            changed_keys, removed_keys) else None
        before: dict[str, Entity] = {}
        after: dict[str, Entity] = {}
        memories_touched = False
        priority_changed = False
        ds_models: dict[str, set[str]] = {}  # datasources whose model list changes
        for key in removed_keys + changed_keys:
            old = old_docs.get(key)
            if old is not None:
                for ent in _doc_entities(old):
                    before[ent.canonical] = ent
                    entities.pop(ent.canonical, None)
                self._unlink(old, children, ds_models, by_name)
                del docs[key]
        for key in changed_keys:
            doc = new_docs[key]
            docs[key] = doc
            made = list(_doc_entities(doc))
            for ent in made:
                after[ent.canonical] = ent
                entities[ent.canonical] = ent
            self._link(doc, made, children, ds_models, by_name)
        for ds, mids in ds_models.items():
            children[ds] = tuple(sorted(mids))
        for key in removed_keys + changed_keys:
            memories_touched |= key.kind == "memory"
            priority_changed |= key.kind == "priority"

        memory_order = self.memory_order
        if memories_touched:
            memory_order = _memory_order(docs, self.location.backend)
        priority_doc = docs.get(PRIORITY_KEY)
        priority = tuple(priority_doc.value) if priority_doc is not None else ()  # type: ignore[arg-type]
        delta = Delta(
            added=frozenset(c for c in after if c not in before),
            changed=frozenset(c for c in after if c in before and entity_differs(before[c], after[c])),
            removed=frozenset(c for c in before if c not in after),
            priority_changed=priority_changed,
        )
        snap = Catalog(
            self.location, MappingProxyType(docs), MappingProxyType(entities), MappingProxyType(children),
            MappingProxyType({k: tuple(v) for k, v in by_name.items()}) if by_name is not None
            else self.models_by_name,
            memory_order, priority, load_issues, None, self.generation + 1,
        )
        return snap, delta

    @staticmethod
    def _touches_models(*key_lists: list[DocKey]) -> bool:
        return any(k.kind == "model" for keys in key_lists for k in keys)

    @staticmethod
    def _unlink(doc: StoredDoc, children: dict[str, tuple[str, ...]], ds_models: dict[str, set[str]],
                by_name: dict[str, list[str]] | None) -> None:
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
    def _link(doc: StoredDoc, entities: list[Entity], children: dict[str, tuple[str, ...]],
              ds_models: dict[str, set[str]], by_name: dict[str, list[str]] | None) -> None:
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
        fields = {f: getattr(self, f) for f in ("location", "docs", "entities", "children_of", "models_by_name",
                                                 "memory_order", "priority", "load_issues", "fatal",
                                                 "generation")}
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

    @property
    def datasources(self) -> dict[str, d.Datasource]:
        # the isinstance tests always hold (a key's kind fixes its value's type); they tell the checker
        return self._lazy("datasources", lambda: {
            k.name: doc.value for k, doc in sorted(self.docs.items(), key=lambda kv: kv[0].name)
            if k.kind == "datasource" and isinstance(doc.value, d.Datasource)})

    @property
    def models(self) -> dict[str, d.Model]:
        """``"ds.model"`` -> model, in SLayer's listing order (datasource, then name)."""
        return self._lazy("models", lambda: {
            k.name: doc.value for k, doc in sorted(self.docs.items(), key=lambda kv: _model_sort(kv[1]))
            if k.kind == "model" and isinstance(doc.value, d.Model)})

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
    def valid_canonicals(self) -> frozenset[str]:
        """Every id a memory tag may name and still count (hidden entities included): the set
        against which stale tags are detected."""
        return self._lazy("valid", lambda: frozenset(self.entities))

    def stale_tags(self, memory: d.Memory) -> list[str]:
        valid = self.valid_canonicals
        return [t for t in memory.entities if t not in valid]

    @property
    def issues(self) -> tuple[LoadIssue, ...]:
        """Documents that did not load, then notes on documents that did."""
        return self._lazy("issues", lambda: self.load_issues + tuple(
            i for doc in self.docs.values() for i in doc.issues))

    def searchable_ids(self) -> tuple[str, ...]:
        """Every searchable canonical id in SLayer's corpus order: datasources (sorted), then each
        visible model with its visible leaves, then memories in storage order. Hidden models and
        columns are not searchable; there are no virtual time_spine entities (they never resolve)."""
        def build() -> tuple[str, ...]:
            out: list[str] = sorted(self.datasources)
            for mid, model in self.models.items():
                if model.hidden:
                    continue
                out.append(mid)
                out.extend(c for c in self.children(mid) if not self.entities[c].hidden)
            out.extend(memory_ref(m) for m in self.memory_order)
            return tuple(out)
        return self._lazy("searchable", build)

    def iter_entities(self, kinds: Iterable[str] | None = None) -> Iterator[Entity]:
        wanted = set(kinds) if kinds is not None else None
        for ent in self.entities.values():
            if wanted is None or ent.kind in wanted:
                yield ent

    def _lazy(self, name: str, build: Callable[[], _T]) -> _T:
        cache = self._extra
        if name not in cache:
            cache[name] = build()
        return cache[name]


def entity_differs(a: Entity, b: Entity) -> bool:
    """An entity changed when its own definition, visibility or source did (a sibling column's
    edit rewrites the model file but leaves this column as it was)."""
    return a.obj != b.obj or a.hidden != b.hidden or a.source != b.source


def _model_sort(doc: StoredDoc) -> tuple[str, str]:
    value = doc.value
    if isinstance(value, d.Model):
        return (value.data_source or "", value.name)
    return ("", "")


def _memory_order(docs: Mapping[DocKey, StoredDoc], backend: str) -> tuple[str, ...]:
    """YAML lists memories by (created_at, id); SQLite by id as text. Ties downstream follow this."""
    mems = [doc.value for k, doc in docs.items() if k.kind == "memory"]
    if backend == "yaml":
        mems.sort(key=lambda m: (m.created_at, m.id))  # type: ignore[union-attr]
    else:
        mems.sort(key=lambda m: m.id)  # type: ignore[union-attr]
    return tuple(m.id for m in mems)  # type: ignore[union-attr]


def load_catalog(storage: object = None) -> Catalog:
    """Read a store and build its snapshot in one call (the CLI's path)."""
    from slayer_lsp.store.reader import StoreReader

    return Catalog.from_read(StoreReader(storage).read())  # type: ignore[arg-type]
