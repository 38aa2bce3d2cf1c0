"""The stored documents of a SLayer store, as msgspec structs.

These mirror what motley-slayer 1.4.1 writes (``model_dump(mode="json")``): unknown fields are
ignored so that documents of a newer version load best effort, and every field has a default so
that a document missing optional keys (older versions) still decodes. The structs are frozen: the
catalog shares them between snapshots.
"""

from __future__ import annotations

from typing import Any

import msgspec

# The longest learning slayer-lsp writes (``slayer/saveMemory`` refuses a longer one) and indexes
# (a longer one, written by another tool, is indexed up to this many characters): a memory is a
# note, and every index pass over its text must stay cheap. 256 Ki characters.
MAX_LEARNING_CHARS = 262_144

# Document versions this reader was written against (a missing ``version`` means 1).
KNOWN_VERSIONS = {"SlayerModel": 15, "DatasourceConfig": 2, "Memory": 4, "SlayerQuery": 6}

_LEGACY_TYPES = {
    "string": "TEXT",
    "text": "TEXT",
    "str": "TEXT",
    "varchar": "TEXT",
    "number": "DOUBLE",
    "double": "DOUBLE",
    "float": "DOUBLE",
    "decimal": "DOUBLE",
    "int": "INT",
    "integer": "INT",
    "bigint": "INT",
    "bool": "BOOLEAN",
    "boolean": "BOOLEAN",
    "date": "DATE",
    "time": "TIMESTAMP",
    "timestamp": "TIMESTAMP",
    "datetime": "TIMESTAMP",
    "unknown": "UNKNOWN",
}


#: SLayer's DataType names: a column type spelled so needs no normalising.
DATA_TYPES = frozenset({"TEXT", "INT", "DOUBLE", "BOOLEAN", "DATE", "TIMESTAMP", "UNKNOWN"})


def normalise_type(raw: str | None) -> str:
    """Map legacy lowercase type spellings to SLayer's upper-case DataType names."""
    if not raw:
        return "TEXT"
    upper = raw.upper()
    if upper in DATA_TYPES:
        return upper
    return _LEGACY_TYPES.get(raw.lower(), upper)


# Subclasses repeat ``frozen=True``: msgspec inherits it, but type checkers read each class alone.
class _Doc(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    pass


class NumberFormat(_Doc, frozen=True, kw_only=True):
    type: str | None = None
    precision: int | None = None
    symbol: str | None = None

    def words(self) -> str:
        """The format as a reader says it: ``currency, precision 2, symbol $``."""
        parts = [self.type or "number"]
        if self.precision is not None:
            parts.append(f"precision {self.precision}")
        if self.symbol:
            parts.append(f"symbol {self.symbol}")
        return ", ".join(parts)


class Column(_Doc, frozen=True, kw_only=True):
    name: str
    sql: str | None = None
    type: str = "TEXT"
    db_type: str | None = None
    primary_key: bool = False
    unique: bool = False
    description: str | None = None
    label: str | None = None
    hidden: bool = False
    format: NumberFormat | None = None
    granularity: str | None = None
    allowed_aggregations: list[str] | None = None
    filter: str | None = None
    sampled: str | None = None
    sampled_values: list[str] | None = None
    distinct_count: int | None = None
    meta: Any = None


class Measure(_Doc, frozen=True, kw_only=True):
    name: str | None = None
    formula: str = ""
    label: str | None = None
    description: str | None = None
    type: str | None = None
    meta: Any = None


class AggregationParam(_Doc, frozen=True, kw_only=True):
    name: str
    sql: str | None = None


class Aggregation(_Doc, frozen=True, kw_only=True):
    name: str
    formula: str | None = None
    params: list[AggregationParam] = []
    description: str | None = None
    meta: Any = None


class Join(_Doc, frozen=True, kw_only=True):
    target_model: str
    join_pairs: list[list[str]] = []
    join_type: str | None = "left"
    cardinality: str | None = None
    name: str | None = None
    description: str | None = None
    meta: Any = None

    @property
    def key_pairs(self) -> tuple[tuple[str, str], ...]:
        """Each (this model's column, the target's column) pair that names both: a pair a hand edit
        (or a file cut short) left with one key is passed over by every reader, and reported by the
        store checks."""
        return tuple((p[0], p[1]) for p in self.join_pairs if len(p) >= 2)


class Model(_Doc, frozen=True, kw_only=True):
    version: int = 1
    name: str
    data_source: str | None = None
    sql_table: str | None = None
    source_kind: str | None = None
    sql: str | None = None
    source_queries: list[Any] | None = None
    query_variables: Any = None
    columns: list[Column] = []
    measures: list[Measure] = []
    aggregations: list[Aggregation] = []
    joins: list[Join] = []
    filters: list[str] = []
    default_time_dimension: str | None = None
    description: str | None = None
    hidden: bool = False
    access_tags: list[str] = []
    meta: Any = None


class Datasource(_Doc, frozen=True, kw_only=True):
    version: int = 1
    name: str
    type: str | None = None
    host: str | None = None
    port: int | None = None
    database: str | None = None
    username: str | None = None
    connection_string: str | None = None
    schema_name: str | None = None
    description: str | None = None


class Memory(_Doc, frozen=True, kw_only=True):
    version: int = 1
    id: str = ""
    learning: str = ""
    description: str | None = None
    entities: list[str] = []
    query: dict[str, Any] | None = None
    created_at: str = ""


def check_version(kind: str, version: int) -> str | None:
    """A warning when a document is newer than this reader knows (it still loads best effort)."""
    known = KNOWN_VERSIONS[kind]
    if version > known:
        return f"{kind} version {version} is newer than the known version {known}; loaded best effort"
    return None
