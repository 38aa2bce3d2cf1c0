"""The stdio language server: one short handler per LSP method over the plain-data analysis modules.

Shape of the process: the event loop only moves messages; parsing, binding and search run in worker
threads (``asyncio.to_thread``) on a text snapshot taken on the loop. The ``Engine`` swaps its
(snapshot, indexes) pair atomically, so a request during a rebuild answers from the last complete
snapshot. A watcher thread re-reads the store when it changes and the open documents are re-checked.
Nothing but protocol goes to stdout (``serve`` points ``sys.stdout`` at stderr for stray prints).

Custom requests (also ``workspace/executeCommand`` commands with a dot instead of the slash):
``slayer/search`` (SearchParams -> SearchResponse), ``slayer/inspect`` (``{"refs": [...]}``),
``slayer/status`` (``{}``), ``slayer/saveMemory`` (``{learning, entities | query, id?, description?}``
-> ``{id, entities, created, warnings}``), ``slayer/forgetMemory`` (``{id}`` -> ``{forgotten}``) and
``slayer/searchFacets`` (SearchFacetsParams -> SearchFacetsResponse: one kind ranked on several facets).
Their params are validated here; invalid ones answer -32602. A write is followed by a refresh of the
engine before the answer, so the next request sees it without waiting for the watcher.

The engine runs the dense search channel in the background (``embedding.enable``, default on). The
store watcher waits for ``SLAYER_LSP_WATCH_QUIET_MS`` (default 50) ms without further change before
re-reading the store, and tells the engine which paths changed. A store that cannot be read (gone,
locked, corrupt) is reported once with ``window/showMessage`` (and in ``slayer/status``) while the last
good snapshot keeps answering, and is re-read with backoff (0.5 s doubling to 10 s) until it can be:
no file event may announce that it is whole again.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from lsprotocol import types as t
from pygls.exceptions import JsonRpcException, JsonRpcInvalidParams
from pygls.lsp.server import LanguageServer
from pygls.protocol import LanguageServerProtocol, default_converter
from pygls.protocol.json_rpc import JsonRPCRequestMessage
from pygls.uris import from_fs_path, to_fs_path
from pygls.workspace.position_codec import PositionCodec, ServerTextPosition

from slayer_lsp import __version__
from slayer_lsp.analysis import completion as comp
from slayer_lsp.analysis import diagnostics as diag
from slayer_lsp.analysis import hover as hov
from slayer_lsp.analysis import impact as imp
from slayer_lsp.analysis import inlay as inl
from slayer_lsp.analysis import navigation as nav
from slayer_lsp.analysis import parsed_file as dm
from slayer_lsp.analysis import rename as ren
from slayer_lsp.analysis import signature as sig
from slayer_lsp.analysis import workspace as wsp
from slayer_lsp.lsp.options import Options, parse_options
from slayer_lsp.watch import document_paths, watch_quiet_ms
from slayer_lsp.writer.scoped import WriteRefused

log = logging.getLogger(__name__)

CUSTOM_METHODS = ("slayer/search", "slayer/inspect", "slayer/status", "slayer/saveMemory", "slayer/forgetMemory",
                  "slayer/searchFacets", "slayer/impact")
COMPACT_AFTER_S = 2.0  # quiet time after a store change before the full-text statistics are rebuilt
STORE_RETRY_S, STORE_RETRY_MAX_S = 0.5, 10.0  # re-reads of an unreadable store: first pause, longest pause
STORE_SETTLE_S = 1.0  # one more whole re-read this long after the store became readable again
TRIGGER_CHARACTERS = [".", ":", "(", '"']
WORKSPACE_SYMBOL_LIMIT = 50
MAX_DOCUMENT_CHARS = 1_000_000  # larger open documents are not analysed (real store files are < 100 KB)
MAX_INSPECT_REFS = 1000  # references per slayer/inspect request
CONFIG_SECTIONS = ("slayerLsp", "slayer")  # asked for with workspace/configuration, first non-empty wins
R = TypeVar("R")

_SEVERITY = {"error": t.DiagnosticSeverity.Error, "warning": t.DiagnosticSeverity.Warning,
             "information": t.DiagnosticSeverity.Information, "hint": t.DiagnosticSeverity.Hint}
_COMPLETION_KIND = {"datasource": t.CompletionItemKind.Module, "model": t.CompletionItemKind.Class,
                    "column": t.CompletionItemKind.Field, "measure": t.CompletionItemKind.Value,
                    "aggregation": t.CompletionItemKind.Function, "join": t.CompletionItemKind.Reference,
                    "memory": t.CompletionItemKind.File, "field": t.CompletionItemKind.Property}
_SYMBOL_KIND = {"datasource": t.SymbolKind.Namespace, "model": t.SymbolKind.Class, "column": t.SymbolKind.Field,
                "measure": t.SymbolKind.Property, "aggregation": t.SymbolKind.Function,
                "join": t.SymbolKind.Interface, "memory": t.SymbolKind.File}


def _write_lag_ms(paths: set[str]) -> float | None:
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


def _converter():  # type: ignore[no-untyped-def]
    """pygls' converter, except that ``slayer/*`` params stay plain dicts: the default turns untyped
    params into namedtuples, renaming keys that are not identifiers (a query's ``order`` shorthand
    ``{"stores.name": "desc"}`` would lose its key)."""
    conv = default_converter()
    base = conv.get_structure_hook(JsonRPCRequestMessage)

    def hook(obj: dict[str, Any], cls: type) -> Any:
        if isinstance(obj, dict) and str(obj.get("method", "")).startswith("slayer/"):
            return cls(**{"params": None, **obj})  # params may be omitted
        return base(obj, cls)

    conv.register_structure_hook(JsonRPCRequestMessage, hook)
    return conv


MAX_NESTING = 100  # levels of arrays and objects in one message; real LSP traffic needs about a dozen
INVALID_REQUEST = t.ErrorCodes.InvalidRequest.value
INVALID_PARAMS = t.ErrorCodes.InvalidParams.value
SERVER_NOT_INITIALIZED = t.ErrorCodes.ServerNotInitialized.value


def _valid_id(value: Any) -> bool:
    return isinstance(value, (int, str)) and not isinstance(value, bool)


def _structure_problem(exc: Exception) -> str:
    """What was wrong with a message cattrs could not structure, with the JSON path of each value."""
    from cattrs import transform_error
    from cattrs.errors import ClassValidationError

    cause = exc.__cause__
    if isinstance(cause, ClassValidationError):
        try:
            return "; ".join(transform_error(cause))[:2000]
        except Exception:  # noqa: BLE001 - the plain message is still an answer
            pass
    return str(cause or exc)[:2000]


def _too_deep(value: Any, limit: int) -> bool:
    """Whether arrays and objects nest more than ``limit`` levels (iteratively: no recursion limit)."""
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        children = item.values() if isinstance(item, dict) else item
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return False


_SURROGATE = re.compile("[\ud800-\udfff]")  # after JSON decoding, any surrogate left is a lone one


def _lone_surrogate(value: Any) -> str | None:
    """Where a lone surrogate sits in a decoded message (``params.question``), or None. JSON lets a
    client write ``"\\ud800"``; no UTF-8 text, file name or index can hold it, so it is refused
    here, once, rather than failing deep inside a handler as an internal error."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                return path or "the message"
        elif isinstance(item, dict):
            for k, v in item.items():
                if isinstance(k, str) and _SURROGATE.search(k):
                    return f"{path}.{k!a}" if path else repr(k)
                stack.append((v, f"{path}.{k}" if path else str(k)))
        elif isinstance(item, list):
            stack.extend((v, f"{path}[{i}]") for i, v in enumerate(item))
    return None


def _scrubbed(value: Any) -> Any:
    """``value`` with each lone surrogate replaced by U+FFFD (one UTF-16 unit for one: document
    positions keep their meaning), for notifications, which cannot be answered with an error."""
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {_scrubbed(k): _scrubbed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_scrubbed(v) for v in value]
    return value


