"""A number per key, handed out in order of first use and never reassigned.

Why: an index keeps an integer per id (a tantivy fast field, a row of a vector matrix, a position in
a postings array), and generations share the table. Since a number is never reused or moved, an
older generation reads only the numbers it already holds while a newer one appends, with no copy
and no lock (one writer: the refresh)."""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from operator import itemgetter
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


H = TypeVar("H", bound=Hashable)


class Numbering(Generic[H]):
    def __init__(self, names: Iterable[H] = ()) -> None:
        self.names: list[H] = list(names)  # number -> key
        self.number: dict[H, int] = dict(zip(self.names, range(len(self.names)), strict=True))

    def of(self, key: H) -> int:
        """The key's number, a new one (the next) the first time."""
        n = self.number.get(key)
        if n is None:
            n = self.number[key] = len(self.names)
            self.names.append(key)
        return n

    def __len__(self) -> int:
        return len(self.names)


def pick(table: Sequence[V] | Mapping[K, V], keys: Sequence[K] | Sequence[int]) -> list[V]:
    """``[table[k] for k in keys]`` in one C call: names of many numbers, numbers of many names."""
    if len(keys) < 2:
        return [table[k] for k in keys]  # type: ignore[index]
    return list(itemgetter(*keys)(table))
