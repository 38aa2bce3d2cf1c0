"""Reachability: a session's scope (datasources, SLayer access tags) decides what it may reach, and
everything outside is unreachable on every path: it behaves exactly like something missing and no
text of it comes back. Catalog rules, incremental derivation, the engine (search channels, cypher
filter, dense vectors, status, inspect) and the CLI, on a small adversarial store."""

from __future__ import annotations

import dataclasses
import json
import random
import re
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
import yaml

from slayer_lsp.catalog import Catalog, load_catalog
from slayer_lsp.reach.reachable import Reach, restrict
from slayer_lsp.reach.scope import Scope
from slayer_lsp.store import documents as d
from slayer_lsp.store.reader import PRIORITY_KEY, StoreReader

from .conftest import YAML_STORE

REPO = Path(__file__).resolve().parents[1]

# ----------------------------------------------------------------------------------------- the store

_MODELS = {
    ("shop", "orders"): {
        "description": "One row per order",
        "columns": [
            {"name": "order_id", "type": "INT", "primary_key": True},
            {"name": "customer_id", "type": "INT"},
            {"name": "amount", "type": "DOUBLE", "description": "Order amount"},
            {"name": "status", "type": "TEXT"},
            {
                "name": "internal_note",
                "type": "TEXT",
                "hidden": True,
                "description": "Clandestine remark for the back office",
            },
        ],
        "measures": [{"name": "revenue", "formula": "amount:sum"}],
        "joins": [
            {
                "target_model": "customers",
                "join_pairs": [["customer_id", "customer_id"]],
                "cardinality": "many_to_one",
            },
            {
                "target_model": "payroll",
                "join_pairs": [["customer_id", "employee_id"]],
                "cardinality": "many_to_one",
            },
        ],
    },
    ("shop", "customers"): {
        "description": "Customers of the shop",
        "columns": [
            {"name": "customer_id", "type": "INT", "primary_key": True},
            {"name": "name", "type": "TEXT"},
            {"name": "region", "type": "TEXT"},
        ],
    },
    ("shop", "payroll"): {
        "description": "Zanzibar compensation register",
        "access_tags": ["hr"],
        "columns": [
            {"name": "employee_id", "type": "INT", "primary_key": True},
            {"name": "salary_band", "type": "TEXT", "description": "Quetzal salary grade"},
            {"name": "bonus", "type": "DOUBLE"},
        ],
    },
    ("shop", "staff"): {
        "description": "Tangerine staff rota",
        "access_tags": ["hr", "ops"],
        "columns": [
            {"name": "staff_id", "type": "INT", "primary_key": True},
            {"name": "shift", "type": "TEXT"},
        ],
    },
    ("shop", "audit"): {  # untagged, but its measure reads payroll through a join
        "description": "Quixotic audit trail",
        "columns": [
            {"name": "audit_id", "type": "INT", "primary_key": True},
            {"name": "customer_id", "type": "INT"},
        ],
        "measures": [{"name": "graded", "formula": "payroll.salary_band:count"}],
        "joins": [{"target_model": "payroll", "join_pairs": [["customer_id", "employee_id"]]}],
    },
    ("shop", "ghost"): {
        "description": "Phantasmagoria hidden model",
        "hidden": True,
        "columns": [{"name": "ghost_id", "type": "INT", "primary_key": True}],
    },
    ("vault", "ledger"): {
        "description": "Obsidian vault ledger",
        "columns": [
            {"name": "entry_id", "type": "INT", "primary_key": True},
            {"name": "vault_amount", "type": "DOUBLE", "description": "Xylophone sum"},
        ],
    },
}

_MEMORIES = {
    "1": (["shop.orders.amount"], "Amounts include tax.", None),
    "2": (["shop.payroll.salary_band"], "Zanzibar grades are reviewed yearly.", None),
    "3": (["vault.ledger"], "Obsidian ledgers close monthly.", None),
    "4": (["shop.orders", "vault.ledger.vault_amount"], "Xylophone reconciliation of orders.", None),
    "5": (["shop.audit"], "Quixotic audits run nightly.", None),
    "6": ([], "Untethered musing about penguins.", None),
    "7": (["memory:2"], "Follow-up to the Zanzibar note: Marzipan.", None),
    "8": (["shop.customers", "memory:2"], "Customers by region; see the linked note.", None),
    "9": (
        ["shop.orders"],
        "Nectarine grade breakdown.",
        {"source_model": "orders", "dimensions": [{"name": "salary_band", "model": "payroll"}]},
    ),
    "10": (["shop.staff"], "Shifts rotate weekly.", None),
}

