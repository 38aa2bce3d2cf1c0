"""Store faults while an engine serves (issue 9, item 2), at the engine level: files that stop loading,
a writer racing the re-reads, the store directory removed and restored, a SQLite store locked,
corrupted or replaced, and a full disk under a memory write or the on-disk cache.

What must hold each time: the engine keeps answering from the last good snapshot, says what is wrong
once (one load issue per file, one ``fatal`` per outage: the snapshot generation does not move while
the same fault persists), loses nothing, and serves exactly what a cold start would once the store is
whole again. The daemon-level twins are in ``tests/lsp/test_store_faults_lsp.py``.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import os
import random
import resource
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import msgspec
import pytest

from slayer_lsp.engine import Engine
from slayer_lsp.store import files as store_files
from slayer_lsp.writer.memories import MemoryWriteError, save_memory

SHOP = Path(__file__).resolve().parents[1] / "examples" / "shop"
BOOKS = Path("models/shop/books.yaml")
QUESTIONS = ("stock keeping unit", "customer city", "discount revenue", "order status")


# --------------------------------------------------------------------------- helpers


def yaml_store(tmp_path: Path) -> Path:
    dst = tmp_path / "store"
    shutil.copytree(SHOP / "store", dst, copy_function=shutil.copyfile)
    return dst


def sqlite_store(tmp_path: Path) -> Path:
    dst = tmp_path / "store.db"
    shutil.copyfile(SHOP / "store.db", dst)
    return dst


def served(engine: Engine) -> dict[str, object]:
    """Everything the engine's current snapshot says about each entity, as plain data."""
    return {c: msgspec.to_builtins(e.obj) for c, e in engine.state.catalog.entities.items()}


def hits(engine: Engine, question: str) -> list[str]:
    return [h.id for h in engine.search({"question": question, "max_results": 8}).results]


def answers(engine: Engine) -> dict[str, list[str]]:
    return {q: hits(engine, q) for q in QUESTIONS}


def cold(store: Path) -> Engine:
    """A fresh start without any cache: what a whole store must be served as."""
    engine = Engine(store, use_cache=False)
    engine.refresh()
    return engine


def issues_of(engine: Engine, path: Path) -> list[str]:
    return [i.message for i in engine.current().catalog.issues if i.source.path == str(path)]


def edited(text: str, old: str = "Stock keeping unit", new: str = "Stock keeping unit (edited)") -> str:
    assert old in text
    return text.replace(old, new)


def atomic_write(path: Path, data: bytes) -> None:
    tmp = path.parent / f".{path.name}.tmp"
    tmp.write_bytes(data)
    tmp.replace(path)


@contextlib.contextmanager
def file_size_limit(limit: int):
    """RLIMIT_FSIZE for this process: every write past ``limit`` bytes of a file fails (EFBIG) as on a
    full disk. SIGXFSZ is ignored meanwhile so the write returns the error instead of killing us."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)


# --------------------------------------------------------------------------- a file that stops loading

GARBAGE = {
    "truncated to nothing": b"",
    "cut inside a flow list": b"name: books\ncolumns: [{name: sku, sql: sk",
    "random bytes": random.Random(9).randbytes(4096),
    "NUL bytes": b"\0" * 512,
    "not a mapping": b"- books\n- authors\n",
    "wrong types": b"name: books\ncolumns: 7\n",
    "a python tag": b"!!python/object/apply:os.system ['true']\n",
    "deep flow nesting": b"[" * 200_000,
}


@pytest.mark.parametrize("garbage", list(GARBAGE.values()), ids=list(GARBAGE))
def test_a_file_that_stops_loading_keeps_its_last_good_version(tmp_path, garbage):
    store = yaml_store(tmp_path)
    path = store / BOOKS
    good = path.read_text()
    engine = cold(store)
    before, asked = served(engine), answers(engine)
    assert "shop.books.sku" in before

    path.write_bytes(garbage)
    for changed in ([str(path)], None, [str(path)]):  # the watcher's hint, a whole re-read, a retry
        engine.refresh(changed)
        assert served(engine) == before
        assert answers(engine) == asked
        notes = issues_of(engine, path)
        assert len(notes) == 1 and notes[0].endswith("; serving its last good version"), notes
    assert engine.current().catalog.fatal is None

    # a fresh process does not inherit the last good version: it sees the file as it is
    engine.close()
    restarted = Engine(store, use_cache=True)
    assert "shop.books" not in restarted.catalog.entities
    assert len(issues_of(restarted, path)) == 1 and "last good" not in issues_of(restarted, path)[0]
    assert served(restarted) == served(cold(store))

    # repaired: the new content is served and the issue is gone
    path.write_text(edited(good))
    engine.refresh([str(path)])
    assert (
        engine.current().catalog.get("shop.books.sku").description
        == "Stock keeping unit (edited), e.g. SKU-1042"
    )
    assert issues_of(engine, path) == []
    assert served(engine) == served(cold(store))


def test_deep_flow_nesting_is_refused_before_the_yaml_parser_sees_it(tmp_path):
    """libyaml's time grows with the square of the nesting depth (minutes for a few hundred KB)."""
    store = yaml_store(tmp_path)
    (store / BOOKS).write_bytes(b"name: books\ncolumns: " + b"[" * 300_000)
    (store / "memories" / "1.md").write_text("---\nentities: " + "{a: " * 3000 + "\n---\nbody\n")
    engine = cold(store)
    assert "shop.books" not in engine.current().catalog.entities
    for path in (store / BOOKS, store / "memories" / "1.md"):
        assert issues_of(engine, path) == [
            "cannot be loaded: flow collections nested deeper than 1000 levels"
        ]


