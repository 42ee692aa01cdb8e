"""The cluster itself, before any rmqdelay test relies on it: leaders are spread, and a
confirmed message survives a kill -9 of its queue's leader."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel
from pika.exceptions import AMQPError

from tests.helpers.cluster_support import Cluster

QUORUM = {"x-queue-type": "quorum", "x-queue-leader-locator": "balanced"}


@pytest.fixture
def queues(cluster: Cluster) -> Iterator[list[str]]:
    """Six quorum queues declared on node 1 with the balanced leader locator."""
    prefix = f"t-smoke-{uuid.uuid4().hex[:6]}"
    names = [f"{prefix}.q{i}" for i in range(6)]
    with _channel(cluster.urls[0]) as channel:
        for name in names:
            channel.queue_declare(name, durable=True, arguments=QUORUM)
    yield names
    with _channel(cluster.urls[0]) as channel:
        for name in names:
            channel.queue_delete(name)


@contextlib.contextmanager
def _channel(url: str) -> Iterator[BlockingChannel]:
    """A channel on a connection of its own to *url*, closed on exit."""
    params = pika.URLParameters(url)
    params.connection_attempts = 1
    params.socket_timeout = 5
    connection = pika.BlockingConnection(params)
    try:
        yield connection.channel()
    finally:
        if connection.is_open:
            connection.close()


def _get_within(url: str, queue: str, seconds: float) -> bytes | None:
    """basic.get from *queue* through node *url*, retried while the queue elects a new
    leader (the channel is closed meanwhile)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with _channel(url) as channel:
                method, _props, body = channel.basic_get(queue, auto_ack=True)
                if method is not None:
                    return body
        except AMQPError:
            pass
        time.sleep(0.5)
    return None


def test_leaders_spread_and_a_killed_leader_loses_no_confirmed_message(
    cluster: Cluster, queues: list[str]
) -> None:
    leaders = {name: cluster.leader(name) for name in queues}
    assert len(set(leaders.values())) > 1, f"balanced put every leader on one node: {leaders}"

    queue = queues[0]
    body = uuid.uuid4().bytes
    with _channel(cluster.urls[0]) as channel:
        channel.confirm_delivery()  # basic_publish raises unless the broker confirms
        channel.basic_publish(
            "", queue, body, pika.BasicProperties(delivery_mode=2), mandatory=True
        )

    leader = cluster.index_of(leaders[queue])
    other = next(i for i in range(len(cluster.urls)) if i != leader)
    cluster.kill(leader)
    try:
        assert _get_within(cluster.urls[other], queue, 60) == body
        assert cluster.leader(queue, node=other) != leaders[queue]
    finally:
        cluster.restart(leader)
    assert cluster.running_nodes(leader) == len(cluster.urls) == 3
