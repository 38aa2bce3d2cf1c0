"""The embedding worker before and after, on the same texts: throughput, what lands first, and how
much a search slows while it runs. Driven by ``bench/embed.py --worker/--search-load/--timeline``.

"Before" is the code of a git revision (``--before``, default the commit this work started from):
its ``embed/worker.py`` and ``embed/providers.py`` are loaded from git under other module names, so
both versions run in one process, back to back, on the same store's texts.

* throughput: every entity text and every part text of a generated store, embedded by each
  worker into fresh tables (``--reps`` runs each, alternating, medians). Texts a second of wall
  time and of CPU time (the process's, i.e. per core used); run it under ``taskset -c 1`` on a
  shared machine. Both providers get one onnxruntime thread, so the figures compare the work done,
  not the cores taken;
* timeline: seconds until the first memory vector is searchable, until every memory, datasource,
  model and measure is (the texts that answer most questions), until every entity is, and until
  every part is;
* search load: ``Engine.search`` p50 (lexical channels, the daemon's code path) with no worker, with
  the old worker running (its defaults: onnxruntime's threads), with the new one (its defaults: one
  thread, a nicer thread, waiting before each batch for the searches to pause, as the engine has
  it) and with the new one not stepping back (nice 0, no wait), phases interleaved. Do not pin this
  one to one core: a daemon has the whole machine.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _slayer_env as env

BEFORE = "782ab93"  # the last commit with the one-class worker
TIER0 = ("memory", "datasource", "model", "measure", "aggregation")


def module_at(rev: str, path: str, name: str) -> types.ModuleType:
    """A module of the repository as it was at ``rev``, imported under ``name``."""
    source = subprocess.run(
        ["git", "-C", str(env.REPO), "show", f"{rev}:{path}"], capture_output=True, text=True, check=True
    ).stdout
    module = types.ModuleType(name)
    module.__file__ = str(env.REPO / path)  # files beside it (the tokenizer) are found where they are now
    sys.modules[name] = module  # dataclasses look their module up
    exec(compile(source, f"<{rev}:{path}>", "exec"), module.__dict__)  # noqa: S102 - our own code, from git
    return module


@dataclass
class Run:
    """One worker's pass over the texts."""

    label: str
    texts: int
    wall: float = 0.0
    cpu: float = 0.0
    marks: dict[str, float] = field(default_factory=dict)  # timeline: event -> seconds since start
    cpu_marks: dict[str, float] = field(default_factory=dict)  # the same events: CPU seconds since start
    embedded: int = 0


def _stores(tmp: Path) -> tuple[Any, Any]:
    from slayer_lsp.embed.parts import PARTS_TABLE
    from slayer_lsp.embed.store import VectorStore
    from slayer_lsp.texts.parts import SEPARATORS

    return (
        VectorStore(tmp / "embeddings.db", create=True),
        VectorStore(tmp / "parts.db", create=True, table=PARTS_TABLE, kinds=None, separators=SEPARATORS),
    )


def start_before(rev: str, catalog: Any, tmp: Path, threads: int | None) -> Any:
    """The old worker (and its part worker) as the engine built it at ``rev``."""
    from slayer_lsp.texts.parts import SEPARATORS, PartItems
    from slayer_lsp.texts.statements import CatalogItems

    old = module_at(rev, "slayer_lsp/embed/worker.py", "bench_before_worker")
    providers = module_at(rev, "slayer_lsp/embed/providers.py", "bench_before_providers")
    provider = providers.MiniLMProvider(threads=threads)
    main_store, part_store = _stores(tmp)
    parts = old.EmbeddingWorker(
        tmp,
        provider,
        store=part_store,
        switch_model=True,
        kinds=None,
        separators=SEPARATORS,
        prune=True,
        start=False,
        items=lambda: PartItems(catalog),
        batch_size=128,
    )
    return old.EmbeddingWorker(
        tmp, provider, store=main_store, items=lambda: CatalogItems(catalog), parts=parts
    )


