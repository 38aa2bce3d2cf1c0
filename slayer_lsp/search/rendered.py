"""Every searchable entity's text, rendered again at start only where its document changed.

Rendering a warehouse store (400,000 columns) and digesting every text for the full-text manifest
took 4 of a restart's 8 seconds, for texts that had not changed. ``rendered.msgpack`` in the store's
cache keeps the texts grouped by the stored document they came from, with that document's digest
(the reader's ``StoredDoc.digest``) and each text's digest (``fulltext.doc_digest``, what the index
manifest compares). At start a document whose digest is unchanged gives back all its texts at once;
every other entity is rendered. A datasource's text lists its models, so datasources are always
rendered.

The cache is trusted only for the renderer, parsers and document types that wrote it: its
``renderer`` stamp is a digest of their source files, so an upgrade that changes any of them renders
everything again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping

import msgspec

from slayer_lsp.catalog import Catalog
from slayer_lsp.store import blockyaml, documents, fastyaml, reader, yamlscalar
from slayer_lsp.store.cache import StoreCache, code_stamp
from slayer_lsp.texts import render
from slayer_lsp.texts.render import RenderedDoc

log = logging.getLogger(__name__)

FILE = "rendered.msgpack"


class CachedDoc(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """The texts of one stored document's searchable entities (a model and its visible leaves, or a
    memory), in corpus order: taken back whole when the document is unchanged, with two C calls
    rather than a Python step per entity (400,000 of them at 10,000 models)."""

    source: str  # digest of the stored document the entities came from
    ids: tuple[str, ...]  # their canonical ids, as ``docs`` holds them
    digests: list[str]  # each text's digest (fulltext.doc_digest)
    docs: list[RenderedDoc]


class RenderedFile(msgspec.Struct):
    format: int
    store: str
    renderer: str
    texts: dict[str, CachedDoc]  # by the canonical id of each document's first entity
    # the full-text index (directory, commit) that held exactly these texts when they were written:
    # while the manifest still names that commit, a restart need not compare their digests with it
    index: str = ""
    opstamp: int = -1


def renderer_stamp() -> str:
    """What the texts depend on besides the stored bytes: this version's renderer, document types and
    parsers."""
    return code_stamp(render, documents, reader, fastyaml, blockyaml, yamlscalar)


def source_digests(catalog: Catalog) -> dict[reader.Source, str]:
    """Each stored document's digest by its source (what an entity records)."""
    return {doc.source: doc.digest for doc in catalog.docs.values()}


class Rendering:
    """Every searchable entity's text in corpus order, produced one at a time: iterating it renders
    (or takes back from the cache) the next text and records it in ``docs``. A cold start hands it to
    the full-text build as it is, so tantivy's indexing thread indexes one text while the next is
    rendered (at 10,000 models the two took 3 s and 8 s one after the other).

    After a complete pass: ``docs`` (canonical -> text), ``known`` (the text digests the cache gave
    back, by canonical) and ``fresh`` (how many entities the cache could have served but did not)."""

    def __init__(self, catalog: Catalog, cache: StoreCache | None) -> None:
        self.catalog = catalog
        self.docs: dict[str, RenderedDoc] = {}
        self._given: list[CachedDoc] = []  # the groups the cache gave back
        self.fresh = 0
        loaded = _load(cache) if cache is not None else None
        self._previous = loaded.texts if loaded is not None else {}
        # the index commit that holds every text the cache gives back, as the cache gave it
        self.indexed_at = (loaded.index, loaded.opstamp) if loaded is not None and loaded.index else None
        self.rendered: list[str] = []  # what was rendered afresh (not given back), in corpus order
        self._stream: Iterator[RenderedDoc] | None = None

    def __iter__(self) -> Iterator[RenderedDoc]:
        """The texts not yet produced (a second pass continues where the first stopped)."""
        if self._stream is None:
            self._stream = self._render(emit=True)
        return self._stream

    def _render(self, *, emit: bool) -> Iterator[RenderedDoc]:
        """Records every text; ``emit``: also yields each (else nothing, so a restart that takes
        400,000 texts back from the cache does not step through them one by one: 0.3 s)."""
        catalog, previous, docs, given = self.catalog, self._previous, self.docs, self._given
        sources = source_digests(catalog) if previous else {}
        ids = catalog.searchable_ids()
        get_entity, at, end = catalog.entities.get, 0, len(ids)
        while at < end:
            cid = ids[at]
            group = previous.get(cid)
            if group is not None:
                ent = get_entity(cid)
                stop = at + len(group.ids)
                # the document is unchanged, and so are the ids it yields (a tuple compare in C)
                if ent is not None and sources.get(ent.source) == group.source and ids[at:stop] == group.ids:
                    docs.update(zip(group.ids, group.docs, strict=True))
                    given.append(group)
                    if emit:
                        yield from group.docs
                    at = stop
                    continue
            doc = render.render_entity(catalog, cid)
            if doc is not None:
                docs[cid] = doc
                self.rendered.append(cid)
                self.fresh += doc.kind != "datasource"  # those are rendered every time
                if emit:
                    yield doc
            at += 1

    @property
    def known(self) -> dict[str, str]:
        """The text digests the cache gave back, by canonical: only a restart whose index is not
        the one the texts were written with compares them (a dict of 400,000 made only then)."""
        known: dict[str, str] = {}
        for group in self._given:
            known.update(zip(group.ids, group.digests, strict=True))
        return known

    def finish(self) -> Rendering:
        """Render whatever iterating has not reached yet (all of it when nobody iterated)."""
        for _ in self._stream if self._stream is not None else self._render(emit=False):
            pass
        self._stream = iter(())
        return self


def cache_file(
    catalog: Catalog,
    docs: Mapping[str, RenderedDoc],
    digest_of: Callable[[str], str | None],
    index: tuple[str, int] | None = None,
) -> RenderedFile:
    """What the next start reads back: ``docs`` (of ``catalog``, in corpus order) with their text
    digests (``digest_of`` a canonical), grouped by the stored document each came from. A datasource's text lists its models,
    so datasources are left out (always rendered). ``index``: the full-text index commit (directory,
    opstamp) that holds exactly ``docs`` with ``digests``."""
    sources = source_digests(catalog)
    texts: dict[str, CachedDoc] = {}
    group: list[tuple[str, str, RenderedDoc]] = []
    group_source = group_digest = None

    def close() -> None:
        if group and group_digest is not None:
            ids, hashes, values = zip(*group, strict=True)
            texts[ids[0]] = CachedDoc(group_digest, ids, list(hashes), list(values))
        group.clear()

    for cid, doc in docs.items():
        ent = catalog.get(cid)
        digest = digest_of(cid)
        if ent is None or digest is None or ent.kind == "datasource":
            close()
            group_source = group_digest = None
            continue
        if ent.source != group_source:
            close()
            group_source, group_digest = ent.source, sources.get(ent.source)
        group.append((cid, digest, doc))
    close()
    directory, opstamp = index if index is not None else ("", -1)
    return RenderedFile(0, "", renderer_stamp(), texts, directory, opstamp)


def _load(cache: StoreCache) -> RenderedFile | None:
    value = cache.read_file(FILE, RenderedFile)
    if value is None or value.renderer != renderer_stamp():
        return None
    texts = value.texts
    if any(len(t.ids) != len(t.docs) or len(t.ids) != len(t.digests) for t in texts.values()):
        log.warning("discarding a broken cache file %s: groups of unequal lengths", cache.root / FILE)
        return None
    return value
