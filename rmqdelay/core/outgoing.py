"""What both publishers share: validate, then route as late as possible.

``prepare`` checks everything, fixes the due time and encodes the properties;
``finalize`` plans the delay that is left right before the bytes go out, so a message
that waited in a batch is not late by that wait.

A publish is a *flow*: a generator that yields the only two things needing a broker,
:class:`CheckQueue` (a passive check) and :class:`Send` (send and wait for confirms),
and gets their answers back. :class:`rmqdelay.amqp.publishing.PublisherSurface` writes
the public methods once over these flows; the pika and aio-pika publishers only carry
out the two steps.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Generic, TypeVar, cast

from typing_extensions import Unpack

from ..errors import (
    BatchPublishError,
    ConfirmTimeoutError,
    DelayError,
    InvalidMessageError,
    PublisherClosedError,
    PublishError,
    PublishNackedError,
    TopologyError,
    UnknownDestinationError,
    UnroutableError,
)
from .durations import DurationLike, parse_duration_us
from .journal import (
    RECORDS_PER_WRITE,
    JournalRecord,
    encode_record,
    encode_scheduled,
    journal_name,
)
from .journal_steps import Append, Read
from .layout import Layout
from .messages import (
    ATTEMPT,
    CARRIED,
    DESTINATION,
    DUE_AT,
    MessageProperties,
    amqp_properties,
    clean_headers,
    encode_body,
)
from .plan import DelayPlan, check_max_delay, plan_delay
from .routing import validate_destination
from .wire import SHORTSTR_MAX, encode_properties

__all__ = [
    "RECONNECT_PAUSES",
    "CheckQueue",
    "Failover",
    "Flow",
    "MessageProperties",
    "Outcome",
    "Outgoing",
    "Prepared",
    "PropertyTemplates",
    "PublishOptions",
    "PublishResult",
    "PublisherCore",
    "Send",
    "Steps",
    "gather_results",
    "new_message_id",
    "now_us",
    "unknown_destination",
]

T = TypeVar("T")

RECONNECT_PAUSES = (0.0, 0.5, 2.0)
"""Seconds to wait before each attempt to reopen a dropped connection: three attempts."""


def now_us() -> int:
    return time.time_ns() // 1000


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
    """A validated message with its due time and encoded properties, not yet routed."""

    destination: str
    body: bytes
    headers: dict[str, Any]
    """The caller's headers (cleaned, with the attempt); routing adds the due time."""
    message_id: str
    due_at_us: int
    properties: MessageProperties
    """The carried AMQP properties, ``content_type`` filled in from the body."""
    encoded_properties: bytes = field(repr=False)
    """The content header's property list, as :func:`~rmqdelay.core.wire.encode_properties`
    wrote it: what both publishers send."""
    journal_records: int = 0
    """Not a message but schedule journal records (this many), sent beside a batch."""

    @property
    def content_type(self) -> str:
        return str(self.properties.get("content_type"))

    @property
    def correlation_id(self) -> str | None:
        return self.properties.get("correlation_id")


@dataclass(frozen=True)
class Outgoing:
    """A message ready for the wire: exchange, key, body and properties."""

    prepared: Prepared
    plan: DelayPlan

    @property
    def exchange(self) -> str:
        return self.plan.exchange

    @property
    def routing_key(self) -> str:
        return self.plan.publish_key

    @property
    def message_id(self) -> str:
        return self.prepared.message_id

    @property
    def due_at_ms(self) -> int:
        """0 for a journal write, which is due at once."""
        return 0 if self.prepared.journal_records else -(-self.prepared.due_at_us // 1000)

    @property
    def headers(self) -> dict[str, Any]:
        """The headers sent (already in the encoded properties): the caller's, the
        attempt, the due time and the destination."""
        return {
            **self.prepared.headers,
            DUE_AT: self.due_at_ms,
            DESTINATION: self.prepared.destination,
        }


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
            out.due_at_ms,
            out.plan.routing_key,
            len(out.plan.hops),
        )


Outcome = PublishResult | BaseException
"""One message's outcome: its result, or why it was not confirmed."""


@dataclass(frozen=True)
class CheckQueue:
    """A step: does this work queue exist? Answer True or False (a passive check)."""

    queue: str


@dataclass(frozen=True)
class Send:
    """A step: send these messages in this order; answer one :data:`Outcome` each."""

    batch: list[Prepared]


