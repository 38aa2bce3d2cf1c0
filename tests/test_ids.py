"""Canonical ids taken apart in one place: each helper on every shape of id, memory refs included."""

from __future__ import annotations

import pytest

from slayer_lsp.catalog import ids

# id -> (datasource_of, model_of, name_of, parent_of, lineage)
SHAPES = {
    "jaffle": ("jaffle", None, "jaffle", None, ["jaffle"]),
    "jaffle.orders": ("jaffle", "jaffle.orders", "orders", "jaffle", ["jaffle", "jaffle.orders"]),
    "jaffle.orders.amount": (
        "jaffle",
        "jaffle.orders",
        "amount",
        "jaffle.orders",
        ["jaffle", "jaffle.orders", "jaffle.orders.amount"],
    ),
}


@pytest.mark.parametrize("canonical", list(SHAPES))
def test_each_helper_reads_each_shape(canonical):
    ds, model, name, parent, lineage = SHAPES[canonical]
    assert ids.datasource_of(canonical) == ds
    assert ids.model_of(canonical) == model
    assert ids.name_of(canonical) == name
    assert ids.parent_of(canonical) == parent
    assert ids.lineage(canonical) == lineage


def test_a_memory_ref_has_no_datasource_model_or_parent():
    ref = ids.memory_ref("12")
    assert ref == "memory:12" and ids.is_memory_ref(ref) and ids.memory_id_of(ref) == "12"
    assert ids.model_of(ref) is None and ids.parent_of(ref) is None
    assert ids.name_of(ref) == "12" and ids.lineage(ref) == [ref]


def test_a_model_id_splits_into_its_datasource_and_name():
    assert ids.split_model_id("jaffle.orders") == ("jaffle", "orders")


@pytest.mark.parametrize(
    "canonical, name, expected",
    [
        ("jaffle", "shop", "shop"),
        ("jaffle.orders", "sales", "jaffle.sales"),
        ("jaffle.orders.amount", "total", "jaffle.orders.total"),
    ],
)
def test_with_name_keeps_the_parent(canonical, name, expected):
    assert ids.with_name(canonical, name) == expected
