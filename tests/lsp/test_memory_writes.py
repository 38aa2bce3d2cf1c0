"""slayer/saveMemory and slayer/forgetMemory (and their workspace/executeCommand twins): a memory saved
through the daemon is found by the very next search, clears a stale tag in an open document, and is
what motley-slayer itself loads; bad params answer -32602, a store that refuses the write -32803."""

from __future__ import annotations

import json

import pytest
import pytest_asyncio
from lsprotocol import types as t
from pygls.exceptions import JsonRpcException, JsonRpcInvalidParams

from tests import slayer_oracle as oracle

from .support import codes, copy_store, diagnostics, open_doc, plain, request, start_client, stop_client

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow]
needs_slayer = pytest.mark.skipif(oracle.slayer_python() is None, reason=oracle.SKIP_REASON)


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=["yaml", "sqlite"])
async def client(request, tmp_path_factory):
    store = copy_store(tmp_path_factory, sqlite=request.param == "sqlite")
    c = await start_client(store, "visual-studio-code")
    c.store = store  # type: ignore[attr-defined]
    yield c
    await stop_client(c)


async def search_ids(client, question: str) -> list[str]:
    got = await request(client, "slayer/search", {"question": question, "max_results": 50})
    return [h["id"] for h in got["results"]]


async def test_saved_memory_is_searchable_at_once_and_loads_in_slayer(client):
    assert "zanzibar" not in " ".join(await search_ids(client, "zanzibar"))
    saved = await request(
        client,
        "slayer/saveMemory",
        {
            "learning": "Zanzibar stores report refunds a day late.",
            "entities": ["stores.name", "orders.status"],
            "description": "late refunds",
        },
    )
    assert saved["created"] is True and saved["warnings"] == []
    assert saved["entities"] == ["jaffle.stores.name", "jaffle.orders.status"]
    assert saved["id"] == "13"  # SLayer's rule: max(int-shaped id) + 1
    # no waiting for the watcher: the answer came after the engine saw the write
    assert saved["id"] in await search_ids(client, "zanzibar refunds")
    status = await request(client, "slayer/status", {})
    assert status["counts"]["memory"] == 22
    if oracle.slayer_python() is not None:
        got = oracle.ok(oracle.ask([{"op": "get", "store": str(client.store), "ids": [saved["id"]]}])[0])
        memory = got[saved["id"]]
        assert memory["learning"] == "Zanzibar stores report refunds a day late."
        assert memory["entities"] == saved["entities"] and memory["description"] == "late refunds"

    again = await request(
        client,
        "slayer/saveMemory",
        {
            "learning": "Zanzibar stores report refunds two days late.",
            "entities": ["stores.name"],
            "id": saved["id"],
        },
    )
    assert again["created"] is False and again["entities"] == ["jaffle.stores.name"]

    gone = await request(client, "slayer/forgetMemory", {"id": saved["id"]})
    assert gone == {"forgotten": True}
    assert saved["id"] not in await search_ids(client, "zanzibar refunds")
    assert await request(client, "slayer/forgetMemory", {"id": saved["id"]}) == {"forgotten": False}


async def test_answers_outside_ascii_are_framed_by_their_bytes(client):
    """Answers are written already encoded, as UTF-8: the frame's Content-Length counts bytes, so a
    client reads the next message where it starts (a count of characters would cut this one short)."""
    learning = "Crème brûlée orders from 東京 ship by ☕ courier; 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 notes stay as written."
    saved = await request(
        client, "slayer/saveMemory", {"learning": learning, "entities": ["orders"], "id": "kb.utf8"}
    )
    try:
        found = await request(client, "slayer/search", {"question": "crème brûlée 東京 courier"})
        hit = next(h for h in found["results"] if h["id"] == saved["id"])
        assert learning in json.dumps(hit, ensure_ascii=False)
        (item,) = (await request(client, "slayer/inspect", {"refs": [f"memory:{saved['id']}"]}))["items"]
        assert learning in json.dumps(item, ensure_ascii=False)
        assert (await request(client, "slayer/status", {}))["ready"] is True  # the stream is still in step
    finally:
        await request(client, "slayer/forgetMemory", {"id": saved["id"]})


@needs_slayer
async def test_a_query_memory_is_stored_as_slayer_stores_it(client):
    query = {
        "source_model": "orders",
        "measures": [{"formula": "sum(order_total)"}],
        "dimensions": ["stores.name"],
    }
    saved = await request(
        client,
        "slayer/saveMemory",
        {"learning": "Quokka revenue by store", "linked_entities": query, "id": "kb.quokka"},
    )
    assert saved == {
        "id": "kb.quokka",
        "entities": ["jaffle.orders", "jaffle.stores.name", "jaffle.orders.order_total"],
        "created": True,
        "warnings": [],
    }
    assert "kb.quokka" in await search_ids(client, "quokka revenue")
    loaded = oracle.ok(oracle.ask([{"op": "load", "store": str(client.store)}])[0])
    assert loaded["errors"] == []
    ours = loaded["memories"]["kb.quokka"]
    assert ours["query"]["source_model"] == "orders" and ours["entities"] == saved["entities"]
    assert (await request(client, "slayer/forgetMemory", {"id": "kb.quokka"}))["forgotten"]


