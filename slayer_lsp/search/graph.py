"""The property graph behind ``search(cypher_filter=...)``, on LadybugDB, in a process of its own.

SLayer answers a ``cypher_filter`` by running the caller's openCypher query against an in-memory
LadybugDB graph of the store; the ids it returns become an allowlist for the search channels. This
module keeps SLayer's graph schema, so filters written for SLayer keep working, but differs in how
the graph is made, kept and guarded:

* it is loaded in bulk (``COPY`` from temporary CSV files, never inside the store) instead of one
  statement per node and edge, which is what makes SLayer's build take seconds;
* it follows the catalog: ``apply(catalog, delta)`` replaces only the nodes and edges of the touched
  canonical ids and rebuilds only when that is cheaper;
* the query is checked first (``cypher_filter.py``, on the tokens of ``cypher_lexer.py``, which knows
  Cypher's strings, comments and quoted names, so a word inside a literal never trips the checks
  and a keyword outside one always does); it may call only the functions in ``ALLOWED_FUNCTIONS``
  (anything else is refused, naming the function);
* the database lives in a child process (``slayer_lsp.search.graph_worker``) under hard limits.
  A filter is code, and some code runs away where no text check can see it coming: a value grown
  by ``replace`` chained through ``WITH``, a cartesian product, an engine function that never looks
  at its timeout. The daemon waits for the child's answer with its own wall-clock deadline and
  kills the child when the deadline passes, when the request is cancelled, when the child grows
  past its memory cap, or when it dies (its address-space or CPU limit); the next filter gets a
  fresh child, rebuilt from the current catalog, and waits only for that rebuild. The daemon's
  memory never grows with a filter: all it gets back is a bounded list of ids.

Limits (named below; the last three, on the text of a filter, in ``cypher_filter.py``):

======================================  =====================================================
``DEFAULT_TIMEOUT_S`` = 10 s            wall clock of a filter, waiting for a busy graph
                                        included; the engine stops the query at that time
``KILL_GRACE_S`` = 1 s                  after the deadline the daemon kills the child
``CHILD_RSS_BYTES`` = 768 MiB           resident memory of the child; checked every
                                        ``WATCH_INTERVAL_S`` = 50 ms while it works
``CHILD_ADDRESS_SPACE_BYTES`` = 1.5 GiB ``RLIMIT_AS`` of the child: an allocation past it fails
``CHILD_CPU_S`` = 30 s                  ``RLIMIT_CPU`` of the child per filter (2 engine threads)
``BUFFER_POOL_BYTES`` = 256 MiB         LadybugDB's buffer pool in the child
``BUILD_TIMEOUT_S`` = 120 s             loading the graph (a cold start or a restart)
``MAX_FILTER_ROWS`` = 200,000           rows a filter may return
``MAX_ID_BYTES`` = 16 MiB               characters of distinct ids a filter may return
``MAX_CYPHER_CHARS`` = 10,000           length of the filter
``MAX_PATH_HOPS`` = 10                  hops of a variable-length path
``MAX_GROWTH`` = 64                     how many fold chained concatenations may grow a value
======================================  =====================================================

Schema (every node table has ``id`` as primary key; leaf ids are canonical ids)::

    Memory(id='memory:<id>', learning, description)   Datasource(id, name, description)
    Model(id, name, description)                       ModelColumn(id, name, data_type, description)
    Measure(id, name, description)                     Aggregation(id, name, description)
    MENTIONS  Memory -> any node table (from the memory's tags that are in the graph)
    CONTAINS  Datasource -> Model, Model -> ModelColumn | Measure | Aggregation
    JOINS     Model -> Model, property cardinality

Hidden models, hidden columns and the leaves of hidden models are left out; so is time_spine.
"""

from __future__ import annotations

