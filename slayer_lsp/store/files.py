"""File I/O of the memory writers, as SLayer does it: the shared memories lock and atomic replaces.

The store layer owns how bytes reach the disk; what the bytes say is the writer's (``writer/``).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

__all__ = ["LockTimeout", "atomic_write", "memories_lock", "temp_prefix", "write_all"]


class LockTimeout(TimeoutError):
    """The memories lock stayed taken past the timeout (a wedged SLayer process, say)."""


@contextlib.contextmanager
def memories_lock(store: Path, timeout: float) -> Iterator[None]:
    """The exclusive ``flock`` on ``<store>/memories.lock`` that SLayer's memory writers share.
    Polls so a wedged holder becomes an error instead of a hung editor."""
    path = store / "memories.lock"
    try:
        handle: BinaryIO = open(path, "ab")  # held across the block
    except PermissionError:
        if not path.exists():
            raise
        handle = open(path, "rb")  # a read-only lock file can still be locked
    try:
        deadline = time.monotonic() + timeout
        pause = 0.001
        while True:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise LockTimeout(f"timed out after {timeout:g}s waiting for {path}") from None
                time.sleep(pause)
                pause = min(pause * 2, 0.05)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
    finally:
        handle.close()


def temp_prefix(directory: Path, basename: str) -> str:
    """``.<basename>.tmp.``, the basename cut (on a character boundary) so the temp name fits NAME_MAX."""
    try:
        name_max = os.pathconf(directory, "PC_NAME_MAX")
    except (OSError, ValueError):
        name_max = 255
    budget = max(name_max - 8 - len(".tmp.") - 1, 0)
    encoded = basename.encode("utf-8")
    if len(encoded) > budget:
        basename = encoded[:budget].decode("utf-8", errors="ignore")
    return f".{basename}.tmp."


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def atomic_write(path: Path, data: bytes) -> None:
    """Replace ``path`` durably: a same-directory temp file, fsynced, then ``os.replace``. A new file
    gets mode 0600, an existing one keeps its mode. On any error the temp file is removed and the
    old file is untouched."""
    try:
        mode = os.stat(path).st_mode & 0o7777
    except FileNotFoundError:
        mode = 0o600
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=temp_prefix(path.parent, path.name))
    try:
        try:
            write_all(fd, data)
            os.fchmod(fd, mode)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # durability of the rename; never turns a done write into an error
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
