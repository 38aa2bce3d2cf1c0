"""The stdio transport: LSP base-protocol framing that a broken or hostile client cannot wedge.

pygls' own read loop believes every header: a ``Content-Length`` of 10**15 is a ``MemoryError`` that
ends the process, a header line without a newline is buffered whole, a header spelled
``content-length`` is skipped, and once one frame is off every later message is read as junk. This
loop instead:

* reads stdin on the event loop (a worker thread where the loop cannot: a file, a terminal), header
  lines with a length limit, header names case-insensitively, and finds ``Content-Length:`` even after junk on the same line (the tail of a
  frame whose length was wrong), so the stream falls back in step at the next well-formed header;
* drops a body over ``MAX_MESSAGE_BYTES`` in chunks (memory stays bounded) and says so;
* answers a frame it cannot use (no length, a body that is not UTF-8 JSON or nests too deep for the
  decoder) with a JSON-RPC error whose id is null, as JSON-RPC 2.0 asks for a parse error;
* stops at end of input (or at ``exit``), never spinning on a closed stream.

Everything after the JSON decode is the protocol's ``handle_message``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import stat
from collections import deque
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


class FrameParser:
    """Whole frames out of bytes as they arrive, whatever their chunking (no I/O here): the event
    loop's stdin reader and the thread reader feed it alike."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._in_headers = False
        self._length: int | None = None  # the frame's Content-Length, once read
        self._problem: str | None = None  # why its Content-Length cannot be used
        self._body: int | None = None  # the headers are done: this many body bytes are wanted
        self._skip = 0  # bytes of an oversized body still to drop
        self._over = 0  # that body's length, for the error

    def feed(self, data: bytes) -> list[Frame]:
        """The frames ``data`` completes, in order (often none, or several at once)."""
        buf = self._buf
        buf += data
        frames: list[Frame] = []
        while True:
            if self._skip:
                dropped = min(self._skip, len(buf))
                del buf[:dropped]
                self._skip -= dropped
                if self._skip:
                    return frames
                limit = f"over the limit of {MAX_MESSAGE_BYTES} bytes"
                frames.append(Frame(None, f"a message of {self._over} bytes is {limit}; it was dropped"))
            elif self._body is not None:
                wanted = self._body
                if len(buf) < wanted:
                    return frames
                frames.append(Frame(bytes(buf[:wanted])))
                del buf[:wanted]
                self._body = None
            else:
                end = buf.find(b"\n", 0, MAX_HEADER_LINE)
                if end < 0 and len(buf) < MAX_HEADER_LINE:
                    return frames  # the line is not complete yet
                cut = end + 1 if end >= 0 else MAX_HEADER_LINE  # a longer line is read as junk pieces
                line = bytes(buf[:cut])
                del buf[:cut]
                frame = self._header_line(line)
                if frame is not None:
                    frames.append(frame)

    def _header_line(self, line: bytes) -> Frame | None:
        if line in (b"\r\n", b"\n"):
            if not self._in_headers:
                return None  # blank lines between frames carry nothing
            length, problem = self._length, self._problem
            self._in_headers, self._length, self._problem = False, None, None
            if length is None:
                return Frame(None, problem or "a message without a Content-Length header")
            if length > MAX_MESSAGE_BYTES:
                self._skip = self._over = length
            else:
                self._body = length
            return None
        self._in_headers = True
        match = _LENGTH.search(line)
        if match is None:
            return None  # Content-Type, or junk
        value = match.group(1)
        if value.isdigit():
            self._length, self._problem = int(value), None
        else:
            self._length = None
            self._problem = f"Content-Length {value[:40].decode('latin-1')!r} is not a byte count"
        return None


class FrameReader:
    """Blocking reads of whole frames from a binary stream (called on a worker thread): for a stdin
    the event loop cannot watch (a file, a terminal, a socket that is stdout too)."""

    def __init__(self, stream: BinaryIO) -> None:
        self._read = getattr(stream, "read1", stream.read)
        self._parser = FrameParser()
        self._ready: deque[Frame] = deque()

    def next_frame(self) -> Frame | None:
        """The next frame, or None at end of input (a frame cut short by it is not one)."""
        while not self._ready:
            data = self._read(_CHUNK)
            if not data:
                return None
            self._ready.extend(self._parser.feed(data))
        return self._ready.popleft()


