"""A search request after the steps every ranking shares, and what it allows to be ranked.

The pipeline (``pipeline.py``) validates the parameters, resolves the named inputs, runs the
cypher filter and scopes the memories once; a ranking (``rrf.py``, ``hybrid.py``) reads the result
and never widens it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from slayer_lsp.search.recency import today
from slayer_lsp.search.types import SearchParams
from slayer_lsp.store import documents as d


@dataclass
class Request:
    """A search request after the steps both rankings share: validated, inputs resolved leniently,
    the cypher filter run, memories scoped. What is not allowed here can never be ranked."""

    params: SearchParams
    max_results: int
    datasource: str | None
    question: str | None  # None or blank: no channels 2 and 3
    inputs: list[str]  # resolved canonical ids (channel 1)
    warnings: list[str]
    candidate_ids: frozenset[str] | None  # the cypher filter's allowlist
    kind_filter: set[str] | None  # kinds that may come back (cypher label fallback, ``kinds``)
    scoped: list[d.Memory]  # memories the datasource and cypher filters keep, in storage order
    scoped_ids: frozenset[str] | set[str]
    valid: Callable[[str], bool]  # which tags count in this scope
    now: datetime = field(default_factory=today)  # one clock for the whole request (recency.py)

    @property
    def has_question(self) -> bool:
        return bool(self.question and self.question.strip())

    def memory_allowed(self) -> bool:
        return self.kind_filter is None or "memory" in self.kind_filter
