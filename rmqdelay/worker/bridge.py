"""The x-delay bridge as a long-lived process: a :class:`Worker` with one handler and one
hook, so that it reconnects, fails over, drains on SIGTERM and honours cancels as any
worker does.

* **Stage 1**, the hook (:class:`Inbox`): on every connection it starts an
  :class:`~rmqdelay.amqp.bridge_inbox.InboxCarrier` in a thread of its own, which takes
  the inbox in batches into the tiers with the public ``Publisher.publish_many``, acking
  only what was confirmed there and recorded in the schedule journal (so ``scheduled
  list`` and ``cancel`` work for bridged messages), and parks what it cannot schedule.
* **Stage 2**, the handler (:meth:`Bridge.deliver`): when a copy falls due (and was not
  cancelled), it publishes the original message to ``DNAME`` (confirms, mandatory) and
  returns; the Worker acks the copy after that. A message no queue at ``DNAME`` takes is
  parked with the reason (the plugin dropped it; ``parked replay`` sends it again once a
  queue is bound); a nack is retried through the tiers, as any handler's failure.

A crash between a confirm and its ack sends a message again: duplicates, never loss.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Iterable

import aiormq
from aio_pika.abc import AbstractChannel, AbstractConnection
from prometheus_client import Counter
from typing_extensions import Unpack

from ..amqp.aio_publisher import EncodedProperties, send_encoded
from ..amqp.bridge_inbox import BATCH, PREFETCH, InboxCarrier
from ..amqp.connections import address_of, user_of
from ..amqp.passive import exchange_exists_async
from ..core.bridge import BridgeNames, Restored, bridge_names, unwrap
from ..core.retry import Park
from ..errors import (
    ConfirmTimeoutError,
    PublishError,
    PublishNackedError,
    TopologyError,
    WorkerError,
)
from ..settings import Settings
from .app import RunOptions, Worker
from .context import Context
from .hooks import WorkerHook
from .runner import RunningWorker

__all__ = ["BATCH", "BRIDGED", "PREFETCH", "Bridge", "Inbox", "Outbox"]

log = logging.getLogger("rmqdelay.bridge")

DECLARE_HINT = "run `rmqdelay bridge declare --exchange {exchange} --type TYPE`"
STOP_S = 4.0
"""How long a disconnect waits for stage 1's batch in hand (the worker gives a hook 5 s)."""

BRIDGED = Counter(
    "rmqdelay_bridge_messages",
    "Messages the x-delay bridge took from its inbox, by exchange and outcome "
    "(scheduled: confirmed in the tiers; parked; requeued: given back to the inbox).",
    ["exchange", "outcome"],
)

_LOST = (
    aiormq.exceptions.ChannelInvalidStateError,
    aiormq.exceptions.ChannelClosed,
    aiormq.exceptions.ConnectionClosed,
    ConnectionError,
    RuntimeError,
)
_CLOSE = (*_LOST, aiormq.exceptions.AMQPError, asyncio.TimeoutError)


