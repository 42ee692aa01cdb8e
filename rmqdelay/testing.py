"""An in-memory publisher for unit tests: no broker, the same publisher.

:class:`InMemoryPublisher` and :class:`AsyncInMemoryPublisher` are the publishers of
:mod:`rmqdelay.core.publishing.api` (and its async twin) over an in-memory transport, as
dramatiq's StubBroker implements the broker, not the API: every operation and option of
:class:`~rmqdelay.Publisher` and :class:`~rmqdelay.AsyncPublisher` works on them, with
the same checks, plans, journal records and errors, and :meth:`InMemoryPublisher.advance`
moves the clock every flow reads; only the broker is a list. They record what was confirmed
(:attr:`InMemoryPublisher.sent`), keep a schedule journal that ``cancel`` and
``list_scheduled`` read, and fail on request (:meth:`InMemoryPublisher.fail_next`) so
that a caller's error handling can be tested. Neither imports a client library.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, TypeVar

from typing_extensions import Self

from .core import clock, failures
from .core.durations import DurationLike, parse_duration_us
from .core.journal.checkpoint import checkpoint_name
from .core.journal.records import JournalRecord, decode_records, encode_records, journal_name
from .core.journal.steps import Append, Read, ReadEnd, StreamMessage
from .core.journal.writer import write
from .core.publishing.aio_api import AbstractAsyncPublisher
from .core.publishing.api import AbstractPublisher
from .core.publishing.outgoing import Outcome, Outgoing, Prepared, PublishResult
from .core.publishing.publisher import PublisherCore
from .core.steps import (
    RECONNECT_PAUSES,
    CheckExchange,
    Checkpoint,
    CheckQueue,
    Failover,
    Flow,
    Step,
    run_flow,
)
from .settings import Settings

__all__ = ["AsyncInMemoryPublisher", "Failure", "InMemoryPublisher", "SentMessage"]

T = TypeVar("T")

Failure = Literal["nack", "return", "timeout", "lost", "no exchange"]
"""What :meth:`InMemoryPublisher.fail_next` makes of a message, as a broker would:
``nack`` (PublishNackedError), ``return`` (UnroutableError: nothing bound),
``timeout`` (ConfirmTimeoutError), ``lost`` (PublisherClosedError: the connection
dropped before the confirm), ``no exchange`` (UnroutableError: the channel closed 404).
A ``timeout`` or ``lost`` message is sent again after a failover, as the real
publishers do."""


@dataclass(frozen=True)
class SentMessage:
    """A confirmed message, as the broker would have taken it."""

    destination: str
    body: bytes
    due_at_ms: int
    message_id: str
    headers: dict[str, Any]
    """The headers sent: the caller's, the attempt, the due time and the destination."""
    properties: Mapping[str, Any]
    """The carried AMQP properties: ``content_type``, ``correlation_id``, ..."""
    routing_key: str
    """Where its delay starts (``"direct"`` when due now): the tier plan's key."""

    @property
    def due_at(self) -> datetime:
        return clock.datetime_of_ms(self.due_at_ms)

    def json(self) -> Any:
        """The body decoded from JSON (a dict or list was sent as JSON)."""
        return json.loads(self.body)


@dataclass
class _Rule:
    kind: Failure
    count: int
    destination: str | None
    message_id: str | None
    journal: bool

    def matches(self, prepared: Prepared) -> bool:
        if bool(prepared.journal_records) != self.journal:
            return False
        return (self.destination in (None, prepared.destination)) and (
            self.message_id in (None, prepared.message_id)
        )


@dataclass
class _Broker:
    """What the publisher's broker holds: the queues, the journal, the confirmed."""

    destinations: set[str] | None
    """The work queues that exist; None: every one."""
    journal_exists: bool = True
    held: set[str] = field(default_factory=set)
    """Destinations marked held (``topology apply --held``)."""
    removed: set[str] = field(default_factory=set)
    sent: list[SentMessage] = field(default_factory=list)
    journal: list[JournalRecord] = field(default_factory=list)
    """The journal stream, one record a message (a message's offset is its index)."""
    checkpoints: list[StreamMessage] = field(default_factory=list)
    """The checkpoint stream (``topology apply`` writes its first message)."""
    positions: dict[str, int] = field(default_factory=dict)
    """Where each kept reader (a Read's ``keep``) stands."""
    rules: list[_Rule] = field(default_factory=list)