class SlayerProtocol(LanguageServerProtocol):
    """pygls' protocol, with every message checked before dispatch, so that each request with a
    usable id gets exactly one answer and nothing a client sends raises out of the read loop:

    * params that do not fit the method's type: -32602 with the reason (pygls would log it and leave
      the client waiting forever); such a notification is logged and dropped (no error popup);
    * not a JSON-RPC 2.0 request (``jsonrpc`` missing or not "2.0", a method that is not a string, an
      id that is not an integer or a string, a batch array, a bare value): -32600, with id null when
      the message has no usable id;
    * nesting deeper than ``MAX_NESTING``: -32602 before any handler recurses into it;
    * a lone UTF-16 surrogate in a request's params (``"\\ud800"``): -32602; in a notification's, it
      is replaced with U+FFFD (an answer is impossible, and dropping an edit would desync the text);
    * a request before ``initialize``: -32002 (ServerNotInitialized); a second ``initialize`` or any
      request after ``shutdown``: -32600. Notifications in those states are dropped; ``exit`` always
      goes through.

    Messages are structured here from the top-level object only (the JSON decoder's object hook keeps
    nested objects plain), so params that look like a JSON-RPC message are never taken for one."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.initialize_seen = False
        self.shutdown_seen = False

    def structure_message(self, data: dict[str, Any]) -> Any:
        return data  # the decoder's object hook: see handle_message

    def handle_message(self, message: Any) -> None:
        try:
            checked = self._checked(message)
            if checked is not None:
                super().handle_message(checked)
        except Exception:  # noqa: BLE001 - one bad message must not end the read loop (exit's SystemExit does)
            log.exception("dropped a message that could not be handled")

    def reply_error(self, msg_id: Any, code: int, message: str) -> None:
        """An error response written as plain JSON (lsprotocol would drop a null id from it)."""
        self._send_data({"jsonrpc": "2.0", "id": msg_id, "error": {"code": code, "message": message}})

    def _checked(self, message: Any) -> Any:
        """The structured message to dispatch, or None when it was answered or dropped here."""
        if isinstance(message, list):
            reason = "batches are not supported by the Language Server Protocol; send each message on its own"
            ids = [m["id"] for m in message if isinstance(m, dict) and "method" in m and _valid_id(m.get("id"))]
            for msg_id in dict.fromkeys(ids) if ids else [None]:
                self.reply_error(msg_id, INVALID_REQUEST, reason)
            return None
        if not isinstance(message, dict):
            self.reply_error(None, INVALID_REQUEST, f"a message must be a JSON object, not {_json_type(message)}")
            return None
        if "method" not in message:
            return self._response(message)
        method, is_request, msg_id = message["method"], "id" in message, message.get("id")

        def refuse(code: int, reason: str) -> None:
            if is_request:
                self.reply_error(msg_id if _valid_id(msg_id) else None, code, reason)
            else:
                log.warning("dropped a notification: %s", reason)

        if is_request and not _valid_id(msg_id):
            return refuse(INVALID_REQUEST, f"a request id must be an integer or a string, not {_json_type(msg_id)}")
        if message.get("jsonrpc") != "2.0":
            return refuse(INVALID_REQUEST, 'not a JSON-RPC 2.0 message ("jsonrpc" must be "2.0")')
        if not isinstance(method, str):
            return refuse(INVALID_REQUEST, f"the method must be a string, not {_json_type(method)}")
        method = method[:200]  # echoed in errors: a megabyte of method name is not echoed back
        if _too_deep(message, MAX_NESTING):
            return refuse(INVALID_PARAMS, f"{method}: params nest deeper than {MAX_NESTING} levels")
        where = _lone_surrogate(message.get("params"))
        if where is not None:
            if is_request:
                return refuse(INVALID_PARAMS, f"{method}: {where} holds a lone surrogate (half of a UTF-16 pair: "
                                              f"not Unicode text); send a character outside the BMP as a pair")
            log.warning("%s: %s holds a lone surrogate; replaced with U+FFFD", method, where)
            message = {**message, "params": _scrubbed(message["params"])}
        if method != t.EXIT:
            if self.shutdown_seen:
                return refuse(INVALID_REQUEST, f"{method}: the server is shutting down; only exit is accepted")
            if method == t.INITIALIZE and self.initialize_seen:
                return refuse(INVALID_REQUEST, "initialize may be sent only once")
            if method != t.INITIALIZE and not self.initialize_seen:
                return refuse(SERVER_NOT_INITIALIZED, f"{method}: the server is not initialized; send initialize first")
        structured = self._structure(message)
        if structured is not None and is_request and not hasattr(structured, "id"):
            # pygls would structure it as the notification it is and never answer the id
            return refuse(INVALID_REQUEST, f"{method} is a notification; send it without an id")
        if structured is not None and is_request:
            if method == t.INITIALIZE:
                self.initialize_seen = True
            elif method == t.SHUTDOWN:
                self.shutdown_seen = True
        return structured

    def _response(self, message: dict[str, Any]) -> Any:
        """A client's answer to a request of ours (configuration, progress); anything else that has
        no method is dropped with a log line."""
        if message.get("jsonrpc") != "2.0" or not _valid_id(message.get("id")) or not (
                "result" in message or "error" in message):
            log.warning("dropped a message that is no request, notification or response: %.200r", message)
            return None
        if _lone_surrogate(message.get("result")) is not None:
            message = {**message, "result": _scrubbed(message["result"])}
        return self._structure(message)

    def _structure(self, data: dict[str, Any]) -> Any:
        try:
            return super().structure_message(data)
        except JsonRpcException as exc:
            method = data.get("method")
            reason = f"{str(method)[:200]}: invalid params ({_structure_problem(exc)})"
            if "id" in data and method is not None:
                self.reply_error(data["id"], INVALID_PARAMS, reason)
            else:
                log.warning("dropped a message: %s", reason)
            return None


@dataclass(frozen=True)
class Snapshot:
    """An open document's state taken on the event loop, safe to analyse on a worker thread."""

    uri: str
    path: str | None
    text: str
    version: int | None
    lines: list[str]
    codec: PositionCodec


