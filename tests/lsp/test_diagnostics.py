"""Pushed diagnostics (debounced per document) and their quick fixes, end to end."""

from __future__ import annotations

import pytest
import pytest_asyncio
from lsprotocol import types as t

from .support import (
    CLIENTS,
    close_doc,
    codes,
    copy_store,
    diagnostics,
    eventually,
    open_doc,
    replace_doc,
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


QUERY = """source_model: orders
dimensions: [stauts, customers.email]
measures: [sum(subtotal)]
limt: 5
"""


async def test_query_problems_are_pushed(client):
    uri = "file:///ws/a.query.yaml"
    open_doc(client, uri, QUERY)
    found = await diagnostics(client, uri, lambda d: len(d) == 3)
    assert codes(found) == [("hidden-entity", 1), ("unknown-entity", 1), ("unknown-query-field", 3)]
    unknown = next(d for d in found if d.code == "unknown-entity")
    assert unknown.severity == t.DiagnosticSeverity.Error and unknown.source == "slayer"
    assert unknown.message == "Entity 'stauts' not found in any datasource (checked all known datasources)."
    assert unknown.range == t.Range(
        start=t.Position(line=1, character=13), end=t.Position(line=1, character=19)
    )
    hidden = next(d for d in found if d.code == "hidden-entity")
    assert hidden.severity == t.DiagnosticSeverity.Warning


async def test_quick_fixes(client):
    uri = "file:///ws/a.query.yaml"
    found = await diagnostics(client, uri, lambda d: len(d) == 3)
    unknown = next(d for d in found if d.code == "unknown-entity")
    actions = await client.text_document_code_action_async(
        t.CodeActionParams(
            text_document=t.TextDocumentIdentifier(uri=uri),
            range=unknown.range,
            context=t.CodeActionContext(diagnostics=[unknown]),
        )
    )
    assert [a.title for a in actions] == ["Change to 'status'"]
    (action,) = actions
    assert action.kind == t.CodeActionKind.QuickFix and action.is_preferred
    assert list(action.edit.changes[uri]) == [t.TextEdit(range=unknown.range, new_text="status")]
    assert action.diagnostics[0].code == "unknown-entity"
    field = next(d for d in found if d.code == "unknown-query-field")
    actions = await client.text_document_code_action_async(
        t.CodeActionParams(
            text_document=t.TextDocumentIdentifier(uri=uri),
            range=field.range,
            context=t.CodeActionContext(diagnostics=[]),
        )
    )
    assert [a.edit.changes[uri][0].new_text for a in actions] == ["limit"]


async def test_edits_are_rechecked(client):
    uri = "file:///ws/a.query.yaml"
    replace_doc(client, uri, QUERY.replace("stauts", "status").replace("limt", "limit"), 2)
    found = await diagnostics(client, uri, lambda d: len(d) == 1, "diagnostics after the fix")
    assert codes(found) == [("hidden-entity", 1)]
    replace_doc(client, uri, "source_model: orders\ndimensions: [status, \n", 3)  # mid-edit
    found = await diagnostics(client, uri, lambda d: any(x.code == "invalid-yaml" for x in d), "invalid YAML")
    assert codes(found) == [("invalid-yaml", 2)]
    # a burst of edits: only the last text counts
    for v, name in enumerate(["a", "ab", "abc", "status"], start=4):
        replace_doc(client, uri, f"source_model: orders\ndimensions: [{name}]\n", v)
    await diagnostics(client, uri, lambda d: len(d) == 0, "no diagnostics for the final text")


async def test_close_clears(client):
    uri = "file:///ws/b.query.json"
    open_doc(client, uri, '{"source_model": "orders", "dimensions": ["nope"]}', "json")
    await diagnostics(client, uri, lambda d: codes(d) == [("unknown-entity", 0)])
    close_doc(client, uri)
    await diagnostics(client, uri, lambda d: len(d) == 0, "cleared diagnostics")


async def test_memory_file(client):
    uri = "file:///ws/memories/m.md"
    open_doc(
        client,
        uri,
        "---\nentities:\n- jaffle.customers.loyalty_tier\n- orders.status\n"
        "query:\n  source_model: orders\n  dimensions: [statuz]\n---\nText.\n",
        "markdown",
    )
    found = await diagnostics(client, uri, lambda d: len(d) == 3)
    assert codes(found) == [("stale-query", 6), ("stale-tag", 2), ("stale-tag", 3)]


async def test_store_model_file_shows_load_issues(client):
    path = client.store / "models" / "jaffle" / "orders.yaml"
    text = (
        path.read_text()
        .replace("name: orders\n", "name: orders\nversion: 99\n", 1)
        .replace("version: 15\n", "", 1)
    )
    path.write_text(text)  # a newer document version: loaded best effort, with a note
    uri = uri_of(path)
    await eventually(
        lambda: client.protocol.send_request_async("slayer/status", {}),
        lambda s: any("newer than the known version" in i for i in s.issues),
        "reload",
    )
    open_doc(client, uri, text)
    found = await diagnostics(client, uri, lambda d: any(x.code == "load-issue" for x in d))
    assert any("SlayerModel version 99 is newer" in x.message for x in found)


async def test_unrelated_files_get_nothing(client):
    uri = "file:///ws/notes.yaml"
    open_doc(client, uri, "dimensions: [nope]\n")
    await diagnostics(client, uri, lambda d: len(d) == 0)
