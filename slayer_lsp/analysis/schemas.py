"""JSON Schemas of SLayer query files and memory front matter, for editors' YAML and JSON services.

One source of truth with the diagnostics: the query schema's keys are ``query.normal_form.QUERY_FIELDS``
(the list ``unknown-query-field`` checks against; a field without a type here fails at import), and
the memory schema is generated from the store reader's own ``Memory`` struct (what a memory file's
front matter is decoded into). ``tests/test_schemas.py`` checks on a table of cases that the schema
and the diagnostics accept and refuse the same documents. Value shapes are as lenient as SLayer:
a single entry where a list is expected is accepted (SLayer coerces it).
"""

from __future__ import annotations

from typing import Any

import msgspec

from slayer_lsp.query.normal_form import QUERY_FIELDS

DIALECT = "http://json-schema.org/draft-07/schema#"  # what VS Code's YAML and JSON services support
KINDS = ("query", "memory")


def _list_of(item: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [{"type": "array", "items": item}, item, {"type": "null"}]}


_REF_OR_OBJECT = {"type": ["string", "object"]}
_OPT_STR = {"type": ["string", "null"]}
_OPT_INT = {"type": ["integer", "null"], "minimum": 0}

# field -> (schema, description); the keys must be exactly QUERY_FIELDS
_QUERY_FIELD_SCHEMAS: dict[str, tuple[dict[str, Any], str]] = {
    "version": ({"type": "integer"}, "Query format version."),
    "name": (_OPT_STR, "A name for this stage; a later stage may use it as its source_model."),
    "source_model": (
        {"type": ["string", "object", "null"]},
        "The model the query reads: a name (`orders`, `jaffle.orders`), an earlier stage's name, "
        "or an inline model / extension object.",
    ),
    "measures": (_list_of(_REF_OR_OBJECT), "Measures: formulas (`sum(amount)`) or {formula, name, label}."),
    "dimensions": (
        _list_of(_REF_OR_OBJECT),
        "Dimensions: column paths (`stores.name`) or {name, model} / {expression, name}.",
    ),
    "time_dimensions": (_list_of(_REF_OR_OBJECT), "Time dimensions: {dimension, granularity, date_range}."),
    "main_time_dimension": (_OPT_STR, "The time dimension that transforms and whole periods use."),
    "filters": (_list_of({"type": "string"}), "Filter formulas (`status = 'completed'`)."),
    "variables": ({"type": ["object", "null"]}, "Values for {variables} in filters and formulas."),
    "order": (_list_of(_REF_OR_OBJECT), "Ordering: column names, {column, direction} or {name: direction}."),
    "limit": (_OPT_INT, "Maximum number of rows."),
    "offset": (_OPT_INT, "Rows skipped before the first returned."),
    "whole_periods_only": ({"type": "boolean"}, "Drop incomplete first and last time periods."),
    "distinct_dimension_values": ({"type": "boolean"}, "Return distinct dimension values."),
    "to_many_handling": (_OPT_STR, "How a to-many join is aggregated (e.g. `broadcast`)."),
}
if set(_QUERY_FIELD_SCHEMAS) != set(QUERY_FIELDS):  # a new query field needs its type here
    raise RuntimeError(
        f"query schema and QUERY_FIELDS differ: {set(_QUERY_FIELD_SCHEMAS) ^ set(QUERY_FIELDS)}"
    )


def _stage_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            k: {**_QUERY_FIELD_SCHEMAS[k][0], "description": _QUERY_FIELD_SCHEMAS[k][1]} for k in QUERY_FIELDS
        },
        "additionalProperties": False,
    }


def query_schema() -> dict[str, Any]:
    """A query file: one SlayerQuery, or a list of stages."""
    return {
        "$schema": DIALECT,
        "$id": "https://slayer-lsp.dev/schemas/query.schema.json",
        "title": "SLayer query",
        "description": "A SLayer query file (SlayerQuery, motley-slayer 1.4.1), or a list of query stages.",
        "definitions": {"stage": _stage_schema()},
        "anyOf": [
            {"$ref": "#/definitions/stage"},
            {"type": "array", "items": {"$ref": "#/definitions/stage"}},
        ],
    }


def memory_schema() -> dict[str, Any]:
    """A memory file's front matter: the reader's ``Memory`` struct without ``id`` (the file name)
    and ``learning`` (the body); ``query`` is a SlayerQuery."""
    from slayer_lsp.store.documents import Memory

    generated = msgspec.json.schema(Memory)
    defs = generated.get("$defs", {})
    memory = defs[generated["$ref"].rsplit("/", 1)[-1]] if "$ref" in generated else generated
    props = {k: v for k, v in memory["properties"].items() if k not in ("id", "learning")}
    props["query"] = {
        "anyOf": [{"$ref": "#/definitions/stage"}, {"type": "null"}],
        "description": "An example query (SlayerQuery).",
    }
    props["entities"] = {
        "type": "array",
        "items": {"type": "string"},
        "description": "Canonical ids this memory is about (`ds.model.column`, `memory:<id>`).",
    }
    return {
        "$schema": DIALECT,
        "$id": "https://slayer-lsp.dev/schemas/memory.schema.json",
        "title": "SLayer memory front matter",
        "description": "The YAML front matter of a SLayer memory file (memories/<id>.md).",
        "definitions": {"stage": _stage_schema()},
        "type": "object",
        "properties": props,
        "additionalProperties": True,  # the reader keeps unknown keys out of the memory, it does not refuse them
    }


def schema(kind: str) -> dict[str, Any]:
    if kind == "query":
        return query_schema()
    if kind == "memory":
        return memory_schema()
    raise ValueError(f"unknown schema '{kind}'; expected one of {list(KINDS)}")