class SlayerLanguageServer(LanguageServer):
    def __init__(self, storage: str | None = None) -> None:
        super().__init__("slayer-lsp", __version__, text_document_sync_kind=t.TextDocumentSyncKind.Incremental,
                         protocol_cls=SlayerProtocol, converter_factory=_converter)
        self.cli_storage = storage
        self.cli_scope: Any = None  # a catalog.scope.Scope fixed on the command line (serve --scope-...)
        self.options = Options()
        self.option_problems: list[str] = []
        self.engine: Any = None  # slayer_lsp.engine.Engine, built once the storage is known
        self.engine_error: str | None = None
        self.watcher: Any = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._ready: asyncio.Event | None = None
        self._index_task: asyncio.Task[None] | None = None
        self._pending: dict[str, asyncio.Task[None]] = {}
        # the store part of the last rename planned in a SQLite store, written only when the client runs
        # the code action (``slayer.applyStoreRename``) that offers it: (plan id, plan)
        self.store_rename: tuple[str, ren.RenamePlan] | None = None
        self._parsed: dict[str, tuple[int | None, str, dm.ParsedDocument]] = {}
        self._diagnosed: dict[str, tuple[dm.ParsedDocument, object, list[diag.DiagnosticData]]] = {}
        self._too_large: set[str] = set()  # documents over MAX_DOCUMENT_CHARS already reported
        self._parse_lock = threading.Lock()
        # Re-checking every open document after a store change must not take the worker threads
        # requests run on: diagnostics get a lane of their own, one document at a time.
        self._diagnostics_lane = ThreadPoolExecutor(1, thread_name_prefix="slayer-diagnostics")
        self._retired: list[Any] = []  # engines replaced by an option change, closed before the next indexes
        self._closed: set[int] = set()
        self.indexing = False
        self.started = time.time()
        self.store_fault: str | None = None  # why the store cannot be read, as reported to the user
        self._retry_s = 0.0  # the pause before the next re-read of an unreadable store

    # ------------------------------------------------------------------ transport

    def start_io(self, stdin: Any = None, stdout: Any = None) -> None:
        """pygls' stdio server, on the bounded framing of ``slayer_lsp.lsp.transport``."""
        import sys

        from pygls.io_ import StdoutWriter

        from slayer_lsp.lsp.transport import serve_stream

        self._stop_event = threading.Event()
        self.protocol.set_writer(StdoutWriter(stdout or sys.stdout.buffer))
        code: Any = 0
        try:
            asyncio.run(serve_stream(self, stdin or sys.stdin.buffer))
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

    def session_scope(self):  # -> catalog.scope.Scope
        """What this session may reach: the command line's scope when it gave one (a client's options
        cannot widen it), else the client's ``scope`` options."""
        return self.cli_scope if self.cli_scope is not None else self.options.scope.to_scope()

    def apply_options(self, raw: Any, *, initial: bool) -> list[str]:
        opts, problems = parse_options(raw, None if initial else self.options)
        old_storage, old_embedding, old_scope = self.storage, self.options.embedding, self.session_scope()
        if self.storage_pinned and opts.storage is not None:
            if opts.storage != self.cli_storage:
                where = self.cli_storage or "SLayer's default lookup, with the command line's scope"
                problems = [*problems, f"'storage': fixed by the command line ({where}); the option is ignored"]
            opts = replace(opts, storage=None)  # the effective options say what is used
        self.options = opts
        asked = opts.scope.to_scope()
        if self.cli_scope is not None and not asked.unrestricted and asked != self.cli_scope:
            problems = [*problems, f"'scope': fixed by the command line ({self.cli_scope}); the option is ignored"]
        self.option_problems = problems
        if initial or self.storage != old_storage or opts.embedding != old_embedding \
                or self.session_scope() != old_scope:
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
            self.engine = Engine(self.storage, dense="live" if emb.enable else "off", embedding_model=emb.model,
                                 switch_model=emb.switch_model, compact_after_s=COMPACT_AFTER_S,
                                 scope=self.session_scope())
            self.engine_error = None
        except Exception as exc:  # noqa: BLE001 - a bad storage option must not kill the server
            log.exception("cannot open the store %r", self.storage)
            self.engine, self.engine_error = None, f"cannot open the store {self.storage!r}: {exc}"
        self._index_task = None
        self.store_fault = None  # the new engine reports its own store's state
        if self._ready is not None:
            self._ready.clear()

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
        log.info("slayer-lsp %s: store %s; effective options: %s", __version__, where,
                 json.dumps(self.options.to_dict(), sort_keys=True))
        for p in self.option_problems:
            log.warning("option problem: %s", p)

    async def pull_configuration(self) -> Any:
        caps = self.client_capabilities
        if not (caps and caps.workspace and caps.workspace.configuration):
            return None
        try:
            items = await asyncio.wait_for(self.workspace_configuration_async(t.ConfigurationParams(
                items=[t.ConfigurationItem(section=s) for s in CONFIG_SECTIONS])), 5)
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
        engine = self.engine
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
                self.work_done_progress.begin(token, t.WorkDoneProgressBegin(
                    title="SLayer: indexing", message=str(engine.location), cancellable=False))
            except Exception as exc:  # noqa: BLE001 - a client that refuses progress still gets served
                log.info("no work-done progress: %s", exc)
                token = None
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
        self._start_watcher()
        self.note_store_fault(cat.fatal if cat is not None else None)
        self.republish_all()

    def note_store_fault(self, fault: str | None) -> None:
        """Tell the user once that the store became unreadable (and once that it is readable again),
        and re-read it with backoff meanwhile: no file event may announce that it is whole again (a
        lock released without a write). Any thread."""
        before, self.store_fault = self.store_fault, fault
        message = None
        if fault is not None:
            if before is None:
                message = (f"the store cannot be read ({fault}); answering from the last good snapshot "
                           "until it can", t.MessageType.Warning)
            self._retry_s = min(self._retry_s * 2, STORE_RETRY_MAX_S) if before is not None else STORE_RETRY_S
            if self.watcher is not None:
                self.watcher.request_rescan(self._retry_s)
        elif before is not None:
            message = ("the store can be read again", t.MessageType.Info)
            if self.watcher is not None:  # a restore may still be copying files: look once more
                self.watcher.request_rescan(STORE_SETTLE_S)
        if message is not None and self.loop is not None:
            self.loop.call_soon_threadsafe(self.show, *message)

    def _start_watcher(self) -> None:
        from slayer_lsp.watch import StoreWatcher

        if self.watcher is not None or self.engine is None:
            return
        self.watcher = StoreWatcher(self.engine.location, self._on_store_change, quiet_ms=watch_quiet_ms())
        self.watcher.start()

    def _on_store_change(self, paths: set[str]) -> None:
        """Watcher thread: re-read the store (only the changed documents, when the watcher saw exactly
        which), then re-check the open documents on the loop."""
        engine = self.engine
        if engine is None:
            return
        lag_ms = _write_lag_ms(paths)
        t0 = time.perf_counter()
        before = engine.current()
        delta = engine.refresh(document_paths(engine.location, paths))
        after = engine.current()
        self.note_store_fault(after.catalog.fatal if after is not None else None)
        parts = ", ".join(f"{k.removesuffix('_s')} {v * 1000:.0f} ms" for k, v in engine.stats.timings.items())
        log.info("store changed (%d path(s)): %d entities touched in %.0f ms%s (%s)", len(paths), len(delta.touched),
                 (time.perf_counter() - t0) * 1000, f", {lag_ms:.0f} ms after the write" if lag_ms is not None else "",
                 parts)
        if self.loop is not None and (not delta.empty or after is not before):  # documents or load issues
            self.loop.call_soon_threadsafe(self.republish_all)

    def catalog(self):  # type: ignore[no-untyped-def]
        return self.engine.catalog

    def current_state(self):  # type: ignore[no-untyped-def]
        """The engine's last complete (snapshot, indexes), or None before the first; never blocks
        (``Engine.state`` would index on the spot). Engine has no public accessor for this yet."""
        return self.engine.current() if self.engine is not None else None

    # ------------------------------------------------------------------ documents

    def snapshot(self, uri: str) -> Snapshot | None:
        if uri not in self.workspace.text_documents:
            return None
        doc = self.workspace.get_text_document(uri)
        return Snapshot(uri, to_fs_path(uri), doc.source, doc.version, list(doc.lines), doc.position_codec)

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
                message = (f"{snap.uri} has {len(snap.text):,} characters; documents over "
                           f"{MAX_DOCUMENT_CHARS:,} are not analysed")
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

    def open_parsed(self) -> dict[str, dm.ParsedDocument]:
        """Parses of every open SLayer document (for references)."""
        out = {}
        for uri in list(self.workspace.text_documents):
            snap = self.snapshot(uri)
            if snap is not None:
                doc = self.parse(snap)
                if doc.kind != "other":
                    out[uri] = doc
        return out

    # ------------------------------------------------------------------ positions

    @staticmethod
    def position(snap: Snapshot, pos: t.Position) -> tuple[int, int]:
        p = snap.codec.position_from_client_units(snap.lines, t.Position(line=pos.line, character=pos.character))
        return p.line, p.character

    @staticmethod
    def to_range(span: dm.Span, lines: list[str], codec: PositionCodec) -> t.Range:
        start = codec.position_to_client_units(lines, ServerTextPosition(span.line, span.start))
        end = codec.position_to_client_units(lines, ServerTextPosition(span.line, span.end))
        return t.Range(start=start, end=end)

    def location(self, loc: nav.LocationData) -> t.Location:
        """A location in an open document (its URI) or in a store file (read to convert columns)."""
        if "://" in loc.path:
            uri = loc.path
        else:
            uri = from_fs_path(loc.path) or loc.path
        if uri in self.workspace.text_documents:
            lines = list(self.workspace.get_text_document(uri).lines)
        else:
            text = nav.FILES.read(loc.path) if "://" not in loc.path else None
            lines = text.splitlines(True) if text else []
        return t.Location(uri=uri, range=self.to_range(loc.span, lines, self.workspace.position_codec))

    def lines_of(self, key: str) -> list[str]:
        """The lines of an open document (by URI) or of a file (by path or file URI), to convert columns."""
        uri = key if "://" in key else (from_fs_path(key) or key)
        if uri in self.workspace.text_documents:
            return list(self.workspace.get_text_document(uri).lines)
        path = to_fs_path(uri) if "://" in key else key
        text = nav.FILES.read(path) if path else None
        return text.splitlines(True) if text else []

    def uri_of(self, key: str) -> str:
        return key if "://" in key else (from_fs_path(key) or key)

    def lsp_range(self, key: str, span: dm.Span) -> t.Range:
        return self.to_range(span, self.lines_of(key), self.workspace.position_codec)

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

    def open_snapshots(self) -> list[Snapshot]:
        return [s for s in (self.snapshot(u) for u in list(self.workspace.text_documents)) if s is not None]

    def workspace_docs(self, snaps: list[Snapshot]) -> list[wsp.WorkspaceDoc]:
        """Every query and memory document of the workspace (blocking: run it on a worker thread)."""
        opened = {s.uri: (s.path, self.parse(s)) for s in snaps}
        root = self.engine.location.path if self.engine.location.backend == "yaml" else None
        f = self.options.files
        return wsp.workspace_documents(self.folders(), opened, f.query_patterns, f.memory_patterns, root)

    def store_readers(self, snaps: list[Snapshot]):  # -> (rename.ReadDoc, rename.ReadText)
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

    # ------------------------------------------------------------------ diagnostics

    def schedule(self, uri: str, delay_ms: int | None = None) -> None:
        """(Re)start the debounce timer of one document."""
        if self.loop is None:
            self.loop = asyncio.get_running_loop()
        old = self._pending.pop(uri, None)
        if old is not None:
            old.cancel()
        delay = self.options.diagnostics.debounce_ms if delay_ms is None else delay_ms
        self._pending[uri] = asyncio.ensure_future(self._publish_later(uri, delay))

    def republish_all(self) -> None:
        for uri in list(self.workspace.text_documents):
            self.schedule(uri, 0)

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
        snap = self.snapshot(uri)
        if snap is None:
            return
        if not self.options.diagnostics.enable:
            self.text_document_publish_diagnostics(t.PublishDiagnosticsParams(uri=uri, diagnostics=[]))
            return
        if not await self.ready():
            return
        found = await asyncio.get_running_loop().run_in_executor(self._diagnostics_lane, self.diagnose, snap)
        current = self.snapshot(uri)
        if current is None or current.version != snap.version:
            return  # edited meanwhile: the newer edit has its own timer
        items = [self.to_lsp_diagnostic(x, snap) for x in found]
        self.text_document_publish_diagnostics(t.PublishDiagnosticsParams(uri=uri, diagnostics=items,
                                                                          version=snap.version))

    def diagnose(self, snap: Snapshot) -> list[diag.DiagnosticData]:
        doc = self.parse(snap)
        if doc.kind == "other":
            return []
        catalog = self.catalog()
        hit = self._diagnosed.get(snap.uri)
        if hit is not None and hit[0] is doc and hit[1] is catalog:
            return hit[2]
        store_file = doc.kind in ("model", "datasource") or (
            doc.kind == "memory" and self.engine.location.backend == "yaml" and snap.path is not None
            and os.path.dirname(snap.path) == str(self.engine.location.path / "memories"))
        found = diag.diagnose(doc, catalog, path=snap.path if store_file else None)
        self._diagnosed[snap.uri] = (doc, catalog, found)
        return found

    def to_lsp_diagnostic(self, x: diag.DiagnosticData, snap: Snapshot) -> t.Diagnostic:
        return t.Diagnostic(range=self.to_range(x.span, snap.lines, snap.codec), message=x.message,
                            severity=_SEVERITY.get(x.severity, t.DiagnosticSeverity.Error), code=x.code,
                            source="slayer")

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
        fmt = caps.text_document.hover.content_format if caps and caps.text_document and \
            caps.text_document.hover else None
        return not fmt or t.MarkupKind.Markdown in fmt

    def hierarchical_symbols(self) -> bool:
        caps = self.client_capabilities
        ds = caps.text_document.document_symbol if caps and caps.text_document else None
        return bool(ds and ds.hierarchical_document_symbol_support)


