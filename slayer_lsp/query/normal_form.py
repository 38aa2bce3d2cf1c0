"""SLayer's stored form of a query (``SlayerQuery.model_dump(mode="json")``), reproduced without SLayer.

A memory that links a query stores the query exactly as SLayer would: every field, nulls and
defaults included. A shape we cannot reproduce faithfully (inline models, model extensions, older
query versions) is refused with ``QueryRefused`` rather than stored differently from SLayer.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from datetime import date, datetime
from typing import Any

from slayer_lsp.query import formulas
from slayer_lsp.query.references import auto_name, may_name_datasource_granularity, order_formula_candidate

__all__ = ["QUERY_FIELDS", "QUERY_VERSION", "QueryRefused", "normalize_query"]

QUERY_VERSION = 6


class QueryRefused(ValueError):
    """A query SLayer would refuse, or one whose stored form we cannot reproduce faithfully."""


_NAME = re.compile(r"[a-zA-Z_]\w*", re.ASCII)
_FUNCSTYLE_CALL = re.compile(r"^\w+\([^()]*\)$")
_OVER = re.compile(r"\bover\s*\(", re.IGNORECASE)
_PLACEHOLDER = re.compile(r"\{[^}]*\}")
_DIRECTIONS = {"asc": "asc", "ascending": "asc", "desc": "desc", "descending": "desc"}
_DATA_TYPES = frozenset({"TEXT", "INT", "DOUBLE", "BOOLEAN", "DATE", "TIMESTAMP", "UNKNOWN"})
_TO_MANY = frozenset({"broadcast", "associate", "error"})
_RESERVED_PREFIX = "__slayer_"
_FUNCSTYLE_PENDING = "_funcstyle_pending"
_EXPR_PENDING = "_expr_pending"
QUERY_FIELDS = (
    "version",
    "name",
    "source_model",
    "measures",
    "dimensions",
    "time_dimensions",
    "main_time_dimension",
    "filters",
    "variables",
    "order",
    "limit",
    "offset",
    "whole_periods_only",
    "distinct_dimension_values",
    "to_many_handling",
)
_WINDOW_HINT = (
    "contains a window function (OVER clause); use a SLayer transform (rank, lag, ...) or a "
    "model column instead"
)

# date_range time-point shapes (SLayer's core/time_points.py grammar)
_INSTANT_RE = re.compile(r"(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2})(?::(\d{2})(?:\.(\d{1,6}))?)?")
_YEAR_RE = re.compile(r"(\d{4})")
_QUARTER_RE = re.compile(r"(\d{4})-Q(\d)", re.IGNORECASE)
_MONTH_RE = re.compile(r"(\d{4})-(\d{2})")
_WEEK_RE = re.compile(r"(\d{4})-W(\d{2})", re.IGNORECASE)
_DAY_RE = re.compile(r"(\d{4})-(\d{2})-(\d{2})")
_RELATIVE_RES = (
    re.compile(r"(this|last|next) [a-z_]\w*"),
    re.compile(r"(last|next) [1-9]\d* [a-z_]\w*"),
    re.compile(r"[1-9]\d* [a-z_]\w* (ago|from now)"),
    re.compile(r"(week|month|quarter|year) to date"),
    re.compile(r"today|yesterday|tomorrow"),
)


class _Refused(Exception):
    """A query entry we cannot store the way SLayer would; ``where`` locates it."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"query.{where}: {message}" if where else f"query: {message}")


def _is_name(text: Any) -> bool:
    return isinstance(text, str) and _NAME.fullmatch(text) is not None


def _is_column_path(text: str) -> bool:
    prefix, _, leaf = text.rpartition(".")
    return _is_name(leaf) and (not prefix or all(_is_name(p) for p in prefix.split(".")))


