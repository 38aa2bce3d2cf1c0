"""``slayer-lsp``: the language server (default), and the ``search``, ``inspect`` and ``--check``
front ends over the same engine. Front ends only translate: arguments in, engine calls, text out.

Exit codes: 0 success, 1 findings or a failed lookup, 2 usage or internal error.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

import msgspec

from slayer_lsp import __version__
from slayer_lsp.cli import check


def _storage_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--storage", metavar="PATH",
                   help="store path or URI (default: $SLAYER_STORAGE, $SLAYER_MODELS_DIR, then the XDG data dir)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="slayer-lsp", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action="version", version=f"slayer-lsp {__version__}")
    parser.add_argument("-v", "--verbose-log", action="store_true", help="debug logging on stderr")
    parser.add_argument("--check", action="store_true",
                        help="same as the check subcommand: slayer-lsp --check [PATH...] [--storage PATH] "
                             "[--format text|json|github|sarif] [--fail-on error|warning]")
    sub = parser.add_subparsers(dest="command")
    check.add_parser(sub)

    serve = sub.add_parser("serve", help="run the language server on stdio (the default)")
    _storage_arg(serve)

    search = sub.add_parser("search", help="search the store (SLayer's search surface)")
    _storage_arg(search)
    search.add_argument("--entity", action="append", dest="entities", metavar="E", help="an entity reference")
    search.add_argument("--query", metavar="JSON|@FILE", help="a SlayerQuery as JSON, or @file (JSON or YAML)")
    search.add_argument("--question", metavar="Q")
    search.add_argument("--datasource", metavar="D")
    search.add_argument("--max-results", type=int, default=10, metavar="N")
    search.add_argument("--cypher-filter", metavar="C")
    search.add_argument("--format", choices=["text", "json"], default="text")
    search.add_argument("--verbose", action="store_true", help="full text per hit (compact=False)")
    search.add_argument("--no-dense", action="store_true",
                        help="skip the embedding channel (by default it ranks the vectors stored for the "
                             "configured model, $SLAYER_EMBEDDING_MODEL or the offline MiniLM)")

    embed = sub.add_parser("embed", help="embed what is missing or changed into the store's embeddings table")
    _storage_arg(embed)
    embed.add_argument("--switch-model", action="store_true",
                       help="embed with the configured model even though the table holds another model's vectors")

    status = sub.add_parser("status", help="store, index and embedding status")
    _storage_arg(status)
    status.add_argument("--format", choices=["text", "json"], default="text")

    inspect = sub.add_parser("inspect", help="show everything known about entities")
    _storage_arg(inspect)
    inspect.add_argument("refs", nargs="+", metavar="REF")
    inspect.add_argument("--format", choices=["text", "json"], default="text")
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


def _engine(storage: str | None, **options):
    from slayer_lsp.engine import Engine

    engine = Engine(storage, **options)
    cat = engine.catalog
    if cat.fatal:
        raise SystemExit(_fail(cat.fatal))
    for issue in cat.issues:
        print(f"warning: {issue}", file=sys.stderr)
    return engine


def _fail(message: str, code: int = 2) -> int:
    print(f"slayer-lsp: error: {message}", file=sys.stderr)
    return code


def cmd_search(args: argparse.Namespace) -> int:
    from slayer_lsp.search.types import SearchError, SearchParams

    try:
        query = _load_query(args.query) if args.query else None
    except (OSError, ValueError) as exc:
        return _fail(f"--query: {exc}")
    params = SearchParams(entities=args.entities, query=query, question=args.question,
                          datasource=args.datasource, max_results=args.max_results,
                          cypher_filter=args.cypher_filter, compact=not args.verbose)
    engine = _engine(args.storage, dense="off" if args.no_dense else "stored")
    try:
        resp = engine.search(params)
    except SearchError as exc:
        return _fail(str(exc), 1)
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
        out.append(f"  {tag} {hit.id}  {hit.score:.4f}" + (f"  {preview[:100]}" if preview else ""))
        if args.verbose and hit.text:
            out.extend("      " + ln for ln in hit.text.splitlines())
    print("\n".join(out))
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    from slayer_lsp.analysis.inspect import format_text, inspect_refs

    engine = _engine(args.storage)
    items = inspect_refs(engine.catalog, args.refs)
    if args.format == "json":
        sys.stdout.write(msgspec.json.encode(items).decode() + "\n")
    else:
        print("\n\n".join(format_text(i) for i in items))
    return 1 if any(i.error for i in items) else 0


def cmd_embed(args: argparse.Namespace) -> int:
    import time

    engine = _engine(args.storage, dense="live", switch_model=args.switch_model)
    worker = engine.dense
    if worker is None:
        return _fail("the embedding channel is unavailable (see the log above)")
    last = 0.0
    while not worker.wait_idle(timeout=2.0):
        st = worker.status()
        if time.monotonic() - last > 5:
            print(f"embedding with {st.model}: {st.rows} embedded, {st.pending} pending, {st.failed} failed",
                  file=sys.stderr)
            last = time.monotonic()
    st = worker.status()
    engine.close()
    print(f"{st.model}: {st.rows} rows, {st.embedded} embedded now, {st.reused} reused, {st.failed} failed"
          + (f" (last error: {st.last_error})" if st.last_error else ""))
    for w in st.warnings():
        print(f"warning: {w}", file=sys.stderr)
    return 1 if st.failed or st.state == "blocked" else 0


def cmd_status(args: argparse.Namespace) -> int:
    from slayer_lsp.status import engine_status, format_status

    engine = _engine(args.storage, dense="stored")
    report = engine_status(engine)
    engine.close()
    if args.format == "json":
        sys.stdout.write(msgspec.json.encode(report).decode() + "\n")
    else:
        print(format_status(report))
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from slayer_lsp.lsp import serve

    argv = ["--storage", args.storage] if getattr(args, "storage", None) else []
    return serve(argv) or 0


def main(argv: list[str] | None = None) -> int:
    argv = check.rewrite_check_flag(list(sys.argv[1:] if argv is None else argv))
    args = build_parser().parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.DEBUG if args.verbose_log else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    handlers = {"search": cmd_search, "inspect": cmd_inspect, "embed": cmd_embed, "status": cmd_status,
                "serve": cmd_serve, "check": check.cmd_check, None: cmd_serve}
    try:
        return handlers[args.command](args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