server = SlayerLanguageServer()


# ====================================================================== lifecycle

@server.feature(t.INITIALIZE)
def initialize(ls: SlayerLanguageServer, params: t.InitializeParams) -> None:
    problems = ls.apply_options(params.initialization_options, initial=True)
    ls.log_effective_config()
    for p in problems:
        ls.show(f"option ignored: {p}")
    if ls.engine_error:
        ls.show(ls.engine_error, t.MessageType.Error)


@server.feature(t.INITIALIZED)
def initialized(ls: SlayerLanguageServer, params: t.InitializedParams) -> None:
    ls.ensure_indexing()


@server.feature(t.SHUTDOWN)
async def shutdown(ls: SlayerLanguageServer, params: Any) -> None:
    if ls.watcher is not None:
        ls.watcher.stop(timeout=1.0)
        ls.watcher = None
    for task in ls._pending.values():
        task.cancel()
    ls.abort_queries()  # first, on the loop: a running cypher_filter must not hold the shutdown up
    await asyncio.to_thread(ls.close_engines)


@server.feature(t.WORKSPACE_DID_CHANGE_CONFIGURATION)
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
    ls._parsed.clear()
    ls._diagnosed.clear()
    ls.republish_all()


# ====================================================================== documents

@server.feature(t.TEXT_DOCUMENT_DID_OPEN)
def did_open(ls: SlayerLanguageServer, params: t.DidOpenTextDocumentParams) -> None:
    ls.schedule(params.text_document.uri, 0)


@server.feature(t.TEXT_DOCUMENT_DID_CHANGE)
def did_change(ls: SlayerLanguageServer, params: t.DidChangeTextDocumentParams) -> None:
    ls.schedule(params.text_document.uri)


@server.feature(t.TEXT_DOCUMENT_DID_SAVE)
def did_save(ls: SlayerLanguageServer, params: t.DidSaveTextDocumentParams) -> None:
    ls.schedule(params.text_document.uri, 0)


@server.feature(t.TEXT_DOCUMENT_DID_CLOSE)
def did_close(ls: SlayerLanguageServer, params: t.DidCloseTextDocumentParams) -> None:
    uri = params.text_document.uri
    task = ls._pending.pop(uri, None)
    if task is not None:
        task.cancel()
    ls._parsed.pop(uri, None)
    ls._diagnosed.pop(uri, None)
    ls.text_document_publish_diagnostics(t.PublishDiagnosticsParams(uri=uri, diagnostics=[]))


# ====================================================================== language features

@server.feature(t.TEXT_DOCUMENT_COMPLETION, t.CompletionOptions(trigger_characters=TRIGGER_CHARACTERS))
async def completion(ls: SlayerLanguageServer, params: t.CompletionParams) -> t.CompletionList | None:
    snap = ls.snapshot(params.text_document.uri)
    if snap is None:
        return None

    def work() -> t.CompletionList | None:
        doc = ls.parse(snap)
        if doc.kind == "other":
            return None
        line, col = ls.position(snap, params.position)
        res = comp.complete(doc, line, col, ls.catalog(), ls.scope())
        if res is None:
            return None
        rng = ls.to_range(res.replace, snap.lines, snap.codec)
        items = [t.CompletionItem(label=i.label, kind=_COMPLETION_KIND.get(i.kind), detail=i.detail,
                                  sort_text=i.sort_text, filter_text=i.label,
                                  text_edit=t.TextEdit(range=rng, new_text=i.insert_text))
                 for i in res.items]
        return t.CompletionList(is_incomplete=res.is_incomplete, items=items)

    return await ls.run(work, default=None)


@server.feature(t.TEXT_DOCUMENT_HOVER)
async def hover(ls: SlayerLanguageServer, params: t.HoverParams) -> t.Hover | None:
    snap = ls.snapshot(params.text_document.uri)
    if snap is None:
        return None

    def work() -> t.Hover | None:
        doc = ls.parse(snap)
        line, col = ls.position(snap, params.position)
        h = hov.hover(doc, line, col, ls.catalog(), ls.options.hover.max_chars)
        if h is None:
            return None
        kind = t.MarkupKind.Markdown if ls.markdown_ok() else t.MarkupKind.PlainText
        rng = ls.to_range(h.span, snap.lines, snap.codec) if h.span else None
        return t.Hover(contents=t.MarkupContent(kind=kind, value=h.markdown), range=rng)

    return await ls.run(work, default=None)


@server.feature(t.TEXT_DOCUMENT_DEFINITION)
async def definition(ls: SlayerLanguageServer, params: t.DefinitionParams) -> list[t.Location] | None:
    snap = ls.snapshot(params.text_document.uri)
    if snap is None:
        return None

    def work() -> list[t.Location] | None:
        doc = ls.parse(snap)
        line, col = ls.position(snap, params.position)
        return [ls.location(loc) for loc in nav.definition(doc, line, col, ls.catalog())] or None

    return await ls.run(work, default=None)


@server.feature(t.TEXT_DOCUMENT_REFERENCES)
async def references(ls: SlayerLanguageServer, params: t.ReferenceParams) -> list[t.Location] | None:
    snap = ls.snapshot(params.text_document.uri)
    if snap is None:
        return None
    open_docs_snaps = [s for s in (ls.snapshot(u) for u in list(ls.workspace.text_documents)) if s is not None]

    def work() -> list[t.Location] | None:
        doc = ls.parse(snap)
        line, col = ls.position(snap, params.position)
        catalog = ls.catalog()
        target = nav.target_at(doc, line, col, catalog)
        if target is None:
            return None
        docs = {s.uri: d for s in open_docs_snaps if (d := ls.parse(s)).kind != "other"}
        found = nav.references(target, catalog, docs, include_declaration=params.context.include_declaration)
        return [ls.location(loc) for loc in found] or None

    return await ls.run(work, default=None)


