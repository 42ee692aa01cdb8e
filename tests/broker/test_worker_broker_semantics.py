"""What the broker does with the worker's returns and its slow handlers, on each version.

RabbitMQ 4.3 changed both (docs/guides/workers.md, "Requeue and the delivery limit" and
"Consumer timeouts"):

- ``basic.nack`` with requeue no longer counts toward a quorum queue's delivery limit;
  ``basic.reject`` still does (as a lost connection does);
- a consumer that holds a message past the consumer timeout is cancelled
  (``basic.cancel``) and loses every message it held, which do not count either; 3.10 to
  4.2 close the channel instead, and those count.

Each test asserts the behaviour of the version it finds; the worker's promises hold on all.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from collections.abc import Iterator
from typing import Any

import aio_pika
import aiormq
import pika
import pytest
from prometheus_client import REGISTRY

from rmqdelay import AsyncPublisher, Backoff, Requeue, WorkerError
from rmqdelay.amqp.consumers import consuming
from rmqdelay.worker.context import Context
from tests.helpers.brokerctl import BrokerAdmin, BrokerAdminError
from tests.helpers.consumer_timeouts import NodeTimeout, ShortTimeoutOnce, by_consumer_argument
from tests.helpers.worker_helpers import (
    TestTopology,
    parking_queue,
    queue_depth,
    wait_until,
    work_queue,
)

TIMEOUT_MS = 1500
"""The consumer timeout these tests set: short, and long enough for a loaded machine."""


def _quorum_queue(amqp_url: str, name: str, bodies: int) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        arguments = {"x-queue-type": "quorum", "x-delivery-limit": 10}
        channel.queue_declare(name, durable=True, arguments=arguments)
        for i in range(bodies):
            props = pika.BasicProperties(delivery_mode=2, message_id=f"m{i}")
            channel.basic_publish("", name, f"m{i}".encode(), props, mandatory=True)
    finally:
        connection.close()


def _header(headers: Any, name: str) -> int:
    return int((headers or {}).get(name, 0))


def _tag(message: aiormq.abc.DeliveredMessage) -> int:
    delivery = message.delivery
    assert isinstance(delivery, aiormq.spec.Basic.Deliver) and delivery.delivery_tag
    return delivery.delivery_tag


def _counts(props: pika.BasicProperties | None) -> tuple[int, int]:
    """``(x-delivery-count, x-acquired-count)`` of a delivery, 0 for an absent header."""
    headers = props.headers if props is not None else None
    return _header(headers, "x-delivery-count"), _header(headers, "x-acquired-count")


# --------------------------------------------------------------------------- returns


def test_reject_counts_toward_the_delivery_limit_and_nack_only_before_4_3(
    amqp_url: str, prefix: str, broker_version: tuple[int, ...]
) -> None:
    """Why the worker's ``Requeue`` sends ``basic.reject``: on 4.3 a handler that keeps
    requeueing must still reach the delivery limit. Its only ``basic.nack`` is for a
    message it never started (at shutdown), which on 4.3 costs nothing."""
    queue = f"{prefix}.q"
    _quorum_queue(amqp_url, queue, 1)
    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        channel = connection.channel()
        seen = []
        for verb in ("nack", "nack", "reject", "reject", "ack"):
            deadline = time.monotonic() + 10
            while True:
                method, props, _body = channel.basic_get(queue)
                if method is not None:
                    break
                assert time.monotonic() < deadline, "the message did not come back"
                time.sleep(0.02)
            seen.append(_counts(props))
            tag = method.delivery_tag
            assert tag is not None
            if verb == "nack":
                channel.basic_nack(tag, requeue=True)
            elif verb == "reject":
                channel.basic_reject(tag, requeue=True)
            else:
                channel.basic_ack(tag)
    finally:
        connection.close()
    if broker_version >= (4, 3):
        # x-delivery-count: failed deliveries only; x-acquired-count: every return
        assert seen == [(0, 0), (0, 1), (0, 2), (1, 3), (2, 4)], seen
    else:
        assert [delivery for delivery, _acquired in seen] == [0, 1, 2, 3, 4], seen


async def test_a_message_given_back_at_shutdown_costs_a_delivery_only_before_4_3(
    shared_topology: TestTopology, broker_version: tuple[int, ...]
) -> None:
    """A graceful stop gives back what was prefetched and not started, with
    ``basic.nack``: on 4.3 that is not a failed delivery, so stopping workers never
    brings a message nearer its delivery limit."""
    case = shared_topology.worker()
    dest, settings, app, calls = case
    started = asyncio.Event()

    @app.handler(dest)
    async def handle(msg: str, ctx: Context) -> None:
        calls.record(msg, ctx)
        started.set()
        await asyncio.sleep(0.5)

    async with await aio_pika.connect(settings.url.get_secret_value()) as connection:
        async with case.running(concurrency=1, prefetch=2) as publisher:
            await publisher.publish(dest, "first", delay=0)
            second = await publisher.publish(dest, "second", delay=0)
            await asyncio.wait_for(started.wait(), 10)
            # the block ends: stop with "second" prefetched, waiting for the only slot
        channel = await connection.channel()
        queue = await channel.get_queue(work_queue(settings, dest), ensure=False)
        message = await queue.get(no_ack=True, timeout=5)
    assert [c.value for c in calls.items] == ["first"]
    assert message.message_id == second.message_id
    delivery_count = _header(message.headers, "x-delivery-count")
    assert delivery_count == (0 if broker_version >= (4, 3) else 1), message.headers


# --------------------------------------------------------------------------- consumer timeout


@pytest.mark.whole_node
async def test_each_version_takes_back_a_message_past_the_consumer_timeout_its_own_way(
    amqp_url: str, prefix: str, broker_version: tuple[int, ...], admin: BrokerAdmin
) -> None:
    """4.3 cancels the consumer (the channel goes on) and ignores a late ack; the messages
    come back without a failed delivery counted. 3.10 to 4.2 close the channel with
    PRECONDITION_FAILED (no ack can follow), and count the return."""
    queue = f"{prefix}.q"
    _quorum_queue(amqp_url, queue, 2)
    node = NodeTimeout(admin)
    if not by_consumer_argument(broker_version):
        node.require()
    connection = await aiormq.connect(amqp_url)
    try:
        if not by_consumer_argument(broker_version):
            await asyncio.to_thread(node.shorten, TIMEOUT_MS)
        channel = await connection.channel()
        await channel.basic_qos(prefetch_count=2)
        held: list[aiormq.abc.DeliveredMessage] = []

        async def hold(message: aiormq.abc.DeliveredMessage) -> None:
            held.append(message)

        arguments: dict[str, Any] = {"x-consumer-timeout": TIMEOUT_MS}
        ok = await channel.basic_consume(queue, hold, arguments=arguments)
        assert ok.consumer_tag is not None
        started = time.monotonic()
        await wait_until(lambda: len(held) == 2, 5, "both deliveries")
        if by_consumer_argument(broker_version):
            await wait_until(
                lambda: not consuming(channel, ok.consumer_tag or ""), 10, "the basic.cancel"
            )
            assert not channel.is_closed
            await channel.basic_ack(_tag(held[0]))  # late: ignored
        else:
            await wait_until(lambda: channel.is_closed, 10, "the channel's closing")
            with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed, match="acknowledg"):
                await channel.closing
        took = time.monotonic() - started
        assert took >= TIMEOUT_MS / 1000 - 0.05
        again = await connection.channel()
        back: list[aiormq.abc.DeliveredMessage] = []

        async def keep(message: aiormq.abc.DeliveredMessage) -> None:
            back.append(message)

        await again.basic_consume(queue, keep, no_ack=True)
        await wait_until(lambda: len(back) == 2, 5, "both messages back")
    finally:
        await connection.close()
        await asyncio.to_thread(node.restore)
    # the late ack did not settle "m0": both came back, as redeliveries
    assert [m.header.properties.message_id for m in back] == ["m0", "m1"]
    assert all(m.redelivered for m in back)
    counts = [_header(m.header.properties.headers, "x-delivery-count") for m in back]
    assert counts == ([0, 0] if by_consumer_argument(broker_version) else [1, 1]), counts


@pytest.fixture
def node_timeout(admin: BrokerAdmin, broker_version: tuple[int, ...]) -> Iterator[NodeTimeout]:
    node = NodeTimeout(admin)
    if not by_consumer_argument(broker_version):
        node.require()
    yield node
    node.restore()


def _timeouts(destination: str) -> float:
    labels = {"destination": destination}
    return REGISTRY.get_sample_value("rmqdelay_consumer_timeouts_total", labels) or 0.0


@pytest.mark.whole_node
@pytest.mark.parametrize("first_handling", ["returns", "raises"])
async def test_a_handler_past_the_consumer_timeout_is_called_once_and_nothing_is_lost(
    shared_topology: TestTopology,
    broker_version: tuple[int, ...],
    node_timeout: NodeTimeout,
    caplog: pytest.LogCaptureFixture,
    first_handling: str,
) -> None:
    """A handler runs past the consumer timeout, with two messages prefetched behind it.

    The broker takes all three back (4.3: ``basic.cancel``; before: the channel closes).
    The worker consumes again, logs a WARNING with the queue and message id, and counts
    it; the slow handler runs to its end; its redelivery waits for it and gets its
    outcome (acked, or its retry), without a second call; the two prefetched ones are
    dropped, not handled, and handled once from their redelivery.
    """
    new = by_consumer_argument(broker_version)
    hooks = [] if new else [ShortTimeoutOnce(node_timeout, TIMEOUT_MS)]
    case = shared_topology.worker(options={"hooks": hooks, "backoff": Backoff.constant("200ms")})
    dest, settings, app, calls = case
    # past the timeout; on 4.3 shorter than two (the redelivery waits under a timeout too)
    slow_s = 2.2 if new else 4.0

    @app.handler(dest)
    async def handle(msg: str, ctx: Context) -> None:
        calls.record(msg, ctx)
        if msg == "slow" and ctx.attempt == 1:
            await asyncio.sleep(slow_s)
            if first_handling == "raises":
                raise ValueError("failed after the timeout")

    before = _timeouts(dest)
    caplog.set_level(logging.INFO, logger="rmqdelay.worker")
    options: dict[str, Any] = {"concurrency": 1, "prefetch": 3}
    if new:
        options["consumer_timeout"] = TIMEOUT_MS / 1000
    async with AsyncPublisher(settings) as publisher, app.running(**options) as runner:
        slow = await publisher.publish(dest, "slow", delay=0)
        await publisher.publish_many({"destination": dest, "body": b, "delay": 0} for b in "BC")
        calls_wanted = 4 if first_handling == "raises" else 3
        await wait_until(
            lambda: len(calls) >= calls_wanted, 20, lambda: f"every call; got {calls.items}"
        )
        await wait_until(lambda: runner.taken_back == 0, 5, "the redelivery's settling")
        await asyncio.sleep(0.5)  # room for a wrong extra call to show up
    by_value = sorted((c.value, c.attempt) for c in calls.items)
    expected = [("B", 1), ("C", 1), ("slow", 1)]
    if first_handling == "raises":
        expected.append(("slow", 2))
    assert by_value == sorted(expected), calls.items
    assert _timeouts(dest) == before + 1
    warnings = [
        r
        for r in caplog.records
        if r.levelno == logging.WARNING and getattr(r, "message_id", None) == slow.message_id
    ]
    assert warnings, [r.getMessage() for r in caplog.records]
    assert getattr(warnings[0], "queue", None) == work_queue(settings, dest)
    assert "consumer timeout" in warnings[0].getMessage()
    assert await queue_depth(settings, work_queue(settings, dest)) == 0
    assert await queue_depth(settings, parking_queue(settings)) == 0


async def test_a_deleted_work_queue_stops_the_worker_naming_it(
    shared_topology: TestTopology,
) -> None:
    """Deleting a queue cancels its consumers (``basic.cancel``, every version): the
    worker tries to consume again, cannot, reconnects, and stops on the missing queue
    with the command that declares it, instead of waiting on a consumer that is gone."""
    case = shared_topology.worker()
    dest, settings, app, _calls = case

    @app.handler(dest)
    async def handle(msg: bytes) -> None:
        raise AssertionError("never called")

    runner = app.runner()
    task = asyncio.create_task(runner.run())
    try:
        await asyncio.wait_for(runner.ready.wait(), 15)
        async with await aio_pika.connect(settings.url.get_secret_value()) as connection:
            channel = await connection.channel()
            await channel.queue_delete(work_queue(settings, dest))
        with pytest.raises(WorkerError, match=r"work queue .* does not exist: run"):
            await asyncio.wait_for(task, 20)
    finally:
        if not task.done():
            runner.abort()
            await asyncio.wait({task}, timeout=10)


# --------------------------------------------------------------------------- delayed retry


async def test_requeue_waits_out_a_delayed_retry_policy_on_4_3_and_older_refuse_the_policy(
    shared_topology: TestTopology, broker_version: tuple[int, ...], admin: BrokerAdmin
) -> None:
    """The recipe of docs/guides/workers.md for RabbitMQ 4.3's own delayed retry: a policy
    on a work queue
    makes each ``Requeue`` (a ``basic.reject``) wait ``delayed-retry-min`` times the
    delivery count, up to ``-max``. Before 4.3 the broker refuses those policy keys."""
    if not admin.uses_management_api:
        if os.environ.get("CI"):
            pytest.fail("setting a policy needs the management API", pytrace=False)
        pytest.skip("setting a policy needs the management API")
    case = shared_topology.worker()
    dest, settings, app, calls = case
    queue = work_queue(settings, dest)
    definition = {
        "delayed-retry-type": "failed",
        "delayed-retry-min": 1000,
        "delayed-retry-max": 1000,
    }
    policy = admin.policy(
        shared_topology.prefix,
        "^" + re.escape(queue) + "$",
        definition,
        apply_to="quorum_queues",
        priority=100,
    )
    if broker_version < (4, 3):
        with pytest.raises(BrokerAdminError, match="not recognised"), policy:
            pass
        return

    @app.handler(dest)
    async def handle(msg: str, ctx: Context) -> None:
        calls.record(msg, ctx)
        if len(calls) == 1:
            raise Requeue("not yet")

    with policy:
        await wait_until(
            lambda: admin.queue(queue).get("effective_policy_definition") == definition,
            30,
            "the policy on the work queue",
            interval=0.2,
        )
        async with case.running() as publisher:
            await publisher.publish(dest, "later", delay=0)
            await wait_until(lambda: len(calls) >= 2, 10, "the delayed redelivery")
    first, second = calls.items
    assert 1.0 <= second.at - first.at < 5.0, second.at - first.at
    assert second.headers.get("x-delivery-count") == 1
