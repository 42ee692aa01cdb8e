"""One connection's worth of a worker: opening it, watching its node, closing it.

A reconnect opens a new :class:`Session`; what was in flight on the old one comes back
from the broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import aiormq
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage, AbstractQueue
from aiormq.abc import DeliveredMessage

from ..amqp.aio_publisher import AsyncPublisher
from ..amqp.aiopika_private import incoming_message
from ..amqp.aiormq_private import AT_ONCE, deliver_at_once
from ..amqp.connections import address_of, connect_async
from ..amqp.consumers import consuming, is_consumer_timeout, on_broker_cancel
from ..amqp.journal import write_probe
from ..amqp.passive import exchange_exists_async, queue_exists_async
from ..core.handling.handlers import HandlerSpec
from ..errors import AccessRefusedError, WorkerError
from ..settings import Settings, mask_url
from .acks import Acker
from .hooks import Hooks
from .reconnect import refused
from .settle import SETTLE_ERRORS, Settler

__all__ = [
    "PROBE_IDLE_S",
    "PROBE_TIMEOUT_S",
    "Cause",
    "Consumer",
    "Consuming",
    "Session",
    "bounded",
    "first",
]

log = logging.getLogger("rmqdelay.worker")
PROBE_IDLE_S = 3.0
"""A session that has had no delivery for this long writes a probe (see ``watch_node``)."""
PROBE_TIMEOUT_S = 5.0
"""How long a probe may wait for its confirm before the worker leaves that node."""
_CLOSE_S = 5.0

OnMessage = Callable[["Session", HandlerSpec, AbstractIncomingMessage], None]
"""Called for each delivery, from the task aiormq starts for it; it starts the delivery's
own task (which, unlike aiormq's, a closing channel does not cancel)."""
OnTakenBack = Callable[["Session", "str | None", "Cause"], None]
"""Told that the broker took back what a consumer (a tag), or the whole session (None), held."""
Cause = Literal["consumer timeout", "connection lost"]
"""Why the broker took messages back: a consumer timeout (on 4.3 a ``basic.cancel``, which
a deleted queue sends too; before, a closed channel), or a connection or channel lost."""

_POLL_S = 0.5
"""How often to look for a consumer the broker cancelled, where aiormq does not say."""


@dataclass(frozen=True)
class Consuming:
    """How a session consumes: the runner's callbacks and the consumer's settings."""

    prefetch: int
    on_message: OnMessage
    on_taken_back: OnTakenBack
    consumer_timeout_ms: int | None = None
    """Sent as the ``x-consumer-timeout`` consumer argument (RabbitMQ 4.3 honours it on
    quorum queues)."""
    held_prefetch: int | None = None
    """The prefetch of a held destination's consumer (``prefetch`` when None): room for
    the messages it holds besides those its handlers take."""

    def prefetch_for(self, held: bool) -> int:
        return (self.held_prefetch or self.prefetch) if held else self.prefetch

    @property
    def arguments(self) -> dict[str, Any] | None:
        if self.consumer_timeout_ms is None:
            return None
        return {"x-consumer-timeout": self.consumer_timeout_ms}


@dataclass
class Consumer:
    """One work queue's consumer; a new tag when the broker cancelled the last one."""

    queue: AbstractQueue
    spec: HandlerSpec
    tag: str


@dataclass
class Session:
    """One connection's state; a reconnect starts a new one."""

    connection: AbstractConnection
    channel: AbstractChannel
    publisher: AsyncPublisher
    settler: Settler
    lost: asyncio.Event
    consuming: Consuming
    underlay: Any = None
    """The consumers' aiormq channel, which knows what is still consumed."""
    consumers: list[Consumer] = field(default_factory=list)
    active_at: float = field(default_factory=time.monotonic)
    """When a delivery last came, or a probe was last confirmed."""
    cut_off: str | None = None
    """The address of a node that stopped confirming: to try after the others."""
    lost_cause: Cause = "connection lost"
    lost_error: str = ""
    """What the broker or the client said when the session ended, for the log."""
    own_cancels: set[str] = field(default_factory=set)
    """Consumer tags the worker cancelled itself (at shutdown): their messages stay held."""
    held: frozenset[str] = frozenset()
    """The destinations consumed here that are held (settings or their topology marker)."""
    qos: int = 0
    """The prefetch the channel gives the consumers it starts next (``basic.qos`` applies
    per consumer)."""
    woken: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when aiormq says the broker cancelled a consumer."""
    _told: bool = False

    @classmethod
    async def open(
        cls,
        settings: Settings,
        handlers: Mapping[str, HandlerSpec],
        hooks: Hooks,
        consuming: Consuming,
        last: list[str],
    ) -> Session:
        """Connect, check the work queues, let the hooks start, then consume."""
        connection = await connect_async(settings, "worker", last=last)
        try:
            lost = asyncio.Event()
            connection.close_callbacks.add(lambda *_: lost.set())  # while the hooks start
            queues = await _check_queues(connection, settings, handlers)
            held = await _held(connection, settings, handlers)
            await hooks.connect(connection, lost)
            channel = await connection.channel(publisher_confirms=False)
            await channel.set_qos(prefetch_count=consuming.prefetch)
            park_channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
            park_exchange = await park_channel.get_exchange(settings.layout.parking, ensure=False)
            # a retry's record goes at once: the message it settles waits unacked meanwhile
            own = settings.replace(journal_linger=0)
            publisher = await AsyncPublisher(own, connection=connection).connect()
            underlay = await channel.get_underlay_channel()
            acks = Acker(underlay)
            settler = Settler(publisher, park_exchange, settings.confirm_timeout, acks)
            session = cls(connection, channel, publisher, settler, lost, consuming)
            session.underlay, session.held, session.qos = underlay, held, consuming.prefetch
            on_broker_cancel(session.underlay, session.woken.set)
            deliver_at_once(underlay)
            connection.close_callbacks.add(session._on_close)
            channel.close_callbacks.add(session._on_close)
            park_channel.close_callbacks.add(session._on_close)
            if connection.is_closed or channel.is_closed or park_channel.is_closed:
                session._on_close(None)
            for destination, name in queues:
                queue = await channel.get_queue(name, ensure=False)
                spec = handlers[destination]
                try:
                    tag = await session._consume(queue, spec)
                except aiormq.exceptions.ChannelAccessRefused as exc:
                    raise refused(exc, name, "read") from None
                session.consumers.append(Consumer(queue, spec, tag))
            return session
        except BaseException:
            with contextlib.suppress(Exception):
                await bounded(hooks.disconnect(), _CLOSE_S)
            with contextlib.suppress(Exception):
                await connection.close()
            raise

    async def _consume(self, queue: AbstractQueue, spec: HandlerSpec) -> str:
        """Consume as ``Queue.consume`` does, without its task per delivery: aio-pika
        runs the callback in a task of its own, awaited by aiormq's, and the worker
        starts one more that outlives a closing channel. Here aiormq's task hands the
        delivery over, and the worker's task is the only other."""
        prefetch = self.consuming.prefetch_for(spec.destination in self.held)
        if prefetch != self.qos:
            await self.channel.set_qos(prefetch_count=prefetch)
            self.qos = prefetch
        on_message, build = self.consuming.on_message, incoming_message()

        def hand_over(delivered: DeliveredMessage) -> None:
            on_message(self, spec, build(delivered))

        async def deliver(delivered: DeliveredMessage) -> None:  # where aiormq starts a task
            hand_over(delivered)

        setattr(deliver, AT_ONCE, hand_over)  # where it does not (deliver_at_once)

        result = await self.underlay.basic_consume(
            queue.name, deliver, arguments=self.consuming.arguments
        )
        if result.consumer_tag is None:  # pamqp types it as optional; the broker never is
            raise WorkerError(f"the broker gave no consumer tag for {queue.name!r}")
        return str(result.consumer_tag)

    @property
    def closing(self) -> bool:
        """:meth:`close` has begun (the settler's flag: it parks nothing from then on)."""
        return self.settler.closing

    def _on_close(self, _sender: object = None, error: BaseException | None = None) -> None:
        """A channel or the connection closed: the broker takes back all it held."""
        if self._told:
            return
        self._told = True
        if error is not None:  # an address in it, with its password masked
            self.lost_error = mask_url(str(error) or repr(error))
        if is_consumer_timeout(error):
            self.lost_cause = "consumer timeout"
        if not self.closing:
            self.consuming.on_taken_back(self, None, self.lost_cause)
        self.lost.set()

    def taken_back(self, message: AbstractIncomingMessage) -> bool:
        """Whether the broker took ``message`` back: its consumer was cancelled by the
        broker, or the connection is gone. Settling it then would be lost, or ignored;
        so it is forgotten by the acks, and no longer holds back a batch."""
        if self.lost.is_set():
            return True
        tag = message.consumer_tag or ""
        if tag in self.own_cancels or consuming(self.underlay, tag):
            return False
        self.settler.acks.forget(message)
        return True

    def queue_of(self, spec: HandlerSpec) -> str:
        """The name of the work queue ``spec``'s messages come from."""
        for consumer in self.consumers:
            if consumer.spec is spec:
                return consumer.queue.name
        return spec.destination

    def cause(self, message: AbstractIncomingMessage) -> Cause:
        """Why ``message`` was taken back (see :meth:`taken_back`)."""
        return self.lost_cause if self.lost.is_set() else "consumer timeout"

    async def watch_consumers(self) -> None:
        """Consume again from a queue whose consumer the broker cancelled.

        RabbitMQ 4.3 cancels the consumer of a handler that ran past the consumer timeout
        (and a deleted queue cancels its consumers on every version). The messages it held
        go back to the queue; the other consumers and the channel go on. A new consumer
        takes the queue's messages again; one that cannot be had (the queue is gone) ends
        the session, and the reconnect says what is missing.
        """
        while not self.lost.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.woken.wait(), _POLL_S)
            self.woken.clear()
            for consumer in self.consumers:
                if self.lost.is_set() or self.closing or self.own_cancels:
                    return
                if consuming(self.underlay, consumer.tag):
                    continue
                name = consumer.queue.name
                log.warning(
                    "the broker cancelled the consumer of %s (a handler ran past the consumer "
                    "timeout, or the queue was deleted); consuming it again",
                    name,
                    extra={"queue": name},
                )
                self.consuming.on_taken_back(self, consumer.tag, "consumer timeout")
                try:
                    consumer.tag = await self._consume(consumer.queue, consumer.spec)
                except Exception as exc:  # the queue is gone, or the channel with it
                    log.warning(
                        "could not consume from %s again (%s); reconnecting",
                        name,
                        exc,
                        extra={"queue": name},
                    )
                    self._on_close(None)
                    return

    async def stop_consuming(self) -> None:
        """Cancel the consumers (at shutdown); the messages they hold stay the worker's
        to settle."""
        if self.lost.is_set():
            return
        self.own_cancels.update(c.tag for c in self.consumers)
        for consumer in self.consumers:
            with contextlib.suppress(*SETTLE_ERRORS):
                await consumer.queue.cancel(consumer.tag, timeout=5)

    async def close(self, hooks: Hooks) -> None:
        """Each step bounded: a node cut off from the majority may never answer a close."""
        self.settler.closing = True
        for step in (self.publisher.close(), hooks.disconnect(), self.connection.close()):
            with contextlib.suppress(Exception):
                await bounded(step, _CLOSE_S)

    async def watch_node(self, settings: Settings) -> None:
        """Leave a node cut off from the cluster's majority.

        Such a node keeps the connection, its heartbeats and the consumers, and delivers
        nothing: no ``basic.cancel``, no error (RabbitMQ 4.0.5, measured). What it cannot
        do is get a replicated write confirmed. So a session idle for ``PROBE_IDLE_S``
        appends a probe to the schedule journal; without its confirm within
        ``PROBE_TIMEOUT_S``, the session ends and the worker reconnects, that node last.
        Without the journal there is nothing to probe: no write a worker may make.
        """
        if not settings.layout.journal:
            return
        while not self.lost.is_set():
            await asyncio.sleep(1.0)
            if time.monotonic() - self.active_at < PROBE_IDLE_S:
                continue
            try:
                await bounded(write_probe(self.connection, settings.layout), PROBE_TIMEOUT_S)
            except Exception as exc:  # no confirm, a nack, a closed channel: move
                if self.lost.is_set():
                    return
                address = address_of(self.connection)
                self.cut_off = address or ""
                log.warning(
                    "the node at %s did not confirm a write within %gs (%s): it may be cut "
                    "off from the cluster's majority; moving to another node",
                    mask_url(address or settings.masked_url),
                    PROBE_TIMEOUT_S,
                    type(exc).__name__,
                )
                self.lost.set()
                return
            self.active_at = time.monotonic()


