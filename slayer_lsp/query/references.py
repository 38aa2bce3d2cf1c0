"""The entities a SLayer query names: ``extract_entities_from_query`` and the reference tokens under it.

A query reaches us as a plain dict, either as SLayer stores it inside a memory
(``SlayerQuery.model_dump(mode="json")``: dimensions as ``{name, model, label}``, measures as
``{formula, name, ...}``, order items with ``raw_formula``) or as a user writes it (strings,
``"month(col)"`` time dimensions, ``{column: direction}`` order shorthands). ``query_references``
normalises both the way SLayer's ``SlayerQuery`` validators do and lists every reference token with
the field it came from, in SLayer's walk order (``engine/model_reads.py::query_field_texts``):
dimensions, time dimensions, measure formulas, filters, order. Names the query defines itself
(named measures, computed dimensions, and, unlike SLayer, the columns and measures a model
extension adds) are not references and are left out.

``extract_entities_from_query`` resolves those tokens against the catalog with the source model as
context, keeping first-seen order without duplicates; the first failure aborts, as in SLayer.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from slayer_lsp.catalog import Catalog
from slayer_lsp.catalog.ids import memory_ref
from slayer_lsp.query import formulas
from slayer_lsp.query.resolver import EntityResolutionError, SourceModel, model_identity, resolve_entity
from slayer_lsp.store import documents as d

__all__ = [
    "QueryRef",
    "QueryRefs",
    "QueryShapeError",
    "extract_entities_from_query",
    "query_references",
    "source_model_of",
]


@dataclass(frozen=True, slots=True)
class QueryRef:
    """One reference token of a query. ``field`` and ``index`` locate the entry it came from
    (a ``"month(col)"`` dimension moved to the time dimensions keeps its dimensions position);
    ``kind`` is ``source`` (the source model's name), ``ref`` (a column path), ``formula`` (a token
    of a measure / computed dimension / order expression, e.g. ``amount:sum``) or ``filter``."""

    text: str
    field: str
    index: int
    kind: str = "ref"


@dataclass(frozen=True, slots=True)
class QueryRefs:
    canonicals: tuple[str, ...]
    warnings: tuple[str, ...] = ()


class QueryShapeError(EntityResolutionError):
    """A query entry SLayer would refuse to load (before any name is resolved)."""

    def __init__(self, message: str, field: str, index: int | None = None) -> None:
        super().__init__(message)
        self.field = field
        self.index = index


# ------------------------------------------------------------------------------------ normalising

_NAME = re.compile(r"^[a-zA-Z_]\w*$", re.ASCII)
_FUNCSTYLE_CALL = re.compile(r"^\w+\([^()]*\)$")
_GRANULARITY_HINT = ", ".join(sorted(formulas.GRANULARITY_NAMES))


def _is_column_path(text: str) -> bool:
    """A bare identifier or a dotted join path (SLayer's ``ColumnRef`` name rules)."""
    if "." in text:
        prefix, leaf = text.rsplit(".", 1)
        return bool(_NAME.match(leaf)) and all(_NAME.match(p) for p in prefix.split("."))
    return bool(_NAME.match(text))


def _column_ref_text(value: Any, field: str, index: int) -> str:
    """The full dotted name of a ``ColumnRef`` given as a string or a ``{name, model}`` dict."""
    if isinstance(value, str):
        name, model = value, None
    elif isinstance(value, Mapping) and isinstance(value.get("name"), str):
        name, model = value["name"], value.get("model")
        if model is not None and not isinstance(model, str):
            raise QueryShapeError(f"{field}[{index}]: 'model' must be a string", field, index)
    else:
        raise QueryShapeError(
            f"{field}[{index}]: expected a column name or a {{name, model}} object", field, index
        )
    text = f"{model}.{name}" if model else name
    if not _is_column_path(text):
        raise QueryShapeError(
            f"Invalid column reference {text!r} in {field}[{index}]: each part must contain only letters, "
            f"digits and underscores and start with a letter or underscore",
            field,
            index,
        )
    return text


def auto_name(expression: str) -> str:
    """SLayer's derived name of an unnamed computed dimension (``auto_name_from_expression``): the
    query walker skips it as a self-reference, the memory writer stores it."""
    base = re.sub(r"\W+", "_", expression.strip()).strip("_").lower() or "expr"
    if base[0].isdigit():
        base = f"e_{base}"
    if len(base) > 48:
        digest = hashlib.sha256(expression.encode("utf-8")).hexdigest()[:8]
        base = f"{base[:28]}_{digest}_{base[-8:]}"
    return re.sub(r"_+", "_", base).strip("_")


def _functional_time_dimension(entry: str, field: str, index: int, *, any_callee: bool) -> str | None:
    """The column of a ``gran(col)`` string; ``None`` when the callee is not a granularity (and
    ``any_callee`` is off). A granularity call of any other shape is refused, as in SLayer."""
    node, callee = formulas.call_callee(entry)
    if not any_callee and (callee is None or callee.casefold() not in formulas.GRANULARITY_NAMES):
        return None
    column = formulas.functional_call_column(node) if callee is not None else None
    if column is None:
        raise QueryShapeError(
            f"Time dimension {entry!r} must be the functional form gran(col) (e.g. month(created_at)) for "
            f"one of: {_GRANULARITY_HINT} or a datasource granularity.",
            field,
            index,
        )
    return column


def _as_list(query: Mapping[str, Any], key: str) -> list[Any]:
    value = query.get(key)
    if value is None:
        return []
    if key == "order" and isinstance(value, Mapping):
        return [value]
    if not isinstance(value, (list, tuple)):
        raise QueryShapeError(f"'{key}' must be a list, got {type(value).__name__}", key)
    return list(value)


def order_formula_candidate(text: str) -> str | None:
    """``text`` when an order key is an expression (a colon aggregation, a call, or any expression
    containing an aggregation) rather than a column name."""
    if ":" in text or _FUNCSTYLE_CALL.match(text):
        return text
    if _is_column_path(text):
        return None
    try:
        node = formulas.parse(text)
    except (formulas.ModeBError, RecursionError):
        return None
    return text if any(isinstance(n, formulas.Agg) for n in formulas.walk_refs(node)) else None


_DIRECTIONS = frozenset({"asc", "desc", "ascending", "descending"})


def _order_items(items: list[Any]) -> Iterator[tuple[int, Any]]:
    """Order entries with ``{column: direction}`` shorthands expanded; each keeps its list index."""
    for index, item in enumerate(items):
        if (
            isinstance(item, Mapping)
            and "column" not in item
            and "direction" not in item
            and item
            and all(
                isinstance(k, str) and isinstance(v, str) and v.strip().lower() in _DIRECTIONS
                for k, v in item.items()
            )
        ):
            for key in item:
                yield index, {"column": key}
        else:
            yield index, item


def _order_ref(item: Any, index: int) -> tuple[str, str]:
    """``(kind, text)`` of one order key: its expression (``raw_formula``) or its column path."""
    if not isinstance(item, Mapping) or "column" not in item:
        raise QueryShapeError(f"order[{index}]: expected {{column, direction}}", "order", index)
    raw_formula = item.get("raw_formula")
    if isinstance(raw_formula, str) and raw_formula:
        return "formula", raw_formula
    column = item["column"]
    text = (
        column
        if isinstance(column, str)
        else (
            column["name"]
            if isinstance(column, Mapping)
            and set(column) == {"name"}
            and isinstance(column.get("name"), str)
            and not _is_column_path(column["name"])
            else None
        )
    )
    if text is not None:
        candidate = order_formula_candidate(text)
        if candidate is not None:
            return "formula", candidate
    return "ref", _column_ref_text(column, "order", index)


def _is_time_call(entry: str) -> bool:
    callee = formulas.call_callee(entry)[1]
    return callee is not None and callee.casefold() in formulas.GRANULARITY_NAMES


def may_name_datasource_granularity(entry: str) -> bool:
    """A whole call whose callee is no built-in name: SLayer defers it to the datasource."""
    callee = formulas.call_callee(entry)[1]
    if callee is None:
        return False
    lowered = callee.lower()
    return not (
        lowered in formulas.GRANULARITY_NAMES
        or lowered in formulas.SCALAR_FUNCTIONS
        or lowered in formulas.TRANSFORMS
        or formulas.normalize_aggregation_name(callee) in formulas.BUILTIN_AGGREGATIONS
    )


def _local_names(query: Mapping[str, Any]) -> tuple[set[str], set[str]]:
    """Names the query defines: (named measures and computed dimensions, matched as whole tokens
    like SLayer; columns and measures of a model extension, matched on the column part of a token)."""
    names: set[str] = set()
    for m in query.get("measures") or ():
        if isinstance(m, Mapping) and isinstance(m.get("name"), str) and m["name"]:
            names.add(m["name"])
    for dim in query.get("dimensions") or ():
        if isinstance(dim, Mapping) and isinstance(dim.get("expression"), str):
            names.add(dim.get("name") or auto_name(dim["expression"]))
        elif isinstance(dim, str) and not _is_column_path(dim) and not _is_time_call(dim):
            names.add(auto_name(dim))
    added: set[str] = set()
    src = query.get("source_model")
    if isinstance(src, Mapping) and "source_name" in src:
        for key in ("columns", "measures"):
            for item in src.get(key) or ():
                if isinstance(item, Mapping) and isinstance(item.get("name"), str):
                    added.add(item["name"])
    return names, added


_E = TypeVar("_E", bound=BaseException)


def _detached(exc: _E) -> _E:
    """The exception without tracebacks (its own and its causes'): a kept problem's frames would
    hold the catalog of the walk that raised it, and through the bindings cached beside it every
    superseded snapshot after it (the soak bench saw the daemon grow by the minute)."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        e.__traceback__ = None
        e = e.__cause__ or e.__context__
    return exc


class _Walk:
    """Collects a query's reference tokens; shape problems raise, or are collected when asked to."""

    def __init__(self, query: Mapping[str, Any], problems: list[QueryShapeError] | None) -> None:
        self.query = query
        self.problems = problems
        self.out: list[QueryRef] = []
        self.local, self.added = _local_names(query) if isinstance(query, Mapping) else (set(), set())

    def problem(self, exc: QueryShapeError) -> None:
        if self.problems is None:
            raise exc
        self.problems.append(_detached(exc))

    def entries(self, key: str) -> list[Any]:
        try:
            return _as_list(self.query, key)
        except QueryShapeError as exc:
            self.problem(exc)
            return []

    def add(self, text: str, field: str, index: int, kind: str) -> None:
        if kind == "ref":
            tokens = [text]
        elif kind == "filter":
            tokens = formulas.filter_tokens(text)
        else:
            tokens = formulas.formula_tokens(text)
        for token in tokens:
            if token in self.local or formulas.split_colon_suffix(token)[0] in self.added:
                continue
            self.out.append(QueryRef(token, field, index, kind))

    def run(self) -> list[QueryRef]:
        src = self.query.get("source_model")
        name = (
            src
            if isinstance(src, str)
            else (
                src.get("source_name" if "source_name" in src else "name")
                if isinstance(src, Mapping)
                else None
            )
        )
        if isinstance(name, str) and name:
            self.out.append(QueryRef(name, "source_model", 0, "source"))
        moved: list[tuple[int, str]] = []
        for index, dim in enumerate(self.entries("dimensions")):
            try:
                self.dimension(dim, index, moved)
            except QueryShapeError as exc:
                self.problem(exc)
        for index, td in enumerate(self.entries("time_dimensions")):
            try:
                self.time_dimension(td, index)
            except QueryShapeError as exc:
                self.problem(exc)
        for index, column in moved:  # ``gran(col)`` dimensions join the time dimensions, after them
            self.add(column, "dimensions", index, "ref")
        for index, measure in enumerate(self.entries("measures")):
            formula = (
                measure
                if isinstance(measure, str)
                else (measure.get("formula") if isinstance(measure, Mapping) else None)
            )
            if not isinstance(formula, str):
                self.problem(
                    QueryShapeError(
                        f"measures[{index}]: expected a formula string or {{formula, name}}",
                        "measures",
                        index,
                    )
                )
            elif formula:
                self.add(formula, "measures", index, "formula")
        for index, text in enumerate(self.entries("filters")):
            if isinstance(text, str):
                self.add(text, "filters", index, "filter")
            else:
                self.problem(QueryShapeError(f"filters[{index}]: expected a string", "filters", index))
        for index, item in _order_items(self.entries("order")):
            try:
                kind, text = _order_ref(item, index)
            except QueryShapeError as exc:
                self.problem(exc)
                continue
            self.add(text, "order", index, kind)
        return self.out

    def dimension(self, dim: Any, index: int, moved: list[tuple[int, str]]) -> None:
        if isinstance(dim, Mapping) and "expression" in dim:
            if not isinstance(dim["expression"], str):
                raise QueryShapeError(
                    f"dimensions[{index}]: 'expression' must be a string", "dimensions", index
                )
            self.add(dim["expression"], "dimensions", index, "formula")
        elif isinstance(dim, str) and not _is_column_path(dim):
            column = _functional_time_dimension(dim, "dimensions", index, any_callee=False)
            if column is not None:
                moved.append((index, _column_ref_text(column, "dimensions", index)))
                return
            try:
                formulas.parse(dim)
            except (formulas.ModeBError, RecursionError) as exc:
                if not may_name_datasource_granularity(dim):
                    raise QueryShapeError(
                        f"Dimension {dim!r} is neither a column reference (a bare identifier or dotted join "
                        f"path) nor a parseable Mode-B expression: {exc}",
                        "dimensions",
                        index,
                    ) from exc
            self.add(dim, "dimensions", index, "formula")
        else:
            self.add(_column_ref_text(dim, "dimensions", index), "dimensions", index, "ref")

    def time_dimension(self, td: Any, index: int) -> None:
        if isinstance(td, str):
            column = _functional_time_dimension(td, "time_dimensions", index, any_callee=True)
            assert column is not None
            self.add(_column_ref_text(column, "time_dimensions", index), "time_dimensions", index, "ref")
            return
        if not isinstance(td, Mapping):
            raise QueryShapeError(
                f"time_dimensions[{index}]: expected an object or 'gran(col)'", "time_dimensions", index
            )
        dimension = td.get("dimension", td.get("column"))
        self.add(_column_ref_text(dimension, "time_dimensions", index), "time_dimensions", index, "ref")


def query_references(
    query: Mapping[str, Any], problems: list[QueryShapeError] | None = None
) -> list[QueryRef]:
    """Every reference token of ``query`` in SLayer's walk order, the source model's name first.

    An entry SLayer would refuse raises ``QueryShapeError``; pass a list as ``problems`` to collect
    those instead and keep going (what a diagnostics pass wants)."""
    if not isinstance(query, Mapping):
        raise QueryShapeError(f"a query must be an object, got {type(query).__name__}", "query")
    return _Walk(query, problems).run()


# ------------------------------------------------------------------------------------- source model


def source_model_of(
    query: Mapping[str, Any], catalog: Catalog, priority: Sequence[str] | None = None
) -> SourceModel:
    """The model ``query`` reads from: a stored model by bare name (priority settles a shared name),
    an extension's stored base plus what it adds, or an inline model."""
    prio = catalog.priority if priority is None else tuple(priority)
    src = query.get("source_model")
    if isinstance(src, str):
        identity = model_identity(catalog, src, prio) if src else None
        if identity is None:
            raise EntityResolutionError(f"Source model not found: {src!r}.")
        return SourceModel(*identity)
    if isinstance(src, Mapping) and "source_name" in src:
        base = src.get("source_name")
        identity = model_identity(catalog, base, prio) if isinstance(base, str) and base else None
        if identity is None:
            raise EntityResolutionError(f"Source model not found: {base!r}.")
        joins = _joins(src.get("joins"))
        if joins is None:
            return SourceModel(*identity)
        model = catalog.model(*identity)
        assert model is not None
        return SourceModel(identity[0], identity[1], None, (*model.joins, *joins))
    if isinstance(src, Mapping):
        name, ds = src.get("name"), src.get("data_source")
        if not (isinstance(name, str) and name and isinstance(ds, str) and ds):
            raise EntityResolutionError("an inline source model needs a 'name' and a 'data_source'.")
        leaves = {
            x.get("name")
            for key in ("columns", "measures", "aggregations")
            for x in src.get(key) or ()
            if isinstance(x, Mapping)
        }
        return SourceModel(
            ds, name, frozenset(x for x in leaves if isinstance(x, str)), _joins(src.get("joins")) or ()
        )
    raise EntityResolutionError("Could not derive a model name from query.source_model.")


def _joins(raw: Any) -> tuple[d.Join, ...] | None:
    if not raw:
        return None
    out = []
    for j in raw:
        if isinstance(j, Mapping) and isinstance(j.get("target_model"), str):
            pairs = [list(p) for p in j.get("join_pairs") or () if isinstance(p, (list, tuple))]
            out.append(
                d.Join(
                    target_model=j["target_model"],
                    join_pairs=pairs,
                    name=j.get("name"),
                    cardinality=j.get("cardinality"),
                )
            )
    return tuple(out)


# ------------------------------------------------------------------------------------------ extract


def extract_entities_from_query(
    query: Mapping[str, Any], catalog: Catalog, priority: Sequence[str] | None = None
) -> QueryRefs:
    """Canonical ids of every entity ``query`` names (source model first, first-seen order, no
    duplicates) and the resolver's warnings; raises ``EntityResolutionError`` on the first token
    that does not resolve, like SLayer."""
    refs = query_references(query)
    source = source_model_of(query, catalog, priority)
    canonicals: dict[str, None] = {source.canonical: None}
    warnings: dict[str, None] = {}
    for ref in refs:
        if ref.kind == "source":
            continue
        res = resolve_entity(ref.text, catalog, source, priority)
        canonicals.setdefault(res.canonical, None)
        for w in res.warnings:
            warnings.setdefault(w, None)
    return QueryRefs(tuple(canonicals), tuple(warnings))


def stale_query_warning(catalog: Catalog, mem: d.Memory) -> str | None:
    """SLayer's warning for an example query whose references no longer resolve."""
    if mem.query is None:
        return None
    try:
        extract_entities_from_query(mem.query, catalog)
    except EntityResolutionError as exc:
        return (
            f"example_query {memory_ref(mem.id)}: attached query has stale references ({exc}); "
            "re-save to clean."
        )
    return None
