"""``slayer-lsp --check``: every output format and exit code, run as a subprocess on copies of the
fixture stores with known problems, and the same diagnostics as the editor for the same file."""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from slayer_lsp.analysis import diagnostics as diag
from slayer_lsp.analysis.store_checks import STORE_CODES, all_codes
from slayer_lsp.cli import check as ck
from tests.conftest import REPO, SQLITE_STORE, YAML_STORE

STALE_TAG = "jaffle.customers.loyalty_tier"  # memory 5 of the jaffle store tags a column that is gone


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "slayer_lsp", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def line_of(path: Path, needle: str, occurrence: int = 1) -> tuple[int, int]:
    """1-based (line, column) of the n-th occurrence of ``needle`` in a file."""
    seen = 0
    for i, line in enumerate(path.read_text(encoding="utf-8").split("\n")):
        col = line.find(needle)
        if col >= 0:
            seen += 1
            if seen == occurrence:
                return i + 1, col + 1
    raise AssertionError(f"{needle!r} not found in {path}")


def copy_store(src: Path, dst: Path) -> Path:
    """A writable copy of a fixture store (CI lays the fixtures out without write bits)."""
    if src.is_dir():
        shutil.copytree(src, dst, copy_function=shutil.copyfile)
        for path in [dst, *dst.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
    else:
        shutil.copyfile(src, dst)
        dst.chmod(0o644)
    return dst


def replace_in(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert old in text, (path, old)
    path.write_text(text.replace(old, new, 1), encoding="utf-8")


# --------------------------------------------------------------------------- stores with known problems


@pytest.fixture(scope="module")
def broken(tmp_path_factory):
    """A YAML store with a broken join (target and key), a priority entry naming no datasource, a
    duplicate measure, an aggregation named like a column, an unloadable model file, and the jaffle
    store's own stale tag; plus a query file with an unknown entity, outside the store."""
    root = tmp_path_factory.mktemp("check")
    store = copy_store(YAML_STORE, root / "store")
    items = store / "models" / "jaffle" / "order_items.yaml"
    replace_in(items, "- target_model: products\n", "- target_model: prodcts\n")
    replace_in(items, "  - - order_id\n", "  - - order_idx\n")
    (store / "priority.yaml").write_text("priority:\n- jaffle\n- suplies\n", encoding="utf-8")
    orders = store / "models" / "jaffle" / "orders.yaml"
    replace_in(orders, "measures:\n", "measures:\n- formula: count(*)\n  name: total_revenue\n")
    replace_in(orders, "aggregations:\n", "aggregations:\n- name: status\n  formula: MAX({value})\n")
    (store / "models" / "supplies" / "broken.yaml").write_text(
        "name: broken\ncolumns: [\n  - x\n", encoding="utf-8"
    )
    queries = root / "repo" / "queries"
    queries.mkdir(parents=True)
    (queries / "bad.yaml").write_text(
        "source_model: orders\ndimensions: [stauts, status]\n", encoding="utf-8"
    )
    (queries / "good.yaml").write_text("source_model: orders\ndimensions: [status]\n", encoding="utf-8")
    (queries / "notes.txt").write_text("not a query: stauts\n", encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def broken_sqlite(tmp_path_factory):
    """The SQLite store with a broken join target, a bad priority entry and an unreadable row."""
    root = tmp_path_factory.mktemp("check-sqlite")
    db = copy_store(SQLITE_STORE, root / "store.db")
    with sqlite3.connect(db) as conn:
        (data,) = conn.execute(
            "SELECT data FROM models WHERE data_source='jaffle' AND name='order_items'"
        ).fetchone()
        model = json.loads(data)
        model["joins"][0]["target_model"] = "prodcts"
        conn.execute(
            "UPDATE models SET data=? WHERE data_source='jaffle' AND name='order_items'", (json.dumps(model),)
        )
        conn.execute(
            "UPDATE settings SET value=? WHERE key='datasource_priority'", (json.dumps(["jaffle", "nope"]),)
        )
        conn.execute(
            "INSERT INTO models (data_source, name, data) VALUES ('supplies', 'broken', '{not json')"
        )
    return root


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """The jaffle store without the memories that carry a stale or hidden tag: nothing to report."""
    root = tmp_path_factory.mktemp("clean")
    store = copy_store(YAML_STORE, root / "store")
    for mid in ("5", "8", "9"):
        (store / "memories" / f"{mid}.md").unlink()
    return root


def json_findings(proc: subprocess.CompletedProcess[str]) -> list[dict]:
    return json.loads(proc.stdout)


def keyed(findings: list[dict]) -> set[tuple[str, int, int, str, str]]:
    return {
        (f["path"], f["range"]["start"]["line"], f["range"]["start"]["column"], f["severity"], f["code"])
        for f in findings
    }


# --------------------------------------------------------------------------- what is found


def test_yaml_store_findings(broken):
    store = broken / "store"
    items = store / "models" / "jaffle" / "order_items.yaml"
    orders = store / "models" / "jaffle" / "orders.yaml"
    proc = run("check", "--storage", "store", "--format", "json", cwd=broken)
    assert proc.returncode == 1, proc.stderr
    got = json_findings(proc)
    rel = lambda p: str(p.relative_to(broken))  # noqa: E731
    target = line_of(items, "prodcts")
    key = line_of(items, "order_idx")
    prio = line_of(store / "priority.yaml", "suplies")
    dup = line_of(orders, "name: total_revenue", 2)
    agg = (line_of(orders, "MAX({value})")[0] - 1, len("- name: ") + 1)  # the aggregation added above
    tag = line_of(store / "memories" / "5.md", STALE_TAG)
    expected = {
        (rel(items), *target, "error", "unknown-join-target"),
        (rel(items), *key, "error", "unknown-join-key"),
        (rel(store / "priority.yaml"), *prio, "warning", "unknown-priority-datasource"),
        (rel(orders), dup[0], dup[1] + len("name: "), "error", "duplicate-leaf"),
        (rel(orders), *agg, "warning", "duplicate-leaf"),
        (rel(store / "memories" / "5.md"), *tag, "warning", "stale-tag"),
        (
            rel(store / "memories" / "8.md"),
            *line_of(store / "memories" / "8.md", "jaffle.customers.email"),
            "information",
            "hidden-tag",
        ),
        (
            rel(store / "memories" / "9.md"),
            *line_of(store / "memories" / "9.md", "jaffle.supplies"),
            "information",
            "hidden-tag",
        ),
        (rel(store / "models" / "supplies" / "broken.yaml"), 3, 3, "error", "load-issue"),  # the YAML error
    }
    assert keyed(got) == expected
    assert all(f["source"] == "slayer-store" for f in got)
    by_code = {f["code"]: f for f in got}
    assert "no model 'prodcts' in datasource 'jaffle'" in by_code["unknown-join-target"]["message"]
    assert "did you mean 'supplies'?" in by_code["unknown-priority-datasource"]["message"]
    assert STALE_TAG in by_code["stale-tag"]["message"]


def test_sqlite_store_findings_name_the_row(broken_sqlite):
    proc = run("check", "--storage", "store.db", "--format", "json", cwd=broken_sqlite)
    assert proc.returncode == 1, proc.stderr
    got = json_findings(proc)
    assert {f["path"] for f in got} == {"store.db"}
    assert all(f["range"]["start"] == {"line": 1, "column": 1} for f in got)
    messages = {f["code"]: f["message"] for f in got if f["severity"] != "information"}
    assert set(messages) == {"unknown-join-target", "unknown-priority-datasource", "stale-tag", "load-issue"}
    assert messages["unknown-join-target"].endswith("[models row 'jaffle.order_items']")
    assert messages["unknown-priority-datasource"].endswith("[settings row 'datasource_priority']")
    assert messages["stale-tag"].endswith("[memories row '5']")
    assert messages["load-issue"].endswith("[models row 'supplies.broken']")


@pytest.mark.parametrize("store", ["store-yaml", "store.db"])
def test_fixture_store_exit_codes(store, tmp_path):
    """The jaffle store's one stale tag is a warning: clean by default, a failure at --fail-on warning."""
    path = YAML_STORE if store == "store-yaml" else SQLITE_STORE
    default = run("check", "--storage", str(path), cwd=tmp_path)
    assert default.returncode == 0, default.stderr
    assert f"warning[stale-tag] memory:5: stale tag '{STALE_TAG}'" in default.stdout
    assert (
        default.stdout.rstrip().splitlines()[-1].startswith("Found 0 errors, 1 warning, 2 notes in the store")
    )
    strict = run("--check", "--storage", str(path), "--fail-on", "warning", cwd=tmp_path)
    assert strict.returncode == 1
    assert strict.stdout == default.stdout


def test_clean_store_exits_0(clean):
    for fail_on in ("error", "warning"):
        proc = run("--check", "--storage", "store", "--fail-on", fail_on, cwd=clean)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert proc.stdout == f"No problems found in the store yaml:{clean / 'store'}.\n"


def test_query_files_and_directories(broken):
    """Directories are walked with the server's file patterns; a file matching none is skipped."""
    proc = run("--check", "--storage", "store", "repo", "--format", "json", cwd=broken)
    docs = [f for f in json_findings(proc) if f["source"] == "slayer"]
    assert [
        (f["path"], f["range"]["start"]["line"], f["range"]["start"]["column"], f["code"]) for f in docs
    ] == [("repo/queries/bad.yaml", 2, 14, "unknown-entity")]
    assert (
        docs[0]["message"] == "Entity 'stauts' not found in any datasource (checked all known datasources)."
    )
    assert docs[0]["range"]["end"] == {"line": 2, "column": 20}
    one = run("--check", "--storage", "store", "repo/queries/good.yaml", cwd=broken)
    assert "queries/good.yaml" not in one.stdout and "and 1 file." in one.stdout


def test_store_file_given_as_path_reports_once(broken):
    """The store's memory file checked as a document: its diagnostics replace the store-level
    finding of the same code (one stale-tag, from the editor's code path)."""
    proc = run("check", "--storage", "store", "store/memories/5.md", "--format", "json", cwd=broken)
    stale = [f for f in json_findings(proc) if f["code"] == "stale-tag"]
    assert len(stale) == 1 and stale[0]["source"] == "slayer" and stale[0]["path"] == "store/memories/5.md"


def test_whole_store_walked_as_documents(tmp_path):
    """Walking the unchanged jaffle store: its files' document diagnostics add nothing but memory 5's
    stale tag (which then comes from the editor's code path instead of the store check)."""
    proc = run("check", "--storage", str(YAML_STORE), str(YAML_STORE), "--format", "json", cwd=tmp_path)
    found = json_findings(proc)
    assert [(Path(f["path"]).name, f["code"], f["source"]) for f in found] == [
        ("5.md", "stale-tag", "slayer"),
        ("8.md", "hidden-tag", "slayer-store"),
        ("9.md", "hidden-tag", "slayer-store"),
    ]


def test_text_format(broken):
    proc = run("check", "--storage", "store", "repo", cwd=broken)
    lines = proc.stdout.rstrip("\n").split("\n")
    pattern = re.compile(r"^[^:]+:\d+:\d+: (error|warning|information|hint)\[[a-z-]+\] .+$")
    assert all(pattern.match(line) for line in lines[:-1]), lines
    assert "repo/queries/bad.yaml:2:14: error[unknown-entity] Entity 'stauts' not found" in proc.stdout
    assert lines[-1] == (
        f"Found 5 errors, 3 warnings, 2 notes in the store yaml:{broken / 'store'} and 2 files."
    )
    findings = json_findings(run("check", "--storage", "store", "repo", "--format", "json", cwd=broken))
    assert len(lines) - 1 == len(findings)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["text", "json", "github", "sarif"])
def test_exit_codes_per_format(broken, clean, fmt):
    assert run("check", "--storage", "store", "--format", fmt, cwd=broken).returncode == 1
    assert run("check", "--storage", "store", "--format", fmt, cwd=clean).returncode == 0
    missing = run("check", "--storage", "store", "nope.query.yaml", "--format", fmt, cwd=clean)
    assert missing.returncode == 2 and "nope.query.yaml: no such file or directory" in missing.stderr
    assert missing.stdout == ""


def test_usage_errors_exit_2(clean, tmp_path):
    assert run("check", "--storage", "store", "--format", "xml", cwd=clean).returncode == 2
    assert run("check", "--storage", "store", "--fail-on", "information", cwd=clean).returncode == 2
    gone = run("check", "--storage", str(tmp_path / "missing"), cwd=clean)
    assert gone.returncode == 2 and "cannot check the store" in gone.stderr
    (tmp_path / "data.bin").write_bytes(b"\x00")
    odd = run("check", "--storage", "store", str(tmp_path / "data.bin"), cwd=clean)
    assert odd.returncode == 2 and "not a query file" in odd.stderr


# --------------------------------------------------------------------------- formats


def test_json_shape(broken):
    findings = json_findings(run("check", "--storage", "store", "repo", "--format", "json", cwd=broken))
    assert findings
    for f in findings:
        assert list(f) == ["path", "range", "severity", "code", "message", "source"]
        start, end = f["range"]["start"], f["range"]["end"]
        assert start["line"] >= 1 and start["column"] >= 1
        assert (end["line"], end["column"]) >= (start["line"], start["column"])
        assert f["code"] in all_codes() and f["severity"] in ("error", "warning", "information", "hint")


def test_github_escaping_units():
    assert ck.escape_data("100% sure\r\nnext") == "100%25 sure%0D%0Anext"
    assert ck.escape_property("a:b,c%d\ne") == "a%3Ab%2Cc%25d%0Ae"
    report = ck.Report(
        [
            ck.Result(
                "dir,x/a:b.yaml", 3, 2, 3, 7, "information", "hidden-tag", "50%\nof it: ok, yes", "slayer"
            )
        ],
        "yaml:/s",
        1,
    )
    assert ck.format_github(report) == (
        "::notice file=dir%2Cx/a%3Ab.yaml,line=3,col=2,endLine=3,endColumn=7,"
        "title=slayer-lsp (hidden-tag)::50%25%0Aof it: ok, yes\n"
    )


def test_github_format(broken):
    """A real run: a path with ``,`` ``:`` and ``%`` and a message with ``%`` come out escaped."""
    weird = broken / "repo" / "memories" / "a,b:c%.md"
    weird.parent.mkdir(exist_ok=True)
    weird.write_text("---\nentities:\n- jaffle.orders.x%y\n---\nA learning.\n", encoding="utf-8")
    try:
        proc = run(
            "check", "--storage", "store", str(weird.relative_to(broken)), "--format", "github", cwd=broken
        )
    finally:
        weird.unlink()
    assert proc.returncode == 1  # the store's own errors
    lines = proc.stdout.splitlines()
    command = re.compile(
        r"^::(error|warning|notice) file=([^,:]*),line=(\d+),col=(\d+),endLine=(\d+),"
        r"endColumn=(\d+),title=slayer-lsp \(([a-z-]+)\)::(.*)$"
    )
    assert all(command.match(line) for line in lines), lines
    mine = [m for m in map(command.match, lines) if "memories/a" in m.group(2)]
    assert len(mine) == 1
    m = mine[0]
    assert m.group(2) == "repo/memories/a%2Cb%3Ac%25.md"
    assert (m.group(1), m.group(3), m.group(4), m.group(5), m.group(6), m.group(7)) == (
        "warning",
        "3",
        "3",
        "3",
        "20",
        "stale-tag",
    )
    assert m.group(8).startswith("stale tag 'jaffle.orders.x%25y': ")
    assert "%" not in m.group(8).replace("%25", "")
    assert "Found " in proc.stderr and "Found " not in proc.stdout  # the summary goes to the log
    assert {c.group(1) for c in map(command.match, lines)} == {"error", "warning", "notice"}


def validate_sarif(log: dict) -> None:
    """The structure SARIF 2.1.0 requires of what we emit (the official schema is not available
    offline): version, runs, tool.driver with rules, results pointing at rules and regions."""
    assert log["version"] == "2.1.0" and log["$schema"].endswith("sarif-2.1.0.json")
    assert isinstance(log["runs"], list) and len(log["runs"]) == 1
    run_ = log["runs"][0]
    driver = run_["tool"]["driver"]
    assert isinstance(driver["name"], str) and driver["name"]
    rules = driver["rules"]
    ids = [r["id"] for r in rules]
    assert len(ids) == len(set(ids))
    for r in rules:
        assert r["shortDescription"]["text"] and r["defaultConfiguration"]["level"] in (
            "error",
            "warning",
            "note",
        )
    assert run_["columnKind"] in ("utf16CodeUnits", "unicodeCodePoints")
    bases = run_.get("originalUriBaseIds", {})
    for base in bases.values():
        assert base["uri"].endswith("/")
    for res in run_["results"]:
        assert res["ruleId"] in ids and ids[res["ruleIndex"]] == res["ruleId"]
        assert res["level"] in ("none", "note", "warning", "error")
        assert isinstance(res["message"]["text"], str) and res["message"]["text"]
        (loc,) = res["locations"]
        art = loc["physicalLocation"]["artifactLocation"]
        assert isinstance(art["uri"], str) and art["uri"]
        if "uriBaseId" in art:
            assert art["uriBaseId"] in bases and not art["uri"].startswith("/")
        region = loc["physicalLocation"]["region"]
        assert all(
            isinstance(region[k], int) and region[k] >= 1
            for k in ("startLine", "startColumn", "endLine", "endColumn")
        )
        assert (region["endLine"], region["endColumn"]) >= (region["startLine"], region["startColumn"])


def test_sarif(broken):
    proc = run("check", "--storage", "store", "repo", "--format", "sarif", cwd=broken)
    assert proc.returncode == 1
    log = json.loads(proc.stdout)
    validate_sarif(log)
    run_ = log["runs"][0]
    assert [r["id"] for r in run_["tool"]["driver"]["rules"]] == list(all_codes())
    findings = json_findings(run("check", "--storage", "store", "repo", "--format", "json", cwd=broken))
    level = {"error": "error", "warning": "warning", "information": "note", "hint": "note"}
    as_sarif = [
        (
            r["ruleId"],
            r["level"],
            r["message"]["text"],
            r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"],
            r["locations"][0]["physicalLocation"]["region"]["startLine"],
        )
        for r in run_["results"]
    ]
    assert as_sarif == [
        (f["code"], level[f["severity"]], f["message"], f["path"], f["range"]["start"]["line"])
        for f in findings
    ]
    assert run_["originalUriBaseIds"]["SRCROOT"]["uri"] == broken.resolve().as_uri() + "/"


def test_codes_table():
    """Store codes do not shadow document codes; the README documents every code."""
    assert not set(STORE_CODES) & set(diag.CODES)
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    for code, (severity, _meaning) in all_codes().items():
        assert f"| `{code}` | {severity} |" in readme, code


# --------------------------------------------------------------------------- same as the editor


def test_cli_uses_the_servers_diagnostics(broken):
    """In process: what the check prints for a file is ``diagnostics.diagnose`` of its parse."""
    from slayer_lsp.analysis import parsed_file as dm
    from slayer_lsp.catalog import load_catalog

    path = broken / "repo" / "queries" / "bad.yaml"
    catalog = load_catalog(broken / "store")
    direct = diag.diagnose(dm.parse_document(path.read_text(), "query", str(path)), catalog)
    report = ck.run_check([str(path)], str(broken / "store"), cwd=str(broken))
    mine = [
        (r.line - 1, r.column - 1, r.end_column - 1, r.severity, r.code, r.message)
        for r in report.results
        if r.source == "slayer"
    ]
    assert mine == [(x.span.line, x.span.start, x.span.end, x.severity, x.code, x.message) for x in direct]


EDITOR_QUERY = """source_model: orders
# a comment with 😀 so that UTF-16 and code-point columns differ
filters: ["status = '😀' and stauts = 1"]
dimensions: [customers.email, stores.nmae]
limt: 5
"""


@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="function")
async def test_cli_and_editor_agree(broken, tmp_path):
    """The language server publishes, for the same files, exactly what the check prints (converted
    from the client's UTF-16 positions to 1-based code points)."""
    from lsprotocol import types as t

    from tests.lsp.support import diagnostics, open_doc, start_client, stop_client

    store = broken / "store"
    query = tmp_path / "editor.query.yaml"
    query.write_text(EDITOR_QUERY, encoding="utf-8")
    memory = store / "memories" / "5.md"
    files = [query, memory]
    client = await start_client(
        store, "visual-studio-code", {"diagnostics": {"debounceMs": 0}, "embedding": {"enable": False}}
    )
    try:
        editor: list[tuple] = []
        for f in files:
            text = f.read_text(encoding="utf-8")
            uri = f.resolve().as_uri()
            open_doc(client, uri, text, "markdown" if f.suffix == ".md" else "yaml")
            lines = text.split("\n")

            def cp(pos: t.Position, lines=lines) -> int:  # UTF-16 units -> code points
                line = lines[pos.line]
                units = 0
                for i, ch in enumerate(line):
                    if units >= pos.character:
                        return i
                    units += 2 if ord(ch) > 0xFFFF else 1
                return len(line)

            for d in await diagnostics(client, uri):
                sev = {1: "error", 2: "warning", 3: "information", 4: "hint"}[int(d.severity)]
                editor.append(
                    (
                        os.path.abspath(f),
                        d.range.start.line + 1,
                        cp(d.range.start) + 1,
                        d.range.end.line + 1,
                        cp(d.range.end) + 1,
                        sev,
                        str(d.code),
                        d.message,
                        d.source,
                    )
                )
    finally:
        await stop_client(client)
    report = ck.run_check([str(f) for f in files], str(store), cwd=str(tmp_path / "elsewhere"))
    cli = [
        (r.path, r.line, r.column, r.end_line, r.end_column, r.severity, r.code, r.message, r.source)
        for r in report.results
        if r.source == "slayer"
    ]
    assert sorted(editor) == sorted(cli)
    codes = {row[6] for row in cli}
    assert {"unknown-entity", "hidden-entity", "unknown-query-field", "stale-tag"} <= codes
    emoji_line = [row for row in cli if row[1] == 3]
    assert emoji_line and emoji_line[0][2] == EDITOR_QUERY.split("\n")[2].index("stauts") + 1
