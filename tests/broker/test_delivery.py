"""The delay engine on a real broker, for quorum and classic queues."""

from __future__ import annotations

import random
from collections.abc import Iterator

import aio_pika
import aiormq
import pika
import pytest

from rmqdelay import (
    Settings,
    TopologyConflictError,
    UnknownDestinationError,
    UnroutableError,
    build_topology,
)
from rmqdelay.amqp.aio_publisher import AsyncPublisher
from rmqdelay.amqp.connections import connect_blocking
from rmqdelay.amqp.publisher import Publisher
from rmqdelay.amqp.topology_manager import TopologyManager
from rmqdelay.core.messages import DESTINATION, DUE_AT
from rmqdelay.errors import BatchPublishError, PublisherClosedError, PublishNackedError
from rmqdelay.settings import SecretUrl
from tests.helpers.brokerctl import BrokerAdmin
from tests.helpers.support import Collector
from tests.helpers.worker_helpers import TestTopology, work_queue

LATE_BOUND_MS = 5000
"""A sanity bound, not a target (lateness is measured in the benchmarks): the engine adds
milliseconds; a CI run at a load of 7 on 2 cores once delivered one 3,003 ms late."""


@pytest.fixture
def orders(shared_topology: TestTopology) -> str:
    """This test's ``orders`` destination."""
    return shared_topology.dest("orders")


@pytest.fixture
def other(shared_topology: TestTopology) -> str:
    return shared_topology.dest("other")


@pytest.fixture(params=["quorum", "classic"])
def rmq(
    request: pytest.FixtureRequest, shared_topology: TestTopology, orders: str, other: str
) -> Settings:
    """Settings on the module's topology of this queue type, with ``orders`` and
    ``other`` applied."""
    settings: Settings = shared_topology.settings([orders, other], queue_type=request.param)
    return settings


@pytest.fixture(params=["quorum", "classic"])
def own_rmq(request: pytest.FixtureRequest, amqp_url: str, prefix: str) -> Iterator[Settings]:
    """Like ``rmq``, on a topology of this test's own, for tests that change it."""
    settings = Settings(
        url=amqp_url,
        prefix=prefix,
        max_delay="1h",
        queue_type=request.param,
        connection_name=prefix,
    )
    with TopologyManager(settings) as manager:
        manager.apply(["orders", "other"])
    yield settings


async def test_seeds_case_arrives_in_due_order_none_early(rmq: Settings, orders: str) -> None:
    async with (
        Collector(rmq.url.get_secret_value(), work_queue(rmq, orders)) as collector,
        AsyncPublisher(rmq) as publisher,
    ):
        for seconds in (5, 4, 3, 2, 1):
            await publisher.publish(orders, f"{seconds}s", delay=seconds)
        received = await collector.wait_for(5, timeout=15)
    assert [r.body for r in received] == [b"1s", b"2s", b"3s", b"4s", b"5s"]
    for r in received:
        assert 0 <= r.lateness_ms < LATE_BOUND_MS, (r.body, r.lateness_ms)


async def test_random_delays_none_early_none_lost(
    rmq: Settings, orders: str, aio_path: str
) -> None:
    rng = random.Random(7)
    delays = [rng.choice([0, 0.01, 0.123, 0.5, 0.99, 1.0, 1.7, 2.5, 3.05]) for _ in range(300)]
    async with (
        Collector(rmq.url.get_secret_value(), work_queue(rmq, orders)) as collector,
        AsyncPublisher(rmq) as publisher,
    ):
        results = await publisher.publish_many(
            {"destination": orders, "body": str(i), "delay": d, "message_id": f"m{i}"}
            for i, d in enumerate(delays)
        )
        received = await collector.wait_for(len(delays), timeout=30)
    # sent by due time, but the results follow the requests
    assert [r.message_id for r in results] == [f"m{i}" for i in range(len(delays))]
    assert sorted(r.message_id for r in received) == sorted(r.message_id for r in results)
    for r in received:
        assert r.headers[DESTINATION] == orders
        assert r.lateness_ms >= 0, f"message {r.body!r} was early by {-r.lateness_ms} ms"
        assert r.lateness_ms < LATE_BOUND_MS * 2


