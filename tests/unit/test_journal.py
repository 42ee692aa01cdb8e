"""The schedule journal's records and folds, without a broker."""

from __future__ import annotations

from datetime import datetime, timezone
from decimal import Decimal

from hypothesis import given
from hypothesis import strategies as st

from rmqdelay import Settings
from rmqdelay.core.journal import (
    JournalRecord,
    ScheduleView,
    Tombstones,
    decode_record,
    decode_records,
    encode_record,
    encode_records,
    journal_name,
    max_age,
    plan_cancels,
)

ids = st.text("abcdef0123456789", min_size=1, max_size=8)
records = st.builds(
    JournalRecord,
    kind=st.sampled_from(["scheduled", "cancelled"]),
    message_id=ids,
    destination=st.sampled_from(["orders", "emails"]),
    due_at_ms=st.integers(0, 2**53),
    attempt=st.integers(1, 100),
    body_size=st.integers(0, 2**31),
    headers=st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=5), max_size=3),
    recorded_at_ms=st.integers(0, 2**53),
    body=st.none() | st.binary(max_size=20),
)


@given(records)
def test_a_record_survives_encoding(record: JournalRecord) -> None:
    assert decode_record(encode_record(record)) == record


def test_a_marker_is_small_and_reads_back() -> None:
    marker = JournalRecord("marker", "m-1", recorded_at_ms=5)
    raw = encode_record(marker)
    assert len(raw) < 60
    assert decode_record(raw) == marker


def test_header_values_json_cannot_hold_are_written_as_text() -> None:
    when = datetime(2026, 1, 2, tzinfo=timezone.utc)
    record = JournalRecord(
        "scheduled", "a", headers={"b": b"\x00\x01", "t": when, "d": Decimal("1.5")}
    )
    decoded = decode_record(encode_record(record))
    assert decoded is not None
    assert decoded.headers == {"b": "AAE=", "t": when.isoformat(), "d": "1.5"}


def test_unreadable_records_are_skipped() -> None:
    for raw in (b"", b"not json", b"[]", b'{"v": 99, "k": "scheduled", "id": "x"}', b'{"v": 1}'):
        assert decode_record(raw) is None
    assert decode_record(b'{"v": 1, "k": "bogus", "id": "x"}') is None


@given(st.lists(records, max_size=40), st.integers(0, 2**53))
def test_pending_is_the_latest_uncancelled_future_record_per_id_soonest_first(
    history: list[JournalRecord], now: int
) -> None:
    view = ScheduleView().extend(history)
    pending = view.pending(now)
    # a model: walk the history; the last scheduled record per id counts unless a
    # tombstone came after it
    latest: dict[str, JournalRecord] = {}
    cancelled: set[str] = set()
    for record in history:
        if record.kind == "scheduled":
            latest[record.message_id] = record
            cancelled.discard(record.message_id)
        else:
            cancelled.add(record.message_id)
    expected = {
        r.message_id for r in latest.values() if r.due_at_ms > now and r.message_id not in cancelled
    }
    assert {r.message_id for r in pending} == expected
    assert [r.due_at_ms for r in pending] == sorted(r.due_at_ms for r in pending)


def test_pending_filters_by_destination_due_time_and_limit() -> None:
    view = ScheduleView().extend(
        JournalRecord("scheduled", f"m{i}", "orders" if i % 2 else "emails", 1000 + i)
        for i in range(10)
    )
    assert [r.message_id for r in view.pending(0, destination="orders")] == [
        "m1",
        "m3",
        "m5",
        "m7",
        "m9",
    ]
    assert [r.message_id for r in view.pending(0, due_before_ms=1003)] == ["m0", "m1", "m2"]
    assert [r.message_id for r in view.pending(1004, limit=2)] == ["m5", "m6"]


def test_cancel_answers_cancelled_unknown_or_too_late() -> None:
    view = ScheduleView().extend([JournalRecord("scheduled", "a", "orders", 5000)])
    assert view.answer("a", 4999)[0] == "cancelled"
    assert view.answer("a", 5000)[0] == "too late"
    assert view.answer("b", 0) == ("unknown", None)


def test_a_retry_recorded_later_moves_the_due_time_a_cancel_sees() -> None:
    view = ScheduleView().extend(
        [
            JournalRecord("scheduled", "a", "orders", 1000, attempt=1),
            JournalRecord("scheduled", "a", "orders", 9000, attempt=3),
        ]
    )
    answer, record = view.answer("a", 5000)
    assert answer == "cancelled"
    assert record is not None and record.attempt == 3


def test_tombstones_hold_until_due_plus_margin_then_expire() -> None:
    stones = Tombstones(margin_ms=100)
    stones.add(JournalRecord("cancelled", "a", "orders", 1000))
    stones.add(JournalRecord("scheduled", "b", "orders", 1000))  # not a tombstone
    assert stones.is_cancelled("a", 1100)
    assert not stones.is_cancelled("a", 1101)
    assert not stones.is_cancelled("b", 0)
    assert stones.expire(1050) == 0 and len(stones) == 1
    assert stones.expire(1101) == 1 and len(stones) == 0


def test_the_stream_outlives_the_longest_delay() -> None:
    layout = Settings(prefix="shop", max_delay="90m").layout
    assert journal_name(layout) == "shop.schedule"
    assert max_age(layout) == "3h"


def test_plan_cancels_answers_each_id_once_and_tombstones_only_what_is_ahead() -> None:
    view = ScheduleView().extend(
        [
            JournalRecord("scheduled", "ahead", "orders", 5000, attempt=2),
            JournalRecord("scheduled", "past", "orders", 100),
        ]
    )
    results, tombstones = plan_cancels(view, ["ahead", "past", "nope", "ahead"], 1000)
    assert [(r.message_id, r.outcome, r.due_at_ms) for r in results] == [
        ("ahead", "cancelled", 5000),
        ("past", "too late", 100),
        ("nope", "unknown", None),
    ]
    assert tombstones == [
        JournalRecord("cancelled", "ahead", "orders", 5000, 2, recorded_at_ms=1000)
    ]
    # once the tombstone is in the journal, the message is no longer pending
    assert view.extend(tombstones).pending(1000) == []


@given(st.lists(records, max_size=10))
def test_a_batch_of_records_is_one_message_that_reads_back_whole(
    batch: list[JournalRecord],
) -> None:
    assert decode_records(encode_records(batch)) == batch
