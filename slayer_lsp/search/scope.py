"""The datasource scope of a search: which documents, memories and tags a ``datasource`` keeps.

SLayer filters by datasource before it ranks, so BM25 statistics, tag corpora and hits' matched
tags come from the scope alone. The indexes (per-datasource corpora) and both rankings apply these
same rules.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from slayer_lsp.catalog import Catalog
from slayer_lsp.catalog.ids import datasource_of, is_memory_ref, memory_id_of, rooted_at
from slayer_lsp.store import documents as d


def doc_scopes(catalog: Catalog, canonical: str) -> set[str]:
    """The datasources whose filtered corpus holds this document."""
    if is_memory_ref(canonical):
        mem = catalog.memory(memory_id_of(canonical))
        return set() if mem is None else memory_scopes(catalog, mem)
    return {datasource_of(canonical)}


def memory_scopes(catalog: Catalog, mem: d.Memory) -> set[str]:
    """The datasources a memory's tags are rooted at (``rooted_at``: the tag itself, or its part
    before a dot): the prefixes of each tag looked up, not every datasource tried on every tag."""
    datasources = catalog.datasources
    out: set[str] = set()
    for tag in mem.entities:
        if is_memory_ref(tag):
            continue
        if tag in datasources:
            out.add(tag)
        dot = tag.find(".")
        while dot != -1:
            if tag[:dot] in datasources:
                out.add(tag[:dot])
            dot = tag.find(".", dot + 1)
    return out


def scoped_memories(catalog: Catalog, datasource: str | None) -> list[d.Memory]:
    """The memories a datasource filter keeps (a tag rooted at it), in storage order."""
    mems = list(catalog.memories.values())
    if datasource is None:
        return mems
    return [m for m in mems if any(rooted_at(t, datasource) for t in m.entities)]


def tag_validity(
    catalog: Catalog, datasource: str | None, memory_ids: Collection[str]
) -> Callable[[str], bool]:
    """Which tags count in a scope: existing entities (hidden included) rooted at the datasource,
    and refs to memories that are themselves in scope."""
    entities = catalog.entities

    def valid(tag: str) -> bool:
        if is_memory_ref(tag):
            return memory_id_of(tag) in memory_ids
        return tag in entities and (datasource is None or rooted_at(tag, datasource))

    return valid
