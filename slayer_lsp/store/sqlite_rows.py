"""The rows of a SLayer SQLite store, and which of them changed since the last read.

SLayer's tables carry no row stamps and its writers update rows in place, so the only exact way to
tell what changed is to compare every row's text with the text read last time. Fetching every row
into Python to compare it costs more than the fetch: Python's ``sqlite3`` releases the interpreter
lock around each step, so beside busy request threads each of the store's rows waits its turn for
the lock again (a lock convoy; a 30 ms read of 6,000 rows measured 0.5-1.3 s under eight clients).

So the texts last returned are mirrored in an in-memory database, attached to each read's
connection, and SQLite compares them itself: per table, one query returns only the rows whose text
differs, one the keys that are gone, and (unless the row counts rule it out) one the keys that
came. A table is read whole (and its mirror rebuilt) the first time, after a failed read, when a
row has a key that is not text (such a row is named by its position, which needs the whole order)
and when the table has no unique index on its keys (duplicate keys cannot be mirrored).

Each read is one short, read-only transaction on a connection of its own.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from slayer_lsp.store import own_writes
from slayer_lsp.store.limits import MAX_DOCUMENT_BYTES

log = logging.getLogger(__name__)


class Row(NamedTuple):
    table: str
    parts: tuple[str, ...]  # the key columns (a position for a key that is not text)
    key: str  # the row's name in messages: the key columns joined with "."
    bad_key: str | None  # what is wrong with a key that is not text
    kind: str  # SQL type of the document column
    size: int  # its size in bytes
    text: str | None  # its text, when it is text within MAX_DOCUMENT_BYTES


@dataclass(frozen=True)
class Table:
    """A table of documents; ``where`` selects the rows of a table read whole (settings)."""

    name: str
    keys: tuple[str, ...]
    column: str
    where: str = "1"


DOCUMENT_TABLES = (
    Table("datasources", ("name",), "data"),
    Table("models", ("data_source", "name"), "data"),
    Table("memories", ("id",), "data"),
)
SETTINGS = Table("settings", ("key",), "value", "key = 'datasource_priority'")  # one row: read whole
REQUIRED = frozenset(t.name for t in DOCUMENT_TABLES)


class NotAStore(sqlite3.DatabaseError):
    """The file is a database but not a SLayer store."""


@dataclass
class TableRows:
    """What one read found in one table: every row (``whole``) or the rows whose text changed and
    the keys that are gone."""

    whole: bool
    rows: list[Row] = field(default_factory=list)
    removed: list[tuple[str, ...]] = field(default_factory=list)


@dataclass
class RowsRead:
    tables: dict[str, TableRows]  # in reading order; "settings" only when the table exists
    counter: int | None  # the file change counter these rows are from


class RowMirror:
    """One store file's mirror of the texts last read from it, and the reads that use it."""

    def __init__(self, path: Path, busy_timeout: float = 2.0):
        self.path = path
        self.busy_timeout = busy_timeout
        # the mirror is an in-memory database that lives as long as this connection to it
        self._keeper: sqlite3.Connection | None = None
        self._name = f"file:slayer-lsp-rows-{uuid.uuid4().hex}?mode=memory&cache=shared"
        self._mirrored: set[str] = set()  # tables whose mirror holds their last read
        self._lock = threading.Lock()
        # a whole read's rows still being copied into the mirror (``_fill``); the next read waits
        self._filling: threading.Thread | None = None
        self._to_fill: list[tuple[Table, list[Row]]] = []  # what this read leaves to the filler

    def read(self) -> RowsRead:
        """Every table's rows, or what changed in them since the last read. Raises
        ``sqlite3.DatabaseError`` (``NotAStore`` for a database of another kind); the next read then
        reads every table whole."""
        with self._lock:
            self._wait_for_fill()
            self._to_fill = []
            try:
                try:
                    found = self._read()
                except sqlite3.OperationalError as exc:
                    if getattr(exc, "sqlite_errorname", "") != "SQLITE_READONLY_ROLLBACK":
                        raise
                    # a writer died mid-transaction and left a hot journal, which a read-only
                    # connection may not roll back: a read-write one restores the last committed
                    # state (as any SLayer process opening the store would), then read again
                    _roll_back_hot_journal(self.path, self.busy_timeout)
                    self._to_fill = []
                    found = self._read()
            except BaseException:
                self._mirrored.clear()
                raise
            if self._to_fill:
                self._filling = threading.Thread(
                    target=self._fill, args=(self._to_fill,), name="slayer-sqlite-mirror", daemon=True
                )
                self._filling.start()
            self._to_fill = []
            return found

    def close(self) -> None:
        with self._lock:
            self._wait_for_fill()
            self._mirrored.clear()
            if self._keeper is not None:
                self._keeper.close()
                self._keeper = None

    # ------------------------------------------------------------------ inside

    def _open_mirror(self) -> None:
        if self._keeper is not None:
            return
        keeper = sqlite3.connect(self._name, uri=True, isolation_level=None, check_same_thread=False)
        for table in DOCUMENT_TABLES:
            columns = ", ".join(f"k{i} TEXT" for i in range(len(table.keys)))
            primary = ", ".join(f"k{i}" for i in range(len(table.keys)))
            keeper.execute(
                f"CREATE TABLE {_mirror(table)} ({columns}, data TEXT, PRIMARY KEY ({primary})) WITHOUT ROWID"
            )
        self._keeper = keeper

    def _read(self) -> RowsRead:
        self._open_mirror()
        # a connection per read: its page cache is new, so pages damaged under an unchanged header
        # are read (and found damaged) rather than served from the last read's cache
        uri = f"{self.path.resolve().as_uri()}?mode=ro"
        conn = sqlite3.connect(uri, uri=True, timeout=self.busy_timeout, isolation_level=None)
        try:
            conn.execute("ATTACH DATABASE ? AS seen", (self._name,))
            conn.execute("BEGIN")  # one consistent read; released at once
            names = {r[0] for r in conn.execute("SELECT name FROM main.sqlite_master WHERE type='table'")}
            missing = REQUIRED - names
            if missing:
                raise NotAStore(f"not a SLayer store (missing tables: {', '.join(sorted(missing))})")
            out: dict[str, TableRows] = {}
            for table in DOCUMENT_TABLES:
                out[table.name] = self._table(conn, table)
            if SETTINGS.name in names:
                out[SETTINGS.name] = TableRows(True, all_rows(conn, SETTINGS))
            counter = own_writes.change_counter(self.path)  # under the read lock: what these rows are
            conn.execute("COMMIT")
            return RowsRead(out, counter)
        finally:
            conn.close()  # an open transaction is rolled back, the mirror's changes with it

    def _table(self, conn: sqlite3.Connection, table: Table) -> TableRows:
        if table.name in self._mirrored:
            removed = [tuple(r) for r in conn.execute(_removed_sql(table))]
            changed = _changed_rows(conn, table, len(removed))
            if all(row.bad_key is None for row in changed):
                if changed or removed:
                    _update_mirror(conn, table, changed, removed)
                return TableRows(False, changed, removed)
            # a key that is not text: such a row is named by its position, so read the table whole
        rows = all_rows(conn, table)
        self._mirrored.discard(table.name)
        if all(row.bad_key is None for row in rows) and _unique_on_keys(conn, table):
            # (a row whose key is not text is in no mirror: only a whole read sees it go)
            self._to_fill.append((table, rows))
        else:
            conn.execute(f"DELETE FROM seen.{_mirror(table)}")
        return TableRows(True, rows)

    def _fill(self, tables: list[tuple[Table, list[Row]]]) -> None:
        """Copy a whole read's rows into the mirror, on a thread of its own: SQLite copies the texts
        without the interpreter lock (10,000 models' 100 MB took 0.8 s of a start when the read did
        it), while the start goes on parsing and indexing. The rows are the ones the read returned,
        so the mirror holds exactly that read whatever the store did since; a table is marked
        mirrored only once its copy is complete (else the next read reads it whole)."""
        keeper = self._keeper
        if keeper is None:
            return
        for table, rows in tables:
            marks = ", ".join("?" * (len(table.keys) + 1))
            try:
                keeper.execute("BEGIN")
                keeper.execute(f"DELETE FROM {_mirror(table)}")
                keeper.executemany(
                    f"INSERT INTO {_mirror(table)} VALUES ({marks})", [(*row.parts, row.text) for row in rows]
                )
                keeper.execute("COMMIT")
            except sqlite3.Error as exc:
                log.warning("the SQLite change mirror of table %s was not filled: %s", table.name, exc)
                with contextlib.suppress(sqlite3.Error):
                    keeper.execute("ROLLBACK")
                continue
            self._mirrored.add(table.name)

    def _wait_for_fill(self) -> None:
        if self._filling is not None:
            self._filling.join()
            self._filling = None


