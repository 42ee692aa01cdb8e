"""Publish and worker measures, each under a short stable key, on public APIs only.

rmqdelay is driven through what ``rmqdelay`` exports (``Publisher``, ``AsyncPublisher``,
``Worker``, ``TopologyManager``, ``Settings``); the references through pika's and aio-pika's
public APIs. So the same code measures any source tree of rmqdelay (``bench.compare``).

Every publish sends 100-byte bodies, persistent, mandatory, with confirms and the same
window in flight. The references publish into one plain queue: raw pika (its asynchronous
adapter, pipelined confirms), raw pika waiting for each confirm (for one ``publish()``),
raw aio-pika (for the async publisher). ``long`` delays are 10 min to 1 h (nothing moves
during the run); ``short`` is delay 0 (straight to the work queue: rmqdelay's client work
without the tiers). ``worker.drain.noop``: 20,000 messages already due, drained by
``rmqdelay.Worker`` with a no-op handler, first to last handled (``.default``: at the
worker's default concurrency and prefetch); its reference ``worker.drain.raw`` drains as
many from one plain queue with a bare aio-pika consumer acking each, at the same prefetch.

    python -m bench.measures --count 5000 --repeats 3     # every measure, alternating
    python -m bench.measures --keys publish.sync.many.long,worker.drain.noop --json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aio_pika
import pika
import pika.channel
import pika.frame
import pika.spec

from bench.common import DEFAULT_AMQP_URL, CpuMeter, broker_pid, idle_cpu_rate
from rmqdelay import AsyncPublisher, Publisher, Settings, TopologyManager, Worker, plan_delay

BODY = b"x" * 100
Delays = tuple[float, float] | None
"""Request delays uniform in (low, high) seconds, or None for 0."""
DEST = "bench"
LONG: Delays = (600.0, 3600.0)
"""Nothing moves during a run: the tiers only take messages in."""
MID: Delays = (1.0, 600.0)
"""Messages start to hop during the run, as a service's usual delays do."""
SINGLE_SHARE = 5
"""The single-publish measures send count / SINGLE_SHARE messages: one round trip each."""


