"""The x-delay bridge's names and objects, pure: what ``bridge declare`` makes and
``bridge run`` expects, derived from ``NAME`` alone unless given.

``NAME`` is where the delayed-message plugin's publishers send, with ``x-delay``;
``DNAME`` where the messages come out when due; between them an inbox queue every
message sent to ``NAME`` reaches, and a destination of rmqdelay's own (its tiers and
work queue). No I/O: :mod:`rmqdelay.bridge.declare` carries it out on a broker.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ..core.layout import Layout
from ..core.routing import validate_destination
from ..core.topology import (
    BRIDGE_MARKER_ARGUMENT,
    Binding,
    Exchange,
    Queue,
    Topology,
    queue_arguments,
)
from ..errors import ConfigurationError

__all__ = [
    "DELIVERY_SUFFIX",
    "EXCHANGE_TYPES",
    "BridgeNames",
    "BridgeTopology",
    "ExchangeType",
    "Policy",
    "bridge_names",
    "bridge_topology",
    "unwanted_bindings",
]

ExchangeType = Literal["direct", "topic", "fanout", "headers"]
EXCHANGE_TYPES: tuple[ExchangeType, ...] = ("direct", "topic", "fanout", "headers")
DELIVERY_SUFFIX = ".delayed"
"""``DNAME`` is ``NAME`` + this unless given: where consumers' queues bind."""

