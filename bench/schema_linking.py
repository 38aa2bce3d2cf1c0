"""Schema-linking benchmark: does search surface the columns and tables a question needs?

    python bench/schema_linking.py [--storage STORE | --make-store] [--questions FILE]
                                   [--scope db|all|both] [--limit N] [--max-results N] [--evidence]
                                   [--with-slayer] [--slayer-venv PATH] [--json OUT] [--with-memories]

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

``--with-memories`` measures memories as evidence. The questions' BIRD ``evidence`` strings become
memories (empty ones skipped, identical strings of one database kept once), each tagged with the
gold columns of the questions it came from, written with ``slayer_lsp.writer.memories.save_memory``
into copies of the store. A question must never find its own evidence, so the questions are split
into ``MEMORY_FOLDS`` folds by position and the questions of fold f are searched on a copy holding
the evidence of the other folds only (every database's; a memory whose tags map to no column is
skipped). Printed per scope and ranking, over the questions with gold columns:

* memory Hit@5 / R@5 from a memory-only search (``kinds: ["memory"]``, 5 results), over the
  questions for which the fold holds at least one relevant memory. A memory is *relevant* when
  its tags share a gold column with the question; R@5 = relevant memories in the top 5 divided by
  min(5, relevant memories available);
* column R@5 / R@10 on the store without memories and on the fold copies (whatever the ranking
  does with matching memories, e.g. the hybrid ranking's memory evidence);
* column R@5 +tags: recall of the top-5 column hits together with the tags of the top-5 memories
  (a set of 5 columns plus ``added`` more on average), i.e. what an agent reading the memories'
  tags would add;
* two reference rows for the memory side alone: ``rank_memories`` (``search/memory_ranking.py`` called
  directly: pieces, exact tokens, recency) and ``chance`` (the expected figures of 5 memories
  drawn at random from the scope).
"""

from __future__ import annotations

import argparse
import json
import math
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
            if ch == "." and (hit := self.columns.get((db, low[:i], low[i + 1 :]))):
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
            out.append(
                Question(
                    q["id"], db, text, source, list(dict.fromkeys(cols)), list(dict.fromkeys(tabs)), unmapped
                )
            )
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

    return {
        "n": len(questions),
        "n_col": len(col["MRR"]),
        "n_tab": len(tab["MRR"]),
        "no_result": empty,
        "col": {k: avg(v) for k, v in col.items()},
        "tab": {k: avg(v) for k, v in tab.items()},
    }


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
        print(
            f"[schema-linking] dense channel: {st.model}, {st.rows} vectors "
            f"({st.embedded} embedded now, {st.reused} reused) in {time.perf_counter() - t0:.1f} s",
            file=sys.stderr,
        )
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
    return Run(
        [[tuple(h) for h in r["hits"]] for r in rows], [r["error"] for r in rows], [r["s"] for r in rows]
    )


def _bench_env() -> dict[str, str]:
    """The converter's connection strings name ``${BENCH_DB_DIR}``; nothing connects to it."""
    return {"BENCH_DB_DIR": os.environ.get("BENCH_DB_DIR") or str(env.work_dir() / "schema-linking" / "db")}


# --------------------------------------------------------------------------- memories as evidence

MEMORY_FOLDS = 4


@dataclass
class EvidenceStore:
    path: Path
    tags: dict[str, set[str]]  # memory id -> gold columns (canonical) it is tagged with

    def scoped(self, datasource: str | None) -> list[str]:
        """The memories a datasource-scoped search may return (a tag rooted at it)."""
        if datasource is None:
            return list(self.tags)
        return [m for m, t in self.tags.items() if any(c.split(".", 1)[0] == datasource for c in t)]


