"""Compaction of a long-lived engine: after a quiet spell, and never put off for ever by edits that
do not pause (each edit used to restart the wait, and a soak's replaced documents piled up)."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from slayer_lsp import engine as engine_module
from slayer_lsp.engine import Engine
from tests.conftest import YAML_STORE


@pytest.fixture()
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SLAYER_LSP_CACHE", "off")
    dst = tmp_path / "store"
    shutil.copytree(YAML_STORE, dst)
    return dst


def _until(condition, seconds: float = 10.0) -> bool:  # noqa: ANN001
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_edits_that_never_pause_do_not_put_a_compaction_off_for_ever(store, monkeypatch):
    monkeypatch.setattr(engine_module, "COMPACT_MAX_WAIT_S", 0.4)
    engine = Engine(store, compact_after_s=0.15)
    engine.refresh()
    memory = store / "memories/3.md"
    original = memory.read_text()
    n, stop = 0, time.monotonic() + 2.0
    while time.monotonic() < stop:  # an edit every 30 ms: no quiet spell of 150 ms ever comes
        n += 1
        memory.write_text(original.replace("Chicago", f"Chicago {n}", 1))
        engine.refresh([str(memory)])
        time.sleep(0.03)
    assert engine.stats.compactions >= 1
    # and once the edits stop, the last of them is compacted too
    assert _until(lambda: not engine.state.search.needs_compaction)
    assert engine.state.search.fulltext.deletions == 0
    engine.close()


def test_a_closed_engine_schedules_no_compaction(store):
    engine = Engine(store, compact_after_s=0.05)
    engine.refresh()
    engine.close()
    memory = store / "memories/3.md"
    memory.write_text(memory.read_text().replace("Chicago", "Zebracorn City"))
    engine.refresh([str(memory)])
    time.sleep(0.3)
    assert engine.stats.compactions == 0


def test_an_edit_in_a_warehouse_datasource_does_not_rebuild_every_index(store, monkeypatch):
    from slayer_lsp.search import indexes

    engine = Engine(store, compact_after_s=3600.0)
    engine.refresh()
    engine.state.search.warm_datasources(engine.catalog)
    memory = store / "memories/3.md"
    memory.write_text(memory.read_text().replace("Chicago", "Zebracorn City"))
    engine.refresh([str(memory)])
    search = engine.state.search
    touched = [view for view in search.by_datasource.values() if view.deletions]
    assert touched and search.needs_compaction  # a small store compacts after any edit
    # the same store counted as a warehouse (its datasource indexes stay under the "small" size):
    # one replaced document in 1/2 of an index is not worth rebuilding them all
    monkeypatch.setattr(indexes, "COMPACT_EVERY_CHANGE_UP_TO", len(search.fulltext) - 1)
    monkeypatch.setattr(indexes, "COMPACT_DIVISOR", 2)
    assert all(len(view) < len(search.fulltext) - 1 for view in touched)
    assert not search.needs_compaction
    engine.close()


ASKED = [
    {"question": question, "ranking": ranking, **scope}
    for question in ("quagga orders", "zebracorn", "supply cost", "customer lifetime value")
    for ranking in ("slayer", "hybrid")
    for scope in ({}, {"datasource": "jaffle"})
]


def _answers(engine: Engine) -> list[list[tuple[str, float]]]:
    return [[(h.id, round(h.score, 6)) for h in engine.search(a).results] for a in ASKED]


def test_a_compaction_catches_up_with_the_edits_made_while_it_ran(store, monkeypatch):
    """Edits that land during a rebuild no longer throw it away (nor wait for it): it is brought up
    to date with them and swapped in, and they are visible at once and after."""
    from slayer_lsp.search import indexes

    engine = Engine(store, compact_after_s=3600.0)  # compactions only when asked
    engine.refresh()
    engine.state.search.warm_datasources(engine.catalog)
    supplies = (
        store / "models/supplies/supplies.yaml"
    )  # one datasource's index to rebuild; jaffle's is carried
    supplies.write_text(supplies.read_text().replace("paper cup", "zebracorn cup"))
    engine.refresh([str(supplies)])
    assert engine.state.search.needs_compaction
    carried = engine.state.search.by_datasource["jaffle"]
    assert not carried.deletions
    model = store / "models/jaffle/orders.yaml"
    other = store / "memories/5.md"
    real = indexes.SearchIndexes.rebuilt

    def rebuilt_while_edits_land(self, catalog):  # noqa: ANN001, ANN202
        fresh = real(self, catalog)
        model.write_text(
            model.read_text().replace("description: Customer orders", "description: Quagga orders")
        )
        engine.refresh([str(model)])
        other.unlink()
        engine.refresh([str(other)])
        return fresh

    with monkeypatch.context() as patched:
        patched.setattr(indexes.SearchIndexes, "rebuilt", rebuilt_while_edits_land)
        assert engine.compact()  # swapped in, not dropped
    assert engine.stats.compactions == 1
    # the datasource indexes it carried on were committed to by those edits: kept, not dropped
    assert set(engine.state.search.by_datasource) == set(engine.catalog.datasources)
    assert engine.state.search.by_datasource["jaffle"].index is carried.index
    quagga = engine.search({"question": "quagga", "ranking": "slayer", "datasource": "jaffle"}).results
    assert [h.id for h in quagga][:1] == ["jaffle.orders"]
    assert "5" not in engine.catalog.memories
    assert all(h.id != "5" for a in ASKED for h in engine.search(a).results)
    while engine.state.search.needs_compaction:  # the caught-up rebuild replaced a few documents
        assert engine.compact()
    cold = Engine(store)
    assert _answers(engine) == _answers(cold)
    engine.close()
    cold.close()


def _zebra_column(name: str) -> str:
    return (
        f"- name: {name}\n  sql: {name}\n  type: TEXT\n  primary_key: false\n  unique: false\n"
        "  hidden: false\n  description: zebracorn stripes\n"
    )


def _zebra_order(engine: Engine) -> list[str]:
    view = engine.state.search.fulltext
    query = view.parse("zebracorn")
    assert query is not None
    return [hit.canonical for hit in view.search(query, memories=False, limit=10)]


def test_a_compaction_after_edits_indexes_in_the_order_a_fresh_start_does(store):
    # two columns whose texts score alike: only the corpus order tells them apart. The second is
    # added by an edit in front of the first, where a fresh start puts it, not after everything
    model = store / "models/jaffle/orders.yaml"
    original = model.read_text()
    model.write_text(original.replace("columns:\n", "columns:\n" + _zebra_column("zeb_b"), 1))
    engine = Engine(store, compact_after_s=None)
    engine.refresh()
    model.write_text(
        original.replace("columns:\n", "columns:\n" + _zebra_column("zeb_a") + _zebra_column("zeb_b"), 1)
    )
    engine.refresh([str(model)])
    assert engine.compact()
    compacted = _zebra_order(engine)
    engine.close()
    fresh = Engine(store, compact_after_s=None)
    fresh.refresh()
    assert sorted(compacted) == ["jaffle.orders.zeb_a", "jaffle.orders.zeb_b"]
    assert compacted == _zebra_order(fresh)
    fresh.close()