TAGS = Scope(access_tags=("ops",))
DS = Scope(datasources=("shop",))
BOTH = Scope(datasources=("shop",), access_tags=("ops",))
NO_TAGS = Scope(access_tags=())

# What each scope reaches (models and memories), and words of what it does not, which must never
# come back in any answer.
EXPECTED = {
    TAGS: (
        {"shop.orders", "shop.customers", "shop.staff", "shop.ghost", "vault.ledger"},
        {"1", "3", "4", "8", "10"},
    ),
    DS: (
        {"shop.orders", "shop.customers", "shop.payroll", "shop.staff", "shop.audit", "shop.ghost"},
        {"1", "2", "5", "7", "8", "9", "10"},
    ),
    BOTH: ({"shop.orders", "shop.customers", "shop.staff", "shop.ghost"}, {"1", "8", "10"}),
    NO_TAGS: ({"shop.orders", "shop.customers", "shop.ghost", "vault.ledger"}, {"1", "3", "4", "8"}),
}
SECRETS = {
    TAGS: [
        "payroll",
        "salary_band",
        "Zanzibar",
        "Quetzal",
        "employee_id",
        "bonus",
        "audit",
        "Quixotic",
        "penguins",
        "Marzipan",
        "Nectarine",
    ],
    DS: ["vault", "ledger", "Obsidian", "Xylophone", "entry_id", "penguins"],
    BOTH: [
        "payroll",
        "salary_band",
        "Zanzibar",
        "Quetzal",
        "audit",
        "Quixotic",
        "vault",
        "ledger",
        "Obsidian",
        "Xylophone",
        "penguins",
        "Marzipan",
        "Nectarine",
    ],
    NO_TAGS: ["payroll", "Zanzibar", "staff", "Tangerine", "shift", "audit", "penguins"],
}


