"""The asyncio publisher's journal linger on a real broker: concurrent publishes'
records go as one stream write, every record is there, and a write the broker refuses
fails every publish it recorded (the pure side: tests/unit/test_journal_linger.py)."""

from __future__ import annotations

import asyncio

import aio_pika
import pytest

from rmqdelay import AsyncPublisher, PublishError, Settings
from rmqdelay.core.journal.records import decode_records, journal_name
from tests.helpers.worker_helpers import make_settings

DEST = "lingered"


@pytest.fixture
def settings(amqp_url: str, prefix: str) -> Settings:
    # classic tiers: this test needs a work queue and the journal, not quorum tiers
    return make_settings(amqp_url, prefix, [DEST], max_delay="1m", queue_type="classic")


async def _stream_messages(settings: Settings, expected_records: int) -> list[int]:
    """The records in each stream message of the journal, read from its start."""
    connection = await aio_pika.connect(settings.url.get_secret_value())
    counts: list[int] = []
    try:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=1000)
        queue = await channel.get_queue(journal_name(settings.layout), ensure=False)
        async with queue.iterator(arguments={"x-stream-offset": "first"}) as messages:
            async for message in messages:
                counts.append(len(decode_records(message.body)))
                await message.ack()
                if sum(counts) >= expected_records:
                    break
    finally:
        await connection.close()
    return counts


async def _publish_together(settings: Settings, n: int) -> list[str]:
    """One publish, then ``n`` at once: the first's record goes at once (nothing was
    written within the linger), the others' wait for the rest of it."""
    async with AsyncPublisher(settings) as publisher:
        first = await publisher.publish(DEST, b"first", delay="30s")
        results = await asyncio.gather(
            *(publisher.publish(DEST, f"m{i}".encode(), delay="30s") for i in range(n))
        )
        listed = await publisher.list_scheduled(destination=DEST)
    listed_ids = sorted(r.message_id for r in listed if r.message_id != first.message_id)
    assert listed_ids == sorted(r.message_id for r in results)
    return [r.message_id for r in results]


async def test_concurrent_publishes_share_one_journal_write(settings: Settings) -> None:
    await _publish_together(settings.replace(journal_linger="200ms"), 20)
    first, *counts = await asyncio.wait_for(_stream_messages(settings, 21), 10)
    assert first == 1 and sum(counts) == 20
    assert len(counts) <= 2  # one write, or two if the linger's end cut them


async def test_without_a_linger_each_publish_writes_its_own(settings: Settings) -> None:
    await _publish_together(settings.replace(journal_linger=0), 20)
    counts = await asyncio.wait_for(_stream_messages(settings, 21), 10)
    assert counts == [1] * 21


async def test_a_refused_journal_write_fails_every_publish_it_recorded(
    settings: Settings,
) -> None:
    async with AsyncPublisher(settings.replace(journal_linger="200ms")) as publisher:
        await publisher.publish(DEST, b"first", delay="30s")  # the journal is checked once
        connection = await aio_pika.connect(settings.url.get_secret_value())
        try:
            channel = await connection.channel()
            await channel.queue_delete(journal_name(settings.layout))  # now returned
        finally:
            await connection.close()
        outcomes = await asyncio.gather(
            *(publisher.publish(DEST, b"x", delay="30s") for _ in range(3)),
            return_exceptions=True,
        )
    assert all(isinstance(o, PublishError) for o in outcomes), outcomes
    assert all("schedule journal record was not" in str(o) for o in outcomes)
