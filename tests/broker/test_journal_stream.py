"""The schedule journal stream on a real broker: written, read back to its end, followed."""

from __future__ import annotations

import asyncio
import json
import time
from typing import TypeVar

import aio_pika
import pika
import pytest

from rmqdelay import AsyncPublisher, ConfigurationError, Publisher, Settings, build_topology
from rmqdelay.amqp.journal import JournalTail, run_journal, run_journal_async
from rmqdelay.core.clock import now_ms
from rmqdelay.core.journal import flows
from rmqdelay.core.journal.reading import JournalFlow
from rmqdelay.core.journal.records import JournalRecord, encode_record, journal_name
from rmqdelay.core.journal.steps import stream_offset
from tests.helpers.cli import invoke, settings_env

T = TypeVar("T")


def _append(settings: Settings, records: list[JournalRecord]) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(settings.url.get_secret_value()))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        for record in records:
            channel.basic_publish(
                journal_name(settings.layout),
                "",
                encode_record(record),
                pika.BasicProperties(delivery_mode=2, message_id=record.message_id),
                mandatory=True,
            )
    finally:
        connection.close()


def _run(settings: Settings, flow: JournalFlow[T]) -> T:
    """A journal flow on pika: appends on one connection, each read on its own."""
    params = pika.URLParameters(settings.url.get_secret_value())
    connection = pika.BlockingConnection(params)
    try:
        return run_journal(flow, connection, lambda: pika.BlockingConnection(params))
    finally:
        connection.close()


async def _run_async(settings: Settings, flow: JournalFlow[T]) -> T:
    connection = await aio_pika.connect(settings.url.get_secret_value())
    try:
        return await run_journal_async(flow, connection)
    finally:
        await connection.close()


def _records(n: int, start: int = 0) -> list[JournalRecord]:
    now = time.time_ns() // 10**6
    return [
        JournalRecord("scheduled", f"m{i}", "orders", now + 60_000 + i, recorded_at_ms=now)
        for i in range(start, start + n)
    ]


@pytest.fixture
def settings(amqp_url: str, prefix: str) -> Settings:
    """Settings for this test's prefix, with the schedule journal declared as ``topology
    apply`` declares it, and nothing else: each test needs a journal of its own, and none
    needs the tiers (a topology's quorum queues)."""
    made = Settings(url=amqp_url, prefix=prefix, max_delay="1m", connection_name=prefix)
    topology = build_topology(made.layout)
    name = journal_name(made.layout)
    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        channel = connection.channel()
        for exchange in topology.exchanges:
            if exchange.name == name:
                channel.exchange_declare(
                    name, exchange.type, durable=True, arguments=dict(exchange.arguments)
                )
        [journal] = [q for q in topology.queues if q.role == "journal"]
        assert journal.name == name
        channel.queue_declare(name, durable=True, arguments=dict(journal.arguments))
        for binding in topology.bindings:
            if binding.destination == name:
                channel.queue_bind(name, binding.source, binding.routing_key)
    finally:
        connection.close()
    return made


def test_a_sync_read_returns_every_record_in_order_and_stops_at_its_own_marker(
    settings: Settings,
) -> None:
    written = _records(1200)  # over one ack batch and under one prefetch window
    _append(settings, written)
    first = _run(settings, flows.read(settings.layout, timeout=10))
    again = _run(settings, flows.read(settings.layout, timeout=10))
    assert first == written
    assert again == written  # the first reader's marker is not a record


async def test_an_async_read_sees_the_same_records(settings: Settings) -> None:
    written = _records(30)
    _append(settings, written)
    assert await _run_async(settings, flows.read(settings.layout, timeout=10)) == written


async def test_a_tail_catches_up_then_follows_new_records(settings: Settings) -> None:
    _append(settings, _records(5))
    seen: list[JournalRecord] = []
    connection = await aio_pika.connect(settings.url.get_secret_value())
    try:
        start = stream_offset(now_ms() - settings.layout.max_delay_ms)
        tail = await JournalTail(connection, settings.layout, seen.append, start=start).start()
        await asyncio.wait_for(tail.caught_up.wait(), 10)
        assert [r.message_id for r in seen] == [f"m{i}" for i in range(5)]
        later = _records(3, start=5)
        await asyncio.get_running_loop().run_in_executor(None, _append, settings, later)
        deadline = time.monotonic() + 10
        while len(seen) < 8 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert seen[5:] == later
        await tail.close()
    finally:
        await connection.close()


