"""What gets embedded first: the order that makes the dense channel useful soonest.

A fresh store of 1,000 models holds ~26k entity texts and ~62k part texts; embedding all of them
takes minutes. Search gains most from the few texts that answer the most questions, so work is
ranked by kind: memories (the answers people wrote down), datasources, models, measures and
aggregations, then columns (most of the texts, each answering few questions), then the parts of
each (facets and memory pieces, which only refine a ranking) in the same order of owners.

``WorkQueue`` keeps queued texts in these tiers (first in, first out within a tier; a newer text
for an id replaces the queued one in place); ``RankedItems`` and ``RankedParts`` walk a catalog
in the same order, so a backfill drawn a page at a time follows it across the whole store.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from typing import TYPE_CHECKING

from slayer_lsp.texts.parts import PART_SEP, parts_for
from slayer_lsp.texts.statements import EmbedItem, item_for

if TYPE_CHECKING:
    from slayer_lsp.catalog import Catalog

# rank of an owner kind; a kind not listed (a future one) comes after every listed one
KIND_RANK = {"memory": 0, "datasource": 1, "model": 2, "measure": 3, "aggregation": 3, "column": 4}
_UNRANKED = max(KIND_RANK.values()) + 1
TIERS = 2 * (_UNRANKED + 1)  # entity ranks, then the same ranks for parts


def priority(kind: str) -> int:
    """The tier of a work item's kind: 0 is embedded first. A part (``column#values``) comes after
    every entity, ranked by its owner's kind."""
    owner, sep, _ = kind.partition(PART_SEP)
    rank = KIND_RANK.get(owner, _UNRANKED)
    return rank + (_UNRANKED + 1 if sep else 0)


class WorkQueue:
    """Queued texts by id, taken highest tier first. Only the worker's lock guards it."""

    def __init__(self) -> None:
        self._tiers: list[OrderedDict[str, EmbedItem]] = [OrderedDict() for _ in range(TIERS)]
        self._tier_of: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._tier_of)

    def __contains__(self, canonical_id: object) -> bool:
        return canonical_id in self._tier_of

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._tier_of))

    def put(self, item: EmbedItem) -> None:
        """Queue ``item``; a queued text of the same id is replaced where it stands."""
        cid = item.canonical_id
        tier = priority(item.kind)
        old = self._tier_of.get(cid)
        if old is not None and old != tier:
            del self._tiers[old][cid]
        self._tiers[tier][cid] = item
        self._tier_of[cid] = tier

    def pop(self, canonical_id: str) -> EmbedItem | None:
        tier = self._tier_of.pop(canonical_id, None)
        return None if tier is None else self._tiers[tier].pop(canonical_id)

    def take(self, n: int) -> list[EmbedItem]:
        """Up to ``n`` items, highest tier first, oldest first within a tier."""
        out: list[EmbedItem] = []
        for tier in self._tiers:
            while tier and len(out) < n:
                cid, item = tier.popitem(last=False)
                del self._tier_of[cid]
                out.append(item)
            if len(out) >= n:
                break
        return out


def _ranked_ids(catalog: Catalog) -> Iterator[str]:
    buckets: dict[int, list[str]] = {}
    for cid in catalog.searchable_ids():
        buckets.setdefault(KIND_RANK.get(catalog.kind_of(cid) or "", _UNRANKED), []).append(cid)
    for rank in sorted(buckets):
        yield from buckets[rank]


class RankedItems:
    """Work items of every searchable entity of a catalog, most useful kind first (memories,
    datasources, models, measures, columns); within a kind, in the catalog's search order. Texts
    are rendered while iterating (a paged backfill holds one page of them); ``len()`` is exact."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog

    def __len__(self) -> int:
        return len(self.catalog.searchable_ids())

    def __iter__(self) -> Iterator[EmbedItem]:
        for cid in _ranked_ids(self.catalog):
            item = item_for(self.catalog, cid)
            if item is not None:
                yield item


class RankedParts:
    """Work items of the parts of every searchable entity, owners in ``RankedItems``' order.
    ``len()`` (counted once, by making every part's text) is exact."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self._len: int | None = None

    def __len__(self) -> int:
        if self._len is None:
            self._len = sum(1 for _ in self)
        return self._len

    def __iter__(self) -> Iterator[EmbedItem]:
        for cid in _ranked_ids(self.catalog):
            yield from parts_for(self.catalog, cid)
