"""Shared test fixtures: the reference stores written by real SLayer live in ../shared/fixtures
(beside the checkout), or in ``$SLAYER_LSP_SHARED/fixtures``."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("SLAYER_LSP_SHARED") or REPO.parent / "shared")
FIXTURES = SHARED / "fixtures" / "jaffle"
EXPECTED = FIXTURES / "expected"
YAML_STORE = FIXTURES / "store-yaml"
SQLITE_STORE = FIXTURES / "store.db"


def pytest_configure(config: pytest.Config) -> None:
    if not FIXTURES.is_dir():  # one clear message rather than a FileNotFoundError per module
        raise pytest.UsageError(
            f"the reference fixtures are not at {FIXTURES}: the tests read ../shared beside the "
            "checkout; set SLAYER_LSP_SHARED to the shared directory when it lives elsewhere"
        )


@pytest.fixture(autouse=True, scope="session")
def _private_cache_dir(tmp_path_factory):
    """Never touch the user's cache: every test run gets its own."""
    import os

    os.environ["SLAYER_LSP_CACHE_DIR"] = str(tmp_path_factory.mktemp("slayer-lsp-cache"))
    os.environ["SLAYER_LSP_MODEL_DIR"] = str(tmp_path_factory.mktemp("slayer-lsp-models"))


@pytest.fixture(scope="session")
def yaml_catalog():
    from slayer_lsp.catalog import load_catalog

    return load_catalog(YAML_STORE)


@pytest.fixture(scope="session")
def sqlite_catalog():
    from slayer_lsp.catalog import load_catalog

    return load_catalog(SQLITE_STORE)


def execute_sql(db: Path, *statements: tuple[str, tuple]) -> None:
    """Run ``statements`` (SQL, arguments) against ``db`` in one transaction, as a writer would."""
    conn = sqlite3.connect(db)
    with conn:
        for sql, args in statements:
            conn.execute(sql, args)
    conn.close()
