"""Rename, impact, code lenses, signature help and inlay hints end to end, over stdio, for each client
profile (VS Code: documentChanges with file renames and change annotations; Neovim 0.7 and Emacs:
what they declare)."""

from __future__ import annotations

import sqlite3
from typing import Union

import pytest
import pytest_asyncio
from lsprotocol import types as t
from pygls.exceptions import JsonRpcException, JsonRpcInvalidParams

from tests import slayer_oracle as oracle

from .support import CLIENTS, copy_store, encoding_of, open_doc, pos, start_client, stop_client, uri_of

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow]

SAVED_QUERY = "source_model: orders\ndimensions:\n- stores.name\n- {name: city, model: stores}\nmeasures:\n- sum(order_total)\n"


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=CLIENTS)
async def client(request, tmp_path_factory):
    store = copy_store(tmp_path_factory)
    ws = tmp_path_factory.mktemp("ws")
    (ws / "queries").mkdir()
    (ws / "queries" / "by_store.yaml").write_text(SAVED_QUERY)
    (ws / "other.txt").write_text("stores.name is not a query\n")
    c = await start_client(store, request.param, workspace=ws)
    c.store, c.ws, c.client_name = store, ws, request.param  # type: ignore[attr-defined]
    yield c
    await stop_client(c)


def doc_id(uri: str) -> t.TextDocumentIdentifier:
    return t.TextDocumentIdentifier(uri=uri)


def _edits_by_uri(edit: t.WorkspaceEdit) -> tuple[dict[str, list[t.TextEdit]], list[t.RenameFile]]:
    by_uri: dict[str, list[t.TextEdit]] = {}
    renames: list[t.RenameFile] = []
    if edit.changes:
        for uri, edits in edit.changes.items():
            by_uri.setdefault(uri, []).extend(edits)
    for change in edit.document_changes or []:
        if isinstance(change, t.TextDocumentEdit):
            by_uri.setdefault(change.text_document.uri, []).extend(change.edits)  # type: ignore[arg-type]
        elif isinstance(change, t.RenameFile):
            renames.append(change)
    return by_uri, renames


def _apply(text: str, edits: list[t.TextEdit]) -> str:
    """Apply edits given in UTF-16 / code-point columns of ASCII text (the fixture's files are ASCII)."""
    lines = text.split("\n")
    for e in sorted(edits, key=lambda e: (e.range.start.line, e.range.start.character), reverse=True):
        line = lines[e.range.start.line]
        lines[e.range.start.line] = (
            line[: e.range.start.character] + e.new_text + line[e.range.end.character :]
        )
    return "\n".join(lines)


async def test_prepare_rename_names_the_segment_under_the_cursor(client):
    uri = "file:///tmp/prep.query.yaml"
    text, position = pos("source_model: orders\ndimensions: [sto§res.name]\n", encoding=encoding_of(client))
    open_doc(client, uri, text)
    got = await client.text_document_prepare_rename_async(
        t.PrepareRenameParams(text_document=doc_id(uri), position=position)
    )
    assert isinstance(got, t.PrepareRenamePlaceholder)
    assert got.placeholder == "stores"
    assert (got.range.start.character, got.range.end.character) == (13, 19)


async def test_prepare_rename_refuses_a_keyword_position(client):
    uri = "file:///tmp/prep2.query.yaml"
    text, position = pos("source_model: orders\nlim§it: 3\n", encoding=encoding_of(client))
    open_doc(client, uri, text)
    with pytest.raises(JsonRpcException, match="nothing to rename here"):
        await client.text_document_prepare_rename_async(
            t.PrepareRenameParams(text_document=doc_id(uri), position=position)
        )


