"""Checks of a whole store, beyond what one document's diagnostics see: broken joins, priority
entries naming no datasource, leaves of a model sharing a name, stale or hidden memory tags, stale
example queries, and documents the reader could not load.

Plain data over a catalog snapshot, the same for both backends; only the location differs. In a
YAML store a finding points at the line of the key in the file (the same tree reader the editor
uses), in a SQLite store at the store file with the table row named in the message (rows have no
lines). ``STORE_CODES`` is the table of record of the codes added here; ``stale-tag``,
``stale-query`` and ``load-issue`` are the document diagnostics' codes, reused because they mean
the same thing. ``all_codes()`` is both tables, for ``--check``'s SARIF rules and the README.

The module also decides which kind of document a path is and whether it is one of the store's own
files, because ``--check`` has to run the document diagnostics exactly as the language server
does (the server's ``kind_of``/``diagnose`` make the same two decisions today).
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from slayer_lsp.analysis import diagnostics as diag
from slayer_lsp.analysis import parsed_file as dm
from slayer_lsp.analysis.texttree import Mapping, Node, Scalar, Sequence, Span, Text, compose_yaml
from slayer_lsp.catalog import Catalog
from slayer_lsp.catalog.ids import memory_ref
from slayer_lsp.store import documents as d
from slayer_lsp.store.locate import StoreLocation
from slayer_lsp.store.reader import PRIORITY_KEY, DocKey, LoadIssue, Source
from slayer_lsp.store.safefs import read_text_file

ERROR, WARNING, INFORMATION = diag.ERROR, diag.WARNING, diag.INFORMATION

# code -> (default severity, meaning); codes shared with the document diagnostics live in diag.CODES
STORE_CODES: dict[str, tuple[str, str]] = {
    "unknown-join-target": (
        ERROR,
        "A join whose target_model is not a model of the same datasource: SLayer cannot follow it.",
    ),
    "unknown-join-key": (
        ERROR,
        "A join pair naming a column that the model (or the joined model) does not have.",
    ),
    "unknown-priority-datasource": (
        WARNING,
        "A datasource priority entry that names no datasource of the store.",
    ),
    "duplicate-leaf": (
        ERROR,
        "Two measures, or an aggregation and another leaf, of one model with the same "
        "name (SLayer refuses duplicate measures; an aggregation named like another "
        "leaf shares its canonical id). Duplicate columns, and a measure named like a "
        "column, are reported by the reader as load-issue.",
    ),
    "hidden-tag": (
        INFORMATION,
        "A memory tag naming a hidden model or column: the memory is still found "
        "through it, but queries and search do not expose the entity.",
    ),
}
SHARED_CODES = ("stale-tag", "stale-query", "load-issue")

SOURCE = "slayer-store"  # the ``source`` of store-level findings (document diagnostics say "slayer")


def all_codes() -> dict[str, tuple[str, str]]:
    """Every code ``--check`` can report: the document diagnostics' table, then the store's."""
    return {**diag.CODES, **STORE_CODES}


@dataclass(frozen=True, slots=True)
class Finding:
    """One store-level problem. ``span`` is 0-based with code-point columns, like a diagnostic's."""

    path: str
    span: Span
    severity: str
    code: str
    message: str
    source: str = SOURCE


# --------------------------------------------------------------------------- which file is which


def document_kind(
    path: str, location: StoreLocation, query_patterns: Iterable[str], memory_patterns: Iterable[str]
) -> str:
    """The document kind of a file as the language server classifies it: the YAML store's own files
    by their place in the store, then the memory and query patterns."""
    root = location.path if location.backend == "yaml" else None
    return dm.classify(path, tuple(query_patterns), tuple(memory_patterns), root)


def is_store_file(kind: str, path: str | None, location: StoreLocation) -> bool:
    """Whether a document is a file of the store itself, whose load issues its diagnostics include:
    model and datasource files, and memory files in the YAML store's ``memories/``."""
    if kind in ("model", "datasource"):
        return True
    return (
        kind == "memory"
        and location.backend == "yaml"
        and path is not None
        and os.path.dirname(path) == str(location.path / "memories")
    )


# --------------------------------------------------------------------------- locating keys


class _Files:
    """Store files read and composed once per run, for locating keys."""

    def __init__(self) -> None:
        self._trees: dict[tuple[str, bool], tuple[Text, Node] | None] = {}

    def tree(self, path: str, front_matter: bool = False) -> tuple[Text, Node] | None:
        key = (path, front_matter)
        if key not in self._trees:
            self._trees[key] = self._compose(path, front_matter)
        return self._trees[key]

    @staticmethod
    def _compose(path: str, front_matter: bool) -> tuple[Text, Node] | None:
        text = read_text_file(path)  # a store file swapped for a FIFO or a link is not followed
        if text is None:
            return None
        source = text
        if front_matter:  # compose the front matter in place so offsets stay those of the file
            fm = dm.split_front_matter_lines(text)
            if fm is None:
                return None
            t = Text(text)
            start = t.offset(fm[0], 0)
            end = t.offset(fm[1], 0) if fm[1] < len(t.starts) else len(text)
            source = "".join(ch if ch == "\n" else " " for ch in text[:start]) + text[start:end]
        tree, _problem, _ok = compose_yaml(source)
        return Text(text), tree


