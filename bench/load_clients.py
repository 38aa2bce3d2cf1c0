"""Many clients searching while SLayer changes the store: latency idle vs under load, and staleness.

    python bench/load_clients.py [--size 100x1000] [--backends yaml,sqlite] [--forms daemons,pipelined]
                                 [--clients 8] [--idle-s 15] [--load-s 45] [--think-ms 0] [--slayer-venv PATH]

Two forms of concurrency, each on a private copy of a generated store (YAML directory or SQLite file):

* ``daemons``: N daemons on the same store, each with a client of its own (N editors / agents);
* ``pipelined``: one daemon and N client threads sharing its stdio connection, so up to N requests
  are in flight at once.

Each client runs ``slayer/search`` back to back (``--think-ms`` pauses between requests), drawing from
a mix of questions (model and column words, column descriptions, memory descriptions) and entity
lookups (``entities: [ds.model.column]``, some with a question too). Three phases:

1. idle: one client, nobody writing (the baseline);
2. clients: N clients at once, nobody writing;
3. load: N clients at once while a writer changes the store through SLayer itself (a motley-slayer
   process in its venv, ``_slayer_env.SlayerWriter``): it adds a column named with a made-up word to
   a model, drops it, saves a memory carrying another made-up word, forgets it, and so on.

Staleness: the writer is the only process changing the store, and each change is one document (one
rename or one transaction), so the first ``slayer/status`` generation past the one seen before the
write is the daemon announcing that change as indexed (the daemon sends work-done progress for its
first index only; after that the status generation is what it announces). The writer then searches
every daemon for the made-up word at once: a result that misses an added probe or still shows a
removed one is stale. A stale result is re-asked for up to 5 s to tell "late" from "never".

The p99 target: with the writer, within 3x of the same clients without it (a refresh must not hold
up requests). Against one client alone the ratio is printed too, but N requests in flight on 2 cores
queue behind each other whatever the daemon does, so that one grows with N. The bench process (its
client threads) shares the machine's cores with the daemons and the SLayer writer, as an editor
would; the dense channel is off.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _slayer_env as env  # noqa: E402
from lsp import RpcError, StdioClient, pct, rss_mb  # noqa: E402

sys.path.insert(0, str(env.REPO))  # slayer_lsp, to read the store the clients ask about

TARGET_RATIO = 3.0  # p99 with the writer / p99 of the same clients without it
ANNOUNCE_TIMEOUT_S = 60.0
LATE_WINDOW_S = 5.0


# --------------------------------------------------------------------------- daemons


def spawn_daemon(store: Path, cache: Path, log_path: Path) -> StdioClient:
    """``python -m slayer_lsp serve`` on ``store``; ``$SLAYER_LSP_BENCH_PRELUDE`` (Python code, e.g. one
    that starts tracemalloc) runs in the daemon's process first, when set."""
    variables = {**os.environ, "SLAYER_LSP_CACHE_DIR": str(cache), "PYTHONPATH": str(env.REPO)}
    prelude = os.environ.get("SLAYER_LSP_BENCH_PRELUDE")
    launch = (
        ["-m", "slayer_lsp"]
        if not prelude
        else [
            "-c",
            prelude + "\nimport runpy\nrunpy.run_module('slayer_lsp', run_name='__main__', alter_sys=True)",
        ]
    )
    client = StdioClient(
        [sys.executable, *launch, "serve", "--storage", str(store)],
        cwd=env.REPO,
        env_vars=variables,
        log_path=log_path,
    )
    client.request(
        "initialize",
        {
            "processId": os.getpid(),
            "rootUri": None,
            "capabilities": {},
            "initializationOptions": {"embedding": {"enable": False}},
        },
    )
    client.notify("initialized", {})
    return client


def wait_ready(clients: list[StdioClient], timeout: float = 900.0) -> None:
    deadline = time.monotonic() + timeout
    for c in clients:
        while not c.request("slayer/status", {})["ready"]:
            if time.monotonic() > deadline:
                raise RuntimeError("a daemon never finished its first index")
            time.sleep(0.05)


def start_daemons(store: Path, n: int, work: Path, name: str) -> list[StdioClient]:
    """``n`` daemons on ``store`` sharing one cache directory: the first builds the cache alone, the
    others start from it together (as editors reopening a project would)."""
    cache = work / f"cache-{name}"
    shutil.rmtree(cache, ignore_errors=True)
    first = spawn_daemon(store, cache, work / f"server-{name}-0.log")
    wait_ready([first])
    rest = [spawn_daemon(store, cache, work / f"server-{name}-{k}.log") for k in range(1, n)]
    wait_ready(rest)
    return [first, *rest]


