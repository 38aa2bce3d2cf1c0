"""Plain analysis data -> lsprotocol types, and positions between the two encodings.

Analysis works in code-point columns on lines of text; the client counts in the position encoding
agreed at initialize (UTF-16 unless it offered another). Only this module converts: a column from
the client goes through ``from_client`` before analysis sees it, and every span analysis returns
goes through ``to_range`` (with the lines of the document it is in) before the client sees it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec
from lsprotocol import types as t
from pygls.uris import from_fs_path
from pygls.workspace.position_codec import PositionCodec, ServerTextPosition

from slayer_lsp import protocol_types as p
from slayer_lsp.analysis import completion as comp
from slayer_lsp.analysis import diagnostics as diag
from slayer_lsp.analysis import hover as hov
from slayer_lsp.analysis import impact as imp
from slayer_lsp.analysis import inlay as inl
from slayer_lsp.analysis import navigation as nav
from slayer_lsp.analysis import parsed_file as dm
from slayer_lsp.analysis import signature as sig
from slayer_lsp.analysis.inspect import InspectItem
from slayer_lsp.catalog.ids import is_memory_ref

if TYPE_CHECKING:
    from slayer_lsp.lsp.state import SlayerLanguageServer, Snapshot

SEVERITY = {
    "error": t.DiagnosticSeverity.Error,
    "warning": t.DiagnosticSeverity.Warning,
    "information": t.DiagnosticSeverity.Information,
    "hint": t.DiagnosticSeverity.Hint,
}
COMPLETION_KIND = {
    "datasource": t.CompletionItemKind.Module,
    "model": t.CompletionItemKind.Class,
    "column": t.CompletionItemKind.Field,
    "measure": t.CompletionItemKind.Value,
    "aggregation": t.CompletionItemKind.Function,
    "join": t.CompletionItemKind.Reference,
    "memory": t.CompletionItemKind.File,
    "field": t.CompletionItemKind.Property,
}
SYMBOL_KIND = {
    "datasource": t.SymbolKind.Namespace,
    "model": t.SymbolKind.Class,
    "column": t.SymbolKind.Field,
    "measure": t.SymbolKind.Property,
    "aggregation": t.SymbolKind.Function,
    "join": t.SymbolKind.Interface,
    "memory": t.SymbolKind.File,
}


# ---------------------------------------------------------------------- positions and places


def uri_of(key: str) -> str:
    """A file path as a URI (a URI stays as it is)."""
    return key if "://" in key else (from_fs_path(key) or key)


def from_client(snap: Snapshot, pos: t.Position) -> tuple[int, int]:
    """A client position in an open document as (line, code-point column)."""
    got = snap.codec.position_from_client_units(
        snap.lines, t.Position(line=pos.line, character=pos.character)
    )
    return got.line, got.character


def position(line: int, col: int, lines: list[str], codec: PositionCodec) -> t.Position:
    return codec.position_to_client_units(lines, ServerTextPosition(line, col))


def to_range(span: dm.Span, lines: list[str], codec: PositionCodec) -> t.Range:
    return t.Range(
        start=position(span.line, span.start, lines, codec), end=position(span.line, span.end, lines, codec)
    )


def range_in(ls: SlayerLanguageServer, key: str, span: dm.Span) -> t.Range:
    """A span of an open document (by URI) or of a file (by path), read to convert its columns."""
    return to_range(span, ls.lines_of(key), ls.workspace.position_codec)


def location(ls: SlayerLanguageServer, loc: nav.LocationData) -> t.Location:
    """A location in an open document (its URI) or in a store file."""
    return t.Location(uri=uri_of(loc.path), range=range_in(ls, loc.path, loc.span))


def wire_location(loc: t.Location) -> p.Location:
    """An LSP location in the shape custom results carry it (``protocol_types.Location``)."""

    def pos(x: t.Position) -> p.Position:
        return p.Position(line=x.line, character=x.character)

    return p.Location(uri=loc.uri, range=p.Range(start=pos(loc.range.start), end=pos(loc.range.end)))


# ---------------------------------------------------------------------- language features


def diagnostic(x: diag.DiagnosticData, snap: Snapshot) -> t.Diagnostic:
    return t.Diagnostic(
        range=to_range(x.span, snap.lines, snap.codec),
        message=x.message,
        severity=SEVERITY.get(x.severity, t.DiagnosticSeverity.Error),
        code=x.code,
        source="slayer",
    )


def quick_fixes(x: diag.DiagnosticData, lsp_diag: t.Diagnostic, snap: Snapshot) -> list[t.CodeAction]:
    """A diagnostic's fixes as quick-fix code actions, the first one preferred."""
    out = []
    for i, fix in enumerate(x.fixes):
        edit = t.TextEdit(range=to_range(fix.span, snap.lines, snap.codec), new_text=fix.new_text)
        out.append(
            t.CodeAction(
                title=fix.title,
                kind=t.CodeActionKind.QuickFix,
                diagnostics=[lsp_diag],
                is_preferred=i == 0,
                edit=t.WorkspaceEdit(changes={snap.uri: [edit]}),
            )
        )
    return out