import logging
import os
import select
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from slayer_lsp.catalog.ids import (
    child_id,
    datasource_of,
    depth_of,
    is_leaf_id,
    is_memory_ref,
    memory_id_of,
    memory_ref,
    model_of,
    split_canonical,
)
from slayer_lsp.search import graph_worker as w
from slayer_lsp.search.cypher_filter import validate_cypher
from slayer_lsp.search.cypher_lexer import CypherFilterError

if TYPE_CHECKING:
    from slayer_lsp.catalog import Catalog, Delta
    from slayer_lsp.store import documents as d

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 10.0
#: The engine stops a query at its timeout when it checks; the daemon kills the child this much
#: later whatever the engine does.
KILL_GRACE_S = 1.0
#: Rows a filter may return (its ids are an allowlist: more rows than the graph has nodes means
#: duplicates); counted in the child while it reads them.
MAX_FILTER_ROWS = 200_000
#: Characters of distinct ids a filter may send back (real ids are short; a filter that returns
#: built strings as ids would otherwise make the daemon hold them).
MAX_ID_BYTES = 16 * 1024 * 1024
#: Memory of the graph's buffer pool, in the child (a graph of 100,000 entities needs well under
#: 128 MiB).
BUFFER_POOL_BYTES = 256 * 1024 * 1024
#: The child's address-space limit (RLIMIT_AS). An idle child maps ~0.6 GiB (the buffer pool's
#: reservation, two engine threads); values a filter builds live outside the pool, so the rest is
#: their headroom. Past it an allocation fails and the child is replaced.
CHILD_ADDRESS_SPACE_BYTES = 1536 * 1024 * 1024
#: Resident memory at which the daemon kills a working child (checked every WATCH_INTERVAL_S).
CHILD_RSS_BYTES = 768 * 1024 * 1024
#: CPU seconds the child may spend on one filter (RLIMIT_CPU; the kernel ends it past them even if
#: the daemon is gone). Two engine threads spend at most twice the wall clock.
CHILD_CPU_S = 30
#: Engine threads in the child: a filter over a catalog graph gains little from more.
GRAPH_THREADS = 2
#: Starting the child (Python and LadybugDB) and loading the graph; restarts included.
START_TIMEOUT_S = 30.0
BUILD_TIMEOUT_S = 120.0
#: How often the daemon looks at a working child (cancel, deadline, resident memory).
WATCH_INTERVAL_S = 0.05
# An update whose touched units weigh (in rows) more than this share of the graph is replaced by a
# rebuild: deleting and re-linking costs two to three times as much per row as a bulk load.
_REBUILD_SHARE = 0.3


class GraphUnavailableError(ImportError):
    """LadybugDB cannot be imported or started; callers fall back to ``parse_label_filter``. An
    ``ImportError`` so that one ``except ImportError`` covers a missing package and a broken one."""


def is_available() -> bool:
    """True when LadybugDB imports (the import is deferred until a graph is needed)."""
    try:
        import ladybug  # noqa: F401
    except Exception:  # noqa: BLE001 - a broken native library is as unavailable as a missing one
        return False
    return True


# --------------------------------------------------------------------------- rows from the catalog


@dataclass
class _Rows:
    """Node rows by table and edge rows by (relationship, from table, to table)."""

    nodes: dict[str, list[tuple[str, ...]]] = field(default_factory=dict)
    edges: dict[tuple[str, str, str], list[tuple[str, ...]]] = field(default_factory=dict)

    def node(self, table: str, values: tuple[str, ...]) -> None:
        self.nodes.setdefault(table, []).append(values)

    def edge(self, rel: str, src_table: str, dst_table: str, values: tuple[str, ...]) -> None:
        self.edges.setdefault((rel, src_table, dst_table), []).append(values)

    def __len__(self) -> int:
        return sum(map(len, self.nodes.values())) + sum(map(len, self.edges.values()))


