"""slayer/search, slayer/inspect, slayer/status and their workspace/executeCommand twins; bad params
answer -32602 with a message, an unknown method -32601, and nothing hangs."""

from __future__ import annotations

import json

import pytest
import pytest_asyncio
from lsprotocol import types as t
from pygls.exceptions import JsonRpcInvalidParams, JsonRpcMethodNotFound

from .support import (
    CLIENTS,
    FIXTURES,
    copy_store,
    eventually,
    plain,
    request,
    start_client,
    stop_client,
    uri_of,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=CLIENTS)
async def client(request, tmp_path_factory):
    store = copy_store(tmp_path_factory)
    c = await start_client(store, request.param)
    c.store = store  # type: ignore[attr-defined]
    yield c
    await stop_client(c)


@pytest.mark.parametrize("name", ["17_q_and_entities", "08_e_tie_order", "13_e_stale_tag"])
async def test_search_answers_like_slayer(client, name):
    case = json.loads((FIXTURES / "expected" / f"{name}.json").read_text())
    got = await request(client, "slayer/search", {**case["call"], "ranking": "slayer"})
    want = case["response"]
    assert [(h["kind"], h["id"]) for h in got["results"]] == [(h["kind"], h["id"]) for h in want["results"]]
    assert got["warnings"] == want["warnings"]


async def test_search_keeps_keys_that_are_not_identifiers(client):
    query = {"source_model": "orders", "dimensions": ["stores.name"], "order": [{"stores.name": "desc"}]}
    got = await request(client, "slayer/search", {"query": query})
    assert "jaffle.stores.name" in got["resolved_input_entities"]


@pytest.mark.parametrize(
    ("method", "params", "message"),
    [
        ("slayer/search", {"max_results": "ten"}, "Expected `int`, got `str` - at `$.max_results`"),
        ("slayer/search", {"question": "x", "colour": 1}, "unknown field `colour`"),
        ("slayer/search", [1, 2], "params must be an object"),
        ("slayer/search", {"question": "x", "max_results": 0}, "max_results"),
        ("slayer/search", {"question": "x", "datasource": "nosuch"}, "nosuch"),
        ("slayer/inspect", {"refs": "orders"}, None),
        ("slayer/inspect", {"refs": []}, "'refs' must be a non-empty list of strings"),
        ("slayer/inspect", {"ref": ["orders"]}, "unknown parameter(s) ['ref']"),
        ("slayer/status", {"verbose": True}, "takes no parameters"),
    ],
)
async def test_invalid_params(client, method, params, message):
    if message is None:  # a single string is accepted as one ref
        assert (await request(client, method, params))["items"][0]["canonical"] == "jaffle.orders"
        return
    with pytest.raises(JsonRpcInvalidParams) as info:
        await request(client, method, params)
    assert message in str(info.value)


async def test_unknown_method(client):
    with pytest.raises(JsonRpcMethodNotFound):
        await request(client, "slayer/nosuch", {})


async def test_inspect_with_location(client):
    got = await request(client, "slayer/inspect", {"refs": ["orders.status", "memory:5", "nosuch"]})
    status, memory, missing = got["items"]
    assert status["canonical"] == "jaffle.orders.status" and status["samples"] == [
        "completed",
        "returned",
        "pending",
    ]
    assert status["location"]["uri"] == uri_of(client.store / "models" / "jaffle" / "orders.yaml")
    assert status["location"]["range"]["start"]["line"] == 42
    assert {"tag": "jaffle.customers.loyalty_tier", "stale": True} in memory["tags"]
    assert missing["error"].startswith("Entity 'nosuch' not found")


async def test_status(client):
    got = await request(client, "slayer/status", {})
    assert got["ready"] and got["backend"] == "yaml" and got["store"] == str(client.store)
    assert got["counts"]["model"] == 8 and got["counts"]["memory"] == 21
    assert got["readable"] and got["error"] is None and got["load_issues"] == len(got["issues"])
    assert (
        got["options"]["diagnostics"]["debounceMs"] == 20 and got["options"]["embedding"]["enable"] is False
    )
    assert got["embedding"] is None  # the dense channel is off in these servers
    assert got["open_documents"] == 0 and got["watching"] == str(client.store)
    # the start-up's background work (each datasource's own index) ends, and says so
    await eventually(
        lambda: request(client, "slayer/status", {}), lambda r: r["warming"] is False, "the warm-up's end"
    )


@pytest.mark.parametrize(
    ("command", "arguments", "check"),
    [
        ("slayer.search", [{"question": "net sales", "max_results": 2}], lambda r: len(r["results"]) == 2),
        ("slayer.inspect", [{"refs": ["jaffle"]}], lambda r: r["items"][0]["kind"] == "datasource"),
        (
            "slayer.inspect",
            ["jaffle", "memory:1"],
            lambda r: [i["canonical"] for i in r["items"]] == ["jaffle", "memory:1"],
        ),
        ("slayer.status", [], lambda r: r["ready"] is True),
        ("slayer.status", None, lambda r: r["ready"] is True),
    ],
)
async def test_execute_command_twins(client, command, arguments, check):
    res = await client.workspace_execute_command_async(
        t.ExecuteCommandParams(command=command, arguments=arguments)
    )
    assert check(plain(res))


async def test_execute_command_bad_arguments(client):
    with pytest.raises(JsonRpcInvalidParams):
        await client.workspace_execute_command_async(
            t.ExecuteCommandParams(command="slayer.search", arguments=[{"max_results": -1}])
        )
    with pytest.raises(JsonRpcInvalidParams):
        await client.workspace_execute_command_async(
            t.ExecuteCommandParams(command="slayer.nosuch", arguments=[])
        )


async def test_requests_on_documents_that_are_not_open(client):
    where = t.TextDocumentIdentifier(uri="file:///ws/never-opened.query.yaml")
    assert (
        await client.text_document_hover_async(
            t.HoverParams(text_document=where, position=t.Position(line=0, character=0))
        )
        is None
    )
    assert (
        await client.text_document_completion_async(
            t.CompletionParams(text_document=where, position=t.Position(line=0, character=0))
        )
        is None
    )


async def test_standard_request_with_wrong_types_is_answered(client):
    """pygls alone would drop it without a response and the client would wait forever. The pygls
    client refuses to send such params, so they go out as raw JSON."""
    import asyncio
    import uuid
    from concurrent.futures import Future

    proto = client.protocol
    msg_id, answer = str(uuid.uuid4()), Future()
    proto._request_futures[msg_id] = answer
    proto._send_data(
        {
            "jsonrpc": "2.0",
            "id": msg_id,
            "method": "textDocument/hover",
            "params": {"textDocument": 5, "position": "here"},
        }
    )
    with pytest.raises(JsonRpcInvalidParams) as info:
        await asyncio.wait_for(asyncio.wrap_future(answer), 30)
    assert "textDocument/hover: invalid params" in str(info.value)
    proto._send_data(
        {"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {"textDocument": {"uri": 3}}}
    )
    await eventually(lambda: request(client, "slayer/status", {}), lambda s: s["ready"], "still serving")
    assert not any("Error in server" in m.message for m in client.messages), [
        m.message for m in client.messages
    ]
