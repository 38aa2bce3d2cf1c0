"""Entity resolution: any reference a SLayer query or memory may spell -> one canonical id.

Reproduces ``slayer.memories.resolver.resolve_entity`` (motley-slayer 1.4.1) over an immutable
``Catalog``: ``memory:<id>``; aggregation calls (``sum(x)``, legacy ``x:sum``, ``count(*)``,
``count(m.*)``); a datasource head (``ds.model.leaf``); bare names (a leaf of the source model, a
model settled by datasource priority, a leaf searched datasource by datasource); dotted paths whose
hops walk joins in either direction (edge name first, else the model at the other end). Join paths
never become part of an id: ``orders.customers.city`` is ``<ds>.customers.city``.

Error and warning texts are SLayer's own wording, so search warnings built from them match
SLayer's. Deliberate differences (each has a ``test_fix_*`` test):

* the exception hierarchy: ``AmbiguousModelError`` and ``AmbiguousJoinPathError`` are
  ``EntityResolutionError``\\s, so a caller dropping unresolvable input drops those too (SLayer lets
  an ambiguous join path abort a whole search);
* under a source model, a dotted path whose head is neither a datasource nor a model (an edge name
  such as ``product.name`` from ``order_items``) is walked from the source model instead of
  failing, which is how the query engine reads it;
* a removed leaf (``customers.loyalty_tier``) keeps SLayer's message but carries a ``hint`` naming
  what really failed.

Resolution is about existence: hidden models and columns resolve. Lookups use the catalog's maps;
only a bare leaf name consults a per-catalog leaf index, built once and cached on the catalog.
"""

from __future__ import annotations

import bisect
import re
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from slayer_lsp.catalog import Catalog
from slayer_lsp.catalog.ids import is_memory_ref, memory_id_of, name_of, split_model_id
from slayer_lsp.query import formulas
from slayer_lsp.store import documents as d

__all__ = [
    "AmbiguousJoinPathError",
    "AmbiguousModelError",
    "EntityResolutionError",
    "Resolution",
    "SourceModel",
    "check_memory_id",
    "model_identity",
    "resolve_entity",
]


class EntityResolutionError(ValueError):
    """A reference that names no entity. ``str(exc)`` is SLayer's wording; ``hint`` (optional) says
    more where SLayer's message misleads."""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


class AmbiguousModelError(EntityResolutionError):
    """A bare model name held by several datasources, none of them in the priority list."""

    def __init__(self, name: str, candidates: Iterable[str]) -> None:
        self.name = name
        self.candidates = tuple(candidates)
        super().__init__(
            f"Model '{name}' exists in multiple datasources: {sorted(self.candidates)}. Specify a "
            f"data_source or set a datasource priority to disambiguate."
        )


@dataclass(frozen=True, slots=True)
class Edge:
    """A declared join seen from the model a hop leaves (pairs and cardinality oriented to match)."""

    source: str
    target: str
    name: str | None
    pairs: tuple[tuple[str, str], ...]
    cardinality: str | None
    declaring: str


class AmbiguousJoinPathError(EntityResolutionError):
    """Two or more join edges answer one hop and no edge name tells them apart."""

    def __init__(self, source_model: str, token: str, candidates: Sequence[Edge]) -> None:
        self.source_model = source_model
        self.target_model = candidates[0].target
        self.token = token
        self.candidates = tuple(candidates)
        lines = [
            f"Ambiguous join hop {source_model!r} → {self.target_model!r}: {len(candidates)} edges "
            f"connect these models and no edge name resolves it."
        ]
        for e in candidates:
            named = f" name={e.name!r}" if e.name else ""
            pairs = ", ".join(f"{a}={b}" for a, b in e.pairs)
            lines.append(
                f"  - declared on {e.declaring!r}{named}: pairs [{pairs}], cardinality {e.cardinality}"
            )
        lines.append("Give one edge a `name` and use it as the path segment to disambiguate.")
        super().__init__("\n".join(lines))


@dataclass(frozen=True, slots=True)
class Resolution:
    canonical: str
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class SourceModel:
    """The model a query reads from. A stored model is just its ids; an inline model or a model
    extension also brings its own leaves (``leaves``) and joins (``joins``), which replace the stored
    ones while walking from it."""

    datasource: str
    name: str
    leaves: frozenset[str] | None = None
    joins: tuple[d.Join, ...] | None = None

    @property
    def canonical(self) -> str:
        return f"{self.datasource}.{self.name}"


# ------------------------------------------------------------------------------------ catalog indexes


