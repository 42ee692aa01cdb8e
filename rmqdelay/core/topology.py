"""The broker objects a layout needs, as plain data: exchanges, queues and bindings.

The hop topology: a publisher enters through the first tier's own fanout exchange
(named like the queue). Every tier queue dead-letters into the exchange of its own
position. That exchange is bound straight to each tier of the lower positions, with
a pattern that asks for the tier's digit and zeros in between, and to the delivery
exchange when every lower digit is zero. So each hop costs one exchange lookup.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from .journal.checkpoint import checkpoint_name
from .journal.records import journal_name
from .layout import DIGITS, Layout, segment_bytes
from .routing import validate_destination

__all__ = [
    "BRIDGE_MARKER_ARGUMENT",
    "PARKING_DELIVERY_LIMIT",
    "PLACEMENT_ARGUMENTS",
    "STREAM_RETENTION",
    "Binding",
    "Exchange",
    "KeptReason",
    "Queue",
    "Topology",
    "build_topology",
    "kept_difference",
    "queue_arguments",
    "retention_policy",
    "stale_marker_note",
    "stream_arguments",
]

BRIDGE_MARKER_ARGUMENT = "rmqdelay-bridge"
"""The argument of an x-delay bridge's held marker (its value: the bridge's ``NAME``):
the marker is the bridge's own, which ``topology plan`` does not report as left over."""

QueueRole = Literal["tier", "work", "parking", "journal", "checkpoints", "inbox"]
ExchangeKind = Literal["topic", "fanout", "direct", "headers"]


@dataclass(frozen=True)
class Exchange:
    name: str
    type: ExchangeKind
    arguments: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Queue:
    name: str
    role: QueueRole
    arguments: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Binding:
    source: str  # an exchange
    destination: str  # a queue or an exchange
    destination_type: Literal["queue", "exchange"]
    routing_key: str
    arguments: Mapping[str, Any] = field(default_factory=dict, compare=False)
    """For a headers exchange (the x-delay bridge's inbox binding)."""


@dataclass(frozen=True)
class Topology:
    exchanges: tuple[Exchange, ...]
    queues: tuple[Queue, ...]
    bindings: tuple[Binding, ...]

    @property
    def objects(self) -> tuple[Exchange | Queue, ...]:
        """Exchanges then queues: the order to declare them in."""
        return (*self.exchanges, *self.queues)

    def queue(self, name: str) -> Queue:
        return next(q for q in self.queues if q.name == name)


PLACEMENT_ARGUMENTS = ("x-queue-leader-locator", "x-quorum-initial-group-size")
"""Arguments that only say where a new queue's replicas go; see ``TopologyManager.apply``."""

PARKING_DELIVERY_LIMIT = 2_147_483_647
"""The parking queue's ``x-delivery-limit``: in effect none.

``parked list``, ``parked replay`` and ``status --parked-by-destination`` read parked
messages without acking them, and a quorum queue counts each return; RabbitMQ 4.0 gives
a queue without a limit of its own 20, then drops the message (parking has no
dead-letter exchange). ``-1`` would mean unlimited on 4.0 but "drop at the first return"
on 3.10; the largest signed 32-bit value means the same on both.
"""


KeptReason = Literal["placement", "delivery-limit", "retention"]


def kept_difference(queue: Queue, argument: str, *, missing: bool) -> KeptReason | None:
    """Why an existing ``queue`` whose ``argument`` differs is kept rather than refused.

    RabbitMQ cannot change a queue's arguments. The leader placement ones only say where
    the replicas went. The parking queue's delivery limit came later (rmqdelay 0.1
    declared none): a parking queue that has none (``missing``) is kept, and a policy
    gives it one (see the README's RabbitMQ versions); any other value still conflicts.
    The journal's retention was its age (``max_delay`` and an hour) before checkpoints:
    such a stream is kept, and :func:`retention_policy` gives it its size. None: a real
    conflict.
    """
    if argument in PLACEMENT_ARGUMENTS:
        return "placement"
    if queue.role == "parking" and argument == "x-delivery-limit" and missing:
        return "delivery-limit"
    if queue.role in ("journal", "checkpoints") and argument in STREAM_RETENTION:
        return "retention"
    return None


def queue_arguments(
    layout: Layout, queue_type: str, dead_letter_exchange: str | None
) -> dict[str, Any]:
    """A queue's type, placement and dead-lettering arguments (tiers, work queues, the
    bridge's inbox), at least once for quorum queues."""
    args: dict[str, Any] = {"x-queue-type": queue_type}
    if queue_type == "quorum":
        if layout.leader_locator is not None:
            args["x-queue-leader-locator"] = layout.leader_locator
        if layout.quorum_group_size is not None:
            args["x-quorum-initial-group-size"] = layout.quorum_group_size
    if dead_letter_exchange is not None:
        args["x-dead-letter-exchange"] = dead_letter_exchange
        if queue_type == "quorum":
            # Classic queues dead-letter at most once; quorum ones can retry until routed.
            args["x-dead-letter-strategy"] = "at-least-once"
            args["x-overflow"] = "reject-publish"
    return args