def _unit(canonical: str) -> tuple[str, str]:
    """The unit of the graph an entity belongs to: its memory, its datasource node or its model
    subtree (a model and its leaves are always replaced together)."""
    if is_memory_ref(canonical):
        return ("memory", canonical)
    model = model_of(canonical)
    return ("datasource", canonical) if model is None else ("model", model)


class _View:
    """What one catalog puts into the graph: visible models, leaf tables, tag resolution."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.datasources = catalog.datasources
        self.models: dict[str, d.Model] = {mid: m for mid, m in catalog.models.items() if not m.hidden}
        self.memories = catalog.memories
        self._leaf_tables: dict[str, dict[str, str]] = {}

    def leaves(self, model: d.Model) -> Iterator[tuple[str, str, tuple[str, ...]]]:
        """(table, leaf name, extra values) for each leaf node of a visible model; a name is used
        once per table (a store may hold duplicates that SLayer's validation would refuse)."""
        seen: set[tuple[str, str]] = set()
        for col in model.columns:
            if not col.hidden and ("ModelColumn", col.name) not in seen:
                seen.add(("ModelColumn", col.name))
                yield "ModelColumn", col.name, (col.type or "", col.description or "")
        for meas in model.measures:
            if meas.name and ("Measure", meas.name) not in seen:
                seen.add(("Measure", meas.name))
                yield "Measure", meas.name, (meas.description or "",)
        for agg in model.aggregations:
            if ("Aggregation", agg.name) not in seen:
                seen.add(("Aggregation", agg.name))
                yield "Aggregation", agg.name, (agg.description or "",)

    def leaf_table(self, mid: str, leaf: str) -> str | None:
        tables = self._leaf_tables.get(mid)
        if tables is None:
            tables = {}
            # A tag naming a leaf that exists in two tables links to the measure, then the
            # aggregation, then the column, as SLayer does.
            for table, name, _ in self.leaves(self.models[mid]):
                rank = _LEAF_RANK[table]
                if name not in tables or rank < _LEAF_RANK[tables[name]]:
                    tables[name] = table
            self._leaf_tables[mid] = tables
        return tables.get(leaf)

    def table_of(self, tag: str) -> str | None:
        """The node table holding ``tag`` in this graph, or None (stale, hidden or malformed)."""
        if is_memory_ref(tag):
            return "Memory" if memory_id_of(tag) in self.memories else None
        ds, model, leaf = split_canonical(tag)
        if model is None:
            return "Datasource" if tag in self.datasources else None
        mid = child_id(ds, model)
        if mid not in self.models:
            return None
        if leaf is None:
            return "Model"
        return self.leaf_table(mid, leaf) if depth_of(tag) == 2 else None

    # Each emitter writes the unit's own nodes and the edges the unit owns: a model owns its leaves,
    # its CONTAINS edges (including the one from its datasource) and its outgoing JOINS; a memory
    # owns its outgoing MENTIONS.

    def emit_datasource(self, name: str, rows: _Rows) -> None:
        ds = self.datasources.get(name)
        if ds is not None:
            rows.node("Datasource", (name, name, ds.description or ""))

    def emit_model(self, mid: str, rows: _Rows) -> None:
        model = self.models.get(mid)
        if model is None:
            return
        ds = datasource_of(mid)
        rows.node("Model", (mid, model.name, model.description or ""))
        if ds in self.datasources:
            rows.edge("CONTAINS", "Datasource", "Model", (ds, mid))
        for table, name, extra in self.leaves(model):
            leaf = child_id(mid, name)
            rows.node(table, (leaf, name, *extra))
            rows.edge("CONTAINS", "Model", table, (mid, leaf))
        for join in model.joins:
            target = child_id(ds, join.target_model)
            if target in self.models:
                rows.edge("JOINS", "Model", "Model", (mid, target, join.cardinality or ""))

    def emit_memory(self, ref: str, rows: _Rows) -> None:
        memory = self.memories.get(memory_id_of(ref))
        if memory is None:
            return
        rows.node("Memory", (ref, memory.learning or "", memory.description or ""))
        self.emit_mentions(ref, memory.entities, rows)

    def emit_mentions(self, ref: str, tags: Iterable[str], rows: _Rows) -> None:
        for tag in tags:
            table = self.table_of(tag)
            if table is not None:
                rows.edge("MENTIONS", "Memory", table, (ref, tag))

    def emit_all(self) -> _Rows:
        rows = _Rows()
        for name in self.datasources:
            self.emit_datasource(name, rows)
        for mid in self.models:
            self.emit_model(mid, rows)
        for memory_id in self.memories:
            self.emit_memory(memory_ref(memory_id), rows)
        return rows

    def weight(self, kind: str, unit: str) -> int:
        """Rough number of rows (nodes and edges) a unit puts into the graph."""
        if kind == "model":
            model = self.models.get(unit)
            if model is None:
                return 1
            leaves = len(model.columns) + len(model.measures) + len(model.aggregations)
            return 2 + 2 * leaves + len(model.joins)
        if kind == "memory":
            memory = self.memories.get(memory_id_of(unit))
            return 1 + (len(memory.entities) if memory is not None else 0)
        return 1 + len(self.catalog.children(unit))


_LEAF_RANK = {"Measure": 0, "Aggregation": 1, "ModelColumn": 2}


# --------------------------------------------------------------------------- the child process


class _Stopped(Exception):
    """The child stopped answering: ``reason`` is timeout, cancelled, memory, died or closed."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(reason, detail)
        self.reason, self.detail = reason, detail


def _child_env() -> dict[str, str]:
    """The daemon's environment, with this package first on the path (the child runs this very
    code, whatever is installed) and glibc held to two malloc arenas (each reserves 64 MiB of
    address space, which would eat the RLIMIT_AS headroom on a many-core machine)."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    env["MALLOC_ARENA_MAX"] = "2"
    return env


