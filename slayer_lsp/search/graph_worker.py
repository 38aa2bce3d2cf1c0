"""The process that holds the ``cypher_filter`` graph, and the messages it speaks.

A filter is the caller's code: some of it grows values without bound (``replace(s, 'a', s)``
chained through ``WITH``) or runs for hours inside one engine call that never checks its timeout
(``levenshtein`` over a built string). No check of the text can know every such query, so the
LadybugDB database lives here, in a child process under hard limits, and the daemon only talks to
it: a filter that runs away costs this process (killed and replaced), never the daemon's memory,
threads or locks. ``slayer_lsp.search.graph.GraphIndex`` is the daemon's side.

The child is started as ``python -m slayer_lsp.search.graph_worker LIMITS`` (``Limits`` as JSON).
Before importing LadybugDB it caps its own address space (``RLIMIT_AS``; the allocation that
crosses it fails, the engine reports ``std::bad_alloc``) and core dumps, and before each request
its CPU time (``RLIMIT_CPU`` soft limit: the kernel ends it with SIGXCPU even if no one is
listening any more). It exits when its parent goes away. It imports nothing from slayer_lsp but
this module, so it starts in a few tens of milliseconds.

Wire: each message is a 4-byte big-endian length and a msgpack body. The child answers its start
with one ``Done`` (or ``Failed``) and then every request with exactly one reply, in order.
"""

from __future__ import annotations

import contextlib
import csv
import io
import os
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

if TYPE_CHECKING:  # imported at run time only after the address-space cap (see _Graph)
    import ladybug

# --------------------------------------------------------------------------- messages


class Limits(msgspec.Struct, frozen=True):
    """What the child may use: set by the parent at start."""

    address_space_bytes: int
    buffer_pool_bytes: int
    max_db_bytes: int
    threads: int


class EdgeRows(msgspec.Struct, array_like=True):
    rel: str
    src: str
    dst: str
    rows: list[list[str]]


class Build(msgspec.Struct, tag="build"):
    """Load these rows into the (empty) graph."""

    nodes: dict[str, list[list[str]]]
    edges: list[EdgeRows]
    cpu_s: int


class Apply(msgspec.Struct, tag="apply"):
    """Delete the named units (a model with its leaves), then load the rows that replace them."""

    memories: list[str]
    models: list[str]
    datasources: list[str]
    nodes: dict[str, list[list[str]]]
    edges: list[EdgeRows]
    cpu_s: int


class Query(msgspec.Struct, tag="query"):
    """Run a validated filter; answer the distinct values of its ``id`` column."""

    text: str
    timeout_ms: int
    max_rows: int
    max_id_bytes: int
    cpu_s: int


class Counts(msgspec.Struct, tag="counts"):
    cpu_s: int


class Done(msgspec.Struct, tag="done"):
    ids: list[str] = []
    counts: dict[str, int] = {}


class Failed(msgspec.Struct, tag="failed"):
    """``reason``: unavailable (no LadybugDB), timeout, memory, rows, ids (too many bytes), column
    (no id column), value (the id column holds nodes or lists), error (anything else)."""

    reason: str
    message: str


Request = Build | Apply | Query | Counts
Reply = Done | Failed

_HEADER = struct.Struct(">I")

# --------------------------------------------------------------------------- schema (shared)

NODE_COLUMNS = {
    "Memory": ("id", "learning", "description"),
    "Datasource": ("id", "name", "description"),
    "Model": ("id", "name", "description"),
    "ModelColumn": ("id", "name", "data_type", "description"),
    "Measure": ("id", "name", "description"),
    "Aggregation": ("id", "name", "description"),
}
REL_PAIRS = {
    "MENTIONS": tuple(
        ("Memory", t) for t in ("Datasource", "Model", "ModelColumn", "Measure", "Aggregation", "Memory")
    ),
    "CONTAINS": (
        ("Datasource", "Model"),
        ("Model", "ModelColumn"),
        ("Model", "Measure"),
        ("Model", "Aggregation"),
    ),
    "JOINS": (("Model", "Model"),),
}
REL_PROPS = {"JOINS": ("cardinality",)}