def _piece_ranking(
    folds: list[EvidenceStore], questions: list[Question], gold: GoldMap, scope: str
) -> list[list[str]]:
    """Top-5 memory ids per question from ``search.memory_ranking.rank_memories`` (pieces, exact
    tokens, recency) on the question's fold store, scoped like the engine's search."""
    from slayer_lsp.catalog import load_catalog
    from slayer_lsp.search.memory_ranking import rank_memories
    from slayer_lsp.search.piece_index import MemoryPieceIndex

    out: list[list[str]] = [[] for _ in questions]
    for f, fs in enumerate(folds):
        cat = load_catalog(fs.path)
        index = MemoryPieceIndex.build(cat)
        for i in range(f, len(questions), MEMORY_FOLDS):
            q = questions[i]
            allowed = fs.scoped(gold.datasource.get(q.db, q.db) if scope == "db" else None)
            out[i] = [
                m.memory_id for m in rank_memories(cat, index, question=q.text, allowed=allowed, depth=5)
            ]
    return out


def evidence_items(
    path: Path, gold: GoldMap, limit: int | None, require_columns: bool = True
) -> list[tuple[int, str, str, list[str]]]:
    """(position, db, evidence, mapped gold columns) of each question with evidence (and, with
    ``require_columns``, a mapped gold column); positions count the questions as
    ``load_questions`` reads them."""
    out = []
    with open(path, encoding="utf-8") as fh:
        for pos, line in enumerate(ln for ln in fh if ln.strip()):
            if limit and pos >= limit:
                break
            q = json.loads(line)
            text = " ".join(str(q.get("evidence") or "").split())
            cols = [c for g in q.get("gold_columns") or [] if (c := gold.column(q["db_id"], g))]
            if text and (cols or not require_columns):
                out.append((pos, q["db_id"], text, cols))
    return out


def build_evidence_store(
    base: Path, dest: Path, items: list[tuple[int, str, str, list[str]]]
) -> EvidenceStore:
    """A copy of ``base`` holding one memory per distinct (database, evidence) string of ``items``."""
    from slayer_lsp.catalog import load_catalog
    from slayer_lsp.store.locate import locate
    from slayer_lsp.writer.memories import save_memory

    env.copy_store(base, dest)
    (dest / "memories").mkdir(exist_ok=True)
    merged: dict[tuple[str, str], set[str]] = {}
    for _, db, text, cols in items:
        merged.setdefault((db, text), set()).update(cols)
    location, catalog = locate(dest), load_catalog(dest)
    tags: dict[str, set[str]] = {}
    for (_, text), cols in merged.items():
        saved = save_memory(location, catalog, learning=text, entities=sorted(cols))
        tags[saved.id] = set(saved.entities)
    return EvidenceStore(dest, tags)


