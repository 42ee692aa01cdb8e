"""The schedule, indexed for paging: the first page of a million pending, fast.

``scheduled list`` folds the whole journal into a :class:`~.journal.view.ScheduleView` and
sorts what is pending: right for one command, too slow for a dashboard that answers
"the next 50" on every click (the sort alone costs seconds at 1,000,000 pending).
:class:`ScheduleIndex` keeps that same view and, beside it, every pending copy in sorted
lists per destination, in the two orders a page asks for. A page is a bisect and a walk
of ``limit`` rows (keyset pagination: the cursor is the last row's sort key), so its
cost does not grow with the number pending; counts per destination and per due window
are bisects too.

What is pending is the view's decision, never re-derived here: after each record the
index asks the view (its copies, :meth:`~.journal.view.ScheduleView.is_cancelled`,
:meth:`~.journal.view.ScheduleView.hidden`) about the copies that record can have changed
(its id's, and a replaced key's previous message's), before and after, and moves only
those. So a page lists exactly what :meth:`~.journal.view.ScheduleView.pending` would, in the
same order (the unit tests check it on random journals).

Pure: no I/O. :mod:`rmqdelay.amqp.schedule_index_follow` feeds it from the stream.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from sortedcontainers import SortedList

from .journal.records import JournalRecord
from .journal.view import ScheduleView

__all__ = [
    "BUCKETS",
    "SORT_CHUNK",
    "CursorError",
    "Order",
    "Page",
    "PageQuery",
    "ScheduleIndex",
    "Sorted",
    "Taken",
    "sort_taken",
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

_COPY_KINDS = frozenset(("scheduled", "rescheduled"))
"""The kinds whose due time can be a copy of their id (see ``ScheduleView._move``)."""

_Soonest = tuple[int, str]
"""(due, id): a copy's place in soonest-first order (a copy is its id and due time)."""
_Newest = tuple[int, str, int]
"""(-published, id, due): its place in newest-first order."""


class CursorError(ValueError):
    """A page cursor this index did not give for this order (hand-edited, or stale
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


@dataclass(frozen=True)
class Page:
    """``rows`` in order; ``next_cursor`` None on the last page; ``total`` how many
    copies match the query's filters, across all pages."""

    rows: tuple[JournalRecord, ...]
    next_cursor: str | None
    total: int


@dataclass
class _Lists:
    """One destination's pending copies, in both orders.

    Copies added go to ``added`` first and into the sorted lists at the next question
    or removal: a fold of a million records then sorts once (``SortedList.update``)
    instead of inserting a million times, about three times the work.
    """

    soonest: SortedList = field(default_factory=SortedList)
    newest: SortedList = field(default_factory=SortedList)
    added: list[tuple[_Soonest, _Newest]] = field(default_factory=list)

    def settle(self) -> None:
        if self.added:
            added, self.added = self.added, []
            self.soonest.update([place for place, _ in added])
            self.newest.update([place for _, place in added])


Taken = dict[str, list[tuple[_Soonest, _Newest]]]
"""Per destination, copies added but not sorted yet (:meth:`ScheduleIndex.take_unsorted`)."""
Sorted = dict[str, tuple[SortedList, SortedList]]
"""Per destination, those copies sorted in both orders (:func:`sort_taken`)."""

SORT_CHUNK = 20_000
""":func:`sort_taken` sorts this many at a time, then merges: one sort of a million
would hold the interpreter's lock for a second, away from the thread serving pages."""


def sort_taken(taken: Taken) -> Sorted:
    """Sort what :meth:`ScheduleIndex.take_unsorted` took, touching nothing else (for a
    worker thread): chunks sorted, then merged, so the lock is let go often."""
    out: Sorted = {}
    for name, pairs in taken.items():
        lists = []
        for which in (0, 1):
            places = [pair[which] for pair in pairs]
            chunks = [sorted(places[i : i + SORT_CHUNK]) for i in range(0, len(places), SORT_CHUNK)]
            merged = list(heapq.merge(*chunks))
            lists.append(SortedList(merged))  # its sort of sorted input: one linear pass
        out[name] = (lists[0], lists[1])
    return out


