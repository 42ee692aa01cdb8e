"""Delayed publish with confirms against raw aio-pika to one plain queue, side by side.

Both sides send the same bodies, persistent, mandatory, with confirms and the same
window of messages in flight, alternating in one run so that a busy moment of the
machine hits both. Prints the rates, the median of the repeats and their ratio.

    python -m bench.publish_rate --count 5000 --repeats 3 --queue-type quorum
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aio_pika

from bench.common import CpuMeter, broker_pid, idle_cpu_rate
from rmqdelay import AsyncPublisher, Publisher, Settings, TopologyManager
from rmqdelay.core.outgoing import Outgoing, PublisherCore

BODY = b"x" * 100


class Timed:
    """Wall and client-CPU seconds of a block (CPU: this whole process, every thread)."""

    def __enter__(self) -> Timed:
        self._wall, self._cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self._wall
        self.cpu = time.process_time() - self._cpu


LAST_CPU_US: dict[str, float] = {}
"""Client CPU microseconds per message of the last run of each kind (raw, async, sync)."""


async def raw_rate(url: str, queue_type: str, count: int, window: int) -> float:
    """The limit: confirmed, mandatory, persistent publishes to one plain queue."""
    name = f"bench-plain-{uuid.uuid4().hex[:6]}"
    connection = await aio_pika.connect(url)
    try:
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        try:
            return await _raw_publish(channel, name, queue_type, count, window)
        finally:  # a fresh channel: the publishing one may be closed after an error
            cleanup = await connection.channel()
            await cleanup.queue_delete(name)
    finally:
        await connection.close()


async def _raw_publish(
    channel: aio_pika.abc.AbstractChannel, name: str, queue_type: str, count: int, window: int
) -> float:
    await channel.declare_queue(name, durable=True, arguments={"x-queue-type": queue_type})
    exchange = channel.default_exchange

    async def one(i: int) -> None:
        message = aio_pika.Message(
            BODY, delivery_mode=aio_pika.DeliveryMode.PERSISTENT, message_id=str(uuid.uuid4())
        )
        await exchange.publish(message, routing_key=name, mandatory=True)

    with Timed() as t:
        for base in range(0, count, window):
            await asyncio.gather(*(one(i) for i in range(base, min(count, base + window))))
    LAST_CPU_US["raw"] = t.cpu / count * 1e6
    return count / t.wall


def _requests(count: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)  # long delays, so nothing is delivered during the run
    return [
        {"destination": "bench", "body": BODY, "delay": rng.uniform(600, 3600)}
        for _ in range(count)
    ]


async def async_rate(
    settings: Settings, count: int, window: int, *, delay: bool = True, kind: str = "async"
) -> float:
    async with AsyncPublisher(settings, window=window) as publisher:
        requests = _requests(count, 1)
        if not delay:
            for request in requests:
                request["delay"] = 0
        with Timed() as t:
            await publisher.publish_many(requests)
        LAST_CPU_US[kind] = t.cpu / count * 1e6
        return count / t.wall


def sync_rate(settings: Settings, count: int, window: int) -> float:
    with Publisher(settings, window=window) as publisher:
        requests = _requests(count, 2)
        with Timed() as t:
            publisher.publish_many(requests)
        LAST_CPU_US["sync"] = t.cpu / count * 1e6
        return count / t.wall


async def raw_to_tiers_rate(settings: Settings, count: int, window: int) -> float:
    """Diagnostic: raw aio-pika sending exactly rmqdelay's messages (planned beforehand).

    Same exchange, routing keys, headers, properties and order (by due time) as the async
    publisher, none of its per-message work: the broker-side cost of the tiers, separated
    from the client's.
    """
    core = PublisherCore(settings.layout)
    batch = [core.prepare(**r) for r in _requests(count, 3)]
    outs = [core.finalize(batch[i]) for i in core.send_order(batch)]
    connection = await aio_pika.connect(settings.url)
    try:
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        exchanges = {
            name: await channel.get_exchange(name, ensure=False)
            for name in {o.exchange for o in outs}
        }

        async def one(out: Outgoing) -> None:
            message = aio_pika.Message(
                out.prepared.body,
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                message_id=out.message_id,
                headers=out.headers,
                content_type=out.prepared.content_type,
            )
            await exchanges[out.exchange].publish(
                message, routing_key=out.routing_key, mandatory=True
            )

        with Timed() as t:
            for base in range(0, count, window):
                await asyncio.gather(*(one(o) for o in outs[base : base + window]))
        LAST_CPU_US["raw-tiers"] = t.cpu / count * 1e6
        return count / t.wall
    finally:
        await connection.close()


REFERENCE = "raw aio-pika"
DIAGNOSTICS = (
    "diag: raw aio-pika, rmqdelay's messages to the tiers",
    "diag: rmqdelay async, delay 0",
)


async def run(
    url: str,
    queue_type: str,
    count: int,
    repeats: int,
    window: int,
    warmup: int = 0,
    *,
    diagnostics: bool = False,
) -> dict[str, Any]:
    """Every variant once per repeat, alternating; medians and ratios to raw aio-pika.

    ``diagnostics`` adds two variants that split the async publisher's gap: raw aio-pika
    sending rmqdelay's own messages (broker side) and the async publisher with delay 0,
    straight to the work queue (client side, no tiers).
    """
    settings = Settings(
        url=url,
        prefix=f"bench-rmqdelay-{uuid.uuid4().hex[:6]}",
        queue_type=queue_type,
        destinations=[],
    )
    variants: dict[str, tuple[str, Callable[[int], Awaitable[float]]]] = {
        REFERENCE: ("raw", lambda n: raw_rate(url, queue_type, n, window)),
        "rmqdelay async": ("async", lambda n: async_rate(settings, n, window)),
        "rmqdelay sync": ("sync", lambda n: asyncio.to_thread(sync_rate, settings, n, window)),
    }
    if diagnostics:
        variants[DIAGNOSTICS[0]] = ("raw-tiers", lambda n: raw_to_tiers_rate(settings, n, window))
        variants[DIAGNOSTICS[1]] = (
            "async-0",
            lambda n: async_rate(settings, n, window, delay=False, kind="async-0"),
        )
    rates: dict[str, list[float]] = {name: [] for name in variants}
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    broker_cpu: dict[str, list[float | None]] = {name: [] for name in variants}
    pid = broker_pid()
    with TopologyManager(settings) as manager:
        manager.apply(["bench"])
        try:
            if warmup:  # untimed: connections, channels and the fresh queues warm up
                for _kind, fn in variants.values():
                    await fn(warmup)
            for _ in range(repeats):
                for name, (kind, fn) in variants.items():
                    # The broker is shared: subtract what it burns with nothing from us.
                    idle = await idle_cpu_rate(pid)
                    with CpuMeter({"broker": pid}) as meter:
                        rates[name].append(round(await fn(count), 1))
                    cpu[name].append(round(LAST_CPU_US[kind], 1))
                    used = meter.result.get("broker_cpu_s")
                    if used is not None and idle is not None:
                        used -= idle * meter.result["wall_s"]
                    broker_cpu[name].append(None if used is None else round(used / count * 1e6, 1))
        finally:
            manager.destroy(["bench"], force=True)
    medians = {name: statistics.median(values) for name, values in rates.items()}
    reference = medians[REFERENCE]
    return {
        "queue_type": queue_type,
        "count": count,
        "repeats": repeats,
        "window": window,
        "warmup": warmup,
        "rates": rates,
        "median": medians,
        "ratio": {name: value / reference for name, value in medians.items()},
        "client_cpu_us_per_msg": cpu,
        "client_cpu_us_per_msg_median": {n: statistics.median(v) for n, v in cpu.items()},
        "broker_cpu_us_per_msg": broker_cpu,
        "broker_cpu_us_per_msg_median": {
            n: statistics.median([x for x in v if x is not None]) if any(v) else None
            for n, v in broker_cpu.items()
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--window", type=int, default=500)
    parser.add_argument("--queue-type", choices=["quorum", "classic"], default="quorum")
    parser.add_argument("--diagnostics", action="store_true", help="split the async gap")
    parser.add_argument("--json", type=Path, help="also write the result here")
    args = parser.parse_args()
    url = os.environ.get("RMQDELAY_URL", "amqp://guest:guest@localhost:5672/%2F")
    result = asyncio.run(
        run(
            url,
            args.queue_type,
            args.count,
            args.repeats,
            args.window,
            diagnostics=args.diagnostics,
        )
    )
    print(f"publish rate, {args.count} messages x {args.repeats}, {args.queue_type} queues")
    for name, median in result["median"].items():
        runs = ", ".join(f"{r:,.0f}" for r in result["rates"][name])
        print(
            f"  {name:52} median {median:8,.0f} msg/s  ratio {result['ratio'][name]:.2f}  "
            f"cpu {result['client_cpu_us_per_msg_median'][name]:.0f} us/msg, broker "
            f"{result['broker_cpu_us_per_msg_median'][name] or 0:.0f} us/msg  ({runs})"
        )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
