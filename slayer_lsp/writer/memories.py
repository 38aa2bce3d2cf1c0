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
import json
import logging
import os
import re
import secrets
import sqlite3
import unicodedata
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import yaml

from slayer_lsp.catalog import Catalog
from slayer_lsp.catalog.ids import is_memory_ref, memory_id_of, memory_ref
from slayer_lsp.query.normal_form import QueryRefused, normalize_query
from slayer_lsp.query.references import extract_entities_from_query
from slayer_lsp.query.resolver import EntityResolutionError, check_memory_id, resolve_entity
from slayer_lsp.store import files, transactions
from slayer_lsp.store.documents import MAX_LEARNING_CHARS
from slayer_lsp.store.locate import StoreLocation
from slayer_lsp.store.safefs import Refused, read_file
from slayer_lsp.writer.errors import MemoryWriteError, WriteErrorKind

__all__ = [
    "DESCRIPTION_MAX_CHARS",
    "MAX_LEARNING_CHARS",
    "MemoryWriteError",
    "SavedMemory",
    "forget_memory",
    "format_created_at",
    "memory_id_key",
    "memory_json",
    "memory_markdown",
    "normalize_memory_id",
    "save_memory",
    "scoped_id_refusal",
    "check_sqlite_schema",
    "io_error",
    "sqlite_transaction",
]

log = logging.getLogger(__name__)

MEMORY_VERSION = 4
DESCRIPTION_MAX_CHARS = 500
LOCK_TIMEOUT = 30.0
_FENCE = "---\n"
SCOPED_ID_PREFIX = "m-"  # a scoped session's new memory: "m-" + 16 random hex digits (see save_memory)


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


def save_memory(
    location: StoreLocation,
    catalog: Catalog,
    *,
    learning: str,
    entities: list[str] | None = None,
    query: Mapping[str, Any] | None = None,
    id: str | int | None = None,
    description: str | None = None,
    lock_timeout: float = LOCK_TIMEOUT,
    reachable: Collection[str] | None = None,
) -> SavedMemory:
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
        raise MemoryWriteError(
            f"learning must be at most {MAX_LEARNING_CHARS} characters; got {len(learning)}. "
            f"Save a summary, or split it into several memories."
        )
    memory_id = normalize_memory_id(id) if id is not None else None
    if reachable is not None and memory_id is not None and memory_id not in reachable:
        raise MemoryWriteError(scoped_id_refusal(id))
    description = _normalize_description(description)
    notes: list[str] = []
    if location.backend == "yaml":  # stored as SLayer reads it back, so every reader agrees
        learning, description = _as_read_back(learning, description, notes)
    canonicals, warnings, stored_query = _link(catalog, entities, query)
    warnings = (*warnings, *notes)
    request = _SaveRequest(
        memory_id, learning, description, canonicals, stored_query, warnings, lock_timeout, reachable
    )
    if location.backend == "sqlite":
        return _save_sqlite(location.path, request)
    return _save_yaml(location.path, request)


def scoped_id_refusal(memory_id: Any) -> str:
    """The one answer of a scoped writer to an ``id`` it does not reach: the same whether the id is
    free or a hidden memory's (in any case or Unicode spelling), so it tells nothing."""
    return (
        f"memory id {str(memory_id)!r} is not a memory this session can update: with a scope, 'id' names one "
        f"of the session's own memories; leave it out to save a new memory (it gets a fresh id)."
    )


def forget_memory(
    location: StoreLocation,
    catalog: Catalog | None,
    id: str | int,
    *,
    lock_timeout: float = LOCK_TIMEOUT,
    reachable: Collection[str] | None = None,
) -> bool:
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
    text = (
        f"{value.year:04d}-{value.month:02d}-{value.day:02d}"
        f"T{value.hour:02d}:{value.minute:02d}:{value.second:02d}"
    )
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
    r"(Z|z|[+-]\d{2}:?\d{2})?)?"
)


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
        return datetime(
            int(y),
            int(mo),
            int(d),
            int(h or 0),
            int(mi or 0),
            int(s or 0),
            int((frac or "0")[:6].ljust(6, "0")),
            tzinfo=tz,
        )
    except ValueError:
        return None