@dataclass
class ScheduleIndex:
    """A :class:`~.journal.view.ScheduleView` with its pending copies sorted for pages."""

    view: ScheduleView = field(default_factory=ScheduleView)
    _lists: dict[str, _Lists] = field(default_factory=dict, repr=False)
    _records: dict[str, JournalRecord | tuple[JournalRecord, ...]] = field(
        default_factory=dict, repr=False
    )
    """Per id, every record read for it, in journal order (one record alone, the usual
    case, is held without a tuple): its history, and the due times its copies can have."""
    _by_key: dict[str, set[str]] = field(default_factory=dict, repr=False)
    """Per key, the ids recorded with it (a key holds a few messages: one per generation)."""
    _gone: set[tuple[str, _Soonest, _Newest]] | None = field(default=None, repr=False)
    """While a batch taken is being sorted, the copies removed meanwhile (it may hold them)."""

    # ------------------------------------------------------------------ the fold

    def add(self, record: JournalRecord) -> None:
        """Fold one record as the view does, and move the copies it changed."""
        if record.kind == "marker":
            return
        message_id = record.message_id
        held = self._records.get(message_id)
        if held is None and record.kind == "scheduled" and record.key is None:
            # the usual record, an id never seen: nothing to compare with
            self._records[message_id] = record
            self.view.add(record)
            if (message_id, record.due_at_ms) in self.view.copies:
                self._insert(message_id, record.due_at_ms, record)
            return
        affected = [message_id]
        if record.kind == "scheduled" and record.key is not None:
            self._by_key.setdefault(record.key, set()).add(message_id)
            current = self.view.keys.current(record.key)
            if current is not None and current.message_id != message_id:
                affected.append(current.message_id)  # a replace can supersede it
        if held is None:
            self._records[message_id] = record
        elif isinstance(held, tuple):
            self._records[message_id] = (*held, record)
        else:
            self._records[message_id] = (held, record)
        before = [self._live(i) for i in affected]
        self.view.add(record)
        for message_id, was in zip(affected, before, strict=True):
            now = self._live(message_id)
            for due, old in was.items():
                if now.get(due) is not old:
                    self._remove(message_id, due, old)
            for due, new in now.items():
                if was.get(due) is not new:
                    self._insert(message_id, due, new)

    def extend(self, records: Iterable[JournalRecord]) -> ScheduleIndex:
        for record in records:
            self.add(record)
        return self

    def settle(self) -> None:
        """Sort what was added since the last question now, not in the next question
        (after a first read of the journal: a million copies take seconds to sort)."""
        self._names(None)

    def forget_due(self, now_ms: int) -> int:
        """Drop copies due at or before ``now_ms`` from the sorted lists (never listed
        again: pending means due later), so newest-first pages need not step over
        them; their history stays. Returns how many were dropped."""
        dropped = 0
        for name in self._names(None):
            lists = self._lists[name]
            end = lists.soonest.bisect_left((now_ms + 1, ""))
            for due, message_id in list(lists.soonest.islice(0, end)):
                record = self.view.copies[message_id, due]
                lists.newest.remove((-record.recorded_at_ms, message_id, due))
            del lists.soonest[:end]
            dropped += end
        return dropped

    def _live(self, message_id: str) -> dict[int, JournalRecord]:
        """The id's copies the view counts as pending, whatever their due time."""
        view = self.view
        live: dict[int, JournalRecord] = {}
        for due in self._dues(message_id):
            record = view.copies.get((message_id, due))
            if record is None or view.is_cancelled(message_id, due):
                continue
            if record.key is not None and view.hidden(record):
                continue
            live[due] = record
        return live

    def _dues(self, message_id: str) -> set[int]:
        held = self._records.get(message_id)
        if held is None:
            return set()
        if not isinstance(held, tuple):
            return {held.due_at_ms} if held.kind in _COPY_KINDS else set()
        return {r.due_at_ms for r in held if r.kind in _COPY_KINDS}

    def _insert(self, message_id: str, due: int, record: JournalRecord) -> None:
        lists = self._lists.get(record.destination)
        if lists is None:
            lists = self._lists[record.destination] = _Lists()
        lists.added.append(((due, message_id), (-record.recorded_at_ms, message_id, due)))

    def _remove(self, message_id: str, due: int, record: JournalRecord) -> None:
        lists = self._lists[record.destination]
        lists.settle()
        newest = (-record.recorded_at_ms, message_id, due)
        lists.soonest.discard((due, message_id))  # forget_due may have taken it
        lists.newest.discard(newest)
        if self._gone is not None:
            self._gone.add((record.destination, (due, message_id), newest))

    # ------------------------------------------------------------------ sorting aside

    def unsorted(self) -> int:
        """Copies added since the last question, not sorted yet."""
        return sum(len(lists.added) for lists in self._lists.values())

    def take_unsorted(self) -> Taken:
        """Hand the copies not sorted yet to :func:`sort_taken` (in a worker thread),
        then to :meth:`put_sorted`; until then pages would miss them: ask none. The
        fold goes on meanwhile, and a copy it removes is kept out of what comes back."""
        if self._gone is not None:
            raise RuntimeError("a batch taken is still being sorted")
        taken: Taken = {}
        for name, lists in self._lists.items():
            if lists.added:
                taken[name], lists.added = lists.added, []
        self._gone = set()
        return taken

    def put_sorted(self, done: Sorted) -> None:
        """Take back what :func:`sort_taken` sorted, with what came meanwhile."""
        gone, self._gone = self._gone or set(), None
        for name, soonest, newest in gone:
            if name in done:
                done[name][0].discard(soonest)
                done[name][1].discard(newest)
        for name, (soonest, newest) in done.items():
            lists = self._lists[name]
            lists.settle()
            lists.soonest = _joined(soonest, lists.soonest)
            lists.newest = _joined(newest, lists.newest)

    # ------------------------------------------------------------------ questions

    def page(self, query: PageQuery, now_ms: int) -> Page:
        """One page of the pending copies matching ``query``, in its order: ``limit``
        rows or fewer, and the cursor of the next page when there are more."""
        if query.limit < 1:
            raise ValueError(f"a page holds at least one row, not limit={query.limit}")
        after = _parse_cursor(query.after, query.order)
        low = now_ms + 1 if query.due_from_ms is None else max(now_ms + 1, query.due_from_ms)
        high = query.due_to_ms
        if query.message_id is not None or query.key is not None:
            return self._small_page(query, after, low, high)
        names = self._names(query.destination)
        total = sum(self._count(name, low, high) for name in names)
        if query.order == "soonest":
            start = (low, "")
            first = after is None or after <= start
            walks = [
                self._lists[name].soonest.irange(
                    start if first else after,
                    None if high is None else (high, ""),
                    inclusive=(first, False),
                )
                for name in names
            ]
            copies = ((mid, due) for due, mid in heapq.merge(*walks))
        else:
            walks = [
                self._lists[name].newest.irange(after, None, inclusive=(False, False))
                for name in names
            ]
            copies = (
                (mid, due)
                for _published, mid, due in heapq.merge(*walks)
                if due >= low and (high is None or due < high)
            )
        found = [self.view.copies[c] for c in itertools.islice(copies, query.limit + 1)]
        return _cut(found, query, total)

    def _small_page(
        self,
        query: PageQuery,
        after: _Soonest | _Newest | None,
        low: int,
        high: int | None,
    ) -> Page:
        """A page by id or key: a few copies, sorted here."""
        if query.message_id is not None:
            ids = {query.message_id}
            if query.key is not None:
                ids &= self._by_key.get(query.key, set())
        else:
            ids = self._by_key.get(query.key or "", set())
        found = [
            record
            for message_id in ids
            for due, record in self._live(message_id).items()
            if due >= low
            and (high is None or due < high)
            and (query.key is None or record.key == query.key)
            and (query.destination is None or record.destination == query.destination)
        ]
        found.sort(key=lambda r: _place(r, query.order))
        total = len(found)
        if after is not None:
            found = [r for r in found if _place(r, query.order) > after]
        return _cut(found[: query.limit + 1], query, total)

    def by_destination(self, now_ms: int) -> dict[str, int]:
        """Pending copies per destination (destinations with none left out)."""
        counts = {name: self._count(name, now_ms + 1, None) for name in sorted(self._names(None))}
        return {name: n for name, n in counts.items() if n}

    def due_buckets(self, now_ms: int) -> dict[str, int]:
        """Pending copies by when they fall due (:data:`BUCKETS`), every destination."""
        out: dict[str, int] = {}
        names = self._names(None)
        low = now_ms + 1
        for name, span in BUCKETS:
            high = None if span is None else now_ms + span + 1
            out[name] = sum(self._count(d, low, high) for d in names)
            if high is not None:
                low = high
        return out

    def copies(self, message_id: str, now_ms: int) -> list[JournalRecord]:
        """The id's pending copies, soonest first (an id sent again after a failed
        confirm, or retried, waits as several): a few lookups, where the view's
        ``copies_of`` regroups every copy by id after each record it folds."""
        live = self._live(message_id)
        return [live[due] for due in sorted(live) if due > now_ms]

    def history(self, message_id: str) -> list[JournalRecord]:
        """Every record read for ``message_id``, in journal order: its publishes and
        retries (``scheduled``), moves (``rescheduled``), cancels, claims and ``done``."""
        held = self._records.get(message_id)
        if held is None:
            return []
        return list(held) if isinstance(held, tuple) else [held]

    def __len__(self) -> int:
        """Copies in the sorted lists: pending, and due ones not yet forgotten."""
        return sum(len(self._lists[name].soonest) for name in self._names(None))

    # ------------------------------------------------------------------ helpers

    def _names(self, destination: str | None) -> list[str]:
        """The destinations a question reads, their lists settled."""
        names = list(self._lists) if destination is None else [destination]
        names = [name for name in names if name in self._lists]
        for name in names:
            self._lists[name].settle()
        return names

    def _count(self, name: str, low: int, high: int | None) -> int:
        """Copies of destination ``name`` due in ``[low, high)``."""
        soonest = self._lists[name].soonest
        end: int = len(soonest) if high is None else soonest.bisect_left((high, ""))
        start: int = soonest.bisect_left((low, ""))
        return max(0, end - start)


