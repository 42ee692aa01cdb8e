"""The worker on a real broker: ack, retry through the tiers, requeue, parking, reconnect."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from prometheus_client import REGISTRY
from pydantic import BaseModel

from rmqdelay import plan_delay
from rmqdelay.amqp.aio_publisher import AsyncPublisher
from rmqdelay.amqp.parked_queue import ParkedQueue
from rmqdelay.core.handling.parking import (
    PARKED_AT,
    PARKED_ATTEMPTS,
    PARKED_DESTINATION,
    PARKED_ERROR,
    PARKED_ERROR_TYPE,
    PARKED_REASON,
    PARKED_TRACEBACK,
)
from rmqdelay.core.handling.retry import Backoff, Park, Requeue, Retry
from rmqdelay.core.messages import ATTEMPT, DESTINATION
from rmqdelay.core.routing import parse_key
from rmqdelay.worker import WorkerError
from rmqdelay.worker.context import Context
from tests.helpers.brokerctl import BrokerAdmin
from tests.helpers.worker_helpers import (
    TestTopology,
    WorkerCase,
    drain,
    parking_queue,
    queue_depth,
    wait_until,
    work_queue,
)


class OrderTimeout(BaseModel):
    order_id: int
    customer: str


async def test_success_acks_and_handles_exactly_once(worker_case: WorkerCase) -> None:
    dest, settings, app, calls = worker_case

    @app.handler(dest)
    async def handle(msg: OrderTimeout, ctx: Context) -> None:
        calls.record(msg, ctx)

    acked = {"destination": dest, "outcome": "acked"}
    before = REGISTRY.get_sample_value("rmqdelay_messages_total", acked) or 0
    async with worker_case.running(concurrency=2) as publisher:
        sent = await publisher.publish(
            dest, OrderTimeout(order_id=7, customer="ada"), delay="200ms"
        )
        await wait_until(lambda: len(calls) >= 1, 10, "the handler call")
        await asyncio.sleep(0.5)  # room for a wrong second delivery to show up
    [call] = calls.items
    assert call.value == OrderTimeout(order_id=7, customer="ada")
    assert call.message_id == sent.message_id
    assert call.attempt == 1
    assert call.lateness is not None and call.lateness.total_seconds() >= 0
    assert call.at * 1000 >= sent.due_at_ms
    assert REGISTRY.get_sample_value("rmqdelay_messages_total", acked) == before + 1
    # Stopped, so anything unacked would be back in the queue by now.
    assert await queue_depth(settings, work_queue(settings, dest)) == 0
    assert await queue_depth(settings, parking_queue(settings)) == 0


@pytest.mark.parametrize("queue_type", ["quorum", "classic"])
async def test_fails_twice_then_succeeds_at_the_retry_delays(
    shared_topology: TestTopology, queue_type: str
) -> None:
    worker_case = shared_topology.worker(queue_type=queue_type)
    dest, settings, app, calls = worker_case
    delays = (0.3, 0.6)

    @app.handler(dest, max_attempts=5, backoff=Backoff.schedule([f"{d}s" for d in delays]))
    def handle(msg: dict[str, Any], ctx: Context) -> None:  # sync: runs in the thread pool
        calls.record(msg, ctx)
        if ctx.attempt < 3:
            raise ConnectionError(f"downstream unavailable (attempt {ctx.attempt})")

    async with worker_case.running(concurrency=2) as publisher:
        sent = await publisher.publish(dest, {"n": 1}, delay=0, headers={"tenant": "acme"})
        await wait_until(lambda: len(calls) >= 3, 15, "three handler calls")
        await asyncio.sleep(0.5)
    assert [c.attempt for c in calls.items] == [1, 2, 3]
    assert {c.message_id for c in calls.items} == {sent.message_id}
    assert all(c.value == {"n": 1} for c in calls.items)
    assert all(c.headers["tenant"] == "acme" for c in calls.items)
    for before, after, delay in zip(calls.items, calls.items[1:], delays, strict=False):
        gap = after.at - before.at
        assert gap >= delay, f"retry came early: {gap:.3f}s < {delay}s"
        assert gap < delay + 3, f"retry far too late: {gap:.3f}s"
        assert after.lateness is not None and after.lateness.total_seconds() >= 0
    assert await queue_depth(settings, work_queue(settings, dest)) == 0
    assert await queue_depth(settings, parking_queue(settings)) == 0


PROPERTIES: dict[str, Any] = {
    "correlation_id": "corr-1",
    "content_type": "application/x-raw",
    "content_encoding": "identity",
    "priority": 3,
    "reply_to": "replies",
    "type": "charge",
    "app_id": "shop",
}


async def test_always_failing_message_is_parked_after_max_attempts(
    worker_case: WorkerCase,
) -> None:
    dest, settings, app, calls = worker_case

    @app.handler(dest, max_attempts=3, backoff=Backoff.constant("50ms"))
    async def handle(msg: bytes, ctx: Context) -> None:
        calls.record(msg, ctx)
        raise ValueError(f"cannot charge card (attempt {ctx.attempt})")

    parking = parking_queue(settings)
    async with worker_case.running() as publisher:
        sent = await publisher.publish(
            dest, b"\x00raw", delay=0, headers={"tenant": "acme"}, **PROPERTIES
        )
        await wait_until(lambda: len(calls) >= 3, 10, "three attempts")
        deadline = time.monotonic() + 10
        while await queue_depth(settings, parking) < 1 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
    assert [c.attempt for c in calls.items] == [1, 2, 3]
    [parked] = await drain(settings, parking)
    headers = parked.headers
    assert parked.body == b"\x00raw"
    assert parked.message_id == sent.message_id
    # kept through two retries and the parking
    assert {name: getattr(parked, name) for name in PROPERTIES} == PROPERTIES
    assert headers["tenant"] == "acme"
    assert headers[ATTEMPT] == 3
    assert headers[DESTINATION] == dest
    assert headers[PARKED_ATTEMPTS] == 3
    assert headers[PARKED_DESTINATION] == dest
    reason, trace, parked_at = headers[PARKED_REASON], headers[PARKED_TRACEBACK], headers[PARKED_AT]
    assert isinstance(reason, str) and isinstance(trace, str) and isinstance(parked_at, int)
    assert "gave up after 3 of 3 attempts" in reason
    assert "ValueError: cannot charge card (attempt 3)" in reason
    assert headers[PARKED_ERROR_TYPE] == "builtins.ValueError"
    assert headers[PARKED_ERROR] == "cannot charge card (attempt 3)"
    assert "raise ValueError" in trace
    assert abs(parked_at - time.time() * 1000) < 60_000
    assert await queue_depth(settings, work_queue(settings, dest)) == 0


async def test_retries_cycle_through_the_same_tiers_and_are_still_delivered(
    worker_case: WorkerCase,
) -> None:
    """The dead-letter cycle trap. Before RabbitMQ 4.0.1, a message dead-lettered into a
    queue already in its ``x-death`` (with no rejection in between) is dropped silently.
    A send of 2870 ms takes three hops, tiers 2560 ms, 160 ms and 150 ms: the second
    time round, tier 2560 ms dead-letters into tier 160 ms, which an unstripped
    ``x-death`` already names, so the retry would vanish.

    The due time is fixed when a send is prepared, and the tiers are planned for what is
    left of the delay when it goes out: a send that waited (a loaded machine, a passive
    check on the way) rightly takes fewer units, losing them from its last tier first.
    So each delivery is checked against the route its own routing key names. A send up
    to 160 ms late still goes through tier 160 ms, into the trap; on any route, an
    unstripped ``x-death`` also shows as tiers of an earlier round, or counts over one.
    (A 170 ms delay, tiers 160 ms and 10 ms, once failed the test: a retry sent 10 ms
    late took tier 160 ms alone.)
    """
    dest, settings, app, calls = worker_case
    layout = settings.layout
    plan = plan_delay(layout, 2_870_000, dest)
    assert [t.ttl_ms for t in plan.hops] == [2560, 160, 150]
    trap = plan.hops[1].queue  # tier 160 ms
    for late in range(16):  # units of 10 ms
        hops = plan_delay(layout, (plan.units - late) * 10_000, dest).hops
        assert hops[0] == plan.hops[0] and hops[1].queue == trap, late
    failures = 2

    @app.handler(dest, max_attempts=10, backoff=Backoff.constant("2870ms"))
    async def handle(msg: str, ctx: Context) -> None:
        calls.record(msg, ctx)
        if ctx.attempt <= failures:
            raise Retry(reason="not yet")

    async with worker_case.running() as publisher:
        sent = await publisher.publish(dest, "cycle", delay="2870ms")
        await wait_until(
            lambda: len(calls) >= failures + 1,
            30,
            lambda: (
                f"{failures + 1} deliveries; got attempts "
                f"{[c.attempt for c in calls.items]} (a retry lost to the dead-letter cycle check?)"
            ),
        )
    assert [c.attempt for c in calls.items] == list(range(1, failures + 2))
    assert {c.message_id for c in calls.items} == {sent.message_id}
    for call in calls.items:
        # Since its last (re)publish, each delivery went through each tier of its route
        # exactly once: the route its routing key names, as planned when it was sent.
        assert "x-death" in call.headers, f"attempt {call.attempt} went through no tier"
        deaths = {d["queue"]: d for d in call.headers["x-death"]}
        keys = {k for d in deaths.values() for k in d["routing-keys"]}
        assert len(keys) == 1, f"attempt {call.attempt}: x-death of several sends {keys}"
        [key] = keys
        digits = parse_key(layout, key).digits
        units = sum(d * p.weight for p, d in zip(layout.positions, digits, strict=True))
        assert units <= plan.units, (call.attempt, key)  # later, never earlier
        route = {p.tiers[d - 1].queue for p, d in zip(layout.positions, digits, strict=True) if d}
        assert set(deaths) == route, (call.attempt, key)
        assert all(d["count"] == 1 and d["reason"] == "expired" for d in deaths.values())


async def test_requeue_delivers_the_message_again(worker_case: WorkerCase) -> None:
    dest, settings, app, calls = worker_case

    @app.handler(dest)
    async def handle(msg: str, ctx: Context) -> None:
        calls.record(msg, ctx)
        if len(calls) == 1:
            raise Requeue("lock busy")

    async with worker_case.running() as publisher:
        sent = await publisher.publish(dest, "again", delay=0)
        await wait_until(lambda: len(calls) >= 2, 10, "the second delivery")
        await asyncio.sleep(0.3)
    first, second = calls.items
    assert first.message_id == second.message_id == sent.message_id
    assert (first.attempt, second.attempt) == (1, 1)  # no retry: the same attempt
    assert (first.redelivered, second.redelivered) == (False, True)
    assert await queue_depth(settings, work_queue(settings, dest)) == 0


async def test_requeue_forever_is_parked_by_the_quorum_delivery_limit(
    shared_topology: TestTopology,
) -> None:
    worker_case = shared_topology.worker(delivery_limit=3)
    dest, settings, app, calls = worker_case

    @app.handler(dest)
    async def handle(msg: str, ctx: Context) -> None:
        calls.record(msg, ctx)
        raise Requeue("never ready")

    parking = parking_queue(settings)
    async with worker_case.running() as publisher:
        sent = await publisher.publish(dest, "loop", delay=0)
        deadline = time.monotonic() + 10
        while await queue_depth(settings, parking) < 1:
            assert time.monotonic() < deadline, f"not parked after {len(calls)} deliveries"
            await asyncio.sleep(0.05)
    # x-delivery-limit=3: the broker dead-letters it once it was returned a 4th time.
    assert len(calls) == 4, len(calls)
    # each Requeue is a basic.reject, a failed delivery on every version (RabbitMQ 4.3
    # no longer counts a basic.nack: with it, this message would come back forever)
    counts = [c.headers.get("x-delivery-count", 0) for c in calls.items]
    assert counts == [0, 1, 2, 3], counts
    async with ParkedQueue(settings) as parked:
        total, [item] = await parked.list()
    assert total == 1
    assert item.message_id == sent.message_id
    assert item.destination == dest
    assert "delivery limit" in item.reason
    assert await queue_depth(settings, work_queue(settings, dest)) == 0


async def test_requeue_forever_on_a_classic_queue_keeps_coming_back(
    shared_topology: TestTopology,
) -> None:
    """Classic queues have no delivery limit: a message requeued forever is never parked.
    It comes back until the handler stops raising Requeue (use Retry to bound it)."""
    worker_case = shared_topology.worker(queue_type="classic")
    dest, settings, app, calls = worker_case
    rounds = 30

    @app.handler(dest)
    async def handle(msg: str, ctx: Context) -> None:
        calls.record(msg, ctx)
        if len(calls) < rounds:
            raise Requeue("never ready")

    async with worker_case.running() as publisher:
        await publisher.publish(dest, "loop", delay=0)
        await wait_until(lambda: len(calls) >= rounds, 10, f"{rounds} deliveries")
        await asyncio.sleep(0.3)
    assert len(calls) == rounds
    assert all(c.attempt == 1 for c in calls.items)
    assert await queue_depth(settings, parking_queue(settings)) == 0
    assert await queue_depth(settings, work_queue(settings, dest)) == 0


async def test_invalid_body_is_parked_at_once_with_a_clear_reason(
    worker_case: WorkerCase,
) -> None:
    dest, settings, app, calls = worker_case

    @app.handler(dest, max_attempts=5)
    async def handle(msg: OrderTimeout, ctx: Context) -> None:
        calls.record(msg, ctx)

    parking = parking_queue(settings)
    async with worker_case.running() as publisher:
        sent = await publisher.publish(dest, {"order_id": "seven"}, delay=0)
        deadline = time.monotonic() + 10
        while await queue_depth(settings, parking) < 1:
            assert time.monotonic() < deadline, "the bad body was not parked"
            await asyncio.sleep(0.05)
    assert len(calls) == 0
    async with ParkedQueue(settings) as parked:
        _total, [item] = await parked.list()
    assert item.message_id == sent.message_id
    assert item.attempts == 1
    assert item.reason.startswith("undecodable body: body does not validate as OrderTimeout")
    assert "order_id: Input should be a valid integer" in item.reason
    assert "customer: Field required" in item.reason


async def test_park_signal_and_unmatched_errors_park_without_retrying(
    shared_topology: TestTopology,
) -> None:
    worker_case = shared_topology.worker(*"abc", options={"retry_on": (ConnectionError,)})
    a, settings, app, calls = worker_case
    b, c = shared_topology.dest("b"), shared_topology.dest("c")

    @app.handler(a)
    async def park_it(msg: str, ctx: Context) -> None:
        calls.record(msg, ctx)
        raise Park("customer deleted")

    @app.handler(b)
    def not_retryable(msg: str, ctx: Context) -> None:
        calls.record(msg, ctx)
        raise KeyError("sku")

    @app.handler(c)
    async def too_far(msg: str, ctx: Context) -> None:
        calls.record(msg, ctx)
        raise Retry(delay="2h")  # over max_delay=1h: cannot go round the tiers

    async with worker_case.running() as publisher:
        for destination in (a, b, c):
            await publisher.publish(destination, "x", delay=0)
        deadline = time.monotonic() + 10
        while await queue_depth(settings, parking_queue(settings)) < 3:
            assert time.monotonic() < deadline, "not parked"
            await asyncio.sleep(0.05)
    assert len(calls) == 3
    async with ParkedQueue(settings) as parked:
        _total, items = await parked.list()
    reasons = {i.destination: i.reason for i in items}
    assert reasons[a] == "customer deleted"
    assert reasons[b] == "KeyError: 'sku' (not in the handler's retry_on)"
    traces = {i.destination: i.traceback or "" for i in items}
    assert 'raise KeyError("sku")' in traces[b]  # a sync handler's own frame, from its thread
    assert reasons[c].startswith("Retry; the retry could not be published: delay of 2h")
    assert "raise max_delay" in reasons[c]


async def test_context_publish_from_async_and_sync_handlers(
    shared_topology: TestTopology,
) -> None:
    worker_case = shared_topology.worker("start", "sync", "done")
    start_, _, app, calls = worker_case
    sync_, done_ = shared_topology.dest("sync"), shared_topology.dest("done")

    @app.handler(start_)
    async def start(msg: dict[str, int], ctx: Context) -> None:
        await ctx.publish(sync_, {"n": msg["n"] + 1}, delay="100ms")

    @app.handler(sync_)
    def middle(msg: dict[str, int], ctx: Context) -> None:
        ctx.publish_sync(done_, {"n": msg["n"] + 1}, delay=0, correlation_id=ctx.message_id)

    @app.handler(done_)
    async def done(msg: dict[str, int], ctx: Context) -> None:
        calls.record(msg, ctx)

    async with worker_case.running(concurrency=2) as publisher:
        await publisher.publish(start_, {"n": 1}, delay=0)
        await wait_until(lambda: len(calls) >= 1, 10, "the chained message")
    assert calls.items[0].value == {"n": 3}


async def test_connection_loss_reconnects_and_finishes_every_message(
    shared_topology: TestTopology, admin: BrokerAdmin
) -> None:
    worker_case = shared_topology.worker(connection_name=f"{shared_topology.prefix}-w")
    dest, settings, app, calls = worker_case
    publish_settings = settings.replace(connection_name=f"{shared_topology.prefix}-p")
    total = 40

    @app.handler(dest)
    async def handle(msg: str, ctx: Context) -> None:
        await asyncio.sleep(0.03)
        calls.record(msg, ctx)

    async with AsyncPublisher(publish_settings) as publisher:
        sent = await publisher.publish_many(
            {"destination": dest, "body": str(i), "delay": 0} for i in range(total)
        )
        async with app.running(concurrency=2) as runner:
            await wait_until(lambda: len(calls) >= 8, 10, "the first messages")
            closed = await asyncio.to_thread(
                admin.close_connections, f"{shared_topology.prefix}-w.worker"
            )
            assert closed == 1
            await wait_until(lambda: runner.connects >= 2, 20, "the reconnect")
            ids = {s.message_id for s in sent}
            await wait_until(
                lambda: ids <= {c.message_id for c in calls.items}, 20, "every message"
            )
    assert runner.connects >= 2
    assert await queue_depth(settings, work_queue(settings, dest)) == 0
    assert await queue_depth(settings, parking_queue(settings)) == 0
    duplicates = len(calls) - len({c.message_id for c in calls.items})
    assert duplicates <= 4  # at most what was in flight (concurrency + prefetch)


async def test_missing_work_queue_is_a_clear_startup_error(shared_topology: TestTopology) -> None:
    app = shared_topology.worker().app

    @app.handler(shared_topology.dest("nowhere"))
    async def handle(msg: bytes) -> None:
        raise AssertionError("never called")

    with pytest.raises(WorkerError, match=r"work queue .*nowhere.* does not exist: run"):
        async with app.running():
            pass
