"""Schema-linking benchmark: does search surface the columns and tables a question needs?

    python bench/schema_linking.py [--storage STORE | --make-store] [--questions FILE]
                                   [--scope db|all|both] [--limit N] [--max-results N] [--evidence]
                                   [--with-slayer] [--slayer-venv PATH] [--json OUT]

The store is a SLayer YAML directory made by ``shared/tools/catalog_to_slayer.py`` from the
benchmark catalog (``shared/bench/catalog-dev-public.json``); without ``--storage`` it is made once
under ``bench/.work/schema-linking/`` (``--make-store`` remakes it). Each question is one search
with the question text only (``--evidence`` appends BIRD's hint), ``datasource`` = the question's
database in scope ``db`` and none in scope ``all``, ``max_results`` large enough to score @10.

Metrics as ``shared/reference/retrieval-notes.md`` defines them, per question then averaged:

* columns (questions with gold columns only): Recall@5, Recall@10, MRR of the first gold column,
  Full@10 (every gold column in the top 10). The ranking is the column hits in result order (other
  kinds skipped); a hit ``<ds>.<model>.<column>`` is matched to gold ``table.column`` through the
  store itself (the datasource's connection string names the database, ``sql_table`` and a
  column's ``sql`` hold the raw names), case-insensitively;
* tables: ranked by their best column hit (the order in which each first appears among the column
  hits): Recall@5, Recall@10, MRR.

Also counted: questions with no result at all. ``--with-slayer`` runs motley-slayer's
``SearchService`` on the same store, in its own venv and one process for all questions, and prints
its figures beside ours (no API key there, so only its tantivy channel runs, as for ours).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _slayer_env as env  # noqa: E402

sys.path.insert(0, str(env.REPO))

BENCH = env.SHARED / "bench"
CONVERTER = env.SHARED / "tools" / "catalog_to_slayer.py"
DEFAULT_CATALOG = BENCH / "catalog-dev-public.json"
DEFAULT_QUESTIONS = BENCH / "questions-dev-public.jsonl"
# catalog_to_slayer writes ``sqlite:///${BENCH_DB_DIR}/<db>.sqlite``; SLayer refuses an unset variable.
DB_FROM_CONNECTION = re.compile(r"([^/\\]+)\.sqlite$")
KS = (5, 10)


# --------------------------------------------------------------------------- store and gold


def default_store() -> Path:
    return env.work_dir() / "schema-linking" / "store-dev-public"


def make_store(catalog: Path, out: Path) -> Path:
    """Run the converter (its renames go to our stderr)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    print(f"[schema-linking] converting {catalog.name} into {out}", file=sys.stderr)
    subprocess.run([sys.executable, str(CONVERTER), str(catalog), str(out), "--overwrite"], check=True)
    return out


def _unquote(sql: str | None) -> str | None:
    """The raw name back from ``quote_if_needed``: a double-quoted identifier with ``""`` escapes."""
    if sql is None:
        return None
    if len(sql) >= 2 and sql[0] == sql[-1] == '"':
        return sql[1:-1].replace('""', '"')
    return sql


@dataclass
class GoldMap:
    """Raw benchmark names (database, table, column) -> canonical ids of the store."""

    datasource: dict[str, str] = field(default_factory=dict)  # db_id -> ds
    tables: dict[tuple[str, str], str] = field(default_factory=dict)  # (db, table lower) -> "ds.model"
    columns: dict[tuple[str, str, str], str] = field(default_factory=dict)  # (db, table, col) -> canonical

    @classmethod
    def from_store(cls, store: Path) -> GoldMap:
        from slayer_lsp.catalog import load_catalog

        cat = load_catalog(store)
        out = cls()
        for ds_name, ds in cat.datasources.items():
            m = DB_FROM_CONNECTION.search(ds.connection_string or "")
            out.datasource[m.group(1) if m else ds_name] = ds_name
        db_of = {ds: db for db, ds in out.datasource.items()}
        for mid, model in cat.models.items():
            db = db_of.get(model.data_source, model.data_source)
            table = (_unquote(model.sql_table) or model.name).lower()
            out.tables[(db, table)] = mid
            for col in model.columns:
                raw = (_unquote(col.sql) or col.name).lower()
                out.columns.setdefault((db, table, raw), f"{mid}.{col.name}")
        return out

    def column(self, db: str, gold: str) -> str | None:
        """``table.column`` (either part may hold dots) -> canonical id, or None."""
        low = gold.lower()
        for i, ch in enumerate(low):
            if ch == "." and (hit := self.columns.get((db, low[:i], low[i + 1:]))):
                return hit
        return None

    def table(self, db: str, gold: str) -> str | None:
        return self.tables.get((db, gold.lower()))


