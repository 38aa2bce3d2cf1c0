"""The embedding worker: one background thread that keeps a VectorIndex in step with the store.

Changed documents are enqueued as ``EmbedItem``s; the thread takes them in batches, skips the ones
whose text is unchanged (the index, then the store, already holds a vector of that content hash:
a row SLayer wrote for the same model is reused, not recomputed), embeds the rest, writes the rows
and updates the index in place. Provider failures are retried with exponential backoff, then
counted and kept (with the last error) for ``status()``; nothing here raises into the server.

Search never waits for the queue: ``search()`` ranks what is in the index and says in its warnings
how much is still pending. A backfill of a whole catalog is consumed a page at a time, only when the
queue runs low, so memory holds one page of texts, not the catalog's.

One model per index. Rows of other models in the shared table are inert. When the table holds
vectors of other models and none of ours, the worker does not start re-embedding everything under a
new name on its own (for a litellm model that costs money): it waits, blocked, with a warning, until
``switch_model`` (the ``--switch-model`` option) says to.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np

from slayer_lsp.embed.index import DenseHits, VectorIndex
from slayer_lsp.embed.providers import EmbeddingProvider, ProviderUnavailableError
from slayer_lsp.embed.store import (
    SLAYER_KINDS,
    MemoryStore,
    NewVector,
    VectorStore,
    VectorStoreError,
    content_hash,
)
from slayer_lsp.texts.statements import EmbedItem

if TYPE_CHECKING:
    from slayer_lsp.embed.store import StorePlace

log = logging.getLogger(__name__)

Items = Iterable[EmbedItem]


class PartsStatus(msgspec.Struct, frozen=True, kw_only=True):
    """The part-vector worker (facets, memory pieces): the same counters, per part kind."""

    state: str
    rows: int
    embedded: int
    reused: int
    pending: int
    failed: int
    last_error: str | None = None
    store: str = ""
    kinds: dict[str, int] = {}  # rows per part kind ("column#values": 268)

    def warnings(self) -> list[str]:
        out: list[str] = []
        if self.state == "blocked":
            out.append("facets: part vectors wait for the model switch of the dense channel")
        elif self.state in ("starting", "loading"):
            out.append(f"facets: still loading stored part vectors ({self.rows} so far)")
        if self.pending:
            out.append(f"facets: {self.pending} parts still waiting to be embedded; ranked the {self.rows} embedded")
        if self.failed:
            out.append(f"facets: {self.failed} parts failed to embed ({self.last_error})")
        return out


class EmbeddingStatus(msgspec.Struct, frozen=True, kw_only=True):
    """What ``slayer-lsp status`` and the daemon report about the dense channel."""

    model: str
    dim: int | None
    state: str  # starting | loading | idle | embedding | retrying | blocked | stopped
    rows: int  # vectors of ``model`` in memory, i.e. searchable
    embedded: int  # texts embedded by this worker since it started
    reused: int  # stored vectors taken as current instead of embedding again
    pending: int  # texts waiting (queued, in flight, and the rest of a running backfill)
    failed: int  # texts that failed after every retry (until enqueued again or retry_failed())
    last_error: str | None = None
    store: str = ""
    other_models: dict[str, int] = {}  # rows of other models in the table, never compared with ours
    parts: PartsStatus | None = None  # the part-vector worker, when there is one

    def warnings(self) -> list[str]:
        """One-line warnings for a search response (empty when the channel is complete and healthy)."""
        out: list[str] = []
        if self.state == "blocked":
            out.append(blocked_message(self.model, self.other_models))
        elif self.state == "loading":
            out.append(f"dense: still loading stored vectors of {self.model} ({self.rows} so far)")
        if self.pending:
            out.append(f"dense: {self.pending} entities still waiting to be embedded; "
                       f"ranked the {self.rows} embedded")
        if self.failed:
            out.append(f"dense: {self.failed} entities failed to embed ({self.last_error})")
        return out


def _under(canonical_id: str, roots: list[str], separators: tuple[str, ...] = (".",)) -> bool:
    return any(canonical_id == r or canonical_id.startswith(tuple(r + sep for sep in separators)) for r in roots)


def blocked_message(model: str, others: dict[str, int]) -> str:
    if not others:  # a scoped session does not see the other models' rows
        return (f"dense: the stored vectors were made with another model and none with {model}; switch "
                f"model (--switch-model) to embed everything with {model}")
    theirs, n = max(others.items(), key=lambda kv: kv[1])
    return (f"dense: the stored vectors were made with {theirs} ({n} rows) and none with {model}; set "
            f"SLAYER_EMBEDDING_MODEL={theirs} to use them, or switch model (--switch-model) to embed "
            f"everything with {model}")


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
    kind: str  # "delete" | "switch" | "reload"
    arg: Any = None


class EmbeddingWorker:
    """Background embedding of a store's entities into a ``VectorIndex`` and SLayer's table.

    ``location`` is a ``StoreLocation`` or a store path; ``items``, when given, is called for
    everything to embed (e.g. ``lambda: CatalogItems(current_catalog)``): at start and after a
    model switch it is backfilled. ``switch_model=True`` lets this provider's model replace the
    vectors of another (in memory) and embed everything again. ``start=False`` leaves the thread
    to ``start()``.

    The part-vector worker (``embed.parts``) is the same class over our own table: ``kinds=None``
    (any kind), ``separators=(".", "#")`` (an owner's removal takes its parts), ``prune=True``
    (rows a finished backfill did not produce are dropped: parts of entities deleted while no
    daemon ran), ``reuse_from`` (an index whose vector of the owner is taken when the part's text
    is the owner's own, e.g. a memory's ``meaning``). The dense channel's worker holds it as
    ``parts``: it starts it the first time it has nothing left to do (held, when it is itself
    blocked), stops it and switches its model with its own."""

    def __init__(self, location: StorePlace, provider: EmbeddingProvider, *, index: VectorIndex | None = None,
                 store: VectorStore | MemoryStore | None = None, items: Callable[[], Items] | None = None,
                 switch_model: bool = False, batch_size: int = 32, max_attempts: int = 4,
                 backoff: float = 0.5, max_backoff: float = 30.0, page: int = 500, load_page: int = 2000,
                 query_cache: int = 256, start: bool = True, kinds: frozenset[str] | None = SLAYER_KINDS,
                 separators: tuple[str, ...] = (".",), prune: bool = False,
                 reuse_from: VectorIndex | None = None, parts: EmbeddingWorker | None = None) -> None:
        self.store = store if store is not None else VectorStore.for_store(location)
        self.provider = provider
        if index is not None and index.model != provider.name:
            if not switch_model:
                raise ValueError(f"the index holds vectors of {index.model}, the provider is {provider.name}; "
                                 f"pass switch_model=True to replace them")
            index.clear(model=provider.name, dim=provider.dim)
        self.index = index if index is not None else VectorIndex(provider.name, provider.dim)
        self._items_source = items
        self._switch = switch_model
        self.kinds = kinds
        self.separators = separators
        self.prune = prune
        self.reuse_from = reuse_from
        self.parts = parts
        if parts is not None and parts.reuse_from is None:
            parts.reuse_from = self.index  # a part whose text is its owner's own takes the owner's vector
        self._hold = False  # blocked from the start (set by an owning worker that is blocked)
        self.batch_size = max(1, batch_size)
        self.max_attempts = max(1, max_attempts)
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.page = max(1, page)
        self.load_page = max(1, load_page)

        self._cond = threading.Condition()
        self._queue: OrderedDict[str, EmbedItem] = OrderedDict()
        self._ops: deque[_Op] = deque()
        self._inflight: dict[str, EmbedItem] = {}
        self._failed: dict[str, tuple[EmbedItem, str]] = {}
        self._backfill: _Backfill | None = None
        self._seq = 0
        self._touched: dict[str, int] = {}  # id -> seq of its last enqueue or removal
        self._tombstones: list[tuple[int, str]] = []  # (seq, root) of removals
        self._state = "starting"
        self._blocked = False
        self._stop = False
        self._busy = False
        self._batch_seq = 0
        self._last_error: str | None = None
        self._other_models: dict[str, int] = {}
        self.embedded = 0
        self.reused = 0
        self.skipped = 0
        self.retries = 0
        self._query_cache: OrderedDict[tuple[str, str], np.ndarray] = OrderedDict()
        self._query_cache_size = max(0, query_cache)
        self._thread: threading.Thread | None = None
        if start:
            self.start()

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        with self._cond:
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._run, name="slayer-lsp-embed", daemon=True)
            self._thread.start()

    def close(self, timeout: float = 10.0) -> None:
        """Stop the thread (a batch being embedded is finished first, up to ``timeout``), and the
        part worker's."""
        if self.parts is not None:
            self.parts.close(timeout)
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
        self._state = "stopped"

    def __enter__(self) -> EmbeddingWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until nothing is left to do without outside help (queue drained, or blocked)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while not self._idle():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def _idle(self) -> bool:
        if self._stop:
            return True
        if self._busy or self._ops or self._state in ("starting", "loading"):
            return False
        return self._blocked or (not self._queue and self._backfill is None)

    # ------------------------------------------------------------------ producers

    def enqueue(self, canonical_id: str, kind: str, text: str, accept_hashes: tuple[str, ...] = ()) -> None:
        """Queue one text (a newer text for the same id replaces a queued older one)."""
        self.enqueue_many([EmbedItem(canonical_id, kind, text, accept_hashes)])

    def enqueue_many(self, items: Items) -> None:
        batch = list(items)
        for item in batch:
            if self.kinds is not None and item.kind not in self.kinds:
                raise ValueError(f"cannot embed {item.canonical_id!r}: kind {item.kind!r} is not one of "
                                 f"{', '.join(sorted(self.kinds))}")
        with self._cond:
            for item in batch:
                self._seq += 1
                if self._backfill is not None:
                    self._touched[item.canonical_id] = self._seq
                self._failed.pop(item.canonical_id, None)
                self._queue[item.canonical_id] = item
            self._cond.notify_all()

    def backfill(self, items: Items, page: int | None = None) -> None:
        """Embed everything in ``items`` that is not current, a page at a time (replaces a
        backfill still running). Texts enqueued or removed later win over the backfill's."""
        total = len(items) if hasattr(items, "__len__") else None  # type: ignore[arg-type]
        with self._cond:
            self._seq += 1
            self._touched.clear()
            self._backfill = _Backfill(iter(items), total, page or self.page, self._seq,
                                       seen=set() if self.prune else None)
            self._cond.notify_all()

    def remove(self, canonical_id: str, *, from_store: bool = True) -> None:
        """Forget an entity and its dotted descendants: queue, index now, the table's rows (every
        model, as SLayer cascades) in order with the writes. ``memory:4`` never touches ``memory:42``."""
        roots = [canonical_id]
        with self._cond:
            self._seq += 1
            self._tombstones.append((self._seq, canonical_id))
            for cid in [c for c in self._queue if _under(c, roots, self.separators)]:
                del self._queue[cid]
            for cid in [c for c in self._failed if _under(c, roots, self.separators)]:
                del self._failed[cid]
            if from_store:
                self._ops.append(_Op("delete", canonical_id))
            self._cond.notify_all()
        self.index.remove_subtree(canonical_id, self.separators)

    def set_parts(self, owner: str, items: Items) -> None:
        """Make ``items`` the parts of ``owner`` (ids ``<owner>#<part>``): they are queued (an
        unchanged text is skipped by its hash), and parts of ``owner`` held or queued but no longer
        among them are dropped from the index and the table."""
        batch = [item for item in items if item.canonical_id.rpartition("#")[0] == owner]
        keep = {item.canonical_id for item in batch}
        prefix = owner + "#"
        with self._cond:
            stale = {c for c in self._queue if c.startswith(prefix) and "#" not in c[len(prefix):]}
            stale.update(self.index.parts_of(owner))
            stale -= keep
            for cid in sorted(stale):
                self._seq += 1
                self._tombstones.append((self._seq, cid))
                self._queue.pop(cid, None)
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

    def switch_model(self, provider: EmbeddingProvider | None = None) -> None:
        """Make ``provider`` (default: the current one) the index's model: the old model's vectors
        leave memory (the table keeps them, inert), stored rows of the new model are loaded, and
        everything is embedded again (from ``items`` when given, plus whatever is queued)."""
        with self._cond:
            self._ops.append(_Op("switch", provider or self.provider))
            self._cond.notify_all()
        if self.parts is not None:
            self.parts.switch_model(provider)

    def reload(self) -> None:
        """Read the table again (e.g. after SLayer wrote rows of our model) into the index."""
        with self._cond:
            self._ops.append(_Op("reload"))
            self._cond.notify_all()

    # ------------------------------------------------------------------ consumers

    def status(self) -> EmbeddingStatus:
        parts = self.parts.parts_status() if self.parts is not None else None
        with self._cond:
            # a scoped session's index ranks only what it reaches: its counts say no more (the
            # table's rows of other models cannot be scoped, so they are not counted at all)
            restricted = self.index.restricted
            return EmbeddingStatus(
                model=self.provider.name, dim=self.index.dim or self.provider.dim, state=self._state,
                rows=self.index.reachable_count() if restricted else len(self.index), embedded=self.embedded,
                reused=self.reused, pending=self._pending(), failed=len(self._failed), last_error=self._last_error,
                store=str(self.store.path), other_models={} if restricted else dict(self._other_models),
                parts=parts)

    def _pending(self) -> int:
        pending = len(self._queue) + len(self._inflight)
        if self._backfill is not None and self._backfill.total is not None:
            pending += max(0, self._backfill.total - self._backfill.consumed)
        return pending

    def parts_status(self) -> PartsStatus:
        """This worker's counters as the part worker of another."""
        kinds = self.index.kind_counts()
        with self._cond:
            rows = self.index.reachable_count() if self.index.restricted else len(self.index)
            return PartsStatus(state=self._state, rows=rows, embedded=self.embedded,
                               reused=self.reused, pending=self._pending(), failed=len(self._failed),
                               last_error=self._last_error, store=str(self.store.path),
                               kinds=dict(sorted(kinds.items())))

    def failures(self) -> dict[str, str]:
        """The error of each failed text, by canonical id."""
        with self._cond:
            return {cid: err for cid, (_, err) in self._failed.items()}

    def embed_query(self, text: str) -> np.ndarray:
        """The question's vector (a small LRU cache per model). Raises the provider's error."""
        provider = self.provider
        key = (provider.name, text)
        with self._cond:
            hit = self._query_cache.get(key)
            if hit is not None:
                self._query_cache.move_to_end(key)
                return hit
        vec = np.asarray(provider.embed([text]), dtype=np.float32)[0]
        if self._query_cache_size:
            with self._cond:
                self._query_cache[key] = vec
                while len(self._query_cache) > self._query_cache_size:
                    self._query_cache.popitem(last=False)
        return vec

    def search(self, question: str, k: int = 50, allow: Iterable[str] | None = None,
               kinds: Iterable[str] | None = None) -> DenseHits:
        """Channel 3: cosine top-``k`` per kind of what is embedded now, restricted before ranking
        to ``allow``. Never raises and never waits for the queue; warnings say what is missing."""
        warnings = self.status().warnings()
        if not question or not question.strip():
            return DenseHits({}, 0, tuple(warnings))
        if len(self.index) == 0:
            return DenseHits({}, 0, tuple(warnings))
        provider = self.provider
        try:
            vec = self.embed_query(question)
        except Exception as exc:  # any provider failure is a warning, never a failed search
            warnings.append(f"dense: the question could not be embedded with {provider.name}: {exc}")
            return DenseHits({}, 0, tuple(warnings))
        # ``model`` guards a switch in between: the index then refuses to compare across models.
        hits = self.index.top_k(vec, k, allow=allow, kinds=kinds, model=provider.name)
        return DenseHits(hits.by_kind, hits.ranked, tuple(warnings) + hits.warnings)

    # ------------------------------------------------------------------ the thread

    def _run(self) -> None:
        try:
            self._start_up()
        except Exception as exc:  # a broken store or item source must not kill the thread
            log.exception("embedding worker: start-up failed")
            self._note_error(f"start-up: {exc}")
            with self._cond:
                self._state = "idle"
        while True:
            with self._cond:
                job = self._next_job()
                if job is None:
                    if self._stop:
                        return
                    if self.parts is not None and self.parts._thread is None:
                        # parts start once the main vectors are done: search's own channel first,
                        # and a memory's meaning then takes its main vector instead of a second embedding
                        self.parts.start()
                    self._state = "blocked" if self._blocked else "idle"
                    self._cond.notify_all()
                    self._cond.wait()
                    continue
                self._busy = True
            try:
                self._do(job)
            except Exception as exc:  # keep the thread alive whatever happens
                log.exception("embedding worker: job failed")
                self._note_error(str(exc))
            finally:
                with self._cond:
                    self._busy = False
                    if isinstance(job, list):
                        for item in job:
                            self._inflight.pop(item.canonical_id, None)
                    if self._blocked:
                        self._state = "blocked"
                    elif not self._queue and not self._ops and self._backfill is None:
                        self._state = "idle"
                    self._cond.notify_all()

    def _next_job(self) -> _Op | list[EmbedItem] | str | None:
        """Under the lock: the next control op, else a batch, else a backfill page to pull."""
        if self._stop:
            return None
        if self._ops:
            return self._ops.popleft()
        if self._blocked:
            return None
        if len(self._queue) < self.batch_size and self._backfill is not None:
            return "pull"
        if not self._queue:
            return None
        batch: list[EmbedItem] = []
        while self._queue and len(batch) < self.batch_size:
            _, item = self._queue.popitem(last=False)
            batch.append(item)
            self._inflight[item.canonical_id] = item
        self._state = "embedding"
        return batch

    def _do(self, job: _Op | list[EmbedItem] | str) -> None:
        if job == "pull":
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

    def _start_up(self) -> None:
        with self._cond:
            self._state = "loading"
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
        others = {m: n for m, n in counts.items() if m != self.provider.name}
        blocked = (bool(others) and not counts.get(self.provider.name) and not self._switch) or self._hold
        with self._cond:
            self._other_models = others
            self._blocked = blocked
        if self.parts is not None:  # the parts wait with us: a blocked model must not embed them either
            self.parts._hold = blocked
        if not blocked:
            self._load_rows(settle=False)
        if self._items_source is not None:
            self.backfill(self._items_source())
        with self._cond:  # idle only now: a waiter must not slip in between the rows and the backfill
            self._state = "idle"
            self._cond.notify_all()

    def _load_rows(self, settle: bool = True) -> None:
        """Stored rows of our model into the index, page by page (rows of the wrong width are
        skipped with a warning; their entities get embedded again). ``settle``: report idle after."""
        model = self.provider.name
        with self._cond:
            if self._state != "loading":
                self._state = "loading"
        total = self.store.count(model)
        self.index.reserve(total)
        rejected = 0
        for page in self.store.iter_pages(model, page=self.load_page, dim=self.index.dim or self.provider.dim):
            rejected += len(page.rejected)
            if page.ids and page.matrix is not None:
                for warning in self.index.upsert_many(page.ids, page.kinds, page.matrix, page.hashes):
                    self._note_error(warning)
            if self._stop:
                break
        if rejected:
            self._note_error(f"{rejected} stored vector(s) of {model} were unreadable or of another "
                             f"dimension; they will be embedded again")
        log.info("embedding worker: %d vectors of %s loaded from %s", len(self.index), model, self.store.path)
        if settle:
            with self._cond:
                self._state = "idle"

    def _do_switch(self, provider: EmbeddingProvider) -> None:
        with self._cond:
            self.provider = provider
            self._switch = True
            self._blocked = False
            self._failed.clear()
            self._query_cache.clear()
            self._last_error = None
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
        with self._cond:
            bf.consumed += len(page)
            if self._backfill is bf:
                roots = [root for seq, root in self._tombstones if seq > bf.seq]
                for item in page:
                    cid = item.canonical_id
                    if bf.seen is not None:
                        bf.seen.add(cid)
                    if (self.kinds is not None and item.kind not in self.kinds) or cid in self._touched \
                            or _under(cid, roots, self.separators):
                        continue
                    current = self.index.hash_of(cid)
                    if cid in self._queue or (current is not None and (
                            current == content_hash(item.text) or current in item.accept_hashes)):
                        continue
                    self._queue[item.canonical_id] = item
                if exhausted:
                    self._backfill = None
                    if bf.seen is not None and not bf.failed:
                        self._prune(bf.seen)
                    self._touched.clear()
            self._cond.notify_all()

    def _prune(self, seen: set[str]) -> None:
        """Under the lock, at the end of a complete backfill: drop the rows it did not produce and
        nothing touched since (parts of entities deleted or changed while no worker ran)."""
        stale = [cid for cid in self.index.ids()
                 if cid not in seen and cid not in self._touched and cid not in self._queue]
        if not stale:
            return
        for cid in stale:
            self.index.remove(cid)
        self._ops.append(_Op("delete_ids", stale))
        log.info("embedding worker: %d stale rows pruned from %s", len(stale), self.store.path)

    def _process(self, batch: list[EmbedItem]) -> None:
        with self._cond:
            start_seq = self._batch_seq = self._seq
            # Removals before this batch matter only to a backfill that started before them.
            keep_after = min(start_seq, self._backfill.seq if self._backfill is not None else start_seq)
            self._tombstones = [t for t in self._tombstones if t[0] > keep_after]
        model = self.provider.name
        todo: list[tuple[EmbedItem, str]] = []
        borrowed: list[tuple[EmbedItem, str, np.ndarray]] = []
        for item in batch:
            digest = content_hash(item.text)
            current = self.index.hash_of(item.canonical_id)
            if current is not None and (current == digest or current in item.accept_hashes):
                self.skipped += 1
                continue
            vec = self._borrow(item.canonical_id, digest)
            if vec is not None:
                borrowed.append((item, digest, vec))
            else:
                todo.append((item, digest))
        if borrowed and self._to_index(borrowed, start_seq):
            self.reused += len(borrowed)
            rows = [NewVector(item.canonical_id, item.kind, digest, vec) for item, digest, vec in borrowed]
            self._with_store_retries(lambda: self.store.upsert(model, rows), "write")
        if not todo:
            return
        try:
            stored = self.store.get(model, [item.canonical_id for item, _ in todo])
        except VectorStoreError as exc:
            self._note_error(str(exc))
            stored = {}
        dim = self.index.dim or self.provider.dim
        reuse: list[tuple[EmbedItem, str, np.ndarray]] = []
        fresh: list[tuple[EmbedItem, str]] = []
        for item, digest in todo:
            row = stored.get(item.canonical_id)
            if (row is not None and (row.content_hash == digest or row.content_hash in item.accept_hashes)
                    and (dim is None or row.vector.shape[0] == dim)):
                reuse.append((item, row.content_hash, row.vector))
            else:
                fresh.append((item, digest))
        if reuse:
            self._to_index([(i, h, v) for i, h, v in reuse], start_seq)
            self.reused += len(reuse)
        if not fresh:
            return
        done = self._embed(fresh)
        done = self._live(done, start_seq)
        if not done:
            return
        rows = [NewVector(item.canonical_id, item.kind, digest, vec) for item, digest, vec in done]
        if self._to_index(done, start_seq):
            self._with_store_retries(lambda: self.store.upsert(model, rows), "write")

    def _borrow(self, canonical_id: str, digest: str) -> np.ndarray | None:
        """The owner's vector from ``reuse_from`` when this part's text is the owner's own."""
        if self.reuse_from is None or "#" not in canonical_id or self.reuse_from.model != self.provider.name:
            return None
        owner = canonical_id.rpartition("#")[0]
        if self.reuse_from.hash_of(owner) != digest:
            return None
        return self.reuse_from.vector(owner)

    def _live(self, done: list[tuple[EmbedItem, str, np.ndarray]], start_seq: int
              ) -> list[tuple[EmbedItem, str, np.ndarray]]:
        """Drop results for ids removed (or replaced) while their batch was being embedded."""
        with self._cond:
            roots = [root for seq, root in self._tombstones if seq > start_seq]
            return [row for row in done if not _under(row[0].canonical_id, roots, self.separators)]

    def _to_index(self, rows: list[tuple[EmbedItem, str, np.ndarray]], start_seq: int) -> bool:
        rows = self._live(rows, start_seq)
        if not rows:
            return False
        warnings = self.index.upsert_many([i.canonical_id for i, _, _ in rows], [i.kind for i, _, _ in rows],
                                          np.stack([v for _, _, v in rows]), [h for _, h, _ in rows])
        if warnings:
            with self._cond:
                for item, _, _ in rows:
                    self._failed[item.canonical_id] = (item, warnings[0])
            self._note_error(warnings[0])
            return False
        return True

    def _embed(self, todo: list[tuple[EmbedItem, str]]) -> list[tuple[EmbedItem, str, np.ndarray]]:
        """Embed with retries and backoff; a batch that still fails with a non-transient error is
        tried text by text once, so one bad input does not sink its neighbours."""
        texts = [item.text for item, _ in todo]
        result = self._attempts(texts, self.max_attempts)
        if isinstance(result, np.ndarray):
            self.embedded += len(todo)
            return [(item, digest, result[i]) for i, (item, digest) in enumerate(todo)]
        if len(todo) > 1 and not getattr(result, "retryable", False) \
                and not isinstance(result, ProviderUnavailableError):
            out: list[tuple[EmbedItem, str, np.ndarray]] = []
            for pair in todo:
                out.extend(self._embed_single(pair))
            return out
        self._fail(todo, result)
        return []

    def _embed_single(self, pair: tuple[EmbedItem, str]) -> list[tuple[EmbedItem, str, np.ndarray]]:
        result = self._attempts([pair[0].text], 1)
        if isinstance(result, np.ndarray):
            self.embedded += 1
            return [(pair[0], pair[1], result[0])]
        self._fail([pair], result)
        return []

    def _fail(self, todo: list[tuple[EmbedItem, str]], error: BaseException) -> None:
        message = f"{type(error).__name__}: {error}"
        with self._cond:
            roots = [root for seq, root in self._tombstones if seq > self._batch_seq]
            for item, _ in todo:
                cid = item.canonical_id
                if cid not in self._queue and not _under(cid, roots, self.separators):  # not queued again, not removed
                    self._failed[cid] = (item, message)
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
                if attempt + 1 < attempts and not self._pause(attempt):
                    break
        return error

    def _pause(self, attempt: int) -> bool:
        """Back off before retry ``attempt + 1``; False when the worker is stopping."""
        delay = min(self.max_backoff, self.backoff * (2 ** attempt))
        with self._cond:
            self._state = "retrying"
            deadline = time.monotonic() + delay
            while not self._stop:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            self._state = "embedding"
            return not self._stop

    def _with_store_retries(self, action: Callable[[], object], what: str) -> None:
        for attempt in range(self.max_attempts):
            try:
                action()
                return
            except (VectorStoreError, ValueError) as exc:
                self._note_error(f"{what}: {exc}")
                if isinstance(exc, ValueError) or attempt + 1 >= self.max_attempts or not self._pause(attempt):
                    return

    def _note_error(self, message: str) -> None:
        log.warning("embedding worker: %s", message)
        with self._cond:
            self._last_error = message


def default_worker(location: StorePlace, *, items: Callable[[], Items] | None = None,
                   switch_model: bool = False, env: dict[str, str] | None = None, **options: Any) -> EmbeddingWorker:
    """A worker for the configured model (``$SLAYER_EMBEDDING_MODEL``, else the offline default)."""
    from slayer_lsp.embed.providers import configured_model_name, provider_for

    provider = provider_for(configured_model_name(env if env is not None else dict(os.environ)))
    return EmbeddingWorker(location, provider, items=items, switch_model=switch_model, **options)
