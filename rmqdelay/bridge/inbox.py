"""Stage 1 of the x-delay bridge: the inbox into the tiers, on pika, in a thread of its
own (or a process: :func:`rmqdelay.bridge.app.carry_in_process`).

Each batch of deliveries (up to ``batch``, as many as have arrived) goes to the tiers
with the public :meth:`rmqdelay.Publisher.publish_many` on the same connection; the batch
is acked (one multiple ack) once every copy is confirmed and journaled. What cannot be
scheduled is parked with its reason (confirmed, then acked); what was not confirmed goes
back to the inbox (``basic.reject``, which counts toward its delivery limit).

pika, not aio-pika: its consumer costs less than half of aiormq's client CPU per
delivery (measured 22 against 54 µs), and stage 1 is where the bridge's throughput is
decided; pika reads header floats as ints, which :mod:`rmqdelay.amqp.pika_private` mends. The
worker's event loop runs stage 2; stage 1 tells it when its connection is lost
(``on_lost``), and the worker reconnects both.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Literal

import pika
import pika.exceptions
import pika.spec
from pika.adapters.blocking_connection import BlockingChannel

from ..amqp import pika_private
from ..amqp.blocking import close_connection
from ..amqp.connections import connect_blocking
from ..amqp.passive import queue_exists
from ..amqp.pika_confirms import LOST, pika_encoded
from ..amqp.publisher import Publisher
from ..core.clock import now_ms, now_us, us_of_ms
from ..core.handling.parking import parked_headers
from ..core.messages import amqp_properties
from ..core.wire import encode_properties
from ..errors import (
    BatchPublishError,
    DelayError,
    InvalidMessageError,
    RmqDelayError,
    WorkerError,
)
from ..settings import Settings
from .envelope import CONTENT_TYPE, PROPERTY_NAMES, Carried, Inbound, carry, read_delay
from .names import BridgeNames

__all__ = ["BATCH", "PREFETCH", "InboxCarrier"]

log = logging.getLogger("rmqdelay.bridge")

PREFETCH = 1000
"""Inbox messages a bridge process holds unacked at most."""
BATCH = 500
"""Messages per ``publish_many`` at most: one batch's confirms and journal write."""
LINGER_US = 20_000
"""How long the first message of a batch waits for others at most (see
``InboxCarrier._wait``)."""
MARGIN_US = 5_000
"""A message whose delay is shorter than the linger waits for others until this long
before it is due, at the latest."""
IDLE_S = 0.1
"""How long a wait with nothing in hand lasts at most, unless a message comes: how soon
a stop is seen."""
PAUSE_S = 1.0
"""The pause after a batch the tiers refused, so a broken broker is not spun on."""
_VALIDATION = (InvalidMessageError, DelayError)
"""What publish_many raises before sending anything, for one request that cannot go."""

Delivery = tuple[pika.spec.Basic.Deliver, pika.spec.BasicProperties, bytes, int, Inbound]
"""A delivery, when it arrived (µs: its delay counts from there) and its ``x-delay`` read."""
Counter = Callable[[str, int], None]
Settle = Literal["ack", "requeue", "settled"]
"""How one inbox message is settled: ack it, give it back, or nothing (done already)."""


def _properties(props: pika.spec.BasicProperties) -> dict[str, Any]:
    """A delivery's properties under :data:`PROPERTY_NAMES`, and its headers."""
    found = {name: getattr(props, name, None) for name in PROPERTY_NAMES}
    found["headers"] = props.headers
    return found


