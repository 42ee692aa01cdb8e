"""Traces across the delay, with OpenTelemetry's SDK and its in-memory exporter: the
publish's ``create`` span is a child of the caller's, its context travels in the
headers, and each attempt's ``process`` span links to it (a retry too), with the
messaging attributes, the delay, the lateness and the attempt; the handler's own spans
are the process span's children. In a fresh interpreter (tests.helpers.traced_worker):
a process that never imports OpenTelemetry never traces."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from tests.helpers.cli import settings_env
from tests.helpers.worker_helpers import TestTopology


def test_a_handler_span_links_to_the_publish_across_a_retry(
    shared_topology: TestTopology,
) -> None:
    dest = shared_topology.dest("traced")
    env = settings_env(shared_topology.settings([dest]))
    done = subprocess.run(
        [sys.executable, "-m", "tests.helpers.traced_worker", dest],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    said = json.loads(done.stdout.strip().splitlines()[-1])
    assert said["attempts"] == [1, 2]
    spans = said["spans"]
    by_name: dict[str, list[dict[str, Any]]] = {}
    for span in spans:
        by_name.setdefault(span["name"], []).append(span)
    [checkout] = by_name["checkout"]
    [create] = by_name[f"create {dest}"]
    assert create["kind"] == "PRODUCER" and create["parent"] == checkout["id"]
    assert create["attributes"]["messaging.system"] == "rabbitmq"
    assert create["attributes"]["messaging.operation.type"] == "create"
    assert create["attributes"]["messaging.destination.name"] == dest
    assert create["attributes"]["rmqdelay.delay_ms"] == 500
    processes = sorted(
        by_name[f"process {dest}"], key=lambda s: s["attributes"]["rmqdelay.attempt"]
    )
    assert [p["attributes"]["rmqdelay.attempt"] for p in processes] == [1, 2]
    message_id = create["attributes"]["messaging.message.id"]
    for process in processes:
        assert process["kind"] == "CONSUMER"
        assert process["links"] == [create["id"]]  # a link, not a child: a trace of its own
        assert process["parent"] is None and process["trace"] != create["trace"]
        fields = process["attributes"]
        assert fields["messaging.operation.type"] == "process"
        assert fields["messaging.destination.name"] == dest
        assert fields["messaging.message.id"] == message_id
        assert fields["rmqdelay.lateness_ms"] >= 0
    first, second = processes
    # from the publish to each attempt's due time (whole ms: the due time's, rounded up)
    assert 500 <= first["attributes"]["rmqdelay.delay_ms"] <= 501
    assert second["attributes"]["rmqdelay.delay_ms"] >= 800  # and the retry's 300 ms
    assert first["attributes"]["rmqdelay.outcome"] == "retried" and first["status"] == "ERROR"
    assert "exception" in first["events"]
    assert second["attributes"]["rmqdelay.outcome"] == "acked" and second["status"] == "UNSET"
    inner = by_name["inner"]
    assert sorted(s["parent"] for s in inner) == sorted(p["id"] for p in processes)


def test_rmqdelay_never_imports_opentelemetry_itself() -> None:
    code = (
        "import sys, rmqdelay, rmqdelay.worker.runner, rmqdelay.amqp.aio_publisher; "
        "print(any(m.startswith('opentelemetry') for m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.strip() == "False", done.stderr
