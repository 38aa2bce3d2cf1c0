"""The JSON-RPC errors the server answers with, each built in one place.

A refused request names its method first (``slayer/saveMemory: ...``). Whose fault it is picks the
code: the request's (-32602 InvalidParams) or the store's or the moment's (-32803 RequestFailed).
A custom request's handler raises ``Refused`` (or lets the writer's ``WriteRefused`` through) with
the reason alone; ``answering``, where the handler is registered, adds the method. A refused write
carries the writer's ``WriteErrorKind``; ``WRITE_ERROR_CODES`` is the only place a kind becomes a
code.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from typing import Protocol, TypeVar

from lsprotocol import types as t
from pygls.exceptions import JsonRpcException, JsonRpcInvalidParams

from slayer_lsp.writer.errors import WriteErrorKind
from slayer_lsp.writer.scoped import WriteRefused

log = logging.getLogger(__name__)

INVALID_PARAMS = t.ErrorCodes.InvalidParams.value
REQUEST_FAILED = t.LSPErrorCodes.RequestFailed.value

WRITE_ERROR_CODES: dict[WriteErrorKind, int] = {
    WriteErrorKind.INVALID: INVALID_PARAMS,  # the request: bad text, id, description or query shape
    WriteErrorKind.UNRESOLVED: INVALID_PARAMS,  # a reference that names nothing the session reaches
    WriteErrorKind.STALE: REQUEST_FAILED,  # the store changed since the write was planned
    WriteErrorKind.BUSY: REQUEST_FAILED,  # SLayer's lock stayed taken
    WriteErrorKind.STORE: REQUEST_FAILED,  # missing, legacy or unreadable store, or an I/O error
}
R = TypeVar("R")


class KindedWriteError(Protocol):
    """A refused write: ``writer.scoped.WriteRefused`` or ``writer.errors.MemoryWriteError``."""

    kind: WriteErrorKind


def invalid_params(method: str, reason: str) -> JsonRpcInvalidParams:
    return JsonRpcInvalidParams(f"{method}: {reason}")


def request_failed(message: str) -> JsonRpcException:
    """A request the client got right that cannot be done now (the client shows the message)."""
    return JsonRpcException(message, code=REQUEST_FAILED)


def write_error(method: str, exc: KindedWriteError) -> JsonRpcException:
    """A refused write as a JSON-RPC error carrying the writer's message, its code from its kind."""
    code = WRITE_ERROR_CODES[exc.kind]
    if code == INVALID_PARAMS:
        return invalid_params(method, str(exc))
    log.warning("%s refused by the store: %s", method, exc)
    return JsonRpcException(f"{method}: {exc}", code=code)


class Refused(Exception):
    """A request its handler refuses, with the reason and the code; ``answering`` names the method."""

    def __init__(self, reason: str, *, code: int = INVALID_PARAMS) -> None:
        super().__init__(reason)
        self.code = code

    def at(self, method: str) -> JsonRpcException:
        if self.code == INVALID_PARAMS:
            return invalid_params(method, str(self))
        return JsonRpcException(f"{method}: {self}", code=self.code)


async def answering(method: str, call: Awaitable[R]) -> R:
    """The answer of a custom request's handler, its refusals as JSON-RPC errors of ``method``."""
    try:
        return await call
    except Refused as exc:
        raise exc.at(method) from exc
    except WriteRefused as exc:
        raise write_error(method, exc) from exc
