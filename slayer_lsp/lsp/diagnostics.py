"""The open documents' diagnostics: a debounce timer per document, then a check on a lane of its own
and ``textDocument/publishDiagnostics``.

Re-checking every open document after a store change must not take the worker threads requests run
on: diagnostics get one thread, one document at a time. A document edited while it was being
checked is not published (the newer edit has its own timer). The last result per document is kept
for as long as neither its parse nor the catalog changes (code actions ask for it again).
"""

from __future__ import annotations

import asyncio
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from lsprotocol import types as t

from slayer_lsp.analysis import diagnostics as diag
from slayer_lsp.analysis import parsed_file as dm
from slayer_lsp.lsp import convert

if TYPE_CHECKING:
    from slayer_lsp.lsp.state import SlayerLanguageServer, Snapshot

log = logging.getLogger(__name__)


class Diagnostics:
    def __init__(self, ls: SlayerLanguageServer) -> None:
        self.ls = ls
        self._pending: dict[str, asyncio.Future[None]] = {}
        self._found: dict[str, tuple[dm.ParsedDocument, object, list[diag.DiagnosticData]]] = {}
        self._lane = ThreadPoolExecutor(1, thread_name_prefix="slayer-diagnostics")

    def schedule(self, uri: str, delay_ms: int | None = None) -> None:
        """(Re)start the debounce timer of one document (the option's delay unless ``delay_ms``)."""
        if self.ls.loop is None:
            self.ls.loop = asyncio.get_running_loop()
        old = self._pending.pop(uri, None)
        if old is not None:
            old.cancel()
        delay = self.ls.options.diagnostics.debounce_ms if delay_ms is None else delay_ms
        self._pending[uri] = asyncio.ensure_future(self._publish_later(uri, delay))

    def republish_all(self) -> None:
        for uri in list(self.ls.workspace.text_documents):
            self.schedule(uri, 0)

    def cancel_all(self) -> None:
        for task in self._pending.values():
            task.cancel()

    def forget(self, uri: str) -> None:
        task = self._pending.pop(uri, None)
        if task is not None:
            task.cancel()
        self._found.pop(uri, None)

    def clear(self) -> None:
        self._found.clear()

    async def _publish_later(self, uri: str, delay_ms: int) -> None:
        try:
            if delay_ms:
                await asyncio.sleep(delay_ms / 1000)
            await self.publish(uri)
        except asyncio.CancelledError:
            pass
        except Exception:  # noqa: BLE001 - one bad document must not stop the others
            log.exception("diagnostics of %s failed", uri)
        finally:
            if self._pending.get(uri) is asyncio.current_task():
                self._pending.pop(uri, None)

    async def publish(self, uri: str) -> None:
        ls = self.ls
        snap = ls.snapshot(uri)
        if snap is None:
            return
        if not ls.options.diagnostics.enable:
            ls.text_document_publish_diagnostics(t.PublishDiagnosticsParams(uri=uri, diagnostics=[]))
            return
        if not await ls.ready():
            return
        found = await asyncio.get_running_loop().run_in_executor(self._lane, self.diagnose, snap)
        current = ls.snapshot(uri)
        if current is None or current.version != snap.version:
            return  # edited meanwhile: the newer edit has its own timer
        items = [convert.diagnostic(x, snap) for x in found]
        ls.text_document_publish_diagnostics(
            t.PublishDiagnosticsParams(uri=uri, diagnostics=items, version=snap.version)
        )

    def diagnose(self, snap: Snapshot) -> list[diag.DiagnosticData]:
        """The document's diagnostics in code-point columns (blocking: run it off the loop)."""
        ls = self.ls
        doc = ls.parse(snap)
        if doc.kind == "other":
            return []
        catalog = ls.catalog()
        hit = self._found.get(snap.uri)
        if hit is not None and hit[0] is doc and hit[1] is catalog:
            return hit[2]
        location = ls.live_engine().location
        store_file = doc.kind in ("model", "datasource") or (
            doc.kind == "memory"
            and location.backend == "yaml"
            and snap.path is not None
            and os.path.dirname(snap.path) == str(location.path / "memories")
        )
        found = diag.diagnose(doc, catalog, path=snap.path if store_file else None)
        self._found[snap.uri] = (doc, catalog, found)
        return found
