"""``slayer-lsp --check`` (also ``slayer-lsp check``): the editor's diagnostics and the store-level
checks, for CI.

Two sources of findings, one output: the store-level checks of ``analysis.store_checks`` over the
whole store, and the document diagnostics of ``analysis.diagnostics`` (called exactly as the
language server calls them) over the query and memory files given as paths. A directory is walked
with the server's default file patterns. A store finding about a file the document diagnostics also
checked is dropped when those diagnostics cover its code there (they point at the exact reference).

Positions are printed 1-based in code points; an end column is exclusive (the column after the
last character), as in SARIF. Exit codes: 0 no finding at or above ``--fail-on``, 1 some, 2 usage or
internal error (ruff's and sqlfluff's convention).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from slayer_lsp import __version__

if TYPE_CHECKING:
    from slayer_lsp.catalog import Catalog
    from slayer_lsp.reach.scope import Scope
    from slayer_lsp.store.locate import StoreLocation

log = logging.getLogger(__name__)

FORMATS = ("text", "json", "github", "sarif")
RANK = {"error": 3, "warning": 2, "information": 1, "hint": 0}
DOC_SOURCE = "slayer"  # the ``source`` the editor shows on a document diagnostic
# store-level codes that the document diagnostics of the same file report themselves, more precisely
COVERED_BY_DOCUMENT = frozenset(
    {"stale-tag", "stale-query", "load-issue", "unknown-join-target", "unknown-join-key"}
)
SKIP_DIRS = frozenset({"node_modules", "__pycache__"})
SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
INFORMATION_URI = "https://pypi.org/project/motley-slayer/"


class UsageError(Exception):
    """A bad argument: reported with exit code 2."""


@dataclass(frozen=True, slots=True)
class Result:
    """One finding in output form: a path as printed, 1-based lines and code-point columns (end
    exclusive)."""

    path: str
    line: int
    column: int
    end_line: int
    end_column: int
    severity: str
    code: str
    message: str
    source: str

    def sort_key(self) -> tuple[Any, ...]:
        return (self.path, self.line, self.column, -RANK.get(self.severity, 0), self.code, self.message)


# --------------------------------------------------------------------------- arguments


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "paths",
        nargs="*",
        metavar="PATH",
        help="query files, memory files, or directories to walk with the server's default file "
        "patterns; without paths only the store is checked",
    )
    p.add_argument(
        "--storage",
        metavar="PATH",
        help="store path or URI (default: $SLAYER_STORAGE, $SLAYER_MODELS_DIR, then the XDG data dir)",
    )
    p.add_argument("--format", choices=FORMATS, default="text", help="output format (default text)")
    p.add_argument(
        "--fail-on",
        choices=("error", "warning"),
        default="error",
        help="lowest severity that makes the exit code 1 (default error)",
    )
    p.add_argument(
        "--impact",
        nargs="+",
        action="extend",
        metavar="ENTITY",
        help="instead of checking, list what would break if these entities (canonical ids of "
        "datasources, models, columns, measures, aggregations) were removed or renamed: the "
        "store's measures, aggregations, joins, model filters and memories, and the query and "
        "memory files among PATH; exit code 1 when something would",
    )
    add_scope_arguments(p)


def add_scope_arguments(p: argparse.ArgumentParser) -> None:
    """The session scope (``reach.scope``): what lies outside it is unreachable on every path."""
    p.add_argument(
        "--scope-datasource",
        action="append",
        dest="scope_datasources",
        metavar="DS",
        help="reach only this datasource (repeatable; default every datasource)",
    )
    p.add_argument(
        "--access-tag",
        action="append",
        dest="access_tags",
        metavar="TAG",
        help="the caller's SLayer access tag (repeatable): a model with access_tags is reachable "
        "only when it shares one (default: no access restriction)",
    )
    p.add_argument(
        "--untagged-only",
        action="store_true",
        help="the caller holds no access tag: only models without access_tags are reachable",
    )


def scope_from_args(args: argparse.Namespace) -> Scope:
    from slayer_lsp.reach.scope import Scope

    try:
        return Scope.of(
            getattr(args, "scope_datasources", None),
            getattr(args, "access_tags", None),
            untagged_only=getattr(args, "untagged_only", False),
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from exc


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Register the ``check`` subcommand on the main parser's subparsers."""
    p = sub.add_parser(
        "check",
        help="check the store and query/memory files as the editor does (for CI); also spelled --check",
    )
    add_arguments(p)
    return p


