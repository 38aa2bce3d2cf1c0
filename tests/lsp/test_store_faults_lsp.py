"""Store faults while the daemon serves (issue 9, item 2), end to end over stdio: a model file replaced
with garbage, the store directory removed and restored, a SQLite store locked by another process
(released without a write, so no file event announces it) or corrupted, and a full disk under
``slayer/saveMemory`` and the cache.

Each time the daemon keeps answering hover and search from the last good snapshot, says so once
(one load issue, or one ``window/showMessage`` per outage plus one when it is over), refuses a write it
cannot make with a clear JSON-RPC error and no partial file, and recovers by itself. The figures (how
long it served stale, how long it took to see the restored store) are printed, never asserted.
"""

from __future__ import annotations

import asyncio
import os
import resource
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from lsprotocol import types as t
from pygls.exceptions import JsonRpcException
from pytest_lsp import LanguageClient, client_capabilities
from pytest_lsp.client import make_test_lsp_client

from .support import NO_EMBEDDINGS, REPO, eventually, hover_text, open_doc, plain, pos, request, stop_client

pytestmark = [pytest.mark.asyncio(loop_scope="function"), pytest.mark.slow]

SHOP = REPO / "examples" / "shop"
BOOKS = Path("models/shop/books.yaml")
OLD, NEW = "Stock keeping unit", "Stock keeping unit (restored)"
QUERY, ON_SKU = pos("source_model: books\ndimensions: [sk§u]\n")
QUERY_URI = "file:///ws/faults.query.yaml"
# the daemon, with SIGXFSZ ignored so that a file-size limit makes writes fail instead of killing it
DAEMON = (
    "import runpy, signal; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
    "runpy.run_module('slayer_lsp.lsp', run_name='__main__', alter_sys=True)"
)


async def start(store: Path) -> LanguageClient:
    c = make_test_lsp_client()
    await c.start_io(sys.executable, "-c", DAEMON, "--storage", str(store), cwd=str(REPO))
    await c.initialize_session(
        t.InitializeParams(
            capabilities=client_capabilities("neovim@v0.7.0"),
            initialization_options={"diagnostics": {"debounceMs": 20}, "embedding": NO_EMBEDDINGS},
        )
    )
    await eventually(lambda: status(c), lambda s: s["ready"], "the initial index")
    open_doc(c, QUERY_URI, QUERY)
    c.store = store  # type: ignore[attr-defined]
    return c


async def status(c: LanguageClient) -> dict:
    return plain(await c.protocol.send_request_async("slayer/status", {}))


async def hover(c: LanguageClient) -> str:
    return await hover_text(c, QUERY_URI, ON_SKU) or ""


async def search_ids(c: LanguageClient, question: str = "stock keeping unit") -> list[str]:
    got = await request(c, "slayer/search", {"question": question, "max_results": 8})
    return [h["id"] for h in got["results"]]


def shown(c: LanguageClient, level: t.MessageType, text: str) -> list[str]:
    return [m.message for m in c.messages if m.type == level and text in m.message]


def figure(what: str, seconds: float) -> None:
    print(f"figure: {what}: {seconds * 1000:.0f} ms")


def yaml_copy(tmp_path: Path) -> Path:
    store = tmp_path / "store"
    shutil.copytree(SHOP / "store", store, copy_function=shutil.copyfile)
    return store


# --------------------------------------------------------------------------- YAML store