def _span_of(t: Text, node: Node) -> Span | None:
    if isinstance(node, (Scalar, Mapping, Sequence)):
        return t.span(node.start, max(node.start, node.end))
    return None


def _key_span(files: _Files, path: str, keys: tuple[Any, ...], front_matter: bool = False) -> Span:
    """The span of the deepest part of ``keys`` present in the file: a value scalar or list item,
    else the last key found; line 0 when nothing matches (or the file cannot be read)."""
    got = files.tree(path, front_matter)
    if got is None:
        return Span(0, 0, 0)
    t, node = got
    best = Span(0, 0, 0)
    for key in keys:
        if isinstance(key, str) and isinstance(node, Mapping):
            knode = node.key_node(key)
            if knode is None:
                break
            best = _span_of(t, knode) or best
            node = node.get(key)
        elif isinstance(key, int) and isinstance(node, Sequence) and 0 <= key < len(node.items):
            node = node.items[key]
        else:
            break
        if isinstance(node, Scalar) or (isinstance(key, int) and node is not None):
            best = _span_of(t, node) or best
    return best


class _Locator:
    """Where a finding about a stored document goes: a YAML key, or a SQLite row."""

    def __init__(self) -> None:
        self.files = _Files()

    def at(self, source: Source, keys: tuple[Any, ...], front_matter: bool = False) -> tuple[str, Span, str]:
        """(path, span, message suffix) for a key path in the document stored at ``source``."""
        if source.table is not None:
            return source.path, Span(0, 0, 0), f" [{source.table} row '{source.row}']"
        return source.path, _key_span(self.files, source.path, keys, front_matter), ""


# --------------------------------------------------------------------------- the checks


def check_store(catalog: Catalog) -> list[Finding]:
    """Every store-level finding of a snapshot, in store order (joins and leaves per model, the
    priority list, memories, then load issues)."""
    loc = _Locator()
    out: list[Finding] = []
    for mid, model in catalog.models.items():
        source = catalog.docs[DocKey("model", mid)].source
        out.extend(_check_joins(catalog, mid, model, source, loc))
        out.extend(_check_leaves(mid, model, source, loc))
    out.extend(_check_priority(catalog, loc))
    for mid in catalog.memory_order:
        mem = catalog.memory(mid)
        ent = catalog.get(memory_ref(mid))
        if mem is not None and ent is not None:
            out.extend(_check_memory(catalog, mem, ent.source, loc))
    out.extend(_load_issues(catalog.issues, loc))
    return out


def _finding(
    loc: _Locator,
    source: Source,
    keys: tuple[Any, ...],
    code: str,
    message: str,
    severity: str | None = None,
    front_matter: bool = False,
) -> Finding:
    path, span, suffix = loc.at(source, keys, front_matter)
    return Finding(path, span, severity or all_codes()[code][0], code, message + suffix)


def _awaits_columns(model: d.Model) -> bool:
    """A query-backed model whose columns are computed from its queries (none are stored)."""
    return bool(model.source_queries) and not model.columns


def _check_joins(catalog: Catalog, mid: str, model: d.Model, source: Source, loc: _Locator) -> list[Finding]:
    out = []
    ds = model.data_source or ""
    own = {c.name for c in model.columns}
    for i, join in enumerate(model.joins):
        target_id = f"{ds}.{join.target_model}"
        target = catalog.model(ds, join.target_model)
        if target is None:
            out.append(
                _finding(
                    loc,
                    source,
                    ("joins", i, "target_model"),
                    "unknown-join-target",
                    f"model '{mid}' joins '{join.target_model}': no model '{join.target_model}' "
                    f"in datasource '{ds}'",
                )
            )
        for k, pair in enumerate(join.join_pairs):
            if len(pair) != 2:
                continue
            left, right = pair
            if not _awaits_columns(model) and left not in own:
                out.append(
                    _finding(
                        loc,
                        source,
                        ("joins", i, "join_pairs", k, 0),
                        "unknown-join-key",
                        f"model '{mid}' joins '{join.target_model}' on '{left}': no column "
                        f"'{left}' on model '{mid}'",
                    )
                )
            if (
                target is not None
                and not _awaits_columns(target)
                and right not in {c.name for c in target.columns}
            ):
                out.append(
                    _finding(
                        loc,
                        source,
                        ("joins", i, "join_pairs", k, 1),
                        "unknown-join-key",
                        f"model '{mid}' joins '{join.target_model}' on '{right}': no column "
                        f"'{right}' on model '{target_id}'",
                    )
                )
    return out


