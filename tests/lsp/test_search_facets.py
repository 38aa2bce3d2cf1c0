"""slayer/searchFacets through the real daemon: the spec's example is what it answers, the command
twin answers the same, bad params answer -32602, a store edit reaches the facets, and with the
bundled model the part vectors are embedded in the background and rank by cosine."""

from __future__ import annotations

import json
import re

import pytest
import pytest_asyncio
import yaml
from lsprotocol import types as t
from pygls.exceptions import JsonRpcInvalidParams

from slayer_lsp.texts.facets import facet_texts
from slayer_lsp.texts.parts import PIECE_KIND, part_kind
from slayer_lsp.texts.pieces import piece_texts

from .support import REPO, copy_store, eventually, plain, request, start_client, stop_client

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow]

SPEC = (REPO / "protocol" / "README.md").read_text(encoding="utf-8")
EMBED_WAIT_S = 240.0  # model load and a few hundred short texts on a slow CI machine
METHOD = "slayer/searchFacets"


def spec_example(part: str):
    found = re.search(rf"<!-- example: {METHOD} {part} -->\s*```json\n(.*?)```", SPEC, re.DOTALL)
    assert found, f"no {part} example of {METHOD} in protocol/README.md"
    return json.loads(found.group(1))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(tmp_path_factory):
    store = copy_store(tmp_path_factory)
    c = await start_client(store, "visual-studio-code")
    c.store = store  # type: ignore[attr-defined]
    yield c
    await stop_client(c)


async def test_the_spec_example_is_what_the_server_answers(client):
    assert await request(client, METHOD, spec_example("params")) == spec_example("result")


async def test_the_command_twin(client):
    params = {"kind": "model", "facets": {"meaning": "orders", "columns": "status subtotal"}, "limit": 3}
    direct = await request(client, METHOD, params)
    assert direct["results"][0]["id"] == "jaffle.orders" and direct["channel"] == "lexical"
    twin = plain(
        await client.workspace_execute_command_async(
            t.ExecuteCommandParams(command="slayer.searchFacets", arguments=[params])
        )
    )
    assert twin == direct


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"kind": "column"}, "missing required field `facets`"),
        ({"kind": "column", "facets": {"meaning": "x"}, "colour": 1}, "unknown field `colour`"),
        ([1, 2], "params must be an object"),
        ({"kind": "column", "facets": {"colour": "red"}}, "facet 'colour' is not a facet of column"),
        ({"kind": "join", "facets": {"meaning": "x"}}, "kind 'join' has no facets"),
        ({"kind": "column", "facets": {"meaning": "x"}, "limit": 0}, "limit must be >= 1"),
        ({"kind": "column", "facets": {"meaning": "x"}, "datasource": "nosuch"}, "nosuch"),
    ],
)
async def test_invalid_params(client, params, message):
    with pytest.raises(JsonRpcInvalidParams) as info:
        await request(client, METHOD, params)
    assert message in str(info.value) and str(info.value).startswith(f"{METHOD}: ")


async def test_a_store_edit_reaches_the_facets(client):
    path = client.store / "models" / "jaffle" / "stores.yaml"
    doc = yaml.safe_load(path.read_text())
    city = next(c for c in doc["columns"] if c["name"] == "city")
    city["sampled_values"] = ["Berlin", *city["sampled_values"]]
    city["sampled"] = ", ".join(city["sampled_values"])
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    params = {"kind": "column", "facets": {"meaning": "city", "values": "Berlin"}}
    got = await eventually(
        lambda: request(client, METHOD, params),
        lambda r: [h["id"] for h in r["results"]][:1] == ["jaffle.stores.city"],
        "the edited samples to be searched",
    )
    assert [h["id"] for h in got["results"]] == ["jaffle.stores.city", "jaffle.customers.city"]


# --------------------------------------------------------------------------- with the bundled model


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def dense_client(tmp_path_factory):
    store = copy_store(tmp_path_factory, "dense-store")
    c = await start_client(store, "neovim@v0.7.0", dense=True)
    c.store = store  # type: ignore[attr-defined]
    yield c
    await stop_client(c)


def parts_done(status: dict) -> bool:
    e = status.get("embedding")
    p = e and e.get("parts")
    return bool(p) and p["state"] == "idle" and p["pending"] == 0 and p["rows"] > 0 and e["pending"] == 0


async def test_part_vectors_rank_by_cosine(dense_client, yaml_catalog):
    status = await eventually(
        lambda: request(dense_client, "slayer/status", {}),
        parts_done,
        "the part vectors to be embedded",
        timeout=EMBED_WAIT_S,
    )
    parts = status["embedding"]["parts"]
    want: dict[str, int] = {}
    for cid in yaml_catalog.searchable_ids():
        ent = yaml_catalog.get(cid)
        for facet in facet_texts(ent.obj):
            want[part_kind(ent.kind, facet)] = want.get(part_kind(ent.kind, facet), 0) + 1
        if ent.kind == "memory":  # and a memory's pieces, all of one kind
            want[PIECE_KIND] = want.get(PIECE_KIND, 0) + len(piece_texts(ent.obj))
    # (pygls' client decodes objects into namedtuples, which rename keys like "column#values": the
    # counts are compared in the server's sorted key order)
    assert list(parts["kinds"].values()) == [n for _, n in sorted(want.items())] and parts["failed"] == 0
    got = await request(
        dense_client, METHOD, {"kind": "column", "facets": {"meaning": "town", "values": "European capitals"}}
    )
    assert got["channel"] == "dense" and got["warnings"] == []
    assert got["results"][0]["id"] == "jaffle.customers.city"  # no word of either query is in its texts
    for hit in got["results"]:
        assert -1.0 <= hit["score"] <= 1.0 and hit["score"] == min(hit["facet_scores"].values())
