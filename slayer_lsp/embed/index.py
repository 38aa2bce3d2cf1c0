"""The in-memory vector index of one embedding model: a float32 matrix, its ids and their kinds.

SLayer loads every vector from SQLite and builds a matrix on every search; this index is built once,
updated a row at a time as the worker embeds, and scanned by one matrix-vector product per query
(about 150 MB per 100k 384-d vectors: memory bandwidth is the bound). Rows are unit-normalised on
the way in, so a dot product is the cosine. One index holds one model's vectors only: it is bound
to a model name and a dimension, and a vector of another width is refused with a warning, never
compared and never a crash.

Writers (the embedding worker, the refresh dropping what was deleted) and readers (search) run on
different threads. Readers never take the writers' lock: every change publishes a ``VectorView``,
and a query ranks one view from start to end. A published view never changes: a new or replaced
vector goes to a row past every published one (the old row is only marked dead in the next view's
kind codes), a removal marks its row dead, and growing or compacting the matrix makes a new array.
An older view therefore keeps its matrix, ids and positions while newer ones are published.
"""

from __future__ import annotations

import operator
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from slayer_lsp.catalog.numbering import Numbering, pick

_MIN_CAPACITY = 64
_ALLOW_CACHE = 32  # allowed sets whose rows a view keeps (a scope per datasource: warehouses have 20)
_DEAD = -1  # the kind code of a row that was replaced or removed
_SCAN_GAP = 1024  # rows of other kinds between two stretches of wanted rows that are skipped, not scanned
_first, _second = operator.itemgetter(0), operator.itemgetter(1)


@dataclass(frozen=True, slots=True)
class DenseHits:
    """Per-kind rankings, best first, as ``(canonical_id, cosine)``; ``ranked`` counts the rows that
    survived the restriction and were scored. ``warnings`` say why a ranking may be empty or partial."""

    by_kind: dict[str, list[tuple[str, float]]]
    ranked: int = 0
    warnings: tuple[str, ...] = ()

    def ids(self, kind: str) -> list[str]:
        return [cid for cid, _ in self.by_kind.get(kind, ())]


def _unit(vector: np.ndarray) -> np.ndarray | None:
    v = np.asarray(vector, dtype=np.float32).ravel()
    if not np.isfinite(v).all():
        return None
    norm = float(np.linalg.norm(v))
    return v / norm if norm > 0 else v


