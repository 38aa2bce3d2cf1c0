"""Crash safety (issue 9, item 4): ``kill -9`` at random points while indexing, while writing the
on-disk cache and while saving memories; the next start must recover.

* ``slayer-lsp search`` on a generated store big enough that a cold start takes a second or two, killed
  after a seeded random delay (during imports, the read, the index build or the cache writes), the
  store edited between rounds: the next start with the cache answers exactly what a cold start
  without any cache answers.
* a long-lived engine (incremental updates, compactions, cache snapshots) killed the same way.
* each cache file damaged on purpose (truncated, garbage, another store's, pointing nowhere): detected
  and rebuilt, never trusted.
* ``save_memory`` killed mid-save, on both backends: no partial memory is visible (every memory file is
  whole and loads, in our reader and in SLayer when its venv is there), a SQLite store left with a hot
  journal is rolled back, and the temp files of the dead writer are swept by the next save.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slayer_lsp.store.reader import StoreReader
from tests import slayer_oracle as oracle

REPO = Path(__file__).resolve().parents[1]
SEED = 20260409
WORDS = (
    "revenue margin churn cohort invoice refund shipment warehouse carrier region channel campaign supplier "
    "product category basket session visitor ticket agent priority contract renewal plan tier discount coupon "
    "payment currency ledger balance account quota forecast target"
).split()
QUESTIONS = ("refund carrier region", "renewal contract tier")


# --------------------------------------------------------------------------- a generated store


def generate_store(
    root: Path, models: int = 150, columns: int = 18, memories: int = 400, seed: int = 1
) -> None:
    """A synthetic YAML store in SLayer's layout (two datasources, ``models`` models of ``columns``
    described columns, ``memories`` tagged memories): a cold start indexes it in about a second."""
    rng = random.Random(seed)
    (root / "datasources").mkdir(parents=True)
    for ds in ("wh0", "wh1"):
        (root / "datasources" / f"{ds}.yaml").write_text(
            f"name: {ds}\ntype: duckdb\ndescription: warehouse {ds}\n"
        )
    canonicals = []
    for i in range(models):
        ds, name = f"wh{i % 2}", f"{rng.choice(WORDS)}_{rng.choice(WORDS)}_{i}"
        canonicals.append(f"{ds}.{name}")
        lines = [
            f"name: {name}",
            f"data_source: {ds}",
            f"sql_table: public.{name}",
            f"description: {' '.join(rng.sample(WORDS, 8))}",
            "columns:",
            "- name: id",
            "  sql: id",
            "  type: INT",
            "  primary_key: true",
            f"  description: key of {name}",
        ]
        first = None
        for j in range(columns):
            a, b, c = rng.sample(WORDS, 3)
            first = first or f"{a}_{j}"
            lines += [
                f"- name: {a}_{j}",
                f"  sql: {a}_{j}",
                f"  type: {rng.choice(['TEXT', 'INT', 'DOUBLE'])}",
                f"  description: {b} {c} of the {a} for {name}",
            ]
        lines += ["measures:", "- name: total", f"  formula: sum({first})"]
        directory = root / "models" / ds
        directory.mkdir(parents=True, exist_ok=True)
        (directory / f"{name}.yaml").write_text("\n".join(lines) + "\n")
    (root / "memories").mkdir()
    for k in range(1, memories + 1):
        a, b = rng.sample(canonicals, 2)
        (root / "memories" / f"{k}.md").write_text(
            f"---\ncreated_at: '2026-01-{1 + k % 28:02d}T00:00:{k % 60:02d}Z'\nentities:\n- {a}\n- {b}\nversion: 4\n---\n"
            + " ".join(rng.choices(WORDS, k=20))
            + "\n"
        )


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("generated") / "store"
    generate_store(root)
    return root


@pytest.fixture()
def store(pristine, tmp_path) -> Path:
    dst = tmp_path / "store"
    shutil.copytree(pristine, dst)
    return dst


def edit_some_model(store: Path, rng: random.Random) -> None:
    """An edit landed the way SLayer lands one (temp file + rename): the store stays whole."""
    path = rng.choice(sorted((store / "models").rglob("*.yaml")))
    text = path.read_text().replace("description: ", f"description: {rng.choice(WORDS)} ", 1)
    tmp = path.parent / f".{path.name}.tmp"
    tmp.write_text(text)
    tmp.replace(path)


def env_for(cache: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLAYER_LSP_CACHE")}
    env["PYTHONHASHSEED"] = "0"  # the default ranking breaks some ties by set order: compare like with like
    if cache is None:
        env["SLAYER_LSP_CACHE"] = "off"
    else:
        env["SLAYER_LSP_CACHE_DIR"] = str(cache)
    return env


def search_cmd(store: Path, question: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "slayer_lsp",
        "search",
        "--storage",
        str(store),
        "--question",
        question,
        "--no-dense",
        "--format",
        "json",
        "--max-results",
        "20",
    ]


def search(store: Path, question: str, cache: Path | None) -> str:
    done = subprocess.run(
        search_cmd(store, question), env=env_for(cache), cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def killed_after(cmd: list[str], env: dict[str, str], delay: float) -> bool:
    """Run ``cmd`` and SIGKILL it after ``delay`` seconds; False when it finished first."""
    proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        proc.wait(timeout=delay)
        return False
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return True


def store_digest(store: Path) -> str:
    h = hashlib.blake2b(digest_size=16)
    for path in sorted(store.rglob("*")):
        if path.is_file():
            h.update(str(path).encode() + path.read_bytes())
    return h.hexdigest()


class Cold:
    """What a cold start without any cache answers, per (store content, question)."""

    def __init__(self) -> None:
        self.answers: dict[tuple[str, str], str] = {}

    def __call__(self, store: Path, question: str) -> str:
        key = (store_digest(store), question)
        if key not in self.answers:
            self.answers[key] = search(store, question, None)
        return self.answers[key]


def leftovers(cache: Path) -> list[str]:
    """What a dead writer left in the cache directory that the manifest does not account for."""
    out = []
    for root in cache.iterdir():
        out += [p.name for p in root.iterdir() if p.name.startswith(".")]
    return out


# --------------------------------------------------------------------------- indexing and cache writes


@pytest.mark.slow
def test_search_killed_at_random_points_never_leaves_a_trusted_broken_cache(store, tmp_path):
    rng = random.Random(SEED)
    cache, cold = tmp_path / "cache", Cold()
    kills, run_s, rounds = 0, 1.0, 0
    while rounds < 8 or (kills < 4 and rounds < 16):  # on a slow machine, more rounds until 4 kills landed
        rounds += 1
        if rng.random() < 0.4:
            edit_some_model(store, rng)
        question = rng.choice(QUESTIONS)
        # anywhere in a run as long as the last whole one: imports, read, index build, cache writes
        kills += killed_after(search_cmd(store, question), env_for(cache), rng.uniform(0.05, 0.8 * run_s))
        started = time.monotonic()
        assert search(store, question, cache) == cold(store, question)
        run_s = time.monotonic() - started
    assert kills >= 4, "the random delays should mostly land before the run ends"
    assert leftovers(cache) == []  # a finished run sweeps what the killed ones left


DRIVER = r"""
import itertools, random, sys
from pathlib import Path
from slayer_lsp.engine import Engine

