"""The server through headless Neovim's built-in LSP client (Debian's ``neovim``, 0.7.2 in bookworm):
diagnostics, completion, hover and ``slayer/search`` on a temp copy of the jaffle store. Neovim's
client is written in Lua on its own JSON encoder, so this is a second client independent of pygls.
Skipped where ``nvim`` is missing, except in CI (``CI`` set), where ``.ci/run`` installs it and its
absence is a failure."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .support import FIXTURES, REPO, copy_store

pytestmark = pytest.mark.slow  # every test here takes seconds (CI runs them; -m "not slow" skips them)

HERE = Path(__file__).resolve().parent
QUERY = "source_model: orders\ndimensions: [stores., stauts]\nmeasures: [sum(subtotal)]\n"
SEARCH_CASE = FIXTURES / "expected" / "17_q_and_entities.json"  # a search and SLayer's own answer


def test_neovim_headless_client(tmp_path_factory):
    nvim = shutil.which("nvim")
    if nvim is None:
        if os.environ.get("CI"):
            pytest.fail("CI must provide nvim (apt-get install neovim) for the Neovim client test")
        pytest.skip("nvim is not installed (apt-get install neovim)")
    store = copy_store(tmp_path_factory)
    work = tmp_path_factory.mktemp("nvim")
    probe = work / "probe.query.yaml"
    probe.write_text(QUERY)
    out = work / "out.json"
    case = json.loads(SEARCH_CASE.read_text())
    env = {
        **os.environ,
        "LSP_CMD": f"{sys.executable} -m slayer_lsp.lsp --storage {store} --log-level WARNING",
        "LSP_FILE": str(probe),
        "LSP_OUT": str(out),
        "LSP_SEARCH": json.dumps({**case["call"], "ranking": "slayer"}),
        "HOME": str(work),
        "XDG_CONFIG_HOME": str(work / "config"),
        "XDG_DATA_HOME": str(work / "data"),
        "XDG_STATE_HOME": str(work / "state"),
    }
    proc = subprocess.run(
        [nvim, "--headless", "-u", "NONE", "-i", "NONE", "-n", "-c", f"luafile {HERE / 'neovim_client.lua'}"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.is_file(), (
        f"nvim wrote nothing (exit {proc.returncode}): {proc.stdout[-2000:]} {proc.stderr[-2000:]}"
    )
    got = json.loads(out.read_text())
    assert got["errors"] == [], got["errors"]
    assert set(got["triggers"]) >= {".", ":", "(", '"'}

    diags = sorted(
        (d["code"], d["range"]["start"]["line"], d["range"]["start"]["character"]) for d in got["diagnostics"]
    )
    assert diags == [("invalid-query", 1, 13), ("unknown-entity", 1, 22)]
    unknown = next(d for d in got["diagnostics"] if d["code"] == "unknown-entity")
    assert unknown["message"].startswith("Entity 'stauts' not found") and unknown["source"] == "slayer"

    items = got["completion"]["items"]
    assert [i["label"] for i in sorted(items, key=lambda i: i["sortText"])][:5] == [
        "id",
        "name",
        "city",
        "opened_at",
        "tax_rate",
    ]
    assert items[0]["textEdit"]["range"]["start"] == {"line": 1, "character": 20}

    assert got["hover"]["contents"]["value"].startswith("**model** `jaffle.orders`")
    column = got["column_hover"]
    assert column["contents"]["value"].startswith("**column** `jaffle.orders.subtotal`")
    assert column["range"]["start"] == {"line": 2, "character": 15}

    want = case["response"]
    assert [(h["kind"], h["id"]) for h in got["search"]["results"]] == [
        (h["kind"], h["id"]) for h in want["results"]
    ]
    assert got["search"]["warnings"] == want["warnings"]
    assert got["bad"]["error"]["code"] == -32602 and "max_results" in got["bad"]["error"]["message"]

    assert got["prepare_rename"]["placeholder"] == "subtotal"
    edits: dict[str, list] = {}
    for uri, changes in (got["rename"].get("changes") or {}).items():
        edits.setdefault(uri, []).extend(changes)
    for change in got["rename"].get("documentChanges") or []:
        if "edits" in change:
            edits.setdefault(change["textDocument"]["uri"], []).extend(change["edits"])
    assert any(
        e["newText"] == "net_subtotal" and e["range"]["start"] == {"line": 2, "character": 15}
        for e in edits[probe.as_uri()]
    )
    assert (store / "models" / "jaffle" / "orders.yaml").as_uri() in edits
    assert "already exists" in got["rename_refused"]["error"]["message"]
    assert got["signature"]["signatures"][0]["label"] == "sum(value)"
    assert any("jaffle.orders.subtotal" in h["label"] for h in got["inlay"])
    assert got["impact"]["entity"] == "jaffle.orders.subtotal" and got["impact"]["counts"]["memory"] >= 1
    assert got["stopped"] is True
