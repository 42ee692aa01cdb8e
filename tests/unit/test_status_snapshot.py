"""The status snapshot, built from counts and rendered, without a broker."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from rmqdelay import Settings
from rmqdelay.core.status import QueueCounts, build_status, prometheus_text


def test_a_snapshot_sums_tiers_and_names_what_is_missing() -> None:
    layout = Settings(prefix="shop", max_delay="10m").layout
    first, second, *_ = layout.tiers
    counts = {
        first.queue: QueueCounts(3),
        second.queue: QueueCounts(4),
        layout.work_queue("orders"): QueueCounts(7, ready=5, unacked=2, consumers=1),
        layout.parking: QueueCounts(1),
    }
    status = build_status(layout, counts, ["orders", "gone"], "test")
    assert status.scheduled == 7
    assert status.parked == 1
    assert [(d.destination, d.ready, d.unacked) for d in status.destinations] == [
        ("orders", 5, 2),
        ("gone", None, None),
    ]
    assert layout.work_queue("gone") in status.missing
    assert "shop.schedule" in status.missing  # the journal is on by default
    assert status.to_json()["scheduled"] == 7


def test_the_prometheus_text_parses_into_the_three_gauges() -> None:
    layout = Settings(prefix="shop", max_delay="10m").layout
    tier = layout.tiers[0]
    counts = {
        tier.queue: QueueCounts(3),
        layout.work_queue("orders"): QueueCounts(2, ready=2, unacked=0),
        layout.parking: QueueCounts(4),
    }
    text = prometheus_text(build_status(layout, counts, ["orders"], "test"))
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    tier_labels = (("prefix", "shop"), ("tier", tier.queue), ("ttl_ms", str(tier.ttl_ms)))
    assert samples[("rmqdelay_scheduled_messages", tier_labels)] == 3
    assert samples[("rmqdelay_parked_messages", (("prefix", "shop"),))] == 4
    ready = (("destination", "orders"), ("prefix", "shop"), ("state", "ready"))
    assert samples[("rmqdelay_work_queue_messages", ready)] == 2
