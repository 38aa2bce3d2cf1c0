"""Embedding-layer figures: the offline model's cold start and throughput, query latency, top-k over
a large in-memory matrix next to the machine's memory bandwidth, and the vector table's speed.

    python bench/embed.py [--texts 1000] [--vectors 100000] [--queries 200] [--rows 20000]
    taskset -c 1 python bench/embed.py --worker 100x500 [--reps 3]   # the worker, before and after
    python bench/embed.py --search-load 1000x5000                     # search p50 while it runs
    python bench/embed.py --timeline 1000x5000                        # what is searchable when

* cold start: onnxruntime + tokenizers imports, sha256 check, session load and the first vector;
* throughput: ~1,000 generated column documents (the text the worker embeds: description, then one
  statement per field) embedded in the provider's batches, texts/s and word pieces/s;
* query latency: distinct short questions embedded one at a time (no cache), p50 / p95;
* top-k: ``VectorIndex.top_k`` over random unit vectors (384-d, six kinds), unrestricted and
  restricted by an allow-set, with the bytes of matrix scanned per second beside a numpy copy of a
  large array (the memory-bandwidth bound a scan cannot beat);
* table: writing and paging back rows of SLayer's ``embeddings`` table (startup cost of the index);
* ``--worker``, ``--search-load``, ``--timeline``: the embedding worker before (``--before REV``) and
  after on the same texts: throughput per core, what is searchable when, and a search's p50 while it
  runs (``bench/embed_worker.py``).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import _slayer_env as env  # noqa: E402

WORDS = (
    "order customer store product supply revenue amount price quantity date city country region "
    "status payment method discount tax shipping return category brand channel campaign region "
    "account balance invoice item sku warehouse stock supplier cost margin profit"
).split()
TYPES = ("INT", "TEXT", "DOUBLE", "DATE", "TIMESTAMP", "BOOLEAN")
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


def column_texts(n: int, seed: int = 1) -> list[str]:
    """Column documents like a real catalog's: a description, a label, a type, sample values."""
    import msgspec

    from slayer_lsp.store import documents as d
    from slayer_lsp.texts.statements import entity_text

    rng = random.Random(seed)
    out = []
    for i in range(n):
        name = "_".join(rng.sample(WORDS, rng.randint(1, 3)))
        desc = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 30))).capitalize() + "."
        samples = [" ".join(rng.sample(WORDS, rng.randint(1, 2))) for _ in range(rng.randint(0, 12))]
        col = msgspec.convert(
            {
                "name": name,
                "type": rng.choice(TYPES),
                "description": desc,
                "label": name.replace("_", " ").title(),
                "sampled_values": samples or None,
            },
            d.Column,
        )
        model = msgspec.convert({"name": f"model_{i // 20}"}, d.Model)
        out.append(entity_text(col, model=model))
    return out


