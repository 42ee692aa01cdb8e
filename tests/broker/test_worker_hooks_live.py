"""Worker hooks on a real broker: what a user hook sees, in order, and a hook that fails
neither loses a message nor settles it twice."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable
from typing import Any

from aio_pika.abc import AbstractConnection

from rmqdelay.amqp.aio_publisher import AsyncPublisher
from rmqdelay.core.clock import ms_of_datetime
from rmqdelay.core.handling.retry import Backoff, Park, Retry
from rmqdelay.worker import Admission, Delivery, Settled, WorkerHook
from rmqdelay.worker.context import Context
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


class Gate(WorkerHook):
    """Admits by the message's ``gate`` header: drop, forward (once, 600 ms on), or
    handle with a success step that records itself before the ack."""

    def __init__(self) -> None:
        self.succeeded: list[str] = []
        self.forwarded: set[str] = set()
        self.settled: dict[tuple[str, int | None], Settled] = {}

    def admit(
        self, delivery: Delivery, message: Any, publisher: AsyncPublisher
    ) -> Awaitable[Admission] | None:
        gate = delivery.headers.get("gate")
        if gate is None:
            return None
        return self._say(delivery, gate)

    async def _say(self, delivery: Delivery, gate: str) -> Admission:
        if gate == "drop":
            return Admission("drop", "told to")
        if gate == "forward" and delivery.message_id not in self.forwarded:
            assert delivery.due_ms is not None
            self.forwarded.add(delivery.message_id)
            return Admission("forward", "rescheduled", forward_due_ms=delivery.due_ms + 600)

        async def done() -> None:
            self.succeeded.append(delivery.message_id)

        return Admission("handle", on_success=(done,))

    def after_settle(self, delivery: Delivery, settled: Settled) -> None:
        self.settled[delivery.message_id, delivery.due_ms] = settled


async def test_an_admission_drops_forwards_or_handles_with_a_step_before_the_ack(
    shared_topology: TestTopology,
) -> None:
    """A forwarded copy keeps its id, body and headers and is due at the time asked; a
    dropped one is acked unhandled; a success step runs after the handler, before the ack."""
    gate = Gate()
    worker_case = shared_topology.worker("gated", options={"hooks": [gate]})
    dest, settings, app, calls = worker_case

    @app.handler(dest)
    async def handle(msg: dict[str, str], ctx: Context) -> None:
        calls.record(msg, ctx)

    async with worker_case.running(concurrency=2) as publisher:
        dropped = await publisher.publish(dest, {"n": "1"}, delay=0, headers={"gate": "drop"})
        kept = await publisher.publish(dest, {"n": "2"}, delay=0, headers={"gate": "keep"})
        moved = await publisher.publish(
            dest, {"n": "3"}, delay=0, headers={"gate": "forward"}, correlation_id="c-3"
        )
        await wait_until(lambda: len(calls) >= 2, 15, "two handled")
    assert calls.of(dropped.message_id) == []
    assert gate.settled[dropped.message_id, dropped.due_at_ms].outcome == "dropped"
    assert gate.settled[moved.message_id, moved.due_at_ms].outcome == "forwarded"
    (call,) = calls.of(moved.message_id)
    assert call.value == {"n": "3"} and call.headers["gate"] == "forward"
    assert call.due_at is not None
    assert ms_of_datetime(call.due_at) == moved.due_at_ms + 600
    assert call.at * 1000 >= moved.due_at_ms + 600  # never early
    assert len(calls.of(kept.message_id)) == 1
    assert sorted(gate.succeeded) == sorted([kept.message_id, moved.message_id])
    assert await queue_depth(settings, work_queue(settings, dest)) == 0
