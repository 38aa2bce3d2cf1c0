"""A raw JSON-RPC client of the real daemon for the fuzz and hostile-input tests: it frames bytes
itself (pytest-lsp cannot send a malformed frame), reads the daemon's output strictly (a badly
framed answer is a failure) and counts every answer by id."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter, deque
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SHOP_STORE = REPO / "examples" / "shop" / "store"
SHOP_DB = REPO / "examples" / "shop" / "store.db"
NO_EMBEDDINGS = {"embedding": {"enable": False}}
DEADLINE_S = 120.0  # "no hang": generous, so that a busy CI machine never trips it


def copy_shop(root: Path, sqlite: bool = False) -> Path:
    """A private, writable copy of the example store."""
    root.mkdir(parents=True, exist_ok=True)
    if sqlite:
        dst = root / "store.db"
        shutil.copyfile(SHOP_DB, dst)
        return dst
    dst = root / "store"
    shutil.copytree(SHOP_STORE, dst, copy_function=shutil.copyfile)
    return dst


def frame(body: bytes | str | dict[str, Any] | list[Any]) -> bytes:
    if isinstance(body, (dict, list)):
        body = json.dumps(body)
    if isinstance(body, str):
        body = body.encode("utf-8")
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


class RawDaemon:
    """``slayer-lsp serve`` as a subprocess over pipes."""

    def __init__(
        self, store: Path | None, log_path: Path, *, cwd: Path = REPO, env: dict[str, str] | None = None
    ) -> None:
        cmd = [sys.executable, "-m", "slayer_lsp", "serve", *(["--storage", str(store)] if store else [])]
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in close()
        env = {**os.environ, **(env or {})}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, cwd=str(cwd), env=env
        )
        self.log_path = log_path
        self.cond = threading.Condition()
        self._write_lock = threading.Lock()
        self.responses: dict[Any, list[dict[str, Any]]] = {}
        self.null_errors: list[dict[str, Any]] = []
        self.notifications: deque[dict[str, Any]] = deque(maxlen=2000)
        self.notification_count = 0
        self.output_problems: list[str] = []
        self.eof = False
        self.sent = Counter()  # kind of message -> count (requests, notifications, raw frames)
        self._ids = itertools.count(1)
        self._reader = threading.Thread(target=self._read, name="raw-daemon-reader", daemon=True)
        self._reader.start()

    # ------------------------------------------------------------------ output

    def _read(self) -> None:
        out = self.proc.stdout
        assert out is not None
        try:
            while True:
                length = None
                while True:
                    line = out.readline()
                    if not line:
                        return
                    if line == b"\r\n":
                        break
                    if not line.endswith(b"\r\n"):
                        self.output_problems.append(f"header line without CRLF: {line[:80]!r}")
                    name, _, value = line.decode("ascii").partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value)
                if length is None:
                    self.output_problems.append("a frame without Content-Length")
                    return
                body = out.read(length)
                if len(body) != length:
                    self.output_problems.append(f"a truncated frame ({len(body)} of {length} bytes)")
                    return
                self._dispatch(json.loads(body))
        except Exception as exc:  # noqa: BLE001 - recorded, the test fails on it
            self.output_problems.append(f"unreadable output: {exc!r}")
        finally:
            with self.cond:
                self.eof = True
                self.cond.notify_all()

    def _dispatch(self, msg: dict[str, Any]) -> None:
        if not isinstance(msg, dict) or msg.get("jsonrpc") != "2.0":
            self.output_problems.append(f"not a JSON-RPC 2.0 message: {msg!r:.200}")
            return
        if "method" in msg and "id" in msg:  # the server asks us something: answer null
            self.send({"jsonrpc": "2.0", "id": msg["id"], "result": None}, count=False)
            return
        with self.cond:
            if "method" in msg:
                self.notifications.append(msg)
                self.notification_count += 1
            elif "id" not in msg:
                self.output_problems.append(f"a response without an id: {msg!r:.200}")
            elif msg["id"] is None:
                if "error" not in msg:
                    self.output_problems.append(f"a result for id null: {msg!r:.200}")
                self.null_errors.append(msg)
            else:
                if ("result" in msg) == ("error" in msg):
                    self.output_problems.append(f"a response needs exactly one of result/error: {msg!r:.200}")
                self.responses.setdefault(_key(msg["id"]), []).append(msg)
            self.cond.notify_all()

    # ------------------------------------------------------------------ input

    def send_raw(self, data: bytes, kind: str = "raw frame", count: bool = True) -> None:
        with self._write_lock:
            assert self.proc.stdin is not None
            self.proc.stdin.write(data)
            self.proc.stdin.flush()
        if count:
            self.sent[kind] += 1

    def send(self, msg: Any, count: bool = True) -> None:
        kind = "request" if isinstance(msg, dict) and "id" in msg and "method" in msg else "notification"
        self.send_raw(frame(msg), kind, count)

    def new_id(self) -> str:
        return f"r{next(self._ids)}"

    def request(self, method: str, params: Any = None, *, msg_id: Any = None, send: bool = True) -> Any:
        """Send a request (or only build it when ``send`` is false) and return its id."""
        msg_id = self.new_id() if msg_id is None else msg_id
        msg: dict[str, Any] = {"jsonrpc": "2.0", "id": msg_id, "method": method}
        if params is not None:
            msg["params"] = params
        self.send(msg)
        return msg_id

    def notify(self, method: str, params: Any = None) -> None:
        msg: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            msg["params"] = params
        self.send(msg)

    # ------------------------------------------------------------------ waiting

    def wait_for(self, ids: list[Any], timeout: float = DEADLINE_S) -> list[Any]:
        """Wait until every id has an answer; returns the ids still unanswered at the deadline."""
        deadline = time.monotonic() + timeout
        keys = [_key(i) for i in ids]
        with self.cond:
            while True:
                missing = [i for i, k in zip(ids, keys, strict=True) if k not in self.responses]
                left = deadline - time.monotonic()
                if not missing or left <= 0 or self.eof:
                    return missing
                self.cond.wait(min(left, 1.0))

    def call(self, method: str, params: Any = None, timeout: float = DEADLINE_S) -> dict[str, Any]:
        """One request and its answer (the whole response message)."""
        msg_id = self.request(method, params)
        missing = self.wait_for([msg_id], timeout)
        assert not missing, f"{method} was not answered within {timeout:g} s (alive: {self.alive()})"
        return self.responses[_key(msg_id)][0]

    def wait_null_errors(self, n: int, timeout: float = DEADLINE_S) -> int:
        deadline = time.monotonic() + timeout
        with self.cond:
            while len(self.null_errors) < n and not self.eof and time.monotonic() < deadline:
                self.cond.wait(0.2)
            return len(self.null_errors)

    def answers(self, msg_id: Any) -> list[dict[str, Any]]:
        with self.cond:
            return list(self.responses.get(_key(msg_id), []))

    def duplicates(self) -> dict[Any, int]:
        with self.cond:
            return {k: len(v) for k, v in self.responses.items() if len(v) != 1}

    # ------------------------------------------------------------------ process

    def alive(self) -> bool:
        return self.proc.poll() is None

    def rss_kb(self) -> int:
        with open(f"/proc/{self.proc.pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        raise AssertionError("no VmRSS")

    def initialize(self, options: dict[str, Any] | None = None, wait_ready: bool = True) -> dict[str, Any]:
        init = self.call(
            "initialize",
            {
                "processId": None,
                "rootUri": None,
                "capabilities": {},
                "initializationOptions": options if options is not None else NO_EMBEDDINGS,
            },
        )
        assert "result" in init, init
        self.notify("initialized", {})
        if wait_ready:
            deadline = time.monotonic() + DEADLINE_S
            while not self.call("slayer/status", {})["result"]["ready"]:
                assert time.monotonic() < deadline, "the daemon never finished its first index"
                time.sleep(0.05)
        return init["result"]

    def stop(self, timeout: float = 30.0) -> int:
        """shutdown + exit when alive; the exit code (killed: a failure the caller sees as -9)."""
        try:
            if self.alive():
                self.call("shutdown", None, timeout)
                self.notify("exit")
            if self.proc.stdin:
                self.proc.stdin.close()
        except (BrokenPipeError, OSError, AssertionError):
            pass
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return -9
        finally:
            self._reader.join(5)
            self._log.close()

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")


def _key(msg_id: Any) -> Any:
    return (type(msg_id).__name__, msg_id) if isinstance(msg_id, (int, str)) else ("other", repr(msg_id))