def completion_list(res: comp.CompletionResult, snap: Snapshot) -> dict[str, Any]:
    """An LSP ``CompletionList`` as JSON-ready builtins (the wire's camelCase names, absent fields
    left out), for ``protocol.encoded``: 495 models after ``ds.`` took ~15 ms as ``lsprotocol``
    objects walked by cattrs and ``json.dumps``, most of the request."""
    rng = to_range(res.replace, snap.lines, snap.codec)
    where = {
        "start": {"line": rng.start.line, "character": rng.start.character},
        "end": {"line": rng.end.line, "character": rng.end.character},
    }
    items = []
    for i in res.items:
        item: dict[str, Any] = {"label": i.label}
        kind = COMPLETION_KIND.get(i.kind)
        if kind is not None:
            item["kind"] = int(kind)
        if i.detail is not None:
            item["detail"] = i.detail
        if i.sort_text is not None:
            item["sortText"] = i.sort_text
        item["filterText"] = i.label
        item["textEdit"] = {"range": where, "newText": i.insert_text}
        items.append(item)
    return {"isIncomplete": res.is_incomplete, "items": items}


def hover(h: hov.HoverData, snap: Snapshot, *, markdown: bool) -> t.Hover:
    kind = t.MarkupKind.Markdown if markdown else t.MarkupKind.PlainText
    rng = to_range(h.span, snap.lines, snap.codec) if h.span else None
    return t.Hover(contents=t.MarkupContent(kind=kind, value=h.markdown), range=rng)


def document_symbol(s: dm.Symbol, snap: Snapshot) -> t.DocumentSymbol:
    sel = to_range(s.selection, snap.lines, snap.codec)
    region = s.region
    full = t.Range(
        start=position(region.start_line, region.start_col, snap.lines, snap.codec),
        end=position(region.end_line, region.end_col, snap.lines, snap.codec),
    )
    if not (full.start.line <= sel.start.line <= full.end.line):
        full = sel
    return t.DocumentSymbol(
        name=s.name,
        kind=SYMBOL_KIND.get(s.kind, t.SymbolKind.Object),
        range=full,
        selection_range=sel,
        detail=s.detail,
        children=[document_symbol(c, snap) for c in s.children] or None,
    )


def flat_symbols(s: dm.Symbol, snap: Snapshot, container: str | None = None) -> list[t.SymbolInformation]:
    """A symbol and its children, flat, for clients without hierarchical document symbols."""
    out = [
        t.SymbolInformation(
            name=s.name,
            kind=SYMBOL_KIND.get(s.kind, t.SymbolKind.Object),
            location=t.Location(uri=snap.uri, range=to_range(s.selection, snap.lines, snap.codec)),
            container_name=container,
        )
    ]
    for c in s.children:
        out.extend(flat_symbols(c, snap, s.name))
    return out


def workspace_symbol(s: nav.SymbolData, loc: t.Location) -> t.SymbolInformation:
    return t.SymbolInformation(
        name=s.name,
        kind=SYMBOL_KIND.get(s.kind, t.SymbolKind.Object),
        location=loc,
        container_name=s.container,
    )


def signature_help(found: sig.SignatureData) -> t.SignatureHelp:
    info = t.SignatureInformation(
        label=found.label,
        documentation=found.documentation,
        parameters=[
            t.ParameterInformation(label=label, documentation=doc) for label, doc in found.parameters
        ],
        active_parameter=found.active_parameter,
    )
    return t.SignatureHelp(signatures=[info], active_signature=0, active_parameter=found.active_parameter)


def inlay_hint(h: inl.InlayData, snap: Snapshot) -> t.InlayHint:
    return t.InlayHint(
        position=position(h.line, h.col, snap.lines, snap.codec),
        label=f" {h.label}",
        kind=t.InlayHintKind.Type,
        tooltip=f"resolves to {h.canonical}",
        padding_left=False,
    )


def rename_placeholder(span: dm.Span, name: str, snap: Snapshot) -> t.PrepareRenamePlaceholder:
    return t.PrepareRenamePlaceholder(range=to_range(span, snap.lines, snap.codec), placeholder=name)


def overlaps(a: t.Range, b: t.Range) -> bool:
    return (a.start.line, a.start.character) <= (b.end.line, b.end.character) and (
        b.start.line,
        b.start.character,
    ) <= (a.end.line, a.end.character)


# ---------------------------------------------------------------------- custom results


def located_item(
    ls: SlayerLanguageServer, item: InspectItem, loc: nav.LocationData | None
) -> p.LocatedInspectItem:
    """An inspect item with its definition's location, when it has one."""
    where = wire_location(location(ls, loc)) if loc is not None else None
    return p.LocatedInspectItem(**msgspec.structs.asdict(item), location=where)


def impact_result(ls: SlayerLanguageServer, result: imp.Impact) -> p.ImpactResult:
    """What depends on an entity, with file paths as URIs and locations in the client's encoding."""
    uses = [
        p.ImpactUse(
            kind=u.kind,
            target=u.target,
            via=list(u.via),
            name=uri_of(u.name) if u.kind in ("query", "memory") and not is_memory_ref(u.name) else u.name,
            location=wire_location(location(ls, u.location)) if u.location is not None else None,
        )
        for u in result.uses
    ]
    return p.ImpactResult(
        entity=result.entity, kind=result.kind, summary=result.summary(), counts=result.counts(), uses=uses
    )
