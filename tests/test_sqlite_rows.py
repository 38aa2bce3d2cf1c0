"""A long-lived SQLite reader re-reads only the rows that changed, and answers exactly as a fresh one.

Each case changes the store the way a writer could (SLayer's in-place updates included), then
compares the long-lived reader's read with a fresh reader's, document by document and issue by
issue, and checks how much the long-lived one fetched.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from slayer_lsp.store import sqlite_rows
from slayer_lsp.store.locate import StoreLocation
from slayer_lsp.store.reader import SqliteReader, StoreRead
from tests.conftest import execute_sql as _sql

REPO = Path(__file__).resolve().parents[1]
SHOP = REPO / "examples" / "shop" / "store.db"


def _first(db: Path, table: str, column: str = "data") -> tuple[str, str]:
    key = "id" if table == "memories" else "name"
    conn = sqlite3.connect(db)
    row = conn.execute(f"SELECT {key}, {column} FROM {table} ORDER BY {key} LIMIT 1").fetchone()
    conn.close()
    return row


def edit_memory_same_length(db: Path) -> None:
    """An UPDATE in place that keeps the length: no size or rowid would tell."""
    mid, text = _first(db, "memories")
    data = json.loads(text)
    data["learning"] = data["learning"][::-1]
    _sql(db, ("UPDATE memories SET data = ? WHERE id = ?", (json.dumps(data), mid)))


def add_memory(db: Path) -> None:
    mid, text = _first(db, "memories")
    data = json.loads(text)
    data["id"], data["learning"] = "aaa-first-in-order", "a note that sorts first"
    _sql(db, ("INSERT INTO memories (id, data) VALUES (?, ?)", (data["id"], json.dumps(data))))


def rename_memory(db: Path) -> None:
    """One key gone and another come in one write: the row count is unchanged, so only the keys
    tell that a row is new."""
    mid, _text = _first(db, "memories")
    _sql(db, ("UPDATE memories SET id = ? WHERE id = ?", ("zzz-renamed", mid)))


def edit_one_add_another(db: Path) -> None:
    """An edit in place and an insert in one write."""
    edit_memory_same_length(db)
    add_memory(db)


def drop_model(db: Path) -> None:
    _sql(db, ("DELETE FROM models WHERE rowid = (SELECT min(rowid) FROM models)", ()))


def replace_model(db: Path) -> None:
    """SLayer's INSERT OR REPLACE: the same key, a new row."""
    conn = sqlite3.connect(db)
    ds, name, text = conn.execute("SELECT data_source, name, data FROM models LIMIT 1").fetchone()
    conn.close()
    data = json.loads(text)
    data["description"] = "replaced through INSERT OR REPLACE"
    _sql(
        db,
        (
            "INSERT OR REPLACE INTO models (data_source, name, data) VALUES (?, ?, ?)",
            (ds, name, json.dumps(data)),
        ),
    )


def break_and_mend_datasource(db: Path) -> None:
    name, text = _first(db, "datasources")
    _sql(db, ("UPDATE datasources SET data = ? WHERE name = ?", ("{not json", name)))


def blob_data(db: Path) -> None:
    mid, text = _first(db, "memories")
    _sql(db, ("UPDATE memories SET data = ? WHERE id = ?", (text.encode(), mid)))


def null_key(db: Path) -> None:
    """A key that is not text: the row is named by its position, so its table is read whole."""
    mid, text = _first(db, "memories")
    _sql(db, ("UPDATE memories SET id = NULL WHERE id = ?", (mid,)))


def drop_null_key(db: Path) -> None:
    """The row whose key was not text goes again: only a whole read sees it go."""
    _sql(db, ("DELETE FROM memories WHERE id IS NULL", ()))


def priority(db: Path) -> None:
    _sql(
        db,
        ("INSERT OR REPLACE INTO settings (key, value) VALUES ('datasource_priority', ?)", ('["b", "a"]',)),
    )


def schema_without_keys(db: Path) -> None:
    """A table rebuilt without its primary key (and with a duplicated key): never mirrored."""
    _sql(
        db,
        ("CREATE TABLE memories2 (id TEXT, data TEXT)", ()),
        ("INSERT INTO memories2 SELECT id, data FROM memories", ()),
        ("INSERT INTO memories2 SELECT id, data FROM memories LIMIT 1", ()),
        ("DROP TABLE memories", ()),
        ("ALTER TABLE memories2 RENAME TO memories", ()),
    )


def file_replaced(db: Path) -> None:
    """Another store moved over this one (a new inode): compared by content, as any change."""
    other = db.with_name("other.db")
    shutil.copyfile(db, other)
    mid, text = _first(other, "memories")
    _sql(other, ("DELETE FROM memories WHERE id = ?", (mid,)))
    other.replace(db)


