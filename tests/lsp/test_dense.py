"""The dense search channel inside the daemon, with the real bundled model (the one LSP test that
loads it): a question that shares no word with the store finds its answer by meaning once the
background worker has embedded the store; switching the channel off (didChangeConfiguration) takes
the meaning away again, and switching it back on reuses the vectors stored beside the store."""

from __future__ import annotations

import pytest
import pytest_asyncio
from lsprotocol import types as t

from .support import copy_store, eventually, start_client, stop_client

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow]

QUESTION = "earnings"  # no document of the jaffle store holds the word (nor a fuzzy match of it)
EMBED_WAIT_S = 240.0  # model load and 74 texts on a slow CI machine


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(tmp_path_factory):
    store = copy_store(tmp_path_factory)
    c = await start_client(store, "neovim@v0.7.0", dense=True)
    c.store = store  # type: ignore[attr-defined]
    yield c
    await stop_client(c)


async def status(client) -> dict:
    return _plain(await client.protocol.send_request_async("slayer/status", {}))


def _plain(value):
    if hasattr(value, "_asdict"):
        return {k: _plain(v) for k, v in value._asdict().items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


async def search(client, question: str, **params) -> dict:
    return _plain(
        await client.protocol.send_request_async(
            "slayer/search", {"question": question, "max_results": 5, **params}
        )
    )


def embedded(s: dict) -> bool:
    e = s.get("embedding")
    return bool(e) and e["state"] == "idle" and e["pending"] == 0 and e["rows"] > 0


async def test_meaning_is_found_once_the_worker_has_embedded(client):
    early = await search(client, QUESTION)
    if early["warnings"]:  # answered before the worker finished: it says so, and ranks what it has
        assert all(w.startswith("dense:") for w in early["warnings"])
    else:  # a complete answer only once everything is embedded
        assert embedded(await status(client))
    s = await eventually(
        lambda: status(client), embedded, "the worker to embed the store", timeout=EMBED_WAIT_S
    )
    e = s["embedding"]
    assert e["model"] == "local/all-MiniLM-L6-v2-int8-dyn" and e["dim"] == 384 and e["failed"] == 0
    assert e["rows"] == e["embedded"] + e["reused"] and e["warnings"] == []
    assert e["store"] == str(client.store / "embeddings.db")
    assert s["options"]["embedding"] == {"enable": True, "model": None, "switchModel": False}
    got = await search(client, QUESTION)
    ids = [h["id"] for h in got["results"]]
    assert got["warnings"] == [] and "jaffle.orders.total_revenue" in ids
    memories = [h["id"] for h in (await search(client, QUESTION, kinds=["memory"], limit=3))["results"]]
    assert "kb.revenue" in memories


async def test_switching_the_channel_off_and_on(client):
    await eventually(lambda: status(client), embedded, "the worker to embed the store", timeout=EMBED_WAIT_S)
    client.workspace_did_change_configuration(
        t.DidChangeConfigurationParams(settings={"slayerLsp": {"embedding": {"enable": False}}})
    )
    s = await eventually(
        lambda: status(client),
        lambda s: s.get("ready") and s["options"]["embedding"]["enable"] is False,
        "the engine without embeddings",
    )
    assert s["embedding"] is None
    assert (await search(client, QUESTION))["results"] == []  # lexically, nothing matches

    client.workspace_did_change_configuration(
        t.DidChangeConfigurationParams(settings={"slayerLsp": {"embedding": {"enable": True}}})
    )
    s = await eventually(
        lambda: status(client),
        lambda s: s.get("ready") and embedded(s),
        "the engine with embeddings again",
        timeout=EMBED_WAIT_S,
    )
    assert s["embedding"]["embedded"] == 0  # the rows were loaded from the store, nothing embedded again
    assert "kb.revenue" in [
        h["id"] for h in (await search(client, QUESTION, kinds=["memory"], limit=3))["results"]
    ]
