"""Counting parked messages per destination, and how the snapshot carries it, without a broker."""

from __future__ import annotations

import json
from dataclasses import replace

from rmqdelay import Settings
from rmqdelay.core.status import QueueCounts, build_status, count_parked


def test_count_parked_sorts_destinations_and_keeps_the_nameless_apart() -> None:
    breakdown = count_parked(["b", "a", None, "b", "a", "b"], total=6)
    assert breakdown.destinations == {"a": 2, "b": 3}
    assert list(breakdown.destinations) == ["a", "b"]
    assert breakdown.unknown == 1
    assert breakdown.read == 6
    assert breakdown.complete


def test_a_peek_that_read_less_than_the_queue_holds_says_so() -> None:
    breakdown = count_parked(["a", "a"], total=5)
    assert breakdown.read == 2
    assert not breakdown.complete
    assert count_parked([], total=0).complete  # an empty parking queue: nothing to miss


def test_the_json_has_the_breakdown_only_when_it_was_asked_for() -> None:
    layout = Settings(prefix="shop", max_delay="10m").layout
    counts = {layout.parking: QueueCounts(3)}
    plain = build_status(layout, counts, [], "test")
    assert json.loads(json.dumps(plain.to_json()))["parked_by_destination"] is None
    asked = replace(plain, parked_by_destination=count_parked(["orders", None, "orders"], 3))
    data = json.loads(json.dumps(asked.to_json()))
    assert data["parked"] == 3
    assert data["parked_by_destination"] == {
        "read": 3,
        "complete": True,
        "destinations": {"orders": 2},
        "unknown": 1,
    }