@dataclass
class Sizes:
    count: int = 5000
    window: int = 500
    drain: int = 20_000
    concurrency: int = 64
    prefetch: int = 256

    @property
    def single(self) -> int:
        return max(1, self.count // SINGLE_SHARE)


@dataclass
class Run:
    """One timed run: messages, wall seconds and this process's CPU seconds."""

    count: int
    wall: float
    cpu: float

    @property
    def rate(self) -> float:
        return self.count / self.wall


class Timed:
    """Wall and client-CPU seconds of a block (CPU: this whole process, every thread)."""

    def __enter__(self) -> Timed:
        self._wall, self._cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self._wall
        self.cpu = time.process_time() - self._cpu

    def run(self, count: int) -> Run:
        return Run(count, self.wall, self.cpu)


# ---------------------------------------------------------------------- the references


def _plain_queue() -> str:
    return f"bench-plain-{uuid.uuid4().hex[:6]}"


def _parameters(url: str) -> pika.URLParameters:
    """A shared broker busy declaring other suites' quorum queues can take more than pika's
    default 15 s to answer a handshake."""
    parameters = pika.URLParameters(url)
    parameters.stack_timeout = 60
    return parameters


def _props() -> pika.BasicProperties:
    return pika.BasicProperties(delivery_mode=2, message_id=str(uuid.uuid4()))


Message = tuple[str, str, bytes, pika.BasicProperties]
"""exchange, routing key, body, properties: one basic.publish."""


def _pika_pipelined(
    url: str,
    count: int,
    window: int,
    message: Callable[[int], Message],
    declare: tuple[str, str] | None = None,
    group: int = 0,
) -> Run:
    """pika's asynchronous adapter (``SelectConnection``): publish ``message(i)`` for i in
    ``range(count)``, mandatory, while fewer than ``window`` confirms are outstanding, the
    way a pipelining client does. ``declare``: a plain queue (name, type) declared first
    and deleted after. ``group``: instead, publish ``group`` at a time, each group once
    the previous one is confirmed (one call at a time, its messages confirmed together)."""
    pending: set[int] = set()
    failed: list[str] = []
    state = {"sent": 0, "done": False}
    timed = Timed()

    def give_up(connection: pika.SelectConnection, why: str) -> None:
        """Every failure ends the loop: a close, else the loop itself."""
        if not state["done"]:
            failed.append(why)
        state["done"] = True
        if connection.is_open:
            connection.close()
        elif not connection.is_closing:
            connection.ioloop.stop()

    def on_open(connection: pika.SelectConnection) -> None:
        connection.channel(on_open_callback=on_channel)

    def on_channel(channel: pika.channel.Channel) -> None:
        channel.add_on_return_callback(lambda *_a: failed.append("returned"))
        channel.add_on_close_callback(
            lambda ch, reason: give_up(connection, f"channel closed: {reason}")
        )

        def confirms(_frame: object) -> None:
            channel.confirm_delivery(
                lambda frame: on_confirm(channel, frame), callback=lambda _f: start(channel)
            )

        if declare is None:
            confirms(None)
        else:
            channel.queue_declare(
                declare[0], durable=True, arguments={"x-queue-type": declare[1]}, callback=confirms
            )

    def start(channel: pika.channel.Channel) -> None:
        timed.__enter__()
        fill(channel)

    def fill(channel: pika.channel.Channel) -> None:
        if group and pending:
            return
        limit = group or window
        while state["sent"] < count and len(pending) < limit:
            exchange, key, body, properties = message(state["sent"])
            channel.basic_publish(exchange, key, body, properties, mandatory=True)
            state["sent"] += 1
            pending.add(state["sent"])

    def on_confirm(channel: pika.channel.Channel, frame: pika.frame.Method[Any]) -> None:
        method = frame.method
        tag = method.delivery_tag
        pending.difference_update([t for t in pending if t <= tag] if method.multiple else [tag])
        if isinstance(method, pika.spec.Basic.Nack):
            failed.append("nack")
        if pending or state["sent"] < count:
            fill(channel)
            return
        timed.__exit__()
        state["done"] = True
        if declare is None:
            connection.close()
        else:
            channel.queue_delete(declare[0], callback=lambda _f: connection.close())

    connection = pika.SelectConnection(
        _parameters(url),
        on_open_callback=on_open,
        on_open_error_callback=lambda c, exc: give_up(c, f"open: {exc}"),
        on_close_callback=lambda c, _exc: c.ioloop.stop(),
    )
    deadline = max(60.0, count / 100)
    connection.ioloop.call_later(deadline, lambda: give_up(connection, f"over {deadline:.0f} s"))
    connection.ioloop.start()
    if failed or state["sent"] < count:
        raise RuntimeError(f"raw pika: {failed[:1] or 'stopped early'}")
    return timed.run(count)


def raw_pika_many(url: str, count: int, window: int, queue_type: str) -> Run:
    """Pipelined confirms into one plain queue, the properties made as it goes."""
    name = _plain_queue()
    return _pika_pipelined(
        url, count, window, lambda _i: ("", name, BODY, _props()), declare=(name, queue_type)
    )


def planned_messages(
    settings: Settings, count: int, seed: int, delays: Delays, journal: bool
) -> list[Message]:
    """What rmqdelay sends for ``requests(count, seed, delays)``, built from public ground
    (``rmqdelay.plan_delay`` and docs/protocol.md, sections 3 and 4): each message
    planned into the tiers with its three headers, in due order as rmqdelay sends a
    batch; then, with the journal on, its records (section 6), 500 to a stream message."""
    layout, now_us = settings.layout, time.time_ns() // 1000
    due_sorted = sorted(r["delay"] for r in requests(count, seed, delays))
    messages: list[Message] = []
    lines: list[bytes] = []
    for delay in due_sorted:
        delay_us = round(delay * 1e6)
        due_ms = -(-(now_us + delay_us) // 1000)
        plan = plan_delay(layout, delay_us, DEST)
        message_id = str(uuid.uuid4())
        headers = {"rmqdelay-due-at": due_ms, "rmqdelay-destination": DEST, "rmqdelay-attempt": 1}
        properties = pika.BasicProperties(
            delivery_mode=2,
            message_id=message_id,
            content_type="application/octet-stream",
            headers=headers,
        )
        messages.append((plan.exchange, plan.publish_key, BODY, properties))
        record = {"v": 1, "k": "scheduled", "id": message_id, "d": DEST, "due": due_ms}
        record |= {"a": 1, "n": len(BODY), "t": now_us // 1000}
        lines.append(json.dumps(record, separators=(",", ":")).encode())
    if journal:
        for start in range(0, len(lines), 500):
            messages.append(_record_message(settings, lines[start : start + 500]))
    return messages


def _record_message(settings: Settings, lines: list[bytes]) -> Message:
    """A journal write (docs/protocol.md, section 6) holding ``lines``."""
    properties = pika.BasicProperties(
        delivery_mode=2,
        message_id=f"journal-{uuid.uuid4()}",
        content_type="application/json",
        type="rmqdelay-journal",
    )
    return (f"{settings.prefix}.schedule", "", b"\n".join(lines), properties)


def raw_pika_tiers(
    url: str, settings: Settings, count: int, window: int, delays: Delays, journal: bool
) -> Run:
    """Raw pika sending rmqdelay's own planned messages (and records), planned before the
    clock starts, pipelined with the same window: the broker's and the raw client's share
    of a ``publish_many``, without rmqdelay's own work."""
    messages = planned_messages(settings, count, 2, delays, journal)
    run = _pika_pipelined(url, len(messages), window, messages.__getitem__)
    return Run(count, run.wall, run.cpu)


def raw_pika_single_journal(url: str, settings: Settings, count: int) -> Run:
    """Raw pika sending a planned message and its journal record per call, both
    confirmed before the next call (pipelined within the call): the wire work of one
    ``publish()`` with the journal on."""
    planned = planned_messages(settings, count, 4, LONG, journal=False)
    pairs: list[Message] = []
    for exchange, key, body, properties in planned:
        record = {"v": 1, "k": "scheduled", "id": properties.message_id, "d": DEST}
        due = (properties.headers or {})["rmqdelay-due-at"]
        record |= {"due": due, "a": 1, "n": len(body)}
        record |= {"t": time.time_ns() // 1_000_000}
        line = json.dumps(record, separators=(",", ":")).encode()
        pairs += [(exchange, key, body, properties), _record_message(settings, [line])]
    run = _pika_pipelined(url, len(pairs), 2, pairs.__getitem__, group=2)
    return Run(count, run.wall, run.cpu)


def raw_pika_single(url: str, count: int, queue_type: str) -> Run:
    """One confirm per publish: ``BlockingChannel`` waits for each, as ``publish()`` does."""
    name = _plain_queue()
    connection = pika.BlockingConnection(_parameters(url))
    try:
        channel = connection.channel()
        channel.queue_declare(name, durable=True, arguments={"x-queue-type": queue_type})
        channel.confirm_delivery()
        with Timed() as t:
            for _ in range(count):
                channel.basic_publish("", name, BODY, _props(), mandatory=True)
        channel.queue_delete(name)
        return t.run(count)
    finally:
        if connection.is_open:
            connection.close()


async def _aio_pika_fill(
    channel: aio_pika.abc.AbstractChannel, name: str, count: int, window: int
) -> None:
    """Confirmed, mandatory, persistent publishes to queue ``name``, a window at a time."""
    exchange = channel.default_exchange

    async def one() -> None:
        message = aio_pika.Message(
            BODY, delivery_mode=aio_pika.DeliveryMode.PERSISTENT, message_id=str(uuid.uuid4())
        )
        await exchange.publish(message, routing_key=name, mandatory=True)

    for base in range(0, count, window):
        await asyncio.gather(*(one() for _ in range(base, min(count, base + window))))


async def raw_aio_pika_many(url: str, count: int, window: int, queue_type: str) -> Run:
    """Confirmed, mandatory, persistent publishes to one plain queue, a window at a time."""
    name = _plain_queue()
    connection = await aio_pika.connect(url)
    try:
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        await channel.declare_queue(name, durable=True, arguments={"x-queue-type": queue_type})
        with Timed() as t:
            await _aio_pika_fill(channel, name, count, window)
        await channel.queue_delete(name)
        return t.run(count)
    finally:
        await connection.close()


async def raw_aio_pika_drain(url: str, count: int, prefetch: int, queue_type: str) -> Run:
    """The worker's reference: ``count`` messages already in one plain queue, drained by a
    bare aio-pika consumer at the same prefetch, acking each (manual acks) after a no-op;
    timed as the worker is, from the first received to the last."""
    name = _plain_queue()
    connection = await aio_pika.connect(url)
    try:
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        await channel.declare_queue(name, durable=True, arguments={"x-queue-type": queue_type})
        await _aio_pika_fill(channel, name, count, 2000)
        consumer = await connection.channel(publisher_confirms=False)
        await consumer.set_qos(prefetch_count=prefetch)
        queue = await consumer.get_queue(name, ensure=False)
        handled: list[float] = []
        cpu: list[float] = []
        done = asyncio.Event()

        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            handled.append(time.perf_counter())
            if len(handled) == 1:
                cpu.append(time.process_time())
            if len(handled) >= count:
                cpu.append(time.process_time())
                done.set()
            await message.ack()

        tag = await queue.consume(on_message)
        await asyncio.wait_for(done.wait(), timeout=max(120.0, count / 100))
        await queue.cancel(tag)
        await channel.queue_delete(name)
        return Run(count - 1, handled[-1] - handled[0], cpu[-1] - cpu[0])
    finally:
        await connection.close()


# ---------------------------------------------------------------------- rmqdelay


def requests(count: int, seed: int, delays: Delays = LONG) -> list[dict[str, Any]]:
    """Delays uniform in ``delays`` (seconds), or 0 for None."""
    rng = random.Random(seed)
    return [
        {"destination": DEST, "body": BODY, "delay": rng.uniform(*delays) if delays else 0}
        for _ in range(count)
    ]


def sync_many(settings: Settings, count: int, window: int, delays: Delays) -> Run:
    with Publisher(settings, window=window) as publisher:
        batch = requests(count, 2, delays)
        with Timed() as t:
            publisher.publish_many(batch)
        return t.run(count)


async def async_many(settings: Settings, count: int, window: int, delays: Delays) -> Run:
    async with AsyncPublisher(settings, window=window) as publisher:
        batch = requests(count, 1, delays)
        with Timed() as t:
            await publisher.publish_many(batch)
        return t.run(count)


def sync_single(settings: Settings, count: int) -> Run:
    """``publish()`` one message at a time: one confirm per call."""
    with Publisher(settings) as publisher:
        batch = requests(count, 4, LONG)
        with Timed() as t:
            for request in batch:
                publisher.publish(**request)
        return t.run(count)


async def worker_drain(settings: Settings, count: int, concurrency: int, prefetch: int) -> Run:
    """``count`` messages already due in the work queue, drained by ``rmqdelay.Worker`` with
    a no-op async handler: timed from the first handled to the last (not the start-up)."""
    await asyncio.to_thread(sync_many, settings, count, 2000, None)
    app = Worker(settings)
    handled: list[float] = []
    cpu: list[float] = []
    done = asyncio.Event()

    @app.handler(DEST, max_attempts=1)
    async def noop(body: bytes) -> None:
        handled.append(time.perf_counter())
        if len(handled) == 1:
            cpu.append(time.process_time())
        if len(handled) >= count:
            cpu.append(time.process_time())
            done.set()

    async with app.running(settings, concurrency=concurrency, prefetch=prefetch):
        await asyncio.wait_for(done.wait(), timeout=max(120.0, count / 100))
    return Run(count - 1, handled[-1] - handled[0], cpu[-1] - cpu[0])


# ---------------------------------------------------------------------- the keys


Measure = Callable[["Bench"], Awaitable[Run]]


@dataclass(frozen=True)
class Spec:
    """A measure: its key, what it is (one line, for tables), its reference's key."""

    key: str
    what: str
    reference: str | None
    run: Measure
    unit: str = "msgs/s"
    also: tuple[tuple[str, str], ...] = ()
    """(suffix, reference): the figure again as ``key.suffix``, its ratio to that one."""


@dataclass
class Bench:
    """The broker, the sizes and the two settings (journal on, off) every measure shares."""

    url: str
    sizes: Sizes
    queue_type: str = "quorum"
    prefix: str = field(default_factory=lambda: f"bench-m-{uuid.uuid4().hex[:6]}")

    def settings(self, journal: bool = True) -> Settings:
        return Settings(
            url=self.url,
            prefix=self.prefix,
            queue_type=self.queue_type,
            destinations=[],
            schedule_journal=journal,
        )


def _thread(fn: Callable[..., Run], *args: Any) -> Awaitable[Run]:
    return asyncio.to_thread(fn, *args)


def _sync(journal: bool, delays: Delays) -> Measure:
    return lambda b: _thread(sync_many, b.settings(journal), b.sizes.count, b.sizes.window, delays)


def _async(journal: bool, delays: Delays) -> Measure:
    return lambda b: async_many(b.settings(journal), b.sizes.count, b.sizes.window, delays)


def _tiers(delays: Delays) -> Measure:
    return lambda b: _thread(
        raw_pika_tiers, b.url, b.settings(), b.sizes.count, b.sizes.window, delays, True
    )


def _single(journal: bool) -> Measure:
    return lambda b: _thread(sync_single, b.settings(journal), b.sizes.single)


def _drain(b: Bench) -> Awaitable[Run]:
    return worker_drain(b.settings(), b.sizes.drain, b.sizes.concurrency, b.sizes.prefetch)


def _drain_default(b: Bench) -> Awaitable[Run]:
    """The worker's defaults: concurrency 8, prefetch = concurrency."""
    return worker_drain(b.settings(), b.sizes.drain, DEFAULT_CONCURRENCY, DEFAULT_CONCURRENCY)


RAW_PIKA, RAW_AIO = "publish.raw.pika.many", "publish.raw.aiopika.many"
RAW_SINGLE = "publish.raw.pika.single"
RAW_TIERS_LONG, RAW_TIERS_MID = "publish.raw.pika.tiers.long", "publish.raw.pika.tiers.mid"
RAW_SINGLE_JOURNAL = "publish.raw.pika.single.journal"
RAW_DRAIN, RAW_DRAIN_DEFAULT = "worker.drain.raw", "worker.drain.raw.default"
DEFAULT_CONCURRENCY = 8
"""``rmqdelay worker``'s default concurrency, and so its default prefetch."""
SPECS: tuple[Spec, ...] = (
    Spec(
        RAW_PIKA,
        "raw pika",
        None,
        lambda b: _thread(raw_pika_many, b.url, b.sizes.count, b.sizes.window, b.queue_type),
    ),
    Spec(
        RAW_AIO,
        "raw aio-pika",
        None,
        lambda b: raw_aio_pika_many(b.url, b.sizes.count, b.sizes.window, b.queue_type),
    ),
    Spec(
        RAW_TIERS_LONG,
        "raw pika, rmqdelay's planned messages and records, delays 10 min to 1 h",
        None,
        _tiers(LONG),
    ),
    Spec(
        RAW_TIERS_MID,
        "raw pika, rmqdelay's planned messages and records, delays 1 s to 10 min",
        None,
        _tiers(MID),
    ),
    Spec(
        "publish.sync.many.long",
        "rmqdelay sync",
        RAW_PIKA,
        _sync(True, LONG),
        also=(("own", RAW_TIERS_LONG),),
    ),
    Spec(
        "publish.sync.many.mid",
        "rmqdelay sync, delays 1 s to 10 min",
        RAW_PIKA,
        _sync(True, MID),
        also=(("own", RAW_TIERS_MID),),
    ),
    Spec(
        "publish.sync.many.long.nojournal",
        "rmqdelay sync, journal off",
        RAW_PIKA,
        _sync(False, LONG),
    ),
    Spec("publish.sync.many.short", "rmqdelay sync, delay 0", RAW_PIKA, _sync(True, None)),
    Spec(
        "publish.async.many.long",
        "rmqdelay async",
        RAW_AIO,
        _async(True, LONG),
        also=(("pika", RAW_PIKA), ("own", RAW_TIERS_LONG)),
    ),
    Spec(
        "publish.async.many.long.nojournal",
        "rmqdelay async, journal off",
        RAW_AIO,
        _async(False, LONG),
    ),
    Spec("publish.async.many.short", "rmqdelay async, delay 0", RAW_AIO, _async(True, None)),
    Spec(
        RAW_SINGLE,
        "raw pika, one confirm per publish",
        None,
        lambda b: _thread(raw_pika_single, b.url, b.sizes.single, b.queue_type),
    ),
    Spec(
        RAW_SINGLE_JOURNAL,
        "raw pika, a planned message and its record per call, both confirmed",
        None,
        lambda b: _thread(raw_pika_single_journal, b.url, b.settings(), b.sizes.single),
    ),
    Spec(
        "publish.sync.single",
        "rmqdelay sync publish(), one at a time",
        RAW_SINGLE,
        _single(True),
        also=(("own", RAW_SINGLE_JOURNAL),),
    ),
    Spec(
        "publish.sync.single.nojournal",
        "rmqdelay sync publish(), journal off",
        RAW_SINGLE,
        _single(False),
    ),
    Spec(
        RAW_DRAIN,
        "raw aio-pika consumer, manual acks, prefetch as the worker's",
        None,
        lambda b: raw_aio_pika_drain(b.url, b.sizes.drain, b.sizes.prefetch, b.queue_type),
    ),
    Spec(
        "worker.drain.noop",
        "rmqdelay.Worker, messages already due, no-op handler",
        RAW_DRAIN,
        _drain,
    ),
    Spec(
        RAW_DRAIN_DEFAULT,
        f"raw aio-pika consumer, manual acks, prefetch {DEFAULT_CONCURRENCY}",
        None,
        lambda b: raw_aio_pika_drain(b.url, b.sizes.drain, DEFAULT_CONCURRENCY, b.queue_type),
    ),
    Spec(
        "worker.drain.noop.default",
        f"rmqdelay.Worker at its defaults (concurrency and prefetch {DEFAULT_CONCURRENCY})",
        RAW_DRAIN_DEFAULT,
        _drain_default,
    ),
)
BY_KEY = {spec.key: spec for spec in SPECS}
COMPARED = (
    RAW_PIKA,
    "publish.sync.many.long",
    "publish.sync.many.short",
    "publish.async.many.long",
    "publish.sync.single",
    RAW_DRAIN,
    "worker.drain.noop",
    RAW_DRAIN_DEFAULT,
    "worker.drain.noop.default",
)
"""What ``bench.compare`` runs by default: the issue's publish and worker figures."""


async def run(
    bench: Bench, keys: tuple[str, ...], repeats: int, warmup: int = 0
) -> dict[str, dict[str, Any]]:
    """Every measure once per round, alternating, on one topology; per key: the runs, their
    median, its ratio to the reference's median, client and broker CPU per message."""
    specs = [BY_KEY[key] for key in keys]
    runs: dict[str, list[Run]] = {spec.key: [] for spec in specs}
    broker_us: dict[str, list[float]] = {spec.key: [] for spec in specs}
    pid = broker_pid(bench.url)
    settings = bench.settings()
    # a connection of its own for each: one left idle for the whole run (minutes) misses
    # its heartbeats on a busy machine, and the broker closes it before the clean-up
    with TopologyManager(settings) as manager:
        manager.apply([DEST])
    try:
        if warmup:  # untimed: connections, channels and fresh queues warm up
            small = Bench(bench.url, Sizes(warmup, bench.sizes.window, warmup), prefix=bench.prefix)
            for spec in specs:
                await spec.run(small)
        for _ in range(repeats):
            for spec in specs:
                idle = await idle_cpu_rate(pid)  # the broker is shared: its background
                with CpuMeter({"broker": pid}) as meter:
                    one = await spec.run(bench)
                runs[spec.key].append(one)
                used = meter.result.get("broker_cpu_s")
                if used is not None and idle is not None:
                    used -= idle * meter.result["wall_s"]
                    broker_us[spec.key].append(round(used / one.count * 1e6, 1))
    finally:
        with TopologyManager(settings) as manager:
            manager.destroy([DEST], force=True)
    figures: dict[str, dict[str, Any]] = {}
    for spec in specs:
        rates = [round(r.rate, 1) for r in runs[spec.key]]
        figures[spec.key] = {
            "value": round(statistics.median(rates), 1),
            "unit": spec.unit,
            "what": spec.what,
            "runs": rates,
            "client_cpu_us": round(
                statistics.median(r.cpu / r.count * 1e6 for r in runs[spec.key]), 1
            ),
            "broker_cpu_us": round(statistics.median(broker_us[spec.key]), 1)
            if broker_us[spec.key]
            else None,
            "count": runs[spec.key][0].count,
        }
    for spec in specs:
        if spec.reference in figures:
            ref = figures[spec.reference]["value"]
            figures[spec.key]["to"] = spec.reference
            figures[spec.key]["ratio"] = round(figures[spec.key]["value"] / ref, 3)
        for suffix, reference in spec.also:
            if spec.key in figures and reference in figures:
                ratio = figures[spec.key]["value"] / figures[reference]["value"]
                figures[f"{spec.key}.{suffix}"] = {
                    **figures[spec.key],
                    "ratio": round(ratio, 3),
                    "to": reference,
                }
    return figures


def print_figures(figures: dict[str, dict[str, Any]]) -> None:
    for key, f in figures.items():
        ratio = f" ratio {f['ratio']:.2f} to {f['to']}" if "ratio" in f else ""
        runs = ", ".join(f"{r:,.0f}" for r in f["runs"])
        print(
            f"{key:34} {f['value']:>9,.0f} {f['unit']}{ratio}  client {f['client_cpu_us']:.0f}"
            f" µs/msg, broker {f['broker_cpu_us'] or 0:.0f}  ({runs})"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.measures", description=__doc__)
    parser.add_argument("--url", default=DEFAULT_AMQP_URL)
    parser.add_argument("--keys", default=",".join(spec.key for spec in SPECS))
    parser.add_argument("--count", type=int, default=5000)
    parser.add_argument("--drain", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--window", type=int, default=500)
    parser.add_argument("--warmup", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    keys = tuple(k.strip() for k in args.keys.split(",") if k.strip())
    unknown = [k for k in keys if k not in BY_KEY]
    if unknown:
        parser.error(f"unknown keys {unknown}; known: {', '.join(BY_KEY)}")
    logging.basicConfig(level=logging.WARNING)
    bench = Bench(args.url, Sizes(args.count, args.window, args.drain))
    figures = asyncio.run(run(bench, keys, args.repeats, args.warmup))
    if args.json:
        import rmqdelay

        json.dump({"rmqdelay": rmqdelay.__file__, "figures": figures}, sys.stdout)
        print()
    else:
        print_figures(figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