def generation(client: StdioClient) -> int:
    return client.request("slayer/status", {})["generation"]


# --------------------------------------------------------------------------- what the clients ask


def request_pool(store: Path, rng: random.Random, size: int = 400) -> list[dict[str, Any]]:
    """A fixed mix of search requests drawn from the store (read with the project's loader)."""
    from slayer_lsp.catalog import load_catalog

    cat = load_catalog(store)
    leaves = [(mid, c) for mid, m in cat.models.items() if not m.hidden for c in m.columns if not c.hidden]
    memories = [m for m in cat.memories.values() if m.description or m.learning]
    pool: list[dict[str, Any]] = []
    while len(pool) < size:
        roll = rng.random()
        mid, col = rng.choice(leaves)
        model = mid.split(".", 1)[1]
        if roll < 0.30:
            question = f"{model.replace('_', ' ')} {col.name.replace('_', ' ')}"
        elif roll < 0.50:
            question = col.description or col.label or col.name.replace("_", " ")
        elif roll < 0.70:
            mem = rng.choice(memories)
            question = (mem.description or mem.learning.split("\n", 1)[0])[:200]
        else:
            question = None
        params: dict[str, Any] = {"max_results": 10}
        if question is None:
            params["entities"] = [f"{mid}.{col.name}"]
            if roll > 0.85:
                params["question"] = col.name.replace("_", " ")
        else:
            params["question"] = question
        pool.append(params)
    return pool


def model_ids(store: Path) -> list[tuple[str, str]]:
    from slayer_lsp.catalog import load_catalog

    cat = load_catalog(store)
    return [(m.data_source or "", m.name) for m in cat.models.values() if not m.hidden]


# --------------------------------------------------------------------------- clients


@dataclass
class Samples:
    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, seconds: float) -> None:
        with self.lock:
            self.latencies.append(seconds)


def client_loop(
    client: StdioClient,
    pool: list[dict[str, Any]],
    seed: int,
    stop: threading.Event,
    out: Samples,
    think_s: float,
) -> None:
    rng = random.Random(seed)
    while not stop.is_set():
        params = rng.choice(pool)
        t0 = time.perf_counter()
        try:
            client.request("slayer/search", params, timeout=120)
        except (RpcError, TimeoutError) as exc:
            out.errors.append(f"{type(exc).__name__}: {exc}")
            continue
        out.add(time.perf_counter() - t0)
        if think_s:
            stop.wait(think_s)


def run_clients(
    targets: list[StdioClient],
    pool: list[dict[str, Any]],
    seconds: float,
    think_s: float,
    during: threading.Thread | None = None,
) -> Samples:
    """One thread per target (a target may repeat: pipelined clients of one daemon) for ``seconds``."""
    out, stop = Samples(), threading.Event()
    threads = [
        threading.Thread(target=client_loop, args=(c, pool, 1000 + k, stop, out, think_s), daemon=True)
        for k, c in enumerate(targets)
    ]
    for th in threads:
        th.start()
    if during is not None:
        during.start()
    time.sleep(seconds)
    stop.set()
    for th in threads:
        th.join(150)
    return out


# --------------------------------------------------------------------------- the writer and staleness


@dataclass
class Staleness:
    changes: int = 0
    checks: int = 0  # one per daemon per change
    stale: int = 0
    late: int = 0  # stale, then right within LATE_WINDOW_S
    unannounced: int = 0
    announce_s: list[float] = field(default_factory=list)
    write_s: list[float] = field(default_factory=list)
    slow_writes: list[str] = field(default_factory=list)  # over 1 s, with SLayer's own timing
    notes: list[str] = field(default_factory=list)


def probe_word(k: int) -> str:
    """A made-up word (letters only, so every tokenizer keeps it whole) no store contains."""
    letters = ""
    k += 26 * 26
    while k:
        k, r = divmod(k, 26)
        letters = "abcdefghijklmnopqrstuvwxyz"[r] + letters
    return f"zqv{letters}"


def found(client: StdioClient, word: str, hit_id: str) -> bool:
    got = client.request("slayer/search", {"question": word, "max_results": 10}, timeout=120)
    return hit_id in [h["id"] for h in got["results"]]