async def test_rename_a_column_across_queries_memories_and_the_model(client):
    uri = "file:///tmp/open.query.yaml"
    text, position = pos(
        "source_model: orders\nmeasures: [sum(order_to§tal)]\nfilters: ['order_total > 10']\n",
        encoding=encoding_of(client),
    )
    open_doc(client, uri, text)
    edit = await client.text_document_rename_async(
        t.RenameParams(text_document=doc_id(uri), position=position, new_name="grand_total")
    )
    by_uri, renames = _edits_by_uri(edit)
    assert renames == []
    assert _apply(text, by_uri[uri]) == text.replace("order_total", "grand_total")
    saved = client.ws / "queries" / "by_store.yaml"
    assert _apply(SAVED_QUERY, by_uri[uri_of(saved)]) == SAVED_QUERY.replace("order_total", "grand_total")
    model = client.store / "models" / "jaffle" / "orders.yaml"
    model_text = model.read_text()
    new_model = _apply(model_text, by_uri[uri_of(model)])
    assert "- name: grand_total\n" in new_model and "formula: sum(grand_total)" in new_model
    assert "sql: order_total" in new_model and "(order_total)" not in new_model  # the database column stays
    mem = client.store / "memories" / "1.md"
    assert "- jaffle.orders.grand_total\n" in _apply(mem.read_text(), by_uri[uri_of(mem)])
    assert uri_of(client.ws / "other.txt") not in by_uri
    if client.client_name == "visual-studio-code":
        assert edit.document_changes and edit.change_annotations
        (note,) = edit.change_annotations.values()
        assert note.needs_confirmation is True
        store_edits = [
            c
            for c in edit.document_changes
            if isinstance(c, t.TextDocumentEdit) and c.text_document.uri == uri_of(model)
        ]
        assert all(isinstance(e, t.AnnotatedTextEdit) for e in store_edits[0].edits)


async def test_rename_a_model_renames_its_file_and_every_path(client):
    uri = "file:///tmp/model.query.yaml"
    text, position = pos("source_model: orders\ndimensions:\n- st§ores.name\n", encoding=encoding_of(client))
    open_doc(client, uri, text)
    params = t.RenameParams(text_document=doc_id(uri), position=position, new_name="shops")
    if client.client_name != "visual-studio-code":  # no file renames in these clients' edits
        with pytest.raises(JsonRpcException, match="file renames"):
            await client.text_document_rename_async(params)
        return
    edit = await client.text_document_rename_async(params)
    by_uri, renames = _edits_by_uri(edit)
    old = client.store / "models" / "jaffle" / "stores.yaml"
    assert [(r.old_uri, r.new_uri) for r in renames] == [(uri_of(old), uri_of(old.with_name("shops.yaml")))]
    assert _apply(text, by_uri[uri]) == text.replace("stores", "shops")
    saved = client.ws / "queries" / "by_store.yaml"
    assert _apply(SAVED_QUERY, by_uri[uri_of(saved)]) == SAVED_QUERY.replace("stores", "shops")
    orders = client.store / "models" / "jaffle" / "orders.yaml"
    assert "- target_model: shops\n" in _apply(orders.read_text(), by_uri[uri_of(orders)])
    assert "name: shops\n" in _apply(old.read_text(), by_uri[uri_of(old)])
    # the text edits of the renamed file come before its rename
    kinds = [
        (type(c).__name__, getattr(c, "old_uri", None) or c.text_document.uri) for c in edit.document_changes
    ]
    assert kinds.index(("RenameFile", uri_of(old))) > kinds.index(("TextDocumentEdit", uri_of(old)))


@pytest.mark.parametrize(
    "new_name, message",
    [
        ("subtotal", "already exists"),
        ("1st", "not a valid name"),
        ("order total", "not a valid name"),
        ("and", "keyword"),
    ],
)
async def test_rename_refuses_collisions_and_invalid_names(client, new_name, message):
    uri = "file:///tmp/refuse.query.yaml"
    text, position = pos(
        "source_model: orders\nmeasures: [sum(order_to§tal)]\n", encoding=encoding_of(client)
    )
    open_doc(client, uri, text)
    with pytest.raises(JsonRpcException, match=message):
        await client.text_document_rename_async(
            t.RenameParams(text_document=doc_id(uri), position=position, new_name=new_name)
        )


async def test_impact_request_and_command(client):
    got = await client.protocol.send_request_async("slayer/impact", {"entity": "jaffle.orders.order_total"})
    counts = got.counts._asdict()
    assert counts["measure"] == 1 and counts["query"] >= 1 and counts["memory"] >= 1
    kinds = {(u.kind, u.name) for u in got.uses}
    assert ("measure", "jaffle.orders.total_revenue") in kinds
    assert ("query", uri_of(client.ws / "queries" / "by_store.yaml")) in kinds
    # transitively through the measure: memories tagged with total_revenue
    via = [u for u in got.uses if u.kind == "memory" and list(u.via) == ["jaffle.orders.total_revenue"]]
    assert via and all(u.location.uri.startswith("file://") for u in via)
    same = await client.workspace_execute_command_async(
        t.ExecuteCommandParams(command="slayer.impact", arguments=["jaffle.orders.order_total"])
    )
    assert same["summary"] == got.summary
    with pytest.raises(JsonRpcInvalidParams, match="not a canonical id"):
        await client.protocol.send_request_async("slayer/impact", {"entity": "nope.nothing"})
    with pytest.raises(JsonRpcInvalidParams, match="unknown parameter"):
        await client.protocol.send_request_async("slayer/impact", {"entity": "jaffle", "depth": 2})


