"""What a page of the dashboard's schedule asks and gets: filters, an order, a cursor.

Keyset pagination: a page is the ``limit`` copies after the previous page's last one in
its order, so its cost does not grow with the number pending; the cursor is that last
copy's place, opaque to its users (:mod:`.store` answers the questions).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, cast

from ..core.clock import ms_of_datetime
from ..core.durations import parse_time_or_duration
from ..core.journal.records import JournalRecord

__all__ = [
    "BUCKETS",
    "PAGE_SIZES",
    "CursorError",
    "Order",
    "Page",
    "PageQuery",
    "Place",
    "cursor",
    "parse_cursor",
    "place",
    "query_of",
    "time_ms",
]

Order = Literal["soonest", "newest"]
"""``soonest``: earliest due first. ``newest``: most recently published first."""

BUCKETS: tuple[tuple[str, int | None], ...] = (
    ("minute", 60_000),
    ("hour", 3_600_000),
    ("day", 86_400_000),
    ("month", 30 * 86_400_000),
    ("later", None),
)
"""The due-time chart's buckets, each up to its span from now (a month is 30 days);
each counts what falls due after the previous bucket's end, so they add up to all."""

PAGE_SIZES = (20, 50, 100, 500)
"""The page sizes the Scheduled page offers."""

Place = tuple[int, str] | tuple[int, str, int]
"""A copy's place in an order: (due, id) soonest first; (-published, id, due) newest."""


class CursorError(ValueError):
    """A page cursor this schedule did not give for this order (hand-edited, or stale
    from another order): start again from the first page."""


@dataclass(frozen=True)
class PageQuery:
    """What one page shows: filters (all optional, combined), an order, where to go on.

    ``due_from_ms`` is inclusive and ``due_to_ms`` exclusive; copies already due are
    never listed (pending means due after ``now_ms``). ``after`` is the ``next_cursor``
    of the page before, with the same filters and order.
    """

    destination: str | None = None
    key: str | None = None
    message_id: str | None = None
    due_from_ms: int | None = None
    due_to_ms: int | None = None
    order: Order = "soonest"
    after: str | None = None
    limit: int = 50

    @property
    def first_soonest(self) -> bool:
        """The first page of everything, soonest first: what ``scheduled list --limit``
        answers, and so a page shown before the store is read (:mod:`.schedule`)."""
        filters = (self.destination, self.key, self.message_id, self.due_from_ms, self.due_to_ms)
        return self.order == "soonest" and self.after is None and filters == (None,) * 5


def time_ms(text: str | None, what: str) -> int | None:
    """An ISO 8601 time with a timezone, or a duration from now (10m), in Unix ms: read
    as ``scheduled list --due-before`` reads it; ValueError naming the field."""
    return None if text is None else ms_of_datetime(parse_time_or_duration(text, what))


def query_of(params: Mapping[str, str]) -> PageQuery:
    """The page a URL's query asks for (``/scheduled?destination=...``); ValueError
    naming a field out of range."""

    def text(name: str) -> str | None:
        value = params.get(name, "").strip()
        return value or None

    limit = int(params.get("limit", "50") or 50)
    if not 1 <= limit <= 1000:
        raise ValueError(f"limit must be from 1 to 1000, got {limit}")
    order = params.get("order", "soonest")
    if order not in ("soonest", "newest"):
        raise ValueError(f"order must be soonest or newest, got {order!r}")
    return PageQuery(
        destination=text("destination"),
        key=text("key"),
        message_id=text("id"),
        due_from_ms=time_ms(text("due_from"), "due_from"),
        due_to_ms=time_ms(text("due_to"), "due_to"),
        order=cast(Order, order),
        after=text("after"),
        limit=limit,
    )


@dataclass(frozen=True)
class Page:
    """``rows`` in order; ``next_cursor`` None on the last page; ``total`` how many
    copies match the query's filters, across all pages."""

    rows: tuple[JournalRecord, ...]
    next_cursor: str | None
    total: int


def place(record: JournalRecord, order: Order) -> Place:
    """The copy's sort key in ``order``."""
    if order == "soonest":
        return (record.due_at_ms, record.message_id)
    return (-record.recorded_at_ms, record.message_id, record.due_at_ms)


def cursor(at: Place) -> str:
    """Opaque to its users; the id goes last, so a dot in it needs no escape."""
    if len(at) == 2:
        return f"s.{at[0]}.{at[1]}"
    return f"n.{at[0]}.{at[2]}.{at[1]}"


def parse_cursor(text: str | None, order: Order) -> Place | None:
    if text is None:
        return None
    try:
        if order == "soonest" and text.startswith("s."):
            due, message_id = text[2:].split(".", 1)
            return (int(due), message_id)
        if order == "newest" and text.startswith("n."):
            published, due, message_id = text[2:].split(".", 2)
            return (int(published), message_id, int(due))
    except ValueError:
        pass
    raise CursorError(
        f"the page cursor {text[:60]!r} is not one this schedule gave for {order}-first "
        "pages: start again from the first page (no cursor)"
    )
