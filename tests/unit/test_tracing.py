"""The publish side of tracing without a broker: every way of publishing carries the
creation context (``publish``, and ``publish_many``'s plain requests, which skip the
general checks otherwise), in a fresh interpreter with OpenTelemetry's SDK, so that the
rest of the suite never traces (tests/broker/test_tracing.py: the worker's side)."""

from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = """
import json
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
from rmqdelay.testing import InMemoryPublisher

stub = InMemoryPublisher()
stub.publish("orders", b"one", delay="1m")
stub.publish_many([{"destination": "orders", "body": b"two", "delay": "2m"}])
stub.publish("orders", b"three", delay="3m", headers={"traceparent": "kept"})
print(json.dumps({
    "headers": [dict(m.headers) for m in stub.sent],
    "spans": [(s.name, s.attributes["rmqdelay.delay_ms"]) for s in exporter.get_finished_spans()],
}, default=str))
"""


def test_every_publish_carries_its_creation_context() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    said = json.loads(done.stdout)
    assert said["spans"] == [["create orders", 60_000], ["create orders", 120_000]]
    one, two, three = said["headers"]
    for headers in (one, two):
        assert headers["traceparent"].startswith("00-") and "rmqdelay-sent-at" in headers
    assert three["traceparent"] == "kept" and "rmqdelay-sent-at" not in three