def _document(
    memory_id: str,
    learning: str,
    description: str | None,
    entities: Sequence[str],
    query: dict[str, Any] | None,
    created_at: str,
) -> dict[str, Any]:
    """The memory in SLayer's ``Memory.model_dump(mode="json")`` field order."""
    return {
        "version": MEMORY_VERSION,
        "id": memory_id,
        "learning": learning,
        "description": description,
        "entities": list(entities),
        "query": query,
        "created_at": created_at,
    }


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
            front = yaml.safe_load(head[len(_FENCE) :])
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
        raise MemoryWriteError(
            f"memory id {memory_id!r} is not valid Unicode text (it holds a lone surrogate)."
        ) from None
    memory_id = unicodedata.normalize("NFC", memory_id)
    try:
        check_memory_id(memory_id)
    except EntityResolutionError as exc:
        raise MemoryWriteError(str(exc)) from exc
    for ch in memory_id:
        if unicodedata.category(ch) in _HIDDEN_CATEGORIES:
            raise MemoryWriteError(
                f"memory id {memory_id!r}: character U+{ord(ch):04X} "
                f"({unicodedata.name(ch, 'unnamed')}) does not show; ids may hold only "
                f"visible characters."
            )
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
        notes.append(
            "learning: carriage returns were stored as line feeds (SLayer reads a memory file's "
            "line ends that way)"
        )
    if description is not None:
        dumped = yaml.safe_dump(
            {"d": description}, sort_keys=True, default_flow_style=False, allow_unicode=True
        )
        back = yaml.safe_load(dumped)["d"]
        if back != description:
            notes.append(
                "description: stored as SLayer reads it back (YAML turns a NEL, U+0085, into a space)"
                if "\x85" in description
                else "description: stored as SLayer reads it back"
            )
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
        raise MemoryWriteError(
            f"memory id is too long for a YAML store: its file name would take {size} bytes "
            f"and the file system allows {name_max}."
        )


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


def _link(
    catalog: Catalog,
    entities: Sequence[str] | None,
    query: Mapping[str, Any] | None,
) -> tuple[tuple[str, ...], tuple[str, ...], dict[str, Any] | None]:
    """(canonical entities, warnings, stored query) of the linked references."""
    if entities is not None and query is not None:
        raise MemoryWriteError("give either entities or a query, not both.")
    if query is not None:
        try:
            stored, shape_warnings = normalize_query(query)
        except QueryRefused as exc:
            raise MemoryWriteError(str(exc)) from None
        try:
            refs = extract_entities_from_query(stored, catalog)
        except EntityResolutionError as exc:
            raise MemoryWriteError(f"query: {exc}", kind=WriteErrorKind.UNRESOLVED) from exc
        return _dedup(refs.canonicals), _dedup([*shape_warnings, *refs.warnings]), stored
    if entities is None or isinstance(entities, (str, bytes)) or not entities:
        raise MemoryWriteError(
            "linked_entities must be a non-empty list of entity references (or a SlayerQuery / dict)."
        )
    canonicals: list[str] = []
    warnings: list[str] = []
    for raw in entities:
        if not isinstance(raw, str):
            raise MemoryWriteError(f"linked_entities list items must be strings; got {type(raw).__name__}.")
        try:
            res = resolve_entity(raw, catalog)
        except EntityResolutionError as exc:
            raise MemoryWriteError(
                f"cannot resolve {raw!r}: {exc}", reference=raw, kind=WriteErrorKind.UNRESOLVED
            ) from exc
        canonicals.append(res.canonical)
        warnings.extend(res.warnings)
    return _dedup(canonicals), _dedup(warnings), None


# ============================================================================== YAML backend