def test_a_memory_and_a_datasource_that_stop_loading_keep_their_last_good_version(tmp_path):
    store = yaml_store(tmp_path)
    engine = cold(store)
    before = served(engine)
    memory, datasource = store / "memories" / "1.md", store / "datasources" / "shop.yaml"
    memory.write_text("---\nentities: [unclosed\n---\nbody\n")
    datasource.write_bytes(b"\xff\xfe not text")
    engine.refresh([str(memory), str(datasource)])
    assert served(engine) == before
    assert [len(issues_of(engine, p)) for p in (memory, datasource)] == [1, 1]


def test_a_deleted_file_is_dropped_and_a_recreated_one_comes_back(tmp_path):
    store = yaml_store(tmp_path)
    path = store / BOOKS
    good = path.read_bytes()
    engine = cold(store)
    path.unlink()
    engine.refresh([str(path)])
    assert "shop.books" not in engine.current().catalog.entities  # a deletion is a change, not a fault
    assert issues_of(engine, path) == []
    path.write_bytes(good)
    engine.refresh([str(path)])
    assert served(engine) == served(cold(store))


# --------------------------------------------------------------------------- a writer racing the reader


def _rewrite_in_chunks(path: Path, data: bytes, rng: random.Random) -> None:
    """A writer that does not rename into place: truncate, then write a piece at a time."""
    step = rng.choice((64, 512, 4096))
    with open(path, "wb") as fh:
        for i in range(0, len(data), step):
            fh.write(data[i : i + step])
            fh.flush()


def _garbage_then_back(path: Path, data: bytes, rng: random.Random) -> None:
    path.write_bytes(rng.randbytes(rng.randrange(1, 2048)))
    path.write_bytes(data)


def _delete_and_recreate(path: Path, data: bytes, rng: random.Random) -> None:
    path.unlink()
    path.write_bytes(data)


def _truncate_then_back(path: Path, data: bytes, rng: random.Random) -> None:
    os.truncate(path, rng.randrange(len(data)))
    path.write_bytes(data)


def _replace_atomically(path: Path, data: bytes, rng: random.Random) -> None:
    atomic_write(path, data + f"\n# {rng.random()}\n".encode())
    atomic_write(path, data)


WRITES = (
    _rewrite_in_chunks,
    _garbage_then_back,
    _delete_and_recreate,
    _truncate_then_back,
    _replace_atomically,
)


