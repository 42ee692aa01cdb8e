"""The dashboard's store pages exactly what the journal's view says is pending, in order.

The model is :class:`~rmqdelay.core.journal.view.ScheduleView` folded over the same random
journal: its :meth:`pending`, filtered and sorted naively, is what a walk over every
page of the store (SQLite, in memory here) must give, for every filter, order and page
size; and so for a store restored from a checkpoint's parts, and one saved and reopened.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rmqdelay.core.journal.records import JournalRecord, RecordKind
from rmqdelay.core.journal.state import JournalState, write_sections
from rmqdelay.core.journal.view import ScheduleView
from rmqdelay.dashboard.pages import BUCKETS, CursorError, Page, PageQuery
from rmqdelay.dashboard.store import ScheduleStore

KINDS: tuple[RecordKind, ...] = (
    *("scheduled",) * 5,  # most records: publishes and retries
    "cancelled",
    "rescheduled",
    "claimed",
    "done",
    "marker",
)
IDS = ["a", "b", "c.d", "e"]
DESTINATIONS = ["orders", "emails", "x"]
KEYS = [None, None, "k1", "k2"]
# due times on both sides of each bucket's edge, for nows of 0 and 1
DUES = [0, 1, 2, 59_999, 60_001, 3_600_001, 86_400_002, 30 * 86_400_001, 10**11]


@st.composite
def a_record(draw: st.DrawFn) -> JournalRecord:
    kind = draw(st.sampled_from(KINDS))
    key = draw(st.sampled_from(KEYS)) if kind != "cancelled" else None
    return JournalRecord(
        kind,
        draw(st.sampled_from(IDS)),
        draw(st.sampled_from(DESTINATIONS)),
        draw(st.sampled_from(DUES)),
        recorded_at_ms=draw(st.integers(0, 5)),
        cancels_due_ms=tuple(draw(st.lists(st.sampled_from(DUES), max_size=3))),
        key=key,
        on_conflict=draw(st.sampled_from([None, "ignore", "replace"])) if key else None,
        fresh_copy=draw(st.booleans()),
    )


journals = st.lists(a_record(), max_size=40)
queries = st.builds(
    PageQuery,
    destination=st.none() | st.sampled_from([*DESTINATIONS, "nowhere"]),
    key=st.none() | st.sampled_from(["k1", "k2"]),
    message_id=st.none() | st.sampled_from(IDS),
    due_from_ms=st.none() | st.sampled_from(DUES),
    due_to_ms=st.none() | st.sampled_from(DUES),
    order=st.sampled_from(["soonest", "newest"]),
    limit=st.integers(1, 4),
)
nows = st.sampled_from([0, 1, 60_000])


def naive(view: ScheduleView, query: PageQuery, now_ms: int) -> list[JournalRecord]:
    """What the page walk must give: the view's pending copies, filtered and sorted."""
    found = [
        r
        for r in view.pending(now_ms, destination=query.destination, due_before_ms=query.due_to_ms)
        if (query.key is None or r.key == query.key)
        and (query.message_id is None or r.message_id == query.message_id)
        and (query.due_from_ms is None or r.due_at_ms >= query.due_from_ms)
    ]
    if query.order == "newest":
        found.sort(key=lambda r: (-r.recorded_at_ms, r.message_id, r.due_at_ms))
    return found


def walk(index: ScheduleStore, query: PageQuery, now_ms: int) -> list[Page]:
    pages = [index.page(query, now_ms)]
    while pages[-1].next_cursor is not None:
        assert len(pages) <= 50, "the cursor walk does not end"
        pages.append(
            index.page(PageQuery(**{**vars(query), "after": pages[-1].next_cursor}), now_ms)
        )
    return pages


def check(
    index: ScheduleStore, records: Sequence[JournalRecord], query: PageQuery, now: int
) -> None:
    view = ScheduleView().extend(records)
    expected = naive(view, query, now)
    pages = walk(index, query, now)
    got = [row for page in pages for row in page.rows]
    assert [(r.message_id, r.due_at_ms) for r in got] == [
        (r.message_id, r.due_at_ms) for r in expected
    ]
    assert got == expected
    assert {page.total for page in pages} == {len(expected)}
    assert all(len(page.rows) == query.limit for page in pages[:-1])
    assert pages[-1].rows or len(pages) == 1


@settings(max_examples=200)
@given(journals, queries, nows)
def test_pages_walk_the_views_pending_copies_in_order(
    records: list[JournalRecord], query: PageQuery, now: int
) -> None:
    check(ScheduleStore().extend(records), records, query, now)


@settings(max_examples=80)
@given(journals, journals, queries, nows)
def test_a_store_read_on_agrees_at_every_point(
    first: list[JournalRecord], then: list[JournalRecord], query: PageQuery, now: int
) -> None:
    """Pages asked between records (a dashboard following the journal) agree too."""
    index = ScheduleStore().extend(first)
    check(index, first, query, now)
    index.extend(then)
    check(index, [*first, *then], query, now)