@contextlib.contextmanager
def _locked(store: Path, timeout: float) -> Iterator[None]:
    """SLayer's memories lock (``store.files.memories_lock``); a timeout is the store being busy."""
    try:
        with files.memories_lock(store, timeout):
            yield
    except files.LockTimeout as exc:
        raise MemoryWriteError(str(exc), kind=WriteErrorKind.BUSY) from None


def io_error(action: str, target: Path | str, exc: BaseException) -> MemoryWriteError:
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    code = f" ({errno.errorcode.get(exc.errno, exc.errno)})" if isinstance(exc, OSError) and exc.errno else ""
    if isinstance(exc, sqlite3.Error) and getattr(exc, "sqlite_errorname", None):
        code = f" ({exc.sqlite_errorname})"  # SQLITE_FULL, SQLITE_IOERR_WRITE, SQLITE_BUSY, ...
    return MemoryWriteError(f"cannot {action} {target}: {reason}{code}", kind=WriteErrorKind.STORE)


def _yaml_store(store: Path) -> Path:
    """``<store>/memories``, after checking this is a store we may write (created if missing, as
    SLayer creates it when it opens a store)."""
    if not store.is_dir():
        raise MemoryWriteError(f"no SLayer YAML store at {store}", kind=WriteErrorKind.STORE)
    if (store / "memories.yaml").exists():
        raise MemoryWriteError(
            f"{store} still has a legacy memories.yaml; open it once with SLayer (which "
            f"migrates it) before saving memories",
            kind=WriteErrorKind.STORE,
        )
    memories = store / "memories"
    try:
        memories.mkdir(exist_ok=True)
    except OSError as exc:
        raise io_error("create", memories, exc) from exc
    return memories


def _sweep_orphans(memories: Path, names: Iterable[str]) -> None:
    """Remove the temp files of memory writers that died mid-write (``kill -9``, a crash). Every
    writer, SLayer's and ours, holds the memories lock while its temp file exists, so one found
    under the lock belongs to nobody. Called under the lock."""
    for name in names:
        if (
            name.startswith(".") and ".tmp." in name and not name.endswith(".md")
        ):  # ".x.tmp.y.md" is memory ".x.tmp.y"
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
    return MemoryWriteError(
        f"Memory id '{memory_id}' conflicts with existing '{twin}' (differs only by {how}). "
        f"Rename or delete one."
    )


def _existing_created_at(memory_id: str, front: Mapping[str, Any] | None) -> str:
    """The ``created_at`` an upsert keeps, formatted as SLayer re-serialises it. A document without
    one gets "now", as SLayer's default does."""
    raw = front.get("created_at") if front is not None else None
    if raw is None:
        return format_created_at(datetime.now(UTC))
    parsed = _parse_created_at(raw)
    if parsed is None:
        raise MemoryWriteError(
            f"existing memory '{memory_id}' has an unreadable created_at; fix it or forget the memory first",
            kind=WriteErrorKind.STORE,
        )  # its value is not echoed: it is the file's
    return format_created_at(parsed)


def _check_memory_targets(entities: Sequence[str], exists: Callable[[str], bool]) -> None:
    """Every ``memory:<id>`` tag must name a memory the store holds right now."""
    for entity in entities:
        if is_memory_ref(entity) and not exists(memory_id_of(entity)):
            raise MemoryWriteError(
                f"cannot resolve {entity!r}: No memory with id '{memory_id_of(entity)}'.",
                reference=entity,
                kind=WriteErrorKind.UNRESOLVED,
            )


def _read_text(path: Path) -> str:
    """A memory file as SLayer reads it (text mode: universal newlines), but as the store reader
    opens it: never through a link, never a FIFO or device, never past the document bound."""
    try:
        data = read_file(str(path))
    except Refused as exc:
        raise OSError(errno.EPERM, f"{path.name}: {exc}") from None
    return data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")