@pytest.mark.slow
def test_a_writer_racing_the_reader_never_breaks_what_is_served(tmp_path):
    store = yaml_store(tmp_path)
    targets = [
        store / BOOKS,
        store / "models" / "shop" / "customers.yaml",
        store / "memories" / "1.md",
        store / "datasources" / "shop.yaml",
    ]
    good = {p: p.read_bytes() for p in targets}
    engine = cold(store)
    sources = {str(p) for p in targets}
    bystanders = {
        c: v for c, v in served(engine).items() if engine.current().catalog.get(c).source.path not in sources
    }
    stop = threading.Event()
    rng = random.Random(20251)
    writes: list[str] = []
    failures: list[BaseException] = []

    def write() -> None:
        wrng = random.Random(7)
        try:
            while not stop.is_set():
                path = wrng.choice(targets)
                op = wrng.choice(WRITES)
                op(path, good[path], wrng)
                writes.append(op.__name__)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            failures.append(exc)

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    try:
        for _ in range(250):
            engine.refresh(rng.choice([None, [str(p) for p in targets], [str(rng.choice(targets))]]))
            state = engine.current()
            assert state.catalog.fatal is None
            now = served(engine)
            assert {c: now.get(c) for c in bystanders} == bystanders  # the other documents never move
            for question in ("customer city", "stock keeping unit"):
                found = engine.search({"question": question, "max_results": 8})
                assert all(
                    h.id in state.catalog.entities or h.id in state.catalog.memories for h in found.results
                )
    finally:
        stop.set()
        thread.join()
    assert not failures, failures
    assert all(p.read_bytes() == good[p] for p in targets)  # every write ends with the whole file
    assert len(set(writes)) == len(WRITES), writes  # every kind of write raced the reader
    # the files are whole again: the next re-read serves what a cold start serves
    engine.refresh(None)
    whole = cold(store)
    assert served(engine) == served(whole)
    assert engine.current().catalog.issues == whole.current().catalog.issues
    engine.compact()  # replaced documents linger in the BM25 statistics until a rebuild
    assert answers(engine) == answers(whole)


# --------------------------------------------------------------------------- the store directory


@pytest.mark.parametrize("how", ["removed", "renamed away"])
def test_the_store_directory_removed_and_restored(tmp_path, how):
    store = yaml_store(tmp_path)
    backup = tmp_path / "backup"
    shutil.copytree(store, backup)
    engine = cold(store)
    before, asked = served(engine), answers(engine)
    if how == "removed":
        shutil.rmtree(store)
    else:
        store.rename(tmp_path / "elsewhere")
    engine.refresh(None)
    fault = engine.current().catalog
    assert fault.fatal is not None and "does not exist" in fault.fatal
    for changed in (None, [str(store / BOOKS)], None):  # the retries
        engine.refresh(changed)
        assert engine.current().catalog is fault  # reported once: no new snapshot per retry
    assert served(engine) == before and answers(engine) == asked
    assert engine.stats.unreadable_since is not None

    (backup / BOOKS).write_text(edited((backup / BOOKS).read_text()))  # changed while it was away
    shutil.copytree(backup, store)
    engine.refresh(None)
    assert engine.current().catalog.fatal is None and engine.stats.unreadable_since is None
    assert served(engine) == served(cold(store))
    assert "(edited)" in engine.current().catalog.get("shop.books.sku").description


def test_a_store_missing_at_start_is_indexed_when_it_appears(tmp_path, monkeypatch):
    monkeypatch.setenv("SLAYER_LSP_CACHE_DIR", str(tmp_path / "cache"))
    store = tmp_path / "store"
    engine = Engine(store, use_cache=True)
    assert engine.catalog.fatal is not None and not engine.catalog.entities
    assert not (tmp_path / "cache").exists()  # nothing is cached for a store that is not there
    shutil.copytree(SHOP / "store", store)
    engine.refresh(None)
    assert engine.current().catalog.fatal is None
    assert served(engine) == served(cold(store))
    assert answers(engine) == answers(cold(store))
    engine.close()
    (root,) = (tmp_path / "cache").iterdir()  # the first good read built the cache too
    assert {"docs.msgpack", "fulltext.msgpack"} <= {p.name for p in root.iterdir()}


# --------------------------------------------------------------------------- SQLite


def _edit_row(db: Path, conn: sqlite3.Connection | None = None) -> None:
    own = conn is None
    conn = conn or sqlite3.connect(db, isolation_level=None)
    (data,) = conn.execute("SELECT data FROM models WHERE name = 'books'").fetchone()
    conn.execute("UPDATE models SET data = ? WHERE name = 'books'", (edited(data),))
    if own:
        conn.close()


@pytest.mark.slow
def test_sqlite_locked_by_another_writer_for_seconds(tmp_path):
    db = sqlite_store(tmp_path)
    engine = cold(db)
    before, asked = served(engine), answers(engine)
    locker = sqlite3.connect(db, isolation_level=None, timeout=0)
    locker.execute("BEGIN EXCLUSIVE")
    _edit_row(db, locker)
    try:
        engine.refresh(None)  # waits out the reader's busy timeout (2 s), then gives up
        fault = engine.current().catalog
        assert fault.fatal is not None and "locked" in fault.fatal
        assert served(engine) == before and answers(engine) == asked  # the uncommitted edit is not seen
    finally:
        locker.execute("COMMIT")
        locker.close()
    engine.refresh(None)
    assert engine.current().catalog.fatal is None
    assert served(engine) == served(cold(db))
    assert "(edited)" in engine.current().catalog.get("shop.books.sku").description


