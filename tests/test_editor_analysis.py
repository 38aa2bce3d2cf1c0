"""Rename plans, impact, signature help, inlay hints and the file schemas at the analysis level (plain
data, no LSP), and ``slayer-lsp check --impact`` / ``slayer-lsp schema`` as subprocesses."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from slayer_lsp.analysis import diagnostics as diag
from slayer_lsp.analysis import parsed_file as dm
from slayer_lsp.analysis import rename as rn
from slayer_lsp.analysis.impact import ImpactError, impact
from slayer_lsp.analysis.inlay import inlay_hints
from slayer_lsp.analysis.schemas import schema
from slayer_lsp.analysis.signature import open_call, signature_at
from slayer_lsp.analysis.workspace import WorkspaceDoc, workspace_documents
from slayer_lsp.catalog import load_catalog
from slayer_lsp.writer import memories as writer
from slayer_lsp.writer import renames

from .conftest import FIXTURES

REPO = Path(__file__).resolve().parents[1]
QUERY = (
    "source_model: orders\ndimensions:\n- stores.name\n- {name: city, model: stores}\n"
    "measures: [sum(order_total), avg_nonzero(tax_paid)]\nfilters: [\"status = 'completed'\"]\n"
)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    dst = tmp_path_factory.mktemp("ed") / "store"
    shutil.copytree(FIXTURES / "store-yaml", dst, copy_function=shutil.copyfile)
    for p in [dst, *dst.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    return dst


@pytest.fixture(scope="module")
def catalog(store):
    return load_catalog(store)


@pytest.fixture(scope="module")
def docs():
    return [
        WorkspaceDoc(
            "file:///ws/a.query.yaml", None, dm.parse_document(QUERY, "query", "/ws/a.query.yaml"), True
        )
    ]


# --------------------------------------------------------------------------- rename

RENAMES = [
    # entity, new name, the query after the rename, edited store files (relative), renamed files
    (
        "jaffle.stores",
        "shops",
        QUERY.replace("stores", "shops"),
        {
            "models/jaffle/orders.yaml",
            "models/jaffle/stores.yaml",
            "memories/3.md",
            "memories/6.md",
            "memories/11.md",
        },
        [("models/jaffle/stores.yaml", "models/jaffle/shops.yaml")],
    ),
    (
        "jaffle.orders.status",
        "state",
        QUERY.replace("status =", "state ="),
        {"models/jaffle/orders.yaml", "memories/2.md", "memories/6.md"},
        [],
    ),
    (
        "jaffle.orders.order_total",
        "grand_total",
        QUERY.replace("order_total", "grand_total"),
        {"models/jaffle/orders.yaml", "memories/1.md"},
        [],
    ),
    (
        "jaffle.orders.avg_nonzero",
        "avg_nz",
        QUERY.replace("avg_nonzero", "avg_nz"),
        {"models/jaffle/orders.yaml", "memories/12.md"},
        [],
    ),
]


@pytest.mark.parametrize("entity, new, after, store_files, renames", RENAMES, ids=[r[0] for r in RENAMES])
def test_rename_plan(store, catalog, docs, entity, new, after, store_files, renames):
    plan = rn.plan_rename(catalog, entity, new, docs)
    by_key = {f.key: f.edits for f in plan.files}
    assert rn.apply_edits(QUERY, by_key.pop("file:///ws/a.query.yaml")) == after
    assert {os.path.relpath(k, store) for k in by_key} == store_files
    assert [(os.path.relpath(r.old, store), os.path.relpath(r.new, store)) for r in plan.renames] == renames
    for key, edits in by_key.items():  # no memory keeps a tag of the old id
        text = rn.apply_edits(Path(key).read_text(), edits)
        if key.endswith(".md"):
            assert f"- {entity}\n" not in text and f"- {entity}." not in text
            assert plan.new_entity in text


def test_rename_a_datasource_edits_models_priority_and_tags(store, catalog):
    plan = rn.plan_rename(catalog, "jaffle", "jf", [])
    keys = {os.path.relpath(f.key, store) for f in plan.files}
    assert {"datasources/jaffle.yaml", "priority.yaml", "models/jaffle/orders.yaml", "memories/6.md"} <= keys
    orders = next(f for f in plan.files if f.key.endswith("models/jaffle/orders.yaml"))
    assert "data_source: jf\n" in rn.apply_edits(
        (store / "models/jaffle/orders.yaml").read_text(), orders.edits
    )
    assert (os.path.relpath(plan.renames[-1].old, store), os.path.relpath(plan.renames[-1].new, store)) == (
        "models/jaffle",
        "models/jf",
    )


@pytest.mark.parametrize(
    "entity, new, message",
    [
        ("jaffle.stores", "orders", "already exists"),
        ("jaffle.orders.status", "subtotal", "already exists"),
        ("jaffle.orders.status", "1x", "not a valid name"),
        ("jaffle.orders.status", "a.b", "not a valid name"),
        ("jaffle.orders.status", "status", "already called"),
        ("jaffle.orders.status", "and", "keyword"),
        ("jaffle.orders.avg_nonzero", "sum", "built-in aggregation"),
        ("jaffle", "supplies", "already exists"),
        ("jaffle.nope", "x", "not a canonical id"),
        ("memory:1", "x", "is a memory"),
    ],
)
def test_rename_refused(catalog, docs, entity, new, message):
    with pytest.raises(rn.RenameError, match=message):
        rn.plan_rename(catalog, entity, new, docs)


@pytest.fixture()
def sqlite_copy(tmp_path):
    dst = tmp_path / "store.db"
    shutil.copyfile(FIXTURES / "store.db", dst)
    dst.chmod(0o644)
    return dst


def _rows(db, table):
    conn = sqlite3.connect(db)
    try:
        key = "data_source || '.' || name" if table == "models" else "id"
        return dict(conn.execute(f"SELECT {key}, data FROM {table}").fetchall())
    finally:
        conn.close()


SQLITE_RENAMES = [
    # entity, new name, the query after the rename, model rows rewritten (before -> after), memory rows
    (
        "jaffle.stores",
        "shops",
        QUERY.replace("stores", "shops"),
        {("jaffle", "orders"): ("jaffle", "orders"), ("jaffle", "stores"): ("jaffle", "shops")},
        {"3", "6", "11"},
    ),
    (
        "jaffle.orders.status",
        "state",
        QUERY.replace("status =", "state ="),
        {("jaffle", "orders"): ("jaffle", "orders")},
        {"2", "6"},
    ),
    (
        "jaffle.orders.avg_nonzero",
        "avg_nz",
        QUERY.replace("avg_nonzero", "avg_nz"),
        {("jaffle", "orders"): ("jaffle", "orders")},
        {"12"},
    ),
]


@pytest.mark.parametrize(
    "entity, new, after, models, memories", SQLITE_RENAMES, ids=[r[0] for r in SQLITE_RENAMES]
)
def test_rename_in_a_sqlite_store_rewrites_rows_in_one_transaction(
    sqlite_copy, docs, entity, new, after, models, memories
):
    """The same rename as in the YAML store: the workspace file's edits, and the rows the store rewrites,
    which the catalog then reads with the new name everywhere and the old one nowhere."""
    plan = rn.plan_rename(load_catalog(sqlite_copy), entity, new, docs)
    (only,) = plan.files
    assert rn.apply_edits(QUERY, only.edits) == after and plan.renames == ()
    assert {r.key: r.new_key for r in plan.store.rows if r.table == "models"} == models
    assert {r.key[0] for r in plan.store.rows if r.table == "memories"} == memories
    untouched = {k: v for k, v in _rows(sqlite_copy, "memories").items() if k not in memories}
    renames.rename_rows(sqlite_copy, plan.store.rows, [entity])
    assert {k: v for k, v in _rows(sqlite_copy, "memories").items() if k not in memories} == untouched
    cat = load_catalog(sqlite_copy)
    assert cat.fatal is None and cat.kind_of(plan.new_entity) is not None and entity not in cat
    for mid in memories:
        mem = cat.memory(mid)
        assert not any(t == entity or t.startswith(entity + ".") for t in mem.entities), mem.entities
    conn = sqlite3.connect(sqlite_copy)
    tags = {e for (e,) in conn.execute("SELECT entity FROM memory_entities")}
    assert not any(t == entity or t.startswith(entity + ".") for t in tags)
    assert (
        conn.execute(
            "SELECT COUNT(*) FROM embeddings WHERE canonical_id = ? OR canonical_id LIKE ?",
            (entity, entity + ".%"),
        ).fetchone()[0]
        == 0
    )
    conn.close()


def test_sqlite_rename_rows_are_rewritten_all_or_none(sqlite_copy):
    """A row changed after planning refuses the whole write: no row of the plan is written."""
    plan = rn.plan_rename(load_catalog(sqlite_copy), "jaffle.stores", "shops", [])
    before = (_rows(sqlite_copy, "models"), _rows(sqlite_copy, "memories"))
    conn = sqlite3.connect(sqlite_copy)
    conn.execute("UPDATE memories SET data = replace(data, 'per store', 'per shop') WHERE id = '6'")
    conn.commit()
    conn.close()
    changed = (before[0], {**before[1], "6": before[1]["6"].replace("per store", "per shop")})
    with pytest.raises(writer.MemoryWriteError, match="changed since the rename was planned"):
        renames.rename_rows(sqlite_copy, plan.store.rows, ["jaffle.stores"])
    assert (_rows(sqlite_copy, "models"), _rows(sqlite_copy, "memories")) == changed
    taken = [r for r in plan.store.rows if r.key != r.new_key]
    conn = sqlite3.connect(sqlite_copy)
    conn.execute("INSERT INTO models (data_source, name, data) VALUES ('jaffle', 'shops', '{}')")
    conn.commit()
    conn.close()
    with pytest.raises(writer.MemoryWriteError, match="already exists"):
        renames.rename_rows(sqlite_copy, taken, ["jaffle.stores"])
    assert _rows(sqlite_copy, "models")["jaffle.stores"] == before[0]["jaffle.stores"]


def test_rename_refused_in_a_sqlite_store(sqlite_copy):
    catalog = load_catalog(sqlite_copy)
    with pytest.raises(rn.RenameError, match="datasource 'jaffle' of a SQLite store"):
        rn.plan_rename(catalog, "jaffle", "jf", [])
    with pytest.raises(rn.RenameError, match="already exists"):
        rn.plan_rename(catalog, "jaffle.orders.status", "subtotal", [])
    conn = sqlite3.connect(sqlite_copy)
    conn.execute(
        "UPDATE models SET data = replace(data, '\"version\": 15, ', '\"version\":15, ') "
        "WHERE name = 'stores'"
    )
    conn.commit()
    conn.close()
    with pytest.raises(rn.RenameError, match="not in the form SLayer writes"):
        rn.plan_rename(catalog, "jaffle.orders.status", "state", [])


@pytest.mark.parametrize(
    "line, col, entity, name",
    [
        (2, 4, "jaffle.stores", "stores"),
        (2, 10, "jaffle.stores.name", "name"),
        (3, 25, "jaffle.stores", "stores"),  # {name, model}: the model's own span
        (3, 10, "jaffle.stores.city", "city"),
        (0, 15, "jaffle.orders", "orders"),
        (4, 33, "jaffle.orders.avg_nonzero", "avg_nonzero"),
    ],
)
def test_rename_target(catalog, docs, line, col, entity, name):
    target = rn.target_at(docs[0].doc, line, col, catalog)
    assert (target.entity, target.name) == (entity, name)
    assert QUERY.split("\n")[line][target.span.start : target.span.end] == name


# --------------------------------------------------------------------------- impact

IMPACTS = [
    ("jaffle.orders.order_total", {"measure": 1, "memory": 3, "query": 1}),
    ("jaffle.orders.store_id", {"memory": 1, "join": 1, "query": 1}),
    ("jaffle.orders.discount_code", {}),
]


@pytest.mark.parametrize("entity, counts", IMPACTS, ids=[i[0] for i in IMPACTS])
def test_impact_counts(catalog, docs, entity, counts):
    assert impact(catalog, entity, docs).counts() == counts


def test_impact_is_transitive_through_measures_with_locations(catalog, docs):
    found = impact(catalog, "jaffle.orders.order_total", docs)
    via = [u for u in found.uses if u.via == ("jaffle.orders.total_revenue",)]
    assert {u.name for u in via} >= {"memory:2", "memory:kb.revenue"}
    measure = next(u for u in found.uses if u.kind == "measure")
    assert measure.location.path.endswith("orders.yaml") and measure.location.span.line > 0
    assert found.summary() == "1 query · 3 memories · 1 measure"


def test_impact_of_a_model_leaves_out_its_own_parts(catalog):
    found = impact(catalog, "jaffle.orders", [])
    assert not any(u.kind == "measure" and u.name.startswith("jaffle.orders.") for u in found.uses)
    assert any(u.kind == "join" and u.name.startswith("jaffle.order_items") for u in found.uses)


def test_impact_unknown_entity(catalog):
    with pytest.raises(ImpactError):
        impact(catalog, "jaffle.orders.nope")


def test_workspace_documents_walks_patterns_and_prefers_open_text(tmp_path):
    (tmp_path / "queries").mkdir()
    (tmp_path / "queries" / "a.yaml").write_text("source_model: orders\n")
    (tmp_path / "b.query.json").write_text('{"source_model": "stores"}')
    (tmp_path / "notes.yaml").write_text("x: 1\n")
    open_doc = dm.parse_document("source_model: customers\n", "query", str(tmp_path / "queries" / "a.yaml"))
    found = workspace_documents(
        [tmp_path],
        {"file:///a": (str(tmp_path / "queries" / "a.yaml"), open_doc)},
        ["**/*.query.{yaml,yml,json}", "**/queries/**/*.{yaml,yml,json}"],
        ["**/memories/*.md"],
    )
    assert sorted((d.is_open, d.doc.stages[0].source_model) for d in found) == [
        (False, "stores"),
        (True, "customers"),
    ]


# --------------------------------------------------------------------------- signature help and inlay hints


@pytest.mark.parametrize(
    "text, expected",
    [
        ("sum(", ("sum", 0)),
        ("weighted_avg(amount, ", ("weighted_avg", 1)),
        ("percentile(x, p=", ("percentile", 1)),
        ("sum(a) + avg(", ("avg", 0)),
        ("sum(a)", None),
        ("coalesce(sum(x), ", ("coalesce", 1)),
        ("f('a,b', ", ("f", 1)),
    ],
)
def test_open_call(text, expected):
    assert open_call(text) == expected


@pytest.mark.parametrize(
    "line_text, label, active",
    [
        ("- weighted_avg(subtotal, ", "weighted_avg(value, weight)", 1),
        ("- percentile(subtotal, p=", "percentile(value, p)", 1),
        ("- sum(", "sum(value)", 0),
        ("- avg_nonzero(", "avg_nonzero(value)", 0),
    ],
)
def test_signature_at(catalog, line_text, label, active):
    text = f"source_model: orders\nmeasures:\n{line_text}\n"
    doc = dm.parse_document(text, "query", "/ws/s.query.yaml")
    got = signature_at(doc, 2, len(line_text), catalog)
    assert (got.label, got.active_parameter) == (label, active)


def test_no_signature_outside_formulas(catalog):
    doc = dm.parse_document("source_model: orders\nname: sum(\n", "query", "/ws/s.query.yaml")
    assert signature_at(doc, 1, 10, catalog) is None


def test_inlay_hints(catalog, docs):
    hints = {(h.line, h.label) for h in inlay_hints(docs[0].doc, catalog)}
    assert (2, "→ jaffle.stores.name") in hints and (5, "→ jaffle.orders.status") in hints
    assert inlay_hints(docs[0].doc, catalog, 5, 5) and all(
        h.line == 5 for h in inlay_hints(docs[0].doc, catalog, 5, 5)
    )


# --------------------------------------------------------------------------- schemas agree with the diagnostics

SCHEMA_CASES = [
    ({"source_model": "orders", "measures": ["sum(subtotal)"]}, True),
    ({"source_model": "orders", "dimensions": "status"}, True),  # one entry where a list goes: coerced
    ({"source_model": "orders", "limit": 10, "offset": 0, "whole_periods_only": True}, True),
    ([{"name": "s1", "source_model": "orders"}, {"source_model": "s1"}], True),
    ({"source_model": "orders", "mesures": ["sum(subtotal)"]}, False),
    ({"source_model": "orders", "limits": 3}, False),
    ([{"source_model": "orders", "colour": "red"}], False),
]


@pytest.mark.parametrize("query, valid", SCHEMA_CASES)
def test_query_schema_agrees_with_diagnostics(catalog, query, valid):
    ok = jsonschema.Draft7Validator(schema("query")).is_valid(query)
    doc = dm.parse_document(json.dumps(query), "query", "/ws/q.query.json")
    refused = {d.code for d in diag.diagnose(doc, catalog)} & {"unknown-query-field", "invalid-json"}
    assert ok == valid == (not refused)


def test_memory_schema_accepts_the_fixture_memories():
    import yaml

    validator = jsonschema.Draft7Validator(schema("memory"))
    for path in sorted((FIXTURES / "store-yaml" / "memories").glob("*.md")):
        front = yaml.safe_load(path.read_text().split("---\n")[1])
        assert validator.is_valid(front), path.name
    assert not validator.is_valid({"entities": "jaffle.orders"})


# --------------------------------------------------------------------------- CLI


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "slayer_lsp", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["text", "json", "github", "sarif"])
def test_check_impact_every_format(store, tmp_path, fmt):
    (tmp_path / "queries").mkdir()
    (tmp_path / "queries" / "a.yaml").write_text("source_model: orders\ndimensions: [stores.name]\n")
    proc = _run(
        "check",
        "queries",
        "--storage",
        str(store),
        "--format",
        fmt,
        "--impact",
        "jaffle.orders.store_id",
        cwd=tmp_path,
    )
    assert proc.returncode == 1, proc.stderr
    out = proc.stdout
    if fmt == "text":
        assert "queries/a.yaml:1:" not in out and "queries/a.yaml:2:" in out and "error[would-break]" in out
        assert "the join jaffle.orders → stores uses jaffle.orders.store_id" in out
    elif fmt == "json":
        items = json.loads(out)
        assert {i["code"] for i in items} == {"would-break"} and any(
            i["path"] == "queries/a.yaml" for i in items
        )
    elif fmt == "github":
        assert out.startswith("::error file=") and "would-break" in out
    else:
        run = json.loads(out)["runs"][0]
        assert run["results"] and all(r["ruleId"] == "would-break" for r in run["results"])
        assert "ruleIndex" in run["results"][0]


@pytest.mark.slow
def test_check_impact_exit_codes(store, tmp_path):
    assert (
        _run(
            "check", "--storage", str(store), "--impact", "jaffle.orders.discount_code", cwd=tmp_path
        ).returncode
        == 0
    )
    bad = _run("check", "--storage", str(store), "--impact", "jaffle.orders.nope", cwd=tmp_path)
    assert bad.returncode == 2 and "not a canonical id" in bad.stderr


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["query", "memory"])
def test_schema_command_prints_the_shipped_schema(kind, tmp_path):
    proc = _run("schema", kind, cwd=tmp_path)
    assert proc.returncode == 0
    assert json.loads(proc.stdout) == json.loads(
        (REPO / "protocol" / "file-schemas" / f"{kind}-file.schema.json").read_text()
    )


def test_file_schemas_are_up_to_date():
    sys.path.insert(0, str(REPO / "protocol"))
    import generate

    for name, text in generate.render_file_schemas().items():
        assert (REPO / "protocol" / "file-schemas" / name).read_text(encoding="utf-8") == text, name