def start_after(
    catalog: Any, tmp: Path, threads: int | None, nice: int | None = None, before_job: Any = None
) -> Any:
    """The worker of this tree, as the engine builds it (``nice``: None keeps its default;
    ``before_job``: the engine's wait for a pause in its searches)."""
    from slayer_lsp.embed.priority import RankedItems, RankedParts
    from slayer_lsp.embed.providers import MiniLMProvider
    from slayer_lsp.embed.worker import EmbeddingWorker, PartVectors, WorkerConfig

    main_store, part_store = _stores(tmp)
    config = WorkerConfig() if nice is None else WorkerConfig(nice=nice)
    return EmbeddingWorker(
        tmp,
        MiniLMProvider(threads=threads),
        store=main_store,
        config=config,
        items=lambda: RankedItems(catalog),
        parts=PartVectors(part_store, lambda: RankedParts(catalog)),
        before_job=before_job,
    )


def _tier0_total(catalog: Any) -> int:
    return sum(1 for c in catalog.searchable_ids() if catalog.kind_of(c) in TIER0)


def watch(run: Run, worker: Any, catalog: Any, poll: float = 0.25) -> None:
    """Wait for ``worker`` (and its parts) to finish, noting when each milestone was reached."""
    n_entities = len(catalog.searchable_ids())
    n_tier0 = _tier0_total(catalog)
    n_memories = len(catalog.memory_order)
    t0, c0 = time.perf_counter(), time.process_time()
    marks = run.marks

    def mark(event: str, now: float) -> None:
        if event not in marks:
            marks[event] = now
            run.cpu_marks[event] = time.process_time() - c0

    while True:
        now = time.perf_counter() - t0
        counts = worker.index.kind_counts()
        if counts.get("memory"):
            mark("first memory", now)
        if counts.get("memory", 0) >= n_memories:
            mark("every memory", now)
        if sum(counts.get(k, 0) for k in TIER0) >= n_tier0:
            mark("memories+models+measures", now)
        if len(worker.index) >= n_entities:
            mark("every entity", now)
        parts = worker.parts
        if worker.wait_idle(timeout=0) and (parts is None or parts.wait_idle(timeout=0)):
            for event in ("every memory", "memories+models+measures", "every entity", "everything"):
                mark(event, now)
            break
        time.sleep(poll)
    run.wall = time.perf_counter() - t0
    run.cpu = time.process_time() - c0
    st = worker.status()
    run.embedded = st.embedded + (st.parts.embedded if st.parts is not None else 0)


def batching(texts: list[str], rev: str, reps: int, threads: int | None = 1) -> None:
    """The provider alone on the same texts: called as the old worker called it (32 texts as they
    come; the old provider's 4,096-token batches) and as a lane calls it now (a window of 256 texts
    sorted by length, calls of 32; each text run alone on the int8 form). Texts per CPU second, medians."""
    from slayer_lsp.embed.providers import MiniLMProvider

    providers = module_at(rev, "slayer_lsp/embed/providers.py", "bench_before_providers")
    old, new = providers.MiniLMProvider(threads=threads), MiniLMProvider(threads=threads)
    for p in (old, new):
        p.load()
        p.embed(["warm up"])

    def as_before() -> None:
        for i in range(0, len(texts), 32):
            old.embed(texts[i : i + 32])

    def as_now() -> None:
        for w in range(0, len(texts), 256):
            window = sorted(texts[w : w + 256], key=len)
            for i in range(0, len(window), 32):
                new.embed(window[i : i + 32])

    cpu: dict[str, list[float]] = {"before": [], "after": []}
    for _ in range(reps):
        for label, fn in (("before", as_before), ("after", as_now)):
            c = time.process_time()
            fn()
            cpu[label].append(time.process_time() - c)
    b, a = (len(texts) / statistics.median(cpu[k]) for k in ("before", "after"))
    env.print_table(
        ["texts", "before: texts / CPU s", "after: texts / CPU s", "after / before"],
        [(f"{len(texts):,}", f"{b:,.0f}", f"{a:,.0f}", f"{a / b:.2f}x")],
        title=f"provider batching alone (no deduplication), onnxruntime threads={threads}, {reps} runs each",
    )


