"""The hybrid ranking's evidence, each on a small store of our own: a named value lifts its column,
a split name meets its words, join keys come with their tables, the question is routed to its
database, memories lend evidence to what they are tagged with, and the narrowing parameters."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from slayer_lsp.engine import Engine
from slayer_lsp.search import name_stems, sampled_values
from slayer_lsp.search.types import SearchError


def _col(name, type_="TEXT", description=None, values_=None, pk=False):  # noqa: ANN001, ANN202
    col = {"name": name, "sql": name, "type": type_, "primary_key": pk}
    if description:
        col["description"] = description
    if values_:
        col["sampled_values"] = list(values_)
    return col


MODELS = {
    ("schools", "frpm"): dict(
        description="Free and reduced-price meal figures per school",
        columns=[
            _col("CDSCode", pk=True),
            _col("FreeMealCount", "INT", "Free meal count"),
            _col("AcademicYear", "TEXT", values_=["2014-2015"]),
        ],
        joins=[{"target_model": "schools", "join_pairs": [["CDSCode", "CDSCode"]]}],
    ),
    ("schools", "schools"): dict(
        description="Schools and their locations",
        columns=[
            _col("CDSCode", pk=True),
            _col("County", values_=["Alameda", "Fresno", "Los Angeles"]),
            _col("Phone"),
            _col("OpenDate", "DATE"),
        ],
    ),
    ("schools", "satscores"): dict(
        description="SAT results",
        columns=[
            _col("cds", pk=True),
            _col("AvgScrMath", "INT"),
            _col("AvgScrRead", "INT"),
            _col("NumTstTakr", "INT"),
        ],
        joins=[{"target_model": "schools", "join_pairs": [["cds", "CDSCode"]]}],
    ),
    ("cards", "customers"): dict(
        description="Card customers",
        columns=[
            _col("CustomerID", "INT", pk=True),
            _col("Segment", values_=["SME", "LAM", "KAM"]),
            _col("Currency", values_=["EUR", "CZK"]),
        ],
    ),
    ("cards", "transactions"): dict(
        description="Card transactions",
        columns=[
            _col("TransactionID", "INT", pk=True),
            _col("CustomerID", "INT"),
            _col("Amount", "INT"),
            _col("Price", "REAL", "price paid"),
            _col("County", "TEXT", "county of the gas station"),
        ],
        joins=[{"target_model": "customers", "join_pairs": [["CustomerID", "CustomerID"]]}],
    ),
}

MEMORIES = {
    "7": (
        "Eligibility: a school counts as high-need when its free meal share is above 60 percent.",
        ["schools.frpm.FreeMealCount"],
    ),
}


def write_store(root: Path) -> Path:
    for ds in {ds for ds, _ in MODELS}:
        (root / "datasources").mkdir(parents=True, exist_ok=True)
        (root / "datasources" / f"{ds}.yaml").write_text(
            yaml.safe_dump({"name": ds, "type": "sqlite", "connection_string": f"sqlite:///{ds}.db"})
        )
    for (ds, name), spec in MODELS.items():
        folder = root / "models" / ds
        folder.mkdir(parents=True, exist_ok=True)
        doc = {"name": name, "sql_table": name, "data_source": ds, **spec}
        (folder / f"{name}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    (root / "memories").mkdir(exist_ok=True)
    for mid, (text, tags) in MEMORIES.items():
        front = yaml.safe_dump({"created_at": "2026-01-01T00:00:00Z", "entities": tags, "version": 4})
        (root / "memories" / f"{mid}.md").write_text(f"---\n{front}---\n{text}")
    return root


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    eng = Engine(write_store(tmp_path_factory.mktemp("hybrid") / "store"), use_cache=False, graph=False)
    assert not eng.catalog.issues, eng.catalog.issues
    yield eng
    eng.close()


def columns(engine: Engine, question: str, **params) -> list[str]:  # noqa: ANN003
    resp = engine.search({"question": question, "max_results": 50, **params})
    return [h.id for h in resp.results if h.kind == "column"]


# --------------------------------------------------------------------------- the pieces


@pytest.mark.parametrize(
    "name, split",
    [
        ("AvgScrMath", "Avg Scr Math"),
        ("home_player_Y11", "home player Y 11"),
        ("NumGE1500", "Num GE 1500"),
        ("CDSCode", "CDS Code"),
        ("buildUpPlaySpeed", "build Up Play Speed"),
        ("plain", "plain"),
    ],
)
def test_identifiers_split_as_read(name, split):
    assert name_stems.split_identifier(name) == split


def test_abbreviations_expand_from_the_entitys_own_prose():
    got = name_stems.name_stems("AvgScrMath", None, "Average score in Math")
    assert {"averag", "score", "math"} <= set(got)
    assert "score" not in name_stems.name_stems("AvgScrMath", None, None)  # nothing to expand from


@pytest.mark.parametrize(
    "question, shapes",
    [
        ("schools opened in 1995", {"date"}),
        ("books by Rosa Dubois", {"proper"}),
        ("How many schools are there?", set()),
        ("Alameda schools", set()),  # one capitalised word at the start
    ],
)
def test_question_shapes(question, shapes):
    assert sampled_values.question_shapes(question) == shapes


# --------------------------------------------------------------------------- through search


def test_a_named_value_lifts_its_column(engine):
    cols = columns(engine, "How many customers are in LAM?")
    assert cols[0] == "cards.customers.Segment"


def test_a_multi_word_value_lifts_its_column(engine):
    assert (
        columns(engine, "phone numbers of schools in Los Angeles")[:2]
        == ["schools.schools.Phone", "schools.schools.County"]
        or columns(engine, "phone numbers of schools in Los Angeles")[0] == "schools.schools.County"
    )


def test_a_split_name_meets_its_words(engine):
    cols = columns(engine, "average math score")
    assert cols[0] == "schools.satscores.AvgScrMath"
    assert "schools.satscores.AvgScrMath" not in columns(engine, "average math score", ranking="slayer")


def test_join_keys_come_with_their_tables(engine):
    cols = columns(engine, "free meal count of schools in Alameda county")
    top = cols[:10]
    assert {"schools.frpm.FreeMealCount", "schools.schools.County"} <= set(top)
    assert {"schools.frpm.CDSCode", "schools.schools.CDSCode"} <= set(top)
    assert top.index("schools.frpm.FreeMealCount") < top.index("schools.frpm.CDSCode")


def test_the_question_is_routed_to_its_database(engine):
    # "County" exists in both datasources; the school words route to the schools database
    cols = columns(engine, "county of the school with the highest free meal count")
    assert cols.index("schools.schools.County") < cols.index("cards.transactions.County")


def test_memory_evidence_lifts_what_it_is_tagged_with(engine):
    resp = engine.search({"question": "which schools are high-need?", "max_results": 10})
    ids = [h.id for h in resp.results]
    assert "7" in ids and "schools.frpm.FreeMealCount" in ids
    assert "schools.frpm.FreeMealCount" not in [
        h.id
        for h in engine.search(
            {"question": "which schools are high-need?", "max_results": 10, "ranking": "slayer"}
        ).results
    ]


def test_scores_are_ordered_and_narrowing_applies(engine):
    resp = engine.search({"question": "free meal count of schools", "max_results": 20})
    scores = [h.score for h in resp.results]
    assert scores == sorted(scores, reverse=True)
    only = engine.search({"question": "free meal count of schools", "kinds": ["model"], "limit": 2})
    assert [h.kind for h in only.results] == ["model", "model"]
    cut = engine.search({"question": "free meal count of schools", "min_score": scores[2]})
    assert [h.id for h in cut.results] == [h.id for h in resp.results if h.score >= scores[2]][:10]


def test_named_entities_lead(engine):
    resp = engine.search({"question": "free meal count", "entities": ["cards.customers.Currency"]})
    assert resp.results[0].id == "cards.customers.Currency"


@pytest.mark.parametrize(
    "params, message",
    [
        ({"question": "x", "kinds": ["table"]}, "unknown kinds"),
        ({"question": "x", "ranking": "slayer", "keyword": "x"}, "need ranking 'hybrid'"),
        ({"question": "x", "related": -1}, "related must be >= 0"),
        ({"question": "x", "limit": 0}, "max_results must be >= 1"),
    ],
)
def test_bad_narrowing_is_refused_clearly(engine, params, message):
    with pytest.raises(SearchError, match=message):
        engine.search(params)


def test_edits_reach_the_lexicon(tmp_path):
    store = write_store(tmp_path / "store")
    eng = Engine(store, use_cache=False, graph=False)
    assert columns(eng, "customers in MIDMARKET")[0] != "cards.customers.Currency"
    path = store / "models" / "cards" / "customers.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["columns"][2]["sampled_values"] = ["EUR", "MIDMARKET"]
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    eng.refresh()
    assert columns(eng, "customers in MIDMARKET")[0] == "cards.customers.Currency"
    eng.close()


def test_a_facet_ranks_that_facet_alone(engine):
    by_values = engine.search({"question": "Fresno", "facet": "values", "kinds": ["column"]})
    assert [h.id for h in by_values.results][:1] == ["schools.schools.County"]
    assert all(h.kind == "column" for h in by_values.results)
    by_meaning = engine.search({"question": "Fresno", "facet": "meaning"})
    assert "schools.schools.County" not in [
        h.id for h in by_meaning.results
    ]  # no name or description says it
    with pytest.raises(SearchError, match="unknown facet"):
        engine.search({"question": "x", "facet": "colour"})
    with pytest.raises(SearchError, match="need ranking 'hybrid'"):
        engine.search({"question": "x", "facet": "values", "ranking": "slayer"})


@pytest.mark.slow
def test_answers_do_not_depend_on_the_hash_seed(tmp_path):
    """Sets iterate in a per-process order; no score or order may follow it."""
    import subprocess
    import sys

    store = write_store(tmp_path / "store")
    script = (
        "import json, sys\n"
        "from slayer_lsp.engine import Engine\n"
        "e = Engine(sys.argv[1], use_cache=False, graph=False)\n"
        "qs = ['free meal count of schools in Alameda county', 'customers in LAM', 'average math score',\n"
        "      'which schools are high-need?', 'county', 'price paid by card customers']\n"
        "print(json.dumps([[(h.kind, h.id, h.score) for h in e.search({'question': q, 'max_results': 40}).results]\n"
        "                  for q in qs]))\n"
    )
    outs = set()
    for seed in ("0", "1", "2"):
        run = subprocess.run(
            [sys.executable, "-c", script, str(store)],
            capture_output=True,
            text=True,
            env={**__import__("os").environ, "PYTHONHASHSEED": seed},
            timeout=120,
        )
        assert run.returncode == 0, run.stderr
        outs.add(run.stdout)
    assert len(outs) == 1
