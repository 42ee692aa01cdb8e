"""Recurring schedules' pure parts: rules, DST, occurrences, control records, the fold."""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rmqdelay.core.journal.records import (
    JournalRecord,
    decode_record,
    decode_records,
    encode_records,
)
from rmqdelay.core.journal.recurring import RecurringBook, control_record
from rmqdelay.core.journal.rules import (
    CHAIN,
    OCCURRENCE,
    RECURRING,
    STATE,
    Occurrence,
    Rule,
    new_chain,
    occurrence_key,
    parse_rule,
    read_occurrence,
    rule_of,
    validate_name,
)
from rmqdelay.errors import RecurringError

pytestmark = pytest.mark.unit

BERLIN = ZoneInfo("Europe/Berlin")
UTC = timezone.utc


def ms(dt: datetime) -> int:
    return int(dt.timestamp() * 1000)


def local(at_ms: int, zone: ZoneInfo = BERLIN) -> str:
    return datetime.fromtimestamp(at_ms / 1000, zone).isoformat()


def firings(rule: Rule, start: datetime, end: datetime) -> list[str]:
    """Every firing in [start, end), as local ISO times with their offsets."""
    found = []
    at = rule.next_after(ms(start) - 1)
    while at < ms(end):
        found.append(local(at))
        at = rule.next_after(at)
    return found


# ---------------------------------------------------------------------- DST, Berlin
# 2026-03-29 02:00 CET -> 03:00 CEST (gap); 2026-10-25 03:00 CEST -> 02:00 CET (repeat)

GAP_DAY = datetime(2026, 3, 29, tzinfo=BERLIN)
REPEAT_DAY = datetime(2026, 10, 25, tzinfo=BERLIN)


def test_a_fixed_time_in_the_spring_gap_fires_once_right_after_it() -> None:
    rule = parse_rule(cron="30 2 * * *", tz="Europe/Berlin")
    assert firings(rule, GAP_DAY - timedelta(days=1), GAP_DAY + timedelta(days=2)) == [
        "2026-03-28T02:30:00+01:00",
        "2026-03-29T03:00:00+02:00",  # 02:30 does not exist that day
        "2026-03-30T02:30:00+02:00",
    ]


def test_a_fixed_time_in_the_autumn_repeat_fires_once_the_first_time() -> None:
    rule = parse_rule(cron="30 2 * * *", tz="Europe/Berlin")
    assert firings(rule, REPEAT_DAY - timedelta(days=1), REPEAT_DAY + timedelta(days=2)) == [
        "2026-10-24T02:30:00+02:00",
        "2026-10-25T02:30:00+02:00",  # not again at 02:30+01:00
        "2026-10-26T02:30:00+01:00",
    ]


def test_a_wildcard_hour_fires_in_both_repeated_hours_and_skips_the_gap() -> None:
    rule = parse_rule(cron="*/30 * * * *", tz="Europe/Berlin")
    # (aware datetimes add wall-clock time: the ends are given as local times)
    start = datetime(2026, 10, 25, 1, 30, tzinfo=BERLIN)
    assert firings(rule, start, datetime(2026, 10, 25, 3, 1, tzinfo=BERLIN)) == [
        "2026-10-25T01:30:00+02:00",
        "2026-10-25T02:00:00+02:00",
        "2026-10-25T02:30:00+02:00",
        "2026-10-25T02:00:00+01:00",
        "2026-10-25T02:30:00+01:00",
        "2026-10-25T03:00:00+01:00",
    ]
    start = datetime(2026, 3, 29, 1, 30, tzinfo=BERLIN)
    assert firings(rule, start, datetime(2026, 3, 29, 3, 1, tzinfo=BERLIN)) == [
        "2026-03-29T01:30:00+01:00",
        "2026-03-29T03:00:00+02:00",
    ]


