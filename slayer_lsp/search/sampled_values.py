"""Values a question may name, and the shapes of values, matched to the columns that hold them.

Questions filter by values ("customers in LAM", "born in 1990", "played by Ahmed Samir Farag") far
more often than they name columns. A column's sampled values are indexed as normalised phrases; a
question's word n-grams are looked up among them. Where the value itself was not sampled, its
*shape* still points somewhere: a year points at date-like columns, a capitalised full name at
columns whose samples are capitalised names.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from slayer_lsp.search.name_stems import STOPWORDS

MAX_NGRAM = 4
_NON_WORD = re.compile(r"[^\w]+")
_YEAR = re.compile(r"\b(1[89]\d\d|20\d\d)\b")
_DATE_VALUE = re.compile(r"^(1[89]|20)\d\d([-/.]\d\d?([-/.]\d\d?)?)?(\b|T|$)")
# Two or more capitalised words not at the start of a sentence: a proper name.
_PROPER = re.compile(r"(?<![.?!:]\s)(?<!^)\b([A-Z][a-z]+(?:\s+[A-Z][a-z'-]+)+)")
_PROPER_VALUE = re.compile(r"^[A-Z][a-z]+(?:\s+[A-Z][a-z'-]+)+$")


def normalise(value: object) -> str:
    return _NON_WORD.sub(" ", str(value).lower()).strip()


def indexable(norm: str) -> bool:
    """Worth matching literally: not empty, not a stopword, not a small number (every numeric
    column holds 1, 2, 3)."""
    if len(norm) < 2 or norm in STOPWORDS:
        return False
    return not (norm.isdigit() and len(norm) < 4)


def value_terms(values: Iterable[object]) -> set[str]:
    return {n for v in values if indexable(n := normalise(v))}


def question_ngrams(question: str, max_n: int = MAX_NGRAM) -> set[str]:
    words = normalise(question).split()
    return {" ".join(words[i : i + n]) for n in range(1, max_n + 1) for i in range(len(words) - n + 1)}


def column_shapes(values: list[str], type_name: str | None) -> frozenset[str]:
    """What a column's values look like: "date" (dates, datetimes, years), "proper" (names)."""
    shapes = set()
    t = (type_name or "").upper()
    if (
        "DATE" in t
        or "TIME" in t
        or (values and sum(bool(_DATE_VALUE.match(v)) for v in values) >= 0.6 * len(values))
    ):
        shapes.add("date")
    if values and sum(bool(_PROPER_VALUE.match(v)) for v in values) >= 0.5 * len(values):
        shapes.add("proper")
    return frozenset(shapes)


def question_shapes(question: str) -> frozenset[str]:
    shapes = set()
    if _YEAR.search(question):
        shapes.add("date")
    if _PROPER.search(question):
        shapes.add("proper")
    return frozenset(shapes)