def all_rows(conn: sqlite3.Connection, table: Table) -> list[Row]:
    """Every row of ``table`` in key order. The text is fetched only when it is text within
    ``MAX_DOCUMENT_BYTES`` (a 1 GB BLOB is never read); a key that is not text (NULL, a BLOB) is named
    by the row's position."""
    keys = table.keys
    sql = (
        f"SELECT {', '.join(f'typeof({k}), {k}' for k in keys)}, {_document_columns(table, '')} "
        f"FROM main.{table.name} WHERE {table.where} ORDER BY {', '.join(keys)}"
    )
    return [_row(table, raw, n) for n, raw in enumerate(conn.execute(sql), 1)]


def _changed_rows(conn: sqlite3.Connection, table: Table, removed: int) -> list[Row]:
    """The rows whose text differs from the mirror's, then the rows the mirror lacks (``removed``:
    how many of the mirror's keys the store no longer has).

    The comparison is driven from the mirror (scanned in key order, each row looked up in the store
    by its key): over the 100 MB of 10,000 models' texts it took 70 ms where a scan of the store in
    its own order took 290 ms (one edit's whole read). The rows the mirror lacks are found on the
    keys' index alone, and only they are fetched whole; none are looked for when the counts say there
    are none (an edit in place: the store's keys are unique, so as many rows as the mirror keeps
    are the mirror's rows)."""
    keys = table.keys
    key_columns = ", ".join(f"typeof(m.{k}), m.{k}" for k in keys)
    columns = f"{key_columns}, {_document_columns(table, 'm.')}"
    on = " AND ".join(f"s.k{i} = m.{k}" for i, k in enumerate(keys))
    differing = (
        f"SELECT {columns} FROM seen.{_mirror(table)} AS s CROSS JOIN main.{table.name} AS m ON {on} "
        f"WHERE s.data IS NOT m.{table.column}"
    )
    out = [_row(table, raw, 0) for raw in conn.execute(differing)]
    (stored,) = conn.execute(f"SELECT count(*) FROM main.{table.name}").fetchone()
    (kept,) = conn.execute(f"SELECT count(*) FROM seen.{_mirror(table)}").fetchone()
    if stored == kept - removed:
        return out
    new = f"SELECT {key_columns} FROM main.{table.name} AS m WHERE NOT EXISTS (SELECT 1 FROM seen.{_mirror(table)} AS s WHERE {on})"
    one = f"SELECT {columns} FROM main.{table.name} AS m WHERE " + " AND ".join(f"m.{k} = ?" for k in keys)
    for raw in conn.execute(new).fetchall():
        parts = raw[1::2]
        if raw[0::2] != _TEXT_KEYS[len(keys)]:  # named by its position: the caller reads the table whole
            out.append(_row(table, (*raw, None, 0, None), 0))
        else:
            out.extend(_row(table, found, 0) for found in conn.execute(one, parts))
    return out


