"""Memory benchmark: does the default search answer "what do we already know about this"?

    python bench/memory_ranking.py [--rankings hybrid,slayer] [--lexical] [--fit DB,DB] [--json OUT]
                                   [--remake] [--limit N]

Agents ask ``slayer/search`` two kinds of questions: which columns does the SQL need, and which saved
memory already answers this. ``bench/schema_linking.py`` measures the first; this script measures
the second on the same questions, and the first again on the same store, in one run.

The store: the dev-public catalog (``shared/bench``, made into a SLayer store by
``shared/tools/catalog_to_slayer.py``) plus one memory per distinct (database, evidence) string of
the dev-public BIRD questions, tagged with the gold columns of the questions it came from and
written through ``slayer_lsp.writer.memories.save_memory`` (made once under ``bench/.work/``). Each BIRD
question's gold memory is its own evidence string; the search is the question alone, scope all
(no datasource), every channel on (the offline embedding model; ``--lexical`` switches it off).

Per ranking (``hybrid``, the default; ``slayer``, SLayer's RRF on our channels) and two baselines
(``dense``: cosine of the question against each memory's vector; ``bm25``: Okapi BM25 over the
memories' words), over the BIRD questions:

* memory-only search (``kinds: ["memory"]``, 10 results): Hit@1, Hit@5, MRR@10 of the gold memory;
* the default search (10 results, every kind): the gold memory anywhere in it ("in default 10");
* the column figures of every question (BIRD and Spider) from the default search with 50 results,
  on this store (memories present) — as ``schema_linking.py`` scores them.

Weights are fitted on the *fit* databases (``--fit``, default: debit_card_specializing and
european_football_2) and every figure is printed for ``fit``, ``held`` (the other BIRD database) and
``all``, so a weight that only helps the questions it was fitted on shows.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _slayer_env as env  # noqa: E402
import schema_linking as sl  # noqa: E402

DEFAULT_FIT = ("debit_card_specializing", "european_football_2")
STORE_NAME = "store-dev-public-memories"
_WORD = re.compile(r"\w+")


@dataclass
class MemoryQuestion:
    index: int  # position in the schema_linking question list
    db: str
    gold_memory: str  # memory id


def build_store(
    base: Path, dest: Path, items: list[tuple[int, str, str, list[str]]], remake: bool
) -> dict[tuple[str, str], str]:
    """The store with one memory per (db, evidence); returns (db, evidence) -> memory id. The memory
    ids are kept in ``dest/../memory-ids.json`` so an unchanged store is reused (with its vectors)."""
    from slayer_lsp.catalog import load_catalog
    from slayer_lsp.store.locate import locate
    from slayer_lsp.writer.memories import save_memory

    merged: dict[tuple[str, str], set[str]] = {}
    for _, db, text, cols in items:
        merged.setdefault((db, text), set()).update(cols)
    ids_file = dest.parent / "memory-ids.json"
    key = sorted([db, text, sorted(cols)] for (db, text), cols in merged.items())
    if not remake and ids_file.exists() and dest.is_dir():
        saved = json.loads(ids_file.read_text())
        if saved.get("key") == key:
            return {(db, text): mid for db, text, mid in saved["ids"]}
    env.copy_store(base, dest)
    (dest / "memories").mkdir(exist_ok=True)
    location, catalog = locate(dest), load_catalog(dest)
    ids: dict[tuple[str, str], str] = {}
    for (db, text), cols in merged.items():
        ids[(db, text)] = save_memory(location, catalog, learning=text, entities=sorted(cols)).id
    ids_file.write_text(json.dumps({"key": key, "ids": [[db, text, mid] for (db, text), mid in ids.items()]}))
    return ids


# --------------------------------------------------------------------------- metrics


def memory_metrics(ranked: Sequence[Sequence[str]], gold: Sequence[str]) -> dict[str, float]:
    """Hit@1, Hit@5, MRR@10 of each question's gold memory in its ranked memory ids."""
    hit1 = hit5 = rr = 0.0
    for ids, want in zip(ranked, gold, strict=True):
        top = list(ids[:10])
        if want in top:
            pos = top.index(want) + 1
            hit1 += pos == 1
            hit5 += pos <= 5
            rr += 1.0 / pos
    n = max(len(gold), 1)
    return {"Hit@1": hit1 / n, "Hit@5": hit5 / n, "MRR@10": rr / n}


