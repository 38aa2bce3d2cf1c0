"""Saving and forgetting memories in a SLayer store, exactly as motley-slayer 1.4.1 does.

This is the only module of slayer-lsp that writes to a store. What it writes is what SLayer itself
writes for the same inputs, byte for byte, so SLayer (and our own reader) cannot tell the difference,
and concurrent SLayer processes never lose or duplicate a memory:

* YAML store: ``memories/<id>.md`` is ``---\\n`` + ``yaml.safe_dump(front, sort_keys=True,
  default_flow_style=False, allow_unicode=True)`` + ``---\\n`` + the learning verbatim, written through
  a same-directory temp file ``.<name>.tmp.XXXXXXXX`` that is fsynced and ``os.replace``d (mode 0600
  for a new file; an existing file keeps its mode). Every read-allocate-write holds the exclusive
  ``flock`` on ``<store>/memories.lock`` that SLayer's writers take.
* SQLite store: one ``BEGIN IMMEDIATE`` transaction writes the ``memories`` row (``json.dumps`` of the
  whole memory, fields in SLayer's declaration order) and its ``memory_entities`` rows.

References are resolved strictly against the catalog (``resolve_entity`` /
``extract_entities_from_query``); ids, upsert timestamps and ``memory:<id>`` targets are re-read from
the store under the lock, because the catalog may be stale. A query is stored the way SLayer's
``SlayerQuery.model_dump(mode="json")`` stores it; an input whose normal form we cannot reproduce
faithfully (inline models, model extensions, older query versions) is refused rather than written.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import math
import os
import re
import secrets
import sqlite3
import tempfile
import time
import unicodedata
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta, timezone
from pathlib import Path
from typing import Any, BinaryIO

import yaml

from slayer_lsp.analysis import formulas
from slayer_lsp.analysis.query_refs import (
    auto_name,
    extract_entities_from_query,
    may_name_datasource_granularity,
    order_formula_candidate,
)
from slayer_lsp.analysis.resolver import EntityResolutionError, check_memory_id, resolve_entity
from slayer_lsp.catalog import Catalog
from slayer_lsp.catalog.ids import MEMORY_PREFIX
from slayer_lsp.store.documents import MAX_LEARNING_CHARS
from slayer_lsp.store.locate import StoreLocation
from slayer_lsp.store.safefs import Refused, read_file

__all__ = [
    "DESCRIPTION_MAX_CHARS", "MAX_LEARNING_CHARS", "MemoryWriteError", "SavedMemory", "forget_memory",
    "format_created_at", "memory_id_key", "memory_json", "memory_markdown", "normalize_memory_id",
    "normalize_query", "read_rename_rows", "rename_rows", "save_memory", "scoped_id_refusal",
]

log = logging.getLogger(__name__)

MEMORY_VERSION = 4
QUERY_VERSION = 6
DESCRIPTION_MAX_CHARS = 500
LOCK_TIMEOUT = 30.0
_FENCE = "---\n"
SCOPED_ID_PREFIX = "m-"  # a scoped session's new memory: "m-" + 16 random hex digits (see save_memory)


class MemoryWriteError(ValueError):
    """A memory could not be saved or forgotten. Nothing was written, unless the message says a forget
    deleted the memory and then failed on its clean-up. ``reference`` names the entity reference
    that failed to resolve, when that is the reason."""

    def __init__(self, message: str, *, reference: str | None = None) -> None:
        super().__init__(message)
        self.reference = reference


@dataclass(frozen=True, slots=True)
class SavedMemory:
    """The outcome of a save: the memory's id, its canonical entities, whether it is new (``created``;
    ``False`` for an upsert of an existing id), resolver warnings, and its stored ``created_at``."""

    id: str
    entities: tuple[str, ...]
    created: bool
    warnings: tuple[str, ...]
    created_at: str


# ============================================================================== public operations


def save_memory(location: StoreLocation, catalog: Catalog, *, learning: str, entities: list[str] | None = None,
                query: Mapping[str, Any] | None = None, id: str | int | None = None,
                description: str | None = None, lock_timeout: float = LOCK_TIMEOUT,
                reachable: Collection[str] | None = None) -> SavedMemory:
    """Save (or upsert, when ``id`` exists) one memory the way SLayer's ``save_memory`` does.

    Give either ``entities`` (each resolved strictly) or ``query`` (its entities are extracted and the
    query is stored normalised). ``id=None`` allocates ``max(int-shaped id) + 1`` from the store.
    Raises ``MemoryWriteError`` for bad input, unresolvable references and I/O failures.

    ``reachable``: the memory ids a scoped session reaches (None: no scope). Such a writer must not
    learn or touch what it cannot reach, so its id space is its own: an explicit ``id`` must be one
    of ``reachable`` (any other, free or taken by a hidden memory in any spelling, gets the one
    ``scoped_id_refusal``), and a new memory gets a random ``m-<16 hex>`` id, drawn again while it
    collides with anything in the store, so the answer depends on nothing hidden."""
    if not isinstance(learning, str) or not learning.strip():
        raise MemoryWriteError("learning text must be a non-empty string.")
    if len(learning) > MAX_LEARNING_CHARS:
        raise MemoryWriteError(f"learning must be at most {MAX_LEARNING_CHARS} characters; got {len(learning)}. "
                               f"Save a summary, or split it into several memories.")
    memory_id = normalize_memory_id(id) if id is not None else None
    if reachable is not None and memory_id is not None and memory_id not in reachable:
        raise MemoryWriteError(scoped_id_refusal(id))
    description = _normalize_description(description)
    notes: list[str] = []
    if location.backend == "yaml":  # stored as SLayer reads it back, so every reader agrees
        learning, description = _as_read_back(learning, description, notes)
    canonicals, warnings, stored_query = _link(catalog, entities, query)
    warnings = (*warnings, *notes)
    if location.backend == "sqlite":
        return _save_sqlite(location.path, memory_id, learning, description, canonicals, stored_query,
                            warnings, lock_timeout, reachable)
    return _save_yaml(location.path, memory_id, learning, description, canonicals, stored_query, warnings,
                      lock_timeout, reachable)


def scoped_id_refusal(memory_id: Any) -> str:
    """The one answer of a scoped writer to an ``id`` it does not reach: the same whether the id is
    free or a hidden memory's (in any case or Unicode spelling), so it tells nothing."""
    return (f"memory id {str(memory_id)!r} is not a memory this session can update: with a scope, 'id' names one "
            f"of the session's own memories; leave it out to save a new memory (it gets a fresh id).")


