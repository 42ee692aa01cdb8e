"""Publishing with confirms: rmqdelay's publishers against the raw clients, side by side.

Every variant sends the same 100-byte bodies, persistent, mandatory, with confirms and
the same window of messages in flight, alternating in one run so that a busy moment of
the machine hits all of them. The references publish into one plain queue:

- raw pika with pipelined confirms (the limit for a Python client), for the sync
  publisher, and raw pika waiting for each confirm, for a single ``publish()``;
- raw aio-pika, for the async publisher; raw aiormq (aio-pika's transport) beside it.

Diagnostic rows split a gap: raw pika sending rmqdelay's own planned messages into the
tiers (the broker's cost of the tiers, without rmqdelay's client work), and rmqdelay
with delay 0 (one work queue: rmqdelay's client work without the tiers). Prints rates,
medians, each row's ratio to its reference, and client and broker CPU per message.

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
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import aio_pika
import aiormq
import pika
import pika.channel
import pika.frame
from pamqp.commands import Basic

from bench.common import CpuMeter, broker_pid, idle_cpu_rate
from rmqdelay import AsyncPublisher, Publisher, Settings, TopologyManager
from rmqdelay.amqp.publisher import pika_properties
from rmqdelay.core.outgoing import PublisherCore

BODY = b"x" * 100
SINGLE_SHARE = 5
"""The single-publish rows send count / SINGLE_SHARE messages: one round trip each."""


class Timed:
    """Wall and client-CPU seconds of a block (CPU: this whole process, every thread)."""

    def __enter__(self) -> Timed:
        self._wall, self._cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self._wall
        self.cpu = time.process_time() - self._cpu


LAST_CPU_US: dict[str, float] = {}
"""Client CPU microseconds per message of the last run of each kind."""


def _timed(kind: str, count: int, t: Timed) -> float:
    LAST_CPU_US[kind] = t.cpu / count * 1e6
    return count / t.wall


# ---------------------------------------------------------------------- raw pika

Item = tuple[str, str, pika.BasicProperties | None, bytes]
"""exchange, routing key, properties (None: persistent, a fresh message id), body."""


def _plain_items(name: str, count: int) -> list[Item]:
    return [("", name, None, BODY) for _ in range(count)]


def _pika_publish(
    url: str,
    items: Sequence[Item],
    window: int,
    *,
    declare: str | None = None,
    queue_type: str = "quorum",
    kind: str,
    calls: int = 0,
) -> float:
    """Raw pika, pipelined confirms: publish on the channel, pump the I/O loop while
    ``window`` confirms are outstanding (the technique rmqdelay's sync publisher uses).

    ``calls``: instead, send the items in that many equal groups and wait for every
    confirm of a group before the next (what one ``publish()`` with its journal record is).
    """
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        if declare:
            channel.queue_declare(declare, durable=True, arguments={"x-queue-type": queue_type})
        impl: pika.channel.Channel = channel._impl  # type: ignore[attr-defined]
        pending: set[int] = set()
        failed: list[str] = []

        def on_confirm(frame: pika.frame.Method[Any]) -> None:
            method = frame.method
            done = (
                [t for t in pending if t <= method.delivery_tag]
                if method.multiple
                else [method.delivery_tag]
            )
            pending.difference_update(done)
            if isinstance(method, pika.spec.Basic.Nack):
                failed.append("nack")

        ready: list[bool] = []
        impl.confirm_delivery(ack_nack_callback=on_confirm, callback=lambda _f: ready.append(True))
        impl.add_on_return_callback(lambda *_a: failed.append("returned"))
        loop = connection._impl.ioloop  # type: ignore[attr-defined]

        def pump(until: Callable[[], bool]) -> None:
            while not until():
                loop.poll()
                loop.process_timeouts()

        pump(lambda: bool(ready))
        with Timed() as t:
            for tag, (exchange, key, props, body) in enumerate(items, 1):
                if props is None:
                    props = pika.BasicProperties(delivery_mode=2, message_id=str(uuid.uuid4()))
                impl.basic_publish(exchange, key, body, props, True)
                pending.add(tag)
                if calls and tag % (len(items) // calls) == 0:
                    pump(lambda: not pending)
                elif len(pending) >= window:
                    pump(lambda: len(pending) < window)
            pump(lambda: not pending)
        if failed:
            raise RuntimeError(f"raw pika: {len(failed)} not confirmed ({failed[0]})")
        if declare:
            channel.queue_delete(declare)
        return _timed(kind, calls or len(items), t)
    finally:
        if connection.is_open:
            connection.close()


def raw_pika_rate(url: str, count: int, window: int, queue_type: str = "quorum") -> float:
    name = f"bench-plain-{uuid.uuid4().hex[:6]}"
    items = _plain_items(name, count)
    return _pika_publish(url, items, window, declare=name, queue_type=queue_type, kind="pika")


def _pika_single(
    url: str, items: Sequence[Item], *, declare: str | None = None, queue_type: str, kind: str
) -> float:
    """One confirm per publish: BlockingChannel waits for each, as ``publish()`` does."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        if declare:
            channel.queue_declare(declare, durable=True, arguments={"x-queue-type": queue_type})
        channel.confirm_delivery()
        with Timed() as t:
            for exchange, key, props, body in items:
                if props is None:
                    props = pika.BasicProperties(delivery_mode=2, message_id=str(uuid.uuid4()))
                channel.basic_publish(exchange, key, body, props, mandatory=True)
        if declare:
            channel.queue_delete(declare)
        return _timed(kind, len(items), t)
    finally:
        if connection.is_open:
            connection.close()


def raw_pika_single_rate(url: str, count: int, queue_type: str = "quorum") -> float:
    name = f"bench-plain-{uuid.uuid4().hex[:6]}"
    items = _plain_items(name, count)
    return _pika_single(url, items, declare=name, queue_type=queue_type, kind="pika-single")


def _planned_items(settings: Settings, count: int, seed: int, records: bool = False) -> list[Item]:
    """rmqdelay's own messages, planned beforehand: the same exchanges, routing keys,
    property bytes and order (by due time) as the sync publisher sends; ``records``: each
    followed by its own schedule-journal record, as one ``publish()`` sends them."""
    core = PublisherCore(settings.layout)
    batch = [core.prepare(**r) for r in _requests(count, seed)]
    prepared = [batch[i] for i in core.send_order(batch)]
    if records:
        prepared = [q for p in prepared for q in (p, core.journal_write([p]))]
    outs = [core.finalize(p) for p in prepared]
    return [(o.exchange, o.routing_key, pika_properties(o.prepared), o.prepared.body) for o in outs]


def raw_pika_to_tiers_rate(settings: Settings, count: int, window: int) -> float:
    """Diagnostic: raw pika sending exactly rmqdelay's messages, with none of its client
    work: the broker's cost of the tiers, separated."""
    return _pika_publish(
        settings.url.get_secret_value(),
        _planned_items(settings, count, 3),
        window,
        kind="pika-tiers",
    )


def raw_pika_single_journal_rate(settings: Settings, count: int) -> float:
    """Diagnostic: one call = rmqdelay's message and its journal record, both confirmed."""
    items = _planned_items(settings, count, 4, records=True)
    return _pika_publish(
        settings.url.get_secret_value(), items, 2, kind="pika-single-journal", calls=count
    )


def raw_pika_single_to_tiers_rate(settings: Settings, count: int) -> float:
    """Diagnostic: the same, one confirm per publish (what ``publish()`` costs the broker)."""
    items = _planned_items(settings, count, 4)
    return _pika_single(
        settings.url.get_secret_value(),
        items,
        queue_type=settings.queue_type,
        kind="pika-single-tiers",
    )


# ---------------------------------------------------------------------- raw asyncio


async def raw_aio_pika_rate(url: str, count: int, window: int, queue_type: str = "quorum") -> float:
    """Confirmed, mandatory, persistent publishes to one plain queue, with aio-pika."""
    name = f"bench-plain-{uuid.uuid4().hex[:6]}"
    connection = await aio_pika.connect(url)
    try:
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        await channel.declare_queue(name, durable=True, arguments={"x-queue-type": queue_type})
        exchange = channel.default_exchange

        async def one() -> None:
            message = aio_pika.Message(
                BODY, delivery_mode=aio_pika.DeliveryMode.PERSISTENT, message_id=str(uuid.uuid4())
            )
            await exchange.publish(message, routing_key=name, mandatory=True)

        with Timed() as t:
            for base in range(0, count, window):
                await asyncio.gather(*(one() for _ in range(base, min(count, base + window))))
        cleanup = await connection.channel()
        await cleanup.queue_delete(name)
        return _timed("aio-pika", count, t)
    finally:
        await connection.close()


async def raw_aiormq_rate(url: str, count: int, window: int, queue_type: str = "quorum") -> float:
    """aio-pika's transport alone: ``aiormq.Channel.basic_publish`` without waiting for
    each write to drain, the confirms awaited a window at a time."""
    name = f"bench-plain-{uuid.uuid4().hex[:6]}"
    connection = await aiormq.connect(url)
    try:
        channel = await connection.channel(publisher_confirms=True)
        await channel.queue_declare(name, durable=True, arguments={"x-queue-type": queue_type})

        async def one() -> None:
            props = Basic.Properties(delivery_mode=2, message_id=str(uuid.uuid4()))
            publish: Any = channel.basic_publish  # ``wait`` is aiormq 7's, not in its abc
            await publish(BODY, routing_key=name, properties=props, mandatory=True, wait=False)

        with Timed() as t:
            for base in range(0, count, window):
                await asyncio.gather(*(one() for _ in range(base, min(count, base + window))))
        await channel.queue_delete(name)
        return _timed("aiormq", count, t)
    finally:
        await connection.close()


# ---------------------------------------------------------------------- rmqdelay


def _requests(count: int, seed: int, delay: bool = True) -> list[dict[str, Any]]:
    rng = random.Random(seed)  # long delays, so nothing is delivered during the run
    return [
        {"destination": "bench", "body": BODY, "delay": rng.uniform(600, 3600) if delay else 0}
        for _ in range(count)
    ]


async def async_rate(
    settings: Settings, count: int, window: int, *, kind: str, delay: bool = True
) -> float:
    async with AsyncPublisher(settings, window=window) as publisher:
        requests = _requests(count, 1, delay)
        with Timed() as t:
            await publisher.publish_many(requests)
        return _timed(kind, count, t)


def sync_rate(
    settings: Settings, count: int, window: int, *, kind: str, delay: bool = True
) -> float:
    with Publisher(settings, window=window) as publisher:
        requests = _requests(count, 2, delay)
        with Timed() as t:
            publisher.publish_many(requests)
        return _timed(kind, count, t)


def sync_send_phase_rate(settings: Settings, count: int, window: int) -> float:
    """Diagnostic: the sync publisher's ``publish_many`` less its validate-first phase.

    The batch is validated, prepared and ordered (``PublisherCore.prepare``, ``send_order``)
    before the clock starts; the clock runs what ``publish_many`` does after that (the
    checks, the journal records, the send and every confirm).
    """
    with Publisher(settings, window=window) as publisher:
        core = publisher.core
        batch = [core.prepare(**r) for r in _requests(count, 2)]
        ordered = [batch[i] for i in core.send_order(batch)]
        with Timed() as t:
            publisher._run(core._send(ordered))
        return _timed("sync-send", count, t)


def sync_single_rate(settings: Settings, count: int, kind: str = "sync-single") -> float:
    """``publish()`` one message at a time: one confirm per call."""
    with Publisher(settings) as publisher:
        requests = _requests(count, 4)
        with Timed() as t:
            for request in requests:
                publisher.publish(**request)
        return _timed(kind, count, t)


RAW_PIKA = "raw pika"
RAW_AIO_PIKA = "raw aio-pika"
RAW_PIKA_SINGLE = "raw pika, one confirm per publish"
REFERENCE = RAW_AIO_PIKA
"""Kept for readers of older result files: their single reference."""
DIAGNOSTICS = (
    "diag: raw pika, rmqdelay's messages to the tiers",
    "diag: rmqdelay sync, delay 0",
    "diag: rmqdelay async, delay 0",
    "diag: raw pika, one confirm per publish, rmqdelay's messages to the tiers",
    "diag: raw pika, one call = a message to the tiers and its journal record",
    "diag: rmqdelay sync, send phase alone (the batch prepared before the clock)",
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
    """Every variant once per repeat, alternating; medians and ratios to each reference.

    ``diagnostics`` adds rows that split a gap (see the module docstring) and raw aiormq.
    """
    on = Settings(
        url=url,
        prefix=f"bench-rmqdelay-{uuid.uuid4().hex[:6]}",
        queue_type=queue_type,
        destinations=[],
    )
    off = on.model_copy(update={"schedule_journal": False})
    single = max(1, count // SINGLE_SHARE)
    thread = asyncio.to_thread
    # name -> (kind for the CPU figure, reference row, count, the run)
    variants: dict[str, tuple[str, str, int, Callable[[int], Awaitable[float]]]] = {
        RAW_PIKA: (
            "pika",
            RAW_PIKA,
            count,
            lambda n: thread(raw_pika_rate, url, n, window, queue_type),
        ),
        RAW_AIO_PIKA: (
            "aio-pika",
            RAW_AIO_PIKA,
            count,
            lambda n: raw_aio_pika_rate(url, n, window, queue_type),
        ),
        "rmqdelay sync": (
            "sync",
            RAW_PIKA,
            count,
            lambda n: thread(sync_rate, on, n, window, kind="sync"),
        ),
        "rmqdelay sync, journal off": (
            "sync-off",
            RAW_PIKA,
            count,
            lambda n: thread(sync_rate, off, n, window, kind="sync-off"),
        ),
        "rmqdelay async": (
            "async",
            RAW_AIO_PIKA,
            count,
            lambda n: async_rate(on, n, window, kind="async"),
        ),
        "rmqdelay async, journal off": (
            "async-off",
            RAW_AIO_PIKA,
            count,
            lambda n: async_rate(off, n, window, kind="async-off"),
        ),
        RAW_PIKA_SINGLE: (
            "pika-single",
            RAW_PIKA_SINGLE,
            single,
            lambda n: thread(raw_pika_single_rate, url, n, queue_type),
        ),
        "rmqdelay sync publish(), one at a time": (
            "sync-single",
            RAW_PIKA_SINGLE,
            single,
            lambda n: thread(sync_single_rate, on, n),
        ),
    }
    variants["rmqdelay sync publish(), journal off"] = (
        "sync-single-off",
        RAW_PIKA_SINGLE,
        single,
        lambda n: thread(sync_single_rate, off, n, kind="sync-single-off"),
    )
    if diagnostics:
        variants["raw aiormq"] = (
            "aiormq",
            RAW_AIO_PIKA,
            count,
            lambda n: raw_aiormq_rate(url, n, window, queue_type),
        )
        variants[DIAGNOSTICS[0]] = (
            "pika-tiers",
            RAW_PIKA,
            count,
            lambda n: thread(raw_pika_to_tiers_rate, on, n, window),
        )
        variants[DIAGNOSTICS[1]] = (
            "sync-0",
            RAW_PIKA,
            count,
            lambda n: thread(sync_rate, on, n, window, kind="sync-0", delay=False),
        )
        variants[DIAGNOSTICS[2]] = (
            "async-0",
            RAW_AIO_PIKA,
            count,
            lambda n: async_rate(on, n, window, kind="async-0", delay=False),
        )
        variants[DIAGNOSTICS[3]] = (
            "pika-single-tiers",
            RAW_PIKA_SINGLE,
            single,
            lambda n: thread(raw_pika_single_to_tiers_rate, on, n),
        )
        variants[DIAGNOSTICS[4]] = (
            "pika-single-journal",
            RAW_PIKA_SINGLE,
            single,
            lambda n: thread(raw_pika_single_journal_rate, on, n),
        )
        variants[DIAGNOSTICS[5]] = (
            "sync-send",
            RAW_PIKA,
            count,
            lambda n: thread(sync_send_phase_rate, on, n, window),
        )
    rates: dict[str, list[float]] = {name: [] for name in variants}
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    broker_cpu: dict[str, list[float | None]] = {name: [] for name in variants}
    pid = broker_pid(url)
    with TopologyManager(on) as manager:
        manager.apply(["bench"])
        try:
            if warmup:  # untimed: connections, channels and the fresh queues warm up
                for _kind, _ref, n, fn in variants.values():
                    await fn(min(n, warmup))
            for _ in range(repeats):
                for name, (kind, _ref, n, fn) in variants.items():
                    # The broker is shared: subtract what it burns with nothing from us.
                    idle = await idle_cpu_rate(pid)
                    with CpuMeter({"broker": pid}) as meter:
                        rates[name].append(round(await fn(n), 1))
                    cpu[name].append(round(LAST_CPU_US[kind], 1))
                    used = meter.result.get("broker_cpu_s")
                    if used is not None and idle is not None:
                        used -= idle * meter.result["wall_s"]
                    broker_cpu[name].append(None if used is None else round(used / n * 1e6, 1))
        finally:
            manager.destroy(["bench"], force=True)
    medians = {name: statistics.median(values) for name, values in rates.items()}
    reference_of = {name: ref for name, (_k, ref, _n, _f) in variants.items()}
    return {
        "queue_type": queue_type,
        "count": count,
        "single_count": single,
        "repeats": repeats,
        "window": window,
        "warmup": warmup,
        "rates": rates,
        "median": medians,
        "reference_of": reference_of,
        "ratio": {name: medians[name] / medians[reference_of[name]] for name in medians},
        "ratio_to_raw_pika": {name: medians[name] / medians[RAW_PIKA] for name in medians},
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
            f"  {name:52} median {median:8,.0f} msg/s  ratio {result['ratio'][name]:.2f} "
            f"(to {result['reference_of'][name]})  "
            f"cpu {result['client_cpu_us_per_msg_median'][name]:.0f} us/msg, broker "
            f"{result['broker_cpu_us_per_msg_median'][name] or 0:.0f} us/msg  ({runs})"
        )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