@settings(max_examples=80)
@given(journals, journals, queries, nows)
def test_a_store_begun_from_a_checkpoint_then_read_on_agrees(
    first: list[JournalRecord], then: list[JournalRecord], query: PageQuery, now: int
) -> None:
    """A dashboard's first read: a checkpoint's parts (the fold of ``first``), then
    the tail; and the same store saved, reopened and read on."""
    folded = JournalState()
    for record in first:
        folded.add(record)
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "store.sqlite3"
        index = ScheduleStore(path)
        for section, body, _count in write_sections(folded):
            index.take_part(section, body)
        index.loaded()
        check(index, first, query, now)
        index.save("prefix@broker", 7, "hash")
        index.extend(then)  # not saved: a restart reads it again from the journal
        index.close()

        reopened = ScheduleStore(path)
        assert reopened.saved("prefix@elsewhere") is None  # another broker's: emptied
        assert len(reopened) == 0
        reopened.close()
        index = ScheduleStore(path)
        for section, body, _count in write_sections(folded):
            index.take_part(section, body)
        index.loaded()
        index.save("prefix@broker", 7, "hash")
        index.close()

        reopened = ScheduleStore(path)
        assert (reopened.saved("prefix@broker"), reopened.last_hash) == (7, "hash")
        check(reopened, first, query, now)
        reopened.extend(then)
        check(reopened, [*first, *then], query, now)
        reopened.close()


@given(journals, queries, st.sampled_from([0, 1, 2, 60_001]))
def test_forgetting_settled_copies_changes_no_page(
    records: list[JournalRecord], query: PageQuery, now: int
) -> None:
    index = ScheduleStore().extend(records)
    index.forget(now + 600_001, 86_400_000)  # what settled ten minutes before
    check(index, records, query, now + 600_001)


@given(journals, nows)
def test_counts_per_destination_and_due_bucket(records: list[JournalRecord], now: int) -> None:
    index = ScheduleStore().extend(records)
    pending = ScheduleView().extend(records).pending(now)
    per_destination: dict[str, int] = {}
    for r in pending:
        per_destination[r.destination] = per_destination.get(r.destination, 0) + 1
    assert index.by_destination(now) == dict(sorted(per_destination.items()))
    held = ScheduleView().extend(records).copies.values()
    assert index.destinations() == sorted({r.destination for r in held})
    buckets = index.due_buckets(now)
    assert list(buckets) == [name for name, _ in BUCKETS]
    assert sum(buckets.values()) == len(pending)
    assert buckets["minute"] == sum(1 for r in pending if r.due_at_ms <= now + 60_000)
    assert buckets["later"] == sum(1 for r in pending if r.due_at_ms > now + 30 * 86_400_000)


@given(journals, nows)
def test_copies_are_the_ids_pending_copies_soonest_first(
    records: list[JournalRecord], now: int
) -> None:
    index = ScheduleStore().extend(records)
    pending = ScheduleView().extend(records).pending(now)
    for message_id in IDS:
        assert index.copies_pending(message_id, now) == [
            r for r in pending if r.message_id == message_id
        ]


@given(journals)
def test_history_is_every_record_of_the_id_in_journal_order(records: list[JournalRecord]) -> None:
    index = ScheduleStore().extend(records)
    for message_id in IDS:
        assert index.history(message_id) == [
            r for r in records if r.message_id == message_id and r.kind != "marker"
        ]


def test_a_replace_hides_the_message_it_supersedes_and_a_cancel_takes_a_copy_out() -> None:
    first = JournalRecord("scheduled", "m1", "orders", 5_000, key="k", on_conflict="ignore")
    index = ScheduleStore().extend([first, JournalRecord("scheduled", "m0", "orders", 9_000)])
    assert [r.message_id for r in index.page(PageQuery(), 0).rows] == ["m1", "m0"]
    index.add(JournalRecord("scheduled", "m2", "orders", 7_000, key="k", on_conflict="replace"))
    assert [r.message_id for r in index.page(PageQuery(), 0).rows] == ["m2", "m0"]
    index.add(JournalRecord("cancelled", "m0", "orders", 9_000))
    page = index.page(PageQuery(key="k"), 0)
    assert [r.message_id for r in page.rows] == ["m2"] and page.total == 1
    assert index.page(PageQuery(), 0).total == 1


def test_a_page_is_an_index_walk_whatever_is_pending() -> None:
    """A page reads ``limit + 1`` rows along an index, never sorts the schedule: SQLite's
    plan for each order and filter uses an index and no temporary sort."""
    index = ScheduleStore().extend(
        JournalRecord("scheduled", f"m{i}", "orders", 1_000 + i, recorded_at_ms=i)
        for i in range(2_000)
    )
    index.loaded()
    for order in ("soonest", "newest"):
        for destination in (None, "orders"):
            query = PageQuery(order=order, limit=50, due_from_ms=1_500, destination=destination)
            page = index.page(query, 0)
            assert page.total == 1_500 and len(page.rows) == 50
            where, args = index._filters(query, 0)
            ordering = "due, id" if order == "soonest" else "recorded DESC, id, due"
            plan = index.db.execute(
                f"EXPLAIN QUERY PLAN SELECT record FROM copies {index._walk(query)} "
                f"WHERE {where} ORDER BY {ordering} LIMIT 51",
                args,
            ).fetchall()
            text = " ".join(str(row[-1]) for row in plan)
            assert "USING INDEX" in text and "TEMP B-TREE" not in text, text


def test_a_cursor_from_another_order_or_hand_edited_is_refused_clearly() -> None:
    index = ScheduleStore().extend(
        [JournalRecord("scheduled", f"m{i}", "orders", 1_000 + i) for i in range(3)]
    )
    cursor = index.page(PageQuery(limit=1), 0).next_cursor
    assert cursor is not None
    with pytest.raises(CursorError, match="start again from the first page"):
        index.page(PageQuery(order="newest", after=cursor), 0)
    with pytest.raises(CursorError, match="not one this schedule gave"):
        index.page(PageQuery(after="s.notanumber.m1"), 0)
    with pytest.raises(ValueError, match="at least one row"):
        index.page(PageQuery(limit=0), 0)
