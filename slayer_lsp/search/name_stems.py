"""Words for names: identifiers split the way people read them, stemmed the way questions are.

A question says "average math score"; the schema says ``AvgScrMath``. Both sides become stems —
``AvgScrMath`` -> "avg scr math" -> abbreviations expanded from the entity's own label and
description ("scr" -> "score" when the description says "average score in math") — so that the
name channel of the hybrid ranking can compare them word for word. Stemming is tantivy's English
stemmer, the same the full-text channel uses, so both channels agree on what a word is.
"""

from __future__ import annotations

import re
import sys
import threading
from collections.abc import Iterable
from functools import lru_cache

# Question words that say nothing about which column is meant.
STOPWORDS = frozenset(
    """
a an and any are as at be been by did do does each for from give had has have how in is it its list
many most much name names no not of on or per show than that the their there these this those to
was were what when where which who whom whose with all find tell me please between more less least
""".split()
)

_CAMEL_1 = re.compile(r"([a-z0-9])([A-Z])")
_CAMEL_2 = re.compile(r"([A-Z]+)([A-Z][a-z])")
_ALPHA_DIGIT = re.compile(r"([A-Za-z])([0-9])")
_DIGIT_ALPHA = re.compile(r"([0-9])([A-Za-z])")
_SEPARATORS = re.compile(r"[_\-.\s/]+")
_WORD = re.compile(r"[A-Za-z]+")

_local = threading.local()


def _analyzer():  # -> tantivy.TextAnalyzer (one per thread: the analyzer is not shared safely)
    analyzer = getattr(_local, "analyzer", None)
    if analyzer is None:
        import tantivy

        analyzer = (
            tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.simple())
            .filter(tantivy.Filter.lowercase())
            .filter(tantivy.Filter.stemmer("english"))
            .build()
        )
        _local.analyzer = analyzer
    return analyzer


def split_identifier(name: str) -> str:
    """``AvgScrMath`` -> "Avg Scr Math", ``home_player_Y11`` -> "home player Y 11",
    ``NumGE1500`` -> "Num GE 1500"."""
    s = _CAMEL_1.sub(r"\1 \2", name)
    s = _CAMEL_2.sub(r"\1 \2", s)
    s = _ALPHA_DIGIT.sub(r"\1 \2", s)
    s = _DIGIT_ALPHA.sub(r"\1 \2", s)
    return _SEPARATORS.sub(" ", s).strip()


def stems(text: str) -> list[str]:
    """Lower-cased English stems of ``text`` without stopwords, in order."""
    return [t for t in _analyzer().analyze(text) if t not in STOPWORDS]


@lru_cache(maxsize=65536)
def _stem(word: str) -> str:
    out = _analyzer().analyze(word)
    return out[0] if out else word.lower()


def _is_abbreviation_of(short: str, word: str) -> bool:
    """``scr`` of "score", ``cnt`` of "count", ``avg`` of "average": same first letter and the
    letters in order."""
    if len(short) >= len(word) or short[0] != word[0]:
        return False
    it = iter(word)
    return all(ch in it for ch in short)


def expansions(tokens: Iterable[str], prose: str) -> list[str]:
    """Words of ``prose`` (a label or description) that short tokens of a name abbreviate."""
    words = [w.lower() for w in _WORD.findall(prose) if len(w) > 3]
    out: list[str] = []
    for tok in tokens:
        t = tok.lower()
        if not 2 <= len(t) <= 4 or not t.isalpha() or t in STOPWORDS:
            continue
        out.extend(w for w in words if _is_abbreviation_of(t, w))
    return list(dict.fromkeys(out))


@lru_cache(maxsize=1 << 16)
def name_stems(name: str, label: str | None = None, description: str | None = None) -> tuple[str, ...]:
    """The stems an entity's name stands for: its split name, its label, and the words of its label
    and description its short name parts abbreviate. Cached: a warehouse repeats its column names
    (``id``, ``created_at``) thousands of times, and the lexicon of 1,000 models asks ~40k names
    of which ~6k differ."""
    split = split_identifier(name)
    parts = [split, label or ""]
    prose = f"{label or ''} {description or ''}"
    if prose.strip():
        parts.extend(expansions(split.split(), prose))
    out: list[str] = []
    for part in parts:
        out.extend(stems(part))
    return tuple(sys.intern(s) for s in dict.fromkeys(out))
