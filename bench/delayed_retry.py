"""The worker's retries: rmqdelay's tiers against RabbitMQ 4.3's delayed retry, in one run.

    python -m bench.delayed_retry                  # the figures the README quotes
    python -m bench.delayed_retry --delays 1,5 --count 300 --rate 100 --burst 2000

Both designs run the same ``rmqdelay.Worker``, on one topology, side by side, alternating:

- ``tiers``: on its first attempt the handler raises ``Retry(delay=d)``: the worker
  publishes the next attempt through the delay tiers, waits for the confirm, then acks.
- ``queue``: the handler raises ``Requeue`` on the first delivery: the worker sends
  ``basic.reject``, and a policy on its work queue (``delayed-retry-type: failed``,
  ``delayed-retry-min`` = ``delayed-retry-max`` = d) makes the quorum queue hold the
  message d before it delivers it again (4.3: ``min(min * delivery-count, max)``).

Parts:

- ``lateness``: ``count`` messages falling due at a steady ``rate``; each fails once and
  is handled again after d. Lateness = handled again - (failed + d): p50, p99, max, early.
- ``burst``: ``burst`` messages due at once, each failing once with d = 1 s. Retries per
  second = burst / (last retry handled - first failure - d); the broker's CPU seconds
  per 1,000 messages over the run (its ``beam.smp``, found by its port; the broker may be
  shared, so this includes what else it did meanwhile).

Needs RabbitMQ 4.3 (on an older broker the policy keys are unknown and ``queue`` retries
at once: the module says so and stops) and its management API (for the policy). Every
object is made under a fresh ``bench-retry-<hex>`` prefix and deleted after, the policies
too. Results go to ``bench/results/delayed_retry.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from urllib.parse import quote

from bench.common import (
    DEFAULT_AMQP_URL,
    CpuMeter,
    Management,
    Record,
    broker_info,
    broker_pid,
    lateness_stats,
    machine_info,
    machine_load,
    median_of,
    now_ms,
)
from rmqdelay import (
    AsyncPublisher,
    Context,
    Requeue,
    Retry,
    Settings,
    TopologyManager,
    Worker,
    mask_url,
)

RESULTS = Path(__file__).resolve().parent / "results" / "delayed_retry.json"
DESIGNS = ("tiers", "queue")
LEAD_MS = 1000
"""The first message falls due this long after the publish starts."""


@dataclass
class Run:
    """One design's run: when each message failed, and when it was handled again."""

    design: str
    delay_ms: int
    failed: dict[str, int] = field(default_factory=dict)
    handled: dict[str, int] = field(default_factory=dict)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    expected: int = 0

    def records(self) -> list[Record]:
        return [
            Record(mid, self.failed[mid] + self.delay_ms, at, self.failed[mid])
            for mid, at in self.handled.items()
        ]


def _settings(url: str, prefix: str) -> Settings:
    return Settings(url=url, prefix=prefix, max_delay="10m", connection_name="bench-retry")


def _policy_name(prefix: str, destination: str) -> str:
    return f"{prefix}-{destination}"


@contextlib.contextmanager
def _delayed_retry(
    api: Management, settings: Settings, destination: str, delay_ms: int
) -> Iterator[None]:
    """The 4.3 delayed retry on one work queue, by policy, for the block."""
    queue = settings.layout.work_queue(destination)
    name = _policy_name(settings.layout.prefix, destination)
    path = f"policies/{quote(api.vhost, safe='')}/{quote(name, safe='')}"
    definition = {
        "delayed-retry-type": "failed",
        "delayed-retry-min": delay_ms,
        "delayed-retry-max": delay_ms,
    }
    body = {
        "pattern": "^" + queue.replace(".", "[.]") + "$",
        "definition": definition,
        "apply-to": "quorum_queues",
        "priority": 100,
    }
    api.call("PUT", path, body)
    try:
        deadline = time.monotonic() + 60
        where = f"queues/{quote(api.vhost, safe='')}/{quote(queue, safe='')}"
        while (api.get(where).get("effective_policy_definition") or {}) != definition:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the policy never reached {queue}")
            time.sleep(0.5)
        yield
    finally:
        api.call("DELETE", path)


def _app(settings: Settings, destination: str, run: Run) -> Worker:
    app = Worker(settings, max_attempts=2)

    @app.handler(destination)
    async def handle(body: bytes, ctx: Context) -> None:
        at = now_ms()
        mid = ctx.message_id
        if mid not in run.failed:
            run.failed[mid] = at
            if run.design == "tiers":
                raise Retry(delay=f"{run.delay_ms}ms")
            raise Requeue("bench: the queue's delayed retry")
        if mid not in run.handled:
            run.handled[mid] = at
            if len(run.handled) >= run.expected:
                run.done.set()

    return app


