"""Where RabbitMQ 3.10 and 4.x differ, and what rmqdelay does about it.

The suite runs on each (``make test`` on Debian bookworm's 3.10, ``make test-rmq43`` on
sid's 4.3, ``make test-rmq4`` on trixie's 4.0); each test here asserts the behaviour of
the version it finds.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pika

from rmqdelay import Publisher, Settings
from rmqdelay.amqp.parked_queue import ParkedQueue
from rmqdelay.core.plan import plan_delay
from tests.helpers.worker_helpers import make_settings, work_queue

DEST = "versions"


def _x_death(queue: str, exchange: str, key: str) -> list[dict[str, Any]]:
    """An ``x-death`` as the broker writes it after ``queue``'s TTL expired once."""
    return [
        {
            "count": 1,
            "reason": "expired",
            "queue": queue,
            "exchange": exchange,
            "routing-keys": [key],
            "time": int(time.time()),
        }
    ]


def _delivered_within(settings: Settings, seconds: float) -> int:
    connection = pika.BlockingConnection(pika.URLParameters(settings.url.get_secret_value()))
    try:
        channel = connection.channel()
        deadline = time.monotonic() + seconds
        got = 0
        while time.monotonic() < deadline:
            method, _props, _body = channel.basic_get(work_queue(settings, DEST), auto_ack=True)
            if method is not None:
                got += 1
            else:
                time.sleep(0.05)
        return got
    finally:
        connection.close()


def test_a_client_set_x_death_drops_the_message_before_4_and_not_after(
    amqp_url: str, prefix: str, broker_version: tuple[int, ...]
) -> None:
    """The dead-letter cycle trap (RabbitMQ before 4.0.1; Celery issue 9867).

    A message carrying an ``x-death`` for the tier its first tier dead-letters into is
    dropped there on 3.x, as a dead-letter cycle (a retry through the same tiers); 4.0 ignores an
    ``x-death`` the client set. So rmqdelay strips those headers on every publish, and a
    retry or replay is delivered on both.
    """
    settings = make_settings(amqp_url, prefix, [DEST], max_delay="10s")
    plan = plan_delay(settings.layout, 300_000, DEST)  # 300 ms: 0x1e, two tiers
    # as if it had already expired in the tier it dead-letters into next: 3.x sees a cycle
    tier = plan.hops[1]
    headers: dict[str, Any] = {"x-death": _x_death(tier.queue, tier.queue, plan.routing_key)}
    connection = pika.BlockingConnection(pika.URLParameters(settings.url.get_secret_value()))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.basic_publish(
            plan.exchange,
            plan.publish_key,
            b"raw",
            pika.BasicProperties(delivery_mode=2, headers=headers),
            mandatory=True,
        )
    finally:
        connection.close()
    raw = _delivered_within(settings, 2.0)
    with Publisher(settings) as publisher:  # rmqdelay's own publish, same headers
        publisher.publish(DEST, b"via rmqdelay", delay="300ms", headers=headers)
    ours = _delivered_within(settings, 2.0)
    assert ours == 1
    if broker_version < (4, 0, 1):
        assert raw == 0, "3.x should drop the cycle; if no longer, update rabbitmq-versions.md"
    else:
        assert raw == 1


def test_the_delivery_limit_rmqdelay_declares_is_the_one_in_force(
    amqp_url: str, prefix: str, broker_version: tuple[int, ...]
) -> None:
    """4.0 gives quorum queues a default delivery limit of 20; rmqdelay always declares
    its own (``delivery_limit``), so both versions park after the same count."""
    settings = make_settings(amqp_url, prefix, [DEST], max_delay="10s", delivery_limit=2)
    queue = work_queue(settings, DEST)
    with Publisher(settings) as publisher:
        publisher.publish(DEST, b"poison", delay=0)
    connection = pika.BlockingConnection(pika.URLParameters(settings.url.get_secret_value()))
    try:
        channel = connection.channel()
        returned = 0
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            method, _props, _body = channel.basic_get(queue)
            if method is None:
                if returned:
                    break
                time.sleep(0.05)
                continue
            assert method.delivery_tag is not None
            channel.basic_reject(method.delivery_tag, requeue=True)
            returned += 1
        parked = 0
        while parked == 0 and time.monotonic() < deadline:
            declared = channel.queue_declare(settings.layout.parking, passive=True)
            parked = declared.method.message_count
            time.sleep(0.05)
    finally:
        connection.close()
    # the limit counts returned deliveries: 2 allowed, the third return parks it
    assert returned == 3, f"{returned} deliveries on {broker_version}"
    assert parked == 1


async def test_a_parked_message_survives_every_parked_list(
    amqp_url: str, prefix: str, broker_version: tuple[int, ...]
) -> None:
    """``parked list`` reads without acking and gives every message back: each read is a
    return, and since 4.0 a quorum queue declared without ``x-delivery-limit`` drops a
    message after 20 (the parking queue has no dead-letter exchange). 3.10 has no limit;
    rmqdelay declares the parking queue with the largest one, so both keep it.
    """
    settings = make_settings(amqp_url, prefix, [DEST], max_delay="10s")
    connection = pika.BlockingConnection(pika.URLParameters(settings.url.get_secret_value()))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        headers = {"rmqdelay-parked-destination": DEST, "rmqdelay-parked-reason": "test"}
        channel.basic_publish(
            "", settings.layout.parking, b"parked", pika.BasicProperties(headers=headers)
        )
    finally:
        connection.close()
    reads = 0
    async with ParkedQueue(settings) as parked:
        for _ in range(25):
            # a closed channel gives its messages back a moment later: wait for it
            deadline = time.monotonic() + 5
            while await parked.count() == 0 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            _total, found = await parked.list()
            reads += len(found)
    assert reads == 25, f"read {reads} times in 25 lists on {broker_version}"
