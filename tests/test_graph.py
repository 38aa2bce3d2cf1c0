"""The cypher_filter graph: SLayer's fixture filters, hidden entities, validation, timeouts and
incremental updates checked against a fresh build."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slayer_lsp.catalog import Catalog
from slayer_lsp.catalog.ids import memory_ref
from slayer_lsp.search import cypher_filter
from slayer_lsp.search import graph as G
from slayer_lsp.search.cypher_filter import parse_label_filter, validate_cypher
from slayer_lsp.search.cypher_lexer import CypherFilterError
from slayer_lsp.search.graph import GraphIndex
from slayer_lsp.store.reader import StoreReader
from tests.conftest import EXPECTED, FIXTURES

REPO = Path(__file__).resolve().parents[1]

# The keywords the filter must refuse outside literals (the task's list, kept apart from the module's).
FORBIDDEN = (
    "CREATE",
    "MERGE",
    "DELETE",
    "DETACH",
    "SET",
    "REMOVE",
    "DROP",
    "CALL",
    "LOAD",
    "COPY",
    "ATTACH",
    "INSTALL",
    "EXPORT",
    "IMPORT",
    "USE",
    "ALTER",
    "CHECKPOINT",
    "BEGIN",
    "COMMIT",
    "ROLLBACK",
)

# Dumps of the whole graph, as id strings, so two graphs can be compared with run().
DUMPS = (
    "MATCH (n) RETURN label(n) + '|' + n.id + '|' + coalesce(n.name, '') + '|' + coalesce(n.description, '')"
    " + '|' + coalesce(n.learning, '') + '|' + coalesce(n.data_type, '') AS id",
    "MATCH (a)-[r]->(b) RETURN label(r) + '|' + a.id + '|' + b.id + '|' + coalesce(r.cardinality, '') AS id",
    "MATCH ()-[r]->() WITH label(r) AS rel, count(*) AS n RETURN rel + '=' + CAST(n AS STRING) AS id",
    "MATCH (n) WITH label(n) AS t, count(*) AS n RETURN t + '=' + CAST(n AS STRING) AS id",
)


@pytest.fixture(scope="module")
def graph(yaml_catalog):
    g = GraphIndex.build(yaml_catalog)
    yield g
    g.close()


def _visible(cat: Catalog, kinds: set[str] | None = None) -> set[str]:
    return {c for c, e in cat.entities.items() if not e.hidden and (kinds is None or e.kind in kinds)}


def _memories_mentioning(cat: Catalog, target_ok) -> set[str]:  # type: ignore[no-untyped-def]
    return {memory_ref(mid) for mid, mem in cat.memories.items() if any(target_ok(t) for t in mem.entities)}


# What each fixture filter selects, derived from the catalog independently of the graph.
def _expected_18(cat: Catalog) -> set[str]:  # MATCH (v:Memory) RETURN v.id AS id
    return {memory_ref(mid) for mid in cat.memories}


def _expected_20(cat: Catalog) -> set[str]:  # memories mentioning a visible column of jaffle.orders
    visible_cols = _visible(cat, {"column"})
    return _memories_mentioning(cat, lambda t: t in visible_cols and t.startswith("jaffle.orders."))


FIXTURE_FILTERS = {"18_cypher_label.json": _expected_18, "20_cypher_mentions.json": _expected_20}


@pytest.mark.parametrize("name", sorted(FIXTURE_FILTERS))
def test_fixture_filters_select_what_slayer_selected(graph, yaml_catalog, name):
    case = json.loads((EXPECTED / name).read_text())
    got = graph.run(case["call"]["cypher_filter"])
    expected = FIXTURE_FILTERS[name](yaml_catalog)
    assert got == expected
    # Every hit SLayer returned under this filter passed the allowlist.
    returned = {
        memory_ref(h["id"]) if h["kind"] == "memory" else h["id"] for h in case["response"]["results"]
    }
    assert returned and returned <= got


def test_naive_fallback_fixture_uses_label_kinds():
    case = json.loads((EXPECTED / "19_cypher_label_naive_fallback.json").read_text())
    kinds = parse_label_filter(case["call"]["cypher_filter"])
    assert kinds is not None
    assert {h["kind"] for h in case["response"]["results"]} <= kinds


def test_graph_holds_visible_entities_only(graph, yaml_catalog):
    everything = graph.run("MATCH (n) RETURN n.id AS id")
    assert everything == _visible(yaml_catalog)
    hidden = {c for c, e in yaml_catalog.entities.items() if e.hidden}
    assert hidden and not hidden & everything
    mentioned = graph.run("MATCH (:Memory)-[:MENTIONS]->(n) RETURN n.id AS id")
    assert not hidden & mentioned


def test_edges_follow_the_catalog(graph, yaml_catalog):
    cat = yaml_catalog
    visible = _visible(cat)
    mentions = {
        f"{memory_ref(mid)}>{t}" for mid, mem in cat.memories.items() for t in mem.entities if t in visible
    }
    contains = {
        f"{cat.parent(c)}>{c}" for c in visible if not c.startswith("memory:") and cat.parent(c) in visible
    }
    joins = {
        f"{mid}>{mid.split('.')[0]}.{j.target_model}"
        for mid, m in cat.models.items()
        if mid in visible
        for j in m.joins
        if f"{mid.split('.')[0]}.{j.target_model}" in visible
    }
    for rel, expected in (("MENTIONS", mentions), ("CONTAINS", contains), ("JOINS", joins)):
        assert expected
        assert graph.run(f"MATCH (a)-[:{rel}]->(b) RETURN a.id + '>' + b.id AS id") == expected


def test_labels_are_case_insensitive_and_column_is_an_alias(graph, yaml_catalog):
    got = graph.run("MATCH (v:column:MEMORY) RETURN v.id AS id")
    assert got == _visible(yaml_catalog, {"column", "memory"})
    assert graph.run("MATCH (v:ModelColumn) RETURN v.id AS id") == _visible(yaml_catalog, {"column"})


@pytest.mark.parametrize(
    "text, kinds",
    [
        ("MATCH (v:Memory) RETURN v.id AS id", {"memory"}),
        ("match ( v : column : Measure ) return v.id as id", {"column", "measure"}),
        (
            "MATCH (n:ModelColumn:Datasource:Model:Aggregation) RETURN n.id AS id",
            {"column", "datasource", "model", "aggregation"},
        ),
        ("MATCH (v:Memory) WHERE v.id = 'memory:1' RETURN v.id AS id", None),
        ("MATCH (m:Memory)-[:MENTIONS]->(n) RETURN m.id AS id", None),
        ("MATCH (v:Memory) RETURN w.id AS id", None),
        ("MATCH (v) RETURN v.id AS id", None),
    ],
)
def test_parse_label_filter(text, kinds):
    assert parse_label_filter(text) == (frozenset(kinds) if kinds is not None else None)


def test_parse_label_filter_refuses_unknown_labels_and_missing_alias():
    with pytest.raises(CypherFilterError, match="unknown node label 'Table'"):
        parse_label_filter("MATCH (v:Table) RETURN v.id AS id")
    with pytest.raises(CypherFilterError, match="aliased id"):
        parse_label_filter("MATCH (v:Memory) RETURN v.id")


@pytest.mark.parametrize("keyword", FORBIDDEN)
def test_forbidden_keywords_are_refused_outside_literals(graph, yaml_catalog, keyword):
    for spelling in (keyword, keyword.lower(), keyword.title()):
        with pytest.raises(CypherFilterError, match=f"keyword {keyword} is not allowed"):
            validate_cypher(f"MATCH (n:Model) {spelling} n.name RETURN n.id AS id")
    # The same word in a string, a comment or a quoted name is just text.
    quoted = (
        f"MATCH (n:Model) WHERE n.name <> '{keyword.lower()}' AND n.id <> \"{keyword}\" "
        f"/* {keyword} */ RETURN n.id AS id // {keyword}"
    )
    assert graph.run(quoted) == _visible(yaml_catalog, {"model"})
    validate_cypher(f"MATCH (n:Model) RETURN n.`{keyword.lower()}` AS id")


def test_single_statement_only(graph):
    with pytest.raises(CypherFilterError, match="single statement"):
        validate_cypher("MATCH (n:Model) RETURN n.id AS id; MATCH (m:Memory) RETURN m.id AS id")
    with pytest.raises(CypherFilterError, match="single statement"):
        validate_cypher("MATCH (n:Model) RETURN n.id AS id;")
    assert graph.run("MATCH (n:Model) WHERE n.name = 'a; CREATE (x)' RETURN n.id AS id") == frozenset()
    assert graph.run(r"MATCH (n:Model) WHERE n.name = 'it\'s; DROP' RETURN n.id AS id") == frozenset()


# Places where a naive scanner and the engine could disagree about what is a literal.
SMUGGLING = (
    "MATCH (n:Model) RETURN n.id AS id //\r; CREATE (:Memory {id: 'pwn'})",
    "MATCH (n:Model) RETURN n.id AS id /* **/ 'x */ CREATE (:Memory {id: 'pwn'}) //'",
    "MATCH (n:Model) WHERE n.name = '\\q' CREATE (:Memory {id: 'pwn'}) RETURN n.id AS id //'",
    "MATCH (n:Model) WHERE n.name = `x` SET n.name = 'pwn' RETURN n.id AS id",
    "MATCH (n:Model) RETURN n.id AS id\u2028; DETACH DELETE n",
)


@pytest.mark.parametrize("text", SMUGGLING)
def test_literal_boundaries_match_the_engine(text):
    with pytest.raises(CypherFilterError):
        validate_cypher(text)


_FRAGMENTS = (
    "MATCH (n:Memory) ",
    "RETURN n.id AS id",
    " WHERE n.id = ",
    "'",
    '"',
    "`",
    "\\",
    "\\'",
    "//",
    "/*",
    "*/",
    "**/",
    "\r",
    "\n",
    ";",
    " CREATE (:Memory {id: 'pwn'}) ",
    " SET n.learning = 'pwn' ",
    " DETACH DELETE n ",
    "x",
    " ",
    "-[:MENTIONS*]->(m) ",
    "'a'",
)


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.sampled_from(_FRAGMENTS), max_size=10))
def test_accepted_filters_never_write(graph, fragments):
    text = "MATCH (n:Memory) " + "".join(fragments) + " RETURN n.id AS id"
    try:
        validate_cypher(text)
    except CypherFilterError:
        return
    before = graph.counts()
    try:
        graph.run(text)
    except CypherFilterError:
        pass
    assert graph.counts() == before
    assert (
        graph.run("MATCH (n:Memory) WHERE n.id = 'pwn' OR n.learning = 'pwn' RETURN n.id AS id")
        == frozenset()
    )


@pytest.mark.parametrize(
    "text, message",
    [
        ("MATCH (n:Model) RETURN n.id", "aliased id"),
        ("MATCH (n:Model) RETURN n.id AS ident", "aliased id"),
        ("RETURN 1 AS id", "must start with MATCH"),
        ("OPTIONAL MATCH (n:Model) RETURN n.id AS id", "must start with MATCH"),
        ("UNWIND [1] AS x MATCH (n) RETURN n.id AS id", "must start with MATCH"),
        ("", "empty"),
        ("   // just a comment", "empty"),
        ("MATCH (n:Model) WHERE n.name = 'open RETURN n.id AS id", "unterminated string"),
        ("MATCH (n:Model) /* RETURN n.id AS id", "unterminated /\\* comment"),
        ("MATCH (n:Table) RETURN n.id AS id", "unknown node label 'Table'"),
        ("MATCH (a:Model)-[:LINKS]->(b) RETURN a.id AS id", "unknown relationship type 'LINKS'"),
        (
            "MATCH (n:Model) RETURN n.id AS id " + "/*" + "x" * cypher_filter.MAX_CYPHER_CHARS + "*/",
            "characters long",
        ),
    ],
)
def test_malformed_filters_are_refused(text, message):
    with pytest.raises(CypherFilterError, match=message):
        validate_cypher(text)


def test_id_column_is_checked_when_run(graph):
    with pytest.raises(CypherFilterError, match="column named id"):
        graph.run("MATCH (n:Model) WITH n, n.id AS id RETURN n.name AS name")
    with pytest.raises(CypherFilterError, match="not nodes"):
        graph.run("MATCH (n:Model) RETURN n AS id")
    with pytest.raises(CypherFilterError, match="cypher_filter failed"):
        graph.run("MATCH (n:Model) RETURN n.nope AS id")


@pytest.mark.parametrize(
    "path, capped",
    [
        ("[:CONTAINS*]", "[:CONTAINS*1..10]"),
        ("[:CONTAINS*1..]", "[:CONTAINS*1..10]"),
        ("[:CONTAINS*..]", "[:CONTAINS*..10]"),
        ("[r:CONTAINS *2..]", "[r:CONTAINS *2..10]"),
        ("[:CONTAINS*1..2]", "[:CONTAINS*1..2]"),
        ("[:CONTAINS*2]", "[:CONTAINS*2]"),
    ],
)
def test_open_paths_are_capped(graph, yaml_catalog, path, capped):
    text = f"MATCH (d:Datasource {{id: 'jaffle'}})-{path}->(c:ModelColumn) RETURN c.id AS id"
    assert validate_cypher(text) == text.replace(path, capped)
    assert graph.run(text) == {c for c in _visible(yaml_catalog, {"column"}) if c.startswith("jaffle.")}


def test_paths_beyond_the_limit_are_refused():
    over = cypher_filter.MAX_PATH_HOPS + 1
    for path in (f"*1..{over}", f"*{over}", f"*{over}..", f"*..{over}"):
        with pytest.raises(CypherFilterError, match="exceeds the limit"):
            validate_cypher(f"MATCH (a:Model)-[:JOINS{path}]->(b) RETURN b.id AS id")
    # A '*' outside a relationship pattern is not a path.
    validate_cypher("MATCH (a:Model) WITH count(*) * 2 AS n, [1, 2][1:2] AS l MATCH (b) RETURN b.id AS id")


def test_slow_query_times_out_and_the_graph_stays_usable(graph, yaml_catalog):
    slow = (
        "MATCH (a:ModelColumn), (b:ModelColumn), (c:ModelColumn), (d:ModelColumn), (e:ModelColumn), "
        "(f:ModelColumn) WHERE a.name + b.name + c.name + d.name + e.name + f.name = 'x' RETURN a.id AS id"
    )
    with pytest.raises(CypherFilterError, match="timed out after 0.2 s"):
        graph.run(slow, timeout_s=0.2)
    assert graph.run("MATCH (v:Model) RETURN v.id AS id") == _visible(yaml_catalog, {"model"})


def test_importing_the_module_does_not_load_ladybug():
    code = "import sys, slayer_lsp.search.graph; print('ladybug' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# --------------------------------------------------------------------------- incremental updates


def _writable_copy(src: Path, dest: Path) -> Path:
    shutil.copytree(src, dest)
    for root, dirs, files in os.walk(dest):
        for name in dirs + files:
            p = Path(root) / name
            p.chmod(p.stat().st_mode | stat.S_IWUSR)
    Path(dest).chmod(Path(dest).stat().st_mode | stat.S_IWUSR)
    return dest


def _edit_yaml(path: Path, edit) -> None:  # type: ignore[no-untyped-def]
    data = yaml.safe_load(path.read_text())
    edit(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))


def _edit_memory(path: Path, edit) -> None:  # type: ignore[no-untyped-def]
    _, front, body = path.read_text().split("---\n", 2)
    data = yaml.safe_load(front)
    edit(data)
    path.write_text(f"---\n{yaml.safe_dump(data, sort_keys=False)}---\n{body}")


def _edit_store(store: Path) -> None:
    """Touch every kind of unit: a model edited, a hidden model shown, a model and a memory deleted,
    a memory retagged, a datasource edited."""

    def orders(m):  # type: ignore[no-untyped-def]
        m["description"] = "edited"
        m["columns"].append({"name": "loyalty_points", "type": "INT", "description": "new"})
        next(c for c in m["columns"] if c["name"] == "status")["hidden"] = True
        m["joins"] = [j for j in m["joins"] if j["target_model"] != "stores"]

    _edit_yaml(store / "models" / "jaffle" / "orders.yaml", orders)
    _edit_yaml(store / "models" / "jaffle" / "supplies.yaml", lambda m: m.update(hidden=False))
    _edit_yaml(store / "datasources" / "supplies.yaml", lambda d: d.update(description="weekly, edited"))
    (store / "models" / "jaffle" / "customers.yaml").unlink()
    (store / "memories" / "1.md").unlink()
    _edit_memory(
        store / "memories" / "4.md",
        lambda m: m.update(
            entities=["jaffle.orders.loyalty_points", "memory:kb.revenue", "jaffle.supplies.cost", "supplies"]
        ),
    )


def _dump(g: GraphIndex) -> list[frozenset[str]]:
    return [g.run(q) for q in DUMPS]


@pytest.mark.parametrize("share, outcome", [(float("inf"), "incremental"), (0.0, "rebuilt")])
def test_apply_matches_a_fresh_build(tmp_path, monkeypatch, share, outcome):
    store = _writable_copy(FIXTURES / "store-yaml", tmp_path / "store")
    reader = StoreReader(store)
    before = Catalog.from_read(reader.read())
    graph = GraphIndex.build(before)
    _edit_store(store)
    after, delta = before.derive(reader.read())
    assert delta.touched and after.memory("1") is None and after.model("jaffle", "customers") is None

    monkeypatch.setattr(G, "_REBUILD_SHARE", share)
    assert graph.apply(after, delta) == outcome
    fresh = GraphIndex.build(after)
    try:
        assert _dump(graph) == _dump(fresh)
        assert graph.generation == after.generation
        # The edits are visible through ordinary filters.
        mentioned = graph.run("MATCH (:Memory {id: 'memory:4'})-[:MENTIONS]->(n) RETURN n.id AS id")
        assert mentioned == {
            "jaffle.orders.loyalty_points",
            "memory:kb.revenue",
            "jaffle.supplies.cost",
            "supplies",
        }
        assert "memory:1" not in graph.run("MATCH (v:Memory) RETURN v.id AS id")
        assert "jaffle.orders.status" not in graph.run("MATCH (v:Column) RETURN v.id AS id")
        # And undoing them brings back the original graph.
        restored, back = after.derive(StoreReader(FIXTURES / "store-yaml").read())
        graph.apply(restored, back)
        original = GraphIndex.build(before)
        try:
            assert _dump(graph) == _dump(original)
        finally:
            original.close()
    finally:
        fresh.close()
        graph.close()


def test_apply_without_changes_is_a_no_op(yaml_catalog):
    from slayer_lsp.catalog import Delta

    with GraphIndex.build(yaml_catalog) as g:
        assert g.apply(yaml_catalog, Delta()) == "unchanged"
    with pytest.raises(CypherFilterError, match="closed"):
        g.run("MATCH (v:Memory) RETURN v.id AS id")


def test_missing_ladybug_is_reported_as_unavailable(yaml_catalog, monkeypatch, tmp_path):
    import builtins

    real_import = builtins.__import__

    def no_ladybug(name, *args, **kwargs):  # type: ignore[no-untyped-def]
        if name == "ladybug":
            raise ImportError("No module named 'ladybug'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ladybug)
    assert not G.is_available()
    monkeypatch.undo()
    # The graph lives in a child process: there, a 'ladybug' that cannot be imported shadows the real one.
    shadow = tmp_path / "shadow" / "ladybug"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError(\"No module named 'ladybug'\")\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(shadow.parent), os.environ.get("PYTHONPATH", "")]))
    with pytest.raises(G.GraphUnavailableError, match="not available") as info:
        GraphIndex.build(yaml_catalog)
    assert isinstance(info.value, ImportError)  # callers catch ImportError to use the naive form
