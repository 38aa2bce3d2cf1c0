"""Persistent id sets: what the indexes of one snapshot share with the next without changing it.

An index of a snapshot maps keys (a stem, a tag, a memory) to frozen sets of ids in an
``immutables.Map``. The next snapshot's map is derived by ``moved``: only the keys a delta moved
are copied, every other entry is the same object in both, and nothing the older snapshot holds is
ever changed in place.
"""

from __future__ import annotations

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