def _damage(db: Path, how: str, rng: random.Random) -> None:
    data = bytearray(db.read_bytes())
    page = int.from_bytes(data[16:18], "big") or 65536
    if how == "header":
        data[:100] = rng.randbytes(100)
    elif how == "pages":
        for start in range(page, len(data), page):
            data[start : start + page] = rng.randbytes(min(page, len(data) - start))
    elif how == "truncated":
        data = data[: len(data) // 3]
    elif how == "emptied":
        data = bytearray()
    elif how == "text":
        data = bytearray(b"this is not a database\n" * 50)
    with open(db, "r+b") as fh:  # in place, as a failing disk or a stray tool would
        fh.write(data)
        fh.truncate()


@pytest.mark.parametrize("how", ["header", "pages", "truncated", "emptied", "text"])
def test_sqlite_corrupted_then_restored(tmp_path, how):
    db = sqlite_store(tmp_path)
    good = db.read_bytes()
    engine = cold(db)
    before, asked = served(engine), answers(engine)
    _damage(db, how, random.Random(how))
    engine.refresh(None)
    fault = engine.current().catalog
    assert fault.fatal is not None, how
    engine.refresh(None)
    assert engine.current().catalog is fault
    assert served(engine) == before and answers(engine) == asked
    atomic_write(db, good)
    _edit_row(db)
    engine.refresh(None)
    assert engine.current().catalog.fatal is None
    assert served(engine) == served(cold(db))


def test_sqlite_replaced_by_another_store(tmp_path):
    db = sqlite_store(tmp_path)
    engine = cold(db)
    other = tmp_path / "other.db"
    shutil.copyfile(db, other)
    _edit_row(other)
    with sqlite3.connect(other) as conn:
        conn.execute("DELETE FROM memories WHERE id = '1'")
    other.replace(db)
    engine.refresh(None)
    assert served(engine) == served(cold(db))
    assert "memory:1" not in engine.current().catalog.entities


# --------------------------------------------------------------------------- a full disk


def _memory_files(store: Path) -> list[str]:
    return sorted(os.listdir(store / "memories"))


def test_enospc_mid_write_of_a_memory_leaves_nothing_behind(tmp_path, monkeypatch):
    store = yaml_store(tmp_path)
    engine = cold(store)
    before, files = served(engine), _memory_files(store)
    real = store_files.write_all

    def half_then_full(fd: int, data: bytes) -> None:
        real(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(store_files, "write_all", half_then_full)
    with pytest.raises(MemoryWriteError, match=r"No space left on device \(ENOSPC\)"):
        save_memory(
            engine.location,
            engine.current().catalog,
            learning="Reorder when stock falls below ten.",
            entities=["books.sku"],
        )
    assert _memory_files(store) == files  # no partial file, no temp file
    engine.refresh(None)
    assert served(engine) == before

    monkeypatch.setattr(store_files, "write_all", real)  # space again
    saved = save_memory(
        engine.location,
        engine.current().catalog,
        learning="Reorder when stock falls below ten.",
        entities=["books.sku"],
    )
    engine.refresh(None)
    assert engine.current().catalog.memory(saved.id).learning == "Reorder when stock falls below ten."


@pytest.mark.parametrize("backend", ["yaml", "sqlite"])
def test_a_full_disk_refuses_a_memory_cleanly(tmp_path, backend):
    store = yaml_store(tmp_path) if backend == "yaml" else sqlite_store(tmp_path)
    engine = cold(store)
    before = served(engine)
    listing = sorted(os.listdir(store.parent if backend == "sqlite" else store / "memories"))
    image = store.read_bytes() if backend == "sqlite" else None
    with file_size_limit(0), pytest.raises(MemoryWriteError) as err:
        save_memory(
            engine.location,
            engine.current().catalog,
            learning="Shelf space is counted in metres.",
            entities=["books.sku"],
        )
    assert "cannot" in str(err.value) and str(store) in str(err.value)
    assert sorted(os.listdir(store.parent if backend == "sqlite" else store / "memories")) == listing
    if image is not None:
        assert store.read_bytes() == image
    engine.refresh(None)
    assert engine.current().catalog.fatal is None and served(engine) == before
    saved = save_memory(
        engine.location,
        engine.current().catalog,
        learning="Shelf space is counted in metres.",
        entities=["books.sku"],
    )
    engine.refresh(None)
    assert engine.current().catalog.memory(saved.id) is not None
    if backend == "sqlite":
        with sqlite3.connect(store) as conn:
            assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)


def test_a_full_disk_under_the_cache_is_never_trusted_half_written(tmp_path, monkeypatch):
    store = yaml_store(tmp_path)
    monkeypatch.setenv("SLAYER_LSP_CACHE_DIR", str(tmp_path / "cache"))
    earlier = Engine(store)
    earlier.refresh()
    earlier.close()  # a cache from an earlier run
    del earlier  # as its process would at exit: the index's writer lock goes with it
    gc.collect()
    assert sorted(p.name for p in next((tmp_path / "cache").iterdir()).iterdir() if p.is_file()) == [
        "docs.msgpack",
        "fulltext.msgpack",
        "rendered.msgpack",
    ]
    (store / BOOKS).write_text(edited((store / BOOKS).read_text()))  # the cached index is now behind
    with file_size_limit(0):
        engine = Engine(store, use_cache=True)
        engine.refresh()  # the cached index cannot be brought up to date: indexed in memory instead
    assert answers(engine) == answers(cold(store))
    (store / BOOKS).write_text(edited((store / BOOKS).read_text(), "(edited)", "(edited twice)"))
    with file_size_limit(0):
        engine.refresh([str(store / BOOKS)])
        engine.close()  # the cache cannot be written: logged, nothing raised
    assert served(engine) == served(cold(store))
    del engine
    gc.collect()
    restarted = Engine(store, use_cache=True)
    assert served(restarted) == served(cold(store)) and answers(restarted) == answers(cold(store))
    restarted.close()
    del restarted
    gc.collect()
    again = Engine(store, use_cache=True)
    assert answers(again) == answers(cold(store))


def _can_mount_tmpfs(where: Path) -> bool:
    if os.geteuid() != 0 or not sys.platform.startswith("linux"):
        return False
    where.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(where)], capture_output=True)
    return done.returncode == 0