def worker_sample(size: str, n: int, seed: int = 3) -> list[str]:
    """``n`` texts drawn from a generated store's entity and part texts, in their proportions."""
    from slayer_lsp.catalog import load_catalog
    from slayer_lsp.texts.parts import PartItems
    from slayer_lsp.texts.statements import CatalogItems

    models, memories = (int(x) for x in size.split("x"))
    catalog = load_catalog(env.generated_store(models, memories, "yaml"))
    texts = [i.text for i in CatalogItems(catalog)] + [i.text for i in PartItems(catalog)]
    return random.Random(seed).sample(texts, min(n, len(texts)))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def bench_model(n_texts: int, n_queries: int, threads: int | None) -> None:
    t0 = time.perf_counter()
    import onnxruntime  # noqa: F401
    import tokenizers  # noqa: F401

    t_import = time.perf_counter() - t0

    from slayer_lsp.embed import providers as prov

    t1 = time.perf_counter()
    prov.sha256_file(prov.minilm_model_path())
    t_sha = time.perf_counter() - t1
    t2 = time.perf_counter()
    model = prov.MiniLMProvider(threads=threads)
    model.load()
    model.embed(["warm up"])
    t_load = time.perf_counter() - t2
    env.print_table(
        ["step", "time"],
        [
            ("import onnxruntime + tokenizers", t_import),
            ("sha256 of model.onnx (22.9 MB)", t_sha),
            ("verify + load + first vector", t_load),
        ],
        title="cold start of local/all-MiniLM-L6-v2-int8",
    )

    texts = column_texts(n_texts)
    rt = model._runtime()
    pieces = [len(e.ids) for e in rt.tokenizer.encode_batch(texts, add_special_tokens=False)]
    t3 = time.perf_counter()
    vectors = model.embed(texts)
    t_embed = time.perf_counter() - t3
    assert vectors.shape == (len(texts), model.dim)
    env.print_table(
        ["texts", "mean word pieces", "max", "time", "texts/s", "word pieces/s"],
        [
            (
                str(len(texts)),
                f"{statistics.mean(pieces):.0f}",
                str(max(pieces)),
                t_embed,
                f"{len(texts) / t_embed:.0f}",
                f"{sum(pieces) / t_embed:.0f}",
            )
        ],
        title="document throughput (generated column texts, one embed() call)",
    )

    rng = random.Random(2)
    questions = [f"{rng.choice(QUESTIONS)} {i}" for i in range(n_queries)]
    lat = []
    for q in questions:
        t = time.perf_counter()
        model.embed([q])
        lat.append(time.perf_counter() - t)
    env.print_table(
        ["queries", "p50", "p95", "queries/s"],
        [(str(n_queries), statistics.median(lat), percentile(lat, 0.95), f"{n_queries / sum(lat):.0f}")],
        title="query embedding latency (one question per call, no cache)",
    )


