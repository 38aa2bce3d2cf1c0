"""The language server front end: ``serve(argv)`` runs it on stdio."""

from __future__ import annotations

import argparse
import gc
import logging
import sys


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="slayer-lsp serve", description="Run the SLayer language server on stdio."
    )
    p.add_argument(
        "--storage",
        help="the store: a YAML directory, a SQLite file, or a yaml:// / sqlite:// URI "
        "(default: $SLAYER_STORAGE, $SLAYER_MODELS_DIR, then the XDG data dir); "
        "fixed for the session: the client's 'storage' option cannot change it",
    )
    p.add_argument(
        "--log-level",
        default=None,
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="stderr log level of the server (default INFO)",
    )
    return p


class _QuietInvalidParams(logging.Filter):
    """pygls logs a traceback for every error response; a refused request (bad params, a write the
    store refused) is not a server fault. Internal errors (-32603) keep their traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        from pygls.exceptions import JsonRpcException, JsonRpcInternalError

        exc = record.exc_info[1] if record.exc_info else None
        return (
            not isinstance(exc, JsonRpcException)
            or isinstance(exc, JsonRpcInternalError)
            or exc.code == JsonRpcInternalError.CODE
        )


def serve(argv: list[str] | None = None) -> int:
    """Run the server until the client says exit. Only JSON-RPC is written to stdout: the real
    stdout is handed to the transport and ``sys.stdout`` is pointed at stderr for stray prints."""
    args = build_parser().parse_args(argv)
    from slayer_lsp import allocator
    from slayer_lsp.collector import IdleCollector

    allocator.tune()  # a long-lived process: before any thread has an arena
    collector = IdleCollector()  # full GC passes between requests, not inside them
    if not logging.getLogger().handlers:
        logging.basicConfig(
            stream=sys.stderr, level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
        )
    ours = logging.getLogger("slayer_lsp")
    if args.log_level:
        ours.setLevel(getattr(logging, args.log_level))
    elif ours.getEffectiveLevel() > logging.INFO:
        ours.setLevel(logging.INFO)  # the effective configuration is logged at INFO
    logging.getLogger("pygls.protocol.json_rpc").addFilter(_QuietInvalidParams())
    # the server's modules (lsprotocol's types above all) make objects that live as long as the
    # process: no GC pass over them while they are made (0.3-0.4 s of a start; the first build then
    # freezes them with its own, see engine._BuildWithoutGc)
    collecting = gc.isenabled()
    gc.disable()
    from slayer_lsp.lsp.server import server

    if collecting:
        gc.enable()

    server.cli_storage = args.storage
    wire = sys.stdout.buffer
    sys.stdout = sys.stderr
    collector.start()
    try:
        server.start_io(sys.stdin.buffer, wire, on_frame=collector.touch)
    finally:
        collector.stop()
        if server.watcher is not None:
            server.watcher.stop(timeout=1.0)
        server.close_engines()  # an exit without shutdown still saves the caches
    return 0
