"""The embedding worker: one background thread keeping the dense channel's vectors in step with the store.

It runs two ``Lane``s (``embed/lane.py``) on that thread: ``entities`` (one vector per searchable
entity, in SLayer's ``embeddings`` table) and, when asked, ``parts`` (facets and memory pieces, in
our own table: ``embed/parts.py``). The entities always go first: the parts lane starts (loads its
stored rows, backfills) only once the entities have nothing left to do, and an entity edit is
taken before the next window of parts. Changed documents are enqueued; nothing here raises into the
server: provider failures are retried with backoff, then counted and kept for ``status()``.

Search never waits for the queue: ``search()`` ranks what is in the index and says in its warnings
how much is still pending. The thread runs at a lower scheduling priority than the process
(``nice``, on Linux), and the provider calls are small, so a search that wants the CPU gets it.

One model per index. Rows of other models in the shared table are inert. When the table holds
vectors of other models and none of ours, the worker does not start re-embedding everything under a
new name on its own (for a litellm model that costs money): it waits, blocked, with a warning, until
``switch_model`` (the ``--switch-model`` option) says to; the part vectors wait with it.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from slayer_lsp.embed.index import DenseHits, VectorIndex
from slayer_lsp.embed.lane import ENTITY_LANE, PART_LANE, Items, Job, Lane, LaneConfig
from slayer_lsp.embed.providers import EmbeddingProvider
from slayer_lsp.embed.report import EmbeddingStatus, PartsStatus, blocked_message
from slayer_lsp.embed.store import MemoryStore, VectorStore

if TYPE_CHECKING:
    from slayer_lsp.embed.store import StorePlace

__all__ = [
    "EmbeddingStatus",
    "EmbeddingWorker",
    "PartVectors",
    "PartsStatus",
    "Progress",
    "WorkerConfig",
    "blocked_message",
    "default_worker",
]

log = logging.getLogger(__name__)

_START = "start"  # the job of starting the parts lane


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """How the worker runs: each lane's batching and retries, the query cache, and how far it
    steps back for other work (``nice``: added to the thread's niceness on Linux; 0 keeps it)."""

    entities: LaneConfig = ENTITY_LANE
    parts: LaneConfig = PART_LANE
    query_cache: int = 256  # question vectors kept (per model)
    nice: int = 10


@dataclass(frozen=True, slots=True)
class PartVectors:
    """Where the part vectors live, and (for a live channel) what to backfill them from."""

    store: VectorStore | MemoryStore
    items: Callable[[], Items] | None = None


@dataclass(frozen=True, slots=True)
class Progress:
    """Work done and left across the lanes, for a progress bar: ``done`` counts texts embedded,
    reused, found current or failed since the start; ``pending`` what is queued or not yet drawn."""

    done: int
    pending: int
    embedded: int
    per_lane: dict[str, tuple[int, int]] = field(default_factory=dict)  # lane -> (done, pending)


class EmbeddingWorker:
    """Background embedding of a store's entities (and their parts) into ``VectorIndex``es and tables.

    ``location`` is a ``StoreLocation`` or a store path (where SLayer's table is, unless ``store``
    is given); ``items``, when given, is called for everything to embed (e.g. ``lambda:
    RankedItems(current_catalog)``): at start and after a model switch it is backfilled.
    ``switch_model=True`` lets this provider's model replace the vectors of another (in memory) and
    embed everything again. ``parts``: keep the part vectors too. ``start=False`` leaves the thread
    to ``start()``. The entity lane's producers (``enqueue``, ``remove``, ...) are the worker's."""

    def __init__(
        self,
        location: StorePlace | None,
        provider: EmbeddingProvider,
        *,
        config: WorkerConfig = WorkerConfig(),
        items: Callable[[], Items] | None = None,
        store: VectorStore | MemoryStore | None = None,
        index: VectorIndex | None = None,
        parts: PartVectors | None = None,
        switch_model: bool = False,
        start: bool = True,
        before_job: Callable[[], None] | None = None,
    ) -> None:
        if store is None:
            if location is None:
                raise ValueError("a store location or a vector store is needed")
            store = VectorStore.for_store(location)
        self.config = config
        self._cond = threading.Condition()
        self.entities = Lane(
            "entities",
            store,
            provider,
            config.entities,
            self._cond,
            index=index,
            items=items,
            switch=switch_model,
        )
        self.parts: Lane | None = None
        if parts is not None:
            self.parts = Lane(
                "parts", parts.store, provider, config.parts, self._cond, items=parts.items, switch=True
            )
            # a part whose text an entity has (a memory's meaning is its text) takes that vector
            self.parts.reuse_from = (self.entities.index,)
        self._stop = False
        # run before each batch, outside every lock: the engine's wait for a pause in the searches
        # (a batch's tokenizing and writing are Python, under the lock a search needs)
        self._before_job = before_job
        self._query_cache: OrderedDict[tuple[str, str], np.ndarray] = OrderedDict()
        self._thread: threading.Thread | None = None
        if start:
            self.start()

    # ------------------------------------------------------------------ the entity lane's face

    @property
    def provider(self) -> EmbeddingProvider:
        return self.entities.provider

    @property
    def index(self) -> VectorIndex:
        return self.entities.index

    @property
    def store(self) -> VectorStore | MemoryStore:
        return self.entities.store

    @property
    def batch_size(self) -> int:
        return self.entities.batch_size

    @property
    def embedded(self) -> int:
        return self.entities.embedded

    @property
    def reused(self) -> int:
        return self.entities.reused

    @property
    def retries(self) -> int:
        return self.entities.retries

    def enqueue(self, canonical_id: str, kind: str, text: str, accept_hashes: tuple[str, ...] = ()) -> None:
        self.entities.enqueue(canonical_id, kind, text, accept_hashes)

    def enqueue_many(self, items: Items) -> None:
        self.entities.enqueue_many(items)

    def backfill(self, items: Items, page: int | None = None) -> None:
        self.entities.backfill(items, page)

    def remove(self, canonical_id: str, *, from_store: bool = True) -> None:
        self.entities.remove(canonical_id, from_store=from_store)

    def retry_failed(self) -> int:
        return self.entities.retry_failed()

    def reload(self) -> None:
        self.entities.reload()

    def failures(self) -> dict[str, str]:
        return self.entities.failures()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until the entities need nothing more without outside help (queue drained, or blocked)."""
        return self.entities.wait_idle(timeout)

    def switch_model(self, provider: EmbeddingProvider | None = None) -> None:
        """Make ``provider`` (default: the current one) the model of both lanes: the old model's
        vectors leave memory (the tables keep them, inert), stored rows of the new model are
        loaded, and everything is embedded again."""
        chosen = provider or self.provider
        with self._cond:
            self._query_cache.clear()
        for lane in self._lanes():
            lane.switch_model(chosen)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        with self._cond:
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._run, name="slayer-lsp-embed", daemon=True)
            self._thread.start()

    def close(self, timeout: float = 10.0) -> None:
        """Stop the thread (the provider call in flight is finished and written first, up to
        ``timeout``)."""
        with self._cond:
            self._stop = True
            for lane in self._lanes():
                lane.stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
        with self._cond:
            for lane in self._lanes():
                lane.state = "stopped"

    def __enter__(self) -> EmbeddingWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _lanes(self) -> list[Lane]:
        return [self.entities] if self.parts is None else [self.entities, self.parts]

    # ------------------------------------------------------------------ consumers

    def status(self) -> EmbeddingStatus:
        parts = self.parts.parts_status() if self.parts is not None else None
        lane = self.entities
        with self._cond:
            # a scoped session's index ranks only what it reaches: its counts say no more (the
            # table's rows of other models cannot be scoped, so they are not counted at all)
            restricted = lane.index.restricted
            return EmbeddingStatus(
                model=lane.provider.name,
                dim=lane.index.dim or lane.provider.dim,
                state=lane.state,
                rows=lane.index.reachable_count() if restricted else len(lane.index),
                embedded=lane.embedded,
                reused=lane.reused,
                pending=lane.pending(),
                failed=lane.failed_count(),
                last_error=lane.last_error,
                store=str(lane.store.path),
                other_models={} if restricted else dict(lane.other_models),
                parts=parts,
            )

    def progress(self) -> Progress:
        """Texts done and left, summed over the lanes (for ``slayer-lsp embed``'s progress bar)."""
        per: dict[str, tuple[int, int]] = {}
        with self._cond:
            for lane in self._lanes():
                per[lane.name] = (
                    lane.embedded + lane.reused + lane.skipped + lane.failed_count(),
                    lane.pending(),
                )
            embedded = sum(lane.embedded for lane in self._lanes())
        return Progress(sum(d for d, _ in per.values()), sum(p for _, p in per.values()), embedded, per)

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
        size = self.config.query_cache
        if size > 0:
            with self._cond:
                self._query_cache[key] = vec
                while len(self._query_cache) > size:
                    self._query_cache.popitem(last=False)
        return vec

    def search(
        self,
        question: str,
        k: int = 50,
        allow: Iterable[str] | None = None,
        kinds: Iterable[str] | None = None,
    ) -> DenseHits:
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
        self._step_back()
        try:
            self.entities.start_up()
        except Exception as exc:  # a broken store or item source must not kill the thread
            log.exception("embedding worker: start-up failed")
            self.entities.note_error(f"start-up: {exc}")
            with self._cond:
                self.entities.state = "idle"
        while True:
            with self._cond:
                lane, job = self._next_job()
                if job is None:
                    if self._stop:
                        return
                    for each in self._lanes():
                        each.settle()
                    self._cond.notify_all()
                    self._cond.wait()
                    continue
                lane.busy = True
            try:
                if self._before_job is not None and job != _START:
                    self._before_job()
                if job == _START:
                    # parts start once the entities are done: search's own channel first, and a
                    # memory's meaning then takes its entity vector instead of a second embedding;
                    # they wait with a blocked entity lane (its model must not embed them either)
                    lane.start_up(hold=self.entities.blocked)
                else:
                    lane.run_job(job)
            except Exception as exc:  # keep the thread alive whatever happens
                log.exception("embedding worker: job failed")
                lane.note_error(str(exc))
            finally:
                with self._cond:
                    lane.finish_job(job)
                    self._cond.notify_all()

    def _next_job(self) -> tuple[Lane, Job | None]:
        """Under the lock: the entities' next job, else the parts' (their start-up first)."""
        job = self.entities.next_job() if not self._stop else None
        if job is not None or self.parts is None or self._stop:
            return self.entities, job
        if not self.parts.started:
            self.parts.started = True
            return self.parts, _START
        return self.parts, self.parts.next_job()

    def _step_back(self) -> None:
        """Lower this thread's scheduling priority (Linux: niceness is per thread), before the
        provider loads, so that threads it starts inherit it."""
        if self.config.nice <= 0 or not sys.platform.startswith("linux"):
            return
        try:
            tid = threading.get_native_id()
            os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + self.config.nice)
        except (OSError, AttributeError) as exc:  # not permitted, or not supported here
            log.debug("embedding worker: niceness unchanged (%s)", exc)


def default_worker(
    location: StorePlace,
    *,
    items: Callable[[], Items] | None = None,
    switch_model: bool = False,
    env: dict[str, str] | None = None,
    **options: Any,
) -> EmbeddingWorker:
    """A worker for the configured model (``$SLAYER_EMBEDDING_MODEL``, else the offline default)."""
    from slayer_lsp.embed.providers import configured_model_name, provider_for

    provider = provider_for(configured_model_name(env if env is not None else dict(os.environ)))
    return EmbeddingWorker(location, provider, items=items, switch_model=switch_model, **options)
