"""The MCP server's tools and resources as plain data: names, descriptions, and the msgspec types
their arguments are decoded with and their structured results encoded from.

The JSON Schemas a client sees (``tools/list``) and ``protocol/mcp-tools.json`` are both derived
from these types, so the schema and the decoder cannot disagree. No MCP SDK import here: the
protocol generator and the tests read this module without it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from slayer_lsp import protocol_types as p
from slayer_lsp.analysis.inspect import InspectItem
from slayer_lsp.search.facet_ranking import SearchFacetsParams, SearchFacetsResponse
from slayer_lsp.search.types import SearchParams, SearchResponse

MAX_INSPECT_REFS = p.MAX_INSPECT_REFS  # references per inspect call, as slayer/inspect
MAX_ARGUMENT_CHARS = 4 * 1024 * 1024  # characters of text (strings and keys) in one tool call's arguments
MAX_ARGUMENT_DEPTH = 100  # levels of arrays and objects in a tool call's arguments, as the LSP daemon
PAGE_SIZE = 100  # resources per resources/list page


class InspectResult(msgspec.Struct, kw_only=True):
    """What ``inspect`` answers: one item per reference, in order; an item with ``error`` is a
    reference that names nothing this session can reach."""

    items: list[InspectItem]


class ScopeReport(msgspec.Struct, kw_only=True):
    """The session's scope, fixed on the command line (``--scope-datasource``, ``--access-tag``,
    ``--untagged-only``): empty datasources means all; access_tags None means no restriction."""

    datasources: list[str] = []
    access_tags: list[str] | None = None
    untagged_only: bool = False


class McpStatus(msgspec.Struct, kw_only=True):
    """What ``status`` answers, at once even while the first index is being built: the fields from
    ``generation`` to ``issues`` appear once it is done (``ready``)."""

    version: str
    store: str | None = None
    backend: str | None = None  # "yaml" | "sqlite"
    generation: int | None = None
    readable: bool | None = None
    error: str | None = None  # why the store cannot be read now (the last good snapshot keeps serving)
    counts: dict[str, int] | None = None  # reachable entities per kind
    load_issues: int | None = None
    last_refresh_ms: float | None = None
    warming: bool | None = None  # the start-up's background work (indexes built ahead of use) is under way
    embedding: p.EmbeddingReport | None = None
    refreshes: int | None = None
    issues: list[str] | None = None  # the first 50 load issues, as text
    ready: bool
    indexing: bool
    server_error: str | None = None  # the store could not be opened at all
    scope: ScopeReport
    watching: str | None = None
    uptime_s: float


# --------------------------------------------------------------------------- resources


class DatasourceResource(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``slayer://datasource/{name}``: a datasource and the models it holds (connection settings
    such as host, user and connection string are never exposed)."""

    name: str
    type: str | None = None
    database: str | None = None
    schema_name: str | None = None
    description: str | None = None
    models: list[str] = []  # "ds.model" ids, each readable as slayer://model/{id}


class ColumnInfo(msgspec.Struct, kw_only=True, omit_defaults=True):
    name: str
    type: str = "TEXT"
    description: str | None = None
    label: str | None = None
    primary_key: bool = False
    sql: str | None = None
    samples: list[str] | None = None


class MeasureInfo(msgspec.Struct, kw_only=True, omit_defaults=True):
    name: str
    formula: str = ""
    description: str | None = None
    label: str | None = None


class AggregationInfo(msgspec.Struct, kw_only=True, omit_defaults=True):
    name: str
    formula: str | None = None
    params: list[str] = []
    description: str | None = None


class JoinInfo(msgspec.Struct, kw_only=True, omit_defaults=True):
    target_model: str
    join_pairs: list[list[str]] = []
    join_type: str | None = None
    cardinality: str | None = None
    name: str | None = None
    description: str | None = None


