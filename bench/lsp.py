"""The language server through its stdio protocol: request latency, change-to-visible latency, memory.

    python bench/lsp.py [--requests N] [--edits N] [--edit-gap S] [--embeddings] [--editor MxCxMEMxQ]
                        [--large MODELSxCOLUMNSxMEMORIES] [--edit-size MODELSxMEMORIES] [--slayer-venv PATH]

Spawns ``python -m slayer_lsp serve --storage S`` exactly as an editor would and talks JSON-RPC to it
through a small client of its own (standard library only: a reader thread, Content-Length framing),
so every figure includes the wire, the event loop and the worker-thread hop. Stores are written by
SLayer itself (``shared/tools/gen_slayer_storage.py`` run in the motley-slayer venv) and cached
under ``bench/.work``; the daemon gets a fresh cache directory, so indexing is cold.

1. Large store (default 2,000 models x 48 columns + 2,000 memories: ~100k canonical ids):
   time to the first complete index, daemon RSS after indexing, then completion and hover p50/p99
   over open query documents (each request answered; the documents' diagnostics already published):
   leaves after ``ds.model.``, models after ``ds.``, ``source_model:``, leaves inside ``sum(``;
   hover on a column and on a model.
2. Change-to-visible (default 1,000 models / 5,000 memories, target <= 300 ms): a private copy of
   the store; one model file gains a column, written as SLayer writes (a dot-prefixed temp file
   renamed into place); the clock runs from the rename until a completion request first offers the
   new column (a request every ``--poll-ms``, 10 ms by default: a client that asks back to back
   competes with the refresh for the GIL). The server's own log lines give the refresh cost.
   Edits are spaced by ``--edit-gap`` seconds so each starts from a quiet daemon (the full-text
   compaction that follows a change runs 2 s after it). The same on the large store.

The dense channel (the embedding worker) is off unless ``--embeddings``: embedding 100k texts on a
laptop CPU takes a long time and would compete with the requests being timed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _slayer_env as env  # noqa: E402

TARGET_VISIBLE_S = 0.300


# --------------------------------------------------------------------------- a minimal LSP client


class RpcError(RuntimeError):
    def __init__(self, error: dict[str, Any]) -> None:
        super().__init__(f"{error.get('code')}: {error.get('message')}")
        self.code = error.get("code")


class StdioClient:
    """JSON-RPC 2.0 over a child's stdin/stdout with LSP's ``Content-Length`` framing. Server
    requests (progress creation, configuration) are answered with ``null``; notifications are kept
    per method (the last few hundred)."""

    def __init__(self, cmd: list[str], *, cwd: Path, env_vars: dict[str, str], log_path: Path) -> None:
        self.log = open(log_path, "wb")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            cmd, cwd=cwd, env=env_vars, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log
        )
        self._lock = threading.Lock()
        self._next = 0
        self._pending: dict[int, Future] = {}
        self.notifications: dict[str, list[Any]] = {}
        self._reader = threading.Thread(target=self._read, name="lsp-bench-reader", daemon=True)
        self._reader.start()

    def _send(self, message: dict[str, Any]) -> None:
        body = json.dumps(message, separators=(",", ":")).encode("utf-8")
        with self._lock:
            self.proc.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)  # type: ignore[union-attr]
            self.proc.stdin.flush()  # type: ignore[union-attr]

    def _read(self) -> None:
        out = self.proc.stdout
        assert out is not None
        while True:
            length = None
            while True:
                line = out.readline()
                if not line:
                    return
                line = line.strip()
                if not line:
                    break
                name, _, value = line.partition(b":")
                if name.lower() == b"content-length":
                    length = int(value)
            if length is None:
                continue
            msg = json.loads(out.read(length))
            if "method" in msg and "id" in msg:  # a request from the server
                self._send({"jsonrpc": "2.0", "id": msg["id"], "result": None})
            elif "method" in msg:
                kept = self.notifications.setdefault(msg["method"], [])
                kept.append(msg.get("params"))
                del kept[:-500]
            else:
                fut = self._pending.pop(msg.get("id"), None)
                if fut is not None:
                    if "error" in msg:
                        fut.set_exception(RpcError(msg["error"]))
                    else:
                        fut.set_result(msg.get("result"))

    def request(self, method: str, params: Any = None, timeout: float = 120.0) -> Any:
        with self._lock:
            self._next += 1
            msg_id = self._next
        fut: Future = Future()
        self._pending[msg_id] = fut
        self._send({"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params})
        return fut.result(timeout)

    def notify(self, method: str, params: Any = None) -> None:
        self._send({"jsonrpc": "2.0", "method": method, "params": params})

    def close(self) -> int:
        try:
            self.request("shutdown", None, timeout=60)
            self.notify("exit")
            code = self.proc.wait(30)
        except Exception:  # noqa: BLE001 - a benchmark still reports what it measured
            self.proc.kill()
            code = self.proc.wait()
        self.log.close()
        return code


def start_server(
    store: Path, work: Path, *, embeddings: bool, name: str, root: Path | None = None
) -> tuple[StdioClient, float]:
    """Spawn the daemon on ``store`` with a fresh cache and wait for its first complete index;
    returns the client and the seconds from spawn to ready."""
    cache = work / f"cache-{name}"
    shutil.rmtree(cache, ignore_errors=True)
    variables = {**os.environ, "SLAYER_LSP_CACHE_DIR": str(cache), "PYTHONPATH": str(env.REPO)}
    t0 = time.perf_counter()
    client = StdioClient(
        [sys.executable, "-m", "slayer_lsp", "serve", "--storage", str(store)],
        cwd=env.REPO,
        env_vars=variables,
        log_path=work / f"server-{name}.log",
    )
    client.request(
        "initialize",
        {
            "processId": os.getpid(),
            "rootUri": root.as_uri() if root else None,
            "capabilities": {"window": {"workDoneProgress": True}},
            "initializationOptions": {"embedding": {"enable": embeddings}},
        },
    )
    client.notify("initialized", {})
    while not client.request("slayer/status", {})["ready"]:
        time.sleep(0.02)
    return client, time.perf_counter() - t0


def rss_mb(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of a process in MiB, from /proc."""
    fields = {}
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            key, _, value = line.partition(":")
            fields[key] = value.strip()
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