def write_store(root: Path) -> Path:
    """The adversarial store as SLayer lays a YAML store out (datasources/, models/<ds>/, memories/)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "datasources").mkdir()
    for ds, desc in (("shop", "The shop's sales database"), ("vault", "Obsidian vault of records")):
        (root / "datasources" / f"{ds}.yaml").write_text(
            yaml.safe_dump({"version": 2, "name": ds, "type": "sqlite", "description": desc})
        )
    (root / "priority.yaml").write_text(yaml.safe_dump({"priority": ["shop", "vault"]}))
    for (ds, name), spec in _MODELS.items():
        doc = {
            "version": 15,
            "name": name,
            "sql_table": name,
            "data_source": ds,
            "hidden": False,
            "access_tags": [],
            "measures": [],
            "joins": [],
            **spec,
        }
        (root / "models" / ds).mkdir(parents=True, exist_ok=True)
        (root / "models" / ds / f"{name}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    (root / "memories").mkdir()
    for i, (mid, (tags, learning, query)) in enumerate(_MEMORIES.items()):
        front = {"created_at": f"2026-01-{i + 1:02d}T00:00:00Z", "entities": tags, "version": 4}
        if query is not None:
            front["query"] = query
        (root / "memories" / f"{mid}.md").write_text("---\n" + yaml.safe_dump(front) + "---\n" + learning)
    return root


def leaks(payload: object, scope: Scope) -> list[str]:
    """Secret words of ``scope`` found in a serialized answer (whole words, any case)."""
    text = payload if isinstance(payload, str) else json.dumps(msgspec.to_builtins(payload))
    return [w for w in SECRETS[scope] if re.search(rf"(?<![A-Za-z]){re.escape(w)}(?![A-Za-z])", text, re.I)]


@pytest.fixture()
def store(tmp_path):
    return write_store(tmp_path / "store")


@pytest.fixture()
def full(store):
    return load_catalog(store)


# ----------------------------------------------------------------------------------------- scope


def test_scope_values():
    assert Scope().unrestricted and str(Scope()) == "everything"
    assert Scope(access_tags=()) != Scope() and not Scope(access_tags=()).unrestricted  # no tags != no limit
    assert Scope.of([], []) == Scope() and Scope.of([], [], untagged_only=True) == Scope(access_tags=())
    assert Scope.of(["b", "a", "a"], ["x"]) == Scope(("a", "b"), ("x",))
    with pytest.raises(ValueError):
        Scope(datasources=("",))
    assert Scope(access_tags=("hr",)).admits_tags([]) and Scope(access_tags=()).admits_tags([])
    assert not Scope(access_tags=()).admits_tags(["hr"]) and Scope(access_tags=("hr", "x")).admits_tags(
        ["hr"]
    )


def test_unrestricted_is_the_catalog_itself(full):
    assert restrict(full, Scope()) is full


@pytest.mark.parametrize("scope", list(EXPECTED), ids=str)
def test_what_each_scope_reaches(full, scope):
    cat = restrict(full, scope)
    models, memories = EXPECTED[scope]
    assert set(cat.models) == models
    assert list(cat.memory_order) == [m for m in full.memory_order if m in memories]
    for cid, ent in cat.entities.items():  # entities are exactly the reachable documents' entities
        if ent.kind in ("column", "measure", "aggregation", "model"):
            assert ".".join(cid.split(".")[:2]) in models
        elif ent.kind == "datasource":
            assert scope.admits_datasource(cid)
    assert set(cat.datasources) == {ds for ds in ("shop", "vault") if scope.admits_datasource(ds)}
    assert cat.priority == tuple(ds for ds in ("shop", "vault") if scope.admits_datasource(ds))
    for ds, kids in cat.children_of.items():
        if "." not in ds:
            assert set(kids) == {m for m in models if m.startswith(ds + ".")}
    for name, dss in cat.models_by_name.items():
        assert {f"{ds}.{name}" for ds in dss} <= models


@pytest.mark.parametrize("scope", list(EXPECTED), ids=str)
def test_no_reachable_text_names_what_is_not(full, scope):
    """Rendered search text, hover cards and memory tags of everything reachable: no secret."""
    from slayer_lsp.analysis.hover import entity_markdown
    from slayer_lsp.texts.render import render_entity

    cat = restrict(full, scope)
    for cid in cat.entities:
        doc = render_entity(cat, cid)
        assert not leaks(doc.text if doc else "", scope), cid
        assert not leaks(entity_markdown(cat, cid) or "", scope), cid
    for mid in cat.memory_order:
        assert all(t in cat.entities or not t.startswith("memory:") for t in cat.memory(mid).entities)


def test_pruned_joins_and_stripped_links(full):
    cat = restrict(full, TAGS)
    assert [j.target_model for j in cat.model("shop", "orders").joins] == ["customers"]
    assert [j.target_model for j in full.model("shop", "orders").joins] == ["customers", "payroll"]
    assert cat.get("shop.orders.amount").model.joins == cat.model("shop", "orders").joins
    assert cat.memory("8").entities == ["shop.customers"] and full.memory("8").entities[-1] == "memory:2"
    assert cat.get("shop.ghost").hidden and cat.get("shop.orders.internal_note").hidden  # hidden is not scope


def test_load_issues_follow_the_scope(store):
    (store / "models" / "vault" / "broken.yaml").write_text("name: [unclosed\n")
    (store / "models" / "shop" / "broken.yaml").write_text("name: [unclosed\n")
    full = load_catalog(store)
    assert len(full.load_issues) == 2
    assert [str(i.source.path).split("/")[-2] for i in restrict(full, DS).load_issues] == ["shop"]
    assert restrict(full, TAGS).load_issues == ()  # a document that did not load shows no tags


@pytest.mark.parametrize(
    "marked",
    [
        "source_model: customers\ndimensions: [em§ail]\n",  # a hidden column
        "dimensions: [jaffle.customers.em§ail]\n",
        "source_model: supp§lies\n",  # a hidden model (jaffle comes first in the priority)
        "---\nentities:\n- jaffle.customers.em§ail\n---\nx\n",  # a memory's tag
    ],
)
def test_hidden_names_get_no_hover_definition_or_completion(marked):
    from slayer_lsp.analysis import completion, hover, navigation
    from slayer_lsp.analysis import parsed_file as dm

    cat = load_catalog(YAML_STORE)
    kind = "memory" if marked.startswith("---") else "query"
    before = marked[: marked.index("§")]
    line, col = before.count("\n"), len(before.split("\n")[-1])
    doc = dm.parse_document(
        marked.replace("§", ""), kind, "/w/memories/x.md" if kind == "memory" else "q.query.yaml"
    )
    assert navigation.target_at(doc, line, col, cat) is not None  # it resolves: it exists, hidden
    assert hover.hover(doc, line, col, cat) is None
    assert navigation.definition(doc, line, col, cat) == []
    res = completion.complete(doc, line, col, cat)
    offered = [cat.get(i.canonical) for i in (res.items if res else ()) if i.canonical]
    assert offered and not [e.canonical for e in offered if e is not None and e.hidden]


def test_a_model_file_still_hovers_its_own_hidden_column():
    from slayer_lsp.analysis import hover
    from slayer_lsp.analysis import parsed_file as dm

    path = YAML_STORE / "models" / "jaffle" / "customers.yaml"
    text = path.read_text()
    doc = dm.parse_document(text, "model", str(path))
    line = next(i for i, ln in enumerate(text.split("\n")) if ln.strip() == "- name: email")
    col = text.split("\n")[line].index("email") + 1
    card = hover.hover(doc, line, col, load_catalog(YAML_STORE))
    assert card is not None and "hidden" in card.markdown


# ----------------------------------------------------------------------------------------- incremental


def _edit(full: Catalog, read, rng: random.Random, original: dict):
    """One random edit of the store's documents (a model's tags, joins or a formula; a memory's tags
    or query; a memory or model removed or brought back; the priority), as the reader returns it."""
    docs = dict(read.docs)
    models = [k for k in docs if k.kind == "model"]
    memories = [k for k in docs if k.kind == "memory"]
    ids = sorted(c for c in full.entities if not c.startswith("memory:")) + [
        f"memory:{m}" for m in full.memory_order
    ]
    choice = rng.randrange(9)
    if choice == 7:
        gone = [k for k in original if k not in docs]
        if gone:
            k = rng.choice(gone)
            docs[k] = original[k]
            return dataclasses.replace(read, docs=docs)
    if choice == 8 and memories:
        k = rng.choice(memories)
        names = sorted({c.split(".")[1] for c in ids if c.count(".") == 1})
        src = rng.choice(names)
        leaves = [c.rsplit(".", 1)[1] for c in ids if c.count(".") == 2] or ["x"]
        hop = rng.choice(names + ["nowhere"])
        query = {"source_model": src, "dimensions": [rng.choice(leaves), f"{hop}.{rng.choice(leaves)}"]}
        value = msgspec.structs.replace(docs[k].value, query=rng.choice([query, None]))
        docs[k] = dataclasses.replace(docs[k], value=value, digest=docs[k].digest + f"+{rng.random()}")
        return dataclasses.replace(read, docs=docs)
    if choice == 0 and models:
        k = rng.choice(models)
        value = msgspec.structs.replace(docs[k].value, access_tags=rng.choice([[], ["hr"], ["ops"], ["x"]]))
    elif choice == 1 and models:
        k = rng.choice(models)
        m = docs[k].value
        peers = [
            o.value.name
            for o in docs.values()
            if o.key.kind == "model" and o.value.data_source == m.data_source
        ]
        if m.joins and rng.random() < 0.5:
            joins = m.joins[:-1]
        else:
            joins = [
                *m.joins,
                d.Join(target_model=rng.choice(peers + ["nowhere"]), name=rng.choice([None, "via"])),
            ]
        value = msgspec.structs.replace(m, joins=joins)
    elif choice == 2 and models:
        k = rng.choice(models)
        m = docs[k].value
        hop = (rng.choice(m.joins).name or rng.choice(m.joins).target_model) if m.joins else "nowhere"
        value = msgspec.structs.replace(
            m, measures=[*m.measures[:1], d.Measure(name="m", formula=f"{hop}.x:sum")]
        )
    elif choice == 3 and memories:
        k = rng.choice(memories)
        value = msgspec.structs.replace(docs[k].value, entities=rng.sample(ids, rng.randrange(0, 3)))
    elif choice == 4 and len(memories) > 2:
        del docs[rng.choice(memories)]
        return dataclasses.replace(read, docs=docs)
    elif choice == 5 and len(models) > 2:
        del docs[rng.choice(models)]
        return dataclasses.replace(read, docs=docs)
    elif PRIORITY_KEY in docs:
        k = PRIORITY_KEY
        value = list(reversed(docs[k].value))
    else:
        return read
    docs[k] = dataclasses.replace(docs[k], value=value, digest=docs[k].digest + f"+{rng.random()}")
    return dataclasses.replace(read, docs=docs)


def _same(a: Catalog, b: Catalog) -> None:
    assert dict(a.entities).keys() == dict(b.entities).keys()
    for c, ent in a.entities.items():
        assert ent.obj == b.entities[c].obj and ent.hidden == b.entities[c].hidden, c
        if ent.model is not None:
            assert ent.model == b.entities[c].model, c
    assert {k: v.value for k, v in a.docs.items()} == {k: v.value for k, v in b.docs.items()}
    assert dict(a.children_of) == dict(b.children_of)
    assert dict(a.models_by_name) == dict(b.models_by_name)
    assert a.memory_order == b.memory_order and a.priority == b.priority


@pytest.mark.parametrize("scope", [TAGS, DS, BOTH, NO_TAGS], ids=str)
@pytest.mark.parametrize("seed", range(6))
def test_incremental_equals_fresh(store, scope, seed):
    """A sequence of random edits, each derived incrementally: the reachable catalog equals the one
    built from scratch, and the delta turns the previous entity set into the next one."""
    rng = random.Random(seed)
    reader = StoreReader(store)
    read = reader.read()
    original = dict(read.docs)
    full = Catalog.from_read(read)
    reach = Reach(scope)
    prev, _ = reach.restrict(full)
    _same(prev, restrict(full, scope))
    for _ in range(40):
        read = _edit(full, read, rng, original)
        nxt_full, fdelta = full.derive(read)
        cat, delta = reach.restrict(nxt_full, fdelta)
        _same(cat, restrict(nxt_full, scope))
        keys = (set(prev.entities) - delta.removed) | delta.added
        assert keys == set(cat.entities)
        assert not delta.added & set(prev.entities) and delta.removed <= set(prev.entities)
        for c in set(cat.entities) & set(prev.entities) - delta.changed:
            assert prev.entities[c].obj == cat.entities[c].obj, c
        full, prev = nxt_full, cat


def test_incremental_equals_fresh_on_jaffle():
    rng = random.Random(7)
    read = StoreReader(YAML_STORE).read()
    full = Catalog.from_read(read)
    for scope in (Scope(datasources=("jaffle",)), Scope(access_tags=("x",))):
        reach = Reach(scope)
        reach.restrict(full)
        cur, cur_read = full, read
        for _ in range(25):
            cur_read = _edit(cur, cur_read, rng, read.docs)
            nxt, fdelta = cur.derive(cur_read)
            _same(reach.restrict(nxt, fdelta)[0], restrict(nxt, scope))
            cur = nxt


def test_a_delta_that_does_not_follow_is_not_trusted(full, store):
    reach = Reach(TAGS)
    reach.restrict(full)
    other = load_catalog(store)  # not derived from ``full``: everything is revisited
    cat, delta = reach.restrict(other, None)
    _same(cat, restrict(other, TAGS))
    assert delta.empty or not delta.added - set(cat.entities)


# ----------------------------------------------------------------------------------------- engine


def _engine(store, scope, **kw):
    from slayer_lsp.engine import Engine

    engine = Engine(store, scope=scope, use_cache=False, **kw)
    engine.refresh()
    return engine


def _missing_like(engine, params: dict, *swaps: tuple[str, str]) -> None:
    """A search naming something out of scope answers exactly as one naming something that does
    not exist, once the names are swapped (``swaps``: (out of scope, missing) spellings)."""

    def swapped(text: str) -> str:
        for secret, missing in swaps:
            text = text.replace(secret, missing)
        return text

    a = json.dumps(msgspec.to_builtins(engine.search(params)))
    b = json.dumps(msgspec.to_builtins(engine.search(json.loads(swapped(json.dumps(params))))))
    assert swapped(a) == b


@pytest.mark.parametrize("scope", list(EXPECTED), ids=str)
@pytest.mark.parametrize("ranking", ["hybrid", "slayer"])
def test_search_text_naming_what_is_out_of_scope(store, scope, ranking):
    engine = _engine(store, scope)
    for word in SECRETS[scope]:
        for question in (
            word,
            f"{word} note ledger grade",
            "shop.payroll.salary_band vault.ledger.vault_amount",
        ):
            resp = engine.search({"question": question, "max_results": 50, "ranking": ranking})
            hits = [h.id for h in resp.results]
            assert not leaks([h for h in msgspec.to_builtins(resp.results)], scope), (question, hits)
    everything = engine.search(
        {
            "question": "order customers shop note grade",
            "max_results": 200,
            "ranking": ranking,
            "compact": False,
        }
    )
    models, memories = EXPECTED[scope]
    for hit in everything.results:
        if hit.kind == "memory":
            assert hit.id in memories
        else:
            assert hit.id in engine.catalog.entities
    assert not leaks(everything, scope)
    engine.close()


@pytest.mark.parametrize("ranking", ["hybrid", "slayer"])
def test_naming_out_of_scope_entities_is_like_naming_missing_ones(store, ranking):
    engine = _engine(store, TAGS)
    for secret, missing in (
        ("shop.payroll.salary_band", "shop.nosuch.salary_band"),
        ("payroll", "nosuch"),
        ("memory:2", "memory:999"),
        ("memory:7", "memory:998"),
        ("shop.audit", "shop.nosuch"),
    ):
        words = (
            (secret.split(".")[1], missing.split(".")[1])
            if "." in secret
            else (f"'{secret.split(':')[-1]}'", f"'{missing.split(':')[-1]}'")
        )
        _missing_like(engine, {"entities": [secret], "ranking": ranking}, (secret, missing), words)
        _missing_like(
            engine,
            {"entities": [secret, "shop.orders"], "question": "amount", "ranking": ranking},
            (secret, missing),
            words,
        )
    resp = engine.search({"entities": ["memory:2"], "ranking": ranking})
    assert not resp.results and not leaks(resp, TAGS)
    q = {"source_model": "orders", "dimensions": ["payroll.salary_band"]}
    resp = engine.search({"query": q, "ranking": ranking})
    assert resp.resolved_input_entities == [] and not resp.results
    engine.close()


def test_cypher_filter_cannot_reach_out_of_scope(store):
    engine = _engine(store, TAGS)
    everything = engine.search(
        {
            "question": "amount grade ledger",
            "max_results": 200,
            "cypher_filter": "MATCH (n) RETURN n.id AS id",
        }
    )
    assert not leaks(everything, TAGS)
    for cypher in (
        "MATCH (m:Model) WHERE m.id = 'shop.payroll' RETURN m.id AS id",
        "MATCH (m:Memory) RETURN m.id AS id",
        "MATCH (c:Column) RETURN 'shop.payroll.salary_band' AS id",
        "MATCH (c:Column) RETURN 'memory:2' AS id",
    ):
        try:
            resp = engine.search(
                {"question": "Zanzibar salary grade", "max_results": 50, "cypher_filter": cypher}
            )
        except Exception as exc:  # noqa: BLE001 - a refused filter is fine; its message must not leak either
            assert not leaks(str(exc), TAGS)
            continue
        assert not leaks(resp, TAGS), cypher
    engine.close()


def test_related_hops_stop_at_the_scope(store):
    """Memory 8 links memory 2 (about payroll): unscoped, a hop reaches it; scoped, the link is not
    in the reachable catalog at all, so no hop can travel it."""
    params = {"entities": ["shop.customers"], "question": "note", "related": 3, "max_results": 50}
    unscoped = _engine(store, Scope())
    assert {"8", "2"} <= {h.id for h in unscoped.search(params).results if h.kind == "memory"}
    unscoped.close()
    engine = _engine(store, TAGS)
    resp = engine.search(params)
    assert "8" in [h.id for h in resp.results if h.kind == "memory"]
    assert not leaks(resp, TAGS)
    engine.close()


def test_a_sqlite_store_reaches_what_its_yaml_twin_reaches(tmp_path):
    """The jaffle fixture in both backends: the same reachable catalog, and a scoped search of the
    SQLite store returns nothing of the other datasource."""
    import shutil

    from .conftest import SQLITE_STORE

    db = tmp_path / "store.db"
    shutil.copyfile(SQLITE_STORE, db)
    db.chmod(0o644)
    scope = Scope(datasources=("supplies",))
    yaml_cat, sqlite_cat = restrict(load_catalog(YAML_STORE), scope), restrict(load_catalog(db), scope)
    assert set(yaml_cat.entities) == set(sqlite_cat.entities) and sqlite_cat.memory_order == ("10",)
    engine = _engine(db, scope)
    resp = engine.search({"question": "orders customers revenue supplies cost", "max_results": 100})
    assert resp.results and all(
        h.id == "10" if h.kind == "memory" else h.id.startswith("supplies") for h in resp.results
    )
    engine.close()


def test_a_scope_keeps_its_own_index_cache(store):
    """With the on-disk cache on, a scoped session keeps its full-text index apart from the
    unscoped one (they would otherwise rewrite each other's on every start), and each answers as a
    session without any cache does."""
    from slayer_lsp.engine import Engine
    from slayer_lsp.store.cache import StoreCache

    def ranked(scope, **kw):
        engine = Engine(store, scope=scope, **kw)
        engine.refresh()
        out = [
            (h.id, round(h.score, 6))
            for q in ("Zanzibar", "order amount note", "customers region")
            for h in engine.search({"question": q, "max_results": 50, "ranking": "slayer"}).results
        ]
        engine.close()
        return out, engine.location

    alone = {scope: ranked(scope, use_cache=False)[0] for scope in (Scope(), TAGS)}
    members = None
    for _ in range(2):  # the second round reopens the caches the first one saved
        for scope in (Scope(), TAGS, Scope()):
            got, location = ranked(scope)
            assert got == alone[scope], scope
            manifest = StoreCache.for_location(location).load_text_manifest()
            indexed = {manifest.names[key] for key in manifest.members}
            assert members is None or indexed == members  # the unscoped index is as it was
            members = indexed
    assert "shop.payroll" in members


@pytest.mark.parametrize("scope", [TAGS, DS], ids=str)
def test_facets_and_kinds_reach_nothing_out_of_scope(store, scope):
    engine = _engine(store, scope)
    from slayer_lsp.texts.facets import FACETS

    answers = []
    for word in SECRETS[scope]:
        for kind in ("column", "model", "memory"):
            answers.append(
                engine.search({"question": word, "kinds": [kind], "max_results": 50, "compact": False})
            )
            answers.append(engine.search({"question": word, "facet": "meaning", "max_results": 50}))
            for facet in FACETS.get(kind, ()):
                answers.append(
                    engine.search_facets(
                        {"facets": {facet: word}, "kind": kind, "limit": 50, "compact": False}
                    )
                )
    assert not leaks(answers, scope)
    engine.close()


def test_status_inspect_and_refresh(store):
    from slayer_lsp.analysis.inspect import inspect_refs
    from slayer_lsp.status import engine_status

    engine = _engine(store, TAGS)
    counts = engine_status(engine).counts
    cat = engine.catalog
    assert counts == {k: sum(1 for e in cat.entities.values() if e.kind == k) for k in counts}
    assert counts["memory"] == 5 and counts["model"] == 5
    pairs = [
        ("shop.payroll.salary_band", "shop.nosuch.salary_band", "payroll", "nosuch"),
        ("payroll", "nosuch", "payroll", "nosuch"),
        ("memory:2", "memory:999", "2", "999"),
        ("shop.audit", "shop.nosuch", "audit", "nosuch"),
        ("sum(shop.payroll.bonus)", "sum(shop.nosuch.bonus)", "payroll", "nosuch"),
    ]
    for secret, missing, word, other in pairs:
        (a,), (b,) = inspect_refs(cat, [secret]), inspect_refs(cat, [missing])
        assert a.error and a.canonical is None and a.error.replace(word, other) == b.error, (a, b)

    # payroll loses its tag: it and what depends on it become reachable; tagged again: removed
    path = store / "models" / "shop" / "payroll.yaml"
    doc = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**doc, "access_tags": []}))
    delta = engine.refresh([str(path)])
    assert {"shop.payroll", "shop.payroll.salary_band", "shop.audit", "memory:2", "memory:9"} <= delta.added
    assert "shop.orders" in delta.changed  # its join to payroll is back
    assert engine.search({"question": "Zanzibar"}).results
    path.write_text(yaml.safe_dump(doc))
    delta = engine.refresh([str(path)])
    assert {"shop.payroll", "shop.audit", "memory:2", "memory:9"} <= delta.removed
    resp = engine.search({"question": "Zanzibar Quetzal Nectarine", "max_results": 50})
    assert not leaks(resp, TAGS)
    assert engine.full_catalog.get("shop.payroll") is not None and "shop.payroll" not in engine.catalog
    engine.close()


def test_dense_vectors_of_unreachable_entities_are_never_ranked(store):
    """The store's embeddings table holds every entity's vector (an unscoped session embedded them):
    a scoped session loads them all, ranks only its own, and leaves the others' rows in the table."""
    from slayer_lsp.embed.providers import FakeProvider
    from slayer_lsp.embed.store import VectorStore
    from slayer_lsp.engine import Engine

    provider = FakeProvider(dim=32)
    writer = Engine(store, dense="live", embedding_provider=provider, use_cache=False, parts=False)
    writer.refresh()
    assert writer.dense.wait_idle(timeout=60)
    writer.close()
    rows = VectorStore.for_store(writer.location).count(provider.name)
    assert rows == len(writer.catalog.searchable_ids())

    for mode in ("stored", "live"):
        engine = Engine(
            store, dense=mode, embedding_provider=provider, use_cache=False, parts=False, scope=TAGS
        )
        engine.refresh()
        assert engine.dense.wait_idle(timeout=60)
        index = engine.dense.index
        assert len(index) > index.reachable_count() == len([c for c in index.ids() if c in engine.catalog])
        resp = engine.search({"question": "zzqx qqvv", "max_results": 200, "compact": False})
        assert resp.results and not leaks(resp, TAGS)  # fake vectors rank everything they are allowed to
        hits = engine.dense.search("zzqx qqvv", k=1000)
        assert {c for ranked in hits.by_kind.values() for c, _ in ranked} <= set(engine.catalog.entities)
        engine.close()
    assert VectorStore.for_store(writer.location).count(provider.name) == rows

    # a live scoped session that sees an entity leave its scope keeps the entity's stored vectors
    engine = Engine(
        store, dense="live", embedding_provider=provider, use_cache=False, parts=False, scope=TAGS
    )
    engine.refresh()
    assert engine.dense.wait_idle(timeout=60)
    path = store / "models" / "shop" / "customers.yaml"
    path.write_text(yaml.safe_dump({**yaml.safe_load(path.read_text()), "access_tags": ["hr"]}))
    delta = engine.refresh([str(path)])
    assert "shop.customers.region" in delta.removed
    assert engine.dense.wait_idle(timeout=60)
    assert "shop.customers.region" not in engine.dense.index.ids()
    assert "shop.customers.region" in dict(VectorStore.for_store(engine.location).hashes(provider.name))
    engine.close()


# ----------------------------------------------------------------------------------------- CLI


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "slayer_lsp", *args],
        capture_output=True,
        text=True,
        cwd=cwd or REPO,
        timeout=120,
        env={**__import__("os").environ, "SLAYER_LSP_CACHE": "off"},
    )


