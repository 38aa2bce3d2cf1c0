"""The JSON-RPC errors the server answers with, each built in one place.

A refused request names its method first (``slayer/saveMemory: ...``). Whose fault it is picks the
code: the request's (-32602 InvalidParams) or the store's or the moment's (-32803 RequestFailed).
A refused write carries the writer's ``WriteErrorKind``; ``WRITE_ERROR_CODES`` is the only place
a kind becomes a code.
"""

from __future__ import annotations

import logging
from typing import Protocol

from lsprotocol import types as t
from pygls.exceptions import JsonRpcException, JsonRpcInvalidParams

from slayer_lsp.writer.errors import WriteErrorKind

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

