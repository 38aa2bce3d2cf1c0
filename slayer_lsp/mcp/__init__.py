"""The MCP front end: ``slayer-lsp mcp`` serves the engine's search, inspect, status and memory
writes as Model Context Protocol tools, and the store as resources, on stdio (``server.py``).
The SDK is imported only when the server runs."""

from __future__ import annotations


def serve(
    storage: str | None,
    scope=None,
    *,
    dense: str = "live",
    embedding_model: str | None = None,  # noqa: ANN001
    switch_model: bool = False,
) -> int:
    """Run the MCP server on stdio until the client closes it."""
    import anyio

    from slayer_lsp import allocator
    from slayer_lsp.collector import IdleCollector

    allocator.tune()  # a long-lived process: before any thread has an arena

    from slayer_lsp.mcp.server import McpApp, run_stdio

    app = McpApp(storage, scope, dense=dense, embedding_model=embedding_model, switch_model=switch_model)
    collector = IdleCollector()  # full GC passes between requests, not inside them
    app.on_request = collector.touch
    collector.start()
    try:
        anyio.run(run_stdio, app)
    finally:
        collector.stop()
    return 0
