"""The sans-IO publisher: every operation of :mod:`.aio_api` as a flow.

``prepare`` (:mod:`.prepare`) checks everything, fixes the due time and encodes the
properties; ``finalize`` (:mod:`.sending`) plans the delay that is left right before the
bytes go out, so a message that waited in a batch is not late by that wait.

An operation is a *flow* (:mod:`..steps`): :class:`~.aio_api.AbstractAsyncPublisher`
(and its generated sync twin) writes the public methods once over these flows; the pika,
aio-pika and in-memory publishers only carry out the steps.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any, cast

from ...errors import RmqDelayError
from .. import failures, tracing
from ..clock import ms_of_datetime, ms_of_us
from ..durations import DurationLike
from ..journal import flows as journal_flows
from ..journal import reading as journal_reading
from ..journal import recurring_flows
from ..journal.checkpoint import Mark
from ..journal.key_flows import key_answer, read_back
from ..journal.purge import PurgeResult, Selection, purge
from ..journal.records import JournalRecord
from ..journal.recurring import RecurringResult, RecurringSchedule
from ..journal.reschedule import RescheduleResult, plan_reschedule
from ..journal.view import CancelResult
from ..journal.view_follow import ViewFollower, load_copies, read_on, view_follower
from ..layout import Layout
from ..messages import ATTEMPT, KEY, MessageProperties
from ..steps import Checkpoint, Flow
from .outgoing import Drafts, Outcome, Prepared, PublishOptions, PublishResult, gather_results
from .sending import Sending
from .templates import PropertyTemplates

__all__ = ["PublisherCore"]

log = logging.getLogger("rmqdelay.publisher")
CHECKPOINT_CHECK_MS = 5 * 60_000
"""How often a publisher asks whether a checkpoint is due (see
:meth:`PublisherCore.checkpoint_when_quiet`)."""
_PLAIN_REQUEST = frozenset(("destination", "body", "delay", "at"))
"""A request of only these goes to :meth:`PublisherCore.prepare`'s short path at once:
its keyword arguments cost a plain message a fifth of its preparation."""
_NEEDED = frozenset(("destination", "body"))


class PublisherCore(Sending):
    """The sans-IO half of a publisher: checks, plans, flows and their errors."""

    def __init__(
        self,
        layout: Layout,
        *,
        journal_bodies: bool = False,
        timeout: float = 30.0,
    ) -> None:
        self.layout = layout
        self.journal_bodies = journal_bodies
        self.timeout = timeout
        """How long a flow waits for the broker: a keyed publish's read back, a read of
        the journal (the publisher's ``confirm_timeout``)."""
        self.known_destinations: set[str] = set()
        self.held_destinations: set[str] = set()
        self._journal_checked = False
        self._valid_destinations: set[str] = set()
        self._properties = PropertyTemplates()
        self._follower = None
        self._view_follower: ViewFollower | None = None
        self._checkpoint_check_ms = 0
        self.writer = f"publisher:{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        """This publisher's name in a checkpoint it writes."""

    # ------------------------------------------------------------------ publishing

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
        plain = not tracing.active()  # a traced message carries its context: prepare's
        checked = [
            draft(request["destination"], request["body"], request.get("delay"), request.get("at"))
            if plain and request.keys() <= _PLAIN_REQUEST and request.keys() >= _NEEDED
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
        now = self.now_ms()
        if not self.layout.journal or now < self._checkpoint_check_ms:
            return
        self._checkpoint_check_ms = now + CHECKPOINT_CHECK_MS
        try:
            found = yield from journal_reading.latest(self.layout, self.timeout)
            if isinstance(found, Mark) and found.quiet(now):
                yield Checkpoint(
                    self.writer, due=lambda mark: mark is not None and mark.quiet(self.now_ms())
                )
        except Exception as exc:  # the publish it follows stands: a later one tries again
            log.warning("no checkpoint check or write after this publish: %s", exc)

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
                timeout=self.timeout,
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
    ) -> Flow[RescheduleResult]:
        """Move a message (by id, or a key's current one) to a new due time.

        Later: a ``rescheduled`` record alone (a worker forwards the old copy when it
        comes out). Earlier: a fresh copy made from the journal record's body, due at
        the new time, confirmed with its own record, then the ``rescheduled`` record
        (``fresh_copy``): workers drop the old copies. An earlier time without a body
        in the journal raises, saying how to keep bodies."""
        start = self.now_us()
        new_due_ms = ms_of_us(start + self._delay_us(delay, at, start))
        # the fold kept from the last call, read on to the journal's end (.view_follow);
        # kept before the read, so that concurrent calls read into the same one
        follower = self._view_follower = view_follower(self.layout, self._view_follower)
        yield from read_on(self.layout, follower, timeout=self.timeout)
        view = follower.view
        current = view.keys.current(target)  # the target may be a key
        named = [target] if current is None else [target, current.message_id]
        yield from load_copies(self.layout, follower, named, timeout=self.timeout)
        plan = plan_reschedule(view, target, new_due_ms, self.now_ms())
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
                delay=timedelta(milliseconds=max(0, new_due_ms - self.now_ms())),
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
        now = self.now_ms()
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

    # ------------------------------------------------------------------ the journal

    def cancel(
        self, message_ids: Iterable[str], keys: Iterable[str] = ()
    ) -> Flow[list[CancelResult]]:
        """The flow of ``cancel`` (:func:`.journal.flows.cancel`)."""
        if isinstance(keys, str):
            keys = (keys,)  # keys="order-42" means that key, not its letters
        return journal_flows.cancel(
            self.layout, message_ids, keys=keys, timeout=self.timeout, clock=self.now_ms
        )

    @staticmethod
    def selection(
        destination: str | None,
        due_before: datetime | None,
        due_after: datetime | None,
        headers: Mapping[str, str] | None,
        key_prefix: str | None,
    ) -> Selection:
        """What ``cancel_matching``'s filters select; ValueError without any."""
        selection = Selection(
            destination,
            None if due_before is None else ms_of_datetime(due_before),
            None if due_after is None else ms_of_datetime(due_after),
            {str(k): str(v) for k, v in (headers or {}).items()},
            key_prefix,
        )
        if selection.empty:
            raise ValueError(
                "cancel_matching needs a filter (destination, due_before, due_after, "
                "headers or key_prefix): it would cancel everything scheduled"
            )
        return selection

    def cancel_matching(
        self,
        selection: Selection,
        dry_run: bool,
        confirm: Callable[[PurgeResult], bool] | None,
        progress: Callable[[int], None] | None,
    ) -> Flow[PurgeResult]:
        """The flow of ``cancel_matching`` (:func:`.journal.purge.purge`)."""
        return purge(
            self.layout,
            selection,
            dry_run=dry_run,
            confirm=confirm,
            timeout=self.timeout,
            progress=progress,
            clock=self.now_ms,
        )

    def list_scheduled(
        self,
        destination: str | None,
        due_before: datetime | None,
        limit: int | None,
        progress: Callable[[int], None] | None,
        key: str | None,
    ) -> Flow[list[JournalRecord]]:
        """The flow of ``list_scheduled`` (:func:`.journal.flows.list_scheduled`)."""
        return journal_flows.list_scheduled(
            self.layout,
            destination=destination,
            due_before_ms=None if due_before is None else ms_of_datetime(due_before),
            limit=limit,
            timeout=self.timeout,
            progress=progress,
            clock=self.now_ms,
            key=key,
        )

    def add_recurring(
        self, name: str, destination: str, body: object, **options: Any
    ) -> Flow[RecurringResult]:
        """The flow of ``add_recurring`` (:func:`.journal.recurring_flows.add`): ``options``
        are its rule (``cron``, ``tz``, ``every``, ``first_at``), ``headers`` and
        ``properties``."""
        return recurring_flows.add(
            self, name, destination, body, timeout=self.timeout, clock=self.now_ms, **options
        )

    def switch_recurring(self, name: str, op: str) -> Flow[RecurringResult]:
        """The flow of ``pause_recurring``, ``resume_recurring`` or ``remove_recurring``."""
        return recurring_flows.switch(
            self.layout, name, op, timeout=self.timeout, clock=self.now_ms
        )

    def list_recurring(self) -> Flow[list[RecurringSchedule]]:
        """The flow of ``list_recurring``."""
        return recurring_flows.listed(self.layout, timeout=self.timeout, clock=self.now_ms)