def _is_time_point_shape(text: str) -> bool:
    """Whether a ``date_range`` bound has a shape SLayer accepts at construction."""
    literal = text.strip()
    try:
        if m := _INSTANT_RE.fullmatch(literal):
            y, mo, d, h, mi, s, frac = m.groups()
            datetime(int(y), int(mo), int(d), int(h), int(mi), int(s or 0), int((frac or "0").ljust(6, "0")))
            return 1 <= int(y) <= 9998
        if m := _DAY_RE.fullmatch(literal):
            return date(*map(int, m.groups())) is not None and 1 <= int(m.group(1)) <= 9998
        if m := _WEEK_RE.fullmatch(literal):
            return (
                date.fromisocalendar(int(m.group(1)), int(m.group(2)), 1) is not None
                and 1 <= int(m.group(1)) <= 9998
            )
        if m := _MONTH_RE.fullmatch(literal):
            return date(int(m.group(1)), int(m.group(2)), 1) is not None and 1 <= int(m.group(1)) <= 9998
        if m := _QUARTER_RE.fullmatch(literal):
            return 1 <= int(m.group(2)) <= 4 and 1 <= int(m.group(1)) <= 9998
        if m := _YEAR_RE.fullmatch(literal):
            return 1 <= int(m.group(1)) <= 9998
    except ValueError:
        return False
    token = " ".join(text.lower().split())
    return any(r.fullmatch(token) for r in _RELATIVE_RES)