def _joined(one: SortedList, other: SortedList) -> SortedList:
    """Both lists as one: the smaller inserted into the larger (no sort of them all)."""
    big, small = (one, other) if len(one) >= len(other) else (other, one)
    for place in small:
        big.add(place)
    return big


def _place(record: JournalRecord, order: Order) -> _Soonest | _Newest:
    """The copy's sort key in ``order``: (due, id), or (-published, id, due)."""
    if order == "soonest":
        return (record.due_at_ms, record.message_id)
    return (-record.recorded_at_ms, record.message_id, record.due_at_ms)


def _cut(found: list[JournalRecord], query: PageQuery, total: int) -> Page:
    """The first ``limit`` rows of ``found`` (up to ``limit + 1`` of them, in order),
    and a cursor after the last row when there are more."""
    rows = tuple(found[: query.limit])
    more = len(found) > query.limit
    return Page(rows, _cursor(_place(rows[-1], query.order)) if more else None, total)


def _cursor(place: _Soonest | _Newest) -> str:
    """Opaque to its users; the id goes last, so a dot in it needs no escape."""
    if len(place) == 2:
        return f"s.{place[0]}.{place[1]}"
    return f"n.{place[0]}.{place[2]}.{place[1]}"


def _parse_cursor(cursor: str | None, order: Order) -> _Soonest | _Newest | None:
    if cursor is None:
        return None
    try:
        if order == "soonest" and cursor.startswith("s."):
            due, message_id = cursor[2:].split(".", 1)
            return (int(due), message_id)
        if order == "newest" and cursor.startswith("n."):
            published, due, message_id = cursor[2:].split(".", 2)
            return (int(published), message_id, int(due))
    except ValueError:
        pass
    raise CursorError(
        f"the page cursor {cursor[:60]!r} is not one this schedule gave for {order}-first "
        "pages: start again from the first page (no cursor)"
    )
