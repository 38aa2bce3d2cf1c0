"""SQLite write transactions as SLayer's memory saves take them: the write lock up front."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path

__all__ = ["connect", "transaction"]


def connect(db: Path, timeout: float) -> sqlite3.Connection:
    return sqlite3.connect(db, timeout=timeout, isolation_level=None)


@contextlib.contextmanager
def transaction(db: Path, timeout: float) -> Iterator[sqlite3.Connection]:
    """One ``BEGIN IMMEDIATE`` transaction, with foreign keys on: committed on success, rolled back
    on any error, so no half-written row survives. The caller checks that ``db`` is a store."""
    conn = connect(db, timeout)
    try:
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
            conn.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise
    finally:
        conn.close()