@server.feature(t.TEXT_DOCUMENT_DOCUMENT_SYMBOL)
async def document_symbol(ls: SlayerLanguageServer, params: t.DocumentSymbolParams) -> list[Any] | None:
    snap = ls.snapshot(params.text_document.uri)
    if snap is None:
        return None
    hierarchical = ls.hierarchical_symbols()

    def convert(s: dm.Symbol) -> t.DocumentSymbol:
        sel = ls.to_range(s.selection, snap.lines, snap.codec)
        start = snap.codec.position_to_client_units(snap.lines, ServerTextPosition(s.region.start_line,
                                                                                   s.region.start_col))
        end = snap.codec.position_to_client_units(snap.lines, ServerTextPosition(s.region.end_line,
                                                                                 s.region.end_col))
        full = t.Range(start=start, end=end)
        if not (full.start.line <= sel.start.line <= full.end.line):
            full = sel
        return t.DocumentSymbol(name=s.name, kind=_SYMBOL_KIND.get(s.kind, t.SymbolKind.Object), range=full,
                                selection_range=sel, detail=s.detail,
                                children=[convert(c) for c in s.children] or None)

    def flat(s: dm.Symbol, container: str | None, out: list[t.SymbolInformation]) -> None:
        out.append(t.SymbolInformation(name=s.name, kind=_SYMBOL_KIND.get(s.kind, t.SymbolKind.Object),
                                       location=t.Location(uri=snap.uri, range=ls.to_range(
                                           s.selection, snap.lines, snap.codec)), container_name=container))
        for c in s.children:
            flat(c, s.name, out)

    def work() -> list[Any] | None:
        doc = ls.parse(snap)
        syms = nav.document_symbols(doc)
        if not syms:
            return None
        if hierarchical:
            return [convert(s) for s in syms]
        out: list[t.SymbolInformation] = []
        for s in syms:
            flat(s, None, out)
        return out

    return await ls.run(work, default=None)


@server.feature(t.WORKSPACE_SYMBOL)
async def workspace_symbol(ls: SlayerLanguageServer, params: t.WorkspaceSymbolParams) -> list[t.SymbolInformation] | None:
    query = (params.query or "").strip()

    def work() -> list[t.SymbolInformation]:
        catalog = ls.catalog()
        if query:
            req: dict[str, Any] = {"question": query, "max_results": WORKSPACE_SYMBOL_LIMIT}
            if len(ls.session_scope().datasources) == 1:
                req["datasource"] = ls.session_scope().datasources[0]
            resp = ls.engine.search(req)
            hits = [(h.kind, h.id) for h in resp.results]
        else:  # an empty query lists the models (VS Code asks with "" first)
            idx = comp.index_for(catalog, ls.scope())
            hits = [("model", i.canonical) for i in idx.models() if i.canonical][:WORKSPACE_SYMBOL_LIMIT]
        out = []
        for s in nav.workspace_symbols(catalog, hits):
            if s.location is None:
                continue
            out.append(t.SymbolInformation(name=s.name, kind=_SYMBOL_KIND.get(s.kind, t.SymbolKind.Object),
                                           location=ls.location(s.location), container_name=s.container))
        return out

    return await ls.run(work, default=None)


@server.feature(t.TEXT_DOCUMENT_CODE_ACTION,
                t.CodeActionOptions(code_action_kinds=[t.CodeActionKind.QuickFix, t.CodeActionKind.RefactorRewrite],
                                    resolve_provider=False))
async def code_action(ls: SlayerLanguageServer, params: t.CodeActionParams) -> list[t.CodeAction] | None:
    snap = ls.snapshot(params.text_document.uri)
    if snap is None:
        return None
    want = params.range
    client_diags = list(params.context.diagnostics or [])

    def overlaps(r: t.Range) -> bool:
        return (r.start.line, r.start.character) <= (want.end.line, want.end.character) and \
            (want.start.line, want.start.character) <= (r.end.line, r.end.character)

    only = params.context.only

    def work() -> list[t.CodeAction] | None:
        actions = []
        pending = ls.store_rename
        if pending is not None and (not only or any(t.CodeActionKind.RefactorRewrite.value.startswith(k)
                                                     for k in only)):
            actions.append(store_rename_action(*pending))
        for x in ls.diagnose(snap):
            if not x.fixes:
                continue
            rng = ls.to_range(x.span, snap.lines, snap.codec)
            if not overlaps(rng):
                continue
            lsp_diag = next((cd for cd in client_diags if cd.code == x.code and cd.range == rng),
                            ls.to_lsp_diagnostic(x, snap))
            for i, fix in enumerate(x.fixes):
                edit = t.TextEdit(range=ls.to_range(fix.span, snap.lines, snap.codec), new_text=fix.new_text)
                actions.append(t.CodeAction(title=fix.title, kind=t.CodeActionKind.QuickFix, diagnostics=[lsp_diag],
                                            is_preferred=i == 0,
                                            edit=t.WorkspaceEdit(changes={snap.uri: [edit]})))
        return actions or None

    return await ls.run(work, default=None)


# ====================================================================== rename, impact, lenses, signatures, hints

def _refused(message: str) -> JsonRpcException:
    """A refused rename or impact: the client shows the message (RequestFailed)."""
    return JsonRpcException(message, code=t.LSPErrorCodes.RequestFailed.value)


def _client_edit_caps(ls: SlayerLanguageServer) -> tuple[bool, bool, bool]:
    """(documentChanges, file renames, change annotations) the client accepts in a WorkspaceEdit."""
    caps = ls.client_capabilities
    we = caps.workspace.workspace_edit if caps and caps.workspace else None
    if we is None:
        return False, False, False
    ops = we.resource_operations or []
    return (bool(we.document_changes), t.ResourceOperationKind.Rename in ops,
            we.change_annotation_support is not None)


STORE_ANNOTATION = "slayer-store"
STORE_RENAME_COMMAND = "slayer.applyStoreRename"


def _store_summary(plan: ren.RenamePlan) -> str:
    store = plan.store
    assert store is not None
    return (f"{store.models} model row{'s' * (store.models != 1)} and {store.memories} "
            f"memor{'ies' if store.memories != 1 else 'y'}")


def store_rename_action(plan_id: str, plan: ren.RenamePlan) -> t.CodeAction:
    """The code action that writes a SQLite store's part of a rename (refactor.rewrite)."""
    title = f"Write the rename of {plan.entity} to {plan.new_entity} to the SLayer store ({_store_summary(plan)})"
    return t.CodeAction(title=title, kind=t.CodeActionKind.RefactorRewrite, is_preferred=True,
                        command=t.Command(title=title, command=STORE_RENAME_COMMAND, arguments=[plan_id]))


def rename_edit(ls: SlayerLanguageServer, plan: ren.RenamePlan) -> t.WorkspaceEdit:
    """The plan as one WorkspaceEdit: text edits per file, then the store's file renames. Edits of
    store files carry a change annotation that asks the user to confirm (when the client supports
    them): the store is SLayer's, and its files change with this edit."""
    doc_changes, renames_ok, annotations = _client_edit_caps(ls)
    if plan.store is not None:
        return _sqlite_rename_edit(ls, plan, doc_changes, annotations)
    store = str(ls.engine.location.path)
    if plan.renames and not (doc_changes and renames_ok):
        raise _refused(f"renaming '{plan.entity}' renames its file in the store, and this editor does not accept "
                       f"file renames in an edit (workspace.workspaceEdit.resourceOperations)")
    if not doc_changes:
        changes = {ls.uri_of(f.key): [t.TextEdit(range=ls.lsp_range(f.key, e.span), new_text=e.new_text)
                                      for e in f.edits] for f in plan.files}
        return t.WorkspaceEdit(changes=changes)
    out: list[Any] = []
    for f in plan.files:
        in_store = "://" not in f.key and ren.is_inside(f.key, store)
        note = STORE_ANNOTATION if annotations and in_store else None
        edits: list[Any] = [
            t.AnnotatedTextEdit(range=ls.lsp_range(f.key, e.span), new_text=e.new_text, annotation_id=note)
            if note else t.TextEdit(range=ls.lsp_range(f.key, e.span), new_text=e.new_text) for e in f.edits]
        uri = ls.uri_of(f.key)
        version = ls.workspace.get_text_document(uri).version if uri in ls.workspace.text_documents else None
        out.append(t.TextDocumentEdit(text_document=t.OptionalVersionedTextDocumentIdentifier(uri=uri,
                                                                                              version=version),
                                      edits=edits))
    for r in plan.renames:
        out.append(t.RenameFile(old_uri=ls.uri_of(r.old), new_uri=ls.uri_of(r.new),
                                options=t.RenameFileOptions(overwrite=False, ignore_if_exists=False),
                                annotation_id=STORE_ANNOTATION if annotations else None))
    anns = {STORE_ANNOTATION: t.ChangeAnnotation(
        label=f"Rename {plan.entity} to {plan.new_entity} in the SLayer store", needs_confirmation=True,
        description="These files belong to the SLayer store; SLayer reads them as changed.")} if annotations else None
    return t.WorkspaceEdit(document_changes=out, change_annotations=anns)


