"""Hostile input through the daemon (issue #9, item 6): the same payloads as tests/test_hostile_input.py,
sent as JSON-RPC to ``slayer-lsp serve`` running with an empty working directory, a private temp
directory and cache, and a directory of "outside" files beside the store.

* ``slayer/saveMemory`` / ``slayer/forgetMemory`` (and their ``workspace/executeCommand`` forms) with
  ids holding path separators, ``..``, absolute paths, NUL, lone surrogates, too many bytes: -32602
  with the writer's reason; odd but legal ids land in ``memories/`` only (YAML and SQLite stores).
* ``slayer/search`` with a 1 MB question and ``max_results`` of 10**9, 2**70, -1, 0, "x": bounded
  with a warning or refused with a clear error; ``cypher_filter`` writes and loads are refused.
* Hover cards of descriptions carrying Markdown, HTML, control and bidi characters render (markdown-it,
  raw HTML on) to nothing but text; search hands the same descriptions back verbatim (JSON escapes
  them) and the wire stays well framed.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests import markdown_oracle as md
from tests.test_hostile_input import (
    ODD_BUT_LEGAL_IDS,
    PAYLOADS,
    REFUSED,
    REFUSED_IDS,
    Sandbox,
    _hostile_store,
    assert_card_is_inert,
    tree,
)

from .raw_daemon import RawDaemon, copy_shop

pytestmark = pytest.mark.slow  # every test here takes seconds (CI runs them; -m "not slow" skips them)

FIGURES: dict[str, float] = {}


def _sandbox(root: Path) -> Sandbox:
    store = copy_shop(root)
    db = copy_shop(root, sqlite=True)
    sb = Sandbox(root, store, db, root / "cwd", root / "tmp", root / "outside", root / "cache")
    for d in (sb.cwd, sb.tmp, sb.outside, sb.cache):
        d.mkdir()
    (sb.outside / "secret.csv").write_text("id\nleaked\n")
    (sb.outside / "victim.md").write_text("---\nentities: []\n---\nnot a memory of this store\n")
    (store / "victim.md").write_text("a file beside memories/, not in it\n")
    return sb


def _daemon(sb: Sandbox, store: Path) -> RawDaemon:
    (sb.root / "logs").mkdir(exist_ok=True)
    d = RawDaemon(
        store,
        sb.root / "logs" / "daemon.log",
        cwd=sb.cwd,
        env={"TMPDIR": str(sb.tmp), "SLAYER_LSP_CACHE_DIR": str(sb.cache)},
    )
    d.initialize()
    return d


def _error(resp: dict) -> dict:
    assert "error" in resp, resp
    return resp["error"]


@pytest.mark.parametrize("backend", ["yaml", "sqlite"])
def test_hostile_memory_ids_over_lsp(tmp_path, backend):
    sb = _sandbox(tmp_path)
    d = _daemon(sb, sb.store if backend == "yaml" else sb.db)
    try:
        outside_before, store_before = sb.outside_tree(), tree(sb.store)
        for memory_id, why in REFUSED_IDS:
            saves = [
                d.call("slayer/saveMemory", {"learning": "l", "entities": ["shop.orders"], "id": memory_id}),
                d.call(
                    "workspace/executeCommand",
                    {
                        "command": "slayer.saveMemory",
                        "arguments": [{"learning": "l", "entities": ["shop.orders"], "id": memory_id}],
                    },
                ),
            ]
            forgets = [
                d.call("slayer/forgetMemory", {"id": memory_id}),
                d.call(
                    "workspace/executeCommand", {"command": "slayer.forgetMemory", "arguments": [memory_id]}
                ),
            ]
            for resp in saves + forgets:
                err = _error(resp)
                assert err["code"] == -32602 and why in err["message"], (ascii(memory_id), err)
        too_long = d.call(
            "slayer/saveMemory", {"learning": "l", "entities": ["shop.orders"], "id": "x" * 300}
        )
        if backend == "yaml":
            assert _error(too_long)["code"] == -32602 and "too long" in too_long["error"]["message"]
        else:
            assert too_long["result"]["id"] == "x" * 300
        assert d.call("slayer/forgetMemory", {"id": "x" * 300})["result"] == {
            "forgotten": backend == "sqlite"
        }
        for memory_id in ODD_BUT_LEGAL_IDS:
            saved = d.call(
                "slayer/saveMemory", {"learning": "odd id", "entities": ["shop.orders"], "id": memory_id}
            )
            assert saved["result"]["id"] == memory_id, saved
            if backend == "yaml":
                written = sb.store / "memories" / f"{memory_id}.md"
                assert written.resolve().parent == (sb.store / "memories").resolve() and written.is_file()
            assert d.call("slayer/forgetMemory", {"id": memory_id})["result"] == {"forgotten": True}
        assert d.alive() and not d.output_problems and not d.duplicates()
    finally:
        assert d.stop() == 0
    after = tree(sb.store)
    changed = {k for k in set(store_before) | set(after) if store_before.get(k) != after.get(k)}
    assert changed <= {"memories.lock", "embeddings.db"}, changed
    assert sb.outside_tree() == outside_before
    assert not any(sb.cwd.iterdir()) and not any(sb.tmp.iterdir())


def test_search_bounds_and_cypher_refusals_over_lsp(tmp_path):
    sb = _sandbox(tmp_path)
    d = _daemon(sb, sb.store)
    try:
        question = "orders revenue customers " * 42_000  # ~1 MB
        bounded = [
            ("1 MB question", {"question": question}, "question cut to its first"),
            ("max_results 10**9", {"question": "orders", "max_results": 10**9}, "above the cap"),
            ("max_results 2**70", {"question": "orders", "max_results": 2**70}, "above the cap"),
        ]
        for name, params, warning in bounded:
            t0 = time.monotonic()
            res = d.call("slayer/search", params)["result"]
            FIGURES[name] = round(time.monotonic() - t0, 3)
            assert any(warning in w for w in res["warnings"]), res["warnings"]
            assert len(res["results"]) <= 1000
        refused = [
            ({"question": "orders", "max_results": -1}, "max_results must be >= 1"),
            ({"question": "orders", "max_results": 0}, "max_results must be >= 1"),
            ({"question": "orders", "max_results": "x"}, "Expected `int`, got `str` - at `$.max_results`"),
            ({"question": "orders", "max_results": 1.5}, "Expected `int`, got `float`"),
            ({"question": ["orders"]}, "Expected `str | null`, got `array` - at `$.question`"),
        ]
        for _name, cypher, why in REFUSED[:25]:
            refused.append(
                ({"question": "orders", "cypher_filter": cypher.replace("{outside}", str(sb.outside))}, why)
            )
        for params, why in refused:
            err = _error(d.call("slayer/search", params))
            assert err["code"] == -32602 and why in err["message"], (params, err)
        assert d.alive() and not d.output_problems and not d.duplicates()
    finally:
        assert d.stop() == 0
    assert not any(sb.cwd.iterdir()) and not any(sb.tmp.iterdir())
    assert set(sb.outside.iterdir()) == {sb.outside / "secret.csv", sb.outside / "victim.md"}
    print(f"\n[hostile-lsp] answer times (s): {FIGURES}")


def test_hostile_descriptions_in_hovers_and_search_hits(tmp_path):
    sb = _sandbox(tmp_path)
    _hostile_store(sb)
    d = _daemon(sb, sb.store)
    try:
        uri = "file:///ws/hostile.query.yaml"
        text = "source_model: orders\ndimensions: [orders.status, orders.channel, orders.order_id]\n"
        d.notify(
            "textDocument/didOpen",
            {"textDocument": {"uri": uri, "languageId": "yaml", "version": 1, "text": text}},
        )
        cards = []
        for line, character in ((0, 16), (1, 21), (1, 36), (1, 52)):  # orders (the model), three columns
            res = d.call(
                "textDocument/hover",
                {"textDocument": {"uri": uri}, "position": {"line": line, "character": character}},
            )
            assert res.get("result"), res
            cards.append(res["result"]["contents"]["value"])
        for card, rendered in zip(cards, md.render(cards), strict=True):
            assert_card_is_inert(card, rendered)
        # search returns the stored text itself (JSON escapes it on the wire), not an escaped copy
        res = d.call("slayer/search", {"question": "orders status", "max_results": 100, "compact": False})
        hits = {h["id"]: h for h in res["result"]["results"]}
        assert hits["shop.orders.order_id"]["description"] == PAYLOADS[0]
        model_text = hits["shop.orders"]["text"]
        assert PAYLOADS[0] in model_text and "\x1b[2J" in model_text
        assert d.alive() and not d.output_problems and not d.duplicates()
    finally:
        assert d.stop() == 0
