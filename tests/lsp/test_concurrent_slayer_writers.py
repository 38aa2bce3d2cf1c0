"""Hundreds of memories saved at once on one store: through the daemon's ``slayer/saveMemory``
(pipelined from several client tasks) while motley-slayer's own ``slayer memory save`` CLI runs in
other processes. Nothing is lost or written twice, ids are unique and leave no gap (SLayer's
max + 1 rule held under the shared lock), every memory loads in SLayer with what its writer said,
and the daemon's own view catches up with the writes it did not make.

The daemon-free version of this race (our writer in plain processes) is in tests/test_writer.py;
its SLayer worker and store probes are reused here."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import time

import pytest

from slayer_lsp.store.locate import StoreLocation
from tests import slayer_oracle as oracle
from tests.test_writer import SLAYER_WORKER, memory_ids, stray_temp_files

from .support import copy_store, eventually, request, start_client, stop_client

pytestmark = [pytest.mark.skipif(oracle.slayer_python() is None, reason=oracle.SKIP_REASON), pytest.mark.slow]

FIRST_NEW_ID = 13  # the fixture's highest int-shaped id is 12
DAEMON_TASKS, DAEMON_SAVES = 4, 50  # 200 saves through the daemon ...
SLAYER_WORKERS, SLAYER_SAVES = 2, 50  # ... and 100 by SLayer's CLI, at the same time
SHARED_EVERY = 6  # every side also upserts one common id now and then
QUERY = {"source_model": "orders", "measures": ["sum(subtotal)"], "dimensions": ["status"]}
START_S = 120.0  # SLayer's imports on a busy two-core machine


async def daemon_saves(client, tag: str, count: int) -> list[tuple[str, str]]:
    """``count`` new memories from one client task (one in four linked by a query), each awaited
    before the next, so the tasks' requests interleave in the daemon."""
    saved = []
    for i in range(count):
        learning = f"{tag} note {i}"
        linked = {"query": QUERY} if i % 4 == 3 else {"entities": ["orders.status", "stores"]}
        got = await request(client, "slayer/saveMemory", {"learning": learning, **linked})
        assert got["created"] is True, got
        saved.append((got["id"], learning))
        if i % SHARED_EVERY == 0:
            await request(
                client,
                "slayer/saveMemory",
                {"learning": f"{tag} shared {i}", "entities": ["stores"], "id": "kb.shared"},
            )
    return saved


async def keep_searching(client, stop: asyncio.Event) -> int:
    """Reads while the store churns: every search must answer."""
    n = 0
    while not stop.is_set():
        got = await request(client, "slayer/search", {"question": "note shared", "max_results": 20})
        assert isinstance(got["results"], list)
        n += 1
    return n


def start_slayer_workers(store, gate, home) -> list[subprocess.Popen]:
    return [
        subprocess.Popen(
            [
                oracle.slayer_python(),
                "-c",
                SLAYER_WORKER,
                str(store),
                f"slayer{k}",
                str(SLAYER_SAVES),
                str(gate),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=oracle.slayer_env(home),
        )
        for k in range(SLAYER_WORKERS)
    ]


async def wait_ready(workers: list[subprocess.Popen], gate) -> None:
    deadline = time.monotonic() + START_S
    while len(list(gate.glob("ready-*"))) < len(workers):
        failed = [w.communicate() for w in workers if w.poll() is not None]
        assert not failed, f"a SLayer worker died before the start: {failed}"
        assert time.monotonic() < deadline, "the SLayer workers did not start"
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("backend", ["yaml", "sqlite"])
async def test_daemon_and_slayer_cli_save_hundreds_of_memories_at_once(tmp_path_factory, tmp_path, backend):
    store = copy_store(tmp_path_factory, sqlite=backend == "sqlite")
    loc = StoreLocation(backend, store)
    initial = memory_ids(loc)
    gate = tmp_path / "gate"
    gate.mkdir()
    workers = start_slayer_workers(store, gate, tmp_path)
    client = None
    try:
        client = await start_client(store, "neovim@v0.7.0")
        await wait_ready(workers, gate)
        (gate / "go").touch()
        stop = asyncio.Event()
        searcher = asyncio.ensure_future(keep_searching(client, stop))
        ours = await asyncio.gather(
            *(daemon_saves(client, f"lsp{k}", DAEMON_SAVES) for k in range(DAEMON_TASKS))
        )
        results = await asyncio.gather(*(asyncio.to_thread(w.communicate, timeout=START_S) for w in workers))
        stop.set()
        assert await searcher > 0
        for w, (_out, err) in zip(workers, results, strict=True):
            assert w.returncode == 0, err[-3000:]
        saved = [tuple(pair) for part in ours for pair in part]
        saved += [tuple(pair) for out, _ in results for pair in json.loads(out)]

        ids = [memory_id for memory_id, _ in saved]
        total = DAEMON_TASKS * DAEMON_SAVES + SLAYER_WORKERS * SLAYER_SAVES
        assert len(ids) == len(set(ids)) == total  # no id handed out twice
        assert set(ids) == {str(n) for n in range(FIRST_NEW_ID, FIRST_NEW_ID + total)}  # and none skipped
        expected = initial | set(ids) | {"kb.shared"}
        assert memory_ids(loc) == expected  # nothing lost, nothing extra
        assert not stray_temp_files(loc)

        loaded = oracle.ok(oracle.ask([{"op": "load", "store": str(store)}])[0])
        assert loaded["errors"] == []
        assert set(loaded["memories"]) == expected
        assert len(loaded["order"]) == len(expected)  # SLayer lists each memory once
        for memory_id, learning in saved:
            assert loaded["memories"][memory_id]["learning"] == learning, memory_id
        assert re.fullmatch(r"(lsp|slayer)\d shared \d+", loaded["memories"]["kb.shared"]["learning"])

        # the daemon sees the same store: SLayer's writes reach it through the watcher
        await eventually(
            lambda: request(client, "slayer/status", {}),
            lambda s: s["counts"].get("memory") == len(expected),
            "the daemon to count every memory",
        )
        refs = [f"memory:{memory_id}" for memory_id in sorted(expected)]
        items = (await request(client, "slayer/inspect", {"refs": refs}))["items"]
        assert [i.get("error") for i in items if i.get("error")] == []
        assert {i["canonical"]: i["learning"] for i in items} == {
            f"memory:{m}": loaded["memories"][m]["learning"] for m in expected
        }
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
                w.communicate()
        if client is not None:
            await stop_client(client)
