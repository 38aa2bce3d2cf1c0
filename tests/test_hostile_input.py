"""Hostile input (issue #9, item 6), in process and through the CLI.

* ``cypher_filter``: writes, file reads and loads, procedure calls, several statements, keywords hidden
  in comments or behind Unicode look-alikes, unbounded paths and value or row explosions. Each is
  refused with a message saying why, or runs bounded (hops capped, rows counted, a deadline, a
  buffer-pool limit); the store, the working directory, the temp directory and a directory of
  "outside" files are the same afterwards.
* Memory ids with path separators, ``..``, absolute paths, NUL, lone surrogates or too many bytes for a
  file name: refused by ``store/writer.py`` with a clear error on both backends, or (ids that are
  odd but legal) written only as ``<store>/memories/<id>.md``; nothing outside ``memories/`` is
  created or deleted.
* Descriptions carrying Markdown, HTML, control and bidi characters: the hover card, rendered by
  markdown-it with raw HTML on, shows them as text and nothing else (property-tested on the escaping
  helpers, and on real cards built from a store that holds the payloads).
* A 1 MB question and absurd ``max_results`` through the CLI (the LSP side is in
  tests/lsp/test_hostile_lsp.py); terminal output never carries raw escape sequences.
"""

from __future__ import annotations

import hashlib
import html
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests import markdown_oracle as md

REPO = Path(__file__).resolve().parents[1]
SHOP = REPO / "examples" / "shop"


# ------------------------------------------------------------------------------------------ sandbox


@dataclass
class Sandbox:
    root: Path
    store: Path  # YAML store copy
    db: Path  # SQLite store copy
    cwd: Path  # the working directory: must stay empty
    tmp: Path  # $TMPDIR: must be empty again afterwards
    outside: Path  # files a hostile input would like to read, overwrite or delete
    cache: Path  # $SLAYER_LSP_CACHE_DIR: ours to write

    def outside_tree(self) -> dict[str, str]:
        """Digest of everything that is neither a store nor the cache (never read: the daemon may be
        writing its cache at that moment, a datasource index in the background for one)."""
        return tree(self.root, skip=("store/", "store.db", "cache/", "logs"))


def tree(root: Path, skip: tuple[str, ...] = ()) -> dict[str, str]:
    """Each path below ``root`` with a digest of its bytes, leaving out (never entering) those that
    start with ``skip``."""
    out = {}
    for here, dirs, files in os.walk(root):
        base = Path(here).relative_to(root).as_posix()
        prefix = "" if base == "." else base + "/"
        dirs[:] = [d for d in dirs if not (prefix + d + "/").startswith(skip)]
        for name in dirs:
            out[prefix + name] = "dir"
        for name in files:
            rel = prefix + name
            if not rel.startswith(skip):
                out[rel] = hashlib.sha256((Path(here) / name).read_bytes()).hexdigest()[:16]
    return dict(sorted(out.items()))


@pytest.fixture
def sandbox(tmp_path, monkeypatch) -> Sandbox:
    store = tmp_path / "store"
    shutil.copytree(SHOP / "store", store, copy_function=shutil.copyfile)
    db = tmp_path / "store.db"
    shutil.copyfile(SHOP / "store.db", db)
    sb = Sandbox(
        tmp_path, store, db, tmp_path / "cwd", tmp_path / "tmp", tmp_path / "outside", tmp_path / "cache"
    )
    for d in (sb.cwd, sb.tmp, sb.outside, sb.cache):
        d.mkdir()
    (sb.outside / "secret.csv").write_text("id\nleaked\n")
    (sb.outside / "victim.md").write_text("---\nentities: []\n---\nnot a memory of this store\n")
    (store / "victim.md").write_text("a file beside memories/, not in it\n")
    monkeypatch.chdir(sb.cwd)
    monkeypatch.setenv("TMPDIR", str(sb.tmp))
    monkeypatch.setattr(tempfile, "tempdir", str(sb.tmp))
    monkeypatch.setenv("SLAYER_LSP_CACHE_DIR", str(sb.cache))
    return sb


# ------------------------------------------------------------------------------------------ cypher

