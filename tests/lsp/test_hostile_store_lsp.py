"""A file or row planted in the store while the daemon serves (issue #14, classes 4-7), end to end over
stdio. The cases are those of ``tests/test_hostile_store.py``: links to ``/proc/self/environ``, to a
file and to a directory outside, a FIFO, a dangling link, billion laughs in a model's ``meta`` and in a
memory's query, nesting 999 and 10**5 deep, a 50 MB file, and every kind of bad SQLite row.

Each time: ``slayer/status`` names the path (or row) with the reason, the next search answers exactly
as on the clean store, nothing of the daemon's environment comes back, and once the planted thing is
gone the issue is too. A second test starts the daemon on a store holding every case at once, twice
(cold, then from the on-disk cache). Watchdogs, not timings: no request may take more than 10 s and the
daemon's RSS may not grow by more than 512 MiB.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest

from tests.test_hostile_store import SQLITE_CASES, YAML_CASES, outside, plant_rows, sqlite_store, yaml_store

from .support import eventually, request, start_client, stop_client

pytestmark = [pytest.mark.asyncio(loop_scope="function"), pytest.mark.slow]

QUESTIONS = ("stock keeping unit", "customer city", "discount revenue")
SECRET = "s3cr3t-of-the-daemon"
REQUEST_S = 10.0
RSS_GROWTH_KB = 512 * 1024


def rss_kb(c) -> int:
    with open(f"/proc/{c._server.pid}/status") as fh:  # noqa: SLF001 - the daemon's process
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


async def call(c, method: str, params) -> dict:
    """One request under the watchdog."""
    try:
        return await asyncio.wait_for(request(c, method, params), REQUEST_S)
    except TimeoutError:
        raise AssertionError(f"{method} took more than {REQUEST_S:g} s") from None


async def answers(c) -> dict[str, list[str]]:
    out = {}
    for q in QUESTIONS:
        res = await call(c, "slayer/search", {"question": q, "max_results": 8})
        assert SECRET not in repr(res)
        out[q] = [h["id"] for h in res["results"]]
    return out


async def status(c) -> dict:
    return await call(c, "slayer/status", {})


async def start(store: Path, monkeypatch, cache: Path):
    monkeypatch.setenv("SLAYER_LSP_CACHE_DIR", str(cache))
    monkeypatch.setenv("SLAYER_HOSTILE_SECRET", SECRET)  # in the daemon's /proc/self/environ
    return await start_client(store, "neovim@v0.7.0")


def has_issue(st: dict, where: str, message: str) -> bool:
    return any(where in i and message in i for i in st["issues"])


@pytest.mark.parametrize("backend", ["yaml", "sqlite"])
async def test_each_planted_document_is_refused_while_the_daemon_serves(tmp_path, monkeypatch, backend):
    if backend == "yaml":
        store = yaml_store(tmp_path)
        out = outside(tmp_path)
        cases = YAML_CASES
    else:
        store = sqlite_store(tmp_path)
        clean = tmp_path / "clean.db"
        shutil.copyfile(store, clean)
        cases = SQLITE_CASES
    c = await start(store, monkeypatch, tmp_path / "cache")
    try:
        baseline = await answers(c)
        rss0 = rss_kb(c)
        for case in cases:
            if backend == "yaml":
                path = case.plant(store, out)
                where = str(path)
            else:
                plant_rows(store, case.sql)
                where = f"[{case.table} {case.row!r}]"
            st = await eventually(
                lambda: status(c),
                lambda s, w=where, m=case.message: has_issue(s, w, m),
                f"the load issue of {case.name}",
            )
            assert st["load_issues"] == 1 and st["readable"], (case.name, st["issues"])
            assert await answers(c) == baseline, case.name
            assert rss_kb(c) - rss0 < RSS_GROWTH_KB, case.name
            if backend == "yaml":  # gone again: the issue goes with it
                path.unlink()
            else:
                tmp = store.with_suffix(".restore")
                shutil.copyfile(clean, tmp)
                os.replace(tmp, store)
            await eventually(lambda: status(c), lambda s: s["load_issues"] == 0, f"{case.name} removed")
        assert await answers(c) == baseline
    finally:
        await stop_client(c)


@pytest.mark.parametrize("backend", ["yaml", "sqlite"])
async def test_a_store_holding_every_case_starts_cold_and_from_the_cache(tmp_path, monkeypatch, backend):
    if backend == "yaml":
        store = yaml_store(tmp_path)
    else:
        store = sqlite_store(tmp_path)
    c = await start(store, monkeypatch, tmp_path / "cache")
    try:
        baseline = await answers(c)
    finally:
        await stop_client(c)
    if backend == "yaml":  # each case planted in a scratch copy, then moved in under a name of its own
        out = outside(tmp_path)
        for i, case in enumerate(YAML_CASES):
            scratch = yaml_store(tmp_path / f"scratch{i}")
            rel = case.plant(scratch, out).relative_to(scratch)
            os.rename(scratch / rel, store / rel.parent / f"{rel.stem}{i}{rel.suffix}")
        expected = len(YAML_CASES)
    else:
        for i, case in enumerate(SQLITE_CASES):
            plant_rows(store, tuple(s.replace("'evil'", f"'evil{i}'") for s in case.sql))
        expected = len(SQLITE_CASES)
    for start_kind in ("cold", "from the cache"):
        c = await start(store, monkeypatch, tmp_path / "cache")
        try:
            rss0 = rss_kb(c)
            st = await status(c)
            assert st["readable"] and st["load_issues"] == expected, (start_kind, st["issues"])
            assert all(i.count(": ") >= 1 for i in st["issues"])
            assert await answers(c) == baseline, start_kind
            inspected = await call(c, "slayer/inspect", {"refs": ["books.sku", "memory:x"]})
            assert SECRET not in repr(inspected)
            assert rss_kb(c) - rss0 < RSS_GROWTH_KB
        finally:
            await stop_client(c)