store, mode, seed = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
rng = random.Random(seed)
models = sorted((store / "models").rglob("*.yaml"))
engine = Engine(store, compact_after_s=0.05 if mode == "daemon" else None)
engine.refresh()
for i in itertools.count():
    path = rng.choice(models)
    text = path.read_text().replace("description: ", f"description: edit{i} ", 1)
    tmp = path.parent / f".{path.name}.tmp"
    tmp.write_text(text)
    tmp.replace(path)
    engine.refresh([str(path)])
    if i % 3 == 0:
        engine.compact()
    if i % 4 == 0:
        engine.close()  # caches saved as at shutdown; the engine keeps going
"""


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["daemon", "one-shot"])
def test_a_long_lived_engine_killed_at_random_points(store, tmp_path, mode):
    rng = random.Random(f"{SEED}-{mode}")
    cache, cold = tmp_path / "cache", Cold()
    for round_ in range(3):
        killed = killed_after(
            [sys.executable, "-c", DRIVER, str(store), mode, str(round_)],
            env_for(cache),
            rng.uniform(0.5, 4.0),
        )
        assert killed, "the driver never ends by itself"
        question = rng.choice(QUESTIONS)
        assert search(store, question, cache) == cold(store, question)
    assert leftovers(cache) == []


def _cache_root(cache: Path) -> Path:
    (root,) = list(cache.iterdir())
    return root


def _index_dir(root: Path) -> Path:
    (directory,) = [p for p in root.iterdir() if p.is_dir() and p.name.startswith("fulltext-")]
    return directory


def _garble(path: Path) -> None:
    path.write_bytes(random.Random(str(path)).randbytes(max(path.stat().st_size, 64)))


DAMAGE = {
    "docs cache truncated": lambda r: os.truncate(
        r / "docs.msgpack", (r / "docs.msgpack").stat().st_size // 2
    ),
    "docs cache garbage": lambda r: _garble(r / "docs.msgpack"),
    "manifest truncated": lambda r: os.truncate(r / "fulltext.msgpack", 40),
    "manifest garbage": lambda r: _garble(r / "fulltext.msgpack"),
    "index meta.json garbage": lambda r: _garble(_index_dir(r) / "meta.json"),
    "index segments garbage": lambda r: [
        _garble(p) for p in _index_dir(r).iterdir() if p.suffix in (".idx", ".term")
    ],
    "index segments truncated": lambda r: [
        os.truncate(p, p.stat().st_size // 2)
        for p in _index_dir(r).iterdir()
        if p.suffix in (".store", ".pos", ".idx")
    ],
    "index directory gone": lambda r: shutil.rmtree(_index_dir(r)),
    "cache of another store": None,
}


@pytest.mark.slow
@pytest.mark.parametrize("damage", list(DAMAGE), ids=list(DAMAGE))
def test_a_damaged_cache_is_detected_and_rebuilt(store, tmp_path, damage):
    cache, cold = tmp_path / "cache", Cold()
    question = QUESTIONS[0]
    assert search(store, question, cache) == cold(store, question)  # a good cache
    edit_some_model(store, random.Random(damage))  # so that a cache taken at face value would answer stale
    root = _cache_root(cache)
    if DAMAGE[damage] is None:  # the files of another store's cache under this store's name
        other = tmp_path / "other"
        shutil.copytree(store, other)
        edit_some_model(other, random.Random(1))
        search(other, question, cache)
        other_root = next(p for p in cache.iterdir() if p != root)
        for name in ("docs.msgpack", "fulltext.msgpack"):
            shutil.copyfile(other_root / name, root / name)
    else:
        DAMAGE[damage](root)
    assert search(store, question, cache) == cold(store, question)
    assert search(store, question, cache) == cold(store, question)  # and the rebuilt cache is good


def test_the_temp_files_of_a_dead_cache_writer_are_swept(store, tmp_path):
    cache, question = tmp_path / "cache", QUESTIONS[1]
    search(store, question, cache)
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    ).stdout.strip()
    orphan = (
        _cache_root(cache) / f".docs.msgpack.{dead}.k9x2"
    )  # what a writer killed before its rename leaves
    orphan.write_bytes(b"\x92\x01")
    assert search(store, question, cache) == Cold()(store, question)
    assert not orphan.exists() and leftovers(cache) == []


def _vector_rows(db: Path, table: str) -> list[tuple[str, ...]]:
    """Which vectors a table holds (and of which text), without the vectors' timestamps."""
    with sqlite3.connect(db) as conn:
        return conn.execute(
            f"SELECT canonical_id, embedding_model_name, entity_kind, content_hash FROM {table} "
            "ORDER BY canonical_id, embedding_model_name"
        ).fetchall()