def _removed_sql(table: Table) -> str:
    match = " AND ".join(f"m.{k} = s.k{i}" for i, k in enumerate(table.keys))
    return (
        f"SELECT {', '.join(f's.k{i}' for i in range(len(table.keys)))} FROM seen.{_mirror(table)} AS s "
        f"WHERE NOT EXISTS (SELECT 1 FROM main.{table.name} AS m WHERE {match})"
    )


def _update_mirror(
    conn: sqlite3.Connection, table: Table, changed: list[Row], removed: list[tuple[str, ...]]
) -> None:
    n = len(table.keys)
    where = " AND ".join(f"k{i} = ?" for i in range(n))
    conn.executemany(f"DELETE FROM seen.{_mirror(table)} WHERE {where}", removed)
    marks = ", ".join("?" * (n + 1))
    conn.executemany(
        f"INSERT OR REPLACE INTO seen.{_mirror(table)} VALUES ({marks})",
        [(*row.parts, row.text if row.kind == "text" else None) for row in changed],
    )


def _unique_on_keys(conn: sqlite3.Connection, table: Table) -> bool:
    """Whether the table's keys are unique (SLayer's primary keys); without that a mirror row could
    stand for two rows."""
    for index in conn.execute(f"PRAGMA main.index_list({table.name})").fetchall():
        if index[2] and not index[4]:  # unique, and over every row
            columns = [r[2] for r in conn.execute(f"PRAGMA main.index_info({index[1]!r})")]
            if sorted(columns) == sorted(table.keys):
                return True
    return False


def _mirror(table: Table) -> str:
    return f"slayer_lsp_seen_{table.name}"


def _text_or_null(table: Table, alias: str = "") -> str:
    c = f"{alias}{table.column}"
    return (
        f"CASE WHEN typeof({c}) = 'text' AND length(CAST({c} AS BLOB)) <= {MAX_DOCUMENT_BYTES} THEN {c} END"
    )


def _document_columns(table: Table, alias: str) -> str:
    c = f"{alias}{table.column}"
    return f"typeof({c}), length(CAST({c} AS BLOB)), {_text_or_null(table, alias)}"


_SQL_KIND = {"blob": "a BLOB", "null": "NULL", "integer": "an integer", "real": "a number"}
_TEXT_KEYS = {1: ("text",), 2: ("text", "text")}


def sql_kind(kind: str) -> str:
    """How a message names an SQL type: "a BLOB", "NULL", ..."""
    return _SQL_KIND.get(kind, kind)


def _row(table: Table, raw: tuple, position: int) -> Row:
    width = 2 * len(table.keys)
    kinds = raw[0:width:2]
    if kinds == _TEXT_KEYS[len(table.keys)]:  # the common case, in a few operations per row
        parts = raw[1:width:2]
        return Row(table.name, parts, ".".join(parts), None, raw[-3], raw[-2] or 0, raw[-1])
    problem = " and ".join(
        f"{sql_kind(kind)} {name}" for name, kind in zip(table.keys, kinds, strict=True) if kind != "text"
    )
    key = f"#{position} ({problem})"
    return Row(table.name, (key,), key, problem, raw[-3], raw[-2] or 0, raw[-1])


def _roll_back_hot_journal(path: Path, busy_timeout: float) -> None:
    conn = sqlite3.connect(
        f"{path.resolve().as_uri()}?mode=rw", uri=True, timeout=busy_timeout, isolation_level=None
    )
    try:
        conn.execute("BEGIN")
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        conn.execute("COMMIT")
    finally:
        conn.close()