REFUSED = [  # (name, cypher_filter, what the message says)
    ("create", "CREATE (n:Model {id: 'x'}) RETURN n.id AS id", "must start with MATCH"),
    ("merge", "MATCH (n) MERGE (m:Model {id: 'x'}) RETURN m.id AS id", "keyword MERGE"),
    ("set", "MATCH (n:Model) SET n.description = 'pwned' RETURN n.id AS id", "keyword SET"),
    ("delete", "MATCH (n) DELETE n RETURN n.id AS id", "keyword DELETE"),
    ("detach-delete", "MATCH (n) DETACH DELETE n", "keyword DETACH"),
    ("remove", "MATCH (n) REMOVE n.description RETURN n.id AS id", "keyword REMOVE"),
    ("drop", "MATCH (n) DROP TABLE Model", "keyword DROP"),
    ("alter", "MATCH (n) ALTER TABLE Model ADD x STRING", "keyword ALTER"),
    ("load-from", "MATCH (n) LOAD FROM '{outside}/secret.csv' RETURN n.id AS id", "keyword LOAD"),
    ("load-first", "LOAD FROM '{outside}/secret.csv' RETURN id AS id", "must start with MATCH"),
    ("copy-from", "MATCH (n) COPY Model FROM '{outside}/secret.csv'", "keyword COPY"),
    ("copy-to", "MATCH (n) COPY (MATCH (m) RETURN m.id) TO '{outside}/dump.csv'", "keyword COPY"),
    ("export-database", "MATCH (n) EXPORT DATABASE '{outside}/export'", "keyword EXPORT"),
    ("import-database", "MATCH (n) IMPORT DATABASE '{outside}/export'", "keyword IMPORT"),
    ("install-extension", "MATCH (n) INSTALL httpfs", "keyword INSTALL"),
    ("load-extension", "MATCH (n) LOAD EXTENSION '{outside}/evil.so' RETURN n.id AS id", "keyword LOAD"),
    (
        "attach",
        "MATCH (n) ATTACH '{outside}/other.db' AS o (dbtype lbug) RETURN n.id AS id",
        "keyword ATTACH",
    ),
    ("use", "MATCH (n) USE o RETURN n.id AS id", "keyword USE"),
    ("call-procedure", "MATCH (n) CALL show_tables() RETURN n.id AS id", "keyword CALL"),
    ("call-read-csv", "MATCH (n) CALL read_csv('{outside}/secret.csv') RETURN n.id AS id", "keyword CALL"),
    (
        "table-function-as-value",
        "MATCH (n) RETURN n.id AS id, current_setting('home_directory') AS h",
        "may not call current_setting()",
    ),
    ("transaction", "MATCH (n) BEGIN TRANSACTION", "keyword BEGIN"),
    ("checkpoint", "MATCH (n) CHECKPOINT", "keyword CHECKPOINT"),
    ("two-statements", "MATCH (n) RETURN n.id AS id; MATCH (m) DETACH DELETE m", "single statement"),
    ("trailing-semicolon", "MATCH (n) RETURN n.id AS id;", "single statement"),
    (
        "keyword-between-comments",
        "MATCH (n) /* harmless */ DETACH /* */ DELETE n RETURN n.id AS id",
        "keyword DETACH",
    ),
    ("keyword-after-block-comment", "MATCH (n) /* x */SET n.x = 1 RETURN n.id AS id", "keyword SET"),
    ("star-swallows-the-close", "MATCH (n) /* **/ SET n.x = 1 RETURN n.id AS id", "unterminated /* comment"),
    ("unterminated-comment", "MATCH (n) RETURN n.id AS id /* DETACH DELETE n", "unterminated /* comment"),
    ("unterminated-string", "MATCH (n) WHERE n.id = 'x RETURN n.id AS id", "unterminated string"),
    ("unterminated-quoted-name", "MATCH (n) RETURN n.`id AS id", "unterminated quoted name"),
    ("mixed-case", "MATCH (n) dEtAcH dElEtE n RETURN n.id AS id", "keyword DETACH"),
    ("nbsp-separator", "MATCH (n) DETACH\u00a0DELETE n RETURN n.id AS id", "keyword DETACH"),
    ("long-s-spelling", "MATCH (n) \u017fet n.id = 'x' RETURN n.id AS id", "keyword SET"),
    ("greek-question-mark", "MATCH (n) RETURN n.id AS id\u037e MATCH (m) DETACH DELETE m", "keyword DETACH"),
    (
        "cyrillic-homoglyph",
        "MATCH (n) \u0421REATE (m:Model {id: 'x'}) RETURN n.id AS id",
        "may not call \u0441reate()",
    ),
    (
        "fullwidth-keyword",
        "MATCH (n) \uff24\uff25\uff2c\uff25\uff34\uff25 n RETURN n.id AS id",
        "cypher_filter failed",
    ),
    ("zero-width-in-keyword", "MATCH (n) DE\u200bLETE n RETURN n.id AS id", "cypher_filter failed"),
    ("path-bound-too-high", "MATCH (a)-[*..1000]->(b) RETURN b.id AS id", "exceeds the limit of 10 hops"),
    ("path-lower-bound-too-high", "MATCH (a)-[*20..]->(b) RETURN b.id AS id", "exceeds the limit of 10 hops"),
    ("path-exact-too-high", "MATCH (a)-[*11]->(b) RETURN b.id AS id", "exceeds the limit of 10 hops"),
    ("repeat", "MATCH (n) RETURN n.id + repeat('x', 2000000000) AS id", "may not call repeat()"),
    ("quoted-repeat", "MATCH (n) RETURN `repeat`('x', 2000000000) AS id", "may not call repeat()"),
    ("lpad", "MATCH (n) RETURN lpad(n.id, 2000000000, 'x') AS id", "may not call lpad()"),
    ("range", "MATCH (n) UNWIND range(1, 100000000) AS x RETURN x AS id", "may not call range()"),
    (
        "list-reduce",
        "MATCH (n) WITH collect(n.id) AS l RETURN list_reduce(l, (x, y) -> x + x) AS id",
        "may not call list_reduce()",
    ),
    ("doubling-chain", "MATCH (n) WITH n.id AS a " + "WITH a + a AS a " * 40 + "RETURN a AS id", "fold"),
    ("concat-chain", "MATCH (n) WITH n.id AS a " + "WITH concat(a, a) AS a " * 12 + "RETURN a AS id", "fold"),
    (
        "list-concat",
        "MATCH (n) WITH [n.id] AS a WITH list_concat(a, a) AS a RETURN size(a) AS id",
        "may not call list_concat()",
    ),
    (
        "replace-growth",
        "MATCH (n) WITH n.id AS s WITH replace(s, 'a', s) AS s RETURN s AS id",
        "may not call replace()",
    ),
    ("levenshtein", "MATCH (n) RETURN levenshtein(n.id, 'x') AS id", "may not call levenshtein()"),
    ("too-long", "MATCH (n) RETURN n.id AS id " + "/* x */" * 2000, "the limit is 10000"),
    ("empty", "  /* only a comment */ ", "empty"),
    ("no-id-column", "MATCH (n) RETURN n.id", "aliased id"),
    ("nodes-instead-of-ids", "MATCH (n) RETURN n AS id", "must hold ids"),
    ("unknown-label", "MATCH (n:Passwd) RETURN n.id AS id", "unknown node label"),
]
BOUNDED = [  # accepted: read-only, and bounded by the hop cap
    ("open-path", "MATCH (a)-[*]->(b) RETURN b.id AS id"),
    ("open-upper-bound", "MATCH (a)-[*1..]->(b) RETURN b.id AS id"),
    ("shortest", "MATCH (a)-[* SHORTEST]->(b) RETURN b.id AS id"),
    ("comment-hides-a-second-statement", "MATCH (n:Model) RETURN n.id AS id // ; MATCH (m) DETACH DELETE m"),
    (
        "keywords-in-a-string",
        "MATCH (n) WHERE n.description CONTAINS 'DELETE; DROP TABLE Model' RETURN n.id AS id",
    ),
    ("escaped-quote-keeps-the-string", "MATCH (n) WHERE n.id = 'x\\' DETACH DELETE n //' RETURN n.id AS id"),
    ("keyword-as-quoted-name", "MATCH (n) WHERE n.`name` = 'DELETE' RETURN n.id AS id"),
]


