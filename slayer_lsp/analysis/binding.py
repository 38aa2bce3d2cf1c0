"""Bind a document's references to catalog entities, the way SLayer would resolve them.

Every feature that asks "what does this reference name?" (hover, diagnostics, definition,
references) goes through this module so they agree. Resolution is the resolver's (SLayer's rules
and messages); which tokens of a query SLayer actually resolves is ``query_refs``' walk (SLayer's
formula grammar). This module joins those with the document's own spans: a reference the walk also
yields is *checked* (diagnostics report it), any other token is still bound for hover and
navigation. Bindings of one document are cached per catalog snapshot.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from slayer_lsp.analysis import parsed_file as dm
from slayer_lsp.catalog import Catalog
from slayer_lsp.catalog.ids import is_memory_ref, name_of, parent_of, split_model_id
from slayer_lsp.query.resolver import SourceModel

if TYPE_CHECKING:
    from slayer_lsp.query.references import QueryRef, QueryShapeError

# What a reference is read relative to: a stored model's canonical id (a model file's own formulas),
# or a query stage's source model as the resolver reads it (possibly an inline model).
ModelContext = str | SourceModel


def context_id(source: ModelContext | None) -> str | None:
    """The canonical id of a model context (an inline model's is not in the catalog)."""
    return source.canonical if isinstance(source, SourceModel) else source


@dataclass(frozen=True, slots=True)
class Binding:
    ref: dm.Reference
    canonical: str | None = None
    warnings: tuple[str, ...] = ()
    error: str | None = None
    error_type: str | None = None  # the resolver's exception class name, or "NotCanonical"
    skipped: bool = False  # nothing to resolve: a name the query defines, a built-in function, ...
    note: str | None = None  # why it was skipped (for hovers), or what a non-canonical tag names
    checked: bool = True  # SLayer resolves this token too: an error here is a diagnostic

    @property
    def ambiguous(self) -> bool:
        return self.error_type in ("AmbiguousModelError", "AmbiguousJoinPathError") or (
            self.error or ""
        ).startswith("Ambiguous")


@dataclass
class StageInfo:
    """One query stage as SLayer sees it: its source model and the tokens its walk resolves."""

    stage: dm.Stage
    source: SourceModel | None = None
    source_error: str | None = None
    source_error_type: str | None = None
    shape_problems: list[QueryShapeError] = field(default_factory=list)
    tokens: Counter[tuple[str, int | None, str]] = field(
        default_factory=Counter
    )  # (field, index, text) SLayer resolves
    unmatched: list[QueryRef] = field(default_factory=list)  # the references the document scan missed


@dataclass
class DocBindings:
    bindings: list[Binding]
    stages: list[StageInfo]


def resolve(
    raw: str, catalog: Catalog, source_model: ModelContext | None = None
) -> tuple[str | None, tuple[str, ...], str | None, str | None]:
    """(canonical, warnings, error, error_type) from the resolver; never raises."""
    from slayer_lsp.query.resolver import resolve_entity

    try:
        res = resolve_entity(raw, catalog, source_model=source_model)
    except Exception as exc:  # noqa: BLE001 - EntityResolutionError and subclasses (and any slip)
        return None, (), str(exc), type(exc).__name__
    return res.canonical, tuple(res.warnings), None, None


def stage_info(stage: dm.Stage, catalog: Catalog) -> StageInfo:
    from slayer_lsp.query.references import QueryShapeError, query_references, source_model_of

    info = StageInfo(stage)
    query = stage.query
    if not isinstance(query, dict):
        return info
    if (stage.source_model is not None or stage.inline_source) and not stage.earlier_stage:
        try:
            info.source = source_model_of(query, catalog)
        except Exception as exc:  # noqa: BLE001 - EntityResolutionError, AmbiguousModelError
            info.source_error, info.source_error_type = str(exc), type(exc).__name__
    problems: list[QueryShapeError] = []
    try:
        refs = query_references(query, problems)
    except Exception as exc:  # noqa: BLE001 - a shape the walk cannot read at all
        problems.append(QueryShapeError(str(exc), "query"))
        refs = []
    info.shape_problems = problems
    for r in refs:
        if r.kind == "source":
            continue
        info.tokens[(r.field, r.index, _bare(r.text))] += 1
        info.unmatched.append(r)
    return info


def _bare(token: str) -> str:
    """``amount:sum`` -> ``amount``; ``orders.*:count`` -> ``orders``; ``*:count`` -> ``*``."""
    base = token.split(":", 1)[0] if ":" in token and not is_memory_ref(token) else token
    return base[:-2] if base.endswith(".*") else base


def stage_source(stage: dm.Stage | None, catalog: Catalog) -> tuple[SourceModel | None, str | None]:
    """The resolver's ``SourceModel`` of a stage, or (None, why not)."""
    if stage is None:
        return None, None
    info = stage_info(stage, catalog)
    return info.source, info.source_error


def _stage(doc: dm.ParsedDocument, ref: dm.Reference) -> dm.Stage | None:
    return doc.stages[ref.stage] if ref.stage is not None and ref.stage < len(doc.stages) else None


def bind_ref(
    doc: dm.ParsedDocument, ref: dm.Reference, catalog: Catalog, infos: dict[int, StageInfo] | None = None
) -> Binding:
    infos = infos if infos is not None else {}
    role = ref.role
    if role in (dm.DEFINITION, dm.JOIN_TARGET, dm.JOIN_KEY) or (role == dm.FUNCTION and ref.canonical):
        return _bind_known(ref, catalog)
    if role == dm.ENTITY_TAG:
        return _bind_tag(ref, catalog)
    if role == dm.MODEL_FORMULA:
        if doc.model_id is None or doc.model_id not in catalog:
            return Binding(ref, skipped=True, note="the model is not in the store yet")
        canonical, warnings, error, etype = resolve(ref.text, catalog, doc.model_id)
        return Binding(ref, canonical, warnings, error, etype)
    stage = _stage(doc, ref)
    info = None
    if stage is not None:
        if stage.index not in infos:
            infos[stage.index] = stage_info(stage, catalog)
        info = infos[stage.index]
    if role == dm.SOURCE_MODEL:
        if stage is not None and stage.earlier_stage:
            return Binding(ref, skipped=True, note=f"the result of the earlier stage '{ref.text}'")
        if info is None:
            return Binding(ref, skipped=True)
        if info.source_error is not None:
            return Binding(ref, None, (), info.source_error, info.source_error_type)
        canonical = info.source.canonical if info.source is not None else None
        if canonical is None or canonical not in catalog:
            return Binding(ref, skipped=True, note="an inline model")
        return Binding(ref, canonical)
    # a query field
    if stage is not None:
        if stage.inline_source:
            return Binding(ref, skipped=True, note="a field of the query's inline model", checked=False)
        if stage.earlier_stage:
            return Binding(
                ref, skipped=True, note=f"a column of the earlier stage '{stage.source_model}'", checked=False
            )
        if ref.text in stage.local_names:
            return Binding(ref, skipped=True, note="a name this query defines", checked=False)
    if info is not None and info.source_error is not None:
        return Binding(ref, skipped=True, note="the source model does not resolve", checked=False)
    source = info.source if info is not None else None
    checked = info is None or info.tokens.get((ref.field, ref.index, ref.text), 0) > 0
    if role == dm.FUNCTION:
        cand = f"{source.canonical}.{ref.text}" if source is not None else None
        if cand is not None and catalog.kind_of(cand) == "aggregation":
            return Binding(ref, cand, checked=False)
        return Binding(ref, skipped=True, note="a function", checked=False)
    canonical, warnings, error, etype = resolve(ref.text, catalog, source)
    return Binding(ref, canonical, warnings, error, etype, checked=checked)


def _bind_known(ref: dm.Reference, catalog: Catalog) -> Binding:
    c = ref.canonical
    if c is not None and c in catalog:
        return Binding(ref, c)
    if ref.role == dm.FUNCTION:
        return Binding(ref, skipped=True, note="a function")
    if ref.role == dm.DEFINITION:
        return Binding(ref, skipped=True, note="not in the store yet (unsaved)")
    if ref.role == dm.JOIN_TARGET and c is not None:
        ds, name = split_model_id(c)
        return Binding(ref, None, (), f"No model '{name}' in datasource '{ds}'.", "EntityResolutionError")
    if ref.role == dm.JOIN_KEY and c is not None:
        owner, leaf = parent_of(c), name_of(c)
        if owner is None or owner not in catalog:
            return Binding(ref, skipped=True, note="the joined model is unknown")
        return Binding(ref, None, (), f"No column '{leaf}' on model '{owner}'.", "EntityResolutionError")
    return Binding(ref, skipped=True)


def _bind_tag(ref: dm.Reference, catalog: Catalog) -> Binding:
    """Memory tags are stored canonical: a tag that is not an id of the store is stale (it still
    loads; SLayer drops it from search). The resolver says what the text would name today."""
    if ref.text in catalog.valid_canonicals:
        return Binding(ref, ref.text)
    canonical, warnings, error, etype = resolve(ref.text, catalog)
    if error is None and canonical is not None:
        return Binding(
            ref,
            None,
            warnings,
            f"'{ref.text}' is not a canonical id; it resolves to {canonical}",
            "NotCanonical",
            note=canonical,
        )
    return Binding(ref, None, warnings, error, etype)


_DOC_CACHE: dict[int, tuple[object, object, DocBindings]] = {}


def bind_document(doc: dm.ParsedDocument, catalog: Catalog) -> DocBindings:
    """Every reference of a document bound, and its stages as SLayer reads them; memoised for one
    (document, snapshot) pair."""
    key = id(doc)
    hit = _DOC_CACHE.get(key)
    if hit is not None and hit[0] is doc and hit[1] is catalog:
        return hit[2]
    infos: dict[int, StageInfo] = {}
    for st in doc.stages:
        infos[st.index] = stage_info(st, catalog)
    bindings = [bind_ref(doc, r, catalog, infos) for r in doc.refs]
    # tokens SLayer resolves that the document scan did not find as a reference of that entry
    found = Counter(
        (b.ref.stage, b.ref.field, b.ref.index, b.ref.text) for b in bindings if b.ref.stage is not None
    )
    for si, info in infos.items():
        rest = []
        for r in info.unmatched:
            key3 = (si, r.field, r.index, _bare(r.text))
            if found.get(key3, 0) > 0:
                found[key3] -= 1
            else:
                rest.append(r)
        info.unmatched = rest
    out = DocBindings(bindings, [infos[i] for i in sorted(infos)])
    if len(_DOC_CACHE) > 64:
        _DOC_CACHE.clear()
    _DOC_CACHE[key] = (doc, catalog, out)
    return out


def bind_all(doc: dm.ParsedDocument, catalog: Catalog) -> list[Binding]:
    return bind_document(doc, catalog).bindings
