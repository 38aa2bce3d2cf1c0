"""textDocument/hover end to end, for each client's capability set."""

from __future__ import annotations

import pytest
import pytest_asyncio
from lsprotocol import types as t

from .support import CLIENTS, copy_store, encoding_of, hover_text, open_doc, pos, start_client, stop_client

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=CLIENTS)
async def client(request, tmp_path_factory):
    c = await start_client(copy_store(tmp_path_factory), request.param, options={"hover": {"maxChars": 350}})
    yield c
    await stop_client(c)


async def hover_at(client, name: str, marked: str, language: str = "yaml") -> str | None:
    text, position = pos(marked, encoding=encoding_of(client))
    uri = f"file:///ws/{name}"
    open_doc(client, uri, text, language)
    return await hover_text(client, uri, position)


async def test_column(client):
    md = await hover_at(client, "a.query.yaml", "source_model: orders\ndimensions: [sta§tus]\n")
    assert md.startswith("**column** `jaffle.orders.status` · `TEXT`")
    assert '**Sample values:** `["completed", "returned", "pending"]`' in md


async def test_range_and_markup_kind(client):
    text, position = pos("source_model: orders\ndimensions: [stores.na§me]\n")
    open_doc(client, "file:///ws/b.query.yaml", text)
    res = await client.text_document_hover_async(
        t.HoverParams(
            text_document=t.TextDocumentIdentifier(uri="file:///ws/b.query.yaml"), position=position
        )
    )
    assert res.range == t.Range(start=t.Position(line=1, character=13), end=t.Position(line=1, character=24))
    assert res.contents.kind == t.MarkupKind.Markdown


async def test_model_card_is_capped(client):
    md = await hover_at(client, "c.query.yaml", "source_model: or§ders\n")
    assert md.startswith("**model** `jaffle.orders`") and len(md) <= 450
    assert "cut at 350 characters" in md


async def test_memory_with_stale_tag(client):
    md = await hover_at(client, "memories/m.md", "---\nentities:\n- memory:§5\n---\n", "markdown")
    assert "~~`jaffle.customers.loyalty_tier`~~ *(stale)*" in md


async def test_unknown_reference_says_why(client):
    md = await hover_at(client, "d.query.yaml", "source_model: orders\ndimensions: [custmers.ci§ty]\n")
    assert md.startswith("**Unknown reference** `custmers.city`")
    assert "'custmers' is neither a known datasource nor a saved model" in md


async def test_positions_in_the_clients_units(client):
    """Characters outside the BMP before the reference: UTF-16 clients count them twice."""
    md = await hover_at(client, "e.query.yaml", "source_model: orders\nfilters: [\"'😀😀' < sta§tus\"]\n")
    assert md is not None and "`jaffle.orders.status`" in md


async def test_nothing_on_plain_values(client):
    assert await hover_at(client, "f.query.yaml", "source_model: orders\nlimit: 1§0\n") is None
