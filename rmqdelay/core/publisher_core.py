"""The sans-IO half of both publishers: validate, then route as late as possible.

``prepare`` checks everything, fixes the due time and encodes the properties;
``finalize`` plans the delay that is left right before the bytes go out, so a message
that waited in a batch is not late by that wait.

A publish is a *flow* (:mod:`.steps`): :class:`rmqdelay.amqp.publishing.PublisherSurface`
writes the public methods once over these flows; the pika and aio-pika publishers and
:class:`rmqdelay.testing.InMemoryPublisher` only carry out the steps.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any, cast

from typing_extensions import Unpack

from ..errors import (
    ConfirmTimeoutError,
    DelayError,
    InvalidMessageError,
    PublisherClosedError,
    RmqDelayError,
    UnroutableError,
)
from . import clock, failures
from .clock import ms_of_us
from .durations import DurationLike, parse_duration_us
from .frozen import make
from .journal import reading as journal_reading
from .journal.checkpoint import Mark
from .journal.key_flows import KeyFollower, key_answer, read_back
from .journal.records import (
    RECORDS_PER_WRITE,
    JournalRecord,
    encode_record,
    encode_scheduled,
    journal_name,
)
from .journal.reschedule import RescheduleResult, plan_reschedule
from .journal.steps import journal_properties
from .journal.view_follow import ViewFollower, load_copies, read_on, view_follower
from .layout import Layout
from .messages import ATTEMPT, CARRIED, KEY, MessageProperties, clean_headers, encode_body
from .outgoing import (
    ConflictChoice,
    Draft,
    Drafts,
    Outcome,
    Outgoing,
    Prepared,
    PublishOptions,
    PublishResult,
    WithRecords,
    gather_results,
)
from .plan import DelayPlan, Route, check_max_delay, plan_delay, plan_route
from .routing import validate_destination
from .steps import Checkpoint, CheckQueue, Failover, Flow, Send
from .templates import REMEMBERED, PropertyTemplates, new_message_id, plain_carried
from .wire import encode_properties

__all__ = ["KEY_MAX_CHARS", "PublisherCore", "check_key"]

log = logging.getLogger("rmqdelay.publisher")
CHECKPOINT_CHECK_MS = 5 * 60_000
"""How often a publisher asks whether a checkpoint is due (see
:meth:`PublisherCore.checkpoint_when_quiet`)."""
_SEND_AGAIN = (ConfirmTimeoutError, PublisherClosedError)
"""Outcomes that leave a message's fate unknown because of the connection or its node."""
_CARRIED = frozenset(CARRIED)
KEY_MAX_CHARS = 512
"""A key is a header value and part of every record of its message: kept short."""
_CHOICES = ("ignore", "replace")
_NOT_RECORDED = frozenset((ATTEMPT, KEY))
"""Headers a record holds in fields of its own (``a``, ``key``)."""
_PLAIN_REQUEST = frozenset(("destination", "body", "delay", "at"))
"""A request of only these goes to :meth:`PublisherCore.prepare`'s short path at once:
its keyword arguments cost a plain message a fifth of its preparation."""
_NEEDED = frozenset(("destination", "body"))
_UNKEYED: dict[str, Any] = {
    "journal_records": 0,
    "key": None,
    "on_conflict": None,
    "marker": None,
    "own_records": (),
}
"""The fields of a message :meth:`PublisherCore.prepare` makes that its short paths
leave at their defaults (a keyed one then sets its key)."""


def check_key(layout: Layout, key: object, on_conflict: object) -> None:
    """Raise unless ``key`` and ``on_conflict`` make a keyed publish this layout can do."""
    if key is None:
        raise InvalidMessageError(
            "on_conflict",
            f"was given ({on_conflict!r}) without key=: it says what a keyed publish does "
            "while its key is pending; give key= too, or leave on_conflict out",
        )
    if not isinstance(key, str) or not key or len(key) > KEY_MAX_CHARS:
        raise InvalidMessageError(
            "key", f"must be a non-empty str of at most {KEY_MAX_CHARS} characters, got {key!r}"
        )
    if on_conflict is None:
        raise InvalidMessageError(
            "on_conflict",
            f"is required with key={key!r}: say what this publish does while a message with "
            'that key is pending: on_conflict="ignore" (keep the pending one, drop this) or '
            'on_conflict="replace" (drop the pending one, schedule this)',
        )
    if on_conflict not in _CHOICES:
        raise InvalidMessageError(
            "on_conflict", f'must be "ignore" or "replace", got {on_conflict!r}'
        )
    if not layout.journal:
        raise failures.journal_off(f"publish with key={key!r}")


