"""How a long-lived process keeps the C allocator from holding freed memory (glibc only; elsewhere
every call does nothing).

The daemon frees native memory in bursts: every compaction drops tantivy writers and segments built
on the refresh and timer threads. glibc keeps freed memory in per-thread arenas and hands little of
it back, so in the one-hour soak the resident size crept up while the memory in use stayed flat
(``mallinfo2`` in a 25-minute run: 40-60 MiB in use throughout, free-but-resident 212 -> 270 MiB).
Two remedies: at most two arenas (``tune``, at start, before threads exist), and handing free pages
back after each burst (``trim``, after a compaction).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys
from functools import cache

log = logging.getLogger(__name__)

M_ARENA_MAX = -8  # glibc's mallopt parameter number


@cache
def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt  # noqa: B018 - glibc has both; musl has neither
        libc.malloc_trim  # noqa: B018
    except (OSError, AttributeError):
        return None
    return libc


def tune(arenas: int = 2) -> bool:
    """Cap glibc's malloc arenas (call first thing in a long-lived process). Returns whether it took."""
    libc = _libc()
    if libc is None:
        return False
    ok = bool(libc.mallopt(M_ARENA_MAX, arenas))
    if not ok:
        log.debug("mallopt(M_ARENA_MAX, %d) refused", arenas)
    return ok


def trim() -> None:
    """Hand the allocator's free pages back to the system (after a burst of frees)."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)