def test_a_daily_time_stays_local_across_both_changes() -> None:
    rule = parse_rule(cron="0 9 * * *", tz="Europe/Berlin")
    for day in (GAP_DAY, REPEAT_DAY):
        got = firings(rule, day - timedelta(days=1), day + timedelta(days=2))
        assert [t[11:] for t in got] == ["09:00:00" + t[19:] for t in got]
        assert len(got) == 3
    # 09:00 is 08:00 UTC in winter, 07:00 UTC in summer
    assert rule.next_after(ms(GAP_DAY)) == ms(datetime(2026, 3, 29, 7, tzinfo=UTC))


def test_every_is_absolute_time_across_dst() -> None:
    rule = parse_rule(every="1h")
    times = rule.upcoming(ms(REPEAT_DAY), 5)
    assert {b - a for a, b in itertools.pairwise(times)} == {3_600_000}
    assert [local(t)[11:] for t in times][:4] == [
        "01:00:00+02:00",
        "02:00:00+02:00",
        "02:00:00+01:00",
        "03:00:00+01:00",
    ]


# ------------------------------------------------------------------ rules, properties

times_ms = st.integers(min_value=0, max_value=4_102_444_800_000)  # 1970 to 2100
crons = st.sampled_from(
    ["* * * * *", "*/15 * * * *", "30 2 * * *", "0 9 * * 1-5", "15 2,3 * * *", "0 0 1 * *"]
)
zones = st.sampled_from(["UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe"])


@given(times_ms, st.integers(min_value=1000, max_value=10**9), st.integers(0, 10**12))
def test_every_next_is_the_first_multiple_strictly_after(t: int, every: int, anchor: int) -> None:
    rule = Rule(every_ms=every, anchor_ms=anchor)
    nxt = rule.next_after(t)
    assert t < nxt <= t + every
    assert (nxt - anchor) % every == 0