STREAM_RETENTION = ("x-max-length-bytes", "x-stream-max-segment-size-bytes", "x-max-age")
"""A stream's retention arguments: one declared otherwise (the journal of rmqdelay before
checkpoints kept ``x-max-age``) is kept, and a policy sets its retention."""


def stream_arguments(layout: Layout) -> dict[str, Any]:
    """The journal's and its checkpoints' streams: retention by size."""
    retention = layout.journal_retention
    return {
        "x-queue-type": "stream",
        "x-max-length-bytes": retention,
        "x-stream-max-segment-size-bytes": segment_bytes(retention),
    }


def retention_policy(layout: Layout) -> tuple[str, str, dict[str, Any]]:
    """The policy that gives streams declared before checkpoints their retention (a
    stream's arguments cannot change; a policy's limit and the argument's, the lower
    applies): its name, its pattern (the prefix's journal and checkpoint streams) and its
    definition, for ``rabbitmqctl set_policy`` or the management API."""
    retention = layout.journal_retention
    pattern = "^" + journal_name(layout).replace(".", r"\.") + r"(\.checkpoints)?$"
    definition = {
        "max-length-bytes": retention,
        "stream-max-segment-size-bytes": segment_bytes(retention),
    }
    return f"{journal_name(layout)}.retention", pattern, definition


def build_topology(
    layout: Layout, destinations: Iterable[str] = (), held: Iterable[str] = ()
) -> Topology:
    """Describe the shared tiers, hop exchanges and parking, plus each destination.

    A ``held`` destination (also a destination) gets its marker, an exchange bound to
    nothing: its existence tells every publisher to round delays down to the hold window,
    as its consumers (rmqdelay's) wait out the rest.
    """
    held = dict.fromkeys(held)
    destinations = [*destinations, *held]
    queue_type = layout.queue_type
    words = len(layout.positions)

    def pattern(fixed: Mapping[int, str]) -> str:
        return ".".join([*(fixed.get(i, "*") for i in range(words)), "#"])

    exchanges = [
        Exchange(layout.parking, "fanout"),
        Exchange(layout.delivery_exchange, "topic", {"alternate-exchange": layout.parking}),
        *(Exchange(p.exchange, "topic") for p in layout.positions),
    ]
    parking_args = queue_arguments(layout, queue_type, None)
    if queue_type == "quorum":  # read and returned by `parked list`: see the constant
        parking_args["x-delivery-limit"] = PARKING_DELIVERY_LIMIT
    queues = [Queue(layout.parking, "parking", parking_args)]
    bindings = [Binding(layout.parking, layout.parking, "queue", "")]
    for position in layout.positions:
        for tier in position.tiers:
            args = queue_arguments(layout, queue_type, position.exchange)
            args["x-message-ttl"] = tier.ttl_ms
            queues.append(Queue(tier.queue, "tier", args))
            # publishers enter the tiers through the first tier's own fanout
            exchanges.append(Exchange(tier.queue, "fanout"))
            bindings.append(Binding(tier.queue, tier.queue, "queue", ""))

    for source in layout.positions:
        after = source.index
        for position in layout.positions[after + 1 :]:
            zeros = {i: "0" for i in range(after + 1, position.index)}
            for tier in position.tiers:
                key = pattern({**zeros, position.index: DIGITS[tier.digit]})
                bindings.append(Binding(source.exchange, tier.queue, "queue", key))
        key = pattern({i: "0" for i in range(after + 1, words)})
        bindings.append(Binding(source.exchange, layout.delivery_exchange, "exchange", key))

    if layout.journal:
        # streams are replicated and append-only; a fanout of the same name leads to each,
        # so that writing needs no permission on the default exchange. Their retention is
        # by size, never by age: RabbitMQ deletes old segments only as new records come,
        # so what nothing writes to keeps its latest checkpoint however long it waits
        for name, role in (
            (journal_name(layout), "journal"),
            (checkpoint_name(layout), "checkpoints"),
        ):
            exchanges.append(Exchange(name, "fanout"))
            queues.append(Queue(name, role, stream_arguments(layout)))  # type: ignore[arg-type]
            bindings.append(Binding(name, name, "queue", ""))

    for destination in dict.fromkeys(destinations):
        validate_destination(layout, destination)
        work = layout.work_queue(destination)
        args = queue_arguments(layout, queue_type, layout.parking)
        if queue_type == "quorum":
            args["x-delivery-limit"] = layout.delivery_limit
        queues.append(Queue(work, "work", args))
        key = ".".join(["*"] * words + [destination])
        bindings.append(Binding(layout.delivery_exchange, work, "queue", key))
        if destination in held:
            exchanges.append(Exchange(layout.held_marker(destination), "fanout"))
    return Topology(tuple(exchanges), tuple(queues), tuple(bindings))


def stale_marker_note(marker: str, destination: str, hold_ms: int) -> str:
    """What a held marker left for a destination no longer held means, and how to go."""
    return (
        f"marks {destination!r} held, which is not held here (--held, held_destinations): "
        f"publishers still send its messages up to {hold_ms} ms early, which a plain AMQP "
        f"consumer would see. If it should not be held, delete the exchange {marker!r} "
        f"(`rabbitmqadmin delete exchange name={marker}`, or the management UI's Exchanges "
        "tab), then restart its publishers (they check once per connection); if it should, "
        f"pass --held {destination}"
    )
