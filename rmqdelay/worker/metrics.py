"""Prometheus metrics of workers; ``rmqdelay worker --metrics-port`` serves them."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import Counter, Gauge, Histogram, start_http_server

from ..core.clock import seconds_of_ms
from ..core.status import PastDueWatch, Status
from .delivery import Delivery
from .hooks import Settled, WorkerHook

__all__ = [
    "CONSUMER_TIMEOUTS",
    "HANDLED",
    "HANDLER_SECONDS",
    "HELD",
    "KEYS_PENDING",
    "KEY_DROPS",
    "LATENESS",
    "PARKED",
    "PAST_DUE",
    "PAST_DUE_SECONDS",
    "RECURRING_OCCURRENCES",
    "RECURRING_SCHEDULES",
    "SCHEDULED",
    "MetricsHook",
    "refresh_queue_gauges",
    "serve_metrics",
]
log = logging.getLogger("rmqdelay.worker")

HANDLED = Counter(
    "rmqdelay_messages",
    "Messages a worker finished with, by destination and outcome "
    "(acked, retried, requeued, parked, cancelled, dropped, forwarded).",
    ["destination", "outcome"],
)
LATENESS = Histogram(
    "rmqdelay_lateness_seconds",
    "How long after its due time a handler started on a message.",
    ["destination"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
)
HANDLER_SECONDS = Histogram(
    "rmqdelay_handler_seconds",
    "How long handlers ran.",
    ["destination"],
)
CONSUMER_TIMEOUTS = Counter(
    "rmqdelay_consumer_timeouts",
    "Messages the broker took back from a worker past the consumer timeout, while their "
    "handler ran or their redelivery waited for it (RabbitMQ 4.3 cancels the consumer; "
    "before, it closes the channel).",
    ["destination"],
)
HELD = Gauge(
    "rmqdelay_held_messages",
    "Messages a worker holds unacked until their due time (they came early: a held "
    "destination's up to its hold window), by destination.",
    ["destination"],
)
KEY_DROPS = Counter(
    "rmqdelay_key_drops",
    "Deliveries a worker acked without handling them because the schedule journal says "
    "another copy is (or was) the one (keys, reschedules, recurring schedules), by "
    "destination and reason (duplicate, ignored, replaced, claimed-elsewhere, ...).",
    ["destination", "reason"],
)


_COUNTED = frozenset(
    ("acked", "retried", "requeued", "parked", "cancelled", "dropped", "forwarded")
)


class MetricsHook(WorkerHook):
    """Count each message's outcome, how late it came and how long its handler ran.

    Each labelled child is looked up once per destination (and outcome) and kept:
    ``labels()`` costs a lock and a tuple per call, three times a message otherwise.
    """

    def __init__(self) -> None:
        self._lateness: dict[str, Any] = {}
        self._seconds: dict[str, Any] = {}
        self._handled: dict[tuple[str, str], Any] = {}

    def before_handle(self, delivery: Delivery) -> bool:
        late = delivery.lateness_ms
        if late is not None:
            child = self._lateness.get(delivery.destination)
            if child is None:
                child = self._lateness[delivery.destination] = LATENESS.labels(delivery.destination)
            child.observe(seconds_of_ms(max(0, late)))
        return False

    def after_settle(self, delivery: Delivery, settled: Settled) -> None:
        destination = delivery.destination
        if settled.seconds is not None:
            child = self._seconds.get(destination)
            if child is None:
                child = self._seconds[destination] = HANDLER_SECONDS.labels(destination)
            child.observe(settled.seconds)
        outcome = settled.outcome
        if outcome in _COUNTED:  # not "returned": it comes again, and counts then
            key = (destination, outcome)
            counter = self._handled.get(key)
            if counter is None:
                counter = self._handled[key] = HANDLED.labels(destination, outcome)
            counter.inc()
            if outcome == "dropped":
                KEY_DROPS.labels(destination, settled.reason or "unknown").inc()


def serve_metrics(port: int, addr: str = "0.0.0.0") -> None:
    """Serve ``/metrics`` over HTTP from a daemon thread."""
    start_http_server(port, addr=addr)


SCHEDULED = Gauge(
    "rmqdelay_scheduled_messages",
    "Messages waiting in a delay tier (as `rmqdelay status --prometheus` shows them).",
    ["prefix", "tier", "ttl_ms"],
)
PARKED = Gauge("rmqdelay_parked_messages", "Messages in the parking queue.", ["prefix"])
PAST_DUE = Gauge(
    "rmqdelay_past_due_messages",
    "Expired messages a delay tier holds until the next queue takes them (the management "
    "API's messages_dlx; absent while it cannot be read).",
    ["prefix", "tier", "ttl_ms"],
)
PAST_DUE_SECONDS = Gauge(
    "rmqdelay_past_due_seconds",
    "How long, at least, a delay tier has held past-time messages in every refresh of "
    "these gauges (0: none; absent while unknown).",
    ["prefix", "tier", "ttl_ms"],
)


def _forget(gauge: Gauge, labels: tuple[str, ...]) -> None:
    """Remove a gauge's sample, set or not: prometheus-client 0.20 (the lowest allowed)
    raises KeyError for a label set it never held (a tier first seen with an unknown
    count), which would stop every refresh at that tier."""
    with contextlib.suppress(KeyError):
        gauge.remove(*labels)


def set_queue_gauges(status: Status) -> None:
    """Set the gauges from a snapshot; a count it cannot tell removes its gauge (no
    stale value, no false 0: an alert on ``absent()`` sees it)."""
    for tier in status.tiers:
        labels = (status.prefix, tier.queue, str(tier.ttl_ms))
        if tier.messages is not None:
            SCHEDULED.labels(*labels).set(tier.messages)
        if tier.past_due is None:
            _forget(PAST_DUE, labels)
        else:
            PAST_DUE.labels(*labels).set(tier.past_due)
        if tier.past_due_for_s is None:
            _forget(PAST_DUE_SECONDS, labels)
        else:
            PAST_DUE_SECONDS.labels(*labels).set(tier.past_due_for_s)
    if status.parked is not None:
        PARKED.labels(status.prefix).set(status.parked)


def refresh_queue_gauges(
    snapshot: Callable[[], Status], every: float, stop: threading.Event
) -> threading.Thread:
    """Keep the tier and parking gauges fresh from a daemon thread, every ``every`` s.

    ``rmqdelay_past_due_seconds`` comes from watching the snapshots (see
    :class:`~rmqdelay.core.status.PastDueWatch`): it counts from the first refresh that
    found past-time messages in a tier, so it is as fine as ``every``. Past-time counts
    need the management API; a snapshot over AMQP leaves those gauges absent. A failed
    snapshot is logged and tried again next time: metrics never stop a worker.
    """
    watch = PastDueWatch()

    def loop() -> None:
        while True:
            try:
                set_queue_gauges(watch.observe(snapshot(), time.monotonic()))
            except Exception as exc:  # the broker may be away; the worker copes with that
                log.warning("could not refresh the queue gauges: %s", exc)
            if stop.wait(every):
                return

    thread = threading.Thread(target=loop, name="rmqdelay-queue-gauges", daemon=True)
    thread.start()
    return thread


KEYS_PENDING = Gauge(
    "rmqdelay_keys_pending",
    "Keys a pending message holds, as the worker's journal tail has read them (keyed "
    "publishes: one message per key and generation).",
)
RECURRING_SCHEDULES = Gauge(
    "rmqdelay_recurring_schedules",
    "Recurring schedules by state (active, paused), as the worker's journal tail has "
    "read them: control records and occurrences.",
    ["state"],
)
RECURRING_OCCURRENCES = Counter(
    "rmqdelay_recurring_occurrences",
    "Occurrences of recurring schedules a worker admitted, by destination and state: "
    "active (next one published, handler called), paused (next one published, not "
    "handled), removed or replaced (dropped, the chain ends).",
    ["destination", "state"],
)
