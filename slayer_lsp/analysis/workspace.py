"""The workspace's SLayer documents as plain data: query and memory files on disk (found with the
server's file patterns) overlaid with the open documents' unsaved text.

Rename and impact must see every query file, not only the open ones, so a workspace folder is walked
once and each file parsed once per (mtime, size): a code lens asked for every declaration of a model
file costs one walk and, for unchanged files, no parse at all.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from slayer_lsp.analysis import parsed_file as dm
from slayer_lsp.store.safefs import read_text_file

SKIP_DIRS = frozenset({"node_modules", "__pycache__", ".git", ".venv", "venv"})
MAX_FILES = 20_000  # files looked at per walk of one folder (a home directory opened by mistake stays cheap)
MAX_FILE_CHARS = 1_000_000  # the editor's own limit for analysing a document


@dataclass(frozen=True, slots=True)
class WorkspaceDoc:
    """One SLayer document of the workspace: ``key`` is its open URI or its file path."""

    key: str
    path: str | None
    doc: dm.ParsedDocument
    is_open: bool


def walk_folder(
    root: str | Path,
    query_patterns: Iterable[str],
    memory_patterns: Iterable[str],
    skip_under: str | Path | None = None,
) -> Iterator[tuple[str, str]]:
    """(path, kind) of the query and memory files below ``root``; ``skip_under`` (the store) is left
    out: its files are the catalog's."""
    qp, mp = tuple(query_patterns), tuple(memory_patterns)
    skip = os.path.abspath(skip_under) if skip_under is not None else None
    seen = 0
    for dirpath, dirnames, filenames in os.walk(root):
        if skip is not None and (dirpath == skip or dirpath.startswith(skip + os.sep)):
            dirnames[:] = []
            continue
        dirnames[:] = sorted(n for n in dirnames if not n.startswith(".") and n not in SKIP_DIRS)
        for name in sorted(filenames):
            seen += 1
            if seen > MAX_FILES:
                return
            if name.startswith("."):
                continue
            path = os.path.join(dirpath, name)
            kind = dm.classify(path, qp, mp)
            if kind in ("query", "memory"):
                yield path, kind


class DocCache:
    """Parses of files on disk keyed by (path, mtime, size, kind)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._data: dict[str, tuple[tuple[int, int, str], dm.ParsedDocument]] = {}

    def parsed(self, path: str, kind: str) -> dm.ParsedDocument | None:
        try:
            st = os.stat(path)
        except OSError:
            return None
        key = (st.st_mtime_ns, st.st_size, kind)
        with self._lock:
            hit = self._data.get(path)
        if hit is not None and hit[0] == key:
            return hit[1]
        if st.st_size > MAX_FILE_CHARS * 4:
            return None
        text = read_text_file(path)
        if text is None or len(text) > MAX_FILE_CHARS:
            return None
        doc = dm.parse_document(text, kind, path)
        with self._lock:
            self._data[path] = (key, doc)
        return doc

    def forget_missing(self, keep: set[str]) -> None:
        with self._lock:
            for path in [p for p in self._data if p not in keep]:
                self._data.pop(path, None)


CACHE = DocCache()


def workspace_documents(
    folders: Iterable[str | Path],
    open_docs: Mapping[str, tuple[str | None, dm.ParsedDocument]],
    query_patterns: Iterable[str],
    memory_patterns: Iterable[str],
    store_root: str | Path | None = None,
    cache: DocCache = CACHE,
) -> list[WorkspaceDoc]:
    """Every query and memory document of the workspace: the open ones as they are in the editor
    (``open_docs``: key -> (path, parse)), the others as saved. Store files are left to the catalog."""
    out: list[WorkspaceDoc] = []
    open_paths = set()
    store = os.path.abspath(store_root) if store_root is not None else None
    for key, (path, doc) in open_docs.items():
        in_store = store is not None and path is not None and os.path.abspath(path).startswith(store + os.sep)
        if doc.kind in ("query", "memory") and not in_store:
            out.append(WorkspaceDoc(key, path, doc, True))
        if path:
            open_paths.add(os.path.abspath(path))
    seen: set[str] = set()
    for folder in folders:
        for path, kind in walk_folder(folder, query_patterns, memory_patterns, store_root):
            apath = os.path.abspath(path)
            if apath in open_paths or apath in seen:
                continue
            seen.add(apath)
            saved = cache.parsed(apath, kind)
            if saved is not None:
                out.append(WorkspaceDoc(apath, apath, saved, False))
    return out
