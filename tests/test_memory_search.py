"""Memory search beyond SLayer: pieces, exact tokens, recency, links, one whole memory per hit."""

from __future__ import annotations

import re
import shutil
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slayer_lsp.catalog import Catalog, Delta, load_catalog
from slayer_lsp.search import recency
from slayer_lsp.search.exact_tokens import LiteralIndex, extract_tokens
from slayer_lsp.search.memory_ranking import MemoryMatch, rank_memories
from slayer_lsp.search.piece_index import MemoryPieceIndex
from slayer_lsp.store import documents as d
from slayer_lsp.store.reader import StoreReader
from slayer_lsp.texts.pieces import MAX_PIECE_CHARS, piece_texts, split_pieces
from slayer_lsp.writer.memories import memory_markdown
from tests.conftest import YAML_STORE

NOW = datetime(2026, 6, 1, tzinfo=UTC)


def _stamp(days_ago: float) -> str:
    return (NOW - timedelta(days=days_ago)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _write(
    store,
    mid: str,
    learning: str,
    entities=(),
    description=None,
    days_ago: float = 30.0,
    created_at: str | None = None,
) -> None:
    doc = {
        "version": 4,
        "id": mid,
        "learning": learning,
        "description": description,
        "entities": list(entities),
        "query": None,
        "created_at": created_at if created_at is not None else _stamp(days_ago),
    }
    (store / "memories" / f"{mid}.md").write_text(memory_markdown(doc), encoding="utf-8")


@pytest.fixture()
def store(tmp_path):
    """The jaffle models and datasources with no memories: each test writes its own."""
    dst = tmp_path / "store"
    shutil.copytree(YAML_STORE, dst, ignore=shutil.ignore_patterns("embeddings.db"))
    for f in (dst / "memories").glob("*.md"):
        f.unlink()
    return dst


def _ranked(store, **kw) -> tuple[Catalog, MemoryPieceIndex, list[MemoryMatch]]:
    cat = load_catalog(store)
    index = MemoryPieceIndex.build(cat)
    kw.setdefault("now", NOW)
    return cat, index, rank_memories(cat, index, **kw)


def _ids(matches: list[MemoryMatch]) -> list[str]:
    return [m.memory_id for m in matches]


# --------------------------------------------------------------------------- pieces


@pytest.mark.parametrize(
    "text, pieces",
    [
        (
            "Invoices are settled by bank transfer. They moved to card payments in the autumn.",
            ["Invoices are settled by bank transfer.", "They moved to card payments in the autumn."],
        ),
        # abbreviations, initials and decimals do not end a sentence
        (
            "Use e.g. the orders table first. Dr. Smith approved it on Jan. 5 this year. Revenue is 3.5% higher.",
            [
                "Use e.g. the orders table first.",
                "Dr. Smith approved it on Jan. 5 this year.",
                "Revenue is 3.5% higher.",
            ],
        ),
        (
            "Ask J. R. Hartley about it. He knows the U.S. market well.",
            ["Ask J. R. Hartley about it.", "He knows the U.S. market well."],
        ),
        # canonical ids stay whole
        (
            "The column jaffle.orders.amount holds cents. Divide it by 100 first.",
            ["The column jaffle.orders.amount holds cents.", "Divide it by 100 first."],
        ),
        # bullets and numbered items are pieces; a short label joins the piece after it
        (
            "Notes:\n- refunds go through Stripe\n- chargebacks go to finance\n1. first numbered step here",
            ["Notes: refunds go through Stripe", "chargebacks go to finance", "first numbered step here"],
        ),
        # soft-wrapped lines are joined
        (
            "A line that is\nsoft wrapped across\nthree lines. And another sentence here.",
            ["A line that is soft wrapped across three lines.", "And another sentence here."],
        ),
        # a title line joins its sentence; a one-word reply joins its neighbour
        (
            "Payment terms\nCustomer pays within 30 days of invoice.",
            ["Payment terms Customer pays within 30 days of invoice."],
        ),
        ("Yes. The refunds go through Stripe.", ["Yes. The refunds go through Stripe."]),
        # semicolons separate facts (BIRD-style evidence)
        (
            "high rating refers to MAX(rating); low potential refers to MIN(potential);",
            ["high rating refers to MAX(rating);", "low potential refers to MIN(potential);"],
        ),
        ("", []),
        ("   \n\n  ", []),
    ],
)
def test_split_pieces(text, pieces):
    assert split_pieces(text) == pieces


def test_long_sentences_are_cut_at_a_bound_without_losing_words():
    sentence = "Long sentence " + ", ".join(f"clause number {i} goes here" for i in range(40)) + "."
    pieces = split_pieces(sentence)
    assert len(pieces) > 1 and all(len(p) <= MAX_PIECE_CHARS for p in pieces)
    assert " ".join(pieces).split() == sentence.split()  # no overlap, nothing lost
    unbroken = "x" * (MAX_PIECE_CHARS * 2 + 5)
    assert "".join(split_pieces(unbroken)) == unbroken


def test_pieces_cover_the_text_without_overlap():
    text = (
        "Refunds over $500 need a manager. The manager is on the finance rota, see ds.finance.rota. "
        "Card payments settle in 2.5 days; bank transfers take longer.\n\n- escalate after 10 days"
    )
    pieces = split_pieces(text)
    assert " ".join(pieces).split() == text.replace("- escalate", "escalate").split()


_WORDS = [
    "refunds",
    "Manager",
    "e.g.",
    "Dr.",
    "3.5",
    "ds.model.col",
    "PROD-4471",
    "end.",
    "Why?",
    "yes!",
    "x;",
    "U.S.",
    "approx.",
    "J.",
    "(note)",
    '"quoted."',
    "a" * 120,
    "done...",
    "costs,",
    "then:",
]


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sampled_from(_WORDS), min_size=1, max_size=80),
    st.lists(st.sampled_from([" ", "  ", "\t"]), min_size=80, max_size=80),
)
def test_prose_pieces_are_bounded_and_lose_or_repeat_nothing(words, gaps):
    text = "".join(w + g for w, g in zip(words, gaps, strict=False))
    pieces = split_pieces(text)
    assert " ".join(pieces).split() == text.split()
    assert all(0 < len(p) <= MAX_PIECE_CHARS for p in pieces)


