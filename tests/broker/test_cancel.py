"""Cancelling scheduled messages: the worker honours tombstones from the journal.

Most tests share the module's topology, and so its journal: their message ids are their
own. Those that count the journal's tombstones, list it whole, or turn it off keep a
prefix of their own."""

from __future__ import annotations

import asyncio
import time

import aio_pika
import pytest
from prometheus_client import REGISTRY
from worker_helpers import (
    Calls,
    TestTopology,
    make_settings,
    parking_queue,
    queue_depth,
    wait_until,
    work_queue,
)

from rmqdelay import (
    AsyncPublisher,
    Backoff,
    ConfigurationError,
    Context,
    Publisher,
    Settings,
    Worker,
)
from rmqdelay.amqp.journal import append_records_async, cancel_async
from rmqdelay.core.journal import JournalRecord

DEST = "cancellable"


def _tombstone(message_id: str, due_at_ms: int, destination: str = DEST) -> JournalRecord:
    return JournalRecord("cancelled", message_id, destination, due_at_ms, recorded_at_ms=due_at_ms)


async def _append(settings: Settings, records: list[JournalRecord]) -> None:
    connection = await aio_pika.connect(settings.url)
    try:
        await append_records_async(connection, settings.layout, records)
    finally:
        await connection.close()


async def test_a_cancelled_message_is_acked_without_calling_its_handler(
    shared_topology: TestTopology,
) -> None:
    dest = shared_topology.dest(DEST)
    settings = shared_topology.settings([dest])
    app = Worker(settings)
    calls = Calls()

    @app.handler(dest)
    async def handle(msg: dict[str, int], ctx: Context) -> None:
        calls.record(msg, ctx)

    cancelled = {"destination": dest, "outcome": "cancelled"}
    before = REGISTRY.get_sample_value("rmqdelay_messages_total", cancelled) or 0
    async with AsyncPublisher(settings) as publisher, app.running(concurrency=2):
        gone = await publisher.publish(dest, {"n": 1}, delay="1s")
        kept = await publisher.publish(dest, {"n": 2}, delay="1s")
        await _append(settings, [_tombstone(gone.message_id, gone.due_at_ms, dest)])
        await wait_until(lambda: len(calls) >= 1, 10, "the uncancelled message's call")
        await wait_until(
            lambda: REGISTRY.get_sample_value("rmqdelay_messages_total", cancelled) == before + 1,
            10,
            "the cancelled outcome",
        )
    assert [c.message_id for c in calls.items] == [kept.message_id]
    assert await queue_depth(settings, work_queue(settings, dest)) == 0
    assert await queue_depth(settings, parking_queue(settings)) == 0


async def test_a_worker_started_after_the_cancel_still_honours_it(
    amqp_url: str, prefix: str
) -> None:
    settings = make_settings(amqp_url, prefix, [DEST])  # a journal of its own: one tombstone
    app = Worker(settings)
    calls = Calls()

    @app.handler(DEST)
    async def handle(msg: dict[str, int], ctx: Context) -> None:
        calls.record(msg, ctx)

    async with AsyncPublisher(settings) as publisher:
        gone = await publisher.publish(DEST, {"n": 1}, delay="1500ms")
        await _append(settings, [_tombstone(gone.message_id, gone.due_at_ms)])
    # the message falls due while no worker runs; one that starts later still knows
    await asyncio.sleep(max(0.0, gone.due_at_ms / 1000 - time.time()) + 0.3)
    assert await queue_depth(settings, work_queue(settings, DEST)) == 1
    cancelled = {"destination": DEST, "outcome": "cancelled"}
    before = REGISTRY.get_sample_value("rmqdelay_messages_total", cancelled) or 0
    async with app.running(concurrency=1) as runner:
        assert len(runner.tombstones) == 1
        await wait_until(
            lambda: REGISTRY.get_sample_value("rmqdelay_messages_total", cancelled) == before + 1,
            10,
            "the cancelled outcome",
        )
    assert calls.items == []
    assert await queue_depth(settings, work_queue(settings, DEST)) == 0


async def test_cancel_answers_what_it_found(shared_topology: TestTopology) -> None:
    settings = shared_topology.settings([])
    now = time.time_ns() // 10**6
    await _append(settings, [JournalRecord("scheduled", "later", DEST, now + 60_000)])
    connection = await aio_pika.connect(settings.url)
    try:
        results = await cancel_async(connection, settings.layout, ["later", "never"])
    finally:
        await connection.close()
    assert [(r.message_id, r.outcome, r.due_at_ms) for r in results] == [
        ("later", "cancelled", now + 60_000),
        ("never", "unknown", None),
    ]


