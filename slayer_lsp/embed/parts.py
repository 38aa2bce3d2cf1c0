"""Part vectors: vectors of pieces of an entity, besides its one vector per canonical id.

A part is keyed ``<canonical>#<part>``: the facets of ``embed.facets`` (``ds.m.col#meaning``,
``ds.m.col#values``) and, later, a memory's pieces (``memory:<id>#p<n>``). Its kind is
``<owner kind>#<group>`` (``column#values``; ``group`` is the facet's name, or e.g. ``piece``), so the
rows of one facet are picked by kind before ranking, without building an id list.

Part vectors are embedded by a second ``EmbeddingWorker`` (``EmbeddingWorker.parts`` of the dense
channel's worker) that shares the provider, and stored in a table of our own, ``part_vectors`` of
``parts.db`` in the store's slayer-lsp cache directory, never in SLayer's ``embeddings`` table:

* SLayer loads every row of its model from ``embeddings`` on every search and validates each with
  Pydantic; parts would triple that work for rows it then drops (its live-corpus filter);
* its access-filtered storage checks each row's id against the access view;
* its memory delete cascades ``memory:<id>`` and dotted descendants only, so ``memory:<id>#p1`` rows
  would outlive their memory.

SLayer only ever names ``embeddings`` in its SQL, so it cannot misread a row it never sees
(``tests/test_facets.py`` checks that SLayer still loads and searches a store after our worker
wrote parts). The cache directory is ours and derived: deleting it costs re-embedding, nothing
else; with the cache off (``SLAYER_LSP_CACHE=off``) parts live in memory only.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from slayer_lsp.embed.facets import facet_texts
from slayer_lsp.embed.text import EmbedItem
from slayer_lsp.store import documents as d

if TYPE_CHECKING:
    from slayer_lsp.catalog import Catalog, Delta

PART_SEP = "#"
PARTS_FILE = "parts.db"
PARTS_TABLE = "part_vectors"
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
    items = [EmbedItem(part_id(canonical, facet), part_kind(ent.kind, facet), text)
             for facet, text in facet_texts(ent.obj).items()]
    if isinstance(ent.obj, d.Memory):  # a memory's pieces: what its dense matching compares (search/pieces.py)
        from slayer_lsp.search.pieces import piece_texts

        items += [EmbedItem(part_id(canonical, f"p{n}"), PIECE_KIND, text)
                  for n, text in enumerate(piece_texts(ent.obj))]
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


def feed_parts(worker: Any, catalog: Catalog, delta: Delta) -> None:
    """Bring the part worker in step with a catalog change: each touched entity gets its current
    set of parts (unchanged texts are skipped by hash, parts it no longer has are dropped); a
    removed entity's parts leave the index and the table, a hidden one's the index only."""
    gone: dict[str, bool] = {}  # removed roots -> whether from the table too
    for cid in sorted(delta.touched):  # "ds.m" before "ds.m.c": a removed owner takes its leaves along
        ent = catalog.get(cid)
        if ent is None or ent.hidden:
            from_store = cid in delta.removed
            if not _covered(cid, gone, from_store):
                gone[cid] = from_store
                worker.remove(cid, from_store=from_store)
        else:
            worker.set_parts(cid, parts_for(catalog, cid))


def _covered(cid: str, gone: dict[str, bool], from_store: bool) -> bool:
    """Whether removing an ancestor already removed ``cid``'s parts (from the table too, if needed)."""
    head = cid
    while "." in head:
        head = head.rpartition(".")[0]
        if head in gone and (gone[head] or not from_store):
            return True
    return False


def part_store(location: Any) -> Any:
    """Where part vectors of a store live: ``parts.db`` in its cache directory, or nowhere (a
    ``MemoryStore``) when the cache is off."""
    from slayer_lsp.cache import cache_dir
    from slayer_lsp.embed.store import MemoryStore, VectorStore
    from slayer_lsp.store.locate import StoreLocation, locate

    loc = location if isinstance(location, StoreLocation) else locate(str(location))
    root = cache_dir(loc)
    if root is None:
        return MemoryStore()
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError:
        return MemoryStore()
    return VectorStore(root / PARTS_FILE, create=True, table=PARTS_TABLE, kinds=None, separators=SEPARATORS)