def bench_topk(n: int, dim: int = 384, k: int = 10, repeat: int = 30) -> None:
    import numpy as np

    from slayer_lsp.embed.index import VectorIndex

    rng = np.random.default_rng(0)
    kinds_cycle = ("column", "column", "column", "measure", "model", "memory")
    ids = [f"ds.m{i // 50}.c{i}" for i in range(n)]
    kinds = [kinds_cycle[i % len(kinds_cycle)] for i in range(n)]
    index = VectorIndex("bench", dim, capacity=n)
    t0 = time.perf_counter()
    for start in range(0, n, 5000):
        block = rng.standard_normal((min(5000, n - start), dim)).astype(np.float32)
        index.upsert_many(ids[start : start + len(block)], kinds[start : start + len(block)], block)
    t_build = time.perf_counter() - t0
    scanned = index.nbytes

    # memory bandwidth: a copy of a large array (bytes read + written per second) and a sum (bytes read)
    big = np.ones(max(scanned, 256 << 20) // 4, dtype=np.float32)
    dst = np.empty_like(big)
    np.copyto(dst, big)
    copies, sums = [], []
    for _ in range(5):
        t = time.perf_counter()
        np.copyto(dst, big)
        copies.append(time.perf_counter() - t)
        t = time.perf_counter()
        big.sum()
        sums.append(time.perf_counter() - t)
    copy_gbs = 2 * big.nbytes / min(copies) / 1e9
    sum_gbs = big.nbytes / min(sums) / 1e9
    bound = max(copy_gbs, sum_gbs)
    big_mb = big.nbytes / 1e6
    del big, dst

    queries = [rng.standard_normal(dim).astype(np.float32) for _ in range(repeat)]
    mat = index._mat[: len(index)]

    def timed(fn) -> float:
        fn(queries[0])
        times = []
        for q in queries:
            t = time.perf_counter()
            fn(q)
            times.append(time.perf_counter() - t)
        return statistics.median(times)

    t_matvec = timed(lambda q: mat @ q)
    t_all = timed(lambda q: index.top_k(q, k))
    allow_small = set(random.Random(1).sample(ids, n // 10))
    allow_big = set(random.Random(2).sample(ids, (n * 6) // 10))
    t_small = timed(lambda q: index.top_k(q, k, allow=allow_small))
    t_big = timed(lambda q: index.top_k(q, k, allow=allow_big))
    frozen = frozenset(allow_big)
    t_frozen = timed(lambda q: index.top_k(q, k, allow=frozen))
    t_kind = timed(lambda q: index.top_k(q, k, kinds=["measure"]))

    def gbs(seconds: float, nbytes: int = scanned) -> str:
        return f"{nbytes / seconds / 1e9:.1f} GB/s"

    def share(seconds: float, nbytes: int = scanned) -> str:
        return f"{nbytes / seconds / 1e9 / bound:.0%}"

    rows = [
        (f"numpy copy of {big_mb:.0f} MB (read + write)", min(copies), f"{copy_gbs:.1f} GB/s", "-"),
        (f"numpy sum of {big_mb:.0f} MB (read)", min(sums), f"{sum_gbs:.1f} GB/s", "-"),
        ("bare matrix @ q", t_matvec, gbs(t_matvec), share(t_matvec)),
        (f"top_k k={k} per kind, no restriction", t_all, gbs(t_all), share(t_all)),
        (
            f"top_k, allow = {len(allow_small):,} ids (rows gathered)",
            t_small,
            gbs(t_small, scanned // 10),
            share(t_small, scanned // 10),
        ),
        (f"top_k, allow = {len(allow_big):,} ids (full scan)", t_big, gbs(t_big), share(t_big)),
        ("  the same allow as a frozenset (rows cached)", t_frozen, gbs(t_frozen), share(t_frozen)),
        (
            "top_k, kinds = [measure] (1/6 of rows gathered)",
            t_kind,
            gbs(t_kind, scanned // 6),
            share(t_kind, scanned // 6),
        ),
    ]
    env.print_table(
        ["operation", "p50", "bytes scanned/s", "of bandwidth"],
        rows,
        title=f"top-k over {n:,} x {dim} float32 vectors ({scanned / 1e6:.0f} MB; built in {t_build:.2f} s)",
    )


def bench_table(n_rows: int, dim: int = 384) -> None:
    import numpy as np

    from slayer_lsp.embed.store import NewVector, VectorStore

    rng = np.random.default_rng(3)
    with tempfile.TemporaryDirectory(prefix="embed-bench-") as tmp:
        store = VectorStore(Path(tmp) / "embeddings.db", create=True)
        rows = [
            NewVector(
                f"ds.m{i // 50}.c{i}", "column", f"{i:064x}", rng.standard_normal(dim).astype(np.float32)
            )
            for i in range(n_rows)
        ]
        t0 = time.perf_counter()
        for start in range(0, n_rows, 500):
            store.upsert("bench/model", rows[start : start + 500])
        t_write = time.perf_counter() - t0
        size = (Path(tmp) / "embeddings.db").stat().st_size
        t1 = time.perf_counter()
        loaded = sum(len(p.ids) for p in store.iter_pages("bench/model", page=2000))
        t_read = time.perf_counter() - t1
        assert loaded == n_rows
        env.print_table(
            ["operation", "rows", "time", "rows/s"],
            [
                ("upsert, 500 rows a transaction", f"{n_rows:,}", t_write, f"{n_rows / t_write:,.0f}"),
                ("page back (2,000 a page) as matrices", f"{n_rows:,}", t_read, f"{n_rows / t_read:,.0f}"),
            ],
            title=f"SLayer's embeddings table ({dim}-d JSON rows, {size / n_rows / 1024:.1f} KiB a row)",
        )


def bench_three_channel(size: str, backend: str, repeat: int = 40) -> None:
    """Warm latency of a search that runs all three channels on a generated store: a private copy is
    embedded once (the vectors land in its embeddings table, so a second run reuses them), then
    questions rotate with random entity pairs."""
    from slayer_lsp.engine import Engine

    models, memories = (int(x) for x in size.split("x"))
    suffix = ".db" if backend == "sqlite" else ""
    store = env.copy_store(
        env.generated_store(models, memories, backend),
        env.work_dir() / "scratch" / f"three-channel-{size}-{backend}{suffix}",
    )
    t0 = time.perf_counter()
    engine = Engine(store, dense="live", use_cache=False)
    engine.refresh()
    engine.dense.wait_idle(timeout=None)
    st = engine.dense.status()
    print(
        f"\n## three-channel search, {size} {backend}: {st.rows} vectors ready in "
        f"{time.perf_counter() - t0:.1f} s ({st.embedded} embedded now, {st.reused} reused)"
    )
    ids = [c for c in engine.catalog.searchable_ids() if c.count(".") == 2]
    rng = random.Random(7)
    timings: dict[str, list[float]] = {"question": [], "question+entities": [], "question+datasource": []}
    ds = sorted(engine.catalog.datasources)[0]
    for i in range(repeat):
        q = QUESTIONS[i % len(QUESTIONS)]
        for variant, call in (
            ("question", {"question": q}),
            ("question+entities", {"question": q, "entities": rng.sample(ids, 2)}),
            ("question+datasource", {"question": q, "datasource": ds}),
        ):
            t = time.perf_counter()
            resp = engine.search(call)
            timings[variant].append(time.perf_counter() - t)
            assert resp.results
    for variant, values in timings.items():
        print(
            f"| {variant:20} | p50 {statistics.median(values) * 1000:6.1f} ms | "
            f"p99 {percentile(values, 0.99) * 1000:6.1f} ms |"
        )
    print("target: p50 <= 15 ms at 1000x5000")
    engine.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=1000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--vectors", type=int, default=100_000)
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument(
        "--threads", type=int, default=None, help="onnxruntime intra-op threads (default: its own)"
    )
    parser.add_argument("--skip-model", action="store_true", help="only the index and table figures")
    parser.add_argument(
        "--three-channel",
        metavar="MODELSxMEMORIES",
        default=None,
        help="also time searches with all three channels on a generated store (e.g. 1000x5000; "
        "embeds its ~26k documents once, several minutes on 2 cores)",
    )
    parser.add_argument("--backend", choices=["yaml", "sqlite"], default="sqlite")
    parser.add_argument(
        "--worker",
        metavar="MODELSxMEMORIES",
        default=None,
        help="the worker before and after on a generated store's texts (e.g. 100x500): "
        "provider batching, throughput per core, timeline; run under taskset -c 1",
    )
    parser.add_argument(
        "--search-load",
        metavar="MODELSxMEMORIES",
        default=None,
        help="Engine.search p50 with no worker, the old one and the new one running",
    )
    parser.add_argument(
        "--timeline",
        metavar="MODELSxMEMORIES",
        default=None,
        help="what is searchable when, on a fresh copy through the engine (e.g. 1000x5000)",
    )
    parser.add_argument("--before", metavar="REV", default=None, help="git revision of the old worker")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--cycles", type=int, default=3)
    parser.add_argument("--per-phase", type=int, default=40)
    parser.add_argument("--nice", type=int, default=None, help="--timeline: the worker's niceness step")
    args = parser.parse_args()
    if args.three_channel:
        bench_three_channel(args.three_channel, args.backend)
        return
    if args.worker or args.search_load or args.timeline:
        import embed_worker as ew

        rev = args.before or ew.BEFORE
        if args.worker:
            texts = worker_sample(args.worker, 1500)
            ew.batching(texts, rev, args.reps, args.threads or 1)
            ew.throughput(args.worker, args.reps, rev, args.threads or 1)
        if args.search_load:
            ew.search_load(args.search_load, rev, args.cycles, args.per_phase)
        if args.timeline:
            ew.timeline(args.timeline, args.backend, args.nice)
        return
    if not args.skip_model:
        bench_model(args.texts, args.queries, args.threads)
    bench_topk(args.vectors)
    bench_table(args.rows)


if __name__ == "__main__":
    main()
