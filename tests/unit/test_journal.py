"""The schedule journal's records and folds, without a broker."""

from __future__ import annotations

import json
from dataclasses import FrozenInstanceError, fields, replace
from datetime import datetime, timezone
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rmqdelay import Settings
from rmqdelay.core.journal.records import (
    JournalRecord,
    decode_record,
    decode_records,
    encode_record,
    encode_records,
    encode_scheduled,
    journal_name,
    json_text,
    max_age,
    plain_record,
)
from rmqdelay.core.journal.tombstones import Tombstones
from rmqdelay.core.journal.view import ScheduleView, plan_cancels

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
    cancels_due_ms=st.lists(st.integers(0, 2**53), max_size=3).map(tuple),
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


# A small world of ids and due times, so that copies of one id and tombstones naming
# them meet often.
few_ids = st.sampled_from(["a", "b", "c"])
few_dues = st.integers(0, 8).map(lambda i: 1000 * i)
copy_records = st.builds(
    JournalRecord,
    kind=st.just("scheduled"),
    message_id=few_ids,
    destination=st.sampled_from(["orders", "emails"]),
    due_at_ms=few_dues,
    attempt=st.integers(1, 3),
)
tombstone_records = st.builds(
    JournalRecord,
    kind=st.just("cancelled"),
    message_id=few_ids,
    destination=st.just("orders"),
    due_at_ms=few_dues,
    cancels_due_ms=st.lists(few_dues, max_size=3).map(tuple),
)
histories = st.lists(copy_records | tombstone_records, max_size=30)
nows = st.integers(-1, 9000)


def model_pending(history: list[JournalRecord], now: int) -> dict[tuple[str, int], JournalRecord]:
    """The rule, walked by hand: a copy (id, due time) is pending when its due time is
    ahead and no tombstone naming it comes after its last record."""
    last: dict[tuple[str, int], tuple[int, JournalRecord]] = {}
    cancelled_at: dict[tuple[str, int], int] = {}
    for i, record in enumerate(history):
        if record.kind == "scheduled":
            last[record.message_id, record.due_at_ms] = (i, record)
        else:
            for due in {record.due_at_ms, *record.cancels_due_ms}:
                cancelled_at[record.message_id, due] = i
    return {
        key: record
        for key, (i, record) in last.items()
        if key[1] > now and cancelled_at.get(key, -1) < i
    }


def _copies(records: list[JournalRecord]) -> list[tuple[str, int]]:
    return [(r.message_id, r.due_at_ms) for r in records]


@given(histories, nows)
def test_pending_is_every_future_copy_without_a_tombstone_after_it_soonest_first(
    history: list[JournalRecord], now: int
) -> None:
    pending = ScheduleView().extend(history).pending(now)
    expected = model_pending(history, now)
    assert sorted(_copies(pending)) == sorted(expected)
    assert len(pending) == len(expected)  # a copy once, however often it was recorded
    assert all(r == expected[r.message_id, r.due_at_ms] for r in pending)  # its last record
    # soonest first, copies due at the same time in id order (ids and times meet often)
    assert _copies(pending) == sorted(_copies(pending), key=lambda c: (c[1], c[0]))


@given(st.lists(copy_records, max_size=20).flatmap(lambda h: st.permutations(h)), nows)
def test_without_cancels_the_order_of_the_records_does_not_matter(
    history: list[JournalRecord], now: int
) -> None:
    """Records in any order (late ones anywhere): every copy still ahead is pending."""
    pending = ScheduleView().extend(history).pending(now)
    assert set(_copies(pending)) == {
        (r.message_id, r.due_at_ms) for r in history if r.due_at_ms > now
    }


@given(histories, copy_records, st.integers(0, 30), nows)
def test_a_late_record_anywhere_hides_no_copy(
    history: list[JournalRecord], late: JournalRecord, where: int, now: int
) -> None:
    """A record written late, wherever it lands, only adds: what was pending stays so."""
    before = set(_copies(ScheduleView().extend(history).pending(now)))
    where = min(where, len(history))
    after = ScheduleView().extend([*history[:where], late, *history[where:]]).pending(now)
    assert before <= set(_copies(after))


