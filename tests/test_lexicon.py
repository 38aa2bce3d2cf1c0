"""The lexicon's name scores: array arithmetic that must give exactly the sums of the plain definition
(idf of each shared stem, added stem by stem, damped by the name's length; the best ``limit``, ties to
the larger id), on every generation, old ones included."""

from __future__ import annotations

import heapq
import math
import random
import shutil
from pathlib import Path

import yaml

from slayer_lsp.catalog import Catalog, Delta
from slayer_lsp.search import name_stems
from slayer_lsp.search.lexicon import MAX_POSTINGS, Lexicon
from slayer_lsp.store.reader import read_store

REPO = Path(__file__).resolve().parents[1]
SHOP = REPO / "examples" / "shop" / "store"


def reference(lexicon: Lexicon, question_stems: list[str], limit: int) -> list[tuple[str, float]]:
    by_stem: dict[str, set[str]] = {}
    for cid, stems in lexicon.stems.items():
        for stem in stems:
            by_stem.setdefault(stem, set()).add(cid)
    n = max(len(lexicon.stems), 1)
    scores: dict[str, float] = {}
    for stem in sorted(set(question_stems)):
        ids = by_stem.get(stem)
        if not ids or len(ids) > MAX_POSTINGS:
            continue
        idf = math.log(1 + (n - len(ids) + 0.5) / (len(ids) + 0.5))
        for cid in ids:
            scores[cid] = scores.get(cid, 0.0) + idf
    damped = [(cid, s / (1 + 0.1 * len(lexicon.stems[cid]))) for cid, s in scores.items()]
    return heapq.nlargest(limit, damped, key=lambda kv: (kv[1], kv[0]))


def questions(lexicon: Lexicon, rng: random.Random, k: int = 40) -> list[list[str]]:
    vocabulary = sorted({s for stems in lexicon.stems.values() for s in stems})
    return [
        rng.sample(vocabulary, min(len(vocabulary), rng.randint(1, 6))) + ["nosuchstem"] for _ in range(k)
    ]


def check(lexicon: Lexicon, rng: random.Random) -> None:
    for q in questions(lexicon, rng):
        for limit in (3, 10, 200):
            got = list(lexicon.name_scores(q, limit=limit).items())
            assert got == reference(lexicon, q, limit), (q, limit)
            # unordered: the same names and scores
            assert lexicon.name_scores(q, limit=limit, ordered=False) == dict(got), (q, limit)


def _edit(store: Path, step: int) -> None:
    """Rename a column, add one, drop a model: names that join and leave postings."""
    models = sorted((store / "models").rglob("*.yaml"))
    doc = yaml.safe_load(models[step % len(models)].read_text())
    cols = doc.get("columns") or []
    if cols:
        cols[0]["name"] = f"renamed_total_{step}"
    cols.append({"name": f"order_total_amount_{step}", "type": "number"})
    doc["columns"] = cols
    models[step % len(models)].write_text(yaml.safe_dump(doc))
    if step == 2:
        models[-1].unlink()


def test_name_scores_equal_the_plain_definition_on_every_generation(tmp_path):
    store = tmp_path / "store"
    shutil.copytree(SHOP, store)
    rng = random.Random(5)
    catalog = Catalog.from_read(read_store(store))
    lexicon = Lexicon.build(catalog)
    generations = [lexicon]
    check(lexicon, rng)
    for step in range(4):
        _edit(store, step)
        catalog, delta = catalog.derive(read_store(store))
        lexicon = lexicon.apply(catalog, delta)
        generations.append(lexicon)
        check(lexicon, rng)
    first = generations[0]
    q = name_stems.stems("order total amount of the customer")
    assert list(first.name_scores(q).items()) == reference(first, q, 200)  # an old generation is as it was


def test_equal_names_and_value_shapes_are_held_once():
    """A warehouse repeats ``id`` and ``created_at`` in every model: the lexicon keeps one copy of
    each distinct stem tuple and shape set (it was 350 MiB at 10,000 models before)."""
    catalog = Catalog.from_read(read_store(SHOP))
    lexicon = Lexicon.build(catalog)
    by_value: dict[object, list[object]] = {}
    for table in (lexicon.stems, lexicon.shapes, lexicon.terms):
        for value in table.values():
            by_value.setdefault(value, []).append(value)
    repeated = [copies for copies in by_value.values() if len(copies) > 1]
    assert repeated  # the example store repeats names, so the test sees sharing
    assert all(all(c is copies[0] for c in copies) for copies in repeated)
    stems = [s for t in lexicon.stems.values() for s in t]
    assert len({id(s) for s in stems}) == len(set(stems))  # each stem string once


def contents(lexicon: Lexicon) -> dict[str, object]:
    """Everything a lexicon says, by id and stem (its numbers are private to its chain)."""
    names = lexicon.numbers.names
    return {
        "stems": dict(lexicon.stems.items()),
        "postings": {stem: sorted(names[n] for n in ns) for stem, ns in lexicon.postings.items()},
        "terms": dict(lexicon.terms.items()),
        "by_value": dict(lexicon.by_value.items()),
        "shapes": dict(lexicon.shapes.items()),
        "joins": dict(lexicon.joins.items()),
        "lengths": {cid: int(lexicon.lengths[lexicon.numbers.number[cid]]) for cid in lexicon.stems},
    }


def test_a_first_build_says_what_deltas_say(tmp_path):
    """The bulk first build and the per-id path give the same lexicon: from nothing, and after edits
    that rename, add and drop (the derived chain against a fresh build of its last catalog)."""
    store = tmp_path / "store"
    shutil.copytree(SHOP, store)
    catalog = Catalog.from_read(read_store(store))
    built = Lexicon.build(catalog)
    assert contents(built)["postings"] and contents(built)["by_value"] and contents(built)["joins"]
    every = frozenset(catalog.searchable_ids())
    assert contents(Lexicon().apply(catalog, Delta(added=every))) == contents(built)
    lexicon = built
    for step in range(4):
        _edit(store, step)
        catalog, delta = catalog.derive(read_store(store))
        lexicon = lexicon.apply(catalog, delta)
    assert contents(lexicon) == contents(Lexicon.build(catalog))
