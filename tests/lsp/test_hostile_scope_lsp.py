"""Issue #14 (classes 3 and 8-12) through the real daemon over stdio: a megabyte learning is refused
at once and a learning of the largest accepted size of a hostile shape is saved and searched; a
scoped session cannot tell a hidden (or unloadable) memory from a missing one by any answer, error,
id or count, nor read, write or delete it; a store or scope given on the ``serve`` command line is
pinned; lone surrogates answer -32602; ids that display alike are one id or refused. Every request
has a 10 s watchdog, and after each hostile one a plain search still answers."""

from __future__ import annotations

import asyncio
import re
import sys

import pytest
import pytest_asyncio
from lsprotocol import types as t
from pygls.exceptions import JsonRpcException
from pytest_lsp import client_capabilities
from pytest_lsp.client import make_test_lsp_client

from slayer_lsp.store.documents import MAX_LEARNING_CHARS

from ..test_hostile_writer import HIDDEN_EXTRA, HIDDEN_OR_FREE
from ..test_reachability import EXPECTED, TAGS, leaks, write_store
from .support import REPO, eventually, open_doc, request, start_client, stop_client, uri_of

pytestmark = pytest.mark.asyncio(loop_scope="module")

WATCHDOG_S = 10.0
OPTIONS = {"diagnostics": {"debounceMs": 20}, "scope": {"accessTags": ["ops"]}}


def _hostile_store(root):
    store = write_store(root / "store")
    for mid, text in HIDDEN_EXTRA.items():
        (store / "memories" / f"{mid}.md").write_text(text, encoding="utf-8")
    return store


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(tmp_path_factory):
    store = _hostile_store(tmp_path_factory.mktemp("hostile-scope"))
    c = await start_client(store, "visual-studio-code", OPTIONS)
    c.store = store  # type: ignore[attr-defined]
    yield c
    await stop_client(c)


async def call(c, method: str, params) -> dict:
    """One request under the watchdog, then a plain search, which must answer too."""
    try:
        return await asyncio.wait_for(request(c, method, params), WATCHDOG_S)
    finally:
        plain = await asyncio.wait_for(request(c, "slayer/search", {"question": "orders"}), WATCHDOG_S)
        assert plain["results"], "the daemon stopped answering after a hostile request"


async def refused(c, method: str, params) -> JsonRpcException:
    with pytest.raises(JsonRpcException) as exc:
        await call(c, method, params)
    return exc.value


def _files(store) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((store / "memories").iterdir())}


# ------------------------------------------------------------------------------ size limits


@pytest.mark.parametrize(
    "text",
    ["." * 1_000_000, "e.g. " * 200_000, "x" * (MAX_LEARNING_CHARS + 1)],
    ids=["dots-1MB", "abbreviations-1MB", "one-over"],
)
async def test_a_learning_over_the_limit_is_refused_at_once(client, text):
    before = _files(client.store)
    err = await refused(client, "slayer/saveMemory", {"learning": text, "entities": ["shop.orders"]})
    assert err.code == -32602 and f"at most {MAX_LEARNING_CHARS} characters; got {len(text)}" in str(err)
    assert _files(client.store) == before


