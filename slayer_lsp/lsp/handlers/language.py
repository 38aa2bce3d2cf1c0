"""The read-only language features: completion, hover, definition, references, symbols, signature
help and inlay hints."""

from __future__ import annotations

from typing import Any

import msgspec
from lsprotocol import types as t

from slayer_lsp.analysis import completion as comp
from slayer_lsp.analysis import hover as hov
from slayer_lsp.analysis import inlay as inl
from slayer_lsp.analysis import navigation as nav
from slayer_lsp.analysis import signature as sig
from slayer_lsp.lsp import convert
from slayer_lsp.lsp.protocol import encoded
from slayer_lsp.lsp.state import SlayerLanguageServer

TRIGGER_CHARACTERS = [".", ":", "(", '"']
WORKSPACE_SYMBOL_LIMIT = 50


async def completion(ls: SlayerLanguageServer, params: t.CompletionParams) -> msgspec.Raw | None:
    """A ``CompletionList``, encoded in the worker thread (see ``convert.completion_list``)."""
    snap = ls.snapshot(params.text_document.uri)
    if snap is None:
        return None

    def work() -> msgspec.Raw | None:
        doc = ls.parse(snap)
        if doc.kind == "other":
            return None
        line, col = convert.from_client(snap, params.position)
        res = comp.complete(doc, line, col, ls.catalog(), ls.scope())
        return encoded(convert.completion_list(res, snap)) if res is not None else None

    return await ls.run(work, default=None)


async def hover(ls: SlayerLanguageServer, params: t.HoverParams) -> t.Hover | None:
    snap = ls.snapshot(params.text_document.uri)
    if snap is None:
        return None

    def work() -> t.Hover | None:
        doc = ls.parse(snap)
        line, col = convert.from_client(snap, params.position)
        h = hov.hover(doc, line, col, ls.catalog(), ls.options.hover.max_chars)
        return convert.hover(h, snap, markdown=ls.markdown_ok()) if h is not None else None

    return await ls.run(work, default=None)


async def definition(ls: SlayerLanguageServer, params: t.DefinitionParams) -> list[t.Location] | None:
    snap = ls.snapshot(params.text_document.uri)
    if snap is None:
        return None

    def work() -> list[t.Location] | None:
        doc = ls.parse(snap)
        line, col = convert.from_client(snap, params.position)
        return [convert.location(ls, loc) for loc in nav.definition(doc, line, col, ls.catalog())] or None

    return await ls.run(work, default=None)


async def references(ls: SlayerLanguageServer, params: t.ReferenceParams) -> list[t.Location] | None:
    snap = ls.snapshot(params.text_document.uri)
    if snap is None:
        return None
    open_snaps = ls.open_snapshots()

    def work() -> list[t.Location] | None:
        doc = ls.parse(snap)
        line, col = convert.from_client(snap, params.position)
        catalog = ls.catalog()
        target = nav.target_at(doc, line, col, catalog)
        if target is None:
            return None
        docs = {s.uri: d for s in open_snaps if (d := ls.parse(s)).kind != "other"}
        found = nav.references(target, catalog, docs, include_declaration=params.context.include_declaration)
        return [convert.location(ls, loc) for loc in found] or None

    return await ls.run(work, default=None)


async def document_symbol(ls: SlayerLanguageServer, params: t.DocumentSymbolParams) -> list[Any] | None:
    snap = ls.snapshot(params.text_document.uri)
    if snap is None:
        return None
    hierarchical = ls.hierarchical_symbols()

    def work() -> list[Any] | None:
        syms = nav.document_symbols(ls.parse(snap))
        if not syms:
            return None
        if hierarchical:
            return [convert.document_symbol(s, snap) for s in syms]
        return [info for s in syms for info in convert.flat_symbols(s, snap)]

    return await ls.run(work, default=None)


async def workspace_symbol(
    ls: SlayerLanguageServer, params: t.WorkspaceSymbolParams
) -> list[t.SymbolInformation] | None:
    query = (params.query or "").strip()

    def work() -> list[t.SymbolInformation]:
        catalog = ls.catalog()
        if query:
            req: dict[str, Any] = {"question": query, "max_results": WORKSPACE_SYMBOL_LIMIT}
            if len(ls.session_scope().datasources) == 1:
                req["datasource"] = ls.session_scope().datasources[0]
            resp = ls.live_engine().search(req)
            hits = [(h.kind, h.id) for h in resp.results]
        else:  # an empty query lists the models (VS Code asks with "" first)
            idx = comp.index_for(catalog, ls.scope())
            hits = [("model", i.canonical) for i in idx.models() if i.canonical][:WORKSPACE_SYMBOL_LIMIT]
        return [
            convert.workspace_symbol(s, convert.location(ls, s.location))
            for s in nav.workspace_symbols(catalog, hits)
            if s.location is not None
        ]

    return await ls.run(work, default=None)


async def signature_help(ls: SlayerLanguageServer, params: t.SignatureHelpParams) -> t.SignatureHelp | None:
    snap = ls.snapshot(params.text_document.uri)
    if snap is None:
        return None

    def work() -> t.SignatureHelp | None:
        doc = ls.parse(snap)
        if doc.kind == "other":
            return None
        line, col = convert.from_client(snap, params.position)
        found = sig.signature_at(doc, line, col, ls.catalog())
        return convert.signature_help(found) if found is not None else None

    return await ls.run(work, default=None)


async def inlay_hint(ls: SlayerLanguageServer, params: t.InlayHintParams) -> list[t.InlayHint] | None:
    snap = ls.snapshot(params.text_document.uri)
    if snap is None:
        return None

    def work() -> list[t.InlayHint] | None:
        doc = ls.parse(snap)
        hints = inl.inlay_hints(doc, ls.catalog(), params.range.start.line, params.range.end.line)
        return [convert.inlay_hint(h, snap) for h in hints] or None

    return await ls.run(work, default=None)
