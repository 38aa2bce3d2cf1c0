"""``slayer-lsp``: the language server (default), and the ``search``, ``inspect`` and ``--check``
front ends over the same engine. Front ends only translate: arguments in, engine calls, text out.

Exit codes: 0 success, 1 findings or a failed lookup, 2 usage or internal error.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from slayer_lsp import __version__
from slayer_lsp.cli import check

if TYPE_CHECKING:
    from slayer_lsp.reach.scope import Scope


def _storage_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--storage",
        metavar="PATH",
        help="store path or URI (default: $SLAYER_STORAGE, $SLAYER_MODELS_DIR, then the XDG data dir)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="slayer-lsp", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action="version", version=f"slayer-lsp {__version__}")
    parser.add_argument("-v", "--verbose-log", action="store_true", help="debug logging on stderr")
    parser.add_argument(
        "--check",
        action="store_true",
        help="same as the check subcommand: slayer-lsp --check [PATH...] [--storage PATH] "
        "[--format text|json|github|sarif] [--fail-on error|warning]",
    )
    sub = parser.add_subparsers(dest="command")
    check.add_parser(sub)

    schema = sub.add_parser(
        "schema",
        help="print the JSON Schema of SLayer query files or memory front matter "
        "(for editors' YAML and JSON validation)",
    )
    schema.add_argument("kind", choices=("query", "memory"))

    serve = sub.add_parser("serve", help="run the language server on stdio (the default)")
    _storage_arg(serve)
    check.add_scope_arguments(serve)

    mcp = sub.add_parser(
        "mcp",
        help="run the MCP server on stdio (tools: search, search_facets, inspect, status, "
        "save_memory, forget_memory; the store as resources)",
    )
    _storage_arg(mcp)
    check.add_scope_arguments(mcp)
    mcp.add_argument(
        "--no-embedding",
        action="store_true",
        help="no dense channel (no embedding model is loaded; search keeps its lexical channels)",
    )
    mcp.add_argument(
        "--embedding-model",
        metavar="M",
        help="a litellm <provider>/<model> (default: $SLAYER_EMBEDDING_MODEL, else the offline MiniLM)",
    )
    mcp.add_argument(
        "--switch-model",
        action="store_true",
        help="re-embed with the configured model even though the store holds another model's vectors",
    )
    mcp.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="stderr log level of the server (default INFO)",
    )

    search = sub.add_parser("search", help="search the store (SLayer's search surface)")
    _storage_arg(search)
    search.add_argument("--entity", action="append", dest="entities", metavar="E", help="an entity reference")
    search.add_argument(
        "--query", metavar="JSON|@FILE", help="a SlayerQuery as JSON, or @file (JSON or YAML)"
    )
    search.add_argument("--question", metavar="Q")
    search.add_argument("--datasource", metavar="D")
    search.add_argument("--max-results", type=int, default=10, metavar="N")
    search.add_argument("--cypher-filter", metavar="C")
    search.add_argument(
        "--ranking",
        choices=["hybrid", "slayer"],
        default="hybrid",
        help="hybrid (default) or slayer (SLayer 1.4.1's RRF pipeline, for identical answers)",
    )
    search.add_argument(
        "--kind",
        action="append",
        dest="kinds",
        metavar="K",
        help="only this kind (repeatable): datasource, model, column, measure, aggregation, memory",
    )
    search.add_argument(
        "--min-score", type=float, default=None, metavar="S", help="drop hits scoring below S"
    )
    search.add_argument("--keyword", metavar="W", help="a term to match literally (hybrid)")
    search.add_argument("--related", type=int, default=0, metavar="N", help="memory link hops (hybrid)")
    search.add_argument("--facet", metavar="F", help="rank by one facet, e.g. meaning or values (hybrid)")
    search.add_argument("--format", choices=["text", "json"], default="text")
    search.add_argument("--verbose", action="store_true", help="full text per hit (compact=False)")
    check.add_scope_arguments(search)
    search.add_argument(
        "--no-dense",
        action="store_true",
        help="skip the embedding channel (by default it ranks the vectors stored for the "
        "configured model, $SLAYER_EMBEDDING_MODEL or the offline MiniLM)",
    )

    facets = sub.add_parser(
        "search-facets",
        help="rank one kind's entities on several facets at once, by the weakest (slayer/searchFacets)",
    )
    _storage_arg(facets)
    facets.add_argument(
        "--facet",
        action="append",
        required=True,
        metavar="NAME=QUERY",
        help="a facet and its query, repeatable: --facet meaning='customer' --facet values='SME'",
    )
    facets.add_argument(
        "--kind", required=True, help="datasource, model, column, measure, aggregation or memory"
    )
    facets.add_argument("--datasource", metavar="D")
    facets.add_argument("--limit", type=int, default=10, metavar="N")
    facets.add_argument(
        "--min-score",
        type=float,
        default=None,
        metavar="S",
        help="drop hits whose weakest facet scores below S (no cutoff by default)",
    )
    facets.add_argument("--depth", type=int, default=500, metavar="N", help="how deep each facet is ranked")
    facets.add_argument("--format", choices=["text", "json"], default="text")
    check.add_scope_arguments(facets)
    facets.add_argument("--verbose", action="store_true", help="full text per hit (compact=False)")
    facets.add_argument(
        "--no-dense",
        action="store_true",
        help="rank the facet texts lexically (by default the stored part vectors are used "
        "when `slayer-lsp embed` made them)",
    )

    embed = sub.add_parser(
        "embed",
        help="embed what is missing or changed into the store's embeddings table "
        "(Ctrl-C stops after the batch in flight; the next run resumes)",
    )
    _storage_arg(embed)
    embed.add_argument(
        "--switch-model",
        action="store_true",
        help="embed with the configured model even though the table holds another model's vectors",
    )

    status = sub.add_parser("status", help="store, index and embedding status")
    _storage_arg(status)
    status.add_argument("--format", choices=["text", "json"], default="text")
    check.add_scope_arguments(status)

    inspect = sub.add_parser("inspect", help="show everything known about entities")
    _storage_arg(inspect)
    inspect.add_argument("refs", nargs="+", metavar="REF")
    inspect.add_argument("--format", choices=["text", "json"], default="text")
    check.add_scope_arguments(inspect)
    return parser


def _load_query(raw: str) -> dict:
    if raw.startswith("@"):
        text = Path(raw[1:]).read_text(encoding="utf-8")
        if raw.endswith((".yaml", ".yml")):
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    else:
        data = json.loads(raw)
    if not isinstance(data, dict):
        raise ValueError("--query must be a JSON object")
    return data


def _scope(args: argparse.Namespace) -> Scope:
    try:
        return check.scope_from_args(args)
    except check.UsageError as exc:
        raise SystemExit(_fail(str(exc))) from None


def _engine(storage: str | None, args: argparse.Namespace | None = None, **options):
    """The engine of a one-shot command, scoped by the command's ``--scope-datasource``,
    ``--access-tag`` and ``--untagged-only``."""
    from slayer_lsp.engine import Engine

    engine = Engine(storage, scope=_scope(args) if args is not None else None, **options)
    cat = engine.catalog
    if cat.fatal:
        raise SystemExit(_fail(cat.fatal))
    for issue in cat.issues:
        print(_safe(f"warning: {issue}"), file=sys.stderr)
    return engine


def _fail(message: str, code: int = 2) -> int:
    print(f"slayer-lsp: error: {_safe(message)}", file=sys.stderr)
    return code


def _safe(text: str) -> str:
    """Text for a terminal: control and bidi characters shown as their codes, so that a description
    holding escape sequences cannot drive the user's terminal."""
    from slayer_lsp.analysis.hover import visible

    return visible(text)


