"""The worker's Acker on a stand-in channel: what goes on the wire, and when."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest

from rmqdelay.worker.acks import Acker


@dataclass
class Wire:
    """A channel's ``basic_ack``: records each frame; ``fail`` makes it raise."""

    frames: list[tuple[int, bool]] = field(default_factory=list)
    fail: BaseException | None = None

    async def basic_ack(self, tag: int, multiple: bool = False) -> None:
        if self.fail is not None:
            raise self.fail
        self.frames.append((tag, multiple))


@dataclass
class Message:
    """What the Acker reads of a delivery, and its reject."""

    delivery_tag: int
    wire: Wire
    rejected: list[int] = field(default_factory=list)

    async def reject(self, requeue: bool = False) -> None:
        self.wire.frames.append((-self.delivery_tag, False))

    async def nack(self, requeue: bool = True) -> None:
        self.wire.frames.append((-self.delivery_tag, False))


def delivered(acker: Acker, wire: Wire, count: int) -> list[Any]:
    messages = [Message(tag, wire) for tag in range(1, count + 1)]
    for message in messages:
        acker.delivered(message)  # type: ignore[arg-type]
    return messages


async def test_acks_asked_for_in_one_turn_go_as_one_multiple_ack() -> None:
    wire = Wire()
    acker = Acker(wire)
    messages = delivered(acker, wire, 5)
    await asyncio.gather(*(acker.ack(m) for m in messages))
    assert wire.frames == [(5, True)]
    assert acker.frames == 1


async def test_a_handler_still_running_splits_the_batch() -> None:
    """3 still runs: 1-2 go as one, 4-5 alone; then 3, alone, once it is done."""
    wire = Wire()
    acker = Acker(wire)
    m = delivered(acker, wire, 5)
    await asyncio.gather(*(acker.ack(x) for x in (m[0], m[1], m[3], m[4])))
    assert wire.frames == [(2, True), (4, False), (5, False)]
    await acker.ack(m[2])
    assert wire.frames[3:] == [(3, False)]


async def test_a_reject_goes_alone_and_never_under_a_multiple_ack() -> None:
    wire = Wire()
    acker = Acker(wire)
    m = delivered(acker, wire, 3)
    await asyncio.gather(acker.ack(m[0]), acker.reject(m[1], requeue=True), acker.ack(m[2]))
    reject = wire.frames.index((-2, False))
    covering = [i for i, (tag, multiple) in enumerate(wire.frames) if multiple and tag >= 2]
    assert all(i > reject for i in covering), wire.frames  # only once the reject is out
    assert sorted(tag for tag, _ in wire.frames if tag > 0)[-1] == 3
    assert acker.settled(m[1]) and acker.ledger.pending == 0


async def test_a_failed_send_reaches_every_waiter_of_its_batch() -> None:
    wire = Wire(fail=ConnectionError("gone"))
    acker = Acker(wire)
    messages = delivered(acker, wire, 3)
    results = await asyncio.gather(*(acker.ack(x) for x in messages), return_exceptions=True)
    assert all(isinstance(r, ConnectionError) for r in results)


async def test_one_cancelled_waiter_does_not_cancel_the_batch() -> None:
    wire = Wire()
    acker = Acker(wire)
    first, second = delivered(acker, wire, 2)
    cancelled = asyncio.ensure_future(acker.ack(first))
    kept = asyncio.ensure_future(acker.ack(second))
    await asyncio.sleep(0)
    cancelled.cancel()
    await kept
    assert wire.frames == [(2, True)]
    with pytest.raises(asyncio.CancelledError):
        await cancelled
