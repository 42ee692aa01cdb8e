"""Settling a delivery, at least once: ack, requeue, retry or park.

A message is acked only after its handler returned, or after its retry or parked copy
was confirmed by the broker. Anything else leaves it unacked, and the broker gives it
back when the channel closes. The decision itself is :func:`rmqdelay.core.retry.decide`;
what was done is returned as :class:`~rmqdelay.worker.hooks.Settled` for the hooks.
"""

from __future__ import annotations

import asyncio
from typing import cast

import aio_pika
import aiormq
from aio_pika.abc import AbstractExchange, AbstractIncomingMessage

from ..amqp.aio_publisher import AsyncPublisher, EncodedProperties, send_encoded
from ..core.clock import now_ms, timedelta_of_ms
from ..core.handlers import HandlerSpec
from ..core.messages import ATTEMPT, amqp_properties, carried_properties
from ..core.parking import parked_headers, short_traceback
from ..core.retry import Decision, DecodeError, HandlerSignal
from ..core.wire import encode_properties
from ..errors import PublisherClosedError, RmqDelayError
from .delivery import Delivery
from .hooks import Settled

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


class Settler:
    """Carries out one decision for one delivery, on one connection's channels."""

    def __init__(
        self, publisher: AsyncPublisher, park_exchange: AbstractExchange, confirm_timeout: float
    ) -> None:
        self.publisher = publisher
        self.park_exchange = park_exchange
        self.confirm_timeout = confirm_timeout

    async def skip(self, message: AbstractIncomingMessage) -> Settled:
        """Ack a delivery a hook skipped, without handling it."""
        try:
            await message.ack()
        except SETTLE_ERRORS as exc:
            return _unsettled(exc)
        return Settled("cancelled")

    async def settle(
        self,
        spec: HandlerSpec,
        message: AbstractIncomingMessage,
        delivery: Delivery,
        decision: Decision,
        failure: Failure | None,
        seconds: float,
    ) -> Settled:
        error = failure.error if failure is not None else None
        try:
            if decision.action == "ack":
                await message.ack()
                return Settled("acked", seconds=seconds)
            if decision.action == "requeue":
                await message.reject(requeue=True)
                return Settled("requeued", decision.reason, error=error, seconds=seconds)
            if decision.action == "retry":
                try:
                    await self._republish(spec, message, delivery, decision)
                except PublisherClosedError as exc:
                    await message.reject(requeue=True)
                    problem = f"the retry was not confirmed ({exc})"
                    return Settled(
                        "returned", decision.reason, error=error, seconds=seconds, problem=problem
                    )
                except RmqDelayError as exc:  # unroutable, nacked, or a delay over max_delay
                    reason = f"{decision.reason}; the retry could not be published: {exc}"
                    decision = Decision("park", delivery.attempt, reason=reason)
                else:
                    await message.ack()
                    return Settled(
                        "retried",
                        decision.reason,
                        delay_ms=decision.delay_ms,
                        error=error,
                        seconds=seconds,
                    )
            return await self._park(spec, message, delivery, decision, failure, seconds)
        except SETTLE_ERRORS as exc:
            return _unsettled(exc, decision.reason, error, seconds)

    async def _republish(
        self,
        spec: HandlerSpec,
        message: AbstractIncomingMessage,
        delivery: Delivery,
        decision: Decision,
    ) -> None:
        """Send the message round the delay tiers again, as the next attempt."""
        # prepare() strips x-death and friends: the dead-letter cycle trap lives there
        headers = {**delivery.headers, ATTEMPT: decision.attempt}
        headers.pop("x-delivery-count", None)  # the broker's, for the old delivery
        # publish(), not send(): the retry is recorded in the schedule journal too, so
        # `scheduled list` shows it and a cancel during the wait finds it
        await self.publisher.publish(
            spec.destination,
            message.body,
            delay=timedelta_of_ms(decision.delay_ms),
            headers=headers,
            message_id=delivery.message_id,
            **carried_properties(message),
        )

    async def _park(
        self,
        spec: HandlerSpec,
        message: AbstractIncomingMessage,
        delivery: Delivery,
        decision: Decision,
        failure: Failure | None,
        seconds: float,
    ) -> Settled:
        """Publish a copy to the parking queue, confirmed, then ack the original."""
        error = failure.error if failure is not None else None
        headers = parked_headers(
            delivery.headers,
            reason=decision.reason,
            destination=spec.destination,
            attempts=delivery.attempt,
            parked_at_ms=now_ms(),
            error=error,
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
            await message.reject(requeue=True)
            problem = f"could not park the message ({exc})"
            return Settled(
                "returned", decision.reason, error=error, seconds=seconds, problem=problem
            )
        await message.ack()
        shown = failure is not None and not isinstance(failure.error, HandlerSignal)
        return Settled(
            "parked",
            decision.reason,
            error=error,
            traceback=failure.trace if shown and failure is not None else None,
            seconds=seconds,
        )


def _unsettled(
    exc: BaseException,
    reason: str = "",
    error: BaseException | None = None,
    seconds: float | None = None,
) -> Settled:
    """An ack, reject or publish the connection's loss cut off: the broker redelivers."""
    problem = f"could not settle the message ({type(exc).__name__})"
    return Settled("returned", reason, error=error, seconds=seconds, problem=problem)
