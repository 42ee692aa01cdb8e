"""Parked messages survive being read: the parking queue's delivery limit, on 3.10 and 4.0.

Every read of a parked message (``parked list``, a ``parked replay`` that leaves it,
``status --parked-by-destination``) gives it back unacked, which a quorum queue counts as
a return. RabbitMQ 4.0 gives a queue without ``x-delivery-limit`` a limit of 20 and drops
the message at its 21st return; rmqdelay declares the parking queue with the largest
limit. A parking queue declared before that (rmqdelay 0.1) is kept and named; a policy
gives it a limit (docs/operations/rabbitmq-versions.md).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pika
import pytest

from rmqdelay import Settings, TopologyConflictError, TopologyManager
from rmqdelay.amqp.parked_queue import ParkedQueue
from rmqdelay.amqp.passive import ready_messages
from rmqdelay.amqp.status import peek_parked
from rmqdelay.amqp.topology_manager import DELIVERY_LIMIT_NOTE
from rmqdelay.core.handling.parking import PARKED_DESTINATION, PARKED_REASON
from tests.helpers.brokerctl import BrokerAdmin
from tests.helpers.worker_helpers import TestTopology

READS = 25  # past 4.0's default limit of 20


def _park_one(settings: Settings, destination: str) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(settings.url.get_secret_value()))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        headers = {PARKED_DESTINATION: destination, PARKED_REASON: "test"}
        props = pika.BasicProperties(headers=headers, delivery_mode=2)
        # straight to the queue: a parking queue of its own has no exchange yet
        channel.basic_publish("", settings.layout.parking, b"parked", props, mandatory=True)
    finally:
        connection.close()


def _parked_now(settings: Settings) -> int:
    connection = pika.BlockingConnection(pika.URLParameters(settings.url.get_secret_value()))
    try:
        return ready_messages(connection, settings.layout.parking, 5.0) or 0
    finally:
        connection.close()


async def _back(settings: Settings, *, timeout: float = 5.0) -> int:
    """What parking holds once a closed channel gave its messages back (a moment later)."""
    deadline = time.monotonic() + timeout
    while (n := _parked_now(settings)) < 1 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return n


Reader = Callable[[Settings, str], Awaitable[int]]


async def _by_list(settings: Settings, _destination: str) -> int:
    async with ParkedQueue(settings) as parked:
        _total, found = await parked.list()
    return len(found)


async def _by_replay_of_another(settings: Settings, _destination: str) -> int:
    """``parked replay -d other`` reads every parked message and leaves them parked."""
    seen: list[int] = []
    async with ParkedQueue(settings) as parked:
        report = await parked.replay("someone-else", progress=seen.append)
    assert report.replayed == 0
    return max(seen, default=0)


async def _by_status_peek(settings: Settings, destination: str) -> int:
    connection = pika.BlockingConnection(pika.URLParameters(settings.url.get_secret_value()))
    try:
        breakdown = peek_parked(connection, settings.layout, 100)
    finally:
        connection.close()
    assert breakdown is not None
    return breakdown.destinations.get(destination, 0)


async def _read_many(settings: Settings, destination: str, read: Reader, times: int) -> list[int]:
    """How many parked messages each of ``times`` reads found."""
    found = []
    for _ in range(times):
        await _back(settings)
        found.append(await read(settings, destination))
    return found


@pytest.mark.parametrize(
    "read",
    [_by_list, _by_replay_of_another, _by_status_peek],
    ids=["parked-list", "parked-replay-leaving-it", "status-parked-by-destination"],
)
async def test_a_parked_message_survives_25_reads(
    shared_topology: TestTopology, read: Reader, broker_version: tuple[int, ...]
) -> None:
    dest = shared_topology.dest("jobs")
    settings = shared_topology.settings([dest])
    _park_one(settings, dest)
    found = await _read_many(settings, dest, read, READS)
    assert found == [1] * READS, f"on {broker_version}"
    assert await _back(settings) == 1


def _old_parking(settings: Settings, **arguments: Any) -> None:
    """Declare the parking queue as rmqdelay 0.1 did: no ``x-delivery-limit`` (or
    ``arguments`` added), the rest as now."""
    with TopologyManager(settings) as manager:
        wanted = dict(manager.topology().queue(settings.layout.parking).arguments)
    del wanted["x-delivery-limit"]
    connection = pika.BlockingConnection(pika.URLParameters(settings.url.get_secret_value()))
    try:
        connection.channel().queue_declare(
            settings.layout.parking, durable=True, arguments={**wanted, **arguments}
        )
    finally:
        connection.close()


def _settings(amqp_url: str, prefix: str) -> Settings:
    return Settings(url=amqp_url, prefix=prefix, max_delay="10s", connection_name=prefix)


def test_an_old_parking_queue_without_a_limit_is_kept_and_named(amqp_url: str, prefix: str) -> None:
    settings = _settings(amqp_url, prefix)
    _old_parking(settings)
    with TopologyManager(settings) as manager:
        planned = {s.name: s for s in manager.plan(["orders"])}
        assert manager.delivery_limit_kept == [settings.layout.parking]
        parking = planned[settings.layout.parking]
        assert parking.status == "ok"
        assert DELIVERY_LIMIT_NOTE in parking.detail
        assert all(s.status != "differs" for s in planned.values())
    with TopologyManager(settings) as manager:
        manager.apply(["orders"])  # no conflict: the rest is declared
        assert manager.delivery_limit_kept == [settings.layout.parking]
        assert manager.placement_kept == []
        assert manager.verify(["orders"]) == []


def test_a_parking_queue_with_another_limit_still_conflicts(amqp_url: str, prefix: str) -> None:
    settings = _settings(amqp_url, prefix)
    _old_parking(settings, **{"x-delivery-limit": 5})
    with TopologyManager(settings) as manager:
        parking = {s.name: s for s in manager.plan()}[settings.layout.parking]
        assert parking.status == "differs"
        assert "x-delivery-limit" in parking.detail
    with TopologyManager(settings) as manager, pytest.raises(TopologyConflictError) as info:
        manager.apply()
    assert info.value.argument == "x-delivery-limit"
    assert manager.delivery_limit_kept == []


def _delivery_limit(admin: BrokerAdmin, queue: str) -> object:
    """The limit in force as 4.x's management API reports it (once a stats tick ran)."""
    return admin.queue(queue).get("delivery_limit")


