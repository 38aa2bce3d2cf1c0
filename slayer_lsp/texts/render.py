"""The text each entity is indexed (and shown) as.

One renderer feeds the full-text index, verbose search hits, ``inspect`` and hovers, so what a user
reads is what search matched. The layout follows SLayer's ``render.py`` line for line (so rankings
agree), with one deliberate difference: a column's number format is written in words
(``Format: currency, precision 2, symbol $``) instead of SLayer's Pydantic ``repr`` line, which made
every formatted column match the words "type", "precision" and "None".
"""

from __future__ import annotations

import json

import msgspec

from slayer_lsp.catalog import Catalog
from slayer_lsp.store import documents as d


class RenderedDoc(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """One entity's text. A struct rather than a dataclass because 400,000 of them are read back from
    the on-disk cache at start (``search.rendered``): decoded straight into this type, they cost a
    fraction of constructing frozen dataclasses, and, holding only strings, they stay out of GC passes."""

    canonical: str  # memory docs use "memory:<id>"
    kind: str
    text: str
    description: str | None


def _csv(names: list[str], kind: str) -> str:
    return ", ".join(f"{n} ({kind})" for n in names)


def datasource_text(ds: d.Datasource, models: list[d.Model]) -> str:
    lines = [f"Datasource: {ds.name}"]
    if ds.description:
        lines.append(f"Description: {ds.description}")
    visible = [m.name for m in models if not m.hidden]
    if visible:
        lines.append("Models: " + _csv(visible, "model"))
    return "\n".join(lines)


def model_text(model: d.Model) -> str:
    lines = [f"Model: {model.data_source}.{model.name}"]
    if model.description:
        lines.append(f"Description: {model.description}")
    if model.sql_table:
        lines.append(f"sql_table: {model.sql_table}")
    if model.sql:
        lines.append(f"SQL block: {model.sql}")
    if model.source_queries:
        stages = [s.get("name") for s in model.source_queries if isinstance(s, dict)]
        lines.append("Backing query stages: " + ", ".join(s for s in stages if s))
    if model.default_time_dimension:
        lines.append(f"default_time_dimension: {model.default_time_dimension}")
    if model.filters:
        lines.append("Filters: " + "; ".join(model.filters))
    cols = [c.name for c in model.columns if not c.hidden]
    if cols:
        lines.append("Columns: " + _csv(cols, "column"))
    if model.measures:
        lines.append("Measures: " + _csv([m.name for m in model.measures if m.name], "measure"))
    if model.aggregations:
        lines.append("Aggregations: " + _csv([a.name for a in model.aggregations], "aggregation"))
    if model.joins:
        lines.append("Joins: " + _csv([j.target_model for j in model.joins], "model"))
        for j in model.joins:
            pairs = "; ".join(f"{here}={there}" for here, there in j.key_pairs)
            lines.append(f"Join pairs to {j.target_model}: {pairs}")
    return "\n".join(lines)


# ``json.dumps(values, ensure_ascii=False)``, without building an encoder per call (a warehouse store
# renders 150,000 sampled columns at a cold start)
_SAMPLES = json.JSONEncoder(ensure_ascii=False)


def sample_line(col: d.Column) -> list[str]:
    """The sample-value lines: the structured list as a JSON array (values may hold commas), the
    distinct count when the list is only a part, else the ``sampled`` text (ranges)."""
    if col.sampled_values is not None:
        if not col.sampled_values:
            return []
        out = ["Sample values: " + _SAMPLES.encode(col.sampled_values)]
        if col.distinct_count is not None and col.distinct_count > len(col.sampled_values):
            out.append(f"Distinct count: {col.distinct_count}")
        return out
    if col.sampled:
        return [f"Sample values: {col.sampled}"]
    return []


def column_text(model: d.Model, col: d.Column) -> str:
    lines = [f"Column: {model.data_source}.{model.name}.{col.name}", f"Type: {col.type}"]
    if col.description:
        lines.append(f"Description: {col.description}")
    if col.label:
        lines.append(f"Label: {col.label}")
    if col.format is not None:
        lines.append(f"Format: {col.format.words()}")
    if col.allowed_aggregations:
        lines.append("Allowed aggregations: " + ", ".join(col.allowed_aggregations))
    if col.sql:
        lines.append(f"SQL: {col.sql}")
    if col.filter:
        lines.append(f"Filter: {col.filter}")
    lines.extend(sample_line(col))
    if col.primary_key:
        lines.append("Primary key: yes")
    return "\n".join(lines)


def measure_text(model: d.Model, m: d.Measure) -> str:
    lines = [f"Measure: {model.data_source}.{model.name}.{m.name}", f"Formula: {m.formula}"]
    if m.description:
        lines.append(f"Description: {m.description}")
    if m.label:
        lines.append(f"Label: {m.label}")
    return "\n".join(lines)


def aggregation_text(model: d.Model, a: d.Aggregation) -> str:
    lines = [f"Aggregation: {model.data_source}.{model.name}.{a.name}"]
    if a.formula:
        lines.append(f"Formula: {a.formula}")
    if a.description:
        lines.append(f"Description: {a.description}")
    if a.params:
        lines.append("Params: " + "; ".join(f"{p.name}={p.sql}" for p in a.params))
    return "\n".join(lines)


def memory_text(mem: d.Memory) -> str:
    lines = [mem.learning]
    if mem.description:
        lines.append(mem.description)
    if mem.entities:
        lines.append("Tagged entities: " + ", ".join(mem.entities))
    return "\n".join(lines)


def compact_description(mem: d.Memory) -> str:
    """A memory's preview: its description, else the first paragraph of the learning (500 chars)."""
    if mem.description:
        return mem.description
    para: list[str] = []
    for line in mem.learning.splitlines():
        if line.strip():
            para.append(line)
        elif para:
            break
    return "\n".join(para)[:500]


def render_entity(catalog: Catalog, canonical: str) -> RenderedDoc | None:
    """Render any entity (hidden ones too: callers decide visibility)."""
    ent = catalog.get(canonical)
    if ent is None:
        return None
    obj, model = ent.obj, ent.model
    if ent.kind == "memory":
        assert isinstance(obj, d.Memory)
        return RenderedDoc(canonical, "memory", memory_text(obj), obj.description)
    if ent.kind == "datasource":
        assert isinstance(obj, d.Datasource)
        # the datasource's own models, looked up one by one: ``catalog.models`` is built per snapshot
        # (10,000 models at every edit)
        entity = catalog.entities.get
        models = [
            e.model
            for m in catalog.children(canonical)
            if (e := entity(m)) is not None and e.kind == "model" and e.model is not None
        ]
        return RenderedDoc(canonical, "datasource", datasource_text(obj, models), obj.description)
    assert model is not None
    if ent.kind == "model":
        text = model_text(model)
    elif ent.kind == "column":
        text = column_text(model, obj)  # type: ignore[arg-type]
    elif ent.kind == "measure":
        text = measure_text(model, obj)  # type: ignore[arg-type]
    else:
        text = aggregation_text(model, obj)  # type: ignore[arg-type]
    return RenderedDoc(canonical, ent.kind, text, getattr(obj, "description", None))