async def test_publisher_cancel_before_due_means_the_handler_is_never_called(
    shared_topology: TestTopology,
) -> None:
    dest = shared_topology.dest(DEST)
    settings = shared_topology.settings([dest])
    app = Worker(settings)
    calls = Calls()

    @app.handler(dest)
    async def handle(msg: dict[str, int], ctx: Context) -> None:
        calls.record(msg, ctx)

    cancelled = {"destination": dest, "outcome": "cancelled"}
    before = REGISTRY.get_sample_value("rmqdelay_messages_total", cancelled) or 0
    async with AsyncPublisher(settings) as publisher, app.running(concurrency=2):
        gone = await publisher.publish(dest, {"n": 1}, delay="1500ms")
        kept = await publisher.publish(dest, {"n": 2}, delay="1500ms")
        [result] = await publisher.cancel(gone.message_id)
        assert (result.outcome, result.due_at_ms) == ("cancelled", gone.due_at_ms)
        await wait_until(lambda: len(calls) >= 1, 10, "the uncancelled message's call")
        await wait_until(
            lambda: REGISTRY.get_sample_value("rmqdelay_messages_total", cancelled) == before + 1,
            10,
            "the cancelled outcome",
        )
    assert [c.message_id for c in calls.items] == [kept.message_id]


async def test_a_cancel_during_the_third_retry_wait_stops_the_retries(
    shared_topology: TestTopology,
) -> None:
    dest = shared_topology.dest(DEST)
    settings = shared_topology.settings([dest])
    app = Worker(settings)
    calls = Calls()

    @app.handler(dest, max_attempts=6, backoff=Backoff.schedule(["200ms", "200ms", "2s"]))
    async def handle(msg: dict[str, int], ctx: Context) -> None:
        calls.record(msg, ctx)
        raise ConnectionError("downstream unavailable")

    async with AsyncPublisher(settings) as publisher, app.running(concurrency=2):
        sent = await publisher.publish(dest, {"n": 1}, delay=0)
        await wait_until(lambda: len(calls) >= 3, 10, "three calls")
        deadline = time.monotonic() + 5
        while not await publisher.list_scheduled(destination=dest):  # attempt 4's record
            assert time.monotonic() < deadline, "the fourth attempt was never scheduled"
            await asyncio.sleep(0.05)
        [result] = await publisher.cancel(sent.message_id)  # attempt 4 waits 2 s
        assert result.outcome == "cancelled"
        await asyncio.sleep(3.5)  # past the fourth attempt's due time, and some
    assert [c.attempt for c in calls.items] == [1, 2, 3]


def test_scheduled_list_shows_exactly_the_uncancelled_future_messages(
    amqp_url: str, prefix: str
) -> None:
    settings = make_settings(amqp_url, prefix, [DEST, "other"])  # lists its journal whole
    with Publisher(settings) as publisher:
        future = publisher.publish_many(
            {"destination": DEST if i % 2 else "other", "body": b"x", "delay": f"{60 + i}s"}
            for i in range(100)
        )
        now = publisher.publish_many(
            {"destination": DEST, "body": b"x", "delay": 0} for _ in range(100)
        )
        gone = [r.message_id for r in future[::3]]
        results = publisher.cancel(*gone, now[0].message_id)
        listed = publisher.list_scheduled()
        listed_dest = publisher.list_scheduled(destination=DEST, limit=10)
    assert [r.outcome for r in results] == ["cancelled"] * len(gone) + ["too late"]
    expected = [r for r in future if r.message_id not in set(gone)]
    assert [r.message_id for r in listed] == [r.message_id for r in expected]  # by due time
    assert [r.due_at_ms for r in listed] == [r.due_at_ms for r in expected]
    assert [r.message_id for r in listed_dest] == [
        r.message_id for r in expected if r.destination == DEST
    ][:10]


def test_with_the_journal_off_cancel_and_list_name_the_setting(amqp_url: str, prefix: str) -> None:
    settings = make_settings(amqp_url, prefix, [DEST], schedule_journal=False)
    with Publisher(settings) as publisher:
        publisher.publish(DEST, b"x", delay="1m")  # publishing works without it
        with pytest.raises(ConfigurationError, match="schedule_journal"):
            publisher.cancel("anything")
        with pytest.raises(ConfigurationError, match="schedule_journal"):
            publisher.list_scheduled()


def test_rmqdelay_consume_honours_cancels(shared_topology: TestTopology) -> None:
    from click.testing import CliRunner

    from rmqdelay.cli import app

    dest = shared_topology.dest(DEST)
    settings = shared_topology.settings([dest])
    with Publisher(settings) as publisher:
        gone = publisher.publish(dest, b"gone", delay="1s")
        kept = publisher.publish(dest, b"kept", delay="1200ms")
        assert publisher.cancel(gone.message_id)[0].outcome == "cancelled"
    env = {
        "RMQDELAY_URL": settings.url,
        "RMQDELAY_PREFIX": settings.prefix,
        "RMQDELAY_MAX_DELAY": "1h",
    }
    result = CliRunner().invoke(
        app, ["consume", dest, "--count", "1", "--timeout", "15", "--json"], env=env
    )
    assert result.exit_code == 0, result.output
    assert kept.message_id in result.stdout and gone.message_id not in result.stdout
    assert queue_depth_sync(settings, dest) == 0  # the cancelled one was acked, not left behind


def queue_depth_sync(settings: Settings, destination: str) -> int:
    return asyncio.run(queue_depth(settings, work_queue(settings, destination)))