def rewrite_check_flag(argv: list[str]) -> list[str]:
    """``slayer-lsp [opts] --check ARGS`` -> ``slayer-lsp [opts] check ARGS``."""
    if "--check" not in argv:
        return argv
    i = argv.index("--check")
    return [*argv[:i], "check", *argv[i + 1 :]]


# --------------------------------------------------------------------------- collecting


def _absolute_location(storage: str | None) -> StoreLocation:
    from slayer_lsp.store.locate import StoreLocation, locate

    loc = locate(storage)
    return StoreLocation(loc.backend, Path(os.path.abspath(loc.path)))


def _store_catalog(storage: str | None, scope: Scope | None, verb: str) -> tuple[StoreLocation, Catalog]:
    """The store's location and its (reachable) catalog; a store that cannot be read at all is a
    usage error."""
    from slayer_lsp.catalog import load_catalog
    from slayer_lsp.reach.reachable import restrict

    location = _absolute_location(storage)
    catalog = load_catalog(location)
    if scope is not None:
        catalog = restrict(catalog, scope)
    if catalog.fatal:
        raise UsageError(f"cannot {verb} the store: {catalog.fatal}")
    return location, catalog


def _walk(root: Path) -> Iterator[Path]:
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(n for n in dirnames if not n.startswith(".") and n not in SKIP_DIRS)
        for name in sorted(filenames):
            if not name.startswith("."):
                yield Path(dirpath) / name


def _fallback_kind(path: Path) -> str:
    """A file named on the command line that no pattern classifies: judged by its extension."""
    suffix = path.suffix.lower()
    if suffix == ".md":
        return "memory"
    if suffix in (".yaml", ".yml", ".json"):
        return "query"
    return "other"


def documents_to_check(paths: Iterable[str], location: Any) -> list[tuple[str, str]]:
    """(absolute path, document kind) of every file to diagnose, in argument then walk order."""
    from slayer_lsp.analysis.store_checks import document_kind
    from slayer_lsp.lsp.options import DEFAULT_MEMORY_PATTERNS, DEFAULT_QUERY_PATTERNS

    out: dict[str, str] = {}
    for raw in paths:
        p = Path(os.path.abspath(raw))
        if p.is_dir():
            for f in _walk(p):
                kind = document_kind(str(f), location, DEFAULT_QUERY_PATTERNS, DEFAULT_MEMORY_PATTERNS)
                if kind != "other":
                    out.setdefault(str(f), kind)
        elif p.is_file():
            kind = document_kind(str(p), location, DEFAULT_QUERY_PATTERNS, DEFAULT_MEMORY_PATTERNS)
            if kind == "other":
                kind = _fallback_kind(p)
            if kind == "other":
                raise UsageError(f"{raw}: not a query file (.yaml, .yml, .json) or a memory file (.md)")
            out.setdefault(str(p), kind)
        else:
            raise UsageError(f"{raw}: no such file or directory")
    return list(out.items())


