"""Custom request params decoded with msgspec into the very types the JSON Schemas are made from.

``decode`` is the only way a ``slayer/*`` request's params reach its handler: ``msgspec.convert``
(strict: no coercion) into the table's type (``protocol_types`` and ``search``), so what the server
accepts is what ``protocol/schemas`` says. A refusal is -32602 naming the parameter in words
(``'learning' must be a string, got null``), then msgspec's own reason with the JSON path.
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec
from msgspec import inspect as mi
from pygls.exceptions import JsonRpcInvalidParams

from slayer_lsp.lsp.errors import invalid_params
from slayer_lsp.lsp.protocol import json_type

S = TypeVar("S", bound=msgspec.Struct)


def plain(value: Any) -> Any:
    """Untyped params as plain data (namedtuples, if a client path produced them, back to dicts)."""
    if hasattr(value, "_asdict"):
        return {k: plain(v) for k, v in value._asdict().items()}
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def decode(method: str, raw: Any, typ: type[S]) -> S:
    """``raw`` (omitted params are ``{}``) as a ``typ``, or -32602 saying what is wrong."""
    raw = plain(raw)
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise invalid_params(method, f"params must be an object, got {type(raw).__name__}")
    try:
        return msgspec.convert(raw, typ, strict=True)
    except msgspec.ValidationError as exc:
        raise invalid_params(method, f"{problem(raw, typ)} ({exc})") from exc


def refuse(method: str, exc: ValueError) -> JsonRpcInvalidParams:
    """A check of decoded params that failed (``SaveMemoryParams.links``): -32602 with its reason."""
    return invalid_params(method, str(exc))


def problem(raw: dict[str, Any], typ: type[msgspec.Struct]) -> str:
    """The first thing msgspec refuses in ``raw``, in words; the same one it reports (it reads the
    keys in order, then looks for missing required fields)."""
    fields = msgspec.structs.fields(typ)
    by_name = {f.encode_name: f for f in fields}
    for key, value in raw.items():
        field = by_name.get(key)
        if field is None:
            unknown = sorted(k for k in raw if k not in by_name)
            if not fields:
                return f"takes no parameters, got {unknown}"
            return f"unknown parameter(s) {unknown}; expected {[f.encode_name for f in fields]}"
        try:
            msgspec.convert(value, field.type, strict=True)
        except msgspec.ValidationError:
            return f"'{key}' {expected(field.type)}, got {json_type(value)}"
    for field in fields:
        if field.required and field.encode_name not in raw:
            return f"'{field.encode_name}' {expected(field.type)}, got null"
    return "invalid params"


def expected(typ: Any) -> str:
    return f"must be {describe(mi.type_info(typ))}"


def describe(info: mi.Type) -> str:
    """A type as a message says it ("a list of strings", "a string or an integer")."""
    if isinstance(info, mi.UnionType):
        kinds = [describe(t) for t in info.types if not isinstance(t, mi.NoneType)]
        return " or ".join(kinds) or "null"
    if isinstance(info, mi.ListType):
        return f"a list of {plural(info.item_type)}"
    if isinstance(info, mi.DictType):
        return (
            "an object"
            if isinstance(info.value_type, mi.AnyType)
            else f"an object of {plural(info.value_type)}"
        )
    if isinstance(info, mi.LiteralType):
        return "one of " + ", ".join(repr(v) for v in info.values)
    simple = {
        mi.StrType: "a string",
        mi.IntType: "an integer",
        mi.FloatType: "a number",
        mi.BoolType: "a boolean",
        mi.NoneType: "null",
        mi.AnyType: "any value",
        mi.StructType: "an object",
    }
    return simple.get(type(info), "a value of another type")


def plural(info: mi.Type) -> str:
    names = {
        mi.StrType: "strings",
        mi.IntType: "integers",
        mi.FloatType: "numbers",
        mi.BoolType: "booleans",
        mi.StructType: "objects",
        mi.DictType: "objects",
        mi.ListType: "lists",
    }
    return names.get(type(info), "values")


def command_params(command: str, args: tuple[Any, ...]) -> Any:
    """A ``workspace/executeCommand`` command's arguments as its request's params: one argument, the
    params (none: ``{}``)."""
    if len(args) > 1:
        raise invalid_params(command, f"expected one argument (the request's params), got {len(args)}")
    return args[0] if args else {}
