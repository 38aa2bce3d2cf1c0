"""Cypher graph benchmark: bulk build and incremental update of the LadybugDB graph.

    python bench/graph_build.py --storage PATH [--repeats N] [--sweep] [--slayer [--slayer-venv PATH]]

On one store (a YAML directory or a SQLite file; never modified) it reads the catalog once, then
prints medians over ``--repeats`` runs of:

* ``GraphIndex.build`` (starting the graph's process, schema, bulk COPY), with the row counts of
  the graph;
* ``apply`` of a one-model change (a column added, one hidden, the description edited) and of a
  one-memory change (tags and learning edited), rows sent to the graph's process; the changes are
  made to in-memory copies of the documents and fed through ``Catalog.derive``, exactly as a rescan
  would;
* a few filters through ``run``.

``--sweep`` times incremental updates of 1..N changed models against a rebuild (how
``_REBUILD_SHARE`` was chosen). ``--slayer`` also times motley-slayer's own ``build_graph`` (one
statement per node and edge) on a private copy of the store, in its own venv.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from slayer_lsp.catalog import Catalog, Delta  # noqa: E402
from slayer_lsp.search import graph as G  # noqa: E402
from slayer_lsp.store import documents as d  # noqa: E402
from slayer_lsp.store.reader import DocKey, StoredDoc, StoreRead, StoreReader  # noqa: E402

FILTERS = (
    "MATCH (v:Memory) RETURN v.id AS id",
    "MATCH (m:Memory)-[:MENTIONS]->(c:ModelColumn) WHERE c.data_type = 'TEXT' RETURN m.id AS id",
    "MATCH (d:Datasource)-[:CONTAINS*1..2]->(c:Column) WHERE c.data_type = 'INT' RETURN c.id AS id",
)

_SLAYER_BUILD = r"""
import asyncio, json, sys, time
from slayer.storage.base import resolve_storage
from slayer.search.graph import build_graph
async def main():
    storage = resolve_storage(sys.argv[1])
    times = []
    for _ in range(int(sys.argv[2])):
        t = time.perf_counter()
        db, conn = await build_graph(storage)
        times.append(time.perf_counter() - t)
        conn.close(); db.close()
    print(json.dumps(times))
