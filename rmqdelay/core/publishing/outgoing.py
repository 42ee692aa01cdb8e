"""What a publish is made of, from the caller's options to the broker's answer.

:class:`PublishOptions` are ``publish``'s keywords; :class:`Prepared` a message checked
and encoded, not yet routed; :class:`Outgoing` the same with its route planned right
before it goes out; :class:`PublishResult` what a confirm gives back. The flows that move
a message through these stages are in :mod:`.publisher`, their steps in
:mod:`.steps`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Literal, NamedTuple, overload

from ...errors import BatchPublishError, PublishError
from ..clock import datetime_of_ms, iso_of_ms, ms_of_us
from ..durations import DurationLike
from ..frozen import make
from ..journal.records import JournalRecord
from ..messages import DESTINATION, DUE_AT, MessageProperties
from ..plan import DelayPlan

__all__ = [
    "ConflictChoice",
    "Draft",
    "Drafts",
    "MessageProperties",
    "Outcome",
    "Outgoing",
    "Prepared",
    "PublishOptions",
    "PublishOutcome",
    "PublishResult",
    "WithRecords",
    "gather_results",
    "lone_write",
    "merged_write",
]

ConflictChoice = Literal["ignore", "replace"]
"""What a keyed publish does while its key is pending: keep the pending message (this
one is dropped) or replace it (the pending one is dropped)."""
PublishOutcome = Literal["scheduled", "ignored", "replaced"]
"""What became of a publish: ``ignored`` and ``replaced`` only with a key."""


class PublishOptions(MessageProperties, total=False):
    """The keyword arguments of ``publish``, shared by both publishers."""

    delay: DurationLike | None
    """A timedelta, seconds, or a string like ``"1.5s"``; ``0`` sends now."""
    at: datetime | None
    """A timezone-aware due time, instead of ``delay``."""
    headers: Mapping[str, Any] | None
    message_id: str | None
    """Default: a new uuid. Keep it stable across retries."""
    key: str | None
    """At most one message per key is handled at a time (needs the schedule journal);
    ``on_conflict`` says what a publish does while the key is pending."""
    on_conflict: ConflictChoice | None
    """With ``key``, required: ``"ignore"`` keeps the pending message, ``"replace"``
    drops it for this one."""


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
    key: str | None = None
    """The message's key (also in its ``rmqdelay-key`` header), if it has one."""
    on_conflict: ConflictChoice | None = None
    """What its first publish chose for a pending key (recorded as ``m``)."""
    marker: str | None = None
    """For a journal write holding keyed records: the id of the marker record it ends
    with, which the publisher reads the journal up to before it answers."""
    own_records: tuple[JournalRecord, ...] = field(default=(), repr=False)
    """The write's keyed records, which the publisher folds when it reads the write back
    instead of decoding them again."""

    @property
    def content_type(self) -> str:
        return str(self.properties.get("content_type"))

    @property
    def correlation_id(self) -> str | None:
        return self.properties.get("correlation_id")


class Draft(NamedTuple):
    """A plain message of ``publish_many`` (no headers, id or properties given), checked,
    its body encoded and its due time fixed: everything that can fail. Its id and
    encoded properties are made when the sender reaches it (:class:`Drafts`)."""

    destination: str
    body: bytes
    content_type: str
    due_at_us: int


class _MadeWhenRead(Sequence[Prepared]):
    """Messages of which some are made when first read: indexing and slices go through
    :meth:`_at`, with an index from 0 to ``len(self) - 1``; each kind walks itself in
    order without it (``__iter__``), as the senders read a batch."""

    def _at(self, index: int) -> Prepared:
        raise NotImplementedError

    @overload
    def __getitem__(self, index: int) -> Prepared: ...

    @overload
    def __getitem__(self, index: slice) -> list[Prepared]: ...

    def __getitem__(self, index: int | slice) -> Prepared | list[Prepared]:
        if isinstance(index, slice):
            return self._range(*index.indices(len(self)))
        size = len(self)
        if index < 0:
            index += size
        if not 0 <= index < size:
            raise IndexError(index)
        return self._at(index)

    def _range(self, start: int, stop: int, step: int) -> list[Prepared]:
        """A slice, its indices in range (a sender reads a chunk at a time)."""
        return [self._at(i) for i in range(start, stop, step)]


class Drafts(_MadeWhenRead):
    """A batch in sending order whose drafts become messages when first read.

    Made before the first message went out, a batch's ids and encoded properties left
    the broker idle for a fifth of a ``publish_many`` (bench/README.md): read as the
    sender goes, they are made while the broker works through the window before. A
    message read again is the same object.
    """

    def __init__(self, items: list[Prepared | Draft], make: Callable[[Draft], Prepared]) -> None:
        self.items = items
        """Each message, or its draft until it is read."""
        self._make = make

    def __len__(self) -> int:
        return len(self.items)

    def _at(self, index: int) -> Prepared:
        item = self.items[index]
        if isinstance(item, Draft):
            item = self.items[index] = self._make(item)
        return item

    def __iter__(self) -> Iterator[Prepared]:  # the sync sender's way: no index checks
        items, make = self.items, self._make
        for index, item in enumerate(items):
            if isinstance(item, Draft):
                item = items[index] = make(item)
            yield item

    def _range(self, start: int, stop: int, step: int) -> list[Prepared]:
        items, make = self.items, self._make
        chunk: list[Prepared] = []
        for index in range(start, stop, step):
            item = items[index]
            if isinstance(item, Draft):
                item = items[index] = make(item)
            chunk.append(item)
        return chunk


