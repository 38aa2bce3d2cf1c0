"""Reading SLayer's Mode-B expression language far enough to find the entities a formula names.

SLayer (1.4.1) lowers measure formulas, computed dimensions and order expressions through Python's
``ast`` after rewriting SQL spellings (``CASE WHEN``, ``count(distinct x)``, ``extract(p from x)``,
the legacy ``x:agg`` colon form, ``count(*)``). Which entities a formula tags depends on the *shape*
of that tree: an aggregation call tags only its aggregated source (keyword and further arguments are
opaque), a transform only its input, a scalar call every argument. This module is a small Pratt
parser producing the same shapes, plus the two textual helpers SLayer uses next to it: the regex
token scan of filters and the ``agg(column)`` split of a single entity reference.

It accepts and rejects roughly what SLayer accepts and rejects (a rejected formula becomes one opaque
token, as in SLayer), but its error messages are its own. Pure functions, no catalog access.
"""

from __future__ import annotations

import keyword
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import NoReturn

__all__ = [
    "Agg",
    "Lit",
    "ModeBError",
    "Node",
    "Op",
    "Ref",
    "Scalar",
    "Star",
    "Transform",
    "call_callee",
    "entity_tokens",
    "walk_refs",
    "filter_tokens",
    "formula_tokens",
    "functional_call_column",
    "parse",
    "split_agg_ref",
    "split_colon_suffix",
]

# Function-name vocabularies of SLayer 1.4.1 (what decides how a call is read).
BUILTIN_AGGREGATIONS = frozenset(
    {
        "avg",
        "corr",
        "count",
        "count_distinct",
        "count_distinct_approx",
        "covar_pop",
        "covar_samp",
        "first",
        "last",
        "max",
        "median",
        "min",
        "percentile",
        "stddev_pop",
        "stddev_samp",
        "sum",
        "var_pop",
        "var_samp",
        "weighted_avg",
    }
)
AGGREGATION_ALIASES = {
    "countd": "count_distinct",
    "countdistinct": "count_distinct",
    "approx_count_distinct": "count_distinct_approx",
    "countdistinctapprox": "count_distinct_approx",
    "stddev": "stddev_samp",
    "var": "var_samp",
    "variance": "var_samp",
}
TRANSFORMS = frozenset(
    {
        "change",
        "change_pct",
        "consecutive_periods",
        "cumsum",
        "dense_rank",
        "first",
        "lag",
        "last",
        "lead",
        "ntile",
        "percent_rank",
        "rank",
        "time_shift",
    }
)
SCALAR_FUNCTIONS = frozenset(
    {
        "abs",
        "ceil",
        "ceiling",
        "coalesce",
        "concat",
        "current_date",
        "date_add",
        "date_diff",
        "date_part",
        "exp",
        "floor",
        "greatest",
        "ifnull",
        "iif",
        "instr",
        "interval",
        "least",
        "length",
        "like",
        "ln",
        "log",
        "log10",
        "log2",
        "lower",
        "ltrim",
        "mod",
        "now",
        "nullif",
        "pow",
        "power",
        "replace",
        "round",
        "rtrim",
        "sign",
        "sqrt",
        "substr",
        "substring",
        "trim",
        "trunc",
        "upper",
    }
)
DATE_PART_ALIASES = frozenset(
    {
        "isodow",
        "day_of_week",
        "doy",
        "dayofyear",
        "day_of_year",
        "isoyear",
        "iso_year",
        "isoweek",
        "iso_week",
        "weekofyear",
        "dayofmonth",
        "day_of_month",
    }
)
GRANULARITY_NAMES = frozenset(
    {"second", "minute", "hour", "day", "week", "week_sunday", "month", "quarter", "year"}
)


class ModeBError(ValueError):
    """The text is not a Mode-B expression SLayer would accept."""


def normalize_aggregation_name(name: str) -> str:
    lowered = name.lower()
    candidate = AGGREGATION_ALIASES.get(lowered, lowered)
    return candidate if candidate in BUILTIN_AGGREGATIONS else name


# ----------------------------------------------------------------------------------------------- tree


@dataclass(frozen=True, slots=True)
class Ref:
    """A bare (``amount``) or dotted (``customers.city``) reference; ``count(m.*)`` ends in ``*``."""

    parts: tuple[str, ...]

    @property
    def text(self) -> str:
        return ".".join(self.parts)


@dataclass(frozen=True, slots=True)
class Star:
    """The bare ``*`` of ``count(*)``."""


