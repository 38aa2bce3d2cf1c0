"""Inlay hints: the canonical id a bare or relative name of a query resolves to (``status`` ->
``jaffle.orders.status``), so the reader sees what SLayer will read without hovering."""

from __future__ import annotations

from dataclasses import dataclass

from slayer_lsp.analysis import parsed_file as dm
from slayer_lsp.analysis.binding import bind_all
from slayer_lsp.analysis.hover import hides
from slayer_lsp.catalog import Catalog

HINT_ROLES = dm.QUERY_ROLES | {dm.FUNCTION}


@dataclass(frozen=True, slots=True)
class InlayData:
    line: int
    col: int  # code points: the end of the reference
    label: str
    canonical: str


def inlay_hints(
    doc: dm.ParsedDocument, catalog: Catalog, first_line: int = 0, last_line: int | None = None
) -> list[InlayData]:
    """One hint per query reference (and custom aggregation call) in the line range whose text is
    not already its canonical id. Hidden entities get none (they answer like missing ones)."""
    if doc.kind not in ("query", "memory"):
        return []
    out = []
    for b in bind_all(doc, catalog):
        ref = b.ref
        if ref.role not in HINT_ROLES or b.canonical is None or ref.text == b.canonical:
            continue
        if ref.span.line < first_line or (last_line is not None and ref.span.line > last_line):
            continue
        if hides(catalog, b.canonical, ref.role):
            continue
        out.append(InlayData(ref.span.line, ref.span.end, f"→ {b.canonical}", b.canonical))
    out.sort(key=lambda h: (h.line, h.col))
    return out
