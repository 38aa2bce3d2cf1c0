"""Canonical entity ids: ``<ds>``, ``<ds>.<model>``, ``<ds>.<model>.<leaf>`` and ``memory:<id>``.

Names never contain dots, so a dotted id is built by joining its names; everything that takes an
id apart or asks what it is does it here, where memory refs and short ids are handled once."""

from __future__ import annotations

from functools import lru_cache

# The parsers below are pure and a search asks them about the same few thousand ids many times
# (~3,600 calls per search at 1,000 models): answered from a bounded cache, a search took 8% less.
_IDS = 1 << 15

MEMORY_PREFIX = "memory:"


def memory_ref(memory_id: str) -> str:
    return MEMORY_PREFIX + memory_id


def is_memory_ref(ref: str) -> bool:
    return ref.startswith(MEMORY_PREFIX)


def memory_id_of(ref: str) -> str:
    return ref[len(MEMORY_PREFIX) :]


def rooted_at(canonical: str, datasource: str) -> bool:
    """True when ``canonical`` is the datasource itself or a dotted descendant (never a character
    prefix: ``prod_v2.x`` is not rooted at ``prod``). Memory refs are never rooted."""
    if is_memory_ref(canonical):
        return False
    return canonical == datasource or canonical.startswith(datasource + ".")


def is_descendant_or_self(canonical: str, root: str) -> bool:
    """Exact id or strict dotted descendant; used for cascades and scope checks."""
    return canonical == root or canonical.startswith(root + ".")


def split_canonical(canonical: str) -> tuple[str, str | None, str | None]:
    """``ds.model.leaf`` -> (ds, model, leaf); names never contain dots, so this is unambiguous."""
    parts = canonical.split(".", 2)
    return parts[0], (parts[1] if len(parts) > 1 else None), (parts[2] if len(parts) > 2 else None)


@lru_cache(maxsize=_IDS)
def parent_of(canonical: str) -> str | None:
    if is_memory_ref(canonical) or "." not in canonical:
        return None
    return canonical.rsplit(".", 1)[0]


def child_id(parent: str, name: str) -> str:
    """The id of ``name`` under ``parent``: ``ds`` + ``orders`` -> ``ds.orders``, and
    ``ds.orders`` + ``amount`` -> ``ds.orders.amount``."""
    return f"{parent}.{name}"


@lru_cache(maxsize=_IDS)
def datasource_of(canonical: str) -> str:
    """The datasource an entity id is rooted at (a datasource's id is its own)."""
    return canonical.split(".", 1)[0]


@lru_cache(maxsize=_IDS)
def model_of(canonical: str) -> str | None:
    """``ds.model`` of a model or leaf id; None for a datasource id or a memory ref."""
    if is_memory_ref(canonical):
        return None
    ds, model, _ = split_canonical(canonical)
    return None if model is None else child_id(ds, model)


def depth_of(canonical: str) -> int:
    """0 for a datasource id, 1 for a model, 2 for a leaf; more only when a name holds a dot (a tag
    SLayer's graph does not resolve)."""
    return canonical.count(".")


@lru_cache(maxsize=_IDS)
def is_model_id(canonical: str) -> bool:
    return not is_memory_ref(canonical) and depth_of(canonical) == 1


@lru_cache(maxsize=_IDS)
def is_leaf_id(canonical: str) -> bool:
    """A column, measure or aggregation id (``ds.model.leaf``)."""
    return not is_memory_ref(canonical) and depth_of(canonical) >= 2


def lineage(canonical: str) -> list[str]:
    """The id's ancestors from its datasource down, then the id: ``a.b.c`` -> [a, a.b, a.b.c]; a
    memory ref, which has no ancestors, is alone in its lineage."""
    if is_memory_ref(canonical):
        return [canonical]
    ds, model, leaf = split_canonical(canonical)
    out = [ds]
    if model is not None:
        out.append(f"{ds}.{model}")
    if leaf is not None:
        out.append(canonical)
    return out


def split_model_id(model_id: str) -> tuple[str, str]:
    """``ds.model`` -> (ds, model)."""
    ds, _, name = model_id.partition(".")
    return ds, name


def name_of(canonical: str) -> str:
    """An entity's own name: the last segment (``ds.model.leaf`` -> ``leaf``); a memory's id."""
    if is_memory_ref(canonical):
        return memory_id_of(canonical)
    return canonical.rpartition(".")[2]


def with_name(canonical: str, name: str) -> str:
    """The id the entity would have under another name: its parent kept, its own name replaced."""
    parent = parent_of(canonical)
    return name if parent is None else f"{parent}.{name}"
