"""The vector store: SLayer's ``embeddings`` table, shared with SLayer row for row.

Where it lives is SLayer's choice: ``<store>/embeddings.db`` beside a YAML store, the store file
itself for a SQLite store. Rows are keyed by ``(canonical_id, embedding_model_name)`` and carry the
entity kind, the sha256 of the embedded text, the vector as a JSON list of floats and an ISO
timestamp, so a row either program writes the other reads, and neither re-embeds an unchanged
text the other already paid for.

SLayer (and its users) must never be locked out or corrupted by us: every call opens its own
connection with a busy timeout, runs one short transaction and closes; nothing is held open between
calls; reads page through the rows of one model by rowid so memory stays bounded. The table and its
index are created (exactly as SLayer creates them) only in the YAML sidecar; SLayer's main SQLite
file is never altered beyond inserting and deleting rows of its ``embeddings`` table.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import os
import sqlite3
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec
import numpy as np

if TYPE_CHECKING:
    from slayer_lsp.store.locate import StoreLocation

    StorePlace = StoreLocation | str | os.PathLike[str]  # a store, or a path located as SLayer does

log = logging.getLogger(__name__)

SIDECAR_NAME = "embeddings.db"
# SLayer's Embedding.entity_kind literal: a row of any other kind would break SLayer's reads.
SLAYER_KINDS = frozenset({"memory", "datasource", "model", "column", "measure", "aggregation"})
BUSY_TIMEOUT = 5.0
_IN_CHUNK = 900  # ids per IN (...) clause, well under any SQLite's parameter limit

_CREATE_TABLE = (
    "CREATE TABLE IF NOT EXISTS {table} (\n"
    "    canonical_id TEXT NOT NULL,\n"
    "    embedding_model_name TEXT NOT NULL,\n"
    "    entity_kind TEXT NOT NULL,\n"
    "    content_hash TEXT NOT NULL,\n"
    "    embedding TEXT NOT NULL,\n"
    "    created_at TEXT NOT NULL,\n"
    "    PRIMARY KEY (canonical_id, embedding_model_name)\n"
    ")"
)
_CREATE_INDEX = "CREATE INDEX IF NOT EXISTS idx_{table}_model ON {table}(embedding_model_name)"
_UPSERT = (
    "INSERT OR REPLACE INTO {table} (canonical_id, embedding_model_name, entity_kind, "
    "content_hash, embedding, created_at) VALUES (?, ?, ?, ?, ?, ?)"
)
TABLE = "embeddings"  # SLayer's

_decode_vector = msgspec.json.Decoder(list[float]).decode


class VectorStoreError(RuntimeError):
    """The embeddings table could not be read or written (locked past the timeout, read-only, missing)."""


def content_hash(text: str) -> str:
    """sha256 hex of the embedded text, as SLayer computes it."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def now_iso() -> str:
    """A UTC timestamp as SLayer writes it (``datetime.isoformat()``, offset ``+00:00``)."""
    return datetime.now(UTC).isoformat()


def encode_vector(vector: np.ndarray) -> str:
    """A JSON list of floats (SLayer's ``json.dumps`` layout). Nine significant digits restore
    every float32 exactly and take about half the space of float64 reprs."""
    values = np.asarray(vector, dtype=np.float32).ravel()
    if not np.isfinite(values).all():
        raise ValueError("a vector with NaN or infinite components cannot be stored")
    return "[" + ", ".join(map("{:.9g}".format, values.tolist())) + "]"


def escape_like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


@dataclass(frozen=True, slots=True)
class StoredVector:
    canonical_id: str
    kind: str
    content_hash: str
    vector: np.ndarray  # float32, 1-D, as stored (not renormalised)
    created_at: str


@dataclass(frozen=True, slots=True)
class NewVector:
    """One row to write: the model name is given to ``upsert`` for the whole batch."""

    canonical_id: str
    kind: str
    content_hash: str
    vector: np.ndarray


@dataclass(slots=True)
class VectorPage:
    """Rows of one model as a matrix; rows of another width than ``dim`` or unreadable ones are in
    ``rejected`` as ``(canonical_id, reason)`` instead."""

    ids: list[str] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)
    hashes: list[str] = field(default_factory=list)
    matrix: np.ndarray | None = None
    rejected: list[tuple[str, str]] = field(default_factory=list)


