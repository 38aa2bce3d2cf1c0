"""A file or row planted in the store (issue #14, classes 4-7), at the reader and engine level.

Each case plants one hostile document beside the example store's own and checks that

* the reader refuses it with one load issue naming that path or row, and saying why;
* everything else loads exactly as from the clean store, and a search answers exactly as there;
* the on-disk cache is written and a second start served from it answers the same (a planted
  document used to make the cache write fail, or write a cache too large to load).

Policy under test (``slayer_lsp/store/safefs.py``): below the store's root no symbolic link is
followed, inside or outside, to a file or a directory; FIFOs, sockets and devices are never read;
documents are bounded (``slayer_lsp/store/limits.py``). The daemon-level twins are in
``tests/lsp/test_hostile_store_lsp.py``.
"""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import msgspec
import pytest

from slayer_lsp.engine import Engine
from slayer_lsp.store import documents as d
from slayer_lsp.store.cache import CachedDoc, StoreCache
from slayer_lsp.store.limits import (
    MAX_ALIAS_NODES,
    MAX_DOCUMENT_BYTES,
    MAX_LEARNING_CHARS,
    MAX_NESTING,
    LimitError,
    check_json_nesting,
)
from slayer_lsp.store.locate import locate

REPO = Path(__file__).resolve().parents[1]
SHOP = REPO / "examples" / "shop"
QUESTIONS = ("stock keeping unit", "customer city", "discount revenue", "order status")
LINK = "is a symbolic link; only regular files and real directories inside the store are read"