_LIMITS = w.Limits(
    address_space_bytes=CHILD_ADDRESS_SPACE_BYTES,
    buffer_pool_bytes=BUFFER_POOL_BYTES,
    max_db_bytes=BUFFER_POOL_BYTES,
    threads=GRAPH_THREADS,
)
# A reply is at most the ids (counted in UTF-8 bytes by the child) plus msgpack framing per id.
_MAX_REPLY_BYTES = MAX_ID_BYTES + 8 * MAX_FILTER_ROWS + 65_536


class _Child:
    """One worker process and its pipes. Its user holds ``GraphIndex._lock``; ``kill`` may come
    from any thread (close, a finaliser)."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "slayer_lsp.search.graph_worker", msgspec.json.encode(_LIMITS).decode()],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=_child_env(),
            close_fds=True,
            start_new_session=True,
        )  # a Ctrl-C meant for the daemon's terminal is the daemon's to handle
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._out = self.proc.stdin
        self._fd = self.proc.stdout.fileno()
        self.pid = self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def call(self, request: w.Request, deadline: float, cancel: threading.Event | None) -> w.Reply:
        try:
            self._out.write(w.encode(request))
            self._out.flush()
        except (BrokenPipeError, OSError, ValueError):
            raise _Stopped("died", self._exit()) from None
        return self.read(deadline, cancel)

    def read(self, deadline: float, cancel: threading.Event | None) -> w.Reply:
        """The next reply, waited for in short ticks: the daemon's own deadline, the caller's cancel
        and the child's resident memory are looked at between them; any of them kills the child."""
        header = self._read_exact(w.HEADER_BYTES, deadline, cancel)
        length = w.frame_length(header)
        if length > _MAX_REPLY_BYTES:
            self.kill()
            raise _Stopped("died", f"an answer of {length:,} bytes")
        try:
            return w.decode_reply(self._read_exact(length, deadline, cancel))
        except msgspec.DecodeError as exc:
            self.kill()
            raise _Stopped("died", f"an unreadable answer ({exc})") from None

    def _read_exact(self, n: int, deadline: float, cancel: threading.Event | None) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            now = time.monotonic()
            if cancel is not None and cancel.is_set():
                self.kill()
                raise _Stopped("cancelled")
            if now >= deadline:
                self.kill()
                raise _Stopped("timeout")
            rss = self.rss()
            if rss is not None and rss > CHILD_RSS_BYTES:
                self.kill()
                raise _Stopped("memory", f"{rss >> 20} MiB resident")
            try:
                ready, _, _ = select.select([self._fd], [], [], min(WATCH_INTERVAL_S, deadline - now))
            except (OSError, ValueError):
                raise _Stopped("died", self._exit()) from None
            if not ready:
                continue
            chunk = os.read(self._fd, min(n - len(buf), 1 << 20))
            if not chunk:
                raise _Stopped("died", self._exit())
            buf += chunk
        return bytes(buf)

    def rss(self) -> int | None:
        """Resident bytes of the child (Linux; elsewhere only RLIMIT_AS bounds it)."""
        try:
            with open(f"/proc/{self.pid}/statm", "rb") as fh:
                return int(fh.read().split()[1]) * _PAGE
        except (OSError, ValueError, IndexError):
            return None

    def _exit(self) -> str:
        try:
            code = self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            self.kill()
            return "no answer"
        return f"exit status {code}" if code >= 0 else f"signal {-code}"

    def kill(self, wait: bool = True) -> None:
        """SIGKILL, then (``wait``) reap: a killed child exits at once. Without ``wait`` nothing
        blocks (the event loop's shutdown path); the holder of the graph's lock reaps it."""
        try:
            if self.proc.poll() is None:
                self.proc.kill()
            if wait:
                self.proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):  # already reaped, or stuck in the kernel
            log.debug("graph: killing pid %s", self.pid, exc_info=True)

    def dispose(self) -> None:
        """Kill and close the pipes (only by the holder of the graph's lock: no read is under way)."""
        self.kill()
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


