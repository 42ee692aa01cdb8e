"""aio-pika plumbing shared by the RabbitMQ peers.

Every RabbitMQ peer uses the same client (aio-pika on one connection: a confirm-mode
publishing channel with ``on_return_raises=True`` and ``mandatory`` publishes, and a
separate consuming channel with manual acks), so differences between peers come from the
broker topology, not the client. Message bodies are ``body_bytes`` of filler; the bench
metadata travels in headers (``x-bench-pub``, ``x-bench-due``) and ``message_id``, which
dead-lettering and exchange-to-exchange routing preserve.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Sequence
from datetime import timedelta
from typing import Any

import aio_pika
import aiormq
from aio_pika.abc import (
    AbstractChannel,
    AbstractConnection,
    AbstractExchange,
    AbstractIncomingMessage,
    AbstractQueue,
)

from bench.common import DEFAULT_AMQP_URL, Record, now_ms
from bench.peers.base import Arrivals, Item, run_windowed, unique_prefix

log = logging.getLogger(__name__)

HDR_PUB = "x-bench-pub"
HDR_DUE = "x-bench-due"
QUEUE_TYPES = ("quorum", "classic")

#: ``routing(delay_ms) -> (routing_key, per-message expiration ms or None)``
RoutingFn = Callable[[int], tuple[str, "int | None"]]


def queue_args(queue_type: str, **extra: Any) -> dict[str, Any]:
    if queue_type not in QUEUE_TYPES:
        raise ValueError(f"queue_type must be one of {QUEUE_TYPES}, not {queue_type!r}")
    return {"x-queue-type": queue_type, **extra}


def make_message(
    message_id: str,
    published_at_ms: int,
    due_at_ms: int,
    body: bytes,
    *,
    expiration_ms: int | None = None,
    extra_headers: dict[str, Any] | None = None,
) -> aio_pika.Message:
    headers: dict[str, Any] = {HDR_PUB: published_at_ms, HDR_DUE: due_at_ms}
    if extra_headers:
        headers.update(extra_headers)
    return aio_pika.Message(
        body,
        message_id=message_id,
        headers=headers,
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        expiration=None if expiration_ms is None else timedelta(milliseconds=expiration_ms),
    )


def header_int(message: AbstractIncomingMessage, key: str) -> int:
    value = (message.headers or {}).get(key)
    if isinstance(value, (int, float, str, bytes)):
        return int(value)
    raise ValueError(f"message {message.message_id!r}: header {key!r} missing or not a number")


def record_from(message: AbstractIncomingMessage, received_at_ms: int) -> Record:
    return Record(
        message_id=str(message.message_id),
        due_at_ms=header_int(message, HDR_DUE),
        received_at_ms=received_at_ms,
        published_at_ms=header_int(message, HDR_PUB),
    )


class AmqpPeer(ABC):
    """Base for the RabbitMQ peers: connection, channels, consumer, drain, teardown.

    Subclasses set ``name``/``description``/``slug``, implement ``_declare()`` (declare the
    topology with ``_declare_queue``/``_declare_exchange`` or register externally declared
    names with ``_track_queue``/``_track_exchange``, then ``await self._consume(queue)``)
    and ``publish()``.
    """

    name: str = "amqp"
    description: str = ""
    supports_delay: bool = True
    slug: str = "amqp"

    def __init__(
        self,
        url: str = DEFAULT_AMQP_URL,
        queue_type: str = "quorum",
        *,
        body_bytes: int = 100,
        window: int = 1000,
        prefetch: int = 1000,
    ) -> None:
        queue_args(queue_type)  # validate early
        self.url = url
        self.queue_type = queue_type
        self.body = b"x" * body_bytes
        self.window = window
        self.prefetch = prefetch
        self.prefix = unique_prefix(self.slug)
        self.arrivals = Arrivals()
        self.cleanup_errors: list[str] = []
        self._conn: AbstractConnection | None = None
        self._pub: AbstractChannel | None = None
        self._sub: AbstractChannel | None = None
        self._queues: list[str] = []
        self._exchanges: list[str] = []
        self._torn_down = False
        self._configure()

    def _configure(self) -> None:  # noqa: B027 - optional hook, empty by default
        """Hook for subclasses: set ``name``, object names and ``description`` from params."""

    # ------------------------------------------------------------------ lifecycle

    async def setup(self) -> None:
        try:
            self._conn = await aio_pika.connect(self.url)
            self._pub = await self._conn.channel(publisher_confirms=True, on_return_raises=True)
            self._sub = await self._conn.channel()
            await self._sub.set_qos(prefetch_count=self.prefetch)
            await self._declare()
        except BaseException:
            await self.teardown()
            raise

    @abstractmethod
    async def _declare(self) -> None: ...

    @abstractmethod
    async def publish(self, batch: Sequence[Item]) -> None: ...

    async def drain(self, expected_ids: Collection[str], timeout: float) -> list[Record]:
        return await self.arrivals.wait_for(expected_ids, timeout)

    async def teardown(self) -> None:
        if self._torn_down:
            return
        self._torn_down = True
        # Close the consuming side first so unacked deliveries go back before deletion.
        for ch in (self._sub, self._pub):
            if ch is not None and not ch.is_closed:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(ch.close(), 10)
        await self._delete_objects()
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._conn.close(), 10)
        for err in self.cleanup_errors:
            log.warning("%s cleanup: %s", self.prefix, err)

    async def _delete_objects(self) -> None:
        """Delete tracked queues then exchanges on a fresh connection (robust to a broken one)."""
        if not (self._queues or self._exchanges):
            return
        try:
            conn = await aio_pika.connect(self.url)
        except Exception as exc:
            self.cleanup_errors.append(f"cannot connect for cleanup: {exc!r}")
            return
        try:
            ch = await conn.channel()
            for kind, names in (("queue", self._queues), ("exchange", self._exchanges)):
                for obj in list(dict.fromkeys(names)):
                    try:
                        if ch.is_closed:
                            ch = await conn.channel()
                        if kind == "queue":
                            await asyncio.wait_for(ch.queue_delete(obj), 30)
                        else:
                            await asyncio.wait_for(ch.exchange_delete(obj), 30)
                    except Exception as exc:
                        self.cleanup_errors.append(f"delete {kind} {obj}: {exc!r}")
        finally:
            with contextlib.suppress(Exception):
                await conn.close()

    # ------------------------------------------------------------------ helpers

    @property
    def pub(self) -> AbstractChannel:
        assert self._pub is not None, "setup() first"
        return self._pub

    @property
    def sub(self) -> AbstractChannel:
        assert self._sub is not None, "setup() first"
        return self._sub

    def _track_queue(self, name: str) -> None:
        self._queues.append(name)

    def _track_exchange(self, name: str) -> None:
        self._exchanges.append(name)

    async def _declare_queue(self, name: str, arguments: dict[str, Any]) -> AbstractQueue:
        self._track_queue(name)  # track before declaring: a half-made queue still gets deleted
        return await self.pub.declare_queue(name, durable=True, arguments=arguments)

    async def _declare_exchange(self, name: str, type_: str = "topic") -> AbstractExchange:
        self._track_exchange(name)
        return await self.pub.declare_exchange(name, type=type_, durable=True)

    async def _consume(self, queue_name: str) -> None:
        """Consume ``queue_name`` on the consuming channel: record, then ack."""
        queue = await self.sub.get_queue(queue_name, ensure=False)

        async def on_message(message: AbstractIncomingMessage) -> None:
            received = now_ms()
            self.arrivals.add(record_from(message, received))
            # During teardown the channel closes under in-flight deliveries: they are
            # requeued by the broker and deleted with the queue, so a failed ack is moot.
            with contextlib.suppress(aiormq.exceptions.ChannelInvalidStateError):
                await message.ack()

        await queue.consume(on_message)

    async def _publish_items(
        self, exchange: AbstractExchange, batch: Sequence[Item], routing: RoutingFn
    ) -> None:
        """Confirmed, windowed publish; ``routing(delay_ms) -> (routing_key, expiration_ms)``."""

        async def send(item: Item) -> None:
            message_id, delay_ms = item
            routing_key, expiration_ms = routing(delay_ms)
            published = now_ms()
            due = published + (delay_ms if self.supports_delay else 0)
            msg = make_message(message_id, published, due, self.body, expiration_ms=expiration_ms)
            await exchange.publish(msg, routing_key=routing_key)

        await run_windowed(send, batch, self.window)