CASES: dict[str, tuple[Callable[[Path], None], int | None]] = {
    # change -> rows the long-lived reader fetches from the memories table (None: not checked)
    "edit_memory_same_length": (edit_memory_same_length, 1),
    "add_memory": (add_memory, 1),
    "rename_memory": (rename_memory, 1),
    "edit_one_add_another": (edit_one_add_another, 2),
    "drop_model": (drop_model, 0),
    "replace_model": (replace_model, 0),
    "break_datasource": (break_and_mend_datasource, 0),
    "blob_data": (blob_data, 1),
    "null_key": (null_key, None),
    "priority": (priority, 0),
    "schema_without_keys": (schema_without_keys, None),
    "file_replaced": (file_replaced, 0),
}


def _same(a: StoreRead, b: StoreRead) -> None:
    assert a.fatal == b.fatal
    assert list(a.docs) == list(b.docs)
    assert [d.digest for d in a.docs.values()] == [d.digest for d in b.docs.values()]
    assert [d.value for d in a.docs.values()] == [d.value for d in b.docs.values()]
    assert [str(i) for i in a.issues] == [str(i) for i in b.issues]


@pytest.mark.parametrize("case", list(CASES))
def test_incremental_read_equals_a_fresh_read(tmp_path, case, monkeypatch):
    db = tmp_path / "store.db"
    shutil.copyfile(SHOP, db)
    location = StoreLocation("sqlite", db)
    lived = SqliteReader(location)
    lived.read()
    fetched: list[sqlite_rows.RowsRead] = []
    read = sqlite_rows.RowMirror.read
    monkeypatch.setattr(sqlite_rows.RowMirror, "read", lambda self: fetched.append(read(self)) or fetched[-1])

    change, memory_rows = CASES[case]
    change(db)
    after = lived.read()
    memories = fetched[-1].tables["memories"]
    _same(after, SqliteReader(location).read())
    if memory_rows is not None:
        assert not memories.whole
        assert len(memories.rows) == memory_rows
    _same(lived.read(), SqliteReader(location).read())  # and nothing since: the answer holds
    lived.close()


def test_an_unchanged_store_fetches_no_document_row(tmp_path):
    db = tmp_path / "store.db"
    shutil.copyfile(SHOP, db)
    mirror = sqlite_rows.RowMirror(db)
    first = mirror.read()
    assert all(t.whole for t in first.tables.values())
    assert sum(len(t.rows) for t in first.tables.values()) > 10
    second = mirror.read()
    for name, table in second.tables.items():
        if name != sqlite_rows.SETTINGS.name:  # one row, always read whole
            assert (table.whole, table.rows, table.removed) == (False, [], []), name
    mirror.close()


def test_the_mirror_filled_in_the_background_holds_the_read_not_later_writes(tmp_path, monkeypatch):
    """A whole read leaves copying its rows into the mirror to a thread. A write that lands before
    that copy runs is still a change to the next read: the copy holds the rows the read returned."""
    db = tmp_path / "store.db"
    shutil.copyfile(SHOP, db)
    release = threading.Event()
    real_fill = sqlite_rows.RowMirror._fill
    monkeypatch.setattr(
        sqlite_rows.RowMirror, "_fill", lambda self, tables: release.wait(10) and real_fill(self, tables)
    )
    location = StoreLocation("sqlite", db)
    lived = SqliteReader(location)
    lived.read()
    edit_memory_same_length(db)  # before the mirror is filled
    release.set()
    fetched: list[sqlite_rows.RowsRead] = []
    read = sqlite_rows.RowMirror.read
    monkeypatch.setattr(sqlite_rows.RowMirror, "read", lambda self: fetched.append(read(self)) or fetched[-1])
    _same(lived.read(), SqliteReader(location).read())
    memories = fetched[0].tables["memories"]  # the long-lived reader's (then the fresh one's)
    assert not memories.whole and len(memories.rows) == 1  # an incremental read found the edit
    lived.close()


def test_a_sequence_of_changes_keeps_matching(tmp_path):
    db = tmp_path / "store.db"
    shutil.copyfile(SHOP, db)
    location = StoreLocation("sqlite", db)
    lived = SqliteReader(location)
    lived.read()
    for change in (
        add_memory,
        edit_memory_same_length,
        null_key,
        drop_null_key,
        drop_model,
        blob_data,
        replace_model,
        priority,
    ):
        change(db)
        _same(lived.read(), SqliteReader(location).read())
    lived.close()


def test_a_damaged_store_is_reported_and_the_next_good_read_is_whole(tmp_path):
    db = tmp_path / "store.db"
    shutil.copyfile(SHOP, db)
    good = db.read_bytes()
    location = StoreLocation("sqlite", db)
    lived = SqliteReader(location)
    first = lived.read()
    db.write_bytes(b"this is not a database\n" * 50)
    assert lived.read().fatal is not None
    db.write_bytes(good)
    _same(lived.read(), first)
