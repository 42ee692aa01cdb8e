"""The worker holds a held destination's messages unacked until their due time.

A held destination's messages skip the tiers' lowest digits and reach the work queue up
to one hold window (5.12 s by default) early; the worker waits out the rest by its own
clock: never early, no handler slot taken while waiting, bounded in number, and given
back (never acked) when it stops.
"""

from __future__ import annotations

import logging
from typing import Any

import aio_pika
import pytest
from prometheus_client import REGISTRY

from rmqdelay import AsyncPublisher, plan_delay
from rmqdelay.core.clock import now_ms
from rmqdelay.core.messages import DUE_AT
from rmqdelay.worker.context import Context
from tests.helpers.worker_helpers import (
    TestTopology,
    WorkerCase,
    queue_depth,
    wait_until,
    work_queue,
)

LATE_MS = 400
"""How late a held message may be handled on a loaded 2-core machine (its p50 is ~1 ms)."""


def held_case(topology: TestTopology, *names: str, **extra: Any) -> WorkerCase:
    """A worker case whose first destination is held (its topology marked so)."""
    dest = topology.dest(names[0] if names else "jobs")
    return topology.worker(*(names or ("jobs",)), held_destinations=[dest], **extra)


def handled_at(case: WorkerCase) -> dict[str, int]:
    """Register the case's handler: each message id -> when it was handled (Unix ms)."""
    handled: dict[str, int] = {}

    @case.app.handler(case.dest)
    async def handle(msg: dict[str, int], ctx: Context) -> None:
        handled[ctx.message_id] = now_ms()

    return handled


def held_gauge(dest: str) -> float:
    return REGISTRY.get_sample_value("rmqdelay_held_messages", {"destination": dest}) or 0.0


def outcomes(dest: str, outcome: str) -> float:
    labels = {"destination": dest, "outcome": outcome}
    return REGISTRY.get_sample_value("rmqdelay_messages_total", labels) or 0.0


INSIDE_MS = 2300
"""A delay under the default hold window (5.12 s): the message goes straight to the work
queue, and the worker holds it for all of it."""


async def test_held_messages_are_handled_at_their_due_time_never_early(
    shared_topology: TestTopology,
) -> None:
    case = held_case(shared_topology)
    dest, settings, _app, _calls = case
    handled = handled_at(case)

    delays_ms = [1000, 1500, 2000, 2600, 3100, 4000, 5500, 1200]  # 5.5 s: one hop
    async with case.running(concurrency=2) as publisher:
        results = [
            await publisher.publish(dest, {"n": i}, delay=f"{ms}ms")
            for i, ms in enumerate(delays_ms)
        ]
        await wait_until(lambda: len(handled) == len(results), 15, "every message handled")
    layout = settings.layout
    late = sorted(handled[r.message_id] - r.due_at_ms for r in results)
    print(
        f"\nheld, delays 1-4 s: lateness ms min {late[0]}, "
        f"median {late[len(late) // 2]}, max {late[-1]}"
    )
    for result, ms in zip(results, delays_ms, strict=True):
        at = handled[result.message_id]
        assert at >= result.due_at_ms, f"handled {result.due_at_ms - at} ms early"
        assert at - result.due_at_ms <= LATE_MS
        plain = len(plan_delay(layout, ms * 1000, dest).hops)
        assert result.hops < plain, (ms, result.hops, plain)
    assert await queue_depth(settings, work_queue(settings, dest)) == 0


async def test_a_due_message_behind_many_held_ones_is_handled_at_once(
    shared_topology: TestTopology,
) -> None:
    """Held messages take no handler slot: with one slot and 60 held, a message due now
    is handled within moments, while every held one still waits."""
    case = held_case(shared_topology)
    dest, settings, app, _calls = case
    handled = handled_at(case)

    async with AsyncPublisher(settings) as publisher, app.running(concurrency=1) as runner:
        held = [await publisher.publish(dest, {"n": i}, delay=f"{INSIDE_MS}ms") for i in range(60)]
        await wait_until(lambda: runner.held == 60, 5, lambda: f"60 held ({runner.held})")
        now = await publisher.publish(dest, {"n": -1}, delay=0)
        await wait_until(lambda: now.message_id in handled, 5, "the due message handled")
        late_ms = handled[now.message_id] - now.due_at_ms
        print(f"\nthe due-now message behind 60 held ones (1 slot): {late_ms} ms late")
        assert late_ms <= LATE_MS
        assert not set(handled) & {r.message_id for r in held}, "a held one went early"
        assert runner.held == 60 and held_gauge(dest) == 60
        await wait_until(lambda: len(handled) == 61, 10, "the held ones handled")
        assert held_gauge(dest) == 0
    for result in held:
        assert handled[result.message_id] >= result.due_at_ms


