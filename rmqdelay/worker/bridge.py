"""The x-delay bridge as a long-lived process: a :class:`Worker` with one handler and one
hook, so that it reconnects, fails over, drains on SIGTERM and honours cancels as any
worker does.

* **Stage 1**, the hook (:class:`Inbox`): on every connection it consumes the inbox in
  batches, reads each message's ``x-delay`` (:func:`rmqdelay.core.bridge.read_delay`)
  and sends it with the public :meth:`AsyncPublisher.publish_many` to the bridge's
  destination, the original routing key, properties and headers in its envelope header.
  A batch is acked once its copies are confirmed in the tiers and recorded in the
  schedule journal, so ``scheduled list`` and ``cancel`` work for them; what cannot be
  scheduled is parked with a reason, confirmed, then acked. Nothing is acked before.
* **Stage 2**, the handler: when a copy falls due (and was not cancelled), it publishes
  the original message to ``DNAME`` (confirms, mandatory) and returns; the Worker acks
  the copy after that. A message no queue at ``DNAME`` takes is parked with the reason
  (the plugin dropped it; ``parked replay`` sends it again once a queue is bound); a nack
  is retried through the tiers, as any handler's failure.

A crash between a confirm and its ack sends a message again: duplicates, never loss.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import aiormq
from aio_pika.abc import AbstractChannel, AbstractConnection
from aiormq.abc import AbstractChannel as AmqpChannel
from aiormq.abc import DeliveredMessage
from prometheus_client import Counter
from typing_extensions import Unpack

from ..amqp.aio_publisher import AsyncPublisher, EncodedProperties, send_encoded
from ..amqp.passive import queue_exists_async
from ..core.bridge import (
    ENVELOPE,
    PROPERTY_NAMES,
    BridgeNames,
    Restored,
    bridge_names,
    envelope,
    read_delay,
    restore,
)
from ..core.clock import now_ms, timedelta_of_ms
from ..core.messages import CARRIED, amqp_properties
from ..core.parking import parked_headers
from ..core.retry import Park
from ..core.templates import new_message_id
from ..core.wire import encode_properties
from ..errors import (
    BatchPublishError,
    ConfirmTimeoutError,
    DelayError,
    InvalidMessageError,
    PublishError,
    PublishNackedError,
    RmqDelayError,
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

PREFETCH = 1000
"""Inbox messages a bridge process holds unacked at most."""
BATCH = 500
"""Messages per ``publish_many`` at most: one batch's confirms and journal write."""
PAUSE_S = 1.0
"""The pause after a batch the tiers refused, so a broken broker is not spun on."""
DECLARE_HINT = "run `rmqdelay bridge declare --exchange {exchange} --type TYPE`"

BRIDGED = Counter(
    "rmqdelay_bridge_messages",
    "Messages the x-delay bridge took from its inbox, by exchange and outcome "
    "(scheduled: confirmed in the tiers; parked; requeued: given back to the inbox).",
    ["exchange", "outcome"],
)

_VALIDATION = (InvalidMessageError, DelayError)
"""What publish_many raises before sending anything, for one request that cannot go."""
_LOST = (
    aiormq.exceptions.ChannelInvalidStateError,
    aiormq.exceptions.ChannelClosed,
    aiormq.exceptions.ConnectionClosed,
    ConnectionError,
    RuntimeError,
)
_SETTLE = (*_LOST, aiormq.exceptions.AMQPError, asyncio.TimeoutError)


def _properties(message: DeliveredMessage) -> dict[str, Any]:
    """A delivery's properties under :data:`PROPERTY_NAMES` (pamqp says ``message_type``)."""
    props = message.header.properties
    found = {name: getattr(props, name, None) for name in PROPERTY_NAMES if name != "type"}
    found["type"] = getattr(props, "message_type", None)
    found["cluster_id"] = found["cluster_id"] or None  # pamqp reads an absent one as ""
    return found