class _QueryNormalizer:
    """Turns a user's query dict into SLayer's stored form; unknown keys of the lenient nested
    objects are dropped (as SLayer drops them) with a warning."""

    def __init__(self) -> None:
        self.warnings: list[str] = []

    # -- scalars
    @staticmethod
    def optional_str(value: Any, where: str) -> str | None:
        if value is None or isinstance(value, str):
            return value
        raise _Refused(where, f"expected a string or null, got {type(value).__name__}")

    @staticmethod
    def optional_int(value: Any, where: str) -> int | None:
        if value is None or (isinstance(value, int) and not isinstance(value, bool)):
            return value
        raise _Refused(where, f"expected an integer or null, got {value!r}")

    @staticmethod
    def boolean(value: Any, where: str) -> bool:
        if isinstance(value, bool):
            return value
        raise _Refused(where, f"expected true or false, got {value!r}")

    def json_value(self, value: Any, where: str) -> Any:
        """A free-form value (``variables``, ``meta``) as JSON-mode pydantic dumps it; only plain JSON
        data is accepted, so the dump is the value itself."""
        if value is None or isinstance(value, (str, bool, int)):
            return value
        if isinstance(value, float):
            if not math.isfinite(value):
                raise _Refused(where, "non-finite numbers cannot be stored")
            return value
        if isinstance(value, (list, tuple)):
            return [self.json_value(v, f"{where}[{i}]") for i, v in enumerate(value)]
        if isinstance(value, Mapping):
            out = {}
            for k, v in value.items():
                if not isinstance(k, str):
                    raise _Refused(where, f"keys must be strings, got {k!r}")
                out[k] = self.json_value(v, f"{where}.{k}")
            return out
        raise _Refused(where, f"cannot store a {type(value).__name__}")

    def drop_extras(self, item: Mapping[str, Any], allowed: Sequence[str], where: str) -> None:
        for key in item:
            if key not in allowed:
                self.warnings.append(f"query.{where}: unknown key {key!r} ignored (SLayer drops it)")

    @staticmethod
    def entries(value: Any, where: str) -> list[Any] | None:
        if value is None:
            return None
        if not isinstance(value, (list, tuple)):
            raise _Refused(where, f"'{where}' must be a list, got {type(value).__name__}")
        return list(value)

    # -- nested objects
    def column_ref(self, value: Any, where: str) -> dict[str, Any]:
        """``ColumnRef`` dump ``{name, model, label}``; a dotted name splits at its last dot."""
        if isinstance(value, str):
            value = {"name": value}
        if not isinstance(value, Mapping):
            raise _Refused(where, "expected a column name or a {name, model, label} object")
        self.drop_extras(value, ("name", "model", "label"), where)
        name = value.get("name")
        if not isinstance(name, str):
            raise _Refused(where, "a column reference needs a string 'name'")
        model = self.optional_str(value.get("model"), f"{where}.model")
        label = self.optional_str(value.get("label"), f"{where}.label")
        if model is None and "." in name:
            model, name = name.rsplit(".", 1)
        if not _is_name(name):
            raise _Refused(
                where,
                f"Invalid name '{name}': must contain only letters, digits, and underscores, "
                f"and start with a letter or underscore",
            )
        if model and not all(_is_name(p) for p in model.split(".")):
            raise _Refused(
                where,
                f"Invalid model path '{model}': each part must contain only letters, digits, and underscores",
            )
        return {"name": name, "model": model, "label": label}

    def measure(self, value: Any, where: str) -> dict[str, Any]:
        """``ModelMeasure`` dump ``{formula, name, label, description, type, meta}``."""
        if isinstance(value, str):
            value = {"formula": value}
        if not isinstance(value, Mapping):
            raise _Refused(where, "expected a formula string or a {formula, name} object")
        self.drop_extras(value, ("formula", "name", "label", "description", "type", "meta"), where)
        formula = value.get("formula")
        if not isinstance(formula, str):
            raise _Refused(where, "a measure needs a string 'formula'")
        if _OVER.search(formula):
            raise _Refused(where, f"ModelMeasure formula '{formula}' {_WINDOW_HINT}")
        name = self.optional_str(value.get("name"), f"{where}.name")
        if name is not None and not _is_name(name):
            raise _Refused(
                where,
                f"Invalid name '{name}': must contain only letters, digits, and underscores, "
                f"and start with a letter or underscore",
            )
        if name is not None and name.startswith(_RESERVED_PREFIX):
            raise _Refused(where, f"ModelMeasure name '{name}' must not start with {_RESERVED_PREFIX!r}")
        kind = value.get("type")
        if kind is not None and kind not in _DATA_TYPES:
            raise _Refused(
                where, f"type must be one of {', '.join(sorted(_DATA_TYPES))} or null, got {kind!r}"
            )
        meta = value.get("meta")
        if meta is not None and not isinstance(meta, Mapping):
            raise _Refused(f"{where}.meta", "expected an object or null")
        return {
            "formula": formula,
            "name": name,
            "label": self.optional_str(value.get("label"), f"{where}.label"),
            "description": self.optional_str(value.get("description"), f"{where}.description"),
            "type": kind,
            "meta": self.json_value(meta, f"{where}.meta"),
        }

    def computed(self, expression: Any, name: Any, where: str) -> dict[str, Any]:
        """``ComputedDimension`` dump ``{expression, name}`` (an absent name is derived)."""
        if not isinstance(expression, str):
            raise _Refused(where, "'expression' must be a string")
        name = self.optional_str(name, f"{where}.name")
        if name is None:
            name = auto_name(expression)
        if "." in name or ":" in name or name.startswith(_RESERVED_PREFIX):
            raise _Refused(
                where,
                f"Computed dimension name {name!r} must not contain '.' or ':' nor start with "
                f"{_RESERVED_PREFIX!r}",
            )
        return {"expression": expression, "name": name}

    def dimension(self, value: Any, where: str) -> dict[str, Any]:
        if isinstance(value, Mapping):
            if "expression" in value:
                extra = [k for k in value if k not in ("expression", "name")]
                if extra:
                    raise _Refused(where, f"unknown key(s) {extra} on a computed dimension")
                return self.computed(value["expression"], value.get("name"), where)
            return self.column_ref(value, where)
        if not isinstance(value, str):
            raise _Refused(where, "expected a column name, a computed expression or an object")
        if _is_column_path(value):
            return self.column_ref(value, where)
        try:
            formulas.parse(value)
        except (formulas.ModeBError, RecursionError) as exc:
            if not may_name_datasource_granularity(value):
                raise _Refused(
                    where,
                    f"Dimension {value!r} is neither a column reference (a bare identifier or "
                    f"dotted join path) nor a parseable Mode-B expression: {exc}",
                ) from exc
        return self.computed(value, None, where)

    def granularity_call(self, entry: str, where: str, *, any_callee: bool) -> dict[str, Any] | None:
        """The time dimension a ``gran(col)`` string stands for; ``None`` when the callee is no
        built-in granularity and ``any_callee`` is off (a custom one then keeps its spelling)."""
        node, callee = formulas.call_callee(entry)
        builtin = callee is not None and callee.casefold() in formulas.GRANULARITY_NAMES
        if not builtin and not any_callee:
            return None
        column = formulas.functional_call_column(node) if callee is not None else None
        if callee is None or column is None or not callee.isascii():
            raise _Refused(
                where,
                f"Time dimension {entry!r} must be the functional form gran(col) (e.g. "
                f"month(created_at)) for one of: {', '.join(sorted(formulas.GRANULARITY_NAMES))} "
                f"or a datasource granularity",
            )
        return {"dimension": column, "granularity": callee.lower() if builtin else callee}

    def time_dimension(self, value: Any, where: str) -> dict[str, Any]:
        """``TimeDimension`` dump ``{dimension, granularity, date_range, label}``."""
        if isinstance(value, str):
            value = self.granularity_call(value, where, any_callee=True)
        if not isinstance(value, Mapping):
            raise _Refused(where, "expected a {dimension, granularity} object or 'gran(col)'")
        self.drop_extras(value, ("dimension", "column", "granularity", "date_range", "label"), where)
        if "dimension" in value and "column" in value:
            self.warnings.append(f"query.{where}: both 'dimension' and 'column' given; 'column' ignored")
        column = value["dimension"] if "dimension" in value else value.get("column")
        if column is None:
            raise _Refused(where, "a time dimension needs a 'dimension'")
        granularity = value.get("granularity")
        if not isinstance(granularity, str):
            raise _Refused(where, "a time dimension needs a string 'granularity'")
        if granularity.lower() in formulas.GRANULARITY_NAMES:
            granularity = granularity.lower()
        elif not _is_name(granularity):
            raise _Refused(
                where,
                f"granularity {granularity!r} is neither a built-in granularity nor a "
                f"datasource granularity name",
            )
        return {
            "dimension": self.column_ref(column, f"{where}.dimension"),
            "granularity": granularity,
            "date_range": self.date_range(value.get("date_range"), f"{where}.date_range"),
            "label": self.optional_str(value.get("label"), f"{where}.label"),
        }

    def date_range(self, value: Any, where: str) -> list[str | None] | None:
        if value is None:
            return None
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, (list, tuple)) or not 1 <= len(value) <= 2:
            raise _Refused(where, "must be one time point or a [lower, upper] pair")
        if all(b is None for b in value):
            raise _Refused(where, "needs at least one non-null bound")
        for bound in value:
            if bound is None:
                continue
            if not isinstance(bound, str):
                raise _Refused(where, f"bounds must be strings or null, got {bound!r}")
            if "{" in bound or "}" in bound:
                raise _Refused(
                    where,
                    f"{bound!r}: placeholders in date_range are not supported here; save "
                    f"this memory with SLayer",
                )
            if not _is_time_point_shape(bound):
                raise _Refused(
                    where,
                    f"{bound!r} is not a time point ('YYYY', 'YYYY-Qn', 'YYYY-MM', "
                    f"'YYYY-Www', 'YYYY-MM-DD', 'YYYY-MM-DD HH:MM[:SS]' or a relative token)",
                )
        return list(value)

    def order_item(self, value: Any, where: str) -> dict[str, Any]:
        """``OrderItem`` dump ``{column, direction, raw_formula}``: an expression key keeps its text in
        ``raw_formula`` and a placeholder column name, as SLayer's validators leave it."""
        if not isinstance(value, Mapping):
            raise _Refused(where, "expected a {column, direction} object")
        extra = [k for k in value if k not in ("column", "direction", "raw_formula")]
        if extra:
            raise _Refused(where, f"Extra inputs are not permitted: {extra}")
        if "column" not in value:
            raise _Refused(where, "an order item needs a 'column'")
        column = value["column"]
        raw_formula = self.optional_str(value.get("raw_formula"), f"{where}.raw_formula")
        text = column if isinstance(column, str) else None
        if (
            isinstance(column, Mapping)
            and set(column) == {"name"}
            and isinstance(column["name"], str)
            and not _is_column_path(column["name"])
        ):
            text = column["name"]
        if text is not None and (candidate := order_formula_candidate(text)) is not None:
            column, raw_formula = text, candidate
        if isinstance(column, str):
            if order_formula_candidate(column) is None:
                ref = self.column_ref(column, f"{where}.column")
            elif _FUNCSTYLE_CALL.match(column):
                ref = {"name": _FUNCSTYLE_PENDING, "model": None, "label": None}
            else:
                ref = {"name": _EXPR_PENDING, "model": None, "label": None}
                if ":" in column:
                    base, agg = column.rsplit(":", 1)
                    agg_name = agg.split("(", 1)[0]
                    rewritten = f"_{agg_name}" if base == "*" else f"{base}_{agg_name}"
                    if _is_column_path(rewritten):
                        ref = self.column_ref(rewritten, f"{where}.column")
        else:
            ref = self.column_ref(column, f"{where}.column")
        direction = value.get("direction", "asc")
        normalized = _DIRECTIONS.get(direction.strip().lower()) if isinstance(direction, str) else None
        if normalized is None:
            raise _Refused(
                where,
                f"order direction must be one of asc/desc/ascending/descending "
                f"(case-insensitive), got {direction!r}",
            )
        return {"column": ref, "direction": normalized, "raw_formula": raw_formula}

    # -- the whole query
    def run(self, query: Mapping[str, Any]) -> dict[str, Any]:
        if not isinstance(query, Mapping):
            raise _Refused("", f"a query must be an object, got {type(query).__name__}")
        data = dict(query)
        if any(not isinstance(k, str) for k in data):
            raise _Refused("", "field names must be strings")
        if "strict" in data:
            raise _Refused(
                "strict",
                "`strict` is retired; set to_many_handling='error' instead "
                "(one of broadcast|associate|error).",
            )
        if "version" in data:
            if data["version"] != QUERY_VERSION or isinstance(data["version"], bool):
                raise _Refused(
                    "version",
                    f"only SlayerQuery v{QUERY_VERSION} can be stored as given (got "
                    f"{data['version']!r}); re-save an older query with SLayer",
                )
        else:  # the pre-v3 renames SLayer applies to a version-less payload
            if "fields" in data:
                if "measures" in data:
                    raise _Refused(
                        "fields",
                        "v1 SlayerQuery has both 'fields' and 'measures'; cannot migrate "
                        "unambiguously. Drop one before migrating.",
                    )
                data["measures"] = data.pop("fields")
            for legacy in ("dry_run", "explain"):
                if legacy in data:
                    data.pop(legacy)
                    self.warnings.append(f"query: legacy field {legacy!r} dropped")
        unknown = [k for k in data if k not in QUERY_FIELDS]
        if unknown:
            raise _Refused("", f"unknown field(s) {unknown}; SlayerQuery has {', '.join(QUERY_FIELDS)}")

        dims = self.entries(data.get("dimensions"), "dimensions")
        moved: list[dict[str, Any]] = []
        if dims is not None:
            kept = []
            for i, dim in enumerate(dims):
                td = (
                    self.granularity_call(dim, f"dimensions[{i}]", any_callee=False)
                    if isinstance(dim, str)
                    else None
                )
                if td is None:
                    kept.append(dim)
                else:
                    moved.append(td)
            if moved:
                dims = kept or None
        tds = self.entries(data.get("time_dimensions"), "time_dimensions")
        if tds or moved:
            tds = [*(tds or []), *moved]

        source = data.get("source_model")
        if source is not None and not isinstance(source, str):
            raise _Refused(
                "source_model",
                "inline models and model extensions cannot be stored by slayer-lsp; "
                "save this memory with SLayer",
            )
        name = self.optional_str(data.get("name"), "name")
        if name is not None and ("." in name or ":" in name or name.startswith(_RESERVED_PREFIX)):
            raise _Refused(
                "name", f"Query name {name!r} must not contain '.' or ':' nor start with {_RESERVED_PREFIX!r}"
            )
        measures = self.entries(data.get("measures"), "measures")
        filters = self.entries(data.get("filters"), "filters")
        for i, text in enumerate(filters or ()):
            if not isinstance(text, str):
                raise _Refused(f"filters[{i}]", "expected a string")
            if _OVER.search(text):
                raise _Refused(f"filters[{i}]", f"Filter '{text}' {_WINDOW_HINT}")
        variables = data.get("variables")
        if variables is not None and not isinstance(variables, Mapping):
            raise _Refused("variables", "expected an object or null")
        order = data.get("order")
        if isinstance(order, Mapping):
            order = [order]
        order = self.entries(order, "order")
        to_many = data.get("to_many_handling", "broadcast")
        if to_many not in _TO_MANY:
            raise _Refused("to_many_handling", f"must be one of broadcast|associate|error, got {to_many!r}")

        out: dict[str, Any] = {
            "version": QUERY_VERSION,
            "name": name,
            "source_model": source,
            "measures": None
            if measures is None
            else [self.measure(m, f"measures[{i}]") for i, m in enumerate(measures)],
            "dimensions": None
            if dims is None
            else [self.dimension(d, f"dimensions[{i}]") for i, d in enumerate(dims)],
            "time_dimensions": None
            if tds is None
            else [self.time_dimension(t, f"time_dimensions[{i}]") for i, t in enumerate(tds)],
            "main_time_dimension": self.optional_str(data.get("main_time_dimension"), "main_time_dimension"),
            "filters": filters,
            "variables": self.json_value(variables, "variables"),
            "order": None
            if order is None
            else [self.order_item(o, f"order[{i}]") for i, o in enumerate(self.expand_order(order))],
            "limit": self.optional_int(data.get("limit"), "limit"),
            "offset": self.optional_int(data.get("offset"), "offset"),
            "whole_periods_only": self.boolean(data.get("whole_periods_only", False), "whole_periods_only"),
            "distinct_dimension_values": self.boolean(
                data.get("distinct_dimension_values", True), "distinct_dimension_values"
            ),
            "to_many_handling": to_many,
        }
        self.check_distinct(out)
        out["time_dimensions"] = self.dedupe_time_dimensions(out["time_dimensions"], source)
        return out

    @staticmethod
    def expand_order(items: list[Any]) -> list[Any]:
        """``{column: direction, ...}`` shorthands become one item per key."""
        out: list[Any] = []
        for item in items:
            if (
                isinstance(item, Mapping)
                and item
                and "column" not in item
                and "direction" not in item
                and all(isinstance(k, str) for k in item)
                and all(isinstance(v, str) and v.strip().lower() in _DIRECTIONS for v in item.values())
            ):
                out.extend({"column": k, "direction": v} for k, v in item.items())
            else:
                out.append(item)
        return out

    @staticmethod
    def check_distinct(out: Mapping[str, Any]) -> None:
        if out["distinct_dimension_values"]:
            return
        if out["measures"]:
            raise _Refused(
                "distinct_dimension_values",
                f"distinct_dimension_values=False requires an empty "
                f"`measures` field, but {len(out['measures'])} measure(s) "
                f"were supplied.",
            )
        if not out["dimensions"] and not out["time_dimensions"]:
            raise _Refused(
                "distinct_dimension_values",
                "distinct_dimension_values=False requires at least one "
                "of `dimensions` or `time_dimensions` to be non-empty",
            )

    @staticmethod
    def dedupe_time_dimensions(
        tds: list[dict[str, Any]] | None,
        source: str | None,
    ) -> list[dict[str, Any]] | None:
        """Exact duplicates (the source model's own prefix ignored) collapse to the first; the same
        column and granularity with another date range or label is refused."""
        if not tds:
            return tds
        seen: dict[tuple[str, str], tuple[Any, ...]] = {}
        result = []
        for td in tds:
            ref = td["dimension"]
            model = ref["model"]
            if source and model is not None:
                if model == source:
                    model = None
                elif model.startswith(source + "."):
                    model = model[len(source) + 1 :]
            column = f"{model}.{ref['name']}" if model else ref["name"]
            canon = (column, td["granularity"], tuple(td["date_range"] or ()), td["label"])
            prior = seen.get(canon[:2])
            if prior is None:
                seen[canon[:2]] = canon
                result.append(td)
            elif prior != canon:
                raise _Refused(
                    "time_dimensions",
                    f"Conflicting time dimensions on {column!r} at "
                    f"{td['granularity']} granularity: same column and granularity "
                    f"must not differ in date range or label.",
                )
        return result


def normalize_query(query: Mapping[str, Any]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """A query in SLayer's stored form (``SlayerQuery.model_dump(mode="json")``: every field, nulls
    and defaults included) plus warnings about keys SLayer would drop. Raises ``QueryRefused``
    for what SLayer would refuse and for shapes we cannot reproduce faithfully."""
    normalizer = _QueryNormalizer()
    try:
        stored = normalizer.run(query)
    except _Refused as exc:
        raise QueryRefused(str(exc)) from None
    return stored, tuple(normalizer.warnings)