class VectorView:
    """The vectors as one change left them, read-only: what one query ranks.

    ``codes`` is this view's own copy (dead rows hold ``_DEAD``); ``mat`` and ``ids`` may be shared
    with later views, which write only rows past ``n``. Row positions of an allowed set are cached
    per view, and handed to the next view updated by what changed."""

    def __init__(
        self,
        model: str,
        dim: int | None,
        n: int,
        mat: np.ndarray | None,
        codes: np.ndarray,
        ids: list[str],
        pos: dict[str, int],
        kind_names: tuple[str, ...],
        kind_codes: dict[str, int],
        reach: frozenset[str] | None,
    ) -> None:
        self.model, self.dim, self.n = model, dim, n
        self.mat, self.codes, self.ids, self.pos = mat, codes, ids, pos
        self.kind_names, self.kind_codes = kind_names, kind_codes
        self.reach = reach  # the standing restriction (``VectorIndex.restrict_to``)
        self.live = len(pos)
        self._lock = threading.Lock()  # for the caches only
        self._allow_rows: OrderedDict[frozenset[str], np.ndarray] = OrderedDict()
        self._reach_rows: np.ndarray | None = None
        self._live_rows: np.ndarray | None = None
        self._kind_counts: dict[str, int] | None = None
        self._kind_rows: dict[int, np.ndarray] | None = None

    def _all_rows(self) -> np.ndarray | None:
        """Sorted positions of the live rows, or None when every row of ``[0, n)`` is live."""
        if self.live == self.n:
            return None
        rows = self._live_rows
        if rows is None:
            rows = self._live_rows = np.nonzero(self.codes[: self.n] != _DEAD)[0]
        return rows

    def reachable_rows(self) -> np.ndarray | None:
        """Sorted live rows the restriction admits (None: no restriction)."""
        reach = self.reach
        if reach is None:
            return None
        rows = self._reach_rows
        if rows is None:
            rows = self._reach_rows = _admitted(self.pos, reach)
        return rows

    def rows_for(self, allow: Iterable[str]) -> np.ndarray:
        """Sorted row positions of the allowed ids present. Mapping ids costs ~0.2 µs each (a
        dictionary probe per id), so the result for a ``frozenset`` is cached: a caller that keeps
        its scope as one frozenset pays it once, and later views inherit it updated."""
        key = allow if isinstance(allow, frozenset) else None
        if key is not None:
            with self._lock:
                hit = self._allow_rows.get(key)
                if hit is not None:
                    self._allow_rows.move_to_end(key)
                    return hit
        rows = _positions(self.pos, allow)
        if key is not None:
            with self._lock:
                self._allow_rows[key] = rows
                while len(self._allow_rows) > _ALLOW_CACHE:
                    self._allow_rows.popitem(last=False)
        return rows

    def inherit(self, older: VectorView, changed: set[str]) -> None:
        """Take over ``older``'s cached row sets, moving the rows of ``changed`` ids (added,
        replaced or removed since) to where they are in this view."""
        if self.ids is not older.ids:
            return  # compacted or cleared: the old positions say nothing any more
        with older._lock:
            cached = list(older._allow_rows.items())
        if not cached and older._reach_rows is None:
            return
        old_rows = np.array(sorted(older.pos[c] for c in changed if c in older.pos), dtype=np.intp)
        new = {c: self.pos[c] for c in changed if c in self.pos}

        def moved(rows: np.ndarray, admits: Callable[[str], bool]) -> np.ndarray:
            kept = np.setdiff1d(rows, old_rows, assume_unique=True) if len(old_rows) else rows
            added = [r for c, r in new.items() if admits(c)]
            return np.union1d(kept, np.array(added, dtype=np.intp)) if added else kept

        with self._lock:
            for key, rows in cached:
                self._allow_rows[key] = moved(rows, key.__contains__)
        reach = self.reach
        if reach is not None and reach is older.reach and older._reach_rows is not None:
            self._reach_rows = moved(older._reach_rows, lambda c: _admits(reach, c))

    def kind_counts(self) -> dict[str, int]:
        """Rows per kind (what this view ranks): counted once per view, since every dense search
        asks them for its warnings (a pass over 100k part codes at 1,000 models)."""
        counted = self._kind_counts
        if counted is None:
            counted = self._kind_counts = self._count_kinds()
        return dict(counted)

    def _count_kinds(self) -> dict[str, int]:
        rows = self.reachable_rows()
        if rows is None:
            rows = self._all_rows()
        codes = self.codes[: self.n] if rows is None else self.codes[rows]
        counts = (
            np.bincount(codes.astype(np.intp), minlength=len(self.kind_names))
            if len(codes)
            else np.zeros(len(self.kind_names), dtype=np.intp)
        )
        return {name: int(counts[code]) for code, name in enumerate(self.kind_names) if counts[code]}

    def reachable_count(self) -> int:
        rows = self.reachable_rows()
        return self.live if rows is None else len(rows)

    def _mismatch(self, width: int, what: str) -> str:
        return (
            f"dense: {what} has {width} dimensions but the index of {self.model} holds "
            f"{self.dim}-dimensional vectors; it was not used"
        )

    def top_k(
        self,
        query: np.ndarray,
        k: int,
        allow: Iterable[str] | None = None,
        kinds: Iterable[str] | None = None,
        model: str | None = None,
    ) -> DenseHits:
        """See ``VectorIndex.top_k``."""
        q = np.asarray(query, dtype=np.float32).ravel()
        if model is not None and model != self.model:
            return DenseHits(
                {},
                0,
                (
                    f"dense: the question was embedded with {model} but the index "
                    f"holds {self.model}; not compared",
                ),
            )
        if self.live == 0 or k <= 0 or self.mat is None:
            return DenseHits({}, 0)
        if q.shape[0] != self.dim:
            return DenseHits({}, 0, (self._mismatch(int(q.shape[0]), "the question's vector"),))
        unit = _unit(q)
        if unit is None or not unit.any():
            return DenseHits({}, 0, ("dense: the question's vector is zero or not finite; not ranked",))
        wanted = (
            None if kinds is None else sorted({self.kind_codes[x] for x in kinds if x in self.kind_codes})
        )
        reach = self.reachable_rows()
        if allow is None and reach is None:  # nothing restricted
            return self._top_by_kind(unit, k, wanted)
        rows = self._all_rows() if allow is None else self.rows_for(allow)
        if reach is not None:  # a scoped session's rows, whatever ``allow`` says
            rows = reach if rows is None else np.intersect1d(rows, reach, assume_unique=True)
        assert rows is not None  # ``allow`` or ``reach`` restricts: rows were picked
        codes = self.codes[rows]
        if wanted is not None:
            # one kind (the memory pieces' scan): a comparison, several times cheaper than isin
            keep = (
                codes == wanted[0] if len(wanted) == 1 else np.isin(codes, np.asarray(wanted, dtype=np.int16))
            )
            rows, codes = rows[keep], codes[keep]
        scores = _scores(self.mat, rows, unit)
        by_kind: dict[str, list[tuple[str, float]]] = {}
        counts = np.bincount(codes.astype(np.intp)) if len(codes) else np.zeros(0, dtype=np.intp)
        for code in np.flatnonzero(counts).tolist():
            sel = np.nonzero(codes == code)[0]
            sub = scores[sel]
            top = _best(sub, k)
            by_kind[self.kind_names[code]] = self._ranked(rows[sel[top]], sub[top], k)
        return DenseHits(by_kind, int(len(codes)))

    def _top_by_kind(self, unit: np.ndarray, k: int, wanted: list[int] | None) -> DenseHits:
        """``top_k`` over every live row of the view (no restriction), by the rows of each kind kept
        per view: no pass over the codes per search, and a kind whose rows lie together is
        scanned in place (a load, growth and compaction lay them so)."""
        by_code = self._rows_by_kind()
        codes = [c for c in by_code if wanted is None or c in wanted]
        by_kind: dict[str, list[tuple[str, float]]] = {}
        if wanted is not None and len(codes) < len(by_code):  # some kinds: only their rows are scanned
            for code in codes:
                own = by_code[code]
                scores = _scores(self.mat, own, unit)
                top = _best(scores, k)
                by_kind[self.kind_names[code]] = self._ranked(own[top], scores[top], k)
            return DenseHits(by_kind, sum(len(by_code[c]) for c in codes))
        assert self.mat is not None
        everything = self.mat[: self.n] @ unit
        for code in codes:
            rows = by_code[code]
            lo, hi = int(rows[0]), int(rows[-1]) + 1
            sub = everything[lo:hi] if hi - lo == len(rows) else everything[rows]
            top = _best(sub, k)
            by_kind[self.kind_names[code]] = self._ranked(rows[top], sub[top], k)
        return DenseHits(by_kind, self.live)

    def _rows_by_kind(self) -> dict[int, np.ndarray]:
        """Sorted live rows of each kind present, worked out once per view."""
        cached = self._kind_rows
        if cached is None:
            live = self._all_rows()  # None: every row of [0, n) is live
            codes = self.codes[: self.n] if live is None else self.codes[live]
            order = np.argsort(codes, kind="stable")
            if live is not None:
                order = live[order]
            counts = np.bincount(codes.astype(np.intp)) if len(codes) else np.zeros(0, dtype=np.intp)
            cuts = np.cumsum(counts)
            cached = {
                code: order[cuts[code] - counts[code] : cuts[code]]
                for code in np.flatnonzero(counts).tolist()
            }
            self._kind_rows = cached
        return cached

    def _ranked(self, rows: np.ndarray, scores: np.ndarray, k: int) -> list[tuple[str, float]]:
        """(id, cosine) of ``rows`` best first, ties by id, at most ``k``."""
        pairs = list(zip(pick(self.ids, rows.tolist()), scores.tolist(), strict=True))
        pairs.sort(key=_first)  # ties (identical texts have identical vectors) by id,
        pairs.sort(key=_second, reverse=True)  # best first: a stable sort keeps that order
        return pairs[:k]