@dataclass
class _Slot:
    """The current child, shared with the GraphIndex's finaliser (which must not hold the index)."""

    child: _Child | None = None


def _kill_slot(slot: _Slot) -> None:
    if slot.child is not None:
        slot.child.kill()


# --------------------------------------------------------------------------- the index


class GraphIndex:
    """A live LadybugDB graph of one store, kept in step with catalog snapshots, held by a child
    process (see the module docstring).

    One request at a time goes to the child (``_lock``): queries, updates and counts never overlap.
    A filter that finds the graph busy waits at most until its own deadline; ``close`` never waits."""

    def __init__(self, catalog: Catalog) -> None:
        self._lock = threading.Lock()
        self._slot = _Slot()
        self._closed = False
        self._catalog = catalog  # what the graph reflects: a restarted child is loaded from it
        self._rows = 0  # rows loaded by the last build: the yardstick for rebuild decisions
        self.generation = catalog.generation
        self.restarts = 0  # children started after the first (for checks and the log)
        weakref.finalize(self, _kill_slot, self._slot)

    @classmethod
    def build(cls, catalog: Catalog) -> GraphIndex:
        """Start the child and load the graph of ``catalog`` in bulk. Raises ``GraphUnavailableError``."""
        graph = cls(catalog)
        with graph._lock:
            try:
                graph._start(None)
            except _Stopped as stop:
                graph._drop()
                raise GraphUnavailableError(
                    f"the graph process stopped while loading ({stop.reason}{', ' if stop.detail else ''}"
                    f"{stop.detail})"
                ) from None
        return graph

    def _start(self, cancel: threading.Event | None) -> None:
        """A fresh child holding ``self._catalog``. Raises ``GraphUnavailableError`` (no LadybugDB,
        or the rows do not load) or ``_Stopped``."""
        self._drop()
        try:
            child = _Child()
        except OSError as exc:
            raise GraphUnavailableError(f"the graph process could not start: {exc}") from exc
        self._slot.child = child
        hello = child.read(time.monotonic() + START_TIMEOUT_S, cancel)
        if isinstance(hello, w.Failed):
            self._drop()
            raise GraphUnavailableError(hello.message)
        rows = _View(self._catalog).emit_all()
        reply = child.call(
            w.Build(*_wire_rows(rows), cpu_s=int(BUILD_TIMEOUT_S) * GRAPH_THREADS),
            time.monotonic() + BUILD_TIMEOUT_S,
            cancel,
        )
        if isinstance(reply, w.Failed):
            self._drop()
            raise GraphUnavailableError(f"LadybugDB could not load the graph: {reply.message}")
        self._rows = len(rows)
        self.generation = self._catalog.generation

    def _drop(self) -> None:
        """Forget the current child (killed); the next request starts a fresh one."""
        child, self._slot.child = self._slot.child, None
        if child is not None:
            child.dispose()

    def _ready_child(self, cancel: threading.Event | None) -> _Child:
        """The live child, restarted from the current catalog if it was killed or died."""
        child = self._slot.child
        if child is not None and child.alive:
            return child
        log.info("graph: starting a fresh graph process")
        self.restarts += 1
        try:
            self._start(cancel)
        except GraphUnavailableError as exc:
            raise CypherFilterError(f"the cypher_filter graph could not be restarted: {exc}") from None
        except _Stopped as stop:
            self._drop()
            raise CypherFilterError(_stopped_message(stop, None)) from None
        assert self._slot.child is not None
        return self._slot.child

    # ------------------------------------------------------------------ updates

    def apply(self, catalog: Catalog, delta: Delta) -> str:
        """Bring the graph to ``catalog``, touching only the units named by ``delta``; returns what
        was done: "unchanged", "incremental" or "rebuilt" (a rebuild is left to the next request,
        which loads a fresh child from ``catalog``)."""
        touched: dict[str, set[str]] = {"datasource": set(), "model": set(), "memory": set()}
        for canonical in delta.touched:
            kind, unit = _unit(canonical)
            touched[kind].add(unit)
        with self._lock:  # a running filter holds it until its deadline at most
            self._check_open()
            self._catalog = catalog
            outcome = self._apply_locked(catalog, touched)
            self.generation = catalog.generation
            return outcome

    def _apply_locked(self, catalog: Catalog, touched: dict[str, set[str]]) -> str:
        if not any(touched.values()):
            return "unchanged"
        child = self._slot.child
        if child is None or not child.alive:
            self._drop()
            return "rebuilt"
        view = _View(catalog)
        weight = sum(view.weight(kind, unit) for kind, units in touched.items() for unit in units)
        if weight > _REBUILD_SHARE * self._rows:
            self._drop()
            return "rebuilt"
        memories, models, datasources = (sorted(touched[k]) for k in ("memory", "model", "datasource"))
        rows = _unit_rows(view, touched, memories, models, datasources)
        try:
            reply = child.call(
                w.Apply(
                    memories,
                    models,
                    datasources,
                    *_wire_rows(rows),
                    cpu_s=int(BUILD_TIMEOUT_S) * GRAPH_THREADS,
                ),
                time.monotonic() + BUILD_TIMEOUT_S,
                None,
            )
        except _Stopped as stop:
            reply = w.Failed(stop.reason, stop.detail)
        if isinstance(reply, w.Failed):  # a failed patch must not leave a half-updated graph
            log.warning(
                "graph: incremental update failed (%s: %s); the next filter rebuilds it",
                reply.reason,
                reply.message[:500],
            )
            self._drop()
            return "rebuilt"
        return "incremental"

    # ------------------------------------------------------------------ queries

    def run(
        self, cypher: str, timeout_s: float = DEFAULT_TIMEOUT_S, cancel: threading.Event | None = None
    ) -> frozenset[str]:
        """The ids returned by a validated ``cypher_filter``. Raises ``CypherFilterError`` when the
        filter is refused, fails, is cancelled (``cancel`` set) or runs longer than ``timeout_s``
        (waiting for another filter included; restarting a killed child is not)."""
        text = validate_cypher(cypher)
        deadline = time.monotonic() + timeout_s
        self._acquire(deadline, cancel, timeout_s)
        try:
            self._check_open()
            for attempt in (1, 2):
                t0 = time.monotonic()
                child = self._ready_child(cancel)
                deadline += time.monotonic() - t0  # a restart is the graph's time, not the filter's
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise CypherFilterError(_timeout_message(timeout_s))
                query = w.Query(
                    text,
                    timeout_ms=max(1, int(remaining * 1000)),
                    max_rows=MAX_FILTER_ROWS,
                    max_id_bytes=MAX_ID_BYTES,
                    cpu_s=CHILD_CPU_S,
                )
                try:
                    reply = child.call(query, deadline + KILL_GRACE_S, cancel)
                except _Stopped as stop:
                    self._drop()
                    if self._closed:
                        raise CypherFilterError("the cypher_filter graph has been closed.") from None
                    log.warning(
                        "graph: cypher_filter stopped (%s %s); the graph process is replaced",
                        stop.reason,
                        stop.detail,
                    )
                    if stop.reason == "died" and attempt == 1:
                        # Killed by someone else (an OOM killer, an operator) or by its own limits:
                        # once more in a fresh child, within the same deadline.
                        continue
                    raise CypherFilterError(_stopped_message(stop, timeout_s)) from None
                if isinstance(reply, w.Failed):
                    if reply.reason == "memory":  # the engine survived it; a fresh child surely has
                        self._drop()
                    raise CypherFilterError(_failed_message(reply, timeout_s))
                return frozenset(reply.ids)
            raise AssertionError("unreachable")  # pragma: no cover
        finally:
            self._lock.release()

    def _acquire(self, deadline: float, cancel: threading.Event | None, timeout_s: float) -> None:
        """Take the graph, waiting for a running filter at most until ``deadline``."""
        while not self._lock.acquire(timeout=WATCH_INTERVAL_S):
            self._check_open()
            if cancel is not None and cancel.is_set():
                raise CypherFilterError("cypher_filter was cancelled.")
            if time.monotonic() >= deadline:
                raise CypherFilterError(
                    f"cypher_filter timed out after {timeout_s:g} s waiting for another cypher_filter to finish."
                )

    def counts(self) -> dict[str, int]:
        """Rows per node and relationship table (for checks and benchmarks)."""
        with self._lock:
            self._check_open()
            child = self._ready_child(None)
            try:
                reply = child.call(w.Counts(cpu_s=CHILD_CPU_S), time.monotonic() + BUILD_TIMEOUT_S, None)
            except _Stopped as stop:
                self._drop()
                raise CypherFilterError(_stopped_message(stop, None)) from None
            if isinstance(reply, w.Failed):
                raise CypherFilterError(f"counting the graph failed: {reply.message}")
            return dict(reply.counts)

    @property
    def pid(self) -> int | None:
        """The child's process id (None while there is none)."""
        child = self._slot.child
        return child.pid if child is not None else None

    # ------------------------------------------------------------------ lifetime

    def _check_open(self) -> None:
        if self._closed:
            raise CypherFilterError("the cypher_filter graph has been closed.")

    def abort(self) -> None:
        """Kill the child now, from any thread and without waiting for the graph: a running filter
        fails at once, the next one starts a fresh child. For cancel and shutdown paths."""
        child = self._slot.child
        if child is not None:
            child.kill(wait=False)

    def close(self) -> None:
        """Kill the child and refuse further requests; never waits for a running filter."""
        self._closed = True
        self.abort()
        if self._lock.acquire(blocking=False):  # else the filter holding it cleans up
            try:
                self._drop()
            finally:
                self._lock.release()

    def __enter__(self) -> GraphIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _wire_rows(rows: _Rows) -> tuple[dict[str, list[list[str]]], list[w.EdgeRows]]:
    nodes = {table: [list(r) for r in lst] for table, lst in rows.nodes.items()}
    edges = [w.EdgeRows(rel, src, dst, [list(r) for r in lst]) for (rel, src, dst), lst in rows.edges.items()]
    return nodes, edges


