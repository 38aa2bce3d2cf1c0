"""The stdio transport: LSP base-protocol framing that a broken or hostile client cannot wedge.

pygls' own read loop believes every header: a ``Content-Length`` of 10**15 is a ``MemoryError`` that
ends the process, a header line without a newline is buffered whole, a header spelled
``content-length`` is skipped, and once one frame is off every later message is read as junk. This
loop instead:

* reads one frame at a time on a worker thread, header lines with a length limit, header names
  case-insensitively, and finds ``Content-Length:`` even after junk on the same line (the tail of a
  frame whose length was wrong), so the stream falls back in step at the next well-formed header;
* drops a body over ``MAX_MESSAGE_BYTES`` in chunks (memory stays bounded) and says so;
* answers a frame it cannot use (no length, a body that is not UTF-8 JSON or nests too deep for the
  decoder) with a JSON-RPC error whose id is null, as JSON-RPC 2.0 asks for a parse error;
* stops at end of input (or at ``exit``), never spinning on a closed stream.

Everything after the JSON decode is the protocol's ``handle_message``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, BinaryIO

log = logging.getLogger(__name__)

MAX_HEADER_LINE = 8192  # bytes read per header line; a longer line is read as several junk lines
MAX_MESSAGE_BYTES = 64 * 1024 * 1024  # a larger body is dropped unread (64 MiB of JSON is ~0.5 GB of objects)
_CHUNK = 1 << 20
_LENGTH = re.compile(rb"content-length[ \t]*:[ \t]*(\S*)", re.IGNORECASE)
PARSE_ERROR = -32700


@dataclass(frozen=True, slots=True)
class Frame:
    """One framed message: its body, or why there is none to use."""

    body: bytes | None
    problem: str | None = None


class FrameReader:
    """Blocking reads of whole frames from a binary stream (called on a worker thread)."""

    def __init__(self, stream: BinaryIO) -> None:
        self.stream = stream

    def next_frame(self) -> Frame | None:
        """The next frame, or None at end of input."""
        length: int | None = None
        problem: str | None = None
        in_headers = False
        while True:
            line = self.stream.readline(MAX_HEADER_LINE)
            if not line:
                return None
            if line in (b"\r\n", b"\n"):
                if in_headers:
                    break
                continue  # blank lines between frames carry nothing
            in_headers = True
            match = _LENGTH.search(line)
            if match is None:
                continue  # Content-Type, or junk
            value = match.group(1)
            if value.isdigit():
                length, problem = int(value), None
            else:
                length, problem = None, f"Content-Length {value[:40].decode('latin-1')!r} is not a byte count"
        if length is None:
            return Frame(None, problem or "a message without a Content-Length header")
        if length > MAX_MESSAGE_BYTES:
            if not self._skip(length):
                return None
            return Frame(
                None,
                f"a message of {length} bytes is over the limit of {MAX_MESSAGE_BYTES} bytes; it was dropped",
            )
        body = self.stream.read(length)
        if len(body) < length:
            return None  # the stream ended inside the body
        return Frame(body)

    def _skip(self, n: int) -> bool:
        while n > 0:
            got = self.stream.read(min(n, _CHUNK))
            if not got:
                return False
            n -= len(got)
        return True


async def serve_stream(server: Any, stdin: BinaryIO, on_frame: Callable[[], None] | None = None) -> None:
    """Read frames from ``stdin`` and hand each decoded message to ``server.protocol`` until the input
    ends or the server is stopped. The protocol's writer must be set already; ``on_frame`` is told
    of every frame as it arrives (the idle collector's clock)."""
    loop = asyncio.get_running_loop()
    reader = FrameReader(stdin)
    protocol = server.protocol
    stop = server._stop_event
    while stop is None or not stop.is_set():
        frame = await loop.run_in_executor(server.thread_pool, reader.next_frame)
        if frame is None:
            log.info("end of input: the client closed the connection")
            break
        if on_frame is not None:
            on_frame()
        if frame.body is None:
            parse_error(protocol, frame.problem or "unreadable frame")
            continue
        try:
            message = json.loads(frame.body)
        except RecursionError:
            parse_error(protocol, "the message nests too deeply to decode")
            continue
        except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
            parse_error(protocol, f"the message is not UTF-8 JSON: {exc}")
            continue
        try:
            protocol.handle_message(message)
        except Exception:  # noqa: BLE001 - a protocol that lets one through must not end the session
            log.exception("a message could not be handled")


def parse_error(protocol: Any, reason: str) -> None:
    log.warning("JSON-RPC parse error: %s", reason)
    protocol._send_data(
        {"jsonrpc": "2.0", "id": None, "error": {"code": PARSE_ERROR, "message": f"Parse error: {reason}"}}
    )
