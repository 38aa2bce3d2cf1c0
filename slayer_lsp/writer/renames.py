"""A rename's part of a SQLite store: its rows rewritten in one transaction, or none.

The plan (which rows, and what they become) is ``analysis.rename``'s; this module only reads the rows
it may rewrite and writes them back under the write lock SLayer's own saves take.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from slayer_lsp.writer.errors import MemoryWriteError, WriteErrorKind
from slayer_lsp.writer.memories import LOCK_TIMEOUT, check_sqlite_schema, io_error, sqlite_transaction

__all__ = ["RowRewrite", "read_rename_rows", "rename_rows"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RowRewrite:
    """One row a rename rewrites: ``table`` is ``models`` (key ``(datasource, name)``) or ``memories``
    (key ``(id,)``). ``old_data`` is the row as it was planned from; the rewrite is refused when the
    row no longer holds it. ``entities``: a memory's tags after the rename (its ``memory_entities``)."""

    table: str
    key: tuple[str, ...]
    old_data: str
    new_data: str
    new_key: tuple[str, ...]
    entities: tuple[str, ...] = ()


def read_rename_rows(
    db: Path | str, datasource: str
) -> tuple[list[tuple[str, str, str]], list[tuple[str, str]]]:
    """The rows a rename of something in ``datasource`` may rewrite: that datasource's model rows
    ``(data_source, name, data)`` (joins and formulas reach only within it) and every memory row
    ``(id, data)``. Read without a lock: ``rename_rows`` re-checks each row under the write lock."""
    db = Path(db)
    if not db.is_file():
        raise MemoryWriteError(f"no SLayer SQLite store at {db}", kind=WriteErrorKind.STORE)
    try:
        conn = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True, timeout=LOCK_TIMEOUT)
        try:
            models = [
                (str(a), str(b), str(c))
                for a, b, c in conn.execute(
                    "SELECT data_source, name, data FROM models WHERE data_source = ? ORDER BY name",
                    (datasource,),
                )
            ]
            memories = [
                (str(a), str(b)) for a, b in conn.execute("SELECT id, data FROM memories ORDER BY id")
            ]
        finally:
            conn.close()
    except sqlite3.Error as exc:
        raise io_error("read the rows of", db, exc) from exc
    return models, memories


def rename_rows(
    db: Path | str, rows: Sequence[RowRewrite], renamed: Sequence[str], lock_timeout: float = LOCK_TIMEOUT
) -> None:
    """Rewrite the rows of a rename in ONE ``BEGIN IMMEDIATE`` transaction (the write lock SLayer's
    own saves take), so a reader sees the store before the rename or after it, never half of it.

    Every row must still hold the data the rename was planned from, and a renamed model's new key
    must be free; otherwise nothing is written. A model row is updated in place (SLayer's
    ``json.dumps`` form is the planner's); a memory row is replaced and its ``memory_entities``
    mirrored as SLayer's save does. Stored vectors of ``renamed`` ids (and their descendants) are
    dropped: they are keyed by the old id, and the next embedding pass files them under the new one."""
    db = Path(db)
    try:
        with sqlite_transaction(db, lock_timeout) as conn:
            check_sqlite_schema(conn, db)
            for row in rows:
                where = "data_source = ? AND name = ?" if row.table == "models" else "id = ?"
                found = conn.execute(f"SELECT data FROM {row.table} WHERE {where}", row.key).fetchone()
                if found is None or found[0] != row.old_data:
                    raise MemoryWriteError(
                        f"the {row.table} row {'.'.join(row.key)!r} changed since the rename "
                        f"was planned; nothing was written: rename again",
                        kind=WriteErrorKind.STALE,
                    )
                if (
                    row.new_key != row.key
                    and conn.execute(f"SELECT 1 FROM {row.table} WHERE {where}", row.new_key).fetchone()
                    is not None
                ):
                    raise MemoryWriteError(
                        f"{'.'.join(row.new_key)!r} already exists in the store; nothing was written",
                        kind=WriteErrorKind.STALE,
                    )
            for row in rows:
                if row.table == "models":
                    conn.execute(
                        "UPDATE models SET data_source = ?, name = ?, data = ? "
                        "WHERE data_source = ? AND name = ?",
                        (*row.new_key, row.new_data, *row.key),
                    )
                    continue
                conn.execute("UPDATE memories SET data = ? WHERE id = ?", (row.new_data, *row.key))
                conn.execute("DELETE FROM memory_entities WHERE memory_id = ?", row.key)
                for entity in row.entities:
                    conn.execute(
                        "INSERT OR IGNORE INTO memory_entities (memory_id, entity) VALUES (?, ?)",
                        (*row.key, entity),
                    )
            has_vectors = (
                conn.execute(
                    "SELECT 1 FROM sqlite_master WHERE type='table' AND name='embeddings'"
                ).fetchone()
                is not None
            )
            for old in renamed if has_vectors else ():
                conn.execute(
                    "DELETE FROM embeddings WHERE canonical_id = ? OR substr(canonical_id, 1, ?) = ?",
                    (old, len(old) + 1, old + "."),
                )
    except (sqlite3.Error, OSError) as exc:
        raise io_error("rename rows of", db, exc) from exc
    log.info("renamed %d rows in %s", len(rows), db)