def diagnose_file(path: str, kind: str, catalog: Any, location: Any) -> list[Any]:
    """The diagnostics the language server publishes for this file when it is opened unchanged."""
    from slayer_lsp.analysis import diagnostics as diag
    from slayer_lsp.analysis import parsed_file as dm
    from slayer_lsp.analysis.store_checks import is_store_file
    from slayer_lsp.store.safefs import Refused, read_file

    root = location.path if location.backend == "yaml" else None
    try:  # the editor sees the bytes as they are; in the store, the reader's rule (no link, no FIFO)
        text = read_file(path, root, follow=True).decode("utf-8")
    except Refused as exc:
        if root is not None and is_store_file(kind, path, location):
            return []  # the store's load issue for this path says why
        raise OSError(f"{path} {exc}") from None
    doc = dm.parse_document(text, kind, path)
    return diag.diagnose(doc, catalog, path=path if is_store_file(kind, path, location) else None)


def _display(path: str, cwd: str) -> str:
    """A path relative to the working directory when it is inside it (CI annotations need that)."""
    try:
        rel = os.path.relpath(path, cwd)
    except ValueError:  # another drive
        return path
    return path if rel.startswith("..") else rel


def _result(path: str, span: Any, severity: str, code: str, message: str, source: str, cwd: str) -> Result:
    return Result(
        _display(path, cwd),
        span.line + 1,
        span.start + 1,
        span.line + 1,
        span.end + 1,
        severity,
        code,
        message,
        source,
    )


IMPACT_CODE = "would-break"
IMPACT_CODES = {
    IMPACT_CODE: (
        "error",
        "Something that uses an entity given to --impact: removing or renaming "
        "the entity breaks it (directly, or through the measures and joins "
        "named in the message).",
    )
}


@dataclass
class Report:
    results: list[Result]
    store: str
    files: int
    impact: tuple[str, ...] | None = None  # the entities of a --impact run


def run_impact(
    entities: list[str],
    paths: list[str],
    storage: str | None,
    cwd: str | None = None,
    scope: Scope | None = None,
) -> Report:
    """What uses each entity (``analysis.impact``, the editor's own answer), one finding per use at
    its location. An entity the store does not have is a usage error."""
    from slayer_lsp.analysis import parsed_file as dm
    from slayer_lsp.analysis.impact import ImpactError, impact
    from slayer_lsp.analysis.store_checks import is_store_file
    from slayer_lsp.analysis.workspace import WorkspaceDoc
    from slayer_lsp.store.safefs import Refused, read_file

    cwd = cwd or os.getcwd()
    location, catalog = _store_catalog(storage, scope, "read")
    docs = []
    files = documents_to_check(paths, location)
    for path, kind in files:
        if kind not in ("query", "memory") or is_store_file(kind, path, location):
            continue  # the store's own files are the catalog's
        try:
            text = read_file(path, None, follow=True).decode("utf-8")
        except (OSError, Refused, UnicodeDecodeError) as exc:
            raise UsageError(f"{path}: cannot be read: {exc}") from exc
        docs.append(WorkspaceDoc(path, path, dm.parse_document(text, kind, path), False))
    results: list[Result] = []
    for entity in entities:
        try:
            found = impact(catalog, entity, docs)
        except ImpactError as exc:
            raise UsageError(str(exc)) from exc
        for u in found.uses:
            what = {"query": "the query", "memory": "the memory"}.get(u.kind, f"the {u.kind}")
            name = (
                _display(u.name, cwd) if u.kind in ("query", "memory") and os.path.isabs(u.name) else u.name
            )
            chain = [*reversed(u.via), entity] if u.via else [u.target]
            message = (
                f"{what} {name} uses {', which uses '.join(chain)}: removing or renaming {entity} breaks it"
            )
            loc = u.location
            if loc is None:
                results.append(
                    Result(
                        _display(str(location.path), cwd),
                        1,
                        1,
                        1,
                        1,
                        "error",
                        IMPACT_CODE,
                        message,
                        DOC_SOURCE,
                    )
                )
                continue
            if loc.detail:
                message += f" ({loc.detail})"
            results.append(_result(loc.path, loc.span, "error", IMPACT_CODE, message, DOC_SOURCE, cwd))
    results.sort(key=Result.sort_key)
    return Report(results, str(location), len(docs), tuple(entities))


