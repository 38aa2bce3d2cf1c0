"""A memory's datasource scopes: found by looking up each tag's prefixes, equal to trying every
datasource on every tag with ``rooted_at`` (the definition), dotted and odd names included."""

from __future__ import annotations

import random
from types import SimpleNamespace

from slayer_lsp.catalog.ids import rooted_at
from slayer_lsp.search.scope import memory_scopes

DATASOURCES = ["shop", "shop_v2", "prod", "prod.eu", "a", "ab", "x.y.z"]


def definition(datasources: list[str], tags: list[str]) -> set[str]:
    return {ds for ds in datasources if any(rooted_at(t, ds) for t in tags)}


def test_memory_scopes_equal_the_definition():
    rng = random.Random(3)
    pieces = ["shop", "shop_v2", "prod", "eu", "a", "ab", "x", "y", "z", "orders", "memory:1", "", "sho"]
    catalog = SimpleNamespace(datasources={ds: None for ds in DATASOURCES})
    for _ in range(2000):
        tags = [
            ".".join(rng.choice(pieces) for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(0, 4))
        ]
        if rng.random() < 0.2:
            tags.append("memory:" + rng.choice(DATASOURCES))
        mem = SimpleNamespace(entities=tags)
        assert memory_scopes(catalog, mem) == definition(DATASOURCES, tags), tags  # type: ignore[arg-type]
