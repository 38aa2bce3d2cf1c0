"""Channel 2: a tantivy full-text index over the rendered documents, kept warm and updated per document.

One in-RAM index holds the documents of one corpus (the whole store, or one datasource's subset so
that BM25 statistics come from that subset, as SLayer's pre-filter requires). Documents are replaced
by deleting their ``id`` term and adding them again; a commit makes a batch visible at once.

Unlike SLayer, a question never fails to parse: tantivy's lenient parser handles apostrophes,
parentheses, colons and comparisons, and a question whose literal canonical id or ``memory:<id>``
names a document puts that document first (the ``canonical`` field is really queried).
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import tantivy

from slayer_lsp.catalog.ids import MEMORY_PREFIX
from slayer_lsp.search.fastfields import u64_values
from slayer_lsp.texts.render import RenderedDoc

log = logging.getLogger(__name__)

# Canonical-looking tokens in a question: dotted identifiers and memory refs.
_CANONICAL_TOKEN = re.compile(re.escape(MEMORY_PREFIX) + r"[^\s,;()\"'`]+|[A-Za-z_][\w-]*(?:\.[A-Za-z_][\w-]*){0,2}")
_UNSAFE_CHARS = re.compile(r"[^\w\s.-]+")


def _schema() -> tantivy.Schema:
    builder = tantivy.SchemaBuilder()
    builder.add_text_field("id", stored=False, tokenizer_name="raw")
    builder.add_unsigned_field("key", stored=False, indexed=False, fast=True)
    builder.add_text_field("kind", stored=False, tokenizer_name="raw")
    builder.add_text_field("canonical", stored=False, tokenizer_name="raw")
    builder.add_text_field("text", stored=False, tokenizer_name="en_stem")
    return builder.build()


def doc_digest(doc: RenderedDoc) -> str:
    return hashlib.blake2b(f"{doc.kind}\n{doc.text}".encode(), digest_size=12).hexdigest()


@dataclass(frozen=True, slots=True)
class TextHit:
    canonical: str
    score: float


class FullTextIndex:
    """A warm tantivy index over one corpus of rendered documents."""

    def __init__(self, docs: Iterable[RenderedDoc] = (), *, path: Path | None = None,
                 _state: tuple[list[str], dict[str, tuple[str, int, str]]] | None = None):
        """An index over ``docs``, in RAM or (``path``) in a directory that a later start reopens."""
        self._schema = _schema()
        self.path = path
        if path is None:
            self._index = tantivy.Index(self._schema)
        else:
            self._index = tantivy.Index(self._schema, path=str(path), reuse=_state is not None)
        self._writer = self._index.writer(heap_size=64_000_000, num_threads=1)
        self._opstamp = self._writer.commit_opstamp  # the writer reports only the opstamp it opened at
        self._lock = threading.Lock()
        self.kind_counts: dict[str, int] = {"memory": 0, "entity": 0}
        self._members: dict[str, str] = {}  # canonical -> "memory" | "entity"
        self._keys: dict[str, int] = {}  # canonical -> u64 fast-field key (hits map back without doc fetches)
        self._names: list[str] = []
        self._digests: dict[str, str] = {}  # canonical -> digest of the indexed text
        self.deletions = 0  # deleted documents still weigh in tantivy's statistics until a rebuild
        if _state is not None:
            self._names = list(_state[0])
            self._keys = {n: i for i, n in enumerate(self._names)}
            for cid, (group, _key, digest) in _state[1].items():
                self._members[cid] = group
                self._digests[cid] = digest
                self.kind_counts[group] += 1
            self._index.reload()
        self.upsert(docs)

    @classmethod
    def reopen(cls, path: Path, names: list[str], members: dict[str, tuple[str, int, str]],
               opstamp: int) -> FullTextIndex | None:
        """Reopen a cached index when it is exactly the one its manifest describes; else None."""
        try:
            index = cls(path=path, _state=(names, members))
        except (ValueError, OSError) as exc:  # locked by another process, or damaged
            log.info("cached full-text index at %s not reusable: %s", path, exc)
            return None
        if index._opstamp != opstamp or index._index.searcher().num_docs != len(members):
            log.info("cached full-text index at %s does not match its manifest; rebuilding", path)
            return None
        return index

    def sync(self, docs: dict[str, RenderedDoc]) -> None:
        """Make the index hold exactly ``docs``, touching only documents whose text changed."""
        self.replace([c for c in self._members if c not in docs],
                     [doc for cid, doc in docs.items() if self._digests.get(cid) != doc_digest(doc)])

    def manifest(self) -> tuple[int, list[str], dict[str, tuple[str, int, str]]]:
        with self._lock:
            return (self._opstamp, list(self._names),
                    {c: (g, self._keys[c], self._digests[c]) for c, g in self._members.items()})

    def __contains__(self, canonical: str) -> bool:
        return canonical in self._members

    def __len__(self) -> int:
        return len(self._members)

    def upsert(self, docs: Iterable[RenderedDoc]) -> None:
        """Add or replace documents, then commit (one commit per batch)."""
        self.replace((), docs)

    def _add_locked(self, doc: RenderedDoc) -> None:
        self._delete_locked(doc.canonical)
        tdoc = tantivy.Document()
        tdoc.add_text("id", doc.canonical)
        tdoc.add_unsigned("key", self._key_locked(doc.canonical))
        tdoc.add_text("kind", doc.kind)
        tdoc.add_text("canonical", doc.canonical)
        tdoc.add_text("text", doc.text)
        self._writer.add_document(tdoc)
        group = "memory" if doc.kind == "memory" else "entity"
        self._members[doc.canonical] = group
        self._digests[doc.canonical] = doc_digest(doc)
        self.kind_counts[group] += 1

    def replace(self, removals: Iterable[str], docs: Iterable[RenderedDoc]) -> None:
        """Delete some documents and add or replace others in one commit (one fsync when the index
        lives on disk)."""
        with self._lock:
            changed = any([self._delete_locked(c) for c in removals])
            for doc in docs:
                self._add_locked(doc)
                changed = True
            if changed:
                self._commit_locked()

    def delete(self, canonicals: Iterable[str]) -> None:
        with self._lock:
            if any([self._delete_locked(c) for c in canonicals]):
                self._commit_locked()

    def _key_locked(self, canonical: str) -> int:
        key = self._keys.get(canonical)
        if key is None:
            key = self._keys[canonical] = len(self._names)
            self._names.append(canonical)
        return key

    def _delete_locked(self, canonical: str) -> bool:
        group = self._members.pop(canonical, None)
        if group is None:
            return False
        self._digests.pop(canonical, None)
        self.kind_counts[group] -= 1
        self.deletions += 1
        self._writer.delete_documents_by_term("id", canonical)
        return True

    def _commit_locked(self) -> None:
        self._opstamp = self._writer.commit()
        self._index.reload()

    # ------------------------------------------------------------------ queries

    def parse(self, question: str) -> tantivy.Query | None:
        """Parse a question; never raises. Strict syntax first (so ordinary questions rank exactly as
        SLayer ranks them), then the lenient parser, then plain words."""
        try:
            return self._index.parse_query(question, ["text"])
        except ValueError:
            pass
        try:
            query, _errors = self._index.parse_query_lenient(question, ["text"])
            return query
        except ValueError:
            words = _UNSAFE_CHARS.sub(" ", question).lower().strip()
            if not words:
                return None
            try:
                return self._index.parse_query(words, ["text"])
            except ValueError:
                return None

    def exact_ids(self, question: str) -> list[str]:
        """Documents whose canonical id appears literally in the question, in question order."""
        out: list[str] = []
        for tok in _CANONICAL_TOKEN.findall(question):
            tok = tok.rstrip(".-")
            if tok in self._members and tok not in out:
                out.append(tok)
        return out

    def matching(self, query: tantivy.Query, canonicals: set[str], *, memories: bool) -> set[str]:
        """Which of these documents the query matches at all (whatever their rank)."""
        if not canonicals:
            return set()
        return {h.canonical for h in self.search(query, memories=memories, limit=len(canonicals),
                                                  allow=frozenset(canonicals))}

    def search(self, query: tantivy.Query, *, memories: bool, limit: int,
               allow: frozenset[str] | None = None) -> list[TextHit]:
        """Rank the documents of one group (memories, or all entity kinds) for a parsed query.
        ``allow`` restricts the ranking to those ids before scoring is cut off."""
        hits, names = self._run(query, memories, limit, allow)
        return [TextHit(name, float(score)) for (score, _), name in zip(hits, names, strict=True)]

    def ranked_ids(self, query: tantivy.Query, *, memories: bool, limit: int,
                   allow: frozenset[str] | None = None) -> list[str]:
        """``search`` without the scores: what fusion needs, several times cheaper on deep rankings."""
        return self._run(query, memories, limit, allow)[1]

    def _run(self, query: tantivy.Query, memories: bool, limit: int, allow: frozenset[str] | None):  # noqa: ANN202
        if limit <= 0:
            return [], []
        kind_term = tantivy.Query.term_query(self._schema, "kind", "memory")
        clauses = [(tantivy.Occur.Must, query),
                   (tantivy.Occur.Must if memories else tantivy.Occur.MustNot, kind_term)]
        if allow is not None:
            clauses.append((tantivy.Occur.Must, tantivy.Query.term_set_query(self._schema, "id", list(allow))))
        full = tantivy.Query.boolean_query(clauses)
        with self._lock:
            searcher = self._index.searcher()
            hits = searcher.search(full, limit).hits
            keys = u64_values(searcher, "key", [addr for _, addr in hits])
            names = self._names
            return hits, [names[k] for k in keys]
