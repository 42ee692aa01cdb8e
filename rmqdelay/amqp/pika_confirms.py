"""The sync publisher's confirm channel, two ways: pipelined (fast) or pika's public API.

Both send a batch and report one outcome per message, as the core's factories word
them (a return, a nack, a confirm timeout, a channel or connection lost); the core flow
(:mod:`..core.publishing`) decides what follows. Neither raises for a lost connection:
:attr:`lost` says why, and the channel is left.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import pika
import pika.channel
import pika.exceptions
import pika.frame
import pika.spec
from pika.adapters.blocking_connection import BlockingChannel

from ..core.plan import Route
from ..core.publishing.outgoing import Outcome, Outgoing, Prepared, PublishResult
from ..core.publishing.publisher import PublisherCore
from ..core.wire import encode_publish
from . import pika_private

__all__ = ["LOST", "ConfirmChannel", "open_confirm_channel", "pika_encoded", "pika_properties"]

LOST = (pika.exceptions.AMQPError, OSError)
"""What pika raises when the connection or channel goes away (TimeoutError included)."""
_FLUSH_EVERY = 64


class _Encoded(pika.BasicProperties):
    """pika's properties object sending the bytes rmqdelay encoded (:mod:`..core.wire`)."""

    def __init__(self, encoded: bytes, message_id: str) -> None:
        super().__init__(message_id=message_id)
        self._encoded = encoded

    def encode(self) -> list[bytes]:
        return [self._encoded]


def pika_properties(prepared: Prepared) -> pika.BasicProperties:
    """The converter to pika: the same bytes the async publisher sends."""
    return _Encoded(prepared.encoded_properties, prepared.message_id)


def pika_encoded(encoded: bytes, message_id: str) -> pika.BasicProperties:
    """Properties rmqdelay encoded (:func:`~rmqdelay.core.wire.encode_properties`), for
    pika's ``basic_publish``: the x-delay bridge's parked copies."""
    return _Encoded(encoded, message_id)


class ConfirmChannel(Protocol):
    lost: BaseException | None
    """Why the channel or its connection went away during the last send."""

    @property
    def is_open(self) -> bool: ...

    def send(self, batch: Sequence[Prepared]) -> list[Outcome]: ...

    def close(self) -> None: ...


def open_confirm_channel(
    connection: pika.BlockingConnection, core: PublisherCore, timeout: float, window: int
) -> ConfirmChannel:
    """A channel in confirm mode; raises one of :data:`LOST` if it cannot be had."""
    if pika_private.usable(connection):
        return Pipelined(connection, core, timeout, window)
    return OneByOne(connection, core, timeout)


def _failed(core: PublisherCore, out: Outgoing, exc: BaseException, timeout: float) -> Outcome:
    """The outcome of a message whose confirm the loss of its channel took away."""
    if getattr(exc, "reply_code", None) == 404:  # the channel closed on a missing exchange
        return core.no_exchange(out, str(exc.args[-1]))
    if isinstance(exc, TimeoutError):
        return core.no_confirm(out.message_id, timeout)
    return core.unconfirmed(out.message_id, repr(exc))


def _up_to(pending: dict[int, Any], tag: int) -> list[int]:
    """The tags a multiple confirm up to ``tag`` settles: ``pending`` holds tags in the
    order they were sent, so the scan stops at the first one past it instead of reading
    the whole window at every confirm."""
    tags = []
    for t in pending:
        if t > tag:
            break
        tags.append(t)
    return tags


class OneByOne:
    """pika's public BlockingChannel: a confirm round trip per message, and no deadline
    (pika waits for each confirm until it comes or the connection ends)."""

    lost: BaseException | None = None

    def __init__(
        self, connection: pika.BlockingConnection, core: PublisherCore, timeout: float
    ) -> None:
        self.core, self.timeout = core, timeout
        self.channel: BlockingChannel = connection.channel()
        self.channel.confirm_delivery()

    @property
    def is_open(self) -> bool:
        return bool(self.channel.is_open)

    def send(self, batch: Sequence[Prepared]) -> list[Outcome]:
        outcomes: list[Outcome] = []
        for n, prepared in enumerate(batch):
            out = self.core.finalize(prepared)
            try:
                self.channel.basic_publish(
                    out.exchange,
                    out.routing_key,
                    prepared.body,
                    pika_properties(prepared),
                    mandatory=True,
                )
                outcomes.append(PublishResult.of(out))
            except pika.exceptions.UnroutableError as exc:
                reason = exc.messages[0].method.reply_text if exc.messages else "returned"
                outcomes.append(self.core.returned(out, str(reason)))
            except pika.exceptions.NackError:
                outcomes.append(self.core.nacked(out))
            except BaseException as exc:
                self.lost = exc
                self.close()
                if not isinstance(exc, LOST):
                    raise
                # the broker drops what follows on a closed channel, as on the fast path
                rest = [out, *(self.core.finalize(p) for p in batch[n + 1 :])]
                return outcomes + [_failed(self.core, o, exc, self.timeout) for o in rest]
        return outcomes

    def close(self) -> None:
        if self.channel.is_open:
            with contextlib.suppress(*LOST):
                self.channel.close()