# --------------------------------------------------------------------------- stores


def large_store(models: int, columns: int, memories: int, venv: str | None) -> Path:
    """A YAML store written by SLayer with ``columns`` columns per model, built once and cached."""
    return env.generated_store(models, memories, "yaml", columns=columns, venv=venv)


def read_models(store: Path) -> list[tuple[str, str, list[str], Path]]:
    """(datasource, model, visible column names, file) of every model of a YAML store, read with
    the project's own loader (the benchmark must know what to ask for)."""
    from slayer_lsp.catalog import load_catalog

    cat = load_catalog(store)
    out = []
    for mid, model in cat.models.items():
        if model.hidden:
            continue
        cols = [c.name for c in model.columns if not c.hidden]
        source = cat.get(mid).source  # type: ignore[union-attr]
        if cols and source is not None:
            out.append((model.data_source or "", model.name, cols, Path(source.path)))
    return out


# --------------------------------------------------------------------------- figures


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def summary(values: list[float]) -> list[object]:
    return [len(values), pct(values, 50), pct(values, 99), max(values)]


def open_documents(
    client: StdioClient, models: list[tuple[str, str, list[str], Path]], n: int, rng: random.Random
) -> list[dict[str, Any]]:
    """``n`` query documents, each on one model, with every completion and hover spot marked."""
    docs = []
    for k, (ds, name, cols, _) in enumerate(rng.sample(models, min(n, len(models)))):
        col = rng.choice(cols)
        lines = [
            f"source_model: {ds}.{name}",
            f"dimensions: [{ds}.{name}.{col}, {ds}.{name}.]",
            "measures: [sum(]",
            f'filters: ["{ds}."]',
            "limit: 10",
        ]
        text = "\n".join(lines) + "\n"
        uri = f"file:///bench/ws/q{k}.query.yaml"
        client.notify(
            "textDocument/didOpen",
            {"textDocument": {"uri": uri, "languageId": "yaml", "version": 1, "text": text}},
        )
        docs.append(
            {
                "uri": uri,
                "model": (ds, name),
                "spots": {
                    "leaves after ds.model.": (1, len(lines[1]) - 1),
                    "models after ds.": (3, len(lines[3]) - 2),
                    "source_model": (0, len("source_model: ")),
                    "inside sum(": (2, len("measures: [sum(")),
                },
                "hover": {
                    "column": (1, len(f"dimensions: [{ds}.{name}.") + 1),
                    "model": (0, len(f"source_model: {ds}.") + 1),
                },
            }
        )
    deadline = time.time() + 300
    while time.time() < deadline:  # every document checked once: the parse and binding are warm
        published = {p["uri"] for p in client.notifications.get("textDocument/publishDiagnostics", [])}
        if all(d["uri"] in published for d in docs):
            break
        time.sleep(0.05)
    return docs


