"""Prometheus metrics of workers; ``rmqdelay worker --metrics-port`` serves them."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from prometheus_client import Counter, Gauge, Histogram, start_http_server

from ..core.status import Status

__all__ = [
    "HANDLED",
    "HANDLER_SECONDS",
    "LATENESS",
    "PARKED",
    "SCHEDULED",
    "refresh_queue_gauges",
    "serve_metrics",
]
log = logging.getLogger("rmqdelay.worker")

HANDLED = Counter(
    "rmqdelay_messages",
    "Messages a worker finished with, by destination and outcome "
    "(acked, retried, requeued, parked, cancelled).",
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


def serve_metrics(port: int, addr: str = "0.0.0.0") -> None:
    """Serve ``/metrics`` over HTTP from a daemon thread."""
    start_http_server(port, addr=addr)


SCHEDULED = Gauge(
    "rmqdelay_scheduled_messages",
    "Messages waiting in a delay tier (as `rmqdelay status --prometheus` shows them).",
    ["prefix", "tier", "ttl_ms"],
)
PARKED = Gauge("rmqdelay_parked_messages", "Messages in the parking queue.", ["prefix"])


def set_queue_gauges(status: Status) -> None:
    for tier in status.tiers:
        if tier.messages is not None:
            SCHEDULED.labels(status.prefix, tier.queue, str(tier.ttl_ms)).set(tier.messages)
    if status.parked is not None:
        PARKED.labels(status.prefix).set(status.parked)


def refresh_queue_gauges(
    snapshot: Callable[[], Status], every: float, stop: threading.Event
) -> threading.Thread:
    """Keep the tier and parking gauges fresh from a daemon thread, every ``every`` s.

    A failed snapshot is logged and tried again next time: metrics never stop a worker.
    """

    def loop() -> None:
        while True:
            try:
                set_queue_gauges(snapshot())
            except Exception as exc:  # the broker may be away; the worker copes with that
                log.warning("could not refresh the queue gauges: %s", exc)
            if stop.wait(every):
                return

    thread = threading.Thread(target=loop, name="rmqdelay-queue-gauges", daemon=True)
    thread.start()
    return thread