class Pipelined:
    """Confirms tracked by delivery tag on the channel under the BlockingChannel: a
    window of messages written as frames rmqdelay encoded, then I/O pumped until their
    confirms arrive, each wait bounded by ``timeout`` (:mod:`.pika_private`)."""

    lost: BaseException | None = None

    def __init__(
        self,
        connection: pika.BlockingConnection,
        core: PublisherCore,
        timeout: float,
        window: int,
    ) -> None:
        self.connection, self.core, self.timeout, self.window = connection, core, timeout, window
        self.impl = impl = pika_private.open_channel(connection, timeout)
        self.closed: BaseException | None = None
        self.next_tag = 1
        self.pending: dict[int, tuple[int, Prepared, Route]] = {}
        """Per delivery tag: the message's index in the batch, the message, its route
        (its whole :class:`Outgoing` is made again from that for an error only)."""
        self.outcomes: list[Outcome | None] = []
        self.returned: dict[str, str] = {}
        ready: list[bool] = []
        impl.confirm_delivery(
            ack_nack_callback=self._on_confirm, callback=lambda _frame: ready.append(True)
        )
        impl.add_on_return_callback(self._on_return)
        impl.add_on_close_callback(self._on_channel_closed)
        pika_private.wait_until(connection, lambda: bool(ready), timeout, "confirms")

    @property
    def is_open(self) -> bool:
        return bool(self.impl.is_open)

    def _on_return(
        self,
        _channel: pika.channel.Channel,
        method: pika.spec.Basic.Return,
        properties: pika.spec.BasicProperties,
        _body: bytes,
    ) -> None:
        # A return comes before the ack of the same message (RabbitMQ's ordering).
        self.returned[str(properties.message_id)] = str(method.reply_text)

    def _on_channel_closed(self, _channel: pika.channel.Channel, reason: BaseException) -> None:
        self.closed = reason

    def _on_confirm(self, frame: pika.frame.Method[Any]) -> None:
        method = frame.method
        tag = int(method.delivery_tag)
        tags = _up_to(self.pending, tag) if method.multiple else [tag]
        nack = isinstance(method, pika.spec.Basic.Nack)
        pending, returned, routed = self.pending, self.returned, PublishResult.routed
        for t in tags:
            entry = pending.pop(t, None)
            if entry is None:
                continue
            index, prepared, route = entry
            reason = returned.pop(prepared.message_id, None) if returned else None
            outcome: Outcome
            if reason is not None:
                outcome = self.core.returned(self._outgoing(prepared, route), reason)
            elif nack:
                outcome = self.core.nacked(self._outgoing(prepared, route))
            else:
                outcome = routed(prepared, route.routing_key, route.hops)
            self.outcomes[index] = outcome

    def _outgoing(self, prepared: Prepared, route: Route) -> Outgoing:
        """The message as it was sent, planned again at the same instant (the same plan)."""
        return self.core.finalize(prepared, route.planned_at_us)

    def send(self, batch: Sequence[Prepared]) -> list[Outcome]:
        outcomes: list[Outcome | None] = [None] * len(batch)
        self.outcomes = outcomes
        number, limit = self.impl.channel_number, int(self.impl.connection.params.frame_max)
        frames: list[bytes] = []
        route_of, pending = self.core.route, self.pending
        try:
            for n, prepared in enumerate(batch):
                route = route_of(prepared)  # no DelayPlan or Outgoing per message in flight
                pending[self.next_tag] = (n, prepared, route)
                self.next_tag += 1
                frames.append(
                    encode_publish(
                        number,
                        route.exchange,
                        route.publish_key,
                        prepared.encoded_properties,
                        prepared.body,
                        frame_max=limit,
                    )
                )
                if len(frames) == _FLUSH_EVERY or len(self.pending) >= self.window:
                    pika_private.write_frames(self.impl, b"".join(frames))
                    frames.clear()
                    self._pump(lambda: len(self.pending) < self.window)
            if frames:
                pika_private.write_frames(self.impl, b"".join(frames))
            self._pump(lambda: not self.pending)
        except BaseException as exc:
            self._give_up(exc)
            if not isinstance(exc, LOST):
                raise
        return [
            o if o is not None else self.core.unconfirmed(p.message_id, "no confirm arrived")
            for o, p in zip(outcomes, batch, strict=True)
        ]

    def _give_up(self, exc: BaseException) -> None:
        """Fail what waits for a confirm, and leave the channel: its tags are unknown now."""
        self.lost = exc
        for index, prepared, route in self.pending.values():
            out = self._outgoing(prepared, route)
            self.outcomes[index] = _failed(self.core, out, exc, self.timeout)
        self.pending.clear()
        self.close()

    def _pump(self, done: Callable[[], bool]) -> None:
        """Process I/O until ``done()``; raise if the channel closes or confirms time out."""
        impl = self.impl
        pika_private.wait_until(
            self.connection,
            lambda: done() or impl.is_closed,
            self.timeout,
            f"confirms, confirm_timeout={self.timeout:g}s",
        )
        if impl.is_closed:
            raise self.closed or pika.exceptions.ChannelClosed(0, "the channel closed")

    def close(self) -> None:
        if self.impl.is_open:
            self.impl.close()  # its CloseOk comes with the connection's later I/O
