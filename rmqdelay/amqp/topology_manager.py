"""Declare, compare, verify and remove the topology on a broker (sync, pika).

RabbitMQ never changes a queue's arguments in place, so ``apply`` only adds and
stops at the first conflict, naming the object, the argument, and both values.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal

import pika
import pika.exceptions
from pika.adapters.blocking_connection import BlockingChannel

from ..core.topology import (
    BRIDGE_MARKER_ARGUMENT,
    Binding,
    Exchange,
    Queue,
    Topology,
    build_topology,
    kept_difference,
    retention_policy,
    stale_marker_note,
)
from ..errors import TopologyConflictError, TopologyError
from ..settings import Settings
from .connections import connect_blocking
from .management import MANAGEMENT_URL_HINT, ManagementApi, same_cluster
from .pika_private import server_properties

__all__ = [
    "DELIVERY_LIMIT_NOTE",
    "PLACEMENT_NOTE",
    "ObjectState",
    "TopologyManager",
]

Status = Literal["ok", "missing", "differs", "unchecked", "stale"]
_INEQUIVALENT = re.compile(
    r"inequivalent arg '(?P<arg>[^']+)' for (?P<kind>queue|exchange) '(?P<name>[^']+)'"
    r" in vhost '[^']*': received (?P<wanted>.+?) but current is (?P<found>.+)$"
)


@dataclass(frozen=True)
class ObjectState:
    kind: Literal["exchange", "queue", "binding"]
    name: str
    status: Status
    detail: str = ""


PLACEMENT_NOTE = (
    "declared before leader placement was set: kept where it is "
    "(`rabbitmq-queues rebalance quorum` spreads existing leaders)"
)
DELIVERY_LIMIT_NOTE = (
    "declared without a delivery limit: kept, but on RabbitMQ 4.0 reading a parked "
    "message (parked list, replay, status --parked-by-destination) more than 20 times "
    "drops it; give it a policy `delivery-limit: -1` (4.x) or re-create it when empty"
)


def _binding_name(b: Binding) -> str:
    return f"{b.source} -> {b.destination} [{b.routing_key}]"


class TopologyManager:
    """Plan, apply, verify and destroy one prefix's objects."""

    def __init__(
        self,
        settings: Settings,
        *,
        connection: pika.BlockingConnection | None = None,
        held: Iterable[str] = (),
    ) -> None:
        self.settings = settings
        self.layout = settings.layout
        self.held: tuple[str, ...] = tuple(dict.fromkeys([*settings.held_destinations, *held]))
        """Destinations held by rmqdelay's consumers: the settings' and ``--held``'s."""
        self._connection = connection
        self._owns_connection = connection is None
        self._channel: BlockingChannel | None = None
        self.management = ManagementApi.for_settings(settings)
        self._management_checked = False
        self._management_problem: str | None = None
        self.placement_kept: list[str] = []
        """Existing queues whose leader placement arguments differ (see ``_declare``)."""
        self.delivery_limit_kept: list[str] = []
        """An existing parking queue declared without ``x-delivery-limit`` (see ``_declare``)."""
        self.retention_kept: list[str] = []
        """Existing streams declared with another retention (see ``_declare``): a policy
        gives them theirs (:meth:`retention_note`)."""

    def __enter__(self) -> TopologyManager:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        if self._owns_connection and self._connection is not None:
            if self._connection.is_open:
                self._connection.close()
            self._connection = None

    def topology(self, destinations: Iterable[str] = ()) -> Topology:
        return build_topology(
            self.layout,
            [*self.settings.destinations, *destinations],
            self.held,
        )

    def stale_markers(self, destinations: Iterable[str] = ()) -> dict[str, str]:
        """Held markers on the broker of destinations not held here, marker -> destination:
        the management API's list of exchanges when it answers, else a passive check of
        each destination named (``-d``, the settings), which cannot tell an x-delay
        bridge's own marker (its argument) from a left-over one."""
        layout = self.layout
        found: dict[str, str] = {}
        if not self.management_problem:
            try:
                for exchange in self.management.exchanges(layout.held_marker("")):
                    name = str(exchange.get("name", ""))
                    if BRIDGE_MARKER_ARGUMENT in (exchange.get("arguments") or {}):
                        continue  # an x-delay bridge's own (bridge.names)
                    if (destination := layout.held_of(name)) is not None:
                        found[name] = destination
                return {m: d for m, d in sorted(found.items()) if d not in self.held}
            except (OSError, ValueError):
                pass
        for destination in dict.fromkeys([*self.settings.destinations, *destinations]):
            marker = layout.held_marker(destination)
            if destination not in self.held and self._exists("exchange", marker) is not None:
                found[marker] = destination
        return {m: d for m, d in sorted(found.items()) if d not in self.held}

    def stale_notes(self, destinations: Iterable[str] = ()) -> list[str]:
        """A line per stale held marker (:meth:`stale_markers`), saying how to remove it."""
        hold_ms = self.layout.hold_ms
        return [
            f"exchange {marker!r} {stale_marker_note(marker, destination, hold_ms)}"
            for marker, destination in self.stale_markers(destinations).items()
        ]

    # -- channels: a failed passive check closes the channel, so open a fresh one --

    def _chan(self) -> BlockingChannel:
        if self._connection is None or not self._connection.is_open:
            self._connection = connect_blocking(self.settings, "topology")
        if self._channel is None or not self._channel.is_open:
            self._channel = self._connection.channel()
        return self._channel

    def _exists(self, kind: str, name: str) -> int | None:
        """The message count of a queue (0 for an exchange), or None when missing."""
        try:
            if kind == "queue":
                ok = self._chan().queue_declare(name, passive=True)
                return int(ok.method.message_count)
            self._chan().exchange_declare(name, passive=True)
            return 0
        except pika.exceptions.ChannelClosedByBroker as exc:
            self._channel = None
            if exc.reply_code == 404:
                return None
            if exc.reply_code == 403:
                raise TopologyError(
                    f"access refused to {kind} {name!r}: {exc.reply_text}"
                ) from None
            raise

    def _declare(self, obj: Exchange | Queue, arguments: dict[str, Any] | None = None) -> None:
        """Declare with the wanted arguments; raise TopologyConflictError if they differ.

        Two differences are kept, as RabbitMQ cannot change a queue's arguments in place
        (``core.topology.kept_difference``): a queue declared before leader placement was
        set, whose replicas are where they are (named in :attr:`placement_kept`); and a
        parking queue declared before it had a delivery limit (named in
        :attr:`delivery_limit_kept`: a policy can give it one). The queue is checked
        again without that argument, so any other difference still stops ``apply``.
        """
        args = dict(obj.arguments) if arguments is None else arguments
        try:
            if isinstance(obj, Queue):
                self._chan().queue_declare(obj.name, durable=True, arguments=args)
            else:
                self._chan().exchange_declare(
                    obj.name, obj.type, durable=True, arguments=dict(obj.arguments)
                )
        except pika.exceptions.ChannelClosedByBroker as exc:
            self._channel = None
            match = _INEQUIVALENT.search(exc.reply_text)
            if exc.reply_code == 406 and match and isinstance(obj, Queue):
                reason = kept_difference(obj, match["arg"], missing=match["found"] == "none")
                if reason == "retention":  # a journal of before checkpoints: as it is
                    if obj.name not in self.retention_kept:
                        self.retention_kept.append(obj.name)
                    self._chan().queue_declare(obj.name, passive=True)
                    return None
            if exc.reply_code == 406 and match and isinstance(obj, Queue) and match["arg"] in args:
                reason = kept_difference(obj, match["arg"], missing=match["found"] == "none")
                if reason is not None:
                    kept = (
                        self.placement_kept if reason == "placement" else self.delivery_limit_kept
                    )
                    if obj.name not in kept:
                        kept.append(obj.name)
                    del args[match["arg"]]
                    return self._declare(obj, args)
            if exc.reply_code == 406 and match:
                raise TopologyConflictError(
                    match["kind"], match["name"], match["arg"], match["found"], match["wanted"]
                ) from None
            if exc.reply_code == 403:
                raise TopologyError(
                    f"cannot declare {obj.name!r}: {exc.reply_text}. `topology apply` needs "
                    "configure permission; publishers and workers do not"
                ) from None
            raise

    def retention_note(self) -> str:
        """What to do about a stream kept with another retention: the policy's command."""
        name, pattern, definition = retention_policy(self.layout)
        return (
            "declared with another retention (a stream's arguments cannot change): give it "
            f"this one with a policy: rabbitmqctl set_policy {name} '{pattern}' "
            f"'{json.dumps(definition, separators=(',', ':'))}' --apply-to queues "
            "(docs/protocol.md: moving a journal declared before checkpoints)"
        )

    @property
    def management_problem(self) -> str | None:
        """Why bindings and work queues cannot be listed (one line), or None.

        The API must answer, and be this broker's: a management URL that reaches another
        broker would report this one's objects as missing.
        """
        if not self._management_checked:
            self._management_checked = True
            self._management_problem = self.management.problem or self._other_broker()
        return self._management_problem

    def _other_broker(self) -> str | None:
        """Refuse an API of another cluster; accept any node of this one.

        The AMQP server properties name no node, only ``cluster_name``, which on a
        cluster without a name set is each node's own (see
        :func:`~rmqdelay.amqp.management.same_cluster`), so the API's nodes are asked
        too. When the API's user may not list them, differing names are not refused, nor
        on pika's public path (:mod:`.pika_private`), where the AMQP side names nothing.
        """
        self._chan()
        amqp_name = server_properties(self._connection).get("cluster_name")
        if isinstance(amqp_name, bytes):
            amqp_name = amqp_name.decode(errors="replace")
        try:
            overview = self.management.overview()
            api_name = overview.get("cluster_name")
            if not amqp_name or not api_name or amqp_name == api_name:
                return None
            nodes = self.management.node_names()
        except (OSError, ValueError) as exc:
            return f"the management API at {self.management.base} stopped answering ({exc})"
        node = overview.get("node")
        if same_cluster(str(amqp_name), str(api_name), node and str(node), nodes) is not False:
            return None
        return (
            f"the management API at {self.management.base} is another broker's (cluster "
            f"{api_name!r}, nodes {', '.join(nodes)}; the AMQP URL reaches {amqp_name!r}); "
            f"set {MANAGEMENT_URL_HINT} to a node of this broker's cluster"
        )

    def _binding_states(self, topology: Topology) -> list[ObjectState]:
        if self.management_problem:
            return [
                ObjectState("binding", _binding_name(b), "unchecked", "no management API")
                for b in topology.bindings
            ]
        present = self.management.bindings()
        return [
            ObjectState(
                "binding",
                _binding_name(b),
                "ok"
                if (b.source, b.destination, b.destination_type, b.routing_key) in present
                else "missing",
            )
            for b in topology.bindings
        ]

    # -- the four verbs --

    def plan(self, destinations: Iterable[str] = ()) -> list[ObjectState]:
        """What exists, what is missing and what differs. Changes nothing."""
        topology = self.topology(destinations)
        leaders = self.leaders()
        states: list[ObjectState] = []
        for obj in topology.objects:
            kind: Literal["exchange", "queue"] = "queue" if isinstance(obj, Queue) else "exchange"
            if self._exists(kind, obj.name) is None:
                states.append(ObjectState(kind, obj.name, "missing"))
                continue
            try:  # an identical declare of an existing object is a no-op
                self._declare(obj)
                notes = [f"leader {leaders[obj.name]}"] if obj.name in leaders else []
                if obj.name in self.placement_kept:
                    notes.append(PLACEMENT_NOTE)
                if obj.name in self.delivery_limit_kept:
                    notes.append(DELIVERY_LIMIT_NOTE)
                if obj.name in self.retention_kept:
                    notes.append(self.retention_note())
                states.append(ObjectState(kind, obj.name, "ok", "; ".join(notes)))
            except TopologyConflictError as exc:
                detail = f"{exc.argument}: found {exc.found}, wanted {exc.wanted}"
                states.append(ObjectState(kind, obj.name, "differs", detail))
        hold_ms = self.layout.hold_ms
        stale = [
            ObjectState("exchange", m, "stale", stale_marker_note(m, d, hold_ms))
            for m, d in self.stale_markers(destinations).items()
        ]
        return states + stale + self._binding_states(topology)

    def leaders(self) -> dict[str, str]:
        """The node leading each of the prefix's quorum queues, when the management API is
        there (and this broker's); empty otherwise."""
        if self.management_problem:
            return {}
        try:
            queues = self.management.queues(f"{self.layout.prefix}.")
        except (OSError, ValueError):
            return {}
        return {
            str(q["name"]): str(q.get("leader") or q.get("node"))
            for q in queues
            if q.get("type") == "quorum" and (q.get("leader") or q.get("node"))
        }

    def apply(self, destinations: Iterable[str] = ()) -> Topology:
        """Declare every object and binding. Idempotent; never deletes. A checkpoint
        stream it creates gets its first message (``genesis``: no checkpoint yet), so
        that a reader finds it at once (:mod:`rmqdelay.core.journal.checkpoint`)."""
        topology = self.topology(destinations)
        fresh = [
            q.name
            for q in topology.queues
            if q.role == "checkpoints" and self._exists("queue", q.name) is None
        ]
        self.declare(topology)
        for name in fresh:
            self._genesis(name)
        return topology

    def _genesis(self, stream: str) -> None:
        """The first message of a new checkpoint stream: no checkpoint yet."""
        from ..core.clock import now_ms
        from ..core.journal.checkpoint import CHECKPOINT_TYPE, GENESIS, HEADER, Mark
        from ..core.journal.steps import journal_properties

        mark = Mark("genesis", "genesis", 0, now_ms(), "topology apply", GENESIS)
        properties = journal_properties("genesis", CHECKPOINT_TYPE, {HEADER: mark.header()})
        channel = self._chan()
        channel.confirm_delivery()
        channel.basic_publish(stream, "", b"", pika.BasicProperties(**properties), mandatory=True)
        channel.close()

    def declare(self, topology: Topology) -> Topology:
        """Declare ``topology``'s objects, then its bindings; stop at the first conflict
        (see ``_declare``). :meth:`apply` with the prefix's topology; the x-delay bridge
        with its own objects."""
        for obj in topology.objects:
            self._declare(obj)
        channel = self._chan()
        for b in topology.bindings:
            arguments = dict(b.arguments) or None
            if b.destination_type == "queue":
                channel.queue_bind(b.destination, b.source, b.routing_key, arguments)
            else:
                channel.exchange_bind(b.destination, b.source, b.routing_key, arguments)
        return topology

    def verify(self, destinations: Iterable[str] = ()) -> list[str]:
        """Problems found with passive checks only; needs no configure permission."""
        topology = self.topology(destinations)
        problems = [
            f"{kind} {obj.name!r} is missing"
            for kind, objs in (("exchange", topology.exchanges), ("queue", topology.queues))
            for obj in objs
            if self._exists(kind, obj.name) is None
        ]
        problems += [
            f"binding {s.name} is missing"
            for s in self._binding_states(topology)
            if s.status == "missing"
        ]
        return problems + self.stale_notes(destinations)

    def discover_destinations(self) -> list[str]:
        """Destinations whose work queues exist, when the management API can tell."""
        if self.management_problem:
            return []
        names = (q["name"] for q in self.management.queues(self.layout.work_queue("")))
        return sorted(d for n in names if (d := self.layout.destination_of(n)))

    def destroy(self, destinations: Iterable[str] = (), *, force: bool = False) -> list[str]:
        """Delete the prefix's objects; refuse while queues hold messages unless ``force``."""
        extra = [*destinations, *self.discover_destinations()]
        topology = self.topology(extra)
        counts = {q.name: self._exists("queue", q.name) for q in topology.queues}
        # the journal's records and checkpoints are history, not messages to deliver
        records = {q.name for q in topology.queues if q.role in ("journal", "checkpoints")}
        busy = {name: n for name, n in counts.items() if n and name not in records}
        if busy and not force:
            listed = ", ".join(f"{name} ({n})" for name, n in sorted(busy.items()))
            raise TopologyError(
                f"refusing to destroy: queues still hold messages: {listed}. "
                "Wait for them to drain, or pass --force to lose them"
            )
        deleted: list[str] = []
        channel = self._chan()
        for name, count in counts.items():
            if count is not None:
                channel.queue_delete(name)
                deleted.append(name)
        for exchange in topology.exchanges:
            if self._exists("exchange", exchange.name) is not None:
                self._chan().exchange_delete(exchange.name)
                deleted.append(exchange.name)
        # marks of destinations not held here, and of every destination destroyed (an
        # x-delay bridge's own, which stale_markers leaves alone, goes with its queue)
        declared = {e.name for e in topology.exchanges}
        marks = {self.layout.held_marker(d) for d in extra} | set(self.stale_markers(extra))
        for marker in sorted(marks - declared):
            if self._exists("exchange", marker) is not None:
                self._chan().exchange_delete(marker)
                deleted.append(marker)
        return deleted