@dataclass
class Question:
    qid: str
    db: str
    text: str
    source: str  # bird | spider
    gold_columns: list[str]  # canonical ids; an unmapped gold column keeps a marker that never matches
    gold_tables: list[str]
    unmapped: int


def load_questions(path: Path, gold: GoldMap, limit: int | None, evidence: bool) -> list[Question]:
    out = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                continue
            q = json.loads(line)
            db = q["db_id"]
            cols, tabs, unmapped = [], [], 0
            for g in q.get("gold_columns") or []:
                c = gold.column(db, g)
                unmapped += c is None
                cols.append(c or f"?unmapped:{db}.{g}")
            for g in q.get("gold_tables") or []:
                t = gold.table(db, g)
                unmapped += t is None
                tabs.append(t or f"?unmapped:{db}.{g}")
            text = q["question"]
            if evidence and q.get("evidence"):
                text = f"{text} {q['evidence']}"
            source = str(q.get("id", "")).split("-", 1)[0] or "?"
            out.append(Question(q["id"], db, text, source, list(dict.fromkeys(cols)),
                                list(dict.fromkeys(tabs)), unmapped))
            if limit and len(out) >= limit:
                break
    return out


# --------------------------------------------------------------------------- scoring


def _recall(gold: list[str], ranked: list[str], k: int) -> float:
    top = set(ranked[:k])
    return sum(g in top for g in gold) / len(gold)


def _rr(gold: list[str], ranked: list[str]) -> float:
    wanted = set(gold)
    return next((1.0 / i for i, c in enumerate(ranked, start=1) if c in wanted), 0.0)


def score(questions: list[Question], hits: list[list[tuple[str, str]]]) -> dict[str, Any]:
    """``hits[i]``: (kind, id) in result order for question i -> averaged metrics."""
    col: dict[str, list[float]] = {"R@5": [], "R@10": [], "MRR": [], "Full@10": []}
    tab: dict[str, list[float]] = {"R@5": [], "R@10": [], "MRR": []}
    empty = 0
    for q, result in zip(questions, hits, strict=True):
        empty += not result
        columns = list(dict.fromkeys(i for kind, i in result if kind == "column"))
        tables = list(dict.fromkeys(c.rsplit(".", 1)[0] for c in columns))
        if q.gold_columns:
            for k in KS:
                col[f"R@{k}"].append(_recall(q.gold_columns, columns, k))
            col["MRR"].append(_rr(q.gold_columns, columns))
            col["Full@10"].append(float(set(q.gold_columns) <= set(columns[:10])))
        if q.gold_tables:
            for k in KS:
                tab[f"R@{k}"].append(_recall(q.gold_tables, tables, k))
            tab["MRR"].append(_rr(q.gold_tables, tables))

    def avg(xs: list[float]) -> float | None:
        return sum(xs) / len(xs) if xs else None
    return {"n": len(questions), "n_col": len(col["MRR"]), "n_tab": len(tab["MRR"]), "no_result": empty,
            "col": {k: avg(v) for k, v in col.items()}, "tab": {k: avg(v) for k, v in tab.items()}}


# --------------------------------------------------------------------------- the two searchers


@dataclass
class Run:
    hits: list[list[tuple[str, str]]]
    errors: list[str | None]
    seconds: list[float]