@dataclass(frozen=True, slots=True)
class _Index:
    # leaf name -> datasource -> models (listing order) that have it as column / measure / aggregation
    leaf_owners: dict[str, dict[str, tuple[str, ...]]]
    # (datasource, model) -> joins declared on *other* models that target it, in listing order
    incoming: dict[tuple[str, str], tuple[tuple[str, d.Join], ...]]


def _build_index(catalog: Catalog) -> _Index:
    owners: dict[str, dict[str, list[str]]] = {}
    incoming: dict[tuple[str, str], list[tuple[str, d.Join]]] = {}
    for mid, model in catalog.models.items():
        ds = model.data_source or ""
        for leaf_id in catalog.children(mid):
            leaf = name_of(leaf_id)
            owners.setdefault(leaf, {}).setdefault(ds, []).append(model.name)
        for join in model.joins:
            if join.target_model != model.name:
                incoming.setdefault((ds, join.target_model), []).append((model.name, join))
    return _Index(
        {leaf: {ds: tuple(ms) for ds, ms in by_ds.items()} for leaf, by_ds in owners.items()},
        {key: tuple(v) for key, v in incoming.items()},
    )


@dataclass(frozen=True, slots=True)
class _ModelFacts:
    """What one model document contributes to the index."""

    doc: object  # the StoredDoc, compared by identity: derive() keeps unchanged documents
    datasource: str
    name: str
    leaves: tuple[str, ...]
    joins: tuple[tuple[str, d.Join], ...]  # (target, join) of its joins to other models, declared order


def _model_facts(catalog: Catalog) -> dict[object, _ModelFacts]:
    """Per model document key, what it adds to the index."""
    out: dict[object, _ModelFacts] = {}
    for key, doc in catalog.docs.items():
        if key.kind == "model":
            model = doc.value
            if isinstance(model, d.Model):
                out[key] = _facts(catalog, key.name, doc, model)
    return out


def _facts(catalog: Catalog, mid: str, doc: object, model: d.Model) -> _ModelFacts:
    return _ModelFacts(
        doc,
        model.data_source or "",
        model.name,
        tuple(name_of(leaf_id) for leaf_id in catalog.children(mid)),
        tuple((j.target_model, j) for j in model.joins if j.target_model != model.name),
    )


class _LastIndex:
    """The index built last, with the model facts it came from, so that the next snapshot of the
    same store updates it for the models that changed instead of walking every leaf again (the
    first bare name after a one-model edit would otherwise pay for the whole store)."""

    lock = threading.Lock()
    location: object = None
    facts: dict[object, _ModelFacts] = {}
    index: _Index | None = None


def _index(catalog: Catalog) -> _Index:
    return catalog._lazy("resolver.index", lambda: _index_for(catalog))


def _index_for(catalog: Catalog) -> _Index:
    with _LastIndex.lock:
        location, facts, index = _LastIndex.location, _LastIndex.facts, _LastIndex.index
    if index is None or location != catalog.location:
        new_facts = _model_facts(catalog)
        index = _build_index(catalog)
    else:
        new_facts, index = _updated_index(catalog, facts, index)
    with _LastIndex.lock:
        _LastIndex.location, _LastIndex.facts, _LastIndex.index = catalog.location, new_facts, index
    return index


