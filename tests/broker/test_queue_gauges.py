"""The worker's gauges of scheduled, past-time and parked messages follow the broker's
counts; a tier stuck past its time is timed."""

from __future__ import annotations

import threading
import time

from prometheus_client import REGISTRY

from rmqdelay import Publisher
from rmqdelay.amqp.status import gather_status
from rmqdelay.core.plan import plan_delay
from rmqdelay.worker.metrics import refresh_queue_gauges
from tests.helpers.brokerctl import BrokerAdmin
from tests.helpers.stuck_hop import stuck_hop, stuck_hop_settings
from tests.helpers.worker_helpers import make_settings

DEST = "gauged"


def test_the_gauges_show_what_waits_in_the_tiers_and_parking(amqp_url: str, prefix: str) -> None:
    settings = make_settings(amqp_url, prefix, [DEST], max_delay="10m")
    with Publisher(settings) as publisher:
        publisher.publish_many({"destination": DEST, "body": b"x", "delay": "5m"} for _ in range(4))
    tier = plan_delay(settings.layout, 300_000_000, DEST).hops[0]
    labels = {"prefix": prefix, "tier": tier.queue, "ttl_ms": str(tier.ttl_ms)}
    stop = threading.Event()
    thread = refresh_queue_gauges(lambda: gather_status(settings, use_management=False), 0.2, stop)
    try:
        deadline = time.monotonic() + 10
        while REGISTRY.get_sample_value("rmqdelay_scheduled_messages", labels) != 4:
            assert time.monotonic() < deadline, "the tier gauge never showed 4"
            time.sleep(0.05)
        assert REGISTRY.get_sample_value("rmqdelay_parked_messages", {"prefix": prefix}) == 0
        # passive declares count no past-time messages: the gauges are absent, not 0
        assert REGISTRY.get_sample_value("rmqdelay_past_due_messages", labels) is None
        assert REGISTRY.get_sample_value("rmqdelay_past_due_seconds", labels) is None
    finally:
        stop.set()
        thread.join(5)
    assert not thread.is_alive()


def test_the_gauges_count_and_time_a_tier_stuck_past_its_time(
    amqp_url: str, prefix: str, admin: BrokerAdmin
) -> None:
    settings = stuck_hop_settings(amqp_url, prefix, DEST)
    with stuck_hop(settings, admin, DEST, 2) as tier:
        labels = {"prefix": prefix, "tier": tier, "ttl_ms": "1000"}
        other = {**labels, "tier": settings.layout.tiers[-1].queue}
        other["ttl_ms"] = str(settings.layout.tiers[-1].ttl_ms)
        stop = threading.Event()
        thread = refresh_queue_gauges(
            lambda: gather_status(settings, journal_oldest=False), 0.2, stop
        )
        try:
            deadline = time.monotonic() + 10
            while (REGISTRY.get_sample_value("rmqdelay_past_due_seconds", labels) or 0) < 1.0:
                assert time.monotonic() < deadline, "the stuck tier was never timed past 1 s"
                time.sleep(0.05)
            assert REGISTRY.get_sample_value("rmqdelay_past_due_messages", labels) == 2
            assert REGISTRY.get_sample_value("rmqdelay_scheduled_messages", labels) == 0
            assert REGISTRY.get_sample_value("rmqdelay_past_due_messages", other) == 0
            assert REGISTRY.get_sample_value("rmqdelay_past_due_seconds", other) == 0
        finally:
            stop.set()
            thread.join(5)
        assert not thread.is_alive()