def forget_memory(location: StoreLocation, catalog: Catalog | None, id: str | int,
                  *, lock_timeout: float = LOCK_TIMEOUT, reachable: Collection[str] | None = None) -> bool:
    """Delete memory ``id`` like SLayer's ``forget_memory``: the memory itself, its embedding rows
    (exactly ``memory:<id>``, never a prefix) and ``memory:<id>`` tags on every other memory.

    Returns ``False`` when the store has no such memory (nothing is touched). ``catalog`` is not
    consulted: which memories carry the tag is read from the store under the lock. ``reachable``
    (a scoped session's memory ids): any other id answers ``False`` untouched, like a missing one,
    whether it is hidden, fails to load, or does not exist."""
    del catalog  # the snapshot may be stale; the store is the truth here
    memory_id = normalize_memory_id(id)
    if reachable is not None and memory_id not in reachable:
        return False
    if location.backend == "sqlite":
        return _forget_sqlite(location.path, memory_id, lock_timeout)
    return _forget_yaml(location.path, memory_id, lock_timeout)


# ============================================================================== memory documents


def format_created_at(value: datetime) -> str:
    """A datetime in pydantic's JSON form: ISO 8601, microseconds only when non-zero, ``Z`` for UTC,
    ``±HH:MM`` for another offset, nothing for a naive value."""
    text = (f"{value.year:04d}-{value.month:02d}-{value.day:02d}"
            f"T{value.hour:02d}:{value.minute:02d}:{value.second:02d}")
    if value.microsecond:
        text += f".{value.microsecond:06d}"
    offset = value.utcoffset()
    if offset is None:
        return text
    seconds = int(offset.total_seconds())
    if seconds == 0:
        return text + "Z"
    sign = "+" if seconds > 0 else "-"
    hours, rest = divmod(abs(seconds), 3600)
    minutes, secs = divmod(rest, 60)
    return text + f"{sign}{hours:02d}:{minutes:02d}" + (f":{secs:02d}" if secs else "")


_STAMP_RE = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})(?:[Tt ](\d{2}):(\d{2})(?::(\d{2})(?:[.,](\d{1,9}))?)?"
    r"(Z|z|[+-]\d{2}:?\d{2})?)?")


def _parse_created_at(value: Any) -> datetime | None:
    """A stored ``created_at`` as pydantic reads it (the ISO forms SLayer writes or a YAML
    timestamp); ``None`` for anything else."""
    if isinstance(value, datetime):
        return value
    if isinstance(value, date):  # an unquoted YAML date: midnight, no zone
        return datetime(value.year, value.month, value.day)
    if not isinstance(value, str):
        return None
    m = _STAMP_RE.fullmatch(value)
    if m is None:
        return None
    y, mo, d, h, mi, s, frac, zone = m.groups()
    tz = None
    if zone in ("Z", "z"):
        tz = UTC
    elif zone:
        digits = zone[1:].replace(":", "")
        delta = timedelta(hours=int(digits[:2]), minutes=int(digits[2:]))
        tz = timezone(-delta if zone[0] == "-" else delta)
    try:
        return datetime(int(y), int(mo), int(d), int(h or 0), int(mi or 0), int(s or 0),
                        int((frac or "0")[:6].ljust(6, "0")), tzinfo=tz)
    except ValueError:
        return None


def _document(memory_id: str, learning: str, description: str | None, entities: Sequence[str],
              query: dict[str, Any] | None, created_at: str) -> dict[str, Any]:
    """The memory in SLayer's ``Memory.model_dump(mode="json")`` field order."""
    return {"version": MEMORY_VERSION, "id": memory_id, "learning": learning, "description": description,
            "entities": list(entities), "query": query, "created_at": created_at}


def memory_markdown(doc: Mapping[str, Any]) -> str:
    """The ``memories/<id>.md`` text of a memory document (id is the file name, learning the body;
    an empty description, empty entities and a null query are left out)."""
    front = {k: v for k, v in doc.items() if k not in ("id", "learning")}
    for key in ("description", "entities"):
        if not front.get(key):
            front.pop(key, None)
    if front.get("query") is None:
        front.pop("query", None)
    dumped = yaml.safe_dump(front, sort_keys=True, default_flow_style=False, allow_unicode=True)
    return f"{_FENCE}{dumped}{_FENCE}{doc['learning']}"


def memory_json(doc: Mapping[str, Any]) -> str:
    """The ``memories.data`` text of a memory document in a SQLite store."""
    return json.dumps(dict(doc))


def _split_markdown(text: str) -> tuple[dict[str, Any] | None, str]:
    """(front matter, learning) of a memory file, split at the first fence as SLayer reads it;
    ``None`` front matter when the file has none."""
    if text.startswith(_FENCE):
        head, sep, body = text.partition("\n" + _FENCE)
        if sep:
            front = yaml.safe_load(head[len(_FENCE):])
            return (dict(front) if isinstance(front, dict) else {}), body
    return None, text


# ============================================================================== input checks


# Characters an id may not hold besides SLayer's own rules: invisible or direction-changing ones
# (format: bidi overrides and isolates, zero-width joiners, soft hyphen, BOM), surrogates, private
# use and unassigned code points. Two ids that display alike must not name two memories.
_HIDDEN_CATEGORIES = frozenset({"Cf", "Cs", "Co", "Cn"})


