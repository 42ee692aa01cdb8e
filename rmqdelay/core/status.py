"""What ``rmqdelay status`` shows, as data: built from per-queue counts, rendered three ways.

Pure. The counts come from one management API call or from passive declares
(:mod:`rmqdelay.amqp.status`); both cost one step per queue, never one per message, so
the answer takes the same time with a million messages waiting.

Past-time messages: a quorum tier whose message expired hands it to its dead-letter
worker, which holds it (at least once) until the next queue confirms it. The management
API counts those as ``messages_dlx``; normally they leave within milliseconds, but a
target that refuses them, or a leader change on RabbitMQ 3.10, can hold them for minutes.
No API tells how long one has been held, so their age is measured by watching: a
:class:`PastDueWatch` fed with snapshots over time says since when each tier has held
some in every snapshot (``status --check``, ``--watch`` and the worker's gauges do).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from .journal.checkpoint import Pointer
from .journal.records import journal_name
from .layout import Layout

__all__ = [
    "DestinationStatus",
    "JournalStatus",
    "ParkedBreakdown",
    "PastDueWatch",
    "QueueCounts",
    "Status",
    "StuckTier",
    "TierStatus",
    "build_status",
    "count_parked",
    "prometheus_text",
    "stuck_tiers",
    "watch_past_due",
]


@dataclass(frozen=True)
class QueueCounts:
    """One queue as the broker reports it; None where the source cannot tell."""

    messages: int | None
    """None for a stream over AMQP, which reports 0 whatever it holds."""
    ready: int | None = None
    unacked: int | None = None
    consumers: int | None = None
    past_due: int | None = None
    """Expired messages the queue holds until the next queue confirms them (the management
    API's ``messages_dlx``, quorum queues only); None where the source cannot tell: AMQP
    has no count of them (a passive declare counts ready messages only)."""


@dataclass(frozen=True)
class TierStatus:
    queue: str
    ttl_ms: int
    messages: int | None
    """Messages waiting for their time (ready or, briefly, unacked): not the past-time
    ones, which RabbitMQ 3.10's ``messages`` also counts."""
    past_due: int | None = None
    """Messages past their time: expired, held until the next queue takes them. None:
    unknown (over AMQP, or before the management API has statistics for the queue)."""
    past_due_for_s: float | None = None
    """For how long, at least, the tier has held past-time messages: the time from the
    first of the snapshots watched in a row that all found some, to the last one; 0.0
    when it holds none. None when not watched (one snapshot cannot tell an age)."""


@dataclass(frozen=True)
class DestinationStatus:
    destination: str
    queue: str
    ready: int | None
    unacked: int | None
    consumers: int | None
    held: bool | None = None
    """Marked held (``topology apply --held``): its messages come up to the hold window
    early and its consumers, rmqdelay's, wait out the rest. None: not checked."""


@dataclass(frozen=True)
class JournalStatus:
    stream: str
    records: int | None
    """Stream messages; one holds the records of up to 500 published messages."""
    oldest_ms: int | None = None
    checkpoint_at_ms: int | None = None
    """When the latest checkpoint was written (None: none yet, or not read)."""
    checkpoint_copies: int | None = None
    """The copies pending it holds."""
    checkpoint_bytes: int | None = None


@dataclass(frozen=True)
class ParkedBreakdown:
    """Parked messages per destination, from reading them: O(parked), so only on request."""

    read: int
    """How many parked messages were read (at most the limit asked for)."""
    complete: bool
    """Every message the parking queue held was read: the counts add up to ``parked``."""
    destinations: dict[str, int]
    unknown: int = 0
    """Messages that name no destination (published there by hand, or from outside)."""


def count_parked(destinations: Iterable[str | None], total: int) -> ParkedBreakdown:
    """Count the destinations of the parked messages read; ``total`` is the queue's size."""
    counts = Counter(destinations)
    unknown = counts.pop(None, 0)
    named = {d: n for d, n in sorted(counts.items()) if d is not None}
    read = unknown + sum(named.values())
    return ParkedBreakdown(read, read >= total, named, unknown)


@dataclass(frozen=True)
class Status:
    prefix: str
    source: str
    """``management API`` or ``AMQP`` (passive declares: no unacked counts)."""
    tiers: list[TierStatus]
    destinations: list[DestinationStatus]
    parked: int | None
    journal: JournalStatus | None = None
    missing: list[str] = field(default_factory=list)
    """Queues of the layout the broker does not have: run ``topology apply``."""
    parked_by_destination: ParkedBreakdown | None = None
    """Only when asked for (``--parked-by-destination``): it reads the parked messages."""
    recurring: dict[str, int] | None = None
    """Recurring schedules by state (active, paused); only when asked for
    (``--recurring``): it reads the schedule journal."""
    hold_ms: int = 0
    """How early a held destination's messages may come (the layout's hold window)."""

    @property
    def scheduled(self) -> int:
        """Messages waiting for their time in the tiers."""
        return sum(t.messages or 0 for t in self.tiers)

    @property
    def past_due(self) -> int | None:
        """Messages past their time in all tiers; None if any tier cannot tell."""
        counts = [t.past_due for t in self.tiers]
        if any(c is None for c in counts):
            return None
        return sum(c or 0 for c in counts)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "scheduled": self.scheduled, "past_due": self.past_due}