async def _check_queues(
    connection: AbstractConnection, settings: Settings, handlers: Mapping[str, HandlerSpec]
) -> list[tuple[str, str]]:
    """Passive checks only, so a user without configure permission can run workers."""
    layout = settings.layout
    found = []
    for destination in handlers:
        name = layout.work_queue(destination)
        try:
            exists = await queue_exists_async(connection, name, settings.confirm_timeout)
        except AccessRefusedError as exc:
            raise WorkerError(
                f"access to work queue {name!r} refused: the worker's user needs read "
                f"permission on it and write permission on the {layout.prefix}.* "
                f"exchanges ({exc.detail})"
            ) from None
        if not exists:
            raise WorkerError(
                f"work queue {name!r} for handler {handlers[destination].name} does "
                f"not exist: run `rmqdelay topology apply --destination {destination}` "
                "(or check --prefix)"
            )
        found.append((destination, name))
    return found


async def _held(
    connection: AbstractConnection, settings: Settings, handlers: Mapping[str, HandlerSpec]
) -> frozenset[str]:
    """The destinations held by rmqdelay's consumers: named in ``held_destinations``, or
    marked so by their topology (what publishers go by). A marker that cannot be read
    (no permission) leaves its destination to the settings."""
    layout, named = settings.layout, set(settings.held_destinations)
    held = set()
    for destination in handlers:
        if destination in named:
            held.add(destination)
            continue
        with contextlib.suppress(AccessRefusedError):
            marker = layout.held_marker(destination)
            if await exchange_exists_async(connection, marker, settings.confirm_timeout):
                held.add(destination)
    return frozenset(held)


async def bounded(step: Awaitable[Any], seconds: float) -> Any:
    """``step``'s value, or TimeoutError after ``seconds``. Unlike ``asyncio.wait_for``,
    never waits for the cancelled step to unwind: a channel close that a cut-off node
    never answers would hold that up until the partition ends."""
    task = asyncio.ensure_future(step)
    done, _ = await asyncio.wait({task}, timeout=seconds)
    if not done:
        task.cancel()
        task.add_done_callback(_retrieve)
        raise asyncio.TimeoutError(f"no answer within {seconds:g}s")
    return task.result()


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Read a given-up step's outcome, so asyncio does not log it as never retrieved."""
    if not task.cancelled():
        task.exception()


async def first(*awaitables: Any) -> None:
    """Wait until one of the awaitables finishes; cancel the rest (not futures passed in)."""
    tasks = [asyncio.ensure_future(a) for a in awaitables]
    _done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for task, original in zip(tasks, awaitables, strict=True):
        if task in pending and task is not original:
            task.cancel()
