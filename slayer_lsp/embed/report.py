"""What the embedding worker reports: the dense channel's counters and those of its part vectors.

These structs cross the process boundary (``slayer-lsp status``, the daemon's ``slayer/status``),
so they are msgspec structs; ``warnings()`` is what a search response says about a channel that is
not complete or not healthy.
"""

from __future__ import annotations

import msgspec


class PartsStatus(msgspec.Struct, frozen=True, kw_only=True):
    """The part vectors (facets, memory pieces): the same counters, with rows per part kind."""

    state: str
    rows: int
    embedded: int
    reused: int
    pending: int
    failed: int
    last_error: str | None = None
    store: str = ""
    kinds: dict[str, int] = {}  # rows per part kind ("column#values": 268)

    def warnings(self) -> list[str]:
        out: list[str] = []
        if self.state == "blocked":
            out.append("facets: part vectors wait for the model switch of the dense channel")
        elif self.state in ("starting", "loading"):
            out.append(f"facets: still loading stored part vectors ({self.rows} so far)")
        if self.pending:
            out.append(
                f"facets: {self.pending} parts still waiting to be embedded; ranked the {self.rows} embedded"
            )
        if self.failed:
            out.append(f"facets: {self.failed} parts failed to embed ({self.last_error})")
        return out


class EmbeddingStatus(msgspec.Struct, frozen=True, kw_only=True):
    """What ``slayer-lsp status`` and the daemon report about the dense channel."""

    model: str
    dim: int | None
    state: str  # starting | loading | idle | embedding | retrying | blocked | stopped
    rows: int  # vectors of ``model`` in memory, i.e. searchable
    embedded: int  # texts embedded by this worker since it started
    reused: int  # vectors taken as current instead of embedding again (stored, or of an identical text)
    pending: int  # texts waiting (queued, in flight, and the rest of a running backfill)
    failed: int  # texts that failed after every retry (until enqueued again or retry_failed())
    last_error: str | None = None
    store: str = ""
    other_models: dict[str, int] = {}  # rows of other models in the table, never compared with ours
    parts: PartsStatus | None = None  # the part vectors, when the worker keeps them

    def warnings(self) -> list[str]:
        """One-line warnings for a search response (empty when the channel is complete and healthy)."""
        out: list[str] = []
        if self.state == "blocked":
            out.append(blocked_message(self.model, self.other_models))
        elif self.state == "loading":
            out.append(f"dense: still loading stored vectors of {self.model} ({self.rows} so far)")
        if self.pending:
            out.append(
                f"dense: {self.pending} entities still waiting to be embedded; "
                f"ranked the {self.rows} embedded"
            )
        if self.failed:
            out.append(f"dense: {self.failed} entities failed to embed ({self.last_error})")
        return out


def blocked_message(model: str, others: dict[str, int]) -> str:
    if not others:  # a scoped session does not see the other models' rows
        return (
            f"dense: the stored vectors were made with another model and none with {model}; switch "
            f"model (--switch-model) to embed everything with {model}"
        )
    theirs, n = max(others.items(), key=lambda kv: kv[1])
    return (
        f"dense: the stored vectors were made with {theirs} ({n} rows) and none with {model}; set "
        f"SLAYER_EMBEDDING_MODEL={theirs} to use them, or switch model (--switch-model) to embed "
        f"everything with {model}"
    )
