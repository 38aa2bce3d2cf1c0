"""Recency: between equally good matches, the newer memory wins.

A corrected fact and the fact it corrects are about the same subject and phrased alike, so nothing
but age can separate them. Age is a tie-breaker, never a sort: the adjustment is a factor on a
memory's fused score that is gentle (at most ``EPSILON`` = 1 %) and saturating (it grows with the
logarithm of age and stops growing after ``HORIZON_DAYS``, five years)::

    s(age)      = min(1, ln(1 + age / 1 day) / ln(1 + 5 years / 1 day))
    factor(age) = 1 - EPSILON * s(age)                       (age in days, 1 year = 365.25 days)

    age         s(age)   factor
    0 (now)     0.000    1.00000
    1 day       0.092    0.99908
    1 week      0.277    0.99723
    1 month     0.459    0.99541
    1 year      0.786    0.99214
    2 years     0.878    0.99122
    5+ years    1.000    0.99000    (10 years and 11 years: the same)

So last week against last year is a real difference (0.51 %), ten years against eleven is none.
Two matches can swap places only when their fused scores are less than 1 % apart (``a < b``
becomes ``a·fa > b·fb`` only if ``b / a < fa / fb <= 1 / 0.99``); a much better old match always
beats a barely relevant new one. Each ranking channel gives scores within 1 % of each other the
same rank before fusion, so "equally good" survives rank fusion and this factor decides it.

``created_at`` is ISO 8601 text as SLayer writes it; a missing or unparseable value gets no
adjustment (factor 1), a naive value is read as UTC, and a date in the future counts as age 0.

Ages are counted from midnight UTC of today, so an answer does not drift by the second;
``SLAYER_LSP_TODAY`` (an ISO date) pins that day, for answers that must not drift at all (golden
files, the protocol's examples, a benchmark replayed later).
"""

from __future__ import annotations

import math
import os
from datetime import UTC, date, datetime
from functools import lru_cache

EPSILON = 0.01
HORIZON_DAYS = 5 * 365.25
SCALE_DAYS = 1.0
_LOG_HORIZON = math.log1p(HORIZON_DAYS / SCALE_DAYS)
TODAY_ENV = "SLAYER_LSP_TODAY"


def today() -> datetime:
    """Midnight UTC of the day ages are counted from: ``$SLAYER_LSP_TODAY`` when it is an ISO date,
    else today. A value that is not a date is ignored (the clock is a tie-breaker; it never fails a
    search)."""
    pinned = os.environ.get(TODAY_ENV)
    if pinned:
        day = _pinned_day(pinned)
        if day is not None:
            return day
    return datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


@lru_cache(maxsize=4)
def _pinned_day(text: str) -> datetime | None:
    try:
        day = date.fromisoformat(text.strip()[:10])
    except ValueError:
        return None
    return datetime(day.year, day.month, day.day, tzinfo=UTC)


def parse_created_at(value: object) -> datetime | None:
    """A stored ``created_at`` as an aware datetime (naive values read as UTC), else None."""
    if isinstance(value, str):
        return _parse_text(value)
    if isinstance(value, datetime):
        return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
    return None


@lru_cache(maxsize=65536)  # every search re-reads the same stamps
def _parse_text(value: str) -> datetime | None:
    if value.strip():
        text = value.strip()
        if text[-1:] in ("Z", "z"):
            text = text[:-1] + "+00:00"
        try:
            stamp = datetime.fromisoformat(text)
        except ValueError:
            return None
        return stamp if stamp.tzinfo is not None else stamp.replace(tzinfo=UTC)
    return None


def age_days(created_at: object, now: datetime) -> float | None:
    """Days between ``created_at`` and ``now`` (0 for a future stamp); None when unknown."""
    stamp = parse_created_at(created_at)
    if stamp is None:
        return None
    if now.tzinfo is None:
        now = now.replace(tzinfo=UTC)
    return max(0.0, (now - stamp).total_seconds() / 86400.0)


def staleness(days: float) -> float:
    """s(age) of the curve above: 0 for brand new, 1 from HORIZON_DAYS on."""
    return min(1.0, math.log1p(max(0.0, days) / SCALE_DAYS) / _LOG_HORIZON)


def recency_factor(created_at: object, now: datetime) -> float:
    """The multiplicative factor in [1 - EPSILON, 1] for a memory created at ``created_at``."""
    if isinstance(created_at, str):
        return _text_factor(created_at, now)
    return _factor(created_at, now)


@lru_cache(maxsize=65536)  # a search weighs a few hundred memories, the same ones again and again
def _text_factor(created_at: str, now: datetime) -> float:
    return _factor(created_at, now)


def _factor(created_at: object, now: datetime) -> float:
    days = age_days(created_at, now)
    return 1.0 if days is None else 1.0 - EPSILON * staleness(days)