def _check_leaves(mid: str, model: d.Model, source: Source, loc: _Locator) -> list[Finding]:
    """Name collisions the reader does not already report (it notes duplicate columns and a measure
    named like a column)."""
    out = []
    columns = {c.name for c in model.columns}
    measures: dict[str, int] = {}
    for j, m in enumerate(model.measures):
        if not m.name or m.name in columns:
            continue
        if m.name in measures:
            out.append(
                _finding(
                    loc,
                    source,
                    ("measures", j, "name"),
                    "duplicate-leaf",
                    f"model '{mid}' has two measures named '{m.name}' (SLayer refuses the model)",
                )
            )
        else:
            measures[m.name] = j
    aggs: set[str] = set()
    for j, a in enumerate(model.aggregations):
        if a.name in aggs:
            what = "another aggregation"
        elif a.name in columns:
            what = "a column"
        elif a.name in measures:
            what = "a measure"
        else:
            aggs.add(a.name)
            continue
        out.append(
            _finding(
                loc,
                source,
                ("aggregations", j, "name"),
                "duplicate-leaf",
                f"model '{mid}': aggregation '{a.name}' has the name of {what}; both would be "
                f"'{mid}.{a.name}' (the first is used)",
                severity=WARNING,
            )
        )
    return out


def _check_priority(catalog: Catalog, loc: _Locator) -> list[Finding]:
    doc = catalog.docs.get(PRIORITY_KEY)
    if doc is None:
        return []
    got = loc.files.tree(doc.source.path) if doc.source.table is None else None
    nested = got is not None and isinstance(got[1], Mapping)  # ``priority: [...]`` or a bare list
    out = []
    for i, name in enumerate(catalog.priority):
        if name in catalog.datasources:
            continue
        keys = ("priority", i) if nested else (i,)
        close = difflib.get_close_matches(name, list(catalog.datasources), n=1, cutoff=0.6)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        out.append(
            _finding(
                loc,
                doc.source,
                keys,
                "unknown-priority-datasource",
                f"datasource priority names '{name}', which is not a datasource of the store{hint}",
            )
        )
    return out


def _check_memory(catalog: Catalog, mem: d.Memory, source: Source, loc: _Locator) -> list[Finding]:
    from slayer_lsp.analysis.binding import resolve
    from slayer_lsp.query.references import stale_query_warning

    out = []
    ref = memory_ref(mem.id)
    valid = catalog.valid_canonicals
    for i, tag in enumerate(mem.entities):
        keys = ("entities", i)
        if tag not in valid:
            canonical, _w, error, _t = resolve(tag, catalog)
            why = f"not a canonical id; it resolves to {canonical}" if error is None and canonical else error
            names = [canonical] if error is None and canonical else diag.suggest_canonical(tag, catalog)
            hint = f"; did you mean '{names[0]}'?" if names and names[0] != canonical else ""
            out.append(
                _finding(
                    loc,
                    source,
                    keys,
                    "stale-tag",
                    f"{ref}: stale tag '{tag}': {why}{hint}",
                    front_matter=True,
                )
            )
            continue
        ent = catalog.get(tag)
        if ent is not None and ent.hidden and ent.kind in ("model", "column", "measure", "aggregation"):
            out.append(
                _finding(
                    loc,
                    source,
                    keys,
                    "hidden-tag",
                    f"{ref}: tag '{tag}' names a hidden {ent.kind}: queries and search do not expose it",
                    front_matter=True,
                )
            )
    warning = stale_query_warning(catalog, mem)
    if warning is not None:
        out.append(_finding(loc, source, ("query",), "stale-query", warning, front_matter=True))
    return out


_LINE_COL = re.compile(r"line (\d+), column (\d+)")


def _load_issues(issues: Iterable[LoadIssue], loc: _Locator) -> list[Finding]:
    out = []
    for issue in issues:
        src = issue.source
        severity = ERROR if issue.severity == "error" else WARNING
        if src.table is not None:
            out.append(
                Finding(
                    src.path,
                    Span(0, 0, 0),
                    severity,
                    "load-issue",
                    f"{issue.message} [{src.table} row '{src.row}']",
                )
            )
            continue
        m = _LINE_COL.search(issue.message)
        span = Span(int(m.group(1)) - 1, int(m.group(2)) - 1, int(m.group(2)) - 1) if m else Span(0, 0, 0)
        out.append(Finding(src.path, span, severity, "load-issue", issue.message))
    return out
