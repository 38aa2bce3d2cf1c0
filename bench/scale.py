"""Warehouse scale through the daemon: one table per backend and store size.

    python bench/scale.py [--sizes 10000x40x20000x20,1000x40x5000x20] [--backends yaml,sqlite]
                          [--requests N] [--edits N] [--slayer-venv PATH]

Each size is MODELSxCOLUMNSxMEMORIESxDATASOURCES. The stores are written by SLayer itself
(``shared/tools/gen_slayer_storage.py`` in the motley-slayer venv) and cached under ``bench/.work``.
The daemon runs as an editor runs it (``python -m slayer_lsp serve``, JSON-RPC over stdio), lexical
channels only (the embedding worker off), and every figure is a round trip through the wire:

* cold start: spawn -> ``slayer/status`` ready, with an empty cache directory; then the first search,
  and the time until the start-up's background work is done (``warming`` false: each datasource
  indexed apart), which the cold daemon lives through, as a session does;
* restart with the on-disk cache (the same cache directory, a new daemon), and its first search;
* peak RSS (VmHWM) of the daemon over the whole run;
* ``slayer/search`` p50/p99 for the default ranking (``hybrid``) and ``slayer`` over a fixed pool of
  questions made from the catalog's own names, with and without a datasource: right after the
  restart's first search (its background warm-up still running), and again at the end, warm;
* completion after ``ds.`` and ``ds.model.`` and hover p50/p99 on open query documents;
* ``slayer/status`` p50;
* edit -> visible: SLayer adds a column to a model (or saves a memory) in the store; the clock runs
  from the moment SLayer's write returns (its own save takes seconds on a 10k YAML store) until
  ``slayer/inspect`` on the new id answers it (p50/p99 over ``--edits`` edits each);
* index size on disk (the cache directory).

Targets (issue #17) are printed beside the figures; nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _slayer_env as env  # noqa: E402
from lsp import StdioClient, bench_requests, open_documents, read_models, rss_mb  # noqa: E402

TARGETS_10K = {
    "cold yaml": 30.0,
    "cold sqlite": 15.0,
    "restart": 5.0,
    "rss": 2048.0,
    "search": 0.020,
    "completion": 0.010,
    "status": 0.001,
    "visible": 0.500,
}
TARGETS_1K = {"search": 0.005, "search p99": 0.050}  # lexical channels, 1,000 models / 5,000 memories


def search_targets(models: int) -> tuple[float, float | None]:
    """The default search's p50 (and p99) target for a store of this many models (issue #17)."""
    if models <= 1000:
        return TARGETS_1K["search"], TARGETS_1K["search p99"]
    return TARGETS_10K["search"], None


def parse_sizes(text: str) -> list[tuple[int, int, int, int]]:
    sizes = []
    for part in text.split(","):
        try:
            m, c, n, ds = (int(x) for x in part.lower().split("x"))
        except ValueError:
            raise SystemExit(f"bad size {part!r}: expected MODELSxCOLUMNSxMEMORIESxDATASOURCES") from None
        sizes.append((m, c, n, ds))
    return sizes


def spawn(store: Path, cache: Path, log: Path) -> tuple[StdioClient, float]:
    """A daemon on ``store`` with ``cache`` as its cache directory; seconds from spawn to ready."""
    variables = {**os.environ, "SLAYER_LSP_CACHE_DIR": str(cache), "PYTHONPATH": str(env.REPO)}
    t0 = time.perf_counter()
    client = StdioClient(
        [sys.executable, "-m", "slayer_lsp", "serve", "--storage", str(store)],
        cwd=env.REPO,
        env_vars=variables,
        log_path=log,
    )
    client.request(
        "initialize",
        {
            "processId": os.getpid(),
            "rootUri": None,
            "capabilities": {},
            "initializationOptions": {"embedding": {"enable": False}},
        },
        timeout=600,
    )
    client.notify("initialized", {})
    while not client.request("slayer/status", {}, timeout=600)["ready"]:
        time.sleep(0.02)
    return client, time.perf_counter() - t0


