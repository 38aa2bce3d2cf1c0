"""YAML loading, fastest reader first: ``blockyaml`` line by line, then libyaml's events, then PyYAML.

What SLayer writes is read by ``blockyaml`` (a fraction of a parser's cost). Whatever it declines goes
to libyaml's C parser, whose event stream is walked here to build the values in one pass (``yaml.load``
with ``CSafeLoader`` builds every node object and resolves every scalar in Python besides), resolving
plain scalars exactly as PyYAML's ``SafeLoader`` does (``yamlscalar``). Anything unusual there
(explicit tags, complex keys, merge keys) goes to ``yaml.load`` itself. Every path gives what
``yaml.safe_load`` gives, but for timestamps, kept as text.

Bounded: nesting deeper than ``MAX_NESTING`` (aliases expanded), aliases adding more than
``MAX_ALIAS_NODES`` nodes once expanded ("billion laughs") and an alias inside the node it names
(a recursive structure) raise ``LimitError`` as soon as the event stream shows them, on both paths
(the deferred one is scanned first), before anything large is built. ``blockyaml`` reads no aliases
and declines deeper nesting, so the limits are reported from here.
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

from slayer_lsp.store import blockyaml
from slayer_lsp.store.limits import ALIAS_SCALAR_CHARS, MAX_ALIAS_NODES, MAX_NESTING, LimitError
from slayer_lsp.store.yamlscalar import Unhandled, resolve_plain

try:
    _Loader: Any = yaml.CSafeLoader
except AttributeError:  # pragma: no cover - libyaml missing
    _Loader = yaml.SafeLoader


def load(text: str) -> Any:
    """Parse one YAML document like ``yaml.safe_load`` (raises ``yaml.YAMLError`` on bad input),
    except that timestamps stay the text they were written as."""
    try:
        return blockyaml.load(text)
    except Unhandled:
        pass
    try:
        return _load_events(text)
    except Unhandled:
        check_bounds(text)
        return _timestamps_as_text(yaml.load(text, Loader=_Loader))


def check_bounds(text: str) -> None:
    """Raise ``LimitError`` when the document nests too deeply or its aliases expand too far (for
    callers that hand the text to another YAML loader or composer)."""
    bounds = _Bounds()
    for ev in yaml.parse(text, Loader=_Loader):
        bounds.see(ev)


class _Bounds:
    """The document's size as its aliases expand it, and its nesting depth, checked event by event."""

    __slots__ = ("weight", "aliased", "open", "sizes")

    def __init__(self) -> None:
        self.weight = 0  # nodes so far, aliases expanded (a scalar: one per ALIAS_SCALAR_CHARS characters)
        self.aliased = 0  # of which aliases added
        self.open: list[
            list[Any]
        ] = []  # per open container: [anchor, weight at its start, deepest depth inside]
        self.sizes: dict[str, tuple[int, int]] = {}  # closed anchor -> (weight, height)

    def see(self, ev: Any) -> None:
        cls = ev.__class__
        if cls is ScalarEvent:
            w = 1 + len(ev.value) // ALIAS_SCALAR_CHARS
            self.weight += w
            if ev.anchor:
                self.sizes[ev.anchor] = (w, 0)
        elif cls is MappingStartEvent or cls is SequenceStartEvent:
            depth = len(self.open) + 1
            if depth > MAX_NESTING:
                raise LimitError(f"YAML nested deeper than {MAX_NESTING} levels{_at(ev)}")
            if ev.anchor:
                self.sizes.pop(ev.anchor, None)  # redefined: open until its end
            self.weight += 1
            self.open.append([ev.anchor, self.weight - 1, depth])
        elif cls is MappingEndEvent or cls is SequenceEndEvent:
            anchor, start, deepest = self.open.pop()
            if anchor:
                self.sizes[anchor] = (self.weight - start, deepest - len(self.open))
            if self.open:
                self.open[-1][2] = max(self.open[-1][2], deepest)
        elif cls is AliasEvent:
            size = self.sizes.get(ev.anchor)
            if size is None:
                if any(frame[0] == ev.anchor for frame in self.open):
                    raise LimitError(f"YAML alias '*{ev.anchor}' inside the node it names{_at(ev)}")
                return  # an undefined alias: the parser reports it
            w, height = size
            self.weight += w
            self.aliased += w
            if self.aliased > MAX_ALIAS_NODES:
                raise LimitError(f"YAML aliases expand to more than {MAX_ALIAS_NODES} nodes{_at(ev)}")
            deepest = len(self.open) + height
            if deepest > MAX_NESTING:
                raise LimitError(
                    f"YAML nested deeper than {MAX_NESTING} levels once aliases are expanded{_at(ev)}"
                )
            if self.open:
                self.open[-1][2] = max(self.open[-1][2], deepest)


def _at(ev: Any) -> str:
    mark = getattr(ev, "start_mark", None)
    return f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""


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
    bounds = _Bounds()

    # events are told apart by exact class (cheaper than isinstance on this hot loop), which a type
    # checker does not follow: each branch reads the attributes of the class it tested
    ev: Any
    for ev in yaml.parse(text, Loader=_Loader):
        bounds.see(ev)
        cls = ev.__class__
        if cls is ScalarEvent:
            if ev.tag is not None and ev.tag != "!":
                raise Unhandled
            value = resolve_plain(ev.value) if ev.implicit[0] else ev.value
        elif cls is MappingStartEvent or cls is SequenceStartEvent:
            if ev.tag is not None and ev.tag not in ("tag:yaml.org,2002:map", "tag:yaml.org,2002:seq"):
                raise Unhandled
            value = {} if cls is MappingStartEvent else []
        elif cls is MappingEndEvent or cls is SequenceEndEvent:
            stack.pop()
            continue
        elif cls is AliasEvent:
            if ev.anchor not in anchors:
                raise Unhandled
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
                    raise Unhandled  # a complex or aliased key
                top.key = value
            else:
                top.mapping[top.key] = value
                top.key = _NO_KEY
        if cls is MappingStartEvent:
            stack.append(_Frame(value))
        elif cls is SequenceStartEvent:
            stack.append(value)
    return root