def _scope_args(scope: Scope) -> list[str]:
    out = [a for ds in scope.datasources for a in ("--scope-datasource", ds)]
    if scope.access_tags == ():
        out.append("--untagged-only")
    out += [a for tag in scope.access_tags or () for a in ("--access-tag", tag)]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("scope", [TAGS, DS, NO_TAGS], ids=str)
def test_cli_search_inspect_status(store, scope):
    flags = _scope_args(scope)
    for word in SECRETS[scope][:4]:
        out = run(
            "search",
            "--storage",
            str(store),
            "--no-dense",
            "--format",
            "json",
            "--verbose",
            "--question",
            word,
            "--max-results",
            "50",
            *flags,
        )
        assert out.returncode == 0, out.stderr
        assert not leaks(json.loads(out.stdout)["results"], scope)
    secret_ref = "vault.ledger" if scope is DS else "shop.payroll"
    out = run("inspect", "--storage", str(store), "--format", "json", secret_ref, *flags)
    miss = run("inspect", "--storage", str(store), "--format", "json", "shop.nosuchmodel", *flags)
    assert out.returncode == miss.returncode == 1
    assert json.loads(out.stdout)[0].keys() == json.loads(miss.stdout)[0].keys() == {"ref", "error"}
    out = run("status", "--storage", str(store), "--format", "json", *flags)
    counts = json.loads(out.stdout)["counts"]
    models, memories = EXPECTED[scope]
    assert counts["model"] == len(models) and counts["memory"] == len(memories)
    text = run("status", "--storage", str(store), *flags).stdout
    assert f"scope: {scope}" in text


