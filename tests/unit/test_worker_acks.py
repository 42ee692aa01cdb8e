"""The worker's Acker on a stand-in channel: what goes on the wire, and when."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest

from rmqdelay.core.wire import encode_acks
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


# ---------------------------------------------------------------- frames made late


class Underlay(Wire):
    """An aiormq channel as the made-late acks see it: the connection's write queue (a
    stand-in writer takes from it, as aiormq's does), its number, its future store."""

    def __init__(self, maxsize: int = 10) -> None:
        super().__init__()
        self.write_queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=maxsize)
        self.number = 3
        self.is_closed = False
        self._close_exception: BaseException | None = None
        self.written: list[bytes] = []

    def create_future(self) -> asyncio.Future[Any]:
        return asyncio.get_running_loop().create_future()

    def write_all(self) -> None:
        """aiormq's writer: each queued frame's bytes written, then its drain resolved."""
        while not self.write_queue.empty():
            frame = self.write_queue.get_nowait()
            self.written.append(frame.payload)
            frame.drain()


async def settle_turns(turns: int = 3) -> None:
    for _ in range(turns):
        await asyncio.sleep(0)


async def test_a_frame_made_late_carries_every_ack_asked_for_until_the_writer_takes_it() -> None:
    wire = Underlay()
    acker = Acker(wire)
    m = delivered(acker, wire, 5)
    first = [asyncio.ensure_future(acker.ack(x)) for x in m[:2]]
    await settle_turns()
    assert wire.write_queue.qsize() == 1  # queued at the first ack, not made yet
    later = [asyncio.ensure_future(acker.ack(x)) for x in m[2:]]
    await settle_turns()
    assert wire.write_queue.qsize() == 1  # the later acks join the queued frame
    assert not any(t.done() for t in first + later)  # nothing is written yet
    wire.write_all()
    await asyncio.gather(*first, *later)
    assert wire.written == [encode_acks(3, 5, 5, ())]
    assert wire.frames == []  # no basic_ack
    assert acker.frames == acker.made_late == 1 and len(acker.ledger) == 0


async def test_acks_after_the_writer_took_a_frame_go_in_the_next_and_a_gap_splits_them() -> None:
    """3 still runs: 1-2 as one multiple ack, 4 alone; 5 comes after the write, in the
    next frame, alone too (3 still runs); then 3 covers 3-5 without acking 4 or 5 twice."""
    wire = Underlay()
    acker = Acker(wire)
    m = delivered(acker, wire, 5)
    batch = [asyncio.ensure_future(acker.ack(x)) for x in (m[0], m[1], m[3])]
    await settle_turns()
    wire.write_all()
    await asyncio.gather(*batch)
    assert wire.written == [encode_acks(3, 2, 2, (4,))]
    fifth = asyncio.ensure_future(acker.ack(m[4]))
    await settle_turns()
    wire.write_all()
    await fifth
    third = asyncio.ensure_future(acker.ack(m[2]))
    await settle_turns()
    wire.write_all()
    await third
    assert wire.written[1:] == [encode_acks(3, None, 0, (5,)), encode_acks(3, 3, 1, ())]
    assert acker.made_late == 4 and len(acker.ledger) == 0


async def test_a_frame_made_late_is_made_once_whoever_reads_it() -> None:
    wire = Underlay()
    acker = Acker(wire)
    (one,) = delivered(acker, wire, 1)
    waiter = asyncio.ensure_future(acker.ack(one))
    await settle_turns()
    frame = wire.write_queue.get_nowait()
    assert "queued" in repr(frame)
    assert frame.payload == frame.payload == encode_acks(3, 1, 1, ())
    assert "made" in repr(frame)
    frame.drain()
    await waiter
    assert acker.made_late == 1


async def test_a_channel_closed_before_the_writer_takes_the_frame_fails_its_acks() -> None:
    wire = Underlay()
    acker = Acker(wire)
    m = delivered(acker, wire, 2)
    waiters = [asyncio.ensure_future(acker.ack(x)) for x in m]
    await settle_turns()
    wire._close_exception = ConnectionError("the broker closed the channel")
    wire.write_all()
    results = await asyncio.gather(*waiters, return_exceptions=True)
    assert all(isinstance(r, ConnectionError) for r in results), results
    assert wire.written == [b""] and acker.made_late == 0  # nothing was sent


async def test_a_frame_failed_while_queued_leaves_the_next_acks_to_a_new_one() -> None:
    """The channel's store fails the frame's future (the connection is lost) before the
    writer takes it: its acks fail, and if the writer reads it after all, it is empty."""
    wire = Underlay()
    acker = Acker(wire)
    m = delivered(acker, wire, 2)
    first = asyncio.ensure_future(acker.ack(m[0]))
    await settle_turns()
    stale = wire.write_queue.get_nowait()
    stale.drain_future.set_exception(ConnectionError("lost"))
    with pytest.raises(ConnectionError):
        await first
    second = asyncio.ensure_future(acker.ack(m[1]))
    await settle_turns()
    assert stale.payload == b""  # read late: it takes nothing from the next frame
    wire.write_all()
    await second
    assert wire.written == [encode_acks(3, None, 0, (2,))]


async def test_a_cancelled_waiter_leaves_its_frame_made_late_to_the_others() -> None:
    wire = Underlay()
    acker = Acker(wire)
    first, second = delivered(acker, wire, 2)
    cancelled = asyncio.ensure_future(acker.ack(first))
    kept = asyncio.ensure_future(acker.ack(second))
    await settle_turns()
    cancelled.cancel()
    await settle_turns()
    wire.write_all()
    await kept
    assert wire.written == [encode_acks(3, 2, 2, ())]
    with pytest.raises(asyncio.CancelledError):
        await cancelled


async def test_a_full_write_queue_sends_through_basic_ack() -> None:
    wire = Underlay(maxsize=1)
    wire.write_queue.put_nowait(object())  # a frame of another channel's, not yet written
    acker = Acker(wire)
    messages = delivered(acker, wire, 3)
    await asyncio.gather(*(acker.ack(m) for m in messages))
    assert wire.frames == [(3, True)] and acker.made_late == 0


@pytest.mark.parametrize("value", ["0", "off"])
async def test_client_fast_0_sends_acks_through_basic_ack(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("RMQDELAY_CLIENT_FAST", value)
    wire = Underlay()
    acker = Acker(wire)
    messages = delivered(acker, wire, 3)
    await asyncio.gather(*(acker.ack(m) for m in messages))
    assert wire.frames == [(3, True)] and wire.write_queue.empty() and acker.made_late == 0


async def test_a_bare_exception_of_a_closing_channel_is_a_lost_connection() -> None:
    """aiormq fails a frame's drain with its connection's closing reason, at times a bare
    ``Exception``: the acks and rejects raise ConnectionError instead, which the settling
    knows (``SETTLE_ERRORS``); any other error is raised as it was."""
    from rmqdelay.worker.settle import SETTLE_ERRORS

    wire = Wire(fail=Exception())
    acker = Acker(wire)
    [first, second] = delivered(acker, wire, 2)
    with pytest.raises(ConnectionError) as raised:
        await acker.ack(first)
    assert isinstance(raised.value, SETTLE_ERRORS)

    async def closing(requeue: bool = False) -> None:
        raise Exception

    second.reject = closing
    with pytest.raises(ConnectionError) as rejected:
        await acker.reject(second, requeue=True)
    assert type(rejected.value.__cause__) is Exception

    wire.fail = ValueError("other")
    third = Message(3, wire)
    acker.delivered(third)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="other"):
        await acker.ack(third)  # type: ignore[arg-type]