@pytest.mark.parametrize(
    "unit", [". ", "e.g. Dr. J. ", "| a. | b |\n", "x"], ids=["dots", "abbreviations", "table", "one-token"]
)
async def test_the_largest_learning_of_a_hostile_shape_is_saved_and_searched(client, unit):
    text = (unit * (MAX_LEARNING_CHARS // len(unit) + 1))[: MAX_LEARNING_CHARS - 13] + " Quokkafruit."
    saved = await call(client, "slayer/saveMemory", {"learning": text, "entities": ["shop.orders"]})
    found = await call(client, "slayer/search", {"question": "Quokkafruit", "max_results": 5})
    assert saved["id"] in [r["id"] for r in found["results"]]
    assert await call(client, "slayer/forgetMemory", {"id": saved["id"]}) == {"forgotten": True}


# ------------------------------------------------------------------------------ nothing hidden is learnt


async def test_hidden_ids_are_refused_exactly_like_free_ones(client):
    before = _files(client.store)
    answers = set()
    for memory_id in HIDDEN_OR_FREE:
        err = await refused(
            client,
            "slayer/saveMemory",
            {"id": memory_id, "learning": "overwrite", "entities": ["shop.orders"]},
        )
        assert err.code == -32602
        answers.add(str(err).replace(repr(memory_id), "<id>"))
    assert len(answers) == 1, answers
    assert _files(client.store) == before


@pytest.mark.parametrize(
    "memory_id", ["2", "Caf\u00e9.secret", "CAFE\u0301.SECRET", "1000", "broken", "nosuch"]
)
async def test_forgetting_a_hidden_unloadable_or_missing_memory_is_the_same_miss(client, memory_id):
    before = _files(client.store)
    assert await call(client, "slayer/forgetMemory", {"id": memory_id}) == {"forgotten": False}
    assert _files(client.store) == before


async def test_new_ids_do_not_reveal_hidden_ones(client):
    saved = await call(
        client, "slayer/saveMemory", {"learning": "Orders ship on weekdays.", "entities": ["shop.orders"]}
    )
    assert re.fullmatch(r"m-[0-9a-f]{16}", saved["id"]), saved  # not "1001": the hidden 1000 stays unseen
    again = await call(
        client,
        "slayer/saveMemory",
        {"id": saved["id"], "learning": "Orders ship daily.", "entities": ["shop.orders"]},
    )
    assert again["id"] == saved["id"] and again["created"] is False
    assert await call(client, "slayer/forgetMemory", {"id": saved["id"]}) == {"forgotten": True}


async def test_links_to_hidden_memories_resolve_like_missing_ones(client):
    errors = []
    for target in ("memory:2", "memory:1000", "memory:broken", "memory:nosuch"):
        err = await refused(
            client, "slayer/saveMemory", {"learning": "x", "entities": ["shop.orders", target]}
        )
        errors.append(str(err).replace(target[7:], "<id>"))
    assert len(set(errors)) == 1, errors


async def test_status_counts_only_what_the_scope_reaches(client):
    status = await call(client, "slayer/status", {})
    assert status["counts"]["memory"] == len(EXPECTED[TAGS][1])
    assert status["load_issues"] == 0 and status["issues"] == []  # the unloadable memory is not counted
    assert not leaks(status, TAGS) and "broken" not in repr(status) and "1000" not in repr(status["counts"])


# ------------------------------------------------------------------------------ text decoding


@pytest.mark.parametrize(
    "method, params",
    [
        ("slayer/search", {"question": "orders \ud800"}),
        ("slayer/search", {"question": "orders", "keyword": "\udfff"}),
        ("slayer/search", {"entities": ["shop.orders", "x\ud800"]}),
        ("slayer/saveMemory", {"learning": "half \ud83d of an emoji", "entities": ["shop.orders"]}),
        ("slayer/saveMemory", {"learning": "x", "entities": ["shop.orders"], "id": "a\ud800"}),
        ("slayer/inspect", {"refs": ["\ud800"]}),
    ],
)
async def test_lone_surrogates_are_invalid_params(client, method, params):
    before = _files(client.store)
    err = await refused(client, method, params)
    assert err.code == -32602 and "lone surrogate" in str(err)
    assert _files(client.store) == before


async def test_a_lone_surrogate_in_a_document_is_replaced_not_fatal(client, tmp_path):
    uri = uri_of(tmp_path / "q.query.yaml")
    open_doc(client, uri, "source_model: orders\ndimensions: [\ud800amount]\n")
    await call(client, "slayer/status", {})  # still serving


async def test_ids_that_display_alike_are_one_id_or_refused(client):
    for memory_id in ("abc\u202edcba", "ab\u200bc", "\ufeffx"):
        err = await refused(client, "slayer/forgetMemory", {"id": memory_id})
        assert err.code == -32602 and "does not show" in str(err)


# ------------------------------------------------------------------------------ command-line pins


async def test_a_command_line_store_and_scope_are_pinned(tmp_path):
    store = _hostile_store(tmp_path / "pinned")
    other = write_store(tmp_path / "other" / "store")
    (other / "memories" / "planted.md").write_text(
        "---\nentities:\n- shop.orders\n---\nPlanted Quokkafruit.\n"
    )
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
                initialization_options={
                    "embedding": {"enable": False},
                    "storage": str(other),
                    "scope": {"accessTags": ["hr"]},
                },
            )
        )
        status = await eventually(
            lambda: c.protocol.send_request_async("slayer/status", {}), lambda s: s.ready, "the initial index"
        )
        status = await call(c, "slayer/status", {})
        assert status["store"] == str(store) and status["options"]["storage"] is None
        assert any("'storage': fixed by the command line" in p for p in status["option_problems"])
        assert any("'scope': fixed by the command line" in p for p in status["option_problems"])
        c.workspace_did_change_configuration(
            t.DidChangeConfigurationParams(
                settings={"slayerLsp": {"storage": str(other), "scope": {"accessTags": ["hr"]}}}
            )
        )
        await asyncio.sleep(0.5)
        status = await call(c, "slayer/status", {})
        assert status["store"] == str(store) and status["options"]["scope"]["accessTags"] == ["ops"]
        found = await call(c, "slayer/search", {"question": "Quokkafruit Zanzibar salary", "max_results": 50})
        assert not leaks(found, TAGS) and "planted" not in repr(found)
        assert status["counts"]["memory"] == len(EXPECTED[TAGS][1])
    finally:
        await stop_client(c)


# ------------------------------------------------------------------------------ errors quote no file


async def test_an_unscoped_upsert_quotes_no_file(tmp_path):
    store = _hostile_store(tmp_path / "open")
    outside = tmp_path / "elsewhere" / "private-notes.txt"
    outside.parent.mkdir()
    outside.write_text("---\n: [unclosed Quetzal-7731\n---\nprivate\n")
    (store / "memories" / "linked.md").symlink_to(outside)
    c = await start_client(store, "visual-studio-code")
    try:
        for memory_id in ("broken", "linked"):
            err = await refused(
                c, "slayer/saveMemory", {"id": memory_id, "learning": "x", "entities": ["shop.orders"]}
            )
            message = str(err)
            assert "cannot be read" in message, message
            assert not any(s in message for s in ("Quetzal", "7731", "elsewhere", "private-notes")), message
        assert outside.read_text().startswith("---\n: [unclosed")
    finally:
        await stop_client(c)
