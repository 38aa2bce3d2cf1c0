"""Open documents: each change (re)starts the document's diagnostics timer."""

from __future__ import annotations

from lsprotocol import types as t

from slayer_lsp.lsp.state import SlayerLanguageServer


def did_open(ls: SlayerLanguageServer, params: t.DidOpenTextDocumentParams) -> None:
    ls.diagnostics.schedule(params.text_document.uri, 0)


def did_change(ls: SlayerLanguageServer, params: t.DidChangeTextDocumentParams) -> None:
    ls.diagnostics.schedule(params.text_document.uri)


def did_save(ls: SlayerLanguageServer, params: t.DidSaveTextDocumentParams) -> None:
    ls.diagnostics.schedule(params.text_document.uri, 0)


def did_close(ls: SlayerLanguageServer, params: t.DidCloseTextDocumentParams) -> None:
    uri = params.text_document.uri
    ls.forget_document(uri)
    ls.text_document_publish_diagnostics(t.PublishDiagnosticsParams(uri=uri, diagnostics=[]))
