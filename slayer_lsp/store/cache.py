"""The on-disk cache that makes a second start on an unchanged store fast.

Two things are cached per store (keyed by the store's backend and resolved path), under
``$SLAYER_LSP_CACHE_DIR`` or ``$XDG_CACHE_HOME/slayer-lsp`` (``SLAYER_LSP_CACHE=off`` disables it):

* ``docs.msgpack`` — the YAML reader's parsed documents with the stat key of the file each came from;
  a file whose stat key is unchanged is not parsed again.
* ``fulltext-*/`` + ``fulltext.msgpack`` — the tantivy index and a manifest (the commit opstamp and a
  digest per document); at start the index is reopened and only documents whose rendered text changed
  are re-indexed.
* ``datasource-<key>-*/`` + ``datasource-<key>.msgpack`` — the same, for each datasource's own index
  (``<key>``: a digest of the datasource's name); reopened when a question or the warm-up first needs
  that datasource, so a restart does not index the datasources apart again.

The cache is never trusted blindly: each file carries a format version and the store's identity,
the manifest must name the index's current commit, and anything that fails to decode or disagrees
is discarded and rebuilt. Writes go to a temporary file replaced atomically, so a crash leaves the
old cache or the new one, never half of one.

The cache is an optimisation, never a dependency: a file that cannot be written (full disk, a value
the encoder refuses, larger than ``MAX_CACHE_BYTES``) is skipped with a warning and the process serves
from memory; a file that is too large or does not decode at load is discarded and rebuilt.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Protocol, TypeVar

import msgspec

from slayer_lsp.store import documents as d
from slayer_lsp.store.limits import MAX_CACHE_BYTES
from slayer_lsp.store.locate import StoreLocation

log = logging.getLogger(__name__)

# 2: documents bounded by store.limits (a cache of format 1 may hold unbounded ones); 3: index
# manifests as parallel lists (a dict of 400,000 tuples took a quarter second to decode); 4: rendered
# texts grouped by stored document
FORMAT = 4


def cache_dir(location: StoreLocation) -> Path | None:
    if os.environ.get("SLAYER_LSP_CACHE", "").lower() in ("off", "0", "false", "no"):
        return None
    base = os.environ.get("SLAYER_LSP_CACHE_DIR")
    if not base:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        base = os.path.join(xdg, "slayer-lsp")
    ident = f"{location.backend}:{location.path.resolve()}"
    key = hashlib.blake2b(ident.encode(), digest_size=8).hexdigest()
    return Path(base) / f"{location.path.name or 'store'}-{key}"


# --------------------------------------------------------------------------- parsed documents


class CachedDoc(msgspec.Struct, array_like=True):
    """One parsed document: of a YAML file (its path and stat key), or of a SQLite row (``path`` is
    the table, ``row`` the key; the digest of the row's text decides)."""

    path: str
    stat: tuple[int, int, int, int]
    kind: str
    name: str
    digest: str
    model: d.Model | None = None
    datasource: d.Datasource | None = None
    memory: d.Memory | None = None
    priority: list[str] | None = None
    issues: list[tuple[str, str]] = []
    row: str | None = None


class DocCacheFile(msgspec.Struct):
    format: int
    store: str
    docs: list[CachedDoc]


class TextManifest(msgspec.Struct):
    format: int
    store: str
    directory: str
    opstamp: int
    names: list[str]  # fast-field key -> canonical
    members: list[int]  # the key of each indexed document
    digests: list[str]  # the text digest of each, in the same order
    memories: list[int]  # the positions in ``members`` of the memories' documents
    deletions: int = 0  # documents replaced or deleted since the index was built (still in its BM25)
    datasource: str = ""  # the datasource whose own index this is ("": the whole store's)


class Stamped(Protocol):
    """A cache file: it says which format and store it was written for (a value is trusted only
    when both match)."""

    format: int
    store: str


_CacheFile = TypeVar("_CacheFile", bound=Stamped)


@cache
def code_stamp(*modules: ModuleType) -> str:
    """A digest of this version and of the source of ``modules``: what a cache file of values
    computed by that code records, so that an upgrade changing any of them computes them anew (the
    same stored bytes may read differently after one)."""
    from slayer_lsp import __version__

    h = hashlib.blake2b(__version__.encode(), digest_size=12)
    for module in modules:
        h.update(Path(module.__file__ or "").read_bytes())
    return h.hexdigest()


class StoreCache:
    def __init__(self, location: StoreLocation, root: Path):
        self.location = location
        self.root = root
        self.ident = f"{location.backend}:{location.path.resolve()}"
        self._writers: list[threading.Thread] = []  # background writes not yet waited for
        self._pending: dict[str, threading.Thread] = {}  # the last background write of each file
        self._manifest_at: dict[str, tuple[str, int]] = {}  # manifest file -> (directory, opstamp) on disk

    @classmethod
    def for_location(cls, location: StoreLocation) -> StoreCache | None:
        root = cache_dir(location)
        return cls(location, root) if root is not None else None

    # -------------------------------------------------------------- io helpers

    def read_file(self, name: str, typ: type[_CacheFile]) -> _CacheFile | None:
        """The cache file ``name`` decoded as ``typ``, or None when it is missing, too large, broken,
        or written for another format or store."""
        path = self.root / name
        try:
            if path.stat().st_size > MAX_CACHE_BYTES:  # never loaded (nor kept: it would only grow)
                log.warning("discarding a cache file larger than %d bytes: %s", MAX_CACHE_BYTES, path)
                path.unlink()
                return None
            data = path.read_bytes()
        except OSError:
            return None
        try:
            value = msgspec.msgpack.decode(data, type=typ)
        except Exception as exc:  # noqa: BLE001 - undecodable, too deep, out of memory: rebuilt, never fatal
            if _format_of(data) not in (None, FORMAT):  # written by another version: expected, not broken
                log.info("rebuilding a cache file of another format: %s", path)
            else:
                log.warning("discarding a broken cache file %s: %s: %s", path, type(exc).__name__, exc)
            return None
        if value.format != FORMAT or value.store != self.ident:
            return None
        return value

    def write_file(self, name: str, value: Stamped) -> None:
        """Write one cache file (stamped with this format and store), or skip it with a warning (the
        caller goes on without it). A background write of the same file started earlier lands
        first, so the newer value is the one left on disk."""
        pending = self._pending.get(name)
        if pending is not None:
            pending.join()
        self._write(name, value)

    def _write(self, name: str, value: Stamped) -> None:
        value.format, value.store = FORMAT, self.ident
        tmp: str | None = None
        try:
            data = msgspec.msgpack.encode(value)
            if len(data) > MAX_CACHE_BYTES:
                raise ValueError(f"{len(data)} bytes, more than the cache's limit of {MAX_CACHE_BYTES}")
            self.root.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{name}.{os.getpid()}.", dir=self.root)
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.root / name)
        except Exception as exc:  # noqa: BLE001 - full disk, read-only home, a value the encoder refuses
            log.warning("cannot write cache %s: %s: %s", self.root / name, type(exc).__name__, exc)
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)

    def write_in_background(self, name: str, make: Callable[[], Stamped]) -> None:
        """Write ``make()`` to ``name`` on a thread of its own, off the caller's path; ``flush`` waits
        for it (the thread is not a daemon: a process ends once its cache files are written). Writes
        of one file land in the order they were asked for."""
        earlier = self._pending.get(name)

        def run() -> None:
            if earlier is not None:
                earlier.join()
            try:
                value = make()
            except Exception:  # noqa: BLE001 - the cache is an optimisation, never a failure
                log.exception("cannot prepare cache file %s", self.root / name)
                return
            self._write(name, value)  # after ``earlier``, and never waiting for a later one

        self._writers = [t for t in self._writers if t.is_alive()]
        writer = threading.Thread(target=run, name=f"slayer-cache-{name}")
        self._writers.append(writer)
        self._pending[name] = writer
        writer.start()

    def flush(self) -> None:
        """Wait for the background writes started so far."""
        for writer in self._writers:
            writer.join()
        self._writers = []

    # -------------------------------------------------------------- parsed documents

    def load_docs(self) -> list[CachedDoc]:
        value = self.read_file("docs.msgpack", DocCacheFile)
        return value.docs if value is not None else []

    def save_docs(self, docs: list[CachedDoc], *, background: bool = False) -> None:
        """``background``: encoded and written on a thread (a warehouse's parsed documents are 70 MB
        of msgpack: ~0.3 s of a cold start); a later write of it still lands after."""
        value = DocCacheFile(FORMAT, self.ident, docs)
        if background:
            self.write_in_background("docs.msgpack", lambda: value)
        else:
            self.write_file("docs.msgpack", value)

    # -------------------------------------------------------------- full-text index

    def load_text_manifest(self, datasource: str | None = None) -> TextManifest | None:
        """The manifest of the whole store's index, or (``datasource``) of that datasource's own."""
        name = _manifest_name(datasource)
        manifest = self.read_file(name, TextManifest)
        if manifest is not None and manifest.datasource != (datasource or ""):
            return None  # another datasource's (a digest collision): never trusted
        if manifest is not None:
            self._manifest_at[name] = (manifest.directory, manifest.opstamp)
        return manifest

    def save_text_manifest(
        self, manifest: TextManifest, datasource: str | None = None, *, background: bool = False
    ) -> None:
        """``background``: encoded and written on a thread (a warehouse manifest holds 400,000 keys and
        digests; ~0.1 s of a cold start); a later write of it still lands after."""
        name = _manifest_name(datasource)
        manifest.datasource = datasource or ""
        if background:
            self.write_in_background(name, lambda: manifest)
        else:
            self.write_file(name, manifest)
        self._manifest_at[name] = (manifest.directory, manifest.opstamp)

    def holds_manifest(self, directory: str, opstamp: int, datasource: str | None = None) -> bool:
        """Whether the manifest on disk (as this process last read or wrote it) already describes the
        index in ``directory`` at commit ``opstamp``: then writing it again changes nothing."""
        return self._manifest_at.get(_manifest_name(datasource)) == (directory, opstamp)

    def new_text_dir(self, datasource: str | None = None) -> Path | None:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            return Path(tempfile.mkdtemp(prefix=_dir_prefix(datasource), dir=self.root))
        except OSError as exc:
            log.warning("cannot create a cache directory under %s: %s", self.root, exc)
            return None

    def collect_garbage(self, keep: Path | None, datasource: str | None = None) -> None:
        """Remove the index directories (of the whole store, or of one datasource) no manifest names
        (failed builds, older generations), and the temp files of writers that died before renaming
        them into place."""
        try:
            entries = list(self.root.glob(_dir_prefix(datasource) + "*"))
            temps = list(self.root.glob(".*.msgpack.*"))
        except OSError:
            return
        for temp in temps:
            if _orphaned(temp):
                with contextlib.suppress(OSError):
                    temp.unlink()
        for entry in entries:
            if entry.is_dir() and (keep is None or entry.resolve() != keep.resolve()):
                _remove_unless_live(entry)

    def forget_datasources(self, datasources: Iterable[str]) -> None:
        """Remove the indexes and manifests of datasources not among ``datasources`` (gone from the
        store), except an index another process has open."""
        wanted = {_datasource_key(ds) for ds in datasources}
        try:
            entries = list(self.root.glob("datasource-*"))
        except OSError:
            return
        for entry in entries:
            key = entry.name.split("-")[1].split(".")[0]
            if key in wanted:
                continue
            if entry.is_dir():
                _remove_unless_live(entry)
            else:
                with contextlib.suppress(OSError):
                    entry.unlink()


