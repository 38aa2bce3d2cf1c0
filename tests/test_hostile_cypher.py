"""Hostile ``cypher_filter``s (issue #14): values grown without bound, engine functions that never
look at their timeout, products and path walks that explode. Two defences are checked apart:

* the allowlist of functions refuses the known amplifiers and slow functions by name;
* whatever gets past it runs in the graph's child process, which is killed at its wall-clock
  deadline, on cancel, past its memory cap, or when it dies; the caller's memory does not grow,
  the answer is a clear error within the deadline, and the next filter gets a fresh child.

To test the second defence on its own, some tests let the known amplifiers through the allowlist
(``_bypass``): the child must stop them anyway. Every hostile request runs under a watchdog: the
resident memory of the process that asked (the test process, or the daemon) must not grow by more
than ``RSS_GROWTH_LIMIT``, and the answer must come within ``ANSWER_WITHIN_S``."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from slayer_lsp.search import cypher_filter
from slayer_lsp.search import graph as G
from slayer_lsp.search.cypher_filter import validate_cypher
from slayer_lsp.search.cypher_lexer import CypherFilterError
from slayer_lsp.search.graph import GraphIndex
from slayer_lsp.search.types import SearchError
from tests import watchdog
from tests.conftest import YAML_STORE
from tests.lsp.raw_daemon import REPO, RawDaemon, copy_shop

RSS_GROWTH_LIMIT = 512 * 1024 * 1024
ANSWER_WITHIN_S = 15.0  # the 10 s deadline, the kill grace and a loaded machine's slack

# Filters every check lets through, that the child must stop (on the example stores' ~50-75 nodes).
CARTESIAN_6 = (
    "MATCH (a), (b), (c), (d), (e), (f) WHERE a.id + b.id + c.id + d.id + e.id + f.id = 'x' RETURN a.id AS id"
)
PASSING = {
    # list growth without a single amplifying function: each level collects the previous one per row
    "collect-growth": "MATCH (n) WITH collect(n.id) AS l0 UNWIND l0 AS a WITH l0, collect(l0) AS l1 "
    "UNWIND l1 AS b WITH l1, collect(l1) AS l2 UNWIND l2 AS c WITH l2, collect(l2) AS l3 "
    "UNWIND l3 AS d WITH l3, collect(l3) AS l4 RETURN size(l4) AS id",
    "cartesian-6": CARTESIAN_6,
    "contains-over-product": "MATCH (a), (b), (c), (d), (e), (f) WHERE contains(a.id + b.id + c.id + d.id, "
    "lower(e.id + f.id + 'zz')) RETURN a.id AS id",
    "deep-paths": "MATCH (a)-[*1..10]-(b)-[*1..10]-(c) RETURN DISTINCT c.id AS id",
}
# The repros and their neighbours: refused by name, and stopped by the child when let through.
_SEED = "MATCH (n:Model) WITH 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa' + n.id AS s LIMIT 1 "
AMPLIFIERS = {
    "replace-growth": ("replace", _SEED + "WITH replace(s, 'a', s) AS s " * 6 + "RETURN size(s) AS id"),
    "regexp-replace-growth": (
        "regexp_replace",
        _SEED + "WITH regexp_replace(s, 'a', s, 'g') AS s " * 6 + "RETURN size(s) AS id",
    ),
    "list-concat-growth": (
        "list_concat",
        "MATCH (n:Model) WITH [n.id] AS a LIMIT 1 "
        + "WITH list_concat(a, a) AS a " * 40
        + "RETURN size(a) AS id",
    ),
    # a string of 256,000 characters built within the concatenation limit; levenshtein is quadratic
    "levenshtein-on-built-string": (
        "levenshtein",
        "MATCH (n:Model) WITH '" + "a" * 8000 + "' AS s LIMIT 1 "
        "WITH s + s + s + s + s + s + s + s AS s WITH s + s + s + s AS s "
        "RETURN levenshtein(s, s + 'x') AS id",
    ),
}
# Clear errors a stopped filter may end with.
STOPPED = ("timed out after", "MiB the graph may use", "stopped the graph process", "more than 200,000 rows")


# --------------------------------------------------------------------------- watchdogs


def _rss(pid: int | str = "self") -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@contextmanager
def _watch_rss(pid: int | str = "self") -> Iterator[dict[str, int]]:
    """Sample the resident memory of ``pid`` every 20 ms; ``peak_growth`` over the start."""
    base = _rss(pid)
    seen = {"peak_growth": 0}
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.02):
            try:
                seen["peak_growth"] = max(seen["peak_growth"], _rss(pid) - base)
            except (OSError, AssertionError):
                return

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        stop.set()
        thread.join()
    assert seen["peak_growth"] < RSS_GROWTH_LIMIT, f"grew {seen['peak_growth'] >> 20} MiB"


def _bounded(fn: Callable[[], object], within: float = ANSWER_WITHIN_S) -> object:
    """Run ``fn`` in a thread and fail (not hang) when it has not answered ``within`` seconds."""
    return watchdog.within(within, fn)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _bypass(monkeypatch: pytest.MonkeyPatch) -> None:
    """Let the known amplifiers through the allowlist: the child alone must stop them."""
    monkeypatch.setattr(
        cypher_filter,
        "ALLOWED_FUNCTIONS",
        cypher_filter.ALLOWED_FUNCTIONS | {"REPLACE", "REGEXP_REPLACE", "LIST_CONCAT", "LEVENSHTEIN"},
    )


# --------------------------------------------------------------------------- the allowlist


@pytest.mark.parametrize("name", sorted(AMPLIFIERS))
def test_amplifiers_are_refused_by_name(name):
    function, cypher = AMPLIFIERS[name]
    with pytest.raises(CypherFilterError) as err:
        validate_cypher(cypher)
    message = str(err.value)
    assert f"may not call {function}()" in message
    assert (
        cypher_filter.ALLOWED_FUNCTIONS_DOC in message and "starts_with" in message
    )  # where the list is, and the list


@pytest.mark.parametrize(
    "text, function",
    [
        ("MATCH (n) RETURN `levenshtein`(n.id, 'x') AS id", "levenshtein"),
        ("MATCH (n) RETURN LeVeNsHtEiN /* hidden */ (n.id, 'x') AS id", "levenshtein"),
        ("MATCH (n) RETURN n.id AS id ORDER BY list_sort([n.id])", "list_sort"),
        ("MATCH (n) WHERE size(repeat(n.id, 99999999)) > 0 RETURN n.id AS id", "repeat"),
        ("MATCH (n) RETURN list_transform([n.id], x -> x + x) AS id", "list_transform"),
        ("MATCH (n) UNWIND range(1, 1000000000) AS i RETURN n.id AS id", "range"),
        ("MATCH (n) RETURN concat_ws(n.id, n.id) AS id", "concat_ws"),
        ("MATCH (n) RETURN to_blob(n.id) AS id", "to_blob"),
    ],
)
def test_any_function_outside_the_allowlist_is_refused(text, function):
    with pytest.raises(CypherFilterError, match=rf"may not call {function}\(\)"):
        validate_cypher(text)


def test_keywords_before_a_parenthesis_are_not_calls():
    validate_cypher(
        "MATCH (a:Model) WHERE NOT (a)-[:JOINS]->(:Model) AND (a.id <> 'x' OR (a.name = 'y')) "
        "WITH a WHERE a.id IN ['x'] OR a.name STARTS WITH ('o') RETURN DISTINCT (a.id) AS id "
        "ORDER BY (a.id) DESC"
    )


def test_allowed_functions_answer(yaml_catalog):
    cypher = (
        "MATCH (m:Model)-[:CONTAINS]->(c:Column) WHERE starts_with(lower(m.id), 'jaffle.ord') "
        "AND size(coalesce(c.description, '')) >= 0 AND NOT contains(upper(c.name), 'ZZZ') "
        "WITH m, collect(c.id) AS cols WHERE list_contains(cols, m.id + '.customer_id') "
        "RETURN m.id AS id"
    )
    with GraphIndex.build(yaml_catalog) as graph:
        assert graph.run(cypher) == {"jaffle.orders"}


# --------------------------------------------------------------------------- the child, engine level


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    dst = tmp_path_factory.mktemp("hostile-cypher") / "store"
    shutil.copytree(YAML_STORE, dst, copy_function=shutil.copyfile)
    for root, dirs, files in os.walk(dst):
        for name in dirs + files:
            p = Path(root) / name
            p.chmod(p.stat().st_mode | 0o200)
    return dst


@pytest.fixture(scope="module")
def engine(store):
    from slayer_lsp.engine import Engine

    eng = Engine(store, dense="off")
    _answers_normally(eng)  # the baseline
    yield eng
    eng.close()


NORMAL_FILTER = "MATCH (m:Model) WHERE m.id STARTS WITH 'jaffle.' RETURN m.id AS id"


def _graph(engine) -> GraphIndex:
    return engine.state.search.graph(engine.catalog)


_BASELINE: dict[int, list[str]] = {}


def _answers_normally(engine) -> None:
    """After a hostile filter: a plain search, and a plain cypher filter, answer as they did before
    any hostile one."""
    models = {
        cid
        for cid, e in engine.catalog.entities.items()
        if e.kind == "model" and not e.hidden and cid.startswith("jaffle.")
    }
    plain = [h.id for h in engine.search({"question": "orders", "max_results": 10}).results]
    assert plain == _BASELINE.setdefault(id(engine), plain) and plain
    filtered = engine.search({"question": "orders", "cypher_filter": NORMAL_FILTER, "max_results": 50})
    assert filtered.results and {h.id for h in filtered.results} <= models
    assert _graph(engine).run(NORMAL_FILTER) == models


def _hostile_search(engine, cypher: str) -> str:
    with _watch_rss(), pytest.raises(SearchError) as err:
        _bounded(lambda: engine.search({"question": "orders", "cypher_filter": cypher, "max_results": 10}))
    return str(err.value)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PASSING))
def test_filters_past_every_check_are_stopped(engine, name):
    message = _hostile_search(engine, PASSING[name])
    assert any(s in message for s in STOPPED), message
    _answers_normally(engine)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(AMPLIFIERS))
def test_amplifiers_let_through_are_stopped_by_the_child(engine, monkeypatch, name):
    _answers_normally(engine)
    before = _graph(engine).pid
    _bypass(monkeypatch)
    message = _hostile_search(engine, AMPLIFIERS[name][1])
    assert any(s in message for s in STOPPED), message
    assert before is not None and not _alive(before)  # the child that ran it is gone, not just told to stop
    monkeypatch.undo()
    _answers_normally(engine)


@pytest.mark.slow
def test_cancel_kills_the_running_filter(engine, monkeypatch):
    _bypass(monkeypatch)
    graph = _graph(engine)
    graph.run(NORMAL_FILTER)
    pid = graph.pid
    cancel = threading.Event()
    threading.Timer(1.0, cancel.set).start()
    with _watch_rss(), pytest.raises(SearchError, match="cancelled"):
        _bounded(
            lambda: engine.search(
                {
                    "question": "orders",
                    "max_results": 10,
                    "cypher_filter": AMPLIFIERS["levenshtein-on-built-string"][1],
                },
                cancel,
            ),
            within=5.0,
        )
    assert pid is not None and not _alive(pid)
    monkeypatch.undo()
    _answers_normally(engine)


@pytest.mark.slow
def test_a_slow_filter_blocks_no_other_search_and_a_second_filter_waits_only_its_deadline(engine):
    graph = _graph(engine)
    slow = threading.Thread(
        target=lambda: pytest.raises(CypherFilterError, graph.run, CARTESIAN_6), daemon=True
    )
    slow.start()
    time.sleep(0.5)  # let it take the graph
    plain = _bounded(lambda: engine.search({"question": "orders", "max_results": 10}), within=5.0)
    assert plain.results and slow.is_alive()  # answered while the filter still runs
    with pytest.raises(CypherFilterError, match="waiting for another cypher_filter"):
        _bounded(lambda: graph.run(NORMAL_FILTER, timeout_s=1.0), within=5.0)
    assert slow.is_alive()
    slow.join(ANSWER_WITHIN_S)
    assert not slow.is_alive()
    _answers_normally(engine)


def test_a_dead_child_is_replaced_by_the_next_filter(engine):
    graph = _graph(engine)
    graph.run(NORMAL_FILTER)
    pid = graph.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    _answers_normally(engine)
    assert graph.pid not in (None, pid)


def test_a_restarted_child_holds_the_current_catalog(engine, store):
    """A change that reaches the graph while its child is dead is loaded by the restart; one that
    comes while it lives is applied in place."""
    graph = _graph(engine)
    graph.run(NORMAL_FILTER)
    os.kill(graph.pid, signal.SIGKILL)  # type: ignore[arg-type]
    src = store / "models" / "jaffle" / "orders.yaml"
    original = src.read_text()
    try:
        src.write_text(original.replace("columns:\n", "columns:\n- name: hostile_probe\n  type: INT\n", 1))
        engine.refresh([str(src)])
        probe = "MATCH (c:Column) WHERE c.name = 'hostile_probe' RETURN c.id AS id"
        resp = engine.search({"question": "orders", "cypher_filter": probe, "max_results": 10})
        assert {h.id for h in resp.results} == {"jaffle.orders.hostile_probe"}
        pid = graph.pid
        src.write_text(original)
        engine.refresh([str(src)])
        assert _graph(engine).run(probe) == frozenset() and graph.pid == pid  # in place, same child
    finally:
        src.write_text(original)
        engine.refresh([str(src)])


def test_closing_never_waits_for_a_running_filter(yaml_catalog):
    graph = GraphIndex.build(yaml_catalog)
    failed: list[str] = []

    def run() -> None:
        try:
            graph.run(CARTESIAN_6)
        except CypherFilterError as exc:
            failed.append(str(exc))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    time.sleep(0.5)
    pid = graph.pid
    _bounded(graph.close, within=3.0)
    thread.join(3.0)
    assert not thread.is_alive() and failed and "closed" in failed[0]
    assert pid is not None and not _alive(pid)
    with pytest.raises(CypherFilterError, match="closed"):
        graph.run(NORMAL_FILTER)


# --------------------------------------------------------------------------- the daemon, over stdio


def _children(pid: int) -> set[int]:
    out = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(") ", 1)[1].split()
            if int(fields[1]) == pid and fields[0] != "Z":
                out.add(int(entry.name))
    return out


def _daemon(tmp_path: Path) -> RawDaemon:
    store = copy_shop(tmp_path / "shop")
    d = RawDaemon(store, tmp_path / "daemon.log", env={"SLAYER_LSP_CACHE_DIR": str(tmp_path / "cache")})
    d.initialize()
    return d


SHOP_MODELS_FILTER = "MATCH (m:Model) RETURN m.id AS id"


def _normal_over_lsp(d: RawDaemon, models: set[str], first_hit: str) -> None:
    plain = d.call("slayer/search", {"question": "orders revenue", "max_results": 5}, timeout=ANSWER_WITHIN_S)
    assert plain["result"]["results"][0]["id"] == first_hit
    filtered = d.call(
        "slayer/search",
        {"question": "orders revenue", "cypher_filter": SHOP_MODELS_FILTER, "max_results": 50},
        timeout=ANSWER_WITHIN_S,
    )
    ids = {h["id"] for h in filtered["result"]["results"]}
    assert ids and ids <= models


@pytest.mark.slow
def test_hostile_filters_over_stdio(tmp_path):
    d = _daemon(tmp_path)
    try:
        plain = d.call("slayer/search", {"question": "orders revenue", "max_results": 5})["result"]
        first_hit = plain["results"][0]["id"]
        every = d.call(
            "slayer/search",
            {"question": "orders revenue", "cypher_filter": SHOP_MODELS_FILTER, "max_results": 1000},
        )["result"]
        models = {h["id"] for h in every["results"]}
        assert models
        cases = [(name, cypher, STOPPED) for name, cypher in sorted(PASSING.items())]
        cases += [
            (name, cypher, (f"may not call {fn}()",)) for name, (fn, cypher) in sorted(AMPLIFIERS.items())
        ]
        for name, cypher, expected in cases:
            with _watch_rss(d.proc.pid):
                msg_id = d.request("slayer/search", {"question": "orders", "cypher_filter": cypher})
                assert not d.wait_for([msg_id], ANSWER_WITHIN_S), f"{name}: no answer"
            error = d.answers(msg_id)[0].get("error")
            assert error and error["code"] == -32602 and any(e in error["message"] for e in expected), (
                name,
                error,
            )
            _normal_over_lsp(d, models, first_hit)
        assert d.alive() and not d.output_problems and not d.duplicates()
    finally:
        assert d.stop() == 0


@pytest.mark.slow
def test_cancel_and_shutdown_stop_a_running_filter_over_stdio(tmp_path):
    d = _daemon(tmp_path)
    try:
        every = d.call(
            "slayer/search", {"question": "orders", "cypher_filter": SHOP_MODELS_FILTER, "max_results": 1000}
        )["result"]
        models = {h["id"] for h in every["results"]}
        first_hit = d.call("slayer/search", {"question": "orders revenue", "max_results": 5})["result"][
            "results"
        ][0]["id"]
        graph_pids = _children(d.proc.pid)
        assert graph_pids  # the graph's process, started by the first filter

        msg_id = d.request("slayer/search", {"question": "orders", "cypher_filter": CARTESIAN_6})
        time.sleep(1.0)
        assert not d.answers(msg_id)  # still running
        d.notify("$/cancelRequest", {"id": msg_id})
        assert not d.wait_for([msg_id], 5.0), "the cancelled filter was not answered"
        assert d.answers(msg_id)[0]["error"]["code"] == -32800  # RequestCancelled
        deadline = time.monotonic() + 5.0
        while any(_alive(p) for p in graph_pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(_alive(p) for p in graph_pids), "cancel left the filter's process running"
        _normal_over_lsp(d, models, first_hit)

        running = d.request("slayer/search", {"question": "orders", "cypher_filter": CARTESIAN_6})
        time.sleep(1.0)
        assert not d.answers(running)
        graph_pids = _children(d.proc.pid)
        assert graph_pids
        shutdown = d.request("shutdown")
        assert not d.wait_for([shutdown, running], 5.0), "shutdown waited for the running filter"
        assert "result" in d.answers(shutdown)[0]
        assert "error" in d.answers(running)[0]
        d.notify("exit")
        assert d.proc.wait(10) == 0
        assert not any(_alive(p) for p in graph_pids)
    finally:
        d.stop()


@pytest.mark.slow
def test_the_graph_process_does_not_outlive_a_killed_daemon(tmp_path):
    d = _daemon(tmp_path)
    try:
        d.call("slayer/search", {"question": "orders", "cypher_filter": SHOP_MODELS_FILTER})
        d.request("slayer/search", {"question": "orders", "cypher_filter": CARTESIAN_6})
        time.sleep(0.5)
        graph_pids = _children(d.proc.pid)
        assert graph_pids
        d.proc.kill()
        d.proc.wait(10)
        deadline = time.monotonic() + 10.0
        while any(_alive(p) for p in graph_pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(p) for p in graph_pids), "the graph's process outlived the daemon"
    finally:
        d.stop()


# --------------------------------------------------------------------------- the child's own limits


def _worker(limits) -> subprocess.Popen:  # type: ignore[no-untyped-def]
    """The graph's process on its own, with no parent watching it: its rlimits must stop it alone."""
    import msgspec

    from slayer_lsp.search import graph_worker as w

    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        "MALLOC_ARENA_MAX": "2",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "slayer_lsp.search.graph_worker", msgspec.json.encode(limits).decode()],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
    )
    assert isinstance(_worker_reply(proc), w.Done)  # started
    rows = [[f"ds.m{i}", f"m{i}", ""] for i in range(5)]
    _worker_send(proc, w.Build(nodes={"Model": rows}, edges=[], cpu_s=30))
    assert isinstance(_worker_reply(proc), w.Done)
    return proc


