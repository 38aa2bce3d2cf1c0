"""Persistent id sets: what the indexes of one snapshot share with the next without changing it.

An index of a snapshot maps keys (a stem, a tag, a memory) to frozen sets of ids in an
``immutables.Map``. The next snapshot's map is derived by ``moved``: only the keys a delta moved
are copied, every other entry is the same object in both, and nothing the older snapshot holds is
ever changed in place.
"""

from __future__ import annotations

from collections.abc import Iterator

from immutables import Map

Moves = dict[str, tuple[set[str], set[str]]]  # key -> (ids that leave it, ids that join it)


def note(moves: Moves, key: str, member: str, *, joins: bool) -> None:
    """Record that ``member`` leaves (``joins`` False) or joins the set of ``key``."""
    moves.setdefault(key, (set(), set()))[1 if joins else 0].add(member)


def moved(sets: Map[str, frozenset[str]], moves: Moves) -> Map[str, frozenset[str]]:
    """``sets`` with each key's members moved as ``moves`` says (leaving first, then joining); a
    set left empty is dropped."""
    if not moves:
        return sets
    out = sets.mutate()
    for key, (gone, new) in moves.items():
        members = (out.get(key, frozenset()) - gone) | new
        if members:
            out[key] = frozenset(members)
        else:
            out.pop(key, None)
    return out.finish()


_ABSENT = object()


class LayeredMap:
    """A read-only ``str -> str`` map shared between generations: a base dict that is never changed
    once made, and a persistent overlay of what changed since (a value, or None for a removal).

    Why: an index's membership of 400,000 ids as one ``immutables.Map`` took 0.5 s to build at every
    start and every rebuild, where a dict takes 0.05 s; yet each commit must derive the next map
    without touching the one older views hold. The overlay gives that (a commit costs what it
    changed); once it holds as many changes as the base holds ids, a commit folds both into a new base.
    """

    __slots__ = ("_base", "_over", "_len")

    def __init__(self, base: dict[str, str] | None = None) -> None:
        self._base: dict[str, str] = base if base is not None else {}
        self._over: Map[str, str | None] = Map()
        self._len = len(self._base)

    @classmethod
    def _of(cls, base: dict[str, str], over: Map[str, str | None], length: int) -> LayeredMap:
        out = cls.__new__(cls)
        out._base, out._over, out._len = base, over, length
        return out

    def get(self, key: str, default: str | None = None) -> str | None:
        value = self._over.get(key, _ABSENT)
        if value is _ABSENT:
            return self._base.get(key, default)
        return default if value is None else value  # type: ignore[return-value]

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, str):
            return False
        value = self._over.get(key, _ABSENT)
        if value is _ABSENT:
            return key in self._base
        return value is not None

    def __len__(self) -> int:
        return self._len

    def items(self) -> Iterator[tuple[str, str]]:
        """Every (key, value): the base's in its order, then the overlay's additions."""
        over = self._over
        for key, value in self._base.items():
            now = over.get(key, _ABSENT)
            if now is _ABSENT:
                yield key, value
            elif now is not None:
                yield key, now  # type: ignore[misc]
        for key, now in over.items():
            if now is not None and key not in self._base:
                yield key, now

    def __iter__(self) -> Iterator[str]:
        return (key for key, _ in self.items())

    def mutate(self) -> LayeredMutation:
        return LayeredMutation(self)


class LayeredMutation:
    """The changes of one commit to a ``LayeredMap``, gathered in a plain dict; ``finish`` makes the
    next map (the one it started from is left as it was)."""

    __slots__ = ("_from", "_writes", "_len")

    def __init__(self, start: LayeredMap) -> None:
        self._from = start
        self._writes: dict[str, str | None] = {}
        self._len = len(start)

    def get(self, key: str) -> str | None:
        if key in self._writes:
            return self._writes[key]
        return self._from.get(key)

    def pop(self, key: str, default: str | None = None) -> str | None:
        value = self.get(key)
        if value is None:
            return default
        self._writes[key] = None
        self._len -= 1
        return value

    def __setitem__(self, key: str, value: str) -> None:
        if self.get(key) is None:
            self._len += 1
        self._writes[key] = value

    def finish(self) -> LayeredMap:
        start, writes = self._from, self._writes
        if not writes:
            return start
        pending = len(start._over) + len(writes)
        if pending >= len(start._base):  # as many changes as ids: fold them into a new base
            base = dict(start.items())
            for key, value in writes.items():
                if value is None:
                    base.pop(key, None)
                else:
                    base[key] = value
            return LayeredMap(base)
        over = start._over.mutate()
        for key, value in writes.items():
            over[key] = value
        return LayeredMap._of(start._base, over.finish(), self._len)