@dataclass(frozen=True, slots=True)
class Lit:
    """A literal, a ``{variable}`` placeholder or a literal tuple: names nothing."""

    kind: str = "value"  # value | placeholder | tuple


@dataclass(frozen=True, slots=True)
class Seq:
    """A list/tuple keyword value (``partition_by=[a, b]``)."""

    items: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class Agg:
    source: Node
    name: str
    args: tuple[Node, ...] = ()
    kwargs: tuple[tuple[str, Node], ...] = ()


@dataclass(frozen=True, slots=True)
class Transform:
    name: str
    input: Node
    args: tuple[Node, ...] = ()
    kwargs: tuple[tuple[str, Node], ...] = ()


@dataclass(frozen=True, slots=True)
class Scalar:
    name: str
    args: tuple[Node, ...] = ()


@dataclass(frozen=True, slots=True)
class Op:
    """Arithmetic, comparison, boolean or unary operator; operands in source order."""

    op: str
    operands: tuple[Node, ...] = field(default=())


Node = Ref | Star | Lit | Seq | Agg | Transform | Scalar | Op
_AGG_SOURCE_KINDS = (Ref, Star, Scalar, Op)  # plus non-tuple literals


def _aggregatable(node: Node) -> bool:
    return isinstance(node, _AGG_SOURCE_KINDS) or (isinstance(node, Lit) and node.kind != "tuple")


def _source_leaves(node: Node) -> Iterator[Node]:
    if isinstance(node, Scalar):
        for a in node.args:
            yield from _source_leaves(a)
    elif isinstance(node, Op):
        for o in node.operands:
            yield from _source_leaves(o)
    else:
        yield node


def _contains_agg_or_transform(node: Node) -> bool:
    return any(isinstance(leaf, (Agg, Transform)) for leaf in _source_leaves(node))


# ------------------------------------------------------------------------------------------ tokenizer


@dataclass(frozen=True, slots=True)
class _Tok:
    kind: str  # NAME NUM STR OP COLAGG END
    value: str
    start: int
    colagg: tuple[tuple[str, ...], str] | None = None  # (source parts, agg) of a legacy ``x:agg``


_STR_RE = re.compile(r"'(?:\\.|[^'\\\n])*'|\"(?:\\.|[^\"\\\n])*\"")
_COLAGG_RE = re.compile(r"(\*|[a-zA-Z_]\w*(?:\.[a-zA-Z_]\w*)*(?:\.\*)?):([a-zA-Z_]\w*)")
_NUM_RE = re.compile(
    r"(?:0[xXoObB][0-9a-fA-F_]+|\d[\d_]*(?:\.[\d_]*)?(?:[eE][+-]?\d+)?|\.\d[\d_]*(?:[eE][+-]?\d+)?)([jJ])?"
)
_NAME_RE = re.compile(r"[^\W\d]\w*")
_OPS = ("**", "//", "==", "!=", "<=", ">=", "<>", "||", "<<", ">>")
_SQL_KEYWORDS = frozenset({"and", "or", "not", "is", "in"})


def _tokenize(text: str) -> list[_Tok]:
    toks: list[_Tok] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch.isspace():
            i += 1
            continue
        if ch in "'\"":
            m = _STR_RE.match(text, i)
            if m is None:
                raise ModeBError(f"unterminated string literal at offset {i}")
            toks.append(_Tok("STR", m.group(), i))
            i = m.end()
            continue
        prev = text[i - 1] if i else ""
        if not prev or not (prev.isalnum() or prev in "_."):
            m = _COLAGG_RE.match(text, i)
            if m is not None:
                src = m.group(1)
                parts = ("*",) if src == "*" else tuple(src.split("."))
                toks.append(_Tok("COLAGG", m.group(), i, (parts, m.group(2))))
                i = m.end()
                continue
        if ch.isdigit() or (ch == "." and i + 1 < n and text[i + 1].isdigit()):
            m = _NUM_RE.match(text, i)
            assert m is not None
            if m.group(1):
                raise ModeBError(f"unsupported literal {m.group()!r}")
            end = m.end()
            if end < n and (text[end].isalnum() or text[end] == "_"):
                raise ModeBError(f"invalid number near offset {i}")
            toks.append(_Tok("NUM", m.group(), i))
            i = end
            continue
        m = _NAME_RE.match(text, i)
        if m is not None:
            toks.append(_Tok("NAME", m.group(), i))
            i = m.end()
            continue
        two = text[i : i + 2]
        if two in _OPS:
            toks.append(_Tok("OP", two, i))
            i += 2
            continue
        toks.append(_Tok("OP", ch, i))
        i += 1
    toks.append(_Tok("END", "", n))
    return toks