def billion_laughs(indent: str = "") -> str:
    """The classic: nine levels of nine aliases each, 10**9 strings once expanded, in ~700 bytes."""
    lines = [f'{indent}a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"{indent}a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)]
    return "\n".join(lines) + "\n"


def deep_alias(indent: str = "") -> str:
    """Few nodes, but each anchor nests the previous one: the depth only shows once expanded."""
    lines = [f"{indent}b0: &b0 [[[[[[[[[[1]]]]]]]]]]"]
    lines += [f"{indent}b{i}: &b{i} [[[[[[[[[[*b{i - 1}]]]]]]]]]]" for i in range(1, 8)]
    return "\n".join(lines) + "\n"


MODEL = "version: 15\nname: evil\ndata_source: shop\nsql_table: evil\ncolumns:\n- name: id\n  type: INT\n"


def model_with_meta(meta: str) -> str:
    return MODEL + "meta:\n" + meta


def memory_with_query(query: str) -> str:
    return "---\nentities:\n- shop.books.sku\nquery:\n" + query + "version: 4\n---\nA learning.\n"


# --------------------------------------------------------------------------- the stores


def yaml_store(root: Path) -> Path:
    dst = root / "store"
    shutil.copytree(SHOP / "store", dst, copy_function=shutil.copyfile)
    return dst


def sqlite_store(root: Path) -> Path:
    dst = root / "store.db"
    shutil.copyfile(SHOP / "store.db", dst)
    return dst


def outside(root: Path) -> Path:
    """A directory beside the store holding a valid model and memory: what a link would smuggle in."""
    out = root / "outside"
    (out / "models").mkdir(parents=True, exist_ok=True)
    (out / "models" / "evil.yaml").write_text(MODEL)
    (out / "secret.md").write_text("---\nentities: [shop]\n---\nSECRET-OUTSIDE-THE-STORE\n")
    return out


def served(engine: Engine) -> dict[str, object]:
    return {c: msgspec.to_builtins(e.obj) for c, e in engine.current().catalog.entities.items()}


def answers(engine: Engine) -> dict[str, list[str]]:
    return {q: [h.id for h in engine.search({"question": q, "max_results": 8}).results] for q in QUESTIONS}


def issues(engine: Engine) -> list[tuple[str, str | None, str, str]]:
    return [(i.source.path, i.source.row, i.severity, i.message) for i in engine.current().catalog.issues]


# --------------------------------------------------------------------------- the YAML cases


@dataclass(frozen=True)
class Planted:
    name: str
    plant: Callable[[Path, Path], Path]  # (store, outside dir) -> the path the issue names
    message: str  # a part of the issue's message


def _link(rel: str, target: Callable[[Path, Path], Path]) -> Callable[[Path, Path], Path]:
    def plant(store: Path, out: Path) -> Path:
        (store / rel).symlink_to(target(store, out))
        return store / rel

    return plant


def _write(rel: str, text: str | bytes) -> Callable[[Path, Path], Path]:
    def plant(store: Path, out: Path) -> Path:
        """Written whole, then renamed into place (as SLayer writes): a watcher never sees half of it."""
        path = store / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.planting")
        if isinstance(text, bytes):
            tmp.write_bytes(text)
        else:
            tmp.write_text(text)
        os.replace(tmp, path)
        return path

    return plant


def _fifo(rel: str) -> Callable[[Path, Path], Path]:
    def plant(store: Path, out: Path) -> Path:
        os.mkfifo(store / rel)
        return store / rel

    return plant


def _replace_dir_with_link(rel: str) -> Callable[[Path, Path], Path]:
    def plant(store: Path, out: Path) -> Path:
        (out / rel).mkdir(parents=True, exist_ok=True)
        for f in (store / rel).iterdir():
            shutil.copyfile(f, out / rel / f.name)
        (out / rel / "secret.md").write_text("---\nentities: [shop]\n---\nSECRET-OUTSIDE-THE-STORE\n")
        shutil.rmtree(store / rel)
        (store / rel).symlink_to(out / rel)
        return store / rel

    return plant


YAML_CASES = [
    Planted(
        "link to /proc/self/environ", _link("memories/x.md", lambda s, o: Path("/proc/self/environ")), LINK
    ),
    Planted(
        "link to a file outside",
        _link("models/shop/evil.yaml", lambda s, o: o / "models" / "evil.yaml"),
        LINK,
    ),
    Planted("link to a memory outside", _link("memories/x.md", lambda s, o: o / "secret.md"), LINK),
    Planted("link to a directory outside", _link("models/evil", lambda s, o: o / "models"), LINK),
    Planted("link to a file inside", _link("memories/x.md", lambda s, o: s / "memories" / "1.md"), LINK),
    Planted("dangling link", _link("memories/x.md", lambda s, o: s / "nowhere" / "x.md"), LINK),
    Planted("link to a directory as datasource file", _link("datasources/evil.yaml", lambda s, o: o), LINK),
    Planted("FIFO memory", _fifo("memories/x.md"), "is a FIFO"),
    Planted("FIFO model", _fifo("models/shop/evil.yaml"), "is a FIFO"),
    Planted(
        "billion laughs in a model's meta",
        _write("models/shop/evil.yaml", model_with_meta(billion_laughs("  "))),
        f"YAML aliases expand to more than {MAX_ALIAS_NODES} nodes",
    ),
    Planted(
        "billion laughs in a memory's query",
        _write("memories/x.md", memory_with_query(billion_laughs("  "))),
        f"YAML aliases expand to more than {MAX_ALIAS_NODES} nodes",
    ),
    Planted(
        "an alias inside its own anchor",
        _write("models/shop/evil.yaml", model_with_meta("  a: &a [1, *a]\n")),
        "YAML alias '*a' inside the node it names",
    ),
    Planted(
        "depth hidden in aliases",
        _write("models/shop/evil.yaml", model_with_meta(deep_alias("  "))),
        f"YAML nested deeper than {MAX_NESTING} levels once aliases are expanded",
    ),
    Planted(
        "meta nested 999 deep (flow)",
        _write("models/shop/evil.yaml", model_with_meta("  x: " + "[" * 999 + "]" * 999 + "\n")),
        f"YAML nested deeper than {MAX_NESTING} levels",
    ),
    Planted(
        "meta nested 999 deep (block)",
        _write(
            "models/shop/evil.yaml", model_with_meta("".join("  " + " " * i + "k:\n" for i in range(999)))
        ),
        f"YAML nested deeper than {MAX_NESTING} levels",
    ),
    Planted(
        "query nested 10**5 deep",
        _write("memories/x.md", memory_with_query("  x: " + "[" * 100_000 + "\n")),
        "nested deeper than",
    ),
    Planted(
        "a 50 MB model",
        _write("models/shop/evil.yaml", MODEL.encode() + b"#" * 50_000_000),
        f"is larger than {MAX_DOCUMENT_BYTES // 2**20} MiB",
    ),
    Planted(
        "a 50 MB memory",
        _write("memories/x.md", b"---\nentities: [shop]\n---\n" + b"a" * 50_000_000),
        f"is larger than {MAX_DOCUMENT_BYTES // 2**20} MiB",
    ),
]


@pytest.fixture(scope="module")
def clean_yaml(tmp_path_factory):
    engine = Engine(yaml_store(tmp_path_factory.mktemp("clean")), use_cache=False)
    engine.refresh()
    return served(engine), answers(engine)


@pytest.mark.parametrize("case", YAML_CASES, ids=lambda c: c.name)
def test_a_planted_yaml_document_is_refused_alone(tmp_path, monkeypatch, clean_yaml, case):
    monkeypatch.setenv("SLAYER_LSP_CACHE_DIR", str(tmp_path / "cache"))
    store = yaml_store(tmp_path)
    path = case.plant(store, outside(tmp_path))
    for start in ("cold", "from the cache"):
        engine = Engine(store)
        engine.refresh()
        got = issues(engine)
        assert len(got) == 1, (start, got)
        assert got[0][0] == str(path) and got[0][2] == "error" and case.message in got[0][3], (start, got)
        assert (served(engine), answers(engine)) == clean_yaml, start
        assert "SECRET" not in repr(served(engine))
        engine.close()
        assert (tmp_path / "cache").is_dir() and any((tmp_path / "cache").rglob("docs.msgpack")), start


@pytest.mark.parametrize("directory", ["memories", "datasources", "models/shop"])
def test_a_store_directory_replaced_by_a_link_lists_nothing(tmp_path, clean_yaml, directory):
    """``memories`` (or ``models/<ds>``, ``datasources``) as a link to a copy outside: refused as a
    whole, one issue; what it held is not served, everything else is."""
    store = yaml_store(tmp_path)
    path = _replace_dir_with_link(directory)(store, outside(tmp_path))
    engine = Engine(store, use_cache=False)
    engine.refresh()
    assert issues(engine) == [(str(path), None, "error", LINK)]
    kept = {
        c: v
        for c, v in clean_yaml[0].items()
        if not (directory == "memories" and c.startswith("memory:"))
        and not (directory == "models/shop" and c.startswith("shop."))
    }
    if directory == "datasources":
        assert "shop" not in served(engine)
    else:
        assert served(engine) == kept
    assert "SECRET" not in repr(served(engine))


def test_watcher_hints_do_not_bypass_the_rule(tmp_path, clean_yaml):
    """A refresh told which paths changed reads them through the same rule: a link reported by the
    watcher, a file inside a linked directory, a path spelled with ``..``."""
    store = yaml_store(tmp_path)
    out = outside(tmp_path)
    engine = Engine(store, use_cache=False)
    engine.refresh()
    (store / "memories" / "x.md").symlink_to(out / "secret.md")
    (store / "models" / "evil").symlink_to(out / "models")
    engine.refresh(
        [
            str(store / "memories" / "x.md"),
            str(store / "models" / "evil" / "evil.yaml"),
            str(store / "models" / ".." / ".." / "outside" / "secret.md"),
            str(store / "memories" / ".." / ".." / "outside" / "secret.md"),
        ]
    )
    got = {(p, m) for p, _row, _sev, m in issues(engine)}
    assert got == {
        (str(store / "memories" / "x.md"), LINK),
        (str(store / "models" / "evil" / "evil.yaml"), f"'models/evil' {LINK}"),
    }
    assert (served(engine), answers(engine)) == clean_yaml
    engine.refresh()  # the full listing refuses the directory link itself
    assert {p for p, *_ in issues(engine)} == {
        str(store / "memories" / "x.md"),
        str(store / "models" / "evil"),
    }
    assert (served(engine), answers(engine)) == clean_yaml


def test_a_file_replaced_by_a_link_keeps_its_last_good_version_never_the_target(tmp_path):
    store = yaml_store(tmp_path)
    out = outside(tmp_path)
    engine = Engine(store, use_cache=False)
    engine.refresh()
    before = served(engine)
    memory = store / "memories" / "1.md"
    memory.unlink()
    memory.symlink_to(out / "secret.md")
    engine.refresh([str(memory)])
    assert served(engine) == before
    assert [m for p, _r, _s, m in issues(engine) if p == str(memory)] == [
        f"{LINK}; serving its last good version"
    ]


def test_a_long_learning_is_kept_up_to_the_bound_with_a_warning(tmp_path):
    store = yaml_store(tmp_path)
    words = "tundra " * (MAX_LEARNING_CHARS // 7 + 1000)
    (store / "memories" / "x.md").write_text("---\nentities:\n- shop.books.sku\nversion: 4\n---\n" + words)
    engine = Engine(store, use_cache=False)
    engine.refresh()
    memory = engine.current().catalog.memory("x")
    assert memory is not None and memory.learning == words[:MAX_LEARNING_CHARS]
    assert issues(engine) == [
        (
            str(store / "memories" / "x.md"),
            None,
            "warning",
            f"learning is {len(words)} characters long; only the first {MAX_LEARNING_CHARS} are kept",
        )
    ]
    assert "x" in [h.id for h in engine.search({"question": "tundra", "max_results": 3}).results]


# --------------------------------------------------------------------------- the SQLite cases


@dataclass(frozen=True)
class Row:
    name: str
    table: str
    sql: tuple[str, ...]  # statements that plant the row (parameters: none)
    row: str  # the row the issue names
    message: str


def _loose(table: str) -> str:
    """Rebuild a table without its constraints (the attacker owns the file: NOT NULL is no guarantee)."""
    return f"CREATE TABLE loose AS SELECT * FROM {table}; DROP TABLE {table}; ALTER TABLE loose RENAME TO {table}"


DEEP_JSON = "[" * 100_000 + "]" * 100_000
SQLITE_CASES = [
    Row(
        "memory: BLOB data",
        "memories",
        ("INSERT INTO memories (id, data) VALUES ('evil', CAST('{}' AS BLOB))",),
        "evil",
        "data is a BLOB, not JSON text",
    ),
    Row(
        "model: BLOB data",
        "models",
        ("INSERT INTO models (data_source, name, data) VALUES ('shop', 'evil', X'7b7d')",),
        "shop.evil",
        "data is a BLOB, not JSON text",
    ),
    Row(
        "memory: JSON nested 10**5 deep",
        "memories",
        (
            f'INSERT INTO memories (id, data) VALUES (\'evil\', \'{{"id": "evil", "query": {{"x": {DEEP_JSON}}}}}\')',
        ),
        "evil",
        f"JSON nested deeper than {MAX_NESTING} levels",
    ),
    Row(
        "model: JSON nested 10**5 deep",
        "models",
        (
            f"INSERT INTO models (data_source, name, data) VALUES ('shop', 'evil', "
            f'\'{{"name": "evil", "meta": {DEEP_JSON}}}\')',
        ),
        "shop.evil",
        f"JSON nested deeper than {MAX_NESTING}",
    ),
    Row(
        "model: JSON nested 999 deep",
        "models",
        (
            "INSERT INTO models (data_source, name, data) VALUES ('shop', 'evil', "
            '\'{"name": "evil", "meta": ' + "[" * 999 + "]" * 999 + "}')",
        ),
        "shop.evil",
        "JSON nested deeper",
    ),
    Row(
        "memory: NULL id",
        "memories",
        (_loose("memories"), "INSERT INTO memories (id, data) VALUES (NULL, '{}')"),
        "#1 (NULL id)",
        "row has NULL id; not loaded",
    ),
    Row(
        "model: NULL name",
        "models",
        (_loose("models"), "INSERT INTO models (data_source, name, data) VALUES ('shop', NULL, '{}')"),
        "#1 (NULL name)",
        "row has NULL name; not loaded",
    ),
    Row(
        "model: BLOB key",
        "models",
        ("INSERT INTO models (data_source, name, data) VALUES (X'00ff', 'e', '{}')",),
        "#6 (a BLOB data_source)",
        "row has a BLOB data_source; not loaded",
    ),
    Row(
        "memory: NULL data",
        "memories",
        (_loose("memories"), "INSERT INTO memories (id, data) VALUES ('evil', NULL)"),
        "evil",
        "data is NULL, not JSON text",
    ),
    Row(
        "memory: invalid JSON",
        "memories",
        ("INSERT INTO memories (id, data) VALUES ('evil', '{\"id\": ')",),
        "evil",
        "cannot be loaded: Input data was truncated",
    ),
    Row(
        "model: invalid JSON",
        "models",
        ("INSERT INTO models (data_source, name, data) VALUES ('shop', 'evil', '{\"name\": [}')",),
        "shop.evil",
        "cannot be loaded: JSON is malformed",
    ),
    Row(
        "memory: wrong types",
        "memories",
        ('INSERT INTO memories (id, data) VALUES (\'evil\', \'{"id": "evil", "entities": 7}\')',),
        "evil",
        "Expected `array`, got `int`",
    ),
    Row(
        "model: wrong types",
        "models",
        (
            "INSERT INTO models (data_source, name, data) VALUES ('shop', 'evil', "
            '\'{"name": 5, "columns": "x"}\')',
        ),
        "shop.evil",
        "Expected `str`, got `int`",
    ),
    Row(
        "model: a 5 MB row",
        "models",
        (
            "INSERT INTO models (data_source, name, data) VALUES ('shop', 'evil', "
            '\'{"name": "evil", "description": "\' || hex(zeroblob(2621440)) || \'"}\')',
        ),
        "shop.evil",
        f"is larger than {MAX_DOCUMENT_BYTES // 2**20} MiB",
    ),
]


@pytest.fixture(scope="module")
def clean_sqlite(tmp_path_factory):
    engine = Engine(sqlite_store(tmp_path_factory.mktemp("clean")), use_cache=False)
    engine.refresh()
    return served(engine), answers(engine)


def plant_rows(db: Path, statements: tuple[str, ...]) -> None:
    conn = sqlite3.connect(db)
    try:
        for sql in statements:
            conn.executescript(sql)
        conn.commit()
    finally:
        conn.close()


@pytest.mark.parametrize("case", SQLITE_CASES, ids=lambda c: c.name)
def test_a_planted_sqlite_row_is_refused_alone(tmp_path, monkeypatch, clean_sqlite, case):
    monkeypatch.setenv("SLAYER_LSP_CACHE_DIR", str(tmp_path / "cache"))
    db = sqlite_store(tmp_path)
    plant_rows(db, case.sql)
    engine = Engine(db)
    engine.refresh()
    got = issues(engine)
    assert len(got) == 1, got
    assert got[0][:3] == (str(db), case.row, "error") and case.message in got[0][3], got
    assert (served(engine), answers(engine)) == clean_sqlite
    engine.close()
    # the next read of the same reader (a long-lived daemon) says the same, and so does a new start
    engine.refresh()
    assert issues(engine) == got
    again = Engine(db)
    again.refresh()
    assert issues(again) == got and (served(again), answers(again)) == clean_sqlite


def test_json_nesting_is_measured_outside_strings():
    check_json_nesting('{"a": "' + "[" * 500 + '", "b": [[1]]}')  # brackets in a string do not nest
    check_json_nesting('["\\"' + "[" * 500 + '"]')  # nor after an escaped quote
    check_json_nesting("[" * MAX_NESTING + "]" * MAX_NESTING)
    with pytest.raises(LimitError):
        check_json_nesting("[" * (MAX_NESTING + 1) + "]" * (MAX_NESTING + 1))
    with pytest.raises(LimitError):  # a string's quote cannot hide real brackets: "]" pairs nothing
        check_json_nesting('[ "]", ' * 100 + "1" + "]" * 100)
    with pytest.raises(LimitError):  # unclosed: refused before a decoder recurses into it
        check_json_nesting("[" * 100_000)


def _depth(value: object) -> int:
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


@pytest.mark.parametrize("seed", range(4))
def test_json_nesting_is_refused_exactly_past_the_limit(seed):
    """Well-formed JSON whose strings are full of brackets, quotes, escapes and empty strings (the
    cases the check cuts out at C speed) is refused exactly when it nests deeper than the limit."""
    import json
    import random

    rng = random.Random(seed)
    pieces = ["[", "]", "{", "}", '"', "\\", '\\"', "", "é", "x", "\n"]

    def value(depth: int) -> object:
        roll = rng.random()
        if depth and roll < 0.35:
            return [value(depth - 1) for _ in range(rng.randint(0, 3))]
        if depth and roll < 0.7:
            return {
                "".join(rng.choices(pieces, k=rng.randint(0, 3))): value(depth - 1)
                for _ in range(rng.randint(0, 3))
            }
        return "".join(rng.choices(pieces, k=rng.randint(0, 4))) if roll < 0.9 else rng.randint(0, 9)

    for _ in range(400):
        doc = value(rng.randint(0, 9))
        text = json.dumps(doc, ensure_ascii=rng.random() < 0.5)
        limit = rng.randint(1, 8)
        if _depth(doc) > limit:
            with pytest.raises(LimitError):
                check_json_nesting(text, limit)
        else:
            check_json_nesting(text, limit)


# --------------------------------------------------------------------------- the cache


def test_a_cache_that_cannot_be_encoded_is_skipped_not_fatal(tmp_path, caplog):
    """A value the encoder refuses (nesting past msgpack's limit, which the reader never lets through)
    is a warning and no file; the process goes on."""
    cache = StoreCache(locate(tmp_path / "store"), tmp_path / "cache")
    meta: object = 1
    for _ in range(5000):
        meta = [meta]
    model = d.Model(name="m", data_source="ds", meta=meta)
    with caplog.at_level(logging.WARNING):
        cache.save_docs([CachedDoc("p", (1, 2, 3, 4), "model", "ds.m", "x", model=model)])
    assert "cannot write cache" in caplog.text
    assert not (tmp_path / "cache" / "docs.msgpack").exists() and cache.load_docs() == []


def test_a_cache_file_too_large_or_undecodable_is_discarded_and_rebuilt(tmp_path, monkeypatch, clean_yaml):
    monkeypatch.setenv("SLAYER_LSP_CACHE_DIR", str(tmp_path / "cache"))
    store = yaml_store(tmp_path)
    first = Engine(store)
    first.refresh()
    first.close()
    [docs] = list((tmp_path / "cache").rglob("docs.msgpack"))
    for garbage in (b"\xc1" * 100, b"\x91" * 200_000, b"\x00" * 100):
        docs.write_bytes(garbage)
        engine = Engine(store)
        engine.refresh()
        assert (served(engine), answers(engine)) == clean_yaml and issues(engine) == []
        engine.close()
        assert docs.read_bytes() != garbage  # rebuilt
    monkeypatch.setattr("slayer_lsp.store.cache.MAX_CACHE_BYTES", 100)
    engine = Engine(store)
    engine.refresh()
    assert (served(engine), answers(engine)) == clean_yaml
    assert not docs.exists()  # discarded (and not written again: still over the bound)
    engine.close()
    assert not docs.exists()


# --------------------------------------------------------------------------- the command line


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "slayer_lsp", *args],
        capture_output=True,
        text=True,
        cwd=str(REPO),
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
        timeout=120,
    )


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["yaml", "sqlite"])
def test_the_cli_answers_on_a_hostile_store_and_check_reports_it(tmp_path, backend):
    """``search``, ``status`` and ``inspect`` answer with the load issues as warnings; ``check`` fails
    on them. No traceback, no secret."""
    env = {"SLAYER_LSP_CACHE_DIR": str(tmp_path / "cache"), "SLAYER_HOSTILE_SECRET": "s3cr3t-v4lue"}
    if backend == "yaml":
        store = yaml_store(tmp_path)
        out = outside(tmp_path)
        (store / "memories" / "x.md").symlink_to("/proc/self/environ")
        (store / "models" / "evil").symlink_to(out / "models")
        os.mkfifo(store / "memories" / "fifo.md")
        (store / "models" / "shop" / "deep.yaml").write_text(
            model_with_meta("  x: " + "[" * 999 + "]" * 999 + "\n")
        )
        (store / "models" / "shop" / "lol.yaml").write_text(model_with_meta(billion_laughs("  ")))
        expected = 5
    else:
        store = sqlite_store(tmp_path)
        plant_rows(
            store,
            (
                SQLITE_CASES[0].sql[0],
                SQLITE_CASES[3].sql[0],
                _loose("memories"),
                "INSERT INTO memories (id, data) VALUES (NULL, '{}')",
            ),
        )
        expected = 3
    storage = ("--storage", str(store))
    for args in (
        ("search", "--question", "customer city", "--no-dense"),
        ("status",),
        ("inspect", "books.sku"),
        ("search", "--question", "lol", "--format", "json", "--no-dense"),
    ):
        res = cli(*args, *storage, env=env)
        assert res.returncode == 0, (args, res.stderr)
        assert "Traceback" not in res.stderr and "s3cr3t" not in res.stdout + res.stderr, args
        assert res.stderr.count("warning: ") == expected, (args, res.stderr)
    assert f"load issues: {expected}" in cli("status", *storage, env=env).stdout
    res = cli("check", *storage, "--format", "json", env=env)
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    found = msgspec.json.decode(res.stdout)
    assert sum(1 for f in found if f["code"] == "load-issue" and f["severity"] == "error") == expected, found
    if (
        backend == "yaml"
    ):  # a directory argument walks the store: the FIFO is not opened, the link not followed
        res = cli("check", *storage, str(store), "--format", "json", env=env)
        assert res.returncode == 1 and "Traceback" not in res.stderr and "s3cr3t" not in res.stdout, (
            res.stderr
        )