@dataclass(frozen=True)
class Failover:
    """A step: confirms did not come (``reason``); leave this connection for another node.

    Answer True once a new connection is open (the node that failed is tried last), and
    the flow sends the unconfirmed messages again; False when the publisher cannot move
    (a connection it was given, or no node answered): the errors stand.
    """

    reason: str


Step = CheckQueue | Send | Failover | Append | Read
"""What a flow asks of its adapter: a publish's steps, and the journal's
(:mod:`.journal_steps`), so a publisher carries out both alike."""
Flow = Generator[Step, Any, T]
"""A publish (or a journal call) as steps for an adapter to carry out; its return value
is the call's."""


class Steps(Generic[T]):
    """Walks a flow: ``next(answer)`` gives the next step, or None once it returned."""

    def __init__(self, flow: Flow[T]) -> None:
        self._flow = flow
        self.value: T | None = None

    def next(self, answer: object = None) -> Step | None:
        try:
            return self._flow.send(answer)
        except StopIteration as stop:
            self.value = stop.value
            return None


JOURNAL_TYPE = "rmqdelay-journal"


def journal_missing(layout: Layout) -> TopologyError:
    return TopologyError(
        f"the schedule journal {journal_name(layout)!r} does not exist: run `rmqdelay "
        "topology apply`, or set schedule_journal = false (RMQDELAY_SCHEDULE_JOURNAL=false)"
    )


def unjournaled(message_id: str, why: BaseException) -> PublishError:
    """A message confirmed whose journal record was not: delivered, but not listed."""
    return PublishError(
        f"message {message_id} was confirmed but its schedule journal record was not "
        f"({why}): it will be delivered, yet `scheduled list` and `cancel` may not see it"
    )


def unknown_destination(layout: Layout, destination: str) -> UnknownDestinationError:
    queue = layout.work_queue(destination)
    return UnknownDestinationError(
        f"destination {destination!r} has no work queue {queue!r}: run "
        f"`rmqdelay topology apply --destination {destination}`"
    )


_SEND_AGAIN = (ConfirmTimeoutError, PublisherClosedError)
"""Outcomes that leave a message's fate unknown because of the connection or its node."""
_CARRIED = frozenset(CARRIED)
_NO_PROPERTIES = dict.fromkeys(CARRIED)
_REMEMBERED = 10_000
"""How many destinations, and property templates, a publisher keeps: a bound for a
service that makes up names as it goes."""


def new_message_id() -> str:
    """A random (version 4) UUID as text, as ``str(uuid.uuid4())`` gives, in a third of
    the time: on the publish path, every microsecond shows (bench/README.md)."""
    h = os.urandom(16).hex()
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{'89ab'[int(h[16], 16) & 3]}{h[17:20]}-{h[20:]}"


_ID_MARK = "rmqdelay\x01template\x01message-id"
_DUE_MARK = 0x7E7E_7E7E_7E7E_7E7E
_DUE_BYTES = b"l" + _DUE_MARK.to_bytes(8, "big")
_LONG_DUE = 2**31  # due times from here on are encoded as 64-bit ints ("l")
_ID_LENGTH = bytes((36,))  # of the ids new_message_id() makes


