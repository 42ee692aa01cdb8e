"""Sending a batch: the destinations checked, the journal's records beside the messages,
once more on another node what got no confirm, and the route planned at the last moment.

A base of :class:`~.publisher.PublisherCore`; the adapters carry out its steps
(:mod:`..steps`) and pick their errors among :meth:`Sending.returned` and the rest.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, cast

from ...errors import ConfirmTimeoutError, PublisherClosedError, UnroutableError
from .. import failures
from ..clock import ms_of_us
from ..frozen import make
from ..journal.key_flows import KeyFollower
from ..journal.records import (
    RECORDS_PER_WRITE,
    JournalRecord,
    encode_record,
    encode_scheduled,
    journal_name,
)
from ..journal.steps import journal_properties
from ..messages import ATTEMPT, KEY, MessageProperties
from ..plan import DelayPlan, Route, plan_delay, plan_route
from ..routing import validate_destination
from ..steps import CheckExchange, CheckQueue, Failover, Flow, Send
from ..wire import encode_properties
from .outgoing import Draft, Drafts, Outcome, Outgoing, Prepared, WithRecords
from .prepare import Preparing
from .templates import new_message_id

__all__ = ["Sending"]

_SEND_AGAIN = (ConfirmTimeoutError, PublisherClosedError)
"""Outcomes that leave a message's fate unknown because of the connection or its node."""
_NOT_RECORDED = frozenset((ATTEMPT, KEY))
"""Headers a record holds in fields of its own (``a``, ``key``)."""


class Sending(Preparing):
    """The checks, and the sending of a batch (the base of
    :class:`~.publisher.PublisherCore`)."""

    journal_bodies: bool
    known_destinations: set[str]
    held_destinations: set[str]
    """Known destinations whose marker exists: their delays round down to the hold window."""
    _journal_checked: bool
    _follower: KeyFollower | None

    def key_follower(self) -> KeyFollower:
        """The journal as this publisher has read it for keys (made on first use)."""
        if self._follower is None:
            self._follower = KeyFollower()
        return self._follower

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
            if (yield CheckExchange(self.layout.held_marker(destination))):
                self.held_destinations.add(destination)
            else:
                self.held_destinations.discard(destination)
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
        recorded = self.now_ms() if now_ms is None else now_ms
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
        remaining = prepared.due_at_us - (self.now_us() if now is None else now)
        held = prepared.destination in self.held_destinations
        plan = plan_delay(self.layout, remaining, prepared.destination, held=held)
        return make(Outgoing, {"prepared": prepared, "plan": plan})

    def route(self, prepared: Prepared) -> Route:
        """:meth:`finalize` at this moment, as a :class:`Route`: what the wire and the
        result need, without the plan's objects. ``finalize(prepared,
        route.planned_at_us)`` gives the whole :class:`Outgoing` again (for an error)."""
        now = self.now_us()
        if prepared.journal_records:
            return Route(prepared.destination, "", "", 0, now)
        destination = prepared.destination
        held = destination in self.held_destinations
        return plan_route(self.layout, prepared.due_at_us, now, destination, held=held)

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