def question_pool(
    models: list[tuple[str, str, list[str], Path]], rng: random.Random, n: int = 60
) -> list[dict[str, Any]]:
    """Questions in the catalog's own words: a column and a model, half of them scoped to a datasource."""
    pool = []
    for k, (ds, name, cols, _) in enumerate(rng.sample(models, min(n, len(models)))):
        col = rng.choice(cols).replace("_", " ")
        params: dict[str, Any] = {"question": f"total {col} by {name.replace('_', ' ')}", "max_results": 10}
        if k % 2:
            params["datasource"] = ds
        pool.append(params)
    return pool


def timed(client: StdioClient, method: str, params: Any) -> float:
    t0 = time.perf_counter()
    client.request(method, params)
    return time.perf_counter() - t0


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms" if seconds < 10 else f"{seconds:.1f} s"


def row(
    name: str, values: list[float], target: float | None, target_p99: float | None = None
) -> list[object]:
    p50, p99 = pct(values, 50), pct(values, 99)
    verdict = "" if target is None else f"target p50 <= {ms(target)}: {'ok' if p50 <= target else 'MISSED'}"
    if target_p99 is not None:
        verdict += f", p99 <= {ms(target_p99)}: {'ok' if p99 <= target_p99 else 'MISSED'}"
    return [name, len(values), ms(p50), ms(p99), verdict]


def edits(
    client: StdioClient,
    writer: env.SlayerWriter,
    models: list[tuple[str, str, list[str], Path]],
    n: int,
    rng: random.Random,
) -> tuple[list[float], list[float]]:
    """Seconds from SLayer's write until ``slayer/inspect`` answers the new column / memory."""
    column_s, memory_s = [], []
    for k, (ds, name, _cols, _) in enumerate(rng.sample(models, n)):
        column = f"scale_added_{k}"
        ref = f"{ds}.{name}.{column}"
        time.sleep(1.0)
        writer.call(
            "add_column", datasource=ds, model=name, name=column, description="Added by bench/scale.py"
        )
        column_s.append(_until_known(client, ref, time.perf_counter()))  # from the moment SLayer is done
        time.sleep(1.0)
        saved = writer.call(
            "save_memory", learning=f"Scale note {k}: {column} is filled nightly.", entities=[ref]
        )
        memory_s.append(_until_known(client, f"memory:{saved['memory_id']}", time.perf_counter()))
    return column_s, memory_s


