"""The synchronous publisher, on pika. Thin: its operations are declared in
:mod:`..core.publishing.api`, its checks and flows live in :mod:`..core.publishing`.

pika's BlockingChannel waits one round trip per confirmed publish. To pipeline,
this publisher tracks delivery tags itself (:mod:`.pika_confirms`): it sends a window
of messages, then pumps the connection until their confirms arrive, every wait with a
deadline; on pika's public API (``RMQDELAY_CLIENT_FAST=0``, :mod:`.pika_private`) it
waits for each confirm in turn. A dropped connection it opened is reopened by the next
publish.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import TypeVar

import pika
from typing_extensions import Self

from ..core.journal.steps import Append, Read
from ..core.publishing.api import AbstractPublisher
from ..core.publishing.outgoing import Outcome, Prepared
from ..core.steps import CheckExchange, Checkpoint, CheckQueue, Failover, Flow, Step, run_flow
from ..errors import AccessRefusedError, ConnectionFailedError, PublisherClosedError
from .blocking import close_connection, poll_once
from .checkpoints import checkpoint_aside
from .connections import connect_blocking
from .journal import append_records
from .passive import exchange_exists, queue_exists
from .pika_confirms import LOST, ConfirmChannel, open_confirm_channel, pika_properties
from .publishing import FAILOVER_CLOSE_S, PublisherSurface
from .streams import BlockingStream, Readers

__all__ = ["Publisher", "pika_properties"]

T = TypeVar("T")


class Publisher(PublisherSurface[pika.BlockingConnection], AbstractPublisher):
    """Publish delayed messages with confirms, from synchronous code.

    ``with Publisher(settings) as publisher: publisher.publish("orders", body, delay="15m")``
    """

    _channel: ConfirmChannel | None = None
    _followers: dict[str, BlockingStream] | None = None
    _checkpointing: threading.Thread | None = None

    def connect(self) -> Self:
        self._started = True
        self._confirm_channel()
        return self

    def close(self) -> None:
        self._started = False
        checkpointing, self._checkpointing = self._checkpointing, None
        if checkpointing is not None:
            checkpointing.join()  # a short-lived process would leave it cut off
        channel, self._channel = self._channel, None
        followers, self._followers = self._followers or {}, None
        for follower in followers.values():
            follower.close()
        if self._connection is None:
            return
        if self._owns_connection:
            close_connection(self._connection, self.settings.confirm_timeout)
            self._connection = None
        elif channel is not None:
            channel.close()

    # ------------------------------------------------------------------ connection

    def _open_connection(self) -> pika.BlockingConnection:
        self._connection = connection = connect_blocking(self.settings, "pub", last=self._try_last)
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
            except LOST as exc:
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

    def _confirm_channel(self) -> ConfirmChannel:
        connection = self._live_connection()
        if self._channel is not None and self._channel.is_open:
            return self._channel
        try:
            self._channel = open_confirm_channel(
                connection, self.core, self.settings.confirm_timeout, self._window
            )
        except LOST as exc:
            self._lost = exc
            raise PublisherClosedError(f"cannot open a channel: {exc!r}") from None
        return self._channel

    # ------------------------------------------------------------------ steps

    def _run(self, flow: Flow[T]) -> T:
        # a call's one-off reads on one reader connection of their own, closed after it:
        # see rmqdelay.amqp.streams
        readers = Readers(
            lambda: connect_blocking(self.settings, "journal", last=self._try_last),
            self._live_connection,
        )
        try:
            return run_flow(flow, lambda step: self._do(step, readers))
        finally:
            readers.close()

    def _do(self, step: Step, readers: Readers) -> object:
        if isinstance(step, Checkpoint):
            self._checkpoint_aside(step)
            return None
        if isinstance(step, CheckQueue):
            return self._queue_exists(step.queue)
        if isinstance(step, CheckExchange):
            return self._exchange_exists(step.exchange)
        if isinstance(step, Failover):
            return self._failover(step.reason)
        if isinstance(step, Append):
            return append_records(self._live_connection(), step)
        if isinstance(step, Read):
            if step.keep is None:
                return readers.read(step)
            return self._kept(step.keep).read(step)
        return self._send(step.batch)

    def _checkpoint_aside(self, step: Checkpoint) -> None:
        """Write a checkpoint in a thread of its own (one at a time); :meth:`close`
        waits for it."""
        running = self._checkpointing
        if running is not None and running.is_alive():
            return
        thread = threading.Thread(
            target=checkpoint_aside, args=(self.settings, step), name="rmqdelay-checkpoint"
        )
        thread.daemon = True
        self._checkpointing = thread
        thread.start()

    def _kept(self, name: str) -> BlockingStream:
        """The consumer a keyed publish (or a reschedule) keeps between calls."""
        if self._followers is None:
            self._followers = {}
        follower = self._followers.get(name)
        if follower is None:
            if self._owns_connection:
                follower = BlockingStream(self._live_connection, shared=True)
            else:  # a connection given: the follower's channel must not close it
                follower = BlockingStream(
                    lambda: connect_blocking(self.settings, "keys", last=self._try_last)
                )
            self._followers[name] = follower
        return follower

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
        for follower in (self._followers or {}).values():
            follower.let_go()  # its consumer opens again on the new connection
        close_connection(old, min(FAILOVER_CLOSE_S, self.settings.confirm_timeout))
        return True

    def _queue_exists(self, queue: str) -> bool:
        connection = self._live_connection()
        try:
            return queue_exists(connection, queue, self.settings.confirm_timeout)
        except LOST as exc:
            self._lost = exc
            raise PublisherClosedError(f"the passive check of {queue!r} failed: {exc!r}") from None

    def _exchange_exists(self, exchange: str) -> bool:
        connection = self._live_connection()
        try:
            return exchange_exists(connection, exchange, self.settings.confirm_timeout)
        except AccessRefusedError:
            return False  # a held marker unseen: full routes, on time for any consumer
        except LOST as exc:
            self._lost = exc
            raise PublisherClosedError(
                f"the passive check of {exchange!r} failed: {exc!r}"
            ) from None

    def _send(self, batch: Sequence[Prepared]) -> list[Outcome]:
        channel = self._confirm_channel()
        try:
            return channel.send(batch)
        finally:
            if channel.lost is not None:
                self._lost, self._channel = channel.lost, None