class PublisherCore:
    """The sans-IO half of a publisher: checks, plans, flows and their errors."""

    def __init__(self, layout: Layout, *, journal_bodies: bool = False) -> None:
        self.layout = layout
        self.journal_bodies = journal_bodies
        self.known_destinations: set[str] = set()
        self._journal_checked = False
        self._valid_destinations: set[str] = set()
        self._properties = PropertyTemplates()
        self._follower: KeyFollower | None = None
        self._view_follower: ViewFollower | None = None
        self.read_back_timeout = 30.0
        """How long a keyed publish waits for the journal to give its record back."""
        self._checkpoint_check_ms = 0
        self.writer = f"publisher:{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        """This publisher's name in a checkpoint it writes."""

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
        key: str | None = None,
        on_conflict: ConflictChoice | None = None,
        now: int | None = None,
        **properties: Unpack[MessageProperties],
    ) -> Prepared:
        """Validate a publish, fix its due time and encode it; raise before anything is sent.

        The one validation pass of both publishers, retries and replays: what AMQP
        cannot carry raises :class:`InvalidMessageError` (see :mod:`rmqdelay.core.wire`).
        A ``rmqdelay-key`` header without ``key=`` is a keyed message sent again (a
        worker's retry or forward): recorded with its key, never an answer of its own.
        """
        if key is not None or on_conflict is not None:
            check_key(self.layout, key, on_conflict)
        if not properties and headers is None and message_id is None:
            if key is None:
                return self._from_draft(self._draft(destination, body, delay, at, now))
            return self._prepare_keyed(destination, body, delay, at, now, key, on_conflict)
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
        if key is not None:
            given = out_headers.get(KEY, key)
            if given != key:
                raise InvalidMessageError(
                    f"headers[{KEY!r}]", f"is {given!r} but key={key!r}: give the key once"
                )
            out_headers[KEY] = key
        elif isinstance(out_headers.get(KEY), (str, bytes)):
            carried_key = out_headers[KEY]
            key = carried_key.decode() if isinstance(carried_key, bytes) else carried_key
            out_headers[KEY] = key
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
                message_id, out_headers, carried, ms_of_us(due), destination
            ),
            key=key,
            on_conflict=on_conflict,
        )

    def _draft(
        self,
        destination: str,
        body: object,
        delay: DurationLike | None,
        at: datetime | None,
        now: int | None = None,
    ) -> Draft:
        """The checks of :meth:`prepare` for the usual message (no headers, id or
        properties given): all that can fail. :meth:`_from_draft` makes the message, the
        same bytes as the general path in about half the time
        (``tests/unit/test_fast_paths.py`` compares the two)."""
        due = self._due(destination, delay, at, now)
        payload, content_type = encode_body(body)
        return Draft(destination, payload, content_type, due)

    def _from_draft(self, draft: Draft) -> Prepared:
        """The rest of :meth:`_draft`'s message: an id and the encoded properties."""
        destination, payload, content_type, due = draft
        message_id = new_message_id()
        return make(
            Prepared,
            {
                "destination": destination,
                "body": payload,
                "headers": {ATTEMPT: 1},
                "message_id": message_id,
                "due_at_us": due,
                "properties": plain_carried(content_type),
                "encoded_properties": self._properties.plain(
                    message_id, content_type, ms_of_us(due), destination
                ),
                **_UNKEYED,
            },
        )

    def _prepare_keyed(
        self,
        destination: str,
        body: object,
        delay: DurationLike | None,
        at: datetime | None,
        now: int | None,
        key: str,
        on_conflict: ConflictChoice | None,
    ) -> Prepared:
        """:meth:`prepare` of a keyed message with nothing else of its own: a keyed batch
        should cost little more than a plain one (``python -m bench.keyed``)."""
        due = self._due(destination, delay, at, now)
        payload, content_type = encode_body(body)
        message_id = new_message_id()
        headers = {ATTEMPT: 1, KEY: key}
        carried = plain_carried(content_type)
        return make(
            Prepared,
            {
                "destination": destination,
                "body": payload,
                "headers": headers,
                "message_id": message_id,
                "due_at_us": due,
                "properties": carried,
                "encoded_properties": self._properties.encode(
                    message_id, headers, carried, ms_of_us(due), destination
                ),
                **_UNKEYED,
                "key": key,
                "on_conflict": on_conflict,
            },
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
            if len(self._valid_destinations) < REMEMBERED:
                self._valid_destinations.add(destination)
        start = clock.now_us() if now is None else now
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
            micros = clock.us_of_datetime(at)
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
        """One message: validate, check its destination, send, then return or raise.

        A keyed one then reads the journal back to its own record and answers what the
        key made of it (:mod:`.key_flows`)."""
        prepared = self.prepare(destination, body, **options)
        markers: list[str] = []
        (outcome,) = yield from self._send([prepared], markers)
        if prepared.on_conflict is None:
            if isinstance(outcome, BaseException):
                raise outcome
            yield from self.checkpoint_when_quiet()
            return outcome
        (answered,) = yield from self._answer_keys([prepared], [outcome], markers)
        if isinstance(answered, BaseException):
            raise answered
        yield from self.checkpoint_when_quiet()
        return answered

    def publish_many(self, requests: Iterable[Mapping[str, Any]]) -> Flow[list[PublishResult]]:
        """Validate every request before the first is sent; send by due time. Keyed
        requests are answered from one read of the journal after the batch."""
        draft = self._draft
        checked = [
            draft(request["destination"], request["body"], request.get("delay"), request.get("at"))
            if request.keys() <= _PLAIN_REQUEST and request.keys() >= _NEEDED
            else self.prepare(**request)
            for request in requests
        ]
        order = self.send_order(checked)
        batch = Drafts([checked[i] for i in order], self._from_draft)
        # the drafts live on in the batch until each is made, no longer: every object a
        # message keeps until the batch ends is one more for the garbage collector to
        # walk, and a batch's make it run a full collection (bench/README.md)
        del checked
        markers: list[str] = []
        outcomes = yield from self._send(batch, markers)
        ordered = list(batch)  # every draft made by now
        if any(p.on_conflict is not None for p in ordered):
            outcomes = yield from self._answer_keys(ordered, outcomes, markers)
        prepared = ordered[:]
        for k, index in enumerate(order):
            prepared[index] = ordered[k]
        yield from self.checkpoint_when_quiet()
        return gather_results(prepared, outcomes, order)

    # ------------------------------------------------------------------ checkpoints

    def checkpoint_when_quiet(self) -> Flow[None]:
        """Publishers write checkpoints too, when nothing else does: at its first
        publish, then every :data:`CHECKPOINT_CHECK_MS`, a publisher reads the checkpoint
        stream's last message (one message), and has a checkpoint written, on the side
        (:class:`~.steps.Checkpoint`), when no writer spoke for
        :data:`~.journal.checkpoint.QUIET_MS` (no worker, no dashboard runs).
        So a journal that only publishers write to never grows past a checkpoint's reach
        (its retention is by size: :mod:`.journal.checkpoint`). Best effort: a failure
        is logged, and the publish it follows stands."""
        now = clock.now_ms()
        if not self.layout.journal or now < self._checkpoint_check_ms:
            return
        self._checkpoint_check_ms = now + CHECKPOINT_CHECK_MS
        try:
            found = yield from journal_reading.latest(self.layout, self.read_back_timeout)
            if isinstance(found, Mark) and found.quiet(now):
                yield Checkpoint(
                    self.writer, due=lambda mark: mark is not None and mark.quiet(clock.now_ms())
                )
        except Exception as exc:  # the publish it follows stands: a later one tries again
            log.warning("no checkpoint check or write after this publish: %s", exc)

    # ------------------------------------------------------------------ keys

    def key_follower(self) -> KeyFollower:
        """The journal as this publisher has read it for keys (made on first use)."""
        if self._follower is None:
            self._follower = KeyFollower()
        return self._follower

    def _answer_keys(
        self, batch: list[Prepared], outcomes: list[Outcome], markers: list[str]
    ) -> Flow[list[Outcome]]:
        """What the journal made of each keyed message: read back to this batch's
        markers, then ask the fold. A keyed message that failed leaves nothing pending
        under its key: its record, if it was written, is cancelled (best effort), so a
        publish again with a new id is not ignored in favour of a message not sent."""
        failed = [
            p
            for p, o in zip(batch, outcomes, strict=True)
            if p.on_conflict is not None and isinstance(o, BaseException)
        ]
        if failed:
            yield from self._withdraw(failed)
        keyed = [
            p.message_id
            for p, o in zip(batch, outcomes, strict=True)
            if p.on_conflict is not None and not isinstance(o, BaseException)
        ]
        if not keyed:
            return outcomes
        follower = self.key_follower()
        what = f"message {keyed[0]}" if len(keyed) == 1 else f"{len(keyed)} keyed messages"
        try:
            yield from read_back(
                self.layout,
                follower,
                markers,
                timeout=self.read_back_timeout,
                what=what + (" was" if len(keyed) == 1 else " were"),
            )
        except RmqDelayError as exc:
            return [
                exc if p.on_conflict is not None and not isinstance(o, BaseException) else o
                for p, o in zip(batch, outcomes, strict=True)
            ]
        return [
            key_answer(follower.book, p, o)
            if p.on_conflict is not None and isinstance(o, PublishResult)
            else o
            for p, o in zip(batch, outcomes, strict=True)
        ]

    def reschedule(
        self,
        target: str,
        *,
        delay: DurationLike | None = None,
        at: datetime | None = None,
        timeout: float = 30.0,
    ) -> Flow[RescheduleResult]:
        """Move a message (by id, or a key's current one) to a new due time.

        Later: a ``rescheduled`` record alone (a worker forwards the old copy when it
        comes out). Earlier: a fresh copy made from the journal record's body, due at
        the new time, confirmed with its own record, then the ``rescheduled`` record
        (``fresh_copy``): workers drop the old copies. An earlier time without a body
        in the journal raises, saying how to keep bodies."""
        start = clock.now_us()
        new_due_ms = ms_of_us(start + self._delay_us(delay, at, start))
        # the fold kept from the last call, read on to the journal's end (.view_follow);
        # kept before the read, so that concurrent calls read into the same one
        follower = self._view_follower = view_follower(self.layout, self._view_follower)
        yield from read_on(self.layout, follower, timeout=timeout)
        view = follower.view
        current = view.keys.current(target)  # the target may be a key
        named = [target] if current is None else [target, current.message_id]
        yield from load_copies(self.layout, follower, named, timeout=timeout)
        plan = plan_reschedule(view, target, new_due_ms, clock.now_ms())
        if plan.result.outcome == "needs body":
            raise failures.reschedule_needs_body(plan.result)
        if plan.record is None:
            return plan.result
        record, result = plan.record, plan.result
        if plan.fresh_from is not None:
            fresh = plan.fresh_from
            assert fresh.body is not None
            headers: dict[str, Any] = {**fresh.headers, ATTEMPT: fresh.attempt}
            if fresh.key is not None:
                headers[KEY] = fresh.key
            prepared = self.prepare(
                fresh.destination,
                fresh.body,
                delay=timedelta(milliseconds=max(0, new_due_ms - clock.now_ms())),
                headers=headers,
                message_id=fresh.message_id,
                **cast(MessageProperties, fresh.properties),
            )
            (outcome,) = yield from self._send([prepared])
            if isinstance(outcome, BaseException):
                raise outcome
            due = outcome.due_at_ms  # the copy's own, to the ms
            moved = tuple(d for d in record.cancels_due_ms if d != due)
            record = replace(record, due_at_ms=due, cancels_due_ms=moved)
            result = replace(result, due_at_ms=due)
        yield from journal_reading.append(self.layout, [record])
        return result

    def _withdraw(self, failed: list[Prepared]) -> Flow[None]:
        now = clock.now_ms()
        tombstones = [
            JournalRecord(
                "cancelled",
                p.message_id,
                p.destination,
                ms_of_us(p.due_at_us),
                int(p.headers.get(ATTEMPT, 1)),
                recorded_at_ms=now,
                key=p.key,
            )
            for p in failed
        ]
        try:
            yield from journal_reading.append(self.layout, tombstones)
        except Exception:  # the publish's own error is the one to raise
            return

    def check_destination(self, destination: str) -> Flow[None]:
        validate_destination(self.layout, destination)
        yield from self._check([destination])

    def _check(self, destinations: Iterable[str]) -> Flow[None]:
        """Passive checks of the destinations not seen yet; the answers are cached."""
        for destination in dict.fromkeys(destinations):
            if destination in self.known_destinations:
                continue
            if not (yield CheckQueue(self.layout.work_queue(destination))):
                raise failures.unknown_destination(self.layout, destination)
            self.known_destinations.add(destination)

    def _send(
        self, batch: Sequence[Prepared], markers: list[str] | None = None
    ) -> Flow[list[Outcome]]:
        """Send, then once more on another node what got no confirm in time or lost its
        connection first: at-least-once, the same ids and due times (a copy may exist).
        ``markers`` gets the marker of each confirmed journal write of keyed records."""
        outcomes = yield from self._send_once(batch, markers)
        again = [i for i, o in enumerate(outcomes) if isinstance(o, _SEND_AGAIN)]
        if again:
            reasons = sorted({type(outcomes[i]).__name__ for i in again})
            if (yield Failover(f"{len(again)} of {len(batch)} unconfirmed ({', '.join(reasons)})")):
                resent = yield from self._send_once([batch[i] for i in again], markers)
                for i, outcome in zip(again, resent, strict=True):
                    outcomes[i] = outcome
        return outcomes

    def _send_once(
        self, batch: Sequence[Prepared], markers: list[str] | None = None
    ) -> Flow[list[Outcome]]:
        # what is known of a batch's drafts before they are made
        heads: Sequence[Prepared | Draft] = batch.items if isinstance(batch, Drafts) else batch
        yield from self._check({p.destination: None for p in heads})
        if not self.layout.journal:
            outcomes: list[Outcome] = yield Send(batch)
            return outcomes
        if not self._journal_checked:
            if not (yield CheckQueue(journal_name(self.layout))):
                raise failures.journal_missing(self.layout)
            self._journal_checked = True
        # the records go in the same confirm window as the messages they describe, made
        # as the sender reaches them (their usual line cannot fail); any other batch's
        # before the first message goes out: a keyed one's markers are expected first,
        # and a record that cannot be written must stop the batch before it is sent
        with_records = WithRecords(batch, self.journal_write, RECORDS_PER_WRITE)
        if self.journal_bodies or not all(_usual_record(p) for p in heads):
            writes = with_records.writes
            marked = {w.marker: w.own_records for w in writes if w.marker is not None}
            if marked:  # before sending: another publish may read past them first
                self.key_follower().expect(marked)
        sent: list[Outcome] = yield Send(with_records)
        outcomes = sent[: len(batch)]
        for chunk_index, written in enumerate(sent[len(batch) :]):
            marker = with_records.write(chunk_index).marker
            if marker is not None:
                if isinstance(written, BaseException):
                    self.key_follower().forget([marker])
                elif markers is not None:
                    markers.append(marker)
            if isinstance(written, BaseException):
                start = chunk_index * RECORDS_PER_WRITE
                for i in range(start, min(start + RECORDS_PER_WRITE, len(batch))):
                    if not isinstance(outcomes[i], BaseException):
                        outcomes[i] = failures.unjournaled(batch[i].message_id, written)
        return outcomes

    def journal_write(self, batch: Sequence[Prepared], now_ms: int | None = None) -> Prepared:
        """One stream message recording every message of ``batch``: id, destination,
        due time, attempt, body size, headers (and the body, if ``journal_bodies``)."""
        recorded = clock.now_ms() if now_ms is None else now_ms
        lines = []
        keyed: list[JournalRecord] = []
        answers = False
        for p in batch:
            attempt = p.headers.get(ATTEMPT, 1)
            due_ms = ms_of_us(p.due_at_us)
            key = p.key
            plain = (
                len(p.headers) == (1 if key is None else 2)
                and ATTEMPT in p.headers
                and type(attempt) is int
            )
            if key is not None and p.on_conflict is not None:
                answers = True
                # what this publisher's own read back folds without decoding it again
                keyed.append(
                    JournalRecord(
                        "scheduled",
                        p.message_id,
                        p.destination,
                        due_ms,
                        attempt=int(attempt),
                        recorded_at_ms=recorded,
                        key=key,
                        on_conflict=p.on_conflict,
                    )
                )
            if plain:
                bodies = self.journal_bodies
                lines.append(
                    encode_scheduled(
                        p.message_id,
                        p.destination,
                        due_ms,
                        attempt,
                        len(p.body),
                        recorded,
                        key,
                        p.on_conflict,
                        p.body if bodies else None,
                        _recorded(p.properties) if bodies else None,
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
                headers={k: v for k, v in p.headers.items() if k not in _NOT_RECORDED},
                recorded_at_ms=recorded,
                body=p.body if self.journal_bodies else None,
                properties=_recorded(p.properties) if self.journal_bodies else {},
                key=key,
                on_conflict=p.on_conflict,
            )
            lines.append(encode_record(record))
        marker = None
        if answers:  # a keyed publish reads the journal up to here before it answers
            marker_record = JournalRecord(
                "marker", f"marker-{new_message_id()}", recorded_at_ms=recorded
            )
            marker = marker_record.message_id
            lines.append(encode_record(marker_record))
        write_id = f"journal-{new_message_id()}"
        properties = journal_properties(write_id)
        return Prepared(
            destination=journal_name(self.layout),
            body=b"\n".join(lines),
            headers={},
            message_id=write_id,
            due_at_us=0,
            properties=cast(MessageProperties, {}),
            encoded_properties=encode_properties(properties),
            journal_records=len(lines),
            marker=marker,
            own_records=tuple(keyed) if answers else (),
        )

    @staticmethod
    def send_order(batch: Sequence[Prepared | Draft]) -> list[int]:
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
        remaining = prepared.due_at_us - (clock.now_us() if now is None else now)
        plan = plan_delay(self.layout, remaining, prepared.destination)
        return make(Outgoing, {"prepared": prepared, "plan": plan})

    def route(self, prepared: Prepared) -> Route:
        """:meth:`finalize` at this moment, as a :class:`Route`: what the wire and the
        result need, without the plan's objects. ``finalize(prepared,
        route.planned_at_us)`` gives the whole :class:`Outgoing` again (for an error)."""
        now = clock.now_us()
        if prepared.journal_records:
            return Route(prepared.destination, "", "", 0, now)
        return plan_route(self.layout, prepared.due_at_us, now, prepared.destination)

    # ------------------------------------------------------------------ outcomes

    def returned(self, out: Outgoing, reason: str) -> UnroutableError:
        """The error for a message the broker returned; forget the destination."""
        self.known_destinations.discard(out.prepared.destination)
        return failures.returned(out, reason)

    # the adapters pick among these (written in :mod:`.failures`)
    nacked = staticmethod(failures.nacked)
    no_exchange = staticmethod(failures.no_exchange)
    unconfirmed = staticmethod(failures.unconfirmed)
    no_confirm = staticmethod(failures.no_confirm)
    not_sent = staticmethod(failures.not_sent)
    not_connected = staticmethod(failures.not_connected)
    lost = staticmethod(failures.lost)


def _usual_record(p: Prepared | Draft) -> bool:
    """Whether ``p``'s record is the usual line (:func:`.journal.encode_scheduled`):
    no key and no header but an int attempt (a draft's, always)."""
    if isinstance(p, Draft):
        return True
    return p.key is None and len(p.headers) == 1 and type(p.headers.get(ATTEMPT)) is int


def _recorded(properties: MessageProperties) -> dict[str, Any]:
    """The properties a record keeps beside the body: the set ones."""
    return {k: v for k, v in properties.items() if v is not None}
