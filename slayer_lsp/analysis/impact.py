"""What depends on an entity: the queries, memories, measures, aggregations and joins that would break
if it were removed or renamed, found transitively through formulas and joins.

One dependency graph per catalog snapshot holds what the store itself says (measure formulas, custom
aggregation parameters, joins, model filters, memory tags and memory queries); one per set of
workspace documents holds what the query and memory files name. A query that reaches a column of
another model uses the join between the two models, so removing a join key reaches it through the
join. The language server (``slayer/impact``, code lenses) and ``slayer-lsp check --impact`` both
call ``impact``: one answer wherever it is asked.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import yaml

from slayer_lsp.analysis import parsed_file as dm
from slayer_lsp.analysis.binding import bind_all, resolve
from slayer_lsp.analysis.navigation import FILES, LocationData, entity_location
from slayer_lsp.analysis.workspace import WorkspaceDoc
from slayer_lsp.catalog import Catalog
from slayer_lsp.catalog.ids import datasource_of, is_memory_ref, memory_ref, parent_of
from slayer_lsp.catalog.snapshot import ENTITY_KINDS

KINDS = (
    "query",
    "memory",
    "measure",
    "aggregation",
    "join",
    "model",
)  # the kinds of a dependent, in lens order
# what impact and rename may be asked about: every entity of the catalog but a memory
IMPACT_KINDS = tuple(kind for kind in ENTITY_KINDS if kind != "memory")
_PLURAL = {
    "query": "queries",
    "memory": "memories",
    "measure": "measures",
    "aggregation": "aggregations",
    "join": "joins",
    "model": "models",
}


class ImpactError(ValueError):
    """An entity that cannot be asked about (unknown, or not a datasource, model or leaf)."""


@dataclass(frozen=True, slots=True)
class Dependent:
    """One edge of the graph: ``name`` (of ``kind``) uses the entity it is filed under. ``node`` is the
    dependent's own node when others may depend on it in turn (a measure, a join)."""

    kind: str
    name: str
    node: str | None = None
    path: str | None = None  # a workspace document (its key), for queries and memories of the workspace
    span: dm.Span | None = None
    locate: tuple[
        str, ...
    ] = ()  # how to find a store dependent's line: ("entity", id) | ("join", model, index)


@dataclass(frozen=True, slots=True)
class Use:
    """A dependent found by ``impact``: ``target`` is the entity it names, ``via`` the chain from the
    asked entity to that target (empty when it names the asked entity or one of its parts)."""

    kind: str
    name: str
    target: str
    via: tuple[str, ...]
    location: LocationData | None


@dataclass(frozen=True)
class Impact:
    entity: str
    kind: str
    uses: tuple[Use, ...]

    def counts(self) -> dict[str, int]:
        """Distinct dependents per kind (a query file counts once however often it names the entity)."""
        seen: dict[str, set[str]] = {}
        for u in self.uses:
            seen.setdefault(u.kind, set()).add(u.name)
        return {k: len(seen[k]) for k in KINDS if k in seen}

    def summary(self) -> str:
        counts = self.counts()
        if not counts:
            return "no dependents"
        return " · ".join(f"{n} {k if n == 1 else _PLURAL[k]}" for k, n in counts.items())


def join_node(model: str, index: int) -> str:
    return f"join:{model}#{index}"


def _add(graph: dict[str, list[Dependent]], target: str | None, dep: Dependent) -> None:
    if target is not None:
        graph.setdefault(target, []).append(dep)


# --------------------------------------------------------------------------- the store's graph


def _unordered(a: str, b: str) -> tuple[str, str]:
    """The key of a pair of models, whichever side joins the other."""
    return (a, b) if a <= b else (b, a)


@dataclass
class _StoreGraph:
    catalog: Catalog
    edges: dict[str, list[Dependent]] = field(default_factory=dict)
    joins_between: dict[tuple[str, str], list[str]] = field(
        default_factory=dict
    )  # {model, model} -> join nodes


def _formula_targets(text: str, catalog: Catalog, model: str) -> Iterable[str]:
    for tok in dm.scan_formula(text):
        if tok.is_call:
            cand = f"{model}.{tok.text}"
            if catalog.kind_of(cand) == "aggregation":
                yield cand
            continue
        canonical, _, _, _ = resolve(tok.text, catalog, model)
        if canonical is not None:
            yield canonical


def _memory_document(catalog: Catalog, mid: str) -> tuple[dm.ParsedDocument | None, bool]:
    """A memory's parse: its file for a YAML store (real spans), else its front matter rendered."""
    ent = catalog.get(memory_ref(mid))
    if ent is None:
        return None, False
    if ent.source.table is None:
        doc = FILES.parsed(ent.source.path, "memory")
        if doc is not None:
            return doc, True
    mem = catalog.memory(mid)
    if mem is None:
        return None, False
    front: dict = {"entities": list(mem.entities)}
    if mem.query is not None:
        front["query"] = mem.query
    text = "---\n" + yaml.safe_dump(front, sort_keys=False, allow_unicode=True) + "---\n"
    return dm.parse_document(text, "memory", None), False


