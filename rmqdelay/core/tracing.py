"""OpenTelemetry across the delay: the trace context of a message's creation travels in
its headers, so the handler that runs an hour later can link to it.

Active in a process that has imported OpenTelemetry (``pip install 'rmqdelay[otel]'``;
a service that sets up tracing imports it first), and free otherwise: nothing here is
imported then. Each publish makes a short ``create {destination}`` span (kind
``PRODUCER``, the messaging conventions' creation context) as a child of the caller's
current span, and injects its context with the global propagator (W3C ``traceparent``
by default). A message that carries a context already (a worker's retry, a forward, a
bridge's delivery) keeps it: every attempt links to the one publish.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

__all__ = ["SENT_AT", "TRACEPARENT", "active", "attributes", "created"]

TRACEPARENT = "traceparent"
SENT_AT = "rmqdelay-sent-at"
"""Unix ms of the publish, added with the context: the handler's span says the delay."""
TRACER = "rmqdelay"


def active() -> bool:
    """Whether this process has imported OpenTelemetry's API (and so may trace)."""
    return "opentelemetry.trace" in sys.modules


def attributes(destination: str, message_id: str, operation: str) -> dict[str, Any]:
    """The messaging semantic conventions' attributes of a span about one message."""
    return {
        "messaging.system": "rabbitmq",
        "messaging.operation.type": operation,
        "messaging.operation.name": operation,
        "messaging.destination.name": destination,
        "messaging.message.id": message_id,
    }


def created(
    headers: Mapping[str, Any] | None,
    destination: str,
    message_id: str,
    due_us: int,
    now_us: int,
) -> dict[str, Any]:
    """``headers`` with the creation context of this publish (and its time, Unix ms),
    unless they carry a context already."""
    out = dict(headers or {})
    if TRACEPARENT in out:
        return out
    from opentelemetry import propagate, trace

    tracer = trace.get_tracer(TRACER)
    fields = attributes(destination, message_id, "create")
    fields["rmqdelay.delay_ms"] = max(0, due_us - now_us) // 1000
    with tracer.start_as_current_span(
        f"create {destination}", kind=trace.SpanKind.PRODUCER, attributes=fields
    ):
        propagate.inject(out)
    if TRACEPARENT in out:
        out[SENT_AT] = now_us // 1000
    return out