def run_ours(store: Path, calls: list[dict[str, Any]], dense: bool = False) -> Run:
    from slayer_lsp.engine import Engine
    from slayer_lsp.search.types import SearchError

    engine = Engine(store, use_cache=False, graph=False, dense="live" if dense else "off")
    engine.refresh()
    if engine.dense is not None:  # rank with every vector: wait for the embedding backfill first
        t0 = time.perf_counter()
        engine.dense.wait_idle(timeout=None)
        st = engine.dense.status()
        print(f"[schema-linking] dense channel: {st.model}, {st.rows} vectors "
              f"({st.embedded} embedded now, {st.reused} reused) in {time.perf_counter() - t0:.1f} s",
              file=sys.stderr)
    run = Run([], [], [])
    for call in calls:
        t0 = time.perf_counter()
        try:
            resp = engine.search(call)
            run.hits.append([(h.kind, h.id) for h in resp.results])
            run.errors.append(None)
        except SearchError as exc:
            run.hits.append([])
            run.errors.append(str(exc))
        run.seconds.append(time.perf_counter() - t0)
    return run


# Runs in the SLayer venv; argv: a JSON file {"store", "calls": [search kwargs...]}.
_SLAYER_BATCH = r"""
import asyncio, json, logging, sys, time
logging.disable(logging.WARNING)
spec = json.load(open(sys.argv[1]))
from slayer.storage.base import resolve_storage
from slayer.search.service import SearchService

async def main():
    svc = SearchService(storage=resolve_storage(spec["store"]))
    out = []
    for kw in spec["calls"]:
        t0 = time.perf_counter()
        try:
            r = await svc.search(**kw)
            row = {"hits": [[h.kind, h.id] for h in r.results], "error": None}
        except Exception as exc:
            row = {"hits": [], "error": f"{type(exc).__name__}: {exc}"}
        row["s"] = time.perf_counter() - t0
        out.append(row)
    return out

print(json.dumps(asyncio.run(main())))
"""


def run_slayer(store: Path, calls: list[dict[str, Any]], venv: str | None) -> Run:
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
        json.dump({"store": str(store), "calls": calls}, fh)
    try:
        rows = env.run_in_slayer(_SLAYER_BATCH, fh.name, venv=venv, env=_bench_env())
    finally:
        os.unlink(fh.name)
    return Run([[tuple(h) for h in r["hits"]] for r in rows], [r["error"] for r in rows], [r["s"] for r in rows])


def _bench_env() -> dict[str, str]:
    """The converter's connection strings name ``${BENCH_DB_DIR}``; nothing connects to it."""
    return {"BENCH_DB_DIR": os.environ.get("BENCH_DB_DIR") or str(env.work_dir() / "schema-linking" / "db")}