asyncio.run(main())
"""


def _timed(fn, repeats: int, times: list[float] | None = None) -> tuple[float, object]:
    times = [] if times is None else times
    out = None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def _with_docs(read: StoreRead, replaced: dict[DocKey, StoredDoc]) -> StoreRead:
    docs = dict(read.docs)
    docs.update(replaced)
    return StoreRead(read.location, docs, list(read.issues), read.fatal)


def _edit_models(read: StoreRead, cat: Catalog, count: int, tag: str) -> StoreRead:
    """A read in which ``count`` visible models changed: one column more, one hidden, new text."""
    replaced = {}
    keys = [k for k in read.docs if k.kind == "model" and not cat.models[k.name].hidden][:count]
    for key in keys:
        doc = read.docs[key]
        model: d.Model = doc.value  # type: ignore[assignment]
        cols = list(model.columns)
        if len(cols) > 1:
            cols[1] = msgspec.structs.replace(cols[1], hidden=True)
        cols.append(d.Column(name=f"bench_{tag}", type="INT", description="added by the benchmark"))
        value = msgspec.structs.replace(model, columns=cols, description=f"edited ({tag})")
        replaced[key] = StoredDoc(key, value, doc.source, doc.digest + tag, doc.issues)
    return _with_docs(read, replaced)


def _edit_memory(read: StoreRead, cat: Catalog, tag: str) -> StoreRead:
    key = next(k for k in read.docs if k.kind == "memory" and read.docs[k].value.entities)  # type: ignore[union-attr]
    doc = read.docs[key]
    memory: d.Memory = doc.value  # type: ignore[assignment]
    first_model = next(iter(cat.models))
    value = msgspec.structs.replace(
        memory, learning=memory.learning + f" ({tag})", entities=[*memory.entities[1:], first_model]
    )
    return _with_docs(read, {key: StoredDoc(key, value, doc.source, doc.digest + tag, doc.issues)})


def _apply_pair(
    graph: G.GraphIndex, base: Catalog, edited: Catalog, delta: Delta, back: Delta, repeats: int
) -> tuple[float, str]:
    """Median time of base -> edited (each run is followed by an untimed edited -> base)."""
    times, outcome = [], ""
    for _ in range(repeats):
        t = time.perf_counter()
        outcome = graph.apply(edited, delta)
        times.append(time.perf_counter() - t)
        graph.apply(base, back)
    return statistics.median(times), outcome


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--storage", required=True, help="a SLayer store: YAML directory or SQLite file")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sweep", action="store_true", help="incremental update vs rebuild, 1..N models")
    parser.add_argument("--slayer", action="store_true", help="also time motley-slayer's build_graph")
    parser.add_argument(
        "--slayer-venv", default=None, help="venv holding motley-slayer (see bench/_slayer_env.py)"
    )
    args = parser.parse_args()

    t = time.perf_counter()
    read = StoreReader(args.storage).read()
    base = Catalog.from_read(read)
    print(
        f"store: {args.storage}  ({len(base.models)} models, {len(base.memories)} memories; "
        f"read + catalog {time.perf_counter() - t:.2f} s)"
    )
    if base.fatal:
        sys.exit(f"cannot read the store: {base.fatal}")

    builds: list[float] = []
    cpu = time.process_time()
    build_s, graph = _timed(lambda: G.GraphIndex.build(base), args.repeats, builds)
    cpu_s = (
        time.process_time() - cpu
    ) / args.repeats  # the daemon's side only: the graph loads in its own process
    assert isinstance(graph, G.GraphIndex)
    print(
        f"build:  {build_s * 1000:8.1f} ms median, {min(builds) * 1000:.1f} ms best, "
        f"{cpu_s * 1000:.1f} ms CPU  {graph.counts()}"
    )

    edited, delta = base.derive(_edit_models(read, base, 1, "a"))
    back = edited.derive(read)[1]
    mem_edited, mem_delta = base.derive(_edit_memory(read, base, "m"))
    mem_back = mem_edited.derive(read)[1]
    # The rows are loaded in the graph's own process (graph_worker), small node sets by UNWIND and
    # the rest by COPY; the threshold lives there, so it is no longer swept from here.
    s, how = _apply_pair(graph, base, edited, delta, back, max(args.repeats, 5))
    print(f"apply one model : {s * 1000:8.1f} ms  [{how}, {len(delta.touched)} ids]")
    s, how = _apply_pair(graph, base, mem_edited, mem_delta, mem_back, max(args.repeats, 5))
    print(f"apply one memory: {s * 1000:8.1f} ms  [{how}]")

    for text in FILTERS:
        s, ids = _timed(lambda text=text: graph.run(text), args.repeats)
        print(f"run: {s * 1000:8.1f} ms  {len(ids):6} ids  {text}")  # type: ignore[arg-type]

    if args.sweep:
        saved, G._REBUILD_SHARE = G._REBUILD_SHARE, float("inf")
        try:
            for count in (1, 10, 50, 100, 250, 500):
                if count > len(base.models):
                    break
                cat_k, delta_k = base.derive(_edit_models(read, base, count, f"k{count}"))
                back_k = cat_k.derive(read)[1]
                s, _ = _apply_pair(graph, base, cat_k, delta_k, back_k, args.repeats)
                print(
                    f"sweep: {count:4} models changed: incremental {s * 1000:8.1f} ms  "
                    f"(rebuild {build_s * 1000:.1f} ms)"
                )
        finally:
            G._REBUILD_SHARE = saved
    graph.close()

    if args.slayer:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import _slayer_env as env

        with tempfile.TemporaryDirectory(prefix="graph-bench-") as tmp:
            copy = env.copy_store(Path(args.storage), Path(tmp) / Path(args.storage).name)
            times = env.run_in_slayer(_SLAYER_BUILD, copy, args.repeats, venv=args.slayer_venv)
        print(
            f"SLayer build_graph: {statistics.median(times) * 1000:8.1f} ms "
            f"(ours {build_s * 1000:.1f} ms, {statistics.median(times) / build_s:.0f}x)"
        )


if __name__ == "__main__":
    main()