def test_piece_texts_learning_then_description_never_query_or_tags():
    mem = d.Memory(
        id="1",
        learning="Refunds need a manager. Card payments settle fast.",
        description="Who approves refunds here",
        entities=["jaffle.orders"],
        query={"source_model": "orders", "fields": ["zzqueryonly"]},
    )
    assert piece_texts(mem) == [
        "Refunds need a manager.",
        "Card payments settle fast.",
        "Who approves refunds here",
    ]
    repeated = d.Memory(
        id="2",
        learning="Refunds need a manager. Card payments settle fast.",
        description="Refunds need a manager.",
    )
    assert piece_texts(repeated) == ["Refunds need a manager.", "Card payments settle fast."]
    assert piece_texts(d.Memory(id="3", learning="Same thing said twice. Same thing said twice.")) == [
        "Same thing said twice."
    ]


# --------------------------------------------------------------------------- exact tokens


@pytest.mark.parametrize(
    "question, expected",
    [
        ("did we ever sort out the packaging fault on PROD-4471?", [("PROD-4471", "code")]),
        ("status of order #88123", [("88123", "number")]),
        ("was order 4471 shipped late?", [("4471", "number")]),
        ("which card owner had No.667467?", [("667467", "number")]),
        ("what does jaffle.orders.amount mean", [("jaffle.orders.amount", "canonical")]),
        ("see memory:12 for details", [("memory:12", "memory")]),
        ("id 123e4567-e89b-12d3-a456-426614174000 broke", [("123e4567-e89b-12d3-a456-426614174000", "uuid")]),
        ("SKU A12B34 is out of stock", [("A12B34", "code")]),
        ("is invoice INV-2024-0012 unpaid?", [("INV-2024-0012", "code")]),
        ("why is the 0x1F3A flag set", [("0x1F3A", "code")]),
        ('what is "net revenue" here?', [("net revenue", "quoted")]),
        ("what goes in the order_total column", [("order_total", "identifier")]),
        ("who owns the PROD-XL line", [("PROD-XL", "code")]),
        ("call 555-0199 about it", [("555-0199", "number")]),
        ("mail jane@acme.com about SKU123", [("jane@acme.com", "email"), ("SKU123", "code")]),
        ("what happened on 2024-01-15?", [("2024-01-15", "date")]),
    ],
)
def test_distinctive_tokens_by_shape(question, expected):
    assert [(t.text, t.shape) for t in extract_tokens(question)] == expected


