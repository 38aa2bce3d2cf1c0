"""The number table: numbers are handed out once and never move, whether the key -> number map was
made up front or on first use (a reopened index makes it lazily), and whichever thread makes it."""

from __future__ import annotations

import random
import threading

import pytest

from slayer_lsp.catalog.numbering import Numbering, pick


@pytest.mark.parametrize("prepared", [False, True])
def test_a_reopened_table_numbers_known_keys_as_before_and_new_ones_next(prepared):
    names = [f"ds.m{i}.c{i % 7}" for i in range(500)]
    table = Numbering(names)
    if prepared:
        table.prepare()
    assert table.of("ds.m3.c3") == 3
    assert table.of("ds.new") == 500 and table.of("ds.new") == 500
    assert table.names[500] == "ds.new" and len(table) == 501
    assert pick(table.number, ["ds.m0.c0", "ds.new", "ds.m499.c2"]) == [0, 500, 499]


def test_the_map_made_beside_a_numbering_thread_misses_no_key():
    """The warm-up makes the map while the refresh numbers: every key keeps one number."""
    rng = random.Random(5)
    for _ in range(20):
        table = Numbering([f"k{i}" for i in range(20_000)])
        fresh = [f"n{i}" for i in range(300)]
        seen: dict[str, int] = {}
        maker = threading.Thread(target=table.prepare)
        maker.start()
        for key in fresh + [f"k{rng.randrange(20_000)}" for _ in range(50)]:
            seen[key] = table.of(key)
        maker.join()
        assert all(table.of(key) == n for key, n in seen.items())
        assert all(table.names[n] == key for key, n in seen.items())
        assert len(table) == 20_300 and len(table.number) == 20_300


def test_an_empty_table_starts_with_its_map():
    table: Numbering[str] = Numbering()
    assert table.of("a") == 0 and table.of("b") == 1 and table.number == {"a": 0, "b": 1}
