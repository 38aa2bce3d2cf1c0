"""The command line, run as a user runs it: ``slayer-lsp search`` and ``slayer-lsp inspect``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from slayer_lsp import __version__
from tests.conftest import EXPECTED, SQLITE_STORE, YAML_STORE


def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "slayer_lsp", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def test_version():
    out = run("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"slayer-lsp {__version__}"


@pytest.mark.parametrize("store", [YAML_STORE, SQLITE_STORE])
def test_search_json_has_slayers_shape(store):
    expected = json.loads((EXPECTED / "10_e_join_path_and_agg.json").read_text())["response"]
    out = run(
        "search",
        "--storage",
        str(store),
        "--entity",
        "sum(orders.order_total)",
        "--entity",
        "orders.customers.city",
        "--format",
        "json",
        "--ranking",
        "slayer",
    )
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert list(got) == ["results", "resolved_input_entities", "warnings"]
    assert list(got["results"][0]) == [
        "kind",
        "id",
        "score",
        "text",
        "description",
        "matched_entities",
        "query",
    ]
    assert got == expected


def test_search_text_and_query_file(tmp_path):
    qfile = tmp_path / "q.query.yaml"
    qfile.write_text("source_model: orders\nmeasures: [sum(subtotal)]\ndimensions: [stores.name]\n")
    out = run("search", "--storage", str(YAML_STORE), "--query", f"@{qfile}", "--question", "net sales")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "Resolved input entities: jaffle.orders, jaffle.stores.name, jaffle.orders.subtotal"
    assert lines[1].startswith("Results (")
    assert any(line.strip().startswith("Q 6 ") for line in lines)


def test_search_storage_from_environment():
    out = run(
        "search", "--question", "PROD-4471", "--format", "json", env={"SLAYER_STORAGE": str(SQLITE_STORE)}
    )
    assert out.returncode == 0 and json.loads(out.stdout)["results"][0]["id"] == "3"


@pytest.mark.parametrize(
    "args,code,message",
    [
        (["--datasource", "warehouse", "--question", "x"], 1, "datasource 'warehouse' not found"),
        (["--max-results", "0", "--question", "x"], 1, "max_results must be >= 1"),
        (["--query", "{not json"], 2, "--query"),
        (["--cypher-filter", "MATCH (n) DETACH DELETE n RETURN n.id AS id"], 1, "cypher_filter"),
    ],
)
def test_search_errors(args, code, message):
    out = run("search", "--storage", str(YAML_STORE), *args)
    assert out.returncode == code and message in out.stderr and out.stdout == ""


def test_missing_store_is_a_usage_error(tmp_path):
    out = run("search", "--storage", str(tmp_path / "nope"), "--question", "x")
    assert out.returncode == 2 and "does not exist" in out.stderr


def test_inspect_text():
    out = run("inspect", "--storage", str(YAML_STORE), "orders.status", "memory:5", "jaffle.customers.email")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "column jaffle.orders.status" in text
    assert 'Sample values: ["completed", "returned", "pending"]' in text
    assert "memory memory:5" in text and "jaffle.customers.loyalty_tier (stale)" in text
    assert "column jaffle.customers.email  (hidden)" in text


def test_inspect_json_and_failure():
    out = run("inspect", "--storage", str(SQLITE_STORE), "--format", "json", "memory:6", "nosuch")
    assert out.returncode == 1
    items = json.loads(out.stdout)
    assert items[0]["canonical"] == "memory:6" and items[0]["query"]["source_model"] == "orders"
    assert [t["stale"] for t in items[0]["tags"]] == [False] * 5
    assert items[1]["error"].startswith("Entity 'nosuch' not found")


@pytest.mark.slow
def test_embed_status_and_dense_search(tmp_path):
    import shutil

    store = tmp_path / "store"
    shutil.copytree(YAML_STORE, store)
    before = json.loads(run("status", "--storage", str(store), "--format", "json").stdout)
    assert before["embedding"] is None and before["counts"]["memory"] == 21
    from slayer_lsp.catalog import load_catalog
    from slayer_lsp.texts.statements import CatalogItems

    n = len(load_catalog(store).searchable_ids())  # hidden models and columns are not embedded
    distinct = len(
        {item.text for item in CatalogItems(load_catalog(store))}
    )  # identical texts: embedded once
    out = run("embed", "--storage", str(store))
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(
        f"local/all-MiniLM-L6-v2-int8-dyn: {n} rows, {distinct} embedded now, {n - distinct} reused"
    )
    status = json.loads(run("status", "--storage", str(store), "--format", "json").stdout)
    assert status["embedding"]["rows"] == n and status["embedding"]["dim"] == 384
    # a question that shares no word with the answer is found by meaning
    words = run(
        "search",
        "--storage",
        str(store),
        "--question",
        "zip code of the shop",
        "--no-dense",
        "--format",
        "json",
    )
    dense = run("search", "--storage", str(store), "--question", "zip code of the shop", "--format", "json")
    assert dense.returncode == 0, dense.stderr
    ids_words = [h["id"] for h in json.loads(words.stdout)["results"]]
    ids_dense = [h["id"] for h in json.loads(dense.stdout)["results"]]
    assert ids_dense != ids_words and len(ids_dense) >= len(ids_words)
    again = run("embed", "--storage", str(store))
    assert f"{n} rows, 0 embedded now" in again.stdout  # unchanged texts are never embedded twice


_ENDING = """
import sys, threading
from slayer_lsp.cli.main import serve_then_exit

def busy():  # a background thread still at work when the server returns
    while True:
        sum(range(1000))

threading.Thread(target=busy, daemon=True).start()
print("written before the end", end="")  # buffered: the ending must flush it
def run():
    {body}
serve_then_exit(run)
raise AssertionError("the process goes on after its server ended")
"""


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ("return 0", 0),
        ("return 3", 3),
        ("raise SystemExit(1)", 1),
        ("raise SystemExit('no store')", 1),
        ("raise KeyboardInterrupt", 130),
        ("raise ValueError('x')", 1),
    ],
)
def test_a_server_process_ends_with_its_servers_code_and_output(body, code):
    proc = subprocess.run(
        [sys.executable, "-c", _ENDING.format(body=body)], capture_output=True, text=True, timeout=60
    )
    assert (proc.returncode, proc.stdout) == (code, "written before the end"), proc.stderr
    assert ("ValueError: x" in proc.stderr) == ("ValueError" in body)
