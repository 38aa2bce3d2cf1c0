"""Words and whole tokens: how names and questions are cut into what is matched."""

from __future__ import annotations

import re
from functools import lru_cache

__all__ = ["TOKEN_RE", "words_of"]

# A whole token: word characters joined by "-", ".", ":" or "@" (``PROD-4471``, ``ds.model.col``,
# ``memory:12``); a trailing dot is punctuation, not part of it.
TOKEN_RE = re.compile(r"\w+(?:[-.:@]\w+)*")

_CAMEL = re.compile(r"(?<=[a-z])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])|(?<=[A-Za-z])(?=\d)|(?<=\d)(?=[A-Za-z])")


@lru_cache(maxsize=1 << 16)
def words_of(name: str) -> str:
    """``order_date`` -> ``order date``; ``NumGE1500`` -> ``num ge 1500``: names as words. Cached:
    the same names come back as memories' tags, thousands of times in a warehouse."""
    spaced = _CAMEL.sub(" ", name.replace("_", " ").replace("-", " ").replace(".", " "))
    return " ".join(spaced.lower().split())
