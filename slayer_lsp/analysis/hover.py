"""Hover: a short Markdown card for the entity under the cursor, or the reason it does not resolve.

User text (descriptions, learnings, labels, sample values) is escaped so that it cannot inject
Markdown or HTML; sample values are shown as the JSON array SLayer's search text holds. The card is
cut at ``max_chars`` on a section boundary, with a note saying so. A hidden model or column gets no card
from a query or a memory (``hides``): like search and completion, hover does not reach it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from slayer_lsp.analysis import parsed_file as dm
from slayer_lsp.analysis.binding import bind_ref
from slayer_lsp.catalog import Catalog
from slayer_lsp.catalog.ids import name_of
from slayer_lsp.store import documents as d

DEFAULT_MAX_CHARS = 4000
LIST_LIMIT = 40  # names listed per section of a model or datasource card


@dataclass(frozen=True, slots=True)
class HoverData:
    markdown: str
    span: dm.Span | None = None
    canonical: str | None = None


_MD_SPECIAL = re.compile(r"([\\`*_\[\]#|~])")


# Characters that act on the reader's display instead of showing: C0 and C1 controls (but tab and
# newline), DEL, and the bidirectional overrides and isolates that reorder what is shown.
_INVISIBLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def visible(text: str) -> str:
    """``text`` with its line breaks as ``\\n`` and each control or bidi character shown as its code
    (``\\u202e``), so that it can neither recolour a terminal nor reorder a hover."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return _INVISIBLE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def escape(text: str) -> str:
    """Plain text safe inside Markdown: controls made visible, HTML neutralised, Markdown punctuation
    backslashed, leading indentation dropped (no code block) and a leading list, heading or setext
    marker (``-``, ``+``, ``=``, ``1.``, ``1)``) kept literal."""
    text = visible(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    text = _MD_SPECIAL.sub(r"\\\1", text)
    text = re.sub(r"(?m)^[ \t]+", "", text)
    text = re.sub(r"(?m)^([-+=])", r"\\\1", text)
    return re.sub(r"(?m)^(\d+)([.)])", r"\1\\\2", text)


def code(text: str) -> str:
    """An inline code span that survives backticks in ``text``. Line breaks become spaces (a code span
    shows them so anyway), so that a blank line cannot end the span and start a block."""
    text = visible(text).replace("\n", " ")
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def block(text: str, lang: str = "") -> str:
    text = visible(text)
    longest = max((len(m) for m in re.findall(r"`{3,}", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{lang}\n{text}\n{fence}"


def paragraphs(text: str) -> str:
    """Escaped user text with its line structure kept (a single newline would otherwise join lines)."""
    return "  \n".join(escape(line) for line in text.strip().splitlines())


def _cap(sections: list[str], max_chars: int) -> str:
    out: list[str] = []
    used = 0
    for i, sec in enumerate(sections):
        sep = 2 if out else 0
        if used + sep + len(sec) <= max_chars:
            out.append(sec)
            used += sep + len(sec)
            continue
        room = max_chars - used - sep - 40
        if room > 80 and not sec.startswith("```"):
            cut = sec[:room]
            cut = cut[: cut.rfind(" ")] if " " in cut[room // 2 :] else cut
            cut = cut.rstrip("\\")
            out.append(cut + " …")
        out.append(f"*… cut at {max_chars} characters ({len(sections) - i} more section(s))*")
        break
    return "\n\n".join(out)


def _names(items: list[str], limit: int = LIST_LIMIT) -> str:
    shown = ", ".join(code(x) for x in items[:limit])
    if len(items) > limit:
        shown += f" … and {len(items) - limit} more"
    return shown


def entity_markdown(
    catalog: Catalog, canonical: str, *, warnings: tuple[str, ...] = (), max_chars: int = DEFAULT_MAX_CHARS
) -> str | None:
    ent = catalog.get(canonical)
    if ent is None:
        return None
    obj = ent.obj
    head = f"**{ent.kind}** {code(canonical)}"
    secs: list[str] = []
    if isinstance(obj, d.Column):
        head += f" · {code(obj.type)}" + (" · primary key" if obj.primary_key else "")
        secs.append(head + (" · *hidden*" if ent.hidden else ""))
        if obj.label:
            secs.append(f"**Label:** {escape(obj.label)}")
        if obj.description:
            secs.append(paragraphs(obj.description))
        facts = []
        if obj.format is not None:
            facts.append(f"**Format:** {escape(obj.format.words())}")
        if obj.sql and obj.sql != obj.name:
            facts.append(f"**SQL:** {code(obj.sql)}")
        if obj.allowed_aggregations:
            facts.append("**Allowed aggregations:** " + ", ".join(code(a) for a in obj.allowed_aggregations))
        if obj.filter:
            facts.append(f"**Filter:** {code(obj.filter)}")
        if facts:
            secs.append("  \n".join(facts))
        if obj.sampled_values:
            secs.append("**Sample values:** " + code(json.dumps(obj.sampled_values, ensure_ascii=False)))
        elif obj.sampled:
            secs.append(f"**Sample values:** {escape(obj.sampled)}")
        if obj.distinct_count is not None:
            secs.append(f"**Distinct count:** {obj.distinct_count}")
    elif isinstance(obj, d.Measure):
        secs.append(head + (" · *hidden*" if ent.hidden else ""))
        if obj.label:
            secs.append(f"**Label:** {escape(obj.label)}")
        secs.append(f"**Formula:** {code(obj.formula)}")
        if obj.description:
            secs.append(paragraphs(obj.description))
    elif isinstance(obj, d.Aggregation):
        secs.append(head)
        if obj.formula:
            secs.append(f"**Formula:** {code(obj.formula)}")
        if obj.params:
            secs.append("**Params:** " + ", ".join(code(f"{p.name}={p.sql}") for p in obj.params))
        if obj.description:
            secs.append(paragraphs(obj.description))
    elif isinstance(obj, d.Model):
        secs.append(head + (" · *hidden*" if ent.hidden else ""))
        if obj.description:
            secs.append(paragraphs(obj.description))
        if obj.sql_table:
            secs.append(f"**Table:** {code(obj.sql_table)}")
        cols = [f"{c.name} {c.type}" for c in obj.columns if not c.hidden]
        if cols:
            secs.append(f"**Columns ({len(cols)}):** " + _names(cols))
        meas = [m.name for m in obj.measures if m.name]
        if meas:
            secs.append("**Measures:** " + _names(meas))
        if obj.aggregations:
            secs.append("**Aggregations:** " + _names([a.name for a in obj.aggregations]))
        if obj.joins:
            joins = []
            for j in obj.joins:
                pairs = ", ".join(f"{here} = {j.target_model}.{there}" for here, there in j.key_pairs)
                name = f"{j.name} → " if j.name and j.name != j.target_model else ""
                joins.append(
                    f"- {escape(name)}{code(j.target_model)}"
                    + (f" on {code(pairs)}" if pairs else "")
                    + (f" ({escape(j.cardinality)})" if j.cardinality else "")
                )
            secs.append("**Joins:**\n" + "\n".join(joins[:LIST_LIMIT]))
        if obj.filters:
            secs.append("**Filters:** " + "; ".join(code(f) for f in obj.filters))
    elif isinstance(obj, d.Datasource):
        secs.append(head + (f" · {escape(obj.type)}" if obj.type else ""))
        if obj.description:
            secs.append(paragraphs(obj.description))
        models = [
            name_of(c)
            for c in catalog.children(canonical)
            if (m := catalog.models.get(c)) is not None and not m.hidden
        ]
        if models:
            secs.append(f"**Models ({len(models)}):** " + _names(models))
    elif isinstance(obj, d.Memory):
        secs.append(head + (f" · {escape(obj.created_at)}" if obj.created_at else ""))
        if obj.description:
            secs.append(f"*{escape(obj.description)}*")
        if obj.learning.strip():
            secs.append(paragraphs(obj.learning))
        if obj.entities:
            valid = catalog.valid_canonicals
            tags = [code(t) if t in valid else f"~~{code(t)}~~ *(stale)*" for t in obj.entities]
            secs.append("**Tags:** " + ", ".join(tags))
        if obj.query is not None:
            shown = {k: v for k, v in obj.query.items() if v not in (None, [], {}, False)}
            secs.append(
                "**Attached query:**\n" + block(json.dumps(shown, indent=1, ensure_ascii=False), "json")
            )
    for w in warnings:
        secs.append(f"⚠ {escape(w)}")
    return _cap(secs, max_chars)


def hover(
    doc: dm.ParsedDocument, line: int, col: int, catalog: Catalog, max_chars: int = DEFAULT_MAX_CHARS
) -> HoverData | None:
    """The card for the reference at a position (code points), or None when there is none."""
    ref = doc.ref_at(line, col)
    if ref is None:
        return None
    b = bind_ref(doc, ref, catalog)
    if b.skipped:
        if b.note and ref.role != dm.FUNCTION:
            return HoverData(f"{code(ref.text)}: {escape(b.note)}", ref.span)
        return None
    if b.canonical is None:
        title = (
            "Ambiguous reference"
            if b.ambiguous
            else ("Stale tag" if ref.role == dm.ENTITY_TAG else "Unknown reference")
        )
        text = f"**{title}** {code(ref.text)}\n\n{escape(b.error or 'it does not resolve')}"
        if b.warnings:
            text += "\n\n" + "\n\n".join(f"⚠ {escape(w)}" for w in b.warnings)
        return HoverData(_cap([text], max_chars), ref.span)
    if hides(catalog, b.canonical, ref.role):
        return None
    md = entity_markdown(catalog, b.canonical, warnings=b.warnings, max_chars=max_chars)
    if md is None:
        return None
    return HoverData(md, ref.span, b.canonical)


# Roles of a model file's own text: its author sees hidden columns there anyway.
MODEL_FILE_ROLES = frozenset({dm.DEFINITION, dm.JOIN_TARGET, dm.JOIN_KEY, dm.MODEL_FORMULA})


def hides(catalog: Catalog, canonical: str, role: str) -> bool:
    """A hidden model or column stays unreachable from queries and memories (as in search and
    completion): no card, no definition. Diagnostics still name it (``hidden-entity``)."""
    ent = catalog.get(canonical)
    return ent is not None and ent.hidden and role not in MODEL_FILE_ROLES