@pytest.mark.usefixtures("pika_path")
def test_sync_publisher_delivers_in_due_order(rmq: Settings, orders: str) -> None:
    with Publisher(rmq) as publisher:
        results = publisher.publish_many(
            [
                {"destination": orders, "body": f"{d}", "delay": d, "reply_to": "replies"}
                for d in (1.2, 0.6, 0)
            ]
        )
    assert [r.due_at_ms for r in results] == sorted(r.due_at_ms for r in results)[::-1]
    connection = pika.BlockingConnection(pika.URLParameters(rmq.url.get_secret_value()))
    try:
        channel = connection.channel()
        bodies: list[bytes] = []
        for method, props, body in channel.consume(work_queue(rmq, orders), inactivity_timeout=5):
            assert method is not None and props is not None, f"timed out after {bodies}"
            assert method.delivery_tag is not None and body is not None
            channel.basic_ack(method.delivery_tag)
            assert props.reply_to == "replies" and props.delivery_mode == 2
            bodies.append(body)
            if len(bodies) == 3:
                break
    finally:
        connection.close()
    assert bodies == [b"0", b"0.6", b"1.2"]


@pytest.mark.usefixtures("pika_path")
async def test_unknown_destination_raises_before_sending(rmq: Settings) -> None:
    with Publisher(rmq) as publisher, pytest.raises(UnknownDestinationError, match="nowhere"):
        publisher.publish("nowhere", b"x", delay=1)
    async with AsyncPublisher(rmq) as apublisher:
        with pytest.raises(UnknownDestinationError, match="topology apply"):
            await apublisher.publish("nowhere", b"x", delay=1)


@pytest.mark.usefixtures("pika_path")
async def test_return_raises_unroutable(rmq: Settings, orders: str) -> None:
    """A cached destination whose queue vanished: the broker returns the message."""
    async with AsyncPublisher(rmq) as publisher:
        publisher.core.known_destinations.add("ghost")
        with pytest.raises(UnroutableError, match="ghost"):
            await publisher.publish("ghost", b"x", delay=0)
        assert "ghost" not in publisher.core.known_destinations
    with Publisher(rmq) as sync_publisher:
        sync_publisher.core.known_destinations.add("ghost")
        with pytest.raises(UnroutableError, match="ghost"):
            sync_publisher.publish("ghost", b"x", delay=0)
        # the publisher still works after a return
        assert sync_publisher.publish(orders, b"ok", delay=0).hops == 0


def refusing_work_queue(amqp_url: str, prefix: str, max_length: int) -> Settings:
    """Settings with no topology (nor schedule journal) and a hand-made work queue for
    destination ``full`` that refuses what comes past ``max_length`` messages."""
    settings = Settings(
        url=amqp_url, prefix=prefix, max_delay="1m", queue_type="classic", schedule_journal=False
    )
    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    connection.channel().queue_declare(
        work_queue(settings, "full"),
        arguments={"x-max-length": max_length, "x-overflow": "reject-publish"},
    )
    connection.close()
    return settings


@pytest.mark.usefixtures("pika_path")
async def test_nack_raises(amqp_url: str, prefix: str) -> None:
    settings = refusing_work_queue(amqp_url, prefix, 0)
    with Publisher(settings) as publisher, pytest.raises(PublishNackedError):
        publisher.publish("full", b"x", delay=0)
    async with AsyncPublisher(settings) as apublisher:
        with pytest.raises(PublishNackedError):
            await apublisher.publish("full", b"x", delay=0)


