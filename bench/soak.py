"""A long run of one daemon under mixed traffic and store churn: RSS and latency every minute, and the drift.

    python bench/soak.py [--duration 3600] [--size 100x1000] [--backend yaml] [--rate 20] [--threads 2]
                         [--mix search=40,hover=15,...] [--documents 20] [--churn-s 5] [--interval 60]
                         [--max-rss-mib 6144] [--slayer-venv PATH] [--keep]

One daemon (``python -m slayer_lsp serve``, dense channel off) on a private copy of a generated store,
with 20 query documents open (each mid-edit, as in an editor: ``ds.model.`` and ``sum(`` waiting to be
completed, so each carries diagnostics that are re-checked on every store change). Client threads send a paced mix (``--rate`` requests/s in all) of
``slayer/search`` (questions and entity lookups), hover, completion, ``slayer/inspect`` and
``slayer/saveMemory`` / ``slayer/forgetMemory`` (the daemon's own memories are forgotten again, oldest
first, so the store stays the same size). Meanwhile motley-slayer in its venv, as another process
(``_slayer_env.SlayerWriter``), changes the store every ``--churn-s`` seconds: adds a column to a model,
drops it, saves a memory, forgets it.

Every ``--interval`` seconds one table row: requests, errors, p50/p99 (all methods, and search alone),
the daemon's RSS and peak RSS (``/proc/<pid>/status``), its open file descriptors and threads, and
the store changes it indexed (``slayer/status`` generation). At the end, the drift: the first ten
minutes against the last ten (or the first and last half of a shorter run) and the RSS slope in
MiB/h (least squares over every minute, and over the minutes after the first ten).
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _slayer_env as env  # noqa: E402
from load_clients import probe_word, request_pool, spawn_daemon, wait_ready  # noqa: E402
from lsp import RpcError, StdioClient, open_documents, pct, read_models, rss_mb  # noqa: E402

sys.path.insert(0, str(env.REPO))

MIX = {"search": 40, "hover": 15, "completion": 20, "inspect": 10, "saveMemory": 2, "forgetMemory": 2}
KEEP_SAVED = 20  # the daemon's own memories alive at once (older ones are forgotten)


class Recorder:
    """Latencies and errors of the current interval, swapped out by the monitor each interval."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.lat: dict[str, list[float]] = collections.defaultdict(list)
        self.errors: list[str] = []

    def add(self, method: str, seconds: float) -> None:
        with self.lock:
            self.lat[method].append(seconds)

    def error(self, text: str) -> None:
        with self.lock:
            self.errors.append(text)

    def take(self) -> tuple[dict[str, list[float]], list[str]]:
        with self.lock:
            lat, errors = self.lat, self.errors
            self.lat, self.errors = collections.defaultdict(list), []
        return lat, errors


class Traffic:
    """What the client threads ask: drawn from the store and the open documents."""

    def __init__(
        self, client: StdioClient, store: Path, docs: list[dict[str, Any]], rng: random.Random
    ) -> None:
        from slayer_lsp.catalog import load_catalog

        cat = load_catalog(store)
        self.client, self.docs = client, docs
        self.pool = request_pool(store, rng)
        self.refs = [
            c
            for c, e in cat.entities.items()
            if e.kind in ("model", "column", "measure", "memory") and not e.hidden
        ]
        self.models = [mid for mid, m in cat.models.items() if not m.hidden]
        self.saved: collections.deque[str] = collections.deque()
        self.saved_lock = threading.Lock()
        self.counter = 0

    def params(self, method: str, rng: random.Random) -> tuple[str, Any]:
        """The LSP method and params of one request of kind ``method``."""
        if method == "search":
            return "slayer/search", rng.choice(self.pool)
        if method in ("hover", "completion"):
            doc = rng.choice(self.docs)
            line, col = rng.choice(list(doc["hover" if method == "hover" else "spots"].values()))
            return f"textDocument/{method}", {
                "textDocument": {"uri": doc["uri"]},
                "position": {"line": line, "character": col},
            }
        if method == "inspect":
            return "slayer/inspect", {"refs": rng.sample(self.refs, 3)}
        with self.saved_lock:
            forget = method == "forgetMemory" and self.saved or len(self.saved) >= KEEP_SAVED
            if forget:
                return "slayer/forgetMemory", {"id": self.saved.popleft()}
            self.counter += 1
            k = self.counter
        return "slayer/saveMemory", {
            "learning": f"Soak note {k}: {probe_word(k)} is how the team reads it.",
            "entities": [rng.choice(self.models)],
        }

    def done(self, method: str, result: Any) -> None:
        if method == "slayer/saveMemory":
            with self.saved_lock:
                self.saved.append(result["id"])


