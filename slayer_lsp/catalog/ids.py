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