def run_check(
    paths: list[str], storage: str | None, cwd: str | None = None, scope: Scope | None = None
) -> Report:
    """Every finding, sorted by path and position. Raises ``UsageError`` for a bad path or a store
    that cannot be read at all. Under a ``scope`` (``reach.scope.Scope``) only the reachable
    catalog is checked, and a reference to something outside it is unknown, like a missing one."""
    from slayer_lsp.analysis.store_checks import check_store

    cwd = cwd or os.getcwd()
    location, catalog = _store_catalog(storage, scope, "check")
    docs = documents_to_check(paths, location)
    results: list[Result] = []
    covered: set[str] = set()
    for path, kind in docs:
        try:
            found = diagnose_file(path, kind, catalog, location)
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"{path}: cannot be read: {exc}") from exc
        except (
            RecursionError
        ):  # nested past what the editor's parser follows (the store reader refuses it too)
            results.append(
                Result(
                    _display(path, cwd),
                    1,
                    1,
                    1,
                    1,
                    "error",
                    "invalid-yaml",
                    "nested too deeply to be analysed",
                    DOC_SOURCE,
                )
            )
            continue  # not covered: the store's own finding about this file stays
        covered.add(path)
        results.extend(_result(path, x.span, x.severity, x.code, x.message, DOC_SOURCE, cwd) for x in found)
    for f in check_store(catalog):
        if f.path in covered and f.code in COVERED_BY_DOCUMENT:
            continue
        results.append(_result(f.path, f.span, f.severity, f.code, f.message, f.source, cwd))
    results.sort(key=Result.sort_key)
    return Report(results, str(location), len(docs))


# --------------------------------------------------------------------------- output formats


def _one_line(text: str) -> str:
    """One terminal line: line breaks joined, control and bidi characters shown as codes (a store
    file must not drive the terminal that reads the report)."""
    from slayer_lsp.analysis.hover import visible

    return visible(" ".join(text.splitlines()) if ("\n" in text or "\r" in text) else text)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def summary(report: Report) -> str:
    if report.impact is not None:
        names = ", ".join(report.impact)
        if not report.results:
            return f"Nothing uses {names}: it can be removed or renamed safely."
        return f"{_plural(len(report.results), 'use')} of {names} would break."
    counts = {s: sum(1 for r in report.results if r.severity == s) for s in RANK}
    where = f"the store {report.store}" + (f" and {_plural(report.files, 'file')}" if report.files else "")
    if not report.results:
        return f"No problems found in {where}."
    parts = [_plural(counts["error"], "error"), _plural(counts["warning"], "warning")]
    notes = counts["information"] + counts["hint"]
    if notes:
        parts.append(_plural(notes, "note"))
    return f"Found {', '.join(parts)} in {where}."


def format_text(report: Report) -> str:
    lines = [
        f"{r.path}:{r.line}:{r.column}: {r.severity}[{r.code}] {_one_line(r.message)}" for r in report.results
    ]
    lines.append(summary(report))
    return "\n".join(lines) + "\n"


def format_json(report: Report) -> str:
    items = [
        {
            "path": r.path,
            "range": {
                "start": {"line": r.line, "column": r.column},
                "end": {"line": r.end_line, "column": r.end_column},
            },
            "severity": r.severity,
            "code": r.code,
            "message": r.message,
            "source": r.source,
        }
        for r in report.results
    ]
    return json.dumps(items, indent=2, ensure_ascii=False) + "\n"


def escape_data(text: str) -> str:
    """A workflow command's message: ``%``, CR and LF are percent-encoded."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    """A workflow command's property value: also ``:`` and ``,``, which delimit properties."""
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


_GITHUB_LEVEL = {"error": "error", "warning": "warning", "information": "notice", "hint": "notice"}