async def serve_stream(server: Any, stdin: BinaryIO, on_frame: Callable[[], None] | None = None) -> None:
    """Read frames from ``stdin`` and hand each decoded message to ``server.protocol`` until the input
    ends or the server is stopped. The protocol's writer must be set already; ``on_frame`` is told
    of every frame as it arrives (the idle collector's clock).

    A pipe or socket of its own is read by the event loop itself: a message is handled as soon as
    the loop wakes, where a reader thread would cost a second wake-up (~0.1 ms) per message."""
    fd = _own_pipe(stdin)
    if fd is None:
        log.info("stdin is read on a thread (not a pipe or socket of its own)")
        await _serve_by_thread(server, stdin, on_frame)
    else:
        log.info("stdin is read on the event loop")
        await _serve_on_loop(server, fd, on_frame)


def _own_pipe(stdin: BinaryIO) -> int | None:
    """``stdin``'s descriptor when the loop can watch it: a pipe or socket that is not also stdout
    (non-blocking mode belongs to the open file, and would then make writes to stdout fail)."""
    try:
        fd = stdin.fileno()
        st = os.fstat(fd)
        out = os.fstat(1)
    except (AttributeError, OSError, ValueError):
        return None
    if not (stat.S_ISFIFO(st.st_mode) or stat.S_ISSOCK(st.st_mode)):
        return None
    if (st.st_dev, st.st_ino) == (out.st_dev, out.st_ino):
        return None
    return fd


async def _serve_by_thread(server: Any, stdin: BinaryIO, on_frame: Callable[[], None] | None) -> None:
    loop = asyncio.get_running_loop()
    reader = FrameReader(stdin)
    stop = server._stop_event
    while stop is None or not stop.is_set():
        frame = await loop.run_in_executor(server.thread_pool, reader.next_frame)
        if frame is None:
            log.info("end of input: the client closed the connection")
            return
        _dispatch(server.protocol, frame, on_frame)


class _StdinProtocol(asyncio.Protocol):
    """The loop's reader of stdin: frames are handled as their last byte arrives. ``exit``'s
    SystemExit is kept and raised by ``serve_stream``, which ends the loop as before."""

    def __init__(self, server: Any, on_frame: Callable[[], None] | None, done: asyncio.Future[None]) -> None:
        self.server, self.on_frame, self.done = server, on_frame, done
        self.parser = FrameParser()
        self.exit: SystemExit | None = None

    def data_received(self, data: bytes) -> None:
        stop = self.server._stop_event
        for frame in self.parser.feed(data):
            if self.done.done() or (stop is not None and stop.is_set()):
                self._finish()
                return
            try:
                _dispatch(self.server.protocol, frame, self.on_frame)
            except SystemExit as exc:
                self.exit = exc
                self._finish()
                return

    def eof_received(self) -> bool:
        log.info("end of input: the client closed the connection")
        self._finish()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._finish()

    def _finish(self) -> None:
        if not self.done.done():
            self.done.set_result(None)


async def _serve_on_loop(server: Any, fd: int, on_frame: Callable[[], None] | None) -> None:
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    # a descriptor of its own: closing the transport closes that, never the process's stdin
    pipe = os.fdopen(os.dup(fd), "rb", buffering=0)
    transport, reader = await loop.connect_read_pipe(lambda: _StdinProtocol(server, on_frame, done), pipe)
    try:
        await done
    finally:
        transport.close()
        with contextlib.suppress(OSError):
            os.set_blocking(fd, True)  # the mode is the open file's: leave it as it was found
    if reader.exit is not None:
        raise reader.exit


def _dispatch(protocol: Any, frame: Frame, on_frame: Callable[[], None] | None) -> None:
    """One frame to the protocol: decoded, or answered with a parse error."""
    if on_frame is not None:
        on_frame()
    if frame.body is None:
        parse_error(protocol, frame.problem or "unreadable frame")
        return
    try:
        message = json.loads(frame.body)
    except RecursionError:
        parse_error(protocol, "the message nests too deeply to decode")
        return
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        parse_error(protocol, f"the message is not UTF-8 JSON: {exc}")
        return
    try:
        protocol.handle_message(message)
    except Exception:  # noqa: BLE001 - a protocol that lets one through must not end the session
        log.exception("a message could not be handled")


def parse_error(protocol: Any, reason: str) -> None:
    log.warning("JSON-RPC parse error: %s", reason)
    protocol._send_data(
        {"jsonrpc": "2.0", "id": None, "error": {"code": PARSE_ERROR, "message": f"Parse error: {reason}"}}
    )
