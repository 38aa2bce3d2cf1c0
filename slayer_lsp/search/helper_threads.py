"""Two threads that run a search's tantivy queries ahead of need.

tantivy lets go of the GIL while it searches, so a query begun here runs on the second core while
the search that began it scores what it already has; the answer is read where it was needed, and
is the same as had it been asked there. Only what holds the GIL briefly belongs here: a Python
step would wait for the scoring thread instead.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import ParamSpec, TypeVar

_P = ParamSpec("_P")
_T = TypeVar("_T")

# a search begins two queries ahead (its memories' pieces and their tag words); a third one begun
# too (the whole memories') was measured: no faster on two cores
THREADS = 2

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def begin(fn: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs) -> Future[_T]:
    """``fn(*args, **kwargs)`` begun on a helper thread; its future holds the answer (or raises
    what it raised)."""
    global _pool
    pool = _pool
    if pool is None:
        with _pool_lock:
            pool = _pool
            if pool is None:
                pool = _pool = ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="slayer-search")
    return pool.submit(fn, *args, **kwargs)
