"""``slayer-lsp mcp`` end to end over stdio, with the official SDK's own client, in both protocol
eras it speaks (the 2025 initialize handshake, "legacy", and 2026-07-28, which the client picks by
itself): the tools and their schemas, every tool called (the client validates each structured
answer against the announced output schema), resources read and listed page by page, a change on
disk announced, scope holding on every path, hostile arguments answered with tool errors while
the server keeps serving."""

from __future__ import annotations

import json
import os
import sys
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp.shared.exceptions import MCPError

from slayer_lsp.mcp import types as mt

from ..lsp.support import REPO, copy_store
from ..test_reachability import EXPECTED, SECRETS, TAGS, leaks, write_store

pytestmark = [pytest.mark.anyio, pytest.mark.slow]
MODES = ["legacy", "auto"]
WAIT_S = 30


@pytest.fixture
def anyio_backend():
    return "asyncio"


@asynccontextmanager
async def connect(
    store: Path,
    mode: str = "legacy",
    args: list[str] | None = None,
    env: dict[str, str] | None = None,
    **client_options,
):
    """A client of a fresh ``python -m slayer_lsp mcp`` on ``store`` (no embedding model)."""
    server = StdioServerParameters(
        command=sys.executable,
        args=["-m", "slayer_lsp", "mcp", "--storage", str(store), "--no-embedding", *(args or [])],
        cwd=str(REPO),
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
    )
    async with Client(server, mode=mode, cache=None, **client_options) as client:
        yield client


async def indexed(c) -> None:
    """Wait for the first index (every tool but status waits for it)."""
    structured(await c.call_tool("inspect", {"refs": ["memory:1"]}))
    assert structured(await c.call_tool("status", {}))["ready"]


def structured(result) -> dict:
    assert not result.is_error, result.content
    assert json.loads(result.content[0].text) == result.structured_content
    return result.structured_content


def error_text(result) -> str:
    assert result.is_error, result.structured_content
    return result.content[0].text


@pytest.mark.parametrize("mode", MODES)
async def test_every_tool_over_stdio(tmp_path_factory, mode):
    store = copy_store(tmp_path_factory)
    async with connect(store, mode) as c:
        tools = (await c.list_tools()).tools
        assert [t.name for t in tools] == [s.name for s in mt.TOOLS]
        for tool, spec in zip(tools, mt.TOOLS, strict=True):
            assert tool.input_schema == mt.json_schema(spec.params, closed=True)
            assert tool.output_schema == mt.json_schema(spec.result)
            assert "Example:" in tool.description
        found = structured(
            await c.call_tool("search", {"question": "order total including tax", "max_results": 5})
        )
        assert "jaffle.orders.order_total" in [h["id"] for h in found["results"]]
        only = structured(
            await c.call_tool("search", {"question": "sales tax", "kinds": ["memory"], "limit": 3})
        )
        assert only["results"] and {h["kind"] for h in only["results"]} == {"memory"}
        facets = structured(
            await c.call_tool("search_facets", {"kind": "column", "facets": {"meaning": "city"}})
        )
        assert facets["results"] and all(h["kind"] == "column" for h in facets["results"])
        items = structured(
            await c.call_tool("inspect", {"refs": ["orders.order_total", "memory:1", "nosuch.x"]})
        )
        assert [i.get("canonical") for i in items["items"][:2]] == ["jaffle.orders.order_total", "memory:1"]
        assert "error" in items["items"][2]
        status = structured(await c.call_tool("status", {}))
        assert status["ready"] and status["counts"]["model"] == 8 and status["scope"]["datasources"] == []
        assert isinstance(status["warming"], bool)  # the start-up's background work, reported as such
        saved = structured(
            await c.call_tool(
                "save_memory",
                {
                    "learning": "Refunds arrive as negative order_total rows.",
                    "entities": ["orders.order_total"],
                },
            )
        )
        assert saved["created"] and saved["entities"] == ["jaffle.orders.order_total"]
        assert (store / "memories" / f"{saved['id']}.md").is_file()
        again = structured(await c.call_tool("search", {"entities": [f"memory:{saved['id']}"]}))
        assert again["resolved_input_entities"] == [f"memory:{saved['id']}"]
        assert structured(await c.call_tool("forget_memory", {"id": saved["id"]})) == {"forgotten": True}
        assert structured(await c.call_tool("forget_memory", {"id": saved["id"]})) == {"forgotten": False}
        assert not (store / "memories" / f"{saved['id']}.md").exists()