def test_cli_check_reports_out_of_scope_names_as_unknown(store, tmp_path):
    """``--check`` under a scope: a query naming what the scope does not reach gets the finding a
    missing name gets; the store checks cover the reachable catalog only."""
    q = tmp_path / "q.query.yaml"
    q.write_text("source_model: orders\ndimensions: [payroll.salary_band, nosuch.salary_band]\n")
    q2 = tmp_path / "p.query.yaml"
    q2.write_text("source_model: payroll\ndimensions: [salary_band]\n")
    q3 = tmp_path / "m.query.yaml"
    q3.write_text("source_model: nosuchmodel\ndimensions: [salary_band]\n")
    out = run(
        "--check", str(q), str(q2), str(q3), "--storage", str(store), "--format", "json", *_scope_args(TAGS)
    )
    assert out.returncode == 1, out.stderr
    found = json.loads(out.stdout)
    by_file = {}
    for f in found:
        by_file.setdefault(Path(f["path"]).name, []).append((f["range"]["start"]["line"], f["code"]))
    assert sorted(c for _, c in by_file["q.query.yaml"]) == ["unknown-entity", "unknown-entity"]
    assert [c for _, c in by_file["p.query.yaml"]] == [c for _, c in by_file["m.query.yaml"]]
    for f in found:  # the store-level findings name nothing out of scope either
        if not f["path"].endswith(".query.yaml"):
            assert not leaks(f["message"], TAGS), f
    unscoped = run("--check", str(q2), "--storage", str(store), "--format", "json")
    assert unscoped.returncode == 0, unscoped.stdout  # without a scope, payroll resolves


def test_cli_rejects_an_empty_scope_value(store):
    out = run("search", "--storage", str(store), "--question", "x", "--access-tag", " ")
    assert out.returncode == 2 and "access tag" in out.stderr
