"""Rename a datasource, model, column, measure or aggregation everywhere it is named, as one plan.

The plan is plain data (text edits per file, file renames); the language server turns it into one
``WorkspaceEdit``. It covers the workspace's query and memory files (each reference, only the path
segment that names the entity: ``stores.name`` -> ``shops.name``), the store's memory files (their
canonical tags and example queries), and the store's model files of the datasource: the declaration,
measure formulas, filters, ``default_time_dimension``, join targets and join keys. A model's file and a
datasource's file and folder are renamed with it, since SLayer finds them by name.

In a SQLite store the declarations and memories are rows, not files: the plan's text edits cover the
workspace's files only, and ``store`` holds the rows to rewrite (the datasource's model rows, the memory
rows that name the entity), each computed by the same document edits on the row rendered as text (a
model row as indented JSON, a memory row as its memory file) and stored back in SLayer's form. They are
written later, in one transaction, by the writer (``writer.renames.rename_rows``). A datasource of a SQLite
store is not renamed: its name keys every model row, its connection row and the priority setting.

A rename that cannot be done whole is refused before anything is planned (``RenameError``): an invalid
identifier, a name already taken, a store file or row that cannot be read or is not in SLayer's form,
a SQLite datasource, or a reference whose text cannot be located.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from slayer_lsp.analysis import parsed_file as dm
from slayer_lsp.analysis.binding import Binding, ModelContext, bind_all, resolve, stage_source
from slayer_lsp.analysis.impact import IMPACT_KINDS, ImpactError, check_entity
from slayer_lsp.analysis.navigation import FILES
from slayer_lsp.analysis.workspace import WorkspaceDoc
from slayer_lsp.catalog import Catalog
from slayer_lsp.catalog.ids import (
    datasource_of,
    is_descendant_or_self,
    is_memory_ref,
    lineage,
    memory_ref,
    name_of,
    split_canonical,
    with_name,
)
from slayer_lsp.query import formulas
from slayer_lsp.store.safefs import read_text_file
from slayer_lsp.writer.errors import MemoryWriteError
from slayer_lsp.writer.memories import memory_markdown
from slayer_lsp.writer.renames import RowRewrite, read_rename_rows

IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MAX_NAME = 255


class RenameError(ValueError):
    """A rename that is refused as a whole; the message says why."""


@dataclass(frozen=True, slots=True)
class EditData:
    span: dm.Span
    new_text: str


@dataclass(frozen=True, slots=True)
class FileEdits:
    key: str  # an open document's URI, or a file path
    edits: tuple[EditData, ...]


@dataclass(frozen=True, slots=True)
class FileRename:
    old: str  # paths
    new: str


@dataclass(frozen=True)
class StoreRename:
    """The rows of a SQLite store a rename rewrites (all in one transaction, or none)."""

    db: str
    rows: tuple[RowRewrite, ...]

    @property
    def models(self) -> int:
        return sum(r.table == "models" for r in self.rows)

    @property
    def memories(self) -> int:
        return sum(r.table == "memories" for r in self.rows)


@dataclass(frozen=True)
class RenamePlan:
    entity: str
    new_entity: str
    files: tuple[FileEdits, ...]
    renames: tuple[FileRename, ...]
    store: StoreRename | None = None

    @property
    def edit_count(self) -> int:
        return sum(len(f.edits) for f in self.files)


@dataclass(frozen=True, slots=True)
class RenameTarget:
    """What a rename at a position would rename: the entity, and the span of its name there."""

    entity: str
    kind: str
    span: dm.Span
    name: str


ReadDoc = Callable[[str, str], "dm.ParsedDocument | None"]  # (path, kind) -> parse (open text first)
ReadText = Callable[[str], "str | None"]  # path -> its text (open text first), before any parse


def _default_read(path: str, kind: str) -> dm.ParsedDocument | None:
    return FILES.parsed(path, kind)


def store_file_text(path: str) -> str | None:
    """Read past the parse cache: a rename peeks at every model file of a datasource, and keeping
    their texts would evict the few parses it needs."""
    return read_text_file(path)


def check_new_name(catalog: Catalog, entity: str, kind: str, new_name: str) -> None:
    """Refuse a name SLayer would not load, or one already taken where the entity lives."""
    if not isinstance(new_name, str) or not IDENTIFIER.match(new_name) or len(new_name) > MAX_NAME:
        raise RenameError(
            f"'{new_name}' is not a valid name: use letters, digits and underscores, "
            f"not starting with a digit"
        )
    if new_name.lower() in dm.KEYWORDS:
        raise RenameError(f"'{new_name}' is a keyword of SLayer's formulas")
    if new_name == name_of(entity):
        raise RenameError(f"'{entity}' is already called '{new_name}'")
    if (
        kind == "aggregation"
        and formulas.normalize_aggregation_name(new_name) in formulas.BUILTIN_AGGREGATIONS
    ):
        raise RenameError(f"'{new_name}' is a built-in aggregation")
    target = with_name(entity, new_name)
    if kind == "datasource":
        clash = new_name in catalog.datasources
    else:
        clash = target in catalog
    if clash:
        other = catalog.kind_of(target) or "datasource"
        raise RenameError(f"cannot rename '{entity}' to '{new_name}': {other} '{target}' already exists")


def _segment_spans(ref: dm.Reference) -> list[dm.Span | None]:
    """Where each dotted segment of a reference is written (None when it is not verbatim)."""
    segs = ref.text.split(".")
    span = ref.span
    if span.end - span.start == len(ref.text):
        out: list[dm.Span | None] = []
        col = span.start
        for s in segs:
            out.append(dm.Span(span.line, col, col + len(s)))
            col += len(s) + 1
        return out
    if ref.prefix_span is not None and len(segs) == 2:
        return [ref.prefix_span, span]
    if len(segs) == 1:
        return [span]
    last = segs[-1]
    tail = dm.Span(span.line, span.end - len(last), span.end) if span.end - span.start == len(last) else None
    return [None] * (len(segs) - 1) + [tail]


def _names_entity(
    b: Binding, i: int, segs: list[str], catalog: Catalog, source: ModelContext | None, entity: str
) -> bool:
    if i == len(segs) - 1:
        return b.canonical == entity
    canonical, _, _, _ = resolve(".".join(segs[: i + 1]), catalog, source)
    return canonical == entity


def _source(
    doc: dm.ParsedDocument, ref: dm.Reference, catalog: Catalog, cache: dict[int, ModelContext | None]
) -> ModelContext | None:
    if ref.role == dm.MODEL_FORMULA:
        return doc.model_id
    if ref.stage is None or ref.stage >= len(doc.stages):
        return None
    if ref.stage not in cache:
        cache[ref.stage] = stage_source(doc.stages[ref.stage], catalog)[0]
    return cache[ref.stage]


def _ref_edits(
    doc: dm.ParsedDocument,
    b: Binding,
    catalog: Catalog,
    entity: str,
    new_entity: str,
    where: str,
    sources: dict,
) -> list[EditData]:
    ref = b.ref
    old, new = name_of(entity), name_of(new_entity)
    if ref.role == dm.ENTITY_TAG:
        if is_descendant_or_self(ref.text, entity):
            return [EditData(ref.span, new_entity + ref.text[len(entity) :])]  # the same path below it
        return []
    if ref.role in (dm.DEFINITION, dm.JOIN_TARGET, dm.JOIN_KEY, dm.FUNCTION):
        return [EditData(ref.span, new)] if b.canonical == entity and ref.text.strip() == old else []
    if old not in ref.text:
        return []
    segs = ref.text.split(".")
    if old not in segs:
        return []
    source = _source(doc, ref, catalog, sources)
    spans = _segment_spans(ref)
    out = []
    for i, seg in enumerate(segs):
        if seg != old or not _names_entity(b, i, segs, catalog, source, entity):
            continue
        if spans[i] is None:
            raise RenameError(
                f"cannot rename '{entity}': the reference '{ref.text}' in {where} (line "
                f"{ref.span.line + 1}) is not written verbatim; edit it by hand first"
            )
        out.append(EditData(spans[i], new))  # type: ignore[arg-type]
    return out


def _word(name: str) -> re.Pattern[str]:
    return re.compile(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])")


def may_name(text: str, entity: str) -> bool:
    """Whether a document's text can hold a reference to ``entity`` at all: its name as a whole
    word, and for a leaf (column, measure, aggregation) its model's name too — a reference names
    the model (source_model, a dotted path, a tag), and the model's own file declares it
    (``name:``). A cheap test that spares binding the many documents that cannot need an edit."""
    _, model, leaf = split_canonical(entity)
    if not _word(name_of(entity)).search(text):
        return False
    return leaf is None or model is None or _word(model).search(text) is not None


def document_edits(
    doc: dm.ParsedDocument, catalog: Catalog, entity: str, new_entity: str, where: str
) -> list[EditData]:
    """The edits one document needs (any kind: query, memory, model, datasource). Every edit
    replaces the entity's name where it is written verbatim, so a document whose text does not
    hold the name needs none and is not bound at all (most of a large workspace)."""
    if not may_name(doc.text, entity):
        return []
    out: list[EditData] = []
    sources: dict = {}
    for b in bind_all(doc, catalog):
        if b.ref.role == dm.ENTITY_TAG and is_descendant_or_self(b.ref.text, entity):
            out.extend(_ref_edits(doc, b, catalog, entity, new_entity, where, sources))
            continue
        if b.canonical is None:
            continue
        if not is_descendant_or_self(b.canonical, entity) and name_of(entity) not in b.ref.text:
            continue
        out.extend(_ref_edits(doc, b, catalog, entity, new_entity, where, sources))
    uniq = {(e.span, e.new_text): e for e in out}
    return sorted(uniq.values(), key=lambda e: (e.span.line, e.span.start))


_DS_LINE = re.compile(r"^(data_source:\s*)(['\"]?)([^'\"\s#]+)\2\s*(?:#.*)?$")
_LIST_LINE = re.compile(r"^(\s*-\s*)(['\"]?)([^'\"\s#]+)\2\s*(?:#.*)?$")


def _line_edits(text: str, pattern: re.Pattern[str], old: str, new: str) -> list[EditData]:
    out = []
    for i, line in enumerate(text.split("\n")):
        m = pattern.match(line)
        if m and m.group(3) == old:
            out.append(EditData(dm.Span(i, m.start(3), m.end(3)), new))
    return out


def target_at(doc: dm.ParsedDocument, line: int, col: int, catalog: Catalog) -> RenameTarget:
    """The entity a rename at this position renames (the segment under the cursor), or ``RenameError``."""
    ref = doc.ref_at(line, col) or next(
        (r for r in doc.refs if r.prefix_span is not None and r.prefix_span.contains(line, col)), None
    )
    if ref is None:
        raise RenameError(
            "nothing to rename here: put the cursor on a datasource, model, column, measure "
            "or aggregation name"
        )
    b = next((x for x in bind_all(doc, catalog) if x.ref is ref), None)
    if ref.role == dm.ENTITY_TAG:
        if is_memory_ref(ref.text) or ref.text not in catalog:
            raise RenameError(f"'{ref.text}' is not an entity of the store")
        ids = lineage(ref.text)  # the segment under the cursor names the id up to it
        k, col_at = 0, ref.span.start
        for i, c in enumerate(ids):
            if col_at <= col <= col_at + len(name_of(c)):
                k = i
                break
            col_at += len(name_of(c)) + 1
        entity = ids[k]
        return _target(catalog, entity, dm.Span(ref.span.line, col_at, col_at + len(name_of(entity))))
    if b is None or b.canonical is None:
        raise RenameError(f"'{ref.text}' does not resolve in the store: nothing to rename")
    if ref.role in (dm.DEFINITION, dm.JOIN_TARGET, dm.JOIN_KEY, dm.FUNCTION):
        return _target(catalog, b.canonical, ref.span)
    segs = ref.text.split(".")
    spans = _segment_spans(ref)
    source = _source(doc, ref, catalog, {})
    for i, sp in enumerate(spans):
        if sp is None or not (sp.line == line and sp.start <= col <= sp.end):
            continue
        if i == len(segs) - 1:
            return _target(catalog, b.canonical, sp)
        canonical, _, _, _ = resolve(".".join(segs[: i + 1]), catalog, source)
        if canonical is None or name_of(canonical) != segs[i]:
            raise RenameError(
                f"'{segs[i]}' is a join name here, not an entity name: rename it in the model file"
            )
        return _target(catalog, canonical, sp)
    raise RenameError(f"cannot locate the name under the cursor in '{ref.text}'")


def _target(catalog: Catalog, entity: str, span: dm.Span) -> RenameTarget:
    try:
        kind = check_entity(catalog, entity)
    except ImpactError as exc:
        raise RenameError(str(exc)) from exc
    return RenameTarget(entity, kind, span, name_of(entity))


def plan_rename(
    catalog: Catalog,
    entity: str,
    new_name: str,
    docs: Sequence[WorkspaceDoc] = (),
    read: ReadDoc = _default_read,
    text_of: ReadText = store_file_text,
) -> RenamePlan:
    """Every edit the rename needs, or ``RenameError`` (nothing is planned half)."""
    try:
        kind = check_entity(catalog, entity)
    except ImpactError as exc:
        raise RenameError(str(exc)) from exc
    assert kind in IMPACT_KINDS
    check_new_name(catalog, entity, kind, new_name)
    new_entity = with_name(entity, new_name)
    if catalog.location.backend != "yaml":
        return _plan_sqlite(catalog, entity, kind, new_entity, docs)
    store = Path(catalog.location.path)
    files: dict[str, list[EditData]] = {}

    def add(key: str, edits: Iterable[EditData]) -> None:
        edits = list(edits)
        if edits:
            files.setdefault(key, []).extend(edits)

    for wd in docs:
        add(wd.key, document_edits(wd.doc, catalog, entity, new_entity, wd.key))
    ds = datasource_of(entity)
    # the store's model files of the datasource (joins and formulas reach only within it)
    for mid in catalog.children(ds):
        ent = catalog.get(mid)
        if ent is None or ent.kind != "model":
            continue
        path = ent.source.path
        text = text_of(path)
        if text is not None and not may_name(text, entity) and kind != "datasource":
            continue  # cannot name it: not parsed at all (a datasource's every model file names it)
        doc = read(path, "model")
        if doc is None:
            raise RenameError(f"cannot rename '{entity}': the model file {path} cannot be read")
        add(path, document_edits(doc, catalog, entity, new_entity, path))
        if kind == "datasource":
            add(path, _line_edits(doc.text, _DS_LINE, ds, new_name))
    for mid in catalog.memory_order:
        ent = catalog.get(memory_ref(mid))
        mem = catalog.memory(mid)
        if ent is None or mem is None:
            continue
        if not any(is_descendant_or_self(t, entity) for t in mem.entities) and mem.query is None:
            continue
        text = text_of(ent.source.path)
        if text is not None and not may_name(text, entity):
            continue
        doc = read(ent.source.path, "memory")
        if doc is None:
            raise RenameError(f"cannot rename '{entity}': the memory file {ent.source.path} cannot be read")
        add(ent.source.path, document_edits(doc, catalog, entity, new_entity, ent.source.path))
    renames: list[FileRename] = []
    if kind == "datasource":
        ds_ent = catalog.get(entity)
        if ds_ent is not None:
            path = ds_ent.source.path
            doc = read(path, "datasource")
            if doc is None:
                raise RenameError(f"cannot rename '{entity}': {path} cannot be read")
            add(path, document_edits(doc, catalog, entity, new_entity, path))
            renames.append(FileRename(path, _sibling(path, new_name, store, "datasources")))
        priority = store / "priority.yaml"
        if priority.is_file():
            pdoc = read(str(priority), "other")
            if pdoc is not None:
                add(str(priority), _line_edits(pdoc.text, _LIST_LINE, ds, new_name))
        folder = store / "models" / ds
        if folder.is_dir():
            dst = store / "models" / new_name
            if dst.exists():
                raise RenameError(f"cannot rename '{entity}': {dst} already exists")
            renames.append(FileRename(str(folder), str(dst)))
    elif kind == "model":
        path = catalog.get(entity).source.path  # type: ignore[union-attr]
        renames.append(FileRename(path, _sibling(path, new_name, store, "models")))
    out = tuple(FileEdits(k, tuple(_no_overlap(k, v))) for k, v in files.items())
    return RenamePlan(entity, new_entity, out, tuple(renames))


def _plan_sqlite(
    catalog: Catalog, entity: str, kind: str, new_entity: str, docs: Sequence[WorkspaceDoc]
) -> RenamePlan:
    if kind == "datasource":
        raise RenameError(
            f"cannot rename datasource '{entity}' of a SQLite store: its name keys every model "
            f"row, its connection and the priority setting; rename it with SLayer"
        )
    db = str(catalog.location.path)
    files = tuple(
        FileEdits(wd.key, tuple(_no_overlap(wd.key, e)))
        for wd in docs
        if (e := document_edits(wd.doc, catalog, entity, new_entity, wd.key))
    )
    ds = datasource_of(entity)
    try:
        models, memories = read_rename_rows(db, ds)
    except MemoryWriteError as exc:
        raise RenameError(f"cannot rename '{entity}': {exc}") from exc
    rows: list[RowRewrite] = []
    for row_ds, name, data in models:
        where = f"{db} [models {row_ds}.{name}]"
        value = _slayer_json(data, where)
        text = json.dumps(value, indent=1)
        edits = _no_overlap(
            where, document_edits(dm.parse_document(text, "model", db), catalog, entity, new_entity, where)
        )
        if not edits:
            continue
        new_value = _reloaded(apply_edits(text, edits), where)
        new_name = new_value.get("name") if isinstance(new_value, dict) else None
        if not isinstance(new_name, str) or (
            new_name != name and not (kind == "model" and entity == f"{row_ds}.{name}")
        ):
            raise RenameError(f"cannot rename '{entity}': the rewrite of {where} would change its name")
        rows.append(RowRewrite("models", (row_ds, name), data, json.dumps(new_value), (row_ds, new_name)))
    for memory_id, data in memories:
        where = f"{db} [memories {memory_id!r}]"
        value = _slayer_json(data, where)
        if not isinstance(value, dict):
            continue  # not a memory SLayer loads: the catalog does not see it either
        tags, query = value.get("entities"), value.get("query")
        if not isinstance(tags, list) or not isinstance(value.get("learning"), str):
            continue  # not a memory SLayer loads: the catalog does not see it either
        if not any(isinstance(t, str) and is_descendant_or_self(t, entity) for t in tags) and query is None:
            continue
        text = memory_markdown(value)
        edits = _no_overlap(
            where, document_edits(dm.parse_document(text, "memory", db), catalog, entity, new_entity, where)
        )
        if not edits:
            continue
        front = _front_matter(apply_edits(text, edits), where)
        new_tags = front.get("entities") or []
        new_value = {**value, "entities": new_tags, "query": _in_order(query, front.get("query"), where)}
        rows.append(
            RowRewrite(
                "memories",
                (memory_id,),
                data,
                json.dumps(new_value),
                (memory_id,),
                tuple(dict.fromkeys(new_tags)),
            )
        )
    return RenamePlan(entity, new_entity, files, (), StoreRename(db, tuple(rows)))


def _slayer_json(data: str, where: str) -> object:
    """A row's JSON, refused unless it is exactly what SLayer's ``json.dumps`` wrote (so the rewrite,
    dumped the same way, changes nothing but the names)."""
    try:
        value = json.loads(data)
    except ValueError:
        raise RenameError(f"cannot rename: {where} is not valid JSON; fix it with SLayer first") from None
    if json.dumps(value) != data:
        raise RenameError(
            f"cannot rename: {where} is not in the form SLayer writes; re-save it with SLayer first"
        )
    return value


def _in_order(old: object, new: object, where: str) -> object:
    """``new`` (read back from YAML, keys sorted) in ``old``'s key order, as SLayer dumped it; the two
    differ only in strings, so any other difference refuses the rename."""
    if isinstance(old, dict) and isinstance(new, dict) and old.keys() == new.keys():
        return {k: _in_order(old[k], new[k], where) for k in old}
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [_in_order(a, b, where) for a, b in zip(old, new, strict=True)]
    if type(old) is type(new) and (isinstance(old, str) or old == new):
        return new
    raise RenameError(
        f"cannot rename: the rewrite of {where} does not read back as it was stored; nothing was planned"
    )


def _reloaded(text: str, where: str) -> object:
    try:
        return json.loads(text)
    except ValueError:
        raise RenameError(
            f"cannot rename: the rewrite of {where} is not valid JSON (a name inside an escaped "
            f"string?); nothing was planned"
        ) from None


def _front_matter(text: str, where: str) -> dict:
    head, sep, _ = text.partition("\n---\n")
    try:
        front = yaml.safe_load(head[4:]) if text.startswith("---\n") and sep else None
    except yaml.YAMLError:
        front = None
    if not isinstance(front, dict):
        raise RenameError(f"cannot rename: the rewrite of {where} cannot be read back; nothing was planned")
    return front


def _sibling(path: str, new_name: str, store: Path, what: str) -> str:
    p = Path(path)
    dst = p.with_name(new_name + p.suffix)
    if dst.exists():
        raise RenameError(f"cannot rename: {dst} already exists in the store's {what}")
    return str(dst)


def _no_overlap(key: str, edits: list[EditData]) -> list[EditData]:
    uniq = sorted(
        {(e.span, e.new_text): e for e in edits}.values(), key=lambda e: (e.span.line, e.span.start)
    )
    for a, b in zip(uniq, uniq[1:], strict=False):
        if a.span.line == b.span.line and b.span.start < a.span.end:
            raise RenameError(f"cannot rename: two edits overlap in {key} at line {a.span.line + 1}")
    return uniq


def apply_edits(text: str, edits: Iterable[EditData]) -> str:
    """A file's text with the edits applied (code-point columns); for tests and the CLI."""
    lines = text.split("\n")
    for e in sorted(edits, key=lambda e: (e.span.line, e.span.start), reverse=True):
        line = lines[e.span.line]
        lines[e.span.line] = line[: e.span.start] + e.new_text + line[e.span.end :]
    return "\n".join(lines)


def is_inside(path: str, root: str | Path) -> bool:
    root = os.path.abspath(root)
    return os.path.abspath(path).startswith(root + os.sep)