def timed(client: StdioClient, method: str, params: dict[str, Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    result = client.request(method, params)
    return time.perf_counter() - t0, result


def bench_requests(client: StdioClient, docs: list[dict[str, Any]], n: int) -> list[list[object]]:
    rows = []
    kinds = list(docs[0]["spots"])
    for kind in kinds:
        times, sizes = [], []
        for i in range(n):
            doc = docs[i % len(docs)]
            line, col = doc["spots"][kind]
            dt, res = timed(
                client,
                "textDocument/completion",
                {"textDocument": {"uri": doc["uri"]}, "position": {"line": line, "character": col}},
            )
            times.append(dt)
            sizes.append(len((res or {}).get("items") or []))
        empty = sizes.count(0)
        rows.append(
            [
                f"completion: {kind}",
                *summary(times),
                f"{statistics.mean(sizes):.0f} items on average" + (f", {empty} empty" if empty else ""),
            ]
        )
    for kind in docs[0]["hover"]:
        times, empty = [], 0
        for i in range(n):
            doc = docs[i % len(docs)]
            line, col = doc["hover"][kind]
            dt, res = timed(
                client,
                "textDocument/hover",
                {"textDocument": {"uri": doc["uri"]}, "position": {"line": line, "character": col}},
            )
            times.append(dt)
            empty += not res
        rows.append(
            [f"hover: {kind}", *summary(times), "all answered" if not empty else f"{empty} not answered"]
        )
    return rows


_REFRESH_LOG = re.compile(
    r"store changed \((\d+) path\(s\)\): (\d+) entities touched in (\d+) ms"
    r"(?:, (\d+) ms after the write)?"
)


def add_column(text: str, name: str) -> str:
    """The model's YAML with one more column at the end of its ``columns:`` list (SLayer's layout:
    top-level keys at column 0, list items as ``- name: ...``)."""
    lines = text.split("\n")
    start = lines.index("columns:")
    end = next(
        (i for i in range(start + 1, len(lines)) if lines[i] and not lines[i].startswith(("-", " "))),
        len(lines),
    )
    block = [
        f"- name: {name}",
        f"  sql: {name}",
        "  type: TEXT",
        "  description: Added by the benchmark",
        "  hidden: false",
    ]
    return "\n".join(lines[:end] + block + lines[end:])


def bench_edits(
    client: StdioClient,
    models: list[tuple[str, str, list[str], Path]],
    log_path: Path,
    n: int,
    gap: float,
    poll: float,
    rng: random.Random,
) -> tuple[list[float], list[float], list[int], list[int]]:
    """Seconds from the atomic rename of an edited model file until completion offers the new column,
    then until search finds it; from the server's log, its refresh times and how long after the
    write each refresh started (ms)."""
    visible, searchable = [], []
    for k, (ds, name, _cols, path) in enumerate(rng.sample(models, n)):
        uri = f"file:///bench/ws/edit{k}.query.yaml"
        text = f"source_model: {ds}.{name}\ndimensions: [{ds}.{name}.]\n"
        client.notify(
            "textDocument/didOpen",
            {"textDocument": {"uri": uri, "languageId": "yaml", "version": 1, "text": text}},
        )
        position = {
            "textDocument": {"uri": uri},
            "position": {"line": 1, "character": len(f"dimensions: [{ds}.{name}.")},
        }
        column = f"bench_added_{k}"
        assert column not in {
            i["label"] for i in client.request("textDocument/completion", position)["items"]
        }
        time.sleep(gap)
        new_text = add_column(path.read_text(), column)
        tmp = path.parent / f".{path.name}.tmp.bench{k}"
        tmp.write_text(new_text)
        t0 = time.perf_counter()
        os.replace(tmp, path)
        while True:
            res = client.request("textDocument/completion", position)
            if column in {i["label"] for i in (res or {}).get("items", [])}:
                visible.append(time.perf_counter() - t0)
                break
            if time.perf_counter() - t0 > 30:
                raise RuntimeError(f"the new column {ds}.{name}.{column} never became visible")
            time.sleep(poll)
        hit = f"{ds}.{name}.{column}"
        while hit not in [
            h["id"]
            for h in client.request(
                "slayer/search", {"question": column.replace("_", " "), "max_results": 20}
            )["results"]
        ]:
            if time.perf_counter() - t0 > 30:
                raise RuntimeError(f"search never found {hit}")
            time.sleep(poll)
        searchable.append(time.perf_counter() - t0)
    time.sleep(0.5)
    found = list(_REFRESH_LOG.finditer(log_path.read_text(errors="replace")))[-n:]
    refresh_ms = [int(m.group(3)) for m in found]
    lag_ms = [int(m.group(4)) for m in found if m.group(4) is not None]
    return visible, searchable, refresh_ms, lag_ms


def run_edits(
    store: Path, work: Path, name: str, args: argparse.Namespace, rng: random.Random
) -> list[list[object]]:
    slug = re.sub(r"\W+", "-", name)
    copy = env.copy_store(store, work / f"edit-{slug}")
    models = read_models(copy)
    client, ready_s = start_server(copy, work, embeddings=args.embeddings, name=f"edit-{slug}")
    try:
        visible, searchable, refresh_ms, lag_ms = bench_edits(
            client,
            models,
            work / f"server-edit-{slug}.log",
            args.edits,
            args.edit_gap,
            args.poll_ms / 1000,
            rng,
        )
    finally:
        client.close()
    verdict = "ok" if pct(visible, 50) <= TARGET_VISIBLE_S else "MISSED"
    return [
        [
            f"{name}: completion sees the edit",
            *summary(visible),
            f"target {TARGET_VISIBLE_S * 1000:.0f} ms (p50): {verdict}",
        ],
        [f"{name}: search finds it", *summary(searchable), ""],
        [f"{name}: write -> refresh starts (log)", *ms_summary(lag_ms), "watcher: poll step + quiet period"],
        [f"{name}: refresh (log)", *ms_summary(refresh_ms), f"read + index update; ready in {ready_s:.1f} s"],
    ]


def ms_summary(values_ms: list[int]) -> list[object]:
    if not values_ms:
        return [0, None, None, None]
    return summary([v / 1000 for v in values_ms])


def parse_size(text: str, parts: int) -> tuple[int, ...]:
    values = tuple(int(v) for v in text.lower().split("x"))
    if len(values) != parts:
        raise argparse.ArgumentTypeError(f"expected {parts} numbers joined by 'x', got {text!r}")
    return values


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=300, help="requests per completion/hover kind")
    ap.add_argument("--edits", type=int, default=20, help="one-model edits per store")
    ap.add_argument("--edit-gap", type=float, default=6.0, help="quiet seconds before each edit")
    ap.add_argument(
        "--poll-ms",
        type=float,
        default=10.0,
        help="pause between the requests that wait for an edit (0: back to back)",
    )
    ap.add_argument("--large", default="2000x48x2000", help="MODELSxCOLUMNSxMEMORIES of the request store")
    ap.add_argument("--edit-size", default="1000x5000", help="MODELSxMEMORIES of the change-to-visible store")
    ap.add_argument("--embeddings", action="store_true", help="run the dense channel's worker too")
    ap.add_argument(
        "--skip-large-edits", action="store_true", help="no change-to-visible run on the large store"
    )
    ap.add_argument("--only-edits", action="store_true", help="only the change-to-visible runs")
    ap.add_argument(
        "--editor",
        metavar="MODELSxCOLUMNSxMEMORIESxQUERIES",
        help="only the editor runs: rename and code lens resolve p50 on a generated store with QUERIES "
        "query files in the workspace (the issue's figure: 2000x48x2000x500)",
    )
    ap.add_argument("--keep", action="store_true", help="keep the work directory (server logs, store copies)")
    env.add_venv_option(ap)
    args = ap.parse_args(argv)
    large_size = parse_size(args.large, 3)
    edit_size = parse_size(args.edit_size, 2)
    rng = random.Random(7)
    if args.editor:
        models_n, cols_n, mems_n, queries_n = parse_size(args.editor, 4)
        store = large_store(models_n, cols_n, mems_n, venv=args.slayer_venv)
        work = Path(tempfile.mkdtemp(prefix="lsp-bench-", dir=env.work_dir()))
        try:
            rows = run_editor(store, work, queries_n, min(args.requests, 50), rng)
            env.print_table(
                ["editor request (round trip through stdio)", "n", "p50", "p99", "max", "note"],
                rows,
                title=f"{models_n} models x {cols_n} columns, {mems_n} memories, {queries_n} query files",
            )
        finally:
            cleanup(work, args.keep)
        return 0

    large = large_store(*large_size, venv=args.slayer_venv)
    edit_store = env.generated_store(*edit_size, "yaml", venv=args.slayer_venv)
    work = Path(tempfile.mkdtemp(prefix="lsp-bench-", dir=env.work_dir()))
    if args.only_edits:
        try:
            edit_rows = run_edits(
                edit_store, work, f"{edit_size[0]} models / {edit_size[1]} memories", args, rng
            )
            if not args.skip_large_edits:
                edit_rows += run_edits(large, work, "large store", args, rng)
            env.print_table(
                ["change-to-visible (rename -> answer)", "n", "p50", "p99", "max", "note"], edit_rows
            )
        finally:
            cleanup(work, args.keep)
        return 0
    try:
        from slayer_lsp.catalog import load_catalog

        ids = len(load_catalog(large).entities)
        client, ready_s = start_server(large, work, embeddings=args.embeddings, name="large")
        try:
            rss, peak = rss_mb(client.proc.pid)
            status = client.request("slayer/status", {})
            models = read_models(large)
            docs = open_documents(client, models, 50, rng)
            rows = bench_requests(client, docs, args.requests)
            rss_after, peak_after = rss_mb(client.proc.pid)
        finally:
            code = client.close()
        print(
            f"\nlarge store: {large_size[0]} models x {large_size[1]} columns, {large_size[2]} memories: "
            f"{ids} canonical ids ({status['counts']}); dense channel {'on' if args.embeddings else 'off'}"
        )
        env.print_table(
            ["daemon", "value"],
            [
                ["first complete index (spawn -> ready, cold cache)", ready_s],
                ["RSS after indexing", f"{rss:.0f} MiB (peak so far {peak:.0f} MiB)"],
                ["RSS after the request runs", f"{rss_after:.0f} MiB (peak {peak_after:.0f} MiB)"],
                ["exit code after shutdown/exit", str(code)],
            ],
        )
        env.print_table(
            ["request (round trip through stdio)", "n", "p50", "p99", "max", "answers"],
            rows,
            title=f"requests on {len(docs)} open query documents, {ids} ids",
        )

        edit_rows = run_edits(edit_store, work, f"{edit_size[0]} models / {edit_size[1]} memories", args, rng)
        if not args.skip_large_edits:
            edit_rows += run_edits(large, work, f"{ids // 1000}k ids", args, rng)
        env.print_table(
            ["change-to-visible (rename -> answer)", "n", "p50", "p99", "max", "note"],
            edit_rows,
            title="one-model edit on disk, seen by the next requests (watcher debounce included)",
        )
    finally:
        cleanup(work, args.keep)
    return 0


def run_editor(
    store: Path, work: Path, n_queries: int, n_requests: int, rng: random.Random
) -> list[list[Any]]:
    """Rename and code lens resolve on ``store`` with ``n_queries`` query files on disk in the
    workspace (each on one model, naming three of its columns): ``textDocument/rename`` of a column
    from an open query (the whole WorkspaceEdit: every query file, memory and model file of the
    datasource) and ``codeLens/resolve`` of the lenses of an open model file (impact counts)."""
    models = read_models(store)
    ws = work / "workspace"
    (ws / "queries").mkdir(parents=True, exist_ok=True)
    names = [m[1] for m in models]
    picked = [m for m in models if len(m[2]) >= 3 and names.count(m[1]) == 1]  # a bare source_model resolves
    chosen = [rng.choice(picked) for _ in range(n_queries)]
    for k, (_ds, name, cols, _) in enumerate(chosen):
        (ws / "queries" / f"q{k}.yaml").write_text(
            f"source_model: {name}\ndimensions: [{cols[0]}, {cols[1]}]\nmeasures: [sum({cols[2]})]\n"
        )
    client, _ready = start_server(store, work, embeddings=False, name="editor", root=ws)
    rows = []
    try:
        renames, lenses_s, n_lenses, edits = [], [], 0, 0
        for k in range(n_requests):
            ds, name, cols, path = chosen[k % len(chosen)]
            uri = (ws / "queries" / f"q{k % len(chosen)}.yaml").as_uri()
            text = (ws / "queries" / f"q{k % len(chosen)}.yaml").read_text()
            client.notify(
                "textDocument/didOpen",
                {"textDocument": {"uri": uri, "languageId": "yaml", "version": 1, "text": text}},
            )
            t0 = time.perf_counter()
            got = client.request(
                "textDocument/rename",
                {
                    "textDocument": {"uri": uri},
                    "position": {"line": 1, "character": 14},
                    "newName": f"renamed_{k}",
                },
            )
            renames.append(time.perf_counter() - t0)
            edits += sum(len(v) for v in (got or {}).get("changes", {}).values())
            client.notify("textDocument/didClose", {"textDocument": {"uri": uri}})
            muri = path.as_uri()
            client.notify(
                "textDocument/didOpen",
                {"textDocument": {"uri": muri, "languageId": "yaml", "version": 1, "text": path.read_text()}},
            )
            lenses = client.request("textDocument/codeLens", {"textDocument": {"uri": muri}}) or []
            for lens in lenses[:10]:
                t0 = time.perf_counter()
                client.request("codeLens/resolve", lens)
                lenses_s.append(time.perf_counter() - t0)
                n_lenses += 1
            client.notify("textDocument/didClose", {"textDocument": {"uri": muri}})
        rows.append(
            [
                "rename (column, from an open query)",
                len(renames),
                fmt(pct(renames, 50)),
                fmt(pct(renames, 99)),
                fmt(max(renames)),
                f"{edits / max(1, len(renames)):.1f} edits each",
            ]
        )
        rows.append(
            [
                "codeLens/resolve (model and column lenses)",
                n_lenses,
                fmt(pct(lenses_s, 50)),
                fmt(pct(lenses_s, 99)),
                fmt(max(lenses_s)),
                "",
            ]
        )
    finally:
        client.close()
    return rows


def fmt(seconds: float) -> str:
    return env.fmt_seconds(seconds)


def cleanup(work: Path, keep: bool) -> None:
    if keep:
        print(f"\nwork directory kept: {work}", file=sys.stderr)
    else:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