def _page(rows: list[tuple], dim: int | None) -> tuple[VectorPage, int | None]:
    """``(canonical_id, kind, content_hash, embedding)`` rows as a page, and the width found (the
    first readable row's when ``dim`` is None)."""
    out = VectorPage()
    vectors: list[list[float]] = []
    for cid, kind, chash, raw in rows:
        try:
            values = _decode_vector(raw)
        except (msgspec.DecodeError, TypeError) as exc:
            out.rejected.append((cid, f"unreadable embedding: {exc}"))
            continue
        if not values or not all(math.isfinite(v) for v in values):
            out.rejected.append((cid, "empty or non-finite embedding"))
            continue
        if dim is None:
            dim = len(values)
        if len(values) != dim:
            out.rejected.append((cid, f"dimension {len(values)}, expected {dim}"))
            continue
        out.ids.append(cid)
        out.kinds.append(kind)
        out.hashes.append(chash)
        vectors.append(values)
    out.matrix = (
        np.asarray(vectors, dtype=np.float32) if vectors else np.zeros((0, dim or 0), dtype=np.float32)
    )
    return out, dim


class VectorStore:
    """Reads and writes rows of SLayer's ``embeddings`` table at ``db_path``.

    ``create`` allows creating the file, table and index on the first write (the YAML sidecar);
    without it a missing table is an error on write and simply empty on read. ``table``, ``kinds``
    and ``separators`` are for a table of our own with SLayer's row layout (the part vectors of
    ``embed.parts``): its name, the entity kinds it takes (``None``: any) and what separates an id
    from its descendants' (``("." , "#")``: ``ds.m`` also owns ``ds.m#meaning``)."""

    def __init__(
        self,
        db_path: str | os.PathLike[str],
        *,
        create: bool,
        busy_timeout: float = BUSY_TIMEOUT,
        table: str = TABLE,
        kinds: frozenset[str] | None = SLAYER_KINDS,
        separators: tuple[str, ...] = (".",),
    ):
        if not table.isidentifier():
            raise ValueError(f"not a table name: {table!r}")
        self.path = Path(db_path)
        self.create = create
        self.busy_timeout = busy_timeout
        self.table = table
        self.kinds = kinds
        self.separators = separators

    @classmethod
    def for_store(cls, location: StorePlace, *, busy_timeout: float = BUSY_TIMEOUT) -> VectorStore:
        """The store of a ``StoreLocation`` (or a path, located as SLayer locates it)."""
        from slayer_lsp.store.locate import StoreLocation, locate

        loc = location if isinstance(location, StoreLocation) else locate(os.fspath(location))
        if loc.backend == "sqlite":
            return cls(loc.path, create=False, busy_timeout=busy_timeout)
        return cls(loc.path / SIDECAR_NAME, create=True, busy_timeout=busy_timeout)

    def __repr__(self) -> str:
        return f"VectorStore({str(self.path)!r})"

    # ------------------------------------------------------------------ connections

    @contextlib.contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        try:
            conn = sqlite3.connect(self.path, timeout=self.busy_timeout, isolation_level=None)
        except sqlite3.Error as exc:
            raise VectorStoreError(f"cannot open {self.path}: {exc}") from exc
        try:
            yield conn
        finally:
            conn.close()

    def _read(self, sql: str, params: tuple = ()) -> list[tuple]:
        """One statement in its own connection; no file or table means no rows (nothing is created)."""
        if not self.path.is_file():
            return []
        with self._connect() as conn:
            try:
                return conn.execute(sql, params).fetchall()
            except sqlite3.OperationalError as exc:
                if "no such table" in str(exc):
                    return []
                raise VectorStoreError(f"reading embeddings from {self.path}: {exc}") from exc
            except sqlite3.Error as exc:
                raise VectorStoreError(f"reading embeddings from {self.path}: {exc}") from exc

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """A short ``BEGIN IMMEDIATE`` transaction: the write lock is taken up front (waiting at most
        the busy timeout), so it never deadlocks on a lock upgrade against another writer."""
        if not self.create and not self.path.is_file():
            raise VectorStoreError(f"{self.path} does not exist")
        if self.create and not self.path.parent.is_dir():
            raise VectorStoreError(f"{self.path.parent} is not a directory")
        with self._connect() as conn:
            try:
                conn.execute("BEGIN IMMEDIATE")
                if self.create:
                    conn.execute(_CREATE_TABLE.format(table=self.table))
                    conn.execute(_CREATE_INDEX.format(table=self.table))
                elif (
                    conn.execute(
                        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (self.table,)
                    ).fetchone()
                    is None
                ):
                    raise VectorStoreError(
                        f"{self.path} has no embeddings table (SLayer 1.4.1 creates it when it opens the store)"
                    )
                yield conn
                conn.execute("COMMIT")
            except BaseException as exc:
                if conn.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        conn.execute("ROLLBACK")
                if isinstance(exc, sqlite3.Error):
                    raise VectorStoreError(f"writing embeddings to {self.path}: {exc}") from exc
                raise

    # ------------------------------------------------------------------ reads

    def model_counts(self) -> dict[str, int]:
        """Rows per ``embedding_model_name``."""
        rows = self._read(
            f"SELECT embedding_model_name, COUNT(*) FROM {self.table} GROUP BY embedding_model_name"
        )
        return {name: int(n) for name, n in rows}

    def count(self, model: str) -> int:
        rows = self._read(f"SELECT COUNT(*) FROM {self.table} WHERE embedding_model_name = ?", (model,))
        return int(rows[0][0]) if rows else 0

    def iter_pages(self, model: str, *, page: int = 2000, dim: int | None = None) -> Iterator[VectorPage]:
        """All rows of ``model`` as matrices, at most ``page`` rows at a time (a fresh connection per
        ``_IN_CHUNK`` rows), the rows of each kind together: kinds in the order their first row was written, each kind's
        rows in rowid order. A vector index loaded from them then holds each kind's rows in one
        stretch, what a scan of one kind (the memory pieces of a search) reads, without a second copy
        of its matrix to arrange them.

        The (rowid, kind) pairs come first (no vectors: a range scan through SLayer's index on the
        model name), then the rows by rowid. The first readable row fixes ``dim`` unless given; rows
        of another width land in ``rejected``. A row rewritten while paging may be seen twice or
        missed until the next read."""
        by_kind: dict[str, list[int]] = {}
        for rowid, kind in self._rowids(model):
            by_kind.setdefault(kind, []).append(rowid)
        ordered = [rowid for rowids in by_kind.values() for rowid in rowids]
        page = max(1, page)
        for start in range(0, len(ordered), page):
            rows: list[tuple] = []
            for at in range(start, min(start + page, len(ordered)), _IN_CHUNK):
                chunk = ordered[at : min(at + _IN_CHUNK, start + page)]
                found = {
                    row[0]: row[1:]
                    for row in self._read(
                        f"SELECT rowid, canonical_id, entity_kind, content_hash, embedding FROM {self.table} "
                        f"WHERE rowid IN ({','.join('?' * len(chunk))}) AND embedding_model_name = ?",
                        (*chunk, model),
                    )
                }
                rows += [found[r] for r in chunk if r in found]  # in the order asked: kind by kind
            out, dim = _page(rows, dim)
            yield out

    def _rowids(self, model: str, page: int = 50_000) -> Iterator[tuple[int, str]]:
        """(rowid, kind) of every row of ``model`` in rowid order, paged."""
        last = -1
        while True:
            rows = self._read(
                f"SELECT rowid, entity_kind FROM {self.table} "
                "WHERE embedding_model_name = ? AND rowid > ? ORDER BY rowid LIMIT ?",
                (model, last, page),
            )
            yield from rows
            if len(rows) < page:
                return
            last = rows[-1][0]

    def get(self, model: str, canonical_ids: Iterable[str]) -> dict[str, StoredVector]:
        """The stored rows of these ids under ``model`` (unreadable rows are left out)."""
        ids = list(dict.fromkeys(canonical_ids))
        out: dict[str, StoredVector] = {}
        for start in range(0, len(ids), _IN_CHUNK):
            chunk = ids[start : start + _IN_CHUNK]
            rows = self._read(
                f"SELECT canonical_id, entity_kind, content_hash, embedding, created_at FROM {self.table} "
                f"WHERE embedding_model_name = ? AND canonical_id IN ({','.join('?' * len(chunk))})",
                (model, *chunk),
            )
            for cid, kind, chash, raw, created in rows:
                try:
                    vector = np.asarray(_decode_vector(raw), dtype=np.float32)
                except (msgspec.DecodeError, TypeError):
                    continue
                out[cid] = StoredVector(cid, kind, chash, vector, created)
        return out

    def hashes(self, model: str, *, page: int = 10000) -> Iterator[tuple[str, str]]:
        """``(canonical_id, content_hash)`` of every row of ``model``, paged, without the vectors."""
        last = -1
        while True:
            rows = self._read(
                f"SELECT rowid, canonical_id, content_hash FROM {self.table} "
                "WHERE embedding_model_name = ? AND rowid > ? ORDER BY rowid LIMIT ?",
                (model, last, page),
            )
            for _rowid, cid, chash in rows:
                yield cid, chash
            if len(rows) < page:
                return
            last = rows[-1][0]

    def hashes_for(self, model: str, canonical_ids: Iterable[str]) -> dict[str, str]:
        ids = list(dict.fromkeys(canonical_ids))
        out: dict[str, str] = {}
        for start in range(0, len(ids), _IN_CHUNK):
            chunk = ids[start : start + _IN_CHUNK]
            out.update(
                self._read(
                    f"SELECT canonical_id, content_hash FROM {self.table} "
                    f"WHERE embedding_model_name = ? AND canonical_id IN ({','.join('?' * len(chunk))})",
                    (model, *chunk),
                )
            )
        return out

    # ------------------------------------------------------------------ writes

    def upsert(self, model: str, rows: Iterable[NewVector], *, created_at: str | None = None) -> int:
        """Insert or replace rows of ``model`` in one short transaction; returns how many.

        Kinds outside SLayer's literal and non-finite vectors are refused (``ValueError``) before
        anything is written: a row SLayer cannot validate would break every SLayer read of the model."""
        stamp = created_at or now_iso()
        params = []
        for row in rows:
            if self.kinds is not None and row.kind not in self.kinds:
                raise ValueError(
                    f"entity kind {row.kind!r} of {row.canonical_id!r} is not one SLayer reads "
                    f"({', '.join(sorted(self.kinds))})"
                )
            params.append(
                (row.canonical_id, model, row.kind, row.content_hash, encode_vector(row.vector), stamp)
            )
        if not params:
            return 0
        with self._write() as conn:
            conn.executemany(_UPSERT.format(table=self.table), params)
        return len(params)

    def delete(self, canonical_id: str, *, model: str | None = None) -> int:
        """Delete the rows of ``canonical_id`` and of its dotted descendants (``ds`` takes ``ds.m`` and
        ``ds.m.c``, never ``ds_v2``; ``memory:4`` never takes ``memory:42``), of every model unless
        ``model`` is given. Returns the number of rows deleted."""
        return self.delete_many([canonical_id], model=model)

    def delete_model(self, model: str) -> int:
        """Delete every row of ``model``; returns how many."""
        if not self.path.is_file():
            return 0
        with self._write() as conn:
            return (
                conn.execute(f"DELETE FROM {self.table} WHERE embedding_model_name = ?", (model,)).rowcount
                or 0
            )

    def delete_many(self, canonical_ids: Iterable[str], *, model: str | None = None) -> int:
        roots = list(dict.fromkeys(canonical_ids))
        if not roots or not self.path.is_file():
            return 0
        likes = " OR ".join(["canonical_id LIKE ? ESCAPE '\\'"] * len(self.separators))
        sql = f"DELETE FROM {self.table} WHERE (canonical_id = ? OR {likes})"
        if model is not None:
            sql += " AND embedding_model_name = ?"
        deleted = 0
        with self._write() as conn:
            for root in roots:
                params: tuple = (root, *(escape_like(root) + sep + "%" for sep in self.separators))
                if model is not None:
                    params += (model,)
                deleted += conn.execute(sql, params).rowcount or 0
        return deleted


class MemoryStore:
    """Keeps nothing: vectors live in the worker's index only (for part vectors when the on-disk
    cache is off; they are embedded again at the next start)."""

    path = Path(":memory:")
    table = ""

    def model_counts(self) -> dict[str, int]:
        return {}

    def count(self, model: str) -> int:
        return 0

    def iter_pages(self, model: str, **_: object) -> Iterator[VectorPage]:
        return iter(())

    def get(self, model: str, canonical_ids: Iterable[str]) -> dict[str, StoredVector]:
        return {}

    def upsert(self, model: str, rows: Iterable[NewVector], **_: object) -> int:
        return len(list(rows))

    def delete(self, canonical_id: str, **_: object) -> int:
        return 0

    def delete_many(self, canonical_ids: Iterable[str], **_: object) -> int:
        return 0

    def delete_model(self, model: str) -> int:
        return 0