async def test_a_garbled_model_and_a_vanished_store_keep_the_last_good_snapshot(tmp_path):
    store = yaml_copy(tmp_path)
    c = await start(store)
    try:
        assert OLD in await hover(c)
        found = await search_ids(c)
        assert "shop.books.sku" in found

        # a model file rewritten in place with garbage: one load issue, the old model keeps answering
        path = store / BOOKS
        good = path.read_text()
        path.write_bytes(b"\x00garbage\xff" * 300)
        st = await eventually(
            lambda: status(c),
            lambda s: any("books.yaml" in i for i in s["issues"]),
            "the load issue of the garbled file",
        )
        books_issues = [i for i in st["issues"] if "books.yaml" in i]
        assert len(books_issues) == 1 and "serving its last good version" in books_issues[0]
        assert st["readable"] and OLD in await hover(c) and await search_ids(c) == found
        path.write_text(good)
        await eventually(
            lambda: status(c), lambda s: not any("books.yaml" in i for i in s["issues"]), "the repaired file"
        )

        # the store directory goes away: one warning, the last good snapshot answers, retries are silent
        away = tmp_path / "away"
        t0 = time.monotonic()
        store.rename(away)
        st = await eventually(
            lambda: status(c), lambda s: not s["readable"], "the store to be reported unreadable"
        )
        t_fault = time.monotonic()
        assert "does not exist" in st["error"]
        await eventually(
            lambda: shown(c, t.MessageType.Warning, "cannot be read"), lambda m: len(m) == 1, "the warning"
        )
        await asyncio.sleep(4)  # retries at 0.5, 1 and 2 s
        assert len(shown(c, t.MessageType.Warning, "cannot be read")) == 1
        assert OLD in await hover(c) and await search_ids(c) == found
        assert (await status(c))["generation"] == st["generation"]  # no new snapshot per retry
        stale_s = time.monotonic() - t_fault

        # restored by copying (files land one by one), with an edit made meanwhile
        (away / BOOKS).write_text(good.replace(OLD, NEW))
        t1 = time.monotonic()
        shutil.copytree(away, store)
        await eventually(lambda: hover(c), lambda h: NEW in h, "the restored store's content")
        t_back = time.monotonic()
        await eventually(
            lambda: shown(c, t.MessageType.Info, "can be read again"), lambda m: len(m) == 1, "the all-clear"
        )
        st = await eventually(lambda: status(c), lambda s: s["issues"] == [], "every restored file loaded")
        assert st["readable"] and st["error"] is None
        assert "shop.books.sku" in await search_ids(c)
        assert len(shown(c, t.MessageType.Warning, "cannot be read")) == 1
        figure("store directory renamed away -> status unreadable", t_fault - t0)
        figure("served from the last good snapshot while the store was away", stale_s)
        figure("store copied back -> restored content in hover", t_back - t1)
    finally:
        await stop_client(c)


# --------------------------------------------------------------------------- SQLite store