@settings(max_examples=150, deadline=None)
@given(times_ms, crons, zones)
def test_cron_next_is_strictly_after_and_nothing_lies_between(t: int, cron: str, tz: str) -> None:
    rule = parse_rule(cron=cron, tz=tz)
    nxt = rule.next_after(t)
    assert nxt > t
    assert nxt % 1000 == 0
    # asking from any time in between gives the same answer: no firing was skipped
    for probe in (t + 1, (t + nxt) // 2, nxt - 1):
        if t <= probe < nxt:
            assert rule.next_after(probe) == nxt
    # and the chain never stands still or goes back, DST or not
    assert rule.next_after(nxt) > nxt


@settings(max_examples=60, deadline=None)
@given(times_ms, crons, zones)
def test_a_chain_from_any_occurrence_is_the_same_chain(t: int, cron: str, tz: str) -> None:
    """Two workers handling copies of one occurrence publish the same next one."""
    rule = parse_rule(cron=cron, tz=tz)
    first = rule.upcoming(t, 4)
    assert rule.upcoming(first[0], 3) == first[1:]
    assert rule_of(rule.header()) == rule


def test_rule_errors_name_what_to_fix() -> None:
    with pytest.raises(RecurringError, match="either cron="):
        parse_rule()
    with pytest.raises(RecurringError, match="either cron="):
        parse_rule(cron="* * * * *", every="1m")
    with pytest.raises(RecurringError, match="5 fields"):
        parse_rule(cron="61 * * * *")
    with pytest.raises(RecurringError, match="IANA"):
        parse_rule(cron="0 9 * * *", tz="Mars/Olympus")
    with pytest.raises(RecurringError, match="at least 1s"):
        parse_rule(every="500ms")
    with pytest.raises(RecurringError, match="every="):
        parse_rule(every="soon")
    with pytest.raises(RecurringError, match="needs no time zone"):
        parse_rule(every="1m", tz="Europe/Berlin")
    with pytest.raises(RecurringError, match="name"):
        validate_name("has space")
    with pytest.raises(RecurringError, match="name"):
        validate_name("a@b")
    assert validate_name("reports.daily:eu/1-a_b") == "reports.daily:eu/1-a_b"


def test_longest_gap() -> None:
    assert parse_rule(every="15m").longest_gap_ms(0) == 900_000
    assert parse_rule(cron="0 9 * * 1-5").longest_gap_ms(0) == 3 * 86_400_000
    assert parse_rule(cron="0 0 1 1 *").longest_gap_ms(0) >= 365 * 86_400_000
    assert parse_rule(every="2s").describe() == "every 2s"
    assert parse_rule(cron="0  9 * * *").describe() == "cron 0 9 * * * (UTC)"


# ---------------------------------------------------------------------- occurrences

names = st.from_regex(r"[A-Za-z0-9._:/-]{1,40}", fullmatch=True)


@given(names, times_ms, st.sampled_from(["active", "paused"]), times_ms)
def test_occurrence_headers_round_trip(name: str, at: int, state: str, stamp: int) -> None:
    occurrence = Occurrence(name, at, Rule(every_ms=2000), "17-ab", state, stamp)  # type: ignore[arg-type]
    assert read_occurrence(occurrence.headers()) == occurrence
    assert occurrence.key == occurrence_key(name, at) == f"recurring:{name}@{at}"
    # AMQP may hand strings back as bytes
    raw = {k: v.encode() if isinstance(v, str) else v for k, v in occurrence.headers().items()}
    assert read_occurrence(raw) == occurrence


def test_plain_and_broken_occurrence_headers() -> None:
    assert read_occurrence({}) is None
    assert read_occurrence({"x": 1}) is None
    with pytest.raises(RecurringError):
        read_occurrence({RECURRING: "a", OCCURRENCE: "soon", CHAIN: "1-a"})
    good = Occurrence("a", 2000, Rule(every_ms=2000), "1-a").headers()
    with pytest.raises(RecurringError):
        read_occurrence({**good, STATE: "sleepy"})


def test_the_following_occurrence() -> None:
    occurrence = Occurrence("a", 4000, Rule(every_ms=2000), "1-a")
    following = occurrence.following("paused", 99)
    assert (following.at_ms, following.state, following.state_ms) == (6000, "paused", 99)
    assert following.chain == occurrence.chain


# ------------------------------------------------------------------ control records


def test_control_records_round_trip_and_old_readers_skip_them() -> None:
    rule = parse_rule(cron="0 9 * * *", tz="Europe/Berlin")
    records = [
        control_record("daily", "add", 10, rule=rule, chain="10-ab", destination="reports"),
        control_record("daily", "pause", 11),
        control_record("daily", "resume", 12),
        control_record("daily", "remove", 13),
    ]
    assert decode_records(encode_records(records)) == records
    line = encode_records(records[:1])
    assert b'"k":"recurring"' in line and b'"op":"add"' in line
    broken = decode_record(line.replace(b'"op":"add",', b""))
    assert broken is not None and not RecurringBook().extend([broken]).schedules  # passed over


# -------------------------------------------------------------------------- the fold


def occurrence_record(occurrence: Occurrence, message_id: str = "m") -> JournalRecord:
    return JournalRecord(
        "scheduled",
        message_id,
        "reports",
        occurrence.at_ms,
        headers=occurrence.headers(),
        recorded_at_ms=occurrence.at_ms - 2000,
    )


RULE = Rule(every_ms=2000)


def test_the_book_follows_control_records() -> None:
    book = RecurringBook()
    book.add(control_record("a", "add", 100, rule=RULE, chain="100-x", destination="d"))
    occurrence = Occurrence("a", 2000, RULE, "100-x", "active", 100)
    assert book.counts() == {"active": 1, "paused": 0}
    decision = book.decide(occurrence)
    assert decision.action == "run"
    assert decision.following == Occurrence("a", 4000, RULE, "100-x", "active", 100)

    book.add(control_record("a", "pause", 200))
    assert book.counts() == {"active": 0, "paused": 1}
    decision = book.decide(occurrence)
    assert (decision.action, decision.following) == (
        "skip",
        Occurrence("a", 4000, RULE, "100-x", "paused", 200),
    )
    book.add(control_record("a", "resume", 300))
    assert book.decide(occurrence).action == "run"
    book.add(control_record("a", "remove", 400))
    assert book.decide(occurrence).action == "drop"
    assert book.counts() == {"active": 0, "paused": 0}
    book.add(control_record("a", "resume", 500))  # a removed chain stays removed
    assert book.decide(occurrence).reason == "removed"


def test_the_chain_outlives_the_journal() -> None:
    """With no control record left (x-max-age), the headers' state decides."""
    book = RecurringBook()
    paused = Occurrence("a", 2000, RULE, "100-x", "paused", 200)
    assert book.decide(paused).action == "skip"
    book.add(occurrence_record(paused))
    assert book.counts() == {"active": 0, "paused": 1}
    assert book.listed()[0].next_occurrence(0) == 2000
    # a resume recorded later than the header's pause wins
    book.add(control_record("a", "resume", 300))
    assert book.decide(paused).action == "run"
    # a header state later than the journal's wins (its record not read here yet)
    assert book.decide(Occurrence("a", 4000, RULE, "100-x", "paused", 400)).action == "skip"


def test_a_new_chain_replaces_an_old_one() -> None:
    book = RecurringBook()
    book.add(control_record("a", "add", 100, rule=RULE, chain="100-x", destination="d"))
    book.add(control_record("a", "remove", 150))
    book.add(control_record("a", "add", 200, rule=RULE, chain="200-y", destination="d"))
    assert book.decide(Occurrence("a", 2000, RULE, "100-x")).reason == "replaced"
    assert book.decide(Occurrence("a", 2000, RULE, "200-y")).action == "run"
    # a chain newer than the book knows of (its add not read yet) runs by its headers
    assert book.decide(Occurrence("a", 2000, RULE, "300-z")).action == "run"
    # an old chain's occurrence record read late changes nothing
    book.add(occurrence_record(Occurrence("a", 2000, RULE, "100-x")))
    assert book.schedules["a"].chain == "200-y"


ops = st.lists(
    st.tuples(st.sampled_from(["a", "b"]), st.sampled_from(["add", "pause", "resume", "remove"])),
    max_size=12,
)


@given(ops, st.integers(min_value=0, max_value=12))
def test_the_book_is_idempotent(steps: list[tuple[str, str]], again: int) -> None:
    """Reading a prefix of the journal again (a tail that reconnects) changes nothing."""
    records = []
    for i, (name, op) in enumerate(steps):
        stamp = 1000 + i
        if op == "add":
            records.append(
                control_record(
                    name, "add", stamp, rule=RULE, chain=new_chain(stamp), destination="d"
                )
            )
        else:
            records.append(control_record(name, op, stamp))  # type: ignore[arg-type]
        records.append(occurrence_record(Occurrence(name, 2000 * (i + 1), RULE, f"{stamp}-o")))
    once = RecurringBook().extend(records)
    twice = RecurringBook().extend(records).extend(records[: again * 2])
    assert once.counts() == twice.counts()
    assert {n: (s.chain, s.state) for n, s in once.schedules.items()} == {
        n: (s.chain, s.state) for n, s in twice.schedules.items()
    }


def test_status_counts_recurring_schedules_when_asked() -> None:
    from dataclasses import replace

    from prometheus_client.parser import text_string_to_metric_families

    from rmqdelay.core.status import build_status, prometheus_text
    from rmqdelay.settings import Settings

    layout = Settings(prefix="shop", max_delay="10m").layout
    status = build_status(layout, {}, [], "test")
    assert "rmqdelay_recurring_schedules" not in prometheus_text(status)  # not asked
    asked = replace(status, recurring={"active": 2, "paused": 1})
    assert asked.to_json()["recurring"] == {"active": 2, "paused": 1}
    families = {f.name: f for f in text_string_to_metric_families(prometheus_text(asked))}
    samples = {s.labels["state"]: s.value for s in families["rmqdelay_recurring_schedules"].samples}
    assert samples == {"active": 2, "paused": 1}


# ------------------------------------------------------------- the calls, in memory


def test_the_calls_on_the_in_memory_publisher() -> None:
    import asyncio

    from rmqdelay.core.journal.keys import recurring_key
    from rmqdelay.settings import Settings
    from rmqdelay.testing import AsyncInMemoryPublisher, InMemoryPublisher

    # 3 days: "tomorrow at 08:59 UTC" then 09:00 in Berlin is up to 2 days 8 hours away
    # (after midnight UTC, in winter), which a max_delay of 2 days refused between 00:00
    # and 08:00 UTC; a weekly rule (7 days) is still over it
    settings = Settings(prefix="recur-mem", max_delay="3d")
    with InMemoryPublisher(settings) as publisher:
        added = publisher.add_recurring("poll", "jobs", b"poll", every="15m", headers={"a": "1"})
        assert added.outcome == "added" and added.next_ms is not None
        assert added.next_ms % 900_000 == 0
        (sent,) = publisher.sent
        assert sent.message_id == f"{recurring_key('poll', added.next_ms)}:" + str(
            sent.headers["rmqdelay-recurring-chain"]
        )
        assert sent.headers["a"] == "1" and sent.headers[RECURRING] == "poll"
        assert publisher.add_recurring("poll", "jobs", b"poll", every="15m").outcome == "exists"
        with pytest.raises(RecurringError, match="remove it first"):
            publisher.add_recurring("poll", "other", b"poll", every="15m")
        assert [s.name for s in publisher.list_recurring()] == ["poll"]
        assert publisher.pause_recurring("poll").outcome == "paused"
        assert publisher.list_recurring()[0].state == "paused"
        assert publisher.resume_recurring("poll").outcome == "resumed"
        removed = publisher.remove_recurring("poll")
        assert removed.cancelled == (sent.message_id,)
        assert publisher.list_recurring() == []
        # a second remove answers as the first did (as a second cancel does), writing nothing
        again = publisher.remove_recurring("poll")
        assert (again.outcome, again.cancelled) == ("removed", ())
        assert again.describe() == "poll: removed (every 15m to jobs)"
        assert publisher.pause_recurring("poll").outcome == "unknown"
        kinds = [(r.kind, r.data.get("op")) for r in publisher.journal if r.kind != "scheduled"]
        assert kinds == [
            ("recurring", "add"),
            ("recurring", "pause"),
            ("recurring", "resume"),
            ("recurring", "remove"),
            ("cancelled", None),
        ]
        # a first time: not before it (cron), counted from it (every)
        tomorrow = (datetime.now(UTC) + timedelta(days=1)).replace(microsecond=0)
        first_at = tomorrow.replace(hour=8, minute=59, second=0)
        nine = publisher.add_recurring(
            "nine", "jobs", b"x", cron="0 9 * * *", tz="Europe/Berlin", first_at=first_at
        )
        assert nine.next_ms is not None and nine.next_ms >= ms(first_at)
        assert local(nine.next_ms)[11:19] == "09:00:00"
        assert nine.next_ms - ms(first_at) <= 86_400_000
        every = publisher.add_recurring("from", "jobs", b"x", every="1h", first_at=tomorrow)
        assert every.next_ms == ms(tomorrow)
        (record,) = [
            r for r in publisher.journal if r.data.get("op") == "add" and r.message_id == "from"
        ]
        assert rule_of(record.data["rule"]).next_after(ms(tomorrow)) == ms(tomorrow) + 3_600_000
        with pytest.raises(RecurringError, match="longest delay"):
            publisher.add_recurring("weekly", "jobs", b"x", cron="0 9 * * 1")

    async def run() -> None:
        async with AsyncInMemoryPublisher(settings) as publisher:
            added = await publisher.add_recurring("tick", "jobs", b"t", every="2s")
            assert added.outcome == "added"
            assert (await publisher.pause_recurring("tick")).outcome == "paused"
            assert (await publisher.resume_recurring("tick")).outcome == "resumed"
            assert [s.state for s in await publisher.list_recurring()] == ["active"]
            assert (await publisher.remove_recurring("tick")).outcome == "removed"

    asyncio.run(run())
