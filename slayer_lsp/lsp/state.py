"""The server object and what it holds for one session: options, the engine, the store watcher,
the open documents' parses (their diagnostics: ``lsp.diagnostics``).

Shape of the process: the event loop only moves messages; parsing, binding and search run in worker
threads (``asyncio.to_thread``) on a text snapshot taken on the loop. The ``Engine`` swaps its
(snapshot, indexes) pair atomically, so a request during a rebuild answers from the last complete
snapshot. A watcher thread re-reads the store when it changes and the open documents are re-checked.

The store watcher waits for ``SLAYER_LSP_WATCH_QUIET_MS`` (default 50) ms without further change
before re-reading the store, and tells the engine which paths changed. A store that cannot be read
(gone, locked, corrupt) is reported once with ``window/showMessage`` (and in ``slayer/status``)
while the last good snapshot keeps answering, and is re-read with backoff (0.5 s doubling to 10 s)
until it can be: no file event may announce that it is whole again.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TypeVar

from lsprotocol import types as t
from pygls.exceptions import JsonRpcException
from pygls.lsp.server import LanguageServer
from pygls.uris import to_fs_path
from pygls.workspace.position_codec import PositionCodec

from slayer_lsp import __version__
from slayer_lsp.analysis import completion as comp
from slayer_lsp.analysis import navigation as nav
from slayer_lsp.analysis import parsed_file as dm
from slayer_lsp.analysis import rename as ren
from slayer_lsp.analysis import workspace as wsp
from slayer_lsp.lsp import convert
from slayer_lsp.lsp.diagnostics import Diagnostics
from slayer_lsp.lsp.options import Options, parse_options
from slayer_lsp.lsp.protocol import SlayerProtocol, converter
from slayer_lsp.watch import document_paths

if TYPE_CHECKING:
    from slayer_lsp.catalog import Catalog
    from slayer_lsp.engine import Engine, State
    from slayer_lsp.reach.scope import Scope
    from slayer_lsp.watch import StoreWatcher

log = logging.getLogger(__name__)

COMPACT_AFTER_S = 2.0  # quiet time after a store change before the full-text statistics are rebuilt
STORE_RETRY_S, STORE_RETRY_MAX_S = 0.5, 10.0  # re-reads of an unreadable store: first pause, longest pause
STORE_SETTLE_S = 1.0  # one more whole re-read this long after the store became readable again
MAX_DOCUMENT_CHARS = 1_000_000  # larger open documents are not analysed (real store files are < 100 KB)
CONFIG_SECTIONS = ("slayerLsp", "slayer")  # asked for with workspace/configuration, first non-empty wins
R = TypeVar("R")


def write_lag_ms(paths: set[str]) -> float | None:
    """How long ago the newest of ``paths`` was written (its mtime): the watcher's share of the
    change-to-visible latency, for the log."""
    newest = None
    for p in paths:
        try:
            mtime = os.stat(p).st_mtime
        except OSError:
            continue
        newest = mtime if newest is None else max(newest, mtime)
    return (time.time() - newest) * 1000 if newest is not None else None


@dataclass(frozen=True)
class Snapshot:
    """An open document's state taken on the event loop, safe to analyse on a worker thread."""

    uri: str
    path: str | None
    text: str
    version: int | None
    lines: list[str]
    codec: PositionCodec


@dataclass(frozen=True)
class EditCapabilities:
    """What the client accepts in a WorkspaceEdit."""

    document_changes: bool = False
    file_renames: bool = False
    change_annotations: bool = False


