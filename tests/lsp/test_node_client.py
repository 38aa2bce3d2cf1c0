"""The same server through an independent client: Node's ``vscode-jsonrpc`` (pytest-lsp shares pygls'
converters with the server, so serialisation mistakes could cancel out there). Skipped where Node or
the module is missing, except in CI (``CI`` set), where ``.ci/run`` installs both and their absence is
a failure; ``NODE_PATH`` may point at a ``node_modules`` holding ``vscode-jsonrpc``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .support import REPO, copy_store

pytestmark = pytest.mark.slow  # every test here takes seconds (CI runs them; -m "not slow" skips them)

HERE = Path(__file__).resolve().parent


def _node_path() -> str | None:
    candidates = [p for p in os.environ.get("NODE_PATH", "").split(os.pathsep) if p]
    candidates.append(str(REPO / "editors" / "vscode" / "node_modules"))
    found = [p for p in candidates if (Path(p) / "vscode-jsonrpc" / "package.json").is_file()]
    return os.pathsep.join(found) or None


def test_node_vscode_jsonrpc_client(tmp_path_factory):
    node, node_path = shutil.which("node"), _node_path()
    if node is None or node_path is None:
        missing = "node" if node is None else "vscode-jsonrpc (npm ci in editors/vscode, then NODE_PATH)"
        if os.environ.get("CI"):
            pytest.fail(f"CI must provide {missing} for the independent client test")
        pytest.skip(f"{missing} is not installed")
    store = copy_store(tmp_path_factory)
    proc = subprocess.run(
        [node, str(HERE / "node_client.cjs"), str(store), sys.executable],
        cwd=REPO,
        env={**os.environ, "NODE_PATH": node_path},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["serverInfo"]["name"] == "slayer-lsp" and "." in out["triggers"]
    assert sorted(out["diagnostics"]) == [["invalid-query", 1, 13], ["unknown-entity", 1, 22]]
    assert out["completion"][:5] == ["id", "name", "city", "opened_at", "tax_rate"]
    assert out["textEdit"]["range"]["start"] == {"line": 1, "character": 20}
    assert out["hover"] == "**model** `jaffle.orders`"
    assert len(out["search"]) == 2
    assert out["invalid"][0] == -32602 and "max_results" in out["invalid"][1]
    assert out["unknown"][0] == -32601
    assert out["exitCode"] == 0
