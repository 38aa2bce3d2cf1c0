"""textDocument/completion end to end, for each client's capability set."""

from __future__ import annotations

import pytest
import pytest_asyncio
from lsprotocol import types as t

from .support import CLIENTS, complete, copy_store, open_doc, pos, start_client, stop_client

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=CLIENTS)
async def client(request, tmp_path_factory):
    c = await start_client(copy_store(tmp_path_factory), request.param)
    yield c
    await stop_client(c)


async def items_at(client, name: str, marked: str, language: str = "yaml") -> list[t.CompletionItem]:
    text, position = pos(marked)
    uri = f"file:///ws/{name}"
    open_doc(client, uri, text, language)
    return await complete(client, uri, position)


async def test_join_path_after_dot(client):
    items = await items_at(client, "a.query.yaml", "source_model: orders\ndimensions:\n  - stores.§\n")
    assert [i.label for i in sorted(items, key=lambda i: i.sort_text)] == [
        "id",
        "name",
        "city",
        "opened_at",
        "tax_rate",
        "orders",
    ]
    city = next(i for i in items if i.label == "city")
    assert city.kind == t.CompletionItemKind.Field and city.detail.startswith("TEXT")
    assert city.text_edit.range == t.Range(
        start=t.Position(line=2, character=11), end=t.Position(line=2, character=11)
    )
    join = next(i for i in items if i.label == "orders")
    assert join.kind == t.CompletionItemKind.Reference


async def test_inside_an_aggregation_call(client):
    items = await items_at(client, "b.query.yaml", "source_model: orders\nmeasures: [sum(sub§\n")
    labels = [i.label for i in items]
    assert "subtotal" in labels and "total_revenue" not in labels and "avg_nonzero" not in labels
    sub = next(i for i in items if i.label == "subtotal")
    assert sub.text_edit.range.start.character == 15 and sub.text_edit.new_text == "subtotal"


async def test_source_model_and_hidden_models(client):
    items = await items_at(client, "c.query.yaml", "source_model: §\n")
    assert {i.label for i in items} == {
        "customers",
        "order_items",
        "orders",
        "products",
        "stores",
        "supplies",
    }
    items = await items_at(client, "d.query.yaml", "dimensions: [jaffle.§]\n")
    assert "supplies" not in {i.label for i in items}  # jaffle.supplies is hidden


async def test_memory_entities(client):
    items = await items_at(
        client, "memories/m.md", "---\nentities:\n- memory:help.§\n---\nbody\n", "markdown"
    )
    assert {"help.intro", "help.joins"} <= {i.label for i in items}
    assert all(i.kind == t.CompletionItemKind.File for i in items)
    items = await items_at(client, "memories/n.md", "---\nentities:\n- jaffle.customers.§\n---\n", "markdown")
    assert "email" not in {i.label for i in items} and "city" in {i.label for i in items}


async def test_json_query(client):
    items = await items_at(
        client, "e.query.json", '{"source_model": "orders", "filters": ["customers.ci§', "json"
    )
    assert [i.label for i in items if i.kind == t.CompletionItemKind.Field][:3] == ["id", "name", "city"]


async def test_nothing_outside_references_and_unknown_files(client):
    assert await items_at(client, "f.query.yaml", "source_model: orders\nlimit: 1§\n") == []
    assert await items_at(client, "notes.yaml", "source_model: orders\ndimensions: [stores.§]\n") == []
