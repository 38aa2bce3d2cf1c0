"""The ``slayer/*`` requests (and ``slayer.applyStoreRename``), on params already decoded into their
``protocol_types`` or ``search`` types (``lsp.custom_requests`` registers and decodes).

A handler raises ``Refused`` with the reason alone (the method is added where it is registered).
Search, inspect and impact wait for the first index; status answers at once. A write is followed
by a refresh of the engine before the answer, so the next request sees it without waiting for the
watcher.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec

from slayer_lsp import __version__
from slayer_lsp import protocol_types as p
from slayer_lsp.analysis import impact as imp
from slayer_lsp.analysis import navigation as nav
from slayer_lsp.lsp import convert
from slayer_lsp.lsp.errors import REQUEST_FAILED, Refused
from slayer_lsp.lsp.protocol import WRITTEN_EARLY, SlayerProtocol, encoded
from slayer_lsp.lsp.state import SlayerLanguageServer

if TYPE_CHECKING:
    from slayer_lsp.engine import Engine, State
    from slayer_lsp.search.facet_ranking import SearchFacetsParams
    from slayer_lsp.search.types import SearchParams


async def _engine(ls: SlayerLanguageServer) -> Engine:
    """The engine once the first index is done; a session without a store refuses the request."""
    if not await ls.ready():
        raise Refused(f"no store ({ls.engine_error})")
    return ls.live_engine()


async def _writable(ls: SlayerLanguageServer) -> tuple[Engine, State]:
    if not await ls.ready():
        raise Refused(f"no store ({ls.engine_error})", code=REQUEST_FAILED)
    state = ls.current_state()
    if state is None or state.catalog.fatal is not None:
        reason = state.catalog.fatal if state is not None else "not indexed"
        raise Refused(f"the store cannot be read ({reason})", code=REQUEST_FAILED)
    return ls.live_engine(), state


async def _answered_from_worker(ls: SlayerLanguageServer, work: Callable[[], msgspec.Raw]) -> msgspec.Raw:
    """``work`` on a worker thread, whose answer that thread writes as soon as it is made: the event
    loop, idle meanwhile, would take ~0.3 ms to wake up and write it (read-only requests only: a
    writer's follow-up runs on the loop after its answer)."""
    protocol = ls.protocol
    assert isinstance(protocol, SlayerProtocol)
    msg_id = protocol.early_answer()

    def run() -> msgspec.Raw:
        written = False
        try:
            answer = work()
            written = msg_id is not None and protocol.write_early(msg_id, answer)
            return WRITTEN_EARLY if written else answer
        finally:
            if msg_id is not None and not written:
                protocol.end_early(msg_id)

    return await asyncio.to_thread(run)


async def search(ls: SlayerLanguageServer, params: SearchParams) -> msgspec.Raw:
    from slayer_lsp.search.types import SearchError

    engine = await _engine(ls)
    cancel = threading.Event()

    def work() -> msgspec.Raw:
        try:
            return encoded(engine.search(params, cancel))
        except SearchError as exc:
            raise Refused(str(exc)) from exc

    try:
        return await _answered_from_worker(ls, work)
    except asyncio.CancelledError:  # $/cancelRequest or shutdown: a running cypher_filter is killed
        cancel.set()
        raise


async def search_facets(ls: SlayerLanguageServer, params: SearchFacetsParams) -> msgspec.Raw:
    from slayer_lsp.search.types import SearchError

    engine = await _engine(ls)

    def work() -> msgspec.Raw:
        try:
            return encoded(engine.search_facets(params))
        except SearchError as exc:
            raise Refused(str(exc)) from exc

    return await _answered_from_worker(ls, work)


async def inspect(ls: SlayerLanguageServer, params: p.InspectRequestParams) -> msgspec.Raw:
    """Each reference's item with its store location."""
    from slayer_lsp.analysis.inspect import inspect_refs

    try:
        refs = params.wanted()
    except ValueError as exc:
        raise Refused(str(exc)) from exc
    engine = await _engine(ls)

    def work() -> msgspec.Raw:
        catalog = engine.catalog
        items = [
            convert.located_item(
                ls, item, nav.entity_location(catalog, item.canonical) if item.canonical else None
            )
            for item in inspect_refs(catalog, refs)
        ]
        return encoded(p.InspectResult(items=items))

    return await _answered_from_worker(ls, work)


async def impact(ls: SlayerLanguageServer, params: p.ImpactParams) -> msgspec.Raw:
    if not params.entity:
        raise Refused("'entity' must be a canonical id (a non-empty string)")
    engine = await _engine(ls)
    snaps = ls.open_snapshots()

    def work() -> msgspec.Raw:
        try:
            found = imp.impact(engine.catalog, params.entity, ls.workspace_docs(snaps))
        except imp.ImpactError as exc:
            raise Refused(str(exc)) from exc
        return encoded(convert.impact_result(ls, found))

    return await _answered_from_worker(ls, work)


async def status(ls: SlayerLanguageServer, params: p.StatusParams) -> msgspec.Raw:
    """``slayer-lsp status``'s report of the engine (once the first index is done) plus what only the
    server knows: readiness, options, open documents, the watcher. Answers at once, even mid-index."""
    from slayer_lsp.status import engine_status

    engine = ls.engine
    state = ls.current_state()
    out: dict[str, Any] = {"version": __version__}
    if engine is not None:
        out.update(store=str(engine.location.path), backend=engine.location.backend)
    if engine is not None and state is not None:

        def report() -> dict[str, Any]:
            data: dict[str, Any] = msgspec.to_builtins(engine_status(engine))
            stats = engine.stats
            data.update(
                refreshes=stats.refreshes,
                last_delta_size=stats.last_delta_size,
                issues=[str(i) for i in state.catalog.issues][:50],
            )
            return data

        if engine.dense is None and state.catalog.kind_counts is not None:
            out.update(report())  # nothing to wait for or count: a thread's two wake-ups cost more
        else:  # the embedding worker's lock, or a first count of every entity
            out.update(await asyncio.to_thread(report))
    scope = ls.session_scope()
    out.update(
        {
            "ready": state is not None,
            "indexing": ls.indexing,
            "server_error": ls.engine_error,
            "options": {
                **ls.options.to_dict(),
                "scope": {
                    "datasources": list(scope.datasources),
                    "accessTags": list(scope.access_tags or ()),
                    "untaggedOnly": scope.access_tags == (),
                    "fixedBy": "command line" if ls.cli_scope is not None else None,
                },
            },
            "option_problems": list(ls.option_problems),
            "open_documents": len(ls.workspace.text_documents),
            "watching": str(ls.watcher.watching) if ls.watcher is not None and ls.watcher.running else None,
            "uptime_s": round(time.time() - ls.started, 1),
        }
    )
    return encoded(out)


async def save_memory(ls: SlayerLanguageServer, params: p.SaveMemoryParams) -> msgspec.Raw:
    """Save (or upsert) a memory exactly as SLayer would, then refresh the engine so that the next
    search, hover or diagnostic sees it."""
    from slayer_lsp.writer import scoped as writes

    try:
        entities, query = params.links()
    except ValueError as exc:
        raise Refused(str(exc)) from exc
    engine, state = await _writable(ls)

    def work() -> msgspec.Raw:
        saved = writes.save(
            engine,
            state,
            learning=params.learning,
            entities=entities,
            query=query,
            id=params.id,
            description=params.description,
        )
        writes.refresh_after_write(engine, saved.touched)
        return encoded(
            p.SaveMemoryResult(
                id=saved.id, entities=saved.entities, created=saved.created, warnings=saved.warnings
            )
        )

    result = await asyncio.to_thread(work)
    ls.diagnostics.republish_all()
    return result


async def forget_memory(ls: SlayerLanguageServer, params: p.ForgetMemoryParams) -> msgspec.Raw:
    """Forget a memory (and its ``memory:<id>`` tags on other memories, and its embedding rows) as
    SLayer would, then refresh the engine. ``{"forgotten": false}`` when no such memory exists."""
    from slayer_lsp.writer import scoped as writes

    engine, state = await _writable(ls)

    def work() -> msgspec.Raw:
        # outside the session's scope (hidden, or a file that does not load): as if there were none
        forgotten = writes.forget(engine, state, params.id)
        if forgotten:
            writes.refresh_after_write(engine, None)  # other memories may have lost a tag: re-list them all
        return encoded(p.ForgetMemoryResult(forgotten=forgotten))

    result = await asyncio.to_thread(work)
    ls.diagnostics.republish_all()
    return result


async def apply_store_rename(ls: SlayerLanguageServer, args: tuple[Any, ...]) -> dict[str, Any]:
    """Write the pending store part of a rename in a SQLite store (the code action's command): all its
    rows in one transaction, then refresh the engine. Only the last planned rename is pending; it is
    written once."""
    from slayer_lsp.writer import scoped as writes

    if len(args) != 1 or not isinstance(args[0], str):
        raise Refused("expected one argument, the plan id of a rename")
    pending = ls.store_rename
    if pending is None or pending[0] != args[0]:
        raise Refused(
            f"no pending store rename {args[0]!r} (only the last rename planned in a SQLite store is "
            f"pending, once): rename again"
        )
    plan = pending[1]
    store = plan.store
    assert store is not None  # only a plan with store rows is kept pending
    engine, _state = await _writable(ls)

    def work() -> dict[str, Any]:
        writes.rename_rows(engine, store, plan.entity)
        writes.refresh_after_write(engine, None)
        return {
            "entity": plan.entity,
            "new_entity": plan.new_entity,
            "models": store.models,
            "memories": store.memories,
        }

    try:
        result = await asyncio.to_thread(work)
    finally:
        if ls.store_rename is pending:
            ls.store_rename = None  # written, or refused: planned again from the store as it is now
    ls.diagnostics.republish_all()
    return result