@pytest.mark.usefixtures("pika_path", "aio_path")
async def test_a_batch_names_each_failure_and_confirms_the_rest(rmq: Settings, orders: str) -> None:
    """Both publishers send a batch as windows of frames written at once: a message the
    broker returns fails alone, by its id, and the others are confirmed."""
    for kind in ("sync", "async"):
        requests: list[dict[str, object]] = [
            {"destination": orders, "body": b"a", "delay": 0, "message_id": f"{kind}-a"},
            {"destination": "ghost", "body": b"b", "delay": 0, "message_id": f"{kind}-ghost"},
            {"destination": orders, "body": b"c", "delay": "30s", "message_id": f"{kind}-c"},
        ]
        with pytest.raises(BatchPublishError) as info:
            if kind == "sync":
                with Publisher(rmq) as publisher:
                    publisher.core.known_destinations.add("ghost")
                    publisher.publish_many(requests)
            else:
                async with AsyncPublisher(rmq) as apublisher:
                    apublisher.core.known_destinations.add("ghost")
                    await apublisher.publish_many(requests)
        assert list(info.value.failures) == [f"{kind}-ghost"], kind
        assert isinstance(info.value.failures[f"{kind}-ghost"], UnroutableError)
        assert info.value.confirmed == 2


@pytest.mark.usefixtures("pika_path", "aio_path")
async def test_a_nacked_batch_fails_message_by_message(amqp_url: str, prefix: str) -> None:
    settings = refusing_work_queue(amqp_url, prefix, 1)
    requests = [{"destination": "full", "body": str(i), "delay": 0} for i in range(5)]
    with Publisher(settings) as publisher, pytest.raises(BatchPublishError) as sync_info:
        publisher.publish_many(requests)
    async with AsyncPublisher(settings) as apublisher:
        with pytest.raises(BatchPublishError) as async_info:
            await apublisher.publish_many(requests)
    assert sync_info.value.confirmed == 1 and len(sync_info.value.failures) == 4
    assert async_info.value.confirmed == 0 and len(async_info.value.failures) == 5
    for failure in [*sync_info.value.failures.values(), *async_info.value.failures.values()]:
        assert isinstance(failure, PublishNackedError)


@pytest.mark.usefixtures("pika_path")
# a closed connection is the same for every queue type, and each run waits ~9 s for the
# management API to list the connection before closing it: one queue type
@pytest.mark.parametrize("rmq", ["quorum"], indirect=True)
def test_closed_connection_raises_not_success(
    rmq: Settings, orders: str, admin: BrokerAdmin, prefix: str
) -> None:
    # on a connection it was given: one it opened itself reconnects (test_publisher_recovery)
    with Publisher(rmq, connection=connect_blocking(rmq, "pub")) as publisher:
        publisher.publish(orders, b"warm", delay=0)
        assert admin.close_connections(prefix) >= 1
        with pytest.raises(PublisherClosedError):
            publisher.publish(orders, b"lost?", delay=0)


def test_conflicting_delivery_limit_names_object_argument_and_values(
    amqp_url: str, prefix: str
) -> None:
    rmq = Settings(url=amqp_url, prefix=prefix, max_delay="1m", queue_type="quorum")
    with TopologyManager(rmq) as manager:
        manager.apply(["orders"])
    changed = rmq.replace(delivery_limit=3)
    with TopologyManager(changed) as manager:
        with pytest.raises(TopologyConflictError) as info:
            manager.apply(["orders"])
        states = {s.name: s for s in manager.plan(["orders"])}
    assert info.value.name == work_queue(rmq, "orders")
    assert info.value.argument == "x-delivery-limit"
    assert "20" in info.value.found and "3" in info.value.wanted
    assert str(info.value).startswith(f"queue {work_queue(rmq, 'orders')!r} exists with")
    assert states[work_queue(rmq, "orders")].status == "differs"


def test_existing_queue_with_other_arguments_stops_apply(
    rmq: Settings, shared_topology: TestTopology
) -> None:
    legacy = shared_topology.dest("legacy")
    wanted = build_topology(rmq.layout, [legacy]).queue(work_queue(rmq, legacy)).arguments
    connection = pika.BlockingConnection(pika.URLParameters(rmq.url.get_secret_value()))
    connection.channel().queue_declare(
        work_queue(rmq, legacy), durable=True, arguments={**wanted, "x-max-length": 10}
    )
    connection.close()
    with TopologyManager(rmq) as manager, pytest.raises(TopologyConflictError) as info:
        manager.apply([legacy])
    assert info.value.name == work_queue(rmq, legacy)
    assert info.value.argument == "x-max-length"
    assert "10" in info.value.found


