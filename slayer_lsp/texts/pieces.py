"""Memory pieces: a memory is matched by its small pieces and answered by its whole text.

To be *found*, text must be short and specific (a long note scores as the average of everything it
says); to be *useful*, an answer must be whole. So each memory's prose (its learning, then its
description unless the learning already says it; the example query is JSON, not prose, and the
tags are not prose either) is cut into pieces of about one sentence, with no overlap: the whole
memory is always one step away, and repeated text would only make neighbouring pieces harder to
tell apart. A piece is an index entry (``search/piece_index.py``) and a vector, never a result.

``split_pieces`` cuts text at line structure first (blank lines, bullets, numbered items,
headings, table rows, fenced code), then at sentence ends (``. ! ?`` and ``;`` followed by a
space), leaving abbreviations (``e.g.``, ``Dr.``, initials), decimals (``3.5``) and canonical ids
(``ds.model.col``) whole; fragments of fewer than three words (a title, "Yes.", "Notes:") join
the next piece, and a sentence longer than ``MAX_PIECE_CHARS`` is cut at a comma, colon or dash
near the bound (else at a space). Splitting takes time linear in the text's length whatever its
shape (a megabyte of dots, of abbreviations or of one token): no pattern backtracks over a run, and
no step copies the rest of the text.
"""

from __future__ import annotations

import re

from slayer_lsp.store import documents as d
from slayer_lsp.texts.words import TOKEN_RE

MAX_PIECE_CHARS = 300
MIN_PIECE_WORDS = 3

ABBREVIATIONS = frozenset(
    """
a.m p.m e.g i.e cf vs viz al approx appr incl excl est no nr nos num fig figs eq ref refs dept div ca
corp inc ltd co bros mr mrs ms dr prof st mt jr sr sgt capt gov jan feb apr jun jul aug sep sept oct
nov dec mon tue tues wed thu thur thurs fri u.s u.k u.n e.u a.k.a vol eds pp para sec ch
""".split()
)

_BULLET = re.compile(
    r"^\s*(?:[-*+\u2022\u2023\u25e6\u2043\u2219]|\d{1,3}[.)]|[a-z][.)](?=\s)|[A-Z]\)(?=\s))\s+"
)  # "J. Smith" is a name
_HEADING = re.compile(r"^\s{0,3}#{1,6}\s+")
_TABLE_RULE = re.compile(r"[\s:|-]+")  # a stripped line of only these (one quantifier: linear)
_FENCE = re.compile(r"\s*+(?:```|~~~)")
# A candidate sentence end: a whole run of terminal punctuation (never a match starting inside a
# run, so a run of a million dots is scanned once) or ";", closing quotes/brackets, then
# whitespace and the next visible character (captured: what follows decides the boundary).
_END = re.compile(r"(?:(?<![.!?\u2026])[.!?\u2026]++|;)[\"'\u201d\u2019)\]]*+(?=\s++(\S))")
_WORD_CHARS = re.compile(r"[\w.]")
_LONGEST_ABBREVIATION = 16  # a longer run before a period is no abbreviation: the scan back stops there
_SOFT_BREAK = re.compile(r"(?:[,:]\s|\s[-\u2013\u2014]\s|\s\()")


# --------------------------------------------------------------------------- splitting


def _blocks(text: str) -> list[tuple[bool, str]]:
    """(is code, text) runs that belong together, split at line structure: soft-wrapped prose
    lines are joined with a space; fenced code keeps its lines."""
    blocks: list[tuple[bool, str]] = []
    current: list[str] = []
    code: list[str] | None = None  # inside a fence

    def flush() -> None:
        if current:
            blocks.append((False, " ".join(" ".join(current).split())))
            current.clear()

    for raw in text.splitlines():
        if _FENCE.match(raw):
            if code is None:
                flush()
                code = []
            else:
                if code:
                    blocks.append((True, "\n".join(code)))
                code = None
            continue
        if code is not None:
            if raw.strip():
                code.append(raw.strip())
            continue
        line = raw.strip()
        if not line or (_TABLE_RULE.fullmatch(line) and "-" in line):
            flush()
            continue
        if len(line) >= 2 and line[0] == "|" and line[-1] == "|":  # a table row
            flush()
            blocks.append((False, " ".join(c.strip() for c in line.strip("|").split("|") if c.strip())))
            continue
        marker = _BULLET.match(line) or _HEADING.match(line)
        if marker:
            flush()
            line = line[marker.end() :].strip()
            if not line:
                continue
        elif current and _looks_like_title(current[-1]) and line[:1].isupper():
            flush()  # "Payment terms" on its own line, then a sentence
        current.append(line)
    if code:
        blocks.append((True, "\n".join(code)))  # an unclosed fence runs to the end
    flush()
    return blocks


def _looks_like_title(line: str) -> bool:
    return len(line) < 40 and not line.endswith((".", "!", "?", ":", ";", ",")) and line[:1].isupper()


