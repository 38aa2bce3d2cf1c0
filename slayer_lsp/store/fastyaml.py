"""YAML loading with PyYAML's C parser and a lean constructor.

``yaml.load(text, Loader=CSafeLoader)`` parses in C but builds every node object and resolves every
scalar in Python; on a store of 1,000 models that is most of the cold-load time. This module walks the
C parser's event stream directly and builds the Python values in one pass, resolving plain scalars
with exactly the implicit resolvers (YAML 1.1) and constructors of PyYAML's ``SafeLoader``, so the
result equals ``yaml.safe_load`` (but for timestamps, kept as text). Anything unusual (explicit tags, complex keys, merge keys) defers
to ``yaml.load`` itself.
"""

from __future__ import annotations

import datetime as _dt
from typing import Any

import yaml
from yaml.events import (
    AliasEvent,
    MappingEndEvent,
    MappingStartEvent,
    ScalarEvent,
    SequenceEndEvent,
    SequenceStartEvent,
)

try:
    _Loader: Any = yaml.CSafeLoader
except AttributeError:  # pragma: no cover - libyaml missing
    _Loader = yaml.SafeLoader

_RESOLVERS = yaml.resolver.Resolver.yaml_implicit_resolvers
_SAFE = yaml.SafeLoader("")  # a constructor instance whose scalar constructors we reuse
_CONSTRUCT = {
    "tag:yaml.org,2002:null": lambda v: None,
    "tag:yaml.org,2002:bool": lambda v: _SAFE.bool_values[v.lower()],
    "tag:yaml.org,2002:int": lambda v: _SAFE.construct_yaml_int(yaml.ScalarNode("", v)),
    "tag:yaml.org,2002:float": lambda v: _SAFE.construct_yaml_float(yaml.ScalarNode("", v)),
    # Stored documents hold timestamps as strings (created_at): keep the text as written.
    "tag:yaml.org,2002:timestamp": lambda v: v,
}


class _Defer(Exception):
    """The document uses a feature this fast path does not handle; use PyYAML's full loader."""


def _plain(value: str) -> Any:
    for tag, regexp in _RESOLVERS.get(value[:1] if value else "", ()):
        if regexp.match(value):
            construct = _CONSTRUCT.get(tag)
            if construct is None:  # merge "<<" or value "=" keys: let PyYAML handle them
                raise _Defer
            return construct(value)
    return value


def load(text: str) -> Any:
    """Parse one YAML document like ``yaml.safe_load`` (raises ``yaml.YAMLError`` on bad input),
    except that timestamps stay the text they were written as."""
    try:
        return _load_events(text)
    except _Defer:
        return _timestamps_as_text(yaml.load(text, Loader=_Loader))


def _timestamps_as_text(value: Any) -> Any:
    if isinstance(value, (_dt.date, _dt.datetime)):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: _timestamps_as_text(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_timestamps_as_text(v) for v in value]
    return value


class _Frame:
    """An open mapping and the key waiting for its value."""

    __slots__ = ("mapping", "key")

    def __init__(self, mapping: dict) -> None:
        self.mapping = mapping
        self.key: Any = _NO_KEY


_NO_KEY = object()


def _load_events(text: str) -> Any:
    stack: list[Any] = []  # open containers: a list (sequence) or a _Frame (mapping)
    anchors: dict[str, Any] = {}
    root: Any = None

    for ev in yaml.parse(text, Loader=_Loader):
        cls = ev.__class__
        if cls is ScalarEvent:
            if ev.tag is not None and ev.tag != "!":
                raise _Defer
            value = _plain(ev.value) if ev.implicit[0] else ev.value
        elif cls is MappingStartEvent or cls is SequenceStartEvent:
            if ev.tag is not None and ev.tag not in ("tag:yaml.org,2002:map", "tag:yaml.org,2002:seq"):
                raise _Defer
            value = {} if cls is MappingStartEvent else []
        elif cls is MappingEndEvent or cls is SequenceEndEvent:
            stack.pop()
            continue
        elif cls is AliasEvent:
            if ev.anchor not in anchors:
                raise _Defer
            value = anchors[ev.anchor]
        else:  # stream and document events
            continue
        if cls is not AliasEvent and ev.anchor:
            anchors[ev.anchor] = value
        # attach the value to its parent
        if not stack:
            root = value
        else:
            top = stack[-1]
            if top.__class__ is list:
                top.append(value)
            elif top.key is _NO_KEY:
                if cls is not ScalarEvent:
                    raise _Defer  # a complex or aliased key
                top.key = value
            else:
                top.mapping[top.key] = value
                top.key = _NO_KEY
        if cls is MappingStartEvent:
            stack.append(_Frame(value))
        elif cls is SequenceStartEvent:
            stack.append(value)
    return root
