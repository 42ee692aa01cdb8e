"""Settling a delivery, at least once: ack, requeue, retry or park.

A message is acked only after its handler returned, or after its retry or parked copy
was confirmed by the broker (the acks go in batches: :mod:`.acks`). Anything else leaves
it unacked, and the broker gives it back when the channel closes. The decision itself is
:func:`rmqdelay.core.handling.retry.decide`; what was done is returned as
:class:`~rmqdelay.worker.hooks.Settled` for the hooks.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import cast

import aio_pika
import aiormq
from aio_pika.abc import AbstractExchange, AbstractIncomingMessage

from ..amqp.aio_publisher import AsyncPublisher
from ..amqp.aio_sending import EncodedProperties, send_encoded
from ..core.clock import datetime_of_ms, now_ms, timedelta_of_ms
from ..core.handling.handlers import HandlerSpec
from ..core.handling.parking import parked_headers, short_traceback
from ..core.handling.retry import Decision, DecodeError, HandlerSignal
from ..core.messages import ATTEMPT, amqp_properties, carried_properties
from ..core.wire import encode_properties
from ..errors import PublisherClosedError, RmqDelayError
from .acks import Acker
from .delivery import Delivery
from .hooks import Outcome, Settled

__all__ = ["SETTLE_ERRORS", "Failure", "Settler"]

SETTLE_ERRORS = (
    aiormq.exceptions.AMQPError,
    aio_pika.exceptions.MessageProcessError,
    ConnectionError,
    asyncio.TimeoutError,
    RuntimeError,
)
"""What an ack, reject or nack can raise when the connection went away."""
_PARK_ERRORS = (aiormq.exceptions.PublishError, aiormq.exceptions.DeliveryError, RmqDelayError)
"""A parked copy returned, nacked, or not encodable: the original goes back to its queue."""
_REQUEUE_PAUSE_S = 1.0


class Failure(Exception):
    """A handler's exception with its traceback text, taken where the frames still are.

    An exception raised in a thread comes out of ``run_in_executor`` without the
    handler's frames, so sync handlers format theirs in the thread.
    """

    def __init__(self, error: BaseException, trace: str | None) -> None:
        super().__init__(error)
        self.error, self.trace = error, trace

    @classmethod
    def of(cls, error: BaseException) -> Failure:
        # A body that did not decode has no handler frames worth showing.
        return cls(error, None if isinstance(error, DecodeError) else short_traceback(error))


@dataclass
class _Job:
    """One delivery being settled, and what its :class:`Settled` carries whatever it ends as."""

    spec: HandlerSpec
    message: AbstractIncomingMessage
    delivery: Delivery
    failure: Failure | None
    seconds: float | None

    def settled(
        self,
        outcome: Outcome,
        reason: str = "",
        *,
        delay_ms: int | None = None,
        traceback: str | None = None,
        problem: str | None = None,
    ) -> Settled:
        error = self.failure.error if self.failure is not None else None
        return Settled(outcome, reason, delay_ms, error, traceback, self.seconds, problem)


class Settler:
    """Carries out one decision for one delivery, on one connection's channels."""

    def __init__(
        self,
        publisher: AsyncPublisher,
        park_exchange: AbstractExchange,
        confirm_timeout: float,
        acks: Acker,
    ) -> None:
        self.publisher = publisher
        self.park_exchange = park_exchange
        self.confirm_timeout = confirm_timeout
        self.acks = acks
        """Every ack, reject and nack of the session's deliveries goes through it."""
        self.closing = False
        """The session is ending: its publisher closes, so what a copy's publish raises
        now says nothing of the message (never park it for that: the broker redelivers)."""

    async def skip(self, message: AbstractIncomingMessage) -> Settled:
        """Ack a delivery a hook skipped, without handling it."""
        try:
            await self.acks.ack(message)
        except SETTLE_ERRORS as exc:
            return Settled("returned", problem=_unsettled(exc))
        return Settled("cancelled")

    async def drop(self, message: AbstractIncomingMessage, reason: str) -> Settled:
        """Ack a delivery an admission dropped, without handling it."""
        try:
            await self.acks.ack(message)
        except SETTLE_ERRORS as exc:
            return Settled("returned", reason, problem=_unsettled(exc))
        return Settled("dropped", reason)

    async def requeue(self, message: AbstractIncomingMessage, reason: str) -> Settled:
        """Give a delivery an admission could not decide back to its queue, after a
        pause: what stopped it (the journal) is not over in a millisecond."""
        await asyncio.sleep(_REQUEUE_PAUSE_S)
        try:
            await self.acks.reject(message, requeue=True)
        except SETTLE_ERRORS as exc:
            return Settled("returned", reason, problem=_unsettled(exc))
        return Settled("requeued", reason)

    async def forward(
        self,
        spec: HandlerSpec,
        message: AbstractIncomingMessage,
        delivery: Delivery,
        due_ms: int,
        reason: str,
    ) -> Settled:
        """Publish the message again due at ``due_ms`` (the same id, body, headers and
        attempt, recorded in the journal as a retry is), confirmed, then ack this copy.

        Not confirmed: this copy goes back to its queue (at least once). Refused for
        good (the destination's queue is gone, the time past ``max_delay``): parked.
        """
        job = _Job(spec, message, delivery, None, None)
        try:
            try:
                await self._publish_copy(job, delivery.attempt, at_ms=due_ms)
            except RmqDelayError as exc:
                if self.closing or isinstance(exc, PublisherClosedError):
                    return await self._unconfirmed(job, reason, "forwarded copy", exc)
                why = f"{reason}; the forwarded copy could not be published: {exc}"
                return await self._park(job, Decision("park", delivery.attempt, reason=why))
            await self.acks.ack(message)
            return job.settled("forwarded", reason, delay_ms=max(0, due_ms - now_ms()))
        except SETTLE_ERRORS as exc:
            return job.settled("returned", reason, problem=_unsettled(exc))

    async def settle(
        self,
        spec: HandlerSpec,
        message: AbstractIncomingMessage,
        delivery: Delivery,
        decision: Decision,
        failure: Failure | None,
        seconds: float | None,
    ) -> Settled:
        job = _Job(spec, message, delivery, failure, seconds)
        try:
            if decision.action == "ack":
                await self.acks.ack(message)
                return job.settled("acked")
            if decision.action == "requeue":
                await self.acks.reject(message, requeue=True)
                return job.settled("requeued", decision.reason)
            if decision.action == "retry":
                try:
                    await self._republish(job, decision)
                except RmqDelayError as exc:  # unroutable, nacked, or a delay over max_delay
                    if self.closing or isinstance(exc, PublisherClosedError):
                        return await self._unconfirmed(job, decision.reason, "retry", exc)
                    reason = f"{decision.reason}; the retry could not be published: {exc}"
                    decision = Decision("park", delivery.attempt, reason=reason)
                else:
                    await self.acks.ack(message)
                    return job.settled("retried", decision.reason, delay_ms=decision.delay_ms)
            return await self._park(job, decision)
        except SETTLE_ERRORS as exc:
            return job.settled("returned", decision.reason, problem=_unsettled(exc))

    async def _unconfirmed(self, job: _Job, reason: str, what: str, exc: Exception) -> Settled:
        """A copy not confirmed: this delivery back to its queue (at least once); left
        to the connection's close when the session ends (a requeue would come straight
        back to it)."""
        if not self.closing:
            await self.acks.reject(job.message, requeue=True)
        return job.settled("returned", reason, problem=f"the {what} was not confirmed ({exc})")

    async def _republish(self, job: _Job, decision: Decision) -> None:
        """Send the message round the delay tiers again, as the next attempt."""
        await self._publish_copy(job, decision.attempt, delay_ms=decision.delay_ms)

    async def _publish_copy(
        self, job: _Job, attempt: int, *, delay_ms: int | None = None, at_ms: int | None = None
    ) -> None:
        """A copy of the message due later: a retry's, or a forward's."""
        delivery, message = job.delivery, job.message
        # prepare() strips x-death and friends: the dead-letter cycle trap lives there
        headers = {**delivery.headers, ATTEMPT: attempt}
        headers.pop("x-delivery-count", None)  # the broker's, for the old delivery
        # publish(), not send(): the copy is recorded in the schedule journal too, so
        # `scheduled list` shows it and a cancel during the wait finds it
        await self.publisher.publish(
            job.spec.destination,
            message.body,
            delay=None if delay_ms is None else timedelta_of_ms(delay_ms),
            at=None if at_ms is None else datetime_of_ms(at_ms),
            headers=headers,
            message_id=delivery.message_id,
            **carried_properties(message),
        )

    async def _park(self, job: _Job, decision: Decision) -> Settled:
        """Publish a copy to the parking queue, confirmed, then ack the original."""
        delivery, message, failure = job.delivery, job.message, job.failure
        headers = parked_headers(
            delivery.headers,
            reason=decision.reason,
            destination=job.spec.destination,
            attempts=delivery.attempt,
            parked_at_ms=now_ms(),
            error=failure.error if failure is not None else None,
            trace=failure.trace if failure is not None else None,
        )
        exchange = cast(aio_pika.Exchange, self.park_exchange)
        try:
            # the properties every message carries, and the original timestamp
            properties = amqp_properties(
                delivery.message_id,
                headers,
                carried_properties(message),
                timestamp=message.timestamp,
            )
            await send_encoded(
                exchange.channel,
                message.body,
                EncodedProperties(encode_properties(properties), delivery.message_id),
                exchange=exchange.name,
                routing_key="",
                timeout=self.confirm_timeout,
            )
        except _PARK_ERRORS as exc:
            await asyncio.sleep(1)  # do not spin on a broken parking queue
            await self.acks.reject(message, requeue=True)
            problem = f"could not park the message ({exc})"
            return job.settled("returned", decision.reason, problem=problem)
        await self.acks.ack(message)
        shown = failure is not None and not isinstance(failure.error, HandlerSignal)
        trace = failure.trace if shown and failure is not None else None
        return job.settled("parked", decision.reason, traceback=trace)


def _unsettled(exc: BaseException) -> str:
    """An ack, reject or publish the connection's loss cut off: the broker redelivers."""
    return f"could not settle the message ({type(exc).__name__})"
