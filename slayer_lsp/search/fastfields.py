"""Fast-field reads typed as the schema stores them.

tantivy types every fast-field value as any scalar (``int | float | bool | None``); the indexes
here read only u64 fields that every document sets, so the values are ints. Saying so once keeps
the callers typed without a check per value on the hot path of a search.
"""

from __future__ import annotations

from typing import cast

import tantivy


def u64_values(searcher: tantivy.Searcher, field: str, addrs: list[tantivy.DocAddress]) -> list[int]:
    """The values of the u64 fast field ``field`` of the documents at ``addrs``, in order."""
    return cast(list[int], searcher.fast_field_values(field, addrs))