def _is_boundary(block: str, start: int, end: int, nxt: str) -> bool:
    """Whether the punctuation at ``block[start:end]`` really ends a sentence; ``nxt`` is the
    first visible character after it. Constant work per candidate (no slice of the block)."""
    punct = block[start:end]
    if punct.startswith(";"):
        return True
    if nxt.islower():
        return False  # "approx. three", "e.g. this", "No. of orders" stay together
    if punct.rstrip("\"'\u201d\u2019)]") == ".":
        word = _word_before(block, start)
        if word and (word in ABBREVIATIONS or (len(word) == 1 and word.isalpha())):
            return False  # an abbreviation or an initial ("J. Smith")
    return True


def _word_before(block: str, dot: int) -> str:
    """The run of word characters and periods just before the period at ``dot``, case-folded
    ("e.g" before "e.g."); empty when there is none or it is too long to be an abbreviation."""
    i = dot
    low = max(dot - _LONGEST_ABBREVIATION - 1, 0)
    while i > low and _WORD_CHARS.match(block, i - 1):
        i -= 1
    if i == low and i > 0 and _WORD_CHARS.match(block, i - 1):
        return ""  # longer than any abbreviation
    return block[i:dot].casefold()


def _sentences(block: str) -> list[str]:
    out: list[str] = []
    last = 0
    for m in _END.finditer(block):
        if _is_boundary(block, m.start(), m.end(), m.group(1)):
            out.append(block[last : m.end()].strip())
            last = m.end()
    out.append(block[last:].strip())
    return [s for s in out if s]


def _words(text: str) -> int:
    return len(TOKEN_RE.findall(text))


def _merge_short(sentences: list[str]) -> list[str]:
    """Fragments of fewer than MIN_PIECE_WORDS words join the next sentence (the last joins the
    previous one), so "Yes." or "Note:" never stands alone."""
    out: list[str] = []
    carry: list[str] = []  # joined once: a long run of word-less fragments stays linear
    carried = 0  # words in ``carry`` (tokens never span the space that joins two fragments)
    for s in sentences:
        n = _words(s)
        if carried + n < MIN_PIECE_WORDS:
            carry.append(s)
            carried += n
            continue
        out.append(" ".join([*carry, s]).strip() if carry else s)
        carry, carried = [], 0
    if carry:
        rest = " ".join(carry)
        if out:
            out[-1] = f"{out[-1]} {rest}"
        else:
            out.append(rest)
    return out


def _bounded(sentence: str, limit: int = MAX_PIECE_CHARS) -> list[str]:
    """A sentence cut into parts of at most ``limit`` characters: at the last comma, colon, dash
    or bracket in the second half of the window, else at the last space, else hard."""
    out: list[str] = []
    sentence = sentence.strip()
    pos, end = 0, len(sentence)  # the rest is sentence[pos:end]: never copied whole (linear)
    while end - pos > limit:
        window = sentence[pos : pos + limit + 1]
        cut = -1
        for m in _SOFT_BREAK.finditer(window):
            if m.start() >= limit // 2:
                cut = m.start() + (1 if window[m.start()] in ",:" else 0)
        if cut < 0:
            cut = window.rfind(" ", limit // 2)
        if cut <= 0:
            cut = limit
        out.append(window[:cut].strip())
        pos += cut
        while pos < end and sentence[pos].isspace():
            pos += 1
    if pos < end:
        out.append(sentence[pos:end])
    return [p for p in out if p]


def split_pieces(text: str | None) -> list[str]:
    """Cut prose into pieces of about one sentence, in order, covering the text without overlap
    (whitespace normalised, list markers dropped). A fragment of fewer than MIN_PIECE_WORDS words
    (a title line, "Yes.", "Notes:") joins the piece after it."""
    if not text or not text.strip():
        return []
    units: list[str] = []
    for is_code, block in _blocks(text):
        if is_code:  # lines packed up to the bound, never cut at a period
            units.extend(_pack_lines(block.split("\n")))
        else:
            units.extend(_sentences(block))
    return [p for unit in _merge_short(units) for p in _bounded(unit)]


def _pack_lines(lines: list[str], limit: int = MAX_PIECE_CHARS) -> list[str]:
    out: list[str] = []
    for line in lines:
        if out and len(out[-1]) + 1 + len(line) <= limit:
            out[-1] = f"{out[-1]}\n{line}"
        else:
            out.extend(_bounded(line, limit))
    return out


def _norm(text: str) -> str:
    return " ".join(text.split()).casefold()


def piece_texts(memory: d.Memory) -> list[str]:
    """A memory's pieces, numbered by position: the learning's, then the description's unless
    the learning already holds the description; a piece repeated verbatim is kept once. The same
    list numbers the dense piece vectors (``memory:<id>#<n>``). Each text is read up to
    ``MAX_LEARNING_CHARS`` (the limit of what the writer accepts)."""
    learning = (memory.learning or "")[: d.MAX_LEARNING_CHARS]  # a longer one (not ours) is indexed this far
    pieces = split_pieces(learning)
    desc = (memory.description or "")[: d.MAX_LEARNING_CHARS]
    if desc.strip() and _norm(desc) not in _norm(learning):
        pieces.extend(split_pieces(desc))
    out: list[str] = []
    seen: set[str] = set()
    for p in pieces:
        key = _norm(p)
        if key not in seen:
            seen.add(key)
            out.append(p)
    return out