async def test_a_stale_tag_in_an_open_document_clears_when_its_memory_is_saved(client):
    uri = "file:///ws/memories/draft.md"
    open_doc(client, uri, "---\nentities:\n- memory:kb.walrus\n---\nsee the walrus note\n", "markdown")
    await diagnostics(client, uri, lambda d: codes(d) == [("stale-tag", 2)])
    await request(
        client, "slayer/saveMemory", {"learning": "walrus", "entities": ["orders"], "id": "kb.walrus"}
    )
    await diagnostics(client, uri, lambda d: len(d) == 0, "the tag to resolve")
    await request(client, "slayer/forgetMemory", {"id": "kb.walrus"})
    await diagnostics(client, uri, lambda d: codes(d) == [("stale-tag", 2)], "the tag to become stale again")


@pytest.mark.parametrize(
    ("method", "params", "message"),
    [
        ("slayer/saveMemory", {"entities": ["orders"]}, "'learning' must be a string, got null"),
        (
            "slayer/saveMemory",
            {"learning": "x", "entities": "orders"},
            "'entities' must be a list of strings",
        ),
        ("slayer/saveMemory", {"learning": "x", "entities": [1]}, "'entities' must be a list of strings"),
        (
            "slayer/saveMemory",
            {"learning": "x", "query": ["orders"]},
            "'query' must be an object, got a list",
        ),
        ("slayer/saveMemory", {"learning": "x"}, "give 'entities'"),
        (
            "slayer/saveMemory",
            {"learning": "x", "entities": ["orders"], "id": True},
            "'id' must be a string or an integer",
        ),
        (
            "slayer/saveMemory",
            {"learning": "x", "entities": ["orders"], "tags": []},
            "unknown parameter(s) ['tags']",
        ),
        (
            "slayer/saveMemory",
            {"learning": "x", "entities": ["orders"], "linked_entities": ["orders"]},
            "not both",
        ),
        ("slayer/saveMemory", [1], "params must be an object"),
        # refused by the writer: its (SLayer's) message
        (
            "slayer/saveMemory",
            {"learning": "  ", "entities": ["orders"]},
            "learning text must be a non-empty string.",
        ),
        (
            "slayer/saveMemory",
            {"learning": "x", "entities": ["nosuch"]},
            "cannot resolve 'nosuch': Entity 'nosuch' not found",
        ),
        ("slayer/saveMemory", {"learning": "x", "entities": []}, "linked_entities must be a non-empty list"),
        (
            "slayer/saveMemory",
            {"learning": "x", "entities": ["orders"], "id": "a/b"},
            "forbidden character '/'",
        ),
        (
            "slayer/saveMemory",
            {"learning": "x", "entities": ["memory:nosuch"]},
            "No memory with id 'nosuch'.",
        ),
        ("slayer/forgetMemory", {}, "'id' must be a string or an integer, got null"),
        ("slayer/forgetMemory", {"id": 1, "all": True}, "unknown parameter(s) ['all']"),
    ],
)
async def test_invalid_params(client, method, params, message):
    before = (await request(client, "slayer/status", {}))["counts"]["memory"]
    with pytest.raises(JsonRpcInvalidParams) as info:
        await request(client, method, params)
    assert message in str(info.value)
    assert (await request(client, "slayer/status", {}))["counts"]["memory"] == before


async def test_execute_command_twins(client):
    saved = await client.workspace_execute_command_async(
        t.ExecuteCommandParams(
            command="slayer.saveMemory",
            arguments=[{"learning": "Okapi orders ship late", "entities": ["orders"]}],
        )
    )
    saved = plain(saved)
    assert saved["created"] and saved["entities"] == ["jaffle.orders"]
    assert saved["id"] in await search_ids(client, "okapi")
    gone = await client.workspace_execute_command_async(
        t.ExecuteCommandParams(command="slayer.forgetMemory", arguments=[saved["id"]])
    )
    assert plain(gone) == {"forgotten": True}
    with pytest.raises(JsonRpcInvalidParams):
        await client.workspace_execute_command_async(
            t.ExecuteCommandParams(command="slayer.saveMemory", arguments=[{"learning": 3}])
        )


async def test_a_store_that_refuses_the_write_is_a_request_failure(client):
    if client.store.is_file():
        pytest.skip("the legacy-layout refusal is a YAML store's")
    legacy = client.store / "memories.yaml"
    legacy.write_text("[]\n")
    try:
        with pytest.raises(JsonRpcException) as info:
            await request(client, "slayer/saveMemory", {"learning": "x", "entities": ["orders"]})
        assert info.value.code == t.LSPErrorCodes.RequestFailed.value
        assert "legacy memories.yaml" in str(info.value)
    finally:
        legacy.unlink()
