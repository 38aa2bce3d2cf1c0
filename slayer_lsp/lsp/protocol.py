"""JSON-RPC message checks: what a client sends is checked here, once, before pygls dispatches it.

``SlayerProtocol`` answers every request with a usable id exactly once and lets nothing a client
sends raise out of the read loop; ``converter`` keeps ``slayer/*`` params as the plain JSON they
arrived as, for ``lsp.params`` to decode. A ``slayer/*`` answer comes back already encoded
(``encoded``, in the handler's worker thread) and is written as it is: pygls would walk it value by
value with cattrs and encode it again on the event loop, a third of a search's round trip.
"""

from __future__ import annotations

import logging
import re
import threading
from typing import Any

import msgspec
from cattrs import Converter
from lsprotocol import types as t
from pygls.exceptions import JsonRpcException, JsonRpcInternalError
from pygls.protocol import LanguageServerProtocol, default_converter
from pygls.protocol.json_rpc import JsonRPCRequestMessage

log = logging.getLogger(__name__)

MAX_NESTING = 100  # levels of arrays and objects in one message; real LSP traffic needs about a dozen
INVALID_REQUEST = t.ErrorCodes.InvalidRequest.value
INVALID_PARAMS = t.ErrorCodes.InvalidParams.value
SERVER_NOT_INITIALIZED = t.ErrorCodes.ServerNotInitialized.value
CUSTOM_PREFIX = "slayer/"  # the methods whose params stay plain JSON

_SURROGATE = re.compile("[\ud800-\udfff]")  # after JSON decoding, any surrogate left is a lone one


def json_type(value: Any) -> str:
    """A JSON value's kind as a message says it ("a string", "null")."""
    return {
        type(None): "null",
        bool: "a boolean",
        int: "a number",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "an object",
    }.get(type(value), type(value).__name__)


def converter() -> Converter:
    """pygls' converter, except that ``slayer/*`` params stay plain dicts: the default turns untyped
    params into namedtuples, renaming keys that are not identifiers (a query's ``order`` shorthand
    ``{"stores.name": "desc"}`` would lose its key)."""
    conv = default_converter()
    base = conv.get_structure_hook(JsonRPCRequestMessage)

    def hook(obj: dict[str, Any], cls: type) -> Any:
        if isinstance(obj, dict) and str(obj.get("method", "")).startswith(CUSTOM_PREFIX):
            return cls(**{"params": None, **obj})  # params may be omitted
        return base(obj, cls)

    conv.register_structure_hook(JsonRPCRequestMessage, hook)
    return conv


_encode = msgspec.json.Encoder().encode


def encoded(result: Any) -> msgspec.Raw:
    """A request's result as JSON, encoded once where it is made (msgspec structs and builtins);
    ``SlayerProtocol`` writes it into the response as it is."""
    return msgspec.Raw(_encode(result))


class _WrittenEarly:
    """What a handler returns when its worker thread has written the answer already."""

    def __repr__(self) -> str:
        return "WRITTEN_EARLY"


WRITTEN_EARLY: Any = _WrittenEarly()


def valid_id(value: Any) -> bool:
    return isinstance(value, (int, str)) and not isinstance(value, bool)


def structure_problem(exc: Exception) -> str:
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


def too_deep(value: Any, limit: int) -> bool:
    """Whether arrays and objects nest more than ``limit`` levels (iteratively: no recursion limit)."""
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        children = item.values() if isinstance(item, dict) else item
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return False


def lone_surrogate(value: Any) -> str | None:
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


