"""What ``rmqdelay status`` shows, as data: built from per-queue counts, rendered three ways.

Pure. The counts come from one management API call or from passive declares
(:mod:`rmqdelay.amqp.status`); both cost one step per queue, never one per message, so
the answer takes the same time with a million messages waiting.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from .journal import journal_name
from .layout import Layout

__all__ = [
    "DestinationStatus",
    "JournalStatus",
    "ParkedBreakdown",
    "QueueCounts",
    "Status",
    "TierStatus",
    "build_status",
    "count_parked",
    "prometheus_text",
]


@dataclass(frozen=True)
class QueueCounts:
    """One queue as the broker reports it; None where the source cannot tell."""

    messages: int | None
    """None for a stream over AMQP, which reports 0 whatever it holds."""
    ready: int | None = None
    unacked: int | None = None
    consumers: int | None = None


@dataclass(frozen=True)
class TierStatus:
    queue: str
    ttl_ms: int
    messages: int | None


@dataclass(frozen=True)
class DestinationStatus:
    destination: str
    queue: str
    ready: int | None
    unacked: int | None
    consumers: int | None


@dataclass(frozen=True)
class JournalStatus:
    stream: str
    records: int | None
    """Stream messages; one holds the records of up to 500 published messages."""
    oldest_ms: int | None = None


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

    @property
    def scheduled(self) -> int:
        """Messages waiting in the tiers."""
        return sum(t.messages or 0 for t in self.tiers)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "scheduled": self.scheduled}


def build_status(
    layout: Layout,
    counts: Mapping[str, QueueCounts],
    destinations: list[str],
    source: str,
    *,
    journal_oldest_ms: int | None = None,
) -> Status:
    """Assemble the snapshot; ``counts`` holds the queues that exist, by name."""
    missing: list[str] = []

    def get(name: str) -> QueueCounts | None:
        found = counts.get(name)
        if found is None:
            missing.append(name)
        return found

    tiers = []
    for tier in layout.tiers:
        c = get(tier.queue)
        tiers.append(TierStatus(tier.queue, tier.ttl_ms, c.messages if c else None))
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
            )
        )
    parking = get(layout.parking)
    journal = None
    if layout.journal:
        stream = journal_name(layout)
        c = get(stream)
        journal = JournalStatus(stream, c.messages if c else None, journal_oldest_ms)
    return Status(
        layout.prefix,
        source,
        tiers,
        rows,
        parking.messages if parking else None,
        journal,
        missing,
    )


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def prometheus_text(status: Status) -> str:
    """The snapshot in Prometheus' text exposition format (version 0.0.4)."""
    prefix = _escape(status.prefix)
    lines = [
        "# HELP rmqdelay_scheduled_messages Messages waiting in a delay tier.",
        "# TYPE rmqdelay_scheduled_messages gauge",
    ]
    for tier in status.tiers:
        if tier.messages is not None:
            labels = f'prefix="{prefix}",tier="{_escape(tier.queue)}",ttl_ms="{tier.ttl_ms}"'
            lines.append(f"rmqdelay_scheduled_messages{{{labels}}} {tier.messages}")
    lines += [
        "# HELP rmqdelay_parked_messages Messages in the parking queue.",
        "# TYPE rmqdelay_parked_messages gauge",
    ]
    if status.parked is not None:
        lines.append(f'rmqdelay_parked_messages{{prefix="{prefix}"}} {status.parked}')
    lines += [
        "# HELP rmqdelay_work_queue_messages Messages in a destination's work queue.",
        "# TYPE rmqdelay_work_queue_messages gauge",
    ]
    for row in status.destinations:
        for state, value in (("ready", row.ready), ("unacked", row.unacked)):
            if value is not None:
                labels = f'prefix="{prefix}",destination="{_escape(row.destination)}"'
                lines.append(f'rmqdelay_work_queue_messages{{{labels},state="{state}"}} {value}')
    return "\n".join(lines) + "\n"