def cmd_search(args: argparse.Namespace) -> int:
    from slayer_lsp.search.types import SearchError, SearchParams

    try:
        query = _load_query(args.query) if args.query else None
    except (OSError, ValueError) as exc:
        return _fail(f"--query: {exc}")
    params = SearchParams(
        entities=args.entities,
        query=query,
        question=args.question,
        datasource=args.datasource,
        max_results=args.max_results,
        cypher_filter=args.cypher_filter,
        compact=not args.verbose,
        ranking=args.ranking,
        kinds=args.kinds,
        min_score=args.min_score,
        keyword=args.keyword,
        related=args.related,
        facet=args.facet,
    )
    engine = _engine(args.storage, args, dense="off" if args.no_dense else "stored")
    try:
        resp = engine.search(params)
    except SearchError as exc:
        return _fail(str(exc), 1)
    finally:  # its threads (the dense worker's, native code) stop before the interpreter does
        engine.close()
    if args.format == "json":
        sys.stdout.write(msgspec.json.encode(resp).decode() + "\n")
        return 0
    out = [f"[warning] {w}" for w in resp.warnings]
    if resp.resolved_input_entities:
        out.append("Resolved input entities: " + ", ".join(resp.resolved_input_entities))
    out.append(f"Results ({len(resp.results)}):")
    for hit in resp.results:
        tag = ("Q" if hit.query is not None else "M") if hit.kind == "memory" else f"[{hit.kind}]"
        preview = (hit.description or hit.text or "").replace("\n", " ")
        via = f"  (via {hit.via})" if isinstance(hit.via, str) else ""
        out.append(f"  {tag} {hit.id}  {hit.score:.4f}{via}" + (f"  {preview[:100]}" if preview else ""))
        if args.verbose and hit.text:
            out.extend("      " + ln for ln in hit.text.splitlines())
    print(_safe("\n".join(out)))
    return 0


