"""Reachability through the real daemon: a session scoped by its options (or fixed on the command
line) reaches nothing outside the scope in completion, hover, definition, references, diagnostics,
workspace symbols, slayer/search, slayer/inspect, slayer/status or the memory writes; an
out-of-scope name behaves exactly like a missing one, and hidden names stay out of hover,
completion and definition."""

from __future__ import annotations

import itertools
import sys

import pytest
import pytest_asyncio
from lsprotocol import types as t
from pygls.exceptions import JsonRpcInvalidParams
from pytest_lsp import client_capabilities
from pytest_lsp.client import make_test_lsp_client

from ..test_reachability import EXPECTED, SECRETS, TAGS, leaks, write_store
from .support import (
    REPO,
    complete,
    diagnostics,
    encoding_of,
    eventually,
    hover_text,
    open_doc,
    pos,
    request,
    start_client,
    stop_client,
    uri_of,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")

OPTIONS = {"diagnostics": {"debounceMs": 20}, "scope": {"accessTags": ["ops"]}}
_names = itertools.count()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(tmp_path_factory):
    store = write_store(tmp_path_factory.mktemp("reach") / "store")
    c = await start_client(store, "visual-studio-code", OPTIONS)
    c.store = store  # type: ignore[attr-defined]
    c.docs = tmp_path_factory.mktemp("docs")  # type: ignore[attr-defined]
    yield c
    await stop_client(c)


async def at(c, marked: str, suffix: str = ".query.yaml") -> tuple[str, t.Position]:
    """Open a new document holding ``marked`` (``§`` = the cursor); its URI and the cursor."""
    text, position = pos(marked, encoding=encoding_of(c))
    folder = c.docs / ("memories" if suffix == ".md" else "queries")
    folder.mkdir(exist_ok=True)
    uri = uri_of(folder / f"d{next(_names)}{suffix}")
    open_doc(c, uri, text, "markdown" if suffix == ".md" else "yaml")
    return uri, position


async def labels(c, marked: str, suffix: str = ".query.yaml") -> list[str]:
    uri, position = await at(c, marked, suffix)
    items = await complete(c, uri, position)
    assert not leaks(repr(items), TAGS), marked
    return [i.label for i in items]


async def hover(c, marked: str) -> str | None:
    uri, position = await at(c, marked)
    return await hover_text(c, uri, position)


async def definition(c, marked: str):
    uri, position = await at(c, marked)
    return await c.text_document_definition_async(
        t.DefinitionParams(text_document=t.TextDocumentIdentifier(uri=uri), position=position)
    )


async def test_completion_offers_only_reachable_names(client):
    models = {m.split(".")[1] for m in EXPECTED[TAGS][0]} - {"ghost"}  # ghost is hidden
    assert set(await labels(client, "source_model: §\n")) == models
    leaves = await labels(client, "source_model: orders\ndimensions: [§]\n")
    assert {"order_id", "amount", "status", "customers"} <= set(leaves)
    assert "internal_note" not in leaves and "payroll" not in leaves
    assert await labels(client, "source_model: orders\ndimensions: [payroll.§]\n") == []
    assert await labels(client, "source_model: orders\ndimensions: [shop.payroll.§]\n") == []
    assert set(await labels(client, "dimensions: [shop.§]\n")) == models - {"ledger"}
    assert "ghost" not in await labels(client, "source_model: gh§\n")  # hidden: never offered
    tags = await labels(client, "---\nentities:\n- memory:§\n---\nx\n", ".md")
    assert set(tags) == EXPECTED[TAGS][1]


async def test_hover_on_out_of_scope_is_like_missing_and_hidden_gives_nothing(client):
    secret = await hover(client, "source_model: orders\ndimensions: [payroll.sal§ary_band]\n")
    missing = await hover(client, "source_model: orders\ndimensions: [nosuch.sal§ary_band]\n")
    assert secret is not None and secret.replace("payroll", "nosuch") == missing
    for a, b in (
        ("source_model: pay§roll\n", "source_model: nos§uch\n"),
        ("dimensions: [shop.audit.gr§aded]\n", "dimensions: [shop.nosuch.gr§aded]\n"),
    ):
        x, y = await hover(client, a), await hover(client, b)
        assert x.replace("payroll", "nosuch").replace("audit", "nosuch") == y
    assert await hover(client, "source_model: orders\ndimensions: [internal_n§ote]\n") is None
    assert await hover(client, "source_model: gh§ost\n") is None
    card = await hover(client, "source_model: ord§ers\n")
    assert "shop.orders" in card and not leaks(card, TAGS)
    assert "amount" in await hover(client, "source_model: orders\ndimensions: [amo§unt]\n")


async def test_definition_and_references(client):
    assert await definition(client, "source_model: orders\ndimensions: [payroll.salary_b§and]\n") is None
    assert await definition(client, "source_model: pay§roll\n") is None
    assert await definition(client, "source_model: orders\ndimensions: [internal_n§ote]\n") is None
    assert await definition(client, "source_model: gh§ost\n") is None
    (loc,) = await definition(client, "source_model: orders\ndimensions: [amo§unt]\n")
    assert loc.uri.endswith("/models/shop/orders.yaml")

    uri, position = await at(client, "---\nentities:\n- shop.custo§mers\n---\nx\n", ".md")
    refs = await client.text_document_references_async(
        t.ReferenceParams(
            text_document=t.TextDocumentIdentifier(uri=uri),
            position=position,
            context=t.ReferenceContext(include_declaration=True),
        )
    )
    names = sorted(r.uri.rsplit("/", 1)[-1] for r in refs)
    assert "8.md" in names and "customers.yaml" in names
    for marked in ("source_model: pay§roll\n", "---\nentities:\n- memory:§2\n---\nx\n"):
        uri, position = await at(client, marked, ".md" if marked.startswith("---") else ".query.yaml")
        assert (
            await client.text_document_references_async(
                t.ReferenceParams(
                    text_document=t.TextDocumentIdentifier(uri=uri),
                    position=position,
                    context=t.ReferenceContext(include_declaration=True),
                )
            )
            is None
        )


async def test_diagnostics_name_out_of_scope_like_missing(client):
    found = []
    for name in ("payroll", "missing"):  # the same length: the same ranges
        uri, _ = await at(client, f"source_model: orders\ndimensions: [{name}.salary_b§and]\n")
        found.append(await diagnostics(client, uri, lambda d: bool(d)))
    a, b = ([(d.code, d.range, d.message.replace("payroll", "missing")) for d in ds] for ds in found)
    assert a == b and {str(d.code) for d in found[0]} == {"unknown-entity"}


async def test_custom_requests_reach_nothing_out_of_scope(client):
    answers = []
    for word in SECRETS[TAGS]:
        for ranking in ("hybrid", "slayer"):
            answers.append(
                await request(
                    client,
                    "slayer/search",
                    {"question": word, "max_results": 50, "ranking": ranking, "compact": False},
                )
            )
    for cypher in ("MATCH (n) RETURN n.id AS id", "MATCH (m:Model) RETURN 'shop.payroll' AS id"):
        try:
            answers.append(
                await request(
                    client,
                    "slayer/search",
                    {"question": "grade salary Zanzibar", "cypher_filter": cypher, "max_results": 50},
                )
            )
        except JsonRpcInvalidParams as exc:
            answers.append(str(exc))
    assert not leaks(repr(answers), TAGS)

    got = await request(client, "slayer/search", {"entities": ["memory:2"]})
    miss = await request(client, "slayer/search", {"entities": ["memory:999"]})
    assert got["results"] == miss["results"] == []
    assert [w.replace("'2'", "'999'").replace("memory:2", "memory:999") for w in got["warnings"]] == miss[
        "warnings"
    ]

    items = (await request(client, "slayer/inspect", {"refs": ["shop.payroll", "memory:2", "shop.nosuch"]}))[
        "items"
    ]
    assert [set(i) for i in items] == [{"ref", "error"}] * 3
    assert items[0]["error"].replace("payroll", "nosuch") == items[2]["error"]

    status = await request(client, "slayer/status", {})
    models, memories = EXPECTED[TAGS]
    assert status["counts"]["model"] == len(models) and status["counts"]["memory"] == len(memories)
    assert status["options"]["scope"] == {
        "datasources": [],
        "accessTags": ["ops"],
        "untaggedOnly": False,
        "fixedBy": None,
    }
    assert not leaks(repr(status["issues"]), TAGS)

    symbols = await client.workspace_symbol_async(t.WorkspaceSymbolParams(query="Zanzibar salary payroll"))
    assert not leaks(repr(symbols), TAGS)
    everything = await client.workspace_symbol_async(t.WorkspaceSymbolParams(query=""))
    assert {s.name for s in everything} == EXPECTED[TAGS][0] - {"shop.ghost"}


async def test_writes_cannot_touch_unreachable_memories(client):
    store = client.store
    with pytest.raises(JsonRpcInvalidParams, match="conflicts with parts of it you cannot access"):
        await request(
            client,
            "slayer/saveMemory",
            {
                "id": "8",
                "learning": "overwrite",  # 8 links to 2: a
                "entities": ["shop.orders"],
            },
        )  # write would drop the link
    refusals = []
    for memory_id in ("2", "99"):  # 2 is out of scope: refused exactly as a free id is
        with pytest.raises(JsonRpcInvalidParams) as exc:
            await request(
                client,
                "slayer/saveMemory",
                {"id": memory_id, "learning": "overwrite", "entities": ["shop.orders"]},
            )
        refusals.append(str(exc.value).replace(f"'{memory_id}'", "'<id>'"))
    assert refusals[0] == refusals[1] and "not a memory this session can update" in refusals[0]
    assert "Zanzibar" in (store / "memories" / "2.md").read_text()
    assert "memory:2" in (store / "memories" / "8.md").read_text()
    assert await request(client, "slayer/forgetMemory", {"id": "2"}) == {"forgotten": False}
    assert (store / "memories" / "2.md").exists()
    errors = []
    for ref in ("shop.payroll.salary_band", "shop.nosuch.salary_band"):
        with pytest.raises(JsonRpcInvalidParams) as exc:
            await request(client, "slayer/saveMemory", {"learning": "x", "entities": [ref]})
        errors.append(str(exc.value))
    assert errors[0].replace("payroll", "nosuch") == errors[1]
    saved = await request(
        client, "slayer/saveMemory", {"learning": "Orders ship daily.", "entities": ["shop.orders"]}
    )
    assert saved["id"] not in _MEMORY_IDS  # a fresh id: never an unreachable memory's
    assert await request(client, "slayer/forgetMemory", {"id": saved["id"]}) == {"forgotten": True}


_MEMORY_IDS = {str(i) for i in range(1, 11)}


async def test_the_scope_follows_the_configuration(tmp_path):
    store = write_store(tmp_path / "store")
    c = await start_client(store, "visual-studio-code", OPTIONS)
    try:
        assert (await request(c, "slayer/search", {"question": "Zanzibar"}))["results"] == []
        c.workspace_did_change_configuration(
            t.DidChangeConfigurationParams(settings={"slayerLsp": {"scope": {"accessTags": ["hr"]}}})
        )
        found = await eventually(
            lambda: c.protocol.send_request_async("slayer/search", {"question": "Zanzibar"}),
            lambda r: bool(r.results),
            "payroll within the new scope",
        )
        assert any(h.id in ("shop.payroll", "2") for h in found.results)
    finally:
        await stop_client(c)


async def test_a_command_line_scope_is_fixed(tmp_path):
    """``slayer-lsp serve --access-tag ops``: the client's scope option cannot widen it."""
    store = write_store(tmp_path / "store")
    c = make_test_lsp_client()
    await c.start_io(
        sys.executable,
        "-m",
        "slayer_lsp",
        "serve",
        "--storage",
        str(store),
        "--access-tag",
        "ops",
        cwd=str(REPO),
    )
    try:
        await c.initialize_session(
            t.InitializeParams(
                capabilities=client_capabilities("visual-studio-code"),
                initialization_options={"embedding": {"enable": False}, "scope": {"accessTags": ["hr"]}},
            )
        )
        status = await eventually(
            lambda: c.protocol.send_request_async("slayer/status", {}), lambda s: s.ready, "the initial index"
        )
        status = await request(c, "slayer/status", {})
        assert status["options"]["scope"]["fixedBy"] == "command line"
        assert status["options"]["scope"]["accessTags"] == ["ops"]
        assert any("fixed by the command line" in p for p in status["option_problems"])
        assert status["counts"]["memory"] == len(EXPECTED[TAGS][1])
        resp = await request(c, "slayer/search", {"question": "Zanzibar salary", "max_results": 50})
        assert not leaks(resp, TAGS)
    finally:
        await stop_client(c)
