"""Helpers for the x-delay bridge's tests: a test's bridge (``NAME``, its consumers'
queues, a pika publisher as the plugin's README publishes), polling what arrives and what
was parked."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import Any

import pika

from rmqdelay import ParkedQueue, Settings
from rmqdelay.bridge.app import Bridge
from rmqdelay.bridge.declare import BridgeDeclared, declare_bridge
from rmqdelay.bridge.names import BridgeNames, bridge_names
from rmqdelay.core.handling.parking import ParkedMessage
from tests.helpers.worker_helpers import TestTopology, wait_until

Received = tuple[float, str, Any, bytes]
"""(time.time() on arrival, routing key, pika properties, body)."""


@dataclass
class BridgeCase:
    """One test's bridge: ``NAME`` is ``{prefix}.ex``, on the module's topology."""

    settings: Settings
    names: BridgeNames
    prefix: str
    url: str
    queues: list[str] = field(default_factory=list)
    _connection: pika.BlockingConnection | None = None
    _channel: Any = None

    @property
    def channel(self) -> Any:
        if self._connection is None or not self._connection.is_open:
            self._connection = pika.BlockingConnection(pika.URLParameters(self.url))
            channel = self._connection.channel()
            channel.confirm_delivery()
            self._channel = channel
        return self._channel

    def close(self) -> None:
        if self._connection is not None and self._connection.is_open:
            self._connection.close()

    def declare(self, kind: str) -> BridgeDeclared:
        return declare_bridge(self.settings, self.names, kind)

    def bind(self, key: str = "", arguments: dict[str, Any] | None = None) -> str:
        """A consumer's queue bound to ``DNAME``, as a plugin user's consumer would be."""
        queue = f"{self.prefix}.q{len(self.queues)}"
        self.channel.queue_declare(queue, durable=True)
        self.channel.queue_bind(queue, self.names.delivery_exchange, key, arguments)
        self.queues.append(queue)
        return queue

    def publish(
        self,
        key: str,
        body: bytes,
        x_delay: object = None,
        headers: dict[str, Any] | None = None,
        **properties: Any,
    ) -> float:
        """Publish as the plugin's README does; the time just before, for lateness."""
        sent = dict(headers or {})
        if x_delay is not None:
            sent["x-delay"] = x_delay
        props = pika.BasicProperties(headers=sent or None, **properties)
        at = time.time()
        self.channel.basic_publish(self.names.exchange, key, body, props, mandatory=True)
        return at

    def get(self, queue: str) -> Received | None:
        method, props, body = self.channel.basic_get(queue, auto_ack=True)
        if method is None:
            return None
        return (time.time(), method.routing_key, props, body)

    async def collect(self, queue: str, count: int, timeout: float) -> list[Received]:
        """The first ``count`` messages of ``queue``, polled until ``timeout``."""
        found: list[Received] = []

        def more() -> bool:
            while len(found) < count and (got := self.get(queue)) is not None:
                found.append(got)
            return len(found) >= count

        await wait_until(more, timeout, lambda: f"{count} messages in {queue} (got {len(found)})")
        return found

    def ready(self, queue: str) -> int:
        return int(self.channel.queue_declare(queue, passive=True).method.message_count)

    @asynccontextmanager
    async def running(self, inbox_process: bool = False, **options: Any) -> AsyncIterator[Bridge]:
        bridge = Bridge(self.settings, self.names.exchange, inbox_process=inbox_process)
        async with bridge.running(**options):
            yield bridge


@contextmanager
def bridge_case(shared_topology: TestTopology, amqp_url: str) -> Iterator[BridgeCase]:
    """A bridge of the test's own (``NAME`` = ``{prefix}.ex``) on the module's topology."""
    settings = shared_topology.settings([])
    names = bridge_names(settings.layout, f"{shared_topology.prefix}.ex")
    found = BridgeCase(settings, names, shared_topology.prefix, str(amqp_url))
    try:
        yield found
    finally:
        found.close()


async def parked(settings: Settings, destination: str) -> list[ParkedMessage]:
    async with ParkedQueue(settings) as queue:
        _total, found = await queue.list(destination=destination)
    return found


async def wait_parked(
    settings: Settings, destination: str, count: int, timeout: float = 30
) -> list[ParkedMessage]:
    """Poll the parking queue until ``count`` messages of ``destination`` are there."""
    deadline = time.monotonic() + timeout
    while len(found := await parked(settings, destination)) < count:
        if time.monotonic() > deadline:
            raise AssertionError(f"{len(found)} of {count} messages parked after {timeout}s")
        await asyncio.sleep(0.2)
    return found


def assert_on_time(sent_at: float, delay_ms: int, arrived: float, late_ms: float = 3000) -> None:
    """Never early; late only by a generous bound (timing targets live in bench/)."""
    due = sent_at + delay_ms / 1000
    assert arrived >= due - 0.002, f"early by {(due - arrived) * 1000:.0f} ms"
    assert arrived - due < late_ms / 1000, f"late by {(arrived - due) * 1000:.0f} ms"