def _sqlite_rename_edit(ls: SlayerLanguageServer, plan: ren.RenamePlan, doc_changes: bool,
                        annotations: bool) -> t.WorkspaceEdit:
    """A rename in a SQLite store: the workspace files' edits, each under a change annotation that
    needs confirmation and says what the store part will write; that part is kept as the pending
    store rename, offered by the code action ``store_rename_action`` (the only way it is written)."""
    plan_id = uuid.uuid4().hex[:12]
    ls.store_rename = (plan_id, plan) if plan.store and plan.store.rows else None
    if not doc_changes:
        return t.WorkspaceEdit(changes={ls.uri_of(f.key): [
            t.TextEdit(range=ls.lsp_range(f.key, e.span), new_text=e.new_text) for e in f.edits] for f in plan.files})
    note = STORE_ANNOTATION if annotations else None
    out: list[Any] = []
    for f in plan.files:
        uri = ls.uri_of(f.key)
        version = ls.workspace.get_text_document(uri).version if uri in ls.workspace.text_documents else None
        out.append(t.TextDocumentEdit(
            text_document=t.OptionalVersionedTextDocumentIdentifier(uri=uri, version=version),
            edits=[t.AnnotatedTextEdit(range=ls.lsp_range(f.key, e.span), new_text=e.new_text, annotation_id=note)
                   if note else t.TextEdit(range=ls.lsp_range(f.key, e.span), new_text=e.new_text)
                   for e in f.edits]))
    if not annotations:
        return t.WorkspaceEdit(document_changes=out)
    if ls.store_rename is None:
        description = "The SLayer store (a SQLite file) holds nothing else that names it."
    else:
        description = (f"The SLayer store is a SQLite file: its {_store_summary(plan)} that name "
                       f"{plan.entity} are written only by the code action \"{store_rename_action(plan_id, plan).title}\" "
                       f"(command {STORE_RENAME_COMMAND} {plan_id}), all in one transaction.")
    anns = {STORE_ANNOTATION: t.ChangeAnnotation(label=f"Rename {plan.entity} to {plan.new_entity}",
                                                 needs_confirmation=True, description=description)}
    return t.WorkspaceEdit(document_changes=out, change_annotations=anns)


@server.feature(t.TEXT_DOCUMENT_PREPARE_RENAME)
async def prepare_rename(ls: SlayerLanguageServer, params: t.PrepareRenameParams) -> Any:
    snap = ls.snapshot(params.text_document.uri)
    if snap is None:
        return None

    def work() -> Any:
        doc = ls.parse(snap)
        if doc.kind == "other":
            return None
        line, col = ls.position(snap, params.position)
        try:
            target = ren.target_at(doc, line, col, ls.catalog())
        except ren.RenameError as exc:
            raise _refused(str(exc)) from exc
        return t.PrepareRenamePlaceholder(range=ls.to_range(target.span, snap.lines, snap.codec),
                                          placeholder=target.name)

    return await ls.run(work, default=None)


@server.feature(t.TEXT_DOCUMENT_RENAME)
async def rename(ls: SlayerLanguageServer, params: t.RenameParams) -> t.WorkspaceEdit | None:
    snap = ls.snapshot(params.text_document.uri)
    if snap is None:
        return None
    snaps = ls.open_snapshots()

    def work() -> t.WorkspaceEdit | None:
        doc = ls.parse(snap)
        if doc.kind == "other":
            return None
        line, col = ls.position(snap, params.position)
        catalog = ls.catalog()
        try:
            target = ren.target_at(doc, line, col, catalog)
            state = ls.current_state()
            if catalog.location.backend != "yaml" and state is not None and state.full is not None:
                raise ren.RenameError("a scoped session cannot rename in a SQLite store: the rename would rewrite "
                                      "rows (memories, models) the session cannot see")
            read, text_of = ls.store_readers(snaps)
            plan = ren.plan_rename(catalog, target.entity, params.new_name, ls.workspace_docs(snaps),
                                   read=read, text_of=text_of)
        except ren.RenameError as exc:
            raise _refused(str(exc)) from exc
        log.info("rename %s -> %s: %d edits in %d files, %d file renames", plan.entity, plan.new_entity,
                 plan.edit_count, len(plan.files), len(plan.renames))
        return rename_edit(ls, plan)

    return await ls.run(work, default=None)


def impact_result(ls: SlayerLanguageServer, result: imp.Impact) -> dict[str, Any]:
    uses = []
    for u in result.uses:
        item: dict[str, Any] = {"kind": u.kind, "name": ls.uri_of(u.name) if u.kind in ("query", "memory") and
                                not u.name.startswith("memory:") else u.name,
                                "target": u.target, "via": list(u.via)}
        if u.location is not None:
            lsp_loc = ls.location(u.location)
            item["location"] = {"uri": lsp_loc.uri, "range": {
                "start": {"line": lsp_loc.range.start.line, "character": lsp_loc.range.start.character},
                "end": {"line": lsp_loc.range.end.line, "character": lsp_loc.range.end.character}}}
        uses.append(item)
    return {"entity": result.entity, "kind": result.kind, "summary": result.summary(),
            "counts": result.counts(), "uses": uses}


async def do_impact(ls: SlayerLanguageServer, params: Any) -> dict[str, Any]:
    method = "slayer/impact"
    raw = _object_params(method, params)
    unknown = sorted(set(raw) - {"entity"})
    if unknown:
        raise JsonRpcInvalidParams(f"{method}: unknown parameter(s) {unknown}; expected ['entity']")
    entity = raw.get("entity")
    if not isinstance(entity, str) or not entity:
        raise JsonRpcInvalidParams(f"{method}: 'entity' must be a canonical id (a non-empty string)")
    if not await ls.ready():
        raise JsonRpcInvalidParams(f"{method}: no store ({ls.engine_error})")
    snaps = ls.open_snapshots()

    def work() -> dict[str, Any]:
        catalog = ls.catalog()
        try:
            found = imp.impact(catalog, entity, ls.workspace_docs(snaps))
        except imp.ImpactError as exc:
            raise JsonRpcInvalidParams(f"{method}: {exc}") from exc
        return impact_result(ls, found)

    return await asyncio.to_thread(work)


LENS_KINDS = ("model", "column")


@server.feature(t.TEXT_DOCUMENT_CODE_LENS, t.CodeLensOptions(resolve_provider=True))
async def code_lens(ls: SlayerLanguageServer, params: t.CodeLensParams) -> list[t.CodeLens] | None:
    """Unresolved lenses on a model file's model and column declarations: counting is left to
    ``codeLens/resolve``, for the lenses the editor shows."""
    snap = ls.snapshot(params.text_document.uri)
    if snap is None:
        return None

    def work() -> list[t.CodeLens] | None:
        doc = ls.parse(snap)
        if doc.kind != "model" or doc.model_id is None or doc.model_id not in ls.catalog():
            return None
        lenses = []
        for sym in doc.symbols:
            entries = [(sym, doc.model_id)] + [(c, f"{doc.model_id}.{c.name}") for c in sym.children
                                               if c.kind == "column"]
            for s, canonical in entries:
                if canonical in ls.catalog():
                    lenses.append(t.CodeLens(range=ls.to_range(s.selection, snap.lines, snap.codec),
                                             data={"entity": canonical}))
        return lenses or None

    return await ls.run(work, default=None)


@server.feature(t.CODE_LENS_RESOLVE)
async def code_lens_resolve(ls: SlayerLanguageServer, lens: t.CodeLens) -> t.CodeLens:
    data = _plain(lens.data)
    entity = data.get("entity") if isinstance(data, dict) else None
    snaps = ls.open_snapshots()

    def work() -> t.CodeLens:
        if not isinstance(entity, str):
            return lens
        try:
            found = imp.impact(ls.catalog(), entity, ls.workspace_docs(snaps), locate=False)
        except imp.ImpactError:
            lens.command = t.Command(title="not in the store", command="")
            return lens
        lens.command = t.Command(title=found.summary(), command="slayer.impact", arguments=[{"entity": entity}])
        return lens

    return await ls.run(work, default=lens)


@server.feature(t.TEXT_DOCUMENT_SIGNATURE_HELP,
                t.SignatureHelpOptions(trigger_characters=["(", ","], retrigger_characters=[",", "="]))
async def signature_help(ls: SlayerLanguageServer, params: t.SignatureHelpParams) -> t.SignatureHelp | None:
    snap = ls.snapshot(params.text_document.uri)
    if snap is None:
        return None

    def work() -> t.SignatureHelp | None:
        doc = ls.parse(snap)
        if doc.kind == "other":
            return None
        line, col = ls.position(snap, params.position)
        found = sig.signature_at(doc, line, col, ls.catalog())
        if found is None:
            return None
        info = t.SignatureInformation(
            label=found.label, documentation=found.documentation,
            parameters=[t.ParameterInformation(label=p, documentation=d) for p, d in found.parameters],
            active_parameter=found.active_parameter)
        return t.SignatureHelp(signatures=[info], active_signature=0, active_parameter=found.active_parameter)

    return await ls.run(work, default=None)


