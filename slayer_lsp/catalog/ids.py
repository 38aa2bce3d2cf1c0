"""Canonical entity ids: ``<ds>``, ``<ds>.<model>``, ``<ds>.<model>.<leaf>`` and ``memory:<id>``."""

from __future__ import annotations

MEMORY_PREFIX = "memory:"


def memory_ref(memory_id: str) -> str:
    return MEMORY_PREFIX + memory_id


def is_memory_ref(ref: str) -> bool:
    return ref.startswith(MEMORY_PREFIX)


def memory_id_of(ref: str) -> str:
    return ref[len(MEMORY_PREFIX):]


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


def parent_of(canonical: str) -> str | None:
    if is_memory_ref(canonical) or "." not in canonical:
        return None
    return canonical.rsplit(".", 1)[0]


def child_id(parent: str, name: str) -> str:
    """The id of ``name`` under ``parent``: ``ds`` + ``orders`` -> ``ds.orders``, and
    ``ds.orders`` + ``amount`` -> ``ds.orders.amount``."""
    return f"{parent}.{name}"


def datasource_of(canonical: str) -> str:
    """The datasource an entity id is rooted at (a datasource's id is its own)."""
    return canonical.split(".", 1)[0]


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


def is_model_id(canonical: str) -> bool:
    return not is_memory_ref(canonical) and depth_of(canonical) == 1


def is_leaf_id(canonical: str) -> bool:
    """A column, measure or aggregation id (``ds.model.leaf``)."""
    return not is_memory_ref(canonical) and depth_of(canonical) >= 2
