"""What both publishers share: validate, then route as late as possible.

``prepare`` checks everything and fixes the due time; ``finalize`` plans the delay
that is left right before the bytes go out, so a message that waited in a batch is
not late by that wait. The pika and aio-pika publishers only send what comes out.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, TypedDict

from ..errors import (
    BatchPublishError,
    DelayError,
    PublishError,
    PublishNackedError,
    UnknownDestinationError,
    UnroutableError,
)
from .durations import DurationLike, parse_duration_us
from .layout import Layout
from .messages import ATTEMPT, DESTINATION, DUE_AT, clean_headers, encode_body
from .plan import DelayPlan, check_max_delay, plan_delay
from .routing import validate_destination

__all__ = [
    "MessageProperties",
    "Outgoing",
    "Prepared",
    "PublishOptions",
    "PublishResult",
    "PublisherCore",
    "gather_results",
    "now_us",
]


def now_us() -> int:
    return time.time_ns() // 1000


class MessageProperties(TypedDict, total=False):
    """The AMQP properties ``publish`` takes besides the message id and headers."""

    correlation_id: str | None
    content_type: str | None
    """Default: from the body's type."""
    content_encoding: str | None
    priority: int | None
    """0 to 255; only a queue declared with x-max-priority uses it."""
    reply_to: str | None
    type: str | None
    app_id: str | None


class PublishOptions(MessageProperties, total=False):
    """The keyword arguments of ``publish``, shared by both publishers."""

    delay: DurationLike | None
    """A timedelta, seconds, or a string like ``"1.5s"``; ``0`` sends now."""
    at: datetime | None
    """A timezone-aware due time, instead of ``delay``."""
    headers: Mapping[str, Any] | None
    message_id: str | None
    """Default: a new uuid. Keep it stable across retries."""


@dataclass(frozen=True)
class Prepared:
    """A validated message with its due time, not yet routed."""

    destination: str
    body: bytes
    content_type: str
    headers: dict[str, Any]
    message_id: str
    correlation_id: str | None
    due_at_us: int
    content_encoding: str | None = None
    priority: int | None = None
    reply_to: str | None = None
    type: str | None = None
    app_id: str | None = None


@dataclass(frozen=True)
class Outgoing:
    """A message ready for the wire: exchange, key, body and properties."""

    prepared: Prepared
    plan: DelayPlan
    headers: dict[str, Any]

    @property
    def exchange(self) -> str:
        return self.plan.exchange

    @property
    def routing_key(self) -> str:
        return self.plan.publish_key

    @property
    def message_id(self) -> str:
        return self.prepared.message_id


@dataclass(frozen=True)
class PublishResult:
    """What a confirmed publish returns."""

    message_id: str
    destination: str
    due_at_ms: int
    routing_key: str
    hops: int

    @property
    def due_at(self) -> datetime:
        return datetime.fromtimestamp(self.due_at_ms / 1000, tz=timezone.utc)

    @classmethod
    def of(cls, out: Outgoing) -> PublishResult:
        return cls(
            out.message_id,
            out.prepared.destination,
            out.headers[DUE_AT],
            out.plan.routing_key,
            len(out.plan.hops),
        )


