"""A map shared between generations that is cheap to make whole and cheap to change a little.

An index's membership, or the catalog's entity map, holds 400,000 ids at 10,000 models. As one
``immutables.Map`` it took 0.5 s to build at every start and every rebuild (a dict takes 0.05 s), yet
each change must derive the next map without touching the one older snapshots hold. A
``LayeredMap`` is a base dict that is never changed once made, and a persistent overlay
(``immutables.Map``) of what changed since: a value, or None for a removal. A change costs what it
changed; once the overlay holds as many changes as the base holds keys, the next change folds both
into a new base (amortised, as a dict's own resizes are).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, TypeVar, overload

from immutables import Map

V = TypeVar("V")
T = TypeVar("T")

_ABSENT: Any = object()


class LayeredMap(Mapping[str, V], Generic[V]):
    """A read-only map: a base dict plus a persistent overlay of later changes (see the module)."""

    __slots__ = ("_base", "_over", "_len")

    def __init__(self, base: dict[str, V] | None = None) -> None:
        self._base: dict[str, V] = base if base is not None else {}
        self._over: Map[str, V | None] = Map()
        self._len = len(self._base)

    @classmethod
    def _of(cls, base: dict[str, V], over: Map[str, V | None], length: int) -> LayeredMap[V]:
        out: LayeredMap[V] = cls.__new__(cls)
        out._base, out._over, out._len = base, over, length
        return out

    @overload
    def get(self, key: str) -> V | None: ...
    @overload
    def get(self, key: str, default: V | T) -> V | T: ...
    def get(self, key: str, default: Any = None) -> Any:
        value = self._over.get(key, _ABSENT)
        if value is _ABSENT:
            return self._base.get(key, default)
        return default if value is None else value

    def __getitem__(self, key: str) -> V:
        value = self.get(key, _ABSENT)
        if value is _ABSENT:
            raise KeyError(key)
        return value

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, str):
            return False
        value = self._over.get(key, _ABSENT)
        if value is _ABSENT:
            return key in self._base
        return value is not None

    def __len__(self) -> int:
        return self._len

    def getter(self) -> Callable[[str], V | None]:
        """``get`` for a loop of many lookups: the base dict's own (C) method while nothing is
        layered over it, as after a first build."""
        return self._base.get if not self._over else self.get

    def membership(self) -> Callable[[str], bool]:
        """``in`` for a loop of many tests: the base dict's own (C) method while nothing is layered
        over it."""
        return self._base.__contains__ if not self._over else self.__contains__

    def pairs(self) -> Iterator[tuple[str, V]]:
        """Every (key, value), without a lookup per key: the base's in its order, then the overlay's
        additions."""
        base, over = self._base, self._over
        if not over:
            yield from base.items()
            return
        for key, value in base.items():
            now = over.get(key, _ABSENT)
            if now is _ABSENT:
                yield key, value
            elif now is not None:
                yield key, now
        for key, now in over.items():
            if now is not None and key not in base:
                yield key, now

    def __iter__(self) -> Iterator[str]:
        if not self._over:  # after a first build: the dict's own iterator (400,000 ids in C)
            return iter(self._base)
        return (key for key, _ in self.pairs())

    def mutate(self) -> LayeredMutation[V]:
        return LayeredMutation(self)


class LayeredMutation(Generic[V]):
    """The changes of one commit to a ``LayeredMap``, gathered in a plain dict; ``finish`` makes the
    next map (the one it started from is left as it was)."""

    __slots__ = ("_from", "_writes", "_len")

    def __init__(self, start: LayeredMap[V]) -> None:
        self._from = start
        self._writes: dict[str, V | None] = {}
        self._len = len(start)

    def get(self, key: str) -> V | None:
        # one frame per call, lookups inlined: a first build sets 400,000 keys through here
        value = self._writes.get(key, _ABSENT)
        if value is _ABSENT:
            start = self._from
            value = start._over.get(key, _ABSENT)
            if value is _ABSENT:
                return start._base.get(key)
        return value

    def __contains__(self, key: str) -> bool:
        return self.get(key) is not None

    def pop(self, key: str, default: V | None = None) -> V | None:
        value = self.get(key)
        if value is None:
            return default
        self._writes[key] = None
        self._len -= 1
        return value

    def __setitem__(self, key: str, value: V) -> None:
        writes = self._writes
        old = writes.get(key, _ABSENT)
        if old is _ABSENT:
            start = self._from
            old = start._over.get(key, _ABSENT)
            if old is _ABSENT:
                old = start._base.get(key)
        if old is None:
            self._len += 1
        writes[key] = value

    def finish(self) -> LayeredMap[V]:
        start, writes = self._from, self._writes
        if not writes:
            return start
        if len(start._over) + len(writes) >= len(start._base):  # fold into a new base
            base: dict[str, Any] = dict(start.pairs())
            base.update(writes)
            if None in writes.values():  # removals (a scan in C first: most commits remove nothing)
                for key in [key for key, value in writes.items() if value is None]:
                    del base[key]
            return LayeredMap(base)
        over = start._over.mutate()
        for key, value in writes.items():
            over[key] = value
        return LayeredMap._of(start._base, over.finish(), self._len)


def getter(mapping: Mapping[str, V]) -> Callable[[str], V | None]:
    """The fastest ``get`` of any mapping of the catalog (see ``LayeredMap.getter``)."""
    return mapping.getter() if isinstance(mapping, LayeredMap) else mapping.get