def writer_loop(
    writer: env.SlayerWriter,
    daemons: list[StdioClient],
    models: list[tuple[str, str]],
    stop: threading.Event,
    st: Staleness,
    rng: random.Random,
) -> None:
    """Cycle add column / drop column / save memory / forget memory until ``stop``; check each change
    on every daemon as soon as that daemon announces it."""
    k = 0
    while not stop.is_set():
        k += 1
        word = probe_word(k)
        ds, model = rng.choice(models)
        column_id = f"{ds}.{model}.{word}"
        change(
            writer,
            daemons,
            st,
            "add_column",
            {"datasource": ds, "model": model, "name": word, "description": f"Load probe {word} column"},
            word,
            column_id,
            True,
        )
        change(
            writer,
            daemons,
            st,
            "drop_column",
            {"datasource": ds, "model": model, "name": word},
            word,
            column_id,
            False,
        )
        if stop.is_set():
            break
        memory_word = word + "m"
        saved = change(
            writer,
            daemons,
            st,
            "save_memory",
            {
                "learning": f"Load probe {memory_word}: a note the load writer saved.",
                "entities": [f"{ds}.{model}"],
            },
            memory_word,
            None,
            True,
        )
        change(
            writer,
            daemons,
            st,
            "forget_memory",
            {"id": saved["memory_id"]},
            memory_word,
            saved["memory_id"],
            False,
        )


def change(
    writer: env.SlayerWriter,
    daemons: list[StdioClient],
    st: Staleness,
    op: str,
    fields: dict[str, Any],
    word: str,
    hit_id: str | None,
    present: bool,
) -> Any:
    before = [generation(c) for c in daemons]
    t0 = time.perf_counter()
    result = writer.call(op, **fields)
    t1 = time.perf_counter()
    st.write_s.append(t1 - t0)
    if t1 - t0 > 1.0:
        st.slow_writes.append(f"{op} took {t1 - t0:.2f} s")
    st.changes += 1
    if hit_id is None:  # a new memory: its id is SLayer's answer
        hit_id = result["memory_id"]
    pending = dict(enumerate(daemons))
    while pending:
        for i, c in list(pending.items()):
            if generation(c) > before[i]:
                del pending[i]
                st.announce_s.append(time.perf_counter() - t1)
                check(c, i, st, op, word, hit_id, present)
        if pending and time.perf_counter() - t1 > ANNOUNCE_TIMEOUT_S:
            st.unannounced += len(pending)
            st.notes.append(f"{op} {hit_id}: daemons {sorted(pending)} never announced it")
            break
        if pending:
            time.sleep(0.02)
    return result


def check(
    client: StdioClient, index: int, st: Staleness, op: str, word: str, hit_id: str, present: bool
) -> None:
    st.checks += 1
    if found(client, word, hit_id) == present:
        return
    st.stale += 1
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < LATE_WINDOW_S:
        time.sleep(0.05)
        if found(client, word, hit_id) == present:
            st.late += 1
            st.notes.append(
                f"daemon {index}: {op} {hit_id} stale after the announcement, right "
                f"{time.perf_counter() - t0:.2f} s later"
            )
            return
    st.notes.append(
        f"daemon {index}: {op} {hit_id} stale after the announcement, still after {LATE_WINDOW_S} s"
    )


# --------------------------------------------------------------------------- one run


def summary_row(name: str, s: Samples, seconds: float, idle: Samples | None) -> list[object]:
    lat = s.latencies
    if not lat:
        return [name, 0, None, None, None, "-", str(len(s.errors)), "-"]
    ratio = "-"
    if idle is not None and idle.latencies:
        ratio = (
            f"{pct(lat, 50) / pct(idle.latencies, 50):.1f}x / {pct(lat, 99) / pct(idle.latencies, 99):.1f}x"
        )
    return [
        name,
        len(lat),
        pct(lat, 50),
        pct(lat, 99),
        max(lat),
        f"{len(lat) / seconds:.0f}",
        str(len(s.errors)),
        ratio,
    ]


