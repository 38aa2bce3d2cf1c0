"""A watchdog for hostile-input tests: a call that must answer in time fails the test instead of
hanging it (the work is expected to take a small fraction of the bound; super-linear or runaway
work would take hours)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


def within(seconds: float, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` on a thread, re-raising what it raises; the test fails when it has not
    returned after ``seconds``."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - re-raised on the test's thread
            box["error"] = exc

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"{getattr(fn, '__name__', fn)} still running after {seconds:g} s"
    if "error" in box:
        raise box["error"]
    return box["value"]