def memory_report(
    args: argparse.Namespace,
    store: Path,
    gold: GoldMap,
    questions: list[Question],
    scopes: tuple[str, ...],
    rankings: tuple[str, ...],
) -> list[dict[str, Any]]:
    items = evidence_items(args.questions, gold, args.limit)
    folds: list[EvidenceStore] = []
    t0 = time.perf_counter()
    for f in range(MEMORY_FOLDS):
        others = [it for it in items if it[0] % MEMORY_FOLDS != f]
        dest = env.work_dir() / "schema-linking" / f"store-memories-fold{f}"
        folds.append(build_evidence_store(store, dest, others))
    print(
        f"[schema-linking] {len(items)} evidence strings -> {MEMORY_FOLDS} fold stores of "
        f"{', '.join(str(len(fs.tags)) for fs in folds)} memories in {time.perf_counter() - t0:.1f} s",
        file=sys.stderr,
    )
    headers = [
        "scope",
        "subset",
        "ranking",
        "n (col/mem)",
        "mem Hit@5",
        "mem R@5",
        "col R@5 no mem",
        "col R@5 mem",
        "col R@10 no mem",
        "col R@10 mem",
        "col R@5 +tags",
        "added",
    ]
    rows, figures = [], []
    for s in scopes:
        for ranking in rankings:
            base_calls = [
                {
                    "question": q.text,
                    "datasource": gold.datasource.get(q.db, q.db) if s == "db" else None,
                    "max_results": args.max_results,
                    "ranking": ranking,
                }
                for q in questions
            ]
            plain = run_ours(store, base_calls)
            with_mem: list[list[tuple[str, str]]] = [[] for _ in questions]
            mem_hits: list[list[str]] = [[] for _ in questions]
            for f, fs in enumerate(folds):
                idx = [i for i in range(len(questions)) if i % MEMORY_FOLDS == f]
                run = run_ours(fs.path, [base_calls[i] for i in idx])
                mems = run_ours(
                    fs.path, [{**base_calls[i], "max_results": 5, "kinds": ["memory"]} for i in idx]
                )
                for j, i in enumerate(idx):
                    with_mem[i] = run.hits[j]
                    mem_hits[i] = [h for k, h in mems.hits[j] if k == "memory"][:5]
            for name, idx in subsets(questions):
                sel = [i for i in idx if questions[i].gold_columns]
                hit5, r5, plus, added = [], [], [], []
                for i in sel:
                    q, fs = questions[i], folds[i % MEMORY_FOLDS]
                    want = set(q.gold_columns)
                    relevant = {m for m, t in fs.tags.items() if t & want}
                    top = mem_hits[i]
                    if relevant:
                        got = sum(m in relevant for m in top)
                        hit5.append(float(got > 0))
                        r5.append(got / min(5, len(relevant)))
                    cols = list(dict.fromkeys(h for k, h in with_mem[i] if k == "column"))[:5]
                    extra = {t for m in top for t in fs.tags.get(m, ())} - set(cols)
                    added.append(len(extra))
                    plus.append(sum(g in set(cols) | extra for g in q.gold_columns) / len(q.gold_columns))
                sc_plain = score([questions[i] for i in sel], [plain.hits[i] for i in sel])
                sc_mem = score([questions[i] for i in sel], [with_mem[i] for i in sel])

                def avg(xs: list[float]) -> float | None:
                    return sum(xs) / len(xs) if xs else None

                row = {
                    "scope": s,
                    "subset": name,
                    "ranking": ranking,
                    "n_col": len(sel),
                    "n_mem": len(r5),
                    "mem_hit5": avg(hit5),
                    "mem_r5": avg(r5),
                    "col_r5_plain": sc_plain["col"]["R@5"],
                    "col_r5_mem": sc_mem["col"]["R@5"],
                    "col_r10_plain": sc_plain["col"]["R@10"],
                    "col_r10_mem": sc_mem["col"]["R@10"],
                    "col_r5_tags": avg(plus),
                    "added": avg(added),
                }
                figures.append(row)
                rows.append(
                    [
                        s,
                        name,
                        ranking,
                        f"{len(sel)}/{len(r5)}",
                        _f(row["mem_hit5"]),
                        _f(row["mem_r5"]),
                        _f(row["col_r5_plain"]),
                        _f(row["col_r5_mem"]),
                        _f(row["col_r10_plain"]),
                        _f(row["col_r10_mem"]),
                        _f(row["col_r5_tags"]),
                        "-" if row["added"] is None else f"{row['added']:.1f}",
                    ]
                )
        for name, idx in subsets(questions):  # the memory side alone: pieces, and chance
            sel = [i for i in idx if questions[i].gold_columns]
            for label, ranked in (
                ("rank_memories", _piece_ranking(folds, questions, gold, s)),
                ("chance", None),
            ):
                hit5, r5 = [], []
                for i in sel:
                    q, fs = questions[i], folds[i % MEMORY_FOLDS]
                    relevant = {m for m, t in fs.tags.items() if t & set(q.gold_columns)}
                    if not relevant:
                        continue
                    if ranked is None:  # expected figures of 5 memories drawn at random from the scope
                        pool = len(fs.scoped(gold.datasource.get(q.db, q.db) if s == "db" else None))
                        k = min(5, pool)
                        miss = math.comb(pool - len(relevant), k) / math.comb(pool, k) if pool else 1.0
                        hit5.append(1.0 - miss)
                        r5.append(k * len(relevant) / pool / min(5, len(relevant)) if pool else 0.0)
                    else:
                        got = sum(m in relevant for m in ranked[i][:5])
                        hit5.append(float(got > 0))
                        r5.append(got / min(5, len(relevant)))
                if not r5:  # no question of the subset has a relevant memory (spider: no evidence)
                    continue
                avg5, avgr = sum(hit5) / len(hit5), sum(r5) / len(r5)
                figures.append(
                    {
                        "scope": s,
                        "subset": name,
                        "ranking": label,
                        "n_mem": len(r5),
                        "mem_hit5": avg5,
                        "mem_r5": avgr,
                    }
                )
                rows.append(
                    [
                        s,
                        name,
                        label,
                        f"{len(sel)}/{len(r5)}",
                        _f(avg5),
                        _f(avgr),
                        *(["-"] * (len(headers) - 6)),
                    ]
                )
    env.print_table(
        headers,
        rows,
        title=f"## memories as evidence: other questions' evidence in "
        f"{MEMORY_FOLDS} folds, max_results={args.max_results}",
    )
    return figures


