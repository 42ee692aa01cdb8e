"""The synchronous publisher, on pika. Thin: the planning lives in :mod:`publishing`.

pika's BlockingChannel waits one round trip per confirmed publish. To pipeline,
this publisher tracks delivery tags itself on the underlying channel: it sends a
window of messages, then pumps the connection until their confirms arrive.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from types import TracebackType
from typing import Any

import pika
import pika.channel
import pika.exceptions
import pika.frame
import pika.spec
from pika.adapters.blocking_connection import BlockingChannel
from typing_extensions import Unpack

from ..core.outgoing import (
    Outgoing,
    Prepared,
    PublisherCore,
    PublishOptions,
    PublishResult,
    gather_results,
)
from ..errors import PublisherClosedError, PublishError, UnroutableError
from ..settings import Settings
from .connections import connect_blocking

__all__ = ["Publisher"]

_FLUSH_EVERY = 64


class Publisher:
    """Publish delayed messages with confirms, from synchronous code.

    ``with Publisher(settings) as publisher: publisher.publish("orders", body, delay="15m")``
    """

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        connection: pika.BlockingConnection | None = None,
        window: int = 1000,
    ) -> None:
        self.settings = settings or Settings()
        self.core = PublisherCore(self.settings.layout)
        self._connection = connection
        self._owns_connection = connection is None
        self._channel: BlockingChannel | None = None
        self._impl: pika.channel.Channel | None = None
        self._window = window
        self._next_tag = 1
        self._pending: dict[int, Outgoing] = {}
        self._outcomes: dict[str, PublishResult | PublishError] = {}
        self._returned: dict[str, str] = {}

    def connect(self) -> Publisher:
        if self._connection is None or not self._connection.is_open:
            self._connection = connect_blocking(self.settings, "pub")
        self._open_channel()
        return self

    def close(self) -> None:
        if self._owns_connection and self._connection is not None and self._connection.is_open:
            self._connection.close()
        self._connection = self._channel = None

    def __enter__(self) -> Publisher:
        return self.connect()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _open_channel(self) -> BlockingChannel:
        if self._channel is not None and self._channel.is_open:
            return self._channel
        if self._connection is None or not self._connection.is_open:
            raise PublisherClosedError("the publisher is not connected: call connect() first")
        channel = self._connection.channel()
        ready: list[bool] = []
        # The underlying channel: confirms tracked here, not by BlockingChannel.
        impl: pika.channel.Channel = channel._impl  # type: ignore[attr-defined]
        impl.confirm_delivery(
            ack_nack_callback=self._on_confirm, callback=lambda _frame: ready.append(True)
        )
        impl.add_on_return_callback(self._on_return)
        self._channel, self._impl, self._next_tag = channel, impl, 1
        self._pump(lambda: bool(ready))  # wait for Confirm.SelectOk
        self._pending.clear()
        return channel

    def _on_return(
        self,
        _channel: pika.channel.Channel,
        method: pika.spec.Basic.Return,
        properties: pika.spec.BasicProperties,
        _body: bytes,
    ) -> None:
        # A return comes before the ack of the same message (RabbitMQ's ordering).
        self._returned[str(properties.message_id)] = str(method.reply_text)

    def _on_confirm(self, frame: pika.frame.Method[Any]) -> None:
        method = frame.method
        tag = int(method.delivery_tag)
        tags = [t for t in self._pending if t <= tag] if method.multiple else [tag]
        nack = isinstance(method, pika.spec.Basic.Nack)
        for t in tags:
            out = self._pending.pop(t, None)
            if out is None:
                continue
            reason = self._returned.pop(out.message_id, None)
            outcome: PublishResult | PublishError
            if reason is not None:
                outcome = self.core.returned(out, reason)
            elif nack:
                outcome = self.core.nacked(out)
            else:
                outcome = PublishResult.of(out)
            self._outcomes[out.message_id] = outcome

    def check_destination(self, destination: str) -> None:
        """Raise UnknownDestinationError unless the work queue exists (passive, cached)."""
        if destination in self.core.known_destinations:
            return
        if self._connection is None or not self._connection.is_open:
            raise PublisherClosedError("the publisher is not connected: call connect() first")
        probe = self._connection.channel()
        try:
            probe.queue_declare(self.core.layout.work_queue(destination), passive=True)
        except pika.exceptions.ChannelClosedByBroker as exc:
            if exc.reply_code == 404:
                raise self.core.unknown_destination(destination) from None
            raise
        else:
            probe.close()
        self.core.known_destinations.add(destination)

    def publish(
        self, destination: str, body: object, **options: Unpack[PublishOptions]
    ) -> PublishResult:
        """Publish one message and wait for the broker's confirm.

        ``options``: ``delay`` or ``at``, ``headers``, ``message_id``, and the AMQP
        properties ``correlation_id``, ``content_type``, ``content_encoding``,
        ``priority``, ``reply_to``, ``type`` and ``app_id`` (see :class:`PublishOptions`).
        """
        prepared = self.core.prepare(destination, body, **options)
        self.check_destination(destination)
        outcome = self._send([prepared])[0]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def publish_many(self, requests: Iterable[Mapping[str, Any]]) -> list[PublishResult]:
        """Publish many messages with pipelined confirms; each request holds publish's args.

        Everything is validated before the first message is sent.
        """
        prepared = [self.core.prepare(**request) for request in requests]
        for destination in dict.fromkeys(p.destination for p in prepared):
            self.check_destination(destination)
        order = self.core.send_order(prepared)
        return gather_results(prepared, self._send([prepared[i] for i in order]), order)

    def _send(self, batch: list[Prepared]) -> list[PublishResult | BaseException]:
        self._open_channel()
        assert self._connection is not None and self._impl is not None
        self._outcomes.clear()
        try:
            for n, prepared in enumerate(batch, 1):
                out = self.core.finalize(prepared)
                self._pending[self._next_tag] = out
                self._next_tag += 1
                self._impl.basic_publish(
                    out.exchange, out.routing_key, out.prepared.body, _properties(out), True
                )
                if n % _FLUSH_EVERY == 0 or len(self._pending) >= self._window:
                    self._pump(lambda: len(self._pending) < self._window)
            self._pump(lambda: not self._pending)
        except (pika.exceptions.AMQPError, OSError) as exc:
            error = _closed_error(exc)
            for out in self._pending.values():
                self._outcomes[out.message_id] = error
            self._pending.clear()
            self._channel = None
        return [
            self._outcomes.get(p.message_id, PublisherClosedError("no confirm arrived"))
            for p in batch
        ]

    def _pump(self, done: Callable[[], bool]) -> None:
        """Flush and process I/O until ``done()``, the channel closes, or the timeout."""
        assert self._connection is not None and self._channel is not None
        expired: list[bool] = []
        timer = self._connection.call_later(
            self.settings.confirm_timeout, lambda: expired.append(True)
        )
        try:  # the waiter BlockingChannel.basic_publish itself uses, without its one-by-one
            self._channel._flush_output(done, lambda: bool(expired))  # type: ignore[attr-defined]
        finally:
            self._connection.remove_timeout(timer)
        if self._channel.is_closed:
            raise pika.exceptions.ChannelClosed(0, "the channel closed")
        if not done():
            raise pika.exceptions.AMQPError(
                f"no confirm within confirm_timeout={self.settings.confirm_timeout}s"
            )


def _properties(out: Outgoing) -> pika.BasicProperties:
    return pika.BasicProperties(
        content_type=out.prepared.content_type,
        delivery_mode=pika.DeliveryMode.Persistent,
        headers=out.headers,
        message_id=out.message_id,
        correlation_id=out.prepared.correlation_id,
        content_encoding=out.prepared.content_encoding,
        priority=out.prepared.priority,
        reply_to=out.prepared.reply_to,
        type=out.prepared.type,
        app_id=out.prepared.app_id,
    )


def _closed_error(exc: BaseException) -> PublishError:
    if isinstance(exc, pika.exceptions.ChannelClosedByBroker) and exc.reply_code == 404:
        return UnroutableError(f"{exc.reply_text}; run `rmqdelay topology apply`")
    return PublisherClosedError(
        f"the connection or channel closed before the confirm ({exc!r}); the message may "
        "or may not have been delivered: publish it again"
    )