@pytest.mark.parametrize(
    "question",
    [
        "who do we chase about an unpaid invoice?",
        "how do they pay?",
        "when do they want the report?",
        "What were total sales in 2023?",
        "Show the top 10 customers by revenue in Q3",
        "How many orders took more than 24h to ship?",
        "What is the 2nd largest region, e.g. by area?",
        "Revenue grew 3.5% year over year; why?",
        "Is the CFO happy with the VAT report?",
        "U.S. sales vs. EU sales in FY2024",
        "orders above 1,000,000 dollars with a 3.5GHz CPU at 10am",
        "what's the customer's lifetime value?",
        "",
    ],
)
def test_ordinary_questions_have_no_exact_tokens(question):
    assert extract_tokens(question) == []


def test_literal_index_matches_whole_tokens_case_insensitively():
    ix = LiteralIndex(
        [
            ("a", ["Incident PROD-4471: cartons crushed.", "Second piece."]),
            ("b", ["See (prod-4471) too"]),
            ("c", ["PROD-4471-B is another product", "jaffle.orders.amount is cents"]),
            ("e", ["net revenue excludes tax", "revenue, net of refunds"]),
        ]
    )
    assert ix.lookup("PROD-4471") == {"a": (0,), "b": (0,)}  # never PROD-4471-B
    assert ix.lookup("4471") == {"a": (0,), "b": (0,), "c": (0,)}  # a part of a compound token
    assert ix.ids("amount") == {"c"} and ix.ids("jaffle.orders.amount") == {"c"}
    assert ix.ids("orders.amount") == frozenset()  # whole tokens only
    assert ix.lookup("Net Revenue") == {"e": (0,)}  # a phrase: consecutive tokens in one part
    assert ix.ids("PROD-4471", allow={"b", "c"}) == {"b"}
    ix.replace(["a"], [("c", ["nothing here now"])])
    assert ix.ids("PROD-4471") == {"b"} and ix.ids("amount") == frozenset() and len(ix) == 3


_WORDS = ["PROD-4471", "prod", "4471", "net", "revenue", "tax", "orders.amount", "refund", "Net"]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.lists(
            st.tuples(
                st.sampled_from("abcdef"),
                st.one_of(st.none(), st.lists(st.lists(st.sampled_from(_WORDS), max_size=4), max_size=3)),
            ),
            max_size=5,
        ),
        min_size=1,
        max_size=6,
    )
)
def test_literal_index_generations_are_values(commits):
    """After any run of commits each generation answers as an index built afresh from its own
    documents, and keeps answering so after later generations are derived from it."""
    docs: dict[str, tuple[str, ...]] = {}
    generations = [(LiteralIndex(), dict(docs))]
    for commit in commits:
        removals = [doc_id for doc_id, parts in commit if parts is None]
        upserts = [
            (doc_id, tuple(" ".join(p) for p in parts)) for doc_id, parts in commit if parts is not None
        ]
        for doc_id in removals:
            docs.pop(doc_id, None)
        docs.update(upserts)
        generations.append((generations[-1][0].replaced(removals, upserts), dict(docs)))
    for index, held in generations:
        fresh = LiteralIndex(held.items())
        assert len(index) == len(held)
        for word in [*_WORDS, "net revenue", "PROD 4471"]:
            assert index.lookup(word) == fresh.lookup(word), word