class SlayerLanguageServer(LanguageServer):
    def __init__(self, storage: str | None = None) -> None:
        super().__init__(
            "slayer-lsp",
            __version__,
            text_document_sync_kind=t.TextDocumentSyncKind.Incremental,
            protocol_cls=SlayerProtocol,
            converter_factory=converter,
        )
        self.cli_storage = storage
        self.cli_scope: Scope | None = None  # fixed on the command line (serve --scope-...)
        self.options = Options()
        self.option_problems: list[str] = []
        self.engine: Engine | None = None  # built once the storage is known
        self.engine_error: str | None = None
        self.watcher: StoreWatcher | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._ready: asyncio.Event | None = None
        self._index_task: asyncio.Future[None] | None = None
        # the store part of the last rename planned in a SQLite store, written only when the client runs
        # the code action (``slayer.applyStoreRename``) that offers it: (plan id, plan)
        self.store_rename: tuple[str, ren.RenamePlan] | None = None
        self._parsed: dict[str, tuple[int | None, str, dm.ParsedDocument]] = {}
        self._too_large: set[str] = set()  # documents over MAX_DOCUMENT_CHARS already reported
        self._parse_lock = threading.Lock()
        self.diagnostics = Diagnostics(self)
        self._retired: list[
            Engine
        ] = []  # engines replaced by an option change, closed before the next indexes
        self._closed: set[int] = set()
        self.indexing = False
        self.started = time.time()
        self.store_fault: str | None = None  # why the store cannot be read, as reported to the user
        self._retry_s = 0.0  # the pause before the next re-read of an unreadable store

    # ------------------------------------------------------------------ transport

    def start_io(
        self, stdin: Any = None, stdout: Any = None, on_frame: Callable[[], None] | None = None
    ) -> None:
        """pygls' stdio server, on the bounded framing of ``slayer_lsp.lsp.transport``."""
        import sys

        from pygls.io_ import StdoutWriter

        from slayer_lsp.lsp.transport import serve_stream

        self._stop_event = threading.Event()
        self.protocol.set_writer(StdoutWriter(stdout or sys.stdout.buffer))
        code: Any = 0
        try:
            asyncio.run(serve_stream(self, stdin or sys.stdin.buffer, on_frame))
        except BrokenPipeError:
            log.error("the client closed the connection; shutting down")
        except KeyboardInterrupt:
            pass
        except SystemExit as exc:  # exit: 0 after shutdown, 1 without one (as LSP asks)
            code = exc.code
        finally:
            self.shutdown()
        if code:
            raise SystemExit(code)

    def report_server_error(self, error: Exception, source: Any) -> None:
        """A log line instead of pygls' "Error in server" popup: a failed request already carries its
        error in the response, and a notification the client got wrong is no news to the user."""
        log.error("%s: %s", getattr(source, "__name__", source), error)

    # ------------------------------------------------------------------ configuration and engine

    @property
    def storage_pinned(self) -> bool:
        """Whether the command line fixed the store: ``serve --storage``, or a scope given there (a
        scope is only as good as the store it is applied to, so it pins the default store too)."""
        return self.cli_storage is not None or self.cli_scope is not None

    @property
    def storage(self) -> str | None:
        if self.storage_pinned:
            return self.cli_storage
        return self.options.storage or self.cli_storage

    def session_scope(self) -> Scope:
        """What this session may reach: the command line's scope when it gave one (a client's options
        cannot widen it), else the client's ``scope`` options."""
        return self.cli_scope if self.cli_scope is not None else self.options.scope.to_scope()

    def apply_options(self, raw: Any, *, initial: bool) -> list[str]:
        opts, problems = parse_options(raw, None if initial else self.options)
        old_storage, old_embedding, old_scope = self.storage, self.options.embedding, self.session_scope()
        if self.storage_pinned and opts.storage is not None:
            if opts.storage != self.cli_storage:
                where = self.cli_storage or "SLayer's default lookup, with the command line's scope"
                problems = [
                    *problems,
                    f"'storage': fixed by the command line ({where}); the option is ignored",
                ]
            opts = replace(opts, storage=None)  # the effective options say what is used
        self.options = opts
        asked = opts.scope.to_scope()
        if self.cli_scope is not None and not asked.unrestricted and asked != self.cli_scope:
            problems = [
                *problems,
                f"'scope': fixed by the command line ({self.cli_scope}); the option is ignored",
            ]
        self.option_problems = problems
        if (
            initial
            or self.storage != old_storage
            or opts.embedding != old_embedding
            or self.session_scope() != old_scope
        ):
            self._make_engine()
        return problems

    def _make_engine(self) -> None:
        """A new engine for the current storage and embedding options. The one it replaces is closed
        (caches saved, embedding worker stopped) before the new one indexes."""
        from slayer_lsp.engine import Engine

        if self.watcher is not None:
            self.watcher.stop(timeout=0.5)
            self.watcher = None
        if self.engine is not None:
            self._retired.append(self.engine)
        emb = self.options.embedding
        try:
            self.engine = Engine(
                self.storage,
                dense="live" if emb.enable else "off",
                embedding_model=emb.model,
                switch_model=emb.switch_model,
                compact_after_s=COMPACT_AFTER_S,
                scope=self.session_scope(),
            )
            self.engine_error = None
        except Exception as exc:  # noqa: BLE001 - a bad storage option must not kill the server
            log.exception("cannot open the store %r", self.storage)
            self.engine, self.engine_error = None, f"cannot open the store {self.storage!r}: {exc}"
        self._index_task = None
        self.store_fault = None  # the new engine reports its own store's state
        if self._ready is not None:
            self._ready.clear()

    def live_engine(self) -> Engine:
        """The engine, for work that runs once ``ready()`` said there is one."""
        if self.engine is None:
            raise RuntimeError(f"no store ({self.engine_error})")
        return self.engine

    def abort_queries(self) -> None:
        """Kill every engine's running cypher_filter at once (non-blocking, so on the loop)."""
        for engine in (*self._retired, self.engine):
            if engine is not None:
                try:
                    engine.abort_queries()
                except Exception:  # noqa: BLE001 - best effort; close_engines follows
                    log.exception("aborting the queries of %s failed", engine.location)

    def close_engines(self) -> None:
        """Close the current engine and any retired one (shutdown/exit; blocking, so off the loop)."""
        engines, self._retired = [*self._retired, self.engine], []
        for engine in engines:
            if engine is not None and id(engine) not in self._closed:
                self._closed.add(id(engine))
                try:
                    engine.close()
                except Exception:  # noqa: BLE001 - closing is best effort
                    log.exception("closing the engine of %s failed", engine.location)

    def log_effective_config(self) -> None:
        import json

        where = str(self.engine.location) if self.engine is not None else f"unavailable ({self.engine_error})"
        log.info(
            "slayer-lsp %s: store %s; effective options: %s",
            __version__,
            where,
            json.dumps(self.options.to_dict(), sort_keys=True),
        )
        for p in self.option_problems:
            log.warning("option problem: %s", p)

    async def pull_configuration(self) -> Any:
        caps = self.client_capabilities
        if not (caps and caps.workspace and caps.workspace.configuration):
            return None
        try:
            items = await asyncio.wait_for(
                self.workspace_configuration_async(
                    t.ConfigurationParams(items=[t.ConfigurationItem(section=s) for s in CONFIG_SECTIONS])
                ),
                5,
            )
        except Exception as exc:  # noqa: BLE001 - no answer: keep the current options
            log.info("workspace/configuration failed: %s", exc)
            return None
        return next((item for item in items or [] if isinstance(item, dict) and item), None)

    def show(self, message: str, level: t.MessageType = t.MessageType.Warning) -> None:
        self.window_show_message(t.ShowMessageParams(type=level, message=f"SLayer: {message}"))

    # ------------------------------------------------------------------ indexing and watching

    def ensure_indexing(self) -> None:
        """Start the initial index once (from ``initialized``, or from the first request of a client
        that never sends it)."""
        if self.loop is None:
            self.loop = asyncio.get_running_loop()
        if self._ready is None:
            self._ready = asyncio.Event()
        if self._index_task is None and self.engine is not None:
            self._index_task = asyncio.ensure_future(self._initial_index())

    async def ready(self) -> bool:
        self.ensure_indexing()
        if self.engine is None:
            return False
        assert self._ready is not None
        await self._ready.wait()
        return True

    def _supports_progress(self) -> bool:
        caps = self.client_capabilities
        return bool(caps and caps.window and caps.window.work_done_progress)

    async def _initial_index(self) -> None:
        engine = self.live_engine()
        self.indexing = True
        retired, self._retired = self._retired, []
        for old in retired:  # its caches and embedding rows are saved before the new engine reads them
            if id(old) not in self._closed:
                self._closed.add(id(old))
                await asyncio.to_thread(old.close)
        token: str | None = None
        if self._supports_progress():
            token = f"slayer-index-{uuid.uuid4().hex[:8]}"
            try:
                await asyncio.wait_for(self.work_done_progress.create_async(token), 5)
                self.work_done_progress.begin(
                    token,
                    t.WorkDoneProgressBegin(
                        title="SLayer: indexing", message=str(engine.location), cancellable=False
                    ),
                )
            except Exception as exc:  # noqa: BLE001 - a client that refuses progress still gets served
                log.info("no work-done progress: %s", exc)
                token = None
        self._watch_before_reading()
        try:
            await asyncio.to_thread(engine.refresh)
        except Exception as exc:  # noqa: BLE001
            log.exception("initial indexing failed")
            self.show(f"indexing failed: {exc}", t.MessageType.Error)
        finally:
            self.indexing = False
        if engine is not self.engine:
            return  # the storage changed meanwhile; the new engine indexes itself
        state = self.current_state()
        cat = state.catalog if state is not None else None
        if token is not None:
            n = len(cat.entities) if cat is not None else 0
            self.work_done_progress.end(token, t.WorkDoneProgressEnd(message=f"{n} entities"))
        assert self._ready is not None
        self._ready.set()
        self.note_store_fault(cat.fatal if cat is not None else None)
        self.diagnostics.republish_all()

    def note_store_fault(self, fault: str | None) -> None:
        """Tell the user once that the store became unreadable (and once that it is readable again),
        and re-read it with backoff meanwhile: no file event may announce that it is whole again (a
        lock released without a write). Any thread."""
        before, self.store_fault = self.store_fault, fault
        message = None
        if fault is not None:
            if before is None:
                message = (
                    f"the store cannot be read ({fault}); answering from the last good snapshot until it can",
                    t.MessageType.Warning,
                )
            self._retry_s = min(self._retry_s * 2, STORE_RETRY_MAX_S) if before is not None else STORE_RETRY_S
            if self.watcher is not None:
                self.watcher.request_rescan(self._retry_s)
        elif before is not None:
            message = ("the store can be read again", t.MessageType.Info)
            if self.watcher is not None:  # a restore may still be copying files: look once more
                self.watcher.request_rescan(STORE_SETTLE_S)
        if message is not None and self.loop is not None:
            self.loop.call_soon_threadsafe(self.show, *message)

    def _watch_before_reading(self) -> None:
        from slayer_lsp.watch import watch_before_first_read

        if self.watcher is None and self.engine is not None:
            self.watcher = watch_before_first_read(self.engine, self._on_store_change)

    def stop_watcher(self) -> None:
        if self.watcher is not None:
            self.watcher.stop(timeout=1.0)
            self.watcher = None

    def _on_store_change(self, paths: set[str]) -> None:
        """Watcher thread: re-read the store (only the changed documents, when the watcher saw exactly
        which), then re-check the open documents on the loop."""
        engine = self.engine
        if engine is None:
            return
        lag_ms = write_lag_ms(paths)
        t0 = time.perf_counter()
        before = engine.current()
        delta = engine.refresh(document_paths(engine.location, paths))
        after = engine.current()
        self.note_store_fault(after.catalog.fatal if after is not None else None)
        parts = ", ".join(
            f"{k.removesuffix('_s')} {v * 1000:.0f} ms" for k, v in engine.stats.timings.items()
        )
        log.info(
            "store changed (%d path(s)): %d entities touched in %.0f ms%s (%s)",
            len(paths),
            len(delta.touched),
            (time.perf_counter() - t0) * 1000,
            f", {lag_ms:.0f} ms after the write" if lag_ms is not None else "",
            parts,
        )
        if self.loop is not None and (not delta.empty or after is not before):  # documents or load issues
            self.loop.call_soon_threadsafe(self.diagnostics.republish_all)

    def catalog(self) -> Catalog:
        return self.live_engine().catalog

    def current_state(self) -> State | None:
        """The engine's last complete (snapshot, indexes), or None before the first; never blocks
        (``Engine.state`` would index on the spot)."""
        return self.engine.current() if self.engine is not None else None

    # ------------------------------------------------------------------ documents

    def snapshot(self, uri: str) -> Snapshot | None:
        if uri not in self.workspace.text_documents:
            return None
        doc = self.workspace.get_text_document(uri)
        return Snapshot(uri, to_fs_path(uri), doc.source, doc.version, list(doc.lines), doc.position_codec)

    def open_snapshots(self) -> list[Snapshot]:
        return [s for s in (self.snapshot(u) for u in list(self.workspace.text_documents)) if s is not None]

    def kind_of(self, path: str | None) -> str:
        root = None
        if self.engine is not None and self.engine.location.backend == "yaml":
            root = self.engine.location.path
        f = self.options.files
        return dm.classify(path, f.query_patterns, f.memory_patterns, root)

    def parse(self, snap: Snapshot) -> dm.ParsedDocument:
        kind = self.kind_of(snap.path)
        if kind != "other" and len(snap.text) > MAX_DOCUMENT_CHARS:
            kind = "other"  # parsing it would take seconds and hundreds of MB for every keystroke
            if snap.uri not in self._too_large:
                self._too_large.add(snap.uri)
                message = (
                    f"{snap.uri} has {len(snap.text):,} characters; documents over "
                    f"{MAX_DOCUMENT_CHARS:,} are not analysed"
                )
                log.warning(message)
                if self.loop is not None:
                    self.loop.call_soon_threadsafe(self.show, message)
        hit = self._parsed.get(snap.uri)
        if hit is not None and hit[0] == snap.version and hit[1] == snap.text and hit[2].kind == kind:
            return hit[2]
        doc = dm.parse_document(snap.text, kind, snap.path)
        with self._parse_lock:
            self._parsed[snap.uri] = (snap.version, snap.text, doc)
        return doc

    def forget_document(self, uri: str) -> None:
        """A closed document: its timer, parse and diagnostics go."""
        self.diagnostics.forget(uri)
        self._parsed.pop(uri, None)

    def forget_analyses(self) -> None:
        """Every parse and diagnosis (options that change what a document is were applied)."""
        self._parsed.clear()
        self.diagnostics.clear()

    def lines_of(self, key: str) -> list[str]:
        """The lines of an open document (by URI) or of a file (by path or file URI), to convert columns."""
        uri = convert.uri_of(key)
        if uri in self.workspace.text_documents:
            return list(self.workspace.get_text_document(uri).lines)
        path = to_fs_path(uri) if "://" in key else key
        text = nav.FILES.read(path) if path else None
        return text.splitlines(True) if text else []

    def document_version(self, uri: str) -> int | None:
        return self.workspace.get_text_document(uri).version if uri in self.workspace.text_documents else None

    def folders(self) -> list[str]:
        """The workspace folders' paths (the root when the client sent no folders)."""
        out = []
        for f in list(self.workspace.folders.values()):
            path = to_fs_path(f.uri)
            if path and os.path.isdir(path):
                out.append(path)
        if not out and self.workspace.root_path and os.path.isdir(self.workspace.root_path):
            out.append(self.workspace.root_path)
        return out

    def workspace_docs(self, snaps: list[Snapshot]) -> list[wsp.WorkspaceDoc]:
        """Every query and memory document of the workspace (blocking: run it on a worker thread)."""
        opened = {s.uri: (s.path, self.parse(s)) for s in snaps}
        location = self.live_engine().location
        root = location.path if location.backend == "yaml" else None
        f = self.options.files
        return wsp.workspace_documents(self.folders(), opened, f.query_patterns, f.memory_patterns, root)

    def store_readers(self, snaps: list[Snapshot]) -> tuple[ren.ReadDoc, ren.ReadText]:
        """Store files as the editor holds them (an open one's text, else the file): parsed, and
        as text before anything is parsed."""
        by_path = {os.path.abspath(s.path): s for s in snaps if s.path}

        def read(path: str, kind: str) -> dm.ParsedDocument | None:
            snap = by_path.get(os.path.abspath(path))
            if snap is not None:
                return dm.parse_document(snap.text, kind, snap.path)
            return nav.FILES.parsed(path, kind)

        def text(path: str) -> str | None:
            snap = by_path.get(os.path.abspath(path))
            return snap.text if snap is not None else ren.store_file_text(path)

        return read, text

    # ------------------------------------------------------------------ request helpers

    async def run(self, fn: Callable[..., R], *args: Any, default: R) -> R:
        """Run analysis on a worker thread once the index is ready; a failure is logged and answers
        ``default`` (an editor should not pop up an internal error for a hover)."""
        if not await self.ready():
            return default
        try:
            return await asyncio.to_thread(fn, *args)
        except JsonRpcException:
            raise
        except Exception:  # noqa: BLE001
            log.exception("%s failed", getattr(fn, "__name__", fn))
            return default

    def scope(self) -> comp.CompletionFilter:
        """Completion's own filter: none, since the engine's catalog already holds only what the
        session's scope reaches (``session_scope``)."""
        return comp.CompletionFilter()

    def markdown_ok(self) -> bool:
        caps = self.client_capabilities
        fmt = (
            caps.text_document.hover.content_format
            if caps and caps.text_document and caps.text_document.hover
            else None
        )
        return not fmt or t.MarkupKind.Markdown in fmt

    def hierarchical_symbols(self) -> bool:
        caps = self.client_capabilities
        ds = caps.text_document.document_symbol if caps and caps.text_document else None
        return bool(ds and ds.hierarchical_document_symbol_support)

    def edit_capabilities(self) -> EditCapabilities:
        caps = self.client_capabilities
        we = caps.workspace.workspace_edit if caps and caps.workspace else None
        if we is None:
            return EditCapabilities()
        ops = we.resource_operations or []
        return EditCapabilities(
            bool(we.document_changes),
            t.ResourceOperationKind.Rename in ops,
            we.change_annotation_support is not None,
        )