# --------------------------------------------------------------------------------------------- parser


def _is_kw(tok: _Tok, word: str, sql: bool) -> bool:
    """``tok`` spells keyword ``word``: exactly in Python spelling, any ASCII case in SQL spelling."""
    if tok.kind != "NAME":
        return False
    if tok.value == word:
        return True
    return sql and tok.value.isascii() and tok.value.lower() == word


_CASE_WORDS = frozenset({"CASE", "WHEN", "THEN", "ELSE", "END"})


class _Parser:
    def __init__(self, text: str, sql: bool) -> None:
        self.text = text
        self.toks = _tokenize(text)
        for k, tok in enumerate(self.toks[:-1]):
            if (
                tok.kind == "NAME"
                and tok.value.isascii()
                and tok.value.lower() == "over"
                and self.toks[k + 1].value == "("
                and not (k and self.toks[k - 1].value == ".")
            ):
                raise ModeBError(
                    f"Invalid Mode-B expression {text!r}: raw OVER(...) is not allowed in Mode-B; "
                    f"use a transform instead (rank, percent_rank, dense_rank, ntile, cumsum, lag, "
                    f"lead, time_shift, ...)."
                )
        self.i = 0
        self.sql = sql
        self.tuple_ok_at = -1  # token index where a literal tuple may start (an ``in`` right-hand side)

    # -- helpers
    @property
    def tok(self) -> _Tok:
        return self.toks[self.i]

    def peek(self, k: int = 1) -> _Tok:
        return self.toks[min(self.i + k, len(self.toks) - 1)]

    def at_op(self, *values: str) -> bool:
        return self.tok.kind == "OP" and self.tok.value in values

    def expect_op(self, value: str) -> None:
        if not self.at_op(value):
            self.fail(f"expected {value!r}")
        self.i += 1

    def fail(self, why: str) -> NoReturn:
        """A syntax error at the current token."""
        tok = self.tok
        where = "end of input" if tok.kind == "END" else f"{tok.value!r} at offset {tok.start}"
        raise ModeBError(f"Invalid Mode-B expression {self.text!r}: {why} ({where}).")

    def refuse(self, why: str) -> NoReturn:
        """A well-formed construct Mode-B does not accept."""
        raise ModeBError(f"Invalid Mode-B expression {self.text!r}: {why}.")

    def case_word(self, tok: _Tok, k: int) -> str | None:
        """The CASE-grammar keyword ``tok`` (at absolute index ``k``) spells, if any."""
        if tok.kind != "NAME" or not tok.value.isascii() or tok.value.upper() not in _CASE_WORDS:
            return None
        before = self.toks[k - 1] if k else None
        if before is not None and before.kind == "OP" and before.value == ".":
            return None
        after = self.toks[k + 1] if k + 1 < len(self.toks) else None
        if after is not None and after.kind == "OP" and after.value == ".":
            return None
        return tok.value.upper()

    # -- grammar
    def parse(self) -> Node:
        if self.tok.kind == "END":
            raise ModeBError("Empty Mode-B expression.")
        node = self.expr()
        if self.tok.kind != "END":
            self.fail("unexpected token")
        return node

    def expr(self) -> Node:
        return self.or_expr()

    def or_expr(self) -> Node:
        node = self.and_expr()
        operands = [node]
        while _is_kw(self.tok, "or", self.sql):
            self.i += 1
            operands.append(self.and_expr())
        return node if len(operands) == 1 else Op("or", tuple(operands))

    def and_expr(self) -> Node:
        node = self.not_expr()
        operands = [node]
        while _is_kw(self.tok, "and", self.sql):
            self.i += 1
            operands.append(self.not_expr())
        return node if len(operands) == 1 else Op("and", tuple(operands))

    def not_expr(self) -> Node:
        if _is_kw(self.tok, "not", self.sql) and not (self.sql and _is_kw(self.peek(), "like", True)):
            self.i += 1
            return Op("not", (self.not_expr(),))
        return self.comparison()

    def cmp_op(self) -> str | None:
        tok = self.tok
        if tok.kind == "OP" and tok.value in ("<", ">", "==", ">=", "<=", "!="):
            return tok.value
        if self.sql and tok.kind == "OP" and tok.value in ("=", "<>"):
            return "==" if tok.value == "=" else "!="
        if _is_kw(tok, "in", self.sql):
            return "in"
        if _is_kw(tok, "is", self.sql):
            return "is not" if _is_kw(self.peek(), "not", self.sql) else "is"
        if _is_kw(tok, "not", self.sql) and _is_kw(self.peek(), "in", self.sql):
            return "not in"
        if self.sql and _is_kw(tok, "like", True):
            return "like"
        if self.sql and _is_kw(tok, "not", True) and _is_kw(self.peek(), "like", True):
            return "not like"
        return None

    def comparison(self) -> Node:
        left = self.bitor()
        op = self.cmp_op()
        if op is None:
            return left
        self.i += 2 if op in ("is not", "not in", "not like") else 1
        if op in ("like", "not like"):
            if self.tok.kind != "STR":
                self.fail("LIKE needs a quoted pattern")
            self.i += 1
            node: Node = Scalar("like", (left, Lit()))
            node = Op("not", (node,)) if op == "not like" else node
        else:
            if op in ("in", "not in"):
                self.tuple_ok_at = self.i
            right = self.bitor()
            if op in ("in", "not in"):
                self.check_in_rhs(right)
            node = Op(op, (left, right))
        if self.cmp_op() is not None:
            self.refuse("chained comparisons are not supported")
        return node

    def check_in_rhs(self, rhs: Node) -> None:
        if isinstance(rhs, Lit) and rhs.kind in ("value", "placeholder", "tuple"):
            return
        self.fail("the right-hand side of in / not in must be a literal tuple or a time-point string")

    def bitor(self) -> Node:
        node = self.arith()
        while self.at_op("|") or (self.sql and self.at_op("||")):
            self.i += 1
            node = Scalar("concat", (node, self.arith()))
        if self.at_op("&", "^", "<<", ">>", "||"):
            self.fail("unsupported binary operator")
        return node

    def arith(self) -> Node:
        node = self.term()
        while self.at_op("+", "-"):
            op = self.tok.value
            self.i += 1
            node = Op(op, (node, self.term()))
        return node

    def term(self) -> Node:
        node = self.factor()
        while self.at_op("*", "/", "//", "%", "@"):
            op = self.tok.value
            if op == "@":
                self.fail("unsupported binary operator")
            self.i += 1
            node = Op(op, (node, self.factor()))
        return node

    def factor(self) -> Node:
        if self.at_op("-"):
            self.i += 1
            return Op("neg", (self.factor(),))
        if self.at_op("+"):
            self.i += 1
            return self.factor()
        if self.at_op("~"):
            self.fail("unsupported unary operator")
        return self.power()

    def power(self) -> Node:
        node = self.primary()
        if self.at_op("**"):
            self.i += 1
            node = Op("**", (node, self.factor()))
        return node

    def primary(self) -> Node:
        tok = self.tok
        start = self.i
        if tok.kind == "NUM":
            self.i += 1
            node: Node | _Bad = Lit()
        elif tok.kind == "STR":
            while self.tok.kind == "STR":  # adjacent literals concatenate, as in Python
                self.i += 1
            node = Lit()
        elif tok.kind == "COLAGG":
            self.i += 1
            parts, agg = tok.colagg  # type: ignore[misc]
            source: Node = Star() if parts == ("*",) else Ref(parts)
            if self.at_op("("):
                args, kwargs = self.call_args(None)
                node = Agg(source, agg, args, kwargs)
            else:
                node = Agg(source, agg)
        elif tok.kind == "NAME":
            node = self.name_atom()
        elif self.at_op("("):
            node = self.paren()
        elif self.at_op("["):
            self.i += 1
            items = self.items("]")
            node = Lit("tuple") if items and all(_is_literal(x) for x in items) else _Bad("list")
        elif self.at_op("{"):
            if self.peek().kind == "NAME" and self.peek(2).kind == "OP" and self.peek(2).value == "}":
                self.i += 3
                node = Lit("placeholder")
            else:
                self.fail("unsupported set/dict literal")
        else:
            self.fail("unexpected token")
        if isinstance(node, _Bad):
            self.refuse(
                f"unsupported {node.what}; a tuple or list may only hold literals, on the right-hand side "
                f"of in / not in"
            )
        if isinstance(node, Lit) and node.kind == "tuple" and start != self.tuple_ok_at:
            self.fail("a literal tuple is only valid on the right-hand side of in / not in")
        if self.at_op("("):
            self.fail("function calls with non-name callee are not supported")
        if self.at_op("["):
            self.fail("subscripts are not supported")
        if self.at_op("."):
            self.fail("unsupported attribute base")
        return node

    def paren(self) -> Node | _Bad:
        self.i += 1
        if self.at_op(")"):
            self.i += 1
            return _Bad("empty tuple")
        first = self.expr()
        if self.at_op(")"):
            self.i += 1
            return first
        if not self.at_op(","):
            self.fail("expected ')'")
        self.i += 1
        rest = self.items(")")
        items = [first, *rest]
        if all(_is_literal(x) for x in items):
            return Lit("tuple")
        return _Bad("tuple")

    def items(self, close: str) -> list[Node]:
        out: list[Node] = []
        while not self.at_op(close):
            out.append(self.expr())
            if self.at_op(","):
                self.i += 1
            elif not self.at_op(close):
                self.fail(f"expected ',' or {close!r}")
        self.i += 1
        return out

    def name_atom(self) -> Node:
        tok = self.tok
        word = tok.value
        if word.startswith("__slayer_"):
            self.fail("the '__slayer_' identifier prefix is reserved")
        if word.isascii() and word.upper() == "CASE" and self.case_has_when():
            return self.case_expr()
        if word in ("True", "False", "None") or (
            word.lower() in ("true", "false", "null")
            and not (self.peek().kind == "OP" and self.peek().value in ".(")
        ):
            self.i += 1
            return Lit()
        if self.sql and word.isascii() and word.lower() in _SQL_KEYWORDS:
            self.fail("unexpected keyword")
        if keyword.iskeyword(word):
            self.fail("unexpected keyword")
        if word.isascii() and word.lower() == "extract" and self.is_extract():
            return self.extract_call()
        parts = [word]
        self.i += 1
        while self.at_op("."):
            nxt = self.peek()
            if nxt.kind == "OP" and nxt.value == "*":
                self.i += 2
                parts.append("*")
                break
            if nxt.kind != "NAME" or keyword.iskeyword(nxt.value):
                self.fail("expected a name after '.'")
            self.i += 2
            parts.append(nxt.value)
        if parts[-1] == "*":
            return Ref(tuple(parts))
        if self.at_op("("):
            if len(parts) == 1:
                return self.call(parts[0])
            return self.method_call(tuple(parts[:-1]), parts[-1])
        return Ref(tuple(parts))

    def case_has_when(self) -> bool:
        depth = 0
        for k in range(self.i + 1, len(self.toks)):
            tok = self.toks[k]
            if tok.kind == "OP" and tok.value in "([":
                depth += 1
            elif tok.kind == "OP" and tok.value in ")]":
                if depth == 0:
                    return False
                depth -= 1
            elif depth == 0:
                word = self.case_word(tok, k)
                if word is not None:
                    return word == "WHEN"
        return False

    def at_case_word(self, *words: str) -> bool:
        return self.case_word(self.tok, self.i) in words

    def case_expr(self) -> Node:
        self.i += 1  # CASE
        operand = None if self.at_case_word("WHEN") else self.expr()
        branches: list[tuple[Node, Node]] = []
        while self.at_case_word("WHEN"):
            self.i += 1
            if operand is None:
                saved, self.sql = self.sql, True
                cond = self.expr()
                self.sql = saved
            else:
                cond = Op("==", (operand, self.expr()))
            if not self.at_case_word("THEN"):
                self.fail("a WHEN branch is missing its THEN")
            self.i += 1
            branches.append((cond, self.expr()))
        otherwise: Node = Lit()
        if self.at_case_word("ELSE"):
            self.i += 1
            otherwise = self.expr()
        if not self.at_case_word("END"):
            self.fail("CASE is missing its END")
        self.i += 1
        if not branches:
            self.fail("CASE needs at least one WHEN ... THEN branch")
        node = otherwise
        for cond, then in reversed(branches):
            node = Scalar("iif", (cond, then, node))
        return node

    def is_extract(self) -> bool:
        return (
            self.peek().kind == "OP"
            and self.peek().value == "("
            and self.peek(2).kind in ("NAME", "STR")
            and self.peek(3).kind == "NAME"
            and self.peek(3).value.lower() == "from"
        )

    def extract_call(self) -> Node:
        self.i += 4  # extract ( part from
        operand = self.expr()
        self.expect_op(")")
        return Scalar("date_part", (Lit(), operand))

    def call_args(self, callee: str | None) -> tuple[tuple[Node, ...], tuple[tuple[str, Node], ...]]:
        """Parse ``( ... )``; ``callee`` None means an aggregation-like call (colon placeholder)."""
        self.expect_op("(")
        args: list[Node] = []
        kwargs: list[tuple[str, Node]] = []
        seen: set[str] = set()
        first = True
        while not self.at_op(")"):
            if (
                first
                and self.tok.kind == "NAME"
                and self.tok.value.isascii()
                and self.tok.value.lower() == "distinct"
                and not (self.peek().kind == "OP" and self.peek().value == ".")
            ):
                self.fail("DISTINCT is supported only as count(distinct x), i.e. count_distinct(x)")
            if first and self.at_op("*") and self.peek().kind == "OP" and self.peek().value in (",", ")"):
                self.i += 1
                args.append(Star())
            elif (
                self.tok.kind == "NAME"
                and self.peek().kind == "OP"
                and self.peek().value == "="
                and self.is_kwarg(callee, first)
            ):
                name = self.tok.value
                if name in seen:
                    self.refuse(f"keyword argument {name!r} repeated")
                seen.add(name)
                self.i += 2
                kwargs.append((name, self.kwarg_value()))
            else:
                if self.at_op("**"):
                    self.fail("dictionary unpacking is not supported in calls")
                if kwargs:
                    self.fail("positional argument follows keyword argument")
                args.append(self.expr())
            first = False
            if self.at_op(","):
                self.i += 1
            elif not self.at_op(")"):
                self.fail("expected ',' or ')'")
        self.i += 1
        return tuple(args), tuple(kwargs)

    def is_kwarg(self, callee: str | None, first: bool) -> bool:
        if not self.sql:
            return True
        if callee is not None and callee.lower() in SCALAR_FUNCTIONS:
            return False
        if callee is not None and callee in TRANSFORMS:
            return not first
        return True

    def kwarg_value(self) -> Node:
        if self.at_op("[") or (self.at_op("(") and self._paren_is_tuple()):
            close = "]" if self.at_op("[") else ")"
            self.i += 1
            return Seq(tuple(self.items(close)))
        return self.expr()

    def _paren_is_tuple(self) -> bool:
        depth = 0
        for k in range(self.i, len(self.toks)):
            tok = self.toks[k]
            if tok.kind == "OP" and tok.value in "([":
                depth += 1
            elif tok.kind == "OP" and tok.value in ")]":
                depth -= 1
                if depth == 0:
                    return k == self.i + 1  # ``()`` is the empty tuple
            elif depth == 1 and tok.kind == "OP" and tok.value == ",":
                return True
        return False

    def call(self, name: str) -> Node:
        callee = name
        if (
            name.isascii()
            and name.lower() == "count"
            and self.peek().kind == "NAME"
            and self.peek().value.isascii()
            and self.peek().value.lower() == "distinct"
            and not (self.peek(2).kind == "OP" and self.peek(2).value in (".", ",", ")"))
            and not (
                self.peek(2).kind == "OP"
                and self.peek(2).value == "*"
                and self.peek(3).kind == "OP"
                and self.peek(3).value in (",", ")")
            )
        ):
            del self.toks[self.i + 1]  # ``count(distinct x)`` is ``count_distinct(x)``
            callee = "count_distinct"
        args, kwargs = self.call_args(callee)
        return self.dispatch(callee, args, kwargs)

    def method_call(self, path: tuple[str, ...], name: str) -> Node:
        args, kwargs = self.call_args(name)
        lowered = name.lower()
        transform_only = name in TRANSFORMS and normalize_aggregation_name(name) not in BUILTIN_AGGREGATIONS
        reason = None
        if lowered in SCALAR_FUNCTIONS or lowered in DATE_PART_ALIASES or transform_only:
            reason = f"calls {name!r}, which is not an aggregation"
        elif not args:
            reason = "needs the aggregated value as its first argument"
        elif any(
            isinstance(leaf, (Agg, Transform)) or (isinstance(leaf, Ref) and len(leaf.parts) > 1)
            for leaf in _source_leaves(args[0])
        ):
            reason = "may read only bare column names of that path"
        elif any(k == "partition_by" for k, _ in kwargs):
            reason = "cannot take partition_by="
        elif not all(_is_literal(v) for v in (*args[1:], *(v for _, v in kwargs))):
            reason = "takes only literal further arguments"
        if reason is not None:
            self.refuse(f"the method call {'.'.join(path)}.{name}(...) {reason}")
        return self.dispatch(name, (_onto_path(args[0], path), *args[1:]), kwargs)

    def dispatch(self, name: str, args: tuple[Node, ...], kwargs: tuple[tuple[str, Node], ...]) -> Node:
        if normalize_aggregation_name(name) in BUILTIN_AGGREGATIONS:
            if not args:
                self.refuse(f"aggregation {name!r} requires a value argument")
            return Agg(args[0], name, args[1:], kwargs)
        stars = any(isinstance(v, Star) for v in (*args, *(v for _, v in kwargs)))
        if name in TRANSFORMS:
            if not args:
                self.refuse(f"transform {name!r} requires the value to transform")
            if stars:
                self.refuse(f"'*' is only valid as an aggregation source, not as an argument to {name!r}")
            return Transform(name, args[0], args[1:], kwargs)
        lowered = name.lower()
        if lowered in SCALAR_FUNCTIONS or lowered in DATE_PART_ALIASES:
            if kwargs:
                self.refuse(f"scalar function {name!r} does not accept keyword arguments")
            if stars:
                self.refuse(f"'*' is only valid as an aggregation source, not as an argument to {name!r}")
            if lowered in DATE_PART_ALIASES:
                if len(args) != 1:
                    self.refuse(f"date-part function {name!r} takes 1 argument")
                return Scalar("date_part", (Lit(), args[0]))
            return Scalar(lowered, args)
        if args and _aggregatable(args[0]) and not _contains_agg_or_transform(args[0]):
            return Agg(args[0], name, args[1:], kwargs)
        if args and any(isinstance(leaf, Agg) for leaf in _source_leaves(args[0])):
            return Agg(args[0], name, args[1:], kwargs)
        self.refuse(
            f"function {name!r} is not allowed in Mode B (not a scalar function, transform or "
            f"aggregation over a value)"
        )
        raise AssertionError  # unreachable