class ModelResource(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``slayer://model/{ds}.{model}``: a model with its visible columns, named measures, custom
    aggregations and joins (to reachable models only)."""

    id: str
    name: str
    datasource: str
    description: str | None = None
    sql_table: str | None = None
    default_time_dimension: str | None = None
    columns: list[ColumnInfo] = []
    measures: list[MeasureInfo] = []
    aggregations: list[AggregationInfo] = []
    joins: list[JoinInfo] = []
    memories: list[str] = []  # ids of the memories tagged with the model or one of its leaves


class MemoryResource(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``slayer://memory/{id}``: a saved memory, its tags and (for a query memory) its query."""

    id: str
    learning: str
    description: str | None = None
    entities: list[str] = []
    query: dict[str, Any] | None = None
    created_at: str | None = None


# --------------------------------------------------------------------------- tools


@dataclass(frozen=True)
class ToolSpec:
    name: str
    title: str
    description: str
    params: type[msgspec.Struct]
    result: type[msgspec.Struct]
    read_only: bool = True
    destructive: bool = False
    idempotent: bool = True


TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        "search",
        "Search the semantic layer",
        "Find the datasources, models, columns, measures, aggregations and saved memories (notes other "
        "agents left) that answer a question. Returns `results` ranked best first, each with `kind`, "
        "canonical `id` (e.g. `jaffle.orders.order_total`, `memory:3`), `score` (ranks this answer only), "
        "`description` and a short `text`; plus `warnings`. Use it before writing a query to learn which "
        'columns and tables to use and what is already known about them; pass `kinds: ["memory"]` for '
        "notes only, `entities` to list what is linked to known references, `datasource` to stay in one "
        'database. Example: {"question": "net sales by store last year", "max_results": 10}.',
        SearchParams,
        SearchResponse,
    ),
    ToolSpec(
        "search_facets",
        "Search one kind by several facets",
        "Rank the entities of one `kind` (datasource, model, column, measure, aggregation or memory) on "
        "several facets at once and keep those that match every facet (the score is the weakest facet's). "
        "Facets: `meaning` (what it is), `values` (sampled values), `name`, `description`, ... Returns "
        "`results` with each facet's own score in `facet_scores`, the `channel` used and `warnings`. Use it "
        'when a question names both what a column means and values it holds. Example: {"kind": '
        '"column", "facets": {"meaning": "order state", "values": "completed"}}.',
        SearchFacetsParams,
        SearchFacetsResponse,
    ),
    ToolSpec(
        "inspect",
        "Inspect references",
        "Everything the semantic layer says about references written as a user would (`orders.amount`, "
        "`jaffle.orders`, `sum(orders.subtotal)`, `memory:3`): canonical id, kind, description, rendered "
        "text, sampled values; for a memory its learning, tags (stale ones marked) and query. Returns "
        "`items` in the order asked; an item with `error` names nothing this session can reach. At most "
        f"{MAX_INSPECT_REFS} references. Use it to check a name before using it in a query. Example: "
        '{"refs": ["orders.order_total", "memory:1"]}.',
        p.InspectParams,
        InspectResult,
    ),
    ToolSpec(
        "status",
        "Store and index status",
        "The store this server reads, whether its first index is ready, entity counts per kind, load "
        "issues, the embedding channel and the session's scope. Takes no arguments; answers at once, even "
        "while indexing. Use it when answers look empty or stale. Example: {}.",
        p.StatusParams,
        McpStatus,
    ),
    ToolSpec(
        "save_memory",
        "Save a memory",
        "Save what you learned (a `learning`, in plain prose) so that later searches find it, tagged with "
        "the `entities` it is about (references, each must resolve) or with the `query` it came from "
        "(a SLayer query whose references become the tags), exactly as SLayer's own save_memory. "
        "Give `id` to replace an existing memory, `description` for a one-line summary. Returns the "
        "memory's `id`, its canonical tags in `entities`, `created` (false when replaced) and "
        '`warnings`. Example: {"learning": "order_total includes tax; use subtotal for net sales", '
        '"entities": ["orders.order_total", "orders.subtotal"]}.',
        p.SaveMemoryParams,
        p.SaveMemoryResult,
        read_only=False,
        destructive=True,
        idempotent=False,
    ),
    ToolSpec(
        "forget_memory",
        "Forget a memory",
        "Delete a saved memory by `id` (and the `memory:<id>` links other memories hold to it), as "
        "SLayer's forget_memory. Returns `forgotten`: false when there is no such memory (nothing "
        'changed). Use it for a memory that is wrong or obsolete. Example: {"id": "12"}.',
        p.ForgetMemoryParams,
        p.ForgetMemoryResult,
        read_only=False,
        destructive=True,
        idempotent=True,
    ),
)
TOOLS_BY_NAME = {t.name: t for t in TOOLS}


def json_schema(typ: type, *, closed: bool = False) -> dict[str, Any]:
    """The JSON Schema of a struct with the struct itself at the root (MCP wants ``type: object``
    there, not a ``$ref``); other definitions stay under ``$defs``. ``closed``: refuse unknown
    properties, as the decoder does (``forbid_unknown_fields``)."""
    schema = msgspec.json.schema(typ)
    defs = dict(schema.get("$defs", {}))
    ref = schema["$ref"]
    root = dict(defs.pop(ref.rsplit("/", 1)[-1]))
    if ref in msgspec.json.encode(defs).decode():
        raise ValueError(f"{typ.__name__} is recursive: its schema cannot have it at the root")
    if defs:
        root["$defs"] = defs
    if closed:
        root["additionalProperties"] = False
    root.pop("title", None)
    return root


def tool_list() -> list[dict[str, Any]]:
    """Every tool as ``tools/list`` announces it (camelCase keys, as on the wire)."""
    out = []
    for spec in TOOLS:
        out.append(
            {
                "name": spec.name,
                "title": spec.title,
                "description": spec.description,
                "inputSchema": json_schema(spec.params, closed=True),
                "outputSchema": json_schema(spec.result),
                "annotations": {
                    "title": spec.title,
                    "readOnlyHint": spec.read_only,
                    "destructiveHint": spec.destructive,
                    "idempotentHint": spec.idempotent,
                    "openWorldHint": False,
                },
            }
        )
    return out


RESOURCE_TEMPLATES: tuple[tuple[str, str, str], ...] = (
    ("slayer://datasource/{name}", "datasource", "A datasource and the ids of its models."),
    (
        "slayer://model/{datasource}.{model}",
        "model",
        "A model with its columns, named measures, custom aggregations, joins and the memories about it.",
    ),
    ("slayer://memory/{id}", "memory", "A saved memory: its learning, tags and query."),
)
