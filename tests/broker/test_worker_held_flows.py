"""What a worker does besides handling, for a held destination: retries, parking, keys,
reschedules, take-backs and the consumer timeout behave as they do for the tiers.

Held messages wait in the worker up to a window before their due time, so each flow is
checked where the wait meets it: a retry is planned held too and held again; a copy
cancelled, superseded or moved while held is skipped when it falls due; a message the
broker takes back while held comes back and is held for what remains, never early.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from datetime import datetime, timezone
from typing import Any

import pytest

from rmqdelay import AsyncPublisher, Backoff
from rmqdelay.core.clock import now_ms
from rmqdelay.worker.context import Context
from tests.broker.test_worker_held import INSIDE_MS, LATE_MS, held_case, held_gauge
from tests.helpers.brokerctl import BrokerAdmin
from tests.helpers.consumer_timeouts import NodeTimeout, ShortTimeoutOnce, by_consumer_argument
from tests.helpers.worker_helpers import (
    TestTopology,
    drain,
    parking_queue,
    queue_depth,
    wait_until,
    work_queue,
)


def _at(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, timezone.utc)


class _Handled:
    """Each handler call: message id, attempt, when, and the due time it carried."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, int, int | None]] = []

    def __call__(self, ctx: Context) -> None:
        due = None if ctx.due_at is None else int(ctx.due_at.timestamp() * 1000)
        self.calls.append((ctx.message_id, ctx.attempt, now_ms(), due))

    def early(self) -> list[tuple[str, int, int, int | None]]:
        return [c for c in self.calls if c[3] is not None and c[2] < c[3]]


async def test_retries_of_a_held_message_are_held_too_and_never_early(
    shared_topology: TestTopology,
) -> None:
    """Backoffs inside and past the window: each retry is planned held (rounded down to
    the window) and the worker waits out the rest of it."""
    case = held_case(shared_topology)
    dest, settings, app, _calls = case
    handled = _Handled()
    backoffs = ("1500ms", "3300ms")

    @app.handler(dest, max_attempts=3, backoff=Backoff.schedule(list(backoffs)))
    async def handle(msg: dict[str, int], ctx: Context) -> None:
        handled(ctx)
        if ctx.attempt < 3:
            raise ConnectionError(f"downstream unavailable (attempt {ctx.attempt})")

    async with case.running(concurrency=2) as publisher:
        sent = await publisher.publish(dest, {"n": 1}, delay=f"{INSIDE_MS}ms")
        await wait_until(lambda: len(handled.calls) >= 3, 20, "three attempts")
    assert [c[1] for c in handled.calls] == [1, 2, 3]
    assert {c[0] for c in handled.calls} == {sent.message_id}
    assert not handled.early(), handled.early()
    for _, _, at, due in handled.calls:
        assert due is not None and at - due <= LATE_MS
    gaps = [b[2] - a[2] for a, b in itertools.pairwise(handled.calls)]
    assert gaps[0] >= 1500 and gaps[1] >= 3300, gaps
    assert await queue_depth(settings, work_queue(settings, dest)) == 0
    assert await queue_depth(settings, parking_queue(settings)) == 0


async def test_a_held_message_that_always_fails_is_parked_once_its_attempts_are_spent(
    shared_topology: TestTopology,
) -> None:
    case = held_case(shared_topology)
    dest, settings, app, _calls = case
    handled = _Handled()

    @app.handler(dest, max_attempts=2, backoff=Backoff.constant("2s"))
    async def handle(msg: dict[str, int], ctx: Context) -> None:
        handled(ctx)
        raise ValueError(f"cannot charge card (attempt {ctx.attempt})")

    parking = parking_queue(settings)
    async with case.running(concurrency=2) as publisher:
        sent = await publisher.publish(dest, {"n": 1}, delay=f"{INSIDE_MS}ms")
        await wait_until(lambda: len(handled.calls) >= 2, 15, "two attempts")
        await wait_until(lambda: held_gauge(dest) == 0, 5, "nothing held")
        deadline = asyncio.get_running_loop().time() + 10
        while await queue_depth(settings, parking) < 1:
            assert asyncio.get_running_loop().time() < deadline, "never parked"
            await asyncio.sleep(0.05)
    assert [c[1] for c in handled.calls] == [1, 2]
    assert not handled.early()
    [parked] = await drain(settings, parking)
    assert parked.message_id == sent.message_id
    assert "gave up after 2 of 2 attempts" in str(parked.headers["rmqdelay-parked-reason"])
    assert await queue_depth(settings, work_queue(settings, dest)) == 0


