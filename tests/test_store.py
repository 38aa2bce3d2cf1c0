"""The store readers and the catalog snapshot: both backends, bad input, incremental derivation."""

from __future__ import annotations

import os
import shutil
import sqlite3
import threading
import time

import pytest
import yaml

from slayer_lsp.catalog import Catalog, load_catalog
from slayer_lsp.store import fastyaml
from slayer_lsp.store.locate import expand_env, locate
from slayer_lsp.store.reader import StoreReader, split_front_matter
from tests.conftest import SQLITE_STORE, YAML_STORE

# --------------------------------------------------------------------------- both backends agree


def test_yaml_and_sqlite_give_the_same_catalog(yaml_catalog, sqlite_catalog):
    assert yaml_catalog.issues == () and sqlite_catalog.issues == ()
    assert set(yaml_catalog.entities) == set(sqlite_catalog.entities)
    for cid, ent in yaml_catalog.entities.items():
        assert sqlite_catalog.entities[cid].obj == ent.obj, cid
    assert yaml_catalog.priority == sqlite_catalog.priority == ("jaffle", "supplies")
    # listing orders differ exactly as SLayer's do: YAML by (created_at, id), SQLite by id as text
    assert yaml_catalog.memory_order[:3] == ("1", "2", "3")
    assert sqlite_catalog.memory_order[:3] == ("1", "10", "11")


def test_catalog_contents(yaml_catalog):
    cat = yaml_catalog
    assert sorted(cat.datasources) == ["jaffle", "supplies"]
    assert cat.models_by_name["products"] == ("jaffle", "supplies")
    assert cat.kind_of("jaffle.orders.total_revenue") == "measure"
    assert cat.kind_of("jaffle.orders.avg_nonzero") == "aggregation"
    assert cat.kind_of("memory:kb.revenue") == "memory"
    assert cat.get("jaffle.customers.email").hidden  # hidden column
    assert cat.get("jaffle.supplies").hidden and cat.get("jaffle.supplies.cost").hidden  # hidden model
    assert cat.children("jaffle.orders")[:3] == (
        "jaffle.orders.id",
        "jaffle.orders.customer_id",
        "jaffle.orders.store_id",
    )
    assert "jaffle.orders" in cat.children("jaffle")
    assert Catalog.parent("jaffle.orders.status") == "jaffle.orders"
    status = cat.get("jaffle.orders.status").obj
    assert status.sampled_values == ["completed", "returned", "pending"] and status.distinct_count == 3
    assert cat.get("jaffle.orders.subtotal").obj.format.symbol == "$"
    mem6 = cat.memory("6")
    assert mem6.query["source_model"] == "orders" and mem6.description.startswith("Example")
    assert cat.stale_tags(cat.memory("5")) == ["jaffle.customers.loyalty_tier"]
    assert "jaffle.customers.email" in cat.valid_canonicals  # hidden entities are valid tags
    # ${ENV} placeholders are kept verbatim and expanded only on request
    conn = cat.datasources["jaffle"].connection_string
    assert conn == "sqlite:///${SLAYER_FIXTURE_DIR}/jaffle.db"
    text, missing = expand_env(conn)
    assert (text == conn and missing == ["SLAYER_FIXTURE_DIR"]) or "SLAYER_FIXTURE_DIR" in os.environ


@pytest.mark.parametrize(
    "raw,backend,suffix",
    [
        ("store.db", "sqlite", "store.db"),
        ("x/store.sqlite3", "sqlite", "store.sqlite3"),
        ("sqlite:///tmp/s.db", "sqlite", "s.db"),
        ("yaml:///tmp/store", "yaml", "store"),
        ("some/dir", "yaml", "dir"),
        ("weird.DB", "sqlite", "weird.DB"),
    ],
)
def test_backend_choice(raw, backend, suffix):
    loc = locate(raw)
    assert loc.backend == backend and loc.path.name == suffix