def scrubbed(value: Any) -> Any:
    """``value`` with each lone surrogate replaced by U+FFFD (one UTF-16 unit for one: document
    positions keep their meaning), for notifications, which cannot be answered with an error."""
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {scrubbed(k): scrubbed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [scrubbed(v) for v in value]
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
        # requests whose worker thread may write the answer itself (``early_answer``): id -> "running",
        # "written" (by the worker), or "answered" (by the loop first: cancelled; the worker must not)
        self._early: dict[Any, str] = {}
        self._early_lock = threading.Lock()

    def early_answer(self) -> Any:
        """On the event loop, in a request's handler: the request's id, registered so that its worker
        thread may write the answer the moment it is made (``write_early``), without waiting for the
        loop to wake up (~0.3 ms after an idle spell). None outside a request."""
        msg_id = self._ctx_msg_id.get(None)
        if msg_id is not None:
            with self._early_lock:
                self._early[msg_id] = "running"
        return msg_id

    def write_early(self, msg_id: Any, result: msgspec.Raw) -> bool:
        """From the worker thread: write the answer now, unless the loop has answered the request
        already (it was cancelled). Exactly one of the two answers."""
        with self._early_lock:
            if self._early.get(msg_id) != "running":
                self._early.pop(msg_id, None)
                return False
            self._early[msg_id] = "written"
        self._send_encoded(b'{"jsonrpc":"2.0","id":%b,"result":%b}' % (_encode(msg_id), result))
        return True

    def end_early(self, msg_id: Any) -> None:
        """From the worker thread, when it wrote nothing (it failed): the loop answers as usual."""
        with self._early_lock:
            if self._early.get(msg_id) != "written":
                self._early.pop(msg_id, None)

    def structure_message(self, data: dict[str, Any]) -> Any:
        return data  # the decoder's object hook: see handle_message

    def handle_message(self, message: Any) -> None:
        try:
            checked = self._checked(message)
            if checked is not None:
                super().handle_message(checked)
        except Exception:  # noqa: BLE001 - one bad message must not end the read loop (exit's SystemExit does)
            log.exception("dropped a message that could not be handled")

    def _send_response(self, msg_id: Any, result: Any = None, error: Any = None) -> None:
        if self._early:
            with self._early_lock:
                state = self._early.get(msg_id)
                if state == "written":  # the worker wrote the answer; a cancel that came after is moot
                    del self._early[msg_id]
                    self._result_types.pop(msg_id, None)
                    return
                if state == "running":  # answered here first: the worker's answer is dropped
                    self._early[msg_id] = "answered"
        if result is WRITTEN_EARLY:  # registered by another protocol (never here): nothing to send
            log.error("request %r: an answer written early was lost", msg_id)
            return
        if error is None and isinstance(result, msgspec.Raw):
            self._result_types.pop(msg_id, None)
            self._send_encoded(b'{"jsonrpc":"2.0","id":%b,"result":%b}' % (_encode(msg_id), result))
            return
        super()._send_response(msg_id, result, error)

    def _send_encoded(self, body: bytes) -> None:
        """One message already encoded, framed as pygls frames its own (``Content-Length`` in bytes)."""
        if self.writer is None:
            log.error("cannot send a response: no transport")
            return
        header = f"Content-Length: {len(body)}\r\nContent-Type: {self.CONTENT_TYPE}; charset={self.CHARSET}\r\n\r\n"
        try:
            self.writer.write(header.encode("ascii") + body if self._include_headers else body)
        except BrokenPipeError:
            log.exception("cannot send a response: the client closed its end")
            raise
        except Exception as error:  # noqa: BLE001 - as pygls: reported, the read loop goes on
            log.exception("cannot send a response")
            self._server._report_server_error(error, JsonRpcInternalError)

    def reply_error(self, msg_id: Any, code: int, message: str) -> None:
        """An error response written as plain JSON (lsprotocol would drop a null id from it)."""
        self._send_data({"jsonrpc": "2.0", "id": msg_id, "error": {"code": code, "message": message}})

    def _checked(self, message: Any) -> Any:
        """The structured message to dispatch, or None when it was answered or dropped here."""
        if isinstance(message, list):
            reason = "batches are not supported by the Language Server Protocol; send each message on its own"
            ids = [
                m["id"] for m in message if isinstance(m, dict) and "method" in m and valid_id(m.get("id"))
            ]
            for msg_id in dict.fromkeys(ids) if ids else [None]:
                self.reply_error(msg_id, INVALID_REQUEST, reason)
            return None
        if not isinstance(message, dict):
            self.reply_error(
                None, INVALID_REQUEST, f"a message must be a JSON object, not {json_type(message)}"
            )
            return None
        if "method" not in message:
            return self._response(message)
        method, is_request, msg_id = message["method"], "id" in message, message.get("id")

        def refuse(code: int, reason: str) -> None:
            if is_request:
                self.reply_error(msg_id if valid_id(msg_id) else None, code, reason)
            else:
                log.warning("dropped a notification: %s", reason)

        if is_request and not valid_id(msg_id):
            return refuse(
                INVALID_REQUEST, f"a request id must be an integer or a string, not {json_type(msg_id)}"
            )
        if message.get("jsonrpc") != "2.0":
            return refuse(INVALID_REQUEST, 'not a JSON-RPC 2.0 message ("jsonrpc" must be "2.0")')
        if not isinstance(method, str):
            return refuse(INVALID_REQUEST, f"the method must be a string, not {json_type(method)}")
        method = method[:200]  # echoed in errors: a megabyte of method name is not echoed back
        if too_deep(message, MAX_NESTING):
            return refuse(INVALID_PARAMS, f"{method}: params nest deeper than {MAX_NESTING} levels")
        where = lone_surrogate(message.get("params"))
        if where is not None:
            if is_request:
                return refuse(
                    INVALID_PARAMS,
                    f"{method}: {where} holds a lone surrogate (half of a UTF-16 pair: "
                    f"not Unicode text); send a character outside the BMP as a pair",
                )
            log.warning("%s: %s holds a lone surrogate; replaced with U+FFFD", method, where)
            message = {**message, "params": scrubbed(message["params"])}
        if method != t.EXIT:
            if self.shutdown_seen:
                return refuse(
                    INVALID_REQUEST, f"{method}: the server is shutting down; only exit is accepted"
                )
            if method == t.INITIALIZE and self.initialize_seen:
                return refuse(INVALID_REQUEST, "initialize may be sent only once")
            if method != t.INITIALIZE and not self.initialize_seen:
                return refuse(
                    SERVER_NOT_INITIALIZED, f"{method}: the server is not initialized; send initialize first"
                )
        if "result" in message or "error" in message:
            # a message with a method is a request or a notification whatever else it carries;
            # pygls would read one with an ``error`` (even null) as a response and never answer it
            message = {k: v for k, v in message.items() if k not in ("result", "error")}
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
        if (
            message.get("jsonrpc") != "2.0"
            or not valid_id(message.get("id"))
            or not ("result" in message or "error" in message)
        ):
            log.warning("dropped a message that is no request, notification or response: %.200r", message)
            return None
        if lone_surrogate(message.get("result")) is not None:
            message = {**message, "result": scrubbed(message["result"])}
        return self._structure(message)

    def _structure(self, data: dict[str, Any]) -> Any:
        try:
            return super().structure_message(data)
        except JsonRpcException as exc:
            method = data.get("method")
            reason = f"{str(method)[:200]}: invalid params ({structure_problem(exc)})"
            if "id" in data and method is not None:
                self.reply_error(data["id"], INVALID_PARAMS, reason)
            else:
                log.warning("dropped a message: %s", reason)
            return None
