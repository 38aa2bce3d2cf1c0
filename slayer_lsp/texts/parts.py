"""Parts of an entity: the pieces of it that get a vector of their own, besides its whole text.

A part is keyed ``<canonical>#<part>``: the facets of ``texts/facets.py`` (``ds.m.col#meaning``,
``ds.m.col#values``) and a memory's pieces (``memory:<id>#p<n>``, ``texts/pieces.py``). Its kind is
``<owner kind>#<group>`` (``column#values``; ``group`` is the facet's name, or ``piece``), so the
rows of one facet are picked by kind before ranking, without building an id list. Where part vectors
are stored, and why not in SLayer's table, is ``embed/parts.py``'s story.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from slayer_lsp.store import documents as d
from slayer_lsp.texts.facets import facet_texts
from slayer_lsp.texts.pieces import piece_texts
from slayer_lsp.texts.statements import EmbedItem

if TYPE_CHECKING:
    from slayer_lsp.catalog import Catalog

__all__ = [
    "PART_SEP",
    "PIECE_KIND",
    "SEPARATORS",
    "PartItems",
    "owner_of",
    "part_id",
    "part_kind",
    "part_of",
    "parts_for",
]

PART_SEP = "#"
SEPARATORS = (".", PART_SEP)  # a part belongs to its owner, and to the owner's ancestors
PIECE_KIND = "memory#piece"  # memory:<id>#p<n>: the n-th piece of a memory


def part_id(owner: str, part: str) -> str:
    return f"{owner}{PART_SEP}{part}"


def owner_of(pid: str) -> str:
    """``ds.m.col#values`` -> ``ds.m.col`` (part names never hold ``#``)."""
    return pid.rpartition(PART_SEP)[0]


def part_of(pid: str) -> str:
    return pid.rpartition(PART_SEP)[2]


def part_kind(owner_kind: str, group: str) -> str:
    return f"{owner_kind}{PART_SEP}{group}"


def parts_for(catalog: Catalog, canonical: str) -> list[EmbedItem]:
    """Every part of one searchable entity, as work items (none for unknown or hidden ids)."""
    ent = catalog.get(canonical)
    if ent is None or ent.hidden:
        return []
    items = [
        EmbedItem(part_id(canonical, facet), part_kind(ent.kind, facet), text)
        for facet, text in facet_texts(ent.obj).items()
    ]
    if isinstance(ent.obj, d.Memory):  # a memory's pieces: what its dense matching compares (texts/pieces.py)
        items += [
            EmbedItem(part_id(canonical, f"p{n}"), PIECE_KIND, text)
            for n, text in enumerate(piece_texts(ent.obj))
        ]
    return items


class PartItems:
    """Work items for the parts of every searchable entity of a catalog, in its search order.
    Texts are made while iterating; ``len()`` (computed once) is exact."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self._len: int | None = None

    def __len__(self) -> int:
        if self._len is None:
            self._len = sum(1 for _ in self)
        return self._len

    def __iter__(self) -> Iterator[EmbedItem]:
        for cid in self.catalog.searchable_ids():
            yield from parts_for(self.catalog, cid)