class _Memory:
    """The adapter: carries out each step of a flow against the in-memory broker."""

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        destinations: Iterable[str] | None = None,
        journal_exists: bool = True,
        can_failover: bool = True,
        held: Iterable[str] = (),
    ) -> None:
        self.settings = settings or Settings()
        self.core = PublisherCore(
            self.settings.layout,
            journal_bodies=self.settings.journal_bodies,
            timeout=self.settings.confirm_timeout,
        )
        self._broker = _Broker(None if destinations is None else set(destinations), journal_exists)
        self._broker.held = {*held, *self.settings.held_destinations}
        self.can_failover = can_failover
        """Whether a failover finds another node (a publisher that owns its connection):
        when False, the errors of unconfirmed messages stand."""
        self.failovers: list[str] = []
        """The reason of each failover the flows asked for."""
        self.reconnects = 0
        self._dropped: bool | None = None

    # ------------------------------------------------------------------ for the test

    @property
    def sent(self) -> list[SentMessage]:
        """Every confirmed message, in the order sent (a copy sent again appears twice)."""
        return self._broker.sent

    @property
    def journal(self) -> list[JournalRecord]:
        """The schedule journal's records: ``scheduled`` ones and tombstones (the readers'
        markers left out)."""
        return [r for r in self._broker.journal if r.kind != "marker"]

    def add_destination(self, *destinations: str) -> None:
        """Make these work queues exist (all do unless ``destinations`` was given)."""
        self._broker.removed.difference_update(destinations)
        if self._broker.destinations is not None:
            self._broker.destinations.update(destinations)

    def remove_destination(self, *destinations: str) -> None:
        """Delete these work queues: the next publish to one raises
        UnknownDestinationError (the publisher forgets it had checked them)."""
        self._broker.removed.update(destinations)
        self.core.known_destinations.difference_update(destinations)

    def fail_next(
        self,
        kind: Failure,
        *,
        count: int = 1,
        destination: str | None = None,
        message_id: str | None = None,
        journal: bool = False,
    ) -> None:
        """Fail the next ``count`` messages sent (those to ``destination``, or with
        ``message_id``, if given) the way ``kind`` says; ``journal=True`` fails the
        journal writes instead, so a message is confirmed but not journaled."""
        self._broker.rules.append(_Rule(kind, count, destination, message_id, journal))

    def drop_connection(self, *, reconnects: bool = True) -> None:
        """Drop the connection: the next call reconnects (counted in ``reconnects``), or
        raises PublisherClosedError as when every attempt to reconnect failed."""
        self._dropped = reconnects

    def advance(self, delay: DurationLike) -> None:
        """Move this publisher's clock on: every flow reads it (due times, reschedules,
        ``too late``, what is listed, recurring occurrences, the records' times)."""
        self.core.offset_us += parse_duration_us(delay)

    def now(self) -> datetime:
        return clock.datetime_of_ms(self.core.now_ms())

    # ------------------------------------------------------------------ the transport

    def _connected(self) -> None:
        if self._dropped is None:
            return
        reconnects, self._dropped = self._dropped, None
        if not reconnects:
            tries = ["connection refused (simulated)"] * len(RECONNECT_PAUSES)
            raise failures.lost("connection lost (simulated)", owned=True, attempts=tries)
        self.reconnects += 1

    def _carry_out(self, flow: Flow[T]) -> T:
        self._connected()
        return run_flow(flow, self._do)

    def _do(self, step: Step) -> object:
        if isinstance(step, Checkpoint):  # written at once: a test sees it after the call
            layout, clock_ms = self.core.layout, self.core.now_ms
            flow = write(layout, writer=step.writer, timeout=1.0, clock=clock_ms, due=step.due)
            run_flow(flow, self._do)
            return None
        if isinstance(step, CheckQueue):
            return self._exists(step.queue)
        if isinstance(step, CheckExchange):
            layout = self.core.layout
            return any(layout.held_marker(d) == step.exchange for d in self._broker.held)
        if isinstance(step, Failover):
            self.failovers.append(step.reason)
            if self.can_failover:
                self.reconnects += 1
            return self.can_failover
        if isinstance(step, Append):
            return self._append(step)
        if isinstance(step, Read):
            return self._read(step)
        return [self._send(prepared) for prepared in step.batch]

    def _append(self, step: Append) -> bool:
        if not self._broker.journal_exists:
            return False
        if step.stream == checkpoint_name(self.core.layout):
            for write in step.writes:
                offset = len(self._broker.checkpoints)
                self._broker.checkpoints.append(StreamMessage(offset, write.body, write.headers))
            return True
        for write in step.writes:
            self._broker.journal.extend(decode_records(write.body))
        return True

    def _stream(self, name: str) -> list[StreamMessage] | None:
        """A stream's messages, as a consumer would get them (a read from a time reads
        them all)."""
        broker = self._broker
        if not broker.journal_exists:
            return None
        if name == checkpoint_name(self.core.layout):
            return broker.checkpoints
        return [StreamMessage(i, encode_records([r]), {}) for i, r in enumerate(broker.journal)]

    def _read(self, step: Read) -> ReadEnd:
        """From ``start`` (a time reads from the first), or where a kept reader stands."""
        messages = self._stream(step.stream)
        if messages is None:
            return "missing"
        if step.reached():
            return "done"
        start = step.start
        first = 0
        if start == "last":
            first = max(0, len(messages) - 1)
        elif isinstance(start, int):
            first = start
        if step.keep is not None:
            kept = self._broker.positions.get(step.keep)
            if kept is not None and not (isinstance(start, int) and start > kept):
                first = kept
        for message in messages[first:]:
            if step.keep is not None:
                self._broker.positions[step.keep] = message.offset + 1
            if step.take(message):
                return "done"
        return "silent"

    def _exists(self, queue: str) -> bool:
        if queue in (journal_name(self.core.layout), checkpoint_name(self.core.layout)):
            return self._broker.journal_exists
        broker, layout = self._broker, self.core.layout
        if any(layout.work_queue(d) == queue for d in broker.removed):
            return False
        known = broker.destinations
        return known is None or any(layout.work_queue(d) == queue for d in known)

    def _send(self, prepared: Prepared) -> Outcome:
        out = self.core.finalize(prepared)
        failure = self._failure(out)
        if failure is not None:
            return failure
        if prepared.journal_records:
            self._broker.journal.extend(decode_records(prepared.body))
            return PublishResult.of(out)
        self._broker.sent.append(
            SentMessage(
                prepared.destination,
                prepared.body,
                out.due_at_ms,
                prepared.message_id,
                out.headers,
                {k: v for k, v in prepared.properties.items() if v is not None},
                out.plan.routing_key,
            )
        )
        return PublishResult.of(out)

    def _failure(self, out: Outgoing) -> BaseException | None:
        for rule in self._broker.rules:
            if rule.count > 0 and rule.matches(out.prepared):
                rule.count -= 1
                self._broker.rules = [r for r in self._broker.rules if r.count > 0]
                return self._error(rule.kind, out)
        return None

    def _error(self, kind: Failure, out: Outgoing) -> BaseException:
        if kind == "nack":
            return self.core.nacked(out)
        if kind == "return":
            return self.core.returned(out, "NO_ROUTE")
        if kind == "timeout":
            return self.core.no_confirm(out.message_id, self.settings.confirm_timeout)
        if kind == "lost":
            return self.core.unconfirmed(out.message_id, "connection lost (simulated)")
        return self.core.no_exchange(out, f"NOT_FOUND - no exchange {out.exchange!r}")


class InMemoryPublisher(_Memory, AbstractPublisher):
    """A :class:`~rmqdelay.Publisher` without a broker, for unit tests: the same
    operations (:class:`~rmqdelay.core.publishing.api.AbstractPublisher`) over memory.

    ``destinations``: the work queues that exist (default: every one); ``settings``
    as for the real publisher (``schedule_journal``, ``max_delay``, ...);
    ``journal_exists=False``: the journal stream is missing; ``can_failover=False``:
    a failover finds no other node (a publisher given its connection); ``held``: the
    destinations marked held, as ``held_destinations`` marks them (their messages are
    sent up to the hold window early, as to a broker).
    """

    def connect(self) -> Self:
        return self

    def close(self) -> None:
        pass

    def _run(self, flow: Flow[T]) -> T:
        return self._carry_out(flow)


class AsyncInMemoryPublisher(_Memory, AbstractAsyncPublisher):
    """An :class:`~rmqdelay.AsyncPublisher` without a broker: :class:`InMemoryPublisher`
    with awaited methods."""

    async def connect(self) -> Self:
        return self

    async def close(self) -> None:
        pass

    async def _run(self, flow: Flow[T]) -> T:
        return self._carry_out(flow)