def parse_mix(text: str) -> dict[str, float]:
    mix = {}
    for part in text.split(","):
        kind, _, weight = part.partition("=")
        if kind not in MIX:
            raise argparse.ArgumentTypeError(f"unknown request kind {kind!r}; expected one of {list(MIX)}")
        mix[kind] = float(weight or 1)
    return mix


def client_loop(
    traffic: Traffic, rec: Recorder, seed: int, period_s: float, stop: threading.Event, mix: dict[str, float]
) -> None:
    rng = random.Random(seed)
    kinds, weights = list(mix), list(mix.values())
    next_at = time.monotonic()
    while not stop.is_set():
        method, params = traffic.params(rng.choices(kinds, weights)[0], rng)
        t0 = time.perf_counter()
        try:
            result = traffic.client.request(method, params, timeout=120)
        except (RpcError, TimeoutError) as exc:
            rec.error(f"{method}: {type(exc).__name__}: {exc}")
        else:
            rec.add(method.rsplit("/", 1)[-1], time.perf_counter() - t0)
            traffic.done(method, result)
        next_at += period_s
        delay = next_at - time.monotonic()
        if delay > 0:
            stop.wait(delay)
        else:
            next_at = time.monotonic()  # behind: no catch-up burst


def churn_loop(
    writer: env.SlayerWriter,
    models: list[tuple[str, str]],
    churn_s: float,
    stop: threading.Event,
    counts: collections.Counter,
) -> None:
    """SLayer, as another process, one step per tick: add a column to a model, drop it, save a memory,
    forget it; then the next model."""
    tick, memory_id = 0, None
    while not stop.wait(churn_s):
        cycle, step = divmod(tick, 4)
        tick += 1
        ds, model = models[cycle % len(models)]
        word = probe_word(100_000 + cycle)
        try:
            if step == 0:
                writer.call(
                    "add_column", datasource=ds, model=model, name=word, description=f"Soak column {word}"
                )
            elif step == 1:
                writer.call("drop_column", datasource=ds, model=model, name=word)
            elif step == 2:
                memory_id = writer.call(
                    "save_memory", learning=f"Soak memory {word} from SLayer.", entities=[f"{ds}.{model}"]
                )["memory_id"]
            elif memory_id is not None:
                writer.call("forget_memory", id=memory_id)
                memory_id = None
            counts["writes"] += 1
        except env.SlayerEnvError as exc:
            counts["write_errors"] += 1
            print(f"  ! SLayer writer: {exc}", file=sys.stderr, flush=True)


def proc_counts(pid: int) -> tuple[int, int]:
    """(open file descriptors, threads) of a process."""
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    threads = len(os.listdir(f"/proc/{pid}/task"))
    return fds, threads


