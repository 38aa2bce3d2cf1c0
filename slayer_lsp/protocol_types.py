"""The wire shapes of the daemon's custom requests that have no msgspec type of their own elsewhere.

``slayer/search`` is described by ``search.types`` and ``slayer/inspect``'s items by
``analysis.inspect``; this module adds the rest: inspect's params and located items, the status
the server reports (``status.StatusReport`` plus what only the server knows), and the memory writes.
``protocol/generate.py`` turns the types of the server's request table (``lsp.custom_requests``)
into the JSON Schemas of ``protocol/schemas``, and the server decodes params with the same types,
so the schemas say exactly what it accepts. Field names are the wire names; a client should ignore
fields it does not know (results may grow).
"""

from __future__ import annotations

from typing import Any

import msgspec

from slayer_lsp.analysis.inspect import InspectItem
from slayer_lsp.embed.report import PartsStatus


class Position(msgspec.Struct, kw_only=True):
    """0-based line and character, in the position encoding negotiated at initialize (UTF-16 unless
    the client offered another)."""

    line: int
    character: int


class Range(msgspec.Struct, kw_only=True):
    start: Position
    end: Position


class Location(msgspec.Struct, kw_only=True):
    """An LSP location: a file URI (the YAML file of the entity, or the SQLite store file) and range."""

    uri: str
    range: Range


MAX_INSPECT_REFS = 1000  # references per slayer/inspect request


class InspectParams(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The MCP ``inspect`` tool's arguments. ``refs``: references as a user would type them
    (``orders.amount``, ``sum(orders.amount)``, ``memory:3``)."""

    refs: list[str]


class InspectRequestParams(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``slayer/inspect``: ``refs``, references as a user would type them (``orders.amount``,
    ``sum(orders.amount)``, ``memory:3``), a list or a single string; ``references`` and
    ``reference`` are other names for it (``refs`` wins, then ``references``). At most 1000
    references (``MAX_INSPECT_REFS``)."""

    refs: list[str] | str | msgspec.UnsetType = msgspec.UNSET
    references: list[str] | str | msgspec.UnsetType = msgspec.UNSET
    reference: list[str] | str | msgspec.UnsetType = msgspec.UNSET

    def wanted(self) -> list[str]:
        """The references asked for; ``ValueError`` when there are none or too many."""
        wanted: list[str] = []
        for given in (self.refs, self.references, self.reference):
            if not isinstance(given, msgspec.UnsetType):
                wanted = [given] if isinstance(given, str) else list(given)
                break
        if not wanted:
            raise ValueError("'refs' must be a non-empty list of strings")
        if len(wanted) > MAX_INSPECT_REFS:
            raise ValueError(f"{len(wanted)} references; at most {MAX_INSPECT_REFS} per request")
        return wanted


class LocatedInspectItem(InspectItem, kw_only=True, omit_defaults=True):
    """An inspect item with the definition's location in the store, when it has one."""

    location: Location | None = None


class InspectResult(msgspec.Struct, kw_only=True):
    items: list[LocatedInspectItem]


class StatusParams(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``slayer/status`` takes no parameters (``{}`` or none)."""


class EmbeddingReport(msgspec.Struct, kw_only=True):
    """The dense channel's worker (``embed.worker.EmbeddingStatus``) with its current warnings."""

    model: str
    dim: int | None
    state: str
    rows: int
    embedded: int
    reused: int
    pending: int
    failed: int
    last_error: str | None = None
    store: str = ""
    other_models: dict[str, int] = {}
    parts: PartsStatus | None = None  # the part-vector worker: the same counters, rows per part kind
    warnings: list[str] = []


class ServerStatus(msgspec.Struct, kw_only=True):
    """What ``slayer/status`` answers, at once even while the first index is being built: the fields
    from ``generation`` to ``issues`` appear once it is done (``ready``)."""

    version: str
    store: str | None = None  # the store path (absent when no store could be opened)
    backend: str | None = None  # "yaml" | "sqlite"
    generation: int | None = None
    readable: bool | None = None
    error: str | None = None  # why the store cannot be read now (the last good snapshot keeps serving)
    counts: dict[str, int] | None = None  # entities per kind
    load_issues: int | None = None
    last_refresh_ms: float | None = None
    warming: bool | None = None  # the start-up's background work (indexes built ahead of use) is under way
    embedding: EmbeddingReport | None = None
    refreshes: int | None = None
    last_delta_size: int | None = None
    issues: list[str] | None = None  # the first 50 load issues, as text
    ready: bool
    indexing: bool
    server_error: str | None = None  # the store could not be opened at all
    options: dict[str, Any]  # the effective options, in the camelCase shape of initializationOptions
    option_problems: list[str] = []
    open_documents: int
    watching: str | None = None
    uptime_s: float


class SaveMemoryParams(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Save a memory as SLayer's ``save_memory`` does: ``entities`` (references, resolved strictly)
    or ``query`` (a SlayerQuery whose references become the tags), not both. ``linked_entities`` is
    SLayer's spelling of either (a list or an object). ``id`` upserts that memory; without it the
    next free integer id is used."""

    learning: str
    entities: list[str] | None = None
    query: dict[str, Any] | None = None
    linked_entities: list[str] | dict[str, Any] | None = None
    id: str | int | None = None
    description: str | None = None

    def links(self) -> tuple[list[str] | None, dict[str, Any] | None]:
        """(entities, query) to tag the memory with, whichever spelling was used; ``ValueError``
        when both spellings or neither are given."""
        entities, query = self.entities, self.query
        if self.linked_entities is not None:
            if entities is not None or query is not None:
                raise ValueError("give 'linked_entities' or 'entities'/'query', not both")
            linked = self.linked_entities
            entities, query = (None, linked) if isinstance(linked, dict) else (linked, None)
        if entities is None and query is None:
            raise ValueError("give 'entities' (a list of references) or 'query' (an object)")
        return entities, query


class SaveMemoryResult(msgspec.Struct, kw_only=True):
    id: str
    entities: list[str]  # the canonical tags stored
    created: bool  # False when an existing memory was replaced
    warnings: list[str] = []


class ForgetMemoryParams(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    id: str | int


class ForgetMemoryResult(msgspec.Struct, kw_only=True):
    forgotten: bool  # False when the store had no such memory (nothing changed)


class ImpactParams(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``entity``: a canonical id of a datasource, model, column, measure or aggregation
    (``jaffle.orders.status``)."""

    entity: str


class ImpactUse(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One dependent: a query or memory file (``name`` is its URI, or ``memory:<id>``), a measure or
    aggregation (its canonical id), a join (``ds.model → target``) or a model's filters. ``target`` is
    the entity it names; ``via`` the chain from the asked entity to it (empty when direct). A query
    file that names the entity several times appears once per mention. ``location`` is absent when
    the dependent has none."""

    kind: str
    name: str
    target: str
    via: list[str]
    location: Location | None = None


class ImpactResult(msgspec.Struct, kw_only=True):
    """``counts``: distinct dependents per kind; ``summary``: the code lens title
    ("3 queries · 2 memories · 1 measure")."""

    entity: str
    kind: str
    summary: str
    counts: dict[str, int]
    uses: list[ImpactUse]
