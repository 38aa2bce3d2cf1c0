"""protocol/: the schemas are what ``generate.py`` makes of the current types, every custom method is
specified, and every example of the spec is what the server really answers."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import sys
from pathlib import Path
from typing import Any, Union, get_args, get_origin

import msgspec
import pytest

from slayer_lsp.search.recency import TODAY_ENV
from tests.conftest import REPO, YAML_STORE

PROTOCOL = REPO / "protocol"
SPEC = (PROTOCOL / "README.md").read_text(encoding="utf-8")
EXAMPLE = re.compile(r"<!-- example: (\S+) (params|result|error) -->\s*```json\n(.*?)```", re.DOTALL)
ERROR_FOR = re.compile(r"Error for `([^`]*)`:\s*<!-- example: (\S+) error -->")


def load(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"protocol_{name}", PROTOCOL / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


generate = load("generate")
client_mod = load("example_client")
EXAMPLES_DAY = re.search(r"`SLAYER_LSP_TODAY=(\d{4}-\d\d-\d\d)`", SPEC).group(1)  # type: ignore[union-attr]
TYPES = {title: typ for title, typ in generate.types().values()}  # "slayer/search params" -> type


def examples() -> dict[tuple[str, str], Any]:
    found = {(m.group(1), m.group(2)): json.loads(m.group(3)) for m in EXAMPLE.finditer(SPEC)}
    assert found, "no examples in protocol/README.md"
    return found


def unknown_keys(value: Any, typ: Any, where: str = "$") -> list[str]:
    """Keys of ``value`` that ``typ`` (a msgspec type) does not declare, anywhere inside it."""
    out: list[str] = []
    origin = get_origin(typ)
    if origin is Union or type(typ).__name__ == "UnionType":
        for arg in get_args(typ):
            if isinstance(arg, type) and issubclass(arg, msgspec.Struct) and isinstance(value, dict):
                return unknown_keys(value, arg, where)
            if get_origin(arg) is list and isinstance(value, list):
                return unknown_keys(value, arg, where)
        return out
    if isinstance(typ, type) and issubclass(typ, msgspec.Struct) and isinstance(value, dict):
        fields = {f.encode_name: f.type for f in msgspec.structs.fields(typ)}
        for k, v in value.items():
            if k not in fields:
                out.append(f"{where}.{k}")
            else:
                out.extend(unknown_keys(v, fields[k], f"{where}.{k}"))
    elif origin is list and isinstance(value, list):
        (item,) = get_args(typ)
        for i, v in enumerate(value):
            out.extend(unknown_keys(v, item, f"{where}[{i}]"))
    return out


def conforms(value: Any, typ: Any) -> None:
    msgspec.convert(value, typ)
    assert unknown_keys(value, typ) == []


# --------------------------------------------------------------------------- schemas and spec


def test_schemas_are_up_to_date():
    wanted = generate.render()
    present = {p.name: p.read_text(encoding="utf-8") for p in (PROTOCOL / "schemas").glob("*.json")}
    stale = sorted(n for n in wanted if present.get(n) != wanted[n])
    assert not stale, f"out of date (run python protocol/generate.py): {stale}"
    assert set(present) == set(wanted), "schema files that generate.py does not make"
    for text in wanted.values():
        schema = json.loads(text)
        assert schema["$schema"].startswith("https://json-schema.org/") and schema["$ref"].startswith(
            "#/$defs/"
        )


def test_every_custom_method_is_specified():
    from slayer_lsp.lsp.server import CUSTOM_METHODS

    found = examples()
    for method in CUSTOM_METHODS:
        stem = method.replace("/", "-")
        assert f"\n## {method}\n" in SPEC, method
        assert (PROTOCOL / "schemas" / f"{stem}.params.json").is_file(), method
        assert (PROTOCOL / "schemas" / f"{stem}.result.json").is_file(), method
        assert (method, "params") in found and (method, "result") in found, method
        assert f"`{method.replace('/', '.')}`" in SPEC, f"the executeCommand twin of {method}"


def test_examples_fit_the_types():
    for (method, part), value in examples().items():
        if part == "error":
            assert set(value) == {"code", "message"} and value["message"].startswith(method + ": ")
            assert f"`{value['code']}`" in SPEC
            continue
        conforms(value, TYPES[f"{method} {part}"])


def test_params_types_refuse_unknown_fields():
    for title, typ in TYPES.items():
        if title.endswith(" params"):
            with pytest.raises(msgspec.ValidationError):
                msgspec.convert({"no_such_field": 1}, typ)


# --------------------------------------------------------------------------- against the server


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The daemon on a private copy of the jaffle store (the memory examples write to it), spoken to
    with the example client's connection: raw JSON, nothing converted on the way."""
    root = tmp_path_factory.mktemp("protocol")
    store = root / "store"
    shutil.copytree(YAML_STORE, store, copy_function=shutil.copyfile)
    for path in [store, *store.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    with pytest.MonkeyPatch.context() as env:  # the examples' scores are as of the day they were written
        env.setenv(TODAY_ENV, EXAMPLES_DAY)
        conn = client_mod.Connection(
            [sys.executable, "-m", "slayer_lsp", "serve", "--storage", str(store)],
            stderr=(root / "server.log").open("w"),
        )
    init = conn.request(
        "initialize",
        {
            "processId": None,
            "rootUri": None,
            "capabilities": {},
            "initializationOptions": {"embedding": {"enable": False}},
        },
    )
    conn.notify("initialized", {})
    conn.store, conn.init = store, init  # type: ignore[attr-defined]
    yield conn
    assert conn.close() == 0


def normalised(value: Any, store: Path) -> Any:
    """The live answer with the private store's path spelled as in the spec."""
    text = json.dumps(value).replace(store.as_uri(), "file:///srv/store").replace(str(store), "/srv/store")
    return json.loads(text)


# search waits for the first index; status answers at once, so it comes after
ORDER = [
    "slayer/search",
    "slayer/inspect",
    "slayer/impact",
    "slayer/status",
    "slayer/saveMemory",
    "slayer/forgetMemory",
]


def test_commands_are_advertised(server):
    commands = server.init["capabilities"]["executeCommandProvider"]["commands"]
    from slayer_lsp.lsp.server import CUSTOM_METHODS

    assert set(commands) >= {m.replace("/", ".") for m in CUSTOM_METHODS}


def test_spec_examples_are_what_the_server_answers(server):
    found = examples()
    for method in ORDER:
        got = server.request(method, found[(method, "params")])
        conforms(got, TYPES[f"{method} result"])
        got = normalised(got, server.store)
        if method == "slayer/status":  # timings and counters vary; the shape and the store do not
            assert got["store"] == "/srv/store" and got["ready"] is True
            continue
        assert got == found[(method, "result")], method


def test_spec_error_examples(server):
    cases = [(m.group(2), json.loads(m.group(1))) for m in ERROR_FOR.finditer(SPEC)]
    assert {method for method, _ in cases} == {m for m, part in examples() if part == "error"}
    for method, params in cases:
        with pytest.raises(client_mod.RpcError) as err:
            server.request(method, params)
        expected = examples()[(method, "error")]
        assert (err.value.code, err.value.message) == (expected["code"], expected["message"])


def test_command_twins(server):
    direct = server.request("slayer/inspect", {"refs": ["memory:5"]})
    assert (
        server.request("workspace/executeCommand", {"command": "slayer.inspect", "arguments": ["memory:5"]})
        == direct
    )
    assert (
        server.request(
            "workspace/executeCommand", {"command": "slayer.inspect", "arguments": [{"refs": ["memory:5"]}]}
        )
        == direct
    )
    status = server.request("workspace/executeCommand", {"command": "slayer.status", "arguments": [{}]})
    conforms(status, TYPES["slayer/status result"])
    with pytest.raises(client_mod.RpcError) as err:
        server.request("slayer/status", {"verbose": True})
    assert err.value.code == -32602
    with pytest.raises(client_mod.RpcError) as err:
        server.request("slayer/nope", {})
    assert err.value.code == -32601


def test_params_may_be_omitted(server):
    assert server.request("slayer/status")["version"]