class Inbox(WorkerHook):
    """Stage 1: the inbox consumer, started on each of the worker's connections."""

    def __init__(self, bridge: Bridge, prefetch: int = PREFETCH, batch: int = BATCH) -> None:
        if not 1 <= prefetch <= 65_535:
            raise WorkerError(f"--inbox-prefetch must be from 1 to 65535, got {prefetch}")
        self.bridge = bridge
        self.names = bridge.names
        self.settings = bridge.settings
        self.prefetch = prefetch
        self.batch = max(1, min(batch, prefetch))
        self.outbox: Outbox | None = None
        self.carried = 0
        """Inbox messages settled (scheduled or parked) since the start, all connections."""
        self._channel: AbstractChannel | None = None
        self._publisher: AsyncPublisher | None = None
        self._park_channel: AbstractChannel | None = None
        self._pending: list[DeliveredMessage] = []
        self._arrived = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._tag: str | None = None
        self._lost: asyncio.Event | None = None

    # ------------------------------------------------------------------ connection

    async def on_connect(self, connection: AbstractConnection, lost: asyncio.Event) -> None:
        names, timeout = self.names, self.settings.confirm_timeout
        await self._check(connection)
        self._lost = lost
        self._pending, self._arrived = [], asyncio.Event()
        self.outbox = Outbox(connection, names, timeout, _user_of(self.settings))
        self._publisher = await AsyncPublisher(self.settings, connection=connection).connect()
        park = await connection.channel(publisher_confirms=True, on_return_raises=True)
        park.close_callbacks.add(lambda *_: lost.set())
        self._park_channel = park
        channel = await connection.channel(publisher_confirms=False)
        channel.close_callbacks.add(lambda *_: lost.set())
        await channel.set_qos(prefetch_count=self.prefetch)
        self._channel = channel
        underlay = await channel.get_underlay_channel()
        cancelled = getattr(underlay, "on_consumer_cancel_callbacks", None)
        if cancelled is not None:  # the broker cancelled the consumer (queue deleted...)
            cancelled.add(lambda *_: lost.set())
        self._task = asyncio.create_task(self._carry_loop(underlay))
        ok = await underlay.basic_consume(names.inbox, self._on_delivery, no_ack=False)
        self._tag = ok.consumer_tag
        log.info(
            "bridge: %r -> inbox %r -> tiers -> %r (destination %s)",
            names.exchange,
            names.inbox,
            names.delivery_exchange,
            names.destination,
        )

    async def _check(self, connection: AbstractConnection) -> None:
        """Passive checks (no configure permission needed), each naming the fix."""
        names, timeout = self.names, self.settings.confirm_timeout
        hint = DECLARE_HINT.format(exchange=names.exchange)
        if not await queue_exists_async(connection, names.inbox, timeout):
            raise WorkerError(f"the bridge's inbox queue {names.inbox!r} does not exist: {hint}")
        if not await _exchange_exists(connection, names.delivery_exchange):
            raise WorkerError(
                f"the delivery exchange {names.delivery_exchange!r} does not exist: {hint}"
            )

    async def on_disconnect(self) -> None:
        """Stop taking messages, let the batch in hand finish, close; what was taken and
        not acked goes back to the inbox with the channel."""
        channel, self._channel = self._channel, None
        if channel is not None and self._tag is not None and not channel.is_closed:
            with contextlib.suppress(*_SETTLE):
                underlay = await channel.get_underlay_channel()
                await asyncio.wait_for(underlay.basic_cancel(self._tag), 5)
        task, self._task = self._task, None
        if task is not None:
            self._arrived.set()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(task), self.settings.confirm_timeout)
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        for closing in (channel, self._park_channel):
            if closing is not None and not closing.is_closed:
                with contextlib.suppress(*_SETTLE):
                    await asyncio.wait_for(closing.close(), 5)
        if self._publisher is not None:
            await self._publisher.close()
        self._publisher = self._park_channel = None
        if self.outbox is not None:
            await self.outbox.close()

    # ------------------------------------------------------------------ stage 1

    async def _on_delivery(self, message: DeliveredMessage) -> None:
        self._pending.append(message)
        self._arrived.set()

    async def _carry_loop(self, underlay: AmqpChannel) -> None:
        """Take what arrived, up to a batch, carry it; until the hook disconnects."""
        while True:
            await self._arrived.wait()
            batch, self._pending = self._pending[: self.batch], self._pending[self.batch :]
            if not self._pending:
                self._arrived.clear()
            if not batch:
                if self._channel is None:
                    return
                continue
            try:
                await self._carry(underlay, batch)
            except _SETTLE:
                self._lose()  # the broker takes the batch back with the channel
                return
            except Exception:  # a bug of ours: never leave the inbox stalled
                log.exception("bridge: internal error; reconnecting (the batch goes back)")
                self._lose()
                return

    def _lose(self) -> None:
        if self._lost is not None:
            self._lost.set()

    async def _carry(self, underlay: AmqpChannel, batch: list[DeliveredMessage]) -> None:
        """Schedule or park every message of ``batch``, then settle each: ack what was
        confirmed, give back what was not."""
        max_delay_ms = self.settings.layout.max_delay_ms
        items = [_Item.of(message, index) for index, message in enumerate(batch)]
        outcome: list[Settle] = ["requeue"] * len(items)
        to_schedule: list[_Item] = []
        to_park: list[tuple[_Item, str]] = []
        for item in items:
            inbound = read_delay(item.headers, max_delay_ms)
            if inbound.delay_ms is None:
                to_park.append((item, inbound.reason))
            else:
                item.delay_ms = inbound.delay_ms
                to_schedule.append(item)
        if to_schedule:
            for item in await self._schedule(to_schedule, to_park):
                outcome[item.index] = "ack"
        for item, reason in to_park:
            outcome[item.index] = await self._park(underlay, item, reason)
        await self._settle(underlay, items, outcome)

    def _request(self, item: _Item) -> dict[str, Any]:
        assert item.delay_ms is not None
        request: dict[str, Any] = {
            "destination": self.names.destination,
            "body": item.message.body,
            "delay": timedelta_of_ms(item.delay_ms),
            "headers": {ENVELOPE: item.envelope},
            "message_id": item.message_id,
        }
        request.update((name, item.properties.get(name)) for name in CARRIED)
        return request

    async def _schedule(self, items: list[_Item], to_park: list[tuple[_Item, str]]) -> list[_Item]:
        """The items confirmed in the tiers and journaled; one that cannot be sent at all
        joins ``to_park``."""
        publisher = self._publisher
        assert publisher is not None
        try:
            await publisher.publish_many([self._request(item) for item in items])
        except BatchPublishError as exc:  # some were not confirmed: they go back
            failed = set(exc.failures)
            log.warning(
                "bridge: %d of %d message(s) not confirmed in the tiers (first: %s); "
                "giving them back to the inbox",
                len(failed),
                len(items),
                next(iter(exc.failures.values())),
            )
            await asyncio.sleep(PAUSE_S)
            return [item for item in items if item.message_id not in failed]
        except _VALIDATION:  # one (or more) cannot be sent as it is: find which, park it
            return await self._one_by_one(items, to_park)
        except RmqDelayError as exc:  # the work queue or journal gone, the connection lost
            log.error("bridge: cannot schedule into the tiers (%s); reconnecting", exc)
            self._lose()
            return []
        return items

    async def _one_by_one(
        self, items: list[_Item], to_park: list[tuple[_Item, str]]
    ) -> list[_Item]:
        publisher = self._publisher
        assert publisher is not None
        done = []
        for item in items:
            try:
                await publisher.publish_many([self._request(item)])
            except _VALIDATION as exc:
                to_park.append((item, f"cannot be scheduled: {exc}"))
            except RmqDelayError as exc:
                log.warning("bridge: message %s not scheduled (%s)", item.message_id, exc)
            else:
                done.append(item)
        return done

    async def _park(self, underlay: AmqpChannel, item: _Item, reason: str) -> Settle:
        """Publish a parked copy, confirmed, with the envelope (so ``parked replay`` sends
        it through stage 2). One that cannot be encoded is dead-lettered whole by the
        inbox instead (its dead-letter exchange is parking)."""
        channel = self._park_channel
        assert channel is not None
        names, props = self.names, item.properties
        headers = parked_headers(
            {ENVELOPE: item.envelope},
            reason=reason,
            destination=names.destination,
            attempts=1,
            parked_at_ms=now_ms(),
        )
        properties = amqp_properties(
            item.message_id, headers, props, timestamp=props.get("timestamp")
        )
        try:
            encoded = encode_properties(properties)
        except InvalidMessageError:
            log.warning("bridge: message %s dead-lettered whole to parking", item.message_id)
            await underlay.basic_reject(item.tag, requeue=False)
            BRIDGED.labels(names.exchange, "parked").inc()
            return "settled"
        try:
            await send_encoded(
                channel,
                item.message.body,
                EncodedProperties(encoded, item.message_id),
                exchange=self.settings.layout.parking,
                routing_key="",
                timeout=self.settings.confirm_timeout,
            )
        except (aiormq.exceptions.PublishError, aiormq.exceptions.DeliveryError) as exc:
            log.error("bridge: could not park message %s (%s)", item.message_id, exc)
            await asyncio.sleep(PAUSE_S)
            return "requeue"
        log.warning(
            "bridge: parked message %s from %r: %s",
            item.message_id,
            names.exchange,
            reason,
            extra={"message_id": item.message_id, "outcome": "parked"},
        )
        BRIDGED.labels(names.exchange, "parked").inc()
        return "ack"

    async def _settle(
        self, underlay: AmqpChannel, items: list[_Item], outcome: list[Settle]
    ) -> None:
        """Ack what is done (one multiple ack when all is), give back the rest."""
        exchange = self.names.exchange
        if all(o == "ack" for o in outcome):
            await underlay.basic_ack(items[-1].tag, multiple=True)
        else:
            for item, what in zip(items, outcome, strict=True):
                tag = item.tag
                if what == "ack":
                    await underlay.basic_ack(tag)
                elif what == "requeue":
                    await underlay.basic_reject(tag, requeue=True)
                    BRIDGED.labels(exchange, "requeued").inc()
        scheduled = sum(1 for i in items if i.delay_ms is not None and outcome[i.index] == "ack")
        BRIDGED.labels(exchange, "scheduled").inc(scheduled)
        self.carried += sum(1 for o in outcome if o != "requeue")


