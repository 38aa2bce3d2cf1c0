"""The store as MCP resources, in plain data: the URI of each datasource, model and memory the
session reaches, and what reading one answers.

Everything is computed from the engine's *reachable* catalog, so an out-of-scope name is not
listed and reads exactly like a missing one. Hidden models (and hidden columns) are left out as
search leaves them out: an agent is never pointed at them.
"""

from __future__ import annotations

import base64
import binascii
import os
from dataclasses import dataclass
from urllib.parse import quote, unquote

import msgspec

from slayer_lsp.catalog import Catalog, Delta
from slayer_lsp.catalog.ids import (
    datasource_of,
    is_descendant_or_self,
    is_memory_ref,
    memory_id_of,
    memory_ref,
    model_of,
    split_model_id,
)
from slayer_lsp.mcp import types as mt

SCHEME = "slayer://"
MIME = "application/json"


@dataclass(frozen=True)
class ResourceRef:
    uri: str
    name: str
    title: str
    description: str | None


class BadCursor(ValueError):
    """A ``resources/list`` cursor this server did not hand out."""


def datasource_uri(name: str) -> str:
    return f"{SCHEME}datasource/{quote(name, safe='')}"


def model_uri(model_id: str) -> str:
    ds, name = split_model_id(model_id)
    return f"{SCHEME}model/{quote(ds, safe='')}.{quote(name, safe='')}"


def memory_uri(memory_id: str) -> str:
    return f"{SCHEME}memory/{quote(memory_id, safe='')}"


def _visible_models(catalog: Catalog) -> list[str]:
    return [mid for mid, model in catalog.models.items() if not model.hidden]


def listing(catalog: Catalog) -> list[ResourceRef]:
    """Every resource of the session, in a stable order: datasources, models, memories."""
    out = [
        ResourceRef(datasource_uri(name), name, f"datasource {name}", ds.description)
        for name, ds in catalog.datasources.items()
    ]
    models = catalog.models
    out.extend(
        ResourceRef(model_uri(mid), mid, f"model {mid}", models[mid].description)
        for mid in _visible_models(catalog)
    )
    out.extend(
        ResourceRef(
            memory_uri(mid), memory_ref(mid), f"memory {mid}", mem.description or _first_line(mem.learning)
        )
        for mid, mem in catalog.memories.items()
    )
    return out


def _first_line(text: str, limit: int = 200) -> str:
    line = text.strip().split("\n", 1)[0]
    return line if len(line) <= limit else line[: limit - 1] + "…"


def page(items: list[ResourceRef], cursor: str | None) -> tuple[list[ResourceRef], str | None]:
    """One page of ``items`` from ``cursor`` (None: the first), and the next cursor (None: the
    last page). A cursor is the offset, opaque to the client; one past the end gives an empty page."""
    start = 0 if cursor is None else decode_cursor(cursor)
    end = start + page_size()
    return items[start:end], (encode_cursor(end) if end < len(items) else None)


def page_size() -> int:
    """``$SLAYER_LSP_MCP_PAGE_SIZE`` (1..1000), else ``PAGE_SIZE``; a bad value is ignored."""
    raw = os.environ.get("SLAYER_LSP_MCP_PAGE_SIZE", "").strip()
    return int(raw) if raw.isdigit() and 1 <= int(raw) <= 1000 else mt.PAGE_SIZE


def encode_cursor(offset: int) -> str:
    return base64.urlsafe_b64encode(f"slayer:{offset}".encode()).decode()


def decode_cursor(cursor: str) -> int:
    try:
        text = base64.urlsafe_b64decode(cursor.encode("ascii")).decode("ascii") if len(cursor) <= 64 else ""
    except (UnicodeError, binascii.Error, ValueError):
        text = ""
    prefix, _, number = text.partition(":")
    if prefix != "slayer" or not number.isdigit() or len(number) > 9:
        raise BadCursor(f"invalid cursor {cursor[:80]!r}: pass the nextCursor of the previous page")
    return int(number)


