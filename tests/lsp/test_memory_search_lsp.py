"""Memory search through the real daemon and the real command line: a linked memory comes back
marked with ``via`` behind the named record's own memory, a ``keyword`` is trusted less than a
token of the question, ``kinds`` narrows before ranking, and ``slayer-lsp search`` says the same."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import pytest_asyncio
from pygls.exceptions import JsonRpcInvalidParams

from ..test_memory_search_api import PACKAGING, SISTER, URGENT, Mem, write_store
from .support import REPO, request, start_client, stop_client

aio = pytest.mark.asyncio(loop_scope="module")  # the CLI test is not a coroutine

MEMORIES = {
    **SISTER,
    **PACKAGING,
    "a": Mem("Cartons split open: SKU-9911."),
    "b": Mem("Cartons split open: SKU-5522."),
}
SLAYER_HIT_KEYS = ["kind", "id", "score", "text", "description", "matched_entities", "query"]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return write_store(tmp_path_factory.mktemp("memsearch") / "store", MEMORIES)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(store):
    c = await start_client(store, "visual-studio-code", {"embedding": {"enable": False}})
    yield c
    await stop_client(c)


@aio
async def test_related_brings_the_linked_memory_marked_behind_the_named_records_own(client):
    got = await request(
        client, "slayer/search", {"question": URGENT, "entities": ["shop.customers"], "related": 1}
    )
    hits = got["results"]
    assert [(h["kind"], h["id"]) for h in hits[:3]] == [
        ("model", "shop.customers"),
        ("memory", "cust"),
        ("memory", "sister"),
    ]
    assert hits[2]["via"] == "memory:cust"
    assert all("via" not in h for h in hits if h["id"] != "sister")  # SLayer's fields unless linked
    assert [h["id"] for h in hits].count("sister") == 1
    unnamed = await request(client, "slayer/search", {"question": URGENT, "related": 1, "kinds": ["memory"]})
    assert unnamed["results"][0]["id"] == "sister" and "via" not in unnamed["results"][0]


@aio
@pytest.mark.parametrize(
    "asked, keyword, order", [("SKU-9911", "SKU-5522", ["a", "b"]), ("SKU-5522", "SKU-9911", ["b", "a"])]
)
async def test_keyword_is_trusted_less_than_a_token_of_the_question(client, asked, keyword, order):
    got = await request(
        client,
        "slayer/search",
        {"question": f"cartons split open for {asked}?", "keyword": keyword, "kinds": ["memory"]},
    )
    assert [h["id"] for h in got["results"]][:2] == order


@aio
async def test_kinds_narrow_the_answer(client):
    q = {"question": "did we sort out the packaging fault on PROD-4471?", "max_results": 50}
    full = (await request(client, "slayer/search", q))["results"]
    assert full[0]["id"] == "code" and {h["kind"] for h in full} - {"memory"}
    memories = (await request(client, "slayer/search", {**q, "kinds": ["memory"]}))["results"]
    assert [h["id"] for h in memories] == [h["id"] for h in full if h["kind"] == "memory"]
    others = (await request(client, "slayer/search", {**q, "kinds": ["model", "column"]}))["results"]
    assert others and all(h["kind"] in ("model", "column") for h in others)
    with pytest.raises(JsonRpcInvalidParams, match="unknown kinds"):
        await request(client, "slayer/search", {**q, "kinds": ["memories"]})
    with pytest.raises(JsonRpcInvalidParams, match="related need ranking 'hybrid'"):
        await request(client, "slayer/search", {**q, "related": 1, "ranking": "slayer"})


def test_the_cli_says_the_same(store):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "slayer_lsp",
            "search",
            "--storage",
            str(store),
            "--question",
            URGENT,
            "--entity",
            "shop.customers",
            "--related",
            "1",
            "--keyword",
            "ACME-77",
            "--kind",
            "memory",
            "--format",
            "json",
            "--no-dense",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    hits = got["results"]
    assert [h["id"] for h in hits[:2]] == ["cust", "sister"] and {h["kind"] for h in hits} == {"memory"}
    assert list(hits[0]) == SLAYER_HIT_KEYS and list(hits[1]) == [*SLAYER_HIT_KEYS, "via"]
    assert hits[1]["via"] == "memory:cust"
    assert got["resolved_input_entities"] == ["shop.customers"]
