"""Canonical ids are taken apart and put together in one place (``catalog/ids.py``)."""

import pytest

from slayer_lsp.catalog.ids import (
    child_id,
    datasource_of,
    depth_of,
    is_leaf_id,
    is_model_id,
    memory_ref,
    model_of,
)


@pytest.mark.parametrize(
    ("canonical", "datasource", "model", "depth", "model_id", "leaf_id"),
    [
        ("jaffle", "jaffle", None, 0, False, False),
        ("jaffle.orders", "jaffle", "jaffle.orders", 1, True, False),
        ("jaffle.orders.amount", "jaffle", "jaffle.orders", 2, False, True),
        ("jaffle.orders.a.b", "jaffle", "jaffle.orders", 3, False, True),  # a name holding a dot
        ("memory:42", "memory:42", None, 0, False, False),
        ("memory:a.b.c", "memory:a", None, 2, False, False),  # a memory ref is never an entity id
    ],
)
def test_ids_taken_apart(canonical, datasource, model, depth, model_id, leaf_id):
    assert datasource_of(canonical) == datasource
    assert model_of(canonical) == model
    assert depth_of(canonical) == depth
    assert is_model_id(canonical) is model_id
    assert is_leaf_id(canonical) is leaf_id


def test_ids_put_together():
    assert child_id("jaffle", "orders") == "jaffle.orders"
    assert child_id(child_id("jaffle", "orders"), "amount") == "jaffle.orders.amount"
    assert model_of(child_id("jaffle.orders", "amount")) == "jaffle.orders"
    assert memory_ref("42") == "memory:42"