def _embedded(store: Path, cache: Path) -> tuple[list[tuple[str, ...]], list[tuple[str, ...]]]:
    """The store's embedding rows and the part vectors' rows (in the cache directory)."""
    return _vector_rows(store / "embeddings.db", "embeddings"), _vector_rows(
        next(cache.glob("*/parts.db")), "part_vectors"
    )


@pytest.mark.slow
def test_embed_killed_at_random_points_then_finished_equals_an_uninterrupted_embed(tmp_path):
    rng = random.Random(f"{SEED}-embed")
    stores = {}
    for name in ("clean", "killed"):
        stores[name] = tmp_path / name / "store"
        shutil.copytree(
            REPO / "examples" / "shop" / "store", stores[name], ignore=shutil.ignore_patterns("embeddings.db")
        )
    embed = [sys.executable, "-m", "slayer_lsp", "embed", "--storage"]
    started = time.monotonic()
    assert (
        subprocess.run(
            [*embed, str(stores["clean"])],
            env=env_for(tmp_path / "clean" / "cache"),
            cwd=REPO,
            capture_output=True,
            timeout=600,
        ).returncode
        == 0
    )
    run_s = time.monotonic() - started
    kills = sum(
        killed_after(
            [*embed, str(stores["killed"])],
            env_for(tmp_path / "killed" / "cache"),
            rng.uniform(0.2, max(0.3, 0.7 * run_s)),
        )
        for _ in range(2)
    )
    assert kills >= 1
    finished = subprocess.run(
        [*embed, str(stores["killed"])],
        env=env_for(tmp_path / "killed" / "cache"),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert _embedded(stores["killed"], tmp_path / "killed" / "cache") == _embedded(
        stores["clean"], tmp_path / "clean" / "cache"
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "slayer_lsp",
            "status",
            "--storage",
            str(stores["killed"]),
            "--format",
            "json",
        ],
        env=env_for(tmp_path / "killed" / "cache"),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    emb = json.loads(done.stdout)["embedding"]
    assert (emb["pending"], emb["failed"], emb["last_error"]) == (0, 0, None)
    assert emb["parts"] is None or (emb["parts"]["pending"], emb["parts"]["failed"]) == (0, 0)


# --------------------------------------------------------------------------- memory writes

SAVER = r"""
import itertools, random, sys
from slayer_lsp.catalog import load_catalog
from slayer_lsp.store.locate import locate
from slayer_lsp.writer.memories import save_memory

location, rng = locate(sys.argv[1]), random.Random(int(sys.argv[2]))
catalog = load_catalog(sys.argv[1])
models = sorted(catalog.models)
for i in itertools.count():
    body = " ".join(rng.choice(("crash", "probe", "ledger", "refund")) for _ in range(rng.randrange(10, 4000)))
    save_memory(location, catalog, learning=f"crash probe {sys.argv[2]}/{i}: {body} END",
                entities=[rng.choice(models)])
"""


def _yaml_leftovers(store: Path) -> list[str]:
    return [n for n in os.listdir(store / "memories") if n.startswith(".")]


def _check_memories(store: Path) -> int:
    """Every stored memory loads and every crash-probe memory is whole; returns how many there are."""
    read = StoreReader(store).read()
    assert read.fatal is None, read.fatal
    assert not [str(i) for i in read.issues], read.issues
    probes = [
        doc.value
        for key, doc in read.docs.items()
        if key.kind == "memory" and doc.value.learning.startswith("crash probe")
    ]
    for memory in probes:
        assert memory.learning.rstrip("\n").endswith(" END"), memory.id
        assert len(memory.entities) == 1
    if store.suffix == ".db":
        with sqlite3.connect(store) as conn:
            assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
            tagged = dict(conn.execute("SELECT memory_id, count(*) FROM memory_entities GROUP BY memory_id"))
        assert all(tagged.get(m.id) == 1 for m in probes)  # each row came with its entity row
    return len(probes)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["yaml", "sqlite"])
