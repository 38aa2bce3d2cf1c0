"""Definition, references, document symbols and workspace symbols end to end."""

from __future__ import annotations

import pytest
import pytest_asyncio
from lsprotocol import types as t

from .support import CLIENTS, copy_store, open_doc, pos, start_client, stop_client, uri_of

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=CLIENTS)
async def client(request, tmp_path_factory):
    store = copy_store(tmp_path_factory)
    c = await start_client(store, request.param)
    c.store = store  # type: ignore[attr-defined]
    c.client_name = request.param  # type: ignore[attr-defined]
    yield c
    await stop_client(c)


def doc_id(uri: str) -> t.TextDocumentIdentifier:
    return t.TextDocumentIdentifier(uri=uri)


def text_at(client, loc: t.Location) -> str:
    path = client.store / loc.uri.split("/store/", 1)[1]
    line = path.read_text().split("\n")[loc.range.start.line]
    return line[loc.range.start.character : loc.range.end.character]


async def test_definition_goes_to_the_yaml_line(client):
    text, position = pos("source_model: orders\ndimensions: [stores.ci§ty]\n")
    open_doc(client, "file:///ws/a.query.yaml", text)
    (loc,) = await client.text_document_definition_async(
        t.DefinitionParams(text_document=doc_id("file:///ws/a.query.yaml"), position=position)
    )
    assert loc.uri == uri_of(client.store / "models" / "jaffle" / "stores.yaml")
    assert text_at(client, loc) == "city"


async def test_definition_of_a_memory_tag(client):
    text, position = pos("---\nentities:\n- memory:kb.re§venue\n---\n")
    open_doc(client, "file:///ws/memories/x.md", text, "markdown")
    (loc,) = await client.text_document_definition_async(
        t.DefinitionParams(text_document=doc_id("file:///ws/memories/x.md"), position=position)
    )
    assert loc.uri == uri_of(client.store / "memories" / "kb.revenue.md")


async def test_references_in_memories_and_open_queries(client):
    text, position = pos("source_model: orders\ndimensions: [sta§tus]\nfilters: [\"status = 'completed'\"]\n")
    open_doc(client, "file:///ws/b.query.yaml", text)
    found = await client.text_document_references_async(
        t.ReferenceParams(
            text_document=doc_id("file:///ws/b.query.yaml"),
            position=position,
            context=t.ReferenceContext(include_declaration=True),
        )
    )
    uris = [loc.uri for loc in found]
    assert uris[0] == uri_of(client.store / "models" / "jaffle" / "orders.yaml")  # the declaration
    assert (
        uri_of(client.store / "memories" / "2.md") in uris
        and uri_of(client.store / "memories" / "6.md") in uris
    )
    in_doc = sorted(loc.range.start.line for loc in found if loc.uri == "file:///ws/b.query.yaml")
    assert in_doc == [1, 2]


async def test_document_symbols_of_a_model_file(client):
    path = client.store / "models" / "jaffle" / "orders.yaml"
    open_doc(client, uri_of(path), path.read_text())
    syms = await client.text_document_document_symbol_async(
        t.DocumentSymbolParams(text_document=doc_id(uri_of(path)))
    )
    if isinstance(syms[0], t.DocumentSymbol):
        (model,) = syms
        assert model.name == "orders" and model.kind == t.SymbolKind.Class
        names = [(c.name, c.kind) for c in model.children]
    else:  # a client without hierarchical symbols gets a flat list
        assert syms[0].name == "orders"
        names = [(s.name, s.kind) for s in syms[1:]]
        assert all(s.container_name == "orders" for s in syms[1:])
    assert ("status", t.SymbolKind.Field) in names and ("total_revenue", t.SymbolKind.Property) in names
    assert ("avg_nonzero", t.SymbolKind.Function) in names and ("stores", t.SymbolKind.Interface) in names


async def test_workspace_symbols_from_search(client):
    syms = await client.workspace_symbol_async(t.WorkspaceSymbolParams(query="revenue"))
    names = [s.name for s in syms]
    assert "jaffle.orders.total_revenue" in names and "memory:kb.revenue" in names
    measure = next(s for s in syms if s.name == "jaffle.orders.total_revenue")
    assert measure.location.uri == uri_of(client.store / "models" / "jaffle" / "orders.yaml")
    assert measure.container_name == "jaffle.orders"
    everything = await client.workspace_symbol_async(t.WorkspaceSymbolParams(query=""))
    assert {s.name for s in everything} >= {"jaffle.orders", "jaffle.stores"}