def test_conflicting_queue_type(rmq: Settings) -> None:
    other = "classic" if rmq.queue_type == "quorum" else "quorum"
    changed = rmq.replace(queue_type=other)
    with TopologyManager(changed) as manager, pytest.raises(TopologyConflictError, match="x-q"):
        manager.apply()


def test_verify_finds_a_missing_object(own_rmq: Settings) -> None:
    with TopologyManager(own_rmq) as manager:
        assert manager.verify(["orders"]) == []
        tier = manager.layout.tiers[3].queue
        connection = pika.BlockingConnection(pika.URLParameters(own_rmq.url.get_secret_value()))
        connection.channel().queue_delete(tier)
        connection.close()
        problems = manager.verify(["orders"])
        assert problems[0] == f"queue {tier!r} is missing"
        # deleting a queue drops its bindings, and verify sees those too (management API)
        assert all(p.startswith("binding ") and f"-> {tier} [" in p for p in problems[1:])
        assert any(s.name == tier and s.status == "missing" for s in manager.plan(["orders"]))


async def test_deleted_destination_parks_and_does_not_stall_the_tier(
    rmq: Settings, orders: str, other: str
) -> None:
    async with AsyncPublisher(rmq) as publisher:
        doomed = await publisher.publish(orders, b"doomed", delay=1, headers={"k": "v"})
        connection = pika.BlockingConnection(pika.URLParameters(rmq.url.get_secret_value()))
        connection.channel().queue_delete(work_queue(rmq, orders))
        connection.close()
        async with (
            Collector(rmq.url.get_secret_value(), work_queue(rmq, other)) as other_queue,
            Collector(rmq.url.get_secret_value(), f"{rmq.prefix}.parking") as parking,
        ):
            # Published after, through the same tiers: must not wait behind the doomed one.
            survivor = await publisher.publish(other, b"later", delay=1)
            parked = await parking.wait_for(1, timeout=10)
            arrived = await other_queue.wait_for(1, timeout=10)
    assert [p.message_id for p in parked] == [doomed.message_id]
    assert parked[0].body == b"doomed"
    assert parked[0].headers["k"] == "v"
    assert parked[0].headers[DESTINATION] == orders
    assert parked[0].headers[DUE_AT] == doomed.due_at_ms
    assert [a.message_id for a in arrived] == [survivor.message_id]
    assert 0 <= arrived[0].lateness_ms < LATE_BOUND_MS


@pytest.mark.usefixtures("pika_path")
async def test_limited_user_publishes_and_consumes_without_configure(
    rmq: Settings, orders: str, admin: BrokerAdmin, prefix: str
) -> None:
    user, password = f"{prefix}-user", "s3cret-pw"
    admin.add_user(user, password, configure="^$", write=".*", read=".*")
    host = rmq.url.get_secret_value().split("@", 1)[1]
    limited = rmq.replace(url=SecretUrl(f"amqp://{user}:{password}@{host}"))
    with TopologyManager(limited) as manager:
        assert manager.verify([orders]) == []
    async with (
        Collector(limited.url.get_secret_value(), work_queue(rmq, orders)) as collector,
        AsyncPublisher(limited) as publisher,
    ):
        await publisher.publish(orders, b"a", delay=0.3)
        with Publisher(limited) as sync_publisher:
            sync_publisher.publish(orders, b"b", delay=0.1)
        received = await collector.wait_for(2, timeout=10)
    assert sorted(r.body for r in received) == [b"a", b"b"]
    connection = await aio_pika.connect(limited.url.get_secret_value())
    try:  # and it really cannot configure
        channel = await connection.channel()
        with pytest.raises(aiormq.exceptions.ChannelAccessRefused):
            await channel.declare_queue(f"{prefix}.not-allowed")
    finally:
        await connection.close()
