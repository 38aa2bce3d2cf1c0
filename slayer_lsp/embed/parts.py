"""Part vectors: vectors of pieces of an entity, besides its one vector per canonical id.

What a part is, and its id and kind, is ``texts/parts.py``.

Part vectors are embedded by the dense channel's worker in a lane of their own
(``EmbeddingWorker.parts``, after every entity), and stored in a table of our own, ``part_vectors``
of ``parts.db`` in the store's slayer-lsp cache directory, never in SLayer's ``embeddings`` table:

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

from typing import TYPE_CHECKING, Any

from slayer_lsp.texts.parts import SEPARATORS, parts_for

if TYPE_CHECKING:
    from slayer_lsp.catalog import Catalog, Delta

PARTS_FILE = "parts.db"
PARTS_TABLE = "part_vectors"


def feed_parts(worker: Any, catalog: Catalog, delta: Delta) -> None:
    """Bring the part lane in step with a catalog change: each touched entity gets its current
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
    from slayer_lsp.embed.store import MemoryStore, VectorStore
    from slayer_lsp.store.cache import cache_dir
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
