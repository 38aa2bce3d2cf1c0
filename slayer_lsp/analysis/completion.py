"""Completion: what may be typed at the cursor, from the catalog snapshot.

The cursor's context (which field, the reference typed so far, the call around it) comes from the
tolerant scanner in ``parsed_file``, so completion works on text that does not parse. Candidates come
from a per-snapshot index whose lists are built lazily, one parent at a time, and reused until the
catalog changes: a request on a store with 100k ids touches only the lists it needs. Hidden
entities never appear.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass

from slayer_lsp.analysis import parsed_file as dm
from slayer_lsp.analysis.binding import ModelContext, context_id, resolve, stage_source
from slayer_lsp.catalog import Catalog
from slayer_lsp.catalog.ids import (
    MEMORY_PREFIX,
    datasource_of,
    is_memory_ref,
    memory_id_of,
    memory_ref,
    name_of,
)
from slayer_lsp.query.resolver import SourceModel
from slayer_lsp.store import documents as d

MAX_ITEMS = 500  # beyond this the list is cut to matches of the typed text and marked incomplete

# sort groups: the source model's own fields first, in declared order, then the ways out of it
_GROUP = {
    "column": "1",
    "measure": "2",
    "aggregation": "3",
    "join": "4",
    "model": "5",
    "datasource": "6",
    "memory": "7",
    "field": "8",
}


@dataclass(frozen=True, slots=True)
class CompletionItemData:
    label: str
    kind: str  # datasource | model | column | measure | aggregation | join | memory | field
    detail: str | None
    sort_text: str
    insert_text: str
    canonical: str | None = None  # the entity the item names (for a resolve step or a test)


@dataclass(frozen=True, slots=True)
class CompletionResult:
    items: list[CompletionItemData]
    replace: dm.Span  # the typed segment the chosen item replaces
    is_incomplete: bool = False


@dataclass(frozen=True, slots=True)
class CompletionFilter:
    """Which entities completion may offer (empty tuples = all). Not the session's scope
    (``reach.scope.Scope``): that is applied to the catalog before completion sees it."""

    datasources: tuple[str, ...] = ()
    access_tags: tuple[str, ...] = ()


def first_line(text: str | None, limit: int = 80) -> str | None:
    if not text:
        return None
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _detail(*parts: str | None) -> str | None:
    kept = [p for p in parts if p]
    return " — ".join(kept) if kept else None


class CompletionIndex:
    """Visible children per parent, join neighbours per model, model names, memories: each built
    on first use for one catalog snapshot (thread-safe; a lost race builds a list twice)."""

    def __init__(self, catalog: Catalog, only: CompletionFilter = CompletionFilter()):
        self.catalog = catalog
        self.only = only
        self._children: dict[str, tuple[CompletionItemData, ...]] = {}
        self._joins: dict[str, tuple[CompletionItemData, ...]] | None = None
        self._reverse: dict[str, list[tuple[str, d.Join]]] | None = None
        self._lock = threading.Lock()
        self._models: tuple[CompletionItemData, ...] | None = None
        self._datasources: tuple[CompletionItemData, ...] | None = None
        self._memories: tuple[CompletionItemData, ...] | None = None

    # ----- visibility

    def visible_model(self, model: d.Model | None) -> bool:
        if model is None or model.hidden:
            return False
        if self.only.datasources and (model.data_source or "") not in self.only.datasources:
            return False
        if (
            self.only.access_tags
            and model.access_tags
            and not set(model.access_tags) & set(self.only.access_tags)
        ):
            return False
        return True

    # ----- lists

    def children(self, parent: str) -> tuple[CompletionItemData, ...]:
        hit = self._children.get(parent)
        if hit is not None:
            return hit
        cat = self.catalog
        items: list[CompletionItemData] = []
        kind = cat.kind_of(parent)
        if kind == "datasource":
            for i, mid in enumerate(cat.children(parent)):
                ent = cat.get(mid)
                if ent is None or not self.visible_model(ent.model):
                    continue
                items.append(self._model_item(ent.model, i, bare=True))  # type: ignore[arg-type]
        elif kind == "model":
            ent = cat.get(parent)
            if ent is not None and self.visible_model(ent.model):
                for i, cid in enumerate(cat.children(parent)):
                    leaf = cat.get(cid)
                    if leaf is None or leaf.hidden:
                        continue
                    items.append(self._leaf_item(leaf.kind, leaf.obj, cid, i))
        out = tuple(items)
        self._children[parent] = out
        return out

    def _leaf_item(self, kind: str, obj: object, canonical: str, i: int) -> CompletionItemData:
        name = name_of(canonical)
        if isinstance(obj, d.Column):
            detail = _detail(
                obj.type + (" · primary key" if obj.primary_key else ""),
                first_line(obj.description) or obj.label,
            )
        elif isinstance(obj, d.Measure):
            detail = _detail(f"measure = {obj.formula}", first_line(obj.description) or obj.label)
        elif isinstance(obj, d.Aggregation):
            detail = _detail(f"aggregation {obj.formula or ''}".strip(), first_line(obj.description))
        else:
            detail = None
        return CompletionItemData(name, kind, detail, f"{_GROUP[kind]}{i:06d}", name, canonical)

    def _model_item(self, model: d.Model, i: int, bare: bool, label: str | None = None) -> CompletionItemData:
        mid = f"{model.data_source}.{model.name}"
        name = label or model.name
        return CompletionItemData(
            name, "model", _detail(mid, first_line(model.description)), f"{_GROUP['model']}{i:06d}", name, mid
        )

    def joins(self, model_id: str) -> tuple[CompletionItemData, ...]:
        """The hops a dotted path may take from a model: its declared joins (by join name, else by
        target) and the models that declare a join to it (SLayer walks joins both ways)."""
        if self._joins is None:
            with self._lock:
                if self._joins is None:
                    self._joins = {}
        assert self._joins is not None
        hit = self._joins.get(model_id)
        if hit is not None:
            return hit
        cat = self.catalog
        model = cat.models.get(model_id)
        items: list[CompletionItemData] = []
        seen: set[str] = set()
        if model is not None:
            ds = model.data_source or ""
            for i, j in enumerate(model.joins):
                target = cat.models.get(f"{ds}.{j.target_model}")
                if not self.visible_model(target):
                    continue
                for token in dict.fromkeys([j.name or j.target_model, j.target_model]):
                    if token in seen:
                        continue
                    seen.add(token)
                    pairs = ", ".join(f"{here} = {j.target_model}.{there}" for here, there in j.key_pairs)
                    items.append(
                        CompletionItemData(
                            token,
                            "join",
                            _detail(f"join → {ds}.{j.target_model}", pairs),
                            f"{_GROUP['join']}{i:06d}",
                            token,
                            f"{ds}.{j.target_model}",
                        )
                    )
            for k, (declaring, j) in enumerate(self._reverse_joins().get(model_id, [])):
                other = cat.models.get(declaring)
                if not self.visible_model(other) or other is None or other.name in seen:
                    continue
                seen.add(other.name)
                pairs = ", ".join(f"{there} = {other.name}.{here}" for here, there in j.key_pairs)
                items.append(
                    CompletionItemData(
                        other.name,
                        "join",
                        _detail(f"join ← {declaring}", pairs),
                        f"{_GROUP['join']}{500 + k:06d}",
                        other.name,
                        declaring,
                    )
                )
        out = tuple(items)
        self._joins[model_id] = out
        return out

    def _reverse_joins(self) -> dict[str, list[tuple[str, d.Join]]]:
        if self._reverse is None:
            rev: dict[str, list[tuple[str, d.Join]]] = {}
            for mid, model in self.catalog.models.items():
                for j in model.joins:
                    rev.setdefault(f"{model.data_source}.{j.target_model}", []).append((mid, j))
            self._reverse = rev
        return self._reverse

    def models(self) -> tuple[CompletionItemData, ...]:
        """Bare model names (what ``source_model`` takes); a name in several datasources once."""
        if self._models is None:
            cat = self.catalog
            items = []
            for i, name in enumerate(sorted(cat.models_by_name)):
                dss = [
                    ds
                    for ds in cat.models_by_name[name]
                    if self.visible_model(cat.models.get(f"{ds}.{name}"))
                ]
                if not dss:
                    continue
                model = cat.models[f"{dss[0]}.{name}"]
                where = f"{dss[0]}.{name}" if len(dss) == 1 else "in " + ", ".join(dss)
                items.append(
                    CompletionItemData(
                        name,
                        "model",
                        _detail(where, first_line(model.description)),
                        f"{_GROUP['model']}{i:06d}",
                        name,
                        f"{dss[0]}.{name}" if len(dss) == 1 else None,
                    )
                )
            self._models = tuple(items)
        return self._models

    def datasources(self) -> tuple[CompletionItemData, ...]:
        if self._datasources is None:
            items = []
            for i, (name, ds) in enumerate(self.catalog.datasources.items()):
                if self.only.datasources and name not in self.only.datasources:
                    continue
                items.append(
                    CompletionItemData(
                        name,
                        "datasource",
                        _detail(ds.type, first_line(ds.description)),
                        f"{_GROUP['datasource']}{i:06d}",
                        name,
                        name,
                    )
                )
            self._datasources = tuple(items)
        return self._datasources

    def memories(self) -> tuple[CompletionItemData, ...]:
        if self._memories is None:
            items = []
            for i, mid in enumerate(self.catalog.memory_order):
                mem = self.catalog.memory(mid)
                if mem is None:
                    continue
                items.append(
                    CompletionItemData(
                        mid,
                        "memory",
                        first_line(mem.description or mem.learning),
                        f"{_GROUP['memory']}{i:06d}",
                        mid,
                        memory_ref(mid),
                    )
                )
            self._memories = tuple(items)
        return self._memories


_INDEX_LOCK = threading.Lock()
_INDEX: CompletionIndex | None = None


def index_for(catalog: Catalog, only: CompletionFilter = CompletionFilter()) -> CompletionIndex:
    """The index of this snapshot (one slot: a new generation or filter replaces it)."""
    global _INDEX
    idx = _INDEX
    if idx is not None and idx.catalog is catalog and idx.only == only:
        return idx
    with _INDEX_LOCK:
        idx = _INDEX
        if idx is None or idx.catalog is not catalog or idx.only != only:
            idx = CompletionIndex(catalog, only)
            _INDEX = idx
        return idx


# --------------------------------------------------------------------------- the request


def _finish(items: Iterable[CompletionItemData], typed: str, replace: dm.Span) -> CompletionResult:
    seen: set[str] = set()
    out: list[CompletionItemData] = []
    for it in items:
        if it.label not in seen:
            seen.add(it.label)
            out.append(it)
    incomplete = False
    if len(out) > MAX_ITEMS:
        low = typed.lower()
        out = [it for it in out if it.label.lower().startswith(low)] or [
            it for it in out if low in it.label.lower()
        ]
        incomplete = True
        out = out[:MAX_ITEMS]
    return CompletionResult(out, replace, incomplete)


def _split(prefix: str, ctx: dm.CursorContext, sep: str = ".") -> tuple[str, str, dm.Span]:
    """(parent path, typed segment, span of the typed segment)."""
    cut = prefix.rfind(sep)
    parent, seg = (prefix[:cut], prefix[cut + 1 :]) if cut >= 0 else ("", prefix)
    end = ctx.start.end
    return parent, seg, dm.Span(ctx.start.line, end - len(seg), end)


def complete(
    doc: dm.ParsedDocument, line: int, col: int, catalog: Catalog, only: CompletionFilter = CompletionFilter()
) -> CompletionResult | None:
    """Completion items at a position (code points), or None when the cursor is on no reference."""
    ctx = dm.context_at(doc, line, col)
    if ctx is None:
        return None
    idx = index_for(catalog, only)
    if ctx.on_key:
        present = set()
        stage = doc.stages[ctx.stage] if ctx.stage is not None and ctx.stage < len(doc.stages) else None
        if stage is not None and isinstance(stage.query, dict):
            present = set(stage.query)
        items = [
            CompletionItemData(f, "field", "SlayerQuery field", f"{_GROUP['field']}{i:06d}", f)
            for i, f in enumerate(dm.QUERY_FIELDS)
            if f not in present or f == ctx.prefix
        ]
        return _finish(items, ctx.prefix, ctx.start)
    if ctx.role is None:
        return None
    role = ctx.role
    prefix = ctx.prefix

    if role == dm.ENTITY_TAG:
        return _complete_canonical(idx, prefix, ctx, with_memory=True)
    if role == dm.SOURCE_MODEL:
        parent, seg, span = _split(prefix, ctx)
        if not parent:
            return _finish(idx.models(), seg, span)
        return _finish(idx.children(parent), seg, span)
    if role == dm.JOIN_TARGET:
        ds = datasource_of(doc.model_id or "")
        return _finish(idx.children(ds), prefix, ctx.start)
    if role == dm.JOIN_KEY:
        return _complete_join_key(doc, idx, ctx)

    # references relative to a model: the query's source model, or the model a model file declares
    source: ModelContext | None
    if role == dm.MODEL_FORMULA:
        source = doc.model_id if doc.model_id is not None and doc.model_id in catalog else None
    else:
        stage = doc.stages[ctx.stage] if ctx.stage is not None and ctx.stage < len(doc.stages) else None
        source, _ = stage_source(stage, catalog)
    if is_memory_ref(prefix):
        return None
    parent, seg, span = _split(prefix, ctx)
    if parent:
        target = _path_target(parent, catalog, source)
        if target is None:
            return CompletionResult([], span)
        kind = catalog.kind_of(target)
        if kind == "datasource":
            return _finish(idx.children(target), seg, span)
        if kind == "model":
            return _finish(_model_members(idx, target, ctx.call), seg, span)
        return CompletionResult([], span)
    offered: list[CompletionItemData] = []
    source_id = context_id(source)
    if source_id is not None and source_id in catalog:
        offered.extend(_model_members(idx, source_id, ctx.call))
        if not ctx.call:
            offered.extend(idx.datasources())
    else:
        offered.extend(idx.models())
        offered.extend(idx.datasources())
    return _finish(offered, seg, span)


def _path_target(parent: str, catalog: Catalog, source: ModelContext | None) -> str | None:
    """The model or datasource a typed path leads to: as written (a model, a canonical prefix), else
    walked from the source model (a join name such as ``product`` only means something there)."""
    target, _, _, _ = resolve(parent, catalog, source)
    if target is not None and catalog.kind_of(target) in ("model", "datasource"):
        return target
    if isinstance(source, SourceModel) and source.name:
        walked, _, _, _ = resolve(f"{source.name}.{parent}", catalog, source)
        if walked is not None and catalog.kind_of(walked) == "model":
            return walked
    return target


def _model_members(idx: CompletionIndex, model_id: str, call: str | None) -> list[CompletionItemData]:
    members = list(idx.children(model_id))
    if call:  # inside an aggregation call: what can be aggregated (columns), then the ways to other models
        members = [m for m in members if m.kind == "column"]
    return members + list(idx.joins(model_id))


def _complete_canonical(
    idx: CompletionIndex, prefix: str, ctx: dm.CursorContext, with_memory: bool
) -> CompletionResult:
    if with_memory and is_memory_ref(prefix):
        seg = memory_id_of(prefix)
        span = dm.Span(ctx.start.line, ctx.start.end - len(seg), ctx.start.end)
        return _finish(idx.memories(), seg, span)
    parent, seg, span = _split(prefix, ctx)
    if not parent:
        items = list(idx.datasources())
        if with_memory:
            items.append(
                CompletionItemData(
                    MEMORY_PREFIX,
                    "memory",
                    "a memory: memory:<id>",
                    f"{_GROUP['memory']}000000",
                    MEMORY_PREFIX,
                )
            )
        return _finish(items, seg, span)
    return _finish(idx.children(parent), seg, span)


def _complete_join_key(
    doc: dm.ParsedDocument, idx: CompletionIndex, ctx: dm.CursorContext
) -> CompletionResult:
    path = ctx.path
    model_id = doc.model_id or ""
    owner = model_id
    if len(path) >= 5 and path[4] == 1 and isinstance(doc.data, dict):
        joins = doc.data.get("joins")
        try:
            target = joins[path[1]]["target_model"]  # type: ignore[index]
        except (TypeError, KeyError, IndexError):
            target = None
        owner = f"{model_id.split('.')[0]}.{target}" if isinstance(target, str) else ""
    cols = [c for c in idx.children(owner) if c.kind == "column"]
    return _finish(cols, ctx.prefix, ctx.start)