async def test_a_key_replaced_while_its_first_copy_is_held_is_handled_once_as_replaced(
    shared_topology: TestTopology,
) -> None:
    """Both copies are held; when each falls due the keys filter decides: the first,
    superseded, is dropped; the replacement is handled once, at its own time."""
    case = held_case(shared_topology)
    dest, _settings, app, _calls = case
    handled = _Handled()
    bodies: list[Any] = []

    @app.handler(dest)
    async def handle(msg: dict[str, int], ctx: Context) -> None:
        handled(ctx)
        bodies.append(msg)

    key = f"{dest}-order-1"
    async with case.running(concurrency=2) as publisher:
        first = await publisher.publish(
            dest, {"v": 1}, delay=f"{INSIDE_MS}ms", key=key, on_conflict="replace"
        )
        second = await publisher.publish(dest, {"v": 2}, delay="2s", key=key, on_conflict="replace")
        assert second.message_id != first.message_id
        await wait_until(lambda: len(handled.calls) >= 1, 10, "the replacement handled")
        # room for the superseded copy, due last, to show up wrongly
        await wait_until(lambda: held_gauge(dest) == 0, 10, "nothing held")
        await asyncio.sleep(0.3)
    assert bodies == [{"v": 2}], bodies
    assert [c[0] for c in handled.calls] == [second.message_id]
    assert not handled.early()


async def test_a_held_message_rescheduled_later_or_earlier_is_handled_once_at_its_new_time(
    shared_topology: TestTopology,
) -> None:
    """One moved later while the worker holds it (its held copy is dropped when it falls
    due, and the new one held in turn), one moved earlier from the tiers to a time inside
    the window (a fresh copy from the journal's body, held to the new time)."""
    case = held_case(shared_topology)
    dest, settings, app, _calls = case
    handled = _Handled()

    @app.handler(dest)
    async def handle(msg: dict[str, int], ctx: Context) -> None:
        handled(ctx)

    async with AsyncPublisher(settings) as publisher, app.running(concurrency=2) as runner:
        later = await publisher.publish(dest, {"n": 1}, delay=f"{INSIDE_MS}ms")
        earlier = await publisher.publish(dest, {"n": 2}, delay="9s")
        await wait_until(lambda: runner.held >= 1, 5, "the first held")
        moved_later = await publisher.reschedule(later.message_id, delay="4s")
        moved_earlier = await publisher.reschedule(earlier.message_id, delay="1500ms")
        assert moved_later.outcome == "rescheduled", moved_later
        assert moved_earlier.outcome == "rescheduled", moved_earlier
        assert moved_later.due_at_ms is not None and moved_earlier.due_at_ms is not None
        new_due = {
            later.message_id: moved_later.due_at_ms,
            earlier.message_id: moved_earlier.due_at_ms,
        }
        await wait_until(lambda: len(handled.calls) >= 2, 10, "both handled")
        # the earlier one's old copy is due at 9 s: wait past it, then nothing more
        wait_s = (earlier.due_at_ms - now_ms()) / 1000 + 0.5
        await asyncio.sleep(max(0.0, wait_s))
        await wait_until(lambda: held_gauge(dest) == 0, 5, "nothing held")
    ids = [c[0] for c in handled.calls]
    assert sorted(ids) == sorted(new_due), handled.calls
    for message_id, _attempt, at, _due in handled.calls:
        assert new_due[message_id] <= at <= new_due[message_id] + LATE_MS, (message_id, at)


@pytest.mark.whole_node
async def test_a_held_message_taken_back_by_the_consumer_timeout_is_held_again_for_the_rest(
    shared_topology: TestTopology,
    admin: BrokerAdmin,
    broker_version: tuple[int, ...],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The consumer timeout (1 s) is shorter than the hold: the broker takes the held
    message back (4.3: cancels the consumer; before: closes the channel). The worker drops
    it from its heap, consumes again, holds the redelivery for what remains and handles it
    once, at its due time; the take-back is not a handling."""
    timeout_ms = 1000
    new = by_consumer_argument(broker_version)
    node = NodeTimeout(admin)
    if not new:
        node.require()
    hooks = [] if new else [ShortTimeoutOnce(node, timeout_ms)]
    case = held_case(shared_topology, options={"hooks": hooks})
    dest, settings, app, _calls = case
    handled = _Handled()

    @app.handler(dest)
    async def handle(msg: dict[str, int], ctx: Context) -> None:
        handled(ctx)

    caplog.set_level(logging.INFO, "rmqdelay.worker")
    options: dict[str, Any] = {"concurrency": 2}
    if new:
        options["consumer_timeout"] = timeout_ms / 1000
    try:
        async with AsyncPublisher(settings) as publisher, app.running(**options) as runner:
            sent = await publisher.publish(dest, {"n": 1}, delay=f"{INSIDE_MS}ms")
            await wait_until(lambda: bool(handled.calls), 20, "the handling")
            await asyncio.sleep(0.3)  # room for a second call to show up wrongly
            assert runner.held == 0
    finally:
        node.restore()
    assert [c[0] for c in handled.calls] == [sent.message_id]
    [(_, _, at, _)] = handled.calls
    assert sent.due_at_ms <= at, f"{sent.due_at_ms - at} ms early"
    told = [r.getMessage() for r in caplog.records if "took back 1 held" in r.getMessage()]
    assert told, [r.getMessage() for r in caplog.records]
    assert await queue_depth(settings, work_queue(settings, dest)) == 0
    assert await queue_depth(settings, parking_queue(settings)) == 0