def test_literal_index_over_rendered_entity_documents(yaml_catalog):
    from slayer_lsp.texts import render

    docs = [render.render_entity(yaml_catalog, c) for c in yaml_catalog.searchable_ids()]
    ix = LiteralIndex.from_rendered(doc for doc in docs if doc is not None)
    hits = ix.ids("jaffle.orders.order_total")
    assert "jaffle.orders.order_total" in hits and "jaffle.orders" in ix


# --------------------------------------------------------------------------- recency


def test_recency_curve_properties():
    ages = [0, 0.5, 1, 7, 30, 90, 365, 730, 1826.25, 3652.5, 4017.75, 100_000]
    factors = [recency.recency_factor(_stamp(a), NOW) for a in ages]
    assert factors[0] == 1.0
    assert all(a >= b for a, b in zip(factors, factors[1:], strict=False))  # older is never favoured
    assert all(1 - recency.EPSILON <= f <= 1 for f in factors)
    week, year = recency.recency_factor(_stamp(7), NOW), recency.recency_factor(_stamp(365.25), NOW)
    assert week - year > 0.004  # last week against last year matters
    assert recency.recency_factor(_stamp(3652.5), NOW) == recency.recency_factor(_stamp(4017.75), NOW)


@pytest.mark.parametrize("created_at", ["", "not a date", None, "2026-13-45T00:00:00Z"])
def test_unknown_age_is_not_adjusted(created_at):
    assert recency.recency_factor(created_at, NOW) == 1.0


def test_future_and_naive_stamps():
    assert recency.recency_factor(_stamp(-30), NOW) == 1.0
    naive = (NOW - timedelta(days=7)).replace(tzinfo=None).isoformat()
    assert recency.recency_factor(naive, NOW) == pytest.approx(recency.recency_factor(_stamp(7), NOW))


@pytest.mark.parametrize(
    ("pinned", "expected"),
    [
        ("2026-12-02", datetime(2026, 12, 2, tzinfo=UTC)),
        (" 2025-01-31T17:00:00Z", datetime(2025, 1, 31, tzinfo=UTC)),
    ],
)
def test_the_day_ages_count_from_can_be_pinned(monkeypatch, pinned, expected):
    monkeypatch.setenv(recency.TODAY_ENV, pinned)
    assert recency.today() == expected


@pytest.mark.parametrize("pinned", ["", "yesterday", "2026-13-01"])
def test_a_pinned_day_that_is_not_a_date_leaves_the_clock_alone(monkeypatch, pinned):
    monkeypatch.setenv(recency.TODAY_ENV, pinned)
    midnight = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    assert recency.today() in (midnight, midnight + timedelta(days=1))  # a run across midnight


def test_documented_curve_table_matches_the_function():
    rows = re.findall(
        r"^\s{4}(0 \(now\)|1 day|1 week|1 month|1 year|2 years|5\+ years)\s+([\d.]+)\s+([\d.]+)",
        recency.__doc__ or "",
        re.M,
    )
    days = {
        "0 (now)": 0,
        "1 day": 1,
        "1 week": 7,
        "1 month": 365.25 / 12,
        "1 year": 365.25,
        "2 years": 730.5,
        "5+ years": 5 * 365.25,
    }
    assert len(rows) == len(days)
    for label, s, factor in rows:
        assert recency.staleness(days[label]) == pytest.approx(float(s), abs=6e-4), label
        assert 1 - recency.EPSILON * recency.staleness(days[label]) == pytest.approx(float(factor), abs=6e-6)


def test_equally_good_matches_newer_first(store):
    _write(store, "old", "They settle invoices by bank transfer.", days_ago=300)
    _write(store, "new", "They settle invoices by card payment.", days_ago=20)
    _write(store, "mid", "They settle invoices by postal cheque.", days_ago=100)
    _, _, matches = _ranked(store, question="how do they settle invoices?")
    assert _ids(matches) == ["new", "mid", "old"]
    assert matches[0].score > matches[1].score > matches[2].score


