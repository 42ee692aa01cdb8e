"""A process that sets up OpenTelemetry's SDK with an in-memory exporter, publishes one
message inside a span of its own, runs a worker whose handler fails its first attempt,
and prints every finished span as JSON: ``tests/broker/test_tracing.py`` runs it in a
fresh interpreter, so that the rest of the suite never traces.

    python -m tests.helpers.traced_worker DESTINATION   (settings from RMQDELAY_*)
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

EXPORTER = InMemorySpanExporter()
PROVIDER = TracerProvider()
PROVIDER.add_span_processor(SimpleSpanProcessor(EXPORTER))
trace.set_tracer_provider(PROVIDER)

import rmqdelay  # noqa: E402  (after the provider, as a service sets it up)


async def main(destination: str) -> None:
    settings = rmqdelay.Settings()
    app = rmqdelay.Worker(settings)
    attempts: list[int] = []

    @app.handler(destination, max_attempts=3, backoff=rmqdelay.Backoff.schedule(["300ms"]))
    async def handle(_body: Any, ctx: rmqdelay.Context) -> None:
        attempts.append(ctx.attempt)
        with trace.get_tracer("handler").start_as_current_span("inner"):
            if ctx.attempt == 1:
                raise ConnectionError("downstream unavailable")

    async with rmqdelay.AsyncPublisher(settings) as publisher, app.running(concurrency=2):
        with trace.get_tracer("service").start_as_current_span("checkout"):
            await publisher.publish(destination, {"order": 42}, delay="500ms")
        for _ in range(200):
            if attempts == [1, 2] and len(EXPORTER.get_finished_spans()) >= 6:
                break
            await asyncio.sleep(0.05)
    spans = [
        {
            "name": span.name,
            "kind": span.kind.name,
            "trace": span.context.trace_id,
            "id": span.context.span_id,
            "parent": span.parent.span_id if span.parent is not None else None,
            "links": [link.context.span_id for link in span.links],
            "attributes": dict(span.attributes or {}),
            "status": span.status.status_code.name,
            "events": [event.name for event in span.events],
        }
        for span in EXPORTER.get_finished_spans()
    ]
    print(json.dumps({"attempts": attempts, "spans": spans}))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
