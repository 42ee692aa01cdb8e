"""The asyncio publisher, on aio-pika. Thin: the planning lives in :mod:`publishing`."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import Any

import aiormq
from aio_pika.abc import AbstractChannel, AbstractConnection
from pamqp.commands import Basic
from typing_extensions import Unpack

from ..core.outgoing import (
    Outgoing,
    Prepared,
    PublisherCore,
    PublishOptions,
    PublishResult,
    gather_results,
)
from ..errors import (
    PublisherClosedError,
    PublishError,
    UnroutableError,
)
from ..settings import Settings
from .connections import connect_async

__all__ = ["AsyncPublisher"]


class AsyncPublisher:
    """Publish delayed messages with confirms, from asyncio code.

    ``async with AsyncPublisher(settings) as publisher: await publisher.publish(...)``
    """

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        connection: AbstractConnection | None = None,
        window: int = 1000,
    ) -> None:
        self.settings = settings or Settings()
        self.core = PublisherCore(self.settings.layout)
        self._connection = connection
        self._owns_connection = connection is None
        self._channel: AbstractChannel | None = None
        self._window = window

    async def connect(self) -> AsyncPublisher:
        if self._connection is None:
            self._connection = await connect_async(self.settings, "pub", robust=True)
        await self._ensure_channel()
        return self

    async def close(self) -> None:
        if self._channel is not None and not self._channel.is_closed:
            await self._channel.close()
        if self._owns_connection and self._connection is not None:
            await self._connection.close()
            self._connection = None

    async def __aenter__(self) -> AsyncPublisher:
        return await self.connect()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def _ensure_channel(self) -> AbstractChannel:
        if self._connection is None or self._connection.is_closed:
            raise PublisherClosedError("the publisher is not connected: call connect() first")
        if self._channel is None or self._channel.is_closed:
            self._channel = await self._connection.channel(
                publisher_confirms=True, on_return_raises=True
            )
        return self._channel

    async def check_destination(self, destination: str) -> None:
        """Raise UnknownDestinationError unless the work queue exists (passive, cached)."""
        if destination in self.core.known_destinations:
            return
        if self._connection is None:
            raise PublisherClosedError("the publisher is not connected: call connect() first")
        queue = self.core.layout.work_queue(destination)
        try:
            async with self._connection.channel(publisher_confirms=False) as probe:
                await probe.declare_queue(queue, passive=True)
        except aiormq.exceptions.ChannelNotFoundEntity:
            raise self.core.unknown_destination(destination) from None
        self.core.known_destinations.add(destination)

    async def publish(
        self, destination: str, body: object, **options: Unpack[PublishOptions]
    ) -> PublishResult:
        """Publish one message and wait for the broker's confirm.

        ``options``: ``delay`` or ``at``, ``headers``, ``message_id``, and the AMQP
        properties ``correlation_id``, ``content_type``, ``content_encoding``,
        ``priority``, ``reply_to``, ``type`` and ``app_id`` (see :class:`PublishOptions`).
        """
        prepared = self.core.prepare(destination, body, **options)
        await self.check_destination(destination)
        return await self.send(prepared)

    async def publish_many(self, requests: Iterable[Mapping[str, Any]]) -> list[PublishResult]:
        """Publish many messages with pipelined confirms; each request holds publish's args.

        Everything is validated before the first message is sent.
        """
        prepared = [self.core.prepare(**request) for request in requests]
        for destination in dict.fromkeys(p.destination for p in prepared):
            await self.check_destination(destination)
        order = self.core.send_order(prepared)
        outcomes: list[PublishResult | BaseException] = []
        for start in range(0, len(order), self._window):
            chunk = [prepared[i] for i in order[start : start + self._window]]
            outcomes += await asyncio.gather(*(self.send(p) for p in chunk), return_exceptions=True)
        return gather_results(prepared, outcomes, order)

    async def send(self, prepared: Prepared) -> PublishResult:
        """Route a prepared message now, send it, and wait for its confirm."""
        channel = await self._ensure_channel()
        out = self.core.finalize(prepared)
        try:
            # aio-pika's own transport, without a Message and Exchange object per publish
            underlay = await channel.get_underlay_channel()
            await underlay.basic_publish(
                out.prepared.body,
                exchange=out.exchange,
                routing_key=out.routing_key,
                properties=_properties(out),
                mandatory=True,
                timeout=self.settings.confirm_timeout,
                **_NO_DRAIN,
            )
        except aiormq.exceptions.PublishError as exc:
            reason = str(getattr(exc.frame, "reply_text", "NO_ROUTE"))
            raise self.core.returned(out, reason) from None
        except aiormq.exceptions.DeliveryError as exc:
            if isinstance(exc.frame, Basic.Nack):
                raise self.core.nacked(out) from None
            raise PublishError(f"message {out.message_id} was not confirmed: {exc}") from None
        except aiormq.exceptions.ChannelNotFoundEntity as exc:
            raise UnroutableError(
                f"message {out.message_id} was not sent: {exc.args[-1] if exc.args else exc}"
                "; run `rmqdelay topology apply`"
            ) from None
        except (
            aiormq.exceptions.ChannelInvalidStateError,
            aiormq.exceptions.ConnectionClosed,
            aiormq.exceptions.ChannelClosed,
            ConnectionError,
        ) as exc:
            raise PublisherClosedError(
                f"the connection closed before message {out.message_id} was confirmed ({exc})"
                "; it may or may not have been delivered: publish it again"
            ) from None
        except asyncio.TimeoutError:
            raise PublishError(
                f"no confirm for message {out.message_id} within "
                f"{self.settings.confirm_timeout}s; publish it again"
            ) from None
        return PublishResult.of(out)


def _no_drain() -> dict[str, Any]:
    """``wait=False`` where aiormq has it: do not wait for each frame to be flushed.

    The confirm is still awaited (it cannot come before the bytes went out), and the
    window bounds what sits in the write buffer. Waiting for every flush cost about 13 %
    of the client CPU per message (bench/README.md, "What limits the figures").
    """
    params = inspect.signature(aiormq.Channel.basic_publish).parameters
    return {"wait": False} if "wait" in params else {}


_NO_DRAIN = _no_drain()


def _properties(out: Outgoing) -> Basic.Properties:
    return Basic.Properties(
        content_type=out.prepared.content_type,
        delivery_mode=2,  # persistent
        headers=out.headers,
        message_id=out.message_id,
        correlation_id=out.prepared.correlation_id,
        content_encoding=out.prepared.content_encoding,
        priority=out.prepared.priority,
        reply_to=out.prepared.reply_to,
        message_type=out.prepared.type,
        app_id=out.prepared.app_id,
    )
