"""A read that says which documents it touched since the read before is derived into exactly the
snapshot a comparison of every document gives (the hint only spares that comparison).

Each case edits a store the way a writer could (several documents at once included), then derives
the next snapshot twice from the same one: with the read's hint, and with the hint taken away.
Documents (in order), entities, children, counts and the delta must be the same.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from slayer_lsp.catalog import Catalog
from slayer_lsp.store.reader import StoreRead, StoreReader
from tests.conftest import SQLITE_STORE, YAML_STORE
from tests.conftest import execute_sql as _sql

MEMORY = """---
created_at: '2026-12-01T10:00:00.000000Z'
entities:
- jaffle.orders
version: 4
---
{text}"""


def _column(name: str) -> str:
    return f"- name: {name}\n  sql: {name}\n  type: TEXT\n"


def _yaml_edit_model(root: Path) -> list[Path]:
    path = root / "models/jaffle/orders.yaml"
    path.write_text(path.read_text().replace("columns:\n", "columns:\n" + _column("zeb_hint"), 1))
    return [path]


def _yaml_add_memory(root: Path) -> list[Path]:
    path = root / "memories/50.md"
    path.write_text(MEMORY.format(text="Orders placed before noon ship the same day."))
    return [path]


def _yaml_remove_memory(root: Path) -> list[Path]:
    path = root / "memories/12.md"
    path.unlink()
    return [path]


def _yaml_several(root: Path) -> list[Path]:
    changed = [*_yaml_edit_model(root), *_yaml_add_memory(root)]
    for name in ("customers", "stores"):  # two more models, listed apart
        path = root / f"models/jaffle/{name}.yaml"
        path.write_text(path.read_text().replace("columns:\n", "columns:\n" + _column(f"{name}_hint"), 1))
        changed.append(path)
    memory = root / "memories/3.md"
    memory.write_text(memory.read_text().replace("Chicago", "Chicago (hinted)"))
    (root / "memories/11.md").unlink()
    return [*changed, memory, root / "memories/11.md"]


def _yaml_unchanged_bytes(root: Path) -> list[Path]:
    path = root / "memories/3.md"
    path.write_text(path.read_text())
    return [path]


YAML_CASES: dict[str, Callable[[Path], list[Path]]] = {
    "edit a model": _yaml_edit_model,
    "add a memory": _yaml_add_memory,
    "remove a memory": _yaml_remove_memory,
    "several documents at once": _yaml_several,
    "rewrite a file as it was": _yaml_unchanged_bytes,
}


def _model_row(db: Path, name: str) -> tuple[str, dict]:
    conn = sqlite3.connect(db)
    ds, data = conn.execute("SELECT data_source, data FROM models WHERE name = ?", (name,)).fetchone()
    conn.close()
    return ds, json.loads(data)


def _sqlite_add_column(db: Path, name: str) -> tuple[str, tuple]:
    ds, model = _model_row(db, name)
    model["columns"].insert(0, {**model["columns"][0], "name": f"{name}_hint", "primary_key": False})
    return "UPDATE models SET data = ? WHERE data_source = ? AND name = ?", (json.dumps(model), ds, name)


def _sqlite_memory(mid: str, text: str) -> tuple[str, tuple]:
    data = {
        "version": 4,
        "id": mid,
        "learning": text,
        "description": None,
        "entities": ["jaffle.orders"],
        "query": None,
        "created_at": "2026-12-01T10:00:00.000000Z",
    }
    return "INSERT INTO memories (id, data) VALUES (?, ?)", (mid, json.dumps(data))


SQLITE_CASES: dict[str, Callable[[Path], None]] = {
    "edit a model": lambda db: _sql(db, _sqlite_add_column(db, "orders")),
    "add a memory": lambda db: _sql(db, _sqlite_memory("50", "Orders placed before noon ship the same day.")),
    "remove a memory": lambda db: _sql(db, ("DELETE FROM memories WHERE id = ?", ("12",))),
    "several rows at once": lambda db: _sql(
        db,
        _sqlite_add_column(db, "orders"),
        _sqlite_add_column(db, "customers"),
        _sqlite_add_column(db, "stores"),
        _sqlite_memory("50", "Orders placed before noon ship the same day."),
        _sqlite_memory("500", "Refunds post the next business day."),
        ("DELETE FROM memories WHERE id = ?", ("11",)),
        ("DELETE FROM memories WHERE id = ?", ("2",)),
    ),
    "a row becomes broken JSON": lambda db: _sql(
        db, ("UPDATE memories SET data = ? WHERE id = ?", ('{"version": 4, "id": "3", "learn', "3"))
    ),
}


def _both_ways(catalog: Catalog, read: StoreRead) -> None:
    hinted, hinted_delta = catalog.derive(read)
    full, full_delta = catalog.derive(dataclasses.replace(read, since=None, touched=frozenset()))
    assert list(hinted.docs) == list(full.docs)  # the order too: where each document sits
    assert dict(hinted.entities) == dict(full.entities)
    assert dict(hinted.children_of) == dict(full.children_of)
    assert dict(hinted.models_by_name) == dict(full.models_by_name)
    assert hinted.memory_order == full.memory_order
    assert hinted.counts() == full.counts()
    assert hinted.document_issue_count() == full.document_issue_count()
    assert hinted.load_issues == full.load_issues
    assert hinted_delta == full_delta


def _yaml_read(tmp_path: Path, case: str) -> tuple[Catalog, StoreRead]:
    root = tmp_path / "store"
    shutil.copytree(YAML_STORE, root)
    reader = StoreReader(root)
    catalog = Catalog.from_read(reader.read())
    changed = YAML_CASES[case](root)
    return catalog, reader.read(changed=[str(p) for p in changed])


def _sqlite_read(tmp_path: Path, case: str) -> tuple[Catalog, StoreRead]:
    db = tmp_path / "store.db"
    shutil.copy(SQLITE_STORE, db)
    reader = StoreReader(db)
    catalog = Catalog.from_read(reader.read())
    SQLITE_CASES[case](db)
    return catalog, reader.read()


@pytest.mark.parametrize(
    ("read", "case"),
    [(_yaml_read, c) for c in YAML_CASES] + [(_sqlite_read, c) for c in SQLITE_CASES],
    ids=[f"yaml: {c}" for c in YAML_CASES] + [f"sqlite: {c}" for c in SQLITE_CASES],
)
def test_a_hinted_read_derives_the_snapshot_a_full_comparison_does(tmp_path, read, case):
    catalog, after = read(tmp_path, case)
    assert after.since is not None  # the reader says what it touched (the edited-paths way for YAML)
    _both_ways(catalog, after)


def test_a_hint_is_used_only_after_the_read_it_names(tmp_path):
    # a snapshot derived from another read than the one a hint follows (a read that was never
    # derived, say) compares every document: the hint would miss what that read changed
    root = tmp_path / "store"
    shutil.copytree(YAML_STORE, root)
    reader = StoreReader(root)
    catalog = Catalog.from_read(reader.read())
    skipped = reader.read(changed=[str(p) for p in _yaml_edit_model(root)])  # never derived
    memory = _yaml_add_memory(root)
    read = reader.read(changed=[str(p) for p in memory])
    assert read.since is skipped.docs
    nxt, delta = catalog.derive(read)
    assert "jaffle.orders.zeb_hint" in nxt.entities  # the skipped read's edit is there all the same
    assert "jaffle.orders.zeb_hint" in delta.added and "memory:50" in delta.added
