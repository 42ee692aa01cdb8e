"""Stage 2 of the x-delay bridge: a due copy's original message published to ``DNAME``.

The worker hands each due copy to :meth:`rmqdelay.bridge.app.Bridge.deliver`, which
unwraps it and sends it here: confirmed, mandatory, on the session's connection. What
no retry can deliver raises :class:`~rmqdelay.core.handling.retry.Park` (parked with the
reason); what a retry may, another error (retried through the tiers).
"""

from __future__ import annotations

import asyncio
import contextlib

import aiormq
from aio_pika.abc import AbstractChannel, AbstractConnection

from ..amqp.aio_sending import EncodedProperties, send_encoded
from ..core.handling.retry import Park
from ..errors import ConfirmTimeoutError, PublishError, PublishNackedError, TopologyError
from .envelope import Restored
from .names import BridgeNames

__all__ = ["Outbox"]

_LOST = (
    aiormq.exceptions.ChannelInvalidStateError,
    aiormq.exceptions.ChannelClosed,
    aiormq.exceptions.ConnectionClosed,
    ConnectionError,
    RuntimeError,
)
_CLOSE = (*_LOST, aiormq.exceptions.AMQPError, asyncio.TimeoutError)


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
                    f"run `{self.names.declare_command}`"
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
