"""``slayer-lsp mcp`` with a second, independent client: the TypeScript SDK
(``@modelcontextprotocol/sdk``, pinned in ``ts_client/package.json``) run by Node. It speaks the
2025 handshake and validates the structured answer of a tool against the announced output schema
with its own JSON Schema validator. Needs ``node`` and ``npm ci`` in ``tests/mcp/ts_client``
(``.ci/run`` does it)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from slayer_lsp.mcp import types as mt

from ..lsp.support import REPO, copy_store

HERE = Path(__file__).resolve().parent / "ts_client"
NODE = shutil.which("node")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(NODE is None, reason="node is not installed"),
    pytest.mark.skipif(
        not (HERE / "node_modules" / "@modelcontextprotocol" / "sdk").is_dir(),
        reason="the TypeScript SDK is not installed: run `npm ci` in tests/mcp/ts_client",
    ),
]


def test_the_typescript_sdk_lists_calls_and_reads(tmp_path_factory):
    store = copy_store(tmp_path_factory)
    run = subprocess.run(
        [NODE, str(HERE / "client.mjs"), sys.executable, str(store), str(REPO)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=HERE,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout)
    assert out["server"]["name"] == "slayer-lsp"
    assert out["capabilities"]["resources"] == {"subscribe": True, "listChanged": True}
    assert out["tools"] == [s.name for s in mt.TOOLS]
    for spec in mt.TOOLS:
        assert out["schemas"][spec.name] == {
            "input": mt.json_schema(spec.params, closed=True),
            "output": mt.json_schema(spec.result),
        }
    assert not out["search"]["isError"] and "jaffle.orders.order_total" in out["search"]["ids"]
    assert out["bad"]["isError"] and out["bad"]["text"].startswith("search: invalid arguments")
    assert "slayer://model/jaffle.orders" in out["resources"] and "slayer://memory/1" in out["resources"]
    assert out["model"]["id"] == "jaffle.orders" and out["model"]["joins"]
