"""Point lookups: everything the catalog knows about one reference, in plain data.

Shared by ``slayer-lsp inspect`` and the daemon's ``slayer/inspect``; a reference is anything the
resolver accepts (``orders.amount``, ``sum(orders.amount)``, ``memory:3``), so the CLI takes what a
user would type.
"""

from __future__ import annotations

from typing import Any

import msgspec

from slayer_lsp.catalog import Catalog
from slayer_lsp.catalog.ids import memory_id_of
from slayer_lsp.store import documents as d
from slayer_lsp.texts import render


class TagInfo(msgspec.Struct, kw_only=True):
    tag: str
    stale: bool


class InspectItem(msgspec.Struct, kw_only=True, omit_defaults=True):
    ref: str
    canonical: str | None = None
    kind: str | None = None
    hidden: bool = False
    description: str | None = None
    text: str | None = None  # the rendered search text
    samples: list[str] | None = None
    distinct_count: int | None = None
    learning: str | None = None
    tags: list[TagInfo] | None = None
    query: dict[str, Any] | None = None
    created_at: str | None = None
    source: str | None = None  # file path, or "path [table row]"
    warnings: list[str] = []
    error: str | None = None


def inspect_ref(catalog: Catalog, ref: str) -> InspectItem:
    from slayer_lsp.query.resolver import EntityResolutionError, resolve_entity

    try:
        res = resolve_entity(ref, catalog)
    except EntityResolutionError as exc:
        return InspectItem(ref=ref, error=str(exc))
    ent = catalog.get(res.canonical)
    if ent is None:
        return InspectItem(ref=ref, canonical=res.canonical, error=f"'{res.canonical}' is not in the store.")
    doc = render.render_entity(catalog, res.canonical)
    item = InspectItem(
        ref=ref,
        canonical=res.canonical,
        kind=ent.kind,
        hidden=ent.hidden,
        description=ent.description,
        text=doc.text if doc else None,
        source=str(ent.source),
        warnings=list(res.warnings),
    )
    obj = ent.obj
    if isinstance(obj, d.Column):
        item.samples = (
            list(obj.sampled_values)
            if obj.sampled_values is not None
            else ([obj.sampled] if obj.sampled else None)
        )
        item.distinct_count = obj.distinct_count
    elif isinstance(obj, d.Memory):
        valid = catalog.valid_canonicals
        item.learning = obj.learning
        item.tags = [TagInfo(tag=t, stale=t not in valid) for t in obj.entities]
        item.query = obj.query
        item.created_at = obj.created_at
        from slayer_lsp.query.references import stale_query_warning

        if (w := stale_query_warning(catalog, obj)) is not None:
            item.warnings.append(w)
    return item


def inspect_refs(catalog: Catalog, refs: list[str]) -> list[InspectItem]:
    return [inspect_ref(catalog, r) for r in refs]


def format_text(item: InspectItem) -> str:
    """The CLI's human-readable block for one item."""
    if item.error is not None:
        return f"{item.ref}: error: {item.error}"
    head = f"{item.kind} {item.canonical}" + ("  (hidden)" if item.hidden else "")
    lines = [head, "-" * len(head)]
    if item.kind == "memory" and item.canonical:
        lines.append(f"id: {memory_id_of(item.canonical)}   created: {item.created_at}")
        if item.description:
            lines.append(f"description: {item.description}")
        lines.append("learning:")
        lines.extend("  " + ln for ln in (item.learning or "").splitlines())
        if item.tags:
            lines.append("tags: " + ", ".join(t.tag + (" (stale)" if t.stale else "") for t in item.tags))
        if item.query is not None:
            lines.append(
                "query: "
                + msgspec.json.encode(
                    {k: v for k, v in item.query.items() if v not in (None, [], {})}
                ).decode()
            )
    else:
        lines.extend((item.text or "").splitlines())
    if item.source:
        lines.append(f"source: {item.source}")
    lines.extend(f"warning: {w}" for w in item.warnings)
    return "\n".join(lines)