def cmd_search_facets(args: argparse.Namespace) -> int:
    from slayer_lsp.search.facet_ranking import SearchFacetsParams
    from slayer_lsp.search.types import SearchError

    queries: dict[str, str] = {}
    for raw in args.facet:
        name, sep, query = raw.partition("=")
        if not sep or not name.strip():
            return _fail(f"--facet {raw!r}: expected NAME=QUERY")
        queries[name.strip()] = query
    params = SearchFacetsParams(
        facets=queries,
        kind=args.kind,
        limit=args.limit,
        min_score=args.min_score,
        datasource=args.datasource,
        depth=args.depth,
        compact=not args.verbose,
    )
    engine = _engine(args.storage, args, dense="off" if args.no_dense else "stored")
    try:
        resp = engine.search_facets(params)
    except SearchError as exc:
        return _fail(str(exc), 1)
    finally:
        engine.close()
    if args.format == "json":
        sys.stdout.write(msgspec.json.encode(resp).decode() + "\n")
        return 0
    out = [f"[warning] {w}" for w in resp.warnings]
    out.append(f"Results ({len(resp.results)}, {resp.channel}):")
    for hit in resp.results:
        per = " ".join(f"{f}={s:.4f}" for f, s in hit.facet_scores.items())
        preview = (hit.description or hit.text or "").replace("\n", " ")
        out.append(
            f"  [{hit.kind}] {hit.id}  {hit.score:.4f} ({per})" + (f"  {preview[:80]}" if preview else "")
        )
        if args.verbose and hit.text:
            out.extend("      " + ln for ln in hit.text.splitlines())
    print(_safe("\n".join(out)))
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    from slayer_lsp.analysis.inspect import format_text, inspect_refs

    engine = _engine(args.storage, args)
    try:
        items = inspect_refs(engine.catalog, args.refs)
    finally:
        engine.close()
    if args.format == "json":
        sys.stdout.write(msgspec.json.encode(items).decode() + "\n")
    else:
        print(_safe("\n\n".join(format_text(i) for i in items)))
    return 1 if any(i.error for i in items) else 0