@given(histories, nows)
def test_a_worker_skips_exactly_the_copies_the_list_leaves_out_as_cancelled(
    history: list[JournalRecord], now: int
) -> None:
    view = ScheduleView().extend(history)
    stones = Tombstones()
    for record in history:
        stones.add(record)
    for message_id, due in {(r.message_id, r.due_at_ms) for r in history}:
        if due > now:
            listed = (message_id, due) in set(_copies(view.pending(now)))
            assert stones.is_cancelled(message_id, now, due) == (not listed)
            assert view.is_cancelled(message_id, due) == (not listed)


@given(histories)
def test_a_worker_that_decodes_only_the_lines_it_wants_holds_the_same_tombstones(
    history: list[JournalRecord],
) -> None:
    """``Tombstones.wants`` lets a worker pass over ``scheduled`` records undecoded: it
    must keep every line that could change what is held, whatever came before."""
    everything, wanted = Tombstones(), Tombstones()
    for record in history:
        everything.add(record)
        line = encode_record(record)
        if wanted.wants(line):
            decoded = decode_record(line)
            assert decoded is not None
            wanted.add(decoded)
    assert wanted.due_ms == everything.due_ms
    assert not Tombstones().wants(encode_record(JournalRecord("scheduled", "x", "d", 1)))
    assert Tombstones().wants(encode_record(JournalRecord("cancelled", "x", "d", 1)))


@given(histories, st.lists(few_ids, min_size=1, max_size=3), nows)
def test_a_cancel_stops_every_copy_ahead_and_answers_by_the_last_one(
    history: list[JournalRecord], ids: list[str], now: int
) -> None:
    view = ScheduleView().extend(history)
    results, tombstones = plan_cancels(view, ids, now)
    for result in results:
        copies = {
            r.due_at_ms
            for r in history
            if r.kind == "scheduled" and r.message_id == result.message_id
        }
        ahead = sorted(d for d in copies if d > now)
        assert result.copies == len(copies)
        assert result.cancelled_due_ms == tuple(ahead)
        if not copies:
            assert result.outcome == "unknown"
        elif ahead:
            assert (result.outcome, result.due_at_ms) == ("cancelled", ahead[-1])
        else:
            assert (result.outcome, result.due_at_ms) == ("too late", max(copies))
    stones = Tombstones()
    for record in [*history, *tombstones]:
        stones.add(record)
    after = view.extend(tombstones)
    assert not {r.message_id for r in after.pending(now)} & set(ids)
    for result in results:
        for due in result.cancelled_due_ms:
            assert stones.is_cancelled(result.message_id, now, due)


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


# Issue 17: the 20 messages in flight when a partition started. Each id got three
# records: due D, then D + 60.4 s (the copy finally confirmed), then D + 30.2 s, written
# after the partition ended by a publish whose confirm had failed.
D = 1_800_000_000_000
CONFIRMED, LATE = D + 60_400, D + 30_200
IN_FLIGHT = [f"m{i:02}" for i in range(20)]


def _partition_journal() -> list[JournalRecord]:
    others = [JournalRecord("scheduled", f"other{i}", "orders", D - 5_000 + i) for i in range(5)]
    return [
        *others,
        *(JournalRecord("scheduled", m, "orders", D, recorded_at_ms=D - 9_000) for m in IN_FLIGHT),
        *(JournalRecord("scheduled", m, "orders", CONFIRMED, recorded_at_ms=D) for m in IN_FLIGHT),
        *(
            JournalRecord("scheduled", m, "orders", LATE, recorded_at_ms=D + 2_000)
            for m in IN_FLIGHT
        ),
    ]


def test_issue_17_every_copy_of_the_partition_sequence_is_listed_while_ahead() -> None:
    view = ScheduleView().extend(_partition_journal())
    copies: dict[str, list[int]] = {m: [] for m in IN_FLIGHT}
    for record in view.pending(D - 1):
        copies.setdefault(record.message_id, []).append(record.due_at_ms)
    assert all(copies[m] == [D, LATE, CONFIRMED] for m in IN_FLIGHT)
    assert _copies(view.pending(D)) == [(m, LATE) for m in IN_FLIGHT] + [
        (m, CONFIRMED) for m in IN_FLIGHT
    ]
    # the late record is past: the confirmed copy, due last, is still listed (the bug
    # listed nothing here, the late record having replaced it)
    assert _copies(view.pending(LATE)) == [(m, CONFIRMED) for m in IN_FLIGHT]
    assert view.pending(CONFIRMED) == []


