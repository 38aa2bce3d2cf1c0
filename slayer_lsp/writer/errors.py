"""Why a write did not happen, as a kind a front end can act on (never a message to match)."""

from __future__ import annotations

import enum

__all__ = ["STORE_SIDE", "MemoryWriteError", "WriteErrorKind"]


class WriteErrorKind(enum.StrEnum):
    INVALID = "invalid"  # the request: bad text, id, description or query shape; an id clash
    UNRESOLVED = "unresolved"  # a reference that names nothing the session reaches
    STALE = "stale"  # the store changed since the write was planned (a rename): plan it again
    BUSY = "busy"  # SLayer's lock stayed taken past the timeout
    STORE = "store"  # the store cannot take the write: missing, legacy, unreadable, or an I/O error


STORE_SIDE = frozenset({WriteErrorKind.STALE, WriteErrorKind.BUSY, WriteErrorKind.STORE})


class MemoryWriteError(ValueError):
    """A memory could not be saved, forgotten or renamed. Nothing was written, unless the message
    says a forget deleted the memory and then failed on its clean-up. ``kind`` says whose fault it
    is; ``reference`` names the entity reference that failed to resolve, when that is the reason."""

    def __init__(
        self, message: str, *, kind: WriteErrorKind = WriteErrorKind.INVALID, reference: str | None = None
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.reference = reference

    @property
    def store_side(self) -> bool:
        """The store is at fault (I/O, lock timeout, a legacy or changed store), not the request."""
        return self.kind in STORE_SIDE