def test_reading_with_the_journal_off_names_the_setting(settings: Settings) -> None:
    off = settings.replace(schedule_journal=False)
    with pytest.raises(ConfigurationError, match="schedule_journal"):
        _run(off, flows.read(off.layout))


def test_cancel_answers_and_list_leaves_out_what_was_cancelled_or_is_past(
    settings: Settings,
) -> None:
    now = time.time_ns() // 10**6
    ahead = [JournalRecord("scheduled", f"a{i}", "orders", now + 60_000 - i) for i in range(4)]
    past = JournalRecord("scheduled", "past", "orders", now - 1)
    _append(settings, [*ahead, past])
    with Publisher(settings) as publisher:
        results = publisher.cancel("a1", "past", "nobody")
        assert [(r.message_id, r.outcome) for r in results] == [
            ("a1", "cancelled"),
            ("past", "too late"),
            ("nobody", "unknown"),
        ]
        assert results[0].due_at_ms == now + 60_000 - 1
        listed = publisher.list_scheduled()
        assert [r.message_id for r in listed] == ["a3", "a2", "a0"]  # soonest first
        assert publisher.cancel("a1")[0].outcome == "cancelled"


async def test_async_cancel_and_list(settings: Settings) -> None:
    now = time.time_ns() // 10**6
    _append(
        settings, [JournalRecord("scheduled", f"b{i}", "orders", now + 60_000) for i in range(3)]
    )
    async with AsyncPublisher(settings) as publisher:
        results = await publisher.cancel("b0")
        assert [r.outcome for r in results] == ["cancelled"]
        listed = await publisher.list_scheduled(limit=5)
        assert [r.message_id for r in listed] == ["b1", "b2"]


def test_the_cli_lists_and_cancels_and_exits_0_only_when_all_were_cancelled(
    settings: Settings,
) -> None:
    now = time.time_ns() // 10**6
    _append(
        settings,
        [JournalRecord("scheduled", f"c{i}", "orders", now + 60_000 + i) for i in range(3)],
    )
    env = settings_env(settings)
    done = invoke(env, "cancel", "c0", "--json")
    assert done.exit_code == 0, done.output
    assert '"outcome":"cancelled"' in done.output
    mixed = invoke(env, "cancel", "c1", "nobody")
    assert mixed.exit_code == 1
    assert "c1: cancelled" in mixed.output and "nobody: unknown" in mixed.output
    listed = invoke(env, "scheduled", "list", "--json")
    assert listed.exit_code == 0, listed.output
    assert [line.split('"')[3] for line in listed.output.splitlines()] == ["c2"]
    off = invoke({**env, "RMQDELAY_SCHEDULE_JOURNAL": "false"}, "scheduled", "list")
    assert off.exit_code == 1 and "schedule_journal" in off.output


def _partition_journal(settings: Settings) -> tuple[int, list[str]]:
    """Issue 17's sequence on the stream: 20 ids in flight, each with three records, due
    D, then D + 60.4 s (the copy finally confirmed), then D + 30.2 s appended last (a
    publish whose confirm had failed, recorded after the partition). For p0..p4, D was
    31 s ago: only the confirmed copy is ahead (the five the latest-record fold hid);
    for p5..p19, D was 1 s ago: the late and the confirmed copy are ahead."""
    now = time.time_ns() // 10**6
    first = {f"p{i}": now - (31_000 if i < 5 else 1_000) for i in range(20)}
    _append(settings, [JournalRecord("scheduled", "before", "orders", now + 90_000)])
    for offset in (0, 60_400, 30_200):
        _append(
            settings,
            [
                JournalRecord("scheduled", m, "orders", d + offset, recorded_at_ms=now)
                for m, d in first.items()
            ],
        )
    return now - 31_000, list(first)


