"""The synchronous publisher, on pika. Thin: the checks and flows live in :mod:`..core.outgoing`.

pika's BlockingChannel waits one round trip per confirmed publish. To pipeline,
this publisher tracks delivery tags itself on the underlying channel: it sends a
window of messages, then pumps the connection until their confirms arrive. Every wait
has a deadline (:mod:`.blocking`), and a dropped connection it opened is reopened by
the next publish.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar, cast

import pika
import pika.channel
import pika.exceptions
import pika.frame
import pika.spec

from ..core.journal import CancelResult, JournalRecord
from ..core.outgoing import (
    CheckQueue,
    Failover,
    Flow,
    Outcome,
    Outgoing,
    Prepared,
    PublishResult,
    Send,
    Steps,
)
from ..core.wire import encode_publish
from ..errors import ConnectionFailedError, PublisherClosedError
from . import journal
from .blocking import (
    close_connection,
    frame_max,
    open_channel,
    poll_once,
    wait_until,
    write_frames,
)
from .connections import connect_blocking
from .passive import queue_exists
from .publishing import FAILOVER_CLOSE_S, PublisherSurface

__all__ = ["Publisher", "pika_properties"]

T = TypeVar("T")
_FLUSH_EVERY = 64
_LOST = (pika.exceptions.AMQPError, OSError)
"""What pika raises when the connection or channel goes away (TimeoutError included)."""


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


class Publisher(
    PublisherSurface[pika.BlockingConnection, PublishResult, list[PublishResult], None]
):
    """Publish delayed messages with confirms, from synchronous code.

    ``with Publisher(settings) as publisher: publisher.publish("orders", body, delay="15m")``
    """

    _channel: pika.channel.Channel | None = None
    _channel_closed: BaseException | None = None
    _next_tag = 1

    def connect(self) -> Publisher:
        """Open the connection (unless given one) and the confirm channel."""
        self._started = True
        self._confirm_channel()
        return self

    def close(self) -> None:
        """Close the channel, and the connection if this publisher opened it; bounded."""
        self._started = False
        channel, self._channel = self._channel, None
        if self._connection is None:
            return
        if self._owns_connection:
            close_connection(self._connection, self.settings.confirm_timeout)
            self._connection = None
        elif channel is not None and channel.is_open:
            channel.close()  # its CloseOk comes with the connection's later I/O

    def __enter__(self) -> Publisher:
        return self.connect()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------ the journal

    def cancel(self, *message_ids: str) -> list[CancelResult]:
        """Cancel scheduled messages: a confirmed tombstone in the schedule journal for
        each id with a copy still ahead, naming every copy (an id sent again after a
        failed confirm has one per due time). Each result says ``cancelled`` (with the
        due time and ``copies``), ``unknown`` (no record) or ``too late`` (every copy due
        already: it may have been delivered). A :class:`~rmqdelay.Worker` acks a
        cancelled copy without calling its handler.
        """
        return journal.cancel(
            self._live_connection(),
            self.core.layout,
            list(message_ids),
            timeout=self.settings.confirm_timeout,
        )

    def list_scheduled(
        self,
        *,
        destination: str | None = None,
        due_before: datetime | None = None,
        limit: int | None = None,
    ) -> list[JournalRecord]:
        """What the journal says is still ahead and not cancelled, soonest first (what was
        published while the journal was on): a record per copy, so an id sent again with
        another due time shows once for each."""
        return journal.list_scheduled(
            self._live_connection(),
            self.core.layout,
            destination=destination,
            due_before_ms=None if due_before is None else int(due_before.timestamp() * 1000),
            limit=limit,
            timeout=self.settings.confirm_timeout,
        )

    # ------------------------------------------------------------------ connection

    def _open_connection(self) -> pika.BlockingConnection:
        self._connection = connection = connect_blocking(
            self.settings, "pub", last=self._try_last
        )
        return connection

    def _live_connection(self) -> pika.BlockingConnection:
        """The open connection: reopened (bounded attempts) if it dropped and is ours."""
        if not self._started:
            raise self.core.not_connected()
        connection = self._connection
        if connection is None:
            return self._open_connection()
        if connection.is_open:
            try:
                poll_once(connection)  # learn of a close that already happened
            except _LOST as exc:
                self._lost = exc
        if connection.is_open:
            return connection
        self._channel = None
        failures: list[Exception] = []
        for pause in self._reconnect_pauses(failures):
            time.sleep(pause)
            try:
                return self._open_connection()
            except ConnectionFailedError as exc:
                failures.append(exc)
        raise AssertionError("unreachable: the pauses end by raising")

    def _confirm_channel(self) -> pika.channel.Channel:
        connection = self._live_connection()
        if self._channel is not None and self._channel.is_open:
            return self._channel
        try:
            impl: pika.channel.Channel = open_channel(
                connection, self.settings.confirm_timeout
            )._impl  # type: ignore[attr-defined]  # confirms tracked here, not by BlockingChannel
            ready: list[bool] = []
            impl.confirm_delivery(
                ack_nack_callback=functools.partial(self._on_confirm, impl),
                callback=lambda _frame: ready.append(True),
            )
            impl.add_on_return_callback(functools.partial(self._on_return, impl))
            impl.add_on_close_callback(functools.partial(self._on_channel_closed, impl))
            wait_until(connection, lambda: bool(ready), self.settings.confirm_timeout, "confirms")
        except _LOST as exc:
            self._lost = exc
            raise PublisherClosedError(f"cannot open a channel: {exc!r}") from None
        self._channel, self._channel_closed, self._next_tag = impl, None, 1
        self._pending: dict[int, tuple[int, Outgoing]] = {}
        self._outcomes: list[Outcome | None] = []
        self._returned: dict[str, str] = {}
        return impl

    # ------------------------------------------------------------------ steps

    def _run(self, flow: Flow[T]) -> T:
        steps = Steps(flow)
        step = steps.next()
        while step is not None:
            step = steps.next(self._do(step))
        return cast(T, steps.value)

    def _do(self, step: CheckQueue | Send | Failover) -> object:
        if isinstance(step, CheckQueue):
            return self._queue_exists(step.queue)
        if isinstance(step, Failover):
            return self._failover(step.reason)
        return self._send(step.batch)

    def _failover(self, reason: str) -> bool:
        """Move to another node (see ``_leaving``): the new connection first, one pass
        over the addresses; the old one is closed only once it is open, so a publisher
        with nowhere to go keeps what it had."""
        if not self._leaving(reason):
            return False
        try:
            new = connect_blocking(
                self.settings, "pub", last=self._try_last, timeout=self._failover_timeout
            )
        except ConnectionFailedError as exc:
            self._stay(exc)
            return False
        old, self._connection, self._channel = self._connection, new, None
        assert old is not None
        close_connection(old, min(FAILOVER_CLOSE_S, self.settings.confirm_timeout))
        return True

    def _queue_exists(self, queue: str) -> bool:
        connection = self._live_connection()
        try:
            return queue_exists(connection, queue, self.settings.confirm_timeout)
        except _LOST as exc:
            self._lost = exc
            raise PublisherClosedError(f"the passive check of {queue!r} failed: {exc!r}") from None

    def _on_return(
        self,
        impl: pika.channel.Channel,
        _channel: pika.channel.Channel,
        method: pika.spec.Basic.Return,
        properties: pika.spec.BasicProperties,
        _body: bytes,
    ) -> None:
        # A return comes before the ack of the same message (RabbitMQ's ordering).
        if impl is self._channel:
            self._returned[str(properties.message_id)] = str(method.reply_text)

    def _on_channel_closed(
        self, impl: pika.channel.Channel, _channel: pika.channel.Channel, reason: BaseException
    ) -> None:
        if impl is self._channel:
            self._channel_closed = reason

    def _on_confirm(self, impl: pika.channel.Channel, frame: pika.frame.Method[Any]) -> None:
        if impl is not self._channel:
            return  # a late confirm from a channel given up on: its tags mean nothing now
        method = frame.method
        tag = int(method.delivery_tag)
        tags = [t for t in self._pending if t <= tag] if method.multiple else [tag]
        nack = isinstance(method, pika.spec.Basic.Nack)
        for t in tags:
            index, out = self._pending.pop(t, (-1, None))
            if out is None:
                continue
            reason = self._returned.pop(out.message_id, None)
            outcome: Outcome
            if reason is not None:
                outcome = self.core.returned(out, reason)
            elif nack:
                outcome = self.core.nacked(out)
            else:
                outcome = PublishResult.of(out)
            self._outcomes[index] = outcome

    def _send(self, batch: list[Prepared]) -> list[Outcome]:
        channel = self._confirm_channel()
        outcomes: list[Outcome | None] = [None] * len(batch)
        self._outcomes = outcomes
        number, limit = channel.channel_number, frame_max(channel)
        frames: list[bytes] = []
        try:
            for n, prepared in enumerate(batch):
                out = self.core.finalize(prepared)
                self._pending[self._next_tag] = (n, out)
                self._next_tag += 1
                frames.append(
                    encode_publish(
                        number,
                        out.exchange,
                        out.routing_key,
                        prepared.encoded_properties,
                        prepared.body,
                        frame_max=limit,
                    )
                )
                if len(frames) == _FLUSH_EVERY or len(self._pending) >= self._window:
                    write_frames(channel, b"".join(frames))
                    frames.clear()
                    self._pump(lambda: len(self._pending) < self._window)
            if frames:
                write_frames(channel, b"".join(frames))
            self._pump(lambda: not self._pending)
        except BaseException as exc:
            self._give_up(exc)
            if not isinstance(exc, _LOST):
                raise
        return [
            o if o is not None else self.core.unconfirmed(p.message_id, "no confirm arrived")
            for o, p in zip(outcomes, batch, strict=True)
        ]

    def _give_up(self, exc: BaseException) -> None:
        """Fail what waits for a confirm, and leave the channel: its tags are unknown now."""
        self._lost = exc
        code = getattr(exc, "reply_code", None)
        for index, out in self._pending.values():
            if code == 404:  # the channel closed on a missing exchange
                self._outcomes[index] = self.core.no_exchange(out, str(exc.args[-1]))
            elif isinstance(exc, TimeoutError):
                self._outcomes[index] = self.core.no_confirm(
                    out.message_id, self.settings.confirm_timeout
                )
            else:
                self._outcomes[index] = self.core.unconfirmed(out.message_id, repr(exc))
        self._pending.clear()
        channel, self._channel = self._channel, None
        if channel is not None and channel.is_open:
            channel.close()

    def _pump(self, done: Callable[[], bool]) -> None:
        """Process I/O until ``done()``; raise if the channel closes or confirms time out."""
        assert self._connection is not None and self._channel is not None
        channel = self._channel
        wait_until(
            self._connection,
            lambda: done() or channel.is_closed,
            self.settings.confirm_timeout,
            f"confirms, confirm_timeout={self.settings.confirm_timeout:g}s",
        )
        if channel.is_closed:
            raise self._channel_closed or pika.exceptions.ChannelClosed(0, "the channel closed")