def test_save_memory_killed_mid_save_leaves_no_partial_memory(tmp_path, backend):
    if backend == "yaml":
        store = tmp_path / "store"
        shutil.copytree(REPO / "examples" / "shop" / "store", store)
    else:
        store = tmp_path / "store.db"
        shutil.copyfile(REPO / "examples" / "shop" / "store.db", store)
    rng = random.Random(f"{SEED}-{backend}")
    saved = 0
    for round_ in range(5):
        assert killed_after(
            [sys.executable, "-c", SAVER, str(store), str(round_)], env_for(None), rng.uniform(0.6, 1.6)
        )
        now = _check_memories(store)
        assert now >= saved  # nothing saved before is lost
        saved = now
    assert saved > 0
    # the next save sweeps the dead writers' temp files (SQLite: the hot journal was rolled back on read)
    done = subprocess.run(
        [sys.executable, "-c", SAVER.replace("itertools.count()", "range(1)"), str(store), "99"],
        env=env_for(None),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert _check_memories(store) == saved + 1
    if backend == "yaml":
        assert _yaml_leftovers(store) == []
    else:
        assert not (tmp_path / "store.db-journal").exists()
    if oracle.slayer_python() is not None:
        loaded = oracle.ok(oracle.ask([{"op": "load", "store": str(store)}])[0])
        assert loaded["errors"] == []
        assert sum(m["learning"].startswith("crash probe") for m in loaded["memories"].values()) == saved + 1


# A save stopped at a chosen point (the driver announces it, then waits to be killed): right after the
# temp file is written and before its rename (YAML), or inside the open transaction (SQLite).
STOPPED = r"""
import os, sys, time
from slayer_lsp.catalog import load_catalog
from slayer_lsp.writer import memories as writer
from slayer_lsp.store.locate import locate

def stop(*args, **kwargs):
    print("stopped", flush=True)
    time.sleep(600)

if sys.argv[2] == "yaml":
    os.replace = stop
else:  # a page cache of one page: the open transaction spills its pages into the database file
    from slayer_lsp.store import transactions
    connect, put = transactions.connect, writer._put_row
    transactions.connect = lambda db, timeout: (c := connect(db, timeout), c.execute("PRAGMA cache_size = 1"))[0]
    writer._put_row = lambda conn, doc: (put(conn, doc), stop())
writer.save_memory(locate(sys.argv[1]), load_catalog(sys.argv[1]), learning="stopped mid-save " * 2000 + "END",
                   entities=["shop.books.sku"])
"""


@pytest.mark.parametrize("backend", ["yaml", "sqlite"])
def test_a_save_killed_at_its_most_fragile_point(tmp_path, backend):
    if backend == "yaml":
        store = tmp_path / "store"
        shutil.copytree(REPO / "examples" / "shop" / "store", store)
    else:
        store = tmp_path / "store.db"
        shutil.copyfile(REPO / "examples" / "shop" / "store.db", store)
    before = {k: d.digest for k, d in StoreReader(store).read().docs.items()}
    proc = subprocess.Popen(
        [sys.executable, "-c", STOPPED, str(store), backend],
        cwd=REPO,
        env=env_for(None),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "stopped"
    finally:
        proc.kill()
        proc.wait()
    if backend == "yaml":
        assert len(_yaml_leftovers(store)) == 1  # the dead writer's complete temp file, never renamed
    else:  # a hot journal: only a read-write connection may roll it back, a read-only one is refused
        with pytest.raises(sqlite3.OperationalError) as refused:
            sqlite3.connect(f"{store.as_uri()}?mode=ro", uri=True).execute("SELECT count(*) FROM memories")
        assert refused.value.sqlite_errorname == "SQLITE_READONLY_ROLLBACK"
    # the store reads as it was before the save began: no partial memory, nothing lost
    read = StoreReader(store).read()
    assert read.fatal is None and not read.issues
    assert {k: d.digest for k, d in read.docs.items()} == before
    if backend == "sqlite":
        assert not (tmp_path / "store.db-journal").exists()  # rolled back by the read
        with sqlite3.connect(store) as conn:
            assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    done = subprocess.run(
        [sys.executable, "-c", SAVER.replace("itertools.count()", "range(1)"), str(store), "1"],
        env=env_for(None),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert _check_memories(store) == 1
    if backend == "yaml":
        assert _yaml_leftovers(store) == []  # swept under the memories lock by the next save
