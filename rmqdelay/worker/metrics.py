"""Prometheus metrics of workers; ``rmqdelay worker --metrics-port`` serves them."""

from __future__ import annotations

from prometheus_client import Counter, Histogram, start_http_server

__all__ = ["HANDLED", "HANDLER_SECONDS", "LATENESS", "serve_metrics"]

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