async def _reads_until_gone(settings: Settings, most: int) -> int:
    """Read the one parked message with ``parked list`` until it is gone (or ``most``)."""
    reads = 0
    while reads < most and await _back(settings, timeout=2.0):
        reads += await _by_list(settings, "orders")
    return reads


async def test_an_old_parking_queue_on_4_needs_the_policy_and_3_10_nothing(
    amqp_url: str, prefix: str, broker_version: tuple[int, ...], admin: BrokerAdmin
) -> None:
    """The migration docs/operations/rabbitmq-versions.md gives: on 4.x a policy
    ``delivery-limit: -1`` (without
    it, measured here, the message is gone after 21 reads); 3.10 keeps it as it is, and
    must not get that policy (-1 there means "drop at the first return")."""
    settings = _settings(amqp_url, prefix)
    _old_parking(settings)
    _park_one(settings, "orders")
    reads = await _reads_until_gone(settings, READS)
    if broker_version < (4, 0):
        assert reads == READS
        return
    assert reads == 21, "4.0's default limit: 20 returns, the 21st drops it"
    if not admin.uses_management_api:
        pytest.skip("setting a policy here needs the management API")
    pattern = "^" + settings.layout.parking.replace(".", "[.]") + "$"
    policy = {"delivery-limit": -1}
    with admin.policy(prefix, pattern, policy, apply_to="quorum_queues"):
        deadline = time.monotonic() + 30  # the API shows it after the queue's stats tick
        while _delivery_limit(admin, settings.layout.parking) != "unlimited":
            assert time.monotonic() < deadline, "the policy never reached the parking queue"
            await asyncio.sleep(0.5)
        _park_one(settings, "orders")
        assert await _reads_until_gone(settings, READS) == READS
        assert await _back(settings) == 1