@dataclass(frozen=True, slots=True)
class _Bad:
    """A list or tuple the parser has read but refuses: only a tuple of literals is a value, and
    only where ``primary`` allows one."""

    what: str


def _is_literal(node: Node) -> bool:
    if isinstance(node, Op) and node.op == "neg":
        return isinstance(node.operands[0], Lit)
    return isinstance(node, Lit) and node.kind != "tuple"


def _onto_path(node: Node, path: tuple[str, ...]) -> Node:
    """``node`` with every column leaf (and ``*``) read under the join ``path``."""
    if isinstance(node, Ref):
        return Ref((*path, *node.parts))
    if isinstance(node, Star):
        return Ref((*path, "*"))
    if isinstance(node, Scalar):
        return Scalar(node.name, tuple(_onto_path(a, path) for a in node.args))
    if isinstance(node, Op):
        return Op(node.op, tuple(_onto_path(o, path) for o in node.operands))
    return node


def parse(text: str, *, sql: bool = False) -> Node:
    """Parse a formula; ``sql=True`` accepts the SQL operator spellings SLayer allows in filters."""
    if not text or not text.strip():
        raise ModeBError("Empty Mode-B expression.")
    return _Parser(text, sql).parse()


# ------------------------------------------------------------------------------------- entity tokens


