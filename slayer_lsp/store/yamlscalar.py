"""How YAML 1.1 reads a plain scalar, exactly as PyYAML's ``SafeLoader`` does (but for timestamps).

Shared by the two fast YAML readers (``blockyaml`` line by line, ``fastyaml`` over libyaml's events),
so that both resolve ``yes``, ``0x1F``, ``1:20`` or ``~`` the one way PyYAML does. A store repeats
the same few thousand scalars (``INT``, ``false``, ``id``, ``customer_id``) hundreds of thousands of
times, so resolutions are remembered; every value they give is immutable.
"""

from __future__ import annotations

from typing import Any

import yaml


class Unhandled(Exception):
    """The text uses a feature a fast reader does not handle; PyYAML's full loader reads it."""


_RESOLVERS = yaml.resolver.Resolver.yaml_implicit_resolvers
_SAFE = yaml.SafeLoader("")  # a constructor instance whose scalar constructors are reused
_CONSTRUCT = {
    "tag:yaml.org,2002:null": lambda v: None,
    "tag:yaml.org,2002:bool": lambda v: _SAFE.bool_values[v.lower()],
    "tag:yaml.org,2002:int": lambda v: _SAFE.construct_yaml_int(yaml.ScalarNode("", v)),
    "tag:yaml.org,2002:float": lambda v: _SAFE.construct_yaml_float(yaml.ScalarNode("", v)),
    # Stored documents hold timestamps as strings (created_at): keep the text as written.
    "tag:yaml.org,2002:timestamp": lambda v: v,
}

_MEMO: dict[str, Any] = {}
_MEMO_MAX = 100_000  # entries (short strings and numbers: ~10 MB at most); cleared when full
_MEMO_KEY_MAX = 64  # characters: longer scalars (descriptions) rarely repeat


def resolve_plain(value: str) -> Any:
    """The value of a plain (unquoted) scalar; raises ``Unhandled`` for the merge key ``<<`` and
    the value key ``=``, which only a full loader gives their meaning."""
    try:
        return _MEMO[value]
    except KeyError:
        pass
    out: Any = value
    for tag, regexp in _RESOLVERS.get(value[:1] if value else "", ()):
        if regexp.match(value):
            construct = _CONSTRUCT.get(tag)
            if construct is None:
                raise Unhandled
            out = construct(value)
            break
    if len(value) <= _MEMO_KEY_MAX:
        if len(_MEMO) >= _MEMO_MAX:
            _MEMO.clear()
        _MEMO[value] = out
    return out