async def _one(
    settings: Settings,
    api: Management,
    design: str,
    delay_ms: int,
    count: int,
    rate: float | None,
    pid: int | None,
) -> dict[str, Any]:
    """One design's run: ``count`` messages due at ``rate`` per second (None: at once)."""
    destination = f"{design}-{uuid.uuid4().hex[:6]}"
    with TopologyManager(settings) as manager:
        manager.apply([destination])
    run = Run(design, delay_ms, expected=count)
    app = _app(settings, destination, run)
    spacing = 0.0 if rate is None else 1000.0 / rate
    requests = [
        {
            "destination": destination,
            "body": b"x" * 100,
            "delay": timedelta(milliseconds=LEAD_MS + i * spacing),
        }
        for i in range(count)
    ]
    policy = _delayed_retry(api, settings, destination, delay_ms) if design == "queue" else None
    with policy or contextlib.nullcontext():
        async with AsyncPublisher(settings) as publisher, app.running(concurrency=16):
            with CpuMeter({"broker": pid}) as cpu:
                await publisher.publish_many(requests)
                timeout = LEAD_MS / 1000 + count * spacing / 1000 + delay_ms / 1000 + 60
                await asyncio.wait_for(run.done.wait(), timeout)
    stats = lateness_stats(run.records(), expected=count).to_dict()
    first_failure = min(run.failed.values())
    last = max(run.handled.values())
    span_s = max(0.001, (last - first_failure - delay_ms) / 1000)
    broker_cpu = cpu.result.get("broker_cpu_s")
    return {
        **{k: stats[k] for k in ("count", "missing", "early", "p50_ms", "p99_ms", "max_ms")},
        "retries_per_s": round(count / span_s, 1),
        "broker_cpu_s_per_1000": None
        if broker_cpu is None
        else round(broker_cpu / count * 1000, 3),
    }


async def measure(
    url: str, delays_ms: list[int], count: int, rate: float, burst: int, repeats: int
) -> dict[str, Any]:
    info = await broker_info(url)
    version = tuple(int(p) for p in str(info.get("version", "0")).split(".")[:2] if p.isdigit())
    if version < (4, 3):
        raise SystemExit(f"bench.delayed_retry needs RabbitMQ 4.3 or later, not {info['version']}")
    settings = _settings(url, f"bench-retry-{uuid.uuid4().hex[:6]}")
    api = Management(url)
    pid = broker_pid(url)
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {}
    try:
        for label, delay, n, r in [
            *((f"lateness.d{d}", d, count, rate) for d in delays_ms),
            ("burst", 1000, burst, None),
        ]:
            runs[label] = {design: [] for design in DESIGNS}
            for round_ in range(repeats):
                order = DESIGNS if round_ % 2 == 0 else DESIGNS[::-1]
                for design in order:
                    result = await _one(settings, api, design, delay, n, r, pid)
                    runs[label][design].append(result)
                    print(f"{label} {design} round {round_ + 1}: {result}", flush=True)
    finally:
        with TopologyManager(settings) as manager:
            manager.destroy(force=True)
    medians = {
        label: {design: median_of(results) for design, results in by_design.items()}
        for label, by_design in runs.items()
    }
    return {"broker": info, "runs": runs, "medians": medians}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=DEFAULT_AMQP_URL)
    parser.add_argument("--delays", default="1,5,30", help="retry delays, seconds")
    parser.add_argument("--count", type=int, default=300, help="messages per lateness run")
    parser.add_argument("--rate", type=float, default=100.0, help="messages due per second")
    parser.add_argument("--burst", type=int, default=2000, help="messages in the burst run")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    delays = [int(float(d) * 1000) for d in args.delays.split(",")]
    logging.getLogger("rmqdelay").setLevel(logging.ERROR)  # a line per retry otherwise
    load = machine_load()
    results = asyncio.run(
        measure(args.url, delays, args.count, args.rate, args.burst, args.repeats)
    )
    results = {
        "when": datetime.now(timezone.utc).isoformat(),
        "machine": machine_info(),
        "load_before": load,
        "parameters": {**vars(args), "url": mask_url(args.url)},
        **results,
    }
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    for label, by_design in results["medians"].items():
        for design, m in by_design.items():
            print(
                f"{label:>14} {design:>5}: lateness p50 {m['p50_ms']:.0f} ms, p99 "
                f"{m['p99_ms']:.0f} ms, max {m['max_ms']:.0f} ms, early {m['early']}, "
                f"{m['retries_per_s']:.0f} retries/s, broker {m['broker_cpu_s_per_1000']} "
                "CPU s per 1,000"
            )
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