# --------------------------------------------------------------------------- ablation

# Each step of the hybrid ranking, as the module constants that switch it off.
ABLATIONS = {
    "names": {"W_NAME": 0.0, "W_TABLE_NAME": 0.0},
    "values": {"W_VALUE": 0.0},
    "shapes": {"W_SHAPE": 0.0},
    "routing": {"W_TABLE": 0.0, "W_DATASOURCE": 0.0},
    "joins": {"JOIN_TABLES": 0},
    "memory-evidence": {"W_MEMORY_EVIDENCE": 0.0},
}


def ablate(parts: str) -> None:
    from slayer_lsp.search import hybrid

    for part in filter(None, (p.strip() for p in parts.split(","))):
        if part not in ABLATIONS:
            raise SystemExit(f"--ablate: unknown part {part!r}; known: {', '.join(ABLATIONS)}")
        for name, value in ABLATIONS[part].items():
            setattr(hybrid, name, value)


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
    ap.add_argument(
        "--storage",
        type=Path,
        default=None,
        help="SLayer YAML store made by catalog_to_slayer.py (default: made under bench/.work/)",
    )
    ap.add_argument(
        "--make-store",
        action="store_true",
        help="(re)make the store from --catalog (into --storage, or the default place)",
    )
    ap.add_argument("--catalog", type=Path, default=DEFAULT_CATALOG, help="catalog for --make-store")
    ap.add_argument("--questions", type=Path, default=DEFAULT_QUESTIONS, help="questions JSONL")
    ap.add_argument("--scope", choices=("db", "all", "both"), default="all")
    ap.add_argument("--limit", type=int, default=None, help="first N questions only")
    ap.add_argument("--max-results", type=int, default=50)
    ap.add_argument("--evidence", action="store_true", help="append BIRD's evidence to the question")
    ap.add_argument("--with-slayer", action="store_true", help="also run motley-slayer on the same store")
    ap.add_argument(
        "--dense",
        action="store_true",
        help="add channel 3 (the offline embedding model; embeds the store's missing vectors first)",
    )
    ap.add_argument(
        "--ablate",
        default="",
        metavar="PARTS",
        help="comma-separated parts of the hybrid ranking to switch off (measure each step): "
        + ", ".join(ABLATIONS),
    )
    ap.add_argument(
        "--ranking",
        choices=("hybrid", "slayer", "both"),
        default="hybrid",
        help="our ranking: hybrid (the default) or slayer (SLayer's RRF pipeline), or both",
    )
    ap.add_argument("--json", type=Path, default=None, help="write figures and per-question ranks here")
    ap.add_argument(
        "--with-memories",
        action="store_true",
        help="also measure memories made from other questions' evidence (see the module doc)",
    )
    env.add_venv_option(ap)
    args = ap.parse_args(argv)

    os.environ.update(_bench_env())
    ablate(args.ablate)
    store = args.storage or default_store()
    if args.make_store or (args.storage is None and not (store / "datasources").is_dir()):
        make_store(args.catalog, store)
    if not store.exists():
        ap.error(f"store {store} does not exist (pass --make-store to create it)")
    gold = GoldMap.from_store(store)
    questions = load_questions(args.questions, gold, args.limit, args.evidence)
    missing_db = sorted({q.db for q in questions if q.db not in gold.datasource})
    unmapped = sum(q.unmapped for q in questions)
    print(
        f"[schema-linking] {len(questions)} questions, {len(gold.datasource)} datasources, "
        f"{len(gold.tables)} tables, {len(gold.columns)} columns; unmapped gold names: {unmapped}"
        + (f"; databases missing from the store: {missing_db}" if missing_db else ""),
        file=sys.stderr,
    )

    scopes = ("db", "all") if args.scope == "both" else (args.scope,)
    calls_by_scope = {
        s: [
            {
                "question": q.text,
                "datasource": gold.datasource.get(q.db, q.db) if s == "db" else None,
                "max_results": args.max_results,
            }
            for q in questions
        ]
        for s in scopes
    }
    runs: dict[tuple[str, str], Run] = {}
    rankings = ("hybrid", "slayer") if args.ranking == "both" else (args.ranking,)
    for s in scopes:
        for ranking in rankings:
            print(f"[schema-linking] ours ({ranking}), scope {s} ...", file=sys.stderr)
            name = f"slayer-lsp {ranking}" + (" +dense" if args.dense else "")
            runs[(s, name)] = run_ours(
                store, [{**c, "ranking": ranking} for c in calls_by_scope[s]], dense=args.dense
            )
    if args.with_slayer:
        # One SLayer process for every scope: the searches of all scopes in one batch.
        print(
            f"[schema-linking] SLayer, {len(scopes) * len(questions)} searches in one process ...",
            file=sys.stderr,
        )
        batch = [c for s in scopes for c in calls_by_scope[s]]
        theirs = run_slayer(store, batch, args.slayer_venv)
        n = len(questions)
        for i, s in enumerate(scopes):
            part = slice(i * n, (i + 1) * n)
            runs[(s, "SLayer 1.4.1")] = Run(theirs.hits[part], theirs.errors[part], theirs.seconds[part])

    headers = [
        "scope",
        "subset",
        "search",
        "n (col/tab)",
        "col R@5",
        "col R@10",
        "col MRR",
        "col Full@10",
        "tab R@5",
        "tab R@10",
        "tab MRR",
        "no result",
        "errors",
        "median search",
    ]
    rows, figures = [], []
    for s in scopes:
        for name, idx in subsets(questions):
            for (scope, engine_name), run in runs.items():
                if scope != s:
                    continue
                sc = score([questions[i] for i in idx], [run.hits[i] for i in idx])
                errors = sum(run.errors[i] is not None for i in idx)
                rows.append(
                    [
                        s,
                        name,
                        engine_name,
                        f"{sc['n_col']}/{sc['n_tab']}",
                        *(_f(sc["col"][k]) for k in ("R@5", "R@10", "MRR", "Full@10")),
                        *(_f(sc["tab"][k]) for k in ("R@5", "R@10", "MRR")),
                        str(sc["no_result"]),
                        str(errors),
                        env.median(run.seconds[i] for i in idx),
                    ]
                )
                figures.append({"scope": s, "subset": name, "search": engine_name, **sc, "errors": errors})
    env.print_table(
        headers,
        rows,
        title=f"## schema linking: {args.questions.name} on {store.name}, "
        f"question only{' + evidence' if args.evidence else ''}, "
        f"max_results={args.max_results}",
    )
    for (s, engine_name), run in runs.items():
        errs = [e for e in run.errors if e]
        if errs:
            print(
                f"[schema-linking] {engine_name} scope {s}: {len(errs)} errors, e.g. {errs[0]}",
                file=sys.stderr,
            )
    memory_figures = (
        memory_report(args, store, gold, questions, scopes, rankings) if args.with_memories else []
    )
    if args.json:
        per_q = {
            f"{s}/{e}": [
                {"id": q.qid, "hits": [i for k, i in r if k == "column"][:10], "error": err}
                for q, r, err in zip(questions, run.hits, run.errors, strict=True)
            ]
            for (s, e), run in runs.items()
        }
        args.json.write_text(
            json.dumps({"figures": figures, "memory_figures": memory_figures, "questions": per_q}, indent=2)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