def _unit_rows(
    view: _View, touched: dict[str, set[str]], memories: list[str], models: list[str], datasources: list[str]
) -> _Rows:
    """The rows that replace the touched units: their own nodes and edges, and the edges from
    untouched units into them (deleting a node drops every edge into it)."""
    rows = _Rows()
    for name in datasources:
        view.emit_datasource(name, rows)
    for mid in models:
        view.emit_model(mid, rows)
    for ref in memories:
        view.emit_memory(ref, rows)
    for name in datasources:
        if name in view.datasources:
            for mid in view.catalog.children(name):
                if mid in view.models and mid not in touched["model"]:
                    rows.edge("CONTAINS", "Datasource", "Model", (name, mid))
    if models:
        for mid, model in view.models.items():
            if mid in touched["model"]:
                continue
            ds = datasource_of(mid)
            for join in model.joins:
                target = child_id(ds, join.target_model)
                if target in touched["model"] and target in view.models:
                    rows.edge("JOINS", "Model", "Model", (mid, target, join.cardinality or ""))
    exact = touched["memory"] | touched["datasource"] | touched["model"]
    below = frozenset(models)  # the leaves of a touched model
    for memory_id, memory in view.memories.items():
        ref = memory_ref(memory_id)
        if ref in touched["memory"]:
            continue
        into = [
            tag for tag in memory.entities if tag in exact or (is_leaf_id(tag) and model_of(tag) in below)
        ]
        if into:
            view.emit_mentions(ref, into, rows)
    return rows


