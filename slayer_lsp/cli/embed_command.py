"""``slayer-lsp embed``: embed what is missing, with progress, and stop cleanly on Ctrl-C.

Every provider call's vectors are written to the tables as soon as they are made, and a start
embeds only what the tables lack (or hold for another text), so an interrupted run loses at most
the call in flight and the next run picks up where it stopped. On a terminal the progress is one
redrawn line (a bar, texts per second, time left); otherwise a plain line every few seconds.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from slayer_lsp.embed.worker import EmbeddingWorker
    from slayer_lsp.engine import Engine

INTERRUPTED = 130  # the shell's code for a command stopped by SIGINT
BAR = 24


def duration(seconds: float) -> str:
    """``3h05m``, ``7m12s``, ``42s``."""
    s = int(max(0.0, seconds) + 0.5)
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


@dataclass
class ProgressView:
    """Draws the worker's progress on ``stream``: a redrawn bar on a terminal, else plain lines
    (at most one per ``every`` seconds). ``totals``: texts per lane, known up front."""

    stream: TextIO
    totals: dict[str, int]
    tty: bool = False
    every: float = 5.0
    _marks: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=64))
    _last: float = float("-inf")
    _drawn: bool = False

    def update(self, done: dict[str, int], now: float, *, force: bool = False) -> None:
        total = sum(self.totals.values())
        finished = sum(min(done.get(lane, 0), n) for lane, n in self.totals.items())
        self._marks.append((now, finished))
        if not force and now - self._last < (0.25 if self.tty else self.every):
            return
        self._last = now
        rate = self.rate(now)
        left = total - finished
        eta = f"ETA {duration(left / rate)}" if rate > 0 and left > 0 else ("done" if left <= 0 else "ETA ?")
        lanes = ", ".join(f"{lane} {min(done.get(lane, 0), n):,}/{n:,}" for lane, n in self.totals.items())
        if self.tty:
            share = finished / total if total else 1.0
            filled = int(share * BAR)
            line = (
                f"\r[{'#' * filled}{'.' * (BAR - filled)}] {share:4.0%} {lanes}, "
                f"{rate:,.0f} texts/s, {eta}\x1b[K"
            )
            self._drawn = True
        else:
            line = f"embedding: {lanes}; {rate:,.0f} texts/s; {eta}\n"
        self.stream.write(line)
        self.stream.flush()

    def rate(self, now: float) -> float:
        """Texts a second over the last ~20 s."""
        while len(self._marks) > 2 and now - self._marks[0][0] > 20:
            self._marks.popleft()
        (t0, d0), (t1, d1) = self._marks[0], self._marks[-1]
        return (d1 - d0) / (t1 - t0) if t1 > t0 else 0.0

    def end(self) -> None:
        if self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False


def lane_totals(engine: Engine, worker: EmbeddingWorker) -> dict[str, int]:
    """Texts each lane has to go through: every searchable entity, and every part of them."""
    from slayer_lsp.embed.priority import RankedParts

    totals = {"entities": len(engine.catalog.searchable_ids())}
    if worker.parts is not None:
        totals["parts"] = len(RankedParts(engine.catalog))
    return totals


def run_embed(
    engine: Engine, out: TextIO = sys.stdout, err: TextIO = sys.stderr, *, tick: float = 0.2
) -> int:
    """Wait for the engine's worker to embed everything, drawing progress on ``err``; Ctrl-C stops
    it after the provider call in flight (whose vectors are kept) and returns ``INTERRUPTED``."""
    worker = engine.dense
    if worker is None:
        print("slayer-lsp: error: the embedding channel is unavailable (see the log above)", file=err)
        return 2
    view = ProgressView(err, {}, tty=_isatty(err))
    interrupted = False
    try:
        view.totals = lane_totals(engine, worker)
        while not (
            worker.wait_idle(timeout=tick) and (worker.parts is None or worker.parts.wait_idle(timeout=tick))
        ):
            view.update(_done(worker), time.monotonic())
        view.update(_done(worker), time.monotonic(), force=True)
    except KeyboardInterrupt:
        interrupted = True
        view.end()
        print(
            "interrupted: finishing the batch in flight; the vectors made so far are kept "
            "(run `slayer-lsp embed` again to embed the rest)",
            file=err,
            flush=True,
        )
    view.end()
    try:
        engine.close()  # waits for the provider call in flight, whose vectors are written
    except KeyboardInterrupt:  # a second Ctrl-C: leave now (every write so far is committed)
        return INTERRUPTED
    st = worker.status()
    print(
        f"{st.model}: {st.rows} rows, {st.embedded} embedded now, {st.reused} reused, {st.failed} failed"
        + (f" (last error: {st.last_error})" if st.last_error else ""),
        file=out,
    )
    if st.parts is not None:
        print(
            f"part vectors (facets): {st.parts.rows} rows, {st.parts.embedded} embedded now, "
            f"{st.parts.reused} reused, {st.parts.failed} failed",
            file=out,
        )
    if interrupted:
        return INTERRUPTED
    for w in st.warnings():
        print(f"warning: {w}", file=err)
    return 1 if st.failed or st.state == "blocked" else 0


def _done(worker: EmbeddingWorker) -> dict[str, int]:
    return {lane: done for lane, (done, _) in worker.progress().per_lane.items()}


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or bare stream
        return False