def read(catalog: Catalog, uri: str) -> str | None:
    """The JSON text of the resource at ``uri``, or None when the session has no such resource
    (unknown, unreachable or hidden alike)."""
    if not uri.startswith(SCHEME):
        return None
    kind, _, rest = uri[len(SCHEME) :].partition("/")
    value: mt.DatasourceResource | mt.ModelResource | mt.MemoryResource | None
    if kind == "datasource":
        value = _datasource(catalog, unquote(rest))
    elif kind == "model":
        ds, dot, name = rest.partition(".")
        value = _model(catalog, unquote(ds), unquote(name)) if dot else None
    elif kind == "memory":
        value = _memory(catalog, unquote(rest))
    else:
        value = None
    return None if value is None else msgspec.json.encode(value).decode()


def _datasource(catalog: Catalog, name: str) -> mt.DatasourceResource | None:
    ds = catalog.datasources.get(name)
    if ds is None:
        return None
    models = [mid for mid in _visible_models(catalog) if datasource_of(mid) == name]
    return mt.DatasourceResource(
        name=name,
        type=ds.type,
        database=ds.database,
        schema_name=ds.schema_name,
        description=ds.description,
        models=models,
    )


def _model(catalog: Catalog, ds: str, name: str) -> mt.ModelResource | None:
    model = catalog.model(ds, name)
    if model is None or model.hidden:
        return None
    mid = f"{ds}.{name}"
    columns = []
    for col in model.columns:
        if col.hidden:
            continue
        samples = (
            list(col.sampled_values)
            if col.sampled_values is not None
            else ([col.sampled] if col.sampled else None)
        )
        columns.append(
            mt.ColumnInfo(
                name=col.name,
                type=col.type,
                description=col.description,
                label=col.label,
                primary_key=col.primary_key,
                sql=col.sql,
                samples=samples,
            )
        )
    measures = [
        mt.MeasureInfo(name=m.name, formula=m.formula, description=m.description, label=m.label)
        for m in model.measures
        if m.name
    ]
    aggregations = [
        mt.AggregationInfo(
            name=a.name, formula=a.formula, params=[p.name for p in a.params], description=a.description
        )
        for a in model.aggregations
    ]
    joins = [
        mt.JoinInfo(
            target_model=j.target_model,
            join_pairs=[list(pair) for pair in j.join_pairs],
            join_type=j.join_type,
            cardinality=j.cardinality,
            name=j.name,
            description=j.description,
        )
        for j in model.joins
    ]
    about = [
        mem_id
        for mem_id, mem in catalog.memories.items()
        if any(is_descendant_or_self(tag, mid) for tag in mem.entities)
    ]
    return mt.ModelResource(
        id=mid,
        name=name,
        datasource=ds,
        description=model.description,
        sql_table=model.sql_table,
        default_time_dimension=model.default_time_dimension,
        columns=columns,
        measures=measures,
        aggregations=aggregations,
        joins=joins,
        memories=about,
    )


def _memory(catalog: Catalog, memory_id: str) -> mt.MemoryResource | None:
    mem = catalog.memory(memory_id)
    if mem is None:
        return None
    return mt.MemoryResource(
        id=memory_id,
        learning=mem.learning,
        description=mem.description,
        entities=list(mem.entities),
        query=mem.query,
        created_at=mem.created_at or None,
    )


def changed_uris(catalog: Catalog, delta: Delta) -> set[str]:
    """The resources a refresh touched: a leaf's change is its model's, and a model that came or
    went changes its datasource's list of models."""
    out: set[str] = set()
    for canonical in delta.touched:
        if is_memory_ref(canonical):
            out.add(memory_uri(memory_id_of(canonical)))
            continue
        model = model_of(canonical)
        if model is None:
            out.add(datasource_uri(canonical))
        else:
            out.add(model_uri(model))
            if model == canonical and canonical not in delta.changed:
                out.add(datasource_uri(datasource_of(canonical)))
    return out
