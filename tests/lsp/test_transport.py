"""The stdio framing: the same frames whatever the chunking, and both readers (the event loop's, for
a pipe; the thread's, for a file) serve a real daemon."""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from slayer_lsp.lsp import transport
from slayer_lsp.lsp.transport import Frame, FrameParser, FrameReader
from tests.lsp.raw_daemon import DEADLINE_S, NO_EMBEDDINGS, REPO, copy_shop, frame

LIMIT = 64  # MAX_MESSAGE_BYTES for these cases
LONG_LINE = b"X-Junk: " + b"j" * (transport.MAX_HEADER_LINE + 100) + b"\r\n"

# (name, bytes on the wire, the frames they hold: a body, or a fragment of the problem)
CASES = [
    ("two frames", frame({"a": 1}) + frame("[]"), [b'{"a": 1}', b"[]"]),
    ("blank lines between", b"\r\n\n" + frame("1") + b"\n\r\n" + frame("2"), [b"1", b"2"]),
    ("other headers", b"Content-Type: x\r\ncontent-LENGTH :  2\r\n\r\n{}", [b"{}"]),
    ("no length", b"Content-Type: x\r\n\r\n" + frame("3"), ["without a Content-Length", b"3"]),
    ("length not a number", b"Content-Length: ten\r\n\r\n" + frame("4"), ["'ten' is not a byte count", b"4"]),
    ("length after junk on its line", b"}}]Content-Length: 2\r\n\r\n{}", [b"{}"]),
    ("a header line over the limit", LONG_LINE + b"Content-Length: 1\r\n\r\n5", [b"5"]),
    ("body over the limit", frame(b"[" * (LIMIT + 1)) + frame("6"), ["65 bytes is over the limit", b"6"]),
    ("empty body", b"Content-Length: 0\r\n\r\n" + frame("7"), [b"", b"7"]),
    ("bare newlines", b"Content-Length: 3\n\n[1]", [b"[1]"]),
    ("cut inside a body", frame("8") + b"Content-Length: 10\r\n\r\n{}", [b"8"]),
]


def _shown(frames: list[Frame]) -> list[bytes | str | None]:
    return [f.body if f.body is not None else f.problem for f in frames]


def _matches(got: list[bytes | str | None], want: list[bytes | str]) -> bool:
    if len(got) != len(want):
        return False
    return all(
        g == w if isinstance(w, bytes) else isinstance(g, str) and w in g
        for g, w in zip(got, want, strict=True)
    )


@pytest.mark.parametrize(("name", "wire", "want"), CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("chunk", [1, 7, 1000, 1 << 20])
def test_frames_do_not_depend_on_how_the_bytes_arrive(monkeypatch, name, wire, want, chunk):
    monkeypatch.setattr(transport, "MAX_MESSAGE_BYTES", LIMIT)
    parser = FrameParser()
    frames: list[Frame] = []
    for at in range(0, len(wire), chunk):
        frames += parser.feed(wire[at : at + chunk])
    assert _matches(_shown(frames), want), (name, _shown(frames))


def test_the_thread_reader_gives_the_same_frames_and_then_none(tmp_path, monkeypatch):
    monkeypatch.setattr(transport, "MAX_MESSAGE_BYTES", LIMIT)
    wire = b"".join(w for _, w, _ in CASES[:-1])
    path = tmp_path / "wire"
    path.write_bytes(wire)
    with path.open("rb") as stream:
        reader = FrameReader(stream)
        frames = []
        while (f := reader.next_frame()) is not None:
            frames.append(f)
    assert _matches(_shown(frames), [w for _, _, want in CASES[:-1] for w in want])


def test_the_loop_reads_pipes_and_sockets_and_a_thread_reads_the_rest(tmp_path):
    read_end, write_end = os.pipe()
    a, b = socket.socketpair()
    try:
        with os.fdopen(os.dup(read_end), "rb") as pipe, a.makefile("rb") as sock:
            assert transport._own_pipe(pipe) is not None
            assert transport._own_pipe(sock) is not None
        (tmp_path / "f").write_bytes(b"")
        with (tmp_path / "f").open("rb") as regular:
            assert transport._own_pipe(regular) is None
    finally:
        for fd in (read_end, write_end):
            os.close(fd)
        a.close()
        b.close()


INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "processId": None,
        "rootUri": None,
        "capabilities": {},
        "initializationOptions": NO_EMBEDDINGS,
    },
}
BROKEN = b"Content-Length: 5\r\n\r\nnot j"