def _until_known(client: StdioClient, ref: str, t0: float, give_up_s: float = 60.0) -> float:
    while True:
        answer = client.request("slayer/inspect", {"refs": [ref]})
        if any(item.get("canonical") and not item.get("error") for item in answer["items"]):
            return time.perf_counter() - t0
        if time.perf_counter() - t0 > give_up_s:
            raise RuntimeError(f"{ref} never became visible to slayer/inspect")
        time.sleep(0.01)


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def bench_one(
    store: Path, backend: str, size: tuple[int, int, int, int], work: Path, args: argparse.Namespace
) -> None:
    rng = random.Random(17)
    copy = env.copy_store(store, work / ("store.db" if backend == "sqlite" else "store"))
    cache = work / f"cache-{backend}"
    shutil.rmtree(cache, ignore_errors=True)
    models = read_models(copy)
    t0 = time.perf_counter()
    client, cold_s = spawn(copy, cache, work / f"server-{backend}-cold.log")
    pool = question_pool(models, rng)
    search_target = search_targets(size[0])
    first_search_s = timed(client, "slayer/search", pool[0])
    # the run the restart follows lived through its start-up's background work (a daemon's session
    # lasts minutes), so the cache holds what that work builds: each datasource's own index
    while client.request("slayer/status", {}, timeout=600).get("warming"):
        time.sleep(0.05)
    warm_s = time.perf_counter() - t0
    client.close()
    client, restart_s = spawn(copy, cache, work / f"server-{backend}.log")
    try:
        # ready is the catalog and the full-text indexes: the default ranking's other indexes (the
        # lexicon, the memory pieces) are built by then in the background, and the first search waits
        restart_search_s = timed(client, "slayer/search", pool[1])
        rows = [
            [
                "cold start -> first complete index (empty cache)",
                1,
                ms(cold_s),
                "",
                f"target {TARGETS_10K['cold ' + backend]:.0f} s at 10k",
            ],
            ["first search after the cold start", 1, ms(first_search_s), "", ""],
            ["cold start -> warm-up done (each datasource indexed)", 1, ms(warm_s), "", ""],
            [
                "restart with the on-disk cache -> ready",
                1,
                ms(restart_s),
                "",
                f"target {TARGETS_10K['restart']:.0f} s at 10k",
            ],
            ["first search after the restart", 1, ms(restart_search_s), "", ""],
        ]
        for ranking in ("hybrid", "slayer"):
            times = [
                timed(client, "slayer/search", {**pool[i % len(pool)], "ranking": ranking})
                for i in range(args.requests)
            ]
            rows.append(
                row(f"slayer/search ({ranking})", times, *(search_target if ranking == "hybrid" else (None,)))
            )
        docs = open_documents(client, models, 30, rng)
        for name, n, p50, p99, _mx, note in bench_requests(client, docs, args.requests):
            if name.startswith(("completion: models", "completion: leaves", "hover")):
                rows.append([name, n, p50, p99, note])
        rows.append(
            row(
                "slayer/status",
                [timed(client, "slayer/status", {}) for _ in range(args.requests)],
                TARGETS_10K["status"],
            )
        )
        # the same searches again, the start-up's background work (datasource indexes) long done
        warm = [timed(client, "slayer/search", pool[i % len(pool)]) for i in range(args.requests)]
        rows.append(row("slayer/search (hybrid), after the warm-up", warm, *search_target))
        writer = env.SlayerWriter(copy, venv=args.slayer_venv, log_path=work / f"writer-{backend}.log")
        try:
            column_s, memory_s = edits(client, writer, models, args.edits, rng)
        finally:
            writer.close()
        rows.append(row("edit -> visible: a column SLayer added", column_s, TARGETS_10K["visible"]))
        rows.append(row("edit -> visible: a memory SLayer saved", memory_s, TARGETS_10K["visible"]))
        _rss, peak = rss_mb(client.proc.pid)
        status = client.request("slayer/status", {})
    finally:
        client.close()
    rows.append(["peak RSS (VmHWM)", 1, f"{peak:.0f} MiB", "", f"target {TARGETS_10K['rss']:.0f} MiB at 10k"])
    rows.append(["index size on disk (cache directory)", 1, f"{du(cache) / 2**20:.0f} MiB", "", ""])
    m, c, n, ds = size
    counts = ", ".join(f"{v} {k}" for k, v in status["counts"].items())
    env.print_table(
        ["measure (through stdio, lexical channels)", "n", "p50", "p99", "note"],
        rows,
        title=f"{backend}: {m} models x {c} columns, {n} memories, {ds} datasources ({counts})",
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="10000x40x20000x20,1000x40x5000x20")
    ap.add_argument("--backends", default="yaml,sqlite")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--edits", type=int, default=10)
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs, store copies)")
    env.add_venv_option(ap)
    args = ap.parse_args(argv)
    print(f"machine: {os.cpu_count()} cores; load average {os.getloadavg()[0]:.2f}", file=sys.stderr)
    env.compile_bytecode()  # starts are timed as an installed package starts
    for size in parse_sizes(args.sizes):
        m, c, n, ds = size
        for backend in args.backends.split(","):
            store = env.generated_store(m, n, backend, columns=c, datasources=ds, venv=args.slayer_venv)
            work = Path(tempfile.mkdtemp(prefix="scale-", dir=env.work_dir()))
            try:
                bench_one(store, backend, size, work, args)
            finally:
                if not args.keep:
                    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
