"""What the memory ranking holds per memory: read from the catalog, or taken back from the last run.

A memory's pieces (``texts.pieces``), the words of what it is tagged with (its *about* text) and
the stems of its prose (``memory_terms``) come from its own stored document only. Cutting 20,000
memories into pieces and stemming them took ~2 s of the first search after every start, for
memories that had not changed. ``memories.msgpack`` in the store's cache keeps each memory's values
with its document's digest; at start an unchanged memory's come back as they were, and only the
others are read.

Trusted only for the code that computed it (``code_stamp`` of the modules below and the readers).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from dataclasses import dataclass

import msgspec

from slayer_lsp.catalog import Catalog
from slayer_lsp.search import memory_terms, name_stems, piece_index
from slayer_lsp.store import blockyaml, documents, fastyaml, reader, yamlscalar
from slayer_lsp.store.cache import StoreCache, code_stamp
from slayer_lsp.store.reader import DocKey
from slayer_lsp.texts import pieces, words

log = logging.getLogger(__name__)

FILE = "memories.msgpack"


class SavedMemory(msgspec.Struct, array_like=True, frozen=True, gc=False):
    source: str  # digest of the memory's stored document
    pieces: tuple[str, ...]
    about: str
    stems: list[str]


class MemoryFile(msgspec.Struct):
    format: int
    store: str
    code: str
    memories: dict[str, SavedMemory]  # by memory id


def code() -> str:
    """What the values depend on besides the stored bytes."""
    return code_stamp(
        sys.modules[__name__],
        pieces,
        words,
        piece_index,
        memory_terms,
        name_stems,
        documents,
        reader,
        fastyaml,
        blockyaml,
        yamlscalar,
    )


@dataclass(frozen=True, slots=True)
class MemoryEntry:
    pieces: tuple[str, ...]
    about: str  # the words of its entity tags (``piece_index.about_text``)
    stems: frozenset[str]  # the distinct stems of its prose (``memory_terms.memory_stems``)


@dataclass(frozen=True)
class MemoryEntries:
    """Every memory's values, in the catalog's memory order, and how many were read afresh."""

    by_memory: Mapping[str, MemoryEntry]
    fresh: int


def read_entries(catalog: Catalog, saved: MemoryFile | None = None) -> MemoryEntries:
    """Every memory's values: taken from ``saved`` when its document is unchanged, else read."""
    kept = saved.memories if saved is not None else {}
    docs = catalog.docs
    out: dict[str, MemoryEntry] = {}
    fresh = 0
    intern = sys.intern
    for mid, mem in catalog.memories.items():
        old = kept.get(mid)
        doc = docs.get(DocKey("memory", mid))
        if old is not None and doc is not None and old.source == doc.digest:
            out[mid] = MemoryEntry(old.pieces, old.about, frozenset(map(intern, old.stems)))
        else:
            out[mid] = MemoryEntry(
                tuple(pieces.piece_texts(mem)),
                piece_index.about_text(mem.entities),
                memory_terms.memory_stems(mem),
            )
            fresh += 1
    return MemoryEntries(out, fresh)


def load(cache: StoreCache) -> MemoryFile | None:
    """The last run's file, when this code wrote it."""
    value = cache.read_file(FILE, MemoryFile)
    return value if value is not None and value.code == code() else None


def file_of(catalog: Catalog, entries: MemoryEntries) -> MemoryFile:
    """What the next start takes back: each memory's values with its document's digest."""
    docs = catalog.docs
    saved: dict[str, SavedMemory] = {}
    for mid, entry in entries.by_memory.items():
        doc = docs.get(DocKey("memory", mid))
        if doc is not None:
            saved[mid] = SavedMemory(doc.digest, entry.pieces, entry.about, sorted(entry.stems))
    return MemoryFile(0, "", code(), saved)
