"""Watch a store for changes on a background thread and report them, debounced (shared by the
language server and the MCP server, so it knows nothing of either protocol).

A YAML store is watched recursively (SLayer's dot-prefixed temp files, its lock files and the
embeddings database are ignored: only the atomic rename that lands a document counts). A SQLite
store is watched through its directory, for the database file and its ``-journal``/``-wal``. A store
that does not exist yet is watched through its nearest existing parent until it appears. The
callback runs on a thread of the watcher's own, so it may do blocking work (re-reading the store)
without touching the server's event loop.

Latency: SLayer lands a document with one rename, so the quiet period can be short (50 ms by
default): a change reaches the callback about ``POLL_STEP_MS`` + ``quiet_ms`` after the rename.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from slayer_lsp.store.locate import StoreLocation

if TYPE_CHECKING:
    from slayer_lsp.engine import Engine

log = logging.getLogger(__name__)

DEFAULT_WATCH_QUIET_MS = 50  # SLayer lands each document with one atomic rename
IGNORED_NAMES = ("embeddings.db", "embeddings.db-journal", "embeddings.db-wal", "embeddings.db-shm")
_YAML_SUFFIXES = (".yaml", ".yml")


def watch_quiet_ms() -> int:
    """``$SLAYER_LSP_WATCH_QUIET_MS`` (0..10000), else 50; a bad value is logged and ignored."""
    raw = os.environ.get("SLAYER_LSP_WATCH_QUIET_MS", "").strip()
    if raw:
        try:
            value = int(raw)
            if 0 <= value <= 10_000:
                return value
        except ValueError:
            pass
        log.warning(
            "SLAYER_LSP_WATCH_QUIET_MS=%r is not a number of milliseconds (0..10000); using %d",
            raw,
            DEFAULT_WATCH_QUIET_MS,
        )
    return DEFAULT_WATCH_QUIET_MS


def _is_document_path(rel: tuple[str, ...]) -> bool:
    """Where a YAML store keeps its documents: ``priority.yaml``, ``datasources/<name>.yaml``,
    ``models/<datasource>/<name>.yaml``, ``memories/<id>.md`` (dot-prefixed names are temp files,
    except a memory's: SLayer takes every ``*.md`` there, and its temp names never end in ``.md``)."""
    if not rel or any(part.startswith(".") for part in rel[:-1]):
        return False
    name = rel[-1]
    if name.startswith(".") and not (len(rel) == 2 and rel[0] == "memories" and name.endswith(".md")):
        return False
    return (
        rel == ("priority.yaml",)
        or (len(rel) == 2 and rel[0] == "datasources" and name.endswith(_YAML_SUFFIXES))
        or (len(rel) == 3 and rel[0] == "models" and name.endswith(_YAML_SUFFIXES))
        or (len(rel) == 2 and rel[0] == "memories" and name.endswith(".md"))
    )


def document_paths(location: StoreLocation, paths: Iterable[str]) -> list[str] | None:
    """The changed paths to hand to ``Engine.refresh`` so that a YAML store re-reads only those
    documents, or ``None`` (re-list the whole store) when a change may hide others: a directory
    appeared, moved or vanished (the watcher reports the directory, not each file in it), or the
    store itself did. Other files (notes beside the models, ...) are left out. A SQLite store is
    always read whole, so it gets ``None``."""
    if location.backend != "yaml":
        return None
    root = location.path
    out: list[str] = []
    for raw in paths:
        path = Path(raw)
        try:
            rel = path.relative_to(root).parts
        except ValueError:
            return None  # the store or one of its parents
        if _is_document_path(rel):
            if path.is_dir():
                return None
            out.append(raw)
        elif path.is_dir() or not path.exists():
            return None  # a directory, or something gone that may have been one
    return out


WATCH_IN_PLACE_S = 2.0  # how long a server's first read waits for the store's watch to be in place


class StoreWatcher:
    """Two threads: one turns file-system events into batches of relevant paths (watchfiles, polled
    every ``POLL_STEP_MS``), the other waits until ``quiet_ms`` pass without a further relevant
    change (at most ``max_wait_ms`` after the first) and calls ``on_change`` once with every path
    seen. The quiet period counts relevant changes only, so the embedding worker writing its
    database inside the store never holds a document change back; ``on_change`` calls never
    overlap, and changes made while one runs are handed to the next."""

    POLL_STEP_MS = 10
    # how long one wait for events lasts: the first one's end is when a server learns that its
    # watch is in place (see ``wait_in_place``), so it is short
    RUST_TIMEOUT_MS = 100

    def __init__(
        self,
        location: StoreLocation,
        on_change: Callable[[set[str]], None],
        *,
        quiet_ms: int = 50,
        max_wait_ms: int = 1000,
        force_polling: bool | None = None,
        catch_up: bool = False,
        first_read_waits: bool = False,
    ):
        self.location = location
        # once each watch is in place, ask for one whole re-read: a change made before it (while
        # the first index was being read) sends no event, and would stay unseen until the next one;
        # not for the first watch when the first read looks at the store after it (wait_in_place)
        self.catch_up = catch_up
        # the store's first read waits for the first watch (wait_in_place) before it looks: whenever
        # the watch comes in place, before that wait or during it, that read sees every change
        # before the watch (known from the start with ``first_read_waits``, else from the wait)
        self._first_read_waits = first_read_waits
        self._in_place = threading.Event()
        self._gave_up = False  # the waiting read stopped waiting, and read the store before the watch
        self._first_lock = threading.Lock()
        self.on_change = on_change
        self.quiet_ms = quiet_ms
        self.max_wait_ms = max_wait_ms
        self.force_polling = force_polling
        self._stop = threading.Event()
        self._changes: queue.SimpleQueue[set[str]] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self.watching: Path | None = None  # the directory being watched right now
        self._rescan_at: float | None = (
            None  # time.monotonic() of a whole re-read asked for by request_rescan
        )

    # ----- lifecycle

    def start(self) -> None:
        if self._threads:
            return
        self._threads = [
            threading.Thread(target=self._run, name="slayer-store-watch", daemon=True),
            threading.Thread(target=self._debounce, name="slayer-store-refresh", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(timeout)
        self._threads = []

    def request_rescan(self, after_s: float) -> None:
        """Call ``on_change`` with the store itself (a whole re-read) in ``after_s`` seconds unless a
        change comes first: how a store that became unreadable is retried when no file event will
        say it is whole again (a lock released without a write, a file system remounted)."""
        self._rescan_at = time.monotonic() + after_s

    def wait_in_place(self, timeout: float) -> bool:
        """Wait until the first watch is in place (every change from then on is seen); True when it
        is, and the caller's read of the store then needs no catch-up re-read. On False the watch
        catches up by itself once it is in place."""
        with self._first_lock:
            self._first_read_waits = True
        self._in_place.wait(timeout)
        with self._first_lock:
            if self._in_place.is_set():  # in place before or during the wait: no catch-up is owed
                return True
            self._gave_up = True  # owed once the watch is in place
            return False

    def _first_in_place(self) -> bool:
        """Mark the first watch in place; whether its catch-up is owed (no caller waited for it)."""
        with self._first_lock:
            first = not self._in_place.is_set()
            self._in_place.set()
            return not (first and self._first_read_waits and not self._gave_up)

    @property
    def running(self) -> bool:
        return bool(self._threads) and all(t.is_alive() for t in self._threads)

    # ----- what to watch

    def _target(self) -> tuple[Path, bool]:
        """(directory to watch, whether the store itself is there)."""
        path = self.location.path
        if self.location.backend == "yaml":
            if path.is_dir():
                return path, True
        elif path.parent.is_dir():
            return path.parent, path.exists()
        parent = path.parent
        while not parent.is_dir() and parent != parent.parent:
            parent = parent.parent
        return parent, False

    def _relevant(self, path_str: str) -> bool:
        path = Path(path_str)
        store = self.location.path
        if self.location.backend == "sqlite":
            return path.parent == store.parent and path.name in (
                store.name,
                f"{store.name}-journal",
                f"{store.name}-wal",
            )
        try:
            rel = path.relative_to(store)
        except ValueError:
            return path == store or store.is_relative_to(path)  # the store (or a parent) appeared/vanished
        if any(part.startswith(".") for part in rel.parts) and not _is_document_path(rel.parts):
            return False  # SLayer writes dot-prefixed temp files, then renames them into place
        return rel.name not in IGNORED_NAMES and not rel.name.endswith(".lock")

    # ----- the threads

    def _run(self) -> None:
        """Events -> batches of relevant paths on the queue; re-targets when the store appears or
        vanishes (and then asks for a whole re-read, since events before the new watch are lost)."""
        from watchfiles import watch

        while not self._stop.is_set():
            directory, present = self._target()
            self.watching = directory
            log.info("watching %s for store changes (%s)", directory, self.location)
            established = False
            try:
                for changes in watch(
                    directory,
                    watch_filter=lambda _c, p: self._relevant(p),
                    debounce=self.max_wait_ms,
                    step=self.POLL_STEP_MS,
                    stop_event=self._stop,
                    rust_timeout=self.RUST_TIMEOUT_MS,  # the first (empty) yield says the watch is in place
                    yield_on_timeout=True,
                    raise_interrupt=False,
                    recursive=self.location.backend == "yaml" or not present,
                    force_polling=self.force_polling,
                    ignore_permission_denied=True,
                ):
                    if not established:
                        established = True
                        if self._first_in_place() and self.catch_up:
                            self._changes.put({str(self.location.path)})  # the store itself: a whole re-read
                    if not changes:
                        continue
                    self._changes.put({p for _, p in changes})
                    if self._target() != (directory, present):
                        self._changes.put({str(self.location.path)})
                        break  # the store appeared or vanished: re-target
                self._stop.wait(0.05)
            except Exception as exc:  # noqa: BLE001 - the directory vanished under the watcher, ...
                log.warning("store watcher restarting after: %s", exc)
                self._stop.wait(0.5)

    def _debounce(self) -> None:
        quiet, max_wait = self.quiet_ms / 1000, self.max_wait_ms / 1000
        while not self._stop.is_set():
            due = self._rescan_at
            try:
                wait = 0.25 if due is None else min(0.25, max(due - time.monotonic(), 0.0))
                paths = set(self._changes.get(timeout=wait))
            except queue.Empty:
                if due is None or time.monotonic() < due:
                    continue
                paths = {str(self.location.path)}
            first = time.monotonic()
            while (left := min(quiet, first + max_wait - time.monotonic())) > 0:
                try:
                    paths |= self._changes.get(timeout=left)
                except queue.Empty:
                    break
            if self._stop.is_set():
                return
            self._rescan_at = (
                None  # this call re-reads; the handler asks again if the store is still unreadable
            )
            try:
                self.on_change(paths)
            except Exception:  # noqa: BLE001 - a failed refresh must not stop the watching
                log.exception("store change handler failed")


def watch_before_first_read(engine: Engine, on_change: Callable[[set[str]], None]) -> StoreWatcher:
    """A long-lived server's watcher of ``engine``'s store, started (the quiet period of
    ``watch_quiet_ms``; a whole re-read whenever a watch is put in place, except the first when
    the engine's first read waited for it). The engine's first read looks at the store once the
    watch is in place: it then needs no whole re-read after it (0.8 s at 10,000 models, right when
    the first requests come). The wait overlaps the read's own start (its parse cache is loaded
    first)."""
    watcher = StoreWatcher(
        engine.location, on_change, quiet_ms=watch_quiet_ms(), catch_up=True, first_read_waits=True
    )
    watcher.start()

    def wait() -> None:
        if not watcher.wait_in_place(WATCH_IN_PLACE_S):
            log.info("reading the store before its watch is in place; it is read again once it is")

    engine.before_first_read = wait
    return watcher