class PublisherCore:
    """The sans-IO half of a publisher."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.known_destinations: set[str] = set()

    def prepare(
        self,
        destination: str,
        body: object,
        *,
        delay: DurationLike | None = None,
        at: datetime | None = None,
        headers: Mapping[str, Any] | None = None,
        message_id: str | None = None,
        correlation_id: str | None = None,
        content_type: str | None = None,
        content_encoding: str | None = None,
        priority: int | None = None,
        reply_to: str | None = None,
        type: str | None = None,  # AMQP's name for it, as in pika and aio-pika
        app_id: str | None = None,
        now: int | None = None,
    ) -> Prepared:
        """Validate a publish and fix its due time; raise before anything is sent."""
        validate_destination(self.layout, destination)
        start = now_us() if now is None else now
        due = start + self._delay_us(delay, at, start)
        payload, encoded_type = encode_body(body)
        out_headers = clean_headers(headers)
        for key in out_headers:
            if not isinstance(key, str):
                raise TypeError(f"header names must be str, got {key!r}")
        out_headers.setdefault(ATTEMPT, 1)
        if message_id is not None and (not isinstance(message_id, str) or not message_id):
            raise ValueError(f"message_id must be a non-empty str, got {message_id!r}")
        if priority is not None and (
            isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= 255
        ):
            raise ValueError(f"priority must be an int from 0 to 255, got {priority!r}")
        return Prepared(
            destination=destination,
            body=payload,
            content_type=content_type or encoded_type,
            headers=out_headers,
            message_id=message_id or str(uuid.uuid4()),
            correlation_id=correlation_id,
            due_at_us=due,
            content_encoding=content_encoding,
            priority=priority,
            reply_to=reply_to,
            type=type,
            app_id=app_id,
        )

    def _delay_us(self, delay: DurationLike | None, at: datetime | None, start: int) -> int:
        if delay is not None and at is not None:
            raise DelayError("give either delay= or at=, not both")
        if delay is None and at is None:
            raise DelayError("give delay= (0 sends now) or at= (a timezone-aware datetime)")
        if at is not None:
            if not isinstance(at, datetime):
                raise DelayError(f"at must be a datetime, got {type(at).__name__}")
            if at.tzinfo is None or at.utcoffset() is None:
                raise DelayError(
                    f"at={at.isoformat()} is naive: give a timezone, e.g. "
                    "datetime.now(timezone.utc) + timedelta(minutes=15)"
                )
            micros = at.timestamp() * 1_000_000
            if not math.isfinite(micros):
                raise DelayError(f"at={at!r} is not a usable time")
            delay_us = max(0, math.ceil(micros) - start)
        else:
            assert delay is not None
            delay_us = parse_duration_us(delay)
            if delay_us < 0:
                raise DelayError(f"delay must not be negative, got {delay!r}")
        check_max_delay(self.layout, delay_us)
        return delay_us

    def unknown_destination(self, destination: str) -> UnknownDestinationError:
        queue = self.layout.work_queue(destination)
        return UnknownDestinationError(
            f"destination {destination!r} has no work queue {queue!r}: run "
            f"`rmqdelay topology apply --destination {destination}`"
        )

    def returned(self, out: Outgoing, reason: str) -> UnroutableError:
        """The error for a message the broker returned; forget the destination."""
        self.known_destinations.discard(out.prepared.destination)
        return UnroutableError(
            f"the broker returned message {out.message_id} ({reason}): nothing is bound for "
            f"destination {out.prepared.destination!r} via exchange {out.exchange!r}; run "
            "`rmqdelay topology apply`"
        )

    @staticmethod
    def nacked(out: Outgoing) -> PublishNackedError:
        return PublishNackedError(
            f"the broker nacked message {out.message_id} to {out.prepared.destination!r}"
        )

    @staticmethod
    def send_order(batch: Sequence[Prepared]) -> list[int]:
        """The batch's indices by due time, in their given order where due times tie.

        Messages due close together enter the same first tier one after another, and
        the broker confirms such a run with one multiple ack: a random mix of tiers took
        four times the confirm frames and cost the async publisher about a fifth of its
        rate (bench/README.md). Messages arrive by due time anyway.
        """
        return sorted(range(len(batch)), key=lambda i: batch[i].due_at_us)

    def finalize(self, prepared: Prepared, now: int | None = None) -> Outgoing:
        """Plan what is left of the delay at this moment."""
        remaining = prepared.due_at_us - (now_us() if now is None else now)
        plan = plan_delay(self.layout, remaining, prepared.destination)
        headers = {
            **prepared.headers,
            DUE_AT: -(-prepared.due_at_us // 1000),
            DESTINATION: prepared.destination,
        }
        return Outgoing(prepared, plan, headers)


def gather_results(
    prepared: Sequence[Prepared],
    outcomes: Sequence[PublishResult | BaseException],
    order: Sequence[int] | None = None,
) -> list[PublishResult]:
    """Return a batch's results in order, or raise BatchPublishError naming the failures.

    ``outcomes[k]`` belongs to ``prepared[order[k]]`` when the batch went out in
    ``order`` (see :meth:`PublisherCore.send_order`).
    """
    if order is not None:
        restored: list[PublishResult | BaseException] = list(outcomes)
        for k, index in enumerate(order):
            restored[index] = outcomes[k]
        outcomes = restored
    failures: dict[str, PublishError] = {}
    for item, outcome in zip(prepared, outcomes, strict=True):
        if isinstance(outcome, PublishError):
            failures[item.message_id] = outcome
        elif isinstance(outcome, BaseException):
            raise outcome
    if failures:
        raise BatchPublishError(failures, len(prepared) - len(failures))
    return [o for o in outcomes if isinstance(o, PublishResult)]
