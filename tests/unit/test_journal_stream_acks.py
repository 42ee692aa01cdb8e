"""How a stream consumer acks (rmqdelay/amqp/aio_streams.py, ``AsyncStream``, as a worker's
tail follows the journal): never a tag below one already acked, whatever order its
callbacks' writes finish in, and once live, one ack for what came within ``LIVE_ACK_S``,
not one per record."""

from __future__ import annotations

import asyncio
import random
from typing import Any

from rmqdelay.amqp import aio_streams as streams
from rmqdelay.amqp.aio_streams import LIVE_ACK_S, AsyncStream


class Delivered:
    """A stream delivery whose ack takes a random while to reach the wire, as a write
    waiting on aiormq's full write queue does."""

    def __init__(self, tag: int, wire: list[int], rng: random.Random) -> None:
        self.delivery_tag = tag
        self.body = b""
        self.headers = {"x-stream-offset": 1000 + tag}  # the broker stamps each delivery
        self.wire, self.rng = wire, rng

    async def ack(self, multiple: bool = False) -> None:
        assert multiple
        await asyncio.sleep(self.rng.random() / 1000)
        self.wire.append(self.delivery_tag)


async def deliver(stream: AsyncStream, count: int, wire: list[int], seed: int) -> None:
    """Each delivery's callback as a task of its own, as aio-pika runs them."""
    rng = random.Random(seed)
    messages: list[Any] = [Delivered(tag, wire, rng) for tag in range(1, count + 1)]
    await asyncio.gather(*(asyncio.create_task(stream._on_message(m)) for m in messages))


async def test_acks_reach_the_wire_in_rising_order_whatever_the_writes_do(
    monkeypatch: Any,
) -> None:
    monkeypatch.setattr(streams, "ACK_EVERY", 3)
    for seed in range(20):
        wire: list[int] = []
        stream = AsyncStream()
        stream.follow(lambda message: None)
        await deliver(stream, 60, wire, seed)
        assert wire == sorted(set(wire)), f"seed {seed}: acks {wire}"
        assert wire[-1] == 60
        assert stream.offset == 1060  # the latest offset read: a reader's end is known


async def test_a_live_tail_acks_once_for_what_came_within_its_window() -> None:
    wire: list[int] = []
    stream = AsyncStream()
    stream.follow(lambda message: None)
    stream.live = True
    await deliver(stream, 200, wire, 1)
    assert wire == []  # nothing yet: the flush is due within LIVE_ACK_S
    await asyncio.sleep(LIVE_ACK_S + 0.05)
    assert wire == [200]
    await deliver(stream, 0, wire, 2)
    await stream.close()