def _build_store_graph(catalog: Catalog) -> _StoreGraph:
    g = _StoreGraph(catalog)
    for mid, model in catalog.models.items():
        ds = datasource_of(mid)
        for m in model.measures:
            if not m.name:
                continue
            node = f"{mid}.{m.name}"
            for target in set(_formula_targets(m.formula or "", catalog, mid)):
                if target != node:
                    _add(g.edges, target, Dependent("measure", node, node, locate=("entity", node)))
        for a in model.aggregations:
            node = f"{mid}.{a.name}"
            for target in {t for p in a.params if p.sql for t in _formula_targets(p.sql, catalog, mid)}:
                _add(g.edges, target, Dependent("aggregation", node, node, locate=("entity", node)))
        for i, j in enumerate(model.joins):
            node = join_node(mid, i)
            target_model = f"{ds}.{j.target_model}"
            name = f"{mid} → {j.target_model}" + (f" ({j.name})" if j.name else "")
            dep = Dependent("join", name, node, locate=("join", mid, str(i)))
            targets = {mid, target_model}
            for pair in j.join_pairs:
                if len(pair) == 2:
                    targets.add(f"{mid}.{pair[0]}")
                    targets.add(f"{target_model}.{pair[1]}")
            for target in targets:
                if target in catalog:
                    _add(g.edges, target, dep)
            g.joins_between.setdefault(_unordered(mid, target_model), []).append(node)
        filters = list(model.filters) + (
            [model.default_time_dimension] if model.default_time_dimension else []
        )
        for target in {t for f in filters for t in _formula_targets(f, catalog, mid)}:
            _add(g.edges, target, Dependent("model", f"{mid} (filters)", None, locate=("entity", mid)))
    for mid in catalog.memory_order:
        mem = catalog.memory(mid)
        if mem is None:
            continue
        name = memory_ref(mid)
        doc, real = _memory_document(catalog, mid)
        seen: set[tuple[str, str | None]] = set()
        for tag in mem.entities:
            if not is_memory_ref(tag) and tag in catalog:
                span = _tag_span(doc, tag) if real else None
                _add(g.edges, tag, Dependent("memory", name, None, locate=("memory", mid), span=span))
                seen.add((tag, None))
        if doc is not None and mem.query is not None:
            _add_document_uses(
                g.edges, g, doc, catalog, name, "memory", None, locate=("memory", mid), real=real
            )
    return g


def _tag_span(doc: dm.ParsedDocument | None, tag: str) -> dm.Span | None:
    if doc is None:
        return None
    return next((r.span for r in doc.refs if r.role == dm.ENTITY_TAG and r.text == tag), None)


def _add_document_uses(
    edges: dict[str, list[Dependent]],
    store: _StoreGraph,
    doc: dm.ParsedDocument,
    catalog: Catalog,
    name: str,
    kind: str,
    path: str | None,
    *,
    locate: tuple[str, ...] = (),
    real: bool = True,
) -> None:
    """File every reference of a query or memory document under what it binds to, and under the
    joins it walks (a reference to a column of another model than the stage's source)."""
    sources = {st.index: st.source_model for st in doc.stages}
    for b in bind_all(doc, catalog):
        if b.canonical is None or b.ref.role == dm.DEFINITION:
            continue
        if b.ref.role == dm.ENTITY_TAG and locate:
            continue  # a store memory's tags are filed from the catalog
        span = b.ref.span if real else None
        dep = Dependent(kind, name, None, path=path, span=span, locate=locate)
        _add(edges, b.canonical, dep)
        if b.ref.stage is None or is_memory_ref(b.canonical):
            continue
        owner = _model_of(b.canonical, catalog)
        source = _stage_model(doc, b.ref.stage, catalog, sources)
        if owner and source and owner != source:
            for jn in store.joins_between.get(_unordered(owner, source), ()):
                _add(edges, jn, dep)


def _model_of(canonical: str, catalog: Catalog) -> str | None:
    kind = catalog.kind_of(canonical)
    if kind == "model":
        return canonical
    if kind in ("column", "measure", "aggregation"):
        return parent_of(canonical)
    return None


def _stage_model(doc: dm.ParsedDocument, stage: int, catalog: Catalog, sources: dict) -> str | None:
    for b in bind_all(doc, catalog):
        if b.ref.role == dm.SOURCE_MODEL and b.ref.stage == stage:
            return b.canonical
    return None


_LOCK = threading.Lock()
_STORE: dict[int, _StoreGraph] = {}


def store_graph(catalog: Catalog) -> _StoreGraph:
    """The store's graph of one snapshot, built once (the newest two snapshots are kept)."""
    with _LOCK:
        hit = _STORE.get(id(catalog))
        if hit is not None and hit.catalog is catalog:
            return hit
    g = _build_store_graph(catalog)
    with _LOCK:
        if len(_STORE) >= 2:
            _STORE.pop(next(iter(_STORE)))
        _STORE[id(catalog)] = g
    return g