class Inbox(WorkerHook):
    """Stage 1, started on each of the worker's connections (see the module docstring);
    also opens stage 2's :class:`Outbox` on that connection."""

    def __init__(self, bridge: Bridge, prefetch: int = PREFETCH, batch: int = BATCH) -> None:
        if not 1 <= prefetch <= 65_535:
            raise WorkerError(f"--inbox-prefetch must be from 1 to 65535, got {prefetch}")
        self.bridge = bridge
        self.names = bridge.names
        self.settings = bridge.settings
        self.prefetch = prefetch
        self.batch = batch
        self.outbox: Outbox | None = None
        self._carrier: InboxCarrier | None = None
        self._thread: threading.Thread | None = None

    def _count(self, outcome: str, n: int) -> None:
        if n:
            BRIDGED.labels(self.names.exchange, outcome).inc(n)

    async def on_connect(self, connection: AbstractConnection, lost: asyncio.Event) -> None:
        names, timeout = self.names, self.settings.confirm_timeout
        delivery = exchange_exists_async(connection, names.delivery_exchange)
        if not await asyncio.wait_for(delivery, timeout):
            raise WorkerError(
                f"the delivery exchange {names.delivery_exchange!r} does not exist: "
                + DECLARE_HINT.format(exchange=names.exchange)
            )
        address = address_of(connection) or self.settings.urls[0]
        self.outbox = Outbox(connection, names, self.settings.confirm_timeout, user_of(address))
        # stage 1 to the node the worker chose first (it leaves a node cut off from the
        # cluster's majority, and reconnects both)
        others = [url for url in self.settings.urls if url != address]
        carrier = InboxCarrier(
            self.settings,
            names,
            prefetch=self.prefetch,
            batch=self.batch,
            count=self._count,
            last=others,
        )
        await asyncio.to_thread(carrier.open)  # WorkerError, or a connection error: retried
        loop = asyncio.get_running_loop()

        def on_lost(exc: BaseException | None) -> None:
            log.warning("bridge: the inbox's connection ended (%r); reconnecting", exc)
            loop.call_soon_threadsafe(lost.set)

        thread = threading.Thread(
            target=carrier.carry_forever, args=(on_lost,), name="rmqdelay-bridge-inbox", daemon=True
        )
        self._carrier, self._thread = carrier, thread
        thread.start()
        log.info(
            "bridge: %r -> inbox %r -> tiers (destination %s) -> %r",
            names.exchange,
            names.inbox,
            names.destination,
            names.delivery_exchange,
        )

    async def on_disconnect(self) -> None:
        """Stop taking messages; the batch in hand finishes (up to ``STOP_S``), then the
        inbox connection closes and what was taken and not acked goes back."""
        carrier, thread = self._carrier, self._thread
        self._carrier = self._thread = None
        if carrier is not None and thread is not None:
            carrier.stop()
            await asyncio.to_thread(thread.join, STOP_S)
        if self.outbox is not None:
            await self.outbox.close()


class Outbox:
    """Stage 2's publishing to ``DNAME``: a confirm channel, mandatory, on the session's
    connection, reopened when the broker closed it.

    aiormq matches a returned message to its publish by message id, so two copies with
    one id are never in flight on one channel at once; a message whose ``user_id`` is
    not the bridge's user (which RabbitMQ refuses, unless the user is an impersonator,
    by closing the channel) goes out alone on a channel of its own.
    """

    def __init__(
        self, connection: AbstractConnection, names: BridgeNames, timeout: float, user: str
    ) -> None:
        self.connection = connection
        self.names = names
        self.timeout = timeout
        self.user = user
        self._channels: dict[str, AbstractChannel] = {}
        self._opening = asyncio.Lock()
        self._alone = asyncio.Lock()
        self._inflight: dict[str, asyncio.Future[None]] = {}

    async def close(self) -> None:
        channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            if not channel.is_closed:
                with contextlib.suppress(*_CLOSE):
                    await asyncio.wait_for(channel.close(), 5)

    async def _channel(self, kind: str) -> AbstractChannel:
        channel = self._channels.get(kind)
        if channel is not None and not channel.is_closed:
            return channel
        async with self._opening:
            channel = self._channels.get(kind)
            if channel is None or channel.is_closed:
                channel = await self.connection.channel(
                    publisher_confirms=True, on_return_raises=True
                )
                self._channels[kind] = channel
            return channel

    async def send(self, restored: Restored) -> None:
        """Publish to ``DNAME`` and wait for the confirm; raise :class:`Park` for what no
        retry can deliver, another error for what a retry may."""
        properties = EncodedProperties(restored.properties, restored.message_id)
        if restored.user_id is not None and restored.user_id != self.user:
            async with self._alone:
                await self._publish("alone", restored, properties)
            return
        message_id = restored.message_id
        while (other := self._inflight.get(message_id)) is not None:
            await asyncio.wait([other])
        mine: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._inflight[message_id] = mine
        try:
            await self._publish("shared", restored, properties)
        finally:
            del self._inflight[message_id]
            mine.set_result(None)

    async def _publish(self, kind: str, restored: Restored, properties: EncodedProperties) -> None:
        exchange, key = self.names.delivery_exchange, restored.routing_key
        for attempt in (1, 2):
            channel = await self._channel(kind)
            try:
                await send_encoded(
                    channel,
                    restored.body,
                    properties,
                    exchange=exchange,
                    routing_key=key,
                    timeout=self.timeout,
                )
                return
            except aiormq.exceptions.PublishError:
                raise Park(
                    f"unroutable: no queue bound to {exchange!r} took routing key {key!r} when "
                    f"it was due (the plugin dropped such messages); bind one, then "
                    f"`rmqdelay parked replay --destination {self.names.destination}`"
                ) from None
            except aiormq.exceptions.DeliveryError:
                raise PublishNackedError(
                    f"{exchange!r} refused message {restored.message_id} (nack)"
                ) from None
            except asyncio.TimeoutError:
                raise ConfirmTimeoutError(
                    f"no confirm from {exchange!r} for message {restored.message_id} within "
                    f"{self.timeout:g}s"
                ) from None
            except aiormq.exceptions.ChannelNotFoundEntity:
                raise TopologyError(
                    f"the delivery exchange {exchange!r} does not exist: "
                    + DECLARE_HINT.format(exchange=self.names.exchange)
                ) from None
            except aiormq.exceptions.ChannelPreconditionFailed as exc:
                if kind == "alone":  # its user_id, most likely: no retry will change that
                    why = exc.args[-1] if exc.args else exc
                    raise Park(f"{exchange!r} refused the message: {why}") from None
                if attempt == 2:
                    raise PublishError(f"{exchange!r} closed the channel: {exc!r}") from None
            except _LOST as exc:  # the channel went; once more on a new one if the connection is up
                if attempt == 2 or self.connection.is_closed:
                    raise PublishError(f"lost the channel to {exchange!r}: {exc!r}") from None
        raise AssertionError("unreachable")