# Node sets up to this size are created with one UNWIND statement, larger ones with COPY (UNWIND
# costs ~20 us a row, COPY ~2 us a row plus ~1.5 ms a statement; see bench/graph_build.py).
_UNWIND_MAX_ROWS = 100


def encode(message: msgspec.Struct) -> bytes:
    body = msgspec.msgpack.encode(message)
    return _HEADER.pack(len(body)) + body


def frame_length(header: bytes) -> int:
    return _HEADER.unpack(header)[0]


HEADER_BYTES = _HEADER.size
_reply_decoder = msgspec.msgpack.Decoder(Reply)
_request_decoder = msgspec.msgpack.Decoder(Request)


def decode_reply(body: bytes) -> Reply:
    return _reply_decoder.decode(body)


# --------------------------------------------------------------------------- the child


def _schema_statements() -> Iterator[str]:
    for table, cols in NODE_COLUMNS.items():
        yield f"CREATE NODE TABLE {table}({', '.join(f'{c} STRING' for c in cols)}, PRIMARY KEY(id))"
    for rel, pairs in REL_PAIRS.items():
        props = "".join(f", {p} STRING" for p in REL_PROPS.get(rel, ()))
        yield f"CREATE REL TABLE {rel}({', '.join(f'FROM {a} TO {b}' for a, b in pairs)}{props})"


def _quote_path(path: Path) -> str:
    return "'" + str(path).replace("\\", "\\\\").replace("'", "\\'") + "'"


def _no_nul(text: str) -> str:
    """LadybugDB's CSV reader rejects NUL; it is dropped on both load paths so they agree."""
    return text.replace("\x00", "") if "\x00" in text else text


def _load(conn: Any, nodes: dict[str, list[list[str]]], edges: list[EdgeRows]) -> None:
    """Load rows: edges and large node sets through ``COPY ... FROM`` temporary CSV files, small node
    sets through one parameterised UNWIND each (cheaper below about a hundred rows). Edges always
    use COPY: it finds endpoints through the primary-key index, whereas ``UNWIND ... MATCH`` joins
    against a scan of the whole endpoint table.

    The CSV is fully quoted, so '' stays '' rather than NULL and newlines survive; it is read
    sequentially because LadybugDB's parallel CSV reader cannot split quoted newlines."""
    jobs: list[tuple[str, list[list[str]], str]] = []
    for table, lst in nodes.items():
        if table not in NODE_COLUMNS:
            raise ValueError(f"unknown node table {table!r}")
        if len(lst) <= _UNWIND_MAX_ROWS:
            _create_nodes(conn, table, lst)
        else:
            jobs.append((table, lst, ""))
    for e in edges:
        if (e.src, e.dst) not in REL_PAIRS.get(e.rel, ()):
            raise ValueError(f"unknown relationship {e.rel} {e.src}->{e.dst}")
        jobs.append((e.rel, e.rows, f", from='{e.src}', to='{e.dst}'"))
    jobs = [job for job in jobs if job[1]]
    if not jobs:
        return
    with tempfile.TemporaryDirectory(prefix="slayer-lsp-graph-") as tmp:
        for n, (table, lst, extra) in enumerate(jobs):  # nodes first: edges look their endpoints up
            buf = io.StringIO()
            csv.writer(buf, quoting=csv.QUOTE_ALL).writerows(lst)
            path = Path(tmp) / f"{n}.csv"
            path.write_text(_no_nul(buf.getvalue()), encoding="utf-8", errors="replace", newline="")
            conn.execute(f"COPY {table} FROM {_quote_path(path)} (HEADER=false, PARALLEL=false{extra})")


def _create_nodes(conn: Any, table: str, lst: list[list[str]]) -> None:
    if not lst:
        return
    cols = NODE_COLUMNS[table]
    props = ", ".join(f"{c}: r.{c}" for c in cols)
    conn.execute(
        f"UNWIND $rows AS r CREATE (:{table} {{{props}}})",
        {"rows": [dict(zip(cols, map(_no_nul, row), strict=True)) for row in lst]},
    )


