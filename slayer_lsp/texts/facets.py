"""Facets: the parts of an entity that are embedded and ranked on their own.

A kind declares a few facets, each a short text made of some of its fields, so that a search can
rank one part of an entity without the rest diluting it: a column's *meaning* (what its name, label
and description say) apart from its *values* (what its samples look like). Every kind has
``meaning``; the other facets are the part of each kind that answers a different question.

Each text is short and specific: plain words, no field names or boilerplate shared by every entity
(which would make unrelated texts look alike to an embedding model and to BM25), names split into
words (``CustomerID`` -> ``customer id``). An entity with no text for a facet does not have that
facet: a column without samples has no ``values``. Texts are a pure function of the stored object,
so an unchanged document gives the same texts, the same hashes and no re-embedding.

This is the one place facets are declared; the embedding worker and the facet rankings
(``search.facet_ranking``) both read ``FACETS`` and ``facet_texts``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from slayer_lsp.catalog.ids import is_memory_ref, split_canonical
from slayer_lsp.store import documents as d
from slayer_lsp.texts.statements import memory_text
from slayer_lsp.texts.words import words_of

MAX_SAMPLES = 20
MAX_SAMPLE_CHARS = 300
MAX_COLUMNS = 60
MAX_TAGS = 30

# kind -> its facets, in the order they are listed to users
FACETS: dict[str, tuple[str, ...]] = {
    "datasource": ("meaning",),
    "model": ("meaning", "columns"),
    "column": ("meaning", "values"),
    "measure": ("meaning", "formula"),
    "aggregation": ("meaning", "formula"),
    "memory": ("meaning", "entities"),
}

# facet -> what its text holds (for the protocol spec, the CLI's help and error messages)
FACET_HELP: dict[str, str] = {
    "meaning": "what the entity is: its name as words, label and description (a memory: its learning "
    "and description)",
    "values": "a column's sample values, after its type",
    "columns": "a model's visible columns, as words with their labels",
    "formula": "a measure's or aggregation's formula (and an aggregation's parameters)",
    "entities": "the entities a memory is tagged with, as words",
}


def facet_names() -> list[str]:
    """Every facet some kind declares, in first-declared order."""
    return list(dict.fromkeys(f for facets in FACETS.values() for f in facets))


def kinds_with(facet: str) -> list[str]:
    """The kinds that declare ``facet`` (in ``FACETS`` order)."""
    return [kind for kind, facets in FACETS.items() if facet in facets]


def _clean(text: str | None) -> str:
    return " ".join((text or "").split())


def _join(parts: Iterable[str | None]) -> str:
    """Non-empty parts joined by ". ", each kept once (case-insensitively): a label that repeats
    the name's words adds nothing."""
    seen: set[str] = set()
    out: list[str] = []
    for part in parts:
        text = _clean(part).rstrip(".")
        key = text.lower()
        if text and key not in seen:
            seen.add(key)
            out.append(text)
    return ". ".join(out)


def _samples(values: Sequence[object]) -> str:
    out: list[str] = []
    size = 0
    for value in values[:MAX_SAMPLES]:
        text = _clean(str(value))
        if not text:
            continue
        if out and size + len(text) > MAX_SAMPLE_CHARS:
            break
        out.append(text)
        size += len(text) + 2
    return ", ".join(out)


def _listing(names: Sequence[str], limit: int) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


# --------------------------------------------------------------------------- per kind


def column_facets(col: d.Column) -> dict[str, str]:
    out = {"meaning": _join([words_of(col.name), col.label, col.description])}
    samples = _samples(col.sampled_values) if col.sampled_values else _clean(col.sampled)
    if samples:
        out["values"] = f"{d.normalise_type(col.type).lower()} values: {samples}"
    return out


def model_facets(model: d.Model) -> dict[str, str]:
    out = {"meaning": _join([words_of(model.name), model.description])}
    cols = []
    for col in model.columns:
        if col.hidden:
            continue
        spoken = words_of(col.name)
        label = _clean(col.label)
        cols.append(f"{spoken} ({label})" if label and label.lower() != spoken else spoken)
    if cols:
        out["columns"] = _listing(cols, MAX_COLUMNS)
    return out


def measure_facets(m: d.Measure) -> dict[str, str]:
    out = {"meaning": _join([words_of(m.name or ""), m.label, m.description])}
    if _clean(m.formula):
        out["formula"] = _clean(m.formula)
    return out


def aggregation_facets(a: d.Aggregation) -> dict[str, str]:
    out = {"meaning": _join([words_of(a.name), a.description])}
    formula = _clean(a.formula)
    params = [p.name for p in a.params if p.name]
    if formula:
        out["formula"] = formula + (f"; parameters {', '.join(params)}" if params else "")
    return out


def datasource_facets(ds: d.Datasource) -> dict[str, str]:
    return {"meaning": _join([words_of(ds.name), ds.description])}


def memory_facets(mem: d.Memory) -> dict[str, str]:
    # SLayer's embedding text of a memory: the main vector of the memory can be reused for it
    out = {"meaning": memory_text(mem).strip()}
    tags = []
    for tag in mem.entities:
        if is_memory_ref(tag):
            continue
        ds, model, leaf = split_canonical(tag)  # named below its datasource, unless it is one
        tags.append(words_of(ds if model is None else " ".join(p for p in (model, leaf) if p is not None)))
    tags = list(dict.fromkeys(t for t in tags if t))
    if tags:
        out["entities"] = _listing(tags, MAX_TAGS)
    return out


_BY_TYPE: dict[type, Callable[[object], dict[str, str]]] = {
    d.Column: column_facets,  # type: ignore[dict-item]
    d.Model: model_facets,  # type: ignore[dict-item]
    d.Measure: measure_facets,  # type: ignore[dict-item]
    d.Aggregation: aggregation_facets,  # type: ignore[dict-item]
    d.Datasource: datasource_facets,  # type: ignore[dict-item]
    d.Memory: memory_facets,  # type: ignore[dict-item]
}


def facet_texts(obj: object) -> dict[str, str]:
    """The facets a stored object has, facet -> text (facets with no text are left out)."""
    make = _BY_TYPE.get(type(obj))
    if make is None:
        return {}
    return {facet: text for facet, text in make(obj).items() if text}
