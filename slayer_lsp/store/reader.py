"""Read a SLayer store (YAML directory or SQLite file) into decoded documents.

Ground state of the whole program: everything else is derived from the ``StoreRead`` this module
returns. The readers are read-only (never migrate, never write back), O(N) (one directory listing
per directory, never one per file), and never raise on bad content: a document that cannot be
loaded becomes a ``LoadIssue`` naming its source and the reason, and the rest still loads.

Both readers keep a cache keyed by each source's identity (stat key for files, the stored text for
rows), so a rescan after a change re-parses only what changed.

A YAML file that loaded before and now fails (caught half-written by a writer that does not rename
into place, replaced with garbage, deleted between listing and reading) keeps its last good document
in later reads of the same reader, with the failure as a load issue: a long-lived process keeps
answering from what it knew. Such a document is never written to the on-disk cache, so a fresh start
sees the file as it is.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import sqlite3
import stat
from bisect import bisect_right
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path
from typing import Any, NamedTuple

import msgspec
import yaml

from slayer_lsp.store import documents as d
from slayer_lsp.store import fastyaml, own_writes, safefs, sqlite_rows
from slayer_lsp.store.limits import MAX_DOCUMENT_BYTES, MAX_LEARNING_CHARS, check_json_nesting
from slayer_lsp.store.locate import StoreLocation, locate

try:  # PyYAML's C loader is ~8x faster; fall back only where libyaml is missing.
    _Loader: Any = yaml.CSafeLoader
except AttributeError:  # pragma: no cover
    _Loader = yaml.SafeLoader

DocValue = d.Model | d.Datasource | d.Memory | tuple[str, ...]


class DocKey(NamedTuple):
    """Identity of a stored document: ``("model", "ds.name")``, ``("memory", id)``, ... A tuple,
    so hashing and comparing one (a few hundred thousand times per read of a large store) is C."""

    kind: str  # "datasource" | "model" | "memory" | "priority"
    name: str


PRIORITY_KEY = DocKey("priority", "")


@dataclass(frozen=True, slots=True)
class Source:
    """Where a document lives: a file path, or a table row of the SQLite store."""

    path: str
    table: str | None = None
    row: str | None = None

    def __str__(self) -> str:
        return f"{self.path} [{self.table} {self.row!r}]" if self.table else self.path


@dataclass(frozen=True, slots=True)
class LoadIssue:
    source: Source
    message: str
    severity: str = "warning"  # "warning" | "error"

    def __str__(self) -> str:
        return f"{self.source}: {self.message}"


@dataclass(frozen=True, slots=True)
class StoredDoc:
    key: DocKey
    value: DocValue
    source: Source
    digest: str  # identity of the stored content; equal digests mean an unchanged document
    issues: tuple[LoadIssue, ...] = ()  # non-fatal notes (newer version, duplicate column, ...)


@dataclass(slots=True)
class StoreRead:
    """One complete read of a store."""

    location: StoreLocation
    docs: dict[DocKey, StoredDoc] = field(default_factory=dict)
    issues: list[LoadIssue] = field(default_factory=list)  # documents that did not load at all
    fatal: str | None = None  # the store as a whole could not be read (missing, locked, corrupt)
    unchanged: bool = False  # the store is known not to have changed since the previous read
    # what changed since the read before: ``docs`` holds the same documents as ``since`` (the docs of
    # that read, the very object) except under the keys of ``touched``. A snapshot derived from that
    # read then compares only those, not every document of the store (None: compare them all)
    since: dict[DocKey, StoredDoc] | None = None
    touched: frozenset[DocKey] = frozenset()


# --------------------------------------------------------------------------- decoding


def _version_issue(source: Source, kind: str, version: int) -> tuple[LoadIssue, ...]:
    note = d.check_version(kind, version)
    return (LoadIssue(source, note),) if note else ()


_COLUMN_NAME = attrgetter("name")
_COLUMN_TYPE = attrgetter("type")


def _finish_model(model: d.Model, source: Source) -> tuple[d.Model, tuple[LoadIssue, ...]]:
    """Normalise column types and drop duplicate leaf names (first wins), noting each."""
    issues = list(_version_issue(source, "SlayerModel", model.version))
    names = list(map(_COLUMN_NAME, model.columns))
    seen = set(names)
    # what nearly every model is, checked in C: unique names, types spelled as SLayer spells them
    if len(seen) < len(names) or not all(map(d.DATA_TYPES.__contains__, map(_COLUMN_TYPE, model.columns))):
        model, seen = _finish_columns(model, source, issues)
    for m in model.measures:
        if m.name and m.name in seen:
            issues.append(
                LoadIssue(source, f"model '{model.name}': measure '{m.name}' has the name of a column")
            )
    return model, tuple(issues)


def _finish_columns(model: d.Model, source: Source, issues: list[LoadIssue]) -> tuple[d.Model, set[str]]:
    """The model with its columns' duplicates dropped and types normalised (each duplicate noted in
    ``issues``), and the names it keeps."""
    seen: set[str] = set()
    columns: list[d.Column] = []
    for col in model.columns:
        if col.name in seen:
            issues.append(
                LoadIssue(
                    source,
                    f"model '{model.name}' has duplicate column '{col.name}'; the first definition is used",
                )
            )
            continue
        seen.add(col.name)
        norm = d.normalise_type(col.type)
        columns.append(col if norm == col.type else msgspec.structs.replace(col, type=norm))
    if columns != model.columns:
        model = msgspec.structs.replace(model, columns=columns)
    return model, seen


def decode_model(data: Any, source: Source, *, strict: bool) -> tuple[d.Model, tuple[LoadIssue, ...]]:
    model = msgspec.convert(data, d.Model, strict=strict)
    return _finish_model(model, source)


def split_front_matter(text: str) -> tuple[dict[str, Any] | None, str]:
    """Split a memory file into its YAML front matter and the learning (the body, verbatim)."""
    if not text.startswith("---\n"):
        return None, text
    end = text.find("\n---\n", 3)
    if end < 0:
        if text.endswith("\n---"):
            end = len(text) - 4
            front = _load_yaml(text[4:end])
            return (front if isinstance(front, dict) else {}), ""
        return None, text
    front = _load_yaml(text[4:end])
    return (front if isinstance(front, dict) else {}), text[end + 5 :]


# --------------------------------------------------------------------------- YAML backend


# (inode, size, mtime_ns, ctime_ns) of the file last read, or () when it could not be stat'ed.
_StatKey = tuple[int, int, int, int] | tuple[()]


log = logging.getLogger(__name__)

PARALLEL_PARSE_MIN = 2000  # files to parse before worker processes pay for their start (~0.3 s each)
PARALLEL_PARSE_WORKERS = 4


def _cache_entry(doc: StoredDoc, path: str, stat: Any = (0, 0, 0, 0), row: str | None = None) -> Any:
    """A parsed document as the on-disk cache records it (``store.cache.CachedDoc``)."""
    from slayer_lsp.store.cache import CachedDoc

    v = doc.value
    return CachedDoc(
        path,
        stat,
        doc.key.kind,
        doc.key.name,
        doc.digest,
        model=v if isinstance(v, d.Model) else None,
        datasource=v if isinstance(v, d.Datasource) else None,
        memory=v if isinstance(v, d.Memory) else None,
        priority=list(v) if isinstance(v, tuple) else None,
        issues=[(i.message, i.severity) for i in doc.issues],
        row=row,
    )


def _from_cache_entry(e: Any, source: Source) -> StoredDoc | None:
    """The document a cache entry records (None for an entry with no value)."""
    value = e.model or e.datasource or e.memory or (tuple(e.priority) if e.priority is not None else None)
    if value is None:
        return None
    issues = tuple(LoadIssue(source, msg, sev) for msg, sev in e.issues)
    return StoredDoc(DocKey(e.kind, e.name), value, source, e.digest, issues)


class YamlReader:
    """Reads ``datasources/*.yaml``, ``models/<ds>/*.yaml``, ``memories/*.md`` and ``priority.yaml``."""

    def __init__(self, location: StoreLocation):
        self.location = location
        self.root = location.path
        # path -> (stat key, doc or None, issues)
        self._cache: dict[str, tuple[_StatKey, StoredDoc | None, tuple[LoadIssue, ...]]] = {}
        self._retained: set[str] = (
            set()
        )  # paths whose cached doc is the last good one of a file that now fails
        self._listed: dict[str, Any] | None = None  # the last listing: path -> parser
        self._listing_issues: list[LoadIssue] = []  # directories the last listing refused (links, ...)
        self._last: StoreRead | None = None  # the last complete read
        self._won: dict[str, DocKey] = {}  # path -> the key its document holds in the last read
        self._lost = False  # a file lost a duplicate key to another in the last full read

    def read(self, changed: Iterable[str] | None = None) -> StoreRead:
        """Read the whole store. With ``changed`` (paths a file watcher reported), only those paths
        are looked at again and the previous listing is reused, so a one-file edit costs one stat and
        one parse instead of a stat per file."""
        out = StoreRead(self.location)
        if not self.root.is_dir():
            out.fatal = (
                f"store directory {self.root} does not exist"
                if not self.root.exists()
                else f"{self.root} is not a directory"
            )
            self._listed = None
            return out
        recheck: set[str] | None = None
        if changed is not None and self._listed is not None:
            listed = dict(self._listed)
            recheck = {str(p) for p in changed}
            added: list[str] = []
            removed: list[str] = []
            for path in recheck:
                parse = self._parser_for(path)
                if parse is None:
                    continue
                exists = os.path.lexists(path)  # a link or a FIFO is listed too: its load refuses it
                if exists != (path in listed):  # a file appeared or went away; an edit keeps the order
                    (added if exists else removed).append(path)
                if exists:
                    listed[path] = parse
                else:
                    listed.pop(path, None)
            reorder = bool(added or removed)
            quick = self._edited(recheck, listed, added, removed)
            if quick is not None:
                return quick
            entries = (
                sorted(listed.items(), key=lambda kv: self._order_key(kv[0]))
                if reorder
                else list(listed.items())
            )
        else:
            entries = list(self._listing())
            self._parse_in_parallel([path for path, _ in entries if path not in self._cache])
        self._listed = dict(entries)
        out.issues.extend(self._listing_issues)
        live: set[str] = set()
        won: dict[str, DocKey] = {}
        lost = False
        for path, parse in entries:
            live.add(path)
            if recheck is not None and path not in recheck and path in self._cache:
                _, doc, issues = self._cache[path]  # the watcher says this file did not change
            else:
                doc, issues = self._load(path, parse)
            out.issues.extend(i for i in issues if doc is None or path in self._retained)
            if doc is None:
                continue
            prev = out.docs.get(doc.key)
            if prev is not None:
                out.issues.append(
                    LoadIssue(
                        doc.source,
                        f"{doc.key.kind} '{doc.key.name}' is also defined in "
                        f"{prev.source}; the first is used",
                    )
                )
                lost = True
                continue
            out.docs[doc.key] = doc
            won[path] = doc.key
        for stale in set(self._cache) - live:
            del self._cache[stale]
        self._retained &= live
        self._last, self._won, self._lost = out, won, lost
        return out

    def _edited(
        self, paths: set[str], listed: dict[str, Any], added: list[str], removed: list[str]
    ) -> StoreRead | None:
        """The last read with the documents of ``paths`` read again, when that is all the change
        does: every edited path still holds the key it held, every path loads cleanly and loaded
        cleanly before, a new file brings a key no file holds, and no file lost a duplicate key in
        the last read (so which file wins each key, and the issues, are as they were). A new
        document takes its place in the listing's order by a binary search over it. None
        otherwise: the whole listing is then gone through again."""
        last = self._last
        if last is None or ((added or removed) and self._lost):
            return None
        docs = dict(last.docs)
        won = dict(self._won) if added or removed else self._won
        touched: set[DocKey] = set()
        for path in removed:
            key = won.pop(path, None)
            if key is None or path in self._retained:
                return None
            del docs[key]
            touched.add(key)
        new: list[tuple[str, StoredDoc]] = []
        for path in paths:
            parse = listed.get(path)
            if parse is None:  # not a store document, or gone
                continue
            key = won.get(path)
            if key is None and path not in added or path in self._retained:
                return None
            doc, _ = self._load(path, parse)
            if doc is None or path in self._retained:
                return None
            if key is None:  # a new file
                if doc.key in docs or any(doc.key == other.key for _, other in new):
                    return None
                new.append((path, doc))
            elif doc.key != key:
                return None
            else:
                docs[key] = doc
                touched.add(key)
        if new:  # keys and values apart, joined by one dict(zip()): 30,000 pairs as tuples cost 30 ms
            keys, values = list(docs), list(docs.values())
            for path, doc in new:
                at = bisect_right(values, self._order_key(path), key=lambda v: self._order_key(v.source.path))
                keys.insert(at, doc.key)
                values.insert(at, doc)
                won[path] = doc.key
                touched.add(doc.key)
            docs = dict(zip(keys, values, strict=True))
        if added or removed:
            fresh = set(added)
            order = [p for p in listed if p not in fresh]  # the listing's order, less what went
            for path in added:
                order.insert(bisect_right(order, self._order_key(path), key=self._order_key), path)
            self._listed = dict(zip(order, map(listed.__getitem__, order), strict=True))
            for path in removed:
                self._cache.pop(path, None)
            self._won = won
        out = StoreRead(self.location, docs, list(last.issues), since=last.docs, touched=frozenset(touched))
        self._last = out
        return out

    def _parser_for(self, path: str) -> Any:
        """Which parser a store path needs, or None when it is not a store document (temp files,
        the lock file, the embeddings sidecar, ...)."""
        p = Path(path)
        if p.name.startswith(".") and not (p.parent.name == "memories" and p.name.endswith(".md")):
            return None  # temp files; SLayer's memory listing takes every *.md, dotted ones too
        rel = safefs.relative_parts(self.root, p)
        if rel is None:  # outside the store, or spelled with "." / "..": never a store document
            return None
        if rel == ("priority.yaml",):
            return self._parse_priority
        if len(rel) == 2 and rel[0] == "datasources" and p.suffix in (".yaml", ".yml"):
            return self._parse_datasource
        if (
            len(rel) == 3
            and rel[0] == "models"
            and not rel[1].startswith(".")
            and p.suffix in (".yaml", ".yml")
        ):
            return self._parse_model
        if len(rel) == 2 and rel[0] == "memories" and p.suffix == ".md":
            return self._parse_memory
        return None

    def _order_key(self, path: str) -> tuple:
        """The full listing's order: datasources, models by directory then name, memories, priority."""
        rel = path[len(str(self.root)) + 1 :].split(os.sep)
        rank = {"datasources": 0, "models": 1, "memories": 2}.get(rel[0], 3)
        return (rank, *rel[1:])

    # ------------------------------------------------------------------ parse cache (see cache.py)

    def _parse_in_parallel(self, paths: list[str]) -> None:
        """Parse many files on every core before the read walks them (a cold start of a large
        store is mostly YAML parsing, which holds the GIL): worker processes parse slices of the
        paths and send back what ``export_parsed`` gives, which seeds the cache; the read then only
        stats each file. A file a worker could not load is simply loaded again here, with its issue.
        Workers are plain ``python -m`` processes (stdout is the parent's pipe, never its stdout)."""
        workers = min(PARALLEL_PARSE_WORKERS, os.cpu_count() or 1)
        if workers < 2 or len(paths) < PARALLEL_PARSE_MIN:
            return
        import subprocess
        import sys

        from slayer_lsp.store.cache import CachedDoc

        procs: list[subprocess.Popen[bytes]] = []
        try:
            for k in range(workers):
                proc = subprocess.Popen(
                    [sys.executable, "-m", "slayer_lsp.store.parse_worker"],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                )
                procs.append(proc)
                assert proc.stdin is not None
                proc.stdin.write(msgspec.msgpack.encode((str(self.root), paths[k::workers])))
                proc.stdin.close()
            for proc in procs:
                assert proc.stdout is not None
                blob = proc.stdout.read()
                if proc.wait() == 0:
                    self.import_parsed(msgspec.msgpack.decode(blob, type=list[CachedDoc]))
        except Exception as exc:  # noqa: BLE001 - what the workers did not parse is parsed here
            log.warning("parallel parse failed (%s); parsing in one process", exc)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()

    def parsed_state(self) -> frozenset[tuple[str, _StatKey]]:
        """What ``export_parsed`` would record, as (path, stat key) pairs: equal states export equal
        documents, so an unchanged cache need not be written again."""
        return frozenset(
            (path, key)
            for path, (key, doc, _issues) in self._cache.items()
            if doc is not None and path not in self._retained and key
        )

    def export_parsed(self) -> list[Any]:
        """The parsed documents with the stat key of their file, for the on-disk cache."""
        return [
            _cache_entry(doc, path, key)
            for path, (key, doc, _issues) in self._cache.items()
            if doc is not None and path not in self._retained and key  # no stat key: failed, retained
        ]

    def import_parsed(self, entries: list[Any]) -> None:
        """Seed the stat-key cache; a file whose stat key still matches is not parsed again."""
        for e in entries:
            doc = _from_cache_entry(e, Source(e.path))
            if doc is not None:
                self._cache[e.path] = (e.stat, doc, doc.issues)

    def _listing(self) -> Iterable[tuple[str, Any]]:
        """Every path that names a store document, whatever its type: a link, FIFO or device under a
        document's name is listed so that its load refuses it with an issue. Directories that are
        links are refused here (their content is never listed)."""
        root = self.root
        issues: list[LoadIssue] = []
        yield from (
            (p, self._parse_datasource) for p in _files(root / "datasources", (".yaml", ".yml"), issues)
        )
        for ds_dir in _dirs(root / "models", issues):
            yield from ((p, self._parse_model) for p in _files(Path(ds_dir), (".yaml", ".yml"), issues))
        yield from (
            (p, self._parse_memory) for p in _files(root / "memories", (".md",), issues, dotfiles=True)
        )
        prio = root / "priority.yaml"
        if os.path.lexists(prio):
            yield str(prio), self._parse_priority
        self._listing_issues = issues

    def _load(self, path: str, parse: Any) -> tuple[StoredDoc | None, tuple[LoadIssue, ...]]:
        source = Source(path)
        cached = self._cache.get(path)
        try:
            st = os.stat(path, follow_symlinks=False)
        except OSError as exc:  # gone since the listing (deleted, or being re-created)
            return self._failed(path, cached, (), (LoadIssue(source, f"cannot stat: {exc.strerror or exc}"),))
        key = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        if cached is not None and cached[0] == key and stat.S_ISREG(st.st_mode):
            return cached[1], cached[2]
        try:
            parts = safefs.relative_parts(self.root, path)
            if parts is None:
                raise safefs.Refused("is not inside the store")
            # no link followed below the root, nothing but a regular file opened, the size bounded:
            # the key is that of the inode actually read
            st, raw = safefs.read_store_file(self.root, parts, MAX_DOCUMENT_BYTES)
            key = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
            text = raw.decode("utf-8")
            doc = parse(path, text, source)
        except safefs.Refused as exc:
            problem = LoadIssue(source, str(exc), "error")
        except UnicodeDecodeError as exc:
            problem = LoadIssue(source, f"not UTF-8 text ({exc.reason} at byte {exc.start})", "error")
        except yaml.YAMLError as exc:
            problem = LoadIssue(source, f"invalid YAML: {_yaml_reason(exc)}", "error")
        except (msgspec.ValidationError, ValueError, TypeError) as exc:
            problem = LoadIssue(source, f"cannot be loaded: {exc}", "error")
        except OSError as exc:
            problem = LoadIssue(source, f"cannot be read: {exc.strerror or exc}", "error")
        except (RecursionError, MemoryError) as exc:
            problem = LoadIssue(source, f"cannot be loaded: {type(exc).__name__}", "error")
        except Exception as exc:  # noqa: BLE001 - one document never takes the store down
            problem = LoadIssue(source, f"cannot be loaded: {type(exc).__name__}: {exc}", "error")
        else:
            self._retained.discard(path)
            self._cache[path] = (key, doc, doc.issues)
            return doc, doc.issues
        return self._failed(path, cached, key, (problem,))

    def _failed(
        self, path: str, cached: Any, key: _StatKey, issues: tuple[LoadIssue, ...]
    ) -> tuple[StoredDoc | None, tuple[LoadIssue, ...]]:
        """A file that does not load now. If it loaded before, its last good document stays (the
        issues say so); the entry is keyed by the failing file's stat (``()`` when it has none), so
        the next change of the file is read again."""
        last_good = cached[1] if cached is not None else None
        if last_good is not None:
            issues = tuple(
                LoadIssue(i.source, f"{i.message}; serving its last good version", i.severity) for i in issues
            )
            self._retained.add(path)
        self._cache[path] = (key, last_good, issues)
        return last_good, issues

    @staticmethod
    def _digest(text: str) -> str:
        return hashlib.blake2b(text.encode("utf-8"), digest_size=16).hexdigest()

    def _parse_datasource(self, path: str, text: str, source: Source) -> StoredDoc:
        data = _load_yaml(text)
        if not isinstance(data, dict):
            raise ValueError("expected a mapping at the top level")
        data.setdefault("name", Path(path).stem)
        ds = msgspec.convert(data, d.Datasource, strict=False)
        issues = _version_issue(source, "DatasourceConfig", ds.version)
        return StoredDoc(DocKey("datasource", ds.name), ds, source, self._digest(text), issues)

    def _parse_model(self, path: str, text: str, source: Source) -> StoredDoc:
        data = _load_yaml(text)
        if not isinstance(data, dict):
            raise ValueError("expected a mapping at the top level")
        p = Path(path)
        data.setdefault("name", p.stem)
        data.setdefault("data_source", p.parent.name)
        model, issues = decode_model(data, source, strict=False)
        if model.data_source != p.parent.name or model.name != p.stem:
            issues += (
                LoadIssue(
                    source,
                    f"file defines model '{model.data_source}.{model.name}', not "
                    f"'{p.parent.name}.{p.stem}' as its path says",
                ),
            )
        if p.suffix == ".yml":
            issues += (
                LoadIssue(
                    source,
                    "SLayer lists '.yml' model files but only opens '.yaml'; rename "
                    "it so SLayer can load this model",
                ),
            )
        key = DocKey("model", f"{model.data_source}.{model.name}")
        return StoredDoc(key, model, source, self._digest(text), issues)

    def _parse_memory(self, path: str, text: str, source: Source) -> StoredDoc:
        front, body = split_front_matter(text)
        issues: tuple[LoadIssue, ...] = ()
        if front is None:
            front = {}
            issues = (LoadIssue(source, "memory file has no YAML front matter; read as learning only"),)
        front["id"] = Path(path).stem
        body, cut = _bounded_learning(body, source)
        issues += cut
        front["learning"] = body
        mem = msgspec.convert(front, d.Memory, strict=False)
        issues += _version_issue(source, "Memory", mem.version)
        return StoredDoc(DocKey("memory", mem.id), mem, source, self._digest(text), issues)

    def _parse_priority(self, path: str, text: str, source: Source) -> StoredDoc:
        data = _load_yaml(text) or {}
        items = data.get("priority", []) if isinstance(data, dict) else data
        if not isinstance(items, list):
            raise ValueError("'priority' must be a list of datasource names")
        return StoredDoc(PRIORITY_KEY, tuple(str(x) for x in items), source, self._digest(text))


MAX_FLOW_DEPTH = 1000  # libyaml's parse time grows with the square of the flow nesting depth
_BRACKETS = re.compile(r"[\[\]{}]")


def _load_yaml(text: str) -> Any:
    """``fastyaml.load``, refusing ``[[[[...`` nested deeper than any store document could be first:
    libyaml takes minutes on a few hundred kilobytes of it. Only a text with that many opening
    brackets is scanned."""
    if text.count("[") + text.count("{") > MAX_FLOW_DEPTH:
        depth = 0
        for m in _BRACKETS.finditer(text):
            depth = depth + 1 if m.group() in "[{" else max(depth - 1, 0)
            if depth > MAX_FLOW_DEPTH:
                raise ValueError(f"flow collections nested deeper than {MAX_FLOW_DEPTH} levels")
    return fastyaml.load(text)


def _yaml_reason(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    if mark is not None:
        return f"{problem} (line {mark.line + 1}, column {mark.column + 1})"
    return problem


def _bounded_learning(body: str, source: Source) -> tuple[str, tuple[LoadIssue, ...]]:
    """A learning cut at ``MAX_LEARNING_CHARS`` (with a warning): what a planted giant memory costs
    the indexes stays bounded, and the stored document is left as it is."""
    if len(body) <= MAX_LEARNING_CHARS:
        return body, ()
    return body[:MAX_LEARNING_CHARS], (
        LoadIssue(
            source, f"learning is {len(body)} characters long; only the first {MAX_LEARNING_CHARS} are kept"
        ),
    )


def _entries(directory: Path, issues: list[LoadIssue]) -> list[os.DirEntry[str]]:
    """A store directory's entries; a link in its place (or anything but a directory) is refused
    with an issue and lists nothing."""
    try:
        st = os.stat(directory, follow_symlinks=False)
    except (FileNotFoundError, NotADirectoryError):
        return []
    if not stat.S_ISDIR(st.st_mode):
        issues.append(LoadIssue(Source(str(directory)), safefs.refusal(safefs.kind_of(st.st_mode)), "error"))
        return []
    try:
        with os.scandir(directory) as it:
            return sorted(it, key=lambda e: e.name)
    except (FileNotFoundError, NotADirectoryError):
        return []


def _files(
    directory: Path, suffixes: tuple[str, ...], issues: list[LoadIssue], dotfiles: bool = False
) -> list[str]:
    """Entries with these suffixes that are not directories, sorted; dotfiles (SLayer's temp files)
    are skipped unless asked for (its temp names never end in a document suffix:
    ``.<name>.tmp.<random>``)."""
    return [
        e.path
        for e in _entries(directory, issues)
        if (dotfiles or not e.name.startswith("."))
        and e.name.endswith(suffixes)
        and not e.is_dir(follow_symlinks=False)
    ]


def _dirs(directory: Path, issues: list[LoadIssue]) -> list[str]:
    """Real subdirectories; a link among them is refused with an issue (a link to a directory
    would load another tree's files as models)."""
    out = []
    for e in _entries(directory, issues):
        if e.name.startswith("."):
            continue
        if e.is_symlink():
            issues.append(LoadIssue(Source(e.path), safefs.refusal("a symbolic link"), "error"))
        elif e.is_dir(follow_symlinks=False):
            out.append(e.path)
    return out


# --------------------------------------------------------------------------- SQLite backend

_Decoded = tuple[StoredDoc | None, tuple[LoadIssue, ...]]  # a row's document, or its load issues


class SqliteReader:
    """Reads the ``datasources``, ``models``, ``memories`` and ``settings`` tables in one short,
    read-only transaction (never migrating the schema), re-reading only the rows whose text changed
    (``sqlite_rows.RowMirror``). The one write it may cause is SQLite's own: rolling back the hot
    journal of a writer that died mid-transaction."""

    def __init__(self, location: StoreLocation, busy_timeout: float = 2.0):
        self.location = location
        self.busy_timeout = busy_timeout
        self._mirror = sqlite_rows.RowMirror(location.path, busy_timeout)
        # table -> key columns -> (row name, document, issues): what the mirror's texts decode to, in
        # key order
        self._rows: dict[str, dict[tuple[str, ...], _Decoded]] = {}
        self._last: StoreRead | None = None  # the previous complete read, and the change counter it saw
        self._counter: int | None = None
        # (table, key) -> the on-disk cache's entry: a row whose text has its digest is not parsed
        self._seed: dict[tuple[str, str], Any] = {}

    def close(self) -> None:
        self._mirror.close()

    def read(self) -> StoreRead:
        out = StoreRead(self.location)
        path = self.location.path
        if not path.is_file():
            out.fatal = f"store file {path} does not exist"
            self._forget()
            return out
        last = self._last
        if last is not None and own_writes.only_ours(path, self._counter, own_writes.change_counter(path)):
            # nothing, or only our own vector writes, since the last read: the rows are as they were
            self._counter = own_writes.change_counter(path)
            return StoreRead(self.location, last.docs, list(last.issues), unchanged=True)
        self._last = None
        try:
            found = self._mirror.read()
        except (sqlite3.DatabaseError, OSError) as exc:
            self._forget()
            out.fatal = f"cannot read SQLite store {path}: {exc}"
            return out
        self._counter = found.counter
        touched: set[DocKey] = set()
        for name, table in found.tables.items():
            touched |= self._apply(name, table)
        self._seed = {}  # what it did not serve is gone from the store
        for name in [n for n in self._rows if n not in found.tables]:
            del self._rows[name]  # the settings table was dropped
        for table_rows in self._rows.values():
            for doc, issues in table_rows.values():
                if doc is None:
                    out.issues.extend(issues)
                elif doc.key in out.docs:
                    out.issues.append(
                        LoadIssue(doc.source, f"{doc.key.kind} '{doc.key.name}' is stored twice")
                    )
                else:
                    out.docs[doc.key] = doc
        if last is not None:
            out.since, out.touched = last.docs, frozenset(touched)
        self._last = out
        return out

    def parsed_state(self) -> frozenset[tuple[str, str, str]]:
        """What ``export_parsed`` would record, as (table, key, digest) triples (before the first
        read: what the cache seeded)."""
        if not self._rows and self._seed:
            return frozenset((table, key, e.digest) for (table, key), e in self._seed.items())
        return frozenset(
            (doc.source.table or "", doc.source.row or "", doc.digest)
            for table_rows in self._rows.values()
            for doc, _issues in table_rows.values()
            if doc is not None
        )

    def export_parsed(self) -> list[Any]:
        """The decoded rows, for the on-disk cache."""
        return [
            _cache_entry(doc, doc.source.table or "", row=doc.source.row)
            for table_rows in self._rows.values()
            for doc, _issues in table_rows.values()
            if doc is not None
        ]

    def import_parsed(self, entries: list[Any]) -> None:
        """Seed the next read: a row whose text still has the recorded digest is not decoded again."""
        self._seed = {(e.path, e.row): e for e in entries if e.row is not None}

    def _forget(self) -> None:
        self._mirror.close()
        self._rows.clear()
        self._last = None

    def _apply(self, name: str, found: sqlite_rows.TableRows) -> set[DocKey]:
        """Bring one table's decoded rows up to what the mirror found; returns the keys of the
        documents those rows held before and hold now (a table read whole: all of them)."""
        if found.whole:
            old = self._rows.get(name, {})
            self._rows[name] = new = {row.parts: self._decode(row) for row in found.rows}
            return {doc.key for doc, _ in (*old.values(), *new.values()) if doc is not None}
        touched: set[DocKey] = set()
        rows = self._rows.setdefault(name, {})
        for parts in found.removed:
            doc, _ = rows.pop(parts, (None, ()))
            if doc is not None:
                touched.add(doc.key)
        added = False
        for row in found.rows:
            before = rows.get(row.parts)
            added = added or before is None
            if before is not None and before[0] is not None:
                touched.add(before[0].key)
            rows[row.parts] = decoded = self._decode(row)
            if decoded[0] is not None:
                touched.add(decoded[0].key)
        if added:  # keep SQLite's key order (code points order as UTF-8 bytes do)
            self._rows[name] = dict(sorted(rows.items()))
        return touched

    def _decode(self, row: sqlite_rows.Row) -> _Decoded:
        """One row on its own: whatever it holds, it is a document or a load issue naming the row."""
        source = Source(str(self.location.path), row.table, row.key)
        if row.bad_key is not None:
            return None, (LoadIssue(source, f"row has {row.bad_key}; not loaded", "error"),)
        if row.kind != "text":
            return None, (
                LoadIssue(
                    source,
                    f"{_DATA[row.table]} is {sqlite_rows.sql_kind(row.kind)}, not JSON text",
                    "error",
                ),
            )
        text = row.text
        if text is None:
            return None, (LoadIssue(source, safefs.too_large(row.size, MAX_DOCUMENT_BYTES), "error"),)
        digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()
        seeded = self._seed.pop((row.table, row.key), None) if self._seed else None
        if seeded is not None and seeded.digest == digest:
            doc = _from_cache_entry(seeded, source)
            if doc is not None:
                return doc, doc.issues
        try:
            check_json_nesting(text)  # before msgspec's decoder recurses into it
            doc = self._parse(row.table, row.key, text, source, digest)
            return doc, doc.issues
        except (msgspec.ValidationError, msgspec.DecodeError, ValueError, TypeError) as exc:
            return None, (LoadIssue(source, f"cannot be loaded: {exc}", "error"),)
        except Exception as exc:  # noqa: BLE001 - one row never takes the store down
            return None, (LoadIssue(source, f"cannot be loaded: {type(exc).__name__}: {exc}", "error"),)

    @staticmethod
    def _parse(table: str, row_key: str, text: str, source: Source, digest: str) -> StoredDoc:
        if table == "datasources":
            ds = msgspec.json.decode(text, type=d.Datasource, strict=False)
            return StoredDoc(
                DocKey("datasource", ds.name),
                ds,
                source,
                digest,
                _version_issue(source, "DatasourceConfig", ds.version),
            )
        if table == "models":
            # decoded straight into the struct, as lax as ``decode_model``'s conversion (a dict of the
            # row first cost 0.5 s more at 10,000 models); a row it refuses is converted as before,
            # so that the error is the one the whole text earns (malformed JSON, not a wrong type)
            try:
                decoded = msgspec.json.decode(text, type=d.Model, strict=False)
            except (msgspec.ValidationError, msgspec.DecodeError):
                model, issues = decode_model(msgspec.json.decode(text), source, strict=False)
            else:
                model, issues = _finish_model(decoded, source)
            return StoredDoc(
                DocKey("model", f"{model.data_source}.{model.name}"), model, source, digest, issues
            )
        if table == "memories":
            mem = msgspec.json.decode(text, type=d.Memory, strict=False)
            if not mem.id:
                mem = msgspec.structs.replace(mem, id=row_key)
            learning, issues = _bounded_learning(mem.learning, source)
            if issues:
                mem = msgspec.structs.replace(mem, learning=learning)
            return StoredDoc(
                DocKey("memory", mem.id),
                mem,
                source,
                digest,
                issues + _version_issue(source, "Memory", mem.version),
            )
        items = msgspec.json.decode(text)
        if not isinstance(items, list):
            raise ValueError("datasource_priority must be a JSON list")
        return StoredDoc(PRIORITY_KEY, tuple(str(x) for x in items), source, digest)


_DATA = {"datasources": "data", "models": "data", "memories": "data", "settings": "value"}


def parse_paths(root: str, paths: list[str]) -> bytes:
    """A worker's part of ``YamlReader._parse_in_parallel`` (``store/parse_worker.py``): parse
    ``paths`` of the YAML store at ``root``, return the cache entries (msgpack)."""
    reader = YamlReader(locate(root))
    for path in paths:
        parse = reader._parser_for(path)  # the same class, in another process
        if parse is not None:
            reader._load(path, parse)
    return msgspec.msgpack.encode(reader.export_parsed())


# --------------------------------------------------------------------------- entry points


class StoreReader:
    """The reader for one store location, reusing parses across reads (and, for YAML stores, across
    processes through the on-disk cache when ``use_cache`` is set)."""

    def __init__(
        self, storage: str | os.PathLike[str] | StoreLocation | None = None, *, use_cache: bool = False
    ):
        self.location = storage if isinstance(storage, StoreLocation) else locate(storage)
        self._impl = (
            YamlReader(self.location) if self.location.backend == "yaml" else SqliteReader(self.location)
        )
        self._cache = None
        self._saved: frozenset[Any] | None = None  # the parsed state the cache holds
        if use_cache:
            from slayer_lsp.store.cache import StoreCache

            self._cache = StoreCache.for_location(self.location)
        self._loaded = self._cache is None  # the cache is read by the first read (see ``read``)

    def close(self) -> None:
        """Let go of what the reader keeps open between reads (a SQLite store's connection); a read
        after this opens it again."""
        if isinstance(self._impl, SqliteReader):
            self._impl.close()

    def save_cache(self, *, background: bool = False) -> None:
        """Record the parsed documents, unless the cache already holds exactly these (``background``:
        written on a thread, which ``flush`` waits for)."""
        if self._cache is not None:
            state = self._impl.parsed_state()
            if state != self._saved:
                self._cache.save_docs(self._impl.export_parsed(), background=background)
                self._saved = state

    def flush(self) -> None:
        """Wait for the cache writes started so far."""
        if self._cache is not None:
            self._cache.flush()

    def read(
        self, changed: Iterable[str] | None = None, before_listing: Callable[[], object] | None = None
    ) -> StoreRead:
        """Read the store; ``changed`` optionally names the paths a watcher saw change (a hint: the
        YAML reader then skips the full listing; the SQLite reader always reads every row).
        ``before_listing`` runs once the parse cache is loaded, before the store is looked at."""
        if not self._loaded:
            # here rather than at construction: the first read runs as part of the engine's first
            # build, with the cyclic GC paused (decoding 400,000 columns with it running took 4 times
            # as long)
            self._loaded = True
            assert self._cache is not None
            self._impl.import_parsed(self._cache.load_docs())
            self._saved = self._impl.parsed_state()
        if before_listing is not None:
            before_listing()
        try:
            if isinstance(self._impl, YamlReader):
                return self._impl.read(changed)
            return self._impl.read()
        except OSError as exc:  # the directory vanished mid-scan, permissions, ...
            out = StoreRead(self.location)
            out.fatal = f"cannot read store {self.location.path}: {exc}"
            return out


def read_store(storage: str | os.PathLike[str] | StoreLocation | None = None) -> StoreRead:
    return StoreReader(storage).read()
