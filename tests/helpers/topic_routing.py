"""RabbitMQ's routing over a topology as data: where a message goes, hop by hop.

Pure: it reads :func:`rmqdelay.build_topology`'s exchanges, queues and bindings the way
the broker would, so the engine's properties and the protocol's vectors check a path
without a broker (tests/broker checks the broker does the same).
"""

from __future__ import annotations

from functools import cache

from rmqdelay.core.plan import DelayPlan
from rmqdelay.core.topology import Topology

__all__ = ["route", "topic_match", "walk"]


def topic_match(pattern: str, key: str) -> bool:
    """RabbitMQ's topic rule: ``*`` is one word, ``#`` is zero or more."""

    @cache
    def match(i: int, j: int) -> bool:
        if i == len(p):
            return j == len(k)
        if p[i] == "#":
            return any(match(i + 1, m) for m in range(j, len(k) + 1))
        return j < len(k) and (p[i] == "*" or p[i] == k[j]) and match(i + 1, j + 1)

    p, k = pattern.split("."), key.split(".")
    return match(0, 0)


def route(topology: Topology, exchange: str, key: str) -> list[str]:
    """The queues a message published to ``exchange`` with ``key`` lands in."""
    queues: list[str] = []
    for binding in topology.bindings:
        if binding.source != exchange:
            continue
        fanout = next(e for e in topology.exchanges if e.name == exchange).type == "fanout"
        if fanout or topic_match(binding.routing_key, key):
            if binding.destination_type == "queue":
                queues.append(binding.destination)
            else:
                queues.extend(route(topology, binding.destination, key))
    return queues


def walk(topology: Topology, plan: DelayPlan) -> tuple[list[str], str]:
    """Follow a message through publish and every dead-letter; return tiers and the end."""
    if plan.exchange == "":
        return [], plan.publish_key
    landed = route(topology, plan.exchange, plan.publish_key)
    visited: list[str] = []
    while True:
        assert len(landed) == 1, f"{plan.routing_key} routed to {landed}"
        queue = topology.queue(landed[0])
        if queue.role != "tier":
            return visited, queue.name
        visited.append(queue.name)
        assert len(visited) <= len(topology.queues), "routing loop"
        landed = route(topology, queue.arguments["x-dead-letter-exchange"], plan.routing_key)
