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

_MAX_FDS = 64

_lock = threading.Lock()
_ours: dict[str, dict[int, int]] = {}
_fds: dict[str, tuple[tuple[int, int], int]] = {}  # real path -> ((device, inode), descriptor)
_kept: list[int] = []  # every descriptor ever opened here: never closed (see _header_fd)


def change_counter(db: Path | str) -> int | None:
    """The file change counter of a rollback-journal SQLite database, or None (WAL, unreadable, short)."""
    fd = _header_fd(db)
    if fd is None:
        return None
    try:
        header = os.pread(fd, 100, 0)
        size = os.fstat(fd).st_size
    except OSError:
        return None
    if (
        len(header) < 100
        or not header.startswith(b"SQLite format 3\x00")
        or header[18] == 2
        or header[19] == 2
    ):
        return None
    counter = int.from_bytes(header[24:28], "big")
    page_size = int.from_bytes(header[16:18], "big")
    pages = int.from_bytes(header[28:32], "big")
    if int.from_bytes(header[92:96], "big") != counter or (page_size or 65536) * pages != size:
        return None  # a header SQLite did not finish writing, or a file cut short or grown behind its back
    return counter


def _header_fd(db: Path | str) -> int | None:
    """A descriptor of the database file that stays open for the life of the process. Closing any
    descriptor of a file drops every POSIX lock the process holds on it, SQLite's included (a
    transaction of the embedding worker would lose its lock mid-way), so these are never closed; a
    replaced file gets a new one, and past ``_MAX_FDS`` replacements the counter is simply unknown."""
    key = _key(db)
    try:
        st = os.stat(key)
    except OSError:
        return None
    with _lock:
        known = _fds.get(key)
        if known is not None and known[0] == (st.st_dev, st.st_ino):
            return known[1]
        if len(_kept) >= _MAX_FDS:
            return None
        try:
            fd = os.open(key, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return None
        _kept.append(fd)
        opened = os.fstat(fd)
        _fds[key] = ((opened.st_dev, opened.st_ino), fd)
        return fd if (opened.st_dev, opened.st_ino) == (st.st_dev, st.st_ino) else None


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