# --------------------------------------------------------------------------- output


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def subsets(questions: list[Question]) -> Iterable[tuple[str, list[int]]]:
    yield "all", list(range(len(questions)))
    for src in sorted({q.source for q in questions}):
        idx = [i for i, q in enumerate(questions) if q.source == src]
        if len(idx) < len(questions):
            yield src, idx


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--storage", type=Path, default=None,
                    help="SLayer YAML store made by catalog_to_slayer.py (default: made under bench/.work/)")
    ap.add_argument("--make-store", action="store_true",
                    help="(re)make the store from --catalog (into --storage, or the default place)")
    ap.add_argument("--catalog", type=Path, default=DEFAULT_CATALOG, help="catalog for --make-store")
    ap.add_argument("--questions", type=Path, default=DEFAULT_QUESTIONS, help="questions JSONL")
    ap.add_argument("--scope", choices=("db", "all", "both"), default="all")
    ap.add_argument("--limit", type=int, default=None, help="first N questions only")
    ap.add_argument("--max-results", type=int, default=50)
    ap.add_argument("--evidence", action="store_true", help="append BIRD's evidence to the question")
    ap.add_argument("--with-slayer", action="store_true", help="also run motley-slayer on the same store")
    ap.add_argument("--dense", action="store_true",
                    help="add channel 3 (the offline embedding model; embeds the store's missing vectors first)")
    ap.add_argument("--ranking", choices=("hybrid", "slayer", "both"), default="hybrid",
                    help="our ranking: hybrid (the default) or slayer (SLayer's RRF pipeline), or both")
    ap.add_argument("--json", type=Path, default=None, help="write figures and per-question ranks here")
    env.add_venv_option(ap)
    args = ap.parse_args(argv)

    os.environ.update(_bench_env())
    store = args.storage or default_store()
    if args.make_store or (args.storage is None and not (store / "datasources").is_dir()):
        make_store(args.catalog, store)
    if not store.exists():
        ap.error(f"store {store} does not exist (pass --make-store to create it)")
    gold = GoldMap.from_store(store)
    questions = load_questions(args.questions, gold, args.limit, args.evidence)
    missing_db = sorted({q.db for q in questions if q.db not in gold.datasource})
    unmapped = sum(q.unmapped for q in questions)
    print(f"[schema-linking] {len(questions)} questions, {len(gold.datasource)} datasources, "
          f"{len(gold.tables)} tables, {len(gold.columns)} columns; unmapped gold names: {unmapped}"
          + (f"; databases missing from the store: {missing_db}" if missing_db else ""), file=sys.stderr)

    scopes = ("db", "all") if args.scope == "both" else (args.scope,)
    calls_by_scope = {
        s: [{"question": q.text, "datasource": gold.datasource.get(q.db, q.db) if s == "db" else None,
             "max_results": args.max_results} for q in questions]
        for s in scopes
    }
    runs: dict[tuple[str, str], Run] = {}
    rankings = ("hybrid", "slayer") if args.ranking == "both" else (args.ranking,)
    for s in scopes:
        for ranking in rankings:
            print(f"[schema-linking] ours ({ranking}), scope {s} ...", file=sys.stderr)
            name = f"slayer-lsp {ranking}" + (" +dense" if args.dense else "")
            runs[(s, name)] = run_ours(store, [{**c, "ranking": ranking} for c in calls_by_scope[s]],
                                       dense=args.dense)
    if args.with_slayer:
        # One SLayer process for every scope: the searches of all scopes in one batch.
        print(f"[schema-linking] SLayer, {len(scopes) * len(questions)} searches in one process ...",
              file=sys.stderr)
        batch = [c for s in scopes for c in calls_by_scope[s]]
        theirs = run_slayer(store, batch, args.slayer_venv)
        n = len(questions)
        for i, s in enumerate(scopes):
            part = slice(i * n, (i + 1) * n)
            runs[(s, "SLayer 1.4.1")] = Run(theirs.hits[part], theirs.errors[part], theirs.seconds[part])

    headers = ["scope", "subset", "search", "n (col/tab)", "col R@5", "col R@10", "col MRR", "col Full@10",
               "tab R@5", "tab R@10", "tab MRR", "no result", "errors", "median search"]
    rows, figures = [], []
    for s in scopes:
        for name, idx in subsets(questions):
            for (scope, engine_name), run in runs.items():
                if scope != s:
                    continue
                sc = score([questions[i] for i in idx], [run.hits[i] for i in idx])
                errors = sum(run.errors[i] is not None for i in idx)
                rows.append([s, name, engine_name, f"{sc['n_col']}/{sc['n_tab']}",
                             *(_f(sc["col"][k]) for k in ("R@5", "R@10", "MRR", "Full@10")),
                             *(_f(sc["tab"][k]) for k in ("R@5", "R@10", "MRR")),
                             str(sc["no_result"]), str(errors), env.median(run.seconds[i] for i in idx)])
                figures.append({"scope": s, "subset": name, "search": engine_name, **sc, "errors": errors})
    env.print_table(headers, rows, title=f"## schema linking: {args.questions.name} on {store.name}, "
                                         f"question only{' + evidence' if args.evidence else ''}, "
                                         f"max_results={args.max_results}")
    for (s, engine_name), run in runs.items():
        errs = [e for e in run.errors if e]
        if errs:
            print(f"[schema-linking] {engine_name} scope {s}: {len(errs)} errors, e.g. {errs[0]}", file=sys.stderr)
    if args.json:
        per_q = {f"{s}/{e}": [{"id": q.qid, "hits": [i for k, i in r if k == "column"][:10], "error": err}
                              for q, r, err in zip(questions, run.hits, run.errors, strict=True)]
                 for (s, e), run in runs.items()}
        args.json.write_text(json.dumps({"figures": figures, "questions": per_q}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