def _daemon(tmp_path: Path, stdin: Any) -> subprocess.Popen[bytes]:
    store = copy_shop(tmp_path)
    cmd = [sys.executable, "-m", "slayer_lsp", "serve", "--storage", str(store)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "SLAYER_LSP_CACHE_DIR": str(tmp_path / "cache")}
    log = (tmp_path / "daemon.log").open("wb")
    return subprocess.Popen(cmd, stdin=stdin, stdout=subprocess.PIPE, stderr=log, env=env, cwd=REPO)


def _answers(out: bytes) -> dict[object, dict]:
    found = {}
    for f in FrameParser().feed(out):
        assert f.body is not None, f.problem
        msg = json.loads(f.body)
        if "id" in msg:
            found[msg["id"]] = msg
    return found


class _Reader:
    """The daemon's output as it comes, every message kept: answers may come in any order (a parse
    error is written at once, before the answer of a request sent ahead of it)."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        self.fd = proc.stdout.fileno()
        self.parser = FrameParser()
        self.seen: list[dict] = []

    def answer(self, wanted: object) -> dict:
        """The response whose id is ``wanted`` (None: an error without an id), waiting at most
        ``DEADLINE_S`` for it."""
        deadline = time.monotonic() + DEADLINE_S
        while True:
            for msg in self.seen:
                if "id" in msg and msg["id"] == wanted and ("result" in msg or "error" in msg):
                    return msg
            left = deadline - time.monotonic()
            assert left > 0, f"no answer {wanted!r} in {DEADLINE_S} s; seen {self.seen}"
            ready, _, _ = select.select([self.fd], [], [], left)
            if not ready:
                continue
            data = os.read(self.fd, 1 << 16)
            assert data, f"the daemon ended its output before answering {wanted!r}"
            for f in self.parser.feed(data):
                msg = json.loads(f.body or b"null")
                if isinstance(msg, dict):
                    self.seen.append(msg)


def test_a_daemon_reads_a_pipe_on_its_loop(tmp_path):
    """Requests in one write, a broken frame among them: every answer, the parse error, and the exit
    code of an exit after shutdown."""
    proc = _daemon(tmp_path, subprocess.PIPE)
    assert proc.stdin is not None
    try:
        status = {"jsonrpc": "2.0", "id": 2, "method": "slayer/status", "params": {}}
        burst = frame(INITIALIZE) + frame({"jsonrpc": "2.0", "method": "initialized", "params": {}})
        proc.stdin.write(burst + BROKEN + frame(status))
        proc.stdin.flush()
        out = _Reader(proc)
        assert out.answer(1)["result"]["capabilities"]
        assert "not UTF-8 JSON" in out.answer(None)["error"]["message"]
        assert out.answer(2)["result"]["version"]
        proc.stdin.write(frame({"jsonrpc": "2.0", "id": 3, "method": "shutdown", "params": None}))
        proc.stdin.flush()
        assert "result" in out.answer(3)
        proc.stdin.write(frame({"jsonrpc": "2.0", "method": "exit", "params": None}))
        proc.stdin.close()
        assert proc.wait(DEADLINE_S) == 0, (tmp_path / "daemon.log").read_text()[-2000:]
        assert "stdin is read on the event loop" in (tmp_path / "daemon.log").read_text()
    finally:
        proc.kill()


def test_a_daemon_reads_a_file_on_a_thread(tmp_path):
    """A file cannot be watched by the loop: the thread reader serves it, to the end of the input."""
    session = tmp_path / "session"
    session.write_bytes(frame(INITIALIZE) + BROKEN)
    with session.open("rb") as stdin:
        proc = _daemon(tmp_path, stdin)
        out, _ = proc.communicate(timeout=DEADLINE_S)
    answers = _answers(out)
    assert answers[1]["result"]["capabilities"], answers
    assert "not UTF-8 JSON" in answers[None]["error"]["message"]
    log = (tmp_path / "daemon.log").read_text()
    assert "stdin is read on a thread" in log and "end of input" in log, log[-2000:]
    assert "Traceback" not in log, log[-2000:]