def cmd_embed(args: argparse.Namespace) -> int:
    import os

    from slayer_lsp.cli.embed_command import INTERRUPTED, run_embed
    from slayer_lsp.embed.providers import configured_model_name, provider_for
    from slayer_lsp.embed.worker import WorkerConfig

    try:
        # a foreground job: every core, and no stepping back for searches that are not there
        provider = provider_for(configured_model_name(dict(os.environ)), threads=None)
        engine = _engine(
            args.storage,
            dense="live",
            switch_model=args.switch_model,
            embedding_provider=provider,
            embed_config=WorkerConfig(nice=0),
        )
    except ValueError as exc:  # an unknown local model name
        return _fail(str(exc))
    except KeyboardInterrupt:
        return INTERRUPTED
    return run_embed(engine)


def cmd_status(args: argparse.Namespace) -> int:
    from slayer_lsp.status import engine_status, format_status

    engine = _engine(args.storage, args, dense="stored")
    report = engine_status(engine)
    engine.close()
    if args.format == "json":
        sys.stdout.write(msgspec.json.encode(report).decode() + "\n")
    else:
        print(format_status(report))
        if not engine.scope.unrestricted:
            print(f"scope: {engine.scope} (the counts are what it reaches)")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from slayer_lsp.lsp import serve

    argv = ["--storage", args.storage] if getattr(args, "storage", None) else []
    scope = _scope(args)
    if not scope.unrestricted:  # fixed for the whole session: a client's scope options cannot widen it
        from slayer_lsp.lsp.server import server

        server.cli_scope = scope
    return serve_then_exit(lambda: serve(argv) or 0)


def cmd_schema(args: argparse.Namespace) -> int:
    import json

    from slayer_lsp.analysis.schemas import schema

    sys.stdout.write(json.dumps(schema(args.kind), indent=2, sort_keys=True, ensure_ascii=False) + "\n")
    return 0


def cmd_mcp(args: argparse.Namespace) -> int:
    from slayer_lsp.mcp import serve

    scope = _scope(args)
    if not args.verbose_log:
        logging.getLogger("slayer_lsp").setLevel(getattr(logging, args.log_level))
    return serve_then_exit(
        lambda: serve(
            args.storage,
            scope,
            dense="off" if args.no_embedding else "live",
            embedding_model=args.embedding_model,
            switch_model=args.switch_model,
        )
    )


def serve_then_exit(run: Callable[[], int]) -> int:
    """Run a server to its end, then end the process without the interpreter's finalization.

    The server has closed its engines by then (caches written, child processes stopped), but a
    background thread may still be inside native code (the warm-up in numpy, the embedding
    worker in onnxruntime). Python 3.11 stops such daemon threads at finalization with
    ``pthread_exit``, and unwinding a C++ frame that way aborts the process: an ``exit`` after
    ``shutdown`` would end with SIGABRT instead of 0, now and then, under load."""
    try:
        code: Any = run()
    except SystemExit as exc:  # exit without shutdown: 1, as LSP asks
        code = exc.code
        if code is not None and not isinstance(code, int):  # a message: printed, as the interpreter would
            print(code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:
        code = 130
    except BaseException:  # noqa: BLE001 - reported as the interpreter would, then the same ending
        traceback.print_exc()
        code = 1
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        with contextlib.suppress(Exception):
            if stream is not None:
                stream.flush()
    logging.shutdown()
    os._exit(code or 0)


def main(argv: list[str] | None = None) -> int:
    argv = check.rewrite_check_flag(list(sys.argv[1:] if argv is None else argv))
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.DEBUG if args.verbose_log else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    handlers = {
        "search": cmd_search,
        "search-facets": cmd_search_facets,
        "inspect": cmd_inspect,
        "embed": cmd_embed,
        "status": cmd_status,
        "serve": cmd_serve,
        "mcp": cmd_mcp,
        "check": check.cmd_check,
        "schema": cmd_schema,
        None: cmd_serve,
    }
    try:
        return handlers[args.command](args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # noqa: BLE001 - a clear line and exit 2, never a traceback (it is in --verbose-log)
        logging.getLogger(__name__).debug("internal error", exc_info=True)
        return _fail(f"internal error: {type(exc).__name__}: {exc}")