Settle = Literal["ack", "requeue", "settled"]
"""How stage 1 settles one inbox message: ack it, give it back, or nothing (done)."""


@dataclass
class _Item:
    """One inbox message on its way: what stage 1 reads off it once."""

    index: int
    message: DeliveredMessage
    tag: int
    properties: dict[str, Any]
    headers: Mapping[str, Any]
    message_id: str
    envelope: dict[str, Any]
    delay_ms: int | None = None

    @classmethod
    def of(cls, message: DeliveredMessage, index: int = 0) -> _Item:
        props = _properties(message)
        headers = message.header.properties.headers or {}
        given = props.get("message_id")
        message_id = given if isinstance(given, str) and given else new_message_id()
        table = envelope(message.exchange or "", message.routing_key or "", props, headers)
        tag = int(getattr(message.delivery, "delivery_tag", 0) or 0)
        return cls(index, message, tag, props, headers, message_id, table)


async def _exchange_exists(connection: AbstractConnection, name: str) -> bool:
    channel = await connection.channel(publisher_confirms=False)
    try:
        await channel.get_exchange(name, ensure=True)
    except aiormq.exceptions.ChannelNotFoundEntity:
        return False
    with contextlib.suppress(*_SETTLE):
        await channel.close()
    return True


def _user_of(settings: Settings) -> str:
    from urllib.parse import unquote, urlsplit

    return unquote(urlsplit(settings.urls[0]).username or "guest")


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
                with contextlib.suppress(*_SETTLE):
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

    async def send(self, restored: Restored, body: bytes) -> None:
        """Publish to ``DNAME`` and wait for the confirm; raise :class:`Park` for what no
        retry can deliver, another error for what a retry may."""
        try:
            encoded = encode_properties(restored.properties)
        except InvalidMessageError as exc:
            raise Park(f"cannot be published to {self.names.delivery_exchange!r}: {exc}") from None
        properties = EncodedProperties(encoded, restored.message_id)
        if restored.user_id is not None and restored.user_id != self.user:
            async with self._alone:
                await self._publish("alone", restored, properties, body)
            return
        message_id = restored.message_id
        while (other := self._inflight.get(message_id)) is not None:
            await asyncio.wait([other])
        mine: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._inflight[message_id] = mine
        try:
            await self._publish("shared", restored, properties, body)
        finally:
            del self._inflight[message_id]
            mine.set_result(None)

    async def _publish(
        self, kind: str, restored: Restored, properties: EncodedProperties, body: bytes
    ) -> None:
        exchange, key = self.names.delivery_exchange, restored.routing_key
        for attempt in (1, 2):
            channel = await self._channel(kind)
            try:
                await send_encoded(
                    channel,
                    body,
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
                raise Park(
                    f"{exchange!r} refused the message: {exc.args[-1] if exc.args else exc}"
                ) from None
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
            restored = restore(ctx.headers, ctx.message_id)
        except ValueError as exc:
            raise Park(str(exc)) from None
        outbox = self.inbox.outbox
        if outbox is None:
            raise PublishError("the bridge is not connected")
        await outbox.send(restored, body)

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