async def test_impact_of_a_join_key_reaches_queries_through_the_join(client):
    got = await client.protocol.send_request_async("slayer/impact", {"entity": "jaffle.orders.store_id"})
    joins = [u for u in got.uses if u.kind == "join"]
    assert joins and joins[0].name.startswith("jaffle.orders → stores")
    through = [
        u for u in got.uses if u.kind == "query" and u.via and u.via[0].startswith("jaffle.orders → stores")
    ]
    assert through, got.uses


async def test_code_lenses_resolve_lazily(client):
    model = client.store / "models" / "jaffle" / "orders.yaml"
    uri = uri_of(model)
    open_doc(client, uri, model.read_text())
    lenses = await client.text_document_code_lens_async(t.CodeLensParams(text_document=doc_id(uri)))
    assert lenses and all(lens.command is None for lens in lenses)
    by_entity = {lens.data["entity"]: lens for lens in lenses}
    assert "jaffle.orders" in by_entity and "jaffle.orders.order_total" in by_entity
    resolved = await client.code_lens_resolve_async(by_entity["jaffle.orders.order_total"])
    assert resolved.command.command == "slayer.impact"
    assert "1 measure" in resolved.command.title and "quer" in resolved.command.title


async def test_signature_help_in_builtin_and_custom_aggregations(client):
    enc = encoding_of(client)
    uri = "file:///tmp/sig.query.yaml"
    text, position = pos("source_model: orders\nmeasures:\n- weighted_avg(subtotal, §\n", encoding=enc)
    open_doc(client, uri, text)
    got = await client.text_document_signature_help_async(
        t.SignatureHelpParams(text_document=doc_id(uri), position=position)
    )
    assert got.signatures[0].label == "weighted_avg(value, weight)" and got.active_parameter == 1
    uri2 = "file:///tmp/sig2.query.yaml"
    text, position = pos("source_model: orders\nmeasures:\n- avg_nonzero(§\n", encoding=enc)
    open_doc(client, uri2, text)
    got = await client.text_document_signature_help_async(
        t.SignatureHelpParams(text_document=doc_id(uri2), position=position)
    )
    assert got.signatures[0].label == "avg_nonzero(value)"
    assert "non-zero" in str(got.signatures[0].documentation)


async def test_inlay_hints_show_canonical_ids(client):
    uri = "file:///tmp/hints.query.yaml"
    text = "source_model: orders\ndimensions: [status, stores.name, jaffle.orders.ordered_at]\n"
    open_doc(client, uri, text)
    got = await client.text_document_inlay_hint_async(
        t.InlayHintParams(
            text_document=doc_id(uri),
            range=t.Range(start=t.Position(line=0, character=0), end=t.Position(line=2, character=0)),
        )
    )
    labels = [(h.position.line, h.label.strip()) for h in got]
    assert (1, "→ jaffle.orders.status") in labels and (1, "→ jaffle.stores.name") in labels
    assert not any("ordered_at" in lab for _, lab in labels)  # already canonical


# --------------------------------------------------------------------------- a SQLite store

needs_slayer = pytest.mark.skipif(oracle.slayer_python() is None, reason=oracle.SKIP_REASON)


def _rows(db) -> dict[str, str]:
    conn = sqlite3.connect(db)
    try:
        return dict(
            conn.execute(
                "SELECT 'models/' || data_source || '.' || name, data FROM models "
                "UNION ALL SELECT 'memories/' || id, data FROM memories"
            ).fetchall()
        )
    finally:
        conn.close()