@pytest.mark.parametrize("mode", MODES)
async def test_resources_read_and_listed_page_by_page(tmp_path_factory, mode):
    store = copy_store(tmp_path_factory)
    async with connect(store, mode, env={"SLAYER_LSP_MCP_PAGE_SIZE": "7"}) as c:
        uris, cursor, pages = [], None, 0
        while True:
            page = await c.list_resources(cursor=cursor)
            assert len(page.resources) <= 7
            uris.extend(r.uri for r in page.resources)
            pages += 1
            cursor = page.next_cursor
            if cursor is None:
                break
        assert len(uris) == len(set(uris)) == 2 + 7 + 21 and pages == 5  # one of the 8 models is hidden
        assert uris[:2] == ["slayer://datasource/jaffle", "slayer://datasource/supplies"]
        model = json.loads((await c.read_resource("slayer://model/jaffle.orders")).contents[0].text)
        assert {"columns", "measures", "joins"} <= set(model)
        assert "order_total" in [col["name"] for col in model["columns"]]
        assert "1" in model["memories"]
        ds = json.loads((await c.read_resource("slayer://datasource/jaffle")).contents[0].text)
        assert "jaffle.orders" in ds["models"] and "connection_string" not in ds
        memory = json.loads((await c.read_resource("slayer://memory/1")).contents[0].text)
        assert memory["learning"].startswith("order_total includes sales tax")
        for bad in (
            "slayer://memory/999",
            "slayer://model/jaffle.nosuch",
            "file:///etc/passwd",
            "slayer://memory/..%2F..%2Fetc%2Fpasswd",
        ):
            with pytest.raises(MCPError, match="no such resource"):
                await c.read_resource(bad)
        with pytest.raises(MCPError, match="invalid cursor"):
            await c.list_resources(cursor="not-a-cursor")
        templates = await c.list_resource_templates()
        assert [t.uri_template for t in templates.resource_templates] == [
            u for u, _, _ in mt.RESOURCE_TEMPLATES
        ]


@pytest.mark.filterwarnings(
    "ignore::mcp.shared.exceptions.MCPDeprecationWarning"
)  # resources/subscribe is 2025's
async def test_an_edit_on_disk_is_announced_to_a_handshake_client(tmp_path_factory):
    store = copy_store(tmp_path_factory)
    seen: list[tuple[str, str | None]] = []
    changed = anyio.Event()

    async def on_message(message) -> None:
        method = getattr(message, "method", None)
        if method in ("notifications/resources/list_changed", "notifications/resources/updated"):
            seen.append((method, getattr(getattr(message, "params", None), "uri", None)))
            if method == "notifications/resources/updated":
                changed.set()

    async with connect(store, "legacy", message_handler=on_message) as c:
        await indexed(c)
        await c.session.subscribe_resource("slayer://memory/1")
        path = store / "memories" / "1.md"
        path.write_text(
            path.read_text().replace("order_total includes sales tax", "order_total holds the tax")
        )
        with anyio.fail_after(WAIT_S):
            await changed.wait()
        assert ("notifications/resources/list_changed", None) in seen
        assert ("notifications/resources/updated", "slayer://memory/1") in seen
        memory = json.loads((await c.read_resource("slayer://memory/1")).contents[0].text)
        assert memory["learning"].startswith("order_total holds the tax")


async def test_an_edit_on_disk_reaches_a_listening_client(tmp_path_factory):
    store = copy_store(tmp_path_factory)
    async with connect(store, "auto") as c:
        assert c.protocol_version == "2026-07-28"
        await indexed(c)
        async with c.listen(
            resources_list_changed=True, resource_subscriptions=["slayer://model/jaffle.orders"]
        ) as sub:
            path = store / "models" / "jaffle" / "orders.yaml"
            path.write_text(
                path.read_text().replace("Customer orders, one row per order.", "Orders, one per row.")
            )
            events = []
            with anyio.fail_after(WAIT_S):
                async for event in sub:
                    events.append(event)
                    if getattr(event, "uri", None) == "slayer://model/jaffle.orders":
                        break
        assert any(type(e).__name__ == "ResourcesListChanged" for e in events)
        model = json.loads((await c.read_resource("slayer://model/jaffle.orders")).contents[0].text)
        assert model["description"].startswith("Orders, one per row.")


