"""What ``slayer-lsp status`` and the daemon's ``slayer/status`` report, in one shape."""

from __future__ import annotations

import msgspec

from slayer_lsp import __version__


class StatusReport(msgspec.Struct, kw_only=True):
    version: str
    store: str
    backend: str
    generation: int
    readable: bool
    error: str | None = None
    counts: dict[str, int]
    load_issues: int
    last_refresh_ms: float
    embedding: dict | None = None  # the worker's EmbeddingStatus, plus its warnings
    # the start-up's background work is under way (the hybrid ranking's indexes, then each
    # datasource's own): answers are the same, some of the first may take longer
    warming: bool = False


def engine_status(engine) -> StatusReport:  # noqa: ANN001 - Engine, imported lazily by callers
    cat = engine.catalog
    counts = cat.counts()  # kept up to date per change: no entity is counted here
    emb = None
    if engine.dense is not None:
        st = engine.dense.status()  # under a scope its counts are the reachable vectors' only
        emb = {**msgspec.to_builtins(st), "warnings": st.warnings()}
    return StatusReport(
        version=__version__,
        store=str(engine.location.path),
        backend=engine.location.backend,
        generation=cat.generation,
        readable=cat.fatal is None,
        error=cat.fatal,
        counts=dict(sorted(counts.items())),
        load_issues=cat.issue_count,
        last_refresh_ms=round(engine.stats.last_refresh_s * 1000, 1),
        embedding=emb,
        warming=engine.warming,
    )


def format_status(r: StatusReport) -> str:
    lines = [
        f"slayer-lsp {r.version}",
        f"store: {r.store} ({r.backend})",
        "state: " + ("readable" if r.readable else f"UNREADABLE, serving the last good snapshot: {r.error}"),
        "entities: " + ", ".join(f"{n} {k}" for k, n in r.counts.items()),
        f"load issues: {r.load_issues}",
    ]
    e = r.embedding
    if e is None:
        lines.append("embeddings: off (no stored vectors for the configured model; run `slayer-lsp embed`)")
    else:
        lines.append(
            f"embeddings: {e['model']} dim={e['dim']} state={e['state']} rows={e['rows']} "
            f"pending={e['pending']} failed={e['failed']}"
            + (f" last error: {e['last_error']}" if e["last_error"] else "")
        )
        lines.extend(f"  warning: {w}" for w in e["warnings"])
        parts = e.get("parts")
        if parts:
            lines.append(
                f"  part vectors (facets): state={parts['state']} rows={parts['rows']} "
                f"pending={parts['pending']} failed={parts['failed']} "
                + " ".join(f"{k}={n}" for k, n in parts["kinds"].items())
            )
    return "\n".join(lines)
