"""One connection's worth of a worker: opening it, watching its node, closing it.

A reconnect opens a new :class:`Session`; what was in flight on the old one comes back
from the broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiormq
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage, AbstractQueue

from ..amqp.aio_publisher import AsyncPublisher
from ..amqp.connections import address_of, connect_async
from ..amqp.journal import write_probe
from ..amqp.passive import queue_exists_async
from ..core.handlers import HandlerSpec
from ..errors import AccessRefusedError, WorkerError
from ..settings import Settings, mask_url
from .hooks import Hooks
from .reconnect import refused
from .settle import Settler

__all__ = ["PROBE_IDLE_S", "PROBE_TIMEOUT_S", "Session", "bounded", "first"]

log = logging.getLogger("rmqdelay.worker")
PROBE_IDLE_S = 3.0
"""A session that has had no delivery for this long writes a probe (see ``watch_node``)."""
PROBE_TIMEOUT_S = 5.0
"""How long a probe may wait for its confirm before the worker leaves that node."""
_CLOSE_S = 5.0

OnMessage = Callable[["Session", HandlerSpec, AbstractIncomingMessage], Awaitable[None]]


@dataclass
class Session:
    """One connection's state; a reconnect starts a new one."""

    connection: AbstractConnection
    channel: AbstractChannel
    publisher: AsyncPublisher
    settler: Settler
    lost: asyncio.Event
    consumers: list[tuple[AbstractQueue, str]] = field(default_factory=list)
    active_at: float = field(default_factory=time.monotonic)
    """When a delivery last came, or a probe was last confirmed."""
    cut_off: str | None = None
    """The address of a node that stopped confirming: to try after the others."""

    @classmethod
    async def open(
        cls,
        settings: Settings,
        handlers: Mapping[str, HandlerSpec],
        prefetch: int,
        hooks: Hooks,
        on_message: OnMessage,
        last: list[str],
    ) -> Session:
        """Connect, check the work queues, let the hooks start, then consume."""
        connection = await connect_async(settings, "worker", last=last)
        try:
            lost = asyncio.Event()
            connection.close_callbacks.add(lambda *_: lost.set())
            queues = await _check_queues(connection, settings, handlers)
            await hooks.connect(connection, lost)
            channel = await connection.channel(publisher_confirms=False)
            channel.close_callbacks.add(lambda *_: lost.set())
            await channel.set_qos(prefetch_count=prefetch)
            park_channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
            park_channel.close_callbacks.add(lambda *_: lost.set())
            park_exchange = await park_channel.get_exchange(settings.layout.parking, ensure=False)
            publisher = await AsyncPublisher(settings, connection=connection).connect()
            settler = Settler(publisher, park_exchange, settings.confirm_timeout)
            session = cls(connection, channel, publisher, settler, lost)
            for destination, name in queues:
                queue = await channel.get_queue(name, ensure=False)
                spec = handlers[destination]
                try:
                    tag = await queue.consume(functools.partial(on_message, session, spec))
                except aiormq.exceptions.ChannelAccessRefused as exc:
                    raise refused(exc, name, "read") from None
                session.consumers.append((queue, tag))
            return session
        except BaseException:
            with contextlib.suppress(Exception):
                await bounded(hooks.disconnect(), _CLOSE_S)
            with contextlib.suppress(Exception):
                await connection.close()
            raise

    async def close(self, hooks: Hooks) -> None:
        """Each step bounded: a node cut off from the majority may never answer a close."""
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