class InboxCarrier:
    """Consume the inbox and carry it into the tiers until :meth:`stop` (see the module).

    ``run`` opens the connection and checks the inbox (raising what stops the worker);
    ``carry_forever`` is the thread's body; ``count(outcome, n)`` is told of every
    message settled (``scheduled``, ``parked``, ``requeued``).
    """

    def __init__(
        self,
        settings: Settings,
        names: BridgeNames,
        *,
        prefetch: int = PREFETCH,
        batch: int = BATCH,
        count: Counter = lambda _outcome, _n: None,
        last: list[str] | None = None,
    ) -> None:
        self.settings = settings
        self.names = names
        self.prefetch = prefetch
        self.batch = max(1, min(batch, prefetch))
        self.count = count
        self._last = last or []
        self.idle_s = IDLE_S
        self._stop = threading.Event()
        self._pending: list[Delivery] = []
        self._go_us: int | None = None
        """When the batch in hand goes (µs): see :meth:`_wait`."""
        self._connection: pika.BlockingConnection | None = None
        self._channel: Any = None
        """The consumer: the BlockingChannel, or the pika channel under it (fast path)."""
        self._fast = False
        self._park: BlockingChannel | None = None
        self._publisher: Publisher | None = None

    # ------------------------------------------------------------------ lifecycle

    def open(self) -> None:
        """Connect, check the inbox, start consuming; raise what the worker reports."""
        connection = connect_blocking(self.settings, "bridge", last=self._last)
        self._connection = connection
        try:
            self._start(connection)
        except BaseException:
            close_connection(connection, self.settings.confirm_timeout)
            raise

    def _start(self, connection: pika.BlockingConnection) -> None:
        timeout = self.settings.confirm_timeout
        if not queue_exists(connection, self.names.inbox, timeout):
            raise WorkerError(
                f"the bridge's inbox queue {self.names.inbox!r} does not exist: "
                f"run `{self.names.declare_command}`"
            )
        self._publisher = Publisher(self.settings, connection=connection).connect()
        self._park = connection.channel()
        self._park.confirm_delivery()
        if pika_private.usable(connection):
            # the channel under the BlockingChannel: a delivery is taken as its frames
            # arrive, also while the publisher waits for confirms, so its time is right
            impl = pika_private.open_channel(connection, timeout)
            ready: list[object] = []
            impl.basic_qos(prefetch_count=self.prefetch, callback=ready.append)
            impl.basic_consume(self.names.inbox, self._on_delivery, callback=ready.append)
            pika_private.wait_until(connection, lambda: len(ready) == 2, timeout, "consuming")
            self._channel = impl
            self._fast = True
        else:
            channel = connection.channel()
            channel.basic_qos(prefetch_count=self.prefetch)
            channel.basic_consume(self.names.inbox, self._on_delivery)
            self._channel = channel

    def stop(self) -> None:
        """Finish the batch in hand, then stop; what was taken and not acked goes back."""
        self._stop.set()

    def carry_forever(self, on_lost: Callable[[BaseException | None], None]) -> None:
        """The thread's body: batches until :meth:`stop`, then close. A connection lost
        (or any error) ends it and calls ``on_lost`` with why."""
        connection = self._connection
        assert connection is not None, "open() first"
        pika_private.mend_headers_in_this_thread()  # deliveries are decoded in this thread
        try:
            while not self._stop.is_set():
                self._wait(connection)
                if self._pending:
                    batch, self._pending = (
                        self._pending[: self.batch],
                        self._pending[self.batch :],
                    )
                    # what is left has waited for this batch: it goes next, at once
                    self._go_us = 0 if self._pending else None
                    self._carry(batch)
        except BaseException as exc:
            if not isinstance(exc, (*LOST, RmqDelayError)):
                log.exception("bridge: internal error in the inbox; reconnecting")
            on_lost(exc)
        finally:
            close_connection(connection, self.settings.confirm_timeout)

    def _wait(self, connection: pika.BlockingConnection) -> None:
        """Take what has arrived, up to a batch; with nothing in hand, wait up to
        ``idle_s`` for the first message; then, for the others of its batch, until
        ``LINGER_US`` after it arrived, or ``MARGIN_US`` before a message in hand with a
        shorter delay is due (an ``x-delay`` of 0 goes at once).

        The linger costs a message no lateness (its delay counts from its arrival, and
        the tiers round what is left up to the resolution), and saves stage 1 and the
        broker a confirm round, a journal write and an ack per batch: at 500 msgs/s, 20 ms
        against 5 took the bridge's CPU per message from 1,531 µs to 1,369 and the
        broker's from 3,910 to 3,292 (``python -m bench.bridge --only lateness
        --lateness-bridges 1 --variant-root`` a tree at 5 ms, side by side).
        """
        go = self._go_us
        if not self._pending or go is None:
            limit, wanted = self.idle_s, 1
        else:
            limit = (go - now_us()) / 1e6
            wanted = self.batch
            if limit <= 0 or len(self._pending) >= self.batch:
                limit = 0
        if not self._fast:  # pika returns once a delivery is dispatched, or at the limit
            connection.process_data_events(time_limit=limit)
            return

        def done() -> bool:  # or a message came that cannot wait as long: the caller waits again
            return (
                len(self._pending) >= wanted
                or self._stop.is_set()
                or (self._go_us is not None and self._go_us != go)
            )

        with contextlib.suppress(TimeoutError):
            pika_private.wait_until(connection, done, limit, "inbox deliveries")

    # ------------------------------------------------------------------ stage 1

    def _on_delivery(
        self,
        _channel: Any,
        method: pika.spec.Basic.Deliver,
        props: pika.spec.BasicProperties,
        body: bytes,
    ) -> None:
        received = now_us()
        inbound = read_delay(props.headers, self.settings.layout.max_delay_ms, received)
        self._pending.append((method, props, body, received, inbound))
        delay_ms = inbound.delay_ms
        linger = LINGER_US if delay_ms is None else min(LINGER_US, us_of_ms(delay_ms) - MARGIN_US)
        go = received + max(0, linger)
        if self._go_us is None or go < self._go_us:
            self._go_us = go

    def _carry(self, batch: list[Delivery]) -> None:
        """Schedule or park every message of ``batch``, then settle each."""
        destination = self.names.destination
        max_delay_ms = self.settings.layout.max_delay_ms
        items = [
            carry(
                destination,
                max_delay_ms,
                method.exchange or "",
                method.routing_key or "",
                _properties(props),
                body,
                received_us=received,
                inbound=inbound,
            )
            for method, props, body, received, inbound in batch
        ]
        done: list[Settle] = ["requeue"] * len(items)
        scheduled = [i for i, c in enumerate(items) if c.request is not None]
        parks = [(i, c.reason) for i, c in enumerate(items) if c.request is None]
        if scheduled:
            for i in self._schedule(items, scheduled, parks):
                done[i] = "ack"
        counted = done.count("ack")
        for i, reason in parks:
            done[i] = self._park_one(batch[i], items[i], reason)
        self._settle(batch, done)
        self.count("scheduled", counted)

    def _schedule(
        self, items: list[Carried], indices: list[int], parks: list[tuple[int, str]]
    ) -> list[int]:
        """The indices confirmed in the tiers and journaled; one that cannot be sent at
        all joins ``parks``."""
        publisher = self._publisher
        assert publisher is not None
        requests = [items[i].request for i in indices]
        try:
            publisher.publish_many(r for r in requests if r is not None)
        except BatchPublishError as exc:  # some were not confirmed: they go back
            failed = set(exc.failures)
            log.warning(
                "bridge: %d of %d message(s) not confirmed in the tiers (first: %s); "
                "giving them back to the inbox",
                len(failed),
                len(indices),
                next(iter(exc.failures.values())),
            )
            time.sleep(PAUSE_S)
            return [i for i in indices if items[i].message_id not in failed]
        except _VALIDATION:  # one (or more) cannot be sent as it is: find which, park it
            return self._one_by_one(items, indices, parks)
        return indices

    def _one_by_one(
        self, items: list[Carried], indices: list[int], parks: list[tuple[int, str]]
    ) -> list[int]:
        publisher = self._publisher
        assert publisher is not None
        done = []
        for i in indices:
            request = items[i].request
            assert request is not None
            try:
                publisher.publish_many([request])
            except _VALIDATION as exc:
                parks.append((i, f"cannot be scheduled: {exc}"))
            except BatchPublishError as exc:
                log.warning("bridge: message %s not scheduled (%s)", items[i].message_id, exc)
            else:
                done.append(i)
        return done

    def _park_one(self, delivery: Delivery, item: Carried, reason: str) -> Settle:
        """Publish a parked copy, confirmed, its body the envelope and the original's (so
        ``parked replay`` sends it through stage 2): ``ack`` once it is. One that cannot
        be wrapped (a value AMQP cannot carry) is dead-lettered whole by the inbox, whose
        dead-letter exchange is parking: ``settled`` then."""
        method = delivery[0]
        channel = self._park
        assert channel is not None and self._channel is not None
        names = self.names
        if item.body is None:
            log.warning(
                "bridge: message %s dead-lettered whole to parking: %s", item.message_id, reason
            )
            self._channel.basic_reject(int(method.delivery_tag or 0), requeue=False)
            self.count("parked", 1)
            return "settled"
        headers = parked_headers(
            None,
            reason=reason,
            destination=names.destination,
            attempts=1,
            parked_at_ms=now_ms(),
        )
        properties = amqp_properties(item.message_id, headers, {"content_type": CONTENT_TYPE})
        try:
            channel.basic_publish(
                self.settings.layout.parking,
                "",
                item.body,
                pika_encoded(encode_properties(properties), item.message_id),
                mandatory=True,
            )
        except (pika.exceptions.UnroutableError, pika.exceptions.NackError) as exc:
            log.error("bridge: could not park message %s (%s)", item.message_id, exc)
            time.sleep(PAUSE_S)
            return "requeue"
        log.warning(
            "bridge: parked message %s from %r: %s",
            item.message_id,
            names.exchange,
            reason,
            extra={"message_id": item.message_id, "outcome": "parked"},
        )
        self.count("parked", 1)
        return "ack"

    def _settle(self, batch: list[Delivery], done: list[Settle]) -> None:
        """Ack what is done (one multiple ack when all is), give back the rest."""
        channel = self._channel
        assert channel is not None
        if all(d == "ack" for d in done):
            channel.basic_ack(int(batch[-1][0].delivery_tag or 0), multiple=True)
            return
        requeued = 0
        for (method, *_rest), what in zip(batch, done, strict=True):
            if what == "ack":
                channel.basic_ack(int(method.delivery_tag or 0))
            elif what == "requeue":
                channel.basic_reject(int(method.delivery_tag or 0), requeue=True)
                requeued += 1
        if requeued:
            self.count("requeued", requeued)
