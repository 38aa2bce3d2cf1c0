"""The session's scope: the datasources a session may see and the SLayer ``access_tags`` its caller
holds, as a value parsed from front-end options (``serve --scope-...``, editor settings, MCP).

The scope is only the question. What it reaches, the reachable catalog derived from each full
snapshot, is ``reach.reachable``.

``Scope.access_tags``: ``None`` means no access restriction (SLayer's ``bypass``); a tuple is the
caller's tags, so ``()`` is a caller holding no tag, who reaches untagged models only.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from slayer_lsp.store import documents as d

__all__ = ["Scope"]


@dataclass(frozen=True)
class Scope:
    """What one session may reach. ``datasources=()``: every datasource. ``access_tags=None``: no
    access restriction; a tuple: the caller's tags (``()`` = none, untagged models only)."""

    datasources: tuple[str, ...] = ()
    access_tags: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "datasources", _names(self.datasources, "datasource"))
        if self.access_tags is not None:
            object.__setattr__(self, "access_tags", _names(self.access_tags, "access tag"))

    @classmethod
    def of(
        cls,
        datasources: Iterable[str] | None = None,
        access_tags: Iterable[str] | None = None,
        untagged_only: bool = False,
    ) -> Scope:
        """A scope from front-end options, where an empty tag list means "no restriction" (an editor
        cannot unset a list setting): ``untagged_only`` says "the caller holds no tag"."""
        tags = tuple(access_tags or ())
        return cls(tuple(datasources or ()), tags if tags or untagged_only else None)

    @property
    def unrestricted(self) -> bool:
        return not self.datasources and self.access_tags is None

    def admits_datasource(self, name: str | None) -> bool:
        return not self.datasources or (name or "") in self.datasources

    def admits_tags(self, tags: Iterable[str]) -> bool:
        """SLayer's ``can_access``: untagged, or sharing a tag with the caller."""
        if self.access_tags is None:
            return True
        tags = list(tags)
        return not tags or not set(tags).isdisjoint(self.access_tags)

    def admits_model(self, model: d.Model) -> bool:
        """The model's own check (its datasource and tags), before what it reads is considered."""
        return self.admits_datasource(model.data_source) and self.admits_tags(model.access_tags)

    def key(self) -> str:
        """A short stable digest of the scope (names a scope's own cache directory)."""
        import hashlib

        return hashlib.blake2b(repr((self.datasources, self.access_tags)).encode(), digest_size=6).hexdigest()

    def __str__(self) -> str:
        if self.unrestricted:
            return "everything"
        parts = []
        if self.datasources:
            parts.append("datasources " + ", ".join(self.datasources))
        if self.access_tags is not None:
            parts.append("access tags " + (", ".join(self.access_tags) if self.access_tags else "(none)"))
        return "; ".join(parts)


def _names(values: Iterable[str], what: str) -> tuple[str, ...]:
    if isinstance(values, str):
        values = (values,)
    out = []
    for v in values:
        if not isinstance(v, str) or not v.strip():
            raise ValueError(f"a scope's {what} must be a non-empty string, got {v!r}")
        out.append(v.strip())
    return tuple(sorted(set(out)))