@pytest.fixture
def engine(sandbox):
    from slayer_lsp.engine import Engine

    eng = Engine(sandbox.store, dense="off")
    yield eng
    eng.close()


def _search(engine, cypher: str) -> object:
    return engine.search({"question": "orders", "cypher_filter": cypher, "max_results": 50})


def test_cypher_filter_refused_or_bounded_and_nothing_touched(sandbox, engine):
    from slayer_lsp.search.types import SearchError

    every_id = "MATCH (n) RETURN n.id AS id"
    before_ids = {h.id for h in _search(engine, every_id).results}
    store_before, outside_before = tree(sandbox.store), sandbox.outside_tree()
    refused = {}
    for name, cypher, why in REFUSED:
        with pytest.raises(SearchError) as err:
            _search(engine, cypher.replace("{outside}", str(sandbox.outside)))
        assert why in str(err.value), (name, str(err.value))
        refused[name] = str(err.value)
    for name, cypher in BOUNDED:
        resp = _search(engine, cypher)
        assert isinstance(resp.results, list), name
    # nothing written, nothing deleted: the graph still answers the same, every file is as it was
    assert {h.id for h in _search(engine, every_id).results} == before_ids
    assert tree(sandbox.store) == store_before
    assert sandbox.outside_tree() == outside_before
    assert not any(sandbox.cwd.iterdir()) and not any(sandbox.tmp.iterdir())
    print(
        f"\n[hostile] cypher_filter: {len(REFUSED)} refused, {len(BOUNDED)} bounded; e.g. {refused['repeat']!r}"
    )