@server.feature(t.TEXT_DOCUMENT_INLAY_HINT, t.InlayHintOptions(resolve_provider=False))
async def inlay_hint(ls: SlayerLanguageServer, params: t.InlayHintParams) -> list[t.InlayHint] | None:
    snap = ls.snapshot(params.text_document.uri)
    if snap is None:
        return None

    def work() -> list[t.InlayHint] | None:
        doc = ls.parse(snap)
        hints = inl.inlay_hints(doc, ls.catalog(), params.range.start.line, params.range.end.line)
        out = []
        for h in hints:
            pos = snap.codec.position_to_client_units(snap.lines, ServerTextPosition(h.line, h.col))
            out.append(t.InlayHint(position=pos, label=f" {h.label}", kind=t.InlayHintKind.Type,
                                   tooltip=f"resolves to {h.canonical}", padding_left=False))
        return out or None

    return await ls.run(work, default=None)


# ====================================================================== custom requests and commands

def _plain(value: Any) -> Any:
    """Untyped params as plain data (namedtuples, if a client path produced them, back to dicts)."""
    if hasattr(value, "_asdict"):
        return {k: _plain(v) for k, v in value._asdict().items()}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _object_params(method: str, params: Any) -> dict[str, Any]:
    params = _plain(params)
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise JsonRpcInvalidParams(f"{method}: params must be an object, got {type(params).__name__}")
    return params


async def do_search(ls: SlayerLanguageServer, params: Any) -> dict[str, Any]:
    from slayer_lsp.search.types import SearchError, parse_params, to_builtins

    raw = _object_params("slayer/search", params)
    try:
        parsed = parse_params(raw)
    except SearchError as exc:
        raise JsonRpcInvalidParams(f"slayer/search: {exc}") from exc
    if not await ls.ready():
        raise JsonRpcInvalidParams(f"slayer/search: no store ({ls.engine_error})")

    cancel = threading.Event()
    engine = ls.engine

    def work() -> dict[str, Any]:
        try:
            return to_builtins(engine.search(parsed, cancel))
        except SearchError as exc:
            raise JsonRpcInvalidParams(f"slayer/search: {exc}") from exc

    try:
        return await asyncio.to_thread(work)
    except asyncio.CancelledError:  # $/cancelRequest or shutdown: a running cypher_filter is killed
        cancel.set()
        raise


async def do_search_facets(ls: SlayerLanguageServer, params: Any) -> dict[str, Any]:
    import msgspec

    from slayer_lsp.search.facets import parse_facets_params
    from slayer_lsp.search.types import SearchError

    method = "slayer/searchFacets"
    try:
        parsed = parse_facets_params(_object_params(method, params))
    except SearchError as exc:
        raise JsonRpcInvalidParams(f"{method}: {exc}") from exc
    if not await ls.ready():
        raise JsonRpcInvalidParams(f"{method}: no store ({ls.engine_error})")

    def work() -> dict[str, Any]:
        try:
            return msgspec.to_builtins(ls.engine.search_facets(parsed))
        except SearchError as exc:
            raise JsonRpcInvalidParams(f"{method}: {exc}") from exc

    return await asyncio.to_thread(work)


async def do_inspect(ls: SlayerLanguageServer, params: Any) -> dict[str, Any]:
    """``{"refs": [...]}`` (also ``reference``/``references``, a string or a list) -> ``{"items": [...]}``
    with each item's store location."""
    import msgspec

    from slayer_lsp.analysis.inspect import inspect_refs

    raw = _object_params("slayer/inspect", params)
    unknown = set(raw) - {"refs", "reference", "references"}
    if unknown:
        raise JsonRpcInvalidParams(f"slayer/inspect: unknown parameter(s) {sorted(unknown)}; expected 'refs'")
    refs = raw.get("refs", raw.get("references", raw.get("reference")))
    if isinstance(refs, str):
        refs = [refs]
    if not isinstance(refs, list) or not refs or not all(isinstance(r, str) for r in refs):
        raise JsonRpcInvalidParams("slayer/inspect: 'refs' must be a non-empty list of strings")
    if len(refs) > MAX_INSPECT_REFS:
        raise JsonRpcInvalidParams(f"slayer/inspect: {len(refs)} references; at most {MAX_INSPECT_REFS} per request")
    if not await ls.ready():
        raise JsonRpcInvalidParams(f"slayer/inspect: no store ({ls.engine_error})")

    def work() -> dict[str, Any]:
        catalog = ls.catalog()
        items = []
        for item in inspect_refs(catalog, refs):
            data = msgspec.to_builtins(item)
            loc = nav.entity_location(catalog, item.canonical) if item.canonical else None
            if loc is not None:
                lsp_loc = ls.location(loc)
                data["location"] = {"uri": lsp_loc.uri, "range": {
                    "start": {"line": lsp_loc.range.start.line, "character": lsp_loc.range.start.character},
                    "end": {"line": lsp_loc.range.end.line, "character": lsp_loc.range.end.character}}}
            items.append(data)
        return {"items": items}

    return await asyncio.to_thread(work)


async def do_status(ls: SlayerLanguageServer, params: Any) -> dict[str, Any]:
    """``slayer-lsp status``'s report of the engine (once the first index is done) plus what only the
    server knows: readiness, options, open documents, the watcher. Answers at once, even mid-index."""
    import msgspec

    from slayer_lsp.status import engine_status

    raw = _object_params("slayer/status", params)
    if raw:
        raise JsonRpcInvalidParams(f"slayer/status: takes no parameters, got {sorted(raw)}")
    engine = ls.engine
    state = ls.current_state()
    out: dict[str, Any] = {"version": __version__}
    if engine is not None:
        out.update(store=str(engine.location.path), backend=engine.location.backend)
    if state is not None:
        def report() -> dict[str, Any]:
            data = msgspec.to_builtins(engine_status(engine))
            stats = engine.stats
            data.update(refreshes=stats.refreshes, last_delta_size=stats.last_delta_size,
                        issues=[str(i) for i in state.catalog.issues][:50])
            return data

        out.update(await asyncio.to_thread(report))
    out.update({
        "ready": state is not None,
        "indexing": ls.indexing,
        "server_error": ls.engine_error,
        "options": {**ls.options.to_dict(), "scope": _scope_dict(ls)},
        "option_problems": list(ls.option_problems),
        "open_documents": len(ls.workspace.text_documents),
        "watching": str(ls.watcher.watching) if ls.watcher is not None and ls.watcher.running else None,
        "uptime_s": round(time.time() - ls.started, 1),
    })
    return out


# ---------------------------------------------------------------------- memory writes

_SAVE_FIELDS = ("learning", "entities", "query", "linked_entities", "id", "description")


def _write_error(method: str, exc: WriteRefused) -> JsonRpcException:
    """A refused write as a JSON-RPC error carrying the writer's message: -32602 when the input is
    at fault (an unresolvable reference, a bad id, ...), -32803 (RequestFailed) when the store is
    (I/O, lock timeout, an unreadable, legacy or changed store)."""
    if exc.store_side:
        log.warning("%s refused by the store: %s", method, exc)
        return JsonRpcException(f"{method}: {exc}", code=t.LSPErrorCodes.RequestFailed.value)
    return JsonRpcInvalidParams(f"{method}: {exc}")


def _save_params(raw: dict[str, Any]) -> dict[str, Any]:
    """The writer's keyword arguments from ``slayer/saveMemory`` params; wrong types answer -32602.
    SLayer's own spelling is accepted too: ``linked_entities`` is a list (entities) or an object (a
    query)."""
    method = "slayer/saveMemory"
    unknown = sorted(set(raw) - set(_SAVE_FIELDS))
    if unknown:
        raise JsonRpcInvalidParams(f"{method}: unknown parameter(s) {unknown}; expected {list(_SAVE_FIELDS)}")
    learning = raw.get("learning")
    if not isinstance(learning, str):
        raise JsonRpcInvalidParams(f"{method}: 'learning' must be a string, got {_json_type(learning)}")
    entities, query = raw.get("entities"), raw.get("query")
    if "linked_entities" in raw:
        if entities is not None or query is not None:
            raise JsonRpcInvalidParams(f"{method}: give 'linked_entities' or 'entities'/'query', not both")
        linked = raw["linked_entities"]
        entities, query = (None, linked) if isinstance(linked, dict) else (linked, None)
    if entities is not None and not (isinstance(entities, list) and all(isinstance(e, str) for e in entities)):
        raise JsonRpcInvalidParams(f"{method}: 'entities' must be a list of strings, got {_json_type(entities)}")
    if query is not None and not isinstance(query, dict):
        raise JsonRpcInvalidParams(f"{method}: 'query' must be an object, got {_json_type(query)}")
    if entities is None and query is None:
        raise JsonRpcInvalidParams(f"{method}: give 'entities' (a list of references) or 'query' (an object)")
    memory_id = raw.get("id")
    if memory_id is not None and (isinstance(memory_id, bool) or not isinstance(memory_id, (str, int))):
        raise JsonRpcInvalidParams(f"{method}: 'id' must be a string or an integer, got {_json_type(memory_id)}")
    description = raw.get("description")
    if description is not None and not isinstance(description, str):
        raise JsonRpcInvalidParams(f"{method}: 'description' must be a string, got {_json_type(description)}")
    return {"learning": learning, "entities": entities, "query": query, "id": memory_id,
            "description": description}