def walk_refs(node: Node) -> Iterator[Ref | Agg]:
    """Reference-bearing nodes in source order: an aggregation whole, a transform's input only,
    scalar and operator operands; literals name nothing."""
    if isinstance(node, (Ref, Agg)):
        yield node
    elif isinstance(node, Transform):
        yield from walk_refs(node.input)
    elif isinstance(node, Scalar):
        for a in node.args:
            yield from walk_refs(a)
    elif isinstance(node, Op):
        for o in node.operands:
            yield from walk_refs(o)


def entity_tokens(node: Node) -> Iterator[str]:
    """The entity tokens of a parsed formula, as SLayer feeds them to its resolver: an aggregation
    over a column as ``col:agg`` (``*:count`` for ``count(*)``), over an expression as each operand
    reference; a plain reference as its text."""
    for item in walk_refs(node):
        if isinstance(item, Ref):
            yield item.text
            continue
        source = item.source
        if isinstance(source, Ref):
            yield f"{source.text}:{item.name}"
        elif isinstance(source, Star):
            yield f"*:{item.name}"
        else:
            for inner in walk_refs(source):
                if isinstance(inner, Ref):
                    yield inner.text


def formula_tokens(text: str) -> list[str]:
    """Entity tokens of a formula; an unparseable formula is one opaque token (SLayer does the same,
    and the resolver then reports it)."""
    try:
        return list(entity_tokens(parse(text)))
    except (ModeBError, RecursionError):
        return [text]