@pytest.mark.parametrize(
    ("name", "cypher", "limit"),
    [
        ("cartesian-product", "MATCH (a), (b), (c), (d) RETURN a.id AS id", "rows"),
        (
            "row-explosion-by-unwind",
            "MATCH (n) WITH collect(n.id) AS l UNWIND l AS a UNWIND l AS b UNWIND l AS c "
            "UNWIND l AS d RETURN a AS id",
            "rows",
        ),
        (
            "path-explosion",
            "MATCH (a)-[*1..10]-(b)-[*1..10]-(c)-[*1..10]-(d) RETURN DISTINCT d.id AS id",
            "time",
        ),
    ],
)
def test_cypher_filter_explosions_are_bounded(sandbox, name, cypher, limit):
    """What validation cannot see is stopped while it runs: rows past MAX_FILTER_ROWS, or the query
    deadline (a short one here), each with a message saying which."""
    from slayer_lsp.catalog import load_catalog
    from slayer_lsp.search.cypher_lexer import CypherFilterError
    from slayer_lsp.search.graph import MAX_FILTER_ROWS, GraphIndex

    with GraphIndex.build(load_catalog(sandbox.store)) as graph:
        with pytest.raises(CypherFilterError) as err:
            # rows: time enough to reach the row limit on a loaded machine; time: a short deadline
            graph.run(cypher, timeout_s=5.0 if limit == "rows" else 1.0)
        message = str(err.value)
        if limit == "rows":
            assert f"more than {MAX_FILTER_ROWS:,} rows" in message
        else:
            assert "timed out" in message or "MiB the graph may use" in message, message
        assert graph.run("MATCH (n:Model) RETURN n.id AS id")  # the graph still answers


# ------------------------------------------------------------------------------------------ memory ids

REFUSED_IDS = [  # (id, what the message says); refused on both backends
    ("../evil", "forbidden character '/'"),
    ("../../outside/victim", "forbidden character '/'"),
    ("/etc/passwd", "forbidden character '/'"),
    ("memories/../../victim", "forbidden character '/'"),
    ("..\\..\\victim", "forbidden character '\\\\'"),
    ("C:\\Windows\\win", "forbidden character ':'"),
    ("memory:1", "forbidden character ':'"),
    ("a?b", "forbidden character '?'"),
    ("a#b", "forbidden character '#'"),
    ("a\x00b", "control characters"),
    ("\x00", "control characters"),
    ("a\nb", "whitespace"),
    ("a b", "whitespace"),
    ("\u2028", "whitespace"),
    ("\u202eevil", "does not show"),  # a bidi override: displays as another id (issue #14)
    ("", "non-empty"),
    ("\ud800", "lone surrogate"),
    ("x\udcff", "lone surrogate"),
]
ODD_BUT_LEGAL_IDS = [
    "..",
    ".",
    "...",
    ".hidden",
    "%2e%2e%2f",
    "\u2215etc\u2215passwd",
    "\uff0e\uff0e",
    "CON",
    "nul",
    "x.md",
    "-rf",
    "~",
    "$HOME",
    "é" * 100,
    ".notes.tmp.v2",
    ".x.md.tmp.abcdefgh",
]  # the last two look like a writer's temp files