def slope_per_hour(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of (seconds, MiB) points, in MiB/h."""
    if len(points) < 2:
        return None
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    den = sum((x - mx) ** 2 for x, _ in points)
    return None if not den else sum((x - mx) * (y - my) for x, y in points) / den * 3600


HEADERS = [
    "minute",
    "requests",
    "errors",
    "p50",
    "p99",
    "search p50",
    "search p99",
    "RSS MiB",
    "peak MiB",
    "fds",
    "threads",
    "store changes",
    "SLayer writes",
]


def row_cells(row: dict[str, Any]) -> list[str]:
    f = env.fmt_seconds
    return [
        str(row["minute"]),
        str(row["n"]),
        str(row["errors"]),
        f(row["p50"]),
        f(row["p99"]),
        f(row["search_p50"]),
        f(row["search_p99"]),
        f"{row['rss']:.1f}",
        f"{row['hwm']:.1f}",
        str(row["fds"]),
        str(row["threads"]),
        str(row["changes"]),
        str(row["writes"]),
    ]


def print_row(cells: list[str], widths: list[int]) -> None:
    print("| " + " | ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True)) + " |", flush=True)


def drift(rows: list[dict[str, Any]], interval: float) -> None:
    window = min(10, max(1, len(rows) // 2))
    first, last = rows[:window], rows[-window:]

    def merged(part: list[dict[str, Any]], key: str) -> list[float]:
        return [v for r in part for v in r[key]]

    def cell(part: list[dict[str, Any]], key: str, q: float) -> float | None:
        values = merged(part, key)
        return pct(values, q) if values else None

    def ratio(a: float | None, b: float | None) -> str:
        return f"{b / a:.2f}x" if a and b else "-"

    label = f"{window} interval(s) of {interval:g} s"
    table = []
    for name, key, q in (
        ("p50, all requests", "all", 50),
        ("p99, all requests", "all", 99),
        ("p50, search", "search", 50),
        ("p99, search", "search", 99),
    ):
        a, b = cell(first, key, q), cell(last, key, q)
        table.append([name, env.fmt_seconds(a), env.fmt_seconds(b), ratio(a, b)])
    for name, key in (("RSS MiB (mean)", "rss"), ("fds (mean)", "fds"), ("threads (mean)", "threads")):
        a = sum(r[key] for r in first) / len(first)
        b = sum(r[key] for r in last) / len(last)
        table.append([name, f"{a:.1f}", f"{b:.1f}", ratio(a, b)])
    env.print_table(
        ["drift", f"first {label}", f"last {label}", "last / first"],
        table,
        title="drift: the start of the run against its end",
    )
    points = [(r["t"], r["rss"]) for r in rows]
    settled = [(t, v) for t, v in points if t > 600]
    all_slope, settled_slope = slope_per_hour(points), slope_per_hour(settled)
    print(
        f"RSS slope: {all_slope:+.1f} MiB/h over every interval"
        if all_slope is not None
        else "RSS slope: - (one interval)",
        end="",
    )
    print(
        f"; {settled_slope:+.1f} MiB/h after the first 10 minutes"
        if settled_slope is not None
        else "; - after the first 10 minutes (run too short)"
    )
    print(
        f"RSS first/last/max: {rows[0]['rss']:.1f} / {rows[-1]['rss']:.1f} / {max(r['rss'] for r in rows):.1f} MiB; "
        f"peak (VmHWM) {rows[-1]['hwm']:.1f} MiB"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=3600.0, help="seconds of traffic")
    ap.add_argument("--interval", type=float, default=60.0, help="seconds per table row")
    ap.add_argument("--size", default="100x1000", help="MODELSxMEMORIES of the generated store")
    ap.add_argument("--backend", choices=("yaml", "sqlite"), default="yaml")
    ap.add_argument(
        "--rate", type=float, default=20.0, help="requests per second, all client threads together"
    )
    ap.add_argument("--threads", type=int, default=2, help="client threads (requests in flight at once)")
    ap.add_argument("--churn-s", type=float, default=5.0, help="seconds between two SLayer writes (0: none)")
    ap.add_argument(
        "--mix",
        type=parse_mix,
        default=dict(MIX),
        help="request weights, e.g. search=40,hover=15 (kinds: " + ", ".join(MIX) + ")",
    )
    ap.add_argument("--documents", type=int, default=20, help="query documents kept open")
    ap.add_argument(
        "--max-rss-mib",
        type=float,
        default=6144.0,
        help="end the run early when the daemon's RSS passes this (protects a shared machine)",
    )
    ap.add_argument("--keep", action="store_true", help="keep the work directory (daemon log, store copy)")
    env.add_venv_option(ap)
    args = ap.parse_args(argv)
    ((n_models, n_memories),) = env.parse_sizes(args.size)
    rng = random.Random(5)
    source = env.generated_store(n_models, n_memories, args.backend, venv=args.slayer_venv)
    work = Path(tempfile.mkdtemp(prefix="soak-", dir=env.work_dir()))
    store = env.copy_store(source, work / ("yaml" if args.backend == "yaml" else "slayer.db"))
    log_path = work / "server.log"
    print(
        f"soak: {args.duration:g} s on a {args.backend} store {args.size} ({store}); {args.rate:g} req/s from "
        f"{args.threads} thread(s), mix {args.mix}; SLayer writes every {args.churn_s:g} s (0: none); daemon log {log_path}",
        flush=True,
    )
    client = spawn_daemon(store, work / "cache", log_path)
    writer = None
    try:
        wait_ready([client])
        pid = client.proc.pid
        print(f"daemon pid {pid}, ready; bench pid {os.getpid()}", flush=True)
        docs = open_documents(client, list(read_models(store)), args.documents, rng)
        traffic = Traffic(client, store, docs, rng)
        writer = env.SlayerWriter(store, venv=args.slayer_venv, log_path=work / "slayer-writer.log")
        rec, stop, counts = Recorder(), threading.Event(), collections.Counter()
        threads = [
            threading.Thread(
                target=client_loop,
                args=(traffic, rec, 100 + k, args.threads / args.rate, stop, args.mix),
                daemon=True,
            )
            for k in range(args.threads)
        ]
        models = [(m.split(".", 1)[0], m.split(".", 1)[1]) for m in traffic.models]
        if args.churn_s > 0:
            threads.append(
                threading.Thread(
                    target=churn_loop, args=(writer, models, args.churn_s, stop, counts), daemon=True
                )
            )
        widths = [max(len(h), 9) for h in HEADERS]
        print("| " + " | ".join(h.rjust(w) for h, w in zip(HEADERS, widths, strict=True)) + " |")
        print("|" + "|".join("-" * (w + 2) for w in widths) + "|", flush=True)
        start = time.monotonic()
        gen0 = client.request("slayer/status", {})["generation"]
        for th in threads:
            th.start()
        rows: list[dict[str, Any]] = []
        errors_seen: collections.Counter = collections.Counter()
        k = 0
        while True:
            k += 1
            end_at = start + min(k * args.interval, args.duration)
            stop.wait(max(0.0, end_at - time.monotonic()))
            lat, errors = rec.take()
            errors_seen.update(errors)
            everything = [v for values in lat.values() for v in values]
            rss, hwm = rss_mb(pid)
            fds, nthreads = proc_counts(pid)
            gen = client.request("slayer/status", {})["generation"]
            row = {
                "minute": k,
                "t": time.monotonic() - start,
                "n": len(everything),
                "errors": len(errors),
                "all": everything,
                "search": lat.get("search", []),
                "lat": lat,
                "p50": pct(everything, 50) if everything else None,
                "p99": pct(everything, 99) if everything else None,
                "search_p50": pct(lat["search"], 50) if lat.get("search") else None,
                "search_p99": pct(lat["search"], 99) if lat.get("search") else None,
                "rss": rss,
                "hwm": hwm,
                "fds": fds,
                "threads": nthreads,
                "changes": gen - gen0,
                "writes": counts["writes"],
            }
            rows.append(row)
            print_row(row_cells(row), widths)
            if time.monotonic() - start >= args.duration - 1e-6:
                break
            if rss > args.max_rss_mib:
                print(
                    f"stopped early: daemon RSS {rss:.0f} MiB is over --max-rss-mib {args.max_rss_mib:g}",
                    flush=True,
                )
                break
        stop.set()
        for th in threads:
            th.join(60)
        drift(rows, args.interval)
        by_method = collections.defaultdict(list)
        for r in rows:
            for method, values in r["lat"].items():
                by_method[method].extend(values)
        env.print_table(
            ["method (whole run)", "n", "p50", "p99", "max"],
            [[m, len(v), pct(v, 50), pct(v, 99), max(v)] for m, v in sorted(by_method.items())],
        )
        total = sum(r["n"] for r in rows)
        print(
            f"requests {total}, errors {sum(r['errors'] for r in rows)}, SLayer writes {counts['writes']} "
            f"(failed {counts['write_errors']}), store changes indexed {rows[-1]['changes']}"
        )
        for text, n in errors_seen.most_common(10):
            print(f"  ! {n} x {text}")
    finally:
        if writer is not None:
            writer.close()
        code = client.close()
        print(f"daemon exit code after shutdown/exit: {code}", flush=True)
        if args.keep:
            print(f"work directory kept: {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
