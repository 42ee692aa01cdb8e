"""The asyncio publisher, on aio-pika. Thin: its operations are declared in
:mod:`..core.publishing.aio_api`, its checks and flows live in :mod:`..core.publishing`.

Every wait has a deadline, and a dropped connection this publisher opened is reopened
by the next publish (not by aio-pika's robust connection, which reconnects on its own
schedule and meanwhile fails calls with a bare RuntimeError).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import Any, TypeVar, cast

import aiormq
from aio_pika.abc import AbstractChannel, AbstractConnection
from pamqp.commands import Basic
from typing_extensions import Self

from ..core.journal.steps import Read
from ..core.publishing.aio_api import AbstractAsyncPublisher
from ..core.publishing.outgoing import (
    Outcome,
    Outgoing,
    Prepared,
    PublishResult,
    WithRecords,
    lone_write,
)
from ..core.steps import (
    CheckExchange,
    Checkpoint,
    CheckQueue,
    Failover,
    Flow,
    Send,
    Step,
    Steps,
)
from ..errors import (
    AccessRefusedError,
    ConnectionFailedError,
    PublisherClosedError,
    PublishError,
)
from . import aiormq_private
from .aio_sending import EncodedProperties, JournalLinger, send_encoded
from .aio_streams import AsyncStream
from .checkpoints import checkpoint_aside
from .connections import connect_async
from .journal import journal_step_async
from .passive import exchange_exists_async, queue_exists_async
from .publishing import FAILOVER_CLOSE_S, PublisherSurface

__all__ = ["AsyncPublisher"]

T = TypeVar("T")
_CHUNK = 128
"""At most this many messages per write (and a quarter of the window)."""
_REFILL = 16
"""A write as soon as this much room is free (what is free, up to a chunk): the window
stays nearly full, as a pipelining client's does, while the client encodes the next."""
_IDLE_CHANNELS = 3
"""A batch gives up after this many channels closed before it could write to them."""
_LOST = (
    aiormq.exceptions.ChannelInvalidStateError,
    aiormq.exceptions.ConnectionClosed,
    aiormq.exceptions.ChannelClosed,
    ConnectionError,
    RuntimeError,  # aio-pika: "<Connection> closed"
)
"""What aio-pika and aiormq raise when the connection or channel went away."""