@pytest.mark.parametrize("backend", ["yaml", "sqlite"])
def test_hostile_memory_ids(sandbox, backend):
    from slayer_lsp.catalog import load_catalog
    from slayer_lsp.store.locate import locate
    from slayer_lsp.writer.memories import MemoryWriteError, forget_memory, save_memory

    path = sandbox.store if backend == "yaml" else sandbox.db
    loc, cat = locate(path), load_catalog(path)
    memories = sandbox.store / "memories"
    outside_before = sandbox.outside_tree()
    yaml_before = tree(sandbox.store)
    for memory_id, why in REFUSED_IDS:
        for op in (
            lambda i: save_memory(loc, cat, learning="l", entities=["shop.orders"], id=i),
            lambda i: forget_memory(loc, cat, i),
        ):
            with pytest.raises(MemoryWriteError) as err:
                op(memory_id)
            assert why in str(err.value), (ascii(memory_id), str(err.value))
    too_long = "x" * 300
    if backend == "yaml":
        with pytest.raises(MemoryWriteError, match="too long for a YAML store"):
            save_memory(loc, cat, learning="l", entities=["shop.orders"], id=too_long)
    else:
        assert save_memory(loc, cat, learning="l", entities=["shop.orders"], id=too_long).id == too_long
    assert forget_memory(loc, cat, too_long) is (backend == "sqlite")
    for memory_id in ODD_BUT_LEGAL_IDS:
        saved = save_memory(loc, cat, learning="odd id", entities=["shop.orders"], id=memory_id)
        assert saved.id == memory_id and saved.created
        if backend == "yaml":
            written = memories / f"{memory_id}.md"
            assert written.is_file() and written.resolve().parent == memories.resolve(), ascii(memory_id)
    # a later write (which sweeps dead writers' temp files) keeps every one of them
    extra = save_memory(loc, cat, learning="one more", entities=["shop.orders"]).id
    if backend == "yaml":
        assert all((memories / f"{i}.md").is_file() for i in ODD_BUT_LEGAL_IDS)
    # ids starting with "." are listed too: SLayer takes every *.md of memories/
    assert set(ODD_BUT_LEGAL_IDS) <= set(load_catalog(path).memories)
    for memory_id in [*ODD_BUT_LEGAL_IDS, extra]:
        assert forget_memory(loc, cat, memory_id) is True, ascii(memory_id)
        assert forget_memory(loc, cat, memory_id) is False
    # nothing outside memories/ was created or deleted; memories/ holds what it held
    assert sandbox.outside_tree() == outside_before
    after = tree(sandbox.store)
    changed = {k for k in set(yaml_before) | set(after) if yaml_before.get(k) != after.get(k)}
    allowed = {"memories.lock", "embeddings.db"}  # the lock is opened; forget clears embedding rows
    assert changed <= allowed, changed
    assert (sandbox.store / "victim.md").is_file() and (sandbox.outside / "victim.md").is_file()
    assert not any(sandbox.cwd.iterdir()) and not any(sandbox.tmp.iterdir())


# ------------------------------------------------------------------------------------------ Markdown