def format_github(report: Report) -> str:
    out = []
    for r in report.results:
        props = [
            ("file", r.path),
            ("line", str(r.line)),
            ("col", str(r.column)),
            ("endLine", str(r.end_line)),
            ("endColumn", str(r.end_column)),
            ("title", f"slayer-lsp ({r.code})"),
        ]
        head = ",".join(f"{k}={escape_property(v)}" for k, v in props)
        out.append(f"::{_GITHUB_LEVEL.get(r.severity, 'error')} {head}::{escape_data(r.message)}")
    return "".join(line + "\n" for line in out)


_SARIF_LEVEL = {"error": "error", "warning": "warning", "information": "note", "hint": "note"}


def _rule_name(code: str) -> str:
    return "".join(part.capitalize() for part in code.split("-"))


def sarif_log(report: Report, cwd: str | None = None) -> dict[str, Any]:
    """A SARIF 2.1.0 log: one run, its rules from the codes table, columns in code points."""
    from slayer_lsp.analysis.store_checks import all_codes

    codes = {**all_codes(), **(IMPACT_CODES if report.impact is not None else {})}
    rules = [
        {
            "id": code,
            "name": _rule_name(code),
            "shortDescription": {"text": meaning},
            "fullDescription": {"text": meaning},
            "defaultConfiguration": {"level": _SARIF_LEVEL[severity]},
        }
        for code, (severity, meaning) in codes.items()
    ]
    index = {code: i for i, code in enumerate(codes)}
    root = Path(cwd or os.getcwd()).absolute().as_uri().rstrip("/") + "/"
    results = []
    for r in report.results:
        if os.path.isabs(r.path):
            artifact: dict[str, Any] = {"uri": Path(r.path).as_uri()}
        else:
            artifact = {"uri": Path(r.path).as_posix(), "uriBaseId": "SRCROOT"}
        result: dict[str, Any] = {
            "ruleId": r.code,
            "level": _SARIF_LEVEL.get(r.severity, "error"),
            "message": {"text": r.message},
            "locations": [
                {
                    "physicalLocation": {
                        "artifactLocation": artifact,
                        "region": {
                            "startLine": r.line,
                            "startColumn": r.column,
                            "endLine": r.end_line,
                            "endColumn": r.end_column,
                        },
                    }
                }
            ],
            "properties": {"source": r.source},
        }
        if r.code in index:
            result["ruleIndex"] = index[r.code]
        results.append(result)
    return {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "slayer-lsp",
                        "version": __version__,
                        "semanticVersion": __version__,
                        "informationUri": INFORMATION_URI,
                        "rules": rules,
                    }
                },
                "originalUriBaseIds": {"SRCROOT": {"uri": root}},
                "columnKind": "unicodeCodePoints",
                "results": results,
            }
        ],
    }


def format_sarif(report: Report) -> str:
    return json.dumps(sarif_log(report), indent=2, ensure_ascii=False) + "\n"


FORMATTERS = {"text": format_text, "json": format_json, "github": format_github, "sarif": format_sarif}


# --------------------------------------------------------------------------- entry point


def exit_code(report: Report, fail_on: str) -> int:
    threshold = RANK[fail_on]
    return 1 if any(RANK.get(r.severity, 0) >= threshold for r in report.results) else 0


def cmd_check(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    try:
        if getattr(args, "impact", None):
            report = run_impact(args.impact, args.paths, args.storage, scope=scope_from_args(args))
        else:
            report = run_check(args.paths, args.storage, scope=scope_from_args(args))
    except UsageError as exc:
        print(f"slayer-lsp: error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - an internal error is exit 2, never a green check
        log.exception("check failed")
        print(f"slayer-lsp: internal error: {exc}", file=sys.stderr)
        return 2
    out.write(FORMATTERS[args.format](report))
    if args.format != "text":  # machine formats keep stdout clean; the summary goes to the log
        print(summary(report), file=sys.stderr)
    out.flush()
    return exit_code(report, args.fail_on)
