"""The cold read of a large YAML store parses in worker processes (``store/parse_worker.py``): what
it reads must be exactly what one process reads, and a worker that fails costs only time."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from slayer_lsp.store import reader as store_reader
from tests.conftest import YAML_STORE


def _read(store: Path, parallel: bool, monkeypatch: pytest.MonkeyPatch) -> store_reader.StoreRead:
    monkeypatch.setattr(store_reader, "PARALLEL_PARSE_MIN", 1 if parallel else 10**9)
    monkeypatch.setattr(store_reader.os, "cpu_count", lambda: 2)
    return store_reader.StoreReader(store).read()


def _as_data(read: store_reader.StoreRead) -> list[tuple[object, ...]]:
    return [(k, doc.digest, doc.value, doc.issues) for k, doc in read.docs.items()] + [
        ("issues", read.issues)
    ]


@pytest.fixture
def store(tmp_path: Path) -> Path:
    copy = tmp_path / "store"
    shutil.copytree(YAML_STORE, copy)
    (copy / "models" / "jaffle" / "broken.yaml").write_text("name: [unclosed\n")  # an issue, not a doc
    return copy


def test_the_parallel_cold_read_is_the_serial_one(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    serial = _read(store, False, monkeypatch)
    imported: list[int] = []
    real = store_reader.YamlReader.import_parsed
    monkeypatch.setattr(
        store_reader.YamlReader,
        "import_parsed",
        lambda self, entries: (imported.append(len(entries)), real(self, entries))[1],
    )
    parallel = _read(store, True, monkeypatch)
    assert len(imported) == 2 and sum(imported) == len(serial.docs)  # two workers parsed every document
    assert _as_data(parallel) == _as_data(serial)
    assert any("broken.yaml" in str(i) for i in parallel.issues)


def test_a_failing_worker_costs_only_time(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    serial = _read(store, False, monkeypatch)
    monkeypatch.setattr(sys, "executable", str(store / "no-such-python"))  # the workers cannot start
    assert _as_data(_read(store, True, monkeypatch)) == _as_data(serial)