def test_issue_17_a_cancel_between_the_late_and_the_confirmed_copy_cancels_every_copy() -> None:
    view = ScheduleView().extend(_partition_journal())
    now = LATE + 1_000
    results, tombstones = plan_cancels(view, IN_FLIGHT[:5], now)
    assert [(r.outcome, r.due_at_ms, r.copies, r.cancelled_due_ms) for r in results] == [
        ("cancelled", CONFIRMED, 3, (CONFIRMED,))
    ] * 5
    assert {t.named_due_times() for t in tombstones} == {(D, LATE, CONFIRMED)}
    view.extend(tombstones)
    assert {r.message_id for r in view.pending(now)} == set(IN_FLIGHT[5:])
    # a worker skips the confirmed copy, and the stale one delivered after it
    stones = Tombstones()
    for record in [*_partition_journal(), *tombstones]:
        stones.add(record)
    assert stones.is_cancelled("m00", CONFIRMED + 100, CONFIRMED)
    assert stones.is_cancelled("m00", CONFIRMED + 500, LATE)
    assert not stones.is_cancelled("m05", CONFIRMED + 100, CONFIRMED)
    # once every copy is due, a cancel is too late, and says so for the last of them
    [late] = plan_cancels(ScheduleView().extend(_partition_journal()), ["m00"], CONFIRMED)[0]
    assert (late.outcome, late.due_at_ms, late.copies, late.cancelled_due_ms) == (
        "too late",
        CONFIRMED,
        3,
        (),
    )


def test_a_re_schedule_recorded_after_the_tombstone_is_not_swallowed() -> None:
    history = [JournalRecord("scheduled", "a", "orders", 5000)]
    _, tombstones = plan_cancels(ScheduleView().extend(history), ["a"], 1000)
    history += [*tombstones, JournalRecord("scheduled", "a", "orders", 7000, attempt=1)]
    assert _copies(ScheduleView().extend(history).pending(1000)) == [("a", 7000)]
    stones = Tombstones()
    for record in history:
        stones.add(record)
    assert stones.is_cancelled("a", 5000, 5000)
    assert not stones.is_cancelled("a", 7000, 7000)


def test_tombstones_keep_each_named_copy_until_its_own_due_time_plus_margin() -> None:
    stones = Tombstones(margin_ms=100)
    stones.add(JournalRecord("cancelled", "a", "orders", 3000, cancels_due_ms=(1000, 2000, 3000)))
    stones.add(JournalRecord("cancelled", "a", "orders", 4000))  # a second cancel adds
    assert len(stones) == 1
    assert [stones.is_cancelled("a", 1000, due) for due in (1000, 2000, 3000, 4000, 1500)] == [
        True,
        True,
        True,
        True,
        False,
    ]
    assert not stones.is_cancelled("a", 1101, 1000)  # past its own margin
    assert stones.is_cancelled("a", 4100)  # no due time: any copy still in its margin
    assert not stones.is_cancelled("a", 4101)
    assert stones.expire(2500) == 0 and not stones.is_cancelled("a", 2000, 2000)
    assert stones.is_cancelled("a", 2500, 3000)
    assert stones.expire(4101) == 1 and len(stones) == 0


def test_a_tombstone_names_its_copies_and_older_readers_still_see_the_last() -> None:
    stone = JournalRecord("cancelled", "a", "orders", 3000, cancels_due_ms=(1000, 3000))
    raw = encode_record(stone)
    assert b'"due":3000' in raw and b'"c":[1000,3000]' in raw
    assert decode_record(raw) == stone
    # a tombstone written before copies were told apart names its due time alone
    old = decode_record(b'{"v":1,"k":"cancelled","id":"a","d":"orders","due":3000,"a":1,"n":0}')
    assert old is not None and old.named_due_times() == (3000,)


_lines = st.lists(
    records.map(encode_record)
    | st.sampled_from([b"", b"not json", b"1,2", b"[]", b"{}", b'{"v": 1}', b"\xff", b"3"]),
    max_size=8,
)


@given(_lines)
def test_a_write_decoded_at_once_is_each_line_decoded_alone(lines: list[bytes]) -> None:
    """The whole stream message goes through one JSON parse; an unreadable line among
    the others is still skipped alone, and every readable record comes back in order."""
    alone = [r for line in lines if (r := decode_record(line)) is not None]
    assert decode_records(b"\n".join(lines)) == alone


