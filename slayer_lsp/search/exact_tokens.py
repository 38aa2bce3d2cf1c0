"""Exact tokens: the distinctive strings of a question, recognised by their shape, matched literally.

A vector cannot represent an opaque code (``PROD-4471``, an order number, a uuid, a canonical id
``ds.model.col``) and BM25 splits it into pieces that also occur elsewhere. So such a token is
also looked up whole, case-insensitively, in a literal index, and what contains it is weighted
heavily. The extractor is deliberately conservative: on an ordinary question ("who do we chase
about an unpaid invoice?") it finds nothing and the literal channel stays silent, because matching
ordinary words literally only adds confident noise to a good ranking.

Shapes recognised (``ExactToken.shape``):

* ``memory``     ``memory:<id>``
* ``canonical``  a dotted identifier of 2-3 parts, one part longer than a letter (``jaffle.orders``)
* ``uuid``       8-4-4-4-12 hex
* ``date``       ISO dates ``2024-01-15`` / ``2024-01`` / ``2020-03-24T12:00:00``
* ``email``      ``name@host.tld``
* ``code``       letters and digits in one token, 4+ characters (``PROD-4471``, ``SKU123``,
                 ``INV-2024-0012``, ``0x1F3A``), or an upper-case hyphenated code (``PROD-XL``);
                 ordinals (``2nd``), quantities with a unit (``24h``, ``3.5GHz``), quarters and
                 halves (``Q3``, ``H1``) and fiscal years (``FY2024``) are not codes
* ``number``     digits only: 5+ digits that are not a round thousand (``88123``), a ``#``-number
                 (``#4471``), digits after an id word or ``No.`` (``order 4471``, ``invoice no. 912``, ``No.667467``), or
                 digit groups with hyphens holding 5+ digits (``555-0199``); never decimals,
                 years or amounts
* ``identifier`` ``snake_case`` or ``lowerCamelCase`` names (``order_total``, ``customerId``)
* ``quoted``     text in double quotes or backticks (1-60 characters)

A *whole token* is a run of word characters joined by ``-``, ``.``, ``:`` or ``@`` (a trailing
dot is punctuation, not part of it). ``LiteralIndex`` indexes every whole token of a document and,
for compound tokens, their parts, so ``PROD-4471`` matches ``PROD-4471`` only (not ``PROD-4471-B``)
while a keyword ``amount`` still matches ``orders.amount``. A term of several tokens (a quoted
phrase, a multi-word keyword) matches where those tokens appear consecutively in one part.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from slayer_lsp.catalog.ids import MEMORY_PREFIX, is_memory_ref, split_canonical
from slayer_lsp.catalog.layered import LayeredMap
from slayer_lsp.texts.words import TOKEN_RE

# A whole token: word characters joined by connectors (no leading/trailing connector).
_CONNECTOR = re.compile(r"[-.:@]")

_ORDINAL = re.compile(r"\d+(?:st|nd|rd|th)", re.I)
_UNITS = (
    "k|m|bn|b|t|kg|g|mg|km|cm|mm|ms|s|sec|secs|h|hr|hrs|min|mins|d|w|wk|wks|y|yr|yrs|am|pm|x|"
    "px|pt|kb|mb|gb|tb|hz|khz|mhz|ghz|kw|kwh|mw|v|mah|ml|l|lb|lbs|oz|ft|mph|kph|pc|pcs|"
    "usd|eur|gbp|jpy|p|fps|dpi|c|f"
)
_QUANTITY = re.compile(rf"\d+(?:[.,]\d+)?(?:{_UNITS})", re.I)
_PERIOD = re.compile(r"(?:q[1-4]|h[12]|fy\d{2,4}|\d{2,4}q[1-4]|q[1-4]fy\d{2,4})", re.I)
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.I)
_DATE = re.compile(r"\d{4}-\d{2}(?:-\d{2}(?:[Tt]\d{2}(?::\d{2}){1,2}(?:\.\d+)?)?)?")
_EMAIL = re.compile(r"[\w.-]+@\w+(?:[-.]\w+)*\.[a-z]{2,}", re.I)
_DOTTED = re.compile(r"[A-Za-z_][\w-]*(?:\.[A-Za-z_][\w-]*){1,2}")
_UPPER_CODE = re.compile(r"[A-Z0-9]+(?:-[A-Z0-9]+)+")
_LOWER_CAMEL = re.compile(r"[a-z]+(?:[A-Z][a-z0-9]*)+")
_HASH_NUMBER = re.compile(r"#\s?(\d{2,})\b")
_ID_WORDS = (
    "order|invoice|ticket|case|po|sku|id|account|customer|item|product|batch|lot|shipment|"
    "tracking|ref|reference|contract|claim|request|incident|transaction|booking|reservation|"
    "policy|serial"
)
_LABELLED_NUMBER = re.compile(
    rf"\b(?:(?:{_ID_WORDS})\b\s*(?:#|no\.?|num\.?|number|id)?\s*:?|(?:no|nr|num)\.)\s*(\d{{3,}})\b", re.I
)
_LABEL_PREFIX = re.compile(r"(?:no|nr|num|id|ref)[.:]\d+", re.I)  # "No.667467": the digits are the token
_YEAR = re.compile(r"(?:19|20)\d{2}")
_QUOTED = re.compile(r"\"([^\"\n]{1,60})\"|“([^”\n]{1,60})”|`([^`\n]{1,60})`")


@dataclass(frozen=True, slots=True)
class ExactToken:
    """A distinctive string of a question: its text (as written) and the shape that made it one."""

    text: str
    shape: str


def tokens_of(text: str) -> list[str]:
    """The whole tokens of a text, case-folded, in order."""
    return [t.casefold() for t in TOKEN_RE.findall(text)]


def shape_of(tok: str) -> str | None:
    """The distinctive shape of one whole token, or None for an ordinary word or number."""
    low = tok.casefold()
    if is_memory_ref(low) and len(tok) > len(MEMORY_PREFIX):
        return "memory"
    if _UUID.fullmatch(tok):
        return "uuid"
    if _DATE.fullmatch(tok):
        return "date"
    if "@" in tok:
        return "email" if _EMAIL.fullmatch(tok) else None
    if _DOTTED.fullmatch(tok):
        parts = split_canonical(tok)  # two or three, as the pattern says
        return (
            "canonical" if any(p is not None and len(p) > 1 for p in parts) else None
        )  # e.g / i.e / U.S: not ids
    alnum = _CONNECTOR.sub("", tok)
    has_digit = any(c.isdigit() for c in alnum)
    has_alpha = any(c.isalpha() for c in alnum)
    if has_digit and has_alpha:
        if _LABEL_PREFIX.fullmatch(tok):
            return None
        if len(alnum) < 4 or _ORDINAL.fullmatch(tok) or _QUANTITY.fullmatch(tok) or _PERIOD.fullmatch(tok):
            return None
        return "code"
    if has_digit:  # digits only (maybe grouped by hyphens or dots)
        if "." in tok or ":" in tok:  # decimals, versions, times
            return None
        digits = alnum
        if "-" in tok:
            return "number" if len(digits) >= 5 else None
        if len(digits) >= 5 and not digits.endswith("000"):
            return "number"
        return None
    if "_" in tok.strip("_") and any(c.isalpha() for c in tok):
        return "identifier"
    if _LOWER_CAMEL.fullmatch(tok) and len(tok) >= 5:
        return "identifier"
    if _UPPER_CODE.fullmatch(tok) and len(alnum) >= 5 and any(len(p) > 1 for p in tok.split("-")):
        return "code"
    return None


def extract_tokens(question: str | None) -> list[ExactToken]:
    """The distinctive tokens of a question in order of first appearance (deduplicated
    case-insensitively); empty for an ordinary question."""
    if not question:
        return []
    found: list[tuple[int, ExactToken]] = []
    for m in _QUOTED.finditer(question):
        inner = next(g for g in m.groups() if g is not None).strip()
        if inner and TOKEN_RE.search(inner):
            found.append((m.start(), ExactToken(inner, "quoted")))
    for m in _HASH_NUMBER.finditer(question):
        found.append((m.start(1), ExactToken(m.group(1), "number")))
    for m in _LABELLED_NUMBER.finditer(question):
        if not _YEAR.fullmatch(m.group(1)):  # "orders 2023" is a year, not an order number
            found.append((m.start(1), ExactToken(m.group(1), "number")))
    for m in TOKEN_RE.finditer(question):
        shape = shape_of(m.group())
        if shape is not None:
            found.append((m.start(), ExactToken(m.group(), shape)))
    found.sort(key=lambda pt: pt[0])
    out: list[ExactToken] = []
    seen: set[str] = set()
    for _, tok in found:
        key = tok.text.casefold()
        if key not in seen:
            seen.add(key)
            out.append(tok)
    return out


# --------------------------------------------------------------------------- the literal index


_NO_DOCS: dict[str, set[int]] = {}


def _index_terms(text: str) -> set[str]:
    """What a part is findable by: each whole token, and each part of a compound token."""
    terms: set[str] = set()
    for tok in tokens_of(text):
        terms.add(tok)
        if _CONNECTOR.search(tok):
            terms.update(p for p in _CONNECTOR.split(tok) if p)
    return terms


def _contains_run(tokens: Sequence[str], run: Sequence[str]) -> bool:
    n = len(run)
    return any(list(tokens[i : i + n]) == list(run) for i in range(len(tokens) - n + 1))


class LiteralIndex:
    """Whole-token, case-insensitive lookup over documents made of numbered parts (a memory's
    pieces, or an entity's rendered text as one part). A value: ``replaced`` makes the next one
    and shares the unchanged postings with it, so a snapshot that holds this one never sees a
    later change; ``replace`` rebinds this one, for an owner that shares it with no one.

    Both maps are ``LayeredMap``s, and a term's postings (doc id -> part numbers) are a dict that is
    never changed once published: a change copies the postings of the terms it touches. A map of
    maps (``immutables``) cost a persistent insert per (term, document) pair: 1,000,000 of them,
    seconds, for the first build at 20,000 memories."""

    def __init__(self, docs: Iterable[tuple[str, Sequence[str]]] = ()) -> None:
        # term -> doc id -> part numbers holding it (sets never changed once published); doc id -> its parts
        self._postings: LayeredMap[dict[str, set[int]]] = LayeredMap()
        self._parts: LayeredMap[tuple[str, ...]] = LayeredMap()
        self.replace((), docs)

    @classmethod
    def from_rendered(cls, docs: Iterable) -> LiteralIndex:  # Iterable[render.RenderedDoc]
        """An index over rendered entity documents (one part each), keyed by canonical id."""
        return cls((doc.canonical, (doc.text,)) for doc in docs)

    def replace_rendered(self, removals: Iterable[str], docs: Iterable) -> None:
        """``replace`` for rendered documents, as ``FullTextIndex.replace`` takes them."""
        self.replace(removals, ((doc.canonical, (doc.text,)) for doc in docs))

    def __len__(self) -> int:
        return len(self._parts)

    def __contains__(self, doc_id: str) -> bool:
        return doc_id in self._parts

    def replaced(self, removals: Iterable[str], docs: Iterable[tuple[str, Sequence[str]]]) -> LiteralIndex:
        """The next index: this one with some documents dropped and others added or replaced
        (this one is left as it was)."""
        out = LiteralIndex.__new__(LiteralIndex)
        out._postings, out._parts = self._postings, self._parts
        out.replace(removals, docs)
        return out

    def replace(self, removals: Iterable[str], docs: Iterable[tuple[str, Sequence[str]]]) -> None:
        """Drop some documents and add or replace others (rebinds this index's maps in one step)."""
        changes: dict[str, tuple[str, ...] | None] = {doc_id: None for doc_id in removals}
        for doc_id, texts in docs:
            changes[doc_id] = tuple(texts)
        if not changes:
            return
        gone: dict[str, set[str]] = {}  # term -> doc ids to drop from its postings
        added: dict[str, dict[str, set[int]]] = {}  # term -> doc id -> part numbers
        parts_map = self._parts.mutate()
        for doc_id, new in changes.items():
            old = parts_map.pop(doc_id, None)
            if old is not None:
                for text in old:
                    for term in _index_terms(text):
                        gone.setdefault(term, set()).add(doc_id)
            if new is not None:
                parts_map[doc_id] = new
                for n, text in enumerate(new):
                    for term in _index_terms(text):
                        added.setdefault(term, {}).setdefault(doc_id, set()).add(n)
        postings = self._postings.mutate()
        for term in gone.keys() | added.keys():
            before, leaving, joining = postings.get(term), gone.get(term), added.get(term)
            if before is None and joining is not None:
                docs_map = joining  # new here: made above, owned by no one else
            else:
                docs_map = dict(before) if before else {}  # a copy: an older index may read ``before``
                for doc_id in leaving or ():
                    docs_map.pop(doc_id, None)
                if joining:
                    docs_map.update(joining)
            if docs_map:
                postings[term] = docs_map
            else:
                postings.pop(term, None)
        self._postings, self._parts = postings.finish(), parts_map.finish()

    def lookup(self, term: str, allow: Iterable[str] | None = None) -> dict[str, tuple[int, ...]]:
        """Documents (restricted to ``allow`` when given) holding ``term`` as whole tokens -> the
        numbers of the parts that hold it. A term of several tokens must appear consecutively."""
        run = tokens_of(term)
        if not run:
            return {}
        postings, all_parts = self._postings, self._parts  # one consistent pair
        first = postings.get(run[0], _NO_DOCS)
        allowed = None if allow is None else (allow if isinstance(allow, (set, frozenset)) else set(allow))
        cands = {d: set(p) for d, p in first.items() if allowed is None or d in allowed}
        for tok in run[1:]:
            if not cands:
                break
            more = postings.get(tok, _NO_DOCS)
            cands = {d: p & more[d] for d, p in cands.items() if d in more and p & more[d]}
        out: dict[str, tuple[int, ...]] = {}
        for doc_id, nums in cands.items():
            parts = all_parts[doc_id]
            keep = tuple(sorted(n for n in nums if len(run) == 1 or _contains_run(tokens_of(parts[n]), run)))
            if keep:
                out[doc_id] = keep
        return out

    def ids(self, term: str, allow: Iterable[str] | None = None) -> frozenset[str]:
        """The documents holding ``term`` (what the entity side needs)."""
        return frozenset(self.lookup(term, allow))
