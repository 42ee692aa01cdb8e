"""``rmqdelay consume`` on a held destination: what comes early is held unacked until
its ``rmqdelay-due-at`` and printed then, never before; at most ``max_held`` are held
(the rest waits in the queue); a message due now is not kept behind held ones."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pika

from rmqdelay import Publisher, Settings
from tests.helpers.cli import CLI, settings_env
from tests.helpers.worker_helpers import TestTopology, wait_until

EARLY_MS = 2400
"""Under the hold window (5.12 s): published straight to the work queue, 2.4 s early."""


class Queue:
    """The work queue's counts, read with passive declares on one connection."""

    def __init__(self, settings: Settings, destination: str) -> None:
        params = pika.URLParameters(settings.url.get_secret_value())
        self.connection = pika.BlockingConnection(params)
        self.channel = self.connection.channel()
        self.name = settings.layout.work_queue(destination)

    def counts(self) -> tuple[int, int]:
        """Ready messages, consumers."""
        ok = self.channel.queue_declare(self.name, passive=True).method
        return int(ok.message_count), int(ok.consumer_count)


@contextmanager
def consuming(
    settings: Settings, destination: str, count: int, max_held: str | None = None
) -> Iterator[tuple[subprocess.Popen[str], Queue]]:
    """``rmqdelay consume DESTINATION --count N --json`` in a process of its own, once
    it consumes; stopped at the end if it has not ended."""
    queue = Queue(settings, destination)
    process = subprocess.Popen(
        [*CLI, "consume", destination, "--count", str(count), "--timeout", "40", "--json"],
        env=settings_env(settings, max_held=max_held),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        asyncio.run(
            wait_until(
                lambda: queue.counts()[1] == 1 or process.poll() is not None,
                30,
                "consume to start consuming",
                0.1,
            )
        )
        assert process.poll() is None, process.communicate()
        yield process, queue
    finally:
        if process.poll() is None:
            process.terminate()
            process.wait(10)
        queue.connection.close()


def _lines(process: subprocess.Popen[str]) -> list[dict[str, Any]]:
    out, err = process.communicate(timeout=40)
    assert process.returncode == 0, err
    assert "held destination: messages come up to 5120 ms early" in err
    return [json.loads(line) for line in out.splitlines()]


def test_consume_prints_held_messages_when_due_and_a_due_one_at_once(
    shared_topology: TestTopology,
) -> None:
    dest = shared_topology.dest("shown")
    settings = shared_topology.settings([dest], held_destinations=[dest])
    with consuming(settings, dest, 4) as (process, queue), Publisher(settings) as publisher:
        held = [publisher.publish(dest, f"h{n}", delay=f"{EARLY_MS}ms") for n in range(3)]
        assert all(r.hops == 0 for r in held)  # held: straight to the work queue, early
        now = publisher.publish(dest, "now", delay=0)
        lines = _lines(process)
        assert queue.counts()[0] == 0
    assert lines[0]["body"] == "now"  # not kept behind the held ones
    assert lines[0]["received_at_ms"] < min(r.due_at_ms for r in held)
    by_id = {line["message_id"]: line for line in lines}
    for result in [*held, now]:
        line = by_id[result.message_id]
        assert line["due_at_ms"] == result.due_at_ms
        assert line["lateness_ms"] >= 0, line  # never printed early
        assert line["lateness_ms"] < 2000, line


def test_consume_holds_at_most_max_held(shared_topology: TestTopology) -> None:
    dest = shared_topology.dest("bounded")
    settings = shared_topology.settings([dest], held_destinations=[dest])
    with consuming(settings, dest, 5, max_held="2") as (process, queue):
        with Publisher(settings) as publisher:
            results = [publisher.publish(dest, f"h{n}", delay=f"{EARLY_MS}ms") for n in range(5)]
        # prefetch 1 + max_held: three taken, two left in the queue until some are due
        first_due = min(r.due_at_ms for r in results)
        seen: list[int] = []

        def two_wait() -> bool:
            seen.append(queue.counts()[0])
            return seen[-1] == 2

        asyncio.run(wait_until(two_wait, EARLY_MS / 1000 - 0.5, lambda: f"ready {seen[-5:]}"))
        assert min(seen) >= 2, seen  # never more than three taken before the first is due
        lines = _lines(process)
    assert len(lines) == 5
    assert all(line["lateness_ms"] >= 0 for line in lines), lines
    assert min(line["received_at_ms"] for line in lines) >= first_due
