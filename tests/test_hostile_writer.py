"""Hostile inputs to the memory writer and the piece splitter (issue #14, classes 3 and 8-12), below
the daemon: text work is linear with documented limits, a scoped writer learns and touches nothing
it cannot reach, ids that display alike are one id (or refused), line ends and NELs are stored as
SLayer reads them back, and no error quotes a memory file. motley-slayer loads what we wrote."""

from __future__ import annotations

import os
import re
import time
import unicodedata

import pytest

from slayer_lsp.catalog import load_catalog
from slayer_lsp.engine import Engine
from slayer_lsp.store.documents import MAX_LEARNING_CHARS
from slayer_lsp.texts.pieces import MAX_PIECE_CHARS, split_pieces
from slayer_lsp.writer import memories as writer
from slayer_lsp.writer.memories import MemoryWriteError, forget_memory, normalize_memory_id, save_memory
from tests import slayer_oracle as oracle

from .test_reachability import EXPECTED, TAGS, write_store
from .test_writer import _copy_store, memory_ids, stored_doc, stored_text
from .watchdog import within

needs_slayer = pytest.mark.skipif(oracle.slayer_python() is None, reason=oracle.SKIP_REASON)


# ------------------------------------------------------------------------------ linear splitting

MB = 1_000_000


def _repeat(unit: str, size: int) -> str:
    return (unit * (size // len(unit) + 1))[:size]


SHAPES = {
    "no punctuation": "lorem ipsum dolor sit amet ",
    "all dots": ".",
    "dots and spaces": ". ",
    "abbreviations": "e.g. Dr. J. Smith i.e. approx. No. 5 vs. ",
    "sentences": "The cat sat on the mat. ",
    "code fence": "```\nx = compute(a, b);  # not. a. sentence.\n",
    "table": "| a. | b! | c? |\n|---|---|---|\n",
    "one huge token": "x",
    "commas": "alpha, beta: gamma - delta (",
    "bullets and titles": "- item one. two\nTitle\n1. step; next\n# Heading\n",
    "table rule then text": "|" + " " * 997 + "x\n",
    "quotes and closers": '?!"\u201d)] ',
}


@pytest.mark.slow
@pytest.mark.parametrize("size, bound", [(MB, 10.0), (5 * MB, 30.0)], ids=["1MB", "5MB"])
@pytest.mark.parametrize("shape", SHAPES)
def test_the_piece_splitter_is_linear(shape, size, bound):
    text = _repeat(SHAPES[shape], size)
    pieces = within(bound, split_pieces, text)
    assert pieces and all(0 < len(p) <= MAX_PIECE_CHARS for p in pieces)

    def visible(t: str) -> int:
        return len(re.sub(r"[\s|`]+", "", t))

    assert sum(visible(p) for p in pieces) <= visible(text)  # nothing repeated


def test_a_longer_learning_is_indexed_up_to_the_limit(tmp_path):
    from slayer_lsp.store.documents import Memory
    from slayer_lsp.texts.pieces import piece_texts

    tail = " Zebracorn marker at the end."
    memory = Memory(id="x", learning=_repeat("Plain words here. ", 2 * MAX_LEARNING_CHARS) + tail)
    pieces = within(10.0, piece_texts, memory)
    assert pieces and not any("Zebracorn" in p for p in pieces)
    assert sum(len(p) for p in pieces) <= MAX_LEARNING_CHARS


# ------------------------------------------------------------------------------ the learning limit


@pytest.fixture(params=["yaml", "sqlite"])
def store(request, tmp_path):
    loc = _copy_store(request.param, tmp_path)
    return loc, load_catalog(loc.path)


@pytest.mark.parametrize("size", [MAX_LEARNING_CHARS + 1, MB])
def test_a_learning_over_the_limit_is_refused_and_nothing_written(store, size):
    loc, cat = store
    before = memory_ids(loc)
    with pytest.raises(
        MemoryWriteError, match=f"learning must be at most {MAX_LEARNING_CHARS} characters; got {size}"
    ):
        within(10.0, lambda: save_memory(loc, cat, learning="." * size, entities=["orders"]))
    assert memory_ids(loc) == before


def test_a_learning_at_the_limit_is_saved(store):
    loc, cat = store
    saved = within(
        10.0,
        lambda: save_memory(loc, cat, learning=_repeat("e.g. x. ", MAX_LEARNING_CHARS), entities=["orders"]),
    )
    assert len(stored_doc(loc, saved.id)["learning"]) == MAX_LEARNING_CHARS


# ------------------------------------------------------------------------------ ids that display alike

CAFE_NFC, CAFE_NFD = "caf\u00e9", "cafe\u0301"


@pytest.mark.parametrize(
    "memory_id, char",
    [
        ("abc\u202edcba", "U+202E"),  # right-to-left override
        ("abc\u2066x\u2069", "U+2066"),  # bidi isolate
        ("ab\u200bc", "U+200B"),  # zero-width space
        ("ab\u200dc", "U+200D"),  # zero-width joiner
        ("\ufeffabc", "U+FEFF"),  # byte-order mark
        ("soft\u00adhyphen", "U+00AD"),
        ("private\ue000", "U+E000"),
        ("unassigned\U000e0080", "U+E0080"),
    ],
)
def test_ids_with_invisible_characters_are_refused(store, memory_id, char):
    loc, cat = store
    before = memory_ids(loc)
    for call in (
        lambda: save_memory(loc, cat, learning="x", entities=["orders"], id=memory_id),
        lambda: forget_memory(loc, cat, memory_id),
    ):
        with pytest.raises(MemoryWriteError, match=f"character {re.escape(char)} .*does not show"):
            call()
    assert memory_ids(loc) == before


@pytest.mark.parametrize("memory_id", ["\ud800", "a\udfffb"])
def test_ids_with_lone_surrogates_are_refused(store, memory_id):
    loc, cat = store
    with pytest.raises(MemoryWriteError, match="lone surrogate"):
        save_memory(loc, cat, learning="x", entities=["orders"], id=memory_id)


def test_two_unicode_forms_are_one_id(store):
    loc, cat = store
    first = save_memory(loc, cat, learning="composed", entities=["orders"], id=CAFE_NFD)
    assert first.id == CAFE_NFC and first.created
    again = save_memory(loc, cat, learning="same id", entities=["orders"], id=CAFE_NFC)
    assert again.id == CAFE_NFC and not again.created
    assert CAFE_NFD not in memory_ids(loc) and stored_doc(loc, CAFE_NFC)["learning"] == "same id"
    assert forget_memory(loc, cat, CAFE_NFD)  # the other spelling names the same memory
    assert CAFE_NFC not in memory_ids(loc)


def test_a_stored_twin_in_another_form_or_case_is_a_collision(yaml_store_hostile):
    loc, cat = yaml_store_hostile
    (loc.path / "memories" / f"{CAFE_NFD}.md").write_text("---\nentities:\n- orders\n---\nby another tool\n")
    for asked in (CAFE_NFC, "CAF\u00c9"):
        with pytest.raises(
            MemoryWriteError,
            match=r"conflicts with existing 'cafe\u0301' \(differs only by case "
            r"or Unicode form\)",
        ):
            save_memory(loc, cat, learning="x", entities=["orders"], id=asked)
    assert {CAFE_NFC, "CAF\u00c9"}.isdisjoint(memory_ids(loc))


@pytest.fixture
def yaml_store_hostile(tmp_path):
    loc = _copy_store("yaml", tmp_path)
    return loc, load_catalog(loc.path)


@pytest.mark.parametrize(
    "raw, key",
    [("KB.Revenue", "kb.revenue"), (CAFE_NFD, CAFE_NFC), ("CAF\u00c9", CAFE_NFC), ("Stra\u00dfe", "strasse")],
)
def test_the_id_key_is_caseless_and_form_blind(raw, key):
    assert writer.memory_id_key(raw) == key
    assert unicodedata.is_normalized("NFC", normalize_memory_id(raw))


# ------------------------------------------------------------------------------ a scoped writer

HIDDEN_EXTRA = {
    "Caf\u00e9.secret": "---\nentities:\n- shop.payroll.salary_band\n---\nZanzibar cafe secret\n",
    "1000": "---\nentities:\n- shop.payroll\n---\nThe largest id is a hidden one.\n",
    "broken": "---\nentities: [shop.orders\nsecret_marker: Quetzal\n---\nunloadable\n",
}


@pytest.fixture
def scoped(tmp_path):
    """The reachability test store plus hidden memories with letters in their ids, a hidden memory
    holding the largest int id, and one that does not load; an engine scoped to the ``ops`` tag."""
    root = write_store(tmp_path / "store")
    for mid, text in HIDDEN_EXTRA.items():
        (root / "memories" / f"{mid}.md").write_text(text, encoding="utf-8")
    engine = Engine(root, scope=TAGS, use_cache=False)
    state = engine.state
    assert set(state.catalog.memories) == EXPECTED[TAGS][1]
    yield engine, state, frozenset(state.catalog.memories)
    engine.close()


def _files(root) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((root / "memories").iterdir())}


HIDDEN_OR_FREE = [
    "2",
    "5",
    "Caf\u00e9.secret",
    "CAF\u00c9.SECRET",
    "cafe\u0301.secret",
    "caf\u00e9.Secret",
    "1000",
    "broken",
    "BROKEN",
    "99",
    "nosuch",
    "fresh.id",
]


def test_a_scoped_writer_refuses_every_id_it_does_not_reach_alike(scoped):
    engine, state, reachable = scoped
    before = _files(engine.location.path)
    answers = set()
    for memory_id in HIDDEN_OR_FREE:
        with pytest.raises(MemoryWriteError) as exc:
            save_memory(
                engine.location,
                state.catalog,
                learning="overwrite",
                entities=["shop.orders"],
                id=memory_id,
                reachable=reachable,
            )
        answers.add(str(exc.value).replace(repr(memory_id), "<id>"))
    assert len(answers) == 1 and "not a memory this session can update" in answers.pop()
    assert _files(engine.location.path) == before


def test_a_scoped_writer_updates_its_own_memories(scoped):
    engine, state, reachable = scoped
    saved = save_memory(
        engine.location,
        state.catalog,
        learning="Customers upserted.",
        entities=["shop.customers"],
        id="1",
        reachable=reachable,
    )
    assert saved.id == "1" and not saved.created
    assert stored_doc(engine.location, "1")["learning"] == "Customers upserted."


def test_new_ids_of_a_scoped_writer_reveal_nothing(scoped):
    engine, state, reachable = scoped
    ids = set()
    for n in range(5):
        saved = save_memory(
            engine.location,
            state.catalog,
            learning=f"note {n}",
            entities=["shop.orders"],
            reachable=reachable,
        )
        assert re.fullmatch(r"m-[0-9a-f]{16}", saved.id) and saved.created
        ids.add(saved.id)
    assert len(ids) == 5
    unscoped = save_memory(engine.location, state.catalog, learning="x", entities=["shop.orders"])
    assert unscoped.id == "1001"  # SLayer's own allocation (the int ids' max + 1) is unchanged


def test_scoped_writer_random_ids_skip_any_taken_spelling(tmp_path, monkeypatch):
    loc = _copy_store("yaml", tmp_path)
    (loc.path / "memories" / "M-00000000000000AA.md").write_text("---\nentities:\n- orders\n---\nhidden\n")
    draws = iter(["00000000000000aa", "00000000000000bb"])
    monkeypatch.setattr(writer.secrets, "token_hex", lambda n: next(draws))
    saved = save_memory(loc, load_catalog(loc.path), learning="x", entities=["orders"], reachable=frozenset())
    assert saved.id == "m-00000000000000bb"


@pytest.mark.parametrize("memory_id", ["2", "Caf\u00e9.secret", "cafe\u0301.secret", "1000", "broken", "99"])
def test_a_scoped_forget_of_anything_unreached_is_a_miss(scoped, memory_id):
    engine, state, reachable = scoped
    before = _files(engine.location.path)
    assert forget_memory(engine.location, state.catalog, memory_id, reachable=reachable) is False
    assert _files(engine.location.path) == before


# ------------------------------------------------------------------------------ errors quote no file


def test_an_unreadable_memory_is_not_quoted(yaml_store_hostile):
    loc, cat = yaml_store_hostile
    (loc.path / "memories" / "bad.md").write_text("---\nentities: [orders\nsecret: Quetzal-7731\n---\nx\n")
    (loc.path / "memories" / "stamp.md").write_text("---\ncreated_at: Quetzal-7731\n---\nx\n")
    for memory_id, reason in (("bad", "cannot be read"), ("stamp", "unreadable created_at")):
        with pytest.raises(MemoryWriteError, match=reason) as exc:
            save_memory(loc, cat, learning="x", entities=["orders"], id=memory_id)
        assert "Quetzal" not in str(exc.value) and "7731" not in str(exc.value)


def test_an_upsert_over_a_symlinked_memory_quotes_nothing_outside(yaml_store_hostile, tmp_path):
    loc, cat = yaml_store_hostile
    outside = tmp_path / "elsewhere" / "private-notes.txt"
    outside.parent.mkdir()
    outside.write_text("---\n: [unclosed Quetzal-7731\n---\nprivate\n")
    (loc.path / "memories" / "linked.md").symlink_to(outside)
    with pytest.raises(MemoryWriteError) as exc:
        save_memory(loc, cat, learning="x", entities=["orders"], id="linked")
    message = str(exc.value)
    assert "Quetzal" not in message and "elsewhere" not in message and "private-notes" not in message
    assert outside.read_text().startswith("---\n: [unclosed")  # untouched
    outside.chmod(0)
    try:
        if not os.access(outside, os.R_OK):  # an unreadable target (root reads any file anyway)
            with pytest.raises(MemoryWriteError) as exc:
                save_memory(loc, cat, learning="x", entities=["orders"], id="linked")
            assert "elsewhere" not in str(exc.value) and "private-notes" not in str(exc.value)
    finally:
        outside.chmod(0o644)


# ------------------------------------------------------------------------------ text as SLayer reads it

READ_BACK = [  # (learning, description, learning as read back, description as read back) in a YAML store
    ("one\rtwo\r\nthree\n", None, "one\ntwo\nthree\n", None),
    ("keeps \x85 NEL, \u2028 LS and \u2029 PS", "a\x85b", "keeps \x85 NEL, \u2028 LS and \u2029 PS", "a b"),
    ("x", "line\u2028sep\u2029para", "x", "line\u2028sep\u2029para"),
    ("x", "carriage\rreturn", "x", "carriage\rreturn"),
    ("x", "tail NEL\x85", "x", "tail NEL "),
]


@pytest.mark.parametrize("learning, description, learning_back, description_back", READ_BACK)
def test_yaml_text_is_stored_as_slayer_reads_it(
    yaml_store_hostile, learning, description, learning_back, description_back
):
    loc, cat = yaml_store_hostile
    saved = save_memory(loc, cat, learning=learning, description=description, entities=["orders"])
    doc = stored_doc(loc, saved.id)
    assert (doc["learning"], doc.get("description")) == (learning_back, description_back)
    changed = learning != learning_back or description != description_back
    assert bool([w for w in saved.warnings if "stored" in w]) == changed
    mem = load_catalog(loc.path).memory(saved.id)  # our reader agrees
    assert (mem.learning, mem.description) == (learning_back, description_back)


def test_sqlite_text_is_stored_verbatim(tmp_path):
    loc = _copy_store("sqlite", tmp_path)
    saved = save_memory(
        loc, load_catalog(loc.path), learning="a\rb\r\nc", description="d\x85e", entities=["orders"]
    )
    doc = stored_doc(loc, saved.id)
    assert (doc["learning"], doc["description"]) == ("a\rb\r\nc", "d\x85e") and not saved.warnings


@pytest.mark.slow
@needs_slayer
@pytest.mark.parametrize("backend", ["yaml", "sqlite"])
def test_slayer_loads_every_hostile_memory_we_wrote(tmp_path, backend):
    loc = _copy_store(backend, tmp_path)
    cat = load_catalog(loc.path)
    ids = []
    for learning, description, _, _ in READ_BACK:
        ids.append(save_memory(loc, cat, learning=learning, description=description, entities=["orders"]).id)
    ids.append(
        save_memory(
            loc, cat, learning=_repeat("e.g. x. ", MAX_LEARNING_CHARS), entities=["orders"], id=CAFE_NFD
        ).id
    )
    ids.append(save_memory(loc, cat, learning="scoped", entities=["orders"], reachable=frozenset()).id)
    loaded = oracle.ok(oracle.ask([{"op": "load", "store": str(loc.path)}])[0])
    assert loaded["errors"] == []
    ours = load_catalog(loc.path)
    for mid in ids:
        mem = ours.memory(mid)
        theirs = loaded["memories"][mid]
        assert (theirs["learning"], theirs["description"], theirs["entities"]) == (
            mem.learning,
            mem.description,
            list(mem.entities),
        ), mid
    assert stored_text(loc, CAFE_NFC) is not None


# ------------------------------------------------------------------------------ status counts under a scope


def test_a_scoped_status_counts_only_reachable_vectors(tmp_path, monkeypatch):
    from slayer_lsp.embed.providers import FakeProvider
    from slayer_lsp.status import engine_status

    monkeypatch.setenv("SLAYER_LSP_CACHE_DIR", str(tmp_path / "cache"))
    root = write_store(tmp_path / "store")
    provider = FakeProvider(dim=16)
    whole = Engine(root, dense="live", embedding_provider=provider)
    whole.refresh()
    assert whole.dense.wait_idle(timeout=60) and whole.dense.parts.wait_idle(timeout=60)
    all_main, all_parts = whole.dense.index.ids(), whole.dense.parts.index.ids()
    whole.close()

    scoped = Engine(root, dense="live", embedding_provider=provider, scope=TAGS)
    try:
        scoped.refresh()
        assert scoped.dense.wait_idle(timeout=60) and scoped.dense.parts.wait_idle(timeout=60)
        reach = set(scoped.catalog.entities)

        def reached(ids):
            return [c for c in ids if c in reach or c.rpartition("#")[0] in reach]

        report = engine_status(scoped).embedding
        assert report["rows"] == len(reached(all_main)) < len(all_main)
        parts = report["parts"]
        assert parts["rows"] == len(reached(all_parts)) == sum(parts["kinds"].values()) < len(all_parts)
        assert report["other_models"] == {}
        assert len(scoped.dense.parts.index) == len(all_parts)  # the other session's vectors are loaded...
    finally:  # ...and never counted
        scoped.close()


def test_an_index_restriction_scopes_its_counts():
    import numpy as np

    from slayer_lsp.embed.index import VectorIndex

    index = VectorIndex("m", 2)
    index.upsert_many(
        ["a.x", "a.x#values", "b.y", "b.y#values", "b.y#meaning"],
        ["column#meaning", "column#values", "column#meaning", "column#values", "column#meaning"],
        np.eye(5, 2, dtype=np.float32),
        ["h"] * 5,
    )
    assert index.kind_counts() == {"column#meaning": 3, "column#values": 2} and not index.restricted
    index.restrict_to({"a.x"})
    assert index.restricted and index.reachable_count() == 2
    assert index.kind_counts() == {"column#meaning": 1, "column#values": 1}


def test_watchdog_catches_a_slow_call():
    with pytest.raises(AssertionError, match="still running"):
        within(0.2, time.sleep, 2)