def _timeout_message(timeout_s: float | None) -> str:
    after = f" after {timeout_s:g} s" if timeout_s is not None else ""
    return f"cypher_filter timed out{after}; narrow the pattern or shorten variable-length paths."


def _memory_message() -> str:
    return (
        f"cypher_filter needs more than the {CHILD_RSS_BYTES >> 20} MiB the graph may use; "
        f"narrow the pattern or return fewer, smaller values."
    )


def _stopped_message(stop: _Stopped, timeout_s: float | None) -> str:
    if stop.reason == "timeout":
        return _timeout_message(timeout_s)
    if stop.reason == "cancelled":
        return "cypher_filter was cancelled."
    if stop.reason == "memory":
        return _memory_message()
    if stop.reason == "closed":
        return "the cypher_filter graph has been closed."
    return (
        f"cypher_filter stopped the graph process ({stop.detail or 'it died'}): it went past the "
        f"graph's memory or CPU limit; narrow the pattern."
    )


def _failed_message(reply: w.Failed, timeout_s: float) -> str:
    reason, message = reply.reason, reply.message[:1000]
    if reason == "timeout":
        return _timeout_message(timeout_s)
    if reason == "memory":
        return _memory_message()
    if reason == "rows":
        return (
            f"cypher_filter returned more than {MAX_FILTER_ROWS:,} rows; return each id once "
            f"(RETURN DISTINCT n.id AS id) or narrow the pattern."
        )
    if reason == "ids":
        return (
            f"cypher_filter returned more than {MAX_ID_BYTES >> 20} MiB of ids; return ids "
            f"(RETURN n.id AS id), not values built from them."
        )
    if reason == "column":
        return f"cypher_filter must return a column named id; it returned {message}."
    if reason == "value":
        return (
            "the id column of cypher_filter must hold ids (e.g. 'RETURN n.id AS id'), not nodes, "
            "relationships or lists."
        )
    return f"cypher_filter failed: {message}"
