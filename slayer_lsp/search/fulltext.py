"""Channel 2: a tantivy full-text index over the rendered documents, kept warm and updated per document.

One tantivy index holds the documents of one corpus (the whole store, or one datasource's subset so
that BM25 statistics come from that subset, as SLayer's pre-filter requires). Documents are replaced
by deleting their ``id`` term and adding them again; a commit makes a batch visible at once.

Two roles, two classes. ``FullTextIndex`` owns the tantivy writer and is touched by one thread at a
time, the refresh. Each commit publishes a ``FullTextView``: a tantivy searcher taken right after
that commit plus the key table and membership as they were then. A view never changes, so a
search reads it without a lock and an older snapshot keeps its own view while newer ones are made.
Views share structure: the key table is append-only (a view reads only keys its searcher holds) and
membership is a ``catalog.layered.LayeredMap`` (a base dict and an overlay of changes), so a commit
costs what it changed.

Unlike SLayer, a question never fails to parse: tantivy's lenient parser handles apostrophes,
parentheses, colons and comparisons, and a question whose literal canonical id or ``memory:<id>``
names a document puts that document first (the ``canonical`` field is really queried).
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import compress
from operator import ne
from pathlib import Path

import tantivy

from slayer_lsp.catalog.ids import MEMORY_PREFIX
from slayer_lsp.catalog.layered import LayeredMap, LayeredMutation
from slayer_lsp.catalog.numbering import Numbering, pick
from slayer_lsp.search.fastfields import u64_values
from slayer_lsp.search.tantivy_open import open_index
from slayer_lsp.texts.render import RenderedDoc

log = logging.getLogger(__name__)

# Canonical-looking tokens in a question: dotted identifiers and memory refs.
_CANONICAL_TOKEN = re.compile(
    re.escape(MEMORY_PREFIX) + r"[^\s,;()\"'`]+|[A-Za-z_][\w-]*(?:\.[A-Za-z_][\w-]*){0,2}"
)
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
class IndexState:
    """What a start needs to reopen an index on disk without reading it back: the key table
    (key -> canonical), the members' keys, their text digests (in the members' order), which of the
    members are memories (positions), and the documents replaced since the build."""

    names: list[str]
    members: list[int]
    digests: list[str]
    memories: list[int]
    deletions: int = 0


@dataclass(frozen=True, slots=True)
class TextHit:
    canonical: str
    score: float


class FullTextView:
    """One commit of a ``FullTextIndex``, read-only: what a snapshot's searches rank over."""

    def __init__(
        self,
        index: FullTextIndex,
        searcher: tantivy.Searcher,
        names: list[str],
        members: LayeredMap[str],
        kind_counts: dict[str, int],
        deletions: int,
    ) -> None:
        self.index = index  # the writer that made it (the refresh derives the next view from it)
        self.path = index.path
        self._tantivy = index.tantivy
        self._schema = index.schema
        self._searcher = searcher
        self._names = names  # append-only and shared: this view reads only keys its searcher holds
        self._members = members  # canonical -> digest of the indexed text
        self.kind_counts = kind_counts
        self.deletions = deletions  # deleted documents still weigh in tantivy's statistics until a rebuild

    def __contains__(self, canonical: str) -> bool:
        return canonical in self._members

    def __len__(self) -> int:
        return len(self._members)

    def parse(self, question: str) -> tantivy.Query | None:
        """Parse a question; never raises. Strict syntax first (so ordinary questions rank exactly as
        SLayer ranks them), then the lenient parser, then plain words."""
        try:
            return self._tantivy.parse_query(question, ["text"])
        except ValueError:
            pass
        try:
            query, _errors = self._tantivy.parse_query_lenient(question, ["text"])
            return query
        except ValueError:
            words = _UNSAFE_CHARS.sub(" ", question).lower().strip()
            if not words:
                return None
            try:
                return self._tantivy.parse_query(words, ["text"])
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
        return {
            h.canonical
            for h in self.search(query, memories=memories, limit=len(canonicals), allow=frozenset(canonicals))
        }

    def search(
        self, query: tantivy.Query, *, memories: bool, limit: int, allow: frozenset[str] | None = None
    ) -> list[TextHit]:
        """Rank the documents of one group (memories, or all entity kinds) for a parsed query.
        ``allow`` restricts the ranking to those ids before scoring is cut off."""
        hits, names = self._run(query, memories, limit, allow)
        return [TextHit(name, float(score)) for (score, _), name in zip(hits, names, strict=True)]

    def scored(
        self, query: tantivy.Query, *, memories: bool, limit: int, allow: frozenset[str] | None = None
    ) -> list[tuple[str, float]]:
        """``search`` as (canonical, score) pairs: what a hot loop reads, without an object per hit."""
        hits, names = self._run(query, memories, limit, allow)
        return list(zip(names, [score for score, _ in hits], strict=True))

    def ranked_ids(
        self, query: tantivy.Query, *, memories: bool, limit: int, allow: frozenset[str] | None = None
    ) -> list[str]:
        """``search`` without the scores: what fusion needs, several times cheaper on deep rankings."""
        return self._run(query, memories, limit, allow)[1]

    def _run(self, query: tantivy.Query, memories: bool, limit: int, allow: frozenset[str] | None):  # noqa: ANN202
        if limit <= 0:
            return [], []
        kind_term = tantivy.Query.term_query(self._schema, "kind", "memory")
        clauses = [
            (tantivy.Occur.Must, query),
            (tantivy.Occur.Must if memories else tantivy.Occur.MustNot, kind_term),
        ]
        if allow is not None:
            clauses.append(
                (tantivy.Occur.Must, tantivy.Query.term_set_query(self._schema, "id", list(allow)))
            )
        full = tantivy.Query.boolean_query(clauses)
        searcher = self._searcher
        # count=False: nobody reads the total, and counting it scores every match, where the top
        # ``limit`` alone may skip blocks that cannot reach it (-20% at 10,000 models)
        hits = searcher.search(full, limit, count=False).hits
        keys = u64_values(searcher, "key", [addr for _, addr in hits])
        names = self._names
        return hits, [names[k] for k in keys]