def normalize_memory_id(value: Any) -> str:
    """A memory id as this writer stores and looks it up: ``str`` of an int or a string, NFC-normalised
    (the two spellings of "café" are one id), checked against SLayer's rules and refused when it holds
    a character that does not show (``_HIDDEN_CATEGORIES``)."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise MemoryWriteError(f"memory id must be str or int; got {type(value).__name__}.")
    memory_id = str(value)
    try:
        memory_id.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: no file name, no SQLite text can hold it
        raise MemoryWriteError(f"memory id {memory_id!r} is not valid Unicode text (it holds a lone "
                               f"surrogate).") from None
    memory_id = unicodedata.normalize("NFC", memory_id)
    try:
        check_memory_id(memory_id)
    except EntityResolutionError as exc:
        raise MemoryWriteError(str(exc)) from exc
    for ch in memory_id:
        if unicodedata.category(ch) in _HIDDEN_CATEGORIES:
            raise MemoryWriteError(f"memory id {memory_id!r}: character U+{ord(ch):04X} "
                                   f"({unicodedata.name(ch, 'unnamed')}) does not show; ids may hold only "
                                   f"visible characters.")
    return memory_id


def memory_id_key(memory_id: str) -> str:
    """The key under which two ids are the same memory on a case-insensitive file system, and for a
    reader who cannot tell composed from decomposed accents: case-folded, then NFC (Unicode's
    canonical caseless match)."""
    return unicodedata.normalize("NFC", unicodedata.normalize("NFD", memory_id).casefold())


def _as_read_back(learning: str, description: str | None, notes: list[str]) -> tuple[str, str | None]:
    """The learning and description of a YAML store as SLayer reads them back: it opens memory
    files in text mode (``\r\n`` and ``\r`` become ``\n`` in the body) and YAML folds a NEL
    (U+0085) inside a quoted scalar to a space. Writing the read-back form makes every reader (ours,
    SLayer's, a byte-exact one) see the same text; ``notes`` says what changed."""
    if "\r" in learning:
        learning = learning.replace("\r\n", "\n").replace("\r", "\n")
        notes.append("learning: carriage returns were stored as line feeds (SLayer reads a memory file's "
                      "line ends that way)")
    if description is not None:
        dumped = yaml.safe_dump({"d": description}, sort_keys=True, default_flow_style=False, allow_unicode=True)
        back = yaml.safe_load(dumped)["d"]
        if back != description:
            notes.append("description: stored as SLayer reads it back (YAML turns a NEL, U+0085, into a space)"
                         if "\x85" in description else "description: stored as SLayer reads it back")
            description = back if isinstance(back, str) and back.strip() else None
    return learning, description


def _check_file_name(memories: Path, memory_id: str) -> None:
    """A YAML store keeps memory ``id`` in ``memories/<id>.md``: an id too long for a file name is the
    input's fault, refused before anything is written (not an I/O error after the fact)."""
    try:
        name_max = os.pathconf(memories, "PC_NAME_MAX")
    except (OSError, ValueError):
        name_max = 255
    size = len(f"{memory_id}.md".encode())
    if size > name_max:
        raise MemoryWriteError(f"memory id is too long for a YAML store: its file name would take {size} bytes "
                               f"and the file system allows {name_max}.")


def _normalize_description(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise MemoryWriteError(f"description must be a string; got {type(value).__name__}.")
    if not value.strip():
        return None
    if len(value) > DESCRIPTION_MAX_CHARS:
        raise MemoryWriteError(f"description must be <= {DESCRIPTION_MAX_CHARS} chars; got {len(value)}.")
    return value


def _dedup(items: Iterator[str] | Sequence[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


def _link(catalog: Catalog, entities: Sequence[str] | None, query: Mapping[str, Any] | None,
          ) -> tuple[tuple[str, ...], tuple[str, ...], dict[str, Any] | None]:
    """(canonical entities, warnings, stored query) of the linked references."""
    if entities is not None and query is not None:
        raise MemoryWriteError("give either entities or a query, not both.")
    if query is not None:
        stored, shape_warnings = normalize_query(query)
        try:
            refs = extract_entities_from_query(stored, catalog)
        except EntityResolutionError as exc:
            raise MemoryWriteError(f"query: {exc}") from exc
        return _dedup(refs.canonicals), _dedup([*shape_warnings, *refs.warnings]), stored
    if entities is None or isinstance(entities, (str, bytes)) or not entities:
        raise MemoryWriteError("linked_entities must be a non-empty list of entity references "
                               "(or a SlayerQuery / dict).")
    canonicals: list[str] = []
    warnings: list[str] = []
    for raw in entities:
        if not isinstance(raw, str):
            raise MemoryWriteError(f"linked_entities list items must be strings; got {type(raw).__name__}.")
        try:
            res = resolve_entity(raw, catalog)
        except EntityResolutionError as exc:
            raise MemoryWriteError(f"cannot resolve {raw!r}: {exc}", reference=raw) from exc
        canonicals.append(res.canonical)
        warnings.extend(res.warnings)
    return _dedup(canonicals), _dedup(warnings), None


# ============================================================================== query normal form

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
_QUERY_FIELDS = ("version", "name", "source_model", "measures", "dimensions", "time_dimensions",
                 "main_time_dimension", "filters", "variables", "order", "limit", "offset",
                 "whole_periods_only", "distinct_dimension_values", "to_many_handling")
_WINDOW_HINT = ("contains a window function (OVER clause); use a SLayer transform (rank, lag, ...) or a "
                "model column instead")

# date_range time-point shapes (SLayer's core/time_points.py grammar)
_INSTANT_RE = re.compile(r"(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2})(?::(\d{2})(?:\.(\d{1,6}))?)?")
_YEAR_RE = re.compile(r"(\d{4})")
_QUARTER_RE = re.compile(r"(\d{4})-Q(\d)", re.IGNORECASE)
_MONTH_RE = re.compile(r"(\d{4})-(\d{2})")
_WEEK_RE = re.compile(r"(\d{4})-W(\d{2})", re.IGNORECASE)
_DAY_RE = re.compile(r"(\d{4})-(\d{2})-(\d{2})")
_RELATIVE_RES = (re.compile(r"(this|last|next) [a-z_]\w*"), re.compile(r"(last|next) [1-9]\d* [a-z_]\w*"),
                 re.compile(r"[1-9]\d* [a-z_]\w* (ago|from now)"),
                 re.compile(r"(week|month|quarter|year) to date"), re.compile(r"today|yesterday|tomorrow"))


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
            return date.fromisocalendar(int(m.group(1)), int(m.group(2)), 1) is not None and 1 <= int(
                m.group(1)) <= 9998
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
            raise _Refused(where, f"Invalid name '{name}': must contain only letters, digits, and underscores, "
                                  f"and start with a letter or underscore")
        if model and not all(_is_name(p) for p in model.split(".")):
            raise _Refused(where, f"Invalid model path '{model}': each part must contain only letters, digits, "
                                  f"and underscores")
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
            raise _Refused(where, f"Invalid name '{name}': must contain only letters, digits, and underscores, "
                                  f"and start with a letter or underscore")
        if name is not None and name.startswith(_RESERVED_PREFIX):
            raise _Refused(where, f"ModelMeasure name '{name}' must not start with {_RESERVED_PREFIX!r}")
        kind = value.get("type")
        if kind is not None and kind not in _DATA_TYPES:
            raise _Refused(where, f"type must be one of {', '.join(sorted(_DATA_TYPES))} or null, got {kind!r}")
        meta = value.get("meta")
        if meta is not None and not isinstance(meta, Mapping):
            raise _Refused(f"{where}.meta", "expected an object or null")
        return {"formula": formula, "name": name, "label": self.optional_str(value.get("label"), f"{where}.label"),
                "description": self.optional_str(value.get("description"), f"{where}.description"),
                "type": kind, "meta": self.json_value(meta, f"{where}.meta")}

    def computed(self, expression: Any, name: Any, where: str) -> dict[str, Any]:
        """``ComputedDimension`` dump ``{expression, name}`` (an absent name is derived)."""
        if not isinstance(expression, str):
            raise _Refused(where, "'expression' must be a string")
        name = self.optional_str(name, f"{where}.name")
        if name is None:
            name = auto_name(expression)
        if "." in name or ":" in name or name.startswith(_RESERVED_PREFIX):
            raise _Refused(where, f"Computed dimension name {name!r} must not contain '.' or ':' nor start with "
                                  f"{_RESERVED_PREFIX!r}")
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
                raise _Refused(where, f"Dimension {value!r} is neither a column reference (a bare identifier or "
                                      f"dotted join path) nor a parseable Mode-B expression: {exc}") from exc
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
            raise _Refused(where, f"Time dimension {entry!r} must be the functional form gran(col) (e.g. "
                                  f"month(created_at)) for one of: {', '.join(sorted(formulas.GRANULARITY_NAMES))} "
                                  f"or a datasource granularity")
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
            raise _Refused(where, f"granularity {granularity!r} is neither a built-in granularity nor a "
                                  f"datasource granularity name")
        return {"dimension": self.column_ref(column, f"{where}.dimension"), "granularity": granularity,
                "date_range": self.date_range(value.get("date_range"), f"{where}.date_range"),
                "label": self.optional_str(value.get("label"), f"{where}.label")}

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
                raise _Refused(where, f"{bound!r}: placeholders in date_range are not supported here; save "
                                      f"this memory with SLayer")
            if not _is_time_point_shape(bound):
                raise _Refused(where, f"{bound!r} is not a time point ('YYYY', 'YYYY-Qn', 'YYYY-MM', "
                                      f"'YYYY-Www', 'YYYY-MM-DD', 'YYYY-MM-DD HH:MM[:SS]' or a relative token)")
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
        if (isinstance(column, Mapping) and set(column) == {"name"} and isinstance(column["name"], str)
                and not _is_column_path(column["name"])):
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
            raise _Refused(where, f"order direction must be one of asc/desc/ascending/descending "
                                  f"(case-insensitive), got {direction!r}")
        return {"column": ref, "direction": normalized, "raw_formula": raw_formula}

    # -- the whole query
    def run(self, query: Mapping[str, Any]) -> dict[str, Any]:
        if not isinstance(query, Mapping):
            raise _Refused("", f"a query must be an object, got {type(query).__name__}")
        data = dict(query)
        if any(not isinstance(k, str) for k in data):
            raise _Refused("", "field names must be strings")
        if "strict" in data:
            raise _Refused("strict", "`strict` is retired; set to_many_handling='error' instead "
                                     "(one of broadcast|associate|error).")
        if "version" in data:
            if data["version"] != QUERY_VERSION or isinstance(data["version"], bool):
                raise _Refused("version", f"only SlayerQuery v{QUERY_VERSION} can be stored as given (got "
                                          f"{data['version']!r}); re-save an older query with SLayer")
        else:  # the pre-v3 renames SLayer applies to a version-less payload
            if "fields" in data:
                if "measures" in data:
                    raise _Refused("fields", "v1 SlayerQuery has both 'fields' and 'measures'; cannot migrate "
                                             "unambiguously. Drop one before migrating.")
                data["measures"] = data.pop("fields")
            for legacy in ("dry_run", "explain"):
                if legacy in data:
                    data.pop(legacy)
                    self.warnings.append(f"query: legacy field {legacy!r} dropped")
        unknown = [k for k in data if k not in _QUERY_FIELDS]
        if unknown:
            raise _Refused("", f"unknown field(s) {unknown}; SlayerQuery has {', '.join(_QUERY_FIELDS)}")

        dims = self.entries(data.get("dimensions"), "dimensions")
        moved: list[dict[str, Any]] = []
        if dims is not None:
            kept = []
            for i, dim in enumerate(dims):
                td = self.granularity_call(dim, f"dimensions[{i}]", any_callee=False) if isinstance(dim, str) else None
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
            raise _Refused("source_model", "inline models and model extensions cannot be stored by slayer-lsp; "
                                           "save this memory with SLayer")
        name = self.optional_str(data.get("name"), "name")
        if name is not None and ("." in name or ":" in name or name.startswith(_RESERVED_PREFIX)):
            raise _Refused("name", f"Query name {name!r} must not contain '.' or ':' nor start with "
                                   f"{_RESERVED_PREFIX!r}")
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
            "measures": None if measures is None else [self.measure(m, f"measures[{i}]")
                                                       for i, m in enumerate(measures)],
            "dimensions": None if dims is None else [self.dimension(d, f"dimensions[{i}]")
                                                     for i, d in enumerate(dims)],
            "time_dimensions": None if tds is None else [self.time_dimension(t, f"time_dimensions[{i}]")
                                                         for i, t in enumerate(tds)],
            "main_time_dimension": self.optional_str(data.get("main_time_dimension"), "main_time_dimension"),
            "filters": filters,
            "variables": self.json_value(variables, "variables"),
            "order": None if order is None else [self.order_item(o, f"order[{i}]")
                                                 for i, o in enumerate(self.expand_order(order))],
            "limit": self.optional_int(data.get("limit"), "limit"),
            "offset": self.optional_int(data.get("offset"), "offset"),
            "whole_periods_only": self.boolean(data.get("whole_periods_only", False), "whole_periods_only"),
            "distinct_dimension_values": self.boolean(data.get("distinct_dimension_values", True),
                                                      "distinct_dimension_values"),
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
            if (isinstance(item, Mapping) and item and "column" not in item and "direction" not in item
                    and all(isinstance(k, str) for k in item)
                    and all(isinstance(v, str) and v.strip().lower() in _DIRECTIONS for v in item.values())):
                out.extend({"column": k, "direction": v} for k, v in item.items())
            else:
                out.append(item)
        return out

    @staticmethod
    def check_distinct(out: Mapping[str, Any]) -> None:
        if out["distinct_dimension_values"]:
            return
        if out["measures"]:
            raise _Refused("distinct_dimension_values", f"distinct_dimension_values=False requires an empty "
                                                        f"`measures` field, but {len(out['measures'])} measure(s) "
                                                        f"were supplied.")
        if not out["dimensions"] and not out["time_dimensions"]:
            raise _Refused("distinct_dimension_values", "distinct_dimension_values=False requires at least one "
                                                        "of `dimensions` or `time_dimensions` to be non-empty")

    @staticmethod
    def dedupe_time_dimensions(tds: list[dict[str, Any]] | None, source: str | None,
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
                    model = model[len(source) + 1:]
            column = f"{model}.{ref['name']}" if model else ref["name"]
            canon = (column, td["granularity"], tuple(td["date_range"] or ()), td["label"])
            prior = seen.get(canon[:2])
            if prior is None:
                seen[canon[:2]] = canon
                result.append(td)
            elif prior != canon:
                raise _Refused("time_dimensions", f"Conflicting time dimensions on {column!r} at "
                                                  f"{td['granularity']} granularity: same column and granularity "
                                                  f"must not differ in date range or label.")
        return result


def normalize_query(query: Mapping[str, Any]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """A query in SLayer's stored form (``SlayerQuery.model_dump(mode="json")``: every field, nulls
    and defaults included) plus warnings about keys SLayer would drop. Raises ``MemoryWriteError``
    for what SLayer would refuse and for shapes we cannot reproduce faithfully."""
    normalizer = _QueryNormalizer()
    try:
        stored = normalizer.run(query)
    except _Refused as exc:
        raise MemoryWriteError(str(exc)) from None
    return stored, tuple(normalizer.warnings)


# ============================================================================== YAML backend


@contextlib.contextmanager
def _memories_lock(store: Path, timeout: float) -> Iterator[None]:
    """The exclusive ``flock`` on ``<store>/memories.lock`` that SLayer's memory writers share.
    Polls so a wedged holder becomes an error instead of a hung editor."""
    path = store / "memories.lock"
    try:
        handle: BinaryIO = open(path, "ab")  # held across the block
    except PermissionError:
        if not path.exists():
            raise
        handle = open(path, "rb")  # a read-only lock file can still be locked
    try:
        deadline = time.monotonic() + timeout
        pause = 0.001
        while True:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise MemoryWriteError(f"timed out after {timeout:g}s waiting for {path}") from None
                time.sleep(pause)
                pause = min(pause * 2, 0.05)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
    finally:
        handle.close()


def _temp_prefix(directory: Path, basename: str) -> str:
    """``.<basename>.tmp.``, the basename cut (on a character boundary) so the temp name fits NAME_MAX."""
    try:
        name_max = os.pathconf(directory, "PC_NAME_MAX")
    except (OSError, ValueError):
        name_max = 255
    budget = max(name_max - 8 - len(".tmp.") - 1, 0)
    encoded = basename.encode("utf-8")
    if len(encoded) > budget:
        basename = encoded[:budget].decode("utf-8", errors="ignore")
    return f".{basename}.tmp."


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _atomic_write(path: Path, data: bytes) -> None:
    """Replace ``path`` durably: a same-directory temp file, fsynced, then ``os.replace``. A new file
    gets mode 0600, an existing one keeps its mode. On any error the temp file is removed and the
    old file is untouched."""
    try:
        mode = os.stat(path).st_mode & 0o7777
    except FileNotFoundError:
        mode = 0o600
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=_temp_prefix(path.parent, path.name))
    try:
        try:
            _write_all(fd, data)
            os.fchmod(fd, mode)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # durability of the rename; never turns a done write into an error
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def _io_error(action: str, target: Path | str, exc: BaseException) -> MemoryWriteError:
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    code = f" ({errno.errorcode.get(exc.errno, exc.errno)})" if isinstance(exc, OSError) and exc.errno else ""
    if isinstance(exc, sqlite3.Error) and getattr(exc, "sqlite_errorname", None):
        code = f" ({exc.sqlite_errorname})"  # SQLITE_FULL, SQLITE_IOERR_WRITE, SQLITE_BUSY, ...
    return MemoryWriteError(f"cannot {action} {target}: {reason}{code}")


def _yaml_store(store: Path) -> Path:
    """``<store>/memories``, after checking this is a store we may write (created if missing, as
    SLayer creates it when it opens a store)."""
    if not store.is_dir():
        raise MemoryWriteError(f"no SLayer YAML store at {store}")
    if (store / "memories.yaml").exists():
        raise MemoryWriteError(f"{store} still has a legacy memories.yaml; open it once with SLayer (which "
                               f"migrates it) before saving memories")
    memories = store / "memories"
    try:
        memories.mkdir(exist_ok=True)
    except OSError as exc:
        raise _io_error("create", memories, exc) from exc
    return memories


def _sweep_orphans(memories: Path, names: Iterable[str]) -> None:
    """Remove the temp files of memory writers that died mid-write (``kill -9``, a crash). Every
    writer, SLayer's and ours, holds the memories lock while its temp file exists, so one found
    under the lock belongs to nobody. Called under the lock."""
    for name in names:
        if name.startswith(".") and ".tmp." in name and not name.endswith(".md"):  # ".x.tmp.y.md" is memory ".x.tmp.y"
            with contextlib.suppress(OSError):
                os.unlink(memories / name)
                log.info("removed %s, left by a memory writer that died mid-write", memories / name)


def _int_shaped(value: str) -> bool:
    return value.isdigit() and value.isascii() and (value == "0" or not value.startswith("0"))


def _next_id(ids: Sequence[str]) -> str:
    return str(max((int(i) for i in ids if _int_shaped(i)), default=0) + 1)


def _scoped_new_id(ids: Iterable[str]) -> str:
    """A scoped session's new id: random (``m-`` and 16 hex digits), so it reveals neither how many
    memories the store holds nor the largest hidden id; drawn again while it collides with any id
    in any spelling (a collision is never reported: the caller sees only the id it got)."""
    taken = {memory_id_key(i) for i in ids}
    while True:
        candidate = f"{SCOPED_ID_PREFIX}{secrets.token_hex(8)}"
        if memory_id_key(candidate) not in taken:
            return candidate


def _twin(ids: Iterable[str], memory_id: str) -> str | None:
    """Another stored id that is the same memory as ``memory_id`` for ``memory_id_key``."""
    key = memory_id_key(memory_id)
    return next((i for i in ids if i != memory_id and memory_id_key(i) == key), None)


def _twin_refusal(memory_id: str, twin: str) -> MemoryWriteError:
    how = "case" if twin.casefold() == memory_id.casefold() else "case or Unicode form"
    return MemoryWriteError(f"Memory id '{memory_id}' conflicts with existing '{twin}' (differs only by {how}). "
                            f"Rename or delete one.")


def _existing_created_at(memory_id: str, front: Mapping[str, Any] | None) -> str:
    """The ``created_at`` an upsert keeps, formatted as SLayer re-serialises it. A document without
    one gets "now", as SLayer's default does."""
    raw = front.get("created_at") if front is not None else None
    if raw is None:
        return format_created_at(datetime.now(UTC))
    parsed = _parse_created_at(raw)
    if parsed is None:
        raise MemoryWriteError(f"existing memory '{memory_id}' has an unreadable created_at; fix it "
                               f"or forget the memory first")  # its value is not echoed: it is the file's
    return format_created_at(parsed)


def _check_memory_targets(entities: Sequence[str], exists: Callable[[str], bool]) -> None:
    """Every ``memory:<id>`` tag must name a memory the store holds right now."""
    for entity in entities:
        if entity.startswith(MEMORY_PREFIX) and not exists(entity[len(MEMORY_PREFIX):]):
            raise MemoryWriteError(f"cannot resolve {entity!r}: No memory with id "
                                   f"'{entity[len(MEMORY_PREFIX):]}'.", reference=entity)


def _read_text(path: Path) -> str:
    """A memory file as SLayer reads it (text mode: universal newlines), but as the store reader
    opens it: never through a link, never a FIFO or device, never past the document bound."""
    try:
        data = read_file(str(path))
    except Refused as exc:
        raise OSError(errno.EPERM, f"{path.name}: {exc}") from None
    return data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")


def _save_yaml(store: Path, memory_id: str | None, learning: str, description: str | None,
               entities: tuple[str, ...], query: dict[str, Any] | None, warnings: tuple[str, ...],
               timeout: float, reachable: Collection[str] | None = None) -> SavedMemory:
    memories = _yaml_store(store)
    if memory_id is not None:
        _check_file_name(memories, memory_id)
    try:
        with _memories_lock(store, timeout):
            names = set(os.listdir(memories))
            _sweep_orphans(memories, names)
            ids = [n[:-3] for n in names if n.endswith(".md")]
            created = True
            if memory_id is None:
                memory_id = _next_id(ids) if reachable is None else _scoped_new_id(ids)
                created_at = format_created_at(datetime.now(UTC))
            else:
                exists = f"{memory_id}.md" in names
                clash = _twin(ids, memory_id)
                if clash is not None and reachable is not None and (exists or clash not in reachable):
                    # a scoped upsert of its own memory creates no new collision, and a twin it cannot
                    # reach is never named: a new id colliding with one is refused like any other
                    clash = None
                    if not exists:
                        raise MemoryWriteError(scoped_id_refusal(memory_id))
                if clash is not None:
                    raise _twin_refusal(memory_id, clash)
                if exists:
                    created = False
                    try:
                        front, _ = _split_markdown(_read_text(memories / f"{memory_id}.md"))
                    except (OSError, yaml.YAMLError, UnicodeDecodeError):  # their messages quote the file
                        raise MemoryWriteError(f"existing memory '{memory_id}' cannot be read (it is not a "
                                               f"regular file of UTF-8 text with valid YAML front matter); "
                                               f"fix it or forget it first") from None
                    created_at = _existing_created_at(memory_id, front)
                else:
                    created_at = format_created_at(datetime.now(UTC))
            _check_memory_targets(entities, lambda mid: f"{mid}.md" in names)
            doc = _document(memory_id, learning, description, entities, query, created_at)
            target = memories / f"{memory_id}.md"
            try:
                _atomic_write(target, memory_markdown(doc).encode("utf-8"))
            except (OSError, UnicodeEncodeError) as exc:
                raise _io_error("write", target, exc) from exc
    except OSError as exc:
        raise _io_error("save a memory in", store, exc) from exc
    log.info("saved memory %s in %s", memory_id, store)
    return SavedMemory(memory_id, entities, created, warnings, created_at)


def _strip_tag_yaml(memories: Path, tag: str) -> int:
    """Drop ``tag`` from every memory file that carries it (called under the lock)."""
    rewritten = 0
    for name in sorted(os.listdir(memories)):
        if not name.endswith(".md"):
            continue
        path = memories / name
        try:
            text = _read_text(path)
            if tag not in text and "\\" not in text:  # cannot carry the tag (unless spelled with escapes)
                continue
            front, body = _split_markdown(text)
        except (OSError, yaml.YAMLError, UnicodeDecodeError) as exc:
            log.warning("skipping unreadable memory %s while removing %s: %s", path, tag, exc)
            continue
        tags = front.get("entities") if front is not None else None
        if front is None or not isinstance(tags, list) or tag not in tags:
            continue
        doc = _rebuilt(name[:-3], body, front, [e for e in tags if e != tag])
        try:
            _atomic_write(path, memory_markdown(doc).encode("utf-8"))
        except (OSError, UnicodeEncodeError) as exc:  # the other memory is not named: it may be hidden
            log.warning("cannot rewrite %s while removing %s: %s", path, tag, exc)
            raise _io_error("rewrite a memory that carries the tag in", memories, exc) from exc
        rewritten += 1
    return rewritten


def _rebuilt(memory_id: str, learning: str, stored: Mapping[str, Any], entities: list[str]) -> dict[str, Any]:
    """A stored memory with new entities, serialised as SLayer's load-and-save would: a current
    (v4) document is re-normalised field by field; anything else only loses the tag, keeping the
    rest as it was (SLayer would migrate it, which we do not reproduce)."""
    if stored.get("version") == MEMORY_VERSION:
        try:
            query = stored.get("query")
            normal = normalize_query(query)[0] if query is not None else None
            created = _parse_created_at(stored.get("created_at"))
            if created is not None:
                return _document(memory_id, learning, _normalize_description(stored.get("description")),
                                 entities, normal, format_created_at(created))
        except MemoryWriteError as exc:
            log.warning("memory %s: stored fields not re-normalised (%s)", memory_id, exc)
    doc = dict(stored)  # keeps the stored key order (it is the JSON order in a SQLite row)
    doc["entities"] = entities
    doc.setdefault("id", memory_id)
    doc.setdefault("learning", learning)
    return doc


def _delete_embeddings(conn: sqlite3.Connection, canonical_id: str) -> int:
    """Delete the embedding rows of exactly ``canonical_id`` (no prefix or descendant match)."""
    if conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='embeddings'").fetchone() is None:
        return 0
    return conn.execute("DELETE FROM embeddings WHERE canonical_id = ?", (canonical_id,)).rowcount or 0


def _forget_yaml(store: Path, memory_id: str, timeout: float) -> bool:
    memories = _yaml_store(store)
    target = memories / f"{memory_id}.md"
    try:
        with _memories_lock(store, timeout):
            names = os.listdir(memories)
            _sweep_orphans(memories, names)
            if f"{memory_id}.md" not in names:
                return False
            try:
                os.unlink(target)
            except OSError as exc:
                raise _io_error("delete", target, exc) from exc
            tag = f"{MEMORY_PREFIX}{memory_id}"
            sidecar = store / "embeddings.db"
            if sidecar.is_file():
                try:
                    with _transaction(sidecar, timeout) as conn:
                        _delete_embeddings(conn, tag)
                except sqlite3.Error as exc:
                    raise MemoryWriteError(f"memory '{memory_id}' was deleted but its embeddings in {sidecar} "
                                           f"were not: {exc}") from exc
            try:
                _strip_tag_yaml(memories, tag)
            except MemoryWriteError as exc:
                raise MemoryWriteError(f"memory '{memory_id}' was deleted but removing its tag from other "
                                       f"memories failed: {exc}") from exc
    except OSError as exc:
        raise _io_error("forget a memory in", store, exc) from exc
    log.info("forgot memory %s in %s", memory_id, store)
    return True


# ============================================================================== SQLite backend


def _connect(db: Path, timeout: float) -> sqlite3.Connection:
    return sqlite3.connect(db, timeout=timeout, isolation_level=None)


@contextlib.contextmanager
def _transaction(db: Path, timeout: float) -> Iterator[sqlite3.Connection]:
    """One ``BEGIN IMMEDIATE`` transaction (the write lock up front, as SLayer's memory saves take
    it): committed on success, rolled back on any error, so no half-written row survives."""
    if not db.is_file():
        raise MemoryWriteError(f"no SLayer SQLite store at {db}")
    conn = _connect(db, timeout)
    try:
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
            conn.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise
    finally:
        conn.close()


def _check_sqlite_schema(conn: sqlite3.Connection, db: Path) -> None:
    for table, key in (("memories", "id"), ("memory_entities", "memory_id")):
        columns = {row[1]: (row[2] or "").upper() for row in conn.execute(f"PRAGMA table_info({table})")}
        if key not in columns:
            raise MemoryWriteError(f"{db} has no {table} table; open it once with SLayer before saving memories")
        if columns[key] != "TEXT":
            raise MemoryWriteError(f"{db} has a legacy {table} table ({key} is {columns[key]}); open it once with "
                                   f"SLayer (which migrates it) before saving memories")


def _put_row(conn: sqlite3.Connection, doc: Mapping[str, Any]) -> None:
    """Upsert a memory row and mirror its entities, statement for statement as SLayer does."""
    conn.execute("INSERT OR REPLACE INTO memories (id, data) VALUES (?, ?)", (doc["id"], memory_json(doc)))
    conn.execute("DELETE FROM memory_entities WHERE memory_id = ?", (doc["id"],))
    for entity in doc["entities"]:
        conn.execute("INSERT OR IGNORE INTO memory_entities (memory_id, entity) VALUES (?, ?)", (doc["id"], entity))


def _save_sqlite(db: Path, memory_id: str | None, learning: str, description: str | None,
                 entities: tuple[str, ...], query: dict[str, Any] | None, warnings: tuple[str, ...],
                 timeout: float, reachable: Collection[str] | None = None) -> SavedMemory:
    try:
        with _transaction(db, timeout) as conn:
            _check_sqlite_schema(conn, db)
            created = True
            if memory_id is None:
                ids = [str(r[0]) for r in conn.execute("SELECT id FROM memories")]
                memory_id = _next_id(ids) if reachable is None else _scoped_new_id(ids)
                created_at = format_created_at(datetime.now(UTC))
            else:
                row = conn.execute("SELECT data FROM memories WHERE id = ?", (memory_id,)).fetchone()
                if row is None:
                    created_at = format_created_at(datetime.now(UTC))
                else:
                    created = False
                    try:
                        stored = json.loads(row[0])
                    except (TypeError, ValueError):
                        raise MemoryWriteError(f"existing memory '{memory_id}' cannot be read (its row is not "
                                               f"valid JSON); fix it or forget it first") from None
                    created_at = _existing_created_at(memory_id, stored if isinstance(stored, dict) else None)
            _check_memory_targets(entities, lambda mid: conn.execute(
                "SELECT 1 FROM memories WHERE id = ?", (mid,)).fetchone() is not None)
            _put_row(conn, _document(memory_id, learning, description, entities, query, created_at))
    except (sqlite3.Error, OSError, UnicodeEncodeError) as exc:
        raise _io_error("save a memory in", db, exc) from exc
    log.info("saved memory %s in %s", memory_id, db)
    return SavedMemory(memory_id, entities, created, warnings, created_at)


def _forget_sqlite(db: Path, memory_id: str, timeout: float) -> bool:
    tag = f"{MEMORY_PREFIX}{memory_id}"
    try:
        with _transaction(db, timeout) as conn:
            _check_sqlite_schema(conn, db)
            if conn.execute("DELETE FROM memories WHERE id = ?", (memory_id,)).rowcount == 0:
                return False
            conn.execute("DELETE FROM memory_entities WHERE memory_id = ?", (memory_id,))
            _delete_embeddings(conn, tag)
            for other_id, data in conn.execute("SELECT id, data FROM memories ORDER BY id").fetchall():
                try:
                    stored = json.loads(data)
                except (TypeError, ValueError):
                    log.warning("skipping unreadable memory %s while removing %s", other_id, tag)
                    continue
                tags = stored.get("entities") if isinstance(stored, dict) else None
                if not isinstance(tags, list) or tag not in tags:
                    continue
                learning = stored.get("learning")
                _put_row(conn, _rebuilt(other_id, learning if isinstance(learning, str) else "", stored,
                                        [e for e in tags if e != tag]))
    except (sqlite3.Error, OSError) as exc:
        raise _io_error("forget a memory in", db, exc) from exc
    log.info("forgot memory %s in %s", memory_id, db)
    return True


# ============================================================================== renames (SQLite store)


@dataclass(frozen=True, slots=True)
class RowRewrite:
    """One row a rename rewrites: ``table`` is ``models`` (key ``(datasource, name)``) or ``memories``
    (key ``(id,)``). ``old_data`` is the row as it was planned from; the rewrite is refused when the
    row no longer holds it. ``entities``: a memory's tags after the rename (its ``memory_entities``)."""

    table: str
    key: tuple[str, ...]
    old_data: str
    new_data: str
    new_key: tuple[str, ...]
    entities: tuple[str, ...] = ()


def read_rename_rows(db: Path | str, datasource: str) -> tuple[list[tuple[str, str, str]], list[tuple[str, str]]]:
    """The rows a rename of something in ``datasource`` may rewrite: that datasource's model rows
    ``(data_source, name, data)`` (joins and formulas reach only within it) and every memory row
    ``(id, data)``. Read without a lock: ``rename_rows`` re-checks each row under the write lock."""
    db = Path(db)
    if not db.is_file():
        raise MemoryWriteError(f"no SLayer SQLite store at {db}")
    try:
        conn = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True, timeout=LOCK_TIMEOUT)
        try:
            models = [(str(a), str(b), str(c)) for a, b, c in conn.execute(
                "SELECT data_source, name, data FROM models WHERE data_source = ? ORDER BY name", (datasource,))]
            memories = [(str(a), str(b)) for a, b in conn.execute("SELECT id, data FROM memories ORDER BY id")]
        finally:
            conn.close()
    except sqlite3.Error as exc:
        raise _io_error("read the rows of", db, exc) from exc
    return models, memories


def rename_rows(db: Path | str, rows: Sequence[RowRewrite], renamed: Sequence[str],
                lock_timeout: float = LOCK_TIMEOUT) -> None:
    """Rewrite the rows of a rename in ONE ``BEGIN IMMEDIATE`` transaction (the write lock SLayer's
    own saves take), so a reader sees the store before the rename or after it, never half of it.

    Every row must still hold the data the rename was planned from, and a renamed model's new key
    must be free; otherwise nothing is written. A model row is updated in place (SLayer's
    ``json.dumps`` form is the planner's); a memory row is replaced and its ``memory_entities``
    mirrored as SLayer's save does. Stored vectors of ``renamed`` ids (and their descendants) are
    dropped: they are keyed by the old id, and the next embedding pass files them under the new one."""
    db = Path(db)
    try:
        with _transaction(db, lock_timeout) as conn:
            _check_sqlite_schema(conn, db)
            for row in rows:
                where = "data_source = ? AND name = ?" if row.table == "models" else "id = ?"
                found = conn.execute(f"SELECT data FROM {row.table} WHERE {where}", row.key).fetchone()
                if found is None or found[0] != row.old_data:
                    raise MemoryWriteError(f"the {row.table} row {'.'.join(row.key)!r} changed since the rename "
                                           f"was planned; nothing was written: rename again")
                if row.new_key != row.key and conn.execute(
                        f"SELECT 1 FROM {row.table} WHERE {where}", row.new_key).fetchone() is not None:
                    raise MemoryWriteError(f"{'.'.join(row.new_key)!r} already exists in the store; nothing "
                                           f"was written")
            for row in rows:
                if row.table == "models":
                    conn.execute("UPDATE models SET data_source = ?, name = ?, data = ? "
                                 "WHERE data_source = ? AND name = ?", (*row.new_key, row.new_data, *row.key))
                    continue
                conn.execute("UPDATE memories SET data = ? WHERE id = ?", (row.new_data, *row.key))
                conn.execute("DELETE FROM memory_entities WHERE memory_id = ?", row.key)
                for entity in row.entities:
                    conn.execute("INSERT OR IGNORE INTO memory_entities (memory_id, entity) VALUES (?, ?)",
                                 (*row.key, entity))
            has_vectors = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type='table' AND name='embeddings'").fetchone() is not None
            for old in renamed if has_vectors else ():
                conn.execute("DELETE FROM embeddings WHERE canonical_id = ? OR substr(canonical_id, 1, ?) = ?",
                             (old, len(old) + 1, old + "."))
    except (sqlite3.Error, OSError) as exc:
        raise _io_error("rename rows of", db, exc) from exc
    log.info("renamed %d rows in %s", len(rows), db)
