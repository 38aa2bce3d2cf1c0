"""Watch a store for changes on a background thread and report them, debounced.

A YAML store is watched recursively (SLayer's dot-prefixed temp files, its lock files and the
embeddings database are ignored: only the atomic rename that lands a document counts). A SQLite
store is watched through its directory, for the database file and its ``-journal``/``-wal``. A store
that does not exist yet is watched through its nearest existing parent until it appears. The
callback runs on the watcher thread, so it may do blocking work (re-reading the store) without
touching the server's event loop.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

from slayer_lsp.store.locate import StoreLocation

log = logging.getLogger(__name__)

IGNORED_NAMES = ("embeddings.db", "embeddings.db-journal", "embeddings.db-wal", "embeddings.db-shm")


class StoreWatcher:
    def __init__(self, location: StoreLocation, on_change: Callable[[set[str]], None], *, quiet_ms: int = 100,
                 max_wait_ms: int = 1000, force_polling: bool | None = None):
        self.location = location
        self.on_change = on_change
        self.quiet_ms = quiet_ms
        self.max_wait_ms = max_wait_ms
        self.force_polling = force_polling
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.watching: Path | None = None  # the directory being watched right now

    # ----- lifecycle

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="slayer-store-watch", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        self._thread = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

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
                store.name, f"{store.name}-journal", f"{store.name}-wal")
        try:
            rel = path.relative_to(store)
        except ValueError:
            return path == store or store.is_relative_to(path)  # the store (or a parent) appeared/vanished
        if any(part.startswith(".") for part in rel.parts):
            return False  # SLayer writes dot-prefixed temp files, then renames them into place
        return rel.name not in IGNORED_NAMES and not rel.name.endswith(".lock")

    # ----- the thread

    def _run(self) -> None:
        from watchfiles import watch

        while not self._stop.is_set():
            directory, present = self._target()
            self.watching = directory
            log.info("watching %s for store changes (%s)", directory, self.location)
            try:
                for changes in watch(directory, watch_filter=lambda _c, p: self._relevant(p), debounce=self.max_wait_ms,
                                     step=self.quiet_ms, stop_event=self._stop, rust_timeout=1000,
                                     yield_on_timeout=False, raise_interrupt=False,
                                     recursive=self.location.backend == "yaml" or not present,
                                     force_polling=self.force_polling, ignore_permission_denied=True):
                    paths = {p for _, p in changes}
                    try:
                        self.on_change(paths)
                    except Exception:  # noqa: BLE001 - a failed refresh must not stop the watching
                        log.exception("store change handler failed")
                    if self._target() != (directory, present):
                        break  # the store appeared or vanished: re-target
                self._stop.wait(0.05)
            except Exception as exc:  # noqa: BLE001 - the directory vanished under the watcher, ...
                log.warning("store watcher restarting after: %s", exc)
                self._stop.wait(0.5)