class PropertyTemplates:
    """Encoded properties of the usual message, by template: bytes for everything but
    the due time and the message id, kept per destination, attempt and carried
    properties.

    A message with headers of its own goes through :func:`encode_properties` as before;
    a template gives exactly the bytes that would (``tests/unit/test_fast_paths.py``
    checks it), at about a quarter of the cost.
    """

    def __init__(self) -> None:
        self._templates: dict[tuple[object, ...], tuple[bytes, bytes, bytes] | None] = {}
        self._plain: dict[tuple[str, str], tuple[bytes, bytes, bytes] | None] = {}

    def encode(
        self,
        message_id: str,
        headers: dict[str, Any],
        carried: MessageProperties,
        due_ms: int,
        destination: str,
    ) -> bytes:
        template = None
        attempt = headers.get(ATTEMPT)
        if (
            len(headers) == 1
            and type(attempt) is int
            and due_ms >= _LONG_DUE
            and message_id.isascii()
            and len(message_id) <= SHORTSTR_MAX
            and all(v is None or type(v) is str for v in carried.values())
        ):
            key = (destination, attempt, *carried.values())
            if key in self._templates:
                template = self._templates[key]
            else:
                template = self._template(destination, headers, carried)
                if len(self._templates) < _REMEMBERED:
                    self._templates[key] = template
        if template is None:
            sent = {**headers, DUE_AT: due_ms, DESTINATION: destination}
            return encode_properties(amqp_properties(message_id, sent, carried))
        head, middle, tail = template
        return b"".join(
            (
                head,
                due_ms.to_bytes(8, "big"),
                middle,
                bytes((len(message_id),)),
                message_id.encode(),
                tail,
            )
        )

    def plain(self, message_id: str, content_type: str, due_ms: int, destination: str) -> bytes:
        """:meth:`encode` of a message with no headers, id or properties of its own, and
        an id rmqdelay made (ASCII, 36 characters): fewer checks, same bytes."""
        key = (destination, content_type)
        if key in self._plain:
            template = self._plain[key]
        else:
            carried = cast(MessageProperties, dict(_NO_PROPERTIES, content_type=content_type))
            template = self._template(destination, {ATTEMPT: 1}, carried)
            if len(self._plain) < _REMEMBERED:
                self._plain[key] = template
        if template is None or due_ms < _LONG_DUE:
            carried = cast(MessageProperties, dict(_NO_PROPERTIES, content_type=content_type))
            return self.encode(message_id, {ATTEMPT: 1}, carried, due_ms, destination)
        head, middle, tail = template
        return b"".join(
            (head, due_ms.to_bytes(8, "big"), middle, _ID_LENGTH, message_id.encode(), tail)
        )

    @staticmethod
    def _template(
        destination: str, headers: dict[str, Any], carried: MessageProperties
    ) -> tuple[bytes, bytes, bytes] | None:
        """The bytes around the due time and the id, or None where they cannot be cut
        out unambiguously (a value that happens to hold a marker)."""
        sent = {**headers, DUE_AT: _DUE_MARK, DESTINATION: destination}
        whole = encode_properties(amqp_properties(_ID_MARK, sent, carried))
        marked_id = bytes((len(_ID_MARK),)) + _ID_MARK.encode()
        if whole.count(_DUE_BYTES) != 1 or whole.count(marked_id) != 1:
            return None
        due_at = whole.index(_DUE_BYTES) + 1
        id_at = whole.index(marked_id)
        if id_at < due_at:
            return None
        return (
            whole[:due_at],
            whole[due_at + 8 : id_at],
            whole[id_at + len(marked_id) :],
        )