@needs_slayer
@pytest.mark.parametrize("profile", ["visual-studio-code", "neovim@v0.7.0"])
async def test_rename_in_a_sqlite_store_writes_rows_only_through_the_code_action(tmp_path_factory, profile):
    """The rename's edit covers the workspace's files (confirmed through a change annotation where the
    client supports them); the store's rows change only when the client runs the code action, all in
    one transaction, and motley-slayer loads the store afterwards with the new name everywhere."""
    db = copy_store(tmp_path_factory, "sq", sqlite=True)
    ws = tmp_path_factory.mktemp("sqws")
    (ws / "queries").mkdir()
    (ws / "queries" / "by_store.yaml").write_text(SAVED_QUERY)
    c = await start_client(db, profile, workspace=ws)
    _structure_code_actions_by_spec(c)
    try:
        enc = encoding_of(c)
        uri = "file:///tmp/sq.query.yaml"
        text, position = pos("source_model: orders\ndimensions:\n- st§ores.name\n", encoding=enc)
        open_doc(c, uri, text)
        before = _rows(db)
        for new_name, message in [("orders", "already exists"), ("2shops", "not a valid name")]:
            with pytest.raises(JsonRpcException, match=message):
                await c.text_document_rename_async(
                    t.RenameParams(text_document=doc_id(uri), position=position, new_name=new_name)
                )
        assert await c.text_document_code_action_async(_refactor_params(uri)) is None  # nothing pending

        edit = await c.text_document_rename_async(
            t.RenameParams(text_document=doc_id(uri), position=position, new_name="shops")
        )
        by_uri, renames = _edits_by_uri(edit)
        assert renames == [] and set(by_uri) == {uri, uri_of(ws / "queries" / "by_store.yaml")}
        assert _apply(text, by_uri[uri]) == text.replace("stores", "shops")
        assert _rows(db) == before  # nothing is written by the rename itself
        (action,) = await c.text_document_code_action_async(_refactor_params(uri))
        assert action.kind == t.CodeActionKind.RefactorRewrite and action.edit is None
        assert action.command.command == "slayer.applyStoreRename"
        assert "2 model rows and 3 memories" in action.title
        if profile == "visual-studio-code":
            (note,) = edit.change_annotations.values()
            assert note.needs_confirmation is True
            assert "slayer.applyStoreRename " + action.command.arguments[0] in note.description
            assert all(isinstance(e, t.AnnotatedTextEdit) for e in by_uri[uri])

        done = await c.workspace_execute_command_async(
            t.ExecuteCommandParams(command=action.command.command, arguments=action.command.arguments)
        )
        assert done == {"entity": "jaffle.stores", "new_entity": "jaffle.shops", "models": 2, "memories": 3}
        after = _rows(db)
        assert set(after) == (set(before) - {"models/jaffle.stores"}) | {"models/jaffle.shops"}
        changed = {k for k in before if k in after and before[k] != after[k]}
        assert changed == {"models/jaffle.orders", "memories/3", "memories/6", "memories/11"}
        got = await c.protocol.send_request_async("slayer/impact", {"entity": "jaffle.shops.name"})
        assert any(u.kind == "memory" and u.name == "memory:6" for u in got.uses)
        with pytest.raises(JsonRpcInvalidParams, match="not a canonical id"):
            await c.protocol.send_request_async("slayer/impact", {"entity": "jaffle.stores"})
        with pytest.raises(JsonRpcInvalidParams, match="no pending store rename"):  # written once
            await c.workspace_execute_command_async(
                t.ExecuteCommandParams(command=action.command.command, arguments=action.command.arguments)
            )
    finally:
        await stop_client(c)

    models, memories = oracle.ask([{"op": "models", "store": str(db)}, {"op": "load", "store": str(db)}])
    models, memories = oracle.ok(models), oracle.ok(memories)
    assert models["errors"] == [] and memories["errors"] == []
    assert "jaffle.shops" in models["models"] and "jaffle.stores" not in models["models"]
    joins = [j["target_model"] for j in models["models"]["jaffle.orders"].get("joins", [])]
    assert "shops" in joins and "stores" not in joins
    assert "jaffle.shops.name" in memories["memories"]["6"]["entities"]
    assert memories["memories"]["6"]["query"]["dimensions"][0]["model"] == "shops"
    assert not any(
        e == "jaffle.stores" or e.startswith("jaffle.stores.")
        for m in memories["memories"].values()
        for e in m["entities"]
    )


def _structure_code_actions_by_spec(c) -> None:
    """lsprotocol's client-side hook reads any code action with a ``command`` key as a bare Command
    (losing its kind and title); editors tell them apart by the type of ``command``, as the spec does."""
    converter = c.protocol._converter

    def hook(obj, _type):
        return converter.structure(obj, t.Command if isinstance(obj.get("command"), str) else t.CodeAction)

    converter.register_structure_hook(Union[t.Command, t.CodeAction], hook)  # noqa: UP007 - the registered key


def _refactor_params(uri: str) -> t.CodeActionParams:
    return t.CodeActionParams(
        text_document=doc_id(uri),
        range=t.Range(start=t.Position(line=0, character=0), end=t.Position(line=0, character=0)),
        context=t.CodeActionContext(diagnostics=[], only=[t.CodeActionKind.Refactor]),
    )