def build_status(
    layout: Layout,
    counts: Mapping[str, QueueCounts],
    destinations: list[str],
    source: str,
    *,
    journal_oldest_ms: int | None = None,
    checkpoint: Pointer | None = None,
    held: Iterable[str] | None = None,
) -> Status:
    """Assemble the snapshot; ``counts`` holds the queues that exist, by name; ``held``
    the destinations whose held marker exists (None: not checked)."""
    marked = None if held is None else set(held)
    missing: list[str] = []

    def get(name: str) -> QueueCounts | None:
        found = counts.get(name)
        if found is None:
            missing.append(name)
        return found

    tiers = []
    for tier in layout.tiers:
        c = get(tier.queue)
        tiers.append(
            TierStatus(
                tier.queue,
                tier.ttl_ms,
                c.messages if c else None,
                c.past_due if c else None,
            )
        )
    rows = []
    for destination in destinations:
        queue = layout.work_queue(destination)
        c = get(queue)
        rows.append(
            DestinationStatus(
                destination,
                queue,
                c.ready if c else None,
                c.unacked if c else None,
                c.consumers if c else None,
                None if marked is None else destination in marked,
            )
        )
    parking = get(layout.parking)
    journal = None
    if layout.journal:
        stream = journal_name(layout)
        c = get(stream)
        journal = JournalStatus(stream, c.messages if c else None, journal_oldest_ms)
        if checkpoint is not None and checkpoint.complete:
            journal = replace(
                journal,
                checkpoint_at_ms=checkpoint.at_ms,
                checkpoint_copies=checkpoint.entries("copies"),
                checkpoint_bytes=checkpoint.bytes,
            )
    return Status(
        layout.prefix,
        source,
        tiers,
        rows,
        parking.messages if parking else None,
        journal,
        missing,
        hold_ms=layout.hold_ms,
    )


class PastDueWatch:
    """Since when each tier has held past-time messages, from snapshots taken over time.

    A tier's clock starts at the first snapshot that finds past-time messages in it and
    runs while every later one finds some; a snapshot that finds none, or cannot tell,
    stops it. So ``past_due_for_s`` is a lower bound on how long the tier has been
    stuck, as fine as the snapshots (and the management API's statistics, refreshed
    every 5 s by default) are frequent: a tier that drained and filled again between two
    snapshots looks stuck throughout. Not thread-safe: one watcher per loop.
    """

    def __init__(self) -> None:
        self._since: dict[str, float] = {}

    def observe(self, status: Status, now: float) -> Status:
        """``status`` with each tier's ``past_due_for_s`` as of ``now`` (monotonic s)."""
        tiers = []
        for tier in status.tiers:
            if not tier.past_due:
                self._since.pop(tier.queue, None)
                held = None if tier.past_due is None else 0.0
            else:
                held = max(0.0, now - self._since.setdefault(tier.queue, now))
            tiers.append(replace(tier, past_due_for_s=held))
        return replace(status, tiers=tiers)


@dataclass(frozen=True)
class StuckTier:
    """A tier that has held past-time messages for at least ``for_s`` seconds."""

    queue: str
    ttl_ms: int
    past_due: int
    for_s: float

    def describe(self) -> str:
        return (
            f"tier {self.queue} holds {self.past_due:,} message(s) past their time, "
            f"for at least {int(self.for_s)} s"
        )


