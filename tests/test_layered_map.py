"""``catalog.layered.LayeredMap``: a commit derives the next map and leaves the one older views hold as
it was, whether its changes stay in the overlay or are folded into a new base."""

from __future__ import annotations

import random

import pytest

from slayer_lsp.catalog.layered import LayeredMap, getter


def _same(layered: LayeredMap, expected: dict[str, str]) -> None:
    assert dict(layered.pairs()) == dict(layered.items()) == expected
    assert len(layered) == len(expected)
    keys = list(layered)  # a map without an overlay iterates its base as it is
    assert len(keys) == len(expected) and set(keys) == set(expected)
    fast = getter(layered)
    for key in [*expected, "absent", "x3", "x997"]:
        assert (key in layered) == (key in expected)
        assert layered.get(key) == expected.get(key) == fast(key)


@pytest.mark.parametrize("seed", range(6))
def test_every_generation_keeps_its_own_contents(seed):
    rng = random.Random(seed)
    base = {f"x{i}": rng.choice("ab") for i in range(200)}
    generations = [(LayeredMap(dict(base)), dict(base))]
    for _ in range(40):  # small commits (the overlay), and now and then a large one (a fold)
        layered, expected = generations[-1]
        expected = dict(expected)
        mutation = layered.mutate()
        for _ in range(rng.choice([1, 3, 8, 150])):
            key = f"x{rng.randrange(400)}"
            if rng.random() < 0.4:
                assert mutation.pop(key) == expected.pop(key, None)
            else:
                value = rng.choice("abc")
                mutation[key] = value
                expected[key] = value
        generations.append((mutation.finish(), expected))
    for layered, expected in generations:
        _same(layered, expected)


def test_an_empty_commit_is_the_same_map_and_a_first_fill_becomes_its_base():
    empty = LayeredMap()
    assert empty.mutate().finish() is empty
    mutation = empty.mutate()
    mutation["a"] = "memory"
    mutation["b"] = "entity"
    assert mutation.pop("a") == "memory" and mutation.pop("a", "gone") == "gone"
    filled = mutation.finish()
    _same(filled, {"b": "entity"})
    _same(empty, {})