def _memory_error(message: str) -> bool:
    low = message.lower()
    return "bad_alloc" in low or "buffer pool is full" in low or "out of memory" in low or "mmap" in low


class _Graph:
    """The database and the two connections of the child (one writes rows, one runs filters)."""

    def __init__(self, limits: Limits) -> None:
        import ladybug

        self.db = ladybug.Database(
            ":memory:",
            buffer_pool_size=limits.buffer_pool_bytes,
            max_db_size=limits.max_db_bytes,
            max_num_threads=limits.threads,
        )
        self.writer = ladybug.Connection(self.db)
        self.reader = ladybug.Connection(self.db)
        for stmt in _schema_statements():
            self.writer.execute(stmt)

    def build(self, req: Build) -> Reply:
        _load(self.writer, req.nodes, req.edges)
        return Done()

    def apply(self, req: Apply) -> Reply:
        conn = self.writer
        # DETACH DELETE also drops every edge into the removed nodes; the parent sends those from
        # untouched units again.
        if req.memories:
            conn.execute("MATCH (n:Memory) WHERE n.id IN $ids DETACH DELETE n", {"ids": req.memories})
        if req.models:
            conn.execute(
                "MATCH (m:Model)-[:CONTAINS]->(n) WHERE m.id IN $ids DETACH DELETE n", {"ids": req.models}
            )
            conn.execute("MATCH (m:Model) WHERE m.id IN $ids DETACH DELETE m", {"ids": req.models})
        if req.datasources:
            conn.execute("MATCH (n:Datasource) WHERE n.id IN $ids DETACH DELETE n", {"ids": req.datasources})
        _load(conn, req.nodes, req.edges)
        return Done()

    def counts(self) -> Reply:
        out: dict[str, int] = {}
        for table in NODE_COLUMNS:
            out[table] = _count(self.writer, f"MATCH (n:{table}) RETURN count(*)")
        for rel in REL_PAIRS:
            out[rel] = _count(self.writer, f"MATCH ()-[r:{rel}]->() RETURN count(*)")
        return Done(counts=out)

    def query(self, req: Query) -> Reply:
        conn = self.reader
        conn.set_query_timeout(max(1, req.timeout_ms))
        deadline = time.monotonic() + req.timeout_ms / 1000
        try:
            result = conn.execute(req.text)
        except Exception as exc:  # noqa: BLE001 - the engine reports everything as RuntimeError
            message = str(exc).strip()
            if message.lower().startswith("interrupted"):
                return Failed("timeout", message)
            if _memory_error(message):
                return Failed("memory", message)
            return Failed("error", message)
        if isinstance(result, list):  # the parent validated a single statement; never trust it either
            for r in result:
                r.close()
            return Failed("error", "more than one statement")
        try:
            return _collect_ids(result, req, deadline)
        finally:
            result.close()


def _count(conn: ladybug.Connection, statement: str) -> int:
    """The number one ``RETURN count(*)`` statement of ours answers (one result, rows as lists)."""
    result = conn.execute(statement)
    if isinstance(result, list):
        raise TypeError(f"one statement gave {len(result)} results: {statement}")
    row = result.get_next()
    if not isinstance(row, list):
        raise TypeError(f"a row read as {type(row).__name__}, not a list: {statement}")
    return int(row[0])


