"""The stdio language server: the server object with every method registered.

The standard methods are registered from ``FEATURES`` (method, options, handler); the ``slayer/*``
requests and their ``workspace/executeCommand`` twins from ``lsp.custom_requests.CUSTOM_REQUESTS``;
``slayer.applyStoreRename`` (a code action's command, with no request twin) on its own. Nothing but
protocol goes to stdout (``lsp.serve`` points ``sys.stdout`` at stderr for stray prints).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lsprotocol import types as t

from slayer_lsp.lsp.custom_requests import CUSTOM_METHODS, CUSTOM_REQUESTS, CustomRequest
from slayer_lsp.lsp.edits import STORE_RENAME_COMMAND
from slayer_lsp.lsp.errors import answering
from slayer_lsp.lsp.handlers import custom, documents, language, lifecycle, refactor
from slayer_lsp.lsp.state import SlayerLanguageServer

FEATURES: tuple[tuple[str, Any, Callable[..., Any]], ...] = (
    (t.INITIALIZE, None, lifecycle.initialize),
    (t.INITIALIZED, None, lifecycle.initialized),
    (t.SHUTDOWN, None, lifecycle.shutdown),
    (t.WORKSPACE_DID_CHANGE_CONFIGURATION, None, lifecycle.did_change_configuration),
    (t.TEXT_DOCUMENT_DID_OPEN, None, documents.did_open),
    (t.TEXT_DOCUMENT_DID_CHANGE, None, documents.did_change),
    (t.TEXT_DOCUMENT_DID_SAVE, None, documents.did_save),
    (t.TEXT_DOCUMENT_DID_CLOSE, None, documents.did_close),
    (
        t.TEXT_DOCUMENT_COMPLETION,
        t.CompletionOptions(trigger_characters=language.TRIGGER_CHARACTERS),
        language.completion,
    ),
    (t.TEXT_DOCUMENT_HOVER, None, language.hover),
    (t.TEXT_DOCUMENT_DEFINITION, None, language.definition),
    (t.TEXT_DOCUMENT_REFERENCES, None, language.references),
    (t.TEXT_DOCUMENT_DOCUMENT_SYMBOL, None, language.document_symbol),
    (t.WORKSPACE_SYMBOL, None, language.workspace_symbol),
    (
        t.TEXT_DOCUMENT_CODE_ACTION,
        t.CodeActionOptions(code_action_kinds=refactor.CODE_ACTION_KINDS, resolve_provider=False),
        refactor.code_action,
    ),
    (t.TEXT_DOCUMENT_PREPARE_RENAME, None, refactor.prepare_rename),
    (t.TEXT_DOCUMENT_RENAME, None, refactor.rename),
    (t.TEXT_DOCUMENT_CODE_LENS, t.CodeLensOptions(resolve_provider=True), refactor.code_lens),
    (t.CODE_LENS_RESOLVE, None, refactor.code_lens_resolve),
    (
        t.TEXT_DOCUMENT_SIGNATURE_HELP,
        t.SignatureHelpOptions(trigger_characters=["(", ","], retrigger_characters=[",", "="]),
        language.signature_help,
    ),
    (t.TEXT_DOCUMENT_INLAY_HINT, t.InlayHintOptions(resolve_provider=False), language.inlay_hint),
)


def _request(entry: CustomRequest) -> Callable[..., Any]:
    async def request(ls: SlayerLanguageServer, params: Any) -> Any:
        return await entry.answer(ls, params)

    request.__name__ = entry.method
    return request


def _command(entry: CustomRequest) -> Callable[..., Any]:
    async def command(ls: SlayerLanguageServer, *args: Any) -> Any:
        return await entry.answer_command(ls, args)

    command.__name__ = entry.command
    return command


async def _apply_store_rename(ls: SlayerLanguageServer, *args: Any) -> Any:
    return await answering(STORE_RENAME_COMMAND, custom.apply_store_rename(ls, args))


def build() -> SlayerLanguageServer:
    ls = SlayerLanguageServer()
    for method, options, handler in FEATURES:
        ls.feature(method, options)(handler)
    for entry in CUSTOM_REQUESTS:
        ls.feature(entry.method)(_request(entry))
        ls.command(entry.command)(_command(entry))
    ls.command(STORE_RENAME_COMMAND)(_apply_store_rename)
    return ls


server = build()

__all__ = ["CUSTOM_METHODS", "server"]
