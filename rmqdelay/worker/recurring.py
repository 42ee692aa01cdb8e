"""The recurring hook: a worker carries each recurring schedule's chain forward.

An occurrence (a delivery with the ``rmqdelay-recurring`` header) is admitted after the
keys filter has made it this worker's (claimed, or taken over). Then, before its handler
runs, the next occurrence is published and confirmed: keyed ``recurring:NAME@<ms>`` with
an id made of the key and the chain, so that a worker that dies before its ack, and the
one that gets the redelivery, publish the same message: the keys fold drops a copy
once one was handled. Paused: the next one is published and this one acked unhandled.
Removed (or replaced by a later ``add``): acked unhandled, and the chain ends.

It folds the journal's control records and occurrences into a
:class:`~rmqdelay.core.journal.recurring.RecurringBook` from the cancel filter's tail, which also
feeds the ``rmqdelay_recurring_schedules`` gauge.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Mapping
from typing import Any

from aio_pika.abc import AbstractIncomingMessage

from ..amqp.aio_publisher import AsyncPublisher
from ..core.clock import now_ms
from ..core.journal.records import CANCEL_MARGIN_MS, JournalRecord
from ..core.journal.recurring import OccurrenceDecision, RecurringBook
from ..core.journal.recurring_flows import occurrence_options
from ..core.journal.rules import RECURRING, Occurrence, read_occurrence
from ..core.messages import carried_properties, clean_headers
from ..errors import RecurringError
from .cancel import CancelFilter
from .delivery import Delivery
from .hooks import Admission, WorkerHook
from .metrics import RECURRING_OCCURRENCES, RECURRING_SCHEDULES

__all__ = ["RecurringHook", "RecurringUnseen"]

log = logging.getLogger("rmqdelay.worker")
_OURS = "rmqdelay-"


class RecurringHook(WorkerHook):
    """Publishes each occurrence's successor before its handler runs."""

    def __init__(self, cancels: CancelFilter) -> None:
        self.book = RecurringBook()
        self._told_broken = False
        cancels.follow(self)

    # ------------------------------------------------------------------ the fold

    def add(self, record: JournalRecord) -> None:
        self.book.add(record)
        if record.kind == "recurring" or RECURRING in record.headers:
            for state, count in self.book.counts().items():
                RECURRING_SCHEDULES.labels(state).set(count)

    def wants(self, line: bytes) -> bool:
        return self.book.wants(line)

    def expire(self, now: int) -> int:
        """Nothing to forget: a schedule is a few hundred bytes, and lives on (a
        checkpoint forgets one removed longer ago than the longest delay)."""
        return 0

    def clear(self) -> None:
        self.book.clear()

    def restore(self, entry: Mapping[str, Any]) -> None:
        self.book.restore(entry)

    # ------------------------------------------------------------------ admission

    def admit(
        self, delivery: Delivery, message: AbstractIncomingMessage, publisher: AsyncPublisher
    ) -> Awaitable[Admission] | None:
        if RECURRING not in delivery.headers:
            return None
        try:
            occurrence = read_occurrence(delivery.headers)
        except RecurringError as exc:
            if not self._told_broken:
                self._told_broken = True
                log.warning(
                    "%s: handled as a plain message, no next occurrence published",
                    exc,
                    extra=delivery.fields,
                )
            return None
        if occurrence is None:
            return None
        return self._occurrence(delivery, message, publisher, self.book.decide(occurrence))

    async def _occurrence(
        self,
        delivery: Delivery,
        message: AbstractIncomingMessage,
        publisher: AsyncPublisher,
        decision: OccurrenceDecision,
    ) -> Admission:
        name = str(delivery.headers.get(RECURRING))
        RECURRING_OCCURRENCES.labels(delivery.destination, decision.reason).inc()
        following = decision.following
        if decision.action == "drop" or following is None:
            log.info(
                "recurring schedule %r %s: occurrence acked unhandled, the chain ends",
                name,
                decision.reason,
                extra=delivery.fields,
            )
            return Admission("drop", f"recurring {decision.reason}")
        if self._published_long_ago(following):
            # the chain went past it long ago (a redelivery after a crash, a replayed
            # parked occurrence): published again it would be a new generation of its
            # key, and fork the chain from the past
            log.info(
                "recurring schedule %r: the next occurrence (%d) was published long ago; not again",
                name,
                following.at_ms,
                extra=delivery.fields,
            )
        elif not await self._publish(delivery, message, publisher, following):
            return Admission("requeue", "next occurrence not confirmed")
        if decision.action == "skip":
            return Admission("drop", "recurring paused")
        return Admission("handle")

    def _published_long_ago(self, following: Occurrence) -> bool:
        """Whether the journal shows the chain at or past ``following`` and that is due
        longer ago than the keys fold keeps it. A recent one is published again: the
        same id and due time, a copy the keys fold drops once one is handled."""
        known = self.book.schedules.get(following.name)
        return (
            known is not None
            and known.chain == following.chain
            and bool(known.occurrences)
            and max(known.occurrences) >= following.at_ms
            and following.at_ms < now_ms() - CANCEL_MARGIN_MS
        )

    async def _publish(
        self,
        delivery: Delivery,
        message: AbstractIncomingMessage,
        publisher: AsyncPublisher,
        following: Occurrence,
    ) -> bool:
        """Publish the next occurrence, confirmed; False (logged) when it was not."""
        headers = {
            k: v for k, v in clean_headers(delivery.headers).items() if not k.startswith(_OURS)
        }
        options: Any = occurrence_options(following, headers, carried_properties(message))
        try:
            await publisher.publish(delivery.destination, message.body, **options)
        except Exception as exc:
            log.warning(
                "recurring schedule %r: the next occurrence was not confirmed (%r); this "
                "one goes back to its queue",
                following.name,
                exc,
                extra=delivery.fields,
            )
            return False
        return True


class RecurringUnseen(WorkerHook):
    """A worker without the journal cannot carry a chain on (its next occurrence is a
    keyed publish): it handles the occurrence, and says once that the chain ends."""

    def __init__(self) -> None:
        self.told = False

    def before_handle(self, delivery: Delivery) -> bool:
        if not self.told and RECURRING in delivery.headers:
            self.told = True
            log.warning(
                "an occurrence of the recurring schedule %r reached a worker with the "
                "schedule journal off: it is handled, and its chain ends here (recurring "
                "schedules need the journal on the worker too)",
                delivery.headers[RECURRING],
                extra=delivery.fields,
            )
        return False
