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
