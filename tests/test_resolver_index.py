"""The resolver's per-snapshot index (leaf owners, incoming joins) is updated from the previous
snapshot's for the models that changed; after any sequence of store edits it must equal a fresh
build, and resolution must answer as it would from scratch."""

from __future__ import annotations

import random
import shutil

import pytest
import yaml

from slayer_lsp.catalog import Catalog
from slayer_lsp.query import resolver
from slayer_lsp.query.resolver import EntityResolutionError, resolve_entity
from slayer_lsp.store.reader import StoreReader
from tests.conftest import YAML_STORE

PROBES = (
    "status",
    "city",
    "orders",
    "products",
    "name",
    "id",
    "stores.city",
    "orders.customers.name",
    "supplies",
    "products.price",
    "cost",
    "sku",
    "extra_0",
    "extra_1",
    "twin",
)


@pytest.fixture()
def store(tmp_path):
    dst = tmp_path / "store"
    shutil.copytree(YAML_STORE, dst, copy_function=shutil.copyfile)
    for path in [dst, *dst.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return dst


def _edit(store, rng: random.Random, step: int) -> None:
    """One random edit a user or SLayer could make to a model file."""
    files = sorted(store.glob("models/*/*.yaml"))
    path = rng.choice(files)
    data = yaml.safe_load(path.read_text())
    op = rng.choice(
        [
            "add_column",
            "drop_column",
            "add_join",
            "drop_joins",
            "copy_model",
            "delete_model",
            "rename_model",
            "add_measure",
            "noop_rewrite",
        ]
    )
    if op == "add_column":
        data.setdefault("columns", []).append(
            {
                "name": rng.choice(["extra_0", "extra_1", "twin", "status"])
                + (f"_{step}" if rng.random() < 0.3 else ""),
                "sql": "x",
                "type": "TEXT",
            }
        )
    elif op == "drop_column" and data.get("columns"):
        data["columns"].pop(rng.randrange(len(data["columns"])))
    elif op == "add_join":
        peers = [p.stem for p in path.parent.glob("*.yaml") if p.stem != data["name"]]
        if peers:
            data.setdefault("joins", []).append(
                {
                    "target_model": rng.choice(peers),
                    "join_pairs": [["id", "id"]],
                    "join_type": "left",
                    "cardinality": "many_to_one",
                }
            )
    elif op == "drop_joins":
        data["joins"] = []
    elif op == "copy_model":
        ds_dir = rng.choice(sorted(p for p in (store / "models").iterdir() if p.is_dir()))
        data["name"] = f"twin_{step % 3}"
        data["data_source"] = ds_dir.name
        path = ds_dir / f"twin_{step % 3}.yaml"
    elif op == "delete_model" and len(files) > 3:
        path.unlink()
        return
    elif op == "rename_model":
        path.unlink()
        data["name"] = f"{data['name']}_r{step}"
        path = path.with_name(f"{data['name']}.yaml")
    elif op == "add_measure":
        data.setdefault("measures", []).append(
            {"name": rng.choice(["cost", "twin", "sku"]), "formula": "sum(x)"}
        )
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def _answers(catalog: Catalog) -> list[str]:
    out = []
    for source in (None, "jaffle.orders", "jaffle.stores"):
        for ref in PROBES:
            try:
                r = resolve_entity(ref, catalog, source)
                out.append(f"{r.canonical} {r.warnings}")
            except EntityResolutionError as exc:
                out.append(f"error: {exc}")
    return out


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(6))
def test_incremental_index_equals_a_fresh_build(store, seed):
    rng = random.Random(seed)
    reader = StoreReader(store, use_cache=False)
    catalog = Catalog.from_read(reader.read())
    resolver._index(catalog)
    for step in range(30):
        _edit(store, rng, step)
        catalog, _ = catalog.derive(reader.read())
        incremental = resolver._index(catalog)
        fresh = resolver._build_index(catalog)
        assert incremental == fresh, f"step {step}"
        scratch = Catalog.from_read(StoreReader(store, use_cache=False).read())
        assert _answers(catalog) == _answers(scratch), f"step {step}"


def test_another_store_gets_its_own_index(store, tmp_path):
    first = Catalog.from_read(StoreReader(store, use_cache=False).read())
    resolver._index(first)
    other = Catalog.from_read(StoreReader(YAML_STORE, use_cache=False).read())
    assert resolver._index(other) == resolver._build_index(other)