def test_a_real_enospc_on_a_tiny_tmpfs(tmp_path, monkeypatch):
    """Where this machine lets us mount one: a 2 MB tmpfs holding the store and the cache, filled up."""
    disk = tmp_path / "disk"
    if not _can_mount_tmpfs(disk):
        pytest.skip("cannot mount a tmpfs here (not root, or no CAP_SYS_ADMIN)")
    try:
        store = disk / "store"
        shutil.copytree(SHOP / "store", store, ignore=shutil.ignore_patterns("embeddings.db"))
        monkeypatch.setenv("SLAYER_LSP_CACHE_DIR", str(disk / "cache"))
        filler = disk / "filler"
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
        try:
            for block in (65536, 512, 1):  # down to the last free byte
                with contextlib.suppress(OSError):
                    while True:
                        os.write(fd, b"\0" * block)
        finally:
            os.close(fd)
        engine = Engine(store, use_cache=True)
        assert answers(engine) == answers(cold(store))
        files = _memory_files(store)
        with pytest.raises(MemoryWriteError, match="ENOSPC"):
            save_memory(
                engine.location, engine.current().catalog, learning="x" * 20_000, entities=["books.sku"]
            )
        assert _memory_files(store) == files
        engine.close()
        filler.unlink()
        saved = save_memory(
            engine.location, engine.current().catalog, learning="x" * 20_000, entities=["books.sku"]
        )
        assert f"{saved.id}.md" in _memory_files(store)
        assert answers(Engine(store, use_cache=True)) == answers(cold(store))
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def test_a_join_pair_without_two_keys_is_skipped_not_fatal(tmp_path):
    """A hand edit (or a file cut short) leaves a join pair with one key: every search still answers,
    and the join is simply not used (it crashed the default ranking's lexicon build)."""
    store = yaml_store(tmp_path)
    path = store / BOOKS
    pair = "  - - author_id\n    - author_id\n"
    assert pair in path.read_text()
    path.write_text(path.read_text().replace(pair, "  - - author_id\n"))
    engine = cold(store)
    assert any(len(p) == 1 for j in engine.catalog.models["shop.books"].joins for p in j.join_pairs)
    for question in QUESTIONS:
        assert hits(engine, question)
