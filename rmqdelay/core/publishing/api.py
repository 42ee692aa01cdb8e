"""The publisher API for synchronous code: :mod:`.aio_api` without ``async``.

GENERATED from ``aio_api.py`` by ``scripts/unasync.py``: edit that file, then run
``python scripts/unasync.py``. :class:`AbstractPublisher` is what
:class:`~rmqdelay.Publisher` and :class:`~rmqdelay.testing.InMemoryPublisher` implement.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any, TypeVar

from typing_extensions import Self, Unpack

from ..durations import DurationLike
from ..journal.purge import PurgeResult
from ..journal.records import JournalRecord
from ..journal.recurring import RecurringResult, RecurringSchedule
from ..journal.reschedule import RescheduleResult
from ..journal.view import CancelResult
from ..messages import MessageProperties
from ..steps import Flow
from .outgoing import PublishOptions, PublishResult
from .publisher import PublisherCore

__all__ = ["AbstractPublisher", "PublisherProtocol"]

T = TypeVar("T")


class AbstractPublisher(ABC):
    """Publish delayed messages with confirms, from synchronous code.

    ``with publisher: publisher.publish("orders", body, delay="15m")``
    """

    core: PublisherCore
    """The sans-IO half: checks, plans and flows."""

    @abstractmethod
    def _run(self, flow: Flow[T]) -> T:
        """Carry out ``flow``'s steps on this publisher's transport; what it returns."""

    @abstractmethod
    def connect(self) -> Self:
        """Open the connection (unless given one) and the confirm channel."""

    @abstractmethod
    def close(self) -> None:
        """Close the channel, and the connection if this publisher opened it; bounded."""

    def __enter__(self) -> Self:
        return self.connect()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def publish(
        self, destination: str, body: object, **options: Unpack[PublishOptions]
    ) -> PublishResult:
        """Publish one message and return once the broker confirmed it.

        ``options``: ``delay`` or ``at``, ``headers``, ``message_id``, ``key`` and
        ``on_conflict``, and the AMQP properties ``correlation_id``, ``content_type``,
        ``content_encoding``, ``priority``, ``reply_to``, ``type`` and ``app_id`` (see
        :class:`~.outgoing.PublishOptions`). What cannot be sent as given raises before
        anything is sent; an error after sending means the message may or may not have
        been delivered.
        """
        return self._run(self.core.publish(destination, body, options))

    def publish_many(self, requests: Iterable[Mapping[str, Any]]) -> list[PublishResult]:
        """Publish many messages with pipelined confirms; each request holds publish's args.

        Everything is validated before the first message is sent; the results follow
        the order of the requests, and BatchPublishError names the failures.
        """
        return self._run(self.core.publish_many(requests))

    def check_destination(self, destination: str) -> None:
        """Raise UnknownDestinationError unless the work queue exists (passive, cached)."""
        return self._run(self.core.check_destination(destination))

    def cancel(self, *message_ids: str, keys: Iterable[str] = ()) -> list[CancelResult]:
        """Cancel scheduled messages: a confirmed tombstone in the schedule journal for
        each id with a copy still ahead, naming every copy (an id sent again after a
        failed confirm has one per due time). Each result says ``cancelled`` (with the
        due time and ``copies``), ``unknown`` (no record) or ``too late`` (every copy due
        already: it may have been delivered). A :class:`~rmqdelay.Worker` acks a
        cancelled copy without calling its handler.
        ``keys``: cancel the current message of each key too (its latest generation; the
        key is free again); those results come after the ids', each naming its key.
        """
        return self._run(self.core.cancel(message_ids, keys))

    def cancel_matching(
        self,
        *,
        destination: str | None = None,
        due_before: datetime | None = None,
        due_after: datetime | None = None,
        headers: Mapping[str, str] | None = None,
        key_prefix: str | None = None,
        dry_run: bool = False,
        confirm: Callable[[PurgeResult], bool] | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> PurgeResult:
        """Selective purge: cancel every scheduled message the filters select (all of
        them must match; at least one is needed). A message is selected when a copy of
        it still ahead matches, and is cancelled whole, every copy; occurrences of
        recurring schedules are counted and left alone. ``headers``: each present with
        this value, compared as text. One read of the journal: ``confirm``, if given,
        sees the count first and writes nothing when it says False; ``dry_run`` only
        counts. ``progress`` as for :meth:`list_scheduled`."""
        selection = self.core.selection(destination, due_before, due_after, headers, key_prefix)
        return self._run(self.core.cancel_matching(selection, dry_run, confirm, progress))

    def reschedule(
        self, id_or_key: str, *, delay: DurationLike | None = None, at: datetime | None = None
    ) -> RescheduleResult:
        """Move a scheduled message to a new due time: ``delay`` from now, or ``at``.

        ``id_or_key``: a message id, or a key (its current message). The result's
        ``outcome`` is ``rescheduled``, or why not: ``handled``, ``cancelled``, ``due``
        (already due: handled or on its way), ``ignored`` or ``replaced`` (a keyed
        publish that lost its key), ``unknown`` (no record). A later time is one record
        in the journal (a worker forwards the old copy when it comes out); an earlier one
        publishes a fresh copy from the body in the journal, so it needs
        ``journal_bodies`` (ConfigurationError otherwise). A worker handles the message
        once, at the new time.
        """
        return self._run(self.core.reschedule(id_or_key, delay=delay, at=at))

    def list_scheduled(
        self,
        *,
        destination: str | None = None,
        due_before: datetime | None = None,
        limit: int | None = None,
        progress: Callable[[int], None] | None = None,
        key: str | None = None,
    ) -> list[JournalRecord]:
        """What the journal says is still ahead and not cancelled, soonest first (what was
        published while the journal was on): a record per copy, so an id sent again with
        another due time shows once for each. ``progress``, if given, is called with the
        count of records read, every 1,000 (a long journal takes seconds). ``key``: only
        the messages with this key."""
        flow = self.core.list_scheduled(destination, due_before, limit, progress, key)
        return self._run(flow)

    def add_recurring(
        self,
        name: str,
        destination: str,
        body: object,
        *,
        cron: str | None = None,
        tz: str | None = None,
        every: DurationLike | None = None,
        first_at: datetime | None = None,
        headers: Mapping[str, Any] | None = None,
        **properties: Unpack[MessageProperties],
    ) -> RecurringResult:
        """Send ``body`` to ``destination`` on a schedule: ``cron="0 9 * * *"`` in ``tz``
        (an IANA zone, default UTC; DST as cron does it), or ``every="15m"`` (absolute
        time, from the Unix epoch or from ``first_at``). Each occurrence is a delayed
        message keyed ``recurring:NAME@<ms>``; the worker that gets one publishes the next
        before calling the handler, so a crash neither doubles nor loses a firing. Needs
        the schedule journal. ``outcome`` ``exists`` when the schedule is already there
        with this rule and destination; a RecurringError when it is there with others."""
        rule = {"cron": cron, "tz": tz, "every": every, "first_at": first_at}
        flow = self.core.add_recurring(
            name, destination, body, **rule, headers=headers, properties=properties
        )
        return self._run(flow)

    def pause_recurring(self, name: str) -> RecurringResult:
        """Pause: occurrences go on (so resuming keeps the rule's times) but no handler
        runs until ``resume_recurring``."""
        return self._run(self.core.switch_recurring(name, "pause"))

    def resume_recurring(self, name: str) -> RecurringResult:
        """Resume a paused schedule from its next occurrence (the paused ones are not
        run late)."""
        return self._run(self.core.switch_recurring(name, "resume"))

    def remove_recurring(self, name: str) -> RecurringResult:
        """Remove: the chain ends, the pending occurrence is cancelled."""
        return self._run(self.core.switch_recurring(name, "remove"))

    def list_recurring(self) -> list[RecurringSchedule]:
        """Every schedule not removed, by name, with its state and next and last
        occurrences."""
        return self._run(self.core.list_recurring())


PublisherProtocol = AbstractPublisher
"""The name this declaration had as a Protocol: type a parameter with it and it takes
an :class:`~rmqdelay.Publisher` or an
:class:`~rmqdelay.testing.InMemoryPublisher`."""
