"""The store changes on disk while the daemon runs: the next completion, hover, search and the open
documents' diagnostics see it; a half-written or broken file does not take the last good state away."""

from __future__ import annotations

import sqlite3

import pytest
import pytest_asyncio

from .support import (
    CLIENTS,
    atomic_write,
    codes,
    complete,
    copy_store,
    diagnostics,
    eventually,
    hover_text,
    open_doc,
    pos,
    start_client,
    stop_client,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")

REGION = """- name: region
  sql: region
  type: TEXT
  description: Sales region of the store (East, West, Central).
  hidden: false
"""


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=CLIENTS)
async def client(request, tmp_path_factory):
    store = copy_store(tmp_path_factory)
    c = await start_client(store, request.param)
    c.store = store  # type: ignore[attr-defined]
    yield c
    await stop_client(c)


def add_region(text: str) -> str:
    head, sep, tail = text.partition("\nmeasures:")
    if not sep:
        head, sep, tail = text.partition("\naggregations:")
    return head.rstrip("\n") + "\n" + REGION + (sep + tail if sep else "")


async def test_a_new_column_becomes_visible(client):
    query, at_dot = pos("source_model: orders\ndimensions: [stores.§]\n")
    uri = "file:///ws/live.query.yaml"
    open_doc(client, uri, query)
    assert "region" not in {i.label for i in await complete(client, uri, at_dot)}
    check_uri = "file:///ws/check.query.yaml"
    open_doc(client, check_uri, "source_model: orders\ndimensions: [stores.region]\n")
    await diagnostics(client, check_uri, lambda d: codes(d) == [("unknown-entity", 1)])

    model = client.store / "models" / "jaffle" / "stores.yaml"
    await atomic_write(model, add_region(model.read_text()))

    items = await eventually(
        lambda: complete(client, uri, at_dot),
        lambda it: "region" in {i.label for i in it},
        "completion to offer the new column",
    )
    assert (
        next(i for i in items if i.label == "region").detail
        == "TEXT — Sales region of the store (East, West, Central)."
    )
    text, on_region = pos("source_model: orders\ndimensions: [stores.reg§ion]\n")
    open_doc(client, "file:///ws/hover.query.yaml", text)
    md = await hover_text(client, "file:///ws/hover.query.yaml", on_region)
    assert "**column** `jaffle.stores.region`" in md and "Sales region of the store" in md
    await diagnostics(client, check_uri, lambda d: len(d) == 0, "the open query re-checked")
    found = await client.protocol.send_request_async("slayer/search", {"question": "sales region East West"})
    assert "jaffle.stores.region" in [h.id for h in found.results]


async def test_a_broken_file_keeps_the_last_good_state(client):
    model = client.store / "models" / "jaffle" / "stores.yaml"
    good = model.read_text()
    await atomic_write(model, good + "columns: [unclosed\n")
    status = await eventually(
        lambda: client.protocol.send_request_async("slayer/status", {}),
        lambda s: any("stores.yaml" in i and "invalid YAML" in i for i in s.issues),
        "the load issue",
    )
    assert status.readable and status.error is None
    _, at_dot = pos("source_model: orders\ndimensions: [stores.§]\n")
    labels = {i.label for i in await complete(client, "file:///ws/live.query.yaml", at_dot)}
    # the model whose file no longer loads keeps its last good version (the load issue says so)
    assert "city" in labels
    customers, at_c = pos("source_model: orders\ndimensions: [customers.§]\n")
    open_doc(client, "file:///ws/c.query.yaml", customers)
    assert "city" in {i.label for i in await complete(client, "file:///ws/c.query.yaml", at_c)}
    await atomic_write(model, good)
    await eventually(
        lambda: client.protocol.send_request_async("slayer/status", {}),
        lambda s: not any("stores.yaml" in i for i in s.issues),
        "the load issue to clear",
    )
    assert "city" in {i.label for i in await complete(client, "file:///ws/live.query.yaml", at_dot)}


async def test_a_deleted_memory_drops_out(client):
    uri = "file:///ws/memories/t.md"
    open_doc(client, uri, "---\nentities:\n- memory:kb.revenue\n---\nx\n", "markdown")
    await diagnostics(client, uri, lambda d: len(d) == 0)
    (client.store / "memories" / "kb.revenue.md").unlink()
    found = await diagnostics(
        client, uri, lambda d: codes(d) == [("stale-tag", 2)], "the tag to become stale"
    )
    assert "No memory with id 'kb.revenue'." in found[0].message


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def sqlite_client(tmp_path_factory):
    db = copy_store(tmp_path_factory, "sqlite", sqlite=True)
    c = await start_client(db, "neovim@v0.7.0")
    c.db = db  # type: ignore[attr-defined]
    yield c
    await stop_client(c)


async def test_sqlite_store_change_is_seen(sqlite_client):
    c = sqlite_client
    text, at_dot = pos("source_model: orders\ndimensions: [stores.§]\n")
    uri = "file:///ws/s.query.yaml"
    open_doc(c, uri, text)
    assert "region" not in {i.label for i in await complete(c, uri, at_dot)}
    import json

    with sqlite3.connect(c.db) as conn:
        (data,) = conn.execute(
            "SELECT data FROM models WHERE data_source='jaffle' AND name='stores'"
        ).fetchone()
        model = json.loads(data)
        model["columns"].append({"name": "region", "sql": "region", "type": "TEXT"})
        conn.execute(
            "UPDATE models SET data=? WHERE data_source='jaffle' AND name='stores'", (json.dumps(model),)
        )
    await eventually(
        lambda: complete(c, uri, at_dot),
        lambda it: "region" in {i.label for i in it},
        "completion after the SQLite write",
    )
