"""The commits this process made to a SQLite store, so that re-reading it can skip them.

The embedding worker writes SLayer's ``embeddings`` table in the store file itself, and every one of
its commits wakes the store watcher. Re-reading every model and memory row for a change that only
touched vectors costs a full scan of the store per batch. SQLite's file change counter (header
bytes 24-27, big-endian) goes up by one for every transaction that modifies the file in rollback
journal mode, SLayer's mode. A writer of ours reads the counter inside its write transaction
(nobody else can commit while it holds the write lock) and notes ``before -> before + 1``; a reader
that last read the store at counter ``a`` and now sees ``b != a`` may skip the read exactly when
every step from ``a`` to ``b`` is one of ours. Any other step, an unknown counter, a WAL database
(whose header counter does not move per commit), a file whose size disagrees with its header, and a
file event with no commit at all (a writer holding the lock, a damaged or replaced file) mean: read,
so that a fault is still reported.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

__all__ = ["change_counter", "note_commit", "only_ours"]

_MAX_NOTED = 4096  # per store: a reader that never comes back must not grow this for ever

_lock = threading.Lock()
_ours: dict[str, dict[int, int]] = {}


def change_counter(db: Path | str) -> int | None:
    """The file change counter of a rollback-journal SQLite database, or None (WAL, unreadable, short)."""
    try:
        fd = os.open(db, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        header = os.pread(fd, 100, 0)
        size = os.fstat(fd).st_size
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(header) < 100 or not header.startswith(b"SQLite format 3\x00") or header[18] == 2 or header[19] == 2:
        return None
    counter = int.from_bytes(header[24:28], "big")
    page_size = int.from_bytes(header[16:18], "big")
    pages = int.from_bytes(header[28:32], "big")
    if int.from_bytes(header[92:96], "big") != counter or (page_size or 65536) * pages != size:
        return None  # a header SQLite did not finish writing, or a file cut short or grown behind its back
    return counter


def note_commit(db: Path | str, before: int | None) -> None:
    """Our transaction, which held the write lock when the counter was ``before``, committed."""
    if before is None:
        return
    key = _key(db)
    with _lock:
        steps = _ours.setdefault(key, {})
        if len(steps) >= _MAX_NOTED:
            steps.pop(next(iter(steps)))
        steps[before] = (before + 1) & 0xFFFFFFFF


def only_ours(db: Path | str, since: int | None, now: int | None) -> bool:
    """Whether there were commits between counters ``since`` and ``now``, and every one was ours."""
    if since is None or now is None or since == now:
        return False
    with _lock:
        steps = _ours.get(_key(db), {})
        at, hops = since, 0
        while at != now:
            nxt = steps.get(at)
            if nxt is None or hops > len(steps):
                return False
            at, hops = nxt, hops + 1
        return True


def _key(db: Path | str) -> str:
    return os.path.realpath(db)
