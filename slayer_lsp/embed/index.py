"""The in-memory vector index of one embedding model: a float32 matrix, its ids and their kinds.

SLayer loads every vector from SQLite and builds a matrix on every search; this index is built once,
updated a row at a time as the worker embeds, and scanned by one matrix-vector product per query
(about 150 MB per 100k 384-d vectors: memory bandwidth is the bound). Rows are unit-normalised on
the way in, so a dot product is the cosine. One index holds one model's vectors only: it is bound
to a model name and a dimension, and a vector of another width is refused with a warning, never
compared and never a crash.
"""

from __future__ import annotations

import operator
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

_MIN_CAPACITY = 64
_ALLOW_CACHE = 8


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


class VectorIndex:
    """Vectors of ``model`` keyed by canonical id, with each row's kind and content hash.

    ``dim`` is fixed by the constructor or by the first vector added. Writers (the embedding worker)
    and readers (search) may run on different threads: every method holds one lock, and a query
    holds it only for one matrix-vector product."""

    def __init__(self, model: str, dim: int | None = None, *, capacity: int = 0) -> None:
        self._lock = threading.RLock()
        self._reach: frozenset[str] | None = None  # a standing restriction (``restrict_to``); kept by clear()
        self._reset(model, dim, capacity)

    def _reset(self, model: str, dim: int | None, capacity: int = 0) -> None:
        self._model = model
        self._dim = dim
        self._n = 0
        self._ids: list[str] = []
        self._hashes: list[str] = []
        self._pos: dict[str, int] = {}
        self._kind_names: list[str] = []
        self._kind_codes: dict[str, int] = {}
        cap = max(_MIN_CAPACITY, capacity)
        self._codes = np.zeros(cap, dtype=np.int16)
        self._mat = np.zeros((cap, dim), dtype=np.float32) if dim else None
        self.rejected = 0  # vectors refused for their width (or NaN) since the last clear
        self._version = 0  # bumped whenever a row is added or removed (row positions of ids change)
        self._allow_rows: OrderedDict[frozenset[str], tuple[int, np.ndarray]] = OrderedDict()
        self._parts: dict[str, set[str]] = {}  # owner -> its part ids held (ids "<owner>#<part>")
        self._by_hash: dict[str, str] = {}  # content hash -> one id holding it (checked when read)
        self._reach_rows: tuple[int, np.ndarray] | None = None  # (version, rows) of the restriction

    # ------------------------------------------------------------------ inspection

    @property
    def model(self) -> str:
        return self._model

    @property
    def dim(self) -> int | None:
        return self._dim

    def __len__(self) -> int:
        return self._n

    def __contains__(self, canonical_id: object) -> bool:
        return canonical_id in self._pos

    @property
    def nbytes(self) -> int:
        return 0 if self._mat is None else int(self._mat[: self._n].nbytes)

    def ids(self) -> list[str]:
        with self._lock:
            return list(self._ids)

    def hash_of(self, canonical_id: str) -> str | None:
        with self._lock:
            pos = self._pos.get(canonical_id)
            return None if pos is None else self._hashes[pos]

    def kind_of(self, canonical_id: str) -> str | None:
        with self._lock:
            pos = self._pos.get(canonical_id)
            return None if pos is None else self._kind_names[self._codes[pos]]

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
            self._reach_rows = None

    def _reachable_rows(self) -> np.ndarray | None:
        """Sorted row positions the restriction admits (None: no restriction); kept until rows
        are added or removed."""
        reach = self._reach
        if reach is None:
            return None
        hit = self._reach_rows
        if hit is not None and hit[0] == self._version:
            return hit[1]
        rows = np.array([i for i, cid in enumerate(self._ids[: self._n])
                         if cid in reach or ("#" in cid and cid.rpartition("#")[0] in reach)], dtype=np.intp)
        self._reach_rows = (self._version, rows)
        return rows

    def reachable_count(self) -> int:
        """Rows a query may rank: all of them, or those the restriction admits."""
        with self._lock:
            rows = self._reachable_rows()
            return self._n if rows is None else len(rows)

    @property
    def restricted(self) -> bool:
        """Whether a standing restriction (``restrict_to``) applies: a scoped session's index."""
        return self._reach is not None

    def kind_counts(self) -> dict[str, int]:
        """Rows per kind that a query may rank (under a restriction, only the admitted ones: a scoped
        session's counts never include other sessions' vectors)."""
        with self._lock:
            rows = self._reachable_rows()
            codes = self._codes[: self._n] if rows is None else self._codes[rows]
            counts = np.bincount(codes, minlength=len(self._kind_names))
            return {name: int(counts[code]) for code, name in enumerate(self._kind_names) if counts[code]}

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
        cap = len(self._codes)
        if need <= cap and self._mat is not None:
            return
        new_cap = max(need, cap + cap // 2, _MIN_CAPACITY)
        mat = np.zeros((new_cap, self._dim or 0), dtype=np.float32)
        codes = np.zeros(new_cap, dtype=np.int16)
        if self._mat is not None:
            mat[: self._n] = self._mat[: self._n]
        codes[: self._n] = self._codes[: self._n]
        self._mat, self._codes = mat, codes

    def _code(self, kind: str) -> int:
        code = self._kind_codes.get(kind)
        if code is None:
            code = self._kind_codes[kind] = len(self._kind_names)
            self._kind_names.append(kind)
        return code

    def _mismatch(self, width: int, what: str) -> str:
        return (f"dense: {what} has {width} dimensions but the index of {self._model} holds "
                f"{self._dim}-dimensional vectors; it was not used")

    def upsert(self, canonical_id: str, kind: str, vector: np.ndarray, content_hash: str = "") -> str | None:
        """Add or replace one row; returns a warning (and changes nothing) for a wrong-width vector."""
        return next(iter(self.upsert_many([canonical_id], [kind], np.asarray(vector)[None, :],
                                          [content_hash])), None)

    def upsert_many(self, ids: Sequence[str], kinds: Sequence[str], matrix: np.ndarray,
                    hashes: Sequence[str] | None = None) -> list[str]:
        """Add or replace rows in place (no rebuild). Returns warnings: rows of another width than
        the index, or with NaN/inf components, are refused and counted in ``rejected``."""
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
                warnings.append(f"dense: {int((~finite).sum())} vector(s) with NaN or infinite components refused")
            self._grow(self._n + len(ids))
            assert self._mat is not None
            for i, cid in enumerate(ids):
                if not finite[i]:
                    continue
                pos = self._pos.get(cid)
                if pos is None:
                    pos = self._n
                    self._n += 1
                    self._version += 1
                    self._pos[cid] = pos
                    self._ids.append(cid)
                    self._hashes.append("")
                    if "#" in cid:
                        self._parts.setdefault(cid.rpartition("#")[0], set()).add(cid)
                self._mat[pos] = unit[i]
                self._codes[pos] = self._code(kinds[i])
                digest = hashes[i] if hashes is not None else ""
                self._hashes[pos] = digest
                if digest:
                    self._by_hash[digest] = cid
            return warnings

    def remove(self, canonical_id: str) -> bool:
        """Drop one row (the last row moves into its place)."""
        with self._lock:
            pos = self._pos.pop(canonical_id, None)
            if pos is None:
                return False
            if self._by_hash.get(self._hashes[pos]) == canonical_id:
                del self._by_hash[self._hashes[pos]]
            if "#" in canonical_id:
                owner = canonical_id.rpartition("#")[0]
                held = self._parts.get(owner)
                if held is not None:
                    held.discard(canonical_id)
                    if not held:
                        del self._parts[owner]
            last = self._n - 1
            if pos != last:
                moved = self._ids[last]
                assert self._mat is not None
                self._mat[pos] = self._mat[last]
                self._codes[pos] = self._codes[last]
                self._ids[pos] = moved
                self._hashes[pos] = self._hashes[last]
                self._pos[moved] = pos
            self._ids.pop()
            self._hashes.pop()
            self._n = last
            self._version += 1
            return True

    def remove_subtree(self, root: str, separators: tuple[str, ...] = (".",)) -> int:
        """Drop ``root`` and its dotted descendants (never a character prefix: ``memory:4`` keeps
        ``memory:42``, ``orders`` keeps ``orders_archive``); with ``separators=(".", "#")`` their
        parts too (``ds.m`` takes ``ds.m#meaning`` and ``ds.m.c#values``)."""
        prefixes = tuple(root + sep for sep in separators)
        with self._lock:
            doomed = [cid for cid in self._ids if cid == root or cid.startswith(prefixes)]
            for cid in doomed:
                self.remove(cid)
            return len(doomed)

    # ------------------------------------------------------------------ queries

    def _rows_for(self, allow: Iterable[str]) -> np.ndarray:
        """Sorted row positions of the allowed ids present. Mapping ids costs ~0.2 µs each (a
        dictionary probe per id), so the result for a ``frozenset`` is cached until rows are added
        or removed: a caller that keeps its scope as one frozenset pays it once."""
        key = allow if isinstance(allow, frozenset) else None
        if key is not None:
            hit = self._allow_rows.get(key)
            if hit is not None and hit[0] == self._version:
                self._allow_rows.move_to_end(key)
                return hit[1]
        pos = self._pos
        present = (allow.intersection(pos) if isinstance(allow, set | frozenset)
                   else [c for c in allow if c in pos])
        if len(present) > 1:
            rows = np.array(operator.itemgetter(*present)(pos), dtype=np.intp)
        else:
            rows = np.array([pos[c] for c in present], dtype=np.intp)
        rows.sort()
        if key is not None:
            self._allow_rows[key] = (self._version, rows)
            while len(self._allow_rows) > _ALLOW_CACHE:
                self._allow_rows.popitem(last=False)
        return rows

    def top_k(self, query: np.ndarray, k: int, allow: Iterable[str] | None = None,
              kinds: Iterable[str] | None = None, model: str | None = None) -> DenseHits:
        """The ``k`` most similar rows of each kind (of ``kinds``, default all).

        ``allow`` (canonical ids) restricts the candidates *before* ranking, so a row outside it can
        never take a place; ``None`` allows everything. Ties are ordered by canonical id. A query
        of the wrong width, or with no direction, or made by another ``model`` than the index's (when
        given), gives empty rankings and a warning."""
        q = np.asarray(query, dtype=np.float32).ravel()
        with self._lock:
            n = self._n
            if model is not None and model != self._model:
                return DenseHits({}, 0, (f"dense: the question was embedded with {model} but the index "
                                         f"holds {self._model}; not compared",))
            if n == 0 or k <= 0 or self._mat is None:
                return DenseHits({}, 0)
            if q.shape[0] != self._dim:
                return DenseHits({}, 0, (self._mismatch(int(q.shape[0]), "the question's vector"),))
            unit = _unit(q)
            if unit is None or not unit.any():
                return DenseHits({}, 0, ("dense: the question's vector is zero or not finite; not ranked",))
            rows = None if allow is None else self._rows_for(allow)
            reach = self._reachable_rows()
            if reach is not None:  # a scoped session's rows, whatever ``allow`` says
                rows = reach if rows is None else np.intersect1d(rows, reach, assume_unique=True)
            codes = self._codes[:n] if rows is None else self._codes[rows]
            if kinds is not None:
                wanted = [self._kind_codes[x] for x in set(kinds) if x in self._kind_codes]
                keep = np.isin(codes, np.asarray(wanted, dtype=np.int16))
                rows = np.nonzero(keep)[0] if rows is None else rows[keep]
                codes = codes[keep]
            if rows is None:
                scores = self._mat[:n] @ unit
            elif len(rows) * 4 >= n:  # most rows survive: one full scan beats gathering the matrix
                scores = (self._mat[:n] @ unit)[rows]
            else:
                scores = self._mat[rows] @ unit
            ids = self._ids
            by_kind: dict[str, list[tuple[str, float]]] = {}
            for code in np.unique(codes):
                sel = np.nonzero(codes == code)[0]
                sub = scores[sel]
                take = min(k, len(sel))
                top = np.argpartition(-sub, take - 1)[:take] if take < len(sel) else np.arange(len(sel))
                where = sel[top] if rows is None else rows[sel[top]]
                pairs = sorted(((ids[int(p)], float(s)) for p, s in zip(where, sub[top], strict=True)),
                               key=lambda t: (-t[1], t[0]))
                by_kind[self._kind_names[int(code)]] = pairs
            return DenseHits(by_kind, int(len(codes)))