def throughput(size: str, reps: int, rev: str, threads: int | None = 1) -> None:
    from slayer_lsp.catalog import load_catalog
    from slayer_lsp.texts.parts import PartItems

    models, memories = (int(x) for x in size.split("x"))
    store = env.generated_store(models, memories, "yaml")
    catalog = load_catalog(store)
    n_entities, n_parts = len(catalog.searchable_ids()), len(PartItems(catalog))
    distinct = len({i.text for i in PartItems(catalog)})
    print(
        f"\n## worker before ({rev}) and after, {size}: {n_entities:,} entity texts + {n_parts:,} part texts "
        f"({distinct:,} distinct part texts); onnxruntime threads={threads}; {reps} run(s) each, alternating"
    )
    runs: dict[str, list[Run]] = {"before": [], "after": []}
    for rep in range(reps):
        for label in ("before", "after"):
            with tempfile.TemporaryDirectory(prefix=f"embed-{label}-") as tmp:
                run = Run(label, n_entities + n_parts)
                start: Callable[[], Any] = (
                    (lambda: start_before(rev, catalog, Path(tmp), threads))
                    if label == "before"
                    else (lambda: start_after(catalog, Path(tmp), threads, nice=0))
                )
                worker = start()
                try:
                    watch(run, worker, catalog)
                finally:
                    worker.close()
                runs[label].append(run)
                print(
                    f"  {label} run {rep + 1}: {run.wall:.1f} s wall, {run.cpu:.1f} s CPU, "
                    f"{run.texts / run.cpu:.0f} texts per CPU second, {run.embedded:,} texts embedded",
                    flush=True,
                )

    def med(label: str, fn: Callable[[Run], float]) -> float:
        return statistics.median(fn(r) for r in runs[label])

    rows = []
    for what, fn in (
        ("texts / s (wall)", lambda r: r.texts / r.wall),
        ("texts / CPU s (per core)", lambda r: r.texts / r.cpu),
        ("provider embeddings", lambda r: float(r.embedded)),
    ):
        b, a = med("before", fn), med("after", fn)
        rows.append((what, f"{b:,.0f}", f"{a:,.0f}", f"{a / b:.2f}x" if b else "-"))
    env.print_table(
        ["median over runs", "before", "after", "after / before"],
        rows,
        title=f"throughput on the same {n_entities + n_parts:,} texts",
    )
    marks = ("first memory", "every memory", "memories+models+measures", "every entity", "everything")
    env.print_table(
        ["searchable (median s since start)", "before", "after"],
        [
            (
                m,
                f"{med('before', lambda r, m=m: r.marks.get(m, float('nan'))):.1f} s",
                f"{med('after', lambda r, m=m: r.marks.get(m, float('nan'))):.1f} s",
            )
            for m in marks
        ],
        title="timeline (wall; on a shared machine compare the columns, not the absolute times)",
    )


def timeline(size: str, backend: str, nice: int | None) -> None:
    """The new worker through the engine (the daemon's path) on a fresh copy of a generated store."""
    from slayer_lsp.embed.worker import WorkerConfig
    from slayer_lsp.engine import Engine

    models, memories = (int(x) for x in size.split("x"))
    suffix = ".db" if backend == "sqlite" else ""
    store = env.copy_store(
        env.generated_store(models, memories, backend),
        env.work_dir() / "scratch" / f"embed-timeline-{size}-{backend}{suffix}",
    )
    with tempfile.TemporaryDirectory(prefix="embed-cache-") as cache:
        import os

        os.environ["SLAYER_LSP_CACHE_DIR"] = cache
        t0 = time.perf_counter()
        engine = Engine(store, dense="live", embed_config=None if nice is None else WorkerConfig(nice=nice))
        engine.refresh()
        worker = engine.dense
        assert worker is not None
        run = Run("after", 0)
        watch(run, worker, engine.catalog, poll=0.5)
        st = worker.status()
        engine.close()
    print(
        f"\n## timeline of a fresh {size} {backend} store through the engine (nice={nice if nice is not None else 'default'}), "
        f"{time.perf_counter() - t0:.0f} s in all"
    )
    env.print_table(
        ["searchable", "seconds since start", "CPU seconds since start"],
        [(m, f"{s:.1f} s", f"{run.cpu_marks[m]:.1f} s") for m, s in run.marks.items()],
    )
    parts = st.parts
    print(
        f"entities: {st.rows:,} rows, {st.embedded:,} embedded, {st.reused:,} reused; parts: "
        f"{parts.rows if parts else 0:,} rows, {parts.embedded if parts else 0:,} embedded, "
        f"{parts.reused if parts else 0:,} reused; {run.cpu:.0f} s CPU"
    )


