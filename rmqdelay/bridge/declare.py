"""``rmqdelay bridge declare``: the x-delay bridge's objects on the broker (sync, pika),
and the check ``bridge run`` makes that they are there.

The destination's rmqdelay topology through :class:`TopologyManager`, then ``NAME``,
``DNAME``, the inbox and what leads to it (:func:`rmqdelay.bridge.names.bridge_topology`);
for a direct ``NAME`` its alternate-exchange policy, through the management API (AMQP
cannot set one). Idempotent. What it cannot fix, it reports: a queue still bound to
``NAME`` gets every message at once.
"""

from __future__ import annotations

import logging
import time
import urllib.error
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..amqp.blocking import close_connection
from ..amqp.connections import connect_blocking
from ..amqp.management import ManagementApi
from ..amqp.passive import exchange_exists, queue_exists
from ..amqp.topology_manager import TopologyManager
from ..errors import ConnectionFailedError, TopologyConflictError, TopologyError, WorkerError
from ..settings import Settings
from .names import BridgeNames, BridgeTopology, Policy, bridge_topology, unwanted_bindings

__all__ = ["BridgeDeclared", "check_declared", "declare_bridge", "missing_objects"]

POLICY_WAIT_S = 10.0
"""How long ``declare`` waits for the broker to apply the policy it set."""


@dataclass
class BridgeDeclared:
    """What ``declare`` did, and what it warns about."""

    names: BridgeNames
    topology: BridgeTopology
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def describe(self) -> list[str]:
        """What was declared, a line each: where to publish, where to bind, the notes."""
        names = self.names
        return [
            f"publishers send to {names.exchange!r} ({self.topology.exchange_type}, x-delay "
            f"in ms); bind consumers' queues to {names.delivery_exchange!r}",
            f"inbox {names.inbox!r}, destination {names.destination!r} (held: it comes to "
            "the bridge up to a few seconds early, which waits out the rest)",
            *self.notes,
        ]


def declare_bridge(settings: Settings, names: BridgeNames, exchange_type: str) -> BridgeDeclared:
    """Declare everything the bridge needs (see the module docstring); raise TopologyError
    naming what to fix when something is in the way."""
    topology = bridge_topology(settings.layout, names, exchange_type)
    declared = BridgeDeclared(names, topology)
    with TopologyManager(settings) as manager:
        manager.apply([names.destination])
        try:
            manager.declare(topology.objects)
        except TopologyConflictError as exc:
            raise _conflict(exc, names, topology) from None
        api = manager.management
        problem = manager.management_problem
    if topology.policy is not None:
        if problem:
            raise TopologyError(
                f"a direct exchange needs a policy to lead every message to the inbox, set "
                f"through the management API, which cannot be used: {problem}. Or set it "
                f"yourself: {topology.policy.command(api.vhost)}"
            )
        declared.notes.append(_set_policy(api, names, topology.policy))
    if problem:
        declared.warnings.append(
            f"cannot check what else is bound to {names.exchange!r} ({problem}): a queue "
            f"still bound there gets every message at once, undelayed"
        )
    else:
        declared.warnings += _bound_elsewhere(api, names)
    return declared


def _conflict(
    exc: TopologyConflictError, names: BridgeNames, topology: BridgeTopology
) -> Exception:
    if exc.name == names.exchange and exc.argument == "type" and "x-delayed-message" in exc.found:
        return TopologyError(
            f"exchange {names.exchange!r} is still the delayed-message plugin's "
            f"(x-delayed-message): drain it, delete it, then run bridge declare again "
            "(see docs/migration.md)"
        )
    if exc.name in (names.exchange, names.delivery_exchange):
        return TopologyError(
            f"exchange {exc.name!r} exists with {exc.argument}={exc.found}; the bridge "
            f"declares it {topology.exchange_type} and durable, as publishers of "
            f"x-delayed-type {topology.exchange_type} declare it: give --type its type, or "
            "delete it (after draining it)"
        )
    return exc


