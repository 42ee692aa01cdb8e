"""The sync publisher on both of its ways through pika, where they differ in kind.

The fast path pipelines confirms through pika's internals; the public path (forced by
the ``pika_path`` fixture, as by ``RMQDELAY_CLIENT_FAST=0``) uses BlockingChannel and
waits for each confirm. The other sync publisher tests run on both too (they ask for
the ``pika_path`` fixture); these check what only the switch shows.
"""

from __future__ import annotations

import pika
import pytest

from rmqdelay import BatchPublishError, Publisher, UnroutableError
from rmqdelay.amqp.passive import ready_messages
from rmqdelay.amqp.pika_confirms import OneByOne, Pipelined
from tests.helpers.worker_helpers import TestTopology, work_queue

DEST = "orders"


def test_the_switch_picks_the_confirm_channel(
    shared_topology: TestTopology, pika_path: str
) -> None:
    dest = shared_topology.dest(DEST)
    settings = shared_topology.settings([dest])
    with Publisher(settings) as publisher:
        publisher.publish(dest, b"x", delay=0)
        expected = Pipelined if pika_path == "pika-fast" else OneByOne
        assert type(publisher._channel) is expected
        connection = publisher._connection
        assert connection is not None
        assert ready_messages(connection, work_queue(settings, dest), 5) == 1
        assert ready_messages(connection, work_queue(settings, "nowhere"), 5) is None


@pytest.mark.usefixtures("pika_path")
def test_a_missing_tier_exchange_fails_the_batch_and_the_publisher_goes_on(
    shared_topology: TestTopology,
) -> None:
    """The broker closes the channel on the first message to a deleted exchange (404),
    and drops what follows on it: every delayed message fails as not sent. (Tiers of
    their own, max_delay 2h: the other tests keep theirs.)"""
    settings = shared_topology.settings([DEST], max_delay="2h")
    connection = pika.BlockingConnection(pika.URLParameters(settings.url.get_secret_value()))
    try:
        channel = connection.channel()
        for tier in settings.layout.tiers:
            channel.exchange_delete(tier.queue)
    finally:
        connection.close()
    with Publisher(settings) as publisher:
        requests = [{"destination": DEST, "body": f"m{i}", "delay": "5m"} for i in range(3)]
        with pytest.raises(BatchPublishError) as info:
            publisher.publish_many(requests)
        assert len(info.value.failures) == 3 and info.value.confirmed == 0
        for failure in info.value.failures.values():
            assert isinstance(failure, UnroutableError)
            assert "was not sent" in str(failure) and "topology apply" in str(failure)
        assert publisher.publish(DEST, b"now", delay=0).hops == 0