class WithRecords(_MadeWhenRead):
    """A batch's messages, then the journal writes recording them, ``per_write`` messages
    each, every write made when first read.

    A sender reads the writes once it has written the messages, so they are made while
    the broker still works through the messages' window, not before the first message
    goes out: made before, they left the broker idle for a tenth of a ``publish_many``
    (bench/README.md). A write read again is the same object.
    """

    def __init__(
        self,
        messages: Sequence[Prepared],
        write: Callable[[Sequence[Prepared]], Prepared],
        per_write: int,
    ) -> None:
        self.messages = messages
        self._write = write
        self._per_write = per_write
        self._writes: list[Prepared | None] = [None] * -(-len(messages) // per_write)

    def write(self, index: int) -> Prepared:
        """The journal write of the ``index``-th run of ``per_write`` messages."""
        made = self._writes[index]
        if made is None:
            start = index * self._per_write
            made = self._writes[index] = self._write(self.messages[start : start + self._per_write])
        return made

    @property
    def writes(self) -> list[Prepared]:
        return [self.write(i) for i in range(len(self._writes))]

    def __len__(self) -> int:
        return len(self.messages) + len(self._writes)

    def _at(self, index: int) -> Prepared:
        count = len(self.messages)
        return self.messages[index] if index < count else self.write(index - count)

    def __iter__(self) -> Iterator[Prepared]:
        yield from self.messages
        for index in range(len(self._writes)):
            yield self.write(index)

    def _range(self, start: int, stop: int, step: int) -> list[Prepared]:
        if step == 1 and stop <= len(self.messages):  # messages only: the batch's slice
            return list(self.messages[start:stop])
        return super()._range(start, stop, step)


def lone_write(write: Prepared) -> bool:
    """Whether a journal write must go alone: a keyed one ends in a marker its publisher
    reads the journal up to before it answers."""
    return write.marker is not None or bool(write.own_records)


def merged_write(writes: Sequence[Prepared]) -> Prepared:
    """The journal writes of several publishes as one stream message, their lines in
    order (none of them a :func:`lone_write`).

    A stream write costs the broker about as much for one record as for three: 270 µs
    a write of one, 87 µs a record at three (bench/README.md, "The journal's writes").
    """
    if any(lone_write(w) for w in writes):
        raise ValueError("a keyed journal write goes alone: its marker is awaited")
    if len(writes) == 1:
        return writes[0]
    return replace(
        writes[0],
        body=b"\n".join(w.body for w in writes),
        journal_records=sum(w.journal_records for w in writes),
    )


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
        return 0 if self.prepared.journal_records else ms_of_us(self.prepared.due_at_us)

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
    """What a confirmed publish returns.

    With a key, what the schedule journal made of it: ``outcome`` ``scheduled`` (the key
    was free), ``replaced`` (``replaced_id`` was pending and is dropped) or ``ignored``
    (a message was pending: ``message_id`` and ``due_at_ms`` are that message's, and
    ``ignored_id`` is the id this publish sent, which no worker will handle).
    ``generation`` counts the key's winners: 1 for the first.
    """

    message_id: str
    destination: str
    due_at_ms: int
    routing_key: str
    hops: int
    key: str | None = None
    generation: int | None = None
    outcome: PublishOutcome = "scheduled"
    replaced_id: str | None = None
    ignored_id: str | None = None

    @property
    def due_at(self) -> datetime:
        return datetime_of_ms(self.due_at_ms)

    @classmethod
    def of(cls, out: Outgoing) -> PublishResult:
        return cls.routed(out.prepared, out.plan.routing_key, len(out.plan.hops))

    @classmethod
    def routed(cls, prepared: Prepared, routing_key: str, hops: int) -> PublishResult:
        """The result of ``prepared`` sent with this routing key and number of hops (a
        :class:`~rmqdelay.core.plan.Route`'s)."""
        return make(
            cls,
            {
                "message_id": prepared.message_id,
                "destination": prepared.destination,
                "due_at_ms": 0 if prepared.journal_records else ms_of_us(prepared.due_at_us),
                "routing_key": routing_key,
                "hops": hops,
                "key": prepared.key,
                "generation": None,
                "outcome": "scheduled",
                "replaced_id": None,
                "ignored_id": None,
            },
        )

    _FIELDS = (
        *("message_id", "destination", "due_at_ms", "routing_key", "hops", "key"),
        *("generation", "outcome", "replaced_id", "ignored_id"),
    )

    def to_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self._FIELDS}

    def describe(self) -> str:
        """The answer in words, as ``rmqdelay publish`` says it: the id, its due time,
        and with a key, what the key made of it."""
        said = f"{self.message_id} due {iso_of_ms(self.due_at_ms)}"
        if self.key is None:
            return said
        said += f" key {self.key} generation {self.generation}"
        if self.outcome == "ignored":
            return f"{said} ignored: that message was pending; {self.ignored_id} is dropped"
        if self.outcome == "replaced":
            return f"{said} replaced {self.replaced_id}"
        return f"{said} scheduled"


Outcome = PublishResult | BaseException
"""One message's outcome: its result, or why it was not confirmed."""


def gather_results(
    prepared: Sequence[Prepared],
    outcomes: Sequence[Outcome],
    order: Sequence[int] | None = None,
) -> list[PublishResult]:
    """Return a batch's results in order, or raise BatchPublishError naming the failures.

    ``outcomes[k]`` belongs to ``prepared[order[k]]`` when the batch went out in
    ``order`` (see :meth:`~rmqdelay.core.publishing.sending.Sending.send_order`).
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