class FullTextIndex:
    """The writer of a tantivy index over one corpus of rendered documents. One thread at a time
    changes it (the refresh, or whoever owns a private index); readers use ``view()``."""

    def __init__(
        self,
        docs: Iterable[RenderedDoc] = (),
        *,
        path: Path | None = None,
        _state: IndexState | None = None,
    ):
        """An index over ``docs``, in RAM or (``path``) in a directory that a later start reopens."""
        self.schema = _schema()
        self.path = path
        self.tantivy = open_index(
            self.schema, path=None if path is None else str(path), reuse=_state is not None
        )
        self._writer = self.tantivy.writer(heap_size=64_000_000, num_threads=1)
        self._closed = False
        self._opstamp = self._writer.commit_opstamp  # the writer reports only the opstamp it opened at
        self._kind_counts: dict[str, int] = {"memory": 0, "entity": 0}
        # canonical -> digest of the indexed text: who is in the index (what the views ask) and
        # whether their text changed (what a sync asks), in one map
        self._members: LayeredMap[str] = LayeredMap()
        self._memories: set[str] = set()  # the members that are memories (the writer's own)
        # canonical -> u64 fast-field key (hits map back without doc fetches)
        self._numbers: Numbering[str] = Numbering()
        self._deletions = 0
        if _state is not None:
            self._numbers = Numbering(_state.names)
            canonicals = pick(_state.names, _state.members)
            members = dict(zip(canonicals, _state.digests, strict=True))
            self._memories = set(pick(canonicals, _state.memories))
            self._kind_counts = {
                "memory": len(self._memories),
                "entity": len(members) - len(self._memories),
            }
            self._members = LayeredMap(members)
            self._deletions = _state.deletions
            self.tantivy.reload()
        self._view: FullTextView | None = self._publish()
        self.upsert(docs)

    @classmethod
    def reopen(cls, path: Path, state: IndexState, opstamp: int) -> FullTextIndex | None:
        """Reopen a cached index when it is exactly the one its manifest describes (``state``; its
        ``deletions``: the documents it replaced or deleted, still weighing in its BM25); else None."""
        try:
            index = cls(path=path, _state=state)
        except (ValueError, OSError, IndexError, KeyError) as exc:  # locked, damaged, or inconsistent
            log.info("cached full-text index at %s not reusable: %s", path, exc)
            return None
        if index._opstamp != opstamp or index.tantivy.searcher().num_docs != len(index._members):
            log.info("cached full-text index at %s does not match its manifest; rebuilding", path)
            return None
        return index

    def view(self) -> FullTextView:
        """The view of the last commit (never changed by later ones)."""
        if self._view is None:
            raise ValueError("the full-text index was closed")
        return self._view

    def extends(self, view: FullTextView) -> bool:
        """Whether a next commit can be derived from ``view`` in place: it is this writer's last
        commit and the writer is open (else the caller indexes anew, as for an older generation)."""
        return not self._closed and self._view is view

    def prepare(self) -> None:
        """Make now what only the next change needs (a reopened index's key -> number map), so that
        an edit after a restart does not wait for it (run by the warm-up)."""
        self._numbers.prepare()

    def close(self) -> None:
        """Let go of the writer now rather than at the next full GC pass: its indexing memory, its
        threads, and an on-disk index's lock. The views taken so far keep answering."""
        if not self._closed:
            self._closed = True
            self._writer.wait_merging_threads()
            self._view = None  # its views point here: no cycle left for the GC to find

    def _publish(self) -> FullTextView:
        self.tantivy.reload()
        return FullTextView(
            self,
            self.tantivy.searcher(),
            self._numbers.names,
            self._members,
            dict(self._kind_counts),
            self._deletions,
        )

    def sync(
        self,
        docs: dict[str, RenderedDoc],
        known: Mapping[str, str] | None = None,
        *,
        indexed_except: Sequence[str] | None = None,
    ) -> None:
        """Make the index hold exactly ``docs``, touching only documents whose text changed.
        ``known``: text digests already computed (by canonical), so they are not computed again.
        ``indexed_except``: the caller knows that every document but these is in the index with its
        current text (the cache's texts were written with this very commit): only these are
        compared, and the others are looked for among the members only when the counts say some
        went (a restart on 400,000 unchanged documents then compares nothing)."""
        have = self._members
        if indexed_except is not None:
            stale = {cid for cid in indexed_except if have.get(cid) != doc_digest(docs[cid])}
            present = sum(cid in have for cid in indexed_except)
            untold = len(docs) - len(indexed_except)  # all in the index, as the caller knows
            gone = set(have).difference(docs) if len(have) != untold + present else set()
        else:
            known = known or {}
            # compared in C (map, compress and set operations over the dicts' views): a restart on
            # 400,000 unchanged documents finds nothing to do without a Python step per document
            digest_of = have.getter()
            differs = map(ne, map(digest_of, known.keys()), known.values())
            stale = {cid for cid in compress(known.keys(), differs) if cid in docs}
            stale.update(cid for cid in docs.keys() - known.keys() if digest_of(cid) != doc_digest(docs[cid]))
            gone = set(have).difference(docs)
        self.replace(
            [c for c in self._members if c in gone] if gone else [],
            [doc for cid, doc in docs.items() if cid in stale] if stale else [],
        )

    def manifest(self) -> tuple[int, IndexState]:
        """This index's last commit and what a later start needs to reopen it."""
        pairs = list(self._members.pairs())
        canonicals = [cid for cid, _ in pairs]
        memories = self._memories
        return self._opstamp, IndexState(
            names=list(self._numbers.names),
            members=pick(self._numbers.number, canonicals),
            digests=[digest for _, digest in pairs],
            memories=[i for i, cid in enumerate(canonicals) if cid in memories],
            deletions=self._deletions,
        )

    # the current view's reads, for an owner that keeps the index to itself
    def __contains__(self, canonical: str) -> bool:
        return canonical in self._members

    def __len__(self) -> int:
        return len(self._members)

    @property
    def deletions(self) -> int:
        return self._deletions

    @property
    def digests(self) -> LayeredMap[str]:
        """The text digest of every indexed document, by canonical (as of the last commit: later
        commits leave it as it is)."""
        return self._members

    @property
    def opstamp(self) -> int:
        """The last commit's opstamp (unchanged when nothing was committed since)."""
        return self._opstamp

    @property
    def kind_counts(self) -> dict[str, int]:
        return self.view().kind_counts

    def parse(self, question: str) -> tantivy.Query | None:
        return self.view().parse(question)

    def search(
        self, query: tantivy.Query, *, memories: bool, limit: int, allow: frozenset[str] | None = None
    ) -> list[TextHit]:
        return self.view().search(query, memories=memories, limit=limit, allow=allow)

    # ------------------------------------------------------------------ updates

    def upsert(self, docs: Iterable[RenderedDoc]) -> FullTextView:
        """Add or replace documents, then commit (one commit per batch)."""
        return self.replace((), docs)

    def replace(self, removals: Iterable[str], docs: Iterable[RenderedDoc]) -> FullTextView:
        """Delete some documents and add or replace others in one commit (one fsync when the index
        lives on disk); returns the view of that commit (the last one when nothing changed)."""
        if self._closed:
            raise ValueError("the full-text index was closed")
        members = self._members.mutate()
        changed = any([self._delete(members, c) for c in removals])
        for doc in docs:
            self._add(members, doc)
            changed = True
        self._members = members.finish()
        if changed:
            self._opstamp = self._writer.commit()
            self._view = self._publish()
        return self.view()

    def delete(self, canonicals: Iterable[str]) -> FullTextView:
        return self.replace(canonicals, ())

    def _add(self, members: LayeredMutation[str], doc: RenderedDoc) -> None:
        self._delete(members, doc.canonical)
        tdoc = tantivy.Document()
        tdoc.add_text("id", doc.canonical)
        tdoc.add_unsigned("key", self._numbers.of(doc.canonical))
        tdoc.add_text("kind", doc.kind)
        tdoc.add_text("canonical", doc.canonical)
        tdoc.add_text("text", doc.text)
        self._writer.add_document(tdoc)
        members[doc.canonical] = doc_digest(doc)
        if doc.kind == "memory":
            self._memories.add(doc.canonical)
            self._kind_counts["memory"] += 1
        else:
            self._kind_counts["entity"] += 1

    def _delete(self, members: LayeredMutation[str], canonical: str) -> bool:
        if members.pop(canonical, None) is None:
            return False
        if canonical in self._memories:
            self._memories.discard(canonical)
            self._kind_counts["memory"] -= 1
        else:
            self._kind_counts["entity"] -= 1
        self._deletions += 1
        self._writer.delete_documents_by_term("id", canonical)
        return True
