"""Memory search through ``Engine.search`` — pieces, exact tokens, recency, links, narrowing — each
on a small YAML store of its own (the module-level behaviour is in ``test_memory_search.py``; this
file proves it survives the hybrid ranking and the request surface)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import msgspec
import pytest
import yaml

from slayer_lsp.engine import Engine
from slayer_lsp.search.types import MAX_RELATED_HOPS, SearchError, SearchHit


def _col(name: str, type_: str = "TEXT", pk: bool = False) -> dict:
    return {"name": name, "sql": name, "type": type_, "primary_key": pk}


MODELS = {
    "customers": {
        "description": "Shop customers",
        "columns": [_col("id", "INT", True), _col("name"), _col("city")],
    },
    "orders": {
        "description": "Orders placed by customers",
        "columns": [
            _col("id", "INT", True),
            _col("customer_id", "INT"),
            _col("status"),
            _col("amount", "REAL"),
        ],
        "joins": [{"target_model": "customers", "join_pairs": [["customer_id", "id"]]}],
    },
    "products": {
        "description": "Products in the catalogue",
        "columns": [_col("sku", pk=True), _col("title"), _col("weight", "REAL")],
    },
}


@dataclass(frozen=True)
class Mem:
    learning: str
    tags: tuple[str, ...] = ()
    days_ago: float = 30.0
    description: str | None = None


def write_store(root: Path, memories: dict[str, Mem]) -> Path:
    """One datasource ``shop`` with three models, and the given memories (``memories/<id>.md``:
    YAML front matter, then the learning). Ages are relative to today, as the ranking measures them."""
    (root / "datasources").mkdir(parents=True)
    (root / "datasources" / "shop.yaml").write_text(
        yaml.safe_dump({"name": "shop", "type": "sqlite", "connection_string": "sqlite:///shop.db"})
    )
    (root / "models" / "shop").mkdir(parents=True)
    for name, spec in MODELS.items():
        doc = {"name": name, "sql_table": name, "data_source": "shop", **spec}
        (root / "models" / "shop" / f"{name}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    (root / "memories").mkdir()
    now = datetime.now(UTC)
    for mid, mem in memories.items():
        front = {
            "created_at": (now - timedelta(days=mem.days_ago)).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "entities": list(mem.tags),
            "version": 4,
        }
        if mem.description:
            front["description"] = mem.description
        (root / "memories" / f"{mid}.md").write_text(f"---\n{yaml.safe_dump(front)}---\n{mem.learning}")
    return root


@pytest.fixture()
def engine_for(tmp_path) -> Callable[[dict[str, Mem]], Engine]:
    engines: list[Engine] = []

    def make(memories: dict[str, Mem]) -> Engine:
        eng = Engine(write_store(tmp_path / f"store{len(engines)}", memories), use_cache=False, graph=False)
        assert not eng.catalog.issues, eng.catalog.issues
        engines.append(eng)
        return eng

    yield make
    for eng in engines:
        eng.close()


def search(eng: Engine, **params) -> list[SearchHit]:  # noqa: ANN003
    return eng.search(params).results


def memory_ids(eng: Engine, **params) -> list[str]:  # noqa: ANN003
    return [h.id for h in search(eng, **params) if h.kind == "memory"]


FILLER = " ".join(
    f"The {w} rota is pinned by the kitchen door."
    for w in ("weather", "parking", "lunch", "holiday", "printer", "coffee", "desk", "lamp")
)
REFUNDS = (
    "Refunds under ten pounds are approved by the shift lead. Refunds over ten pounds need the manager. "
    "Refunds to gift cards are handled by finance."
)
LONG = Mem(
    f"{FILLER} Packaging supplier: Boxco in Leeds. {REFUNDS} {FILLER}",
    description="Everything the back office told the new starter",
)


# --------------------------------------------------------------------------- (a) pieces


def test_one_matching_sentence_finds_a_long_memory_and_returns_it_whole(engine_for):
    eng = engine_for({"long": LONG, "short": Mem("A supplier of chairs was late once with packaging.")})
    q = "which packaging supplier?"
    assert memory_ids(eng, question=q) == ["long", "short"]
    # ranked as whole memories (SLayer's pipeline), the sentence is diluted by the rest of the note
    assert memory_ids(eng, question=q, ranking="slayer") == ["short", "long"]

    full = {h.id: h for h in search(eng, question=q, compact=False) if h.kind == "memory"}
    whole = {h.id: h for h in search(eng, question=q, compact=False, ranking="slayer") if h.kind == "memory"}
    hit = full["long"]
    assert hit.text == whole["long"].text == f"{LONG.learning}\n{LONG.description}"  # never the piece
    assert hit.description == LONG.description
    compact = next(h for h in search(eng, question=q) if h.id == "long")
    assert compact.text == "" and compact.description == LONG.description


def test_one_hit_per_memory_however_many_pieces_matched(engine_for):
    eng = engine_for({"long": LONG, "once": Mem("A refund was once approved twice by mistake.")})
    hits = search(eng, question="who approves refunds and refunds over ten pounds?", max_results=50)
    ids = [(h.kind, h.id) for h in hits]
    assert len(ids) == len(set(ids))
    assert [h.id for h in hits if h.kind == "memory"] == ["long", "once"]  # three refund pieces, one hit


# --------------------------------------------------------------------------- (b) exact tokens


PACKAGING = {
    "words": Mem("We sorted out the packaging fault on the outer carton with the supplier."),
    "words2": Mem("Another packaging fault: the outer carton tore and we sorted out a refund."),
    "code": Mem("PROD-4471 shipped in a weak box.", days_ago=400),
}


def test_a_product_code_in_the_question_finds_its_memory_first(engine_for):
    eng = engine_for(PACKAGING)
    hits = search(eng, question="did we sort out the packaging fault on PROD-4471?")
    assert (hits[0].kind, hits[0].id) == ("memory", "code")
    # without the code the shared words decide: both word matches come before the code's memory
    assert memory_ids(eng, question="did we sort out the packaging fault?")[:2] == ["words", "words2"]


INVOICES = {
    "plain": Mem("Unpaid invoices are chased by the accounts team."),
    "year": Mem("Unpaid invoices from 2023 are chased by the accounts team."),
    "code": Mem("Unpaid invoices INV-2023 are chased by the accounts team."),
}


def _lead_margin(eng: Engine, question: str) -> tuple[str, float]:
    hits = search(eng, question=question, kinds=["memory"])
    return hits[0].id, hits[0].score - hits[1].score


def test_an_ordinary_question_gets_no_token_boost(engine_for):
    eng = engine_for(INVOICES)
    coded, coded_margin = _lead_margin(eng, "who chases unpaid invoice INV-2023?")
    dated, dated_margin = _lead_margin(eng, "who chases unpaid invoices from 2023?")  # a year is no token
    plain, plain_margin = _lead_margin(eng, "who chases unpaid invoices?")
    assert (coded, dated, plain) == ("code", "year", "plain")
    # the code is matched whole and weighted heavily; the year wins by its word alone, as any word would
    # (margins are evidence on the entities' scale: an exact token adds W_TOKEN, a word a share of it)
    assert dated_margin * 3 < coded_margin and plain_margin * 3 < coded_margin
    # the others follow the code by their words alone ("2023" is a word of INV-2023 as much as of the year)
    assert sorted(memory_ids(eng, question="who chases unpaid invoice INV-2023?")[1:]) == ["plain", "year"]


@pytest.mark.parametrize("asked, keyword", [("SKU-9911", "SKU-5522"), ("SKU-5522", "SKU-9911")])
def test_keyword_is_trusted_less_than_an_extracted_token(engine_for, asked, keyword):
    eng = engine_for({"a": Mem("Cartons split open: SKU-9911."), "b": Mem("Cartons split open: SKU-5522.")})
    holder = {"SKU-9911": "a", "SKU-5522": "b"}
    ranked = search(eng, question=f"cartons split open for {asked}?", keyword=keyword, kinds=["memory"])
    assert [h.id for h in ranked] == [holder[asked], holder[keyword]]
    # the keyword still counts: alone with the words, it decides between two equal memories
    assert memory_ids(eng, question="cartons split open?", keyword=keyword) == [
        holder[keyword],
        holder[asked],
    ]


# --------------------------------------------------------------------------- (c) recency


@pytest.mark.parametrize("newer", ["card", "transfer"])
def test_equally_good_memories_newer_first(engine_for, newer):
    older = "transfer" if newer == "card" else "card"
    eng = engine_for(
        {
            "card": Mem("They settle invoices by card.", days_ago=7 if newer == "card" else 365),
            "transfer": Mem("They settle invoices by transfer.", days_ago=7 if newer == "transfer" else 365),
        }
    )
    hits = search(eng, question="how do they settle invoices?", kinds=["memory"])
    assert [h.id for h in hits] == [newer, older] and hits[0].score > hits[1].score


def test_a_much_better_old_match_beats_a_barely_relevant_new_one(engine_for):
    eng = engine_for(
        {
            "old": Mem("Urgent credit notes are signed off by the finance director.", days_ago=3650),
            "new": Mem("The office keeps a credit card for stationery.", days_ago=1),
        }
    )
    assert memory_ids(eng, question="who signs off an urgent credit note?") == ["old", "new"]


# --------------------------------------------------------------------------- (d) links


SISTER = {
    # the customer's own memory matches only loosely; the sister company's is word for word (and its
    # code is an exact token), three sentences of it
    "cust": Mem("They pay by card.", tags=("shop.customers", "memory:sister"), days_ago=900),
    "sister": Mem(
        "Urgent credit for ACME-77 is signed off by the regional manager. Urgent credit needs a "
        "signature. Urgent credit sign off happens daily.",
        days_ago=1,
    ),
    "hop2": Mem("Lunch menu notes.", tags=("memory:sister",)),  # links point either way
    "hop3": Mem("Printer toner notes.", tags=("memory:hop2",)),
    "hop4": Mem("Desk lamp notes.", tags=("memory:hop3",)),
    "noise": Mem("The parking lot is closed on Sundays."),
}
URGENT = "who signs off urgent credit for ACME-77?"


def test_the_named_records_memory_leads_and_the_linked_one_follows_marked(engine_for):
    eng = engine_for(SISTER)
    hits = search(eng, question=URGENT, entities=["shop.customers"], related=1)
    assert [(h.kind, h.id) for h in hits[:3]] == [
        ("model", "shop.customers"),
        ("memory", "cust"),
        ("memory", "sister"),
    ]
    cust, sister = hits[1], hits[2]
    assert sister.via == "memory:cust" and "via" not in _wire(cust)
    assert [h.id for h in hits].count("sister") == 1  # three matching sentences, one hit
    assert "hop2" not in [h.id for h in hits]  # one hop
    assert all(a.score >= b.score for a, b in zip(hits, hits[1:], strict=False))
    # nobody named: the word-for-word match leads, and the customer's memory is what it linked to
    unnamed = search(eng, question=URGENT, related=1, kinds=["memory"])
    assert unnamed[0].id == "sister" and "via" not in _wire(unnamed[0])
    # no hops: nothing is marked, and the named record still leads
    plain = search(eng, question=URGENT, entities=["shop.customers"], kinds=["memory"])
    assert plain[0].id == "cust" and all("via" not in _wire(h) for h in plain)


def _wire(hit: SearchHit) -> dict:
    return msgspec.to_builtins(hit)


@pytest.mark.parametrize(
    "related, reached",
    [
        (1, ["sister"]),
        (2, ["sister", "hop2"]),
        (3, ["sister", "hop2", "hop3"]),
        (MAX_RELATED_HOPS + 5, ["sister", "hop2", "hop3"]),  # above the cap: bounded, not refused
    ],
)
def test_hops_are_bounded(engine_for, related, reached):
    eng = engine_for(SISTER)
    hits = search(eng, entities=["shop.customers"], related=related, kinds=["memory"])
    assert [h.id for h in hits] == ["cust", *reached]
    vias = {h.id: h.via for h in hits[1:]}
    assert vias == {
        k: v
        for k, v in {"sister": "memory:cust", "hop2": "memory:sister", "hop3": "memory:hop2"}.items()
        if k in reached
    }


# --------------------------------------------------------------------------- (e) narrowing


def test_kinds_min_score_and_limit(engine_for):
    eng = engine_for({**PACKAGING, "long": LONG})
    q = "did the packaging supplier sort out the carton fault on PROD-4471?"
    full = search(eng, question=q, max_results=50)
    kinds = {h.kind for h in full}
    assert "memory" in kinds and kinds - {"memory"}

    only = search(eng, question=q, kinds=["memory"], max_results=50)
    assert [(h.id, h.score) for h in only] == [(h.id, h.score) for h in full if h.kind == "memory"]
    without = search(eng, question=q, kinds=["model", "column"], max_results=50)
    assert without and all(h.kind in ("model", "column") for h in without)

    floor = full[2].score
    cut = search(eng, question=q, min_score=floor, max_results=50)
    assert [h.id for h in cut] == [h.id for h in full if h.score >= floor] and len(cut) >= 3
    assert search(eng, question=q, min_score=full[0].score + 1) == []

    assert [h.id for h in search(eng, question=q, limit=2)] == [h.id for h in full[:2]]
    assert len(search(eng, question=q, limit=3, max_results=1)) == 3  # limit wins
    assert [h.id for h in search(eng, question=q, kinds=["memory"], limit=1)] == [only[0].id]


# --------------------------------------------------------------------------- (f) SLayer's surface


@pytest.mark.parametrize(
    "extra, named",
    [
        ({"related": 1}, "related"),
        ({"keyword": "PROD-4471"}, "keyword"),
        ({"keyword": "PROD-4471", "related": 2}, "keyword, related"),
    ],
)
def test_slayer_ranking_refuses_what_it_does_not_know(engine_for, extra, named):
    eng = engine_for(PACKAGING)
    with pytest.raises(
        SearchError, match=f"^{named} need ranking 'hybrid'; ranking 'slayer' is SLayer's surface"
    ):
        eng.search({"question": "packaging fault", "ranking": "slayer", **extra})
    assert eng.search({"question": "packaging fault", "ranking": "slayer", "related": 0}).results


def test_a_keyword_alone_ranks_by_the_keyword(engine_for):
    eng = engine_for(
        {
            "a": Mem("Cartons split open: SKU-9911.", days_ago=300),
            "b": Mem("Cartons split open: SKU-5522.", days_ago=1),
        }
    )
    assert memory_ids(eng, keyword="SKU-9911")[0] == "a"
