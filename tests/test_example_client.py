"""protocol/example_client.py end to end: it starts the daemon on the jaffle fixture, searches,
inspects and shuts the daemon down, with the standard library only."""

from __future__ import annotations

import ast
import json
import subprocess
import sys

import msgspec
import pytest

from slayer_lsp.protocol_types import InspectResult
from slayer_lsp.search.types import SearchResponse
from tests.conftest import REPO, SQLITE_STORE, YAML_STORE

CLIENT = REPO / "protocol" / "example_client.py"


def run_client(*args: str) -> subprocess.CompletedProcess[str]:
    # cwd=REPO: the daemon it starts (``python -m slayer_lsp``) is this checkout's
    return subprocess.run(
        [sys.executable, str(CLIENT), *args], cwd=REPO, capture_output=True, text=True, timeout=300
    )


def test_uses_the_standard_library_only():
    tree = ast.parse(CLIENT.read_text(encoding="utf-8"))
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported - {"__future__"} <= set(sys.stdlib_module_names), imported


@pytest.mark.slow
def test_search_and_inspect_end_to_end():
    proc = run_client(
        "--storage",
        str(YAML_STORE),
        "--question",
        "net sales by store",
        "--ref",
        "orders.subtotal",
        "--ref",
        "memory:5",
        "--ref",
        "nope",
        "--no-embeddings",
        "--json",
        "--quiet",
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["server"]["name"] == "slayer-lsp" and out["exit_code"] == 0 and out["store_error"] is None
    search = msgspec.convert(out["search"], SearchResponse)
    assert 0 < len(search.results) <= 5
    assert {"jaffle.orders.subtotal", "6"} <= {
        h.id for h in search.results
    }  # the column and the example query
    items = msgspec.convert(out["inspect"], InspectResult).items
    assert [i.ref for i in items] == ["orders.subtotal", "memory:5", "nope"]
    column, memory, missing = items
    assert (column.canonical, column.kind) == ("jaffle.orders.subtotal", "column")
    assert (
        column.location is not None
        and column.location.uri == (YAML_STORE / "models/jaffle/orders.yaml").as_uri()
    )
    assert memory.tags is not None and [t.stale for t in memory.tags] == [True, False]
    assert missing.canonical is None and "not found" in (missing.error or "")


@pytest.mark.slow
def test_human_output_on_sqlite():
    proc = run_client("--storage", str(SQLITE_STORE), "--ref", "stores.name", "--no-embeddings", "--quiet")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("slayer-lsp ") and "slayer/search:" in lines and "slayer/inspect:" in lines
    assert f"  stores.name -> column jaffle.stores.name  ({SQLITE_STORE.as_uri()})" in lines
    assert lines[-1] == "server exit code: 0"


@pytest.mark.slow
def test_a_missing_store_fails_cleanly(tmp_path):
    proc = run_client("--storage", str(tmp_path / "nothing"), "--no-embeddings", "--quiet")
    assert proc.returncode == 1
    assert (
        proc.stderr == f"example_client: the store cannot be read: store directory {tmp_path / 'nothing'} "
        "does not exist\n"
    )
    assert proc.stdout.splitlines()[-1] == "server exit code: 0"
