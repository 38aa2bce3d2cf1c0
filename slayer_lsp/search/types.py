"""The wire shapes of search: parameters in, SLayer's ``SearchResponse`` out.

These are msgspec structs because they cross the process boundary (JSON-RPC, CLI JSON); their field
names and order follow SLayer's Pydantic models so that a client of SLayer reads ours unchanged.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

MAX_RESULTS_CAP = 1000  # a request for more is bounded, not refused
MAX_QUESTION_CHARS = 4000  # longer questions are cut (with a warning) before they reach the index
MAX_RELATED_HOPS = 3  # link hops through ``memory:<id>`` tags; more is bounded, not refused


class SearchParams(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """SLayer's search surface — ``search(entities, query, question, datasource, max_results,
    cypher_filter, compact)`` — and what slayer-lsp adds on top of it.

    ``ranking``: "hybrid" (the default: channels scored together with name, value, table and
    datasource evidence, join keys completed, memories matched by their pieces) or "slayer"
    (SLayer 1.4.1's exact pipeline: RRF k = 60 over its channels; the extra fields below that
    only the hybrid ranking understands — keyword, related, facet — are then refused)."""

    entities: list[str] | None = None
    query: dict[str, Any] | None = None
    question: str | None = None
    datasource: str | None = None
    max_results: int = 10
    cypher_filter: str | None = None
    compact: bool = True
    ranking: Literal["hybrid", "slayer"] = "hybrid"
    kinds: list[str] | None = None  # only these kinds come back (excluded before ranking)
    min_score: float | None = None  # no cutoff unless given; scores are not comparable across queries
    limit: int | None = None  # the same as max_results (the name agents know); wins when both are given
    keyword: str | None = None  # a term to match literally, trusted less than a token taken from the question
    related: int = 0  # hops through memory:<id> links from the memories that matched
    facet: str | None = None  # rank by one facet of an entity (see slayer/searchFacets)


class SearchHit(msgspec.Struct, kw_only=True):
    kind: str
    id: str
    score: float
    text: str = ""
    description: str | None = None
    matched_entities: list[str] = []
    query: dict[str, Any] | None = None
    # a memory reached by a link hop (``related``): the ``memory:<id>`` it was reached from; absent
    # otherwise, so that a hit has exactly SLayer's fields unless slayer-lsp has more to say
    via: str | msgspec.UnsetType = msgspec.UNSET


class SearchResponse(msgspec.Struct, kw_only=True):
    results: list[SearchHit] = []
    resolved_input_entities: list[str] = []
    warnings: list[str] = []


class SearchError(ValueError):
    """A request SLayer would refuse (unknown datasource, max_results < 1, a bad cypher_filter)."""


def parse_params(raw: Any) -> SearchParams:
    """Decode untrusted params (a dict from JSON-RPC or the CLI); raises ``SearchError`` with the reason."""
    try:
        return msgspec.convert(raw, SearchParams)
    except msgspec.ValidationError as exc:
        raise SearchError(f"invalid search parameters: {exc}") from exc


def to_builtins(response: SearchResponse) -> dict[str, Any]:
    return msgspec.to_builtins(response)
