"""A hop stuck on purpose, for the tests of past-time messages (``status --check``, the
worker's gauges): the next queue refuses what the tier dead-letters into it.

A policy ``max-length: 0`` on the destination's work queue (declared with ``x-overflow:
reject-publish``) makes it refuse publishes once it is over that limit; the tier's
at-least-once dead-letter worker then holds the expired messages (``messages_dlx``).
On RabbitMQ 3.10.8 they stay held after the policy is gone and the work queue accepts
again (measured: none had moved 20 minutes later; its dead-letter worker ignores a
refusal and has no reason to send again), so a test reads them and leaves them for the
``prefix`` cleanup to delete.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pika
import pika.exceptions

from rmqdelay import Publisher, Settings
from rmqdelay.amqp.status import gather_status
from rmqdelay.core.plan import plan_delay
from tests.helpers.brokerctl import BrokerAdmin
from tests.helpers.worker_helpers import make_settings

__all__ = ["management_has_statistics", "stuck_hop", "stuck_hop_settings"]

STATISTICS_WAIT = 30.0
"""The API lists a new queue's counts after its first statistics tick (5 s by default)."""


def management_has_statistics(settings: Settings) -> None:
    """Wait until the management API counts past-time messages for every tier."""
    deadline = time.monotonic() + STATISTICS_WAIT
    while True:
        status = gather_status(settings, journal_oldest=False)
        if status.source == "management API" and status.past_due is not None:
            return
        assert time.monotonic() < deadline, f"no statistics for every tier: {status.tiers}"
        time.sleep(0.5)


def stuck_hop_settings(amqp_url: str, prefix: str, destination: str) -> Settings:
    """Settings for these tests: tiers of 1 s to 10 min declared for ``destination`` (a
    delay of one resolution takes one hop), once the management API counts them."""
    settings = make_settings(amqp_url, prefix, [destination], max_delay="10m", resolution="1s")
    management_has_statistics(settings)
    return settings


def _refuse_publishes(settings: Settings, queue: str) -> int:
    """Publish to ``queue`` until it refuses one (the policy applies within moments)."""
    connection = pika.BlockingConnection(pika.URLParameters(settings.url.get_secret_value()))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        for accepted in range(50):
            try:
                channel.basic_publish("", queue, b"filler", mandatory=True)
            except pika.exceptions.NackError:
                return accepted
            time.sleep(0.1)
        raise AssertionError(f"{queue} accepted 50 messages: the policy did not apply")
    finally:
        connection.close()


@contextmanager
def stuck_hop(
    settings: Settings, admin: BrokerAdmin, destination: str, count: int
) -> Iterator[str]:
    """``count`` messages past their time in the one tier of the smallest delay; yields
    that tier's name once the management API shows all of them held there."""
    layout = settings.layout
    plan = plan_delay(layout, layout.resolution_ms * 1000, destination)
    [hop] = plan.hops
    work = layout.work_queue(destination)
    refuse = {"max-length": 0}
    with admin.policy(f"{settings.prefix}-refuse", f"^{re.escape(work)}$", refuse, priority=100):
        assert _refuse_publishes(settings, work) >= 1
        with Publisher(settings) as publisher:
            delay = f"{layout.resolution_ms}ms"
            publisher.publish_many(
                {"destination": destination, "body": b"x", "delay": delay} for _ in range(count)
            )
        deadline = time.monotonic() + STATISTICS_WAIT
        while True:
            status = gather_status(settings, journal_oldest=False)
            [tier] = [t for t in status.tiers if t.queue == hop.queue]
            # both counts from one consistent sample: under load the API has been seen to
            # report them past due while its ready count still held them (3, 3)
            if tier.past_due == count and tier.messages == 0:
                break
            assert time.monotonic() < deadline, f"never held past their time: {tier}"
            time.sleep(0.5)
        yield hop.queue
