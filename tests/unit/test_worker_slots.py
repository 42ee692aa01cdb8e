"""The worker's handler slots: a wait is one future, handed over in order, and ends
with False once the worker stops consuming."""

from __future__ import annotations

import asyncio

import pytest

from rmqdelay.worker.slots import Slots


async def test_a_released_slot_goes_to_the_first_waiter() -> None:
    slots = Slots(1)
    assert await slots.acquire()
    second = asyncio.ensure_future(slots.acquire())
    third = asyncio.ensure_future(slots.acquire())
    await asyncio.sleep(0)
    assert not second.done() and not third.done()
    slots.release()
    assert await second is True
    assert not third.done()
    slots.release()
    assert await third is True
    slots.release()
    assert slots.free == 1


async def test_closing_ends_every_wait_with_false() -> None:
    slots = Slots(1)
    assert await slots.acquire()
    waiting = asyncio.ensure_future(slots.acquire())
    await asyncio.sleep(0)
    slots.close()
    assert await waiting is False
    assert await slots.acquire() is False


async def test_a_cancelled_waiter_handed_a_slot_passes_it_on() -> None:
    slots = Slots(1)
    assert await slots.acquire()
    cancelled = asyncio.ensure_future(slots.acquire())
    after = asyncio.ensure_future(slots.acquire())
    await asyncio.sleep(0)
    slots.release()  # handed to `cancelled`, which is cancelled before it resumes
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    assert await after is True
    assert slots.free == 0


async def test_a_slot_handed_just_before_closing_is_given_back() -> None:
    slots = Slots(1)
    assert await slots.acquire()
    waiting = asyncio.ensure_future(slots.acquire())
    await asyncio.sleep(0)
    slots.release()  # handed over...
    slots.close()  # ...and the worker stops before the waiter resumes
    assert await waiting is False
    assert slots.free == 1