def test_after_a_partition_list_shows_every_copy_ahead_and_cancel_stops_each(
    settings: Settings, amqp_url: str
) -> None:
    d, ids = _partition_journal(settings)
    confirmed, late = d + 60_400, d + 30_200
    with Publisher(settings) as publisher:
        listed = publisher.list_scheduled()
        by_id: dict[str, list[int]] = {}
        for record in listed:
            by_id.setdefault(record.message_id, []).append(record.due_at_ms)
        assert [by_id[m] for m in ids[:5]] == [[confirmed]] * 5  # the five the bug hid
        assert [by_id[m] for m in ids[5:]] == [[late + 30_000, confirmed + 30_000]] * 15
        [stopped, both] = publisher.cancel("p0", "p5")
        assert (stopped.outcome, stopped.due_at_ms, stopped.copies) == ("cancelled", confirmed, 3)
        assert stopped.cancelled_due_ms == (confirmed,)
        assert (both.outcome, both.copies) == ("cancelled", 3)
        assert both.cancelled_due_ms == (late + 30_000, confirmed + 30_000)
        read = _run(settings, flows.read(settings.layout))
        tombstones = [r for r in read if r.kind == "cancelled"]
        assert [(t.message_id, t.named_due_times()) for t in tombstones] == [
            ("p0", (d, late, confirmed)),
            ("p5", (d + 30_000, late + 30_000, confirmed + 30_000)),
        ]
        after = {r.message_id for r in publisher.list_scheduled()}
        assert "p0" not in after and "p5" not in after and "p1" in after and "p6" in after

    env = settings_env(settings, url=amqp_url)
    rows = invoke(env, "scheduled", "list", "--json")
    assert rows.exit_code == 0, rows.output
    p6 = [json.loads(line) for line in rows.output.splitlines() if '"p6"' in line]
    assert [(r["due_at_ms"], r["copy"], r["copies"]) for r in p6] == [
        (late + 30_000, 1, 2),
        (confirmed + 30_000, 2, 2),
    ]
    table = invoke(env, "scheduled", "list", "-d", "orders")
    assert table.exit_code == 0, table.output
    assert "copy" in table.output and "2/2" in table.output
    assert "15 message id(s) with more than one copy ahead" not in table.output  # p5 gone
    assert "14 message id(s) with more than one copy ahead" in table.output
    said = invoke(env, "cancel", "p6", "p1")
    assert said.exit_code == 0, said.output
    assert "p6: cancelled 2 copies (were due" in said.output
    assert "; 1 more already due)" in said.output
    assert "p1: cancelled (was due" in said.output


async def test_async_list_and_cancel_see_every_copy_too(settings: Settings, amqp_url: str) -> None:
    d, _ = _partition_journal(settings)
    confirmed = d + 60_400
    async with AsyncPublisher(settings) as publisher:
        listed = await publisher.list_scheduled()
        assert [r.due_at_ms for r in listed if r.message_id == "p3"] == [confirmed]
        assert len(listed) == 5 + 2 * 15 + 1
        [result] = await publisher.cancel("p3")
        assert (result.outcome, result.copies, result.cancelled_due_ms) == (
            "cancelled",
            3,
            (confirmed,),
        )
        after = await publisher.list_scheduled()
        assert [r for r in after if r.message_id == "p3"] == []
        assert len(after) == len(listed) - 1


@pytest.mark.parametrize("way", ["pika-internals", "public-drain"])
def test_a_read_stopped_early_closes_its_connection_cleanly(
    settings: Settings,
    way: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A read that stops while the broker still sends (its prefetch far from used) leaves
    deliveries in pika's buffer: closed, pika would reject them, and a stream answers a
    reject by closing the whole connection (540, logged at ERROR). Dropped instead, by
    pika's internals or, on a pika not checked, by draining first."""
    from rmqdelay.amqp import pika_private
    from rmqdelay.amqp.streams import Readers
    from rmqdelay.core.journal.steps import Read, StreamMessage

    if way == "public-drain":
        monkeypatch.setattr(pika_private, "drop_deliveries", lambda _channel: False)
    _append(settings, _records(3000))
    caplog.set_level("WARNING", logger="pika")
    taken: list[StreamMessage] = []

    def take(message: StreamMessage) -> bool:
        taken.append(message)
        return len(taken) >= 10

    connection = pika.BlockingConnection(pika.URLParameters(settings.url.get_secret_value()))
    readers = Readers(lambda: connection)
    try:
        assert readers.read(Read(journal_name(settings.layout), "first", take, 10.0)) == "done"
        assert connection.is_open
    finally:
        readers.close()
    assert connection.is_closed and len(taken) == 10
    refused = [r.getMessage() for r in caplog.records if "NOT_IMPLEMENTED" in r.getMessage()]
    assert not refused