def test_a_much_better_old_match_beats_a_barely_relevant_new_one(store):
    _write(store, "old", "Urgent credit notes are signed off by the finance director.", days_ago=3650)
    _write(store, "new", "The office has a credit card for stationery.", days_ago=1)
    _, _, matches = _ranked(store, question="who signs off an urgent credit note?")
    assert _ids(matches)[:2] == ["old", "new"]


# --------------------------------------------------------------------------- the piece index


def test_one_entry_per_memory_with_its_best_piece(store):
    _write(
        store,
        "long",
        "Refunds are approved by a manager. Refund approvals take two days. "
        "Refund requests over $500 need the refund form. The weather was nice.",
    )
    _write(store, "short", "Refund policy changed in spring.")
    cat, index, matches = _ranked(store, question="who approves refunds?")
    assert sorted(_ids(matches)) == ["long", "short"]  # one hit per memory however many pieces matched
    top = matches[0]
    assert top.memory_id == "long" and top.piece == "Refunds are approved by a manager." and top.piece_no == 0
    assert top.piece in index.pieces("long") and top.piece != cat.memory("long").learning
    assert len(index.rank("refund")) == 2 and len({h.memory_id for h in index.rank("refund")}) == 2


def test_ranking_is_restricted_before_it_is_cut(store):
    _write(store, "strong", "Refunds refunds refunds: the refund desk handles refunds.")
    _write(store, "weak", "A refund once went missing.")
    cat = load_catalog(store)
    index = MemoryPieceIndex.build(cat)
    assert [h.memory_id for h in index.rank("refund", depth=1)] == ["strong"]
    assert [h.memory_id for h in index.rank("refund", allow={"weak"}, depth=1)] == ["weak"]
    assert index.rank("refund", allow=set()) == []
    matches = rank_memories(cat, index, question="refund", allowed={"weak"}, now=NOW)
    assert _ids(matches) == ["weak"]


def test_searches_begun_early_answer_as_the_plain_ones_do(store):
    # many matching pieces per memory, so that a small depth must fetch deeper than the search begun
    for i in range(6):
        sentences = " ".join(f"Refund rule {k} of desk {i} about the order total." for k in range(12))
        _write(store, f"m{i}", sentences, entities=["jaffle.orders.order_total"] if i % 2 else ())
    cat = load_catalog(store)
    index = MemoryPieceIndex.build(cat)
    some = frozenset({"m1", "m2", "m5"})
    for question in ("refund desk", "order total", "nothing here matches", "?"):
        for allow in (None, some, frozenset()):
            for depth in (2, 4, 50):
                plain = (
                    index.rank(question, allow=allow, depth=depth),
                    index.rank_about(question, allow=allow, depth=depth),
                )
                started = index.start(question, allow=allow, depth=depth)
                early = (
                    index.rank(question, allow=allow, depth=depth, started=started),
                    index.rank_about(question, allow=allow, depth=depth, started=started),
                )
                assert early == plain, (question, allow, depth)
    # begun for other arguments: ignored, never mixed in
    other = index.start("order total", allow=frozenset(some), depth=4)
    assert index.rank("refund desk", depth=4, started=other) == index.rank("refund desk", depth=4)
    assert index.rank("order total", allow=some, depth=4, started=other) == index.rank(
        "order total", allow=some, depth=4
    )
    assert index.rank_about("order total", depth=2, started=other) == index.rank_about("order total", depth=2)