def _best(scores: np.ndarray, k: int) -> np.ndarray:
    """Positions of the ``k`` best scores, with every score tied with the last of them: which of
    equal rows come back is then decided by their ids, never by where they lie."""
    if k >= len(scores):
        return np.arange(len(scores))
    top = np.argpartition(-scores, k - 1)[:k]
    last = scores[top].min()
    if np.count_nonzero(scores >= last) > k:
        top = np.flatnonzero(scores >= last)
    return top


def _scores(mat: np.ndarray | None, rows: np.ndarray, unit: np.ndarray) -> np.ndarray:
    """Cosines of the sorted ``rows``: each stretch of rows that lie together is scanned in place
    (a run of one kind, or rows at most as many as the others between them); rows scattered among
    many others are gathered (a copy of each row, then a second pass)."""
    if mat is None or not len(rows):
        return np.empty(0, dtype=np.float32)
    cuts = np.flatnonzero(np.diff(rows) > _SCAN_GAP) + 1
    if not len(cuts):
        return _stretch(mat, rows, unit)
    return np.concatenate([_stretch(mat, part, unit) for part in np.split(rows, cuts)])


def _stretch(mat: np.ndarray, rows: np.ndarray, unit: np.ndarray) -> np.ndarray:
    lo, hi = int(rows[0]), int(rows[-1]) + 1
    if hi - lo == len(rows):
        return mat[lo:hi] @ unit
    if hi - lo <= 2 * len(rows):
        return (mat[lo:hi] @ unit)[rows - lo]
    return mat[rows] @ unit