def stuck_tiers(status: Status, after_s: float) -> list[StuckTier]:
    """The tiers of a watched snapshot that have held past-time messages ``after_s`` or more."""
    return [
        StuckTier(t.queue, t.ttl_ms, t.past_due, t.past_due_for_s)
        for t in status.tiers
        if t.past_due and t.past_due_for_s is not None and t.past_due_for_s >= after_s
    ]


def watch_past_due(
    snapshot: Callable[[], Status],
    stuck_after_s: float,
    *,
    interval_s: float,
    clock: Callable[[], float],
    sleep: Callable[[float], object],
) -> tuple[Status, list[StuckTier]]:
    """Take snapshots until no tier holds past-time messages, or some tier has held them
    in every snapshot for ``stuck_after_s``: the last snapshot, and the stuck tiers.

    One snapshot when nothing is past its time; at most about ``stuck_after_s`` plus one
    snapshot otherwise. A tier that cannot tell (``past_due`` None) counts as holding none.
    """
    watch = PastDueWatch()
    while True:
        status = watch.observe(snapshot(), clock())
        stuck = stuck_tiers(status, stuck_after_s)
        if stuck or not any(t.past_due for t in status.tiers):
            return status, stuck
        sleep(interval_s)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _tier_gauge(
    name: str, help_text: str, prefix: str, values: list[tuple[TierStatus, str]]
) -> list[str]:
    """One gauge's lines with a sample per tier, labelled alike for every tier gauge."""
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
    for tier, value in values:
        labels = f'prefix="{prefix}",tier="{_escape(tier.queue)}",ttl_ms="{tier.ttl_ms}"'
        lines.append(f"{name}{{{labels}}} {value}")
    return lines


def prometheus_text(status: Status) -> str:
    """The snapshot in Prometheus' text exposition format (version 0.0.4)."""
    prefix = _escape(status.prefix)
    tiers = status.tiers
    lines = _tier_gauge(
        "rmqdelay_scheduled_messages",
        "Messages waiting in a delay tier.",
        prefix,
        [(t, str(t.messages)) for t in tiers if t.messages is not None],
    )
    lines += _tier_gauge(
        "rmqdelay_past_due_messages",
        "Expired messages a delay tier holds until the next queue takes them (absent: "
        "unknown without the management API).",
        prefix,
        [(t, str(t.past_due)) for t in tiers if t.past_due is not None],
    )
    watched = [(t, f"{t.past_due_for_s:.3f}") for t in tiers if t.past_due_for_s is not None]
    if watched:
        lines += _tier_gauge(
            "rmqdelay_past_due_seconds",
            "How long, at least, a delay tier has held past-time messages in every "
            "snapshot watched (0: none).",
            prefix,
            watched,
        )
    lines += [
        "# HELP rmqdelay_parked_messages Messages in the parking queue.",
        "# TYPE rmqdelay_parked_messages gauge",
    ]
    if status.parked is not None:
        lines.append(f'rmqdelay_parked_messages{{prefix="{prefix}"}} {status.parked}')
    journal = status.journal
    if journal is not None and journal.checkpoint_at_ms is not None:
        lines += [
            "# HELP rmqdelay_journal_checkpoint_timestamp_seconds When the schedule "
            "journal's latest checkpoint was written (readers read the journal after it).",
            "# TYPE rmqdelay_journal_checkpoint_timestamp_seconds gauge",
            f'rmqdelay_journal_checkpoint_timestamp_seconds{{prefix="{prefix}"}} '
            f"{journal.checkpoint_at_ms / 1000:.3f}",
        ]
    lines += [
        "# HELP rmqdelay_work_queue_messages Messages in a destination's work queue.",
        "# TYPE rmqdelay_work_queue_messages gauge",
    ]
    for row in status.destinations:
        for state, value in (("ready", row.ready), ("unacked", row.unacked)):
            if value is not None:
                labels = f'prefix="{prefix}",destination="{_escape(row.destination)}"'
                lines.append(f'rmqdelay_work_queue_messages{{{labels},state="{state}"}} {value}')
    if status.recurring is not None:
        lines += [
            "# HELP rmqdelay_recurring_schedules Recurring schedules by state.",
            "# TYPE rmqdelay_recurring_schedules gauge",
        ]
        for state, count in sorted(status.recurring.items()):
            lines.append(
                f'rmqdelay_recurring_schedules{{prefix="{prefix}",state="{state}"}} {count}'
            )
    return "\n".join(lines) + "\n"