QUESTIONS = (
    "How many orders did each store take last month?",
    "total revenue by product category",
    "which customers live in Lyon",
    "average discount per payment method",
    "top suppliers by cost",
    "orders shipped late in 2024",
    "profit margin by region and quarter",
    "stock left per warehouse",
)


def search_load(size: str, rev: str, cycles: int, per_phase: int) -> None:
    from slayer_lsp.catalog import load_catalog
    from slayer_lsp.engine import Engine

    models, memories = (int(x) for x in size.split("x"))
    store = env.generated_store(models, memories, "yaml")
    catalog = load_catalog(store)
    engine = Engine(store, dense="off", use_cache=False)
    engine.refresh()
    for q in QUESTIONS * 3:  # warm
        engine.search({"question": q})
    timings: dict[str, list[float]] = {"no worker": [], "before": [], "after": [], "after, nice 0": []}
    busy: dict[str, list[int]] = {"before": [], "after": [], "after, nice 0": []}
    cpu: dict[str, list[float]] = {phase: [] for phase in timings}  # the searching thread's own CPU time
    for cycle in range(cycles):
        for phase in timings:
            with tempfile.TemporaryDirectory(prefix="embed-load-") as tmp:
                worker = None
                if phase == "before":
                    worker = start_before(rev, catalog, Path(tmp), threads=None)  # its defaults
                elif phase == "after":  # its defaults, and the engine's wait as the engine gives it
                    worker = start_after(catalog, Path(tmp), threads=1, before_job=engine.searches.wait_idle)
                elif phase == "after, nice 0":  # the same, not stepping back: what one thread alone does
                    worker = start_after(catalog, Path(tmp), threads=1, nice=0)
                try:
                    if worker is not None:  # measure while it embeds, not while it loads the model
                        deadline = time.monotonic() + 120
                        while worker.status().embedded == 0 and time.monotonic() < deadline:
                            time.sleep(0.05)
                        before_n = worker.status().embedded
                    for i in range(per_phase):
                        t, c = time.perf_counter(), time.thread_time()
                        engine.search({"question": QUESTIONS[i % len(QUESTIONS)]})
                        timings[phase].append(time.perf_counter() - t)
                        cpu[phase].append(time.thread_time() - c)
                    if worker is not None:
                        busy[phase].append(worker.status().embedded - before_n)
                finally:
                    if worker is not None:
                        worker.close()
        print(
            f"  cycle {cycle + 1}: "
            + ", ".join(
                f"{p} p50 {statistics.median(v[-per_phase:]) * 1e3:.1f} ms" for p, v in timings.items()
            ),
            flush=True,
        )
    engine.close()
    base = statistics.median(timings["no worker"])
    rows = [
        (
            phase,
            statistics.median(v),
            sorted(v)[int(0.9 * (len(v) - 1))],
            f"{statistics.median(v) / base:.2f}x",
            statistics.median(cpu[phase]),
            f"{sum(busy.get(phase, [])):,}" if phase in busy else "-",
        )
        for phase, v in timings.items()
    ]
    # wall p50 well above the thread's own CPU time: the search waited (for a core, or the GIL)
    env.print_table(
        ["phase", "search p50", "p90", "p50 / no worker", "its CPU time p50", "texts embedded meanwhile"],
        rows,
        title=f"Engine.search (lexical) on {size} while a worker embeds the same store's texts; "
        f"{cycles} cycles x {per_phase} searches a phase",
    )