_WORD = re.compile(r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$")
_NOT_WORD = re.compile(r"[^A-Za-z0-9_-]+")
_DESTINATION_HEAD = "bridge."


@dataclass(frozen=True)
class BridgeNames:
    """Every name one bridge uses; the same for ``bridge declare`` and ``bridge run``."""

    exchange: str
    """``NAME``: where publishers send, with ``x-delay``."""
    delivery_exchange: str
    """``DNAME``: where the messages come out when due; consumers bind their queues here."""
    destination: str
    """The rmqdelay destination the messages wait for (stage 2 consumes its work queue)."""
    inbox: str
    """The quorum queue every message sent to ``NAME`` reaches, whatever its routing key;
    for a direct ``NAME``, also the fanout exchange its alternate-exchange policy names
    and the policy itself."""

    @property
    def policy(self) -> str:
        return self.inbox

    @property
    def declare_command(self) -> str:
        """What makes the bridge's objects: named wherever one is found missing."""
        command = f"rmqdelay bridge declare --exchange {self.exchange} --type TYPE"
        if self.delivery_exchange != self.exchange + DELIVERY_SUFFIX:
            command += f" --delivery-exchange {self.delivery_exchange}"
        return command


def _check_exchange(what: str, name: str) -> str:
    if not isinstance(name, str) or not name:
        raise ConfigurationError(f"{what} must be a non-empty exchange name, got {name!r}")
    if len(name.encode()) > 255:
        raise ConfigurationError(f"{what} {name[:40]!r}... is over AMQP's 255 bytes")
    if name.startswith("amq."):
        raise ConfigurationError(f"{what} {name!r}: names starting with 'amq.' are RabbitMQ's")
    return name


def default_destination(layout: Layout, exchange: str) -> str:
    """``bridge.NAME``; a ``NAME`` with characters a destination cannot hold (or too long)
    is cleaned, with a hash of the name so that two exchanges never share one."""
    whole = _DESTINATION_HEAD + exchange
    if _WORD.fullmatch(exchange) and len(whole.encode()) <= layout.max_destination_length:
        return whole
    digest = hashlib.sha256(exchange.encode()).hexdigest()[:10]
    words = [w for w in _NOT_WORD.sub("-", exchange).split("-") if w] or ["x"]
    room = layout.max_destination_length - len(_DESTINATION_HEAD) - len(digest) - 1
    stem = "-".join(words)[: max(room, 1)].strip("-") or "x"
    return f"{_DESTINATION_HEAD}{stem}-{digest}"


def bridge_names(
    layout: Layout,
    exchange: str,
    *,
    delivery_exchange: str | None = None,
    destination: str | None = None,
) -> BridgeNames:
    """Check the names and derive the defaults: ``DNAME = NAME.delayed``, the destination
    ``bridge.NAME``, the inbox ``{prefix}.{destination}.inbox``."""
    _check_exchange("--exchange", exchange)
    delivery = delivery_exchange if delivery_exchange is not None else exchange + DELIVERY_SUFFIX
    _check_exchange("--delivery-exchange", delivery)
    if delivery == exchange:
        raise ConfigurationError(
            f"the delivery exchange must differ from the exchange publishers use ({exchange!r}):"
            " a queue bound there would get every message at once"
        )
    if destination is None:
        destination = default_destination(layout, exchange)
    validate_destination(layout, destination)
    inbox = f"{layout.prefix}.{destination}.inbox"
    if len(inbox.encode()) > 255:
        raise ConfigurationError(f"the inbox queue name {inbox[:60]!r}... is over 255 bytes")
    return BridgeNames(exchange, delivery, destination, inbox)


@dataclass(frozen=True)
class Policy:
    """An ``alternate-exchange`` policy: a direct exchange cannot bind "every key", so its
    unroutable messages (all of them, while no queue is bound to it) go to the inbox.

    A policy, not an exchange argument: publishers that still declare ``NAME`` would fail
    on an argument they do not give (``inequivalent arg 'alternate-exchange'``); a policy
    is not part of that comparison.
    """

    name: str
    pattern: str
    definition: Mapping[str, Any]
    apply_to: str = "exchanges"
    priority: int = 0

    def command(self, vhost: str) -> str:
        """The rabbitmqctl line that sets it by hand."""
        definition = json.dumps(dict(self.definition), separators=(",", ":"))
        return (
            f"rabbitmqctl set_policy -p {_quoted(vhost)} --apply-to {self.apply_to} "
            f"--priority {self.priority} {_quoted(self.name)} {_quoted(self.pattern)} "
            f"{_quoted(definition)}"
        )


def _quoted(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


@dataclass(frozen=True)
class BridgeTopology:
    """What ``bridge declare`` creates besides the destination's own rmqdelay topology:
    ``NAME`` and ``DNAME`` (durable, no arguments: as publishers and consumers declare
    them), the inbox, what leads to it, and for a direct ``NAME`` its policy."""

    exchange_type: ExchangeType
    objects: Topology
    policy: Policy | None = None


def bridge_topology(layout: Layout, names: BridgeNames, exchange_type: str) -> BridgeTopology:
    """What leads every message to the inbox: a binding that matches everything (topic
    ``#``, fanout, headers with ``x-match: all`` and nothing to match), or for direct the
    alternate-exchange policy and a fanout of the inbox's name."""
    if exchange_type not in EXCHANGE_TYPES:
        raise ConfigurationError(
            f"bad exchange type {exchange_type!r}: use the x-delayed-type your publishers "
            f"declared, one of {', '.join(EXCHANGE_TYPES)}"
        )
    kind: ExchangeType = exchange_type
    arguments = queue_arguments(layout, layout.queue_type, layout.parking)
    if layout.queue_type == "quorum":
        # a message the bridge fails on, again and again, is parked by the broker
        arguments["x-delivery-limit"] = layout.delivery_limit
    exchanges = [Exchange(names.exchange, kind), Exchange(names.delivery_exchange, kind)]
    # the destination is the bridge's alone: stage 2, rmqdelay's worker, waits out the
    # last stretch, so its messages skip the lowest digits (docs/protocol.md, §10)
    marker = {BRIDGE_MARKER_ARGUMENT: names.exchange}
    exchanges.append(Exchange(layout.held_marker(names.destination), "fanout", marker))
    queues = (Queue(names.inbox, "inbox", arguments),)
    policy = None
    if kind == "direct":
        exchanges.append(Exchange(names.inbox, "fanout"))
        binding = Binding(names.inbox, names.inbox, "queue", "")
        pattern = "^" + re.escape(names.exchange) + "$"
        policy = Policy(names.policy, pattern, {"alternate-exchange": names.inbox})
    else:
        key = "#" if kind == "topic" else ""
        args = {"x-match": "all"} if kind == "headers" else {}
        binding = Binding(names.exchange, names.inbox, "queue", key, args)
    return BridgeTopology(kind, Topology(tuple(exchanges), queues, (binding,)), policy)


def unwanted_bindings(
    names: BridgeNames, bindings: list[Mapping[str, Any]]
) -> list[tuple[str, str, str]]:
    """Bindings from ``NAME`` to anything but the inbox, as the management API lists them:
    (destination type, destination, routing key). Such a queue gets every message it
    matches at once, undelayed; it should bind to ``DNAME`` instead."""
    found = []
    for b in bindings:
        if b.get("source") != names.exchange:
            continue
        if b.get("destination") == names.inbox and b.get("destination_type") == "queue":
            continue
        found.append(
            (str(b.get("destination_type")), str(b.get("destination")), str(b.get("routing_key")))
        )
    return sorted(found)