def _datasource_key(datasource: str) -> str:
    return hashlib.blake2b(datasource.encode(), digest_size=8).hexdigest()


def _manifest_name(datasource: str | None) -> str:
    return "fulltext.msgpack" if datasource is None else f"datasource-{_datasource_key(datasource)}.msgpack"


def _dir_prefix(datasource: str | None) -> str:
    return "fulltext-" if datasource is None else f"datasource-{_datasource_key(datasource)}-"


def _remove_unless_live(directory: Path) -> None:
    if (directory / ".tantivy-writer.lock").exists() and _locked(directory):
        return  # another process's live index (or this one's, not yet closed)
    shutil.rmtree(directory, ignore_errors=True)


class _Stamp(msgspec.Struct):
    format: int


def _format_of(data: bytes) -> int | None:
    """The format a cache file says it has (its other fields unread), or None when it says none."""
    try:
        return msgspec.msgpack.decode(data, type=_Stamp).format
    except Exception:  # noqa: BLE001 - not even a stamp: broken
        return None


def _orphaned(temp: Path) -> bool:
    """A temp file ``.<name>.<pid>.<random>`` whose writer is gone (or any one a day old)."""
    try:
        if time.time() - temp.stat().st_mtime > 86400:
            return True
        pid = int(temp.name.split(".")[3])
    except (OSError, ValueError, IndexError):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # alive, under another user
        return False
    return False


def _locked(directory: Path) -> bool:
    """True when another process holds the tantivy writer lock of this directory."""
    import fcntl

    try:
        fd = os.open(directory / ".tantivy-writer.lock", os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)