# The usual record, as publish_many writes it (encode_scheduled, no key), with ids and
# destinations the fast path takes (plain ASCII) and those it leaves to the JSON parser
# (quotes, backslashes, control characters, non-ASCII): one regular expression reads a
# write made only of such lines.
_usual_texts = st.text("ab-_.:/ 09") | st.text(max_size=6)
usual_lines = st.builds(
    encode_scheduled,
    message_id=_usual_texts,
    destination=_usual_texts,
    due_at_ms=st.integers(0, 2**63),
    attempt=st.integers(0, 100),
    body_size=st.integers(0, 2**31),
    recorded_at_ms=st.integers(0, 2**53),
    # with the body and its content type too (journal_bodies, the default)
    body=st.none() | st.binary(max_size=12),
    properties=st.none() | st.fixed_dictionaries({"content_type": _usual_texts}),
)
_odd_usual = st.sampled_from(
    [
        b'{"v":1,"k":"scheduled","id":"a","d":"o","due":1,"a":1,"n":0,"t":0,"b":"YW"}',
        b'{"v":1,"k":"scheduled","id":"a","d":"o","due":1,"a":1,"n":0,"t":0,"b":"Y"}',
        b'{"v":1,"k":"scheduled","id":"a","d":"o","due":1,"a":1,"n":0,"t":0,"b":"@"}',
        b'{"v":1,"k":"scheduled","id":"a","d":"o","due":1,"a":1,"n":0,"t":0,"p":{"content_type":"x"}}',
        b'{"v":1,"k":"scheduled","id":"a","d":"o","due":01,"a":1,"n":0,"t":0}',
        b'{"v":1,"k":"scheduled","id":"a","d":"o","due":-1,"a":1,"n":0,"t":0}',
        b'{"v":1,"k":"scheduled","id":"a","d":"o","due":1.5,"a":1,"n":0,"t":0}',
        b'{"v":1,"k":"scheduled","id":"a","d":"o","due":1e3,"a":1,"n":0,"t":0}',
        b'{"v":1, "k":"scheduled","id":"a","d":"o","due":1,"a":1,"n":0,"t":0}',
        b'{"v":1,"k":"scheduled","id":"a","d":"o","due":1,"a":1,"n":0,"t":0}\r',
        b'{"v":1,"k":"scheduled","id":"a\\/b","d":"o","due":1,"a":1,"n":0,"t":0}',
        b'{"v":2,"k":"scheduled","id":"a","d":"o","due":1,"a":1,"n":0,"t":0}',
    ]
)


@given(
    st.lists(usual_lines, min_size=1, max_size=6), st.lists(usual_lines | _odd_usual, max_size=3)
)
def test_a_write_of_usual_records_reads_as_the_json_parser_reads_it(
    usual: list[bytes], more: list[bytes]
) -> None:
    for lines in (usual, usual + more, more + usual):
        alone = [r for line in lines if (r := decode_record(line)) is not None]
        assert decode_records(b"\n".join(lines)) == alone


@given(records)
def test_a_plain_record_is_the_constructors_record(record: JournalRecord) -> None:
    made = plain_record(
        record.kind,
        record.message_id,
        record.destination,
        record.due_at_ms,
        record.attempt,
        record.body_size,
        record.recorded_at_ms,
    )
    built = JournalRecord(
        record.kind,
        record.message_id,
        record.destination,
        record.due_at_ms,
        record.attempt,
        record.body_size,
        recorded_at_ms=record.recorded_at_ms,
    )
    assert made == built and repr(made) == repr(built)
    assert vars(made) == vars(built) and list(vars(made)) == [f.name for f in fields(built)]
    other = plain_record("scheduled", "x", "d", 1, 1, 0, 0)
    for name in ("headers", "properties", "data"):  # a mapping of its own, as the constructor's
        assert getattr(made, name) is not getattr(other, name)
    assert replace(made, due_at_ms=7) == replace(built, due_at_ms=7)
    with pytest.raises(FrozenInstanceError):
        made.due_at_ms = 1  # type: ignore[misc]


@given(st.text())
def test_json_text_writes_a_string_as_json_dumps_does(text: str) -> None:
    """The encoder's undocumented helper and its stand-in, ``json.dumps``, agree."""
    assert json_text(text) == json.dumps(text)