@dataclass
class WorkspaceGraph:
    catalog: Catalog
    docs: tuple[int, ...]
    edges: dict[str, list[Dependent]]


_WS: list[WorkspaceGraph] = []


def workspace_graph(catalog: Catalog, docs: Sequence[WorkspaceDoc]) -> WorkspaceGraph:
    """What the workspace's query and memory files name, for one snapshot and one set of parses."""
    key = tuple(id(d.doc) for d in docs)
    with _LOCK:
        for g in _WS:
            if g.catalog is catalog and g.docs == key:
                return g
    store = store_graph(catalog)
    edges: dict[str, list[Dependent]] = {}
    for wd in docs:
        if wd.doc.kind in ("query", "memory"):
            _add_document_uses(edges, store, wd.doc, catalog, wd.key, wd.doc.kind, wd.key)
    g = WorkspaceGraph(catalog, key, edges)
    with _LOCK:
        _WS[:] = [g, *_WS[:1]]
    return g


# --------------------------------------------------------------------------- the question


def check_entity(catalog: Catalog, entity: str) -> str:
    """The kind of an entity impact and rename may be asked about, or ``ImpactError``."""
    kind = catalog.kind_of(entity)
    if kind is None:
        raise ImpactError(
            f"'{entity}' is not a canonical id of the store (datasource, ds.model or ds.model.leaf)"
        )
    if kind not in IMPACT_KINDS:
        raise ImpactError(
            f"'{entity}' is a {kind}; impact is known for datasources, models, columns, "
            f"measures and aggregations"
        )
    return kind


def _parts(catalog: Catalog, entity: str) -> list[str]:
    out, queue = [], [entity]
    while queue:
        c = queue.pop()
        out.append(c)
        queue.extend(catalog.children(c))
    return out


def impact(
    catalog: Catalog, entity: str, docs: Sequence[WorkspaceDoc] = (), *, locate: bool = True
) -> Impact:
    """Everything that uses ``entity`` (or one of its parts), directly or through measures and joins
    that use it. ``locate=False`` skips finding store lines (a code lens only counts)."""
    kind = check_entity(catalog, entity)
    graphs = [store_graph(catalog).edges, workspace_graph(catalog, docs).edges if docs else {}]
    start = _parts(catalog, entity)
    via: dict[str, tuple[str, ...]] = {n: () for n in start}
    queue = deque(start)
    uses: list[Use] = []
    seen: set[tuple[str, str, str, dm.Span | None]] = set()
    inside = set(start)
    names: dict[str, str] = {}
    while queue:
        node = queue.popleft()
        for edges in graphs:
            for dep in edges.get(node, ()):
                if _owned(dep, inside):
                    continue  # a part of the entity itself (its own measures and joins) goes with it
                key = (dep.kind, dep.name, dep.path or "", dep.span)
                if key in seen:
                    continue
                seen.add(key)
                uses.append(
                    Use(
                        dep.kind,
                        dep.name,
                        names.get(node, node),
                        via[node],
                        _location(catalog, dep) if locate else None,
                    )
                )
                if dep.node is not None and dep.node not in via:
                    via[dep.node] = (*via[node], dep.name)
                    names[dep.node] = dep.name
                    queue.append(dep.node)
    uses.sort(
        key=lambda u: (
            KINDS.index(u.kind),
            len(u.via),
            u.name,
            (u.location.span.line, u.location.span.start) if u.location else (0, 0),
        )
    )
    return Impact(entity, kind, tuple(uses))


def _owned(dep: Dependent, inside: set[str]) -> bool:
    if dep.node is None:
        return False
    if dep.node in inside:
        return True
    return dep.node.startswith("join:") and dep.node[5:].rsplit("#", 1)[0] in inside


def _location(catalog: Catalog, dep: Dependent) -> LocationData | None:
    if dep.path is not None:
        return LocationData(dep.path, dep.span or dm.Span(0, 0, 0))
    if not dep.locate:
        return None
    what = dep.locate[0]
    if what == "entity":
        return entity_location(catalog, dep.locate[1])
    if what == "memory":
        loc = entity_location(catalog, memory_ref(dep.locate[1]))
        if loc is not None and dep.span is not None:
            return LocationData(loc.path, dep.span, loc.detail)
        return loc
    if what == "join":
        model, index = dep.locate[1], int(dep.locate[2])
        loc = entity_location(catalog, model)
        if loc is None or loc.detail is not None:
            return loc
        doc = FILES.parsed(loc.path, "model")
        joins = [s for s in (doc.symbols[0].children if doc and doc.symbols else ()) if s.kind == "join"]
        if index < len(joins):
            return LocationData(loc.path, joins[index].selection)
        return loc
    return None
