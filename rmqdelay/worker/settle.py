"""Settling a delivery, at least once: ack, requeue, retry or park.

A message is acked only after its handler returned, or after its retry or parked copy
was confirmed by the broker. Anything else leaves it unacked, and the broker gives it
back when the channel closes. The decision itself is :func:`rmqdelay.core.retry.decide`.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, cast

import aio_pika
import aiormq
from aio_pika.abc import AbstractExchange, AbstractIncomingMessage

from ..amqp.aio_publisher import AsyncPublisher, EncodedProperties, send_encoded
from ..core.handlers import HandlerSpec
from ..core.messages import ATTEMPT, DUE_AT, amqp_properties, carried_properties
from ..core.parking import header_int, parked_headers, short_traceback
from ..core.retry import Decision, DecodeError, HandlerSignal
from ..core.wire import encode_properties
from ..errors import PublisherClosedError, RmqDelayError
from .metrics import HANDLED

__all__ = ["SETTLE_ERRORS", "Failure", "Received", "Settler", "read_delivery"]

log = logging.getLogger("rmqdelay.worker")
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


@dataclass
class Received:
    """What the worker reads off a delivery before calling the handler."""

    message_id: str
    attempt: int
    due_at: datetime | None
    lateness: timedelta | None
    headers: dict[str, Any]

    @property
    def fields(self) -> dict[str, Any]:
        lateness = None if self.lateness is None else round(self.lateness.total_seconds() * 1000)
        return {"message_id": self.message_id, "attempt": self.attempt, "lateness_ms": lateness}


def read_delivery(message: AbstractIncomingMessage) -> Received:
    headers = dict(message.headers or {})
    due_ms = header_int(headers, DUE_AT, -1)
    due_at = lateness = None
    if due_ms >= 0:
        due_at = datetime.fromtimestamp(due_ms / 1000, tz=timezone.utc)
        lateness = timedelta(milliseconds=time.time() * 1000 - due_ms)
    return Received(
        # A message without an id gets one here, which its retries then keep.
        message_id=message.message_id or str(uuid.uuid4()),
        attempt=max(1, header_int(headers, ATTEMPT, 1)),
        due_at=due_at,
        lateness=lateness,
        headers=headers,
    )


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
    """One delivery being settled, and the fields its log lines carry."""

    spec: HandlerSpec
    message: AbstractIncomingMessage
    received: Received
    fields: dict[str, Any]


class Settler:
    """Carries out one decision for one delivery, on one connection's channels."""

    def __init__(
        self, publisher: AsyncPublisher, park_exchange: AbstractExchange, confirm_timeout: float
    ) -> None:
        self.publisher = publisher
        self.park_exchange = park_exchange
        self.confirm_timeout = confirm_timeout

    async def settle(
        self,
        spec: HandlerSpec,
        message: AbstractIncomingMessage,
        received: Received,
        decision: Decision,
        failure: Failure | None,
        fields: dict[str, Any],
    ) -> None:
        destination = spec.destination
        job = _Job(spec, message, received, fields)
        try:
            if decision.action == "ack":
                await message.ack()
                log.info("handled", extra={**fields, "outcome": "acked"})
                HANDLED.labels(destination, "acked").inc()
            elif decision.action == "requeue":
                await message.reject(requeue=True)
                log.info("requeued", extra={**fields, "outcome": "requeued"})
                HANDLED.labels(destination, "requeued").inc()
            elif decision.action == "retry":
                try:
                    await self._republish(job, decision)
                except PublisherClosedError as exc:
                    log.warning("the retry was not confirmed (%s); requeueing", exc, extra=fields)
                    await message.reject(requeue=True)
                    return
                except RmqDelayError as exc:  # unroutable, nacked, or a delay over max_delay
                    reason = f"{decision.reason}; the retry could not be published: {exc}"
                    decision = Decision("park", received.attempt, reason=reason)
                else:
                    await message.ack()
                    log.warning(
                        "retrying",
                        extra={
                            **fields,
                            "outcome": "retried",
                            "delay_ms": decision.delay_ms,
                            "reason": decision.reason,
                        },
                    )
                    HANDLED.labels(destination, "retried").inc()
                    return
            if decision.action == "park":
                await self._park(job, decision, failure)
        except SETTLE_ERRORS as exc:
            log.warning(
                "could not settle the message (%s): the broker redelivers it",
                type(exc).__name__,
                extra=fields,
            )

    async def _republish(self, job: _Job, decision: Decision) -> None:
        """Send the message round the delay tiers again, as the next attempt."""
        spec, message, received = job.spec, job.message, job.received
        # prepare() strips x-death and friends: the dead-letter cycle trap lives there
        headers = {**received.headers, ATTEMPT: decision.attempt}
        headers.pop("x-delivery-count", None)  # the broker's, for the old delivery
        # publish(), not send(): the retry is recorded in the schedule journal too, so
        # `scheduled list` shows it and a cancel during the wait finds it
        await self.publisher.publish(
            spec.destination,
            message.body,
            delay=timedelta(milliseconds=decision.delay_ms),
            headers=headers,
            message_id=received.message_id,
            **carried_properties(message),
        )

    async def _park(self, job: _Job, decision: Decision, failure: Failure | None) -> None:
        """Publish a copy to the parking queue, confirmed, then ack the original."""
        spec, message, received = job.spec, job.message, job.received
        headers = parked_headers(
            received.headers,
            reason=decision.reason,
            destination=spec.destination,
            attempts=received.attempt,
            parked_at_ms=time.time_ns() // 1_000_000,
            error=failure.error if failure is not None else None,
            trace=failure.trace if failure is not None else None,
        )
        extra = {**job.fields, "outcome": "parked", "reason": decision.reason}
        exchange = cast(aio_pika.Exchange, self.park_exchange)
        try:
            # the properties every message carries, and the original timestamp
            properties = amqp_properties(
                received.message_id,
                headers,
                carried_properties(message),
                timestamp=message.timestamp,
            )
            await send_encoded(
                exchange.channel,
                message.body,
                EncodedProperties(encode_properties(properties), received.message_id),
                exchange=exchange.name,
                routing_key="",
                timeout=self.confirm_timeout,
            )
        except _PARK_ERRORS as exc:
            log.error(
                "could not park the message (%s); it goes back to the queue",
                exc,
                extra=extra,
            )
            await asyncio.sleep(1)  # do not spin on a broken parking queue
            await message.reject(requeue=True)
            return
        await message.ack()
        if failure is not None and not isinstance(failure.error, HandlerSignal):
            extra["traceback"] = failure.trace
        log.error("parked", extra=extra)
        HANDLED.labels(spec.destination, "parked").inc()
