"""Cancelling scheduled messages: the worker honours tombstones from the journal."""

from __future__ import annotations

import asyncio
import time

import aio_pika
from prometheus_client import REGISTRY
from worker_helpers import Calls, make_settings, parking_queue, queue_depth, wait_until, work_queue

from rmqdelay import AsyncPublisher, Context, Settings, Worker
from rmqdelay.amqp.journal import append_records_async, cancel_async
from rmqdelay.core.journal import JournalRecord

DEST = "cancellable"


def _tombstone(message_id: str, due_at_ms: int) -> JournalRecord:
    return JournalRecord("cancelled", message_id, DEST, due_at_ms, recorded_at_ms=due_at_ms)


async def _append(settings: Settings, records: list[JournalRecord]) -> None:
    connection = await aio_pika.connect(settings.url)
    try:
        await append_records_async(connection, settings.layout, records)
    finally:
        await connection.close()


async def test_a_cancelled_message_is_acked_without_calling_its_handler(
    amqp_url: str, prefix: str
) -> None:
    settings = make_settings(amqp_url, prefix, [DEST])
    app = Worker(settings)
    calls = Calls()

    @app.handler(DEST)
    async def handle(msg: dict[str, int], ctx: Context) -> None:
        calls.record(msg, ctx)

    cancelled = {"destination": DEST, "outcome": "cancelled"}
    before = REGISTRY.get_sample_value("rmqdelay_messages_total", cancelled) or 0
    async with AsyncPublisher(settings) as publisher, app.running(concurrency=2):
        gone = await publisher.publish(DEST, {"n": 1}, delay="1s")
        kept = await publisher.publish(DEST, {"n": 2}, delay="1s")
        await _append(settings, [_tombstone(gone.message_id, gone.due_at_ms)])
        await wait_until(lambda: len(calls) >= 1, 10, "the uncancelled message's call")
        await wait_until(
            lambda: REGISTRY.get_sample_value("rmqdelay_messages_total", cancelled) == before + 1,
            10,
            "the cancelled outcome",
        )
    assert [c.message_id for c in calls.items] == [kept.message_id]
    assert await queue_depth(settings, work_queue(settings, DEST)) == 0
    assert await queue_depth(settings, parking_queue(settings)) == 0


async def test_a_worker_started_after_the_cancel_still_honours_it(
    amqp_url: str, prefix: str
) -> None:
    settings = make_settings(amqp_url, prefix, [DEST])
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


async def test_cancel_answers_what_it_found(amqp_url: str, prefix: str) -> None:
    settings = make_settings(amqp_url, prefix, [DEST])
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