def _worker_send(proc: subprocess.Popen, message) -> None:  # type: ignore[no-untyped-def]
    from slayer_lsp.search import graph_worker as w

    proc.stdin.write(w.encode(message))  # type: ignore[union-attr]
    proc.stdin.flush()  # type: ignore[union-attr]


def _worker_reply(proc: subprocess.Popen):  # type: ignore[no-untyped-def]
    from slayer_lsp.search import graph_worker as w

    header = proc.stdout.read(w.HEADER_BYTES)  # type: ignore[union-attr]
    if len(header) < w.HEADER_BYTES:
        return None
    return w.decode_reply(proc.stdout.read(w.frame_length(header)))  # type: ignore[union-attr]


@pytest.mark.slow
def test_the_cpu_limit_ends_a_filter_that_ignores_its_timeout():
    from slayer_lsp.search import graph_worker as w

    proc = _worker(
        w.Limits(
            address_space_bytes=G.CHILD_ADDRESS_SPACE_BYTES,
            buffer_pool_bytes=G.BUFFER_POOL_BYTES,
            max_db_bytes=G.BUFFER_POOL_BYTES,
            threads=1,
        )
    )
    try:
        lev = AMPLIFIERS["levenshtein-on-built-string"][1]
        _worker_send(proc, w.Query(lev, timeout_ms=600_000, max_rows=10, max_id_bytes=1000, cpu_s=2))
        reply = _bounded(lambda: _worker_reply(proc), within=ANSWER_WITHIN_S)
        assert reply is None  # no answer: the kernel ended it
        assert proc.wait(5) == -signal.SIGXCPU
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.slow
def test_the_address_space_limit_fails_a_growing_filter():
    from slayer_lsp.search import graph_worker as w

    proc = _worker(
        w.Limits(
            address_space_bytes=G.CHILD_ADDRESS_SPACE_BYTES,
            buffer_pool_bytes=G.BUFFER_POOL_BYTES,
            max_db_bytes=G.BUFFER_POOL_BYTES,
            threads=1,
        )
    )
    try:
        grow = AMPLIFIERS["replace-growth"][1]
        _worker_send(proc, w.Query(grow, timeout_ms=600_000, max_rows=10, max_id_bytes=1000, cpu_s=600))
        reply = _bounded(lambda: _worker_reply(proc), within=ANSWER_WITHIN_S)
        assert isinstance(reply, w.Failed) and reply.reason == "memory", reply
        assert _rss(proc.pid) < G.CHILD_ADDRESS_SPACE_BYTES
    finally:
        proc.kill()
        proc.wait()