LOCKER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=10)
conn.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
sys.stdin.readline()
conn.execute("ROLLBACK")
"""


async def test_a_sqlite_store_locked_then_corrupted_recovers_by_itself(tmp_path):
    db = tmp_path / "store.db"
    shutil.copyfile(SHOP / "store.db", db)
    good = db.read_bytes()
    c = await start(db)
    try:
        assert OLD in await hover(c)
        found = await search_ids(c)

        # another process holds the store locked; a touch makes the daemon read (and wait 2 s, then give up)
        locker = subprocess.Popen(
            [sys.executable, "-c", LOCKER, str(db)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        try:
            assert locker.stdout.readline().strip() == "locked"
            os.utime(db)
            st = await eventually(lambda: status(c), lambda s: not s["readable"], "the lock to be reported")
            assert "locked" in st["error"]
            assert OLD in await hover(c) and await search_ids(c) == found
            t0 = time.monotonic()
        finally:
            locker.communicate("\n", timeout=30)  # a rollback of nothing: no file event follows
        await eventually(lambda: status(c), lambda s: s["readable"], "the retry to find the lock gone")
        figure("SQLite lock released without a write -> readable again (by retry)", time.monotonic() - t0)
        assert len(shown(c, t.MessageType.Warning, "cannot be read")) == 1
        assert len(shown(c, t.MessageType.Info, "can be read again")) == 1

        # overwritten with garbage in place, then put back (with an edit) atomically
        with open(db, "r+b") as fh:
            fh.write(os.urandom(len(good)))
        st = await eventually(lambda: status(c), lambda s: not s["readable"], "the corruption to be reported")
        assert OLD in await hover(c) and await search_ids(c) == found
        await eventually(
            lambda: shown(c, t.MessageType.Warning, "cannot be read"),
            lambda m: len(m) == 2,
            "one warning for the second outage",
        )
        fixed = tmp_path / "fixed.db"
        fixed.write_bytes(good)
        with sqlite3.connect(fixed) as conn:
            (data,) = conn.execute("SELECT data FROM models WHERE name = 'books'").fetchone()
            conn.execute("UPDATE models SET data = ? WHERE name = 'books'", (data.replace(OLD, NEW),))
        t1 = time.monotonic()
        fixed.replace(db)
        await eventually(lambda: hover(c), lambda h: NEW in h, "the repaired store's content")
        figure("SQLite store replaced by a good copy -> new content in hover", time.monotonic() - t1)
        assert (await status(c))["readable"]
        assert len(shown(c, t.MessageType.Warning, "cannot be read")) == 2
    finally:
        await stop_client(c)


# --------------------------------------------------------------------------- a full disk


def limit_writes(c: LanguageClient, limit: int | None) -> None:
    """RLIMIT_FSIZE of the daemon: 0 makes every write to a regular file fail as on a full disk;
    None lifts it again."""
    pid = c._server.pid  # type: ignore[attr-defined]
    _soft, hard = resource.prlimit(pid, resource.RLIMIT_FSIZE)
    resource.prlimit(pid, resource.RLIMIT_FSIZE, (hard if limit is None else limit, hard))


@pytest.mark.parametrize("backend", ["yaml", "sqlite"])
async def test_a_full_disk_refuses_a_memory_with_a_clear_error_and_loses_nothing(tmp_path, backend):
    if backend == "yaml":
        store = yaml_copy(tmp_path)
        listing = lambda: sorted(os.listdir(store / "memories"))  # noqa: E731
    else:
        store = tmp_path / "store.db"
        shutil.copyfile(SHOP / "store.db", store)
        listing = lambda: (sorted(os.listdir(tmp_path)), store.read_bytes())  # noqa: E731
    c = await start(store)
    try:
        before = listing()
        count = (await status(c))["counts"]["memory"]
        limit_writes(c, 0)
        with pytest.raises(JsonRpcException) as err:
            await request(
                c,
                "slayer/saveMemory",
                {"learning": "Tundra orders ship from the north depot.", "entities": ["books.sku"]},
            )
        assert err.value.code == t.LSPErrorCodes.RequestFailed.value
        reason = {"yaml": "File too large (EFBIG)", "sqlite": "disk I/O error (SQLITE_IOERR_WRITE)"}[backend]
        assert "slayer/saveMemory: cannot" in str(err.value) and reason in str(err.value)
        assert listing() == before  # no partial file, no row, no journal left
        # the store changes meanwhile: seen (the index lives in memory), the cache write fails quietly
        if backend == "yaml":
            (store / BOOKS).write_text((store / BOOKS).read_text().replace(OLD, NEW))
            await eventually(lambda: hover(c), lambda h: NEW in h, "an edit while the disk is full")
            await asyncio.sleep(2.5)  # the compaction that writes the cache snapshot runs and fails
        assert (await status(c))["counts"]["memory"] == count

        limit_writes(c, None)  # space again
        saved = await request(
            c,
            "slayer/saveMemory",
            {"learning": "Tundra orders ship from the north depot.", "entities": ["books.sku"]},
        )
        assert saved["id"] in await search_ids(c, "tundra north depot")
        assert (await status(c))["counts"]["memory"] == count + 1
        assert not [m.message for m in c.messages if m.type == t.MessageType.Error]
    finally:
        await stop_client(c)
