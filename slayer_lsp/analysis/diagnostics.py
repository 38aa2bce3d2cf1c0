"""Diagnostics of one document against the catalog, with "did you mean" fixes.

The codes are stable (editors filter on them, ``--check`` prints them); ``CODES`` is the table of
record. Resolution messages are the resolver's, i.e. SLayer's own wording.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from slayer_lsp.analysis import parsed_file as dm
from slayer_lsp.analysis.binding import Binding, ModelContext, StageInfo, bind_document, context_id, resolve
from slayer_lsp.catalog import Catalog
from slayer_lsp.catalog.ids import is_memory_ref, memory_id_of, memory_ref, name_of

ERROR, WARNING, INFORMATION, HINT = "error", "warning", "information", "hint"

# code -> (default severity, meaning)
CODES: dict[str, tuple[str, str]] = {
    "invalid-yaml": (ERROR, "The document is not valid YAML; features fall back to a line scan."),
    "invalid-json": (ERROR, "The document is not valid JSON; features fall back to a tolerant scan."),
    "unknown-query-field": (ERROR, "A key SlayerQuery does not have (SLayer refuses extra fields)."),
    "invalid-query": (
        ERROR,
        "A query entry SLayer would refuse before resolving names (wrong shape, a "
        "malformed column path or time dimension).",
    ),
    "unknown-entity": (ERROR, "A reference that does not resolve in the store (the resolver's message)."),
    "ambiguous-entity": (ERROR, "A reference that matches several entities; qualify it."),
    "hidden-entity": (
        WARNING,
        "A reference to a hidden model or column, which queries and search do not expose.",
    ),
    "stale-tag": (
        WARNING,
        "A memory tag that is not a canonical id of the store (renamed or deleted "
        "entity, or not canonical); SLayer drops it from search.",
    ),
    "stale-query": (WARNING, "A memory's attached query whose references no longer resolve."),
    "entity-warning": (
        INFORMATION,
        "The resolver resolved the reference but warned (e.g. a name that is both a datasource and a model).",
    ),
    "load-issue": (WARNING, "The store reader could not load this file, or loaded it with a note."),
}

SUGGESTIONS = 3


@dataclass(frozen=True, slots=True)
class Fix:
    title: str
    span: dm.Span
    new_text: str


@dataclass(frozen=True, slots=True)
class DiagnosticData:
    span: dm.Span
    severity: str  # error | warning | information | hint
    code: str  # a key of CODES
    message: str
    fixes: tuple[Fix, ...] = ()


def _diag(
    code: str, span: dm.Span, message: str, fixes: tuple[Fix, ...] = (), severity: str | None = None
) -> DiagnosticData:
    return DiagnosticData(span, severity or CODES[code][0], code, message, fixes)


def _replace_fixes(span: dm.Span, names: list[str]) -> tuple[Fix, ...]:
    return tuple(Fix(f"Change to '{n}'", span, n) for n in names)


# --------------------------------------------------------------------------- did you mean


def _close(word: str, candidates: list[str], n: int = SUGGESTIONS) -> list[str]:
    if not word or not candidates:
        return []
    return difflib.get_close_matches(word, candidates, n=n, cutoff=0.6)


def suggest(
    text: str, catalog: Catalog, source: ModelContext | None = None, *, heads: bool = False
) -> list[str]:
    """Replacements for a reference that does not resolve: the last segment is matched against the
    names it could have meant at that place (the children of the part that does resolve, or the
    source model's fields and joins, or the model and datasource names)."""
    from slayer_lsp.analysis.completion import index_for

    idx = index_for(catalog)
    if is_memory_ref(text):
        ids = list(catalog.memory_order)
        return [memory_ref(m) for m in _close(memory_id_of(text), ids)]
    parent, _, last = text.rpartition(".")
    if parent:
        target, _, _, _ = resolve(parent, catalog, source)
        if target is None:
            # the parent itself is wrong: fix the first segment that fails, keep the rest
            head, _, rest = text.partition(".")
            return [f"{h}.{rest}" for h in suggest(head, catalog, source, heads=True)]
        kind = catalog.kind_of(target)
        if kind == "datasource":
            below = [i.label for i in idx.children(target)]
        elif kind == "model":
            below = [i.label for i in idx.children(target)] + [i.label for i in idx.joins(target)]
        else:
            return []
        return [f"{parent}.{n}" for n in _close(last, below)]
    names: list[str] = []
    src = context_id(source)
    if src is not None and src in catalog:
        if not heads:  # the head of a dotted path is a hop or a model, never a field
            names += [i.label for i in idx.children(src)]
        names += [i.label for i in idx.joins(src)]
    names += [i.label for i in idx.models()] + [i.label for i in idx.datasources()]
    return _close(text, list(dict.fromkeys(names)))


def suggest_canonical(text: str, catalog: Catalog) -> list[str]:
    """Canonical ids close to a stale tag, by segment: what resolves today first, then spelling."""
    if is_memory_ref(text):
        return [memory_ref(m) for m in _close(memory_id_of(text), list(catalog.memory_order))]
    parts = text.split(".")
    from slayer_lsp.analysis.completion import index_for

    idx = index_for(catalog)
    prefix = ""
    for i, part in enumerate(parts):
        cand = f"{prefix}.{part}" if prefix else part
        if cand in catalog:
            prefix = cand
            continue
        if prefix:
            names = [name_of(c) for c in catalog.children(prefix)]
        else:
            names = [ds.label for ds in idx.datasources()]
        rest = parts[i + 1 :]
        fixed = [f"{prefix}.{n}" if prefix else n for n in _close(part, names)]
        full = [".".join([f, *rest]) for f in fixed if ".".join([f, *rest]) in catalog]
        return full or ([] if rest else fixed)
    return []


# --------------------------------------------------------------------------- the check


def diagnose(doc: dm.ParsedDocument, catalog: Catalog, *, path: str | None = None) -> list[DiagnosticData]:
    """Every diagnostic of a document: syntax first, then each reference against the snapshot."""
    out: list[DiagnosticData] = []
    for p in doc.problems:
        fixes = _replace_fixes(p.span, list(p.suggestions)) if p.code == "unknown-query-field" else ()
        msg = p.message
        if p.suggestions:
            msg += "; did you mean " + " or ".join(f"'{s}'" for s in p.suggestions) + "?"
        out.append(_diag(p.code, p.span, msg, fixes, p.severity))
    in_memory = doc.kind == "memory"
    bound = bind_document(doc, catalog)
    for b in bound.bindings:
        out.extend(_check(doc, b, catalog, in_memory and b.ref.stage is not None, bound.stages))
    if not doc.scanned:  # a text that does not parse is mid-edit: its syntax error is the diagnostic
        for info in bound.stages:
            out.extend(_check_stage(doc, info, catalog, in_memory))
    if path is not None:
        out.extend(_load_issues(doc, catalog, path))
    return out


def _item_span(doc: dm.ParsedDocument, stage: dm.Stage, fld: str, index: int | None) -> dm.Span:
    """Where a query entry is: its first reference, else the field's key, else the stage start."""
    for r in doc.refs:
        if r.stage == stage.index and r.field == fld and (index is None or r.index == index):
            return r.span
    span = stage.key_span(fld)
    if span is not None:
        return span
    if stage.region is not None:
        return dm.Span(stage.region.start_line, stage.region.start_col, stage.region.start_col)
    return dm.Span(0, 0, 0)


def _check_stage(
    doc: dm.ParsedDocument, info: StageInfo, catalog: Catalog, in_memory: bool
) -> list[DiagnosticData]:
    """What SLayer's walk finds that the document's references do not carry: shape problems, and
    tokens the scan did not locate (resolved here, reported on their entry)."""
    out = []
    stage = info.stage
    for p in info.shape_problems:
        span = _item_span(doc, stage, getattr(p, "field", ""), getattr(p, "index", None))
        out.append(_diag("stale-query" if in_memory else "invalid-query", span, str(p)))
    if stage.inline_source or stage.earlier_stage or info.source_error is not None:
        return out
    for r in info.unmatched:
        if r.text in stage.local_names:
            continue
        canonical, _, error, etype = resolve(r.text, catalog, info.source)
        if error is None:
            continue
        span = _item_span(doc, stage, r.field, r.index)
        if in_memory:
            out.append(_diag("stale-query", span, f"attached query has a stale reference: {error}"))
        else:
            code = (
                "ambiguous-entity"
                if etype in ("AmbiguousModelError", "AmbiguousJoinPathError")
                else "unknown-entity"
            )
            out.append(_diag(code, span, error))
    return out


_LINE_COL = re.compile(r"line (\d+), column (\d+)")


def _load_issues(doc: dm.ParsedDocument, catalog: Catalog, path: str) -> list[DiagnosticData]:
    out = []
    lines = doc.lines
    for issue in catalog.issues:
        if issue.source.table is not None or issue.source.path != path:
            continue
        m = _LINE_COL.search(issue.message)
        line = int(m.group(1)) - 1 if m else 0
        line = min(max(line, 0), max(len(lines) - 1, 0))
        width = len(lines[line]) if lines else 0
        sev = ERROR if issue.severity == "error" else WARNING
        out.append(_diag("load-issue", dm.Span(line, 0, width), f"store: {issue.message}", severity=sev))
    return out


def _check(
    doc: dm.ParsedDocument, b: Binding, catalog: Catalog, memory_query: bool, stages: list[StageInfo]
) -> list[DiagnosticData]:
    ref = b.ref
    if b.skipped:
        return []
    if b.canonical is None:
        if not b.checked:
            return []
        if ref.role == dm.ENTITY_TAG:
            names = [b.note] if b.note else suggest_canonical(ref.text, catalog)
            msg = f"stale tag '{ref.text}': {b.error}" if b.error else f"stale tag '{ref.text}'"
            return [_diag("stale-tag", ref.span, msg, _replace_fixes(ref.span, names))]
        source: ModelContext | None = None
        if ref.role in dm.QUERY_ROLES and ref.role != dm.SOURCE_MODEL and ref.stage is not None:
            source = next((i.source for i in stages if i.stage.index == ref.stage), None)
        elif ref.role == dm.MODEL_FORMULA:
            source = doc.model_id
        names = suggest(ref.text, catalog, source) if ref.role != dm.JOIN_KEY else []
        if ref.role in (dm.SOURCE_MODEL, dm.JOIN_TARGET):
            names = [n for n in names if "." not in n and catalog.models_by_name.get(n)]
        msg = b.error or f"'{ref.text}' does not resolve"
        if memory_query:
            return [
                _diag(
                    "stale-query",
                    ref.span,
                    f"attached query has a stale reference: {msg}",
                    _replace_fixes(ref.span, names),
                )
            ]
        code = "ambiguous-entity" if b.ambiguous else "unknown-entity"
        return [_diag(code, ref.span, msg, _replace_fixes(ref.span, names))]
    out: list[DiagnosticData] = []
    ent = catalog.get(b.canonical)
    if ent is not None and ent.hidden and ref.role in dm.QUERY_ROLES:
        out.append(
            _diag(
                "hidden-entity",
                ref.span,
                f"{ent.kind} {b.canonical} is hidden: queries and search do not expose it",
            )
        )
    if b.checked:
        for w in b.warnings:
            out.append(_diag("entity-warning", ref.span, w))
    return out