def split_colon_suffix(raw: str) -> tuple[str, str | None]:
    """``(prefix, suffix)`` at the first ``:`` outside parentheses (the legacy ``x:agg`` form)."""
    depth = 0
    for i, ch in enumerate(raw):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == ":" and depth == 0:
            return raw[:i], raw[i + 1 :]
    return raw, None


def split_agg_ref(raw: str) -> tuple[str, str | None]:
    """``(column text, aggregation name)`` of one entity reference: ``sum(orders.amount)`` and the
    legacy ``orders.amount:sum`` both give ``("orders.amount", "sum")``; text without a call is
    ``(raw, None)``. Raises ``ModeBError`` for anything but one aggregation over one column or ``*``."""
    prefix, suffix = split_colon_suffix(raw)
    if suffix is not None:
        return prefix, suffix.split("(", 1)[0]
    if "(" not in raw:
        return raw, None
    try:
        node = parse(raw)
    except RecursionError as exc:
        raise ModeBError(f"{raw!r} is nested too deeply") from exc
    if not isinstance(node, Agg) or not isinstance(node.source, (Ref, Star)):
        raise ModeBError(
            f"{raw!r} is not a single aggregated column reference; only the `agg(column)` "
            f"form names an entity."
        )
    return ("*" if isinstance(node.source, Star) else node.source.text), node.name


