"""One lane of embedding work: a queue of texts kept in step with one ``VectorIndex`` and one table.

The worker (``embed/worker.py``) runs two lanes on one thread: the entities (SLayer's
``embeddings`` table, the dense channel) and their parts (facets and memory pieces, our own
``part_vectors`` table). A lane owns everything about its texts and nothing about threads: its
queue (``WorkQueue``, most useful kinds first), the backfill drawn a page at a time, removals and
their tombstones, retries and failures, and its counters; the worker asks it for the next job and
runs it.

A job of texts is a *window* of up to ``window`` items. Texts the index already holds with the
same content hash are skipped; a text whose hash any row of the same model already carries (here
or in a lane it borrows from: a memory's meaning is its main text) takes that vector; a row the
table holds for the id with that hash is reused; the rest is embedded once per distinct text
(warehouses repeat ``id``, ``created_at``, ``customer_id`` thousands of times), in provider calls
of ``batch_size`` texts of similar length (little padding), each written to the index and the table
as soon as it is done: stopping loses at most the call in flight.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sized
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from slayer_lsp.embed.index import VectorIndex
from slayer_lsp.embed.priority import WorkQueue, priority
from slayer_lsp.embed.providers import EmbeddingProvider, ProviderUnavailableError
from slayer_lsp.embed.report import PartsStatus
from slayer_lsp.embed.store import (
    SLAYER_KINDS,
    MemoryStore,
    NewVector,
    VectorStore,
    VectorStoreError,
    content_hash,
)
from slayer_lsp.texts.parts import SEPARATORS
from slayer_lsp.texts.statements import EmbedItem

log = logging.getLogger(__name__)

Items = Iterable[EmbedItem]
PULL = "pull"  # the job of drawing the next backfill page


@dataclass(frozen=True, slots=True)
class LaneConfig:
    """How one lane takes, embeds, retries and pages its work."""

    kinds: frozenset[str] | None = SLAYER_KINDS  # kinds it takes (None: any, e.g. part kinds)
    separators: tuple[str, ...] = (".",)  # what separates an id from its descendants' (removals)
    prune: bool = False  # a complete backfill drops the rows it did not produce
    batch_size: int = 32  # texts per provider call
    window: int = 256  # texts taken off the queue at once: deduplicated, then sorted by length
    page: int = 500  # backfill items drawn at a time (when the queue runs low)
    load_page: int = 2000  # stored rows read at a time
    max_attempts: int = 4  # provider calls (and table writes) per batch before it counts as failed
    backoff: float = 0.5  # seconds before the first retry, doubled each time
    max_backoff: float = 30.0
    pause: float = 0.0  # seconds slept after each provider call, leaving the CPU to others

    def __post_init__(self) -> None:
        for name in ("batch_size", "window", "page", "load_page", "max_attempts"):
            object.__setattr__(self, name, max(1, getattr(self, name)))


ENTITY_LANE = LaneConfig()
# parts: any kind, an owner's removal takes "<owner>#..." too, and a full backfill prunes rows of
# entities deleted while no daemon ran
PART_LANE = LaneConfig(kinds=None, separators=SEPARATORS, prune=True)


def under(canonical_id: str, roots: list[str], separators: tuple[str, ...] = (".",)) -> bool:
    """Whether ``canonical_id`` is one of ``roots`` or a descendant (never a character prefix)."""
    return any(
        canonical_id == r or canonical_id.startswith(tuple(r + sep for sep in separators)) for r in roots
    )


@dataclass(slots=True)
class _Backfill:
    items: Iterator[EmbedItem]
    total: int | None
    page: int
    seq: int  # enqueues and removals after this one win over the backfill's (older) items
    consumed: int = 0
    seen: set[str] | None = None  # ids the backfill produced (kept when it prunes the rest)
    failed: bool = False


@dataclass(slots=True)
class _Op:
    kind: str  # "delete" | "delete_ids" | "switch" | "reload"
    arg: Any = None


@dataclass(slots=True)
class _Group:
    """Items of one window that share a text: embedded once."""

    digest: str
    items: list[EmbedItem] = field(default_factory=list)


Job = _Op | list[EmbedItem] | str
Row = tuple[EmbedItem, str, np.ndarray]


class Lane:
    """Texts of one vector table kept in step with one ``VectorIndex``.

    ``cond`` is the lock the lane shares with its worker (one thread runs every lane's jobs);
    ``items``, when given, is called for everything to embed at start and after a model switch;
    ``switch`` lets this lane's model replace another model's vectors (else it waits, blocked);
    ``reuse_from``: indexes whose vector of an identical text is taken instead of embedding it."""

    def __init__(
        self,
        name: str,
        store: VectorStore | MemoryStore,
        provider: EmbeddingProvider,
        config: LaneConfig,
        cond: threading.Condition,
        *,
        index: VectorIndex | None = None,
        items: Callable[[], Items] | None = None,
        switch: bool = False,
    ) -> None:
        if index is not None and index.model != provider.name:
            if not switch:
                raise ValueError(
                    f"the index holds vectors of {index.model}, the provider is {provider.name}; "
                    f"pass switch_model=True to replace them"
                )
            index.clear(model=provider.name, dim=provider.dim)
        self.name = name
        self.store = store
        self.provider = provider
        self.config = config
        self.index = index if index is not None else VectorIndex(provider.name, provider.dim)
        self.reuse_from: tuple[VectorIndex, ...] = ()
        self._items_source = items
        self._switch = switch
        self._cond = cond

        self._queue = WorkQueue()
        self._ops: deque[_Op] = deque()
        self._inflight: dict[str, EmbedItem] = {}
        self._failed: dict[str, tuple[EmbedItem, str]] = {}
        self._backfill: _Backfill | None = None
        self._seq = 0
        self._touched: dict[str, int] = {}  # id -> seq of its last enqueue or removal
        self._tombstones: list[tuple[int, str]] = []  # (seq, root) of removals
        self._batch_seq = 0
        self.state = "starting"
        self.started = False  # its start-up ran (or is running)
        self.blocked = False
        self.busy = False  # a job of this lane is running
        self.stopping = False
        self.last_error: str | None = None
        self.other_models: dict[str, int] = {}
        self.embedded = 0  # texts the provider embedded
        self.reused = 0  # vectors taken instead of embedding (stored, or of an identical text)
        self.skipped = 0  # texts found current (the index held their hash)
        self.retries = 0

    @property
    def batch_size(self) -> int:
        return self.config.batch_size

    # ------------------------------------------------------------------ producers

    def enqueue(self, canonical_id: str, kind: str, text: str, accept_hashes: tuple[str, ...] = ()) -> None:
        """Queue one text (a newer text for the same id replaces a queued older one)."""
        self.enqueue_many([EmbedItem(canonical_id, kind, text, accept_hashes)])

    def enqueue_many(self, items: Items) -> None:
        batch = list(items)
        kinds = self.config.kinds
        for item in batch:
            if kinds is not None and item.kind not in kinds:
                raise ValueError(
                    f"cannot embed {item.canonical_id!r}: kind {item.kind!r} is not one of "
                    f"{', '.join(sorted(kinds))}"
                )
        with self._cond:
            for item in batch:
                self._seq += 1
                if self._backfill is not None:
                    self._touched[item.canonical_id] = self._seq
                self._failed.pop(item.canonical_id, None)
                self._queue.put(item)
            self._cond.notify_all()

    def backfill(self, items: Items, page: int | None = None) -> None:
        """Embed everything in ``items`` that is not current, a page at a time (replaces a
        backfill still running). Texts enqueued or removed later win over the backfill's."""
        total = len(items) if isinstance(items, Sized) else None
        with self._cond:
            self._seq += 1
            self._touched.clear()
            self._backfill = _Backfill(
                iter(items),
                total,
                page or self.config.page,
                self._seq,
                seen=set() if self.config.prune else None,
            )
            self._cond.notify_all()

    def remove(self, canonical_id: str, *, from_store: bool = True) -> None:
        """Forget an entity and its descendants: queue, index now, the table's rows (every model,
        as SLayer cascades) in order with the writes. ``memory:4`` never touches ``memory:42``."""
        roots = [canonical_id]
        separators = self.config.separators
        with self._cond:
            self._seq += 1
            self._tombstones.append((self._seq, canonical_id))
            for cid in [c for c in self._queue if under(c, roots, separators)]:
                self._queue.pop(cid)
            for cid in [c for c in self._failed if under(c, roots, separators)]:
                del self._failed[cid]
            if from_store:
                self._ops.append(_Op("delete", canonical_id))
            self._cond.notify_all()
        self.index.remove_subtree(canonical_id, separators)

    def set_parts(self, owner: str, items: Items) -> None:
        """Make ``items`` the parts of ``owner`` (ids ``<owner>#<part>``): they are queued (an
        unchanged text is skipped by its hash), and parts of ``owner`` held or queued but no longer
        among them are dropped from the index and the table."""
        batch = [item for item in items if item.canonical_id.rpartition("#")[0] == owner]
        keep = {item.canonical_id for item in batch}
        prefix = owner + "#"
        with self._cond:
            stale = {c for c in self._queue if c.startswith(prefix) and "#" not in c[len(prefix) :]}
            stale.update(self.index.parts_of(owner))
            stale -= keep
            for cid in sorted(stale):
                self._seq += 1
                self._tombstones.append((self._seq, cid))
                self._queue.pop(cid)
                self._failed.pop(cid, None)
                if self._backfill is not None:
                    self._touched[cid] = self._seq
            if stale:
                self._ops.append(_Op("delete_ids", sorted(stale)))
                self._cond.notify_all()
        for cid in stale:
            self.index.remove(cid)
        self.enqueue_many(batch)

    def retry_failed(self) -> int:
        """Queue again every text that failed; returns how many."""
        with self._cond:
            items = [item for item, _ in self._failed.values()]
            self._failed.clear()
        self.enqueue_many(items)
        return len(items)

    def switch_model(self, provider: EmbeddingProvider) -> None:
        """Make ``provider`` the index's model: the old model's vectors leave memory (the table
        keeps them, inert), stored rows of the new model are loaded, and everything is embedded
        again (from ``items`` when given, plus whatever is queued)."""
        with self._cond:
            self._ops.append(_Op("switch", provider))
            self._cond.notify_all()

    def reload(self) -> None:
        """Read the table again (e.g. after SLayer wrote rows of our model) into the index."""
        with self._cond:
            self._ops.append(_Op("reload"))
            self._cond.notify_all()

    # ------------------------------------------------------------------ readers

    def idle(self) -> bool:
        """Under the lock: nothing left to do without outside help (queue drained, or blocked)."""
        if self.stopping:
            return True
        if self.busy or self._ops or self.state in ("starting", "loading"):
            return False
        return self.blocked or (not self._queue and self._backfill is None)

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until this lane is idle (see ``idle``); False when ``timeout`` passed first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while not self.idle():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def pending(self) -> int:
        """Under the lock: texts queued, in flight, and not yet drawn from a sized backfill."""
        pending = len(self._queue) + len(self._inflight)
        if self._backfill is not None and self._backfill.total is not None:
            pending += max(0, self._backfill.total - self._backfill.consumed)
        return pending

    def failed_count(self) -> int:
        with self._cond:
            return len(self._failed)

    def failures(self) -> dict[str, str]:
        """The error of each failed text, by canonical id."""
        with self._cond:
            return {cid: err for cid, (_, err) in self._failed.items()}

    def parts_status(self) -> PartsStatus:
        """This lane's counters as the part vectors of a dense channel."""
        kinds = self.index.kind_counts()
        with self._cond:
            rows = self.index.reachable_count() if self.index.restricted else len(self.index)
            return PartsStatus(
                state=self.state,
                rows=rows,
                embedded=self.embedded,
                reused=self.reused,
                pending=self.pending(),
                failed=len(self._failed),
                last_error=self.last_error,
                store=str(self.store.path),
                kinds=dict(sorted(kinds.items())),
            )

    # ------------------------------------------------------------------ the worker's side

    def next_job(self) -> Job | None:
        """Under the lock: the next control op, else a backfill page to draw when the queue runs
        low, else a window of texts (most useful kinds first); None when there is nothing to do."""
        if self.stopping:
            return None
        if self._ops:
            return self._ops.popleft()
        if self.blocked:
            return None
        if len(self._queue) < self.config.batch_size and self._backfill is not None:
            return PULL
        if not self._queue:
            return None
        window = self._queue.take(self.config.window)
        for item in window:
            self._inflight[item.canonical_id] = item
        self.state = "embedding"
        return window

    def run_job(self, job: Job) -> None:
        """Run one job (outside the lock)."""
        if job == PULL:
            self._pull_page()
        elif isinstance(job, list):
            self._process(job)
        elif isinstance(job, _Op):
            if job.kind == "delete":
                self._with_store_retries(lambda: self.store.delete(job.arg), "delete")
            elif job.kind == "delete_ids":
                self._with_store_retries(lambda: self.store.delete_many(job.arg), "delete")
            elif job.kind == "switch":
                self._do_switch(job.arg)
            elif job.kind == "reload":
                self._load_rows()

    def finish_job(self, job: Job) -> None:
        """Under the lock, after ``run_job``: forget what was in flight, settle the state."""
        self.busy = False
        if isinstance(job, list):
            for item in job:
                self._inflight.pop(item.canonical_id, None)
        if self.blocked:
            self.state = "blocked"
        elif not self._queue and not self._ops and self._backfill is None:
            self.state = "idle"

    def settle(self) -> None:
        """Under the lock, when the worker finds nothing to do: report blocked or idle."""
        if self.started and not self.busy:
            self.state = "blocked" if self.blocked else "idle"

    def start_up(self, hold: bool = False) -> None:
        """Load the provider, decide whether to wait for a model switch (``hold``: the owning lane
        waits), read the stored rows, and start the backfill."""
        with self._cond:
            self.started = True
            self.state = "loading"
        load = getattr(self.provider, "load", None)
        if callable(load):
            try:
                load()
            except Exception as exc:  # reported; every batch will fail fast with the same message
                self._note_error(str(exc))
        try:
            counts = self.store.model_counts()
        except VectorStoreError as exc:
            self._note_error(str(exc))
            counts = {}
        superseded = [m for m in getattr(self.provider, "supersedes", ()) if counts.get(m)]
        others = {m: n for m, n in counts.items() if m != self.provider.name and m not in superseded}
        blocked = (bool(others) and not counts.get(self.provider.name) and not self._switch) or hold
        with self._cond:
            self.other_models = others
            self.blocked = blocked
        if superseded and not hold:
            # an earlier form of this model: never compared with ours, redone for nothing but CPU
            # time, so its rows make room at once (400 MB of them at 1,000 models) rather than wait
            for model in superseded:
                self._with_store_retries(partial(self.store.delete_model, model), "delete")
                log.info(
                    "embedding %s: the rows of %s, which %s supersedes, deleted",
                    self.name,
                    model,
                    self.provider.name,
                )
        if not blocked:
            self._load_rows(settle=False)
        if self._items_source is not None:
            self.backfill(self._items_source())
        with self._cond:  # idle only now: a waiter must not slip in between the rows and the backfill
            self.state = "idle"
            self._cond.notify_all()

    def note_error(self, message: str) -> None:
        self._note_error(message)

    # ------------------------------------------------------------------ jobs

    def _load_rows(self, settle: bool = True) -> None:
        """Stored rows of our model into the index, page by page (rows of the wrong width are
        skipped with a warning; their entities get embedded again). ``settle``: report idle after."""
        model = self.provider.name
        with self._cond:
            self.state = "loading"
        total = self.store.count(model)
        self.index.reserve(total)
        rejected = 0
        for page in self.store.iter_pages(
            model, page=self.config.load_page, dim=self.index.dim or self.provider.dim
        ):
            rejected += len(page.rejected)
            if page.ids and page.matrix is not None:
                for warning in self.index.upsert_many(page.ids, page.kinds, page.matrix, page.hashes):
                    self._note_error(warning)
            if self.stopping:
                break
        self.index.arrange()  # pages come kind by kind; a row rewritten meanwhile may not: lay it with its kind
        if rejected:
            self._note_error(
                f"{rejected} stored vector(s) of {model} were unreadable or of another "
                f"dimension; they will be embedded again"
            )
        log.info(
            "embedding %s: %d vectors of %s loaded from %s",
            self.name,
            len(self.index),
            model,
            self.store.path,
        )
        if settle:
            with self._cond:
                self.state = "idle"

    def _do_switch(self, provider: EmbeddingProvider) -> None:
        with self._cond:
            self.provider = provider
            self._switch = True
            self.blocked = False
            self._failed.clear()
            self.last_error = None
        self.index.clear(model=provider.name, dim=provider.dim)
        self._load_rows()
        if self._items_source is not None:
            self.backfill(self._items_source())

    def _pull_page(self) -> None:
        with self._cond:
            bf = self._backfill
        if bf is None:
            return
        page: list[EmbedItem] = []
        exhausted = False
        try:
            for item in bf.items:
                page.append(item)
                if len(page) >= bf.page:
                    break
            else:
                exhausted = True
        except Exception as exc:  # a failing item source ends the backfill, reported
            self._note_error(f"backfill: {exc}")
            exhausted = bf.failed = True
        kinds, separators = self.config.kinds, self.config.separators
        with self._cond:
            bf.consumed += len(page)
            if self._backfill is bf:
                roots = [root for seq, root in self._tombstones if seq > bf.seq]
                for item in page:
                    cid = item.canonical_id
                    if bf.seen is not None:
                        bf.seen.add(cid)
                    if (
                        (kinds is not None and item.kind not in kinds)
                        or cid in self._touched
                        or under(cid, roots, separators)
                    ):
                        continue
                    current = self.index.hash_of(cid)
                    if cid in self._queue:
                        continue
                    if current is not None and (
                        current == content_hash(item.text) or current in item.accept_hashes
                    ):
                        self.skipped += 1
                        continue
                    self._queue.put(item)
                if exhausted:
                    self._backfill = None
                    if bf.seen is not None and not bf.failed:
                        self._prune(bf.seen)
                    self._touched.clear()
            self._cond.notify_all()

    def _prune(self, seen: set[str]) -> None:
        """Under the lock, at the end of a complete backfill: drop the rows it did not produce and
        nothing touched since (parts of entities deleted or changed while no worker ran)."""
        stale = [
            cid
            for cid in self.index.ids()
            if cid not in seen and cid not in self._touched and cid not in self._queue
        ]
        if not stale:
            return
        for cid in stale:
            self.index.remove(cid)
        self._ops.append(_Op("delete_ids", stale))
        log.info("embedding %s: %d stale rows pruned from %s", self.name, len(stale), self.store.path)

    def _process(self, window: list[EmbedItem]) -> None:
        with self._cond:
            start_seq = self._batch_seq = self._seq
            # Removals before this window matter only to a backfill that started before them.
            keep_after = min(start_seq, self._backfill.seq if self._backfill is not None else start_seq)
            self._tombstones = [t for t in self._tombstones if t[0] > keep_after]
        model = self.provider.name
        todo: list[tuple[EmbedItem, str]] = []
        borrowed: list[Row] = []
        for item in window:
            digest = content_hash(item.text)
            current = self.index.hash_of(item.canonical_id)
            if current is not None and (current == digest or current in item.accept_hashes):
                self.skipped += 1
                continue
            vec = self._borrow(digest)
            if vec is not None:
                borrowed.append((item, digest, vec))
            else:
                todo.append((item, digest))
        if borrowed and self._to_index(borrowed, start_seq):
            self.reused += len(borrowed)
            self._write(model, borrowed)
        if not todo:
            return
        try:
            stored = self.store.get(model, [item.canonical_id for item, _ in todo])
        except VectorStoreError as exc:
            self._note_error(str(exc))
            stored = {}
        dim = self.index.dim or self.provider.dim
        reuse: list[Row] = []
        groups: dict[str, _Group] = {}
        for item, digest in todo:
            row = stored.get(item.canonical_id)
            if (
                row is not None
                and (row.content_hash == digest or row.content_hash in item.accept_hashes)
                and (dim is None or row.vector.shape[0] == dim)
            ):
                reuse.append((item, row.content_hash, row.vector))
            else:
                groups.setdefault(digest, _Group(digest)).items.append(item)
        if reuse:
            self._to_index(reuse, start_seq)
            self.reused += len(reuse)
        # one provider call per batch of texts of about the same length (most useful kinds first)
        ordered = sorted(groups.values(), key=lambda g: (priority(g.items[0].kind), len(g.items[0].text)))
        size = self.config.batch_size
        for start in range(0, len(ordered), size):
            if self.stopping:
                return  # not embedded, not written: the next run takes them up
            done = self._live(self._embed(ordered[start : start + size]), start_seq)
            if done and self._to_index(done, start_seq):
                self._write(model, done)
            self._rest()

    def _borrow(self, digest: str) -> np.ndarray | None:
        """A vector of this text already held, here or in a lane this one borrows from (same model)."""
        for index in (self.index, *self.reuse_from):
            if index.model == self.provider.name:
                vec = index.vector_with_hash(digest)
                if vec is not None:
                    return vec
        return None

    def _write(self, model: str, rows: list[Row]) -> None:
        vectors = [NewVector(item.canonical_id, item.kind, digest, vec) for item, digest, vec in rows]
        self._with_store_retries(lambda: self.store.upsert(model, vectors), "write")

    def _rest(self) -> None:
        """Leave the CPU to others for ``pause`` seconds after a provider call (unless stopping)."""
        pause = self.config.pause
        if pause <= 0:
            return
        with self._cond:
            deadline = time.monotonic() + pause
            while not self.stopping:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)

    def _live(self, done: list[Row], start_seq: int) -> list[Row]:
        """Drop results for ids removed (or replaced) while their window was being embedded."""
        with self._cond:
            roots = [root for seq, root in self._tombstones if seq > start_seq]
            return [row for row in done if not under(row[0].canonical_id, roots, self.config.separators)]

    def _to_index(self, rows: list[Row], start_seq: int) -> bool:
        rows = self._live(rows, start_seq)
        if not rows:
            return False
        warnings = self.index.upsert_many(
            [i.canonical_id for i, _, _ in rows],
            [i.kind for i, _, _ in rows],
            np.stack([v for _, _, v in rows]),
            [h for _, h, _ in rows],
        )
        if warnings:
            with self._cond:
                for item, _, _ in rows:
                    self._failed[item.canonical_id] = (item, warnings[0])
            self._note_error(warnings[0])
            return False
        return True

    def _embed(self, groups: list[_Group]) -> list[Row]:
        """Embed one text per group with retries and backoff, the vector going to every item of
        the group; a batch that still fails with a non-transient error is tried text by text once,
        so one bad input does not sink its neighbours."""
        result = self._attempts([g.items[0].text for g in groups], self.config.max_attempts)
        if isinstance(result, np.ndarray):
            return self._fan_out(groups, result)
        if (
            len(groups) > 1
            and not getattr(result, "retryable", False)
            and not isinstance(result, ProviderUnavailableError)
        ):
            out: list[Row] = []
            for group in groups:
                single = self._attempts([group.items[0].text], 1)
                if isinstance(single, np.ndarray):
                    out.extend(self._fan_out([group], single))
                else:
                    self._fail([group], single)
            return out
        self._fail(groups, result)
        return []

    def _fan_out(self, groups: list[_Group], vectors: np.ndarray) -> list[Row]:
        self.embedded += len(groups)
        rows = [(item, g.digest, vectors[i]) for i, g in enumerate(groups) for item in g.items]
        self.reused += len(rows) - len(groups)  # the copies of a text embedded once
        return rows

    def _fail(self, groups: list[_Group], error: BaseException) -> None:
        message = f"{type(error).__name__}: {error}"
        with self._cond:
            roots = [root for seq, root in self._tombstones if seq > self._batch_seq]
            for group in groups:
                for item in group.items:
                    cid = item.canonical_id
                    if cid not in self._queue and not under(cid, roots, self.config.separators):
                        self._failed[cid] = (item, message)  # not queued again, not removed
        self._note_error(message)

    def _attempts(self, texts: list[str], attempts: int) -> np.ndarray | BaseException:
        error: BaseException = RuntimeError("not attempted")
        for attempt in range(attempts):
            try:
                out = np.asarray(self.provider.embed(texts), dtype=np.float32)
                if out.ndim != 2 or out.shape[0] != len(texts) or not np.isfinite(out).all():
                    raise ValueError(f"the provider returned a {out.shape} result for {len(texts)} texts")
                return out
            except ProviderUnavailableError as exc:
                return exc
            except Exception as exc:  # every provider failure is retried, then reported
                error = exc
                self.retries += 1
                self._note_error(f"{type(exc).__name__}: {exc}")
                if attempt + 1 < attempts and not self._backoff(attempt):
                    break
        return error

    def _backoff(self, attempt: int) -> bool:
        """Wait before retry ``attempt + 1``; False when the worker is stopping."""
        delay = min(self.config.max_backoff, self.config.backoff * (2**attempt))
        with self._cond:
            self.state = "retrying"
            deadline = time.monotonic() + delay
            while not self.stopping:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            self.state = "embedding"
            return not self.stopping

    def _with_store_retries(self, action: Callable[[], object], what: str) -> None:
        for attempt in range(self.config.max_attempts):
            try:
                action()
                return
            except (VectorStoreError, ValueError) as exc:
                self._note_error(f"{what}: {exc}")
                if (
                    isinstance(exc, ValueError)
                    or attempt + 1 >= self.config.max_attempts
                    or not self._backoff(attempt)
                ):
                    return

    def _note_error(self, message: str) -> None:
        log.warning("embedding %s: %s", self.name, message)
        with self._cond:
            self.last_error = message
