"""A number per key, handed out in order of first use and never reassigned.

Why: an index keeps an integer per id (a tantivy fast field, a row of a vector matrix, a position in
a postings array), and generations share the table. Since a number is never reused or moved, an
older generation reads only the numbers it already holds while a newer one appends, with no copy
and no lock (one writer: the refresh)."""

from __future__ import annotations

import threading
from collections.abc import Hashable, Iterable, Mapping, Sequence
from operator import itemgetter
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


H = TypeVar("H", bound=Hashable)


class Numbering(Generic[H]):
    """``names`` (number -> key) is there at once; the reverse map (key -> number) is made on first
    use. A restart reopens an index of 400,000 names that only its next edit numbers anew: making
    that dict up front was 0.2 s of the start. ``prepare`` makes it off the path (the warm-up); the
    one thread that numbers (the refresh) may also make it itself, under the same lock."""

    def __init__(self, names: Iterable[H] = ()) -> None:
        self.names: list[H] = list(names)  # number -> key
        self._number: dict[H, int] | None = None if self.names else {}
        self._making = threading.Lock()

    @property
    def number(self) -> dict[H, int]:
        """key -> number (made on first use)."""
        number = self._number
        if number is None:
            with self._making:
                number = self._number
                if number is None:  # nobody numbers meanwhile: ``of`` comes here first
                    names = self.names
                    number = self._number = dict(zip(names, range(len(names)), strict=True))
        return number

    def prepare(self) -> None:
        """Make the reverse map now, so that the first ``of`` does not wait for it."""
        self.number  # noqa: B018 - made on first use

    def of(self, key: H) -> int:
        """The key's number, a new one (the next) the first time."""
        number = self._number if self._number is not None else self.number
        n = number.get(key)
        if n is None:
            n = number[key] = len(self.names)
            self.names.append(key)
        return n

    def __len__(self) -> int:
        return len(self.names)


def pick(table: Sequence[V] | Mapping[K, V], keys: Sequence[K] | Sequence[int]) -> list[V]:
    """``[table[k] for k in keys]`` in one C call: names of many numbers, numbers of many names."""
    if len(keys) < 2:
        return [table[k] for k in keys]  # type: ignore[index]
    return list(itemgetter(*keys)(table))