def _set_policy(api: ManagementApi, names: BridgeNames, policy: Policy) -> str:
    """Set the alternate-exchange policy unless an equivalent one applies; wait until the
    broker applies it. Refuse to take another policy's place: one policy applies to an
    exchange, so ours would silently drop what the other one sets."""
    vhost = api.vhost
    applied = _applied_policy(api, names.exchange)
    if applied and applied != policy.name:
        found = _policy(api, applied)
        wanted = dict(policy.definition)
        if found is not None and all(found.get(k) == v for k, v in wanted.items()):
            return f"policy {applied!r} on {names.exchange!r} already leads to {names.inbox!r}"
        raise TopologyError(
            f"exchange {names.exchange!r} has the policy {applied!r}, and RabbitMQ applies one "
            f'policy per exchange: add "alternate-exchange": {names.inbox!r} to its '
            f"definition, then run bridge declare again (the bridge's own would be: "
            f"{policy.command(vhost)})"
        )
    body = {
        "pattern": policy.pattern,
        "definition": dict(policy.definition),
        "apply-to": policy.apply_to,
        "priority": policy.priority,
    }
    try:
        api.send("PUT", api.path("policies", policy.name), body)
    except urllib.error.HTTPError as exc:
        refused = exc.code in (401, 403)
        why = "needs the policymaker (or administrator) tag" if refused else f"HTTP {exc.code}"
        raise TopologyError(
            f"cannot set the policy {policy.name!r} through the management API ({why}); "
            f"have an administrator run: {policy.command(vhost)}"
        ) from None
    deadline = time.monotonic() + POLICY_WAIT_S
    while (applied := _applied_policy(api, names.exchange)) != policy.name:
        if time.monotonic() > deadline:
            raise TopologyError(
                f"the broker set the policy {policy.name!r} but applies {applied!r} to "
                f"{names.exchange!r}: a policy of a higher priority matches it; give it "
                f'"alternate-exchange": {names.inbox!r}'
            )
        time.sleep(0.1)
    return f"policy {policy.name!r}: {names.exchange!r} leads every message to {names.inbox!r}"


def _applied_policy(api: ManagementApi, exchange: str) -> str | None:
    found = api.get(api.path("exchanges", exchange))
    policy = found.get("policy") if isinstance(found, Mapping) else None
    return str(policy) if policy else None


def _policy(api: ManagementApi, name: str) -> Mapping[str, Any] | None:
    try:
        found = api.get(api.path("policies", name))
    except urllib.error.HTTPError:
        return None
    definition = found.get("definition") if isinstance(found, Mapping) else None
    return definition if isinstance(definition, Mapping) else None


def _bound_elsewhere(api: ManagementApi, names: BridgeNames) -> list[str]:
    path = api.path("exchanges", names.exchange) + "/bindings/source"
    try:
        bindings = api.get(path)
    except (OSError, ValueError) as exc:
        return [f"cannot list the bindings of {names.exchange!r} ({exc})"]
    return [
        f"{kind} {name!r} is bound to {names.exchange!r} (key {key!r}): it gets every "
        f"message it matches at once, undelayed; bind it to {names.delivery_exchange!r} "
        f"instead and unbind it from {names.exchange!r}"
        for kind, name, key in unwanted_bindings(names, bindings)
    ]


def missing_objects(settings: Settings, names: BridgeNames) -> list[str]:
    """What ``bridge run`` needs and does not find (passive checks: no configure
    permission needed), each named; empty when all is there."""
    layout, timeout = settings.layout, settings.confirm_timeout
    quiet = logging.getLogger("pika.channel")  # it logs each 404 as a warning
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    connection = connect_blocking(settings, "bridge-check")
    try:
        missing = [
            f"queue {queue!r}"
            for queue in (names.inbox, layout.work_queue(names.destination))
            if not queue_exists(connection, queue, timeout)
        ]
        missing += [
            f"exchange {exchange!r}"
            for exchange in (names.exchange, names.delivery_exchange)
            if not exchange_exists(connection, exchange)
        ]
    finally:
        close_connection(connection, timeout)
        quiet.setLevel(level)
    return missing


def check_declared(settings: Settings, names: BridgeNames) -> None:
    """Name every object ``bridge declare`` makes that is missing, before ``bridge run``
    starts (the worker's own check would name only the work queue, and the wrong
    command). A broker that cannot be reached yet is left to the worker, which retries."""
    try:
        missing = missing_objects(settings, names)
    except ConnectionFailedError as exc:
        if not exc.transient:
            raise
        return
    if missing:
        raise WorkerError(
            f"the bridge for {names.exchange!r} is not declared ({', '.join(missing)} "
            f"missing): run `{names.declare_command}`"
        )