def _admits(reach: frozenset[str], cid: str) -> bool:
    return cid in reach or ("#" in cid and cid.rpartition("#")[0] in reach)


def _admitted(pos: dict[str, int], reach: frozenset[str]) -> np.ndarray:
    rows = np.array([r for cid, r in pos.items() if _admits(reach, cid)], dtype=np.intp)
    rows.sort()
    return rows


def _positions(pos: dict[str, int], allow: Iterable[str]) -> np.ndarray:
    present = (
        allow.intersection(pos) if isinstance(allow, set | frozenset) else [c for c in allow if c in pos]
    )
    if len(present) > 1:
        rows = np.array(operator.itemgetter(*present)(pos), dtype=np.intp)
    else:
        rows = np.array([pos[c] for c in present], dtype=np.intp)
    rows.sort()
    return rows


class VectorIndex:
    """Vectors of ``model`` keyed by canonical id, with each row's kind and content hash.

    ``dim`` is fixed by the constructor or by the first vector added. Changes hold one lock (they
    come from the worker and the refresh) and end by publishing a ``VectorView``; queries rank the
    view published last and take no lock (see the module doc)."""

    def __init__(self, model: str, dim: int | None = None, *, capacity: int = 0) -> None:
        self._lock = threading.RLock()
        self._reach: frozenset[str] | None = None  # a standing restriction (``restrict_to``); kept by clear()
        self._reset(model, dim, capacity)

    def _reset(self, model: str, dim: int | None, capacity: int = 0) -> None:
        self._model = model
        self._dim = dim
        self._n = 0  # rows written, dead ones included
        self._ids: list[str] = []  # row -> id (append-only until the matrix is compacted)
        self._hashes: list[str] = []
        self._pos: dict[str, int] = {}  # live id -> row
        self._kinds: Numbering[str] = Numbering()  # kind -> code
        cap = max(_MIN_CAPACITY, capacity)
        self._codes = np.zeros(cap, dtype=np.int16)
        self._mat = np.zeros((cap, dim), dtype=np.float32) if dim else None
        self.rejected = 0  # vectors refused for their width (or NaN) since the last clear
        self._parts: dict[str, set[str]] = {}  # owner -> its part ids held (ids "<owner>#<part>")
        self._by_hash: dict[str, str] = {}  # content hash -> one id holding it (checked when read)
        self._changed: set[str] = set()  # ids added, replaced or removed since the last view
        self._view = self._make_view()

    def _make_view(self) -> VectorView:
        return VectorView(
            self._model,
            self._dim,
            self._n,
            self._mat,
            self._codes[: self._n].copy(),
            self._ids,
            dict(self._pos),
            tuple(self._kinds.names),
            dict(self._kinds.number),
            self._reach,
        )

    def _publish(self) -> None:
        """Make the changes since the last view visible to queries, as one new view."""
        older = self._view
        view = self._make_view()
        view.inherit(older, self._changed)
        self._changed = set()
        self._view = view

    def view(self) -> VectorView:
        """The vectors as the last change left them (never changed by later ones)."""
        return self._view

    # ------------------------------------------------------------------ inspection

    @property
    def model(self) -> str:
        return self._view.model

    @property
    def dim(self) -> int | None:
        return self._view.dim

    def __len__(self) -> int:
        return self._view.live

    def __contains__(self, canonical_id: object) -> bool:
        return canonical_id in self._view.pos

    @property
    def nbytes(self) -> int:
        view = self._view
        return 0 if view.mat is None else int(view.mat[: view.n].nbytes)

    def ids(self) -> list[str]:
        """The live ids, in row order."""
        with self._lock:
            pos = self._pos
            return [cid for i, cid in enumerate(self._ids[: self._n]) if pos.get(cid) == i]

    def hash_of(self, canonical_id: str) -> str | None:
        with self._lock:
            pos = self._pos.get(canonical_id)
            return None if pos is None else self._hashes[pos]

    def kind_of(self, canonical_id: str) -> str | None:
        with self._lock:
            pos = self._pos.get(canonical_id)
            return None if pos is None else self._kinds.names[self._codes[pos]]

    def vector(self, canonical_id: str) -> np.ndarray | None:
        with self._lock:
            pos = self._pos.get(canonical_id)
            return None if pos is None or self._mat is None else self._mat[pos].copy()

    def vector_with_hash(self, content_hash: str) -> np.ndarray | None:
        """The vector of some row embedded from the text of ``content_hash`` (a copy), if any: the
        same text under the same model is the same vector, so it need not be embedded again."""
        if not content_hash:
            return None
        with self._lock:
            cid = self._by_hash.get(content_hash)
            if cid is None:
                return None
            pos = self._pos.get(cid)
            if pos is None or self._hashes[pos] != content_hash or self._mat is None:
                del self._by_hash[content_hash]  # that row changed or left since
                return None
            return self._mat[pos].copy()

    def parts_of(self, owner: str) -> list[str]:
        """The part ids (``<owner>#<part>``) held for ``owner``, sorted."""
        with self._lock:
            return sorted(self._parts.get(owner, ()))

    def restrict_to(self, ids: Iterable[str] | None) -> None:
        """A standing restriction, for a session with a scope: a row whose id (or, for a part id
        ``<owner>#<part>``, whose owner) is not in ``ids`` is never ranked, whatever a query's
        ``allow`` says; the table may hold other sessions' vectors. ``None`` lifts it."""
        with self._lock:
            self._reach = None if ids is None else frozenset(ids)
            self._publish()

    def reachable_count(self) -> int:
        """Rows a query may rank: all of them, or those the restriction admits."""
        return self._view.reachable_count()

    @property
    def restricted(self) -> bool:
        """Whether a standing restriction (``restrict_to``) applies: a scoped session's index."""
        return self._view.reach is not None

    def kind_counts(self) -> dict[str, int]:
        """Rows per kind that a query may rank (under a restriction, only the admitted ones: a scoped
        session's counts never include other sessions' vectors)."""
        return self._view.kind_counts()

    # ------------------------------------------------------------------ updates

    def clear(self, model: str | None = None, dim: int | None = None) -> None:
        """Drop every vector; optionally rebind to another model (and dimension)."""
        with self._lock:
            self._reset(model or self._model, dim if model else (dim or self._dim))

    def reserve(self, rows: int) -> None:
        with self._lock:
            if self._dim is not None:
                self._grow(rows)

    def _grow(self, need: int) -> None:
        """Room for ``need`` rows: a new, larger matrix (a published view keeps the old one). The rows
        held are copied over arranged (``_rebuild``): the copy is made anyway."""
        cap = len(self._codes)
        if need <= cap and self._mat is not None:
            return
        new_cap = max(need, cap + cap // 2, _MIN_CAPACITY)
        if self._mat is not None and self._n:
            self._rebuild(new_cap)
            return
        self._mat = np.zeros((new_cap, self._dim or 0), dtype=np.float32)  # nothing held yet to copy
        self._codes = np.zeros(new_cap, dtype=np.int16)

    def _compact(self) -> None:
        """Drop the dead rows once they are more than the live ones (``_rebuild``)."""
        dead = self._n - len(self._pos)
        if dead > max(len(self._pos), _MIN_CAPACITY):
            self._rebuild(max(_MIN_CAPACITY, len(self._pos) + len(self._pos) // 2))

    def arrange(self) -> bool:
        """Lay the rows of each kind together (and drop dead rows) when they are interleaved: a scan
        of one kind (the memory pieces of a search) then reads that kind's rows alone. A load ends
        with this: its pages come kind by kind, but a row rewritten meanwhile may not. Returns whether
        it moved rows."""
        with self._lock:
            codes = self._codes[: self._n]
            live = codes[codes != _DEAD]
            runs = 1 + int(np.count_nonzero(live[1:] != live[:-1])) if len(live) else 0
            if len(live) == self._n and runs <= len(np.unique(live)):
                return False
            self._rebuild(len(self._codes))
            self._publish()
            return True

    def _rebuild(self, capacity: int) -> None:
        """New arrays and lists of ``capacity`` rows holding the live rows, those of each kind
        together in their order (a published view keeps the old ones)."""
        rows = np.array(sorted(self._pos.values()), dtype=np.intp)
        rows = rows[np.argsort(self._codes[rows], kind="stable")]
        cap = max(_MIN_CAPACITY, capacity, len(rows))
        mat = np.zeros((cap, self._dim or 0), dtype=np.float32)
        codes = np.zeros(cap, dtype=np.int16)
        if len(rows):
            assert self._mat is not None
            np.take(self._mat, rows, axis=0, out=mat[: len(rows)])  # no temporary copy of the rows
            codes[: len(rows)] = self._codes[rows]
        order = rows.tolist()
        self._ids = pick(self._ids, order)
        self._hashes = pick(self._hashes, order)
        self._pos = {cid: i for i, cid in enumerate(self._ids)}
        self._mat, self._codes, self._n = mat, codes, len(order)

    def _mismatch(self, width: int, what: str) -> str:
        return (
            f"dense: {what} has {width} dimensions but the index of {self._model} holds "
            f"{self._dim}-dimensional vectors; it was not used"
        )

    def upsert(self, canonical_id: str, kind: str, vector: np.ndarray, content_hash: str = "") -> str | None:
        """Add or replace one row; returns a warning (and changes nothing) for a wrong-width vector."""
        return next(
            iter(self.upsert_many([canonical_id], [kind], np.asarray(vector)[None, :], [content_hash])), None
        )

    def upsert_many(
        self,
        ids: Sequence[str],
        kinds: Sequence[str],
        matrix: np.ndarray,
        hashes: Sequence[str] | None = None,
    ) -> list[str]:
        """Add or replace rows (no rebuild: a replaced row is written anew past the published ones).
        Returns warnings: rows of another width than the index, or with NaN/inf components, are
        refused and counted in ``rejected``."""
        mat = np.asarray(matrix, dtype=np.float32)
        if mat.ndim != 2 or mat.shape[0] != len(ids) or len(kinds) != len(ids):
            raise ValueError(f"upsert_many: {len(ids)} ids, {len(kinds)} kinds, matrix {mat.shape}")
        if not ids:
            return []
        with self._lock:
            if self._dim is None:
                self._dim = int(mat.shape[1])
                self._mat = None
                self._grow(max(len(self._codes), len(ids)))
            if mat.shape[1] != self._dim:
                self.rejected += len(ids)
                return [self._mismatch(int(mat.shape[1]), f"{len(ids)} vector(s)")]
            norms = np.linalg.norm(mat, axis=1, keepdims=True)
            finite = np.isfinite(norms[:, 0])
            unit = mat / np.where((norms > 0) & np.isfinite(norms), norms, 1.0)
            warnings: list[str] = []
            if not finite.all():
                self.rejected += int((~finite).sum())
                warnings.append(
                    f"dense: {int((~finite).sum())} vector(s) with NaN or infinite components refused"
                )
            self._grow(self._n + len(ids))
            assert self._mat is not None
            for i, cid in enumerate(ids):
                if not finite[i]:
                    continue
                old = self._pos.get(cid)
                if old is not None:
                    self._codes[old] = _DEAD
                elif "#" in cid:
                    self._parts.setdefault(cid.rpartition("#")[0], set()).add(cid)
                pos = self._pos[cid] = self._n
                self._n += 1
                self._ids.append(cid)
                self._hashes.append(hashes[i] if hashes is not None else "")
                self._mat[pos] = unit[i]
                self._codes[pos] = self._kinds.of(kinds[i])
                if hashes is not None and hashes[i]:
                    self._by_hash[hashes[i]] = cid
                self._changed.add(cid)
            self._compact()
            self._publish()
            return warnings

    def remove(self, canonical_id: str) -> bool:
        """Drop one row (marked dead; the rows are compacted once most are dead)."""
        with self._lock:
            if not self._drop(canonical_id):
                return False
            self._compact()
            self._publish()
            return True

    def _drop(self, canonical_id: str) -> bool:
        pos = self._pos.pop(canonical_id, None)
        if pos is None:
            return False
        if "#" in canonical_id:
            owner = canonical_id.rpartition("#")[0]
            held = self._parts.get(owner)
            if held is not None:
                held.discard(canonical_id)
                if not held:
                    del self._parts[owner]
        self._codes[pos] = _DEAD
        self._changed.add(canonical_id)
        return True

    def remove_subtree(self, root: str, separators: tuple[str, ...] = (".",)) -> int:
        """Drop ``root`` and its dotted descendants (never a character prefix: ``memory:4`` keeps
        ``memory:42``, ``orders`` keeps ``orders_archive``); with ``separators=(".", "#")`` their
        parts too (``ds.m`` takes ``ds.m#meaning`` and ``ds.m.c#values``)."""
        prefixes = tuple(root + sep for sep in separators)
        with self._lock:
            doomed = [cid for cid in self._pos if cid == root or cid.startswith(prefixes)]
            for cid in doomed:
                self._drop(cid)
            if doomed:
                self._compact()
                self._publish()
            return len(doomed)

    # ------------------------------------------------------------------ queries

    def top_k(
        self,
        query: np.ndarray,
        k: int,
        allow: Iterable[str] | None = None,
        kinds: Iterable[str] | None = None,
        model: str | None = None,
    ) -> DenseHits:
        """The ``k`` most similar rows of each kind (of ``kinds``, default all), ranked over the
        view published last (no lock: a change meanwhile publishes another view).

        ``allow`` (canonical ids) restricts the candidates *before* ranking, so a row outside it can
        never take a place; ``None`` allows everything. Ties are ordered by canonical id. A query
        of the wrong width, or with no direction, or made by another ``model`` than the index's (when
        given), gives empty rankings and a warning."""
        return self._view.top_k(query, k, allow, kinds, model)