async def test_scope_holds_on_every_tool_and_resource(tmp_path_factory):
    store = write_store(tmp_path_factory.mktemp("reach") / "store")
    async with connect(store, "legacy", args=["--access-tag", "ops"]) as c:
        answers = []
        for word in SECRETS[TAGS]:
            answers.append(
                structured(
                    await c.call_tool("search", {"question": word, "max_results": 50, "compact": False})
                )
            )
        assert not leaks(json.dumps(answers), TAGS)
        got = structured(await c.call_tool("search", {"entities": ["memory:2"]}))
        miss = structured(await c.call_tool("search", {"entities": ["memory:999"]}))
        assert got["results"] == miss["results"] == []
        items = structured(
            await c.call_tool("inspect", {"refs": ["shop.payroll", "memory:2", "shop.nosuch"]})
        )
        assert items["items"][0]["error"].replace("payroll", "nosuch") == items["items"][2]["error"]
        status = structured(await c.call_tool("status", {}))
        models, memories = EXPECTED[TAGS]
        assert status["counts"]["memory"] == len(memories)
        assert status["scope"] == {"datasources": [], "access_tags": ["ops"], "untagged_only": False}

        uris = [r.uri for r in (await c.list_resources()).resources]
        assert not leaks(json.dumps(uris), TAGS)
        assert {u.removeprefix("slayer://memory/") for u in uris if "/memory/" in u} == memories
        errors = []
        for hidden, missing in (
            ("slayer://model/shop.payroll", "slayer://model/shop.nosuch"),
            ("slayer://memory/2", "slayer://memory/999"),
        ):
            pair = []
            for uri in (hidden, missing):
                with pytest.raises(MCPError) as exc:
                    await c.read_resource(uri)
                pair.append(str(exc.value.message).replace(uri, "<uri>"))
            errors.append(pair)
        assert all(a == b for a, b in errors)

        refusals = [
            error_text(
                await c.call_tool(
                    "save_memory", {"id": mid, "learning": "overwrite", "entities": ["shop.orders"]}
                )
            ).replace(f"'{mid}'", "'<id>'")
            for mid in ("2", "99")
        ]
        assert refusals[0] == refusals[1]
        assert structured(await c.call_tool("forget_memory", {"id": "2"})) == {"forgotten": False}
        assert "Zanzibar" in (store / "memories" / "2.md").read_text()


async def test_hostile_arguments_are_tool_errors_and_the_server_stays_up(tmp_path_factory):
    store = copy_store(tmp_path_factory)
    before = {p.name: p.read_bytes() for p in (store / "memories").iterdir()}
    async with connect(store, "legacy") as c:
        cases = {
            "search": [
                {"question": 5},
                {"max_results": "ten"},
                {"question": "x", "nosuch": 1},
                {"ranking": "best"},
                {"question": "x", "max_results": 0},
                {"datasource": "nosuch"},
                {"question": "x", "cypher_filter": "MATCH (n) DETACH DELETE n"},
                {"query": {"a": [[[[[[[[]]]]]]]] * 2, "deep": _nested(150)}},
            ],
            "search_facets": [
                {"kind": "column"},
                {"kind": "spaceship", "facets": {"meaning": "x"}},
                {"kind": "column", "facets": {"meaning": 3}},
            ],
            "inspect": [{"refs": []}, {"refs": "orders"}, {"refs": ["x"] * (mt.MAX_INSPECT_REFS + 1)}],
            "status": [{"verbose": True}],
            "save_memory": [
                {"learning": "x"},
                {"learning": 1, "entities": []},
                {"learning": "x", "entities": ["orders.nosuch_column"]},
                {"learning": "x", "entities": ["orders.order_total"], "id": "../x"},
                {"learning": "x", "entities": ["orders.order_total"], "id": "/etc/passwd"},
                {"learning": "x", "entities": ["orders.order_total"], "id": True},
                {"learning": "x" * (mt.MAX_ARGUMENT_CHARS + 1), "entities": ["orders.order_total"]},
                {"learning": "x", "entities": ["orders"], "query": {"measures": []}, "linked_entities": []},
            ],
            "forget_memory": [
                {"id": "../x"},
                {"id": "../../etc/passwd"},
                {"id": ""},
                {"id": None},
                {"id": [1]},
                {},
            ],
        }
        for tool, bad in cases.items():
            for args in bad:
                text = error_text(await c.call_tool(tool, args))
                assert text.startswith(f"{tool}: ") and len(text) < 20_000, (tool, args, text[:300])
        huge = structured(
            await c.call_tool("search", {"question": "order total " * 200_000, "max_results": 3})
        )
        assert huge["warnings"]  # cut to the question limit, with a warning
        with pytest.raises(MCPError, match="unknown tool"):
            await c.call_tool("drop_store", {})
        assert structured(await c.call_tool("status", {}))["ready"]
    assert {p.name: p.read_bytes() for p in (store / "memories").iterdir()} == before


def _nested(depth: int):
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value