class PublisherCore:
    """The sans-IO half of a publisher: checks, plans, flows and their errors."""

    def __init__(self, layout: Layout, *, journal_bodies: bool = False) -> None:
        self.layout = layout
        self.journal_bodies = journal_bodies
        self.known_destinations: set[str] = set()
        self._journal_checked = False
        self._valid_destinations: set[str] = set()
        self._properties = PropertyTemplates()

    # ------------------------------------------------------------------ validation

    def prepare(
        self,
        destination: str,
        body: object,
        *,
        delay: DurationLike | None = None,
        at: datetime | None = None,
        headers: Mapping[str, Any] | None = None,
        message_id: str | None = None,
        now: int | None = None,
        **properties: Unpack[MessageProperties],
    ) -> Prepared:
        """Validate a publish, fix its due time and encode it; raise before anything is sent.

        The one validation pass of both publishers, retries and replays: what AMQP
        cannot carry raises :class:`InvalidMessageError` (see :mod:`rmqdelay.core.wire`).
        """
        if not properties and headers is None and message_id is None:
            return self._prepare_plain(destination, body, delay, at, now)
        if properties and not properties.keys() <= _CARRIED:
            unknown = min(properties.keys() - _CARRIED)
            raise TypeError(f"publish() got an unexpected keyword argument {unknown!r}")
        due = self._due(destination, delay, at, now)
        payload, encoded_type = encode_body(body)
        if headers is not None and not isinstance(headers, Mapping):
            raise InvalidMessageError(
                "headers", f"must be a dict of str to values, got {type(headers).__name__}"
            )
        out_headers = clean_headers(headers)
        out_headers.setdefault(ATTEMPT, 1)
        if message_id is None:
            message_id = new_message_id()
        elif not isinstance(message_id, str) or not message_id:
            raise InvalidMessageError("message_id", f"must be a non-empty str, got {message_id!r}")
        carried = cast(MessageProperties, {name: properties.get(name) for name in CARRIED})
        carried["content_type"] = carried.get("content_type") or encoded_type
        return Prepared(
            destination=destination,
            body=payload,
            headers=out_headers,
            message_id=message_id,
            due_at_us=due,
            properties=carried,
            encoded_properties=self._properties.encode(
                message_id, out_headers, carried, -(-due // 1000), destination
            ),
        )

    def _prepare_plain(
        self,
        destination: str,
        body: object,
        delay: DurationLike | None,
        at: datetime | None,
        now: int | None,
    ) -> Prepared:
        """:meth:`prepare` of the usual message (no headers, id or properties given):
        the same checks and bytes in about half the time (``tests/unit/test_fast_paths.py``
        compares the two)."""
        due = self._due(destination, delay, at, now)
        payload, content_type = encode_body(body)
        message_id = new_message_id()
        return Prepared(
            destination,
            payload,
            {ATTEMPT: 1},
            message_id,
            due,
            cast(MessageProperties, dict(_NO_PROPERTIES, content_type=content_type)),
            self._properties.plain(message_id, content_type, -(-due // 1000), destination),
        )

    def _due(
        self,
        destination: str,
        delay: DurationLike | None,
        at: datetime | None,
        now: int | None,
    ) -> int:
        """Check the destination (each one once) and the delay; the due time in µs."""
        if destination not in self._valid_destinations:
            validate_destination(self.layout, destination)
            if len(self._valid_destinations) < _REMEMBERED:
                self._valid_destinations.add(destination)
        start = now_us() if now is None else now
        return start + self._delay_us(delay, at, start)

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

    # ------------------------------------------------------------------ flows

    def publish(
        self, destination: str, body: object, options: PublishOptions
    ) -> Flow[PublishResult]:
        """One message: validate, check its destination, send, then return or raise."""
        prepared = self.prepare(destination, body, **options)
        (outcome,) = yield from self._send([prepared])
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def publish_many(self, requests: Iterable[Mapping[str, Any]]) -> Flow[list[PublishResult]]:
        """Validate every request before the first is sent; send by due time."""
        prepared = [self.prepare(**request) for request in requests]
        order = self.send_order(prepared)
        outcomes = yield from self._send([prepared[i] for i in order])
        return gather_results(prepared, outcomes, order)

    def check_destination(self, destination: str) -> Flow[None]:
        validate_destination(self.layout, destination)
        yield from self._check([destination])

    def _check(self, destinations: Iterable[str]) -> Flow[None]:
        """Passive checks of the destinations not seen yet; the answers are cached."""
        for destination in dict.fromkeys(destinations):
            if destination in self.known_destinations:
                continue
            if not (yield CheckQueue(self.layout.work_queue(destination))):
                raise unknown_destination(self.layout, destination)
            self.known_destinations.add(destination)

    def _send(self, batch: list[Prepared]) -> Flow[list[Outcome]]:
        """Send, then once more on another node what got no confirm in time or lost its
        connection first: at-least-once, the same ids and due times (a copy may exist)."""
        outcomes = yield from self._send_once(batch)
        again = [i for i, o in enumerate(outcomes) if isinstance(o, _SEND_AGAIN)]
        if again:
            reasons = sorted({type(outcomes[i]).__name__ for i in again})
            if (yield Failover(f"{len(again)} of {len(batch)} unconfirmed ({', '.join(reasons)})")):
                resent = yield from self._send_once([batch[i] for i in again])
                for i, outcome in zip(again, resent, strict=True):
                    outcomes[i] = outcome
        return outcomes

    def _send_once(self, batch: list[Prepared]) -> Flow[list[Outcome]]:
        yield from self._check(p.destination for p in batch)
        if not self.layout.journal:
            outcomes: list[Outcome] = yield Send(batch)
            return outcomes
        if not self._journal_checked:
            if not (yield CheckQueue(journal_name(self.layout))):
                raise journal_missing(self.layout)
            self._journal_checked = True
        # the records go in the same confirm window as the messages they describe
        chunks = [batch[i : i + RECORDS_PER_WRITE] for i in range(0, len(batch), RECORDS_PER_WRITE)]
        writes = [self.journal_write(chunk) for chunk in chunks]
        sent: list[Outcome] = yield Send([*batch, *writes])
        outcomes = sent[: len(batch)]
        for chunk_index, written in enumerate(sent[len(batch) :]):
            if isinstance(written, BaseException):
                start = chunk_index * RECORDS_PER_WRITE
                for i in range(start, min(start + RECORDS_PER_WRITE, len(batch))):
                    if not isinstance(outcomes[i], BaseException):
                        outcomes[i] = unjournaled(batch[i].message_id, written)
        return outcomes

    def journal_write(self, batch: Sequence[Prepared], now_ms: int | None = None) -> Prepared:
        """One stream message recording every message of ``batch``: id, destination,
        due time, attempt, body size, headers (and the body, if ``journal_bodies``)."""
        recorded = time.time_ns() // 10**6 if now_ms is None else now_ms
        lines = []
        for p in batch:
            attempt = p.headers.get(ATTEMPT, 1)
            due_ms = -(-p.due_at_us // 1000)
            plain = len(p.headers) == 1 and ATTEMPT in p.headers and type(attempt) is int
            if plain and not self.journal_bodies:
                lines.append(
                    encode_scheduled(
                        p.message_id, p.destination, due_ms, attempt, len(p.body), recorded
                    )
                )
                continue
            record = JournalRecord(
                "scheduled",
                p.message_id,
                p.destination,
                due_ms,
                attempt=int(attempt),
                body_size=len(p.body),
                headers={k: v for k, v in p.headers.items() if k != ATTEMPT},
                recorded_at_ms=recorded,
                body=p.body if self.journal_bodies else None,
            )
            lines.append(encode_record(record))
        write_id = f"journal-{new_message_id()}"
        properties = {
            "message_id": write_id,
            "type": JOURNAL_TYPE,
            "content_type": "application/json",
            "delivery_mode": 2,
        }
        return Prepared(
            destination=journal_name(self.layout),
            body=b"\n".join(lines),
            headers={},
            message_id=write_id,
            due_at_us=0,
            properties=cast(MessageProperties, {}),
            encoded_properties=encode_properties(properties),
            journal_records=len(lines),
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
        if prepared.journal_records:
            name = prepared.destination  # the journal's fanout exchange, no delay
            return Outgoing(prepared, DelayPlan(0, (), (), name, "", name, ""))
        remaining = prepared.due_at_us - (now_us() if now is None else now)
        return Outgoing(prepared, plan_delay(self.layout, remaining, prepared.destination))

    # ------------------------------------------------------------------ outcomes

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
    def no_exchange(out: Outgoing, detail: str) -> UnroutableError:
        """The broker closed the channel: the tier's exchange does not exist (404)."""
        return UnroutableError(
            f"message {out.message_id} was not sent: {detail}; run `rmqdelay topology apply`"
        )

    @staticmethod
    def unconfirmed(message_id: str, why: object) -> PublisherClosedError:
        return PublisherClosedError(
            f"the connection closed before message {message_id} was confirmed ({why}); "
            "it may or may not have been delivered: publish it again"
        )

    @staticmethod
    def no_confirm(message_id: str, timeout: float) -> ConfirmTimeoutError:
        return ConfirmTimeoutError(
            f"no confirm for message {message_id} within confirm_timeout={timeout:g}s; it "
            "may or may not have been delivered: publish it again"
        )

    @staticmethod
    def not_connected() -> PublisherClosedError:
        return PublisherClosedError("the publisher is not connected: call connect() first")

    @staticmethod
    def lost(why: object, owned: bool, attempts: Sequence[object] = ()) -> PublisherClosedError:
        """Why a publisher cannot send: its connection dropped and could not be reopened."""
        if not owned:
            return PublisherClosedError(
                f"the connection given to this publisher is closed ({why}): open a new one "
                "and a new publisher on it"
            )
        return PublisherClosedError(
            f"the connection to the broker was lost ({why}) and {len(attempts)} attempts to "
            f"reconnect failed, the last: {attempts[-1] if attempts else '?'}"
        )


def gather_results(
    prepared: Sequence[Prepared],
    outcomes: Sequence[Outcome],
    order: Sequence[int] | None = None,
) -> list[PublishResult]:
    """Return a batch's results in order, or raise BatchPublishError naming the failures.

    ``outcomes[k]`` belongs to ``prepared[order[k]]`` when the batch went out in
    ``order`` (see :meth:`PublisherCore.send_order`).
    """
    if order is not None:
        restored: list[Outcome] = list(outcomes)
        for k, index in enumerate(order):
            restored[index] = outcomes[k]
        outcomes = restored
    failures: dict[str, PublishError] = {}
    for item, outcome in zip(prepared, outcomes, strict=True):
        if isinstance(outcome, PublishError):
            failures[item.message_id] = outcome
        elif isinstance(outcome, BaseException):
            raise outcome
    results = [o for o in outcomes if isinstance(o, PublishResult)]
    if failures:
        raise BatchPublishError(failures, len(prepared) - len(failures), results)
    return results
