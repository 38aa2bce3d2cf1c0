"""What is embedded for each entity: its description as written, then one plain statement per field.

DataDungeon's finding, adopted here: an embedding of the description followed by short sentences
("Type is INT.", "Label is Order Date.", "Sample values are a, b, c.") searches better than a
key-value dump. The statements come in one fixed order whatever order the fields have in the
stored document, so re-saving a document with its keys shuffled gives the same text, the same
content hash and no re-embedding. Memories are embedded as SLayer embeds them (learning, a blank
line, the description), so their hashes match rows SLayer wrote.

Every statement belongs to a group (``about``, ``type``, ``values``, ``logic``, ``context``);
``statement_groups()`` groups them. These groups are not facets: the facets that are embedded and
ranked on their own, apart from this whole text, are declared in ``texts.facets``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from slayer_lsp.store import documents as d
from slayer_lsp.texts.words import words_of

if TYPE_CHECKING:
    from slayer_lsp.catalog import Catalog

STATEMENT_GROUPS = ("about", "type", "values", "logic", "context")
MAX_LISTED = 40  # names listed in a model's or datasource's statement
MAX_SAMPLES = 20
MAX_SAMPLE_CHARS = 400

Statement = tuple[str, str]  # (group, sentence)


@dataclass(frozen=True, slots=True)
class EmbedItem:
    """One unit of embedding work: the text of an entity under its canonical id.

    ``accept_hashes`` lists other content hashes a stored row may carry and still count as current
    (e.g. the hash of SLayer's own rendering, so a litellm row SLayer wrote is reused, not redone)."""

    canonical_id: str
    kind: str
    text: str
    accept_hashes: tuple[str, ...] = ()


def _sentence(subject: str, value: str, plural: bool = False) -> str:
    value = " ".join(value.split())
    end = "" if value.endswith((".", "!", "?")) else "."
    return f"{subject} {'are' if plural else 'is'} {value}{end}"


def _name(name: str) -> str:
    spoken = words_of(name)
    return _sentence("Name", name if spoken == name else f"{name} ({spoken})")


def _listing(names: Sequence[str]) -> str:
    shown = ", ".join(names[:MAX_LISTED])
    return shown + (f" and {len(names) - MAX_LISTED} more" if len(names) > MAX_LISTED else "")


def _samples(values: Sequence[str]) -> str:
    out: list[str] = []
    size = 0
    for v in values[:MAX_SAMPLES]:
        v = " ".join(str(v).split())
        if size + len(v) > MAX_SAMPLE_CHARS and out:
            break
        out.append(v)
        size += len(v) + 2
    return ", ".join(out)


# --------------------------------------------------------------------------- statements per kind


def column_statements(col: d.Column, model: d.Model | None = None) -> list[Statement]:
    out: list[Statement] = [("about", _name(col.name))]
    if col.label:
        out.append(("about", _sentence("Label", col.label)))
    if model is not None:
        out.append(("context", _sentence("Model", model.name)))
    out.append(("type", _sentence("Type", d.normalise_type(col.type))))
    if col.format is not None:
        out.append(("type", _sentence("Format", col.format.words())))
    if col.primary_key:
        out.append(("type", "It is the primary key."))
    if col.sql and col.sql.strip() != col.name:
        out.append(("logic", _sentence("SQL", col.sql)))
    if col.filter:
        out.append(("logic", _sentence("Filter", col.filter)))
    if col.allowed_aggregations:
        out.append(("logic", _sentence("Allowed aggregations", ", ".join(col.allowed_aggregations), True)))
    if col.sampled_values:
        out.append(("values", _sentence("Sample values", _samples(col.sampled_values), True)))
    return out


def measure_statements(m: d.Measure, model: d.Model | None = None) -> list[Statement]:
    out: list[Statement] = [("about", _name(m.name or ""))] if m.name else []
    if m.label:
        out.append(("about", _sentence("Label", m.label)))
    if model is not None:
        out.append(("context", _sentence("Model", model.name)))
    if m.type:
        out.append(("type", _sentence("Type", d.normalise_type(m.type))))
    if m.formula:
        out.append(("logic", _sentence("Formula", m.formula)))
    return out


def aggregation_statements(a: d.Aggregation, model: d.Model | None = None) -> list[Statement]:
    out: list[Statement] = [("about", _name(a.name))]
    if model is not None:
        out.append(("context", _sentence("Model", model.name)))
    if a.formula:
        out.append(("logic", _sentence("Formula", a.formula)))
    if a.params:
        out.append(("logic", _sentence("Parameters", ", ".join(p.name for p in a.params), True)))
    return out


def model_statements(model: d.Model) -> list[Statement]:
    out: list[Statement] = [("about", _name(model.name))]
    if model.data_source:
        out.append(("context", _sentence("Datasource", model.data_source)))
    if model.sql_table:
        out.append(("logic", _sentence("Table", model.sql_table)))
    columns = [c.name for c in model.columns if not c.hidden]
    if columns:
        out.append(("context", _sentence("Columns", _listing(columns), True)))
    measures = [m.name for m in model.measures if m.name]
    if measures:
        out.append(("context", _sentence("Measures", _listing(measures), True)))
    targets = list(dict.fromkeys(j.target_model for j in model.joins))
    if targets:
        out.append(("context", _sentence("Joined models", _listing(targets), True)))
    return out


def datasource_statements(ds: d.Datasource, models: Sequence[d.Model] = ()) -> list[Statement]:
    out: list[Statement] = [("about", _name(ds.name))]
    if ds.type:
        out.append(("type", _sentence("Type", ds.type)))
    visible = [m.name for m in models if not m.hidden]
    if visible:
        out.append(("context", _sentence("Models", _listing(visible), True)))
    return out


EntityObj = d.Datasource | d.Model | d.Column | d.Measure | d.Aggregation | d.Memory


def statements(
    obj: EntityObj, *, model: d.Model | None = None, models: Sequence[d.Model] = ()
) -> list[Statement]:
    """The statements of a stored object; ``model`` is the owner of a column/measure/aggregation,
    ``models`` those of a datasource. Memories have none (their text is their own)."""
    if isinstance(obj, d.Column):
        return column_statements(obj, model)
    if isinstance(obj, d.Measure):
        return measure_statements(obj, model)
    if isinstance(obj, d.Aggregation):
        return aggregation_statements(obj, model)
    if isinstance(obj, d.Model):
        return model_statements(obj)
    if isinstance(obj, d.Datasource):
        return datasource_statements(obj, models)
    return []


def memory_text(mem: d.Memory) -> str:
    """SLayer's embedding text of a memory: the learning, then a blank line and the description."""
    return f"{mem.learning}\n\n{mem.description}" if mem.description else mem.learning


def _description(obj: EntityObj) -> str:
    return " ".join((getattr(obj, "description", None) or "").split())


def entity_text(obj: EntityObj, *, model: d.Model | None = None, models: Sequence[d.Model] = ()) -> str:
    """The text embedded for one stored object: description as written, then its statements."""
    if isinstance(obj, d.Memory):
        return memory_text(obj)
    parts = [_description(obj)] + [s for _, s in statements(obj, model=model, models=models)]
    return " ".join(p for p in parts if p)


def statement_groups(
    obj: EntityObj, *, model: d.Model | None = None, models: Sequence[d.Model] = ()
) -> dict[str, str]:
    """The entity's statements joined per group (the description opens ``about``); empty groups are
    left out. A memory is one group, ``about``."""
    if isinstance(obj, d.Memory):
        return {"about": memory_text(obj)}
    groups: dict[str, list[str]] = {g: [] for g in STATEMENT_GROUPS}
    desc = _description(obj)
    if desc:
        groups["about"].append(desc)
    for group, sentence in statements(obj, model=model, models=models):
        groups[group].append(sentence)
    return {g: " ".join(v) for g, v in groups.items() if v}


# --------------------------------------------------------------------------- from a catalog


def item_for(catalog: Catalog, canonical_id: str) -> EmbedItem | None:
    """The work item of one entity of a catalog (``None`` for unknown or hidden ids: SLayer embeds
    only what search may return)."""
    ent = catalog.get(canonical_id)
    if ent is None or ent.hidden:
        return None
    if ent.kind == "datasource":
        models = [catalog.models[m] for m in catalog.children(canonical_id) if m in catalog.models]
        return EmbedItem(canonical_id, "datasource", entity_text(ent.obj, models=models))
    return EmbedItem(canonical_id, ent.kind, entity_text(ent.obj, model=ent.model))


class CatalogItems:
    """Work items for every visible entity and memory of a catalog: datasources, then each visible
    model with its visible leaves, then memories in storage order. Texts are rendered while
    iterating, so a paged backfill holds one page of them at a time; ``len()`` is exact."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.ids = catalog.searchable_ids()

    def __len__(self) -> int:
        return len(self.ids)

    def __iter__(self) -> Iterator[EmbedItem]:
        for cid in self.ids:
            item = item_for(self.catalog, cid)
            if item is not None:
                yield item
