"""Navigation: where an entity is defined, who mentions it, and the symbols of a document.

Definitions point into the store: the YAML line of a model, column, measure or aggregation (found by
parsing the model file with the same scanner the editor uses), a datasource file, a memory file; for
a SQLite store, the database file with the table and row named in ``detail``. Store files are read
through a small cache keyed by (path, mtime, size), so repeated lookups do not re-parse.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from slayer_lsp.analysis import parsed_file as dm
from slayer_lsp.analysis.binding import bind_all, bind_ref
from slayer_lsp.analysis.hover import hides
from slayer_lsp.catalog import Catalog
from slayer_lsp.catalog.ids import memory_ref, name_of, parent_of
from slayer_lsp.store.reader import Source
from slayer_lsp.store.safefs import read_text_file


@dataclass(frozen=True, slots=True)
class LocationData:
    path: str  # a file path (the server turns it into a URI), or the URI of an open document
    span: dm.Span
    detail: str | None = None  # e.g. "models row 'jaffle.orders'" for a SQLite store


@dataclass(frozen=True, slots=True)
class SymbolData:
    """A workspace symbol: an entity found by search."""

    name: str
    kind: str
    container: str | None
    location: LocationData | None
    canonical: str


ReadText = Callable[[str], str | None]


class _FileCache:
    def __init__(self, size: int = 256):
        self.size = size
        self._lock = threading.Lock()
        self._data: dict[str, tuple[tuple[int, int], str, dict[str, dm.ParsedDocument]]] = {}

    def read(self, path: str) -> str | None:
        try:
            st = os.stat(path)
        except OSError:
            return None
        key = (st.st_mtime_ns, st.st_size)
        with self._lock:
            hit = self._data.get(path)
            if hit is not None and hit[0] == key:
                return hit[1]
        text = read_text_file(path)  # a store file swapped for a FIFO or a link is not followed
        if text is None:
            return None
        with self._lock:
            if len(self._data) >= self.size:
                self._data.pop(next(iter(self._data)))
            self._data[path] = (key, text, {})
        return text

    def parsed(self, path: str, kind: str) -> dm.ParsedDocument | None:
        text = self.read(path)
        if text is None:
            return None
        with self._lock:
            hit = self._data.get(path)
            if hit is not None and hit[1] == text and kind in hit[2]:
                return hit[2][kind]
        doc = dm.parse_document(text, kind, path)
        with self._lock:
            hit = self._data.get(path)
            if hit is not None and hit[1] == text:
                hit[2][kind] = doc
        return doc


FILES = _FileCache()


def _find_symbol(symbols: Iterable[dm.Symbol], kind: str, name: str) -> dm.Symbol | None:
    for s in symbols:
        if s.kind == kind and s.name == name:
            return s
    return None


def entity_location(catalog: Catalog, canonical: str) -> LocationData | None:
    """The definition of an entity in the store."""
    ent = catalog.get(canonical)
    if ent is None:
        return None
    src: Source = ent.source
    if src.table is not None:
        return LocationData(src.path, dm.Span(0, 0, 0), f"{src.table} row '{src.row}'")
    if ent.kind == "memory":
        return LocationData(src.path, dm.Span(0, 0, 0))
    kind = "datasource" if ent.kind == "datasource" else "model"
    doc = FILES.parsed(src.path, kind)
    if doc is None or not doc.symbols:
        return LocationData(src.path, dm.Span(0, 0, 0))
    top = doc.symbols[0]
    if ent.kind in ("datasource", "model"):
        return LocationData(src.path, top.selection)
    sym = _find_symbol(top.children, ent.kind, name_of(canonical))
    return LocationData(src.path, sym.selection if sym else top.selection)


def definition(doc: dm.ParsedDocument, line: int, col: int, catalog: Catalog) -> list[LocationData]:
    ref = doc.ref_at(line, col)
    if ref is None:
        return []
    b = bind_ref(doc, ref, catalog)
    if b.canonical is None or hides(catalog, b.canonical, ref.role):
        return []
    loc = entity_location(catalog, b.canonical)
    return [loc] if loc is not None else []


def target_at(doc: dm.ParsedDocument, line: int, col: int, catalog: Catalog) -> str | None:
    ref = doc.ref_at(line, col)
    if ref is None:
        return None
    return bind_ref(doc, ref, catalog).canonical


def _tag_spans(catalog: Catalog, memory_id: str, canonical: str) -> LocationData | None:
    mem_ent = catalog.get(memory_ref(memory_id))
    if mem_ent is None:
        return None
    src = mem_ent.source
    if src.table is not None:
        return LocationData(src.path, dm.Span(0, 0, 0), f"{src.table} row '{src.row}'")
    doc = FILES.parsed(src.path, "memory")
    if doc is not None:
        for r in doc.refs:
            if r.role == dm.ENTITY_TAG and r.text == canonical:
                return LocationData(src.path, r.span)
    return LocationData(src.path, dm.Span(0, 0, 0))


def references(
    canonical: str,
    catalog: Catalog,
    open_docs: Mapping[str, dm.ParsedDocument],
    *,
    include_declaration: bool = False,
) -> list[LocationData]:
    """Memories that tag the entity (at the tag's line) and open documents that mention it (each
    mention). ``open_docs`` maps a document's URI to its parse; their locations carry the URI."""
    out: list[LocationData] = []
    if include_declaration:
        loc = entity_location(catalog, canonical)
        if loc is not None:
            out.append(loc)
    for mid in catalog.memory_order:
        mem = catalog.memory(mid)
        if mem is not None and canonical in mem.entities:
            loc = _tag_spans(catalog, mid, canonical)
            if loc is not None:
                out.append(loc)
    for uri, doc in open_docs.items():
        for b in bind_all(doc, catalog):
            if b.canonical == canonical and b.ref.role != dm.DEFINITION:
                out.append(LocationData(uri, b.ref.span))
    seen: set[tuple[str, dm.Span]] = set()
    unique = []
    for loc in out:
        if (loc.path, loc.span) not in seen:
            seen.add((loc.path, loc.span))
            unique.append(loc)
    return unique


def document_symbols(doc: dm.ParsedDocument) -> tuple[dm.Symbol, ...]:
    return doc.symbols


def workspace_symbols(
    catalog: Catalog, hits: Iterable[tuple[str, str]], *, locate: bool = True
) -> list[SymbolData]:
    """Symbols for search hits ``(kind, id)`` (a memory hit's id is the bare memory id)."""
    out = []
    for kind, hid in hits:
        canonical = memory_ref(hid) if kind == "memory" else hid
        ent = catalog.get(canonical)
        if ent is None:
            continue
        container = parent_of(canonical)
        loc = entity_location(catalog, canonical) if locate else None
        out.append(SymbolData(canonical, ent.kind, container, loc, canonical))
    return out