def _json_type(value: Any) -> str:
    return {type(None): "null", bool: "a boolean", int: "a number", float: "a number", str: "a string",
            list: "a list", dict: "an object"}.get(type(value), type(value).__name__)


async def _writable_state(ls: SlayerLanguageServer, method: str):  # type: ignore[no-untyped-def]
    if not await ls.ready():
        raise JsonRpcException(f"{method}: no store ({ls.engine_error})", code=t.LSPErrorCodes.RequestFailed.value)
    state = ls.current_state()
    if state is None or state.catalog.fatal is not None:
        reason = state.catalog.fatal if state is not None else "not indexed"
        raise JsonRpcException(f"{method}: the store cannot be read ({reason})",
                               code=t.LSPErrorCodes.RequestFailed.value)
    return ls.engine, state


def _scope_dict(ls: SlayerLanguageServer) -> dict[str, Any]:
    """The effective scope in the options' shape, and where it came from."""
    scope = ls.session_scope()
    return {"datasources": list(scope.datasources), "accessTags": list(scope.access_tags or ()),
            "untaggedOnly": scope.access_tags == (),
            "fixedBy": "command line" if ls.cli_scope is not None else None}


async def do_save_memory(ls: SlayerLanguageServer, params: Any) -> dict[str, Any]:
    """Save (or upsert) a memory exactly as SLayer would, then refresh the engine so that the next
    search, hover or diagnostic sees it."""
    from slayer_lsp.writer import scoped as writes

    method = "slayer/saveMemory"
    kwargs = _save_params(_object_params(method, params))
    engine, state = await _writable_state(ls, method)

    def work() -> dict[str, Any]:
        try:
            saved = writes.save(engine, state, **kwargs)
        except writes.WriteRefused as exc:
            raise _write_error(method, exc) from exc
        writes.refresh_after_write(engine, saved.touched)
        return {"id": saved.id, "entities": saved.entities, "created": saved.created, "warnings": saved.warnings}

    result = await asyncio.to_thread(work)
    ls.republish_all()
    return result


async def do_forget_memory(ls: SlayerLanguageServer, params: Any) -> dict[str, Any]:
    """Forget a memory (and its ``memory:<id>`` tags on other memories, and its embedding rows) as
    SLayer would, then refresh the engine. ``{"forgotten": false}`` when no such memory exists."""
    from slayer_lsp.writer import scoped as writes

    method = "slayer/forgetMemory"
    raw = _object_params(method, params)
    unknown = sorted(set(raw) - {"id"})
    if unknown:
        raise JsonRpcInvalidParams(f"{method}: unknown parameter(s) {unknown}; expected ['id']")
    memory_id = raw.get("id")
    if isinstance(memory_id, bool) or not isinstance(memory_id, (str, int)):
        raise JsonRpcInvalidParams(f"{method}: 'id' must be a string or an integer, got {_json_type(memory_id)}")
    engine, state = await _writable_state(ls, method)

    def work() -> dict[str, Any]:
        try:
            # outside the session's scope (hidden, or a file that does not load): as if there were none
            forgotten = writes.forget(engine, state, memory_id)
        except writes.WriteRefused as exc:
            raise _write_error(method, exc) from exc
        if forgotten:
            writes.refresh_after_write(engine, None)  # other memories may have lost a tag: re-list them all
        return {"forgotten": forgotten}

    result = await asyncio.to_thread(work)
    ls.republish_all()
    return result


async def do_apply_store_rename(ls: SlayerLanguageServer, args: tuple[Any, ...]) -> dict[str, Any]:
    """Write the pending store part of a rename in a SQLite store (the code action's command): all its
    rows in one transaction, then refresh the engine. Only the last planned rename is pending; it is
    written once."""
    from slayer_lsp.writer import scoped as writes

    name = STORE_RENAME_COMMAND
    if len(args) != 1 or not isinstance(args[0], str):
        raise JsonRpcInvalidParams(f"{name}: expected one argument, the plan id of a rename")
    pending = ls.store_rename
    if pending is None or pending[0] != args[0]:
        raise JsonRpcInvalidParams(f"{name}: no pending store rename {args[0]!r} (only the last rename planned "
                                   f"in a SQLite store is pending, once): rename again")
    plan = pending[1]
    engine, _state = await _writable_state(ls, name)

    def work() -> dict[str, Any]:
        try:
            writes.rename_rows(engine, plan.store, plan.entity)
        except writes.WriteRefused as exc:
            raise _write_error(name, exc) from exc
        writes.refresh_after_write(engine, None)
        return {"entity": plan.entity, "new_entity": plan.new_entity, "models": plan.store.models,
                "memories": plan.store.memories}

    try:
        result = await asyncio.to_thread(work)
    finally:
        if ls.store_rename is pending:
            ls.store_rename = None  # written, or refused: planned again from the store as it is now
    ls.republish_all()
    return result


@server.feature("slayer/search")
async def slayer_search(ls: SlayerLanguageServer, params: Any) -> dict[str, Any]:
    return await do_search(ls, params)


@server.feature("slayer/searchFacets")
async def slayer_search_facets(ls: SlayerLanguageServer, params: Any) -> dict[str, Any]:
    return await do_search_facets(ls, params)


@server.feature("slayer/inspect")
async def slayer_inspect(ls: SlayerLanguageServer, params: Any) -> dict[str, Any]:
    return await do_inspect(ls, params)


@server.feature("slayer/impact")
async def slayer_impact(ls: SlayerLanguageServer, params: Any) -> dict[str, Any]:
    return await do_impact(ls, params)


@server.feature("slayer/status")
async def slayer_status(ls: SlayerLanguageServer, params: Any) -> dict[str, Any]:
    return await do_status(ls, params)


@server.feature("slayer/saveMemory")
async def slayer_save_memory(ls: SlayerLanguageServer, params: Any) -> dict[str, Any]:
    return await do_save_memory(ls, params)


@server.feature("slayer/forgetMemory")
async def slayer_forget_memory(ls: SlayerLanguageServer, params: Any) -> dict[str, Any]:
    return await do_forget_memory(ls, params)


def _command_params(name: str, args: tuple[Any, ...]) -> Any:
    if len(args) > 1:
        raise JsonRpcInvalidParams(f"{name}: expected one argument (the request's params), got {len(args)}")
    return args[0] if args else {}


@server.command("slayer.search")
async def cmd_search(ls: SlayerLanguageServer, *args: Any) -> dict[str, Any]:
    return await do_search(ls, _command_params("slayer.search", args))


@server.command("slayer.searchFacets")
async def cmd_search_facets(ls: SlayerLanguageServer, *args: Any) -> dict[str, Any]:
    return await do_search_facets(ls, _command_params("slayer.searchFacets", args))


@server.command("slayer.inspect")
async def cmd_inspect(ls: SlayerLanguageServer, *args: Any) -> dict[str, Any]:
    if args and all(isinstance(a, str) for a in args):  # slayer.inspect "ref" "ref2"
        return await do_inspect(ls, {"refs": list(args)})
    return await do_inspect(ls, _command_params("slayer.inspect", args))


@server.command("slayer.impact")
async def cmd_impact(ls: SlayerLanguageServer, *args: Any) -> dict[str, Any]:
    if len(args) == 1 and isinstance(args[0], str):  # the entity alone
        return await do_impact(ls, {"entity": args[0]})
    return await do_impact(ls, _command_params("slayer.impact", args))


@server.command(STORE_RENAME_COMMAND)
async def cmd_apply_store_rename(ls: SlayerLanguageServer, *args: Any) -> dict[str, Any]:
    return await do_apply_store_rename(ls, args)


@server.command("slayer.status")
async def cmd_status(ls: SlayerLanguageServer, *args: Any) -> dict[str, Any]:
    return await do_status(ls, _command_params("slayer.status", args))


@server.command("slayer.saveMemory")
async def cmd_save_memory(ls: SlayerLanguageServer, *args: Any) -> dict[str, Any]:
    return await do_save_memory(ls, _command_params("slayer.saveMemory", args))


@server.command("slayer.forgetMemory")
async def cmd_forget_memory(ls: SlayerLanguageServer, *args: Any) -> dict[str, Any]:
    if len(args) == 1 and isinstance(args[0], (str, int)) and not isinstance(args[0], bool):  # the id alone
        return await do_forget_memory(ls, {"id": args[0]})
    return await do_forget_memory(ls, _command_params("slayer.forgetMemory", args))
