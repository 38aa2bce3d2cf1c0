"""When a long-lived server runs Python's full (generation 2) collections: between requests.

A full collection walks every container object not frozen at start-up; in the daemon that is what
the snapshots built since hold (datasource indexes, persistent maps), and a pass takes 30-80 ms at
1,000 models. CPython starts one whenever enough young objects survive, which is in the middle of
some request: at 1,000 models these passes were most of a search's p99 (a search takes ~5 ms).

``IdleCollector`` turns the automatic full collection off (the young generations still collect
themselves: those passes are short) and runs it itself, on a thread of its own, when:

* the server has been idle for ``idle_s`` (no message in) and at least ``FULL_AFTER`` young
  collections have run since the last full one (CPython's own threshold), or
* the server has not been idle for ``max_defer_s`` and that many have run: a busy server still
  collects its cycles (superseded snapshots hold some), at most that late.

Memory stays bounded as before; only the moment of the pause moves.

``settle`` is how a big build ends (the engine's first index and its warm-up, frozen out of every
later pass as soon as it ends): its cycles are collected and what survives is frozen again. That
pass walks the whole heap (~0.25 s at 1,000 models); with a collector running it waits for the next
idle moment too.
"""

from __future__ import annotations

import gc
import logging
import threading
import time

log = logging.getLogger(__name__)

FULL_AFTER = 10  # generation-1 collections between full ones (CPython's default threshold 2)
_NEVER = 1 << 30  # a generation-2 threshold that the count never reaches


class IdleCollector:
    def __init__(self, idle_s: float = 0.25, max_defer_s: float = 30.0, tick_s: float = 0.1) -> None:
        self.idle_s = idle_s
        self.max_defer_s = max_defer_s
        self.tick_s = tick_s
        self.collections = 0  # full passes run here
        self._last_activity = time.monotonic()
        self._last_full = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._saved: tuple[int, int, int] | None = None
        self._settle = False

    def settle_later(self) -> None:
        """Collect and freeze at the next idle moment (see ``settle``)."""
        self._settle = True

    def touch(self) -> None:
        """A message came in (called on every frame; one store, no lock: a float write is atomic)."""
        self._last_activity = time.monotonic()

    def start(self) -> None:
        global _active
        if self._thread is not None:
            return
        _active = self
        self._saved = gc.get_threshold()
        first, second, _ = self._saved
        gc.set_threshold(first, second, _NEVER)
        self._thread = threading.Thread(target=self._run, name="slayer-gc", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Back to CPython's own schedule. A settle still pending is dropped: the server is ending,
        and a pass over the whole heap then would only delay its exit."""
        global _active
        if _active is self:
            _active = None
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=5.0)
        if self._saved is not None:
            gc.set_threshold(*self._saved)
            self._saved = None
        self._settle = False

    def due(self, now: float) -> bool:
        """Whether a full collection should run at ``now``."""
        if gc.get_count()[2] < FULL_AFTER and not self._settle:
            return False
        return now - self._last_activity >= self.idle_s or now - self._last_full >= self.max_defer_s

    def _run(self) -> None:
        while not self._stop.wait(self.tick_s):
            now = time.monotonic()
            if not self.due(now):
                continue
            t0 = time.perf_counter()
            if self._settle:
                self._settle = False
                found = _collect_and_freeze()
            else:
                found = gc.collect(2)
            self._last_full = time.monotonic()
            self.collections += 1
            log.debug("full collection: %d unreachable, %.1f ms", found, (time.perf_counter() - t0) * 1e3)


_active: IdleCollector | None = None  # the running collector of this process, if any


def settle() -> None:
    """A big build is over: collect its cycles and freeze what survives out of later passes — at the
    running collector's next idle moment, or now when none runs (a CLI run, a test)."""
    active = _active
    if active is not None:
        active.settle_later()
    else:
        _collect_and_freeze()


def _collect_and_freeze() -> int:
    """One pass over everything, frozen included (a frozen object is otherwise never collected),
    then everything that survived frozen again."""
    gc.unfreeze()
    found = gc.collect()
    gc.freeze()
    return found
