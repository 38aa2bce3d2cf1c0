"""A request holds one state and sees exactly that generation: an old state held across several
refreshes (entities added, changed and deleted; memories saved, edited and forgotten) answers every
search exactly as it did before them, on both backends, while the newest state sees the changes."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import msgspec
import pytest
import yaml

from slayer_lsp.engine import Engine, State
from slayer_lsp.search.pipeline import search
from slayer_lsp.search.types import parse_params
from slayer_lsp.writer.memories import forget_memory, save_memory
from tests.conftest import SQLITE_STORE, YAML_STORE

CALLS = [
    {"question": "monthly revenue by store"},
    {"question": "monthly revenue by store", "ranking": "slayer"},
    {"question": "what's the average order total?", "max_results": 25},
    {"question": "discount code voucher", "ranking": "slayer", "max_results": 25},
    {"question": "supply cost", "datasource": "supplies"},
    {"question": "supply cost", "datasource": "supplies", "ranking": "slayer"},
    {"question": "orders", "datasource": "jaffle", "max_results": 30},
    {"question": "revenue orders customers", "kinds": ["memory"], "max_results": 30},
    {"question": "revenue orders customers", "kinds": ["memory"], "ranking": "slayer", "max_results": 30},
    {"question": "zebracorn crate price", "max_results": 30},
    {"question": "zebracorn", "ranking": "slayer"},
    {"question": "zebracorn", "kinds": ["memory"], "datasource": "supplies"},
    {"keyword": "zebracorn"},
    {"entities": ["jaffle.orders.status"], "question": "tax"},
    {"entities": ["memory:1"], "related": 1},
    {},
]
PROBE = "zebracorn"  # a word no document of the fixture holds: every edit below brings it in


def _answers(state: State) -> list[dict]:
    return [msgspec.to_builtins(search(state.catalog, state.search, parse_params(c))) for c in CALLS]


def _ids(state: State, call: dict) -> list[str]:
    return [h.id for h in search(state.catalog, state.search, parse_params(call)).results]


# --------------------------------------------------------------------------- edits, per backend


def _yaml_model_edit(store: Path, step: int) -> None:
    path = store / "models/jaffle/orders.yaml"
    data = yaml.safe_load(path.read_text())
    if step == 0:  # a description changes, a column goes
        for col in data["columns"]:
            if col["name"] == "discount_code":
                col["description"] = f"Voucher code ({PROBE} campaign) applied at checkout."
        data["columns"] = [c for c in data["columns"] if c["name"] != "tax_paid"]
    else:  # a column comes
        data["columns"].append(
            {
                "name": f"{PROBE}_points",
                "type": "INT",
                "description": f"Loyalty points of the {PROBE} scheme.",
            }
        )
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def _sqlite_model_edit(db: Path, step: int) -> None:
    conn = sqlite3.connect(db)
    try:
        with conn:
            (raw,) = conn.execute(
                "SELECT data FROM models WHERE data_source = 'jaffle' AND name = 'orders'"
            ).fetchone()
            data = json.loads(raw)
            if step == 0:
                for col in data["columns"]:
                    if col["name"] == "discount_code":
                        col["description"] = f"Voucher code ({PROBE} campaign) applied at checkout."
                data["columns"] = [c for c in data["columns"] if c["name"] != "tax_paid"]
            else:
                data["columns"].append(
                    {
                        "name": f"{PROBE}_points",
                        "type": "INT",
                        "description": f"Loyalty points of the {PROBE} scheme.",
                    }
                )
            conn.execute(
                "UPDATE models SET data = ? WHERE data_source = 'jaffle' AND name = 'orders'",
                (json.dumps(data),),
            )
    finally:
        conn.close()


def _drop_model(store: Path) -> None:
    if store.is_dir():
        (store / "models/supplies/products.yaml").unlink()
        return
    conn = sqlite3.connect(store)
    try:
        with conn:
            conn.execute("DELETE FROM models WHERE data_source = 'supplies' AND name = 'products'")
    finally:
        conn.close()


@pytest.fixture(params=["yaml", "sqlite"])
def store(request, tmp_path) -> Path:
    if request.param == "yaml":
        dst = tmp_path / "store"
        shutil.copytree(YAML_STORE, dst)
    else:
        dst = tmp_path / "store.db"
        shutil.copy(SQLITE_STORE, dst)
    return dst


def test_an_old_state_answers_the_same_across_refreshes(store: Path) -> None:
    engine = Engine(store, compact_after_s=3600)  # a daemon's engine: live index in RAM, no compaction yet
    try:
        old = engine.state
        before = _answers(old)  # also builds every lazily built index of the old generation
        assert _ids(old, {"question": PROBE, "ranking": "slayer"}) == []

        def refresh() -> None:
            engine.refresh()
            assert engine.current() is not old

        model_edit = _yaml_model_edit if store.is_dir() else _sqlite_model_edit
        model_edit(store, 0)
        refresh()
        saved = save_memory(
            engine.location,
            engine.full_catalog,
            learning=f"{PROBE.title()} supplies are priced per crate.",
            entities=["supplies.supplies.cost"],
        )
        refresh()
        save_memory(
            engine.location,
            engine.full_catalog,
            id="1",
            learning=f"Revenue of the {PROBE} stores counts refunds.",
            entities=["jaffle.orders"],
        )
        forget_memory(engine.location, engine.full_catalog, "2")
        refresh()
        _drop_model(store)
        model_edit(store, 1)
        refresh()
        assert _answers(old) == before  # every answer of the old generation, exactly

        new = engine.current()
        assert new is not None
        assert _answers(new) != before
        assert f"jaffle.orders.{PROBE}_points" in _ids(
            new, {"question": PROBE, "ranking": "slayer", "max_results": 30}
        )
        assert saved.id in _ids(new, {"question": f"{PROBE} crate", "kinds": ["memory"]})
        assert "1" in _ids(new, {"question": f"{PROBE} stores refunds", "kinds": ["memory"]})
        assert "2" not in _ids(
            new, {"question": "revenue orders customers", "kinds": ["memory"], "max_results": 50}
        )
        assert not any(
            c.startswith("supplies.products")
            for c in _ids(new, {"question": "product price", "max_results": 50})
        )
        # the old generation still answers from its own memories and entities
        assert _ids(old, {"question": f"{PROBE} crate", "kinds": ["memory"]}) == []
        assert "jaffle.orders.tax_paid" in old.catalog.entities
    finally:
        engine.close()


def test_a_generation_derived_twice_forks_instead_of_sharing(store: Path) -> None:
    """``apply`` on a generation whose writers already moved on builds indexes of its own: neither
    the older nor the newer generation changes."""
    engine = Engine(store, compact_after_s=3600)
    try:
        old = engine.state
        before = _answers(old)
        (_yaml_model_edit if store.is_dir() else _sqlite_model_edit)(store, 1)
        delta = engine.refresh()
        newer = engine.current()
        assert newer is not None and not delta.empty
        newer_answers = _answers(newer)
        forked = old.search.apply(newer.catalog, delta)  # the refresh already derived from ``old``
        assert forked.fulltext.index is not newer.search.fulltext.index
        # fresh indexes (no deleted documents in their statistics): a cold start's answers
        fresh = Engine(store, use_cache=False)
        try:
            assert _answers(State(newer.catalog, forked)) == _answers(fresh.state)
        finally:
            fresh.close()
        assert _answers(old) == before and _answers(newer) == newer_answers
    finally:
        engine.close()


def test_a_search_never_waits_for_a_refresh_under_way(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A refresh stopped in the middle of its index commits holds nothing a request needs: searches
    of every kind answer from the current state meanwhile, and the refresh then completes."""
    import threading

    from slayer_lsp.search.fulltext import FullTextIndex

    engine = Engine(store, compact_after_s=3600)
    try:
        old = engine.state
        before = _answers(old)
        inside, release = threading.Event(), threading.Event()
        commit = FullTextIndex.replace

        def held_commit(self, removals, docs):  # noqa: ANN001, ANN202
            inside.set()
            assert release.wait(30)
            return commit(self, removals, docs)

        monkeypatch.setattr(FullTextIndex, "replace", held_commit)
        (_yaml_model_edit if store.is_dir() else _sqlite_model_edit)(store, 1)
        refresher = threading.Thread(target=engine.refresh)
        refresher.start()
        try:
            assert inside.wait(30)
            answered: list[list[dict]] = []
            asker = threading.Thread(target=lambda: answered.append(_answers(engine.state)))
            asker.start()
            asker.join(30)
            assert answered == [before] and engine.current() is old
        finally:
            release.set()
            refresher.join(30)
        assert engine.current() is not old
        assert f"jaffle.orders.{PROBE}_points" in _ids(engine.state, {"question": PROBE, "ranking": "slayer"})
    finally:
        engine.close()