class Bridge:
    """One x-delay bridge: ``NAME`` (publishers, ``x-delay``) to ``DNAME`` (consumers).

    ``Bridge(settings, "orders").run()`` runs until SIGTERM; several processes share the
    inbox and the destination's work queue as competing consumers. ``hooks`` observe
    stage 2 as a worker's hooks do.
    """

    def __init__(
        self,
        settings: Settings,
        exchange: str,
        *,
        delivery_exchange: str | None = None,
        destination: str | None = None,
        inbox_prefetch: int = PREFETCH,
        batch: int = BATCH,
        hooks: Iterable[WorkerHook] = (),
    ) -> None:
        self.settings = settings
        self.names = bridge_names(
            settings.layout, exchange, delivery_exchange=delivery_exchange, destination=destination
        )
        self.inbox = Inbox(self, inbox_prefetch, batch)
        self.worker = Worker(settings, hooks=[self.inbox, *hooks])
        self.worker.add_handler(self.names.destination, self.deliver)

    async def deliver(self, body: bytes, ctx: Context) -> None:
        """Stage 2: publish the original message to ``DNAME``, confirmed."""
        try:
            restored = unwrap(body, ctx.message_id)
        except ValueError as exc:
            raise Park(str(exc)) from None
        outbox = self.inbox.outbox
        if outbox is None:
            raise PublishError("the bridge is not connected")
        await outbox.send(restored)

    def runner(self, **options: Unpack[RunOptions]) -> RunningWorker:
        return self.worker.runner(self.settings, **options)

    @contextlib.asynccontextmanager
    async def running(self, **options: Unpack[RunOptions]) -> AsyncIterator[RunningWorker]:
        """Run in the background while the block runs, then stop gracefully (for tests)."""
        async with self.worker.running(self.settings, **options) as runner:
            yield runner

    def run(self, **options: Unpack[RunOptions]) -> int:
        """Run until SIGTERM or SIGINT, as ``rmqdelay bridge run`` does; the exit code."""
        return self.worker.run(self.settings, **options)
