"""A SQLite store re-read skips exactly the commits this process made itself (``store/own_writes.py``):
never a commit of anyone else, whatever the order of the two."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from slayer_lsp.store import own_writes
from slayer_lsp.store.reader import StoreReader
from tests.conftest import SQLITE_STORE


@pytest.fixture(autouse=True)
def fresh_descriptors(monkeypatch: pytest.MonkeyPatch) -> None:
    """A test process opens hundreds of stores, a daemon one: past ``_MAX_FDS`` databases the
    counter is unknown by design, so each test here starts with the table empty (the descriptors
    already kept stay open, as they must)."""
    monkeypatch.setattr(own_writes, "_fds", {})
    monkeypatch.setattr(own_writes, "_kept", [])


@pytest.fixture
def store(tmp_path: Path) -> Path:
    copy = tmp_path / "store.db"
    shutil.copy(SQLITE_STORE, copy)
    return copy


def _our_vector_write(db: Path) -> None:
    """What the embedding worker does: one write transaction on the embeddings table, noted."""
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        before = own_writes.change_counter(db)
        conn.execute("DELETE FROM embeddings WHERE canonical_id = 'nothing.here'")
        conn.execute("INSERT OR REPLACE INTO settings (key, value) VALUES ('slayer_lsp_probe', '1')")
        conn.execute("COMMIT")
        own_writes.note_commit(db, before)
    finally:
        conn.close()


def _foreign_model_edit(db: Path, description: str) -> None:
    """What SLayer does to a model: an UPDATE in place (its sampling path), the same length or not."""
    conn = sqlite3.connect(db)
    try:
        with conn:
            ds, name, data = conn.execute(
                "SELECT data_source, name, data FROM models ORDER BY name"
            ).fetchone()
            doc = json.loads(data)
            doc["description"] = description
            conn.execute(
                "UPDATE models SET data = ? WHERE data_source = ? AND name = ?", (json.dumps(doc), ds, name)
            )
    finally:
        conn.close()


def _descriptions(read) -> dict[str, str | None]:  # noqa: ANN001
    return {
        k.name: getattr(doc.value, "description", None) for k, doc in read.docs.items() if k.kind == "model"
    }


def test_only_our_commits_is_no_read(store: Path) -> None:
    reader = StoreReader(store)
    first = reader.read()
    assert not first.unchanged
    assert not reader.read().unchanged  # no commit at all: a file event with none is read (a fault, a lock)
    _our_vector_write(store)
    _our_vector_write(store)
    again = reader.read()
    assert again.unchanged and again.docs == first.docs


@pytest.mark.parametrize("order", ["ours first", "theirs first"])
def test_a_foreign_commit_is_always_read(store: Path, order: str) -> None:
    reader = StoreReader(store)
    before = _descriptions(reader.read())
    if order == "ours first":
        _our_vector_write(store)
        _foreign_model_edit(store, "changed by someone else")
    else:
        _foreign_model_edit(store, "changed by someone else")
        _our_vector_write(store)
    read = reader.read()
    assert not read.unchanged
    after = _descriptions(read)
    assert "changed by someone else" in after.values() and after != before


def test_a_same_length_update_in_place_is_seen(store: Path) -> None:
    reader = StoreReader(store)
    _foreign_model_edit(store, "aaaa")
    assert "aaaa" in _descriptions(reader.read()).values()
    _foreign_model_edit(store, "bbbb")  # same length, same row: no row stamp would tell
    assert "bbbb" in _descriptions(reader.read()).values()


def test_a_file_cut_short_behind_sqlites_back_has_no_counter(store: Path) -> None:
    assert own_writes.change_counter(store) is not None
    data = store.read_bytes()
    store.write_bytes(data[: len(data) // 2])
    assert own_writes.change_counter(store) is None


def test_a_wal_store_has_no_counter_and_is_always_read(store: Path) -> None:
    conn = sqlite3.connect(store)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.close()
    assert own_writes.change_counter(store) is None
    reader = StoreReader(store)
    reader.read()
    assert not reader.read().unchanged


def test_reading_the_counter_never_drops_sqlites_locks(store: Path) -> None:
    """Closing any descriptor of a file drops the process's POSIX locks on it, SQLite's too: the
    counter is read through a descriptor that is never closed, so a transaction here keeps its lock."""
    import subprocess
    import sys

    conn = sqlite3.connect(store, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT OR REPLACE INTO settings (key, value) VALUES ('slayer_lsp_probe', '2')")
        for _ in range(3):
            assert own_writes.change_counter(store) is not None
        other = subprocess.run(
            [
                sys.executable,
                "-c",
                (
                    "import sqlite3, sys\n"
                    "c = sqlite3.connect(sys.argv[1], timeout=0, isolation_level=None)\n"
                    "try:\n    c.execute('BEGIN IMMEDIATE')\nexcept sqlite3.OperationalError as e:\n    print(e)\n"
                    "else:\n    print('got the write lock')\n"
                ),
                str(store),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert other.stdout.strip() == "database is locked"
        conn.execute("COMMIT")
    finally:
        conn.close()
