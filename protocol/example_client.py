"""An agent's client of the slayer-lsp daemon, with the Python standard library only.

It starts ``python -m slayer_lsp serve --storage STORE``, speaks JSON-RPC 2.0 over the daemon's
stdin/stdout (each message framed by a ``Content-Length`` header), initializes, runs one
``slayer/search`` and one ``slayer/inspect``, prints what they answer, asks ``slayer/status``
whether the store was readable, and shuts the daemon down.
Copy it as a starting point: the ``Connection`` class is all an agent needs to call any request of
protocol/README.md.

    python protocol/example_client.py --storage path/to/store --question "revenue by store" \\
        --ref orders.subtotal
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import queue
import subprocess
import sys
import threading
from typing import Any, BinaryIO


class RpcError(Exception):
    """An error response: ``code`` is the JSON-RPC error code (-32602 invalid params, ...)."""

    def __init__(self, code: int, message: str, data: Any = None):
        super().__init__(f"{message} (code {code})")
        self.code, self.message, self.data = code, message, data


class Connection:
    """JSON-RPC over a child process's pipes. A reader thread parses the frames; requests wait for
    their response, and what the server sends meanwhile (notifications, its own requests) is
    handled on the way: notifications are kept in ``notifications``, server requests answered."""

    def __init__(self, command: list[str], stderr: Any = None):
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr)
        self._ids = itertools.count(1)
        self._inbox: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.notifications: list[dict[str, Any]] = []
        threading.Thread(target=self._read_loop, args=(self.proc.stdout,), daemon=True).start()

    # -- framing

    def _write(self, message: dict[str, Any]) -> None:
        body = json.dumps(message, ensure_ascii=False).encode("utf-8")
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        self.proc.stdin.flush()

    def _read_loop(self, stream: BinaryIO) -> None:
        try:
            while True:
                length = None
                while True:  # headers, up to the empty line
                    line = stream.readline()
                    if not line:
                        return
                    line = line.strip()
                    if not line:
                        break
                    name, _, value = line.decode("ascii").partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value.strip())
                if length is None:
                    continue
                self._inbox.put(json.loads(stream.read(length).decode("utf-8")))
        finally:
            self._inbox.put(None)  # the server closed its stdout

    # -- messages

    def notify(self, method: str, params: Any = None) -> None:
        self._write(
            {"jsonrpc": "2.0", "method": method, **({"params": params} if params is not None else {})}
        )

    def request(self, method: str, params: Any = None, timeout: float = 120.0) -> Any:
        """Send a request and wait for its result; raises ``RpcError`` for an error response."""
        rid = next(self._ids)
        self._write(
            {
                "jsonrpc": "2.0",
                "id": rid,
                "method": method,
                **({"params": params} if params is not None else {}),
            }
        )
        while True:
            try:
                msg = self._inbox.get(timeout=timeout)
            except queue.Empty:
                raise TimeoutError(f"no answer to {method} within {timeout:.0f} s") from None
            if msg is None:
                raise ConnectionError(f"the server exited while {method} was pending")
            if "method" in msg and "id" in msg:  # a request from the server (e.g. client/registerCapability)
                self._write({"jsonrpc": "2.0", "id": msg["id"], "result": None})
            elif "method" in msg:
                self.notifications.append(msg)
            elif msg.get("id") == rid:
                if "error" in msg:
                    err = msg["error"]
                    raise RpcError(err.get("code", 0), err.get("message", ""), err.get("data"))
                return msg.get("result")

    def close(self, timeout: float = 30.0) -> int:
        """``shutdown`` then ``exit``; returns the server's exit code."""
        try:
            self.request("shutdown", timeout=timeout)
            self.notify("exit")
        except (OSError, ConnectionError, TimeoutError):
            pass
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def run(
    storage: str,
    question: str,
    refs: list[str],
    *,
    python: str = sys.executable,
    embeddings: bool = True,
    quiet: bool = False,
) -> dict[str, Any]:
    """Start the daemon on ``storage``, search and inspect, stop it; returns the two results, why the
    store cannot be read (or None) and the daemon's exit code."""
    if "://" not in storage:  # the daemon's locations are file URIs: give it an absolute path
        storage = os.path.abspath(storage)
    conn = Connection(
        [python, "-m", "slayer_lsp", "serve", "--storage", storage],
        stderr=subprocess.DEVNULL if quiet else None,
    )
    try:
        init = conn.request(
            "initialize",
            {
                "processId": None,
                "rootUri": None,
                "capabilities": {},
                "clientInfo": {"name": "slayer-example-client", "version": "1"},
                # the daemon's options; without embeddings only the lexical search channels run
                "initializationOptions": {"embedding": {"enable": embeddings}},
            },
        )
        conn.notify("initialized", {})
        search = conn.request("slayer/search", {"question": question, "max_results": 5})
        inspect = conn.request("slayer/inspect", {"refs": refs})
        status = conn.request("slayer/status", {})  # is the store readable? (answers at once)
    finally:
        code = conn.close()
    return {
        "server": init.get("serverInfo"),
        "search": search,
        "inspect": inspect,
        "store_error": status.get("server_error") or status.get("error"),
        "exit_code": code,
    }


def show(out: dict[str, Any]) -> str:
    info = out["server"] or {}
    lines = [f"{info.get('name', '?')} {info.get('version', '')}", "", "slayer/search:"]
    for hit in out["search"]["results"]:
        lines.append(f"  {hit['score']:.4f}  {hit['kind']:<11} {hit['id']}")
    lines.extend(f"  warning: {w}" for w in out["search"]["warnings"])
    lines += ["", "slayer/inspect:"]
    for item in out["inspect"]["items"]:
        if item.get("error"):
            lines.append(f"  {item['ref']}: {item['error']}")
            continue
        where = item.get("location", {}).get("uri", item.get("source", ""))
        lines.append(f"  {item['ref']} -> {item['kind']} {item['canonical']}  ({where})")
        if item.get("description"):
            lines.append(f"    {item['description']}")
    lines.append(f"\nserver exit code: {out['exit_code']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description="Search and inspect a SLayer store through the slayer-lsp daemon."
    )
    p.add_argument("--storage", required=True, help="the store: a YAML directory or a SQLite file")
    p.add_argument("--question", default="revenue by store")
    p.add_argument("--ref", action="append", dest="refs", help="a reference to inspect (repeatable)")
    p.add_argument("--python", default=sys.executable, help="the interpreter that has slayer_lsp installed")
    p.add_argument("--no-embeddings", action="store_true", help="lexical search only (no model is loaded)")
    p.add_argument("--json", action="store_true", help="print the raw results as one JSON object")
    p.add_argument("--quiet", action="store_true", help="hide the daemon's log (its stderr)")
    args = p.parse_args(argv)
    try:
        out = run(
            args.storage,
            args.question,
            args.refs or ["orders"],
            python=args.python,
            embeddings=not args.no_embeddings,
            quiet=args.quiet,
        )
    except (RpcError, ConnectionError, TimeoutError, OSError) as exc:
        print(f"example_client: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(out, indent=2, ensure_ascii=False) if args.json else show(out))
    if out["store_error"]:
        print(f"example_client: the store cannot be read: {out['store_error']}", file=sys.stderr)
    return 0 if out["exit_code"] == 0 and not out["store_error"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