async def test_the_gauge_counts_held_messages_and_max_held_is_logged(
    shared_topology: TestTopology, caplog: pytest.LogCaptureFixture
) -> None:
    """At max_held the worker says so once; the prefetch (concurrency + max_held) keeps
    the rest in the queue until some are due."""
    case = held_case(shared_topology, max_held=5)
    dest, settings, app, _calls = case
    handled = handled_at(case)

    caplog.set_level(logging.INFO, "rmqdelay.worker")
    async with AsyncPublisher(settings) as publisher, app.running(concurrency=1) as runner:
        sent = [await publisher.publish(dest, {"n": i}, delay=f"{INSIDE_MS}ms") for i in range(12)]
        # the prefetch lets 6 come (1 + max_held), all early: all held
        await wait_until(lambda: held_gauge(dest) == 6, 5, lambda: f"6 held ({runner.held})")
        assert await queue_depth(settings, work_queue(settings, dest)) == 6
        await wait_until(lambda: len(handled) == 12, 15, "every message handled")
        assert held_gauge(dest) == 0
    told = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    told = [text for text in told if "max_held" in text]
    assert len(told) == 1, told
    assert dest in told[0] and "(5)" in told[0]
    assert any("prefetch 6, max_held 5" in r.getMessage() for r in caplog.records)
    for result in sent:
        assert handled[result.message_id] >= result.due_at_ms


async def test_a_cancel_issued_while_a_message_is_held_skips_it(
    shared_topology: TestTopology,
) -> None:
    case = held_case(shared_topology)
    dest, settings, app, _calls = case
    handled = handled_at(case)

    before = outcomes(dest, "cancelled")
    async with AsyncPublisher(settings) as publisher, app.running(concurrency=2) as runner:
        gone = await publisher.publish(dest, {"n": 1}, delay=f"{INSIDE_MS}ms")
        kept = await publisher.publish(dest, {"n": 2}, delay=f"{INSIDE_MS}ms")
        await wait_until(lambda: runner.held == 2, 5, "both held")
        [result] = await publisher.cancel(gone.message_id)
        assert result.outcome == "cancelled"
        await wait_until(lambda: kept.message_id in handled, 10, "the kept one handled")
        await wait_until(lambda: outcomes(dest, "cancelled") == before + 1, 5, "the cancel")
    assert gone.message_id not in handled
    assert handled[kept.message_id] >= kept.due_at_ms


async def test_a_message_due_past_the_hold_window_goes_round_the_tiers_again(
    shared_topology: TestTopology,
) -> None:
    """One that comes too early to hold (a publisher's clock ahead, here a raw publish
    straight to the work queue) is not held for long: it is published again due at the
    same time, then handled at that time, once."""
    case = held_case(shared_topology)
    dest, settings, app, _calls = case
    handled: list[tuple[str, int]] = []

    @app.handler(dest)
    async def handle(msg: dict[str, int], ctx: Context) -> None:
        handled.append((ctx.message_id, now_ms()))

    before = outcomes(dest, "forwarded")
    due_ms = now_ms() + settings.layout.hold_ms + 3000  # past the window and its slack
    async with app.running(concurrency=2):
        connection = await aio_pika.connect(settings.url.get_secret_value())
        async with connection:
            channel = await connection.channel()
            message = aio_pika.Message(
                b'{"n": 1}',
                content_type="application/json",
                message_id="too-early",
                headers={DUE_AT: due_ms},
            )
            await channel.default_exchange.publish(message, work_queue(settings, dest))
        await wait_until(lambda: outcomes(dest, "forwarded") == before + 1, 5, "the re-delay")
        assert not handled
        await wait_until(lambda: bool(handled), 15, "the handling")
    [(message_id, at)] = handled
    assert message_id == "too-early" and due_ms <= at <= due_ms + LATE_MS


async def test_a_graceful_stop_returns_held_messages_unhandled(
    shared_topology: TestTopology, caplog: pytest.LogCaptureFixture
) -> None:
    """Stopping never acks what is held: it goes back to the queue (and the log says how
    many), and the next worker holds it again for what remains."""
    case = held_case(shared_topology)
    dest, settings, app, _calls = case
    handled = handled_at(case)

    caplog.set_level(logging.INFO, "rmqdelay.worker")
    async with AsyncPublisher(settings) as publisher:
        async with app.running(concurrency=2) as runner:
            sent = [
                await publisher.publish(dest, {"n": i}, delay=f"{INSIDE_MS}ms") for i in range(5)
            ]
            await wait_until(lambda: runner.held == 5, 5, "5 held")
        assert not handled and held_gauge(dest) == 0
        assert any("returning 5 held message(s)" in r.getMessage() for r in caplog.records)
        assert await queue_depth(settings, work_queue(settings, dest)) == 5
        async with app.running(concurrency=2):
            await wait_until(lambda: len(handled) == 5, 10, "the returned ones handled")
    for result in sent:
        assert handled[result.message_id] >= result.due_at_ms