def test_index_follows_catalog_deltas(store):
    _write(store, "1", "Chargebacks go to the finance team.")
    reader = StoreReader(store)
    cat = Catalog.from_read(reader.read())
    index = MemoryPieceIndex.build(cat)
    assert [h.memory_id for h in index.rank("chargebacks")] == ["1"]
    _write(store, "2", "Chargebacks older than 90 days are written off.", entities=["memory:1"])
    _write(store, "1", "Disputes go to the finance team.")
    cat2, delta = cat.derive(reader.read())
    assert delta.touched == {"memory:1", "memory:2"}
    first, index = index, index.apply(cat2, delta)
    assert [h.memory_id for h in index.rank("chargebacks")] == ["2"]
    assert index.linked("1") == ("2",) and index.linked("2") == ("1",)
    (store / "memories" / "2.md").unlink()
    cat3, delta = cat2.derive(reader.read())
    index = index.apply(cat3, delta)
    assert index.rank("chargebacks") == [] and "2" not in index and index.linked("1") == ()
    assert index.apply(cat3, Delta()) is index
    fresh = index.rebuilt()
    assert [h.memory_id for h in fresh.rank("disputes")] == ["1"] and fresh.deletions == 0
    # each generation is a value: the first still holds only its own memory and text
    assert [h.memory_id for h in first.rank("chargebacks")] == ["1"] and first.rank("disputes") == []
    assert "2" not in first and first.linked("1") == () and first.deletions == 0
    # a generation derived from an older one (not the writer's last) forks a writer of its own
    forked = first.apply(cat3, Delta(changed=frozenset({"memory:1"})))
    assert [h.memory_id for h in forked.rank("disputes")] == ["1"] and forked.rank("chargebacks") == []
    assert [h.memory_id for h in index.rank("disputes")] == ["1"]


@pytest.mark.parametrize("asked_early", [False, True])
def test_exact_token_lookup_is_the_same_whether_built_early_or_late(store, asked_early):
    """The literal index is built on first use: a generation asked before a delta derives its
    successor's, one never asked lets the successor build its own; both answer as a fresh build."""
    _write(store, "1", "Incident PROD-4471 crushed cartons.")
    _write(store, "2", "PROD-9 is fine.")
    reader = StoreReader(store)
    cat = Catalog.from_read(reader.read())
    first = MemoryPieceIndex.build(cat)
    if asked_early:
        assert first.literal.ids("PROD-4471") == {"1"}
    _write(store, "2", "PROD-4471 again, and PROD-9.")
    _write(store, "3", "Nothing to see.")
    (store / "memories" / "1.md").unlink()
    cat2, delta = cat.derive(reader.read())
    second = first.apply(cat2, delta)
    assert second.literal.ids("PROD-4471") == {"2"} and second.literal.ids("prod-9") == {"2"}
    assert len(second.literal) == 2
    assert first.literal.ids("PROD-4471") == {"1"}  # the older generation as it was


# --------------------------------------------------------------------------- exact tokens in ranking


def test_exact_token_is_matched_literally_and_heavily(store):
    _write(store, "words", "The packaging fault on the outer carton was a packaging fault of the supplier.")
    _write(store, "code", "PROD-4471 shipped in a weak box.")
    _, _, matches = _ranked(store, question="did we ever sort out the packaging fault on PROD-4471?")
    assert matches[0].memory_id == "code" and "exact" in matches[0].channels
    assert matches[0].tokens == ("PROD-4471",) and matches[0].piece == "PROD-4471 shipped in a weak box."


def test_exact_channel_stays_silent_on_ordinary_questions(store):
    _write(store, "1", "Unpaid invoices are chased by the accounts team.")
    _write(store, "2", "Invoice 4471 was paid twice.")
    _, _, matches = _ranked(store, question="who do we chase about an unpaid invoice?")
    assert matches and all("exact" not in m.channels and m.tokens == () for m in matches)
    assert matches[0].memory_id == "1"


def test_canonical_token_matches_tags_and_text(store):
    _write(store, "tagged", "Amounts are stored in cents.", entities=["jaffle.orders.order_total"])
    _write(store, "said", "Read jaffle.orders.order_total before tax questions.")
    _write(store, "other", "Amounts of other things.")
    _, _, matches = _ranked(store, question="what about jaffle.orders.order_total amounts?")
    assert set(_ids(matches)[:2]) == {"tagged", "said"}
    assert all("exact" in m.channels for m in matches[:2])