PAYLOADS = [
    "<script>alert('x')</script>",
    "[click me](javascript:alert(1))",
    "](javascript:alert(1))",
    "![pixel](http://attacker.example/p.png)",
    "<img src=x onerror=alert(1)>",
    "<a href='javascript:alert(1)'>x</a>",
    "# Heading\nUnderlined\n===\nAlso\n---\n1) ordered\n2. ordered\n- item\n+ item\n> quote\n\n    indented code",
    "```\nfenced\n```",
    "| a | b |\n|---|---|\n| 1 | 2 |",
    "**bold** __bold__ *it* _it_ ~~gone~~ `code`",
    "<!-- hidden --> <details open>x</details> <style>p{}</style>",
    "&lt;script&gt; &#60;b&#62; &amp;",
    "\\*not emphasis\\* \\",
    "[ref]\n\n[ref]: javascript:alert(1)",
    "\x1b[2J\x1b[31mred\x07 \x1b]0;title\x07",
    "NUL:\x00: DEL:\x7f: C1:\x9b:",
    "\u202eevil\u202c \u2066isolate\u2069 \u200fRLM",
    "line1\r\nline2\rline3\x0bline4",
]
ALLOWED_CARD_TAGS = {"p", "br", "strong", "em", "code", "pre", "del", "ul", "li"}


def _plain_visible(text: str) -> str:
    """What the reader should see of ``text`` in a paragraph: its lines (controls as codes)."""
    from slayer_lsp.analysis.hover import visible

    return " ".join(" ".join(visible(line) for line in text.strip().splitlines()).split())


markdownish = st.text(
    alphabet=st.sampled_from(list("<>&\\`*_[]()#|~!-+=:./'\" \t\n\r1)aZé\x00\x1b\u202e\x85"))
    | st.characters(),
    min_size=1,
    max_size=60,
)