def run_form(form: str, backend: str, source: Path, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(11)
    name = f"{form}-{backend}"
    store = env.copy_store(source, work / f"store-{name}" / ("yaml" if backend == "yaml" else "slayer.db"))
    pool = request_pool(store, rng)
    models = model_ids(store)
    n = args.clients
    t0 = time.perf_counter()
    daemons = start_daemons(store, n if form == "daemons" else 1, work, name)
    ready_s = time.perf_counter() - t0
    targets = daemons if form == "daemons" else daemons * n
    writer = env.SlayerWriter(store, venv=args.slayer_venv, log_path=work / f"slayer-writer-{name}.log")
    think = args.think_ms / 1000
    try:
        run_clients(daemons[:1], pool, min(3.0, args.idle_s), 0)  # warm-up: first searches load the indexes
        idle = run_clients(daemons[:1], pool, args.idle_s, think)
        crowd = run_clients(targets, pool, args.idle_s, think)
        st, stop = Staleness(), threading.Event()
        writer_thread = threading.Thread(
            target=writer_loop, args=(writer, daemons, models, stop, st, rng), daemon=True
        )
        loaded = run_clients(targets, pool, args.load_s, think, during=writer_thread)
        stop.set()  # the writer finishes its current change (and checks it) before it stops
        writer_thread.join(ANNOUNCE_TIMEOUT_S * 4)
        rss = [rss_mb(c.proc.pid)[0] for c in daemons]
    finally:
        writer.close()
        codes = [c.close() for c in daemons]
    return {
        "form": form,
        "backend": backend,
        "ready_s": ready_s,
        "idle": idle,
        "crowd": crowd,
        "loaded": loaded,
        "staleness": st,
        "rss": rss,
        "codes": codes,
        "args": args,
    }


def report(res: dict[str, Any]) -> None:
    args, n = res["args"], res["args"].clients
    form = (
        f"{n} daemons, one client each"
        if res["form"] == "daemons"
        else f"1 daemon, {n} pipelined client threads"
    )
    title = (
        f"{form}; {res['backend']} store {args.size}; think {args.think_ms:g} ms; ready in "
        f"{res['ready_s']:.1f} s; RSS {min(res['rss']):.0f}-{max(res['rss']):.0f} MiB per daemon; "
        f"exit codes {sorted(set(res['codes']))}"
    )
    idle = res["idle"]
    rows = [
        summary_row("idle: 1 client, no writer", idle, args.idle_s, None),
        summary_row(f"{n} clients, no writer", res["crowd"], args.idle_s, idle),
        summary_row(f"{n} clients + SLayer writer", res["loaded"], args.load_s, idle),
    ]
    env.print_table(
        ["slayer/search", "n", "p50", "p99", "max", "req/s", "errors", "p50 / p99 vs idle"], rows, title=title
    )
    st: Staleness = res["staleness"]
    loaded = res["loaded"].latencies
    verdict = "-"
    crowd = res["crowd"].latencies
    if loaded and crowd:
        ratio = pct(loaded, 99) / pct(crowd, 99)
        verdict = f"p99 {ratio:.2f}x the same {n} clients without the writer: " + (
            "ok" if ratio <= TARGET_RATIO else f"over the {TARGET_RATIO:g}x target"
        )
    env.print_table(
        ["store changes (SLayer writer)", "value"],
        [
            ["changes written / checks (daemon x change)", f"{st.changes} / {st.checks}"],
            [
                "stale results after the announcement",
                f"{st.stale} (late {st.late}, never {st.stale - st.late})",
            ],
            ["changes never announced (60 s)", str(st.unannounced)],
            [
                "SLayer write p50 / p99",
                f"{env.fmt_seconds(pct(st.write_s, 50)) if st.write_s else '-'} / "
                f"{env.fmt_seconds(pct(st.write_s, 99)) if st.write_s else '-'}",
            ],
            [
                "write done -> announced p50 / p99",
                f"{env.fmt_seconds(pct(st.announce_s, 50)) if st.announce_s else '-'} / "
                f"{env.fmt_seconds(pct(st.announce_s, 99)) if st.announce_s else '-'}",
            ],
            ["latency target", verdict],
        ],
    )
    for note in st.notes[:20] + st.slow_writes[:10]:
        print(f"  ! {note}")
    for label, s in (("idle", idle), ("clients", res["crowd"]), ("load", res["loaded"])):
        for err in sorted(set(s.errors))[:5]:
            print(f"  ! {label} error: {err}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--size", default="100x1000", help="MODELSxMEMORIES of the generated store (e.g. 1000x5000)"
    )
    ap.add_argument("--backends", default="yaml,sqlite")
    ap.add_argument("--forms", default="daemons,pipelined")
    ap.add_argument(
        "--clients", type=int, default=8, help="N: daemons (form daemons) or client threads (pipelined)"
    )
    ap.add_argument("--idle-s", type=float, default=15.0, help="seconds of each no-writer phase")
    ap.add_argument("--load-s", type=float, default=45.0, help="seconds of the phase with the writer")
    ap.add_argument("--think-ms", type=float, default=0.0, help="pause of each client between its requests")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs, store copies)")
    env.add_venv_option(ap)
    args = ap.parse_args(argv)
    ((models, memories),) = env.parse_sizes(args.size)
    work = Path(tempfile.mkdtemp(prefix="load-clients-", dir=env.work_dir()))
    try:
        for backend in args.backends.split(","):
            source = env.generated_store(models, memories, backend, venv=args.slayer_venv)
            for form in args.forms.split(","):
                if form not in ("daemons", "pipelined"):
                    raise SystemExit(f"unknown form {form!r}: daemons or pipelined")
                report(run_form(form, backend, source, work, args))
    finally:
        if args.keep:
            print(f"\nwork directory kept: {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