def test_what_a_memory_is_about_counts_without_its_tags_being_a_piece(store):
    _write(store, "tagged", "Use the net figure for reports.", entities=["jaffle.orders.order_total"])
    _write(store, "untagged", "Use the gross figure for reports.")
    cat, index, matches = _ranked(store, question="which order total figure for reports?")
    assert _ids(matches) == ["tagged", "untagged"] and "about" in matches[0].channels
    assert all("order" not in p.lower() for p in index.pieces("tagged"))  # tag words are no piece
    assert [m for m, _ in index.rank_about("order total")] == ["tagged"]
    assert index.rank_about("order total", allow={"untagged"}) == []
    reader = StoreReader(store)
    cat = Catalog.from_read(reader.read())
    index = MemoryPieceIndex.build(cat)
    _write(store, "tagged", "Use the net figure for reports.", entities=["jaffle.customers"])
    cat2, delta = cat.derive(reader.read())
    index = index.apply(cat2, delta)
    assert index.rank_about("order total") == [] and [m for m, _ in index.rank_about("customers")] == [
        "tagged"
    ]


def test_keyword_is_trusted_less_than_an_extracted_token(store):
    _write(store, "token", "Box issue: SKU-9911 cartons split open.")
    _write(store, "keyword", "Box issue: courier cartons split open.")
    _write(store, "neither", "Box issue: cartons split open.")
    _, _, matches = _ranked(store, question="box issue with SKU-9911?", keyword="courier")
    assert _ids(matches)[:2] == ["token", "keyword"]
    assert matches[1].channels == ("text", "keyword") and matches[1].tokens == ("courier",)
    _, _, only_kw = _ranked(store, keyword="Courier")  # no question: the keyword alone ranks
    assert _ids(only_kw) == ["keyword"]
    _write(store, "tagged", "Nothing in words.", entities=["jaffle.orders"])
    _, _, by_tag = _ranked(store, keyword="jaffle.orders")  # an id-shaped keyword matches tags too
    assert _ids(by_tag) == ["tagged"] and by_tag[0].piece is None


def test_named_memory_in_the_question_leads(store):
    _write(store, "12", "Refund desk rules.")
    _write(store, "13", "Refund desk rules and more refund desk rules; see memory:12.")
    _, _, matches = _ranked(store, question="refund desk rules in memory:12")
    assert matches[0].memory_id == "12"


# --------------------------------------------------------------------------- links


def _sister_store(store, *, link_from_customer: bool = True):
    """A customer's own memory (close match) and its sister company's (word-for-word), linked."""
    _write(
        store,
        "cust",
        "Credit approvals for this customer go through their CFO. They pay by card.",
        entities=["jaffle.customers"] + (["memory:sister"] if link_from_customer else []),
    )
    _write(
        store,
        "sister",
        "Urgent credit is signed off by the regional manager. Sister company of the customer.",
        entities=[] if link_from_customer else ["memory:cust"],
    )
    _write(store, "far", "The regional manager also runs the warehouse.", entities=["memory:sister"])
    _write(store, "noise", "The parking lot is closed on Sundays.")


@pytest.mark.parametrize("link_from_customer", [True, False])
def test_named_record_leads_and_linked_memory_follows_marked(store, link_from_customer):
    _sister_store(store, link_from_customer=link_from_customer)
    q = "who signs off an urgent credit?"
    _, index, matches = _ranked(store, question=q, named=["jaffle.customers"], related=1)
    assert _ids(matches)[:2] == ["cust", "sister"]
    lead, linked = matches[0], matches[1]
    assert lead.named and lead.via is None
    assert linked.via == "memory:cust" and not linked.named
    assert linked.piece == "Urgent credit is signed off by the regional manager."  # its best piece only
    assert lead.score >= linked.score and "far" not in _ids(matches)  # one hop only
    assert all(a.score >= b.score for a, b in zip(matches, matches[1:], strict=False))
    # without the hop the word-for-word match is found on its own, unmarked, but the lead is the same
    _, _, plain = _ranked(store, question=q, named=["jaffle.customers"])
    assert plain[0].memory_id == "cust" and all(m.via is None for m in plain)