def _bm25_baseline(catalog: Any, questions: list[str]) -> list[list[str]]:
    from rank_bm25 import BM25Okapi

    mids = sorted(catalog.memories)
    corpus = [_WORD.findall(catalog.memories[m].learning.lower()) for m in mids]
    bm25 = BM25Okapi(corpus)
    out = []
    for q in questions:
        scores = bm25.get_scores(_WORD.findall(q.lower()))
        order = sorted(range(len(mids)), key=lambda i: (-scores[i], mids[i]))[:10]
        out.append([mids[i] for i in order])
    return out


def _dense_baseline(engine: Any, questions: list[str]) -> list[list[str]]:
    from slayer_lsp.catalog.ids import memory_id_of

    out = []
    for q in questions:
        hits = engine.dense.search(q, k=10, kinds=["memory"])
        out.append([memory_id_of(c) for c, _ in hits.by_kind.get("memory", [])][:10])
    return out


# --------------------------------------------------------------------------- the run


def run(args: argparse.Namespace) -> dict[str, Any]:
    from slayer_lsp.engine import Engine

    os.environ.update(sl._bench_env())
    base = sl.default_store()
    if not (base / "datasources").is_dir():
        sl.make_store(sl.DEFAULT_CATALOG, base)
    gold = sl.GoldMap.from_store(base)
    questions = sl.load_questions(sl.DEFAULT_QUESTIONS, gold, args.limit, evidence=False)
    items = sl.evidence_items(sl.DEFAULT_QUESTIONS, gold, args.limit, require_columns=False)
    store = env.work_dir() / "memory-ranking" / STORE_NAME
    t0 = time.perf_counter()
    ids = build_store(base, store, items, args.remake)
    print(
        f"[memory-ranking] {len(ids)} memories in {store} ({time.perf_counter() - t0:.1f} s)", file=sys.stderr
    )
    mqs = [MemoryQuestion(pos, db, ids[(db, text)]) for pos, db, text, _ in items]
    fit = set(args.fit.split(",")) if args.fit else set(DEFAULT_FIT)
    bird_dbs = sorted({m.db for m in mqs})
    held = [db for db in bird_dbs if db not in fit]
    print(
        f"[memory-ranking] {len(mqs)} BIRD questions with a gold memory; fit {sorted(fit)}, held {held}",
        file=sys.stderr,
    )

    os.environ.setdefault(
        "SLAYER_LSP_CACHE_DIR", str(store.parent / "cache")
    )  # part vectors kept between runs
    engine = Engine(store, graph=False, dense="off" if args.lexical else "live")
    engine.refresh()
    if engine.dense is not None:
        t0 = time.perf_counter()
        engine.dense.wait_idle(timeout=None)
        parts = getattr(engine.dense, "parts", None)
        if parts is not None:
            parts.wait_idle(timeout=None)
        print(f"[memory-ranking] vectors ready in {time.perf_counter() - t0:.1f} s", file=sys.stderr)

    texts = [questions[m.index].text for m in mqs]
    rankings = [r for r in args.rankings.split(",") if r]
    mem_ranked: dict[str, list[list[str]]] = {}
    in_default: dict[str, list[bool]] = {}
    col_hits: dict[str, list[list[tuple[str, str]]]] = {}
    seconds: dict[str, list[float]] = {}
    for ranking in rankings:
        mem_ranked[ranking], in_default[ranking], seconds[ranking] = [], [], []
        for m, text in zip(mqs, texts, strict=True):
            t = time.perf_counter()
            resp = engine.search(
                {"question": text, "kinds": ["memory"], "max_results": 10, "ranking": ranking}
            )
            seconds[ranking].append(time.perf_counter() - t)
            mem_ranked[ranking].append([h.id for h in resp.results if h.kind == "memory"])
            resp = engine.search({"question": text, "max_results": 10, "ranking": ranking})
            in_default[ranking].append(
                any(h.kind == "memory" and h.id == m.gold_memory for h in resp.results)
            )
        col_hits[ranking] = []
        for q in questions:
            resp = engine.search({"question": q.text, "max_results": 50, "ranking": ranking})
            col_hits[ranking].append([(h.kind, h.id) for h in resp.results])
    baselines: dict[str, list[list[str]]] = {"bm25": _bm25_baseline(engine.catalog, texts)}
    if engine.dense is not None:
        baselines["dense"] = _dense_baseline(engine, texts)
    engine.close()

    parts_of = {
        "fit": [i for i, m in enumerate(mqs) if m.db in fit],
        "held": [i for i, m in enumerate(mqs) if m.db not in fit],
        "all": list(range(len(mqs))),
    }
    figures: dict[str, Any] = {"memories": [], "columns": []}
    rows = []
    for name in [*rankings, *baselines]:
        ranked = mem_ranked.get(name) or baselines[name]
        for part, idx in parts_of.items():
            mm = memory_metrics([ranked[i] for i in idx], [mqs[i].gold_memory for i in idx])
            default = (
                (sum(in_default[name][i] for i in idx) / max(len(idx), 1)) if name in in_default else None
            )
            figures["memories"].append(
                {"ranking": name, "part": part, "n": len(idx), **mm, "in_default10": default}
            )
            rows.append(
                [
                    name,
                    part,
                    len(idx),
                    *(f"{mm[k]:.3f}" for k in ("Hit@1", "Hit@5", "MRR@10")),
                    "-" if default is None else f"{default:.3f}",
                    env.fmt_seconds(env.median(seconds[name][i] for i in idx)) if name in seconds else "-",
                ]
            )
    env.print_table(
        [
            "ranking",
            "part",
            "n",
            "mem Hit@1",
            "mem Hit@5",
            "mem MRR@10",
            "in default 10",
            "median memory search",
        ],
        rows,
        title=f"## memories: {len(ids)} evidence memories, BIRD questions, scope all, "
        f"{'lexical channels' if args.lexical else 'every channel'}",
    )

    col_parts = {
        "all": list(range(len(questions))),
        "fit": [i for i, q in enumerate(questions) if q.db in fit],
        "held": [i for i, q in enumerate(questions) if q.db in held],
        "spider": [i for i, q in enumerate(questions) if q.source == "spider"],
    }
    rows = []
    for ranking in rankings:
        for part, idx in col_parts.items():
            sc = sl.score([questions[i] for i in idx], [col_hits[ranking][i] for i in idx])
            figures["columns"].append({"ranking": ranking, "part": part, **sc})
            rows.append(
                [
                    ranking,
                    part,
                    f"{sc['n_col']}",
                    *(sl._f(sc["col"][k]) for k in ("R@5", "R@10", "MRR", "Full@10")),
                    sl._f(sc["tab"]["R@5"]),
                ]
            )
    env.print_table(
        ["ranking", "part", "n", "col R@5", "col R@10", "col MRR", "col Full@10", "tab R@5"],
        rows,
        title="## columns of the same questions on the same store (max_results=50)",
    )
    return figures


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rankings", default="hybrid,slayer", help="comma-separated: hybrid, slayer")
    ap.add_argument("--lexical", action="store_true", help="switch the dense channel off")
    ap.add_argument("--fit", default=None, help="comma-separated BIRD databases the weights were fitted on")
    ap.add_argument("--limit", type=int, default=None, help="first N questions only")
    ap.add_argument("--remake", action="store_true", help="rewrite the memory store")
    ap.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = ap.parse_args(argv)
    figures = run(args)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
