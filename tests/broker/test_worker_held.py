"""The worker holds a held destination's messages unacked until their due time.

A held destination's messages skip the tiers' lowest digits and reach the work queue up
to one hold window (2.56 s by default) early; the worker waits out the rest by its own
clock: never early, no handler slot taken while waiting, bounded in number, and given
back (never acked) when it stops.
"""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
from prometheus_client import REGISTRY

from rmqdelay import plan_delay
from rmqdelay.core.clock import now_ms
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


def held_case(topology: TestTopology, *names: str, **extra: object) -> WorkerCase:
    """A worker case whose first destination is held (its topology marked so)."""
    dest = topology.dest(names[0] if names else "jobs")
    return topology.worker(*(names or ("jobs",)), held_destinations=[dest], **extra)


def held_now() -> float:
    return REGISTRY.get_sample_value("rmqdelay_held_messages", {}) or 0.0


async def test_held_messages_are_handled_at_their_due_time_never_early(
    shared_topology: TestTopology,
) -> None:
    case = held_case(shared_topology)
    dest, settings, app, calls = case
    handled: dict[str, int] = {}

    @app.handler(dest)
    async def handle(msg: dict[str, int], ctx: Context) -> None:
        handled[ctx.message_id] = now_ms()
        calls.record(msg, ctx)

    delays_ms = [1000, 1500, 2000, 2600, 3100, 3700, 4000, 1200]
    async with case.running(concurrency=2) as publisher:
        results = [
            await publisher.publish(dest, {"n": i}, delay=f"{ms}ms") for i, ms in enumerate(delays_ms)
        ]
        await wait_until(lambda: len(handled) == len(results), 15, "every message handled")
    layout = settings.layout
    for result, ms in zip(results, delays_ms, strict=True):
        at = handled[result.message_id]
        assert at >= result.due_at_ms, f"handled {result.due_at_ms - at} ms early"
        assert at - result.due_at_ms <= LATE_MS
        plain = len(plan_delay(layout, ms * 1000, dest).hops)
        assert result.hops < plain, (ms, result.hops, plain)
    assert await queue_depth(settings, work_queue(settings, dest)) == 0
