"""initialize, initialized, shutdown and configuration changes."""

from __future__ import annotations

import asyncio
from typing import Any

from lsprotocol import types as t

from slayer_lsp.lsp.state import SlayerLanguageServer


def initialize(ls: SlayerLanguageServer, params: t.InitializeParams) -> None:
    problems = ls.apply_options(params.initialization_options, initial=True)
    ls.log_effective_config()
    for p in problems:
        ls.show(f"option ignored: {p}")
    if ls.engine_error:
        ls.show(ls.engine_error, t.MessageType.Error)


def initialized(ls: SlayerLanguageServer, params: t.InitializedParams) -> None:
    ls.ensure_indexing()


async def shutdown(ls: SlayerLanguageServer, params: Any) -> None:
    ls.stop_watcher()
    ls.diagnostics.cancel_all()
    ls.abort_queries()  # first, on the loop: a running cypher_filter must not hold the shutdown up
    await asyncio.to_thread(ls.close_engines)


async def did_change_configuration(ls: SlayerLanguageServer, params: t.DidChangeConfigurationParams) -> None:
    settings = params.settings
    if settings is None:  # a client in the pull model: ask for our section
        settings = await ls.pull_configuration()
    old_engine = ls.engine
    problems = ls.apply_options(settings, initial=False)
    ls.log_effective_config()
    for p in problems:
        ls.show(f"option ignored: {p}")
    if ls.engine is not old_engine:  # another store, or other embedding options
        ls.ensure_indexing()
    ls.forget_analyses()
    ls.diagnostics.republish_all()