# ------------------------------------------------------------------------------------------ filters

_FILTER_AGG_SUFFIX = re.compile(r":\w+(?:\([^)]*\))?")
_FILTER_LITERAL = re.compile(r"'[^']*'|\"[^\"]*\"")
_FILTER_VARIABLE = re.compile(r"\{[^}]*\}")
_FILTER_TOKEN = re.compile(r"[a-zA-Z_]\w*(?:\.[a-zA-Z_]\w*)*")
FILTER_KEYWORDS = frozenset(
    {
        "and",
        "or",
        "not",
        "is",
        "null",
        "in",
        "like",
        "between",
        "true",
        "false",
        "case",
        "when",
        "then",
        "else",
        "end",
        "exists",
        "coalesce",
        "nullif",
        "cast",
        "ln",
        "log",
        "log2",
        "log10",
        "exp",
        "sqrt",
        "pow",
        "power",
        "abs",
        "round",
        "floor",
        "ceil",
        "ceiling",
        "current_date",
        "current_timestamp",
        "now",
    }
)


def filter_tokens(text: str) -> list[str]:
    """Identifier-shaped tokens of a filter, the way SLayer tags filters (a text scan, not a parse):
    ``:agg`` suffixes, quoted literals and ``{variables}`` are removed first; function names (a name
    followed directly by ``(``), SQL keywords and numbers are skipped."""
    cleaned = _FILTER_AGG_SUFFIX.sub("", text)
    cleaned = _FILTER_LITERAL.sub("", cleaned)
    cleaned = _FILTER_VARIABLE.sub("", cleaned)
    out: list[str] = []
    for m in _FILTER_TOKEN.finditer(cleaned):
        token = m.group(0)
        if cleaned[m.end() : m.end() + 1] == "(":
            continue
        if token.lower() in FILTER_KEYWORDS or token.replace(".", "").isdigit():
            continue
        out.append(token)
    return out


# ------------------------------------------------------------------------ functional time dimensions

_WHOLE_CALL = re.compile(r"^\s*([A-Za-z_]\w*)\s*\(.*\)\s*$", re.S)


def call_callee(entry: str) -> tuple[Node | None, str | None]:
    """``entry`` parsed (``None`` when it does not parse) and the callee of a whole-call text."""
    try:
        node: Node | None = parse(entry)
    except (ModeBError, RecursionError):
        node = None
    if isinstance(node, Agg):
        return node, node.name
    m = _WHOLE_CALL.match(entry)
    return node, (m.group(1) if m else None)


def functional_call_column(node: Node | None) -> str | None:
    """The column of a single-column call ``gran(col)``, else ``None``."""
    if isinstance(node, Agg) and not node.args and not node.kwargs and isinstance(node.source, Ref):
        return node.source.text
    return None
