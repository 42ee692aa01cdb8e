"""The parking queue's delivery limit, and which differences of an existing queue are kept."""

from __future__ import annotations

from rmqdelay import Settings
from rmqdelay.core.topology import (
    PARKING_DELIVERY_LIMIT,
    PLACEMENT_ARGUMENTS,
    build_topology,
    kept_difference,
)


def test_a_quorum_parking_queue_declares_the_largest_delivery_limit() -> None:
    layout = Settings(max_delay="10s").layout
    parking = build_topology(layout, ["orders"]).queue(layout.parking)
    # read and returned by `parked list`: 4.0's default of 20 would drop it at the 21st
    assert parking.arguments["x-delivery-limit"] == PARKING_DELIVERY_LIMIT == 2**31 - 1
    assert "x-dead-letter-exchange" not in parking.arguments  # nowhere further to go


def test_a_classic_parking_queue_has_no_delivery_limit() -> None:
    layout = Settings(max_delay="10s", queue_type="classic").layout
    parking = build_topology(layout).queue(layout.parking)
    assert "x-delivery-limit" not in parking.arguments


def test_only_the_parking_queue_lacking_a_limit_is_kept() -> None:
    layout = Settings(max_delay="10s").layout
    topology = build_topology(layout, ["orders"])
    parking = topology.queue(layout.parking)
    work = topology.queue(layout.work_queue("orders"))
    assert kept_difference(parking, "x-delivery-limit", missing=True) == "delivery-limit"
    # another limit was set by someone on purpose; a work queue's limit is a setting
    assert kept_difference(parking, "x-delivery-limit", missing=False) is None
    assert kept_difference(work, "x-delivery-limit", missing=True) is None
    assert kept_difference(parking, "x-queue-type", missing=True) is None
    for argument in PLACEMENT_ARGUMENTS:
        assert kept_difference(work, argument, missing=False) == "placement"
        assert kept_difference(parking, argument, missing=True) == "placement"