@dataclass(frozen=True)
class _SaveRequest:
    """One memory to save, checked and linked; the backends differ only in where it goes."""

    memory_id: str | None  # None: allocate one
    learning: str
    description: str | None
    entities: tuple[str, ...]
    query: dict[str, Any] | None
    warnings: tuple[str, ...]
    timeout: float  # for the store's lock
    reachable: Collection[str] | None = None  # a scoped writer's memory ids (see ``save_memory``)


def _save_yaml(store: Path, request: _SaveRequest) -> SavedMemory:
    memory_id, learning, description = request.memory_id, request.learning, request.description
    entities, query, warnings = request.entities, request.query, request.warnings
    timeout, reachable = request.timeout, request.reachable
    memories = _yaml_store(store)
    if memory_id is not None:
        _check_file_name(memories, memory_id)
    try:
        with _locked(store, timeout):
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
                        raise MemoryWriteError(
                            f"existing memory '{memory_id}' cannot be read (it is not a "
                            f"regular file of UTF-8 text with valid YAML front matter); "
                            f"fix it or forget it first",
                            kind=WriteErrorKind.STORE,
                        ) from None
                    created_at = _existing_created_at(memory_id, front)
                else:
                    created_at = format_created_at(datetime.now(UTC))
            _check_memory_targets(entities, lambda mid: f"{mid}.md" in names)
            doc = _document(memory_id, learning, description, entities, query, created_at)
            target = memories / f"{memory_id}.md"
            try:
                files.atomic_write(target, memory_markdown(doc).encode("utf-8"))
            except (OSError, UnicodeEncodeError) as exc:
                raise io_error("write", target, exc) from exc
    except OSError as exc:
        raise io_error("save a memory in", store, exc) from exc
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
            files.atomic_write(path, memory_markdown(doc).encode("utf-8"))
        except (OSError, UnicodeEncodeError) as exc:  # the other memory is not named: it may be hidden
            log.warning("cannot rewrite %s while removing %s: %s", path, tag, exc)
            raise io_error("rewrite a memory that carries the tag in", memories, exc) from exc
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
                return _document(
                    memory_id,
                    learning,
                    _normalize_description(stored.get("description")),
                    entities,
                    normal,
                    format_created_at(created),
                )
        except (MemoryWriteError, QueryRefused) as exc:
            log.warning("memory %s: stored fields not re-normalised (%s)", memory_id, exc)
    doc = dict(stored)  # keeps the stored key order (it is the JSON order in a SQLite row)
    doc["entities"] = entities
    doc.setdefault("id", memory_id)
    doc.setdefault("learning", learning)
    return doc


def _delete_embeddings(conn: sqlite3.Connection, canonical_id: str) -> int:
    """Delete the embedding rows of exactly ``canonical_id`` (no prefix or descendant match)."""
    if (
        conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='embeddings'").fetchone()
        is None
    ):
        return 0
    return conn.execute("DELETE FROM embeddings WHERE canonical_id = ?", (canonical_id,)).rowcount or 0


def _forget_yaml(store: Path, memory_id: str, timeout: float) -> bool:
    memories = _yaml_store(store)
    target = memories / f"{memory_id}.md"
    try:
        with _locked(store, timeout):
            names = os.listdir(memories)
            _sweep_orphans(memories, names)
            if f"{memory_id}.md" not in names:
                return False
            try:
                os.unlink(target)
            except OSError as exc:
                raise io_error("delete", target, exc) from exc
            tag = memory_ref(memory_id)
            sidecar = store / "embeddings.db"
            if sidecar.is_file():
                try:
                    with sqlite_transaction(sidecar, timeout) as conn:
                        _delete_embeddings(conn, tag)
                except sqlite3.Error as exc:
                    raise MemoryWriteError(
                        f"memory '{memory_id}' was deleted but its embeddings in {sidecar} were not: {exc}",
                        kind=WriteErrorKind.STORE,
                    ) from exc
            try:
                _strip_tag_yaml(memories, tag)
            except MemoryWriteError as exc:
                raise MemoryWriteError(
                    f"memory '{memory_id}' was deleted but removing its tag from other "
                    f"memories failed: {exc}",
                    kind=WriteErrorKind.STORE,
                ) from exc
    except OSError as exc:
        raise io_error("forget a memory in", store, exc) from exc
    log.info("forgot memory %s in %s", memory_id, store)
    return True