def _collect_ids(result: Any, req: Query, deadline: float) -> Reply:
    """The distinct ids of a result, read within the row, byte and time budgets (the engine's
    timeout ends at execute(); reading the rows is ours)."""
    names: list[str] = result.get_column_names()
    lowered = [n.lower() for n in names]
    if "id" in names:
        idx = names.index("id")
    elif "id" in lowered:
        idx = lowered.index("id")
    else:
        return Failed("column", repr(names))
    try:  # the engine has the whole result by now: too many rows are refused without reading one
        if result.get_num_tuples() > req.max_rows:
            return Failed("rows", str(req.max_rows))
    except Exception:  # noqa: BLE001 - counted while reading below instead
        pass
    ids: set[str] = set()
    rows = size = 0
    while result.has_next():
        rows += 1
        if rows > req.max_rows:
            return Failed("rows", str(req.max_rows))
        if rows % 4096 == 0 and time.monotonic() > deadline:
            return Failed("timeout", "reading the rows")
        value = result.get_next()[idx]
        if value is None:
            continue
        if isinstance(value, (dict, list)):
            return Failed("value", type(value).__name__)
        text = str(value)
        if text not in ids:
            size += len(text.encode("utf-8", "replace"))
            if size > req.max_id_bytes:
                return Failed("ids", str(req.max_id_bytes))
            ids.add(text)
    return Done(ids=sorted(ids))


def _limit_self(limits: Limits) -> None:
    """Core dumps off, address space capped. A platform that refuses a limit (macOS does not enforce
    RLIMIT_AS) still has the parent's wall clock and resident-memory watch."""
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_AS, (limits.address_space_bytes, limits.address_space_bytes))
    except (ImportError, ValueError, OSError) as exc:
        print(f"slayer-lsp graph process: a resource limit could not be set: {exc}", file=sys.stderr)


def _cpu_budget(seconds: int) -> None:
    """Allow ``seconds`` more CPU seconds from now (the soft limit only: it can be raised again)."""
    try:
        import resource
    except ImportError:
        return
    usage = resource.getrusage(resource.RUSAGE_SELF)
    used = int(usage.ru_utime + usage.ru_stime) + 1
    hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
    soft = used + max(1, seconds)
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def _watch_parent(parent: int) -> None:
    """Exit when the parent is gone (the engine releases the GIL while a query runs, so this thread
    runs even then); an idle child also sees EOF on its input."""
    while True:
        time.sleep(1.0)
        if os.getppid() != parent:
            os._exit(3)


def _read_exact(stream: Any, n: int) -> bytes | None:
    chunks, got = [], 0
    while got < n:
        chunk = stream.read(n - got)
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _serve(inp: Any, out: Any, limits: Limits) -> None:
    def send(reply: Reply) -> None:
        out.write(encode(reply))
        out.flush()

    try:
        graph = _Graph(limits)
    except ImportError as exc:
        send(Failed("unavailable", f"LadybugDB (python package 'ladybug') is not available: {exc}"))
        return
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which gives up on the graph
        send(Failed("unavailable", f"LadybugDB could not start an in-memory database: {exc}"))
        return
    send(Done())
    while True:
        header = _read_exact(inp, HEADER_BYTES)
        if header is None:
            return
        body = _read_exact(inp, frame_length(header))
        if body is None:
            return
        req = _request_decoder.decode(body)
        _cpu_budget(req.cpu_s)
        try:
            if isinstance(req, Query):
                reply = graph.query(req)
            elif isinstance(req, Build):
                reply = graph.build(req)
            elif isinstance(req, Apply):
                reply = graph.apply(req)
            else:
                reply = graph.counts()
        except MemoryError:
            reply = Failed("memory", "out of memory")
        except Exception as exc:  # noqa: BLE001 - every failure is the parent's to judge
            message = str(exc).strip()
            reply = Failed("memory" if _memory_error(message) else "error", message)
        del req
        send(reply)


def main(argv: list[str]) -> None:
    limits = msgspec.json.decode(argv[1], type=Limits)
    parent = os.getppid()
    # The wire is a private copy of stdout; fd 1 becomes stderr, so nothing a library prints can
    # corrupt a frame.
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    inp = os.fdopen(os.dup(0), "rb")
    with contextlib.suppress(OSError):
        os.close(0)
    _limit_self(limits)
    threading.Thread(target=_watch_parent, args=(parent,), name="graph-parent-watch", daemon=True).start()
    _serve(inp, out, limits)


if __name__ == "__main__":
    main(sys.argv)
