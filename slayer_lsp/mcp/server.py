"""The MCP server: the official SDK's low-level ``Server`` on stdio, over one ``Engine``.

A thin front end: tool arguments are decoded with the msgspec types of ``mcp.types`` (the same
types the announced JSON Schemas come from), handed to the engine on a worker thread, and the
answer goes back as structured content plus its JSON text. Bad arguments, refused requests and
failed writes answer a tool result with ``isError`` and a message a model can act on; the server
keeps serving. Nothing but protocol goes to stdout: the SDK's stdio transport points fd 1 at stderr
while it serves.

Change notifications: the store watcher (``slayer_lsp.watch``) re-reads the store and the server
announces ``notifications/resources/list_changed`` plus ``notifications/resources/updated`` for the
touched resources: on a 2025 (handshake) connection directly (``updated`` for subscribed URIs only),
on a 2026-07-28 connection through ``subscriptions/listen`` streams (the SDK's ``ListenHandler``).
While the first index is built, a request that has to wait reports progress once a second when the
client asked for it (a ``progressToken``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import re
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import mcp_types as types
import msgspec
from mcp.server import NotificationOptions, Server
from mcp.server.subscriptions import (
    InMemorySubscriptionBus,
    ListenHandler,
    ResourcesListChanged,
    ResourceUpdated,
)
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS

from slayer_lsp import __version__
from slayer_lsp import protocol_types as p
from slayer_lsp.mcp import resources as res
from slayer_lsp.mcp import types as mt

log = logging.getLogger(__name__)

COMPACT_AFTER_S = 2.0  # quiet time after a store change before the full-text statistics are rebuilt
STORE_RETRY_S, STORE_RETRY_MAX_S = 0.5, 10.0  # re-reads of an unreadable store: first pause, longest pause
PROGRESS_EVERY_S = 1.0
INSTRUCTIONS = (
    "SLayer semantic layer: call `search` with the user's question to find the columns, models, measures "
    "and saved memories that answer it; `inspect` a reference before using it; `save_memory` what you "
    "learned so that later sessions find it. Resources slayer://datasource/{name}, "
    "slayer://model/{datasource}.{model} and slayer://memory/{id} hold the full definitions."
)
_SURROGATE = re.compile("[\ud800-\udfff]")


class ToolError(Exception):
    """A tool call refused with a message for the model (answered ``isError``)."""


class McpApp:
    """One session's state: the engine, the first index, the watcher, and who to tell of changes."""

    def __init__(
        self,
        storage: str | None,
        scope: Any = None,
        *,
        dense: str = "live",
        embedding_model: str | None = None,
        switch_model: bool = False,
    ) -> None:
        from slayer_lsp.engine import Engine
        from slayer_lsp.reach.scope import Scope

        self.on_request: Callable[[], None] = _nothing  # the idle collector's clock (``serve``)

        self.scope = scope or Scope()
        self.engine: Any = None
        self.engine_error: str | None = None
        try:
            self.engine = Engine(
                storage,
                dense=dense,
                embedding_model=embedding_model,
                switch_model=switch_model,
                compact_after_s=COMPACT_AFTER_S,
                scope=self.scope,
            )
        except Exception as exc:  # noqa: BLE001 - a bad store path is reported by every tool, not a crash
            log.exception("cannot open the store %r", storage)
            self.engine_error = f"cannot open the store {storage!r}: {exc}"
        self.started = time.time()
        self.indexing = False
        self.loop: asyncio.AbstractEventLoop | None = None
        self.ready: asyncio.Event | None = None
        self.watcher: Any = None
        self.bus = InMemorySubscriptionBus()
        self.listen = ListenHandler(self.bus)
        self.legacy_session: Any = None  # the handshake connection's session, once initialized
        self.subscribed: set[str] = set()  # URIs a handshake client subscribed to
        self.store_fault: str | None = None
        self._retry_s = 0.0
        self._index_task: asyncio.Task[None] | None = None
        self._tools = [types.Tool.model_validate(t) for t in mt.tool_list()]

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.ready = asyncio.Event()
        if self.engine is not None:
            self._index_task = asyncio.ensure_future(self._initial_index())

    async def stop(self) -> None:
        self.listen.close()
        if self.watcher is not None:
            self.watcher.stop(timeout=1.0)
            self.watcher = None
        if self.engine is not None:
            self.engine.abort_queries()
            await asyncio.to_thread(self.engine.close)

    async def _initial_index(self) -> None:
        self.indexing = True
        self._watch_before_reading()
        try:
            await asyncio.to_thread(self.engine.refresh)
        except Exception:  # noqa: BLE001 - the tools report the engine's state
            log.exception("initial indexing failed")
        finally:
            self.indexing = False
        assert self.ready is not None
        self.ready.set()
        state = self.engine.current()
        log.info(
            "slayer-lsp mcp: %s indexed (%d entities)",
            self.engine.location,
            len(state.catalog.entities) if state is not None else 0,
        )
        self._note_fault(state.catalog.fatal if state is not None else None)

    async def wait_ready(self, ctx: Any) -> Any:
        """The engine once its first index is built; reports progress meanwhile (a no-op unless the
        request carried a progressToken). Raises ``ToolError`` when there is no store."""
        if self.engine is None:
            raise ToolError(f"no store ({self.engine_error})")
        assert self.ready is not None
        if not self.ready.is_set():
            step = 0
            while not self.ready.is_set():
                await self._progress(ctx, step, None, f"SLayer: indexing {self.engine.location} ({step} s)")
                with anyio.move_on_after(PROGRESS_EVERY_S):
                    await self.ready.wait()
                step += 1
            await self._progress(ctx, step, step, "SLayer: indexed")
        return self.engine

    @staticmethod
    async def _progress(ctx: Any, progress: float, total: float | None, message: str) -> None:
        try:
            await ctx.session.report_progress(progress, total, message)
        except Exception:  # noqa: BLE001 - progress is a courtesy; the answer still comes
            log.debug("progress notification failed", exc_info=True)

    # ------------------------------------------------------------------ store changes

    def _watch_before_reading(self) -> None:
        from slayer_lsp.watch import watch_before_first_read

        if self.watcher is None and self.engine is not None:
            self.watcher = watch_before_first_read(self.engine, self._on_store_change)

    def _on_store_change(self, paths: set[str]) -> None:
        """Watcher thread: re-read what changed, then announce it on the loop."""
        from slayer_lsp.watch import document_paths

        engine = self.engine
        delta = engine.refresh(document_paths(engine.location, paths))
        after = engine.current()
        self._note_fault(after.catalog.fatal if after is not None else None)
        log.info("store changed (%d path(s)): %d entities touched", len(paths), len(delta.touched))
        self.announce_threadsafe(delta)

    def _note_fault(self, fault: str | None) -> None:
        """Re-read an unreadable store with backoff: no file event may say it is whole again."""
        before, self.store_fault = self.store_fault, fault
        if fault is not None:
            if before is None:
                log.warning("the store cannot be read (%s); answering from the last good snapshot", fault)
            self._retry_s = min(self._retry_s * 2, STORE_RETRY_MAX_S) if before is not None else STORE_RETRY_S
            if self.watcher is not None:
                self.watcher.request_rescan(self._retry_s)
        elif before is not None:
            log.info("the store can be read again")

    def announce_threadsafe(self, delta: Any) -> None:
        if delta is None or delta.empty or self.loop is None:
            return
        future = asyncio.run_coroutine_threadsafe(self.announce(delta), self.loop)
        future.add_done_callback(_log_failure)

    async def announce(self, delta: Any) -> None:
        """Tell the client which resources changed (see the module's docstring)."""
        state = self.engine.current() if self.engine is not None else None
        if state is None or delta is None or delta.empty:
            return
        uris = res.changed_uris(state.catalog, delta)
        session = self.legacy_session
        if session is not None:
            try:
                await session.send_resource_list_changed()
                for uri in sorted(uris & self.subscribed):
                    await session.send_resource_updated(uri)
            except Exception:  # noqa: BLE001 - a client gone is no reason to stop serving
                log.debug("change notification not delivered", exc_info=True)
        await self.bus.publish(ResourcesListChanged())
        for uri in sorted(uris):
            await self.bus.publish(ResourceUpdated(uri))

    # ------------------------------------------------------------------ handlers

    async def on_initialized(self, ctx: Any, params: Any) -> None:
        self.legacy_session = ctx.session  # its notifications ride the connection's own channel

    async def list_tools(self, ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=self._tools)

    async def call_tool(self, ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        self.on_request()
        spec = mt.TOOLS_BY_NAME.get(params.name)
        if spec is None:
            raise MCPError(
                INVALID_PARAMS,
                f"unknown tool {params.name[:100]!r}; the tools are {', '.join(t.name for t in mt.TOOLS)}",
            )
        try:
            args = _checked_arguments(params.arguments)
            try:
                decoded = msgspec.convert(args, spec.params)
            except msgspec.ValidationError as exc:
                raise ToolError(f"invalid arguments: {exc}") from None
            result = await getattr(self, f"tool_{spec.name}")(ctx, decoded)
        except ToolError as exc:
            return types.CallToolResult(
                content=[types.TextContent(text=f"{spec.name}: {exc}")], is_error=True
            )
        data = msgspec.to_builtins(result)
        text = msgspec.json.encode(data).decode()
        return types.CallToolResult(content=[types.TextContent(text=text)], structured_content=data)

    async def list_resources(
        self, ctx: Any, params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        engine = await self._engine_or_error(ctx)
        cursor = params.cursor if params is not None else None
        try:
            items, next_cursor = await asyncio.to_thread(
                lambda: res.page(res.listing(engine.catalog), cursor)
            )
        except res.BadCursor as exc:
            raise MCPError(INVALID_PARAMS, str(exc)) from None
        return types.ListResourcesResult(
            next_cursor=next_cursor,
            resources=[
                types.Resource(
                    uri=r.uri, name=r.name, title=r.title, description=r.description, mime_type=res.MIME
                )
                for r in items
            ],
        )

    async def list_templates(self, ctx: Any, params: Any) -> types.ListResourceTemplatesResult:
        return types.ListResourceTemplatesResult(
            resource_templates=[
                types.ResourceTemplate(uri_template=uri, name=name, description=text, mime_type=res.MIME)
                for uri, name, text in mt.RESOURCE_TEMPLATES
            ]
        )

    async def read_resource(
        self, ctx: Any, params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        self.on_request()
        engine = await self._engine_or_error(ctx)
        text = await asyncio.to_thread(res.read, engine.catalog, params.uri)
        if text is None:
            raise MCPError(INVALID_PARAMS, f"no such resource: {params.uri[:300]!r}")
        return types.ReadResourceResult(
            contents=[types.TextResourceContents(uri=params.uri, mime_type=res.MIME, text=text)]
        )

    async def subscribe(self, ctx: Any, params: types.SubscribeRequestParams) -> types.EmptyResult:
        if len(self.subscribed) < 10_000:  # a client cannot grow this without bound
            self.subscribed.add(params.uri)
        return types.EmptyResult()

    async def unsubscribe(self, ctx: Any, params: types.UnsubscribeRequestParams) -> types.EmptyResult:
        self.subscribed.discard(params.uri)
        return types.EmptyResult()

    async def _engine_or_error(self, ctx: Any) -> Any:
        try:
            return await self.wait_ready(ctx)
        except ToolError as exc:
            raise MCPError(INVALID_PARAMS, str(exc)) from None

    # ------------------------------------------------------------------ tools

    async def tool_search(self, ctx: Any, params: Any) -> Any:
        from slayer_lsp.search.types import SearchError

        engine = await self.wait_ready(ctx)
        cancel = threading.Event()
        try:
            return await asyncio.to_thread(_refusing(SearchError, engine.search), params, cancel)
        except asyncio.CancelledError:  # the request was cancelled: a running cypher_filter is killed
            cancel.set()
            raise

    async def tool_search_facets(self, ctx: Any, params: Any) -> Any:
        from slayer_lsp.search.types import SearchError

        engine = await self.wait_ready(ctx)
        return await asyncio.to_thread(_refusing(SearchError, engine.search_facets), params)

    async def tool_inspect(self, ctx: Any, params: Any) -> mt.InspectResult:
        from slayer_lsp.analysis.inspect import inspect_refs

        if not params.refs:
            raise ToolError("'refs' must list at least one reference")
        if len(params.refs) > mt.MAX_INSPECT_REFS:
            raise ToolError(f"{len(params.refs)} references; at most {mt.MAX_INSPECT_REFS} per call")
        engine = await self.wait_ready(ctx)
        items = await asyncio.to_thread(lambda: inspect_refs(engine.catalog, params.refs))
        return mt.InspectResult(items=items)

    async def tool_status(self, ctx: Any, params: Any) -> mt.McpStatus:
        from slayer_lsp.status import engine_status

        engine = self.engine
        out: dict[str, Any] = {"version": __version__}
        if engine is not None:
            out.update(store=str(engine.location.path), backend=engine.location.backend)
        state = engine.current() if engine is not None else None
        if state is not None:

            def report() -> dict[str, Any]:
                data = msgspec.to_builtins(engine_status(engine))
                data.update(
                    refreshes=engine.stats.refreshes, issues=[str(i) for i in state.catalog.issues][:50]
                )
                return data

            out.update(await asyncio.to_thread(report))
        scope = self.scope
        out.update(
            ready=state is not None and self.ready is not None and self.ready.is_set(),
            indexing=self.indexing,
            server_error=self.engine_error,
            scope=mt.ScopeReport(
                datasources=list(scope.datasources),
                untagged_only=scope.access_tags == (),
                access_tags=list(scope.access_tags) if scope.access_tags else None,
            ),
            watching=str(self.watcher.watching)
            if self.watcher is not None and self.watcher.running
            else None,
            uptime_s=round(time.time() - self.started, 1),
        )
        return msgspec.convert(out, mt.McpStatus, from_attributes=True)

    async def tool_save_memory(self, ctx: Any, params: Any) -> Any:
        from slayer_lsp.writer import scoped as writes

        kwargs = _save_arguments(params)
        engine, state = await self._writable(ctx)

        def work() -> tuple[Any, Any]:
            try:
                saved = writes.save(engine, state, **kwargs)
            except writes.WriteRefused as exc:
                raise ToolError(str(exc)) from None
            return saved, writes.refresh_after_write(engine, saved.touched)

        saved, delta = await asyncio.to_thread(work)
        await self.announce(delta)
        return p.SaveMemoryResult(
            id=saved.id, entities=saved.entities, created=saved.created, warnings=saved.warnings
        )

    async def tool_forget_memory(self, ctx: Any, params: Any) -> Any:
        from slayer_lsp.writer import scoped as writes

        if isinstance(params.id, str) and not params.id.strip():
            raise ToolError("'id' must not be empty")
        engine, state = await self._writable(ctx)

        def work() -> tuple[bool, Any]:
            try:
                forgotten = writes.forget(engine, state, params.id)
            except writes.WriteRefused as exc:
                raise ToolError(str(exc)) from None
            return forgotten, writes.refresh_after_write(engine, None) if forgotten else None

        forgotten, delta = await asyncio.to_thread(work)
        await self.announce(delta)
        return p.ForgetMemoryResult(forgotten=forgotten)

    async def _writable(self, ctx: Any) -> tuple[Any, Any]:
        engine = await self.wait_ready(ctx)
        state = engine.current()
        if state is None or state.catalog.fatal is not None:
            raise ToolError(f"the store cannot be read ({state.catalog.fatal if state else 'not indexed'})")
        return engine, state


def _refusing(error: type[Exception], fn: Any) -> Any:
    """``fn`` with ``error`` (a refused request) turned into a ``ToolError``."""

    def call(*args: Any) -> Any:
        try:
            return fn(*args)
        except error as exc:
            raise ToolError(str(exc)) from None

    return call


def _checked_arguments(arguments: Any) -> dict[str, Any]:
    """A tool call's arguments, refused (``ToolError``) when too large, nested too deeply or
    holding a lone UTF-16 surrogate (no UTF-8 text, file or index can hold one)."""
    if arguments is None:
        return {}
    stack: list[tuple[Any, int, str]] = [(arguments, 0, "arguments")]
    size = 0
    while stack:
        item, depth, path = stack.pop()
        if depth > mt.MAX_ARGUMENT_DEPTH:
            raise ToolError(f"arguments nest deeper than {mt.MAX_ARGUMENT_DEPTH} levels")
        if isinstance(item, str):
            size += len(item)
            if _SURROGATE.search(item):
                raise ToolError(f"{path} holds a lone surrogate (half of a UTF-16 pair): not Unicode text")
        elif isinstance(item, dict):
            for k, v in item.items():
                size += len(k)
                if _SURROGATE.search(k):
                    raise ToolError(f"a key in {path} holds a lone surrogate: not Unicode text")
                stack.append((v, depth + 1, f"{path}.{k[:50]}"))
        elif isinstance(item, list):
            stack.extend((v, depth + 1, f"{path}[{i}]") for i, v in enumerate(item))
        if size > mt.MAX_ARGUMENT_CHARS:
            raise ToolError(f"arguments over {mt.MAX_ARGUMENT_CHARS:,} characters")
    return arguments


def _save_arguments(params: p.SaveMemoryParams) -> dict[str, Any]:
    """The writer's keyword arguments, with SLayer's ``linked_entities`` spelling read as
    ``slayer/saveMemory`` reads it (``SaveMemoryParams.links``)."""
    try:
        entities, query = params.links()
    except ValueError as exc:
        raise ToolError(str(exc)) from None
    return {
        "learning": params.learning,
        "entities": entities,
        "query": query,
        "id": params.id,
        "description": params.description,
    }


def _log_failure(future: concurrent.futures.Future[None]) -> None:
    """Log an announcement that failed (nobody awaits it)."""
    if future.exception():
        log.error("announcing a change failed: %s", future.exception())


def _nothing() -> None:
    return None


def build_server(app: McpApp) -> Server[Any]:
    @asynccontextmanager
    async def lifespan(_: Server[Any]) -> AsyncIterator[McpApp]:
        await app.start()
        try:
            yield app
        finally:
            await app.stop()

    server: Server[Any] = Server(
        "slayer-lsp",
        version=__version__,
        title="SLayer semantic layer",
        instructions=INSTRUCTIONS,
        lifespan=lifespan,
        on_list_tools=app.list_tools,
        on_call_tool=app.call_tool,
        on_list_resources=app.list_resources,
        on_list_resource_templates=app.list_templates,
        on_read_resource=app.read_resource,
        on_subscribe_resource=app.subscribe,
        on_unsubscribe_resource=app.unsubscribe,
        on_subscriptions_listen=app.listen,
    )
    server.add_notification_handler("notifications/initialized", types.NotificationParams, app.on_initialized)
    return server


async def run_stdio(app: McpApp) -> None:
    from mcp.server.stdio import stdio_server

    server = build_server(app)
    options = server.create_initialization_options(NotificationOptions(resources_changed=True))
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, options)