def test_the_lead_stays_with_the_named_record_when_a_linked_memory_matches_better(store):
    _write(store, "cust", "They pay by card.", entities=["jaffle.customers", "memory:sister"], days_ago=900)
    _write(store, "sister", "Urgent credit for ACME-77 is signed off by the regional manager.", days_ago=1)
    _, _, matches = _ranked(
        store, question="who signs off urgent credit for ACME-77?", named=["jaffle.customers"], related=1
    )
    assert _ids(matches) == ["cust", "sister"]
    assert matches[0].named and matches[1].via == "memory:cust"
    assert matches[0].score == matches[1].score  # promoted: it carries the top score, order decides
    _, _, unnamed = _ranked(store, question="who signs off urgent credit for ACME-77?", related=1)
    assert _ids(unnamed)[0] == "sister"


def test_two_hops_and_link_only_memories(store):
    _sister_store(store)
    _, _, matches = _ranked(
        store, question="who signs off an urgent credit?", named=["jaffle.customers"], related=2
    )
    by_id = {m.memory_id: m for m in matches}
    assert by_id["far"].via == "memory:sister"  # reached from the memory that reached it
    _write(store, "linkonly", "Completely unrelated words about lunch.", entities=["memory:cust"])
    _, _, matches = _ranked(
        store, question="who signs off an urgent credit?", named=["jaffle.customers"], related=1
    )
    by_id = {m.memory_id: m for m in matches}
    assert by_id["linkonly"].channels == ("link",) and by_id["linkonly"].via == "memory:cust"
    assert by_id["linkonly"].piece is None and "noise" not in by_id


def test_hops_never_enter_or_cross_unreachable_memories(store):
    _sister_store(store)
    allowed = {"cust", "far", "noise"}  # "sister" is unreachable: no hop into it, none through it
    _, _, matches = _ranked(
        store,
        question="who signs off an urgent credit?",
        named=["jaffle.customers"],
        related=3,
        allowed=allowed,
    )
    assert set(_ids(matches)) <= allowed and "sister" not in _ids(matches)
    assert all(m.via != "memory:sister" for m in matches)
    assert "far" not in {m.memory_id for m in matches if m.via}


def test_without_named_records_hops_start_from_the_best_matches(store):
    _sister_store(store)
    _, _, matches = _ranked(store, question="who signs off an urgent credit?", related=1)
    by_id = {m.memory_id: m for m in matches}
    assert matches[0].memory_id == "sister"  # no named record: the best match leads
    assert by_id["far"].via == "memory:sister" and by_id["far"].channels == ("link",)
    assert by_id["cust"].via is None  # itself a direct match the hops started from


def test_named_record_leads_even_without_a_question(store):
    _sister_store(store)
    _, _, matches = _ranked(store, named=["jaffle.customers"], related=1)
    assert _ids(matches)[:2] == ["cust", "sister"] and matches[1].via == "memory:cust"


# --------------------------------------------------------------------------- dense pieces


def test_dense_pieces_collapse_to_one_best_piece_per_memory(store):
    _write(store, "a", "First sentence here now. Second sentence there then. Third one as well.")
    _write(store, "b", "Only sentence of memory b.")
    cat, index, matches = _ranked(
        store,
        question=None,
        named=(),
        dense=[("a", 0, 0.30), ("a", 2, 0.80), ("b", 0, 0.50), ("zz-unknown", 0, 0.99), ("a", 1, 0.10)],
        allowed={"a", "b"},
    )
    assert _ids(matches) == ["a", "b"]
    assert matches[0].piece == "Third one as well." and matches[0].piece_no == 2
    assert matches[0].channels == ("dense",)
    assert index.pieces("a") == tuple(piece_texts(cat.memory("a")))


def test_never_a_fragment_the_match_names_the_whole_memory(store):
    _write(
        store, "1", "Refunds are approved by a manager. They take two days.", description="Refund approvals"
    )
    cat, _, matches = _ranked(store, question="refund approvals take days")
    assert len(matches) == 1
    m = matches[0]
    assert m.canonical == "memory:1" and cat.memory(m.memory_id).learning.startswith("Refunds are approved")
    assert m.piece in piece_texts(cat.memory("1"))