@pytest.mark.slow
@settings(
    max_examples=6,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(texts=st.lists(markdownish, min_size=60, max_size=60))
def test_escaped_text_renders_as_itself(texts):
    """Property: whatever the text, ``paragraphs`` renders to paragraphs and line breaks holding
    exactly that text (controls shown as codes), and ``code`` to one code span holding it."""
    from slayer_lsp.analysis.hover import code, paragraphs, visible

    texts = [t for t in texts if t.strip()]
    html_paragraphs = md.render([paragraphs(t) for t in texts], linkify=False)
    html_codes = md.render([code(t) for t in texts], linkify=False)
    for text, para, span in zip(texts, html_paragraphs, html_codes, strict=True):
        assert {name for name, _ in md.tags(para)} <= {"p", "br"}, (ascii(text), para)
        assert md.text_of(para) == _plain_visible(text), (ascii(text), para)
        assert [name for name, _ in md.tags(span)] == ["p", "code"], (ascii(text), span)
        shown = " ".join(visible(text).replace("\n", " ").split())
        assert md.text_of(span) == shown, (ascii(text), span)


def _hostile_store(sandbox: Sandbox) -> Path:
    """The sandbox store with every payload in descriptions, labels, SQL, a learning and a memory
    description (each written the way a YAML store holds it)."""
    model_path = sandbox.store / "models" / "shop" / "orders.yaml"
    model = yaml.safe_load(model_path.read_text())
    model["description"] = "\n".join(PAYLOADS)
    for i, col in enumerate(model["columns"]):
        payload = PAYLOADS[i % len(PAYLOADS)]
        col["description"] = payload
        col["label"] = payload.replace("\n", " ")
    model_path.write_text(yaml.safe_dump(model, allow_unicode=True))
    memory = {
        "created_at": "2026-01-01T00:00:00Z",
        "description": PAYLOADS[0] + PAYLOADS[14],
        "entities": ["shop.orders.status"],
        "version": 4,
    }
    (sandbox.store / "memories" / "hostile.md").write_text(
        "---\n" + yaml.safe_dump(memory, allow_unicode=True) + "---\n" + "\n\n".join(PAYLOADS),
        encoding="utf-8",
    )
    return sandbox.store


def assert_card_is_inert(markdown: str, rendered: str) -> None:
    """A hover card rendered with raw HTML on: only the tags the card itself uses, no link, image,
    script, heading, quote, table or list item made of user text, no control or bidi character."""
    # linkify turns a bare http(s) URL into a link to exactly what the text says: allowed, and only that
    autolinks = re.findall(r'<a href="([^"]*)">([^<]*)</a>', rendered)
    assert all(
        href == html.unescape(text) and href.startswith(("http://", "https://")) for href, text in autolinks
    )
    found = md.tags(re.sub(r'<a href="[^"]*">', "", rendered))
    assert {name for name, _ in found} <= ALLOWED_CARD_TAGS, sorted({n for n, _ in found})
    assert not any(attrs.strip() for _, attrs in found), found  # no href, src, on*=, style
    assert "javascript:" not in " ".join(href for href, _ in autolinks)
    for ch in "\x00\x1b\x07\x7f\x9b\u202e\u202c\u2066\u2069\u200f":
        assert ch not in markdown and ch not in rendered, ascii(ch)


def test_hover_cards_of_hostile_descriptions_are_inert(sandbox):
    from slayer_lsp.analysis.hover import entity_markdown
    from slayer_lsp.catalog import load_catalog

    cat = load_catalog(_hostile_store(sandbox))
    assert not cat.fatal, cat.fatal
    model = cat.models["shop.orders"]
    targets = ["shop.orders", "memory:hostile", *[f"shop.orders.{c.name}" for c in model.columns]]
    cards = [entity_markdown(cat, t, max_chars=100_000) for t in targets]
    assert all(cards), [t for t, c in zip(targets, cards, strict=True) if not c]
    for target, card, rendered in zip(targets, cards, md.render(cards), strict=True):
        assert_card_is_inert(card, rendered)
        if not target.startswith("shop.orders."):  # the model and the memory hold every payload
            assert "<script>alert('x')</script>" in md.text_of(rendered), target  # shown as text


# ------------------------------------------------------------------------------------------ CLI


def _cli(sandbox: Sandbox, *args: str) -> subprocess.CompletedProcess[bytes]:
    env = {
        **os.environ,
        "TMPDIR": str(sandbox.tmp),
        "SLAYER_LSP_CACHE_DIR": str(sandbox.cache),
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
    }
    return subprocess.run(
        [sys.executable, "-m", "slayer_lsp", "search", "--storage", str(sandbox.store), "--no-dense", *args],
        cwd=sandbox.cwd,
        env=env,
        capture_output=True,
        timeout=300,
    )


@pytest.mark.slow
def test_cli_search_bounds_huge_and_absurd_input(sandbox):
    """``slayer-lsp search``: absurd --max-results are capped with a warning or refused with a clear
    message; a question as long as a command line may be is cut with a warning (the LSP test sends
    a 1 MB one); a cypher_filter that writes is refused."""
    cases = [
        (["--question", "orders", "--max-results", str(10**9)], 0, "above the cap; returning at most"),
        (["--question", "orders", "--max-results", str(2**70)], 0, "above the cap; returning at most"),
        (["--question", "orders", "--max-results", "-1"], 1, "max_results must be >= 1"),
        (["--question", "orders", "--max-results", "0"], 1, "max_results must be >= 1"),
        (["--question", "orders", "--max-results", "x"], 2, "invalid int value: 'x'"),
        (["--question", "orders revenue " * 8_000], 0, "question cut to its first"),  # 120 kB: near ARG_MAX
        (["--question", "orders", "--cypher-filter", "MATCH (n) DETACH DELETE n"], 1, "keyword DETACH"),
    ]
    for args, code, says in cases:
        proc = _cli(sandbox, *args)
        out = (proc.stdout + proc.stderr).decode("utf-8", "replace")
        assert proc.returncode == code, (args[:3], proc.returncode, out[-500:])
        assert says in out, (args[:3], out[-500:])
    assert not any(sandbox.cwd.iterdir()) and not any(sandbox.tmp.iterdir())


def test_cli_output_carries_no_terminal_escapes(sandbox):
    """A description holding ESC sequences and bidi overrides is printed with those characters as
    codes: a search must not recolour, retitle or clear the user's terminal."""
    _hostile_store(sandbox)
    proc = _cli(sandbox, "--question", "orders status paid shipped", "--max-results", "50", "--verbose")
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    out = proc.stdout.decode("utf-8")
    assert "shop.orders" in out
    assert "\\u001b" in out  # the payload is there, made visible
    for ch in "\x1b\x07\x00\x9b\u202e\u2066":
        assert ch not in out and ch not in proc.stderr.decode("utf-8", "replace"), ascii(ch)
