"""Reachability: the part of a store one session may see, as a catalog of its own.

A session may be given a ``Scope``: some datasources, and/or the SLayer ``access_tags`` its caller
holds. Whatever lies outside it must be unreachable on every path (search channels, the cypher
graph, hover, completion, navigation, inspect, status, ``--check``). Rather than teach each path a
filter, the engine hands every index and analysis the *reachable catalog*, built here from the full
one: what it does not hold cannot be ranked, resolved, rendered or counted, so an out-of-scope name
behaves exactly like a missing one.

Rules (SLayer's ``AccessFilteredStorage`` where it has one):

* a datasource is reachable when the scope names no datasources or names it;
* a model is reachable when its datasource is, and, when the scope carries access tags, it has no
  ``access_tags`` or shares one with the caller (SLayer's ``can_access``); a model that *reads* an
  unreachable model (a join path in a column's SQL, a measure formula, a filter, an aggregation, or
  its backing query) is unreachable too, transitively, as SLayer hides it;
* joins of a reachable model to an unreachable one are removed, so no rendered text names them;
  a datasource lists only its reachable models;
* a memory is reachable when it is anchored to at least one reachable entity (a tag, an entity
  its attached query names, or a ``memory:<id>`` tag of a reachable memory, by a least fixpoint so
  that a cycle of links anchors nothing) and names nothing unreachable, in its tags or its query. A
  tag or query reference that names nothing in the store (stale) neither anchors nor blocks, unless
  its datasource or model lies outside the scope. ``memory:<id>`` tags of unreachable memories are
  removed from the memories that stay. Under a non-empty scope an untagged memory is unreachable.
  This is stricter than SLayer, which keeps a memory with some visible links and withholds the rest:
  a memory about something the caller cannot read is not reachable at all.
* load issues of documents that did not load are kept only when they can be placed in a reachable
  datasource and the scope carries no access tags (a document that failed to load shows no tags).

Hidden models and columns are SLayer's own visibility flag, not a scope: they stay in the reachable
catalog (marked hidden) so that diagnostics can name them; search, completion and hover skip them.

The scope itself (a value) is ``reach.scope.Scope``; this module derives what it reaches.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

import msgspec

from slayer_lsp.catalog.ids import (
    datasource_of,
    is_memory_ref,
    memory_id_of,
    memory_ref,
    model_of,
    name_of,
    split_model_id,
)
from slayer_lsp.catalog.snapshot import Catalog, Delta, Entity, entity_differs
from slayer_lsp.reach.scope import Scope
from slayer_lsp.store import documents as d
from slayer_lsp.store.reader import PRIORITY_KEY, DocKey, LoadIssue, StoredDoc

__all__ = ["Reach", "restrict"]


# The dicts behind a reachable catalog (docs, entities, children_of, models_by_name), kept so the
# next restriction copies only the ones that change.
_RawMaps = tuple[
    dict[DocKey, StoredDoc], dict[str, Entity], dict[str, tuple[str, ...]], dict[str, tuple[str, ...]]
]


def restrict(catalog: Catalog, scope: Scope) -> Catalog:
    """The reachable catalog of ``catalog`` under ``scope`` (the catalog itself when unrestricted)."""
    if scope.unrestricted:
        return catalog
    return Reach(scope).restrict(catalog)[0]


# ------------------------------------------------------------------------------------ what a model reads

# dotted paths, read both ways: names may hold hyphens, and ``a.x-b.y`` may be a subtraction
_DOTTED = (
    re.compile(r"(?<![\w.])[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+"),
    re.compile(r"(?<![\w.-])[A-Za-z_][\w-]*(?:\.[A-Za-z_][\w-]*)+"),
)


def _model_texts(model: d.Model) -> Iterator[str]:
    """Every text of a model that may reach another model through a join path."""
    for col in model.columns:
        if col.sql:
            yield col.sql
        if col.filter:
            yield col.filter
    for meas in model.measures:
        if meas.formula:
            yield meas.formula
    for agg in model.aggregations:
        if agg.formula:
            yield agg.formula
        for p in agg.params:
            if p.sql:
                yield p.sql
    yield from (f for f in model.filters if isinstance(f, str))


@dataclass(frozen=True, slots=True)
class _ModelFacts:
    """What a model document says about the models it reads, before the join graph is consulted."""

    paths: tuple[tuple[str, ...], ...]  # dotted paths walked from the model itself
    stages: tuple[tuple[str | None, tuple[tuple[str, ...], ...]], ...]  # (source model name, its paths)


def _paths_of(texts: Iterable[str]) -> tuple[tuple[str, ...], ...]:
    seen: dict[tuple[str, ...], None] = {}
    for text in texts:
        for pattern in _DOTTED:
            for m in pattern.finditer(text):
                seen.setdefault(tuple(m.group(0).split(".")), None)
    return tuple(seen)


def _query_paths(query: Mapping[str, Any]) -> tuple[tuple[str, ...], ...]:
    """Dotted paths of every reference token of a query (lenient: a malformed entry is skipped)."""
    from slayer_lsp.query.references import query_references

    try:
        refs = query_references(query, problems=[])
    except Exception:  # noqa: BLE001 - an unreadable query names nothing we can walk
        return ()
    return _paths_of(r.text for r in refs if r.kind != "source")


def _source_name(query: Mapping[str, Any]) -> str | None:
    src = query.get("source_model")
    if isinstance(src, str):
        return src or None
    if isinstance(src, Mapping):
        name = src.get("source_name", src.get("name"))
        return name if isinstance(name, str) and name else None
    return None


def _model_facts(model: d.Model) -> _ModelFacts:
    stages = []
    for stage in model.source_queries or ():
        if isinstance(stage, Mapping):
            stages.append((_source_name(stage), _query_paths(stage)))
    return _ModelFacts(_paths_of(_model_texts(model)), tuple(stages))


class _Joins:
    """The join graph of one full catalog, walked both ways as SLayer walks it."""

    def __init__(self, models: Mapping[str, d.Model]):
        self.models = models
        self.incoming: dict[str, list[tuple[str, d.Join]]] = {}
        for mid, m in models.items():
            ds = m.data_source or ""
            for j in m.joins:
                if j.target_model != m.name:
                    self.incoming.setdefault(f"{ds}.{j.target_model}", []).append((mid, j))

    def hops(self, mid: str, token: str) -> list[str]:
        """Model ids one hop named ``token`` may reach from ``mid`` (by join name or target; every
        candidate, since over-approximating only hides more)."""
        model = self.models.get(mid)
        if model is None:
            return []
        ds = model.data_source or ""
        out = [f"{ds}.{j.target_model}" for j in model.joins if token in (j.name, j.target_model)]
        for declaring, j in self.incoming.get(mid, ()):
            if token in (j.name, self.models[declaring].name):
                out.append(declaring)
        return [o for o in out if o in self.models]

    def walk(self, start: str, path: tuple[str, ...], reads: set[str]) -> None:
        """Every model the segments of ``path`` may pass through, from ``start``, into ``reads``; a
        segment naming a model of the datasource outright counts as a read too."""
        ds = datasource_of(start)
        frontier = {start}
        for token in path:
            direct = f"{ds}.{token}"
            if direct in self.models and direct != start:
                reads.add(direct)
            nxt: set[str] = set()
            for mid in frontier:
                for target in self.hops(mid, token):
                    if target not in reads and target != start:
                        reads.add(target)
                    nxt.add(target)
            if not nxt:
                return
            frontier = nxt


def _holders(
    models: Mapping[str, d.Model], by_name: Mapping[str, tuple[str, ...]], name: str, ds: str | None
) -> list[str]:
    """Model ids a bare (or ``ds.name``) source name may mean: its own datasource first, else any."""
    if "." in name:
        return [name] if name in models else []
    if ds is not None and f"{ds}.{name}" in models:
        return [f"{ds}.{name}"]
    return [f"{other}.{name}" for other in by_name.get(name, ())]


def _reads(mid: str, facts: _ModelFacts, joins: _Joins, by_name: Mapping[str, tuple[str, ...]]) -> set[str]:
    reads: set[str] = set()
    for path in facts.paths:
        joins.walk(mid, path, reads)
    ds = datasource_of(mid)
    for source, paths in facts.stages:
        starts = _holders(joins.models, by_name, source, ds) if source else []
        reads.update(starts)
        for start in starts:
            for path in paths:
                joins.walk(start, path, reads)
    reads.discard(mid)
    return reads


# ------------------------------------------------------------------------------------------ memories


@dataclass(frozen=True, slots=True)
class _MemoryNames:
    """What a memory names, judged against one reachable model set: whether something unreachable
    is among it, whether something reachable anchors it, its links to other memories, and the keys
    of what its verdict depends on: ``ds`` / ``ds.model`` of its tags, ``m:<id>`` of its links,
    ``w:<word>`` of its query's words and ``r:<ds.model>`` of the models its query resolved into or
    walked through."""

    blocked: bool
    anchored: bool
    links: tuple[str, ...]
    deps: frozenset[str]


_WORDS = (re.compile(r"[A-Za-z_]\w*"), re.compile(r"[A-Za-z_][\w-]*"))


def _words(value: Any, out: set[str]) -> set[str]:
    """Every identifier-like word of the strings in a (nested) query value."""
    if isinstance(value, str):
        for pattern in _WORDS:
            out.update(pattern.findall(value))
    elif isinstance(value, Mapping):
        for k, v in value.items():
            _words(k, out)
            _words(v, out)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _words(v, out)
    return out


def _shape(catalog: Catalog, mid: str) -> set[tuple[str, str]] | None:
    """What a model gives meaning to in a query: its leaves ``("", leaf)`` and its joins
    ``(name, target)``; None when the model does not exist."""
    model = catalog.model(*split_model_id(mid))
    if model is None:
        return None
    shape = {("", name_of(c)) for c in catalog.children(mid)}
    shape.update((j.name or "", j.target_model) for j in model.joins)
    return shape


def _shape_words(shape: Iterable[tuple[str, str]]) -> set[str]:
    return {w for pair in shape for w in pair if w}


def _model_map(catalog: Catalog) -> dict[str, d.Model]:
    """``ds.model`` -> model of a catalog, unsorted (``Catalog.models`` sorts: not needed here)."""
    return catalog._lazy(
        "scope.models",
        lambda: {
            k.name: doc.value
            for k, doc in catalog.docs.items()
            if k.kind == "model" and isinstance(doc.value, d.Model)
        },
    )  # always a Model: told to the checker


def _joins_of(catalog: Catalog) -> _Joins:
    return catalog._lazy("scope.joins", lambda: _Joins(_model_map(catalog)))


def _same_reads(before: Catalog, after: Catalog, mid: str) -> bool:
    """Whether an edited model leaves every model's reachability as it was: it exists in both,
    with the same datasource, tags, joins and join paths in its definitions."""
    old, new = before.model(*split_model_id(mid)), after.model(*split_model_id(mid))
    if old is None or new is None:
        return False
    return (
        (old.data_source, old.access_tags) == (new.data_source, new.access_tags)
        and [(j.name, j.target_model) for j in old.joins] == [(j.name, j.target_model) for j in new.joins]
        and _model_facts(old) == _model_facts(new)
    )


@dataclass
class _Judge:
    """Reachability of names in one full catalog under one scope (model level decided already)."""

    scope: Scope
    full: Catalog
    models: frozenset[str]  # reachable model ids
    words: dict[str, tuple[object, frozenset[str]]] = field(
        default_factory=dict
    )  # memory id -> (query, words)
    _read: set[str] = field(default_factory=set)  # models the query being judged resolved into or walked

    def entity(self, canonical: str) -> bool | None:
        """True reachable, False unreachable (existing, or stale but outside the scope), None stale."""
        model = model_of(canonical)
        ent = self.full.entities.get(canonical)
        if ent is not None:
            if ent.kind == "datasource":
                return self.scope.admits_datasource(canonical)
            return model in self.models
        if not self.scope.admits_datasource(datasource_of(canonical)):
            return False
        if model is not None and model in self.full.entities:
            return model in self.models
        return None

    def unreachable_word(self, word: str) -> bool:
        """A bare word that names only unreachable things: a datasource outside the scope, or a
        model name every holder of which is unreachable."""
        if word in self.full.datasources and not self.scope.admits_datasource(word):
            return True
        holders = self.full.models_by_name.get(word)
        if not holders:
            return False
        return all(f"{ds}.{word}" not in self.models for ds in holders)

    def memory(self, mem: d.Memory) -> _MemoryNames:
        blocked = anchored = False
        links: list[str] = []
        deps: set[str] = set()
        for tag in mem.entities:
            if is_memory_ref(tag):
                links.append(memory_id_of(tag))
                deps.add("m:" + memory_id_of(tag))
                continue
            deps.add(model_of(tag) or tag)  # a leaf's verdict is its model's
            verdict = self.entity(tag)
            blocked |= verdict is False
            anchored |= verdict is True
        if mem.query is not None:
            hit = self.words.get(mem.id)
            if hit is None or hit[0] is not mem.query:
                hit = self.words[mem.id] = (mem.query, frozenset("w:" + w for w in _words(mem.query, set())))
            deps.update(hit[1])
            if not blocked:
                self._read = set()
                q_blocked, q_anchored = self.query(mem.query)
                blocked |= q_blocked
                anchored |= q_anchored
                deps.update("r:" + m for m in self._read)
        return _MemoryNames(blocked, anchored, tuple(links), frozenset(deps))

    def query(self, query: Mapping[str, Any]) -> tuple[bool, bool]:
        """(names something unreachable, names something reachable) for an attached query. Each
        reference is resolved against the full store and its join path walked from the source
        model (a hop through an unreachable model blocks, as SLayer counts it as read); one that
        does not resolve is judged by its words."""
        from slayer_lsp.query.references import query_references, source_model_of
        from slayer_lsp.query.resolver import resolve_entity

        if not isinstance(query, Mapping):
            return False, False
        blocked = anchored = False
        source = None
        try:
            source = source_model_of(query, self.full)
        except Exception:  # noqa: BLE001 - judged by its words
            name = _source_name(query)
            blocked = name is not None and any(self.unreachable_word(w) for w in _words(name, set()))
        if source is not None:
            raw = query.get("source_model")
            if isinstance(raw, Mapping) and "source_name" not in raw:  # an inline model
                stored = self.full.model(source.datasource, source.name) is not None
                verdict: bool | None = self.scope.admits_datasource(source.datasource) and (
                    not stored or source.canonical in self.models
                )
            else:
                verdict = self.entity(source.canonical)
            self._read.add(source.canonical)
            blocked |= verdict is False
            anchored |= verdict is True
        try:
            refs = query_references(query, problems=[])
        except Exception:  # noqa: BLE001 - a query of another shape names nothing we can read
            refs = []
        for ref in refs:
            if ref.kind == "source" or blocked:
                continue
            try:
                canonical = resolve_entity(ref.text, self.full, source).canonical
            except Exception:  # noqa: BLE001 - unresolvable: judged by its words
                blocked = any(self.unreachable_word(w) for w in _words(ref.text, set()))
                continue
            verdict = self.entity(canonical)
            model = model_of(canonical)
            if model is not None:
                self._read.add(model)
            blocked |= verdict is False
            anchored |= verdict is True
            if source is not None and not blocked:
                reads: set[str] = set()
                for path in _paths_of([ref.text]):
                    _joins_of(self.full).walk(source.canonical, path, reads)
                self._read |= reads
                blocked = not reads <= self.models
        return blocked, anchored


# ------------------------------------------------------------------------------------------ the reach


@dataclass
class _Kept:
    """A document kept with a changed value (pruned joins, stripped links), reused while its source
    document and the change are the same, so unchanged entities keep their identity."""

    source: StoredDoc
    signature: tuple[str, ...]
    doc: StoredDoc
    entities: tuple[Entity, ...]


def _doc_keys(canonicals: Iterable[str]) -> set[DocKey]:
    """The documents a set of touched entity ids comes from."""
    keys = set()
    for c in canonicals:
        if is_memory_ref(c):
            keys.add(DocKey("memory", memory_id_of(c)))
        else:
            model = model_of(c)
            keys.add(DocKey("datasource", c) if model is None else DocKey("model", model))
    return keys


@dataclass
class Reach:
    """Derives the reachable catalog of successive full snapshots under one scope.

    ``restrict(full, delta)`` returns the reachable catalog and the ``Delta`` against the previous
    one it returned: an entity that became unreachable is ``removed``, one that became reachable
    ``added``, one whose reachable form changed (a pruned join, a stripped link) ``changed``. Given
    the full snapshot's own delta, only what it touches is revisited: model reachability is
    recomputed when a model, a datasource or the priority changed; a memory is judged again when
    it changed or when something its verdict depends on did (a model it tags, a word of its query
    naming a changed model, one of its leaves or joins)."""

    scope: Scope
    _full: Catalog | None = None
    _scoped: Catalog | None = None
    _models: frozenset[str] = frozenset()
    _memories: frozenset[str] = frozenset()
    _names: dict[str, _MemoryNames] = field(default_factory=dict)
    _deps: dict[str, set[str]] = field(default_factory=dict)  # dependency key -> memory ids
    _facts: dict[DocKey, tuple[StoredDoc, _ModelFacts]] = field(default_factory=dict)
    _pruned: dict[DocKey, _Kept] = field(default_factory=dict)
    _stripped: dict[DocKey, _Kept] = field(default_factory=dict)
    _priority: tuple[StoredDoc, StoredDoc] | None = None
    _raw: _RawMaps | None = None  # the dicts behind the last reachable catalog
    _query_words: dict[str, tuple[object, frozenset[str]]] = field(default_factory=dict)

    # ------------------------------------------------------------------ models

    def _model_set(self, full: Catalog) -> frozenset[str]:
        """Reachable model ids: admitted by the scope, and reading only reachable models."""
        models = _model_map(full)
        visible = {mid for mid, m in models.items() if self.scope.admits_model(m)}
        if len(visible) == len(models):
            return frozenset(visible)
        facts: dict[DocKey, tuple[StoredDoc, _ModelFacts]] = {}
        for mid in visible:
            key = DocKey("model", mid)
            doc = full.docs[key]
            hit = self._facts.get(key)
            if hit is None or hit[0] is not doc:
                hit = (doc, _model_facts(doc.value))  # type: ignore[arg-type]
            facts[key] = hit
        self._facts = facts
        joins = _joins_of(full)
        reads = {
            key.name: _reads(key.name, f, joins, full.models_by_name)
            for key, (_, f) in facts.items()
            if f.paths or f.stages
        }
        while blocked := {mid for mid, r in reads.items() if mid in visible and not r <= visible}:
            visible -= blocked
        return frozenset(visible)

    def _pruned_model(
        self, key: DocKey, doc: StoredDoc, full: Catalog, models: frozenset[str]
    ) -> _Kept | None:
        """The model without its joins to unreachable models, or None when it keeps them all."""
        model: d.Model = doc.value  # type: ignore[assignment]
        ds = model.data_source or ""
        gone = tuple(
            j.target_model
            for j in model.joins
            if f"{ds}.{j.target_model}" in full.entities and f"{ds}.{j.target_model}" not in models
        )
        if not gone:
            self._pruned.pop(key, None)
            return None
        hit = self._pruned.get(key)
        if hit is not None and hit.source is doc and hit.signature == gone:
            return hit
        pruned = msgspec.structs.replace(model, joins=[j for j in model.joins if j.target_model not in gone])
        ents = [
            msgspec.structs.replace(
                full.entities[c], model=pruned, obj=pruned if c == key.name else full.entities[c].obj
            )
            for c in (key.name, *full.children(key.name))
        ]
        kept = _Kept(doc, gone, replace(doc, value=pruned), tuple(ents))
        self._pruned[key] = kept
        return kept

    # ------------------------------------------------------------------ memories

    def _depends(
        self,
        full: Catalog,
        prev_full: Catalog,
        changed_models: set[str],
        flipped: set[str],
        changed_ds: set[str],
    ) -> set[str]:
        """Memories whose verdict may change with these models and datasources: those tagging them,
        and those whose query mentions a word whose meaning moved (a model that appeared, vanished
        or changed reachability, with its leaves and joins; a leaf or join added or removed)."""
        keys: set[str] = set(changed_ds) | {"w:" + ds for ds in changed_ds}
        for mid in changed_models | flipped:
            keys.update((mid, "r:" + mid))  # memories tagging it; queries that resolved into or through it
            shapes = [_shape(cat, mid) for cat in (full, prev_full)]
            if (shapes[0] is None) != (shapes[1] is None):  # appeared or vanished: any word may move
                words = {name_of(mid)}.union(*(_shape_words(sh) for sh in shapes if sh is not None))
                words.update(
                    w
                    for declaring, j in _joins_of(full).incoming.get(mid, ())
                    for w in (j.name, name_of(declaring))
                    if w
                )
            else:
                words = _shape_words(shapes[0] ^ shapes[1])  # type: ignore[operator]
                if mid in flipped:  # a bare name is judged by its holders' reachability
                    words.add(name_of(mid))
            keys.update("w:" + w for w in words)
        return {m for k in keys for m in self._deps.get(k, ())}

    def _judge(self, full: Catalog, memory_ids: Iterable[str], models: frozenset[str]) -> bool:
        """Judge these memories again (dropping those gone); True when a verdict changed."""
        judge = _Judge(self.scope, full, models, self._query_words)
        moved = False
        for mid in memory_ids:
            old = self._names.pop(mid, None)
            if old is not None:
                for k in old.deps:
                    holders = self._deps.get(k)
                    if holders is not None:
                        holders.discard(mid)
                        if not holders:
                            del self._deps[k]
            mem = full.memory(mid)
            if mem is None:
                self._query_words.pop(mid, None)
                moved = True
                continue
            names = judge.memory(mem)
            self._names[mid] = names
            for k in names.deps:
                self._deps.setdefault(k, set()).add(mid)
            moved |= old is None or (old.blocked, old.anchored, old.links) != (
                names.blocked,
                names.anchored,
                names.links,
            )
        return moved

    def _reachable_memories(self) -> frozenset[str]:
        reachable = {mid for mid, n in self._names.items() if n.anchored and not n.blocked}
        waiting = {
            mid: n.links
            for mid, n in self._names.items()
            if n.links and not n.blocked and mid not in reachable
        }
        grew = True
        while grew and waiting:  # least fixpoint: a link anchors only through a memory already reached
            grew = False
            for mid, links in list(waiting.items()):
                if any(x in reachable for x in links):
                    reachable.add(mid)
                    del waiting[mid]
                    grew = True
        return frozenset(reachable)

    def _stripped_memory(
        self, key: DocKey, doc: StoredDoc, full: Catalog, reachable: frozenset[str]
    ) -> _Kept | None:
        """The memory without its links to unreachable memories, or None when it keeps them all."""
        mem: d.Memory = doc.value  # type: ignore[assignment]
        gone = tuple(t for t in mem.entities if is_memory_ref(t) and memory_id_of(t) not in reachable)
        if not gone:
            self._stripped.pop(key, None)
            return None
        hit = self._stripped.get(key)
        if hit is not None and hit.source is doc and hit.signature == gone:
            return hit
        stripped = msgspec.structs.replace(mem, entities=[t for t in mem.entities if t not in gone])
        kept = _Kept(
            doc,
            gone,
            replace(doc, value=stripped),
            (msgspec.structs.replace(full.entities[memory_ref(key.name)], obj=stripped),),
        )
        self._stripped[key] = kept
        return kept

    # ------------------------------------------------------------------ the catalog

    def restrict(self, full: Catalog, delta: Delta | None = None) -> tuple[Catalog, Delta]:
        """The reachable catalog of ``full`` and what changed since the last call. ``delta`` is the
        full snapshot's delta from the one given last time (``full.derive``); without it, or when
        ``full`` is not the next generation, everything is revisited."""
        if self.scope.unrestricted:
            out = _delta(self._scoped, full) if delta is None or self._scoped is None else delta
            self._full = self._scoped = full
            return full, out
        prev_full, prev = self._full, self._scoped
        if prev is not None and full is prev_full:
            return prev, Delta()
        fresh = (
            prev is None
            or prev_full is None
            or delta is None
            or full.generation != prev_full.generation + 1
            or len(delta.touched) > max(256, len(full.entities) // 4)
        )  # (a delta must follow the last snapshot)
        if fresh:
            old = prev
            self.__init__(self.scope)  # type: ignore[misc]
            prev_full = prev = Catalog.empty(full.location)
            delta = Delta(added=frozenset(full.entities), priority_changed=True)
        assert prev is not None and prev_full is not None and delta is not None
        scoped, touched = self._apply(full, prev_full, prev, delta, fresh)
        if fresh:
            out = _delta(old, scoped)
        else:
            before, after = prev.entities, scoped.entities
            out = Delta(
                frozenset(c for c in touched if c in after and c not in before),
                frozenset(
                    c
                    for c in touched
                    if c in after
                    and c in before
                    and before[c] is not after[c]
                    and entity_differs(before[c], after[c])
                ),
                frozenset(c for c in touched if c in before and c not in after),
                prev.priority != scoped.priority,
            )
        self._full, self._scoped = full, scoped
        return scoped, out

    def _apply(
        self, full: Catalog, prev_full: Catalog, prev: Catalog, delta: Delta, fresh: bool
    ) -> tuple[Catalog, set[str]]:
        scope = self.scope
        keys = set(full.docs) if fresh else _doc_keys(delta.touched)
        changed_models = {k.name for k in keys if k.kind == "model"}
        changed_ds = {k.name for k in keys if k.kind == "datasource"}
        changed_mems = {k.name for k in keys if k.kind == "memory"}
        old_models, old_memories = self._models, self._memories
        if (
            fresh
            or changed_ds
            or delta.priority_changed
            or not all(_same_reads(prev_full, full, mid) for mid in changed_models)
        ):
            self._models = self._model_set(full)
        models = self._models
        flipped = set(old_models ^ models)
        affected = changed_models | flipped
        moved = flipped | {
            mid for mid in changed_models if (mid in prev_full.entities) != (mid in full.entities)
        }
        if moved:  # models whose joins to these may now be pruned or restored
            joins = _joins_of(full)
            for mid in moved:
                affected.update(declaring for declaring, _ in joins.incoming.get(mid, ()))

        if fresh or delta.priority_changed:
            rejudge: set[str] = set(full.memory_order) | set(self._names)
        else:
            rejudge = changed_mems
            if changed_models or flipped or changed_ds:
                rejudge = rejudge | self._depends(full, prev_full, changed_models, flipped, changed_ds)
        if self._judge(full, rejudge, models):
            self._memories = self._reachable_memories()
        memories = self._memories
        mem_flipped = old_memories ^ memories
        mem_touched = rejudge | mem_flipped
        for mid in mem_flipped:
            mem_touched.update(self._deps.get("m:" + mid, ()))

        touched: set[str] = set()
        raw: _RawMaps = self._raw if self._raw is not None else ({}, {}, {}, {})
        docs = (
            raw[0].copy()
            if affected or changed_ds or mem_touched or delta.priority_changed or fresh
            else raw[0]
        )
        entities = raw[1].copy() if affected or changed_ds or mem_touched else raw[1]
        children = raw[2].copy() if affected or changed_ds else raw[2]
        by_name = raw[3].copy() if affected else raw[3]
        for mid in affected:
            key = DocKey("model", mid)
            if mid in prev.entities:
                for c in (mid, *prev.children_of.get(mid, ())):
                    entities.pop(c, None)
                    touched.add(c)
            children.pop(mid, None)
            docs.pop(key, None)
            doc = full.docs.get(key)
            if mid not in models or doc is None:
                continue
            kept = self._pruned_model(key, doc, full, models)
            new = (
                kept.entities
                if kept is not None
                else tuple(full.entities[c] for c in (mid, *full.children(mid)))
            )
            for ent in new:
                entities[ent.canonical] = ent
                touched.add(ent.canonical)
            children[mid] = full.children(mid)
            docs[key] = kept.doc if kept is not None else doc
        for key in list(self._pruned):
            if key.name not in models:
                del self._pruned[key]
        for ds in changed_ds | {datasource_of(mid) for mid in affected}:
            key = DocKey("datasource", ds)
            entities.pop(ds, None)
            docs.pop(key, None)
            children.pop(ds, None)
            touched.add(ds)
            if not scope.admits_datasource(ds):
                continue
            if key in full.docs:
                docs[key] = full.docs[key]
                entities[ds] = full.entities[ds]
            kids = full.children_of.get(ds)
            if kids is not None:
                kept_kids = tuple(k for k in kids if k in models)
                children[ds] = kids if len(kept_kids) == len(kids) else kept_kids
        for name in {name_of(mid) for mid in affected}:
            dss = full.models_by_name.get(name, ())
            kept_ds = tuple(ds for ds in dss if f"{ds}.{name}" in models)
            if kept_ds:
                by_name[name] = dss if len(kept_ds) == len(dss) else kept_ds
            else:
                by_name.pop(name, None)
        for mid in mem_touched:
            key, ref = DocKey("memory", mid), memory_ref(mid)
            entities.pop(ref, None)
            docs.pop(key, None)
            touched.add(ref)
            doc = full.docs.get(key)
            if mid not in memories or doc is None:
                self._stripped.pop(key, None)
                continue
            kept = self._stripped_memory(key, doc, full, memories)
            docs[key] = kept.doc if kept is not None else doc
            entities[ref] = kept.entities[0] if kept is not None else full.entities[ref]

        priority = tuple(ds for ds in full.priority if scope.admits_datasource(ds))
        pdoc = full.docs.get(PRIORITY_KEY)
        if delta.priority_changed or fresh:
            docs.pop(PRIORITY_KEY, None)
            if pdoc is not None:
                if priority == tuple(pdoc.value):  # type: ignore[arg-type]
                    docs[PRIORITY_KEY] = pdoc
                else:
                    if self._priority is None or self._priority[0] is not pdoc:
                        self._priority = (pdoc, replace(pdoc, value=priority))
                    docs[PRIORITY_KEY] = self._priority[1]
        memory_order = prev.memory_order
        if fresh or memories != old_memories or full.memory_order != prev_full.memory_order:
            memory_order = tuple(m for m in full.memory_order if m in memories)
        scoped = Catalog(
            full.location,
            _frozen(docs, raw[0], prev.docs),
            _frozen(entities, raw[1], prev.entities),
            _frozen(children, raw[2], prev.children_of),
            _frozen(by_name, raw[3], prev.models_by_name),
            memory_order,
            priority,
            tuple(i for i in full.load_issues if self._keeps_issue(i)),
            full.fatal,
            full.generation,
        )
        self._raw = (docs, entities, children, by_name)
        return scoped, touched

    def _keeps_issue(self, issue: LoadIssue) -> bool:
        """A document that did not load shows no tags: its issue is kept only when the scope has no
        access tags and the document sits in a reachable datasource."""
        if self.scope.access_tags is not None:
            return False
        ds = _issue_datasource(issue)
        return ds is not None and self.scope.admits_datasource(ds)


def _frozen(new: dict, old: dict, old_view: Mapping) -> Mapping:
    """A read-only view of ``new``; the previous view when nothing was copied."""
    return old_view if new is old else MappingProxyType(new)


def _issue_datasource(issue: LoadIssue) -> str | None:
    src = issue.source
    if src.table is not None:
        if src.table == "models" and src.row and model_of(src.row) is not None:
            return datasource_of(src.row)  # a model row's key is its model id
        if src.table == "datasources" and src.row:
            return src.row
        return None
    parts = str(src.path).replace("\\", "/").split("/")
    if len(parts) >= 3 and parts[-3] == "models":
        return parts[-2]
    if len(parts) >= 2 and parts[-2] == "datasources":
        return parts[-1].rsplit(".", 1)[0]
    return None


def _delta(old: Catalog | None, new: Catalog) -> Delta:
    """What differs between two reachable catalogs, entity by entity (identity first: unchanged
    entities are the same objects)."""
    if old is None:
        return Delta(added=frozenset(new.entities))
    before, after = old.entities, new.entities
    added: list[str] = []
    changed: list[str] = []
    for c, ent in after.items():
        was = before.get(c)
        if was is None:
            added.append(c)
        elif was is not ent and entity_differs(was, ent):
            changed.append(c)
    removed = [c for c in before if c not in after] if len(before) + len(added) != len(after) else []
    return Delta(frozenset(added), frozenset(changed), frozenset(removed), old.priority != new.priority)
