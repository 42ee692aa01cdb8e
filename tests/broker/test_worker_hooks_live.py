"""Worker hooks on a real broker: what a user hook sees, in order, and a hook that fails
neither loses a message nor settles it twice."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from aio_pika.abc import AbstractConnection

from rmqdelay.amqp.aio_publisher import AsyncPublisher
from rmqdelay.core.retry import Backoff, Park, Retry
from rmqdelay.worker import Delivery, Settled, WorkerHook
from tests.helpers.worker_helpers import (
    TestTopology,
    parking_queue,
    queue_depth,
    wait_until,
    work_queue,
)


class Seen(WorkerHook):
    """Records every call, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.settled: dict[tuple[str, int], Settled] = {}

    async def on_connect(self, connection: AbstractConnection, lost: asyncio.Event) -> None:
        self.calls.append(("connect", connection.is_closed))

    async def on_disconnect(self) -> None:
        self.calls.append(("disconnect",))

    def before_handle(self, delivery: Delivery) -> bool:
        self.calls.append(("before", delivery.message_id, delivery.attempt))
        return False

    def after_settle(self, delivery: Delivery, settled: Settled) -> None:
        self.calls.append(("after", delivery.message_id, delivery.attempt, settled.outcome))
        self.settled[delivery.message_id, delivery.attempt] = settled


class Fails(WorkerHook):
    """A hook with a bug in each per-message method."""

    def before_handle(self, delivery: Delivery) -> bool:
        raise RuntimeError("before_handle bug")

    def after_settle(self, delivery: Delivery, settled: Settled) -> None:
        raise RuntimeError("after_settle bug")


async def test_a_user_hook_sees_each_message_in_order_with_its_outcome(
    shared_topology: TestTopology,
) -> None:
    seen = Seen()
    worker_case = shared_topology.worker("hooked", options={"hooks": [seen]})
    dest, settings, app, _ = worker_case

    @app.handler(dest, max_attempts=3, backoff=Backoff.constant("200ms"))
    async def handle(msg: dict[str, str], ctx: Any) -> None:
        if msg["do"] == "retry" and ctx.attempt == 1:
            raise Retry(delay="200ms", reason="not yet")
        if msg["do"] == "park":
            raise Park("no such order")

    async with worker_case.running(concurrency=1) as publisher:
        ok = await publisher.publish(dest, {"do": "ack"}, delay=0)
        retry = await publisher.publish(dest, {"do": "retry"}, delay=0)
        park = await publisher.publish(dest, {"do": "park"}, delay=0)
        await wait_until(lambda: len(seen.settled) >= 4, 15, "four settled deliveries")
    assert seen.calls[0] == ("connect", False)
    assert seen.calls[-1] == ("disconnect",)
    per_message = seen.calls[1:-1]
    for key in [(ok.message_id, 1), (retry.message_id, 1), (retry.message_id, 2)]:
        at = per_message.index(("before", *key))
        assert per_message[at + 1][:3] == ("after", *key)  # concurrency 1: one at a time
    assert ("before", park.message_id, 1) in per_message
    outcomes = {key: s.outcome for key, s in seen.settled.items()}
    assert outcomes == {
        (ok.message_id, 1): "acked",
        (retry.message_id, 1): "retried",
        (retry.message_id, 2): "acked",
        (park.message_id, 1): "parked",
    }
    retried = seen.settled[retry.message_id, 1]
    assert (retried.delay_ms, retried.reason) == (200, "Retry(not yet)")
    assert retried.seconds is not None and retried.seconds >= 0
    parked = seen.settled[park.message_id, 1]
    assert isinstance(parked.error, Park) and "no such order" in parked.reason
    assert await queue_depth(settings, work_queue(settings, dest)) == 0


async def test_a_failing_hook_loses_nothing_and_settles_each_message_once(
    shared_topology: TestTopology,
) -> None:
    """Each message handled once and acked once: a second ack would close the channel
    (PRECONDITION_FAILED, unknown delivery tag) and the worker would reconnect."""
    seen = Seen()
    dest, settings, app, _ = shared_topology.worker("hookbug", options={"hooks": [Fails(), seen]})
    handled: list[int] = []
    lock = threading.Lock()

    @app.handler(dest)
    def handle(msg: dict[str, int]) -> None:
        with lock:
            handled.append(msg["n"])

    async with AsyncPublisher(settings) as publisher, app.running(concurrency=4) as runner:
        await publisher.publish_many(
            {"destination": dest, "body": {"n": n}, "delay": 0} for n in range(20)
        )
        await wait_until(lambda: len(seen.settled) >= 20, 15, "twenty settled deliveries")
        await asyncio.sleep(0.5)  # room for a redelivery to show up
        assert runner.connects == 1
    assert sorted(handled) == list(range(20))
    assert {s.outcome for s in seen.settled.values()} == {"acked"}
    assert len([c for c in seen.calls if c[0] == "after"]) == 20
    assert await queue_depth(settings, work_queue(settings, dest)) == 0
    assert await queue_depth(settings, parking_queue(settings)) == 0
