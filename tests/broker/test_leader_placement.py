"""Leader placement arguments: new queues get them; older queues are kept, not refused."""

from __future__ import annotations

import pytest

from rmqdelay import Settings, TopologyConflictError, TopologyManager


def _settings(amqp_url: str, prefix: str, **extra: object) -> Settings:
    return Settings(url=amqp_url, prefix=prefix, max_delay="10s", **extra)


def test_a_topology_declared_without_placement_is_kept_and_named(
    amqp_url: str, prefix: str
) -> None:
    old = _settings(amqp_url, prefix, queue_leader_locator="none")
    with TopologyManager(old) as manager:
        topology = manager.apply(["orders"])
        assert manager.placement_kept == []
    new = _settings(amqp_url, prefix, quorum_group_size=3)  # balanced, and a group size
    with TopologyManager(new) as manager:
        manager.apply(["orders"])
        kept = set(manager.placement_kept)
        states = {s.name: s for s in manager.plan(["orders"])}
    quorum = {q.name for q in topology.queues if q.arguments.get("x-queue-type") == "quorum"}
    assert kept == quorum
    assert all(states[name].status == "ok" and "rebalance" in states[name].detail for name in kept)


def test_another_difference_still_stops_apply_behind_a_placement_one(
    amqp_url: str, prefix: str
) -> None:
    with TopologyManager(_settings(amqp_url, prefix, queue_leader_locator="none")) as manager:
        manager.apply(["orders"])
    changed = _settings(amqp_url, prefix, delivery_limit=3)
    with TopologyManager(changed) as manager, pytest.raises(TopologyConflictError) as info:
        manager.apply(["orders"])
    assert info.value.argument == "x-delivery-limit"


def test_plan_shows_each_quorum_queues_leader(amqp_url: str, prefix: str) -> None:
    settings = _settings(amqp_url, prefix)
    with TopologyManager(settings) as manager:
        topology = manager.apply(["orders"])
        assert manager.management_problem is None  # the test broker has the API
        states = {s.name: s for s in manager.plan(["orders"])}
    quorum = [q.name for q in topology.queues if q.arguments.get("x-queue-type") == "quorum"]
    assert quorum
    assert all(states[name].detail.startswith("leader ") for name in quorum)
