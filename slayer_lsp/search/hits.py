"""Hits: what a ranked id comes back as, and the named inputs' own entity ranking.

Both rankings end here. An entity hit is its rendered document; a memory hit is the whole memory
(never the piece that matched) with the inputs among its live tags as ``matched_entities``. With
``compact`` the text is left out and a memory carries its short description.
"""

from __future__ import annotations

from collections.abc import Callable

from slayer_lsp.catalog import Catalog
from slayer_lsp.catalog.ids import is_memory_ref, memory_id_of, memory_ref, rooted_at
from slayer_lsp.search.indexes import SearchIndexes
from slayer_lsp.search.types import SearchHit
from slayer_lsp.store import documents as d
from slayer_lsp.texts import render


def named_ranking(
    catalog: Catalog, inputs: list[str], ds: str | None, candidate_ids: frozenset[str] | None
) -> tuple[list[str], list[str]]:
    """Each named entity surfaces as itself (channel 1's entity side), unless a filter drops it."""
    ranking: list[str] = []
    warnings: list[str] = []
    for c in inputs:
        if is_memory_ref(c):
            continue
        if candidate_ids is not None and c not in candidate_ids:
            warnings.append(f"entity {c!r} excluded by cypher_filter.")
            continue
        if ds is not None and not rooted_at(c, ds):
            warnings.append(f"entity {c!r} is not rooted at datasource {ds!r}; dropped from entities bucket.")
            continue
        ent = catalog.get(c)
        if ent is None:
            warnings.append(
                f"entity {c!r} resolved but is no longer present in storage; dropped from entities bucket."
            )
            continue
        if ent.hidden:
            where = "model" if ent.model is not None and ent.model.hidden else "column"
            warnings.append(f"entity {c!r} is on a hidden {where}; dropped from entities bucket.")
            continue
        ranking.append(c)
    return ranking, warnings


def search_hit(
    catalog: Catalog,
    indexes: SearchIndexes,
    key: str,
    score: float,
    inputs: list[str],
    valid: Callable[[str], bool],
    candidate_ids: frozenset[str] | None,
    kind_filter: set[str] | None,
    compact: bool,
) -> SearchHit | None:
    """The hit of one ranked id (an entity or ``memory:<id>``), or None when the cypher filter,
    the kinds asked for or the current documents leave it out."""
    if candidate_ids is not None and key not in candidate_ids:
        return None
    if is_memory_ref(key):
        if kind_filter is not None and "memory" not in kind_filter:
            return None
        mem = catalog.memory(memory_id_of(key))
        return memory_hit(mem, score, inputs, valid, compact) if mem is not None else None
    doc = indexes.docs.get(key)
    if doc is None:
        return None
    if kind_filter is not None and doc.kind not in kind_filter:
        return None
    return SearchHit(
        kind=doc.kind, id=key, score=score, text="" if compact else doc.text, description=doc.description
    )


def memory_hit(
    mem: d.Memory, score: float, inputs: list[str], valid: Callable[[str], bool], compact: bool
) -> SearchHit:
    """A memory answered whole; ``matched_entities``: the inputs among its live tags and itself."""
    live = [t for t in mem.entities if valid(t)]
    live.append(memory_ref(mem.id))
    matched = sorted(set(inputs) & set(live)) if inputs else []
    if compact:
        return SearchHit(
            kind="memory",
            id=mem.id,
            score=score,
            text="",
            description=render.compact_description(mem),
            matched_entities=matched,
            query=mem.query,
        )
    return SearchHit(
        kind="memory",
        id=mem.id,
        score=score,
        text=render.memory_text(mem),
        description=mem.description,
        matched_entities=matched,
        query=mem.query,
    )
