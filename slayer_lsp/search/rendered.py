"""Every searchable entity's text, rendered again at start only where its document changed.

Rendering a warehouse store (400,000 columns) and digesting every text for the full-text manifest
took 4 of a restart's 8 seconds, for texts that had not changed. ``rendered.msgpack`` in the store's
cache keeps each entity's text with two digests: the stored document's it came from (the reader's
``StoredDoc.digest``) and the text's (``fulltext.doc_digest``, what the index manifest compares). At
start an entity whose document digest is unchanged takes its text from the cache; every other one
is rendered. A datasource's text lists its models, so datasources are always rendered.

The cache is trusted only for the renderer, parsers and document types that wrote it: its
``renderer`` stamp is a digest of their source files, so an upgrade that changes any of them renders
everything again.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from functools import cache
from pathlib import Path

import msgspec

from slayer_lsp import __version__
from slayer_lsp.catalog import Catalog
from slayer_lsp.store import documents, fastyaml, reader
from slayer_lsp.store.cache import StoreCache
from slayer_lsp.texts import render
from slayer_lsp.texts.render import RenderedDoc

log = logging.getLogger(__name__)

FILE = "rendered.msgpack"


class CachedText(msgspec.Struct, array_like=True, frozen=True, gc=False):
    source: str  # digest of the stored document the entity came from
    digest: str  # digest of the text (fulltext.doc_digest)
    doc: RenderedDoc


class RenderedFile(msgspec.Struct):
    format: int
    store: str
    renderer: str
    texts: list[CachedText]


@cache
def renderer_stamp() -> str:
    """What the texts depend on besides the stored bytes: this version's renderer, document types and
    parsers (the same bytes may read differently after an upgrade)."""
    h = hashlib.blake2b(__version__.encode(), digest_size=12)
    for module in (render, documents, reader, fastyaml):
        h.update(Path(module.__file__ or "").read_bytes())
    return h.hexdigest()


def source_digests(catalog: Catalog) -> dict[reader.Source, str]:
    """Each stored document's digest by its source (what an entity records)."""
    return {doc.source: doc.digest for doc in catalog.docs.values()}


def render_all(
    catalog: Catalog, cache: StoreCache | None
) -> tuple[dict[str, RenderedDoc], dict[str, str], int]:
    """Every searchable entity's text in corpus order, the text digests known from the cache (by
    canonical), and how many entities the cache could have served but did not (rendered afresh)."""
    previous = _load(cache) if cache is not None else {}
    sources = source_digests(catalog) if previous else {}
    docs: dict[str, RenderedDoc] = {}
    known: dict[str, str] = {}
    fresh = 0
    get_entity, last_source, last_digest = catalog.entities.get, None, None
    for cid in catalog.searchable_ids():
        hit = previous.get(cid)
        if hit is not None:
            ent = get_entity(cid)
            if ent is not None and ent.kind != "datasource":
                if ent.source is not last_source:  # a model's leaves follow it: one lookup per document
                    last_source, last_digest = ent.source, sources.get(ent.source)
                if last_digest == hit.source:
                    docs[cid] = hit.doc
                    known[cid] = hit.digest
                    continue
        doc = render.render_entity(catalog, cid)
        if doc is not None:
            docs[cid] = doc
            fresh += doc.kind != "datasource"  # those are rendered every time
    return docs, known, fresh


def cache_file(catalog: Catalog, docs: Mapping[str, RenderedDoc], digests: Mapping[str, str]) -> RenderedFile:
    """What the next start reads back: ``docs`` (of ``catalog``) with their text ``digests``."""
    sources = source_digests(catalog)
    texts = []
    for cid, doc in docs.items():
        ent = catalog.get(cid)
        digest = digests.get(cid)
        if ent is None or digest is None or ent.kind == "datasource":
            continue
        source = sources.get(ent.source)
        if source is not None:
            texts.append(CachedText(source, digest, doc))
    return RenderedFile(0, "", renderer_stamp(), texts)


def _load(cache: StoreCache) -> dict[str, CachedText]:
    value = cache.read_file(FILE, RenderedFile)
    if value is None or value.renderer != renderer_stamp():
        return {}
    return {t.doc.canonical: t for t in value.texts}