def test_storage_lookup_order(monkeypatch, tmp_path):
    monkeypatch.delenv("SLAYER_STORAGE", raising=False)
    monkeypatch.delenv("SLAYER_MODELS_DIR", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert locate().path == tmp_path / "slayer"
    monkeypatch.setenv("SLAYER_MODELS_DIR", "/m")
    assert str(locate().path) == "/m"
    monkeypatch.setenv("SLAYER_STORAGE", "/s.db")
    assert locate().backend == "sqlite"


# --------------------------------------------------------------------------- bad input


@pytest.fixture()
def yaml_copy(tmp_path):
    dst = tmp_path / "store"
    shutil.copytree(YAML_STORE, dst)
    return dst


@pytest.fixture()
def sqlite_copy(tmp_path):
    dst = tmp_path / "store.db"
    shutil.copy(SQLITE_STORE, dst)
    return dst


BAD_FILES = [
    # (relative path, bytes, expected fragment of the issue message)
    (
        "models/jaffle/orders.yaml",
        b"version: 15\nname: orders\ncolumns:\n- name: id\n  type: [",
        "invalid YAML",
    ),
    ("models/jaffle/stores.yaml", b"version: 15\nname: stores\ncolumns: 7\n", "cannot be loaded"),
    ("memories/4.md", b"---\ncreated_at: '2026-01-01'\n\xff\xfe bad bytes\n---\nx", "not UTF-8"),
    ("datasources/supplies.yaml", b"- just\n- a list\n", "expected a mapping"),
]


@pytest.mark.parametrize("rel,content,message", BAD_FILES)
def test_bad_file_is_an_issue_and_everything_else_loads(yaml_copy, rel, content, message):
    good = load_catalog(yaml_copy)
    (yaml_copy / rel).write_bytes(content)
    cat = load_catalog(yaml_copy)
    assert cat.fatal is None
    issues = [i for i in cat.issues if i.source.path.endswith(rel)]
    assert len(issues) == 1 and message in issues[0].message, cat.issues
    lost = set(good.entities) - set(cat.entities)
    # only the broken document's own entities are missing
    assert lost and all(e.source.path.endswith(rel) for e in (good.entities[c] for c in lost))


def test_duplicate_columns_future_version_and_no_front_matter(yaml_copy):
    orders = yaml_copy / "models/jaffle/orders.yaml"
    data = yaml.safe_load(orders.read_text())
    data["version"] = 99
    data["columns"].append(dict(data["columns"][0], description="a second id"))
    data["brand_new_field"] = {"x": 1}
    orders.write_text(yaml.safe_dump(data, sort_keys=False))
    (yaml_copy / "memories/77.md").write_text("Just a learning, no front matter.")
    cat = load_catalog(yaml_copy)
    messages = [str(i) for i in cat.issues]
    assert any("duplicate column 'id'" in m for m in messages)
    assert any("version 99 is newer" in m for m in messages)
    assert any("no YAML front matter" in m for m in messages)
    assert cat.get("jaffle.orders.id").obj.description is None  # the first definition wins
    assert cat.memory("77").learning == "Just a learning, no front matter."


def test_dotfiles_and_temp_files_are_skipped(yaml_copy):
    (yaml_copy / "memories/.1.md.tmp.abcd1234").write_text("---\nversion: 4\n---\nhalf written")
    (yaml_copy / "models/jaffle/.orders.yaml.tmp.x").write_text("version: 15\nname: half")
    cat = load_catalog(yaml_copy)
    assert cat.issues == () and "memory:.1.md.tmp" not in cat.entities


def test_missing_store_is_fatal_not_an_exception(tmp_path):
    for path in (tmp_path / "nope", tmp_path / "nope.db"):
        cat = load_catalog(path)
        assert cat.fatal and "does not exist" in cat.fatal


def test_corrupted_sqlite_is_reported(sqlite_copy):
    with open(sqlite_copy, "r+b") as fh:
        fh.seek(0)
        fh.write(b"garbage" * 20)
    cat = load_catalog(sqlite_copy)
    assert cat.fatal and "cannot read SQLite store" in cat.fatal


def test_bad_sqlite_row_is_an_issue(sqlite_copy):
    with sqlite3.connect(sqlite_copy) as conn:
        conn.execute("UPDATE models SET data = '{\"name\": 5' WHERE name = 'orders'")
    cat = load_catalog(sqlite_copy)
    assert any("jaffle.orders" in str(i) for i in cat.issues)
    assert "jaffle.customers" in cat.entities and "jaffle.orders" not in cat.entities


def test_locked_sqlite_keeps_the_last_good_snapshot(sqlite_copy):
    reader = StoreReader(sqlite_copy)
    reader._impl.busy_timeout = 0.2
    first = Catalog.from_read(reader.read())
    locker = sqlite3.connect(sqlite_copy)
    locker.execute("BEGIN EXCLUSIVE")
    try:
        read = reader.read()
        assert read.fatal and "locked" in read.fatal
        snap, delta = first.derive(read)
        assert snap.fatal and delta.empty and set(snap.entities) == set(first.entities)
    finally:
        locker.rollback()
        locker.close()
    healed, _ = snap.derive(reader.read())
    assert healed.fatal is None


def test_reader_never_writes(sqlite_copy, yaml_copy):
    before = {p: p.stat().st_mtime_ns for p in yaml_copy.rglob("*")}
    db_bytes = sqlite_copy.read_bytes()
    load_catalog(yaml_copy)
    load_catalog(sqlite_copy)
    assert before == {p: p.stat().st_mtime_ns for p in yaml_copy.rglob("*")}
    assert sqlite_copy.read_bytes() == db_bytes


# --------------------------------------------------------------------------- incremental


def test_derive_touches_only_what_changed(yaml_copy):
    reader = StoreReader(yaml_copy)
    cat = Catalog.from_read(reader.read())
    same, delta = cat.derive(reader.read())
    assert same is cat and delta.empty
    orders = yaml_copy / "models/jaffle/orders.yaml"
    data = yaml.safe_load(orders.read_text())
    data["columns"] = [c for c in data["columns"] if c["name"] != "discount_code"]
    data["columns"][4]["description"] = "Changed."
    orders.write_text(yaml.safe_dump(data, sort_keys=False))
    (yaml_copy / "memories/12.md").unlink()
    (yaml_copy / "memories/50.md").write_text("---\nentities:\n- jaffle.orders\nversion: 4\n---\nNew one.")
    nxt, delta = cat.derive(reader.read())
    assert delta.removed == {"jaffle.orders.discount_code", "memory:12"}
    assert delta.added == {"memory:50"}
    assert delta.changed == {"jaffle.orders", f"jaffle.orders.{data['columns'][4]['name']}"}
    assert nxt.generation == cat.generation + 1
    assert "jaffle.orders.discount_code" not in nxt.children("jaffle.orders")
    # the old snapshot is untouched
    assert "jaffle.orders.discount_code" in cat.entities and "memory:12" in cat.entities
    fresh = load_catalog(yaml_copy)
    assert set(fresh.entities) == set(nxt.entities) and fresh.memory_order == nxt.memory_order


def test_model_removed_and_added_updates_lookups(yaml_copy):
    reader = StoreReader(yaml_copy)
    cat = Catalog.from_read(reader.read())
    (yaml_copy / "models/supplies/products.yaml").unlink()
    nxt, _ = cat.derive(reader.read())
    assert nxt.models_by_name["products"] == ("jaffle",)
    assert "supplies.products" not in nxt.children("supplies")


def test_rescan_reparses_only_changed_files(yaml_copy, monkeypatch):
    reader = StoreReader(yaml_copy)
    reader.read()
    calls = []
    real = fastyaml.load
    monkeypatch.setattr(fastyaml, "load", lambda text: calls.append(1) or real(text))
    reader.read()
    assert calls == []
    time.sleep(0.01)
    (yaml_copy / "memories/1.md").write_text((yaml_copy / "memories/1.md").read_text() + " more")
    reader.read()
    assert len(calls) == 1


def test_concurrent_atomic_replace_never_breaks_a_read(yaml_copy):
    """SLayer replaces files atomically; a reader racing with it sees the old or the new file."""
    target = yaml_copy / "models/jaffle/orders.yaml"
    original = target.read_text()
    stop = threading.Event()

    def writer():
        i = 0
        while not stop.is_set():
            tmp = target.with_name(f".orders.yaml.tmp.{i}")
            tmp.write_text(original.replace("Customer orders", f"Customer orders {i}"))
            os.replace(tmp, target)
            i += 1

    t = threading.Thread(target=writer)
    t.start()
    try:
        reader = StoreReader(yaml_copy)
        for _ in range(30):
            read = reader.read()
            assert read.fatal is None and not read.issues
            assert any(k.name == "jaffle.orders" for k in read.docs)
    finally:
        stop.set()
        t.join()


# --------------------------------------------------------------------------- YAML details


@pytest.mark.parametrize(
    "text",
    [
        "a: 1\nb: [1, 2.5, yes, no, ~, null, 0x1F, 1_000, '3', 1e3, .inf, 1:20, '']\nc: {d: e}\n",
        "- &x {a: 1}\n- *x\n",
        "<<: {a: 1}\nb: 2\n",
        "",
        "x",
        "a: !!str 5\n",
        "a:\n- b\n-\n  c: 1\n",
        "a: 1\na: 2\n",
        'd: "\\xE9t\\u2013"\n',
    ],
)
def test_fast_yaml_equals_safe_load(text):
    assert fastyaml.load(text) == yaml.safe_load(text)


def test_fast_yaml_keeps_timestamps_as_text():
    assert fastyaml.load("t: 2026-11-30T04:22:12.008273Z\nd: 2024-01-01\n") == {
        "t": "2026-11-30T04:22:12.008273Z",
        "d": "2024-01-01",
    }


def test_memory_front_matter_split():
    assert split_front_matter("---\na: 1\n---\nbody\n---\nmore") == ({"a": 1}, "body\n---\nmore")
    assert split_front_matter("no front") == (None, "no front")
    assert split_front_matter("---\na: 1\n---") == ({"a": 1}, "")


def test_watcher_hints_read_only_the_changed_paths(yaml_copy, monkeypatch):
    reader = StoreReader(yaml_copy)
    full = reader.read()
    (yaml_copy / "memories/1.md").write_text("---\nversion: 4\n---\nrewritten")
    (yaml_copy / "memories/2.md").unlink()
    (yaml_copy / "models/jaffle/brand_new.yaml").write_text(
        "version: 15\nname: brand_new\ndata_source: jaffle\n"
    )
    (yaml_copy / "memories/.3.md.tmp.x").write_text("half")
    stats = []
    real_stat = os.stat
    monkeypatch.setattr(os, "stat", lambda p, *a, **k: stats.append(str(p)) or real_stat(p, *a, **k))
    hinted = reader.read(
        changed=[
            str(yaml_copy / "memories/1.md"),
            str(yaml_copy / "memories/2.md"),
            str(yaml_copy / "models/jaffle/brand_new.yaml"),
            str(yaml_copy / "memories/.3.md.tmp.x"),
            str(yaml_copy / "memories.lock"),
        ]
    )
    monkeypatch.undo()
    fresh = StoreReader(yaml_copy).read()
    assert list(hinted.docs) == list(fresh.docs)  # same documents, same order as a full listing
    assert all(hinted.docs[k].digest == fresh.docs[k].digest for k in fresh.docs)
    assert len(fresh.docs) == len(full.docs)  # one memory gone, one model added
    assert len(stats) <= 2 * 5  # the root and the hinted paths only, never every file


def _replace(rel: str, old: str, new: str):
    def edit(store):
        path = store / rel
        path.write_text(path.read_text().replace(old, new, 1))
        return [rel]

    return edit


def _write(rel: str, text: str):
    def edit(store):
        (store / rel).write_text(text)
        return [rel]

    return edit


def _restore(rel: str):
    def edit(store):
        shutil.copy(YAML_STORE / rel, store / rel)
        return [rel]

    return edit


def _remove(rel: str):
    def edit(store):
        (store / rel).unlink()
        return [rel]

    return edit


ZZ_ORDERS = "version: 15\nname: orders\ndata_source: jaffle\n"


def _two_files_one_key(store):
    for name in ("b_twin", "a_twin"):
        (store / "models/jaffle" / f"{name}.yaml").write_text(
            "version: 15\nname: twin\ndata_source: jaffle\n"
        )
    return ["models/jaffle/b_twin.yaml", "models/jaffle/a_twin.yaml"]


MEMORY = "---\nid: {id}\nentities: [jaffle.orders]\n---\nOrders ship within {id} days.\n"

# (what the step does; whether the last read with the edited documents swapped in served it)
EDIT_STEPS = [
    ("a column described", _replace("models/jaffle/orders.yaml", "Order lifecycle", "Order state"), True),
    ("a memory reworded", _replace("memories/3.md", "Chicago", "Zebracorn City"), True),
    ("a watched path that is no document", _write("memories/.3.md.tmp.x", "half"), True),
    ("a memory added", _write("memories/55.md", MEMORY.format(id=55)), True),
    ("a memory added first in order", _write("memories/0a.md", MEMORY.format(id="0a")), True),
    (
        "a model added",
        _write("models/jaffle/aaa_new.yaml", "version: 15\nname: aaa_new\ndata_source: jaffle\n"),
        True,
    ),
    ("a memory removed", _remove("memories/4.md"), True),
    ("a model removed", _remove("models/jaffle/aaa_new.yaml"), True),
    (
        "a file added under a key another holds",
        _write("models/jaffle/zzz.yaml", "version: 15\nname: customers\ndata_source: jaffle\n"),
        False,
    ),
    ("that file removed", _remove("models/jaffle/zzz.yaml"), False),
    ("two files added under one new key", _two_files_one_key, False),
    ("a model broken", _write("models/jaffle/stores.yaml", "name: [unclosed"), False),
    ("the broken model edited again", _write("models/jaffle/stores.yaml", "name: [still unclosed"), False),
    ("the broken model mended", _restore("models/jaffle/stores.yaml"), False),
    ("the mended model edited", _replace("models/jaffle/stores.yaml", "name: stores", "name: stores "), True),
    ("a broken file added", _write("memories/66.md", "---\nid: [\n---\nx"), False),
    ("the broken file removed", _remove("memories/66.md"), False),
    (
        "a model renamed in its file",
        _replace("models/supplies/products.yaml", "name: products", "name: goods"),
        False,
    ),
    ("a second file claims a model", _write("models/jaffle/zz_orders.yaml", ZZ_ORDERS), False),
    (
        "the file that lost the duplicate edited",
        _write("models/jaffle/zz_orders.yaml", ZZ_ORDERS + "description: x\n"),
        False,
    ),
    (
        "the file that won the duplicate edited",
        _replace("models/jaffle/orders.yaml", "Order state", "Order status"),
        True,
    ),
    ("a memory added while a duplicate stands", _write("memories/77.md", MEMORY.format(id=77)), False),
    ("a memory removed while a duplicate stands", _remove("memories/5.md"), False),
]


def test_an_edit_hinted_by_the_watcher_reads_as_a_full_listing_does(tmp_path, monkeypatch):
    """After each step the hinted read equals the full listing of a reader with the same history
    (documents, their order, digests, issues), whether it was served by swapping the edited
    documents into the last read or by going through the listing."""
    from slayer_lsp.store.reader import YamlReader

    store = tmp_path / "store"
    shutil.copytree(YAML_STORE, store)
    served = []
    real = YamlReader._edited

    def spy(self, *args):
        result = real(self, *args)
        served.append(result is not None)
        return result

    monkeypatch.setattr(YamlReader, "_edited", spy)
    hinted_reader, full_reader = StoreReader(store), StoreReader(store)
    catalog = Catalog.from_read(hinted_reader.read())
    full_reader.read()
    for name, step, quick in EDIT_STEPS:
        time.sleep(0.002)  # a new mtime for a rewrite of the same size
        changed = [str(store / rel) for rel in step(store)]
        served.clear()
        hinted = hinted_reader.read(changed=changed)
        assert served == [quick], name
        full = full_reader.read()
        assert list(hinted.docs) == list(full.docs), name
        assert [d.digest for d in hinted.docs.values()] == [d.digest for d in full.docs.values()], name
        assert [(str(i.source), i.message) for i in hinted.issues] == [
            (str(i.source), i.message) for i in full.issues
        ], name
        catalog = catalog.derive(hinted)[0]  # and the snapshot derived from it is a fresh one's
        fresh = Catalog.from_read(full)
        assert dict(catalog.models_by_name) == dict(fresh.models_by_name), name
        assert catalog.models_in_order() == fresh.models_in_order(), name
        assert dict(catalog.children_of) == dict(fresh.children_of), name
        assert set(catalog.entities) == set(fresh.entities), name
        assert catalog.memory_order == fresh.memory_order, name
        assert list(catalog.memories.items()) == list(fresh.memories.items()), name  # carried on, next step


def test_sqlite_model_rows_decode_as_the_documents_conversion_does(sqlite_copy):
    """A model row is decoded straight into the struct; every verdict (the model, or the error) is
    the one converting the row's JSON value gives, as the YAML reader converts a parsed file."""
    import json
    import random

    import msgspec

    from slayer_lsp.store.reader import DocKey, Source, decode_model

    rng = random.Random(11)
    values = [None, 1, -1, 2.5, "x", "1", "true", True, False, [], {}, [1], {"a": 1}, "int", "2024-01-01"]
    conn = sqlite3.connect(sqlite_copy)
    originals = [(ds, json.loads(text)) for ds, text in conn.execute("SELECT data_source, data FROM models")]
    expected: dict[str, object] = {}
    with conn:
        for i in range(300):
            ds, model = rng.choice(originals)
            obj = json.loads(json.dumps(model))
            target = obj
            for _ in range(rng.randint(0, 3)):  # somewhere inside: a column, a join, a format...
                inner = [v for v in (target.values() if isinstance(target, dict) else target) if v]
                inner = [v for v in inner if isinstance(v, (dict, list))]
                if inner:
                    target = rng.choice(inner)
            if isinstance(target, dict):
                key = rng.choice(
                    [k for k in target if target is not obj or k not in ("name", "data_source")] + ["x"]
                )
                if rng.random() < 0.2:
                    target.pop(key, None)
                else:
                    target[key] = rng.choice(values)
            else:
                target.append(rng.choice(values))
            obj["name"] = name = f"mutant{i}"
            text = json.dumps(obj)
            if i % 10 == 0:  # not JSON any more: cut short, or a bracket where a value was
                cut = rng.randrange(10, len(text))
                text = text[:cut] if i % 20 else text[:cut] + "[" + text[cut + 1 :]
            conn.execute("INSERT INTO models (data_source, name, data) VALUES (?, ?, ?)", (ds, name, text))
            try:
                expected[f"{ds}.{name}"] = decode_model(msgspec.json.decode(text), Source("x"), strict=False)[
                    0
                ]
            except (msgspec.ValidationError, msgspec.DecodeError, ValueError, TypeError) as exc:
                expected[f"{ds}.{name}"] = str(exc)
    conn.close()
    read = StoreReader(sqlite_copy).read()
    issues = {i.source.row: i.message for i in read.issues}
    refused = 0
    for mid, want in expected.items():
        doc = read.docs.get(DocKey("model", mid))
        if isinstance(want, str):
            refused += 1
            assert doc is None and want in issues[mid], (mid, want, issues.get(mid))
        else:
            assert doc is not None and doc.value == want, mid
    assert 20 < refused < 280  # both verdicts are exercised


@pytest.mark.parametrize(
    ("spelled", "kept"),
    [("int", "INT"), ("Integer", "INT"), (None, "TEXT"), ("varchar", "TEXT"), ("DOUBLE", "DOUBLE")],
)
def test_column_types_are_read_as_slayer_spells_them(yaml_copy, spelled, kept):
    orders = yaml_copy / "models/jaffle/orders.yaml"
    data = yaml.safe_load(orders.read_text())
    first = data["columns"][0]
    if spelled is None:
        first.pop("type", None)
    else:
        first["type"] = spelled
    orders.write_text(yaml.safe_dump(data, sort_keys=False))
    cat = load_catalog(yaml_copy)
    assert cat.get(f"jaffle.orders.{first['name']}").obj.type == kept
    untouched = cat.get("jaffle.orders").obj.columns[1:]
    assert [c.type for c in untouched] == [c.get("type", "TEXT").upper() for c in data["columns"][1:]]