# ============================================================================== SQLite backend


def sqlite_transaction(db: Path, timeout: float) -> contextlib.AbstractContextManager[sqlite3.Connection]:
    """One ``BEGIN IMMEDIATE`` transaction on a SQLite store (``store.transactions``)."""
    if not db.is_file():
        raise MemoryWriteError(f"no SLayer SQLite store at {db}", kind=WriteErrorKind.STORE)
    return transactions.transaction(db, timeout)


def check_sqlite_schema(conn: sqlite3.Connection, db: Path) -> None:
    for table, key in (("memories", "id"), ("memory_entities", "memory_id")):
        columns = {row[1]: (row[2] or "").upper() for row in conn.execute(f"PRAGMA table_info({table})")}
        if key not in columns:
            raise MemoryWriteError(
                f"{db} has no {table} table; open it once with SLayer before saving memories",
                kind=WriteErrorKind.STORE,
            )
        if columns[key] != "TEXT":
            raise MemoryWriteError(
                f"{db} has a legacy {table} table ({key} is {columns[key]}); open it once with "
                f"SLayer (which migrates it) before saving memories",
                kind=WriteErrorKind.STORE,
            )


def _put_row(conn: sqlite3.Connection, doc: Mapping[str, Any]) -> None:
    """Upsert a memory row and mirror its entities, statement for statement as SLayer does."""
    conn.execute("INSERT OR REPLACE INTO memories (id, data) VALUES (?, ?)", (doc["id"], memory_json(doc)))
    conn.execute("DELETE FROM memory_entities WHERE memory_id = ?", (doc["id"],))
    for entity in doc["entities"]:
        conn.execute(
            "INSERT OR IGNORE INTO memory_entities (memory_id, entity) VALUES (?, ?)", (doc["id"], entity)
        )


def _save_sqlite(db: Path, request: _SaveRequest) -> SavedMemory:
    memory_id, learning, description = request.memory_id, request.learning, request.description
    entities, query, warnings = request.entities, request.query, request.warnings
    timeout, reachable = request.timeout, request.reachable
    try:
        with sqlite_transaction(db, timeout) as conn:
            check_sqlite_schema(conn, db)
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
                        raise MemoryWriteError(
                            f"existing memory '{memory_id}' cannot be read (its row is not "
                            f"valid JSON); fix it or forget it first",
                            kind=WriteErrorKind.STORE,
                        ) from None
                    created_at = _existing_created_at(memory_id, stored if isinstance(stored, dict) else None)
            _check_memory_targets(
                entities,
                lambda mid: (
                    conn.execute("SELECT 1 FROM memories WHERE id = ?", (mid,)).fetchone() is not None
                ),
            )
            _put_row(conn, _document(memory_id, learning, description, entities, query, created_at))
    except (sqlite3.Error, OSError, UnicodeEncodeError) as exc:
        raise io_error("save a memory in", db, exc) from exc
    log.info("saved memory %s in %s", memory_id, db)
    return SavedMemory(memory_id, entities, created, warnings, created_at)


def _forget_sqlite(db: Path, memory_id: str, timeout: float) -> bool:
    tag = memory_ref(memory_id)
    try:
        with sqlite_transaction(db, timeout) as conn:
            check_sqlite_schema(conn, db)
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
                _put_row(
                    conn,
                    _rebuilt(
                        other_id,
                        learning if isinstance(learning, str) else "",
                        stored,
                        [e for e in tags if e != tag],
                    ),
                )
    except (sqlite3.Error, OSError) as exc:
        raise io_error("forget a memory in", db, exc) from exc
    log.info("forgot memory %s in %s", memory_id, db)
    return True