def _updated_index(
    catalog: Catalog, old_facts: dict[object, _ModelFacts], index: _Index
) -> tuple[dict[object, _ModelFacts], _Index]:
    """``index`` (built from ``old_facts``) brought to ``catalog``: equal to ``_build_index(catalog)``.
    Copy-on-write: the old index stays valid for requests still answering from the old snapshot."""
    new_facts: dict[object, _ModelFacts] = {}
    gone: list[_ModelFacts] = []
    came: list[_ModelFacts] = []
    for key, doc in catalog.docs.items():
        if key.kind != "model" or not isinstance(doc.value, d.Model):
            continue
        old = old_facts.get(key)
        if old is not None and old.doc is doc:
            new_facts[key] = old
            continue
        new_facts[key] = fresh = _facts(catalog, key.name, doc, doc.value)
        came.append(fresh)
        if old is not None:
            gone.append(old)
    gone.extend(f for key, f in old_facts.items() if key not in new_facts)
    if not gone and not came:
        return new_facts, index
    if len(gone) + len(came) > max(64, len(new_facts) // 4):  # a large change: a fresh build is cheaper
        return new_facts, _build_index(catalog)

    owners = dict(index.leaf_owners)
    touched_owners: dict[tuple[str, str], list[str]] = {}

    def owner_list(leaf: str, ds: str) -> list[str]:
        key = (leaf, ds)
        if key not in touched_owners:
            touched_owners[key] = list(owners.get(leaf, {}).get(ds, ()))
        return touched_owners[key]

    incoming = dict(index.incoming)
    touched_incoming: dict[tuple[str, str], list[tuple[str, d.Join]]] = {}

    def incoming_list(ds: str, target: str) -> list[tuple[str, d.Join]]:
        key = (ds, target)
        if key not in touched_incoming:
            touched_incoming[key] = list(incoming.get(key, ()))
        return touched_incoming[key]

    for f in gone:
        for leaf in f.leaves:
            names = owner_list(leaf, f.datasource)
            names[:] = [n for n in names if n != f.name]
        for target, _ in f.joins:
            entries = incoming_list(f.datasource, target)
            entries[:] = [e for e in entries if e[0] != f.name]
    for f in came:
        for leaf in f.leaves:
            bisect.insort(owner_list(leaf, f.datasource), f.name)
        mine: dict[str, list[tuple[str, d.Join]]] = {}
        for target, join in f.joins:
            mine.setdefault(target, []).append((f.name, join))
        for target, entries_of_mine in mine.items():
            entries = incoming_list(f.datasource, target)
            at = next((k for k, e in enumerate(entries) if e[0] > f.name), len(entries))
            entries[at:at] = entries_of_mine

    for (leaf, ds), names in touched_owners.items():
        by_ds = dict(owners.get(leaf, {}))
        if names:
            by_ds[ds] = tuple(names)
        else:
            by_ds.pop(ds, None)
        if by_ds:
            owners[leaf] = by_ds
        else:
            owners.pop(leaf, None)
    for ds_target, entries in touched_incoming.items():
        if entries:
            incoming[ds_target] = tuple(entries)
        else:
            incoming.pop(ds_target, None)
    return new_facts, _Index(owners, incoming)


# ------------------------------------------------------------------------------------------- helpers

_SEGMENT = re.compile(r"^[a-zA-Z_][\w-]*$")
_FORBIDDEN_MEMORY_ID_CHARS = (":", "/", "?", "#", "\\")
_INVERSE = {"many_to_one": "one_to_many", "one_to_many": "many_to_one"}


def check_memory_id(memory_id: str) -> None:
    """Raise ``EntityResolutionError`` when ``memory_id`` could not be a memory id."""
    if not memory_id:
        raise EntityResolutionError("memory id must be non-empty.")
    for ch in _FORBIDDEN_MEMORY_ID_CHARS:
        if ch in memory_id:
            raise EntityResolutionError(f"memory id {memory_id!r}: forbidden character {ch!r}.")
    for ch in memory_id:
        if ch.isspace() or ord(ch) < 0x20 or ord(ch) == 0x7F:
            raise EntityResolutionError(
                f"memory id {memory_id!r}: whitespace and ASCII control characters are not allowed."
            )


def model_identity(catalog: Catalog, name: str, priority: Sequence[str]) -> tuple[str, str] | None:
    """``(datasource, name)`` of a bare model name: the only holder, else the first holder in
    ``priority``; ``None`` when no datasource has it; ``AmbiguousModelError`` otherwise."""
    candidates = catalog.models_by_name.get(name, ())
    if not candidates:
        return None
    if len(candidates) == 1:
        return candidates[0], name
    for ds in priority:
        if ds in candidates:
            return ds, name
    raise AmbiguousModelError(name, candidates)


class _Ctx:
    """One resolution's inputs: the catalog, the effective priority and the source model."""

    __slots__ = ("catalog", "priority", "source")

    def __init__(self, catalog: Catalog, priority: Sequence[str] | None, source: SourceModel | None) -> None:
        self.catalog = catalog
        self.priority = tuple(catalog.priority if priority is None else priority)
        self.source = source

    # -- models as (datasource, name) plus an optional override (the source model's own definition)
    def has_leaf(self, ds: str, model: str, leaf: str, root: SourceModel | None = None) -> bool:
        if root is not None and root.leaves is not None and (root.datasource, root.name) == (ds, model):
            return leaf in root.leaves
        return f"{ds}.{model}.{leaf}" in self.catalog.entities

    def model_exists(self, ds: str, name: str, root: SourceModel | None) -> bool:
        if root is not None and (root.datasource, root.name) == (ds, name):
            return True
        return self.catalog.model(ds, name) is not None

    def neighbours(self, ds: str, current: str, root: SourceModel | None) -> list[Edge]:
        """Every hop incident to ``current``, oriented away from it: its own joins first, then joins
        other models of the datasource declare towards it (SLayer's ``join_walker.neighbors``)."""
        override = root if root is not None and root.joins is not None and root.datasource == ds else None
        if override is not None and override.name == current:
            own: Sequence[d.Join] = override.joins or ()
        else:
            model = self.catalog.model(ds, current)
            own = model.joins if model is not None else ()
        edges = [
            Edge(
                current,
                j.target_model,
                j.name,
                j.key_pairs,
                j.cardinality,
                current,
            )
            for j in own
        ]
        declared = list(_index(self.catalog).incoming.get((ds, current), ()))
        if override is not None and override.name != current:
            declared = [(m, j) for m, j in declared if m != override.name]
            mine = [(override.name, j) for j in override.joins or () if j.target_model == current]
            at = next((k for k, (m, _) in enumerate(declared) if m > override.name), len(declared))
            declared[at:at] = mine
        for declaring, j in declared:
            if declaring == current:
                continue
            edges.append(
                Edge(
                    current,
                    declaring,
                    j.name,
                    tuple((there, here) for here, there in j.key_pairs),
                    _INVERSE.get(j.cardinality or "", j.cardinality),
                    declaring,
                )
            )
        return edges

    def hop(self, ds: str, current: str, token: str, root: SourceModel | None) -> Edge | None:
        edges = self.neighbours(ds, current, root)
        hits = [e for e in edges if e.name == token] or [e for e in edges if e.target == token]
        if len(hits) > 1:
            raise AmbiguousJoinPathError(current, token, hits)
        return hits[0] if hits else None

    def walk(self, ds: str, root_name: str, path: Sequence[str], root: SourceModel | None) -> str | _Miss:
        """The model ``path`` reaches from ``root_name``, or where it stopped. A circular or ambiguous
        hop raises (SLayer's messages)."""
        current = root_name
        visited = {root_name}
        for token in path:
            edge = self.hop(ds, current, token, root)
            if edge is not None and edge.target in visited:
                raise EntityResolutionError(
                    f"Circular join detected resolving {'.'.join(path)!r} from {root_name!r}: hop {token!r} "
                    f"revisits model {edge.target!r}."
                )
            if edge is None or not self.model_exists(ds, edge.target, root):
                return _Miss(token, current)
            visited.add(edge.target)
            current = edge.target
        return current

    def dotted(self, ds: str, model: str, rest: Sequence[str], root: SourceModel | None = None) -> str:
        """Canonical id of ``rest`` read from ``ds.model``: hops then a leaf, else hops to a model."""
        if not rest:
            return f"{ds}.{model}"
        leaf = rest[-1]
        try:
            owner: str | _Miss | None = self.walk(ds, model, rest[:-1], root)
        except AmbiguousJoinPathError:
            raise
        except EntityResolutionError:  # circular: the full walk below reports it
            owner = None
        if isinstance(owner, str) and self.has_leaf(ds, owner, leaf, root):
            return f"{ds}.{owner}.{leaf}"
        final = self.walk(ds, model, rest, root)
        if isinstance(final, _Miss):
            hint = None
            if isinstance(owner, str) and final.token == leaf and final.model == owner:
                hint = (
                    f"'{leaf}' is neither a column, measure or aggregation of model '{ds}.{owner}' nor a "
                    f"join from it"
                )
            raise EntityResolutionError(
                f"'{final.token}' is not a join target on model '{final.model}'.", hint=hint
            )
        return f"{ds}.{final}"


@dataclass(frozen=True, slots=True)
class _Miss:
    """Where a join walk stopped: the hop ``token`` that ``model`` has no join for."""

    token: str
    model: str


# ------------------------------------------------------------------------------------------- resolve


def resolve_entity(
    raw: str,
    catalog: Catalog,
    source_model: str | SourceModel | None = None,
    priority: Sequence[str] | None = None,
) -> Resolution:
    """Resolve one reference to its canonical id, the way SLayer's ``resolve_entity`` does.

    ``source_model`` is a canonical ``"ds.model"`` (or a ``SourceModel``): bare names prefer its
    leaves, and ``count(*)`` means it. ``priority`` replaces ``catalog.priority`` when given
    (``()`` means no priority). Raises ``EntityResolutionError`` (or a subclass)."""
    if isinstance(source_model, str):
        ds, name = split_model_id(source_model)
        if catalog.model(ds, name) is None:
            raise EntityResolutionError(f"Source model not found: {source_model!r}.")
        source_model = SourceModel(ds, name)
    return _resolve(raw, _Ctx(catalog, priority, source_model))


def _resolve(raw: str, ctx: _Ctx) -> Resolution:
    raw = raw.strip()
    if not raw:
        raise EntityResolutionError("entity reference is empty")
    catalog = ctx.catalog

    if is_memory_ref(raw):
        memory_id = memory_id_of(raw)
        check_memory_id(memory_id)
        if catalog.memory(memory_id) is None:
            raise EntityResolutionError(f"No memory with id {memory_id!r}.")
        return Resolution(raw)

    try:
        prefix, agg = formulas.split_agg_ref(raw)
    except formulas.ModeBError as exc:
        raise EntityResolutionError(str(exc)) from exc

    if prefix == "*":
        if agg != "count":
            raise EntityResolutionError(
                f"'{raw}' is not a valid entity reference; use 'count(*)' to refer to a model's row count."
            )
        if ctx.source is None:
            raise EntityResolutionError(
                "'count(*)' requires a model context: write 'count(<model>.*)' or invoke from a query "
                "that has a source_model."
            )
        return Resolution(ctx.source.canonical)
    if prefix.endswith(".*"):
        if agg != "count":
            raise EntityResolutionError(
                f"'{raw}' is not a valid entity reference; use the 'count(<model>.*)' form."
            )
        return _resolve(prefix[:-2], ctx)

    segments = prefix.split(".")
    if not all(_SEGMENT.match(s) for s in segments):
        raise EntityResolutionError(f"'{raw}' contains an invalid identifier segment.")

    head = segments[0]
    if head in catalog.datasources:
        warnings: tuple[str, ...] = ()
        if head in catalog.models_by_name:
            warnings = (
                f"'{head}' is both a datasource and a model; interpreted as datasource. To force the "
                f"model interpretation, qualify as <other_ds>.{head}...",
            )
        if len(segments) == 1:
            return Resolution(head, warnings)
        model_name = segments[1]
        if catalog.model(head, model_name) is None:
            raise EntityResolutionError(f"No model '{model_name}' in datasource '{head}'.")
        return Resolution(ctx.dotted(head, model_name, segments[2:]), warnings)

    if len(segments) == 1:
        return _resolve_bare(head, ctx)

    identity = model_identity(catalog, head, ctx.priority)
    if identity is None:
        src = ctx.source
        if src is not None:
            # Not SLayer: under a source model a dotted path is a join path from it (``product.name``
            # from order_items follows the edge named ``product``), as the query engine reads it.
            try:
                return Resolution(ctx.dotted(src.datasource, src.name, segments, src))
            except AmbiguousJoinPathError:
                raise
            except EntityResolutionError:
                pass
        raise EntityResolutionError(
            f"'{head}' is neither a known datasource nor a saved model. (segment of '{raw}')."
        )
    ds, model_name = identity
    return Resolution(ctx.dotted(ds, model_name, segments[1:]))


def _resolve_bare(leaf: str, ctx: _Ctx) -> Resolution:
    catalog = ctx.catalog
    src = ctx.source
    if src is not None and ctx.has_leaf(src.datasource, src.name, leaf, src):
        return Resolution(f"{src.canonical}.{leaf}")

    identity = model_identity(catalog, leaf, ctx.priority)
    if identity is not None:
        ds, model_name = identity
        owners = _index(catalog).leaf_owners.get(leaf, {}).get(ds, ())
        others = sorted(m for m in owners if m != model_name)
        warnings: tuple[str, ...] = ()
        if others:
            warnings = (
                f"'{leaf}' is both a model and a column on {others}; resolved as the model. Qualify as "
                f"<model>.{leaf} to refer to the column.",
            )
        return Resolution(f"{ds}.{model_name}", warnings)

    owners_by_ds = _index(catalog).leaf_owners.get(leaf, {})
    order = list(ctx.priority) + [ds for ds in catalog.datasources if ds not in ctx.priority]
    for ds in order:
        matches = owners_by_ds.get(ds)
        if not matches:
            continue
        if len(matches) > 1:
            raise EntityResolutionError(
                f"Ambiguous bare name '{leaf}' matches columns / measures / aggregations on {sorted(matches)} "
                f"in datasource '{ds}'. Qualify as '<model>.{leaf}'."
            )
        return Resolution(f"{ds}.{matches[0]}.{leaf}")
    raise EntityResolutionError(
        f"Entity '{leaf}' not found in any datasource (checked all known datasources)."
    )
