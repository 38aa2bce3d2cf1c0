"""Memory writes as a session makes them: the writer under the session's scope, then a refresh.

Shared by the front ends that write (the language server's ``slayer/saveMemory`` and
``slayer/forgetMemory``, the MCP server's ``save_memory`` and ``forget_memory``) so that a scoped
session is refused the same way whichever protocol it speaks. Each front end only maps
``WriteRefused`` to its own error shape (its ``kind`` tells a bad request from a failing store).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from slayer_lsp.writer.errors import STORE_SIDE, MemoryWriteError, WriteErrorKind

log = logging.getLogger(__name__)


class WriteRefused(Exception):
    """A write that did not happen, with the writer's message and its ``kind``."""

    def __init__(self, message: str, *, kind: WriteErrorKind = WriteErrorKind.INVALID) -> None:
        super().__init__(message)
        self.kind = kind

    @classmethod
    def of(cls, exc: MemoryWriteError) -> WriteRefused:
        return cls(str(exc), kind=exc.kind)

    @property
    def store_side(self) -> bool:
        """The store is at fault (I/O, lock timeout, a legacy or changed store), not the request."""
        return self.kind in STORE_SIDE


@dataclass(frozen=True)
class Saved:
    id: str
    entities: list[str]
    created: bool
    warnings: list[str]
    touched: list[str] | None  # the paths written, for the refresh (None: re-list the store)


def reachable_memories(state: Any) -> frozenset[str] | None:
    """A scoped session's memory ids (what its writes may name), None without a scope."""
    return None if state.full is None else frozenset(state.catalog.memories)


def refuse_withheld_upsert(state: Any, memory_id: Any) -> None:
    """Under a scope, an upsert of one of the session's memories whose stored links the session does
    not see (links to memories it cannot reach, or to none) would drop them: SLayer's
    ``HiddenContentConflictError``. Any other id is the writer's to refuse (``scoped_id_refusal``:
    the same answer for a free id and a hidden memory's). References are resolved against the
    reachable catalog anyway, so a new memory can name only what the session reaches."""
    from slayer_lsp.writer.memories import normalize_memory_id

    if state.full is None or memory_id is None:
        return
    try:
        mid = normalize_memory_id(memory_id)
    except MemoryWriteError:
        return  # the writer refuses it with its own message
    seen, stored = state.catalog.memory(mid), state.full.memory(mid)
    if seen is not None and stored is not None and seen.entities != stored.entities:
        raise WriteRefused(
            f"The change to memory {mid!r} conflicts with parts of it you "
            f"cannot access. Ask a caller with full access to make this change."
        )


def refresh_after_write(engine: Any, changed: list[str] | None) -> object | None:
    """Bring the engine up to date after a write; returns the delta. The write is done whatever
    happens here: a failed refresh is logged (the watcher retries) and answers None."""
    try:
        return engine.refresh(changed)
    except Exception:  # noqa: BLE001
        log.exception("refresh after a memory write failed; the store watcher will pick the change up")
        return None


def save(
    engine: Any,
    state: Any,
    *,
    learning: str,
    entities: list[str] | None,
    query: dict[str, Any] | None,
    id: str | int | None,
    description: str | None,
) -> Saved:
    """Save (or upsert) a memory exactly as SLayer would, within the session's scope (blocking: run it
    off the event loop). Raises ``WriteRefused``."""
    from slayer_lsp.writer.memories import save_memory

    refuse_withheld_upsert(state, id)
    try:
        saved = save_memory(
            engine.location,
            state.catalog,
            learning=learning,
            entities=entities,
            query=query,
            id=id,
            description=description,
            reachable=reachable_memories(state),
        )
    except MemoryWriteError as exc:
        raise WriteRefused.of(exc) from exc
    touched = None
    if engine.location.backend == "yaml":
        touched = [str(engine.location.path / "memories" / f"{saved.id}.md")]
    return Saved(saved.id, list(saved.entities), saved.created, list(saved.warnings), touched)


def forget(engine: Any, state: Any, memory_id: str | int) -> bool:
    """Forget a memory as SLayer would; False (nothing touched) when the session has no such memory,
    hidden and missing alike. Raises ``WriteRefused``."""
    from slayer_lsp.writer.memories import forget_memory

    try:
        return forget_memory(engine.location, state.catalog, memory_id, reachable=reachable_memories(state))
    except MemoryWriteError as exc:
        raise WriteRefused.of(exc) from exc


def rename_rows(engine: Any, store: Any, renamed: str) -> None:
    """Write a SQLite store's part of a rename (``analysis.rename.StoreRename``): every row in one
    transaction, or none (blocking: run it off the event loop). Raises ``WriteRefused``."""
    from slayer_lsp.writer.renames import rename_rows as write_rows

    if str(engine.location.path) != store.db:
        raise WriteRefused(
            f"the rename was planned for {store.db}, and the session's store is now "
            f"{engine.location.path}; rename again",
            kind=WriteErrorKind.STALE,
        )
    try:
        write_rows(store.db, store.rows, [renamed])
    except MemoryWriteError as exc:
        raise WriteRefused(str(exc), kind=exc.kind if exc.store_side else WriteErrorKind.STALE) from exc