class AsyncPublisher(PublisherSurface[AbstractConnection], AbstractAsyncPublisher):
    """Publish delayed messages with confirms, from asyncio code.

    ``async with AsyncPublisher(settings) as publisher: await publisher.publish(...)``
    """

    _channel: AbstractChannel | None = None
    _opening: asyncio.Lock | None = None
    _watched: AbstractConnection | None = None
    _followers: dict[str, AsyncStream] | None = None
    _checkpointing: asyncio.Future[None] | None = None
    _linger: JournalLinger | None = None

    async def connect(self) -> Self:
        self._started = True
        await self._confirm_channel()
        return self

    async def close(self) -> None:
        self._started = False
        checkpointing, self._checkpointing = self._checkpointing, None
        if checkpointing is not None:
            await checkpointing  # a short-lived process would leave it cut off
        if self._linger is not None:
            await self._linger.close()  # the records of publishes still waiting
        channel, self._channel = self._channel, None
        followers, self._followers = self._followers or {}, None
        for follower in followers.values():
            await self._quietly(follower.close())
        connection = self._connection
        if self._owns_connection:
            self._connection = None
            if connection is not None and not connection.is_closed:
                await self._quietly(connection.close())
        elif channel is not None and not channel.is_closed:
            await self._quietly(channel.close())

    async def _quietly(self, closing: Awaitable[Any], at_most: float | None = None) -> None:
        timeout = self.settings.confirm_timeout
        try:
            await asyncio.wait_for(closing, timeout if at_most is None else min(at_most, timeout))
        except (asyncio.TimeoutError, aiormq.exceptions.AMQPError, *_LOST):
            pass  # gone, or going: nothing more to wait for

    # ------------------------------------------------------------------ connection

    def _on_connection_closed(self, _sender: object, exc: BaseException | None = None) -> None:
        self._lost = exc or "closed"

    def _watch(self, connection: AbstractConnection) -> AbstractConnection:
        """Learn why the connection closes, should it: the error then says so."""
        if connection is not self._watched:
            connection.close_callbacks.add(self._on_connection_closed)
            self._watched = connection
        return connection

    async def _open_connection(self) -> AbstractConnection:
        self._connection = await connect_async(self.settings, "pub", last=self._try_last)
        return self._watch(self._connection)

    async def _live_connection(self) -> AbstractConnection:
        """The open connection: reopened (bounded attempts) if it dropped and is ours."""
        if not self._started:
            raise self.core.not_connected()
        connection = self._connection
        if connection is None:
            return await self._open_connection()
        self._watch(connection)
        if _is_open(connection):
            return connection
        self._channel = None
        failures: list[Exception] = []
        for pause in self._reconnect_pauses(failures):
            await asyncio.sleep(pause)
            try:
                return await self._open_connection()
            except ConnectionFailedError as exc:
                failures.append(exc)
        raise AssertionError("unreachable: the pauses end by raising")

    def _usable(self, channel: AbstractChannel | None) -> bool:
        """The channel is open, and so is its connection: aio-pika closes a channel in a
        task of its own after the connection closed, so a publish right after the
        broker's Connection.Close would still find the channel open."""
        connection = self._connection
        return (
            channel is not None
            and not channel.is_closed
            and connection is not None
            and _is_open(connection)
        )

    async def _confirm_channel(self) -> AbstractChannel:
        channel = self._channel
        if self._usable(channel):
            assert channel is not None
            return channel
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:  # one reconnect and one channel for concurrent publishes
            channel = self._channel
            if self._usable(channel):
                assert channel is not None
                return channel
            connection = await self._live_connection()
            try:
                opened: AbstractChannel = await asyncio.wait_for(
                    connection.channel(publisher_confirms=True, on_return_raises=True),
                    self.settings.confirm_timeout,
                )
            except (asyncio.TimeoutError, *_LOST) as exc:
                raise PublisherClosedError(f"cannot open a channel: {exc!r}") from None
            self._channel = opened
            return opened

    # ------------------------------------------------------------------ steps

    async def _run(self, flow: Flow[T]) -> T:
        steps = Steps(flow)
        step = steps.next()
        while step is not None:
            step = steps.next(await self._do(step))
        return cast(T, steps.value)

    async def _do(self, step: Step) -> object:
        if isinstance(step, Checkpoint):  # on the side: see Publisher._checkpoint_aside
            running = self._checkpointing
            if running is None or running.done():
                work = asyncio.to_thread(checkpoint_aside, self.settings, step)
                self._checkpointing = asyncio.ensure_future(work)
            return None
        if isinstance(step, CheckQueue):
            return await self._queue_exists(step.queue)
        if isinstance(step, CheckExchange):
            return await self._exchange_exists(step.exchange)
        if isinstance(step, Failover):
            return await self._failover(step.reason)
        if isinstance(step, Send):
            batch = step.batch
            linger = self._journal_linger()
            if linger is not None and isinstance(batch, WithRecords) and len(batch.writes) == 1:
                write = batch.write(0)
                if not lone_write(write):
                    written = linger.add(write)
                    with linger.publishing():
                        sent = await self._send(batch.messages)
                    outcome = await asyncio.shield(written)
                    linger.returned()
                    return [*sent, outcome]
            return await self._send(batch)
        if isinstance(step, Read) and step.keep is not None:
            if self._followers is None:
                self._followers = {}
            follower = self._followers.setdefault(step.keep, AsyncStream())
            return await follower.read(await self._live_connection(), step)
        return await journal_step_async(await self._live_connection(), step)

    def _journal_linger(self) -> JournalLinger | None:
        if self._linger is None and self.settings.journal_linger:
            self._linger = JournalLinger(self.settings.journal_linger / 1000, self._send)
        return self._linger

    async def _failover(self, reason: str) -> bool:
        """:meth:`rmqdelay.Publisher._failover`, from asyncio code."""
        if not self._leaving(reason):
            return False
        try:
            new = await connect_async(
                self.settings, "pub", last=self._try_last, timeout=self._failover_timeout
            )
        except ConnectionFailedError as exc:
            self._stay(exc)
            return False
        old, self._channel = self._connection, None
        self._connection = self._watch(new)
        if old is not None and not old.is_closed:
            await self._quietly(old.close(), FAILOVER_CLOSE_S)
        return True

    async def _queue_exists(self, queue: str) -> bool:
        connection = await self._live_connection()
        try:
            return await queue_exists_async(connection, queue, self.settings.confirm_timeout)
        except (TimeoutError, asyncio.TimeoutError, *_LOST) as exc:
            raise PublisherClosedError(f"the passive check of {queue!r} failed: {exc!r}") from None

    async def _exchange_exists(self, exchange: str) -> bool:
        connection = await self._live_connection()
        timeout = self.settings.confirm_timeout
        try:
            return await exchange_exists_async(connection, exchange, timeout)
        except AccessRefusedError:
            return False  # a held marker unseen: full routes, on time for any consumer
        except (TimeoutError, asyncio.TimeoutError, *_LOST) as exc:
            raise PublisherClosedError(
                f"the passive check of {exchange!r} failed: {exc!r}"
            ) from None

    async def _send(self, batch: Sequence[Prepared]) -> list[Outcome]:
        if len(batch) == 1:  # no window for a lone message
            return [await self._outcome(batch[0])]
        outcomes: list[Outcome] = []
        idle = 0  # channels in a row that closed before anything was written
        while len(outcomes) < len(batch):
            rest = batch[len(outcomes) :] if outcomes else batch  # read as it goes
            channel = await self._confirm_channel()
            underlay: Any = await channel.get_underlay_channel()
            if not aiormq_private.can_write_frames(underlay):
                chunk = rest[: self._window]  # the public API: a window at a time
                outcomes += await asyncio.gather(*(self._outcome(p) for p in chunk))
                continue
            done, stopped = await self._send_sliding(underlay, rest)
            outcomes += done
            if stopped is None and len(done) < len(rest):  # the channel closed: a new one
                if self._channel is channel:
                    self._channel = None
                idle = 0 if done else idle + 1
                if idle < _IDLE_CHANNELS:
                    continue
                stopped = f"{idle} channels in a row closed before anything was sent"
            if stopped is not None:  # no confirms: sending more is no use
                outcomes += [self.core.not_sent(p.message_id, stopped) for p in rest[len(done) :]]
        return outcomes

    async def _send_sliding(
        self, underlay: Any, batch: Sequence[Prepared]
    ) -> tuple[list[Outcome], str | None]:
        """Send ``batch`` with up to ``window`` messages unconfirmed, writing a chunk of
        frames at once (:mod:`.aiormq_private`) whenever ``_REFILL`` messages' room is
        free, each message with its own confirm, return or nack as from aiormq's own
        publish. Waiting for a chunk's room (a quarter of the window) kept about 7/8 of
        the window in flight: 0.87 x raw pika's rate, whose pipelining refills on every
        confirm, when the broker's round trip set the pace.

        Returns the outcomes of the messages written, in order, and why sending stopped
        before the end (no confirm in time), if it did. When the channel closes, the
        written ones fail with its reason and the caller sends the rest on a new one.
        A send-all-then-wait window left the broker idle while the client waited for the
        last confirm of each window, and the client idle while the broker caught up.
        """
        timeout, window = self.settings.confirm_timeout, self._window
        step = max(1, min(_CHUNK, window // 4))
        refill = min(_REFILL, step)
        book = aiormq_private.Confirms(underlay)
        route = self.core.route
        sent = 0
        stopped: str | None = None
        lost: BaseException | None = None
        try:
            while sent < len(batch) and book.closed is None:
                left, free = len(batch) - sent, window - book.outstanding
                if free < min(refill, left):
                    if not await book.wait(window - min(refill, left), timeout):
                        break
                    continue
                wanted = min(step, free, left)
                chunk = batch[sent : sent + wanted]
                if not await aiormq_private.write_window(underlay, book, chunk, route):
                    break
                sent += wanted
            if book.closed is None:
                await book.wait(0, timeout)
        except (asyncio.TimeoutError, *_LOST) as exc:
            lost = self._lost = exc
        finally:
            if book.closed is None and lost is None and book.outstanding:
                stopped = (
                    f"earlier messages of the batch got no confirm within "
                    f"confirm_timeout={timeout:g}s"
                )
            book.finish()
        if book.closed is not None and isinstance(book.closed, _LOST):
            self._lost = book.closed
        outcomes: list[Outcome] = []
        routed = PublishResult.routed
        for slot in book.take():
            value, route_ = slot.value, slot.route
            if value is True:
                outcomes.append(routed(slot.message, route_.routing_key, route_.hops))
                continue
            # the plan it was sent with, made again (the same) for the error's words
            out = self.core.finalize(slot.message, route_.planned_at_us)
            if isinstance(value, BaseException):
                outcomes.append(self._failure(out, value))
            elif book.closed is not None:
                outcomes.append(self._closed_failure(out, book.closed))
            elif lost is not None:
                outcomes.append(self.core.unconfirmed(out.message_id, lost))
            else:
                outcomes.append(self.core.no_confirm(out.message_id, timeout))
        return outcomes, stopped

    async def _outcome(self, prepared: Prepared) -> Outcome:
        try:
            return await self.send(prepared)
        except Exception as exc:
            return exc

    async def send(self, prepared: Prepared) -> PublishResult:
        """Route a prepared message now, send it, and wait for its confirm."""
        channel = await self._confirm_channel()
        out = self.core.finalize(prepared)
        try:
            await send_encoded(
                channel,
                prepared.body,
                EncodedProperties(prepared.encoded_properties, prepared.message_id),
                exchange=out.exchange,
                routing_key=out.routing_key,
                timeout=self.settings.confirm_timeout,
            )
        except asyncio.TimeoutError:
            raise self.core.no_confirm(out.message_id, self.settings.confirm_timeout) from None
        except Exception as exc:
            raise self._failure(out, exc) from None
        return PublishResult.of(out)

    def _closed_failure(self, out: Outgoing, closed: BaseException) -> BaseException:
        """What the close of its channel means for a message written and unconfirmed."""
        failure = self._failure(out, closed)
        if not isinstance(failure, PublishError):  # closed by us: a CancelledError
            return self.core.unconfirmed(out.message_id, repr(closed))
        return failure

    def _failure(self, out: Outgoing, exc: BaseException) -> BaseException:
        """What a failed publish of ``out`` means, from what aiormq raised."""
        if isinstance(exc, aiormq.exceptions.PublishError):
            return self.core.returned(out, str(getattr(exc.frame, "reply_text", "NO_ROUTE")))
        if isinstance(exc, aiormq.exceptions.DeliveryError):
            if isinstance(exc.frame, Basic.Nack):
                return self.core.nacked(out)
            return PublishError(f"message {out.message_id} was not confirmed: {exc}")
        if isinstance(exc, aiormq.exceptions.ChannelNotFoundEntity):
            return self.core.no_exchange(out, str(exc.args[-1] if exc.args else exc))
        if isinstance(exc, _LOST):
            self._lost = exc
            return self.core.unconfirmed(out.message_id, exc)
        return exc


def _is_open(connection: AbstractConnection) -> bool:
    # aio-pika leaves is_closed False when the broker closes the connection
    return not connection.is_closed and connection.connected.is_set()
