"""The server's options, as typed dataclasses with their defaults in code.

Options arrive as untyped JSON twice: ``initializationOptions`` (every client) and
``workspace/didChangeConfiguration`` (clients that push settings). Both go through ``parse_options``,
which never fails: a value of the wrong type or out of range is reported as a problem (the server
shows it with ``window/showMessage``) and that one option keeps its previous value (the default at
start). Keys are accepted in camelCase (editor settings) or snake_case, at the top level or under a
``slayerLsp``/``slayer`` section, since clients nest settings differently. An empty string means
"the default" (editors cannot unset a string setting).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

DEFAULT_QUERY_PATTERNS: tuple[str, ...] = (
    "**/*.query.yaml",
    "**/*.query.yml",
    "**/*.query.json",
    "**/queries/**/*.yaml",
    "**/queries/**/*.yml",
    "**/queries/**/*.json",
)
DEFAULT_MEMORY_PATTERNS: tuple[str, ...] = ("**/memories/*.md",)

# Section names a client may wrap its settings in (VS Code's extension uses ``slayerLsp``).
SECTIONS = ("slayer_lsp", "slayer")

# Settings an editor extension reads itself (launch command, tracing); present in pushed settings.
CLIENT_SIDE_KEYS = frozenset({"trace", "server", "interpreter", "search"})

MAX_DEBOUNCE_MS = 10_000
MIN_HOVER_CHARS = 200


@dataclass(frozen=True)
class DiagnosticsOptions:
    enable: bool = True
    debounce_ms: int = 300  # quiet time after the last keystroke before a document is re-checked


@dataclass(frozen=True)
class FilesOptions:
    query_patterns: tuple[str, ...] = DEFAULT_QUERY_PATTERNS
    memory_patterns: tuple[str, ...] = DEFAULT_MEMORY_PATTERNS


@dataclass(frozen=True)
class EmbeddingOptions:
    """The dense search channel (embeddings computed in the background by the daemon)."""

    enable: bool = True  # false: lexical channels only (no model is loaded; tests and small machines)
    model: str | None = None  # None = $SLAYER_EMBEDDING_MODEL, else the bundled offline model
    switch_model: bool = False  # let this model replace another model's stored vectors (re-embeds all)


@dataclass(frozen=True)
class ScopeOptions:
    """The session's scope (``reach.scope``): what lies outside it is unreachable for every feature
    (search, hover, completion, navigation, inspect, status, diagnostics). ``datasources`` empty:
    every datasource. ``access_tags``: the caller's SLayer tags; empty means no access restriction
    unless ``untagged_only`` says the caller holds no tag (then only untagged models are reachable)."""

    datasources: tuple[str, ...] = ()
    access_tags: tuple[str, ...] = ()
    untagged_only: bool = False

    def to_scope(self):  # -> reach.scope.Scope
        from slayer_lsp.reach.scope import Scope

        return Scope.of(self.datasources, self.access_tags, untagged_only=self.untagged_only)


@dataclass(frozen=True)
class HoverOptions:
    max_chars: int = 4000


@dataclass(frozen=True)
class Options:
    storage: str | None = None  # path or URI of the store; None = SLayer's lookup (env, XDG dir)
    diagnostics: DiagnosticsOptions = field(default_factory=DiagnosticsOptions)
    files: FilesOptions = field(default_factory=FilesOptions)
    embedding: EmbeddingOptions = field(default_factory=EmbeddingOptions)
    scope: ScopeOptions = field(default_factory=ScopeOptions)
    hover: HoverOptions = field(default_factory=HoverOptions)

    def to_dict(self) -> dict[str, Any]:
        """The effective configuration in the camelCase shape clients send (for logs and status)."""
        return {
            "storage": self.storage,
            "diagnostics": {"enable": self.diagnostics.enable, "debounceMs": self.diagnostics.debounce_ms},
            "files": {
                "queryPatterns": list(self.files.query_patterns),
                "memoryPatterns": list(self.files.memory_patterns),
            },
            "embedding": {
                "enable": self.embedding.enable,
                "model": self.embedding.model,
                "switchModel": self.embedding.switch_model,
            },
            "scope": {
                "datasources": list(self.scope.datasources),
                "accessTags": list(self.scope.access_tags),
                "untaggedOnly": self.scope.untagged_only,
            },
            "hover": {"maxChars": self.hover.max_chars},
        }


def _snake(key: str) -> str:
    out = []
    for ch in key:
        if ch.isupper():
            out.append("_")
            out.append(ch.lower())
        else:
            out.append(ch)
    return "".join(out)


def _get(section: dict[str, Any], key: str) -> tuple[bool, Any]:
    """Look a snake_case key up in a section written in either spelling."""
    for k, v in section.items():
        if isinstance(k, str) and _snake(k) == key:
            return True, v
    return False, None


class _Parser:
    def __init__(self) -> None:
        self.problems: list[str] = []

    def section(self, raw: dict[str, Any], name: str) -> dict[str, Any]:
        found, value = _get(raw, name)
        if not found or value is None:
            return {}
        if not isinstance(value, dict):
            self.problems.append(f"'{name}' must be an object, got {_type_name(value)}; ignored")
            return {}
        return value

    def value(
        self, section: dict[str, Any], path: str, key: str, current: Any, check: Callable[[Any], Any]
    ) -> Any:
        found, value = _get(section, key)
        if not found:
            return current
        try:
            return check(value)
        except ValueError as exc:
            self.problems.append(f"'{path}': {exc}; using {_show(current)}")
            return current


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    return {
        bool: "a boolean",
        int: "a number",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "an object",
    }.get(type(value), type(value).__name__)


def _show(value: Any) -> str:
    if isinstance(value, tuple):
        return repr(list(value))
    return repr(value)


def _bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    raise ValueError(f"expected true or false, got {_type_name(value)}")


def _int_between(low: int, high: int) -> Callable[[Any], int]:
    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
            raise ValueError(f"expected an integer, got {_type_name(value)}")
        if not low <= int(value) <= high:
            raise ValueError(f"expected a value between {low} and {high}, got {int(value)}")
        return int(value)

    return check


def _optional_str(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {_type_name(value)}")
    return value.strip() or None


def _str_list(*, non_empty: bool) -> Callable[[Any], tuple[str, ...]]:
    def check(value: Any) -> tuple[str, ...]:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
            raise ValueError(f"expected a list of non-empty strings, got {_type_name(value)}")
        if non_empty and not value:
            raise ValueError("expected at least one pattern")
        return tuple(v.strip() for v in value)

    return check


def parse_options(raw: Any, base: Options | None = None) -> tuple[Options, list[str]]:
    """Options from a client's JSON (``initializationOptions`` or a settings object), on top of
    ``base``; returns the options and the problems found (each with the value kept instead)."""
    base = base or Options()
    p = _Parser()
    if raw is None:
        return base, []
    if not isinstance(raw, dict):
        return base, [f"options must be an object, got {_type_name(raw)}; ignored"]
    for section in SECTIONS:  # pushed settings arrive wrapped in the client's section
        found, nested = _get(raw, section)
        if found and isinstance(nested, dict):
            raw = nested
            break

    storage = p.value(raw, "storage", "storage", base.storage, _optional_str)
    diag = p.section(raw, "diagnostics")
    files = p.section(raw, "files")
    emb = p.section(raw, "embedding")
    scope = p.section(raw, "scope")
    hover = p.section(raw, "hover")
    opts = Options(
        storage=storage,
        diagnostics=DiagnosticsOptions(
            enable=p.value(diag, "diagnostics.enable", "enable", base.diagnostics.enable, _bool),
            debounce_ms=p.value(
                diag,
                "diagnostics.debounceMs",
                "debounce_ms",
                base.diagnostics.debounce_ms,
                _int_between(0, MAX_DEBOUNCE_MS),
            ),
        ),
        files=FilesOptions(
            query_patterns=p.value(
                files,
                "files.queryPatterns",
                "query_patterns",
                base.files.query_patterns,
                _str_list(non_empty=False),
            ),
            memory_patterns=p.value(
                files,
                "files.memoryPatterns",
                "memory_patterns",
                base.files.memory_patterns,
                _str_list(non_empty=False),
            ),
        ),
        embedding=EmbeddingOptions(
            enable=p.value(emb, "embedding.enable", "enable", base.embedding.enable, _bool),
            model=p.value(emb, "embedding.model", "model", base.embedding.model, _optional_str),
            switch_model=p.value(
                emb, "embedding.switchModel", "switch_model", base.embedding.switch_model, _bool
            ),
        ),
        scope=ScopeOptions(
            datasources=p.value(
                scope, "scope.datasources", "datasources", base.scope.datasources, _str_list(non_empty=False)
            ),
            access_tags=p.value(
                scope, "scope.accessTags", "access_tags", base.scope.access_tags, _str_list(non_empty=False)
            ),
            untagged_only=p.value(
                scope, "scope.untaggedOnly", "untagged_only", base.scope.untagged_only, _bool
            ),
        ),
        hover=HoverOptions(
            max_chars=p.value(
                hover,
                "hover.maxChars",
                "max_chars",
                base.hover.max_chars,
                _int_between(MIN_HOVER_CHARS, 1_000_000),
            )
        ),
    )
    known = {f.name for f in dataclasses.fields(Options)} | CLIENT_SIDE_KEYS
    for key in raw:
        if not isinstance(key, str) or _snake(key) not in known:
            p.problems.append(f"unknown option '{key}'; ignored")
    return opts, p.problems
