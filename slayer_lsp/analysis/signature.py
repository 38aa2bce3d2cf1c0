"""Signature help inside an aggregation call: ``sum(``, ``weighted_avg(``, ``percentile(`` and the
source model's custom aggregations, with their parameters and defaults.

The built-ins' parameters are SLayer 1.4.1's (``weighted_avg`` needs ``weight``; ``corr`` and the
covariances ``other``; ``percentile`` folds its second positional value onto ``p``; ``first`` and
``last`` take the ranking column second). A custom aggregation's parameters are its declared
``params``, each with its SQL default; its first argument is the ``{value}`` it aggregates.
"""

from __future__ import annotations

from dataclasses import dataclass

from slayer_lsp.analysis import parsed_file as dm
from slayer_lsp.analysis.binding import context_id, stage_source
from slayer_lsp.catalog import Catalog
from slayer_lsp.query import formulas

FORMULA_ROLES = frozenset(
    {dm.DIMENSION, dm.TIME_DIMENSION, dm.MEASURE, dm.FILTER, dm.ORDER, dm.MODEL_FORMULA}
)

# name -> (parameters after the value, each (label, documentation)), summary
_BUILTIN: dict[str, tuple[tuple[tuple[str, str], ...], str]] = {
    "sum": ((), "Sum of the values."),
    "avg": ((), "Arithmetic mean of the values."),
    "min": ((), "Smallest value."),
    "max": ((), "Largest value."),
    "count": ((), "Number of non-null values; count(*) counts rows."),
    "count_distinct": ((), "Number of distinct values."),
    "count_distinct_approx": ((), "Approximate number of distinct values."),
    "median": ((), "Median (50th percentile) of the values."),
    "stddev_samp": ((), "Sample standard deviation."),
    "stddev_pop": ((), "Population standard deviation."),
    "var_samp": ((), "Sample variance."),
    "var_pop": ((), "Population variance."),
    "weighted_avg": (
        (("weight", "required: the column each value is weighted by"),),
        "Average of the values weighted by another column.",
    ),
    "percentile": (
        (("p", "required: the fraction, between 0 and 1 (percentile(x, 0.9) is p=0.9)"),),
        "Continuous percentile of the values.",
    ),
    "corr": ((("other", "required: the second column"),), "Correlation coefficient of two columns."),
    "covar_samp": ((("other", "required: the second column"),), "Sample covariance of two columns."),
    "covar_pop": ((("other", "required: the second column"),), "Population covariance of two columns."),
    "first": (
        (("by", "optional: the column that orders the rows (default: the time dimension)"),),
        "Value of the first row in each group.",
    ),
    "last": (
        (("by", "optional: the column that orders the rows (default: the time dimension)"),),
        "Value of the last row in each group.",
    ),
}
assert set(_BUILTIN) == formulas.BUILTIN_AGGREGATIONS


@dataclass(frozen=True, slots=True)
class SignatureData:
    label: str
    documentation: str | None
    parameters: tuple[tuple[str, str | None], ...]  # (label as written in ``label``, documentation)
    active_parameter: int


def open_call(text: str) -> tuple[str, int] | None:
    """The innermost unclosed call left of the end of ``text``: (callee, index of the argument being
    typed), or None. Quotes are skipped; a keyword argument ``name=`` names its parameter."""
    depth_commas: list[tuple[int, int]] = []  # (position of "(", commas so far)
    quote: str | None = None  # only "'" (SQL strings)
    for i, ch in enumerate(text):
        if quote:
            if ch == quote:
                quote = None
            continue
        if ch == "'" and depth_commas:  # a SQL string inside the call (a YAML or JSON quote is not one)
            quote = ch
        elif ch == "(":
            depth_commas.append((i, 0))
        elif ch == ")":
            if depth_commas:
                depth_commas.pop()
        elif ch == "," and depth_commas:
            pos, n = depth_commas[-1]
            depth_commas[-1] = (pos, n + 1)
    if not depth_commas:
        return None
    pos, commas = depth_commas[-1]
    head = text[:pos].rstrip()
    j = len(head)
    while j > 0 and (head[j - 1].isalnum() or head[j - 1] == "_"):
        j -= 1
    callee = head[j:]
    if not callee or callee[0].isdigit():
        return None
    return callee, commas


def _aggregation(catalog: Catalog, model: str | None, name: str):  # -> d.Aggregation | None
    if model is None:
        return None
    ent = catalog.get(f"{model}.{name}")
    return ent.obj if ent is not None and ent.kind == "aggregation" else None


def signature_at(doc: dm.ParsedDocument, line: int, col: int, catalog: Catalog) -> SignatureData | None:
    lines = doc.lines
    if line >= len(lines):
        return None
    typed_end = len(lines[line][:col].rstrip())  # "sum(x, |" : a plain scalar ends before the blank
    ctx = dm.context_at(doc, line, typed_end)
    if ctx is None or ctx.role not in FORMULA_ROLES:
        return None
    found = open_call(lines[line][:col])
    if found is None:
        return None
    callee, arg = found
    model: str | None
    if doc.kind == "model":
        model = doc.model_id
    else:
        stage = doc.stages[ctx.stage] if ctx.stage is not None and ctx.stage < len(doc.stages) else None
        source = stage_source(stage, catalog)[0] if stage is not None else None
        model = context_id(source)
    typed = lines[line][:col]
    kw = _keyword_being_typed(typed)
    custom = _aggregation(catalog, model, callee)
    if custom is not None:
        params = [("value", "the expression aggregated ({value})")]
        params += [
            (f"{p.name}={p.sql}" if p.sql is not None else p.name, f"parameter {{{p.name}}}")
            for p in custom.params
        ]
        label = f"{callee}({', '.join(p for p, _ in params)})"
        doc_text = custom.description or (f"custom aggregation: {custom.formula}" if custom.formula else None)
        names = ["value", *(p.name for p in custom.params)]
    else:
        norm = formulas.normalize_aggregation_name(callee)
        if norm not in _BUILTIN:
            return None
        extra, summary = _BUILTIN[norm]
        params = [("value", "the column or expression aggregated"), *extra]
        label = f"{callee}({', '.join(p for p, _ in params)})"
        doc_text = summary
        names = [p for p, _ in params]
    active = names.index(kw) if kw in names else min(arg, len(params) - 1)
    return SignatureData(label, doc_text, tuple(params), active)


def _keyword_being_typed(typed: str) -> str | None:
    """``weighted_avg(amount, weight=qu`` -> "weight"."""
    tail = typed.rsplit(",", 1)[-1] if "," in typed else typed.rsplit("(", 1)[-1]
    if "=" not in tail:
        return None
    name = tail.split("=", 1)[0].strip()
    return name if name.isidentifier() else None
