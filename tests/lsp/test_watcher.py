"""The store watcher without a server: which paths reach the engine, the debounce, and the options
and error mapping the server adds around the engine."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from slayer_lsp.lsp.options import parse_options
from slayer_lsp.store.locate import StoreLocation
from slayer_lsp.watch import StoreWatcher, document_paths

from .support import copy_store


@pytest.fixture()
def store(tmp_path_factory) -> Path:
    return copy_store(tmp_path_factory)


@pytest.mark.parametrize(
    ("changed", "expected"),
    [
        (["models/jaffle/orders.yaml"], ["models/jaffle/orders.yaml"]),
        (
            ["models/jaffle/orders.yaml", "memories/1.md", "datasources/jaffle.yaml", "priority.yaml"],
            ["models/jaffle/orders.yaml", "memories/1.md", "datasources/jaffle.yaml", "priority.yaml"],
        ),
        (["models/jaffle/gone.yaml"], ["models/jaffle/gone.yaml"]),  # a deleted document is re-checked
        (["models/jaffle/notes.txt"], []),  # not a document: nothing to re-read
        (["models/jaffle"], None),  # a directory: its files were not reported one by one
        (["models/newds"], None),  # something gone that may have been a directory
        ([""], None),  # the store itself
        (["memories/1.md", "models"], None),
    ],
)
def test_document_paths(store, changed, expected):
    loc = StoreLocation("yaml", store)
    (store / "models" / "jaffle" / "notes.txt").write_text("x")
    got = document_paths(loc, [str(store / p) if p else str(store) for p in changed])
    assert got == (None if expected is None else [str(store / p) for p in expected])


def test_document_paths_outside_the_store_and_sqlite(store, tmp_path):
    assert document_paths(StoreLocation("yaml", store), [str(tmp_path / "elsewhere.yaml")]) is None
    assert document_paths(StoreLocation("sqlite", tmp_path / "s.db"), [str(tmp_path / "s.db")]) is None


def test_one_callback_per_burst_with_every_path_and_no_hold_back_by_ignored_files(store):
    calls: list[set[str]] = []
    done = threading.Event()

    def on_change(paths: set[str]) -> None:
        calls.append(paths)
        done.set()

    watcher = StoreWatcher(StoreLocation("yaml", store), on_change, quiet_ms=400)
    watcher.start()
    try:
        time.sleep(0.3)  # the watch is established
        stop = threading.Event()

        def churn() -> None:  # the embedding worker writing its database the whole time
            while not stop.is_set():
                (store / "embeddings.db").write_bytes(os.urandom(64))
                time.sleep(0.02)

        noise = threading.Thread(target=churn)
        noise.start()
        try:
            for name in ("orders", "stores", "customers"):
                path = store / "models" / "jaffle" / f"{name}.yaml"
                tmp = path.parent / f".{path.name}.tmp"
                tmp.write_text(path.read_text() + "\n")
                tmp.replace(path)
                time.sleep(0.03)
            assert done.wait(5), "no callback while an ignored file kept changing"
        finally:
            stop.set()
            noise.join()
        time.sleep(0.4)
    finally:
        watcher.stop()
    assert calls == [
        {str(store / "models" / "jaffle" / f"{n}.yaml") for n in ("orders", "stores", "customers")}
    ]


def _recorder() -> tuple[list[set[str]], threading.Event, Callable[[set[str]], None]]:
    """The batches a watcher hands over, an event set at the first, and the handler that records them."""
    calls: list[set[str]] = []
    done = threading.Event()

    def on_change(paths: set[str]) -> None:
        calls.append(paths)
        done.set()

    return calls, done, on_change


@pytest.mark.parametrize("catch_up", [True, False])
def test_a_change_made_before_the_watch_is_caught_up_with(store, catch_up):
    """A server reads the store, then starts watching it: a write in between sends no event. With
    ``catch_up`` the watcher asks for one whole re-read once its watch is in place."""
    calls, done, on_change = _recorder()
    watcher = StoreWatcher(StoreLocation("yaml", store), on_change, quiet_ms=50, catch_up=catch_up)
    path = store / "models" / "jaffle" / "orders.yaml"
    path.write_text(path.read_text() + "\n")  # after the read, before the watch
    watcher.start()
    try:
        assert done.wait(5) is catch_up
    finally:
        watcher.stop()
    assert calls == ([{str(store)}] if catch_up else [])


def test_a_read_after_the_watch_is_in_place_needs_no_catch_up(store):
    """A server that waits for the watch before its first read: a write after that wait arrives as
    its own path, and no whole re-read is asked for."""
    calls, done, on_change = _recorder()
    watcher = StoreWatcher(StoreLocation("yaml", store), on_change, quiet_ms=50, catch_up=True)
    watcher.start()
    try:
        assert watcher.wait_in_place(10)
        path = store / "models" / "jaffle" / "orders.yaml"
        path.write_text(path.read_text() + "\n")  # while the first read would run
        assert done.wait(10)
        time.sleep(0.3)  # nothing else follows
    finally:
        watcher.stop()
    assert calls == [{str(path)}]


def test_a_watch_in_place_before_the_first_read_waits_needs_no_catch_up(store):
    """A server's watch is often in place before its first read gets to wait for it (the read
    loads its parse cache first, a second at 10,000 models): that read still sees every change
    before the watch, so no whole re-read follows it (at 10,000 models, 1-2 s of a restart)."""
    calls, done, on_change = _recorder()
    watcher = StoreWatcher(
        StoreLocation("yaml", store), on_change, quiet_ms=50, catch_up=True, first_read_waits=True
    )
    watcher.start()
    try:
        deadline = time.monotonic() + 10
        while watcher.watching is None and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.5)  # the watch comes in place while the read is still loading its cache
        assert watcher.wait_in_place(10)
        path = store / "models" / "jaffle" / "orders.yaml"
        path.write_text(path.read_text() + "\n")
        assert done.wait(10)
        time.sleep(0.3)
    finally:
        watcher.stop()
    assert calls == [{str(path)}]


def test_a_watch_not_in_place_in_time_catches_up_once_it_is(store):
    calls, done, on_change = _recorder()
    watcher = StoreWatcher(StoreLocation("yaml", store), on_change, quiet_ms=50, catch_up=True)
    assert not watcher.wait_in_place(0)  # not started: the caller reads without waiting longer
    watcher.start()
    try:
        assert done.wait(10)
    finally:
        watcher.stop()
    assert calls == [{str(store)}]


@pytest.mark.parametrize(
    ("raw", "enable", "switch", "problems"),
    [
        (None, True, False, []),
        ({"embedding": {"enable": False}}, False, False, []),
        ({"embedding": {"switchModel": True, "model": "text-embedding-3-small"}}, True, True, []),
        (
            {"embedding": {"enable": "no"}},
            True,
            False,
            ["'embedding.enable': expected true or false, got a string"],
        ),
        (
            {"embedding": {"switch_model": 1}},
            True,
            False,
            ["'embedding.switchModel': expected true or false"],
        ),
    ],
)
def test_embedding_options(raw, enable, switch, problems):
    opts, found = parse_options(raw)
    assert opts.embedding.enable is enable and opts.embedding.switch_model is switch
    assert len(found) == len(problems) and all(f.startswith(p) for f, p in zip(found, problems, strict=True))
    again, _ = parse_options(opts.to_dict())
    assert again == opts


@pytest.mark.parametrize(
    ("value", "expected"), [("", 50), ("20", 20), ("0", 0), ("soon", 50), ("-1", 50), ("99999", 50)]
)
def test_watch_quiet_ms(monkeypatch, value, expected):
    from slayer_lsp.watch import watch_quiet_ms

    monkeypatch.setenv("SLAYER_LSP_WATCH_QUIET_MS", value)
    assert watch_quiet_ms() == expected


def test_write_errors_name_the_culprit():
    """The writer's kind picks the code (never the message): the request's fault is -32602, the
    store's -32803."""
    import sqlite3

    from lsprotocol import types as t
    from pygls.exceptions import JsonRpcInvalidParams

    from slayer_lsp.lsp.errors import WRITE_ERROR_CODES, write_error
    from slayer_lsp.writer.errors import WriteErrorKind
    from slayer_lsp.writer.memories import MemoryWriteError

    assert set(WRITE_ERROR_CODES) == set(WriteErrorKind)

    bad = write_error(
        "slayer/saveMemory",
        MemoryWriteError("cannot resolve 'x': nope", reference="x", kind=WriteErrorKind.UNRESOLVED),
    )
    assert (
        isinstance(bad, JsonRpcInvalidParams) and bad.message == "slayer/saveMemory: cannot resolve 'x': nope"
    )
    for exc in (
        MemoryWriteError("timed out after 30s waiting for /s/memories.lock", kind=WriteErrorKind.BUSY),
        MemoryWriteError("no SLayer YAML store at /s", kind=WriteErrorKind.STORE),
    ):
        assert write_error("m", exc).code == t.LSPErrorCodes.RequestFailed.value
    try:
        raise MemoryWriteError(
            "cannot write /s/memories/1.md: Read-only file system (EROFS)", kind=WriteErrorKind.STORE
        ) from OSError(30, "ro")
    except MemoryWriteError as exc:
        assert write_error("m", exc).code == t.LSPErrorCodes.RequestFailed.value
    try:
        raise MemoryWriteError("database is locked", kind=WriteErrorKind.BUSY) from sqlite3.OperationalError(
            "locked"
        )
    except MemoryWriteError as exc:
        assert write_error("m", exc).code == t.LSPErrorCodes.RequestFailed.value
